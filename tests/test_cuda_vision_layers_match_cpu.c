/* Claim: on the GPU, Conv2d (any kernel, stride, padding, with and without
 * bias; f32 and bf16 GEMMs), BatchNorm (2-d and 1-d input, training with
 * batch statistics and the running-statistics update, eval with running
 * statistics), MaxPool2d (plain and padded, with ties), AvgPool2d and the
 * global average pool compute what the CPU modules compute with the same
 * weights: the output, dx, every parameter gradient (added onto nonzero
 * gradients, so += is checked) and the running statistics, within f32
 * 1e-5 (bf16 convolution: 1e-2; max and avg pools: the same bits), and
 * two GPU runs give the same bits.
 * Shapes are random (odd H and W, stride 2, padding); convolutions run in
 * one chunk of samples and in chunks of 2 (PX_CUDA_CONV_CHUNK).
 *
 * Tolerance: per tensor, max |gpu - cpu| / max |cpu| (normwise: an
 * element that cancels to near 0 is judged against the tensor's scale).
 *
 * If this fails, that layer's CUDA kernel is wrong (an index in im2col or
 * the gather col2im, a tie broken differently, a missing term of batch
 * norm's dx, a running update with the biased variance), and a CNN trained
 * with --device cuda diverges from the CPU run.
 *
 * Exits 77 (ctest's skip code) where there is no CUDA device. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include "px_test.h"
#include "tensor/cuda/px_cuda.h"

#include <stdint.h>
#include <string.h>

enum { DT_F32, DT_BF16 };

static void fill(float *x, size_t n, uint64_t seed, float lo, float hi) {
  px_rng r = px_rng_make(seed, 77);
  for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * px_rng_uniform(&r);
}

/* Small integers: many equal values in a pooling window (ties). */
static void fill_ties(float *x, size_t n, uint64_t seed) {
  px_rng r = px_rng_make(seed, 78);
  for (size_t i = 0; i < n; i++) x[i] = (float)px_rng_below(&r, 4);
}

/* max |a - b| / max |b| <= tol */
static void compare(const char *label, const char *what, const float *gpu, const float *cpu, size_t n, double tol) {
  double diff = 0.0, scale = 0.0;
  size_t worst = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs((double)gpu[i] - (double)cpu[i]);
    if (!(d <= diff)) {
      diff = d;
      worst = i;
    }
    if (fabs((double)cpu[i]) > scale) scale = fabs((double)cpu[i]);
  }
  const double rel = diff / (scale > 0 ? scale : 1.0);
  CHECK(rel <= tol, "%s: %s differs: max |gpu - cpu| / max |cpu| = %.3g > %.3g (at %zu: gpu %.9g cpu %.9g)", label,
        what, rel, tol, worst, n ? (double)gpu[worst] : 0.0, n ? (double)cpu[worst] : 0.0);
}

/* What one GPU run produced, on the host. */
typedef struct run_out {
  float *y, *dx, *grad, *buf;
  size_t ny, nx, ngrad, nbuf;
} run_out;

static void run_out_free(run_out *o) {
  free(o->y);
  free(o->dx);
  free(o->grad);
  free(o->buf);
}

static float *to_host(const float *d, size_t n) {
  float *h = malloc((n ? n : 1) * sizeof *h);
  if (n) CHECK_OK(px_cuda_to_host(h, d, n * sizeof *h));
  return h;
}

static void *dev_copy(const void *host, size_t bytes) {
  void *d = px_cuda_malloc(bytes ? bytes : 4);
  if (!d) {
    fprintf(stderr, "px_cuda_malloc: %s\n", px_last_error());
    exit(1);
  }
  if (bytes) CHECK_OK(px_cuda_to_device(d, host, bytes));
  return d;
}

/* One forward and backward of the model (moved to the GPU by
 * px_model_to_device) from the given starting gradients and buffers (set
 * first, so two runs start alike). */
