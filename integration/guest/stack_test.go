//go:build guest

package guest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

// TCG-sized waits: one lvm command takes ~1 s in the guest, one lvmd create
// ~2 s, and the agent backs off up to its maximum after lvmd outages.
const (
	requestTimeout = 3 * time.Minute
	readyTimeout   = 2 * time.Minute
)

// volumeGroup is how a test asks for a VG (the spec's volumeGroup, which the
// agent maps to an lvmd device class) and where the LV really lands.
type volumeGroup struct {
	spec string // spec volumeGroup
	vg   string // real LVM VG
	pool string // thin pool ("" for thick)
}

// stack is one agent against one lvmd dialect, on its own node name.
type stack struct {
	name    string // "topolvm", "google-lvmd"
	short   string // prefix of every name this stack makes (LVs: "it-<short>-...")
	node    string
	metrics string
	args    []string
	thick   volumeGroup
	thin    *volumeGroup // nil: the dialect has no thin volumes
	// classes are the stack's lvmd device classes. (google/lvmd serves
	// every VG but cannot list vg0: its thin pool's hidden LV defeats the
	// daemon's parser.)
	classes string
	// lvmdCtl is start-lvmd.sh's verb runner when the suite controls the
	// daemon (topolvm's lvmd); nil otherwise.
	lvmdCtl func(verb string) error

	parent *testing.T
	agent  *harness.Process
}

func newTopolvmStack(t *testing.T) *stack {
	s := &stack{name: "topolvm", short: "t", node: "it-node-topolvm", metrics: "127.0.0.1:19810", parent: t,
		thick:   volumeGroup{spec: topolvmVG, vg: topolvmVG},
		thin:    &volumeGroup{spec: "thin", vg: topolvmVG, pool: thinPool},
		classes: "thick,thin",
		lvmdCtl: func(verb string) error { return script("start-lvmd.sh", verb) },
	}
	// The spec's "vg0" maps to the thick device class; "thin" is the thin
	// device class of the same name (no mapping needed).
	s.args = []string{"--backend", "topolvm", "--lvmd-socket", env.socket, "--device-class-map", topolvmVG + "=thick"}
	return s
}

func newGoogleStack(t *testing.T) *stack {
	s := &stack{name: "google-lvmd", short: "g", node: "it-node-google", metrics: "127.0.0.1:19811", parent: t,
		thick: volumeGroup{spec: googleVG, vg: googleVG}, classes: googleVG,
	}
	s.args = []string{"--backend", "google-lvmd", "--lvmd-address", env.googleAddr}
	return s
}

// ensureNode creates the stack's Node object, as a kubelet would have: the
// agent keeps its capacity annotation up to date there.
func (s *stack) ensureNode(t *testing.T) {
	t.Helper()
	_, err := env.cp.Client.CoreV1().Nodes().Create(context.Background(),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.node}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create node %s: %v", s.node, err)
	}
}

// startAgent starts (or restarts) the stack's lvm-agent and waits for /readyz
// when wait is set (informers synced and lvmd reachable).
func (s *stack) startAgent(t *testing.T, wait bool) {
	t.Helper()
	s.ensureNode(t)
	args := append([]string{"--node-name", s.node, "--kubeconfig", env.cp.Kubeconfig,
		"--metrics-address", s.metrics}, s.args...)
	// Registered on the stack's top-level test, so that the agent outlives
	// the subtest that (re)started it.
	p := harness.StartAgent(s.parent, env.agentBin, args...)
	s.agent = p
	if dir := os.Getenv("LVM_AGENT_RESULTS"); dir != "" {
		// Every agent's log is kept, not only a failed test's: its retries
		// and warnings are worth reading after a pass too.
		s.parent.Cleanup(func() {
			f, err := os.OpenFile(filepath.Join(dir, "agent-"+s.node+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
			if err == nil {
				fmt.Fprintf(f, "==== lvm-agent %s\n%s", strings.Join(args, " "), p.Output())
				f.Close()
			}
		})
	}
	if wait {
		s.waitReady(t)
	}
}

func (s *stack) waitReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(readyTimeout)
	var last string
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + s.metrics + "/readyz")
		if err == nil {
			body := make([]byte, 512)
			n, _ := resp.Body.Read(body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(body[:n])))
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s agent not ready after %v: %s\n%s", s.name, readyTimeout, last, s.agent.Output())
}

// lvName is the LV name for a case of this stack.
func (s *stack) lvName(parts ...string) string {
	return "it-" + s.short + "-" + strings.Join(parts, "-")
}

func (s *stack) ns() string { return "it-" + s.short }

// pvc creates a PVC scheduled to this stack's node.
func (s *stack) pvc(t *testing.T, name string) *corev1.PersistentVolumeClaim {
	t.Helper()
	return harness.PVC(t, env.cp.Client, s.ns(), name, s.node)
}

