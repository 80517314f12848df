package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// Exit codes of "lvm-agent volume".
const (
	exitOK           = 0
	exitError        = 1
	exitUsage        = 2
	exitFailed       = 3 // the agent answered "failed"
	exitInsufficient = 4 // ... with InsufficientCapacity
	exitTimeout      = 5
	exitProblems     = 6 // "status" found mismatches
)

const volumeUsage = `Usage:
  lvm-agent volume create --namespace NS --pvc NAME --vg VG --size 1Gi [--name LV] [--tags a,b] [--timeout 5m]
  lvm-agent volume delete --pv NAME [--vg VG --lv LV] [--timeout 5m]
  lvm-agent volume status [--node NODE] [--backend topolvm|google-lvmd|none] [--lvmd-socket PATH] [--stuck-after 5m]

create and delete write the request and wait for the agent's answer, printing
every state change. Exit codes: 0 done, 1 error, 2 usage, 3 failed,
4 failed with InsufficientCapacity, 5 no answer before --timeout.

status shows the node's volume requests (API side) next to lvmd's LVs and
flags MISSING-LV (created PVC, no LV), ORPHAN-LV (LV with lvm-agent's tag for
a PVC UID that no PVC or PV has), STUCK (creating/deleting for longer than
--stuck-after, or with a volume.error), LV-NOT-OURS and BAD-SPEC. Exit codes:
0 no problem, 1 error (lvmd unreachable included), 6 problems found.
`

func volumeMain(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(os.Stderr, volumeUsage)
		return exitUsage
	}
	fs := flag.NewFlagSet("lvm-agent volume "+args[0], flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default $KUBECONFIG; empty: in-cluster)")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the agent's answer")
	var cmd func(context.Context, kubernetes.Interface) error
	switch args[0] {
	case "create":
		ns := fs.String("namespace", "default", "PVC namespace")
		pvc := fs.String("pvc", "", "PVC name (required)")
		vg := fs.String("vg", "", "volume group (required)")
		size := fs.String("size", "", "size, e.g. 1Gi (required)")
		name := fs.String("name", "", "LV name (default pvc-<PVC UID>)")
		tags := fs.String("tags", "", "LVM tags, comma-separated")
		cmd = func(ctx context.Context, c kubernetes.Interface) error {
			q, err := resource.ParseQuantity(*size)
			if *pvc == "" || *vg == "" || err != nil {
				return usageError("create needs --pvc, --vg and a valid --size")
			}
			if *name == "" {
				obj, err := c.CoreV1().PersistentVolumeClaims(*ns).Get(ctx, *pvc, metav1.GetOptions{})
				if err != nil {
					return err
				}
				*name = "pvc-" + string(obj.UID)
			}
			spec := kube.CreateSpec{VolumeGroup: *vg, Name: *name, Size: q.Value(), Tags: splitList(*tags)}
			fmt.Printf("PVC %s/%s: requesting %s/%s (%d bytes)\n", *ns, *pvc, *vg, *name, spec.Size)
			return kube.CreateVolumeWithAnnotations(ctx, c, *ns, *pvc, spec, printState)
		}
	case "delete":
		pv := fs.String("pv", "", "PV name (required)")
		vg := fs.String("vg", "", "volume group (default: from the PV's spec annotation)")
		lv := fs.String("lv", "", "LV name (default: from the PV's spec annotation)")
		cmd = func(ctx context.Context, c kubernetes.Interface) error {
			if *pv == "" {
				return usageError("delete needs --pv")
			}
			if *vg == "" || *lv == "" {
				obj, err := c.CoreV1().PersistentVolumes().Get(ctx, *pv, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if *vg, *lv, err = kube.ParsePVSpec(obj.Annotations[kube.AnnSpec]); err != nil {
					return usageError("give --vg and --lv: " + err.Error())
				}
			}
			fmt.Printf("PV %s: requesting removal of %s/%s\n", *pv, *vg, *lv)
			return kube.DeleteVolumeWithAnnotations(ctx, c, *pv, *vg, *lv, printState)
		}
	case "status":
		o := statusOptions{}
		fs.StringVar(&o.node, "node", defaultNode(), "the node whose volumes to show (default $NODE_NAME, $KUBE_NODE_NAME, then the host name); with --backend none, empty shows every node's requests")
		fs.StringVar(&o.drivers, "driver-name", kube.DefaultDriver, "CSI driver(s) whose PVs the agent serves, comma-separated (as the agent's flag)")
		fs.StringVar(&o.deviceClassMap, "device-class-map", os.Getenv("LVM_AGENT_DEVICE_CLASS_MAP"), "volumeGroup=deviceClass pairs, as the agent's flag (default $LVM_AGENT_DEVICE_CLASS_MAP)")
		fs.DurationVar(&o.stuckAfter, "stuck-after", 5*time.Minute, "a creating/deleting request older than this is reported as stuck")
		fs.StringVar(&o.backend.backend, "backend", "topolvm", "lvmd dialect: topolvm, google-lvmd, or none (API side only)")
		fs.StringVar(&o.backend.lvmdSocket, "lvmd-socket", "/run/topolvm/lvmd.sock", "topolvm lvmd's unix socket")
		fs.StringVar(&o.backend.lvmdAddress, "lvmd-address", "127.0.0.1:1234", "google/lvmd's host:port")
		fs.StringVar(&o.backend.tlsCert, "lvmd-tls-cert", "", "google/lvmd: client certificate for mTLS")
		fs.StringVar(&o.backend.tlsKey, "lvmd-tls-key", "", "google/lvmd: client key for mTLS")
		fs.StringVar(&o.backend.tlsCA, "lvmd-tls-ca", "", "google/lvmd: CA that signed the server's certificate")
		cmd = func(ctx context.Context, c kubernetes.Interface) error { return status(ctx, c, o) }
	default:
		fmt.Fprint(os.Stderr, volumeUsage)
		return exitUsage
	}
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	c, err := newClient(*kubeconfig, 50, 100)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitError
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	return exitCode(cmd(ctx, c))
}

