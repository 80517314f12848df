package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	lvmdtypes "github.com/topolvm/topolvm/pkg/lvmd/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/provisioner"
)

// deployDir is the repository's deploy/ ($LVM_AGENT_DEPLOY_DIR to test a copy).
func deployDir() string {
	if d := os.Getenv("LVM_AGENT_DEPLOY_DIR"); d != "" {
		return d
	}
	return filepath.Join("..", "deploy")
}

// The kustomize base and overlay, rendered and applied to the real API
// server with a server-side dry run and strict field validation.
func TestDeployManifests(t *testing.T) {
	for _, tc := range []struct {
		dir       string
		check     func(t *testing.T, objs []*unstructured.Unstructured)
		agentless bool // the cluster side alone: no DaemonSet
	}{
		{"base", checkSidecar, false},
		{"overlays/host-lvmd", checkHostLVMD, false},
		{"overlays/clones", checkClones, false},
		{"overlays/controller", checkController, true},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			objs := renderKustomization(t, filepath.Join(deployDir(), tc.dir))
			if !tc.agentless {
				checkCommon(t, objs)
				checkChartProvisioner(t, objs) // the chart's checks hold for deploy/ too
			}
			tc.check(t, objs)
			dryRunApply(t, objs)
		})
	}
}

// checkController: deploy/overlays/controller, the cluster side for nodes
// whose agent is a host service (deploy/systemd), is deploy/base without
// the DaemonSet, its ConfigMaps and the admission policy lvm-agent-node
// (which would refuse a Pod-less token's Node updates); everything else
// is deploy/base's, unchanged: the provisioner, its CSIDriver, the
// protocol's policy, the Namespace and the agent's RBAC.
func checkController(t *testing.T, objs []*unstructured.Unstructured) {
	id := func(o *unstructured.Unstructured) string { return o.GetKind() + " " + o.GetName() }
	got, ids := map[string]*unstructured.Unstructured{}, []string{}
	for _, o := range objs {
		got[id(o)] = o
		ids = append(ids, id(o))
	}
	slices.Sort(ids)
	dropped := map[string]bool{"DaemonSet lvm-agent": true,
		"ValidatingAdmissionPolicy lvm-agent-node": true, "ValidatingAdmissionPolicyBinding lvm-agent-node": true}
	want := 0
	for _, b := range renderKustomization(t, filepath.Join(deployDir(), "base")) {
		if dropped[id(b)] || b.GetKind() == "ConfigMap" {
			assert.NotContains(t, ids, id(b), "dropped")
			continue
		}
		want++
		if assert.Contains(t, ids, id(b), "deploy/base's") {
			assert.Equal(t, b.Object, got[id(b)].Object, "%s as deploy/base has it", id(b))
		}
	}
	assert.Len(t, ids, want, "nothing but deploy/base's objects")
	for _, o := range objs {
		assert.NotEqual(t, "DaemonSet", o.GetKind(), "no agent Pods: the agents run on the hosts")
	}
	checkProvisioner(t, objs)
	for _, must := range []string{"Namespace lvm-agent", "ServiceAccount lvm-agent", "ClusterRole lvm-agent", "ClusterRoleBinding lvm-agent",
		"Role lvm-agent", "RoleBinding lvm-agent", "Role lvm-agent-keys", "RoleBinding lvm-agent-keys",
		"ValidatingAdmissionPolicy lvm-agent-protocol", "ValidatingAdmissionPolicyBinding lvm-agent-protocol", "CSIDriver lvm.lvm-agent.io"} {
		assert.Contains(t, ids, must)
	}
}

