# shellcheck shell=bash
# Sourced by scripts/test.sh and the guest's test.sh and node.sh: how busy
# the CPUs were between two readings.
# cpu: the busy jiffies and all jiffies so far (/proc/stat).
cpu() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }
# busy B0 A0 B1 A1: the CPUs' busy share between two cpu readings, in percent
# of one CPU (two CPUs: up to 200).
busy() { echo $((($3 - $1) * 100 * $(nproc) / ($4 - $2 > 0 ? $4 - $2 : 1))); }
