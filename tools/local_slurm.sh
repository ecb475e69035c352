#!/usr/bin/env bash
# A throwaway single-node SLURM cluster on 127.0.0.1, for one command.
#
#   bash tools/local_slurm.sh [--cpus N] [--timeout SECS] -- COMMAND [ARGS...]
#
# What it is for: trying `srun`, `salloc` and `sbatch` with
# `python -m collectives worker` on one machine -- including the cluster
# template examples/cluster/slurm.sbatch (with --nodes=1) -- without a real
# cluster; CI runs the real-launcher tests inside it. For example:
#
#   bash tools/local_slurm.sh -- srun -n 2 --kill-on-bad-exit=1 \
#       python -m collectives worker --cpu-devices 4 -- check psum
#   bash tools/local_slurm.sh -- sbatch --wait --nodes=1 --ntasks-per-node=2 \
#       --export=ALL,CPU_DEVICES=4 examples/cluster/slurm.sbatch
#   bash tools/local_slurm.sh -- sinfo
#
# It starts munged, slurmctld and slurmd with everything (munge key and
# socket, slurm.conf, state, spool, logs, pid files) in a fresh `mktemp -d`
# directory, waits (at most 30 s) for the node to be idle, runs COMMAND with
# SLURM_CONF pointing at that slurm.conf (slurm.conf names the munge socket,
# so srun/salloc/sbatch/squeue/sinfo/scancel find this cluster; any other
# SLURM_* variables, e.g. of an outer job, are unset), and at the
# end -- also on failure, Ctrl-C or SIGTERM -- cancels the jobs, stops every
# daemon it started by its pid, and removes the directory. The exit status is
# COMMAND's (124 if --timeout ran out, 130/143/129 on Ctrl-C/SIGTERM/SIGHUP),
# or 1 if the cluster did not start (with the tail of each daemon's log).
# LOCAL_SLURM_KEEP=1 keeps the directory (logs, slurm.conf) when COMMAND
# fails. Start-up takes about 1-2 s, tear-down about 1.5 s (up to KillWait=5 s
# more when jobs have to be cancelled).
#
# Requirements: SLURM and MUNGE daemons and clients. Debian/Ubuntu:
#   apt-get install slurm-wlm munge
# (tested with SLURM 22.05.8 on Debian 12). No cgroups, no accounting, no
# system configuration: /etc/slurm and /etc/munge are not read or changed,
# and a real SLURM or munged on the same machine is not disturbed (the ports
# are picked free at start, the munge socket is private).
#
# Network: everything binds and talks on loopback only (slurmctld, slurmd
# and srun's ports; the node is NodeName=localhost NodeAddr=127.0.0.1). SLURM
# binds its listening sockets to the address the machine's hostname
# resolves to (CommunicationParameters=NoInAddrAny,NoCtldInAddrAny), so:
# - hostname resolves to 127.0.0.1: used as is;
# - otherwise (a LAN address, or Debian's 127.0.1.1, which breaks srun: the
#   step connects back to srun at 127.0.0.1, where srun does not listen),
#   as root where `unshare` is allowed: the script reruns itself in a
#   private UTS namespace whose hostname is `localhost` (COMMAND sees that
#   hostname too);
# - otherwise (non-root, or a container without CAP_SYS_ADMIN): the daemons
#   listen on all addresses, still talking over 127.0.0.1, and the script
#   says so.
#
# Users: all daemons run as the current user (SlurmUser = SlurmdUser = you).
# As root that is the usual setup. As a non-root user it works too (tested as
# `nobody`: sinfo, srun, sbatch): slurmd then cannot switch users, so only
# your own jobs run, which is all this is for.
#
# --cpus N: CPUs the node advertises (default max(4, nproc), so a 4-task job
# fits on a 2-core machine; SlurmdParameters=config_overrides keeps a node
# that advertises more CPUs than it has from being drained).

set -uo pipefail