// The examples the README tells users to apply: each object decodes
// strictly, the classes are ones the provisioner serves and accepts, the
// claims name an example class, and the real API server takes them all
// (server-side dry run, strict field validation; namespaced objects in
// "default", as kubectl apply -f puts them).
func TestDeployExamples(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(deployDir(), "examples", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	classes := map[string]bool{}
	var claims []*corev1.PersistentVolumeClaim
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			require.NoError(t, err)
			objs := decodeManifests(t, f, bytes.NewReader(data))
			require.NotEmpty(t, objs)
			for _, o := range objs {
				switch o.GetKind() {
				case "StorageClass":
					sc := deployTyped[storagev1.StorageClass](t, o)
					assert.Equal(t, kube.DefaultProvisioner, sc.Provisioner)
					assert.Equal(t, ptrTo(storagev1.VolumeBindingWaitForFirstConsumer), sc.VolumeBindingMode)
					_, err := provisioner.ParseParams(sc.Parameters)
					assert.NoError(t, err, "StorageClass %s", sc.Name)
					classes[sc.Name] = true
				case "PersistentVolumeClaim":
					claims = append(claims, deployTyped[corev1.PersistentVolumeClaim](t, o))
					o.SetNamespace(metav1.NamespaceDefault)
				case "Pod":
					deployTyped[corev1.Pod](t, o)
					o.SetNamespace(metav1.NamespaceDefault)
				default:
					t.Errorf("%s %s: a kind this test does not know; add it", o.GetKind(), o.GetName())
				}
			}
			dryRunApply(t, objs)
		})
	}
	require.NotEmpty(t, claims)
	for _, c := range claims {
		require.NotNil(t, c.Spec.StorageClassName, "claim %s", c.Name)
		assert.True(t, classes[*c.Spec.StorageClassName], "claim %s names class %s, which no example defines", c.Name, *c.Spec.StorageClassName)
	}
}

func checkCommon(t *testing.T, objs []*unstructured.Unstructured) {
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
	assert.Equal(t, "lvm-agent", ds.Namespace)
	pod := ds.Spec.Template.Spec
	checkBlockDevices(t, objs)

	// The service account exists and is bound to a ClusterRole.
	deployFind(t, objs, "ServiceAccount", pod.ServiceAccountName)
	bound := false
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		crb := deployTyped[rbacv1.ClusterRoleBinding](t, o)
		for _, s := range crb.Subjects {
			bound = bound || s.Kind == "ServiceAccount" && s.Name == pod.ServiceAccountName && s.Namespace == ds.Namespace
		}
	}
	assert.True(t, bound, "a ClusterRoleBinding binds ServiceAccount %s/%s", ds.Namespace, pod.ServiceAccountName)

	// Every ConfigMap reference resolves.
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		for _, e := range c.Env {
			if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil {
				cm := deployTyped[corev1.ConfigMap](t, deployFind(t, objs, "ConfigMap", r.ConfigMapKeyRef.Name))
				assert.Contains(t, cm.Data, r.ConfigMapKeyRef.Key, "env %s", e.Name)
			}
		}
	}
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil {
			deployFind(t, objs, "ConfigMap", v.ConfigMap.Name)
		}
	}

	// The agent's arguments are flags the binary knows, and its socket
	// directory is mounted.
	agentC := podContainer(t, pod, "lvm-agent")
	env := map[string]string{"NODE_NAME": "node-1"}
	for _, e := range agentC.Env {
		if r := e.ValueFrom; r != nil && r.ConfigMapKeyRef != nil {
			env[e.Name] = deployTyped[corev1.ConfigMap](t, deployFind(t, objs, "ConfigMap", r.ConfigMapKeyRef.Name)).Data[r.ConfigMapKeyRef.Key]
		}
	}
	args := expandKube(t, agentC.Args, env)
	checkAgentFlags(t, args)
	if flagValue(args, "backend") != "google-lvmd" { // which dials TCP
		socket := flagValue(args, "lvmd-socket")
		require.NotEmpty(t, socket, "--lvmd-socket")
		assert.Equal(t, filepath.Dir(socket), podMountPath(t, agentC, "lvmd-socket"))
	}
	assert.Equal(t, "ghcr.io/lvm-agent/lvm-agent:dev", agentC.Image)
	require.NotNil(t, agentC.ReadinessProbe)
	assert.Equal(t, "/readyz", agentC.ReadinessProbe.HTTPGet.Path)
}

