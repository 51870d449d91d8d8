// Checkpoints of a pipeline-parallel run (pipeline.h): each pipeline rank
// holds the models of its chunks (stages rank, rank + p, ...), whose
// parameters carry the whole model's names, so each rank writes them as
// pieces of the layout-independent format (io.h, version 2) into one shared
// checkpoint, and a resume at any layout (another P, another split, no
// pipeline at all) loads the boxes it needs by intersection.
//
//   model.rank<r>-of-<N>.safetensors   rank r's chunks' parameters (and
//                                      buffers), whole tensors (or, in a
//                                      tensor-parallel chunk, the boxes
//                                      px_tp_param_box gives) as pieces
//   optim.rank<r>-of-<N>.safetensors   the chunks' optimizer slots, keyed
//                                      "exp_avg.h.0.attn.c_attn.weight"
//   state.json                         the caller's (rank 0's)
//   metadata.json, SHA256SUMS          px_checkpoint_write_all's
//
// r and N are the rank in and size of the job's communicator: distinct file
// names whatever the mesh.  Replicated copies are written once: the tied
// head's copy of the embedding weight (pipeline.h: px_pp_plan.tied_param,
// on the head's stage) is left out, its owner (the embedding's stage)
// writes it; under data parallel only the writing pipeline (dp rank 0's)
// passes files, and in a tensor-parallel stage only tp rank 0 writes the
// parameters every tp rank holds whole (`replicated`).  Under ZeRO over dp
// (px_pp_chunk_zero_slice) every dp rank writes its slice of each chunk's
// optimizer state as flat ranges of the boxes (px_range_box_pieces, as
// ZeRO's checkpoints do): nothing is gathered, and `writes` governs the
// parameters alone.  Loading fills the tied copy from the embedding's
// pieces, parameters and optimizer slots alike (the two copies are equal:
// their gradients are summed before every step); under ZeRO each dp rank
// loads its slice's ranges, from whatever layout wrote them.
#include "train/internal.h"

#include "plexus/pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The parameter chunk c leaves out of a checkpoint: the head's copy of a tied
// weight that lives on another stage (NULL: none).
static const char *tied_copy(px_pp *pp, int c) {
  const px_pp_plan *plan = px_pp_plan_of(pp);
  if (plan->tied_head_unit < 0) return NULL;
  const int head = px_pp_plan_stage_of(plan, plan->tied_head_unit);
  const int emb = px_pp_plan_stage_of(plan, plan->tied_emb_unit);
  return head != emb && px_pp_chunk_stage(pp, c) == head ? plan->tied_param : NULL;
}

// The model's buffers (batch-norm statistics), whole, as pieces pointing at them.
static int buffer_pieces(px_model *md, px_tensor_piece *out) {
  for (int b = 0; b < md->n_buffers; b++) {
    const px_param *p = md->buffers[b];
    px_tensor_piece *q = &out[b];
    memset(q, 0, sizeof *q);
    snprintf(q->key, sizeof q->key, "%s", p->name);
    q->ndim = p->ndim;
    memcpy(q->shape, p->shape, sizeof q->shape);
    q->count = p->numel;
    q->data = p->data;
  }
  return md->n_buffers;
}

static const char *optim_kind(const px_optim *o) {
  return o->opts.kind == PX_OPTIM_SGD ? "sgd" : o->opts.kind == PX_OPTIM_ADAM ? "adam" : "adamw";
}

// This rank's pieces of every chunk: the parameters and buffers (model) and
// the optimizer's slots (optim), in two lists.  Each chunk's data blocks are
// kept in blocks[] until the write is done.
typedef struct rank_pieces {
  px_box_pieces *blocks;  // [2 · chunks]
  int n_blocks;
  px_tensor_piece *model, *optim;
  int n_model, n_optim;
} rank_pieces;

static void rank_pieces_free(rank_pieces *r) {
  for (int k = 0; k < r->n_blocks; k++) px_box_pieces_free(&r->blocks[k]);
  free(r->blocks);
  free(r->model);
  free(r->optim);
  memset(r, 0, sizeof *r);
}

static px_status append(px_tensor_piece **list, int *n, const px_tensor_piece *add, int k) {
  px_tensor_piece *g = realloc(*list, (size_t)(*n + k > 0 ? *n + k : 1) * sizeof *g);
  if (!g) return px_error(PX_ERR_NOMEM, "checkpoint (pipeline): out of memory");
  *list = g;
  if (k > 0) memcpy(g + *n, add, (size_t)k * sizeof *g);
  *n += k;
  return PX_OK;
}

