#!/usr/bin/env bash
# Starts, stops or restarts topolvm's lvmd in the background, with the config
# that setup-lvm.sh wrote. The agent's tests kill and restart lvmd on purpose,
# so this is the one place that knows how.
#
#   start-lvmd.sh [start|stop|kill|restart|status]   (default: start)
#
#   start    start lvmd unless it runs; wait until its socket exists
#   stop     SIGTERM (graceful), wait until it is gone
#   kill     SIGKILL, as a crash would; the stale socket stays behind
#   restart  stop, then start
# Settings (environment):
#   LVMD_BIN     lvmd binary  (/opt/lvm-agent/lvmd if present, else lvmd on $PATH)
#   LVMD_CONFIG  config       (/etc/topolvm/lvmd.yaml)
#   LVMD_SOCKET  socket       (/run/topolvm/lvmd.sock; must match the config)
#   LVMD_LOG     its output   (/var/log/lvmd.log; e.g. /share/lvmd.log to keep it)
#   LVMD_WAIT    seconds to wait for the socket (120: lvmd runs lvm first, slow under TCG)
set -euo pipefail

CONFIG=${LVMD_CONFIG:-/etc/topolvm/lvmd.yaml}
SOCKET=${LVMD_SOCKET:-/run/topolvm/lvmd.sock}
LOG=${LVMD_LOG:-/var/log/lvmd.log}
WAIT=${LVMD_WAIT:-120}
PIDFILE=$(dirname "$SOCKET")/lvmd.pid

log() { echo "start-lvmd: $*" >&2; }

# Alive and not a zombie: a killed lvmd whose parent has not reaped it yet
# still answers `kill -0`.
running() {
  local pid state
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
  [ -n "$state" ] && [ "$state" != Z ]
}

start() {
  if running; then log "already running (pid $(cat "$PIDFILE"))"; return; fi
  local bin=${LVMD_BIN:-}
  if [ -z "$bin" ] && [ -x /opt/lvm-agent/lvmd ]; then bin=/opt/lvm-agent/lvmd; fi
  if [ -z "$bin" ]; then bin=$(command -v lvmd) || { log "no lvmd binary (set LVMD_BIN)"; return 1; }; fi
  mkdir -p "$(dirname "$SOCKET")" "$(dirname "$LOG")"
  rm -f "$SOCKET"
  # setsid: lvmd must outlive the caller's session (an ssh logout, a test's
  # process group). Metrics are off: their default port :8080 would clash.
  setsid "$bin" --config "$CONFIG" --metrics-bind-address= </dev/null >>"$LOG" 2>&1 &
  echo $! >"$PIDFILE"
  local i
  for ((i = 0; i < WAIT * 10; i++)); do
    [ -S "$SOCKET" ] && { log "lvmd ready on $SOCKET (pid $!, log $LOG)"; return; }
    running || break
    sleep 0.1
  done
  log "lvmd did not create $SOCKET; last lines of $LOG:"
  tail -n 20 "$LOG" >&2
  return 1
}

signal_and_wait() {
  running || { log "not running"; rm -f "$PIDFILE"; return 0; }
  local pid i
  pid=$(cat "$PIDFILE")
  kill "-$1" "$pid"
  for ((i = 0; i < 300; i++)); do
    running || { rm -f "$PIDFILE"; log "stopped (SIG$1, pid $pid)"; return 0; }
    sleep 0.1
  done
  log "pid $pid survived SIG$1 for 30 s"
  return 1
}

case ${1:-start} in
  start) start ;;
  stop) signal_and_wait TERM ;;
  kill) signal_and_wait KILL ;;
  restart) signal_and_wait TERM && start ;;
  status) if running; then echo "running (pid $(cat "$PIDFILE"))"; else echo "stopped"; exit 3; fi ;;
  *) sed -n '2,18s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
