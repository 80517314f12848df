package nodeloss

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/provisioner"
)

const timeout = 2 * time.Minute

func newNamespace(t *testing.T, name string) string {
	t.Helper()
	_, err := cluster.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return name
}

func storageClass(t *testing.T, name string, reclaim corev1.PersistentVolumeReclaimPolicy, params map[string]string) {
	t.Helper()
	params = harness.HostClass(params)
	mode := storagev1.VolumeBindingWaitForFirstConsumer
	_, err := cluster.Client.StorageV1().StorageClasses().Create(context.Background(), &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: kube.DefaultProvisioner,
		VolumeBindingMode: &mode, ReclaimPolicy: &reclaim, Parameters: params,
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// placement is where a Pod may go: one of nodes, preferring prefer ("": none).
func placement(nodes []string, prefer string) *corev1.Affinity {
	a := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: nodes}}}}}}}
	if prefer != "" {
		a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = []corev1.PreferredSchedulingTerm{{Weight: 100,
			Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{prefer}}}}}}
	}
	return a
}

func podSpec(affinity *corev1.Affinity, volumes ...corev1.Volume) corev1.PodSpec {
	return corev1.PodSpec{Affinity: affinity, Volumes: volumes, Containers: []corev1.Container{{Name: "app", Image: "busybox",
		Resources:    corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}},
		VolumeMounts: mounts(volumes)}}}
}

func mounts(volumes []corev1.Volume) []corev1.VolumeMount {
	var out []corev1.VolumeMount
	for _, v := range volumes {
		out = append(out, corev1.VolumeMount{Name: v.Name, MountPath: "/" + v.Name})
	}
	return out
}

func claimSpec(class string) corev1.PersistentVolumeClaimSpec {
	return corev1.PersistentVolumeClaimSpec{StorageClassName: &class,
		AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
		Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}
}

// statefulSet makes a StatefulSet of replicas (Parallel), each with a
// claim "data" of class, on nodes: one replica per node (a topology spread
// that leaves tainted nodes out), preferring prefer.
func statefulSet(t *testing.T, ns, name, class string, replicas int32, nodes []string, prefer string) {
	t.Helper()
	labels := map[string]string{"app": name}
	spec := podSpec(placement(nodes, prefer))
	spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelHostname,
		WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: labels},
		NodeTaintsPolicy: ptr(corev1.NodeInclusionPolicyHonor)}}
	spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	_, err := cluster.Client.AppsV1().StatefulSets(ns).Create(context.Background(), &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.StatefulSetSpec{Replicas: &replicas, PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:             &metav1.LabelSelector{MatchLabels: labels},
			Template:             corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{ObjectMeta: metav1.ObjectMeta{Name: "data"}, Spec: claimSpec(class)}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// claimAndPod makes a claim of class and a Pod of that name that uses it.
func claimAndPod(t *testing.T, ns, name, class string, affinity *corev1.Affinity) {
	t.Helper()
	ctx := context.Background()
	_, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: claimSpec(class)}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cluster.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: podSpec(affinity, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}})}, metav1.CreateOptions{})
	require.NoError(t, err)
}

// volume is a claim bound to a PV, with the node the PV is on.
type volume struct {
	pvc  *corev1.PersistentVolumeClaim
	pv   *corev1.PersistentVolume
	node string
}

func getClaim(ns, name string) (*corev1.PersistentVolumeClaim, error) {
	return cluster.Client.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
}

// bound says whether the claim ns/name is bound (and not the claim of UID
// not, when given), and to what.
func bound(ns, name string, not string) (volume, bool) {
	pvc, err := getClaim(ns, name)
	if err != nil || pvc.Status.Phase != corev1.ClaimBound || not != "" && string(pvc.UID) == not {
		return volume{}, false
	}
	pv, err := cluster.Client.CoreV1().PersistentVolumes().Get(context.Background(), pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return volume{}, false
	}
	return volume{pvc: pvc, pv: pv, node: pvNode(pv)}, true
}

func pvNode(pv *corev1.PersistentVolume) string {
	return pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values[0]
}

// waitBound waits for ns/name to be bound (to a claim other than UID not,
// when given).
func waitBound(t *testing.T, ns, name, not string) volume {
	t.Helper()
	var v volume
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		var ok bool
		v, ok = bound(ns, name, not)
		return ok, nil
	})
	if err != nil {
		dump(t, ns)
	}
	require.NoError(t, err, "claim %s/%s not bound", ns, name)
	return v
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		dump(t, "")
	}
	require.NoError(t, err, what)
}

