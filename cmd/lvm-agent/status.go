package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmmeta"
)

// statusOptions are the "volume status" flags.
type statusOptions struct {
	node, drivers, deviceClassMap string
	backend                       options
	stuckAfter                    time.Duration
	dmControl                     string // "" or unreadable: no device column
	classes                       string // device classes to list ("": all lvmd serves)
	output                        string // "", wide, json or yaml
}

// errProblems: status found mismatches (exit code 6).
var errProblems = errors.New("problems found")

// Checks of "volume status". The upper-case ones are problems.
const (
	checkOK       = "ok"
	checkPending  = "pending"
	checkFailed   = "failed"
	checkReleased = "released" // PVC gone, its PV still refers to the LV: the delete request is due
	checkNamed    = "named"    // PVC gone, but a spec or a PV's volume handle names the LV: the collector keeps it
	checkKept     = "kept"     // PVC gone, nothing refers to the LV, but it is tagged protected or retained, or not plain
	checkWiping   = "wiping"   // deleting: the thick LV is zeroed before lvmd removes it (agent/wipe.go)
	checkForeign  = "untagged" // not made by lvm-agent (or by the original agent): left alone
	checkMissing  = "MISSING-LV"
	checkOrphan   = "ORPHAN-LV"
	checkStuck    = "STUCK"
	checkNotOurs  = "LV-NOT-OURS"
	checkBadSpec  = "BAD-SPEC"
	checkDevice   = "DEVICE-INACTIVE" // created, but the LV's device is not active in device-mapper
	checkNodeLost = "NODE-LOST"       // the claim's node is lost for good; the provisioner kept the claim (kube.AnnNodeLost)
)

// statusRow is one volume: the API side (object, state, age) next to the
// lvmd side (LV, size, owner), and what the comparison found. "-" is a
// side that has nothing, "?" one that was not read.
type statusRow struct {
	Object string `json:"object"`
	State  string `json:"state"`
	Age    string `json:"age"`
	LV     string `json:"lv"`
	Size   string `json:"lvSize"`
	Owner  string `json:"lvOwner"`
	Device string `json:"device"`
	Check  string `json:"check"`
	Detail string `json:"detail,omitempty"`
}

// statusReport is everything "status" found, as -o json|yaml prints it.
type statusReport struct {
	Node      string       `json:"node"` // "" with --backend none: every node
	Volumes   []statusRow  `json:"volumes"`
	ThinPools []poolStatus `json:"thinPools"`
	// DeviceState says why device-mapper was not read (empty when it was).
	DeviceState string        `json:"deviceState,omitempty"`
	Summary     statusSummary `json:"summary"`
	LVMDError   string        `json:"lvmdError,omitempty"`
}

type statusSummary struct {
	Rows               int  `json:"rows"`
	LVsChecked         bool `json:"lvsChecked"`
	MissingLVs         int  `json:"missingLVs"`
	OrphanLVs          int  `json:"orphanLVs"`
	StuckRequests      int  `json:"stuckRequests"`
	UnhealthyThinPools int  `json:"unhealthyThinPools"`
	OtherProblems      int  `json:"otherProblems"`
}

// poolStatus is one thin pool that holds listed LVs.
type poolStatus struct {
	Name                string   `json:"name"`   // VG/POOL
	Device              string   `json:"device"` // VG-POOL-tpool
	DevNum              string   `json:"devNum"`
	LVs                 int      `json:"lvs"`
	UsedDataBlocks      uint64   `json:"usedDataBlocks"`
	TotalDataBlocks     uint64   `json:"totalDataBlocks"`
	DataUsedPercent     float64  `json:"dataUsedPercent"`
	UsedMetadataBlocks  uint64   `json:"usedMetadataBlocks"`
	TotalMetadataBlocks uint64   `json:"totalMetadataBlocks"`
	MetadataUsedPercent float64  `json:"metadataUsedPercent"`
	Mode                string   `json:"mode"`
	Problems            []string `json:"problems,omitempty"`
}

