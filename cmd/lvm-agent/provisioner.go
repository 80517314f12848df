//go:build !nodeagent

package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient/clientset"
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
	publishCapacity, label       bool
	resize                       bool
	healthAddress                string
	nodeLoss                     string
	nodeLossGrace                time.Duration
}

func provisionerMain(args []string) int {
	fs := flag.NewFlagSet("lvm-agent provisioner", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: lvm-agent provisioner [flags]\n\nTurns PVCs of StorageClasses whose provisioner is --name into LVs (through the agent on the\nnode the scheduler picked) and local PVs; grows the LV when its claim asks for more; removes the LV of a released PV of reclaim policy Delete;\nreleases the claims of a node lost for good (--node-loss).\n\nFlags:\n")
		printFlags(fs)
	}
	o := provisionerOptions{}
	fs.StringVar(&o.name, "name", kube.DefaultProvisioner, "provisioner name: the StorageClasses' provisioner, the CSIDriver object's name (for capacity-aware scheduling) and the Lease's")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster config")
	fs.StringVar(&o.namespace, "namespace", firstEnv("POD_NAMESPACE", "LVM_AGENT_NAMESPACE"), "namespace of the Lease and the CSIStorageCapacity objects (default from $POD_NAMESPACE; required)")
	fs.Float64Var(&o.qps, "kube-api-qps", 50, "API server queries per second")
	fs.IntVar(&o.burst, "kube-api-burst", 100, "API server burst")
	// Each attempt holds its worker while it waits for the agent's answer
	// (up to --timeout): with the library's 4, a claim already answered
	// waited for a worker behind claims still waiting (BenchmarkPVCBurst).
	// csi-provisioner's --worker-threads is 100 for the same reason.
	fs.IntVar(&o.workers, "workers", 100, "claims and volumes handled in parallel (each waits for its agent's answer while it holds its worker)")
	fs.DurationVar(&o.timeout, "timeout", time.Minute, "how long one attempt waits for the agent's answer; then provisioning continues in the background (the agent's create is idempotent)")
	fs.BoolVar(&o.leaderElection, "leader-election", true, "run only while holding the Lease, so that replicas never both act")
	fs.DurationVar(&o.leaseDuration, "leader-election-lease-duration", controller.DefaultLeaseDuration, "how long a standby waits before taking over a Lease that is not renewed")
	fs.DurationVar(&o.renewDeadline, "leader-election-renew-deadline", controller.DefaultRenewDeadline, "how long the leader tries to renew before it gives up (and exits)")
	fs.IntVar(&o.metricsPort, "metrics-port", 8080, "serve the provisioner library's metrics on this port at /metrics, while leading (0: off)")
	fs.StringVar(&o.healthAddress, "health-address", ":8081", "serve /healthz, for the liveness and readiness probes, on this address from start, also while standing by (empty: off)")
	fs.BoolVar(&o.publishCapacity, "publish-capacity", true, "keep one CSIStorageCapacity per node and StorageClass from the Node capacity annotation (the CSIDriver object must say storageCapacity: true for the scheduler to use them; with false, also set it false)")
	fs.BoolVar(&o.label, "label-requests", true, "give the requests of provisioners that do not label (PVCs creating, PVs deleting, without "+kube.LabelNode+") the label of their node, while leading, so that hybrid-mode agents see them through their labelled watch")
	fs.BoolVar(&o.resize, "resize", true, "grow the local PVs it made when their claim asks for more (StorageClasses with allowVolumeExpansion), while leading, through the node's agent; kubelet then grows the filesystem online")
	fs.StringVar(&o.nodeLoss, "node-loss", "on", "on: release the claims of a node lost for good (tainted node.kubernetes.io/out-of-service, or its Node deleted and not back within --node-loss-grace), as each StorageClass's onNodeLoss says, while leading; off: never")
	fs.DurationVar(&o.nodeLossGrace, "node-loss-grace", provisioner.DefaultNodeLossGrace, "how long a deleted Node may take to register again under the same name before its node counts lost (a NotReady node never does)")
	fs.StringVar(&o.capacityAnnotation, "node-capacity-annotation", kube.DefaultCapacityAnnotation, "Node annotation the agents publish their capacity in (and the kind of clone they make, and whether they grow volumes, in each volume group)")
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

// controllerOptions: how the library's controller runs our provisioner.
func controllerOptions(o provisionerOptions) []func(*controller.ProvisionController) error {
	return []func(*controller.ProvisionController) error{
		controller.LeaderElection(false), // ours, below: one Lease for the claims and the capacity objects
		controller.Threadiness(o.workers),
		controller.AddFinalizer(true),
		// Save the PV of a created LV until the API server takes it, at
		// most a minute apart. With the library's default (5 tries, 10 s
		// apart) it gives up and calls Delete with a PV that was never
		// saved: our Delete reads that PV from the API server, finds none,
		// and the LV would leak once its claim is gone.
		controller.CreateProvisionedPVLimiter(workqueue.NewTypedItemExponentialFailureRateLimiter[string](100*time.Millisecond, time.Minute)),
		// Retry a claim or a volume until it is done, with the library's
		// backoff (15 s doubling to 1000 s), as csi-provisioner does. With
		// the library's default (15 failures) a claim whose agent had not
		// answered 15 attempts, e.g. while lvmd was away, was dropped and
		// waited for an unrelated update of the claim or the 15-minute
		// resync (bench-peers run 7, docs/runs/bench-peers.md).
		controller.FailedProvisionThreshold(0),
		controller.FailedDeleteThreshold(0),
		controller.MetricsPort(int32(o.metricsPort)),
	}
}

func runProvisioner(o provisionerOptions) error {
	if o.namespace == "" {
		return fmt.Errorf("--namespace is required (or set POD_NAMESPACE)")
	}
	if err := provisioner.CheckName(o.name); err != nil {
		return fmt.Errorf("--name: %w", err)
	}
	if o.nodeLoss != "on" && o.nodeLoss != "off" {
		return fmt.Errorf("--node-loss must be on or off, not %q", o.nodeLoss)
	}
	if o.nodeLossGrace <= 0 {
		return fmt.Errorf("--node-loss-grace must be positive, not %s", o.nodeLossGrace)
	}
	cfg, err := agentConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(tuned(rest.CopyConfig(cfg), o.qps, o.burst))
	if err != nil {
		return err
	}
	ctx := signalContext()
	// The leader's health is its Lease being renewed; a standby is healthy.
	health := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	if o.healthAddress != "" {
		if err := serveHealth(ctx, o.healthAddress, health); err != nil {
			return err
		}
	}
	var lost *provisioner.LostNodes
	if o.nodeLoss == "on" {
		lost = provisioner.NewLostNodes()
	}
	// One informer factory for all of the leader's controllers: each
	// claim, volume, Node and StorageClass is held once.
	factory := provisioner.NewInformers(client, o.capacityAnnotation)
	nodes := factory.Core().V1().Nodes().Lister()
	p := provisioner.New(client, provisioner.Config{Name: o.name, Timeout: o.timeout, CapacityAnnotation: o.capacityAnnotation, LostNodes: lost, Nodes: nodes})
	pc := controller.NewProvisionController(ctx, client, o.name, p, append(controllerOptions(o),
		controller.ClaimsInformer(factory.Core().V1().PersistentVolumeClaims().Informer()),
		controller.VolumesInformer(factory.Core().V1().PersistentVolumes().Informer()),
		controller.ClassesInformer(factory.Storage().V1().StorageClasses().Informer()))...)
	run := func(ctx context.Context) {
		klog.InfoS("Starting lvm-agent provisioner", "name", o.name, "publishCapacity", o.publishCapacity, "resize", o.resize,
			"nodeLoss", o.nodeLoss, "nodeLossGrace", o.nodeLossGrace)
		// Every controller adds its handlers to the factory before it
		// starts, once; each waits for the informers it reads.
		var controllers []func(context.Context)
		if lost != nil {
			// The library serves the default registry at --metrics-port.
			controllers = append(controllers, provisioner.NewNodeLoss(factory, p, o.nodeLossGrace, provisioner.NewNodeLossMetrics(prometheus.DefaultRegisterer)).Run)
		}
		if o.publishCapacity {
			controllers = append(controllers, provisioner.NewCapacity(client, factory, o.name, o.namespace, o.capacityAnnotation).Run)
		}
		// Clones are placed on their source's node before any Pod is.
		controllers = append(controllers, provisioner.NewPlacer(factory, p).Run)
		if o.resize {
			r := provisioner.NewResizer(client, provisioner.Config{Name: o.name, Timeout: o.timeout, CapacityAnnotation: o.capacityAnnotation, Nodes: nodes})
			controllers = append(controllers, provisioner.NewResizeController(client, factory, r, o.workers).Run)
		}
		// Until the Nodes have synced, Provision reads its Node from the API server.
		factory.Start(ctx.Done())
		defer factory.Shutdown()
		for _, c := range controllers {
			go c(ctx)
		}
		if o.label {
			// The library serves the default registry at --metrics-port.
			// Its Lease, beside the leader's, tells the hybrid-mode agents
			// that they need not watch the unlabelled objects themselves.
			// Its informers are its own: they hold the unlabelled requests
			// only, trimmed to stubs (kube.NewLabeller).
			host, _ := os.Hostname()
			ref := kube.LeaseRef{Namespace: o.namespace, Name: kube.LabellerLeaseName}
			go kube.NewLabeller(clientset.Wrap(client), prometheus.DefaultRegisterer).
				WithLease(provisioner.LabellerLease(client, ref, host)).Run(ctx, 2)
		}
		pc.Run(ctx)
	}
	if !o.leaderElection {
		run(ctx)
		return nil
	}
	// The Lease is renewed through a client of its own: behind the
	// controllers' requests in the shared client's rate limiter (a
	// recovering cluster's backlog) a renewal waited past its deadline, the
	// leader gave up its Lease and exited, again and again (the cluster
	// power cut, docs/runs/faults.md). A renewal is one request every
	// few seconds; its limiter never waits for the controllers' requests.
	leClient, err := kubernetes.NewForConfig(tuned(cfg, 5, 10))
	if err != nil {
		return err
	}
	return leaderElect(ctx, leClient, o, health, run)
}

// serveHealth serves /healthz on addr until ctx ends: 200 while the Lease,
// if this process leads, is renewed. It is not on the library's metrics
// port, which the library serves only once this replica leads: a standby's
// probes would fail there.
func serveHealth(ctx context.Context, addr string, health *leaderelection.HealthzAdaptor) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := health.Check(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return serveHTTP(ctx, "--health-address", addr, mux)
}

// leaderElect runs run while this process holds the Lease named for the
// provisioner. Losing the Lease ends the process: a former leader must not
// keep writing beside the new one.
func leaderElect(ctx context.Context, client kubernetes.Interface, o provisionerOptions, health *leaderelection.HealthzAdaptor,
	run func(context.Context)) error {
	host, _ := os.Hostname()
	id := host + "_" + string(uuid.NewUUID())
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, o.namespace, o.name,
		client.CoreV1(), client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return err
	}
	lost := make(chan struct{})
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, WatchDog: health,
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
