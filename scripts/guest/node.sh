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
# Then the rest of issue 13's scenario, each step against `lvm lvs` and the
# objects: a volumeMode: Block PVC whose Pod writes and reads raw bytes (the
# node reads them on the LV too); a PVC larger than vg1 stays Pending with a
# FailedScheduling/ProvisioningFailed event and no LV; ten PVCs and Pods in one
# apply while the agent's Pod is deleted, all Bound with exactly one LV tagged
# with each claim's UID; all ten deleted until their PVs and LVs are gone; a
# Retain class (thick on vg1: the guest's lvmd config has no thin class)
# keeps its LV, tagged lvm-agent.retained, with the PV Released.
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
pod_yaml() { # pod_yaml NAME COMMAND [CLAIM [LABEL]]: a busybox Pod on PVC CLAIM (data)
  cat <<YAML
---
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default, labels: {app: ${4:-node}}}
spec:
  containers:
    - name: sh
      image: localhost/lvm-agent/busybox:guest
      imagePullPolicy: Never
      command: ["sh", "-c", "$2; sleep 3600"]
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: ${3:-data}}}]
YAML
}
pvc_yaml() { # pvc_yaml NAME SIZE [CLASS [MODE [LABEL]]]
  cat <<YAML
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, namespace: default, labels: {app: ${5:-node}}}
spec:
  storageClassName: ${3:-lvm-thick}
  volumeMode: ${4:-Filesystem}
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: $2}}
YAML
}
pod() { pod_yaml "$@" | kubectl apply -f -; }
pvc() { pvc_yaml "$@" | kubectl apply -f -; }
owned() { # owned CLAIM: how many LVs of vg1 carry CLAIM's ownership tag
  local uid
  uid=$(kubectl get pvc "$1" -o jsonpath='{.metadata.uid}')
  lvm lvs --noheadings -o lv_tags vg1 | grep -c -E "lvm-agent\.pvc\.$uid(,|[[:space:]]*\$)" || true
}
within() { # within SECONDS WHAT COMMAND...: COMMAND succeeds before the deadline
  local end=$((SECONDS + $1)) what=$2
  shift 2
  until "$@"; do
    [ $SECONDS -lt $end ] || { echo "node: no $what within the deadline"; return 1; }
    sleep 3
  done
}
pvc data 256Mi
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

step "A volumeMode: Block PVC: a Pod writes raw bytes to the device and reads them back"
pvc raw 64Mi lvm-thick Block
kubectl apply -f - <<'YAML'
apiVersion: v1
kind: Pod
metadata: {name: raw, namespace: default}
spec:
  containers:
    - name: sh
      image: localhost/lvm-agent/busybox:guest
      imagePullPolicy: Never
      command: ["sh", "-c", "printf 'raw bytes on an lvm-agent LV' | dd of=/dev/xvda bs=512 conv=sync,notrunc && sync; sleep 3600"]
      volumeDevices: [{name: data, devicePath: /dev/xvda}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: raw}}]
YAML
show kubectl wait --for=condition=Ready pod/raw --timeout=600s
# Ready comes when the container starts, maybe before its dd ran.
raw_read() { [ "$(kubectl exec raw -- dd if=/dev/xvda bs=28 count=1 2>/dev/null)" = "raw bytes on an lvm-agent LV" ]; }
within 120 "bytes on pod/raw's device" raw_read
show kubectl get pvc raw -o jsonpath='{.spec.volumeMode} {.status.phase} {.spec.volumeName}{"\n"}'
show kubectl exec raw -- dd if=/dev/xvda bs=28 count=1
echo
show lvm lvs -o lv_name,lv_size,lv_tags vg1
[ "$(owned raw)" = 1 ]
# The node sees the same bytes on the LV the PV names.
dev=$(kubectl get pv "$(kubectl get pvc raw -o jsonpath='{.spec.volumeName}')" -o jsonpath='{.spec.local.path}')
show dd if="$dev" bs=28 count=1
echo
[ "$(dd if="$dev" bs=28 count=1 2>/dev/null)" = "raw bytes on an lvm-agent LV" ]
pv=$(kubectl get pvc raw -o jsonpath='{.spec.volumeName}')
show kubectl delete pod raw --wait
show kubectl delete pvc raw --wait
show kubectl wait --for=delete "pv/$pv" --timeout=600s
[ -z "$(lvm lvs --noheadings vg1)" ]

