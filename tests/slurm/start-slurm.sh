#!/bin/bash
# Start/stop a throw-away single-machine Slurm 22.05 "cluster" (Debian 12 packages)
# with N emulated compute nodes (several slurmd on 127.0.0.1, distinct ports).
# Everything runs as root, no systemd, no cgroups; slurmdbd (with a private MariaDB) only
# with SLURM_ACCOUNTING=1.
# Adapted from ../shared/recipes/slurm/start-slurm.sh for Offcut's test suite
# (tests/slurm_cluster.py): private ports by default, PrologEpilogTimeout, no libslurm-dev.
#
# usage:  start-slurm.sh install         # apt-get install the packages (once)
#         start-slurm.sh start           # munge + slurmctld + N slurmd, waits for idle
#         start-slurm.sh stop            # stops what "start" started (by pid files)
#         start-slurm.sh status
# env:    SLURM_TEST_DIR   (default $TMPDIR/slurm-test)  all state/logs/pids live here
#         SLURM_TEST_NODES (default 4)     number of emulated nodes n1..nN
#         SLURM_TEST_PORT0 (default 26800) slurmd i listens on PORT0+i
#         SLURM_CTLD_PORT  (default 26800; the defaults avoid a site's 6817/6818)
#         SLURM_EXTRA_CONF (default empty) extra lines appended to slurm.conf
#         SLURM_PROLOG_EPILOG_TIMEOUT (default 30) seconds before slurmctld kills a hung hook
#         SLURM_MIN_JOB_AGE (default 300) seconds slurmctld keeps an ended job (squeue)
#         SLURM_ACCOUNTING (default 0) 1: a private MariaDB on SLURM_MYSQL_PORT and slurmdbd
#                          on SLURM_DBD_PORT, AccountingStorageType=accounting_storage/slurmdbd
#                          (sacct works); needs slurmdbd and mariadb-server
#         SLURM_HOOK_DIR   (default empty) if set and the files exist, wires
#                          $SLURM_HOOK_DIR/prolog_ctld.sh -> PrologSlurmctld
#                          $SLURM_HOOK_DIR/epilog_ctld.sh -> EpilogSlurmctld
#         SLURM_GPU_NODES  (default empty) comma list of nodes with fake GPUs, e.g. "n2" or
#                          "n3,n4": GresTypes=gpu, Gres=gpu:K on their NodeName lines, and
#                          $SLURM_TEST_DIR/gres.conf (AutoDetect=off) with one line per node,
#                          File=$SLURM_TEST_DIR/dev/nX-nvidia[0-(K-1)] (fake character devices
#                          made with mknod, distinct per node since all slurmd share the host;
#                          a job then gets CUDA_VISIBLE_DEVICES=0..). Request them with
#                          sbatch --gpus-per-node=1, --gres=gpu:1 or --gpus=1 (select/cons_tres,
#                          configured anyway)
#         SLURM_GPUS_PER_NODE (default 1) K, the GPUs of each node of SLURM_GPU_NODES
#         SLURM_NODE_FEATURES (default empty) "n2=a100,ib;n1=cpuonly": Features= of those
#                          nodes (sbatch --constraint=a100)
#         With neither SLURM_GPU_NODES nor SLURM_NODE_FEATURES, slurm.conf is the same as
#         without these variables (one NodeName=n[1-N] line, no gres.conf).
# After "start":  export SLURM_CONF=$SLURM_TEST_DIR/slurm.conf   (for sinfo/srun/...)
set -euo pipefail

D=${SLURM_TEST_DIR:-$(dirname "$(mktemp -u)")/slurm-test}
N=${SLURM_TEST_NODES:-4}
P0=${SLURM_TEST_PORT0:-26800}
CP=${SLURM_CTLD_PORT:-26800}
HOST=$(hostname -s)
export SLURM_CONF=$D/slurm.conf
ACCT=${SLURM_ACCOUNTING:-0}
DBDP=${SLURM_DBD_PORT:-$((P0+N+1))}
MYP=${SLURM_MYSQL_PORT:-$((P0+N+2))}
GPU_NODES=${SLURM_GPU_NODES:-}
GPN=${SLURM_GPUS_PER_NODE:-1}
NODE_FEATURES=${SLURM_NODE_FEATURES:-}

