#!/usr/bin/env bash
# bench/run_conv.sh — single 3x3 convolution layers, plexus against PyTorch,
# side by side, on this machine.
#
#   bench/run_conv.sh                (from the repository root or anywhere)
#   SECONDS_PER_CASE=0.2 ROUNDS=1 THREADS=1 bench/run_conv.sh     (a quick look)
#
# Measures one layer at a time, Conv2d(C, O, 3, stride, padding 1, no bias)
# at batch 64: ResNet-20's 3x3 layers (stride 1 and its two stride-2 ones)
# and the zoo CNN's two (bench/bench_conv.c lists them), each pass apart:
# forward, and backward (dx and dW, after one forward).  Each run reports
# the median time of one call over about SECONDS_PER_CASE seconds of calls.
#
# Builds bench_conv (CMake Release into build/ unless BUILD_DIR says
# otherwise and unless it is configured already), then for each thread
# count and each round runs bench_conv once under each ISA setting and
# bench/bench_conv_torch.py once, one after the other, alternating between
# rounds which side goes first (as bench/run.sh), so that whatever else the
# machine is doing weighs on both alike.  Prints the raw lines as they come,
# then a markdown table per thread count: the median over rounds of each
# column's milliseconds, and the median over rounds of the per-round ratio
# PyTorch ms / plexus ms for the first ISA setting (each ratio is of two
# runs seconds apart; > 1: plexus is faster).  The raw lines name the
# kernels each side ran (plexus: px_conv_kernel_info(), or im2col+gemm for
# the stride-2 layers; PyTorch: onednn or native).
#
# This is a benchmark, not a test: it reports, it never fails on speed.
#
# Settings (environment):
#   BUILD_DIR   build folder                          (default: <repo>/build)
#   PYTHON      Python that has torch                 (default: /usr/bin/python3, Debian's python3-torch)
#   THREADS     thread counts to run                  (default: "1 2")
#   ROUNDS      runs of each side and thread count    (default: 3)
#   SECONDS_PER_CASE  timed seconds of each case and pass (default: 0.5)
#   ISAS        plexus's kernel settings, in columns  (default: "default avx2";
#               "default" leaves PX_CONV_ISA unset, any other word w runs with
#               PX_CONV_ISA=w: base, avx2 or avx512).  The ratio column is of
#               the first.
#   BATCH       batch size                            (default: 64)
#   TORCH_BLAS_THREADS  OPENBLAS_NUM_THREADS for PyTorch's GEMMs (default 1:
#               see bench_train_torch.py for why)
#   BENCH       a bench_conv binary to use instead of building one
# OPENBLAS_CORETYPE and PX_CONV_DIRECT are left as found (printed first).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
THREADS=${THREADS:-"1 2"}
ROUNDS=${ROUNDS:-3}
SECONDS_PER_CASE=${SECONDS_PER_CASE:-0.5}
ISAS=${ISAS:-"default avx2"}
BATCH=${BATCH:-64}
TORCH_BLAS_THREADS=${TORCH_BLAS_THREADS:-1}

