// The CUDA runtime of plexus (px_cuda.h): devices, per-thread streams and
// cuBLAS handle, a caching allocator over cudaMalloc, copies, GEMMs.
//
// Per thread (_Thread_local): the device, the compute stream (a blocking
// stream, so a stray cudaMemcpy on the legacy default stream still orders
// with it), the comm stream (cudaStreamNonBlocking: NCCL's collectives must
// not wait for the default stream), and a cuBLAS handle bound to the compute
// stream in CUBLAS_DEFAULT_MATH: full f32 GEMMs (no TF32) unless the
// environment sets NVIDIA_TF32_OVERRIDE=1, which makes cuBLAS use TF32 and
// breaks the 1e-5 parity with the CPU.
//
// The allocator is process-wide (the threads backend's ranks share it, one
// device each): a block is keyed by its device and rounded size (512 B steps
// below 1 MiB, 2 MiB steps above), a freed block goes on the free list of its
// key and is handed out again for the next request of that key, and nothing
// is returned to CUDA but by px_cuda_empty_cache (or when cudaMalloc runs out
// of memory: the cache of that device is emptied and the call retried).
// A freed block may be reused at once by the same device's compute stream;
// work queued on that stream before the free still completes first (stream
// order).  Memory used on the comm stream must be freed only after that
// stream has been waited for.
#include "tensor/cuda/px_cuda.h"
#include "tensor/cuda/px_cuda_runtime.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Errors ---------------------------------------------------------------- */

static px_status cuda_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static px_status cuda_fail(cudaError_t e, const char *fmt, ...) {
  char what[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  (void)cudaGetLastError(); /* clear a non-sticky error so the next check does not see it again */
  const px_status s = e == cudaErrorMemoryAllocation             ? PX_ERR_NOMEM
    : e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ? PX_ERR_UNSUPPORTED
                                                                 : PX_ERR_INTERNAL;
  return px_error(s, "cuda: %s: %s", what, cudaGetErrorString(e));
}

static const char *blas_string(cublasStatus_t s) { return cublasGetStatusString(s); }

static px_status blas_fail(cublasStatus_t s, const char *what) {
  return px_error(s == CUBLAS_STATUS_ALLOC_FAILED ? PX_ERR_NOMEM : PX_ERR_INTERNAL, "cuda: %s: %s", what,
                  blas_string(s));
}

/* ---- Devices and streams ----------------------------------------------------- */

static _Thread_local int tl_device = -1;
static _Thread_local cudaStream_t tl_compute;
static _Thread_local cudaStream_t tl_comm;
static _Thread_local cublasHandle_t tl_blas;
static _Thread_local char tl_name[320];

int px_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

px_status px_cuda_init(int device) {
  if (tl_device >= 0) {
    if (tl_device == device) return PX_OK;
    return px_error(PX_ERR_INVALID, "cuda: this thread already drives device %d, cannot switch to %d", tl_device,
                    device);
  }
  const int n = px_cuda_device_count();
  if (n == 0) return px_error(PX_ERR_UNSUPPORTED, "cuda: no CUDA device (no GPU, or no driver)");
  if (device < 0 || device >= n)
    return px_error(PX_ERR_INVALID, "cuda: device %d does not exist (%d device%s)", device, n, n == 1 ? "" : "s");
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return cuda_fail(e, "cudaSetDevice(%d)", device);
  struct cudaDeviceProp prop;
  e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return cuda_fail(e, "cudaGetDeviceProperties(%d)", device);
  cudaStream_t compute = NULL, comm = NULL;
  cublasHandle_t blas = NULL;
  e = cudaStreamCreate(&compute);
  if (e != cudaSuccess) return cuda_fail(e, "creating the compute stream of device %d", device);
  e = cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    cudaStreamDestroy(compute);
    return cuda_fail(e, "creating the comm stream of device %d", device);
  }
  cublasStatus_t bs = cublasCreate(&blas);
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetStream(blas, compute);
  if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH);
  if (bs != CUBLAS_STATUS_SUCCESS) {
    if (blas) cublasDestroy(blas);
    cudaStreamDestroy(comm);
    cudaStreamDestroy(compute);
    return blas_fail(bs, "creating the cuBLAS handle");
  }
  tl_device = device;
  tl_compute = compute;
  tl_comm = comm;
  tl_blas = blas;
  snprintf(tl_name, sizeof tl_name, "%.200s (sm_%d%d, %d SMs, %.1f GiB)", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
  return PX_OK;
}

