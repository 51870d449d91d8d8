"""Claim: with batch norm on several ranks, the evaluation `plexus train`
logs equals `plexus eval` on the checkpoint it saved: the zoo's CNN (two
batch norms) on 2 and 3 ranks as threads and 2 processes under mpiexec,
with and without --sync-bn, and under ZeRO stage 1 (2 threads) -- the
held-out loss to 1e-6 relative (eval prints 6 decimals; the two sum the
same per-sample losses in another order) and the accuracy exactly.  DDP keeps one
copy of the running statistics (rank 0's, broadcast before each forward
that follows a training one), so every rank evaluates with the statistics
the checkpoint holds.

If it fails, the accuracy a run reports is not that of the model it saves
(each rank evaluating with its own running statistics)."""

import os
import re
import shutil
import tempfile

import cli_util as cu


def train(out, ranks, mpi, sync_bn, zero=0):
    args = ["train", "--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST,
            "--train-subset", "960", "--val-subset", "300", "--epochs", "1", "--batch-size", "16", "--lr", "0.01",
            "--log-every", "10", "--progress", "lines", "--seed", "3", "--out", out]
    if sync_bn:
        args.append("--sync-bn")
    if zero:
        args += ["--zero", str(zero)]
    if not mpi:
        args += ["--threads", str(ranks)]
    return cu.run(args, mpi_ranks=ranks if mpi else 0)


def main():
    tmp = tempfile.mkdtemp(prefix="px_bn_eval_")
    cases = [(2, False, s, 0) for s in (False, True)] + [(3, False, s, 0) for s in (False, True)]
    if cu.mpiexec():
        cases += [(2, True, s, 0) for s in (False, True)]
    else:
        print("(plexus built without MPI: the mpiexec case is skipped)")
    cases.append((2, False, False, 1))  # ZeRO keeps one copy of the buffers too
    try:
        for ranks, mpi, sync_bn, zero in cases:
            label = "%d %s%s%s" % (ranks, "processes (mpiexec)" if mpi else "threads", ", --sync-bn" if sync_bn else "",
                                   ", --zero %d" % zero if zero else "")
            out = os.path.join(tmp, "r%d%s%s%d" % (ranks, "m" if mpi else "t", "s" if sync_bn else "", zero))
            p = train(out, ranks, mpi, sync_bn, zero)
            if not cu.check(p.returncode == 0, "%s: train exited %d" % (label, p.returncode)):
                continue
            if sync_bn:
                cu.check("2 sync batch norms" in p.stdout, "%s: the start-up line does not say the batch norms "
                         "are synchronized: %s" % (label, p.stdout[:300]))
            evals = [r for r in cu.jsonl(os.path.join(out, "metrics.jsonl")) if r["type"] == "eval"]
            e = cu.run(["eval", "--checkpoint", os.path.join(out, "checkpoints")])
            m = re.search(r"loss ([0-9.]+), accuracy ([0-9.]+)", e.stdout)
            if not cu.check(evals and m, "%s: no logged evaluation or no eval result:\n%s" % (label, e.stdout)):
                continue
            logged, loss, acc = evals[-1], float(m.group(1)), float(m.group(2))
            print("%-32s logged loss %.6f accuracy %.6f | plexus eval loss %.6f accuracy %.6f" %
                  (label, logged["loss"], logged["accuracy"], loss, acc))
            cu.check(abs(logged["loss"] - loss) <= 1e-6 * abs(loss) + 5e-7,
                     "%s: logged held-out loss %.6f, plexus eval on the checkpoint %.6f" % (label, logged["loss"], loss))
            cu.check(abs(logged["accuracy"] - acc) <= 5e-7,
                     "%s: logged accuracy %.6f, plexus eval %.6f" % (label, logged["accuracy"], acc))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_cli_logged_eval_equals_eval_of_checkpoint_with_batch_norm")


main()
