// Boxes of tensor-parallel parameters (DESIGN decision 8), the counted
// collectives of the tp layers, initialisation as the single-process model,
// and gradient-norm clipping over a tp group.
//
// A box of a global tensor G (G0, G1) (a vector is (G0, 1)) along split_dim
// d is up to three slices [global_offset[p], + size[p]) of dimension d,
// stored at [local_offset[p], + size[p]) of the local tensor; the other
// dimension is whole.  Example, c_attn.weight (C, 3C) in Conv1D layout at
// tp 2, w = C/2: rank 1 holds columns [w, C) ∪ [C + w, 2C) ∪ [2C + w, 3C)
// as its local (C, 3w) = [q_1 | k_1 | v_1].
//
// Clipping.  ‖g‖² = Σ over split parameters of every rank's box (disjoint:
// together the global tensor) + Σ over replicated parameters once (every
// tp rank holds the same gradient: the layers all-reduce what flows into
// them).  Each rank adds its boxes and, on tp rank 0 only, the replicated
// parameters; one all-reduce (f64) sums that.
#include "parallel/tp_internal.h"
#include "plexus/optim.h"
#include "plexus/parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

px_status px_tp_allreduce(px_tp_group *g, float *buf, size_t n, px_reduce_op op, bool backward) {
  if (!g || g->size <= 1) return PX_OK;
  if (backward) g->counts.bwd_allreduce++;
  else g->counts.fwd_allreduce++;
  g->counts.elems += n;
  const double t0 = px_time_now();
  px_status st = px_comm_allreduce(g->comm, buf, n, PX_F32, op);
  g->counts.seconds += px_time_now() - t0;
  return st == PX_OK ? st
                     : px_error_wrap(st, "tensor parallel (tp %d, rank %d): all-reduce of %zu floats in %s", g->size,
                                     g->rank, n, backward ? "backward" : "forward");
}

px_status px_tp_allgather(px_tp_group *g, const float *send, float *recv, size_t n, bool backward) {
  if (!g || g->size <= 1) {
    memmove(recv, send, n * sizeof(float));
    return PX_OK;
  }
  if (backward) g->counts.bwd_allgather++;
  else g->counts.fwd_allgather++;
  g->counts.elems += n * (size_t)g->size;
  const double t0 = px_time_now();
  px_status st = px_comm_allgather(g->comm, send, recv, n, PX_F32);
  g->counts.seconds += px_time_now() - t0;
  return st == PX_OK ? st
                     : px_error_wrap(st, "tensor parallel (tp %d, rank %d): all-gather of %zu floats in %s", g->size,
                                     g->rank, n, backward ? "backward" : "forward");
}

bool px_tp_is_module(const px_module *m) {
  return m && (m->ops == &px_tp_column_ops || m->ops == &px_tp_row_ops || m->ops == &px_tp_vocab_embedding_ops);
}

static px_tp_box whole(const px_param *p) {
  px_tp_box b = {.split_dim = -1, .n_parts = 1};
  b.global_shape[0] = p->ndim > 0 ? p->shape[0] : 1;
  b.global_shape[1] = p->ndim > 1 ? (int64_t)(p->numel / (size_t)p->shape[0]) : 1;
  b.size[0] = b.global_shape[p->ndim > 1 ? 1 : 0];
  return b;
}

px_tp_box px_tp_param_box(const px_param *p) {
  const px_module *m = p->owner;
  if (px_tp_is_module(m)) {
    const int k = (int)(p - m->params);
    if (k >= 0 && k < m->n_params) return ((const tp_module *)m)->box[k];
  }
  return whole(p);
}

// Local flat index of global element (i, j), or -1 when outside the box.
static int64_t local_index(const px_tp_box *b, int64_t i, int64_t j, int64_t local_cols) {
  if (b->split_dim < 0) return i * b->global_shape[1] + j;
  const int64_t x = b->split_dim == 0 ? i : j;
  for (int p = 0; p < b->n_parts; p++) {
    const int64_t o = x - b->global_offset[p];
    if (o < 0 || o >= b->size[p]) continue;
    return b->split_dim == 0 ? (b->local_offset[p] + o) * local_cols + j : i * local_cols + b->local_offset[p] + o;
  }
  return -1;
}

