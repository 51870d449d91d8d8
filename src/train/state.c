// Checkpoints of the training loop: what is saved so that a resumed run
// ends with the same bytes as one that never stopped, and how a resume
// puts it back on every rank.
//
//   model.safetensors   parameters and buffers, state_dict names
//   optim.safetensors   the optimizer's state slots as one tensor per
//                       parameter: "<slot>.<param>" ("exp_avg.fc.weight")
//   state.json          the position (step, epoch, next batch), the dropout
//                       counter (forward passes so far), the optimizer's
//                       step count, the seed, the layout it ran on (world
//                       size, batch size, accumulation), the caller's config
//
// The data order and every random transform are functions of (seed, epoch,
// sample index), dropout masks of (seed, forward count), the learning rate
// of the step: with these restored nothing else carries state.
#include "train/internal.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_FORMAT "plexus-train-state"
#define STATE_VERSION 1

static const char *optim_name(px_optim_kind k) {
  return k == PX_OPTIM_SGD ? "sgd" : k == PX_OPTIM_ADAM ? "adam" : "adamw";
}

// The optimizer's state as named views: slot k of parameter p is
// state[k·n + p.offset, + p.numel).
static px_status optim_state_dict(px_trainer *t, px_state_dict *sd) {
  px_model *md = t->model;
  const int slots = t->opt->n_state;
  memset(sd, 0, sizeof *sd);
  if (slots == 0) return PX_OK;
  sd->items = calloc((size_t)slots * (size_t)md->n_params, sizeof *sd->items);
  if (!sd->items) return px_error(PX_ERR_NOMEM, "checkpoint: out of memory");
  for (int k = 0; k < slots; k++) {
    const char *slot_name;
    float *slot = px_optim_state_slot(t->opt, k, &slot_name);
    for (int i = 0; i < md->n_params; i++) {
      const px_param *p = md->params[i];
      px_named_tensor *it = &sd->items[sd->count++];
      int len = snprintf(it->name, sizeof it->name, "%s.%s", slot_name, p->name);
      if (len >= (int)sizeof it->name) {
        px_state_dict_free(sd);
        return px_error(PX_ERR_INVALID, "checkpoint: optimizer state name \"%s.%s\" is too long", slot_name, p->name);
      }
      it->tensor = px_tensor_view(slot + p->offset, PX_F32, p->ndim, p->shape);
    }
  }
  return PX_OK;
}

static char *state_json(px_trainer *t) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  cJSON_AddStringToObject(j, "format", STATE_FORMAT);
  cJSON_AddNumberToObject(j, "version", STATE_VERSION);
  cJSON_AddNumberToObject(j, "step", (double)t->step);
  cJSON_AddNumberToObject(j, "epoch", (double)t->epoch);
  cJSON_AddNumberToObject(j, "next_batch", (double)t->next_batch);
  cJSON_AddNumberToObject(j, "batches_per_epoch", (double)t->batches_per_epoch);
  cJSON_AddNumberToObject(j, "forward_count", (double)t->model->ctx.step);
  cJSON_AddNumberToObject(j, "optimizer_step", (double)t->opt->step);
  cJSON_AddStringToObject(j, "optimizer", optim_name(t->opt->opts.kind));
  // Seeds are 64-bit: a JSON number (a double) would round them.
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->o.seed);
  cJSON_AddStringToObject(j, "seed", seed);
  cJSON_AddNumberToObject(j, "world_size", t->world);
  cJSON_AddNumberToObject(j, "batch_size", (double)t->o.batch_size);
  cJSON_AddNumberToObject(j, "accum_steps", t->o.accum_steps);
  cJSON_AddNumberToObject(j, "param_count", (double)t->model->n_param_elems);
  if (t->val && t->last_eval_step == t->step) {
    cJSON *e = cJSON_AddObjectToObject(j, "eval");
    if (e) {
      cJSON_AddNumberToObject(e, "loss", t->last_eval.loss);
      if (isfinite(t->last_eval.accuracy)) cJSON_AddNumberToObject(e, "accuracy", t->last_eval.accuracy);
      if (isfinite(t->last_eval.perplexity)) cJSON_AddNumberToObject(e, "perplexity", t->last_eval.perplexity);
    }
  }
  if (t->o.config_json) {
    cJSON *cfg = cJSON_Parse(t->o.config_json);
    if (cfg) cJSON_AddItemToObject(j, "config", cfg);
    else cJSON_AddStringToObject(j, "config", t->o.config_json);
  }
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  return s;
}