// pv creates the PV a CSI provisioner would make for claim, on this node.
func (s *stack) pv(t *testing.T, name string, claim *corev1.PersistentVolumeClaim) *corev1.PersistentVolume {
	t.Helper()
	return harness.PV(t, env.cp.Client, s.ns()+"-"+name, s.node, kube.DefaultDriver, claim)
}

// create asks for an LV as a provisioner does and waits for the answer.
func (s *stack) create(pvc *corev1.PersistentVolumeClaim, vg volumeGroup, lv string, size int64, tags ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	return s.createCtx(ctx, pvc, vg, lv, size, tags...)
}

func (s *stack) createCtx(ctx context.Context, pvc *corev1.PersistentVolumeClaim, vg volumeGroup, lv string, size int64, tags ...string) error {
	spec := kube.CreateSpec{VolumeGroup: vg.spec, Name: lv, Size: size, Tags: tags}
	return kube.CreateVolumeWithAnnotations(ctx, clientset.Wrap(env.cp.Client), pvc.Namespace, pvc.Name, spec, nil)
}

// delete asks for the removal of the LV behind a PV and waits for the answer.
func (s *stack) delete(pv *corev1.PersistentVolume, vg volumeGroup, lv string) error {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	return kube.DeleteVolumeWithAnnotations(ctx, clientset.Wrap(env.cp.Client), pv.Name, vg.spec, lv, nil)
}

// requireAnswered checks the object's annotations after a success: the final
// state, and no error or reason left behind.
func requireAnswered(t *testing.T, obj metav1.Object, state string) {
	t.Helper()
	var ann map[string]string
	switch o := obj.(type) {
	case *corev1.PersistentVolumeClaim:
		got, err := env.cp.Client.CoreV1().PersistentVolumeClaims(o.Namespace).Get(context.Background(), o.Name, metav1.GetOptions{})
		require.NoError(t, err)
		ann = got.Annotations
	case *corev1.PersistentVolume:
		got, err := env.cp.Client.CoreV1().PersistentVolumes().Get(context.Background(), o.Name, metav1.GetOptions{})
		require.NoError(t, err)
		ann = got.Annotations
	}
	assert.Equal(t, state, ann[kube.AnnLifecycle])
	assert.NotContains(t, ann, kube.AnnError)
	assert.NotContains(t, ann, kube.AnnReason)
	if _, pvc := obj.(*corev1.PersistentVolumeClaim); pvc && state == kube.StateCreated {
		// The device a provisioner puts in the PV: this LV's block device.
		spec, err := kube.ParseCreateSpec(ann[kube.AnnSpec])
		require.NoError(t, err)
		dev := ann[kube.AnnDevice]
		assert.Equal(t, spec.Name, path.Base(dev), "volume.device %q names the LV", dev)
		fi, err := os.Stat(dev)
		if assert.NoError(t, err, "volume.device") {
			assert.NotZero(t, fi.Mode()&os.ModeDevice, "volume.device %s is a device", dev)
		}
	}
}

// requireFailed checks a "failed" answer: the error the provisioner helper
// returned matches the reason's sentinel, and the object carries the reason.
func requireFailed(t *testing.T, err error, sentinel error, obj metav1.Object) {
	t.Helper()
	require.Error(t, err, "expected failed/%v", sentinel)
	var fe *kube.FailedError
	require.True(t, errors.As(err, &fe), "not an agent's failed answer: %v", err)
	require.ErrorIs(t, err, sentinel, "reason %q: %s", fe.Reason, fe.Message)
	assert.NotEmpty(t, fe.Message)
	t.Logf("answer: failed/%s: %s", fe.Reason, fe.Message)
}

// ---- ground truth: lvs ----

// lv is one row of `lvs --reportformat json`.
type lv struct {
	Name, VG, UUID, Attr, Pool string
	Size                       int64
	Tags                       []string
}

func (l lv) thin() bool   { return len(l.Attr) > 0 && l.Attr[0] == 'V' }
func (l lv) active() bool { return len(l.Attr) > 4 && l.Attr[4] == 'a' }

