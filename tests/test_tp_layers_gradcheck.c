/* Claim: the tensor-parallel layers compute the gradients of what they
 * compute, across ranks: under the threads backend with tp = 2 (and 4), the
 * analytic gradients (input and every rank's parameter boxes) match central
 * finite differences of the loss, summed in double, for
 *   - column-parallel (nn.Linear layout) then row-parallel (the MLP pair:
 *     one all-reduce each way),
 *   - column-parallel in GPT-2's Conv1D layout with q, k, v parts (c_attn),
 *     whose loss is the sum over ranks,
 *   - column-parallel with a gathered output,
 *   - the vocabulary-parallel embedding → tied head → vocabulary-parallel
 *     cross-entropy, with a vocabulary tp does not divide (uneven split),
 * and their outputs equal the single-process layers' (same seed: the tp
 * layers start as boxes of the single-process weights) to 1e-5.
 * If this fails, a layer misses its all-reduce (a gradient off by the other
 * ranks' share), takes the wrong box (q/k/v columns of another head), or
 * the initialisation of a box differs from the single-process tensor's. */
#include "px_test.h"

#include <string.h>

enum { N = 3, T = 4, IN = 6, HID = 8, V = 11 };

typedef enum { PAIR_LINEAR, QKV_CONV1D, GATHER_LINEAR, VOCAB_CE } case_kind;
static const char *const case_names[] = {"column→row (Linear)", "c_attn q,k,v (Conv1D)", "column gathered (Linear)",
                                         "vocab embedding→head→CE"};

typedef struct probe {
  case_kind kind;
  px_tp_group *g;
  px_model *md;
  px_tensor x; /* f32 (N, T, IN) or i32 (N, T) */
  int32_t targets[N * T];
  float *r; /* projection of the output (this rank's part) */
} probe;

static px_module *build(case_kind k, px_tp_group *g) {
  switch (k) {
  case PAIR_LINEAR:
    return px_chain_of(2, px_tp_column_parallel(g, PX_TP_LINEAR, IN, HID, true, 1, false),
                       px_tp_row_parallel(g, PX_TP_LINEAR, HID, IN, true));
  case QKV_CONV1D: return px_chain_of(1, px_tp_column_parallel(g, PX_TP_CONV1D, IN, 3 * HID, true, 3, false));
  case GATHER_LINEAR: return px_chain_of(1, px_tp_column_parallel(g, PX_TP_LINEAR, IN, HID, true, 1, true));
  case VOCAB_CE: {
    px_module *e = px_tp_vocab_embedding(g, V, IN);
    return px_chain_of(2, e, px_tp_vocab_tied_head(g, e));
  }
  }
  return NULL;
}

// The single-process model of the same place in the tree.
static px_module *build_full(case_kind k) {
  switch (k) {
  case PAIR_LINEAR: return px_chain_of(2, px_linear(IN, HID, true), px_linear(HID, IN, true));
  case QKV_CONV1D: return px_chain_of(1, px_conv1d(IN, 3 * HID, true));
  case GATHER_LINEAR: return px_chain_of(1, px_linear(IN, HID, true));
  case VOCAB_CE: {
    px_module *e = px_embedding(V, IN);
    return px_chain_of(2, e, px_tied_head(e));
  }
  }
  return NULL;
}

static bool split_output(case_kind k) { return k == QKV_CONV1D; }

// The loss, the same on every rank; with grads, also backward (dx into dxa).
static double loss_of(probe *p, bool grads, float *dxa) {
  p->md->ctx.step = 0;
  px_tensor y;
  CHECK_OK(px_model_forward(p->md, &p->x, &y));
  const size_t ny = (size_t)px_tensor_numel(&y);
  double L = 0;
  float *dy = grads ? px_model_scratch(p->md, ny) : NULL;
  if (p->kind == VOCAB_CE) {
    float l;
    CHECK_OK(px_tp_cross_entropy(p->g, &y, V, p->targets, -100, &l, dy));
    L = l;
  } else {
    for (size_t i = 0; i < ny; i++) L += (double)px_f32(&y)[i] * p->r[i];
    if (split_output(p->kind)) CHECK_OK(px_comm_allreduce(p->g->comm, &L, 1, PX_F64, PX_SUM));
    if (dy) memcpy(dy, p->r, ny * sizeof *dy);
  }
  if (grads) {
    px_tensor dyt = y, dx;
    dyt.data = dy;
    px_model_zero_grad(p->md);
    CHECK_OK(px_model_backward(p->md, &dyt, dxa ? &dx : NULL));
    if (dxa) memcpy(dxa, dx.data, (size_t)px_tensor_numel(&dx) * sizeof(float));
  }
  return L;
}

static bool close_enough(double a, double n) { return fabs(a - n) <= 1e-3 + 1e-2 * fmax(fabs(a), fabs(n)); }