int px_cuda_current_device(void) { return tl_device; }

const char *px_cuda_device_name(void) { return tl_device >= 0 ? tl_name : "no CUDA device"; }

void *px_cuda_compute_stream(void) { return tl_compute; }
void *px_cuda_comm_stream(void) { return tl_comm; }
void *px_cuda_cublas(void) { return tl_blas; }

px_status px_cuda_sync(void) {
  const cudaError_t e = cudaStreamSynchronize(tl_compute);
  return e == cudaSuccess ? PX_OK : cuda_fail(e, "waiting for the compute stream");
}

px_status px_cuda_check_launch(const char *what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? PX_OK : cuda_fail(e, "launching %s", what);
}

/* ---- The caching allocator --------------------------------------------------- */

typedef struct block {
  void *ptr;
  size_t size; /* rounded */
  int device;
  bool in_use;
  struct block *next_hash; /* in the pointer table */
  struct block *next_free; /* in its class's free list */
} block;

typedef struct size_class {
  int device;
  size_t size;
  block *free;
  struct size_class *next;
} size_class;

#define PTR_BUCKETS 4096
#define CLASS_BUCKETS 256

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static block *g_ptr[PTR_BUCKETS];
static size_class *g_class[CLASS_BUCKETS];
static size_t g_reserved, g_allocated;

static size_t ptr_hash(const void *p) { return ((uintptr_t)p >> 9) % PTR_BUCKETS; }
static size_t class_hash(int device, size_t size) {
  return (size_t)(((uint64_t)size * 0x9E3779B97F4A7C15ull) >> 40 ^ (uint64_t)device) % CLASS_BUCKETS;
}

/* The size class of a request: 512-byte steps below 1 MiB, 2 MiB steps above. */
static size_t round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t step = bytes < ((size_t)1 << 20) ? 512 : ((size_t)2 << 20);
  return (bytes + step - 1) / step * step;
}

static size_class *class_of(int device, size_t size, bool create) {
  size_class **link = &g_class[class_hash(device, size)];
  for (size_class *c = *link; c; c = c->next)
    if (c->device == device && c->size == size) return c;
  if (!create) return NULL;
  size_class *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->device = device;
  c->size = size;
  c->next = *link;
  *link = c;
  return c;
}

/* cudaFree every cached (free) block of `device` (all devices when < 0).  Under g_mu. */
static void empty_cache_locked(int device) {
  for (size_t h = 0; h < CLASS_BUCKETS; h++)
    for (size_class *c = g_class[h]; c; c = c->next) {
      if (device >= 0 && c->device != device) continue;
      while (c->free) {
        block *b = c->free;
        c->free = b->next_free;
        block **link = &g_ptr[ptr_hash(b->ptr)];
        while (*link != b) link = &(*link)->next_hash;
        *link = b->next_hash;
        int cur = -1;
        (void)cudaGetDevice(&cur);
        if (cur != b->device) (void)cudaSetDevice(b->device);
        (void)cudaFree(b->ptr);
        if (cur != b->device && cur >= 0) (void)cudaSetDevice(cur);
        g_reserved -= b->size;
        free(b);
      }
    }
  (void)cudaGetLastError();
}

void px_cuda_empty_cache(void) {
  pthread_mutex_lock(&g_mu);
  empty_cache_locked(-1);
  pthread_mutex_unlock(&g_mu);
}

