package provisioner

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/lvm-agent/lvm-agent/kube"
)

func TestParseParams(t *testing.T) {
	for _, c := range []struct {
		name string
		in   map[string]string
		want Params
		err  string
	}{
		{"defaults", map[string]string{"volumeGroup": "vg0"}, Params{VolumeGroup: "vg0", FSType: "ext4", OnNodeLoss: "recreate", Wipe: "zero"}, ""},
		{"all", map[string]string{"volumeGroup": "vg0", "fsType": "xfs", "tags": "b, a", "striping": "true", "onNodeLoss": "keep", "wipe": "none"},
			Params{VolumeGroup: "vg0", FSType: "xfs", Tags: []string{"a", "b"}, Striping: true, OnNodeLoss: "keep", Wipe: "none"}, ""},
		{"bad wipe", map[string]string{"volumeGroup": "vg0", "wipe": "zeros"}, Params{}, `wipe="zeros" is neither "zero" nor "none"`},
		{"bad onNodeLoss", map[string]string{"volumeGroup": "vg0", "onNodeLoss": "Keep"}, Params{}, `onNodeLoss="Keep" is neither "recreate" nor "keep"`},
		{"no vg", map[string]string{"fsType": "xfs"}, Params{}, "volumeGroup is required"},
		{"unknown", map[string]string{"volumeGroup": "vg0", "stripping": "true"}, Params{}, "unknown StorageClass parameter(s) stripping"},
		{"bad bool", map[string]string{"volumeGroup": "vg0", "striping": "yes please"}, Params{}, "not a boolean"},
		{"encrypted", map[string]string{"volumeGroup": "vg0", "encryption": "luks2", "encryptionSecret": "class-key"},
			Params{VolumeGroup: "vg0", FSType: "ext4", OnNodeLoss: "recreate", Wipe: "zero", Encrypted: true, Key: kube.KeyRef{Namespace: "lvm-agent", Name: "class-key"}}, ""},
		{"encrypted, key elsewhere", map[string]string{"volumeGroup": "vg0", "encryption": "luks2", "encryptionSecret": "keys/k"},
			Params{VolumeGroup: "vg0", FSType: "ext4", OnNodeLoss: "recreate", Wipe: "zero", Encrypted: true, Key: kube.KeyRef{Namespace: "keys", Name: "k"}}, ""},
		{"encryption without a key", map[string]string{"volumeGroup": "vg0", "encryption": "luks2"}, Params{}, "needs encryptionSecret"},
		{"a key without encryption", map[string]string{"volumeGroup": "vg0", "encryptionSecret": "k"}, Params{}, "would not be encrypted"},
		{"bad encryption", map[string]string{"volumeGroup": "vg0", "encryption": "luks1", "encryptionSecret": "k"}, Params{}, `encryption="luks1" is not "luks2"`},
		{"bad secret name", map[string]string{"volumeGroup": "vg0", "encryption": "luks2", "encryptionSecret": "Key_1"}, Params{}, "encryptionSecret"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseParams(c.in)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

// An encrypted class's LVs carry the key's tag, and only an agent that
// says it encrypts is sent one.
func TestEncryptedClassTagsAndServes(t *testing.T) {
	p, err := ParseParams(map[string]string{"volumeGroup": "vg0", "encryption": "luks2", "encryptionSecret": "class-key", "wipe": "none", "tags": "a"})
	require.NoError(t, err)
	assert.Equal(t, []string{"a", kube.NoWipeTag, "lvm-agent.luks2=lvm-agent/class-key"}, p.LVTags())
	assert.ErrorIs(t, p.Serves(kube.StorageCapacity{Wipe: kube.WipeZero}), ErrNoEncryption)
	assert.NoError(t, p.Serves(kube.StorageCapacity{Encryption: kube.EncryptionLUKS2}))
	plain, err := ParseParams(map[string]string{"volumeGroup": "vg0", "wipe": "none"})
	require.NoError(t, err)
	assert.NoError(t, plain.Serves(kube.StorageCapacity{}), "a plain class goes anywhere")
}

// world is a fake API server with one node, one PVC and an agent that
// answers the PVC's request with answer (nil: never answers).
type world struct {
	client *fake.Clientset
	pvc    *corev1.PersistentVolumeClaim
	// silent: no agent answers (the provisioner's deadline is then short;
	// otherwise long, so that a loaded host's slow answer is still seen).
	silent bool
}

func newWorld(t *testing.T, mode corev1.PersistentVolumeMode, answer map[string]string) *world {
	t.Helper()
	// Its agent zeroes volumes: every class may be made there.
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{HostnameLabel: "host-a"},
		Annotations: map[string]string{kube.DefaultCapacityAnnotation: kube.EncodeStorageTopology([]kube.StorageCapacity{{Type: "lvm", Name: "vg0", DeviceClass: "vg0", Capacity: 1 << 40, Free: 1 << 40, Wipe: kube.WipeZero}})}}}
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "data", UID: "uid-1", ResourceVersion: "1",
		Annotations: map[string]string{kube.AnnSelectedNode: "node-a"}},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &mode,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}}
	w := &world{client: fake.NewClientset(node, pvc), pvc: pvc, silent: answer == nil}
	w.client.PrependWatchReactor("*", func(a clienttesting.Action) (bool, watch.Interface, error) {
		wi, err := w.client.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if answer != nil && err == nil {
			go w.answer(t, answer)
		}
		return true, wi, err
	})
	return w
}

