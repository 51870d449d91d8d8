// Checkpoints of `plexus train --pp P` (cmd_train_pp.c): what goes into
// state.json, where a resume starts, --init.  The tensors are the library's
// (px_pp_checkpoint_save / _load, src/train/state_pp.c): every rank its
// chunks' pieces, loadable at any layout.
//
// state.json is the format of every training run (src/train/state.c reads
// it, so a pipeline checkpoint resumes without --pp too, and the other way
// round).  A pipeline step takes one loader batch of --batch-size B samples
// per dp replica in M micro-batches, the loader sharded over the A replicas
// (rank = dp rank, world = A): the data position is that of A data-parallel
// ranks with batch B (next_batch counts each replica's batches, A · B
// samples a step, as a DDP run's), and the dropout counter that of one
// process running the M micro-batches with accumulation (forward_count =
// step · M).  "mesh" says the layout: {"dp": A, "tp": T, "pp": P,
// "schedule": "1f1b", "micro_batches": M, "virtual_stages": v}; "samples"
// the samples trained on so far (all replicas').
//
// Who writes (px_pp_checkpoint_save): the parameters by dp rank 0's
// pipelines only (the replicas are equal), those no tp rank splits by tp
// rank 0 only; the optimizer state with them, or under --zero 1|2 by every
// dp rank, its slice.
#include "app.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *optim_name(px_optim_kind k) {
  return k == PX_OPTIM_SGD ? "sgd" : k == PX_OPTIM_ADAM ? "adam" : "adamw";
}

// The whole model's trainable elements (the tied copy counted once), the
// same on every rank (collective): dp rank 0's pipelines count, a tp-split
// parameter with every tp rank's box, an unsplit one on tp rank 0 only.
static px_status model_params(px_comm *comm, const px_mesh *mesh, px_pp *pp, double *out) {
  const px_pp_plan *plan = px_pp_plan_of(pp);
  double n = 0;
  for (int c = 0; c < px_pp_n_chunks(pp) && mesh->dp_rank == 0; c++) {
    px_model *md = px_pp_chunk_model(pp, c);
    const bool copy = plan->tied_head_unit >= 0 &&
      px_pp_chunk_stage(pp, c) == px_pp_plan_stage_of(plan, plan->tied_head_unit) &&
      px_pp_plan_stage_of(plan, plan->tied_emb_unit) != px_pp_chunk_stage(pp, c);
    for (int i = 0; i < md->n_params; i++) {
      const px_param *p = md->params[i];
      if (copy && strcmp(p->name, plan->tied_param) == 0) continue;
      if (px_tp_param_box(p).split_dim >= 0 || mesh->tp_rank == 0) n += (double)p->numel;
    }
  }
  *out = n;
  return px_comm_allreduce(comm, out, 1, PX_F64, PX_SUM);
}

