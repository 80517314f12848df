package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
)

var chartDir = filepath.Join("..", "charts", "lvm-agent")

// helm is Helm's own binary: $LVM_AGENT_HELM (make test-integration sets
// it), else what scripts/helm.sh builds into the cache.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	bin := os.Getenv("LVM_AGENT_HELM")
	if bin == "" {
		out, err := exec.Command(filepath.Join("..", "scripts", "helm.sh")).Output()
		require.NoError(t, err, "scripts/helm.sh")
		bin = strings.TrimSpace(string(out))
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Logf("helm %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
		err = fmt.Errorf("%w: %s", err, stderr.String()) // what helm said, for the tests that read it
	}
	return out, err
}

// renderChart renders the chart as release lvm-agent in namespace
// lvm-agent, with --set values.
func renderChart(t *testing.T, sets ...string) []*unstructured.Unstructured {
	t.Helper()
	return renderChartIn(t, "lvm-agent", sets...)
}

// renderChartIn renders the chart as release lvm-agent in namespace ns.
func renderChartIn(t *testing.T, ns string, sets ...string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"template", "lvm-agent", chartDir, "--namespace", ns}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := helm(t, args...)
	require.NoError(t, err)
	return decodeManifests(t, "helm template", bytes.NewReader(out))
}

// Each lvmd mode, rendered by Helm and applied server-side (dry run,
// strict field validation) to the real API server.
func TestChartModes(t *testing.T) {
	_, err := helm(t, "lint", "--strict", chartDir)
	require.NoError(t, err, "helm lint")
	_, err = cp.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lvm-agent"}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	for _, tc := range []struct {
		mode  string
		check func(t *testing.T, objs []*unstructured.Unstructured)
		sets  []string
	}{
		{"sidecar", checkSidecar, nil},
		{"host", checkHostLVMD, nil},
		{"none", checkNoLVMD, nil},
		{"sidecar", checkThickClones, []string{"agent.thickClones=true"}},
		{"none", checkThickClones, []string{"agent.thickClones=true"}},
	} {
		name := tc.mode
		if len(tc.sets) > 0 {
			name += " " + tc.sets[0]
		}
		t.Run(name, func(t *testing.T) {
			objs := renderChart(t, append([]string{"lvmd.mode=" + tc.mode}, tc.sets...)...)
			checkCommon(t, objs)
			tc.check(t, objs)
			checkChartProvisioner(t, objs)
			dryRunApply(t, objs)
		})
	}
	_, err = helm(t, "template", "x", chartDir, "--set", "lvmd.mode=daemon")
	assert.Error(t, err, "an unknown mode fails to render")
}

func checkNoLVMD(t *testing.T, objs []*unstructured.Unstructured) {
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
	pod := ds.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	assert.Empty(t, pod.InitContainers, "no lvmd sidecar")
	require.Len(t, pod.Volumes, 1, "no socket, no lvmd configuration")
	assert.Equal(t, "host-dev", pod.Volumes[0].Name, "the LVs' devices only")
	assert.False(t, pod.HostPID)
	assert.True(t, pod.HostNetwork, "google/lvmd on the node's loopback")
	assert.Equal(t, corev1.DNSClusterFirstWithHostNet, pod.DNSPolicy)
	args := pod.Containers[0].Args
	assert.Contains(t, args, "--backend=google-lvmd")
	assert.Contains(t, args, "--lvmd-address=127.0.0.1:1234")
}

// The provisioner's Deployment, in the release's namespace, runs as a
// ServiceAccount of the chart bound to its roles there, with flags the
// binary knows; the CSIDriver and the agents' --provisioner-name are its name.
func checkChartProvisioner(t *testing.T, objs []*unstructured.Unstructured) {
	name := checkProvisioner(t, objs)
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
	assert.Equal(t, name, flagValue(podContainer(t, ds.Spec.Template.Spec, "lvm-agent").Args, "provisioner-name"))
}

