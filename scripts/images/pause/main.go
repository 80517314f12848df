// Command pause is the sandbox ("pause") container of the guest's one-node
// cluster: it holds a pod's namespaces open, reaps the zombies that end up
// with it as PID 1, and exits on SIGTERM or SIGINT. Kubernetes' own pause is
// C and ships only as an image to pull; the guest pulls nothing, and this is
// the whole job.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
