// The pipeline executor: runs a px_pp_schedule's actions on this rank's
// stage models, moving activations and gradients with px_comm's
// point-to-point calls (pipeline.h explains the slots and the shape headers).
#include "plexus/pipeline.h"
#include "plexus/tensor_parallel.h"
#include "parallel/rank_sum.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// Message tags: one per (what, sending stage, micro-batch), so that a
// receive can only match the message it is for.
enum { TAG_ACT = 0, TAG_ACT_HDR, TAG_GRAD, TAG_GRAD_HDR, TAG_KINDS };
// Shape header: dtype, ndim, shape.
enum { HDR_LEN = 2 + PX_MAX_DIMS };

typedef struct pp_slot {
  px_model *md;
  int micro;  // in flight: its micro-batch; free: -1
} pp_slot;

typedef struct pp_msg {  // one micro-batch's receive or send buffer
  void *buf;
  size_t bytes;
  px_request *req;  // pending receive (waited for by its consumer)
  px_tensor t;      // shape and dtype once known
  bool have;        // received (or written) in this step
} pp_msg;

typedef struct pp_chunk {
  int stage;
  pp_slot *slot;
  int n_slots;
  px_optim *opt;
  pp_msg *in;           // [m] received activations (stage > 0)
  pp_msg *dy;           // [m] received output gradients (stage < S-1)
  pp_msg *out;          // [m] copies of outputs to send
  pp_msg *dx;           // [m] copies of input gradients to send
  px_tensor *y;         // [m] output of the forward (in its slot's arena)
  float **dloss;        // [m] last stage: ∂loss/∂output (in the slot's arena)
  int *slot_of;         // [m]
  px_tensor act_shape;  // the input activation's shape and dtype (first step)
  bool act_known;
  // ZeRO over dp: this dp rank's slice [z_off, z_off + z_len) of the flat
  // buffers (piece z_piece = ceil(n / |dp|)), a piece to send, and — only
  // when n is not a multiple of |dp| — |dp| · z_piece floats of padded
  // exchange space (else the reduce-scatter runs in place in the gradient
  // buffer and the all-gather lands in the parameter buffer).
  size_t z_off, z_len, z_piece;
  float *z_buf, *z_send;
} pp_chunk;

struct px_pp {
  px_comm *comm;
  const px_pp_schedule *sched;
  px_pp_plan *plan;
  int rank, p, m, v, S;
  pp_chunk *chunk;     // [v]
  px_request **sends;  // pending sends of this step
  int n_sends, cap_sends;
  uint64_t steps;      // completed training steps
  uint64_t step_base;  // steps before this px_pp (a resumed run: px_pp_set_step_base)
  // A tied head away from its embedding: the two stages, and the group of
  // their ranks that sums the copies' gradients (NULL: not in it, or p = 1).
  int tied_emb_stage, tied_head_stage;
  px_comm *emb_comm;
  int64_t rows;  // rows per micro-batch of the first step
  double loss_sum;
  float clip;
  bool want_norm;
  // 3D: the data-parallel replicas (NULL: none) and the tensor-parallel group.
  px_comm *dp, *tp;
  int dp_size, dp_rank, tp_rank, zero;
  pxr_ctx rsum;  // rank-order sums over dp (DDP's and ZeRO's)
  bool rsum_on;  // measure the global gradient norm without clipping
  px_pp_stats stats;
};

static int tag_of(const px_pp *pp, int kind, int stage, int micro) {
  return ((stage * pp->m) + micro) * TAG_KINDS + kind;
}

static const char *op_name(px_pp_op op) { return px_pp_op_name(op); }

// p = 1: consecutive stages share the rank, so an activation or gradient is
// handed over in memory (the schedule has no SEND/RECV for it).
static bool local_prev(const px_pp *pp) { return pp->p == 1; }

int px_pp_n_chunks(const px_pp *pp) { return pp->v; }
px_model *px_pp_chunk_model(px_pp *pp, int chunk) {
  return chunk >= 0 && chunk < pp->v ? pp->chunk[chunk].slot[0].md : NULL;
}
int px_pp_chunk_stage(const px_pp *pp, int chunk) { return chunk >= 0 && chunk < pp->v ? pp->chunk[chunk].stage : -1; }
const px_pp_plan *px_pp_plan_of(const px_pp *pp) { return pp->plan; }

void px_pp_set_lr(px_pp *pp, float lr) {
  for (int c = 0; c < pp->v; c++)
    if (pp->chunk[c].opt) px_optim_set_lr(pp->chunk[c].opt, lr);
}

void px_pp_measure_grad_norm(px_pp *pp, bool on) { pp->want_norm = on; }

void px_pp_stats_get(const px_pp *pp, px_pp_stats *out) {
  *out = pp->stats;
  out->slots = 0;
  out->arena_high = 0;
  out->comm_bytes = 0;
  out->param_elems = 0;
  for (int c = 0; c < pp->v; c++) {
    const pp_chunk *ch = &pp->chunk[c];
    out->slots += ch->n_slots;
    out->param_elems += ch->slot[0].md->n_param_elems;
    for (int k = 0; k < ch->n_slots; k++) out->arena_high += px_arena_high_water(ch->slot[k].md->arena);
    for (int j = 0; j < pp->m; j++)
      out->comm_bytes += ch->in[j].bytes + ch->dy[j].bytes + ch->out[j].bytes + ch->dx[j].bytes;
  }
}

static void msg_free(pp_msg *a, int n) {
  if (!a) return;
  for (int j = 0; j < n; j++) {
    if (a[j].req) (void)px_request_wait(a[j].req);
    free(a[j].buf);
  }
  free(a);
}

