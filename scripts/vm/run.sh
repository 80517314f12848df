#!/usr/bin/env bash
# Runs one command as root inside a fresh QEMU guest with real LVM (see
# build-guest.sh) and exits with that command's exit code.
#
#   scripts/vm/run.sh [--mem 2G] [--cpus 2] [--timeout SECONDS] [--files DIR]
#                     [--share DIR] [--disk FILE]... [--power-cut] -- COMMAND [ARGS...]
#
#   --files DIR  copied into the guest's RAM at /opt/lvm-agent/ (binaries run
#                several times faster from RAM than from 9p)
#   --share DIR  host folder mounted at /share over 9p, for results (default: a
#                temporary folder, removed afterwards). run.sh keeps its own
#                bookkeeping in DIR/.vm/ (exit-code, and the guest's full dmesg:
#                the console shows only kernel messages above errors).
#   --disk FILE  a raw disk image, attached as a virtio disk: the first is
#                /dev/vda, the next /dev/vdb. The caller makes it (sparse:
#                truncate -s) and removes it; it outlives the guest, so a
#                second run.sh on it boots a node that finds what the first
#                wrote, and a QEMU that is killed is a power cut.
#   --power-cut  the guest may ask for a power cut by creating
#                /share/.vm/power-cut: QEMU is then killed at once (SIGKILL:
#                no shutdown, nothing unmounted, the guest's RAM gone), and
#                run.sh exits 0 without the command's exit code.
# The repo's scripts/guest/ is always at /opt/lvm-agent/guest/. The command's
# output streams to this terminal through the guest's serial console. The guest
# has no network card: everything in it talks over its own loopback.
# Exit codes: the command's; 124 on timeout; 125 when the guest never reported
# an exit code (crash, panic, failed boot).
# LVM_AGENT_VM_ACCEL=kvm|tcg overrides the accelerator choice.
set -euo pipefail

usage() { sed -n '2,28s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit "$1"; }
log() { echo "vm: $*" >&2; }
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", a - b }'; }

mem=2G cpus=2 timeout=900 files='' share='' disks=() power_cut=''
while [ $# -gt 0 ]; do
  case $1 in
    --mem) mem=$2; shift 2 ;;
    --cpus) cpus=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --share) share=$2; shift 2 ;;
    --disk) disks+=("$2"); shift 2 ;;
    --power-cut) power_cut=1; shift ;;
    --) shift; break ;;
    -h | --help) usage 0 ;;
    *) log "unknown argument: $1"; usage 2 ;;
  esac
done
[ $# -gt 0 ] || usage 2
[ -z "$files" ] || [ -d "$files" ] || { log "--files $files: not a directory"; exit 2; }
# cache=writeback (QEMU's default): the guest's flushes reach the host file
# (fdatasync); what it had not written out is lost when QEMU dies, as a
# node's RAM is in a power cut. discard=unmap keeps the file sparse.
disk_args=()
for d in ${disks[@]+"${disks[@]}"}; do
  [ -f "$d" ] || { log "--disk $d: no such file"; exit 2; }
  disk_args+=(-drive "file=$d,format=raw,if=virtio,cache=writeback,discard=unmap")
done

t0=$(date +%s.%N)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
guest=$("$here/build-guest.sh")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
share=${share:-$work/share}
mkdir -p "$share/.vm"
rm -f "$share/.vm/exit-code" "$share/.vm/started" "$share/.vm/power-cut"

# A second cpio appended to the base initramfs: the kernel unpacks both, so
# per-run files cost no rebuild of the guest.
stage=$work/stage
mkdir -p "$stage/opt/lvm-agent" "$stage/etc/lvm-agent"
[ -z "$files" ] || cp -a "$files/." "$stage/opt/lvm-agent/"
cp -a "$here/../guest" "$stage/opt/lvm-agent/guest"
printf '%q ' "$@" >"$stage/etc/lvm-agent/cmd"
{
  cat "$guest/initramfs.cpio"
  (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet)
} >"$work/initrd"

# KVM when the CPU really offers it; a paravirtual /dev/kvm without vmx/svm
# (as on our build machines) hangs the guest kernel, so TCG there.
accel=${LVM_AGENT_VM_ACCEL:-}
if [ -z "$accel" ]; then
  accel=tcg
  [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo && accel=kvm
fi
case $accel in
  kvm) accel_args=(-accel kvm -cpu host) ;;
  tcg) accel_args=(-accel 'tcg,thread=multi') ;;  # QEMU's default CPU, as measured in the notes
  *) log "LVM_AGENT_VM_ACCEL must be kvm or tcg"; exit 2 ;;
