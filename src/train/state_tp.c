// Checkpoints of a tensor-parallel run (o.mesh): each tp rank holds boxes of
// the global tensors (px_tp_param_box), so each writes them as pieces of
// the layout-independent format (io.h, version 2: a piece is a box of the
// global tensor), and a resume at any layout loads by intersecting boxes.
//
//   model.rank<r>-of-<tp>.safetensors   tp rank r's parameter boxes: one
//                                       piece per part of each box (c_attn's
//                                       q, k, v thirds are three); the
//                                       replicated parameters (layer norms,
//                                       wpe, row-parallel biases) whole, on
//                                       tp rank 0 only
//   optim.rank<r>-of-<tp>.safetensors   the optimizer's slots, the same
//                                       boxes: "exp_avg.h.0.attn.c_attn.weight"
//   state.json                          as any run's, with "mesh"
//
// Only dp rank 0's tp group writes the parameters: DDP's replicas (and ZeRO
// 1-2's, after the step's all-gather) are equal.  Under ZeRO the optimizer
// state is each rank's shard of its tp rank's boxes: every rank writes
// optim.rank<r>-of-<world> (shard_box_pieces).  A piece's
// data is the box's elements in the BOX's row-major order; a column block
// of a (rows, cols) tensor lies strided in the rank's storage, so pieces
// are copied out for saving and scattered back after loading.
#include "train/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Whether parameter p is in a list of pieces: not the one named `skip`
// (a pipeline's tied copy), and the replicated ones only when asked.
static bool listed(const px_param *p, const px_tp_box *b, bool replicated, const char *skip) {
  if (skip && strcmp(p->name, skip) == 0) return false;
  return b->split_dim >= 0 || replicated;
}

// Pieces of one flat buffer laid out as the model's parameters (the
// parameters themselves, or an optimizer slot), keys "<prefix><name>".
// replicated: include the parameters every tp rank holds whole.  The
// pieces' data is one malloc'ed block (*block).
static px_status box_pieces(const px_model *md, const char *prefix, bool replicated, const char *skip,
                            px_tensor_piece **out, int *n_out, float **block) {
  *out = NULL;
  *n_out = 0;
  *block = NULL;
  size_t elems = 0;
  int n = 0;
  for (int i = 0; i < md->n_params; i++) {
    const px_tp_box b = px_tp_param_box(md->params[i]);
    if (!listed(md->params[i], &b, replicated, skip)) continue;
    n += b.split_dim < 0 ? 1 : b.n_parts;
    elems += md->params[i]->numel;
  }
  px_tensor_piece *pc = calloc(n > 0 ? (size_t)n : 1, sizeof *pc);
  float *data = malloc((elems > 0 ? elems : 1) * sizeof *data);
  if (!pc || !data) {
    free(pc);
    free(data);
    return px_error(PX_ERR_NOMEM, "checkpoint (tensor parallel): out of memory");
  }
  int k = 0;
  size_t at = 0;
  for (int i = 0; i < md->n_params; i++) {
    const px_param *p = md->params[i];
    const px_tp_box b = px_tp_param_box(p);
    if (!listed(p, &b, replicated, skip)) continue;
    const int parts = b.split_dim < 0 ? 1 : b.n_parts;
    for (int q = 0; q < parts; q++, k++) {
      px_tensor_piece *c = &pc[k];
      if (snprintf(c->key, sizeof c->key, "%s%s", prefix, p->name) >= (int)sizeof c->key) {
        free(pc);
        free(data);
        return px_error(PX_ERR_INVALID, "checkpoint: name \"%s%s\" is too long", prefix, p->name);
      }
      c->ndim = p->ndim;
      // A parameter no tp rank splits has its own shape (any rank: a conv's 4-D).
      for (int d = 0; d < p->ndim; d++) c->shape[d] = b.split_dim < 0 ? p->shape[d] : d < 2 ? b.global_shape[d] : 0;
      if (b.split_dim >= 0) {  // the box: the global tensor, cut along split_dim
        for (int d = 0; d < p->ndim; d++) c->box_size[d] = c->shape[d];
        c->box_offset[b.split_dim] = b.global_offset[q];
        c->box_size[b.split_dim] = b.size[q];
      }
      c->offset = 0;
      c->count = b.split_dim < 0 ? p->numel : p->numel / (size_t)b.n_parts;
      c->data = data + at;
      at += c->count;
    }
  }
  *out = pc;
  *n_out = n;
  *block = data;
  return PX_OK;
}

