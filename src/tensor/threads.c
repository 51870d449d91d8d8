// One thread-count setting for OpenMP and OpenBLAS.
#include "plexus/tensor.h"
#include "tensor/internal.h"

#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// OpenBLAS's own functions; declared here because some cblas.h lack them.
void openblas_set_num_threads(int num_threads);
char *openblas_get_config(void);
char *openblas_get_corename(void);

static int px_threads = 0; /* 0 = not yet initialised */

void px_set_num_threads(int n) {
  if (n < 1) n = 1;
  px_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int px_get_num_threads(void) {
  px_threads_init();
  return px_threads;
}

void px_threads_init(void) {
  if (px_threads) return;
  const char *env = getenv("PX_NUM_THREADS");
  int n = env ? atoi(env) : 0;
  if (n < 1) n = omp_get_max_threads();
  px_set_num_threads(n);
}

const char *px_blas_info(void) {
  static char info[512];
  const char *core = openblas_get_corename();
  snprintf(info, sizeof info, "%s; kernels: %s", openblas_get_config(), core);
  // OpenBLAS falls back to these generic x86-64 kernels on CPUs it does not
  // know; on AVX-512 or AVX2 machines they run several times slower.
  static const char *generic[] = {"Prescott", "Core2", "Nehalem", "Penryn", "Dunnington", "Katmai", "Northwood"};
  bool is_generic = false;
  for (size_t i = 0; i < sizeof generic / sizeof *generic; i++)
    if (core && strcmp(core, generic[i]) == 0) is_generic = true;
#if defined(__x86_64__) && defined(__GNUC__)
  const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX" : __builtin_cpu_supports("avx2") ? "Haswell" : NULL;
  if (is_generic && better) {
    size_t k = strlen(info);
    snprintf(info + k, sizeof info - k,
             " (generic: this CPU supports %s; OPENBLAS_CORETYPE=%s selects much faster GEMM kernels)",
             strcmp(better, "SkylakeX") == 0 ? "AVX-512" : "AVX2", better);
  }
#else
  (void)is_generic;
#endif
  return info;
}
