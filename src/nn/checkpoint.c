// Activation checkpointing (nn.h, docs/RECOMPUTE.md): a unit that keeps its
// input and output only, and recomputes its internals inside its backward.
//
// Arena during one step, a chain of three full units U0 U1 U2 (x_i: unit
// inputs, y_i = x_{i+1}; [..] internals released by the rewind):
//
//   forward    x0 | [U0 internals] -> moved: x0 y0 | [U1 internals] -> x0 y0 y1 | ...
//   backward   x0 y0 y1 y2 dy2 | [U2 recomputed + its backward] -> ... dy2 dx2 | ...
//
// so the peak is the unit inputs and outputs plus ONE unit's internals
// (recomputed, plus its backward temporaries), instead of every unit's.
//
// Exactness: the recompute runs the same kernels on the same input with
// ctx->step and ctx->seed of the original forward, so dropout's Philox
// counters, batch statistics and every float are the same bits; the
// backward then reads exactly what it would have read.  Batch norm sees
// ctx->recomputing and leaves its running statistics alone the second time.
#include "plexus/nn.h"

#include <stdio.h>
#include <string.h>

typedef struct checkpoint {
  px_module base; /* children: [0] inner (full); [0] cheap, [1] consumer (pair) */
  px_tensor x;    /* the unit's input, kept (it lives before the unit's mark) */
  uint64_t seed, step;
} checkpoint;

// Move *t's bytes down to m (if they were allocated since) and release the rest.
static px_status keep_only(px_ctx *ctx, px_arena_mark m, px_tensor *t) {
  if (!t) {
    px_arena_rewind(ctx->arena, m);
    return PX_OK;
  }
  void *kept = px_arena_rewind_keep(ctx->arena, m, t->data, px_tensor_nbytes(t));
  if (!kept && t->data) return PX_ERR_NOMEM;
  t->data = kept;
  return PX_OK;
}

static void enter_recompute(px_ctx *ctx, const checkpoint *c, uint64_t *seed, uint64_t *step) {
  *seed = ctx->seed;
  *step = ctx->step;
  ctx->seed = c->seed;  // the same Philox counters as the original forward
  ctx->step = c->step;
  ctx->recomputing++;
}

static void leave_recompute(px_ctx *ctx, uint64_t seed, uint64_t step) {
  ctx->recomputing--;
  ctx->seed = seed;
  ctx->step = step;
}

/* ---- Full: one inner module ---------------------------------------------- */

static px_status ckpt_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  checkpoint *c = (checkpoint *)m;
  c->x = *x;
  c->seed = ctx->seed;
  c->step = ctx->step;
  px_arena_mark mark = px_arena_get_mark(ctx->arena);
  px_status st = px_module_forward(m->children[0], ctx, x, y);
  if (st != PX_OK) return st;
  return keep_only(ctx, mark, y);
}

static px_status ckpt_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  checkpoint *c = (checkpoint *)m;
  px_arena_mark mark = px_arena_get_mark(ctx->arena);
  uint64_t seed, step;
  enter_recompute(ctx, c, &seed, &step);
  px_tensor again;
  px_status st = px_module_forward(m->children[0], ctx, &c->x, &again);
  leave_recompute(ctx, seed, step);
  if (st != PX_OK) return px_error_wrap(st, "recompute of checkpointed %s", m->children[0]->ops->type);
  if ((st = px_module_backward(m->children[0], ctx, dy, dx)) != PX_OK) return st;
  return keep_only(ctx, mark, dx);
}

static const px_module_ops checkpoint_ops = {
  .type = "Checkpoint",
  .forward = ckpt_forward,
  .backward = ckpt_backward,
};

px_module *px_checkpoint(px_module *inner) {
  if (!inner) return NULL;  // the inner constructor's message stays
  px_module *m = px_module_alloc(sizeof(checkpoint), &checkpoint_ops);
  if (m) m->rng_transparent = true;  // draws nothing: the modules after it keep their streams
  if (m && px_module_add_child(m, "", inner) != PX_OK) {
    px_module_free(m);
    m = NULL;
  }
  if (!m && !inner->parent) px_module_free(inner);  // consumed either way, as px_residual does
  return m;
}

/* ---- Pair: a cheap module recomputed, a consumer rebound ------------------ */

static px_status pair_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  checkpoint *c = (checkpoint *)m;
  c->x = *x;
  c->seed = ctx->seed;
  c->step = ctx->step;
  px_arena_mark mark = px_arena_get_mark(ctx->arena);
  px_tensor t;
  px_status st = px_module_forward(m->children[0], ctx, x, &t);
  if (st == PX_OK) st = px_module_forward(m->children[1], ctx, &t, y);
  if (st != PX_OK) return st;
  return keep_only(ctx, mark, y);  // t (e.g. GELU's (N, T, 4C) output) is released
}

static px_status pair_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  checkpoint *c = (checkpoint *)m;
  px_module *cheap = m->children[0], *consumer = m->children[1];
  px_arena_mark mark = px_arena_get_mark(ctx->arena);
  uint64_t seed, step;
  enter_recompute(ctx, c, &seed, &step);
  px_tensor t, dt;
  px_status st = px_module_forward(cheap, ctx, &c->x, &t);
  leave_recompute(ctx, seed, step);
  if (st != PX_OK) return px_error_wrap(st, "recompute of %s \"%s\"", cheap->ops->type, cheap->name);
  consumer->ops->rebind(consumer, &t);  // dW += tᵀ·dy reads the recomputed t; no GEMM is redone
  if ((st = px_module_backward(consumer, ctx, dy, &dt)) != PX_OK) return st;
  if ((st = px_module_backward(cheap, ctx, &dt, dx)) != PX_OK) return st;
  return keep_only(ctx, mark, dx);
}

