package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"text/template/parse"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
)

// The prometheus-operator release whose CRDs deploy/monitoring is checked
// against: the module proxy serves it (not every release: v0.95.x is refused).
const prometheusOperator = "github.com/prometheus-operator/prometheus-operator@v0.94.0"

// deploy/monitoring is accepted, field by field, by the API server with the
// prometheus-operator's own CRDs, and every metric each alert names is one
// a running agent serves, with the labels the alert matches on.
func TestMonitoring(t *testing.T) {
	ctx := context.Background()
	var crds []*unstructured.Unstructured
	for _, kind := range []string{"podmonitors", "prometheusrules"} {
		crds = append(crds, readManifests(t, filepath.Join(operatorCRDs(t), "monitoring.coreos.com_"+kind+".yaml"))...)
	}
	serverSideApply(t, cp, crds)
	for _, crd := range crds {
		waitEstablished(t, crd.GetName())
	}
	_, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "lvm-agent"}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	objs := renderKustomization(t, filepath.Join(deployDir(), "monitoring"))
	require.NoError(t, wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		// Discovery lists new CRDs' kinds a moment after they are established.
		_, err := cp.Client.Discovery().ServerResourcesForGroupVersion("monitoring.coreos.com/v1")
		return err == nil, nil
	}))
	serverSideApply(t, cp, objs)

	// Each PodMonitor scrapes its pods on the port their template names:
	// the agent's, and the provisioner's metrics port (--metrics-port).
	base := renderKustomization(t, filepath.Join(deployDir(), "base"))
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, base, "DaemonSet", "lvm-agent"))
	prov := deployTyped[appsv1.Deployment](t, deployFind(t, base, "Deployment", "lvm-agent-provisioner"))
	provJob := ""
	for name, target := range map[string]struct {
		pod       corev1.PodTemplateSpec
		container string
	}{
		"lvm-agent":             {ds.Spec.Template, "lvm-agent"},
		"lvm-agent-provisioner": {prov.Spec.Template, "provisioner"},
	} {
		pm := deployFind(t, objs, "PodMonitor", name)
		sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
		require.NotEmpty(t, sel, name)
		for k, v := range sel {
			assert.Equal(t, v, target.pod.Labels[k], "PodMonitor %s selector %s", name, k)
		}
		endpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
		require.Len(t, endpoints, 1, name)
		port := endpoints[0].(map[string]any)["port"]
		c := podContainer(t, target.pod.Spec, target.container)
		var ports []string
		for _, p := range c.Ports {
			ports = append(ports, p.Name)
			if p.Name == port && name == "lvm-agent-provisioner" {
				assert.Equal(t, strconv.Itoa(int(p.ContainerPort)), flagValue(c.Args, "metrics-port"), "the provisioner's metrics port")
			}
		}
		assert.Contains(t, ports, port, "PodMonitor %s: the %s container's port names", name, target.container)
		if jobLabel, ok, _ := unstructured.NestedString(pm.Object, "spec", "jobLabel"); ok && name == "lvm-agent-provisioner" {
			provJob = target.pod.Labels[jobLabel]
		}
	}
	require.NotEmpty(t, provJob, "the provisioner's PodMonitor names its job after a label its pods have")

	// The rules as the API server stored them.
	dyn, err := dynamic.NewForConfig(cp.Config)
	require.NoError(t, err)
	stored, err := dyn.Resource(schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "prometheusrules"}).
		Namespace("lvm-agent").Get(ctx, "lvm-agent", metav1.GetOptions{})
	require.NoError(t, err)
	exprs, texts := map[string]string{}, map[string][]string{}
	groups, _, _ := unstructured.NestedSlice(stored.Object, "spec", "groups")
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			r := r.(map[string]any)
			exprs[fmt.Sprint(r["alert"])] = fmt.Sprint(r["expr"])
			ann, _, _ := unstructured.NestedStringMap(r, "annotations")
			for _, k := range []string{"summary", "description"} {
				texts[fmt.Sprint(r["alert"])] = append(texts[fmt.Sprint(r["alert"])], ann[k])
			}
		}
	}
	// The alerts docs/operations.md describes.
	for _, a := range []string{"LVMAgentLvmdUnreachable", "LVMAgentRequestsStuck", "LVMAgentThinPoolNearlyFull",
		"LVMAgentProvisionerDown", "LVMAgentProvisioningFailing", "LVMAgentVolumeDeletesFailing"} {
		assert.Contains(t, exprs, a)
	}
	// The provisioner's job, as its PodMonitor names it.
	assert.Contains(t, exprs["LVMAgentProvisionerDown"], `up{job="`+provJob+`"}`)

	// A real agent with the fake lvmd, after a create, a delete and a
	// refusal, so that every labelled series exists. Without
	// device-mapper: its series are checked apart (below).
	addr := harness.FreeAddr(t)
	n := startNode(t, "--metrics-address", addr, "--device-mapper-control", "")
	require.NoError(t, n.create(t, "default", "mon-vol", spec("lv-mon", "4Mi")))
	pvc, err := cp.Client.CoreV1().PersistentVolumeClaims("default").Get(ctx, "mon-vol", metav1.GetOptions{})
	require.NoError(t, err)
	harness.PV(t, cp.Client, "pv-mon", n.name, kube.DefaultDriver, pvc)
	harness.DeleteClaim(t, cp.Client, pvc) // a live claim's LV is never removed
	require.NoError(t, deleteVolume(t, "pv-mon", "vg1", "lv-mon"))
	assert.Error(t, n.create(t, "default", "mon-big", spec("lv-mon-big", "100Gi")), "refused: too big")
	labels := waitMetricNames(t, addr, `lvm_agent_operations_total`, `lvm_agent_workqueue_longest_running_processor_seconds`)
	// The provisioner's, and up, which Prometheus records for each target
	// with the target's labels (the operator's, and the PodMonitor's node).
	for name, l := range provisionerMetricLabels(t) {
		labels[name] = append(labels[name], l...)
	}
	labels["up"] = []string{"job", "instance", "namespace", "pod", "container", "endpoint", "node"}

	// Served only where the agent can read device-mapper (the guest suite,
	// integration/guest/cases_test.go, scrapes them from a real thin pool):
	// these may be missing here, and are checked like the others when not.
	dmOnly, dmLabels := map[string]bool{}, map[string][]string{}
	descs := make(chan *prometheus.Desc, 16)
	(&agent.Devices{}).Describe(descs)
	close(descs)
	for d := range descs {
		dmOnly[descName(d)] = true
		dmLabels[descName(d)] = descLabels(d)
	}
	for alert, expr := range exprs {
		sels, err := promqlSelectors(expr)
		require.NoError(t, err, "%s: %s", alert, expr)
		require.NotEmpty(t, sels, alert)
		for _, s := range sels {
			served, ok := labels[s.name]
			if !ok && dmOnly[s.name] {
				continue
			}
			if assert.True(t, ok, "%s: %s is not served", alert, s.name) {
				for _, l := range s.labels {
					assert.Contains(t, served, l, "%s: %s has no label %s", alert, s.name, l)
				}
			}
		}
	}

	// Each {{ }} of an alert's messages that reads $labels prints something
	// for every kind of series the alert fires with: each "or" branch's
	// first metric as the agent serves it (and as the device-mapper
	// collector would), or the "by" labels of the aggregation it starts
	// with; the PodMonitor adds node, and Prometheus namespace and pod.
	for alert, expr := range exprs {
		for _, branch := range strings.Split(expr, " or ") {
			var sets [][]string
			if strings.HasPrefix(strings.TrimSpace(branch), "absent(") {
				// Its one series has only the labels of the selector's
				// equality matchers: its messages may print none.
				sets = append(sets, nil)
			} else if by := regexp.MustCompile(`^\s*\w+ by \(([^)]*)\)`).FindStringSubmatch(branch); by != nil {
				sets = append(sets, strings.Split(strings.ReplaceAll(by[1], " ", ""), ","))
			} else {
				sels, err := promqlSelectors(branch)
				require.NoError(t, err)
				first := regexp.MustCompile(`[a-z_:]+`).FindString(branch)
				require.True(t, slices.ContainsFunc(sels, func(s selector) bool { return s.name == first }), "%s: %s", alert, first)
				if l, ok := labels[first]; ok {
					sets = append(sets, append(l, "node", "namespace", "pod"))
				}
				if dmOnly[first] {
					sets = append(sets, append(dmLabels[first], "node", "namespace", "pod"))
				}
			}
			require.NotEmpty(t, sets, "%s: no series for %q", alert, branch)
			for _, set := range sets {
				for _, text := range texts[alert] {
					assertLabelsPrinted(t, alert, text, set)
				}
			}
		}
	}
}

