#!/usr/bin/env bash
# What an lvcreate killed (SIGKILL, as with lvmd's container) leaves behind,
# at N kill points spread over one lvcreate's run. Before each, a 16 MiB LV
# with an ext4 on it is made and removed, so the killed lvcreate gets the
# extents a deleted volume's filesystem is on, as on a node. For each kill:
# the LV's lv_attr, whether /dev/VG/LV exists, device-mapper's state, and
# what blkid finds on a live LV (the old ext4: lvcreate had not wiped it
# yet). Why the agent does not answer with an LV of the claim it finds made
# (agent/volume.go, unfinished). Runs in the test guest, on a loop VG:
#
#   scripts/vm/run.sh -- bash /opt/lvm-agent/guest/lvcreate-kills.sh [N]
set -u
n=${1:-40}
LVM_VG=kills LVM_THIN_POOL_SIZE=0 bash "$(dirname "$0")/setup-lvm.sh"
old() { lvcreate -q -n old -L 16m -W y -y kills >/dev/null && mkfs.ext4 -q -F /dev/kills/old && lvremove -q -f kills/old >/dev/null; }
old
t0=$EPOCHREALTIME
lvcreate -q -n probe -L 8m -W y -y kills >/dev/null
ms=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%d", (b - a) * 1000 }')
lvremove -q -f kills/probe >/dev/null
echo "one lvcreate: $ms ms; $n kills from 0 to $((ms * 12 / 10)) ms after its start"
declare -A seen
for i in $(seq 1 "$n"); do
  old
  d=$((i * ms * 12 / (10 * n)))
  lvcreate -q -n "k$i" -L 8m -W y -y kills >/dev/null 2>&1 &
  p=$!
  sleep "$(awk -v d="$d" 'BEGIN { printf "%.3f", d / 1000 }')"
  kill -9 "$p" 2>/dev/null
  wait "$p" 2>/dev/null
  attr=$(lvs --noheadings -o lv_attr "kills/k$i" 2>/dev/null | tr -d ' ')
  dev=/dev/kills/k$i
  left="lv_attr ${attr:-(no LV)}, /dev/VG/LV $([ -e "$dev" ] && echo there || echo missing)"
  left+=", device-mapper $(dmsetup info -c --noheadings -o attr "kills-k$i" 2>/dev/null || echo "(none)")"
  [ ! -e "$dev" ] || left+=", blkid: $(blkid -p -o value -s TYPE "$dev" 2>/dev/null || echo nothing)"
  echo "kill at $d ms: $left"
  seen[$left]=$((${seen[$left]:-0} + 1))
  lvremove -q -f "kills/k$i" >/dev/null 2>&1
done
echo "what $n kills left:"
for k in "${!seen[@]}"; do echo "  ${seen[$k]} x $k"; done | sort -rn