void px_pp_free(px_pp *pp) {
  if (!pp) return;
  for (int i = 0; i < pp->n_sends; i++) (void)px_request_wait(pp->sends[i]);
  free(pp->sends);
  for (int c = 0; pp->chunk && c < pp->v; c++) {
    pp_chunk *ch = &pp->chunk[c];
    for (int k = ch->n_slots - 1; ch->slot && k >= 0; k--) {
      px_model *md = ch->slot[k].md;
      if (md && k > 0) {  // shares slot 0's buffers: do not free them twice
        md->param_data = md->grad_data = md->buffer_data = NULL;
      }
      px_model_free(md);
    }
    free(ch->slot);
    px_optim_free(ch->opt);
    msg_free(ch->in, pp->m);
    msg_free(ch->dy, pp->m);
    msg_free(ch->out, pp->m);
    msg_free(ch->dx, pp->m);
    free(ch->y);
    free(ch->dloss);
    free(ch->slot_of);
    free(ch->z_buf);
    free(ch->z_send);
  }
  free(pp->chunk);
  if (pp->rsum_on) pxr_fini(&pp->rsum);
  px_comm_free(pp->emb_comm);
  px_pp_plan_free(pp->plan);
  free(pp);
}

// Micro-batches of chunk c that the schedule keeps in flight at once
// (forwarded, not yet backwarded): the slots it needs.
static int max_in_flight(const px_pp_schedule *s, int rank, int stage) {
  int now = 0, most = 0;
  for (int i = 0; i < s->n_actions[rank]; i++) {
    const px_pp_action *a = &s->actions[rank][i];
    if (a->stage != stage) continue;
    if (a->op == PX_PP_FORWARD && ++now > most) most = now;
    if (a->op == PX_PP_BACKWARD) now--;
  }
  return most > 0 ? most : 1;
}

// A slot model shares slot 0's parameters, gradients and buffers.
static void share_buffers(px_model *md, const px_model *first) {
  free(md->param_data);
  free(md->grad_data);
  free(md->buffer_data);
  md->param_data = first->param_data;
  md->grad_data = first->grad_data;
  md->buffer_data = first->buffer_data;
  for (int i = 0; i < md->n_params; i++) {
    md->params[i]->data = first->params[i]->data;
    md->params[i]->grad = first->params[i]->grad;
  }
  for (int i = 0; i < md->n_buffers; i++) md->buffers[i]->data = first->buffers[i]->data;
}

px_status px_pp_create(px_pp **out, px_comm *pipe, const px_pp_schedule *sched, const px_pp_opts *opts) {
  *out = NULL;
  if (!sched || !opts || !opts->build)
    return px_error(PX_ERR_INVALID, "pipeline: px_pp_create needs a schedule and options with a model builder");
  const int p = px_comm_size(pipe), rank = px_comm_rank(pipe);
  if (sched->p != p)
    return px_error(PX_ERR_INVALID, "pipeline: the schedule is for %d pipeline ranks, the communicator has %d",
                    sched->p, p);
  if (sched->m < 1 || sched->v < 1)
    return px_error(PX_ERR_INVALID, "pipeline: schedule with %d micro-batches and %d chunks per rank", sched->m,
                    sched->v);
  if (opts->zero_stage < 0 || opts->zero_stage > 2 || (opts->zero_stage > 0 && !opts->dp))
    return px_error(PX_ERR_INVALID,
                    "pipeline: ZeRO stage %d %s: stages 1 and 2 shard over a data-parallel group "
                    "(px_pp_opts.dp); stage 3 (parameters gathered per unit) does not combine with the pipeline's "
                    "micro-batch slots",
                    opts->zero_stage, opts->dp ? "with a dp group" : "without a dp group");
  px_status st = px_pp_schedule_check(sched);
  if (st != PX_OK) return st;
  px_pp *pp = calloc(1, sizeof *pp);
  if (!pp) return px_error(PX_ERR_NOMEM, "pipeline: out of memory");
  pp->comm = pipe;
  pp->sched = sched;
  pp->rank = rank;
  pp->p = p;
  pp->m = sched->m;
  pp->v = sched->v;
  pp->S = p * sched->v;
  pp->clip = opts->clip_grad_norm;
  pp->dp = opts->dp;
  pp->tp = opts->tp;
  pp->dp_size = opts->dp ? px_comm_size(opts->dp) : 1;
  pp->dp_rank = opts->dp ? px_comm_rank(opts->dp) : 0;
  pp->tp_rank = opts->tp ? px_comm_rank(opts->tp) : 0;
  pp->zero = opts->dp ? opts->zero_stage : 0;
  st = px_pp_plan_make(opts->build, opts->build_arg, pp->S, opts->split, &pp->plan);
  pp->chunk = st == PX_OK ? calloc((size_t)pp->v, sizeof *pp->chunk) : NULL;
  if (st == PX_OK && !pp->chunk) st = px_error(PX_ERR_NOMEM, "pipeline: out of memory");
  const int m = pp->m;
  for (int c = 0; st == PX_OK && c < pp->v; c++) {
    pp_chunk *ch = &pp->chunk[c];
    ch->stage = rank + c * p;
    ch->n_slots = max_in_flight(sched, rank, ch->stage);
    ch->slot = calloc((size_t)ch->n_slots, sizeof *ch->slot);
    ch->in = calloc((size_t)m, sizeof *ch->in);
    ch->dy = calloc((size_t)m, sizeof *ch->dy);
    ch->out = calloc((size_t)m, sizeof *ch->out);
    ch->dx = calloc((size_t)m, sizeof *ch->dx);
    ch->y = calloc((size_t)m, sizeof *ch->y);
    ch->dloss = calloc((size_t)m, sizeof *ch->dloss);
    ch->slot_of = malloc((size_t)m * sizeof *ch->slot_of);
    if (!ch->slot || !ch->in || !ch->dy || !ch->out || !ch->dx || !ch->y || !ch->dloss || !ch->slot_of) {
      st = px_error(PX_ERR_NOMEM, "pipeline: out of memory");
      break;
    }
    for (int j = 0; j < m; j++) ch->slot_of[j] = -1;
    for (int k = 0; st == PX_OK && k < ch->n_slots; k++) {
      ch->slot[k].micro = -1;
      st = px_pp_stage_model(opts->build, opts->build_arg, pp->plan, ch->stage, opts->seed, &ch->slot[k].md);
      if (st == PX_OK && k > 0) share_buffers(ch->slot[k].md, ch->slot[0].md);
    }
    if (st == PX_OK && pp->zero > 0) {  // this dp rank's slice, and the exchange space
      const size_t n = ch->slot[0].md->n_param_elems, A = (size_t)pp->dp_size;
      ch->z_piece = (n + A - 1) / A;
      ch->z_off = ch->z_piece * (size_t)pp->dp_rank;
      ch->z_len = ch->z_off < n ? (n - ch->z_off < ch->z_piece ? n - ch->z_off : ch->z_piece) : 0;
      ch->z_buf = n % A ? calloc(ch->z_piece * A, sizeof *ch->z_buf) : NULL;
      ch->z_send = calloc(ch->z_piece + 1, sizeof *ch->z_send);
      if ((n % A && !ch->z_buf) || !ch->z_send) st = px_error(PX_ERR_NOMEM, "pipeline: out of memory");
    }
    if (st == PX_OK && opts->optim) {
      px_model *md = ch->slot[0].md;
      if (pp->zero == 0) st = px_optim_create(&ch->opt, md->param_data, md->grad_data, md->n_param_elems, opts->optim);
      else if (ch->z_len > 0)  // state for the slice alone (an empty slice: no optimizer)
        st = px_optim_create(&ch->opt, md->param_data + ch->z_off, md->grad_data + ch->z_off, ch->z_len, opts->optim);
    }
  }
  pp->tied_emb_stage = pp->tied_head_stage = -1;
  if (st == PX_OK && pp->plan->tied_head_unit >= 0) {
    pp->tied_emb_stage = px_pp_plan_stage_of(pp->plan, pp->plan->tied_emb_unit);
    pp->tied_head_stage = px_pp_plan_stage_of(pp->plan, pp->plan->tied_head_unit);
    const int re = pp->tied_emb_stage % p, rh = pp->tied_head_stage % p;
    if (re != rh)  // collective over pipe: every rank knows the plan
      st = px_comm_split(pipe, rank == re || rank == rh ? 0 : -1, rank, &pp->emb_comm);
  }
  if (st == PX_OK && pp->dp) {  // collective over dp
    st = pxr_init(&pp->rsum, pp->dp);
    pp->rsum_on = st == PX_OK;
  }
  if (st != PX_OK) {
    px_pp_free(pp);
    return st;
  }
  *out = pp;
  return PX_OK;
}

