// ZeRO (sharded data parallel), stages 1-3, over the model's hooks and flat
// buffers (DESIGN decisions 1, 2, 7).  zero_internal.h draws the groups.
//
//   stage 1  full parameters and gradients; each bucket of the flat gradient
//            buffer is reduce-scattered as backward completes it (buckets as
//            DDP's: reverse layout order, launched in index order on every
//            rank) in place: rank r's piece of the sum lands in grad_data
//            itself; the optimizer updates this rank's pieces in place in
//            param_data (px_zero_optim_create: segments, no shard copy);
//            after the step every bucket is all-gathered in place.
//   stage 2  as stage 1, but a bucket's gradient storage exists only from
//            the first backward that writes it (pre_backward) until its
//            reduce-scatter completes; then its piece is added into the
//            shard and the storage goes back to a pool.  grad_data is freed;
//            the optimizer updates param_data's pieces in place from the
//            shard's gradients.
//   stage 3  parameters are sharded too: units all-gather in pre_forward and
//            pre_backward and reshard after use (zero_units.c).
//
// Averaging: reduce-scatters SUM, px_zero_sync multiplies the shard by 1/N,
// exactly as DDP sums and then scales, so with the same summation order the
// gradients are DDP's to the bit.
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include "parallel/zero_internal.h"
#include "plexus/optim.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* ---- Small helpers ---------------------------------------------------------- */

static float *alloc_floats(size_t n) {
  size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
  float *p = aligned_alloc(64, bytes ? bytes : 64);
  if (p) memset(p, 0, bytes ? bytes : 64);
  return p;
}

/* Pool buffers (buckets, units) are mapped from the kernel and unmapped
 * when the pool gives them back, so the process shrinks with the pool:
 * from malloc, a freed buffer of up to 32 MiB raises glibc's mmap threshold
 * and the next ones come from the heap, which keeps freed space resident
 * (stage 2 under mpirun: a 20 MiB heap beside 33 MiB of buckets).  Fresh
 * pages are zero. */
