#!/usr/bin/env bash
# Boots the test guest and runs scripts/guest/node.sh in it: a real one-node
# Kubernetes cluster (scripts/guest/cluster.sh), lvm-agent installed from
# deploy/ as a user would, then the story of node.sh's mode:
#   make demo        scripts/vm/node.sh --timeout 1800 -- --mode demo
#   make node        scripts/vm/node.sh                 (the full scenario)
#   make test-node   the same, as a step of make test
#   make bench-node  scripts/vm/node.sh -- --mode bench [--runs N]
#   make demo-helm   scripts/vm/node.sh --timeout 1800 -- --mode demo --install helm
#   make bench-peers scripts/vm/node.sh --timeout 10800 -- --mode peers [--peers ARGS]
#                    (TopoLVM built and its chart rendered first: scripts/peers/)
#
#   make test-faults' power-cut-cluster (scripts/vm/faults.sh): twice on one
#                    disk, --power-cut -- --mode powercut --phase write, then
#                    -- --mode powercut --phase check
#
#   scripts/vm/node.sh [--timeout SECONDS] [--disk FILE] [--share DIR] [--power-cut] [-- NODE_SH_ARGS...]
#     --disk FILE  the node's disk (vg1): the caller's, kept (default: a new
#                  sparse file, removed at the end)
#     --share DIR  the share, kept as it is (default: node-results, emptied)
#     --power-cut  run.sh --power-cut: the guest may have QEMU killed
# Exit code: node.sh's (run.sh: 124 timeout, 125 no exit code). The host's
# load is printed at the start and the end: TCG's times follow it.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
timeout=2700  # the whole scenario took 1184 s under TCG with the host at load 4
disk='' share='' power_cut=()
while [ $# -gt 0 ]; do
  case $1 in
    --timeout) timeout=$2; shift 2 ;;
    --disk) disk=$2; shift 2 ;;
    --share) share=$2; shift 2 ;;
    --power-cut) power_cut=(--power-cut); shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done
t0=$SECONDS
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "node: host load at the start: $(load)"

# helm only for --install helm: a cold build of it costs minutes.
helm=()
case " $* " in *" --install helm "*) helm=(helm) ;; esac
# A node with lvmd as a host service runs the binaries themselves, not from
# the image: lvmd, and the agent (--install systemd).
host=()
case " $* " in *" --install host-lvmd "* | *" --install systemd "*) host=(lvmd lvm-agent) ;; esac
# The guest image (Debian's packages: downloads, unpacking) is made beside
# the builds; run.sh then finds it cached.
"$here/build-guest.sh" >/dev/null &
guest=$!
files=$("$here/guest-files.sh" --stage etcd kube-apiserver kube-controller-manager kube-scheduler \
  kubelet kubectl kube-proxy containerd containerd-shim-runc-v2 ctr images lvm-stories ${helm[@]+"${helm[@]}"} ${host[@]+"${host[@]}"})
trap 'rm -rf "$files"' EXIT
wait "$guest" || echo "node: the guest image was not built; run.sh tries again"
cp -a "$root/deploy" "$files/deploy"
case " $* " in
  *" --mode peers "*)
    "$root/scripts/peers/topolvm-build.sh" "$files/peer-images" >/dev/null
    mkdir -p "$files/peers"
    "$root/scripts/peers/topolvm-render.sh" "$files/peers/topolvm.yaml"
    ;;
esac
cp -a "$root/charts" "$files/charts"
echo "node: built in $((SECONDS - t0)) s; booting the guest (host load: $(load))"
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
if [ -z "$share" ]; then
  share=${LVM_AGENT_RUN:-$CACHE/run}/node-results
  rm -rf "$share"
fi
mkdir -p "$share"
# vg1 on a disk of its own, as on a node: a sparse file here, /dev/vda in
# the guest, gone at the end (unless it is the caller's: --disk).
gib=2
if [ -z "$disk" ]; then
  disk=$(mktemp "${LVM_AGENT_RUN:-$CACHE/run}/node-vg1.XXXXXX.img")
  trap 'rm -rf "$files" "$disk"' EXIT
  truncate -s ${gib}G "$disk"
fi
# A bench writes it whole first: a block never written in the sparse file
# costs the guest's first write to it (the host allocates it), a disk's
# does not, and a thick clone's copy (into a new LV) and dd after it (over
# the same LV) would not be timed alike.
case " $* " in *" --mode bench "*) dd if=/dev/zero of="$disk" bs=4M count=$((gib * 256)) conv=notrunc status=none ;; esac
rc=0
"$here/run.sh" --mem "${LVM_AGENT_NODE_MEM:-4G}" --cpus 2 --timeout "$timeout" --files "$files" --share "$share" --disk "$disk" ${power_cut[@]+"${power_cut[@]}"} -- \
  bash /opt/lvm-agent/guest/node.sh --bin /opt/lvm-agent --vg-device /dev/vda "$@" || rc=$?
echo "node: the cluster's logs: $share/cluster-logs"
[ ! -d "$share/bench" ] || echo "node: the bench's watch lines and logs: $share/bench"
echo "node: $([ $rc -eq 0 ] && echo OK || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s; host load at the end: $(load)"
exit $rc
