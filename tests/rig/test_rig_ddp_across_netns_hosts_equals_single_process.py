"""Claim: DDP trains across several "hosts" -- network namespaces on this
machine, each joined to a bridge by its own veth link shaped with tc --
with Open MPI over TCP only (a hostfile naming the hosts' addresses, `--mca
btl tcp,self`: no shared memory between hosts, and mpirun's daemons started
inside each namespace by tests/rig/netns-exec.sh), and equals the
single-process run:

1. the ranks run one per namespace (each reports the namespace it is in);
2. tests/test_ddp_equals_single_process_mpi -- every DDP equivalence of the
   threads and local-MPI tests (N ranks x B samples = one process x N*B,
   several bucket sizes, accumulation, unused parameters...) -- passes
   across the hosts, and its gradients really cross the links (the veths'
   byte counters grow by at least the all-reduced bytes);
3. `plexus train` across the hosts ends with the same parameters (1e-6
   relative) and logs the same step losses (1e-6) as the same run with the
   ranks as threads of one process (--threads N).

2 hosts at 1 Gbit/s for (1)-(2), the links reshaped to 10 Gbit/s for (3);
PX_RIG_HOSTS=4 makes 4.  Exits 77 (ctest: skipped), saying why, when the
machine cannot make the rig: not root, no `ip`/`tc`, no network namespaces,
or plexus built without MPI.  The namespaces and links are removed on every
exit (also on failure and on SIGTERM from ctest's timeout).

If it fails: ranks on different hosts compute another update than one
process (a reduction that depends on shared memory or on the order of
arrival), or the launch across hosts is broken."""

import fcntl
import os
import re
import signal
import subprocess
import sys
import tempfile
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import cli_util as cu  # noqa: E402
import zero_util as zu  # noqa: E402

NAME = "test_rig_ddp_across_netns_hosts_equals_single_process"
RIG = os.path.join(HERE, "netns_hosts.sh")
AGENT = os.path.join(HERE, "netns-exec.sh")
HOSTS = int(os.environ.get("PX_RIG_HOSTS", "2"))


def skip(why):
    print("%s: SKIPPED: %s" % (NAME, why), flush=True)
    sys.exit(77)


chk = subprocess.run(["bash", RIG, "check"], capture_output=True, text=True)
if chk.returncode != 0:
    skip(chk.stderr.strip() or "netns_hosts.sh check exited %d" % chk.returncode)
if not cu.mpiexec():
    skip("plexus was built without MPI (or no mpiexec): the rig runs Open MPI across the hosts")
TEST_BIN = os.path.join(cu.BUILD, "tests", "test_ddp_equals_single_process_mpi")
if not os.path.exists(TEST_BIN):
    skip("%s is not built" % TEST_BIN)

# One rig at a time owns 10.77.0.0/24.
lock = open("/tmp/plexus-rig.lock", "w")
fcntl.flock(lock, fcntl.LOCK_EX)
tmp = tempfile.mkdtemp(prefix="px_rig_")
rigdir = os.path.join(tmp, "rig")


def down(*_):
    subprocess.run(["bash", RIG, "down", rigdir])


def on_term(signum, _frame):
    down()
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, on_term)


def env():
    e = cu.mpi_env()
    e["PX_RIG_MAP"] = os.path.join(rigdir, "map")
    return e


def mpirun(n, cmd, timeout=120):
    full = [cu.mpiexec(), "-n", str(n), "--hostfile", os.path.join(rigdir, "hostfile"),
            "--mca", "plm_rsh_agent", AGENT, "--mca", "btl", "tcp,self",
            "--mca", "btl_tcp_if_include", "10.77.0.0/24", "--mca", "oob_tcp_if_include", "10.77.0.0/24",
            "--tag-output"] + cmd
    p = subprocess.run(full, capture_output=True, text=True, timeout=timeout, env=env())
    if p.returncode != 0:
        print("command failed (%d): %s\n--- stdout\n%s\n--- stderr\n%s" %
              (p.returncode, " ".join(full), p.stdout[-4000:], p.stderr[-4000:]), flush=True)
    return p