// checkProvisioner checks the provisioner's objects alone (as
// checkChartProvisioner says) and returns its name.
func checkProvisioner(t *testing.T, objs []*unstructured.Unstructured) string {
	d := deployTyped[appsv1.Deployment](t, deployFind(t, objs, "Deployment", "lvm-agent-provisioner"))
	assert.Equal(t, "lvm-agent", d.Namespace)
	assert.Equal(t, ptrTo(int32(2)), d.Spec.Replicas)
	pod := d.Spec.Template.Spec
	sa := deployTyped[corev1.ServiceAccount](t, deployFind(t, objs, "ServiceAccount", pod.ServiceAccountName))
	assert.Equal(t, d.Namespace, sa.Namespace)
	want := rbacv1.Subject{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}
	crb := deployTyped[rbacv1.ClusterRoleBinding](t, deployFind(t, objs, "ClusterRoleBinding", "lvm-agent-provisioner"))
	assert.Equal(t, []rbacv1.Subject{want}, crb.Subjects)
	rb := deployTyped[rbacv1.RoleBinding](t, deployFind(t, objs, "RoleBinding", "lvm-agent-provisioner"))
	assert.Equal(t, []rbacv1.Subject{want}, rb.Subjects)
	assert.Equal(t, d.Namespace, rb.Namespace)

	c := podContainer(t, pod, "provisioner")
	assert.Equal(t, "ghcr.io/lvm-agent/lvm-agent:dev", c.Image)
	args := expandKube(t, c.Args, map[string]string{"POD_NAMESPACE": d.Namespace})
	require.NotEmpty(t, args)
	assert.Equal(t, "provisioner", args[0])
	checkAgentFlags(t, args)
	name := flagValue(args, "name")
	assert.Equal(t, "lvm.lvm-agent.io", name)
	csi := deployTyped[storagev1.CSIDriver](t, deployFind(t, objs, "CSIDriver", name))
	assert.Equal(t, ptrTo(true), csi.Spec.StorageCapacity)

	// Both probes ask /healthz on the port --health-address serves
	// (integration/provisioning proves it answers, on a standby too).
	_, port, err := net.SplitHostPort(flagValue(args, "health-address"))
	require.NoError(t, err, "--health-address")
	var health *corev1.ContainerPort
	for i, p := range c.Ports {
		if p.Name == "health" {
			health = &c.Ports[i]
		}
	}
	require.NotNil(t, health, "a port named health")
	assert.Equal(t, port, strconv.Itoa(int(health.ContainerPort)))
	for what, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		require.NotNil(t, probe, what)
		require.NotNil(t, probe.HTTPGet, what)
		assert.Equal(t, "/healthz", probe.HTTPGet.Path, what)
		assert.Equal(t, "health", probe.HTTPGet.Port.String(), what)
	}
	return name
}

// The chart's rules are deploy/base's, which integration/rbac_test.go and
// integration/provisioner_rbac_test.go prove are enough and no more.
func TestChartRBACIsDeploys(t *testing.T) {
	base, chart := renderKustomization(t, filepath.Join(deployDir(), "base")), renderChart(t)
	for _, name := range []string{"lvm-agent", "lvm-agent-provisioner"} {
		rules := func(objs []*unstructured.Unstructured) []rbacv1.PolicyRule {
			return deployTyped[rbacv1.ClusterRole](t, deployFind(t, objs, "ClusterRole", name)).Rules
		}
		assert.Equal(t, rules(base), rules(chart), "ClusterRole %s", name)
	}
	role := func(objs []*unstructured.Unstructured) []rbacv1.PolicyRule {
		return deployTyped[rbacv1.Role](t, deployFind(t, objs, "Role", "lvm-agent-provisioner")).Rules
	}
	assert.Equal(t, role(base), role(chart), "Role lvm-agent-provisioner")
	agentRole := func(objs []*unstructured.Unstructured) []rbacv1.PolicyRule {
		return deployTyped[rbacv1.Role](t, deployFind(t, objs, "Role", "lvm-agent")).Rules
	}
	assert.Equal(t, agentRole(base), agentRole(chart), "Role lvm-agent")
}

