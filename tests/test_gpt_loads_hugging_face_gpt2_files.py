"""Claim: px_zoo_gpt_load_hf loads GPT-2 weights as Hugging Face writes them,
and the loaded model computes the logits of the model that wrote them.

The test writes safetensors files from a GPT-2 built with torch.nn
(gpt2_torch.py; reduced sizes: vocabulary 61, context 24, 3 layers, 2 heads,
width 16) in the two layouts Hugging Face's files have:

  GPT2LMHeadModel   keys "transformer.wte.weight", ..., "transformer.ln_f.bias",
                    the causal-mask buffers "transformer.h.<l>.attn.bias"
                    (F32 (1, 1, n_ctx, n_ctx) lower triangle) and
                    "transformer.h.<l>.attn.masked_bias" (F32 scalar -1e4),
                    and "lm_head.weight" (= wte, tied); metadata format=pt
  GPT2Model         keys without the prefix ("wte.weight", "h.0.ln_1.weight")
                    and the mask as U8, as older checkpoints store it

(Conv1D weights (in, out), exactly as GPT-2 stores them), loads each with
gpt_runner --hf and requires the logits of a batch to agree with the torch
model's to 1e-5 relative (test_parity_with_pytorch.py's measure).  Then it
checks that a file which is not the model's is refused with a message that
names the tensor and the file and that nothing is written: a missing
tensor, a c_attn weight stored (3C, C) as nn.Linear would store it, a
tensor the model does not have, an F16 tensor.

If it fails, GPT-2 checkpoints do not load into plexus, or load into the
wrong places (a transposed Conv1D, a skipped prefix), or a wrong file loads
silently.
"""

import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_torch  # noqa: E402
import pxst  # noqa: E402

V, T, L, H, C = 61, 24, 3, 2, 16
B, TB = 3, 20  # the batch: 3 sequences of 20 tokens (< context)
TOL = 1e-5

BUILD_DIR = os.environ.get("PX_BUILD_DIR")
RUNNER = os.path.join(BUILD_DIR, "tests", "gpt_runner") if BUILD_DIR else os.path.abspath("gpt_runner")


def run_runner(init_path, data_path, out_path):
    args = [RUNNER, "--vocab", str(V), "--context", str(T), "--layers", str(L), "--heads", str(H),
            "--embd", str(C), "--init", init_path, "--hf", "--data", data_path, "--steps", "0", "--out", out_path]
    env = dict(os.environ, PX_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return subprocess.run(args, env=env, capture_output=True, text=True)


def worst_rel(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    floor = float(np.sqrt(np.mean(b * b)))
    r = np.abs(a - b) / np.maximum(np.maximum(np.abs(a), np.abs(b)), floor)
    return float(r.max())


def hf_files(state):
    """{name: (tensors, metadata)} in Hugging Face's two layouts."""
    tril = np.tril(np.ones((T, T), dtype=np.float32)).reshape(1, 1, T, T)
    lm = {}
    for k, v in state.items():
        lm["transformer." + k] = v
        if k.endswith("ln_1.bias"):  # after each block's first tensors, as HF orders them
            layer = k.split(".")[1]
            lm[f"transformer.h.{layer}.attn.bias"] = tril
            lm[f"transformer.h.{layer}.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    lm["lm_head.weight"] = state["wte.weight"]
    base = {}
    for k, v in state.items():
        base[k] = v
        if k.endswith("ln_1.bias"):
            base[f"h.{k.split('.')[1]}.attn.bias"] = tril.astype(np.uint8)
    return {"GPT2LMHeadModel": (lm, {"format": "pt"}), "GPT2Model": (base, {"format": "pt"})}


def main():
    if not os.path.exists(RUNNER):
        print(f"test_gpt_loads_hugging_face_gpt2_files: runner not found at {RUNNER} (set PX_BUILD_DIR)",
              file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    model = gpt2_torch.GPT(V, T, L, H, C)
    state = gpt2_torch.random_state(model, 77)
    model.eval()
    ids = np.random.default_rng(5).integers(0, V, size=(B, TB)).astype(np.int32)
    with torch.no_grad():
        want = model(torch.from_numpy(ids).long()).numpy()
    failures = []
    with tempfile.TemporaryDirectory(prefix="px_gpt_hf_") as tmp:
        data_path = os.path.join(tmp, "data.st")
        pxst.save(data_path, {"x_0": ids})
        for layout, (tensors, meta) in hf_files(state).items():
            path = os.path.join(tmp, f"{layout}.safetensors")
            out = os.path.join(tmp, f"{layout}_out.st")
            pxst.save(path, tensors, meta)
            proc = run_runner(path, data_path, out)
            if proc.returncode != 0:
                failures.append(f"{layout}: gpt_runner --hf exited {proc.returncode}: {proc.stderr.strip()}")
                continue
            got = pxst.load(out)["logits0"]
            r = worst_rel(got, want)
            print(f"{layout}: {len(tensors)} tensors loaded; logits {got.shape} rel {r:.2e}")
            if got.shape != want.shape or r > TOL:
                failures.append(f"{layout}: logits differ from the torch model's: rel {r:.3g} > {TOL:g}")

        # Files that are not this model's: refused, named, nothing written.
        lm, meta = hf_files(state)["GPT2LMHeadModel"]
        bad = {
            "missing": ({k: v for k, v in lm.items() if k != "transformer.h.1.mlp.c_fc.bias"},
                        ["h.1.mlp.c_fc.bias"]),
            "linear_layout": ({k: (v.T.copy() if k == "transformer.h.2.attn.c_attn.weight" else v)
                               for k, v in lm.items()},
                              ["transformer.h.2.attn.c_attn.weight", "(48, 16)", "(16, 48)"]),
            "extra": (dict(lm, **{"transformer.h.0.attn.rotary.weight": np.zeros(4, np.float32)}),
                      ["transformer.h.0.attn.rotary.weight"]),
            "f16": ({k: (v.astype(np.float16) if k == "transformer.wpe.weight" else v) for k, v in lm.items()},
                    ["transformer.wpe.weight", "F16"]),
        }
        for case, (tensors, needles) in bad.items():
            path = os.path.join(tmp, f"bad_{case}.safetensors")
            out = os.path.join(tmp, f"bad_{case}_out.st")
            pxst.save(path, tensors, meta)
            proc = run_runner(path, data_path, out)
            msg = proc.stderr.strip()
            print(f"bad file ({case}): exit {proc.returncode}: {msg}")
            if proc.returncode == 0:
                failures.append(f"bad file ({case}) was accepted")
            for needle in needles + [path]:
                if needle not in msg:
                    failures.append(f"bad file ({case}): the message should name {needle!r}; got {msg!r}")
            if os.path.exists(out):
                failures.append(f"bad file ({case}): gpt_runner wrote {out} despite failing")
    if failures:
        print(f"\ntest_gpt_loads_hugging_face_gpt2_files: {len(failures)} failure(s):", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        return 1
    print("test_gpt_loads_hugging_face_gpt2_files: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