// answer plays the agent: it writes the answer on the PVC once the
// provisioner watches.
func (w *world) answer(t *testing.T, answer map[string]string) {
	ctx := context.Background()
	pvc, err := w.client.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "data", metav1.GetOptions{})
	if !assert.NoError(t, err) {
		return
	}
	for k, v := range answer {
		pvc.Annotations[k] = v
	}
	_, err = w.client.CoreV1().PersistentVolumeClaims("ns").Update(ctx, pvc, metav1.UpdateOptions{})
	assert.NoError(t, err)
}

func class(mode storagev1.VolumeBindingMode, reclaim corev1.PersistentVolumeReclaimPolicy, params map[string]string) *storagev1.StorageClass {
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "lvm"}, Provisioner: kube.DefaultProvisioner,
		VolumeBindingMode: &mode, ReclaimPolicy: &reclaim, Parameters: params, MountOptions: []string{"noatime"}}
}

var created = map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnDevice: "/dev/vg0/pvc-uid-1"}

func provision(t *testing.T, w *world, sc *storagev1.StorageClass) (*corev1.PersistentVolume, controller.ProvisioningState, error) {
	timeout := 30 * time.Second
	if w.silent {
		timeout = 300 * time.Millisecond
	}
	p := New(w.client, Config{Timeout: timeout})
	return p.Provision(context.Background(), controller.ProvisionOptions{StorageClass: sc, PVName: "pvc-uid-1", PVC: w.pvc, SelectedNodeName: "node-a"})
}

func requested(t *testing.T, w *world) (map[string]string, kube.CreateSpec) {
	pvc, err := w.client.CoreV1().PersistentVolumeClaims("ns").Get(context.Background(), "data", metav1.GetOptions{})
	require.NoError(t, err)
	var spec kube.CreateSpec
	if s, ok := pvc.Annotations[kube.AnnSpec]; ok {
		require.NoError(t, json.Unmarshal([]byte(s), &spec))
	}
	return pvc.Annotations, spec
}

func TestProvisionFilesystem(t *testing.T) {
	w := newWorld(t, corev1.PersistentVolumeFilesystem, created)
	pv, state, err := provision(t, w, class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete,
		map[string]string{"volumeGroup": "vg0", "tags": "app"}))
	require.NoError(t, err)
	assert.Equal(t, controller.ProvisioningFinished, state)
	_, spec := requested(t, w)
	assert.Equal(t, kube.CreateSpec{VolumeGroup: "vg0", Name: "pvc-uid-1", Size: 1 << 30, Tags: []string{"app"}}, spec)

	fs := "ext4"
	fsMode := corev1.PersistentVolumeFilesystem
	want := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "pvc-uid-1", Annotations: map[string]string{kube.AnnSpec: "vg0/pvc-uid-1"},
			Labels: map[string]string{kube.LabelNode: "node-a"}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:                    &fsMode,
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			MountOptions:                  []string{"noatime"},
			PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg0/pvc-uid-1", FSType: &fs}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: HostnameLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"host-a"}}}}}}},
		}}
	assert.Equal(t, want, pv)
}

func TestProvisionBlockRetain(t *testing.T) {
	w := newWorld(t, corev1.PersistentVolumeBlock, created)
	pv, _, err := provision(t, w, class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimRetain,
		map[string]string{"volumeGroup": "vg0"}))
	require.NoError(t, err)
	assert.Nil(t, pv.Spec.Local.FSType, "a block volume is handed raw")
	assert.Equal(t, corev1.PersistentVolumeBlock, *pv.Spec.VolumeMode)
	assert.Equal(t, corev1.PersistentVolumeReclaimRetain, pv.Spec.PersistentVolumeReclaimPolicy)
	_, spec := requested(t, w)
	assert.Equal(t, []string{kube.RetainedTag}, spec.Tags, "an LV of a Retain class is marked retained")
}

