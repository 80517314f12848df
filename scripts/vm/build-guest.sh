#!/usr/bin/env bash
# Builds the throwaway QEMU guest that the real-LVM tests run in, and prints its
# directory (vmlinux + initramfs.cpio). The host kernel has no device-mapper,
# so LVM can only be exercised inside a guest kernel.
#   vmlinux         Debian's kernel, uncompressed: QEMU boots it through the PVH
#                   entry, about twice as fast as the bzImage through SeaBIOS.
#   initramfs.cpio  bash, busybox, lvm2, dmsetup, thin-provisioning-tools,
#                   e2fsprogs, cryptsetup (the encryption story checks our
#                   LUKS2 headers with it), their libraries, the LVM,
#                   dm-crypt and 9p kernel modules and an
#                   /init that runs one command (see scripts/vm/run.sh); for the
#                   one-node cluster (scripts/guest/cluster.sh): runc, the CNI
#                   plugins, nft, util-linux's mount/blkid/fsck (kubelet formats
#                   and mounts local volumes with them), openssl (the
#                   cluster's certificates) and the container networking
#                   modules.
# Guest packages are fetched with `apt-get download` and never installed on the
# host. The output is cached under a hash of this script and the exact .deb
# files, so it is rebuilt only when one of them changes.
set -euo pipefail

CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
HOST_PKGS=(qemu-system-x86 cpio kmod xz-utils)
GUEST_PKGS=(bash busybox-static lvm2 dmsetup thin-provisioning-tools e2fsprogs xfsprogs mount
  runc containernetworking-plugins nftables util-linux openssl cryptsetup-bin)
# Loaded in this order, each after its dependencies. crc32c_generic must be
# explicit: libcrc32c asks for it through request_module, and the guest has no
# working modprobe, so dm-thin-pool would fail with "Unknown symbol".
MODULES=(crc32c_generic virtio_pci virtio_blk 9pnet_virtio 9p loop dm_mod dm_bufio
  libcrc32c dm_persistent_data dm_bio_prison dm_thin_pool dm_snapshot dm_zero
  dm_crypt ecb xts af_alg algif_skcipher ext4 xfs
  overlay bridge veth br_netfilter dummy nf_conntrack nf_nat nf_tables nft_ct
  nft_nat nft_chain_nat nft_masq nft_numgen nft_fib_inet nft_fib_ipv4
  nft_fib_ipv6 nft_reject_inet nft_reject_ipv4 nft_reject_ipv6)
LIBDIR=usr/lib/x86_64-linux-gnu

log() { echo "build-guest: $*" >&2; }
. "$(dirname "${BASH_SOURCE[0]}")/../times.sh"

apt_update() {
  log "apt-get update"
  # A third-party source that cannot be reached must not stop us; Debian's can.
  apt-get update -qq >&2 || log "apt-get update reported errors (continuing)"
}

ensure_host_packages() {
  local p missing=()
  for p in "${HOST_PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} -eq 0 ] && return
  apt_update
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# The kernel package apt offers now, e.g. linux-image-6.1.0-48-amd64.
kernel_pkg() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-6\.1\.0-[0-9]*-amd64\)$/\1/p' | sed -n 1p
}

# Library packages the guest tools need, so the libraries match the binaries.
# libc6 comes from the host (ldd runs the host's loader, which must match its
# libc); libelogind0 is only an alternative to libsystemd0 and would clash.
lib_pkgs() {
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances "${GUEST_PKGS[@]}" |
    grep -E '^lib' | grep -vxE 'libc6|libelogind0' | sort -u
}

# "URL file size hash" for each package: names the exact .debs without
# fetching them. Resolving costs apt several seconds (it keeps no binary cache
# here), so the answer is reused while apt's lists and this script are unchanged.
resolve() {
  local kpkg libs
  kpkg=$(kernel_pkg)
  if [ -z "$kpkg" ]; then apt_update; kpkg=$(kernel_pkg); fi
  [ -n "$kpkg" ] || { log "apt offers no linux-image-6.1.0-*-amd64"; return 1; }
  mapfile -t libs < <(lib_pkgs) # one package name per line
  apt-get download --print-uris "$kpkg" "${GUEST_PKGS[@]}" "${libs[@]}"
}

ensure_host_packages
mkdir -p "$CACHE/guest"
state=$({ cat "${BASH_SOURCE[0]}"; ls -l --time-style=+%s /var/lib/apt/lists/
  dpkg-query -W -f='${Version}\n' libc6; } | sha256sum | cut -c1-16)
