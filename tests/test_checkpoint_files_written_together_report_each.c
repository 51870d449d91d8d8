/* Claim: px_ckpt_write_items, which writes a rank's large checkpoint files
 * at the same time (each on a thread of its own), gives every file's
 * SHA-256 as px_sha256_file computes it from the disk and each chunk's
 * CRC-32C as px_ckpt_crc32c computes it from memory (the two large files
 * hashed together, px_sha256_update2); and when the write of a file on a
 * worker thread fails, it returns that failure with the worker's message
 * (naming the file), after the other large files were written whole.
 * Three large files: the pairs change as each one's hashing ends.
 *
 * If it failed, SHA256SUMS or the index would disagree with the files
 * (every load refused), or a failed save would report success or a
 * message that is not about the file that failed. */
#define _POSIX_C_SOURCE 200809L
#include "io/checkpoint.h"
#include "io/sha256.h"
#include "px_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
  NA = (5 << 20) / 4 + 3,
  NB = (6 << 20) / 4 + 1,
  ND = (9 << 19) / 4 + 7
};  // three items above the 4 MiB thread threshold

static void rm_dir(const char *d) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", d);
}

int main(void) {
  float *a = malloc(NA * sizeof *a), *b = malloc(NB * sizeof *b), *dd = malloc(ND * sizeof *dd);
  CHECK(a && b && dd, "out of memory");
  if (!a || !b || !dd) return px_test_finish("test_checkpoint_files_written_together_report_each");
  for (int i = 0; i < NA; i++) a[i] = (float)i * 0.25f;
  for (int i = 0; i < NB; i++) b[i] = -(float)i;
  for (int i = 0; i < ND; i++) dd[i] = (float)(i % 1000) + 0.5f;
  px_named_tensor ta = {.name = "a"}, tb = {.name = "b"}, td = {.name = "d"};
  ta.tensor = px_tensor_f32(a, 1, NA, 0, 0, 0);
  tb.tensor = px_tensor_f32(b, 1, NB, 0, 0, 0);
  td.tensor = px_tensor_f32(dd, 1, ND, 0, 0, 0);
  px_state_dict sa = {&ta, 1}, sb = {&tb, 1}, sd = {&td, 1};
  const char *json = "{\"step\": 3}\n";
  const px_ckpt_item items[4] = {{.name = "a.safetensors", .tensors = &sa},
                                 {.name = "b.safetensors", .tensors = &sb},
                                 {.name = "c.json", .bytes = json, .n_bytes = strlen(json)},
                                 {.name = "d.safetensors", .tensors = &sd}};
  char dir[64], path[128];
  snprintf(dir, sizeof dir, "/tmp/px_test_items_%ld", (long)getpid());
  CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);

  // All written: hashes from the disk, CRCs from memory.
  char hex[4][PX_SHA256_HEX];
  px_ckpt_chunk_crc *crcs[4] = {0};
  int n_crcs[4] = {0};
  CHECK_OK(px_ckpt_write_items(dir, "ckpt", items, 4, hex, crcs, n_crcs));
  for (int i = 0; i < 4; i++) {
    unsigned char d[PX_SHA256_BYTES];
    char h[PX_SHA256_HEX];
    snprintf(path, sizeof path, "%s/%s", dir, items[i].name);
    CHECK_OK(px_sha256_file(path, d, NULL));
    px_sha256_hex(d, h);
    CHECK(strcmp(h, hex[i]) == 0, "%s: SHA-256 %s on disk, %s reported", items[i].name, h, hex[i]);
  }
  const float *data[4] = {a, b, NULL, dd};
  const size_t bytes[4] = {NA * sizeof(float), NB * sizeof(float), 0, ND * sizeof(float)};
  for (int i = 0; i < 4; i++) {
    if (i == 2) continue;
    int found = 0;
    for (int k = 0; k < n_crcs[i]; k++)
      if (crcs[i][k].data == data[i]) {
        found = 1;
        CHECK(crcs[i][k].size == bytes[i] && crcs[i][k].crc == px_ckpt_crc32c(0, data[i], bytes[i]),
              "%s: the tensor's chunk CRC", items[i].name);
      }
    CHECK(found, "%s: no chunk is the tensor's bytes", items[i].name);
  }
  CHECK(crcs[2] == NULL && n_crcs[2] == 0, "a bytes item has no chunk CRCs");
  for (int i = 0; i < 4; i++) free(crcs[i]);
  rm_dir(dir);

  // a.safetensors (written on a worker thread) cannot be created: its
  // error comes back; b and d are written whole all the same (and c,
  // small, is not written: the save has failed).
  CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
  snprintf(path, sizeof path, "%s/a.safetensors", dir);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL, "create %s", path);
  if (f) fclose(f);
  memset(crcs, 0, sizeof crcs);
  px_status st = px_ckpt_write_items(dir, "ckpt", items, 4, hex, crcs, n_crcs);
  CHECK(st == PX_ERR_IO, "status %d, expected PX_ERR_IO", (int)st);
  CHECK(strstr(px_last_error(), "\"a.safetensors\"") && strstr(px_last_error(), "create"),
        "the message names the file and the step: %s", px_last_error());
  for (int i = 1; i < 4; i += 2) {
    unsigned char d[PX_SHA256_BYTES];
    char h[PX_SHA256_HEX];
    snprintf(path, sizeof path, "%s/%s", dir, items[i].name);
    CHECK(px_sha256_file(path, d, NULL) == PX_OK, "%s written", items[i].name);
    px_sha256_hex(d, h);
    CHECK(strcmp(h, hex[i]) == 0, "%s: whole on disk", items[i].name);
  }
  for (int i = 0; i < 4; i++) free(crcs[i]);
  rm_dir(dir);
  free(a);
  free(b);
  free(dd);
  return px_test_finish("test_checkpoint_files_written_together_report_each");
}
