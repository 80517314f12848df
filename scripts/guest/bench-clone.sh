# Sourced by node.sh in bench mode, after bench_grow, with its helpers:
# issue 27's figures, all on the guest's clock.
#   thick  a 256 MiB Block volume filled with random bytes by a Pod that is
#          then deleted; then three times: a thick clone of it (a claim
#          without a Pod: the provisioner places it on the source's node),
#          copied by the agent (its "Clone copied and verified" line: the
#          copy until the last chunk is written, then the flush and the
#          read-back check), compared byte for byte, and then, on the node,
#          with the page cache dropped, `dd if=SRC of=DST bs=4M oflag=direct`
#          over the same two LVs. Each pair's rates, and the medians. Both
#          copies run on a node at rest: the bench holds the source open
#          (the clone waits, SourceInUse) until the clone's creation has
#          settled, then lets it go, and the agent copies at its next look
#          (--wait-poll); the disk was written whole beforehand
#          (scripts/vm/node.sh), so neither writes where the host's sparse
#          file has no block yet.
#   thin   PVC created -> Pod Running (kubectl apply -> kubectl wait), a
#          plain thin PVC and a thin clone of a 64 MiB thin volume whose Pod
#          runs, alternately, $runs of each; the medians.
# shellcheck shell=bash
: "${runs?}" # node.sh's --runs, read here
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }'; } # since T0: seconds
bench_clone() {
  local w=$CLUSTER_DIR/bench-clone i c0 dd_s pvs pv_list src dst line row kind start=$SECONDS
  mkdir -p "$w"
  step "Bench: a thick clone's copy beside dd's on the same LVs; a thin clone's PVC -> Pod Running beside a plain thin PVC's ($runs each)"
  storage_class lvm-thin-ext4 thin ext4 # thin LVs in vg1/pool0 (lvmd's class "thin")
  { pvc_yaml bsrc 256Mi lvm-thick Block benchclone
    pod_yaml bsrc 'dd if=/dev/urandom of=/dev/xvda bs=4M count=64 && sync && echo filled' bsrc benchclone Block
  } | kubectl apply -f - >/dev/null
  kubectl wait --for=condition=Ready pod/bsrc --timeout=600s >/dev/null
  within 300 "the 256 MiB written in pod/bsrc" eval 'kubectl logs bsrc | grep -qx filled'
  kubectl delete pod bsrc --wait >/dev/null
  src=$(kubectl get pv "$(kubectl get pvc bsrc -o jsonpath='{.spec.volumeName}')" -o jsonpath='{.spec.local.path}')
  printf '%-8s %8s %8s %8s %8s\n' run copy-s verify-s dd-s ratio >"$w/thick.txt"
  for i in 1 2 3; do
    exec 7<"$src" # open: the agent must wait
    pvc_yaml "bcopy-$i" 256Mi lvm-thick Block benchclone bsrc | kubectl apply -f - >/dev/null
    within 300 "pvc/bcopy-$i waiting for its source (SourceInUse)" eval \
      "kubectl get events --field-selector involvedObject.name=bcopy-$i,reason=SourceInUse -o name | grep -q ."
    sleep 10
    exec 7<&-
    kubectl wait --for=jsonpath='{.status.phase}'=Bound "pvc/bcopy-$i" --timeout=900s >/dev/null
    dst=$(kubectl get pv "$(kubectl get pvc "bcopy-$i" -o jsonpath='{.spec.volumeName}')" -o jsonpath='{.spec.local.path}')
    cmp "$src" "$dst" # the agent's copy, byte for byte
    line=$(kubectl -n lvm-agent logs ds/lvm-agent -c lvm-agent | grep 'Clone copied and verified' | grep "default/bcopy-$i\"" | tail -n 1)
    echo "$line" >>"$w/agent.txt"
    sync && echo 3 >/proc/sys/vm/drop_caches
    c0=$EPOCHREALTIME
    dd if="$src" of="$dst" bs=4M oflag=direct 2>>"$w/dd.err"
    dd_s=$(since "$c0")
    awk -v line="$line" -v dd="$dd_s" -v run="copy-$i" '
      function dur(s) { # a Go duration: 1.5s, 850.2ms, 1m2.5s
        if (s ~ /ms$/) return substr(s, 1, length(s) - 2) / 1000
        if (s ~ /m[0-9.]+s$/) { split(s, p, "m"); return p[1] * 60 + substr(p[2], 1, length(p[2]) - 1) }
        return substr(s, 1, length(s) - 1)
      }
      function field(k,   r) { r = line; sub(".* " k "=\"?", "", r); sub("[\" ].*", "", r); return r }
      BEGIN { c = dur(field("copy")); printf "%-8s %8.3f %8.3f %8.3f %8.2f\n", run, c, dur(field("verify")), dd, dd / c }' >>"$w/thick.txt"
  done
  echo "Thick: a clone of 256 MiB, the agent's copy (s; then its flush and read-back check) beside dd bs=4M oflag=direct (s) over the same LVs; ratio: the agent's rate / dd's:"
  cat "$w/thick.txt"
  medians "$w/thick.txt" 5 | tee "$w/thick-median.txt" || return 1
  awk '{ printf "median rates: agent copy %.1f MiB/s, dd %.1f MiB/s: %.2f\n", 256 / $2, 256 / $4, $4 / $2 }' "$w/thick-median.txt"
  pvs=$(kubectl get pvc -l app=benchclone -o jsonpath='{range .items[*]}pv/{.spec.volumeName} {end}')
  kubectl delete pvc -l app=benchclone --wait >/dev/null
  read -ra pv_list <<<"$pvs" # one word per PV
  kubectl wait --for=delete "${pv_list[@]}" --timeout=600s >/dev/null

  { pvc_yaml tsrc 64Mi lvm-thin-ext4 Filesystem benchthin
    pod_yaml tsrc 'echo source >/data/file && sync /data/file' tsrc benchthin
  } | kubectl apply -f - >/dev/null
  kubectl wait --for=condition=Ready pod/tsrc --timeout=600s >/dev/null
  # One row per run, PVC created -> Pod Running in seconds; node.sh's medians.
  printf '%-8s %8s %8s\n' run plain clone >"$w/thin.txt"
  for i in $(seq 1 "$runs"); do
    row=("thin-$i")
    for kind in plain clone; do
      c0=$EPOCHREALTIME
      { pvc_yaml "t$kind-$i" 64Mi lvm-thin-ext4 Filesystem benchthin "$([ $kind = plain ] || echo tsrc)"
        pod_yaml "t$kind-$i" true "t$kind-$i" benchthin
      } | kubectl apply -f - >/dev/null
      kubectl wait --for=condition=Ready "pod/t$kind-$i" --timeout=600s >/dev/null
      row+=("$(since "$c0")")
      pvs=$(kubectl get pvc "t$kind-$i" -o jsonpath='pv/{.spec.volumeName}')
      kubectl delete pod "t$kind-$i" --wait >/dev/null
      kubectl delete pvc "t$kind-$i" --wait >/dev/null
      kubectl wait --for=delete "$pvs" --timeout=600s >/dev/null
    done
    printf '%-8s %8s %8s\n' "${row[@]}" >>"$w/thin.txt"
    echo "bench: thin run $i done ($((SECONDS - start)) s)"
  done
  [ "$(kubectl exec tsrc -- cat /data/file)" = source ]
  kubectl delete pod tsrc --wait >/dev/null
  kubectl delete pvc tsrc --wait >/dev/null
  ! grep -q ' /share ' /proc/mounts || cp -r "$w" /share/bench-clone
  echo "Thin: PVC created -> Pod Running (s), a plain thin PVC and a thin clone, alternately:"
  cat "$w/thin.txt"
  medians "$w/thin.txt" 3 | tee "$w/thin-median.txt" || return 1
  awk '{ printf "clone / plain: %.2f\n", $3 / $2 }' "$w/thin-median.txt"
  step "bench clone: OK"
}
