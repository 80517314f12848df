package agent

import (
	"context"
	"time"
)

// steps times the steps of one operation, so that the "Volume request
// done" line attributes its duration step by step: how long the request
// waited in the queue, each lvmd call, each check through the API server
// (make bench-peers draws its timeline from these lines).
type steps struct {
	last time.Time
	kv   []any
}

type stepsKey struct{}

// withSteps starts the steps of an operation in ctx; queued is how long
// the request waited between being seen and the start.
func withSteps(ctx context.Context, queued time.Duration) (context.Context, *steps) {
	s := &steps{last: time.Now(), kv: []any{"queued", queued}}
	return context.WithValue(ctx, stepsKey{}, s), s
}

// stepsOf is ctx's steps; without them (a test calling an operation
// directly) the steps are kept but not logged.
func stepsOf(ctx context.Context) *steps {
	if s, ok := ctx.Value(stepsKey{}).(*steps); ok {
		return s
	}
	return &steps{last: time.Now()}
}

// done ends the step called name.
func (s *steps) done(name string) {
	now := time.Now()
	s.kv = append(s.kv, name, now.Sub(s.last))
	s.last = now
}

// kvs is the steps done so far as key-value pairs for a log line (none
// for nil steps).
func (s *steps) kvs() []any {
	if s == nil {
		return nil
	}
	return s.kv
}
