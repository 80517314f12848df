#!/usr/bin/env bash
# make bench-peers, inside the guest: lvm-agent and TopoLVM side by side on the
# one-node cluster of scripts/guest/cluster.sh (the same kubelet, containerd
# and control plane), the same workloads on each, the stacks alternating,
# and one table with lvm-agent ÷ TopoLVM on every row (docs/bench-peers.md).
#
#   peers.sh [--bin DIR] [--runs N] [--burst N] [--grows N] [--rounds N]
#            [--idle SECONDS] [--burst-deadline SECONDS] [--vg2-device DEV]
#            [--fs ext4|xfs] [--size SIZE]
#     DIR      guest-files.sh's binaries, images/ and deploy/ (/opt/lvm-agent), and
#              peer-images/ (scripts/peers/topolvm-build.sh) and peers/topolvm.yaml
#              (scripts/peers/topolvm-render.sh)
#     N        --runs: PVC -> Pod Running one at a time, per stack and round (5: the
#              median and p90 of 10 per stack over the 2 rounds);
#              --burst: PVCs with a Pod each in one apply (20); --grows: PVCs grown
#              (3); --rounds: rounds, each stack once per round, the first stack
#              alternating (2)
#     SECONDS  --idle: each idle window, for the rates at rest (60);
#              --burst-deadline: how long a burst's Pods may take to be all
#              Running (1200); past it the burst row says n/a for that stack
#              and the bench goes on
#     DEV      TopoLVM's VG vg2 on this disk (else a 2 GiB sparse loop file)
#     --fs     both stacks' file system (ext4, deploy/examples' lvm-thick); --size
#              each PVC's request (64Mi; xfs needs 300Mi or more), grown to twice it
# Run after `cluster.sh up` and node.sh's LVM step (vg1). lvm-agent is
# installed as node.sh installs it (kubectl apply -k deploy/overlays/guest)
# when it is not there yet; then the idle window before it gives its own
# rate of API requests at rest, else that row says n/a. TopoLVM: its images
# imported, its rendered chart applied. Every figure's boundaries are below,
# at report(); the logs and snapshots are written to /share/peers when the
# host shares a directory (a guest stopped by its time limit still leaves
# them), else to $CLUSTER_DIR/peers.
# Exit code 0 when every step worked but a phase of TopoLVM's (its rows then
# say n/a, and a line names it); the goals do not change it.
set -Eeuo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=/opt/lvm-agent runs=5 burst=20 grows=3 rounds=2 idle=60 burst_deadline=1200 vg2_device='' fs=ext4 size=64Mi
usage() { sed -n '2,32s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --burst) burst=$2; shift 2 ;;
    --grows) grows=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --idle) idle=$2; shift 2 ;;
    --burst-deadline) burst_deadline=$2; shift 2 ;;
    --vg2-device) vg2_device=$2; shift 2 ;;
    --fs) fs=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    *) usage ;;
  esac
done
case $fs in ext4 | xfs) ;; *) usage ;; esac
export CLUSTER_DIR=${CLUSTER_DIR:-/var/lib/lvm-agent-cluster}
export KUBECONFIG=$CLUSTER_DIR/pki/admin.conf PATH=$bin:$here:/usr/local/sbin:/usr/local/bin:$PATH
w=$CLUSTER_DIR/peers
! grep -q ' /share ' /proc/mounts || w=/share/peers
mkdir -p "$w/logs"
touch "$w/gone.log" "$w/grown.log" "$w/marks.log"
t0=$SECONDS
node=$(hostname)
size_mi=${size%Mi}
grown_mi=$((size_mi * 2))
STACKS=(lvm-agent topolvm)
declare -A NS=([lvm-agent]=lvm-agent [topolvm]=topolvm-system)
declare -A CLASS=([lvm-agent]=peers-lvm-agent [topolvm]=peers-topolvm)

step() { printf '\n==> [%3d s] %s\n' $((SECONDS - t0)) "$1"; shift; [ $# -eq 0 ] || printf '    %s\n' "$@"; }
show() { echo "\$ $*"; "$@"; }
dump() {
  echo "peers: FAILED at line $1"
  kubectl get pods -A -o wide 2>&1 || true
  kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -n 30 || true
}
trap 'dump $LINENO' ERR
within() { # within SECONDS WHAT COMMAND...: COMMAND succeeds before the deadline
  local end=$((SECONDS + $1)) what=$2
  shift 2
  until "$@"; do
    [ $SECONDS -lt $end ] || { echo "peers: no $what within the deadline"; return 1; }
    sleep 1
  done
}
# nap SECONDS: sleep without a process (a read that times out on a pipe no
# one writes to): the polls below run beside what they time, and each
# busybox sleep would cost a fork under TCG.
exec {nap_fd}<> <(:)
nap() { read -rt "$1" -u "$nap_fd" _ || true; }
# stamp: each line read, after the guest's clock when it arrived (epoch s).
stamp() { while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done; }

# The workloads' objects: label bench=peers, and stack=STACK.
pvc_yaml() { # pvc_yaml NAME STACK [SIZE]
  cat <<YAML
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $1, namespace: default, labels: {bench: peers, stack: $2}}
spec:
  storageClassName: ${CLASS[$2]}
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: ${3:-$size}}}
YAML
}
pod_yaml() { # pod_yaml NAME STACK [COMMAND]: busybox with the claim NAME at /data
  # busybox's sh as PID 1 ignores SIGTERM unless it traps it: this one exits.
  cat <<YAML
---
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default, labels: {bench: peers, stack: $2}}
spec:
  terminationGracePeriodSeconds: 5
  containers:
    - name: sh
      image: localhost/lvm-agent/busybox:guest
      imagePullPolicy: Never
      command: ["sh", "-c", "trap 'exit 0' TERM; ${3:-true}; sleep 3600 & wait"]
      volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: $1}}]
