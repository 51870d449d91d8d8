"""Claim: the sbatch script of docs/SLURM.md, submitted to a Slurm cluster
of two nodes that are two "hosts" of the rig (network namespaces joined by
veth links, tests/rig/netns_hosts.sh), runs ONE job of two MPI ranks, one
per node, that trains over TCP between the hosts and ends with the same
parameters and step losses as the same configuration in one process
(--threads 2).

The cluster: munged and slurmctld in the root namespace (slurmctld reached
at the bridge, 10.77.0.254); one slurmd per host, started by `ip netns exec
HOST unshare --uts --mount`, with its own host name (the node's name), its
own address (NodeAddr 10.77.0.i) and, bind-mounted over one shared path, its
own spool, pid file, log and TmpFS -- so that Slurm's PMIx plugin, whose
per-host socket paths are the same on every node, gets a directory per node
as it would on separate machines.  proctrack/pgid, task/none, auth/munge.

The script is docs/SLURM.md's, verbatim except for the sizes (--nodes=2
--ntasks-per-node=1 --cpus-per-task=1 --time=5) and the two /cluster paths
(the log and the run directory, here in a temporary directory); run.json is
`plexus train --print-config` of a small CNN on Fashion-MNIST.  Checked:

1. srun -N 2 places one task in each namespace, under each node's name;
2. the job ran on both nodes, exited 0 (the log says "plexus train exited 0");
   rank 0 reports 2 ranks (mpi backend) -- one world, not two singletons;
3. the gradients crossed the links: each host's veth carried at least the
   all-reduced bytes (steps x parameters x 4) each way;
4. parameters (1e-6 relative) and step losses (1e-6) equal --threads 2's.

Exits 77 (ctest: skipped) with the reason when the rig cannot be made (not
root, no netns), Slurm or munge are not installed, plexus has no MPI, or the
daemons cannot run here.  Everything it started is ended, and the rig
removed, on every exit."""

import ctypes
import fcntl
import glob
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
sys.path.insert(0, TESTS)
import cli_util as cu  # noqa: E402
import zero_util as zu  # noqa: E402

NAME = "test_rig_sbatch_docs_script_trains_across_two_slurm_nodes"
RIG = os.path.join(HERE, "netns_hosts.sh")
DOCS = os.path.join(os.path.dirname(TESTS), "docs", "SLURM.md")
NODES = 2
STEPS = 8
DEADLINE_S = 150
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def skip(why):
    print("%s: SKIPPED: %s" % (NAME, why), flush=True)
    sys.exit(77)


class Interrupted(Exception):
    pass


def interrupted(signum, _frame):
    raise Interrupted("signal %s" % signal.Signals(signum).name)


def die_with_parent():
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return "(%s)\n" % e


def children():
    me, kids = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == me and fields[0] != "Z":
            kids.append(int(d))
    return kids


def reap():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def free_port():
    """A TCP port nobody listens on now, for slurmctld in the root namespace
    (another Slurm test may run there at the same time; the slurmd ports
    are inside the rig's namespaces)."""
    s = socket.socket()
    s.bind(("", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def reap_orphans(keep):
    """Reap the zombies re-parented to this process (the child subreaper)
    except the processes in keep.  Under proctrack/pgid, slurmstepd waits
    for every member of the batch script's process group to be gone: an
    orphan of it left as our zombie would hold the job until KillWait and
    drain the node ("Kill task failed")."""
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) in keep:
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] == "Z" and int(fields[1]) == me:
            try:
                os.waitpid(int(d), os.WNOHANG)
            except ChildProcessError:
                pass


def documented_script(logdir, rundir):
    """The sbatch script of docs/SLURM.md with the sizes and paths of this
    test; each substitution must match once (a changed page fails here)."""
    text = open(DOCS).read()
    m = re.search(r"`train\.sbatch`, for 4 nodes.*?```bash\n(.*?)```", text, re.S)
    if not cu.check(m is not None, "no train.sbatch block in %s" % DOCS):
        return None
    script = m.group(1)
    subs = [(r"--nodes=4\b", "--nodes=%d" % NODES), (r"--ntasks-per-node=8\b", "--ntasks-per-node=1"),
            (r"--cpus-per-task=6\b", "--cpus-per-task=1"), (r"--time=24:00:00", "--time=5"),
            (r"--output=/cluster/%u/logs/", "--output=%s/" % logdir),
            (r"RUN=/cluster/\$USER/runs/resnet20-cifar", "RUN=%s" % rundir)]
    for pat, new in subs:
        script, n = re.subn(pat, new, script)
        if not cu.check(n == 1, "docs/SLURM.md's script: %r matched %d times, expected once" % (pat, n)):
            return None
    return script


