#!/usr/bin/env bash
# `make bench-lvm`: in one guest run, what the agent adds to lvmd (see
# integration/guest/bench_test.go): medians of
#   (a) raw lvmd CreateLV / RemoveLV,
#   (b) the same through the agent (request written -> created / deleted seen),
#   (c) a burst of creates (all written -> all created),
# the ratios (b)/(a) and (c)/(n x a) against their goals (1.10, 1.05), and
# where the time goes. The table is printed and kept in
# $LVM_AGENT_CACHE/run/bench-results/results/bench.txt.
#
#   scripts/vm/bench-lvm.sh [--timeout SECONDS] [-- GUEST_TEST_ARGS...]
#       e.g.  -- -guest.bench-n 9 -guest.bench-burst 20
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
timeout=3600
while [ $# -gt 0 ]; do
  case $1 in
    --timeout) timeout=$2; shift 2 ;;
    --) shift; break ;;
    *) sed -n '2,13s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
  esac
done
t0=$SECONDS

bin=$("$here/guest-files.sh" lvm-agent guest.test)
mkdir -p "$CACHE/run"
files=$(mktemp -d "$CACHE/run/bench-files.XXXXXX")
trap 'rm -rf "$files"' EXIT
for b in etcd kube-apiserver lvmd google-lvmd lvm-agent guest.test; do ln "$bin/$b" "$files/$b"; done
share=$CACHE/run/bench-results
rm -rf "$share" && mkdir -p "$share"

load0=$(cut -d' ' -f1-3 /proc/loadavg)
rc=0
"$here/run.sh" --mem 3G --cpus 2 --timeout "$timeout" --files "$files" --share "$share" -- \
  bash /opt/lvm-agent/guest/bench.sh --bin /opt/lvm-agent -- "$@" || rc=$?
echo
if [ -f "$share/results/bench.txt" ]; then
  cat "$share/results/bench.txt"
else
  echo "bench-lvm: no table (the guest run failed; see above)"
  [ $rc -ne 0 ] || rc=1
fi
# TCG runs several times slower on a busy host; the ratios suffer less than the times.
echo "bench-lvm: host load before: $load0, after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench-lvm: total $((SECONDS - t0)) s, exit $rc"
exit $rc
