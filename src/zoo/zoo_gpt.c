// The zoo's GPT: GPT-2's architecture with Hugging Face's parameter names
// and layouts, so GPT-2 checkpoints load and plexus checkpoints load back
// into transformers.GPT2Model / GPT2LMHeadModel.
//
//   ids (N, T) i32
//   wte            Embedding(V, C)                 wte.weight (V, C)
//   wpe            PosEmbedding(context, C)        wpe.weight (context, C)
//   drop           Dropout(p)
//   h.<l>, l < L   x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))      (pre-LN)
//     ln_1         LayerNorm(C, 1e-5)              h.l.ln_1.{weight, bias}
//     attn         CausalSelfAttention(C, H, p, p) h.l.attn.c_attn.{weight (C, 3C), bias}
//                                                  h.l.attn.c_proj.{weight (C, C), bias}
//     ln_2         LayerNorm(C, 1e-5)              h.l.ln_2.{weight, bias}
//     mlp          c_fc Conv1D(C, 4C) – GELU(tanh) – c_proj Conv1D(4C, C) – Dropout(p)
//                                                  h.l.mlp.c_fc.{weight (C, 4C), bias}
//                                                  h.l.mlp.c_proj.{weight (4C, C), bias}
//   ln_f           LayerNorm(C, 1e-5)              ln_f.{weight, bias}
//   lm_head        TiedHead(wte)                   (no parameter: wte.weight)
//   logits (N, T, V)
//
// The residual wrappers and the blocks' inner chains are added with empty
// names, which px_model_create leaves out of parameter paths.
//
// Initialisation (GPT-2 / nanoGPT): every weight N(0, 0.02), the two
// residual projections (attn.c_proj, mlp.c_proj) N(0, 0.02/√(2L)), biases
// 0, LayerNorm weight 1 and bias 0.
#include <plexus/zoo.h>
#include <plexus/io.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Frees the not-yet-adopted modules of `kids` and returns NULL.
static px_module *drop_all(px_module **kids, int n, px_module *parent) {
  for (int i = 0; i < n; i++)
    if (kids[i] && !kids[i]->parent) px_module_free(kids[i]);
  px_module_free(parent);
  return NULL;
}

// A chain of named children; NULL (all freed) if any is NULL.
static px_module *named_chain(int n, const char **names, px_module **kids) {
  px_module *c = px_chain();
  bool ok = c != NULL;
  for (int i = 0; i < n; i++) ok = ok && kids[i] && px_chain_add_named(c, names[i], kids[i]) == PX_OK;
  return ok ? c : drop_all(kids, n, c);
}

static void set_normal(px_module *m, float std) {
  m->params[0].init = PX_INIT_NORMAL;
  m->params[0].init_a = std;
}

static px_module *gpt_block(const px_gpt_config *cfg) {
  const int C = cfg->n_embd;
  const float p = cfg->dropout;
  const float proj_std = 0.02f / sqrtf(2.0f * (float)cfg->n_layer);
  px_module *attn = px_causal_self_attention(C, cfg->n_head, p, p);
  if (attn) set_normal(attn->children[1], proj_std);  // attn.c_proj
  const char *mlp_names[4] = {"c_fc", "act", "c_proj", "dropout"};
  px_module *mlp_kids[4] = {px_conv1d(C, 4 * C, true), px_gelu(true), px_conv1d(4 * C, C, true), px_dropout(p)};
  if (mlp_kids[2]) set_normal(mlp_kids[2], proj_std);  // mlp.c_proj
  px_module *mlp = named_chain(4, mlp_names, mlp_kids);

  const char *a_names[2] = {"ln_1", "attn"}, *m_names[2] = {"ln_2", "mlp"};
  px_module *a_kids[2] = {px_layernorm(C, 1e-5f), attn}, *m_kids[2] = {px_layernorm(C, 1e-5f), mlp};
  px_module *a_in = named_chain(2, a_names, a_kids);
  px_module *m_in = named_chain(2, m_names, m_kids);
  const char *b_names[2] = {"", ""};
  px_module *b_kids[2] = {px_residual(a_in), px_residual(m_in)};
  return named_chain(2, b_names, b_kids);
}

