#!/usr/bin/env bash
# `make test`: every step of the README's test command, each timed, and at
# the end (also when a step failed, or on Ctrl-C) a table of every step's
# wall time, the host's CPU use during it, and the builds and parts inside it
# (the rows the scripts report through scripts/times.sh).
#
#   scripts/test.sh [STEP...]   (default: all of them, in this order)
#
#   vet          go vet (plain and -tags guest) and gofmt
#   unit         go test of every package but integration/ (a fuzz target's
#                seed corpus replays here: that is what make test fuzzes;
#                make fuzz fuzzes for FUZZTIME per target)
#   integration  go test -v ./integration/... (a real etcd + kube-apiserver)
#   guest        the in-guest suite (make test-guest), then the one-node
#                cluster's full scenario (make test-node)
#   images       the images for both arches (make images)
#
# Every step runs even when one before it failed; the exit code is 0 only
# when every step passed.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
all=(vet unit integration guest images)
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=("${all[@]}")
for s in "${steps[@]}"; do
  case " ${all[*]} " in *" $s "*) ;; *) echo "test: unknown step $s (steps: ${all[*]})" >&2; exit 2 ;; esac
done

work=$(mktemp -d)
export LVM_AGENT_TIMES=$work/times # scripts/times.sh: "STEP<TAB>LABEL<TAB>SECONDS"
: >"$LVM_AGENT_TIMES"
t0=$SECONDS
rows=() # "step start wall cpu result"

# cpu: the host's busy jiffies and all jiffies so far (/proc/stat).
cpu() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }
ncpu=$(nproc)

# run STEP COMMAND...: COMMAND with LVM_AGENT_STEP=STEP, timed.
run() {
  local step=$1 start=$SECONDS rc=0 b0 a0 b1 a1
  shift
  read -r b0 a0 < <(cpu)
  printf '\n==> test: %s (at %d s; host load %s)\n' "$step" $((start - t0)) "$(cut -d' ' -f1-3 /proc/loadavg)"
  LVM_AGENT_STEP=$step "$@" || rc=$?
  read -r b1 a1 < <(cpu)
  local cpu_pct=$(((b1 - b0) * 100 * ncpu / (a1 - a0 > 0 ? a1 - a0 : 1)))
  rows+=("$step $((start - t0)) $((SECONDS - start)) $cpu_pct $([ $rc -eq 0 ] && echo ok || echo "FAIL($rc)")")
  printf '==> test: %s %s in %d s\n' "$step" "$([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)")" $((SECONDS - start))
  return $rc
}

table() {
  local r step start wall cpu_pct result
  echo
  echo "make test: step times (wall seconds; start: since make test began; cpu: host CPU busy, $ncpu cores = $((ncpu * 100))%)"
  printf '%-44s %6s %6s %5s  %s\n' step start wall cpu result
  for r in "${rows[@]}"; do
    read -r step start wall cpu_pct result <<<"$r"
    printf '%-44s %6d %6d %4d%%  %s\n' "$step" "$start" "$wall" "$cpu_pct" "$result"
    awk -F'\t' -v s="$step" '$1 == s { printf "  %-42s %6s %6d\n", $2, "", $3 }' "$LVM_AGENT_TIMES"
  done
  printf '%-44s %6s %6d\n' total '' $((SECONDS - t0))
}
trap 'table; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

vet() { make --no-print-directory vet; }
unit() { make --no-print-directory test-unit; }
integration() { make --no-print-directory test-integration; }
guest() { scripts/vm/test.sh; }
images() { make --no-print-directory images; }

failed=0
for s in "${steps[@]}"; do
  run "$s" "$s" || failed=1
done
exit $failed
