# Sourced by node.sh in faults mode (make test-faults), after the install,
# with its helpers: components of the node killed in the middle of a burst.
# For each fault in turn, 20 claims are created and the 20 of the round
# before deleted in one go (with the node already chosen on each claim, as
# the scheduler or lvm-agent's clone placer writes it: the PV controller
# then provisions at once, no Pod needed), and 3 s later the fault:
#   agent           kill -9 of the agent's process (kubelet restarts it;
#                   with --install systemd, node.sh's service loop)
#   lvmd            kill -9 of the lvmd sidecar's process (the same; with
#                   --install host-lvmd or systemd, of the host's lvmd)
#   lvmd-away       lvmd kept away for 60 s (killed again each time kubelet
#                   starts it; kubelet's crash-loop backoff may keep it away
#                   longer): the Node capacity annotation and the agent's
#                   lvm_agent_lvmd_reachable must say so meanwhile, and no
#                   request may end failed
#   kubelet         kill -9, started again (cluster.sh restart: the service
#   containerd      kill -9, started again  manager's Restart= on a node)
#   kube-apiserver  SIGTERM, started again (an upgrade's restart)
#   vg-full         vg1 filled: 20 claims of a fifteenth of its free space
#                   each, so that only some fit; each of the others must
#                   be answered failed with InsufficientCapacity and sent
#                   back to the scheduler (its selected-node removed), with
#                   no LV of it at all, and vg1 left with less room than one
#                   claim (none refused that fit); then space is freed (the
#                   round before and the claims that fit deleted) and the
#                   node chosen again on the refused ones, as the scheduler
#                   does once the capacity says they fit: all Bound
#                   (recover: space freed -> that)
# Each round ends when every claim of the round is Bound and every PV and
# LV of the deleted ones is gone (recover: fault -> that), then the audit of
# the whole node: every live claim Bound with exactly one LV tagged with its
# UID, of at least its size (lost, duplicated); no LV or PV left of a claim
# that is gone (orphaned); no request left open or answered failed; an LV
# that is not lvm-agent's, made before the first round, still there with
# its UID, tags and bytes (foreign). Each count must be 0.
# shellcheck shell=bash

