#!/usr/bin/env bash
# Builds everything the test guest runs into one directory and prints it:
# scripts/vm/{suite,demo,bench}.sh copy a selection of it into the guest
# (run.sh --files), and the Vagrant VM runs it from the host's cache (see the
# Vagrantfile). All static (CGO_ENABLED=0), all cached:
#   etcd, kube-apiserver   scripts/kube-assets.sh (cold: 8-20 min)
#   lvmd, google-lvmd      scripts/lvmd-build.sh (cold: ~4 min; topolvm's after Kubernetes: ~20 CPU-s)
#   lvm-agent              ./cmd/lvm-agent, the node agent's build (-tags nodeagent)
#   guest.test             the in-guest suite, ./integration/guest (tag guest)
#   lvm-devcluster         make demo-cli's control plane and fixtures (tag guest)
#   lvm-stories            the guest's stories, run in the one-node cluster (./integration/stories)
#   devmapper.test         ./lvmbackend/devmapper's guest tests (tag guest)
#   lvmmeta.test           ./lvmbackend/lvmmeta's guest tests (tag guest)
#   agent.test             ./agent's guest benchmark (tag guest), only when named
# and, only when named, for the one-node cluster (scripts/guest/cluster.sh):
#   kubelet, kubectl, kube-scheduler, kube-controller-manager, kube-proxy
#                          scripts/kube-assets.sh
#   containerd, containerd-shim-runc-v2, ctr   scripts/containerd-build.sh
#   images/                the images it runs (scripts/vm/images.sh)
#   helm                   Helm's own binary (scripts/helm.sh), for node.sh --install helm
#
#   guest-files.sh [NAME...]          build only these of the last four (default: all)
#   guest-files.sh --stage NAME...    the same, then print a new directory (under
#                                     $LVM_AGENT_CACHE/run; the caller removes it)
#                                     holding exactly NAME... (daemons included),
#                                     for run.sh --files
#
# A Go binary that does not compile is reported and left out (the callers
# fail on a missing binary they need); the exit code is then 1.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
# LVM_AGENT_BIN_DIR and LVM_AGENT_RUN keep two checkouts on one machine from
# sharing built binaries and run folders.
OUT=${LVM_AGENT_BIN_DIR:-$CACHE/bin}
RUN=${LVM_AGENT_RUN:-$CACHE/run}
log() { echo "guest-files: $*" >&2; }
. "$root/scripts/times.sh"

mkdir -p "$OUT"
stage=
[ "${1:-}" != --stage ] || { stage=1; shift; }
want=("$@")
[ ${#want[@]} -gt 0 ] || want=(lvm-agent guest.test lvm-devcluster lvm-stories devmapper.test lvmmeta.test)

# Prebuilt daemons: hard links into OUT (same file system as the cache).
kube=() containerd=() helm=
for w in "${want[@]}"; do
  case $w in
    kubelet | kubectl | kube-scheduler | kube-controller-manager | kube-proxy) kube+=("$w") ;;
    containerd | containerd-shim-runc-v2 | ctr) containerd+=("$w") ;;
    helm) helm=1 ;;
  esac
