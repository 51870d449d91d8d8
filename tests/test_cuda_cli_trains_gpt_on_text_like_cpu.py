"""Claim: `plexus train --device cuda` trains as the CPU does, end to end
through the command: a GPT (2 layers, width 64, 4 heads, context 32, byte
tokens, dropout 0.1) trained 20 AdamW steps with clipping on a text file
logs every step's loss within 1e-4 (relative) of `--device cpu`'s, and its
evaluations (steps 10 and 20) too; `--precision bf16` within 2e-2.  The
run's config.json records train.device and train.precision.  `plexus eval`
of the GPU run's checkpoint evaluates on the CPU (it succeeds with no GPU
visible, CUDA_VISIBLE_DEVICES=""), `plexus eval --device cuda` gives the
same loss within 1e-4, and `--device cuda` with no GPU visible fails naming
the reason.  With two GPUs, `--threads 2 --device cuda` (DDP over NCCL)
follows `--threads 2` on the CPU to 1e-4; with one, it is refused naming
one GPU per rank.

Exits 77 (skipped) where plexus sees no GPU.  If it fails, the command's
device path (the batch's copy, the loss, clipping, the optimizer on the
device, evaluation, checkpoints from the host mirrors, NCCL) differs from
the CPU path, or the device options are not saved and read as documented."""

import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

import cli_util as cu

NAME = "test_cuda_cli_trains_gpt_on_text_like_cpu"


def gpus():
    v = subprocess.run([cu.PLEXUS, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"^cuda: (\d+) devices?$", v, re.M)
    return int(m.group(1)) if m else 0


def write_text(path, n_lines, seed):
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    with open(path, "w") as f:
        for _ in range(n_lines):
            f.write(" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) + ".\n")


def rel(a, b):
    return abs(a - b) / max(1e-12, abs(a), abs(b))


def records(out, kind):
    return [r for r in cu.jsonl(os.path.join(out, "metrics.jsonl")) if r["type"] == kind]


def compare(label, ref, got, tol):
    rs, gs = records(ref, "step"), records(got, "step")
    cu.check(len(rs) == 20 and len(gs) == 20, "%s: %d and %d step records, expected 20" % (label, len(rs), len(gs)))
    worst = 0.0
    for a, b in zip(rs, gs):
        d = rel(a["loss"], b["loss"])
        worst = max(worst, d)
        cu.check(d <= tol, "%s: step %d loss %.9g vs the CPU's %.9g" % (label, b["step"], b["loss"], a["loss"]))
    re_, ge = records(ref, "eval"), records(got, "eval")
    cu.check(len(re_) == 2 and len(ge) == 2, "%s: %d and %d evaluations, expected 2" % (label, len(re_), len(ge)))
    for a, b in zip(re_, ge):
        d = rel(a["loss"], b["loss"])
        worst = max(worst, d)
        cu.check(d <= tol, "%s: evaluation at step %d: loss %.9g vs the CPU's %.9g" % (label, b["step"], b["loss"],
                                                                                       a["loss"]))
    print("%s: largest relative difference from the CPU %.3g (tolerance %g)" % (label, worst, tol))


def eval_loss(p):
    m = re.search(r"loss ([0-9.]+)", p.stdout)
    return float(m.group(1)) if m else None


def main():
    n = gpus()
    if n < 1:
        print("%s: skipped: plexus sees no CUDA device" % NAME)
        sys.exit(77)
    tmp = tempfile.mkdtemp(prefix="px_cuda_cli_")
    try:
        train_txt, valid_txt = os.path.join(tmp, "train.txt"), os.path.join(tmp, "valid.txt")
        write_text(train_txt, 3000, 1)
        write_text(valid_txt, 200, 2)
        common = ["train", "--model", "gpt", "--data", "text", "--tokenizer", "byte", "--data-path", train_txt,
                  "--val-path", valid_txt, "--context", "32", "--n-layer", "2", "--n-head", "4", "--n-embd", "64",
                  "--dropout", "0.1", "--batch-size", "8", "--steps", "20", "--optim", "adamw", "--lr", "0.002",
                  "--clip-grad", "1", "--log-every", "1", "--eval-every", "10", "--eval-batches", "8", "--seed", "3",
                  "--workers", "0", "--progress", "lines", "--quiet"]
        runs = {}
        for label, extra in (("cpu", ["--device", "cpu"]), ("cuda", ["--device", "cuda"]),
                             ("bf16", ["--device", "cuda", "--precision", "bf16"])):
            out = os.path.join(tmp, label)
            p = cu.run(common + extra + ["--out", out])
            cu.check(p.returncode == 0, "%s: training failed" % label)
            runs[label] = out
        compare("cuda f32", runs["cpu"], runs["cuda"], 1e-4)
        compare("cuda bf16", runs["cpu"], runs["bf16"], 2e-2)
        with open(os.path.join(runs["bf16"], "config.json")) as f:
            t = json.load(f)["train"]
        cu.check(t.get("device") == "cuda" and t.get("precision") == "bf16",
                 "config.json does not record --device cuda --precision bf16: %s" % t)

        # plexus eval: the CPU unless told (the checkpoint's device is not inherited).
        ck = os.path.join(runs["cuda"], "checkpoints")
        hidden = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        on_cpu = cu.run(["eval", "--checkpoint", ck], env=hidden)
        cu.check(on_cpu.returncode == 0, "plexus eval of a GPU run's checkpoint needs a GPU")
        on_gpu = cu.run(["eval", "--checkpoint", ck, "--device", "cuda"])
        cu.check(on_gpu.returncode == 0, "plexus eval --device cuda failed")
        a, b = eval_loss(on_cpu), eval_loss(on_gpu)
        cu.check(a is not None and b is not None and rel(a, b) <= 1e-4,
                 "plexus eval on the CPU %s and on the GPU %s differ" % (a, b))
        p = cu.run(["eval", "--checkpoint", ck, "--device", "cuda"], env=hidden, expect_ok=False)
        cu.check(p.returncode == 1 and "no CUDA device" in p.stderr,
                 "--device cuda with no GPU visible: exit %d, %s" % (p.returncode, p.stderr[-500:]))

        # Data parallel over NCCL.
        if n >= 2:
            for label, extra in (("cpu2", ["--threads", "2"]), ("cuda2", ["--threads", "2", "--device", "cuda"])):
                out = os.path.join(tmp, label)
                p = cu.run(common + extra + ["--out", out])
                cu.check(p.returncode == 0, "%s: training failed" % label)
                runs[label] = out
            compare("DDP 2 ranks over NCCL", runs["cpu2"], runs["cuda2"], 1e-4)
        else:
            p = cu.run(common + ["--threads", "2", "--device", "cuda"], expect_ok=False)
            cu.check(p.returncode != 0 and "one GPU per rank" in p.stderr,
                     "--threads 2 --device cuda on one GPU: exit %d, %s" % (p.returncode, p.stderr[-500:]))
            print("one GPU: DDP over NCCL at 2 ranks not run (the refusal was checked)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish(NAME)


main()
