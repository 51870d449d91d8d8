#!/usr/bin/env bash
# bench/ab_train.sh — two bench_train binaries, before and after a change,
# alternated in one run, on a machine others share.
#
#   bench/ab_train.sh BEFORE AFTER          (two bench_train binaries)
#
# For each thread count and batch, ROUNDS rounds of BEFORE then AFTER
# (SECONDS_PER_RUN each), printing samples/s and CPU milliseconds per step
# (cpu_s / steps: on a loaded machine the CPU time a step took is steadier
# than its wall time; at T > 1 it includes OpenMP's spinning) with the load
# average.  It reports; it never fails on speed.
#
# Settings (environment): MODEL (mlp), BATCHES ("16"), THREADS ("1"),
# ROUNDS (3), SECONDS_PER_RUN (2).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BEFORE AFTER (two bench_train binaries)" >&2; exit 2; }
MODEL=${MODEL:-mlp} BATCHES=${BATCHES:-16} THREADS=${THREADS:-1} ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
for t in $THREADS; do
  for b in $BATCHES; do
    for ((r = 1; r <= ROUNDS; r++)); do
      for side in before after; do
        bin=$1; [ "$side" = after ] && bin=$2
        line=$("$bin" --model "$MODEL" --batch "$b" --threads "$t" --seconds "$SECONDS_PER_RUN" | grep samples_per_s)
        echo "$side $line" | awk -v t="$t" -v b="$b" -v loadavg="$(cut -d' ' -f1 /proc/loadavg)" '{
          for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
          printf "%s %s batch=%s threads=%s samples_per_s=%s cpu_ms_per_step=%.3f load=%s\n",
                 $1, $2, b, t, v["samples_per_s"], 1000 * v["cpu_s"] / v["steps"], loadavg }'
      done
    done
  done
done
