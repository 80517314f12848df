#!/usr/bin/env bash
# make test's guest step: builds (cached) what both guest runs need, boots ONE
# QEMU guest (scripts/vm/run.sh) and runs scripts/guest/test.sh in it: the
# in-guest suite (alone: make test-guest, scripts/vm/suite.sh), then the
# one-node cluster's full scenario (alone: make test-node, scripts/vm/node.sh).
# One boot and one build instead of two.
#
#   scripts/vm/test.sh [--timeout SECONDS] [--files DIR] [-- PART...]
#       PART: scripts/guest/test.sh's parts (default: all)
#       --files DIR: what `guest-files.sh --stage $(scripts/vm/test.sh --names)`
#                    printed (make test builds it beside its other steps);
#                    removed afterwards
#   scripts/vm/test.sh --names    the guest-files.sh names it needs
#   scripts/vm/test.sh --cut      the power cut's first boot alone (make test
#                                 runs it beside the builds; without it, the
#                                 guest step runs it first): a guest on the
#                                 node's disk, $RUN/test-vg1.img (sparse,
#                                 made here), writes fsync'd records to two
#                                 LVs of vg1 and has its power cut (QEMU
#                                 killed: scripts/guest/powercut.sh write,
#                                 make test-faults' power-cut part). The
#                                 guest step then boots on the same disk and
#                                 checks every synced record first.
#
# Exit code: the guest's (run.sh: 124 timeout, 125 no exit code). Logs stay
# in $LVM_AGENT_CACHE/run/test-results/ (the suite's results/, the cluster's
# logs when the scenario failed). Each part's time, and each of the scenario's
# steps', go to make test's table (scripts/times.sh).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
RUN=${LVM_AGENT_RUN:-$CACHE/run}
. "$root/scripts/times.sh"
names=(etcd kube-apiserver lvmd google-lvmd lvm-agent guest.test devmapper.test lvmmeta.test lvm-stories
  kube-controller-manager kube-scheduler kubelet kubectl kube-proxy containerd containerd-shim-runc-v2 ctr images)
log() { echo "guest: $*" >&2; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
timeout=4500 files=''
share=$RUN/test-results disk=$RUN/test-vg1.img
# first_boot: the power cut's first boot (above); the share keeps the synced counts
# for the check. 2 GiB: the scenario's vg1 after the check.
first_boot() {
  local t=$SECONDS
  rm -rf "$share" "$disk" && mkdir -p "$share"
  truncate -s 2G "$disk"
  "$here/run.sh" --timeout 600 --share "$share" --disk "$disk" --power-cut -- \
    bash /opt/lvm-agent/guest/powercut.sh write /dev/vda >&2
  [ -e "$share/.vm/power-cut" ] || { log "FAIL: the power cut's first boot ended without the cut"; rm -f "$disk"; return 1; }
  times_add "power cut: the first boot, writers on vg1, QEMU killed" $((SECONDS - t))
}
while [ $# -gt 0 ]; do
  case $1 in
    --timeout) timeout=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --names) echo "${names[*]}"; exit 0 ;;
    --cut) mkdir -p "$RUN"; first_boot; exit ;;
    --) shift; break ;;
    *) break ;;
  esac
done
t0=$SECONDS
log "host load at the start: $(load)"

if [ -z "$files" ]; then
  # The guest image (Debian's packages) beside the builds; run.sh then finds it cached.
  "$here/build-guest.sh" >/dev/null &
  guest=$!
  # A binary that does not build is left out, and the part needing it fails; the others still run.
  files=$("$here/guest-files.sh" --stage "${names[@]}") || log "some binaries did not build (see above); running the rest"
  [ -n "$files" ] || { log "FAIL: the guest's binaries could not be built"; exit 1; }
  wait "$guest" || log "the guest image was not built; run.sh tries again"
  times_add "build: the guest's files" $((SECONDS - t0))
fi
trap 'rm -rf "$files"' EXIT
cp -a "$root/deploy" "$files/deploy"
cp -a "$root/charts" "$files/charts"
log "built in $((SECONDS - t0)) s; booting the guest (host load: $(load))"

# The node's disk (guest node.sh --vg-device), a sparse file here, /dev/vda
# in the guest, gone at the end: the power cut's first boot, then this one
# (its check, then the scenario's vg1).
# (A failed first boot is the guest's power_cut part's failure.)
[ -f "$disk" ] && [ -e "$share/.vm/power-cut" ] || first_boot || true
trap 'rm -rf "$files" "$disk"' EXIT
[ -f "$disk" ] || truncate -s 2G "$disk"
rc=0
t1=$SECONDS
"$here/run.sh" --mem "${LVM_AGENT_TEST_MEM:-5G}" --cpus 2 --timeout "$timeout" --files "$files" --share "$share" --disk "$disk" -- \
  bash /opt/lvm-agent/guest/test.sh --bin /opt/lvm-agent --vg-device /dev/vda "$@" 2> >(tee "$share/run.log" >&2) || rc=$?
wait # for tee
boot=$(sed -n 's/.* boot=\([0-9]*\).*/\1/p' "$share/run.log")
[ -z "$boot" ] || times_add "boot (QEMU start to the first command)" "$boot"
[ ! -f "$share/times.tsv" ] || while IFS=$'\t' read -r what secs; do times_add "in guest: $what" "$secs"; done <"$share/times.tsv"
times_add "the guest, boot to power-off" $((SECONDS - t1))
log "results: $share (results/: the suite's logs; cluster-logs/: the cluster's, kept on every run)"
log "$([ $rc -eq 0 ] && echo OK || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s; host load at the end: $(load)"
exit $rc
