// Command lvm-agent is the node agent: it answers volume lifecycle requests on
// PVCs and PVs with LVM operations through lvmd. "lvm-agent volume ..." is the
// operator CLI on the provisioner side of the protocol.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/agent"
	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "volume" {
		os.Exit(volumeMain(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "provisioner" {
		os.Exit(provisionerMain(os.Args[2:]))
	}
	os.Exit(agentMain(os.Args[1:]))
}

type options struct {
	nodeName, kubeconfig string
	qps                  float64
	burst                int
	backendFlags
	drivers, deviceClassMap, stripeClass string
	provisioners                         string
	watchMode                            string
	sweepInterval                        time.Duration
	labellerLease                        string
	relistSpread                         time.Duration
	contentType                          string
	workers, lvmdCalls                   int
	allowUntagged                        bool
	opTimeout, grace, readMaxAge         time.Duration
	metricsAddress                       string
	dmControl                            string
	capacityAnnotation                   string
	capacityMinChange                    float64
	wipeRate                             string
	keyNamespace                         string
	gc                                   gcOptions
	meta                                 metadataOptions
}

func agentMain(args []string) int {
	fs := flag.NewFlagSet("lvm-agent", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: lvm-agent [flags]               run the node agent\n       lvm-agent provisioner --help    the provisioner\n       lvm-agent volume --help         the operator CLI\n\nFlags:\n")
		printFlags(fs)
	}
	showVersion := fs.Bool("version", false, "print the version, commit and Go version, and exit")
	var logs logFlags
	o := options{}
	fs.StringVar(&o.nodeName, "node-name", firstEnv("NODE_NAME", "KUBE_NODE_NAME"), "this node's name (default from $NODE_NAME, then $KUBE_NODE_NAME)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster config")
	fs.Float64Var(&o.qps, "kube-api-qps", 200, "API server queries per second (each answer costs two writes, the patch and its Event: 50 would cap the agent at 25 volumes/s)")
	fs.IntVar(&o.burst, "kube-api-burst", 400, "API server burst")
	o.backendFlags.addFlags(fs, "topolvm (unix socket) or google-lvmd (TCP)")
	fs.StringVar(&o.drivers, "driver-name", kube.DefaultDriver, "CSI driver(s) whose PVs this agent serves, comma-separated")
	fs.StringVar(&o.provisioners, "provisioner-name", kube.DefaultProvisioner, "provisioner(s) whose local PVs (by "+kube.AnnProvisionedBy+") this agent serves, comma-separated")
	fs.StringVar(&o.deviceClassMap, "device-class-map", "", "volumeGroup=deviceClass pairs, comma-separated; a volume group not listed is the device class of the same name")
	fs.StringVar(&o.stripeClass, "striped-option-class", "", "lvmd lvcreate option class used for specs with \"striping\": true (empty: such specs fail)")
	fs.StringVar(&o.watchMode, "watch-mode", string(kube.WatchHybrid), "hybrid: watch objects labelled "+kube.LabelNode+"=<node> (filtered by the API server); where the provisioner's labeller runs (--labeller-lease held), it labels the requests of provisioners that do not, else this agent watches the unlabelled objects too; labelled: the labelled watch only (unlabelled requests are never seen); all: watch every PVC/PV and filter here (the original design: costs grow with the cluster)")
	fs.StringVar(&o.labellerLease, "labeller-lease", labellerLeaseDefault(), "hybrid mode: the Lease (NAMESPACE/NAME) that lvm-agent provisioner's labeller holds while it labels requests; absent or not renewed for "+kube.LabellerLeaseDuration.String()+", this agent watches the PVCs/PVs without the "+kube.LabelNode+" label itself (default: $POD_NAMESPACE, else lvm-agent, /"+kube.LabellerLeaseName+")")
	fs.DurationVar(&o.sweepInterval, "sweep-interval", 30*time.Minute, "hybrid mode: list all unlabelled PVCs/PVs at start and then this often, while the labeller's Lease is held, for requests it has not labelled (0: only at start)")
	fs.DurationVar(&o.relistSpread, "relist-spread", 10*time.Second, "delay each re-list of PVCs/PVs (after a watch that cannot resume, as when an API server restarts), and the hybrid mode's first list of the unlabelled ones, by a random time up to this, so that the agents of a cluster do not all list at once (0: off; the informers' first lists, which readiness waits for, are never delayed)")
	fs.StringVar(&o.contentType, "kube-api-content-type", "application/vnd.kubernetes.protobuf", "content type of API requests and responses (protobuf is about a third of JSON's bytes and cheaper to decode)")
	fs.IntVar(&o.workers, "workers", 8, "requests handled in parallel")
	fs.IntVar(&o.lvmdCalls, "lvmd-calls", agent.DefaultLVMDCalls, "calls into lvmd at once (each is lvm commands, and lvm serializes a volume group's writes: more only load the node)")
	fs.BoolVar(&o.allowUntagged, "allow-untagged-delete", false, "let deletes remove LVs without lvm-agent's ownership tag (volumes made by the original agent)")
	fs.DurationVar(&o.opTimeout, "op-timeout", 2*time.Minute, "bound on one lvmd call, from its turn (the wait behind --lvmd-calls not counted), and on one API call of a request")
	fs.DurationVar(&o.readMaxAge, "lvmd-list-max-age", agent.DefaultReadMaxAge, "with topolvm's lvmd: how long one listing of a device class, kept current with this agent's own writes, answers the creates that need it (it decides only that nothing is in the way, which lvcreate checks again: an LV it shows in the way, and a clone's source, are read afresh; a grow goes by it when the LV's device-mapper device confirms it; deletes always read afresh; after each answer, a listing older than half of it is read again in the background); 0 shares only the listings in flight")
	fs.DurationVar(&o.grace, "shutdown-grace", 30*time.Second, "on SIGTERM, how long in-flight operations may finish")
	fs.StringVar(&o.metricsAddress, "metrics-address", ":8495", "serve /metrics, /healthz and /readyz here (empty: off)")
	fs.StringVar(&o.dmControl, "device-mapper-control", "/dev/mapper/control", "device-mapper control node, to confirm LV devices and report thin-pool usage (empty: off; unreadable: noted once, then off)")
	fs.StringVar(&o.capacityAnnotation, "node-capacity-annotation", kube.DefaultCapacityAnnotation, "Node annotation kept up to date with each device class's size and free bytes (empty: off)")
	fs.Float64Var(&o.capacityMinChange, "node-capacity-min-change", agent.DefaultCapacityMinChange, "smallest change of a device class's free bytes written to the Node capacity annotation, as a fraction of the free bytes it shows (0: every change)")
	fs.StringVar(&o.keyNamespace, "key-namespace", kube.DefaultKeyNamespace, "the one namespace whose Secrets the agent reads encryption keys from (the Secrets encrypted classes name; the agent's Role there must allow get). Encryption needs device-mapper and the node's block devices too; without them, or with \"\", the Node publishes no \"encryption\" and encrypted classes are not made here")
	fs.StringVar(&o.wipeRate, "wipe-rate", "128Mi", "bytes per second, over all wipes at once, at which the agent zeroes a thick LV before it removes it, so that the node's running volumes keep their throughput (a quantity: 128Mi, 1Gi; 0: no bound). Wiping needs the node's block devices and device-mapper (privileged, the host's /dev); without them nothing is zeroed and the Node publishes no \"wipe\"")
	o.gc.addFlags(fs)
	o.meta.addFlags(fs)
	logs.addFlags(fs)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *showVersion {
		fmt.Print(versionString())
		return 0
	}
	if err := logs.setup(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer klog.Flush()

	if err := run(o); err != nil {
		klog.ErrorS(err, "lvm-agent failed")
		return 1
	}
	return 0
}

func run(o options) error {
	if o.nodeName == "" {
		return errors.New("--node-name is required (or set NODE_NAME)")
	}
	mode, err := kube.ParseWatchMode(o.watchMode)
	if err != nil {
		return fmt.Errorf("--watch-mode: %w", err)
	}
	classes, err := parsePairs(o.deviceClassMap)
	if err != nil {
		return fmt.Errorf("--device-class-map: %w", err)
	}
	if o.gc.max < 0 || o.gc.interval < 0 {
		return errors.New("--orphan-gc-max and --orphan-gc-interval must not be negative")
	}
	clientMetrics := kube.NewClientMetrics()
	client, err := newClient(o.kubeconfig, o.qps, o.burst, func(cfg *rest.Config) {
		clientMetrics.Instrument(cfg, o.contentType)
		cfg.Wrap(kube.RelistSpread(o.relistSpread))
	})
	if err != nil {
		return err
	}
	backend, err := newBackend(o)
	if err != nil {
		return err
	}
	defer backend.Close()

	ctx := signalContext()
	reg := prometheus.NewRegistry()
	if d, ok := backend.(*lvmbackend.Direct); ok {
		reg.MustRegister(d)
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewBuildInfoCollector())
	reg.MustRegister(clientMetrics)
	metrics := agent.NewMetrics(reg)
	recorder, stopEvents := kube.NewRecorder(client, "lvm-agent", o.nodeName)
	defer stopEvents()
	var devices *agent.Devices
	if o.dmControl != "" {
		devices = agent.OpenDevices(o.dmControl, reg)
	}
	wipeRate, err := resource.ParseQuantity(o.wipeRate)
	if err != nil || wipeRate.Sign() < 0 {
		return fmt.Errorf("--wipe-rate %q: not a quantity of bytes per second of 0 or more", o.wipeRate)
	}
	var wiper *agent.Wiper
	if devices != nil {
		wiper = agent.NewWiper(wipeRate.Value())
	} else {
		klog.InfoS("No device-mapper: deleted thick volumes are removed without being zeroed, and the Node says no class reads zeros (\"wipe\"), so classes with wipe: zero are not served here")
	}
	var crypt *agent.Crypt
	if devices != nil && o.keyNamespace != "" {
		crypt = devices.Crypt(o.keyNamespace)
	}
	node := withHostname(ctx, client, kube.Node{Name: o.nodeName, Drivers: splitList(o.drivers), Provisioners: splitList(o.provisioners)})
	inf := kube.NewInformers(client, o.nodeName, mode, kube.WithOwner(node), kube.WithMetrics(clientMetrics))
	a, err := agent.New(agent.Config{
		Node:          node,
		DeviceClasses: classes, StripedOptionClass: o.stripeClass, AllowUntagged: o.allowUntagged,
		Workers: o.workers, LVMDCalls: o.lvmdCalls, OpTimeout: o.opTimeout, Devices: devices, Wiper: wiper, Crypt: crypt,
		ShareReads: o.backend == "topolvm", ReadMaxAge: o.readMaxAge,
	}, client, backend, recorder, inf, metrics)
	if err != nil {
		return err
	}
	reg.MustRegister(agent.NewOpenRequestsCollector(a))
	startGC(ctx, o.gc, a, reg)
	if mode == kube.WatchHybrid {
		lease, err := kube.ParseLeaseRef(o.labellerLease)
		if err != nil {
			return fmt.Errorf("--labeller-lease: %w", err)
		}
		watch := kube.NewUnlabelledWatch(client, a, node, clientMetrics, reg)
		presence := kube.NewLabellerPresence(client, lease, watch)
		go presence.Run(ctx)
		sweeper := kube.NewSweeper(client, a, kube.SweepConfig{Node: node, Interval: o.sweepInterval, Recorder: recorder,
			Metrics: clientMetrics, Registerer: reg, Skip: watch.Active})
		go func() {
			select {
			case <-presence.Synced():
			case <-ctx.Done():
				return
			}
			kube.SpreadStart(ctx, o.relistSpread)
			sweeper.Run(ctx)
		}()
	}
	capacity := agent.NewCapacityWatcher(backend, reg)
	if devices == nil {
		// No device-mapper: the thin pools' fill comes from lvmd instead.
		capacity.ExportThinPools(reg)
	}
	if o.capacityAnnotation != "" {
		nodeCapacity := agent.NewNodeCapacity(client, o.nodeName, o.capacityAnnotation, classes, metrics)
		nodeCapacity.Copies = devices != nil
		nodeCapacity.Grows = o.backend == "topolvm"
		nodeCapacity.Wipes = wiper != nil
		if crypt != nil {
			nodeCapacity.Encryption = kube.EncryptionLUKS2
		}
		nodeCapacity.MinChange = o.capacityMinChange
		capacity.OnChange, capacity.OnLost = nodeCapacity.Update, nodeCapacity.Lost
		go nodeCapacity.Run(ctx)
	}
	capacity.OnBack = a.Resume
	go capacity.Run(ctx)
	if o.metricsAddress != "" {
		if err := serveMetrics(ctx, o.metricsAddress, reg, func() error {
			if !a.Synced() {
				return errors.New("informers not synced")
			}
			return capacity.Reachable()
		}); err != nil {
			return err
		}
	}
	klog.InfoS("Starting lvm-agent", "version", versionName(), "node", o.nodeName, "backend", o.backend, "watchMode", mode, "workers", o.workers)
	return a.Run(ctx, o.grace)
}

// labellerLeaseDefault is the Lease of the labeller of lvm-agent
// provisioner installed in this agent's namespace (deploy/, the chart).
func labellerLeaseDefault() string {
	ns := firstEnv("POD_NAMESPACE")
	if ns == "" {
		ns = "lvm-agent"
	}
	return ns + "/" + kube.LabellerLeaseName
}

// signalContext ends on SIGTERM or SIGINT; a second signal exits 1 at once,
// as the original agent did.
func signalContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-ch
		klog.InfoS("Signal received; shutting down (a second signal exits at once)", "signal", s)
		cancel()
		<-ch
		klog.Flush()
		os.Exit(1)
	}()
	return ctx
}

// parseFlags parses args; on --help it prints the usage on stdout and
// returns 0, on a usage error it prints the error and usage on stderr and
// returns 2; ok is true when the command should go on.
func parseFlags(fs *flag.FlagSet, args []string) (code int, ok bool) {
	var out bytes.Buffer
	fs.SetOutput(&out)
	err := fs.Parse(args)
	fs.SetOutput(os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		_, _ = os.Stdout.Write(out.Bytes())
		return 0, false
	case err != nil:
		_, _ = os.Stderr.Write(out.Bytes())
		return 2, false
	}
	return 0, true
}

// agentConfig is the agent's API access: the kubeconfig file it is given,
// else the in-cluster config (never ~/.kube/config, unlike the CLI: a node
// daemon should not pick up whatever identity its host's root has).
func agentConfig(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	return cfg, nil
}

// withHostname is node with its Node's kubernetes.io/hostname label, which
// a local PV's affinity names; a Node it cannot read is logged, and its
// node name then stands for the label (kube.Node.Hostname "").
func withHostname(ctx context.Context, c apiclient.Interface, node kube.Node) kube.Node {
	var err error
	if node.Hostname, err = kube.NodeHostname(ctx, c, node.Name); err != nil {
		klog.ErrorS(err, "Cannot read this Node's hostname label; local PVs are matched with the node name", "node", node.Name)
	}
	return node
}

// newClient is a daemon's client: agentConfig's config, tuned.
func newClient(kubeconfig string, qps float64, burst int, tune ...func(*rest.Config)) (apiclient.Interface, error) {
	cfg, err := agentConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return clientFor(cfg, qps, burst, tune...)
}

func clientFor(cfg *rest.Config, qps float64, burst int, tune ...func(*rest.Config)) (apiclient.Interface, error) {
	return apiclient.New(tuned(cfg, qps, burst, tune...))
}

// tuned is cfg with a daemon's rate limits and user agent, then tune's changes.
func tuned(cfg *rest.Config, qps float64, burst int, tune ...func(*rest.Config)) *rest.Config {
	cfg.QPS, cfg.Burst = float32(qps), burst
	cfg.UserAgent = "lvm-agent"
	for _, t := range tune {
		t(cfg)
	}
	return cfg
}

func newBackend(o options) (lvmbackend.Backend, error) {
	switch o.backend {
	case "topolvm":
		b, err := lvmbackend.NewTopolvm(o.lvmdSocket)
		if err != nil {
			return nil, err
		}
		return withMetadata(b, o)
	case "google-lvmd":
		var tlsCfg *tls.Config
		if o.tlsCert != "" || o.tlsKey != "" || o.tlsCA != "" {
			c, err := lvmbackend.LoadClientTLS(o.tlsCert, o.tlsKey, o.tlsCA)
			if err != nil {
				return nil, err
			}
			tlsCfg = c
		}
		return lvmbackend.NewGoogleLVMD(o.lvmdAddress, tlsCfg, 0)
	}
	return nil, fmt.Errorf("--backend must be topolvm or google-lvmd, not %q", o.backend)
}

func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, ready func() error) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	return serveHTTP(ctx, "--metrics-address", addr, mux)
}

// serveHTTP serves mux on addr (given by flag) until ctx ends.
func serveHTTP(ctx context.Context, flag, addr string, mux *http.ServeMux) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	klog.InfoS("Serving HTTP", "flag", flag, "address", l.Addr().String())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	return nil
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func parsePairs(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, p := range splitList(s) {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("%q is not key=value", p)
		}
		out[k] = v
	}
	return out, nil
}