log() { echo "[start-slurm $(date +%T.%3N)] $*" >&2; }

do_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # policy-rc.d / no systemd: the postinst "start" attempts are harmless no-ops
  apt-get install -y -q --no-install-recommends \
      munge slurmctld slurmd slurm-client slurmdbd mariadb-server
}

write_conf() {
  mkdir -p "$D/state" "$D/spool" "$D/munge"
  chmod 755 "$D"   # munged runs as user munge and must reach $D/munge (mktemp -d gives 700)
  local prolog="" epilog="" accounting="AccountingStorageType=accounting_storage/none"
  if [[ "$ACCT" == 1 ]]; then
    accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBDP
AccountingStoragePass=$D/munge/munge.socket.2"   # (the munge socket for slurmdbd's clients)
    mkdir -p "$D/dbd"
    cat > "$D/slurmdbd.conf" <<DBD
AuthType=auth/munge
AuthInfo=socket=$D/munge/munge.socket.2
DbdHost=localhost
DbdPort=$DBDP
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYP
StorageUser=slurm
StoragePass=offcut-test
StorageLoc=slurm_acct_db
PidFile=$D/dbd/slurmdbd.pid
LogFile=$D/dbd/slurmdbd.log
DBD
    chmod 600 "$D/slurmdbd.conf"
  fi
  if [[ -n "${SLURM_HOOK_DIR:-}" ]]; then
    [[ -x "$SLURM_HOOK_DIR/prolog_ctld.sh" ]] && prolog="PrologSlurmctld=$SLURM_HOOK_DIR/prolog_ctld.sh"
    [[ -x "$SLURM_HOOK_DIR/epilog_ctld.sh" ]] && epilog="EpilogSlurmctld=$SLURM_HOOK_DIR/epilog_ctld.sh"
  fi
  # nodes: one NodeName line for all (the default), or one per node with GPUs/features
  local nodelines="NodeName=n[1-$N] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=[$((P0+1))-$((P0+N))] CPUs=2 RealMemory=1000 State=UNKNOWN"
  local gres_types="" i name
  rm -f "$D/gres.conf"
  if [[ -n "$GPU_NODES$NODE_FEATURES" ]]; then
    [[ "$GPN" =~ ^[1-9][0-9]*$ ]] || { log "SLURM_GPUS_PER_NODE=$GPN is not a positive number"; exit 2; }
    local -A gpus=() feats=()
    local item items=()
    for name in ${GPU_NODES//,/ }; do
      [[ "$name" =~ ^n([0-9]+)$ ]] && (( BASH_REMATCH[1] >= 1 && BASH_REMATCH[1] <= N )) \
        || { log "SLURM_GPU_NODES: $name is not one of n1..n$N"; exit 2; }
      gpus[$name]=$GPN
    done
    [[ -z "$GPU_NODES" || ${#gpus[@]} -gt 0 ]] || { log "SLURM_GPU_NODES='$GPU_NODES' names no node"; exit 2; }
    IFS=';' read -ra items <<< "$NODE_FEATURES"
    for item in "${items[@]}"; do
      item=${item//[[:space:]]/}
      [[ -z "$item" ]] && continue
      name=${item%%=*}
      [[ "$item" == *=?* && "$name" =~ ^n([0-9]+)$ ]] && (( BASH_REMATCH[1] >= 1 && BASH_REMATCH[1] <= N )) \
        || { log "SLURM_NODE_FEATURES: '$item' is not nI=feature[,feature] with I in 1..$N"; exit 2; }
      feats[$name]=${item#*=}
    done
    nodelines=""
    for i in $(seq 1 "$N"); do
      name=n$i
      nodelines+="NodeName=$name NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((P0+i)) CPUs=2 RealMemory=1000"
      [[ -n "${gpus[$name]:-}" ]] && nodelines+=" Gres=gpu:${gpus[$name]}"
      [[ -n "${feats[$name]:-}" ]] && nodelines+=" Features=${feats[$name]}"
      nodelines+=" State=UNKNOWN"$'\n'
    done
    nodelines=${nodelines%$'\n'}
    if [[ -n "$GPU_NODES" ]]; then
      # (no AccountingStorageTRES=gres/gpu: slurmctld refuses it without slurmdbd, so
      # sinfo's tres shows no gres/gpu; the node's gres field has the GPUs)
      gres_types=$'\nGresTypes=gpu'
      # slurmd reads gres.conf next to slurm.conf; each slurmd (-N nX) takes its NodeName lines.
      # A File= that is not a character/block device is dropped by slurmd ("not a valid
      # character or block device"), and then the job gets no CUDA_VISIBLE_DEVICES: the fake
      # GPUs are character devices 1:3 (what /dev/null is; no cgroup constraint with task/none
      # uses the numbers), plain files where mknod is not allowed (GRES counts still work)
      mkdir -p "$D/dev"
      local dev
      { echo "AutoDetect=off"
        for name in $(printf '%s\n' "${!gpus[@]}" | sort -V); do
          for ((i = 0; i < GPN; i++)); do
            dev=$D/dev/$name-nvidia$i
            [[ -c "$dev" ]] || { rm -f "$dev"; mknod "$dev" c 1 3 2>/dev/null || {
              log "mknod not allowed: $dev is a plain file (jobs get no CUDA_VISIBLE_DEVICES)"
              touch "$dev"; }; }
          done
          if (( GPN == 1 )); then echo "NodeName=$name Name=gpu File=$D/dev/$name-nvidia0"
          else echo "NodeName=$name Name=gpu File=$D/dev/$name-nvidia[0-$((GPN-1))]"; fi
        done
      } > "$D/gres.conf"
    fi
  fi
  cat > "$SLURM_CONF" <<EOF
ClusterName=testcluster
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CP
AuthType=auth/munge
CryptoType=crypto/munge
AuthInfo=socket=$D/munge/munge.socket.2
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core$gres_types
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
$accounting
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=${SLURM_MIN_JOB_AGE:-300}
KillWait=5
PrologEpilogTimeout=${SLURM_PROLOG_EPILOG_TIMEOUT:-30}
Waittime=0
# preemption: jobs in "batch" (PriorityTier=10) preempt jobs in "scavenger" (PriorityTier=1)
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
# the preempted job's batch shell gets its --signal at once (then GraceTime to checkpoint)
SlurmctldParameters=preempt_send_user_signal
# a main scheduling pass every second: with an EpilogSlurmctld, Slurm 22.05 starts a job waiting
# for an ending job's nodes only at its next periodic pass (docs/deployment.md, step 3)
SchedulerParameters=sched_interval=1
$prolog
$epilog
$nodelines
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
PartitionName=scavenger Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=CANCEL GraceTime=${SLURM_SCAVENGER_GRACE_S:-10}
${SLURM_EXTRA_CONF:-}
EOF
}

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

do_start() {
  local t0=$(date +%s%N)
  write_conf
  # 1. munge: private socket/pid/log under $D so it never clashes with a system munged
  if ! alive "$D/munge/munged.pid"; then
    [[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
    chown munge:munge "$D/munge"; chmod 755 "$D/munge"   # munged insists on o+x for the socket dir
    runuser -u munge -- /usr/sbin/munged --socket="$D/munge/munge.socket.2" \
        --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" \
        --seed-file="$D/munge/munged.seed"
  fi
  # 1b. accounting: a private MariaDB (TCP on 127.0.0.1 only) and slurmdbd, before slurmctld
  if [[ "$ACCT" == 1 ]]; then
    if ! alive "$D/mysql/mariadbd.pid"; then
      if [[ ! -d "$D/mysql/data" ]]; then
        mkdir -p "$D/mysql"
        mariadb-install-db --no-defaults --datadir="$D/mysql/data" --user=root \
            --auth-root-authentication-method=socket --skip-test-db >"$D/mysql/install.log" 2>&1 \
          || { log "mariadb-install-db failed"; tail -20 "$D/mysql/install.log" >&2; exit 1; }
      fi
      /usr/sbin/mariadbd --no-defaults --datadir="$D/mysql/data" --user=root --port="$MYP" \
          --bind-address=127.0.0.1 --socket="$D/mysql/mysqld.sock" \
          --pid-file="$D/mysql/mariadbd.pid" --log-error="$D/mysql/error.log" --skip-log-bin \
          --innodb-buffer-pool-size=16M </dev/null >/dev/null 2>&1 &
      local deadline=$((SECONDS+60))
      until mariadb --no-defaults -S "$D/mysql/mysqld.sock" -u root -e "SELECT 1" >/dev/null 2>&1; do
        (( SECONDS < deadline )) || { log "MariaDB not up after 60s"; tail -20 "$D/mysql/error.log" >&2; exit 1; }
        sleep 0.2
      done
      mariadb --no-defaults -S "$D/mysql/mysqld.sock" -u root -e \
        "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'offcut-test';
         GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
    fi
    # slurmdbd reads slurmdbd.conf next to $SLURM_CONF (it has no -f)
    alive "$D/dbd/slurmdbd.pid" || /usr/sbin/slurmdbd
    local deadline=$((SECONDS+60))
    until sacctmgr -i -n list cluster >/dev/null 2>&1; do
      (( SECONDS < deadline )) || { log "slurmdbd not answering after 60s"; tail -20 "$D/dbd/slurmdbd.log" >&2; exit 1; }
      sleep 0.2
    done
    sacctmgr -i -n list cluster format=cluster | grep -qw testcluster \
      || sacctmgr -i add cluster testcluster >/dev/null
  fi
  # 2. slurmctld (forks into background, writes pid file)
  alive "$D/slurmctld.pid" || /usr/sbin/slurmctld -f "$SLURM_CONF"
  # 3. one slurmd per emulated node (Debian build has MULTIPLE_SLURMD=Yes)
  for i in $(seq 1 "$N"); do
    alive "$D/slurmd-n$i.pid" || /usr/sbin/slurmd -f "$SLURM_CONF" -N "n$i"
  done
  # 4. wait until every node is idle
  local deadline=$((SECONDS+60))
  until [[ "$(sinfo -h -N -p batch -t idle -o %N 2>/dev/null | wc -l)" -eq "$N" ]]; do
    (( SECONDS < deadline )) || { log "nodes not idle after 60s"; sinfo -N 2>&1 >&2 || true; exit 1; }
    sleep 0.2
  done
  log "cluster up: $N nodes idle in $(( ($(date +%s%N) - t0) / 1000000 )) ms; export SLURM_CONF=$SLURM_CONF"
}

stop_pids() {  # args: pid files. SIGTERM all at once, wait up to 15 s, then SIGKILL
  local f pid pids=()
  for f in "$@"; do
    pid=$(cat "$f" 2>/dev/null) || continue    # the daemons delete their own pid file on exit
    if kill -TERM "$pid" 2>/dev/null; then pids+=("$pid"); fi
  done
  for _ in $(seq 1 150); do
    local left=0 p
    for p in "${pids[@]}"; do if kill -0 "$p" 2>/dev/null; then left=1; fi; done
    (( left )) || return 0
    sleep 0.1
  done
  for p in "${pids[@]}"; do
    if kill -0 "$p" 2>/dev/null; then log "pid $p did not exit, SIGKILL"; kill -KILL "$p" || true; fi
  done
  return 0
}

do_stop() {
  # cancel jobs first so that no slurmstepd / job processes linger
  if scancel --quiet --full --user=root 2>/dev/null; then
    for _ in $(seq 1 100); do [[ -z "$(squeue -h -o %i 2>/dev/null)" ]] && break; sleep 0.1; done
  fi
  # each daemon needs ~1-2 s to exit after SIGTERM, so signal them together
  stop_pids "$D"/slurmd-n*.pid "$D/slurmctld.pid"   # slurmctld's child "slurmscriptd" exits with it
  if [[ "$ACCT" == 1 ]]; then
    stop_pids "$D/dbd/slurmdbd.pid"
    stop_pids "$D/mysql/mariadbd.pid"
  fi
  stop_pids "$D/munge/munged.pid"
  log "stopped"
}

case "${1:-start}" in
  install) do_install ;;
  start)   do_start ;;
  stop)    do_stop ;;
  status)  sinfo -N; squeue ;;
  conf)    write_conf; cat "$SLURM_CONF" ;;
  *) echo "usage: $0 install|start|stop|status|conf" >&2; exit 2 ;;
esac