// Under ZeRO over dp: chunk c's optimizer slots, this dp rank's slice of
// each, as flat ranges of the boxes, pointing into the optimizer's state
// (px_range_box_pieces; nothing copied).  Appended to *all.
static px_status slice_pieces(px_pp *pp, int c, bool replicated, const char *skip, px_tensor_piece **all, int *n,
                              int *cap) {
  px_optim *o = px_pp_chunk_optim(pp, c);
  size_t off = 0, len = 0;
  if (!o || !px_pp_chunk_zero_slice(pp, c, &off, &len) || len == 0) return PX_OK;
  if (o->n_state > PX_MAX_OPTIM_SLOTS)
    return px_error(PX_ERR_UNSUPPORTED, "checkpoint (pipeline): %d optimizer slots", o->n_state);
  char prefixes[PX_MAX_OPTIM_SLOTS][64];
  const char *pfx[PX_MAX_OPTIM_SLOTS];
  float *bases[PX_MAX_OPTIM_SLOTS];
  const int slots = px_optim_slot_sources(o, prefixes, pfx, bases, PX_MAX_OPTIM_SLOTS);
  const size_t zero = 0;
  px_status st = PX_OK;
  for (int k = 0; k < slots && st == PX_OK; k++)
    st = px_range_box_pieces(px_pp_chunk_model(pp, c), 1, &off, &zero, &len, pfx[k], bases[k], replicated, skip, all, n,
                             cap);
  return st;
}

static px_status collect(px_pp *pp, bool writes, bool replicated, rank_pieces *r) {
  memset(r, 0, sizeof *r);
  const int v = px_pp_n_chunks(pp);
  r->blocks = calloc(2 * (size_t)v, sizeof *r->blocks);
  if (!r->blocks) return px_error(PX_ERR_NOMEM, "checkpoint (pipeline): out of memory");
  px_status st = PX_OK;
  int cap_optim = 0;
  for (int c = 0; c < v && st == PX_OK; c++) {
    px_model *md = px_pp_chunk_model(pp, c);
    px_optim *o = px_pp_chunk_optim(pp, c);
    const char *skip = tied_copy(pp, c);
    size_t z_off, z_len;
    if (px_pp_chunk_zero_slice(pp, c, &z_off, &z_len)) {  // every dp rank its slice of the optimizer state
      st = slice_pieces(pp, c, replicated, skip, &r->optim, &r->n_optim, &cap_optim);
      o = NULL;
    }
    if (!writes) continue;
    const char *mprefix = "";
    const float *mbase = md->param_data;
    px_box_pieces *mp = &r->blocks[r->n_blocks++];
    st = px_box_pieces_build(md, 1, &mprefix, &mbase, replicated, skip, mp);
    if (st == PX_OK) st = append(&r->model, &r->n_model, mp->pc, mp->n);
    if (st == PX_OK && replicated && md->n_buffers > 0) {
      px_tensor_piece *bp = calloc((size_t)md->n_buffers, sizeof *bp);
      if (!bp) st = px_error(PX_ERR_NOMEM, "checkpoint (pipeline): out of memory");
      if (st == PX_OK) st = append(&r->model, &r->n_model, bp, buffer_pieces(md, bp));
      free(bp);
    }
    if (st != PX_OK || !o || o->n_state == 0) continue;
    if (o->n_state > PX_MAX_OPTIM_SLOTS) {
      st = px_error(PX_ERR_UNSUPPORTED, "checkpoint (pipeline): %d optimizer slots", o->n_state);
      break;
    }
    char prefixes[PX_MAX_OPTIM_SLOTS][64];
    const char *pfx[PX_MAX_OPTIM_SLOTS];
    float *bases[PX_MAX_OPTIM_SLOTS];
    const int slots = px_optim_slot_sources(o, prefixes, pfx, bases, PX_MAX_OPTIM_SLOTS);
    px_box_pieces *op = &r->blocks[r->n_blocks++];
    st = px_box_pieces_build(md, slots, pfx, (const float *const *)bases, replicated, skip, op);
    if (st == PX_OK) st = append(&r->optim, &r->n_optim, op->pc, op->n);
    cap_optim = r->n_optim;
  }
  if (st != PX_OK) rank_pieces_free(r);
  return st;
}

