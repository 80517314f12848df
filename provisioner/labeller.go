package provisioner

import (
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/utils/clock"

	"github.com/lvm-agent/lvm-agent/kube"
)

// LabellerLease is the heartbeat of the labeller's Lease ref, held as
// holder: component-helpers' lease controller, as kubelet's Node Lease,
// renewed every quarter of its duration; Stop deletes it, so that the
// agents take over at once rather than after its duration.
func LabellerLease(c kubernetes.Interface, ref kube.LeaseRef, holder string) kube.Heartbeat {
	return lease.NewController(clock.RealClock{}, c, holder, int32(kube.LabellerLeaseDuration/time.Second), nil,
		kube.LabellerLeaseDuration/4, ref.Name, ref.Namespace, nil)
}
