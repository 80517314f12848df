#!/usr/bin/env bash
# Builds the container images the guest's one-node cluster runs, as docker
# image tarballs (scripts/images; no container engine), into DIR (default
# $LVM_AGENT_BIN/images), and prints DIR. The guest imports them into
# containerd (scripts/guest/cluster.sh): nothing is ever pulled.
#   lvm-agent-amd64.tar  localhost/lvm-agent/lvm-agent:guest   the static binary, as the
#   lvm-agent-arm64.tar                                       Containerfile says (FROM scratch)
#   lvmd.tar             localhost/lvm-agent/lvmd:guest        topolvm's lvmd + busybox's nsenter: its
#                        default lvm-command-prefix runs the node's own /sbin/lvm in
#                        PID 1's namespaces (deploy/base: hostPID, privileged)
#   pause.tar            localhost/lvm-agent/pause:guest       the pod sandbox (scripts/images/pause)
#   busybox.tar          localhost/lvm-agent/busybox:guest     Debian's busybox-static, for test pods
#
#   scripts/vm/images.sh [DIR]
# IMAGE_ARCHES (default "amd64 arm64") names the lvm-agent images built: the
# guest needs only amd64, and each other arch is a cold cross-compile of
# every dependency (arm64: 4 CPU-minutes).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
OUT=${1:-${LVM_AGENT_BIN:-$CACHE/bin}/images}
log() { echo "images: $*" >&2; }
. "$root/scripts/times.sh"
export CGO_ENABLED=0
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

gobuild() { (cd "$root" && go build -trimpath -ldflags "-s -w $("$root/scripts/version.sh")" "$@"); }
gobuild -o "$work/images" ./scripts/images
gobuild -o "$work/pause" ./scripts/images/pause
for arch in ${IMAGE_ARCHES:-amd64 arm64}; do
  t0=$SECONDS
  GOARCH=$arch gobuild -tags nodeagent,grpcnotrace -o "$work/lvm-agent-$arch" ./cmd/lvm-agent
  GOARCH=$arch gobuild -tags grpcnotrace -o "$work/lvm-agent-provisioner-$arch" ./cmd/lvm-agent
  times_add "build: lvm-agent ($arch)" $((SECONDS - t0))
done
lvmd=$("$root/scripts/lvmd-build.sh" lvmd)

# busybox-static from Debian's archive, once.
debs=$CACHE/images/debs
mkdir -p "$debs"
deb=$(find "$debs" -maxdepth 1 -name 'busybox-static_*.deb' | sort | tail -n1)
if [ -z "$deb" ]; then
  (cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root busybox-static)
  deb=$(find "$debs" -maxdepth 1 -name 'busybox-static_*.deb' | sort | tail -n1)
fi
dpkg-deb -x "$deb" "$work/bb"
bb=$work/bb/bin/busybox

img() { "$work/images" "$@"; log "$(basename "${2}") ($(du -h "$2" | cut -f1))"; }
for arch in ${IMAGE_ARCHES:-amd64 arm64}; do
  img --out "$OUT/lvm-agent-$arch.tar" --ref localhost/lvm-agent/lvm-agent:guest --arch "$arch" \
    --entrypoint /lvm-agent "$work/lvm-agent-$arch=/lvm-agent" "$work/lvm-agent-provisioner-$arch=/lvm-agent-provisioner"
done
img --out "$OUT/lvmd.tar" --ref localhost/lvm-agent/lvmd:guest --entrypoint /lvmd \
  "$lvmd/lvmd=/lvmd" "$bb=/usr/bin/nsenter"
img --out "$OUT/pause.tar" --ref localhost/lvm-agent/pause:guest --entrypoint /pause "$work/pause=/pause"
applets=()
for a in sh cat dd sync sleep ls echo test mkdir rm sha256sum md5sum head blockdev stat df wc; do
  applets+=(--link "/bin/busybox=/bin/$a")
done
img --out "$OUT/busybox.tar" --ref localhost/lvm-agent/busybox:guest --entrypoint /bin/sh \
  "${applets[@]}" "$bb=/bin/busybox"
echo "$OUT"
