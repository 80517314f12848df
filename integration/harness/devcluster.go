package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/lvm-agent/lvm-agent/kube"
)

// StartDevCluster is StartControlPlane for callers without a testing.TB: a
// TestMain that shares one control plane between tests (the in-guest suite),
// or a program (the demo's lvm-devcluster). assets holds etcd and
// kube-apiserver ("" means $KUBEBUILDER_ASSETS); the admin kubeconfig is
// written into dir. It returns when the API server answers /readyz and the
// default namespace exists, or fails after startTimeout. Stop it with
// cp.Env.Stop().
//
// Under QEMU's TCG, kube-apiserver serves after 23-50 s but is ready only
// after up to ~105 s; envtest waits for /healthz and then gives the default
// namespace a fixed 5 s to appear, which a slow guest can miss. That one
// failure is not fatal here: the wait for readiness below covers it.
func StartDevCluster(assets, dir string, startTimeout time.Duration) (*ControlPlane, error) {
	deadline := time.Now().Add(startTimeout)
	env, err := newEnvironment(assets, startTimeout)
	if err != nil {
		return nil, err
	}
	api := env.ControlPlane.GetAPIServer().Configure()
	// Under TCG on a busy machine the RBAC bootstrap (a post-start hook
	// that writes ~100 roles through the loopback client) alone took more
	// than 4 minutes, and /healthz, which envtest polls anonymously, fails
	// until it is done. ABAC with an allow-all policy has no such hook.
	// (AlwaysAllow would do, but it turns anonymous requests away, envtest's
	// health check included.) Priority and fairness off: one bootstrap less.
	policy := filepath.Join(dir, "abac-allow-all.jsonl")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(policy, []byte(abacAllowAll), 0o600); err != nil {
		return nil, err
	}
	api.Set("authorization-mode", "ABAC")
	api.Set("authorization-policy-file", policy)
	api.Set("enable-priority-and-fairness", "false")
	return startEnvironment(env, dir, deadline)
}

// newEnvironment is an envtest environment of the etcd and kube-apiserver
// in assets ("" means $KUBEBUILDER_ASSETS), its API server set up for a
// loopback-only host.
func newEnvironment(assets string, startTimeout time.Duration) (*envtest.Environment, error) {
	if assets == "" {
		assets = os.Getenv("KUBEBUILDER_ASSETS")
	}
	for _, bin := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return nil, fmt.Errorf("assets directory %q has no %s (run scripts/kube-assets.sh): %w", assets, bin, err)
		}
	}
	env := &envtest.Environment{BinaryAssetsDirectory: assets, ControlPlaneStartTimeout: startTimeout, ControlPlaneStopTimeout: time.Minute}
	loopbackOnly(env.ControlPlane.GetAPIServer().Configure())
	return env, nil
}

// loopbackOnly sets up a kube-apiserver for a loopback-only host: it needs
// no endpoint reconciler (notes/dependencies.md), and an explicit advertise
// address: with no default route (the test VM has no NIC) kube-apiserver
// exits at once with "Unable to find suitable network address", and
// envtest retries 5 times before it says so.
func loopbackOnly(args *envtest.Arguments) {
	args.Set("endpoint-reconciler-type", "none")
	args.Set("advertise-address", "127.0.0.1")
}

// startEnvironment starts env, waits until it is ready (or deadline), and
// writes an admin kubeconfig into dir; on failure it stops env.
func startEnvironment(env *envtest.Environment, dir string, deadline time.Time) (*ControlPlane, error) {
	if _, err := env.Start(); err != nil && env.Config == nil {
		// The processes did not come up. (With env.Config set they did, and
		// only the default namespace came late: WaitReady covers that.)
		_ = env.Stop()
		return nil, fmt.Errorf("start etcd + kube-apiserver: %w", err)
	}
	cp, err := finishDevCluster(env, dir, deadline)
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	return cp, nil
}

// abacAllowAll lets every request through: authenticated users, and
// anonymous ones (health checks).
const abacAllowAll = `{"apiVersion":"abac.authorization.kubernetes.io/v1beta1","kind":"Policy","spec":{"user":"*","namespace":"*","resource":"*","apiGroup":"*","nonResourcePath":"*"}}
{"apiVersion":"abac.authorization.kubernetes.io/v1beta1","kind":"Policy","spec":{"group":"system:unauthenticated","namespace":"*","resource":"*","apiGroup":"*","nonResourcePath":"*","readonly":true}}
`

func finishDevCluster(env *envtest.Environment, dir string, deadline time.Time) (*ControlPlane, error) {
	cfg := env.Config
	cfg.QPS, cfg.Burst = 500, 1000
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := WaitReady(ctx, client); err != nil {
		return nil, err
	}
	user, err := env.AddUser(envtest.User{Name: "lvm-agent-test", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("admin user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("admin kubeconfig: %w", err)
	}
	// Written whole or not at all: the demo waits for this file to appear.
	path := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(path+".tmp", kc, 0o600); err != nil {
		return nil, err
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return nil, err
	}
	return &ControlPlane{Env: env, Config: cfg, Client: client, Kubeconfig: path}, nil
}

// WaitReady polls until the API server answers /readyz with 200 and the
// default namespace exists (a lone apiserver creates it itself, late under TCG).
func WaitReady(ctx context.Context, c kubernetes.Interface) error {
	var last error
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if _, last = c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); last != nil {
			return false, nil
		}
		if _, last = c.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{}); last != nil {
			return false, nil
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("kube-apiserver not ready: %w (last: %v)", err, last)
	}
	return nil
}

// NewPVC is the PVC that PVC creates: selected-node is node, as a scheduler
// would set it.
func NewPVC(ns, name, node string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{kube.AnnSelectedNode: node}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
}

// NewPV is a CSI PV of driver pinned to node by node affinity and bound to
// claim (nil: unbound), as a CSI provisioner makes it; spec, when not empty,
// is the volume.spec annotation ("<vg>/<lv>").
func NewPV(name, node, driver string, claim *corev1.PersistentVolumeClaim, spec string) *corev1.PersistentVolume {
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver, VolumeHandle: name}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
	if claim != nil {
		pv.Spec.ClaimRef = &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
			Namespace: claim.Namespace, Name: claim.Name, UID: claim.UID}
		if q, ok := claim.Spec.Resources.Requests[corev1.ResourceStorage]; ok {
			pv.Spec.Capacity[corev1.ResourceStorage] = q
		}
	}
	if spec != "" {
		pv.Annotations = map[string]string{kube.AnnSpec: spec}
	}
	return pv
}
