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

build() { # NAME: github.com/containerd/containerd/v2/cmd/NAME
  local name=$1 pkg=github.com/containerd/containerd/v2/cmd/$1
  [ -x "$OUT/$name" ] && return
  local w=$CACHE/src/containerd-$CONTAINERD_VERSION
  mkdir -p "$w" && cd "$w"
  [ -f go.mod ] || go mod init lvm-agent/containerd-build >/dev/null 2>&1
  log "building $name $CONTAINERD_VERSION (cold: ~1 min)"
  local t0=$SECONDS
  go get -tool "$pkg@$CONTAINERD_VERSION" >/dev/null 2>&1
  go build -trimpath -tags no_btrfs \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
    -o "$OUT/$name.tmp" "$pkg"
  mv "$OUT/$name.tmp" "$OUT/$name"
  log "$name built in $((SECONDS - t0)) s"
}

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
build containerd
build containerd-shim-runc-v2
build ctr
echo "$OUT"