void *px_cuda_malloc(size_t bytes) {
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) {
    cuda_fail(e, "cudaGetDevice for an allocation of %zu bytes", bytes);
    return NULL;
  }
  const size_t size = round_size(bytes);
  pthread_mutex_lock(&g_mu);
  size_class *c = class_of(device, size, true);
  if (!c) {
    pthread_mutex_unlock(&g_mu);
    px_error(PX_ERR_NOMEM, "cuda: out of host memory for the allocator's tables");
    return NULL;
  }
  block *b = c->free;
  if (b) {
    c->free = b->next_free;
    b->next_free = NULL;
    b->in_use = true;
    g_allocated += size;
    pthread_mutex_unlock(&g_mu);
    return b->ptr;
  }
  b = calloc(1, sizeof *b);
  if (!b) {
    pthread_mutex_unlock(&g_mu);
    px_error(PX_ERR_NOMEM, "cuda: out of host memory for the allocator's tables");
    return NULL;
  }
  void *p = NULL;
  e = cudaMalloc(&p, size);
  if (e == cudaErrorMemoryAllocation) {
    // What the cache holds may be enough: give it back and try once more.
    (void)cudaGetLastError();
    empty_cache_locked(device);
    e = cudaMalloc(&p, size);
  }
  if (e != cudaSuccess) {
    free(b);
    const size_t reserved = g_reserved;
    pthread_mutex_unlock(&g_mu);
    cuda_fail(e, "cudaMalloc of %zu bytes on device %d (%zu bytes reserved)", size, device, reserved);
    return NULL;
  }
  b->ptr = p;
  b->size = size;
  b->device = device;
  b->in_use = true;
  block **link = &g_ptr[ptr_hash(p)];
  b->next_hash = *link;
  *link = b;
  g_reserved += size;
  g_allocated += size;
  pthread_mutex_unlock(&g_mu);
  return p;
}

void px_cuda_free(void *p) {
  if (!p) return;
  pthread_mutex_lock(&g_mu);
  block *b = g_ptr[ptr_hash(p)];
  while (b && b->ptr != p) b = b->next_hash;
  if (!b || !b->in_use) {
    // Not ours, or freed twice: a bug in the caller; leave the memory alone.
    pthread_mutex_unlock(&g_mu);
    px_error(PX_ERR_INTERNAL, "cuda: px_cuda_free of %p, which %s", p,
             b ? "was already freed" : "px_cuda_malloc did not return");
    return;
  }
  size_class *c = class_of(b->device, b->size, false); /* exists: created by the malloc */
  b->in_use = false;
  b->next_free = c->free;
  c->free = b;
  g_allocated -= b->size;
  pthread_mutex_unlock(&g_mu);
}

size_t px_cuda_reserved_bytes(void) {
  pthread_mutex_lock(&g_mu);
  const size_t r = g_reserved;
  pthread_mutex_unlock(&g_mu);
  return r;
}

size_t px_cuda_allocated_bytes(void) {
  pthread_mutex_lock(&g_mu);
  const size_t r = g_allocated;
  pthread_mutex_unlock(&g_mu);
  return r;
}

/* ---- Copies ------------------------------------------------------------------ */

px_status px_cuda_to_device(void *dst, const void *host_src, size_t bytes) {
  if (bytes == 0) return PX_OK;
  cudaError_t e = cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, tl_compute);
  if (e == cudaSuccess) e = cudaStreamSynchronize(tl_compute);
  return e == cudaSuccess ? PX_OK : cuda_fail(e, "copy of %zu bytes to the device", bytes);
}

px_status px_cuda_to_host(void *host_dst, const void *src, size_t bytes) {
  if (bytes == 0) return PX_OK;
  cudaError_t e = cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, tl_compute);
  if (e == cudaSuccess) e = cudaStreamSynchronize(tl_compute);
  return e == cudaSuccess ? PX_OK : cuda_fail(e, "copy of %zu bytes to the host", bytes);
}

px_status px_cuda_copy(void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return PX_OK;
  const cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, tl_compute);
  return e == cudaSuccess ? PX_OK : cuda_fail(e, "device copy of %zu bytes", bytes);
}

px_status px_cuda_zero(void *p, size_t bytes) {
  if (bytes == 0) return PX_OK;
  const cudaError_t e = cudaMemsetAsync(p, 0, bytes, tl_compute);
  return e == cudaSuccess ? PX_OK : cuda_fail(e, "zeroing %zu bytes", bytes);
}