def link_bytes():
    """Bytes sent into the hosts (the bridge side of each veth)."""
    tag = next(l.split()[1] for l in open(os.path.join(rigdir, "names")) if l.startswith("tag "))
    total = 0
    for i in range(1, HOSTS + 1):
        with open("/sys/class/net/%sr%d/statistics/tx_bytes" % (tag, i)) as f:
            total += int(f.read())
    return total


try:
    up = subprocess.run(["bash", RIG, "up", rigdir, str(HOSTS), "1gbit", "0.1ms"], capture_output=True, text=True)
    print(up.stderr.strip(), flush=True)
    if not cu.check(up.returncode == 0, "the rig did not come up"):
        cu.finish(NAME)
    namespaces = [l.split()[1] for l in open(os.path.join(rigdir, "map"))]

    # 1. One rank per namespace.
    p = mpirun(HOSTS, ["ip", "netns", "identify"])
    seen = sorted(re.findall(r"\[\d+,(\d+)\]<stdout>:\s*(\S+)", p.stdout))
    cu.check(p.returncode == 0 and [ns for _, ns in seen] == sorted(namespaces),
             "ranks ran in %s, expected one in each of %s" % (seen, namespaces))

    # 2. The DDP equivalences across the hosts, over the links.
    before = link_bytes()
    p = mpirun(HOSTS, [TEST_BIN])
    sent = link_bytes() - before
    cu.check(p.returncode == 0 and "test_ddp_equals_single_process_mpi: ok" in p.stdout,
             "test_ddp_equals_single_process_mpi across %d hosts failed" % HOSTS)
    # Its models hold ~1,200-1,800 parameters; 20 steps of several cases
    # all-reduce well over 100 KB in total.
    cu.check(sent > 100_000, "only %d bytes crossed the hosts' links" % sent)
    print("DDP equivalences across %d hosts: ok, %d bytes over the links" % (HOSTS, sent), flush=True)

    # 3. plexus train across the hosts (10 Gbit/s) = the ranks as threads.
    sh = subprocess.run(["bash", RIG, "shape", rigdir, "10gbit", "0.1ms"], capture_output=True, text=True)
    print(sh.stderr.strip(), flush=True)
    cu.check(sh.returncode == 0, "reshaping the links failed")
    common = ["train", "--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST,
              "--train-subset", "512", "--val-subset", "128", "--batch-size", "16", "--optim", "adam",
              "--lr", "0.003", "--clip-grad", "0.5", "--log-every", "1", "--seed", "5", "--workers", "1",
              "--steps", "8", "--bucket-mb", "0.01", "--progress", "lines", "--quiet"]
    runs = {}
    for label in ("threads", "hosts"):
        out = os.path.join(tmp, label)
        if label == "threads":
            p = cu.run(common + ["--threads", str(HOSTS), "--out", out], timeout=300)
        else:
            p = mpirun(HOSTS, [cu.PLEXUS] + common + ["--out", out], timeout=300)
        if not cu.check(p.returncode == 0, "plexus train (%s) failed" % label):
            continue
        ck = cu.checkpoints(os.path.join(out, "checkpoints"))
        losses = [r["loss"] for r in cu.jsonl(os.path.join(out, "metrics.jsonl")) if r["type"] == "step"]
        runs[label] = (zu.whole(ck[-1], "model") if ck else None, losses)
    if len(runs) == 2:
        (m_t, l_t), (m_h, l_h) = runs["threads"], runs["hosts"]
        d = zu.max_rel_diff(m_t, m_h) if m_t and m_h else None
        cu.check(d is not None and d <= 1e-6, "parameters across hosts differ from threads by %s (tolerance 1e-6)" % d)
        cu.check(len(l_t) == 8 and len(l_h) == 8, "step losses logged: threads %d, hosts %d (expected 8)" %
                 (len(l_t), len(l_h)))
        worst = max((abs(a - b) / max(abs(a), 1e-12) for a, b in zip(l_t, l_h)), default=None)
        cu.check(worst is not None and worst <= 1e-6, "step losses differ by %s relative: %s vs %s" % (worst, l_t, l_h))
        print("plexus train across %d hosts: parameters within %.2g, losses within %.2g of threads" %
              (HOSTS, d if d is not None else -1, worst if worst is not None else -1), flush=True)
finally:
    down()
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish(NAME)