// provisionerMetricLabels runs the real provisioner, under a name and a
// class of its own (and none of its optional controllers) so that it
// touches nothing of the other tests, makes one claim fail to provision and
// one released volume fail to delete, so that the library's failure
// counters have series, and returns each metric it serves with its label
// names.
func provisionerMetricLabels(t *testing.T) map[string][]string {
	t.Helper()
	ctx := context.Background()
	const name = "monitoring.lvm-agent.io"
	addr := harness.FreeAddr(t)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	harness.StartAgent(t, agentBin, "provisioner", "--kubeconfig", cp.Kubeconfig, "--namespace", "lvm-agent", "--name", name,
		"--metrics-port", port, "--health-address", "", "--publish-capacity=false", "--label-requests=false",
		"--node-loss=off", "--resize=false", "--v", "2")

	// A class with a parameter the provisioner refuses.
	class, wffc := "monitoring-refused", storagev1.VolumeBindingWaitForFirstConsumer
	_, err = cp.Client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: class},
		Provisioner: name, VolumeBindingMode: &wffc, Parameters: map[string]string{"volumeGroup": "vg1", "noSuchParameter": "x"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cp.Client.StorageV1().StorageClasses().Delete(ctx, class, metav1.DeleteOptions{}) })
	pvc := harness.NewPVC("default", "mon-refused", "mon-node") // selected-node: the scheduler's part
	pvc.Spec.StorageClassName = &class
	pvc.Annotations["volume.kubernetes.io/storage-provisioner"] = name // the PV controller's
	_, err = cp.Client.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = cp.Client.CoreV1().PersistentVolumeClaims("default").Delete(ctx, pvc.Name, metav1.DeleteOptions{})
	})

	// A released local PV of the provisioner without the spec annotation
	// its delete reads the LV from.
	pv := harness.NewPV("pv-mon-undeletable", "mon-node", "", nil, "")
	pv.Spec.PersistentVolumeSource = corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: "/dev/vg1/mon-undeletable"}}
	pv.Spec.StorageClassName = class
	pv.Annotations = map[string]string{"pv.kubernetes.io/provisioned-by": name}
	pv, err = cp.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		pvs := cp.Client.CoreV1().PersistentVolumes()
		_, _ = pvs.Patch(ctx, pv.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
		_ = pvs.Delete(ctx, pv.Name, metav1.DeleteOptions{})
	})
	pv.Status.Phase = corev1.VolumeReleased
	_, err = cp.Client.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{})
	require.NoError(t, err)

	return waitMetricNames(t, addr, "controller_persistentvolumeclaim_provision_failed_total", "controller_persistentvolume_delete_failed_total")
}

