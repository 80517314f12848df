# Sourced by node.sh in bench mode, after bench(), with its helpers: a PVC
# patched from 64 MiB to 128 MiB -> the new size seen by the running Pod,
# $runs times after one warm-up run, each run's breakdown and the medians;
# then the same grow done by hand in the same guest (lvextend, resize2fs).
# Boundaries, all on the guest's clock (w, a, l as in node.sh's bench()):
#   resizer  w request raised -> w PV lifecycle=expanding (kube-controller-
#            manager's hand-over to lvm-agent's resizer, then the resizer)
#   agent    a start -> a done ("Volume request done", state expanded)
#   lvmd     the agent's lvmd calls for the grow, as the agent timed them
#            (its "Volume request done" line's steps: read, the LV's tags and
#            size; lvmdResize, ResizeLV with lvmd's own lookups and lvextend).
#            lvmd's log spans only part of that: it logs the request after
#            its lookups (vgs, lvs), seconds under TCG.
#   answer   w expanding -> w expanded (the agent, seen from outside)
#   pv       w expanded -> w PV capacity raised (the resizer)
#   kubelet  w PV capacity raised -> the Pod's "grown" line, stamped by
#            containerd (kubelet's next sync of the Pod and its resize2fs;
#            the Pod checks its filesystem's size every 50 ms)
#   total    w request raised -> the Pod's "grown" line
#   ours%    (resizer + agent - lvmd + pv) / total: lvm-agent's share, an
#            upper bound (resizer holds kube-controller-manager's hand-over)
# shellcheck shell=bash
: "${runs?}" "${t0?}" # node.sh's --runs and its start, read here
pod_log_is() { [ "$(kubectl logs "$1")" = "$2" ]; } # pod_log_is POD TEXT: POD's log is TEXT
bench_grow() {
  local w=$CLUSTER_DIR/bench-grow i pv watches
  mkdir -p "$w"
  step "Bench: PVC request raised -> the new size seen in the running Pod, median of $runs (after one warm-up run)" \
    "Each boundary as defined in scripts/guest/bench-grow.sh; then the same lvextend + resize2fs by hand."
  kubectl get pvc -l app=benchgrow -w -o jsonpath='{"pvc "}{.metadata.name}{" req="}{.spec.resources.requests.storage}{"\n"}' 2>"$w/pvc.err" > >(stamp >"$w/pvc.log") &
  watches=($!)
  kubectl get pv -w -o jsonpath='{"pv "}{.spec.claimRef.name}{" "}{.metadata.name}{" state="}{.metadata.annotations.pv\.csi\.alibabacloud\.com/volume\.lifecycle}{" cap="}{.spec.capacity.storage}{"\n"}' 2>"$w/pv.err" > >(stamp >"$w/pv.log") &
  watches+=($!)
  for i in $(seq 0 "$runs"); do
    # The Pod says "grown" once its filesystem's block count changes.
    { pvc_yaml "grow-$i" 64Mi lvm-thick Filesystem benchgrow
      # shellcheck disable=SC2016 # the Pod's shell expands them
      pod_yaml "grow-$i" 's0=$(stat -f -c %b /data); echo start; while [ $(stat -f -c %b /data) = $s0 ]; do sleep 0.05; done; echo grown' "grow-$i" benchgrow
    } | kubectl apply -f - >/dev/null
    kubectl wait --for=condition=Ready "pod/grow-$i" --timeout=600s >/dev/null
    within 60 "start in pod/grow-$i's log" pod_log_is "grow-$i" start
    kubectl patch pvc "grow-$i" -p '{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}' >/dev/null
    within 600 "grown in pod/grow-$i's log" eval 'kubectl logs grow-'"$i"' | grep -qx grown'
    kubectl logs "grow-$i" --timestamps | sed -n "s/ grown\$/ grow-$i/p" >>"$w/grown.log"
    pv=$(kubectl get pvc "grow-$i" -o jsonpath='{.spec.volumeName}')
    kubectl delete pod "grow-$i" --wait >/dev/null
    kubectl delete pvc "grow-$i" --wait >/dev/null
    kubectl wait --for=delete "pv/$pv" --timeout=600s >/dev/null
    echo "bench: grow run $i done ($((SECONDS - t0)) s)"
  done
  kill "${watches[@]}" 2>/dev/null || true
  sleep 1 # the stamps' last lines
  kubectl -n lvm-agent logs ds/lvm-agent -c lvm-agent >"$w/agent.log"
  kubectl -n lvm-agent logs ds/lvm-agent -c lvmd --timestamps >"$w/lvmd.log"
  cat "$w"/pvc.log "$w"/pv.log | sort -n >"$w/watch.log"
  ! grep -q ' /share ' /proc/mounts || cp -r "$w" /share/bench-grow
  awk -v runs="$runs" '
    function klog(s) { return substr(s, 7, 2) * 3600 + substr(s, 10, 2) * 60 + substr(s, 13) }
    function rfc(s) { split(substr(s, index(s, "T") + 1), p, ":"); return p[1] * 3600 + p[2] * 60 + p[3] }
    function dur(s) { # a Go duration: 1.5s, 850.2ms, 900µs
      if (s ~ /ms$/) return substr(s, 1, length(s) - 2) / 1000
      if (s ~ /(µs|us)$/) { sub(/(µs|us)$/, "", s); return s / 1e6 }
      return substr(s, 1, length(s) - 1)
    }
    function first(k, t) { if (!(k in T)) T[k] = t }
    FILENAME ~ /watch.log$/ {
      t = $1 % 86400
      if ($2 == "pvc" && $4 == "req=128Mi") first($3 " raised", t)
      if ($2 == "pv" && $3 ~ /^grow-/) { PV[$4] = $3; LV[$3] = $4
        if ($5 == "state=expanding") first($3 " expanding", t)
        if ($5 == "state=expanded") first($3 " expanded", t)
        if ($6 == "cap=128Mi") first($3 " pvcap", t) }
      next
    }
    FILENAME ~ /agent.log$/ && /"Volume request done"/ && /state="expanded"/ {
      if (match($0, /request="pv:[^"]+"/)) { n = PV[substr($0, RSTART + 12, RLENGTH - 13)]
        match($0, /duration="[^"]+"/); d = dur(substr($0, RSTART + 10, RLENGTH - 11))
        first(n " agent_done", klog($1 " " $2)); first(n " agent_start", klog($1 " " $2) - d)
        if (match($0, / read="[^"]+"/)) { r = dur(substr($0, RSTART + 7, RLENGTH - 8))
          if (match($0, /lvmdResize="[^"]+"/)) first(n " lvmd", r + dur(substr($0, RSTART + 12, RLENGTH - 13))) } }
      next
    }
    FILENAME ~ /grown.log$/ { first($2 " seen", rfc($1)) }
    END {
      split("resizer agent lvmd answer pv kubelet total", M, " ")
      printf "%-8s", "run"; for (m = 1; m <= 7; m++) printf " %8s", M[m]; printf " %8s\n", "ours%"
      for (i = 1; i <= runs; i++) { n = "grow-" i
        v[1] = T[n " expanding"] - T[n " raised"]; v[2] = T[n " agent_done"] - T[n " agent_start"]
        v[3] = T[n " lvmd"]; v[4] = T[n " expanded"] - T[n " expanding"]
        v[5] = T[n " pvcap"] - T[n " expanded"]; v[6] = T[n " seen"] - T[n " pvcap"]
        v[7] = T[n " seen"] - T[n " raised"]
        printf "%-8s", n; for (m = 1; m <= 7; m++) printf " %8.3f", v[m]
        printf " %7.1f%%\n", (v[7] > 0 ? 100 * (v[1] + v[2] - v[3] + v[5]) / v[7] : -1) # parenthesised: a bare > would redirect
      }
    }' "$w/watch.log" "$w/agent.log" "$w/grown.log" | tee "$w/runs.txt"
  medians "$w/runs.txt" 9 || return 1

  echo "    By hand in the same guest: an ext4 LV of 64 MiB, mounted, grown to 128 MiB (lvextend, then resize2fs):"
  mkdir -p /mnt/byhand
  printf '%-8s %8s %8s %8s\n' run lvextend resize2fs total >"$w/byhand.txt"
  for i in $(seq 1 "$runs"); do
    lvm lvcreate -q -y -n byhand -L 64m vg1 >/dev/null
    mkfs.ext4 -q /dev/vg1/byhand
    mount /dev/vg1/byhand /mnt/byhand
    local a b c
    a=$EPOCHREALTIME
    lvm lvextend -q -L 128m vg1/byhand >/dev/null
    b=$EPOCHREALTIME
    resize2fs /dev/vg1/byhand >/dev/null 2>&1
    c=$EPOCHREALTIME
    umount /mnt/byhand
    lvm lvremove -q -y vg1/byhand >/dev/null
    awk -v i="$i" -v a="$a" -v b="$b" -v c="$c" 'BEGIN { printf "hand-%-3s %8.3f %8.3f %8.3f\n", i, b - a, c - b, c - a }' >>"$w/byhand.txt"
  done
  cat "$w/byhand.txt"
  medians "$w/byhand.txt" 4 || return 1
  step "bench: OK"
}