usage() {
    sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

cpus=""
cmd_timeout=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cpus) [ $# -ge 2 ] || usage; cpus="$2"; shift 2 ;;
        --cpus=*) cpus="${1#--cpus=}"; shift ;;
        --timeout) [ $# -ge 2 ] || usage; cmd_timeout="$2"; shift 2 ;;
        --timeout=*) cmd_timeout="${1#--timeout=}"; shift ;;
        --) shift; break ;;
        -h|--help) usage ;;
        *) echo "local_slurm: unknown option '$1' (COMMAND goes after --)" >&2; usage ;;
    esac
done
[ $# -gt 0 ] || { echo "local_slurm: no COMMAND given" >&2; usage; }
if [ -z "$cpus" ]; then
    cpus=$(nproc 2>/dev/null || echo 1)
    [ "$cpus" -ge 4 ] || cpus=4
fi
case "$cpus" in ''|*[!0-9]*|0) echo "local_slurm: --cpus wants a positive integer, not '$cpus'" >&2; exit 2 ;; esac
case "$cmd_timeout" in ''|*[!0-9]*) echo "local_slurm: --timeout wants seconds, not '$cmd_timeout'" >&2; exit 2 ;; esac

say() { echo "local_slurm: $*" >&2; }

for tool in munged slurmctld slurmd sinfo squeue scancel timeout; do
    if ! command -v "$tool" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$tool" ]; then
        say "'$tool' not found; on Debian/Ubuntu: apt-get install slurm-wlm munge"
        exit 2
    fi
done
# A clean slate: an outer job's SLURM_JOB_ID & co. (e.g. when this runs
# inside a real allocation) would make srun look for that job here.
while read -r v; do unset "$v"; done < <(compgen -e | grep '^SLURM_')
# The daemons live in /usr/sbin, which a non-root PATH often lacks.
case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin" ;; esac

dir=""
munged_pid=""
ctld_pid=""
slurmd_pid=""
cmd_pid=""
cleaned=0

log_tails() {
    local d f
    for d in munged slurmctld slurmd; do
        f="$dir/log/$d.log"
        # A daemon's own output (.out) is shown only when it wrote no log
        # (it failed before opening it, e.g. on a bad slurm.conf).
        [ -s "$f" ] || f="${f%.log}.out"
        [ -s "$f" ] || continue
        echo "----- tail of $f -----" >&2
        # (without the fresh state directory's expected complaints)
        grep -v -e 'state file' -e 'Trying backup state' "$f" | tail -n 20 >&2
    done
}

