#!/usr/bin/env bash
# In-guest entry point of the benchmarks (scripts/vm/bench.sh; works as well
# in the Vagrant VM):
#   lvm  (the default) the lvmd/agent benchmark: the integration suite's
#        TestBench alone, with the suite's set-up;
#   dm   lvmbackend/devmapper's BenchmarkDeviceState: reading the state of
#        200 LVs through the package, lvs and dmsetup.
# The table is printed and left in $LVM_AGENT_RESULTS/bench.txt (lvm) or
# bench-dm.txt (dm).
#
#   bench.sh [--bin DIR] [lvm|dm] [-- ARGS...]
#       lvm: guest test flags, e.g.  -- -guest.bench-burst 20
#       dm:  go test flags, e.g.     -- -test.benchtime 10s
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=/opt/lvm-agent kind=lvm
usage() { sed -n '2,14s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    lvm | dm) kind=$1; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
[ "$kind" = dm ] ||
  exec "$here/suite.sh" --bin "$bin" --no-devmapper -- -test.run '^TestBench$' -test.timeout 55m "$@"

# Where suite.sh keeps its logs.
if [ -z "${LVM_AGENT_RESULTS:-}" ]; then
  LVM_AGENT_RESULTS=/tmp/lvm-agent-results
  grep -q ' /share ' /proc/mounts && LVM_AGENT_RESULTS=/share/results
fi
mkdir -p "$LVM_AGENT_RESULTS"
export LVM_AGENT_RESULTS
[ -x "$bin/devmapper.test" ] || { echo "bench: $bin/devmapper.test is missing" >&2; exit 1; }
# From a scratch directory, as suite.sh runs test binaries.
cd "$(mktemp -d)" &&
  "$bin/devmapper.test" -test.run '^$' -test.bench '^BenchmarkDeviceState$' \
    -test.benchtime 3s -test.timeout 15m "$@" 2>&1 | tee "$LVM_AGENT_RESULTS/devmapper-bench.log"
exit "${PIPESTATUS[0]}"
