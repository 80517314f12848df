#!/usr/bin/env bash
# make vet's shellcheck: Debian's shellcheck package on every tracked shell
# file, the *.sh files and any other whose first line runs bash or sh
# (.ci/run). The package is installed with apt-get when it is missing, as
# scripts/vm/build-guest.sh installs its host packages, so a fresh machine
# (CI's) needs nothing installed by hand.
#
#   scripts/shellcheck.sh [FILE...]   (default: every tracked shell file)
#
# Every finding fails, at every level (style included). Sourced files are
# followed (-x), found beside the file that sources them (-P SCRIPTDIR) or
# from the repository's root; a file only sourced says its shell in a
# `# shellcheck shell=bash` line. A check is turned off only on the one line
# it is wrong about, with the reason beside it: never for a whole file, and
# there is no .shellcheckrc.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
log() { echo "shellcheck: $*" >&2; }

if ! dpkg -s shellcheck >/dev/null 2>&1; then
  # make test's other steps may run apt-get at the same time (the guest's
  # build installs its host packages): wait for apt's locks, not fail.
  log "apt-get update"
  apt-get update -qq -o DPkg::Lock::Timeout=600 >&2 || log "apt-get update reported errors (continuing)"
  log "installing shellcheck"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=600 shellcheck >/dev/null
fi

files=("$@")
if [ ${#files[@]} -eq 0 ]; then
  # Tracked and present (a file deleted but not yet committed is skipped).
  tracked=()
  while IFS= read -r -d '' f; do
    [ -f "$f" ] && tracked+=("$f")
  done < <(git ls-files -z)
  mapfile -t files < <(awk 'FILENAME ~ /\.sh$/ || /^#!.*[\/ ](ba|da)?sh([ \t]|$)/ { print FILENAME } { nextfile }' "${tracked[@]}")
fi
# One line per finding (FILE:LINE:COL: LEVEL: MESSAGE [SCnnnn]), as go vet's.
rc=0
shellcheck -x -P SCRIPTDIR -f gcc "${files[@]}" || rc=$?
version=$(shellcheck --version | sed -n 's/^version: //p')
if [ $rc -ne 0 ]; then
  log "FAILED (shellcheck $version, exit $rc) on ${#files[@]} files; each finding with its line and a fix: shellcheck -x -P SCRIPTDIR FILE"
  exit 1
fi
log "${#files[@]} files, no findings (shellcheck $version)"