// Copy between a parameter's storage in `base` (the flat buffer) and its
// pieces' box-ordered data: to_pieces for saving, back after loading.
void px_box_pieces_move(const px_model *md, const float *base_in, float *base_out, px_tensor_piece *pc, bool replicated,
                        const char *skip, bool to_pieces) {
  int k = 0;
  for (int i = 0; i < md->n_params; i++) {
    const px_param *p = md->params[i];
    const px_tp_box b = px_tp_param_box(p);
    if (!listed(p, &b, replicated, skip)) continue;
    const size_t off = p->offset;
    if (b.split_dim < 0) {
      if (to_pieces) memcpy(pc[k].data, base_in + off, p->numel * sizeof(float));
      else memcpy(base_out + off, pc[k].data, p->numel * sizeof(float));
      k++;
      continue;
    }
    // Local storage (rows, lcols): split_dim 0 cuts rows, 1 columns.
    const size_t rows = p->ndim > 1 ? (size_t)p->shape[0] : 1;
    const size_t lcols = p->numel / rows;
    for (int q = 0; q < b.n_parts; q++, k++) {
      float *piece = pc[k].data;
      if (b.split_dim == 0 || p->ndim == 1) {  // rows [local_offset, + size): contiguous
        const size_t row_elems = p->ndim == 1 ? 1 : lcols;
        const size_t first = (size_t)b.local_offset[q] * row_elems, cnt = (size_t)b.size[q] * row_elems;
        if (to_pieces) memcpy(piece, base_in + off + first, cnt * sizeof(float));
        else memcpy(base_out + off + first, piece, cnt * sizeof(float));
      } else {  // columns [local_offset, + size) of each row
        const size_t w = (size_t)b.size[q], c0 = (size_t)b.local_offset[q];
        for (size_t r = 0; r < rows; r++) {
          if (to_pieces) memcpy(piece + r * w, base_in + off + r * lcols + c0, w * sizeof(float));
          else memcpy(base_out + off + r * lcols + c0, piece + r * w, w * sizeof(float));
        }
      }
    }
  }
}

void px_box_pieces_free(px_box_pieces *f) {
  free(f->pc);
  free(f->block);
  memset(f, 0, sizeof *f);
}

px_status px_box_pieces_build(const px_model *md, int n_src, const char *const *prefixes, const float *const *bases,
                              bool replicated, const char *skip, px_box_pieces *f) {
  memset(f, 0, sizeof *f);
  for (int s = 0; s < n_src; s++) {
    px_tensor_piece *pc;
    float *block;
    int n;
    px_status st = box_pieces(md, prefixes[s], replicated, skip, &pc, &n, &block);
    if (st != PX_OK) {
      px_box_pieces_free(f);
      return st;
    }
    if (bases && bases[s]) px_box_pieces_move(md, bases[s], NULL, pc, replicated, skip, true);
    // One list, one block: append (the pieces' data pointers move with it).
    size_t elems = 0;
    for (int k = 0; k < n; k++) elems += pc[k].count;
    size_t have = 0;
    for (int k = 0; k < f->n; k++) have += f->pc[k].count;
    px_tensor_piece *gp = realloc(f->pc, (size_t)(f->n + n > 0 ? f->n + n : 1) * sizeof *gp);
    if (gp) f->pc = gp;
    float *gb = gp ? realloc(f->block, (have + elems > 0 ? have + elems : 1) * sizeof *gb) : NULL;
    if (!gp || !gb) {
      free(pc);
      free(block);
      px_box_pieces_free(f);
      return px_error(PX_ERR_NOMEM, "checkpoint (tensor parallel): out of memory");
    }
    f->block = gb;
    memcpy(f->block + have, block, elems * sizeof(float));
    memcpy(f->pc + f->n, pc, (size_t)n * sizeof *pc);
    f->n += n;
    f->per_src = n;
    free(pc);
    free(block);
    size_t at = 0;  // re-point every piece into the (moved) block
    for (int k = 0; k < f->n; k++) {
      f->pc[k].data = f->block + at;
      at += f->pc[k].count;
    }
  }
  return PX_OK;
}

