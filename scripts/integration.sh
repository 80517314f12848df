#!/usr/bin/env bash
# `make test-integration`: every integration package (./integration/...: a real
# etcd + kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and
# Helm from the cache, the real lvm-agent binary) side by side. Each
# package's test binary is built once; the tests of ./integration, each on a
# node, namespace and agent of its own, are dealt round-robin to
# INTEGRATION_SHARDS processes (default 3), each with a control plane of its
# own (its TestMain), run beside the other packages. A test waits mostly on
# the API server and the agent, so the host's cores are idle for much of it:
# one package after another, this took 3 times as long (make test's table
# shows each process's time).
#
#   scripts/integration.sh [GO-TEST-FLAGS...]   e.g. -test.run TestChaos
#
# Each process's output is shown as it comes, prefixed with its name; the
# exit code is 0 only when every process passed.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit
. scripts/times.sh
export CGO_ENABLED=0
shards=${INTEGRATION_SHARDS:-3}
log() { echo "integration: $*" >&2; }

t0=$SECONDS
KUBEBUILDER_ASSETS=$(scripts/kube-assets.sh kubectl kube-scheduler kube-controller-manager) || exit
LVM_AGENT_HELM=$(scripts/helm.sh) || exit
export KUBEBUILDER_ASSETS LVM_AGENT_HELM
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The agent as make build builds it, once for every process (the harness
# builds its own when LVM_AGENT_BIN is unset).
t1=$SECONDS
go build -buildvcs=auto -trimpath -tags nodeagent,grpcnotrace -ldflags "$(scripts/version.sh)" -o "$work/lvm-agent" ./cmd/lvm-agent || exit
go build -buildvcs=auto -trimpath -tags grpcnotrace -ldflags "$(scripts/version.sh)" -o "$work/lvm-agent-provisioner" ./cmd/lvm-agent || exit
export LVM_AGENT_BIN=$work/lvm-agent
times_add "build: lvm-agent" $((SECONDS - t1))
t1=$SECONDS
go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./integration/... >"$work/pkgs" || exit
mapfile -t pkgs <"$work/pkgs" # one package per line
mkdir -p "$work/bin"
go test -c -o "$work/bin/" "${pkgs[@]}" || exit
times_add "build: the test binaries" $((SECONDS - t1))

# proc NAME DIR BINARY ARGS...: one test process, in its package's directory.
proc() {
  local name=$1 dir=$2 bin=$3 start=$SECONDS rc
  shift 3
  # go test's default timeout per package: 10 minutes.
  (cd "$dir" && "$bin" -test.v -test.timeout 10m "$@") 2>&1 | sed -u "s|^|[$name] |"
  rc=${PIPESTATUS[0]}
  echo "[$name] exit $rc after $((SECONDS - start)) s"
  times_add "go test $name ($([ "$rc" -eq 0 ] && echo ok || echo "FAIL $rc"))" $((SECONDS - start))
  return "$rc"
}

pids=() names=()
for p in "${pkgs[@]}"; do
  rel=${p#github.com/lvm-agent/lvm-agent/}
  bin=$work/bin/${rel##*/}.test
  if [ "$rel" = integration ] && [ "$shards" -gt 1 ] && [ $# -eq 0 ]; then
    # From the source: -test.list would run TestMain, which starts a control plane.
    mapfile -t tests < <(sed -nE 's/^func (Test[A-Za-z0-9_]*)\(t \*testing\.T\).*/\1/p' "$rel"/*_test.go | grep -vx TestMain)
    for ((s = 0; s < shards; s++)); do
      run=()
      for ((i = s; i < ${#tests[@]}; i += shards)); do run+=("${tests[i]}"); done
      [ ${#run[@]} -gt 0 ] || continue
      pattern="^($(IFS='|'; echo "${run[*]}"))\$"
      proc "./${rel}[$((s + 1))/$shards]" "$rel" "$bin" -test.run "$pattern" &
      pids+=($!) names+=("./${rel}[$((s + 1))/$shards]")
    done
  else
    proc "./$rel" "$rel" "$bin" "$@" &
    pids+=($!) names+=("./$rel")
  fi
done
rc=0 failed=()
for i in "${!pids[@]}"; do
  wait "${pids[i]}" || { rc=1; failed+=("${names[i]}"); }
done
log "$([ $rc -eq 0 ] && echo PASS || echo "FAIL: ${failed[*]}") in $((SECONDS - t0)) s"
exit $rc