// The chart's admission policies and bindings are deploy/base's but for who
// is who (the variables agent, provisioner and adminGroup), which follow
// the release's namespace, ServiceAccounts and admission.adminGroup; each
// rendering applies (dry run) to the real API server.
func TestChartAdmissionIsDeploys(t *testing.T) {
	base := readManifests(t, filepath.Join(deployDir(), "base", "admission.yaml"))
	for _, tc := range []struct {
		ns                        string
		sets                      []string
		agent, provisioner, group string
	}{
		{"lvm-agent", nil, agentUser, provisionerUser, adminGroup},
		{"storage", []string{"serviceAccount.name=agent", "provisioner.serviceAccount.name=prov", "admission.adminGroup=storage-admins"},
			"system:serviceaccount:storage:agent", "system:serviceaccount:storage:prov", "storage-admins"},
	} {
		t.Run(tc.ns, func(t *testing.T) {
			chart := renderChartIn(t, tc.ns, tc.sets...)
			who := map[string]string{"agent": tc.agent, "provisioner": tc.provisioner, "adminGroup": tc.group}
			n := 0
			for _, o := range chart {
				if strings.HasPrefix(o.GetKind(), "ValidatingAdmissionPolicy") {
					n++
				}
			}
			assert.Equal(t, len(base), n, "the chart has deploy/base's admission objects, no more")
			for _, b := range base {
				spec := deployFind(t, chart, b.GetKind(), b.GetName()).DeepCopy().Object["spec"].(map[string]any)
				vars, _ := spec["variables"].([]any)
				baseVars, _ := b.Object["spec"].(map[string]any)["variables"].([]any)
				require.Len(t, vars, len(baseVars), "%s %s", b.GetKind(), b.GetName())
				for i, v := range vars {
					v, bv := v.(map[string]any), baseVars[i].(map[string]any)
					if w, ok := who[v["name"].(string)]; ok {
						assert.Equal(t, "'"+w+"'", v["expression"], "%s: variable %s", b.GetName(), v["name"])
						v["expression"] = bv["expression"]
					}
				}
				assert.Equal(t, b.Object["spec"], spec, "%s %s", b.GetKind(), b.GetName())
			}
			_, err := cp.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tc.ns}}, metav1.CreateOptions{})
			if !apierrors.IsAlreadyExists(err) {
				require.NoError(t, err)
			}
			dryRunApply(t, chart)
		})
	}
}

