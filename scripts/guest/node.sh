#!/usr/bin/env bash
# The one-node cluster's check, inside the guest (scripts/vm/node.sh boots
# one): the cluster comes up (cluster.sh), a Pod with an emptyDir runs and
# answers `kubectl exec`, and deploy/ installed as a user would (`kubectl
# apply -k` of deploy/overlays/guest) gives a Ready lvm-agent DaemonSet: the
# agent and topolvm's lvmd as Pods, lvmd running the node's lvm through
# nsenter, on a loop-backed vg1 (the VG deploy/base's lvmd config names), and
# the provisioner Deployment. Then deploy/examples' thick StorageClass, a
# Filesystem PVC and a Pod that writes and fsyncs a file; the Pod deleted and
# created again reads the same bytes; the PVC deleted, its PV and LV go.
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
show kubectl -n lvm-agent rollout status deployment/lvm-agent-provisioner --timeout=600s

step "A StorageClass, a Filesystem PVC and a Pod that writes to it (the user's three lines)"
show kubectl apply -f "$bin/deploy/examples/storageclass-thick.yaml"
pod() { # pod NAME COMMAND: a busybox Pod on PVC data
  kubectl apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  containers:
    - name: sh
      image: localhost/lvm-agent/busybox:guest
      imagePullPolicy: Never
      command: ["sh", "-c", "$2; sleep 3600"]
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
YAML
}
kubectl apply -f - <<'YAML'
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, namespace: default}
spec:
  storageClassName: lvm-thick
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 256Mi}}
YAML
pod writer 'echo written by the first Pod >/data/file && sync /data/file'
show kubectl wait --for=condition=Ready pod/writer --timeout=600s
show kubectl get pvc,pv
show kubectl exec writer -- cat /data/file
show lvm lvs vg1

step "The Pod deleted and created again: the same bytes"
show kubectl delete pod writer --wait
pod reader true
show kubectl wait --for=condition=Ready pod/reader --timeout=600s
show kubectl exec reader -- cat /data/file
[ "$(kubectl exec reader -- cat /data/file)" = "written by the first Pod" ]

step "The PVC deleted: the PV and the LV go"
show kubectl delete pod reader --wait
pv=$(kubectl get pvc data -o jsonpath='{.spec.volumeName}')
show kubectl delete pvc data --wait
show kubectl wait --for=delete "pv/$pv" --timeout=600s
show lvm lvs vg1
[ -z "$(lvm lvs --noheadings vg1)" ]
step "node: OK"