type usageError string

func (e usageError) Error() string { return string(e) }

func exitCode(err error) int {
	var ue usageError
	var fe *kube.FailedError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "%v\n\n%s", err, volumeUsage)
		return exitUsage
	case errors.Is(err, kube.ErrInsufficientCapacity):
		fmt.Fprintln(os.Stderr, err)
		return exitInsufficient
	case errors.As(err, &fe):
		fmt.Fprintln(os.Stderr, err)
		return exitFailed
	case errors.Is(err, errProblems):
		return exitProblems
	case errors.Is(err, context.DeadlineExceeded) || wait.Interrupted(err):
		// watchtools.Until ends with wait's timeout error, not the context's.
		fmt.Fprintln(os.Stderr, "no answer before the timeout:", err)
		return exitTimeout
	}
	fmt.Fprintln(os.Stderr, err)
	return exitError
}

func printState(state, errMsg string) {
	ts := time.Now().Format("15:04:05.000")
	if errMsg != "" {
		fmt.Printf("%s  %s  (%s)\n", ts, state, errMsg)
		return
	}
	fmt.Printf("%s  %s\n", ts, state)
}

// statusOptions are the "volume status" flags.
type statusOptions struct {
	node, drivers, deviceClassMap string
	backend                       options
	stuckAfter                    time.Duration
}

// errProblems: status found mismatches (exit code 6).
var errProblems = errors.New("problems found")

// Checks of "volume status". The upper-case ones are problems.
const (
	checkOK       = "ok"
	checkPending  = "pending"
	checkFailed   = "failed"
	checkReleased = "released" // PVC gone, its PV still refers to the LV: the delete request is due
	checkForeign  = "untagged" // not made by lvm-agent (or by the original agent): left alone
	checkMissing  = "MISSING-LV"
	checkOrphan   = "ORPHAN-LV"
	checkStuck    = "STUCK"
	checkNotOurs  = "LV-NOT-OURS"
	checkBadSpec  = "BAD-SPEC"
)

// statusRow is one volume: the API side (object, state, age) next to the
// lvmd side (LV, size, owner), and what the comparison found.
type statusRow struct {
	object, state, age, lv, size, owner, check, detail string
}

