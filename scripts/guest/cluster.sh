#!/usr/bin/env bash
# A real one-node Kubernetes cluster inside the guest, every part real: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, containerd (runc,
# the CNI bridge plugin), kubelet and kube-proxy (nftables mode), with
# authentication and RBAC on. The images come from tarballs
# (scripts/vm/images.sh) imported into containerd: nothing is pulled.
#
#   cluster.sh [--bin DIR] up      start it all, import the images, wait for the Node to be Ready
#   cluster.sh [--bin DIR] down    stop it all
#   cluster.sh restart NAME [SIG]  NAME (kubelet, containerd, kube-apiserver...)
#                                  killed with SIG (KILL), then started again
#                                  with its own command line, as a node's
#                                  service manager does (Restart=always)
#
#   --bin DIR  the binaries of scripts/vm/guest-files.sh (/opt/lvm-agent), with images/ in it
# Settings (environment):
#   CLUSTER_DIR   state, logs and kubeconfigs (/var/lib/lvm-agent-cluster); the
#                 admin kubeconfig is $CLUSTER_DIR/pki/admin.conf
#   CLUSTER_WAIT  seconds each wait may take (600: TCG on a busy host)
#   CLUSTER_ETCD_FSYNC  1: etcd fsyncs its log, as a real node's must to
#                 survive a power cut (make test-faults' power-cut-cluster,
#                 whose state is on a disk); default 0, --unsafe-no-fsync,
#                 for state in RAM, which a reboot loses anyway
# State already in DIR and /var/lib/{etcd,kubelet,containerd} (a node booted
# again on its disk) is reused: the same PKI, etcd's data, the images.
# The node is the guest's hostname; it has no network card, so its address is
# on a dummy interface: pods reach the API server through the `kubernetes`
# Service's ClusterIP (10.96.0.1), which kube-proxy maps to that address.
set -euo pipefail

bin=/opt/lvm-agent
[ "${1:-}" != --bin ] || { bin=$2; shift 2; }
DIR=${CLUSTER_DIR:-/var/lib/lvm-agent-cluster}
WAIT=${CLUSTER_WAIT:-600}
NODE=$(hostname)
NODE_IP=192.168.222.2
POD_CIDR=10.88.0.0/24
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1 # the kubernetes Service's ClusterIP, the first of SERVICE_CIDR
PKI=$DIR/pki
LOGS=$DIR/logs
export PATH=$bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin
export KUBECONFIG=$PKI/admin.conf

log() { printf 'cluster: [%3d s] %s\n' "$SECONDS" "$*" >&2; }

# daemon NAME ARGS...: NAME runs in the background, its output in $LOGS/NAME.log
# (its command line in $DIR/NAME.cmd, for restart).
daemon() {
  local name=$1
  shift
  printf '%s\0' "$@" >"$DIR/$name.cmd"
  setsid "$@" </dev/null >>"$LOGS/$name.log" 2>&1 &
  echo $! >"$DIR/$name.pid"
}

