#!/usr/bin/env bash
# bench/run_comm.sh — px_comm's collectives against raw MPI, PyTorch's gloo
# and memcpy, and data-parallel scaling against PyTorch DDP, on this machine.
#
#   bench/run_comm.sh            (about 8 minutes on 2 cores)
#   bench/run_comm.sh --quick    (about 2 minutes: up to 16 MiB, shorter runs, fewer cases)
#   bench/run_comm.sh --table F  (only the tables, from F: the saved output of a run)
#   bench/run_comm.sh --best ... (collective tables from each point's fastest
#                                iteration, not its average: on a loaded machine)
#
# Part 1, collectives (bench_comm, bench_comm_torch.py): for allreduce,
# allgather, reduce_scatter, broadcast and send/recv (ping-pong), from 4 KiB
# to 256 MiB by powers of 4: px_comm's threads backend (2 threads), px_comm's
# MPI backend (mpiexec -n 2) and raw MPI in the same processes right after
# it on the same buffers, torch.distributed over gloo (2 processes), and
# memcpy of the same sizes in the same run.  bench_comm times each point in
# 5 rounds, px_comm and its reference alternating (raw MPI; under threads
# the copy bound), and reports the median round: on a shared machine a
# load that comes and goes then hits both sides alike.  One table per collective:
# latency (µs) and busbw (GB/s, nccl-tests' conventions: allreduce
# 2(n−1)/n, allgather and reduce_scatter (n−1)/n, broadcast and send/recv 1;
# sizes as bench_comm.c's header says), then px-mpi/raw and px-mpi/gloo as
# ratios of busbw, px-mpi − raw in µs, and thr/copy: the threads backend's
# fraction of the copy bound (threads.c): the time of its 2 threads each
# memcpy-ing the size at once (× 3/4 for reduce_scatter), timed in the same
# rounds beside the collective, over the collective's time (1: at the bound).
#
# Part 2, data-parallel scaling (bench_train, bench_train_torch.py): for each
# model of bench/run.sh, samples/s of 1 rank × 1 thread and of 2 ranks × 1
# thread at the same per-rank batch (MPI, the threads backend, PyTorch DDP
# over gloo); efficiency = samples/s of 2 / (2 × samples/s of 1).  Also two
# 1-rank runs at once (no communication, but the two ranks' contention for
# the memory, caches and cores): their efficiency is the ceiling of any
# communication on this machine.  For MPI also the same 2 ranks with DDP's
# overlap off (one all-reduce after backward), from which the share of
# communication hidden behind backward:
#   step times t0 (two 1-rank runs at once), t2 (2 ranks), t_off (2 ranks,
#   no overlap); comm = t2 − t0, comm off = t_off − t0 (ms a step);
#   hidden = 1 − (t2 − t0) / (t_off − t0)   (1: all hidden, 0: none).
# Each case runs ROUNDS times (medians), the sides alternating.
#
# This is a benchmark, not a test: it reports, it never fails on speed.
#
# Settings (environment):
#   BUILD_DIR   build folder                        (default: <repo>/build)
#   PYTHON      Python that has torch               (default: /usr/bin/python3)
#   MPIEXEC     launcher                            (default: mpiexec)
#   MAX_BYTES   largest size                        (default 268435456; --quick 16777216)
#   SECONDS_PER_SIZE  timed budget of one (op, size, side)  (default 0.2; --quick 0.05)
#   CASES       scaling cases, model:batch          (default: bench/run.sh's; --quick "mlp:16 zoo_cnn:64")
#   SECONDS_PER_RUN  timed seconds of a scaling run (default 2; --quick 1)
#   ROUNDS      scaling rounds                      (default 2; --quick 1)
#   PARTS       "comm scaling" or one of them       (default both)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
QUICK=0
TABLE_FROM=
FIELD=us
while (($#)); do
  case $1 in
    --quick) QUICK=1 ;;
    --best) FIELD=us_min ;;
    --table) TABLE_FROM=${2:?--table needs a file}; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/!p}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "bench/run_comm.sh: unknown option $1 (--quick, --best, --table FILE, --help)" >&2; exit 2 ;;
  esac
  shift
