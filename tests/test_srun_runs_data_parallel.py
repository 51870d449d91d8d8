"""Claim: plexus runs data parallel under Slurm's srun.  On a private
one-node Slurm cluster brought up for this test (munged, slurmctld and
slurmd in a temporary directory, on free ports), `srun --mpi=pmix -n 2`
of the quick start makes ONE job of two MPI ranks: rank 0 reports
"2 ranks (mpi)" and trains to the README's loss, and rank 1 prints nothing
(it is a rank of rank 0's world, not a world of its own).  A rank that
stalls in a collective ends the whole step through the watchdog, with its
message, in seconds.  When the build
has the `plexus` command, `srun -n 2 plexus train` runs on 2 ranks of the
MPI backend and exits 0 (data parallel, ZeRO-3, tensor parallel with
sequence parallelism, and a 2-stage 1F1B pipeline); `--backend mpi` refuses a launch without PMI
(`--mpi=none`) instead of training twice; and a signal sent through Slurm
(as `sbatch --signal` does before a time limit) ends both ranks after a step
with a checkpoint and exit 75, from which `--resume auto` under srun goes on.

If it failed, users of Slurm clusters (srun in an sbatch script, the way
they launch torchrun today) would get N copies of a one-rank run, a job
that does not start, a stuck job that burns its allocation, or a requeued
job that starts over: docs/SLURM.md would be wrong.

Needs root (the daemons run as root) and Slurm's packages (scripts/dev
installs them).  Exits 77 -- ctest shows "Skipped" -- with the reason when
either is missing or the daemons cannot run here; never passes silently."""
import ctypes
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

NAME = "test_srun_runs_data_parallel"
SKIP = 77
BUILD = os.environ.get("PX_BUILD_DIR", "build")
QUICKSTART = os.path.join(BUILD, "quickstart")
PLEXUS = os.path.join(BUILD, "plexus")
COMM_FAULT = os.path.join(BUILD, "tests", "comm_fault")
FMNIST = "/usr/share/datasets/fashion-mnist"
NODE = "pxnode"
DEADLINE_S = 240  # ctest's TIMEOUT for this test is 300 s (tests/CMakeLists.txt)
# Slurm's MPI plugin.  Debian's Open MPI 4.1 initialises from PMIx only (its
# pmix components are ext3x, isolated, flux: no PMI-1/PMI-2 client), so
#   --mpi=pmix  works: both ranks join one world;
#   --mpi=pmi2  fails in MPI_Init ("OMPI was not built with SLURM's PMI
#               support");
#   --mpi=none  (Slurm's default MpiDefault) starts N singletons that each
#               train alone.
# Open MPI's own launcher also works inside an allocation (salloc/sbatch,
# then mpirun: it starts its daemons with srun); docs/SLURM.md says so.
MPI_PLUGIN = "pmix"

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def skip(why):
    print(f"{NAME}: SKIPPED: {why}", flush=True)
    sys.exit(SKIP)


failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, flush=True)
    return cond


class Interrupted(Exception):
    pass


def interrupted(signum, frame):
    # SIGALRM (our own deadline, below ctest's TIMEOUT), SIGTERM or Ctrl-C:
    # leave through the teardown in main's finally.
    raise Interrupted(f"signal {signal.Signals(signum).name}")


