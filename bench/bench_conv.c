/* bench_conv.c — one 3x3 convolution layer of plexus, forward and backward,
 * to compare with PyTorch.
 *
 *   bench_conv [--threads N] [--seconds S] [--batch B] [--case C,O,H,W,stride]...
 *   bench_conv --info      (one line: the 3x3 kernels this CPU runs, for the record)
 *
 * Each case is a model of one layer, px_conv2d(C, O, 3, stride, 1, false)
 * (no bias), on x of (B, C, H, W); y and dy are (B, O, Ho, Wo), Ho =
 * (H - 1) / stride + 1.  Two passes are timed apart:
 *
 *   forward:   y = W ⋆ x                       px_model_forward
 *   backward:  dx = Wᵀ ⋆ dy,  dW += dy ⋆ x     px_model_backward after one forward
 *
 * The backward pass always computes dx, also for a layer that would be a
 * network's first (where a training step needs none).  Two untimed
 * forward + backward steps warm up (the step arena reaches its size and
 * merges into one block, the OpenMP pool and the caches settle); then each
 * pass is called repeatedly for about S seconds (at least MIN_CALLS times),
 * and the line reports the MEDIAN wall time of one call.
 * Between timed backward calls the step arena is rewound to where it stood
 * after the forward (dy in it), so every call reuses the same memory as a
 * training step does; the gradients accumulate, as backward does in a
 * training step.
 *
 * prints one line per case and pass, which bench/run_conv.sh parses:
 *
 *   plexus conv C=16 O=16 H=32 W=32 stride=1 batch=64 threads=1 pass=forward ms=1.234 gflops=123.4 kernel=...
 *
 * gflops = 2·B·C·O·9·Ho·Wo / time for forward (multiply and add of every
 * tap, the padding's taps counted as PyTorch's convention does), twice that
 * for backward (dx and dW).  kernel= ends the line (it may hold spaces):
 * "winograd f(4x4,3x3)", "direct 3x3" or "im2col+gemm", as kernel_of
 * below repeats src/nn/conv2d.c's rules; the header line "plexus conv
 * kernels:" names the copy of the kernels (px_conv_kernel_info).  The
 * library itself reads PX_CONV_ISA (base|avx2|avx512), PX_CONV_DIRECT and
 * PX_CONV_WINOGRAD; this program only reports them.
 *
 * Default cases: ResNet-20's 3x3 layers (16,16,32,32,1), (32,32,16,16,1),
 * (64,64,8,8,1) and its stride-2 ones (16,32,32,32,2), (32,64,16,16,2); the
 * zoo CNN's (1,32,28,28,1), (32,64,14,14,1).  Any --case replaces them.
 * x and dy are uniform in [-1, 1] from fixed seeds.  bench/bench_conv_torch.py
 * times the same layers with PyTorch; bench/run_conv.sh runs both side by
 * side.  This is a benchmark, not a test: it never fails on speed. */
#include <plexus/plexus.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_CALLS 5
#define MAX_CASES 64

typedef struct conv_case {
  int C, O, H, W, stride;
} conv_case;

static const conv_case default_cases[] = {
  {16, 16, 32, 32, 1}, {32, 32, 16, 16, 1}, {64, 64, 8, 8, 1},  // ResNet-20, stride 1
  {16, 32, 32, 32, 2}, {32, 64, 16, 16, 2},                     // ResNet-20, stride 2
  {1, 32, 28, 28, 1},  {32, 64, 14, 14, 1},                     // the zoo's CNN
};

typedef struct bench_opts {
  int threads;
  double seconds; /* timed budget of each case and pass */
  int batch;
  int n_cases;
  conv_case cases[MAX_CASES];
} bench_opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_conv [--threads N] [--seconds S] [--batch B] [--case C,O,H,W,stride]...\n"
          "       bench_conv --info\n"
          "  Times one 3x3 convolution layer (padding 1, no bias) of plexus, forward and backward\n"
          "  (dx + dW), each for about S seconds (default 0.5) after a warm-up call, and prints the\n"
          "  median time of one call.  Defaults: 1 thread, batch 64, ResNet-20's and the zoo CNN's\n"
          "  layers; each --case adds a layer and replaces the defaults.\n"
          "  Environment (read by the library): PX_CONV_ISA=base|avx2|avx512, PX_CONV_DIRECT=0|1.\n");
}