done
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
MPIEXEC=${MPIEXEC:-mpiexec}
if ((QUICK)); then
  MAX_BYTES=${MAX_BYTES:-16777216}
  SECONDS_PER_SIZE=${SECONDS_PER_SIZE:-0.05}
  CASES=${CASES:-"mlp:16 zoo_cnn:64"}
  SECONDS_PER_RUN=${SECONDS_PER_RUN:-1}
  ROUNDS=${ROUNDS:-1}
else
  MAX_BYTES=${MAX_BYTES:-268435456}
  SECONDS_PER_SIZE=${SECONDS_PER_SIZE:-0.2}
  CASES=${CASES:-"mlp:16 mlp:1024 cnn:64 zoo_cnn:64 resnet_small:64"}
  SECONDS_PER_RUN=${SECONDS_PER_RUN:-2}
  ROUNDS=${ROUNDS:-2}
fi
PARTS=${PARTS:-"comm scaling"}
# Before OMP_NUM_THREADS is set below: GNU nproc honours it.
CORES=$(nproc)
# As root, Open MPI wants these; --oversubscribe where ranks outnumber cores.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 PX_NUM_THREADS=1

# ---- Tables ----------------------------------------------------------------------
tables() {  # the saved output of a run
"$PYTHON" - "$1" "$FIELD" <<'EOF_PY'
import re, statistics, sys
lines = open(sys.argv[1]).read().splitlines()
field = sys.argv[2]  # us (average) or us_min (fastest iteration)
kv = lambda s: dict(re.findall(r"(\w+)=(\S+)", s))
comm = {}
n_thr = 2  # ranks of the threads run (its copy-bound lines say)
for l in lines:
    if l.startswith("comm ") and "unsupported" not in l:
        d = kv(l)
        us = float(d.get(field, d["us"]))
        # busbw scales with the time chosen
        comm[(d["impl"], d["op"], int(d["bytes"]))] = (us, float(d["busbw"]) * float(d["us"]) / us)
        if d["impl"] == "copy-bound":
            n_thr = int(d["ranks"])
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
for op in ["allreduce", "allgather", "reduce_scatter", "broadcast", "sendrecv"]:
    sizes = sorted({b for (i, o, b) in comm if o == op})
    if not sizes:
        continue
    print(f"\n{op}: latency µs / busbw GB/s" + (" (fastest iteration of each point)" if field == "us_min" else ""))
    print(f"{'bytes':>8} {'px-threads':>17} {'px-mpi':>17} {'raw-mpi':>17} {'gloo':>17} {'memcpy':>7} "
          f"{'px/raw':>7} {'px-raw µs':>9} {'px/gloo':>8} {'thr/copy':>8}")
    for b in sizes:
        cell = lambda impl: comm.get((impl, op, b))
        fmt = lambda v: f"{v[0]:9.1f} {v[1]:7.3f}" if v else f"{'-':>9} {'-':>7}"
        mem = comm.get(("memcpy", "memcpy", b))
        px, raw, gl = cell("px-mpi"), cell("raw-mpi"), cell("gloo")
        ratio = f"{px[1] / raw[1]:7.2f}" if px and raw and raw[1] > 0 else f"{'-':>7}"
        diff = f"{px[0] - raw[0]:9.1f}" if px and raw else f"{'-':>9}"
        rg = f"{px[1] / gl[1]:8.2f}" if px and gl and gl[1] > 0 else f"{'-':>8}"
        memcell = f"{mem[1]:7.2f}" if mem else f"{'-':>7}"
        # timed beside this collective in the same rounds (older runs: one per size)
        cb = comm.get(("copy-bound", op, b)) or comm.get(("copy-bound", "memcpy", b))
        thr = cell("px-threads")
        # the threads backend against the copy bound (threads.c): all ranks memcpy at once
        f = (n_thr + 1) / (2 * n_thr) if op == "reduce_scatter" else 1.0
        frac = f"{cb[0] * f / thr[0]:8.2f}" if cb and thr and op != "sendrecv" else f"{'-':>8}"
        print(f"{size(b):>8} {fmt(thr)} {fmt(px)} {fmt(raw)} {fmt(gl)} {memcell} {ratio} {diff} {rg} {frac}")

runs = {}
for l in lines:
    # The scaling runs' own lines, as printed: the side is in the line.
    m = re.match(r"\s+(plexus|torch) (\w+) batch=(\d+) ", l)
    if not m:
        continue
    d = kv(l)
    side = {"mpi": "pxmpi" if d.get("overlap") == "on" else "pxmpioff", "threads": "pxthreads",
            "gloo": "torch2"}.get(d.get("backend"), "px1" if m.group(1) == "plexus" else "torch1")
    if d.get("pair") == "1":
        side = "px1x2"  # one of two 1-rank runs at once: samples/s of that rank
    runs.setdefault((f"{m.group(2)}:{m.group(3)}", side), []).append(float(d["samples_per_s"]))
cases = []
for (c, s) in runs:
    if c not in cases:
        cases.append(c)
if cases:
    print("\nDDP scaling, samples/s (medians), 2 ranks x 1 thread against 1 x 1 at the same per-rank batch;")
    print("efficiency = samples/s of 2 / (2 x samples/s of 1); '1||1': two 1-rank runs at once, no communication")
    print("(their efficiency: the ceiling on this machine); hidden = share of MPI communication hidden behind backward")
    print(f"{'case':>18} {'px 1':>9} {'px 1||1':>9} {'eff':>5} {'px mpi 2':>9} {'eff':>5} {'mpi off':>9} {'hidden':>7} "
          f"{'px thr 2':>9} {'eff':>5} {'torch 1':>9} {'torch 2':>9} {'eff':>5}")
    med = lambda c, s: statistics.median(runs[(c, s)]) if (c, s) in runs else float("nan")
    steps = []
    for c in cases:
        p1, p0, pm, po, pt = med(c, "px1"), med(c, "px1x2"), med(c, "pxmpi"), med(c, "pxmpioff"), med(c, "pxthreads")
        t1, t2 = med(c, "torch1"), med(c, "torch2")
        b = int(c.split(":")[1])
        # step times of one rank: per-rank batch / per-rank samples/s
        s1, s0, s2, so, st = b / p1, b / p0, 2 * b / pm, 2 * b / po, 2 * b / pt
        hidden = 1 - (s2 - s0) / (so - s0) if so - s0 > 0 else float("nan")
        steps.append((c, s1, s0, s2, so, st, hidden))
        print(f"{c:>18} {p1:9.0f} {p0:9.0f} {p0 / p1:5.2f} {pm:9.0f} {pm / (2 * p1):5.2f} {po:9.0f} {hidden:7.2f} "
              f"{pt:9.0f} {pt / (2 * p1):5.2f} {t1:9.0f} {t2:9.0f} {t2 / (2 * t1):5.2f}")
    print("\nDDP step time of one rank, ms: alone, two at once without communication, MPI with overlap, MPI overlap off,")
    print("threads; comm = step - no-comm step (ms); hidden = 1 - comm(overlap) / comm(off)")
    print(f"{'case':>18} {'alone':>8} {'no comm':>8} {'mpi':>8} {'mpi off':>8} {'threads':>8} {'comm':>7} {'comm off':>8} "
          f"{'thr comm':>8} {'hidden':>7}")
    for c, s1, s0, s2, so, st, hidden in steps:
        print(f"{c:>18} {1e3 * s1:8.3f} {1e3 * s0:8.3f} {1e3 * s2:8.3f} {1e3 * so:8.3f} {1e3 * st:8.3f} "
              f"{1e3 * (s2 - s0):7.3f} {1e3 * (so - s0):8.3f} {1e3 * (st - s0):8.3f} {hidden:7.2f}")
EOF_PY
}