// status compares this node's volume requests on the API server with the
// LVs lvmd reports, and flags orphan LVs (what the orphan collector would
// remove: agent.References decides), missing LVs ("created" PVC, LV absent)
// and stuck requests ("creating"/"deleting" for longer than stuckAfter, or
// with a volume.error).
func status(ctx context.Context, c apiclient.Interface, o statusOptions) error {
	if o.output != "" && o.output != "wide" && o.output != "json" && o.output != "yaml" {
		return usageError("-o must be wide, json or yaml, not " + o.output)
	}
	if o.node == "" && o.backend.backend != "none" {
		return usageError("status needs --node (or $NODE_NAME) to compare with lvmd, or --backend none")
	}
	classes, err := parsePairs(o.deviceClassMap)
	if err != nil {
		return usageError("--device-class-map: " + err.Error())
	}
	pvcs, err := c.PVCs("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pvs, err := c.PVs().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	lvs, lvmdErr := listLVs(ctx, o.backend, splitList(o.classes)) // reported after the table
	var devs map[devmapper.DevNum]devmapper.DeviceState
	dmNote := "not read (--backend none)"
	if lvmdErr != nil {
		dmNote = "not read (lvmd unavailable)"
	}
	if lvs != nil {
		devs, dmNote = readDevices(ctx, o.dmControl)
	}
	check := statusCheck{node: o.kubeNode(ctx, c), classes: classes, lvs: lvs, devs: devs, now: time.Now(), stuckAfter: o.stuckAfter}
	rep := check.report(pvcs.Items, pvs.Items)
	rep.DeviceState = dmNote
	if lvmdErr != nil {
		rep.LVMDError = lvmdErr.Error()
	}
	if err := printStatus(os.Stdout, rep, o.output); err != nil {
		return err
	}
	sum := rep.Summary
	switch {
	case lvmdErr != nil:
		return fmt.Errorf("lvmd side unavailable: %w", lvmdErr)
	case sum.MissingLVs+sum.OrphanLVs+sum.StuckRequests+sum.UnhealthyThinPools+sum.OtherProblems > 0:
		return errProblems
	}
	return nil
}

// kubeNode is the node whose requests status shows (Name "": every node),
// with its hostname label read as the agent reads it.
func (o statusOptions) kubeNode(ctx context.Context, c apiclient.Interface) kube.Node {
	node := kube.Node{Name: o.node, Drivers: splitList(o.drivers), Provisioners: []string{kube.DefaultProvisioner}}
	if node.Name == "" {
		return node
	}
	return withHostname(ctx, c, node)
}

// statusCheck is what the API side is compared with.
type statusCheck struct {
	node       kube.Node // Name "": every node
	classes    map[string]string
	lvs        map[string]lvmbackend.Volume               // by "deviceClass/name"; nil: not read
	devs       map[devmapper.DevNum]devmapper.DeviceState // nil: not read
	now        time.Time
	stuckAfter time.Duration
}

// report is one row per request of the node, then one per LV no request
// names, with the thin pools and the counts.
func (s statusCheck) report(pvcs []corev1.PersistentVolumeClaim, pvs []corev1.PersistentVolume) statusReport {
	var refs agent.References
	seen := map[string]bool{} // LVs that a request names
	var rows []statusRow
	for i := range pvcs {
		refs.Add(&pvcs[i])
		if r, ok := s.pvcRow(&pvcs[i], seen); ok {
			rows = append(rows, r)
		}
	}
	for i := range pvs {
		refs.Add(&pvs[i])
		if r, ok := s.pvRow(&pvs[i], seen); ok {
			rows = append(rows, r)
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Object < rows[j].Object })
	rows = append(rows, s.loneRows(&refs, seen)...)

	counts := map[string]int{}
	for _, r := range rows {
		counts[r.Check]++
	}
	pools := thinPools(s.devs, s.lvs)
	rep := statusReport{Node: s.node.Name, Volumes: rows, ThinPools: pools, Summary: statusSummary{
		Rows: len(rows), LVsChecked: s.lvs != nil, MissingLVs: counts[checkMissing], OrphanLVs: counts[checkOrphan],
		StuckRequests: counts[checkStuck], OtherProblems: counts[checkNotOurs] + counts[checkBadSpec] + counts[checkDevice] + counts[checkNodeLost]}}
	for _, p := range pools {
		if len(p.Problems) > 0 {
			rep.Summary.UnhealthyThinPools++
		}
	}
	return rep
}

// row starts the row of a request: ok until a check says otherwise.
func (s statusCheck) row(object, state string, m metav1.Object) statusRow {
	return statusRow{Object: object, State: state, Age: duration.HumanDuration(s.now.Sub(requestTime(m))),
		LV: "-", Size: "-", Owner: "-", Device: "-", Check: checkOK}
}

// setLV fills a row's LV cells from lvmd's LV key and marks it seen.
func (s statusCheck) setLV(r *statusRow, key string, seen map[string]bool) {
	seen[key] = true
	r.LV = key
	if s.lvs == nil {
		r.Size, r.Owner, r.Device = "?", "?", "?"
		return
	}
	if v, ok := s.lvs[key]; ok {
		r.Size, r.Owner, r.Device = resource.NewQuantity(v.SizeBytes, resource.BinarySI).String(), lvOwner(v), deviceCell(s.devs, v)
	}
}

// stuck says whether an open request is stuck, and why.
func (s statusCheck) stuck(state string, m metav1.Object) (bool, string) {
	age := s.now.Sub(requestTime(m))
	if e := m.GetAnnotations()[kube.AnnError]; e != "" {
		return true, e
	}
	if age > s.stuckAfter {
		return true, fmt.Sprintf("%s for %s (threshold %s)", state, duration.HumanDuration(age), s.stuckAfter)
	}
	return false, ""
}

// openRow checks a failed or open request.
func (s statusCheck) openRow(r *statusRow, m metav1.Object) {
	switch a := m.GetAnnotations(); r.State {
	case kube.StateFailed:
		r.Check, r.Detail = checkFailed, a[kube.AnnReason]+": "+a[kube.AnnError]
	case kube.StateCreating, kube.StateDeleting, kube.StateExpanding:
		r.Check = checkPending
		if bad, why := s.stuck(r.State, m); bad {
			r.Check, r.Detail = checkStuck, why
		}
	}
}

// pvcRow is the row of a PVC with a request for the node (false: none).
func (s statusCheck) pvcRow(p *corev1.PersistentVolumeClaim, seen map[string]bool) (statusRow, bool) {
	st := p.Annotations[kube.AnnLifecycle]
	if st == "" || s.node.Name != "" && !s.node.OwnsPVC(p) {
		return statusRow{}, false
	}
	r := s.row("pvc/"+p.Namespace+"/"+p.Name, st, p)
	spec, err := kube.ParseCreateSpec(p.Annotations[kube.AnnSpec])
	key := ""
	if err == nil {
		key = agent.DeviceClass(s.classes, spec.VolumeGroup) + "/" + spec.Name
		s.setLV(&r, key, seen)
	}
	switch {
	case st == kube.StateFailed || st == kube.StateCreating:
		s.openRow(&r, p)
	case err != nil:
		r.Check, r.Detail = checkBadSpec, err.Error()
	case s.lvs == nil:
		r.Check = "?"
	case st == kube.StateCreated:
		v, ok := s.lvs[key]
		switch {
		case !ok:
			r.Check, r.Detail = checkMissing, "the PVC is created, but lvmd has no LV "+key
		case !v.HasTag(agent.OwnerTag(p.UID)):
			r.Check, r.Detail = checkNotOurs, "the LV lacks the tag "+agent.OwnerTag(p.UID)
		case s.devs != nil && !strings.HasPrefix(r.Device, "active"):
			r.Check, r.Detail = checkDevice, "the LV's device "+devNum(v).String()+" is "+r.Device+" in device-mapper"
		case s.devs == nil && !lvActive(v):
			// Without device-mapper (the agent's unprivileged container),
			// lvm's own word: lvmd's lv_attr, read as root.
			r.Check, r.Detail = checkDevice, "lvm reports the LV not active (lv_attr "+v.Attr+"); device-mapper not read"
		}
	}
	if lost := p.Annotations[kube.AnnNodeLost]; lost != "" && st == kube.StateCreated {
		// Whatever lvmd says (a node back with its disks still has the
		// LV): the provisioner kept this claim of a lost node, and only
		// its owner releases it (docs/operations.md "Retiring a node").
		r.Check, r.Detail = checkNodeLost, "node "+lost+"; the claim is kept: delete its Pods, then the claim, to release it"
	}
	return r, true
}

// pvRow is the row of a PV with a request for the node (false: none).
func (s statusCheck) pvRow(p *corev1.PersistentVolume, seen map[string]bool) (statusRow, bool) {
	st := p.Annotations[kube.AnnLifecycle]
	if st == "" || s.node.Name != "" && !s.node.OwnsPV(p) {
		return statusRow{}, false
	}
	r := s.row("pv/"+p.Name, st, p)
	key := ""
	if vg, lv, err := kube.ParsePVSpec(p.Annotations[kube.AnnSpec]); err == nil {
		key = agent.DeviceClass(s.classes, vg) + "/" + lv
		s.setLV(&r, key, seen)
	}
	if st == kube.StateFailed || kube.PVRequest(st) {
		s.openRow(&r, p)
	}
	// A delete's thick LV is zeroed before it is removed: as long as the
	// wipe takes at its --wipe-rate, not stuck (an error still says so).
	if v, ok := s.lvs[key]; ok && st == kube.StateDeleting && p.Annotations[kube.AnnError] == "" && !v.Thin() && !v.HasTag(kube.NoWipeTag) {
		r.Check, r.Detail = checkWiping, "the LV is zeroed before it is removed ("+r.Size+"; lvm_agent_wipe_waiting_bytes says how much is left)"
	}
	return r, true
}

// loneRows are the LVs no request names, checked as the orphan collector
// classifies them, sorted by LV.
func (s statusCheck) loneRows(refs *agent.References, seen map[string]bool) []statusRow {
	var out []statusRow
	for key, v := range s.lvs {
		if seen[key] {
			continue
		}
		r := statusRow{Object: "-", State: "-", Age: "-", LV: key, Size: resource.NewQuantity(v.SizeBytes, resource.BinarySI).String(), Owner: lvOwner(v), Device: deviceCell(s.devs, v)}
		r.Check, r.Detail = loneCheck(refs.Classify(&v))
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LV < out[j].LV })
	return out
}

