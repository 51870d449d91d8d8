// A checkpoint's state.json, parsed (train/internal.h): the position and
// the layout a run saved, checked field by field.  What the values mean
// for this run (another optimizer, world size, model) is state.c's
// business; this file only turns bytes into numbers or an error naming the
// file and the key.  tests/fuzz/fuzz_state_file.c feeds it arbitrary bytes.
#include "train/internal.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Integers in state.json are JSON numbers: exact up to 2^53, which also
 * keeps the conversion to int64_t defined (a number like 1e300, or 1e999
 * read as infinity, has no int64_t value). */
#define MAX_EXACT 9007199254740992.0

static px_status json_int(const cJSON *j, const char *key, const char *path, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble > MAX_EXACT ||
      v->valuedouble != floor(v->valuedouble))
    return px_error(PX_ERR_FORMAT, "checkpoint %s: state.json: \"%s\" is missing or not a non-negative integer", path,
                    key);
  *out = (int64_t)v->valuedouble;
  return PX_OK;
}

px_status px_train_state_parse(const void *bytes, size_t n, const char *path, px_train_state_file *out) {
  memset(out, 0, sizeof *out);
  cJSON *j = cJSON_ParseWithLength(bytes, n);
  if (!j) return px_error(PX_ERR_FORMAT, "checkpoint %s: state.json is not valid JSON", path);
  px_status st = PX_OK;
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
  const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
  if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, PX_TRAIN_STATE_FORMAT) != 0 || !cJSON_IsNumber(ver))
    st = px_error(PX_ERR_FORMAT, "checkpoint %s: state.json is not a plexus training state (\"format\": \"%s\")", path,
                  PX_TRAIN_STATE_FORMAT);
  else if (ver->valueint != PX_TRAIN_STATE_VERSION)
    st = px_error(PX_ERR_FORMAT, "checkpoint %s: state.json has version %d; this plexus reads version %d", path,
                  ver->valueint, PX_TRAIN_STATE_VERSION);
  if (st == PX_OK) st = json_int(j, "step", path, &out->step);
  if (st == PX_OK) st = json_int(j, "epoch", path, &out->epoch);
  if (st == PX_OK) st = json_int(j, "next_batch", path, &out->next_batch);
  if (st == PX_OK) st = json_int(j, "forward_count", path, &out->forward_count);
  if (st == PX_OK) st = json_int(j, "optimizer_step", path, &out->optimizer_step);
  if (st == PX_OK) st = json_int(j, "param_count", path, &out->param_count);
  if (st == PX_OK) st = json_int(j, "world_size", path, &out->world_size);
  if (st == PX_OK) st = json_int(j, "batch_size", path, &out->batch_size);
  if (st == PX_OK) st = json_int(j, "accum_steps", path, &out->accum_steps);
  // Checkpoints from before ZeRO have no "zero_stage": they are DDP's.
  if (st == PX_OK && cJSON_GetObjectItemCaseSensitive(j, "zero_stage"))
    st = json_int(j, "zero_stage", path, &out->zero_stage);
  // A tensor-parallel run's batches are per dp rank: its data world is dp.
  out->mesh_dp = out->world_size;
  out->mesh_tp = 1;
  const cJSON *mesh = cJSON_GetObjectItemCaseSensitive(j, "mesh");
  if (st == PX_OK && mesh) st = json_int(mesh, "dp", path, &out->mesh_dp);
  if (st == PX_OK && mesh) st = json_int(mesh, "tp", path, &out->mesh_tp);
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(j, "optimizer");
  if (st == PX_OK && cJSON_IsString(opt)) {
    out->has_optimizer = true;
    snprintf(out->optimizer, sizeof out->optimizer, "%s", opt->valuestring);
  }
  cJSON_Delete(j);
  return st;
}