def die_with_parent():
    # A daemon must not outlive this test, even if ctest kills it.
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def free_ports(n):
    """n TCP ports nobody listens on now (the kernel's choice)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def tail(path, n=25):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"({e})\n"


class Cluster:
    """munged + slurmctld + slurmd for one node, all under one temporary
    directory; stop() ends every process this test started."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="px-slurm-")
        self.daemons = {}  # name -> Popen
        self.logs = {}     # name -> log file
        self.env = {k: v for k, v in os.environ.items()
                    # A test started inside a real Slurm job must not talk to it.
                    if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "PMI", "OMPI_"))}
        self.env["SLURM_CONF"] = os.path.join(self.dir, "slurm.conf")

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def start(self, name, cmd):
        log = self.path("log", name + ".out")
        self.logs[name] = log
        with open(log, "w") as out:
            self.daemons[name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                                  preexec_fn=die_with_parent)

    def dead(self):
        """The first daemon that has exited, or None."""
        for name, p in self.daemons.items():
            if p.poll() is not None:
                return name
        return None

    def write_config(self):
        hw = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, env=self.env)
        line = hw.stdout.splitlines()[0] if hw.returncode == 0 and hw.stdout else ""
        if not line.startswith("NodeName="):
            skip(f"`slurmd -C` cannot describe this machine: {hw.stdout}{hw.stderr}")
        # The node as slurmd sees it (CPUs, sockets, cores, memory), so that
        # slurmctld never drains it for a configuration mismatch.
        hardware = " ".join(w for w in line.split() if not w.startswith("NodeName="))
        self.cpus = int(re.search(r"CPUs=(\d+)", line).group(1))
        host = socket.gethostname().split(".")[0]
        ctld_port, slurmd_port = free_ports(2)
        p = self.path
        conf = f"""# Generated by {NAME}: a one-node cluster private to this test.
ClusterName=pxtest
# Job ids name the PMIx namespace (slurm.pmix.<job>.<step>), from which Open
# MPI derives its job family and shared-memory names: two of these
# clusters on one machine (two builds tested at once) must not both count
# from 1, or their ranks meet in each other's segments.
FirstJobId={random.randrange(1000, 60_000_000)}
# slurmctld runs only where SlurmctldHost names this machine.
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={p("munge", "munge.socket")}
CredType=cred/munge
StateSaveLocation={p("state")}
SlurmdSpoolDir={p("spool")}
TmpFS={p("tmp")}
SlurmctldPidFile={p("slurmctld.pid")}
SlurmdPidFile={p("slurmd.pid")}
SlurmctldLogFile={p("log", "slurmctld.log")}
SlurmdLogFile={p("log", "slurmd.log")}
MailProg=/bin/true
# No cgroups: process groups track a step's tasks, which works in any
# container; nothing is confined or bound.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Slurm's default: the test names the plugin on srun's command line, as users must.
MpiDefault=none
ReturnToService=2
KillWait=5
SlurmctldDebug=info
SlurmdDebug=info
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 {hardware} State=UNKNOWN
PartitionName=px Nodes={NODE} Default=YES MaxTime=10 State=UP
"""
        with open(self.env["SLURM_CONF"], "w") as f:
            f.write(conf)

    def up(self):
        for d in ("munge", "state", "spool", "tmp", "log"):
            os.makedirs(self.path(d))
        # munged checks that no one else can reach its key and socket.
        os.chmod(self.path("munge"), 0o711)
        key = self.path("munge", "munge.key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), "wb") as f:
            f.write(os.urandom(1024))
        self.write_config()
        sock = self.path("munge", "munge.socket")
        # --force: run even if a parent of the temporary directory is
        # writable by others (a TMPDIR); the key is this run's alone.
        self.start("munged", ["munged", "--foreground", "--force", "--key-file=" + key, "--socket=" + sock,
                              "--pid-file=" + self.path("munge", "munged.pid"),
                              "--seed-file=" + self.path("munge", "munged.seed"),
                              "--log-file=" + self.path("log", "munged.log")])
        deadline = time.monotonic() + 10
        while not os.path.exists(sock):
            if self.dead() or time.monotonic() > deadline:
                skip("munged did not start here:\n" + tail(self.logs["munged"]))
            time.sleep(0.1)
        cred = subprocess.run(["munge", "-S", sock, "-n"], capture_output=True, env=self.env)
        back = subprocess.run(["unmunge", "-S", sock], input=cred.stdout, capture_output=True, env=self.env)
        if cred.returncode or back.returncode:
            skip("munge cannot encode and decode a credential here: " + (cred.stderr + back.stderr).decode())

        conf = self.env["SLURM_CONF"]
        self.start("slurmctld", ["slurmctld", "-D", "-f", conf])
        self.start("slurmd", ["slurmd", "-D", "-N", NODE, "-f", conf])
        # Up when the controller reports the node idle (slurmd registered).
        deadline = time.monotonic() + 30
        state = ""
        while state != "idle":
            gone = self.dead()
            if gone:
                skip(f"{gone} exited at start:\n{tail(self.logs[gone])}"
                     f"--- slurmctld.log\n{tail(self.path('log', 'slurmctld.log'))}"
                     f"--- slurmd.log\n{tail(self.path('log', 'slurmd.log'))}")
            if time.monotonic() > deadline:
                skip(f"the node is not idle after 30 s (state \"{state}\"); the daemons cannot run here:\n"
                     f"--- slurmctld.log\n{tail(self.path('log', 'slurmctld.log'))}"
                     f"--- slurmd.log\n{tail(self.path('log', 'slurmd.log'))}")
            time.sleep(0.5)
            s = subprocess.run(["sinfo", "-h", "-N", "-n", NODE, "-o", "%T"], capture_output=True, text=True,
                               env=self.env)
            state = s.stdout.strip().rstrip("*")

    def stop(self):
        for name in ("slurmd", "slurmctld", "munged"):
            p = self.daemons.get(name)
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        # Whatever they left behind (slurmstepd, slurmscriptd and their
        # tasks) was re-parented to this process, the child subreaper:
        # end our own children until none are left.
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
        # Steps' slurmstepd that ended on their own became our zombies.
        reap()
        shutil.rmtree(self.dir, ignore_errors=True)

    def dump_logs(self):
        for f in ("slurmctld.log", "slurmd.log"):
            print(f"--- {f}\n{tail(self.path('log', f), 40)}", flush=True)


def children():
    """Processes whose parent is this one (still running or not reaped)."""
    me, kids = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses.
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


def mpi_env(cluster):
    env = dict(cluster.env)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                # Open MPI's session directory (shared-memory files) in this
                # cluster's directory too.
                "TMPDIR": cluster.path("tmp"),
                "PX_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                # Open MPI keeps memory until exit by design: LeakSanitizer would flag it.
                "ASAN_OPTIONS": "detect_leaks=0"})
    return env