// events are the events of reason on the object named name in ns.
func events(t *testing.T, ns, name, reason string) []corev1.Event {
	t.Helper()
	evs, err := cluster.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: fields.Set{
		"involvedObject.name": name, "reason": reason}.String()})
	require.NoError(t, err)
	return evs.Items
}

// waitEvent waits for a NodeLost event on ns/name of the object of UID
// uid that says each of texts, and returns its message.
func waitEvent(t *testing.T, ns, name, uid string, texts ...string) string {
	t.Helper()
	var msg string
	waitFor(t, "NodeLost event on "+ns+"/"+name+" saying "+strings.Join(texts, ", "), func() bool {
		for _, ev := range events(t, ns, name, provisioner.ReasonNodeLost) {
			if string(ev.InvolvedObject.UID) != uid {
				continue
			}
			all := true
			for _, s := range texts {
				all = all && strings.Contains(ev.Message, s)
			}
			if all {
				msg = ev.Message
				return true
			}
		}
		return false
	})
	return msg
}

// nodeLostEvents are the NodeLost events in ns.
func nodeLostEvents(t *testing.T, ns string) []string {
	t.Helper()
	evs, err := cluster.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: fields.Set{
		"reason": provisioner.ReasonNodeLost}.String()})
	require.NoError(t, err)
	var out []string
	for _, ev := range evs.Items {
		out = append(out, ev.InvolvedObject.Name+": "+ev.Message)
	}
	return out
}

// setReady sets the Node's Ready condition, as its kubelet (or, for a
// node that stopped reporting, the node lifecycle controller) would, and
// returns the Node's resourceVersion after.
func setReady(t *testing.T, name string, ready corev1.ConditionStatus) string {
	t.Helper()
	ctx := context.Background()
	var rv string
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == corev1.NodeReady {
				n.Status.Conditions[i].Status, n.Status.Conditions[i].LastTransitionTime = ready, metav1.Now()
				n.Status.Conditions[i].LastHeartbeatTime = metav1.Now()
			}
		}
		n, err = cluster.Client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		if err == nil {
			rv = n.ResourceVersion
		}
		return err
	}))
	return rv
}

// setOutOfService adds (or removes) the taint an operator sets on a node
// known to be down.
func setOutOfService(t *testing.T, name string, on bool) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := cluster.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var taints []corev1.Taint
		for _, tt := range n.Spec.Taints {
			if tt.Key != corev1.TaintNodeOutOfService {
				taints = append(taints, tt)
			}
		}
		if on {
			taints = append(taints, corev1.Taint{Key: corev1.TaintNodeOutOfService, Value: "nodeshutdown", Effect: corev1.TaintEffectNoExecute})
		}
		n.Spec.Taints = taints
		_, err = cluster.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	}))
}

func podOn(ns, name string) (uid, node string) {
	p, err := cluster.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return "", ""
	}
	return string(p.UID), p.Spec.NodeName
}

func lvNames(t *testing.T, n *node) []string {
	t.Helper()
	lvs, err := n.lvm.List("vg1")
	require.NoError(t, err)
	var out []string
	for _, lv := range lvs {
		out = append(out, lv.Name)
	}
	return out
}

// dump logs what the parts say, for a scenario that did not get where it
// should.
func dump(t *testing.T, ns string) {
	ctx := context.Background()
	if pvcs, err := cluster.Client.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pvcs.Items {
			t.Logf("claim %s/%s uid %s: %s, annotations %v, deleting %v", p.Namespace, p.Name, p.UID, p.Status.Phase, p.Annotations, p.DeletionTimestamp != nil)
		}
	}
	if pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, p := range pods.Items {
			t.Logf("pod %s/%s uid %s: node %q, deleting %v, conditions %+v", p.Namespace, p.Name, p.UID, p.Spec.NodeName, p.DeletionTimestamp != nil, p.Status.Conditions)
		}
	}
	if evs, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{}); err == nil {
		for _, e := range evs.Items {
			t.Logf("event %s %s %s: %s", e.InvolvedObject.Name, e.Type, e.Reason, e.Message)
		}
	}
	tail := func(s string) string {
		if len(s) > 30000 {
			return s[len(s)-30000:]
		}
		return s
	}
	if dir := os.Getenv("NODELOSS_DUMP_DIR"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, "provisioner.log"), []byte(prov.Output()), 0o644)
		_ = os.WriteFile(filepath.Join(dir, "controller-manager.log"), []byte(cluster.ControllerManager.Output()), 0o644)
		_ = os.WriteFile(filepath.Join(dir, "scheduler.log"), []byte(cluster.Scheduler.Output()), 0o644)
	}
	t.Logf("provisioner:\n%s", tail(prov.Output()))
	t.Logf("controller-manager:\n%s", tail(cluster.ControllerManager.Output()))
}
