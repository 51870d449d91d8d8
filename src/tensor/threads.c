// One thread-count setting for OpenMP and OpenBLAS.
#include "plexus/tensor.h"
#include "tensor/blas.h"
#include "tensor/internal.h"

#include <omp.h>
#include <stdlib.h>

/* 0 = not yet initialised.  Atomic: ranks of the threads backend make their
 * first kernel call at once (ThreadSanitizer reported the plain int). */
static _Atomic int px_threads = 0;

void px_set_num_threads(int n) {
  if (n < 1) n = 1;
  px_threads = n;
  omp_set_num_threads(n);
  if (px_blas.set_num_threads) px_blas.set_num_threads(n);
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