func TestProvisionRefusals(t *testing.T) {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	for _, c := range []struct {
		name      string
		class     *storagev1.StorageClass
		answer    map[string]string
		wantState controller.ProvisioningState
		wantErr   string
		asked     bool
	}{
		{"immediate", class(storagev1.VolumeBindingImmediate, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"}),
			created, controller.ProvisioningFinished, "must have volumeBindingMode WaitForFirstConsumer", false},
		{"unknown parameter", class(wffc, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0", "size": "1"}),
			created, controller.ProvisioningFinished, "unknown StorageClass parameter(s) size", false},
		{"insufficient capacity", class(wffc, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"}),
			map[string]string{kube.AnnLifecycle: kube.StateFailed, kube.AnnReason: kube.ReasonInsufficientCapacity, kube.AnnError: "VG full"},
			controller.ProvisioningReschedule, "VG full", true},
		{"other failure", class(wffc, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg9", "wipe": "none"}),
			map[string]string{kube.AnnLifecycle: kube.StateFailed, kube.AnnReason: kube.ReasonUnknownVolumeGroup, kube.AnnError: "no vg9"},
			controller.ProvisioningFinished, "no vg9", true},
		{"no answer in time", class(wffc, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"}),
			nil, controller.ProvisioningInBackground, "no answer before the deadline", true},
		{"agent of the original design", class(wffc, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"}),
			map[string]string{kube.AnnLifecycle: kube.StateCreated}, controller.ProvisioningFinished, "never guesses a device path", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, corev1.PersistentVolumeFilesystem, c.answer)
			pv, state, err := provision(t, w, c.class)
			require.ErrorContains(t, err, c.wantErr)
			assert.Nil(t, pv)
			assert.Equal(t, c.wantState, state)
			ann, _ := requested(t, w)
			assert.Equal(t, c.asked, ann[kube.AnnLifecycle] != "", "request written")
		})
	}
}

func TestDeleteAsksAgent(t *testing.T) {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-uid-1", ResourceVersion: "1",
		Annotations: map[string]string{kube.AnnSpec: "vg0/pvc-uid-1"}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg0/pvc-uid-1"}}}}
	for _, c := range []struct {
		name   string
		answer map[string]string
		err    string
	}{
		{"deleted", map[string]string{kube.AnnLifecycle: kube.StateDeleted}, ""},
		{"failed is an error, so the library retries and the PV stays",
			map[string]string{kube.AnnLifecycle: kube.StateFailed, kube.AnnReason: kube.ReasonProtected, kube.AnnError: "protected"}, "protected"},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := fake.NewClientset(pv.DeepCopy())
			client.PrependWatchReactor("*", func(a clienttesting.Action) (bool, watch.Interface, error) {
				wi, err := client.Tracker().Watch(a.GetResource(), a.GetNamespace())
				go func() {
					got, err := client.CoreV1().PersistentVolumes().Get(context.Background(), pv.Name, metav1.GetOptions{})
					if assert.NoError(t, err) {
						assert.Equal(t, kube.StateDeleting, got.Annotations[kube.AnnLifecycle])
						for k, v := range c.answer {
							got.Annotations[k] = v
						}
						_, err = client.CoreV1().PersistentVolumes().Update(context.Background(), got, metav1.UpdateOptions{})
						assert.NoError(t, err)
					}
				}()
				return true, wi, err
			})
			err := New(client, Config{Timeout: 5 * time.Second}).Delete(context.Background(), pv)
			if c.err == "" {
				require.NoError(t, err)
			} else {
				require.ErrorContains(t, err, c.err)
			}
		})
	}
}

// The library calls Delete again with the PV its cache still holds when the
// agent's answer updated the PV during the first call; by then the PV may be
// gone. That is a delete done, not a failure: ignored (no VolumeFailedDelete
// warning, no retry), whereas a PV the API server still has is asked about.
func TestDeleteOfAPVAlreadyGone(t *testing.T) {
	pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-uid-1", ResourceVersion: "7",
		Annotations: map[string]string{kube.AnnSpec: "vg0/pvc-uid-1", kube.AnnLifecycle: kube.StateDeleted}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg0/pvc-uid-1"}}}}
	err := New(fake.NewClientset(), Config{Timeout: 5 * time.Second}).Delete(context.Background(), pv)
	var ignored *controller.IgnoredError
	require.ErrorAs(t, err, &ignored)
	assert.Contains(t, ignored.Reason, "already deleted")

	// Still there (answered): no error, nothing ignored.
	client := fake.NewClientset(pv.DeepCopy())
	require.NoError(t, New(client, Config{Timeout: 5 * time.Second}).Delete(context.Background(), pv))
}

func TestCheckName(t *testing.T) {
	for name, ok := range map[string]bool{
		kube.DefaultProvisioner:  true,
		"lvm":                    true,
		"example.com/lvm":        false, // a valid StorageClass provisioner, not a CSIDriver name
		"LVM.example.com":        false,
		"":                       false,
		strings.Repeat("a", 254): false,
	} {
		err := CheckName(name)
		if ok {
			assert.NoError(t, err, name)
		} else {
			assert.Error(t, err, name)
		}
	}
}

// With a Node cache, Provision reads the selected node from it: no round
// trip to the API server before the request. A Node the cache does not hold,
// or holds without the hostname label, is read from the API server.
func TestProvisionReadsTheNodeCache(t *testing.T) {
	// wipe: none: the cached Nodes carry no capacity annotation.
	sc := class(storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0", "wipe": "none"})
	for _, tc := range []struct {
		name   string
		cached *corev1.Node
		gets   int
	}{
		{"cached", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{HostnameLabel: "host-a"}}}, 0},
		{"not cached", nil, 1},
		{"cached without the label", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, corev1.PersistentVolumeFilesystem, created)
			indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			if tc.cached != nil {
				require.NoError(t, indexer.Add(tc.cached))
			}
			p := New(w.client, Config{Timeout: 30 * time.Second, Nodes: corelisters.NewNodeLister(indexer)})
			pv, _, err := p.Provision(context.Background(), controller.ProvisionOptions{StorageClass: sc, PVName: "pvc-uid-1", PVC: w.pvc, SelectedNodeName: "node-a"})
			require.NoError(t, err)
			assert.Equal(t, "host-a", pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0])
			gets := 0
			for _, a := range w.client.Actions() {
				if a.GetVerb() == "get" && a.GetResource().Resource == "nodes" {
					gets++
				}
			}
			assert.Equal(t, tc.gets, gets, "GET nodes")
		})
	}
}

