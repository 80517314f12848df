package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

func TestDeviceCellAndPools(t *testing.T) {
	pool := devmapper.DevNum{Major: 254, Minor: 2}
	full := devmapper.DevNum{Major: 254, Minor: 9}
	devs := map[devmapper.DevNum]devmapper.DeviceState{
		{Major: 254, Minor: 0}: {Name: "vg0-thick", State: "active"},
		{Major: 254, Minor: 1}: {Name: "vg0-held", State: "suspended"},
		pool: {Name: "vg0-pool0-tpool", State: "active", ThinPool: &devmapper.ThinPoolStatus{State: devmapper.StateOK,
			UsedDataBlocks: 64, TotalDataBlocks: 16384, UsedMetadataBlocks: 113, TotalMetadataBlocks: 1024, Mode: devmapper.PoolModeReadWrite}},
		{Major: 254, Minor: 3}: {Name: "vg0-thin", State: "active", Thin: &devmapper.ThinStatus{State: devmapper.StateOK, MappedSectors: 8192}, Pool: pool},
		{Major: 254, Minor: 4}: {Name: "vg0-orphan--thin", State: "active", Thin: &devmapper.ThinStatus{State: devmapper.StateOK}, Pool: devmapper.DevNum{Major: 254, Minor: 99}},
		full: {Name: "vg1-big-tpool", State: "active", ThinPool: &devmapper.ThinPoolStatus{State: devmapper.StateOK,
			UsedDataBlocks: 10, TotalDataBlocks: 10, UsedMetadataBlocks: 1, TotalMetadataBlocks: 4, Mode: devmapper.PoolModeOutOfDataSpace}},
		{Major: 254, Minor: 10}: {Name: "vg1-t", State: "active", Thin: &devmapper.ThinStatus{State: devmapper.StateOK}, Pool: full},
		{Major: 254, Minor: 11}: {Name: "vg0-sealed", State: "active"},
		{Major: 254, Minor: 12}: {Name: "luks-thick-sealed", State: "active", OpenCount: 1},
		{Major: 254, Minor: 13}: {Name: "vg0-shut", State: "active"},
	}
	lv := func(minor uint32) lvmbackend.Volume { return lvmbackend.Volume{DevMajor: 254, DevMinor: minor} }

	assert.Equal(t, "active", deviceCell(devs, lv(0)))
	assert.Equal(t, "suspended", deviceCell(devs, lv(1)))
	assert.Equal(t, "active, 4Mi mapped in vg0/pool0", deviceCell(devs, lv(3)))
	assert.Equal(t, "active, 0 mapped", deviceCell(devs, lv(4)), "pool not found: no name")
	assert.Equal(t, "absent", deviceCell(devs, lv(50)))
	assert.Equal(t, "inactive", deviceCell(devs, lvmbackend.Volume{}), "lvmd reports no device numbers")
	assert.Equal(t, "?", deviceCell(nil, lv(0)), "device-mapper not read")
	sealed := func(minor uint32, name string) lvmbackend.Volume {
		v := lv(minor)
		v.DeviceClass, v.Name, v.Tags = "thick", name, []string{kube.EncryptionTag(kube.KeyRef{Namespace: "lvm-agent", Name: "k"})}
		return v
	}
	assert.Equal(t, "active, luks2 open (/dev/mapper/luks-thick-sealed active, 1 openers)", deviceCell(devs, sealed(11, "sealed")))
	assert.Equal(t, "active, luks2 closed (no /dev/mapper/luks-thick-shut)", deviceCell(devs, sealed(13, "shut")))

	var out strings.Builder
	pools := thinPools(devs, map[string]lvmbackend.Volume{"thin/a": lv(3), "thick/b": lv(0), "thin/c": lv(10)})
	require.Len(t, pools, 2)
	assert.Empty(t, pools[0].Problems)
	assert.Equal(t, []string{"out_of_data_space"}, pools[1].Problems)
	printPools(&out, pools)
	assert.Equal(t, `
thin pool vg0/pool0 (vg0-pool0-tpool, 254:2): 1 LVs; data 64/16384 blocks (0.39%), metadata 113/1024 blocks (11.04%), mode rw
thin pool vg1/big (vg1-big-tpool, 254:9): 1 LVs; data 10/10 blocks (100.00%), metadata 1/4 blocks (25.00%), mode out_of_data_space  UNHEALTHY: out_of_data_space
`, out.String())

	out.Reset()
	printPools(&out, thinPools(nil, map[string]lvmbackend.Volume{"thin/a": lv(3)}))
	assert.Empty(t, out.String())
}

