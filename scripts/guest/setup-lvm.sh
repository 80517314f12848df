#!/usr/bin/env bash
# Gives a test machine real LVM to work on: volume group vg0 on a sparse
# loop-backed file (or on a disk of its own), with a thin pool vg0/pool0, and
# an lvmd config offering a `thick` (default) and a `thin` device class on
# it. Runs as root inside the QEMU guest (scripts/vm/run.sh) and in the
# Vagrant VM, so it needs only bash, coreutils or busybox, util-linux's
# blkid, and lvm2. Running it again is harmless.
#
# Settings (environment):
#   LVM_VG             volume group        (vg0)
#   LVM_DEVICE         a disk for the VG's one PV, instead of the loop file
#                      (the QEMU node's virtio disk, run.sh --disk): a blank
#                      one becomes the PV; one that holds $LVM_VG already is
#                      left as the boot found it (lvm2 activated its LVs, as
#                      on any node: nothing here activates them); one with
#                      anything else on it is refused, untouched
#   LVM_LOOP_FILE      backing file        (/var/lib/lvm-agent/$LVM_VG.img; RAM in the QEMU guest)
#   LVM_LOOP_SIZE      its sparse size     (2G)
#   LVM_THIN_POOL_SIZE size of $LVM_VG/pool0 (1G; thick LVs get the rest;
#                      0: no pool and no lvmd config, a plain VG)
#   LVMD_CONFIG        lvmd config to write (/etc/topolvm/lvmd.yaml; empty: none)
#   LVMD_SOCKET        lvmd's socket        (/run/topolvm/lvmd.sock)
set -euo pipefail

VG=${LVM_VG:-vg0}
POOL=pool0
DEVICE=${LVM_DEVICE:-}
FILE=${LVM_LOOP_FILE:-/var/lib/lvm-agent/$VG.img}
SIZE=${LVM_LOOP_SIZE:-2G}
POOL_SIZE=${LVM_THIN_POOL_SIZE:-1G}
CONFIG=${LVMD_CONFIG-/etc/topolvm/lvmd.yaml}
SOCKET=${LVMD_SOCKET:-/run/topolvm/lvmd.sock}

lvm=$(command -v lvm) || { echo "setup-lvm: lvm not found (install lvm2)" >&2; exit 1; }

# google/lvmd execs these by bare name through $PATH.
for name in lvs vgs pvs lvcreate lvremove lvchange vgchange; do
  command -v "$name" >/dev/null || ln -sf "$lvm" "/usr/local/sbin/$name"
done

where=${DEVICE:-"$FILE ($SIZE)"}
if ! "$lvm" vgs "$VG" >/dev/null 2>&1; then
  fresh=
  if [ -n "$DEVICE" ]; then
    [ -b "$DEVICE" ] || { echo "setup-lvm: $DEVICE is not a block device" >&2; exit 1; }
    # blkid -p exits 2 when it finds no signature at all.
    sig=0 && blkid -p "$DEVICE" >/dev/null 2>&1 || sig=$?
    [ "$sig" = 2 ] || { echo "setup-lvm: $DEVICE is not blank and holds no $VG ($(blkid -p "$DEVICE" 2>&1)); left untouched" >&2; exit 1; }
    dev=$DEVICE fresh=1
  else
    mkdir -p "$(dirname "$FILE")"
    [ -f "$FILE" ] || { truncate -s "$SIZE" "$FILE"; fresh=1; }
    # `losetup -f` then attach: busybox's losetup has no --show.
    dev=$(losetup -f)
    losetup "$dev" "$FILE"
  fi
  if [ -n "$fresh" ]; then
    "$lvm" vgcreate -y "$VG" "$dev"
    [ "$POOL_SIZE" = 0 ] || "$lvm" lvcreate -y --type thin-pool -L "$POOL_SIZE" -n "$POOL" "$VG"
  else
    # The file survived a reboot (Vagrant) but its loop device did not.
    "$lvm" vgchange -ay "$VG"
  fi
fi

if [ "$POOL_SIZE" = 0 ]; then
  echo "setup-lvm: $VG on $where, no thin pool"
  exit 0
fi
[ -n "$CONFIG" ] || { echo "setup-lvm: $VG on $where, thin pool $VG/$POOL ($POOL_SIZE), no lvmd config"; exit 0; }

# spare-gb must be set: lvmd keeps 10 GiB free per class by default, more than
# the whole test VG. lvm-command-prefix runs lvm directly; the default wraps it
# in `nsenter -t 1`, meant for a pod.
mkdir -p "$(dirname "$CONFIG")" "$(dirname "$SOCKET")"
cat >"$CONFIG" <<EOF
socket-name: $SOCKET
lvm-command-prefix: ["$lvm"]
device-classes:
  - name: thick
    volume-group: $VG
    type: thick
    default: true
    spare-gb: 0
  - name: thin
    volume-group: $VG
    type: thin
    spare-gb: 0
    thin-pool:
      name: $POOL
      overprovision-ratio: 5
EOF
echo "setup-lvm: $VG on $where, thin pool $VG/$POOL ($POOL_SIZE), lvmd config $CONFIG"
