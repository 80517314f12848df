package kube

import (
	"context"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// RelistSpread is a transport middleware (rest.Config.Wrap) that delays
// every list but the first of its kind by a random time in [0, spread): a
// re-list, which follows a watch that could not resume. When an API server
// restarts, its new watch cache starts at etcd's current revision, every
// agent's watch is too old for it (410 Gone), and all of them list again at
// once; client-go's reflector waits only 0.8-1.6 s (its first backoff step)
// before it does. `make bench-cluster` measures that storm with 300 agents.
// The first list of each kind goes at once, so that the agent's start is
// not slowed; a later page of a list (a continue token) too, so that the
// token does not expire.
//
// A transport rather than the informers' ListWatch: the reflector calls
// ours only through client-go's generated informers, and a streamed list
// (WatchListClient) is a watch request, which the transport sees like any
// other.
func RelistSpread(spread time.Duration) func(http.RoundTripper) http.RoundTripper {
	return func(next http.RoundTripper) http.RoundTripper {
		if spread <= 0 {
			return next
		}
		return &relistSpread{next: next, spread: spread, seen: map[string]bool{}, sleep: sleep,
			pick: func(d time.Duration) time.Duration { return rand.N(d) }}
	}
}

type relistSpread struct {
	next   http.RoundTripper
	spread time.Duration
	mu     sync.Mutex
	seen   map[string]bool // lists made, by listKey
	sleep  func(context.Context, time.Duration)
	pick   func(time.Duration) time.Duration
}

func (t *relistSpread) RoundTrip(req *http.Request) (*http.Response, error) {
	key, ok := listKey(req)
	if !ok {
		return t.next.RoundTrip(req)
	}
	t.mu.Lock()
	again := t.seen[key]
	t.seen[key] = true
	t.mu.Unlock()
	if again {
		d := t.pick(t.spread)
		klog.V(2).InfoS("Spreading a re-list", "list", key, "delay", d)
		if t.sleep(req.Context(), d); req.Context().Err() != nil {
			return nil, req.Context().Err()
		}
	}
	return t.next.RoundTrip(req)
}

// SpreadStart waits a random time in [0, spread) (until ctx ends): for a
// list that is not needed for the agent to be ready, the hybrid sweep's
// first, so that the agents of a cluster restarted together (a DaemonSet
// update) do not all make it at once.
func SpreadStart(ctx context.Context, spread time.Duration) {
	if spread > 0 {
		sleep(ctx, rand.N(spread))
	}
}

// listKey names the list a request starts: a plain list's first page, or a
// streamed list (a watch asking for the initial events), by path and label
// and field selectors.
func listKey(req *http.Request) (string, bool) {
	k := requestKind(req)
	q := req.URL.Query()
	switch {
	case k.verb == "list" && q.Get("continue") == "":
	case k.verb == "watch" && q.Get("sendInitialEvents") == "true":
	default:
		return "", false
	}
	return k.verb + " " + req.URL.Path + "?" + q.Get("labelSelector") + "&" + q.Get("fieldSelector"), true
}
