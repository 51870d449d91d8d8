"""Claim: a ZeRO-3 run on 3 ranks (threads backend: one process, so SIGKILL
takes every rank at once) killed at 20 random moments while it writes a
sharded checkpoint every step loses nothing saved before: every step_*
directory left verifies against its SHA256SUMS, and the newest one loads
whole (`plexus checkpoint consolidate`, which checks every rank's file and
that every element is in exactly one piece).  The test reports how many
kills left a .partial directory behind (landed inside a write) and needs
at least 5 of them: after the first 20 kills it goes on killing, up to 60,
until 5 have landed inside a write.  Where a step is slow against a write
(the sanitizer build: 4 of 20 inside), a fixed 20 could fall short by
chance; every kill is still at a random moment, and each one is checked.

If it fails, a sharded write can leave a complete-looking checkpoint with a
rank's file torn or missing, or install a step before every rank's file
is durable."""

import hashlib
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time

import cli_util as cu

ARGS = ["train", "--model", "mlp", "--hidden", "384", "--depth", "2", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "800", "--val-subset", "32", "--batch-size", "8", "--optim", "adam", "--lr", "0.001",
        "--ckpt-every", "1", "--keep-last", "2", "--steps", "100000", "--workers", "1", "--progress", "lines",
        "--quiet", "--zero", "3", "--threads", "3"]


def verifies(ck):
    sums = os.path.join(ck, "SHA256SUMS")
    if not os.path.exists(sums):
        return False
    for line in open(sums):
        digest, name = line.rstrip("\n").split("  ", 1)
        if not os.path.exists(os.path.join(ck, name)):
            return False
        with open(os.path.join(ck, name), "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != digest:
                return False
    return True


rng = random.Random(12)
tmp = tempfile.mkdtemp(prefix="px_cli_kill_sharded_")
inside = 0
MIN_TRIALS, MAX_TRIALS, MIN_INSIDE = 20, 60, 5
trials = 0
try:
    for trial in range(MAX_TRIALS):
        if trial >= MIN_TRIALS and inside >= MIN_INSIDE:
            break
        trials += 1
        out = os.path.join(tmp, "t%02d" % trial)
        ck = os.path.join(out, "checkpoints")
        proc = subprocess.Popen([cu.PLEXUS] + ARGS + ["--out", out], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            if os.path.isdir(ck) and any(n.startswith("step_") for n in os.listdir(ck)):
                break
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        names = os.listdir(ck) if os.path.isdir(ck) else []
        good = sorted(n for n in names if n.startswith("step_"))
        if any(".partial" in n for n in names):
            inside += 1
        cu.check(good, "trial %d: no complete checkpoint left: %s" % (trial, names))
        for n in good:
            cu.check(verifies(os.path.join(ck, n)), "trial %d: %s does not verify" % (trial, n))
        if good:
            dst = os.path.join(out, "whole.safetensors")
            p = cu.run(["checkpoint", "consolidate", ck, "--out", dst])
            cu.check(p.returncode == 0 and good[-1] in p.stdout,
                     "trial %d: the newest checkpoint %s does not load:\n%s%s" % (trial, good[-1], p.stdout, p.stderr))
        shutil.rmtree(out, ignore_errors=True)
    print("%d kills: %d inside a write (a .partial directory left), every checkpoint left verified and loaded" %
          (trials, inside))
    cu.check(inside >= MIN_INSIDE,
             "only %d of %d kills landed inside a write: the test proves little" % (inside, trials))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_sharded_checkpoint_survives_sigkill")
