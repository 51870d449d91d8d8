// plexus inspect: what is in a safetensors file, a checkpoint, or a
// directory of checkpoints.
//
//   plexus inspect model.safetensors        tensors: name, dtype, shape, SHA-256 (first 16 hex digits)
//   plexus inspect runs/x/checkpoints/step_00000500
//                                           verification, training state, config, the layout it was
//                                           written with (world size, strategy, mesh, which rank wrote
//                                           which file, each file's pieces and boxes), each file's tensors
//   plexus inspect runs/x/checkpoints       every checkpoint and whether it verifies
#define _POSIX_C_SOURCE 200809L
#include "app.h"

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
    char hex[65], shape[PX_SHAPE_STR_MAX];
    px_digest_sha256(t->tensor.data, px_tensor_nbytes(&t->tensor), hex);
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
  static const char *keys[] = {"step",           "epoch",         "next_batch", "batches_per_epoch", "optimizer",
                               "optimizer_step", "forward_count", "seed",       "world_size",        "zero_stage",
                               "batch_size",     "accum_steps",   "param_count"};
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

// ---- The layout a checkpoint was written with --------------------------
// From what the checkpoint itself says: state.json (world size, ZeRO
// stage, and "mesh" {"dp", "tp", "pp"} when a run wrote one), SHA256SUMS
// (every file, rank 0's first) and each safetensors file's metadata (a
// file of pieces names its "rank"; a whole file is rank 0's: DDP, and the
// model under ZeRO 1-2, are written by rank 0 alone).

enum { LAYOUT_MAX_FILES = 1024 };

typedef struct layout_file {
  char name[1024];
  int rank;  // -1: not known
} layout_file;

static int json_int(const cJSON *o, const char *key, int dflt) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (cJSON_IsNumber(v)) return (int)v->valuedouble;
  if (cJSON_IsString(v) && v->valuestring[0]) return atoi(v->valuestring);
  return dflt;
}

// Reads a JSON array of at most PX_MAX_DIMS integers; returns its length,
// or -1 when v is not one.
static int json_dims(const cJSON *v, int64_t *out) {
  if (!cJSON_IsArray(v)) return -1;
  int n = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, v) {
    if (!cJSON_IsNumber(e) || n >= PX_MAX_DIMS) return -1;
    out[n++] = (int64_t)e->valuedouble;
  }
  return n;
}

// "[0:64, 32:64]": the box's extent along each dimension.
static void box_str(int nd, const int64_t *off, const int64_t *size, char *out, size_t cap) {
  size_t k = (size_t)snprintf(out, cap, "[");
  for (int d = 0; d < nd && k < cap; d++)
    k += (size_t)snprintf(out + k, cap - k, "%s%lld:%lld", d ? ", " : "", (long long)off[d],
                          (long long)(off[d] + size[d]));
  if (k < cap) snprintf(out + k, cap - k, "]");
}

// The checkpoint's metadata.json parsed, or NULL (none, or not JSON).
static cJSON *read_index(const char *ckpt) {
  char path[1400];
  snprintf(path, sizeof path, "%s/metadata.json", ckpt);
  FILE *fp = fopen(path, "rb");
  if (!fp) return NULL;
  char *bytes = NULL;
  size_t n = 0;
  if (fseek(fp, 0, SEEK_END) == 0) {
    long sz = ftell(fp);
    if (sz > 0 && fseek(fp, 0, SEEK_SET) == 0 && (bytes = malloc((size_t)sz)) != NULL)
      n = fread(bytes, 1, (size_t)sz, fp);
  }
  fclose(fp);
  cJSON *j = bytes ? cJSON_ParseWithLength(bytes, n) : NULL;
  free(bytes);
  return j;
}

// The checkpoint's index (metadata.json, written last by rank 0): its
// format and version, how many tensors and pieces it lists.
static void print_index_line(const char *ckpt, const char *name, int width) {
  cJSON *j = read_index(ckpt);
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
  const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version");
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(j, "tensors");
  if (!cJSON_IsString(fmt) || !cJSON_IsNumber(ver) || !cJSON_IsObject(tensors)) {
    printf("    %-*s  not a plexus checkpoint index (no format, version and tensors)\n", width, name);
    cJSON_Delete(j);
    return;
  }
  int n_tensors = 0, n_pieces = 0;
  const cJSON *t;
  cJSON_ArrayForEach(t, tensors) {
    n_tensors++;
    n_pieces += cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(t, "pieces"));
  }
  printf("    %-*s  the index (%s v%d): %d tensors in %d pieces, each with its byte range and CRC-32C\n", width, name,
         fmt->valuestring, (int)ver->valuedouble, n_tensors, n_pieces);
  cJSON_Delete(j);
}

