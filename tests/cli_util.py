"""cli_util.py -- what the tests of the `plexus` command share: where the
binary is, running it (threads or under mpiexec), reading its JSONL metrics
and checkpoints."""

import glob
import json
import os
import random
import shutil
import subprocess
import sys

BUILD = os.environ.get("PX_BUILD_DIR", "")
PLEXUS = os.path.join(BUILD, "plexus")
FMNIST = "/usr/share/datasets/fashion-mnist"
failures = 0


def check(cond, msg):
    global failures
    if not cond:
        print("FAIL:", msg, flush=True)
        failures += 1
    return cond


def finish(name):
    if failures:
        print("%s: %d check(s) failed" % (name, failures))
        sys.exit(1)
    print("%s: ok" % name)
    sys.exit(0)


def mpiexec():
    """The MPI launcher the build found, if plexus was built with MPI."""
    out = subprocess.run([PLEXUS, "--version"], capture_output=True, text=True).stdout
    if "with MPI" not in out:
        return None
    for name in ("mpiexec", "mpirun"):
        p = shutil.which(name)
        if p:
            return p
    return None


def mpi_env():
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "OMPI_MCA_rmaps_base_oversubscribe": "1", "PX_NUM_THREADS": "1",
                "OMP_NUM_THREADS": "1"})
    # Open MPI keeps memory until exit by design: LeakSanitizer would flag it.
    env["ASAN_OPTIONS"] = "detect_leaks=0"
    return env


def run(args, mpi_ranks=0, timeout=600, expect_ok=True, env=None):
    """Run plexus with args (a list); mpi_ranks > 0: under mpiexec -n N.
    Returns the CompletedProcess; prints its output when it fails."""
    cmd = [PLEXUS] + args
    e = dict(env or os.environ)
    if mpi_ranks:
        cmd = [mpiexec(), "-n", str(mpi_ranks), "--oversubscribe"] + cmd
        e = mpi_env() if env is None else env
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e)
    if expect_ok and p.returncode != 0:
        print("command failed (%d): %s\n--- stdout\n%s\n--- stderr\n%s" %
              (p.returncode, " ".join(cmd), p.stdout[-4000:], p.stderr[-4000:]), flush=True)
    return p


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def sha256sums(ckpt):
    """{file name: hex digest} from a checkpoint's SHA256SUMS."""
    out = {}
    with open(os.path.join(ckpt, "SHA256SUMS")) as f:
        for line in f:
            digest, name = line.rstrip("\n").split("  ", 1)
            out[name] = digest
    return out


def checkpoints(d):
    return sorted(glob.glob(os.path.join(d, "step_*")))


def word_corpus(path, seed, lines):
    """A text file of `lines` lines of 5-15 words drawn from 40 ("w0".."w39"),
    reproducible from seed: a small corpus the GPT tests train on."""
    r = random.Random(seed)
    words = ["w%d" % i for i in range(40)]
    with open(path, "w") as f:
        for _ in range(lines):
            f.write(" ".join(r.choice(words) for _ in range(r.randint(5, 15))) + "\n")