resolved=$CACHE/guest/resolved-$state
[ -s "$resolved" ] || { resolve >"$resolved.tmp"; mv "$resolved.tmp" "$resolved"; }
uris=$(cat "$resolved")
files=$(awk '{print $2}' <<<"$uris")
kpkg=$(grep -o '^linux-image-[^_]*' <<<"$files")
kver=${kpkg#linux-image-}

key=$({ cat "${BASH_SOURCE[0]}"; awk '{print $2, $4}' <<<"$uris"
  dpkg-query -W -f='${Version}\n' libc6; } | sha256sum | cut -c1-16)
OUT=$CACHE/guest/$key
if [ -f "$OUT/initramfs.cpio" ]; then
  log "cached: $OUT (kernel $kver)"
  echo "$OUT"
  exit 0
fi

# Download only the .debs not already in the shared download directory, so a
# change of this script does not fetch the kernel again.
t0=$SECONDS
debs=$CACHE/guest/debs
mkdir -p "$debs"
todo=$(while read -r f; do [ -f "$debs/$f" ] || echo "${f%%_*}"; done <<<"$files")
if [ -n "$todo" ]; then
  log "downloading $(wc -w <<<"$todo") packages"
  mapfile -t todo_pkgs <<<"$todo" # one package name per line
  if ! (cd "$debs" && apt-get download -qq -o APT::Sandbox::User=root "${todo_pkgs[@]}"); then
    # Stale package lists name files the archive no longer has: refresh, and
    # start over once with a fresh resolution.
    [ -z "${BUILD_GUEST_RETRY:-}" ] || exit 1
    apt_update
    BUILD_GUEST_RETRY=1 exec "${BASH_SOURCE[0]}" "$@"
  fi
fi

log "building guest for kernel $kver"
work=$(mktemp -d "$CACHE/guest/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/pkgs"
while read -r f; do
  p=${f%%_*}
  dpkg-deb -x "$debs/$f" "$work/pkgs/$p"
done <<<"$files"

# Kernel: cut the xz payload out of the bzImage and unpack it to the ELF vmlinux.
k=$work/pkgs/$kpkg
mkdir -p "$work/out"
off=$(LC_ALL=C grep -obUaP '\xFD7zXZ\x00' "$k/boot/vmlinuz-$kver" | cut -d: -f1 | sed -n 1p)
# (xz stops at the end of its stream: feed it by redirection, not a pipe that
# would end in SIGPIPE.)
xz -dc --single-stream >"$work/out/vmlinux" < <(tail -c +$((off + 1)) "$k/boot/vmlinuz-$kver")

# Root filesystem, merged-/usr like Debian's, so the .debs' /sbin/lvm etc. land
# in usr/sbin when copied through the bin/sbin/lib symlinks.
r=$work/root
mkdir -p "$r"/{usr/bin,usr/sbin,usr/local/bin,usr/local/sbin,$LIBDIR,usr/lib64,etc,proc,sys,dev,tmp,run,share,root,opt,mnt,var/tmp,var/log}
for d in bin sbin lib lib64; do ln -s "usr/$d" "$r/$d"; done
for p in bash lvm2 dmsetup thin-provisioning-tools e2fsprogs xfsprogs runc nftables openssl cryptsetup-bin; do
  for d in bin sbin usr/bin usr/sbin etc; do
    if [ -d "$work/pkgs/$p/$d" ]; then cp -a "$work/pkgs/$p/$d/." "$r/$d/"; fi
  done
done
# util-linux's losetup (from `mount`), as on the Vagrant VM and any Debian
# host: busybox's has no --find/--show, which tests use.
cp -a "$work/pkgs/mount/sbin/losetup" "$r/usr/sbin/"
# kubelet mounts, formats and checks local volumes with util-linux's tools.
cp -a "$work/pkgs/mount/bin/mount" "$work/pkgs/mount/bin/umount" "$r/usr/bin/"
cp -a "$work/pkgs/util-linux/sbin/blkid" "$work/pkgs/util-linux/sbin/fsck" "$r/usr/sbin/"
# The CNI plugins, where Debian puts them (containerd's cni bin_dirs).
mkdir -p "$r/usr/lib/cni"
cp -a "$work/pkgs/containernetworking-plugins/usr/lib/cni/." "$r/usr/lib/cni/"
# busybox ash would run its own applets ahead of $PATH (its losetup has no
# --show), so bash is /bin/sh and busybox only fills the names still missing.
ln -s bash "$r/usr/bin/sh"
cp "$work/pkgs/busybox-static/bin/busybox" "$r/usr/bin/busybox"
"$r/usr/bin/busybox" --list-full | while read -r a; do
  [ -e "$r/$a" ] || [ -L "$r/$a" ] || ln -s /usr/bin/busybox "$r/$a"
done

# Shared libraries: whatever ldd resolves for each ELF, preferring the freshly
# unpacked packages over the host's copies.
libpath=$(find "$work/pkgs" -type d -path '*/lib/x86_64-linux-gnu' | paste -sd:)
find "$r/usr/bin" "$r/usr/sbin" -type f | while read -r f; do
  [ "$(head -c4 "$f")" = $'\x7fELF' ] || continue
  out=$(LD_LIBRARY_PATH=$libpath ldd "$f" 2>&1) || continue  # static: nothing to do
  if grep -q 'not found' <<<"$out"; then log "$f: $out"; exit 1; fi
  awk '/=> \//{print $3} /^\t\//{print $1}' <<<"$out"
done | sort -u | while read -r lib; do
  case $lib in
    */ld-linux-x86-64.so.2) cp -L "$lib" "$r/usr/lib64/" ;;
    *) cp -L "$lib" "$r/$LIBDIR/" ;;
  esac
