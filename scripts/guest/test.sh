#!/usr/bin/env bash
# make test's guest step, inside ONE guest (scripts/vm/test.sh boots it): the
# power cut's check (the boot before this one, on the same disk, had its
# power cut while it wrote: make test-faults' power-cut part), the in-guest
# suite (suite.sh), then the one-node cluster's full scenario (node.sh
# --mode full), on the same kernel and LVM, one after the other.
#
#   test.sh [--bin DIR] [--vg-device DEV] [PART...]   (default: every part, in order)
#       DEV: the node's disk for the scenario's vg1 (node.sh --vg-device)
#
# PARTS below lists them, each a function of this script: a new part of make
# test's guest run is one more function and its name in PARTS. Each part's
# wall time goes to $LVM_AGENT_GUEST_TIMES (/share/times.tsv when /share is
# mounted; make test's table shows it), and node.sh adds its steps' times.
# Every part runs even when one before it failed; the exit code is 0 only
# when every part passed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=/opt/lvm-agent vg_device=''
[ "${1:-}" != --bin ] || { bin=$2; shift 2; }
[ "${1:-}" != --vg-device ] || { vg_device=$2; shift 2; }
PARTS=(power_cut suite lvm_reset node)
[ $# -eq 0 ] || PARTS=("$@")
if [ -z "${LVM_AGENT_GUEST_TIMES:-}" ] && grep -q ' /share ' /proc/mounts; then
  export LVM_AGENT_GUEST_TIMES=/share/times.tsv
fi
log() { echo "test: $*"; }
# How busy the guest's vCPUs were during a part (idle vCPUs are host cores
# left to the host).
. "$here/cpu.sh"

# power_cut: before anything touches LVM, the LVs the boot activated and
# every record synced before the cut (powercut.sh check); then vg1 goes, so
# the suite (whose google/lvmd has a vg1 of its own) and the scenario start
# on a blank disk.
power_cut() {
  if [ -z "$vg_device" ] || [ ! -f /share/synced-thick0 ]; then
    log "power_cut: no power cut before this boot (scripts/vm/test.sh makes it)"
    return 1
  fi
  bash "$here/powercut.sh" check || return
  lvm vgremove -ff vg1 && lvm pvremove -ff -y "$vg_device" >/dev/null
}

# suite: devmapper.test, lvmmeta.test and guest.test (scripts/guest/suite.sh)
# against vg0 (topolvm's lvmd) and vg1 (google/lvmd).
suite() { bash "$here/suite.sh" --bin "$bin"; }

# lvm_reset: the suite's VGs and loop devices go, so the node scenario starts
# on a machine without them (it makes its own vg1, as deploy/ expects).
lvm_reset() {
  bash "$here/start-lvmd.sh" stop
  local vg
  for vg in $(lvm vgs --noheadings -o vg_name); do lvm vgremove -ff "$vg" || return; done
  losetup -D
  rm -rf /var/lib/lvm-agent
  [ -z "$(lvm vgs --noheadings -o vg_name)" ] && ! dmsetup ls | grep -qv '^No devices found'
}

# node: the one-node cluster and issue 13's whole scenario (make test-node).
node() { bash "$here/node.sh" --bin "$bin" --mode full ${vg_device:+--vg-device "$vg_device"}; }

rc=0
for p in "${PARTS[@]}"; do
  t0=$SECONDS
  read -r b0 a0 < <(cpu)
  log "== $p"
  r=0
  "$p" || r=$?
  read -r b1 a1 < <(cpu)
  busy="vCPUs $(busy "$b0" "$a0" "$b1" "$a1")% busy"
  log "== $p exited $r after $((SECONDS - t0)) s ($busy)"
  [ -z "${LVM_AGENT_GUEST_TIMES:-}" ] || printf '%s (%s)%s\t%s\n' "$p" "$busy" "$([ $r -eq 0 ] || echo ", FAILED")" $((SECONDS - t0)) >>"$LVM_AGENT_GUEST_TIMES"
  [ $r -eq 0 ] || rc=1
done
log "result: $([ $rc -eq 0 ] && echo PASS || echo FAIL)"
# The exit code: 0 when every part passed. A test, not `exit $rc`: after a
# last exit, shellcheck 0.9.0 takes every function above for unreachable
# (SC2317).
[ $rc -eq 0 ]
