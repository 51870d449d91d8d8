// Causal multi-head self-attention, GPT-2's (Hugging Face's GPT2Attention):
//
//   qkv = c_attn(x)                    x: (N, T, C)  c_attn: Conv1D C -> 3C
//   q, k, v = split(qkv)               each (N, T, C) = (N, T, H, d), d = C/H;
//                                      head h is columns [h·d, (h+1)·d) of each
//   S  = q·kᵀ / √d                     (N, H, T, T) per head, masked j > i
//   P  = softmax_j(S)                  row i over keys j <= i
//   P' = P ⊙ M / (1 - p_attn)          attention dropout (M: Philox mask)
//   O  = P'·v                          (N, T, H, d) = (N, T, C): heads merged
//   y  = resid_dropout(c_proj(O))      c_proj: Conv1D C -> C
//
// What forward keeps, and why.  Nothing of size (N, H, T, T) is stored:
//   qkv  (N, T, 3C)   c_attn's output, needed to recompute S and for dq, dk, dv
//   O    (N, T, C)    c_proj's input (c_proj keeps it anyway)
//   lse  (N, H, T)    log Σ_j e^{S_ij} per row, so backward recomputes
//                     P_ij = e^{S_ij - lse_i} with one exp and no max/sum pass
// and the dropout mask is a pure function of (seed, module, step, element)
// (as in dropout.c), regenerated rather than stored.  Scores and
// probabilities exist only as a tile of ATT_QB query rows × the keys they
// see, per thread; at T = 1024 storing them would cost 2·N·H·T² floats
// (64 MiB per layer at N·H = 8), recomputing costs one GEMM per tile.
//
// Backward per tile (rows i of the tile, keys j <= i; d_ = ∂L/∂_):
//   P   = exp(S - lse)                 recomputed
//   dP' = dO·vᵀ,   dv += P'ᵀ·dO,   dP = dP' ⊙ M/(1-p)
//   Dᵢ  = dOᵢ·Oᵢ  (= Σ_j P_ij dP_ij: softmax's row term, from what is kept)
//   dS  = P ⊙ (dP - D)
//   dq  = dS·k / √d,   dk += dSᵀ·q / √d
//
// Threads: each (n, h) pair is one work item, done by one thread with
// single-threaded GEMMs (OpenBLAS runs one thread inside an OpenMP region),
// so results are bitwise the same for any thread count.  Below ATT_PAR_MIN
// multiply-adds per pass no region is opened (its start and barrier cost
// more than the work); every GEMM is then at most T·T·d <= ATT_PAR_MIN
// multiply-adds, which OpenBLAS runs on one thread too (it threads sgemm
// only above m·n·k = 65536 · GEMM_MULTITHREAD_THRESHOLD(4)), so the bits
// are the same either way.
#include "plexus/nn.h"
#include "nn/internal.h"
#include "tensor/internal.h"

#include <math.h>
#include <omp.h>

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/k_transformer_a.h"
#include "tensor/cuda/px_cuda.h"
#endif

// Query rows per tile: the scores of a tile are ATT_QB × T floats.
#define ATT_QB 64
// Open an OpenMP region only above this many multiply-adds (N·H·T·T·d).
#define ATT_PAR_MIN (1 << 18)

typedef struct attention {
  px_module base;         /* children: c_attn, c_proj, resid_dropout */
  int dim, n_head;        /* this module's width and heads (C and H unless tensor parallel) */
  int in_dim;             /* width of the input x and of y */
  int head0, heads_total; /* tensor parallel: heads [head0, head0 + n_head) of heads_total */
  float attn_p;           /* dropout on the attention probabilities */
  // Saved by forward for backward.
  px_tensor qkv; /* (N, T, 3C) */
  px_tensor o;   /* (N, T, C) heads merged */
  float *lse;    /* (N, H, T) */
  int64_t n, t;
  bool drop; /* attention dropout active in this pass */
  bool bf16; /* CUDA: this pass ran the bf16 tensor-core kernels */
  uint64_t seed, step;
} attention;

typedef struct head_view {
  const float *q, *k, *v; /* row stride ld = 3C */
  int ld, T, d;
  uint64_t elem0; /* flat index of (n, h, 0, 0) in (N, H, T, T) */
} head_view;