static int64_t local_cols_of(const px_param *p) { return p->ndim > 1 ? p->shape[1] : 1; }

void px_tp_box_take(const px_param *p, const float *global, float *local) {
  const px_tp_box b = px_tp_param_box(p);
  if (b.split_dim < 0) {
    memcpy(local, global, p->numel * sizeof(float));
    return;
  }
  const int64_t G1 = b.global_shape[1], lc = local_cols_of(p);
  for (int q = 0; q < b.n_parts; q++) {
    if (b.split_dim == 0) {  // whole rows: one copy per part
      memcpy(local + b.local_offset[q] * lc, global + b.global_offset[q] * G1,
             (size_t)(b.size[q] * G1) * sizeof(float));
    } else {
      for (int64_t i = 0; i < b.global_shape[0]; i++)
        memcpy(local + i * lc + b.local_offset[q], global + i * G1 + b.global_offset[q],
               (size_t)b.size[q] * sizeof(float));
    }
  }
}

void px_tp_init_boxes(px_module *m, px_rng *rng) {
  for (int k = 0; k < m->n_params; k++) {
    px_param *p = &m->params[k];
    if (!p->data) continue;  // sharded away (ZeRO stage 3)
    const px_tp_box b = px_tp_param_box(p);
    // model.c's default: one stream per parameter, (stream << 8) | k, drawn
    // over the whole (global) tensor in row-major order; keep our box.
    px_rng r = px_rng_make(rng->seed, ((uint64_t)m->stream << 8) | (uint64_t)k);
    const int64_t lc = local_cols_of(p);
    for (int64_t i = 0; i < b.global_shape[0]; i++)
      for (int64_t j = 0; j < b.global_shape[1]; j++) {
        float v = 0.0f;
        switch (p->init) {
        case PX_INIT_ZEROS: v = 0.0f; break;
        case PX_INIT_ONES: v = 1.0f; break;
        case PX_INIT_UNIFORM: v = p->init_a * (2.0f * px_rng_uniform(&r) - 1.0f); break;
        case PX_INIT_NORMAL: v = p->init_a * px_rng_normal(&r); break;
        }
        const int64_t at = local_index(&b, i, j, lc);
        if (at >= 0) p->data[at] = v;
      }
  }
}

px_status px_tp_load_state_dict(px_model *model, const px_state_dict *global) {
  for (int i = 0; i < model->n_params + model->n_buffers; i++) {
    px_param *p = i < model->n_params ? model->params[i] : model->buffers[i - model->n_params];
    const int k = px_state_dict_find(global, p->name);
    if (k < 0) return px_error(PX_ERR_NOT_FOUND, "tensor parallel: the full model has no tensor \"%s\"", p->name);
    const px_tensor *t = &global->items[k].tensor;
    const px_tp_box b = px_tp_param_box(p);
    const int64_t n = px_tensor_numel(t);
    const int64_t g0 = t->ndim > 0 ? t->shape[0] : 1;
    if (t->dtype != PX_F32 || t->ndim != p->ndim || g0 != b.global_shape[0] ||
        n != b.global_shape[0] * b.global_shape[1]) {
      char s[PX_SHAPE_STR_MAX];
      return px_error(PX_ERR_SHAPE,
                      "tensor parallel: \"%s\" is %s %s in the full model, but this rank's box is of a "
                      "(%lld, %lld) tensor",
                      p->name, px_dtype_name(t->dtype), px_shape_str(t->ndim, t->shape, s, sizeof s),
                      (long long)b.global_shape[0], (long long)b.global_shape[1]);
    }
    if (p->data) px_tp_box_take(p, px_f32(t), p->data);
  }
  return PX_OK;
}

