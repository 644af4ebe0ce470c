#!/usr/bin/env bash
# Bring up a throwaway single-node Slurm cluster (munged + slurmctld + slurmd on localhost, one fake
# GPU) for tests/cluster. Idempotent: re-running while it is up only checks it; a changed config
# restarts the daemons. Needs root and Debian's `slurm-wlm munge` packages; no systemd.
#
# It writes /etc/slurm/slurm.conf and /etc/slurm/gres.conf, so it refuses to touch a slurm.conf it
# did not write (a real cluster's); set FMAUDIT_SLURM_FORCE=1 to override.
#
# Exit codes: 0 up; 2 not root; 3 packages missing; 4 foreign slurm.conf; 5 daemons did not come up.
# Environment: FMAUDIT_SLURM_STATE (state, logs, pid files; default /var/spool/slurm-fmaudit),
# FMAUDIT_SLURM_WAIT (seconds to wait for the node; default 120).
set -euo pipefail

STATE_DIR="${FMAUDIT_SLURM_STATE:-/var/spool/slurm-fmaudit}"
WAIT_S="${FMAUDIT_SLURM_WAIT:-120}"
CONF_DIR=/etc/slurm
MARKER="# written by fmaudit tests/cluster/slurm_up.sh"
MUNGE_KEY=/etc/munge/munge.key
MUNGE_PID=/run/munge/munged.pid
started_at=$(date +%s)

die() { local code=$1; shift; echo "slurm_up: $*" >&2; exit "$code"; }

# The daemons live in /usr/sbin, which is not on every user's PATH.
export PATH="$PATH:/usr/sbin:/sbin"
[[ $(id -u) -eq 0 ]] || die 2 "must run as root (it starts munged, slurmctld and slurmd)"

missing=()
for tool in munged munge unmunge slurmctld slurmd sinfo scontrol sbatch squeue; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  die 3 "missing: ${missing[*]}; install with: apt-get update && apt-get install -y slurm-wlm munge"
fi
getent passwd munge >/dev/null || die 3 "user 'munge' missing; reinstall the munge package"

if [[ -f $CONF_DIR/slurm.conf ]] && ! grep -qF "$MARKER" "$CONF_DIR/slurm.conf" \
    && [[ ${FMAUDIT_SLURM_FORCE:-0} != 1 ]]; then
  die 4 "$CONF_DIR/slurm.conf exists and was not written by this script (a real cluster?);" \
        "set FMAUDIT_SLURM_FORCE=1 to overwrite it"
fi

# ---- configuration -------------------------------------------------------------------------------
# Declared, not enforced (no cgroups; config_overrides below stops slurmd from checking them), so
# the node looks the same on every machine: at least 2 CPUs and 8 GB, which the profiles'
# default requests fit.
cpus=$(( $(nproc) > 2 ? $(nproc) : 2 ))
real_memory_mb=8000
fake_gpu="$STATE_DIR/dev/gpu0"

mkdir -p "$CONF_DIR" "$STATE_DIR"/{ctld,d,log,dev}
# Slurm 22.05 drops a GPU whose File= is not a device; a link to /dev/null is a character device,
# and the trailing 0 becomes the GPU index (CUDA_VISIBLE_DEVICES=0 in the job).
ln -sfn /dev/null "$fake_gpu"

new_slurm_conf=$(cat <<EOF
$MARKER
# Single-node test cluster: node "localhost", ${cpus} CPUs, ${real_memory_mb} MB, one fake GPU.
ClusterName=fmaudit
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/d
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd.pid
SlurmctldLogFile=$STATE_DIR/log/slurmctld.log
SlurmdLogFile=$STATE_DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in containers: track processes by parent id and bind nothing.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
# No slurmdbd: sacct does not work, so the Snakemake plugin must poll with squeue, which sees a
# finished job for MinJobAge seconds (the plugin wants >= 3 x its initial status-check wait).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MinJobAge=300
ReturnToService=2
# Use the declared CPUs and memory whatever slurmd detects (no "Low RealMemory" drain).
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SlurmdTimeout=60
SlurmctldTimeout=60
MpiDefault=none
MailProg=/bin/true
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$real_memory_mb Gres=gpu:1 State=UNKNOWN
# Two partitions on the one node, as on a real site: the default (CPU) one and a GPU one, so that a
# test can see which partition each job was sent to.
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=localhost Default=NO MaxTime=INFINITE State=UP
EOF
)
new_gres_conf=$(cat <<EOF
$MARKER
AutoDetect=off
NodeName=localhost Name=gpu File=$fake_gpu
EOF
)

config_changed=0
write_if_changed() {  # path content
  if [[ ! -f $1 ]] || [[ "$(cat "$1")" != "$2" ]]; then
    printf '%s\n' "$2" > "$1.tmp" && mv "$1.tmp" "$1"
    config_changed=1
  fi
}
write_if_changed "$CONF_DIR/slurm.conf" "$new_slurm_conf"
write_if_changed "$CONF_DIR/gres.conf" "$new_gres_conf"

# ---- daemons -------------------------------------------------------------------------------------
pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfile() {  # pidfile
  if pid_alive "$1"; then
    local pid; pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

# munge: key readable only by its owner, runtime dir owned by munge.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [[ ! -s $MUNGE_KEY ]]; then
    mkdir -p "$(dirname "$MUNGE_KEY")"
    if command -v mungekey >/dev/null 2>&1; then
      mungekey --create --keyfile="$MUNGE_KEY" --force
    else
      dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
    fi
  fi
  chown munge:munge "$MUNGE_KEY"; chmod 0400 "$MUNGE_KEY"
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  stop_pidfile "$MUNGE_PID"  # a stale pid file from a killed munged
  runuser -u munge -- /usr/sbin/munged
  touch "$STATE_DIR/munged.ours"  # slurm_down.sh stops munged only if we started it
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.2; done
  munge -n | unmunge >/dev/null || die 5 "munged did not start (see /var/log/munge/munged.log)"
fi

if ((config_changed)); then
  stop_pidfile "$STATE_DIR/slurmd.pid"
  stop_pidfile "$STATE_DIR/slurmctld.pid"
fi
if ! pid_alive "$STATE_DIR/slurmctld.pid"; then
  # -i: ignore state files left by an older config instead of refusing to start.
  slurmctld -i
fi
for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.2; done
scontrol ping | grep -q 'is UP' || die 5 "slurmctld is not answering (see $STATE_DIR/log/slurmctld.log)"
if ! pid_alive "$STATE_DIR/slurmd.pid"; then
  # -N: the node is called localhost whatever the host name is.
  slurmd -N localhost
fi

# ---- wait for the node ---------------------------------------------------------------------------
state=""
for ((i = 0; i < WAIT_S * 2; i++)); do
  state=$(sinfo -h -N -n localhost -o %t 2>/dev/null | head -1 | tr -d '*~#')
  case $state in
    idle|mix|alloc|comp) break ;;
    drain|drng|down|fail)  # left over from an earlier run: ReturnToService only acts on registration
      scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true ;;
  esac
  sleep 0.5
done
case $state in
  idle|mix|alloc|comp) ;;
  *) die 5 "node localhost is '${state:-missing}' after ${WAIT_S}s; see $STATE_DIR/log/slurmd.log and" \
           "$STATE_DIR/log/slurmctld.log" ;;
esac
gres=$(sinfo -h -N -n localhost -o %G | head -1)
echo "slurm up: node localhost $state, CPUs=$cpus RealMemory=${real_memory_mb}MB $gres," \
     "partitions debug (default) and gpu, state $STATE_DIR ($(( $(date +%s) - started_at ))s)"