static char *state_json(px_comm *comm, const px_mesh *mh, const px_config *c, const px_train_opts *o, px_pp *pp,
                        const px_app_pp_ckpt *k, double params) {
  cJSON *j = cJSON_CreateObject();
  if (!j) return NULL;
  const px_optim *opt = px_pp_chunk_optim(pp, 0);
  const int v = px_pp_n_chunks(pp);
  cJSON_AddStringToObject(j, "format", "plexus-train-state");
  cJSON_AddNumberToObject(j, "version", 1);
  cJSON_AddNumberToObject(j, "step", (double)k->step);
  cJSON_AddNumberToObject(j, "epoch", (double)k->epoch);
  cJSON_AddNumberToObject(j, "next_batch", (double)k->next_batch);
  cJSON_AddNumberToObject(j, "batches_per_epoch", (double)k->batches_per_epoch);
  cJSON_AddNumberToObject(j, "samples", (double)k->samples);
  cJSON_AddNumberToObject(j, "forward_count", (double)k->step * (double)c->micro_batches);
  cJSON_AddNumberToObject(j, "optimizer_step", opt ? (double)opt->step : 0.0);
  cJSON_AddStringToObject(j, "optimizer", optim_name(o->optim.kind));
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
  cJSON_AddStringToObject(j, "seed", seed);
  cJSON_AddNumberToObject(j, "world_size", px_comm_size(comm));
  cJSON_AddNumberToObject(j, "batch_size", (double)o->batch_size);
  cJSON_AddNumberToObject(j, "accum_steps", 1);
  cJSON_AddNumberToObject(j, "param_count", params);
  cJSON *mesh = cJSON_AddObjectToObject(j, "mesh");
  if (mesh) {
    cJSON_AddNumberToObject(mesh, "dp", mh->dp);
    cJSON_AddNumberToObject(mesh, "tp", mh->tp);
    cJSON_AddNumberToObject(mesh, "pp", (double)c->pp);
    cJSON_AddStringToObject(mesh, "schedule", c->schedule_pp);
    cJSON_AddNumberToObject(mesh, "micro_batches", (double)c->micro_batches);
    cJSON_AddNumberToObject(mesh, "virtual_stages", v);
  }
  cJSON_AddNumberToObject(j, "zero_stage", mh->dp > 1 ? (double)c->zero : 0.0);
  cJSON *dep = cJSON_AddObjectToObject(j, "rank_count_dependent");
  if (dep) {
    cJSON_AddStringToObject(dep, "next_batch",
                            "counts each dp replica's batches of batch_size samples (a pipeline "
                            "step is one per replica: mesh.dp × batch_size samples)");
    cJSON_AddStringToObject(dep, "files",
                            "model.rank*, optim.rank*: each pipeline rank's stages as pieces of "
                            "named tensors (dp rank 0's pipelines; under ZeRO every dp rank's optimizer slice); "
                            "metadata.json lists where each is, and any layout loads them");
  }
  if (o->config_json) {
    cJSON *cfg = cJSON_Parse(o->config_json);
    if (cfg) cJSON_AddItemToObject(j, "config", cfg);
  }
  char *s = cJSON_Print(j);
  cJSON_Delete(j);
  return s;
}

px_status px_app_pp_save(px_comm *comm, const px_mesh *mesh, const px_config *c, const px_train_opts *o, px_pp *pp,
                         px_logger *log, px_app_pp_ckpt *k) {
  if (!o->ckpt_dir || k->last_step == k->step) return PX_OK;
  px_comm_set_label(comm, "checkpoint (pipeline)");
  double params = 0;
  px_status st = model_params(comm, mesh, pp, &params);
  if (st != PX_OK) return st;
  char *json = px_comm_rank(comm) == 0 ? state_json(comm, mesh, c, o, pp, k, params) : NULL;
  // (rank 0 without its state.json: px_pp_checkpoint_save fails on every rank)
  st = px_pp_checkpoint_save(comm, pp, mesh->dp_rank == 0, mesh->tp_rank == 0, o->ckpt_dir, k->step, o->keep_last, json,
                             k->path, sizeof k->path);
  free(json);
  if (st != PX_OK) return st;
  k->last_step = k->step;
  return px_log_text(log, "checkpoint %s (step %lld)", k->path, (long long)k->step);
}

// ---- Resume ---------------------------------------------------------------------

typedef struct resume_msg {
  int32_t status, found;
  int64_t step, epoch, next_batch, samples, optimizer_step;
  char path[512];
  char msg[1500];  // the error, or the notes to log
} resume_msg;

static px_status json_int(const cJSON *j, const char *key, const char *path, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble))
    return px_error(PX_ERR_FORMAT, "checkpoint %s: state.json: \"%s\" is missing or not a non-negative integer", path,
                    key);
  *out = (int64_t)v->valuedouble;
  return PX_OK;
}