# Stop a pid: SIGTERM, up to $2 seconds, then SIGKILL. Works for daemons that
# are our children (reaped by `wait`) and for those that forked away.
stop_pid() {
    local pid="$1" grace="${2:-10}" i
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for ((i = 0; i < grace * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        say "pid $pid ignored SIGTERM for ${grace}s; SIGKILL"
        kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
    return 0
}

# slurmstepd processes belonging to this cluster: slurmd starts one per job
# step, and they outlive slurmd. They are found by the log file in our
# directory that they keep open (slurmd's, inherited).
our_stepds() {
    local p
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = slurmstepd ] || continue
        if ls -l "$p/fd" 2>/dev/null | grep -qF "$dir/"; then
            echo "${p#/proc/}"
        fi
    done
}

# The pids of every descendant of the given pids (the tasks of a step).
descendants() {
    ps -e -o pid= -o ppid= 2>/dev/null | awk -v roots="$*" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
        { parent[$1] = $2 }
        END {
            do {
                grew = 0
                for (p in parent)
                    if (!(p in keep) && (parent[p] in keep)) { keep[p] = 2; grew = 1 }
            } while (grew)
            for (p in keep) if (keep[p] == 2) print p
        }'
}

cleanup() {
    local rc=$? i p stepds deadline
    [ "$cleaned" = 1 ] && return
    cleaned=1
    trap '' INT TERM HUP
    if [ -n "$cmd_pid" ] && kill -0 "$cmd_pid" 2>/dev/null; then
        say "stopping COMMAND (pid $cmd_pid)"
        stop_pid "$cmd_pid" 10
    fi
    if [ -n "$ctld_pid" ] && kill -0 "$ctld_pid" 2>/dev/null \
        && [ -n "$(timeout 10 squeue -h -o %i 2>/dev/null)" ]; then
        # Cancel whatever COMMAND left queued or running (sbatch without
        # --wait, salloc killed, ...); KillWait is 5 s.
        timeout 10 scancel --quiet --user="$user" 2>/dev/null
        deadline=$((SECONDS + 15))
        while [ "$SECONDS" -lt "$deadline" ]; do
            [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    if [ -n "$dir" ]; then
        for ((i = 0; i < 50; i++)); do
            stepds=$(our_stepds)
            [ -z "$stepds" ] && break
            sleep 0.1
        done
        if [ -n "$stepds" ]; then
            # Left over (slurmd died, or scancel did not reach them): kill
            # their tasks, then them.
            say "slurmstepd $(echo $stepds) still running; SIGKILL to them and their tasks"
            for p in $(descendants $stepds) $stepds; do
                kill -KILL "$p" 2>/dev/null
            done
        fi
    fi
    stop_pid "$slurmd_pid" 10
    stop_pid "$ctld_pid" 10
    stop_pid "$munged_pid" 5
    if [ -n "$dir" ]; then
        if [ "$rc" != 0 ] && [ "${LOCAL_SLURM_KEEP:-0}" = 1 ]; then
            say "kept $dir (LOCAL_SLURM_KEEP=1)"
        else
            rm -rf "$dir"
        fi
    fi
    return 0
}
trap 'cleanup' EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM
trap 'say "hung up"; exit 129' HUP

fail() {
    say "$*"
    log_tails
    exit 1
}

# A free TCP port on 127.0.0.1 (the kernel picks one; a small race with
# other programs remains, as with any such choice).
free_port() {
    local port i
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' && return
    fi
    for ((i = 0; i < 100; i++)); do
        port=$((20000 + RANDOM % 30000))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
    return 1
}

# --- addresses --------------------------------------------------------------
# The IPv4 address SLURM binds to with NoInAddrAny: the hostname's.
host_addr() { timeout 5 getent ahostsv4 "$(hostname)" 2>/dev/null | awk 'NR == 1 {print $1}'; }
addr=$(host_addr)
case "$addr" in
    127.0.0.1) ;;
    *)
        if [ "$(id -u)" = 0 ] && [ -z "${LOCAL_SLURM_UTS:-}" ] && command -v unshare >/dev/null 2>&1 \
            && unshare --uts -- true 2>/dev/null; then
            # Keep our stdin/stdout/stderr; the EXIT trap is not set yet.
            LOCAL_SLURM_UTS=1 exec unshare --uts -- bash -c 'hostname localhost && exec bash "$0" "$@"' \
                "$0" --cpus "$cpus" --timeout "$cmd_timeout" -- "$@"
        fi
        ;;
esac
case "$addr" in
    127.0.0.1)
        comm_params="CommunicationParameters=NoCtldInAddrAny,NoInAddrAny" ;;
    *)
        say "hostname '$(hostname)' resolves to '${addr:-nothing}', not 127.0.0.1: the daemons listen on all addresses (they still talk over 127.0.0.1)"
        addr=127.0.0.1
        comm_params="" ;;
esac

dir=$(mktemp -d "${TMPDIR:-/tmp}/local-slurm.XXXXXX") || { dir=""; say "mktemp -d failed"; exit 1; }
# 711 (and 711 for munge/): munged wants "execute for all" on its socket's
# directories; listing them stays private, and the key is 0400.
chmod 711 "$dir"
mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log" "$dir/run"
chmod 711 "$dir/munge"
user=$(id -un)

ctld_port=$(free_port) || fail "no free port"
slurmd_port=$(free_port) || fail "no free port"
while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(free_port) || fail "no free port"; done

first_job_id=$((1 + (RANDOM * 32768 + RANDOM) % 1000000))

# --- munge -----------------------------------------------------------------
key="$dir/munge/munge.key"
if command -v mungekey >/dev/null 2>&1; then
    mungekey --create --keyfile="$key" >/dev/null 2>&1 || rm -f "$key"
