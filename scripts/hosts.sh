#!/usr/bin/env bash
# A test bed of hosts on one machine: N "hosts", each its own network, mount (private /dev/shm, own /etc/hosts
# and /sys) and UTS (own host name) namespace, joined by veth pairs to a bridge, each link shaped with tc; Open MPI
# starts each host's daemon through an rsh agent that enters that host. See docs/comm.md, "Running across hosts
# (the test bed)".
#
#   hosts.sh up N R [--rate RATE] [--delay DELAY]   make N hosts with R slots each (RATE: tc units, 1gbit, 200mbit)
#   hosts.sh run [MPIRUN-OPTIONS --] CMD...          mpirun CMD over all N*R slots, from inside host 1
#   hosts.sh exec HOST CMD...                        run CMD inside one host (HOST: 2, h2 or 10.78.0.2)
#   hosts.sh bytes HOST                              that host's link counters: "h1 tx_bytes T rx_bytes R"
#   hosts.sh shape RATE|none [--delay DELAY]         re-shape every link of a running bed
#   hosts.sh info                                    the bed's hosts, files and mpirun flags
#   hosts.sh flags                                   mpirun's options for the bed without --hostfile, one line
#                                                    (for a launcher that writes its own: czrun --mpirun-args)
#   hosts.sh down [--all]                            remove the bed (--all: every bed), leftovers of a crash too
#   hosts.sh with N R [--rate RATE] [--delay DELAY] -- CMD...
#                                                    up, CMD (which may call "hosts.sh run"), down on any exit,
#                                                    signal included; exits with CMD's status
#
# Needs: root; iproute2 (ip, ip netns, tc with the tbf qdisc; netem only for --delay); util-linux (nsenter,
# unshare, setsid, flock); Open MPI's mpirun. Installs nothing: these come with Debian's iproute2 and
# util-linux (build.sh's package list has the rest). Exit status 77 from up/with means "cannot make
# namespaces here" (not root, or no network namespaces), for tests to skip on.
#
# Environment: CZ_HOSTS_BED names the bed (default cz; [a-z0-9], at most 8 characters) so that several beds can
# exist at once; CZ_HOSTS_THREADS overrides the per-rank thread count that "run" passes as OMP_NUM_THREADS.
#
# Layout (Note [Host namespaces]):
#   namespace czhosts-BED-sw   the switch: bridge br0 and one port pI per host, nothing else
#   namespace czhosts-BED-hI   host I: eth0 = 10.78.0.I/24, host name BED-hI, private /dev/shm and /etc/hosts
#   /run/cz-hosts/BED/         hostfile, rsh agent, etc_hosts, holder pids, settings, and tmp/: Open MPI's
#                              session directories (orte_tmpdir_base), which a killed mpirun leaves behind,
#                              removed with the bed
# No address is given to the machine's own namespace: mpirun runs inside host 1, so nothing of the bed is
# reachable from, or routed to, anywhere else. The same /24 can serve several beds at once.
#
# Note [Host namespaces]: a host's mount and UTS namespaces are held by one sleeping process per host (its
# "holder", started by setsid), and everything enters a host with `nsenter -t HOLDER -n -m -u`. Bind-mounting
# the namespaces to files (unshare --mount=FILE) would need no process, but a mount namespace bound to a file
# made after host 1's mount namespace is invisible inside host 1, where mpirun and the rsh agent run; a pid is
# visible everywhere (one pid namespace). The network namespace is also a named `ip netns` one, so `ip netns
# list`, `ip -n` and `ip netns pids` see it. A dead holder is detected ("run" refuses) and `down` removes the
# bed whatever state it is in: it kills every process left in the bed's network namespaces (`ip netns pids`:
# holders, stray daemons and ranks), deletes the switch-side veth ends explicitly and waits until they are gone
# (a deleted namespace's devices go asynchronously, and a host re-made at once then lacked its veth and its
# address: Open MPI's "Did not find interface matching this subnet"), then the namespaces, then the files.
set -euo pipefail

