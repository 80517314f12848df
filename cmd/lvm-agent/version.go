package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is the release, set at build time by the Makefile and the image
// build: go build -ldflags "-X main.version=v0.3.0". A plain "go build"
// leaves it empty and the module version from the build info is shown.
// commit is the Makefile's fallback for builds whose build info has no
// VCS stamp (-buildvcs=false, or a checkout the go command cannot read).
var version, commit string

// versionString is what --version prints: the version, then the commit,
// whether the tree had uncommitted changes, the commit's time, and the Go
// toolchain, all from the build info the Go linker embeds.
func versionString() string {
	rev, modified, when, goVersion := commit, "", "", runtime.Version()
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					modified = " (modified)"
				}
			case "vcs.time":
				when = " " + s.Value
			}
		}
	}
	if rev == "" {
		rev = "unknown"
	}
	return fmt.Sprintf("lvm-agent %s\ncommit: %s%s%s\ngo: %s %s/%s\n", versionName(), rev, modified, when, goVersion, runtime.GOOS, runtime.GOARCH)
}

// versionName is the release --version and the start-up log line show: the
// linker's main.version, else the module version from the build info, else
// "(devel)".
func versionName() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
