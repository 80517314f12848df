package main

import (
	"os"

	"github.com/lvm-agent/lvm-agent/integration/timeline"
)

// `lvm-stories timeline [-svg FILE] [-title TEXT] FILE...`: make
// bench-peers' hop medians and their picture (scripts/guest/peers.sh calls
// it), the same code the host's tests run.
func init() {
	tools["timeline"] = func(args []string) int { return timeline.Command(args, os.Stdout, os.Stderr) }
}
