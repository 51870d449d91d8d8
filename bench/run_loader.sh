#!/usr/bin/env bash
# bench/run_loader.sh — plexus's data loader against PyTorch's DataLoader,
# side by side, on this machine.
#
#   bench/run_loader.sh                  (from the repository root or anywhere)
#
# Two cases, each at every worker count:
#   fmnist: Fashion-MNIST's 60,000 training images from Debian's IDX files
#           (/usr/share/datasets/fashion-mnist), batch 256, normalised;
#   jpeg:   2,000 generated 256×256 JPEGs listed in a path,label CSV, random
#           crop 224 + horizontal flip + ImageNet normalisation, batch 64.
# plexus: bench_loader (threads); PyTorch: bench_loader_torch.py
# (DataLoader with num_workers processes, persistent).  Each run times one
# warm-up epoch apart, then EPOCHS epochs.  The two sides alternate, ROUNDS
# times, so that other work on the machine weighs on both alike; the table
# gives the median samples/s of each side and the ratio of the medians.
#
# This is a benchmark, not a test: it reports, it never fails on speed.
#
# Settings (environment):
#   BUILD_DIR   build folder                  (default: <repo>/build)
#   PYTHON      Python that has torch         (default: /usr/bin/python3)
#   WORKERS     worker counts                 (default: "1 2 4")
#   ROUNDS      runs of each case and side    (default: 3)
#   EPOCHS      timed epochs per run          (default: fmnist 2, jpeg 1)
#   CASES       which cases                   (default: "fmnist jpeg")
#   FMNIST_DIR  the IDX files                 (default: /usr/share/datasets/fashion-mnist)
#   JPEG_DIR    where the JPEGs are made once (default: /tmp/plexus-bench-jpegs)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
WORKERS=${WORKERS:-"1 2 4"}
ROUNDS=${ROUNDS:-3}
CASES=${CASES:-"fmnist jpeg"}
FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
JPEG_DIR=${JPEG_DIR:-/tmp/plexus-bench-jpegs}

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD_DIR" --target bench_loader -j "$(nproc)" >/dev/null
BENCH="$BUILD_DIR/bench_loader"

if [ ! -f "$JPEG_DIR/list.csv" ]; then
  echo "making 2,000 JPEGs in $JPEG_DIR (once)" >&2
  "$BENCH" make-jpegs "$JPEG_DIR" 2000 256
fi

args() {  # case -> the arguments after the case name, less WORKERS EPOCHS
  case $1 in
    fmnist) echo "$FMNIST_DIR" ;;
    jpeg) echo "$JPEG_DIR/list.csv 224" ;;
  esac
}
epochs() { case $1 in fmnist) echo "${EPOCHS:-2}" ;; jpeg) echo "${EPOCHS:-1}" ;; esac; }
rate() { sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p'; }
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

RESULTS=$(mktemp)
trap 'rm -f "$RESULTS"' EXIT
for c in $CASES; do
  for w in $WORKERS; do
    for r in $(seq "$ROUNDS"); do
      # shellcheck disable=SC2046
      px() { "$BENCH" "$c" $(args "$c") "$w" "$(epochs "$c")"; }
      # shellcheck disable=SC2046
      tv() { "$PYTHON" "$ROOT/bench/bench_loader_torch.py" "$c" $(args "$c") "$w" "$(epochs "$c")" 2>/dev/null; }
      if [ $((r % 2)) -eq 1 ]; then a=$(px); b=$(tv); else b=$(tv); a=$(px); fi
      echo "$a"
      echo "$b"
      echo "$c $w $(echo "$a" | rate) $(echo "$b" | rate)" >>"$RESULTS"
    done
  done
done

echo
echo "| case | workers | plexus samples/s | PyTorch samples/s | plexus/PyTorch |"
echo "|---|---:|---:|---:|---:|"
for c in $CASES; do
  for w in $WORKERS; do
    p=$(awk -v c="$c" -v w="$w" '$1 == c && $2 == w {print $3}' "$RESULTS" | median)
    t=$(awk -v c="$c" -v w="$w" '$1 == c && $2 == w {print $4}' "$RESULTS" | median)
    awk -v c="$c" -v w="$w" -v p="$p" -v t="$t" 'BEGIN {printf "| %s | %d | %.0f | %.0f | %.1f× |\n", c, w, p, t, p / t}'
  done
done
echo
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u '+%Y-%m-%d %H:%M UTC')"
