package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The demo (make demo): a Filesystem claim whose bytes outlive its Pod, and
// a Block claim whose raw bytes the node reads on the LV, as a user would
// see them. The classes: deploy/examples' thick class, applied as a user
// would, and classes of lvm-agent's provisioner made here (Class).

// ThickClass applies deploy/examples/storageclass-thick.yaml (lvm-thick:
// thick LVs in vg1, ext4), as the README has a user do.
func (s *Story) ThickClass(ctx context.Context) {
	s.Kubectl(ctx, "apply", "-f", s.Deploy+"/examples/storageclass-thick.yaml")
}

// Class makes a class of lvm-agent's provisioner that may grow, unless one
// of that name is there: volumeGroup is lvmd's device class.
func (s *Story) Class(ctx context.Context, name, volumeGroup, fsType string, reclaim corev1.PersistentVolumeReclaimPolicy) {
	wait := storagev1.VolumeBindingWaitForFirstConsumer
	grow := true
	sc := &storagev1.StorageClass{
		ObjectMeta:           metav1.ObjectMeta{Name: name},
		Provisioner:          "lvm.lvm-agent.io",
		VolumeBindingMode:    &wait,
		AllowVolumeExpansion: &grow,
		ReclaimPolicy:        &reclaim,
		Parameters:           map[string]string{"volumeGroup": volumeGroup, "fsType": fsType},
	}
	_, err := s.Kube.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = nil
	}
	s.Must(err, "creating storageclass/%s", name)
	s.Show(fmt.Sprintf("kubectl apply -f %s.yaml   # provisioner lvm.lvm-agent.io, volumeGroup %s, fsType %s, reclaimPolicy %s, allowVolumeExpansion",
		name, volumeGroup, fsType, reclaim), "storageclass.storage.k8s.io/"+name+" created")
}

func demoFilesystem(ctx context.Context, s *Story) {
	s.Step("A StorageClass, a PVC and a Pod that writes to it",
		"The class is deploy/examples/storageclass-thick.yaml: thick LVs in vg1, ext4 on first mount.",
		"The Pod writes a file and fsyncs it.")
	s.ThickClass(ctx)
	s.PVC(ctx, Claim{Name: "data", Class: thickClass, Size: "256Mi"})
	s.RunPod(ctx, PodSpec{Name: "writer", Claim: "data", Script: "echo written by the first Pod >/data/file && sync /data/file"})
	s.WaitReady(ctx, "writer")
	s.Say("The scheduler picked the node, the provisioner asked that node's agent, the agent had lvmd make the LV:")
	s.Kubectl(ctx, "get", "pvc,pv")
	s.ExecWithin(ctx, "writer", "written by the first Pod", "cat", "/data/file")
	v := s.Bound(ctx, "data")
	if s.Install == "helm" {
		s.operatorView(ctx, v)
	}

	s.Step("The Pod deleted and created again: the same bytes", "The data lives on the LV, not in the Pod.")
	s.DeletePod(ctx, "writer")
	s.RunPod(ctx, PodSpec{Name: "reader", Claim: "data", Script: "true"})
	s.WaitReady(ctx, "reader")
	if got := strings.TrimSpace(s.ExecShow(ctx, "reader", "cat", "/data/file")); got != "written by the first Pod" {
		s.Fatalf("pod/reader reads %q in /data/file, want what pod/writer wrote", got)
	}

	s.Step("The PVC deleted: its PV and its LV go",
		"reclaimPolicy: Delete: the provisioner asks the agent to remove the LV, then deletes the PV.")
	s.DeletePod(ctx, "reader")
	s.DeletePVC(ctx, "data")
	s.Kubectl(ctx, "get", "pv")
	s.ShowLVs(s.LVs(ctx))
}