func checkSidecar(t *testing.T, objs []*unstructured.Unstructured) {
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
	pod := ds.Spec.Template.Spec
	assert.True(t, pod.HostPID, "lvmd runs lvm through nsenter into PID 1")
	lvmd := podContainer(t, pod, "lvmd")
	require.NotNil(t, lvmd.SecurityContext)
	assert.Equal(t, ptrTo(true), lvmd.SecurityContext.Privileged)
	assert.Equal(t, "/run/topolvm", podMountPath(t, lvmd, "lvmd-socket"))
	assert.NotNil(t, podVolume(t, pod, "lvmd-socket").EmptyDir, "the socket is private to the pod")
	// lvmd is a sidecar: kubelet starts it before the agent, whose
	// requests all wait for it, and stops it after the agent.
	require.Len(t, pod.InitContainers, 1)
	assert.Equal(t, "lvmd", pod.InitContainers[0].Name)
	assert.Equal(t, ptrTo(corev1.ContainerRestartPolicyAlways), lvmd.RestartPolicy, "lvmd a sidecar")
	require.Len(t, pod.Containers, 1)
	assert.Equal(t, "lvm-agent", pod.Containers[0].Name)

	// lvmd's configuration parses with lvmd's own types and serves the
	// socket the agent dials.
	cm := deployTyped[corev1.ConfigMap](t, deployFind(t, objs, "ConfigMap", podVolume(t, pod, "lvmd-config").ConfigMap.Name))
	var cfg struct {
		SocketName            string                           `json:"socket-name"`
		DeviceClasses         []*lvmdtypes.DeviceClass         `json:"device-classes"`
		LvcreateOptionClasses []*lvmdtypes.LvcreateOptionClass `json:"lvcreate-option-classes"`
		LVMCommandPrefix      []string                         `json:"lvm-command-prefix"`
	}
	strictYAML(t, []byte(cm.Data["lvmd.yaml"]), &cfg)
	assert.Equal(t, flagValue(podContainer(t, pod, "lvm-agent").Args, "lvmd-socket"), cfg.SocketName)
	assert.Equal(t, "/etc/topolvm", podMountPath(t, lvmd, "lvmd-config"))
	require.NotEmpty(t, cfg.DeviceClasses)
	for _, dc := range cfg.DeviceClasses {
		assert.NotEmpty(t, dc.Name)
		assert.NotEmpty(t, dc.VolumeGroup)
		assert.NotNil(t, dc.SpareGB, "spare-gb set (lvmd keeps 10 GiB free when it is not)")
	}
}

// checkBlockDevices: every agent may write the LVs' block devices (it
// zeroes a thick LV before its removal, issue 64, and copies thick clones):
// privileged, with the host's /dev, so new LVs' devices appear in it.
func checkBlockDevices(t *testing.T, objs []*unstructured.Unstructured) {
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
	pod := ds.Spec.Template.Spec
	agentC := podContainer(t, pod, "lvm-agent")
	require.NotNil(t, agentC.SecurityContext)
	assert.Equal(t, ptrTo(true), agentC.SecurityContext.Privileged)
	assert.Equal(t, "/dev", podMountPath(t, agentC, "host-dev"))
	v := podVolume(t, pod, "host-dev")
	require.NotNil(t, v.HostPath)
	assert.Equal(t, "/dev", v.HostPath.Path)
}

// checkThickClones: an agent with room for thick clones (the chart's
// agent.thickClones, deploy/components/thick-clones). Beside an lvmd
// sidecar it also reads the LVM metadata directly: lvmd's config where
// --lvmd-config looks, and the host's /etc/lvm (its devices file).
func checkThickClones(t *testing.T, objs []*unstructured.Unstructured) {
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
	pod := ds.Spec.Template.Spec
	agentC := podContainer(t, pod, "lvm-agent")
	// Room for eight copies' buffers at once (make bench-memory).
	assert.Equal(t, "400Mi", agentC.Resources.Limits.Memory().String(), "the agent's memory limit with thick clones")
	if !slices.ContainsFunc(pod.InitContainers, func(c corev1.Container) bool { return c.Name == "lvmd" }) {
		return
	}
	for volume, path := range map[string]string{"lvmd-config": "/etc/topolvm", "host-lvm-config": "/etc/lvm"} {
		m := podMount(t, agentC, volume)
		assert.Equal(t, path, m.MountPath, volume)
		assert.True(t, m.ReadOnly, "%s read-only", volume)
	}
	v := podVolume(t, pod, "host-lvm-config")
	require.NotNil(t, v.HostPath)
	assert.Equal(t, "/etc/lvm", v.HostPath.Path)
}