// The tied weight's two copies get the sum of their gradients (the
// embedding's share and the head's), so they stay equal.
static px_status sync_tied(px_pp *pp) {
  if (pp->tied_emb_stage < 0) return PX_OK;
  px_param *e = NULL, *h = NULL;
  for (int c = 0; c < pp->v; c++) {
    if (pp->chunk[c].stage == pp->tied_emb_stage) e = px_model_find(pp->chunk[c].slot[0].md, pp->plan->tied_param);
    if (pp->chunk[c].stage == pp->tied_head_stage) h = px_model_find(pp->chunk[c].slot[0].md, pp->plan->tied_param);
  }
  if (!e && !h) return PX_OK;
  if (e && h) {  // both stages on this rank
    px_add(e->grad, e->grad, h->grad, e->numel);
    px_copy(h->grad, e->grad, e->numel);
    return PX_OK;
  }
  px_param *w = e ? e : h;
  return px_comm_allreduce(pp->emb_comm, w->grad, w->numel, PX_F32, PX_SUM);
}

/* ---- Steps ---------------------------------------------------------------- */

static void set_label(px_pp *pp, const char *what, int stage, int micro, px_pp_op op) {
  char label[128];
  snprintf(label, sizeof label, "pipeline %s %llu: stage %d, micro-batch %d, %s", what, (unsigned long long)pp->steps,
           stage, micro, op_name(op));
  px_comm_set_label(pp->comm, label);
  if (pp->emb_comm) px_comm_set_label(pp->emb_comm, label);  // the tied weight's all-reduce waits there
}

static px_status push_send(px_pp *pp, px_request *r) {
  if (pp->n_sends == pp->cap_sends) {
    int cap = pp->cap_sends ? 2 * pp->cap_sends : 32;
    px_request **a = realloc(pp->sends, (size_t)cap * sizeof *a);
    if (!a) {
      (void)px_request_wait(r);
      return px_error(PX_ERR_NOMEM, "pipeline: out of memory");
    }
    pp->sends = a;
    pp->cap_sends = cap;
  }
  pp->sends[pp->n_sends++] = r;
  return PX_OK;
}

static px_status wait_timed(px_pp *pp, px_request *r) {
  const double t0 = px_time_now();
  px_status st = px_request_wait(r);
  pp->stats.wait_s += px_time_now() - t0;
  return st;
}

static px_status ensure_buf(pp_msg *g, size_t bytes) {
  if (g->bytes >= bytes && g->buf) return PX_OK;
  free(g->buf);
  g->buf = malloc(bytes ? bytes : 1);
  g->bytes = g->buf ? bytes : 0;
  return g->buf ? PX_OK : px_error(PX_ERR_NOMEM, "pipeline: out of memory (%zu bytes)", bytes);
}