done
echo "/$LIBDIR" >"$r/etc/ld.so.conf"
ldconfig -r "$r"

# Kernel modules: modprobe on the host resolves each one's dependencies in load
# order; /init insmods the resulting list. The CPU-specific variants that come
# in as soft dependencies (crc32c-intel) are left out: they fail to load on
# TCG's CPU model, and the generic ones above do the same work.
depmod -b "$k" "$kver"
for m in "${MODULES[@]}"; do
  modprobe -d "$k" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | grep -v /arch/x86/ | awk '!seen[$0]++' | while read -r ko; do
  rel=${ko#"$k"}
  mkdir -p "$r$(dirname "$rel")"
  cp "$ko" "$r$rel"
  echo "$rel"
done >"$r/etc/modules.list"

# No udev in the guest: libdevmapper creates /dev/mapper nodes and /dev/VG/LV
# links itself, and nothing waits for udev events or dmeventd.
mkdir -p "$r/etc/lvm"
cat >"$r/etc/lvm/lvm.conf" <<'EOF'
devices {
	obtain_device_list_from_udev = 0
	external_device_info_source = "none"
	use_devicesfile = 0
}
activation {
	udev_sync = 0
	udev_rules = 0
	verify_udev_operations = 1
	monitoring = 0
}
global {
	event_activation = 0
}
EOF
# Go programs resolve "localhost" through these files.
printf '127.0.0.1 localhost\n::1 localhost\n' >"$r/etc/hosts"
echo 'hosts: files' >"$r/etc/nsswitch.conf"
echo 'root:x:0:0:root:/root:/bin/bash' >"$r/etc/passwd"
printf 'root:x:0:\ndisk:x:6:\n' >"$r/etc/group"

cat >"$r/init" <<'EOF'
#!/bin/bash
# PID 1 of the test guest: prepare the system, run /etc/lvm-agent/cmd (written
# by run.sh), leave its exit code in the share, power off. A failure before the
# command powers off without an exit code, which run.sh reports as a failure.
set -eu
trap 'echo "vm-init: setup failed at line $LINENO"; poweroff -f' ERR
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin HOME=/root TERM=dumb
# No udev: libdevmapper must make the /dev/mapper nodes itself. lvm does so
# by lvm.conf (udev_rules=0); dmsetup reads no lvm.conf and needs this.
export DM_DISABLE_UDEV=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
# What udev makes on a real system; bash's process substitution opens /dev/fd/N.
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
while read -r m; do insmod "$m"; done </etc/modules.list
# What a node's boot does for LVM: activate the LVs of the volume groups on
# its disks (run.sh --disk), as lvm2's autoactivation allows (-aay: the LVs
# that auto_activation_volume_list and the VG's and LV's autoactivation
# settings let through). On a node with udev, lvm2's 69-lvm.rules run it per
# disk as the disk appears (event activation); this guest has no udev, so
# its init runs it once, the drivers loaded, as lvm2's static activation
# services did. Nothing here knows of lvm-agent or of a test.
lvm vgchange -aay || echo "vm-init: vgchange -aay failed"
ip link set lo up
hostname lvm-agent-vm
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /share
mkdir -p /share/.vm
: >/share/.vm/started  # its mtime tells run.sh when the boot ended
trap - ERR
set +e
bash /etc/lvm-agent/cmd </dev/null
rc=$?
dmesg >/share/.vm/dmesg  # the console shows only kernel messages above errors
echo "$rc" >/share/.vm/exit-code
sync
echo "vm-init: command exited with $rc"
poweroff -f
EOF
chmod +x "$r/init"

(cd "$r" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet) >"$work/out/initramfs.cpio"
printf 'kernel %s\n%s\n' "$kver" "$files" >"$work/out/manifest"
rm -rf "$OUT" && mv "$work/out" "$OUT"
# Older builds are ~60-90 MB each. Another checkout on this machine may still
# boot its own (a different script, a different key), so only builds left
# untouched for a day go.
find "$CACHE/guest" -mindepth 1 -maxdepth 1 -regextype egrep \
  -regex '.*/([0-9a-f]{16}|resolved-[0-9a-f]{16})' ! -name "$key" ! -name "${resolved##*/}" \
  -mtime +0 -exec rm -rf {} +
times_add "build: guest image (downloads included)" $((SECONDS - t0))
log "vmlinux:        $OUT/vmlinux"
log "initramfs.cpio: $OUT/initramfs.cpio ($(du -h "$OUT/initramfs.cpio" | cut -f1))"
echo "$OUT"