// The optimizer's slots: their names as prefixes ("exp_avg.") and arrays.
int px_optim_slot_sources(px_optim *o, char prefixes[][64], const char *pp[], float *bases[], int cap) {
  const int slots = o->n_state < cap ? o->n_state : cap;
  for (int k = 0; k < slots; k++) {
    const char *name;
    bases[k] = px_optim_state_slot(o, k, &name);
    snprintf(prefixes[k], 64, "%s.", name);
    pp[k] = prefixes[k];
  }
  return slots;
}

// Pieces of flat ranges of a model's parameter buffer (a ZeRO shard): range
// k is [flat_off[k], + count[k]) of md's flat layout, its data at
// base + shard_off[k].  Within one parameter a flat range is a flat range
// of its box when the box has one part, and for c_attn's three parts (q,
// k, v columns side by side in each row) a run per row and part.  The
// pieces point into base: nothing is copied, for saving or loading.
// Replicated parameters only when asked; `skip` (may be NULL) left out.
px_status px_range_box_pieces(const px_model *md, int n_seg, const size_t *flat_off, const size_t *shard_off,
                              const size_t *count, const char *prefix, float *base, bool replicated, const char *skip,
                              px_tensor_piece **all, int *n, int *cap) {
  px_status st = PX_OK;
  for (int k = 0; k < n_seg && st == PX_OK; k++) {
    const size_t lo = flat_off[k], hi = flat_off[k] + count[k];
    for (int j = 0; j < md->n_params && st == PX_OK; j++) {
      const px_param *p = md->params[j];
      const size_t a = lo > p->offset ? lo : p->offset;
      const size_t e = hi < p->offset + p->numel ? hi : p->offset + p->numel;
      if (e <= a) continue;
      const px_tp_box b = px_tp_param_box(p);
      if (!listed(p, &b, replicated, skip)) continue;
      const size_t rows = p->ndim > 1 ? (size_t)p->shape[0] : 1, lcols = p->numel / rows;
      // [x, e) in p's local flat elements, cut into runs that lie in one part.
      for (size_t x = a - p->offset; x < e - p->offset;) {
        size_t end = e - p->offset, in_box = x;
        int q = 0;
        if (b.split_dim >= 0 && b.n_parts > 1) {
          const size_t r = x / lcols, c = x % lcols, w = (size_t)b.size[0];
          q = (int)(c / w);
          if (r * lcols + (size_t)(q + 1) * w < end) end = r * lcols + (size_t)(q + 1) * w;
          in_box = r * w + (c - (size_t)q * w);
        }
        if (*n == *cap) {
          *cap = *cap ? 2 * *cap : 64;
          px_tensor_piece *g = realloc(*all, (size_t)*cap * sizeof *g);
          if (!g) {
            st = px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
            break;
          }
          *all = g;
        }
        px_tensor_piece *c = &(*all)[(*n)++];
        memset(c, 0, sizeof *c);
        if (strlen(prefix) + strlen(p->name) >= sizeof c->key) {
          st = px_error(PX_ERR_INVALID, "checkpoint: name \"%s%s\" is too long", prefix, p->name);
          break;
        }
        memcpy(c->key, prefix, strlen(prefix));
        memcpy(c->key + strlen(prefix), p->name, strlen(p->name) + 1);
        c->ndim = p->ndim;
        for (int d = 0; d < p->ndim && d < 2; d++) c->shape[d] = b.split_dim < 0 ? p->shape[d] : b.global_shape[d];
        for (int d = 2; d < p->ndim; d++) c->shape[d] = p->shape[d];
        if (b.split_dim >= 0) {
          for (int d = 0; d < p->ndim; d++) c->box_size[d] = c->shape[d];
          c->box_offset[b.split_dim] = b.global_offset[q];
          c->box_size[b.split_dim] = b.size[q];
        }
        c->offset = in_box;
        c->count = end - x;
        c->data = base + shard_off[k] + (p->offset + x - lo);
        x = end;
      }
    }
  }
  return st;
}

