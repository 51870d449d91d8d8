/* Claim: causal self-attention on the GPU (tensor/cuda/k_attention.cu,
 * through the CausalSelfAttention module's CUDA dispatch) gives the CPU
 * path's output and input gradient dq, dk, dv, with and without attention
 * dropout (then with the CPU's mask, bit for bit: a different mask would
 * give order-one differences), for T = 1, T not a multiple of any tile,
 * head widths 16, 24, 64 and 128, one to three heads, and a tensor-parallel
 * slice of heads (head0 > 0: the masks of the global heads).
 *
 * The module is built with identity children (c_attn, c_proj and
 * resid_dropout are Dropout(0)), so x is qkv itself and y is the merged
 * heads' output: the test checks the attention kernels, not Conv1D's.
 * The backward recomputes the probabilities from the saved log-sum-exp, so
 * a wrong lse fails the gradient checks.  Three kernel families run: the
 * tiled default, PX_CUDA_ATTENTION=rowwise (the reference kernels), and the
 * bf16 tensor-core kernels (the context's compute dtype PX_BF16; head widths
 * 16, 32, 64, 128, the others falling back to the f32 kernels).
 *
 * Tolerances (max |gpu - cpu| / max |cpu| per tensor): 1e-5 for the output;
 * 1e-4 for the gradients, whose T-term sums run in another order than the
 * CPU's sgemm and whose dS = P (dP - D) cancels; 1e-2 for both in bf16 (q,
 * k, v, dO and P rounded to 8 significant bits). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "cuda_compare.h"
#include "nn/internal.h"

#include <stdlib.h>

typedef struct att_case {
  int N, T, H, d;
  float p;
  int head0, heads_total; /* 0, H unless a tensor-parallel slice */
} att_case;

static void fill(float *x, size_t n, uint64_t seed, float scale) {
  px_rng r = px_rng_make(seed, 1);
  for (size_t i = 0; i < n; i++) x[i] = scale * (2.0f * px_rng_uniform(&r) - 1.0f);
}

