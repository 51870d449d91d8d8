#!/usr/bin/env bash
# Several "hosts" on one machine for the rig's tests and benchmarks: each
# host is a network namespace with one veth link into a bridge in the
# root namespace; host i has address 10.77.0.i/24, the bridge 10.77.0.254
# (where mpirun itself runs and its daemons call back to).  Links are
# shaped with tc on both ends of each veth: netem (rate and delay) where
# the kernel has it, else tbf (rate only; the delay is then not applied
# and `up`/`shape` say so).
#
#   netns_hosts.sh check                  exit 0 if this machine can make the rig, else
#                                         print why and exit 77 (not root, no ip, no netns)
#   netns_hosts.sh up DIR N [RATE DELAY]  make N hosts (1-8); DIR receives hostfile
#                                         (one "ADDRESS slots=1" a host), map ("ADDRESS
#                                         NAMESPACE", for netns-exec.sh) and names (what
#                                         `down` removes); RATE like 1gbit, DELAY like 0.1ms
#   netns_hosts.sh shape DIR RATE DELAY   reshape every link ("none": unshaped)
#   netns_hosts.sh down DIR               remove the namespaces, links and bridge (idempotent)
#
# Only one rig at a time may use 10.77.0.0/24: callers hold a lock
# (flock /tmp/plexus-rig.lock), as tests/rig/test_rig.sh does.  Use
#   mpirun --hostfile DIR/hostfile --mca plm_rsh_agent tests/rig/netns-exec.sh \
#     --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24
# with PX_RIG_MAP=DIR/map in the environment.
set -euo pipefail

SUBNET=10.77.0
why_not() { echo "rig: skipped: $*" >&2; exit 77; }

check() {
  [ "$(id -u)" -eq 0 ] || why_not "not root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)"
  command -v ip >/dev/null || why_not "no ip command (Debian package iproute2)"
  command -v tc >/dev/null || why_not "no tc command (Debian package iproute2)"
  local ns="pxchk$$"
  ip netns add "$ns" 2>/dev/null || why_not "ip netns add fails here (the kernel or container forbids network namespaces)"
  local ok=1
  ip netns exec "$ns" ip link set lo up 2>/dev/null || ok=0
  ip link add "${ns}a" type veth peer name "${ns}b" 2>/dev/null || ok=0
  ip link del "${ns}a" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  [ "$ok" = 1 ] || why_not "namespaces can be made but veth links cannot (ip link add ... type veth fails)"
}

# shape_dev [ip netns exec NS] DEV RATE DELAY: one end of a link.
shape_dev() {
  local pre=() dev rate delay
  if [ "$1" = ip ]; then pre=("$1" "$2" "$3" "$4"); shift 4; fi
  dev=$1 rate=$2 delay=$3
  "${pre[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true
  [ "$rate" = none ] && { echo unshaped; return; }
  if "${pre[@]}" tc qdisc add dev "$dev" root netem rate "$rate" delay "$delay" limit 10000 2>/dev/null; then
    echo "netem rate $rate delay $delay"
  else
    # tbf: a bucket of 1 ms at the rate (at least 64 KiB), packets wait up to 50 ms.
    "${pre[@]}" tc qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 50ms
    echo "tbf rate $rate (no netem in this kernel: delay $delay not applied)"
  fi
}

shape() {
  local dir=$1 rate=$2 delay=$3 how="" tag n i
  tag=$(awk '$1 == "tag" { print $2 }' "$dir/names")
  n=$(awk '$1 == "hosts" { print $2 }' "$dir/names")
  for ((i = 1; i <= n; i++)); do
    how=$(shape_dev "${tag}r$i" "$rate" "$delay")
    shape_dev ip netns exec "${tag}-h$i" "${tag}h$i" "$rate" "$delay" >/dev/null
  done
  echo "rig: $n links shaped: $how" >&2
}

up() {
  local dir=$1 n=$2 rate=${3:-none} delay=${4:-0ms} tag i
  [[ "$n" =~ ^[1-8]$ ]] || { echo "rig: up: N must be 1-8, got $n" >&2; exit 2; }
  mkdir -p "$dir"
  tag="px$(( $$ % 100000 ))"
  : >"$dir/hostfile"; : >"$dir/map"
  printf 'tag %s\nhosts %s\n' "$tag" "$n" >"$dir/names"
  ip link add "${tag}br" type bridge
  ip addr add "$SUBNET.254/24" dev "${tag}br"
  ip link set "${tag}br" up
  for ((i = 1; i <= n; i++)); do
    local ns="${tag}-h$i"
    ip netns add "$ns"
    ip link add "${tag}r$i" type veth peer name "${tag}h$i"
    ip link set "${tag}h$i" netns "$ns"
    ip link set "${tag}r$i" master "${tag}br"
    ip link set "${tag}r$i" up
    ip netns exec "$ns" ip link set lo up
    ip netns exec "$ns" ip addr add "$SUBNET.$i/24" dev "${tag}h$i"
    ip netns exec "$ns" ip link set "${tag}h$i" up
    echo "$SUBNET.$i slots=1" >>"$dir/hostfile"
    echo "$SUBNET.$i $ns" >>"$dir/map"
  done
  shape "$dir" "$rate" "$delay"
  echo "rig: $n hosts up ($(tr '\n' ' ' <"$dir/map"))" >&2
}

down() {
  local dir=$1 tag n i
  [ -f "$dir/names" ] || return 0
  tag=$(awk '$1 == "tag" { print $2 }' "$dir/names")
  n=$(awk '$1 == "hosts" { print $2 }' "$dir/names")
  for ((i = 1; i <= n; i++)); do
    # Processes left in a namespace (a daemon of a failed run) go with it.
    for pid in $(ip netns pids "${tag}-h$i" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip link del "${tag}r$i" 2>/dev/null || true
    ip netns del "${tag}-h$i" 2>/dev/null || true
  done
  ip link del "${tag}br" 2>/dev/null || true
  rm -f "$dir/names"
}

case "${1:-}" in
  check) check ;;
  up) shift; up "$@" ;;
  shape) shift; shape "$@" ;;
  down) shift; down "$@" ;;
  *) sed -n '2,24p' "$0" >&2; exit 2 ;;
esac
