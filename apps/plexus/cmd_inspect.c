// plexus inspect: what is in a safetensors file, a checkpoint, or a
// directory of checkpoints.
//
//   plexus inspect model.safetensors        tensors: name, dtype, shape, SHA-256 (first 16 hex digits)
//   plexus inspect runs/x/checkpoints/step_00000500
//                                           verification, training state, config, each file's tensors
//   plexus inspect runs/x/checkpoints       every checkpoint and whether it verifies
#define _POSIX_C_SOURCE 200809L
#include "app.h"
#include "io/sha256.h"

#include <cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void print_tensors(const char *path, const char *indent) {
  px_safetensors *f;
  if (px_safetensors_open(path, &f) != PX_OK) {
    printf("%s%s\n", indent, px_last_error());
    return;
  }
  const int n = px_safetensors_count(f);
  size_t total_elems = 0, total_bytes = 0, width = 4;
  for (int i = 0; i < n; i++) {
    const px_named_tensor *t = px_safetensors_get(f, i);
    total_elems += (size_t)px_tensor_numel(&t->tensor);
    total_bytes += px_tensor_nbytes(&t->tensor);
    if (strlen(t->name) > width) width = strlen(t->name);
  }
  printf("%s%s: %d tensor%s, %zu elements, %.2f MB", indent, path, n, n == 1 ? "" : "s", total_elems,
         (double)total_bytes / 1e6);
  const char *fmt = px_safetensors_metadata(f, "format");
  if (fmt) printf(", metadata format=%s", fmt);
  printf("\n%s  %-*s  %-5s  %-20s  %s\n", indent, (int)width, "name", "dtype", "shape", "sha256 (16 of 64)");
  for (int i = 0; i < n; i++) {
    const px_named_tensor *t = px_safetensors_get(f, i);
    unsigned char d[PX_SHA256_BYTES];
    char hex[PX_SHA256_HEX], shape[PX_SHAPE_STR_MAX];
    px_sha256_bytes(t->tensor.data, px_tensor_nbytes(&t->tensor), d);
    px_sha256_hex(d, hex);
    printf("%s  %-*s  %-5s  %-20s  %.16s\n", indent, (int)width, t->name, px_dtype_name(t->tensor.dtype),
           px_shape_str(t->tensor.ndim, t->tensor.shape, shape, sizeof shape), hex);
  }
  px_safetensors_close(f);
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool has_file(const char *dir, const char *name) {
  char p[1400];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  struct stat sb;
  return stat(p, &sb) == 0;
}

static void print_state(const char *ckpt) {
  void *bytes;
  size_t n;
  if (px_checkpoint_read_file(ckpt, "state.json", &bytes, &n) != PX_OK) {
    printf("  state.json: %s\n", px_last_error());
    return;
  }
  cJSON *j = cJSON_ParseWithLength(bytes, n);
  free(bytes);
  if (!j) {
    printf("  state.json: not valid JSON\n");
    return;
  }
  static const char *keys[] = {"step", "epoch", "next_batch", "batches_per_epoch", "optimizer", "optimizer_step",
                               "forward_count", "seed", "world_size", "zero_stage", "batch_size", "accum_steps", "param_count"};
  printf("  training state:\n");
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
    if (cJSON_IsNumber(v)) printf("    %-18s %.0f\n", keys[k], v->valuedouble);
    else if (cJSON_IsString(v)) printf("    %-18s %s\n", keys[k], v->valuestring);
  }
  const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "eval");
  if (cJSON_IsObject(e)) {
    char *s = cJSON_PrintUnformatted(e);
    printf("    %-18s %s\n", "eval", s ? s : "?");
    free(s);
  }
  const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
  if (cfg) {
    char *s = cJSON_Print(cfg);
    printf("  config:\n%s\n", s ? s : "?");
    free(s);
  }
  cJSON_Delete(j);
}

static int inspect_checkpoint(const char *ckpt) {
  px_status st = px_checkpoint_verify(ckpt);
  printf("checkpoint %s: %s\n", ckpt, st == PX_OK ? "verified (every file matches SHA256SUMS)" : px_last_error());
  print_state(ckpt);
  DIR *d = opendir(ckpt);
  if (d) {
    // Sorted names, so the listing is stable.
    char *names[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
      size_t len = strlen(e->d_name);
      if (len > 12 && strcmp(e->d_name + len - 12, ".safetensors") == 0) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, by_name);
    for (int a = 0; a < n; a++) {
      char p[1200];
      snprintf(p, sizeof p, "%s/%s", ckpt, names[a]);
      print_tensors(p, "  ");
      free(names[a]);
    }
  }
  return st == PX_OK ? 0 : 1;
}

static int inspect_checkpoint_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "plexus inspect: cannot open %s\n", dir);
    return 1;
  }
  char *names[4096];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 4096)
    if (e->d_name[0] != '.' || strstr(e->d_name, ".partial")) names[n++] = strdup(e->d_name);
  closedir(d);
  qsort(names, (size_t)n, sizeof *names, by_name);
  int shown = 0;
  for (int a = 0; a < n; a++) {
    char p[1200];
    snprintf(p, sizeof p, "%s/%s", dir, names[a]);
    if (strstr(names[a], ".partial")) {
      printf("%-40s incomplete: a writer was interrupted (ignored)\n", names[a]);
      shown++;
    } else if (is_dir(p) && has_file(p, "SHA256SUMS")) {
      px_status st = px_checkpoint_verify(p);
      printf("%-40s %s\n", names[a], st == PX_OK ? "verified" : px_last_error());
      shown++;
    }
    free(names[a]);
  }
  char latest[1200], note[2048];
  if (px_checkpoint_latest(dir, latest, sizeof latest, note, sizeof note) == PX_OK)
    printf("newest good checkpoint: %s\n", latest);
  else if (shown == 0)
    printf("%s: no checkpoints\n", dir);
  return 0;
}

int px_cmd_inspect(int argc, char **argv) {
  if (argc != 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    FILE *f = argc == 2 ? stdout : stderr;
    fprintf(f,
            "usage: plexus inspect PATH\n"
            "\n"
            "PATH a safetensors file: its metadata and tensors (name, dtype, shape, SHA-256 of the bytes).\n"
            "PATH a checkpoint: whether every file matches SHA256SUMS, the training state (step, epoch,\n"
            "     position, optimizer, world size, last evaluation), the saved config, and the tensors.\n"
            "PATH a directory of checkpoints: each one and whether it verifies; the newest good one.\n");
    return argc == 2 ? 0 : 2;
  }
  const char *p = argv[1];
  if (!is_dir(p)) {
    px_safetensors *f;
    if (px_safetensors_open(p, &f) != PX_OK) return px_app_fail("inspect");
    px_safetensors_close(f);
    print_tensors(p, "");
    return 0;
  }
  if (has_file(p, "SHA256SUMS")) return inspect_checkpoint(p);
  return inspect_checkpoint_dir(p);
}
