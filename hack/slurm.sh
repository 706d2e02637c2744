#!/usr/bin/env bash
# A private single-machine Slurm cluster with an SSH login node, for GPUJobs:
#   hack/slurm.sh up      install (Debian's slurmctld, slurmd, munge, openssh-server) and start
#   hack/slurm.sh down    stop everything it started (the state folder stays)
#   hack/slurm.sh status  what runs
# Everything lives in $SLURM_DIR (default target/slurm): its own munge key and socket, slurm.conf,
# spool, state and logs, ports on loopback, and an sshd with its own host key and authorized key
# on 127.0.0.1:$SLURM_SSH_PORT. Nothing in /etc/slurm, /etc/munge or /etc/ssh is read or changed.
#
# The node declares two GPUs (`Gres=gpu:2`): this machine has none, so gres.conf names two
# stand-in device nodes (Slurm 22.05 drops GPUs without files); jobs are scheduled against
# that count and run CPU stand-ins.
#
# With KUBECONFIG set, `up` also registers this Slurm as the cluster's default: the Secret
# `gpu-system/slurm-default` (login address, user, private key, host key) that the GPUJob
# controller reads.
source "$(dirname "$0")/lib.sh"

DIR="${SLURM_DIR:-$ROOT/target/slurm}"
SSH_PORT="${SLURM_SSH_PORT:-2222}"
CTLD_PORT="${SLURM_CTLD_PORT:-16817}"
SLURMD_PORT="${SLURM_SLURMD_PORT:-16818}"
NODE=mk8s-slurm

running() { [ -f "$1" ] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }

stop_pid() {
  local f="$1" name="$2"
  if running "$f"; then
    kill "$(cat "$f" 2>/dev/null)" 2>/dev/null || true
    for _ in $(seq 50); do running "$f" || break; sleep 0.1; done
    running "$f" && kill -9 "$(cat "$f" 2>/dev/null)" 2>/dev/null || true
    log "stopped $name"
  fi
  rm -f "$f"
}

down() {
  # Jobs first (their processes belong to slurmd's steps), then the daemons.
  if running "$DIR/run/slurmctld.pid"; then
    SLURM_CONF="$DIR/slurm.conf" scancel --quiet --full --user=root 2>/dev/null || true
  fi
  stop_pid "$DIR/run/sshd.pid" sshd
  stop_pid "$DIR/run/slurmd.pid" slurmd
  stop_pid "$DIR/run/slurmctld.pid" slurmctld
  stop_pid "$DIR/run/munged.pid" munged
  # Any step left behind by a killed slurmd.
  pkill -f "slurmstepd: \[.*\]" -u root 2>/dev/null && log "stopped leftover job steps" || true
}

