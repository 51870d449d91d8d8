#!/usr/bin/env bash
# bench/run_recompute.sh — activation checkpointing on the zoo's GPT: memory
# saved and time paid by each --recompute policy, at 4, 8 and 12 layers, in
# one run (bench/bench_recompute.c, one process per row so that VmHWM is
# that row's peak).
#
#   bench/run_recompute.sh            (from the repository root or anywhere)
#
# Model: vocabulary 1024, context 128, width 256, 4 heads, dropout 0.1;
# batch 8 sequences; a step is zero_grad, forward, cross-entropy, backward,
# AdamW; 1 warm-up step and STEPS timed ones, 1 thread.  Columns:
#
#   arena MiB    the step arena's high-water mark: activations, the loss
#                gradient, backward's temporaries (what recomputation cuts)
#   VmHWM MiB    the process's peak resident size (adds parameters,
#                gradients, AdamW's two moments, libraries)
#   step ms      median wall time of the timed steps; best: the fastest
#   cpu ms       median CPU time of the process per step (1 thread: the
#                step's own work; steadiest when others share the cores)
#   x none       step time over the same layer count's --recompute none
#                (wall median; wall best; cpu median)
#
# After the table: the arena's growth per layer (12 layers minus 4, over 8)
# for each policy, against A = batch·context·width·4 bytes, one (N, T, C)
# activation: full recomputation should grow by about 2A per layer (each
# unit's input kept from forward, its input gradient from backward) while
# none grows by the whole block's activations and gradients.
#
# Timings on a shared machine are noisy: read "best" and re-run on a quiet
# one.  This is a benchmark, not a test: it never fails on speed.
#
# Settings (environment): BUILD_DIR (default <repo>/build), STEPS (3),
# LAYERS ("4 8 12"), POLICIES ("none full every:2 selective"), BATCH (8),
# THREADS (1).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
bin="$build/bench_recompute"
steps="${STEPS:-3}"
layers="${LAYERS:-4 8 12}"
policies="${POLICIES:-none full every:2 selective}"
batch="${BATCH:-8}"
threads="${THREADS:-1}"
if [[ ! -x "$bin" ]]; then
  echo "run_recompute.sh: $bin not found; build first (cmake --build build)" >&2
  exit 1
fi
start=$(date +%s)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for L in $layers; do
  for p in $policies; do
    "$bin" --layers "$L" --policy "$p" --batch "$batch" --steps "$steps" --threads "$threads" >>"$out"
  done
done
awk -v batch="$batch" -v secs="$(( $(date +%s) - start ))" '
  function field(name,   i, kv) { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == name) return kv[2] } return "" }
  {
    p = field("policy"); L = field("layers"); n++
    row_p[n] = p; row_L[n] = L
    arena[p, L] = field("arena_mib"); hwm[p, L] = field("vmhwm_mib")
    ms[p, L] = field("step_ms"); best[p, L] = field("best_step_ms"); cpu[p, L] = field("cpu_ms")
    ctx = field("context"); embd = field("embd")
    if (!(p in seen)) { seen[p] = 1; order[++np] = p }
    if (!(L in seenL)) { seenL[L] = 1; lay[++nl] = L }
  }
  END {
    printf "| layers | --recompute | arena MiB | VmHWM MiB | step ms | best ms | cpu ms | x none | x none (best) | x none (cpu) |\n"
    printf "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    for (i = 1; i <= n; i++) {
      p = row_p[i]; L = row_L[i]
      r = ("none", L) in ms && ms["none", L] > 0 ? sprintf("%.2f", ms[p, L] / ms["none", L]) : "-"
      rb = ("none", L) in best && best["none", L] > 0 ? sprintf("%.2f", best[p, L] / best["none", L]) : "-"
      rc = ("none", L) in cpu && cpu["none", L] > 0 ? sprintf("%.2f", cpu[p, L] / cpu["none", L]) : "-"
      printf "| %d | %s | %.1f | %.1f | %.0f | %.0f | %.0f | %s | %s | %s |\n", L, p, arena[p, L], hwm[p, L], ms[p, L], best[p, L], cpu[p, L], r, rb, rc
    }
    A = batch * ctx * embd * 4 / 1048576
    if (nl >= 2) {
      lo = lay[1]; hi = lay[nl]
      printf "\narena growth per layer (%d -> %d layers), A = batch*context*width*4 = %.2f MiB:\n", lo, hi, A
      for (k = 1; k <= np; k++) {
        p = order[k]
        g = (arena[p, hi] - arena[p, lo]) / (hi - lo)
        printf "  %-10s %7.2f MiB/layer = %5.1f A\n", p, g, g / A
      }
    }
    printf "\n(%d runs in %d s; timings provisional on a shared machine)\n", n, secs
  }' "$out"