def srun(cluster, args, plugin=MPI_PLUGIN, timeout=120, n=2):
    """srun -n N (2) on our node, output lines labelled with the task ("0: ...")."""
    cmd = ["srun", f"--mpi={plugin}", "-N", "1", "-n", str(n), "--label", "--kill-on-bad-exit=1", "--time=3"]
    if cluster.cpus < n:
        cmd.append("--overcommit")
    cmd += args
    print("$", " ".join(cmd), flush=True)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=mpi_env(cluster), timeout=timeout,
                           preexec_fn=die_with_parent)
    except subprocess.TimeoutExpired as e:
        check(False, f"srun did not end within {timeout} s: {' '.join(cmd)}")
        return subprocess.CompletedProcess(cmd, -1, e.stdout or "", e.stderr or "")
    return p


def show(p):
    print(f"exit {p.returncode}\n--- stdout\n{p.stdout[-3000:]}--- stderr\n{p.stderr[-3000:]}", flush=True)


def lines_of(out, task):
    return [ln[len(f"{task}: "):] for ln in out.splitlines() if ln.lstrip().startswith(f"{task}: ")]


def quickstart_case(cluster):
    p = srun(cluster, [QUICKSTART])
    show(p)
    check(p.returncode == 0, f"quickstart under srun exited {p.returncode}")
    out0, out1 = lines_of(p.stdout, 0), lines_of(p.stdout, 1)
    headers = [ln for ln in out0 + out1 if "parameters," in ln]
    # One world of two MPI ranks: one header, from task 0.  N singletons
    # (a PMI that Open MPI cannot use) would print one "1 ranks (self)" each.
    check(len(headers) == 1 and "2 ranks (mpi)" in headers[0] and headers[0] in out0,
          f"expected one header from task 0 saying \"2 ranks (mpi)\", got {headers}")
    check(not out1, f"task 1 printed on stdout, so it is not rank 1 of rank 0's world: {out1[:3]}")
    check(any(re.match(r"Epoch  30: Loss 0\.00[0-9]+", ln) for ln in out0),
          "the last epoch's loss is not below 0.01 (the README's quick start does not train)")


def watchdog_case(cluster):
    # Rank 1 skips an all-reduce (tests/tools/comm_fault): rank 0's watchdog
    # (2 s) names the collective and the step, MPI_Abort ends it, and Slurm
    # ends the whole step: srun returns non-zero long before --time.
    t0 = time.monotonic()
    p = srun(cluster, [COMM_FAULT, "--mode", "skip", "--timeout", "2"], timeout=60)
    took = time.monotonic() - t0
    show(p)
    check(p.returncode not in (0, -1), f"a stalled rank under srun: exit {p.returncode}, expected non-zero")
    check("watchdog: allreduce (step 3, bucket 1) did not complete within 2 s" in p.stdout + p.stderr,
          "a stalled rank under srun: no watchdog message naming the all-reduce and the step")
    check(took < 30, f"a stalled rank under srun: the step took {took:.0f} s to end (watchdog 2 s)")


def plexus_has_mpi():
    out = subprocess.run([PLEXUS, "--version"], capture_output=True, text=True).stdout
    return "with MPI" in out


