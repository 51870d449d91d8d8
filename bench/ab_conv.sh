#!/usr/bin/env bash
# bench/ab_conv.sh — two bench_conv binaries, before and after a change,
# alternated in one run, on a machine others share.
#
#   bench/ab_conv.sh BEFORE AFTER [bench_conv arguments...]
#   e.g. ROUNDS=7 bench/ab_conv.sh /tmp/bench_conv.old build/bench_conv --batch 8 --case 512,512,7,7,1 --seconds 0.3
#
# ROUNDS rounds (default 7) of BEFORE then AFTER with the same arguments
# (bench_conv's defaults where none are given: ResNet-20's and the zoo
# CNN's layers at batch 64), then for each side, layer and pass the least
# and the median of its rounds' milliseconds.  The least is the figure to
# compare where the machine's speed swings from minute to minute: what
# others run only ever adds time.  It reports; it never fails on speed.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BEFORE AFTER [bench_conv arguments...]" >&2; exit 2; }
before=$1 after=$2
shift 2
ROUNDS=${ROUNDS:-7}
for ((r = 1; r <= ROUNDS; r++)); do
  for side in before after; do
    bin=$before; [ "$side" = after ] && bin=$after
    "$bin" "$@" | grep ' pass=' | sed "s/^plexus/$side/"
  done
done | awk '
  { key = $1; ms = ""
    for (i = 2; i <= NF; i++) {
      if ($i ~ /^(C|O|H|W|stride|batch|threads|pass)=/) key = key " " $i
      if ($i ~ /^ms=/) ms = substr($i, 4)
    }
    n[key]++; v[key, n[key]] = ms + 0; keys[key] = 1 }
  END {
    for (k in keys) {
      m = n[k]
      for (i = 1; i <= m; i++) a[i] = v[k, i]
      for (i = 2; i <= m; i++) { x = a[i]; j = i - 1; while (j >= 1 && a[j] > x) { a[j + 1] = a[j]; j-- } a[j + 1] = x }
      printf "%s min_ms=%.3f median_ms=%.3f rounds=%d\n", k, a[1], a[int((m + 1) / 2)], m
    }
  }' | sort -k2
