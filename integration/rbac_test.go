package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
	"github.com/lvm-agent/lvm-agent/lvmbackend/lvmdfake"
)

const rbacManifest = "../deploy/base/rbac.yaml"

// The role is the least the agent needs: exactly these rules. Adding a verb
// should be a decision, made here too.
func TestRBACRoleIsMinimal(t *testing.T) {
	objs := readRBAC(t, rbacManifest)
	var role *rbacv1.ClusterRole
	for _, o := range objs {
		if r, ok := o.(*rbacv1.ClusterRole); ok {
			role = r
		}
	}
	require.NotNil(t, role, "%s has a ClusterRole", rbacManifest)
	got := map[string][]string{}
	for _, r := range role.Rules {
		assert.Empty(t, r.ResourceNames, "rule %v", r)
		assert.Empty(t, r.NonResourceURLs, "rule %v", r)
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				key := g + "/" + res
				got[key] = append(got[key], r.Verbs...)
				sort.Strings(got[key])
			}
		}
	}
	assert.Equal(t, map[string][]string{
		"/persistentvolumeclaims": {"get", "list", "patch", "watch"},
		"/persistentvolumes":      {"get", "list", "patch", "watch"},
		"/events":                 {"create", "patch"},
		"/nodes":                  {"get", "patch"},
	}, got)
	// In its namespace: reading the labeller's Lease, that one only.
	var ns *rbacv1.Role
	for _, o := range objs {
		if r, ok := o.(*rbacv1.Role); ok && r.Name == "lvm-agent" {
			ns = r
		}
	}
	require.NotNil(t, ns, "%s has a Role lvm-agent", rbacManifest)
	assert.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"},
		ResourceNames: []string{kube.LabellerLeaseName}, Verbs: []string{"get", "list", "watch"}}}, ns.Rules)
	// And the encryption keys: one get at a time, in its namespace only.
	var keys *rbacv1.Role
	for _, o := range objs {
		if r, ok := o.(*rbacv1.Role); ok && r.Name == "lvm-agent-keys" {
			keys = r
		}
	}
	require.NotNil(t, keys, "%s has a Role lvm-agent-keys", rbacManifest)
	assert.Equal(t, kube.DefaultKeyNamespace, keys.Namespace)
	assert.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}}}, keys.Rules)
}

