# Sourced by node.sh in powercut mode (make test-faults' power-cut-cluster,
# scripts/vm/faults.sh power_cut_cluster), with its helpers and
# lvm-stories' foreign LV and audit: the power cut of the whole node, cluster and
# all, booted twice on one disk (/dev/vda, vg1).
#
#   pc_state  before the cluster starts, both boots: the node's own state
#             on an ext4 LV, vg1/node-state, made by the first boot (not
#             lvm-agent's; the audit leaves it out), mounted over etcd's
#             data, kubelet's, containerd's, CNI's IPAM and the cluster's
#             PKI and kubeconfigs (cluster.sh reuses what it finds there),
#             etcd then fsyncing. The second boot first checks that the
#             boot's lvm2 (vgchange -aay) activated it, as every LV.
#   pc_write  --phase write, after the install: an LV that is not
#             lvm-agent's (foreign); a StatefulSet of 3 busybox writers,
#             each appending checksummed records to its claim, fsync'ing
#             each, then writing how many it has synced; a poller copying
#             those counts to the share (the host's folder: it outlives the
#             cut), and a loop creating 20 claims and deleting the 20
#             before (as make test-faults' bursts, the node already chosen on
#             them), each step written to the share's ledger before and
#             after; 3 s after the loop's third round was created, QEMU is
#             killed (run.sh --power-cut), the loop and the writers running.
#   pc_check  --phase check, the next boot on the disk, nothing installed
#             again: once each writer runs again (a container started after
#             this boot) and every request is final (every claim Bound and
#             answered, no PV or LV left of a claim that is gone), the
#             recovery's end (its time on the share); then the faults' audit
#             (one LV of at least its size per claim, none orphaned, no
#             request open or failed, the foreign LV untouched), every
#             claim of a round the ledger says was created and never
#             deleted still there, and every record a poll saw synced read
#             back through its Pod byte for byte. The counts go to the
#             share (powercut/result) for faults.sh's table; each must be 0.
# shellcheck shell=bash
: "${phase?}" "${bin?}" # node.sh's --phase and --bin, read here

burst_yaml() { # burst_yaml ROUND [SIZE]: 20 claims of SIZE (16Mi) on this node
  local i
  for i in $(seq 1 20); do
    cat <<YAML
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: $1-$i
  namespace: default
  labels: {app: faults, round: $1}
  annotations: {volume.kubernetes.io/selected-node: $(hostname)}
spec:
  storageClassName: lvm-thick
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: ${2:-16Mi}}}
YAML
  done
}

# The claims of a round, one line each: name;uid;phase;PV;lifecycle (any
# may be empty). (A kubectl run costs about a second of the guest's CPU
# under TCG: one list per look.) The waits below ask quietly, and their
# commands never fail: the API server may be away, and a failed command
# would set off node.sh's ERR trap.
claims() { kubectl get pvc -l "app=faults${1:+,round=$1}" -o jsonpath='{range .items[*]}{.metadata.name};{.metadata.uid};{.status.phase};{.spec.volumeName};{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.lifecycle}{"\n"}{end}'; }

round_gone() { # round_gone PVS UIDS: those PVs and the LVs of those claims gone
  local pvs=$1 uids=$2 left
  left=$(kubectl get pv -o name 2>/dev/null || echo unreachable)
  [ "$left" != unreachable ] || return 1
  for pv in $pvs; do ! grep -qx "persistentvolume/$pv" <<<"$left" || return 1; done
  left=$(volumes -o lv_tags) || return 1 # whole, not piped to grep -q (SIGPIPE)
  ! grep -q -E "lvm-agent\.pvc\.($uids)(,|[[:space:]]*\$)" <<<"$left"
}
PC=/share/powercut # what must outlive the cut: on the host
STATE_MNT=/var/lib/node-state
# The node's state: lost with a RAM root at each boot, kept here on vg1.
STATE_DIRS=(/var/lib/etcd /var/lib/kubelet /var/lib/containerd /var/lib/cni "$CLUSTER_DIR")
# vg1's LVs but the thin pool and the node's own state (round_gone and
# pc_no_orphans look at these)
volumes() { lvm lvs --noheadings -S 'lv_name!=pool0 && lv_name!=node-state' "$@" vg1; }

