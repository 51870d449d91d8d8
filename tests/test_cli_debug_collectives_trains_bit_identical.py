"""Claim: `plexus train --debug-collectives` (collective fingerprints: every
collective's arguments and call site compared across ranks before it runs)
raises no false alarm anywhere in a training run and changes no bit of it:
on 2 ranks (threads; and mpiexec -n 2 when plexus has MPI) a CNN with Adam,
clipping, accumulation, evaluation and checkpoints, under DDP and under
ZeRO 3, says "collective fingerprints on" in its start-up line (only with
the flag) and ends with the same checkpoint tensors (SHA-256 of every
.safetensors file) as the run without the flag; a resume with the flag
(--resume auto, 4 more steps) ends where the same resume without it ends;
and `train --help` names the flag.

If it failed, the debug mode would stop correct jobs with a divergence that
is none (a collective plexus itself calls differently on different ranks:
evaluation, checkpointing, resume, ZeRO's gathers) or would disturb what it
checks."""

import os
import shutil
import tempfile

import cli_util as cu

COMMON = ["train", "--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST,
          "--train-subset", "512", "--val-subset", "128", "--batch-size", "16", "--accum-steps", "2",
          "--optim", "adam", "--lr", "0.003", "--clip-grad", "0.5", "--eval-every", "5", "--log-every", "4",
          "--seed", "5", "--workers", "1", "--progress", "lines", "--ckpt-every", "5"]


def tensors(out):
    ck = cu.checkpoints(os.path.join(out, "checkpoints"))
    if not ck:
        return None, {}
    sums = cu.sha256sums(ck[-1])
    return os.path.basename(ck[-1]), {k: v for k, v in sums.items() if k.endswith(".safetensors")}


def same_run(tmp, label, extra, mpi_ranks=0, threads=2):
    launch = [] if mpi_ranks else ["--threads", str(threads)]
    outs = {}
    for flag in (False, True):
        out = os.path.join(tmp, "%s_%s" % (label, "on" if flag else "off"))
        args = COMMON + launch + extra + ["--steps", "10", "--out", out] + (["--debug-collectives"] if flag else [])
        p = cu.run(args, mpi_ranks=mpi_ranks)
        cu.check(p.returncode == 0, "%s%s: exit %d" % (label, " --debug-collectives" if flag else "", p.returncode))
        # The start-up line says so: the flag reached the communicator.
        cu.check(("collective fingerprints on" in p.stdout) == flag,
                 "%s: the start-up line %s the fingerprints: %s" % (label, "omits" if flag else "shows",
                                                                   p.stdout[:300]))
        outs[flag] = out
    (name_off, off), (name_on, on) = tensors(outs[False]), tensors(outs[True])
    cu.check(off and name_off == name_on == "step_00000010" and off == on,
             "%s: checkpoint tensors differ with the flag (%s %s vs %s %s)" % (label, name_off, off, name_on, on))
    # Resume both with the flag on one and off the other: the same end.
    ends = {}
    for flag in (False, True):
        out = os.path.join(tmp, "%s_resume_%s" % (label, "on" if flag else "off"))
        shutil.copytree(outs[False], out)
        args = (COMMON + launch + extra + ["--steps", "14", "--out", out, "--resume", "auto"] +
                (["--debug-collectives"] if flag else []))
        p = cu.run(args, mpi_ranks=mpi_ranks)
        cu.check(p.returncode == 0, "%s resume%s: exit %d" % (label, " --debug-collectives" if flag else "",
                                                             p.returncode))
        ends[flag] = tensors(out)
    cu.check(ends[False][1] and ends[False] == ends[True] and ends[True][0] == "step_00000014",
             "%s: resumed runs differ with the flag: %s vs %s" % (label, ends[False], ends[True]))
    print("%s: the same %d tensor file(s) with --debug-collectives, after training and after a resume"
          % (label, len(off)))


def main():
    p = cu.run(["train", "--help"])
    cu.check("--debug-collectives" in p.stdout, "train --help does not name --debug-collectives")
    tmp = tempfile.mkdtemp(prefix="px_debug_coll_")
    try:
        same_run(tmp, "threads ddp", [])
        same_run(tmp, "threads zero3", ["--zero", "3"])
        if cu.mpiexec():
            same_run(tmp, "mpi ddp", [], mpi_ranks=2)
        else:
            print("plexus has no MPI: the mpiexec case is not run")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_cli_debug_collectives_trains_bit_identical")


main()
