#!/usr/bin/env bash
# Builds TopoLVM and the CSI sidecars its chart runs, for make bench-peers
# (docs/bench-peers.md), and their images; prints the images' directory.
# Each Go program is built static (CGO_ENABLED=0, -trimpath) from the Go module
# proxy, in a wrapper module of its own in the cache (never in the repo), into
# a cache keyed by version; a cached binary is not built again. The images are
# docker image tarballs made by scripts/images (no container engine), as
# scripts/vm/images.sh makes the guest's; the guest imports them
# (scripts/guest/peers.sh): nothing is pulled.
#
#   topolvm.tar          localhost/peers/topolvm:guest         hypertopolvm TOPOLVM_VERSION as /hypertopolvm and
#                        /lvmd, /topolvm-node, /topolvm-controller (the chart's commands); busybox's nsenter
#                        (lvmd runs the node's /sbin/lvm in PID 1's namespaces, its default); util-linux's
#                        blkid, wipefs, findmnt, mount, umount, fsck, e2fsprogs and xfsprogs with their libraries (the node
#                        plugin formats, mounts and grows volumes in its container; upstream's image is
#                        Ubuntu with the same tools)
#   csi-provisioner.tar  localhost/peers/csi-provisioner:guest  external-provisioner PROVISIONER_VERSION
#   csi-resizer.tar      localhost/peers/csi-resizer:guest      external-resizer RESIZER_VERSION
#   csi-sidecars.tar     localhost/peers/csi-sidecars:guest     this repo's scripts/peers/csi-sidecars as
#                        /csi-node-driver-registrar and /livenessprobe, busybox's sh and rm (the
#                        registrar's preStop hook)
# TopoLVM v0.41.0 pins external-provisioner v6.2.0 and external-resizer v2.1.0;
# the module proxy refuses both (and serves no version of node-driver-registrar
# or livenessprobe), so these are the nearest versions it serves.
# external-snapshotter: not built, the bench runs with snapshots off.
#
#   scripts/peers/topolvm-build.sh [--resolve] [DIR]
#     DIR        where the images go (default $LVM_AGENT_BIN/peer-images, else the cache's bin/peer-images)
#     --resolve  only resolve every wrapper module and its package graph (go get, go list -deps:
#                downloads, no compile) and the Debian packages; build nothing
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
TOPOLVM_VERSION=${TOPOLVM_VERSION:-v0.41.0}
PROVISIONER_VERSION=${PROVISIONER_VERSION:-v6.3.0}
RESIZER_VERSION=${RESIZER_VERSION:-v2.2.0}
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
resolve_only=
[ "${1:-}" != --resolve ] || { resolve_only=1; shift; }
OUT=${1:-${LVM_AGENT_BIN:-$CACHE/bin}/peer-images}
export CGO_ENABLED=0 GOFLAGS=-mod=mod
log() { echo "topolvm-build: $*" >&2; }
. "$root/scripts/times.sh"

# replaces GOMOD: GOMOD's replace directives as go mod edit -replace
# arguments. A wrapper module ignores its dependencies' replaces, and
# external-provisioner's (Kubernetes' staging modules, which
# k8s.io/kubernetes requires as v0.0.0) are what make it resolve at all.
replaces() {
  awk '
    /^replace \(/ { block = 1; next }
    block && /^\)/ { block = 0; next }
    block && NF { print; next }
    /^replace / { sub(/^replace /, ""); print }
  ' "$1" | awk '
    $2 == "=>" { old = $1; new = $3; v = $4 }
    $3 == "=>" { old = $1 "@" $2; new = $4; v = $5 }
    new ~ /^\.|^\// { print "local replace: " $0 > "/dev/stderr"; exit 1 }
    { print "-replace=" old "=" new (v != "" ? "@" v : "") }
  '
}

