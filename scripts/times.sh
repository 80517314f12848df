# shellcheck shell=bash
# Sourced by the build and test scripts. times_add LABEL SECONDS appends a
# line "STEP<TAB>LABEL<TAB>SECONDS" to $LVM_AGENT_TIMES, which make test's
# runner (scripts/test.sh) sets and prints as the rows under STEP in its
# table; without it, nothing happens. (One short append: atomic, so builds
# running side by side can share the file.)
times_add() {
  [ -z "${LVM_AGENT_TIMES:-}" ] || printf '%s\t%s\t%s\n' "${LVM_AGENT_STEP:-}" "$1" "$2" >>"$LVM_AGENT_TIMES"
}