func TestChartValues(t *testing.T) {
	ds := func(sets ...string) appsv1.DaemonSet {
		return *deployTyped[appsv1.DaemonSet](t, deployFind(t, renderChart(t, sets...), "DaemonSet", "lvm-agent"))
	}
	def := ds()
	// The agent's requests and limits are deploy/base's (both set from make
	// bench-memory), and in both its GOMEMLIMIT is its memory limit.
	base := deployTyped[appsv1.DaemonSet](t, deployFind(t, renderKustomization(t, filepath.Join(deployDir(), "base")), "DaemonSet", "lvm-agent"))
	for name, d := range map[string]appsv1.DaemonSet{"the chart": def, "deploy/base": *base} {
		c := podContainer(t, d.Spec.Template.Spec, "lvm-agent")
		assert.False(t, c.Resources.Limits.Memory().IsZero(), "%s: the agent has a memory limit", name)
		var limit *corev1.ResourceFieldSelector
		for _, e := range c.Env {
			if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil {
				limit = e.ValueFrom.ResourceFieldRef
			}
		}
		assert.Equal(t, &corev1.ResourceFieldSelector{ContainerName: "lvm-agent", Resource: "limits.memory"}, limit, "%s: GOMEMLIMIT", name)
	}
	assert.Equal(t, podContainer(t, base.Spec.Template.Spec, "lvm-agent").Resources, podContainer(t, def.Spec.Template.Spec, "lvm-agent").Resources)
	// A node without the VG must not hold up a rollout by itself.
	require.NotNil(t, def.Spec.UpdateStrategy.RollingUpdate)
	assert.Equal(t, intstr.FromString("25%"), *def.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable)
	assert.Equal(t, []corev1.Toleration{{Operator: corev1.TolerationOpExists}}, def.Spec.Template.Spec.Tolerations)
	assert.Equal(t, "system-node-critical", def.Spec.Template.Spec.PriorityClassName)

	sel := ds(`nodeSelector.lvm-agent\.io/vg1=true`, "updateStrategy.rollingUpdate.maxUnavailable=3", "tolerations=null")
	assert.Equal(t, map[string]string{"lvm-agent.io/vg1": "true"}, sel.Spec.Template.Spec.NodeSelector)
	assert.Equal(t, intstr.FromInt32(3), *sel.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable)
	assert.Empty(t, sel.Spec.Template.Spec.Tolerations)

	// A configuration change rolls the Pods: the template's checksum moves.
	sum := func(d appsv1.DaemonSet) string { return d.Spec.Template.Annotations["checksum/config"] }
	require.NotEmpty(t, sum(def))
	assert.NotEqual(t, sum(def), sum(ds("agent.deviceClassMap=vg1=ssd")))
	assert.NotEqual(t, sum(def), sum(ds("lvmd.config.device-classes[0].spare-gb=5")))
	assert.Equal(t, sum(def), sum(ds("agent.resources.requests.cpu=20m")), "only configuration changes it")

	// Metrics: the port, and off (no probes then).
	agent := func(d appsv1.DaemonSet) corev1.Container { return podContainer(t, d.Spec.Template.Spec, "lvm-agent") }
	port := ds("metrics.port=9999", "metrics.podAnnotations.prometheus\\.io/scrape=true")
	assert.Contains(t, agent(port).Args, "--metrics-address=:9999")
	assert.Equal(t, int32(9999), agent(port).Ports[0].ContainerPort)
	assert.Equal(t, "metrics", agent(port).Ports[0].Name)
	assert.Equal(t, "true", port.Spec.Template.Annotations["prometheus.io/scrape"])
	off := agent(ds("metrics.enabled=false"))
	assert.Contains(t, off.Args, "--metrics-address=")
	assert.Nil(t, off.ReadinessProbe)
	assert.Empty(t, off.Ports)

	// Resources and extra flags, which must be flags the agent knows.
	extra := ds("agent.extraArgs={--watch-mode=labelled,--log-format=json}", "agent.resources.limits.memory=1Gi", "lvmd.resources.requests.memory=64Mi")
	a := agent(extra)
	mem := a.Resources.Limits[corev1.ResourceMemory]
	assert.Equal(t, "1Gi", mem.String())
	mem = podContainer(t, extra.Spec.Template.Spec, "lvmd").Resources.Requests[corev1.ResourceMemory]
	assert.Equal(t, "64Mi", mem.String())
	args := expandKube(t, a.Args, map[string]string{"NODE_NAME": "node-1", "LVM_AGENT_DEVICE_CLASS_MAP": ""})
	assert.Contains(t, args, "--watch-mode=labelled")
	checkAgentFlags(t, args)

	// The provisioner's values, and both parts off.
	prov := renderChart(t, "provisioner.replicas=3", "provisioner.name=lvm.example.com", "provisioner.extraArgs={--workers=8}",
		"provisioner.resources.limits.memory=1Gi")
	d := deployTyped[appsv1.Deployment](t, deployFind(t, prov, "Deployment", "lvm-agent-provisioner"))
	assert.Equal(t, ptrTo(int32(3)), d.Spec.Replicas)
	p := podContainer(t, d.Spec.Template.Spec, "provisioner")
	mem = p.Resources.Limits[corev1.ResourceMemory]
	assert.Equal(t, "1Gi", mem.String())
	pargs := expandKube(t, p.Args, map[string]string{"POD_NAMESPACE": "lvm-agent"})
	assert.Equal(t, "lvm.example.com", flagValue(pargs, "name"))
	assert.Contains(t, pargs, "--workers=8")
	checkAgentFlags(t, pargs)
	deployFind(t, prov, "CSIDriver", "lvm.example.com")
	provDS := deployTyped[appsv1.DaemonSet](t, deployFind(t, prov, "DaemonSet", "lvm-agent"))
	assert.Contains(t, agent(*provDS).Args, "--provisioner-name=lvm.example.com", "the agents serve its PVs")
	for _, o := range renderChart(t, "provisioner.enabled=false", "admission.enabled=false") {
		if (o.GetKind() == "Role" || o.GetKind() == "RoleBinding") && (o.GetName() == "lvm-agent" || o.GetName() == "lvm-agent-keys") {
			continue // the agent's: it reads the Lease of a labeller that may run elsewhere, and the encryption keys
		}
		assert.NotContains(t, []string{"Deployment", "CSIDriver", "Role", "RoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"},
			o.GetKind(), "%s %s rendered with provisioner and admission off", o.GetKind(), o.GetName())
	}
}

