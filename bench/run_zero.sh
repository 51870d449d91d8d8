#!/usr/bin/env bash
# bench/run_zero.sh — sharded data parallel (ZeRO) on the benchmark GPT:
# speed of stages 1, 2, 3 against DDP side by side (and PyTorch's DDP and
# ZeroRedundancyOptimizer), and memory per rank against the ZeRO paper's
# formulas.
#
#   bench/run_zero.sh                 both tables
#   TABLES=speed bench/run_zero.sh    one of them (speed | memory)
#
# Speed.  bench_gpt's model (bench/run_gpt.sh: vocabulary 8192, context 128,
# 4 layers, 4 heads, width 256, 5.29 M parameters, AdamW), 2 ranks of 1
# thread, batch 8 each, on the threads backend (MPI=1: under mpirun -n 2
# instead).  Rows: DDP (--zero 0), stages 1 and 2, stage 3 with prefetch
# (the default) and without; PyTorch DDP and PyTorch ZeRO-1
# (ZeroRedundancyOptimizer over gloo, 2 processes).  Each round runs every
# row once, one right after the other, the order rotated per round; the
# table gives the median tokens/s over the rounds, the median of the
# per-round ratios to plexus DDP, and the best single step.  Aims: stages 1
# and 2 >= 0.95x DDP, stage 3 >= 0.85x DDP with prefetch.
#
# Memory.  A GPT of ~63 M parameters (vocabulary 8192, context 64, 8
# layers, 12 heads, width 768), mpirun -n 4 --oversubscribe, 2 AdamW steps
# of batch 1 (so activations are small); per stage: the library's account
# per rank (max over ranks: parameters, gradients, optimizer state, gathered
# units, activation arena) and VmHWM (peak resident memory) minus the
# process's VmHWM before the model was built (max over ranks), against the
# formulas for Adam in f32 with Ψ parameters on N ranks: DDP 16Ψ, stage 1
# 8Ψ + 8Ψ/N, stage 2 4Ψ + 12Ψ/N, stage 3 16Ψ/N.  "acct/formula" compares
# parameters + gradients + optimizer state with the formula; "VmHWM/expect"
# compares VmHWM's growth during the training steps (reset after setup:
# bench_gpt.c says why) with the formula + activations + gathered units;
# "setup" is VmHWM's growth up to the end of setup, where every stage holds
# the whole model once (plexus builds it whole, then shards it).
#
# Settings (environment):
#   BUILD_DIR        build folder                 (default: <repo>/build)
#   PYTHON           Python that has torch        (default: /usr/bin/python3)
#   ROUNDS           speed rounds                 (default: 3)
#   SECONDS_PER_RUN  timed seconds of each run    (default: 5; plus 1 s warm-up)
#   MPI              1: speed rows under mpirun -n 2 (default: threads backend)
#   TORCH            0: no PyTorch rows           (default 1)
#   MEM_RANKS        ranks of the memory table    (default 4)
#   MEM_ARGS         bench_gpt model options of the memory table
#   MEM_BACKENDS     memory tables: "mpi threads" (default); threads ranks share a process, so
#                    its VmHWM is divided by the ranks (no MPI library buffers in it)
#   BENCH            a bench_gpt binary to use instead of building one
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
MPI=${MPI:-0}
TORCH=${TORCH:-1}
TABLES=${TABLES:-"speed memory"}
MEM_RANKS=${MEM_RANKS:-4}
MEM_ARGS=${MEM_ARGS:-"--vocab 8192 --context 64 --layers 8 --heads 12 --embd 768 --batch 1"}
MEM_BACKENDS=${MEM_BACKENDS:-"mpi threads"}

if [[ -z ${BENCH:-} ]]; then
  log=$(mktemp)
  if ! { [[ -f $BUILD_DIR/CMakeCache.txt ]] ||
         cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release; } >"$log" 2>&1 ||
     ! cmake --build "$BUILD_DIR" --target bench_gpt -j "$(nproc)" >>"$log" 2>&1; then
    cat "$log" >&2
    rm -f "$log"
    echo "bench/run_zero.sh: building bench_gpt in $BUILD_DIR failed (log above)" >&2
    exit 1
  fi
  rm -f "$log"
  BENCH=$BUILD_DIR/bench_gpt