// Issue 18, item 1: "volume status" calls ORPHAN-LV exactly what the orphan
// collector would remove; an LV that the collector keeps (named by a spec or
// a CSI volume handle, tagged protected or retained) is no problem.
func TestStatusOrphanIsTheCollectors(t *testing.T) {
	pv := func(spec, handle string) *corev1.PersistentVolume {
		p := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1", Annotations: map[string]string{}},
			Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{
				CSI: &corev1.CSIPersistentVolumeSource{Driver: kube.DefaultDriver, VolumeHandle: handle}}}}
		if spec != "" {
			p.Annotations[kube.AnnSpec] = spec
		}
		return p
	}
	owner := agent.OwnerTag("gone")
	for _, tc := range []struct {
		name       string
		tags       []string
		objs       []runtime.Object
		shape      lvmdfake.LV   // lv1 beyond its name, class and tags
		others     []lvmdfake.LV // untagged LVs added before lv1
		wantOrphan bool
	}{
		{name: "orphan", tags: []string{owner}, wantOrphan: true},
		{name: "unrelated objects", tags: []string{owner}, objs: []runtime.Object{pv("vg1/lv2", "lv2")}, wantOrphan: true},
		{name: "a PV's volume handle names it", tags: []string{owner}, objs: []runtime.Object{pv("", "lv1")}},
		{name: "a PV's spec names it", tags: []string{owner}, objs: []runtime.Object{pv("vg1/lv1", "h")}},
		{name: "a PV's JSON spec names it", tags: []string{owner}, objs: []runtime.Object{pv(`{"volumeGroup":"vg1","name":"lv1"}`, "h")}},
		{name: "another PVC's spec names it", tags: []string{owner}, objs: []runtime.Object{&corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other", UID: "other",
				Annotations: map[string]string{kube.AnnSpec: `{"volumeGroup":"vg1","name":"lv1","size":4096}`}}}}},
		{name: "protected", tags: []string{owner, agent.ProtectedTag}},
		{name: "retained", tags: []string{owner, kube.RetainedTag}},
		{name: "a tag without a UID", tags: []string{agent.OwnerTagPrefix}},
		// Issue 14, item 7: lvremove -f would take the dependents along.
		{name: "an origin with a snapshot", tags: []string{owner}, others: []lvmdfake.LV{{Name: "snap", Origin: "lv1"}}},
		{name: "a thin pool with a thin LV", tags: []string{owner}, shape: lvmdfake.LV{IsPool: true}, others: []lvmdfake.LV{{Name: "thin1", Pool: "lv1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lvm := lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", VG: "vg1", SizeBytes: 1 << 30})
			socket := filepath.Join(t.TempDir(), "lvmd.sock")
			lvmd := lvmdfake.NewTopolvm(lvm)
			require.NoError(t, lvmd.Serve(socket))
			t.Cleanup(lvmd.Stop)
			for _, lv := range append(tc.others, tc.shape) {
				if lv.Name == "" {
					lv.Name, lv.Tags = "lv1", tc.tags
				}
				lv.Class, lv.SizeBytes = "vg1", 4<<20
				require.NoError(t, lvm.Add(lv))
			}
			o := statusOptions{node: "node-1", stuckAfter: time.Minute}
			o.backend.backend, o.backend.lvmdSocket, o.backend.meta.mode = "topolvm", socket, "off"
			err := status(context.Background(), clientset.Wrap(fake.NewClientset(tc.objs...)), o)
			if tc.wantOrphan {
				require.ErrorIs(t, err, errProblems)
			} else {
				require.NoError(t, err)
			}
		})
	}
}

