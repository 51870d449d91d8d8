"""Claim: a training run killed with SIGKILL while it writes a checkpoint
loses nothing that was saved before: the previous checkpoint still verifies
and loads (`plexus eval` on the directory uses it), the partial one is
ignored with a message (`plexus inspect`, and the resumed run's log), and
`plexus train --resume auto` continues from the previous checkpoint and
removes the partial directory when it writes its next one.

The model is a wide MLP (about 21 million parameters: each checkpoint is
some 250 MB with Adam's two moments), so a write lasts long enough for the
test to see the partial directory appear and kill the process inside it.

And SIGTERM (a Slurm time limit, `scancel --signal`) ends a run after the
current step with a checkpoint there and exit status 75, for a requeued job
to resume.

If it fails, a checkpoint write is not atomic (a torn file looks complete),
the reader trusts an incomplete directory, or resume picks the wrong one."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

import cli_util as cu

ARGS = ["train", "--model", "mlp", "--hidden", "4096", "--depth", "2", "--data", "mnist",
        "--data-path", cu.FMNIST, "--train-subset", "512", "--val-subset", "256", "--batch-size", "32",
        "--optim", "adam", "--lr", "0.0001", "--log-every", "1", "--ckpt-every", "2", "--keep-last", "2",
        "--workers", "1", "--progress", "lines", "--threads", "1"]

tmp = tempfile.mkdtemp(prefix="px_cli_kill_")
try:
    out = os.path.join(tmp, "run")
    ck = os.path.join(out, "checkpoints")
    proc = subprocess.Popen([cu.PLEXUS] + ARGS + ["--steps", "40", "--out", out], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    killed_in = None
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        names = os.listdir(ck) if os.path.isdir(ck) else []
        done = [n for n in names if n.startswith("step_")]
        partial = [n for n in names if ".partial" in n]
        if done and partial:
            proc.send_signal(signal.SIGKILL)
            killed_in = partial[0]
            break
        time.sleep(0.001)
    proc.wait()
    cu.check(killed_in is not None, "never saw a checkpoint being written next to a complete one")
    if killed_in:
        names = os.listdir(ck)
        good = sorted(n for n in names if n.startswith("step_"))
        cu.check(any(".partial" in n for n in names), "the partial directory vanished: %s" % names)
        cu.check(len(good) >= 1, "no complete checkpoint left: %s" % names)

        p = cu.run(["inspect", ck])
        cu.check(p.returncode == 0 and "incomplete" in p.stdout and "newest good checkpoint" in p.stdout,
                 "inspect does not report the partial one and the newest good one:\n" + p.stdout)
        newest = os.path.join(ck, good[-1])
        p = cu.run(["inspect", newest])
        cu.check(p.returncode == 0 and "verified" in p.stdout, "the previous checkpoint does not verify:\n" + p.stdout)
        p = cu.run(["eval", "--checkpoint", ck, "--val-subset", "256", "--threads", "1"])
        cu.check(p.returncode == 0 and good[-1] in p.stdout, "eval did not use %s:\n%s%s" % (good[-1], p.stdout,
                                                                                           p.stderr))

        step = int(good[-1][len("step_"):])
        p = cu.run(ARGS + ["--steps", str(step + 2), "--resume", "auto", "--out", out])
        cu.check(p.returncode == 0, "the resumed run failed")
        cu.check("resumed from %s" % newest in p.stdout, "the run did not resume from %s:\n%s" % (newest, p.stdout))
        cu.check("incomplete" in p.stdout or "incomplete" in p.stderr,
                 "the resumed run did not mention the partial checkpoint it skipped")
        names = os.listdir(ck)
        cu.check(not any(".partial" in n for n in names), "the partial directory was not cleaned up: %s" % names)
        cu.check("step_%08d" % (step + 2) in names, "no checkpoint at step %d: %s" % (step + 2, names))

    # SIGTERM (what Slurm sends before a time limit, or --signal) ends the run
    # after the current step with a checkpoint there, and exit status 75.
    out2 = os.path.join(tmp, "term")
    proc = subprocess.Popen([cu.PLEXUS] + ARGS + ["--steps", "400", "--ckpt-every", "1000", "--out", out2],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = os.path.join(out2, "metrics.jsonl")
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(metrics) and any('"type":"step"' in l for l in open(metrics)):
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.01)
    stdout, stderr = proc.communicate(timeout=240)
    cu.check(proc.returncode == 75, "SIGTERM: exit %s, expected 75\n%s%s" % (proc.returncode, stdout, stderr))
    cu.check("stopped at step" in stdout, "SIGTERM: no 'stopped at step' line:\n" + stdout)
    ck2 = cu.checkpoints(os.path.join(out2, "checkpoints"))
    cu.check(len(ck2) == 1, "SIGTERM: %d checkpoints, expected the one at the stop" % len(ck2))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_checkpoint_survives_sigkill")