static void gpu_run(px_model *md, const float *x, const int64_t *xshape, int xdim, const float *dy, const float *grad0,
                    const float *buf0, run_out *o) {
  if (md->n_param_elems) CHECK_OK(px_cuda_to_device(md->grad_data, grad0, md->n_param_elems * sizeof(float)));
  if (md->n_buffer_elems) CHECK_OK(px_cuda_to_device(md->buffer_data, buf0, md->n_buffer_elems * sizeof(float)));
  px_tensor xt = px_tensor_view(NULL, PX_F32, xdim, xshape);
  xt.device = PX_CUDA;
  o->nx = (size_t)px_tensor_numel(&xt);
  xt.data = dev_copy(x, o->nx * sizeof(float));
  px_tensor y, dx;
  CHECK_OK(px_model_forward(md, &xt, &y));
  CHECK(y.device == PX_CUDA, "forward's output is not on the device");
  o->ny = (size_t)px_tensor_numel(&y);
  px_tensor dyt = y;
  dyt.data = px_model_scratch(md, o->ny);
  CHECK(dyt.data != NULL, "px_model_scratch: %s", px_last_error());
  CHECK_OK(px_cuda_to_device(dyt.data, dy, o->ny * sizeof(float)));
  CHECK_OK(px_model_backward(md, &dyt, &dx));
  CHECK(dx.device == PX_CUDA, "backward's dx is not on the device");
  CHECK_OK(px_cuda_sync());
  o->y = to_host(y.data, o->ny);
  o->dx = to_host(dx.data, o->nx);
  o->ngrad = md->n_param_elems;
  o->nbuf = md->n_buffer_elems;
  o->grad = to_host(md->grad_data, o->ngrad);
  o->buf = to_host(md->buffer_data, o->nbuf);
  px_cuda_free(xt.data);
}

static bool same_bits(const float *a, const float *b, size_t n) { return n == 0 || memcmp(a, b, n * sizeof *a) == 0; }

typedef px_module *(*make_fn)(const void *arg);

/* Build the module twice (the same constructor and seed: the same weights),
 * move one model to the GPU, run both on the same x and dy, compare; run
 * the GPU twice and compare bits. */
static void check_case(const char *label, make_fn make, const void *arg, bool train, int dtype, const int64_t *xs,
                       int xdim, bool ties, uint64_t seed, double tol) {
  px_model *mc, *mg;
  CHECK_OK(px_model_create(&mc, make(arg), 11));
  CHECK_OK(px_model_create(&mg, make(arg), 11));
  px_model_train(mc, train);
  px_model_train(mg, train);
  // Nonzero starting gradients (backward adds), random running statistics.
  fill(mc->grad_data, mc->n_param_elems, seed + 1, -0.5f, 0.5f);
  for (int i = 0; i < mc->n_buffers; i++) {
    px_param *b = mc->buffers[i];
    const bool var = strstr(b->name, "running_var") != NULL;
    fill(b->data, b->numel, seed + 2 + (uint64_t)i, var ? 0.5f : -1.0f, var ? 2.0f : 1.0f);
  }
  memcpy(mg->param_data, mc->param_data, mc->n_param_elems * sizeof(float));
  memcpy(mg->buffer_data, mc->buffer_data, mc->n_buffer_elems * sizeof(float));
  float *grad0 = malloc((mc->n_param_elems + 1) * sizeof(float));
  float *buf0 = malloc((mc->n_buffer_elems + 1) * sizeof(float));
  memcpy(grad0, mc->grad_data, mc->n_param_elems * sizeof(float));
  memcpy(buf0, mc->buffer_data, mc->n_buffer_elems * sizeof(float));

  px_tensor xt = px_tensor_view(NULL, PX_F32, xdim, xs);
  const size_t nx = (size_t)px_tensor_numel(&xt);
  float *x = malloc(nx * sizeof *x);
  if (ties) fill_ties(x, nx, seed + 3);
  else fill(x, nx, seed + 3, -2.0f, 2.0f);
  xt.data = x;
  px_tensor yc, dxc;
  CHECK_OK(px_model_forward(mc, &xt, &yc));
  const size_t ny = (size_t)px_tensor_numel(&yc);
  float *dy = malloc(ny * sizeof *dy);
  fill(dy, ny, seed + 4, -1.0f, 1.0f);
  px_tensor dyc = yc;
  dyc.data = px_model_scratch(mc, ny);
  memcpy(dyc.data, dy, ny * sizeof *dy);
  CHECK_OK(px_model_backward(mc, &dyc, &dxc));

  CHECK_OK(px_model_to_device(mg, PX_CUDA, 0));
  CHECK_OK(px_model_set_compute_dtype(mg, dtype == DT_BF16 ? PX_BF16 : PX_F32));
  run_out a, b;
  gpu_run(mg, x, xs, xdim, dy, grad0, buf0, &a);
  CHECK(a.ny == ny, "%s: output sizes %zu (gpu) and %zu (cpu)", label, a.ny, ny);
  if (a.ny == ny) compare(label, "y", a.y, px_f32(&yc), ny, tol);
  compare(label, "dx", a.dx, px_f32(&dxc), nx, tol);
  for (int i = 0; i < mc->n_params; i++) {
    const px_param *p = mc->params[i];
    char what[PX_NAME_MAX + 2];
    snprintf(what, sizeof what, "d%s", p->name);
    compare(label, what, a.grad + (p->grad - mc->grad_data), p->grad, p->numel, tol);
  }
  for (int i = 0; i < mc->n_buffers; i++) {
    const px_param *p = mc->buffers[i];
    compare(label, p->name, a.buf + (p->data - mc->buffer_data), p->data, p->numel, tol);
  }
  gpu_run(mg, x, xs, xdim, dy, grad0, buf0, &b);
  CHECK(same_bits(a.y, b.y, a.ny) && same_bits(a.dx, b.dx, a.nx) && same_bits(a.grad, b.grad, a.ngrad) &&
          same_bits(a.buf, b.buf, a.nbuf),
        "%s: two GPU runs differ in their bits", label);
  run_out_free(&a);
  run_out_free(&b);
  px_model_free(mg);
  px_model_free(mc);
  free(grad0);
  free(buf0);
  free(x);
  free(dy);
}

