// bench_kernels: the hot loops of plexus's own code (not OpenBLAS's), one
// line each: elementwise ops and reductions, the SGD and AdamW steps,
// causal attention, softmax, cross-entropy, layer norm, GELU and the plain
// C GEMM that runs when OpenBLAS cannot be loaded.  Each kernel runs for
// about --seconds; the line gives the best time of one call in
// microseconds, as CPU time of the calling thread (one thread: OpenMP's
// regions run on it), which other processes on a loaded machine disturb
// far less than wall time.
//
//   bench_kernels [--threads N (1)] [--seconds S (0.3)] [--only NAME]
//
// bench/run_kernels.sh runs two builds alternately (-march=native against
// the portable default with run-time clones) and prints their ratio.
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "plexus/plexus.h"
#include "tensor/blas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double seconds = 0.3;
static const char *only = NULL;

typedef void (*kernel_fn)(void *arg);

static double thread_cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run(const char *name, kernel_fn fn, void *arg) {
  if (only && !strstr(name, only)) return;
  fn(arg);  // warm-up: page faults, OpenMP pool
  double best = 1e30, t_end = px_time_now() + seconds;
  int calls = 0;
  while (calls < 3 || px_time_now() < t_end) {
    double t0 = thread_cpu_seconds();
    fn(arg);
    double dt = thread_cpu_seconds() - t0;
    if (dt < best) best = dt;
    calls++;
  }
  printf("%-22s %12.1f us cpu  (%d calls)\n", name, best * 1e6, calls);
  fflush(stdout);
}

#define N_ELEM (4u << 20)
static float *va, *vb, *vc;
static volatile double sink;

static void randn(px_rng *r, float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = px_rng_normal(r);
}

// Elementwise kernels and reductions on 32K floats (three arrays fit in L2,
// so the figure is the loop's, not the memory bus's, which other processes
// share), 64 calls a sample.
#define N_SMALL (32u << 10)
#define REPS 64
#define ELEMENTWISE(name, call)          \
  static void name(void *u) {            \
    (void)u;                             \
    for (int r = 0; r < REPS; r++) call; \
  }
ELEMENTWISE(k_axpy, px_axpy(vc, va, N_SMALL, 0.5f))
ELEMENTWISE(k_add, px_add(vc, va, vb, N_SMALL))
ELEMENTWISE(k_mul, px_mul(vc, va, vb, N_SMALL))
ELEMENTWISE(k_scale, px_scale(vc, N_SMALL, 0.999f))
ELEMENTWISE(k_fill, px_fill(vc, N_SMALL, 1.0f))
ELEMENTWISE(k_sum, sink = px_sum(va, N_SMALL))
ELEMENTWISE(k_dot, sink = px_dot(va, vb, N_SMALL))
ELEMENTWISE(k_sumsq, sink = px_sumsq(va, N_SMALL))
ELEMENTWISE(k_max_abs, sink = px_max_abs(va, N_SMALL))

static void k_optim(void *u) {
  if (px_optim_step((px_optim *)u) != PX_OK) abort();
}

typedef struct mod_case {
  px_model *model;
  px_tensor x, y, dy;
  bool backward;
} mod_case;

static void k_module(void *u) {
  mod_case *c = u;
  if (px_model_forward(c->model, &c->x, &c->y) != PX_OK) abort();
  if (c->backward && px_model_backward(c->model, &c->dy, NULL) != PX_OK) abort();
}

static void module_case(const char *name, px_module *root, int ndim, const int64_t *shape, bool backward) {
  mod_case c = {.backward = backward};
  if (px_model_create(&c.model, root, 1) != PX_OK) {
    fprintf(stderr, "%s: %s\n", name, px_last_error());
    exit(1);
  }
  if (px_tensor_new(&c.x, PX_F32, ndim, shape) != PX_OK || px_tensor_new(&c.dy, PX_F32, ndim, shape) != PX_OK) exit(1);
  px_rng rng = px_rng_make(7, 0);
  randn(&rng, px_f32(&c.x), (size_t)px_tensor_numel(&c.x));
  randn(&rng, px_f32(&c.dy), (size_t)px_tensor_numel(&c.dy));
  px_model_train(c.model, true);
  run(name, k_module, &c);
  px_tensor_free(&c.x);
  px_tensor_free(&c.dy);
  px_model_free(c.model);
}

typedef struct ce_case {
  px_tensor logits;
  int32_t *targets;
  float *dlogits;
} ce_case;

