package provisioner

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

const mi = 1 << 20

// growAgent plays the node's agent for grow requests on a fake API server:
// each LV grows to the asked size in whole 4 MiB extents while the volume
// group has room (free bytes), and answers as the agent does.
type growAgent struct {
	mu    sync.Mutex
	free  int64
	sizes map[string]int64 // PV name → LV size
	asked int
	fail  string // a reason to answer every request with, when set
}

func (g *growAgent) run(ctx context.Context, c *fake.Clientset) {
	for ctx.Err() == nil {
		pvs, err := c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err == nil {
			for i := range pvs.Items {
				if pv := &pvs.Items[i]; pv.Annotations[kube.AnnLifecycle] == kube.StateExpanding {
					g.answer(ctx, c, pv)
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (g *growAgent) answer(ctx context.Context, c *fake.Clientset, pv *corev1.PersistentVolume) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked++
	spec, err := kube.ParseGrowSpec(pv.Annotations[kube.AnnSpec])
	ans := map[string]string{kube.AnnLifecycle: kube.StateExpanded}
	cur := g.sizes[pv.Name]
	want := (spec.Size + 4*mi - 1) / (4 * mi) * (4 * mi)
	switch {
	case err != nil:
		ans = map[string]string{kube.AnnLifecycle: kube.StateFailed, kube.AnnReason: kube.ReasonInvalidSpec, kube.AnnError: err.Error()}
	case g.fail != "":
		ans = map[string]string{kube.AnnLifecycle: kube.StateFailed, kube.AnnReason: g.fail, kube.AnnError: "refused"}
	case want <= cur:
		ans[kube.AnnSize] = strconv.FormatInt(cur, 10)
	case want-cur > g.free:
		ans = map[string]string{kube.AnnLifecycle: kube.StateFailed, kube.AnnReason: kube.ReasonInsufficientCapacity, kube.AnnError: "no enough space left on VG"}
	default:
		g.free -= want - cur
		g.sizes[pv.Name] = want
		ans[kube.AnnSize] = strconv.FormatInt(want, 10)
	}
	_, _ = kube.UpdatePvWithAnnotations(ctx, clientset.Wrap(c), pv.Name, pv.ResourceVersion, kube.Set(ans), nil)
}

func (g *growAgent) size(pv string) int64 { g.mu.Lock(); defer g.mu.Unlock(); return g.sizes[pv] }

// boundClaim is a claim of size bound to its local PV, made by provisioner name.
func boundClaim(name string, mode corev1.PersistentVolumeMode, size string) (*corev1.PersistentVolumeClaim, *corev1.PersistentVolume) {
	q := resource.MustParse(size)
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(name + "-uid")},
		Spec: corev1.PersistentVolumeClaimSpec{VolumeName: "pv-" + name, VolumeMode: &mode,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: q}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound, Capacity: corev1.ResourceList{corev1.ResourceStorage: q}}}
	fs := "ext4"
	// The fake API server keeps the resourceVersion it is given; a watch
	// from "" is refused.
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-" + name, ResourceVersion: "1",
		Annotations: map[string]string{kube.AnnProvisionedBy: kube.DefaultProvisioner, kube.AnnSpec: "vg0/pv-" + name}},
		Spec: corev1.PersistentVolumeSpec{Capacity: corev1.ResourceList{corev1.ResourceStorage: q}, VolumeMode: &mode,
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg0/pv-" + name, FSType: &fs}},
			ClaimRef:               &corev1.ObjectReference{Namespace: "ns", Name: name, UID: pvc.UID},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: HostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"host-a"}}}}}}}},
		Status: corev1.PersistentVolumeStatus{Phase: corev1.VolumeBound}}
	return pvc, pv
}

// growNode is the PVs' node (hostname host-a), whose agent publishes vg0
// with the ability to grow or without it.
func growNode(grow bool) *corev1.Node {
	capacity := kube.EncodeStorageTopology([]kube.StorageCapacity{{Type: "lvm", Name: "vg0", Capacity: 1 << 30, DeviceClass: "vg0", Grow: grow}})
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{HostnameLabel: "host-a"},
		Annotations: map[string]string{kube.DefaultCapacityAnnotation: capacity}}}
}

