//go:build nodeagent

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// The node agent's build (-tags nodeagent: bin/lvm-agent, the image's
// /lvm-agent) leaves the provisioner out. Its libraries need client-go's
// clientset, which registers every API group of Kubernetes when the program
// starts: about 25 MiB more resident memory on every node, for a controller
// that runs once per cluster. "lvm-agent provisioner" runs the build with
// everything, lvm-agent-provisioner, from beside this binary (else from
// $PATH), with the same arguments.
const provisionerBinary = "lvm-agent-provisioner"

func provisionerMain(args []string) int {
	path := provisionerBinary
	if self, err := os.Executable(); err == nil {
		path = filepath.Join(filepath.Dir(self), provisionerBinary)
	}
	if _, err := os.Stat(path); err != nil {
		if path, err = exec.LookPath(provisionerBinary); err != nil {
			fmt.Fprintf(os.Stderr, "lvm-agent provisioner: this is the node agent's build, and %s is neither beside it nor on $PATH\n", provisionerBinary)
			return 1
		}
	}
	err := syscall.Exec(path, append([]string{path, "provisioner"}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "lvm-agent provisioner: run %s: %v\n", path, err)
	return 1
}
