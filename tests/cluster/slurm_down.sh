#!/usr/bin/env bash
# Stop the test cluster that slurm_up.sh started: slurmd, slurmctld, then munged, each by the pid
# in its pid file (nothing else is killed). `--purge` also removes the state folder and the
# configuration files slurm_up.sh wrote. Safe to run when nothing is up.
set -euo pipefail

STATE_DIR="${FMAUDIT_SLURM_STATE:-/var/spool/slurm-fmaudit}"
MARKER="# written by fmaudit tests/cluster/slurm_up.sh"

stop_pidfile() {  # name pidfile
  local pid
  [[ -f $2 ]] || return 0
  pid=$(cat "$2")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    echo "slurm_down: stopped $1 (pid $pid)"
  fi
  rm -f "$2"
}

# Jobs still running would be orphaned by slurmd; cancel ours first if the controller answers.
if command -v scancel >/dev/null 2>&1 && [[ -f $STATE_DIR/slurmctld.pid ]]; then
  timeout 10 scancel --full --nodelist=localhost >/dev/null 2>&1 || true
fi
stop_pidfile slurmd "$STATE_DIR/slurmd.pid"
stop_pidfile slurmctld "$STATE_DIR/slurmctld.pid"
if [[ -f $STATE_DIR/munged.ours ]]; then
  stop_pidfile munged /run/munge/munged.pid
  rm -f "$STATE_DIR/munged.ours"
fi

if [[ ${1:-} == --purge ]]; then
  for conf in /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/cgroup.conf; do
    if [[ -f $conf ]] && grep -qF "$MARKER" "$conf"; then rm -f "$conf"; fi
  done
  rm -rf "$STATE_DIR"
  echo "slurm_down: purged $STATE_DIR and the generated configuration"
fi
echo "slurm down"
