"""Claim: `plexus train --out DIR` never mixes two runs in one directory.

- A directory that holds a run (checkpoints, metrics.jsonl records,
  TensorBoard events) is refused without --resume, with a message naming
  what it found and the ways on (--resume auto, another --out,
  --overwrite); the old run's files are byte-identical afterwards.  Under
  mpiexec -n 2 every rank stops alike (exit 1, the message once).
- A second run into a directory a running run holds is refused, naming the
  first run's host and process (a flock on DIR/.plexus.lock); the first
  run's files are byte-identical afterwards (the first run is paused with
  SIGSTOP while the second tries, so nothing else moves them).
- --overwrite replaces the old run: none of its checkpoints, metric records
  or event files remain beside the new run's.
- --resume auto continues the run in place.
- A run without --out (nor --ckpt-dir, --jsonl, --tensorboard) says once
  that nothing will be saved.

If it fails, a second run can append to or replace another run's files
(checkpoints, metrics, events) without a word."""

import glob
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import cli_util as cu

BASE = ["train", "--model", "mlp", "--hidden", "16", "--data-path", cu.FMNIST, "--train-subset", "256",
        "--val-subset", "64", "--batch-size", "32", "--log-every", "2", "--progress", "lines"]


def snapshot(d):
    """{relative path: sha256} of every file under d."""
    out = {}
    for root, _, files in os.walk(d):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="px_rundir_")
    try:
        out = os.path.join(tmp, "run")
        p = cu.run(BASE + ["--threads", "2", "--steps", "4", "--ckpt-every", "2", "--out", out])
        cu.check(p.returncode == 0, "the first run failed")
        cu.check(os.path.exists(os.path.join(out, "config.json")), "no config.json in the run directory")
        before = snapshot(out)

        # Into a directory holding a run, without --resume: refused, untouched.
        for label, mpi in (("threads", 0), ("mpiexec -n 2", 2 if cu.mpiexec() else 0)):
            if label.startswith("mpiexec") and not mpi:
                continue
            args = BASE + ["--steps", "2", "--out", out] + ([] if mpi else ["--threads", "2"])
            q = cu.run(args, mpi_ranks=mpi, expect_ok=False)
            cu.check(q.returncode != 0, "%s: a second run into %s was not refused" % (label, out))
            err = q.stderr
            cu.check("already holds a run" in err and "step_00000004" in err and "metrics.jsonl" in err,
                     "%s: the refusal does not name the run found: %s" % (label, err[-600:]))
            cu.check("--resume auto" in err and "--overwrite" in err and "another --out" in err,
                     "%s: the refusal does not say the ways on: %s" % (label, err[-600:]))
            cu.check(err.count("already holds a run") == 1, "%s: the refusal printed %d times" %
                     (label, err.count("already holds a run")))
            cu.check(snapshot(out) == before, "%s: the refused run changed the old run's files" % label)

        # A run in progress holds the directory: a second one is refused, naming it.
        live = os.path.join(tmp, "live")
        cmd = [cu.PLEXUS] + BASE + ["--threads", "2", "--epochs", "1000", "--ckpt-every", "5", "--out", live]
        first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.time() + 60
            while time.time() < deadline and not glob.glob(os.path.join(live, "checkpoints", "step_*")):
                time.sleep(0.05)
            os.kill(first.pid, signal.SIGSTOP)
            time.sleep(0.2)
            held = snapshot(live)
            q = cu.run(BASE + ["--threads", "2", "--steps", "2", "--out", live], expect_ok=False)
            cu.check(q.returncode != 0, "a run into a directory a live run holds was not refused")
            cu.check("another run is writing" in q.stderr and ("process %d" % first.pid) in q.stderr and
                     socket.gethostname() in q.stderr,
                     "the refusal does not name the first run's host and process (%s, %d): %s" %
                     (socket.gethostname(), first.pid, q.stderr[-600:]))
            q2 = cu.run(BASE + ["--threads", "2", "--steps", "2", "--out", live, "--overwrite"], expect_ok=False)
            cu.check(q2.returncode != 0 and "another run is writing" in q2.stderr,
                     "--overwrite replaced a directory a live run holds")
            cu.check(snapshot(live) == held, "the refused runs changed the live run's files")
        finally:
            os.kill(first.pid, signal.SIGCONT)
            first.terminate()
            first.wait(timeout=60)

        # --overwrite: nothing of the old run remains.
        p = cu.run(BASE + ["--threads", "2", "--steps", "2", "--out", out, "--overwrite"])
        cu.check(p.returncode == 0, "--overwrite failed")
        ckpts = sorted(os.path.basename(c) for c in glob.glob(os.path.join(out, "checkpoints", "step_*")))
        cu.check(ckpts == ["step_00000002"], "after --overwrite the checkpoints are %s" % ckpts)
        recs = cu.jsonl(os.path.join(out, "metrics.jsonl"))
        steps = [r["step"] for r in recs if r["type"] == "step"]
        cu.check(steps == [2], "after --overwrite metrics.jsonl holds steps %s" % steps)
        cu.check(len(glob.glob(os.path.join(out, "tensorboard", "events.out.tfevents.*"))) == 1,
                 "after --overwrite the old event file remains")
        cu.check(not glob.glob(os.path.join(out, ".plexus-overwritten*")), "--overwrite left its trash behind")

        # --resume auto continues in place.
        p = cu.run(BASE + ["--threads", "2", "--steps", "4", "--out", out, "--resume", "auto"])
        cu.check(p.returncode == 0, "--resume auto into the run's directory failed")
        steps = [r["step"] for r in cu.jsonl(os.path.join(out, "metrics.jsonl")) if r["type"] == "step"]
        cu.check(steps == [2, 4], "--resume auto: metrics.jsonl holds steps %s" % steps)

        # No --out: said once.
        p = cu.run(BASE + ["--steps", "1"])
        n = p.stdout.count("nothing will be saved")
        cu.check(p.returncode == 0 and n == 1, "a run without --out said 'nothing will be saved' %d times:\n%s" %
                 (n, p.stdout[:500]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_cli_run_directory_is_locked_and_never_mixed")


main()
