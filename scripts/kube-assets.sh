#!/usr/bin/env bash
# Builds a real etcd and Kubernetes components from the Go module proxy into a
# cache keyed by version, and prints the directory that holds them (usable as
# KUBEBUILDER_ASSETS). Skips a build when its cached binary exists.
#
#   scripts/kube-assets.sh [COMPONENT...]
#
# etcd and kube-apiserver are always built; COMPONENT adds any of
# kube-scheduler, kube-controller-manager, kubelet, kubectl, kube-proxy (each a few
# seconds to ~1.5 min once kube-apiserver's build cache is warm). Concurrent
# callers wait for each other (flock) instead of building the same binary twice.
#
# Kubernetes is built with this repo's version of each module both use
# (scripts/align-deps.sh: grpc, protobuf, x/net, otel, kube-openapi... where
# go.mod is ahead of Kubernetes' own go.mod), so that the packages lvm-agent
# shares with it come out of Go's build cache instead of a second cold
# compile. The binaries' directory is keyed by that list.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
KUBE_VERSION=${KUBE_VERSION:-v1.37.2}
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
export CGO_ENABLED=0 GOFLAGS=-mod=mod
kube_gomod=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
# etcd: the server version Kubernetes' own go.mod requires (its etcd client
# and server modules), built in the same wrapper module and the same go
# build as Kubernetes: every module etcd shares with it (grpc, protobuf,
# otel, zap, the etcd client...) is then compiled once, not twice.
ETCD_VERSION=${ETCD_VERSION:-v3.7.0}
aligned=$("$here/align-deps.sh" "$kube_gomod")
read -rd '' -a align <<<"$aligned" || true
deps=$(printf '%s\n' "${align[@]}" | sha256sum | cut -c1-8)
OUT=$CACHE/kube-assets/etcd-$ETCD_VERSION-kube-$KUBE_VERSION-deps-$deps

log() { echo "kube-assets: $*" >&2; }
. "$here/times.sh"

# build_kube NAME...: k8s.io/kubernetes/cmd/NAME (etcd: go.etcd.io/etcd/server/v3)
# for each NAME not cached, from one wrapper module whose staging modules
# point at the published versions. One go build for all of them: the module
# and package graphs are loaded once, a package they share is compiled
# once, and the links (single-threaded) run beside each other and the
# compiles.
build_kube() {
  local names=() n
  for n in "$@"; do [ -x "$OUT/$n" ] || names+=("$n"); done
  [ ${#names[@]} -gt 0 ] || return 0
  local w=$CACHE/src/kube-$KUBE_VERSION-deps-$deps staging=v0${KUBE_VERSION#v1}
  mkdir -p "$w" && cd "$w"
  if [ ! -f go.mod ]; then
    go mod init lvm-agent/kube-build >/dev/null 2>&1
    # lvm-agent's versions of the modules both use (see the top)
    [ ${#align[@]} -eq 0 ] || go mod edit "${align[@]/#/-require=}"
    # kubernetes points its staging modules at ./staging; use the published
    # ones, and require them at that version too: a package's module version
    # is part of its build-cache key (and of its -trimpath file names), and
    # kubernetes requires them as v0.0.0.
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging' "$kube_gomod" | awk '{print $1}' |
      grep -vE 'sample-(cli-plugin|controller)' |
      while read -r m; do go mod edit -replace "$m=$m@$staging" -require "$m@$staging"; done
  fi
  local pkgs=() tools=()
  for n in "${names[@]}"; do
    case $n in
      etcd) pkgs+=(go.etcd.io/etcd/server/v3) tools+=("go.etcd.io/etcd/server/v3@$ETCD_VERSION") ;;
      *) pkgs+=("k8s.io/kubernetes/cmd/$n") tools+=("k8s.io/kubernetes/cmd/$n@$KUBE_VERSION") ;;
    esac
  done
  log "building ${names[*]} (Kubernetes $KUBE_VERSION, etcd $ETCD_VERSION; cold, kube-apiserver among them: 5-20 min)"
  local t0=$SECONDS tmp
  go get -tool "${tools[@]}" >/dev/null 2>&1
  tmp=$(mktemp -d "$OUT/.build.XXXXXX")
  go build -trimpath -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)" \
    -o "$tmp/" "${pkgs[@]}"
  # go build names etcd's binary after its path: go.etcd.io/etcd/server/v3
  for n in "${names[@]}"; do mv "$tmp/$([ "$n" = etcd ] && echo server || echo "$n")" "$OUT/$n"; done
  rmdir "$tmp"
  log "${names[*]} built in $((SECONDS - t0)) s"
  times_add "build: ${names[*]}" $((SECONDS - t0))
}

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
kube=(etcd kube-apiserver)
for c in "$@"; do
  case $c in
    kube-scheduler | kube-controller-manager | kubelet | kubectl | kube-proxy) kube+=("$c") ;;
    *) log "unknown component $c"; exit 2 ;;
  esac
done
build_kube "${kube[@]}"
echo "$OUT"