// One line about a file: a file of pieces (how many, of how many tensors,
// which boxes, whole or flat ranges of them) or a plain state dict.  Sets
// *rank from the file's "rank" metadata (-1 when it has none).
static void print_file_layout(const char *ckpt, const char *name, int width, int *rank) {
  char path[1400];
  snprintf(path, sizeof path, "%s/%s", ckpt, name);
  *rank = -1;
  size_t len = strlen(name);
  if (strcmp(name, "metadata.json") == 0) {
    print_index_line(ckpt, name, width);
    *rank = 0;  // written by rank 0, last
    return;
  }
  if (len < 12 || strcmp(name + len - 12, ".safetensors") != 0) {
    printf("    %-*s  not tensors\n", width, name);
    return;
  }
  px_safetensors *f;
  if (px_safetensors_open(path, &f) != PX_OK) {
    printf("    %-*s  %s\n", width, name, px_last_error());
    return;
  }
  const char *fmt = px_safetensors_metadata(f, "format"), *r = px_safetensors_metadata(f, "rank");
  if (r && *r) *rank = atoi(r);
  const char *stages = px_safetensors_metadata(f, "pipeline_stages");  // a pipeline rank's file
  const int n = px_safetensors_count(f);
  if (!fmt || strcmp(fmt, PX_PIECES_FORMAT) != 0) {
    size_t elems = 0;
    for (int i = 0; i < n; i++) elems += (size_t)px_tensor_numel(&px_safetensors_get(f, i)->tensor);
    printf("    %-*s  whole tensors: %d, %zu elements (a state dict)\n", width, name, n, elems);
    px_safetensors_close(f);
    return;
  }
  const char *ver = px_safetensors_metadata(f, "version"), *pj = px_safetensors_metadata(f, "pieces");
  cJSON *pieces = pj ? cJSON_Parse(pj) : NULL;
  if (!cJSON_IsObject(pieces)) {
    printf("    %-*s  pieces version %s: the \"pieces\" metadata is missing or not a JSON object\n", width, name,
           ver ? ver : "?");
    cJSON_Delete(pieces);
    px_safetensors_close(f);
    return;
  }
  int n_pieces = 0, n_keys = 0, whole_box = 0, sub_box = 0, whole_range = 0, bad = 0;
  size_t elems = 0;
  char examples[3][PX_NAME_MAX + 160];
  int n_examples = 0;
  const char *last_key = "";
  const cJSON *e;
  cJSON_ArrayForEach(e, pieces) {
    n_pieces++;
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(e, "key");
    int64_t shape[PX_MAX_DIMS], boff[PX_MAX_DIMS], bsize[PX_MAX_DIMS];
    const int nd = json_dims(cJSON_GetObjectItemCaseSensitive(e, "shape"), shape);
    const cJSON *bo = cJSON_GetObjectItemCaseSensitive(e, "box_offset"),
                *bs = cJSON_GetObjectItemCaseSensitive(e, "box_size");
    const double off = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "offset"));
    const double cnt = cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(e, "count"));
    if (!cJSON_IsString(key) || nd < 0 || off != off || cnt != cnt) {
      bad++;
      continue;
    }
    // Pieces of one tensor are adjacent in the metadata (in file order).
    if (strcmp(key->valuestring, last_key) != 0) n_keys++;
    last_key = key->valuestring;
    elems += (size_t)cnt;
    // The box: absent (version 1), or all zero, is the whole tensor.
    bool whole = true;
    int64_t box_numel = 1;
    if (bo || bs) {
      if (json_dims(bo, boff) != nd || json_dims(bs, bsize) != nd) {
        bad++;
        continue;
      }
      bool zero = true;
      for (int d = 0; d < nd; d++) zero = zero && bsize[d] == 0;
      for (int d = 0; !zero && d < nd; d++) whole = whole && boff[d] == 0 && bsize[d] == shape[d];
    }
    for (int d = 0; d < nd; d++) box_numel *= whole ? shape[d] : bsize[d];
    if (whole) whole_box++;
    else {
      sub_box++;
      if (n_examples < 3) {
        char b[128];
        box_str(nd, boff, bsize, b, sizeof b);
        snprintf(examples[n_examples++], sizeof examples[0], "%s%s", key->valuestring, b);
      }
    }
    if (off == 0 && (int64_t)cnt == box_numel) whole_range++;
  }
  printf("    %-*s  pieces v%s: %d piece%s of %d tensor%s, %zu elements; ", width, name, ver ? ver : "?", n_pieces,
         n_pieces == 1 ? "" : "s", n_keys, n_keys == 1 ? "" : "s", elems);
  if (!sub_box) printf("boxes: all whole tensors");
  else {
    printf("boxes: %d whole tensor%s, %d sub-box%s (", whole_box, whole_box == 1 ? "" : "s", sub_box,
           sub_box == 1 ? "" : "es");
    for (int i = 0; i < n_examples; i++) printf("%s%s", i ? ", " : "", examples[i]);
    printf("%s)", sub_box > n_examples ? ", ..." : "");
  }
  printf("; ranges: %d whole box%s, %d part%s", whole_range, whole_range == 1 ? "" : "es", n_pieces - bad - whole_range,
         n_pieces - bad - whole_range == 1 ? "" : "s");
  if (bad) printf("; %d entr%s not understood", bad, bad == 1 ? "y" : "ies");
  if (stages && *stages) printf("; pipeline stages %s", stages);
  printf("\n");
  cJSON_Delete(pieces);
  px_safetensors_close(f);
}

