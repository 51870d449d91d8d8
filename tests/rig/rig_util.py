"""rig_util.py -- what the rig's fault tests share: making the rig of
network-namespace hosts (netns_hosts.sh) under its lock, removing it on
every exit, the mpiexec command that runs across its hosts over TCP with
Open MPI's daemon keepalive lowered (so a host cut off is noticed in ~3 s,
not 8 minutes), cutting a host's link, and finding plexus processes left
in the hosts."""

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import cli_util as cu  # noqa: E402

RIG = os.path.join(HERE, "netns_hosts.sh")
AGENT = os.path.join(HERE, "netns-exec.sh")


class Rig:
    """Rig(name, hosts): skips (exit 77, the reason printed) where the rig
    cannot be made or plexus has no MPI; up() makes it, down() removes it
    (also on SIGTERM/SIGINT, e.g. ctest's timeout)."""

    def __init__(self, name, hosts=2):
        self.name, self.hosts = name, hosts
        chk = subprocess.run(["bash", RIG, "check"], capture_output=True, text=True)
        if chk.returncode != 0:
            self.skip(chk.stderr.strip() or "netns_hosts.sh check exited %d" % chk.returncode)
        if not cu.mpiexec():
            self.skip("plexus was built without MPI (or no mpiexec): the rig runs Open MPI across the hosts")
        self.lock = open("/tmp/plexus-rig.lock", "w")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        self.tmp = tempfile.mkdtemp(prefix="px_rig_")
        self.dir = os.path.join(self.tmp, "rig")
        self.procs = []
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)

    def skip(self, why):
        print("%s: SKIPPED: %s" % (self.name, why), flush=True)
        sys.exit(77)

    def up(self, rate="1gbit", delay="0.1ms"):
        p = subprocess.run(["bash", RIG, "up", self.dir, str(self.hosts), rate, delay], capture_output=True,
                           text=True)
        print(p.stderr.strip(), flush=True)
        if p.returncode != 0:
            return False
        self.tag = dict(l.split() for l in open(os.path.join(self.dir, "names")))["tag"]
        self.namespaces = [l.split()[1] for l in open(os.path.join(self.dir, "map"))]
        return True

    def down(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        subprocess.run(["bash", RIG, "down", self.dir])

    def cleanup(self):
        self.down()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _on_term(self, signum, _frame):
        self.cleanup()
        sys.exit(128 + signum)

    def env(self):
        e = cu.mpi_env()
        e["PX_RIG_MAP"] = os.path.join(self.dir, "map")
        return e

    def mpiexec(self, n, cmd, export=()):
        """mpiexec across the hosts, TCP only, Open MPI's daemons told to
        give up on an unreachable host after ~3 s (keepalive 1 s, 1 s, 2
        probes; the defaults, 300 s + 9 x 20 s, keep mpiexec waiting 8
        minutes after the ranks have ended)."""
        full = [cu.mpiexec(), "-n", str(n), "--hostfile", os.path.join(self.dir, "hostfile"),
                "--mca", "plm_rsh_agent", AGENT, "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", "10.77.0.0/24", "--mca", "oob_tcp_if_include", "10.77.0.0/24",
                "--mca", "oob_tcp_keepalive_time", "1", "--mca", "oob_tcp_keepalive_intvl", "1",
                "--mca", "oob_tcp_keepalive_probes", "2"]
        for var in export:
            full += ["-x", var]
        return full + cmd

    def cut(self, host):
        """Host `host`'s (1-based) link down, on the bridge side of its veth."""
        subprocess.run(["ip", "link", "set", "%sr%d" % (self.tag, host), "down"], check=True)

    def plexus_pids(self, host):
        """pids of the plexus processes in host `host`'s namespace."""
        pids = subprocess.run(["ip", "netns", "pids", self.namespaces[host - 1]], capture_output=True,
                              text=True).stdout.split()
        found = []
        for pid in pids:
            try:
                if os.path.basename(os.readlink("/proc/%s/exe" % pid)) == "plexus":
                    found.append(int(pid))
            except OSError:
                pass
        return found

    def plexus_left(self):
        return [(self.namespaces[h - 1], pid) for h in range(1, self.hosts + 1) for pid in self.plexus_pids(h)]