# pids NAME: the processes whose command is NAME (the guest has no pgrep).
pids() { local f c; for f in /proc/[0-9]*/comm; do read -r c 2>/dev/null <"$f" && [ "$c" = "$1" ] || continue; f=${f#/proc/}; echo "${f%/comm}"; done; }

# kill9 NAME [ARG]: kill -9 of NAME's processes (with ARG on their command
# line: the provisioner runs the agent's binary too, without
# --lvmd-socket); at least one, or the fault did not happen.
kill9() {
  local p killed=0
  for p in $(pids "$1"); do
    [ -z "${2:-}" ] || grep -q -- "^$2" < <(tr '\0' '\n' <"/proc/$p/cmdline" 2>/dev/null) || continue
    ! kill -9 "$p" 2>/dev/null || killed=$((killed + 1))
  done
  echo "killed $killed $1 process(es)"
  [ $killed -ge 1 ]
}

# lvmd_away SECONDS: no lvmd for SECONDS; each look asks the Node's
# capacity annotation and the agent's metric (at its Pod's IP) whether
# they say so. Its commands never fail (node.sh's ERR trap). Each answer
# is read whole before grep looks at it: with pipefail, "wget | grep -q"
# fails when grep stops at its match while wget still writes (SIGPIPE),
# which made this look miss lvm_agent_lvmd_reachable 0 in a run of
# 1e1ee72.
lvmd_away() {
  local end=$((SECONDS + $1)) ip said=no metric=no looks=0 got
  ip=127.0.0.1 # the systemd unit's --metrics-address; else the agent's Pod
  [ "$install" = systemd ] || ip=$(kubectl -n lvm-agent get pods -l app.kubernetes.io/name=lvm-agent -o jsonpath='{.items[0].status.podIP}')
  while [ $SECONDS -lt $end ]; do
    kill9 lvmd >/dev/null || true # none between kubelet's restarts
    looks=$((looks + 1))
    got=$(kubectl get node "$(hostname)" -o jsonpath='{.metadata.annotations.csi\.alibabacloud\.com/storage-topology}' 2>/dev/null || true)
    ! grep -q '"lvmdUnreachable":true' <<<"$got" || said=yes
    got=$(wget -q -O - "http://$ip:8495/metrics" 2>/dev/null || true)
    ! grep -qx 'lvm_agent_lvmd_reachable 0' <<<"$got" || metric=yes
    sleep 2
  done
  echo "lvmd away ${1} s, $looks looks: Node capacity annotation said lvmdUnreachable: $said; lvm_agent_lvmd_reachable 0: $metric"
  [ $said = yes ] && [ $metric = yes ]
}

fault() {
  case $1 in
    agent) kill9 lvm-agent --lvmd-socket= ;;
    lvmd) kill9 lvmd ;;
    lvmd-away) lvmd_away 60 ;;
    kubelet | containerd) cluster.sh restart "$1" KILL ;;
    kube-apiserver) cluster.sh restart kube-apiserver TERM ;;
  esac
}

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
# may be empty); claims_app: their app label (faults; node.sh's ten claims:
# many). (A kubectl run costs about a second of the guest's CPU
# under TCG: one list per look.) The waits below ask quietly, and their
# commands never fail: the API server may be away, and a failed command
# would set off node.sh's ERR trap.
claims() { kubectl get pvc -l "app=${claims_app:-faults}${1:+,round=$1}" -o jsonpath='{range .items[*]}{.metadata.name};{.metadata.uid};{.status.phase};{.spec.volumeName};{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.lifecycle}{"\n"}{end}'; }
round_bound() { # round_bound ROUND: its 20 claims Bound
  local c
  c=$(claims "$1" 2>/dev/null || true)
  [ "$(awk -F';' '$3 == "Bound"' <<<"$c" | wc -l)" = 20 ]
}
delete_round() { # delete_round ROUND: its claims deleted; sets pvs and uids, what round_gone waits for
  local c
  c=$(claims "$1")
  pvs=$(cut -d';' -f4 <<<"$c") uids=$(cut -d';' -f2 <<<"$c" | paste -sd'|')
  kubectl delete pvc -l "round=$1" --wait=false >/dev/null
}
round_gone() { # round_gone PVS UIDS: those PVs and the LVs of those claims gone
  local pvs=$1 uids=$2 left
  left=$(kubectl get pv -o name 2>/dev/null || echo unreachable)
  [ "$left" != unreachable ] || return 1
  for pv in $pvs; do ! grep -qx "persistentvolume/$pv" <<<"$left" || return 1; done
  left=$(volumes -o lv_tags) || return 1 # whole, not piped to grep -q (lvmd_away)
  ! grep -q -E "lvm-agent\.pvc\.($uids)(,|[[:space:]]*\$)" <<<"$left"
}

# make_foreign: vg1/foreign, an LV that is not lvm-agent's, with 1 MiB of
# random bytes; sets foreign_before, what the audit compares it with.
make_foreign() {
  show lvm lvcreate -q -y -n foreign -L 8M --addtag owner=someone-else vg1
  head -c 1048576 /dev/urandom >/dev/vg1/foreign && sync
  foreign_before=$(foreign_state)
}
# audit N: one row of counts for the whole node, each must be 0; N claims live.
foreign_state() { echo "$(lvm lvs --noheadings -o lv_uuid,lv_tags vg1/foreign 2>&1) $(head -c 1048576 /dev/vg1/foreign 2>&1 | md5sum)"; }
audit() {
  local c lvs pvs lost=0 dup=0 orphan=0 open=0 failed=0 foreign=0 name uid phase pv state n size tags
  c=$(claims) lvs=$(volumes -o lv_name,lv_size,lv_tags --units b --nosuffix)
  n=$(grep -c . <<<"$c" || true)
  [ "$n" -ge "$1" ] || { echo "audit: $n claims of $1"; lost=$(($1 - n)); }
  pvs=$(kubectl get pv -o jsonpath='{range .items[*]}{.metadata.name};{.spec.claimRef.uid};{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.lifecycle}{"\n"}{end}')
  while IFS=';' read -r name uid phase pv state; do
    [ -n "$name" ] || continue
    n=0
    while read -r _ size tags; do
      [[ ,$tags, == *",lvm-agent.pvc.$uid,"* ]] || continue
      n=$((n + 1))
      [ "$size" -ge $((16 << 20)) ] || { echo "audit: pvc/$name: its LV has $size bytes"; lost=$((lost + 1)); }
    done <<<"$lvs"
    [ "$phase" = Bound ] || { echo "audit: pvc/$name is $phase"; lost=$((lost + 1)); }
    [ $n -ge 1 ] || { echo "audit: pvc/$name: no LV"; lost=$((lost + 1)); }
    [ $n -le 1 ] || { echo "audit: pvc/$name: $n LVs"; dup=$((dup + n - 1)); }
    [ "$state" != failed ] || { echo "audit: pvc/$name answered failed"; failed=$((failed + 1)); }
    [ "$state" = created ] || [ "$state" = failed ] || { echo "audit: pvc/$name: request $state"; open=$((open + 1)); }
  done <<<"$c"
  while read -r name _ tags; do # LVs of claims that are gone
    [ -n "$name" ] && [ "$name" != foreign ] || continue
    uid=$(grep -o -E 'lvm-agent\.pvc\.[0-9a-f-]+' <<<"$tags" | cut -d. -f3 || true)
    awk -F';' -v u="$uid" '$2 == u { f = 1 } END { exit !f }' <<<"$c" || { echo "audit: LV vg1/$name (claim ${uid:-none}) has no claim"; orphan=$((orphan + 1)); }
  done <<<"$lvs"
  while IFS=';' read -r pv uid state; do # PVs of claims that are gone, requests open
    [ -n "$pv" ] || continue
    awk -F';' -v u="$uid" '$2 == u { f = 1 } END { exit !f }' <<<"$c" || { echo "audit: pv/$pv (claim $uid) has no claim"; orphan=$((orphan + 1)); }
    [ "$state" != failed ] || { echo "audit: pv/$pv answered failed"; failed=$((failed + 1)); }
  done <<<"$pvs"
  [ "$(foreign_state)" = "$foreign_before" ] || { echo "audit: vg1/foreign changed: $(foreign_state)"; foreign=1; }
  audit_row="$lost $dup $orphan $open $failed $foreign"
}