pc_state() {
  mkdir -p "$PC"
  # This boot's start as kubelet writes a container's startedAt (UTC, whole
  # seconds): a container started after it ran after the cut. Taken before
  # the cluster starts: kubelet starts Pods before cluster.sh up returns.
  pc_boot=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  if [ "$phase" = write ]; then
    step "The node's state on the node's disk: an ext4 LV vg1/node-state" \
      "etcd's data, kubelet's, containerd's (its images), CNI's IPAM and the cluster's PKI: on a node, its root disk." \
      "etcd fsyncs its log (CLUSTER_ETCD_FSYNC=1): what it acknowledged must survive the cut."
    show lvm lvcreate -q -y -n node-state -L 1536M vg1
    mkfs.ext4 -q /dev/vg1/node-state
  else
    step "The second boot: every LV of vg1 active from the boot (lvm2's vgchange -aay), nothing of the test's activated them"
    # Nothing here has run an lvchange or vgchange: setup-lvm.sh leaves a
    # VG it finds alone.
    lvm lvs --noheadings -o lv_name,lv_active vg1 | tee "$PC/lvs-at-boot"
    [ -z "$(awk '$2 != "active"' "$PC/lvs-at-boot")" ] || { echo "powercut: LVs not active after the boot"; return 1; }
    step "The node's state mounted again from vg1/node-state (ext4 replays its journal)"
  fi
  mkdir -p "$STATE_MNT"
  show mount /dev/vg1/node-state "$STATE_MNT"
  local d
  for d in "${STATE_DIRS[@]}"; do
    mkdir -p "$STATE_MNT$d" "$d"
    mount --bind "$STATE_MNT$d" "$d"
  done
  chmod 700 /var/lib/etcd # etcd's data: as etcd wants it (a warning else)
  # kubelet reports the machine ID: the same node, the same ID.
  [ -s "$STATE_MNT/machine-id" ] || tr -d - </proc/sys/kernel/random/uuid >"$STATE_MNT/machine-id"
  cp "$STATE_MNT/machine-id" /etc/machine-id
  export CLUSTER_ETCD_FSYNC=1
  df -h "$STATE_MNT"
}

# The writer, busybox sh in each Pod: a new file per start (seg-N), so a
# start after the cut never appends to a file whose tail the cut tore;
# record I a line with its checksum, fsync'd (busybox sync FILE), then
# "N I" in /data/synced. (The image links few applets: the rest through
# busybox itself, or the shell's builtins.) The Pod's name is in each record: a claim mounted
# in another Pod would show.
pc_sts_yaml() {
  cat <<'YAML'
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: pc, namespace: default}
spec:
  serviceName: pc
  replicas: 3
  podManagementPolicy: Parallel
  selector: {matchLabels: {pc: writer}} # copied onto the claims too: not app (the bursts' claims are app=faults)
  template:
    metadata: {labels: {pc: writer}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: writer
          image: localhost/lvm-agent/busybox:guest
          imagePullPolicy: Never
          volumeMounts: [{name: data, mountPath: /data}]
          command:
            - sh
            - -c
            - |
              trap 'exit 0' TERM
              name=$(cat /etc/hostname)
              n=1
              while [ -e /data/seg-$n ]; do n=$((n + 1)); done
              f=/data/seg-$n
              i=1
              while :; do
                b="$name record $i $(printf %0200d $i)"
                s=$(echo "$b" | md5sum)
                echo "$b ${s%% *}" >>$f
                sync $f || exit 1
                echo "$n $i" >/data/synced.tmp && busybox mv /data/synced.tmp /data/synced
                i=$((i + 1))
                sleep 0.5
              done &
              wait
  volumeClaimTemplates:
    - metadata: {name: data, labels: {app: faults, round: sts}}
      spec:
        storageClassName: lvm-thick
        accessModes: [ReadWriteOnce]
        resources: {requests: {storage: 16Mi}}
YAML
}

# pc_record POD I: the line the writer in POD wrote as record I
pc_record() {
  local pad sum
  printf -v pad '%0200d' "$2"
  read -r sum _ < <(echo "$1 record $2 $pad" | md5sum)
  echo "$1 record $2 $pad $sum"
}

# pc_poll POD:FILE...: each Pod's count, read on the node where kubelet
# mounted its claim, copied to $PC/synced-POD when it changes (a rename: the
# host has the old or the new count, whole). A count synced after the last
# copy is not counted.
pc_poll() {
  local p last=() i=0 s
  while :; do
    i=0
    for p in "$@"; do
      s=$(cat "${p#*:}" 2>/dev/null) || s=''
      if [ -n "$s" ] && [ "$s" != "${last[$i]:-}" ]; then
        echo "$s" >"$PC/synced-${p%%:*}.tmp" && mv "$PC/synced-${p%%:*}.tmp" "$PC/synced-${p%%:*}" && last[i]=$s
      fi
      i=$((i + 1))
    done
    sleep 0.3
  done
}

