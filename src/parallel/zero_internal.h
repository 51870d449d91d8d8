// ZeRO's state, shared by zero.c (groups, shards, hooks, stages 1-2) and
// zero_units.c (stage 3: units, gathering, prefetch).  Not public API.
//
// A group is a list of flat ranges packed one after the other:
//
//   flat:    [ a a a | b b | c c c c | d ]        ranges of group g: a, c
//   packed:  [ a a a c c c c . ]                 count 7, padded to 8 (N = 2)
//   pieces:  [ rank 0 ][ rank 1 ]                piece = ceil(count / N) = 4
//
// Rank r owns packed[r·piece, (r+1)·piece) of every group, stored in group
// order in its shard.  Padding (packed positions >= count) is zero in every
// buffer and never maps to a parameter.
#ifndef PX_PARALLEL_ZERO_INTERNAL_H
#define PX_PARALLEL_ZERO_INTERNAL_H

#include "parallel/internal.h"
#include "parallel/rank_sum.h"

/* Reduce-scatters allowed in flight when new gradient storage is needed.
 * Stages 2-3 first finish the oldest beyond this, so a rank holds its
 * shard plus at most this many groups in flight and the one being written
 * (plus a tied embedding's, written early by the head).  One (issue 11's
 * memory bound): a group's reduce-scatter overlaps the backward that goes
 * on in groups whose storage exists (the rest of a stage-2 bucket, the
 * prefetch wait), and is finished when the next group's storage is made,
 * so stage 3 holds one unit's gradients besides the root unit's.  Stage
 * 1's padded copies obey the same bound. */
#define PXZ_MAX_RS_IN_FLIGHT 1
/* Stages 1-2: after-step all-gathers in flight at once (each may hold a
 * padded buffer when its bucket does not divide by N). */
#define PXZ_MAX_AG_IN_FLIGHT 2

typedef struct zrange {
  size_t flat_off, count; /* flat[flat_off, +count) */
  size_t packed_off;      /* its place in the packed group */
} zrange;

typedef struct zgroup {
  zrange *ranges;
  int n_ranges;
  size_t count;       /* elements, padding excluded */
  size_t piece;       /* ceil(count / N): each rank's share */
  size_t shard_off;   /* this rank's piece is shard[shard_off, +piece) */
  int p0, np;         /* its parameters: z->gparams[p0, p0 + np) */
  int pending;        /* parameters not yet ready this backward */
  bool launched;      /* reduce-scatter started this backward */
  px_module *unit;    /* stage 3: the unit's module; NULL for buckets and the root unit */
  bool pinned;        /* stage 3: read by a module outside the unit (a tied head): kept
                              gathered from its forward until its gradients are ready */
  float *pbuf;        /* stage 3: gathered parameters (piece·N), NULL when resharded */
  px_request *ag_req; /* all-gather into pbuf in flight */
  float *gbuf;        /* stage 2-3: gradient storage (piece·N) while materialised;
                              stage 1: the padded copy a reduce-scatter sends */
  pxr_sum *rs_req;    /* reduce-scatter in flight (in rank order: rank_sum.h) */
} zgroup;

/* Buffers reused across steps (DESIGN decision 4): gradient buckets and
 * gathered units come from here and go back when done. */
typedef struct zbuf {
  float *data;
  size_t cap;
  bool busy;
} zbuf;

typedef struct zpool {
  zbuf *b;
  int n, cap;
  size_t held;  /* allocated now */
  size_t bytes; /* the most it has held at once (its high-water mark) */
} zpool;

struct px_zero {
  px_model *model;
  px_comm *comm;
  pxr_ctx rsum; /* reduce-scatters sum in rank order, as DDP's all-reduce */
  px_zero_opts opts;
  int stage, rank, size;
  int hook_handle;
  bool attached;
  bool buffers_dirty; /* px_parallel_sync_buffers (buffer_sync.c) */
  zgroup *groups;
  int n_groups;
  int *gparams;        /* (n_params,) parameter indices grouped by group */
  int *param_group;    /* (n_params,) */
  size_t *param_pos;   /* (n_params,) packed position in its group */
  bool *param_ready;   /* (n_params,) */
  bool *module_ran;    /* (n_modules,) ran forward this step */
  float *shard_params; /* (shard_n,) what the optimizer updates */
  float *shard_grads;  /* (shard_n,) */
  size_t shard_n;
  zpool ppool, gpool; /* parameter and gradient buffers */
  int next_launch;    /* stages 1-2: buckets launch in index order */
  int *inflight;      /* (n_groups,) groups with a reduce-scatter in flight, launch order */
  int in_head, in_tail;
  bool sync;
  int64_t n_allgather, n_reduce_scatter;
  px_status error; /* first failure inside a hook */
  char error_msg[512];
  /* Stage 3. */
  int n_units;                              /* groups that are units with parameters (root unit included) */
  int root_group;                           /* the root unit's group, -1 if it holds nothing */
  int *module_unit;                         /* (n_modules,) group whose unit module this is, else -1 */
  int *module_home;                         /* (n_modules,) group of the unit containing the module */
  int *fwd_order, *bwd_order, n_fwd, n_bwd; /* units as the first training step ran them */
  int *fwd_pos, *bwd_pos;                   /* (n_groups,) position in those, -1 */
  bool recording, order_known;
  /* The root unit as the first training step read it, [0] forward, [1]
   * backward: after the last unit so far (after the last unit, once the
   * order is known), and between two units (then it stays gathered). */
  bool root_after[2], root_between[2];
};

/* zero.c */
float *pxz_pool_get(zpool *p, size_t n);
void pxz_pool_put(zpool *p, float *data);
void pxz_fail(px_zero *z, px_status st);
void pxz_delay(const px_zero *z);
void pxz_set_views(px_zero *z, int g, float *base, bool grads);
void pxz_materialise_grads(px_zero *z, int g);

/* zero_units.c: stage 3 */
px_status pxz_build_units(px_zero *z);
void pxz_start_gather(px_zero *z, int g);
void pxz_ensure_gathered(px_zero *z, int g);
void pxz_release(px_zero *z, int g);
void pxz_release_all(px_zero *z);
void pxz_units_pre_forward(px_zero *z, px_module *m);
void pxz_units_post_forward(px_zero *z, px_module *m);
void pxz_units_pre_backward(px_zero *z, px_module *m);
px_status pxz_gather_into(px_zero *z, float *out);

#endif
