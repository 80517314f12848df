package agent

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lvm-agent/lvm-agent/kube"
)

// burst is n concurrent creates, then their deletes, on an agent whose
// fake lvmd takes list per listing (counted) and create per lvcreate.
type burst struct {
	e     *env
	lists atomic.Int32
}

func newBurst(tb testing.TB, share bool, workers int, list, create time.Duration) *burst {
	cfg := Config{Workers: workers}
	if !share {
		cfg.ReadMaxAge = -1
	}
	return newBurstOf(tb, cfg, list, create)
}

// newBurstOf is newBurst with the agent's whole configuration.
func newBurstOf(tb testing.TB, cfg Config, list, create time.Duration) *burst {
	b := &burst{e: start(tb, cfg)}
	b.e.lvm.SetLatency(create)
	b.e.lvm.SetHook(func(op, _, _ string) error {
		if op == "list" {
			b.lists.Add(1)
			time.Sleep(list)
		}
		return nil
	})
	return b
}

func burstName(i int) string { return fmt.Sprintf("pvc-%03d", i) }

// creates asks for n LVs at once and waits for every answer.
func (b *burst) creates(tb testing.TB, n int) []map[string]string {
	for i := range n {
		b.e.pvc(tb, "default", burstName(i), node, spec(fmt.Sprintf(`{"volumeGroup":"thick","name":%q,"size":4194304}`, burstName(i))))
	}
	answers := make([]map[string]string, n)
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := b.e.client.CoreV1().PersistentVolumeClaims("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			if list.Items[i].Annotations[kube.AnnLifecycle] == kube.StateCreating {
				return false, nil
			}
		}
		byName := map[string]map[string]string{}
		for _, pvc := range list.Items {
			byName[pvc.Name] = pvc.Annotations
		}
		for i := range n {
			answers[i] = byName[burstName(i)]
		}
		return true, nil
	})
	require.NoError(tb, err)
	return answers
}

// deletes removes the claims, then asks for every LV's delete at once.
func (b *burst) deletes(tb testing.TB, n int) []map[string]string {
	ctx := context.Background()
	for i := range n {
		uid := "default-" + burstName(i) + "-uid"
		require.NoError(tb, b.e.client.CoreV1().PersistentVolumeClaims("default").Delete(ctx, burstName(i), metav1.DeleteOptions{}))
		b.e.pv(tb, "pv-"+burstName(i), node, types.UID(uid), map[string]string{
			kube.AnnLifecycle: kube.StateDeleting, kube.AnnSpec: "thick/" + burstName(i)})
	}
	answers := make([]map[string]string, n)
	for i := range n {
		answers[i] = b.e.waitPV(tb, "pv-"+burstName(i))
	}
	return answers
}

// A burst of creates and then of deletes: every answer right, one LV per
// claim, none left, and the creates share the listings.
func TestBurstSharesListings(t *testing.T) {
	const n = 40
	b := newBurst(t, true, 4, 20*time.Millisecond, 5*time.Millisecond)
	for i, ann := range b.creates(t, n) {
		require.Equal(t, kube.StateCreated, ann[kube.AnnLifecycle], "%s: %v", burstName(i), ann)
		assert.Equal(t, "/dev/vg0/"+burstName(i), ann[kube.AnnDevice])
	}
	creates := b.lists.Load()
	lvs, err := b.e.lvm.List("thick")
	require.NoError(t, err)
	require.Len(t, lvs, n, "one LV per claim")
	for i, lv := range lvs {
		assert.Equal(t, burstName(i), lv.Name)
		assert.Contains(t, lv.Tags, OwnerTag(types.UID("default-"+burstName(i)+"-uid")))
	}
	// Without sharing, each create lists its class, the other class and
	// its class again for the device path: 3n listings.
	assert.LessOrEqual(t, creates, int32(10), "listings for %d creates", n)

	for i, ann := range b.deletes(t, n) {
		require.Equal(t, kube.StateDeleted, ann[kube.AnnLifecycle], "%s: %v", burstName(i), ann)
	}
	lvs, err = b.e.lvm.List("thick")
	require.NoError(t, err)
	assert.Empty(t, lvs)
	t.Logf("lvmd listings: %d for %d creates, %d for %d deletes", creates, n, b.lists.Load()-creates, n)
}

// BenchmarkBurstCreates: 100 creates at once against a fake lvmd whose
// listing takes a second and whose lvcreate takes 0.3 s (serialized, as
// lvm does on a VG's lock), with the agent's defaults (8 workers, 2 lvmd
// calls at once), reads shared or not. It reports lvmd's listings and the
// burst's time over the creates' own time (100 x 0.3 s).
func BenchmarkBurstCreates(b *testing.B) {
	const n, list, create = 100, time.Second, 300 * time.Millisecond
	for _, share := range []bool{true, false} {
		b.Run(fmt.Sprintf("shared=%v", share), func(b *testing.B) {
			for range b.N {
				bu := newBurst(b, share, 8, list, create)
				start := time.Now()
				for _, ann := range bu.creates(b, n) {
					if ann[kube.AnnLifecycle] != kube.StateCreated {
						b.Fatalf("answer: %v", ann)
					}
				}
				took := time.Since(start)
				b.ReportMetric(float64(bu.lists.Load()), "listings")
				b.ReportMetric(took.Seconds(), "burst-s")
				b.ReportMetric(took.Seconds()/(n*create).Seconds(), "x-creates-own-time")
			}
		})
	}
}

// BenchmarkCreateOneAtATime: creates one after the other, each answered
// before the next is asked (a user's one volume at a time), against a fake
// lvmd whose listing takes a second and whose lvcreate takes 0.3 s, with
// two device classes. "stale": every listing is stale by the next create
// (--lvmd-list-max-age shorter than the time between them); "default":
// --lvmd-list-max-age as the agent runs by default, creates less than that
// apart (make bench-peers makes one about every minute); "aging": a second
// between an answer and the next create, the listings kept for 4 s, so
// that they pass that age during the run (make bench-peers' one a minute
// against the default 5 min), and the agent reads them again between
// creates (Shared.Refresh). It reports the seconds from the request to the
// answer, per create, and lvmd's listings per create.
func BenchmarkCreateOneAtATime(b *testing.B) {
	const n, list, create = 5, time.Second, 300 * time.Millisecond
	for _, c := range []struct {
		name   string
		maxAge time.Duration
		gap    time.Duration
	}{{"stale", time.Nanosecond, 0}, {"default", DefaultReadMaxAge, 0}, {"aging", 4 * time.Second, time.Second}} {
		b.Run(c.name, func(b *testing.B) {
			for range b.N {
				bu := newBurstOf(b, Config{ReadMaxAge: c.maxAge}, list, create)
				var took time.Duration
				for i := range n {
					start := time.Now()
					bu.e.pvc(b, "default", burstName(i), node, spec(fmt.Sprintf(`{"volumeGroup":"thick","name":%q,"size":4194304}`, burstName(i))))
					if ann := bu.e.waitPVC(b, "default", burstName(i)); ann[kube.AnnLifecycle] != kube.StateCreated {
						b.Fatalf("answer: %v", ann)
					}
					took += time.Since(start)
					time.Sleep(c.gap)
				}
				b.ReportMetric(took.Seconds()/n, "s/create")
				b.ReportMetric(float64(bu.lists.Load())/n, "listings/create")
			}
		})
	}
}