static void print_layout(const char *ckpt) {
  int world = 0, stage = -1;
  cJSON *mesh = NULL;
  void *bytes;
  size_t n;
  if (px_checkpoint_read_file(ckpt, "state.json", &bytes, &n) == PX_OK) {
    cJSON *j = cJSON_ParseWithLength(bytes, n);
    free(bytes);
    if (j) {
      world = json_int(j, "world_size", 0);
      stage = json_int(j, "zero_stage", -1);
      mesh = cJSON_DetachItemFromObjectCaseSensitive(j, "mesh");
      cJSON_Delete(j);
    }
  }
  // The files, as SHA256SUMS lists them (rank 0's first).
  layout_file *files = calloc(LAYOUT_MAX_FILES, sizeof *files);
  int n_files = 0;
  char sums[1400];
  snprintf(sums, sizeof sums, "%s/SHA256SUMS", ckpt);
  FILE *fs = fopen(sums, "r");
  char line[1024];
  while (files && fs && n_files < LAYOUT_MAX_FILES && fgets(line, sizeof line, fs)) {
    line[strcspn(line, "\n")] = '\0';
    const char *nm = strlen(line) > 66 ? line + 66 : NULL;
    if (nm) snprintf(files[n_files++].name, sizeof files[0].name, "%s", nm);
  }
  if (fs) fclose(fs);
  printf("  layout (as written):\n");
  if (world > 0) printf("    %-14s %d\n", "world size", world);
  else printf("    %-14s not recorded (no world_size in state.json)\n", "world size");
  const int pp = cJSON_IsObject(mesh) ? json_int(mesh, "pp", 1) : 1;
  const int mdp = cJSON_IsObject(mesh) ? json_int(mesh, "dp", 1) : 1;
  const int mtp = cJSON_IsObject(mesh) ? json_int(mesh, "tp", 1) : 1;
  if (pp > 1 && (mdp > 1 || mtp > 1))  // 3D: who writes what (docs/CHECKPOINTS.md)
    printf("    %-14s pipeline × data × tensor parallel: dp rank 0's pipelines write their stages' parameters (in a "
           "tp group, each tp rank its boxes, tp rank 0 the unsplit tensors) and %s (the tied head's copy of the "
           "embedding weight is not written: the embedding's stage writes it)\n",
           "strategy", stage > 0 ? "every dp rank its ZeRO slice of the optimizer state" : "the optimizer state");
  else if (pp > 1)
    printf("    %-14s pipeline parallel: each pipeline rank writes its stages' parameters and optimizer state "
           "(the tied head's copy of the embedding weight is not written: its owner, the embedding's stage, "
           "writes it)\n",
           "strategy");
  else if (stage == 0) printf("    %-14s DDP (every rank holds everything; rank 0 writes)\n", "strategy");
  else if (stage > 0)
    printf("    %-14s ZeRO stage %d (each rank writes its shard of the optimizer state%s)\n", "strategy", stage,
           stage == 3 ? " and of the parameters" : "; rank 0 the model");
  else printf("    %-14s not recorded (no zero_stage in state.json)\n", "strategy");
  if (cJSON_IsObject(mesh)) {
    printf("    %-14s dp %d, tp %d, pp %d", "mesh", json_int(mesh, "dp", 1), json_int(mesh, "tp", 1),
           json_int(mesh, "pp", 1));
    const cJSON *sched = cJSON_GetObjectItemCaseSensitive(mesh, "schedule");
    if (cJSON_IsString(sched))
      printf(" (schedule %s, %d micro-batches, %d stage%s per rank)", sched->valuestring,
             json_int(mesh, "micro_batches", 1), json_int(mesh, "virtual_stages", 1),
             json_int(mesh, "virtual_stages", 1) == 1 ? "" : "s");
    printf("\n");
  }
  cJSON_Delete(mesh);
  if (!files) {
    printf("    (out of memory)\n");
    return;
  }
  int width = 4;
  for (int i = 0; i < n_files; i++)
    if ((int)strlen(files[i].name) > width) width = (int)strlen(files[i].name);
  printf("  files, as SHA256SUMS lists them (pieces: flat ranges of boxes of the named tensors):\n");
  int max_rank = world > 0 ? world - 1 : 0;
  cJSON *index = read_index(ckpt);
  const cJSON *index_files = cJSON_GetObjectItemCaseSensitive(index, "files");
  for (int i = 0; i < n_files; i++) {
    print_file_layout(ckpt, files[i].name, width, &files[i].rank);
    // The index says which rank wrote each data file (a tensor-parallel
    // rank's whole-tensor file carries no "rank" of its own).
    const cJSON *fr = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(index_files, files[i].name),
                                                       "rank");
    if (cJSON_IsNumber(fr)) files[i].rank = (int)fr->valuedouble;
    if (files[i].rank < 0) files[i].rank = 0;  // a whole file or state.json: rank 0's
    if (files[i].rank > max_rank) max_rank = files[i].rank;
  }
  cJSON_Delete(index);
  // Which files each rank wrote; a run of ranks that wrote nothing is one line.
  printf("  written by:\n");
  for (int r = 0; r <= max_rank; r++) {
    int k = 0;
    for (int i = 0; i < n_files; i++) k += files[i].rank == r;
    if (k == 0) {
      int last = r;
      while (last + 1 <= max_rank) {
        int m = 0;
        for (int i = 0; i < n_files; i++) m += files[i].rank == last + 1;
        if (m) break;
        last++;
      }
      if (last == r) printf("    rank %d wrote nothing\n", r);
      else printf("    ranks %d-%d wrote nothing\n", r, last);
      r = last;
      continue;
    }
    printf("    rank %d wrote %d file%s: ", r, k, k == 1 ? "" : "s");
    for (int i = 0, j = 0; i < n_files; i++)
      if (files[i].rank == r) printf("%s%s", j++ ? ", " : "", files[i].name);
    printf("\n");
  }
  free(files);
}

static int inspect_checkpoint(const char *ckpt) {
  px_status st = px_checkpoint_verify(ckpt);
  printf("checkpoint %s: %s\n", ckpt, st == PX_OK ? "verified (every file matches SHA256SUMS)" : px_last_error());
  print_state(ckpt);
  print_layout(ckpt);
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
  else if (shown == 0) printf("%s: no checkpoints\n", dir);
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
            "     position, optimizer, world size, last evaluation), the saved config, the layout it was\n"
            "     written with (world size, DDP or ZeRO stage, mesh, which rank wrote which file, each\n"
            "     file's pieces and boxes), and the tensors.\n"
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
