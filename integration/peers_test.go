package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The peer of make bench-peers (docs/bench-peers.md).
const (
	topolvmVersion   = "v0.41.0"
	topolvmNamespace = "topolvm-system"
	kubeletDir       = "/var/lib/kubelet"
	topolvmSocket    = kubeletDir + "/plugins/topolvm.io/node/csi-topolvm.sock"
)

// The guest's images of the peer (scripts/peers/topolvm-build.sh).
var (
	peerTopoLVM     = "localhost/peers/topolvm:guest"
	peerProvisioner = "localhost/peers/csi-provisioner:guest"
	peerResizer     = "localhost/peers/csi-resizer:guest"
	peerSidecars    = "localhost/peers/csi-sidecars:guest" // our registrar and probe
)

// TopoLVM's own chart, rendered by scripts/peers/topolvm-render.sh as the
// guest gets it: the settings the bench needs and no other, every pod on
// the guest's images, and the API server takes every object (server-side
// apply, dry run, strict field validation).
func TestTopoLVMChart(t *testing.T) {
	cmd := exec.Command(filepath.Join("..", "scripts", "peers", "topolvm-render.sh"))
	cmd.Env = append(os.Environ(), "TOPOLVM_VERSION="+topolvmVersion)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "topolvm-render.sh: %s", stderr.String())
	objs := decodeManifests(t, "topolvm-render.sh", bytes.NewReader(out))

	require.NotEmpty(t, objs)
	assert.Equal(t, "Namespace", objs[0].GetKind(), "the namespace first: kubectl apply makes it before its objects")
	assert.Equal(t, topolvmNamespace, objs[0].GetName())
	for _, o := range objs {
		// No scheduler extender, no webhook, nothing of cert-manager.
		assert.NotContains(t, o.GetName(), "scheduler", "%s %s", o.GetKind(), o.GetName())
		assert.NotContains(t, []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}, o.GetKind(), o.GetName())
		assert.False(t, strings.HasPrefix(o.GetAPIVersion(), "cert-manager.io/"), "%s %s", o.GetKind(), o.GetName())
		if o.GetKind() != "Namespace" && o.GetNamespace() != "" {
			assert.Equal(t, topolvmNamespace, o.GetNamespace(), "%s %s", o.GetKind(), o.GetName())
		}
		checkPeerImages(t, o)
	}

	checkTopoLVMController(t, deployTyped[appsv1.Deployment](t, deployFind(t, objs, "Deployment", "topolvm-controller")))
	checkTopoLVMNode(t, deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "topolvm-node")))
	checkTopoLVMLVMD(t, objs)

	csi := deployTyped[storagev1.CSIDriver](t, deployFind(t, objs, "CSIDriver", "topolvm.io"))
	assert.Equal(t, ptrTo(true), csi.Spec.StorageCapacity, "storage capacity tracking on (the chart's default)")
	sc := deployTyped[storagev1.StorageClass](t, deployFind(t, objs, "StorageClass", "topolvm-provisioner"))
	assert.Equal(t, "topolvm.io", sc.Provisioner)
	assert.Equal(t, ptrTo(storagev1.VolumeBindingWaitForFirstConsumer), sc.VolumeBindingMode)
	assert.Equal(t, ptrTo(true), sc.AllowVolumeExpansion)

	// Its CRD is the module's config/crd/bases one; the legacy group's is not there.
	module, err := exec.Command("go", "mod", "download", "-json", "github.com/topolvm/topolvm@"+topolvmVersion).Output()
	require.NoError(t, err)
	var dl struct{ Dir string }
	require.NoError(t, json.Unmarshal(module, &dl))
	crds := readManifests(t, filepath.Join(dl.Dir, "config", "crd", "bases", "topolvm.io_logicalvolumes.yaml"))
	require.Len(t, crds, 1)
	assert.Equal(t, crds[0].Object, deployFind(t, objs, "CustomResourceDefinition", "logicalvolumes.topolvm.io").Object)
	for _, o := range objs {
		assert.NotEqual(t, "logicalvolumes.topolvm.cybozu.com", o.GetName())
	}

	dryRunApply(t, objs)
}

// Every container of every pod runs one of the guest's images of the peer,
// never pulled, and its liveness probe, if any, waits 10 s.
func checkPeerImages(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	containers, found, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	require.NoError(t, err)
	if !found {
		return
	}
	for _, c := range containers {
		c := c.(map[string]any)
		assert.Contains(t, []string{peerTopoLVM, peerProvisioner, peerResizer, peerSidecars}, c["image"], "%s %s: %s", o.GetKind(), o.GetName(), c["name"])
		assert.Equal(t, "Never", c["imagePullPolicy"], "%s %s: %s", o.GetKind(), o.GetName(), c["name"])
		if probe, ok := c["livenessProbe"].(map[string]any); ok {
			assert.EqualValues(t, 10, probe["timeoutSeconds"], "%s %s: %s: lvm-agent's probe timeout", o.GetKind(), o.GetName(), c["name"])
		}
	}
}

