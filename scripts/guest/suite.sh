#!/usr/bin/env bash
# The in-guest entry point of the real-LVM test suite, run as root in the
# QEMU guest (scripts/vm/suite.sh) and in the Vagrant VM (see the
# Vagrantfile): the same script and binaries in both.
#
#   suite.sh [--bin DIR] [--no-devmapper] [-- GUEST_TEST_ARGS...]
#
#   --bin DIR       the binaries of scripts/vm/guest-files.sh (/opt/lvm-agent)
#   --no-devmapper  run only the integration suite
# Runs, each with -test.v:
#   1. devmapper.test: lvmbackend/devmapper against the guest's kernel;
#      lvmmeta.test: lvmbackend/lvmmeta against the guest's LVM;
#   2. guest.test: the integration suite (integration/guest). It starts etcd +
#      kube-apiserver first, sets up LVM (setup-lvm.sh), topolvm's lvmd
#      (start-lvmd.sh) and google/lvmd meanwhile, then runs the cases against
#      the real lvm-agent.
# Logs go to $LVM_AGENT_RESULTS (/share/results when /share is mounted, else
# /tmp/lvm-agent-results). Exit code: 0 only when every test binary passed; a
# missing binary is a failure.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=/opt/lvm-agent devmapper=1
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --no-devmapper) devmapper=''; shift ;;
    --) shift; break ;;
    *) sed -n '2,20s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2 ;;
  esac
done

if [ -z "${LVM_AGENT_RESULTS:-}" ]; then
  LVM_AGENT_RESULTS=/tmp/lvm-agent-results
  grep -q ' /share ' /proc/mounts && LVM_AGENT_RESULTS=/share/results
fi
mkdir -p "$LVM_AGENT_RESULTS"
export LVM_AGENT_RESULTS
export KUBEBUILDER_ASSETS=$bin LVM_AGENT_BIN=$bin/lvm-agent GOOGLE_LVMD_BIN=$bin/google-lvmd
export LVMD_BIN=$bin/lvmd LVM_AGENT_GUEST_SCRIPTS=$here
export LVMD_LOG=$LVM_AGENT_RESULTS/lvmd.log
# google/lvmd execs lvs, lvcreate... by bare name; setup-lvm.sh links them here.
export PATH=/usr/local/sbin:/usr/local/bin:$PATH

log() { echo "suite: $*"; }
rc=0

# run NAME ARGS...: one test binary, its output on the console and in NAME.log.
run() {
  local name=$1
  shift
  if [ ! -x "$bin/$name" ]; then
    log "FAIL: $bin/$name is missing (scripts/vm/guest-files.sh did not build it)"
    echo "--- FAIL: $name (binary missing)" >"$LVM_AGENT_RESULTS/$name.log"
    rc=1
    return
  fi
  local t0=$SECONDS
  log "running $name $*"
  # From a scratch directory: go test binaries expect to run in their
  # package's directory, and some write files there.
  (cd "$(mktemp -d)" && "$bin/$name" -test.v "$@") 2>&1 | tee "$LVM_AGENT_RESULTS/$name.log"
  local r=${PIPESTATUS[0]}
  log "$name exited $r after $((SECONDS - t0)) s"
  [ -z "${LVM_AGENT_GUEST_TIMES:-}" ] || printf 'suite: %s\t%d\n' "$name" $((SECONDS - t0)) >>"$LVM_AGENT_GUEST_TIMES"
  [ "$r" -eq 0 ] || rc=1
}

[ -z "$devmapper" ] || run devmapper.test -test.timeout 10m
# Its benchmark is bench.sh's, left out here by name.
[ -z "$devmapper" ] || run lvmmeta.test -test.timeout 20m -test.skip '^TestGuestBench$'
# The benchmark is left out by name, never by a skip inside the test:
# bench.sh selects it with its own -test.run.
[ $# -gt 0 ] || set -- -test.skip '^TestBench$'
run guest.test -test.timeout 30m -test.parallel 8 "$@"

echo
log "summary:"
grep -hE '^\s*--- (PASS|FAIL|SKIP)' "$LVM_AGENT_RESULTS"/*.test.log | sed 's/^/  /'
log "result: $([ $rc -eq 0 ] && echo PASS || echo FAIL)"
exit $rc