static head_view head_of(const attention *a, const float *qkv, int64_t n, int h) {
  const int C = a->dim, T = (int)a->t, d = C / a->n_head;
  const float *q = qkv + (size_t)n * (size_t)T * 3 * (size_t)C + (size_t)h * (size_t)d;
  return (head_view){.q = q,
                     .k = q + C,
                     .v = q + 2 * C,
                     .ld = 3 * C,
                     .T = T,
                     .d = d,
                     // The global head's index: a tensor-parallel rank draws the
                     // masks the single-process model draws for that head.
                     .elem0 = ((uint64_t)n * (uint64_t)a->heads_total + (uint64_t)(a->head0 + h)) * (uint64_t)T *
                       (uint64_t)T};
}

// row[j] *= M_ij/(1-p) for j < n (in place, or into out), element (i, j) of
// the head at flat index e0 + j: Philox(seed, stream·2^40 ^ step, e/4)[e % 4],
// dropout.c's scheme.
static void mask_row(const attention *a, uint64_t e0, const float *row, float *out, int n) {
  const float p = a->attn_p, scale = 1.0f / (1.0f - p);
  const uint64_t hi = ((uint64_t)a->base.stream << 40) ^ a->step;
  uint32_t w[4];
  for (int j = 0; j < n; j++) {
    const uint64_t e = e0 + (uint64_t)j;
    if (j == 0 || (e & 3) == 0) px_philox4x32(a->seed, hi, e >> 2, w);
    out[j] = px_u32_to_unit(w[e & 3]) >= p ? row[j] * scale : 0.0f;
  }
}

// Forward of one head.  S: scratch of ATT_QB·T floats.
PX_KERNEL static void head_forward(const attention *a, head_view hv, float *o, int ldo, float *lse, float *S) {
  const int T = hv.T, d = hv.d, ld = hv.ld;
  const float scale = 1.0f / sqrtf((float)d);
  for (int i0 = 0; i0 < T; i0 += ATT_QB) {
    const int i1 = i0 + ATT_QB < T ? i0 + ATT_QB : T, nq = i1 - i0;
    // S = q[i0:i1] · k[0:i1]ᵀ / √d       (nq, d)·(d, i1), rows of length i1
    px_sgemm(false, true, nq, i1, d, scale, hv.q + (size_t)i0 * ld, ld, hv.k, ld, 0.0f, S, i1);
    for (int r = 0; r < nq; r++) {
      const int i = i0 + r, nv = i + 1;  // keys 0..i
      float *restrict row = S + (size_t)r * i1;
      float mx = row[0];
      for (int j = 1; j < nv; j++) mx = row[j] > mx ? row[j] : mx;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < nv; j++) {
        const float e = px_expf(row[j] - mx);
        row[j] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int j = 0; j < nv; j++) row[j] *= inv;
      for (int j = nv; j < i1; j++) row[j] = 0.0f;
      lse[i] = mx + logf(sum);
      if (a->drop) mask_row(a, hv.elem0 + (uint64_t)i * (uint64_t)T, row, row, nv);
    }
    // O[i0:i1] = P' · v[0:i1]             (nq, i1)·(i1, d)
    px_sgemm(false, false, nq, d, i1, 1.0f, S, i1, hv.v, ld, 0.0f, o + (size_t)i0 * ldo, ldo);
  }
}