done
# google/lvmd only when named or for the suite (guest.test): the cluster runs topolvm's.
daemons=(lvmd)
case " ${want[*]} " in *" guest.test "* | *" google-lvmd "*) daemons+=(google-lvmd) ;; esac
# Go's build cache makes these quick when nothing changed. Each is written
# under a temporary name and renamed, so a concurrent reader never sees half
# a binary.
export CGO_ENABLED=0
flags=(-trimpath -ldflags "-s -w $("$root/scripts/version.sh")")
build() { # NAME GO-ARGS... PACKAGE
  local name=$1 pkg=${*: -1}
  set -- "${@:2:$#-2}"
  local t0=$SECONDS
  if (cd "$root" && go "$@" -o "$OUT/.$name.tmp" "$pkg") >"$OUT/.$name.log" 2>&1; then
    mv "$OUT/.$name.tmp" "$OUT/$name"
    rm -f "$OUT/.$name.log"
    log "$name ($((SECONDS - t0)) s)"
    times_add "build: $name" $((SECONDS - t0))
  else
    rm -f "$OUT/$name" "$OUT/.$name.tmp"
    log "$name does not build:"
    sed 's/^/  /' "$OUT/.$name.log" >&2
    return 1
  fi
}
# project: this checkout's binaries and images; exit code 1 if one does not build.
project() {
  local rc=0 w
  for w in "${want[@]}"; do
    case $w in
      lvm-agent) build lvm-agent build -tags nodeagent,grpcnotrace "${flags[@]}" ./cmd/lvm-agent || rc=1 ;;
      guest.test) build guest.test test -c -tags guest "${flags[@]}" ./integration/guest || rc=1 ;;
      lvm-devcluster) build lvm-devcluster build -tags guest "${flags[@]}" ./integration/guest/devcluster || rc=1 ;;
      lvm-stories) build lvm-stories build "${flags[@]}" ./integration/stories || rc=1 ;;
      devmapper.test) build devmapper.test test -c -tags guest "${flags[@]}" ./lvmbackend/devmapper || rc=1 ;;
      lvmmeta.test) build lvmmeta.test test -c -tags guest "${flags[@]}" ./lvmbackend/lvmmeta || rc=1 ;;
      agent.test) build agent.test test -c -tags guest "${flags[@]}" ./agent || rc=1 ;;
      images) IMAGE_ARCHES=amd64 "$here/images.sh" "$OUT/images" >/dev/null || rc=1 ;; # the guest is amd64
      etcd | kube-apiserver | lvmd | google-lvmd | kube* | containerd* | ctr | helm) ;; # linked below
      *) log "unknown binary $w"; return 2 ;;
    esac
  done
  return $rc
}

# containerd and helm build beside etcd and Kubernetes: cold, each build has
# phases that leave a core idle (module downloads, links). lvmd and this
# checkout's own binaries start once Kubernetes is built: most of their
# packages (client-go, apimachinery, grpc, protobuf...) are then hits in Go's
# build cache (the versions are aligned, see scripts/align-deps.sh), where two
# cold builds side by side would each compile them.
dirs=$(mktemp -d)
trap 'rm -rf "$dirs"' EXIT
pids=()
[ ${#containerd[@]} -eq 0 ] || { "$root/scripts/containerd-build.sh" >"$dirs/containerd" & pids+=($!); }
[ -z "$helm" ] || { "$root/scripts/helm.sh" >"$dirs/helm" & pids+=($!); }
assets=$("$root/scripts/kube-assets.sh" "${kube[@]}")
"$root/scripts/lvmd-build.sh" "${daemons[@]}" >"$dirs/lvmd" & pids+=($!)
project & own=$!
for p in "${pids[@]}"; do wait "$p"; done # set -e: a failed build ends the script
rc=0
wait "$own" || rc=$?
[ $rc -ne 2 ] || exit 2
prebuilt=("$assets/etcd" "$assets/kube-apiserver")
for d in "${daemons[@]}"; do prebuilt+=("$(cat "$dirs/lvmd")/$d"); done
for w in "${kube[@]}"; do prebuilt+=("$assets/$w"); done
for w in "${containerd[@]}"; do prebuilt+=("$(cat "$dirs/containerd")/$w"); done
[ -z "$helm" ] || prebuilt+=("$(cat "$dirs/helm")")
for f in "${prebuilt[@]}"; do
  ln -f "$f" "$OUT/" 2>/dev/null || cp -f "$f" "$OUT/"
done
if [ -z "$stage" ]; then
  echo "$OUT"
  exit $rc
fi
mkdir -p "$RUN"
dir=$(mktemp -d "$RUN/files.XXXXXX")
for w in "${want[@]}"; do
  if [ -d "$OUT/$w" ]; then cp -al "$OUT/$w" "$dir/$w"; elif [ -f "$OUT/$w" ]; then ln "$OUT/$w" "$dir/$w"; fi
done
echo "$dir"
exit $rc
