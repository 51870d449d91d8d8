#!/usr/bin/env bash
# bench/run.sh — plexus against PyTorch, side by side, on this machine.
#
#   bench/run.sh                     (from the repository root or anywhere)
#
# Builds bench_train (CMake Release into build/ unless BUILD_DIR says
# otherwise and unless it is configured already), then for each thread count
# and each case runs bench_train and bench_train_torch.py one after the other,
# ROUNDS times, alternating which goes first, so that whatever else the
# machine is doing weighs on both alike.  Prints the raw lines as they come,
# then a table: median samples/s of each side and the median of the per-round
# ratios plexus/PyTorch (each ratio is of two runs seconds apart), and
# "cpu": the lowest share of its cores a plexus run of that row got (CPU
# seconds over threads × wall seconds; plexus's idle threads spin, so it
# reads ~100% on a quiet machine).  Well under 100% means other work on the
# machine took the cores during that row, and its figures are not clean.
#
# This is a benchmark, not a test: it reports, it never fails on speed.
#
# Settings (environment):
#   BUILD_DIR   build folder                    (default: <repo>/build)
#   PYTHON      Python that has torch           (default: /usr/bin/python3, Debian's python3-torch)
#   THREADS     thread counts to run            (default: "1 2")
#   ROUNDS      runs of each case and side      (default: 3)
#   SECONDS_PER_RUN  timed seconds of each run  (default: 2.5; plus 0.5 s warm-up)
#   CASES       which cases                     (default: "mlp:16 mlp:1024 cnn:64 zoo_cnn:64 resnet_small:64";
#               also resnet18:8, ResNet-18 at 224x224, a few seconds a step)
#   TORCH_BLAS_THREADS  OPENBLAS_NUM_THREADS for PyTorch's GEMMs (default 1:
#               see bench_train_torch.py for why)
#   BENCH       a bench_train binary to use instead of building one (to
#               measure a private variant against the same PyTorch runs)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-"1 2"}
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-2.5}
CASES=${CASES:-"mlp:16 mlp:1024 cnn:64 zoo_cnn:64 resnet_small:64"}
TORCH_BLAS_THREADS=${TORCH_BLAS_THREADS:-1}
# The issue's aims, as plexus/PyTorch ratios.
declare -A AIM=([mlp:16]=5.0 [mlp:1024]=1.5 [cnn:64]=1.5)

# ---- Build -----------------------------------------------------------------
# Quiet unless it fails; then show what the build said.
build_bench() {
  local log
  log=$(mktemp)
  if ! { [[ -f $BUILD_DIR/CMakeCache.txt ]] ||
         cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release; } >"$log" 2>&1 ||
     ! cmake --build "$BUILD_DIR" --target bench_train -j "$(nproc)" >>"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "bench/run.sh: building bench_train in $BUILD_DIR failed (log above)" >&2
    exit 1
  fi
  rm -f "$log"
}
if [[ -z ${BENCH:-} ]]; then
  build_bench
  BENCH=$BUILD_DIR/bench_train
fi
TORCH_BENCH=$ROOT/bench/bench_train_torch.py
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "bench/run.sh: $PYTHON cannot import torch; apt-get install python3-torch, or set PYTHON" >&2
  exit 1
fi

# ---- Header: what was measured, on what ------------------------------------
echo "# plexus vs PyTorch training throughput (bench/run.sh)"
echo "# date:     $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# commit:   $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
echo "# cpu:      $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
if [[ $BENCH == "$BUILD_DIR/bench_train" ]]; then
  echo "# build:    $(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt") in $BUILD_DIR"
else
  echo "# binary:   $BENCH (given by BENCH)"
fi
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-<unset>} (left as found)"
echo "# $("$BENCH" --info)"
echo "# $("$PYTHON" "$TORCH_BENCH" --info --blas-threads "$TORCH_BLAS_THREADS")"
echo "# rounds=$ROUNDS seconds_per_run=$SECONDS_PER_RUN threads=\"$THREADS\""
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- Runs --------------------------------------------------------------------
# results[key] = space-separated samples/s of each round, key = side:case:threads
declare -A results
declare -A shares
field() { sed -n "s/.* $1=\([0-9.e+-]*\).*/\1/p"; }

run_one() {  # side model batch threads
  local side=$1 model=$2 batch=$3 t=$4 line
  local args=(--model "$model" --batch "$batch" --threads "$t" --seconds "$SECONDS_PER_RUN")
  local cmd=("$BENCH" "${args[@]}")
  [[ $side == torch ]] && cmd=("$PYTHON" "$TORCH_BENCH" "${args[@]}" --blas-threads "$TORCH_BLAS_THREADS")
  if ! line=$("${cmd[@]}"); then
    echo "bench/run.sh: failed: ${cmd[*]}" >&2
    exit 1
  fi
  echo "  $line"
  results[$side:$model:$batch:$t]+="$(field samples_per_s <<<"$line") "
  # Share of its cores the run got: CPU seconds / (threads × wall seconds).
  shares[$side:$model:$batch:$t]+="$(awk -v c="$(field cpu_s <<<"$line")" -v s="$(field seconds <<<"$line")" \
                                       -v t="$t" 'BEGIN { printf "%.3f", c / (t * s) }') "
}

for ((r = 1; r <= ROUNDS; r++)); do
  echo "# round $r"
  for t in $THREADS; do
    for c in $CASES; do
      model=${c%%:*} batch=${c##*:}
      if ((r % 2)); then order="plexus torch"; else order="torch plexus"; fi
      for side in $order; do run_one "$side" "$model" "$batch" "$t"; done
    done
  done
done
echo "# load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- Table ---------------------------------------------------------------------
echo
printf '%-18s %7s %17s %17s %7s %5s  %s\n' case threads "plexus samples/s" "PyTorch samples/s" ratio cpu aim
for t in $THREADS; do
  for c in $CASES; do
    model=${c%%:*} batch=${c##*:}
    key=$model:$batch:$t
    "$PYTHON" - "$model b=$batch" "$t" "${AIM[$c]:-}" "${results[plexus:$key]}" "${results[torch:$key]}" \
      "${shares[plexus:$key]}" <<'EOF'
import statistics, sys
name, t, aim, p, q, shares = sys.argv[1:]
p = [float(v) for v in p.split()]
q = [float(v) for v in q.split()]
ratio = statistics.median(a / b for a, b in zip(p, q))
mark = ""
if aim:
    mark = "%.1fx %s" % (float(aim), "met" if ratio >= float(aim) else "MISSED")
cpu = min(float(v) for v in shares.split())
print("%-18s %7s %17.0f %17.0f %6.2fx %4.0f%%  %s" % (name, t, statistics.median(p), statistics.median(q), ratio, 100 * cpu, mark))
EOF
  done
done
