// OpenBLAS, loaded at start-up with the right CPU kernels.
//
// Debian's OpenBLAS (0.3.21) picks its kernels when it is loaded, from the
// CPU model; on CPUs newer than itself (Sapphire Rapids, for one) it falls
// back to generic "Prescott" SSE3 kernels, several times slower than its
// own SkylakeX kernels (figures: docs/PERFORMANCE.md, "Figures behind code
// comments").
// Its documented override is the environment variable OPENBLAS_CORETYPE,
// read once while the library loads.  So libplexus does not link OpenBLAS:
// a constructor, which runs before main and before any thread exists, sets
// OPENBLAS_CORETYPE from the CPU's instruction sets when the user has not
// set it (SkylakeX needs AVX-512 F/CD/BW/DQ/VL; Haswell AVX2 + FMA), loads
// the library, and restores the environment.  An explicit OPENBLAS_CORETYPE
// always wins; PX_BLAS_AUTO_CORETYPE=0 turns the choice off.
//
// If OpenBLAS cannot be loaded, px_sgemm falls back to a plain C loop and
// px_blas_info says so: slow, never wrong.
#define _GNU_SOURCE /* dlopen flags, setenv */
#include "plexus/tensor.h"
#include "tensor/blas.h"
#include "tensor/internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PX_OPENBLAS_PATH
#define PX_OPENBLAS_PATH "libopenblas.so.0"
#endif

px_blas_table px_blas;
static char blas_note[160];

static const char *auto_coretype(void) {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return NULL;
}

__attribute__((constructor)) static void px_blas_load(void) {
  const char *user = getenv("OPENBLAS_CORETYPE");
  const char *opt = getenv("PX_BLAS_AUTO_CORETYPE");
  const char *chosen = NULL;
  if (!user && !(opt && strcmp(opt, "0") == 0)) {
    chosen = auto_coretype();
    if (chosen) setenv("OPENBLAS_CORETYPE", chosen, 0);
  }
  void *h = dlopen(PX_OPENBLAS_PATH, RTLD_NOW | RTLD_GLOBAL);
  if (!h) h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_GLOBAL);
  if (chosen) unsetenv("OPENBLAS_CORETYPE");  // children see the user's environment
  if (!h) {
    snprintf(blas_note, sizeof blas_note, "OpenBLAS could not be loaded (%s): plain C GEMM", dlerror());
    return;
  }
  px_blas.sgemm = (px_sgemm_fn)dlsym(h, "cblas_sgemm");
  px_blas.set_num_threads = (void (*)(int))dlsym(h, "openblas_set_num_threads");
  px_blas.get_config = (char *(*)(void))dlsym(h, "openblas_get_config");
  px_blas.get_corename = (char *(*)(void))dlsym(h, "openblas_get_corename");
  if (!px_blas.sgemm) {
    snprintf(blas_note, sizeof blas_note, "%s has no cblas_sgemm: plain C GEMM", PX_OPENBLAS_PATH);
    return;
  }
  if (user) snprintf(blas_note, sizeof blas_note, "OPENBLAS_CORETYPE=%s from the environment", user);
  else if (chosen) snprintf(blas_note, sizeof blas_note, "kernels chosen by plexus from the CPU's instruction sets");
  else snprintf(blas_note, sizeof blas_note, "kernels chosen by OpenBLAS");
}

const char *px_blas_info(void) {
  static char info[512];
  if (!px_blas.sgemm) {
    snprintf(info, sizeof info, "%s", blas_note);
    return info;
  }
  char rows[96] = "";
  if (px_sgemm_rows_on())
    snprintf(rows, sizeof rows, "; linear layers of <= %d rows: plexus's avx512 row kernels (cpuid)",
             PX_SGEMM_ROWS_MAX);
  const char *packed = px_sgemm_packed_on() ? "; larger GEMMs: plexus's packed avx512 GEMM (cpuid)" : "";
  snprintf(info, sizeof info, "%s; kernels: %s (%s)%s%s", px_blas.get_config ? px_blas.get_config() : "OpenBLAS",
           px_blas.get_corename ? px_blas.get_corename() : "?", blas_note, rows, packed);
  return info;
}

// The clone PX_KERNEL's ifunc resolver picks (tensor/internal.h): the same
// test gcc's resolver makes, in the same order.
const char *px_kernel_info(void) {
#if PX_KERNEL_CLONES
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "avx512 (x86-64-v4, cpuid)";
  if (__builtin_cpu_supports("x86-64-v3")) return "avx2+fma (x86-64-v3, cpuid)";
  return "baseline x86-64 (cpuid: no avx2+fma)";
#elif defined(PX_KERNEL_NO_CLONES)
  return "compiler default (a sanitizer build: no run-time choice)";
#elif defined(PX_NATIVE_BUILD)
  return "native (built with -march=native for the build machine's CPU)";
#else
  return "compiler default (no run-time choice on this architecture)";
#endif
}