px_status px_trainer_save(px_trainer *t) {
  px_state_dict msd, osd;
  px_status st = px_model_state_dict(t->model, &msd);
  if (st != PX_OK) return st;
  st = optim_state_dict(t, &osd);
  if (st != PX_OK) {
    px_state_dict_free(&msd);
    return st;
  }
  char *json = state_json(t);
  if (!json) st = px_error(PX_ERR_NOMEM, "checkpoint: out of memory for state.json");
  char kind[16], step[32];
  snprintf(kind, sizeof kind, "%s", optim_name(t->opt->opts.kind));
  snprintf(step, sizeof step, "%lld", (long long)t->opt->step);
  const px_kv optim_meta[2] = {{"optimizer", kind}, {"optimizer_step", step}};
  const px_kv model_meta[1] = {{"format", "pt"}};  // what Hugging Face's loaders look for
  px_ckpt_item items[3] = {
    {.name = "model.safetensors", .tensors = &msd, .metadata = model_meta, .n_metadata = 1},
    {.name = "optim.safetensors", .tensors = &osd, .metadata = optim_meta, .n_metadata = 2},
    {.name = "state.json", .bytes = json, .n_bytes = json ? strlen(json) : 0},
  };
  if (st == PX_OK)
    st = px_checkpoint_write0(t->comm, t->o.ckpt_dir, t->step, items, 3, t->o.keep_last, t->last_checkpoint,
                              sizeof t->last_checkpoint);
  free(json);
  px_state_dict_free(&msd);
  px_state_dict_free(&osd);
  return st;
}

// ---- Resume -------------------------------------------------------------------

typedef struct resume_pos {
  int64_t step, epoch, next_batch, forward_count, optimizer_step, found;
} resume_pos;

static px_status json_int(const cJSON *j, const char *key, const char *path, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
    return px_error(PX_ERR_FORMAT, "checkpoint %s: state.json: \"%s\" is missing or not a non-negative integer",
                    path, key);
  *out = (int64_t)v->valuedouble;
  return PX_OK;
}