# restart NAME SIG: the fault and the service manager's answer to it. Exits
# once the new process runs, not once it serves.
restart() {
  local name=$1 sig=$2 pid cmd
  pid=$(cat "$DIR/$name.pid")
  kill -"$sig" "$pid"
  # Gone, or a zombie (its parent, the guest's init, may not reap it).
  while [ -e "/proc/$pid" ] && [ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" != Z ]; do sleep 0.1; done
  mapfile -d '' -t cmd <"$DIR/$name.cmd"
  daemon "$name" "${cmd[@]}"
  log "$name: PID $pid killed (SIG$sig), started again as PID $(cat "$DIR/$name.pid")"
}

# until_ok WHAT COMMAND...: COMMAND succeeds within $WAIT s (each try at most
# 30 s), or the last lines of every log. Each try of a kubectl costs about a
# second of the guest's CPU under TCG, which the starting control plane
# needs: a cheap probe (a port) goes first, and a wait that kubectl can do
# as one watch is one `kubectl wait` (waited below).
until_ok() {
  local what=$1 deadline=$((SECONDS + WAIT))
  shift
  while [ $SECONDS -lt $deadline ]; do
    timeout 30 "$@" >/dev/null 2>&1 && { log "$what"; return; }
    sleep 0.5
  done
  failed "$what"
}
failed() {
  log "FAILED: not $1 within $WAIT s"
  for f in "$LOGS"/*.log; do echo "--- $f" >&2; tail -n 15 "$f" >&2; done
  return 1
}
# waited WHAT KIND/NAME CONDITION [KUBECTL-ARGS...]: KIND/NAME exists, then
# has CONDITION ('': existing is enough), within $WAIT s; each a kubectl wait
# (a watch), not a poll.
waited() {
  local what=$1 obj=$2 cond=$3 deadline=$((SECONDS + WAIT))
  shift 3
  kubectl wait "$@" --for=create "$obj" --timeout="${WAIT}s" >/dev/null 2>&1 &&
    { [ -z "$cond" ] || kubectl wait "$@" "--for=$cond" "$obj" --timeout="$((deadline - SECONDS))s" >/dev/null 2>&1; } &&
    { log "$what"; return; }
  failed "$what"
}

network() {
  # The node's address; the API server advertises it as the kubernetes Service's endpoint.
  ip link add eth0 type dummy
  ip addr add "$NODE_IP/24" dev eth0
  ip link set eth0 up
  echo 1 >/proc/sys/net/ipv4/ip_forward
  echo 1 >/proc/sys/net/bridge/bridge-nf-call-iptables
  : >>/etc/resolv.conf # kubelet gives pods the node's (empty) resolver configuration
  # kubelet reports the node's machine ID (cAdvisor reads it).
  [ -s /etc/machine-id ] || tr -d - </proc/sys/kernel/random/uuid >/etc/machine-id
  mkdir -p /etc/cni/net.d
  cat >/etc/cni/net.d/10-bridge.conflist <<EOF
{"cniVersion": "1.0.0", "name": "guest", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
}

filesystems() {
  grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts || mount -t cgroup2 cgroup2 /sys/fs/cgroup
  # overlayfs wants a real upper file system, and kubelet reports the
  # capacity of the file systems its and containerd's state live on.
  local d
  for d in /var/lib/containerd /var/lib/kubelet /var/lib/etcd; do
    mkdir -p "$d"
    grep -q " $d " /proc/mounts || mount -t tmpfs tmpfs "$d"
  done
  # / stays private. Containers enter their root without pivot_root here
  # (NoPivotRoot, below), and one with a Bidirectional volume (a CSI node
  # plugin's: TopoLVM's in make bench-peers) gets an rshared root: with /
  # shared, its root moved over its own / propagated to the node's, which
  # then had the container's files and no /proc. Bidirectional volumes
  # need only kubelet's directory shared (containerd refuses one whose
  # source is not on a shared mount: "path /var/lib/kubelet/pods/ is
  # mounted on /var/lib/kubelet but it is not a shared mount").
  mount --make-rprivate / 2>/dev/null || true
  mount --make-rshared /var/lib/kubelet
}

containerd_up() {
  mkdir -p /etc/containerd
  # The guest's root is the initramfs, where pivot_root cannot work: runc
  # enters each container's root with chroot-like MS_MOVE instead.
  cat >/etc/containerd/config.toml <<EOF
version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "localhost/lvm-agent/pause:guest"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  NoPivotRoot = true
  SystemdCgroup = false
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "/etc/cni/net.d"
EOF
  daemon containerd containerd --config /etc/containerd/config.toml
  until_ok "containerd is serving" ctr version
}

# images: import the image tarballs into containerd (up runs it in the
# background, meanwhile the API server starts).
images() {
  local t n
  # Imported before on this state (a node booted again): containerd still
  # has them, and each import costs seconds of the guest's CPU.
  n=$(cat "$DIR/images.imported" 2>/dev/null || echo 0)
  if [ "$n" -gt 0 ] && [ "$(ctr -n k8s.io images ls -q | grep -c localhost/)" -ge "$n" ]; then
    log "images reused: $n already in containerd"
    return
  fi
  for t in "$bin"/images/*.tar; do
    case $t in *-arm64.tar) continue ;; esac # the guest is amd64
    ctr -n k8s.io images import --local "$t" >>"$LOGS/images.log" 2>&1 || ctr -n k8s.io images import "$t" >>"$LOGS/images.log" 2>&1 || return
  done
  log "images imported: $(ctr -n k8s.io images ls -q | grep -c localhost/) ($(ctr -n k8s.io images ls -q | grep localhost/ | paste -sd' '))"
  ctr -n k8s.io images ls -q | grep -c localhost/ >"$DIR/images.imported"
}

# pki: what the cluster needs to run with authentication and authorization
# on, as a real cluster does, made with openssl (Debian's OpenSSL 3): a CA,
# the API server's serving certificate (valid for the node's address and for
# the `kubernetes` Service's ClusterIP, which pods dial), a client certificate
# for the API server to reach kubelet, the service-account signing key (the
# API server reads its public half from the same file), and a kubeconfig per
# component whose groups are the ones Kubernetes' bootstrap RBAC and Node
# authorizer grant. ECDSA P-256 keys; client and serving certificates valid
# for a year.
pki() {
  mkdir -p "$PKI"
  chmod 700 "$PKI"
  pki_reused && return
  local cnf=$PKI/openssl.cnf
  printf '%s\n' '[req]' 'distinguished_name = dn' '[dn]' \
    '[ca]' 'basicConstraints = critical,CA:TRUE' \
    'keyUsage = critical,digitalSignature,keyEncipherment,keyCertSign' 'subjectKeyIdentifier = hash' \
    '[server]' 'basicConstraints = critical,CA:FALSE' 'keyUsage = critical,digitalSignature,keyEncipherment' \
    'extendedKeyUsage = serverAuth' 'authorityKeyIdentifier = keyid' \
    "subjectAltName = IP:$NODE_IP,IP:$SERVICE_IP,IP:127.0.0.1,DNS:$NODE,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
    '[client]' 'basicConstraints = critical,CA:FALSE' 'keyUsage = critical,digitalSignature,keyEncipherment' \
    'extendedKeyUsage = clientAuth' 'authorityKeyIdentifier = keyid' >"$cnf"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -noenc)
  openssl req -config "$cnf" -x509 "${ec[@]}" -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
    -subj /CN=lvm-agent-guest-ca -days 3650 -extensions ca 2>/dev/null
  # SEC1 ("EC PRIVATE KEY"): the only EC form the API server reads a public key from.
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key"
  # NAME EXTENSIONS SUBJECT: NAME.key and NAME.crt, signed by the CA (a
  # random serial), in one openssl run each (a run costs ~0.1 s under TCG);
  # a client's NAME.conf too, a small fixed document written here: four
  # kubectl runs per file would cost seconds under TCG.
  local name ext subj
  while read -r name ext subj; do
    openssl req -config "$cnf" -x509 -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" "${ec[@]}" \
      -keyout "$PKI/$name.key" -out "$PKI/$name.crt" -subj "$subj" -days 365 -extensions "$ext" 2>/dev/null
    if [ "$ext" != client ] || [ "$name" = apiserver-kubelet-client ]; then continue; fi
    printf '%s\n' 'apiVersion: v1' 'kind: Config' 'clusters:' '- name: guest' \
      "  cluster: {server: \"https://$NODE_IP:6443\", certificate-authority: \"$PKI/ca.crt\"}" \
      'users:' "- name: $name" "  user: {client-certificate: \"$PKI/$name.crt\", client-key: \"$PKI/$name.key\"}" \
      'contexts:' '- name: guest' "  context: {cluster: guest, user: $name}" 'current-context: guest' >"$PKI/$name.conf"
  done <<END
apiserver server /CN=kube-apiserver
apiserver-kubelet-client client /O=system:masters/CN=kube-apiserver-kubelet-client
admin client /O=system:masters/CN=kubernetes-admin
kubelet client /O=system:nodes/CN=system:node:$NODE
scheduler client /CN=system:kube-scheduler
controller-manager client /CN=system:kube-controller-manager
kube-proxy client /CN=system:kube-proxy
END
  chmod 600 "$PKI"/*
  log "PKI and kubeconfigs in $PKI (API server https://$NODE_IP:6443)"
}

# pki_reused: a node booted again on its state keeps its CA, keys and
# kubeconfigs (the kubelet's and the service accounts' tokens must still be
# good); made again only when one is missing.
pki_reused() {
  local f
  for f in ca.crt ca.key sa.key apiserver.crt apiserver.key apiserver-kubelet-client.crt \
    apiserver-kubelet-client.key admin.conf kubelet.conf scheduler.conf controller-manager.conf kube-proxy.conf; do
    [ -s "$PKI/$f" ] || return 1
  done
  log "PKI and kubeconfigs in $PKI reused (API server https://$NODE_IP:6443)"
}

control_plane_up() {
  local fsync=--unsafe-no-fsync
  [ "${CLUSTER_ETCD_FSYNC:-0}" != 1 ] || fsync=
  daemon etcd etcd --data-dir /var/lib/etcd ${fsync:+"$fsync"} \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster default=http://127.0.0.1:2380
  daemon kube-apiserver kube-apiserver --etcd-servers http://127.0.0.1:2379 \
    --bind-address 0.0.0.0 --secure-port 6443 --advertise-address "$NODE_IP" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.key" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true
}

controllers_up() {
  daemon kube-controller-manager kube-controller-manager \
    --kubeconfig "$PKI/controller-manager.conf" \
    --authentication-kubeconfig "$PKI/controller-manager.conf" \
    --authorization-kubeconfig "$PKI/controller-manager.conf" \
    --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
    --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key"
  daemon kube-scheduler kube-scheduler --kubeconfig "$PKI/scheduler.conf" \
    --authentication-kubeconfig "$PKI/scheduler.conf" \
    --authorization-kubeconfig "$PKI/scheduler.conf" \
    --bind-address 127.0.0.1 --leader-elect=false
  cat >"$DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $PKI/kube-proxy.conf}
mode: nftables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE
conntrack: {maxPerCore: 0}
EOF
  daemon kube-proxy kube-proxy --config "$DIR/kube-proxy.yaml"
}

# node_up: kubelet, which waits for the API server itself (the
# controller-manager gives up on one not up within seconds, and kube-proxy
# would guess the node's address).
node_up() {
  cat >"$DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
resolvConf: /etc/resolv.conf
# All in RAM: keep eviction from acting on the guest's small file systems.
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
# KUBELET_SYNC_FREQUENCY: how often kubelet syncs each Pod (its default 1m);
# an online grow's filesystem is grown at that sync (node.sh sets it).
syncFrequency: ${KUBELET_SYNC_FREQUENCY:-1m}
EOF
  daemon kubelet kubelet --config "$DIR/kubelet.yaml" --kubeconfig "$PKI/kubelet.conf" \
    --node-ip "$NODE_IP" --hostname-override "$NODE"
}

up() {
  mkdir -p "$DIR" "$LOGS"
  network
  filesystems
  pki
  log "starting etcd and kube-apiserver (TCG: 1-2 min until ready); containerd, the images and kubelet meanwhile"
  control_plane_up
  containerd_up
  images &
  local imports=$!
  node_up
  # (until_ok runs a command through timeout: a program, never a shell function.)
  until_ok "the API server listens" bash -c 'exec 3<>/dev/tcp/127.0.0.1/6443'
  until_ok "the API server is ready" kubectl get --raw /readyz
  controllers_up
  waited "node $NODE is Ready" "node/$NODE" condition=Ready
  # Pods reach the API server through the kubernetes Service (kube-proxy's
  # rules) and get a service account (the controller-manager's).
  until_ok "kube-proxy serves the kubernetes Service" nft list table ip kube-proxy
  waited "namespace default has its service account" serviceaccount/default '' -n default
  wait "$imports" || { log "FAILED: the images were not imported (see $LOGS/images.log)"; return 1; }
}

down() {
  local n pid
  for n in kube-proxy kubelet kube-scheduler kube-controller-manager containerd kube-apiserver etcd; do
    pid=$(cat "$DIR/$n.pid" 2>/dev/null) || continue
    kill "$pid" 2>/dev/null || true
  done
  log "stopped"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  restart) mkdir -p "$LOGS" && restart "${2:?usage: cluster.sh restart NAME [SIG]}" "${3:-KILL}" ;;
  *) sed -n '2,28s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
