package agent

import (
	"context"
	"math"
	"slices"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/kube/apiclient"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// capacityEntries are the capacity annotation's entries for a report: each
// device class under every volume group name that a spec could use to reach
// it (classes maps volume groups to device classes; a class is also
// reachable by its own name unless that name is mapped elsewhere).
//
// wipes: the agent zeroes thick LVs before their removal and refuses thin
// volumes in a pool that does not zero (both need the node's block devices
// and device-mapper), published as "wipe":"zero" on every class;
// encryption ("luks2" or "") is published on every class as it is.
func capacityEntries(caps []lvmbackend.Capacity, classes map[string]string, copies, grows, wipes bool, encryption string) []kube.StorageCapacity {
	var entries []kube.StorageCapacity
	wipe := ""
	if wipes {
		wipe = kube.WipeZero
	}
	for _, c := range caps {
		for _, vg := range volumeGroupsOf(c.DeviceClass, classes) {
			entries = append(entries, kube.StorageCapacity{Type: "lvm", Name: vg, Capacity: c.SizeBytes, Free: c.FreeBytes, DeviceClass: c.DeviceClass,
				Clone: cloneKind(c, copies), Grow: grows, Wipe: wipe, Encryption: encryption})
		}
	}
	return entries
}

// cloneKind is the kind of clone the agent makes in a device class: a thin
// snapshot in a thin class (lvmd's CreateLVSnapshot; only topolvm's lvmd
// reports thin classes), a copy in a thick one when the agent copies
// (copies: it reads device-mapper's open counts), else none.
func cloneKind(c lvmbackend.Capacity, copies bool) string {
	switch {
	case c.Thin:
		return kube.CloneSnapshot
	case copies:
		return kube.CloneCopy
	}
	return ""
}

func volumeGroupsOf(deviceClass string, classes map[string]string) []string {
	var vgs []string
	for vg, dc := range classes {
		if dc == deviceClass {
			vgs = append(vgs, vg)
		}
	}
	if _, remapped := classes[deviceClass]; !remapped {
		vgs = append(vgs, deviceClass)
	}
	sort.Strings(vgs)
	return vgs
}

// NodeCapacity keeps the capacity annotation on this node's Node object in
// step with lvmd's capacity reports. Reports are coalesced over Debounce, so
// that a burst of creates costs one write; a report that does not change the
// annotation costs none, also after a restart, since the first write is
// preceded by a read of the Node; nor does one whose free bytes moved by
// less than MinChange of what the annotation shows. Without MinChange every
// create would cost a Node write as soon as a node's creates are more than
// Debounce apart, the normal case in a large cluster: Node writes per
// volume would grow with the number of nodes (make bench-cluster measured
// 0.02 per create at 1 node, 0.5 at 30).
type NodeCapacity struct {
	client  apiclient.Interface
	node    string
	key     string
	classes map[string]string
	metrics *Metrics
	updates chan []lvmbackend.Capacity

	// Copies: the agent makes thick clones by copying (it reads the
	// kernel's open counts); published per thick class as "clone":"copy".
	Copies bool
	// Grows: the agent's lvmd grows LVs (topolvm's ResizeLV); published
	// per class as "grow":true.
	Grows bool
	// Wipes: new volumes of every class read zeros (capacityEntries);
	// published per class as "wipe":"zero".
	Wipes bool
	// Encryption: kube.EncryptionLUKS2 when the agent makes encrypted
	// volumes (crypt.go), published per class as "encryption":"luks2".
	Encryption string

	// Debounce is how long reports are gathered before one write.
	Debounce time.Duration
	// MinChange is the smallest change of a device class's free bytes
	// written, as a fraction of the free bytes the annotation shows (0:
	// every change). Smaller changes add up until they reach it, so the
	// annotation's free bytes are never further than that fraction from
	// lvmd's; any other change (a class, a size, free bytes to or from 0) is
	// written at once.
	MinChange float64
	// Retry is the backoff after a failed read or write (a missing Node
	// included: the kubelet may register it later), reset by a success. Its
	// jitter keeps the nodes of a cluster from retrying in lockstep after an
	// API server outage.
	Retry wait.Backoff
	// Resync is how often the Node is read again, so that an annotation
	// removed or a Node re-registered by someone else is written again.
	Resync time.Duration
	// Away is how long lvmd stays unreachable (Lost, with no report since)
	// before every entry says so ("lvmdUnreachable", free 0): schedulers
	// then send new volumes elsewhere. Shorter outages (lvmd restarted by
	// kubelet) change nothing.
	Away time.Duration

	lost chan struct{}

	// clock times Run (the tests' fake clock), and synced, when set, hears
	// each sync's result: the tests' proof that Run looked.
	clock  clock.WithTicker
	synced func(error)
}

// DefaultCapacityMinChange is NodeCapacity's default MinChange: 1% of the
// free bytes shown.
const DefaultCapacityMinChange = 0.01

// NewNodeCapacity makes an updater for the annotation key of Node node.
func NewNodeCapacity(client apiclient.Interface, node, key string, classes map[string]string, metrics *Metrics) *NodeCapacity {
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	return &NodeCapacity{client: client, node: node, key: key, classes: classes, metrics: metrics,
		updates: make(chan []lvmbackend.Capacity, 1), lost: make(chan struct{}, 1), Away: 10 * time.Second, clock: clock.RealClock{},
		Debounce: time.Second, MinChange: DefaultCapacityMinChange, Retry: wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: time.Minute}, Resync: 10 * time.Minute}
}

