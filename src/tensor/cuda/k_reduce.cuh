/* tensor/cuda/k_reduce.cuh — a fixed-order block sum in double for the
 * vision kernels (k_conv.cu, k_batchnorm.cu, k_pool.cu).  Internal.
 *
 * Every thread of a PX_K_RED_THREADS block passes its own partial; the tree
 * halves in a fixed pattern, so the result depends on the data only, not on
 * timing: the same inputs give the same bits. */
#ifndef PX_TENSOR_CUDA_K_REDUCE_CUH
#define PX_TENSOR_CUDA_K_REDUCE_CUH

#define PX_K_RED_THREADS 256

/* Sum of v over the block; every thread gets the total.  buf: shared,
 * PX_K_RED_THREADS doubles.  All threads of the block must call it. */
static __device__ double px_k_block_sum(double v, double *buf) {
  const int t = threadIdx.x;
  buf[t] = v;
  __syncthreads();
  for (int half = PX_K_RED_THREADS / 2; half > 0; half >>= 1) {
    if (t < half) buf[t] += buf[t + half];
    __syncthreads();
  }
  const double total = buf[0];
  __syncthreads(); /* buf may be reused by the caller's next sum */
  return total;
}

/* Blocks of 256 threads covering n elements (grid-stride loops take the rest). */
static inline unsigned px_k_blocks(long long n) {
  long long b = (n + 255) / 256;
  if (b < 1) b = 1;
  if (b > 65535LL * 16) b = 65535LL * 16;
  return (unsigned)b;
}

#endif
