package agent

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/lvm-agent/lvm-agent/kube"
	"github.com/lvm-agent/lvm-agent/lvmbackend"
)

// DefaultCapacityAnnotation is the Node annotation that carries the node's
// local storage capacity. It is the key of Alibaba Cloud CSI's local storage
// plugin, and the value keeps that plugin's format (a JSON list of
// {"type":"lvm","name":<VG>,"capacity":<bytes>}), so that schedulers which
// read it keep working; "free" and "deviceClass" are lvm-agent's additions,
// which readers of the original format ignore.
const DefaultCapacityAnnotation = "csi.alibabacloud.com/storage-topology"

// StorageCapacity is one entry of the capacity annotation.
type StorageCapacity struct {
	// Type is always "lvm".
	Type string `json:"type"`
	// Name is the volume group as a create spec names it.
	Name string `json:"name"`
	// Capacity is the size in bytes: the VG's, or a thin pool's.
	Capacity uint64 `json:"capacity"`
	// Free is what lvmd can still allocate (thin: with overprovisioning).
	Free uint64 `json:"free"`
	// DeviceClass is the lvmd device class behind Name.
	DeviceClass string `json:"deviceClass"`
}

// EncodeStorageTopology renders a capacity report as the annotation's value.
// Each device class is listed under every volume group name that a spec
// could use to reach it (classes maps volume groups to device classes; a
// class is also reachable by its own name unless that name is mapped
// elsewhere). The output is sorted, so equal reports give equal strings and
// an unchanged report is never written twice.
func EncodeStorageTopology(caps []lvmbackend.Capacity, classes map[string]string) string {
	entries := []StorageCapacity{}
	for _, c := range caps {
		for _, vg := range volumeGroupsOf(c.DeviceClass, classes) {
			entries = append(entries, StorageCapacity{Type: "lvm", Name: vg, Capacity: c.SizeBytes, Free: c.FreeBytes, DeviceClass: c.DeviceClass})
		}
	}
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].Name != entries[j].Name {
			return entries[i].Name < entries[j].Name
		}
		return entries[i].DeviceClass < entries[j].DeviceClass
	})
	out, _ := json.Marshal(entries) // plain structs: cannot fail
	return string(out)
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
// preceded by a read of the Node.
type NodeCapacity struct {
	client  kubernetes.Interface
	node    string
	key     string
	classes map[string]string
	metrics *Metrics
	updates chan []lvmbackend.Capacity

	// Debounce is how long reports are gathered before one write.
	Debounce time.Duration
	// RetryBase and RetryMax bound the backoff after a failed read or write
	// (a missing Node included: the kubelet may register it later).
	RetryBase, RetryMax time.Duration
	// Resync is how often the Node is read again, so that an annotation
	// removed or a Node re-registered by someone else is written again.
	Resync time.Duration
}

// NewNodeCapacity makes an updater for the annotation key of Node node.
func NewNodeCapacity(client kubernetes.Interface, node, key string, classes map[string]string, metrics *Metrics) *NodeCapacity {
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	return &NodeCapacity{client: client, node: node, key: key, classes: classes, metrics: metrics,
		updates:  make(chan []lvmbackend.Capacity, 1),
		Debounce: time.Second, RetryBase: time.Second, RetryMax: time.Minute, Resync: 10 * time.Minute}
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

// Run writes the annotation until ctx ends.
func (n *NodeCapacity) Run(ctx context.Context) {
	s := nodeCapacitySync{NodeCapacity: n}
	var timer <-chan time.Time
	resync := time.NewTicker(n.Resync)
	defer resync.Stop()
	retry := n.RetryBase
	for {
		select {
		case <-ctx.Done():
			return
		case caps := <-n.updates:
			s.desired = EncodeStorageTopology(caps, n.classes)
			if timer == nil { // a pending retry keeps its backoff
				timer = time.After(n.Debounce)
			}
			continue
		case <-resync.C:
			s.known = nil
			if s.desired != "" && timer == nil {
				timer = time.After(0)
			}
			continue
		case <-timer:
		}
		timer = nil
		if err := s.sync(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			timer = time.After(retry)
			retry = min(2*retry, n.RetryMax)
			continue
		}
		retry = n.RetryBase
	}
}

// nodeCapacitySync is Run's state.
type nodeCapacitySync struct {
	*NodeCapacity
	desired       string
	known         *string // the annotation as last read or written; nil: unknown
	missingLogged bool
}

func (s *nodeCapacitySync) sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if s.known == nil {
		node, err := s.client.CoreV1().Nodes().Get(ctx, s.node, metav1.GetOptions{})
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
	if *s.known == s.desired {
		s.missingLogged = false
		return nil
	}
	_, err := kube.UpdateNodeWithAnnotations(ctx, s.client, s.node, "", kube.Set(map[string]string{s.key: s.desired}))
	s.metrics.wrote("node", err)
	if err != nil {
		s.known = nil
		s.logFailure(err, "write")
		return err
	}
	written := s.desired
	s.known = &written
	s.missingLogged = false
	klog.V(2).InfoS("Node capacity annotation updated", "node", s.node, "annotation", s.key, "value", s.desired)
	return nil
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