/* ---- The device arena --------------------------------------------------------- */

static void arena_zero(void *p, size_t bytes) { (void)px_cuda_zero(p, bytes); }

// rewind_keep moves a block down, possibly onto itself (dst < src, the
// ranges overlapping): cudaMemcpy's ranges must not overlap, so an
// overlapping move goes through a scratch block, or, when the gap is at
// least an eighth of the block, in forward steps of the gap (each step's
// source lies past its destination, and a step only overwrites bytes that
// earlier steps have copied already).
static void arena_move(void *dst, const void *src, size_t bytes) {
  unsigned char *d = dst;
  const unsigned char *s = src;
  if (d == s || bytes == 0) return;
  const bool overlap = d < s + bytes && s < d + bytes;
  if (!overlap) {
    (void)px_cuda_copy(d, s, bytes);
    return;
  }
  const size_t gap = d < s ? (size_t)(s - d) : (size_t)(d - s);
  if (d < s && gap >= bytes / 8) {
    for (size_t off = 0; off < bytes; off += gap) {
      const size_t n = bytes - off < gap ? bytes - off : gap;
      (void)px_cuda_copy(d + off, s + off, n);
    }
    return;
  }
  void *tmp = px_cuda_malloc(bytes);
  if (!tmp) return; /* px_last_error says why */
  (void)px_cuda_copy(tmp, s, bytes);
  (void)px_cuda_copy(d, tmp, bytes);
  px_cuda_free(tmp); /* stream order: the copies complete before any reuse */
}

static const px_arena_mem cuda_arena_mem = {px_cuda_malloc, px_cuda_free, arena_zero, arena_move};

px_arena *px_cuda_arena_create(size_t initial_bytes) { return px_arena_create_with(initial_bytes, &cuda_arena_mem); }

/* ---- GEMM ------------------------------------------------------------------- */

// Row-major C (M, N) = op(A) op(B) is column-major C^T (N, M) = op(B)^T op(A)^T:
// the stored row-major B read as column-major is B^T, so cuBLAS gets B first,
// with B's own transpose flag, then A, and the dimensions N, M, K.
static px_status gemm_check(const char *what, bool ta, bool tb, int M, int N, int K, int lda, int ldb, int ldc) {
  if (M < 0 || N < 0 || K < 0)
    return px_error(PX_ERR_INVALID, "cuda: %s: negative size (M %d, N %d, K %d)", what, M, N, K);
  const int a_cols = ta ? M : K, b_cols = tb ? K : N;
  if (lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) || ldc < (N > 1 ? N : 1))
    return px_error(PX_ERR_INVALID, "cuda: %s: leading dimensions (%d, %d, %d) too small for M %d, N %d, K %d", what,
                    lda, ldb, ldc, M, N, K);
  if (!tl_blas) return px_error(PX_ERR_INVALID, "cuda: %s before px_cuda_init on this thread", what);
  return PX_OK;
}

px_status px_cuda_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda,
                        const float *B, int ldb, float beta, float *C, int ldc) {
  px_status st = gemm_check("sgemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (st != PX_OK) return st;
  if (M == 0 || N == 0) return PX_OK;
  const cublasStatus_t s = cublasSgemm(tl_blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                       trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, ldb, A, lda, &beta, C,
                                       ldc);
  return s == CUBLAS_STATUS_SUCCESS ? PX_OK : blas_fail(s, "cublasSgemm");
}

px_status px_cuda_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const uint16_t *A, int lda,
                            const uint16_t *B, int ldb, float beta, float *C, int ldc) {
  px_status st = gemm_check("bf16 gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (st != PX_OK) return st;
  if (M == 0 || N == 0) return PX_OK;
  const cublasStatus_t s = cublasGemmEx(tl_blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_16BF, ldb, A,
                                        CUDA_R_16BF, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT);
  return s == CUBLAS_STATUS_SUCCESS ? PX_OK : blas_fail(s, "cublasGemmEx (bf16)");
}