class Cluster:
    def __init__(self, tmp, rigdir, cpus_line):
        self.dir = tmp
        self.rigdir = rigdir
        self.hw = cpus_line
        self.daemons = {}
        self.logs = {}
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "PMI", "OMPI_"))}
        self.env["SLURM_CONF"] = self.path("slurm.conf")
        self.namespaces = [l.split()[1] for l in open(os.path.join(rigdir, "map"))]
        self.nodes = ["pxn%d" % (i + 1) for i in range(len(self.namespaces))]

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def start(self, name, cmd):
        log = self.path("log", name + ".out")
        self.logs[name] = log
        with open(log, "w") as out:
            self.daemons[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                                  preexec_fn=die_with_parent)

    def dead(self):
        for name, p in self.daemons.items():
            if p.poll() is not None:
                return name
        return None

    def write_config(self):
        host = socket.gethostname().split(".")[0]
        p = self.path
        # The node's own directory: one path in the configuration, a
        # different directory on each node (bind-mounted in its mount namespace).
        node = p("node")
        nodes = "\n".join("NodeName=%s NodeHostname=%s NodeAddr=10.77.0.%d %s State=UNKNOWN" %
                          (n, n, i + 1, self.hw) for i, n in enumerate(self.nodes))
        conf = """# Generated by %(name)s: two nodes, each a network namespace of the rig.
ClusterName=pxrig
FirstJobId=%(first)d
SlurmctldHost=%(host)s(10.77.0.254)
SlurmctldPort=%(ctldport)d
SlurmdPort=6918
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%(munge)s
CredType=cred/munge
StateSaveLocation=%(state)s
SlurmdSpoolDir=%(node)s/spool
TmpFS=%(node)s/tmp
SlurmctldPidFile=%(ctldpid)s
SlurmdPidFile=%(node)s/slurmd.pid
SlurmctldLogFile=%(ctldlog)s
SlurmdLogFile=%(node)s/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
SlurmctldDebug=info
SlurmdDebug=info
%(nodes)s
PartitionName=px Nodes=%(nodelist)s Default=YES MaxTime=10 State=UP
""" % dict(name=NAME, first=1000 + os.getpid() % 1000000, host=host, munge=p("munge", "munge.socket"),
           state=p("state"), node=node, ctldpid=p("slurmctld.pid"), ctldlog=p("log", "slurmctld.log"),
           nodes=nodes, nodelist=",".join(self.nodes), ctldport=free_port())
        with open(self.env["SLURM_CONF"], "w") as f:
            f.write(conf)

    def up(self):
        for d in ("munge", "state", "log", "node"):
            os.makedirs(self.path(d))
        for n in self.nodes:
            for d in ("spool", "tmp"):
                os.makedirs(self.path("nodes", n, d))
        os.chmod(self.path("munge"), 0o711)
        key = self.path("munge", "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), "wb") as f:
            f.write(os.urandom(1024))
        self.write_config()
        sock = self.path("munge", "munge.socket")
        self.start("munged", ["munged", "--foreground", "--force", "--key-file=" + key, "--socket=" + sock,
                              "--pid-file=" + self.path("munge", "munged.pid"),
                              "--seed-file=" + self.path("munge", "munged.seed"),
                              "--log-file=" + self.path("log", "munged.log")])
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            if self.dead() or time.monotonic() > deadline:
                skip("munged did not start here:\n" + tail(self.logs["munged"]))
            time.sleep(0.1)
        conf = self.env["SLURM_CONF"]
        self.start("slurmctld", ["slurmctld", "-D", "-f", conf])
        for n, ns in zip(self.nodes, self.namespaces):
            # Its own host name (UTS) and its own node directory (mount
            # namespace) inside the host's network namespace.
            sh = ("hostname %s && mount --bind %s %s && exec slurmd -D -N %s -f %s" %
                  (n, self.path("nodes", n), self.path("node"), n, conf))
            # nsenter --net, not `ip netns exec`: the latter mounts a sysfs of
            # the namespace over /sys, without /sys/fs/cgroup, and slurmd
            # 22.05 refuses to start without it ("No filesystem mounted on
            # /sys/fs/cgroup", even with proctrack/pgid).
            self.start("slurmd-" + n, ["nsenter", "--net=/run/netns/" + ns, "unshare", "--uts", "--mount",
                                       "--propagation", "private", "/bin/sh", "-c", sh])
        deadline = time.monotonic() + 30
        states = {}
        while set(states.get(n) for n in self.nodes) != {"idle"}:
            gone = self.dead()
            if gone or time.monotonic() > deadline:
                why = ("%s exited at start" % gone) if gone else ("nodes not idle after 30 s: %s" % states)
                skip("%s:\n%s%s" % (why, tail(self.logs[gone]) if gone else "", self.log_tails()))
            time.sleep(0.5)
            s = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, env=self.env)
            states = dict(l.split()[:2] for l in s.stdout.splitlines() if len(l.split()) >= 2)
            states = {k: v.rstrip("*") for k, v in states.items()}

    def log_tails(self):
        out = "--- slurmctld.log\n" + tail(self.path("log", "slurmctld.log"))
        for n in self.nodes:
            out += "--- %s slurmd.log\n%s" % (n, tail(self.path("nodes", n, "slurmd.log")))
        return out

    def stop(self):
        for name in [k for k in self.daemons if k.startswith("slurmd")] + ["slurmctld", "munged"]:
            p = self.daemons.get(name)
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for _ in range(50):
            kids = children()
            if not kids:
                break
            for pid in kids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
            reap()
        reap()