// checkClones: deploy/overlays/clones, the sidecar deployment with a thin
// device class (thin clones) and thick clones.
func checkClones(t *testing.T, objs []*unstructured.Unstructured) {
	checkSidecar(t, objs)
	checkThickClones(t, objs)
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
	pod := ds.Spec.Template.Spec
	cm := deployTyped[corev1.ConfigMap](t, deployFind(t, objs, "ConfigMap", podVolume(t, pod, "lvmd-config").ConfigMap.Name))
	var cfg struct {
		SocketName    string                   `json:"socket-name"`
		DeviceClasses []*lvmdtypes.DeviceClass `json:"device-classes"`
	}
	strictYAML(t, []byte(cm.Data["lvmd.yaml"]), &cfg)
	kinds := map[string]string{}
	for _, dc := range cfg.DeviceClasses {
		kinds[dc.Name] = string(dc.Type)
	}
	assert.Equal(t, map[string]string{"vg1": "", "thin": "thin"}, kinds)
}

func checkHostLVMD(t *testing.T, objs []*unstructured.Unstructured) {
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
	pod := ds.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	assert.Empty(t, pod.InitContainers, "no lvmd sidecar")
	assert.False(t, pod.HostPID)
	v := podVolume(t, pod, "lvmd-socket")
	assert.Nil(t, v.EmptyDir)
	require.NotNil(t, v.HostPath)
	assert.Equal(t, "/run/topolvm", v.HostPath.Path)
	for _, v := range pod.Volumes {
		assert.NotEqual(t, "lvmd-config", v.Name)
	}
	for _, o := range objs {
		assert.False(t, o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "lvm-agent-lvmd"), "lvmd's ConfigMap is dropped")
	}
}

// The systemd unit's command line, with its environment file, is one the
// binary accepts.
func TestSystemdUnitFlags(t *testing.T) {
	dir := filepath.Join(deployDir(), "systemd")
	unit, err := os.ReadFile(filepath.Join(dir, "lvm-agent.service"))
	require.NoError(t, err)
	env := map[string]string{}
	f, err := os.Open(filepath.Join(dir, "lvm-agent.env"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		require.True(t, ok, "env line %q", line)
		env[k] = strings.Trim(v, `"`)
	}
	keys := map[string]string{}
	for _, l := range strings.Split(string(unit), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(l, "#") {
			keys[k] += " " + v
		}
	}
	require.NotEmpty(t, keys["ExecStart"])
	args := expandSystemd(t, strings.Fields(keys["ExecStart"])[1:], env)
	checkAgentFlags(t, args)
	assert.Contains(t, strings.Fields(keys["After"]), "lvmd.service")
	assert.Equal(t, "always", strings.TrimSpace(keys["Restart"]))
	assert.NotEmpty(t, keys["EnvironmentFile"])
	// A host service's /metrics is for the node itself unless the operator
	// opens it: loopback by default (issue 17).
	host, _, err := net.SplitHostPort(env["METRICS_ADDRESS"])
	require.NoError(t, err, "METRICS_ADDRESS=%q", env["METRICS_ADDRESS"])
	ip := net.ParseIP(host)
	assert.True(t, host == "localhost" || ip != nil && ip.IsLoopback(), "METRICS_ADDRESS=%q listens beyond loopback", env["METRICS_ADDRESS"])

	// The devices the agent opens, and no others: device-mapper's control
	// node (where --device-mapper-control looks) and block devices (the
	// LVs it zeroes, copies into and encrypts) read-write; every other
	// block device read-only (the direct LVM metadata reads scan them all).
	assert.Equal(t, "closed", strings.TrimSpace(keys["DevicePolicy"]))
	var allow []string
	for _, l := range strings.Split(string(unit), "\n") {
		if v, ok := strings.CutPrefix(l, "DeviceAllow="); ok {
			allow = append(allow, v)
		}
	}
	assert.ElementsMatch(t, []string{"/dev/mapper/control rw", "block-device-mapper rw", "block-* r"}, allow)
	if dm := flagValue(args, "device-mapper-control"); dm != "" {
		assert.Equal(t, "/dev/mapper/control", dm, "the node DeviceAllow opens")
	}
	assert.Equal(t, "/dev/mapper/control", binaryDefaults(t)["device-mapper-control"], "the node DeviceAllow opens")
}

// checkAgentFlags runs the agent binary with args and --help: it exits 0
// only if every flag before --help is one it knows.
func checkAgentFlags(t *testing.T, args []string) {
	t.Helper()
	out, err := exec.Command(agentBin, append(args, "--help")...).CombinedOutput()
	require.NoError(t, err, "lvm-agent %v: %s", args, out)
}

// expandKube expands $(VAR) as the kubelet does in container args.
func expandKube(t *testing.T, args []string, env map[string]string) []string {
	re := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	var out []string
	for _, a := range args {
		out = append(out, re.ReplaceAllStringFunc(a, func(m string) string {
			v, ok := env[re.FindStringSubmatch(m)[1]]
			assert.True(t, ok, "%s is not defined in the container's env", m)
			return v
		}))
	}
	return out
}

// expandSystemd expands ${VAR} (one word) and $VAR (split on white space),
// as systemd does in ExecStart.
func expandSystemd(t *testing.T, args []string, env map[string]string) []string {
	braced := regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)
	var out []string
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "$"); ok && !strings.HasPrefix(name, "{") {
			out = append(out, strings.Fields(env[name])...)
			continue
		}
		out = append(out, braced.ReplaceAllStringFunc(a, func(m string) string {
			v, ok := env[braced.FindStringSubmatch(m)[1]]
			assert.True(t, ok, "%s is not set in the environment file", m)
			return v
		}))
	}
	return out
}

func flagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
	}
	return ""
}

// renderKustomization renders dir with kustomize itself (kubectl's, built
// by scripts/kube-assets.sh next to the API server).
func renderKustomization(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	kubectl := filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	out, err := exec.Command(kubectl, "kustomize", dir).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		err = fmt.Errorf("%w: %s", err, exit.Stderr)
	}
	require.NoError(t, err, "kubectl kustomize %s (make test-integration builds kubectl)", dir)
	return decodeManifests(t, dir, bytes.NewReader(out))
}

// readManifests reads the YAML documents of one file.
func readManifests(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	return decodeManifests(t, path, f)
}

// decodeManifests reads a stream of YAML documents; name is for messages.
func decodeManifests(t *testing.T, name string, r io.Reader) []*unstructured.Unstructured {
	t.Helper()
	d := yaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []*unstructured.Unstructured
	seen := map[string]bool{}
	for {
		var m map[string]any
		err := d.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err, name)
		if m == nil {
			continue // an empty document
		}
		o := &unstructured.Unstructured{Object: m}
		require.NotEmpty(t, o.GetKind(), "%s: a document without kind", name)
		require.NotEmpty(t, o.GetName(), "%s: a %s without name", name, o.GetKind())
		id := o.GetAPIVersion() + "/" + o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
		require.False(t, seen[id], "%s: %s defined twice", name, id)
		seen[id] = true
		out = append(out, o)
	}
}

func strictYAML(t *testing.T, data []byte, into any) {
	t.Helper()
	j, err := yaml.ToJSON(data)
	require.NoError(t, err)
	d := json.NewDecoder(bytes.NewReader(j))
	d.DisallowUnknownFields()
	require.NoError(t, d.Decode(into))
}

// dryRunApply server-side applies every object with dryRun=All and strict
// field validation: the API server validates and admits them, stores nothing.
func dryRunApply(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	serverSideApply(t, cp, objs, metav1.DryRunAll)
}

