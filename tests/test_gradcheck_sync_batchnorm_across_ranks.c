/* Claim: synchronized batch norm's backward is the derivative of the
 * global loss G = (1/N) Σ_k L_k, L_k = Σ y_k ⊙ r_k, over N = 2 and 3 ranks
 * (threads): for γ and β, the ranks' gradients averaged (what DDP does);
 * for an input entry of rank j, dx_j / N -- which includes the paths
 * through the other ranks' outputs, since every rank's statistics depend on
 * rank j's values.  Central differences with h = 1e-2, every rank running
 * each probe's forward (the statistics are a collective); tolerance as in
 * gradcheck.h (rtol 1e-2, atol 1e-3; a missing cross-rank term is O(1)).
 *
 * If it fails, --sync-bn trains with wrong gradients. */
#include "px_test.h"

#include <math.h>
#include <string.h>

enum { B = 3, C = 2, S = 4 };
#define NX (B * C * S)

static double global_loss(px_comm *comm, px_model *md, float *x, const float *r) {
  px_tensor xt = px_tensor_f32(x, 3, B, C, S, 0), y;
  CHECK_OK(px_model_forward(md, &xt, &y));
  double L = 0;
  for (int i = 0; i < NX; i++) L += (double)px_f32(&y)[i] * r[i];
  CHECK_OK(px_comm_allreduce(comm, &L, 1, PX_F64, PX_SUM));
  return L / px_comm_size(comm);
}

static bool agree(double analytic, double numeric) {
  return fabs(analytic - numeric) <= 1e-3 + 1e-2 * fmax(fabs(analytic), fabs(numeric));
}

static int rank_fn(px_comm *comm, void *arg) {
  (void)arg;
  const int k = px_comm_rank(comm), n = px_comm_size(comm);
  px_module *bn = px_batchnorm(C, 1e-5f, 0.1f);
  CHECK_OK(px_sync_batchnorm_convert(bn, comm, NULL));
  px_model *md = NULL;
  CHECK_OK(px_model_create(&md, bn, 3));
  // γ and β away from 1 and 0, the same on every rank.
  for (int c = 0; c < C; c++) {
    bn->params[0].data[c] = 0.5f + 0.3f * (float)c;
    bn->params[1].data[c] = -0.2f + 0.1f * (float)c;
  }
  float x[NX], r[NX];
  px_rng g = px_rng_make(5, (uint64_t)k);
  for (int i = 0; i < NX; i++) x[i] = px_rng_uniform(&g) * 2.0f - 1.0f + 0.5f * (float)k;
  for (int i = 0; i < NX; i++) r[i] = px_rng_uniform(&g) * 2.0f - 1.0f;

  // Analytic: one forward and backward with dy = r.
  px_tensor xt = px_tensor_f32(x, 3, B, C, S, 0), y, dx;
  CHECK_OK(px_model_forward(md, &xt, &y));
  px_tensor dy = y;
  dy.data = r;
  px_model_zero_grad(md);
  CHECK_OK(px_model_backward(md, &dy, &dx));
  float dxs[NX];
  memcpy(dxs, px_f32(&dx), sizeof dxs);
  float grads[2 * C];
  memcpy(grads, md->grad_data, sizeof grads);
  CHECK_OK(px_comm_allreduce(comm, grads, 2 * C, PX_F32, PX_AVG));

  const double h = 1e-2;
  // Parameters: every rank moves the same entry.
  for (int p = 0; p < 2; p++)
    for (int c = 0; c < C; c++) {
      float *e = &bn->params[p].data[c];
      const float keep = *e;
      *e = keep + (float)h;
      double up = global_loss(comm, md, x, r);
      *e = keep - (float)h;
      double down = global_loss(comm, md, x, r);
      *e = keep;
      double numeric = (up - down) / (2 * h);
      CHECK(agree(grads[p * C + c], numeric), "%d ranks: d%s[%d]: analytic %.6g, numeric %.6g", n, p ? "beta" : "gamma",
            c, (double)grads[p * C + c], numeric);
    }
  // Inputs: rank j moves its entry i; every rank runs the probes.
  for (int j = 0; j < n; j++)
    for (int i = 0; i < NX; i += 5) {
      const float keep = x[i];
      if (k == j) x[i] = keep + (float)h;
      double up = global_loss(comm, md, x, r);
      if (k == j) x[i] = keep - (float)h;
      double down = global_loss(comm, md, x, r);
      x[i] = keep;
      double numeric = (up - down) / (2 * h);
      if (k == j)
        CHECK(agree(dxs[i] / n, numeric), "%d ranks: input %d of rank %d: analytic dx/N %.6g, numeric %.6g", n, i, j,
              (double)(dxs[i] / n), numeric);
    }
  px_model_free(md);
  return 0;
}

int main(void) {
  for (int n = 2; n <= 3; n++) {
    int code = 0;
    CHECK_OK(px_comm_run(n, rank_fn, NULL, &code));
    CHECK(code == 0, "%d ranks: a rank failed", n);
  }
  return px_test_finish("test_gradcheck_sync_batchnorm_across_ranks");
}