// Update takes a capacity report; it is the CapacityWatcher's OnChange hook.
// It never blocks: only the latest report matters.
func (n *NodeCapacity) Update(caps []lvmbackend.Capacity) {
	caps = append([]lvmbackend.Capacity(nil), caps...)
	for {
		select {
		case n.updates <- caps:
			return
		default:
		}
		select {
		case <-n.updates: // drop the older report
		default:
		}
	}
}

// Lost takes the word that lvmd could not be reached: the
// CapacityWatcher's OnLost hook. It never blocks.
func (n *NodeCapacity) Lost() {
	select {
	case n.lost <- struct{}{}:
	default:
	}
}

// Run writes the annotation until ctx ends.
func (n *NodeCapacity) Run(ctx context.Context) {
	s := nodeCapacitySync{NodeCapacity: n}
	var timer <-chan time.Time
	resync := n.clock.NewTicker(n.Resync)
	defer resync.Stop()
	retry := n.Retry
	var away <-chan time.Time // lvmd lost, not yet said
	for {
		select {
		case <-ctx.Done():
			return
		case caps := <-n.updates:
			s.entries, s.reported, s.away, away = capacityEntries(caps, n.classes, n.Copies, n.Grows, n.Wipes, n.Encryption), true, false, nil
			if timer == nil { // a pending retry keeps its backoff
				timer = n.clock.After(n.Debounce)
			}
			continue
		case <-n.lost:
			if away == nil && !s.away {
				away = n.clock.After(n.Away)
			}
			continue
		case <-away:
			s.away, away = true, nil
			klog.InfoS("lvmd unreachable; the Node capacity annotation says so", "node", s.node, "after", n.Away)
			if timer == nil {
				timer = fired()
			}
			continue
		case <-resync.C():
			s.known = nil
			if (s.reported || s.away) && timer == nil {
				timer = fired()
			}
			continue
		case <-timer:
		}
		timer = nil
		err := s.sync(ctx)
		if n.synced != nil {
			n.synced(err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			timer = n.clock.After(retry.Step())
			continue
		}
		retry = n.Retry
	}
}

// fired is a timer that has fired: Run syncs at its next turn.
func fired() <-chan time.Time {
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c
}

// nodeCapacitySync is Run's state.
type nodeCapacitySync struct {
	*NodeCapacity
	entries       []kube.StorageCapacity // of lvmd's last report
	reported      bool                   // a report came since the start
	away          bool                   // lvmd lost for Away, no report since
	known         *string                // the annotation as last read or written; nil: unknown
	missingLogged bool
}

// desired is the annotation's value to write, if any. While lvmd is away
// the entries are the last report's (with none since the start: the Node's
// own), each marked unreachable with nothing free.
func (s *nodeCapacitySync) desired() (string, bool) {
	entries := s.entries
	if s.away && !s.reported {
		var err error
		if entries, err = kube.DecodeStorageTopology(*s.known); err != nil {
			return "", false // nothing of ours to mark
		}
	}
	if s.away {
		entries = slices.Clone(entries)
		for i := range entries {
			entries[i].Free, entries[i].LvmdUnreachable = 0, true
		}
	}
	return kube.EncodeStorageTopology(entries), s.reported || s.away
}

func (s *nodeCapacitySync) sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if s.known == nil {
		node, err := s.client.Nodes().Get(ctx, s.node, metav1.GetOptions{})
		if err != nil {
			s.logFailure(err, "read")
			return err
		}
		v, ok := node.Annotations[s.key]
		if !ok {
			v = "" // never a valid value: the annotation is written
		}
		s.known = &v
	}
	desired, ok := s.desired()
	if !ok || !worthWriting(*s.known, desired, s.MinChange) {
		s.missingLogged = false
		return nil
	}
	_, err := kube.UpdateNodeWithAnnotations(ctx, s.client, s.node, "", kube.Set(map[string]string{s.key: desired}))
	s.metrics.wrote("node", err)
	if err != nil {
		s.known = nil
		s.logFailure(err, "write")
		return err
	}
	s.known = &desired
	s.missingLogged = false
	klog.V(2).InfoS("Node capacity annotation updated", "node", s.node, "annotation", s.key, "value", desired)
	return nil
}

// worthWriting tells whether the annotation value desired should replace
// known: known is not in the form the agent writes, or lists other classes
// or sizes or abilities (clone, grow) or lvmd's reach, or a class's free bytes moved by
// minChange of known's or more, or to or from 0.
func worthWriting(known, desired string, minChange float64) bool {
	if known == desired {
		return false
	}
	k, err := kube.DecodeStorageTopology(known)
	if err != nil || kube.EncodeStorageTopology(k) != known {
		return true
	}
	d, err := kube.DecodeStorageTopology(desired)
	if err != nil || len(d) != len(k) {
		return true
	}
	for i := range k {
		a, b := k[i], d[i]
		if a.Type != b.Type || a.Name != b.Name || a.DeviceClass != b.DeviceClass || a.Capacity != b.Capacity ||
			a.Clone != b.Clone || a.Grow != b.Grow || a.Wipe != b.Wipe || a.Encryption != b.Encryption || a.LvmdUnreachable != b.LvmdUnreachable || (a.Free == 0) != (b.Free == 0) {
			return true
		}
		moved := float64(max(a.Free, b.Free) - min(a.Free, b.Free))
		if moved > 0 && moved >= minChange*float64(a.Free) {
			return true
		}
	}
	return false
}

// logFailure logs a missing Node once until it appears, and other errors each time.
func (s *nodeCapacitySync) logFailure(err error, op string) {
	if apierrors.IsNotFound(err) {
		if !s.missingLogged {
			klog.InfoS("Node object not found; the capacity annotation will be written once it exists", "node", s.node)
			s.missingLogged = true
		}
		return
	}
	klog.ErrorS(err, "Could not "+op+" the Node's capacity annotation; will retry", "node", s.node)
}
