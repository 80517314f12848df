#!/usr/bin/env bash
# Builds Helm's own `helm` binary from the Go module proxy into the cache
# (a wrapper module, so Helm's many dependencies stay out of the project's
# go.mod) and prints its path. Skips the build when the cached binary exists;
# concurrent callers wait for each other (flock).
#
#   scripts/helm.sh            # prints e.g. ~/.cache/lvm-agent/helm/v3.22.0/helm
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}
CACHE=${LVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lvm-agent}
OUT=$CACHE/helm/$HELM_VERSION
export CGO_ENABLED=0 GOFLAGS=-mod=mod
. "$(dirname "${BASH_SOURCE[0]}")/times.sh"

mkdir -p "$OUT"
exec 9>"$OUT/.lock"
flock 9
if [ ! -x "$OUT/helm" ]; then
  w=$CACHE/src/helm-$HELM_VERSION
  mkdir -p "$w" && cd "$w"
  [ -f go.mod ] || go mod init lvm-agent/helm-build >/dev/null 2>&1
  echo "helm: building helm $HELM_VERSION (cold: a few minutes)" >&2
  t0=$SECONDS
  go get -tool "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >/dev/null 2>&1
  go build -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" -o "$OUT/helm.tmp" helm.sh/helm/v3/cmd/helm
  mv "$OUT/helm.tmp" "$OUT/helm"
  times_add "build: helm" $((SECONDS - t0))
fi
echo "$OUT/helm"
