"""Claim: every count `plexus train` multiplies out of its configuration is
checked, and a product past 64 bits ends the run with a clear error and a
non-zero exit, before any training:

- `--epochs 1000000000000000000` (inside the option's documented range, up
  to 1e18) × 200 steps per epoch: an error naming the epochs, the steps per
  epoch and the limit, on one process and on 2 ranks as threads (every rank
  says the same; before the fix the product wrapped and the run exited 0
  after "0 steps");
- `--batch-size 16777216 --accum-steps 1048576 --dp 1048576` (each inside
  its range): the samples a step, refused naming the three factors;
- `--epochs 10000000000000000000` (past the range): refused by the parser;
- the same huge `--epochs` with `--steps 3` is a legitimate run (the steps
  decide its length): it trains 3 steps and exits 0.

If it fails, a product wraps again (a run of 0 or a negative number of
steps, or a wrong global batch), or the check refuses runs it should not."""

import os
import shutil
import tempfile

import cli_util as cu

NAME = "test_config_counts_overflow_with_clear_error"
BASE = ["train", "--model", "mlp", "--hidden", "16", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "6400", "--val-subset", "64", "--batch-size", "32", "--workers", "1",
        "--progress", "lines", "--quiet"]
HUGE = "1000000000000000000"


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
    refused(["--epochs", HUGE], "--epochs 1e18",
            "epochs %s × 200 steps per epoch is more than 9223372036854775807 steps" % HUGE)
    out = refused(["--epochs", HUGE, "--threads", "2", "--batch-size", "16"], "--epochs 1e18 --threads 2",
                  "epochs %s × 200 steps per epoch" % HUGE)
    cu.check("rank 0:" in out and "rank 1:" in out, "--threads 2: not every rank names the error: %s" % out[-600:])
    refused(["--batch-size", "16777216", "--accum-steps", "1048576", "--dp", "1048576"], "global batch",
            "--batch-size 16777216 x --accum-steps 1048576 x 1048576 ranks", "64-bit")
    refused(["--epochs", "10000000000000000000"], "--epochs 1e19", "--epochs")
    p = cu.run(BASE + ["--epochs", HUGE, "--steps", "3", "--out", os.path.join(tmp, "steps")], timeout=120)
    if cu.check(p.returncode == 0, "--epochs 1e18 --steps 3 failed"):
        steps = [r for r in cu.jsonl(os.path.join(tmp, "steps", "metrics.jsonl")) if r["type"] == "step"]
        cu.check(steps and steps[-1]["step"] == 3 and steps[-1]["total_steps"] == 3,
                 "--steps 3 with huge --epochs: step records %s" % steps[-1:])
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish(NAME)