def veth_bytes(rigdir):
    """(into, out of) each host, from the bridge side of its veth."""
    tag = next(l.split()[1] for l in open(os.path.join(rigdir, "names")) if l.startswith("tag "))
    res = []
    for i in range(1, NODES + 1):
        d = "/sys/class/net/%sr%d/statistics/" % (tag, i)
        res.append((int(open(d + "tx_bytes").read()), int(open(d + "rx_bytes").read())))
    return res


def job_env(cluster):
    env = dict(cluster.env)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                # TCP between the hosts only (no shared memory), on the rig's links.
                "OMPI_MCA_btl": "tcp,self", "OMPI_MCA_btl_tcp_if_include": "10.77.0.0/24",
                "OMPI_MCA_oob_tcp_if_include": "10.77.0.0/24",
                # The node's own directory (see write_config): session files per node.
                "TMPDIR": cluster.path("node", "tmp"),
                "PATH": os.path.abspath(cu.BUILD) + os.pathsep + os.environ.get("PATH", ""),
                "PX_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "ASAN_OPTIONS": "detect_leaks=0"})
    return env


def run_case(cluster, tmp, rigdir):
    env = job_env(cluster)
    # 1. One task per node, in its namespace, under its name.
    p = subprocess.run(["srun", "-N", str(NODES), "--ntasks-per-node=1", "--label", "--time=1", "/bin/sh", "-c",
                        "echo $(ip netns identify) $(hostname) $SLURMD_NODENAME"],
                       capture_output=True, text=True, env=env, timeout=60, preexec_fn=die_with_parent)
    print("$ srun -N %d ...: exit %d\n%s%s" % (NODES, p.returncode, p.stdout, p.stderr), flush=True)
    placed = sorted(tuple(l.split(":", 1)[1].split()) for l in p.stdout.splitlines() if ":" in l)
    want = sorted((ns, n, n) for ns, n in zip(cluster.namespaces, cluster.nodes))
    cu.check(p.returncode == 0 and placed == want, "srun placed tasks as %s, expected %s" % (placed, want))

    # 2. The documented script, with run.json of a small CNN.
    common = ["--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST,
              "--train-subset", "512", "--val-subset", "128", "--batch-size", "16", "--optim", "adam",
              "--lr", "0.003", "--clip-grad", "0.5", "--log-every", "1", "--seed", "5", "--workers", "1",
              "--steps", str(STEPS), "--bucket-mb", "0.01", "--progress", "lines"]
    cfg = subprocess.run([cu.PLEXUS, "train"] + common + ["--print-config"], capture_output=True, text=True)
    if not cu.check(cfg.returncode == 0, "plexus train --print-config failed: %s" % cfg.stderr):
        return
    job = os.path.join(tmp, "job")
    logdir, rundir = os.path.join(job, "logs"), os.path.join(job, "run")
    os.makedirs(logdir)
    with open(os.path.join(job, "run.json"), "w") as f:
        f.write(cfg.stdout)
    script = documented_script(logdir, rundir)
    if script is None:
        return
    with open(os.path.join(job, "train.sbatch"), "w") as f:
        f.write(script)
    # Core dumps on (srun passes the limit on to the tasks): a rank that
    # crashes leaves a core in the job's directory (core_pattern "core"),
    # whose backtrace is printed below.
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    before = veth_bytes(rigdir)
    t0 = time.monotonic()
    sb = subprocess.run(["sbatch", "--parsable", "--chdir", job, "train.sbatch"], capture_output=True, text=True,
                        env=env, cwd=job)
    if not cu.check(sb.returncode == 0, "sbatch failed: %s%s" % (sb.stdout, sb.stderr)):
        return
    jobid = sb.stdout.strip().split(";")[0]
    info = ""
    while time.monotonic() - t0 < 120:
        info = subprocess.run(["scontrol", "-o", "show", "job", jobid], capture_output=True, text=True,
                              env=env).stdout
        if re.search(r"JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)", info):
            break
        reap_orphans({p.pid for p in cluster.daemons.values()})
        time.sleep(0.5)
    took = time.monotonic() - t0
    sent = [(a1 - a0, b1 - b0) for (a0, b0), (a1, b1) in zip(before, veth_bytes(rigdir))]
    logs = os.listdir(logdir)
    log = open(os.path.join(logdir, logs[0])).read() if logs else ""
    print("job %s in %.1f s: %s\n--- %s\n%s" % (jobid, took, info.strip(), logs, log[-3000:]), flush=True)
    if not cu.check("JobState=COMPLETED" in info and "ExitCode=0:0" in info, "the job did not complete with exit 0"):
        for core in glob.glob(os.path.join(job, "core*")):
            if shutil.which("gdb"):
                bt = subprocess.run(["gdb", "-batch", "-ex", "thread apply all bt 25", cu.PLEXUS, core],
                                    capture_output=True, text=True, timeout=60)
                print("--- backtrace of %s\n%s" % (core, bt.stdout[-6000:]), flush=True)
            else:
                print("--- %s left (no gdb to read it)" % core, flush=True)
    cu.check(re.search(r"NodeList=pxn\[1-2\]", info) is not None, "the job did not run on pxn[1-2]")
    cu.check("start on %d nodes" % NODES in log and "plexus train exited 0" in log,
             "the script's log does not say it started on %d nodes and plexus train exited 0" % NODES)
    cu.check(re.search(r"\b2 ranks \(mpi backend\)", log) is not None, "rank 0 did not report 2 ranks (mpi backend)")

    # 3. Over the links: every step all-reduces the parameters (fp32).
    ck = cu.checkpoints(os.path.join(rundir, "checkpoints"))
    model = zu.whole(ck[-1], "model") if ck else None
    params = sum(len(v[1]) for v in model.values()) if model else 0
    need = STEPS * params * 4 // 2  # a ring all-reduce of 2 ranks: half the buffer each way, at least
    cu.check(params > 0 and all(a >= need and b >= need for a, b in sent),
             "bytes over each host's link (in, out) %s, expected at least %d each way (%d parameters, %d steps)" %
             (sent, need, params, STEPS))
    print("bytes over the links (in, out) per host: %s; parameters %d" % (sent, params), flush=True)

    # 4. = one process of 2 threads.
    ref = os.path.join(tmp, "threads")
    p = cu.run(["train", "--config", os.path.join(job, "run.json"), "--threads", str(NODES), "--out", ref],
               timeout=120)
    if not cu.check(p.returncode == 0 and model is not None, "the --threads reference failed or the job left no checkpoint"):
        return
    ck_t = cu.checkpoints(os.path.join(ref, "checkpoints"))
    d = zu.max_rel_diff(zu.whole(ck_t[-1], "model"), model)
    l_t = [r["loss"] for r in cu.jsonl(os.path.join(ref, "metrics.jsonl")) if r["type"] == "step"]
    l_j = [r["loss"] for r in cu.jsonl(os.path.join(rundir, "metrics.jsonl")) if r["type"] == "step"]
    cu.check(d is not None and d <= 1e-6, "parameters of the job differ from --threads %d by %g relative" % (NODES, d))
    worst = max((abs(a - b) / max(abs(a), 1e-12) for a, b in zip(l_t, l_j)), default=None)
    cu.check(len(l_t) == STEPS and len(l_j) == STEPS and worst is not None and worst <= 1e-6,
             "step losses: threads %s, job %s" % (l_t, l_j))
    print("sbatch across %d nodes = --threads %d: parameters within %.2g, losses within %.2g" %
          (NODES, NODES, d if d is not None else -1, worst if worst is not None else -1), flush=True)


