package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/provisioner"
)

type provisionerOptions struct {
	name, kubeconfig, namespace  string
	qps                          float64
	burst, workers, metricsPort  int
	timeout                      time.Duration
	leaderElection               bool
	leaseDuration, renewDeadline time.Duration
	capacityAnnotation           string
	publishCapacity              bool
}

func provisionerMain(args []string) int {
	fs := flag.NewFlagSet("lvm-agent provisioner", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: lvm-agent provisioner [flags]\n\nTurns PVCs of StorageClasses whose provisioner is --name into LVs (through the agent on the\nnode the scheduler picked) and local PVs; removes the LV of a released PV of reclaim policy Delete.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	o := provisionerOptions{}
	fs.StringVar(&o.name, "name", kube.DefaultProvisioner, "provisioner name: the StorageClasses' provisioner, the CSIDriver object's name (for capacity-aware scheduling) and the Lease's")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster config")
	fs.StringVar(&o.namespace, "namespace", firstEnv("POD_NAMESPACE", "LVM_AGENT_NAMESPACE"), "namespace of the Lease and the CSIStorageCapacity objects (default from $POD_NAMESPACE; required)")
	fs.Float64Var(&o.qps, "kube-api-qps", 50, "API server queries per second")
	fs.IntVar(&o.burst, "kube-api-burst", 100, "API server burst")
	fs.IntVar(&o.workers, "workers", controller.DefaultThreadiness, "claims and volumes handled in parallel")
	fs.DurationVar(&o.timeout, "timeout", time.Minute, "how long one attempt waits for the agent's answer; then provisioning continues in the background (the agent's create is idempotent)")
	fs.BoolVar(&o.leaderElection, "leader-election", true, "run only while holding the Lease, so that replicas never both act")
	fs.DurationVar(&o.leaseDuration, "leader-election-lease-duration", controller.DefaultLeaseDuration, "how long a standby waits before taking over a Lease that is not renewed")
	fs.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", controller.DefaultRenewDeadline, "how long the leader tries to renew before it gives up (and exits)")
	fs.IntVar(&o.metricsPort, "metrics-port", 8080, "serve the provisioner library's metrics on this port at /metrics (0: off)")
	fs.BoolVar(&o.publishCapacity, "publish-capacity", true, "keep one CSIStorageCapacity per node and StorageClass from the Node capacity annotation (the CSIDriver object must say storageCapacity: true for the scheduler to use them; with false, also set it false)")
	fs.StringVar(&o.capacityAnnotation, "node-capacity-annotation", kube.DefaultCapacityAnnotation, "Node annotation the agents publish their capacity in")
	var logs logFlags
	logs.addFlags(fs)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if err := logs.setup(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer klog.Flush()
	if err := runProvisioner(o); err != nil {
		klog.ErrorS(err, "lvm-agent provisioner failed")
		return 1
	}
	return 0
}

func runProvisioner(o provisionerOptions) error {
	if o.namespace == "" {
		return fmt.Errorf("--namespace is required (or set POD_NAMESPACE)")
	}
	client, err := newClient(o.kubeconfig, o.qps, o.burst)
	if err != nil {
		return err
	}
	ctx := signalContext()
	p := provisioner.New(client, provisioner.Config{Name: o.name, Timeout: o.timeout})
	pc := controller.NewProvisionController(ctx, client, o.name, p,
		controller.LeaderElection(false), // ours, below: one Lease for the claims and the capacity objects
		controller.Threadiness(o.workers),
		controller.AddFinalizer(true),
		controller.MetricsPort(int32(o.metricsPort)))
	run := func(ctx context.Context) {
		klog.InfoS("Starting lvm-agent provisioner", "name", o.name, "publishCapacity", o.publishCapacity)
		if o.publishCapacity {
			go provisioner.NewCapacity(client, o.name, o.namespace, o.capacityAnnotation).Run(ctx)
		}
		pc.Run(ctx)
	}
	if !o.leaderElection {
		run(ctx)
		return nil
	}
	return leaderElect(ctx, client, o, run)
}

// leaderElect runs run while this process holds the Lease named for the
// provisioner. Losing the Lease ends the process: a former leader must not
// keep writing beside the new one.
func leaderElect(ctx context.Context, client kubernetes.Interface, o provisionerOptions, run func(context.Context)) error {
	host, _ := os.Hostname()
	id := host + "_" + string(uuid.NewUUID())
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.namespace, o.name,
		client.CoreV1(), client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return err
	}
	lost := make(chan struct{})
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true,
		LeaseDuration: o.leaseDuration, RenewDeadline: o.renewDeadline, RetryPeriod: controller.DefaultRetryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: run,
			OnStoppedLeading: func() { close(lost) },
			OnNewLeader:      func(leader string) { klog.InfoS("Leader", "identity", leader, "me", leader == id) },
		},
	})
	if ctx.Err() != nil {
		return nil // a signal: we released the Lease
	}
	<-lost
	return fmt.Errorf("lost the leader Lease %s/%s", o.namespace, o.name)
}
