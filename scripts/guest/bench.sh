#!/usr/bin/env bash
# In-guest entry point of the lvmd/agent benchmark (scripts/vm/bench-lvm.sh;
# works as well in the Vagrant VM): the integration suite's TestBench alone,
# with the suite's set-up. The table is printed and left in
# $LVM_AGENT_RESULTS/bench.txt.
#
#   bench.sh [--bin DIR] [-- GUEST_TEST_ARGS...]   e.g. -- -guest.bench-burst 20
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=/opt/lvm-agent
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --) shift; break ;;
    *) sed -n '2,8s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
  esac
done
exec "$here/suite.sh" --bin "$bin" --no-devmapper -- -test.run '^TestBench$' -test.timeout 55m "$@"
