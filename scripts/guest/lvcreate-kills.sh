#!/usr/bin/env bash
# What an lvcreate killed (SIGKILL, as with lvmd's container) leaves behind,
# at N kill points spread over one lvcreate's run: the LV's lv_attr, whether
# /dev/VG/LV and /dev/mapper/VG-LV exist, and device-mapper's state. Why the
# agent takes an LV of the claim listed with state '-', 'i' or 'd' for half
# made (agent/volume.go, half). Runs in the test guest, on a loop VG of its own:
#
#   scripts/vm/run.sh -- bash /opt/lvm-agent/guest/lvcreate-kills.sh [N]
set -u
n=${1:-40}
LVM_VG=kills LVM_THIN_POOL_SIZE=0 bash "$(dirname "$0")/setup-lvm.sh"
t0=$EPOCHREALTIME
lvcreate -q -n probe -L 8m -W y -y kills >/dev/null
ms=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }')
lvremove -q -f kills/probe >/dev/null
echo "one lvcreate: $ms ms; $n kills from 0 to $((ms * 12 / 10)) ms after its start"
declare -A seen
for i in $(seq 1 "$n"); do
  d=$((i * ms * 12 / (10 * n)))
  lvcreate -q -n "k$i" -L 8m -W y -y kills >/dev/null 2>&1 &
  p=$!
  sleep "$(awk -v d="$d" 'BEGIN { printf "%.3f", d / 1000 }')"
  kill -9 "$p" 2>/dev/null
  wait "$p" 2>/dev/null
  attr=$(lvs --noheadings -o lv_attr "kills/k$i" 2>/dev/null | tr -d ' ')
  left="lv_attr ${attr:-(no LV)}, /dev/VG/LV $([ -e "/dev/kills/k$i" ] && echo there || echo missing), device-mapper $(dmsetup info -c --noheadings -o attr "kills-k$i" 2>/dev/null || echo "(none)")"
  echo "kill at $d ms: $left"
  seen[$left]=$((${seen[$left]:-0} + 1))
  lvremove -q -f "kills/k$i" >/dev/null 2>&1
done
echo "what $n kills left:"
for k in "${!seen[@]}"; do echo "  ${seen[$k]} x $k"; done | sort -rn