// operatorView: `lvm-agent volume status -o json` and `--version` in the
// agent's container (a helm install): the claim's row is ok, and the
// version is the build's.
func (s *Story) operatorView(ctx context.Context, v Volume) {
	s.Step("The operator's view: lvm-agent volume status -o json, lvm-agent --version",
		"Run in the agent's container, which has the node's name, its lvmd socket and the device-class map.")
	out := s.Kubectl(ctx, "-n", "lvm-agent", "exec", "ds/lvm-agent", "-c", "lvm-agent", "--", "/lvm-agent", "volume", "status", "-o", "json")
	var status struct {
		Volumes []struct{ Object, Check string }
	}
	s.Must(json.Unmarshal([]byte(out), &status), "reading volume status's JSON")
	found := false
	for _, r := range status.Volumes {
		if r.Object == "pvc/"+s.NS+"/"+v.Claim {
			found = true
			if r.Check != "ok" || !strings.Contains(out, v.PV) {
				s.Fatalf("volume status: the row of pvc/%s/%s says check %q (want ok), PV %s named: %v", s.NS, v.Claim, r.Check, v.PV, strings.Contains(out, v.PV))
			}
		}
	}
	if !found {
		s.Fatalf("volume status has no row of pvc/%s/%s", s.NS, v.Claim)
	}
	version := s.Kubectl(ctx, "-n", "lvm-agent", "exec", "ds/lvm-agent", "-c", "lvm-agent", "--", "/lvm-agent", "--version")
	if strings.Contains(version, "unknown") || strings.Contains(version, "(devel)") {
		s.Fatalf("lvm-agent --version says %q: not the build's version", strings.TrimSpace(version))
	}
}

const rawBytes = "raw bytes on an lvm-agent LV"

func demoBlock(ctx context.Context, s *Story) {
	s.Step("A volumeMode: Block PVC: raw bytes on the device",
		"The Pod gets the LV itself as /dev/xvda, no file system; it writes bytes with dd and reads them back.")
	s.ThickClass(ctx)
	s.PVC(ctx, Claim{Name: "raw", Class: thickClass, Size: "64Mi", Block: true})
	s.RunPod(ctx, PodSpec{Name: "raw", Claim: "raw", Block: true,
		Script: "printf '" + rawBytes + "' | dd of=/dev/xvda bs=512 conv=sync,notrunc && sync"})
	s.WaitReady(ctx, "raw")
	s.ExecWithin(ctx, "raw", rawBytes, "dd", "if=/dev/xvda", fmt.Sprintf("bs=%d", len(rawBytes)), "count=1", "status=none")
	v := s.Bound(ctx, "raw")
	s.Say("The node reads the same bytes on the LV the PV names:")
	got := s.NodeRead(v.Device, len(rawBytes))
	s.Show(fmt.Sprintf("dd if=%s bs=%d count=1 status=none", v.Device, len(rawBytes)), got)
	if got != rawBytes {
		s.Fatalf("the node reads %q at the start of %s (pv/%s), want %q", got, v.Device, v.PV, rawBytes)
	}

	s.Step("A Block PVC grows: the Pod's device shows the new size at once",
		"No filesystem: the claim is done when the LV has grown; blockdev in the running Pod reads the device's size.")
	s.ExecShow(ctx, "raw", "blockdev", "--getsize64", "/dev/xvda")
	s.Resize(ctx, "raw", "128Mi")
	s.ExecWithin(ctx, "raw", fmt.Sprint(128<<20), "blockdev", "--getsize64", "/dev/xvda")
	s.ClaimCapacity(ctx, "raw", "128Mi")

	s.Step("A request bigger than the VG (8 GiB): a Warning, the LV as it was",
		"The agent answers InsufficientCapacity; the claim says ControllerResizeInfeasible and can be lowered again.")
	s.Resize(ctx, "raw", "8Gi")
	s.Within(ctx, "ControllerResizeInfeasible on pvc/raw", func(ctx context.Context) (bool, string, error) {
		pvc, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Get(ctx, "raw", metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		st := pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage]
		return st == corev1.PersistentVolumeClaimControllerResizeInfeasible, "allocatedResourceStatuses " + string(st), nil
	})
	s.WaitEvent(ctx, "raw", "VolumeResizeFailed", corev1.EventTypeWarning)
	pv, err := s.Kube.CoreV1().PersistentVolumes().Get(ctx, v.PV, metav1.GetOptions{})
	s.Must(err, "reading pv/%s", v.PV)
	s.Show("kubectl get pv "+v.PV+` -o jsonpath='{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.reason}: {...volume\.error}'`,
		pv.Annotations["pv.csi.alibabacloud.com/volume.reason"]+": "+pv.Annotations["pv.csi.alibabacloud.com/volume.error"])
	lv, _ := s.LVs(ctx).Named(v.LV.Name)
	if lv.Size != 128<<20 {
		s.Fatalf("LV %s is %d bytes after the refused grow, want %d", v.LV.Name, lv.Size, 128<<20)
	}
	if got := strings.TrimSpace(s.ExecShow(ctx, "raw", "blockdev", "--getsize64", "/dev/xvda")); got != fmt.Sprint(128<<20) {
		s.Fatalf("pod/raw's device is %s bytes after the refused grow, want %d", got, 128<<20)
	}
}