static void run_case(px_comm *c, case_kind k) {
  px_tp_group g = px_tp_group_of(c);
  const int P = g.size, rank = g.rank;
  probe p = {.kind = k, .g = &g};
  CHECK_OK(px_model_create(&p.md, build(k, &g), 5));
  px_model *full;
  CHECK_OK(px_model_create(&full, build_full(k), 5));
  float xf[N * T * IN];
  int32_t ids[N * T];
  px_rng rr = px_rng_make(17, 0);  // the same input on every rank
  for (int i = 0; i < N * T * IN; i++) xf[i] = 2.0f * px_rng_uniform(&rr) - 1.0f;
  for (int i = 0; i < N * T; i++) {
    ids[i] = (int32_t)px_rng_below(&rr, V);
    p.targets[i] = (int32_t)px_rng_below(&rr, V);
  }
  p.targets[5] = -100;  // an ignored row
  p.x = k == VOCAB_CE ? px_tensor_view(ids, PX_I32, 2, (int64_t[]){N, T})
                      : px_tensor_view(xf, PX_F32, 3, (int64_t[]){N, T, IN});

  // Forward equals the single-process layers (this rank's columns of them).
  px_tensor y, yf;
  CHECK_OK(px_model_forward(p.md, &p.x, &y));
  CHECK_OK(px_model_forward(full, &p.x, &yf));
  const int64_t ny = px_tensor_numel(&y), cols = y.shape[y.ndim - 1], fcols = yf.shape[yf.ndim - 1];
  double worst = 0;
  for (int64_t i = 0; i < ny; i++) {
    const int64_t row = i / cols, col = i % cols;
    int64_t fcol = col;  // this rank's column in the full output
    if (k == QKV_CONV1D) {
      const int w = HID / P;
      fcol = (col / w) * HID + rank * w + col % w;
    }
    if (k == VOCAB_CE) {
      int f, n;
      px_tp_vocab_range(V, rank, P, &f, &n);
      fcol = f + col;
    }
    const double a = px_f32(&y)[i], b = px_f32(&yf)[row * fcols + fcol];
    worst = fmax(worst, fabs(a - b) / fmax(1.0, fabs(b)));
  }
  CHECK(worst <= 1e-5, "tp %d rank %d %s: output differs from the single-process layer by %.3g", P, rank, case_names[k],
        worst);

  // Finite differences.
  p.r = malloc((size_t)ny * sizeof *p.r);
  px_rng rp = px_rng_make(99, (uint64_t)rank);  // split outputs: each rank its own part of r
  if (!split_output(k)) rp = px_rng_make(99, 0);
  for (int64_t i = 0; i < ny; i++) p.r[i] = 2.0f * px_rng_uniform(&rp) - 1.0f;
  const size_t nx = (size_t)px_tensor_numel(&p.x), np = p.md->n_param_elems;
  float *dxa = malloc(nx * sizeof *dxa), *dpa = malloc(np * sizeof *dpa);
  loss_of(&p, true, k == VOCAB_CE ? NULL : dxa);
  memcpy(dpa, p.md->grad_data, np * sizeof *dpa);
  const float h = 1e-2f;
  int bad = 0, checked = 0;
  if (k != VOCAB_CE) {
    float *X = px_f32(&p.x);
    for (size_t i = 0; i < nx; i += 5) {  // the input: the same entry on every rank
      const float keep = X[i];
      X[i] = keep + h;
      const double lp = loss_of(&p, false, NULL);
      X[i] = keep - h;
      const double lm = loss_of(&p, false, NULL);
      X[i] = keep;
      const double num = (lp - lm) / (2.0 * h);
      checked++;
      if (!close_enough(dxa[i], num)) {
        bad++;
        fprintf(stderr, "tp %d rank %d %s: dx[%zu] analytic %.6g numeric %.6g\n", P, rank, case_names[k], i,
                (double)dxa[i], num);
      }
    }
  }
  // Each rank's boxes in turn: the owner perturbs, every rank computes L.
  size_t max_np = np;
  CHECK_OK(px_comm_allreduce(c, &max_np, 1, PX_I64, PX_MAX));
  for (int owner = 0; owner < P; owner++)
    for (size_t i = 0; i < max_np; i += max_np <= 64 ? 1 : 3) {
      const bool mine = rank == owner && i < np;
      float keep = mine ? p.md->param_data[i] : 0.0f;
      if (mine) p.md->param_data[i] = keep + h;
      const double lp = loss_of(&p, false, NULL);
      if (mine) p.md->param_data[i] = keep - h;
      const double lm = loss_of(&p, false, NULL);
      if (!mine) continue;
      p.md->param_data[i] = keep;
      const double num = (lp - lm) / (2.0 * h);
      checked++;
      if (!close_enough(dpa[i], num)) {
        bad++;
        fprintf(stderr, "tp %d rank %d %s: dtheta[%zu] analytic %.6g numeric %.6g\n", P, rank, case_names[k], i,
                (double)dpa[i], num);
      }
    }
  CHECK(bad == 0, "tp %d rank %d %s: %d of %d gradient entries differ from finite differences", P, rank, case_names[k],
        bad, checked);
  CHECK(checked > 10, "tp %d rank %d %s: only %d entries checked", P, rank, case_names[k], checked);
  if (rank == 0)
    printf("  tp %d %-26s %3d entries on rank 0, forward vs one process %.1e\n", P, case_names[k], checked, worst);
  free(p.r);
  free(dxa);
  free(dpa);
  px_model_free(full);
  px_model_free(p.md);
}

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 120);
  for (int k = PAIR_LINEAR; k <= VOCAB_CE; k++) run_case(c, (case_kind)k);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  const int tps[2] = {2, 4};
  for (int i = 0; i < 2; i++) {
    int code = 0;
    CHECK_OK(px_comm_run(tps[i], run_all, NULL, &code));
    CHECK(code == 0, "tp %d: a rank failed (%d)", tps[i], code);
  }
  return px_test_finish("test_tp_layers_gradcheck");
}
