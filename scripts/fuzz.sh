#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a bounded time each
# (FUZZTIME, default 10s). Seed corpora live in each package's testdata/fuzz.
#
# Go 1.26's fuzz coordinator can report a bare "context deadline exceeded"
# when -fuzztime expires while a worker is mid-call, most often on a loaded
# machine (golang/go#75804, fixed in Go 1.27). A real finding always writes
# its input ("Failing input written to"); such a bare deadline, and only
# that, is accepted once the target's corpus replays clean.
set -euo pipefail
fuzztime=${FUZZTIME:-10s}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for pkg in $(go list ./... | grep -v /integration); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "==> $pkg $target ($fuzztime)"
    if go test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" "$pkg" 2>&1 | tee "$log"; then
      continue
    fi
    if grep -q 'context deadline exceeded' "$log" && ! grep -qE 'Failing input written to|panic:|\.go:[0-9]+: ' "$log"; then
      echo "==> $target: the fuzz coordinator's deadline race (golang/go#75804), no input found; replaying the corpus"
      go test -count=1 -run "^$target\$" "$pkg"
      continue
    fi
    exit 1
  done
done