if [[ -n $TABLE_FROM ]]; then
  tables "$TABLE_FROM"
  exit 0
fi

# ---- Build -----------------------------------------------------------------
log=$(mktemp)
if ! { [[ -f $BUILD_DIR/CMakeCache.txt ]] ||
       cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release; } >"$log" 2>&1 ||
   ! cmake --build "$BUILD_DIR" --target bench_comm bench_train -j "$CORES" >>"$log" 2>&1; then
  cat "$log" >&2
  echo "bench/run_comm.sh: building bench_comm and bench_train in $BUILD_DIR failed (log above)" >&2
  exit 1
fi
rm -f "$log"
COMM=$BUILD_DIR/bench_comm
TRAIN=$BUILD_DIR/bench_train
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  echo "bench/run_comm.sh: $PYTHON cannot import torch; apt-get install python3-torch, or set PYTHON" >&2
  exit 1
fi
if ! command -v "$MPIEXEC" >/dev/null; then
  echo "bench/run_comm.sh: $MPIEXEC not found (apt-get install openmpi-bin libopenmpi-dev)" >&2
  exit 1
fi

echo "# px_comm vs raw MPI, gloo and memcpy; DDP scaling (bench/run_comm.sh$( ((QUICK)) && echo ' --quick'))"
echo "# date:     $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# commit:   $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" diff --quiet HEAD 2>/dev/null || echo ' (with local changes)')"
echo "# cpu:      $(lscpu | sed -n 's/^Model name: *//p' | head -1), $CORES cores"
echo "# build:    $(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD_DIR/CMakeCache.txt") in $BUILD_DIR"
echo "# mpi:      $("$MPIEXEC" --version 2>/dev/null | head -1)"
echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-<unset>} (left as found); $("$TRAIN" --info)"
echo "# $("$PYTHON" "$ROOT/bench/bench_comm_torch.py" --info)"
echo "# max_bytes=$MAX_BYTES seconds_per_size=$SECONDS_PER_SIZE cases=\"$CASES\" seconds_per_run=$SECONDS_PER_RUN rounds=$ROUNDS"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

