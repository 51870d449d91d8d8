// The zoo's GPT-2 (apps/plexus/zoo_gpt.c) in tensor-parallel form over a tp
// group of P ranks (Megatron-LM's GPT).  Same module tree, so the same
// names, the same pre-order uids (hence the same initialisation streams and
// dropout masks) and parameters that are boxes of the single-process ones.
// H heads, C = n_embd, d = C/H, P | H; rank r holds heads [r·H/P, (r+1)·H/P).
//
//   ids (N, T) i32
//   wte      VocabParallelEmbedding(V, C)   wte.weight (n_r, C) rows [f_r, f_r+n_r)   all-reduce fwd
//   wpe      PosEmbedding(context, C)       replicated
//   drop     Dropout(p)                     replicated: the same mask on every rank
//   h.<l>    x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
//     ln_1   LayerNorm                      replicated
//     attn   c_attn  ColumnParallel Conv1D C -> 3C, parts q, k, v:
//                    weight (C, 3C/P) = [q_r | k_r | v_r]        all-reduce bwd
//            heads   H/P heads of width d on (N, T, C/P); attention dropout
//                    masks of the GLOBAL head index (attention.c)
//            c_proj  RowParallel Conv1D C -> C: weight (C/P, C), bias (C,) replicated
//                                                                all-reduce fwd
//            resid_dropout                  replicated
//     ln_2   LayerNorm                      replicated
//     mlp    c_fc ColumnParallel Conv1D C -> 4C: weight (C, 4C/P)   all-reduce bwd
//            GELU on (N, T, 4C/P)
//            c_proj RowParallel Conv1D 4C -> C: weight (4C/P, C)    all-reduce fwd
//            dropout                        replicated
//   ln_f     LayerNorm                      replicated
//   lm_head  VocabParallelTiedHead(wte)     logits (N, T, n_r)      all-reduce bwd
//
// Sequence parallel (cfg->sequence_parallel): between the tp regions the
// residual stream is (N, T/P, C), positions [r·T/P, (r+1)·T/P):
//   wte      reduce-scatter fwd (all-gather of dy bwd) instead of all-reduce
//   wpe      PosEmbedding part r of P; gradient summed over tp
//   drop, resid_dropout, mlp.dropout   Dropout part r of P (the global
//            element index keys the mask)
//   ln_1, ln_2, ln_f   on T/P positions; gradients summed over tp
//   c_attn, mlp.c_fc   all-gather the input (N, T/P, C) -> (N, T, C) fwd,
//                      reduce-scatter dx bwd
//   c_proj (both)      reduce-scatter the partial output to (N, T/P, C),
//                      bias on every rank; all-gather dy bwd
//   lm_head  all-gathers its input; reduce-scatters dx
// Per step: forward 2L + 1 all-gathers and 2L + 1 reduce-scatters of
// N·T·C floats in all, backward the same, plus 2L + 2 all-reduces of the
// layer norms' and wpe's gradients.
//
// Per step: forward 2L + 1 all-reduces of (N·T·C) floats (+ the 3 of
// px_tp_cross_entropy, of N·T numbers), backward 2L + 1.  Every replicated
// module sees the same input on every rank (the all-reduces make it so) and
// produces the same gradient, so replicated parameters stay equal without
// any further communication.
#include "nn/internal.h"
#include "parallel/tp_internal.h"

#include <math.h>

static px_module *named_chain(int n, const char **names, px_module **kids) {
  px_module *c = px_chain();
  bool ok = c != NULL;
  for (int i = 0; i < n; i++) ok = ok && kids[i] && px_chain_add_named(c, names[i], kids[i]) == PX_OK;
  if (ok) return c;
  for (int i = 0; i < n; i++)
    if (kids[i] && !kids[i]->parent) px_module_free(kids[i]);
  px_module_free(c);
  return NULL;
}

static void set_normal(px_module *m, float std) {
  m->params[0].init = PX_INIT_NORMAL;
  m->params[0].init_a = std;
}

// Sequence parallel: the boundary layers gather / scatter the sequence
// themselves (px_tp_set_sequence_split: no module is inserted, so streams
// stay the single process's), dropout between the regions masks this
// rank's positions as the whole sequence's, and the replicated layer norms
// sum their gradients over tp.
static px_module *split(px_module *m, bool sp) {
  if (m && sp) px_tp_set_sequence_split(m, true);
  return m;
}

static px_module *seq_dropout(px_tp_group *g, float p, bool sp) {
  return sp ? px_dropout_part(p, g->rank, g->size) : px_dropout(p);
}

static px_module *seq_layernorm(px_tp_group *g, int C, bool sp) {
  px_module *ln = px_layernorm(C, 1e-5f);
  return sp ? px_tp_sequence_replicated(g, ln) : ln;
}

