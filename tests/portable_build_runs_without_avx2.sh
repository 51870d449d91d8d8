#!/usr/bin/env bash
# Claim: a default (portable) build runs on an x86-64 CPU without AVX2, FMA
# or AVX-512: under qemu-x86_64 emulating a Nehalem (SSE4.2), `plexus
# --version` reports the baseline kernels and the kernel tests (elementwise
# ops, layers and their gradients, SGD/Adam/AdamW) pass there; under an
# emulated Haswell the AVX2+FMA clones are picked; 3x3 convolutions take
# im2col + GEMM on Nehalem and the direct kernels' AVX2+FMA copy on Haswell
# (`conv:` line).  The direct kernels' baseline copy is tested natively with
# PX_CONV_ISA=base (test_conv3x3_direct_baseline_copy_...): its test takes
# 40 s of CPU under qemu.  If it failed, a library
# or `plexus` built on a newer login node would die with an illegal
# instruction on older compute nodes.
#
# Skipped (exit 77, with the reason) without qemu-x86_64 (Debian: qemu-user),
# on a host that is not x86-64, in a PX_NATIVE=ON build, which is meant for
# the build machine's CPU only, and in a sanitizer build (ASan's shadow
# memory does not map under qemu-user).
set -uo pipefail
build=$1
native=$2
sanitize=${3:-OFF}
if [ "$(uname -m)" != x86_64 ]; then
  echo "SKIP: host is $(uname -m), not x86-64"
  exit 77
fi
if [ "$native" = ON ] || [ "$native" = 1 ]; then
  echo "SKIP: built with PX_NATIVE=ON (-march=native): for this CPU only"
  exit 77
fi
if [ "$sanitize" = ON ] || [ "$sanitize" = 1 ]; then
  echo "SKIP: sanitizer build (ASan cannot map its shadow memory under qemu-user)"
  exit 77
fi
if ! command -v qemu-x86_64 >/dev/null; then
  echo "SKIP: qemu-x86_64 not found (apt-get install qemu-user)"
  exit 77
fi
fail=0
# OpenBLAS is told the emulated CPU: where the environment forces a core
# type (OPENBLAS_CORETYPE=Haswell on some hosts), OpenBLAS would run that
# core's AVX2 kernels on the emulated Nehalem and die with SIGILL, which is
# OpenBLAS's setting, not plexus's code.
qemu() { # qemu CPU PROGRAM ARGS...: run it, warnings about unemulated CPU features dropped
  local cpu=$1; shift
  OPENBLAS_CORETYPE=$cpu qemu-x86_64 -cpu "$cpu" "$@" 2> >(grep -v "TCG doesn't support requested feature" >&2)
}
out=$(qemu Nehalem "$build/plexus" --version) || { echo "FAIL: plexus --version on Nehalem exited $?"; fail=1; }
echo "$out"
echo "$out" | grep -q "^kernels: baseline x86-64" || { echo "FAIL: Nehalem did not get the baseline kernels"; fail=1; }
echo "$out" | grep -q "^conv: im2col + GEMM" || { echo "FAIL: Nehalem did not get im2col + GEMM for 3x3 convolutions"; fail=1; }
out=$(qemu Haswell "$build/plexus" --version) || { echo "FAIL: plexus --version on Haswell exited $?"; fail=1; }
echo "$out" | grep -q "^kernels: avx2+fma" || { echo "FAIL: Haswell did not get the avx2+fma kernels: $out"; fail=1; }
echo "$out" | grep -q "^conv: direct 3x3 avx2+fma" || { echo "FAIL: Haswell did not get the direct 3x3 avx2+fma kernels: $out"; fail=1; }
# One thread: OpenMP's spinning barriers crawl under emulation.
export OMP_NUM_THREADS=1 PX_NUM_THREADS=1
for t in test_gradcheck_linear_activations_losses test_gradcheck_transformer_layers \
         test_optim_sgd_adam_adamw_match_pytorch_rules test_optim_segments_equal_contiguous_bits; do
  if qemu Nehalem "$build/tests/$t" >"$t.qemu.log" 2>&1; then
    echo "ok: $t on Nehalem"
  else
    echo "FAIL: $t on Nehalem (exit $?):"; tail -n 20 "$t.qemu.log"; fail=1
  fi
done
[ "$fail" = 0 ] && echo "portable_build_runs_without_avx2: ok"
exit "$fail"
