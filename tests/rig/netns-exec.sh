#!/bin/sh
# Open MPI's launch agent for the rig's "hosts" (--mca plm_rsh_agent THIS):
# mpirun calls it as ssh would be called, `netns-exec.sh HOST COMMAND...`,
# to start its daemon (orted) on HOST.  HOST is a host's address in the
# rig's hostfile; the rig's map file ($PX_RIG_MAP, "ADDRESS NAMESPACE" per
# line, written by netns_hosts.sh) names the network namespace that holds
# it, and the command runs there, through a shell as ssh would run it, in
# a UTS namespace of its own whose host name is the namespace's: the hosts
# share this machine's /tmp, and Open MPI names its session directories
# (and tells nodes apart) by host name.
host=$1
shift
[ -n "${PX_RIG_MAP:-}" ] && [ -r "$PX_RIG_MAP" ] || { echo "netns-exec.sh: PX_RIG_MAP is not set or unreadable" >&2; exit 255; }
ns=$(awk -v h="$host" '$1 == h { print $2; exit }' "$PX_RIG_MAP")
[ -n "$ns" ] || { echo "netns-exec.sh: no namespace for host $host in $PX_RIG_MAP" >&2; exit 255; }
exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname '$ns' && $*"
