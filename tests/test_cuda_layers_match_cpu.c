/* The device path of LayerNorm, Embedding, PosEmbedding (and its part form),
 * the activations (ReLU, Tanh, Sigmoid, GELU erf and tanh), Residual (plain
 * and with a shortcut), Linear, Conv1D, Flatten and the tied head, and a
 * checkpointed unit and pair (Conv1D rebinding to a recomputed input), compute
 * what the CPU path computes: one model built twice from the same seed, the
 * same random parameters, inputs, upstream gradients and starting gradients
 * (so += accumulation is checked), one on the host and one with its
 * parameters, gradients, inputs and arena on the GPU; forward output, dx and
 * every parameter's gradient are compared.
 *
 *   f32:   |gpu - cpu| <= 1e-5 · max(|gpu|, |cpu|, floor), floor = 1% of the
 *          largest |cpu| of that tensor (10% after a GEMM: cuBLAS and
 *          OpenBLAS sum K products in different orders, so entries near zero
 *          differ by ~K·ulp of the large ones; 10% too for Tanh, Sigmoid
 *          and the GELUs: their backward from the saved y (1 - y², y(1 - y))
 *          cancels where y is near ±1, and CUDA's expf and erff are within
 *          2 ulp of libm's, not equal); 2e-5 for the checkpointed
 *          Linear-GELU-Linear chain, whose first weight's gradient is three
 *          GEMMs deep.  The embeddings' gather and
 *          scatter-add and the position embedding are the CPU's additions in
 *          the CPU's order: bit-identical, required.
 *   bf16:  operands already bf16 values: the f32 bound (the casts are exact);
 *          arbitrary f32 values: 1e-2 of the tensor's largest |cpu|.
 *   Determinism: each GPU case runs twice from the same state; output, dx
 *          and gradients must be the same bits.
 *   Errors: a bad token id fails on the GPU with the CPU's message.
 *
 * Exits 77 (ctest's skip) without a CUDA device. */
#include "px_test.h"
#include "tensor/cuda/px_cuda.h"

#include <stdint.h>
#include <string.h>

enum {
  K_LAYERNORM,
  K_EMBEDDING,
  K_POS,
  K_POS_PART,
  K_ACT,
  K_RESIDUAL,
  K_RESIDUAL_SHORTCUT,
  K_LINEAR,
  K_CONV1D,
  K_FLATTEN_LINEAR,
  K_TIED,
  K_PAIR,
  K_CHECKPOINT
};

typedef struct spec {
  const char *name;
  int kind;
  int a[4]; /* constructor arguments */
  int ndim;
  int64_t shape[4]; /* the input's */
  int vocab;        /* > 0: the input is int32 ids in [0, vocab) */
  bool want_dx;
  px_dtype compute; /* PX_F32 or PX_BF16 */
  bool round_bf16;  /* parameters, input and dy rounded to bf16 values */
  double tol, floor_frac;
  bool exact;  /* output and gradients must equal the CPU's bits */
  float scale; /* of the random input */
} spec;

static px_module *build(const spec *s) {
  const int *a = s->a;
  switch (s->kind) {
  case K_LAYERNORM: return px_layernorm(a[0], 1e-5f);
  case K_EMBEDDING: return px_embedding(a[0], a[1]);
  case K_POS: return px_pos_embedding(a[0], a[1]);
  case K_POS_PART: return px_pos_embedding_part(a[0], a[1], a[2], a[3]);
  case K_ACT:
    switch (a[0]) {
    case 0: return px_relu();
    case 1: return px_tanh();
    case 2: return px_sigmoid();
    case 3: return px_gelu(false);
    default: return px_gelu(true);
    }
  case K_RESIDUAL: return px_residual(px_chain_of(2, px_linear(a[0], a[0], true), px_gelu(true)));
  case K_RESIDUAL_SHORTCUT:
    return px_residual_shortcut(px_chain_of(2, px_linear(a[0], a[1], true), px_relu()), px_linear(a[0], a[1], false),
                                "down");
  case K_LINEAR: return px_linear(a[0], a[1], a[2] != 0);
  case K_CONV1D: return px_conv1d(a[0], a[1], a[2] != 0);
  case K_FLATTEN_LINEAR: return px_chain_of(2, px_flatten(), px_linear(a[0], a[1], true));
  // The GPT MLP's selective recompute: Conv1D rebinds to the recomputed GELU output.
  case K_PAIR: return px_checkpoint_pair("act", px_gelu(true), "c_proj", px_conv1d(a[0], a[1], true));
  case K_CHECKPOINT:
    return px_checkpoint(px_chain_of(3, px_linear(a[0], a[1], true), px_gelu(true), px_linear(a[1], a[0], true)));
  default: {
    px_module *e = px_embedding(a[0], a[1]);
    return px_chain_of(2, e, e ? px_tied_head(e) : NULL);
  }
  }
}

