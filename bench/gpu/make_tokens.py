#!/usr/bin/env python3
"""bench/gpu/make_tokens.py — a synthetic token shard for the GPU benchmark.

    make_tokens.py OUT.bin [--tokens N] [--vocab V] [--seed S]

Writes N uniformly random tokens in [0, V) as one shard in llm.c's format
(docs/DATA.md, "Token shards"): a header of 256 little-endian int32 (magic
20240520, version 1, the token count, zeros) and the tokens as uint16
(magic 20240801, version 7 and uint32 when V > 65536).  Speed does not depend
on what the tokens say; both sides of the benchmark read this one file.
The standard library only (no numpy), so any python3 runs it.
"""
import argparse
import array
import os
import random
import sys

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--tokens", type=int, default=4 * 1024 * 1024)
ap.add_argument("--vocab", type=int, default=50257)
ap.add_argument("--seed", type=int, default=1)
a = ap.parse_args()
wide = a.vocab > 65536
header = array.array("i", [0] * 256)
header[0:3] = array.array("i", (20240801, 7, a.tokens) if wide else (20240520, 1, a.tokens))
rng = random.Random(a.seed)
tokens = array.array("I" if wide else "H", (rng.randrange(a.vocab) for _ in range(a.tokens)))
if sys.byteorder != "little":
    header.byteswap()
    tokens.byteswap()
tmp = a.out + ".tmp"
with open(tmp, "wb") as f:
    header.tofile(f)
    tokens.tofile(f)
os.replace(tmp, a.out)
print(f"make_tokens: {a.tokens} tokens (vocabulary {a.vocab}) in {a.out}")