die() {
  echo "bench/run_conv.sh: $*" >&2
  exit 1
}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS is a count >= 1, not \"$ROUNDS\""
for t in $THREADS; do [[ $t =~ ^[1-9][0-9]*$ ]] || die "THREADS holds thread counts >= 1, not \"$t\""; done
[[ -n ${THREADS// /} ]] || die "THREADS is empty"
for isa in $ISAS; do
  [[ $isa =~ ^(default|base|avx2|avx512)$ ]] || die "ISAS holds default, base, avx2 or avx512, not \"$isa\""
done
[[ -n ${ISAS// /} ]] || die "ISAS is empty"

# ---- Build -----------------------------------------------------------------
# Quiet unless it fails; then show what the build said.  A build folder
# configured before bench_conv.c existed has no such target yet: configure
# it again (the bench/*.c glob) and retry.
build_bench() {
  local log
  log=$(mktemp)
  if ! { [[ -f $BUILD_DIR/CMakeCache.txt ]] ||
         cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release; } >"$log" 2>&1 ||
     ! { cmake --build "$BUILD_DIR" --target bench_conv -j "$(nproc)" ||
         { cmake -S "$ROOT" -B "$BUILD_DIR" &&
           cmake --build "$BUILD_DIR" --target bench_conv -j "$(nproc)"; }; } >>"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    die "building bench_conv in $BUILD_DIR failed (log above)"
  fi
  rm -f "$log"
}
if [[ -z ${BENCH:-} ]]; then
  build_bench
  BENCH=$BUILD_DIR/bench_conv
fi
TORCH_BENCH=$ROOT/bench/bench_conv_torch.py
"$PYTHON" -c 'import torch' 2>/dev/null ||
  die "$PYTHON cannot import torch; apt-get install python3-torch, or set PYTHON"

# plexus under one ISA setting: "default" leaves PX_CONV_ISA unset.
plexus_env() {  # isa, then the command
  local isa=$1
  shift
  if [[ $isa == default ]]; then env -u PX_CONV_ISA "$@"; else PX_CONV_ISA=$isa "$@"; fi
}

# ---- Header: what was measured, on what ------------------------------------
echo "# plexus vs PyTorch, single 3x3 convolution layers (bench/run_conv.sh)"
echo "# date:     $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# commit:   $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
echo "# machine:  $(lscpu | sed -n 's/^Model name: *//p' | head -1), nproc $(nproc), load average $(cut -d' ' -f1-3 /proc/loadavg), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} (left as found)"
for isa in $ISAS; do
  echo "# plexus ($isa): $(plexus_env "$isa" "$BENCH" --info)"
done
echo "# PX_CONV_DIRECT=${PX_CONV_DIRECT-<unset>} (left as found)"
if [[ $BENCH == "$BUILD_DIR/bench_conv" ]]; then
  echo "# build:    $(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt") in $BUILD_DIR"
else
  echo "# binary:   $BENCH (given by BENCH)"
fi
echo "# $("$PYTHON" "$TORCH_BENCH" --info --blas-threads "$TORCH_BLAS_THREADS")"
echo "# rounds=$ROUNDS seconds=$SECONDS_PER_CASE batch=$BATCH threads=\"$THREADS\" isas=\"$ISAS\""

# ---- Runs --------------------------------------------------------------------
# Every raw line, tagged "threads round column", for the tables.
RAW=$(mktemp)
trap 'rm -f "$RAW"' EXIT

run_one() {  # column (plexus:<isa> or torch), threads, round
  local col=$1 t=$2 r=$3 out
  local args=(--threads "$t" --seconds "$SECONDS_PER_CASE" --batch "$BATCH")
  local cmd
  if [[ $col == torch ]]; then
    cmd=("$PYTHON" "$TORCH_BENCH" "${args[@]}" --blas-threads "$TORCH_BLAS_THREADS")
  else
    cmd=(plexus_env "${col#plexus:}" "$BENCH" "${args[@]}")
  fi
  if ! out=$("${cmd[@]}"); then
    die "failed: ${cmd[*]}"
  fi
  sed 's/^/  /' <<<"$out"
  sed "s/^/$t $r $col /" <<<"$out" >>"$RAW"
}

PLEXUS_COLS=()
for isa in $ISAS; do PLEXUS_COLS+=("plexus:$isa"); done
for t in $THREADS; do
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "# threads $t, round $r"
    if ((r % 2)); then order=("${PLEXUS_COLS[@]}" torch); else order=(torch "${PLEXUS_COLS[@]}"); fi
    for col in "${order[@]}"; do run_one "$col" "$t" "$r"; done
  done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# ---- Tables ------------------------------------------------------------------
"$PYTHON" - "$RAW" "$THREADS" "$ISAS" <<'EOF'
import re, statistics, sys
raw, threads, isas = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
cols = ["plexus:" + i for i in isas] + ["torch"]
ms = {}     # (threads, column, case, pass) -> {round: ms}
cases = []  # (case, pass) in the order of the runs
for line in open(raw):
    t, r, col, rest = line.split(" ", 3)
    f = dict(re.findall(r"(\w+)=(\S+)", rest.split(" kernel=")[0]))
    case = "%s,%s,%s,%s,%s" % (f["C"], f["O"], f["H"], f["W"], f["stride"])
    key = (case, f["pass"])
    if key not in cases:
        cases.append(key)
    ms.setdefault((t, col, case, f["pass"]), {})[r] = float(f["ms"])
for t in threads:
    print()
    print("threads=%s (C,O,H,W,stride; medians over rounds; ratio > 1: plexus faster)" % t)
    print()
    print("| case | pass | " + " | ".join("plexus %s ms" % i for i in isas) + " | PyTorch ms | plexus(%s)/PyTorch speed ratio |" % isas[0])
    print("|---|---|" + "---:|" * (len(isas) + 2))
    for case, pas in cases:
        cells = [statistics.median(ms[(t, c, case, pas)].values()) for c in cols]
        p, q = ms[(t, cols[0], case, pas)], ms[(t, "torch", case, pas)]
        ratio = statistics.median(q[r] / p[r] for r in p if r in q)
        print("| %s | %s | " % (case, pas) + " | ".join("%.3f" % v for v in cells) + " | %.2f |" % ratio)
EOF
