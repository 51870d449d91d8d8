/* tensor/cuda/px_cuda_runtime.h — what the CUDA runtime (runtime.c) offers
 * beyond the contract of px_cuda.h (internal). */
#ifndef PX_TENSOR_CUDA_RUNTIME_H
#define PX_TENSOR_CUDA_RUNTIME_H

#ifdef __cplusplus
extern "C" {
#endif

/* Return every cached (freed, not in use) block to CUDA (cudaFree, which
 * waits for the device).  Blocks in use are kept.  For a process that is
 * done with the GPU, or between phases that need memory elsewhere;
 * px_cuda_malloc calls it for its device by itself when cudaMalloc runs out. */
void px_cuda_empty_cache(void);

#ifdef __cplusplus
}
#endif
#endif
