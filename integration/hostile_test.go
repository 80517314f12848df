package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

// Specs are written by whoever may edit a PVC or PV. Hostile ones must end
// in "failed" with a reason and a volume.error that says what is wrong, and
// must reach neither lvmd nor another LV. (The parsers are fuzzed in
// kube/fuzz_test.go and lvmbackend/fuzz_test.go; this runs the real agent.)
func TestHostileSpecs(t *testing.T) {
	n := startNode(t)
	_, err := n.lvm.Create("vg1", "foreign", 8<<20, []string{"made-by-hand"})
	require.NoError(t, err)
	_, err = n.lvm.Create("vg1", "kept", 4<<20, []string{agent.OwnerTag("someone"), agent.ProtectedTag})
	require.NoError(t, err)
	before := n.lvs(t, "vg1")
	var mu sync.Mutex
	var mutations []string
	n.lvm.SetHook(func(op, class, name string) error {
		if op != "list" {
			mu.Lock()
			mutations = append(mutations, op+" "+class+"/"+name)
			mu.Unlock()
		}
		return nil
	})

	js := func(vg, name, size string) string {
		v, _ := json.Marshal(vg)
		n, _ := json.Marshal(name)
		return fmt.Sprintf(`{"volumeGroup":%s,"name":%s,"size":%s}`, v, n, size)
	}
	creates := []struct {
		name, spec, reason, says string
	}{
		{"option-like name", js("vg1", "-rf", "4096"), kube.ReasonInvalidSpec, `must not start with '-'`},
		{"option-like vg", js("--force", "lv", "4096"), kube.ReasonInvalidSpec, `volumeGroup`},
		{"path up", js("vg1", "../../etc/passwd", "4096"), kube.ReasonInvalidSpec, `'/'`},
		{"device path", js("vg1", "/dev/sda", "4096"), kube.ReasonInvalidSpec, `'/'`},
		{"path-like vg", js("../etc", "lv", "4096"), kube.ReasonInvalidSpec, `volumeGroup`},
		{"vg with slash", js("vg1/lv", "lv", "4096"), kube.ReasonInvalidSpec, `volumeGroup`},
		{"dot", js("vg1", ".", "4096"), kube.ReasonInvalidSpec, `not allowed`},
		{"dotdot", js("vg1", "..", "4096"), kube.ReasonInvalidSpec, `not allowed`},
		{"reserved _tmeta", js("vg1", "data_tmeta", "4096"), kube.ReasonInvalidSpec, `LVM reserves`},
		{"reserved _rimage", js("vg1", "x_rimage_0", "4096"), kube.ReasonInvalidSpec, `LVM reserves`},
		{"reserved snapshot prefix", js("vg1", "snapshot0", "4096"), kube.ReasonInvalidSpec, `must not start with "snapshot"`},
		{"reserved pvmove prefix", js("vg1", "pvmove0", "4096"), kube.ReasonInvalidSpec, `"pvmove"`},
		{"unicode", js("vg1", "données", "4096"), kube.ReasonInvalidSpec, `has the character`},
		{"NUL", js("vg1", "lv\x00x", "4096"), kube.ReasonInvalidSpec, `has the character`},
		{"newline", js("vg1", "lv\nx", "4096"), kube.ReasonInvalidSpec, `has the character`},
		{"shell", js("vg1", "$(reboot)", "4096"), kube.ReasonInvalidSpec, `has the character '$'`},
		{"128 bytes", js("vg1", strings.Repeat("a", 128), "4096"), kube.ReasonInvalidSpec, `at most 127`},
		{"zero size", js("vg1", "lv", "0"), kube.ReasonInvalidSpec, `size 0`},
		{"negative size", js("vg1", "lv", "-4096"), kube.ReasonInvalidSpec, `size -4096`},
		{"size that overflows when rounded", js("vg1", "lv", fmt.Sprint(int64(math.MaxInt64))), kube.ReasonInvalidSpec, `size 9223372036854775807`},
		{"size beyond int64", js("vg1", "lv", "9223372036854775808"), kube.ReasonInvalidSpec, `size`},
		{"size 1e30", js("vg1", "lv", "1e30"), kube.ReasonInvalidSpec, `size`},
		{"fractional size", js("vg1", "lv", "1.5"), kube.ReasonInvalidSpec, `size`},
		{"size as a string", js("vg1", "lv", `"1Gi"`), kube.ReasonInvalidSpec, `size`},
		// A size LVM can express but no VG holds: a capacity answer, so that
		// a scheduler may try elsewhere.
		{"4 EiB", js("vg1", "lv", fmt.Sprint(int64(1)<<62)), kube.ReasonInsufficientCapacity, `space`},
		{"tag with a space", `{"volumeGroup":"vg1","name":"lv","size":4096,"tags":["a b"]}`, kube.ReasonInvalidSpec, `LVM tag has the character ' '`},
		{"option-like tag", `{"volumeGroup":"vg1","name":"lv","size":4096,"tags":["--zero"]}`, kube.ReasonInvalidSpec, `must not start with '-'`},
		{"empty tag", `{"volumeGroup":"vg1","name":"lv","size":4096,"tags":[""]}`, kube.ReasonInvalidSpec, `LVM tag must be 1 to 1024 bytes, not 0`},
		{"tag of 1025 bytes", `{"volumeGroup":"vg1","name":"lv","size":4096,"tags":["` + strings.Repeat("t", 1025) + `"]}`, kube.ReasonInvalidSpec, `LVM tag must be 1 to 1024 bytes, not 1025: "tttt`},
		{"spoofed ownership tag", `{"volumeGroup":"vg1","name":"lv","size":4096,"tags":["` + agent.OwnerTag("someone") + `"]}`, kube.ReasonInvalidSpec, `ownership prefix`},
		{"striping without an option class", `{"volumeGroup":"vg1","name":"lv","size":4096,"striping":true}`, kube.ReasonInvalidSpec, `striping`},
		{"not JSON", `vg1/lv`, kube.ReasonInvalidSpec, `not valid JSON`},
		{"JSON array", `[]`, kube.ReasonInvalidSpec, `not valid JSON`},
		{"trailing data", js("vg1", "lv", "4096") + `{"name":"other"}`, kube.ReasonInvalidSpec, `trailing data`},
		{"empty", ``, kube.ReasonInvalidSpec, `missing or empty`},
		{"oversize", js("vg1", "lv", "4096") + strings.Repeat(" ", 100<<10), kube.ReasonInvalidSpec, `at most 16384 allowed`},
		// Issue 14, items 4 and 5.
		{"key in another case", `{"volumeGroup":"vg1","name":"lv","NAME":"evil","size":4096}`, kube.ReasonInvalidSpec, `unknown key "NAME"`},
		{"key twice", `{"volumeGroup":"vg1","name":"lv","size":4096,"name":"evil"}`, kube.ReasonInvalidSpec, `key "name" twice`},
		{"unknown key", `{"volumeGroup":"vg1","name":"lv","size":4096,"thinPool":"p"}`, kube.ReasonInvalidSpec, `unknown key "thinPool"`},
		{"2000 tags", `{"volumeGroup":"vg1","name":"lv","size":4096,"tags":[` + strings.TrimSuffix(strings.Repeat(`"t",`, 2000), ",") + `]}`, kube.ReasonInvalidSpec, `2000 tags, at most 16`},
		{"reserved _cvol", js("vg1", "data_cvol", "4096"), kube.ReasonInvalidSpec, `LVM reserves`},
		{"reserved _imeta", js("vg1", "data_imeta", "4096"), kube.ReasonInvalidSpec, `LVM reserves`},
		{"unknown volume group", js("nope", "lv", "4096"), kube.ReasonUnknownVolumeGroup, `"nope"`},
		{"name of a foreign LV", js("vg1", "foreign", "4096"), kube.ReasonNameConflict, `not created by lvm-agent`},
		{"name of a protected LV", js("vg1", "kept", "4096"), kube.ReasonNameConflict, `not created by lvm-agent`},
	}
	for i, tc := range creates {
		t.Run("create/"+tc.name, func(t *testing.T) {
			pvc := fmt.Sprintf("hostile-%02d", i)
			rawRequest(t, cp.Client, "hostile", pvc, n.name, tc.spec, true)
			ann := harness.WaitFor(t, 20*time.Second, func(ctx context.Context) (metav1.Object, error) {
				return cp.Client.CoreV1().PersistentVolumeClaims("hostile").Get(ctx, pvc, metav1.GetOptions{})
			}, func(a map[string]string) bool { return a[kube.AnnLifecycle] != kube.StateCreating })
			checkFailed(t, ann, tc.reason, tc.says)
		})
	}

	deletes := []struct {
		name, spec, reason, says string
	}{
		{"option-like LV", "vg1/-rf", kube.ReasonInvalidSpec, `must not start with '-'`},
		{"absolute path", "/etc/passwd", kube.ReasonInvalidSpec, `volumeGroup is missing`},
		{"path up", "vg1/../foreign", kube.ReasonInvalidSpec, `'/'`},
		{"two slashes", "vg1//foreign", kube.ReasonInvalidSpec, `'/'`},
		{"no LV", "vg1", kube.ReasonInvalidSpec, `not of the form <vg>/<lv>`},
		{"reserved", "vg1/foreign_tmeta", kube.ReasonInvalidSpec, `LVM reserves`},
		{"unicode", "vg1/föreign", kube.ReasonInvalidSpec, `has the character`},
		{"JSON with a path", `{"volumeGroup":"vg1","name":"../foreign"}`, kube.ReasonInvalidSpec, `'/'`},
		{"empty", "", kube.ReasonInvalidSpec, `missing or empty`},
		{"oversize", "vg1/" + strings.Repeat("a", 20<<10), kube.ReasonInvalidSpec, `at most 16384 allowed`},
		{"foreign LV", "vg1/foreign", kube.ReasonNameConflict, `no lvm-agent ownership tag`},
		{"protected LV", "vg1/kept", kube.ReasonProtected, `never removed`},
	}
	for i, tc := range deletes {
		t.Run("delete/"+tc.name, func(t *testing.T) {
			pv := fmt.Sprintf("hostile-%02d", i)
			_, err := cp.Client.CoreV1().PersistentVolumes().Create(context.Background(), harness.NewPV(pv, n.name, kube.DefaultDriver, nil, ""), metav1.CreateOptions{})
			require.NoError(t, err)
			_, err = kube.UpdatePvWithAnnotations(context.Background(), clientset.Wrap(cp.Client), pv, "",
				kube.Set(map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: tc.spec}),
				kube.Set(map[string]string{kube.LabelNode: kube.NodeLabelValue(n.name)}))
			require.NoError(t, err)
			ann := harness.WaitFor(t, 20*time.Second, func(ctx context.Context) (metav1.Object, error) {
				return cp.Client.CoreV1().PersistentVolumes().Get(ctx, pv, metav1.GetOptions{})
			}, func(a map[string]string) bool { return a[kube.AnnLifecycle] != kube.StateDeleting })
			checkFailed(t, ann, tc.reason, tc.says)
		})
	}

	assert.Equal(t, before, n.lvs(t, "vg1"), "no LV made, changed or removed")
	assert.Empty(t, n.lvs(t, "thin"))
	n.lvm.SetHook(nil)
	// No invalid name or spec reached lvmd, and nothing was removed: only
	// creates of the valid names above (which lvcreate refuses or, for
	// 4 EiB, cannot satisfy).
	mu.Lock()
	defer mu.Unlock()
	for _, m := range mutations {
		assert.Contains(t, []string{"create vg1/lv", "create vg1/foreign", "create vg1/kept"}, m, "lvmd was asked to %s", m)
	}
}

// checkFailed: the answer is failed with reason, and volume.error says what
// is wrong, on one line that fits the annotation's bound.
func checkFailed(t *testing.T, ann map[string]string, reason, says string) {
	t.Helper()
	assert.Equal(t, kube.StateFailed, ann[kube.AnnLifecycle])
	assert.Equal(t, reason, ann[kube.AnnReason])
	msg := ann[kube.AnnError]
	assert.Contains(t, msg, says)
	assert.LessOrEqual(t, len(msg), kube.MaxErrorBytes)
	assert.NotContains(t, msg, "\n")
}