# build NAME MODULE VERSION PKG LDFLAGS: $CACHE/peers/NAME-VERSION/NAME, the
# main package PKG of MODULE@VERSION, built in a wrapper module with MODULE's
# own requirements and replaces (no alignment with go.mod's versions:
# scripts/align-deps.sh raises shared modules to ours, which these programs
# were never compiled against). Prints the binary's path.
build() {
  local name=$1 module=$2 version=$3 pkg=$4 ldflags=$5
  local dir=$CACHE/peers/$name-$version
  mkdir -p "$dir"
  exec 9>"$dir/.lock"
  flock 9
  if [ ! -x "$dir/$name" ]; then
    local w=$CACHE/src/peers-$name-$version gomod t0=$SECONDS
    mkdir -p "$w"
    if [ ! -f "$w/go.mod" ]; then
      gomod=$(go mod download -json "$module@$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
      [ -n "$gomod" ] || { log "the module proxy does not serve $module@$version"; return 1; }
      local edits edit_args
      edits=$(replaces "$gomod")
      (cd "$w" && go mod init "lvm-agent/peers-$name" >/dev/null 2>&1)
      if [ -n "$edits" ]; then
        mapfile -t edit_args <<<"$edits" # one -replace= per line
        (cd "$w" && go mod edit "${edit_args[@]}")
      fi
    fi
    local out
    out=$(cd "$w" && go get -tool "$pkg@$version" 2>&1) || { log "go get -tool $pkg@$version: $out"; return 1; }
    if [ -n "$resolve_only" ]; then
      log "$name: $module@$version resolves: $(cd "$w" && go list -deps "$pkg" | wc -l) packages, $(cd "$w" && go list -m all | wc -l) modules"
    else
      log "building $name ($module $version; cold: minutes)"
      (cd "$w" && go build -trimpath -ldflags "-s -w $ldflags" -o "$dir/$name.tmp" "$pkg")
      mv "$dir/$name.tmp" "$dir/$name"
      log "$name built in $((SECONDS - t0)) s"
      times_add "build: peers $name" $((SECONDS - t0))
    fi
  fi
  exec 9>&-
  echo "$dir/$name"
}

hypertopolvm=$(build hypertopolvm github.com/topolvm/topolvm "$TOPOLVM_VERSION" \
  github.com/topolvm/topolvm/cmd/hypertopolvm "-X github.com/topolvm/topolvm.Version=$TOPOLVM_VERSION")
provisioner=$(build csi-provisioner github.com/kubernetes-csi/external-provisioner/v6 "$PROVISIONER_VERSION" \
  github.com/kubernetes-csi/external-provisioner/v6/cmd/csi-provisioner "-X main.version=$PROVISIONER_VERSION")
resizer=$(build csi-resizer github.com/kubernetes-csi/external-resizer/v2 "$RESIZER_VERSION" \
  github.com/kubernetes-csi/external-resizer/v2/cmd/csi-resizer "-X main.version=$RESIZER_VERSION")

# The node plugin's tools, from Debian's archive as the guest's are
# (scripts/vm/build-guest.sh): the packages and every library package they
# depend on, fetched once into the cache; libc6 is the host's (ldd below runs
# the host's loader, which must match it).
TOOL_PKGS=(util-linux mount e2fsprogs xfsprogs busybox-static)
debs=$CACHE/peers/debs
mkdir -p "$debs"
mapfile -t libs < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances "${TOOL_PKGS[@]}" |
  grep -E '^lib' | grep -vxE 'libc6|libelogind0' | sort -u) # one package name per line
uris=$(apt-get download --print-uris "${TOOL_PKGS[@]}" "${libs[@]}")
files=$(awk '{gsub(/\x27/, "", $2); print $2}' <<<"$uris")
todo=$(while read -r f; do [ -f "$debs/$f" ] || echo "${f%%_*}"; done <<<"$files")
if [ -n "$todo" ]; then
  log "downloading $(wc -w <<<"$todo") Debian packages"
  mapfile -t todo_pkgs <<<"$todo" # one package name per line
  (cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root "${todo_pkgs[@]}")
fi
if [ -n "$resolve_only" ]; then
  log "resolved: $hypertopolvm $provisioner $resizer (not built), $(wc -l <<<"$files") Debian packages"
  exit 0
fi

mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# (in the repo: its go.mod as it is, whatever the wrapper modules above needed)
gobuild() { (cd "$root" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w $("$root/scripts/version.sh")" "$@"); }
gobuild -o "$work/images" ./scripts/images
gobuild -o "$work/csi-sidecars" ./scripts/peers/csi-sidecars

mkdir -p "$work/pkgs"
while read -r f; do dpkg-deb -x "$debs/$f" "$work/pkgs/${f%%_*}"; done <<<"$files"
bb=$work/pkgs/busybox-static/bin/busybox

# The node plugin's root: the tools it and k8s.io/mount-utils run, where
# Debian puts them (not merged-/usr: topolvm runs /sbin/blkid by that path),
# their libraries where ldd finds them, the loader, and an ld.so.cache.
# Whole packages would be 56 MB (xfs_scrub's ICU alone 30).
TOOLS=(util-linux/sbin/blkid util-linux/sbin/fsck util-linux/sbin/blockdev util-linux/sbin/wipefs util-linux/bin/findmnt
  mount/bin/mount mount/bin/umount
  e2fsprogs/sbin/mke2fs e2fsprogs/sbin/mkfs.ext4 e2fsprogs/sbin/e2fsck e2fsprogs/sbin/fsck.ext4
  e2fsprogs/sbin/resize2fs e2fsprogs/sbin/dumpe2fs e2fsprogs/etc/mke2fs.conf
  xfsprogs/sbin/mkfs.xfs xfsprogs/sbin/xfs_repair xfsprogs/usr/sbin/xfs_growfs xfsprogs/usr/sbin/xfs_io)
r=$work/root
mkdir -p "$r/usr/lib/x86_64-linux-gnu" "$r/lib64" "$r/etc"
for t in "${TOOLS[@]}"; do
  mkdir -p "$r/$(dirname "${t#*/}")"
  cp -a "$work/pkgs/$t" "$r/${t#*/}"
done
libpath=$(find "$work/pkgs" -type d -path '*/lib/x86_64-linux-gnu' | paste -sd:)
find "$r" -type f | while read -r f; do
  [ "$(head -c4 "$f")" = $'\x7fELF' ] || continue
  out=$(LD_LIBRARY_PATH=$libpath ldd "$f" 2>&1) || continue # static: nothing to do
  if grep -q 'not found' <<<"$out"; then log "$f: $out"; exit 1; fi
  awk '/=> \//{print $3} /^\t\//{print $1}' <<<"$out"
done | sort -u | while read -r lib; do
  case $lib in
    */ld-linux-x86-64.so.2) cp -L "$lib" "$r/lib64/" ;;
    *) cp -L "$lib" "$r/usr/lib/x86_64-linux-gnu/" ;;
  esac
done
echo /usr/lib/x86_64-linux-gnu >"$r/etc/ld.so.conf"
ldconfig -r "$r"
# Each file as SRC=PATH, each symbolic link as --link TARGET=PATH (flags
# before the files: the images tool's flag parsing stops at the first file).
links=() files=()
while read -r f; do
  if [ -L "$r/$f" ]; then links+=(--link "$(readlink "$r/$f")=/$f"); else files+=("$r/$f=/$f"); fi
done < <(cd "$r" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort)

img() { "$work/images" "$@"; log "$(basename "$2") ($(du -h "$2" | cut -f1))"; }
img --out "$OUT/topolvm.tar" --ref localhost/peers/topolvm:guest --entrypoint /hypertopolvm \
  --link hypertopolvm=/lvmd --link hypertopolvm=/topolvm-node --link hypertopolvm=/topolvm-controller "${links[@]}" \
  "$hypertopolvm=/hypertopolvm" "$bb=/usr/bin/nsenter" "${files[@]}"
img --out "$OUT/csi-provisioner.tar" --ref localhost/peers/csi-provisioner:guest --entrypoint /csi-provisioner \
  "$provisioner=/csi-provisioner"
img --out "$OUT/csi-resizer.tar" --ref localhost/peers/csi-resizer:guest --entrypoint /csi-resizer \
  "$resizer=/csi-resizer"
img --out "$OUT/csi-sidecars.tar" --ref localhost/peers/csi-sidecars:guest --entrypoint /livenessprobe \
  --link csi-sidecars=/csi-node-driver-registrar --link csi-sidecars=/livenessprobe \
  --link /bin/busybox=/bin/sh --link /bin/busybox=/bin/rm \
  "$work/csi-sidecars=/csi-sidecars" "$bb=/bin/busybox"
echo "$OUT"
