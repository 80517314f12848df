#!/usr/bin/env bash
# Builds containerd and its runc shim, static (CGO_ENABLED=0, -tags no_btrfs),
# for the guest's one-node cluster, into a cache keyed by version; prints the
# directory. Skips a build when its binary is already cached.
#   containerd               kubelet 1.36+ refuses containerd 1.x, and Debian
#                            bookworm ships only 1.6
#   containerd-shim-runc-v2  the shim that runs each pod through runc
#   ctr                      its client: the guest imports the images with it
# Built from a tiny wrapper module in the cache (never in the repo).
set -euo pipefail

CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
OUT=$CACHE/containerd/containerd-$CONTAINERD_VERSION
export CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { echo "containerd-build: $*" >&2; }
. "$(dirname "${BASH_SOURCE[0]}")/times.sh"

# NAME...: github.com/containerd/containerd/v2/cmd/NAME for each NAME not
# cached, in one go build (one load of the package graph, parallel links).
build() {
  local names=() n
  for n in "$@"; do [ -x "$OUT/$n" ] || names+=("$n"); done
  [ ${#names[@]} -gt 0 ] || return 0
  local pkgs=("${names[@]/#/github.com/containerd/containerd/v2/cmd/}")
  local w=$CACHE/src/containerd-$CONTAINERD_VERSION
  mkdir -p "$w" && cd "$w"
  [ -f go.mod ] || go mod init lvm-agent/containerd-build >/dev/null 2>&1
  log "building ${names[*]} $CONTAINERD_VERSION (cold: ~1.5 min)"
  local t0=$SECONDS tmp
  go get -tool "${pkgs[@]/%/@$CONTAINERD_VERSION}" >/dev/null 2>&1
  tmp=$(mktemp -d "$OUT/.build.XXXXXX")
  go build -trimpath -tags no_btrfs \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    -o "$tmp/" "${pkgs[@]}"
  for n in "${names[@]}"; do mv "$tmp/$n" "$OUT/$n"; done
  rmdir "$tmp"
  log "${names[*]} built in $((SECONDS - t0)) s"
  times_add "build: ${names[*]}" $((SECONDS - t0))
}

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
build containerd containerd-shim-runc-v2 ctr
echo "$OUT"
