#!/usr/bin/env bash
# A real two-node Slurm cluster on one machine, for the end-to-end tests (tests/slurm/).
#
#   ci/slurm-cluster.sh start   # idempotent; prints `export SLURM_CONF=…`
#   ci/slurm-cluster.sh stop    # kills the daemons, deletes the namespaces, restores /etc/hosts
#   ci/slurm-cluster.sh status
#
# Debian's munge, slurmctld on this host, and one slurmd per node. Each node is its own network
# namespace (a veth to a bridge on a private /24 that only these namespaces use) and its own UTS
# namespace with its hostname: torchrun's c10d host election and MASTER_ADDR go by hostname, so
# nodes sharing one hostname never rendezvous. slurmd is started through nsenter + unshare, not
# `ip netns exec`, which remounts /sys and hides the cgroup mounts slurmd's cgroup plugin needs.
# Root only. State (config, spool, logs) under $HALO_SCRATCH/slurm.
set -euo pipefail

NODES=(n1 n2)
NET=10.77.0
BRIDGE=halo-slurm0
MARK="# halo-slurm-cluster"
STATE="${HALO_SCRATCH:-/tmp/halo-scratch}/slurm"
CONF="$STATE/slurm.conf"
CPUS=$(nproc)
HOST=$(hostname)

log() { printf 'slurm-cluster: %s\n' "$*" >&2; }

node_addr() { echo "$NET.$((10 + $1))"; } # n1 -> .11, n2 -> .12

write_conf() {
  mkdir -p "$STATE/ctld" "$STATE/spool" "$STATE/log"
  local tmp="$CONF.tmp.$$"
  {
    echo "ClusterName=halo"
    echo "SlurmctldHost=$HOST($NET.1)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "StateSaveLocation=$STATE/ctld"
    echo "SlurmdSpoolDir=$STATE/spool/%n"
    echo "SlurmctldPidFile=$STATE/slurmctld.pid"
    echo "SlurmdPidFile=$STATE/slurmd-%n.pid"
    echo "SlurmctldLogFile=$STATE/log/slurmctld.log"
    echo "SlurmdLogFile=$STATE/log/slurmd-%n.log"
    echo "SchedulerType=sched/backfill"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "JobCompType=jobcomp/none"
    # Finished jobs stay visible to `scontrol show job` (no accounting database here).
    echo "MinJobAge=600"
    echo "KillWait=30"
    echo "SlurmdTimeout=60"
    echo "InactiveLimit=0"
    local i=1
    for n in "${NODES[@]}"; do
      echo "NodeName=$n NodeAddr=$(node_addr $i) CPUs=$CPUS State=UNKNOWN"
      i=$((i + 1))
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
  } >"$tmp"
  mv "$tmp" "$CONF"
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  [ -s /etc/munge/munge.key ] || { log "no /etc/munge/munge.key (install Debian's munge)"; exit 1; }
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  touch "$STATE/munged.ours" # stop ends only a munged this script started
  for _ in $(seq 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.5; done
  log "munged did not come up"; exit 1
}

net_up() {
  ip link show "$BRIDGE" >/dev/null 2>&1 || {
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
  }
  ip link set "$BRIDGE" up
  local i=1
  for n in "${NODES[@]}"; do
    if [ ! -e "/var/run/netns/$n" ]; then
      ip netns add "$n"
      ip link add "veth-$n" type veth peer name eth0 netns "$n"
      ip link set "veth-$n" master "$BRIDGE" up
      ip -n "$n" addr add "$(node_addr $i)/24" dev eth0
      ip -n "$n" link set eth0 up
      ip -n "$n" link set lo up
    fi
    i=$((i + 1))
  done
}

hosts_add() {
  hosts_remove
  {
    local i=1
    for n in "${NODES[@]}"; do echo "$(node_addr $i) $n $MARK"; i=$((i + 1)); done
  } >>/etc/hosts
}

hosts_remove() {
  # In place (not a rename): /etc/hosts may be a bind mount.
  local kept
  kept=$(grep -v -F "$MARK" /etc/hosts || true)
  printf '%s\n' "$kept" >/etc/hosts
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  write_conf
  start_munge
  net_up
  hosts_add
  export SLURM_CONF="$CONF"
  if ! pid_alive "$STATE/slurmctld.pid"; then
    /usr/sbin/slurmctld -f "$CONF"
  fi
  for n in "${NODES[@]}"; do
    pid_alive "$STATE/slurmd-$n.pid" && continue
    mkdir -p "$STATE/spool/$n"
    nsenter --net="/var/run/netns/$n" unshare --uts \
      sh -c "hostname $n; exec /usr/sbin/slurmd -f '$CONF' -N $n"
  done
  for _ in $(seq 60); do
    if [ "$(sinfo -h -N -o '%t' 2>/dev/null | grep -c -E '^idle|^mix|^alloc')" -eq "${#NODES[@]}" ]; then
      log "up: ${NODES[*]} idle (SLURM_CONF=$CONF)"
      echo "export SLURM_CONF=$CONF"
      return
    fi
    sleep 1
  done
  sinfo -N >&2 || true
  tail -5 "$STATE"/log/*.log >&2 || true
  log "nodes did not become idle"; exit 1
}

stop() {
  for f in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid"; do
    [ -s "$f" ] || continue
    kill "$(cat "$f")" 2>/dev/null || true
  done
  for f in "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid"; do
    [ -s "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$f"
  done
  for n in "${NODES[@]}"; do
    # Job steps left in a node's namespace would keep it alive: end them by their namespace.
    if [ -e "/var/run/netns/$n" ]; then
      for pid in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
      ip link del "veth-$n" 2>/dev/null || true
      ip netns del "$n" 2>/dev/null || true
    fi
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  if [ -e "$STATE/munged.ours" ] && [ -s /run/munge/munged.pid ]; then
    kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
    rm -f "$STATE/munged.ours"
  fi
  hosts_remove
  log "stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) SLURM_CONF="$CONF" sinfo -N ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