// On rank 0: the checkpoint's path and its state, into the model and optimizer.
static px_status load_on_root(px_trainer *t, resume_pos *pos, char *path, size_t cap, char *note, size_t note_cap) {
  const char *r = t->o.resume;
  note[0] = '\0';
  px_status st;
  if (strcmp(r, "auto") == 0) {
    st = px_checkpoint_latest(t->o.ckpt_dir, path, cap, note, note_cap);
    if (st == PX_ERR_NOT_FOUND) {
      px_clear_error();
      return PX_OK;  // nothing to resume from: a fresh start
    }
    if (st != PX_OK) return st;
  } else {
    // A checkpoint directory, or a directory of checkpoints.
    st = px_checkpoint_verify(r);
    if (st == PX_OK) {
      snprintf(path, cap, "%s", r);
    } else {
      char why[512];
      snprintf(why, sizeof why, "%s", px_last_error());
      st = px_checkpoint_latest(r, path, cap, note, note_cap);
      if (st != PX_OK)
        return px_error(st == PX_ERR_NOT_FOUND ? PX_ERR_NOT_FOUND : st,
                        "resume: %s is neither a good checkpoint (%s) nor a directory holding one", r, why);
    }
  }
  void *bytes;
  size_t n;
  st = px_checkpoint_read_file(path, "state.json", &bytes, &n);
  if (st != PX_OK) return st;
  cJSON *j = cJSON_ParseWithLength(bytes, n);
  free(bytes);
  if (!j) return px_error(PX_ERR_FORMAT, "checkpoint %s: state.json is not valid JSON", path);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
  const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
  int64_t params = 0, world = 0, batch = 0, accum = 0;
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, STATE_FORMAT) != 0 || !cJSON_IsNumber(ver))
    st = px_error(PX_ERR_FORMAT, "checkpoint %s: state.json is not a plexus training state (\"format\": \"%s\")",
                  path, STATE_FORMAT);
  else if (ver->valueint != STATE_VERSION)
    st = px_error(PX_ERR_FORMAT, "checkpoint %s: state.json has version %d; this plexus reads version %d", path,
                  ver->valueint, STATE_VERSION);
  if (st == PX_OK) st = json_int(j, "step", path, &pos->step);
  if (st == PX_OK) st = json_int(j, "epoch", path, &pos->epoch);
  if (st == PX_OK) st = json_int(j, "next_batch", path, &pos->next_batch);
  if (st == PX_OK) st = json_int(j, "forward_count", path, &pos->forward_count);
  if (st == PX_OK) st = json_int(j, "optimizer_step", path, &pos->optimizer_step);
  if (st == PX_OK) st = json_int(j, "param_count", path, &params);
  if (st == PX_OK) st = json_int(j, "world_size", path, &world);
  if (st == PX_OK) st = json_int(j, "batch_size", path, &batch);
  if (st == PX_OK) st = json_int(j, "accum_steps", path, &accum);
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
  if (st == PX_OK && (!cJSON_IsString(opt) || strcmp(opt->valuestring, optim_name(t->opt->opts.kind)) != 0))
    st = px_error(PX_ERR_INVALID, "checkpoint %s: saved with optimizer %s; this run uses %s (its state cannot carry over)",
                  path, cJSON_IsString(opt) ? opt->valuestring : "?", optim_name(t->opt->opts.kind));
  if (st == PX_OK && (size_t)params != t->model->n_param_elems)
    st = px_error(PX_ERR_INVALID, "checkpoint %s: saved from a model of %lld parameters; this model has %zu (another "
                  "model or size?)", path, (long long)params, t->model->n_param_elems);
  cJSON_Delete(j);
  if (st != PX_OK) return st;

  px_state_dict sd;
  st = px_model_state_dict(t->model, &sd);
  if (st != PX_OK) return st;
  st = px_checkpoint_load_tensors(path, "model.safetensors", &sd, true);
  px_state_dict_free(&sd);
  if (st != PX_OK) return st;
  st = optim_state_dict(t, &sd);
  if (st != PX_OK) return st;
  if (sd.count > 0) st = px_checkpoint_load_tensors(path, "optim.safetensors", &sd, true);
  px_state_dict_free(&sd);
  if (st != PX_OK) return st;

  // Another layout: the same samples seen so far, but not the same order.
  if (world != t->world || (size_t)batch != t->o.batch_size || accum != t->o.accum_steps) {
    size_t seen = (size_t)pos->next_batch * (size_t)batch * (size_t)world;
    size_t per_step = t->o.batch_size * (size_t)t->world * (size_t)t->o.accum_steps;
    pos->next_batch = (int64_t)(seen / per_step * (size_t)t->o.accum_steps);
    if ((size_t)pos->next_batch > t->batches_per_epoch) pos->next_batch = (int64_t)t->batches_per_epoch;
    size_t m = strlen(note);
    snprintf(note + m, note_cap - m,
             "%sresume: the checkpoint ran on %lld rank(s) × batch %lld × accumulation %lld, this run on %d × %zu × "
             "%d: training goes on from the same sample count, not bit-exactly",
             m ? "\n" : "", (long long)world, (long long)batch, (long long)accum, t->world, t->o.batch_size,
             t->o.accum_steps);
  }
  pos->found = 1;
  return PX_OK;
}

