#!/usr/bin/env bash
# bench/run_checkpoint.sh — save and load throughput of a sharded (ZeRO-3)
# checkpoint at 1, 2 and 4 ranks against dd on the same disk, in the same run.
#
#   bench/run_checkpoint.sh                 the table (docs/PERFORMANCE.md, "Checkpoints")
#
# plexus: bench_checkpoint_sharded (bench/bench_checkpoint_sharded.c): a
# model of PARAMS F32 parameters (default 52,428,800: 200 MiB) in 24
# tensors, with Adam's exp_avg and exp_avg_sq: a checkpoint of 600 MiB
# (629 MB).  Each rank writes its slice of the three as pieces
# (model.rank*, optim.rank*) with px_checkpoint_write_all (SHA-256 while
# writing, fsync of every file, SHA256SUMS, rename), then loads its slice
# back with px_checkpoint_load_boxes, first with the files dropped from the
# page cache ("cold": from the disk), then again ("warm": from the cache).
# The timed save ends at the commit (keep_last 0); removing the checkpoint
# afterwards, as rotation would, is timed apart and printed on stderr
# ("NOTE removing a checkpoint"), as dd's rm is left out of dd's time.
# Before 2026-11-25 the timed save included deleting the previous repeat's
# checkpoint (keep_last 1) in repeats 2 and 3.
#
# dd, for each rank count N: N dd processes at once, each writing 1/N of the
# checkpoint's bytes to its own file with conv=fsync (the data on the disk
# when dd ends, as a checkpoint's are; bs=1M from /dev/zero), then reading
# them back with of=/dev/null, cold (each file dropped from the page cache
# with iflag=nocache count=0 first) and warm, then dropped again and read
# after SETTLE seconds ("settled": see below).  The same bytes, the same
# directory, right before plexus's runs of the same N.
#
# Why two cold reads: this machine is a virtual machine whose kernel hands
# free memory back to the host (free page reporting, page_reporting_order=11
# on its command line).  About 2 s after the drop, the page cache just freed
# is reported, and the first touch of reported memory is slow while the host
# maps it again.  A read right after the drop gets recycled pages and runs at
# the host cache's speed (dd 3.0-3.5 GB/s); a read SETTLE s later gets
# reported pages (dd 0.8-1.2 GB/s), and one in between gets either.  Both
# sides wait the same before each, so each ratio compares like with like.
#
# Figures: medians over REPEATS; "per rank" = bytes / N / time, "aggregate"
# = bytes / time, time = until the last rank (or dd) is done; ratio =
# plexus aggregate / dd aggregate (aim: >= 0.7).  "CPU s per GB": user +
# system seconds per GB of checkpoint, plexus's (every rank: threads
# backend only) and dd's: on a machine shared with other work the wall
# times follow the CPU share each side gets, the CPU cost does not.  On
# stderr: what a load reads per rank, and (N = 1) where a warm load's time
# goes (read(2), SHA-256, px_checkpoint_read_file, one thread).
#
# Settings (environment):
#   BUILD_DIR   build folder                           (default: <repo>/build)
#   DIR         where files go: a disk, not tmpfs      (default: /var/tmp)
#   PARAMS      parameters                             (default: 52428800)
#   REPEATS     repeats of each measurement            (default: 3)
#   RANKS       rank counts                            (default: "1 2 4")
#   MPI         1: plexus under mpirun -n N --oversubscribe (default: threads backend)
#   SETTLE      seconds from the drop to the settled cold read (default: 3; 0: leave it out)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
DIR=${DIR:-/var/tmp}
PARAMS=${PARAMS:-52428800}
REPEATS=${REPEATS:-3}
RANKS=${RANKS:-"1 2 4"}
MPI=${MPI:-0}
SETTLE=${SETTLE:-3}
BIN=$BUILD_DIR/bench_checkpoint_sharded
[ -x "$BIN" ] || { echo "run_checkpoint: build $BIN first (cmake --build $BUILD_DIR --target bench_checkpoint_sharded)" >&2; exit 1; }
BYTES=$((3 * PARAMS * 4))
WORK=$DIR/px_bench_dd_$$
mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT

now() { date +%s.%N; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

# dd_round N: one write, cold read, warm read and settled cold read of N
# files of BYTES/N; prints for each the wall seconds and the CPU seconds
# (user + system) of the dd processes.
dd_round() {
  local n=$1 count=$((BYTES / n / 1048576)) i
  local TIMEFORMAT='%R %U %S'
  rm -f "$WORK"/dd.*
  { time { for i in $(seq 1 "$n"); do dd if=/dev/zero of="$WORK/dd.$i" bs=1M count="$count" conv=fsync status=none & done; wait; }; } 2>&1
  for i in $(seq 1 "$n"); do dd if="$WORK/dd.$i" iflag=nocache count=0 status=none; done
  { time { for i in $(seq 1 "$n"); do dd if="$WORK/dd.$i" of=/dev/null bs=1M status=none & done; wait; }; } 2>&1
  { time { for i in $(seq 1 "$n"); do dd if="$WORK/dd.$i" of=/dev/null bs=1M status=none & done; wait; }; } 2>&1
  if [ "$SETTLE" != 0 ]; then
    for i in $(seq 1 "$n"); do dd if="$WORK/dd.$i" iflag=nocache count=0 status=none; done
    sleep "$SETTLE"
    { time { for i in $(seq 1 "$n"); do dd if="$WORK/dd.$i" of=/dev/null bs=1M status=none & done; wait; }; } 2>&1
  fi
  rm -f "$WORK"/dd.*
}

echo "checkpoint of $PARAMS parameters + Adam state: $BYTES bytes ($(echo "$BYTES / 1048576" | bc) MiB) in $DIR" \
     "($(df -T "$DIR" | awk 'NR == 2 {print $1 ", " $2}')); $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "plexus: $([ "$MPI" = 1 ] && echo "mpirun -n N" || echo "threads backend, N ranks in one process"); dd: N processes, conv=fsync; medians of $REPEATS; settled cold reads $SETTLE s after the drop"
printf '\n| ranks | op | plexus MB/s per rank | plexus MB/s aggregate | dd MB/s aggregate | plexus / dd | CPU s per GB: plexus, dd |\n'
printf '|---:|---|---:|---:|---:|---:|---:|\n'
for n in $RANKS; do
  w=() c=() h=() z=() wc=() cc=() hc=() zc=()
  for _ in $(seq 1 "$REPEATS"); do
    mapfile -t r < <(dd_round "$n")
    read -r t u s <<<"${r[0]}"; w+=("$t"); wc+=("$(echo "$u + $s" | bc -l)")
    read -r t u s <<<"${r[1]}"; c+=("$t"); cc+=("$(echo "$u + $s" | bc -l)")
    read -r t u s <<<"${r[2]}"; h+=("$t"); hc+=("$(echo "$u + $s" | bc -l)")
    if [ "$SETTLE" != 0 ]; then read -r t u s <<<"${r[3]}"; z+=("$t"); zc+=("$(echo "$u + $s" | bc -l)"); fi
  done
  if [ "$MPI" = 1 ]; then
    out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -n "$n" --oversubscribe \
          "$BIN" --dir "$DIR" --params "$PARAMS" --repeats "$REPEATS" --settle "$SETTLE")
  else
    out=$("$BIN" --ranks "$n" --dir "$DIR" --params "$PARAMS" --repeats "$REPEATS" --settle "$SETTLE")
  fi
  for op in save load_cold load_warm $([ "$SETTLE" != 0 ] && echo load_settled); do
    line=$(grep "^RESULT op=$op " <<<"$out")
    t=$(sed 's/.* median_s=\([0-9.]*\).*/\1/' <<<"$line")
    cpu=$(sed 's/.* cpu_s=\([0-9.]*\).*/\1/' <<<"$line")
    case $op in
      save) d=$(printf '%s\n' "${w[@]}" | median); dc=$(printf '%s\n' "${wc[@]}" | median) ;;
      load_cold) d=$(printf '%s\n' "${c[@]}" | median); dc=$(printf '%s\n' "${cc[@]}" | median) ;;
      load_warm) d=$(printf '%s\n' "${h[@]}" | median); dc=$(printf '%s\n' "${hc[@]}" | median) ;;
      load_settled) d=$(printf '%s\n' "${z[@]}" | median); dc=$(printf '%s\n' "${zc[@]}" | median) ;;
    esac
    awk -v n="$n" -v op="$op" -v t="$t" -v d="$d" -v b="$BYTES" -v cpu="$cpu" -v dc="$dc" -v mpi="$MPI" 'BEGIN {
      printf "| %d | %s | %.0f | %.0f | %.0f | %.2f | %s, %.2f |\n", n, op, b / t / n / 1e6, b / t / 1e6, b / d / 1e6,
             d / t, mpi == 1 ? "-" : sprintf("%.2f", cpu / b * 1e9), dc / b * 1e9 }'
  done
  grep -E '^(NOTE|BREAKDOWN)' <<<"$out" | sed "s/^/  N=$n: /" >&2
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
