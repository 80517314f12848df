#!/usr/bin/env bash
# In-guest entry point of the benchmarks (scripts/vm/bench.sh; works as well
# in the Vagrant VM):
#   lvm  (the default) the lvmd/agent benchmark: the integration suite's
#        TestBench alone, with the suite's set-up;
#        then lvmmeta's rows (below), appended to its table;
#   dm   lvmbackend/devmapper's BenchmarkDeviceState: reading the state of
#        200 LVs through the package, lvs and dmsetup;
#   wipe agent's BenchmarkWipe on the guest's disk /dev/vda (bench-wipe.txt);
#   meta lvmbackend/lvmmeta's TestGuestBench alone: the tags of 1,000 LVs
#        (pure Go, lvs, lvmd GetLVList) and lvm processes per create/delete.
# The table is printed and left in $LVM_AGENT_RESULTS/bench.txt (lvm),
# bench-dm.txt (dm) or bench-lvmmeta.txt (meta).
#
#   bench.sh [--bin DIR] [lvm|dm|meta|wipe] [-- ARGS...]
#       lvm: guest test flags, e.g.  -- -guest.bench-burst 20
#       dm:  go test flags, e.g.     -- -test.benchtime 10s
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=/opt/lvm-agent kind=lvm
usage() { sed -n '2,19s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    lvm | dm | meta | wipe) kind=$1; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
# Where suite.sh keeps its logs.
if [ -z "${LVM_AGENT_RESULTS:-}" ]; then
  LVM_AGENT_RESULTS=/tmp/lvm-agent-results
  grep -q ' /share ' /proc/mounts && LVM_AGENT_RESULTS=/share/results
fi
mkdir -p "$LVM_AGENT_RESULTS"
export LVM_AGENT_RESULTS

# lvmmeta: its own VG and lvmd; the table goes to bench-lvmmeta.txt.
meta() {
  [ -x "$bin/lvmmeta.test" ] || { echo "bench: $bin/lvmmeta.test is missing" >&2; return 1; }
  (cd "$(mktemp -d)" && LVMD_BIN=$bin/lvmd "$bin/lvmmeta.test" -test.v -test.run '^TestGuestBench$' -test.timeout 30m) 2>&1 |
    tee "$LVM_AGENT_RESULTS/lvmmeta-bench.log"
  return "${PIPESTATUS[0]}"
}
case $kind in
  meta) meta; exit $? ;;
  wipe) cd "$(mktemp -d)" && WIPE_BENCH_DEVICE=/dev/vda "$bin/agent.test" -test.run '^$' -test.bench '^BenchmarkWipe$' \
    -test.benchtime 1x -test.timeout 25m "$@" 2>&1 | tee "$LVM_AGENT_RESULTS/bench-wipe.txt"; exit "${PIPESTATUS[0]}" ;;
  lvm)
    "$here/suite.sh" --bin "$bin" --no-devmapper -- -test.run '^TestBench$' -test.timeout 55m "$@"
    rc=$?
    meta || rc=1
    cat "$LVM_AGENT_RESULTS/bench-lvmmeta.txt" >>"$LVM_AGENT_RESULTS/bench.txt" 2>/dev/null
    exit $rc ;;
esac
[ -x "$bin/devmapper.test" ] || { echo "bench: $bin/devmapper.test is missing" >&2; exit 1; }
# From a scratch directory, as suite.sh runs test binaries.
cd "$(mktemp -d)" &&
  "$bin/devmapper.test" -test.run '^$' -test.bench '^BenchmarkDeviceState$' \
    -test.benchtime 3s -test.timeout 15m "$@" 2>&1 | tee "$LVM_AGENT_RESULTS/devmapper-bench.log"
exit "${PIPESTATUS[0]}"