readonly kPrefix=czhosts
readonly kState=/run/cz-hosts
readonly kSubnet=10.78.0  # /24; host I is .I, so at most 254 hosts
bed=${CZ_HOSTS_BED:-cz}

die() { echo "hosts.sh: $*" >&2; exit 1; }
note() { echo "hosts.sh: $*" >&2; }
[[ $bed =~ ^[a-z0-9]{1,8}$ ]] || die "CZ_HOSTS_BED must be 1-8 characters of [a-z0-9], got '$bed'"

sw_ns() { echo "$kPrefix-$1-sw"; }
host_ns() { echo "$kPrefix-$1-h$2"; }
state_dir() { echo "$kState/$1"; }

# Seconds-bounded wait: wait_for TIMEOUT_S DESCRIPTION COMMAND...
wait_for() {
  local limit=$1 what=$2; shift 2
  local i
  for ((i = 0; i < limit * 20; ++i)); do "$@" && return 0; sleep 0.05; done
  die "timed out after ${limit} s waiting for $what"
}

# Can this process make namespaces? Exit 77 (skip) if not.
require_namespaces() {
  if [[ $(id -u) -ne 0 ]]; then echo "SKIP: hosts.sh needs root to make network namespaces" >&2; exit 77; fi
  local t
  for t in ip tc nsenter unshare setsid flock; do
    command -v "$t" > /dev/null || { echo "SKIP: hosts.sh needs '$t' (iproute2 / util-linux)" >&2; exit 77; }
  done
  local probe="$kPrefix-probe$$"
  if ! ip netns add "$probe" 2> /dev/null; then
    echo "SKIP: cannot make network namespaces here ('ip netns add' failed)" >&2; exit 77
  fi
  local ok=1
  nsenter --net="/run/netns/$probe" unshare --mount --uts --propagation private true 2> /dev/null || ok=0
  ip netns del "$probe"
  ((ok)) || { echo "SKIP: cannot make mount/UTS namespaces here (unshare failed)" >&2; exit 77; }
}

# "1gbit" -> bytes per second (tc's bit units only; tc's "mbps" means megabytes and is not accepted).
rate_bytes_per_s() {
  local r=${1,,}
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit)$ ]] ||
    die "rate '$1': give a number and one of bit, kbit, mbit, gbit, tbit (e.g. 1gbit, 200mbit)"
  local mult
  case ${BASH_REMATCH[3]} in
    bit) mult=1 ;; kbit) mult=1000 ;; mbit) mult=1000000 ;; gbit) mult=1000000000 ;; tbit) mult=1000000000000 ;;
  esac
  awk -v n="${BASH_REMATCH[1]}" -v m="$mult" 'BEGIN { printf "%.0f\n", n * m / 8 }'
}

# Shapes one device's egress: tbf at RATE (bucket: 4 ms at the rate, at least 128 KiB so that a 64 KiB GSO
# packet fits), under netem's delay when DELAY is given. RATE "none": the device's default qdisc.
shape_dev() {
  local ns=$1 dev=$2 rate=$3 delay=$4
  tc -n "$ns" qdisc del dev "$dev" root 2> /dev/null || true
  [[ $rate == none && -z $delay ]] && return 0
  local parent=root
  if [[ -n $delay ]]; then
    tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 100000 2> /dev/null ||
      die "tc netem is not available in this kernel (no sch_netem): --delay cannot be honoured"
    parent="parent 1:"
  fi
  if [[ $rate != none ]]; then
    local bps burst
    bps=$(rate_bytes_per_s "$rate")
    burst=$((bps / 250 > 131072 ? bps / 250 : 131072))
    # shellcheck disable=SC2086
    tc -n "$ns" qdisc add dev "$dev" $parent handle 2: tbf rate "$rate" burst "$burst" latency 100ms
  fi
}

