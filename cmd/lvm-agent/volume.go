package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient"
	"github.com/lvm-agent/lvm-agent/lvmbackend/devmapper"
)

// Exit codes of "lvm-agent volume".
const (
	exitOK           = 0
	exitError        = 1
	exitUsage        = 2
	exitFailed       = 3 // the agent answered "failed"
	exitInsufficient = 4 // ... with InsufficientCapacity
	exitTimeout      = 5
	exitProblems     = 6 // "status" found mismatches
)

const volumeUsage = `Usage:
  lvm-agent volume create [-n NS] --pvc NAME --vg VG --size 1Gi [--name LV] [--tags a,b] [--timeout 5m]
  lvm-agent volume delete --pv NAME [--vg VG --lv LV] [--timeout 5m]
  lvm-agent volume status [--node NODE] [--backend topolvm|google-lvmd|none] [--lvmd-socket PATH] [--stuck-after 5m]
                          [--device-classes a,b] [--device-mapper-control /dev/mapper/control] [-o json|yaml|wide]
  lvm-agent volume COMMAND --help    the command's flags

Every command takes kubectl's connection flags: --kubeconfig (default
$KUBECONFIG, then ~/.kube/config, then in-cluster) and --context.

create and delete write the request and wait for the agent's answer, printing
every state change. Exit codes: 0 done, 1 error, 2 usage, 3 failed,
4 failed with InsufficientCapacity, 5 no answer before --timeout.

status shows the node's volume requests (API side) next to lvmd's LVs and
flags MISSING-LV (created PVC, no LV), ORPHAN-LV (an LV the orphan collector
would remove: lvm-agent's tag, and nothing refers to it), STUCK (creating/deleting for longer than
--stuck-after, or with a volume.error), LV-NOT-OURS, BAD-SPEC and
DEVICE-INACTIVE (created PVC whose LV device is not active, as
device-mapper says, or where it is not readable lvm's lv_attr). Where
device-mapper is readable (root on the node) the DEVICE column shows each
LV's device state and the pool space a thin LV maps, and the thin pools
holding the LVs are listed with their fill; a failed, read-only, full or
needs-check pool is a problem. Exit codes: 0 no problem, 1 error (lvmd
unreachable included), 6 problems found.
`

func volumeMain(args []string) int {
	switch {
	case len(args) == 0:
		fmt.Fprint(os.Stderr, volumeUsage)
		return exitUsage
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		fmt.Print(volumeUsage)
		return exitOK
	}
	fs := flag.NewFlagSet("lvm-agent volume "+args[0], flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: %s [flags]\n\nFlags:\n", fs.Name())
		printFlags(fs)
	}
	var kf kubeFlags
	kf.addFlags(fs, args[0] == "create")
	timeout := fs.Duration("timeout", 5*time.Minute, "how long to wait for the agent's answer")
	var cmd func(context.Context, apiclient.Interface) error
	switch args[0] {
	case "create":
		pvc := fs.String("pvc", "", "PVC name (required)")
		vg := fs.String("vg", "", "volume group (required)")
		size := fs.String("size", "", "size, e.g. 1Gi (required)")
		name := fs.String("name", "", "LV name (default pvc-<PVC UID>)")
		tags := fs.String("tags", "", "LVM tags, comma-separated")
		cmd = func(ctx context.Context, c apiclient.Interface) error {
			q, err := resource.ParseQuantity(*size)
			if *pvc == "" || *vg == "" || err != nil {
				return usageError("create needs --pvc, --vg and a valid --size")
			}
			ns, err := kf.ns()
			if err != nil {
				return err
			}
			if *name == "" {
				obj, err := c.PVCs(ns).Get(ctx, *pvc, metav1.GetOptions{})
				if err != nil {
					return err
				}
				*name = "pvc-" + string(obj.UID)
			}
			spec := kube.CreateSpec{VolumeGroup: *vg, Name: *name, Size: q.Value(), Tags: splitList(*tags)}
			fmt.Printf("PVC %s/%s: requesting %s/%s (%d bytes)\n", ns, *pvc, *vg, *name, spec.Size)
			return kube.CreateVolumeWithAnnotations(ctx, c, ns, *pvc, spec, printState)
		}
	case "delete":
		pv := fs.String("pv", "", "PV name (required)")
		vg := fs.String("vg", "", "volume group (default: from the PV's spec annotation)")
		lv := fs.String("lv", "", "LV name (default: from the PV's spec annotation)")
		cmd = func(ctx context.Context, c apiclient.Interface) error {
			if *pv == "" {
				return usageError("delete needs --pv")
			}
			if *vg == "" || *lv == "" {
				obj, err := c.PVs().Get(ctx, *pv, metav1.GetOptions{})
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
		o := statusOptions{}
		fs.StringVar(&o.node, "node", defaultNode(), "the node whose volumes to show (default $NODE_NAME, $KUBE_NODE_NAME, then the host name); with --backend none, empty shows every node's requests")
		fs.StringVar(&o.drivers, "driver-name", kube.DefaultDriver, "CSI driver(s) whose PVs the agent serves, comma-separated (as the agent's flag)")
		fs.StringVar(&o.deviceClassMap, "device-class-map", os.Getenv("LVM_AGENT_DEVICE_CLASS_MAP"), "volumeGroup=deviceClass pairs, as the agent's flag (default $LVM_AGENT_DEVICE_CLASS_MAP)")
		fs.DurationVar(&o.stuckAfter, "stuck-after", 5*time.Minute, "a creating/deleting request older than this is reported as stuck")
		o.backend.backendFlags.addFlags(fs, "topolvm, google-lvmd, or none (API side only)")
		fs.StringVar(&o.classes, "device-classes", "", "device classes (google/lvmd: volume groups) to list, comma-separated (default: all lvmd serves)")
		fs.StringVar(&o.dmControl, "device-mapper-control", devmapper.DefaultControlPath, "device-mapper control node, for the LVs' device state and thin-pool fill (empty or unreadable: not shown)")
		const outputUsage = "output format: empty (a table), wide (the table with the LV owner and device columns), json or yaml (the whole report)"
		fs.StringVar(&o.output, "output", "", outputUsage)
		fs.StringVar(&o.output, "o", "", outputUsage)
		o.backend.meta.addFlags(fs)
		cmd = func(ctx context.Context, c apiclient.Interface) error {
			o.backend.dmControl = o.dmControl // the direct LVM reader's too
			return status(ctx, c, o)
		}
	default:
		fmt.Fprint(os.Stderr, volumeUsage)
		return exitUsage
	}
	if code, ok := parseFlags(fs, args[1:]); !ok {
		return code
	}
	cfg, err := kf.restConfig()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return exitError
	}
	c, err := clientFor(cfg, 50, 100)
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
	case errors.Is(err, errProblems):
		return exitProblems
	case errors.Is(err, context.DeadlineExceeded) || wait.Interrupted(err):
		// watchtools.Until ends with wait's timeout error, not the context's.
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

// defaultNode is the node "status" looks at: the agent's own default, then
// the host name (which is the kubelet's default node name).
func defaultNode() string {
	if n := firstEnv("NODE_NAME", "KUBE_NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

func orAll(node string) string {
	if node == "" {
		return "(all)"
	}
	return node
}
