/* Claim: a load through the index large enough to take the two-thread
 * paths (pieces of 8 MiB and more checked as two halves on two threads,
 * px_ckpt_crc32c_wide; a final copy of 64 MiB and more split over two
 * threads, px_ckpt_loader_finish) gives every element bitwise: an 80 MiB
 * tensor saved as two pieces of 48 and 32 MiB in two files, loaded whole
 * (each saved piece lands whole in the wanted one: copied from the file's
 * mapping) and loaded as three pieces cut elsewhere (saved pieces feeding
 * two wanted ones: copied through staging), with a small tensor beside it.
 * A byte flipped in the second half of the 48 MiB piece (the half the
 * second thread checks) fails the load with a message naming the file and
 * the tensor, and nothing is loaded.
 *
 * If it failed, the halves' CRCs would be joined wrongly (every large
 * checkpoint refused, or a corrupted second half accepted), or the two
 * copy threads would leave a gap, copy a run twice, or write into the
 * caller's memory before every piece was checked. */
#define _POSIX_C_SOURCE 200809L
#include "ckpt_test_util.h"
#include "px_test.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N ((size_t)20 << 20)    // elements of w: 80 MiB of F32
#define CUT ((size_t)12 << 20)  // file 0 holds w[0, CUT): 48 MiB; file 1 the rest and b
#define NB 5

static float value(size_t i) { return (float)(uint32_t)(i * 2654435761u >> 7) + 0.25f; }

static size_t wrong(const float *got, size_t from, size_t count) {
  size_t bad = 0;
  for (size_t i = 0; i < count; i++) bad += memcmp(&got[i], &(float){value(from + i)}, sizeof(float)) != 0;
  return bad;
}

int main(void) {
  char root[64];
  snprintf(root, sizeof root, "/tmp/px_large_load_XXXXXX");
  CHECK(mkdtemp(root) != NULL, "mkdtemp");
  float *w = malloc(N * sizeof *w), *got = malloc(N * sizeof *got);
  CHECK(w && got, "out of memory");
  if (!w || !got) return px_test_finish("test_checkpoint_large_load_is_bitwise_on_two_threads");
  for (size_t i = 0; i < N; i++) w[i] = value(i);
  float b[NB] = {1, 2, 3, 4, 5}, bgot[NB];

  // Two files of pieces, as two ranks would write them, with the index.
  px_tensor_piece p0 = {.key = "w", .ndim = 1, .shape = {(int64_t)N}, .offset = 0, .count = CUT, .data = w};
  px_tensor_piece p1[2] =
    {{.key = "w", .ndim = 1, .shape = {(int64_t)N}, .offset = CUT, .count = N - CUT, .data = w + CUT},
     {.key = "b", .ndim = 1, .shape = {NB}, .offset = 0, .count = NB, .data = b}};
  px_state_dict sd[2];
  char *json[2];
  CHECK_OK(px_pieces_state_dict(&p0, 1, &sd[0], &json[0]));
  CHECK_OK(px_pieces_state_dict(p1, 2, &sd[1], &json[1]));
  px_kv meta[2][3];
  px_ckpt_item items[2];
  memset(items, 0, sizeof items);
  char name[2][64];
  for (int f = 0; f < 2; f++) {
    snprintf(name[f], sizeof name[f], "p.rank%05d-of-00002.safetensors", f);
    meta[f][0] = (px_kv){"format", PX_PIECES_FORMAT};
    meta[f][1] = (px_kv){"version", PX_PIECES_VERSION};
    meta[f][2] = (px_kv){"pieces", json[f]};
    items[f] = (px_ckpt_item){.name = name[f], .tensors = &sd[f], .metadata = meta[f], .n_metadata = 3};
  }
  char ck[256];
  CHECK_OK(px_checkpoint_write_all(NULL, root, 1, items, 2, 0, ck, sizeof ck));
  for (int f = 0; f < 2; f++) {
    px_state_dict_free(&sd[f]);
    free(json[f]);
  }

  // Whole: each saved piece lands whole in the wanted one (from the mapping).
  memset(got, 0, N * sizeof *got);
  memset(bgot, 0, sizeof bgot);
  px_tensor_piece whole[2] = {{.key = "w", .ndim = 1, .shape = {(int64_t)N}, .offset = 0, .count = N, .data = got},
                              {.key = "b", .ndim = 1, .shape = {NB}, .offset = 0, .count = NB, .data = bgot}};
  CHECK_OK(px_checkpoint_load_boxes(ck, "p.rank", whole, 2));
  CHECK(wrong(got, 0, N) == 0, "whole: %zu elements of w differ", wrong(got, 0, N));
  CHECK(memcmp(bgot, b, sizeof b) == 0, "whole: b differs");

  // Three pieces cut elsewhere: saved pieces feed two wanted ones (staged).
  const size_t lo[3] = {0, (size_t)5 << 20, (size_t)17 << 20}, hi[3] = {(size_t)5 << 20, (size_t)17 << 20, N};
  memset(got, 0, N * sizeof *got);
  px_tensor_piece cut[3];
  for (int k = 0; k < 3; k++)
    cut[k] = (px_tensor_piece){.key = "w",
                               .ndim = 1,
                               .shape = {(int64_t)N},
                               .offset = lo[k],
                               .count = hi[k] - lo[k],
                               .data = got + lo[k]};
  CHECK_OK(px_checkpoint_load_boxes(ck, "p.rank", cut, 3));
  for (int k = 0; k < 3; k++)
    CHECK(wrong(got + lo[k], lo[k], hi[k] - lo[k]) == 0, "cut: piece %d [%zu, %zu) has %zu wrong elements", k, lo[k],
          hi[k], wrong(got + lo[k], lo[k], hi[k] - lo[k]));

  // A byte flipped at 40 MiB into file 0's piece: in the half the second
  // thread checks.  Refused, naming the file and the tensor; nothing loaded.
  char file[400];
  snprintf(file, sizeof file, "%s/%s", ck, name[0]);
  int fd = open(file, O_RDWR);
  CHECK(fd >= 0, "open %s", file);
  unsigned char len8[8], byte;
  uint64_t hlen = 0;
  CHECK(pread(fd, len8, 8, 0) == 8, "read the header length of %s", file);
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
  const off_t at = (off_t)(8 + hlen + ((size_t)40 << 20));
  CHECK(pread(fd, &byte, 1, at) == 1, "read %s", file);
  byte ^= 0x10;
  CHECK(pwrite(fd, &byte, 1, at) == 1, "write %s", file);
  close(fd);
  for (size_t i = 0; i < N; i++) got[i] = -1.0f;
  px_status st = px_checkpoint_load_boxes(ck, "p.rank", whole, 2);
  const char *msg = px_last_error();
  CHECK(st != PX_OK, "a flipped byte in the second half of a large piece was loaded");
  CHECK(strstr(msg, name[0]) && strstr(msg, "\"w\"") && strstr(msg, "CRC-32C"),
        "the message names neither the file, the tensor nor the check: %s", msg);
  size_t touched = 0;
  for (size_t i = 0; i < N; i++) touched += got[i] != -1.0f;
  CHECK(touched == 0, "a refused load wrote %zu elements into the caller's memory", touched);
  printf("80 MiB tensor from pieces of 48 and 32 MiB: whole and cut in three bitwise; a flipped byte at 40 MiB: %s\n",
         msg);

  free(w);
  free(got);
  ckpt_rm_rf(root);
  return px_test_finish("test_checkpoint_large_load_is_bitwise_on_two_threads");
}