static float *pool_map(size_t n) {
  void *q = mmap(NULL, (n ? n : 1) * sizeof(float), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return q == MAP_FAILED ? NULL : q;
}
static void pool_unmap(float *q, size_t n) { munmap(q, (n ? n : 1) * sizeof(float)); }

float *pxz_pool_get(zpool *p, size_t n) {
  // The smallest free buffer that fits without wasting more than half of
  // it, else a new one of exactly n; free buffers too small for it are
  // given back first, so the pool holds little more at once than the
  // buffers in use (groups differ in size: a tied embedding's bucket, a
  // block, the root unit; a 2 MiB bucket taking a free 9 MiB buffer would
  // make the next 9 MiB bucket allocate another).
  int best = -1;
  for (int i = 0; i < p->n; i++)
    if (!p->b[i].busy && p->b[i].cap >= n && p->b[i].cap <= 2 * n && (best < 0 || p->b[i].cap < p->b[best].cap))
      best = i;
  if (best < 0) {
    for (int i = 0; i < p->n;) {
      if (p->b[i].busy || p->b[i].cap >= n) {
        i++;
        continue;
      }
      pool_unmap(p->b[i].data, p->b[i].cap);
      p->held -= p->b[i].cap * sizeof(float);
      p->b[i] = p->b[--p->n];
    }
    if (p->n == p->cap) {
      int cap = p->cap ? 2 * p->cap : 8;
      zbuf *b = realloc(p->b, (size_t)cap * sizeof *b);
      if (!b) {
        px_error(PX_ERR_NOMEM, "ZeRO: out of memory");
        return NULL;
      }
      p->b = b;
      p->cap = cap;
    }
    float *data = pool_map(n);
    if (!data) {
      px_error(PX_ERR_NOMEM, "ZeRO: cannot map %zu floats for a bucket or unit", n);
      return NULL;
    }
    p->b[p->n] = (zbuf){.data = data, .cap = n, .busy = false};
    p->held += n * sizeof(float);
    if (p->held > p->bytes) p->bytes = p->held;
    best = p->n++;
  }
  p->b[best].busy = true;
  return p->b[best].data;
}

void pxz_pool_put(zpool *p, float *data) {
  for (int i = 0; i < p->n; i++)
    if (p->b[i].data == data) p->b[i].busy = false;
}

static void pool_free(zpool *p) {
  for (int i = 0; i < p->n; i++) pool_unmap(p->b[i].data, p->b[i].cap);
  free(p->b);
  *p = (zpool){0};
}

void pxz_fail(px_zero *z, px_status st) {
  if (z->error == PX_OK) {
    z->error = st;
    snprintf(z->error_msg, sizeof z->error_msg, "%s", px_last_error());
  }
}

void pxz_delay(const px_zero *z) {
  if (z->opts.test_delay_s <= 0) return;
  double s = z->opts.test_delay_s;
  struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - floor(s)) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Point the data (grads false) or grad (grads true) views of group g's
 * parameters into base (packed layout), or to NULL. */
void pxz_set_views(px_zero *z, int g, float *base, bool grads) {
  const zgroup *G = &z->groups[g];
  for (int k = G->p0; k < G->p0 + G->np; k++) {
    int i = z->gparams[k];
    px_param *p = z->model->params[i];
    float *v = base ? base + z->param_pos[i] : NULL;
    if (grads) p->grad = v;
    else p->data = v;
  }
}

static px_status finish_rs(px_zero *z, int g);

/* Stages 2-3: zeroed gradient storage for group g, its parameters' grads
 * pointing into it (padding stays zero: no parameter views it).  Beyond
 * PXZ_MAX_RS_IN_FLIGHT reduce-scatters, the oldest is finished first, so
 * its storage is reused: memory stays bounded whatever the network does. */
void pxz_materialise_grads(px_zero *z, int g) {
  zgroup *G = &z->groups[g];
  if (G->gbuf || G->launched || G->count == 0) return;
  while (z->in_tail - z->in_head >= PXZ_MAX_RS_IN_FLIGHT) finish_rs(z, z->inflight[z->in_head++]);
  size_t padded = G->piece * (size_t)z->size;
  G->gbuf = pxz_pool_get(&z->gpool, padded);
  if (!G->gbuf) {
    pxz_fail(z, PX_ERR_NOMEM);
    return;
  }
  memset(G->gbuf, 0, padded * sizeof(float));
  pxz_set_views(z, g, G->gbuf, true);
}

static void set_label(px_zero *z, const char *what, int g) {
  char label[96];
  snprintf(label, sizeof label, "ZeRO-%d step %llu, %s %d %s", z->stage, (unsigned long long)z->model->ctx.step,
           z->stage == 3 ? "unit" : "bucket", g, what);
  px_comm_set_label(z->comm, label);
}

/* ---- Reduce-scatter of one group ---------------------------------------------
 * send: the padded group (N·piece); rank r receives the sum of piece r.
 *   stage 1: from grad_data (a padded copy when count is not a multiple of
 *            N, so padding never reads past a bucket) into the shard;
 *   stage 2-3: from the group's gradient storage, in place into its own
 *            piece, added into the shard when it completes. */
static void launch_rs(px_zero *z, int g) {
  zgroup *G = &z->groups[g];
  G->launched = true;
  if (G->count == 0 || z->error != PX_OK) return;
  const size_t padded = G->piece * (size_t)z->size;
  float *send, *recv;
  if (z->stage == 1) {
    // In place: rank r's piece of the sum replaces its own local piece in
    // grad_data (through the padded copy, finished by finish_rs, when the
    // bucket does not divide by N).
    float *full = z->model->grad_data + G->ranges[0].flat_off;  // a bucket is one range
    send = full;
    if (padded != G->count) {
      while (z->in_tail - z->in_head >= PXZ_MAX_RS_IN_FLIGHT) finish_rs(z, z->inflight[z->in_head++]);
      send = G->gbuf = pxz_pool_get(&z->gpool, padded);
      if (!send) {
        pxz_fail(z, PX_ERR_NOMEM);
        return;
      }
      memcpy(send, full, G->count * sizeof(float));
      memset(send + G->count, 0, (padded - G->count) * sizeof(float));
    }
    recv = send + (size_t)z->rank * G->piece;
  } else {
    if (!G->gbuf) {
      pxz_fail(z, px_error(PX_ERR_INTERNAL, "ZeRO: group %d launched without storage", g));
      return;
    }
    send = G->gbuf;
    recv = G->gbuf + (size_t)z->rank * G->piece;
  }
  set_label(z, "reduce-scatter", g);
  pxz_delay(z);
  px_status st = pxr_reduce_scatter(&z->rsum, send, recv, G->piece, &G->rs_req);
  z->n_reduce_scatter++;
  if (st != PX_OK) {
    G->rs_req = NULL;
    pxz_fail(z, st);
  }
  z->inflight[z->in_tail++] = g;
}

/* Wait for group g's reduce-scatter; stages 2-3 add the piece into the
 * shard (shard += piece: the first micro-step gives the sum exactly) and
 * give the storage back; stage 1 copies a padded copy's piece (padding
 * left out) back into grad_data. */
static px_status finish_rs(px_zero *z, int g) {
  zgroup *G = &z->groups[g];
  px_status st = PX_OK;
  if (G->rs_req) {
    st = pxr_wait(G->rs_req);
    G->rs_req = NULL;
    if (st != PX_OK) pxz_fail(z, st);
  }
  if (z->stage >= 2 && G->gbuf) {
    if (st == PX_OK) {
      float *dst = z->shard_grads + G->shard_off;
      const float *src = G->gbuf + (size_t)z->rank * G->piece;
      for (size_t i = 0; i < G->piece; i++) dst[i] += src[i];
    }
    pxz_set_views(z, g, NULL, true);
  }
  if (z->stage == 1 && G->gbuf && st == PX_OK) {
    size_t lo = (size_t)z->rank * G->piece, hi = lo + G->piece < G->count ? lo + G->piece : G->count;
    if (lo < hi) memcpy(z->model->grad_data + G->ranges[0].flat_off + lo, G->gbuf + lo, (hi - lo) * sizeof(float));
  }
  if (G->gbuf) {
    pxz_pool_put(&z->gpool, G->gbuf);
    G->gbuf = NULL;
  }
  return st;
}

/* Finish the reduce-scatters that have completed, oldest first, so their
 * storage returns to the pool while backward goes on. */
static void poll_done(px_zero *z) {
  while (z->in_head < z->in_tail) {
    int g = z->inflight[z->in_head];
    if (z->groups[g].rs_req) {
      bool done = false;
      px_status st = pxr_test(z->groups[g].rs_req, &done);
      if (st != PX_OK) {
        pxz_fail(z, st);
        return;
      }
      if (!done) return;
    }
    finish_rs(z, g);
    z->in_head++;
  }
}

static px_status drain(px_zero *z) {
  px_status first = PX_OK;
  while (z->in_head < z->in_tail) {
    px_status st = finish_rs(z, z->inflight[z->in_head++]);
    if (st != PX_OK && first == PX_OK) first = st;
  }
  z->in_head = z->in_tail = 0;
  return first;
}

static void launch_ready_buckets(px_zero *z) {
  while (z->next_launch < z->n_groups && z->groups[z->next_launch].pending == 0) {
    if (z->stage == 2) pxz_materialise_grads(z, z->next_launch);  // a bucket nobody wrote: zeros
    launch_rs(z, z->next_launch++);
  }
}

static void mark_ready(px_zero *z, int i) {
  if (i < 0 || z->param_ready[i]) return;
  z->param_ready[i] = true;
  int g = z->param_group[i];
  zgroup *G = &z->groups[g];
  G->pending--;
  if (z->stage < 3) {
    launch_ready_buckets(z);
    return;
  }
  if (G->pending == 0) {
    // Every user of the unit's parameters has run backward: reduce-scatter
    // its gradients and free its gathered parameters.
    pxz_materialise_grads(z, g);
    launch_rs(z, g);
    pxz_release(z, g);
  }
}

static void begin_step(px_zero *z) {
  drain(z);
  if (z->stage == 3) pxz_release_all(z);
  memset(z->param_ready, 0, (size_t)z->model->n_params * sizeof *z->param_ready);
  memset(z->module_ran, 0, (size_t)z->model->n_modules * sizeof *z->module_ran);
  for (int g = 0; g < z->n_groups; g++) {
    z->groups[g].pending = z->groups[g].np;
    z->groups[g].launched = false;
  }
  z->next_launch = 0;
}

/* ---- Hooks ------------------------------------------------------------------ */

static void on_pre_forward(void *user, px_module *m) {
  px_zero *z = user;
  if (!z->attached) return;
  if (m == z->model->root) begin_step(z);
  // One copy of the buffers, as DDP keeps them (buffer_sync.c).
  if (m == z->model->root && !z->model->ctx.recomputing) {
    px_status st = px_parallel_sync_buffers(z->model, z->comm, z->opts.root, &z->buffers_dirty, z->model->ctx.training);
    if (st != PX_OK) pxz_fail(z, st);
  }
  if (z->stage == 3) pxz_units_pre_forward(z, m);
}

static void on_post_forward(void *user, px_module *m) {
  px_zero *z = user;
  if (!z->attached) return;
  z->module_ran[m->uid] = true;
  if (z->stage == 3) pxz_units_post_forward(z, m);
}

static void on_pre_backward(void *user, px_module *m) {
  px_zero *z = user;
  if (!z->attached || (z->stage == 1 && !z->sync)) return;
  poll_done(z);
  if (z->stage == 3) pxz_units_pre_backward(z, m);
  if (z->stage == 2) {
    // Storage for every bucket this module's backward writes: its own
    // parameters' and its foreign ones' (a tied head writes the embedding's).
    for (int k = 0; k < m->n_params; k++) {
      int i = px_parallel_param_index(z->model, &m->params[k]);
      if (i >= 0) pxz_materialise_grads(z, z->param_group[i]);
    }
    for (int k = 0; k < m->n_foreign; k++) {
      int i = px_parallel_param_index(z->model, m->foreign[k]);
      if (i >= 0) pxz_materialise_grads(z, z->param_group[i]);
    }
  }
  if (m == z->model->root && z->opts.find_unused_parameters) {
    // Parameters of modules that did not run forward get no gradient: zero
    // and ready now, so their groups still complete on every rank.
    for (int i = 0; i < z->model->n_params; i++)
      if (!z->module_ran[z->model->params[i]->owner->uid]) mark_ready(z, i);
  }
}

static void on_grads_ready(void *user, px_module *m) {
  px_zero *z = user;
  if (!z->attached || (z->stage == 1 && !z->sync)) return;
  for (int k = 0; k < m->n_params; k++)
    if (!m->params[k].is_buffer) mark_ready(z, px_parallel_param_index(z->model, &m->params[k]));
  if (m != z->model->root) return;
  if (z->stage == 3 && z->recording) {
    z->recording = false;
    z->order_known = true;
  }
  // Stages 2-3 accumulate micro-steps in the shard: a no_sync backward must
  // leave nothing in flight (px_zero_sync is not called for it).
  if (z->stage >= 2 && !z->sync) {
    px_status st = drain(z);
    if (st != PX_OK) pxz_fail(z, st);
  }
}

/* ---- Groups and the shard --------------------------------------------------- */

/* Stages 1-2: DDP's buckets.  Walk parameters from the last to the first;
 * close a bucket when the next parameter would overflow it (a bucket holds
 * at least one).  Stage 2 also closes one at least half full where the
 * next parameter belongs to another module: its storage then never waits
 * for the next module's backward, beside that module's own buckets (a GPT
 * block's c_attn weight, 6.75 MiB, would otherwise share a bucket with
 * the previous block's MLP bias and live on while the previous block's
 * 9 MiB MLP weight is written).  Each bucket is one flat range. */
static px_status build_buckets(px_zero *z) {
  px_model *md = z->model;
  z->groups = calloc((size_t)md->n_params + 1, sizeof *z->groups);
  if (!z->groups) return px_error(PX_ERR_NOMEM, "ZeRO: out of memory");
  size_t cap = z->opts.first_bucket_bytes, used = 0;
  int b = -1;
  for (int i = md->n_params - 1; i >= 0; i--) {
    size_t bytes = md->params[i]->numel * sizeof(float);
    const bool new_module = i + 1 < md->n_params && md->params[i]->owner != md->params[i + 1]->owner;
    if (b < 0 || (used > 0 && used + bytes > cap) || (z->stage == 2 && new_module && 2 * used >= cap)) {
      if (b >= 0) cap = z->opts.bucket_bytes;
      b++;
      used = 0;
    }
    z->param_group[i] = b;
    used += bytes;
  }
  z->n_groups = b + 1;
  return PX_OK;
}

/* From param_group: each group's ranges (consecutive parameters merge),
 * packed positions, parameter lists, pieces and shard offsets. */
static px_status lay_out_groups(px_zero *z) {
  px_model *md = z->model;
  const int G = z->n_groups;
  int *n_ranges = calloc((size_t)G + 1, sizeof *n_ranges), *fill = calloc((size_t)G + 1, sizeof *fill);
  size_t *end = calloc((size_t)G + 1, sizeof *end);
  if (!n_ranges || !fill || !end) {
    free(n_ranges);
    free(fill);
    free(end);
    return px_error(PX_ERR_NOMEM, "ZeRO: out of memory");
  }
  for (int g = 0; g < G; g++) end[g] = SIZE_MAX;
  for (int i = 0; i < md->n_params; i++) {
    int g = z->param_group[i];
    const px_param *p = md->params[i];
    if (end[g] != p->offset) n_ranges[g]++;
    end[g] = p->offset + p->numel;
    z->groups[g].np++;
  }
  px_status st = PX_OK;
  for (int g = 0, p0 = 0; g < G && st == PX_OK; g++) {
    z->groups[g].ranges = calloc((size_t)n_ranges[g] + 1, sizeof(zrange));
    if (!z->groups[g].ranges) st = px_error(PX_ERR_NOMEM, "ZeRO: out of memory");
    z->groups[g].p0 = p0;
    p0 += z->groups[g].np;
    end[g] = SIZE_MAX;
  }
  for (int i = 0; i < md->n_params && st == PX_OK; i++) {
    int g = z->param_group[i];
    zgroup *Gr = &z->groups[g];
    const px_param *p = md->params[i];
    if (end[g] != p->offset) Gr->ranges[Gr->n_ranges++] = (zrange){.flat_off = p->offset, .packed_off = Gr->count};
    zrange *r = &Gr->ranges[Gr->n_ranges - 1];
    z->param_pos[i] = r->packed_off + (p->offset - r->flat_off);
    r->count += p->numel;
    Gr->count += p->numel;
    end[g] = p->offset + p->numel;
    z->gparams[Gr->p0 + fill[g]++] = i;
  }
  size_t off = 0;
  for (int g = 0; g < G; g++) {
    zgroup *Gr = &z->groups[g];
    Gr->piece = (Gr->count + (size_t)z->size - 1) / (size_t)z->size;
    Gr->shard_off = off;
    off += Gr->piece;
  }
  z->shard_n = off;
  free(n_ranges);
  free(fill);
  free(end);
  return st;
}

/* Copy between a group's packed piece and the flat buffer, padding skipped:
 * packed[lo, hi) ↔ flat through the ranges. */
static void piece_copy(const zgroup *G, size_t lo, size_t hi, float *piece, float *flat, bool to_flat) {
  for (int k = 0; k < G->n_ranges; k++) {
    const zrange *r = &G->ranges[k];
    size_t a = r->packed_off > lo ? r->packed_off : lo,
           b = r->packed_off + r->count < hi ? r->packed_off + r->count : hi;
    if (a >= b) continue;
    float *f = flat + r->flat_off + (a - r->packed_off), *s = piece + (a - lo);
    if (to_flat) memcpy(f, s, (b - a) * sizeof(float));
    else memcpy(s, f, (b - a) * sizeof(float));
  }
}

/* Settings that change which collectives run must agree on every rank,
 * or the ranks would wait on different operations. */
static px_status check_opts_agree(px_zero *z) {
  uint64_t h = 1469598103934665603ull;
  int64_t v[6] = {z->stage,
                  (int64_t)z->opts.bucket_bytes,
                  (int64_t)z->opts.first_bucket_bytes,
                  z->opts.find_unused_parameters,
                  z->opts.reshard_after_forward,
                  z->opts.prefetch};
  for (int i = 0; i < 6; i++) h = (h ^ (uint64_t)v[i]) * 1099511628211ull;
  for (int u = 0; z->stage == 3 && u < z->opts.n_units; u++)
    for (const char *s = z->opts.units[u]; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  int64_t lo = (int64_t)(h >> 1), hi = lo;
  px_comm_set_label(z->comm, "ZeRO wrap: options");
  px_status st = px_comm_allreduce(z->comm, &lo, 1, PX_I64, PX_MIN);
  if (st == PX_OK) st = px_comm_allreduce(z->comm, &hi, 1, PX_I64, PX_MAX);
  if (st == PX_OK && lo != hi)
    st = px_error(PX_ERR_INVALID,
                  "ZeRO: the ranks were given different options (stage, bucket sizes, units, "
                  "reshard_after_forward, prefetch or find_unused_parameters); rank %d has stage %d: every rank "
                  "must wrap with the same options",
                  z->rank, z->stage);
  return st;
}

static void zero_destroy(px_zero *z) {
  if (!z) return;
  px_model_remove_hooks(z->model, z->hook_handle);
  for (int g = 0; z->groups && g < z->n_groups; g++) free(z->groups[g].ranges);
  free(z->groups);
  free(z->gparams);
  free(z->param_group);
  free(z->param_pos);
  free(z->param_ready);
  free(z->module_ran);
  free(z->inflight);
  free(z->module_unit);
  free(z->module_home);
  free(z->fwd_order);
  free(z->bwd_order);
  free(z->fwd_pos);
  free(z->bwd_pos);
  free(z->shard_params);
  free(z->shard_grads);
  pool_free(&z->ppool);
  pool_free(&z->gpool);
  pxr_fini(&z->rsum);
  free(z);
}

px_status px_zero_wrap(px_zero **out, px_model *model, px_comm *comm, const px_zero_opts *opts) {
  *out = NULL;
  px_zero_opts o = opts ? *opts : PX_ZERO_DEFAULTS;
  if (o.stage < 1 || o.stage > 3)
    return px_error(PX_ERR_INVALID,
                    "ZeRO: stage %d; expected 1 (optimizer state sharded), 2 (and gradients) "
                    "or 3 (and parameters)",
                    o.stage);
  if (o.bucket_bytes == 0) o.bucket_bytes = o.stage == 2 ? PX_ZERO2_BUCKET_BYTES : PX_ZERO1_BUCKET_BYTES;
  if (o.first_bucket_bytes > o.bucket_bytes) o.first_bucket_bytes = o.bucket_bytes;
  if (o.first_bucket_bytes == 0) o.first_bucket_bytes = o.bucket_bytes;
  if (o.root < 0 || o.root >= px_comm_size(comm))
    return px_error(PX_ERR_INVALID, "ZeRO: root rank %d outside [0, %d)", o.root, px_comm_size(comm));
  if (o.n_units < 0 || (o.n_units > 0 && !o.units))
    return px_error(PX_ERR_INVALID, "ZeRO: %d unit names but no array of names", o.n_units);
  if (o.test_delay_s < 0 || o.test_delay_s > 10)
    return px_error(PX_ERR_INVALID, "ZeRO: test_delay_s %g outside [0, 10] seconds", o.test_delay_s);
  if (o.stage != 3) o.n_units = 0;  // units only say what gathers together
  px_status st = px_parallel_check_layout(model, comm, "ZeRO");
  if (st != PX_OK) return st;

  px_zero *z = calloc(1, sizeof *z);
  if (!z) return px_error(PX_ERR_NOMEM, "ZeRO: out of memory");
  z->model = model;
  z->comm = comm;
  z->opts = o;
  z->stage = o.stage;
  z->rank = px_comm_rank(comm);
  z->size = px_comm_size(comm);
  z->sync = true;
  z->root_group = -1;
  const size_t np = (size_t)model->n_params + 1, nm = (size_t)model->n_modules + 1;
  z->gparams = calloc(np, sizeof *z->gparams);
  z->param_group = calloc(np, sizeof *z->param_group);
  z->param_pos = calloc(np, sizeof *z->param_pos);
  z->param_ready = calloc(np, sizeof *z->param_ready);
  z->module_ran = calloc(nm, sizeof *z->module_ran);
  if (!z->gparams || !z->param_group || !z->param_pos || !z->param_ready || !z->module_ran) {
    zero_destroy(z);
    return px_error(PX_ERR_NOMEM, "ZeRO: out of memory");
  }
  // Which groups: stage 3's units are checked before any communication
  // (every rank holds the same model, so every rank fails alike).
  st = z->stage == 3 ? pxz_build_units(z) : build_buckets(z);
  if (st == PX_OK) st = check_opts_agree(z);
  if (st == PX_OK) st = pxr_init(&z->rsum, comm);
  if (st == PX_OK) st = lay_out_groups(z);
  if (st == PX_OK) {
    z->inflight = calloc((size_t)z->n_groups + 1, sizeof *z->inflight);
    // Stages 1-2 keep their parameter pieces in place in param_data, and
    // stage 1 its gradient pieces in grad_data: no separate copy.
    if (z->stage == 3) z->shard_params = alloc_floats(z->shard_n);
    if (z->stage >= 2) z->shard_grads = alloc_floats(z->shard_n);
    if (!z->inflight || (z->stage == 3 && !z->shard_params) || (z->stage >= 2 && !z->shard_grads))
      st = px_error(PX_ERR_NOMEM, "ZeRO: out of memory");
  }
  // Everyone starts from the root's parameters and running statistics.
  if (st == PX_OK) {
    px_comm_set_label(comm, "ZeRO wrap: broadcast parameters");
    st = px_comm_broadcast(comm, model->param_data, model->n_param_elems, PX_F32, o.root);
  }
  if (st == PX_OK && model->n_buffer_elems)
    st = px_comm_broadcast(comm, model->buffer_data, model->n_buffer_elems, PX_F32, o.root);
  px_hooks h = {.user = z,
                .pre_forward = on_pre_forward,
                .post_forward = on_post_forward,
                .pre_backward = on_pre_backward,
                .grads_ready = on_grads_ready};
  if (st == PX_OK) st = px_model_attach_hooks(model, &h, &z->hook_handle);
  if (st != PX_OK) {
    zero_destroy(z);
    return st;
  }

  // Keep this rank's pieces; let go of what the stage shards.
  for (int g = 0; z->stage == 3 && g < z->n_groups; g++) {
    const zgroup *G = &z->groups[g];
    size_t lo = (size_t)z->rank * G->piece;
    piece_copy(G, lo, lo + G->piece, z->shard_params + G->shard_off, model->param_data, false);
  }
  if (z->stage >= 2) {
    free(model->grad_data);
    model->grad_data = NULL;
    for (int i = 0; i < model->n_params; i++) model->params[i]->grad = NULL;
  }
  if (z->stage == 3) {
    free(model->param_data);
    model->param_data = NULL;
    for (int i = 0; i < model->n_params; i++) model->params[i]->data = NULL;
  }
  z->attached = true;
  begin_step(z);
  *out = z;
  return PX_OK;
}

px_status px_zero_free(px_zero *z) {
  if (!z) return PX_OK;
  px_model *md = z->model;
  px_status st = drain(z);
  if (z->stage == 3) pxz_release_all(z);
  z->attached = false;
  // Give the model back whole: stage 3 gathers every unit into a new
  // param_data (collective); stages 2-3 get a zeroed grad_data again.
  if (z->stage == 3) {
    float *params = alloc_floats(md->n_param_elems);
    px_status g = params ? pxz_gather_into(z, params)
                         : px_error(PX_ERR_NOMEM,
                                    "ZeRO free: cannot allocate "
                                    "%zu parameters",
                                    md->n_param_elems);
    if (g != PX_OK && st == PX_OK) st = g;
    md->param_data = params;
    for (int i = 0; i < md->n_params; i++) md->params[i]->data = params ? params + md->params[i]->offset : NULL;
  }
  if (z->stage >= 2) {
    md->grad_data = alloc_floats(md->n_param_elems);
    if (!md->grad_data && st == PX_OK)
      st = px_error(PX_ERR_NOMEM, "ZeRO free: cannot allocate %zu gradients", md->n_param_elems);
    for (int i = 0; i < md->n_params; i++)
      md->params[i]->grad = md->grad_data ? md->grad_data + md->params[i]->offset : NULL;
  }
  zero_destroy(z);
  return st;
}

/* ---- The step --------------------------------------------------------------- */

void px_zero_shard(const px_zero *z, float **params, float **grads, size_t *n) {
  if (params) *params = z->shard_params;
  if (grads) *grads = z->shard_grads;
  if (n) *n = z->shard_n;
}

/* Where segment k of the shard (shard[shard_off, +count) = flat[flat_off,
 * +count)) keeps its parameters and gradients in this stage. */
static float *seg_params(const px_zero *z, size_t flat_off, size_t shard_off) {
  return z->stage == 3 ? z->shard_params + shard_off : z->model->param_data + flat_off;
}
static float *seg_grads(const px_zero *z, size_t flat_off, size_t shard_off) {
  return z->stage == 1 ? z->model->grad_data + flat_off : z->shard_grads + shard_off;
}

px_status px_zero_optim_create(px_zero *z, px_optim **out, const px_optim_opts *opts) {
  if (!out) return px_error(PX_ERR_INVALID, "ZeRO optim: out is NULL");
  *out = NULL;
  if (!z) return px_error(PX_ERR_INVALID, "ZeRO optim: no ZeRO wrap given");
  if (z->stage == 3) return px_optim_create(out, z->shard_params, z->shard_grads, z->shard_n, opts);
  const int n = px_zero_segments(z, NULL, NULL, NULL, 0);
  size_t *v = malloc(3 * (size_t)(n > 0 ? n : 1) * sizeof *v);
  px_optim_segment *seg = malloc((size_t)(n > 0 ? n : 1) * sizeof *seg);
  if (!v || !seg) {
    free(v);
    free(seg);
    return px_error(PX_ERR_NOMEM, "ZeRO optim: out of memory");
  }
  size_t *flat_off = v, *shard_off = v + n, *count = v + 2 * n;
  px_zero_segments(z, flat_off, shard_off, count, n);
  for (int k = 0; k < n; k++)
    seg[k] = (px_optim_segment){.params = seg_params(z, flat_off[k], shard_off[k]),
                                .grads = seg_grads(z, flat_off[k], shard_off[k]),
                                .count = count[k],
                                .offset = shard_off[k]};
  px_status st = px_optim_create_segments(out, seg, n, z->shard_n, opts);
  free(v);
  free(seg);
  return st;
}

/* Apply f to every segment of this rank's gradient pieces. */
static void each_grad_segment(const px_zero *z, void (*f)(float *g, size_t n, void *user), void *user) {
  if (z->stage >= 2) {
    f(z->shard_grads, z->shard_n, user);
    return;
  }  // contiguous; padding is zero
  for (int g = 0; g < z->n_groups; g++) {
    const zgroup *G = &z->groups[g];
    size_t lo = (size_t)z->rank * G->piece, hi = lo + G->piece < G->count ? lo + G->piece : G->count;
    if (lo < hi) f(z->model->grad_data + G->ranges[0].flat_off + lo, hi - lo, user);  // a bucket is one range
  }
}

static void scale_cb(float *g, size_t n, void *user) { px_scale(g, n, *(const float *)user); }
static void sumsq_cb(float *g, size_t n, void *user) { *(double *)user += px_sumsq(g, n); }
typedef struct clip_args {
  float total, max_norm;
} clip_args;
static void clip_cb(float *g, size_t n, void *user) {
  const clip_args *a = user;
  px_clip_grad_scale(g, n, a->total, a->max_norm);
}

int px_zero_segments(const px_zero *z, size_t *flat_off, size_t *shard_off, size_t *count, int max) {
  int n = 0;
  for (int g = 0; g < z->n_groups; g++) {
    const zgroup *G = &z->groups[g];
    size_t lo = (size_t)z->rank * G->piece, hi = lo + G->piece;
    for (int k = 0; k < G->n_ranges; k++) {
      const zrange *r = &G->ranges[k];
      size_t a = r->packed_off > lo ? r->packed_off : lo;
      size_t b = r->packed_off + r->count < hi ? r->packed_off + r->count : hi;
      if (a >= b) continue;
      if (n < max) {
        if (flat_off) flat_off[n] = r->flat_off + (a - r->packed_off);
        if (shard_off) shard_off[n] = G->shard_off + (a - lo);
        if (count) count[n] = b - a;
      }
      n++;
    }
  }
  return n;
}

void px_zero_set_sync(px_zero *z, bool sync) { z->sync = sync; }

px_status px_zero_sync(px_zero *z) {
  if (!z->sync) return PX_OK;
  px_status st = PX_OK;
  if (z->error != PX_OK) st = px_error(z->error, "%s", z->error_msg);
  for (int i = 0; i < z->model->n_params && st == PX_OK; i++)
    if (!z->param_ready[i])
      st = px_error(PX_ERR_INVALID,
                    "ZeRO: parameter \"%s\" received no gradient this step (its module did not run forward, or "
                    "backward was not called); set find_unused_parameters if that is expected",
                    z->model->params[i]->name);
  if (st != PX_OK) {
    // Our peers are (or will be) inside collectives we will never join.
    char why[600];
    snprintf(why, sizeof why, "%s", px_last_error());
    drain(z);
    if (z->stage == 3) pxz_release_all(z);
    z->error = PX_OK;
    px_comm_abort(z->comm, why);
    return px_error(st, "%s", why);
  }
  if ((st = drain(z)) != PX_OK) return st;
  if (z->stage == 3) pxz_release_all(z);
  float inv = 1.0f / (float)z->size;
  each_grad_segment(z, scale_cb, &inv);
  begin_step(z);
  return PX_OK;
}

px_status px_zero_clip_grad_norm(px_zero *z, float max_norm, double *norm) {
  // ‖g‖² = Σ_ranks Σ_shard g²  (padding is zero), one all-reduce.
  double ss = 0;
  each_grad_segment(z, sumsq_cb, &ss);
  px_comm_set_label(z->comm, "ZeRO clip: sum of squares");
  px_status st = px_comm_allreduce(z->comm, &ss, 1, PX_F64, PX_SUM);
  if (st != PX_OK) return st;
  const float total = (float)sqrt(ss);  // as px_clip_grad_norm rounds it
  clip_args a = {.total = total, .max_norm = max_norm};
  if (max_norm > 0) each_grad_segment(z, clip_cb, &a);
  if (norm) *norm = total;
  return PX_OK;
}

/* All-gather group g's pieces in place in param_data (each rank's piece is
 * already there, updated by the optimizer): straight in the flat buffer
 * when the bucket divides evenly, else through a padded buffer holding
 * this rank's piece and zero padding. */
static px_status start_param_gather(px_zero *z, int g, float **staged, px_request **req) {
  zgroup *G = &z->groups[g];
  const size_t padded = G->piece * (size_t)z->size, lo = (size_t)z->rank * G->piece;
  float *recv = z->model->param_data + G->ranges[0].flat_off;  // a bucket is one range
  if (padded != G->count) {
    float *buf = *staged = pxz_pool_get(&z->ppool, padded);
    if (!buf) return PX_ERR_NOMEM;
    size_t hi = lo + G->piece < G->count ? lo + G->piece : G->count, have = lo < hi ? hi - lo : 0;
    if (have) memcpy(buf + lo, recv + lo, have * sizeof(float));
    memset(buf + lo + have, 0, (G->piece - have) * sizeof(float));
    recv = buf;
  }
  set_label(z, "all-gather", g);
  pxz_delay(z);
  z->n_allgather++;
  return px_comm_iallgather(z->comm, recv + lo, recv, G->piece, PX_F32, req);
}

static px_status finish_param_gather(px_zero *z, int g, float **staged, px_request **req, px_status st) {
  if (*req) {
    px_status w = px_request_wait(*req);
    *req = NULL;
    if (w != PX_OK && st == PX_OK) st = w;
  }
  if (*staged) {
    if (st == PX_OK)
      memcpy(z->model->param_data + z->groups[g].ranges[0].flat_off, *staged, z->groups[g].count * sizeof(float));
    pxz_pool_put(&z->ppool, *staged);
    *staged = NULL;
  }
  return st;
}

px_status px_zero_after_step(px_zero *z) {
  if (z->stage == 3) return PX_OK;  // parameters stay sharded
  // A window of PXZ_MAX_AG_IN_FLIGHT all-gathers: overlapped, and padded
  // buffers bounded whatever the number of buckets.
  px_status st = PX_OK;
  int live[PXZ_MAX_AG_IN_FLIGHT];
  float *staged[PXZ_MAX_AG_IN_FLIGHT] = {0};
  px_request *req[PXZ_MAX_AG_IN_FLIGHT] = {0};
  int head = 0, tail = 0;
  for (int g = 0; g < z->n_groups && st == PX_OK; g++) {
    if (z->groups[g].count == 0) continue;
    if (tail - head == PXZ_MAX_AG_IN_FLIGHT) {
      int k = head++ % PXZ_MAX_AG_IN_FLIGHT;
      st = finish_param_gather(z, live[k], &staged[k], &req[k], st);
    }
    int k = tail++ % PXZ_MAX_AG_IN_FLIGHT;
    live[k] = g;
    px_status s2 = start_param_gather(z, g, &staged[k], &req[k]);
    if (s2 != PX_OK && st == PX_OK) st = s2;
  }
  while (head < tail) {
    int k = head++ % PXZ_MAX_AG_IN_FLIGHT;
    st = finish_param_gather(z, live[k], &staged[k], &req[k], st);
  }
  return st;
}

void px_zero_zero_grad(px_zero *z) {
  if (z->shard_grads) px_fill(z->shard_grads, z->shard_n, 0.0f);
  if (z->model->grad_data) px_fill(z->model->grad_data, z->model->n_param_elems, 0.0f);
}

px_status px_zero_set_params(px_zero *z, const float *flat) {
  if (!flat) return px_error(PX_ERR_INVALID, "ZeRO set_params: no parameters given");
  for (int g = 0; z->stage == 3 && g < z->n_groups; g++) {
    const zgroup *G = &z->groups[g];
    size_t lo = (size_t)z->rank * G->piece;
    piece_copy(G, lo, lo + G->piece, z->shard_params + G->shard_off, (float *)flat, false);
  }
  if (z->stage < 3) memcpy(z->model->param_data, flat, z->model->n_param_elems * sizeof(float));
  return PX_OK;
}

px_status px_zero_gather_params(px_zero *z, float *out) {
  if (z->stage < 3) {
    memcpy(out, z->model->param_data, z->model->n_param_elems * sizeof(float));
    return PX_OK;
  }
  return pxz_gather_into(z, out);
}

void px_zero_memory_of(const px_zero *z, px_zero_memory *m) {
  const size_t f = sizeof(float), n = z->model->n_param_elems, s = z->shard_n;
  *m = (px_zero_memory){0};
  // Held for the whole run: what the stage keeps whole (stages 1-2's
  // pieces lie in place inside it), else the shard.  Temporary buffers
  // are counted by what their pools hold (their high-water mark).
  m->params = z->stage < 3 ? n * f : s * f;
  m->grads = (z->stage == 1 ? n * f : s * f) + z->gpool.bytes;
  m->gathered = z->ppool.bytes;
  m->arena_peak = px_arena_high_water(z->model->arena);
}

int px_zero_stage(const px_zero *z) { return z->stage; }
int px_zero_unit_count(const px_zero *z) { return z->stage == 3 ? z->n_units : 0; }

void px_zero_counts(const px_zero *z, int64_t *allgathers, int64_t *reduce_scatters) {
  if (allgathers) *allgathers = z->n_allgather;
  if (reduce_scatters) *reduce_scatters = z->n_reduce_scatter;
}