// serverSideApply server-side applies every object to c with strict field
// validation, as "kubectl apply --server-side" would; dryRun, when not
// empty, is the dryRun option.
func serverSideApply(t *testing.T, c *harness.ControlPlane, objs []*unstructured.Unstructured, dryRun ...string) {
	t.Helper()
	ctx := context.Background()
	// Namespaced objects need their namespace to exist, even in a dry run.
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.GetName()}}, metav1.CreateOptions{})
			if !apierrors.IsAlreadyExists(err) {
				require.NoError(t, err)
			}
		}
	}
	dyn, err := dynamic.NewForConfig(c.Config)
	require.NoError(t, err)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Client.Discovery()))
	force := true
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		require.NoError(t, err, "%v", gvk)
		var r dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			require.NotEmpty(t, o.GetNamespace(), "%s %s has no namespace", gvk.Kind, o.GetName())
			r = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		} else if o.GetNamespace() != "" {
			// kustomize's built-in schema predates ValidatingAdmissionPolicy,
			// so its namespace transformer sets one on the policies; only
			// those may carry it, and the API server must drop it (below).
			require.Contains(t, []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, gvk.Kind,
				"%s %s is cluster-scoped but has namespace %q", gvk.Kind, o.GetName(), o.GetNamespace())
		}
		data, err := o.MarshalJSON()
		require.NoError(t, err)
		got, err := r.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			DryRun: dryRun, FieldManager: "lvm-agent-deploy-test", Force: &force,
			FieldValidation: metav1.FieldValidationStrict})
		require.NoError(t, err, "apply (dry run %v) of %s %s", dryRun, gvk.Kind, o.GetName())
		if m.Scope.Name() != "namespace" {
			require.Empty(t, got.GetNamespace(), "%s %s: the API server keeps no namespace on a cluster-scoped object", gvk.Kind, o.GetName())
		}
	}
}

func deployFind(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	require.FailNow(t, fmt.Sprintf("no %s %q rendered", kind, name))
	return nil
}

func deployTyped[T any](t *testing.T, o *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true))
	return out
}

// podContainer: the container or sidecar (init container) name.
func podContainer(t *testing.T, pod corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		if c.Name == name {
			return c
		}
	}
	require.FailNow(t, "no container "+name)
	return corev1.Container{}
}

func podVolume(t *testing.T, pod corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range pod.Volumes {
		if v.Name == name {
			return v
		}
	}
	require.FailNow(t, "no volume "+name)
	return corev1.Volume{}
}

func podMountPath(t *testing.T, c corev1.Container, volume string) string {
	t.Helper()
	return podMount(t, c, volume).MountPath
}

func podMount(t *testing.T, c corev1.Container, volume string) corev1.VolumeMount {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return m
		}
	}
	require.FailNow(t, fmt.Sprintf("container %s does not mount %s", c.Name, volume))
	return corev1.VolumeMount{}
}

// The ConfigMaps are generated with a content hash in their names, so a
// configuration change (here an overlay's merge) changes the DaemonSet's
// Pod template, which rolls the Pods.
func TestKustomizeConfigChangeRollsPods(t *testing.T) {
	base, err := filepath.Abs(filepath.Join(deployDir(), "base"))
	require.NoError(t, err)
	overlay := t.TempDir()
	rel, err := filepath.Rel(overlay, base) // kustomize refuses absolute bases
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - `+rel+`
configMapGenerator:
  - name: lvm-agent
    behavior: merge
    literals:
      - device-class-map=vg1=ssd
`), 0o644))
	ref := func(objs []*unstructured.Unstructured) (string, map[string]string) {
		ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "lvm-agent"))
		for _, e := range podContainer(t, ds.Spec.Template.Spec, "lvm-agent").Env {
			if e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil {
				name := e.ValueFrom.ConfigMapKeyRef.Name
				return name, deployTyped[corev1.ConfigMap](t, deployFind(t, objs, "ConfigMap", name)).Data
			}
		}
		require.FailNow(t, "the agent reads no ConfigMap")
		return "", nil
	}
	before, data := ref(renderKustomization(t, base))
	assert.Equal(t, "", data["device-class-map"])
	after, data := ref(renderKustomization(t, overlay))
	assert.Equal(t, "vg1=ssd", data["device-class-map"])
	assert.NotEqual(t, before, after, "the Pod template names the new ConfigMap")
	assert.True(t, strings.HasPrefix(after, "lvm-agent-"), after)
}