write_config() {
  local cpus mem
  # More CPU slots than cores (SlurmdParameters=config_overrides): the jobs here are small
  # and mostly wait, and a test cluster should run many at once.
  cpus="${SLURM_CPUS:-$(( $(nproc) * 8 ))}"
  mem="$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))"
  mkdir -p "$DIR"/{run,log,ctld,spool,munge,jobs,home}
  chmod 700 "$DIR/munge"
  cat > "$DIR/slurm.conf" <<EOF
# Written by hack/slurm.sh: a private single-machine cluster.
ClusterName=minik8s
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=socket=$DIR/munge/munge.socket
StateSaveLocation=$DIR/ctld
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
# Finished jobs stay visible to scontrol for an hour (there is no slurmdbd for sacct).
MinJobAge=3600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=$NODE NodeHostname=$(hostname) NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem Gres=gpu:2 State=UNKNOWN
PartitionName=gpu Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  # Slurm 22.05 drops GPUs without device files, so the two stand-in GPUs are character
  # devices with /dev/null's numbers in the state folder: jobs are scheduled against them
  # (and get CUDA_VISIBLE_DEVICES) but there is no GPU behind them.
  mkdir -p "$DIR/dev"
  for i in 0 1; do [ -c "$DIR/dev/gpu$i" ] || mknod "$DIR/dev/gpu$i" c 1 3; done
  cat > "$DIR/gres.conf" <<EOF
# Two stand-in GPUs (see hack/slurm.sh): device nodes without a GPU behind them.
NodeName=$NODE Name=gpu File=$DIR/dev/gpu[0-1]
EOF
  rm -f "$DIR/cgroup.conf"
  [ -f "$DIR/munge/munge.key" ] || {
    dd if=/dev/urandom bs=1 count=1024 of="$DIR/munge/munge.key" status=none
    chmod 400 "$DIR/munge/munge.key"
  }
  [ -f "$DIR/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/ssh_host_ed25519_key"
  [ -f "$DIR/client_key" ] || ssh-keygen -q -t ed25519 -N '' -C minik8s-gpujobs -f "$DIR/client_key"
  cp "$DIR/client_key.pub" "$DIR/authorized_keys"
  chmod 600 "$DIR/authorized_keys"
  cat > "$DIR/sshd_config" <<EOF
# Written by hack/slurm.sh: the login node of the private Slurm.
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $DIR/ssh_host_ed25519_key
PidFile $DIR/run/sshd.pid
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
MaxStartups 100:30:200
MaxSessions 100
# Its own HOME: bash sources ~/.bashrc for every command sshd runs, and root's on a machine
# may be slow (pyenv's init costs ~100 ms a command here) or print things.
SetEnv SLURM_CONF=$DIR/slurm.conf HOME=$DIR/home
Subsystem sftp internal-sftp
EOF
}

up() {
  need_root
  "$ROOT/hack/install-deps.sh" --slurm
  write_config
  export SLURM_CONF="$DIR/slurm.conf"
  if ! running "$DIR/run/munged.pid"; then
    /usr/sbin/munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
      --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munged.seed"
    log "munged on $DIR/munge/munge.socket"
  fi
  if ! running "$DIR/run/slurmctld.pid"; then
    /usr/sbin/slurmctld -f "$SLURM_CONF"
    log "slurmctld on 127.0.0.1:$CTLD_PORT"
  fi
  if ! running "$DIR/run/slurmd.pid"; then
    /usr/sbin/slurmd -f "$SLURM_CONF" -N "$NODE"
    log "slurmd ($NODE, Gres=gpu:2) on 127.0.0.1:$SLURMD_PORT"
  fi
  if ! running "$DIR/run/sshd.pid"; then
    mkdir -p /run/sshd
    /usr/sbin/sshd -f "$DIR/sshd_config"
    log "sshd (login node) on 127.0.0.1:$SSH_PORT"
  fi
  # Ready when the node takes jobs.
  for _ in $(seq 100); do
    state="$(sinfo -h -n "$NODE" -o %t 2>/dev/null || true)"
    case "$state" in idle*|mix*|alloc*) break ;; esac
    sleep 0.2
  done
  case "$state" in idle*|mix*|alloc*) ;; *) die "slurmd did not come up (state '$state'); see $DIR/log" ;; esac
  for _ in $(seq 50); do
    ssh_probe && break
    sleep 0.1
  done
  ssh_probe || die "the login node does not answer; see sshd -f $DIR/sshd_config -d"
  log "Slurm is up: partition gpu, node $NODE ($(sinfo -h -n "$NODE" -o '%c CPUs, %G'))"
  if [ -n "${KUBECONFIG:-}" ]; then
    register
  fi
}

ssh_probe() {
  ssh -q -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    -i "$DIR/client_key" -p "$SSH_PORT" root@127.0.0.1 'sinfo -h -o %P' >/dev/null 2>&1
}

# The Secret the GPUJob controller reads for the default cluster.
register() {
  local host_key
  host_key="$(cut -d' ' -f1,2 "$DIR/ssh_host_ed25519_key.pub")"
  kubectl get namespace gpu-system >/dev/null 2>&1 || kubectl create namespace gpu-system >/dev/null
  kubectl -n gpu-system create secret generic slurm-default \
    --from-literal=host=127.0.0.1 --from-literal=port="$SSH_PORT" --from-literal=user=root \
    --from-file=privateKey="$DIR/client_key" --from-literal=hostKey="$host_key" \
    --from-literal=workDir="$DIR/jobs" \
    --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  log "registered as the default Slurm cluster (Secret gpu-system/slurm-default)"
}

status() {
  for p in munged slurmctld slurmd sshd; do
    if running "$DIR/run/$p.pid"; then echo "$p: running (pid $(cat "$DIR/run/$p.pid"))"; else echo "$p: stopped"; fi
  done
  if running "$DIR/run/slurmctld.pid"; then SLURM_CONF="$DIR/slurm.conf" sinfo; fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  register) register ;;
  *) die "usage: hack/slurm.sh up|down|status|register" ;;
esac