// assertLabelsPrinted executes each action of an alert's message that
// reads $labels, as Prometheus' template does ($labels bound to the
// series' labels, a missing one empty), with every label of set present,
// and fails for an action that prints nothing.
func assertLabelsPrinted(t *testing.T, alert, text string, set []string) {
	t.Helper()
	series := map[string]string{}
	for _, l := range set {
		series[l] = "L-" + l
	}
	const header = `{{ $labels := .Labels }}{{ $value := .Value }}`
	tmpl, err := template.New(alert).Parse(header + text)
	require.NoError(t, err, "%s: %s", alert, text)
	for _, n := range tmpl.Root.Nodes {
		action, ok := n.(*parse.ActionNode)
		if !ok || len(action.Pipe.Decl) > 0 || !strings.Contains(action.String(), "$labels") {
			continue
		}
		one := template.Must(template.New("").Option("missingkey=zero").
			Parse(header + action.String()))
		var out strings.Builder
		require.NoError(t, one.Execute(&out, map[string]any{"Labels": series, "Value": 1.0}))
		assert.NotEmpty(t, out.String(), "%s: %s prints nothing for a series with labels %v", alert, action, set)
	}
}

// descLabels is a Desc's variable label names (client_golang has no getter).
func descLabels(d *prometheus.Desc) []string {
	_, rest, _ := strings.Cut(d.String(), "variableLabels: {")
	list, _, _ := strings.Cut(rest, "}")
	if list == "" {
		return nil
	}
	return strings.Split(list, ",")
}

