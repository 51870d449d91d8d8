// bench_gemm: px_sgemm against OpenBLAS's cblas_sgemm on the shapes of
// plexus's models, the two alternated call by call in one process, so a
// busy minute weighs on both alike.  px_sgemm takes plexus's packed GEMM
// where it applies (tensor/gemm.c: AVX-512F + FMA, large enough shapes,
// PX_GEMM_PACKED not 0) and OpenBLAS otherwise; the "path" column says
// which.  Each line: the median of --rounds timings of --calls calls per
// side, GFLOP/s, and the ratio plexus/OpenBLAS (above 1: plexus faster).
//
//   bench_gemm [--threads N (1)] [--rounds R (7)] [--calls C (20)]
//
// A benchmark: it reports, it never fails on speed.
#include "plexus/plexus.h"
#include "tensor/blas.h"
#include "tensor/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct shape {
  const char *what;
  bool ta, tb;
  int M, N, K;
  float beta;
} shape;

// The MLP 1-256-512-256-1 at batch 1024 (forward y = x·Wᵀ, dx = dy·W,
// dW += dyᵀ·x), GPT-2's layers at 2048 tokens of width 256 (c_attn, c_fc,
// the tied head), the zoo CNN's 3136 -> 128 weight gradient at batch 64.
static const shape shapes[] = {
  {"mlp fwd 512<-256", false, true, 1024, 512, 256, 1.0f}, {"mlp fwd 256<-512", false, true, 1024, 256, 512, 1.0f},
  {"mlp dx 256<-512", false, false, 1024, 256, 512, 0.0f}, {"mlp dx 512<-256", false, false, 1024, 512, 256, 0.0f},
  {"mlp dW 512x256", true, false, 512, 256, 1024, 1.0f},   {"mlp dW 256x512", true, false, 256, 512, 1024, 1.0f},
  {"gpt c_attn fwd", false, false, 2048, 768, 256, 1.0f},  {"gpt c_fc dW", true, false, 256, 1024, 2048, 1.0f},
  {"gpt head logits", false, true, 2048, 8192, 256, 0.0f}, {"zoo dW 128x3136 (K 64)", true, false, 128, 3136, 64, 1.0f},
  {"mlp b16 dW (K 16)", true, false, 256, 512, 16, 1.0f},
};

static float *randoms(size_t n, uint64_t seed) {
  float *v = malloc(n * sizeof *v);
  px_rng r = px_rng_make(seed, 1);
  for (size_t i = 0; v && i < n; i++) v[i] = 2 * px_rng_uniform(&r) - 1;
  return v;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  int threads = 1, rounds = 7, calls = 20;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && strcmp(argv[i], "--threads") == 0) threads = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--rounds") == 0) rounds = atoi(argv[++i]);
    else if (i + 1 < argc && strcmp(argv[i], "--calls") == 0) calls = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_gemm [--threads N] [--rounds R] [--calls C]\n");
      return 2;
    }
  }
  if (threads < 1 || rounds < 1 || rounds > 99 || calls < 1) {
    fprintf(stderr, "bench_gemm: --threads, --rounds (<= 99) and --calls must be positive\n");
    return 2;
  }
  px_set_num_threads(threads);
  if (!px_blas.sgemm) {
    fprintf(stderr, "bench_gemm: OpenBLAS could not be loaded (%s): nothing to compare with\n", px_blas_info());
    return 1;
  }
  printf("# bench_gemm: %d thread(s), median of %d rounds of %d calls; %s\n", threads, rounds, calls, px_blas_info());
  printf("%-24s %5s %5s %5s %4s  %-9s %10s %10s %7s\n", "shape", "M", "N", "K", "op", "path", "plexus", "openblas",
         "ratio");
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    const shape *g = &shapes[s];
    const int lda = g->ta ? g->M : g->K, ldb = g->tb ? g->K : g->N;
    float *A = randoms((size_t)g->M * g->K, 1), *B = randoms((size_t)g->K * g->N, 2);
    float *C = randoms((size_t)g->M * g->N, 3);
    if (!A || !B || !C) {
      fprintf(stderr, "bench_gemm: out of memory\n");
      return 1;
    }
    double t[2][99];
    for (int r = 0; r < rounds + 1; r++)  // round 0 warms up both
      for (int side = 0; side < 2; side++) {
        const double t0 = px_time_now();
        for (int c = 0; c < calls; c++) {
          if (side == 0) px_sgemm(g->ta, g->tb, g->M, g->N, g->K, 1.0f, A, lda, B, ldb, g->beta, C, g->N);
          else
            px_blas.sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans, g->M,
                          g->N, g->K, 1.0f, A, lda, B, ldb, g->beta, C, g->N);
        }
        if (r > 0) t[side][r - 1] = (px_time_now() - t0) / calls;
      }
    qsort(t[0], (size_t)rounds, sizeof(double), cmp_double);
    qsort(t[1], (size_t)rounds, sizeof(double), cmp_double);
    const double flop = 2.0 * g->M * g->N * g->K, p = t[0][rounds / 2], o = t[1][rounds / 2];
    const bool packed = px_sgemm_takes_packed(g->M, g->N, g->K);
    printf("%-24s %5d %5d %5d %c%c%s  %-9s %7.1f GF %7.1f GF %6.2fx\n", g->what, g->M, g->N, g->K, g->ta ? 'T' : 'N',
           g->tb ? 'T' : 'N', g->beta != 0.0f ? "+C" : "  ", packed ? "packed" : "openblas", flop / p * 1e-9,
           flop / o * 1e-9, o / p);
    free(A);
    free(B);
    free(C);
  }
  return 0;
}