static void run_case(att_case c, int idx) {
  const int C = c.H * c.d, heads_total = c.heads_total ? c.heads_total : c.H;
  char label[160];
  snprintf(label, sizeof label, "case %d: N %d T %d H %d d %d p %g heads %d..%d of %d", idx, c.N, c.T, c.H, c.d,
           (double)c.p, c.head0, c.head0 + c.H - 1, heads_total);
  px_module *m = px_attention_with(3 * C, C, c.H, c.head0, heads_total, c.p, px_dropout(0.0f), px_dropout(0.0f),
                                   px_dropout(0.0f));
  CHECK(m != NULL, "%s: px_attention_with: %s", label, px_last_error());
  if (!m) return;
  m->stream = 7u + (uint32_t)idx;
  cc_set_training(m, true);
  const size_t nx = (size_t)c.N * c.T * 3 * C, ny = (size_t)c.N * c.T * C;
  float *x = malloc(nx * sizeof *x), *dy = malloc(ny * sizeof *dy);
  float *y_cpu = malloc(ny * sizeof *y_cpu), *dx_cpu = malloc(nx * sizeof *dx_cpu);
  if (!x || !dy || !y_cpu || !dx_cpu) exit(1);
  // Scores of order one to a few: q, k in [-1.5, 1.5] give |q·k|/√d up to ~3.
  fill(x, nx, 100 + (uint64_t)idx, 1.5f);
  fill(dy, ny, 200 + (uint64_t)idx, 1.0f);
  px_tensor X = px_tensor_f32(x, 3, c.N, c.T, 3 * C, 0), DY = px_tensor_f32(dy, 3, c.N, c.T, C, 0);
  const uint64_t seed = 1234567 + (uint64_t)idx, step = 3 + (uint64_t)idx;

  // CPU.
  px_ctx cpu = cc_ctx(PX_CPU, true, seed, step);
  px_tensor y, dx;
  CHECK_OK(px_module_forward(m, &cpu, &X, &y));
  memcpy(y_cpu, y.data, ny * sizeof(float));
  CHECK_OK(px_module_backward(m, &cpu, &DY, &dx));
  memcpy(dx_cpu, dx.data, nx * sizeof(float));

  // GPU: the same module, the same seed and step; tiled, then rowwise kernels.
  px_ctx gpu = cc_ctx(PX_CUDA, true, seed, step);
  px_tensor Xd = cc_device_tensor(&X), DYd = cc_device_tensor(&DY);
  const bool tc = c.d == 16 || c.d == 32 || c.d == 64 || c.d == 128;
  for (int variant = 0; variant < 3; variant++) {
    if (variant == 1) setenv("PX_CUDA_ATTENTION", "rowwise", 1);
    else unsetenv("PX_CUDA_ATTENTION");
    // Variant 2: the step in bf16, the tensor-core kernels where the head
    // width allows (else the f32 kernels again).
    const bool bf16 = variant == 2;
    gpu.compute_dtype = bf16 ? PX_BF16 : PX_F32;
    const char *vname = variant == 0 ? "tiled"
      : variant == 1                 ? "rowwise"
      : tc                           ? "bf16 tensor cores"
                                     : "bf16 (f32 kernels)";
    const double tol_y = bf16 && tc ? 1e-2 : 1e-5, tol_g = bf16 && tc ? 1e-2 : 1e-4;
    px_arena_reset(gpu.arena);
    px_tensor yd, dxd;
    CHECK_OK(px_module_forward(m, &gpu, &Xd, &yd));
    CHECK(yd.device == PX_CUDA && yd.ndim == 3 && yd.shape[2] == C, "%s: output not a device (N, T, C) tensor", label);
    CHECK_OK(px_module_backward(m, &gpu, &DYd, &dxd));
    CHECK_OK(px_cuda_sync());
    float *y_gpu = cc_to_host(&yd), *dx_gpu = cc_to_host(&dxd);
    char what[200];
    snprintf(what, sizeof what, "%s, %s: output", label, vname);
    const double ey = cc_compare(what, y_gpu, y_cpu, ny, tol_y);
    // dq, dk, dv separately: a wrong dk would hide behind a large dq.
    // dq and dk are sums of P·(dP - rowsum(P·dP))·k (or q) / √d: terms as
    // large as max |dP| · max |k| / √d that cancel, exactly so where a row
    // sees one key (T = 1: dq = dk = 0, and both sides hold only rounding
    // noise).  1% of that magnitude is their floor (below every case's
    // largest |dq| and |dk| that is not zero); dv has no cancellation.
    double cancel_floor[2];
    {
      double dy2 = 0, v2 = 0, qmax = 0, kmax = 0;
      for (size_t r = 0; r < (size_t)c.N * c.T; r++) {
        double sy = 0, sv = 0;
        for (int j = 0; j < C; j++) {
          const double yv = dy[r * C + (size_t)j], vv = x[r * 3 * C + 2 * (size_t)C + (size_t)j];
          sy += yv * yv, sv += vv * vv;
          qmax = fmax(qmax, fabs(x[r * 3 * C + (size_t)j]));
          kmax = fmax(kmax, fabs(x[r * 3 * C + (size_t)C + (size_t)j]));
        }
        dy2 = fmax(dy2, sy), v2 = fmax(v2, sv);
      }
      const double dp = sqrt(dy2) * sqrt(v2) / sqrt((double)c.d);
      cancel_floor[0] = 1e-2 * dp * kmax;
      cancel_floor[1] = 1e-2 * dp * qmax;
    }
    double eg[3];
    const char *names[3] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; part++) {
      const size_t n = (size_t)c.N * c.T * C;
      float *g = malloc(n * sizeof *g), *h = malloc(n * sizeof *h);
      if (!g || !h) exit(1);
      for (size_t r = 0; r < (size_t)c.N * c.T; r++) {
        memcpy(g + r * C, dx_gpu + r * 3 * C + (size_t)part * C, C * sizeof(float));
        memcpy(h + r * C, dx_cpu + r * 3 * C + (size_t)part * C, C * sizeof(float));
      }
      snprintf(what, sizeof what, "%s, %s: %s", label, vname, names[part]);
      eg[part] = cc_compare_floor(what, g, h, n, tol_g, part < 2 ? cancel_floor[part] : 0.0);
      free(g);
      free(h);
    }
    printf("%s, %s: output %.2g, dq %.2g, dk %.2g, dv %.2g\n", label, vname, ey, eg[0], eg[1], eg[2]);
    free(y_gpu);
    free(dx_gpu);
  }
  unsetenv("PX_CUDA_ATTENTION");
  px_cuda_free(Xd.data);
  px_cuda_free(DYd.data);
  px_arena_free(cpu.arena);
  px_arena_free(gpu.arena);
  free(x);
  free(dy);
  free(y_cpu);
  free(dx_cpu);
  px_module_free(m);
}

int main(void) {
  cc_require_gpu("test_cuda_attention_matches_cpu");
  const att_case fixed[] = {
    {1, 1, 1, 16, 0.0f, 0, 0},    {1, 1, 2, 64, 0.2f, 0, 0},
    {2, 5, 2, 16, 0.0f, 0, 0},    {2, 33, 3, 64, 0.0f, 0, 0},
    {2, 33, 3, 64, 0.3f, 0, 0},   {1, 67, 2, 24, 0.1f, 0, 0},
    {1, 130, 1, 128, 0.0f, 0, 0}, {1, 130, 2, 128, 0.2f, 0, 0},
    {2, 64, 2, 64, 0.5f, 0, 0},   {1, 45, 2, 16, 0.25f, 1, 4},
    {3, 129, 2, 64, 0.1f, 0, 0},  {1, 1024, 2, 64, 0.1f, 0, 0},  // GPT-2's context: 32 chunks of keys
  };
  const int nfixed = (int)(sizeof fixed / sizeof fixed[0]);
  for (int i = 0; i < nfixed; i++) run_case(fixed[i], i);
  // Random shapes.
  px_rng r = px_rng_make(2026, 15);
  const int dims[4] = {16, 32, 64, 80};
  for (int i = 0; i < 8; i++) {
    att_case c = {.N = 1 + (int)px_rng_below(&r, 3),
                  .T = 1 + (int)px_rng_below(&r, 150),
                  .H = 1 + (int)px_rng_below(&r, 4),
                  .d = dims[px_rng_below(&r, 4)],
                  .p = px_rng_below(&r, 2) ? 0.15f : 0.0f};
    run_case(c, nfixed + i);
  }
  return px_test_finish("test_cuda_attention_matches_cpu");
}