// Backward of one head.  dq, dk, dv: this head's columns of dqkv (stride
// ld); scratch: 3·ATT_QB·T floats.
PX_KERNEL static void head_backward(const attention *a, head_view hv, const float *o, const float *dout, int ldo,
                                    const float *lse, float *dq, float *dk, float *dv, float *scratch) {
  const int T = hv.T, d = hv.d, ld = hv.ld;
  const float scale = 1.0f / sqrtf((float)d);
  float *P = scratch, *dP = scratch + (size_t)ATT_QB * T, *Pd = dP + (size_t)ATT_QB * T;
  // dk and dv accumulate over the tiles of queries that see them.
  for (int j = 0; j < T; j++)
    for (int c = 0; c < d; c++) dk[(size_t)j * ld + c] = dv[(size_t)j * ld + c] = 0.0f;
  for (int i0 = 0; i0 < T; i0 += ATT_QB) {
    const int i1 = i0 + ATT_QB < T ? i0 + ATT_QB : T, nq = i1 - i0;
    const float *dO = dout + (size_t)i0 * ldo;
    // P = exp(q·kᵀ/√d - lse)              recomputed, (nq, i1)
    px_sgemm(false, true, nq, i1, d, scale, hv.q + (size_t)i0 * ld, ld, hv.k, ld, 0.0f, P, i1);
    for (int r = 0; r < nq; r++) {
      const int i = i0 + r, nv = i + 1;
      float *restrict row = P + (size_t)r * i1;
      const float l = lse[i];
#pragma omp simd
      for (int j = 0; j < nv; j++) row[j] = px_expf(row[j] - l);
      for (int j = nv; j < i1; j++) row[j] = 0.0f;
    }
    // dP' = dO · vᵀ                       (nq, d)·(d, i1)
    px_sgemm(false, true, nq, i1, d, 1.0f, dO, ldo, hv.v, ld, 0.0f, dP, i1);
    const float *Pv = P;  // the probabilities v was weighted with: P' = P ⊙ M/(1-p)
    if (a->drop) {
      for (int r = 0; r < nq; r++) {
        const int i = i0 + r;
        const uint64_t e0 = hv.elem0 + (uint64_t)i * (uint64_t)T;
        mask_row(a, e0, P + (size_t)r * i1, Pd + (size_t)r * i1, i1);
        mask_row(a, e0, dP + (size_t)r * i1, dP + (size_t)r * i1, i1);  // dP = dP' ⊙ M/(1-p)
      }
      Pv = Pd;
    }
    // dv[0:i1] += P'ᵀ · dO                (i1, nq)·(nq, d)
    px_sgemm(true, false, i1, d, nq, 1.0f, Pv, i1, dO, ldo, 1.0f, dv, ld);
    // dS = P ⊙ (dP - D),  Dᵢ = dOᵢ·Oᵢ    (into dP)
    for (int r = 0; r < nq; r++) {
      const int i = i0 + r, nv = i + 1;
      const float *restrict orow = o + (size_t)i * ldo, *restrict grow = dout + (size_t)i * ldo;
      float D = 0.0f;
#pragma omp simd reduction(+ : D)
      for (int c = 0; c < d; c++) D += grow[c] * orow[c];
      const float *restrict prow = P + (size_t)r * i1;
      float *restrict srow = dP + (size_t)r * i1;
#pragma omp simd
      for (int j = 0; j < nv; j++) srow[j] = prow[j] * (srow[j] - D);
      for (int j = nv; j < i1; j++) srow[j] = 0.0f;
    }
    // dq[i0:i1] = dS · k[0:i1] / √d       (nq, i1)·(i1, d)
    px_sgemm(false, false, nq, d, i1, scale, dP, i1, hv.k, ld, 0.0f, dq + (size_t)i0 * ld, ld);
    // dk[0:i1] += dSᵀ · q[i0:i1] / √d     (i1, nq)·(nq, d)
    px_sgemm(true, false, i1, d, nq, scale, dP, i1, hv.q + (size_t)i0 * ld, ld, 1.0f, dk, ld);
  }
}

#ifdef PX_HAVE_CUDA
// The device path (tensor/cuda/k_attention.cu): the same children, the same
// saved state (qkv, o, lse, now device memory from the ctx's device arena)
// and the same dropout mask bits (rng.cuh's Philox).
static px_cuda_att_drop cuda_drop_of(const attention *a) {
  return (px_cuda_att_drop){.drop = a->drop,
                            .p = a->attn_p,
                            .seed = a->seed,
                            .hi = ((uint64_t)a->base.stream << 40) ^ a->step,
                            .head0 = a->head0,
                            .heads_total = a->heads_total};
}

static px_status attn_forward_cuda(attention *a, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  px_module *m = &a->base;
  if (ctx->device != PX_CUDA)
    return px_error(PX_ERR_INVALID, "CausalSelfAttention: input on the GPU but the step context on the CPU");
  const int H = a->n_head, C = a->dim;
  if (C / H > PX_CUDA_ATT_MAX_D)
    return px_error(PX_ERR_UNSUPPORTED, "CausalSelfAttention(%d, heads=%d) on CUDA: head width %d, at most %d",
                    a->in_dim, a->heads_total, C / H, PX_CUDA_ATT_MAX_D);
  px_status st = px_module_forward(m->children[0], ctx, x, &a->qkv);  // c_attn
  if (st != PX_OK) return st;
  const int64_t N = a->qkv.shape[0], T = a->qkv.shape[1];
  const int64_t oshape[3] = {N, T, C};
  if ((st = px_ctx_tensor(ctx, &a->o, 3, oshape)) != PX_OK) return st;
  a->lse = px_arena_alloc(ctx->arena, (size_t)(N * H * T + 1) * sizeof(float));
  if (!a->lse) return PX_ERR_NOMEM;
  a->n = N;
  a->t = T;
  a->drop = m->training && a->attn_p > 0.0f;
  a->seed = ctx->seed;
  a->step = ctx->step;
  a->bf16 = ctx->compute_dtype == PX_BF16;
  const px_cuda_att_drop drop = cuda_drop_of(a);
  if ((st = px_cuda_attention_forward(px_f32(&a->qkv), px_f32(&a->o), a->lse, (int)N, (int)T, C, H, &drop, a->bf16)) !=
      PX_OK)
    return st;
  px_tensor proj;
  if ((st = px_module_forward(m->children[1], ctx, &a->o, &proj)) != PX_OK) return st;  // c_proj
  return px_module_forward(m->children[2], ctx, &proj, y);                              // resid_dropout
}
#endif