static void header_of(const px_tensor *t, int64_t *h) {
  memset(h, 0, HDR_LEN * sizeof *h);
  h[0] = t->dtype;
  h[1] = t->ndim;
  for (int d = 0; d < t->ndim; d++) h[2 + d] = t->shape[d];
}

static px_status tensor_of_header(const int64_t *h, px_tensor *t, const char *what, int stage, int micro) {
  if (h[1] < 0 || h[1] > PX_MAX_DIMS || h[0] < 0)
    return px_error(PX_ERR_COMM, "pipeline: stage %d, micro-batch %d: a malformed %s header (ndim %lld)", stage, micro,
                    what, (long long)h[1]);
  *t = px_tensor_view(NULL, (px_dtype)h[0], (int)h[1], h + 2);
  return PX_OK;
}

static bool same_shape(const px_tensor *a, const px_tensor *b) {
  return a->dtype == b->dtype && px_tensor_same_shape(a, b);
}

static px_status shape_error(const char *what, int stage, int micro, const px_tensor *got, const px_tensor *want) {
  char a[PX_SHAPE_STR_MAX], b[PX_SHAPE_STR_MAX];
  return px_error(PX_ERR_SHAPE, "pipeline: stage %d, micro-batch %d: the %s received is %s %s, expected %s %s", stage,
                  micro, what, px_dtype_name(got->dtype), px_shape_str(got->ndim, got->shape, a, sizeof a),
                  px_dtype_name(want->dtype), px_shape_str(want->ndim, want->shape, b, sizeof b));
}

// Post a receive (activation: is_grad false).  First step: the shape header
// first (blocking: the data's size depends on it), then the data.
static px_status post_recv(px_pp *pp, pp_chunk *ch, int micro, int peer, bool is_grad, bool first) {
  const int from = is_grad ? ch->stage + 1 : ch->stage - 1;
  pp_msg *g = is_grad ? &ch->dy[micro] : &ch->in[micro];
  if (g->req)
    return px_error(PX_ERR_INVALID, "pipeline: stage %d, micro-batch %d: %s received twice in one step", ch->stage,
                    micro, is_grad ? "the gradient" : "the activation");
  px_status st;
  if (first) {
    int64_t h[HDR_LEN];
    const double t0 = px_time_now();
    st = px_comm_recv(pp->comm, h, HDR_LEN, PX_I64, peer,
                      tag_of(pp, is_grad ? TAG_GRAD_HDR : TAG_ACT_HDR, from, micro));
    pp->stats.wait_s += px_time_now() - t0;
    if (st != PX_OK) return st;
    px_tensor t;
    if ((st = tensor_of_header(h, &t, is_grad ? "gradient" : "activation", ch->stage, micro)) != PX_OK) return st;
    if (!is_grad) {  // every micro-batch's activation has one shape
      if (!ch->act_known) {
        ch->act_shape = t;
        ch->act_known = true;
      } else if (!same_shape(&t, &ch->act_shape))
        return shape_error("activation", ch->stage, micro, &t, &ch->act_shape);
    }
    if ((st = ensure_buf(g, px_tensor_nbytes(&t))) != PX_OK) return st;
    g->t = t;
  }
  g->t.data = g->buf;
  return px_comm_irecv(pp->comm, g->buf, (size_t)px_tensor_numel(&g->t), g->t.dtype, peer,
                       tag_of(pp, is_grad ? TAG_GRAD : TAG_ACT, from, micro), &g->req);
}

static px_status post_send(px_pp *pp, pp_chunk *ch, int micro, int peer, bool is_grad, bool first) {
  pp_msg *g = is_grad ? &ch->dx[micro] : &ch->out[micro];
  if (!g->have)
    return px_error(PX_ERR_INVALID, "pipeline: stage %d, micro-batch %d: %s before its %s", ch->stage, micro,
                    is_grad ? "SEND_GRAD" : "SEND_ACT", is_grad ? "BACKWARD" : "FORWARD");
  px_status st;
  px_request *r;
  if (first) {
    int64_t h[HDR_LEN];
    header_of(&g->t, h);
    // Blocking: the header is tiny (threads copy it, MPI sends it eagerly).
    st = px_comm_send(pp->comm, h, HDR_LEN, PX_I64, peer,
                      tag_of(pp, is_grad ? TAG_GRAD_HDR : TAG_ACT_HDR, ch->stage, micro));
    if (st != PX_OK) return st;
  }
  st = px_comm_isend(pp->comm, g->buf, (size_t)px_tensor_numel(&g->t), g->t.dtype, peer,
                     tag_of(pp, is_grad ? TAG_GRAD : TAG_ACT, ch->stage, micro), &r);
  if (st != PX_OK) return st;
  g->have = false;
  return push_send(pp, r);
}

// Keep a copy of t (an output or input gradient in a slot's arena) to send.
static px_status stash(pp_msg *g, const px_tensor *t) {
  const size_t bytes = px_tensor_nbytes(t);
  px_status st = ensure_buf(g, bytes);
  if (st != PX_OK) return st;
  memcpy(g->buf, t->data, bytes);
  g->t = *t;
  g->t.data = g->buf;
  g->have = true;
  return PX_OK;
}

static px_status with_where(px_status st, int stage, int micro, const char *what) {
  if (st == PX_OK) return st;
  char msg[768];
  snprintf(msg, sizeof msg, "%s", px_last_error());
  return px_error(st, "pipeline: stage %d, micro-batch %d, %s: %s", stage, micro, what, msg);
}

