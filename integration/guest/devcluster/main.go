//go:build guest

// Command lvm-devcluster is the demo's stand-in for a cluster: it starts a
// real etcd + kube-apiserver (the integration harness's), and makes the
// objects a scheduler and a CSI provisioner would (a PVC with its selected
// node, a PV bound to it). It has no kubectl's generality on purpose.
//
//	lvm-devcluster up  --assets DIR --dir DIR [--timeout 480s]
//	lvm-devcluster pvc --kubeconfig F --namespace NS --name NAME --node NODE
//	lvm-devcluster pv  --kubeconfig F --name NAME --claim NS/NAME --node NODE --spec VG/LV
//
// "up" writes DIR/kubeconfig once the API server is ready, then runs until
// SIGTERM or SIGINT and stops etcd and kube-apiserver.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/lvm-agent/lvm-agent/integration/harness"
	"github.com/lvm-agent/lvm-agent/kube"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up(os.Args[2:])
	case "pvc":
		err = pvc(os.Args[2:])
	case "pv":
		err = pv(os.Args[2:])
	case "release":
		err = release(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lvm-devcluster:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: lvm-devcluster up|pvc|pv|release [flags] (-h for each)")
	os.Exit(2)
}

func up(args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	assets := fs.String("assets", os.Getenv("KUBEBUILDER_ASSETS"), "directory with etcd and kube-apiserver")
	dir := fs.String("dir", "", "where to write the kubeconfig (required)")
	timeout := fs.Duration("timeout", 480*time.Second, "how long the API server may take to be ready (TCG: 70-110 s, 235 s seen on a busy host)")
	_ = fs.Parse(args)
	if *dir == "" {
		return fmt.Errorf("up: --dir is required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	start := time.Now()
	// envtest logs through controller-runtime, which complains (with a stack) when no logger is set.
	ctrllog.SetLogger(klog.NewKlogr())
	cp, err := harness.StartDevCluster(*assets, *dir, *timeout)
	if err != nil {
		return err
	}
	fmt.Printf("lvm-devcluster: API server %s ready after %.1fs; kubeconfig %s\n", cp.Config.Host, time.Since(start).Seconds(), cp.Kubeconfig)
	<-ctx.Done()
	return cp.Env.Stop()
}

func client(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

func pvc(args []string) error {
	fs := flag.NewFlagSet("pvc", flag.ExitOnError)
	kc := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig")
	ns := fs.String("namespace", "default", "namespace")
	name := fs.String("name", "", "PVC name (required)")
	node := fs.String("node", "", "selected node, as the scheduler sets it (required)")
	_ = fs.Parse(args)
	if *name == "" || *node == "" {
		return fmt.Errorf("pvc: --name and --node are required")
	}
	c, err := client(*kc)
	if err != nil {
		return err
	}
	ctx := context.Background()
	_, err = c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: *ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	out, err := c.CoreV1().PersistentVolumeClaims(*ns).Create(ctx, harness.NewPVC(*ns, *name, *node), metav1.CreateOptions{})
	if err != nil {
		return err
	}
	fmt.Printf("persistentvolumeclaim/%s created in %s: uid %s, %s=%s\n", out.Name, out.Namespace, out.UID, kube.AnnSelectedNode, *node)
	return nil
}

func pv(args []string) error {
	fs := flag.NewFlagSet("pv", flag.ExitOnError)
	kc := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig")
	name := fs.String("name", "", "PV name (required)")
	claim := fs.String("claim", "", "NAMESPACE/NAME of the PVC it is bound to (required)")
	node := fs.String("node", "", "node of its node affinity (required)")
	spec := fs.String("spec", "", "volume.spec annotation, VG/LV (required)")
	driver := fs.String("driver", kube.DefaultDriver, "CSI driver")
	_ = fs.Parse(args)
	ns, cname, ok := strings.Cut(*claim, "/")
	if *name == "" || !ok || *node == "" || *spec == "" {
		return fmt.Errorf("pv: --name, --claim NS/NAME, --node and --spec are required")
	}
	c, err := client(*kc)
	if err != nil {
		return err
	}
	ctx := context.Background()
	pvc, err := c.CoreV1().PersistentVolumeClaims(ns).Get(ctx, cname, metav1.GetOptions{})
	if err != nil {
		return err
	}
	out, err := c.CoreV1().PersistentVolumes().Create(ctx, harness.NewPV(*name, *node, *driver, pvc, *spec), metav1.CreateOptions{})
	if err != nil {
		return err
	}
	fmt.Printf("persistentvolume/%s created: bound to %s (uid %s), node affinity %s, %s=%s\n", out.Name, *claim, pvc.UID, *node, kube.AnnSpec, *spec)
	return nil
}

// release does what a cluster does before it asks for a PV's volume to be
// deleted: the PV's claim is deleted (its pvc-protection finalizer dropped,
// as the controller would with no pod using it), then the PV is marked
// Released (the PV controller's job; a lone API server has none). The agent
// refuses the delete of a PV whose claim still exists.
func release(args []string) error {
	fs := flag.NewFlagSet("release", flag.ExitOnError)
	kc := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig")
	name := fs.String("pv", "", "PV name (required)")
	timeout := fs.Duration("timeout", time.Minute, "how long the claim may take to go")
	_ = fs.Parse(args)
	if *name == "" {
		return fmt.Errorf("release: --pv is required")
	}
	c, err := client(*kc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	pv, err := c.CoreV1().PersistentVolumes().Get(ctx, *name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	ref := pv.Spec.ClaimRef
	if ref == nil {
		return fmt.Errorf("release: PV %s has no claimRef", *name)
	}
	if err := harness.RemoveClaim(ctx, c, ref.Namespace, ref.Name, ref.UID); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	pv.Status.Phase = corev1.VolumeReleased
	if _, err := c.CoreV1().PersistentVolumes().UpdateStatus(ctx, pv, metav1.UpdateOptions{}); err != nil {
		return err
	}
	fmt.Printf("persistentvolumeclaim/%s deleted from %s; persistentvolume/%s is Released\n", ref.Name, ref.Namespace, pv.Name)
	return nil
}
