// Checkpoints as the eval and generate commands see them: where the newest
// good one is, and the config the run saved in it (app.h).
#include "app.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

px_status px_app_resolve_checkpoint(const char *path, char *resolved, size_t cap, char *note, size_t note_cap) {
  if (note && note_cap) note[0] = '\0';
  if (px_checkpoint_verify(path) == PX_OK) {
    snprintf(resolved, cap, "%s", path);
    return PX_OK;
  }
  char why[512];
  snprintf(why, sizeof why, "%s", px_last_error());
  char scratch[1024];
  px_status st = px_checkpoint_latest(path, resolved, cap, note ? note : scratch, note ? note_cap : sizeof scratch);
  if (st != PX_OK)
    return px_error(st, "%s is neither a good checkpoint (%s) nor a directory holding one", path, why);
  return PX_OK;
}

const char *px_app_find_option(int argc, char **argv, const char *flag) {
  size_t n = strlen(flag);
  for (int a = 1; a < argc; a++) {
    if (strncmp(argv[a], "--", 2) != 0 || strncmp(argv[a] + 2, flag, n) != 0) continue;
    if (argv[a][2 + n] == '\0' && a + 1 < argc) return argv[a + 1];
    if (argv[a][2 + n] == '=') return argv[a] + 3 + n;
  }
  return NULL;
}

px_status px_app_checkpoint_config(const char *ckpt, px_config *c, int commands, int64_t *step) {
  void *bytes;
  size_t n;
  px_status st = px_checkpoint_read_file(ckpt, "state.json", &bytes, &n);
  if (st != PX_OK) return st;
  cJSON *j = cJSON_ParseWithLength(bytes, n);
  free(bytes);
  if (!j) return px_error(PX_ERR_FORMAT, "checkpoint %s: state.json is not valid JSON", ckpt);
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
  *step = cJSON_IsNumber(s) ? (int64_t)s->valuedouble : -1;
  const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
  if (!cJSON_IsObject(cfg)) {
    cJSON_Delete(j);
    return px_error(PX_ERR_FORMAT, "checkpoint %s: state.json holds no \"config\" object: was it written by "
                    "plexus train?", ckpt);
  }
  char *text = cJSON_PrintUnformatted(cfg);
  cJSON_Delete(j);
  if (!text) return px_error(PX_ERR_NOMEM, "out of memory");
  char name[600];
  snprintf(name, sizeof name, "%s/state.json", ckpt);
  st = px_config_load_json(c, text, strlen(text), name, commands);
  free(text);
  return st;
}
