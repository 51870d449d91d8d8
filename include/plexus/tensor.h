/* plexus/tensor.h — px_tensor and the CPU kernels.
 *
 * A px_tensor is a small value: dtype, shape (up to 4 dims, row-major,
 * contiguous), device and a data pointer.  Most tensors are views: into a
 * model's flat parameter buffer, into the step arena, into a user array.
 * Only px_tensor_new allocates; px_tensor_free releases what it allocated.
 *
 * The kernels work on float arrays with explicit sizes, as llm.c does, so
 * callers that already know their shapes pay nothing for generality.
 * Elementwise kernels and reductions use OpenMP above a size threshold;
 * GEMM goes through cblas_sgemm (OpenBLAS). */
#ifndef PLEXUS_TENSOR_H
#define PLEXUS_TENSOR_H

#include "plexus/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

typedef enum px_device { PX_CPU = 0, PX_CUDA = 1 } px_device;

#define PX_MAX_DIMS 4

typedef struct px_tensor {
  px_dtype dtype;
  px_device device;
  int ndim;
  int64_t shape[PX_MAX_DIMS];
  void *data;
  bool owned; /* allocated by px_tensor_new; freed by px_tensor_free */
} px_tensor;

/* A view of `data` (not owned). */
px_tensor px_tensor_view(void *data, px_dtype dtype, int ndim, const int64_t *shape);
/* Convenience: 1-4 dim float views. */
px_tensor px_tensor_f32(float *data, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3);
/* Allocated, zero-filled, 64-byte aligned; returns PX_ERR_NOMEM/INVALID. */
px_status px_tensor_new(px_tensor *out, px_dtype dtype, int ndim, const int64_t *shape);
void px_tensor_free(px_tensor *t);

/* Elements, bytes, and whether two tensors have the same shape. */
int64_t px_tensor_numel(const px_tensor *t);
size_t px_tensor_nbytes(const px_tensor *t);
bool px_tensor_same_shape(const px_tensor *a, const px_tensor *b);
/* "(16, 1, 28, 28)" into buf; returns buf. */
char *px_shape_str(int ndim, const int64_t *shape, char *buf, size_t len);
#define PX_SHAPE_STR_MAX 96

/* t's data as floats (t must be F32). */
static inline float *px_f32(const px_tensor *t) { return (float *)t->data; }

/* ---- Threads ---------------------------------------------------------------
 * One setting governs OpenMP and OpenBLAS.  The first call to any plexus
 * kernel reads PX_NUM_THREADS (default: OpenMP's default). */
void px_set_num_threads(int n);
int px_get_num_threads(void);

/* One line about the BLAS in use: its build, the CPU kernels it chose, and
 * (when a generic kernel was chosen on a CPU that has AVX2 or AVX-512, as
 * Debian's OpenBLAS 0.3.21 does on CPUs newer than itself) the
 * OPENBLAS_CORETYPE setting that selects the fast ones. */
const char *px_blas_info(void);

/* Which build of plexus's own loops (elementwise, optimizer steps,
 * attention, softmax, cross-entropy, layer norm) runs: on x86-64 the
 * baseline, AVX2+FMA or AVX-512 clone, picked at load time from cpuid;
 * "native" in a PX_NATIVE (-march=native) build. */
const char *px_kernel_info(void);

/* ---- GEMM ----------------------------------------------------------------
 * C = alpha · op(A) · op(B) + beta · C, row-major, op = transpose if asked.
 * op(A): (M, K)   op(B): (K, N)   C: (M, N); leading dims are those of the
 * stored (untransposed) matrices. */
void px_sgemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, int lda, const float *B,
              int ldb, float beta, float *C, int ldc);

/* ---- Elementwise and reductions (n elements) -------------------------- */
void px_fill(float *x, size_t n, float v);
void px_copy(float *dst, const float *src, size_t n);
void px_scale(float *x, size_t n, float a);                /* x *= a        */
void px_axpy(float *y, const float *x, size_t n, float a); /* y += a·x */
void px_add(float *out, const float *a, const float *b, size_t n);
void px_mul(float *out, const float *a, const float *b, size_t n);
double px_sum(const float *x, size_t n);
double px_dot(const float *a, const float *b, size_t n);
double px_sumsq(const float *x, size_t n);
float px_max_abs(const float *x, size_t n);
/* Largest |a-b| / max(|a|,|b|,floor) — used by tests and parity checks. */
double px_max_rel_diff(const float *a, const float *b, size_t n, double floor);

/* ---- Named tensors: the state of a model as a list -----------------------
 * A model's parameters and buffers, listed as (name, tensor view) pairs,
 * are what io/ reads and writes (safetensors) without knowing about nn/. */
#define PX_NAME_MAX 128
typedef struct px_named_tensor {
  char name[PX_NAME_MAX];
  px_tensor tensor; /* a view into the owner's memory */
} px_named_tensor;

typedef struct px_state_dict {
  px_named_tensor *items;
  int count;
} px_state_dict;

/* Free a state dict's items array (not the tensors' data, which it does not own). */
void px_state_dict_free(px_state_dict *sd);
/* Index of `name`, or -1. */
int px_state_dict_find(const px_state_dict *sd, const char *name);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