/* f32 -> the nearest bf16 value (ties to even), as f32. */
static float round_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  memcpy(&f, &u, 4);
  return f;
}

static void fill(px_rng *r, float *x, size_t n, float scale, bool rb) {
  for (size_t i = 0; i < n; i++) {
    x[i] = scale * px_rng_normal(r);
    if (rb) x[i] = round_bf16(x[i]);
  }
}

static void compare(const spec *s, const char *what, const float *gpu, const float *cpu, size_t n) {
  if (s->exact) {
    CHECK(memcmp(gpu, cpu, n * sizeof(float)) == 0, "%s: %s is not the CPU's bits", s->name, what);
    return;
  }
  const double mx = px_max_abs(cpu, n);
  const double floor = s->floor_frac * mx > 1e-30 ? s->floor_frac * mx : 1e-30;
  const double err = px_max_rel_diff(gpu, cpu, n, floor);
  CHECK(err <= s->tol, "%s: %s differs from the CPU by %.3g relative (bound %.3g, floor %.3g)", s->name, what, err,
        s->tol, floor);
  const bool same = memcmp(gpu, cpu, n * sizeof(float)) == 0;
  printf("  %-34s %-16s rel %.2e%s\n", s->name, what, err, same ? "  (bit-identical)" : "");
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

static void run_case(const spec *s, uint64_t seed) {
  px_model *cm, *gm;
  CHECK_OK(px_model_create(&cm, build(s), 1234));
  CHECK_OK(px_model_create(&gm, build(s), 1234));
  const size_t P = cm->n_param_elems;
  px_rng rng = px_rng_make(seed, 7);
  // The same random parameters and starting gradients in both.
  fill(&rng, cm->param_data, P, 0.5f, s->round_bf16);
  memcpy(gm->param_data, cm->param_data, P * sizeof(float));
  float *g0 = malloc((P ? P : 1) * sizeof(float));
  fill(&rng, g0, P, 0.01f, false);
  memcpy(cm->grad_data, g0, P * sizeof(float));
  float *dparam = dev_copy(cm->param_data, P * sizeof(float)), *dgrad = dev_copy(g0, P * sizeof(float));
  for (int i = 0; i < gm->n_params; i++) {
    gm->params[i]->data = dparam + gm->params[i]->offset;
    gm->params[i]->grad = dgrad + gm->params[i]->offset;
  }
  // The input.
  px_tensor xh = px_tensor_view(NULL, s->vocab ? PX_I32 : PX_F32, s->ndim, s->shape);
  const size_t nx = (size_t)px_tensor_numel(&xh);
  void *hx = malloc((nx ? nx : 1) * 4);
  if (s->vocab)
    for (size_t i = 0; i < nx; i++) ((int32_t *)hx)[i] = (int32_t)px_rng_below(&rng, (uint64_t)s->vocab);
  else fill(&rng, hx, nx, s->scale, s->round_bf16);
  xh.data = hx;
  px_tensor xd = xh;
  xd.data = dev_copy(hx, nx * 4);
  xd.device = PX_CUDA;

  px_ctx cctx = {0}, gctx = {0};
  cctx.arena = px_arena_create(1 << 16);
  cctx.training = true;
  cctx.seed = 1;
  cctx.device = PX_CPU;
  cctx.compute_dtype = PX_F32;
  gctx = cctx;
  gctx.arena = px_cuda_arena_create(1 << 16);
  gctx.device = PX_CUDA;
  gctx.compute_dtype = s->compute;
  if (!cctx.arena || !gctx.arena) {
    fprintf(stderr, "arena: %s\n", px_last_error());
    exit(1);
  }

  // CPU.
  px_tensor yh, dxh;
  CHECK_OK(px_module_forward(cm->root, &cctx, &xh, &yh));
  const size_t ny = (size_t)px_tensor_numel(&yh);
  float *hdy = malloc((ny ? ny : 1) * sizeof(float));
  fill(&rng, hdy, ny, 1.0f, s->round_bf16);
  px_tensor dyh = px_tensor_view(hdy, PX_F32, yh.ndim, yh.shape);
  CHECK_OK(px_module_backward(cm->root, &cctx, &dyh, s->want_dx ? &dxh : NULL));
  float *ddy = dev_copy(hdy, ny * sizeof(float));

  // GPU, twice from the same state.
  float *y[2], *dx[2], *g[2];
  for (int run = 0; run < 2; run++) {
    y[run] = malloc((ny ? ny : 1) * sizeof(float));
    dx[run] = malloc((nx ? nx : 1) * sizeof(float));
    g[run] = malloc((P ? P : 1) * sizeof(float));
    if (P) CHECK_OK(px_cuda_to_device(dgrad, g0, P * sizeof(float)));
    px_arena_reset(gctx.arena);
    px_tensor yd, dxd;
    CHECK_OK(px_module_forward(gm->root, &gctx, &xd, &yd));
    CHECK(yd.device == PX_CUDA, "%s: forward's output is not on the device", s->name);
    CHECK(px_tensor_same_shape(&yd, &yh), "%s: output shape differs from the CPU's", s->name);
    CHECK_OK(px_cuda_to_host(y[run], yd.data, ny * sizeof(float)));
    px_tensor dyd = px_tensor_view(ddy, PX_F32, yh.ndim, yh.shape);
    dyd.device = PX_CUDA;
    CHECK_OK(px_module_backward(gm->root, &gctx, &dyd, s->want_dx ? &dxd : NULL));
    if (s->want_dx) {
      CHECK(dxd.device == PX_CUDA, "%s: dx is not on the device", s->name);
      CHECK(px_tensor_same_shape(&dxd, &dxh), "%s: dx's shape differs from the CPU's", s->name);
      CHECK_OK(px_cuda_to_host(dx[run], dxd.data, nx * sizeof(float)));
    }
    if (P) CHECK_OK(px_cuda_to_host(g[run], dgrad, P * sizeof(float)));
    CHECK_OK(px_cuda_sync());
  }
  compare(s, "forward", y[0], px_f32(&yh), ny);
  if (s->want_dx) compare(s, "dx", dx[0], px_f32(&dxh), nx);
  // Each parameter's gradient: what backward added (the starting values cancel).
  for (int i = 0; i < cm->n_params; i++) {
    const px_param *p = cm->params[i];
    float *dg = malloc(p->numel * sizeof(float)), *dc = malloc(p->numel * sizeof(float));
    for (size_t j = 0; j < p->numel; j++) {
      dg[j] = g[0][p->offset + j] - g0[p->offset + j];
      dc[j] = cm->grad_data[p->offset + j] - g0[p->offset + j];
    }
    char what[PX_NAME_MAX + 8];
    snprintf(what, sizeof what, "d%s", p->name);
    compare(s, what, dg, dc, p->numel);
    if (s->exact)  // the accumulated values too, not only what was added
      CHECK(memcmp(g[0] + p->offset, cm->grad_data + p->offset, p->numel * sizeof(float)) == 0,
            "%s: %s's accumulated gradient is not the CPU's bits", s->name, p->name);
    free(dg);
    free(dc);
  }
  CHECK(memcmp(y[0], y[1], ny * sizeof(float)) == 0, "%s: two GPU forwards differ in bits", s->name);
  if (s->want_dx) CHECK(memcmp(dx[0], dx[1], nx * sizeof(float)) == 0, "%s: two GPU backwards' dx differ", s->name);
  CHECK(memcmp(g[0], g[1], P * sizeof(float)) == 0, "%s: two GPU backwards' gradients differ in bits", s->name);

  for (int run = 0; run < 2; run++) {
    free(y[run]);
    free(dx[run]);
    free(g[run]);
  }
  px_cuda_free(ddy);
  px_cuda_free(xd.data);
  px_cuda_free(dparam);
  px_cuda_free(dgrad);
  free(hdy);
  free(hx);
  free(g0);
  px_arena_free(cctx.arena);
  px_arena_free(gctx.arena);
  px_model_free(cm);
  px_model_free(gm);
}

/* A bad id fails on the GPU with the message the CPU gives. */
static void bad_id_case(void) {
  px_model *cm, *gm;
  CHECK_OK(px_model_create(&cm, px_embedding(50, 8), 3));
  CHECK_OK(px_model_create(&gm, px_embedding(50, 8), 3));
  float *dparam = dev_copy(gm->param_data, gm->n_param_elems * sizeof(float));
  gm->params[0]->data = dparam;
  int32_t ids[2 * 5] = {1, 2, 3, 4, 5, 6, 7, 8, 57, -1};  // first bad: (1, 3)
  int64_t shape[2] = {2, 5};
  px_tensor xh = px_tensor_view(ids, PX_I32, 2, shape), xd = xh;
  xd.data = dev_copy(ids, sizeof ids);
  xd.device = PX_CUDA;
  px_ctx cctx = {0}, gctx = {0};
  cctx.arena = px_arena_create(1 << 12);
  gctx.arena = px_cuda_arena_create(1 << 12);
  gctx.device = PX_CUDA;
  px_tensor y;
  CHECK(px_module_forward(cm->root, &cctx, &xh, &y) == PX_ERR_INVALID, "CPU: a bad id must fail");
  char cpu_msg[512];
  snprintf(cpu_msg, sizeof cpu_msg, "%s", px_last_error());
  px_clear_error();
  CHECK(px_module_forward(gm->root, &gctx, &xd, &y) == PX_ERR_INVALID, "GPU: a bad id must fail");
  CHECK(strcmp(px_last_error(), cpu_msg) == 0, "GPU message \"%s\" differs from the CPU's \"%s\"", px_last_error(),
        cpu_msg);
  CHECK(strstr(cpu_msg, "token id 57 at position (1, 3)") != NULL, "the message names the id and position: %s",
        cpu_msg);
  printf("  bad id: %s\n", px_last_error());
  px_cuda_free(xd.data);
  px_cuda_free(dparam);
  px_arena_free(cctx.arena);
  px_arena_free(gctx.arena);
  px_model_free(cm);
  px_model_free(gm);
}

#define F32(tol_, floor_) PX_F32, false, tol_, floor_
int main(void) {
  if (px_cuda_device_count() == 0) {
    printf("test_cuda_layers_match_cpu: no CUDA device, skipped\n");
    return 77;
  }
  CHECK_OK(px_cuda_init(0));
  printf("device: %s\n", px_cuda_device_name());
  const spec specs[] = {
    {"LayerNorm(96)", K_LAYERNORM, {96}, 3, {3, 7, 96}, 0, true, F32(1e-5, 1e-2), false, 2.0f},
    {"LayerNorm(77) 650 rows", K_LAYERNORM, {77}, 3, {5, 130, 77}, 0, true, F32(1e-5, 1e-2), false, 1.0f},
    {"LayerNorm(768)", K_LAYERNORM, {768}, 2, {9, 768}, 0, true, F32(1e-5, 1e-2), false, 1.0f},
    {"Embedding(50, 40)", K_EMBEDDING, {50, 40}, 2, {3, 33}, 50, false, F32(0, 0), true, 1.0f},
    {"Embedding(1000, 19) 1-D ids", K_EMBEDDING, {1000, 19}, 1, {517}, 1000, false, F32(0, 0), true, 1.0f},
    {"PosEmbedding(64, 24)", K_POS, {64, 24}, 3, {3, 40, 24}, 0, true, F32(0, 0), true, 1.0f},
    {"PosEmbedding part 2 of 3", K_POS_PART, {40, 24, 2, 3}, 3, {3, 13, 24}, 0, true, F32(0, 0), true, 1.0f},
    {"ReLU", K_ACT, {0}, 2, {7, 333}, 0, true, F32(1e-5, 1e-2), false, 3.0f},
    {"Tanh", K_ACT, {1}, 2, {7, 333}, 0, true, F32(1e-5, 1e-1), false, 3.0f},
    {"Sigmoid", K_ACT, {2}, 2, {7, 333}, 0, true, F32(1e-5, 1e-1), false, 3.0f},
    {"GELU (erf)", K_ACT, {3}, 2, {7, 333}, 0, true, F32(1e-5, 1e-1), false, 3.0f},
    {"GELU (tanh)", K_ACT, {4}, 3, {2, 9, 211}, 0, true, F32(1e-5, 1e-1), false, 3.0f},
    {"Residual(Linear, GELU)", K_RESIDUAL, {24}, 3, {3, 5, 24}, 0, true, F32(1e-5, 1e-1), false, 1.0f},
    {"Residual with shortcut", K_RESIDUAL_SHORTCUT, {24, 16}, 2, {6, 24}, 0, true, F32(1e-5, 1e-1), false, 1.0f},
    {"Linear(37 -> 53)", K_LINEAR, {37, 53, 1}, 3, {4, 9, 37}, 0, true, F32(1e-5, 1e-1), false, 1.0f},
    {"Linear(64 -> 20) no bias", K_LINEAR, {64, 20, 0}, 2, {130, 64}, 0, true, F32(1e-5, 1e-1), false, 1.0f},
    {"Linear(33 -> 17) 600 rows", K_LINEAR, {33, 17, 1}, 2, {600, 33}, 0, true, F32(1e-5, 1e-1), false, 1.0f},
    {"Conv1D(48 -> 80)", K_CONV1D, {48, 80, 1}, 3, {2, 7, 48}, 0, true, F32(1e-5, 1e-1), false, 1.0f},
    {"Conv1D(40 -> 120) 300 rows", K_CONV1D, {40, 120, 1}, 3, {3, 100, 40}, 0, true, F32(1e-5, 1e-1), false, 1.0f},
    {"Flatten then Linear(60 -> 7)", K_FLATTEN_LINEAR, {60, 7}, 4, {5, 3, 4, 5}, 0, true, F32(1e-5, 1e-1), false, 1.0f},
    {"checkpoint_pair(GELU, Conv1D)", K_PAIR, {40, 24}, 3, {3, 7, 40}, 0, true, F32(1e-5, 1e-1), false, 1.0f},
    // d0.weight here is three GEMMs deep (dy -> d2's dx -> GELU -> d0's dW), each summed in cuBLAS's order
    // and OpenBLAS's: 1.10e-05 on an H200 (2026-11-28), so 2e-5 for this chain; one GEMM deep stays at 1e-5.
    {"checkpoint(Linear, GELU, Linear)", K_CHECKPOINT, {24, 40}, 3, {3, 7, 24}, 0, true, F32(2e-5, 1e-1), false, 1.0f},
    {"Embedding(97, 32) + TiedHead", K_TIED, {97, 32}, 2, {3, 11}, 97, false, F32(1e-5, 1e-1), false, 1.0f},
    // bf16 GEMMs, operands already bf16 values: only the summation order differs.
    {"bf16 exact operands Linear",
     K_LINEAR,
     {37, 53, 1},
     3,
     {4, 9, 37},
     0,
     true,
     PX_BF16,
     true,
     1e-5,
     1e-1,
     false,
     1.0f},
    {"bf16 exact operands Conv1D",
     K_CONV1D,
     {48, 80, 1},
     3,
     {2, 7, 48},
     0,
     true,
     PX_BF16,
     true,
     1e-5,
     1e-1,
     false,
     1.0f},
    {"bf16 exact operands TiedHead", K_TIED, {97, 32}, 2, {3, 11}, 97, false, PX_BF16, true, 1e-5, 1e-1, false, 1.0f},
    // bf16 GEMMs of arbitrary f32 values against the f32 CPU.
    {"bf16 Linear", K_LINEAR, {64, 48, 1}, 3, {4, 9, 64}, 0, true, PX_BF16, false, 1e-2, 1.0, false, 1.0f},
    {"bf16 Conv1D", K_CONV1D, {64, 96, 1}, 3, {2, 17, 64}, 0, true, PX_BF16, false, 1e-2, 1.0, false, 1.0f},
    {"bf16 TiedHead", K_TIED, {97, 32}, 2, {3, 11}, 97, false, PX_BF16, false, 1e-2, 1.0, false, 1.0f},
  };
  for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) run_case(&specs[i], 100 + i);
  bad_id_case();
  return px_test_finish("test_cuda_layers_match_cpu");
}
