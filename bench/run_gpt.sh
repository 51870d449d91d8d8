#!/usr/bin/env bash
# bench/run_gpt.sh — GPT training throughput, plexus against PyTorch, side by
# side, and against this machine's sgemm peak.
#
#   bench/run_gpt.sh                 (from the repository root or anywhere)
#
# The model (bench/bench_gpt.c, bench/bench_gpt_torch.py): GPT-2's layers,
# vocabulary 8192, context 128, 4 layers, 4 heads, width 256 (5.29 M
# parameters, the head tied to wte), batch 8 sequences of 128 tokens, dropout
# 0; a timed step is zero_grad, forward, cross-entropy over the vocabulary,
# backward, AdamW.  Three rows:
#
#   1 thread     one process, 1 thread
#   2 threads    one process, 2 threads
#   ddp 2x1      data parallel, 2 ranks of 1 thread, batch 8 each (plexus:
#                the threads backend; PyTorch: DistributedDataParallel over
#                2 processes with gloo)
#
# For each round and row, plexus and PyTorch run one right after the other
# (alternating which goes first), and `bench_gpt --peak` measures
# cblas_sgemm on 2048×2048 matrices at 1 and 2 threads (the best of its
# runs).  The table gives, per row: median tokens/s of each side over the
# rounds and the median of the per-round ratios plexus/PyTorch; the best
# single step of each side over all rounds (tokens/s) and their ratio, the
# figure least disturbed by other work on a shared machine; plexus's
# GFLOP/s (tokens/s × (6·N + 6·L·C·T), N = 5,289,472) and that as a share of
# the best sgemm GFLOP/s at the same number of threads; and "cpu", the
# lowest share of its cores a plexus run of that row got (well under 100%:
# other work took the cores; run again).
#
# Aims: plexus >= 1.3x PyTorch's tokens/s, and >= 60% of the sgemm peak.
# This is a benchmark, not a test: it reports, it never fails on speed.
#
# Settings (environment):
#   BUILD_DIR        build folder                 (default: <repo>/build)
#   PYTHON           Python that has torch        (default: /usr/bin/python3)
#   ROUNDS           runs of each row and side    (default: 3)
#   SECONDS_PER_RUN  timed seconds of each run    (default: 5; plus 1 s warm-up)
#   ROWS             which rows                   (default: "1x1 2x1 1x2": threads x ranks)
#   TORCH_BLAS_THREADS  OPENBLAS_NUM_THREADS for PyTorch (default 1, see bench_gpt_torch.py)
#   BENCH            a bench_gpt binary to use instead of building one
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
ROWS=${ROWS:-"1x1 2x1 1x2"}
TORCH_BLAS_THREADS=${TORCH_BLAS_THREADS:-1}
AIM_RATIO=1.3
AIM_PEAK=60

if [[ -z ${BENCH:-} ]]; then
  log=$(mktemp)
  if ! { [[ -f $BUILD_DIR/CMakeCache.txt ]] ||
         cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release; } >"$log" 2>&1 ||
     ! cmake --build "$BUILD_DIR" --target bench_gpt -j "$(nproc)" >>"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "bench/run_gpt.sh: building bench_gpt in $BUILD_DIR failed (log above)" >&2
    exit 1
  fi
  rm -f "$log"
  BENCH=$BUILD_DIR/bench_gpt
fi
TORCH_BENCH=$ROOT/bench/bench_gpt_torch.py
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "bench/run_gpt.sh: $PYTHON cannot import torch; apt-get install python3-torch, or set PYTHON" >&2
  exit 1
fi

echo "# plexus vs PyTorch: GPT training throughput (bench/run_gpt.sh)"
echo "# date:     $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# commit:   $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
echo "# cpu:      $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-<unset>} (left as found)"
echo "# $("$BENCH" --info)"
echo "# $("$PYTHON" "$TORCH_BENCH" --info --blas-threads "$TORCH_BLAS_THREADS")"
echo "# rounds=$ROUNDS seconds_per_run=$SECONDS_PER_RUN rows=\"$ROWS\""
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