px_status px_pp_checkpoint_save(px_comm *comm, px_pp *pp, bool writes, bool replicated, const char *dir, int64_t step,
                                int keep_last, const char *state_json, char *path_out, size_t cap) {
  const int rank = px_comm_rank(comm), world = px_comm_size(comm);
  rank_pieces rp = {0};
  px_state_dict msd = {0}, osd = {0};
  char *mjson = NULL, *ojson = NULL;
  px_status st = collect(pp, writes, replicated, &rp);
  if (st == PX_OK && writes) st = px_pieces_state_dict(rp.model, rp.n_model, &msd, &mjson);
  if (st == PX_OK && rp.n_optim > 0) st = px_pieces_state_dict(rp.optim, rp.n_optim, &osd, &ojson);
  if (st == PX_OK && rank == 0 && !state_json)
    st = px_error(PX_ERR_INVALID, "checkpoint (pipeline): rank 0 was given no state.json");
  // Every rank learns whether all could build their pieces: none writes a
  // checkpoint with a rank's files missing, none waits for one that failed.
  int32_t bad = st != PX_OK;
  char why[1024] = "";
  if (bad) snprintf(why, sizeof why, "rank %d: %s", rank, px_last_error());
  px_status cst = px_comm_allreduce(comm, &bad, 1, PX_I32, PX_MAX);
  if (cst == PX_OK && bad)
    cst = st != PX_OK ? px_error(st, "checkpoint (pipeline): %s", why)
                      : px_error(PX_ERR_INVALID, "checkpoint (pipeline): another rank could not prepare its pieces");
  if (cst == PX_OK) {
    char names[2][96], world_s[16], rank_s[16], stage_s[64], opt_step[32], kind[16] = "";
    snprintf(names[0], sizeof names[0], "model.rank%05d-of-%05d.safetensors", rank, world);
    snprintf(names[1], sizeof names[1], "optim.rank%05d-of-%05d.safetensors", rank, world);
    snprintf(world_s, sizeof world_s, "%d", world);
    snprintf(rank_s, sizeof rank_s, "%d", rank);
    for (int c = 0, at = 0; c < px_pp_n_chunks(pp) && at < (int)sizeof stage_s; c++)  // "0, 2": its stages
      at += snprintf(stage_s + at, sizeof stage_s - (size_t)at, "%s%d", c ? ", " : "", px_pp_chunk_stage(pp, c));
    const px_optim *o = px_pp_chunk_optim(pp, 0);
    snprintf(opt_step, sizeof opt_step, "%lld", o ? (long long)o->step : 0LL);
    if (o) snprintf(kind, sizeof kind, "%s", optim_kind(o));
    const px_kv mmeta[6] = {{"format", PX_PIECES_FORMAT},
                            {"version", PX_PIECES_VERSION},
                            {"pieces", mjson},
                            {"world_size", world_s},
                            {"rank", rank_s},
                            {"pipeline_stages", stage_s}};
    const px_kv ometa[8] =
      {{"format", PX_PIECES_FORMAT}, {"version", PX_PIECES_VERSION}, {"pieces", ojson}, {"optimizer", kind},
       {"optimizer_step", opt_step}, {"world_size", world_s},        {"rank", rank_s},  {"pipeline_stages", stage_s}};
    px_ckpt_item items[3];
    int n = 0;
    if (writes) items[n++] = (px_ckpt_item){.name = names[0], .tensors = &msd, .metadata = mmeta, .n_metadata = 6};
    if (rp.n_optim > 0)  // (under ZeRO over dp every dp rank's slices)
      items[n++] = (px_ckpt_item){.name = names[1], .tensors = &osd, .metadata = ometa, .n_metadata = 8};
    if (rank == 0)
      items[n++] = (px_ckpt_item){.name = "state.json", .bytes = state_json, .n_bytes = strlen(state_json)};
    cst = px_checkpoint_write_all(comm, dir, step, items, n, keep_last, path_out, cap);
  }
  px_state_dict_free(&msd);
  px_state_dict_free(&osd);
  free(mjson);
  free(ojson);
  rank_pieces_free(&rp);
  return cst;
}

