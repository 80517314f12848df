package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
)

// statusOptions are the "volume status" flags.
type statusOptions struct {
	node, drivers, deviceClassMap string
	backend                       options
	stuckAfter                    time.Duration
	dmControl                     string // "" or unreadable: no device column
	classes                       string // device classes to list ("": all lvmd serves)
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
	checkDevice   = "DEVICE-INACTIVE" // created, but the LV's device is not active in device-mapper
)

// statusRow is one volume: the API side (object, state, age) next to the
// lvmd side (LV, size, owner), and what the comparison found.
type statusRow struct {
	object, state, age, lv, size, owner, device, check, detail string
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
	lvs, lvmdErr := listLVs(ctx, o.backend, splitList(o.classes)) // reported after the table
	var devs map[agent.DevNum]agent.DeviceState
	dmNote := "not read (--backend none)"
	if lvs != nil {
		devs, dmNote = readDevices(ctx, o.dmControl)
	}
	owns := func(owned bool) bool { return o.node == "" || owned }
	n := kube.Node{Name: o.node, Drivers: splitList(o.drivers), Provisioners: []string{kube.DefaultProvisioner}}
	now := time.Now()
	seen := map[string]bool{} // LVs that a request names
	lvCell := func(key string) (lv, size, owner, device string) {
		if lvs == nil {
			return key, "?", "?", "?"
		}
		v, ok := lvs[key]
		if !ok {
			return key, "-", "-", "-"
		}
		return key, resource.NewQuantity(v.SizeBytes, resource.BinarySI).String(), lvOwner(v), deviceCell(devs, v)
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
			lv: "-", size: "-", owner: "-", device: "-", check: checkOK}
		spec, err := kube.ParseCreateSpec(p.Annotations[kube.AnnSpec])
		key := ""
		if err == nil {
			key = agent.DeviceClass(classes, spec.VolumeGroup) + "/" + spec.Name
			seen[key] = true
			r.lv, r.size, r.owner, r.device = lvCell(key)
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
			case devs != nil && !strings.HasPrefix(r.device, "active"):
				r.check, r.detail = checkDevice, "the LV's device "+devNum(v).String()+" is "+r.device+" in device-mapper"
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
			lv: "-", size: "-", owner: "-", device: "-", check: checkOK}
		if vg, lv, err := kube.ParsePVSpec(p.Annotations[kube.AnnSpec]); err == nil {
			key := agent.DeviceClass(classes, vg) + "/" + lv
			seen[key] = true
			r.lv, r.size, r.owner, r.device = lvCell(key)
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
		r := statusRow{object: "-", state: "-", age: "-", lv: key, size: resource.NewQuantity(v.SizeBytes, resource.BinarySI).String(), owner: lvOwner(v), device: deviceCell(devs, v)}
		uid, tagged := agent.OwnerUID(&v)
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
	fmt.Fprintln(w, "OBJECT\tSTATE\tAGE\tLV\tLV-SIZE\tLV-OWNER\tDEVICE\tCHECK\tDETAIL")
	counts := map[string]int{}
	for _, r := range rows {
		counts[r.check]++
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.object, r.state, r.age, r.lv, r.size, r.owner, r.device, r.check, r.detail)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	badPools := printPools(os.Stdout, devs, lvs)
	if devs == nil {
		fmt.Printf("\ndevice state: %s\n", dmNote)
	}
	problems := counts[checkMissing] + counts[checkOrphan] + counts[checkStuck] + counts[checkNotOurs] + counts[checkBadSpec] + counts[checkDevice] + badPools
	lvmdSide := fmt.Sprintf("%d missing LVs, %d orphan LVs", counts[checkMissing], counts[checkOrphan])
	if lvs == nil {
		lvmdSide = "LVs not checked"
	}
	fmt.Printf("\nnode %s: %d rows; %s, %d stuck requests, %d unhealthy thin pools, %d other problems\n",
		orAll(o.node), len(rows), lvmdSide, counts[checkStuck], badPools, counts[checkNotOurs]+counts[checkBadSpec]+counts[checkDevice])
	switch {
	case lvmdErr != nil:
		return fmt.Errorf("lvmd side unavailable: %w", lvmdErr)
	case problems > 0:
		return errProblems
	}
	return nil
}

// listLVs returns every LV of the device classes (all lvmd serves when
// none are given), keyed by "deviceClass/name"; nil with --backend none.
func listLVs(ctx context.Context, o options, classes []string) (map[string]lvmbackend.Volume, error) {
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
		if len(classes) > 0 && !slices.Contains(classes, c.DeviceClass) {
			continue
		}
		vols, err := b.ListVolumes(ctx, c.DeviceClass)
		if err != nil {
			return nil, fmt.Errorf("device class %s (leave it out with --device-classes): %w", c.DeviceClass, err)
		}
		for _, v := range vols {
			out[c.DeviceClass+"/"+v.Name] = v
		}
	}
	return out, nil
}