// Rank 0: which checkpoint, and the position in this run's terms.
static px_status plan_resume(const px_mesh *mh, const px_config *c, const px_train_opts *o, size_t per_epoch,
                             double params, resume_msg *r) {
  char note[1024] = "";
  px_status st;
  if (strcmp(c->resume, "auto") == 0) {
    st = px_checkpoint_latest(o->ckpt_dir, r->path, sizeof r->path, note, sizeof note);
    if (st == PX_ERR_NOT_FOUND) {
      px_clear_error();
      snprintf(r->msg, sizeof r->msg, "%s%sresume: no checkpoint in %s yet: starting at step 0", note,
               *note ? "\n" : "", o->ckpt_dir);
      return PX_OK;
    }
  } else {
    st = px_app_resolve_checkpoint(c->resume, r->path, sizeof r->path, note, sizeof note);
  }
  if (st != PX_OK) return px_error_wrap(st, "--resume");
  void *bytes;
  size_t n;
  if ((st = px_checkpoint_read_file(r->path, "state.json", &bytes, &n)) != PX_OK) return st;
  cJSON *j = cJSON_ParseWithLength(bytes, n);
  free(bytes);
  if (!j) return px_error(PX_ERR_FORMAT, "checkpoint %s: state.json is not valid JSON", r->path);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
  int64_t saved_params = 0, world = 0, batch = 0, accum = 0, dp = 0, tp = 1, pp = 1, zero = 0;
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "plexus-train-state") != 0)
    st = px_error(PX_ERR_FORMAT, "checkpoint %s: state.json is not a plexus training state", r->path);
  if (st == PX_OK) st = json_int(j, "step", r->path, &r->step);
  if (st == PX_OK) st = json_int(j, "epoch", r->path, &r->epoch);
  if (st == PX_OK) st = json_int(j, "next_batch", r->path, &r->next_batch);
  if (st == PX_OK) st = json_int(j, "optimizer_step", r->path, &r->optimizer_step);
  if (st == PX_OK) st = json_int(j, "param_count", r->path, &saved_params);
  if (st == PX_OK) st = json_int(j, "world_size", r->path, &world);
  if (st == PX_OK) st = json_int(j, "batch_size", r->path, &batch);
  if (st == PX_OK) st = json_int(j, "accum_steps", r->path, &accum);
  if (st == PX_OK && cJSON_GetObjectItemCaseSensitive(j, "zero_stage")) st = json_int(j, "zero_stage", r->path, &zero);
  const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(j, "mesh");
  dp = world;  // a data-parallel run's data world; a mesh says its own
  if (st == PX_OK && mesh) st = json_int(mesh, "dp", r->path, &dp);
  if (st == PX_OK && mesh) st = json_int(mesh, "tp", r->path, &tp);
  if (st == PX_OK && mesh && cJSON_GetObjectItemCaseSensitive(mesh, "pp")) st = json_int(mesh, "pp", r->path, &pp);
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
  if (st == PX_OK && (!cJSON_IsString(opt) || strcmp(opt->valuestring, optim_name(o->optim.kind)) != 0))
    st = px_error(PX_ERR_INVALID,
                  "checkpoint %s: saved with optimizer %s; this run uses %s (its state cannot carry "
                  "over)",
                  r->path, cJSON_IsString(opt) ? opt->valuestring : "?", optim_name(o->optim.kind));
  if (st == PX_OK && (double)saved_params != params)
    st = px_error(PX_ERR_INVALID,
                  "checkpoint %s: saved from a model of %lld parameters; this model has %.0f "
                  "(another model or size?)",
                  r->path, (long long)saved_params, params);
  const cJSON *samples = cJSON_GetObjectItemCaseSensitive(j, "samples");
  cJSON_Delete(j);
  if (st != PX_OK) return st;
  // The data position: A replicas with batch B here (a step A · B samples,
  // replica d the batches d, d + A, ... of the epoch's order); the
  // checkpoint's steps took batch × dp × accum samples each, so the samples
  // of this epoch trained on carry over whatever layout saved them.
  const int64_t b = (int64_t)o->batch_size * mh->dp, g_old = batch * dp * accum;
  const int64_t seen = r->next_batch * batch * dp;
  r->samples = samples ? (int64_t)cJSON_GetNumberValue(samples) : r->step * g_old;
  (void)samples;
  size_t m = strlen(note);
  if (m) note[m++] = '\n', note[m] = '\0';
  snprintf(note + m, sizeof note - m,
           "resume: checkpoint of dp %lld × tp %lld × pp %lld (zero %lld, %lld ranks); "
           "this run dp %d × tp %d × pp %d: its tensors are loaded by intersecting pieces",
           (long long)dp, (long long)tp, (long long)pp, (long long)zero, (long long)world, mh->dp, mh->tp, mh->pp);
  r->next_batch = seen / b;
  if (g_old != b) {
    m = strlen(note);
    snprintf(note + m, sizeof note - m,
             "\nresume: the checkpoint's steps took %lld samples, this run's %lld "
             "(dp %d × --batch-size %zu): training goes on from the same sample count (%lld into epoch %lld), not on "
             "the same trajectory (keep the global batch, dp × --batch-size, to continue it)",
             (long long)g_old, (long long)b, mh->dp, o->batch_size, (long long)seen, (long long)r->epoch + 1);
    if (o->max_steps == 0) r->step = r->epoch * (int64_t)per_epoch + r->next_batch;
  }
  if (r->next_batch >= (int64_t)per_epoch) {
    r->epoch++;
    r->next_batch = 0;
  }
  snprintf(r->msg, sizeof r->msg, "%s", note);
  r->found = 1;
  return PX_OK;
}

