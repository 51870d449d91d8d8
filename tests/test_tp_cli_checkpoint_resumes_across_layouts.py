"""Claim: a tensor-parallel checkpoint loads into another layout, and
training goes on as if nothing had changed.  `plexus train --tp 2` on 4
threads (dp 2 x tp 2, 8 sequences a dp rank) checkpoints at step 6 (each tp
rank its boxes; state.json records "mesh": {"dp": 2, "tp": 2, "pp": 1}) and
runs on to step 12.  Resumed from step 6 at (dp 1, tp 4) with 16 sequences
and at (dp 4, tp 1) -- plain DDP -- with 4, the same global batch (and the
same with ZeRO 1 over dp: every rank's optimizer shard of its boxes saved,
resumed under ZeRO 2 at (dp 2, tp 2) and (dp 4, tp 1), under DDP at (dp 1,
tp 4)):
- on load (a resume with nothing left to train evaluates the loaded model),
  the held-out loss equals that of the same checkpoint resumed at the
  first layout listed to 1e-6 relative: every layout loaded the same
  parameters;
- the resumed runs' losses and gradient norms at steps 7..12 and their final
  held-out loss equal the uninterrupted run's to 1e-5 (dropout 0, so masks
  that are drawn per rank do not enter).
If this fails: a box is written or read at the wrong place (c_attn's q, k,
v thirds, a column block stored strided), a replicated tensor is missing
or doubled, the optimizer state did not follow its parameters, or the data
position is counted over the world instead of the dp ranks."""

import json
import os
import shutil
import tempfile

import cli_util as cu


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def train(tmp, name, extra):
    args = ["train", "--model", "gpt", "--data", "text", "--data-path", os.path.join(tmp, "train.txt"),
            "--val-path", os.path.join(tmp, "valid.txt"), "--vocab", os.path.join(tmp, "vocab.txt"),
            "--context", "16", "--n-layer", "2", "--n-head", "4", "--n-embd", "32", "--dropout", "0",
            "--clip-grad", "0.5", "--optim", "adamw", "--lr", "0.003", "--steps", "12", "--log-every", "1",
            "--progress", "lines", "--jsonl", os.path.join(tmp, name + ".jsonl")] + extra
    return cu.run(args)


def metrics(tmp, name):
    rows = cu.jsonl(os.path.join(tmp, name + ".jsonl"))
    steps = {r["step"]: (r["loss"], r["grad_norm"]) for r in rows if r.get("type") == "step"}
    evals = [r["loss"] for r in rows if r.get("type") == "eval"]
    return steps, evals


