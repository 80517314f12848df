#!/usr/bin/env bash
# Prints the linker flags that stamp lvm-agent's --version: the release
# (VERSION, default the nearest v* tag from git describe, or v0.0.0-dev
# between releases) and the commit (COMMIT, default HEAD). The one place for
# them: the Makefile, scripts/vm/guest-files.sh, scripts/vm/images.sh and the
# integration harness all build with
#   go build -ldflags "$(scripts/version.sh)" ./cmd/lvm-agent
# (go's own VCS stamp is off where GOFLAGS has -buildvcs=false).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version=${VERSION:-$(git describe --tags --match 'v*' --dirty 2>/dev/null || echo v0.0.0-dev)}
commit=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "-X main.version=$version -X main.commit=$commit"
