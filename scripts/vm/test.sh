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
names=(etcd kube-apiserver lvmd google-lvmd lvm-agent guest.test devmapper.test lvmmeta.test
  kube-controller-manager kube-scheduler kubelet kubectl kube-proxy containerd containerd-shim-runc-v2 ctr images)
timeout=4500 files=''
while [ $# -gt 0 ]; do
  case $1 in
    --timeout) timeout=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --names) echo "${names[*]}"; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
t0=$SECONDS
log() { echo "guest: $*" >&2; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
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

share=$RUN/test-results
rm -rf "$share" && mkdir -p "$share"
# The scenario's vg1 on a disk of its own (guest node.sh --vg-device): a
# sparse file here, /dev/vda in the guest, gone at the end.
disk=$(mktemp "$RUN/test-vg1.XXXXXX.img")
trap 'rm -rf "$files" "$disk"' EXIT
truncate -s 2G "$disk"
rc=0
t1=$SECONDS
"$here/run.sh" --mem "${LVM_AGENT_TEST_MEM:-5G}" --cpus 2 --timeout "$timeout" --files "$files" --share "$share" --disk "$disk" -- \
  bash /opt/lvm-agent/guest/test.sh --bin /opt/lvm-agent --vg-device /dev/vda "$@" 2> >(tee "$share/run.log" >&2) || rc=$?
wait # for tee
boot=$(sed -n 's/.* boot=\([0-9]*\).*/\1/p' "$share/run.log")
[ -z "$boot" ] || times_add "boot (QEMU start to the first command)" "$boot"
[ ! -f "$share/times.tsv" ] || while IFS=$'\t' read -r what secs; do times_add "in guest: $what" "$secs"; done <"$share/times.tsv"
times_add "the guest, boot to power-off" $((SECONDS - t1))
[ $rc -eq 0 ] || log "results: $share (results/: the suite's logs; cluster-logs/: the cluster's)"
log "$([ $rc -eq 0 ] && echo OK || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s; host load at the end: $(load)"
exit $rc