// The real agent, authenticated as the ServiceAccount of deploy/base (a
// token from the TokenRequest API, as a pod gets it), answers a create and a
// delete, finds an unlabelled request by its sweep, writes its node's
// capacity and collects an orphan LV, without one refusal; and the same
// identity is refused anything beyond its role. The shared control plane
// authorizes everything, so this test runs its own, with RBAC.
func TestRBAC(t *testing.T) {
	ctx := context.Background()
	rcp := harness.StartControlPlaneWith(t, 2*time.Minute, harness.Options{Authorization: "RBAC"})
	admin := rcp.Client
	applyRBAC(t, admin, rbacManifest)
	kubeconfig, saClient := serviceAccountKubeconfig(t, rcp, "lvm-agent", "lvm-agent", nil)

	nodeName := "node-rbac"
	_, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{})
	require.NoError(t, err)
	lvm := lvmdfake.NewLVM(lvmdfake.Class{Name: "vg1", SizeBytes: 1 << 30})
	_, socket := harness.ServeLVMD(t, lvm)
	// The default watch mode, with every optional part on.
	agentProc := harness.StartAgent(t, agentBin, "--node-name", nodeName, "--kubeconfig", kubeconfig,
		"--lvmd-socket", socket, "--metrics-address", "", "--v", "2",
		"--sweep-interval", "500ms", "--relist-spread", "0", "--orphan-gc-interval", "300ms")
	lvNames := func() []string {
		lvs, err := lvm.List("vg1")
		require.NoError(t, err)
		out := []string{}
		for _, lv := range lvs {
			out = append(out, lv.Name)
		}
		return out
	}

	t.Run("create and delete", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		pvc := harness.PVC(t, admin, "default", "rbac-vol", nodeName)
		require.NoError(t, kube.CreateVolumeWithAnnotations(ctx, clientset.Wrap(admin), "default", "rbac-vol", spec("rbac-vol", "4Mi"), nil))
		assert.Equal(t, []string{"rbac-vol"}, lvNames())
		_, err := admin.CoreV1().PersistentVolumes().Create(ctx, harness.NewPV("rbac-pv", nodeName, kube.DefaultDriver, pvc, ""), metav1.CreateOptions{})
		require.NoError(t, err)
		// The agent reads the claim (its role may get PVCs): still there, refused.
		require.ErrorIs(t, kube.DeleteVolumeWithAnnotations(ctx, clientset.Wrap(admin), "rbac-pv", "vg1", "rbac-vol", nil), kube.ErrClaimInUse)
		harness.DeleteClaim(t, admin, pvc)
		require.NoError(t, kube.DeleteVolumeWithAnnotations(ctx, clientset.Wrap(admin), "rbac-pv", "vg1", "rbac-vol", nil))
		assert.Empty(t, lvNames())
	})

	// No labeller holds its Lease (read under the agent's Role): the agent
	// watches the unlabelled objects itself.
	t.Run("unlabelled request found by its watch", func(t *testing.T) {
		rawRequest(t, admin, "default", "rbac-unlabelled", nodeName, `{"volumeGroup":"vg1","name":"rbac-unlabelled","size":4096}`, false)
		ann := harness.WaitFor(t, 30*time.Second, func(ctx context.Context) (metav1.Object, error) {
			return admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "rbac-unlabelled", metav1.GetOptions{})
		}, func(a map[string]string) bool { return a[kube.AnnLifecycle] != kube.StateCreating })
		assert.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], "error: %s", ann[kube.AnnError])
		// Labelled now, it leaves the watch, which reads it once more (get).
		_, err := kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(admin), "default", "rbac-unlabelled", "", nil,
			kube.Set(map[string]string{kube.LabelNode: kube.NodeLabelValue(nodeName)}))
		require.NoError(t, err)
		time.Sleep(3 * 500 * time.Millisecond) // three sweeps
	})

	t.Run("node capacity", func(t *testing.T) {
		require.Eventually(t, func() bool {
			node, err := admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
			return err == nil && node.Annotations[kube.DefaultCapacityAnnotation] != ""
		}, 30*time.Second, 50*time.Millisecond)
	})

	t.Run("encryption key read in its namespace", func(t *testing.T) {
		key := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: kube.DefaultKeyNamespace, Name: "class-key"},
			Data: map[string][]byte{kube.SecretKeyField: bytes.Repeat([]byte{7}, 32)}}
		_, err := admin.CoreV1().Secrets(key.Namespace).Create(ctx, key, metav1.CreateOptions{})
		require.NoError(t, err)
		got, err := kube.ReadKey(ctx, clientset.Wrap(saClient), kube.DefaultKeyNamespace, kube.KeyRef{Namespace: key.Namespace, Name: key.Name})
		require.NoError(t, err)
		assert.Equal(t, key.Data[kube.SecretKeyField], got.Current)
	})

	t.Run("orphan collected", func(t *testing.T) {
		_, err := lvm.Create("vg1", "rbac-orphan", 4096, []string{agent.OwnerTag("no-such-pvc")})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return !slices.Contains(lvNames(), "rbac-orphan") }, 30*time.Second, 50*time.Millisecond)
	})

	var refused []string
	for _, line := range strings.Split(agentProc.Output(), "\n") {
		if l := strings.ToLower(line); strings.Contains(l, "forbidden") || strings.Contains(l, "unauthorized") {
			refused = append(refused, line)
		}
	}
	assert.Empty(t, refused, "the agent was refused something it needs")

	t.Run("refused beyond the role", func(t *testing.T) {
		harness.PVC(t, admin, "default", "rbac-victim", "elsewhere")
		pvcs, pvs, nodes := saClient.CoreV1().PersistentVolumeClaims("default"), saClient.CoreV1().PersistentVolumes(), saClient.CoreV1().Nodes()
		merge := []byte(`{"metadata":{"labels":{"x":"y"}}}`)
		for name, call := range map[string]func() error{
			"update PVC spec": func() error {
				pvc, err := pvcs.Get(ctx, "rbac-victim", metav1.GetOptions{})
				if err != nil {
					return err
				}
				pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
				_, err = pvcs.Update(ctx, pvc, metav1.UpdateOptions{})
				return err
			},
			"delete PVC": func() error { return pvcs.Delete(ctx, "rbac-victim", metav1.DeleteOptions{}) },
			"create PVC": func() error {
				_, err := pvcs.Create(ctx, harness.NewPVC("default", "rbac-new", "x"), metav1.CreateOptions{})
				return err
			},
			"delete PV": func() error { return pvs.Delete(ctx, "rbac-pv", metav1.DeleteOptions{}) },
			"create PV": func() error {
				_, err := pvs.Create(ctx, harness.NewPV("rbac-new", "x", kube.DefaultDriver, nil, ""), metav1.CreateOptions{})
				return err
			},
			"update the labeller's Lease": func() error {
				_, err := saClient.CoordinationV1().Leases("lvm-agent").Create(ctx, &coordinationv1.Lease{
					ObjectMeta: metav1.ObjectMeta{Name: kube.LabellerLeaseName, Namespace: "lvm-agent"}}, metav1.CreateOptions{})
				return err
			},
			"get another Lease": func() error {
				_, err := saClient.CoordinationV1().Leases("lvm-agent").Get(ctx, kube.DefaultProvisioner, metav1.GetOptions{})
				return err
			},
			"get secret outside the key namespace": func() error {
				_, err := saClient.CoreV1().Secrets("default").Get(ctx, "any", metav1.GetOptions{})
				return err
			},
			"list the keys": func() error {
				_, err := saClient.CoreV1().Secrets(kube.DefaultKeyNamespace).List(ctx, metav1.ListOptions{})
				return err
			},
			"list secrets": func() error {
				_, err := saClient.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
				return err
			},
			"get configmap": func() error {
				_, err := saClient.CoreV1().ConfigMaps("default").Get(ctx, "any", metav1.GetOptions{})
				return err
			},
			"patch pod": func() error {
				_, err := saClient.CoreV1().Pods("default").Patch(ctx, "any", types.MergePatchType, merge, metav1.PatchOptions{})
				return err
			},
			"list pods": func() error {
				_, err := saClient.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
				return err
			},
			"list nodes": func() error {
				_, err := nodes.List(ctx, metav1.ListOptions{})
				return err
			},
			"delete node": func() error { return nodes.Delete(ctx, nodeName, metav1.DeleteOptions{}) },
			"update node": func() error {
				node, err := nodes.Get(ctx, nodeName, metav1.GetOptions{})
				if err != nil {
					return err
				}
				node.Spec.Unschedulable = true
				_, err = nodes.Update(ctx, node, metav1.UpdateOptions{})
				return err
			},
			"delete event": func() error { return saClient.CoreV1().Events("default").Delete(ctx, "any", metav1.DeleteOptions{}) },
			"bind itself to cluster-admin": func() error {
				_, err := saClient.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
					ObjectMeta: metav1.ObjectMeta{Name: "lvm-agent-escalated"},
					RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
					Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "lvm-agent", Namespace: "lvm-agent"}},
				}, metav1.CreateOptions{})
				return err
			},
			"token for another account": func() error {
				_, err := saClient.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "default", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
				return err
			},
		} {
			err := call()
			assert.True(t, apierrors.IsForbidden(err), "%s: want Forbidden, got %v", name, err)
		}
		// The same identity may do what the agent does: the refusals above
		// are the role's, not a broken identity's.
		for _, ra := range []authorizationv1.ResourceAttributes{
			{Verb: "watch", Resource: "persistentvolumeclaims"},
			{Verb: "patch", Resource: "persistentvolumeclaims", Namespace: "default", Name: "rbac-victim"},
			{Verb: "get", Resource: "persistentvolumes", Name: "rbac-pv"},
			{Verb: "create", Resource: "events", Namespace: "default"},
			{Verb: "patch", Resource: "nodes", Name: nodeName},
		} {
			review, err := saClient.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx,
				&authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}, metav1.CreateOptions{})
			require.NoError(t, err)
			assert.True(t, review.Status.Allowed, "%+v: %s", ra, review.Status.Reason)
		}
		pvc, err := admin.CoreV1().PersistentVolumeClaims("default").Get(ctx, "rbac-victim", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "1Gi", pvc.Spec.Resources.Requests.Storage().String(), "spec untouched")
		assert.Nil(t, pvc.DeletionTimestamp)
	})
}

