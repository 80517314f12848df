#!/usr/bin/env bash
# The real-LVM test suite, from the host: builds (cached) everything the guest
# needs (scripts/vm/guest-files.sh), boots ONE QEMU guest (scripts/vm/run.sh)
# and runs scripts/guest/suite.sh in it: the device-mapper and LVM metadata
# packages' guest tests, then the integration suite (integration/guest) against a real etcd +
# kube-apiserver, topolvm's lvmd, google/lvmd and the lvm-agent binary.
#
#   scripts/vm/suite.sh [--timeout SECONDS] [-- GUEST_TEST_ARGS...]
#       e.g.  -- -test.run 'TestTopolvm/protected'
#
# Exit code: the guest suite's; a guest that does not boot or does not finish
# is a failure (run.sh: 124 timeout, 125 no exit code), never a skip. Logs of
# the run stay in $LVM_AGENT_CACHE/run/suite-results/.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
RUN=${LVM_AGENT_RUN:-$CACHE/run}
timeout=1800
while [ $# -gt 0 ]; do
  case $1 in
    --timeout) timeout=$2; shift 2 ;;
    --) shift; break ;;
    *) sed -n '2,14s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
  esac
done
log() { echo "suite: $*" >&2; }
t0=$SECONDS

# A binary that does not build is left out, and the guest suite fails on it;
# the others still run.
files=$("$here/guest-files.sh" --stage etcd kube-apiserver lvmd google-lvmd lvm-agent guest.test devmapper.test lvmmeta.test) ||
  log "some binaries did not build (see above); running the rest"
[ -n "$files" ] || { log "FAIL: the guest's binaries could not be built"; exit 1; }
trap 'rm -rf "$files"' EXIT
share=$RUN/suite-results
rm -rf "$share" && mkdir -p "$share"
# TCG runs several times slower on a busy host: the load explains the times.
log "built in $((SECONDS - t0)) s; booting the guest (host load: $(cut -d' ' -f1-3 /proc/loadavg))"

rc=0
# run.sh's own lines (boot time, QEMU time) are kept for the summary.
"$here/run.sh" --mem 3G --cpus 2 --timeout "$timeout" --files "$files" --share "$share" -- \
  bash /opt/lvm-agent/guest/suite.sh --bin /opt/lvm-agent -- "$@" 2> >(tee "$share/run.log" >&2) || rc=$?
wait  # for tee

echo
log "guest boot: $(sed -n 's/.* boot=\([^ ]*\) .*/\1/p' "$share/run.log")  (QEMU start to the suite's first command)"
log "guest results: $share/results/"
log "total: $((SECONDS - t0)) s, exit $rc ($([ $rc -eq 0 ] && echo PASS || echo FAIL)); host load now: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $rc
