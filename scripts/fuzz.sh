#!/usr/bin/env bash
# Runs every Go fuzz target of the module for a bounded time each
# (FUZZTIME, default 10s). Seed corpora live in each package's testdata/fuzz.
set -euo pipefail
fuzztime=${FUZZTIME:-10s}
for pkg in $(go list ./... | grep -v /integration); do
  for target in $(go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
    echo "==> $pkg $target ($fuzztime)"
    go test -run '^$' -fuzz "^$target\$" -fuzztime "$fuzztime" "$pkg"
  done
done