// readRBAC decodes the manifest strictly: a misspelt field is an error, not
// a silently dropped rule.
func readRBAC(t *testing.T, manifest string) []runtime.Object {
	t.Helper()
	raw, err := os.ReadFile(manifest)
	require.NoError(t, err)
	decoder := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(raw)))
	var out []runtime.Object
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := decoder.Decode(doc, nil, nil)
		require.NoError(t, err, "%s:\n%s", manifest, doc)
		out = append(out, obj)
	}
}

// applyRBAC creates (or updates) the manifest's objects and their namespace.
func applyRBAC(t *testing.T, c kubernetes.Interface, manifest string) {
	t.Helper()
	ctx := context.Background()
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lvm-agent"}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	for _, obj := range readRBAC(t, manifest) {
		switch o := obj.(type) {
		case *corev1.ServiceAccount:
			_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			if _, err = c.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
				_, err = c.RbacV1().ClusterRoles().Update(ctx, o, metav1.UpdateOptions{})
			}
		case *rbacv1.ClusterRoleBinding:
			if _, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
				_, err = c.RbacV1().ClusterRoleBindings().Update(ctx, o, metav1.UpdateOptions{})
			}
		case *rbacv1.Role:
			_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("%s: unexpected %T", manifest, obj)
		}
		if !apierrors.IsAlreadyExists(err) {
			require.NoError(t, err)
		}
	}
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates with a
// token of the ServiceAccount from the TokenRequest API, bound to pod when
// not nil (as the kubelet asks for a pod's projected token), and returns it
// with a client using it. It checks who the API server says the token is.
func serviceAccountKubeconfig(t *testing.T, cp *harness.ControlPlane, ns, name string, pod *corev1.Pod) (string, kubernetes.Interface) {
	t.Helper()
	spec := authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(3600))}
	if pod != nil {
		spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := cp.Client.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name,
		&authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthorityData: cp.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	cfg.Contexts["sa"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: name}
	cfg.CurrentContext = "sa"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*cfg, path))
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	require.NoError(t, err)
	client, err := kubernetes.NewForConfig(rest.CopyConfig(rc))
	require.NoError(t, err)
	// The token really is the ServiceAccount's, and the API server itself
	// names the node of a token bound to a Pod (the admission policy for
	// Nodes relies on it).
	review, err := client.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Equal(t, "system:serviceaccount:"+ns+":"+name, review.Status.UserInfo.Username)
	var node authenticationv1.ExtraValue
	if pod != nil {
		node = authenticationv1.ExtraValue{pod.Spec.NodeName}
	}
	require.Equal(t, node, review.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"])
	return path, client
}

func ptrTo[T any](v T) *T { return &v }
