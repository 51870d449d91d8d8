"""Claim: `plexus train --pp 2 --schedule-pp 1f1b --micro-batches 4
--batch-size 32` is a run like any other: with a cosine schedule and
warm-up, evaluation every 3 steps and --out, it writes the same
metrics.jsonl step and evaluation records (loss, learning rate, gradient
norm, held-out loss and accuracy; 1e-5 relative), the same console lines
(the same words, numbers within 1e-5)
and the same end-of-run summary as one process running the same micro-batches
with `--batch-size 8 --accum-steps 4`.  The model is the zoo's CNN, which
has batch normalisation and dropout, so the pipeline's dropout masks and
batch statistics must be the one process's micro-batch by micro-batch.

If it fails: the pipeline path does not apply the learning-rate schedule
(lr records differ), does not log through the common logger (records
missing), evaluates other batches, or draws other dropout masks
(losses differ from the first step)."""

import os
import re
import shutil
import tempfile

import cli_util as cu

BASE = ["train", "--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST,
        "--train-subset", "512", "--val-subset", "64", "--steps", "6", "--log-every", "1", "--eval-every", "3",
        "--lr", "0.01", "--schedule", "cosine", "--warmup-steps", "2", "--num-threads", "1",
        "--progress", "lines"]


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def same_line(a, b):
    """The same words, and numbers within the records' 1e-5: the console
    prints 6 decimals, so a loss the two runs sum in another order can round
    to neighbouring last digits (2.513926 and 2.513925, seen on another BLAS
    kernel)."""
    wa, wb = a.split(), b.split()
    if len(wa) != len(wb):
        return False
    for x, y in zip(wa, wb):
        if x == y:
            continue
        try:
            fx, fy = float(x), float(y)
        except ValueError:
            return False
        if rel(fx, fy) > 1e-5:
            return False
    return True


def records(path):
    steps = [r for r in cu.jsonl(path) if r.get("type") == "step"]
    evals = [r for r in cu.jsonl(path) if r.get("type") == "eval"]
    return steps, evals


def console(out):
    # What the logger prints, less the throughput and time figures.
    lines = re.findall(r"^(step \d+/\d+ epoch \d+/\d+ loss \S+ lr \S+ grad_norm \S+)|^(eval step .*)$", out, re.M)
    summary = re.findall(r"^plexus train: done: (\d+) steps in .*?\); (.*)$", out, re.M)
    return [a or b for a, b in lines], summary


def main():
    tmp = tempfile.mkdtemp(prefix="px_pp_cli_")
    try:
        runs = {}
        for name, args in [("pp 2 1f1b", ["--threads", "2", "--pp", "2", "--schedule-pp", "1f1b",
                                          "--micro-batches", "4", "--batch-size", "32"]),
                           ("one process, accum 4", ["--batch-size", "8", "--accum-steps", "4"])]:
            out = os.path.join(tmp, name.replace(" ", "_").replace(",", ""))
            p = cu.run(BASE + args + ["--out", out], timeout=300)
            if not cu.check(p.returncode == 0, "%s: exit %d" % (name, p.returncode)):
                continue
            runs[name] = (records(os.path.join(out, "metrics.jsonl")), console(p.stdout))
        if len(runs) == 2:
            (ps, pe), (pc, psum) = runs["pp 2 1f1b"]
            (ss, se), (sc, ssum) = runs["one process, accum 4"]
            cu.check(len(ps) == 6 and len(ss) == 6, "step records: pp %d, one process %d" % (len(ps), len(ss)))
            cu.check(len(pe) == 2 and len(se) == 2, "eval records: pp %d, one process %d" % (len(pe), len(se)))
            for a, b in zip(ps, ss):
                for k in ("step", "total_steps", "epoch"):
                    cu.check(a[k] == b[k], "step %s: %s %s against %s" % (b["step"], k, a[k], b[k]))
                for k in ("loss", "lr", "grad_norm"):
                    cu.check(rel(a[k], b[k]) <= 1e-5, "step %s: %s %.8g, one process %.8g" %
                             (b["step"], k, a[k], b[k]))
            lrs = [r["lr"] for r in ps]
            cu.check(lrs[1] > lrs[0] and lrs[-1] < lrs[2], "no warm-up and cosine decay in %s" % lrs)
            for a, b in zip(pe, se):
                cu.check(a["step"] == b["step"] and a["samples"] == b["samples"], "eval %s against %s" % (a, b))
                for k in ("loss", "accuracy"):
                    cu.check(rel(a[k], b[k]) <= 1e-5, "eval at step %s: %s %.8g, one process %.8g" %
                             (b["step"], k, a[k], b[k]))
            cu.check(len(pc) == 8 and len(sc) == 8 and all(same_line(a, b) for a, b in zip(pc, sc)),
                     "console lines differ:\n%s\nagainst\n%s" % (pc, sc))
            cu.check(len(psum) == 1 and psum == ssum, "summaries differ: %s against %s" % (psum, ssum))
            print("  step losses %s, held-out %s" % ([round(r["loss"], 6) for r in ps], psum))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_pp_cli_train_logs_as_one_process_with_accum_steps")


main()