out=$(mktemp)
trap 'rm -f "$out"' EXIT

# ---- Part 1: collectives -----------------------------------------------------
if [[ " $PARTS " == *" comm "* ]]; then
  args=(--max "$MAX_BYTES" --seconds "$SECONDS_PER_SIZE")
  echo "# collectives: threads backend"
  timeout 900 "$COMM" --threads 2 "${args[@]}" | grep -v "impl=memcpy" | tee -a "$out"
  echo "# collectives: MPI backend, raw MPI and memcpy"
  timeout 900 "$MPIEXEC" -n 2 "$COMM" "${args[@]}" | tee -a "$out"
  echo "# collectives: gloo"
  timeout 900 "$PYTHON" "$ROOT/bench/bench_comm_torch.py" --max "$MAX_BYTES" --seconds "$SECONDS_PER_SIZE" | tee -a "$out"
fi

# ---- Part 2: scaling -----------------------------------------------------------
if [[ " $PARTS " == *" scaling "* ]]; then
  for ((r = 1; r <= ROUNDS; r++)); do
    echo "# scaling round $r"
    for c in $CASES; do
      model=${c%%:*} batch=${c##*:}
      a=(--model "$model" --batch "$batch" --threads 1 --seconds "$SECONDS_PER_RUN")
      sides=(px1 px1x2 pxmpi pxmpioff pxthreads torch1 torch2)
      ((r % 2)) || sides=(torch2 torch1 pxthreads pxmpioff pxmpi px1x2 px1)
      for side in "${sides[@]}"; do
        if [[ $side == px1x2 ]]; then
          # Two 1-rank runs at once: the step without communication, with
          # the contention of two ranks.
          pa=$(mktemp) pb=$(mktemp)
          timeout 300 "$TRAIN" "${a[@]}" >"$pa" & ja=$!
          timeout 300 "$TRAIN" "${a[@]}" >"$pb" & jb=$!
          if wait "$ja" && wait "$jb"; then
            for f in "$pa" "$pb"; do echo "  $(cat "$f") pair=1" | tee -a "$out"; done
          else
            echo "bench/run_comm.sh: failed or timed out, left out: two ${TRAIN##*/} ${a[*]} at once" >&2
          fi
          rm -f "$pa" "$pb"
          continue
        fi
        case $side in
          px1)       cmd=("$TRAIN" "${a[@]}") ;;
          pxmpi)     cmd=("$MPIEXEC" -n 2 "$TRAIN" "${a[@]}") ;;
          pxmpioff)  cmd=("$MPIEXEC" -n 2 "$TRAIN" "${a[@]}" --overlap off) ;;
          pxthreads) cmd=("$TRAIN" "${a[@]}" --ranks 2) ;;
          torch1)    cmd=("$PYTHON" "$ROOT/bench/bench_train_torch.py" "${a[@]}") ;;
          torch2)    cmd=("$PYTHON" "$ROOT/bench/bench_train_torch.py" "${a[@]}" --ranks 2) ;;
        esac
        # A hung run (a rank stuck in its launcher's teardown) costs 5 minutes, not the table.
        if ! line=$(timeout 300 "${cmd[@]}"); then
          echo "bench/run_comm.sh: failed or timed out, left out: ${cmd[*]}" >&2
          continue
        fi
        echo "  $line" | tee -a "$out"
      done
    done
  done
fi
echo "# load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"

tables "$out"
