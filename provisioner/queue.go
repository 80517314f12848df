package provisioner

import (
	"context"

	"k8s.io/client-go/util/workqueue"
)

// work hands each key of q to sync until q shuts down: a key whose sync
// failed (failed says so) comes back after q's backoff, one that succeeded
// has its backoff reset. The leader's controllers share it.
func work[T comparable](ctx context.Context, q workqueue.TypedRateLimitingInterface[T], sync func(context.Context, T) error, failed func(T, error)) {
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		if err := sync(ctx, key); err != nil {
			failed(key, err)
			q.AddRateLimited(key)
		} else {
			q.Forget(key)
		}
		q.Done(key)
	}
}
