#!/usr/bin/env bash
# bench/run_rig.sh — how much of DDP's communication the overlap hides, over
# a real (if emulated) network: 2 "hosts" made by tests/rig/netns_hosts.sh
# (network namespaces, veth links into a bridge, shaped with tc), one rank
# per host, Open MPI over TCP only (no shared memory between the hosts).
#
#   bench/run_rig.sh            (as root, from anywhere)
#
# For each link speed (RATES) and each model -- the benchmark CNN
# (bench_train --model zoo_cnn, the zoo's CNN of `plexus train --model cnn`)
# and the benchmark GPT (bench_gpt, its defaults) -- the step time with
#   on    DDP's overlap: buckets all-reduced during backward (the default)
#   off   one all-reduce of the whole gradient after backward (nothing hidden)
#   none  no communication at all (no DDP: the same computation; the floor)
# and the share of the communication hidden behind backward:
#   hidden = 1 - (t_on - t_none) / (t_off - t_none)      (1: all, 0: none)
# Each case runs ROUNDS times, the three modes alternating within a round
# (medians reported), so that other work on the machine weighs on all alike.
# Prints the raw lines, then a Markdown table (docs/PERFORMANCE.md): the
# medians, the highest load average seen and "cpu", the lowest share of a
# core rank 0's process got in a run (cpu_s / (threads x seconds)); well
# under 100% means other work took the cores and the row is not clean.
#
# This is a benchmark, not a test: it reports, it never fails on speed.
#
# Settings (environment):
#   BUILD_DIR        build folder                    (default: <repo>/build)
#   RATES            link speeds                     (default: "1gbit 10gbit")
#   DELAY            one-way delay per link end (netem; ignored with tbf) (default 0.1ms)
#   ROUNDS           runs of each case and mode      (default: 3)
#   SECONDS_PER_RUN  timed seconds of each run       (default: 3)
#   THREADS          compute threads per rank        (default: 1)
#   CNN_BATCH        bench_train --batch per rank    (default: 64)
#   GPT_BATCH        bench_gpt --batch per rank      (default: 8)
#   MODELS           "cnn gpt" or one of them        (default: both)
#   BUCKETS          DDP bucket capacities in MiB for "on", one row each
#                    (default: "25", the library's default; e.g. "1 5 25")
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
RATES=${RATES:-"1gbit 10gbit"}
DELAY=${DELAY:-0.1ms}
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-3}
THREADS=${THREADS:-1}
CNN_BATCH=${CNN_BATCH:-64}
GPT_BATCH=${GPT_BATCH:-8}
MODELS=${MODELS:-"cnn gpt"}
BUCKETS=${BUCKETS:-25}
RIG=$ROOT/tests/rig/netns_hosts.sh

bash "$RIG" check  # prints why and exits 77 if this machine cannot make the rig
if ! { [[ -f $BUILD_DIR/CMakeCache.txt ]] || cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null; } ||
   ! cmake --build "$BUILD_DIR" --target bench_train bench_gpt -j "$(nproc)" >/dev/null; then
  echo "bench/run_rig.sh: building bench_train and bench_gpt in $BUILD_DIR failed" >&2
  exit 1
fi

exec 9>/tmp/plexus-rig.lock
flock 9  # one rig at a time owns 10.77.0.0/24
work=$(mktemp -d /tmp/px_run_rig.XXXXXX)
trap 'bash "$RIG" down "$work/rig"; rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
bash "$RIG" up "$work/rig" 2 none 0ms

echo "# bench/run_rig.sh $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PX_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
export PX_RIG_MAP=$work/rig/map
# --bind-to none: each "host" is a node to Open MPI, whose daemon there binds
# its one rank to core 0 by default; on one machine both ranks then share
# core 0 (each got 50% of it, the other core idle).  Real hosts have cores
# of their own; unbound, each rank gets one here.
mpi=(mpiexec -n 2 --bind-to none --hostfile "$work/rig/hostfile" --mca plm_rsh_agent "$ROOT/tests/rig/netns-exec.sh"
     --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24)

raw=$work/raw
: >"$raw"
for rate in $RATES; do
  shaped=$(bash "$RIG" shape "$work/rig" "$rate" "$DELAY" 2>&1)
  echo "# $shaped"
  for model in $MODELS; do
    for ((round = 0; round < ROUNDS; round++)); do
      modes=(off none)
      for b in $BUCKETS; do modes=("on:$b" "${modes[@]}"); done
      for m in "${modes[@]}"; do
        mode=${m%%:*}
        bucket=25
        [[ $m == *:* ]] && bucket=${m#*:}
        if [[ $model == cnn ]]; then
          cmd=("$BUILD_DIR/bench_train" --model zoo_cnn --batch "$CNN_BATCH" --threads "$THREADS"
               --seconds "$SECONDS_PER_RUN" --warmup 1 --overlap "$mode" --bucket-mb "$bucket")
        else
          cmd=("$BUILD_DIR/bench_gpt" --batch "$GPT_BATCH" --threads "$THREADS"
               --seconds "$SECONDS_PER_RUN" --warmup 1 --overlap "$mode" --bucket-mb "$bucket")
        fi
        line=$("${mpi[@]}" "${cmd[@]}" | grep '^plexus ')
        echo "$line"
        echo "rate=$rate model=$model mode=$m load=$(cut -d' ' -f1 /proc/loadavg) $line" >>"$raw"
      done
    done
  done
done

/usr/bin/env python3 - "$raw" <<'PY'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kv = dict(re.findall(r"(\w+)=(\S+)", line.split(" plexus ")[0]))
    kv.update({k: v for k, v in re.findall(r"(\w+)=(\S+)", line.split(" plexus ")[1]) if k not in kv})
    step_ms = 1e3 * float(kv["seconds"]) / float(kv["steps"])
    cpu = float(kv["cpu_s"]) / (float(kv["threads"]) * float(kv["seconds"]))
    rows.setdefault((kv["rate"], kv["model"]), {}).setdefault(kv["mode"], []).append((step_ms, float(kv["load"]), cpu))
print()
print("| link | model | bucket (MiB) | step, no comm (ms) | step, overlap off (ms) | step, overlap on (ms) | comm (off − none, ms) | hidden | load | cpu |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for (rate, model), modes in rows.items():
    med = {m: statistics.median(t for t, _, _ in v) for m, v in modes.items()}
    load = max(l for v in modes.values() for _, l, _ in v)
    cpu = min(c for v in modes.values() for _, _, c in v)
    comm = med["off"] - med["none"]
    name = "CNN" if model == "cnn" else "GPT"
    for m in sorted((m for m in med if m.startswith("on:")), key=lambda m: float(m[3:])):
        hidden = 1 - (med[m] - med["none"]) / comm if comm > 0 else float("nan")
        print("| %s | %s | %s | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.1f | %.0f%% |" %
              (rate, name, m[3:], med["none"], med["off"], med[m], comm, 100 * hidden, load, 100 * cpu))
PY