/* A whole decimal integer >= 1, or -1. */
static int parse_count(const char *s) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < 1 || v > 1000000) return -1;
  return (int)v;
}

/* "C,O,H,W,stride" → *c; -1 if it is not five integers >= 1. */
static int parse_case(const char *s, conv_case *c) {
  int v[5];
  const char *p = s;
  for (int k = 0; k < 5; k++) {
    char *end;
    errno = 0;
    long x = strtol(p, &end, 10);
    if (errno || end == p || x < 1 || x > 100000) return -1;
    if (k < 4 ? *end != ',' : *end != '\0') return -1;
    v[k] = (int)x;
    p = end + 1;
  }
  *c = (conv_case){v[0], v[1], v[2], v[3], v[4]};
  return 0;
}

static int parse_args(int argc, char **argv, bench_opts *o) {
  *o = (bench_opts){.threads = 1, .seconds = 0.5, .batch = 64};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      exit(0);
    }
    if (strcmp(a, "--info") == 0) {
      printf("plexus conv kernels: %s\n", px_conv_kernel_info());
      exit(0);
    }
    if (strcmp(a, "--threads") && strcmp(a, "--seconds") && strcmp(a, "--batch") && strcmp(a, "--case")) {
      fprintf(stderr, "bench_conv: unknown option \"%s\"\n", a);
      usage(stderr);
      return -1;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "bench_conv: %s needs a value\n", a);
      return -1;
    }
    const char *v = argv[++i];
    if (strcmp(a, "--threads") == 0) {
      if ((o->threads = parse_count(v)) < 0) {
        fprintf(stderr, "bench_conv: --threads is a thread count >= 1, not \"%s\"\n", v);
        return -1;
      }
    } else if (strcmp(a, "--batch") == 0) {
      if ((o->batch = parse_count(v)) < 0) {
        fprintf(stderr, "bench_conv: --batch is a batch size >= 1, not \"%s\"\n", v);
        return -1;
      }
    } else if (strcmp(a, "--seconds") == 0) {
      char *end;
      errno = 0;
      o->seconds = strtod(v, &end);
      if (errno || end == v || *end || !(o->seconds > 0 && o->seconds <= 3600)) {
        fprintf(stderr, "bench_conv: --seconds is a time in seconds, > 0 and <= 3600, not \"%s\"\n", v);
        return -1;
      }
    } else {  // --case
      if (o->n_cases == MAX_CASES) {
        fprintf(stderr, "bench_conv: at most %d --case options\n", MAX_CASES);
        return -1;
      }
      if (parse_case(v, &o->cases[o->n_cases]) != 0) {
        fprintf(stderr,
                "bench_conv: --case is C,O,H,W,stride: in and out channels, height, width, stride,\n"
                "  five integers >= 1 (e.g. 16,16,32,32,1), not \"%s\"\n",
                v);
        return -1;
      }
      o->n_cases++;
    }
  }
  // The library ignores a PX_CONV_ISA it does not know; a measurement
  // labelled with it would be of the default kernels.
  const char *isa = getenv("PX_CONV_ISA");
  if (isa && strcmp(isa, "base") && strcmp(isa, "avx2") && strcmp(isa, "avx512")) {
    fprintf(stderr, "bench_conv: PX_CONV_ISA is base, avx2 or avx512 (or unset), not \"%s\"\n", isa);
    return -1;
  }
  if (o->n_cases == 0) {
    o->n_cases = (int)(sizeof default_cases / sizeof default_cases[0]);
    memcpy(o->cases, default_cases, sizeof default_cases);
  }
  return 0;
}

/* What the layer runs in the given pass, as src/nn/conv2d.c's use_direct,
 * use_winograd, use_winograd_dx and use_winograd_dw decide it (repeated
 * here to label the line): 3x3 stride-1 and stride-2 layers take the
 * direct kernels where they run at full speed (every width with 16-float
 * vectors, up to 64 channels with 8-float ones; all of them with
 * PX_CONV_DIRECT=1, none with =0), else im2col + GEMM; of those, stride-1
 * layers of at least 16 channels in and out on planes of at least 14x14
 * take Winograd for the forward, for dx where O <= C, and for dW where
 * C + O <= 256 (PX_CONV_WINOGRAD=0: none, =1: every stride-1 direct layer,
 * every pass).  px_conv_kernel_info says which copy
 * of the kernels. */