px_module *px_zoo_gpt(const px_gpt_config *cfg) {
  if (!cfg) {
    px_error(PX_ERR_INVALID, "gpt: no configuration");
    return NULL;
  }
  if (cfg->vocab_size <= 0 || cfg->context <= 0 || cfg->n_layer <= 0 || cfg->n_head <= 0 || cfg->n_embd <= 0 ||
      cfg->n_embd % cfg->n_head != 0 || !(cfg->dropout >= 0.0f && cfg->dropout < 1.0f)) {
    px_error(PX_ERR_INVALID,
             "gpt: vocab_size %d, context %d, n_layer %d, n_head %d, n_embd %d, dropout %g: "
             "sizes must be positive, n_embd a multiple of n_head, dropout in [0, 1)",
             cfg->vocab_size, cfg->context, cfg->n_layer, cfg->n_head, cfg->n_embd, (double)cfg->dropout);
    return NULL;
  }
  const int C = cfg->n_embd;
  px_module *h = px_chain();
  if (!h) return NULL;
  for (int l = 0; l < cfg->n_layer; l++) {
    px_module *block = gpt_block(cfg);
    if (!block || px_chain_add(h, block) != PX_OK) {
      if (block && !block->parent) px_module_free(block);
      px_module_free(h);
      return NULL;
    }
  }
  px_module *wte = px_embedding(cfg->vocab_size, C);
  if (wte) set_normal(wte, 0.02f);
  px_module *wpe = px_pos_embedding(cfg->context, C);
  if (wpe) set_normal(wpe, 0.02f);
  const char *names[6] = {"wte", "wpe", "drop", "h", "ln_f", "lm_head"};
  px_module *kids[6] = {wte, wpe, px_dropout(cfg->dropout), h, px_layernorm(C, 1e-5f), wte ? px_tied_head(wte) : NULL};
  return named_chain(6, names, kids);
}

/* ---- Loading Hugging Face GPT-2 weights ------------------------------------ */

// Keys of a GPT-2 file that plexus does not hold: the causal-mask buffers
// (h.<l>.attn.bias, h.<l>.attn.masked_bias) and the tied lm_head.weight.
static bool hf_ignored(const char *key) {
  size_t n = strlen(key);
  static const char *const tails[2] = {".attn.bias", ".attn.masked_bias"};
  for (int i = 0; i < 2; i++) {
    size_t t = strlen(tails[i]);
    if (n > t && strcmp(key + n - t, tails[i]) == 0 && strncmp(key, "h.", 2) == 0) return true;
  }
  return strcmp(key, "lm_head.weight") == 0;
}

static const char *strip_prefix(const char *key) {
  static const char prefix[] = "transformer.";
  return strncmp(key, prefix, sizeof prefix - 1) == 0 ? key + sizeof prefix - 1 : key;
}

px_status px_zoo_gpt_load_hf(px_model *model, const char *path) {
  if (!model || !path) return px_error(PX_ERR_INVALID, "gpt: load_hf needs a model and a path");
  px_safetensors *f;
  px_status st = px_safetensors_open(path, &f);
  if (st != PX_OK) return st;
  const int n_file = px_safetensors_count(f);
  // Which file tensor fills each parameter; all checked before anything is copied.
  const px_named_tensor **src = calloc((size_t)model->n_params + 1, sizeof *src);
  if (!src) {
    px_safetensors_close(f);
    return px_error(PX_ERR_NOMEM, "gpt: out of memory");
  }
  for (int i = 0; i < n_file && st == PX_OK; i++) {
    const px_named_tensor *t = px_safetensors_get(f, i);
    const char *key = strip_prefix(t->name);
    if (hf_ignored(key)) continue;
    px_param *p = px_model_find(model, key);
    if (!p || p->is_buffer) {
      st = px_error(PX_ERR_INVALID,
                    "gpt: tensor \"%s\" in %s is not a parameter of this GPT (is it a GPT-2 "
                    "file of another size or architecture?)",
                    t->name, path);
      break;
    }
    int k = 0;
    while (k < model->n_params && model->params[k] != p) k++;
    if (src[k]) {
      st = px_error(PX_ERR_FORMAT, "gpt: %s holds \"%s\" twice (as \"%s\" and \"%s\")", path, p->name, src[k]->name,
                    t->name);
      break;
    }
    char a[PX_SHAPE_STR_MAX], b[PX_SHAPE_STR_MAX];
    if (t->tensor.dtype != PX_F32) {
      st = px_error(PX_ERR_UNSUPPORTED, "gpt: tensor \"%s\" in %s is %s; plexus loads F32 GPT-2 weights", t->name, path,
                    px_dtype_name(t->tensor.dtype));
    } else if (t->tensor.ndim != p->ndim || memcmp(t->tensor.shape, p->shape, (size_t)p->ndim * sizeof(int64_t))) {
      bool transposed = p->ndim == 2 && t->tensor.ndim == 2 && t->tensor.shape[0] == p->shape[1] &&
        t->tensor.shape[1] == p->shape[0];
      st = px_error(PX_ERR_SHAPE, "gpt: tensor \"%s\" has shape %s in %s but the model expects %s for \"%s\"; %s",
                    t->name, px_shape_str(t->tensor.ndim, t->tensor.shape, a, sizeof a), path,
                    px_shape_str(p->ndim, p->shape, b, sizeof b), p->name,
                    transposed
                      ? "it is stored transposed (nn.Linear's (out, in)?); GPT-2's Conv1D weights are (in, out)"
                      : "was it saved from a GPT of another size?");
    }
    src[k] = t;
  }
  for (int k = 0; k < model->n_params && st == PX_OK; k++)
    if (!src[k])
      st = px_error(PX_ERR_NOT_FOUND, "gpt: %s has no tensor \"%s\" (nor \"transformer.%s\")", path,
                    model->params[k]->name, model->params[k]->name);
  if (st == PX_OK)
    for (int k = 0; k < model->n_params; k++)
      memcpy(model->params[k]->data, src[k]->tensor.data, model->params[k]->numel * sizeof(float));
  free(src);
  px_safetensors_close(f);
  return st;
}

