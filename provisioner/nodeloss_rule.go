package provisioner

import (
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Why a node counts as lost (the NodeLost event and log lines, the
// node-lost annotation and the metric's reason label).
const (
	LostOutOfService = "out-of-service taint"
	LostDeleted      = "deleted"
)

// NodeLost is the one rule of when a node is lost for good, so that its
// claims may be released. node is its Node object (nil: there is none),
// goneSince when it was first seen without one (zero: not known to be
// missing), grace how long a missing Node may take to register again.
//
//   - A Node with Kubernetes' node.kubernetes.io/out-of-service taint is lost
//     at once: an operator sets it only for a node known to be down.
//   - A Node deleted, and not registered again for grace, is lost: a
//     mistaken `kubectl delete node` on a healthy node is undone by its
//     kubelet within seconds, well inside the grace.
//   - Anything else, however NotReady or unreachable for however long, is
//     not: a node that reboots, or loses its network, comes back with its
//     disks.
//
// When the answer may change with time alone (a missing Node inside its
// grace), recheck says after how long to ask again.
func NodeLost(node *corev1.Node, goneSince, now time.Time, grace time.Duration) (reason string, lost bool, recheck time.Duration) {
	if node != nil {
		for _, t := range node.Spec.Taints {
			if t.Key == corev1.TaintNodeOutOfService {
				return LostOutOfService, true, 0
			}
		}
		return "", false, 0
	}
	if goneSince.IsZero() {
		return "", false, 0
	}
	if left := goneSince.Add(grace).Sub(now); left > 0 {
		return "", false, left
	}
	return LostDeleted, true, 0
}