func TestResizeAnswers(t *testing.T) {
	for _, c := range []struct {
		name   string
		mode   corev1.PersistentVolumeMode
		ask    string
		fail   string
		size   int64
		fs     bool
		code   codes.Code
		noWait bool
		noGrow bool
	}{
		{name: "filesystem", mode: corev1.PersistentVolumeFilesystem, ask: "255Mi", size: 256 * mi, fs: true},
		{name: "block", mode: corev1.PersistentVolumeBlock, ask: "256Mi", size: 256 * mi},
		{name: "too big", mode: corev1.PersistentVolumeFilesystem, ask: "2Gi", code: codes.OutOfRange},
		{name: "another claim's LV", mode: corev1.PersistentVolumeFilesystem, ask: "256Mi", fail: kube.ReasonNameConflict, code: codes.InvalidArgument},
		{name: "no agent", mode: corev1.PersistentVolumeFilesystem, ask: "256Mi", code: codes.Unavailable, noWait: true},
		// An agent of the original design, or google/lvmd's: never asked.
		{name: "an agent that does not grow", mode: corev1.PersistentVolumeFilesystem, ask: "256Mi", code: codes.InvalidArgument, noGrow: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			pvc, pv := boundClaim("data", c.mode, "64Mi")
			client := fake.NewClientset(pvc, pv, growNode(!c.noGrow))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g := &growAgent{free: 1 << 30, sizes: map[string]int64{pv.Name: 64 * mi}, fail: c.fail}
			if !c.noWait {
				go g.run(ctx, client)
			}
			r := NewResizer(client, Config{Timeout: 300 * time.Millisecond})
			assert.True(t, r.CanSupport(pv, pvc))
			size, fs, err := r.Resize(pv, resource.MustParse(c.ask))
			if c.code != codes.OK {
				assert.Equal(t, c.code, status.Code(err), "%v", err)
				if c.noGrow {
					assert.Contains(t, status.Convert(err).Message(), `does not say it grows volumes of volume group vg0`)
					assert.Zero(t, g.asked, "no request sent")
				}
				return
			}
			require.NoError(t, err)
			assert.EqualValues(t, c.size, size.Value())
			assert.Equal(t, c.fs, fs)
		})
	}
	_, pv := boundClaim("data", corev1.PersistentVolumeFilesystem, "64Mi")
	r := NewResizer(fake.NewClientset(), Config{})
	pv.Annotations[kube.AnnProvisionedBy] = "someone.else"
	assert.False(t, r.CanSupport(pv, nil), "another provisioner's local PV")
	pv.Annotations[kube.AnnProvisionedBy] = kube.DefaultProvisioner
	pv.Spec.Local = nil
	pv.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: kube.DefaultDriver}
	assert.False(t, r.CanSupport(pv, nil), "a CSI PV (an original agent's)")
}