static px_status attn_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  attention *a = (attention *)m;
  if (x->dtype != PX_F32 || x->ndim != 3 || x->shape[2] != a->in_dim) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE, "CausalSelfAttention(%d, heads=%d) \"%s\": input must be f32 (N, T, %d), got %s %s",
                    a->in_dim, a->heads_total, m->children[0]->params[0].name, a->in_dim, px_dtype_name(x->dtype),
                    px_shape_str(x->ndim, x->shape, s, sizeof s));
  }
  if (x->device == PX_CUDA) {
#ifdef PX_HAVE_CUDA
    return attn_forward_cuda(a, ctx, x, y);
#else
    return px_error(PX_ERR_UNSUPPORTED, "CausalSelfAttention: input on the GPU, but plexus was built without CUDA");
#endif
  }
  const int H = a->n_head, C = a->dim;
  px_status st = px_module_forward(m->children[0], ctx, x, &a->qkv);  // c_attn
  if (st != PX_OK) return st;
  // The positions c_attn gave: x's, or under sequence parallelism (a tensor-
  // parallel c_attn gathering its input) every tp rank's.
  const int64_t N = a->qkv.shape[0], T = a->qkv.shape[1];
  const int64_t oshape[3] = {N, T, C};
  if ((st = px_ctx_tensor(ctx, &a->o, 3, oshape)) != PX_OK) return st;
  const int nthr = omp_get_max_threads();
  a->lse = px_arena_alloc(ctx->arena, (size_t)(N * H * T + 1) * sizeof(float));
  float *scratch = px_arena_alloc(ctx->arena, (size_t)nthr * ATT_QB * (size_t)T * sizeof(float) + 64);
  if (!a->lse || !scratch) return PX_ERR_NOMEM;
  a->n = N;
  a->t = T;
  a->drop = m->training && a->attn_p > 0.0f;
  a->seed = ctx->seed;
  a->step = ctx->step;
  const float *qkv = px_f32(&a->qkv);
  float *O = px_f32(&a->o);
  const bool par = (double)(N * H) * (double)T * (double)T * (double)(C / H) >= ATT_PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t w = 0; w < N * H; w++) {
    const int64_t n = w / H;
    const int h = (int)(w % H);
    float *S = scratch + (size_t)omp_get_thread_num() * ATT_QB * (size_t)T;
    head_forward(a, head_of(a, qkv, n, h), O + (size_t)n * (size_t)T * C + (size_t)h * (C / H), C,
                 a->lse + (size_t)w * (size_t)T, S);
  }
  px_tensor proj;
  if ((st = px_module_forward(m->children[1], ctx, &a->o, &proj)) != PX_OK) return st;  // c_proj
  return px_module_forward(m->children[2], ctx, &proj, y);                              // resid_dropout
}

static px_status attn_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  attention *a = (attention *)m;
  const int64_t N = a->n, T = a->t;
  const int H = a->n_head, C = a->dim, d = C / H;
  px_tensor dproj, dout, dqkv;
  px_status st = px_module_backward(m->children[2], ctx, dy, &dproj);
  if (st == PX_OK) st = px_module_backward(m->children[1], ctx, &dproj, &dout);
  if (st == PX_OK) st = px_ctx_tensor_like(ctx, &dqkv, &a->qkv);
  if (st != PX_OK) return st;
