#!/usr/bin/env bash
# `make test`: every step of the README's test command, each timed, and at
# the end (also when a step failed, or on Ctrl-C) a table of every step's
# wall time, the host's CPU use during it, and the builds and parts inside it
# (the rows the scripts report through scripts/times.sh).
#
#   scripts/test.sh [STEP...]   (default: all of them, in this order)
#
#   vet          go vet (and -tags guest where the tag changes files), gofmt
#                and shellcheck (scripts/shellcheck.sh)
#   unit         go test of every package but integration/; each fuzz
#                target's seed corpus (testdata/fuzz and its f.Add seeds)
#                replays here: that is what make test fuzzes (make fuzz
#                fuzzes each target for FUZZTIME)
#   integration  every package of integration/ (a real etcd +
#                kube-apiserver...), side by side (scripts/integration.sh)
#   guest        ONE guest boot after the power cut's (builds): the check
#                of what the cut guest synced, the in-guest suite (real LVM,
#                lvmd, google/lvmd), then the one-node cluster's full
#                scenario with make test-faults' kills in one burst
#                (scripts/vm/test.sh, scripts/guest/test.sh)
#   images       the images for both arches (make images), niced: it only
#                fills the CPU the other steps leave idle
#
# The builds the guest step needs (Kubernetes, containerd, lvmd, Helm, the
# guest's binaries and image: the row "builds") start at once in the
# background: on a cold machine the builds are most of the time; warm, they
# are links. Kubernetes comes first, alone among the builds of Go packages it
# shares (the row "kubernetes", see kubernetes() below); then the images step
# starts in the background, and vet and the tests one after another beside
# the guest step, which starts as soon as the builds are done (their output
# is shown after the guest's). Every step runs even when one before it
# failed; the exit code is 0 only when every step passed.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit
. scripts/times.sh
all=(vet unit integration guest images)
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=("${all[@]}")
for s in "${steps[@]}"; do
  case " ${all[*]} " in *" $s "*) ;; *) echo "test: unknown step $s (steps: ${all[*]})" >&2; exit 2 ;; esac
done
has() { case " ${steps[*]} " in *" $1 "*) return 0 ;; esac; return 1; }

work=$(mktemp -d)
export LVM_AGENT_TIMES=$work/times # scripts/times.sh: "STEP<TAB>LABEL<TAB>SECONDS"
: >"$LVM_AGENT_TIMES"
: >"$work/rows" # "STEP START WALL CPU RESULT", in the order the steps ended
: >"$work/started" # "STEP START"
t0=$SECONDS
ncpu=$(nproc)
. scripts/guest/cpu.sh # cpu, busy: the host's CPU use during a step

# run STEP COMMAND...: COMMAND with LVM_AGENT_STEP=STEP, timed; its row goes
# to $work/rows (a file: run also runs in the background).
run() {
  local step=$1 start=$SECONDS rc=0 b0 a0 b1 a1
  shift
  read -r b0 a0 < <(cpu)
  echo "$step $((start - t0))" >>"$work/started"
  printf '\n==> test: %s (at %d s; host load %s)\n' "$step" $((start - t0)) "$(cut -d' ' -f1-3 /proc/loadavg)"
  # Its output also kept: the table's end names a failed step's failures.
  LVM_AGENT_STEP=$step "$@" 2>&1 | tee "$work/$step.out" || rc=$?
  read -r b1 a1 < <(cpu)
  echo "$step $((start - t0)) $((SECONDS - start)) $(busy "$b0" "$a0" "$b1" "$a1") $([ $rc -eq 0 ] && echo ok || echo "FAIL($rc)")" >>"$work/rows"
  printf '==> test: %s %s in %d s\n' "$step" "$([ $rc -eq 0 ] && echo passed || echo "FAILED (exit $rc)")" $((SECONDS - start))
  return $rc
}

table() {
  local step start wall cpu_pct result
  echo
  echo "make test: step times (wall seconds; start: since make test began; cpu: the host's CPU busy during the step, $ncpu cores = $((ncpu * 100))%)"
  printf '%-58s %6s %6s %5s  %s\n' step start wall cpu result
  # A step still running (make test interrupted) is a row without an end.
  awk 'NR == FNR { done[$1] = 1; next } !($1 in done) { print $1, $2, "-", "-", "unfinished" }' "$work/rows" "$work/started" >"$work/unfinished"
  cat "$work/unfinished" >>"$work/rows"
  sort -k2,2n "$work/rows" | while read -r step start wall cpu_pct result; do
    printf '%-58s %6s %6s %4s%%  %s\n' "$step" "$start" "$wall" "$cpu_pct" "$result"
    awk -F'\t' -v s="$step" '$1 == s { printf "  %-56.56s %6s %6d\n", $2, "", $3 }' "$LVM_AGENT_TIMES"
  done
  printf '%-58s %6s %6d  %s\n' total '' $((SECONDS - t0)) "$([ "${failed:-1}" = 0 ] && echo PASS || echo FAIL)"
  # Last, where a log's tail (CI's) shows it: what failed in each failed step.
  sort -k2,2n "$work/rows" | while read -r step start wall cpu_pct result; do
    case $result in FAIL*) ;; *) continue ;; esac
    echo "failed in $step (its last failure lines; the whole output is above):"
    grep -a -E -e '--- FAIL|^FAIL|FAILED|panic:|Error|error:|timed out|Unable to connect|no .* within|gofmt needed|\[SC[0-9]+\]' "$work/$step.out" 2>/dev/null | tail -n 12 | cut -c1-400
  done
}
trap 'table; rm -rf "$work"' EXIT
trap 'failed=130; exit 130' INT TERM