/* ---- The cases ---- */
typedef struct conv_arg {
  int C, O, k, s, p;
  bool bias;
} conv_arg;
static px_module *make_conv(const void *arg) {
  const conv_arg *a = arg;
  return px_conv2d(a->C, a->O, a->k, a->s, a->p, a->bias);
}

typedef struct bn_arg {
  int C;
  float momentum;
} bn_arg;
static px_module *make_bn(const void *arg) {
  const bn_arg *a = arg;
  px_module *m = px_batchnorm(a->C, 1e-5f, a->momentum);
  // γ = 1, β = 0 would hide a missing γ or β.
  m->params[0].init = PX_INIT_NORMAL;
  m->params[0].init_a = 1.0f;
  m->params[1].init = PX_INIT_NORMAL;
  m->params[1].init_a = 1.0f;
  return m;
}

typedef struct pool_arg {
  int kind, k, s, p;
} pool_arg; /* kind 0 max, 1 avg, 2 global avg */
static px_module *make_pool(const void *arg) {
  const pool_arg *a = arg;
  if (a->kind == 2) return px_global_avgpool2d();
  if (a->kind == 1) return px_avgpool2d(a->k, a->s);
  return a->p ? px_maxpool2d_padded(a->k, a->s, a->p) : px_maxpool2d(a->k, a->s);
}

static int rnd(px_rng *r, int lo, int hi) { return lo + (int)px_rng_below(r, (uint64_t)(hi - lo + 1)); }