declare -A results best shares peak
field() { sed -n "s/.* $1=\([0-9.e+-]*\).*/\1/p"; }

run_one() {  # side threads ranks
  local side=$1 t=$2 r=$3 line
  local args=(--threads "$t" --ranks "$r" --seconds "$SECONDS_PER_RUN")
  local cmd=("$BENCH" "${args[@]}")
  [[ $side == torch ]] && cmd=("$PYTHON" "$TORCH_BENCH" "${args[@]}" --blas-threads "$TORCH_BLAS_THREADS")
  # A run that hangs (once seen: PyTorch's DDP over gloo) ends the script
  # with a message instead of waiting forever.
  if ! line=$(timeout $((SECONDS_PER_RUN * 20 + 120)) "${cmd[@]}"); then
    echo "bench/run_gpt.sh: failed or timed out: ${cmd[*]}" >&2
    exit 1
  fi
  echo "  $line"
  results[$side:$t:$r]+="$(field tokens_per_s <<<"$line") "
  best[$side:$t:$r]+="$(field best_tokens_per_s <<<"$line") "
  shares[$side:$t:$r]+="$(awk -v c="$(field cpu_s <<<"$line")" -v s="$(field seconds <<<"$line")" \
                            -v n="$((t * r))" 'BEGIN { printf "%.3f", c / (n * s) }') "
}

for ((k = 1; k <= ROUNDS; k++)); do
  echo "# round $k"
  for n in 1 2; do
    line=$("$BENCH" --peak --threads "$n" --seconds 1)
    echo "  $line"
    peak[$n]+="$(field gflops <<<"$line") "
  done
  for row in $ROWS; do
    t=${row%%x*} r=${row##*x}
    if ((k % 2)); then order="plexus torch"; else order="torch plexus"; fi
    for side in $order; do run_one "$side" "$t" "$r"; done
  done
done
echo "# load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

FPT=$("$BENCH" --threads 1 --seconds 0.01 --warmup 0 | field flops_per_token)
echo
printf '%-10s %15s %15s %7s  %11s %11s %7s  %7s %9s %6s %5s  %s\n' case "plexus tok/s" "PyTorch tok/s" ratio \
  "best plexus" "best torch" ratio "GFLOP/s" "sgemm pk" "%peak" cpu aims
for row in $ROWS; do
  t=${row%%x*} r=${row##*x}
  key=$t:$r
  if ((r > 1)); then name="ddp ${r}x$t"; elif ((t > 1)); then name="$t threads"; else name="1 thread"; fi
  "$PYTHON" - "$name" "$FPT" "${results[plexus:$key]}" "${results[torch:$key]}" "${best[plexus:$key]}" \
    "${best[torch:$key]}" "${shares[plexus:$key]}" "${peak[$((t * r))]}" "$AIM_RATIO" "$AIM_PEAK" <<'EOF'
import statistics, sys
name, fpt, p, q, bp, bq, shares, pk, aim_ratio, aim_peak = sys.argv[1:]
num = lambda s: [float(v) for v in s.split()]
p, q, bp, bq, pk = num(p), num(q), num(bp), num(bq), num(pk)
ratio = statistics.median(a / b for a, b in zip(p, q))
gflops = statistics.median(p) * float(fpt) * 1e-9
share = 100 * gflops / max(pk)
aims = "%s %s" % ("ratio met" if ratio >= float(aim_ratio) else "ratio MISSED",
                  "peak met" if share >= float(aim_peak) else "peak MISSED")
print("%-10s %15.0f %15.0f %6.2fx  %11.0f %11.0f %6.2fx  %7.1f %9.1f %5.0f%% %4.0f%%  %s" % (
    name, statistics.median(p), statistics.median(q), ratio, max(bp), max(bq), max(bp) / max(bq), gflops, max(pk),
    share, 100 * min(num(shares)), aims))
EOF
done