fi
if [ ! -s "$key" ]; then
    dd if=/dev/urandom of="$key" bs=1 count=1024 status=none || fail "could not write the munge key"
fi
chmod 400 "$key"
sock="$dir/munge/munge.socket"
# --force: start even where munged dislikes something about the paths
# (e.g. a world-writable /tmp above them) or finds a stale socket; the
# directory is ours alone. munged forks into the background once its
# socket is ready, so `timeout` bounds only the start.
timeout 10 munged --force --socket="$sock" --key-file="$key" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" --num-threads=2 \
    >"$dir/log/munged.out" 2>&1 \
    || { cat "$dir/log/munged.out" >&2; fail "munged did not start"; }
for ((i = 0; i < 50; i++)); do
    [ -s "$dir/run/munged.pid" ] && [ -S "$sock" ] && break
    sleep 0.1
done
munged_pid=$(cat "$dir/run/munged.pid" 2>/dev/null)
[ -n "$munged_pid" ] && [ -S "$sock" ] || fail "munged did not start (no pid file or socket)"

# --- slurm.conf -------------------------------------------------------------
conf="$dir/slurm.conf"
cat >"$conf" <<EOF
# Written by tools/local_slurm.sh; removed when it exits.
ClusterName=local
# Random first job id: JAX picks its coordinator port from SLURM_JOB_ID, so
# two of these clusters at once should not both start at job 1.
FirstJobId=$first_job_id
SlurmctldHost=localhost($addr)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
KillWait=5
# Reject a job that can never fit (more CPUs or nodes than there are) at
# once, instead of leaving it pending for ever.
EnforcePartLimits=ALL
InactiveLimit=0
MinJobAge=10
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
$comm_params
PlugStackConfig=$dir/plugstack.conf
NodeName=localhost NodeAddr=$addr CPUs=$cpus RealMemory=512 State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=UNLIMITED State=UP
EOF
: >"$dir/plugstack.conf"
export SLURM_CONF="$conf"

version=$(timeout 5 sinfo --version 2>/dev/null | awk '{print $2}')
echo "local SLURM ${version:-?} on $addr (ctld port $ctld_port, slurmd port $slurmd_port, conf $conf)" >&2

# --- daemons ----------------------------------------------------------------
# -D: stay in the foreground, so $! is the daemon's pid. Their output goes
# to the log dir too.
# setsid: in a session of their own, so that Ctrl-C in the terminal (sent
# to the whole foreground process group) does not stop them before the
# jobs are cancelled; munged detaches by itself. setsid does not fork here
# (we are not a process group leader), so $! is still the daemon's pid.
setsid=""
command -v setsid >/dev/null 2>&1 && setsid=setsid
$setsid slurmctld -D -f "$conf" >"$dir/log/slurmctld.out" 2>&1 </dev/null &
ctld_pid=$!
$setsid slurmd -D -N localhost -f "$conf" >"$dir/log/slurmd.out" 2>&1 </dev/null &
slurmd_pid=$!

state=""
deadline=$((SECONDS + 30))
while [ "$SECONDS" -lt "$deadline" ]; do
    kill -0 "$ctld_pid" 2>/dev/null || fail "slurmctld exited during start-up"
    kill -0 "$slurmd_pid" 2>/dev/null || fail "slurmd exited during start-up"
    state=$(timeout 5 sinfo -h -n localhost -o %t 2>/dev/null)
    [ "$state" = idle ] && break
    sleep 0.1
done
[ "$state" = idle ] || fail "node not idle after 30 s (state '${state:-none}')"

# --- COMMAND ----------------------------------------------------------------
# In the background (with our stdin), so that a SIGTERM or Ctrl-C reaches
# our trap at once instead of after COMMAND ends.
if [ "$cmd_timeout" -gt 0 ]; then
    timeout "$cmd_timeout" "$@" <&0 &
else
    "$@" <&0 &
fi
cmd_pid=$!
wait "$cmd_pid"
rc=$?
cmd_pid=""
[ "$rc" = 124 ] && [ "$cmd_timeout" -gt 0 ] && say "COMMAND timed out after ${cmd_timeout}s"
exit "$rc"
