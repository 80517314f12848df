#!/usr/bin/env bash
# Builds the two real lvmd daemons the agent talks to, static (CGO_ENABLED=0) so
# they run in the initramfs guest, into a cache keyed by version; prints the
# directory. Skips a build when its binary is already cached.
#   scripts/lvmd-build.sh [lvmd|google-lvmd ...]   (default: both)
#   lvmd         topolvm's lvmd (unix socket)
#   google-lvmd  google/lvmd's server (TCP, execs lvs/vgs/... by bare name)
# Neither can be `go install`ed: the proxy refuses to list their versions, so
# each is built from a tiny wrapper module in the cache (never in the repo).
# topolvm's lvmd is built with this repo's version of each module both use
# (scripts/align-deps.sh), so that the packages it shares with lvm-agent and
# Kubernetes (topolvm's protos, grpc, protobuf, client-go...) are compiled
# once; the directory is keyed by that list.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOPOLVM_VERSION=${TOPOLVM_VERSION:-v0.41.0}
GOOGLE_LVMD_VERSION=${GOOGLE_LVMD_VERSION:-v0.0.0-20200421122210-17bd8b9f710f}
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
export CGO_ENABLED=0 GOFLAGS=-mod=mod
topolvm_gomod=$(go mod download -json "github.com/topolvm/topolvm@$TOPOLVM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
aligned=$("$here/align-deps.sh" "$topolvm_gomod")
read -rd '' -a align <<<"$aligned" || true
deps=$(printf '%s\n' "${align[@]}" | sha256sum | cut -c1-8)
OUT=$CACHE/lvmd/topolvm-$TOPOLVM_VERSION-deps-$deps-google-$GOOGLE_LVMD_VERSION

log() { echo "lvmd-build: $*" >&2; }
. "$here/times.sh"

build_topolvm() {
  [ -x "$OUT/lvmd" ] && return
  local w=$CACHE/src/topolvm-lvmd-$TOPOLVM_VERSION-deps-$deps
  mkdir -p "$w" && cd "$w"
  if [ ! -f main.go ]; then
    go mod init lvm-agent/topolvm-lvmd >/dev/null 2>&1
    cat >main.go <<'GO'
package main

import "github.com/topolvm/topolvm/cmd/lvmd/app"

func main() { app.Execute() }
GO
  fi
  log "building topolvm lvmd $TOPOLVM_VERSION (cold: ~3.5 min)"
  local t0=$SECONDS
  go get "github.com/topolvm/topolvm@$TOPOLVM_VERSION" >/dev/null 2>&1
  [ ${#align[@]} -eq 0 ] || go mod edit "${align[@]/#/-require=}"
  go mod tidy >/dev/null 2>&1
  go build -trimpath -ldflags "-s -w" -o "$OUT/lvmd.tmp" .
  mv "$OUT/lvmd.tmp" "$OUT/lvmd"
  log "lvmd built in $((SECONDS - t0)) s"
  times_add "build: topolvm lvmd" $((SECONDS - t0))
}

build_google() {
  [ -x "$OUT/google-lvmd" ] && return
  local w=$CACHE/src/google-lvmd-$GOOGLE_LVMD_VERSION
  mkdir -p "$w" && cd "$w"
  [ -f go.mod ] || go mod init lvm-agent/google-lvmd >/dev/null 2>&1
  log "building google/lvmd $GOOGLE_LVMD_VERSION (cold: ~45 s)"
  local t0=$SECONDS
  go get -tool "github.com/google/lvmd@$GOOGLE_LVMD_VERSION" >/dev/null 2>&1
  go build -trimpath -ldflags "-s -w" -o "$OUT/google-lvmd.tmp" github.com/google/lvmd
  mv "$OUT/google-lvmd.tmp" "$OUT/google-lvmd"
  log "google-lvmd built in $((SECONDS - t0)) s"
  times_add "build: google/lvmd" $((SECONDS - t0))
}

# NAME... (lvmd, google-lvmd; default both): build only these. Concurrent
# callers (scripts/vm/images.sh beside scripts/vm/guest-files.sh) wait for
# each other instead of building the same binary twice.
mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
names=("$@")
[ $# -gt 0 ] || names=(lvmd google-lvmd)
for n in "${names[@]}"; do
  case $n in
    lvmd) build_topolvm ;;
    google-lvmd) build_google ;;
    *) log "unknown daemon $n"; exit 2 ;;
  esac
done
echo "$OUT"