static const px_module_ops pair_ops = {
  .type = "CheckpointPair",
  .forward = pair_forward,
  .backward = pair_backward,
};

px_module *px_checkpoint_pair(const char *cheap_name, px_module *cheap, const char *consumer_name,
                              px_module *consumer) {
  px_module *m = NULL;
  if (cheap && consumer && !consumer->ops->rebind)
    px_error(PX_ERR_INVALID,
             "checkpoint pair: %s cannot take a recomputed input (no rebind); wrap both in "
             "px_checkpoint instead",
             consumer->ops->type);
  else if (cheap && consumer) m = px_module_alloc(sizeof(checkpoint), &pair_ops);
  if (m) m->rng_transparent = true;
  if (m &&
      (px_module_add_child(m, cheap_name, cheap) != PX_OK ||
       px_module_add_child(m, consumer_name, consumer) != PX_OK)) {
    px_module_free(m);  // frees the adopted children
    m = NULL;
  }
  if (!m) {
    if (cheap && !cheap->parent) px_module_free(cheap);
    if (consumer && !consumer->parent) px_module_free(consumer);
  }
  return m;
}

/* ---- Policies ---------------------------------------------------------------- */

px_status px_recompute_parse(const char *text, px_recompute *out) {
  *out = (px_recompute){.kind = PX_RECOMPUTE_NONE, .every = 0};
  const char *s = text ? text : "";
  if (strcmp(s, "none") == 0 || strcmp(s, "") == 0) return PX_OK;
  if (strcmp(s, "full") == 0) {
    out->kind = PX_RECOMPUTE_FULL;
    out->every = 1;
    return PX_OK;
  }
  if (strcmp(s, "selective") == 0) {
    out->kind = PX_RECOMPUTE_SELECTIVE;
    return PX_OK;
  }
  if (strncmp(s, "every:", 6) == 0) {
    const char *d = s + 6;
    long k = 0;
    bool digits = *d != '\0';
    for (const char *p = d; *p; p++) {
      if (*p < '0' || *p > '9') {
        digits = false;
        break;
      }
      k = k * 10 + (*p - '0');
      if (k > 1000000) {
        digits = false;
        break;
      }
    }
    if (!digits || k < 1)
      return px_error(PX_ERR_INVALID,
                      "recompute policy \"%s\": K in every:K must be a whole number >= 1 "
                      "(every:1 is full, every:2 every other block)",
                      s);
    out->kind = PX_RECOMPUTE_EVERY;
    out->every = (int)k;
    return PX_OK;
  }
  return px_error(PX_ERR_INVALID,
                  "recompute policy \"%s\" does not exist; expected none, full, selective or "
                  "every:K (K >= 1)",
                  s);
}

const char *px_recompute_name(px_recompute r, char *buf, size_t cap) {
  switch (r.kind) {
  case PX_RECOMPUTE_NONE: snprintf(buf, cap, "none"); break;
  case PX_RECOMPUTE_FULL: snprintf(buf, cap, "full"); break;
  case PX_RECOMPUTE_SELECTIVE: snprintf(buf, cap, "selective"); break;
  case PX_RECOMPUTE_EVERY: snprintf(buf, cap, "every:%d", r.every); break;
  }
  return buf;
}

px_status px_checkpoint_blocks(px_module *blocks, px_recompute r, int first) {
  if (!blocks) return px_error(PX_ERR_INVALID, "checkpoint_blocks: no container of blocks");
  if (r.kind == PX_RECOMPUTE_SELECTIVE)
    return px_error(PX_ERR_INVALID,
                    "checkpoint_blocks: selective recomputation is chosen inside each block by "
                    "the model that builds it (the zoo's GPT), not per block");
  if (r.kind == PX_RECOMPUTE_EVERY && r.every < 1)
    return px_error(PX_ERR_INVALID, "checkpoint_blocks: every:%d; K must be >= 1", r.every);
  if (r.kind == PX_RECOMPUTE_NONE) return PX_OK;
  const int k = r.kind == PX_RECOMPUTE_FULL ? 1 : r.every;
  for (int i = 0; i < blocks->n_children; i++) {
    if ((first + i) % k != 0) continue;
    // Wrap in place: the wrapper takes the block's name and slot, the block
    // becomes its transparent child, so parameter names do not change.
    px_module *b = blocks->children[i];
    char name[sizeof b->name];
    memcpy(name, b->name, sizeof name);
    b->parent = NULL;
    px_module *w = px_checkpoint(b);
    if (!w) {
      // px_checkpoint consumed b: take its slot out so the chain frees nothing twice.
      for (int j = i; j + 1 < blocks->n_children; j++) blocks->children[j] = blocks->children[j + 1];
      blocks->n_children--;
      return PX_ERR_NOMEM;
    }
    memcpy(w->name, name, sizeof name);
    w->parent = blocks;
    blocks->children[i] = w;
  }
  return PX_OK;
}