px_status px_app_pp_resume(px_comm *comm, const px_mesh *mesh, const px_config *c, const px_train_opts *o, px_pp *pp,
                           px_logger *log, px_app_pp_ckpt *k) {
  k->last_step = -1;
  if (!*c->resume && !*c->init) return PX_OK;
  px_comm_set_label(comm, "resume (pipeline)");
  double params = 0;
  px_status st = model_params(comm, mesh, pp, &params);
  if (st != PX_OK) return st;
  if (!*c->resume) {  // --init: weights only, from a checkpoint of any layout
    struct stat sb;
    char path[512];
    st = stat(c->init, &sb) == 0 && S_ISDIR(sb.st_mode)
      ? px_app_resolve_checkpoint(c->init, path, sizeof path, NULL, 0)
      : px_error(PX_ERR_UNSUPPORTED, "--init %s with --pp: give a plexus checkpoint (a directory)", c->init);
    if (st == PX_OK) st = px_pp_checkpoint_load(comm, pp, path, -1);
    if (st != PX_OK) return px_error_wrap(st, "--init");
    return px_log_text(log, "--init: weights from %s", path);
  }
  resume_msg r;
  memset(&r, 0, sizeof r);
  if (px_comm_rank(comm) == 0) {
    st = plan_resume(mesh, c, o, (size_t)k->batches_per_epoch, params, &r);
    r.status = (int32_t)st;
    if (st != PX_OK) snprintf(r.msg, sizeof r.msg, "%s", px_last_error());
  }
  if ((st = px_comm_broadcast(comm, &r, sizeof r, PX_U8, 0)) != PX_OK) return st;
  if (r.status != PX_OK) return px_error((px_status)r.status, "%s", r.msg);
  if (*r.msg) px_log_text(log, "%s", r.msg);
  if (!r.found) return PX_OK;
  if ((st = px_pp_checkpoint_load(comm, pp, r.path, r.optimizer_step)) != PX_OK) return st;
  px_pp_set_step_base(pp, (uint64_t)r.step);
  k->step = k->last_step = r.step;
  k->epoch = r.epoch;
  k->next_batch = r.next_batch;
  k->samples = r.samples;
  snprintf(k->path, sizeof k->path, "%s", r.path);
  return px_log_text(log, "resumed from %s: step %lld, epoch %lld, batch %lld", r.path, (long long)r.step,
                     (long long)r.epoch + 1, (long long)r.next_batch);
}