load_settings() {
  local dir
  dir=$(state_dir "$bed")
  [[ -f $dir/settings ]] || die "no bed '$bed' (run: hosts.sh up N R)"
  # shellcheck source=/dev/null
  source "$dir/settings"  # n, r, rate, delay
}

# Host argument (2, h2, BED-h2, 10.78.0.2) -> index.
host_index() {
  local h=$1 i
  case $h in
    "$kSubnet".*) i=${h#"$kSubnet".} ;;
    "$bed"-h*) i=${h#"$bed"-h} ;;
    h*) i=${h#h} ;;
    *) i=$h ;;
  esac
  [[ $i =~ ^[0-9]+$ ]] && ((i >= 1 && i <= n)) || die "no host '$h' in bed '$bed' (hosts 1-$n)"
  echo "$i"
}

holder_pid() {  # holder_pid I: the pid, after checking it still holds host I
  local i=$1 pid dir
  dir=$(state_dir "$bed")
  pid=$(cat "$dir/h$i.pid" 2> /dev/null) || die "host $i of bed '$bed' has no holder pid; run hosts.sh down"
  alive "$pid" && [[ $(stat -L -c %i "/proc/$pid/ns/net") == $(stat -L -c %i "/run/netns/$(host_ns "$bed" "$i")") ]] ||
    die "host $i of bed '$bed' lost its holder process (pid $pid); run hosts.sh down, then up"
  echo "$pid"
}

# A process that has not exited (a zombie has: its parent may be slow to reap it).
alive() { [[ -r /proc/$1/stat ]] && ! awk '{ exit $3 == "Z" ? 0 : 1 }' "/proc/$1/stat" 2> /dev/null; }