# builds: everything the guest step needs, staged for it (scripts/vm/test.sh
# --files): guest-files.sh builds Kubernetes (all the components at once:
# the integration step's kube-assets.sh call waits for it), containerd,
# lvmd, this checkout's guest binaries and images (amd64); and the power
# cut's first boot.
builds() {
  local rc=0 names
  # The guest image, then the power cut's first boot on the node's disk
  # (scripts/vm/test.sh --cut): it needs nothing else built, and its guest
  # takes a core the builds leave idle at times.
  { scripts/vm/build-guest.sh >/dev/null && scripts/vm/test.sh --cut; } &
  local guest=$!
  read -ra names <<<"$(scripts/vm/test.sh --names)"
  scripts/vm/guest-files.sh --stage "${names[@]}" >"$work/files" || rc=$?
  wait "$guest" || rc=$?
  return "$rc"
}
# kubernetes: etcd and the Kubernetes components (scripts/kube-assets.sh),
# first and in the foreground. Cold, it is the longest build, and Go's build
# cache shares a compiled package between two builds only once one of them
# has written it: vet, the unit tests and the images started beside it would
# each compile client-go, apimachinery, grpc, protobuf... again (the same
# packages: scripts/align-deps.sh). containerd and the guest image share
# little with it and build beside it (builds), Helm after it (below);
# guest-files.sh's own call waits for this one (flock). Warm, it is a cache
# lookup.
kubernetes() {
  if has guest; then
    scripts/kube-assets.sh kube-controller-manager kube-scheduler kubelet kubectl kube-proxy >/dev/null
  else
    scripts/kube-assets.sh kube-controller-manager kube-scheduler kubectl >/dev/null
  fi
}
vet() { make --no-print-directory vet; }
unit() {
  # agent/luks2's interop tests run Debian's cryptsetup (on files).
  if ! dpkg -s cryptsetup-bin >/dev/null 2>&1; then
    apt-get update -qq -o DPkg::Lock::Timeout=600 >&2 || echo "test: apt-get update reported errors (continuing)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      -o DPkg::Lock::Timeout=600 cryptsetup-bin >/dev/null
  fi
  make --no-print-directory test-unit
}
integration() { scripts/integration.sh; }
guest() {
  local files
  files=$(cat "$work/files" 2>/dev/null)
  scripts/vm/test.sh ${files:+--files "$files"}
}
# images: both arches, the check that the published images build; the guest
# step uses its own amd64 images (builds). Niced: beside vet, the tests and
# the guest it takes only the CPU they leave idle (cold, arm64 is a 4
# CPU-minute cross-compile that otherwise slows vet and the tests by as much).
images() { nice -n 19 make --no-print-directory images; }

# background NAME [COMMAND...]: COMMAND (default: run NAME NAME, the step
# NAME) in the background, its output kept for later (waited: shown then).
# The pid is in bg[NAME].
declare -A bg
background() {
  local name=$1
  shift
  [ $# -gt 0 ] || set -- run "$name" "$name"
  "$@" >"$work/$name.log" 2>&1 &
  bg[$name]=$!
}
# waited NAME: wait for a background NAME and show its output.
waited() {
  [ -n "${bg[$1]:-}" ] || return 0
  echo "==> test: waiting for $1 (at $((SECONDS - t0)) s)"
  local rc=0
  wait "${bg[$1]}" || rc=$?
  sed "s/^/$1: /" "$work/$1.log"
  bg[$1]=
  return $rc
}

# tests STEP...: the host's steps, one after another.
tests() {
  local s rc=0
  for s in "$@"; do run "$s" "$s" || rc=1; done
  return $rc
}
host=()
for s in "${steps[@]}"; do case $s in guest | images) ;; *) host+=("$s") ;; esac; done
failed=0
! has guest || background builds
if has guest || has integration; then run kubernetes kubernetes || failed=1; fi
# Helm, for the integration step only (its scripts/helm.sh call waits for
# this one, flock), beside the builds the guest waits for (4.3 CPU-minutes
# cold; warm, a cache lookup). Not niced: niced, it took about 12 minutes cold,
# the integration step waited for it, and its tests (seven control planes)
# then ran beside the guest's node scenario, which they starved (a cold
# .ci/run failed: the guest's API server stopped answering kubectl). Built
# now, the integration tests run beside the guest's boot and suite, as
# they do warm.
if has integration; then scripts/helm.sh >/dev/null 2>&1 & fi
! has images || background images
if has guest; then
  # The guest is the longest step and leaves part of the host idle (its
  # vCPUs wait on its own timers and disks): vet and the tests run beside
  # it, their output shown after it, so the guest starts once the builds
  # are done instead of after them.
  [ ${#host[@]} -eq 0 ] || background tests tests "${host[@]}"
  waited builds || failed=1
  run guest guest || failed=1
  waited tests || failed=1
else
  tests "${host[@]}" || failed=1
fi
waited images || failed=1
# The exit code: 0 when every step passed (failed is 0 or 1 here). A test,
# not `exit $failed`: after a last exit, shellcheck 0.9.0 takes every
# function above for unreachable (SC2317).
[ "$failed" -eq 0 ]