// operatorCRDs downloads the prometheus-operator module from the Go module
// proxy into the module cache (once) and returns its CRD directory.
func operatorCRDs(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", prometheusOperator).Output()
	require.NoError(t, err, "go mod download %s: %s", prometheusOperator, out)
	var m struct{ Dir, Error string }
	require.NoError(t, json.Unmarshal(out, &m))
	require.Empty(t, m.Error)
	dir := filepath.Join(m.Dir, "example", "prometheus-operator-crd")
	_, err = os.Stat(dir)
	require.NoError(t, err)
	return dir
}

func waitEstablished(t *testing.T, name string) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cp.Config)
	require.NoError(t, err)
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	require.NoError(t, wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		crd, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			c := c.(map[string]any)
			if c["type"] == "Established" && c["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	}), "CRD %s not established", name)
}

// waitMetricNames scrapes addr until every name in want is served, and
// returns each served metric's label names.
func waitMetricNames(t *testing.T, addr string, want ...string) map[string][]string {
	t.Helper()
	var labels map[string][]string
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		m, err := harness.ReadMetrics(addr)
		if err != nil {
			return false, nil
		}
		labels = map[string][]string{}
		for series := range m {
			name, rest, _ := strings.Cut(series, "{")
			if _, ok := labels[name]; !ok {
				labels[name] = nil
			}
			for _, kv := range strings.Split(strings.TrimSuffix(rest, "}"), `",`) {
				if k, _, ok := strings.Cut(kv, "="); ok && !slices.Contains(labels[name], k) {
					labels[name] = append(labels[name], k)
				}
			}
		}
		for _, w := range want {
			if _, ok := labels[w]; !ok {
				return false, nil
			}
		}
		return true, nil
	})
	require.NoError(t, err, "not served: some of %v", want)
	return labels
}

// descName is a Desc's fully-qualified name (client_golang has no getter).
func descName(d *prometheus.Desc) string {
	s := d.String()
	_, rest, _ := strings.Cut(s, `fqName: "`)
	name, _, _ := strings.Cut(rest, `"`)
	return name
}

// selector is one vector selector of a PromQL expression: the metric and
// the label names its matchers use.
type selector struct {
	name   string
	labels []string
}