# Removes one bed, whatever is left of it.
down_bed() {
  local b=$1 sw dir ns pids
  sw=$(sw_ns "$b")
  dir=$(state_dir "$b")
  local spaces
  spaces=$(ip netns list 2> /dev/null | awk '{ print $1 }' | grep -E "^$kPrefix-$b-(sw|h[0-9]+)$" || true)
  # Every process inside the bed (holders, daemons, ranks): TERM, then KILL what is left after 2 s.
  pids=""
  for ns in $spaces; do pids+=" $(ip netns pids "$ns" 2> /dev/null | tr '\n' ' ')"; done
  if [[ -n ${pids// /} ]]; then
    # shellcheck disable=SC2086
    kill -TERM $pids 2> /dev/null || true
    local p left i
    for ((i = 0; i < 40; ++i)); do
      left=""
      for p in $pids; do alive "$p" && left+=" $p"; done
      [[ -z $left ]] && break
      sleep 0.05
    done
    # shellcheck disable=SC2086
    [[ -n $left ]] && kill -KILL $left 2> /dev/null || true
  fi
  # The switch-side veth ends, explicitly (their peers, the hosts' eth0, go with them), and the bridge.
  if grep -qx "$sw" <<< "$spaces"; then
    local port
    for port in $(ip -n "$sw" -o link show 2> /dev/null | awk -F': ' '{ print $2 }' | sed 's/@.*//' | grep -E '^p[0-9]+$' || true); do
      ip -n "$sw" link del "$port" 2> /dev/null || true
    done
    ip -n "$sw" link del br0 2> /dev/null || true
    port_gone() { ! ip -n "$sw" -o link show 2> /dev/null | grep -qE ': (p[0-9]+|br0)[@:]'; }
    wait_for 10 "the veths of bed '$b' to go" port_gone
  fi
  for ns in $spaces; do ip netns del "$ns" 2> /dev/null || true; done
  ns_gone() { ! ip netns list | awk '{ print $1 }' | grep -qE "^$kPrefix-$b-(sw|h[0-9]+)$"; }
  wait_for 10 "the namespaces of bed '$b' to go" ns_gone
  rm -rf "$dir"
}

cmd_down() {
  [[ $(id -u) -eq 0 ]] || die "down needs root"
  mkdir -p "$kState"
  if [[ ${1:-} == --all ]]; then
    local beds b
    beds=$( (ls "$kState" 2> /dev/null; ip netns list 2> /dev/null | awk '{ print $1 }' |
      sed -nE "s/^$kPrefix-([a-z0-9]+)-(sw|h[0-9]+)$/\1/p") | sort -u)
    for b in $beds; do
      [[ $b =~ ^[a-z0-9]{1,8}$ ]] || continue
      (flock 9; down_bed "$b") 9> "$kState/.$b.lock"
      rm -f "$kState/.$b.lock"
    done
  else
    (flock 9; down_bed "$bed") 9> "$kState/.$bed.lock"
    rm -f "$kState/.$bed.lock"
  fi
}

# Starts host I's holder: in its network namespace, new mount and UTS namespaces with a private /dev/shm
# (Open MPI's shared-memory segments of two hosts' local ranks collide otherwise), the bed's /etc/hosts and
# the host name; then it sleeps, keeping them alive.
start_holder() {
  local i=$1 dir=$2 ns name
  ns=$(host_ns "$bed" "$i")
  name="$bed-h$i"
  rm -f "$dir/h$i.pid"
  setsid nsenter --net="/run/netns/$ns" unshare --mount --uts --propagation private sh -c '
    set -e
    mount -t tmpfs -o mode=1777 tmpfs /dev/shm
    mount --bind "$1/etc_hosts" /etc/hosts
    mkdir -p "$1/sys.h$3"
    mount -t sysfs sysfs "$1/sys.h$3"
    mount --rbind /sys/fs/cgroup "$1/sys.h$3/fs/cgroup"
    mount --move "$1/sys.h$3" /sys
    rmdir "$1/sys.h$3"
    hostname "$2"
    cd /
    echo $$ > "$1/h$3.pid.tmp" && mv "$1/h$3.pid.tmp" "$1/h$3.pid"
    exec sleep infinity' holder "$dir" "$name" "$i" < /dev/null > /dev/null 2>&1 9>&- &
  wait_for 10 "host $i's holder to start" test -s "$dir/h$i.pid"
}

links_ready() {  # every host's eth0 and every bridge port up, forwarding, with its address
  local i
  for ((i = 1; i <= n; ++i)); do
    ip -n "$(host_ns "$bed" "$i")" -o link show eth0 | grep -q 'state UP' || return 1
    ip -n "$(host_ns "$bed" "$i")" -4 -o addr show eth0 | grep -q "$kSubnet.$i/24" || return 1
    bridge -n "$(sw_ns "$bed")" link show dev "p$i" 2> /dev/null | grep -q 'state forwarding' || return 1
  done
}

cmd_up() {
  (($# >= 2)) || die "usage: hosts.sh up N R [--rate RATE] [--delay DELAY]"
  n=$1 r=$2; shift 2
  rate=none delay=""
  while (($#)); do
    case $1 in
      --rate) rate=${2:?--rate needs a value}; shift 2 ;;
      --delay) delay=${2:?--delay needs a value}; shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 254)) || die "N must be 1-254 hosts, got '$n'"
  [[ $r =~ ^[0-9]+$ ]] && ((r >= 1)) || die "R must be at least 1 slot per host, got '$r'"
  [[ $rate == none ]] || rate_bytes_per_s "$rate" > /dev/null
  require_namespaces
  mkdir -p "$kState"
  exec 9> "$kState/.$bed.lock"
  flock 9
  down_bed "$bed"  # leftovers of an earlier run or crash
  # A bed that failed half-way is removed, not left for the next "up".
  up_done=0
  trap '((up_done)) || down_bed "$bed" > /dev/null 2>&1 || true' EXIT
  local dir sw i ns
  dir=$(state_dir "$bed")
  sw=$(sw_ns "$bed")
  mkdir -p "$dir/tmp"
  {
    echo "127.0.0.1 localhost"
    for ((i = 1; i <= n; ++i)); do echo "$kSubnet.$i $bed-h$i"; done
  } > "$dir/etc_hosts"
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 1; i <= n; ++i)); do
    ns=$(host_ns "$bed" "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Both ends made inside namespaces: no name in the machine's namespace that a leftover could clash with.
    ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "p$i" master br0
    ip -n "$sw" link set "p$i" up
    ip -n "$ns" addr add "$kSubnet.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    start_holder "$i" "$dir"
  done
  # Open MPI fails to start daemons on a host whose link is not up yet.
  wait_for 10 "every link of bed '$bed' to come up" links_ready
  {
    echo "n=$n"
    echo "r=$r"
    echo "rate=$rate"
    echo "delay=$delay"
  } > "$dir/settings"
  for ((i = 1; i <= n; ++i)); do echo "$kSubnet.$i slots=$r"; done > "$dir/hostfile"
  write_agent "$dir"
  apply_shape
  # shellcheck disable=SC2034  # read by the EXIT trap above
  up_done=1
  note "bed '$bed': $n hosts x $r slots, link rate ${rate/none/unshaped}${delay:+, delay $delay}; hostfile $dir/hostfile"
}

# The rsh agent Open MPI calls as `AGENT [OPTIONS] HOST COMMAND...` (like ssh): it enters HOST's namespaces
# through its holder's pid and runs COMMAND with sh, as sshd would with the user's shell.
write_agent() {
  local dir=$1 i
  {
    echo '#!/bin/sh'
    echo "# rsh agent for Open MPI into the hosts of bed '$bed' (written by scripts/hosts.sh up)."
    echo 'while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done'
    echo 'host=$1; shift'
    echo 'case $host in'
    for ((i = 1; i <= n; ++i)); do
      echo "  $kSubnet.$i|$bed-h$i) pid=\$(cat '$dir/h$i.pid') ;;"
    done
    echo "  *) echo \"rsh agent of bed '$bed': unknown host '\$host'\" >&2; exit 255 ;;"
    echo 'esac'
    echo 'exec nsenter -t "$pid" -n -m -u -w"$PWD" sh -c "$*"'
  } > "$dir/agent"
  chmod +x "$dir/agent"
}

apply_shape() {
  local i
  for ((i = 1; i <= n; ++i)); do
    shape_dev "$(host_ns "$bed" "$i")" eth0 "$rate" "$delay"  # what host i sends
    shape_dev "$(sw_ns "$bed")" "p$i" "$rate" ""              # what host i receives
  done
}

cmd_shape() {
  (($# >= 1)) || die "usage: hosts.sh shape RATE|none [--delay DELAY]"
  load_settings
  rate=$1 delay=""
  shift
  [[ ${1:-} == --delay ]] && delay=${2:?--delay needs a value}
  [[ $rate == none ]] || rate_bytes_per_s "$rate" > /dev/null
  exec 9> "$kState/.$bed.lock"
  flock 9
  apply_shape
  sed -i -e "s/^rate=.*/rate=$rate/" -e "s/^delay=.*/delay=$delay/" "$(state_dir "$bed")/settings"
  note "bed '$bed': link rate ${rate/none/unshaped}${delay:+, delay $delay}"
}

# Threads per rank: the hosts share this machine's cores, but each rank would size its OpenMP pool from the
# ranks on its own host (3 hosts x 1 rank ran 6 spinning threads on 2 cores, 10x slower).
threads_per_rank() {
  if [[ -n ${CZ_HOSTS_THREADS:-} ]]; then echo "$CZ_HOSTS_THREADS"; return; fi
  local cores
  cores=$(nproc)
  echo $((cores / (n * r) > 1 ? cores / (n * r) : 1))
}

# --bind-to none: each host's daemon would bind its own ranks from core 0 up, putting every host's rank 0 on
# the same core of the machine they share.
mpirun_flags() {
  echo --hostfile "$(state_dir "$bed")/hostfile" "$(mpirun_flags_no_hostfile)"
}
mpirun_flags_no_hostfile() {
  local dir
  dir=$(state_dir "$bed")
  echo --allow-run-as-root --mca plm_rsh_agent "$dir/agent" \
    --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include "$kSubnet.0/24" \
    --mca btl_tcp_if_include "$kSubnet.0/24" --mca btl tcp,self,vader --bind-to none \
    --mca orte_tmpdir_base "$dir/tmp"
}

cmd_run() {
  load_settings
  local extra=() i
  for ((i = 1; i <= $#; ++i)); do
    if [[ ${!i} == -- ]]; then extra=("${@:1:i-1}"); set -- "${@:i+1}"; break; fi
  done
  (($#)) || die "usage: hosts.sh run [MPIRUN-OPTIONS --] CMD..."
  local pid threads
  for ((i = 1; i <= n; ++i)); do pid=$(holder_pid "$i"); done
  pid=$(holder_pid 1)
  threads=$(threads_per_rank)
  note "$n hosts x $r ranks on $(nproc) cores: OMP_NUM_THREADS=$threads per rank"
  # shellcheck disable=SC2046
  exec nsenter -t "$pid" -n -m -u -w"$PWD" mpirun $(mpirun_flags) -x OMP_NUM_THREADS="$threads" \
    "${extra[@]}" "$@"
}

cmd_exec() {
  (($# >= 2)) || die "usage: hosts.sh exec HOST CMD..."
  load_settings
  local i
  i=$(host_index "$1")
  shift
  exec nsenter -t "$(holder_pid "$i")" -n -m -u -w"$PWD" "$@"
}

cmd_bytes() {
  (($# == 1)) || die "usage: hosts.sh bytes HOST"
  load_settings
  local i
  i=$(host_index "$1")
  ip -n "$(host_ns "$bed" "$i")" -s link show dev eth0 |
    awk -v h="h$i" '/RX:/ { getline; rx = $1 } /TX:/ { getline; tx = $1 }
                    END { printf "%s tx_bytes %s rx_bytes %s\n", h, tx, rx }'
}

cmd_info() {
  load_settings
  local dir i
  dir=$(state_dir "$bed")
  echo "bed $bed: $n hosts x $r slots, rate ${rate/none/unshaped}${delay:+, delay $delay}"
  for ((i = 1; i <= n; ++i)); do
    echo "  h$i  $kSubnet.$i  host name $bed-h$i  namespace $(host_ns "$bed" "$i")  holder $(holder_pid "$i")"
  done
  echo "hostfile $dir/hostfile"
  echo "agent    $dir/agent"
  echo "mpirun   $(mpirun_flags) -x OMP_NUM_THREADS=$(threads_per_rank)   (run from inside host 1)"
}

cmd_flags() {
  load_settings
  echo "$(mpirun_flags_no_hostfile) -x OMP_NUM_THREADS=$(threads_per_rank)"
}

cmd_with() {
  local self up_args cmd
  self=$(readlink -f "$0")
  source "$(dirname "$self")/run_child.sh"
  with_args "usage: hosts.sh with N R [--rate RATE] [--delay DELAY] -- CMD..." "$@"
  trap '"$self" down >&2 || true' EXIT
  "$self" up "${up_args[@]}" || exit $?
  export CZ_HOSTS_BED=$bed
  run_child "${cmd[@]}"
}

sub=${1:-}
(($#)) && shift
case $sub in
  up) cmd_up "$@" ;;
  down) cmd_down "$@" ;;
  run) cmd_run "$@" ;;
  exec) cmd_exec "$@" ;;
  bytes) cmd_bytes "$@" ;;
  shape) cmd_shape "$@" ;;
  info) cmd_info ;;
  flags) cmd_flags ;;
  with) cmd_with "$@" ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
