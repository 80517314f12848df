#!/usr/bin/env bash
# lvm-agent on a real one-node cluster, inside the guest (scripts/vm/node.sh
# boots one), told as a user would see it: each step says what it shows, the
# command a user would type and its output, and checks the result against
# `lvm lvs` and the objects. One script, three modes:
#
#   demo   (`make demo`) the cluster comes up (cluster.sh); lvm-agent
#          installed as a user would (`kubectl apply -k deploy/overlays/guest`:
#          the agent and topolvm's lvmd as a DaemonSet on vg1, on --vg-device;
#          the provisioner Deployment); then the stories a user reads
#          (lvm-stories demo grow clone: integration/stories says each).
#   full   (`make node`, `make test-node`: part of `make test`) a Pod with an
#          emptyDir first (lvm-stories cluster), then the demo's stories,
#          then lvm-stories wipe crypt full: no deleted volume's bytes in the
#          next; encrypted claims; a claim too large for vg1; ten claims while the node's parts are
#          killed, audited as make test-faults' rounds are; a Retain class.
#   bench  (`make bench-node`) after the install: PVC created -> Pod Running,
#          RUNS times (one warm-up run first, not counted), each run's
#          breakdown and the medians (see bench() below for the boundaries);
#          then PVC grown -> the new size seen in the running Pod, the same
#          way, beside lvextend + resize2fs by hand (bench-grow.sh); then
#          a thick clone's copy beside dd, a thin clone's PVC -> Pod Running
#          beside a plain thin PVC's (bench-clone.sh). --bench LIST: only
#          these of create,grow,clone (comma-separated).
#
#   faults (`make test-faults`) after the install: kills of the agent, lvmd,
#          kubelet, containerd and kube-apiserver, and lvmd kept away for
#          60 s, each during a burst of 20 creates and 20 deletes, each
#          round audited (lvm-stories faults). --faults LIST: only these of
#          agent,lvmd,lvmd-away,kubelet,containerd,kube-apiserver,vg-full.
#
#   peers  (`make bench-peers`) after the cluster and vg1: lvm-agent beside
#          TopoLVM (scripts/guest/peers.sh, which installs both; --peers
#          ARGS: its arguments, one string).
#   powercut (make test-faults' power-cut-cluster) the node's state on
#          vg1/node-state, then --phase write: a StatefulSet of writers and
#          claims created and deleted until the power cut; --phase check
#          (the next boot on the disk): the cluster started again on its
#          state, then the audit (scripts/guest/powercut-cluster.sh).
#   stories  after the install, lvm-stories' wipe and crypt stories alone
#          (--stories LIST: these instead, e.g. bench-crypt).
#
#   node.sh [--bin DIR] [--mode demo|full|bench|faults|peers|powercut|stories] [--phase write|check] [--runs N] [--bench LIST] [--stories LIST]
#           [--install kustomize|helm|host-lvmd|systemd] [--vg-device DEV] [--peers ARGS] [--faults LIST]
#       DIR: guest-files.sh's binaries, images/, deploy/ and charts/ (/opt/lvm-agent)
#       DEV: the node's disk for vg1 (scripts/vm/node.sh and test.sh attach a
#       sparse file of the host as /dev/vda); without it, a sparse loop file
#       --install helm (`make demo-helm`): `helm install` of charts/lvm-agent
#       with the guest's images instead of `kubectl apply -k`; the demo then
#       also runs `lvm-agent volume status -o json` and `--version` in the
#       agent's container.
#       --install host-lvmd|systemd (make test-faults): the node as bare-metal
#       users run it, lvmd a host service (with deploy/base's config); the
#       agent from deploy/overlays/host-lvmd, or a host process started as
#       deploy/systemd's unit starts it (host_install), for the faults.
# Exit code 0 only when every step worked.
set -Eeuo pipefail # -E: the ERR trap (dump) fires in functions too

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin=/opt/lvm-agent mode=full runs=5 benches=create,grow,clone install=kustomize vg_device='' peers='' only='wipe crypt' faults=agent,lvmd,lvmd-away,kubelet,containerd,kube-apiserver,vg-full
usage() { sed -n '2,55s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --bin) bin=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --bench) benches=$2; shift 2 ;;
    --install) install=$2; shift 2 ;;
    --vg-device) vg_device=$2; shift 2 ;;
    --peers) peers=$2; shift 2 ;;
    --faults) faults=$2; shift 2 ;;
    --stories) only=$2; shift 2 ;;
    --phase) phase=$2; shift 2 ;;
    *) usage ;;
  esac
