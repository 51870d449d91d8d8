"""Claim: `plexus train` starts with one console line and keeps its
configuration in the run directory, and its small texts are right.

- Start-up: before the first step line, one "plexus train:" line naming
  the model and its size, the world, the data and the output (besides the
  memory line of the first step); no JSON on the console.  The effective
  configuration is OUT/config.json and loads as the config of the run.
- --print-config prints the configuration that applies to the model and
  exits without training: the CNN's has channels but no GPT, MLP, text or
  ZeRO-3 keys, and Adam's betas but not SGD's momentum; the GPT's has its
  layers and no CNN keys.
- A run without a held-out split says "no held-out split" (not "(no
  held-out split)0 held-out").
- An evaluation in the middle of the first epoch (--eval-every) is labelled
  epoch 1, as the step lines of that epoch are, not epoch 0.
- `plexus train --help`'s example is the README's demo, word for word.

If it fails, the start-up output is long or wrong, or the help's example
is not the command the README runs."""

import json
import os
import re
import shutil
import subprocess
import tempfile

import cli_util as cu

HERE = os.path.dirname(os.path.abspath(__file__))
MNIST = ["--data", "mnist", "--data-path", cu.FMNIST, "--train-subset", "256", "--val-subset", "64",
         "--batch-size", "32", "--progress", "lines"]


def words(cmd):
    return " ".join(cmd.replace("\\\n", " ").split())


def main():
    tmp = tempfile.mkdtemp(prefix="px_startup_")
    try:
        out = os.path.join(tmp, "run")
        p = cu.run(["train", "--model", "cnn", "--channels", "4", "--threads", "2", "--epochs", "1", "--log-every", "4",
                    "--out", out] + MNIST)
        cu.check(p.returncode == 0, "the run failed")
        head = p.stdout.split("\nstep ")[0].splitlines()
        head = [l for l in head if not l.startswith("memory per rank")]
        cu.check(len(head) == 1, "%d start-up lines, expected 1:\n%s" % (len(head), "\n".join(head)))
        line = head[0] if head else ""
        for want in ("plexus train: model cnn: ", " parameters", "2 ranks (threads backend)", "data mnist: 256 training "
                     "samples, 64 held-out", "output " + out):
            cu.check(want in line, "the start-up line lacks %r: %s" % (want, line))
        cu.check("{" not in p.stdout, "JSON on the console:\n%s" % p.stdout[:400])
        with open(os.path.join(out, "config.json")) as f:
            cfg = json.load(f)
        cu.check(cfg["model"]["name"] == "cnn" and cfg["model"]["channels"] == 4 and cfg["run"]["out"] == out and
                 cfg["parallel"]["threads"] == 2, "config.json is not this run's: %s" % cfg)

        # --print-config: what applies, then exit.
        pc_out = os.path.join(tmp, "printed")
        p = cu.run(["train", "--model", "cnn", "--print-config", "--out", pc_out] + MNIST)
        cu.check(p.returncode == 0 and not os.path.exists(os.path.join(pc_out, "checkpoints")) and "step " not in p.stdout,
                 "--print-config trained or failed: %s" % p.stdout[-300:])
        c = json.loads(p.stdout)
        for sec, key in (("model", "channels"), ("optim", "beta1"), ("data", "batch_size"), ("parallel", "threads")):
            cu.check(key in c.get(sec, {}), "--print-config (cnn) lacks %s.%s" % (sec, key))
        for sec, key in (("model", "n_layer"), ("model", "hidden"), ("data", "tokenizer"), ("parallel", "zero_unit"),
                         ("parallel", "micro_batches"), ("optim", "momentum"), ("run", "overwrite")):
            cu.check(key not in c.get(sec, {}), "--print-config (cnn) shows %s.%s, which does not apply" % (sec, key))
        g = cu.run(["train", "--model", "gpt", "--optim", "sgd", "--print-config"] + MNIST)
        gc = json.loads(g.stdout) if g.returncode == 0 else {}
        cu.check("n_layer" in gc.get("model", {}) and "channels" not in gc.get("model", {}) and
                 "momentum" in gc.get("optim", {}) and "beta1" not in gc.get("optim", {}),
                 "--print-config (gpt, sgd): %s" % gc)

        # No held-out split.
        text = os.path.join(tmp, "words.txt")
        with open(text, "w") as f:
            for i in range(300):
                f.write("the cat sat on the mat and the dog ran %d\n" % (i % 7))
        p = cu.run(["train", "--model", "gpt", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--context", "8",
                    "--data", "text", "--data-path", text, "--batch-size", "4", "--steps", "2", "--progress", "lines"])
        cu.check(p.returncode == 0 and "no held-out split" in p.stdout and
                 not re.search(r"split\)\d|\b0 held-out", p.stdout),
                 "the start-up line without a held-out split: %s" % p.stdout[:400])

        # Mid-epoch evaluation: epoch 1 (8 steps an epoch, evaluated every 4).
        ev = os.path.join(tmp, "ev")
        p = cu.run(["train", "--model", "mlp", "--hidden", "8", "--epochs", "1", "--eval-every", "4", "--out", ev] + MNIST)
        evals = [(r["step"], r["epoch"]) for r in cu.jsonl(os.path.join(ev, "metrics.jsonl")) if r["type"] == "eval"]
        cu.check(evals == [(4, 1), (8, 1)], "evaluations (step, epoch) %s, expected [(4, 1), (8, 1)]" % evals)
        cu.check("eval step 4 epoch 1 " in p.stdout, "the console labels the mid-epoch evaluation: %s" %
                 re.findall(r"eval step .*", p.stdout))

        # --help's example is the README's demo.
        readme = open(os.path.join(HERE, "..", "README.md")).read()
        sec = readme[readme.index("## Training from the command line"):]
        demo = re.search(r"```sh\n(.*?)```", sec, re.S).group(1).strip()
        demo = words(demo).replace("build/plexus", "plexus")
        h = cu.run(["train", "--help"])
        helptext = words(h.stdout)
        cu.check(demo in helptext, "train --help's example differs from the README's demo:\nREADME: %s\nhelp: %s" %
                 (demo, re.findall(r"plexus train --threads.*?--out \S+", helptext)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cu.finish("test_cli_startup_output_is_short_and_help_matches_readme")


main()