static px_status do_forward(px_pp *pp, pp_chunk *ch, int micro, const px_tensor *x, px_pp_loss_fn loss_fn, void *user) {
  px_tensor in;
  px_status st;
  if (ch->stage == 0) {
    int64_t shape[PX_MAX_DIMS];
    for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[d];
    shape[0] = pp->rows;
    const size_t row_bytes = px_tensor_nbytes(x) / (size_t)x->shape[0];
    in = px_tensor_view((char *)x->data + (size_t)micro * (size_t)pp->rows * row_bytes, x->dtype, x->ndim, shape);
  } else if (local_prev(pp)) {
    pp_msg *g = &pp->chunk[(ch->stage - 1) / pp->p].out[micro];
    if (!g->have)
      return px_error(PX_ERR_INVALID, "pipeline: stage %d, micro-batch %d: FORWARD before stage %d's", ch->stage, micro,
                      ch->stage - 1);
    in = g->t;
  } else {
    pp_msg *g = &ch->in[micro];
    if (!g->req)
      return px_error(PX_ERR_INVALID, "pipeline: stage %d, micro-batch %d: FORWARD before its RECV_ACT", ch->stage,
                      micro);
    if ((st = wait_timed(pp, g->req)) != PX_OK) {
      g->req = NULL;
      return st;
    }
    g->req = NULL;
    in = g->t;
  }
  int k = 0;
  while (k < ch->n_slots && ch->slot[k].micro >= 0) k++;
  if (k == ch->n_slots || ch->slot_of[micro] >= 0)
    return px_error(PX_ERR_INVALID,
                    "pipeline: stage %d, micro-batch %d: FORWARD with %d micro-batches in flight "
                    "already (or this one twice)",
                    ch->stage, micro, ch->n_slots);
  pp_slot *sl = &ch->slot[k];
  // Dropout masks are drawn from (seed, module stream, ctx.step, element).
  // The streams are the whole model's (px_pp_stage_model); the step is set
  // here so that micro-batch j of step s draws what one process draws in
  // its (s·m + j + 1)-th training forward: the single process running the
  // same m micro-batches per step with gradient accumulation, whichever
  // slot (and so whichever model's own counter) runs the micro-batch.
  sl->md->ctx.step = (pp->step_base + pp->steps) * (uint64_t)pp->m + (uint64_t)micro;  // px_model_forward adds 1
  const double t0 = px_time_now();
  st = with_where(px_model_forward(sl->md, &in, &ch->y[micro]), ch->stage, micro, "FORWARD");
  pp->stats.compute_s += px_time_now() - t0;
  if (st != PX_OK) return st;
  sl->micro = micro;
  ch->slot_of[micro] = k;
  if (ch->stage == pp->S - 1) {  // the loss, and the gradient backward starts from
    const px_tensor *y = &ch->y[micro];
    float *d = px_model_scratch(sl->md, (size_t)px_tensor_numel(y));
    if (!d) return px_error(PX_ERR_NOMEM, "pipeline: out of memory");
    float l = 0;
    const double t1 = px_time_now();
    st = with_where(loss_fn(user, y, micro, &l, d), ch->stage, micro, "loss");
    pp->stats.compute_s += px_time_now() - t1;
    if (st != PX_OK) return st;
    px_scale(d, (size_t)px_tensor_numel(y), 1.0f / (float)pp->m);
    ch->dloss[micro] = d;
    pp->loss_sum += l;
    return PX_OK;
  }
  return stash(&ch->out[micro], &ch->y[micro]);
}

static px_status do_backward(px_pp *pp, pp_chunk *ch, int micro, bool first) {
  const int k = ch->slot_of[micro];
  if (k < 0)
    return px_error(PX_ERR_INVALID, "pipeline: stage %d, micro-batch %d: BACKWARD before its FORWARD", ch->stage,
                    micro);
  px_status st;
  px_tensor dy;
  const px_tensor *y = &ch->y[micro];
  if (ch->stage == pp->S - 1) {
    dy = *y;
    dy.data = ch->dloss[micro];
  } else if (local_prev(pp)) {
    pp_msg *g = &pp->chunk[(ch->stage + 1) / pp->p].dx[micro];
    if (!g->have)
      return px_error(PX_ERR_INVALID, "pipeline: stage %d, micro-batch %d: BACKWARD before stage %d's", ch->stage,
                      micro, ch->stage + 1);
    dy = g->t;
  } else {
    pp_msg *g = &ch->dy[micro];
    if (!g->req)
      return px_error(PX_ERR_INVALID, "pipeline: stage %d, micro-batch %d: BACKWARD before its RECV_GRAD", ch->stage,
                      micro);
    if ((st = wait_timed(pp, g->req)) != PX_OK) {
      g->req = NULL;
      return st;
    }
    g->req = NULL;
    dy = g->t;
    if (first && (dy.dtype != PX_F32 || !px_tensor_same_shape(&dy, y))) {
      px_tensor want = *y;
      want.dtype = PX_F32;
      return shape_error("gradient of the output", ch->stage, micro, &dy, &want);
    }
  }
  pp_slot *sl = &ch->slot[k];
  px_tensor dx;
  const bool want_dx = ch->stage > 0;
  const double t0 = px_time_now();
  st = with_where(px_model_backward(sl->md, &dy, want_dx ? &dx : NULL), ch->stage, micro, "BACKWARD");
  pp->stats.compute_s += px_time_now() - t0;
  if (st == PX_OK && want_dx) st = stash(&ch->dx[micro], &dx);
  sl->micro = -1;
  ch->slot_of[micro] = -1;
  return st;
}

