#!/usr/bin/env bash
# Prints MODULE@VERSION, one a line, sorted: this repo's version of each
# module that GOMOD (the go.mod of something scripts/ build from the proxy:
# k8s.io/kubernetes, topolvm) requires at another version.
#
#   scripts/align-deps.sh GOMOD
#
# The wrapper modules of scripts/kube-assets.sh and scripts/lvmd-build.sh
# require these, so that a package they share with lvm-agent (client-go,
# apimachinery, grpc, protobuf, x/net, topolvm's protos...) is compiled with
# the same module versions, and so from the same sources, as lvm-agent's:
# Go's build cache then compiles it once for all three. A package is a cache
# hit only when its module's version and every dependency's are the same.
# MVS makes a require below the version GOMOD needs a no-op, so only the
# modules where this repo is ahead are raised. The callers key their cached
# binaries by this list.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gomod=${1:?usage: align-deps.sh GOMOD}

# This repo's build list; read-only, whatever GOFLAGS the caller exports.
ours=$(cd "$root" && GOFLAGS=-mod=readonly go list -m -f '{{.Path}} {{.Version}}' all)
# GOMOD's requirements (both `require M V` and `require ( ... )` forms).
theirs=$(awk '
  /^require \(/ { block = 1; next }
  block && /^\)/ { block = 0; next }
  block && NF >= 2 { print $1, $2; next }
  /^require [^(]/ { print $2, $3 }
' "$gomod")
awk 'NR == FNR { have[$1] = $2; next } ($1 in have) && have[$1] != $2 { print $1 "@" $2 }' \
  <(echo "$theirs") <(echo "$ours") | sort