static px_module *tp_block(px_tp_group *g, const px_tp_gpt_config *cfg) {
  const int C = cfg->n_embd, H = cfg->n_head, P = g->size, Hr = H / P;
  const float p = cfg->dropout;
  const bool sp = cfg->sequence_parallel;
  const float proj_std = 0.02f / sqrtf(2.0f * (float)cfg->n_layer);
  px_module *c_proj = split(px_tp_row_parallel(g, PX_TP_CONV1D, C, C, true), sp);
  if (c_proj) set_normal(c_proj, proj_std);
  px_module *attn = px_attention_with(C, C / P, Hr, g->rank * Hr, H, p,
                                      split(px_tp_column_parallel(g, PX_TP_CONV1D, C, 3 * C, true, 3, false), sp),
                                      c_proj, seq_dropout(g, p, sp));
  const char *mlp_names[4] = {"c_fc", "act", "c_proj", "dropout"};
  px_module *mlp_kids[4] = {split(px_tp_column_parallel(g, PX_TP_CONV1D, C, 4 * C, true, 1, false), sp), px_gelu(true),
                            split(px_tp_row_parallel(g, PX_TP_CONV1D, 4 * C, C, true), sp), seq_dropout(g, p, sp)};
  if (mlp_kids[2]) set_normal(mlp_kids[2], proj_std);
  px_module *mlp = named_chain(4, mlp_names, mlp_kids);
  const char *a_names[2] = {"ln_1", "attn"}, *m_names[2] = {"ln_2", "mlp"};
  px_module *a_kids[2] = {seq_layernorm(g, C, sp), attn}, *m_kids[2] = {seq_layernorm(g, C, sp), mlp};
  px_module *a_in = named_chain(2, a_names, a_kids);
  px_module *m_in = named_chain(2, m_names, m_kids);
  const char *b_names[2] = {"", ""};
  px_module *b_kids[2] = {px_residual(a_in), px_residual(m_in)};
  return named_chain(2, b_names, b_kids);
}

px_module *px_tp_gpt(px_tp_group *g, const px_tp_gpt_config *cfg) {
  if (!g || !cfg) {
    px_error(PX_ERR_INVALID, "tensor-parallel GPT: needs a tp group and a configuration");
    return NULL;
  }
  const int P = g->size;
  if (cfg->vocab_size <= 0 || cfg->context <= 0 || cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->n_embd <= 0 ||
      cfg->n_embd % cfg->n_head != 0 || !(cfg->dropout >= 0.0f && cfg->dropout < 1.0f)) {
    px_error(PX_ERR_INVALID,
             "tensor-parallel GPT: vocab_size %d, context %d, n_layer %d, n_head %d, n_embd %d, "
             "dropout %g: sizes must be positive, n_embd a multiple of n_head, dropout in [0, 1)",
             cfg->vocab_size, cfg->context, cfg->n_layer, cfg->n_head, cfg->n_embd, (double)cfg->dropout);
    return NULL;
  }
  if (cfg->n_head % P != 0) {
    px_error(PX_ERR_INVALID,
             "tensor-parallel GPT: tp %d does not divide n_head %d; each tp rank holds whole heads "
             "(choose tp among the divisors of %d)",
             P, cfg->n_head, cfg->n_head);
    return NULL;
  }
  if (cfg->vocab_size < P) {
    px_error(PX_ERR_INVALID, "tensor-parallel GPT: vocabulary of %d tokens over tp %d: each rank needs a row",
             cfg->vocab_size, P);
    return NULL;
  }
  const int C = cfg->n_embd;
  px_module *h = px_chain();
  if (!h) return NULL;
  for (int l = 0; l < cfg->n_layer; l++) {
    px_module *block = tp_block(g, cfg);
    if (!block || px_chain_add(h, block) != PX_OK) {
      if (block && !block->parent) px_module_free(block);
      px_module_free(h);
      return NULL;
    }
  }
  const bool sp = cfg->sequence_parallel;
  px_module *wte = split(px_tp_vocab_embedding(g, cfg->vocab_size, C), sp);
  if (wte) set_normal(wte, 0.02f);
  px_module *wpe = sp ? px_tp_sequence_replicated(g, px_pos_embedding_part(cfg->context, C, g->rank, P))
                      : px_pos_embedding(cfg->context, C);
  if (wpe) set_normal(wpe, 0.02f);
  const char *names[6] = {"wte", "wpe", "drop", "h", "ln_f", "lm_head"};
  px_module *kids[6] = {wte,
                        wpe,
                        seq_dropout(g, cfg->dropout, sp),
                        h,
                        seq_layernorm(g, C, sp),
                        wte ? split(px_tp_vocab_tied_head(g, wte), sp) : NULL};
  return named_chain(6, names, kids);
}