def plexus_cases(cluster):
    train = [PLEXUS, "train", "--model", "mlp", "--hidden", "32", "--data", "mnist", "--data-path", FMNIST,
             "--train-subset", "512", "--val-subset", "256", "--progress", "lines"]
    p = srun(cluster, train + ["--steps", "20"])
    show(p)
    check(p.returncode == 0, f"plexus train under srun exited {p.returncode}")
    check("2 ranks (mpi backend)" in p.stdout, "plexus train did not say \"2 ranks (mpi backend)\"")
    check(re.search(r"^0: plexus train: done: 20 steps", p.stdout, re.M) is not None,
          "rank 0 did not report 20 steps done")

    # Sharded data parallel, the one-option change: each task writes its own
    # slice of the checkpoint (ZeRO-3: model and optimizer state).
    z3 = cluster.path("zero3")
    p = srun(cluster, train + ["--steps", "10", "--zero", "3", "--out", z3])
    show(p)
    check(p.returncode == 0 and "memory per rank (ZeRO stage 3, 2 ranks" in p.stdout,
          f"plexus train --zero 3 under srun exited {p.returncode} or printed no memory line")
    ck = os.path.join(z3, "checkpoints", "step_00000010")
    check(all(os.path.exists(os.path.join(ck, "%s.rank%05d-of-00002.safetensors" % (w, r)))
              for w in ("model", "optim") for r in (0, 1)), f"--zero 3 under srun: rank files missing in {ck}")

    # Tensor parallelism under srun: the two tasks are one tp group of the
    # GPT (dp inferred as 1), and the mesh is printed.
    text = cluster.path("words.txt")
    rnd = random.Random(7)
    with open(text, "w") as f:
        for _ in range(300):
            f.write(" ".join("w%d" % rnd.randrange(40) for _ in range(rnd.randint(5, 15))) + "\n")
    gpt = [PLEXUS, "train", "--model", "gpt", "--data", "text", "--data-path", text, "--context", "16",
           "--n-layer", "2", "--n-head", "4", "--n-embd", "32", "--batch-size", "4", "--progress", "lines"]
    p = srun(cluster, gpt + ["--steps", "6", "--tp", "2", "--sequence-parallel"])
    show(p)
    check(p.returncode == 0 and "mesh dp 1 × tp 2 × pp 1 (world 2)" in p.stdout and
          re.search(r"^0: plexus train: done: 6 steps", p.stdout, re.M) is not None,
          f"plexus train --tp 2 under srun exited {p.returncode} or printed no mesh and no 6 steps done")

    # Pipeline parallelism under srun: the two tasks are the two stages.
    p = srun(cluster, train + ["--steps", "6", "--pp", "2", "--micro-batches", "4", "--schedule-pp", "1f1b"])
    show(p)
    check(p.returncode == 0 and "pipeline of 2 stages over 2 ranks" in p.stdout and
          re.search(r"^0: plexus train: done: 6 steps", p.stdout, re.M) is not None,
          f"plexus train --pp 2 under srun exited {p.returncode} or did not run 6 steps as a 2-stage pipeline")

    # 3D under srun: 8 tasks as dp 2 × tp 2 × pp 2 of the GPT.
    p = srun(cluster, gpt + ["--steps", "4", "--dp", "2", "--tp", "2", "--pp", "2", "--micro-batches", "2"], n=8,
             timeout=240)
    show(p)
    check(p.returncode == 0 and "mesh dp 2 × tp 2 × pp 2 (world 8)" in p.stdout and
          re.search(r"^0: plexus train: done: 4 steps", p.stdout, re.M) is not None,
          f"plexus train --dp 2 --tp 2 --pp 2 under srun -n 8 exited {p.returncode} or did not run 4 steps on the mesh")

    # The sbatch script of docs/SLURM.md says --backend mpi, so that a launch
    # without PMI fails at once instead of training once per task.
    p = srun(cluster, train + ["--steps", "20", "--backend", "mpi"], plugin="none")
    show(p)
    check(p.returncode != 0 and "--backend mpi" in p.stderr,
          "srun --mpi=none of plexus train --backend mpi did not fail with a message naming --backend mpi")
    # Without --backend mpi too: never one world of one per task, silently.
    p = srun(cluster, train + ["--steps", "20"], plugin="none")
    show(p)
    check(p.returncode != 0 and "srun --mpi=pmix" in p.stderr,
          "srun --mpi=none of plexus train did not fail with a message naming srun --mpi=pmix")

    # Stop and go on, as a requeued job does: Slurm delivers SIGUSR1 to
    # every task (scancel --signal, the path of sbatch --signal=USR1@T);
    # the ranks end after the same step with a checkpoint and exit 75 (srun
    # reports the largest task exit); the same command with --resume auto
    # continues from that step.
    out = cluster.path("run")
    long_run = train + ["--steps", "1000000", "--log-every", "10", "--ckpt-every", "1000000", "--out", out,
                        "--resume", "auto"]
    cmd = ["srun", f"--mpi={MPI_PLUGIN}", "-N", "1", "-n", "2", "--label", "--time=3"]
    cmd += (["--overcommit"] if cluster.cpus < 2 else []) + long_run
    print("$", " ".join(cmd), flush=True)
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=mpi_env(cluster),
                           preexec_fn=die_with_parent)
    # srun ends within 90 s, or is killed (its output then ends too).
    killer = threading.Timer(90, run.kill)
    killer.start()
    got, signalled = [], False
    try:
        for line in run.stdout:
            got.append(line)
            if not signalled and re.match(r"0: step \d+", line):
                jobs = subprocess.run(["squeue", "-h", "-o", "%A"], capture_output=True, text=True,
                                      env=cluster.env).stdout.split()
                check(len(jobs) == 1, f"expected one job in the queue, found {jobs}")
                subprocess.run(["scancel", "--signal=USR1"] + jobs, env=cluster.env)
                signalled = True
        run.wait()
    finally:
        if not killer.is_alive():
            check(False, "plexus train under srun was killed: it had not ended 90 s after its start")
        killer.cancel()
        if run.poll() is None:
            run.kill()
            run.wait()
    check(signalled, "plexus train under srun never logged a step")
    text = "".join(got)
    print(f"exit {run.returncode}\n{text[-3000:]}", flush=True)
    m = re.search(r"^0: checkpoint \S+ \(step (\d+)\)", text, re.M)
    check(run.returncode == 75, f"a run stopped by SIGUSR1 exited {run.returncode} through srun, expected 75")
    if not check(m is not None, "no checkpoint after SIGUSR1"):
        return
    stopped_at = int(m.group(1))
    p = srun(cluster, long_run + ["--stop-at-step", str(stopped_at + 5)])
    show(p)
    check(re.search(rf"^0: resumed from \S+: step {stopped_at}\b", p.stdout, re.M) is not None,
          f"--resume auto under srun did not resume from step {stopped_at}")
    # --stop-at-step is asked for, not a signal: exit 0.
    check(p.returncode == 0 and f"stopped at step {stopped_at + 5} " in p.stdout,
          f"the resumed run did not stop at step {stopped_at + 5} with exit 0 (exit {p.returncode})")