// The squares of chunk c's gradients in flat range [lo, hi) that count in
// the global norm: not the head's copy of a tied weight (it holds the same
// summed gradient as the embedding's), and a tp-replicated parameter only on
// tp rank 0 (every tp rank holds it whole); a tp-split one with its box.
static double chunk_sumsq(const px_pp *pp, int c, size_t lo, size_t hi) {
  const px_model *md = pp->chunk[c].slot[0].md;
  const bool head = pp->chunk[c].stage == pp->tied_head_stage;
  double ss = 0;
  for (int i = 0; i < md->n_params; i++) {
    const px_param *p = md->params[i];
    if (head && strcmp(p->name, pp->plan->tied_param) == 0) continue;
    if (pp->tp && pp->tp_rank != 0 && px_tp_param_box(p).split_dim < 0) continue;
    const size_t o = (size_t)(p->grad - md->grad_data), a = o > lo ? o : lo, b = o + p->numel < hi ? o + p->numel : hi;
    if (a < b) ss += px_sumsq(md->grad_data + a, b - a);
  }
  return ss;
}

// Global gradient norm (and clipping with clip > 0): the counted squares
// (chunk_sumsq) of what this rank holds, summed over the pipeline, the tp
// group and (ZeRO: each dp rank holds its slice) the dp group; then the same
// scale everywhere.
static px_status clip_grads(px_pp *pp) {
  double ss = 0;
  for (int c = 0; c < pp->v; c++) {
    const pp_chunk *ch = &pp->chunk[c];
    ss += pp->zero > 0 ? chunk_sumsq(pp, c, ch->z_off, ch->z_off + ch->z_len)
                       : chunk_sumsq(pp, c, 0, ch->slot[0].md->n_param_elems);
  }
  px_status st = px_comm_allreduce(pp->comm, &ss, 1, PX_F64, PX_SUM);
  if (st == PX_OK && pp->tp) st = px_comm_allreduce(pp->tp, &ss, 1, PX_F64, PX_SUM);
  if (st == PX_OK && pp->zero > 0) st = px_comm_allreduce(pp->dp, &ss, 1, PX_F64, PX_SUM);
  if (st != PX_OK) return st;
  const float norm = (float)sqrt(ss > 0 ? ss : 0);
  pp->stats.grad_norm = norm;
  for (int c = 0; c < pp->v && pp->clip > 0; c++) {
    pp_chunk *ch = &pp->chunk[c];
    px_model *md = ch->slot[0].md;
    if (pp->zero > 0) px_clip_grad_scale(md->grad_data + ch->z_off, ch->z_len, norm, pp->clip);
    else px_clip_grad_scale(md->grad_data, md->n_param_elems, norm, pp->clip);
  }
  return PX_OK;
}

// Data parallel over dp: every chunk's gradient summed over the replicas in
// rank order (rank_sum.h: DDP's all-reduce, ZeRO's reduce-scatter, the same
// bits) and divided by |dp|.  ZeRO: only this rank's slice is summed, into
// grad_data[z_off, + z_len) (the rest of the buffer is left stale: scratch
// of the reduce-scatter).
static px_status reduce_dp(px_pp *pp) {
  const float inv = 1.0f / (float)pp->dp_size;
  for (int c = 0; c < pp->v; c++) {
    pp_chunk *ch = &pp->chunk[c];
    px_model *md = ch->slot[0].md;
    const size_t n = md->n_param_elems;
    pxr_sum *op = NULL;
    px_status st;
    if (n == 0) continue;  // a stage without parameters (every replica skips it alike)
    if (pp->zero == 0) {
      if ((st = pxr_allreduce(&pp->rsum, md->grad_data, n, &op)) != PX_OK) return st;
      if ((st = pxr_wait(op)) != PX_OK) return st;
      px_scale(md->grad_data, n, inv);
      continue;
    }
    // |dp| equal pieces (padded with zeros past n when n is not a multiple),
    // summed, this rank's piece kept.
    float *all = md->grad_data;
    if (ch->z_buf) {
      memcpy(ch->z_buf, md->grad_data, n * sizeof(float));
      memset(ch->z_buf + n, 0, (ch->z_piece * (size_t)pp->dp_size - n) * sizeof(float));
      all = ch->z_buf;
    }
    float *mine = all + ch->z_piece * (size_t)pp->dp_rank;
    if ((st = pxr_reduce_scatter(&pp->rsum, all, mine, ch->z_piece, &op)) != PX_OK) return st;
    if ((st = pxr_wait(op)) != PX_OK) return st;
    px_scale(mine, ch->z_len, inv);
    if (ch->z_buf) memcpy(md->grad_data + ch->z_off, mine, ch->z_len * sizeof(float));
  }
  return PX_OK;
}

// ZeRO after the step: every dp rank's updated slice to every replica.
static px_status gather_params(px_pp *pp) {
  for (int c = 0; c < pp->v; c++) {
    pp_chunk *ch = &pp->chunk[c];
    px_model *md = ch->slot[0].md;
    if (md->n_param_elems == 0) continue;
    memset(ch->z_send, 0, ch->z_piece * sizeof(float));
    memcpy(ch->z_send, md->param_data + ch->z_off, ch->z_len * sizeof(float));
    px_status st = px_comm_allgather(pp->dp, ch->z_send, ch->z_buf ? ch->z_buf : md->param_data, ch->z_piece, PX_F32);
    if (st != PX_OK) return st;
    if (ch->z_buf) memcpy(md->param_data, ch->z_buf, md->n_param_elems * sizeof(float));
  }
  return PX_OK;
}

static px_status wait_sends(px_pp *pp) {
  px_status first_err = PX_OK;
  for (int i = 0; i < pp->n_sends; i++) {
    px_status st = px_request_wait(pp->sends[i]);
    if (st != PX_OK && first_err == PX_OK) first_err = st;
  }
  pp->n_sends = 0;
  return first_err;
}