// status compares this node's volume requests on the API server with the
// LVs lvmd reports, and flags orphan LVs (our ownership tag, no PVC of that
// UID and no PV claiming it), missing LVs ("created" PVC, LV absent) and
// stuck requests ("creating"/"deleting" for longer than stuckAfter, or with
// a volume.error).
func status(ctx context.Context, c kubernetes.Interface, o statusOptions) error {
	if o.node == "" && o.backend.backend != "none" {
		return usageError("status needs --node (or $NODE_NAME) to compare with lvmd, or --backend none")
	}
	classes, err := parsePairs(o.deviceClassMap)
	if err != nil {
		return usageError("--device-class-map: " + err.Error())
	}
	pvcs, err := c.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pvs, err := c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	lvs, lvmdErr := listLVs(ctx, o.backend) // reported after the table
	deviceClass := func(vg string) string {
		if dc, ok := classes[vg]; ok {
			return dc
		}
		return vg
	}
	owns := func(owned bool) bool { return o.node == "" || owned }
	n := kube.Node{Name: o.node, Drivers: splitList(o.drivers)}
	now := time.Now()
	seen := map[string]bool{} // LVs that a request names
	lvCell := func(key string) (lv, size, owner string) {
		if lvs == nil {
			return key, "?", "?"
		}
		v, ok := lvs[key]
		if !ok {
			return key, "-", "-"
		}
		return key, resource.NewQuantity(v.SizeBytes, resource.BinarySI).String(), lvOwner(v)
	}
	stuck := func(state string, m metav1.Object) (bool, string) {
		age := now.Sub(requestTime(m))
		if e := m.GetAnnotations()[kube.AnnError]; e != "" {
			return true, e
		}
		if age > o.stuckAfter {
			return true, fmt.Sprintf("%s for %s (threshold %s)", state, duration.HumanDuration(age), o.stuckAfter)
		}
		return false, ""
	}

	var rows []statusRow
	pvcUIDs := map[string]string{}
	for i := range pvcs.Items {
		p := &pvcs.Items[i]
		pvcUIDs[string(p.UID)] = p.Namespace + "/" + p.Name
		st := p.Annotations[kube.AnnLifecycle]
		if st == "" || !owns(n.OwnsPVC(p)) {
			continue
		}
		r := statusRow{object: "pvc/" + p.Namespace + "/" + p.Name, state: st, age: duration.HumanDuration(now.Sub(requestTime(p))),
			lv: "-", size: "-", owner: "-", check: checkOK}
		spec, err := kube.ParseCreateSpec(p.Annotations[kube.AnnSpec])
		key := ""
		if err == nil {
			key = deviceClass(spec.VolumeGroup) + "/" + spec.Name
			seen[key] = true
			r.lv, r.size, r.owner = lvCell(key)
		}
		switch {
		case st == kube.StateFailed:
			r.check, r.detail = checkFailed, p.Annotations[kube.AnnReason]+": "+p.Annotations[kube.AnnError]
		case st == kube.StateCreating:
			r.check = checkPending
			if bad, why := stuck(st, p); bad {
				r.check, r.detail = checkStuck, why
			}
		case err != nil:
			r.check, r.detail = checkBadSpec, err.Error()
		case lvs == nil:
			r.check = "?"
		case st == kube.StateCreated:
			v, ok := lvs[key]
			switch {
			case !ok:
				r.check, r.detail = checkMissing, "the PVC is created, but lvmd has no LV "+key
			case !v.HasTag(agent.OwnerTag(p.UID)):
				r.check, r.detail = checkNotOurs, "the LV lacks the tag "+agent.OwnerTag(p.UID)
			}
		}
		rows = append(rows, r)
	}
	pvClaims := map[string]string{}
	for i := range pvs.Items {
		p := &pvs.Items[i]
		if p.Spec.ClaimRef != nil && p.Spec.ClaimRef.UID != "" {
			pvClaims[string(p.Spec.ClaimRef.UID)] = p.Name
		}
		st := p.Annotations[kube.AnnLifecycle]
		if st == "" || !owns(n.OwnsPV(p)) {
			continue
		}
		r := statusRow{object: "pv/" + p.Name, state: st, age: duration.HumanDuration(now.Sub(requestTime(p))),
			lv: "-", size: "-", owner: "-", check: checkOK}
		if vg, lv, err := kube.ParsePVSpec(p.Annotations[kube.AnnSpec]); err == nil {
			key := deviceClass(vg) + "/" + lv
			seen[key] = true
			r.lv, r.size, r.owner = lvCell(key)
		}
		switch st {
		case kube.StateFailed:
			r.check, r.detail = checkFailed, p.Annotations[kube.AnnReason]+": "+p.Annotations[kube.AnnError]
		case kube.StateDeleting:
			r.check = checkPending
			if bad, why := stuck(st, p); bad {
				r.check, r.detail = checkStuck, why
			}
		}
		rows = append(rows, r)
	}
	// LVs no request names.
	var lone []statusRow
	for key, v := range lvs {
		if seen[key] {
			continue
		}
		r := statusRow{object: "-", state: "-", age: "-", lv: key, size: resource.NewQuantity(v.SizeBytes, resource.BinarySI).String(), owner: lvOwner(v)}
		uid, tagged := lvOwnerUID(v)
		switch {
		case !tagged:
			r.check = checkForeign
		case pvcUIDs[uid] != "":
			r.check, r.detail = checkOK, "PVC "+pvcUIDs[uid]
		case pvClaims[uid] != "":
			r.check, r.detail = checkReleased, "no PVC "+uid+"; PV "+pvClaims[uid]+" still refers to it"
		default:
			r.check, r.detail = checkOrphan, "no PVC of UID "+uid+" and no PV claiming it"
		}
		lone = append(lone, r)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].object < rows[j].object })
	sort.Slice(lone, func(i, j int) bool { return lone[i].lv < lone[j].lv })
	rows = append(rows, lone...)

	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "OBJECT\tSTATE\tAGE\tLV\tLV-SIZE\tLV-OWNER\tCHECK\tDETAIL")
	counts := map[string]int{}
	for _, r := range rows {
		counts[r.check]++
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.object, r.state, r.age, r.lv, r.size, r.owner, r.check, r.detail)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	problems := counts[checkMissing] + counts[checkOrphan] + counts[checkStuck] + counts[checkNotOurs] + counts[checkBadSpec]
	lvmdSide := fmt.Sprintf("%d missing LVs, %d orphan LVs", counts[checkMissing], counts[checkOrphan])
	if lvs == nil {
		lvmdSide = "LVs not checked"
	}
	fmt.Printf("\nnode %s: %d rows; %s, %d stuck requests, %d other problems\n",
		orAll(o.node), len(rows), lvmdSide, counts[checkStuck], counts[checkNotOurs]+counts[checkBadSpec])
	switch {
	case lvmdErr != nil:
		return fmt.Errorf("lvmd side unavailable: %w", lvmdErr)
	case problems > 0:
		return errProblems
	}
	return nil
}