esac
# Under TCG the guest's TSC counts at the host's TSC rate, and the guest
# kernel measures that rate against the emulated PIT at boot: on a busy host
# the measure can come out 50 times too low (dmesg: "Fast TSC calibration
# failed ... Detected 57.555 MHz processor"), and with tsc=reliable the
# guest's clock then runs 50 times fast (every timeout fires; seen once in
# make test). The host's own figure is given instead (tsc_early_khz): its
# kernel's, or /proc/cpuinfo's "cpu MHz" where the log no longer has it.
append="console=ttyS0 tsc=reliable panic=-1 loglevel=3"
if [ "$accel" = tcg ]; then
  mhz=$({ dmesg 2>/dev/null || true; } | sed -n 's/.*tsc: Detected \([0-9.]*\) MHz processor.*/\1/p' | head -n1)
  [ -n "$mhz" ] || mhz=$(sed -n 's/^cpu MHz[[:space:]]*: *\([0-9.]*\)$/\1/p' /proc/cpuinfo | head -n1)
  [ -z "$mhz" ] || append+=" tsc_early_khz=$(awk -v m="$mhz" 'BEGIN { printf "%d", m * 1000 }')"
fi
log "booting: accel=$accel mem=$mem cpus=$cpus timeout=${timeout}s${disks[*]+ disks=${disks[*]}}"

t1=$(date +%s.%N)
cutter=''
if [ -n "$power_cut" ]; then
  # Polls the share (9p writes reach the host file at once); QEMU's pid
  # from its -pidfile.
  (
    until [ -e "$share/.vm/power-cut" ]; do sleep 0.1; done
    kill -KILL "$(cat "$work/qemu.pid")"
  ) &
  cutter=$!
fi
qrc=0
# --foreground keeps QEMU in our process group, so Ctrl-C reaches it; stdin is
# /dev/null so QEMU leaves the terminal alone.
timeout --foreground -k 10 "$timeout" qemu-system-x86_64 "${accel_args[@]}" \
  -m "$mem" -smp "$cpus" -nodefaults -display none -no-reboot -nic none \
  -serial stdio -kernel "$guest/vmlinux" -initrd "$work/initrd" \
  -append "$append" \
  -virtfs "local,path=$share,mount_tag=share,security_model=none" ${disk_args[@]+"${disk_args[@]}"} \
  -pidfile "$work/qemu.pid" </dev/null || qrc=$?
t2=$(date +%s.%N)
if [ -n "$cutter" ]; then
  kill "$cutter" 2>/dev/null || true
  wait "$cutter" 2>/dev/null || true
fi

boot='?'
[ -f "$share/.vm/started" ] && boot=$(since "$(date -r "$share/.vm/started" +%s.%N)" "$t1")
log "accel=$accel boot=${boot}s (QEMU start to command) qemu=$(since "$t2" "$t1")s total=$(since "$t2" "$t0")s"

# 124: QEMU stopped on SIGTERM; 137: it needed the SIGKILL 10 s later.
if [ "$qrc" -eq 124 ] || { [ "$qrc" -eq 137 ] && [ "$(since "$t2" "$t1" | cut -d. -f1)" -ge "$timeout" ]; }; then
  log "TIMEOUT: the guest did not finish within ${timeout}s; QEMU was killed"
  exit 124
fi
if [ -n "$power_cut" ] && [ -e "$share/.vm/power-cut" ]; then
  log "POWER CUT: QEMU killed at the guest's request $(since "$t2" "$(date -r "$share/.vm/power-cut" +%s.%N)")s after it (QEMU exited $qrc)"
  exit 0
fi
rc=$(cat "$share/.vm/exit-code" 2>/dev/null || true)
if ! [[ $rc =~ ^[0-9]+$ ]]; then
  log "FAILED: the guest reported no exit code (QEMU exited $qrc)"
  exit 125
fi
log "command exited with $rc"
exit "$rc"
