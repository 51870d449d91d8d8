"""Claim: `plexus train --pp P --micro-batches M --schedule-pp S` trains the
zoo's MLP on Fashion-MNIST through the pipeline, and the run does not depend
on how it is cut or launched: P = 2 and 4 ranks as threads, GPipe, 1F1B and
interleaved, and (with MPI) 2 processes under mpiexec print the same loss at
every logged step and the same held-out loss, digit for digit (the pipeline
computes the single model's math; only where it runs changes); the loss
falls.  A --pp that does not divide the number of ranks, and a batch that does not
split into the micro-batches, are refused naming both numbers, and --pp
with --tp on the MLP (no layers to split) is refused, not run as a pipeline
alone (3D runs: test_pp_cli_3d_trains_like_ddp_and_rejects_bad_meshes.py).

If it fails: the CLI does not hand the options to the executor, a stage
split changes the arithmetic, or the ranks see different batches."""

import re

import cli_util as cu

BASE = ["train", "--model", "mlp", "--depth", "3", "--hidden", "32", "--data", "mnist",
        "--data-path", cu.FMNIST, "--train-subset", "1024", "--val-subset", "256",
        "--batch-size", "32", "--micro-batches", "4", "--steps", "20", "--log-every", "5",
        "--lr", "0.002", "--num-threads", "1", "--progress", "lines"]


def losses(out):
    steps = re.findall(r"^step (\d+)/\d+ epoch \d+/\d+ loss ([0-9.]+) ", out, re.M)
    held = re.findall(r"^plexus train: done: .*; (?:test|held-out) loss ([0-9.]+)", out, re.M)
    return steps, held


def main():
    runs = {}
    for name, args, mpi in [("threads pp 2 gpipe", ["--threads", "2", "--pp", "2", "--schedule-pp", "gpipe"], 0),
                            ("threads pp 2 1f1b", ["--threads", "2", "--pp", "2", "--schedule-pp", "1f1b"], 0),
                            ("threads pp 4 1f1b", ["--threads", "4", "--pp", "4", "--schedule-pp", "1f1b"], 0),
                            ("threads pp 2 interleaved",
                             ["--threads", "2", "--pp", "2", "--schedule-pp", "interleaved"], 0),
                            ("mpiexec pp 2 1f1b", ["--pp", "2", "--schedule-pp", "1f1b"], 2)]:
        if mpi and not cu.mpiexec():
            print("  (no MPI build: skipping %s)" % name)
            continue
        p = cu.run(BASE + args, mpi_ranks=mpi, timeout=300)
        if not cu.check(p.returncode == 0, "%s: exit %d" % (name, p.returncode)):
            continue
        runs[name] = losses(p.stdout)
        print("  %s: steps %s, held-out %s" % (name, runs[name][0][-1:], runs[name][1]))
    first = next(iter(runs.values()), None)
    cu.check(first is not None and len(first[0]) == 4 and len(first[1]) == 1, "no losses: %s" % (first,))
    if first:
        cu.check(float(first[0][-1][1]) < float(first[0][0][1]) - 0.2,
                 "the loss did not fall: %s" % (first[0],))
        for name, r in runs.items():
            cu.check(r == first, "%s differs: %s against %s" % (name, r, first))
    p = cu.run(BASE + ["--threads", "2", "--pp", "3"], expect_ok=False)
    cu.check(p.returncode != 0 and "--tp 1 × --pp 3 = 3 does not divide the world size 2" in p.stderr,
             "--pp 3 on 2 ranks: %d %s" % (p.returncode, p.stderr[-300:]))
    p = cu.run(BASE + ["--threads", "2", "--pp", "2", "--batch-size", "30"], expect_ok=False)
    cu.check(p.returncode != 0 and "--batch-size 30" in p.stderr and "--micro-batches 4" in p.stderr,
             "batch 30 in 4 micro-batches: %d %s" % (p.returncode, p.stderr[-300:]))
    p = cu.run(BASE + ["--threads", "4", "--pp", "2", "--tp", "2"], expect_ok=False)
    cu.check(p.returncode != 0 and "tensor parallelism splits a GPT's layers" in p.stderr,
             "--pp 2 --tp 2 with the MLP: %d %s" % (p.returncode, p.stderr[-300:]))
    cu.finish("test_pp_cli_train_same_losses_any_schedule_or_launcher")


main()
