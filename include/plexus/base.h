/* plexus/base.h — status codes, error messages, arena allocator,
 * counter-based RNG, clocks.  Depends on libc only.
 *
 * Errors are values (DESIGN decision 6): public functions return px_status
 * (or NULL) and leave a message readable with px_last_error().  The message
 * is per thread, so ranks of the threads backend never see each other's. */
#ifndef PLEXUS_BASE_H
#define PLEXUS_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

typedef enum px_status {
  PX_OK = 0,
  PX_ERR_INVALID,     /* a bad argument or option */
  PX_ERR_SHAPE,       /* tensor shapes that do not fit together */
  PX_ERR_IO,          /* open/read/write/rename failed */
  PX_ERR_FORMAT,      /* a file that is not what it claims to be */
  PX_ERR_NOMEM,       /* an allocation failed */
  PX_ERR_NOT_FOUND,   /* a named thing (tensor, key, parameter) is missing */
  PX_ERR_UNSUPPORTED, /* valid, but not implemented (dtype, device) */
  PX_ERR_COMM,        /* a collective or peer failed */
  PX_ERR_TIMEOUT,     /* a watchdog fired */
  PX_ERR_INTERNAL     /* a bug in plexus or a library it calls */
} px_status;

/* The message of the last error on this thread ("" if none). */
const char *px_last_error(void);
/* A short name of a status code, e.g. "PX_ERR_SHAPE". */
const char *px_status_name(px_status s);
/* Set the thread's error message (printf-style) and return `s`, so library
 * code can write `return px_error(PX_ERR_SHAPE, "linear: ...", ...)`. */
px_status px_error(px_status s, const char *fmt, ...)
#if defined(__GNUC__)
  __attribute__((format(printf, 2, 3)))
#endif
  ;
/* Prefix the current message with more context: "ctx: old message". */
px_status px_error_wrap(px_status s, const char *fmt, ...)
#if defined(__GNUC__)
  __attribute__((format(printf, 2, 3)))
#endif
  ;
/* Empty this thread's px_last_error() message. */
void px_clear_error(void);

/* ---- Arena: bump allocator for activations, reset every step ------------
 * Allocations are 64-byte aligned.  The arena grows by chunks while the
 * first steps find out how much a step needs; px_arena_reset then merges
 * the chunks into one block of the high-water size, so the steady-state
 * training loop performs no allocation at all (DESIGN decision 4). */
typedef struct px_arena px_arena;

/* An arena with a first chunk of initial_bytes; NULL (px_last_error set) when out of memory.  px_arena_free frees it and all it gave out. */
px_arena *px_arena_create(size_t initial_bytes);
void px_arena_free(px_arena *a);
/* Where an arena's chunks live: the functions that allocate a chunk (64-byte
 * aligned at least; NULL with px_last_error set when out of memory), free
 * it, zero bytes in it (px_arena_calloc) and move bytes within or between
 * chunks, the ranges possibly overlapping (px_arena_rewind_keep).  The CUDA
 * path gives device memory (px_cuda_arena_create); the arena itself never
 * touches the bytes. */
typedef struct px_arena_mem {
  void *(*alloc)(size_t bytes);
  void (*free)(void *p);
  void (*zero)(void *p, size_t bytes);
  void (*move)(void *dst, const void *src, size_t bytes);
} px_arena_mem;
/* px_arena_create with chunks from `mem` (NULL: host memory, as
 * px_arena_create).  `mem` must outlive the arena (a static table). */
px_arena *px_arena_create_with(size_t initial_bytes, const px_arena_mem *mem);
/* NULL (with px_last_error set) only if the system is out of memory. */
void *px_arena_alloc(px_arena *a, size_t bytes);
/* Zero-filled variant. */
void *px_arena_calloc(px_arena *a, size_t bytes);
void px_arena_reset(px_arena *a);
size_t px_arena_used(const px_arena *a);
size_t px_arena_capacity(const px_arena *a);
/* Most bytes handed out between two resets so far (what a step needs). */
size_t px_arena_high_water(const px_arena *a);
/* Marks: release what was allocated since a point of the step, so that a
 * recomputed region of the model (nn.h, px_checkpoint) reuses the same
 * bytes.  A mark is valid until the next reset or until a rewind to an
 * earlier mark. */