// listLVs returns every LV of every device class lvmd serves, keyed by
// "deviceClass/name"; nil with --backend none.
func listLVs(ctx context.Context, o options) (map[string]lvmbackend.Volume, error) {
	if o.backend == "none" {
		return nil, nil
	}
	b, err := newBackend(o)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	caps, err := b.Capacity(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]lvmbackend.Volume{}
	for _, c := range caps {
		vols, err := b.ListVolumes(ctx, c.DeviceClass)
		if err != nil {
			return nil, err
		}
		for _, v := range vols {
			out[c.DeviceClass+"/"+v.Name] = v
		}
	}
	return out, nil
}

func lvOwnerUID(v lvmbackend.Volume) (string, bool) {
	for _, t := range v.Tags {
		if uid, ok := strings.CutPrefix(t, agent.OwnerTagPrefix); ok {
			return uid, true
		}
	}
	return "", false
}

func lvOwner(v lvmbackend.Volume) string {
	if uid, ok := lvOwnerUID(v); ok {
		return uid
	}
	return "untagged"
}

// requestTime is when the lifecycle annotation was last written, as far as
// the API server's managedFields tell (the last write of the manager that
// owns it), or else the object's creation.
func requestTime(m metav1.Object) time.Time {
	t := m.GetCreationTimestamp().Time
	field := []byte(`"f:` + kube.AnnLifecycle + `"`)
	for _, mf := range m.GetManagedFields() {
		if mf.FieldsV1 != nil && mf.Time != nil && bytes.Contains(mf.FieldsV1.Raw, field) && mf.Time.After(t) {
			t = mf.Time.Time
		}
	}
	return t
}

// defaultNode is the node "status" looks at: the agent's own default, then
// the host name (which is the kubelet's default node name).
func defaultNode() string {
	if n := firstEnv("NODE_NAME", "KUBE_NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

func orAll(node string) string {
	if node == "" {
		return "(all)"
	}
	return node
}
