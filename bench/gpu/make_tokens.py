#!/usr/bin/env python3
"""bench/gpu/make_tokens.py — a synthetic token shard for the GPU benchmark.

    make_tokens.py OUT.bin [--tokens N] [--vocab V] [--seed S]

Writes N uniformly random tokens in [0, V) as one shard in llm.c's format
(docs/DATA.md, "Token shards"): a header of 256 little-endian int32 (magic
20240520, version 1, the token count, zeros) and the tokens as uint16
(magic 20240801, version 7 and uint32 when V > 65536).  Speed does not depend
on what the tokens say; both sides of the benchmark read this one file.
"""
import argparse
import os

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--tokens", type=int, default=4 * 1024 * 1024)
ap.add_argument("--vocab", type=int, default=50257)
ap.add_argument("--seed", type=int, default=1)
a = ap.parse_args()
wide = a.vocab > 65536
header = np.zeros(256, dtype="<i4")
header[:3] = (20240801, 7, a.tokens) if wide else (20240520, 1, a.tokens)
tokens = np.random.default_rng(a.seed).integers(0, a.vocab, a.tokens).astype("<u4" if wide else "<u2")
tmp = a.out + ".tmp"
with open(tmp, "wb") as f:
    f.write(header.tobytes())
    f.write(tokens.tobytes())
os.replace(tmp, a.out)
print(f"make_tokens: {a.tokens} tokens (vocabulary {a.vocab}) in {a.out}")
