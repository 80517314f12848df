package lvmbackend

import "k8s.io/utils/clock"

// SetClock makes s read the time from c (the tests' fake clock).
func SetClock(s *Shared, c clock.PassiveClock) { s.now = c.Now }
