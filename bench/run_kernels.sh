#!/usr/bin/env bash
# bench/run_kernels.sh — the portable build against -march=native on the hot
# loops of plexus's own code (bench/bench_kernels.c), alternated round by
# round so that both see the same machine load.
#
#   bench/run_kernels.sh [ROUNDS (5)] [SECONDS per kernel and round (0.3)]
#
# Builds build-native/ (-DPX_NATIVE=ON: -march=native, no clones; what every
# build was before the portable default) and build-portable/ (the default:
# baseline x86-64, PX_KERNEL clones picked from cpuid) and runs their
# bench_kernels alternately, 1 thread.  Per kernel: the best CPU time of one
# call over all rounds in each build, and portable / native.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
secs=${2:-0.3}
for b in native portable; do
  flag=OFF; [ $b = native ] && flag=ON
  cmake -S . -B build-$b -DCMAKE_BUILD_TYPE=Release -DPX_NATIVE=$flag -DPX_BUILD_TESTS=OFF >/dev/null
  cmake --build build-$b -j"$(nproc)" --target bench_kernels >/dev/null
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
  for b in native portable; do
    build-$b/bench_kernels --seconds "$secs" >>"$tmp/$b.txt"
  done
done
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $rounds rounds alternated, best of each; portable kernels: $(build-portable/bench_kernels --only none | sed 's/.*kernels: //')"
awk -F'  +' '
  FNR == 1 { b = (FILENAME ~ /native/) ? "n" : "p" }
  /^#/ { next }
  { name = $1; t = $2 + 0; if (!(name in seen)) { order[++k] = name; seen[name] = 1 }
    if (!((b, name) in best) || t < best[b, name]) best[b, name] = t }
  END {
    printf "| kernel | native µs cpu | portable µs cpu | portable / native |\n|---|---:|---:|---:|\n"
    for (i = 1; i <= k; i++) { n = order[i]
      printf "| %s | %.1f | %.1f | %.3f |\n", n, best["n", n], best["p", n], best["p", n] / best["n", n] }
  }' "$tmp/native.txt" "$tmp/portable.txt"