static const char *kernel_of(const conv_case *c, bool backward) {
  const char *info = px_conv_kernel_info();
  const bool fast = strncmp(info, "direct", 6) == 0, wide = strstr(info, "avx512") != NULL;
  const char *e = getenv("PX_CONV_DIRECT");
  bool direct = fast && (c->stride == 1 || c->stride == 2) && (wide || (c->C <= 64 && c->O <= 64));
  if (e && strcmp(e, "0") == 0) direct = false;
  if (e && strcmp(e, "1") == 0) direct = c->stride == 1 || c->stride == 2;
  if (!direct) return "im2col+gemm";
  const char *w = getenv("PX_CONV_WINOGRAD");
  bool w4 = c->stride == 1 && c->C >= 16 && c->O >= 16 && c->H >= 14 && c->W >= 14;
  if (w && strcmp(w, "0") == 0) w4 = false;
  if (w && strcmp(w, "1") == 0) w4 = c->stride == 1;
  const bool all = w && strcmp(w, "1") == 0;
  const bool w4dx = w4 && (c->O <= c->C || all);
  const bool w4dw = w4 && (c->C + c->O <= 256 || all);
  if (!backward) return w4 ? "winograd f(4x4,3x3)" : "direct 3x3";
  if (w4dx && w4dw) return "winograd f(4x4,3x3)";
  if (w4dx) return "dx winograd f(4x4,3x3), dW direct 3x3";
  return w4dw ? "dx direct 3x3, dW winograd f(4x4,3x3)" : "direct 3x3";
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Seconds of each call, grown as needed; the median at the end. */
typedef struct samples {
  double *t;
  size_t n, cap;
} samples;

static int samples_push(samples *s, double v) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 256;
    double *t = realloc(s->t, cap * sizeof *t);
    if (!t) return -1;
    s->t = t;
    s->cap = cap;
  }
  s->t[s->n++] = v;
  return 0;
}

static double samples_median(samples *s) {
  qsort(s->t, s->n, sizeof *s->t, cmp_double);
  return s->n % 2 ? s->t[s->n / 2] : 0.5 * (s->t[s->n / 2 - 1] + s->t[s->n / 2]);
}

static void fill(float *v, size_t n, uint64_t seed) {
  px_rng r = px_rng_make(seed, 0);
  for (size_t i = 0; i < n; i++) v[i] = 2.0f * px_rng_uniform(&r) - 1.0f;
}

/* The median seconds of one forward (*tf) and one backward (*tb) call;
 * *what names the step that failed. */
static px_status time_passes(px_model *md, const bench_opts *o, const px_tensor *xt, const float *dyv, size_t ny,
                             samples *fwd, samples *bwd, double *tf, double *tb, const char **what) {
  px_tensor y, dx, dyt;
  px_status st;
  // Warm-up: a whole step twice, so that the arena's reset merges what it
  // grew into one block and the timed calls allocate nothing.
  for (int k = 0; k < 2; k++) {
    *what = "forward";
    if ((st = px_model_forward(md, xt, &y)) != PX_OK) return st;
    *what = "backward";
    dyt = y;  // dy: (B, O, Ho, Wo) from the arena, as a loss gradient is
    if (!(dyt.data = px_model_scratch(md, ny))) return PX_ERR_NOMEM;
    memcpy(dyt.data, dyv, ny * sizeof *dyv);
    px_model_zero_grad(md);
    if ((st = px_model_backward(md, &dyt, &dx)) != PX_OK) return st;
  }

  // (a) forward alone.
  *what = "forward";
  double t0 = px_time_now(), now = t0;
  while (fwd->n < MIN_CALLS || now - t0 < o->seconds) {
    const double s = px_time_now();
    if ((st = px_model_forward(md, xt, &y)) != PX_OK) return st;
    now = px_time_now();
    if (samples_push(fwd, now - s) != 0) return px_error(PX_ERR_NOMEM, "bench_conv: out of memory for the timings");
  }

  // (b) backward alone (dx and dW), after one forward; the arena rewound to
  // where it stood after that forward (dy in it) before each call.
  if ((st = px_model_forward(md, xt, &y)) != PX_OK) return st;
  *what = "backward";
  dyt = y;
  if (!(dyt.data = px_model_scratch(md, ny))) return PX_ERR_NOMEM;
  memcpy(dyt.data, dyv, ny * sizeof *dyv);
  px_model_zero_grad(md);
  const px_arena_mark mark = px_arena_get_mark(md->arena);
  const uint64_t allocs = px_arena_system_allocs(md->arena);
  t0 = now = px_time_now();
  while (bwd->n < MIN_CALLS || now - t0 < o->seconds) {
    px_arena_rewind(md->arena, mark);
    const double s = px_time_now();
    if ((st = px_model_backward(md, &dyt, &dx)) != PX_OK) return st;
    now = px_time_now();
    if (samples_push(bwd, now - s) != 0) return px_error(PX_ERR_NOMEM, "bench_conv: out of memory for the timings");
  }
  if (px_arena_system_allocs(md->arena) != allocs)
    fprintf(stderr, "bench_conv: NOTE the arena grew during the timed backward calls\n");
  *tf = samples_median(fwd);
  *tb = samples_median(bwd);
  return PX_OK;
}