func TestLoneCheck(t *testing.T) {
	for _, tc := range []struct {
		ref           agent.LVRef
		check, detail string
	}{
		{agent.LVRef{Use: agent.LVForeign}, "untagged", ""},
		{agent.LVRef{Use: agent.LVClaimed, OwnerUID: "u", By: "PVC ns/a"}, "ok", "PVC ns/a"},
		{agent.LVRef{Use: agent.LVReleased, OwnerUID: "u", By: "PV pv-1"}, "released", "no PVC u; PV pv-1 still refers to it"},
		{agent.LVRef{Use: agent.LVNamed, OwnerUID: "u", By: "the CSI volume handle of PV pv-1"}, "named", "no PVC u; the CSI volume handle of PV pv-1 names it"},
		{agent.LVRef{Use: agent.LVKept, OwnerUID: "u", By: "tagged " + kube.RetainedTag}, "kept", "no PVC u; tagged lvm-agent.retained, so never removed as an orphan"},
		{agent.LVRef{Use: agent.LVKept, OwnerUID: "u", By: "not a plain volume (lv_attr owi-a-s---)"}, "kept", "no PVC u; not a plain volume (lv_attr owi-a-s---), so never removed as an orphan"},
		{agent.LVRef{Use: agent.LVOrphan, OwnerUID: "u"}, "ORPHAN-LV", "no PVC of UID u, no PV claiming it, no spec or volume handle naming it"},
	} {
		check, detail := loneCheck(tc.ref)
		assert.Equal(t, [2]string{tc.check, tc.detail}, [2]string{check, detail})
	}
}

// A local PV's affinity names the Node's kubernetes.io/hostname label; where
// that differs from the node name, status shows the PVs the agent serves.
func TestStatusLocalPVByHostname(t *testing.T) {
	localPV := func(name, host string) corev1.PersistentVolume {
		return corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
				kube.AnnLifecycle: kube.StateDeleting, kube.AnnProvisionedBy: kube.DefaultProvisioner}},
			Spec: corev1.PersistentVolumeSpec{
				PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg1/" + name}},
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{host}}}}}}},
			}}
	}
	pvs := []corev1.PersistentVolume{localPV("by-label", "host-1"), localPV("by-name", "node-1")}
	rows := func(c *fake.Clientset) []string {
		n := statusOptions{node: "node-1"}.kubeNode(context.Background(), clientset.Wrap(c))
		var names []string
		for _, r := range (statusCheck{node: n, now: time.Now(), stuckAfter: time.Minute}).report(nil, pvs).Volumes {
			names = append(names, r.Object)
		}
		return names
	}
	labelled := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{corev1.LabelHostname: "host-1"}}})
	assert.Equal(t, []string{"pv/by-label"}, rows(labelled))
	assert.Equal(t, []string{"pv/by-name"}, rows(fake.NewClientset()), "no Node: matched with the node name")
}

// Issue 29: an LV of a created PVC that is not active after a boot is a
// problem, also where device-mapper cannot be read (the agent's
// unprivileged container): lvm's lv_attr says so.
func TestStatusInactiveLVWithoutDeviceMapper(t *testing.T) {
	pvc := corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "data", UID: "uid-1",
		Annotations: map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnSelectedNode: "node-1",
			kube.AnnSpec: `{"volumeGroup":"vg1","name":"lv1","size":4096}`}}}
	for _, tc := range []struct{ attr, check string }{
		{"-wi-a-----", checkOK},
		{"-wi-------", checkDevice},
		{"Vwi-s-tz--", checkDevice},
		{"", checkOK}, // the dialect reports no lv_attr: unknown, not a problem
	} {
		s := statusCheck{node: kube.Node{Name: "node-1"}, now: time.Now(), stuckAfter: time.Minute,
			lvs: map[string]lvmbackend.Volume{"vg1/lv1": {DeviceClass: "vg1", Name: "lv1", SizeBytes: 4 << 20, Attr: tc.attr,
				Tags: []string{agent.OwnerTag("uid-1")}}}}
		rep := s.report([]corev1.PersistentVolumeClaim{pvc}, nil)
		require.NotEmpty(t, rep.Volumes)
		assert.Equal(t, tc.check, rep.Volumes[0].Check, "lv_attr %q: %+v", tc.attr, rep.Volumes[0])
		assert.Equal(t, tc.check != checkOK, rep.Summary.OtherProblems == 1, tc.attr)
	}
}