// loneCheck is the check of an LV no request names.
func loneCheck(ref agent.LVRef) (check, detail string) {
	switch ref.Use {
	case agent.LVForeign:
		return checkForeign, ""
	case agent.LVClaimed:
		return checkOK, ref.By
	case agent.LVReleased:
		return checkReleased, "no PVC " + ref.OwnerUID + "; " + ref.By + " still refers to it"
	case agent.LVNamed:
		return checkNamed, "no PVC " + ref.OwnerUID + "; " + ref.By + " names it"
	case agent.LVKept:
		return checkKept, "no PVC " + ref.OwnerUID + "; " + ref.By + ", so never removed as an orphan"
	}
	return checkOrphan, "no PVC of UID " + ref.OwnerUID + ", no PV claiming it, no spec or volume handle naming it"
}

// printStatus prints the report as a table (wide: with the LV owner and
// device columns), or whole as JSON or YAML.
func printStatus(out io.Writer, rep statusReport, format string) error {
	switch format {
	case "json", "yaml":
		b, err := json.MarshalIndent(rep, "", "  ")
		if err == nil && format == "yaml" {
			b, err = yaml.JSONToYAML(b)
		}
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", bytes.TrimSpace(b))
		return err
	}
	wide := format == "wide"
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if wide {
		fmt.Fprintln(w, "OBJECT\tSTATE\tAGE\tLV\tLV-SIZE\tLV-OWNER\tDEVICE\tCHECK\tDETAIL")
	} else {
		fmt.Fprintln(w, "OBJECT\tSTATE\tAGE\tLV\tLV-SIZE\tCHECK\tDETAIL")
	}
	for _, r := range rep.Volumes {
		if wide {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Object, r.State, r.Age, r.LV, r.Size, r.Owner, r.Device, r.Check, r.Detail)
		} else {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Object, r.State, r.Age, r.LV, r.Size, r.Check, r.Detail)
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	printPools(out, rep.ThinPools)
	if rep.DeviceState != "" {
		fmt.Fprintf(out, "\ndevice state: %s\n", rep.DeviceState)
	}
	s := rep.Summary
	lvmdSide := fmt.Sprintf("%d missing LVs, %d orphan LVs", s.MissingLVs, s.OrphanLVs)
	if !s.LVsChecked {
		lvmdSide = "LVs not checked"
	}
	_, err := fmt.Fprintf(out, "\nnode %s: %d rows; %s, %d stuck requests, %d unhealthy thin pools, %d other problems\n",
		orAll(rep.Node), s.Rows, lvmdSide, s.StuckRequests, s.UnhealthyThinPools, s.OtherProblems)
	return err
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
func readDevices(ctx context.Context, path string) (map[devmapper.DevNum]devmapper.DeviceState, string) {
	if path == "" {
		return nil, "not read (--device-mapper-control is empty)"
	}
	dm, err := devmapper.Open(path)
	if err != nil {
		return nil, "not read: " + err.Error()
	}
	defer dm.Close()
	devs, err := dm.Snapshot(ctx)
	if err != nil {
		return nil, "not read: " + err.Error()
	}
	return devs, ""
}

// lvActive is false only when lvm's lv_attr says the LV is not active.
func lvActive(v lvmbackend.Volume) bool {
	active, known := v.Active()
	return active || !known
}

func devNum(v lvmbackend.Volume) devmapper.DevNum {
	return devmapper.DevNum{Major: v.DevMajor, Minor: v.DevMinor}
}

// deviceCell is an LV's device state: active, suspended or inactive as
// device-mapper has it ("absent" when lvmd's device numbers are not there),
// and for a thin volume the pool space it maps.
func deviceCell(devs map[devmapper.DevNum]devmapper.DeviceState, v lvmbackend.Volume) string {
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
	cell := d.State
	if d.Thin != nil {
		cell += ", " + resource.NewQuantity(int64(d.Thin.MappedBytes()), resource.BinarySI).String() + " mapped"
		if pool, ok := devs[d.Pool]; ok {
			cell += " in " + lvmmeta.LVMName(pool.Name)
		}
	}
	return cell + cryptCell(devs, v)
}

// cryptCell says, for an encrypted LV, whether its dm-crypt mapping is
// open (the device its PV names), and how many hold it.
func cryptCell(devs map[devmapper.DevNum]devmapper.DeviceState, v lvmbackend.Volume) string {
	if _, encrypted, _ := kube.EncryptionOf(v.Tags); !encrypted {
		return ""
	}
	name := agent.CryptName(v.DeviceClass, v.Name)
	for _, d := range devs {
		if d.Name == name {
			return fmt.Sprintf(", luks2 open (/dev/mapper/%s %s, %d openers)", name, d.State, d.OpenCount)
		}
	}
	return ", luks2 closed (no /dev/mapper/" + name + ")"
}

// thinPools are the thin pools that hold the listed LVs, with their fill
// levels and problems (failed, read-only, out of data space, needing a
// check), sorted by name.
func thinPools(devs map[devmapper.DevNum]devmapper.DeviceState, lvs map[string]lvmbackend.Volume) []poolStatus {
	used := map[devmapper.DevNum]int{}
	for _, v := range lvs {
		if d, ok := devs[devNum(v)]; ok && d.Thin != nil {
			used[d.Pool]++
		}
	}
	out := []poolStatus{}
	for n, count := range used {
		d, ok := devs[n]
		if !ok || d.ThinPool == nil {
			continue
		}
		p := d.ThinPool
		out = append(out, poolStatus{Name: lvmmeta.LVMName(d.Name), Device: d.Name, DevNum: n.String(), LVs: count,
			UsedDataBlocks: p.UsedDataBlocks, TotalDataBlocks: p.TotalDataBlocks, DataUsedPercent: 100 * p.DataUsedFraction(),
			UsedMetadataBlocks: p.UsedMetadataBlocks, TotalMetadataBlocks: p.TotalMetadataBlocks, MetadataUsedPercent: 100 * p.MetadataUsedFraction(),
			Mode: string(p.Mode), Problems: d.PoolProblems()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// printPools prints one line per thin pool.
func printPools(w io.Writer, pools []poolStatus) {
	if len(pools) > 0 {
		fmt.Fprintln(w)
	}
	for _, p := range pools {
		line := fmt.Sprintf("thin pool %s (%s, %s): %d LVs; data %d/%d blocks (%.2f%%), metadata %d/%d blocks (%.2f%%), mode %s",
			p.Name, p.Device, p.DevNum, p.LVs, p.UsedDataBlocks, p.TotalDataBlocks, p.DataUsedPercent,
			p.UsedMetadataBlocks, p.TotalMetadataBlocks, p.MetadataUsedPercent, p.Mode)
		if len(p.Problems) > 0 {
			line += "  UNHEALTHY: " + strings.Join(p.Problems, ", ")
		}
		fmt.Fprintln(w, line)
	}
}