typedef struct px_arena_mark {
  void *chunk;
  size_t used, total;
} px_arena_mark;
/* Where the arena is now, for px_arena_rewind. */
px_arena_mark px_arena_get_mark(const px_arena *a);
/* Release everything allocated since m: later allocations reuse it.  The
 * high-water mark keeps the peak. */
void px_arena_rewind(px_arena *a, px_arena_mark m);
/* Rewind to m but keep the `bytes` at p: if p was allocated since m they
 * are moved to the first allocation after m, and the new address is
 * returned; otherwise p is returned unchanged.  NULL only when the system
 * is out of memory (during the first steps, while the arena grows). */
void *px_arena_rewind_keep(px_arena *a, px_arena_mark m, void *p, size_t bytes);
/* Number of times the arena had to ask the system for memory; a training
 * loop in steady state keeps this constant. */
uint64_t px_arena_system_allocs(const px_arena *a);

/* ---- Counter-based RNG: Philox4x32-10 -----------------------------------
 * Random numbers are a pure function of (seed, counter), so any rank,
 * thread or worker can draw the numbers of element i of step s without
 * sharing state: reproducible whatever the parallel layout. */
void px_philox4x32(uint64_t seed, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]);

/* A sequential stream on top of Philox, for initialisation and shuffles. */
typedef struct px_rng {
  uint64_t seed;
  uint64_t stream;  /* independent streams of one seed */
  uint64_t counter; /* blocks of 4 words used so far */
  uint32_t buf[4];
  int left; /* words left in buf */
} px_rng;

/* A generator for (seed, stream); px_rng_u32 / px_rng_u64 draw uniform words. */
px_rng px_rng_make(uint64_t seed, uint64_t stream);
uint32_t px_rng_u32(px_rng *r);
uint64_t px_rng_u64(px_rng *r);
/* Uniform in [0, 1) with 24 bits (float) or 53 bits (double). */
float px_rng_uniform(px_rng *r);
double px_rng_uniform_f64(px_rng *r);
/* Standard normal (Box-Muller). */
float px_rng_normal(px_rng *r);
/* Uniform integer in [0, n). */
uint64_t px_rng_below(px_rng *r, uint64_t n);
/* u32 -> float in [0, 1), the mapping all plexus kernels use. */
static inline float px_u32_to_unit(uint32_t x) { return (float)(x >> 8) * (1.0f / 16777216.0f); }

/* ---- Element types ------------------------------------------------------
 * Here rather than in tensor.h because comm/ (which depends on base only)
 * moves typed buffers too. */
typedef enum px_dtype {
  PX_F32 = 0,
  PX_F64,
  PX_F16,
  PX_BF16,
  PX_I8,
  PX_I16,
  PX_I32,
  PX_I64,
  PX_U8,
  PX_U16,
  PX_U32,
  PX_U64,
  PX_BOOL,
  PX_DTYPE_COUNT
} px_dtype;

/* Bytes of one element of t. */
size_t px_dtype_size(px_dtype t);
/* Short name as in safetensors: "F32", "BF16", "I64", ... */
const char *px_dtype_name(px_dtype t);
/* Parse a safetensors dtype name; returns PX_OK or PX_ERR_FORMAT. */
px_status px_dtype_parse(const char *name, px_dtype *out);

/* ---- Files -----------------------------------------------------------------
 * Write to "<path>.tmp.<pid>", fsync, rename over path, fsync the directory:
 * a crash leaves the old file or the new one, never a torn one. */
px_status px_write_file_atomic(const char *path, const void *data, size_t n);

/* mkdir -p: create path and every missing parent.  An existing directory is
 * fine; an existing non-directory is PX_ERR_IO naming it.  `what` starts the
 * error message (NULL: "mkdir"); with `durable`, each directory created is
 * made durable in its parent (fsync), as before writing a checkpoint. */
px_status px_mkdir_p(const char *path, const char *what, bool durable);

/* ---- Clocks -------------------------------------------------------------- */
/* Monotonic seconds. */
double px_time_now(void);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