// Issue 44: a claim the provisioner kept although its node is lost shows
// NODE-LOST, counted a problem, whether or not lvmd was read.
func TestStatusNodeLostClaim(t *testing.T) {
	pvc := corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "data", UID: "uid-1",
		Annotations: map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnSelectedNode: "node-1",
			kube.AnnSpec: `{"volumeGroup":"vg1","name":"lv1","size":4096}`, kube.AnnNodeLost: "node-1: out-of-service taint"}}}
	for name, lvs := range map[string]map[string]lvmbackend.Volume{
		"backend none":          nil,
		"node back with its LV": {"vg1/lv1": {DeviceClass: "vg1", Name: "lv1", SizeBytes: 4 << 20, Tags: []string{agent.OwnerTag("uid-1")}}},
	} {
		s := statusCheck{node: kube.Node{Name: "node-1"}, now: time.Now(), stuckAfter: time.Minute, lvs: lvs}
		rep := s.report([]corev1.PersistentVolumeClaim{pvc}, nil)
		require.NotEmpty(t, rep.Volumes, name)
		assert.Equal(t, checkNodeLost, rep.Volumes[0].Check, name)
		assert.Contains(t, rep.Volumes[0].Detail, "node-1: out-of-service taint", name)
		assert.Equal(t, 1, rep.Summary.OtherProblems, name)
	}
}

// Issue 64: a delete whose thick LV is still there is being zeroed (not
// stuck, however long it takes); one whose agent wrote an error is stuck;
// a thin LV, or one tagged lvm-agent.nowipe, is not zeroed.
func TestStatusWiping(t *testing.T) {
	pv := func(errText string) corev1.PersistentVolume {
		a := map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "vg1/lv1", kube.AnnProvisionedBy: kube.DefaultProvisioner}
		if errText != "" {
			a[kube.AnnError] = errText
		}
		return corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv1", Annotations: a, CreationTimestamp: metav1.NewTime(time.Now().Add(-time.Hour))},
			Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg1/lv1"}},
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"node-1"}}}}}}}}}
	}
	for _, tc := range []struct {
		name, attr, errText, check string
		tags                       []string
	}{
		{"thick", "-wi-a-----", "", checkWiping, nil},
		{"thick with an error", "-wi-a-----", "LV vg1/lv1 has 1 openers", checkStuck, nil},
		{"wipe: none", "-wi-a-----", "", checkStuck, []string{kube.NoWipeTag}},
		{"thin", "Vwi-a-tz--", "", checkStuck, nil},
	} {
		s := statusCheck{node: kube.Node{Name: "node-1", Provisioners: []string{kube.DefaultProvisioner}}, now: time.Now(), stuckAfter: time.Minute,
			lvs: map[string]lvmbackend.Volume{"vg1/lv1": {DeviceClass: "vg1", Name: "lv1", SizeBytes: 4 << 20, Attr: tc.attr,
				Tags: append([]string{agent.OwnerTag("uid-1")}, tc.tags...)}}}
		rep := s.report(nil, []corev1.PersistentVolume{pv(tc.errText)})
		require.Len(t, rep.Volumes, 1, tc.name)
		assert.Equal(t, tc.check, rep.Volumes[0].Check, "%s: %+v", tc.name, rep.Volumes[0])
	}
}
