package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
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

	// The PodMonitor scrapes the agent's pods on the port the DaemonSet names.
	pm := deployFind(t, objs, "PodMonitor", "lvm-agent")
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, renderKustomization(t, filepath.Join(deployDir(), "base")), "DaemonSet", "lvm-agent"))
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	require.NotEmpty(t, sel)
	for k, v := range sel {
		assert.Equal(t, v, ds.Spec.Template.Labels[k], "PodMonitor selector %s", k)
	}
	endpoints, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
	require.Len(t, endpoints, 1)
	port := endpoints[0].(map[string]any)["port"]
	var ports []string
	for _, p := range podContainer(t, ds.Spec.Template.Spec, "lvm-agent").Ports {
		ports = append(ports, p.Name)
	}
	assert.Contains(t, ports, port, "the agent container's port names")

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
	for _, a := range []string{"LVMAgentLvmdUnreachable", "LVMAgentRequestsStuck", "LVMAgentThinPoolNearlyFull"} {
		assert.Contains(t, exprs, a)
	}

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
			if by := regexp.MustCompile(`^\s*\w+ by \(([^)]*)\)`).FindStringSubmatch(branch); by != nil {
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
		`sum(rate(z[5m:1m])) or vector(0)`: {{name: "z"}},
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
