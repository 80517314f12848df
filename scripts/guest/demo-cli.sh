#!/usr/bin/env bash
# The CLI demo (`make demo-cli`), inside the guest (scripts/vm/demo-cli.sh
# boots one; works as well in the Vagrant VM): the whole stack on one
# machine, and one volume's life through the real operator CLI.
#
#   demo-cli.sh [--bin DIR]    DIR: binaries of scripts/vm/guest-files.sh (/opt/lvm-agent)
#
#   etcd + kube-apiserver  (lvm-devcluster up: the integration harness's)
#   LVM: vg0 on a loop device, thin pool vg0/pool0  (setup-lvm.sh)
#   topolvm's lvmd                                  (start-lvmd.sh)
#   lvm-agent --node-name demo-node
#   a PVC scheduled to demo-node -> lvm-agent volume create -> lvs
#   a PV bound to it, the claim deleted (PV Released) -> lvm-agent volume delete -> lvs
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=/opt/lvm-agent
[ "${1:-}" != --bin ] || bin=$2
NODE=demo-node
work=$(mktemp -d /tmp/lvm-agent-demo.XXXXXX)
export PATH=$bin:$here:/usr/local/sbin:/usr/local/bin:$PATH
export KUBECONFIG=$work/kubeconfig
t0=$SECONDS

step() { printf '\n==> [%3d s] %s\n' $((SECONDS - t0)) "$*"; }
show() { echo "\$ $*"; "$@"; }
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  start-lvmd.sh stop >/dev/null 2>&1 || true
}
failed() {
  echo
  echo "demo: FAILED at line $1"
  for f in "$work"/*.log; do echo "--- last lines of $f"; tail -n 20 "$f"; done
}
trap 'failed $LINENO' ERR
trap cleanup EXIT

step "Starting etcd + kube-apiserver in the background (under TCG: 1-2 minutes until ready)"
lvm-devcluster up --assets "$bin" --dir "$work" >"$work/devcluster.log" 2>&1 &
pids+=($!)
devcluster=$!

step "Setting up LVM meanwhile: volume group vg0 on a 4 GiB sparse loop file, thin pool vg0/pool0"
LVM_LOOP_SIZE=4G setup-lvm.sh
show lvm vgs vg0

step "Starting topolvm's lvmd (device classes: thick = vg0, thin = vg0/pool0)"
LVMD_LOG=$work/lvmd.log start-lvmd.sh start

step "Waiting for the API server"
for ((i = 0; i < 5000; i++)); do
  [ -s "$KUBECONFIG" ] && break
  kill -0 "$devcluster" 2>/dev/null || { echo "lvm-devcluster exited"; false; }
  sleep 0.1
done
[ -s "$KUBECONFIG" ] || { echo "the API server was not ready within 500 s"; false; }
cat "$work/devcluster.log"

step "Starting lvm-agent for node $NODE (spec volumeGroup vg0 -> lvmd device class thick)"
echo "\$ lvm-agent --node-name $NODE --kubeconfig $KUBECONFIG --backend topolvm --device-class-map vg0=thick --metrics-address 127.0.0.1:8495 &"
lvm-agent --node-name "$NODE" --kubeconfig "$KUBECONFIG" --backend topolvm \
  --device-class-map vg0=thick --metrics-address 127.0.0.1:8495 >"$work/agent.log" 2>&1 &
pids+=($!)
for ((i = 0; i < 1200; i++)); do
  wget -q -O /dev/null http://127.0.0.1:8495/readyz 2>/dev/null && break
  sleep 0.1
done
show wget -q -O - http://127.0.0.1:8495/readyz

step "Creating PVC default/demo, scheduled to $NODE (what the scheduler does)"
show lvm-devcluster pvc --namespace default --name demo --node "$NODE"

# 1Gi, unless vg0 was made smaller before (a Vagrant VM provisioned with
# setup-lvm.sh's default 2 GiB, half of it the thin pool).
size=1Gi
free=$(lvm vgs --noheadings --units b --nosuffix -o vg_free vg0 | tr -d ' ')
[ "$free" -ge $((1 << 30)) ] || size=256Mi

step "Asking for its volume, as a provisioner would"
show lvm-agent volume create --namespace default --pvc demo --vg vg0 --size "$size" --timeout 5m

step "lvs: the new LV, tagged with the claim's UID"
show lvm lvs -o lv_name,vg_name,lv_size,lv_attr,lv_tags vg0
lv=$(lvm lvs --noheadings -o lv_name -S 'lv_name=~^pvc-' vg0 | tr -d ' ')
[ -n "$lv" ]

step "lvm-agent volume status: the request (API side) next to lvmd's LV and its device-mapper device"
show lvm-agent volume status --node "$NODE" --device-class-map vg0=thick -o wide

step "Creating PV demo-pv bound to the claim, with node affinity to $NODE (what the CSI provisioner does)"
show lvm-devcluster pv --name demo-pv --claim default/demo --node "$NODE" --spec "vg0/$lv"

step "Deleting the claim; the PV is Released (what Kubernetes does before it asks for the delete)"
show lvm-devcluster release --pv demo-pv

step "Removing the volume behind the PV"
show lvm-agent volume delete --pv demo-pv --timeout 5m

step "lvs: the LV is gone"
show lvm lvs -o lv_name,vg_name,lv_size,lv_attr,lv_tags vg0
if lvm lvs "vg0/$lv" >/dev/null 2>&1; then echo "vg0/$lv still exists"; false; fi

step "Done: the volume was created and removed through the protocol in $((SECONDS - t0)) s"