static void check_convs(px_rng *r) {
  // Fixed: ResNet's shapes (3×3/1 pad 1, 3×3/2 pad 1, 1×1/2, 7×7/2 pad 3).
  const conv_arg fixed[] = {{4, 8, 3, 1, 1, false},
                            {5, 6, 3, 2, 1, true},
                            {6, 4, 1, 2, 0, false},
                            {3, 5, 7, 2, 3, true}};
  for (int dt = DT_F32; dt <= DT_BF16; dt++) {
    for (int i = 0; i < 4 + 6; i++) {
      conv_arg a;
      if (i < 4) {
        a = fixed[i];
      } else {
        a.k = rnd(r, 1, 5);
        a.s = rnd(r, 1, 3);
        a.p = rnd(r, 0, a.k - 1);
        a.C = rnd(r, 1, 7);
        a.O = rnd(r, 1, 9);
        a.bias = rnd(r, 0, 1);
      }
      int64_t xs[4] = {rnd(r, 1, 5), a.C, 2 * rnd(r, 2, 7) + 1, 2 * rnd(r, 2, 7) + 1};  // odd H, W
      if (xs[2] + 2 * a.p < a.k) xs[2] = a.k;
      if (xs[3] + 2 * a.p < a.k) xs[3] = a.k;
      // Every other case in chunks of 2 samples (the last one short when N is odd).
      const int chunk = i % 2 ? 2 : 0;
      if (chunk) setenv("PX_CUDA_CONV_CHUNK", "2", 1);
      else unsetenv("PX_CUDA_CONV_CHUNK");
      char label[160];
      snprintf(label, sizeof label, "conv %s N=%lld C=%d O=%d %lldx%lld k=%d s=%d p=%d bias=%d chunk=%d",
               dt == DT_BF16 ? "bf16" : "f32", (long long)xs[0], a.C, a.O, (long long)xs[2], (long long)xs[3], a.k, a.s,
               a.p, a.bias, chunk);
      check_case(label, make_conv, &a, true, dt, xs, 4, false, 100 + (uint64_t)i, dt == DT_BF16 ? 1e-2 : 1e-5);
    }
  }
}

static void check_batchnorms(px_rng *r) {
  for (int train = 1; train >= 0; train--)
    for (int i = 0; i < 4; i++) {
      bn_arg a = {rnd(r, 1, 6), i % 2 ? 0.1f : 0.7f};
      int64_t xs[4] = {rnd(r, 2, 5), a.C, 2 * rnd(r, 1, 6) + 1, 2 * rnd(r, 1, 6) + 1};
      const int xdim = i == 0 ? 2 : i == 1 ? 3 : 4;  // (N, C), (N, C, L), (N, C, H, W) twice
      char label[160];
      snprintf(label, sizeof label, "batchnorm %s %dd C=%d N=%lld", train ? "train" : "eval", xdim, a.C,
               (long long)xs[0]);
      check_case(label, make_bn, &a, train, DT_F32, xs, xdim, false, 200 + (uint64_t)(i + 10 * train), 1e-5);
    }
}

static void check_pools(px_rng *r) {
  const pool_arg fixed[] = {{0, 2, 2, 0}, {0, 3, 2, 1}, {0, 3, 1, 0}, {0, 3, 2, 0}, {0, 5, 2, 2},
                            {1, 2, 2, 0}, {1, 3, 2, 0}, {1, 3, 1, 0}, {2, 0, 0, 0}};
  for (int i = 0; i < (int)(sizeof fixed / sizeof *fixed); i++)
    for (int ties = 0; ties <= 1; ties++) {
      const pool_arg a = fixed[i];
      int64_t xs[4] = {rnd(r, 1, 3), rnd(r, 1, 5), 2 * rnd(r, 2, 7) + 1, 2 * rnd(r, 2, 7) + 1};
      char label[160];
      snprintf(label, sizeof label, "%s k=%d s=%d p=%d %lldx%lld%s",
               a.kind == 0     ? "maxpool"
                 : a.kind == 1 ? "avgpool"
                               : "global avgpool",
               a.k, a.s, a.p, (long long)xs[2], (long long)xs[3], ties ? " (ties)" : "");
      // Max and avg pools: the CPU's bits (the same scan, tie rule and
      // summation order); the global pool's double sum in another order: 1e-5.
      const double tol = a.kind == 2 ? 1e-5 : 0.0;
      check_case(label, make_pool, &a, true, DT_F32, xs, 4, ties, 300 + (uint64_t)(2 * i + ties), tol);
    }
}

int main(void) {
  if (px_cuda_device_count() == 0) {
    printf("test_cuda_vision_layers_match_cpu: no CUDA device, skipped\n");
    return 77;
  }
  CHECK_OK(px_cuda_init(0));
  printf("device: %s\n", px_cuda_device_name());
  px_rng r = px_rng_make(2026, 15);
  check_convs(&r);
  check_batchnorms(&r);
  check_pools(&r);
  return px_test_finish("test_cuda_vision_layers_match_cpu");
}