// The chart installed in another namespace, on a real API server: its
// policies let that release's provisioner ask and its agent answer, and
// refuse deploy/base's users (namespace lvm-agent). A control plane of its
// own, which authorizes every request (harness.StartDevCluster): the
// policies bind every user, and what is refused here is refused by
// admission alone.
func TestChartAdmissionEnforced(t *testing.T) {
	ctx := context.Background()
	acp, err := harness.StartDevCluster("", t.TempDir(), 2*time.Minute)
	require.NoError(t, err)
	t.Cleanup(func() { _ = acp.Env.Stop() })
	_, err = acp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "storage"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	serverSideApply(t, acp, renderChartIn(t, "storage", "admission.adminGroup=storage-admins"))
	harness.PVC(t, acp.Client, "default", "chart-vol", "node-a")

	const (
		agentHere       = "system:serviceaccount:storage:lvm-agent"
		provisionerHere = "system:serviceaccount:storage:lvm-agent-provisioner"
	)
	request := kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreating, kube.AnnSpec: `{"volumeGroup":"vg1","name":"x","size":4096}`})
	created := kube.Set(map[string]string{kube.AnnLifecycle: kube.StateCreated, kube.AnnDevice: "/dev/vg1/x"})
	patch := func(user string, ann kube.Change) error {
		_, err := kube.UpdatePvcWithAnnotations(ctx, clientset.Wrap(impersonate(t, acp, user)), "default", "chart-vol", "", ann, nil)
		return err
	}
	// The policies take effect a moment after they are stored.
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := impersonate(t, acp, provisionerUser).CoreV1().PersistentVolumeClaims("default").Patch(ctx, "chart-vol", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"`+kube.AnnLifecycle+`":"creating"}}}`), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err), nil
	}), "the chart's policy never refused a request")

	// In order: each step starts from the state the one before left.
	for _, tc := range []struct {
		name string
		user string
		ann  kube.Change
		want string // in the refusal; "" is allowed
	}{
		{"deploy/base's provisioner asks", provisionerUser, request,
			deniedProtocol + "only the lvm-agent provisioner (" + provisionerHere + ") or members of group storage-admins may ask for volumes"},
		{"this release's provisioner asks", provisionerHere, request, ""},
		{"deploy/base's agent answers", agentUser, created,
			deniedProtocol + "only the lvm-agent agent (" + agentHere + ") answers volume requests"},
		{"this release's agent answers", agentHere, created, ""},
	} {
		err := patch(tc.user, tc.ann)
		if tc.want == "" {
			assert.NoError(t, err, tc.name)
			continue
		}
		if assert.Error(t, err, tc.name) {
			assert.True(t, apierrors.IsForbidden(err), "%s: %v", tc.name, err)
			assert.Contains(t, err.Error(), tc.want, tc.name)
		}
	}
}

// Liveness probes restart what hangs, not what is slow: on a loaded node
// (a burst, the recovery after a power cut) lvmd's exec probe took more
// than 10 s and the HTTP ones more than the default 1 s, and each restart
// held every request in flight for minutes. deploy/base and the chart
// alike: lvmd is restarted only after five minutes without an answer, and
// no HTTP probe of the agent or the provisioner times out within 10 s.
func TestProbesTolerateALoadedNode(t *testing.T) {
	for name, objs := range map[string][]*unstructured.Unstructured{
		"deploy/base": renderKustomization(t, filepath.Join(deployDir(), "base")),
		"the chart":   renderChart(t),
	} {
		ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
		prov := deployTyped[appsv1.Deployment](t, deployFind(t, objs, "Deployment", "lvm-agent-provisioner"))
		lvmd := podContainer(t, ds.Spec.Template.Spec, "lvmd").LivenessProbe
		require.NotNil(t, lvmd, "%s: lvmd's liveness probe", name)
		assert.GreaterOrEqual(t, lvmd.PeriodSeconds*lvmd.FailureThreshold, int32(300), "%s: lvmd restarted only after 5 min without an answer", name)
		assert.GreaterOrEqual(t, lvmd.TimeoutSeconds, int32(30), "%s: lvmd's probe timeout", name)
		for what, c := range map[string]corev1.Container{
			"the agent":       podContainer(t, ds.Spec.Template.Spec, "lvm-agent"),
			"the provisioner": podContainer(t, prov.Spec.Template.Spec, "provisioner"),
		} {
			require.NotNil(t, c.LivenessProbe, "%s: %s", name, what)
			assert.GreaterOrEqual(t, c.LivenessProbe.TimeoutSeconds, int32(10), "%s: %s's liveness timeout", name, what)
			// A start on a node busy booting took minutes (the power cut's
			// recovery): liveness waits for the first answer.
			require.NotNil(t, c.StartupProbe, "%s: %s's startup probe", name, what)
			assert.Equal(t, c.LivenessProbe.HTTPGet.Path, c.StartupProbe.HTTPGet.Path, "%s: %s", name, what)
			assert.GreaterOrEqual(t, c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold, int32(300), "%s: %s may take 5 min to start", name, what)
		}
	}
}

// binaryDefaults runs "lvm-agent ARGS --help" and returns each flag's
// default as --help prints it ("" for a zero default, which it omits).
func binaryDefaults(t *testing.T, args ...string) map[string]string {
	t.Helper()
	out, err := exec.Command(agentBin, append(args, "--help")...).CombinedOutput()
	require.NoError(t, err, "lvm-agent %v --help: %s", args, out)
	flagLine := regexp.MustCompile(`^  --?(\S+)`)
	defaultText := regexp.MustCompile(`\(default ("(?:[^"\\]|\\.)*"|[^\s()]+)\)$`)
	defaults, name := map[string]string{}, ""
	for _, l := range strings.Split(string(out), "\n") {
		if m := flagLine.FindStringSubmatch(l); m != nil {
			name = m[1]
			defaults[name] = ""
		}
		if m := defaultText.FindStringSubmatch(strings.TrimSpace(l)); m != nil && name != "" {
			v := m[1]
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			}
			defaults[name] = v
		}
	}
	require.NotEmpty(t, defaults)
	return defaults
}