// NodeRead reads the first n bytes of a device on the node.
func (s *Story) NodeRead(device string, n int) string {
	f, err := os.Open(device)
	s.Must(err, "opening %s on the node", device)
	defer f.Close()
	b := make([]byte, n)
	k, err := f.Read(b)
	s.Must(err, "reading %s on the node", device)
	return string(b[:k])
}

// Resize raises (or lowers) a claim's request, as kubectl patch does.
func (s *Story) Resize(ctx context.Context, claim, size string) {
	patch := fmt.Sprintf(`{"spec":{"resources":{"requests":{"storage":%q}}}}`, size)
	_, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Patch(ctx, claim, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	s.Must(err, "patching pvc/%s's request to %s", claim, size)
	s.Show("kubectl patch pvc "+claim+" -p '"+patch+"'", "persistentvolumeclaim/"+claim+" patched")
}

// ClaimCapacity waits until the claim's status says its capacity is size.
func (s *Story) ClaimCapacity(ctx context.Context, claim, size string) {
	s.Within(ctx, "pvc/"+claim+" capacity "+size, func(ctx context.Context) (bool, string, error) {
		pvc, err := s.Kube.CoreV1().PersistentVolumeClaims(s.NS).Get(ctx, claim, metav1.GetOptions{})
		if err != nil {
			return false, err.Error(), nil
		}
		got := pvc.Status.Capacity[corev1.ResourceStorage]
		return got.String() == size, "capacity " + got.String(), nil
	})
	s.Show("kubectl wait --for=jsonpath='{.status.capacity.storage}'="+size+" pvc/"+claim, "persistentvolumeclaim/"+claim+" condition met")
}

// Events shows the events of the object of that name with that reason
// (and type, when not "").
func (s *Story) Events(ctx context.Context, name, reason, typ string) {
	sel := eventSelector(name, reason, typ)
	evs, err := s.Kube.CoreV1().Events(s.NS).List(ctx, metav1.ListOptions{FieldSelector: sel})
	s.Must(err, "listing events %s", sel)
	s.showEvents(sel, evs.Items)
}

func eventSelector(name, reason, typ string) string {
	sel := "involvedObject.name=" + name + ",reason=" + reason
	if typ != "" {
		sel += ",type=" + typ
	}
	return sel
}

func (s *Story) showEvents(sel string, evs []corev1.Event) {
	var lines []string
	for _, e := range evs {
		lines = append(lines, fmt.Sprintf("%s  %s  %s", e.Type, e.Reason, e.Message))
	}
	s.Show("kubectl get events --field-selector "+sel, strings.Join(lines, "\n"))
}

// WaitEvent waits for an event of that reason (and type, when not "") on
// the object of that name (events are written after what they tell of) and
// shows the events it found.
func (s *Story) WaitEvent(ctx context.Context, name, reason, typ string) {
	sel := eventSelector(name, reason, typ)
	var found []corev1.Event
	s.Within(ctx, "a "+reason+" event on "+name, func(ctx context.Context) (bool, string, error) {
		evs, err := s.Kube.CoreV1().Events(s.NS).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return false, err.Error(), nil
		}
		found = evs.Items
		return len(found) > 0, "no such event yet", nil
	})
	s.showEvents(sel, found)
}
