#!/usr/bin/env bash
# bench/gpu/run.sh — GPT-2 124M training on one GPU: plexus beside PyTorch,
# in one run on the same machine.
#
#   bench/gpu/run.sh [OUTDIR]          (scripts/gpu-check runs it; OUTDIR
#                                       default: bench-gpu-out)
#
# The model: GPT-2 small (12 layers, width 768, 12 heads, context 1024,
# vocabulary 50257, head tied to wte, dropout 0; 124,439,808 parameters),
# AdamW (lr 6e-4, betas 0.9/0.95, weight decay 0.1), batch B x 1024 tokens
# read from one synthetic shard of random tokens (bench/gpu/make_tokens.py;
# both sides read the same file).  Rows, each its own process, one after the
# other:
#
#   plexus bf16        plexus train --device cuda --precision bf16 (f32 master
#                      weights and activations, bf16 GEMM operands)
#   PyTorch eager bf16 torch.autocast(bfloat16), F.scaled_dot_product_attention
#   PyTorch compile    the same through torch.compile
#   plexus f32         plexus train --device cuda --precision f32
#   PyTorch eager f32  TF32 off, as plexus's f32 GEMMs
#
# plexus's rate: the step records of its metrics file (--jsonl, one record
# every LOG_EVERY steps) after step WARMUP, from their wall-clock times;
# PyTorch's: WARMUP untimed steps, then STEPS - WARMUP timed ones.  The table
# (bench/gpu/summarize.py) gives tokens/s, ms per step, MFU and plexus /
# PyTorch ratios.  A benchmark, not a test: it reports, it never fails on
# speed; a row that fails or times out is reported as failed, and the others
# still run.
#
# Settings (environment):
#   BUILD_DIR     where plexus was built            (default: build-gpu)
#   PLEXUS        the plexus binary                 (default: $BUILD_DIR/plexus)
#   PYTHON        a Python with torch on CUDA       (default: /opt/torch/.venv/bin/python3, else python3)
#   B             sequences per step                (default: 8)
#   STEPS         steps per run                     (default: 30)
#   WARMUP        steps left out of the rate        (default: 10)
#   LOG_EVERY     plexus's metrics record interval  (default: 5; divides WARMUP and STEPS)
#   ROWS          which rows (default: "plexus-bf16 torch-eager-bf16 torch-compile-bf16 plexus-f32 torch-eager-f32";
#                 torch-compile-f32 is also known)
#   RUN_TIMEOUT   seconds per row before it is stopped (default: 150; torch.compile rows get 2x)
#   DEADLINE      a time (seconds since the epoch) by which the table must be out: each row's
#                 time limit is cut to fit, and rows that no longer fit are reported as skipped
#                 (scripts/gpu-check sets it inside the device's 10 minutes per command)
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OUTDIR=${1:-bench-gpu-out}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build-gpu}
PLEXUS=${PLEXUS:-$BUILD_DIR/plexus}
if [[ -z ${PYTHON:-} ]]; then
  PYTHON=python3
  [[ -x /opt/torch/.venv/bin/python3 ]] && PYTHON=/opt/torch/.venv/bin/python3
fi
B=${B:-8}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-10}
LOG_EVERY=${LOG_EVERY:-5}
ROWS=${ROWS:-"plexus-bf16 torch-eager-bf16 torch-compile-bf16 plexus-f32 torch-eager-f32"}
RUN_TIMEOUT=${RUN_TIMEOUT:-150}
T=1024
HERE=$ROOT/bench/gpu
ROWS_FILE=$OUTDIR/bench-rows.jsonl   # one JSON row per run
LOG=$OUTDIR/bench-runs.log           # everything the runs printed
SCRATCH=$(mktemp -d /tmp/plexus-gpu-bench.XXXXXX)
trap 'rm -rf "$SCRATCH"' EXIT
: >"$ROWS_FILE"
: >"$LOG"

export PYTHONUNBUFFERED=1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
{
  echo "# bench/gpu/run.sh  $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "# commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "# gpu: ${GPU:-none found by nvidia-smi}; $(nproc) cores"
  echo "# B=$B T=$T STEPS=$STEPS WARMUP=$WARMUP ROWS=\"$ROWS\""
  echo "# plexus: $PLEXUS"
  echo "# python: $PYTHON ($("$PYTHON" -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1))"
} | tee -a "$LOG"

# Enough tokens for the longest run (STEPS·B windows of T+1, random offsets),
# with room: plexus's epoch must not end inside the run.
SHARD=$SCRATCH/tokens.bin
"$PYTHON" "$HERE/make_tokens.py" "$SHARD" --tokens $(((STEPS + 8) * B * T * 2 + 4 * T)) >>"$LOG" 2>&1 || {
  echo "bench/gpu/run.sh: could not write the token shard (log: $LOG)" >&2
  exit 1
}