YAML
}
# lv_path CLAIM STACK: the claim's LV on the node (nothing for a claim not
# bound). lvm-agent's `local` PV names the device; TopoLVM's LV is named by
# the CSI volume handle, in vg2.
lv_path() {
  local pv
  pv=$(kubectl get pvc "$1" -o jsonpath='{.spec.volumeName}')
  [ -n "$pv" ] || return 0
  case $2 in
    lvm-agent) kubectl get pv "$pv" -o jsonpath='{.spec.local.path}' ;;
    topolvm) echo "/dev/vg2/$(kubectl get pv "$pv" -o jsonpath='{.spec.csi.volumeHandle}')" ;;
  esac
}
# gone NAME=PATH...: waits until each PATH is gone (lvremove removes the
# /dev/VG/LV link), a `test -e` every 0.1 s, and logs "gone NAME" stamped.
gone() {
  local -A left=()
  local a
  for a in "$@"; do left[${a%%=*}]=${a#*=}; done
  local end=$((SECONDS + 900))
  while [ ${#left[@]} -gt 0 ]; do
    for a in "${!left[@]}"; do
      [ -e "${left[$a]}" ] || { echo "$EPOCHREALTIME gone $a" >>"$w/gone.log"; unset "left[$a]"; }
    done
    [ $SECONDS -lt $end ] || { echo "peers: LVs still there: ${left[*]}"; return 1; }
    nap 0.1
  done
}

# snapshot LABEL: what the figures are differences of, at one instant:
#   LABEL.api   kube-apiserver's apiserver_request_total and
#               apiserver_watch_events_total (its /metrics)
#   LABEL.proc  "STACK POD CONTAINER CPU_USEC RSS_KB KIND" for every container of
#               both stacks (its cgroup's cpu.stat; the VmRSS of its processes,
#               lvm commands lvmd runs included), their pods' sandboxes
#               (CONTAINER "pause": the pod's cgroup less its containers), and
#               the node's own daemons (STACK "node": kubelet, whose children
#               mkfs and mount lvm-agent's volumes, containerd, kube-apiserver,
#               etcd, kube-scheduler, kube-controller-manager; from /proc)
#   LABEL.t     the guest's clock
snapshot() {
  local f=$w/snap/$1
  mkdir -p "$w/snap"
  echo "$EPOCHREALTIME" >"$f.t"
  kubectl get --raw /metrics | grep -E '^apiserver_(request_total|watch_events_total)\{' >"$f.api"
  {
    local s n
    for s in "${STACKS[@]}"; do containers "$s"; done
    for n in kubelet containerd kube-apiserver etcd kube-scheduler kube-controller-manager; do
      local pid
      pid=$(cat "$CLUSTER_DIR/$n.pid" 2>/dev/null) || continue
      # utime stime cutime cstime: fields 14-17 of /proc/PID/stat, 100 Hz ticks
      echo "node $n $n $(awk '{ sub(/^.*\) /, ""); printf "%d", ($12 + $13 + $14 + $15) * 10000 }' "/proc/$pid/stat") $(rss "$pid") node"
    done
  } >"$f.proc"
}
# rss PID...: the sum of their VmRSS, in KiB (bash only: no process per PID,
# the sampler below runs beside a burst).
rss() {
  local p k v kb=0
  for p in "$@"; do
    while read -r k v _; do [ "$k" != VmRSS: ] || { kb=$((kb + v)); break; }; done 2>/dev/null <"/proc/$p/status" || true
  done
  echo "$kb"
}
usec() { local k v; while read -r k v; do [ "$k" != usage_usec ] || { echo "$v"; return; }; done <"$1/cpu.stat"; echo 0; }
# pod_dirs STACK: "POD DIR KIND CONTAINER=ID,..." for each of STACK's pods on
# this node (KIND: its owner's, DaemonSet on the node side, ReplicaSet for the
# controller side), DIR its pod cgroup (kubelet's cgroupfs driver: kubepods[/QOS]/podUID,
# a directory per container ID in it, the sandbox's too).
pod_dirs() {
  local pod uid kind ids dir
  kubectl -n "${NS[$1]}" get pods --field-selector "spec.nodeName=$node" -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {.metadata.ownerReferences[0].kind} {range .status.initContainerStatuses[*]}{.name}={.containerID},{end}{range .status.containerStatuses[*]}{.name}={.containerID},{end}{"\n"}{end}' |
    while read -r pod uid kind ids; do
      dir=$(find /sys/fs/cgroup/kubepods* -maxdepth 3 -type d -name "pod$uid" 2>/dev/null | head -n1)
      [ -z "$dir" ] || echo "$pod $dir $kind $ids"
    done
}
# containers STACK: the .proc lines of STACK's pods; "pause" is each pod's
# cgroup less its containers: the sandbox.
containers() {
  local pod dir kind ids c d name cid all sum pids rest
  pod_dirs "$1" | while read -r pod dir kind ids; do
    sum=0 rest=()
    declare -A mine=()
    for c in ${ids//,/ }; do
      name=${c%%=*} cid=${c##*://}
      [ -d "$dir/$cid" ] || continue
      mine[$cid]=1
      all=$(usec "$dir/$cid")
      mapfile -t pids <"$dir/$cid/cgroup.procs"
      echo "$1 $pod $name $all $(rss "${pids[@]}") $kind"
      sum=$((sum + all))
    done
    for d in "$dir"/*/; do
      d=${d%/}
      [ -d "$d" ] || continue
      [ -n "${mine[${d##*/}]:-}" ] || { mapfile -t pids <"$d/cgroup.procs"; rest+=("${pids[@]}"); }
    done
    echo "$1 $pod pause $(($(usec "$dir") - sum)) $(rss "${rest[@]}") $kind"
    unset mine
  done
}
# footprint_sampler FILE DIR...: every second, "TIME DIR RSS_KB" for each pod
# cgroup DIR (its processes, any depth), from /proc and the cgroups only.
footprint_sampler() {
  local out=$1 d f pids
  shift
  while :; do
    for d in "$@"; do
      pids=()
      for f in "$d"/cgroup.procs "$d"/*/cgroup.procs; do
        [ ! -f "$f" ] || mapfile -t -O "${#pids[@]}" pids <"$f"
      done
      echo "$EPOCHREALTIME $d $(rss "${pids[@]}")"
    done
    nap 1
  done >>"$out"
}

# The phases of one stack in one round: each between two snapshots, so that
# the API requests, CPU seconds and times of each are known apart.
phase() { # phase STACK ROUND NAME COMMAND...: COMMAND between snapshots STACK.rROUND.NAME.{a,b}
  local s=$1 r=$2 n=$3
  shift 3
  snapshot "$s.r$r.$n.a"
  "$@"
  snapshot "$s.r$r.$n.b"
}
# run_phase STACK ROUND NAME FUNCTION: phase in a subshell of its own, where
# set -e still stops it at its first failure (it would not in a || list). A
# phase that fails leaves its rows n/a and the bench goes on to the next one:
# a peer's failure is one of its results (run 8: TopoLVM's controller down
# after its burst); lvm-agent's fails the bench after the report.
failed=()
run_phase() {
  (phase "$1" "$2" "$3" "$4" "$1" "$2") &
  wait $! || { echo "peers: $1 round $2: $3 FAILED: its rows say n/a"; failed+=("$1 round $2: $3"); }
}
seq_runs() { # PVC+Pod -> Running, one at a time; then each deleted -> its LV gone
  local s=$1 r=$2 i name lv pv
  for i in $(seq 1 "$runs"); do
    name=$s-r$r-$i
    { pvc_yaml "$name" "$s"; pod_yaml "$name" "$s"; } | kubectl apply -f - >/dev/null
    kubectl wait --for=jsonpath='{.status.phase}'=Running "pod/$name" --timeout=600s >/dev/null
    lv=$(lv_path "$name" "$s") pv=$(kubectl get pvc "$name" -o jsonpath='{.spec.volumeName}')
    [ -e "$lv" ] || { echo "peers: $name's LV $lv is not on the node"; return 1; }
    kubectl delete pod/"$name" pvc/"$name" --wait=false >/dev/null
    gone "$name=$lv"
    kubectl wait --for=delete "pv/$pv" --timeout=600s >/dev/null 2>&1 || true
  done
  echo "peers: $s round $r: $runs volumes one at a time ($((SECONDS - t0)) s)"
}
# running STACK: how many of STACK's bench Pods are Running (never fails).
running() { kubectl get pods -l "bench=peers,stack=$1" -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' 2>/dev/null | grep -c '^Running$' || true; }
# diagnose STACK SECONDS: STACK's pods, the bench's claims and Pods, the
# cluster's last events, and each of STACK's containers' log of the last
# SECONDS (and of its previous instance, if it restarted): where a burst's
# time went.
# container_names NS POD: its containers' names, sidecars (init containers) first.
container_names() { kubectl -n "$1" get "$2" -o jsonpath='{.spec.initContainers[*].name} {.spec.containers[*].name}'; }
diagnose() {
  local ns=${NS[$1]} p c
  kubectl -n "$ns" get pods -o wide
  kubectl get pvc,pods -l "bench=peers,stack=$1" -o wide
  kubectl get events -A --sort-by=.lastTimestamp | tail -n 100
  for p in $(kubectl -n "$ns" get pods -o name); do
    for c in $(container_names "$ns" "$p"); do
      echo "--- $p $c: the last $2 s"
      kubectl -n "$ns" logs "$p" -c "$c" --since="$2s" --tail=400 || true
      kubectl -n "$ns" logs "$p" -c "$c" --previous --tail=50 2>/dev/null | sed 's/^/previous: /' || true
    done
  done
}
burst_run() { # $burst PVC+Pods in one apply -> all Running; all deleted -> all LVs gone
  local s=$1 r=$2 j sampler dirs lvs=() pvs=() t end up=0 lv
  for j in $(seq 1 "$burst"); do pvc_yaml "$s-r$r-b$j" "$s"; pod_yaml "$s-r$r-b$j" "$s"; done >"$w/burst.yaml"
  mapfile -t dirs < <(pod_dirs "$s" | awk '{ print $2 }')
  footprint_sampler "$w/snap/$s.r$r.burst.rss" "${dirs[@]}" &
  sampler=$!
  echo "$EPOCHREALTIME burst-apply $s-r$r" >>"$w/marks.log"
  t=$SECONDS end=$((SECONDS + burst_deadline))
  kubectl apply -f "$w/burst.yaml" >/dev/null
  # (A look every 15 s: a kubectl costs about a CPU-second under TCG; the rows
  # read the watches, not these looks.)
  while up=$(running "$s") && [ "$up" -lt "$burst" ] && [ $SECONDS -lt $end ]; do nap 15; done
  kill "$sampler" 2>/dev/null || true
  [ "$up" -ge "$burst" ] || echo "peers: $s round $r: $up of $burst Pods Running within $burst_deadline s: its burst rows say n/a"
  diagnose "$s" $((SECONDS - t + 10)) >"$w/diag-$s-r$r.txt" 2>&1 || true
  for j in $(seq 1 "$burst"); do
    lv=$(lv_path "$s-r$r-b$j" "$s")
    [ -z "$lv" ] || lvs+=("$s-r$r-b$j=$lv")
  done
  mapfile -t pvs < <(kubectl get pvc -l "bench=peers,stack=$s" -o jsonpath='{range .items[*]}pv/{.spec.volumeName}{"\n"}{end}')
  echo "$EPOCHREALTIME burst-delete $s-r$r" >>"$w/marks.log"
  kubectl delete pod,pvc -l "bench=peers,stack=$s" --wait=false >/dev/null
  gone "${lvs[@]}"
  kubectl wait --for=delete "${pvs[@]}" --timeout=600s >/dev/null 2>&1 || true
  echo "peers: $s round $r: burst of $burst ($((SECONDS - t0)) s)"
}
grow_runs() { # PVC request doubled -> the Pod sees its file system grown
  local s=$1 r=$2 g name pv
  for g in $(seq 1 "$grows"); do
    name=$s-r$r-g$g
    # The Pod says "grown" once its file system's block count changes
    # (bench-grow.sh's Pod); containerd stamps the line.
    # shellcheck disable=SC2016 # the Pod's shell expands them
    { pvc_yaml "$name" "$s"
      pod_yaml "$name" "$s" 's0=$(stat -f -c %b /data); echo start; while [ $(stat -f -c %b /data) = $s0 ]; do sleep 0.05; done; echo grown'
    } | kubectl apply -f - >/dev/null
    kubectl wait --for=jsonpath='{.status.phase}'=Running "pod/$name" --timeout=600s >/dev/null
    # shellcheck disable=SC2016 # eval expands it
    within 60 "start in pod/$name's log" eval '[ "$(kubectl logs '"$name"')" = start ]'
    kubectl patch pvc "$name" -p "{\"spec\":{\"resources\":{\"requests\":{\"storage\":\"${grown_mi}Mi\"}}}}" >/dev/null
    within 600 "grown in pod/$name's log" eval 'kubectl logs '"$name"' | grep -qx grown'
    kubectl logs "$name" --timestamps | sed -n "s/ grown\$/ $name/p" >>"$w/grown.log"
    pv=$(kubectl get pvc "$name" -o jsonpath='{.spec.volumeName}')
    kubectl delete pod/"$name" pvc/"$name" --wait >/dev/null
    kubectl wait --for=delete "pv/$pv" --timeout=600s >/dev/null 2>&1 || true
  done
  echo "peers: $s round $r: $grows grown ($((SECONDS - t0)) s)"
}

step "TopoLVM's volume group vg2 on ${vg2_device:-a 2 GiB sparse loop file}, no thin pool" \
  "Its own VG: lvm-agent's is vg1; the two never share an LV."
LVM_VG=vg2 LVM_THIN_POOL_SIZE=0 LVMD_CONFIG='' LVM_LOOP_SIZE=2G LVM_DEVICE=$vg2_device setup-lvm.sh
show lvm vgs vg1 vg2

step "The cluster idle, then each stack installed, an idle window of $idle s after each" \
  "The rates at rest: each window's API requests and CPU, less the window's before."
own_idle=1
if kubectl -n lvm-agent get daemonset lvm-agent >/dev/null 2>&1; then
  own_idle='' # installed before: no window without it
else
  snapshot idle0.a; sleep "$idle"; snapshot idle0.b
  show kubectl apply -k "$bin/deploy/overlays/guest"
fi
show kubectl -n lvm-agent rollout status daemonset/lvm-agent --timeout=600s
show kubectl -n lvm-agent rollout status deployment/lvm-agent-provisioner --timeout=600s
snapshot idle1.a; sleep "$idle"; snapshot idle1.b
for t in "$bin"/peer-images/*.tar; do
  ctr -n k8s.io images import --local "$t" >/dev/null 2>&1 || ctr -n k8s.io images import "$t" >/dev/null
done
show ctr -n k8s.io images ls -q
show kubectl apply --server-side -f "$bin/peers/topolvm.yaml"
show kubectl -n topolvm-system rollout status daemonset/topolvm-lvmd-0 --timeout=600s
show kubectl -n topolvm-system rollout status daemonset/topolvm-node --timeout=600s
show kubectl -n topolvm-system rollout status deployment/topolvm-controller --timeout=600s
csinode_has_topolvm() { kubectl get csinode "$node" -o jsonpath='{.spec.drivers[*].name}' 2>/dev/null | grep -qw topolvm.io; }
within 300 "topolvm.io registered with kubelet (CSINode)" csinode_has_topolvm
show kubectl get csinode "$node" -o jsonpath='{.spec.drivers[*].name}{"\n"}'
show kubectl -n topolvm-system get pods -o wide
snapshot idle2.a; sleep "$idle"; snapshot idle2.b

step "The bench's classes: the same shape for both, $fs, thick LVs, WaitForFirstConsumer, growable" \
  "lvm-agent's is deploy/examples' lvm-thick with fsType $fs; TopoLVM's is its chart's class (xfs) with fsType $fs."
kubectl apply -f - <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: ${CLASS[lvm-agent]}}
provisioner: lvm.lvm-agent.io
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
reclaimPolicy: Delete
parameters: {volumeGroup: vg1, fsType: $fs}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: ${CLASS[topolvm]}}
provisioner: topolvm.io
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
reclaimPolicy: Delete
parameters: {csi.storage.k8s.io/fstype: $fs, topolvm.io/device-class: ssd}
YAML

# The watches every time figure reads, stamped as each line arrives; a
# watch the API server ends is started again (a new list: the analysis
# keeps each first sighting).
watch_loop() {
  local k=
  trap '[ -z "$k" ] || kill "$k" 2>/dev/null; exit 0' TERM
  while :; do
    kubectl "$@" 2>>"$w/watch.err" &
    k=$!
    wait "$k" || true
    sleep 0.2
  done
}
# The claims' and volumes' states, each hop of the timeline (integration/timeline):
# the node selected, lvm-agent's request and answer (volume.lifecycle), the
# volume named, the PV's phase and capacity, the resize's allocated size
# and status, the capacity kubelet finished a grow with; the Pods' node and
# the nudge annotations (lvm-agent's and TopoLVM's) after a grow.
watch_loop get pvc -l bench=peers -w -o jsonpath='{"pvc "}{.metadata.name}{" phase="}{.status.phase}{" del="}{.metadata.deletionTimestamp}{" req="}{.spec.resources.requests.storage}{" node="}{.metadata.annotations.volume\.kubernetes\.io/selected-node}{" state="}{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.lifecycle}{" pv="}{.spec.volumeName}{" cap="}{.status.capacity.storage}{" alloc="}{.status.allocatedResources.storage}{" rs="}{.status.allocatedResourceStatuses.storage}{"\n"}' > >(stamp >>"$w/watch.log") &
watches=($!)
watch_loop get pod -l bench=peers -w -o jsonpath='{"pod "}{.metadata.name}{" phase="}{.status.phase}{" del="}{.metadata.deletionTimestamp}{" node="}{.spec.nodeName}{" nudge="}{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.resize-nudge}{.metadata.annotations.topolvm\.io/last-resizefs-requested-at}{"\n"}' > >(stamp >>"$w/watch.log") &
watches+=($!)
# Every PV (the bench's are the only ones made meanwhile): its claim, phase,
# capacity, lvm-agent's delete and grow requests and answers.
watch_loop get pv -w -o jsonpath='{"pv "}{.metadata.name}{" claim="}{.spec.claimRef.name}{" phase="}{.status.phase}{" del="}{.metadata.deletionTimestamp}{" cap="}{.spec.capacity.storage}{" state="}{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.lifecycle}{"\n"}' > >(stamp >>"$w/watch.log") &
watches+=($!)
# TopoLVM's LogicalVolume objects (named as the PV): made by its
# controller's CreateVolume, given a volume ID once its node plugin made the
# LV, their size raised and reached in a grow.
watch_loop get logicalvolumes.topolvm.io -w -o jsonpath='{"lv "}{.metadata.name}{" del="}{.metadata.deletionTimestamp}{" vid="}{.status.volumeID}{" size="}{.spec.size}{" cur="}{.status.currentSize}{"\n"}' > >(stamp >>"$w/watch.log") &
watches+=($!)
# As they happen, on the host while the bench runs: the cluster's Warning
# events (probe failures, kills, back-offs) and lvm-agent's agent and lvmd
# (each stack's whole logs are taken again at the end).
watch_loop get events -A -w --field-selector type=Warning -o jsonpath='{.involvedObject.namespace}{"/"}{.involvedObject.name}{" "}{.reason}{" "}{.message}{"\n"}' > >(stamp >>"$w/events.log") &
watches+=($!)
# Every write of an event (its POST, then each PATCH that counts it again):
# one line per (uid, resourceVersion); --watch-only: not the events there
# before (a watch started again misses the writes while it was down).
watch_loop get events -A --watch-only -o jsonpath='{.metadata.uid}{" "}{.metadata.resourceVersion}{" "}{.reportingComponent}{" "}{.source.component}{" "}{.reason}{" "}{.involvedObject.kind}{" "}{.involvedObject.namespace}{" "}{.involvedObject.name}{"\n"}' > >(stamp >>"$w/event-writes.log") &
watches+=($!)
for c in lvm-agent lvmd; do
  watch_loop -n lvm-agent logs -f ds/lvm-agent -c "$c" --timestamps --since=1s >>"$w/logs/live.$c.txt" &
  watches+=($!)
done
trap 'kill "${watches[@]}" 2>/dev/null || true' EXIT

for r in $(seq 1 "$rounds"); do
  order=("${STACKS[@]}")
  [ $((r % 2)) = 1 ] || order=(topolvm lvm-agent)
  for s in "${order[@]}"; do
    step "Round $r of $rounds: $s" "$runs volumes one at a time, a burst of $burst, $grows grown."
    run_phase "$s" "$r" seq seq_runs
    run_phase "$s" "$r" burst burst_run
    run_phase "$s" "$r" grow grow_runs
  done
done
kill "${watches[@]}" 2>/dev/null || true
sleep 1 # the stamps' last lines
# The components' logs, each line stamped by containerd (ns): the agent's
# "Volume request done" lines with their steps, lvmd's, TopoLVM's; and
# kubelet's (the mounts, the grows).
mkdir -p "$w/logs"
for s in "${STACKS[@]}"; do
  for p in $(kubectl -n "${NS[$s]}" get pods -o name); do
    for c in $(container_names "${NS[$s]}" "$p"); do
      kubectl -n "${NS[$s]}" logs "$p" -c "$c" --timestamps >"$w/logs/$s.${p#pod/}.$c.log" 2>&1 || true
    done
  done
done
cp "$CLUSTER_DIR/logs/kubelet.log" "$w/logs/kubelet.log" 2>/dev/null || true
for s in "${STACKS[@]}"; do
  kubectl -n "${NS[$s]}" get pods -o jsonpath='{range .items[*]}{.metadata.name}{" "}{range .spec.initContainers[*]}{.image}{" "}{end}{range .spec.containers[*]}{.image}{" "}{end}{"\n"}{end}' >"$w/$s.pods"
done
stat -c '%s %n' "$bin"/images/lvm-agent-amd64.tar "$bin"/images/lvmd.tar "$bin"/peer-images/*.tar >"$w/image-bytes"

# report: the table. Boundaries, all on the guest's clock (w: a watch line
# as it arrived; the same watch lag on both stacks):
#   create     w PVC seen -> w its Pod Running, one claim at a time: median, p90;
#              split at w PVC Bound (provisioned: the LV and the PV made, the
#              claim bound) and the rest (the node: mkfs, mount, the container)
#   burst      the apply of $burst claims and Pods -> w the last of them Running
#   delete     w the Pod or PVC marked deleted (one kubectl delete of both) ->
#              its LV's /dev/VG/LV gone (a test -e every 0.1 s), one at a time
#   burst del  the delete of the $burst -> the last LV gone
#   grow       w request raised -> the Pod's "grown" line, stamped by containerd
#   API/vol    apiserver_request_total by verb and resource over the one-at-a-
#              time phase (created and deleted), less the cluster's rate at rest
#              (idle2: both stacks idle) over as long, per volume; watch events
#              (apiserver_watch_events_total) the same way. Leases are left out:
#              their renewals follow the clock and the CPU's load (a busy
#              emulated node renews late), not the volumes, and a rate at rest
#              subtracted over a busy sequence made them negative
#   at rest    each window's difference less the one before it: the stack's own
#              requests per minute; CPU per minute and RSS of each container
#   burst      CPU seconds of each process during the burst phase (from the
#              apply to the last LV gone), and the peak of the RSS sampled each second
#   node       kubelet (with the mkfs, fsck and mount it runs for local PVs) and
#              the control plane's daemons during each stack's bursts, mean per burst
# event_writes: the event writes (event-writes.log) during each stack's
# one-at-a-time phases, per volume, by the component that wrote them, the
# reason and whose object it is: "bench" (its claims, their PVs and Pods),
# "own" (the stack's own Pods) or "other" (the other stack's, the
# cluster's). The "API requests per volume" row counts them all.
event_writes() {
  local s r
  for s in "${STACKS[@]}"; do
    for r in $(seq 1 "$rounds"); do
      echo "$s $(cat "$w/snap/$s.r$r.seq.a.t" 2>/dev/null) $(cat "$w/snap/$s.r$r.seq.b.t" 2>/dev/null)"
    done
  done >"$w/seq-windows"
  # (one space between fields, empty ones kept: a PV's namespace)
  awk -F '[ ]' -v vols=$((runs * rounds)) -v ns_a="${NS[lvm-agent]}" -v ns_t="${NS[topolvm]}" '
    FILENAME ~ /seq-windows$/ { if (NF == 3) { n++; WS[n] = $1; WA[n] = $2; WB[n] = $3 }; next }
    FILENAME ~ /watch.log$/ { if ($2 == "pv") { c = $4; sub(/^claim=/, "", c); PVC[$3] = c }; next }
    {
      if (SEEN[$2, $3]++) next
      for (i = 1; i <= n; i++) if ($1 >= WA[i] && $1 <= WB[i]) break
      if (i > n) next
      who = ($4 != "" ? $4 : $5); obj = $9
      if ($7 == "PersistentVolume" && obj in PVC) obj = PVC[obj]
      whose = "other"
      if (obj ~ ("^" WS[i] "-r")) whose = "bench"
      else if ($8 == (WS[i] == "lvm-agent" ? ns_a : ns_t)) whose = "own"
      k = who " " $6 " (" whose " " $7 ")"; W[WS[i], k]++; K[k] = 1; T[WS[i]]++
    }
    END {
      printf "\nEvent writes per volume in the one-at-a-time phases (POST and PATCH), by who wrote them\n"
      printf "  %-80s %9s %9s\n", "writer reason (whose kind)", "lvm-agent", "TopoLVM"
      printf "  %-80s %9.1f %9.1f\n", "all", T["lvm-agent"] / vols, T["topolvm"] / vols
      for (k in K) printf "  %-80s %9.1f %9.1f\n", k, W["lvm-agent", k] / vols, W["topolvm", k] / vols | "sort"
      close("sort")
    }' "$w/seq-windows" "$w/watch.log" "$w/event-writes.log"
}
report() {
  step "Side by side: lvm-agent ÷ TopoLVM on every row (lower is better for lvm-agent)" \
    "TopoLVM v0.41.0 with its chart's defaults (scheduler extender, webhook, snapshots off; one controller" \
    "replica on one node); csi-provisioner v6.3.0 and csi-resizer v2.2.0 (TopoLVM pins v6.2.0 and v2.1.0," \
    "which the Go module proxy refuses); node-driver-registrar and livenessprobe: the bench's minimal" \
    "ones (scripts/peers/csi-sidecars: no version of either is served by the Go module proxy)." \
    "lvm-agent: deploy/overlays/guest. $runs one at a time, bursts of $burst, $grows grown, $size $fs, $rounds rounds."
  awk -v runs="$runs" -v burst="$burst" -v grows="$grows" -v rounds="$rounds" -v own_idle="$own_idle" -v snap="$w/snap" '
    function rfc(s) { split(substr(s, index(s, "T") + 1), p, ":"); return p[1] * 3600 + p[2] * 60 + p[3] }
    function first(k, t) { if (!(k in T)) T[k] = t }
    function tok(name,   v) { # the value of " name=VALUE" in this line
      if (!match($0, " " name "=[^ ]*")) return ""
      return substr($0, RSTART + length(name) + 2, RLENGTH - length(name) - 2)
    }
    # add S R M V: a value of row M for stack S in round R, kept for the
    # whole and for the round (its spread: how far apart the medians of the rounds are).
    function add(s, r, m, v) { N[s, m]++; V[s, m, N[s, m]] = v; N[s "#" r, m]++; V[s "#" r, m, N[s "#" r, m]] = v }
    function spread(s, m, q,   r, x, lo, hi) {
      lo = -1; hi = -1
      for (r = 1; r <= rounds; r++) { x = pct(s "#" r, m, q); if (x < 0) continue; if (lo < 0 || x < lo) lo = x; if (x > hi) hi = x }
      return lo < 0 ? -1 : hi - lo
    }
    function pct(s, m, q,   n, i, j, t, a) { # median, or the nearest-rank q-quantile, of V[s, m, *]
      n = N[s, m]; if (n == 0) return -1
      for (i = 1; i <= n; i++) a[i] = V[s, m, i]
      for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
      if (q == 0.5 && n % 2 == 0) return (a[n / 2] + a[n / 2 + 1]) / 2
      i = int(q * n + 0.999999); if (i < 1) i = 1; return a[i]
    }
    function num(f,   l) { if ((getline l < f) <= 0) return -1; close(f); return l + 0 }
    # readsnap FILE: FILE.api into A[FILE, series], FILE.proc into
    # CPU[FILE, key] (µs), RSS[FILE, key] (KiB), key "STACK POD CONTAINER".
    function readsnap(f,   l, k, a) {
      if (f in READ) return
      READ[f] = 1
      while ((getline l < (f ".api")) > 0) { k = l; sub(/ [^ ]*$/, "", k); sub(/^.* /, "", l); A[f, k] = l + 0; SERIES[k] = 1 }
      close(f ".api")
      while ((getline l < (f ".proc")) > 0) { split(l, a, " "); k = a[1] " " a[2] " " a[3]
        CPU[f, k] = a[4] + 0; RSS[f, k] = a[5] + 0; HAS[f, k] = 1; KEYS[k] = 1; KIND[k] = a[6] }
      close(f ".proc")
    }
    function apikey(k,   verb, res) { # "VERB resource[/subresource]", or "events KIND" of a watch events series
      if (k ~ /^apiserver_watch_events_total/) { match(k, /(kind|resource)="[^"]*"/); return "events " substr(k, RSTART, RLENGTH) }
      match(k, /verb="[^"]*"/); verb = substr(k, RSTART + 6, RLENGTH - 7)
      match(k, /resource="[^"]*"/); res = substr(k, RSTART + 10, RLENGTH - 11)
      if (match(k, /subresource="[^"]+"/)) res = res "/" substr(k, RSTART + 13, RLENGTH - 14)
      return verb " " res
    }
    function apiadd(a, b, s, f,   k) { # D[s, VERB resource] += f * (b - a), Leases left out
      readsnap(a); readsnap(b)
      for (k in SERIES) if (k !~ /resource="leases"/) { D[s, apikey(k)] += f * (A[b, k] - A[a, k]); AK[apikey(k)] = 1 }
    }
    # details(EV): the per-resource rows of requests (EV 0) or of watch
    # events (1), sorted, those of at least 0.5 either way (a negative one:
    # the rate at rest subtracted over a sequence longer than its own share;
    # no ^ or abs: busybox awk has no math).
    function details(ev,   k, a, b) {
      for (k in AK) { a = D[S[1], k]; b = D[S[2], k]
        if ((k ~ /^events/) == ev && (a >= 0.5 || a <= -0.5 || b >= 0.5 || b <= -0.5))
          printf "  %-44s %12.1f %12.1f\n", k, a, b | "sort" }
      close("sort")
    }
    function secs(a, b) { return num(b ".t") - num(a ".t") }
    function show(x, u) { return x < 0 ? "n/a" : sprintf("%.3f%s", x, u) }
    function row(label, a, b, goal, sa, sb,   r) {
      r = (a >= 0 && b > 0) ? sprintf("%.2f", a / b) : "n/a"
      printf "%-46s %12s %12s %6s", label, show(a), show(b), r
      if (goal != "" && r != "n/a") printf "  goal <= %s: %s", goal, (a / b <= goal + 0 ? "met" : "MISSED")
      if (sa != "" && rounds > 1) { printf "  spread %s/%s", show(sa), show(sb)
        if (r != "n/a" && sa >= 0 && sb >= 0 && (a > b ? a - b : b - a) <= (sa > sb ? sa : sb)) printf " (within it)" }
      printf "\n"
    }
    # mrow LABEL M Q GOAL: the q-quantile of row M per stack, with the spread between rounds.
    function mrow(label, m, q, goal) { row(label, pct(S[1], m, q), pct(S[2], m, q), goal, spread(S[1], m, q), spread(S[2], m, q)) }
    FILENAME ~ /watch.log$/ {
      t = $1 % 86400; n = $3
      if ($2 == "pvc") first(n " seen", t)
      if ($2 == "pod" && tok("phase") == "Running") first(n " running", t)
      if ($2 == "pvc" && tok("phase") == "Bound") first(n " bound", t)
      if (tok("del") != "") first(n " deleted", t)
      if ($2 == "pvc") { q = tok("req"); if (!(n in REQ)) REQ[n] = q; else if (q != REQ[n]) first(n " raised", t) }
      next
    }
    FILENAME ~ /gone.log$/ { first($3 " gone", $1 % 86400); next }
    FILENAME ~ /marks.log$/ { first($3 " " $2, $1 % 86400); next }
    FILENAME ~ /grown.log$/ { first($2 " grown", rfc($1)); next }
    END {
      S[1] = "lvm-agent"; S[2] = "topolvm"
      for (r = 1; r <= rounds; r++) for (si = 1; si <= 2; si++) { s = S[si]; b = s "-r" r
        for (i = 1; i <= runs; i++) { n = b "-" i
          if ((n " running") in T && (n " seen") in T) add(s, r, "create", T[n " running"] - T[n " seen"])
          if ((n " running") in T && (n " bound") in T && (n " seen") in T) { add(s, r, "bind", T[n " bound"] - T[n " seen"]); add(s, r, "start", T[n " running"] - T[n " bound"]) }
          if ((n " gone") in T && (n " deleted") in T) add(s, r, "delete", T[n " gone"] - T[n " deleted"]) }
        lastrun = -1; lastgone = -1; ok = 1
        for (j = 1; j <= burst; j++) { n = b "-b" j
          if (!((n " running") in T) || !((n " gone") in T)) ok = 0
          if (T[n " running"] > lastrun) lastrun = T[n " running"]; if (T[n " gone"] > lastgone) lastgone = T[n " gone"] }
        if (ok && (b " burst-apply") in T) add(s, r, "burst", lastrun - T[b " burst-apply"])
        if (ok && (b " burst-delete") in T) add(s, r, "burstdel", lastgone - T[b " burst-delete"])
        for (g = 1; g <= grows; g++) { n = b "-g" g; if ((n " grown") in T && (n " raised") in T) add(s, r, "grow", T[n " grown"] - T[n " raised"]) }
      }
      printf "%-46s %12s %12s %6s\n", "seconds unless said", "lvm-agent", "TopoLVM", "ratio"
      mrow("PVC -> Pod Running, median", "create", 0.5, 0.8)
      mrow("PVC -> Pod Running, p90", "create", 0.9, 0.8)
      mrow("  of it PVC -> Bound (provisioned), median", "bind", 0.5, 0.8)
      mrow("  of it Bound -> Pod Running (node), median", "start", 0.5, "")
      mrow("burst of " burst " -> all Running, median", "burst", 0.5, 0.6)
      mrow("PVC and Pod deleted -> LV gone, median", "delete", 0.5, 0.8)
      mrow("burst deleted -> all LVs gone, median", "burstdel", 0.5, 0.6)
      mrow("PVC grown -> new size in the Pod, median", "grow", 0.5, 0.5)

      # API requests per volume (created and deleted one at a time), less
      # the whole cluster rate at rest (idle2) over as long.
      idle = secs(snap "/idle2.a", snap "/idle2.b")
      vols = runs * rounds
      for (si = 1; si <= 2; si++) { s = S[si]
        for (r = 1; r <= rounds; r++) { a = snap "/" s ".r" r ".seq.a"; b = snap "/" s ".r" r ".seq.b"
          apiadd(a, b, s, 1 / vols)
          if (idle > 0) apiadd(snap "/idle2.a", snap "/idle2.b", s, -secs(a, b) / idle / vols) } }
      for (si = 1; si <= 2; si++) for (k in AK) { if (k ~ /^events/) EV[S[si]] += D[S[si], k]; else REQ_[S[si]] += D[S[si], k]
        if (k ~ /^(POST|PUT|PATCH|DELETE) /) WR[S[si]] += D[S[si], k] }
      row("API requests per volume (created, deleted)", REQ_[S[1]] + 0, REQ_[S[2]] + 0, 0.8)
      row("API writes per volume (POST, PUT, PATCH, DELETE)", WR[S[1]] + 0, WR[S[2]] + 0, 1)
      details(0)
      row("watch events per volume", EV[S[1]] + 0, EV[S[2]] + 0, "")
      details(1)

      # At rest: each window less the one before it (idle0: the cluster
      # alone; idle1: and lvm-agent; idle2: and TopoLVM).
      for (i = 0; i <= 2; i++) { a = snap "/idle" i ".a"; b = snap "/idle" i ".b"; readsnap(a); readsnap(b); W[i] = secs(a, b)
        RATE[i] = 0; if (W[i] > 0) for (k in SERIES) if (k ~ /^apiserver_request_total/) RATE[i] += (A[b, k] - A[a, k]) * 60 / W[i] }
      row("API requests per minute at rest", own_idle != "" && W[0] > 0 ? RATE[1] - RATE[0] : -1, RATE[2] - RATE[1], "")
      a = snap "/idle2.a"; b = snap "/idle2.b"
      for (k in KEYS) if (HAS[b, k]) { split(k, f, " "); s = f[1]; if (s == "node") continue
        rss = RSS[b, k] / 1024; cpu = W[2] > 0 ? (CPU[b, k] - CPU[a, k]) / 1e6 * 60 / W[2] : 0
        MEM[s] += rss; USE[s] += cpu; if (KIND[k] == "DaemonSet") NODEMEM[s] += rss; else CTLMEM[s] += rss
        if (f[3] == "pause") PODS[s]++; else CONT[s]++
        LINE[k] = sprintf("    %-50s %8.1f MiB %8.2f CPU-s/min", k, rss, cpu) }
      row("RSS at rest, node side: DaemonSets (MiB)", NODEMEM[S[1]] + 0, NODEMEM[S[2]] + 0, 0.5)
      row("RSS at rest, controller side (MiB)", CTLMEM[S[1]] + 0, CTLMEM[S[2]] + 0, "")
      row("RSS at rest, all its pods (MiB)", MEM[S[1]] + 0, MEM[S[2]] + 0, "")
      row("CPU at rest (CPU-s per minute)", USE[S[1]] + 0, USE[S[2]] + 0, "")
      row("containers on the node (sandboxes not counted)", CONT[S[1]] + 0, CONT[S[2]] + 0, "")
      row("pods on the node", PODS[S[1]] + 0, PODS[S[2]] + 0, "")

      # During the bursts (apply -> the last LV gone): CPU seconds, mean per burst.
      for (si = 1; si <= 2; si++) { s = S[si]
        for (r = 1; r <= rounds; r++) { a = snap "/" s ".r" r ".burst.a"; b = snap "/" s ".r" r ".burst.b"; readsnap(a); readsnap(b)
          for (k in KEYS) if (HAS[a, k] && HAS[b, k]) { split(k, f, " "); d = (CPU[b, k] - CPU[a, k]) / 1e6 / rounds
            if (f[1] == s) BCPU[s] += d; if (f[1] == "node") { NODE[s, f[2]] += d; NODES[f[2]] = 1 } } } }
      row("CPU during a burst, its pods (CPU-s)", BCPU[S[1]] + 0, BCPU[S[2]] + 0, "")
      for (n in NODES) row("  " n " during the burst (CPU-s)", NODE[S[1], n] + 0, NODE[S[2], n] + 0, "")
      printf "\nPer container at rest (the last idle window, both installed):\n"
      for (k in LINE) print LINE[k] | "sort"
      close("sort")
    }' "$w/watch.log" "$w/gone.log" "$w/marks.log" "$w/grown.log" | tee "$w/report.txt"
  # Peak RSS during the bursts, per stack: the sampler's per-second sums.
  local s
  for s in "${STACKS[@]}"; do
    echo "peak RSS during $s's bursts (all pods on the node, MiB): $(cat "$w"/snap/"$s".r*.burst.rss 2>/dev/null |
      awk '{ t = $1; sum[t] += $3 } END { m = 0; for (t in sum) if (sum[t] > m) m = sum[t]; printf "%.1f", m / 1024 }')"
  done | tee -a "$w/report.txt"
  event_writes | tee -a "$w/report.txt"
  # Every hop's median, and the SVG of them (integration/timeline).
  local logs
  mapfile -t logs < <(find "$w/logs" -maxdepth 1 -type f -name '*.log' -o -type f -name 'live.*.txt')
  lvm-stories timeline -svg "$w/timeline.svg" \
    -title "make bench-peers: where the seconds go, one volume at a time ($runs x $rounds rounds, $size $fs)" \
    "$w/watch.log" "$w/gone.log" "$w/grown.log" ${logs[@]+"${logs[@]}"} | tee -a "$w/report.txt"
  echo "the timeline drawn: $w/timeline.svg" | tee -a "$w/report.txt"
  echo "image bytes (the tarballs the guest imported):" | tee -a "$w/report.txt"
  sed 's|^|    |' "$w/image-bytes" | tee -a "$w/report.txt"
  echo "images each stack's pods run:" | tee -a "$w/report.txt"
  for s in "${STACKS[@]}"; do sed "s|^|    $s: |" "$w/$s.pods"; done | tee -a "$w/report.txt"
}
report
[ ${#failed[@]} -eq 0 ] || printf 'peers: phase FAILED, its rows n/a: %s\n' "${failed[@]}"
case " ${failed[*]} " in *" lvm-agent round "*) step "peers: FAILED (lvm-agent)"; exit 1 ;; esac
step "peers: OK"
