#!/usr/bin/env bash
# The one-node cluster's check, inside the guest (scripts/vm/node.sh boots
# one): the cluster comes up (cluster.sh), a Pod with an emptyDir runs and
# answers `kubectl exec`, and deploy/ installed as a user would (`kubectl
# apply -k` of deploy/overlays/guest) gives a Ready lvm-agent DaemonSet: the
# agent and topolvm's lvmd as Pods, lvmd running the node's lvm through
# nsenter, on a loop-backed vg1 (the VG deploy/base's lvmd config names).
#
#   node.sh [--bin DIR]   DIR: guest-files.sh's binaries, images/ and deploy/ (/opt/lvm-agent)
# Exit code 0 only when every step worked.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=/opt/lvm-agent
[ "${1:-}" != --bin ] || bin=$2
export CLUSTER_DIR=${CLUSTER_DIR:-/var/lib/lvm-agent-cluster}
export KUBECONFIG=$CLUSTER_DIR/pki/admin.conf PATH=$bin:$here:/usr/local/sbin:/usr/local/bin:$PATH
t0=$SECONDS
step() { printf '\n==> [%3d s] %s\n' $((SECONDS - t0)) "$*"; }
show() { echo "\$ $*"; "$@"; }
dump() {
  echo "node: FAILED at line $1"
  kubectl get pods -A -o wide 2>&1 || true
  kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -n 30 || true
  kubectl -n lvm-agent logs ds/lvm-agent --all-containers --tail 20 2>&1 || true
  for f in "$CLUSTER_DIR"/logs/*.log; do echo "--- $f"; tail -n 15 "$f"; done
  # Whole logs for the host (scripts/vm/node.sh keeps the share).
  ! grep -q ' /share ' /proc/mounts || cp -r "$CLUSTER_DIR/logs" /share/cluster-logs
}
trap 'dump $LINENO' ERR

step "LVM: vg1 on a 2 GiB sparse loop file (deploy/base's lvmd config names vg1)"
LVM_VG=vg1 LVM_THIN_POOL_SIZE=0 LVM_LOOP_SIZE=2G setup-lvm.sh

step "The one-node cluster: etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet, kube-proxy"
cluster.sh --bin "$bin" up
show kubectl get nodes -o wide

step "A Pod with an emptyDir"
kubectl apply -f - <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: default}
spec:
  containers:
    - name: sh
      image: localhost/lvm-agent/busybox:guest
      imagePullPolicy: Never
      command: ["sh", "-c", "echo hello from $(cat /etc/hostname) >/data/hello; sleep 3600"]
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, emptyDir: {}}]
YAML
show kubectl wait --for=condition=Ready pod/hello --timeout=600s
show kubectl exec hello -- cat /data/hello

step "Installing lvm-agent as a user would: kubectl apply -k deploy/overlays/guest"
show kubectl apply -k "$bin/deploy/overlays/guest"
show kubectl -n lvm-agent rollout status daemonset/lvm-agent --timeout=600s
show kubectl -n lvm-agent get pods -o wide
show kubectl -n lvm-agent logs daemonset/lvm-agent -c lvm-agent --tail 5
show kubectl get node "$(hostname)" -o jsonpath='{.metadata.annotations}'
echo
show lvm vgs vg1
step "node: OK"
