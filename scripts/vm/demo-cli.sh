#!/usr/bin/env bash
# `make demo-cli`: boots the test guest and runs scripts/guest/demo-cli.sh in it: a
# real etcd + kube-apiserver, LVM on a loop device, topolvm's lvmd and
# lvm-agent, then one volume created and removed through the real CLI
# (`lvm-agent volume create|delete`), with `lvs` showing each step.
# A few minutes under TCG; exit code: the demo's (0: it worked).
#
#   scripts/vm/demo-cli.sh [--timeout SECONDS]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
timeout=900
[ "${1:-}" != --timeout ] || timeout=$2
t0=$SECONDS

echo "==> Building the guest's binaries (cached; the first build of kube-apiserver takes 8-20 min)"
files=$("$here/guest-files.sh" --stage etcd kube-apiserver lvmd lvm-agent lvm-devcluster)
trap 'rm -rf "$files"' EXIT

echo "==> Booting the guest (QEMU; TCG unless KVM really works here)"
rc=0
"$here/run.sh" --mem 3G --cpus 2 --timeout "$timeout" --files "$files" -- \
  bash /opt/lvm-agent/guest/demo-cli.sh --bin /opt/lvm-agent || rc=$?
echo "==> demo: $([ $rc -eq 0 ] && echo OK || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s"
exit $rc