// Rank 0's status and message, on every rank.
typedef struct shared_status {
  int32_t status;
  char    msg[1020];
} shared_status;

px_status px_trainer_resume(px_trainer *t, bool *resumed) {
  *resumed = false;
  if (!t->o.resume) return PX_OK;
  resume_pos pos = {0};
  char path[512] = "", note[2048] = "";
  shared_status ss = {0};
  if (t->rank == 0) {
    px_status st = load_on_root(t, &pos, path, sizeof path, note, sizeof note);
    ss.status = (int32_t)st;
    if (st != PX_OK) snprintf(ss.msg, sizeof ss.msg, "%s", px_last_error());
  }
  px_status cst = px_comm_broadcast(t->comm, &ss, sizeof ss, PX_U8, 0);
  if (cst != PX_OK) return cst;
  if (ss.status != PX_OK) return px_error((px_status)ss.status, "%s", ss.msg);
  if (note[0]) px_log_text(t->log, "%s", note);
  cst = px_comm_broadcast(t->comm, &pos, sizeof pos / sizeof(int64_t), PX_I64, 0);
  if (cst != PX_OK) return cst;
  if (!pos.found) {
    px_log_text(t->log, "resume: no checkpoint in %s yet: starting at step 0", t->o.ckpt_dir);
    return PX_OK;
  }
  px_model *md = t->model;
  px_comm_set_label(t->comm, "resume: broadcast of the checkpoint");
  if ((cst = px_comm_broadcast(t->comm, md->param_data, md->n_param_elems, PX_F32, 0)) != PX_OK) return cst;
  if (md->n_buffer_elems &&
      (cst = px_comm_broadcast(t->comm, md->buffer_data, md->n_buffer_elems, PX_F32, 0)) != PX_OK)
    return cst;
  if (t->opt->n_state &&
      (cst = px_comm_broadcast(t->comm, t->opt->state, (size_t)t->opt->n_state * t->opt->n, PX_F32, 0)) != PX_OK)
    return cst;
  if ((cst = px_comm_broadcast(t->comm, path, sizeof path, PX_U8, 0)) != PX_OK) return cst;
  t->step = pos.step;
  t->epoch = (uint64_t)pos.epoch;
  t->next_batch = (size_t)pos.next_batch;
  if (t->next_batch >= t->batches_per_epoch) {
    t->epoch++;
    t->next_batch = 0;
  }
  md->ctx.step = (uint64_t)pos.forward_count;
  t->opt->step = pos.optimizer_step;
  snprintf(t->last_checkpoint, sizeof t->last_checkpoint, "%s", path);
  *resumed = true;
  return px_log_text(t->log, "resumed from %s: step %lld, epoch %lld, batch %zu", path, (long long)t->step,
                     (long long)t->epoch + 1, t->next_batch);
}

px_status px_train_load_weights(px_model *model, const char *path, char *resolved, size_t cap) {
  char ck[512], note[1024];
  px_status st = px_checkpoint_verify(path);
  if (st == PX_OK) {
    snprintf(ck, sizeof ck, "%s", path);
  } else {
    char why[512];
    snprintf(why, sizeof why, "%s", px_last_error());
    st = px_checkpoint_latest(path, ck, sizeof ck, note, sizeof note);
    if (st != PX_OK)
      return px_error(st, "%s is neither a good checkpoint (%s) nor a directory holding one", path, why);
  }
  px_state_dict sd;
  st = px_model_state_dict(model, &sd);
  if (st != PX_OK) return st;
  st = px_checkpoint_load_tensors(ck, "model.safetensors", &sd, true);
  px_state_dict_free(&sd);
  if (st == PX_OK && resolved) snprintf(resolved, cap, "%s", ck);
  return st;
}