def main():
    chk = subprocess.run(["bash", RIG, "check"], capture_output=True, text=True)
    if chk.returncode != 0:
        skip(chk.stderr.strip() or "netns_hosts.sh check exited %d" % chk.returncode)
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "srun", "sinfo", "scontrol", "unshare")
               if not shutil.which(b)]
    if missing:
        skip("%s not installed (apt-get install slurmctld slurmd slurm-client munge, as scripts/dev does)" %
             ", ".join(missing))
    if not cu.mpiexec():
        skip("plexus was built without MPI: srun's tasks would each be a world of one")
    if not os.path.isdir(cu.FMNIST):
        skip("no Fashion-MNIST at %s" % cu.FMNIST)
    hw = subprocess.run(["slurmd", "-C"], capture_output=True, text=True)
    line = hw.stdout.splitlines()[0] if hw.returncode == 0 and hw.stdout else ""
    if not line.startswith("NodeName="):
        skip("`slurmd -C` cannot describe this machine: %s%s" % (hw.stdout, hw.stderr))
    hardware = " ".join(w for w in line.split() if not w.startswith(("NodeName=", "UpTime=")))
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        skip("cannot become a child subreaper (prctl)")

    # One rig at a time owns 10.77.0.0/24.
    lock = open("/tmp/plexus-rig.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("%s: waiting for another rig test (/tmp/plexus-rig.lock)" % NAME, flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
    for sig in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupted)
    signal.alarm(DEADLINE_S)
    t0 = time.monotonic()
    # Not under /tmp: nothing here depends on it, but keep the job's files
    # apart from the nodes' TmpFS.
    tmp = tempfile.mkdtemp(prefix="px_rig_slurm_")
    rigdir = os.path.join(tmp, "rig")
    cluster = None
    ok = False
    try:
        up = subprocess.run(["bash", RIG, "up", rigdir, str(NODES), "1gbit", "0.1ms"], capture_output=True,
                            text=True)
        print(up.stderr.strip(), flush=True)
        if cu.check(up.returncode == 0, "the rig did not come up"):
            cluster = Cluster(tmp, rigdir, hardware)
            cluster.up()
            print("%s: 2 nodes idle after %.1f s" % (NAME, time.monotonic() - t0), flush=True)
            run_case(cluster, tmp, rigdir)
        ok = cu.failures == 0
    except Interrupted as e:
        cu.check(False, "interrupted by %s after %.0f s" % (e, time.monotonic() - t0))
    finally:
        signal.alarm(0)
        if cluster is not None:
            if not ok:
                print(cluster.log_tails(), flush=True)
            cluster.stop()
        subprocess.run(["bash", RIG, "down", rigdir])
        shutil.rmtree(tmp, ignore_errors=True)
    left = children()
    cu.check(not left, "processes left after teardown: %s" % left)
    print("%s: %.1f s" % (NAME, time.monotonic() - t0))
    cu.finish(NAME)


if __name__ == "__main__":
    main()