# pc_churn: round pcR of 20 claims created, round pcR-1 deleted, every 10 s,
# each step in the ledger before it starts and after it returned (the API
# server acknowledged it: etcd has it on its disk).
pc_churn() {
  local r=1
  while :; do
    echo "create pc$r start" >>"$PC/ledger"
    burst_yaml "pc$r" | kubectl apply -f - >/dev/null && echo "create pc$r done" >>"$PC/ledger"
    if [ $r -gt 1 ]; then
      echo "delete pc$((r - 1)) start" >>"$PC/ledger"
      kubectl delete pvc -l "round=pc$((r - 1))" --wait=false >/dev/null && echo "delete pc$((r - 1)) done" >>"$PC/ledger"
    fi
    r=$((r + 1))
    sleep 10
  done
}
pc_synced() { # pc_synced POD: the records of POD's last poll ("N I": I records of seg-N)
  cat "$PC/synced-$1" 2>/dev/null || echo "0 0"
}
pc_synced_ge() { [ "$(pc_synced "$1" | cut -d" " -f2)" -ge "$2" ]; } # pc_synced_ge POD N: POD's last poll has N records or more

pc_write() {
  local pods p uid claim pv paths=() n
  step "Power cut: an LV that is not lvm-agent's (foreign), which nothing may touch"
  show kubectl apply -f "$bin/deploy/examples/storageclass-thick.yaml"
  show lvm-stories foreign -state "$PC/foreign-before"

  step "Power cut: a StatefulSet of 3 writers, each appending checksummed, fsync'd records to its claim"
  pc_sts_yaml >"$CLUSTER_DIR/pc-sts.yaml"
  show cat "$CLUSTER_DIR/pc-sts.yaml"
  show kubectl apply -f "$CLUSTER_DIR/pc-sts.yaml"
  show kubectl rollout status statefulset/pc --timeout=900s
  show kubectl get pod -l pc=writer -o wide
  # Where kubelet mounted each Pod's claim on the node.
  pods=$(kubectl get pod -l pc=writer -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {.spec.volumes[?(@.name=="data")].persistentVolumeClaim.claimName}{"\n"}{end}')
  n=0
  while read -r p uid claim; do
    pv=$(kubectl get pvc "$claim" -o jsonpath='{.spec.volumeName}')
    paths+=("$p:/var/lib/kubelet/pods/$uid/volumes/kubernetes.io~local-volume/$pv/synced")
    n=$((n + 1))
  done <<<"$pods"
  [ $n = 3 ]
  pc_poll "${paths[@]}" &
  for p in pc-0 pc-1 pc-2; do
    within 600 "20 records synced by pod/$p" pc_synced_ge "$p" 20
  done
  echo "synced so far: $(for p in pc-0 pc-1 pc-2; do printf '%s: %s; ' $p "$(pc_synced $p)"; done)"

  step "Power cut: claims created and deleted, 20 each every 10 s (the node already chosen on them), while the writers write" \
    "Each step in the ledger on the share; the power goes 3 s after the third round's 20 creates were acknowledged."
  : >"$PC/ledger"
  pc_churn &
  within 900 "round pc3 created" grep -qx 'create pc3 done' "$PC/ledger"
  sleep 3
  # What was open at the cut (a look just before it): requests not yet answered.
  claims >"$PC/claims-at-cut" 2>/dev/null || true
  echo "at the cut: $(grep -c . "$PC/claims-at-cut" || true) claims, of them $(awk -F';' '$5 != "created"' "$PC/claims-at-cut" | grep -c . || true) not yet answered created; ledger:"
  sed 's/^/    /' "$PC/ledger"
  echo "synced: $(for p in pc-0 pc-1 pc-2; do printf '%s: %s; ' $p "$(pc_synced $p)"; done)"
  step "Power cut: the power goes now (QEMU killed: nothing flushed, unmounted or stopped), writers and claims loop running"
  : >/share/.vm/power-cut
  sleep 600 # run.sh kills QEMU
  echo "powercut: still running: run.sh did not cut the power"
  return 1
}

# pc_recovered: each writer in a container started after this boot's start
# ($pc_boot), every request final, and no LV left of a claim that is gone;
# the first look that saw each is marked on the share (pods-running,
# requests-final, orphans-gone: their times on the host). An orphan is not a
# request: the claim of a create cut by the power went before the node was
# back, and the agent's orphan collector removes its LV on its own pace
# (two passes, one interval apart). Quiet, never fails (the API server may
# be away).
pc_recovered() {
  [ -e "$PC/pods-running" ] || ! pc_running || : >"$PC/pods-running"
  [ -e "$PC/requests-final" ] || ! pc_final || : >"$PC/requests-final"
  [ -e "$PC/orphans-gone" ] || ! pc_no_orphans || : >"$PC/orphans-gone"
  [ -e "$PC/pods-running" ] && [ -e "$PC/requests-final" ] && [ -e "$PC/orphans-gone" ]
}
pc_running() {
  local p
  p=$(kubectl get pod -l pc=writer -o jsonpath='{range .items[*]}{.metadata.name} {.status.phase} {.status.containerStatuses[0].state.running.startedAt}{"\n"}{end}' 2>/dev/null) || return 1
  [ "$(awk -v b="$pc_boot" '$2 == "Running" && $3 >= b' <<<"$p" | wc -l)" = 3 ]
}
pc_final() { # every claim Bound and answered, no PV left of a claim that is gone
  local c pvs uid
  c=$(claims 2>/dev/null) || return 1
  [ -n "$c" ] && [ -z "$(awk -F';' '$3 != "Bound" || ($5 != "created" && $5 != "failed")' <<<"$c")" ] || return 1
  pvs=$(kubectl get pv -o jsonpath='{range .items[*]}{.spec.claimRef.uid}{"\n"}{end}' 2>/dev/null) || return 1
  for uid in $pvs; do awk -F';' -v u="$uid" '$2 == u { f = 1 } END { exit !f }' <<<"$c" || return 1; done
}
pc_no_orphans() { # no LV left of a claim that is gone
  local c lvs uid name tags
  c=$(claims 2>/dev/null) || return 1
  lvs=$(volumes -o lv_name,lv_tags 2>/dev/null) || return 1
  while read -r name tags; do
    if [ -z "$name" ] || [ "$name" = foreign ]; then continue; fi
    uid=$(grep -o -E 'lvm-agent\.pvc\.[0-9a-f-]+' <<<"$tags" | cut -d. -f3 || true)
    awk -F';' -v u="$uid" '$2 == u { f = 1 } END { exit !f }' <<<"$c" || return 1
  done <<<"$lvs"
}

# pc_records POD: reads seg-N of POD through the Pod and compares its first
# I records (the last poll's "N I") with what the writer wrote: prints
# "I intact lost mismatched-bytes" (a missing byte counts as mismatched).
pc_records() {
  local p=$1 n c i
  read -r n c < <(pc_synced "$p")
  kubectl exec "$p" -- cat "/data/seg-$n" >"$CLUSTER_DIR/pc-$p.read"
  for ((i = 1; i <= c; i++)); do pc_record "$p" "$i"; done >"$CLUSTER_DIR/pc-$p.want"
  awk -v c="$c" 'NR == FNR { w[FNR] = $0; next }
    FNR <= c { seen = FNR
      if ($0 == w[FNR]) { ok++; next }
      a = $0 "\n"; b = w[FNR] "\n"; m = length(a) > length(b) ? length(a) : length(b)
      for (j = 1; j <= m; j++) if (substr(a, j, 1) != substr(b, j, 1)) bad++ }
    END { for (i = seen + 1; i <= c; i++) bad += length(w[i]) + 1
      printf "%d %d %d %d\n", c, ok, c - ok, bad }' "$CLUSTER_DIR/pc-$p.want" "$CLUSTER_DIR/pc-$p.read"
}

# pc_diag: what says why a container of lvm-agent's ended or waited in this
# boot, kept on the host (powercut/diag): each pod's container states (the
# last termination's reason, exit code and times, the restart counts), the
# cluster's events (probe failures, kills, back-offs) and kubelet's log.
pc_diag() {
  mkdir -p "$PC/diag"
  # Each container's line, the lvmd sidecar's (an init container) first.
  local c='{"  "}{.name}{" restarts="}{.restartCount}{" ready="}{.ready}{" started="}{.state.running.startedAt}{" last="}{.lastState.terminated.reason}{" exit="}{.lastState.terminated.exitCode}{" from="}{.lastState.terminated.startedAt}{" to="}{.lastState.terminated.finishedAt}{"\n"}'
  kubectl -n lvm-agent get pods -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{range .status.initContainerStatuses[*]}'"$c"'{end}{range .status.containerStatuses[*]}'"$c"'{end}{end}' >"$PC/diag/containers.txt" 2>&1 || true
  kubectl get events -A --sort-by=.lastTimestamp -o wide >"$PC/diag/events.txt" 2>&1 || true
  cp "$CLUSTER_DIR/logs/kubelet.log" "$PC/diag/kubelet.log" 2>/dev/null || true
  sed 's/^/    /' "$PC/diag/containers.txt"
  grep -E 'Unhealthy|Killing|BackOff' "$PC/diag/events.txt" | sed 's/^/    /' || true
}
pc_check() {
  local lost=0 mism=0 records=0 r live=3 rounds nvol p c ok l m have
  step "After the power cut: the StatefulSet's Pods running again and every request final, nothing installed again" \
    "kubelet starts the Pods again, lvm-agent's DaemonSet among them; the open requests must be answered."
  show kubectl get pod -A -o wide
  within 1800 "each writer running again, every request final and no orphan LV" pc_recovered
  : >"$PC/recovered" # its time on the host: the recovery's end
  # This boot's logs of the agent and the provisioner, for the host
  # (faults.sh's share, powercut/pod-logs): what the recovery waited on.
  { mkdir -p "$PC/pod-logs" && cp -r /var/log/pods/lvm-agent_* "$PC/pod-logs/" 2>/dev/null; } || true
  pc_diag
  echo "recovered: $(($(date +%s) - $(cut -d. -f1 "$PC/cut-at" 2>/dev/null || date +%s))) s after the cut (the guest's clock)"
  show kubectl get pod -l pc=writer -o wide
  show kubectl -n lvm-agent get pods

  step "The audit: the claims, PVs and LVs (lvm-stories audit: make test-faults'), and the ledger's rounds"
  # Rounds created (acknowledged) and never deleted: their 20 claims must be there.
  rounds=$(awk '$1 == "create" && $3 == "done" { c[$2] = 1 } $1 == "delete" { d[$2] = 1 }
    END { for (r in c) if (!(r in d)) print r }' "$PC/ledger")
  for r in $rounds; do
    have=$(claims "$r" | grep -c . || true)
    live=$((live + 20))
    [ "$have" = 20 ] || { echo "audit: round $r created before the cut, never deleted: $have claims of 20"; lost=$((lost + 20 - have)); }
  done
  lvm-stories audit -state "$PC/foreign-before" -live "$live" -node-lvs node-state | tee "$CLUSTER_DIR/audit.txt"
  audit_row=$(sed -n 's/^audit: \([0-9 ]*\) (lost.*/\1/p' "$CLUSTER_DIR/audit.txt")
  show lvm lvs -o lv_name,lv_size,lv_attr,lv_tags vg1

  step "Every record a writer had synced before the cut, read back through its Pod"
  for p in pc-0 pc-1 pc-2; do
    read -r c ok l m < <(pc_records "$p")
    echo "pod/$p: seg-$(pc_synced "$p" | cut -d' ' -f1): $c records synced before the cut, $ok intact, $l lost, $m bytes mismatched; since this boot: seg-$(kubectl exec "$p" -- cat /data/synced)"
    [ "$c" -ge 20 ] || { echo "pod/$p: only $c records counted"; lost=$((lost + 1)); }
    records=$((records + c)) lost=$((lost + l)) mism=$((mism + m))
  done

  nvol=$((3 + 20 * $(grep -c '^create .* start$' "$PC/ledger" || true)))
  # lost dup orphan open failed foreign from the audit; lost adds the ledger's and the records'
  read -r l d o op f fo <<<"$audit_row"
  lost=$((lost + l))
  printf 'open-at-cut %s\n' "$(awk -F';' '$5 != "created"' "$PC/claims-at-cut" | grep -c . || true)" | tee "$PC/result"
  printf 'volumes %s\nrecords %s\nlost %s\ndup %s\norphan %s\nopen %s\nfailed %s\nforeign %s\nmismatched %s\n' \
 "$nvol" "$records" "$lost" "$d" "$o" "$op" "$f" "$fo" "$mism" | tee -a "$PC/result"
  [ "$lost $d $o $op $f $fo $mism" = "0 0 0 0 0 0 0" ]
  step "powercut: OK"
}
