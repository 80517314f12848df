package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

const provisionerRBACManifest = "../deploy/base/provisioner-rbac.yaml"

// The real provisioner, authenticated as deploy/base's ServiceAccount
// lvm-agent-provisioner, wins its Lease, publishes capacity, provisions a
// claim and deletes its released volume without one refusal; the same
// identity is refused anything beyond its role. (No scheduler or PV
// controller here: the test writes their parts of the hand-shake.)
func TestProvisionerRBAC(t *testing.T) {
	ctx := context.Background()
	rcp := harness.StartControlPlaneWith(t, 2*time.Minute, harness.Options{Authorization: "RBAC"})
	admin := rcp.Client
	applyRBAC(t, admin, provisionerRBACManifest)
	kubeconfig, saClient := serviceAccountKubeconfig(t, rcp, "lvm-agent", "lvm-agent-provisioner", nil)

	node := harness.ReadyNode(t, rcp, "node-prov", "4", "8Gi")
	lvm := lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 1 << 30})
	_, socket := harness.ServeLVMD(t, lvm)
	harness.StartAgent(t, agentBin, "--node-name", node.Name, "--kubeconfig", rcp.Kubeconfig, "--lvmd-socket", socket, "--metrics-address", "")
	proc := harness.StartAgent(t, agentBin, "provisioner", "--kubeconfig", kubeconfig, "--namespace", "lvm-agent", "--metrics-port", "0", "--health-address", "", "--v", "2")

	wffc, del := storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete
	_, err := admin.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "lvm"},
		Provisioner: kube.DefaultProvisioner, VolumeBindingMode: &wffc, ReclaimPolicy: &del, Parameters: harness.HostClass(map[string]string{"volumeGroup": "vg1"})}, metav1.CreateOptions{})
	require.NoError(t, err)

	t.Run("capacity", func(t *testing.T) {
		require.Eventually(t, func() bool {
			list, err := admin.StorageV1().CSIStorageCapacities("lvm-agent").List(ctx, metav1.ListOptions{})
			return err == nil && len(list.Items) == 1 && list.Items[0].Capacity.Value() == 1<<30
		}, 30*time.Second, 50*time.Millisecond)
	})

	t.Run("provision and delete", func(t *testing.T) {
		class := "lvm"
		pvc, err := admin.CoreV1().PersistentVolumeClaims("default").Create(ctx, &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "prov-rbac", Namespace: "default", Annotations: map[string]string{
				// The scheduler's and the PV controller's parts.
				kube.AnnSelectedNode: node.Name, "volume.kubernetes.io/storage-provisioner": kube.DefaultProvisioner}},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("8Mi")}}},
		}, metav1.CreateOptions{})
		require.NoError(t, err)
		name := "pvc-" + string(pvc.UID)
		var pv *corev1.PersistentVolume
		require.NoError(t, wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			pv, err = admin.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
			return err == nil, nil
		}), "PV %s created", name)
		lvs, err := lvm.List("vg1")
		require.NoError(t, err)
		require.Len(t, lvs, 1)
		// The claim is gone and the PV released, as the PV controller would say.
		require.NoError(t, harness.RemoveClaim(ctx, admin, "default", "prov-rbac", pv.Spec.ClaimRef.UID))
		pv.Status.Phase = corev1.VolumeReleased
		_, err = admin.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{})
		require.NoError(t, err)
		require.NoError(t, wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			p, err := admin.CoreV1().PersistentVolumes().Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			// The API server's pv-protection finalizer has no controller here.
			if err == nil && p.DeletionTimestamp != nil && len(p.Finalizers) == 1 && p.Finalizers[0] == "kubernetes.io/pv-protection" {
				_, err = admin.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			}
			return false, nil
		}), "PV %s removed", name)
		lvs, err = lvm.List("vg1")
		require.NoError(t, err)
		assert.Empty(t, lvs)
	})

	// The leader's labeller: a request of a provisioner that does not label
	// gets the node's label (the binary's code path, under the role).
	t.Run("labels an unlabelled request", func(t *testing.T) {
		harness.PVC(t, admin, "default", "prov-unlabelled", node.Name)
		_, err := kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(admin), "default", "prov-unlabelled", "",
			kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreating, kube.AnnSpec: `{"volumeGroup":"vg1","name":"prov-unl","size":4194304}`}), nil)
		require.NoError(t, err)
		require.NoError(t, wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			p, err := admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "prov-unlabelled", metav1.GetOptions{})
			return err == nil && p.Labels[kube.LabelNode] == kube.NodeLabelValue(node.Name) && p.Annotations[kube.AnnLifecycle] == kube.StateCreated, nil
		}), "labelled by the provisioner and answered")
		l, err := admin.CoordinationV1().Leases("lvm-agent").Get(ctx, kube.LabellerLeaseName, metav1.GetOptions{})
		require.NoError(t, err, "the labeller holds its Lease (under the provisioner's Role)")
		assert.NotEmpty(t, *l.Spec.HolderIdentity)
	})

	var refused []string
	for _, line := range strings.Split(proc.Output(), "\n") {
		if l := strings.ToLower(line); strings.Contains(l, "forbidden") || strings.Contains(l, "unauthorized") {
			refused = append(refused, line)
		}
	}
	assert.Empty(t, refused, "the provisioner was refused something it needs")

	t.Run("refused beyond the role", func(t *testing.T) {
		for name, call := range map[string]func() error{
			"delete a StatefulSet": func() error {
				return saClient.AppsV1().StatefulSets("default").Delete(ctx, "any", metav1.DeleteOptions{})
			},
			"create PVC": func() error {
				_, err := saClient.CoreV1().PersistentVolumeClaims("default").Create(ctx, harness.NewPVC("default", "x", "y"), metav1.CreateOptions{})
				return err
			},
			"patch node": func() error {
				_, err := saClient.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
				return err
			},
			"list secrets": func() error {
				_, err := saClient.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
				return err
			},
			"create pod": func() error {
				_, err := saClient.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: "x"}}}}, metav1.CreateOptions{})
				return err
			},
			// After a grow it lists Pods and patches one annotation: no
			// more (no watch, no delete, no status).
			"watch pods": func() error {
				_, err := saClient.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{})
				return err
			},
			"delete pod": func() error {
				return saClient.CoreV1().Pods("default").Delete(ctx, "any", metav1.DeleteOptions{})
			},
			"patch pod status": func() error {
				_, err := saClient.CoreV1().Pods("default").Patch(ctx, "any", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{}, "status")
				return err
			},
			"lease elsewhere": func() error {
				_, err := saClient.CoordinationV1().Leases("default").Get(ctx, "any", metav1.GetOptions{})
				return err
			},
			"capacity elsewhere": func() error {
				_, err := saClient.StorageV1().CSIStorageCapacities("default").List(ctx, metav1.ListOptions{})
				return err
			},
			"change a StorageClass": func() error {
				return saClient.StorageV1().StorageClasses().Delete(ctx, "lvm", metav1.DeleteOptions{})
			},
			"bind itself to cluster-admin": func() error {
				_, err := saClient.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
					ObjectMeta: metav1.ObjectMeta{Name: "prov-escalated"},
					RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
					Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "lvm-agent-provisioner", Namespace: "lvm-agent"}},
				}, metav1.CreateOptions{})
				return err
			},
		} {
			err := call()
			assert.True(t, apierrors.IsForbidden(err), "%s: want Forbidden, got %v", name, err)
		}
		for _, ra := range []authorizationv1.ResourceAttributes{
			{Verb: "patch", Resource: "persistentvolumeclaims", Namespace: "default", Name: "any"},
			{Verb: "patch", Resource: "persistentvolumeclaims", Subresource: "status", Namespace: "default", Name: "any"},
			{Verb: "create", Resource: "persistentvolumes"},
			{Verb: "list", Resource: "pods", Namespace: "default"},
			{Verb: "patch", Resource: "pods", Namespace: "default", Name: "any"},
			// The node-loss controller: a StatefulSet's claim on a lost node.
			{Verb: "delete", Resource: "persistentvolumeclaims", Namespace: "default", Name: "any"},
			{Verb: "list", Resource: "statefulsets", Group: "apps"},
			{Verb: "watch", Resource: "statefulsets", Group: "apps"},
			{Verb: "update", Resource: "leases", Group: "coordination.k8s.io", Namespace: "lvm-agent", Name: kube.DefaultProvisioner},
			{Verb: "create", Resource: "csistoragecapacities", Group: "storage.k8s.io", Namespace: "lvm-agent"},
		} {
			review, err := saClient.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
				&authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}, metav1.CreateOptions{})
			require.NoError(t, err)
			assert.True(t, review.Status.Allowed, "%+v: %s", ra, review.Status.Reason)
		}
	})
}