# The seconds row may take: RUN_TIMEOUT (x factor), cut to leave 15 s before
# DEADLINE for the table; 0 when under 20 s would be left.
row_limit() {  # factor
  local t=$((RUN_TIMEOUT * $1))
  if [[ -n ${DEADLINE:-} ]]; then
    local left=$((DEADLINE - $(date +%s) - 15))
    ((left < t)) && t=$left
  fi
  ((t < 20)) && t=0
  echo $t
}

skipped_row() {  # side mode precision
  echo "## $1 $2 $3: skipped, out of time" | tee -a "$LOG"
  printf '{"side": "%s", "mode": "%s", "precision": "%s", "batch": %s, "context": %s, "error": "skipped: out of time"}\n' \
    "$1" "$2" "$3" "$B" "$T" >>"$ROWS_FILE"
}

run_plexus() {  # precision
  local prec=$1 metrics=$SCRATCH/plexus-$1.jsonl rlog=$SCRATCH/plexus-$1.log rc
  local cmd=("$PLEXUS" train --model gpt --n-layer 12 --n-head 12 --n-embd 768 --context "$T" --vocab-size 50257
             --dropout 0 --data tokens --data-path "$SHARD" --batch-size "$B" --steps "$STEPS"
             --optim adamw --lr 6e-4 --beta1 0.9 --beta2 0.95 --weight-decay 0.1 --seed 1
             --log-every "$LOG_EVERY" --progress lines --jsonl "$metrics"
             --device cuda --precision "$prec")
  local t
  t=$(row_limit 1)
  ((t > 0)) || { skipped_row plexus cuda "$prec"; return; }
  echo "## plexus $prec (limit $t s): ${cmd[*]}" | tee -a "$LOG"
  rm -f "$metrics"
  local t0=$SECONDS
  timeout -k 10 "$t" "${cmd[@]}" >"$rlog" 2>&1
  rc=$?
  cat "$rlog" >>"$LOG"
  echo "## plexus $prec: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
  "$PYTHON" "$HERE/summarize.py" plexus "$metrics" --precision "$prec" --batch "$B" --context "$T" \
    --warmup "$WARMUP" --rc $rc --log "$rlog" >>"$ROWS_FILE"
}

run_torch() {  # mode precision
  local mode=$1 prec=$2 rc t line rlog=$SCRATCH/torch-$1-$2.log
  local cmd=("$PYTHON" "$HERE/gpt2_torch.py" --data "$SHARD" --precision "$prec" --batch "$B" --context "$T"
             --warmup "$WARMUP" --steps $((STEPS - WARMUP)))
  if [[ $mode == compile ]]; then
    cmd+=(--compile)
    t=$(row_limit 2)
  else
    t=$(row_limit 1)
  fi
  ((t > 0)) || { skipped_row pytorch "$mode" "$prec"; return; }
  echo "## PyTorch $mode $prec (limit $t s): ${cmd[*]}" | tee -a "$LOG"
  local t0=$SECONDS
  timeout -k 10 "$t" "${cmd[@]}" >"$rlog" 2>&1
  rc=$?
  cat "$rlog" >>"$LOG"
  echo "## PyTorch $mode $prec: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
  line=$(grep '^{' "$rlog" | tail -1)
  if [[ $rc -eq 0 && -n $line ]]; then
    echo "$line" >>"$ROWS_FILE"
  else
    local why
    why=$(grep -v '^\s*$' "$rlog" | tail -1 | cut -c1-300 | sed 's/\\/\\\\/g; s/"/\\"/g')
    printf '{"side": "pytorch", "mode": "%s", "precision": "%s", "batch": %s, "context": %s, "error": "exit %s: %s"}\n' \
      "$mode" "$prec" "$B" "$T" "$rc" "$why" >>"$ROWS_FILE"
  fi
}

for row in $ROWS; do
  case $row in
    plexus-bf16) run_plexus bf16 ;;
    plexus-f32) run_plexus f32 ;;
    torch-eager-bf16) run_torch eager bf16 ;;
    torch-compile-bf16) run_torch compile bf16 ;;
    torch-eager-f32) run_torch eager f32 ;;
    torch-compile-f32) run_torch compile f32 ;;
    *) echo "bench/gpu/run.sh: unknown row $row" >&2 ;;
  esac
done

"$PYTHON" "$HERE/summarize.py" table "$ROWS_FILE" --gpu "$GPU" | tee "$OUTDIR/bench-table.md"