// Under ZeRO 1-2 over the dp ranks: this rank's shard of one optimizer slot
// (shard-indexed `base`) as pieces of the tp boxes (px_range_box_pieces
// over the shard's segments).  Replicated parameters only when asked (saved
// by tp rank 0's shards only: every tp rank holds them; loaded by all).
static px_status shard_box_pieces(px_trainer *t, const char *prefix, float *base, bool replicated,
                                  px_tensor_piece **all, int *n, int *cap) {
  const int n_seg = px_zero_segments(t->zero, NULL, NULL, NULL, 0);
  size_t *seg = malloc(3 * (size_t)(n_seg > 0 ? n_seg : 1) * sizeof *seg);
  if (!seg) return px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
  size_t *flat_off = seg, *shard_off = seg + n_seg, *count = seg + 2 * n_seg;
  px_zero_segments(t->zero, flat_off, shard_off, count, n_seg);
  px_status st = px_range_box_pieces(t->model, n_seg, flat_off, shard_off, count, prefix, base, replicated, NULL, all,
                                     n, cap);
  free(seg);
  return st;
}

// Every optimizer slot's shard pieces (ZeRO over dp); replicated: with the
// replicated parameters' (saving: tp rank 0 only; loading: every rank).
static px_status shard_slot_pieces(px_trainer *t, bool replicated, px_tensor_piece **out, int *n_out) {
  *out = NULL;
  *n_out = 0;
  int cap = 0;
  px_status st = PX_OK;
  for (int k = 0; k < t->opt->n_state && st == PX_OK; k++) {
    const char *name;
    float *base = px_optim_state_slot(t->opt, k, &name);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "%s.", name);
    st = shard_box_pieces(t, prefix, base, replicated, out, n_out, &cap);
  }
  if (st != PX_OK) {
    free(*out);
    *out = NULL;
    *n_out = 0;
  }
  return st;
}

px_status px_trainer_resume_tp_shards(px_trainer *t) {
  px_tensor_piece *pc = NULL;
  int n = 0;
  px_status st = shard_slot_pieces(t, true, &pc, &n);
  if (st == PX_OK && n > 0) st = px_checkpoint_load_boxes(t->last_checkpoint, "optim", pc, n);
  free(pc);
  st = px_trainer_agree_loaded(t, st, "resume (tensor parallel, ZeRO): ", "shard", t->last_checkpoint);
  if (st != PX_OK) return st;
  t->opt->step = t->resume_optimizer_step;
  return PX_OK;
}

