"""Claim: where no GPU can be used -- a plexus built without CUDA, or a
machine without a GPU -- `plexus train --device cuda` fails at once with exit
status 1 and one message naming --device cuda and the reason (built without
CUDA, or no CUDA device), before any rank starts or any file of the run is
written; the config file's train.device does the same.  `--precision bf16`
on the CPU is refused naming --precision and --device cuda, and so is
`--reduce-dtype bf16`.  What the GPU
path does not cover (--zero, --tp, --recompute with --device cuda) is
refused naming the option on any machine, and an unknown device names the
choices.  --device cpu --precision f32 (the defaults, given) trains.

Where plexus sees a GPU (`plexus --version`: "cuda: N devices", N >= 1) the
refusal cannot happen: the test exits 77 (skipped).

If it fails, --device cuda is accepted where it cannot run (a crash, a hang,
or a silent CPU run later), or its message does not say why."""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import cli_util as cu

MNIST = ["--model", "cnn", "--channels", "4", "--data", "mnist", "--data-path", cu.FMNIST, "--train-subset", "64",
         "--val-subset", "32", "--batch-size", "32", "--steps", "1", "--progress", "lines", "--quiet"]


def refused(args, wants, label):
    p = cu.run(["train"] + args, expect_ok=False, timeout=120)
    cu.check(p.returncode == 1, "%s: exit status %d, expected 1\n%s" % (label, p.returncode, p.stderr[-2000:]))
    err = p.stderr
    for w in wants:
        cu.check(w in err, "%s: the message lacks %r:\n%s" % (label, w, err[-2000:]))
    lines = [l for l in err.splitlines() if l.strip()]
    cu.check(len(lines) == 1, "%s: %d lines on stderr, expected one message:\n%s" % (label, len(lines), err[-2000:]))
    cu.check("step " not in p.stdout, "%s: training started:\n%s" % (label, p.stdout[-1000:]))
    return p


def main():
    v = subprocess.run([cu.PLEXUS, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"^cuda: (built without CUDA|(\d+) devices?)$", v, re.M)
    if not cu.check(m is not None, "plexus --version does not say whether it has CUDA:\n%s" % v):
        cu.finish("test_cli_device_cuda_refused_clearly_without_gpu")
    if m.group(2) and int(m.group(2)) > 0:
        print("plexus sees %s CUDA device(s): the refusal cannot be tested here (skipped)" % m.group(2))
        sys.exit(77)
    reason = "built without CUDA" if m.group(2) is None else "no CUDA device"
    tmp = tempfile.mkdtemp(prefix="px_cuda_refused_")
    try:
        out = os.path.join(tmp, "run")
        refused(MNIST + ["--device", "cuda", "--threads", "2", "--out", out], ["--device cuda", reason, "--device cpu"],
                "--device cuda")
        cu.check(not os.path.exists(out), "--device cuda: the run directory %s was created" % out)
        cfg = os.path.join(tmp, "cuda.json")
        with open(cfg, "w") as f:
            json.dump({"train": {"device": "cuda"}}, f)
        refused(MNIST + ["--config", cfg], ["--device cuda", "train.device", reason], "config train.device cuda")
        refused(MNIST + ["--precision", "bf16"], ["--precision bf16", "--device cuda", "f32"], "--precision bf16 on cpu")
        refused(MNIST + ["--reduce-dtype", "bf16"], ["--reduce-dtype bf16", "--device cuda", "f32"],
                "--reduce-dtype bf16 on cpu")
        refused(MNIST + ["--device", "cuda", "--zero", "1"], ["--zero 1", "--device cuda", "not built"],
                "--zero 1 on cuda")
        refused(MNIST + ["--device", "cuda", "--threads", "2", "--tp", "2", "--model", "gpt", "--n-head", "2"],
                ["--tp 2", "--device cuda", "not built"], "--tp 2 on cuda")
        refused(MNIST + ["--device", "cuda", "--model", "gpt", "--recompute", "full"],
                ["--recompute full", "--device cuda", "not built"], "--recompute on cuda")
        refused(MNIST + ["--device", "gpu"], ["--device", "\"gpu\"", "cpu|cuda"], "--device gpu")
        # The defaults, given, still train.
        p = cu.run(["train"] + MNIST + ["--device", "cpu", "--precision", "f32", "--out", os.path.join(tmp, "cpu")])
        cu.check(p.returncode == 0, "--device cpu --precision f32 did not train")
        with open(os.path.join(tmp, "cpu", "config.json")) as f:
            saved = json.load(f)
        cu.check(saved.get("train", {}).get("device") == "cpu" and saved["train"].get("precision") == "f32",
                 "config.json does not record the device and precision: %s" % saved.get("train"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_cli_device_cuda_refused_clearly_without_gpu")


main()