done
case $mode in demo | full | bench | faults | peers | powercut | stories) ;; *) usage ;; esac
case ${phase:=write} in write | check) ;; *) usage ;; esac
case $install in kustomize | helm | host-lvmd | systemd) ;; *) usage ;; esac
export CLUSTER_DIR=${CLUSTER_DIR:-/var/lib/lvm-agent-cluster}
export KUBECONFIG=$CLUSTER_DIR/pki/admin.conf PATH=$bin:$here:/usr/local/sbin:/usr/local/bin:$PATH
t0=$SECONDS
# step TITLE [WHY...]: a numbered heading with the time so far, and what it
# shows. The step before it ends there: its wall time goes to
# $LVM_AGENT_GUEST_TIMES when set (scripts/guest/test.sh: make test's table).
# Each step's end also says, on the console, how busy the guest's vCPUs were
# during it and how many kubectl runs it made (each about a second of vCPU
# under TCG): where make test's guest time goes.
. "$here/cpu.sh"
kubectl() { { echo >>"$CLUSTER_DIR/kubectl.runs"; } 2>/dev/null || true; command kubectl "$@"; }
runs() { { wc -l <"$CLUSTER_DIR/kubectl.runs"; } 2>/dev/null || echo 0; }
step_title='' step_at=$SECONDS step_runs=0
read -r step_busy step_all < <(cpu)
step_time() {
  local b a n
  read -r b a < <(cpu)
  n=$(runs)
  if [ -n "$step_title" ]; then
    printf '    (step: %d s, vCPUs %d%% busy, %d kubectl runs)\n' $((SECONDS - step_at)) \
      "$(busy "$step_busy" "$step_all" "$b" "$a")" $((n - step_runs))
    [ -z "${LVM_AGENT_GUEST_TIMES:-}" ] ||
      printf 'node: %s\t%d\n' "$step_title" $((SECONDS - step_at)) >>"$LVM_AGENT_GUEST_TIMES"
  fi
  step_title='' step_at=$SECONDS step_busy=$b step_all=$a step_runs=$n
}
trap 'step_time; keep_logs' EXIT
step() {
  step_time
  case $1 in *": OK") ;; *) step_title=$1 ;; esac
  printf '\n==> [%3d s] %s\n' $((SECONDS - t0)) "$1"
  shift
  [ $# -eq 0 ] || printf '    %s\n' "$@"
}
show() { echo "\$ $*"; "$@"; }
dump() {
  echo "node: FAILED at line $1"
  kubectl get pods -A -o wide 2>&1 || true
  kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -n 30 || true
  kubectl -n lvm-agent logs ds/lvm-agent --all-containers --tail 20 2>&1 || true
  for f in "$CLUSTER_DIR"/logs/*.log; do echo "--- $f"; tail -n 15 "$f"; done
  # Last, as make test's failure summary (the tail of what matches FAILED) shows
  # it: the cluster's newest warnings, whole (a kubelet's mount error, say).
  kubectl get events -A --field-selector type=Warning --sort-by=.lastTimestamp --no-headers 2>&1 |
    tail -n 6 | sed 's/^/node: FAILED: warning: /' || true
}
trap 'dump $LINENO' ERR
# keep_logs: the cluster's whole logs, with this boot's of the agent and the
# provisioner, for the host (the share: scripts/vm/node.sh and test.sh keep
# it), at the end of every run, passed or not: a step that passed slowly is
# read there (under 1 MiB).
keep_logs() {
  grep -q ' /share ' /proc/mounts || return 0
  rm -rf /share/cluster-logs
  cp -r "$CLUSTER_DIR/logs" /share/cluster-logs 2>/dev/null || return 0
  cp -r /var/log/pods/lvm-agent_* /share/cluster-logs/ 2>/dev/null || true
  kubectl get events -A -o wide --sort-by=.lastTimestamp --request-timeout=30s >/share/cluster-logs/events.txt 2>/dev/null || true
}

# service NAME COMMAND...: COMMAND run as a node's service manager runs a
# unit with Restart=always and RestartSec=2 (the guest has no systemd):
# started again 2 s after it ends, killed or not. Output: logs/NAME.log.
service() {
  local name=$1
  shift
  setsid bash -c 'while :; do "$@"; sleep 2; done' "$name" "$@" </dev/null >>"$CLUSTER_DIR/logs/$name.log" 2>&1 &
}

# host_install: lvm-agent on a node whose lvmd is a host service (the
# seed's bare-metal nodes): topolvm's lvmd with deploy/base's config, then
# deploy/overlays/host-lvmd (install host-lvmd), or deploy/overlays/controller
# and the agent as a host process with deploy/systemd's command line,
# environment file and kubeconfig recipe (install systemd).
host_install() {
  local k=$CLUSTER_DIR/host-install
  step "lvmd as the node's host service (lvmd.service): deploy/base's lvmd config, socket /run/topolvm/lvmd.sock" \
    "Run as a service manager runs it (Restart=always, RestartSec=2): a kill is followed by a start."
  mkdir -p /etc/topolvm /run/topolvm "$k" # /run/topolvm: a unit's RuntimeDirectory=topolvm
  cp "$bin/deploy/base/lvmd.yaml" /etc/topolvm/lvmd.yaml
  show cat /etc/topolvm/lvmd.yaml
  service lvmd "$bin/lvmd" --config /etc/topolvm/lvmd.yaml --metrics-bind-address=
  within 120 "lvmd socket" test -S /run/topolvm/lvmd.sock
  # The overlay, host-lvmd (the agent's DaemonSet alone) or controller (no
  # DaemonSet: the agent runs on the host), with this guest's image names
  # (deploy/overlays/guest's); kustomize takes only a relative path: each
  # part of $k as "../".
  local up overlay=controller
  [ "$install" = systemd ] || overlay=host-lvmd
  up=$(printf '%s' "$k" | tr -cd / | sed 's|/|../|g')
  cat >"$k/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $up${bin#/}/deploy/overlays/$overlay
images:
  - name: ghcr.io/lvm-agent/lvm-agent
    newName: localhost/lvm-agent/lvm-agent
    newTag: guest
YAML
  if [ "$install" = host-lvmd ]; then
    step "Install lvm-agent as a user would on such nodes: kubectl apply -k deploy/overlays/host-lvmd" \
      "The DaemonSet has the agent alone; it reaches lvmd's socket in the host's /run/topolvm." \
      "(Applied through a kustomization that names deploy/overlays/host-lvmd and this guest's image.)"
    show kubectl apply -k "$k"
    return
  fi
  step "The agent as a host process, as deploy/systemd installs it (docs/install.md \"Bare metal (systemd)\")" \
    "The cluster side as a user applies it: kubectl apply -k deploy/overlays/controller (the provisioner, no DaemonSet," \
    "no lvm-agent-node admission policy: an agent whose token is bound to no Pod may not update its Node otherwise)." \
    "(Applied through a kustomization that names deploy/overlays/controller and this guest's image.)"
  show cat "$k/kustomization.yaml"
  show kubectl apply -k "$k"
  echo "    The agent's kubeconfig, by the recipe of docs/install.md: a ServiceAccount token kept in a Secret."
  kubectl apply -f - <<'YAML'
apiVersion: v1
kind: Secret
metadata: {name: lvm-agent-token, namespace: lvm-agent, annotations: {kubernetes.io/service-account.name: lvm-agent}}
type: kubernetes.io/service-account-token
YAML
  token() { kubectl -n lvm-agent get secret lvm-agent-token -o jsonpath='{.data.token}' | base64 -d; }
  has() { [ -n "$("$@" 2>/dev/null)" ]; }
  within 120 "token in secret/lvm-agent-token" has token
  local token server kc=/etc/lvm-agent/kubeconfig
  token=$(token)
  server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  kubectl config view --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$k/ca.crt"
  mkdir -p /etc/lvm-agent
  kubectl config --kubeconfig=$kc set-cluster cluster --server="$server" --certificate-authority="$k/ca.crt" --embed-certs=true >/dev/null
  kubectl config --kubeconfig=$kc set-credentials lvm-agent --token="$token" >/dev/null
  kubectl config --kubeconfig=$kc set-context lvm-agent --cluster=cluster --user=lvm-agent >/dev/null
  kubectl config --kubeconfig=$kc use-context lvm-agent >/dev/null
  show kubectl --kubeconfig=$kc auth can-i patch persistentvolumeclaims
  [ "$(kubectl --kubeconfig=$kc auth can-i delete persistentvolumeclaims || true)" = no ]
  cp "$bin/lvm-agent" /usr/local/bin/lvm-agent # the docs' install(1): the guest has none
  chmod 0755 /usr/local/bin/lvm-agent
  sed "s/^NODE_NAME=.*/NODE_NAME=$(hostname)/" "$bin/deploy/systemd/lvm-agent.env" >/etc/lvm-agent/lvm-agent.env
  show grep -v -e '^#' -e '^$' /etc/lvm-agent/lvm-agent.env
  # systemd's ExecStart: ${VAR} one word, $VAR split on spaces, as bash does here.
  local cmd
  cmd=$(sed -n 's/^ExecStart=//p' "$bin/deploy/systemd/lvm-agent.service")
  echo "\$ $cmd"
  service lvm-agent bash -c "set -a && . /etc/lvm-agent/lvm-agent.env && set +a && exec $cmd"
  capacity() { kubectl get node "$(hostname)" -o jsonpath='{.metadata.annotations.csi\.alibabacloud\.com/storage-topology}'; }
  within 300 "capacity on the Node from the host agent" has capacity
  show capacity
}