static void k_ce(void *u) {
  ce_case *c = u;
  float loss;
  if (px_cross_entropy_loss(&c->logits, c->targets, NULL, &loss, c->dlogits) != PX_OK) abort();
  sink = loss;
}

typedef struct gemm_case {
  int n;
  float *A, *B, *C;
} gemm_case;

static void k_gemm_plain(void *u) {
  gemm_case *g = u;
  px_sgemm(false, true, g->n, g->n, g->n, 1.0f, g->A, g->n, g->B, g->n, 0.0f, g->C, g->n);
}

int main(int argc, char **argv) {
  int threads = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) seconds = atof(argv[++i]);
    else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
    else {
      fprintf(stderr, "usage: bench_kernels [--threads N] [--seconds S] [--only NAME]\n");
      return 2;
    }
  }
  px_set_num_threads(threads);
  printf("# bench_kernels: %d thread(s); plexus kernels: %s\n", threads, px_kernel_info());

  va = malloc(N_ELEM * sizeof(float));
  vb = malloc(N_ELEM * sizeof(float));
  vc = malloc(N_ELEM * sizeof(float));
  if (!va || !vb || !vc) return 1;
  px_rng rng = px_rng_make(1, 0);
  randn(&rng, va, N_ELEM);
  randn(&rng, vb, N_ELEM);
  px_fill(vc, N_ELEM, 1.0f);
  run("axpy 32Kx64", k_axpy, NULL);
  run("add 32Kx64", k_add, NULL);
  run("mul 32Kx64", k_mul, NULL);
  run("scale 32Kx64", k_scale, NULL);
  run("fill 32Kx64", k_fill, NULL);
  run("sum 32Kx64", k_sum, NULL);
  run("dot 32Kx64", k_dot, NULL);
  run("sumsq 32Kx64", k_sumsq, NULL);
  run("max_abs 32Kx64", k_max_abs, NULL);

  // Optimizer steps on 4M parameters (gradients va, parameters vc).
  for (int kind = 0; kind < 2; kind++) {
    px_optim_opts o = kind ? px_adamw_defaults(1e-3f) : px_sgd_defaults(1e-2f);
    if (!kind) o.momentum = 0.9f;
    px_optim *opt;
    if (px_optim_create(&opt, vc, va, N_ELEM, &o) != PX_OK) {
      fprintf(stderr, "%s\n", px_last_error());
      return 1;
    }
    run(kind ? "adamw step 4M" : "sgd momentum step 4M", k_optim, opt);
    px_optim_free(opt);
  }

  // Modules, forward + backward, batch of 8.
  const int64_t seq[3] = {8, 256, 256};  // attention: T 256, C 256, 4 heads
  module_case("attention fwd+bwd", px_causal_self_attention(256, 4, 0.0f, 0.0f), 3, seq, true);
  const int64_t rows[2] = {2048, 768};
  module_case("layernorm fwd+bwd", px_layernorm(768, 1e-5f), 2, rows, true);
  module_case("gelu(tanh) fwd+bwd", px_gelu(true), 2, rows, true);
  const int64_t sm[2] = {2048, 1024};
  module_case("softmax fwd+bwd", px_softmax(), 2, sm, true);

  // Cross-entropy with gradient, 512 rows of 8192 classes.
  ce_case ce = {0};
  const int64_t ls[2] = {512, 8192};
  if (px_tensor_new(&ce.logits, PX_F32, 2, ls) != PX_OK) return 1;
  randn(&rng, px_f32(&ce.logits), (size_t)px_tensor_numel(&ce.logits));
  ce.targets = malloc(512 * sizeof(int32_t));
  ce.dlogits = malloc((size_t)512 * 8192 * sizeof(float));
  for (int i = 0; i < 512; i++) ce.targets[i] = (int32_t)((i * 7919) % 8192);
  run("cross_entropy 512x8192", k_ce, &ce);
  free(ce.targets);
  free(ce.dlogits);
  px_tensor_free(&ce.logits);

  // The plain C GEMM (what runs without OpenBLAS): 192³, B transposed.
  gemm_case g = {.n = 192};
  g.A = va;
  g.B = vb;
  g.C = vc;
  px_sgemm_fn saved = px_blas.sgemm;
  px_blas.sgemm = NULL;
  run("sgemm plain C 192^3", k_gemm_plain, &g);
  px_blas.sgemm = saved;

  free(va);
  free(vb);
  free(vc);
  return 0;
}
