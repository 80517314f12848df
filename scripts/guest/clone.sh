# Sourced by node.sh (demo and full modes), after expand.sh, with its
# helpers (step, show, pod, pvc, within, storage_class): clones (issue 27). Two
# sources, thin and thick, each with a Pod that wrote 4 MiB of random bytes
# and keeps running. A thin clone (twice the source's size) is made while
# its source's Pod writes; a thick clone asked while its source's Pod runs
# waits (SourceInUse) and is copied once that Pod is gone. A Pod on each
# clone reads the source's bytes, again after the sources are deleted. It
# leaves nothing behind but the StorageClass lvm-thin-ext4.
# shellcheck shell=bash

seeded() { kubectl exec "$1" -- md5sum /data/seed 2>/dev/null; }
event() { # event CLAIM REASON: the claim has an event of that reason
  [ -n "$(kubectl get events --field-selector "involvedObject.name=$1,reason=$2" -o name)" ]
}

step "Clones: two sources, a thin and a thick volume, each with a Pod that wrote 4 MiB and keeps running" \
  "The thin class lvm-thin-ext4 is deploy/examples/storageclass-thin.yaml (the thin pool vg1/pool0) with ext4 and Delete." \
  "The thin source's Pod also keeps appending to a log."
storage_class lvm-thin-ext4 thin ext4 # thin LVs in vg1/pool0 (lvmd's class "thin")
# The seed appears whole, synced, or not at all.
seed='head -c 4194304 /dev/urandom >/data/s && sync /data/s && mv /data/s /data/seed && sync /data'
# shellcheck disable=SC2016 # the Pod's shell expands it
{
  pvc_yaml src-thin 64Mi lvm-thin-ext4
  pod_yaml src-thin "$seed; (i=0; while :; do echo \$i >>/data/log; i=\$((i+1)); sleep 0.2; done) & true" src-thin
  pvc_yaml src-thick 64Mi lvm-thick
  pod_yaml src-thick "$seed" src-thick
} | kubectl apply -f -
show kubectl wait --for=condition=Ready pod/src-thin pod/src-thick --timeout=600s
within 60 "/data/seed in pod/src-thin" seeded src-thin
within 60 "/data/seed in pod/src-thick" seeded src-thick
thin_sum=$(seeded src-thin) thick_sum=$(seeded src-thick)
show kubectl exec src-thin -- md5sum /data/seed
show kubectl exec src-thick -- md5sum /data/seed

step "A thin clone of 128 MiB while the source's Pod writes: a thin snapshot, at once" \
  "The clone claim names the source in its dataSource; the provisioner places it on the source's node (ClonePlaced)," \
  "the agent has lvmd make a thin snapshot owned by the clone. Larger than its source: kubelet grows its ext4 on mount."
pvc thin-copy 128Mi lvm-thin-ext4 Filesystem node src-thin
pod thin-copy true thin-copy
show kubectl wait --for=condition=Ready pod/thin-copy --timeout=600s
show kubectl wait --for=jsonpath='{.status.capacity.storage}'=128Mi pvc/thin-copy --timeout=300s
show kubectl get events --field-selector involvedObject.name=thin-copy --sort-by=.lastTimestamp
event thin-copy ClonePlaced
show kubectl exec thin-copy -- md5sum /data/seed
[ "$(seeded thin-copy)" = "$thin_sum" ]
show kubectl exec thin-copy -- df -h /data
[ "$(kubectl exec thin-copy -- df -kP /data | awk 'NR == 2 { print $2 }')" -gt $((128 * 1024 * 4 / 5)) ]
show lvm lvs -o lv_name,lv_size,origin,pool_lv,lv_tags vg1
[ "$(owned thin-copy)" = 1 ] && [ "$(owned src-thin)" = 1 ] # lvm2 gave the snapshot no tag of its origin's

step "A thick clone asked while the source's Pod runs: it waits (SourceInUse), and is copied once the Pod is gone" \
  "lvmd cannot snapshot a thick LV: the agent copies the source's blocks itself, only while nothing has the source" \
  "open (device-mapper's open count), and verifies the copy before it answers."
pvc thick-copy 64Mi lvm-thick Filesystem node src-thick
pod thick-copy true thick-copy
within 300 "SourceInUse event on pvc/thick-copy" event thick-copy SourceInUse
show kubectl get events --field-selector involvedObject.name=thick-copy,reason=SourceInUse
[ "$(kubectl get pvc thick-copy -o jsonpath='{.status.phase}')" = Pending ]
show kubectl delete pod src-thick --wait
show kubectl wait --for=condition=Ready pod/thick-copy --timeout=600s
show kubectl get events --field-selector involvedObject.name=thick-copy --sort-by=.lastTimestamp
event thick-copy CloneCopied
show kubectl exec thick-copy -- md5sum /data/seed
[ "$(seeded thick-copy)" = "$thick_sum" ]
[ "$(owned thick-copy)" = 1 ]

step "The sources deleted: the clones keep their bytes" \
  "Read again by the clones' Pods after the node's page cache is dropped."
pvs=$(kubectl get pvc src-thin src-thick -o jsonpath='{range .items[*]}pv/{.spec.volumeName} {end}')
show kubectl delete pod src-thin --wait
show kubectl delete pvc src-thin src-thick --wait
# shellcheck disable=SC2086 # one word per PV
show kubectl wait --for=delete $pvs --timeout=600s
echo 3 >/proc/sys/vm/drop_caches
show lvm lvs -o lv_name,lv_size,origin,lv_tags vg1
[ "$(seeded thin-copy)" = "$thin_sum" ] && [ "$(seeded thick-copy)" = "$thick_sum" ]
echo "    thin-copy and thick-copy read the bytes their sources had."
pvs=$(kubectl get pvc thin-copy thick-copy -o jsonpath='{range .items[*]}pv/{.spec.volumeName} {end}')
show kubectl delete pod thin-copy thick-copy --wait
show kubectl delete pvc thin-copy thick-copy --wait
# shellcheck disable=SC2086 # one word per PV
show kubectl wait --for=delete $pvs --timeout=600s
