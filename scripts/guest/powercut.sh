#!/usr/bin/env bash
# The power cut on the node's disk, inside the guest (scripts/vm/faults.sh
# boots it twice on one disk). Two phases, one per boot:
#
#   powercut.sh write DEV   vg1 on DEV (setup-lvm.sh), a thick and a thin LV
#                           with ext4, a writer on each appending checksummed
#                           records, each fsync'd, its count then written to
#                           /share/synced-LV; then, writers still running,
#                           the power cut: /share/.vm/power-cut, on which
#                           run.sh --power-cut kills QEMU (nothing shut down,
#                           nothing flushed, nothing unmounted)
#   powercut.sh check       the next boot: every LV active before anything
#                           here touched LVM (the guest's init ran lvm2's
#                           vgchange -aay, as a node's boot does); each
#                           filesystem mounts; every synced record is there
#                           and intact. Prints one line per LV and a total;
#                           exit code 0 only with nothing lost or changed.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=$here:/usr/local/sbin:/usr/local/bin:$PATH
VG=vg1 LVS=(thick0 thin0) MNT=/mnt/powercut

# record N: one line, its checksum over the rest, so a torn or changed
# line cannot pass for a record.
record() { local body; body="record $1 $(printf '%0200d' "$1")"; echo "$body $(echo "$body" | md5sum | cut -c1-32)"; }

writer() { # LV: appends records until the power goes
  local f=$MNT/$1/records i=1
  while :; do
    record $i >>"$f"
    sync "$f" # fsync(2) of the file: record i is on the disk from here on
    echo $i >"/share/synced-$1.tmp" && mv "/share/synced-$1.tmp" "/share/synced-$1"
    i=$((i + 1))
  done
}

case ${1:-} in
  write)
    dev=${2:?usage: powercut.sh write DEV}
    LVM_VG=$VG LVM_DEVICE=$dev LVM_THIN_POOL_SIZE=256M setup-lvm.sh >/dev/null
    lvm lvcreate -q -y -n thick0 -L 64M "$VG"
    lvm lvcreate -q -y -n thin0 -V 64M --thinpool pool0 "$VG"
    for lv in "${LVS[@]}"; do
      mkfs.ext4 -q "/dev/$VG/$lv"
      mkdir -p "$MNT/$lv" && mount "/dev/$VG/$lv" "$MNT/$lv"
      writer "$lv" &
    done
    # Until each writer has synced a few records, then a little longer.
    for lv in "${LVS[@]}"; do
      until [ "$(cat "/share/synced-$lv" 2>/dev/null || echo 0)" -ge 20 ]; do sleep 0.2; done
    done
    sleep 2
    echo "powercut: the power goes now, writers running ($(for lv in "${LVS[@]}"; do printf '%s %s synced; ' "$lv" "$(cat "/share/synced-$lv")"; done))"
    : >/share/.vm/power-cut
    sleep 600 # run.sh kills QEMU
    echo "powercut: still running: run.sh did not cut the power" >&2
    exit 1
    ;;
  check)
    bad=0
    # First, before anything else touches LVM: what the boot activated.
    lvm lvs --noheadings -o lv_name,lv_active "$VG" | tee /share/lvs-at-boot
    for lv in "${LVS[@]}"; do
      state=$(awk -v n="$lv" '$1 == n { print $2 }' /share/lvs-at-boot)
      if [ "$state" != active ] || [ ! -b "/dev/$VG/$lv" ]; then
        echo "powercut: LV $VG/$lv is ${state:-missing} after the boot"
        bad=1
      fi
    done
    [ $bad -eq 0 ] || exit 1
    total_synced=0 total_lost=0 total_bad=0
    for lv in "${LVS[@]}"; do
      synced=$(cat "/share/synced-$lv")
      mkdir -p "$MNT/$lv" && mount "/dev/$VG/$lv" "$MNT/$lv" # ext4 replays its journal
      # Line i must be record i. Of the synced ones none may be missing
      # (lost) or differ (changed); after them, a tail the cut left short
      # or torn is allowed (torn), and whole records there count as extra.
      read -r ok lost changed extra torn < <(
        i=1 ok=0 changed=0 extra=0 torn=0
        while IFS= read -r line || [ -n "$line" ]; do
          want=$(record $i)
          if [ $i -le "$synced" ]; then
            if [ "$line" = "$want" ]; then ok=$((ok + 1)); else changed=$((changed + 1)); fi
          elif [ "$line" = "$want" ]; then extra=$((extra + 1)); else torn=$((torn + 1)); fi
          i=$((i + 1))
        done <"$MNT/$lv/records"
        echo "$ok" $((synced - ok - changed)) "$changed" "$extra" "$torn")
      echo "powercut: $VG/$lv: $synced records synced before the cut; read back $ok of them intact, $lost lost, $changed changed; after them $extra whole, $torn torn"
      total_synced=$((total_synced + synced)) total_lost=$((total_lost + lost)) total_bad=$((total_bad + changed))
      umount "$MNT/$lv"
    done
    echo "powercut: synced $total_synced, lost $total_lost, changed $total_bad"
    [ $total_lost -eq 0 ] && [ $total_bad -eq 0 ]
    ;;
  *)
    sed -n '2,19s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2
    exit 2
    ;;
esac
