package integration

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

// adminGroupPatch sets the admin group of deploy/base/admission.yaml.
const adminGroupPatch = `[{"op": "test", "path": "/spec/variables/2/name", "value": "adminGroup"},
 {"op": "replace", "path": "/spec/variables/2/expression", "value": "'storage-admins'"}]`

const (
	agentUser       = "system:serviceaccount:lvm-agent:lvm-agent"
	provisionerUser = "system:serviceaccount:lvm-agent:lvm-agent-provisioner"
	adminGroup      = "lvm-agent:admins"
	// What the API server puts before every message of ours.
	deniedProtocol = "ValidatingAdmissionPolicy 'lvm-agent-protocol' with binding 'lvm-agent-protocol' denied request: "
	deniedNode     = "ValidatingAdmissionPolicy 'lvm-agent-node' with binding 'lvm-agent-node' denied request: "
)

// deploy/base/admission.yaml on a real API server: each identity may write
// exactly its part of the protocol, and the refusals say so. The policies
// bind every user, so this test runs a control plane of its own.
func TestAdmission(t *testing.T) {
	ctx := context.Background()
	acp := harness.StartControlPlaneWith(t, 2*time.Minute, harness.Options{Authorization: "RBAC"})
	admin := acp.Client
	applyRBAC(t, admin, rbacManifest) // the agent's ServiceAccount and role
	_, err := admin.CoreV1().ServiceAccounts("lvm-agent").Create(ctx,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "lvm-agent-provisioner"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	// RBAC lets every authenticated user write PVCs, PVs and Nodes: what
	// is refused below is refused by admission.
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "admission-test"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"persistentvolumeclaims", "persistentvolumes", "nodes",
			"persistentvolumeclaims/status", "persistentvolumes/status", "nodes/status"},
			Verbs: []string{"get", "list", "watch", "create", "update", "patch"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "admission-test"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "admission-test"},
		Subjects:   []rbacv1.Subject{{Kind: "Group", APIGroup: rbacv1.GroupName, Name: "system:authenticated"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	serverSideApply(t, acp, readManifests(t, filepath.Join(deployDir(), "base", "admission.yaml")))

	for _, n := range []string{"adm-node-a", "adm-node-b"} {
		_, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	alice := impersonate(t, acp, "alice")
	bob := impersonate(t, acp, "bob", adminGroup)
	_, provisioner := serviceAccountKubeconfig(t, acp, "lvm-agent", "lvm-agent-provisioner", nil)
	agentKubeconfig, agentOnA := serviceAccountKubeconfig(t, acp, "lvm-agent", "lvm-agent", agentPod(t, admin, "adm-node-a"))
	_, unboundAgent := serviceAccountKubeconfig(t, acp, "lvm-agent", "lvm-agent", nil)

	// Each policy takes effect a moment after it is stored, independently
	// of the other (on a loaded host, seconds apart): probe both.
	harness.PVC(t, admin, "default", "adm-probe", "adm-node-a")
	dryRun := metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := alice.CoreV1().PersistentVolumeClaims("default").Patch(ctx, "adm-probe", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"`+kube.AnnLifecycle+`":"creating"}}}`), dryRun)
		return apierrors.IsForbidden(err), nil
	}), "the protocol policy never refused a request")
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := agentOnA.CoreV1().Nodes().Patch(ctx, "adm-node-b", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"example.com/probe":"1"}}}`), dryRun)
		return apierrors.IsForbidden(err), nil
	}), "the node policy never refused a request")

	request := kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreating, kube.AnnSpec: `{"volumeGroup":"vg1","name":"x","size":4096}`})
	created := kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnDevice: "/dev/vg1/x"}).Remove(kube.AnnError, kube.AnnReason)
	pvcPatch := func(c kubernetes.Interface, name string, ann kube.Change) error {
		_, err := kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(c), "default", name, "", ann, nil)
		return err
	}
	pvPatch := func(c kubernetes.Interface, name string, ann kube.Change) error {
		_, err := kube.UpdatePvWithAnnotations(ctx, clientset.Wrap(c), name, "", ann, nil)
		return err
	}
	// The same annotations written through the status subresource, which
	// keeps metadata changes too.
	statusBody := func(ann kube.Change) []byte {
		b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
		require.NoError(t, err)
		return b
	}
	pvcStatus := func(c kubernetes.Interface, name string, ann kube.Change) error {
		_, err := c.CoreV1().PersistentVolumeClaims("default").Patch(ctx, name, types.MergePatchType, statusBody(ann), metav1.PatchOptions{}, "status")
		return err
	}
	pvStatus := func(c kubernetes.Interface, name string, ann kube.Change) error {
		_, err := c.CoreV1().PersistentVolumes().Patch(ctx, name, types.MergePatchType, statusBody(ann), metav1.PatchOptions{}, "status")
		return err
	}
	nodeStatus := func(c kubernetes.Interface, name string, ann kube.Change) error {
		_, err := c.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, statusBody(ann), metav1.PatchOptions{}, "status")
		return err
	}
	kcm := impersonate(t, acp, "system:kube-controller-manager")
	harness.PVC(t, admin, "default", "adm-vol", "adm-node-a")
	pvc, err := admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "adm-vol", metav1.GetOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().PersistentVolumes().Create(ctx, harness.NewPV("adm-pv", "adm-node-a", kube.DefaultDriver, pvc, ""), metav1.CreateOptions{})
	require.NoError(t, err)

	// In order: each step starts from the state the one before left.
	for _, tc := range []struct {
		name string
		call func() error
		want string // the message a user sees; "" is allowed
	}{
		{"a user asks for a volume on their PVC", func() error { return pvcPatch(alice, "adm-vol", request) },
			deniedProtocol + "only the lvm-agent provisioner (" + provisionerUser + ") or members of group " + adminGroup +
				" may ask for volumes: alice may not write volume.lifecycle=creating, volume.spec"},
		{"a user asks through the PVC's status subresource", func() error { return pvcStatus(alice, "adm-vol", request) },
			deniedProtocol + "only the lvm-agent provisioner (" + provisionerUser + ") or members of group " + adminGroup +
				" may ask for volumes: alice may not write volume.lifecycle=creating, volume.spec"},
		{"a user creates a PVC that already asks", func() error {
			p := harness.NewPVC("default", "adm-new", "adm-node-a")
			p.Annotations[kube.AnnLifecycle] = kube.StateCreating
			_, err := alice.CoreV1().PersistentVolumeClaims("default").Create(ctx, p, metav1.CreateOptions{})
			return err
		}, deniedProtocol + "only the lvm-agent provisioner (" + provisionerUser + ") or members of group " + adminGroup +
			" may ask for volumes: alice may not write volume.lifecycle=creating"},
		{"the provisioner asks", func() error { return pvcPatch(provisioner, "adm-vol", request) }, ""},
		{"the agent asks", func() error {
			return pvcPatch(agentOnA, "adm-vol", kube.Set(map[string]string{kube.AnnSpec: `{"volumeGroup":"vg1","name":"y","size":4096}`}))
		}, deniedProtocol + "only the lvm-agent provisioner (" + provisionerUser + ") or members of group " + adminGroup +
			" may ask for volumes: " + agentUser + " may not write volume.spec"},
		{"a user answers", func() error { return pvcPatch(alice, "adm-vol", created) },
			deniedProtocol + "only the lvm-agent agent (" + agentUser + ") answers volume requests: alice may not write volume.lifecycle=created, volume.device"},
		{"a user answers through the status subresource", func() error { return pvcStatus(alice, "adm-vol", created) },
			deniedProtocol + "only the lvm-agent agent (" + agentUser + ") answers volume requests: alice may not write volume.lifecycle=created, volume.device"},
		{"the agent asks through the status subresource", func() error {
			return pvcStatus(agentOnA, "adm-vol", kube.Set(map[string]string{kube.AnnSpec: `{"volumeGroup":"vg1","name":"y","size":4096}`}))
		}, deniedProtocol + "only the lvm-agent provisioner (" + provisionerUser + ") or members of group " + adminGroup +
			" may ask for volumes: " + agentUser + " may not write volume.spec"},
		{"the agent answers", func() error { return pvcPatch(agentOnA, "adm-vol", created) }, ""},
		{"the agent writes a request value", func() error {
			return pvcPatch(agentOnA, "adm-vol", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreating}))
		}, deniedProtocol + "only the lvm-agent provisioner (" + provisionerUser + ") or members of group " + adminGroup +
			" may ask for volumes: " + agentUser + " may not write volume.lifecycle=creating"},
		{"a user removes an answer", func() error { return pvcPatch(alice, "adm-vol", kube.Change{}.Remove(kube.AnnDevice)) },
			deniedProtocol + "only the lvm-agent agent, the provisioner or members of group " + adminGroup +
				" may remove an answer: alice may not remove volume.device"},
		{"a user removes the lifecycle", func() error { return pvcPatch(alice, "adm-vol", kube.Change{}.Remove(kube.AnnLifecycle)) },
			deniedProtocol + "only the lvm-agent provisioner (" + provisionerUser + ") or members of group " + adminGroup +
				" may ask for volumes: alice may not write volume.lifecycle=(removed)"},
		{"the agent answers failed", func() error {
			return pvcPatch(agentOnA, "adm-vol", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateFailed,
				kube.AnnReason: kube.ReasonInsufficientCapacity, kube.AnnError: "no space"}))
		}, ""},
		{"an admin asks again and clears the answer", func() error {
			return pvcPatch(bob, "adm-vol", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreating}).Remove(kube.AnnReason, kube.AnnError, kube.AnnDevice))
		}, ""},
		{"a user's own labels and annotations", func() error {
			_, err := kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(alice), "default", "adm-vol", "",
				kube.Set(map[string]string{"example.com/note": "mine"}), kube.Set(map[string]string{"app": "db"}))
			return err
		}, ""},
		{"the scheduler's selected-node", func() error {
			return pvcPatch(impersonate(t, acp, "system:kube-scheduler"), "adm-vol", kube.Set(map[string]string{kube.AnnSelectedNode: "adm-node-b"}))
		}, ""},
		{"a finalizer", func() error {
			_, err := alice.CoreV1().PersistentVolumeClaims("default").Patch(ctx, "adm-vol", types.MergePatchType,
				[]byte(`{"metadata":{"finalizers":["example.com/keep"]}}`), metav1.PatchOptions{})
			return err
		}, ""},
		{"binding, as kube-controller-manager does it (update of the whole PVC)", func() error {
			p, err := kcm.CoreV1().PersistentVolumeClaims("default").Get(ctx, "adm-vol", metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Spec.VolumeName = "adm-pv"
			p.Annotations["pv.kubernetes.io/bind-completed"] = "yes"
			_, err = kcm.CoreV1().PersistentVolumeClaims("default").Update(ctx, p, metav1.UpdateOptions{})
			return err
		}, ""},
		{"the PVC's phase, as kube-controller-manager writes it (update of its status)", func() error {
			p, err := kcm.CoreV1().PersistentVolumeClaims("default").Get(ctx, "adm-vol", metav1.GetOptions{})
			if err != nil {
				return err
			}
			p.Status.Phase = corev1.ClaimBound
			_, err = kcm.CoreV1().PersistentVolumeClaims("default").UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		}, ""},
		{"a user asks to grow a PV", func() error {
			return pvPatch(alice, "adm-pv", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateExpanding, kube.AnnSpec: `{"volumeGroup":"vg1","name":"x","size":8192}`}))
		}, deniedProtocol + "only the lvm-agent provisioner (" + provisionerUser + ") or members of group " + adminGroup +
			" may ask for volumes: alice may not write volume.lifecycle=expanding, volume.spec"},
		{"the provisioner asks to grow a PV", func() error {
			return pvPatch(provisioner, "adm-pv", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateExpanding, kube.AnnSpec: `{"volumeGroup":"vg1","name":"x","size":8192}`}))
		}, ""},
		{"a user answers a grow", func() error {
			return pvPatch(alice, "adm-pv", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateExpanded, kube.AnnSize: "8192"}))
		}, deniedProtocol + "only the lvm-agent agent (" + agentUser + ") answers volume requests: alice may not write volume.lifecycle=expanded, volume.size"},
		{"the agent answers a grow", func() error {
			return pvPatch(agentOnA, "adm-pv", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateExpanded, kube.AnnSize: "8192"}))
		}, ""},
		{"a user removes the grow's size", func() error { return pvPatch(alice, "adm-pv", kube.Change{}.Remove(kube.AnnSize)) },
			deniedProtocol + "only the lvm-agent agent, the provisioner or members of group " + adminGroup +
				" may remove an answer: alice may not remove volume.size"},
		{"a user asks to delete a PV", func() error {
			return pvPatch(alice, "adm-pv", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "vg1/x"}))
		}, deniedProtocol + "only the lvm-agent provisioner (" + provisionerUser + ") or members of group " + adminGroup +
			" may ask for volumes: alice may not write volume.lifecycle=deleting, volume.spec"},
		{"a user asks to delete a PV through its status subresource", func() error {
			return pvStatus(alice, "adm-pv", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "vg1/x"}))
		}, deniedProtocol + "only the lvm-agent provisioner (" + provisionerUser + ") or members of group " + adminGroup +
			" may ask for volumes: alice may not write volume.lifecycle=deleting, volume.spec"},
		{"the provisioner asks to delete a PV", func() error {
			return pvPatch(provisioner, "adm-pv", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "vg1/x"}))
		}, ""},
		{"a user answers a delete", func() error {
			return pvPatch(alice, "adm-pv", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateDeleted}))
		}, deniedProtocol + "only the lvm-agent agent (" + agentUser + ") answers volume requests: alice may not write volume.lifecycle=deleted"},
		{"a user answers a delete through the status subresource", func() error {
			return pvStatus(alice, "adm-pv", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateDeleted}))
		}, deniedProtocol + "only the lvm-agent agent (" + agentUser + ") answers volume requests: alice may not write volume.lifecycle=deleted"},
		{"the agent answers a delete", func() error {
			return pvPatch(agentOnA, "adm-pv", kube.Set(map[string]string{kube.AnnLifecycle: kube.StateDeleted}))
		}, ""},
		{"the PV's phase, as the PV controller writes it (update of its status)", func() error {
			pv, err := kcm.CoreV1().PersistentVolumes().Get(ctx, "adm-pv", metav1.GetOptions{})
			if err != nil {
				return err
			}
			pv.Status.Phase = corev1.VolumeReleased
			_, err = kcm.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{})
			return err
		}, ""},
		{"the agent writes its own Node", func() error {
			_, err := kube.UpdateNodeWithAnnotations(ctx, clientset.Wrap(agentOnA), "adm-node-a", "", kube.Set(map[string]string{"example.com/capacity": "1"}))
			return err
		}, ""},
		{"the agent writes another Node", func() error {
			_, err := kube.UpdateNodeWithAnnotations(ctx, clientset.Wrap(agentOnA), "adm-node-b", "", kube.Set(map[string]string{"example.com/capacity": "1"}))
			return err
		}, deniedNode + "the lvm-agent agent may update only the Node it runs on: " + agentUser + " runs on Node adm-node-a and may not update Node adm-node-b"},
		{"the agent writes another Node through its status subresource", func() error {
			return nodeStatus(agentOnA, "adm-node-b", kube.Set(map[string]string{"example.com/capacity": "1"}))
		}, deniedNode + "the lvm-agent agent may update only the Node it runs on: " + agentUser + " runs on Node adm-node-a and may not update Node adm-node-b"},
		{"the agent writes its own Node through its status subresource", func() error {
			return nodeStatus(agentOnA, "adm-node-a", kube.Set(map[string]string{"example.com/status": "1"}))
		}, ""},
		{"a kubelet updates its Node's status", func() error {
			kubelet := impersonate(t, acp, "system:node:adm-node-b", "system:nodes")
			n, err := kubelet.CoreV1().Nodes().Get(ctx, "adm-node-b", metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}}
			_, err = kubelet.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
			return err
		}, ""},
		{"the agent with a token bound to no Pod writes a Node", func() error {
			_, err := kube.UpdateNodeWithAnnotations(ctx, clientset.Wrap(unboundAgent), "adm-node-a", "", kube.Set(map[string]string{"example.com/capacity": "2"}))
			return err
		}, deniedNode + "the lvm-agent agent may update only the Node it runs on: " + agentUser + " has a token bound to no Node (not a Pod's token) and may not update Node adm-node-a"},
		{"another service account writes a Node", func() error {
			_, err := kube.UpdateNodeWithAnnotations(ctx, clientset.Wrap(provisioner), "adm-node-b", "", kube.Set(map[string]string{"example.com/other": "1"}))
			return err
		}, ""},
	} {
		err := tc.call()
		if tc.want == "" {
			assert.NoError(t, err, tc.name)
			continue
		}
		var status *apierrors.StatusError
		if assert.True(t, errors.As(err, &status), "%s: want a refusal, got %v", tc.name, err) {
			assert.Equal(t, int32(403), status.ErrStatus.Code, tc.name)
			_, msg, found := strings.Cut(status.ErrStatus.Message, " is forbidden: ")
			assert.True(t, found, "%s: %s", tc.name, status.ErrStatus.Message)
			assert.Equal(t, tc.want, msg, tc.name)
		}
	}

	// What the steps left: the last allowed request and answer, nothing of
	// the refused ones.
	got, err := admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "adm-vol", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.StateCreating, got.Annotations[kube.AnnLifecycle])
	assert.NotContains(t, got.Annotations, kube.AnnDevice)
	assert.Equal(t, `{"volumeGroup":"vg1","name":"x","size":4096}`, got.Annotations[kube.AnnSpec])
	pv, err := admin.CoreV1().PersistentVolumes().Get(ctx, "adm-pv", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, kube.StateDeleted, pv.Annotations[kube.AnnLifecycle])
	assert.Equal(t, corev1.VolumeReleased, pv.Status.Phase, "the PV controller's status write went through")
	nodeB, err := admin.CoreV1().Nodes().Get(ctx, "adm-node-b", metav1.GetOptions{})
	require.NoError(t, err)
	assert.NotContains(t, nodeB.Annotations, "example.com/capacity")

	// The real agent, with its Pod's token, and the provisioner's library:
	// a create, a delete and the Node's capacity under the policies, and not
	// one refusal in the agent's log.
	lvm := lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 1 << 30})
	_, socket := harness.ServeLVMD(t, lvm)
	agentProc := harness.StartAgent(t, agentBin, "--node-name", "adm-node-a", "--kubeconfig", agentKubeconfig,
		"--lvmd-socket", socket, "--metrics-address", "", "--v", "2")
	claim := harness.PVC(t, admin, "default", "adm-real", "adm-node-a")
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, kube.CreateVolumeWithAnnotations(waitCtx, clientset.Wrap(provisioner), "default", "adm-real", spec("adm-real", "4Mi"), nil))
	_, err = admin.CoreV1().PersistentVolumes().Create(ctx, harness.NewPV("adm-real-pv", "adm-node-a", kube.DefaultDriver, claim, ""), metav1.CreateOptions{})
	require.NoError(t, err)
	// As in a cluster: the claim is gone before its volume is deleted (no
	// controller here removes the protection finalizer).
	require.NoError(t, admin.CoreV1().PersistentVolumeClaims("default").Delete(ctx, "adm-real", metav1.DeleteOptions{}))
	_, err = admin.CoreV1().PersistentVolumeClaims("default").Patch(ctx, "adm-real", types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	if !apierrors.IsNotFound(err) {
		require.NoError(t, err)
	}
	require.NoError(t, kube.DeleteVolumeWithAnnotations(waitCtx, clientset.Wrap(provisioner), "adm-real-pv", "vg1", "adm-real", nil))
	lvs, err := lvm.List("vg1")
	require.NoError(t, err)
	assert.Empty(t, lvs)
	require.Eventually(t, func() bool {
		node, err := admin.CoreV1().Nodes().Get(ctx, "adm-node-a", metav1.GetOptions{})
		return err == nil && node.Annotations[kube.DefaultCapacityAnnotation] != ""
	}, 30*time.Second, 50*time.Millisecond, "the agent writes its Node's capacity")
	for _, line := range strings.Split(agentProc.Output(), "\n") {
		assert.NotContains(t, strings.ToLower(line), "forbidden", "the agent was refused something")
	}

	// The admin group is one literal, changed as a kustomize JSON 6902
	// patch would (docs/install.md shows it): the old group may no
	// longer ask, the new one may.
	dyn, err := dynamic.NewForConfig(acp.Config)
	require.NoError(t, err)
	_, err = dyn.Resource(schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingadmissionpolicies"}).
		Patch(ctx, "lvm-agent-protocol", types.JSONPatchType, []byte(adminGroupPatch), metav1.PatchOptions{})
	require.NoError(t, err)
	carol := impersonate(t, acp, "carol", "storage-admins")
	ask := func(c kubernetes.Interface) error {
		_, err := c.CoreV1().PersistentVolumeClaims("default").Patch(ctx, "adm-probe", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"`+kube.AnnLifecycle+`":"creating"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	require.Eventually(t, func() bool { return ask(carol) == nil }, time.Minute, 200*time.Millisecond, "storage-admins may ask")
	err = ask(bob)
	require.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.Contains(t, err.Error(), "or members of group storage-admins may ask for volumes: bob may not write volume.lifecycle=creating")
}

// impersonate is a client of the control plane's admin acting as user in
// groups (and system:authenticated, as an authenticator adds it).
func impersonate(t *testing.T, c *harness.ControlPlane, user string, groups ...string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(c.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: append(groups, "system:authenticated")}
	client, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return client
}

// agentPod makes a Pod of the agent's ServiceAccount bound to node, as the
// DaemonSet's Pod is once scheduled, for a token bound to it.
func agentPod(t *testing.T, c kubernetes.Interface, node string) *corev1.Pod {
	t.Helper()
	pod, err := c.CoreV1().Pods("lvm-agent").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "lvm-agent-" + node},
		Spec: corev1.PodSpec{ServiceAccountName: "lvm-agent", NodeName: node,
			Containers: []corev1.Container{{Name: "lvm-agent", Image: "ghcr.io/lvm-agent/lvm-agent:dev"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	return pod
}