step "A PVC larger than the VG (2 GiB): Pending, an event says why, no LV"
pvc huge 8Gi
pod huge true huge
huge_event() {
  kubectl get events --field-selector involvedObject.name=huge \
    -o jsonpath='{range .items[*]}{.reason}{": "}{.message}{"\n"}{end}' |
    grep -E '^(ProvisioningFailed|FailedScheduling):'
}
within 300 "event on pvc/huge or pod/huge" huge_event
show kubectl get events --field-selector involvedObject.name=huge
show kubectl get pvc huge
[ "$(kubectl get pvc huge -o jsonpath='{.status.phase}')" = Pending ]
show lvm lvs vg1
[ "$(owned huge)" = 0 ]
[ -z "$(lvm lvs --noheadings vg1)" ]
show kubectl delete pod huge --wait
show kubectl delete pvc huge --wait

step "Ten PVCs and Pods at once while the agent's Pod is deleted"
for i in $(seq 1 10); do
  pvc_yaml "many-$i" 64Mi lvm-thick Filesystem many
  pod_yaml "many-$i" "echo claim $i >/data/file && sync /data/file" "many-$i" many
done >"$CLUSTER_DIR/many.yaml"
echo "\$ kubectl apply -f many.yaml   # ten PVCs many-1..10 of 64Mi, ten Pods using them"
kubectl apply -f "$CLUSTER_DIR/many.yaml"
show kubectl -n lvm-agent delete pod -l app.kubernetes.io/name=lvm-agent
show kubectl -n lvm-agent rollout status daemonset/lvm-agent --timeout=600s
show kubectl wait --for=condition=Ready pod -l app=many --timeout=900s
show kubectl get pvc -l app=many
show lvm lvs -o lv_name,lv_size,lv_tags vg1
for i in $(seq 1 10); do
  [ "$(kubectl get pvc "many-$i" -o jsonpath='{.status.phase}')" = Bound ] || { echo "pvc/many-$i not Bound"; false; }
  n=$(owned "many-$i")
  [ "$n" = 1 ] || { echo "pvc/many-$i: $n LVs carry its tag"; false; }
  within 120 "file in pod/many-$i" eval '[ "$(kubectl exec "many-$i" -- cat /data/file 2>/dev/null)" = "claim $i" ]'
done
[ "$(lvm lvs --noheadings vg1 | wc -l)" = 10 ]
echo "node: ten claims Bound, exactly one LV each"

step "All ten deleted: the PVs released, deleted, gone; no LV left"
pvs=$(kubectl get pvc -l app=many -o jsonpath='{range .items[*]}pv/{.spec.volumeName} {end}')
show kubectl delete pod -l app=many --wait
show kubectl delete pvc -l app=many --wait
show kubectl get pv
# shellcheck disable=SC2086 # one word per PV
show kubectl wait --for=delete $pvs --timeout=900s
show lvm lvs vg1
[ -z "$(lvm lvs --noheadings vg1)" ]

step "A Retain class (thick, on vg1: the guest's lvmd serves no thin class) keeps its LV"
kubectl apply -f - <<'YAML'
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: lvm-thick-retain}
provisioner: lvm.lvm-agent.io
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain
parameters: {volumeGroup: vg1, fsType: ext4}
YAML
pvc kept 64Mi lvm-thick-retain
pod keeper 'echo kept >/data/file && sync /data/file' kept
show kubectl wait --for=condition=Ready pod/keeper --timeout=600s
pv=$(kubectl get pvc kept -o jsonpath='{.spec.volumeName}')
uid=$(kubectl get pvc kept -o jsonpath='{.metadata.uid}')
show kubectl delete pod keeper --wait
show kubectl delete pvc kept --wait
show kubectl wait --for=jsonpath='{.status.phase}'=Released "pv/$pv" --timeout=600s
show kubectl get pv "$pv"
show lvm lvs -o lv_name,lv_size,lv_tags vg1
tags=,$(lvm lvs --noheadings -o lv_tags vg1 | tr -d ' '),  # the only LV
[[ $tags == *",lvm-agent.pvc.$uid,"* && $tags == *,lvm-agent.retained,* ]]
step "node: OK"
