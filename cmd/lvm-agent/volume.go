package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/lvm-agent/lvm-agent/kube"
)

// Exit codes of "lvm-agent volume".
const (
	exitOK           = 0
	exitError        = 1
	exitUsage        = 2
	exitFailed       = 3 // the agent answered "failed"
	exitInsufficient = 4 // ... with InsufficientCapacity
	exitTimeout      = 5
)

const volumeUsage = `Usage:
  lvm-agent volume create --namespace NS --pvc NAME --vg VG --size 1Gi [--name LV] [--tags a,b] [--timeout 5m]
  lvm-agent volume delete --pv NAME [--vg VG --lv LV] [--timeout 5m]
  lvm-agent volume status [--node NODE]

create and delete write the request and wait for the agent's answer, printing
every state change. Exit codes: 0 done, 1 error, 2 usage, 3 failed,
4 failed with InsufficientCapacity, 5 no answer before --timeout.
`

func volumeMain(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(os.Stderr, volumeUsage)
		return exitUsage
	}
	fs := flag.NewFlagSet("lvm-agent volume "+args[0], flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (default $KUBECONFIG; empty: in-cluster)")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the agent's answer")
	var cmd func(context.Context, kubernetes.Interface) error
	switch args[0] {
	case "create":
		ns := fs.String("namespace", "default", "PVC namespace")
		pvc := fs.String("pvc", "", "PVC name (required)")
		vg := fs.String("vg", "", "volume group (required)")
		size := fs.String("size", "", "size, e.g. 1Gi (required)")
		name := fs.String("name", "", "LV name (default pvc-<PVC UID>)")
		tags := fs.String("tags", "", "LVM tags, comma-separated")
		cmd = func(ctx context.Context, c kubernetes.Interface) error {
			q, err := resource.ParseQuantity(*size)
			if *pvc == "" || *vg == "" || err != nil {
				return usageError("create needs --pvc, --vg and a valid --size")
			}
			if *name == "" {
				obj, err := c.CoreV1().PersistentVolumeClaims(*ns).Get(ctx, *pvc, metav1.GetOptions{})
				if err != nil {
					return err
				}
				*name = "pvc-" + string(obj.UID)
			}
			spec := kube.CreateSpec{VolumeGroup: *vg, Name: *name, Size: q.Value(), Tags: splitList(*tags)}
			fmt.Printf("PVC %s/%s: requesting %s/%s (%d bytes)\n", *ns, *pvc, *vg, *name, spec.Size)
			return kube.CreateVolumeWithAnnotations(ctx, c, *ns, *pvc, spec, printState)
		}
	case "delete":
		pv := fs.String("pv", "", "PV name (required)")
		vg := fs.String("vg", "", "volume group (default: from the PV's spec annotation)")
		lv := fs.String("lv", "", "LV name (default: from the PV's spec annotation)")
		cmd = func(ctx context.Context, c kubernetes.Interface) error {
			if *pv == "" {
				return usageError("delete needs --pv")
			}
			if *vg == "" || *lv == "" {
				obj, err := c.CoreV1().PersistentVolumes().Get(ctx, *pv, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if *vg, *lv, err = kube.ParsePVSpec(obj.Annotations[kube.AnnSpec]); err != nil {
					return usageError("give --vg and --lv: " + err.Error())
				}
			}
			fmt.Printf("PV %s: requesting removal of %s/%s\n", *pv, *vg, *lv)
			return kube.DeleteVolumeWithAnnotations(ctx, c, *pv, *vg, *lv, printState)
		}
	case "status":
		node := fs.String("node", "", "only this node's requests")
		cmd = func(ctx context.Context, c kubernetes.Interface) error { return status(ctx, c, *node) }
	default:
		fmt.Fprint(os.Stderr, volumeUsage)
		return exitUsage
	}
	if err := fs.Parse(args[1:]); err != nil {
		return exitUsage
	}
	c, err := newClient(*kubeconfig, 50, 100)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitError
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	return exitCode(cmd(ctx, c))
}

type usageError string

func (e usageError) Error() string { return string(e) }

func exitCode(err error) int {
	var ue usageError
	var fe *kube.FailedError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "%v\n\n%s", err, volumeUsage)
		return exitUsage
	case errors.Is(err, kube.ErrInsufficientCapacity):
		fmt.Fprintln(os.Stderr, err)
		return exitInsufficient
	case errors.As(err, &fe):
		fmt.Fprintln(os.Stderr, err)
		return exitFailed
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintln(os.Stderr, "no answer before the timeout:", err)
		return exitTimeout
	}
	fmt.Fprintln(os.Stderr, err)
	return exitError
}

func printState(state, errMsg string) {
	ts := time.Now().Format("15:04:05.000")
	if errMsg != "" {
		fmt.Printf("%s  %s  (%s)\n", ts, state, errMsg)
		return
	}
	fmt.Printf("%s  %s\n", ts, state)
}

// status lists the volume requests the API server holds.
func status(ctx context.Context, c kubernetes.Interface, node string) error {
	pvcs, err := c.CoreV1().PersistentVolumeClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	pvs, err := c.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	type row struct{ object, node, state, spec, reason, errMsg string }
	var rows []row
	for i := range pvcs.Items {
		p := &pvcs.Items[i]
		if st := p.Annotations[kube.AnnLifecycle]; st != "" {
			rows = append(rows, row{"pvc/" + p.Namespace + "/" + p.Name, p.Annotations[kube.AnnSelectedNode], st, p.Annotations[kube.AnnSpec], p.Annotations[kube.AnnReason], p.Annotations[kube.AnnError]})
		}
	}
	for i := range pvs.Items {
		p := &pvs.Items[i]
		if st := p.Annotations[kube.AnnLifecycle]; st != "" {
			rows = append(rows, row{"pv/" + p.Name, p.Labels[kube.LabelNode], st, p.Annotations[kube.AnnSpec], p.Annotations[kube.AnnReason], p.Annotations[kube.AnnError]})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].object < rows[j].object })
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "OBJECT\tNODE\tSTATE\tREASON\tSPEC\tERROR")
	for _, r := range rows {
		if node != "" && r.node != node && r.node != kube.NodeLabelValue(node) {
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", r.object, r.node, r.state, r.reason, r.spec, r.errMsg)
	}
	return w.Flush()
}
