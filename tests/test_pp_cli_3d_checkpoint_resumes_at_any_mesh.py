"""Claim: a checkpoint of `plexus train --dp 2 --tp 2 --pp 2` (3D: 8
threads, 1F1B over 4 micro-batches, the GPT with its tied head, AdamW,
clipping) resumes at any mesh and training goes on as if nothing had
changed.  A run of 10 steps stopped at step 5 (--stop-at-step) and resumed
  - at dp 2 × tp 2 × pp 2 (the same mesh): the same log and a final
    checkpoint whose consolidated model is byte for byte the uninterrupted
    run's;
  - at dp 1 × tp 2 × pp 4 with --batch-size 16 (the same global batch);
  - in one process with --batch-size 16 (no mesh at all);
  - with --zero 1 over dp: saved with each dp rank's optimizer slice,
    resumed at dp 1 × tp 2 × pp 4 (--batch-size 16) and at dp 2 × tp 2 ×
    pp 2 with --zero 1;
logs steps 6..10 with the uninterrupted run's losses and gradient norms to
1e-5 relative, and (on a mesh: the pipeline evaluates whole batches only)
the same final held-out loss to 1e-5.  state.json's mesh
is {dp 2, tp 2, pp 2, 1f1b, 4 micro-batches}; only dp rank 0's pipelines
write model files (ranks 0, 1, 4, 5 of the mesh rank = (pp·dp + dp)·tp +
tp), under ZeRO every rank an optimizer file; `plexus inspect` shows the 3D
layout; `plexus checkpoint consolidate` of a 3D checkpoint gives one file
with the one-process model's tensor names and shapes (those of the
one-process resumed run's checkpoint), and `plexus eval` (one process) of
the 3D checkpoint reports the held-out loss the one-process run measured
on loading it.  Resumed at dp 1 × tp 2 × pp 4 with --batch-size
8 (half the global batch) the run says it goes on from the same sample
count (80), not on the same trajectory.
If this fails: a dp replica or tp rank wrote a tensor twice (loads refuse
overlaps), a ZeRO slice is not where its range says, the data position
counts one replica's batches instead of the global batch, or state.json's
mesh is not the run's."""

import json
import os
import re
import shutil
import tempfile

import cli_util as cu
import zero_util as zu

TOL = 1e-5


def rel(a, b):
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def mesh(dp, tp, pp, batch, zero=0):
    return ["--threads", str(dp * tp * pp), "--dp", str(dp), "--tp", str(tp), "--pp", str(pp), "--micro-batches",
            "4", "--batch-size", str(batch)] + (["--zero", str(zero)] if zero else [])


def train(tmp, name, extra):
    args = ["train", "--model", "gpt", "--data", "text", "--data-path", os.path.join(tmp, "train.txt"),
            "--val-path", os.path.join(tmp, "valid.txt"), "--context", "16", "--n-layer", "2", "--n-head", "4",
            "--n-embd", "32", "--dropout", "0", "--clip-grad", "0.5", "--optim", "adamw", "--lr", "0.003",
            "--steps", "10", "--log-every", "1", "--progress", "lines", "--num-threads", "1", "--ckpt-every", "5",
            "--keep-last", "0", "--out", os.path.join(tmp, name), "--jsonl", os.path.join(tmp, name + ".jsonl")]
    return cu.run(args + extra)


def metrics(tmp, name):
    rows = cu.jsonl(os.path.join(tmp, name + ".jsonl"))
    steps = {r["step"]: (r["loss"], r["grad_norm"]) for r in rows if r.get("type") == "step"}
    evals = [r["loss"] for r in rows if r.get("type") == "eval"]
    return steps, evals


def consolidate(tmp, name, step=10):
    out = os.path.join(tmp, name + ".safetensors")
    ck = os.path.join(tmp, name, "checkpoints", "step_%08d" % step)
    p = cu.run(["checkpoint", "consolidate", ck, "--out", out])
    if not cu.check(p.returncode == 0, "consolidate %s failed:\n%s" % (ck, p.stderr[-2000:])):
        return None
    return out


def check_saved(tmp, src, zero):
    ck = os.path.join(tmp, src, "checkpoints", "step_00000005")
    if not cu.check(os.path.isdir(ck), "%s: no checkpoint at step 5" % src):
        return None
    with open(os.path.join(ck, "state.json")) as f:
        state = json.load(f)
    m = state.get("mesh", {})
    cu.check((m.get("dp"), m.get("tp"), m.get("pp"), m.get("schedule"), m.get("micro_batches")) ==
             (2, 2, 2, "1f1b", 4), "%s: state.json's mesh is %s" % (src, m))
    cu.check(state.get("samples") == 80 and state.get("next_batch") == 5 and state.get("zero_stage") == zero,
             "%s: state.json: samples %s (want 80: 5 steps of 2 × 8), next_batch %s (want 5), zero_stage %s" %
             (src, state.get("samples"), state.get("next_batch"), state.get("zero_stage")))
    files = sorted(f for f in os.listdir(ck) if f.endswith(".safetensors"))
    models = ["model.rank%05d-of-00008.safetensors" % r for r in (0, 1, 4, 5)]
    optims = ["optim.rank%05d-of-00008.safetensors" % r for r in (range(8) if zero else (0, 1, 4, 5))]
    cu.check(files == sorted(models + optims), "%s: files %s, want %s" % (src, files, sorted(models + optims)))
    p = cu.run(["inspect", ck])
    cu.check(p.returncode == 0 and "mesh           dp 2, tp 2, pp 2 (schedule 1f1b, 4 micro-batches" in p.stdout and
             "pipeline × data × tensor parallel" in p.stdout and
             (not zero or "every dp rank its ZeRO slice" in p.stdout),
             "%s: inspect does not show the 3D layout:\n%s" % (src, p.stdout[:3000]))
    return ck


