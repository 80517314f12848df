#!/usr/bin/env bash
# `make bench-lvm` and `make bench-dm`: one benchmark in one fresh guest.
#   lvm  what the agent adds to lvmd (integration/guest/bench_test.go): medians
#        of (a) raw lvmd CreateLV / RemoveLV, (b) the same through the agent
#        (request written -> created / deleted seen), taken sample by sample
#        side by side with (a), (c) a burst of creates
#        (all written -> all created), the ratios (b)/(a) and (c)/(n x a)
#        against their goals (1.10, 1.05), and where the time goes; then
#        the meta rows. Table: $LVM_AGENT_CACHE/run/bench-results/results/bench.txt.
#        By default 5 samples and a burst of 20 (-guest.bench-n 5
#        -guest.bench-burst 20), about 20 min of TCG guest; the flags after --
#        override them (the test's own defaults, 9 and 50, take about 1 h).
#   meta reading the tags of 1,000 LVs through lvmbackend/lvmmeta vs lvs vs
#        lvmd GetLVList, and lvm processes per create/delete, through lvmd
#        alone and through lvmbackend.Direct (lvmbackend/lvmmeta/
#        guest_bench_test.go). Table: .../bench-meta-results/results/bench-lvmmeta.txt.
#   dm   reading the state of 200 LVs (100 linear, a thin pool, 99 thin)
#        through lvmbackend/devmapper's ioctls vs one lvs vs one dmsetup
#        status (lvmbackend/devmapper/bench_guest_test.go). Table:
#        $LVM_AGENT_CACHE/run/bench-dm-results/results/bench-dm.txt.
#   wipe the wipe beside dd on one 1 GiB LV, and a writer on another LV while
#        it is wiped at the default --wipe-rate (agent/wipe_guest_test.go),
#        on a 2 GiB disk of the guest (a sparse file here). Table:
#        .../bench-wipe-results/results/bench-wipe.txt.
# The table is printed at the end, with the host's load.
#
#   scripts/vm/bench.sh lvm|dm|meta|wipe [--timeout SECONDS] [-- ARGS...]
#       lvm: guest test flags, e.g.  -- -guest.bench-n 9 -guest.bench-burst 50
#       dm:  go test flags, e.g.     -- -test.benchtime 10s
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
RUN=${LVM_AGENT_RUN:-$CACHE/run}
usage() { sed -n '2,29s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }
kind=${1:-}
# bins: what the guest gets.
case $kind in
  lvm) bins=(etcd kube-apiserver lvmd google-lvmd lvm-agent guest.test lvmmeta.test)
       timeout=3600 mem=3G share=$RUN/bench-results table=bench.txt ;;
  meta) bins=(lvmd lvmmeta.test)
      timeout=2400 mem=2G share=$RUN/bench-meta-results table=bench-lvmmeta.txt ;;
  dm) bins=(devmapper.test)
      timeout=1200 mem=2G share=$RUN/bench-dm-results table=bench-dm.txt ;;
  wipe) bins=(agent.test)
      timeout=1800 mem=2G share=$RUN/bench-wipe-results table=bench-wipe.txt ;;
  *) usage ;;
esac
shift
while [ $# -gt 0 ]; do
  case $1 in
    --timeout) timeout=$2; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
t0=$SECONDS
# Go's flag package keeps the last of a repeated flag: the caller's win.
[ "$kind" != lvm ] || set -- -guest.bench-n 5 -guest.bench-burst 20 "$@"

files=$("$here/guest-files.sh" --stage "${bins[@]}")
trap 'rm -rf "$files"' EXIT
rm -rf "$share" && mkdir -p "$share"

load0=$(cut -d' ' -f1-3 /proc/loadavg)
rc=0
disk=()
if [ "$kind" = wipe ]; then
  disk=(--disk "$share.img")
  trap 'rm -rf "$files" "$share.img"' EXIT
  truncate -s 2G "$share.img"
fi
"$here/run.sh" --mem "$mem" --cpus 2 --timeout "$timeout" --files "$files" --share "$share" "${disk[@]}" -- \
  bash /opt/lvm-agent/guest/bench.sh --bin /opt/lvm-agent "$kind" -- "$@" || rc=$?
echo
if [ -f "$share/results/$table" ]; then
  cat "$share/results/$table"
else
  echo "bench-$kind: no table (the guest run failed; see above)"
  [ $rc -ne 0 ] || rc=1
fi
# TCG runs several times slower on a busy host; the ratios suffer less than the times.
echo "bench-$kind: host load before: $load0, after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench-$kind: total $((SECONDS - t0)) s, exit $rc"
exit $rc