// sameFlagValue: chart is the binary's default help (durations by value,
// false as the omitted zero).
func sameFlagValue(chart, help string) bool {
	if a, err := time.ParseDuration(chart); err == nil {
		b, err := time.ParseDuration(help)
		return err == nil && a == b
	}
	return chart == help || chart == "false" && help == ""
}

// Each chart value that stands for a flag renders it: by default with the
// binary's own default, and set, with what was set.
func TestChartFlagValues(t *testing.T) {
	args := func(sets ...string) (agent, prov []string, objs []*unstructured.Unstructured) {
		objs = renderChart(t, sets...)
		ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
		d := deployTyped[appsv1.Deployment](t, deployFind(t, objs, "Deployment", "lvm-agent-provisioner"))
		agent = expandKube(t, podContainer(t, ds.Spec.Template.Spec, "lvm-agent").Args, map[string]string{"NODE_NAME": "node-1", "LVM_AGENT_DEVICE_CLASS_MAP": ""})
		prov = expandKube(t, podContainer(t, d.Spec.Template.Spec, "provisioner").Args, map[string]string{"POD_NAMESPACE": "lvm-agent"})
		checkAgentFlags(t, agent)
		checkAgentFlags(t, prov)
		return agent, prov, objs
	}
	agent, prov, _ := args()
	for binary, c := range map[string]struct {
		args, flags []string
		help        map[string]string
	}{
		"lvm-agent": {agent, []string{"watch-mode", "wipe-rate", "orphan-gc-interval", "orphan-gc-dry-run", "orphan-gc-max"}, binaryDefaults(t)},
		"lvm-agent provisioner": {prov, []string{"resize", "publish-capacity", "node-loss", "node-loss-grace"},
			binaryDefaults(t, "provisioner")},
	} {
		for _, f := range c.flags {
			v := flagValue(c.args, f)
			require.NotEmpty(t, v, "%s: the chart renders --%s", binary, f)
			assert.True(t, sameFlagValue(v, c.help[f]), "%s --%s: the chart's default %q, the binary's %q", binary, f, v, c.help[f])
		}
	}
	// The key namespace is the release's, where the chart's Role lets the
	// agent read Secrets.
	assert.Equal(t, "lvm-agent", flagValue(agent, "key-namespace"))
	ns := renderChartIn(t, "storage")
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, ns, "DaemonSet", "lvm-agent"))
	assert.Equal(t, "storage", flagValue(podContainer(t, ds.Spec.Template.Spec, "lvm-agent").Args, "key-namespace"))
	assert.Equal(t, "storage", deployFind(t, ns, "Role", "lvm-agent-keys").GetNamespace())

	agent, prov, objs := args("agent.watchMode=labelled", "agent.wipeRate=0", "agent.keyNamespace=keys",
		"agent.orphanGC.interval=0", "agent.orphanGC.dryRun=true", "agent.orphanGC.max=0",
		"provisioner.resize=false", "provisioner.publishCapacity=false", "provisioner.nodeLoss.enabled=false", "provisioner.nodeLoss.grace=10m")
	for f, want := range map[string]string{"watch-mode": "labelled", "wipe-rate": "0", "key-namespace": "keys",
		"orphan-gc-interval": "0", "orphan-gc-dry-run": "true", "orphan-gc-max": "0"} {
		assert.Equal(t, want, flagValue(agent, f), "--%s", f)
	}
	for f, want := range map[string]string{"resize": "false", "publish-capacity": "false", "node-loss": "off", "node-loss-grace": "10m"} {
		assert.Equal(t, want, flagValue(prov, f), "--%s", f)
	}
	// No CSIStorageCapacity objects: the scheduler must not look for them.
	csi := deployTyped[storagev1.CSIDriver](t, deployFind(t, objs, "CSIDriver", "lvm.lvm-agent.io"))
	assert.Equal(t, ptrTo(false), csi.Spec.StorageCapacity)
}
