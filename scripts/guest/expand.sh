# Sourced by node.sh (demo and full modes), after its Block step, with its
# helpers (step, show, pod, pvc, within, storage_class) and the Block PVC "raw" (64 Mi) in
# place: volumes grow while their Pod runs (issue 26). It leaves nothing of
# its own behind but "raw" (grown), which node.sh deletes next, and the
# StorageClass lvm-xfs.
# shellcheck shell=bash

lv_bytes() { lvm lvs --noheadings --units b --nosuffix -o lv_size "vg1/$1" | tr -d ' '; }
# grow_fs CLASS FS FROM TO: a Pod keeps appending to a log on a FS volume of
# CLASS while its claim's request goes from FROM to TO (Mi); df in the same
# running Pod sees the new size, and a file written before reads the same.
grow_fs() {
  local class=$1 fs=$2 from=$3 to=$4 uid seed pv grown nudge got
  step "A volume grows under its running Pod: $fs, $from MiB -> $to MiB" \
    "The Pod keeps appending to a log while its PVC's request is raised. kube-controller-manager hands the claim" \
    "to lvm-agent's provisioner, whose resizer has the node's agent extend the LV (lvmd's ResizeLV); kubelet then" \
    "grows $fs online. df in the same Pod shows the new size, and a file written before reads the same."
  pvc grow "${from}Mi" "$class"
  # shellcheck disable=SC2016 # the Pod's shell expands them
  pod grower 'head -c 4194304 /dev/urandom >/data/seed && md5sum /data/seed >/data/seed.md5 && sync; (i=0; while :; do echo $i >>/data/log; i=$((i+1)); sleep 0.2; done) & true' grow
  show kubectl wait --for=condition=Ready pod/grower --timeout=600s
  within 60 "/data/seed.md5 in pod/grower" kubectl exec grower -- test -s /data/seed.md5
  uid=$(kubectl get pod grower -o jsonpath='{.metadata.uid}')
  # One kubectl run for what the Pod reads (each costs about a second here).
  echo "\$ kubectl exec grower -- sh -c 'md5sum /data/seed; df -h /data'"
  seed=$(kubectl exec grower -- sh -c 'md5sum /data/seed; df -h /data')
  echo "$seed"
  seed=$(head -n1 <<<"$seed")
  grown=$SECONDS
  show kubectl patch pvc grow -p "{\"spec\":{\"resources\":{\"requests\":{\"storage\":\"${to}Mi\"}}}}"
  pv=$(kubectl get pvc grow -o jsonpath='{.spec.volumeName}')
  # kubelet grows the filesystem when it syncs the Pod, then sets the
  # claim's capacity: at once, because the provisioner annotates the Pod
  # (its periodic sync is a minute away). One watch, not a kubectl a second.
  show kubectl wait --for=jsonpath='{.status.capacity.storage}'="${to}Mi" pvc/grow --timeout=300s
  # The same Pod (its UID, no restart) carries the nudge.
  nudge=$(kubectl get pod grower -o jsonpath="{.metadata.uid} {.status.containerStatuses[0].restartCount} {.metadata.annotations['pv\.csi\.alibabacloud\.com/volume\.resize-nudge']}")
  echo "    The claim's capacity ${to}Mi $((SECONDS - grown)) s after the request; the Pod's nudge: ${nudge#* * }"
  [ "$nudge" = "$uid 0 grow=${to}Mi" ]
  show kubectl get pvc grow
  show kubectl get events --field-selector involvedObject.name=grow --sort-by=.lastTimestamp
  show lvm lvs -o lv_name,lv_size vg1
  [ "$(lv_bytes "$pv")" = $((to << 20)) ]
  echo "    The same Pod (no restart): the new size, the file written before the grow unchanged, the log still growing:"
  # df -P: one line per filesystem (busybox wraps a long device-mapper name).
  got='df -h /data; df -kP /data; md5sum /data/seed; wc -l </data/log; sleep 1; wc -l </data/log'
  echo "\$ kubectl exec grower -- sh -c '$got'"
  got=$(kubectl exec grower -- sh -c "$got")
  echo "$got"
  # The filesystem's own overhead stays well under a fifth of the device.
  [ "$(grep -A1 '^Filesystem.*1024-blocks' <<<"$got" | awk 'NR == 2 { print $2 }')" -gt $((to * 1024 * 4 / 5)) ]
  grep -qxF "$seed" <<<"$got"
  [ "$(tail -n1 <<<"$got")" -gt "$(tail -n2 <<<"$got" | head -n1)" ]
  show kubectl delete pod/grower pvc/grow --wait
  show kubectl wait --for=delete "pv/$pv" --timeout=600s
}
grow_fs lvm-thick ext4 64 256
# xfsprogs 6 makes no xfs smaller than 300 MiB.
storage_class lvm-xfs vg1 xfs
grow_fs lvm-xfs xfs 320 640

step "A Block PVC grows: the Pod's device shows the new size at once" \
  "No filesystem: the claim is done when the LV has grown; blockdev in the running Pod reads the device's size."
show kubectl exec raw -- blockdev --getsize64 /dev/xvda
show kubectl patch pvc raw -p '{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}'
raw_grown() { [ "$(kubectl exec raw -- blockdev --getsize64 /dev/xvda)" = $((128 << 20)) ]; }
within 120 "134217728 bytes on pod/raw's /dev/xvda" raw_grown
show kubectl exec raw -- blockdev --getsize64 /dev/xvda
show kubectl wait --for=jsonpath='{.status.capacity.storage}'=128Mi pvc/raw --timeout=60s
show kubectl get pvc raw

step "A request bigger than the VG (8 GiB): a Warning, the LV as it was" \
  "The agent answers InsufficientCapacity; the claim says ControllerResizeInfeasible and can be lowered again."
show kubectl patch pvc raw -p '{"spec":{"resources":{"requests":{"storage":"8Gi"}}}}'
raw_pv=$(kubectl get pvc raw -o jsonpath='{.spec.volumeName}')
infeasible() { [ "$(kubectl get pvc raw -o jsonpath='{.status.allocatedResourceStatuses.storage}')" = ControllerResizeInfeasible ]; }
within 120 "ControllerResizeInfeasible on pvc/raw" infeasible
show kubectl get events --field-selector involvedObject.name=raw,reason=VolumeResizeFailed
[ -n "$(kubectl get events --field-selector involvedObject.name=raw,reason=VolumeResizeFailed,type=Warning -o name)" ]
show kubectl get pv "$raw_pv" -o jsonpath='{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.reason}: {.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.error}{"\n"}'
[ "$(lv_bytes "$raw_pv")" = $((128 << 20)) ]
[ "$(kubectl exec raw -- blockdev --getsize64 /dev/xvda)" = $((128 << 20)) ]

