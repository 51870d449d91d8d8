/* bench/membw_read_vs_copy.c — why a reduce-scatter cannot reach the
 * threads backend's copy bound on a machine whose memory reads cost more
 * than its non-temporal writes.  Two threads at once, buffers of B =
 * 256 MiB each, 7 rounds with the kinds alternating (reversed in odd
 * rounds); prints each kind's median and fastest round (the slower
 * thread's time):
 *   memcpy 3/4 B               the copy bound of a 2-rank reduce-scatter
 *                              (bench_comm.c: (N+1)/(2N) of B)
 *   read B                     only the reads a 2-rank reduce-scatter makes
 *   NT write B/2               only its (non-temporal) writes
 *   read B + NT write B/2      the simplest reduce-scatter loop
 *   read B 4-page interleaved  the reads, four pages at once (as glibc's
 *                              large memcpy reads, and threads_reduce.c's lanes)
 * Built with the benches (build/membw_read_vs_copy); a benchmark, not a
 * test.  docs/PERFORMANCE.md ("Threads all-gather and reduce-scatter") has
 * runs. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define B ((size_t)256 << 20)
#define KINDS 5
#define ROUNDS 7

static const char *const names[KINDS] = {"memcpy 3/4 B", "read B", "NT write B/2", "read B + NT write B/2",
                                         "read B 4-page interleaved"};

typedef struct buffers {
  float *a, *b, *d;
} buffers;

static buffers bufs[2];
static int kind;
static pthread_barrier_t start;
static double took[2];
static volatile float sink;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#if defined(__SSE2__)
static void run_kind(const buffers *x) {
  const size_t n = B / sizeof(float);
  if (kind == 0) {
    memcpy(x->d, x->a, B * 3 / 4);
  } else if (kind == 1) {
    __m128 s = _mm_setzero_ps();
    for (size_t i = 0; i < n; i += 4) s = _mm_add_ps(s, _mm_loadu_ps(x->a + i));
    sink = _mm_cvtss_f32(s);
  } else if (kind == 2) {
    const __m128 one = _mm_set1_ps(1);
    for (size_t i = 0; i < n / 2; i += 4) _mm_stream_ps(x->d + i, one);
    _mm_sfence();
  } else if (kind == 3) {
    for (size_t i = 0; i < n / 2; i += 4)
      _mm_stream_ps(x->d + i, _mm_add_ps(_mm_loadu_ps(x->a + i), _mm_loadu_ps(x->b + i)));
    _mm_sfence();
  } else {
    // Four pages (4 KiB: 1024 floats) at once, 64 bytes of each a step,
    // the group after next prefetched.
    __m128 s0 = _mm_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t pg = 0; pg < n; pg += 4096)
      for (size_t i = 0; i < 1024; i += 16) {
        const float *q = x->a + pg + i;
        for (int k = 0; k < 4; k++) __builtin_prefetch(q + 1024 * k + 8192, 0, 3);
        for (int j = 0; j < 16; j += 4) {
          s0 = _mm_add_ps(s0, _mm_loadu_ps(q + j));
          s1 = _mm_add_ps(s1, _mm_loadu_ps(q + 1024 + j));
          s2 = _mm_add_ps(s2, _mm_loadu_ps(q + 2048 + j));
          s3 = _mm_add_ps(s3, _mm_loadu_ps(q + 3072 + j));
        }
      }
    sink = _mm_cvtss_f32(_mm_add_ps(_mm_add_ps(s0, s1), _mm_add_ps(s2, s3)));
  }
}
#endif

static void *thread_main(void *arg) {
  int r = (int)(long)arg;
  pthread_barrier_wait(&start);
  double t0 = now();
#if defined(__SSE2__)
  run_kind(&bufs[r]);
#endif
  took[r] = now() - t0;
  return NULL;
}

static int by_value(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

int main(void) {
#if !defined(__SSE2__)
  fprintf(stderr, "membw_read_vs_copy: needs SSE2\n");
  return 1;
#else
  for (int r = 0; r < 2; r++) {
    bufs[r] = (buffers){malloc(B), malloc(B), malloc(B)};
    if (!bufs[r].a || !bufs[r].b || !bufs[r].d) {
      fprintf(stderr, "membw_read_vs_copy: out of memory\n");
      return 1;
    }
    memset(bufs[r].a, 1, B), memset(bufs[r].b, 1, B), memset(bufs[r].d, 1, B);
  }
  pthread_barrier_init(&start, NULL, 2);
  double t[KINDS][ROUNDS];
  for (int round = 0; round < ROUNDS; round++)
    for (int k = 0; k < KINDS; k++) {
      kind = round % 2 ? KINDS - 1 - k : k;
      pthread_t th[2];
      for (long r = 0; r < 2; r++) pthread_create(&th[r], NULL, thread_main, (void *)r);
      for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
      t[kind][round] = took[0] > took[1] ? took[0] : took[1];
    }
  for (int k = 0; k < KINDS; k++) {
    qsort(t[k], ROUNDS, sizeof t[k][0], by_value);
    printf("%-26s median %6.1f ms  fastest %6.1f ms\n", names[k], 1e3 * t[k][ROUNDS / 2], 1e3 * t[k][0]);
  }
  return 0;
#endif
}