// Rows per micro-batch, agreed by every rank (stage 0's rank reads x): a
// bad batch is refused everywhere instead of hanging the other stages.
static px_status agree_rows(px_pp *pp, const px_tensor *x, int64_t *rows) {
  int64_t info[2] = {0, 0};  // rows per micro-batch (or -1: bad), batch size
  if (pp->rank == 0) {
    if (!x || x->ndim < 1 || !x->data) info[0] = -2;
    else {
      info[1] = x->shape[0];
      info[0] = x->shape[0] % pp->m == 0 && x->shape[0] > 0 ? x->shape[0] / pp->m : -1;
    }
  }
  px_status st = px_comm_broadcast(pp->comm, info, 2, PX_I64, 0);
  if (st != PX_OK) return st;
  if (info[0] == -2) return px_error(PX_ERR_INVALID, "pipeline: the rank of stage 0 was given no input batch");
  if (info[0] < 0)
    return px_error(PX_ERR_INVALID, "pipeline: a batch of %lld rows cannot be split into %d equal micro-batches",
                    (long long)info[1], pp->m);
  *rows = info[0];
  return PX_OK;
}

px_status px_pp_step(px_pp *pp, const px_tensor *x, px_pp_loss_fn loss_fn, void *user, float *loss) {
  if (!loss_fn) return px_error(PX_ERR_INVALID, "pipeline: px_pp_step needs a loss function");
  const double t0 = px_time_now();
  pp->stats.wait_s = 0;
  pp->stats.compute_s = 0;
  int64_t rows = 0;
  px_status st = agree_rows(pp, x, &rows);
  if (st != PX_OK) return st;
  const bool first = pp->steps == 0;
  if (!first && rows != pp->rows)
    return px_error(PX_ERR_INVALID,
                    "pipeline: micro-batches of %lld rows after a first step of %lld: every step "
                    "must have the first step's shapes",
                    (long long)rows, (long long)pp->rows);
  pp->rows = rows;
  pp->loss_sum = 0;
  for (int c = 0; c < pp->v; c++) {
    px_model_zero_grad(pp->chunk[c].slot[0].md);
    for (int j = 0; j < pp->m; j++) pp->chunk[c].out[j].have = pp->chunk[c].dx[j].have = false;
  }
  const px_pp_action *acts = pp->sched->actions[pp->rank];
  for (int i = 0; st == PX_OK && i < pp->sched->n_actions[pp->rank]; i++) {
    const px_pp_action *a = &acts[i];
    set_label(pp, "step", a->stage, a->micro, a->op);
    if (a->op == PX_PP_OPTIM_STEP) {
      if ((st = wait_sends(pp)) != PX_OK) break;
      set_label(pp, "step (tied embedding gradient)", a->stage, a->micro, a->op);
      if ((st = sync_tied(pp)) != PX_OK) break;
      if (pp->dp) {
        set_label(pp, "step (data-parallel gradient sum)", a->stage, a->micro, a->op);
        px_comm_set_label(pp->dp, "pipeline: data-parallel gradient sum");
        if ((st = reduce_dp(pp)) != PX_OK) break;
      }
      set_label(pp, "step (gradient norm)", a->stage, a->micro, a->op);
      if ((pp->clip > 0 || pp->want_norm) && (st = clip_grads(pp)) != PX_OK) break;
      for (int c = 0; c < pp->v && st == PX_OK; c++)
        if (pp->chunk[c].opt) st = px_optim_step(pp->chunk[c].opt);
      if (st == PX_OK && pp->zero > 0) {
        px_comm_set_label(pp->dp, "pipeline: ZeRO parameter all-gather");
        st = gather_params(pp);
      }
      continue;
    }
    const int c = a->stage / pp->p;
    if (a->stage % pp->p != pp->rank || c >= pp->v || a->micro < 0 || a->micro >= pp->m) {
      st = px_error(PX_ERR_INVALID,
                    "pipeline: rank %d action %d (%s stage %d, micro-batch %d) is not for a stage "
                    "of this rank or a micro-batch of the %d",
                    pp->rank, i, op_name(a->op), a->stage, a->micro, pp->m);
      break;
    }
    pp_chunk *ch = &pp->chunk[c];
    switch (a->op) {
    case PX_PP_FORWARD: st = do_forward(pp, ch, a->micro, x, loss_fn, user); break;
    case PX_PP_BACKWARD: st = do_backward(pp, ch, a->micro, first); break;
    case PX_PP_RECV_ACT: st = post_recv(pp, ch, a->micro, a->peer, false, first); break;
    case PX_PP_RECV_GRAD: st = post_recv(pp, ch, a->micro, a->peer, true, first); break;
    case PX_PP_SEND_ACT: st = post_send(pp, ch, a->micro, a->peer, false, first); break;
    case PX_PP_SEND_GRAD: st = post_send(pp, ch, a->micro, a->peer, true, first); break;
    default: st = px_error(PX_ERR_INVALID, "pipeline: rank %d action %d: unknown op %d", pp->rank, i, (int)a->op);
    }
  }
  if (st == PX_OK) st = wait_sends(pp);
  if (st != PX_OK) {
    // The other stages wait on this one: make them fail now, not at the watchdog.
    char why[900];
    snprintf(why, sizeof why, "%s", px_last_error());
    px_comm_abort(pp->comm, why);
    return px_error(st, "%s", why);
  }
  // The batch's loss: the last stage's mean over micro-batches, to everyone.
  double l = pp->loss_sum / pp->m;
  set_label(pp, "step loss", pp->S - 1, -1, PX_PP_OPTIM_STEP);
  if ((st = px_comm_broadcast(pp->comm, &l, 1, PX_F64, (pp->S - 1) % pp->p)) != PX_OK) return st;
  if (pp->dp) {  // the replicas' mean: the loss of the whole |dp|-times larger batch
    if ((st = px_comm_allreduce(pp->dp, &l, 1, PX_F64, PX_SUM)) != PX_OK) return st;
    l /= pp->dp_size;
  }
  if (loss) *loss = (float)l;
  pp->steps++;
  pp->stats.step_s = px_time_now() - t0;
  return PX_OK;
}

