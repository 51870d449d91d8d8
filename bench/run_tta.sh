#!/usr/bin/env bash
# bench/run_tta.sh — time to accuracy: the README demo's recipe in plexus
# and in PyTorch DDP, one after the other, on this machine.
#
#   bench/run_tta.sh                                   (the full run, ~minutes)
#   TARGET=0.6 MAX_EPOCHS=1 EVAL_EVERY=50 bench/run_tta.sh   (a smoke check, seconds)
#
# plexus: `plexus train --threads 2 --model cnn --data mnist ... --epochs
# MAX_EPOCHS --lr 0.002 --schedule cosine --warmup-steps 100` (the demo's
# command, without --out: no checkpoints, no log files), timed by
# bench/tta_torch.py's `watch` mode from its launch to the first "eval" line
# with test accuracy >= TARGET, then stopped.  PyTorch: bench/tta_torch.py,
# the same model, initialisation rule, optimizer, schedule (its cosine spans
# MAX_EPOCHS epochs on both sides), batch 64 per rank, normalisation and
# data order policy, DDP over gloo with 2 processes of 1 thread each, timed
# from the script's start.  Both evaluate on the 10,000 test images at the
# same cadence (each epoch, or every EVAL_EVERY steps); the evaluations are
# inside the timed span on both sides, as are start-up and data loading.
#
# Each round runs both sides, alternating which goes first.  Prints the raw
# lines, then a table: wall seconds to TARGET, steps and epochs it took, and
# the ratio plexus/PyTorch of the medians (below 1: plexus is faster).  A side
# that did not reach TARGET within MAX_EPOCHS shows "not reached" and its
# last accuracy.  This is a benchmark: it never fails on speed.
#
# Settings (environment):
#   TARGET      test accuracy to reach              (default 0.91)
#   MAX_EPOCHS  epochs at most (and the cosine's span)   (default 5, the demo's)
#   EVAL_EVERY  evaluate every N steps (0: each epoch)   (default 0)
#   ROUNDS      rounds of both sides                (default 1)
#   RANKS       data-parallel ranks on each side    (default 2)
#   DATA        Fashion-MNIST folder                (default /usr/share/datasets/fashion-mnist)
#   BUILD_DIR   build folder with plexus            (default <repo>/build; built if missing)
#   PYTHON      Python that has torch               (default /usr/bin/python3)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
TARGET=${TARGET:-0.91}
MAX_EPOCHS=${MAX_EPOCHS:-5}
EVAL_EVERY=${EVAL_EVERY:-0}
ROUNDS=${ROUNDS:-1}
RANKS=${RANKS:-2}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}

if [ ! -x "$BUILD_DIR/plexus" ]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD_DIR" -j2 --target plexus >/dev/null
fi

echo "# run_tta: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# TARGET=$TARGET MAX_EPOCHS=$MAX_EPOCHS EVAL_EVERY=$EVAL_EVERY ROUNDS=$ROUNDS RANKS=$RANKS"

plexus_side() {
  "$PYTHON" "$ROOT/bench/tta_torch.py" watch --target "$TARGET" -- \
    "$BUILD_DIR/plexus" train --threads "$RANKS" --model cnn --data mnist --data-path "$DATA" \
    --epochs "$MAX_EPOCHS" --lr 0.002 --schedule cosine --warmup-steps 100 --eval-every "$EVAL_EVERY"
}
torch_side() {
  "$PYTHON" "$ROOT/bench/tta_torch.py" --data "$DATA" --target "$TARGET" --max-epochs "$MAX_EPOCHS" \
    --eval-every "$EVAL_EVERY" --ranks "$RANKS" --threads 1
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ((r = 1; r <= ROUNDS; r++)); do
  if ((r % 2)); then order="plexus torch"; else order="torch plexus"; fi
  for side in $order; do
    echo "## round $r: $side (load $(cut -d' ' -f1-3 /proc/loadavg))"
    "${side}_side" | tee -a "$results"
  done
done

"$PYTHON" - "$results" "$TARGET" <<'EOF'
import re, statistics, sys
rows = {"plexus": [], "torch": []}
for line in open(sys.argv[1]):
    m = re.match(r"tta (\w+) reached=(\d) accuracy=([0-9.]+) steps=(\d+) epochs=(\d+) wall_s=([0-9.]+)", line)
    if m:
        rows[m.group(1)].append((int(m.group(2)), float(m.group(3)), int(m.group(4)), int(m.group(5)),
                                 float(m.group(6))))
print()
print(f"| side | reached {sys.argv[2]} | wall s to target (median) | steps | epochs | accuracy at stop |")
print("|---|---|---|---|---|---|")
med = {}
for side, rs in rows.items():
    if not rs:
        print(f"| {side} | no result | | | | |")
        continue
    ok = [r for r in rs if r[0]]
    if len(ok) == len(rs):
        med[side] = statistics.median(r[4] for r in rs)
    print(f"| {'plexus' if side == 'plexus' else 'PyTorch DDP (gloo)'} | {len(ok)}/{len(rs)} | "
          f"{statistics.median(r[4] for r in rs):.1f}{'' if len(ok) == len(rs) else ' (not reached)'} | "
          f"{'/'.join(str(r[2]) for r in rs)} | {'/'.join(str(r[3]) for r in rs)} | "
          f"{'/'.join('%.4f' % r[1] for r in rs)} |")
if len(med) == 2:
    print(f"\nratio plexus/PyTorch (wall to target): {med['plexus'] / med['torch']:.2f}")
else:
    print("\nratio plexus/PyTorch: n/a (a side did not reach the target in every round)")
EOF