px_status px_tp_clip_grad_norm(px_tp_group *g, px_model *model, float max_norm, float *norm_out) {
  if (!model->grad_data)
    return px_error(PX_ERR_INVALID,
                    "tensor parallel: clip_grad_norm needs the model's gradients (a sharding "
                    "strategy holds them)");
  const bool first = !g || g->rank == 0;
  double ss = 0;
  for (int i = 0; i < model->n_params; i++) {
    const px_param *p = model->params[i];
    if (px_tp_param_box(p).split_dim >= 0 || first) ss += px_sumsq(p->grad, p->numel);
  }
  if (g && g->size > 1) {
    px_status st = px_comm_allreduce(g->comm, &ss, 1, PX_F64, PX_SUM);
    if (st != PX_OK) return px_error_wrap(st, "tensor parallel: the gradient norm's all-reduce");
  }
  const float norm = (float)sqrt(ss);
  px_clip_grad_scale(model->grad_data, model->n_param_elems, norm, max_norm);
  if (norm_out) *norm_out = norm;
  return PX_OK;
}

px_status px_tp_zero_clip_grad_norm(const px_mesh *mesh, px_zero *z, px_model *model, float max_norm, float *norm_out) {
  if (px_zero_stage(z) == 3)
    return px_error(PX_ERR_UNSUPPORTED, "tensor parallel: clipping under ZeRO stage 3 is not supported (stages 1-2)");
  float *shard, *grads;
  size_t n;
  px_zero_shard(z, &shard, &grads, &n);
  const int nseg = px_zero_segments(z, NULL, NULL, NULL, 0);
  size_t *buf = malloc((size_t)(nseg > 0 ? nseg : 1) * 3 * sizeof *buf);
  if (!buf) return px_error(PX_ERR_NOMEM, "tensor parallel: out of memory for %d shard segments", nseg);
  size_t *flat_off = buf, *shard_off = buf + nseg, *count = buf + 2 * nseg;
  px_zero_segments(z, flat_off, shard_off, count, nseg);
  // Stage 1 steps its pieces in place in grad_data; stage 2 keeps them in
  // its contiguous shard (px_zero_shard's grads).
  const bool in_place = px_zero_stage(z) == 1;
  float **seg_grads = malloc((size_t)(nseg > 0 ? nseg : 1) * sizeof *seg_grads);
  if (!seg_grads) {
    free(buf);
    return px_error(PX_ERR_NOMEM, "tensor parallel: out of memory for %d shard segments", nseg);
  }
  for (int k = 0; k < nseg; k++) seg_grads[k] = in_place ? model->grad_data + flat_off[k] : grads + shard_off[k];
  const bool first = mesh->tp_rank == 0;
  double ss = 0;
  // Parameters are laid out in order (model->params[i]->offset increasing):
  // walk each segment against them.
  for (int k = 0; k < nseg; k++) {
    const size_t a = flat_off[k], b = a + count[k];
    for (int i = 0; i < model->n_params; i++) {
      const px_param *p = model->params[i];
      const size_t lo = p->offset > a ? p->offset : a, hi = p->offset + p->numel < b ? p->offset + p->numel : b;
      if (lo >= hi || !(first || px_tp_param_box(p).split_dim >= 0)) continue;
      ss += px_sumsq(seg_grads[k] + (lo - a), hi - lo);
    }
  }
  px_status st = px_comm_allreduce(mesh->dp_comm, &ss, 1, PX_F64, PX_SUM);
  if (st == PX_OK && mesh->tp > 1) st = px_comm_allreduce(mesh->tp_comm, &ss, 1, PX_F64, PX_SUM);
  const float norm = (float)sqrt(ss);
  if (st == PX_OK) {
    if (in_place)
      for (int k = 0; k < nseg; k++) px_clip_grad_scale(seg_grads[k], count[k], norm, max_norm);
    else px_clip_grad_scale(grads, n, norm, max_norm);
  }
  free(seg_grads);
  free(buf);
  if (st != PX_OK) return px_error_wrap(st, "tensor parallel: the ZeRO gradient norm's all-reduce");
  if (norm_out) *norm_out = norm;
  return PX_OK;
}