func lvOwner(v lvmbackend.Volume) string {
	if uid, ok := agent.OwnerUID(&v); ok {
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

// readDevices reads device-mapper's state of every device, or says why not
// (a missing or unreadable control node is not an error: status then shows
// no device column, like the agent carries on without it).
func readDevices(ctx context.Context, path string) (map[agent.DevNum]agent.DeviceState, string) {
	if path == "" {
		return nil, "not read (--device-mapper-control is empty)"
	}
	dm, err := devmapper.Open(path)
	if err != nil {
		return nil, "not read: " + err.Error()
	}
	defer dm.Close()
	devs, err := agent.NewDevices(dm, nil).Snapshot(ctx)
	if err != nil {
		return nil, "not read: " + err.Error()
	}
	return devs, ""
}

func devNum(v lvmbackend.Volume) agent.DevNum {
	return agent.DevNum{Major: v.DevMajor, Minor: v.DevMinor}
}

// deviceCell is an LV's device state: active, suspended or inactive as
// device-mapper has it ("absent" when lvmd's device numbers are not there),
// and for a thin volume the pool space it maps.
func deviceCell(devs map[agent.DevNum]agent.DeviceState, v lvmbackend.Volume) string {
	switch {
	case devs == nil:
		return "?"
	case v.DevMajor == 0 && v.DevMinor == 0:
		return "inactive"
	}
	d, ok := devs[devNum(v)]
	if !ok {
		return "absent"
	}
	if d.Thin == nil {
		return d.State
	}
	cell := d.State + ", " + resource.NewQuantity(int64(d.Thin.MappedBytes()), resource.BinarySI).String() + " mapped"
	if pool, ok := devs[d.Pool]; ok {
		cell += " in " + agent.LVMName(pool.Name)
	}
	return cell
}

// printPools prints the thin pools that hold the listed LVs, with their
// fill levels, and returns how many are unhealthy (failed, read-only, out of
// data space, needing a check).
func printPools(w io.Writer, devs map[agent.DevNum]agent.DeviceState, lvs map[string]lvmbackend.Volume) int {
	used := map[agent.DevNum]int{}
	for _, v := range lvs {
		if d, ok := devs[devNum(v)]; ok && d.Thin != nil {
			used[d.Pool]++
		}
	}
	var lines []string
	bad := 0
	for n, count := range used {
		d, ok := devs[n]
		if !ok || d.ThinPool == nil {
			continue
		}
		p := d.ThinPool
		line := fmt.Sprintf("thin pool %s (%s, %s): %d LVs; data %d/%d blocks (%.2f%%), metadata %d/%d blocks (%.2f%%), mode %s",
			agent.LVMName(d.Name), d.Name, n, count, p.UsedDataBlocks, p.TotalDataBlocks, 100*p.DataUsedFraction(),
			p.UsedMetadataBlocks, p.TotalMetadataBlocks, 100*p.MetadataUsedFraction(), p.Mode)
		if problems := d.PoolProblems(); len(problems) > 0 {
			bad++
			line += "  UNHEALTHY: " + strings.Join(problems, ", ")
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	if len(lines) > 0 {
		fmt.Fprintln(w)
	}
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	return bad
}
