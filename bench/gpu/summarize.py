#!/usr/bin/env python3
"""bench/gpu/summarize.py — rows and the table of the GPU GPT-2 benchmark.

  summarize.py plexus METRICS.jsonl --precision P --batch B --context T --warmup W --rc RC [--log LOG]
      one JSON row for a `plexus train` run, from the step records of its
      metrics file (docs/LOGGING.md): tokens/s over the steps after the
      first record at or past step W, from the records' wall-clock "time"
      (the rate of the warm-up steps is left out).
  summarize.py table ROWS.jsonl [--gpu NAME]
      the table: tokens/s, ms per step (PyTorch: the median step; plexus: the mean
      of the timed steps), MFU, and plexus / PyTorch ratios.

MFU counts nanoGPT's (PaLM's) training FLOPs per token,
    6·N + 12·L·C·T        N = parameters less the position embedding,
(the attention's QKᵀ and PV counted in full, not halved for causality), over
the GPU's dense peak for the precision: bf16 on the tensor cores (H100 SXM
and H200: 989.4 TFLOP/s; H100 PCIe 756.5), f32 without TF32 on the CUDA
cores (H100 SXM and H200: 66.9; PCIe 51.2), NVIDIA's datasheet figures.
PEAK_BF16 / PEAK_F32 (TFLOP/s, environment) override them.
"""
import argparse
import json
import math
import os
import sys

V, CTX, L, C = 50257, 1024, 12, 768


def flops_per_token(T):
    n = V * C + CTX * C + L * (12 * C * C + 13 * C) + 2 * C  # 124,439,808 for GPT-2 small
    return 6 * (n - CTX * C) + 12 * L * C * T


def peaks(gpu):
    g = (gpu or "").upper()
    bf16, f32 = (756.5, 51.2) if "PCIE" in g else (989.4, 66.9)
    known = "H100" in g or "H200" in g
    bf16 = float(os.environ.get("PEAK_BF16", bf16))
    f32 = float(os.environ.get("PEAK_F32", f32))
    note = "" if known or "PEAK_BF16" in os.environ else " (not an H100/H200: set PEAK_BF16/PEAK_F32 for its peaks)"
    return {"bf16": bf16 * 1e12, "f32": f32 * 1e12}, note


def plexus_row(a):
    row = {"side": "plexus", "mode": "cuda", "precision": a.precision, "batch": a.batch, "context": a.context,
           "rc": a.rc}
    recs = []
    try:
        with open(a.metrics) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("type") == "step" and isinstance(r.get("time"), (int, float)):
                    recs.append(r)
    except OSError as e:
        row["error"] = f"no metrics file ({e.strerror})"
    past = [r for r in recs if r["step"] >= a.warmup]
    if len(past) >= 2:
        s0, s1 = past[0], past[-1]
        steps = s1["step"] - s0["step"]
        dt = s1["time"] - s0["time"]
        if steps > 0 and dt > 0:
            row.update(tokens_per_s=steps * a.batch * a.context / dt, mean_step_ms=1e3 * dt / steps,
                       timed_steps=steps, first_loss=recs[0].get("loss"), last_loss=s1.get("loss"))
    elif "error" not in row:
        row["error"] = f"{len(recs)} step records, {len(past)} at or past step {a.warmup}: too few to time"
    if a.rc != 0:
        tail = ""
        if a.log and os.path.exists(a.log):
            with open(a.log, errors="replace") as f:
                lines = [l.strip() for l in f if l.strip()]
            tail = lines[-1] if lines else ""
        row["error"] = (f"exit {a.rc}" + (" (timeout)" if a.rc in (124, 137) else "") +
                        (f": {tail[:300]}" if tail else "") + (f"; {row['error']}" if "error" in row else ""))
    print(json.dumps(row))


def table(a):
    rows = []
    with open(a.rows) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    gpu = a.gpu or next((r.get("device") for r in rows if r.get("device")), "")
    pk, note = peaks(gpu)
    T = rows[0]["context"] if rows else CTX
    fpt = flops_per_token(T)

    def find(side, mode, prec):
        return next((r for r in rows if r["side"] == side and r["mode"] == mode and r["precision"] == prec
                     and r.get("tokens_per_s")), None)

    def loss(v):
        return f"{v:.3f}" if isinstance(v, (int, float)) else "?"

    out = []
    out.append(f"GPT-2 124M training (L 12, C 768, H 12, T {T}, V 50257, AdamW), batch "
               f"{rows[0]['batch'] if rows else '?'} x {T} tokens, one GPU: {gpu or 'unknown'}")
    out.append(f"MFU: {fpt / 1e6:.1f} MFLOP/token (6N + 12LCT) over the dense peak: bf16 {pk['bf16'] / 1e12:.1f}, "
               f"f32 (no TF32) {pk['f32'] / 1e12:.1f} TFLOP/s{note}")
    out.append("")
    out.append("| run | precision | tokens/s | ms/step | MFU | vs PyTorch eager | vs torch.compile | loss first → last |")
    out.append("|---|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        name = "plexus (cuda)" if r["side"] == "plexus" else f"PyTorch {r['mode']}"
        if not r.get("tokens_per_s"):
            out.append(f"| {name} | {r['precision']} | failed | | | | | {r.get('error', '')[:200]} |")
            continue
        tps = r["tokens_per_s"]
        mfu = 100 * tps * fpt / pk[r["precision"]]
        ratios = []
        for mode in ("eager", "compile"):
            ref = find("pytorch", mode, r["precision"])
            ratios.append(f"{tps / ref['tokens_per_s']:.2f}x" if ref and ref is not r else "")
        out.append(f"| {name} | {r['precision']} | {tps:,.0f} | {r.get('median_step_ms', r.get('mean_step_ms', math.nan)):.1f} | "
                   f"{mfu:.1f}% | {ratios[0]} | {ratios[1]} | {loss(r.get('first_loss'))} → {loss(r.get('last_loss'))} |")
    out.append("")
    out.append("llm.c (published, not run here): GPT-2 124M on 8x A100 80GB SXM, 10B tokens in ~90 min at up to "
               "~60% MFU (karpathy/llm.c discussion #481) = ~0.23M tokens/s per A100; on 8x H100 the same run took "
               "45 min (modded-nanogpt README) = ~0.46M tokens/s per H100.")
    out.append("(random tokens: a loss near ln 50257 = 10.82 that falls slowly is what both sides should show; "
               "plexus's first loss is the mean of its first logged steps)")
    print("\n".join(out))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plexus")
    p.add_argument("metrics")
    p.add_argument("--precision", required=True, choices=["bf16", "f32"])
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--context", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--rc", type=int, default=0)
    p.add_argument("--log")
    t = sub.add_parser("table")
    t.add_argument("rows")
    t.add_argument("--gpu")
    a = ap.parse_args()
    plexus_row(a) if a.cmd == "plexus" else table(a)


if __name__ == "__main__":
    sys.exit(main())