// lvsOf lists the LVs of vg (hidden ones left out), by name.
func lvsOf(t testing.TB, vg string) map[string]lv {
	t.Helper()
	out, err := lvm("lvs", "--reportformat", "json", "--units", "b", "--nosuffix",
		"-o", "lv_name,vg_name,lv_size,lv_tags,lv_attr,pool_lv,lv_uuid", vg)
	require.NoError(t, err)
	var rep struct {
		Report []struct {
			LV []map[string]string `json:"lv"`
		} `json:"report"`
	}
	require.NoError(t, json.Unmarshal(out, &rep), "lvs output: %s", out)
	lvs := map[string]lv{}
	for _, r := range rep.Report {
		for _, row := range r.LV {
			size, err := strconv.ParseInt(row["lv_size"], 10, 64)
			require.NoError(t, err, "lv_size of %v", row)
			var tags []string
			if row["lv_tags"] != "" {
				tags = strings.Split(row["lv_tags"], ",")
			}
			slices.Sort(tags)
			lvs[row["lv_name"]] = lv{Name: row["lv_name"], VG: row["vg_name"], UUID: row["lv_uuid"], Attr: row["lv_attr"],
				Pool: row["pool_lv"], Size: size, Tags: tags}
		}
	}
	return lvs
}

// names lists the LV names of vg that start with prefix.
func names(t testing.TB, vg, prefix string) []string {
	var out []string
	for n := range lvsOf(t, vg) {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// extents caches each VG's extent size: it never changes, and every lvm
// run costs a second or more in the guest.
var extents sync.Map

// vgInfo reads a VG's extent size and free bytes.
func vgInfo(t testing.TB, vg string) (extent, free int64) {
	t.Helper()
	out, err := lvm("vgs", "--noheadings", "--units", "b", "--nosuffix", "-o", "vg_extent_size,vg_free", vg)
	require.NoError(t, err)
	f := strings.Fields(string(out))
	require.Len(t, f, 2, "vgs output %q", out)
	extent, err = strconv.ParseInt(f[0], 10, 64)
	require.NoError(t, err)
	free, err = strconv.ParseInt(f[1], 10, 64)
	require.NoError(t, err)
	return extent, free
}

// lvmSize is what LVM makes of a spec size: the agent rounds up to 4096
// (lvmd's unit), LVM rounds up to whole extents.
func lvmSize(size, extent int64) int64 {
	size = (size + 4095) / 4096 * 4096
	return (size + extent - 1) / extent * extent
}

// requireLV checks that the LV exists as the agent should have made it for
// pvc: its size, its tags (the spec's plus the ownership tag, nothing else),
// thin in the pool or thick, and active.
func requireLV(t *testing.T, vg volumeGroup, name string, pvc *corev1.PersistentVolumeClaim, size int64, specTags ...string) lv {
	t.Helper()
	got, ok := lvsOf(t, vg.vg)[name]
	require.True(t, ok, "LV %s/%s does not exist", vg.vg, name)
	extent, ok := extents.Load(vg.vg)
	if !ok {
		extent, _ = vgInfo(t, vg.vg)
		extents.Store(vg.vg, extent)
	}
	assert.Equal(t, lvmSize(size, extent.(int64)), got.Size, "size of %s (spec size %d)", name, size)
	want := append(slices.Clone(specTags), agent.OwnerTag(pvc.UID))
	slices.Sort(want)
	assert.Equal(t, want, got.Tags, "tags of %s", name)
	if vg.pool != "" {
		assert.True(t, got.thin(), "%s should be thin (attr %s)", name, got.Attr)
		assert.Equal(t, vg.pool, got.Pool, "thin pool of %s", name)
	} else {
		assert.False(t, got.thin(), "%s should be thick (attr %s)", name, got.Attr)
		assert.Empty(t, got.Pool, "%s should be in no pool", name)
	}
	assert.True(t, got.active(), "%s should be active (attr %s)", name, got.Attr)
	return got
}

func requireNoLV(t *testing.T, vg, name string) {
	t.Helper()
	got, ok := lvsOf(t, vg)[name]
	require.False(t, ok, "LV %s/%s exists: %+v", vg, name, got)
}

// removeLeftover removes an LV a failed case left behind, so that one
// failure does not cascade into the next cases. (A passing case has checked
// that its LVs are gone; an lvm run costs a second in the guest.)
func removeLeftover(t *testing.T, vg, name string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		if _, ok := lvsOf(t, vg)[name]; ok {
			if _, err := lvm("lvremove", "-y", vg+"/"+name); err != nil {
				t.Logf("cleanup: %v", err)
			}
		}
	})
}

// ---- processes ----

// findProcess scans /proc until match accepts a process's argv, and returns its pid.
func findProcess(ctx context.Context, match func(argv []string) bool) (int, error) {
	for {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil {
				continue
			}
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil || len(b) == 0 {
				continue
			}
			if match(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")) {
				return pid, nil
			}
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// alive: the process exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}

// isLVCreateOf matches an lvcreate (through lvm or its lvcreate link) of LV name.
func isLVCreateOf(name string) func([]string) bool {
	return func(argv []string) bool {
		create := false
		for _, a := range argv[:min(len(argv), 2)] {
			if filepath.Base(a) == "lvcreate" {
				create = true
			}
		}
		return create && slices.Contains(argv, name)
	}
}
