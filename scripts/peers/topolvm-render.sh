#!/usr/bin/env bash
# Renders TopoLVM's own chart, charts/topolvm of the Go module
# github.com/topolvm/topolvm@TOPOLVM_VERSION (from the module proxy), with
# Helm (scripts/helm.sh) and only the settings of
# scripts/peers/topolvm-values.yaml, into one YAML for the guest
# (scripts/guest/peers.sh applies it): the Namespace, then the chart's
# objects, its LogicalVolume CRD among them (the chart's templates/crds is
# the module's config/crd/bases CRD, the same object; integration/peers_test.go
# checks).
#
#   scripts/peers/topolvm-render.sh [FILE]    (default: stdout)
#
# The chart declares cert-manager as a dependency (used only with its
# webhook, off here): helm refuses a chart whose dependency is missing, and
# fetching it needs the chart repository; the copy rendered has none.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOPOLVM_VERSION=${TOPOLVM_VERSION:-v0.41.0}
NAMESPACE=${TOPOLVM_NAMESPACE:-topolvm-system}
module=$(GOFLAGS=-mod=mod go mod download -json "github.com/topolvm/topolvm@$TOPOLVM_VERSION" |
  sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -d "$module/charts/topolvm" ] || { echo "topolvm-render: no chart in github.com/topolvm/topolvm@$TOPOLVM_VERSION" >&2; exit 1; }
helm=${LVM_AGENT_HELM:-$("$here/../helm.sh")}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$module/charts/topolvm" "$work/topolvm"
chmod -R u+w "$work/topolvm" # the module cache is read-only
awk '/^dependencies:/ { skip = 1; next } skip && /^[^ \t-]/ { skip = 0 } !skip' \
  "$module/charts/topolvm/Chart.yaml" >"$work/topolvm/Chart.yaml"
rm -f "$work/topolvm/Chart.lock"
{
  printf '%s\n' '---' 'apiVersion: v1' 'kind: Namespace' 'metadata:' "  name: $NAMESPACE"
  "$helm" template topolvm "$work/topolvm" --namespace "$NAMESPACE" -f "$here/topolvm-values.yaml"
} >"$work/topolvm.yaml"
if [ $# -gt 0 ]; then cp "$work/topolvm.yaml" "$1"; else cat "$work/topolvm.yaml"; fi
