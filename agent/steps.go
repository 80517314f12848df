package agent

import (
	"time"

	"k8s.io/klog/v2"
)

// steps times the steps of one operation for a single V(2) log line, so
// that an operation's duration can be attributed step by step in a
// cluster's log (issue 15 attributes the delete's time with it).
type steps struct {
	last time.Time
	kv   []any
}

func newSteps() *steps { return &steps{last: time.Now()} }

// done ends the step called name.
func (s *steps) done(name string) {
	now := time.Now()
	s.kv = append(s.kv, name, now.Sub(s.last))
	s.last = now
}

// log writes the steps done so far, after kv.
func (s *steps) log(msg string, kv ...any) {
	if v := klog.V(2); v.Enabled() {
		v.InfoS(msg, append(kv, s.kv...)...)
	}
}