#ifdef PX_HAVE_CUDA
  if (a->qkv.device == PX_CUDA) {
    // The row terms D_i = dO_i·O_i, (N, H, T), between the two kernels.
    float *Dterm = px_arena_alloc(ctx->arena, (size_t)(N * H * T + 1) * sizeof(float));
    if (!Dterm) return PX_ERR_NOMEM;
    const px_cuda_att_drop drop = cuda_drop_of(a);
    if ((st = px_cuda_attention_backward(px_f32(&a->qkv), px_f32(&a->o), a->lse, px_f32(&dout), px_f32(&dqkv), Dterm,
                                         (int)N, (int)T, C, H, &drop, a->bf16)) != PX_OK)
      return st;
    return px_module_backward(m->children[0], ctx, &dqkv, dx);  // c_attn
  }
#endif
  const int nthr = omp_get_max_threads();
  float *scratch = px_arena_alloc(ctx->arena, (size_t)nthr * 3 * ATT_QB * (size_t)T * sizeof(float) + 64);
  if (!scratch) return PX_ERR_NOMEM;
  const float *qkv = px_f32(&a->qkv), *O = px_f32(&a->o), *dO = px_f32(&dout);
  float *dQKV = px_f32(&dqkv);
  const bool par = (double)(N * H) * (double)T * (double)T * (double)d >= ATT_PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t w = 0; w < N * H; w++) {
    const int64_t n = w / H;
    const int h = (int)(w % H);
    float *sc = scratch + (size_t)omp_get_thread_num() * 3 * ATT_QB * (size_t)T;
    const size_t off = (size_t)n * (size_t)T * C + (size_t)h * d;
    float *dq = dQKV + (size_t)n * (size_t)T * 3 * C + (size_t)h * d;
    head_backward(a, head_of(a, qkv, n, h), O + off, dO + off, C, a->lse + (size_t)w * (size_t)T, dq, dq + C,
                  dq + 2 * C, sc);
  }
  return px_module_backward(m->children[0], ctx, &dqkv, dx);  // c_attn
}

static const px_module_ops attention_ops = {
  .type = "CausalSelfAttention",
  .forward = attn_forward,
  .backward = attn_backward,
};

px_module *px_attention_with(int in_dim, int dim, int n_head, int head0, int heads_total, float attn_dropout,
                             px_module *c_attn, px_module *c_proj, px_module *resid_dropout) {
  px_module *kids[3] = {c_attn, c_proj, resid_dropout};
  attention *a = NULL;
  if (in_dim <= 0 || dim <= 0 || n_head <= 0 || dim % n_head != 0 || head0 < 0 || head0 + n_head > heads_total) {
    px_error(PX_ERR_INVALID,
             "CausalSelfAttention(%d -> %d, heads %d..%d of %d): the width must be a positive "
             "multiple of the number of heads, and the heads within the model's",
             in_dim, dim, head0, head0 + n_head - 1, heads_total);
  } else if (!(attn_dropout >= 0.0f && attn_dropout < 1.0f)) {
    px_error(PX_ERR_INVALID, "CausalSelfAttention: attention dropout %g outside [0, 1)", (double)attn_dropout);
  } else if (c_attn && c_proj && resid_dropout) {
    a = (attention *)px_module_alloc(sizeof *a, &attention_ops);
  }
  if (!a) {
    for (int i = 0; i < 3; i++)
      if (kids[i]) px_module_free(kids[i]);
    return NULL;
  }
  a->dim = dim;
  a->n_head = n_head;
  a->in_dim = in_dim;
  a->head0 = head0;
  a->heads_total = heads_total;
  a->attn_p = attn_dropout;
  px_module *m = &a->base;
  // Hugging Face's names: attn.c_attn, attn.c_proj, attn.resid_dropout.
  const char *names[3] = {"c_attn", "c_proj", "resid_dropout"};
  bool ok = true;
  for (int i = 0; i < 3; i++) ok = ok && px_module_add_child(m, names[i], kids[i]) == PX_OK;
  if (!ok) {
    // The first failure's message stays; free whatever was not adopted.
    for (int i = 0; i < 3; i++)
      if (!kids[i]->parent) px_module_free(kids[i]);
    px_module_free(m);
    return NULL;
  }
  return m;
}

px_module *px_causal_self_attention(int dim, int n_head, float attn_dropout, float resid_dropout) {
  if (dim <= 0 || n_head <= 0 || dim % n_head != 0) {
    px_error(PX_ERR_INVALID,
             "CausalSelfAttention(%d, heads=%d): the width must be a positive multiple of the "
             "number of heads",
             dim, n_head);
    return NULL;
  }
  return px_attention_with(dim, dim, n_head, 0, n_head, attn_dropout, px_conv1d(dim, 3 * dim, true),
                           px_conv1d(dim, dim, true), px_dropout(resid_dropout));
}
