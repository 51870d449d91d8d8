// Vocabulary-parallel cross-entropy (Megatron-LM's vocab_parallel_cross_entropy).
//
// Rank r holds z_r = the columns [f_r, f_r + n_r) of the logits z: (R, V);
// no rank holds z whole.  Per row i, target t_i:
//   m_i   = max_r max_j z_r[i, j]                 all-reduce MAX   (R floats)
//   z_t,i = the one rank holding t_i gives z[i, t_i], the others 0
//                                                 all-reduce SUM   (R floats, exact)
//   s_i   = Σ_r Σ_j e^(z_r[i, j] - m_i)           all-reduce SUM   (R doubles)
//   loss  = (1/V') Σ_{i valid} (m_i + log s_i - z_t,i)   (V': rows not ignored)
//   dz_r[i, j] = (e^(z_r[i, j] - m_i) / s_i - [f_r + j = t_i]) / V'
// The same loss on every rank; each rank gets its own columns of dz.
// Communication: 3 all-reduces of R numbers, against R·V for gathering the
// logits.  Computed as px_cross_entropy_loss computes (float exponentials,
// double sums), so the loss equals the single-process one to rounding.
#include "parallel/tp_internal.h"
#include "tensor/internal.h"

#include <math.h>
#include <stdlib.h>

px_status px_tp_cross_entropy(px_tp_group *g, const px_tensor *logits, int vocab, const int32_t *targets,
                              int ignore_index, float *loss, float *dlogits) {
  const int P = g ? g->size : 1, rank = g ? g->rank : 0;
  int first, n;
  if (vocab < P) return px_error(PX_ERR_INVALID, "vocab-parallel cross-entropy: vocabulary %d < tp %d", vocab, P);
  px_tp_vocab_range(vocab, rank, P, &first, &n);
  if (logits->dtype != PX_F32 || logits->ndim < 1 || logits->shape[logits->ndim - 1] != n) {
    char s[PX_SHAPE_STR_MAX];
    return px_error(PX_ERR_SHAPE,
                    "vocab-parallel cross-entropy: logits %s %s must be f32 ending in this rank's %d "
                    "vocabulary columns [%d, %d) of %d (tp rank %d of %d)",
                    px_dtype_name(logits->dtype), px_shape_str(logits->ndim, logits->shape, s, sizeof s), n, first,
                    first + n, vocab, rank, P);
  }
  const int64_t R = px_tensor_numel(logits) / n;
  int64_t valid = 0;
  for (int64_t i = 0; i < R; i++) {
    if (targets[i] == ignore_index) continue;
    if (targets[i] < 0 || targets[i] >= vocab)
      return px_error(PX_ERR_INVALID, "vocab-parallel cross-entropy: target %d of row %lld is not a class in [0, %d)",
                      targets[i], (long long)i, vocab);
    valid++;
  }
  float *mx = malloc((size_t)R * 2 * sizeof(float));
  double *se = malloc((size_t)R * sizeof(double));
  if (!mx || !se) {
    free(mx);
    free(se);
    return px_error(PX_ERR_NOMEM, "vocab-parallel cross-entropy: out of memory for %lld rows", (long long)R);
  }
  float *zt = mx + R;
  const float *Z = px_f32(logits);
  for (int64_t i = 0; i < R; i++) {
    const float *z = Z + i * n;
    float m = z[0];
    for (int j = 1; j < n; j++) m = z[j] > m ? z[j] : m;
    mx[i] = m;
    const int local = targets[i] - first;
    zt[i] = targets[i] != ignore_index && local >= 0 && local < n ? z[local] : 0.0f;
  }
  px_status st = px_tp_allreduce(g, mx, (size_t)R, PX_MAX, false);
  if (st == PX_OK) st = px_tp_allreduce(g, zt, (size_t)R, PX_SUM, false);
  for (int64_t i = 0; st == PX_OK && i < R; i++) {
    const float *z = Z + i * n;
    double s = 0;
    for (int j = 0; j < n; j++) s += px_expf(z[j] - mx[i]);
    se[i] = s;
  }
  if (st == PX_OK && g && g->size > 1) {
    g->counts.fwd_allreduce++;
    g->counts.elems += (size_t)R;
    st = px_comm_allreduce(g->comm, se, (size_t)R, PX_F64, PX_SUM);
    if (st != PX_OK) px_error_wrap(st, "vocab-parallel cross-entropy: all-reduce of the sums of exponentials");
  }
  if (st == PX_OK) {
    const float inv_valid = valid ? 1.0f / (float)valid : 0.0f;
    double total = 0;
    for (int64_t i = 0; i < R; i++) {
      float *dz = dlogits ? dlogits + i * n : NULL;
      if (targets[i] == ignore_index) {
        if (dz)
          for (int j = 0; j < n; j++) dz[j] = 0.0f;
        continue;
      }
      total += (double)mx[i] + log(se[i]) - (double)zt[i];
      if (!dz) continue;
      const float *z = Z + i * n;
      const float a = (float)(1.0 / se[i]) * inv_valid;
      for (int j = 0; j < n; j++) dz[j] = px_expf(z[j] - mx[i]) * a;
      const int local = targets[i] - first;
      if (local >= 0 && local < n) dz[local] -= inv_valid;
    }
    *loss = valid ? (float)(total / (double)valid) : 0.0f;
  }
  free(mx);
  free(se);
  return st;
}