func containerNames(pod corev1.PodSpec) []string {
	var names []string
	for _, c := range pod.Containers {
		names = append(names, c.Name)
	}
	return names
}

// One replica, no webhook, capacity tracking on, no snapshotter, our probe.
func checkTopoLVMController(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	assert.Equal(t, ptrTo(int32(1)), d.Spec.Replicas)
	pod := d.Spec.Template.Spec
	assert.Equal(t, []string{"topolvm-controller", "csi-provisioner", "csi-resizer", "liveness-probe"}, containerNames(pod), "snapshots off: no csi-snapshotter")
	c := podContainer(t, pod, "topolvm-controller")
	assert.Equal(t, peerTopoLVM, c.Image)
	assert.Equal(t, "/topolvm-controller", c.Command[0])
	assert.Contains(t, c.Command, "--enable-webhooks=false")
	assert.Equal(t, peerProvisioner, podContainer(t, pod, "csi-provisioner").Image)
	assert.Contains(t, podContainer(t, pod, "csi-provisioner").Command, "--enable-capacity")
	assert.Equal(t, peerResizer, podContainer(t, pod, "csi-resizer").Image)
	probe := podContainer(t, pod, "liveness-probe")
	assert.Equal(t, peerSidecars, probe.Image)
	assert.Equal(t, []string{"/livenessprobe", "--csi-address=/run/topolvm/csi-topolvm.sock", "--http-endpoint=:9808"}, probe.Command)
}

// The node plugin under kubelet's real root, our registrar and probe beside it.
func checkTopoLVMNode(t *testing.T, ds *appsv1.DaemonSet) {
	t.Helper()
	pod := ds.Spec.Template.Spec
	assert.Equal(t, []string{"topolvm-node", "csi-registrar", "liveness-probe"}, containerNames(pod))
	node := podContainer(t, pod, "topolvm-node")
	assert.Equal(t, peerTopoLVM, node.Image)
	assert.Equal(t, []string{"/topolvm-node", "--csi-socket=" + topolvmSocket, "--lvmd-socket=/run/topolvm/lvmd.sock"}, node.Command)
	reg := podContainer(t, pod, "csi-registrar")
	assert.Equal(t, peerSidecars, reg.Image)
	assert.Equal(t, []string{"/csi-node-driver-registrar", "--csi-address=" + topolvmSocket,
		"--kubelet-registration-path=" + topolvmSocket, "--http-endpoint=:9809"}, reg.Command)
	require.NotNil(t, reg.Lifecycle)
	assert.Equal(t, "/bin/sh", reg.Lifecycle.PreStop.Exec.Command[0], "the sidecars' image has busybox's sh for it")
	probe := podContainer(t, pod, "liveness-probe")
	assert.Equal(t, peerSidecars, probe.Image)
	assert.Equal(t, "/livenessprobe", probe.Command[0])
	hostPaths := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	assert.Equal(t, kubeletDir+"/plugins_registry/", hostPaths["registration-dir"])
	assert.Equal(t, kubeletDir+"/pods/", hostPaths["pod-volumes-dir"])
	assert.Equal(t, kubeletDir+"/plugins/kubernetes.io/csi", hostPaths["csi-plugin-dir"])
}

// lvmd: its own DaemonSet and configuration, one device class on vg2 with
// no spare.
func checkTopoLVMLVMD(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	ds := deployTyped[appsv1.DaemonSet](t, deployFind(t, objs, "DaemonSet", "topolvm-lvmd-0"))
	pod := ds.Spec.Template.Spec
	assert.True(t, pod.HostPID, "lvmd runs the node's lvm in PID 1's namespaces")
	c := podContainer(t, pod, "lvmd")
	assert.Equal(t, peerTopoLVM, c.Image)
	assert.Equal(t, []string{"/lvmd"}, c.Command)

	cm := deployTyped[corev1.ConfigMap](t, deployFind(t, objs, "ConfigMap", "topolvm-lvmd-0"))
	var config struct {
		SocketName    string `json:"socket-name"`
		DeviceClasses []struct {
			Name        string  `json:"name"`
			VolumeGroup string  `json:"volume-group"`
			Default     bool    `json:"default"`
			SpareGB     *uint64 `json:"spare-gb"`
		} `json:"device-classes"`
	}
	strictYAML(t, []byte(cm.Data["lvmd.yaml"]), &config)
	assert.Equal(t, "/run/topolvm/lvmd.sock", config.SocketName)
	require.Len(t, config.DeviceClasses, 1)
	dc := config.DeviceClasses[0]
	assert.Equal(t, "vg2", dc.VolumeGroup, "TopoLVM's own VG; lvm-agent's is vg1")
	assert.True(t, dc.Default)
	require.NotNil(t, dc.SpareGB, "unset, lvmd keeps 10 GiB spare")
	assert.Equal(t, uint64(0), *dc.SpareGB)
}
