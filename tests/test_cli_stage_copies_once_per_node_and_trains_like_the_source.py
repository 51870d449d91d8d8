"""Claim: `plexus train --stage DIR` copies the token shards once per node
-- two ranks as threads, and two processes under mpiexec on this one node:
exactly one stage line (local rank 0's) saying it copied all 3 files --
and trains from the copy with the same losses, step by step, as from the
source.  A second run copies nothing (reused 3); a staged shard truncated
between runs is found, copied again (damaged 1) and the losses stay the
same.  An HDF5 file (--data hdf5, written by h5py) is staged the same
way: copied 1 of 1, the staged file is the source's bytes, the losses are
the unstaged file's, and a second run copies nothing (reused 1).

If it failed, every rank of a node would copy, later runs would copy again,
a damaged copy would be trained on, or the staged data would not be the
source's."""

import os
import re
import shutil
import struct
import random
import tempfile

import h5py  # python3-h5py (scripts/dev TEST_PKGS)
import numpy as np

import cli_util as cu

SHARDS = 3


def write_shards(d):
    rng = random.Random(5)
    for k in range(SHARDS):
        n = 3000 + 500 * k
        toks = [rng.randrange(64) for _ in range(n)]
        with open(os.path.join(d, "shard_%06d.bin" % k), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
            f.write(struct.pack("<%dH" % n, *toks))


def train(src, out, stage=None, mpi_ranks=0):
    args = ["train", "--model", "gpt", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--context", "16",
            "--vocab-size", "64", "--data", "tokens", "--data-path", os.path.join(src, "shard_*.bin"),
            "--steps", "6", "--batch-size", "4", "--log-every", "1", "--progress", "lines", "--out", out]
    if stage:
        args += ["--stage", stage]
    if not mpi_ranks:
        args += ["--threads", "2"]
    p = cu.run(args, mpi_ranks=mpi_ranks)
    losses = []
    if p.returncode == 0:
        losses = [r["loss"] for r in cu.jsonl(os.path.join(out, "metrics.jsonl")) if r.get("type") == "step"]
    return p, losses


def stage_lines(p):
    return [l for l in (p.stdout + p.stderr).splitlines() if "plexus train: stage:" in l]


def write_h5(path):
    rng = np.random.default_rng(7)
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=rng.integers(0, 256, size=(96, 1, 8, 8), dtype=np.uint8), chunks=(32, 1, 8, 8),
                         compression="gzip")
        f.create_dataset("labels", data=rng.integers(0, 4, size=96).astype(np.int64))


def train_h5(path, out, stage=None):
    args = ["train", "--model", "cnn", "--channels", "4", "--data", "hdf5", "--data-path", path, "--h5-x", "images",
            "--h5-y", "labels", "--steps", "4", "--batch-size", "16", "--seed", "3", "--log-every", "1",
            "--progress", "lines", "--threads", "2", "--out", out]
    if stage:
        args += ["--stage", stage]
    p = cu.run(args)
    losses = []
    if p.returncode == 0:
        losses = [r["loss"] for r in cu.jsonl(os.path.join(out, "metrics.jsonl")) if r.get("type") == "step"]
    return p, losses


def check_stage(p, label, copied, damaged=0, files=SHARDS):
    lines = stage_lines(p)
    if not cu.check(len(lines) == 1, "%s: %d stage lines, expected exactly one (local rank 0's):\n%s" %
                    (label, len(lines), "\n".join(lines))):
        return
    m = re.search(r"rank (\d+) \(local rank 0\): .*copied (\d+) of (\d+) files.*reused (\d+), damaged (\d+)", lines[0])
    if not cu.check(m, "%s: unreadable stage line: %s" % (label, lines[0])):
        return
    got = tuple(int(g) for g in m.groups())
    want = (0, copied, files, files - copied, damaged)
    cu.check(got == want, "%s: stage line says rank %d copied %d of %d, reused %d, damaged %d; expected %s" %
             ((label,) + got + (want,)))