/* ---- Activation checkpointing ---------------------------------------------- */

static px_module *child_named(px_module *m, const char *name) {
  for (int i = 0; m && i < m->n_children; i++)
    if (strcmp(m->children[i]->name, name) == 0) return m->children[i];
  return NULL;
}

// In mlp = [c_fc, act, c_proj, dropout], act and c_proj become one pair (named
// "", so "h.l.mlp.c_proj.weight" stays): GELU's (N, T, 4C) output is
// recomputed from c_fc's, which c_proj's GEMM does not need redone.
static px_status gelu_pair(px_module *mlp, int layer) {
  int a = -1;
  for (int i = 0; i + 1 < mlp->n_children; i++)
    if (strcmp(mlp->children[i]->name, "act") == 0 && strcmp(mlp->children[i + 1]->name, "c_proj") == 0) a = i;
  if (a < 0) return px_error(PX_ERR_INVALID, "gpt recompute: block %d's mlp has no act followed by c_proj", layer);
  px_module *act = mlp->children[a], *proj = mlp->children[a + 1];
  act->parent = proj->parent = NULL;
  px_module *pair = px_checkpoint_pair("act", act, "c_proj", proj);
  // The pair took both slots' modules (or freed them): close the gap.
  for (int i = a + 1; i + 1 < mlp->n_children; i++) mlp->children[i] = mlp->children[i + 1];
  mlp->n_children--;
  if (!pair) {
    for (int i = a; i + 1 < mlp->n_children; i++) mlp->children[i] = mlp->children[i + 1];
    mlp->n_children--;
    return PX_ERR_INVALID;
  }
  pair->parent = mlp;
  pair->name[0] = '\0';
  mlp->children[a] = pair;
  return PX_OK;
}

px_status px_zoo_gpt_recompute(px_module *gpt, px_recompute r) {
  px_module *h = child_named(gpt, "h");
  if (!h) return px_error(PX_ERR_INVALID, "gpt recompute: the model has no \"h\" (not built by px_zoo_gpt?)");
  if (r.kind != PX_RECOMPUTE_SELECTIVE) return px_checkpoint_blocks(h, r, 0);
  for (int l = 0; l < h->n_children; l++) {
    // block = [residual(ln_1, attn), residual(ln_2, mlp)]
    px_module *block = h->children[l];
    px_module *mlp = NULL;
    if (block->n_children == 2 && block->children[1]->n_children == 1)
      mlp = child_named(block->children[1]->children[0], "mlp");
    if (!mlp) return px_error(PX_ERR_INVALID, "gpt recompute: block %d has no mlp where px_zoo_gpt puts it", l);
    px_status st = gelu_pair(mlp, l);
    if (st != PX_OK) return st;
  }
  return PX_OK;
}
