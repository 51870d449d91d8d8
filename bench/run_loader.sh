#!/usr/bin/env bash
# bench/run_loader.sh — plexus's data loader against PyTorch's DataLoader,
# side by side, on this machine.
#
#   bench/run_loader.sh                  (from the repository root or anywhere)
#
# The cases, each at every worker count:
#   fmnist: Fashion-MNIST's 60,000 training images from Debian's IDX files
#           (/usr/share/datasets/fashion-mnist), batch 256, normalised;
#   jpeg:   2,000 generated 256×256 JPEGs listed in a path,label CSV, random
#           crop 224 + horizontal flip + ImageNet normalisation, batch 64.
#   hdf5:   the same 60,000 images copied once into one HDF5 file (bench_loader
#           make-h5: "images" (N, 28, 28) uint8, contiguous; "labels" int64)
#           and read through px_hdf5_dataset_open (pread at the dataset's
#           file offset), batch 256, normalised; PyTorch reads it with h5py,
#           one sample per __getitem__;
#   hdf5z:  the same, chunked by 64 images and deflate-compressed: every read
#           goes through libhdf5 (its chunk cache, under plexus's HDF5 lock).
#           (Both HDF5 cases: the PyTorch side is left out without h5py,
#           and the output says so.)
# The jpeg case from three places (each image one read per sample):
#   jpeg:     JPEG_DIR on local disk (/tmp; the files in the page cache);
#   jpeg-shm: a copy in /dev/shm (SHM_DIR), as node-local staging makes;
#   jpeg-s3:  the first S3_COUNT images (default 256) and their CSV in moto's
#             S3 server on 127.0.0.1 (started here by bench/bench_s3.py serve,
#             stopped at the end; every request SigV4-signed and checked),
#             read as s3:// (one whole-object GET per image,
#             PX_S3_IN_FLIGHT requests in flight per worker); PyTorch has no
#             s3:// reader here: its column is "n/a".  Skipped, saying why,
#             where moto or boto3 is missing.
# plexus: bench_loader (threads); PyTorch: bench_loader_torch.py
# (DataLoader with num_workers processes, persistent).  Each run times one
# warm-up epoch apart, then EPOCHS epochs.  The two sides alternate, ROUNDS
# times, so that other work on the machine weighs on both alike; the table
# gives the median samples/s of each side and the ratio of the medians.
#
# This is a benchmark, not a test: it reports, it never fails on speed.
#
# Settings (environment):
#   BUILD_DIR   build folder                  (default: <repo>/build)
#   PYTHON      Python that has torch         (default: /usr/bin/python3)
#   WORKERS     worker counts                 (default: "1 2 4")
#   ROUNDS      runs of each case and side    (default: 3)
#   EPOCHS      timed epochs per run          (default: fmnist 2, jpeg 1)
#   CASES       which cases                   (default: "fmnist jpeg jpeg-shm jpeg-s3 hdf5 hdf5z")
#   SHM_DIR     the /dev/shm copy of JPEG_DIR (default: /dev/shm/plexus-bench-jpegs, removed at the end)
#   S3_COUNT    images in the S3 bucket        (default: 256)
#   FMNIST_DIR  the IDX files                 (default: /usr/share/datasets/fashion-mnist)
#   JPEG_DIR    where the JPEGs are made once (default: /tmp/plexus-bench-jpegs)
#   H5_DIR      where the HDF5 files are made once (default: /tmp/plexus-bench-h5)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
PYTHON=${PYTHON:-/usr/bin/python3}
WORKERS=${WORKERS:-"1 2 4"}
ROUNDS=${ROUNDS:-3}
CASES=${CASES:-"fmnist jpeg jpeg-shm jpeg-s3 hdf5 hdf5z"}
SHM_DIR=${SHM_DIR:-/dev/shm/plexus-bench-jpegs}
S3_COUNT=${S3_COUNT:-256}
FMNIST_DIR=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
JPEG_DIR=${JPEG_DIR:-/tmp/plexus-bench-jpegs}
H5_DIR=${H5_DIR:-/tmp/plexus-bench-h5}

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$BUILD_DIR" --target bench_loader -j "$(nproc)" >/dev/null
BENCH="$BUILD_DIR/bench_loader"

case " $CASES " in *" hdf5"*)
  mkdir -p "$H5_DIR"
  [ -f "$H5_DIR/fmnist.h5" ] || "$BENCH" make-h5 "$FMNIST_DIR" "$H5_DIR/fmnist.h5" 0
  [ -f "$H5_DIR/fmnist_z64.h5" ] || "$BENCH" make-h5 "$FMNIST_DIR" "$H5_DIR/fmnist_z64.h5" 64 ;;
esac
HAVE_H5PY=1
"$PYTHON" -c "import h5py" 2>/dev/null || HAVE_H5PY=0
NOTES=""
if [ "$HAVE_H5PY" = 0 ]; then
  NOTES="$NOTES
note: PyTorch's HDF5 side is left out: $PYTHON cannot import h5py (apt-get install python3-h5py)"
fi

if [ ! -f "$JPEG_DIR/list.csv" ]; then
  echo "making 2,000 JPEGs in $JPEG_DIR (once)" >&2
  "$BENCH" make-jpegs "$JPEG_DIR" 2000 256