// Forward only, one micro-batch at a time through every stage (each rank
// walks (micro-batch, stage) in the same order; the header travels every
// time, since an evaluation batch may differ from the training batches).
px_status px_pp_eval(px_pp *pp, const px_tensor *x, px_pp_loss_fn loss_fn, void *user, float *loss) {
  if (!loss_fn) return px_error(PX_ERR_INVALID, "pipeline: px_pp_eval needs a loss function");
  int64_t rows = 0;
  px_status st = agree_rows(pp, x, &rows);
  if (st != PX_OK) return st;
  for (int c = 0; c < pp->v; c++) px_model_train(pp->chunk[c].slot[0].md, false);
  double sum = 0;
  const int base = pp->S * pp->m * TAG_KINDS;  // eval's tags come after the step's
  void *buf = NULL;
  pp_msg *sent = calloc((size_t)pp->m * (size_t)pp->v, sizeof *sent);  // this rank's sends
  int n_sent = 0;
  if (!sent) st = px_error(PX_ERR_NOMEM, "pipeline: out of memory");
  for (int j = 0; st == PX_OK && j < pp->m; j++)
    for (int s = 0; st == PX_OK && s < pp->S; s++) {
      if (s % pp->p != pp->rank) continue;
      pp_chunk *ch = &pp->chunk[s / pp->p];
      px_model *md = ch->slot[0].md;
      px_tensor in, y;
      set_label(pp, "eval", s, j, PX_PP_FORWARD);
      if (s == 0) {
        int64_t shape[PX_MAX_DIMS];
        for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[d];
        shape[0] = rows;
        const size_t row_bytes = px_tensor_nbytes(x) / (size_t)x->shape[0];
        in = px_tensor_view((char *)x->data + (size_t)j * (size_t)rows * row_bytes, x->dtype, x->ndim, shape);
      } else {
        const int peer = (s - 1) % pp->p, tag = base + 2 * ((s - 1) * pp->m + j);
        int64_t h[HDR_LEN];
        if ((st = px_comm_recv(pp->comm, h, HDR_LEN, PX_I64, peer, tag)) != PX_OK) break;
        if ((st = tensor_of_header(h, &in, "activation", s, j)) != PX_OK) break;
        free(buf);
        buf = malloc(px_tensor_nbytes(&in) ? px_tensor_nbytes(&in) : 1);
        if (!buf) {
          st = px_error(PX_ERR_NOMEM, "pipeline: out of memory");
          break;
        }
        in.data = buf;
        if ((st = px_comm_recv(pp->comm, buf, (size_t)px_tensor_numel(&in), in.dtype, peer, tag + 1)) != PX_OK) break;
      }
      if ((st = with_where(px_model_forward(md, &in, &y), s, j, "eval FORWARD")) != PX_OK) break;
      if (s == pp->S - 1) {
        float *d = px_model_scratch(md, (size_t)px_tensor_numel(&y)), l = 0;
        if (!d) {
          st = px_error(PX_ERR_NOMEM, "pipeline: out of memory");
          break;
        }
        if ((st = with_where(loss_fn(user, &y, j, &l, d), s, j, "eval loss")) != PX_OK) break;
        sum += l;
      } else {
        const int peer = (s + 1) % pp->p, tag = base + 2 * (s * pp->m + j);
        // A copy (y lives in the arena until this model's next forward),
        // sent without waiting; every send is waited for at the end.
        pp_msg *g = &sent[n_sent++];
        if ((st = stash(g, &y)) != PX_OK) break;
        int64_t h[HDR_LEN];
        header_of(&y, h);
        if ((st = px_comm_send(pp->comm, h, HDR_LEN, PX_I64, peer, tag)) != PX_OK) break;
        if ((st = px_comm_isend(pp->comm, g->buf, (size_t)px_tensor_numel(&y), y.dtype, peer, tag + 1, &g->req)) !=
            PX_OK)
          break;
      }
    }
  free(buf);
  for (int i = 0; i < n_sent; i++) {
    px_status w = sent[i].req ? px_request_wait(sent[i].req) : PX_OK;
    sent[i].req = NULL;
    if (st == PX_OK) st = w;
  }
  msg_free(sent, n_sent);
  for (int c = 0; c < pp->v; c++) px_model_train(pp->chunk[c].slot[0].md, true);
  if (st != PX_OK) {
    char why[900];
    snprintf(why, sizeof why, "%s", px_last_error());
    px_comm_abort(pp->comm, why);
    return px_error(st, "%s", why);
  }
  double l = sum / pp->m;
  if ((st = px_comm_broadcast(pp->comm, &l, 1, PX_F64, (pp->S - 1) % pp->p)) != PX_OK) return st;
  if (loss) *loss = (float)l;
  return PX_OK;
}

px_status px_pp_ce_loss(void *user, const px_tensor *out, int micro, float *loss, float *dout) {
  const px_pp_ce_targets *t = user;
  return px_cross_entropy_loss(out, t->targets + (size_t)micro * (size_t)t->rows_per_micro, NULL, loss, dout);
}

/* ---- Checkpoints (src/train/state_pp.c) ------------------------------------ */

px_optim *px_pp_chunk_optim(px_pp *pp, int chunk) { return chunk >= 0 && chunk < pp->v ? pp->chunk[chunk].opt : NULL; }

void px_pp_set_step_base(px_pp *pp, uint64_t steps) { pp->step_base = steps; }

bool px_pp_chunk_zero_slice(const px_pp *pp, int chunk, size_t *off, size_t *len) {
  if (pp->zero == 0 || chunk < 0 || chunk >= pp->v) return false;
  *off = pp->chunk[chunk].z_off;
  *len = pp->chunk[chunk].z_len;
  return true;
}
