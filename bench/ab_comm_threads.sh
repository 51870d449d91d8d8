#!/usr/bin/env bash
# bench/ab_comm_threads.sh — two builds of bench_comm, alternated, on the
# threads backend's rows: each collective's fraction of the copy bound
# (bench_comm.c, run_comm.sh's thr/copy) and the paired time ratio of the
# two builds, at 2 and 4 ranks.  For a change to the threads collectives on
# a loaded machine: both builds see the same load, run by run.
#
#   bench/ab_comm_threads.sh BEFORE_BIN AFTER_BIN [REPS] [OPS] [SECONDS] [MIN] [MAX]
#   (defaults: 3 allgather,reduce_scatter 0.3 1048576 268435456; sizes step ×16)
#
# Each rep runs BEFORE then AFTER (AFTER first in even reps) for 2 and then
# 4 ranks; the figures are medians over reps, the per-rep values beside
# them; the 1-minute load average is printed before each run.  FIELD=us_min
# takes each point's fastest iteration instead of its median round's
# average (small sizes on a loaded machine).  A benchmark, not a test.
set -euo pipefail
BEFORE=${1:?before binary}; AFTER=${2:?after binary}
REPS=${3:-3}; OPS=${4:-allgather,reduce_scatter}; SEC=${5:-0.3}; MIN=${6:-1048576}; MAX=${7:-268435456}
PYTHON=${PYTHON:-python3}
FIELD=${FIELD:-us}
export OMP_NUM_THREADS=1 PX_NUM_THREADS=1
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((rep = 1; rep <= REPS; rep++)); do
  sides=(before after); ((rep % 2)) || sides=(after before)
  for n in 2 4; do
    for side in "${sides[@]}"; do
      bin=$BEFORE; [[ $side == after ]] && bin=$AFTER
      echo "# rep=$rep side=$side ranks=$n load=$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out"
      "$bin" --threads "$n" --ops "$OPS" --min "$MIN" --factor 16 --max "$MAX" --seconds "$SEC" |
        grep "^comm" | grep -v impl=memcpy | sed "s/^/$side /" >>"$out"
    done
  done
done
"$PYTHON" - "$out" "$FIELD" <<'EOF_PY'
import re, sys, statistics as S
rows = {}; loads = []; rep = None
for l in open(sys.argv[1]):
    m = re.match(r"# rep=(\d+) side=(\w+) ranks=(\d+) load=(\S+)", l)
    if m:
        rep = int(m.group(1)); loads.append(float(m.group(4))); continue
    m = re.match(r"(\w+) comm (.*)", l)
    if not m:
        continue
    d = dict(re.findall(r"(\w+)=(\S+)", m.group(2)))
    if d["impl"] == "memcpy":
        continue
    rows.setdefault((d["op"], int(d["bytes"]), int(d["ranks"])), {}).setdefault(m.group(1), {}) \
        .setdefault(rep, {})[d["impl"]] = float(d[sys.argv[2]])
print(f"\nload average (1 min) before the runs: {min(loads):.1f} to {max(loads):.1f}")
print(f"fraction of the copy bound (bound time / collective time, medians; per rep) and t_before / t_after ({sys.argv[2]})")
print(f"{'op':>15} {'n':>2} {'bytes':>8} {'before':>7} {'after':>7} {'tb/ta':>6}   per rep")
for (op, b, n), sides in sorted(rows.items()):
    f = (n + 1) / (2 * n) if op == "reduce_scatter" else 1.0
    fr = {s: [v["copy-bound"] * f / v["px-threads"] for v in sides[s].values() if "copy-bound" in v] for s in sides}
    sp = [sides["before"][k]["px-threads"] / sides["after"][k]["px-threads"]
          for k in sides.get("after", {}) if k in sides.get("before", {})]
    med = lambda v: f"{S.median(v):7.2f}" if v else f"{'-':>7}"
    size = f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
    print(f"{op:>15} {n:>2} {size:>8} {med(fr.get('before', []))} {med(fr.get('after', []))} "
          f"{med(sp)[1:]}   before {[round(x, 2) for x in fr.get('before', [])]} "
          f"after {[round(x, 2) for x in fr.get('after', [])]} tb/ta {[round(x, 2) for x in sp]}")
EOF_PY