fi

S3_PID=""
cleanup() {
  rm -f "${RESULTS:-}" "${S3_ENV:-}"
  if [ -n "$S3_PID" ]; then kill "$S3_PID" 2>/dev/null || true; wait "$S3_PID" 2>/dev/null || true; fi
  case " $CASES " in *" jpeg-shm "*) rm -rf "$SHM_DIR" ;; esac
}
trap cleanup EXIT

case " $CASES " in *" jpeg-shm "*)
  rm -rf "$SHM_DIR"
  cp -r "$JPEG_DIR" "$SHM_DIR" ;;
esac
case " $CASES " in *" jpeg-s3 "*)
  if ! "$PYTHON" -c "import moto, boto3" 2>/dev/null; then
    NOTES="$NOTES
note: jpeg-s3 skipped: $PYTHON cannot import moto and boto3 (pip install 'moto[server]' boto3)"
    CASES=$(echo " $CASES " | sed 's/ jpeg-s3 / /')
  else
    S3_ENV=$(mktemp -u /tmp/plexus-bench-s3-env.XXXXXX)
    PX_BUILD_DIR="$BUILD_DIR" "$PYTHON" "$ROOT/bench/bench_s3.py" serve "$JPEG_DIR" "$S3_COUNT" "$S3_ENV" &
    S3_PID=$!
    for _ in $(seq 600); do [ -f "$S3_ENV" ] && break; kill -0 "$S3_PID" 2>/dev/null || break; sleep 0.1; done
    if [ ! -f "$S3_ENV" ]; then
      NOTES="$NOTES
note: jpeg-s3 skipped: moto's server did not start (see above)"
      CASES=$(echo " $CASES " | sed 's/ jpeg-s3 / /')
    else
      # shellcheck disable=SC1090
      . "$S3_ENV"
      echo "moto's S3 server on $AWS_ENDPOINT_URL: $S3_COUNT JPEGs at $S3_JPEG_CSV" >&2
    fi
  fi ;;
esac

mode() { case $1 in jpeg*) echo jpeg ;; *) echo "$1" ;; esac; }
args() {  # case -> the arguments after the case name, less WORKERS EPOCHS
  case $1 in
    fmnist) echo "$FMNIST_DIR" ;;
    jpeg) echo "$JPEG_DIR/list.csv 224" ;;
    jpeg-shm) echo "$SHM_DIR/list.csv 224" ;;
    jpeg-s3) echo "$S3_JPEG_CSV 224" ;;
    hdf5) echo "$H5_DIR/fmnist.h5" ;;
    hdf5z) echo "$H5_DIR/fmnist_z64.h5" ;;
  esac
}
epochs() { case $1 in fmnist | hdf5 | hdf5z) echo "${EPOCHS:-2}" ;; jpeg*) echo "${EPOCHS:-1}" ;; esac; }
rate() { sed -n 's/.*samples_per_s=\([0-9.]*\).*/\1/p'; }
median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

RESULTS=$(mktemp)
for c in $CASES; do
  for w in $WORKERS; do
    for r in $(seq "$ROUNDS"); do
      # shellcheck disable=SC2046
      px() { "$BENCH" "$(mode "$c")" $(args "$c") "$w" "$(epochs "$c")" | sed "s/^plexus [a-z0-9]* /plexus $c /"; }
      # shellcheck disable=SC2046
      tv() {
        if [ "${c#hdf5}" != "$c" ] && [ "$HAVE_H5PY" = 0 ]; then echo "torch $c (no h5py) samples_per_s=nan"; return; fi
        if [ "$c" = jpeg-s3 ]; then echo "torch $c (no s3:// reader) samples_per_s=nan"; return; fi
        "$PYTHON" "$ROOT/bench/bench_loader_torch.py" "$(mode "$c")" $(args "$c") "$w" "$(epochs "$c")" 2>/dev/null |
          sed "s/^torch [a-z0-9]* /torch $c /"
      }
      if [ $((r % 2)) -eq 1 ]; then a=$(px); b=$(tv); else b=$(tv); a=$(px); fi
      echo "$a"
      echo "$b"
      echo "$c $w $(echo "$a" | rate) $(echo "$b" | rate)" >>"$RESULTS"
    done
  done
done

echo
echo "| case | workers | plexus samples/s | PyTorch samples/s | plexus/PyTorch |"
echo "|---|---:|---:|---:|---:|"
for c in $CASES; do
  for w in $WORKERS; do
    p=$(awk -v c="$c" -v w="$w" '$1 == c && $2 == w {print $3}' "$RESULTS" | median)
    t=$(awk -v c="$c" -v w="$w" '$1 == c && $2 == w {print $4}' "$RESULTS" | median)
    awk -v c="$c" -v w="$w" -v p="$p" -v t="$t" 'BEGIN {
      if (t == "nan" || t == "" || t + 0 <= 0) printf "| %s | %d | %.0f | n/a | n/a |\n", c, w, p
      else printf "| %s | %d | %.0f | %.0f | %.1f× |\n", c, w, p, t, p / t }'
  done
done
[ -z "$NOTES" ] || echo "$NOTES"
echo
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u '+%Y-%m-%d %H:%M UTC')"