tmp = tempfile.mkdtemp(prefix="px_tp_ckpt_")
try:
    cu.word_corpus(os.path.join(tmp, "train.txt"), 1, 1500)
    cu.word_corpus(os.path.join(tmp, "valid.txt"), 2, 100)
    p = cu.run(["tokenize", "--input", os.path.join(tmp, "train.txt"), "--out", os.path.join(tmp, "tok")])
    shutil.copy(os.path.join(tmp, "tok.vocab"), os.path.join(tmp, "vocab.txt"))
    def scenario(src, src_extra, layouts):
        out = os.path.join(tmp, src)
        p = train(tmp, src, src_extra + ["--ckpt-every", "6", "--keep-last", "0", "--out", out])
        if not cu.check(p.returncode == 0, "%s: the run that checkpoints failed" % src):
            return
        ck = os.path.join(out, "checkpoints", "step_00000006")
        cu.check(os.path.isdir(ck), "%s: no checkpoint at step 6: %s" % (src, cu.checkpoints(os.path.dirname(ck))))
        with open(os.path.join(ck, "state.json")) as f:
            state = json.load(f)
        cu.check(state.get("mesh") == {"dp": 2, "tp": 2, "pp": 1}, "%s: state.json's mesh is %s" %
                 (src, state.get("mesh")))
        files = sorted(os.listdir(ck))
        cu.check("model.rank00000-of-00002.safetensors" in files and "model.rank00001-of-00002.safetensors" in files,
                 "%s: the checkpoint does not hold each tp rank's boxes: %s" % (src, files))
        # plexus inspect shows the mesh and which rank wrote which boxes
        # (world rank 1 is tp rank 1 of dp rank 0: it writes its own file).
        p = cu.run(["inspect", ck])
        lines = [ln.strip() for ln in p.stdout.splitlines()]
        cu.check("mesh           dp 2, tp 2, pp 1" in lines, "%s: inspect shows no mesh line:\n%s" % (src, p.stdout))
        cu.check(any(ln.startswith("rank 1 wrote") and "model.rank00001-of-00002.safetensors" in ln for ln in lines),
                 "%s: inspect does not credit rank 1 with its boxes:\n%s" % (src, p.stdout))
        full_steps, full_evals = metrics(tmp, src)
        loaded = {}
        for name, extra in layouts:
            name = src + "_" + name
            # Nothing left to train: the run evaluates what it loaded.
            p = train(tmp, name + "_load", extra + ["--resume", ck, "--steps", "6"])
            if cu.check(p.returncode == 0, "%s: loading the checkpoint failed" % name):
                _, ev = metrics(tmp, name + "_load")
                cu.check(len(ev) == 1, "%s: %d evaluations after loading" % (name, len(ev)))
                loaded[name] = ev[0] if ev else float("nan")
            p = train(tmp, name, extra + ["--resume", ck])
            if not cu.check(p.returncode == 0, "%s: resuming failed" % name):
                continue
            steps, evals = metrics(tmp, name)
            cu.check(sorted(steps) == list(range(7, 13)), "%s: logged steps %s, want 7..12" % (name, sorted(steps)))
            worst = 0.0
            for s in sorted(steps):
                if s not in full_steps:
                    continue
                (l, g), (rl, rg) = steps[s], full_steps[s]
                worst = max(worst, rel(l, rl), rel(g, rg))
                cu.check(rel(l, rl) <= 1e-5 and rel(g, rg) <= 1e-5, "%s step %d: loss %.8g grad norm %.8g; the "
                         "uninterrupted run %.8g %.8g" % (name, s, l, g, rl, rg))
            if evals and full_evals:
                worst = max(worst, rel(evals[-1], full_evals[-1]))
                cu.check(rel(evals[-1], full_evals[-1]) <= 1e-5, "%s: final held-out loss %.8g, uninterrupted %.8g" %
                         (name, evals[-1], full_evals[-1]))
            print("%s: resumed at step 6, steps 7..12 within %.1e of the uninterrupted run" % (name, worst))
        first = src + "_" + layouts[0][0]
        if first in loaded:
            for name, v in loaded.items():
                cu.check(rel(v, loaded[first]) <= 1e-6, "%s: held-out loss on load %.8g; %s %.8g" %
                         (name, v, first, loaded[first]))
            print("held-out loss of the loaded model: %s" % {k: "%.8f" % v for k, v in loaded.items()})

    # DDP over dp: tp rank r of dp rank 0 writes its boxes.
    scenario("ddp", ["--threads", "4", "--tp", "2", "--batch-size", "8"],
             [("dp2_tp2", ["--threads", "4", "--tp", "2", "--batch-size", "8"]),
              ("dp1_tp4", ["--threads", "4", "--tp", "4", "--dp", "1", "--batch-size", "16"]),
              ("dp4_tp1", ["--threads", "4", "--batch-size", "4"])])
    # ZeRO 1 over dp: every rank writes its optimizer shard of its boxes;
    # resumed under ZeRO 2 at tp 2 and tp 1, and under DDP at tp 4.
    scenario("zero1", ["--threads", "4", "--tp", "2", "--zero", "1", "--batch-size", "8"],
             [("dp2_tp2_zero2", ["--threads", "4", "--tp", "2", "--zero", "2", "--batch-size", "8"]),
              ("dp4_tp1_zero2", ["--threads", "4", "--zero", "2", "--batch-size", "4"]),
              ("dp1_tp4", ["--threads", "4", "--tp", "4", "--dp", "1", "--batch-size", "16"])])
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_tp_cli_checkpoint_resumes_across_layouts")