fi
TORCH_BENCH=$ROOT/bench/bench_gpt_torch.py
MPIRUN=$(command -v mpirun || command -v mpiexec || true)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
if [[ $TORCH == 1 ]] && ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "bench/run_zero.sh: $PYTHON cannot import torch (TORCH=0 to skip its rows)" >&2
  exit 1
fi

echo "# plexus ZeRO: speed and memory (bench/run_zero.sh)"
echo "# date:     $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# commit:   $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
echo "# cpu:      $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $(free -g | awk '/^Mem:/ {print $2}') GiB"
echo "# $("$BENCH" --info)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

field() { sed -n "s/.* $1=\([0-9.e+-]*\).*/\1/p"; }

# ---- speed -------------------------------------------------------------------
speed() {
  local rows=("ddp:0" "zero1:1" "zero2:2" "zero3:3" "zero3-noprefetch:3 --no-prefetch")
  [[ $TORCH == 1 ]] && rows+=("torch-ddp:T0" "torch-zero1:T1")
  declare -A tps best
  echo "# speed: rounds=$ROUNDS seconds_per_run=$SECONDS_PER_RUN $([[ $MPI == 1 ]] && echo "mpirun -n 2" || echo "threads backend, 2 ranks") x 1 thread, batch 8 per rank"
  for ((k = 1; k <= ROUNDS; k++)); do
    echo "# round $k"
    local n=${#rows[@]}
    for ((j = 0; j < n; j++)); do
      local row=${rows[$(((j + k - 1) % n))]}
      local name=${row%%:*} spec=${row#*:} cmd line
      if [[ $spec == T* ]]; then
        cmd=("$PYTHON" "$TORCH_BENCH" --threads 1 --ranks 2 --seconds "$SECONDS_PER_RUN" --zero "${spec#T}")
      elif [[ $MPI == 1 ]]; then
        cmd=("$MPIRUN" -n 2 --oversubscribe "$BENCH" --threads 1 --seconds "$SECONDS_PER_RUN" --zero $spec)
      else
        cmd=("$BENCH" --threads 1 --ranks 2 --seconds "$SECONDS_PER_RUN" --zero $spec)
      fi
      if ! line=$(timeout $((SECONDS_PER_RUN * 20 + 120)) "${cmd[@]}" | grep ' gpt '); then
        # PyTorch's DDP over gloo has been seen to hang here: its row
        # misses a round; a plexus run that fails ends the script.
        echo "bench/run_zero.sh: failed or timed out: ${cmd[*]}" >&2
        [[ $spec == T* ]] && continue
        exit 1
      fi
      echo "  $name: $line"
      tps[$name]+="$(field tokens_per_s <<<"$line") "
      best[$name]+="$(field best_tokens_per_s <<<"$line") "
    done
  done
  echo "# load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
  printf '%-18s %12s %9s %12s %9s  %s\n' row "tokens/s" "vs DDP" "best step" "vs DDP" aim
  for row in "${rows[@]}"; do
    local name=${row%%:*}
    if [[ -z ${tps[$name]:-} ]]; then printf '%-18s %12s\n' "$name" "(no run finished)"; continue; fi
    "$PYTHON" - "$name" "${tps[$name]}" "${tps[ddp]}" "${best[$name]}" "${best[ddp]}" <<'EOF'
import statistics, sys
name, p, d, bp, bd = sys.argv[1:]
num = lambda s: [float(v) for v in s.split()]
p, d, bp, bd = num(p), num(d), num(bp), num(bd)
# Per-round ratios (a row that missed a round pairs with the first rounds).
ratio = statistics.median(a / b for a, b in zip(p, d))
aim = {"zero1": 0.95, "zero2": 0.95, "zero3": 0.85}.get(name)
verdict = "" if aim is None else ("aim %.2fx met" % aim if ratio >= aim else "aim %.2fx MISSED" % aim)
print("%-18s %12.0f %8.2fx %12.0f %8.2fx  %s" % (name, statistics.median(p), ratio, max(bp), max(bp) / max(bd),
                                                verdict))
EOF
  done
}

# ---- memory ------------------------------------------------------------------
memory() {
  for backend in $MEM_BACKENDS; do memory_table "$backend"; done
}

memory_table() {  # mpi | threads
  local backend=$1 div=1
  if [[ $backend == mpi && -z $MPIRUN ]]; then
    echo "bench/run_zero.sh: the mpi memory table needs mpirun (MEM_BACKENDS=threads for the other)" >&2
    exit 1
  fi
  echo
  if [[ $backend == mpi ]]; then
    echo "# memory: mpirun -n $MEM_RANKS --oversubscribe bench_gpt --memory 2 $MEM_ARGS --zero S"
  else
    # The ranks are threads of one process: its VmHWM counts all of them.
    div=$MEM_RANKS
    echo "# memory: bench_gpt --ranks $MEM_RANKS --memory 2 $MEM_ARGS --zero S (threads backend: VmHWM / $MEM_RANKS)"
  fi
  local lines=()
  for s in 0 1 2 3 "3 --no-prefetch"; do
    local line cmd=("$BENCH" --threads 1 --memory 2 $MEM_ARGS --zero $s)
    if [[ $backend == mpi ]]; then cmd=("$MPIRUN" -n "$MEM_RANKS" --oversubscribe "${cmd[@]}")
    else cmd+=(--ranks "$MEM_RANKS"); fi
    if ! line=$(PX_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout 900 "${cmd[@]}" | grep '^plexus memory'); then
      echo "bench/run_zero.sh: the $backend memory run of stage $s failed" >&2
      exit 1
    fi
    echo "  $line"
    lines+=("$line")
  done
  echo
  printf '%-6s %9s %9s %9s %9s %9s %9s %9s %8s %9s %9s %8s %9s %9s %8s\n' stage params grads optim gathered \
    arena "acct" "formula" "acct/f" "VmHWM+" "expect" "VmHWM/e" "setup" "issue" "all/i"
  for line in "${lines[@]}"; do
    "$PYTHON" - "$line" "$div" "$MEM_ARGS" <<'EOF'
import sys
f = dict(kv.split("=") for kv in sys.argv[1].split()[2:])
div = int(sys.argv[2])
margs = sys.argv[3].split()
C = int(margs[margs.index("--embd") + 1]) if "--embd" in margs else 768
unit = 4 * (12 * C * C + 13 * C)  # one GPT block's parameters in bytes (stage 3's units)
s, N, P = int(f["zero"]), int(f["ranks"]), int(f["params"])
formula = {0: 16 * P, 1: 8 * P + 8 * P / N, 2: 4 * P + 12 * P / N, 3: 16 * P / N}[s]
acct = int(f["acct_params"]) + int(f["acct_grads"]) + int(f["acct_optim"])
extra = int(f["acct_gathered"]) + int(f["acct_arena"])
hwm, setup = int(f["vmhwm_train_delta"]) / div, int(f["vmhwm_setup_delta"]) / div
M = 1024.0 * 1024.0
# The issue's stage-3 bound: 16Ψ/N + one unit's parameters and gradients
# (+ the prefetched unit's parameters when prefetching); "all" = acct +
# gathered, what the library holds besides activations.
prefetch = f.get("prefetch", "1") == "1"
issue = formula + 2 * unit + (unit if prefetch else 0) if s == 3 else formula
allb = acct + int(f["acct_gathered"])
name = "ddp" if s == 0 else str(s) + ("" if s != 3 or prefetch else "-nopf")
print("%-6s %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %9.1f %7.3fx %9.1f %9.1f %7.3fx %9.1f %9.1f %7.3fx" % (
    name, int(f["acct_params"]) / M, int(f["acct_grads"]) / M, int(f["acct_optim"]) / M,
    int(f["acct_gathered"]) / M, int(f["acct_arena"]) / M, acct / M, formula / M, acct / formula, hwm / M,
    (formula + extra) / M, hwm / (formula + extra), setup / M, issue / M, allb / issue))
EOF
  done
  echo "(MiB per rank, max over ranks; Ψ = $(field params <<<"${lines[0]}") parameters; acct = params + grads + optim;"
  echo " VmHWM+ = peak resident memory during the 2 steps (VmHWM reset after setup) minus VmHWM before the model was"
  echo " built; expect = formula + gathered + arena; setup = VmHWM at the end of setup minus the same baseline;"
  echo " issue = stage 3's bound, formula + one block's parameters and gradients + the prefetched block's parameters"
  echo " (none without prefetch: 3-nopf); all/i = (acct + gathered) / issue)"
}

for t in $TABLES; do "$t"; done