// The leader's informers keep of a Node only what its controllers read.
func TestInformersTrimNodes(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{HostnameLabel: "host-a"},
		Annotations: map[string]string{"capacity": "x", "other": "y"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec:   corev1.NodeSpec{PodCIDR: "10.0.0.0/24", Taints: []corev1.Taint{{Key: corev1.TaintNodeOutOfService, Effect: corev1.TaintEffectNoExecute}}},
		Status: corev1.NodeStatus{Images: []corev1.ContainerImage{{Names: []string{"big"}}}}}
	f := NewInformers(fake.NewClientset(n), "capacity")
	nodes := f.Core().V1().Nodes().Lister()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	got, err := nodes.Get("node-a")
	require.NoError(t, err)
	assert.Equal(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{HostnameLabel: "host-a"},
		Annotations: map[string]string{"capacity": "x"}},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: corev1.TaintNodeOutOfService, Effect: corev1.TaintEffectNoExecute}}}}, got)
}

// wipe: zero (the default) is made only on a node whose agent says it
// zeroes the volume group's volumes; wipe: none anywhere, its LVs tagged so
// that the agent removes them without zeroing.
func TestProvisionWipe(t *testing.T) {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	t.Run("the agent zeroes", func(t *testing.T) {
		w := newWorld(t, corev1.PersistentVolumeFilesystem, created)
		_, state, err := provision(t, w, class(wffc, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"}))
		require.NoError(t, err)
		assert.Equal(t, controller.ProvisioningFinished, state)
		_, spec := requested(t, w)
		assert.Empty(t, spec.Tags)
	})
	t.Run("it does not", func(t *testing.T) {
		w := newWorld(t, corev1.PersistentVolumeFilesystem, created)
		node, err := w.client.CoreV1().Nodes().Get(context.Background(), "node-a", metav1.GetOptions{})
		require.NoError(t, err)
		node.Annotations[kube.DefaultCapacityAnnotation] = kube.EncodeStorageTopology([]kube.StorageCapacity{{Type: "lvm", Name: "vg0", DeviceClass: "vg0", Capacity: 1 << 40, Free: 1 << 40}})
		_, err = w.client.CoreV1().Nodes().Update(context.Background(), node, metav1.UpdateOptions{})
		require.NoError(t, err)
		_, state, err := provision(t, w, class(wffc, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0"}))
		require.ErrorIs(t, err, ErrNoWipe)
		assert.ErrorContains(t, err, `StorageClass lvm on node node-a: the class asks for volumes that read zeros (wipe: zero, the default), and the node's agent does not say it makes them (no "wipe":"zero" in its entry for volume group vg0)`)
		assert.Equal(t, controller.ProvisioningReschedule, state)
		ann, _ := requested(t, w)
		assert.NotContains(t, ann, kube.AnnLifecycle, "nothing asked of that agent")

		_, state, err = provision(t, w, class(wffc, corev1.PersistentVolumeReclaimDelete, map[string]string{"volumeGroup": "vg0", "wipe": "none", "tags": "app"}))
		require.NoError(t, err)
		assert.Equal(t, controller.ProvisioningFinished, state)
		_, spec := requested(t, w)
		assert.Equal(t, []string{"app", kube.NoWipeTag}, spec.Tags)
	})
}