// promqlSelectors lists the vector selectors of a PromQL expression. The
// parser made for this (github.com/prometheus/prometheus/promql/parser) is
// served, but not light: it imports Prometheus' TSDB packages, and
// requiring it raises the go directive and some twenty modules the project
// pins (tried with "go get" on a copy of go.mod). The alerts use a small
// part of PromQL, so this reads that part: strings, label matchers, range
// brackets, numbers and durations, keywords and the label lists after
// by/without/on/ignoring/group_left/group_right, function calls; whatever
// else names something is a metric. What it does not know — a selector
// without a metric name, an unbalanced bracket — is an error, not a guess.
func promqlSelectors(expr string) ([]selector, error) {
	var out []selector
	i := 0
	skipSpace := func() {
		for i < len(expr) && strings.ContainsRune(" \t\r\n", rune(expr[i])) {
			i++
		}
	}
	skipString := func() error {
		q := expr[i]
		for i++; i < len(expr); i++ {
			switch {
			case expr[i] == '\\' && q != '`':
				i++
			case expr[i] == q:
				i++
				return nil
			}
		}
		return fmt.Errorf("unterminated string in %q", expr)
	}
	ident := func() string {
		j := i
		for i < len(expr) && (isIdentStart(expr[i]) || i > j && expr[i] >= '0' && expr[i] <= '9') {
			i++
		}
		return expr[j:i]
	}
	skipGroup := func(open, close byte) error {
		depth := 0
		for ; i < len(expr); i++ {
			switch expr[i] {
			case open:
				depth++
			case close:
				if depth--; depth == 0 {
					i++
					return nil
				}
			}
		}
		return fmt.Errorf("unbalanced %c in %q", open, expr)
	}
	matchers := func() ([]string, error) {
		var names []string
		i++ // {
		for {
			skipSpace()
			if i < len(expr) && expr[i] == '}' {
				i++
				return names, nil
			}
			if i >= len(expr) || !isIdentStart(expr[i]) {
				return nil, fmt.Errorf("label matcher expected at %d in %q", i, expr)
			}
			names = append(names, ident())
			skipSpace()
			for i < len(expr) && strings.ContainsRune("=!~", rune(expr[i])) {
				i++
			}
			skipSpace()
			if i >= len(expr) || !strings.ContainsRune("\"'`", rune(expr[i])) {
				return nil, fmt.Errorf("label value expected at %d in %q", i, expr)
			}
			if err := skipString(); err != nil {
				return nil, err
			}
			skipSpace()
			if i < len(expr) && expr[i] == ',' {
				i++
			}
		}
	}
	for skipSpace(); i < len(expr); skipSpace() {
		c := expr[i]
		switch {
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case strings.ContainsRune("\"'`", rune(c)):
			if err := skipString(); err != nil {
				return nil, err
			}
		case c == '{':
			return nil, fmt.Errorf("a selector without a metric name in %q", expr)
		case c == '[':
			if err := skipGroup('[', ']'); err != nil {
				return nil, err
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdentStart(expr[i]) || expr[i] >= '0' && expr[i] <= '9' || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			word := ident()
			skipSpace()
			lower := strings.ToLower(word)
			switch {
			case promqlLabelLists[lower]:
				if i < len(expr) && expr[i] == '(' {
					if err := skipGroup('(', ')'); err != nil {
						return nil, err
					}
				}
			case promqlKeywords[lower], i < len(expr) && expr[i] == '(':
				// An operator, an aggregation or a function.
			default:
				s := selector{name: word}
				if i < len(expr) && expr[i] == '{' {
					l, err := matchers()
					if err != nil {
						return nil, err
					}
					s.labels = l
				}
				out = append(out, s)
			}
		default:
			i++ // an operator or a bracket
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].name < out[b].name })
	return out, nil
}

func isIdentStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == ':'
}

var (
	promqlLabelLists = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}
	promqlKeywords   = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
		"inf": true, "nan": true, "sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
		"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}
)

// The extractor on the kinds of expression it must get right.
func TestPromQLSelectors(t *testing.T) {
	for expr, want := range map[string][]selector{
		`lvm_agent_lvmd_reachable == 0`: {{name: "lvm_agent_lvmd_reachable"}},
		`a > 0 unless on(namespace, pod) sum by (namespace, pod) (rate(b{result=~"created|deleted", kind!="x"}[15m] offset 5m)) > 0`: {
			{name: "a"}, {name: "b", labels: []string{"result", "kind"}}},
		`max without(device) (x{state='a,b}'}) / ignoring(node) group_left(device) y > bool 1e-3 # c`: {{name: "x", labels: []string{"state"}}, {name: "y"}},
		`sum(rate(z[5m:1m])) or vector(0)`:             {{name: "z"}},
		`absent(up{job="lvm-agent-provisioner"} == 1)`: {{name: "up", labels: []string{"job"}}},
	} {
		got, err := promqlSelectors(expr)
		require.NoError(t, err, expr)
		assert.Equal(t, want, got, expr)
	}
	for _, bad := range []string{`{__name__="x"}`, `x{a="b"`, `rate(x[5m)`, `x{a=b}`} {
		_, err := promqlSelectors(bad)
		assert.Error(t, err, bad)
	}
}