def main():
    tmp = tempfile.mkdtemp(prefix="px_stage_cli_")
    shm = tempfile.mkdtemp(prefix="px_stage_cli_", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        src = os.path.join(tmp, "src")
        os.makedirs(src)
        write_shards(src)
        p, ref = train(src, os.path.join(tmp, "ref"))
        cu.check(p.returncode == 0 and len(ref) == 6, "the unstaged run failed or logged %d steps" % len(ref))
        cu.check(not stage_lines(p), "a run without --stage printed a stage line")

        stage = os.path.join(shm, "threads")
        p, l1 = train(src, os.path.join(tmp, "t1"), stage)
        check_stage(p, "threads, first run", copied=SHARDS)
        cu.check(l1 == ref, "threads: losses from the stage %s differ from the source's %s" % (l1, ref))
        sets = [d for d in os.listdir(stage)]
        cu.check(len(sets) == 1, "the stage holds %s, expected one set" % sets)
        staged = os.path.join(stage, sets[0]) if sets else stage
        for k in range(SHARDS):
            a = open(os.path.join(src, "shard_%06d.bin" % k), "rb").read()
            b = open(os.path.join(staged, "shard_%06d.bin" % k), "rb").read() if sets else b""
            cu.check(a == b, "staged shard %d differs from the source" % k)

        p, l2 = train(src, os.path.join(tmp, "t2"), stage)
        check_stage(p, "threads, second run", copied=0)
        cu.check(l2 == ref, "threads, reused stage: losses differ")

        victim = os.path.join(staged, "shard_000001.bin")
        if os.path.exists(victim):
            os.truncate(victim, os.path.getsize(victim) // 2)
        p, l3 = train(src, os.path.join(tmp, "t3"), stage)
        check_stage(p, "threads, truncated copy", copied=1, damaged=1)
        cu.check(l3 == ref, "threads, after re-copying a truncated shard: losses differ")

        # An HDF5 file: one file, staged as text is.
        h5 = os.path.join(src, "train.h5")
        write_h5(h5)
        p, href = train_h5(h5, os.path.join(tmp, "href"))
        cu.check(p.returncode == 0 and len(href) == 4, "hdf5: the unstaged run failed or logged %d steps" % len(href))
        hstage = os.path.join(shm, "hdf5")
        p, h1 = train_h5(h5, os.path.join(tmp, "h1"), hstage)
        check_stage(p, "hdf5, first run", copied=1, files=1)
        cu.check(h1 == href, "hdf5: losses from the stage %s differ from the source's %s" % (h1, href))
        hsets = os.listdir(hstage) if os.path.isdir(hstage) else []
        staged_h5 = os.path.join(hstage, hsets[0], "train.h5") if len(hsets) == 1 else ""
        cu.check(staged_h5 and os.path.exists(staged_h5) and open(staged_h5, "rb").read() == open(h5, "rb").read(),
                 "hdf5: the stage %s does not hold the source's bytes as train.h5" % hsets)
        p, h2 = train_h5(h5, os.path.join(tmp, "h2"), hstage)
        check_stage(p, "hdf5, second run", copied=0, files=1)
        cu.check(h2 == href, "hdf5, reused stage: losses differ")
        print("hdf5: staged once, reused once, %d losses equal the unstaged file's" % len(href))

        if cu.mpiexec():
            p, mref = train(src, os.path.join(tmp, "mref"), mpi_ranks=2)
            cu.check(p.returncode == 0 and len(mref) == 6, "mpiexec, unstaged: failed")
            stage = os.path.join(shm, "mpi")
            p, m1 = train(src, os.path.join(tmp, "m1"), stage, mpi_ranks=2)
            cu.check("2 ranks (mpi backend)" in p.stdout, "mpiexec: not 2 MPI ranks: %s" % p.stdout[:300])
            check_stage(p, "mpiexec -n 2, first run", copied=SHARDS)
            cu.check(m1 == mref, "mpiexec: losses from the stage %s differ from the source's %s" % (m1, mref))
            p, m2 = train(src, os.path.join(tmp, "m2"), stage, mpi_ranks=2)
            check_stage(p, "mpiexec -n 2, second run", copied=0)
            cu.check(m2 == mref, "mpiexec, reused stage: losses differ")
        else:
            print("plexus was built without MPI: the mpiexec part is not run")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    cu.finish("test_cli_stage_copies_once_per_node_and_trains_like_the_source")


main()
