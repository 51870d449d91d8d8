/* tensor/cuda/px_cuda.h — the CUDA runtime every device path of plexus uses
 * (internal: not part of the public API).
 *
 * Built only when CMake finds the CUDA toolkit (PX_HAVE_CUDA defined for
 * every source of libplexus).  Sources that need CUDA: every *.cu file, every
 * .c file under a src/<layer>/cuda/ folder, and src/comm/nccl.c; the CPU
 * build leaves them out and the rest of the tree reaches them only inside
 * #ifdef PX_HAVE_CUDA.
 *
 * One process drives one GPU (DESIGN: one process per device), or under the
 * threads backend one thread per GPU: the current device, the two streams and
 * the cuBLAS handle are per thread (thread-local), set by px_cuda_init.
 *
 *   compute stream   every kernel and GEMM of forward, backward and the
 *                    optimizer; the copies the step makes
 *   comm stream      NCCL's collectives (DDP's buckets overlap backward)
 *
 * Memory: a caching allocator over cudaMalloc (never managed memory): freed
 * blocks are kept by size class and reused, so a training loop's steady
 * state calls cudaMalloc zero times.  Tensors on the device have
 * px_tensor.device == PX_CUDA and data a device pointer.
 *
 * Errors are values: every function returns px_status (or NULL) with
 * px_error's message naming what failed (the CUDA error string and what was
 * being done: "cuda: cudaMalloc of 805306368 bytes: out of memory").
 * Kernel launchers check cudaGetLastError after the launch.  Kernels run
 * asynchronously on the compute stream: an error inside a kernel shows up
 * at the next px_cuda_sync or copy to the host. */
#ifndef PX_TENSOR_CUDA_H
#define PX_TENSOR_CUDA_H

#include "plexus/base.h"
#include "plexus/tensor.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Devices and streams -------------------------------------------------- */
/* Number of CUDA devices this process can use (0 when there is no driver or
 * no GPU; never an error). */
int px_cuda_device_count(void);
/* Make `device` current for the calling thread and create its streams and
 * cuBLAS handle (once per thread; again with the same device is a no-op).
 * PX_ERR_UNSUPPORTED "no CUDA device" when there is none, PX_ERR_INVALID when
 * device >= px_cuda_device_count(). */
px_status px_cuda_init(int device);
/* The calling thread's device (-1 before px_cuda_init). */
int px_cuda_current_device(void);
/* "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)" of the current device. */
const char *px_cuda_device_name(void);
/* The calling thread's streams (cudaStream_t, as void * so C callers need
 * no CUDA header). */
void *px_cuda_compute_stream(void);
void *px_cuda_comm_stream(void);
/* The calling thread's cuBLAS handle (cublasHandle_t), bound to the compute stream. */
void *px_cuda_cublas(void);
/* Wait for the compute stream; report an error a kernel raised. */
px_status px_cuda_sync(void);
/* After a kernel launch: cudaGetLastError as a px_status naming `what`. */
px_status px_cuda_check_launch(const char *what);

/* ---- Memory ------------------------------------------------------------------ */
/* Device memory from the caching allocator, 256-byte aligned; NULL with
 * px_error set when out of memory.  px_cuda_free(NULL) is a no-op. */
void *px_cuda_malloc(size_t bytes);
void px_cuda_free(void *p);
/* Bytes the allocator holds from cudaMalloc (in use + cached), and in use. */
size_t px_cuda_reserved_bytes(void);
size_t px_cuda_allocated_bytes(void);
/* Copies ordered on the compute stream; the ones to or from the host wait
 * for the stream (the host buffer is ready or consumed on return). */
px_status px_cuda_to_device(void *dst, const void *host_src, size_t bytes);
px_status px_cuda_to_host(void *host_dst, const void *src, size_t bytes);
px_status px_cuda_copy(void *dst, const void *src, size_t bytes);
px_status px_cuda_zero(void *p, size_t bytes);

/* A device arena for activations: px_arena with chunks from px_cuda_malloc
 * (px_arena_create_with in base.h). */
px_arena *px_cuda_arena_create(size_t initial_bytes);

/* ---- GEMM through cuBLAS (row-major, the contract of px_sgemm) -------------
 * C = alpha · op(A) · op(B) + beta · C with op(A) (M, K), op(B) (K, N), C
 * (M, N); leading dimensions are those of the stored row-major matrices.
 * f32: full f32 math (no TF32), so results match the CPU path to 1e-5.
 * bf16: A and B bf16 (uint16_t bit patterns), C f32, f32 accumulation. */
px_status px_cuda_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc);
px_status px_cuda_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                            const uint16_t *B, int ldb, float beta, float *C, int ldc);

/* ---- Elementwise and reductions on device arrays (the px_fill ... family) --- */
px_status px_cuda_fill(float *x, size_t n, float v);
px_status px_cuda_scale(float *x, size_t n, float a);                /* x *= a */
px_status px_cuda_axpy(float *y, const float *x, size_t n, float a); /* y += a·x */
px_status px_cuda_add(float *out, const float *a, const float *b, size_t n);
/* f32 -> bf16, round to nearest even (the CPU's px_f32_to_bf16 bits). */
px_status px_cuda_to_bf16(uint16_t *dst, const float *src, size_t n);
/* The f32 values of n bf16 bit patterns (exact). */
px_status px_cuda_from_bf16(float *dst, const uint16_t *src, size_t n);
/* rows x cols of src (row stride sld) cast into dst with row stride dld: a
 * bf16 copy whose rows start on 16-byte boundaries (dld a multiple of 8),
 * which cuBLAS's fast bf16 kernels need. */
px_status px_cuda_to_bf16_2d(uint16_t *dst, size_t dld, const float *src, size_t sld, size_t rows, size_t cols);
/* rows x cols floats from src (row stride sld) into dst (row stride dld). */
px_status px_cuda_copy_2d(float *dst, size_t dld, const float *src, size_t sld, size_t rows, size_t cols);
/* Σ x² in double, returned to the host (waits for the stream). */
px_status px_cuda_sumsq(const float *x, size_t n, double *out);
/* True when any of x[0..n) is NaN or ±inf (waits). */
px_status px_cuda_any_nonfinite(const float *x, size_t n, bool *out);

#ifdef __cplusplus
}
#endif
#endif
