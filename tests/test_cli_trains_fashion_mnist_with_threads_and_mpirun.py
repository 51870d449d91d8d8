"""Claim: `plexus train` trains the zoo's CNN on (a subset of) the real
Fashion-MNIST, data parallel on 2 ranks, both as threads of one process
(--threads 2, no MPI) and as 2 processes under mpiexec: the training loss
falls, the held-out accuracy passes 0.75 after one epoch on 6,000 images,
and the run leaves what the user's other tools read -- JSONL metrics with
step and eval records, TensorBoard event files that protoc decodes with
TensorBoard's field numbers and that hold the train and eval scalars, and a
checkpoint that verifies with `sha256sum -c`.

If it fails, the command does not train (a broken loop, data or model),
the two backends disagree in what they run, or the logs/checkpoints are not
what the docs promise."""

import glob
import os
import re
import shutil
import subprocess
import tempfile

import cli_util as cu

HERE = os.path.dirname(os.path.abspath(__file__))


def train(out, mpi_ranks=0):
    args = ["train", "--model", "cnn", "--channels", "8", "--data", "mnist", "--data-path", cu.FMNIST,
            "--train-subset", "6000", "--val-subset", "2000", "--epochs", "1", "--batch-size", "32",
            "--lr", "0.002", "--log-every", "10", "--workers", "1", "--progress", "lines", "--out", out]
    if not mpi_ranks:
        args += ["--threads", "2"]
    return cu.run(args, mpi_ranks=mpi_ranks)


def check_run(out, p, label):
    if not cu.check(p.returncode == 0, "%s: plexus train exited %d" % (label, p.returncode)):
        return
    cu.check("2 ranks" in p.stdout, "%s: the header does not say 2 ranks: %s" % (label, p.stdout[:200]))
    recs = cu.jsonl(os.path.join(out, "metrics.jsonl"))
    steps = [r for r in recs if r["type"] == "step"]
    evals = [r for r in recs if r["type"] == "eval"]
    cu.check(len(steps) >= 5, "%s: %d step records" % (label, len(steps)))
    if len(steps) >= 5:
        first, last = steps[0]["loss"], steps[-1]["loss"]
        cu.check(last < 0.7 * first, "%s: loss did not fall: first %.3f last %.3f" % (label, first, last))
        cu.check(all(s["samples_per_s"] and s["samples_per_s"] > 0 for s in steps[1:]),
                 "%s: samples/s missing" % label)
    cu.check(len(evals) == 1, "%s: %d eval records, expected 1 (one epoch)" % (label, len(evals)))
    if evals:
        cu.check(evals[0]["accuracy"] >= 0.75, "%s: held-out accuracy %.4f < 0.75" % (label, evals[0]["accuracy"]))
        cu.check(evals[0]["samples"] == 2000, "%s: evaluated %s samples, expected 2000" % (label, evals[0]["samples"]))
        m = re.search(r"accuracy ([0-9.]+)", p.stdout)
        cu.check(m and abs(float(m.group(1)) - evals[0]["accuracy"]) < 1e-4,
                 "%s: the printed accuracy does not match the JSONL" % label)

    # TensorBoard: protoc decodes every record's Event with TensorBoard's field numbers.
    files = glob.glob(os.path.join(out, "tensorboard", "events.out.tfevents.*"))
    cu.check(len(files) == 1, "%s: %d TensorBoard files" % (label, len(files)))
    if files:
        data = open(files[0], "rb").read()
        tags = set()
        pos = 0
        while pos < len(data):
            n = int.from_bytes(data[pos:pos + 8], "little")
            rec = data[pos + 12:pos + 12 + n]
            pos += 16 + n
            d = subprocess.run(["protoc", "--decode=tensorboard.Event", "-I", os.path.join(HERE, "data"),
                                "tensorboard_event.proto"], input=rec, capture_output=True)
            if not cu.check(d.returncode == 0, "%s: protoc cannot decode a record: %s" % (label, d.stderr[:200])):
                break
            tags.update(re.findall(rb'tag: "([^"]+)"', d.stdout))
        for t in (b"train/loss", b"train/lr", b"train/grad_norm", b"train/samples_per_s", b"eval/loss",
                  b"eval/accuracy"):
            cu.check(t in tags, "%s: TensorBoard tag %s missing (have %s)" % (label, t, sorted(tags)))

    # The checkpoint at the epoch's end verifies with the standard tool.
    ck = cu.checkpoints(os.path.join(out, "checkpoints"))
    cu.check(len(ck) == 1, "%s: %d checkpoints, expected 1" % (label, len(ck)))
    if ck:
        s = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=ck[-1], capture_output=True, text=True)
        cu.check(s.returncode == 0, "%s: sha256sum -c failed: %s" % (label, s.stdout + s.stderr))


tmp = tempfile.mkdtemp(prefix="px_cli_train_")
try:
    out = os.path.join(tmp, "threads")
    check_run(out, train(out), "threads")
    if cu.mpiexec():
        out = os.path.join(tmp, "mpi")
        check_run(out, train(out, mpi_ranks=2), "mpiexec -n 2")
    else:
        print("(plexus was built without MPI: the mpiexec half is skipped)")
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_cli_trains_fashion_mnist_with_threads_and_mpirun")