# vg_full PREV: the vg-full round (above); PREV's 20 claims live. Sets
# row (creates deletes recover and the audit's counts) and prev.
lines() { grep -c . <<<"$1" || true; }
vg_free() { lvm vgs --noheadings --units b --nosuffix -o vg_free vg1 | tr -d ' '; }
vg_full() {
  local free size c fit refused tags bad=0 t name node reason uid pvs1 uids1
  free=$(vg_free)
  size=$(((free / 15) >> 22 << 22)) # whole 4 MiB extents
  echo "vg1 free: $free bytes; 20 claims of $((size >> 20)) MiB"
  burst_yaml vg-full "$((size >> 20))Mi" | kubectl apply -f - >/dev/null
  within 900 "decision on every claim of round vg-full" full_settled
  c=$(full_claims)
  fit=$(awk -F';' '$2 == "Bound" { print $1 }' <<<"$c") refused=$(awk -F';' '$2 != "Bound" { print $1 }' <<<"$c")
  tags=$(lvm lvs --noheadings -o lv_name,lv_tags vg1) # once, not per claim (a second of vCPU each under TCG)
  while IFS=';' read -r name _ node reason uid; do
    [ -n "$name" ] && grep -qx "$name" <<<"$refused" || continue
    [ "$reason" = InsufficientCapacity ] || { echo "vg-full: pvc/$name answered $reason, not InsufficientCapacity"; bad=1; }
    [ -z "$node" ] || { echo "vg-full: pvc/$name still on node $node"; bad=1; }
    ! grep -E "lvm-agent\.pvc\.$uid(,|[[:space:]]*\$)" <<<"$tags" || { echo "vg-full: pvc/$name has an LV"; bad=1; }
  done <<<"$c"
  free=$(vg_free)
  echo "vg-full: $(lines "$fit") Bound, $(lines "$refused") refused; vg1 free now: $free bytes"
  [ -n "$refused" ] && [ -n "$fit" ] || { echo "vg-full: all 20 decided alike"; bad=1; }
  [ "$free" -lt "$size" ] || { echo "vg-full: claims refused while vg1 had room for one"; bad=1; }
  name=$(sed -n 1p <<<"$refused")
  echo "    pvc/$name's event: $(kubectl get events --field-selector "involvedObject.name=$name,reason=ProvisioningFailed" -o jsonpath='{.items[-1:].message}')"
  [ $bad -eq 0 ]
  step "The volume group full: space freed (round $1 and the claims that fit deleted), the node chosen again on the refused claims" \
    "As the scheduler does once the capacity says they fit (the claims have no Pods)."
  t=$SECONDS
  delete_round "$1"
  pvs1=$pvs uids1=$uids
  c=$(claims vg-full)
  pvs=$(awk -F';' 'NR == FNR { f[$1] = 1; next } f[$1] { print $4 }' <(echo "$fit") <(echo "$c"))
  uids=$(awk -F';' 'NR == FNR { f[$1] = 1; next } f[$1] { print $2 }' <(echo "$fit") <(echo "$c") | paste -sd'|')
  # shellcheck disable=SC2086 # the names, one word each
  kubectl delete pvc $fit --wait=false >/dev/null
  within 900 "the PVs and LVs of round $1 gone" round_gone "$pvs1" "$uids1"
  within 900 "the PVs and LVs of the claims that fit gone" round_gone "$pvs" "$uids"
  # shellcheck disable=SC2086
  show kubectl annotate pvc $refused "volume.kubernetes.io/selected-node=$(hostname)"
  within 900 "the refused claims Bound" full_bound
  row="vg-full 20 $((20 + $(lines "$fit"))) $((SECONDS - t))"
  audit "$(lines "$refused")"
  row+=" $audit_row"
}
# name;phase;selected-node;reason;uid of round vg-full's claims
full_claims() { kubectl get pvc -l app=faults,round=vg-full -o jsonpath='{range .items[*]}{.metadata.name};{.status.phase};{.metadata.annotations.volume\.kubernetes\.io/selected-node};{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.reason};{.metadata.uid}{"\n"}{end}'; }
full_settled() { # each claim Bound, or refused and sent back to the scheduler
  local c
  c=$(full_claims 2>/dev/null || true)
  [ "$(awk -F';' '$2 == "Bound" || ($3 == "" && $4 != "")' <<<"$c" | wc -l)" = 20 ]
}
full_bound() {
  local c
  c=$(full_claims 2>/dev/null || true)
  [ -n "$c" ] && [ "$(awk -F';' '$2 != "Bound"' <<<"$c" | wc -l)" = 0 ]
}