def main():
    if os.geteuid() != 0:
        skip("not root: slurmctld, slurmd and munged run as root here")
    missing = [b for b in ("munged", "munge", "unmunge", "slurmctld", "slurmd", "srun", "sinfo", "squeue",
                           "scancel") if not shutil.which(b)]
    if missing:
        skip(f"{', '.join(missing)} not installed (apt-get install slurmctld slurmd slurm-client munge, "
             "as scripts/dev does)")
    if os.environ.get("PX_TEST_WITH_MPI") != "1":
        skip("plexus was built without MPI: srun ranks would each be a world of one")
    if not os.path.exists(QUICKSTART):
        skip(f"{QUICKSTART} not built")
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        skip("cannot become a child subreaper (prctl), so could not be sure to end every Slurm process")

    # The only way to leave processes behind is to SIGKILL this script (its
    # daemons then die with it, but a running step's slurmstepd would not):
    # so it ends itself, through the teardown, well before ctest would.
    for sig in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupted)
    signal.alarm(DEADLINE_S)
    t0 = time.monotonic()
    cluster = Cluster()
    ok = False
    try:
        cluster.up()
        print(f"{NAME}: cluster up in {time.monotonic() - t0:.1f} s ({cluster.cpus} CPUs) in {cluster.dir}",
              flush=True)
        plugins = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, env=cluster.env)
        listed = plugins.stdout + plugins.stderr
        print(listed, flush=True)
        if check(re.search(rf"^\s*{MPI_PLUGIN}\s*$", listed, re.M) is not None,
                 f"srun --mpi=list does not offer {MPI_PLUGIN} (slurm-wlm-basic-plugins has mpi_pmix.so)"):
            quickstart_case(cluster)
            if os.path.exists(COMM_FAULT):
                watchdog_case(cluster)
            if os.path.exists(PLEXUS) and plexus_has_mpi():
                plexus_cases(cluster)
            else:
                print(f"{NAME}: {PLEXUS} not built (or without MPI): the plexus train cases did not run",
                      flush=True)
        ok = failures == 0
    except Interrupted as e:
        check(False, f"interrupted by {e} after {time.monotonic() - t0:.0f} s")
    finally:
        signal.alarm(0)
        if not ok:
            cluster.dump_logs()
        cluster.stop()
    left = children()
    check(not left, f"processes left after teardown: {left}")
    if failures:
        print(f"{NAME}: {failures} check(s) failed")
        sys.exit(1)
    print(f"{NAME}: ok in {time.monotonic() - t0:.1f} s")


if __name__ == "__main__":
    main()
