"""Claim: HDF5 files written by h5py (chunked, gzip + shuffle filters) load
with batches identical to the IDX and token-shard sources, and
`plexus train --data hdf5` on the CNN logs the same losses, step for step
and for the held-out split, as the same run from the IDX files.

- h5py writes the first 640 Fashion-MNIST training images as (N, 1, 28, 28)
  uint8 with int64 labels, and a uint16 token array (with the same tokens
  as an llm.c shard written here); the C test binary
  test_hdf5_batches_equal_idx_and_token_sources compares their batches
  over two shuffled epochs with those of the IDX and shard sources.
- The CLI: --data hdf5 (training file and a --val-path file of the first
  64 test images) against --data mnist --train-subset 640 --val-subset 64,
  6 steps with 2 loader workers: every step's loss and gradient norm and
  every evaluation's loss and accuracy in metrics.jsonl equal; and a small
  GPT, --data hdf5 --h5-layout tokens against --data tokens on the shard:
  the same 3 step losses.

If it failed, a dataset copied into HDF5 with h5py (the usual way) would
train on other data than the original files, or the CLI would read the
HDF5 file differently from the library."""

import gzip
import os
import shutil
import subprocess
import tempfile

import h5py  # python3-h5py (scripts/dev TEST_PKGS)
import numpy as np

import cli_util as cu

N_TRAIN, N_VAL, N_TOK, VOCAB = 640, 64, 3001, 30000


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def write_images(path, images, labels):
    n = images.shape[0]
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=images.reshape(n, 1, 28, 28), chunks=(min(n, 64), 1, 28, 28), compression="gzip",
                         compression_opts=4, shuffle=True)
        f.create_dataset("labels", data=labels.astype(np.int64), chunks=(min(n, 256),), compression="gzip")


def losses(run_dir):
    out = {}
    for r in cu.jsonl(os.path.join(run_dir, "metrics.jsonl")):
        if r.get("type") == "step":
            out[("train/loss", r["step"])] = (r["loss"], r["grad_norm"])
        elif r.get("type") == "eval":
            out[("eval/loss", r["step"])] = (r["loss"], r.get("accuracy"))
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="px_h5py_")
    try:
        train_x = idx(os.path.join(cu.FMNIST, "train-images-idx3-ubyte.gz"))[:N_TRAIN]
        train_y = idx(os.path.join(cu.FMNIST, "train-labels-idx1-ubyte.gz"))[:N_TRAIN]
        val_x = idx(os.path.join(cu.FMNIST, "t10k-images-idx3-ubyte.gz"))[:N_VAL]
        val_y = idx(os.path.join(cu.FMNIST, "t10k-labels-idx1-ubyte.gz"))[:N_VAL]
        train_h5, val_h5 = os.path.join(tmp, "train.h5"), os.path.join(tmp, "val.h5")
        write_images(train_h5, train_x, train_y)
        write_images(val_h5, val_x, val_y)

        tokens = np.random.default_rng(5).integers(0, VOCAB, size=N_TOK).astype(np.uint16)
        tok_h5, shard = os.path.join(tmp, "tokens.h5"), os.path.join(tmp, "train_000000.bin")
        with h5py.File(tok_h5, "w") as f:
            f.create_dataset("tokens", data=tokens, chunks=(500,), compression="gzip")
        header = np.zeros(256, dtype="<i4")
        header[:3] = (20240520, 1, N_TOK)
        with open(shard, "wb") as f:
            f.write(header.tobytes() + tokens.astype("<u2").tobytes())

        # The batches, through the C test binary.
        exe = os.path.join(cu.BUILD, "tests", "test_hdf5_batches_equal_idx_and_token_sources")
        p = subprocess.run([exe, "--h5py-images", train_h5, "--h5py-tokens", tok_h5, "--shard", shard,
                            "--n", str(N_TRAIN)], capture_output=True, text=True, timeout=300)
        print(p.stdout, p.stderr, end="")
        cu.check(p.returncode == 0, "h5py files: batches differ from the IDX / shard sources (exit %d)" % p.returncode)

        # The CLI: the same run from HDF5 and from IDX.
        common = ["train", "--model", "cnn", "--channels", "4", "--batch-size", "32", "--steps", "6",
                  "--eval-every", "3", "--log-every", "1", "--seed", "3", "--workers", "2", "--progress", "lines",
                  "--quiet"]
        idx_run, h5_run = os.path.join(tmp, "idx"), os.path.join(tmp, "h5")
        p = cu.run(common + ["--data", "mnist", "--data-path", cu.FMNIST, "--train-subset", str(N_TRAIN),
                             "--val-subset", str(N_VAL), "--out", idx_run])
        cu.check(p.returncode == 0, "the IDX run failed")
        p = cu.run(common + ["--data", "hdf5", "--data-path", train_h5, "--val-path", val_h5, "--h5-x", "images",
                             "--h5-y", "labels", "--mean", "0.2860", "--std", "0.3530", "--out", h5_run])
        cu.check(p.returncode == 0, "the HDF5 run failed")
        if cu.failures == 0:
            a, b = losses(idx_run), losses(h5_run)
            train_steps = sorted(s for t, s in a if t == "train/loss")
            evals = sorted(s for t, s in a if t == "eval/loss")
            cu.check(train_steps == list(range(1, 7)), "IDX run logged train/loss at steps %s" % train_steps)
            cu.check(len(evals) >= 2, "IDX run logged eval/loss at steps %s" % evals)
            cu.check(a == b, "losses differ:\n  idx  %s\n  hdf5 %s" % (sorted(a.items()), sorted(b.items())))
            print("CLI: %d losses identical from IDX and HDF5 (last train loss %.6f)" %
                  (len(a), a[("train/loss", 6)][0] if ("train/loss", 6) in a else float("nan")))
        # The GPT on the token array: --data hdf5 --h5-layout tokens against --data tokens (the shard).
        gpt = ["train", "--model", "gpt", "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--context", "16",
               "--vocab-size", str(VOCAB), "--batch-size", "8", "--steps", "3", "--log-every", "1", "--seed", "4",
               "--workers", "2", "--progress", "lines", "--quiet"]
        tok_run, h5tok_run = os.path.join(tmp, "tok"), os.path.join(tmp, "h5tok")
        p = cu.run(gpt + ["--data", "tokens", "--data-path", shard, "--out", tok_run])
        cu.check(p.returncode == 0, "the token-shard GPT run failed")
        p = cu.run(gpt + ["--data", "hdf5", "--h5-layout", "tokens", "--data-path", tok_h5, "--out", h5tok_run])
        cu.check(p.returncode == 0, "the HDF5 token GPT run failed")
        if p.returncode == 0:
            a, b = losses(tok_run), losses(h5tok_run)
            cu.check(len(a) == 3 and a == b, "GPT losses differ:\n  shard %s\n  hdf5  %s" % (sorted(a.items()),
                                                                                          sorted(b.items())))
            print("CLI: GPT %d losses identical from the shard and the HDF5 token array" % len(a))
        # A wrong dataset name on the command line names the file and the dataset.
        p = cu.run(common + ["--data", "hdf5", "--data-path", train_h5, "--h5-y", "targets", "--out",
                             os.path.join(tmp, "bad")], expect_ok=False)
        cu.check(p.returncode != 0 and "no dataset 'targets' in " + train_h5 in p.stderr,
                 "a missing --h5-y dataset: exit %d, stderr %s" % (p.returncode, p.stderr[-400:]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_hdf5_h5py_file_and_cli_train_equal_idx")


main()
