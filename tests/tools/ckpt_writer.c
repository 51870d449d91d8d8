/* ckpt_writer — writes and checks checkpoints for
 * tests/test_checkpoint_survives_kill_mid_write.py.
 *
 *   ckpt_writer write <dir> <step> <n_files> <mib> <keep_last>
 *       writes step's checkpoint: n_files files shard_NNN.safetensors of one
 *       U8 tensor of mib MiB each (a pattern fixed by step and file), then
 *       state.json; prints "written <path>".  Large values make a write that
 *       takes long enough to be killed in the middle.
 *   ckpt_writer check <dir>
 *       px_checkpoint_latest: prints "latest <path>", one "note: <line>" per
 *       thing skipped, then loads every file of it and compares the
 *       pattern: "contents ok step <s> files <n>" and exit 0; exit 3 when
 *       there is no checkpoint, 1 on any other failure. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plexus/plexus.h"

// File f of step s repeats a 64 KiB block (quick to make and to compare,
// also in sanitizer builds).
enum { BLOCK = 1 << 16 };

static void fill_block(int64_t step, int file, unsigned char *block) {
  for (size_t j = 0; j < BLOCK; j++)
    block[j] = (unsigned char)((uint64_t)step * 131u + (uint64_t)file * 7u + j * 13u + (j >> 12));
}

static int write_cmd(const char *dir, int64_t step, int n_files, int mib, int keep_last) {
  size_t bytes = (size_t)mib << 20;
  unsigned char *data = malloc((size_t)n_files * bytes + 1);
  px_named_tensor *t = calloc((size_t)n_files, sizeof *t);
  px_state_dict *sd = calloc((size_t)n_files, sizeof *sd);
  px_ckpt_item *items = calloc((size_t)n_files + 1, sizeof *items);
  char(*names)[32] = calloc((size_t)n_files, sizeof *names);
  char json[128];
  if (!data || !t || !sd || !items || !names) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  for (int f = 0; f < n_files; f++) {
    unsigned char *p = data + (size_t)f * bytes;
    fill_block(step, f, p);
    for (size_t j = BLOCK; j < bytes; j += BLOCK) memcpy(p + j, p, BLOCK);
    int64_t shape[1] = {(int64_t)bytes};
    snprintf(t[f].name, PX_NAME_MAX, "data");
    t[f].tensor = px_tensor_view(p, PX_U8, 1, shape);
    sd[f] = (px_state_dict){&t[f], 1};
    snprintf(names[f], sizeof names[f], "shard_%03d.safetensors", f);
    items[f] = (px_ckpt_item){.name = names[f], .tensors = &sd[f]};
  }
  snprintf(json, sizeof json, "{\"step\": %" PRId64 ", \"n_files\": %d, \"mib\": %d}\n", step, n_files, mib);
  items[n_files] = (px_ckpt_item){.name = "state.json", .bytes = json, .n_bytes = strlen(json)};
  char path[1024];
  px_status st = px_checkpoint_write(dir, step, items, n_files + 1, keep_last, path, sizeof path);
  if (st != PX_OK) {
    fprintf(stderr, "ckpt_writer: %s\n", px_last_error());
    return 1;
  }
  printf("written %s\n", path);
  free(names);
  free(items);
  free(sd);
  free(t);
  free(data);
  return 0;
}

static int check_cmd(const char *dir) {
  char path[1024], note[8192];
  px_status st = px_checkpoint_latest(dir, path, sizeof path, note, sizeof note);
  for (char *line = strtok(note, "\n"); line; line = strtok(NULL, "\n")) printf("note: %s\n", line);
  if (st == PX_ERR_NOT_FOUND) {
    printf("none: %s\n", px_last_error());
    return 3;
  }
  if (st != PX_OK) {
    fprintf(stderr, "ckpt_writer: %s\n", px_last_error());
    return 1;
  }
  printf("latest %s\n", path);

  void *json;
  size_t n;
  if (px_checkpoint_read_file(path, "state.json", &json, &n) != PX_OK) {
    fprintf(stderr, "%s\n", px_last_error());
    return 1;
  }
  char text[256];
  snprintf(text, sizeof text, "%.*s", (int)(n < 255 ? n : 255), (char *)json);
  free(json);
  long long step;
  int n_files, mib;
  if (sscanf(text, "{\"step\": %lld, \"n_files\": %d, \"mib\": %d}", &step, &n_files, &mib) != 3) {
    fprintf(stderr, "ckpt_writer: state.json is %s\n", text);
    return 1;
  }
  size_t bytes = (size_t)mib << 20;
  unsigned char *buf = malloc(bytes + 1), block[BLOCK];
  for (int f = 0; f < n_files; f++) {
    char name[32];
    snprintf(name, sizeof name, "shard_%03d.safetensors", f);
    int64_t shape[1] = {(int64_t)bytes};
    px_named_tensor t = {.name = "data"};
    t.tensor = px_tensor_view(buf, PX_U8, 1, shape);
    px_state_dict sd = {&t, 1};
    if (px_checkpoint_load_tensors(path, name, &sd, true) != PX_OK) {
      fprintf(stderr, "%s\n", px_last_error());
      return 1;
    }
    fill_block(step, f, block);
    for (size_t j = 0; j < bytes; j += BLOCK)
      if (memcmp(buf + j, block, BLOCK) != 0) {
        fprintf(stderr, "ckpt_writer: %s/%s differs from the pattern in bytes [%zu, %zu)\n", path, name, j, j + BLOCK);
        return 1;
      }
  }
  free(buf);
  printf("contents ok step %lld files %d\n", step, n_files);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 7 && !strcmp(argv[1], "write"))
    return write_cmd(argv[2], strtoll(argv[3], NULL, 10), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
  if (argc == 3 && !strcmp(argv[1], "check")) return check_cmd(argv[2]);
  fprintf(stderr, "usage: ckpt_writer write <dir> <step> <n_files> <mib> <keep_last> | check <dir>\n");
  return 2;
}