def compare_logs(tmp, name, full_steps, full_evals, same_eval=True):
    steps, evals = metrics(tmp, name)
    cu.check(sorted(steps) == list(range(6, 11)), "%s: logged steps %s, want 6..10" % (name, sorted(steps)))
    worst = 0.0
    for s in sorted(steps):
        if s not in full_steps:
            continue
        (l, g), (rl, rg) = steps[s], full_steps[s]
        worst = max(worst, rel(l, rl), rel(g, rg))
        cu.check(rel(l, rl) <= TOL and rel(g, rg) <= TOL, "%s step %d: loss %.8g grad norm %.8g; the uninterrupted "
                 "run %.8g %.8g" % (name, s, l, g, rl, rg))
    if not same_eval:
        pass
    elif evals and full_evals:
        worst = max(worst, rel(evals[-1], full_evals[-1]))
        cu.check(rel(evals[-1], full_evals[-1]) <= TOL, "%s: final held-out loss %.8g, uninterrupted %.8g" %
                 (name, evals[-1], full_evals[-1]))
    else:
        cu.check(False, "%s: no held-out loss" % name)
    print("%-44s steps 6..10 within %.1e of the uninterrupted run" % (name, worst))


tmp = tempfile.mkdtemp(prefix="px_pp3d_ckpt_")
try:
    cu.word_corpus(os.path.join(tmp, "train.txt"), 1, 1500)
    cu.word_corpus(os.path.join(tmp, "valid.txt"), 2, 100)
    p = train(tmp, "straight", mesh(2, 2, 2, 8))
    cu.check(p.returncode == 0, "the uninterrupted run failed:\n%s" % p.stderr[-2000:])
    full_steps, full_evals = metrics(tmp, "straight")
    for zero in (0, 1):
        src = "stopped_z%d" % zero
        p = train(tmp, src, mesh(2, 2, 2, 8, zero) + ["--stop-at-step", "5"])
        if not cu.check(p.returncode == 0, "%s failed:\n%s" % (src, p.stderr[-2000:])):
            continue
        ck = check_saved(tmp, src, zero)
        if not ck:
            continue
        cases = [("dp2_tp2_pp2", mesh(2, 2, 2, 8, zero)), ("dp1_tp2_pp4", mesh(1, 2, 4, 16))]
        if zero == 0:
            cases.append(("one_process", ["--batch-size", "16"]))
        for name, extra in cases:
            name = src + "_" + name
            p = train(tmp, name, extra + ["--resume", ck])
            if not cu.check(p.returncode == 0, "%s: resuming failed:\n%s" % (name, (p.stdout + p.stderr)[-3000:])):
                continue
            cu.check("resumed from %s: step 5" % ck in p.stdout + p.stderr, "%s: no resume line" % name)
            compare_logs(tmp, name, full_steps, full_evals, "one_process" not in name)
    # The same mesh resumed: the uninterrupted run's model, byte for byte.
    a, b = consolidate(tmp, "straight"), consolidate(tmp, "stopped_z0_dp2_tp2_pp2")
    if a and b:
        with open(a, "rb") as fa, open(b, "rb") as fb:
            cu.check(fa.read() == fb.read(), "resumed at the same mesh: the consolidated model differs from the "
                     "uninterrupted run's")
    # A consolidated 3D checkpoint: the one-process model's names and shapes.
    one = os.path.join(tmp, "stopped_z0_one_process", "checkpoints", "step_00000010", "model.safetensors")
    if a and cu.check(os.path.exists(one), "the one-process run wrote no %s" % one):
        _, ta = zu.read_safetensors(a)
        _, to = zu.read_safetensors(one)
        cu.check(sorted(ta) == sorted(to) and all(ta[k][0] == to[k][0] for k in ta),
                 "consolidated 3D names/shapes %s; one process %s" % (sorted(ta)[:6], sorted(to)[:6]))
        print("consolidated 3D checkpoint: %d tensors, the one-process model's names and shapes" % len(ta))
    # One process evaluating the 3D checkpoint: the loss it measured on loading it.
    ck = os.path.join(tmp, "stopped_z0", "checkpoints", "step_00000005")
    p = train(tmp, "one_load", ["--batch-size", "16", "--resume", ck, "--steps", "5"])
    _, ev = metrics(tmp, "one_load")
    q = cu.run(["eval", "--checkpoint", ck])
    got = re.search(r"loss ([0-9.]+)", q.stdout)
    want = "loss %.6f" % ev[-1] if ev else "?"
    cu.check(p.returncode == 0 and q.returncode == 0 and got is not None and ev and
             abs(float(got.group(1)) - ev[-1]) <= 1e-6 * abs(ev[-1]) + 5e-7,
             "plexus eval of the 3D checkpoint: %s; on loading, one process measured %s" %
             ((q.stdout + q.stderr)[-500:], want))
    # Half the global batch: the same sample count, said so.
    p = train(tmp, "half", mesh(1, 2, 4, 8) + ["--resume", ck])
    out = p.stdout + p.stderr
    cu.check(p.returncode == 0 and "the checkpoint's steps took 16 samples, this run's 8" in out and
             "same sample count (80 into epoch 1)" in out and "batch 10" in out,
             "resume with half the global batch does not say it goes on from sample 80:\n%s" % out[-3000:])
finally:
    shutil.rmtree(tmp, ignore_errors=True)
cu.finish("test_pp_cli_3d_checkpoint_resumes_at_any_mesh")