// Chunk c's parameters, buffers and optimizer slots from the checkpoint at
// path, all or nothing (into temporary pieces, then into place).
static px_status load_chunk(px_pp *pp, int c, const char *path, int64_t optimizer_step) {
  px_model *md = px_pp_chunk_model(pp, c);
  px_optim *o = px_pp_chunk_optim(pp, c);
  px_box_pieces mp = {0}, op = {0};
  const char *mprefix = "";
  // The tied copy is wanted like any parameter: its key is the embedding's.
  px_status st = px_box_pieces_build(md, 1, &mprefix, NULL, true, NULL, &mp);
  if (st == PX_OK && md->n_buffers > 0) {
    px_tensor_piece *all = realloc(mp.pc, (size_t)(mp.n + md->n_buffers) * sizeof *all);
    if (!all) st = px_error(PX_ERR_NOMEM, "resume (pipeline): out of memory");
    else mp.pc = all;
  }
  // Buffers point at the model's own (a failed load leaves the run failing).
  const int n_buf = st == PX_OK ? buffer_pieces(md, mp.pc + mp.n) : 0;
  if (st == PX_OK) st = px_checkpoint_load_boxes(path, "model", mp.pc, mp.n + n_buf);
  char prefixes[PX_MAX_OPTIM_SLOTS][64];
  const char *pfx[PX_MAX_OPTIM_SLOTS];
  float *bases[PX_MAX_OPTIM_SLOTS];
  int slots = 0;
  if (st == PX_OK && o && optimizer_step >= 0 && o->n_state > PX_MAX_OPTIM_SLOTS)
    st = px_error(PX_ERR_UNSUPPORTED, "resume (pipeline): %d optimizer slots", o->n_state);
  if (optimizer_step < 0) o = NULL;  // weights only (--init)
  size_t z_off = 0, z_len = 0;
  const bool zero = px_pp_chunk_zero_slice(pp, c, &z_off, &z_len);
  if (st == PX_OK && o) slots = px_optim_slot_sources(o, prefixes, pfx, bases, PX_MAX_OPTIM_SLOTS);
  if (zero && st == PX_OK && slots > 0) {  // this dp rank's slice, straight into the optimizer's state
    px_tensor_piece *sp = NULL;
    int n_sp = 0, cap = 0;
    const size_t at0 = 0;
    for (int k = 0; k < slots && st == PX_OK; k++)
      st = px_range_box_pieces(md, 1, &z_off, &at0, &z_len, pfx[k], bases[k], true, NULL, &sp, &n_sp, &cap);
    if (st == PX_OK && n_sp > 0) st = px_checkpoint_load_boxes(path, "optim", sp, n_sp);
    free(sp);
    slots = 0;  // (in place already)
  }
  if (st == PX_OK && slots > 0) st = px_box_pieces_build(md, slots, pfx, NULL, true, NULL, &op);
  if (st == PX_OK && slots > 0) st = px_checkpoint_load_boxes(path, "optim", op.pc, op.n);
  if (st == PX_OK) {
    px_box_pieces_move(md, NULL, md->param_data, mp.pc, true, NULL, false);
    for (int k = 0; k < slots; k++)
      px_box_pieces_move(md, NULL, bases[k], op.pc + (size_t)k * op.per_src, true, NULL, false);
    if (o) o->step = optimizer_step;
  }
  px_box_pieces_free(&mp);
  px_box_pieces_free(&op);
  if (st != PX_OK) {
    char why[1024];
    snprintf(why, sizeof why, "%s", px_last_error());
    return px_error(st, "stage %d: %s", px_pp_chunk_stage(pp, c), why);
  }
  return PX_OK;
}

px_status px_pp_checkpoint_load(px_comm *comm, px_pp *pp, const char *path, int64_t optimizer_step) {
  px_status st = PX_OK;
  for (int c = 0; c < px_pp_n_chunks(pp) && st == PX_OK; c++) st = load_chunk(pp, c, path, optimizer_step);
  // Every rank learns whether all loaded: none trains on alone.
  int32_t bad = st != PX_OK;
  char why[1024] = "";
  if (bad) snprintf(why, sizeof why, "rank %d: %s", px_comm_rank(comm), px_last_error());
  px_status cst = px_comm_allreduce(comm, &bad, 1, PX_I32, PX_MAX);
  if (cst != PX_OK) return cst;
  if (st != PX_OK) return px_error(st, "resume (pipeline): %s", why);
  if (bad) return px_error(PX_ERR_INVALID, "resume (pipeline): another rank could not load its stages from %s", path);
  return PX_OK;
}