kills_table() { # the rows so far: the make test-faults figures
  printf '\n%-16s %7s %7s %9s %4s %4s %6s %4s %6s %7s\n' fault creates deletes "recover s" lost dup orphan open failed foreign
  awk 'NF { printf "%-16s %7s %7s %9s %4s %4s %6s %4s %6s %7s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 }' <<<"$1"
}

node_kills() {
  local f prev=base t pvs uids rows='' n
  step "Faults: an LV that is not lvm-agent's, which nothing may touch, and 20 claims to delete in the first round" \
    "The claims name this node (volume.kubernetes.io/selected-node), as the scheduler would: provisioned without Pods."
  show kubectl apply -f "$bin/deploy/examples/storageclass-thick.yaml"
  make_foreign
  burst_yaml base | kubectl apply -f - >/dev/null
  within 600 "20 claims of round base Bound" round_bound base
  audit 20
  echo "audit: $audit_row (lost duplicated orphaned open failed foreign)"
  [ "$audit_row" = "0 0 0 0 0 0" ]
  for f in ${faults//,/ }; do
    if [ "$f" = vg-full ]; then
      step "The volume group full: 20 claims that cannot all fit (round vg-full), round $prev still there"
      vg_full "$prev"
      rows+="$row"$'\n'
      [ "$audit_row" = "0 0 0 0 0 0" ] || { kills_table "$rows"; false; }
      prev=$f
      continue
    fi
    step "Fault: $f, during 20 creates (round $f) and 20 deletes (round $prev)"
    burst_yaml "$f" | kubectl apply -f - >/dev/null
    delete_round "$prev"
    sleep 3
    t=$SECONDS
    show fault "$f"
    within 900 "20 claims of round $f Bound" round_bound "$f"
    within 900 "the PVs and LVs of round $prev gone" round_gone "$pvs" "$uids"
    n=$((SECONDS - t))
    show kubectl -n lvm-agent get pods
    audit 20
    rows+="$f 20 20 $n $audit_row"$'\n'
    [ "$audit_row" = "0 0 0 0 0 0" ] || { kills_table "$rows"; false; }
    prev=$f
  done
  step "Faults: the last round deleted; the node audited once more"
  delete_round "$prev"
  t=$SECONDS
  within 900 "the PVs and LVs of round $prev gone" round_gone "$pvs" "$uids"
  audit 0
  n=$((SECONDS - t))
  rows+="(end) 0 $(lines "$pvs") $n $audit_row"$'\n'
  show lvm lvs vg1
  kills_table "$rows"
  [ "$audit_row" = "0 0 0 0 0 0" ]
  step "faults: OK"
}