# The test's own Pods: busybox's sh as PID 1 ignores SIGTERM unless it traps
# it, and each delete would wait out the 30 s grace period; this one exits.
pod_yaml() { # pod_yaml NAME COMMAND [CLAIM [LABEL [Block|emptyDir]]]: a busybox Pod with PVC CLAIM at /data (Block: /dev/xvda)
  local use="volumeMounts: [{name: data, mountPath: /data}]" vol="persistentVolumeClaim: {claimName: ${3:-data}}"
  case ${5:-} in
    Block) use="volumeDevices: [{name: data, devicePath: /dev/xvda}]" ;;
    emptyDir) vol="emptyDir: {}" ;;
  esac
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
      command: ["sh", "-c", "trap 'exit 0' TERM; $2; sleep 3600 & wait"]
      $use
  volumes: [{name: data, $vol}]
YAML
}
pvc_yaml() { # pvc_yaml NAME SIZE [CLASS [MODE [LABEL [SOURCE]]]]: SOURCE, a claim to clone
  local source=${6:+"dataSource: {kind: PersistentVolumeClaim, name: $6}"}
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
  $source
YAML
}
volumes() { lvm lvs --noheadings -S 'lv_name!=pool0' "$@" vg1; } # vg1's LVs but the thin pool
storage_class() { # storage_class NAME VOLUME_GROUP FS [RECLAIM]: a class of lvm-agent's provisioner that may grow
  kubectl apply -f - <<YAML
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $1}
provisioner: lvm.lvm-agent.io
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
reclaimPolicy: ${4:-Delete}
parameters: {volumeGroup: $2, fsType: $3}
YAML
}
# cpu_table: where the guest's CPU went, to look for what to cut (make
# test's budget): CPU seconds since boot per process name, with the children
# it reaped (bash's: the kubectl runs of these scripts; lvmd's: its lvm
# commands), the top 15.
cpu_table() {
  step "CPU seconds since boot per process name, with the children it reaped: the top 15"
  # /proc/PID/stat: (comm), then utime, stime, cutime, cstime are the
  # 14th to 17th fields; clock ticks of 100 Hz (busybox has no getconf).
  # A process that ends between the glob and its read fails cat, and with
  # pipefail the step (a cold .ci/run failed there, after every check).
  { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk '{ c = $2; sub(/^.*\) /, ""); t[c] += ($12 + $13 + $14 + $15) / 100 }
    END { for (c in t) printf "%10.1f %s\n", t[c], c }' | sort -rn | awk 'NR <= 15'
}
within() { # within SECONDS WHAT COMMAND...: COMMAND succeeds before the deadline
  local end=$((SECONDS + $1)) what=$2
  shift 2
  until "$@"; do
    [ $SECONDS -lt $end ] || { echo "node: no $what within the deadline"; return 1; }
    sleep 1
  done
}

# bench: PVC created -> Pod Running, $runs times after one warm-up run (which
# also proves the watches below are live), each run waiting for the last
# one's PV to go. Boundaries, all on the guest's clock:
#   w:  what a `kubectl get -w` of PVCs, PVs and Pods saw first, stamped with
#       bash's $EPOCHREALTIME as the line arrived (the same watch lag on both
#       sides of each difference);
#   a:  the agent's own klog line "Volume request done" (µs) and its duration;
#   l:  lvmd's log line "created a new LV", as containerd stamped it (ns;
#       lvmd's own stamps have whole seconds);
#   k:  kubelet's klog line "MountVolume.MountDevice succeeded" (µs).
#   schedule   w PVC created -> w PVC has volume.kubernetes.io/selected-node
#   request    w selected-node -> w lifecycle=creating (the provisioner's request)
#   agent      a start (done - duration) -> a done (lvmd calls and the answer's patch included)
#   lvmd       a start -> l created (the agent's checks before its CreateLV call included)
#   answer     w lifecycle=creating -> w lifecycle=created (the agent, seen from outside)
#   pv         w lifecycle=created -> w PV exists (the provisioner)
#   bind       w PV exists -> w Pod has spec.nodeName (PV controller, then the scheduler's bind)
#   mount      w Pod has spec.nodeName -> k MountDevice (kubelet: attach check, mkfs.ext4, mount)
#   start      k MountDevice -> w Pod Running (bind mount, sandbox, container)
#   total      w PVC created -> w Pod Running
# stamp: each line read, after the time it arrived.
stamp() { while IFS= read -r l; do printf '%s %s\n' "$EPOCHREALTIME" "$l"; done; }
# medians FILE LASTCOL: a row of the median of columns 2..LASTCOL of FILE's
# rows after its header (odd counts: the middle value); fails when a value
# is out of range: a missing boundary leaves its column as a difference from
# 0, never a figure. (v = $c + 0: after gsub a field is a string, and busybox
# awk compares strings.)
medians() {
  local col
  printf '%-8s' median
  for col in $(seq 2 "$2"); do
    printf ' %8s' "$(tail -n +2 "$1" | awk -v c="$col" '{ gsub(/%/, "", $c); print $c }' | sort -n |
      awk '{ a[NR] = $1 } END { if (NR % 2) print a[(NR + 1) / 2]; else printf "%.3f", (a[NR / 2] + a[NR / 2 + 1]) / 2 }')"
  done
  echo
  if awk -v last="$2" 'NR > 1 { for (c = 2; c <= last; c++) { gsub(/%/, "", $c); v = $c + 0; if (v < 0 || v > 3600) bad = 1 } } END { exit !bad }' "$1"; then
    echo "bench: a boundary is missing from the logs (see $(dirname "$1"))"
    return 1
  fi
}
bench() {
  local w=$CLUSTER_DIR/bench i watches
  mkdir -p "$w"
  step "Bench: PVC created -> Pod Running, median of $runs (after one warm-up run)" \
    "Each boundary as defined in scripts/guest/node.sh's bench()."
  kubectl get pvc -l app=bench -w -o jsonpath='{"pvc "}{.metadata.name}{" "}{.status.phase}{" node="}{.metadata.annotations.volume\.kubernetes\.io/selected-node}{" state="}{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.lifecycle}{"\n"}' 2>"$w/pvc.err" > >(stamp >"$w/pvc.log") &
  watches=($!)
  kubectl get pv -w -o jsonpath='{"pv "}{.spec.claimRef.name}{" "}{.metadata.name}{"\n"}' 2>"$w/pv.err" > >(stamp >"$w/pv.log") &
  watches+=($!)
  kubectl get pod -l app=bench -w -o jsonpath='{"pod "}{.metadata.name}{" "}{.status.phase}{" node="}{.spec.nodeName}{"\n"}' 2>"$w/pod.err" > >(stamp >"$w/pod.log") &
  watches+=($!)
  for i in $(seq 0 "$runs"); do
    { pvc_yaml "bench-$i" 64Mi lvm-thick Filesystem bench; pod_yaml "bench-$i" true "bench-$i" bench; } | kubectl apply -f - >/dev/null
    kubectl wait --for=jsonpath='{.status.phase}'=Running "pod/bench-$i" --timeout=600s >/dev/null
    local pv
    pv=$(kubectl get pvc "bench-$i" -o jsonpath='{.spec.volumeName}')
    kubectl delete pod "bench-$i" --wait >/dev/null
    kubectl delete pvc "bench-$i" --wait >/dev/null
    kubectl wait --for=delete "pv/$pv" --timeout=600s >/dev/null
    echo "bench: run $i done ($((SECONDS - t0)) s)"
    [ "$i" -gt 0 ] || for f in pvc pv pod; do # the warm-up run proves each watch is live
      [ -s "$w/$f.log" ] || { echo "bench: the $f watch saw nothing: $(cat "$w/$f.err")"; return 1; }
    done
  done
  kill "${watches[@]}" 2>/dev/null || true
  sleep 1 # the stamps' last lines
  kubectl -n lvm-agent logs ds/lvm-agent -c lvm-agent >"$w/agent.log"
  kubectl -n lvm-agent logs ds/lvm-agent -c lvmd --timestamps >"$w/lvmd.log"
  cat "$w"/pvc.log "$w"/pv.log "$w"/pod.log | sort -n >"$w/watch.log"
  ! grep -q ' /share ' /proc/mounts || cp -r "$w" /share/bench
  # Every time as seconds since midnight (UTC; a run never spans midnight).
  awk -v runs="$runs" '
    function klog(s) { return substr(s, 7, 2) * 3600 + substr(s, 10, 2) * 60 + substr(s, 13) }
    function dur(s) { # a Go duration: 1.5s, 850.2ms, 900µs, 1m2.5s
      if (s ~ /ms$/) return substr(s, 1, length(s) - 2) / 1000
      if (s ~ /(µs|us)$/) { sub(/(µs|us)$/, "", s); return s / 1e6 }
      if (s ~ /m/) { split(s, p, "m"); return p[1] * 60 + substr(p[2], 1, length(p[2]) - 1) }
      return substr(s, 1, length(s) - 1)
    }
    function first(k, t) { if (!(k in T)) T[k] = t }
    FILENAME ~ /watch.log$/ {
      t = $1 % 86400; n = $3
      if ($2 == "pvc") { first(n " created", t); if ($0 ~ /node=[^ ]/) first(n " selected", t)
        if ($0 ~ /state=creating/) first(n " creating", t); if ($0 ~ /state=created/) first(n " created_ann", t) }
      if ($2 == "pv" && n != "") { first(n " pv", t); LV[$4] = n }
      if ($2 == "pod") { if ($0 ~ /node=[^ ]/) first(n " node", t); if ($4 == "Running") first(n " running", t) }
      next
    }
    FILENAME ~ /agent.log$/ && /"Volume request done"/ && /state="created"/ {
      if (match($0, /\/bench-[0-9]+"/)) { n = substr($0, RSTART + 1, RLENGTH - 2)
        match($0, /duration="[^"]+"/); d = dur(substr($0, RSTART + 10, RLENGTH - 11))
        first(n " agent_done", klog($1 " " $2)); first(n " agent_start", klog($1 " " $2) - d) }
      next
    }
    FILENAME ~ /lvmd.log$/ && /created a new LV/ { # containerd stamps each line it reads (ns)
      split(substr($1, index($1, "T") + 1), p, ":")
      for (lv in LV) if (index($0, "\"" lv "\"")) first(LV[lv] " lvmd", p[1] * 3600 + p[2] * 60 + p[3])
      next
    }
    FILENAME ~ /kubelet.log$/ && /MountVolume.MountDevice succeeded/ {
      if (match($0, /pod="default\/bench-[0-9]+"/)) first(substr($0, RSTART + 13, RLENGTH - 14) " mount", klog($1 " " $2))
      next
    }
    END {
      split("schedule request agent lvmd answer pv bind mount start total", M, " ")
      printf "%-8s", "run"; for (m = 1; m <= 10; m++) printf " %8s", M[m]; printf " %8s\n", "agent%"
      for (i = 1; i <= runs; i++) { n = "bench-" i
        v[1] = T[n " selected"] - T[n " created"]; v[2] = T[n " creating"] - T[n " selected"]
        v[3] = T[n " agent_done"] - T[n " agent_start"]; v[4] = T[n " lvmd"] - T[n " agent_start"]
        v[5] = T[n " created_ann"] - T[n " creating"]; v[6] = T[n " pv"] - T[n " created_ann"]
        v[7] = T[n " node"] - T[n " pv"]; v[8] = T[n " mount"] - T[n " node"]
        v[9] = T[n " running"] - T[n " mount"]; v[10] = T[n " running"] - T[n " created"]
        printf "%-8s", n; for (m = 1; m <= 10; m++) printf " %8.3f", v[m]; printf " %7.1f%%\n", (v[10] > 0 ? 100 * v[3] / v[10] : -1) # parenthesised: a bare > would redirect
      }
    }' "$w/watch.log" "$w/agent.log" "$w/lvmd.log" "$CLUSTER_DIR/logs/kubelet.log" | tee "$w/runs.txt"
  medians "$w/runs.txt" 12 || return 1
  step "bench: OK"
}

if [ -n "$vg_device" ]; then
  step "LVM on the node: vg1 on its own disk, $vg_device, with a thin pool vg1/pool0" \
    "deploy/overlays/clones' lvmd config names the volume group vg1 and the thin pool; lvmd will make LVs in them." \
    "The disk is a sparse file on the host: a node booted again on it finds its LVs, activated by lvm2 at boot."
else
  step "LVM on the node: vg1 on a 2 GiB sparse loop file, with a thin pool vg1/pool0" \
    "deploy/overlays/clones' lvmd config names the volume group vg1 and the thin pool; lvmd will make LVs in them."
fi
# The thin pool is the operator's (lvmd's config names it); lvmd's sidecar
# has its own config, so none is written here.
LVM_VG=vg1 LVM_THIN_POOL_SIZE=256M LVMD_CONFIG='' LVM_LOOP_SIZE=2G LVM_DEVICE=$vg_device setup-lvm.sh
show lvm lvs vg1
# powercut: the cluster's state on vg1 before the cluster starts
[ "$mode" != powercut ] || { . "$here/powercut-cluster.sh"; pc_state; }

step "A one-node Kubernetes cluster, every part real" \
  "etcd, kube-apiserver, controller-manager, scheduler, containerd, kubelet, kube-proxy (scripts/guest/cluster.sh)." \
  "kubelet syncs each Pod every minute (its default), as users run it: an online grow's filesystem is grown at once because the provisioner nudges kubelet (an annotation on the Pod)."
cluster.sh --bin "$bin" up
show kubectl get nodes -o wide
# powercut's second boot: nothing installed again, all must come back by itself
[ "$mode" != powercut ] || [ "$phase" != check ] || { pc_check; exit 0; }

if [ "$mode" = peers ]; then
  step "Bench: lvm-agent beside TopoLVM (scripts/guest/peers.sh; docs/bench-peers.md says what each row measures)"
  # shellcheck disable=SC2086 # --peers: one argument per word
  peers.sh --bin "$bin" $peers
  step "peers: OK"
  exit 0
fi

# The guest's stories in Go (integration/stories: lvm-stories STORY...).
stories() { step_time; lvm-stories -clock $((SECONDS - t0)) -deploy "$bin/deploy" -install "$install" "$@"; }
[ "$mode" != full ] || stories cluster # before lvm-agent
if [ "$install" = helm ]; then
  step "Install lvm-agent as a user would: helm install" \
    "charts/lvm-agent with this guest's image names and pullPolicy Never, and clones on (agent.thickClones, lvmd's" \
    "thin class in vg1/pool0: what deploy/overlays/guest sets)." \
    "It makes the lvm-agent DaemonSet (the agent and topolvm's lvmd on each node) and the provisioner Deployment."
  sed -n '/^device-classes:/,$p' "$bin/deploy/overlays/clones/lvmd.yaml" | sed 's/^/    /' |
    cat <(printf 'agent:\n  thickClones: true\nlvmd:\n  config:\n') - >"$CLUSTER_DIR/clones.values.yaml"
  show cat "$CLUSTER_DIR/clones.values.yaml"
  show helm install lvm-agent "$bin/charts/lvm-agent" -n lvm-agent --create-namespace -f "$CLUSTER_DIR/clones.values.yaml" \
    --set image.repository=localhost/lvm-agent/lvm-agent --set image.tag=guest --set image.pullPolicy=Never \
    --set lvmd.image.repository=localhost/lvm-agent/lvmd --set lvmd.image.tag=guest --set lvmd.image.pullPolicy=Never
elif [ "$install" = host-lvmd ] || [ "$install" = systemd ]; then
  host_install
else
  step "Install lvm-agent as a user would: kubectl apply -k" \
    "deploy/overlays/guest is deploy/base with this guest's image names and imagePullPolicy: Never." \
    "It makes the lvm-agent DaemonSet (the agent and topolvm's lvmd on each node) and the provisioner Deployment."
  show kubectl apply -k "$bin/deploy/overlays/guest"
fi
[ "$install" = systemd ] || show kubectl -n lvm-agent rollout status daemonset/lvm-agent --timeout=600s
show kubectl -n lvm-agent rollout status deployment/lvm-agent-provisioner --timeout=600s
show kubectl -n lvm-agent get pods -o wide
echo "    The agent reports the node's volume groups, their size and free space, on the Node:"
show kubectl get node "$(hostname)" -o jsonpath='{.metadata.annotations.csi\.alibabacloud\.com/storage-topology}{"\n"}'
[ "$mode" != faults ] || { stories -faults "$faults" faults; step "faults: OK"; exit 0; }
[ "$mode" != powercut ] || { pc_write; exit 1; } # pc_write ends in the power cut
[ "$mode" != stories ] || { read -ra only <<<"$only"; stories "${only[@]}"; step "stories: OK"; exit 0; }
[ "$mode" != bench ] || {
  step "Bench: the agent at --v=2, which logs each request's lvmd calls with their times (the growth rows read them)"
  show kubectl -n lvm-agent patch daemonset lvm-agent --type json -p '[{"op":"test","path":"/spec/template/spec/containers/0/name","value":"lvm-agent"},{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--v=2"}]'
  show kubectl -n lvm-agent rollout status daemonset/lvm-agent --timeout=600s
  show kubectl apply -f "$bin/deploy/examples/storageclass-thick.yaml" # every bench's thick class
  case ",$benches," in *,create,*) bench ;; esac
  case ",$benches," in *,grow,*) . "$here/bench-grow.sh"; bench_grow ;; esac
  case ",$benches," in *,clone,*) . "$here/bench-clone.sh"; bench_clone ;; esac
  cpu_table
  exit 0
}

if [ "$mode" = demo ]; then
  stories demo grow clone
  step "demo: OK" "Next: README.md's 'Storage for a Pod' for a real cluster; make test runs the full scenario (scripts/guest/node.sh --mode full)."
  exit 0
fi
stories demo grow clone wipe crypt full
cpu_table
step "node: OK"
