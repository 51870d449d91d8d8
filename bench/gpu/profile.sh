#!/usr/bin/env bash
# bench/gpu/profile.sh — where a plexus GPU training step spends its time:
# every kernel of a few GPT-2 124M steps timed by Nsight Compute (one
# metric, gpu__time_duration, so no kernel is replayed), summed by kernel
# name, per step, largest first.
#
#   bench/gpu/profile.sh [OUTDIR]       (after scripts/gpu-check has built build-gpu/)
#
# Settings: BUILD_DIR (build-gpu), PRECISION (bf16), B (8), T (1024), STEPS (2),
# PYTHON (as bench/gpu/run.sh).  Writes OUTDIR/profile-PRECISION.csv (ncu's
# raw rows) and prints the table (OUTDIR/profile-PRECISION.md).  Kernel
# times under ncu are the kernels' own (ncu serialises launches): the sum is
# the step's GPU time without launch gaps, not its wall time.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUTDIR=${1:-bench-gpu-out}
mkdir -p "$OUTDIR"
BUILD_DIR=${BUILD_DIR:-$ROOT/build-gpu}
PRECISION=${PRECISION:-bf16}
B=${B:-8}
T=${T:-1024}
STEPS=${STEPS:-2}
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  [[ -x /opt/torch/.venv/bin/python3 ]] && PYTHON=/opt/torch/.venv/bin/python3
fi
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n $NCU ]] || { echo "profile.sh: no ncu (Nsight Compute) found" >&2; exit 1; }
SCRATCH=$(mktemp -d /tmp/plexus-gpu-profile.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
"$PYTHON" "$ROOT/bench/gpu/make_tokens.py" "$SCRATCH/tokens.bin" --tokens $(((STEPS + 4) * B * T * 2 + 4 * T)) >/dev/null
CSV=$OUTDIR/profile-$PRECISION.csv
"$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --page raw --print-units base --log-file "$CSV" \
  "$BUILD_DIR/plexus" train --model gpt --n-layer 12 --n-head 12 --n-embd 768 --context "$T" --vocab-size 50257 \
  --dropout 0 --data tokens --data-path "$SCRATCH/tokens.bin" --batch-size "$B" --steps "$STEPS" \
  --optim adamw --lr 6e-4 --weight-decay 0.1 --seed 1 --progress lines --device cuda --precision "$PRECISION" \
  >"$SCRATCH/run.log" 2>&1 || { tail -20 "$SCRATCH/run.log" >&2; echo "profile.sh: the profiled run failed" >&2; }
"$PYTHON" - "$CSV" "$STEPS" "$PRECISION" <<'PY' | tee "$OUTDIR/profile-$PRECISION.md"
import csv, sys, collections
path, steps, prec = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [l for l in open(path) if l.startswith('"')]
r = csv.DictReader(rows)
tot = collections.Counter(); cnt = collections.Counter()
for row in r:
    name = row.get("Kernel Name") or row.get("Function Name") or "?"
    v = row.get("gpu__time_duration.sum", "")
    try: ns = float(v.replace(",", ""))
    except ValueError: continue
    short = name.split("(")[0][:80]
    tot[short] += ns; cnt[short] += 1
all_ns = sum(tot.values())
print(f"plexus {prec}: {sum(cnt.values())} kernels in {steps} steps, {all_ns/1e6/steps:.1f} ms of kernel time per step")
print("| kernel | ms/step | share | launches/step |")
print("|---|---:|---:|---:|")
for k, v in tot.most_common(30):
    print(f"| `{k}` | {v/1e6/steps:.2f} | {100*v/all_ns:.1f}% | {cnt[k]/steps:.0f} |")
PY