px_status px_trainer_save_tp(px_trainer *t, const char *state_json) {
  px_mesh *mesh = t->o.mesh;
  const bool writes = mesh->dp_rank == 0, replicated = mesh->tp_rank == 0;
  px_box_pieces mp = {0}, op = {0};
  px_state_dict msd = {0}, osd = {0};
  char *mjson = NULL, *ojson = NULL;
  px_status st = PX_OK;
  char prefixes[PX_MAX_OPTIM_SLOTS][64];
  const char *pp[PX_MAX_OPTIM_SLOTS];
  float *bases[PX_MAX_OPTIM_SLOTS];
  const int slots = px_optim_slot_sources(t->opt, prefixes, pp, bases, PX_MAX_OPTIM_SLOTS);
  if (t->opt->n_state > PX_MAX_OPTIM_SLOTS)
    st = px_error(PX_ERR_UNSUPPORTED, "checkpoint (tensor parallel): %d optimizer slots", t->opt->n_state);
  if (st == PX_OK && writes) {
    const char *mprefix = "";
    const float *mbase = t->model->param_data;
    st = px_box_pieces_build(t->model, 1, &mprefix, &mbase, replicated, NULL, &mp);
    if (st == PX_OK) st = px_pieces_state_dict(mp.pc, mp.n, &msd, &mjson);
    if (st == PX_OK && slots > 0 && !t->zero)
      st = px_box_pieces_build(t->model, slots, pp, (const float *const *)bases, replicated, NULL, &op);
  }
  if (st == PX_OK && slots > 0 && t->zero)
    st = shard_slot_pieces(t, replicated, &op.pc, &op.n);  // every rank its shard
  if (st == PX_OK && slots > 0 && (t->zero || writes)) st = px_pieces_state_dict(op.pc, op.n, &osd, &ojson);
  // Every rank learns whether all could build their pieces: none writes a
  // checkpoint with a rank's files missing.
  int32_t bad = st != PX_OK;
  px_status cst = px_comm_allreduce(t->comm, &bad, 1, PX_I32, PX_MAX);
  if (st == PX_OK && cst != PX_OK) st = cst;
  if (st == PX_OK && bad) st = px_error(PX_ERR_INVALID, "checkpoint (tensor parallel): another rank failed");
  if (st == PX_OK) {
    char names[2][96], tp_s[16], rank_s[16], kind[16], step[32];
    snprintf(names[0], sizeof names[0], "model.rank%05d-of-%05d.safetensors", mesh->tp_rank, mesh->tp);
    if (t->zero)  // every rank's shard of its tp rank's boxes
      snprintf(names[1], sizeof names[1], "optim.rank%05d-of-%05d.safetensors", t->rank, t->world);
    else snprintf(names[1], sizeof names[1], "optim.rank%05d-of-%05d.safetensors", mesh->tp_rank, mesh->tp);
    snprintf(tp_s, sizeof tp_s, "%d", mesh->tp);
    snprintf(rank_s, sizeof rank_s, "%d", mesh->tp_rank);
    snprintf(kind, sizeof kind, "%s",
             t->opt->opts.kind == PX_OPTIM_SGD      ? "sgd"
               : t->opt->opts.kind == PX_OPTIM_ADAM ? "adam"
                                                    : "adamw");
    snprintf(step, sizeof step, "%lld", (long long)t->opt->step);
    const px_kv mmeta[4] = {{"format", PX_PIECES_FORMAT},
                            {"version", PX_PIECES_VERSION},
                            {"pieces", mjson},
                            {"tp_size", tp_s}};
    const px_kv ometa[6] = {{"format", PX_PIECES_FORMAT}, {"version", PX_PIECES_VERSION}, {"pieces", ojson},
                            {"optimizer", kind},          {"optimizer_step", step},       {"tp_size", tp_s}};
    (void)rank_s;
    px_ckpt_item items[3];
    int n = 0;
    if (writes) items[n++] = (px_ckpt_item){.name = names[0], .tensors = &msd, .metadata = mmeta, .n_metadata = 4};
    if (slots > 0 && (writes || t->zero))
      items[n++] = (px_ckpt_item){.name = names[1], .tensors = &osd, .metadata = ometa, .n_metadata = 6};
    if (t->rank == 0)
      items[n++] = (px_ckpt_item){.name = "state.json", .bytes = state_json, .n_bytes = strlen(state_json)};
    st = px_checkpoint_write_all(t->comm, t->o.ckpt_dir, t->step, items, n, t->o.keep_last, t->last_checkpoint,
                                 sizeof t->last_checkpoint);
  }
  px_state_dict_free(&msd);
  px_state_dict_free(&osd);
  free(mjson);
  free(ojson);
  px_box_pieces_free(&mp);
  px_box_pieces_free(&op);
  return st;
}

// Every rank its boxes (and the replicated tensors whole) of the parameters
// and the optimizer's slots, from whatever layout wrote the checkpoint: a
// tp checkpoint's pieces, ZeRO's ranges, DDP's whole tensors.
px_status px_trainer_load_tp(px_trainer *t, const char *path) {
  px_box_pieces mp = {0}, op = {0};
  const char *mprefix = "";
  px_status st = px_box_pieces_build(t->model, 1, &mprefix, NULL, true, NULL, &mp);
  if (st == PX_OK) st = px_checkpoint_load_boxes(path, "model", mp.pc, mp.n);
  char prefixes[PX_MAX_OPTIM_SLOTS][64];
  const char *pp[PX_MAX_OPTIM_SLOTS];
  float *bases[PX_MAX_OPTIM_SLOTS];
  // Under ZeRO the optimizer exists only after the wrap, over the shard:
  // px_trainer_resume_tp_shards loads it then.
  const int slots = t->opt ? px_optim_slot_sources(t->opt, prefixes, pp, bases, PX_MAX_OPTIM_SLOTS) : 0;
  if (st == PX_OK && slots > 0) st = px_box_pieces_build(t->model, slots, pp, NULL, true, NULL, &op);
  if (st == PX_OK && slots > 0) st = px_checkpoint_load_boxes(path, "optim", op.pc, op.n);
  if (st == PX_OK) {  // all loaded: into place
    px_box_pieces_move(t->model, NULL, t->model->param_data, mp.pc, true, NULL, false);
    for (int k = 0; k < slots; k++)
      px_box_pieces_move(t->model, NULL, bases[k], op.pc + (size_t)k * op.per_src, true, NULL, false);
  }
  px_box_pieces_free(&mp);
  px_box_pieces_free(&op);
  return px_trainer_agree_loaded(t, st, "resume (tensor parallel): ", "boxes", path);
}