/* Forward then backward of one layer; prints their two lines. */
static int bench_case(const bench_opts *o, const conv_case *c, int ci) {
  const int B = o->batch, Ho = (c->H - 1) / c->stride + 1, Wo = (c->W - 1) / c->stride + 1;
  const size_t nx = (size_t)B * c->C * c->H * c->W, ny = (size_t)B * c->O * Ho * Wo;
  const double flops = 2.0 * B * c->C * c->O * 9.0 * Ho * Wo;  // forward; backward twice that
  float *x = malloc(nx * sizeof *x);                           // (B, C, H, W)
  float *dyv = malloc(ny * sizeof *dyv);                       // (B, O, Ho, Wo)
  if (!x || !dyv) {
    fprintf(stderr, "bench_conv: out of memory for case %d,%d,%d,%d,%d\n", c->C, c->O, c->H, c->W, c->stride);
    free(x);
    free(dyv);
    return 1;
  }
  fill(x, nx, 100 + (uint64_t)ci);
  fill(dyv, ny, 200 + (uint64_t)ci);
  samples fwd = {0}, bwd = {0};
  double tf = 0, tb = 0;
  const char *what = "model";
  px_model *md = NULL;
  px_status st = px_model_create(&md, px_conv2d(c->C, c->O, 3, c->stride, 1, /*bias=*/false), 11 + (uint64_t)ci);
  if (st == PX_OK) {
    const px_tensor xt = px_tensor_f32(x, 4, B, c->C, c->H, c->W);
    st = time_passes(md, o, &xt, dyv, ny, &fwd, &bwd, &tf, &tb, &what);
  }
  if (st == PX_OK) {
    const char *kernel[2] = {kernel_of(c, false), kernel_of(c, true)};
    const char *pass[2] = {"forward", "backward"};
    const double t[2] = {tf, tb}, f[2] = {flops, 2.0 * flops};
    for (int k = 0; k < 2; k++)
      printf("plexus conv C=%d O=%d H=%d W=%d stride=%d batch=%d threads=%d pass=%s ms=%.3f gflops=%.1f kernel=%s\n",
             c->C, c->O, c->H, c->W, c->stride, B, px_get_num_threads(), pass[k], 1e3 * t[k], f[k] / t[k] * 1e-9,
             kernel[k]);
    fflush(stdout);
  } else {
    fprintf(stderr, "bench_conv: case %d,%d,%d,%d,%d: %s: %s (%s)\n", c->C, c->O, c->H, c->W, c->stride, what,
            px_last_error(), px_status_name(st));
  }
  px_model_free(md);
  free(fwd.t);
  free(bwd.t);
  free(x);
  free(dyv);
  return st == PX_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  bench_opts o;
  if (parse_args(argc, argv, &o) != 0) return 2;
  px_set_num_threads(o.threads);
  for (int ci = 0; ci < o.n_cases; ci++)
    if (bench_case(&o, &o.cases[ci], ci) != 0) return 1;
  return 0;
}