// A grow's path reads neither the Node nor the PV from the API server when
// the Node cache says the agent grows volumes and the PV is as the
// controller read it; a cache that says nothing, or says the agent does not
// grow (behind an upgraded agent), is never the reason for a refusal: the
// Nodes are read from the API server then.
func TestResizeFromTheCaches(t *testing.T) {
	for _, c := range []struct {
		name        string
		cached, api *bool // nil: no such Node
		code        codes.Code
		listed      bool
	}{
		{name: "cache says it grows", cached: ptr(true), api: ptr(true)},
		{name: "cache behind an upgraded agent", cached: ptr(false), api: ptr(true), listed: true},
		{name: "Node not in the cache yet", api: ptr(true), listed: true},
		{name: "neither says it grows", cached: ptr(false), api: ptr(false), listed: true, code: codes.InvalidArgument},
	} {
		t.Run(c.name, func(t *testing.T) {
			pvc, pv := boundClaim("data", corev1.PersistentVolumeFilesystem, "64Mi")
			objs := []runtime.Object{pvc, pv}
			if c.api != nil {
				objs = append(objs, growNode(*c.api))
			}
			client := fake.NewClientset(objs...)
			indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			if c.cached != nil {
				require.NoError(t, indexer.Add(growNode(*c.cached)))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g := &growAgent{free: 1 << 30, sizes: map[string]int64{pv.Name: 64 * mi}}
			go g.run(ctx, client)
			client.ClearActions()
			r := NewResizer(client, Config{Timeout: 5 * time.Second, Nodes: corelisters.NewNodeLister(indexer)})
			size, _, err := r.Resize(pv, resource.MustParse("128Mi"))
			assert.Equal(t, c.code, status.Code(err), "%v", err)
			var listed, gotPV bool
			for _, a := range client.Actions() {
				listed = listed || a.GetVerb() == "list" && a.GetResource().Resource == "nodes"
				gotPV = gotPV || a.GetVerb() == "get" && a.GetResource().Resource == "persistentvolumes"
			}
			assert.Equal(t, c.listed, listed, "Nodes listed from the API server")
			assert.False(t, gotPV, "the PV is asked as the controller read it")
			if c.code == codes.OK {
				assert.EqualValues(t, 128*mi, size.Value())
			}
		})
	}
}

// The state machine Kubernetes defines, driven by external-resizer's
// controller over our Resizer: Filesystem ends NodeResizePending for
// kubelet, Block ends at the new capacity, too big ends
// ControllerResizeInfeasible with the LV unchanged, and a lower request
// recovers.
func TestResizerStates(t *testing.T) {
	fsClaim, fsPV := boundClaim("fs", corev1.PersistentVolumeFilesystem, "64Mi")
	blockClaim, blockPV := boundClaim("block", corev1.PersistentVolumeBlock, "64Mi")
	bigClaim, bigPV := boundClaim("big", corev1.PersistentVolumeFilesystem, "64Mi")
	client := fake.NewClientset(fsClaim, fsPV, blockClaim, blockPV, bigClaim, bigPV, growNode(true))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := &growAgent{free: 1 << 30, sizes: map[string]int64{fsPV.Name: 64 * mi, blockPV.Name: 64 * mi, bigPV.Name: 64 * mi}}
	go g.run(ctx, client)
	done := make(chan struct{})
	factory := NewInformers(client, kube.DefaultCapacityAnnotation)
	rc := NewResizeController(client, factory, NewResizer(client, Config{Timeout: 5 * time.Second}), 2)
	factory.Start(ctx.Done())
	go func() { rc.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	ask := func(name, size string) {
		pvc, err := client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(size)
		_, err = client.CoreV1().PersistentVolumeClaims("ns").Update(ctx, pvc, metav1.UpdateOptions{})
		require.NoError(t, err)
	}
	claim := func(name string) *corev1.PersistentVolumeClaim {
		pvc, err := client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		return pvc
	}
	pvCap := func(name string) string {
		pv, err := client.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		q := pv.Spec.Capacity[corev1.ResourceStorage]
		return q.String()
	}
	waitStatus := func(name string, want corev1.ClaimResourceStatus) *corev1.PersistentVolumeClaim {
		var pvc *corev1.PersistentVolumeClaim
		require.Eventually(t, func() bool {
			pvc = claim(name)
			return pvc.Status.AllocatedResourceStatuses[corev1.ResourceStorage] == want
		}, 10*time.Second, 10*time.Millisecond, "%s: want %q", name, want)
		return pvc
	}

	ask("fs", "256Mi")
	ask("block", "256Mi")
	ask("big", "2Gi")

	pvc := waitStatus("fs", corev1.PersistentVolumeClaimNodeResizePending)
	alloc := pvc.Status.AllocatedResources[corev1.ResourceStorage]
	capacity := pvc.Status.Capacity[corev1.ResourceStorage]
	assert.Equal(t, "256Mi", alloc.String())
	assert.Equal(t, "64Mi", capacity.String(), "kubelet sets a Filesystem claim's capacity once it grew the filesystem")
	assert.Equal(t, "256Mi", pvCap(fsPV.Name))

	require.Eventually(t, func() bool {
		q := claim("block").Status.Capacity[corev1.ResourceStorage]
		return q.String() == "256Mi"
	}, 10*time.Second, 10*time.Millisecond)
	assert.Empty(t, claim("block").Status.AllocatedResourceStatuses, "a Block claim is done once the LV grew")
	assert.Equal(t, "256Mi", pvCap(blockPV.Name))

	waitStatus("big", corev1.PersistentVolumeClaimControllerResizeInfeasible)
	assert.Equal(t, "64Mi", pvCap(bigPV.Name))
	assert.EqualValues(t, 64*mi, g.size(bigPV.Name), "the LV is left as it was")

	ask("big", "512Mi")
	pvc = waitStatus("big", corev1.PersistentVolumeClaimNodeResizePending)
	alloc = pvc.Status.AllocatedResources[corev1.ResourceStorage]
	assert.Equal(t, "512Mi", alloc.String())
	assert.Equal(t, "512Mi", pvCap(bigPV.Name))
	assert.EqualValues(t, 512*mi, g.size(bigPV.Name))

	want := map[string]string{"fs/Resizing": corev1.EventTypeNormal, "fs/FileSystemResizeRequired": corev1.EventTypeNormal,
		"block/Resizing": corev1.EventTypeNormal, "big/VolumeResizeFailed": corev1.EventTypeWarning,
		"big/FileSystemResizeRequired": corev1.EventTypeNormal}
	reasons := map[string]string{}
	assert.Eventually(t, func() bool {
		evs, err := client.CoreV1().Events("ns").List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		for _, e := range evs.Items {
			reasons[e.InvolvedObject.Name+"/"+e.Reason] = e.Type
		}
		for k, v := range want {
			if reasons[k] != v {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "events: %v", reasons)
}
