"""Claim: every count `plexus train` multiplies out of its configuration is
checked, and a product past 64 bits ends the run with a clear error and a
non-zero exit, before any training:

- `--epochs 9000000000000000` (the top of the option's range) × 4096 steps
  per epoch: an error naming the epochs, the steps per epoch and the limit,
  on one process and on 2 ranks as threads (every rank says the same;
  before the fix such a product wrapped and the run exited 0 after "0
  steps");
- `--batch-size 16777216 --accum-steps 1048576 --dp 1048576` (each inside
  its range): the samples a step, refused naming the three factors;
- `--epochs 1000000000000000000` (the issue's example; past the range,
  9e15, the largest integer a JSON config reads back exactly): refused by
  the parser;
- the same huge `--epochs` with `--steps 3` and the largest `--seed` is a
  legitimate run (the steps decide its length): it trains 3 steps, exits
  0, and `plexus eval` reads its checkpoint's saved config back (with the
  old range, 1e18, a seed of 1e17 trained and then could not be read).

If it fails, a product wraps again (a run of 0 or a negative number of
steps, or a wrong global batch), or the check refuses runs it should not."""

import os
import shutil
import tempfile

import cli_util as cu

NAME = "test_config_counts_overflow_with_clear_error"
BASE = ["train", "--model", "mlp", "--hidden", "16", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "4096", "--val-subset", "64", "--batch-size", "1", "--workers", "1",
        "--progress", "lines", "--quiet"]
HUGE = "9000000000000000"


def refused(args, label, *want):
    p = cu.run(BASE + args, expect_ok=False, timeout=120)
    out = p.stdout + p.stderr
    cu.check(p.returncode != 0, "%s: exit 0 (output: %s)" % (label, out[-600:]))
    for w in want:
        cu.check(w in out, "%s: the error does not say %r: %s" % (label, w, out[-600:]))
    cu.check(" 0 steps" not in out and "done:" not in out, "%s: it ran: %s" % (label, out[-600:]))
    return out


tmp = tempfile.mkdtemp(prefix="px_cfg_overflow_")
try:
    refused(["--epochs", HUGE], "--epochs 9e15",
            "epochs %s × 4096 steps per epoch is more than 9223372036854775807 steps" % HUGE)
    out = refused(["--epochs", HUGE, "--threads", "2"], "--epochs 9e15 --threads 2",
                  "epochs %s × 2048 steps per epoch" % HUGE)
    cu.check("rank 0:" in out and "rank 1:" in out, "--threads 2: not every rank names the error: %s" % out[-600:])
    refused(["--batch-size", "16777216", "--accum-steps", "1048576", "--dp", "1048576"], "global batch",
            "--batch-size 16777216 x --accum-steps 1048576 x 1048576 ranks", "64-bit")
    refused(["--epochs", "1000000000000000000"], "--epochs 1e18", "--epochs", "outside")
    out = os.path.join(tmp, "steps")
    p = cu.run(BASE + ["--epochs", HUGE, "--seed", HUGE, "--steps", "3", "--out", out], timeout=120)
    if cu.check(p.returncode == 0, "--epochs 9e15 --steps 3 failed"):
        steps = [r for r in cu.jsonl(os.path.join(out, "metrics.jsonl")) if r["type"] == "step"]
        cu.check(steps and steps[-1]["step"] == 3 and steps[-1]["total_steps"] == 3,
                 "--steps 3 with huge --epochs: step records %s" % steps[-1:])
        e = cu.run(["eval", "--checkpoint", os.path.join(out, "checkpoints"), "--quiet"], timeout=120)
        cu.check(e.returncode == 0, "plexus eval cannot read back the saved config of --seed %s: %s" %
                 (HUGE, (e.stdout + e.stderr)[-400:]))
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish(NAME)
