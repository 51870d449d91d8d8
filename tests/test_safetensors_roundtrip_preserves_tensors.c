/* Claim: px_safetensors_save followed by px_safetensors_open or
 * px_safetensors_load gives back every tensor bit for bit (all 13 dtypes,
 * 0-d to 4-d shapes, empty tensors, names that need JSON escapes) with the
 * metadata strings intact; the writer lays tensors out aligned to their
 * element size, in a layout that does not depend on the state dict's order;
 * a strict load tolerates PyTorch's "*.num_batches_tracked".  If this
 * failed, a checkpoint would not restore the model it was saved from. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <dirent.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static void path_in(char *buf, size_t len, const char *name) { snprintf(buf, len, "%s/%s", dir, name); }

static void remove_dir(void) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
      path_in(p, sizeof p, e->d_name);
      remove(p);
    }
  closedir(d);
  rmdir(dir);
}

static unsigned char *read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

#define N_TENSORS (PX_DTYPE_COUNT + 5)

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_st_roundtrip_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }

  // One tensor per dtype with shapes of 1 to 4 dims, then the odd cases.
  px_named_tensor items[N_TENSORS];
  memset(items, 0, sizeof items);
  static const int64_t shapes[4][4] = {{7, 0, 0, 0}, {3, 5, 0, 0}, {2, 3, 4, 0}, {2, 1, 3, 2}};
  int n = 0;
  for (int d = 0; d < PX_DTYPE_COUNT; d++, n++) {
    snprintf(items[n].name, PX_NAME_MAX, "layers.%d.%s", d, px_dtype_name((px_dtype)d));
    CHECK_OK(px_tensor_new(&items[n].tensor, (px_dtype)d, d % 4 + 1, shapes[d % 4]));
  }
  const int64_t empty_shape[2] = {0, 3}, big_shape[2] = {64, 33}, f16_4d[4] = {2, 3, 4, 5};
  snprintf(items[n].name, PX_NAME_MAX, "scale");  // 0-d: one element
  CHECK_OK(px_tensor_new(&items[n++].tensor, PX_F32, 0, NULL));
  snprintf(items[n].name, PX_NAME_MAX, "empty");
  CHECK_OK(px_tensor_new(&items[n++].tensor, PX_F32, 2, empty_shape));
  snprintf(items[n].name, PX_NAME_MAX, "big.weight");
  CHECK_OK(px_tensor_new(&items[n++].tensor, PX_F32, 2, big_shape));
  snprintf(items[n].name, PX_NAME_MAX, "conv.weight");
  CHECK_OK(px_tensor_new(&items[n++].tensor, PX_F16, 4, f16_4d));
  snprintf(items[n].name, PX_NAME_MAX, "odd \"name\" \\ caf\xc3\xa9\t\x01/");
  CHECK_OK(px_tensor_new(&items[n++].tensor, PX_U8, 1, shapes[0]));
  CHECK(n == N_TENSORS, "n = %d", n);

  px_rng rng = px_rng_make(42, 0);
  for (int i = 0; i < n; i++) {
    unsigned char *b = items[i].tensor.data;
    for (size_t k = 0; k < px_tensor_nbytes(&items[i].tensor); k++) b[k] = (unsigned char)px_rng_u32(&rng);
  }
  px_state_dict sd = {items, n};
  const char *note_value =
    "quote \" backslash \\ newline \n tab \t ctrl \x01 utf8 caf\xc3\xa9 \xe6\xbc\xa2 \xf0\x9f\x98\x80 end";
  px_kv meta[2] = {{"note", note_value}, {"format", "pt"}};
  char path[512];
  path_in(path, sizeof path, "model.safetensors");
  CHECK_OK(px_safetensors_save(path, &sd, meta, 2));

  // Open: every tensor, its dtype, shape and bytes; metadata.
  px_safetensors *f;
  CHECK_OK(px_safetensors_open(path, &f));
  CHECK(px_safetensors_count(f) == n, "count %d, expected %d", px_safetensors_count(f), n);
  CHECK(strcmp(px_safetensors_path(f), path) == 0, "path %s", px_safetensors_path(f));
  for (int i = 0; i < n; i++) {
    const px_named_tensor *t = px_safetensors_find(f, items[i].name);
    CHECK(t != NULL, "tensor \"%s\" not found", items[i].name);
    if (!t) continue;
    CHECK(strcmp(t->name, items[i].name) == 0, "name %s", t->name);
    CHECK(t->tensor.dtype == items[i].tensor.dtype, "%s: dtype %s", t->name, px_dtype_name(t->tensor.dtype));
    CHECK(px_tensor_same_shape(&t->tensor, &items[i].tensor), "%s: shape differs", t->name);
    size_t nb = px_tensor_nbytes(&items[i].tensor);
    CHECK(nb == 0 || memcmp(t->tensor.data, items[i].tensor.data, nb) == 0, "%s: bytes differ", t->name);
    // Header padded to 8 and tensors laid out by descending element size:
    // every tensor is aligned for its dtype (malloc gives 16).
    CHECK((uintptr_t)t->tensor.data % px_dtype_size(t->tensor.dtype) == 0, "%s: unaligned", t->name);
  }
  CHECK(px_safetensors_find(f, "nope") == NULL, "found a tensor that is not there");
  CHECK(px_safetensors_get(f, -1) == NULL && px_safetensors_get(f, n) == NULL, "get out of range");
  const char *v = px_safetensors_metadata(f, "note");
  CHECK(v && strcmp(v, note_value) == 0, "metadata note = %s", v ? v : "(null)");
  v = px_safetensors_metadata(f, "format");
  CHECK(v && strcmp(v, "pt") == 0, "metadata format = %s", v ? v : "(null)");
  CHECK(px_safetensors_metadata(f, "missing") == NULL, "metadata missing");

  // Layout: header order = data order, contiguous from 0, descending
  // element size.
  const unsigned char *prev_end = NULL;
  size_t prev_size = 8;
  for (int i = 0; i < n; i++) {
    const px_named_tensor *t = px_safetensors_get(f, i);
    const unsigned char *p = t->tensor.data;
    if (prev_end) CHECK(p == prev_end, "tensor %d (%s) does not follow the previous one", i, t->name);
    CHECK(px_dtype_size(t->tensor.dtype) <= prev_size, "%s: element size grows along the file", t->name);
    prev_size = px_dtype_size(t->tensor.dtype);
    prev_end = p + px_tensor_nbytes(&t->tensor);
  }
  px_safetensors_close(f);

  size_t file_len;
  unsigned char *bytes = read_all(path, &file_len);
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | bytes[i];
  CHECK(hlen % 8 == 0, "header length %llu not a multiple of 8", (unsigned long long)hlen);
  CHECK(memcmp(bytes + 8, "{\"__metadata__\":{\"format\":\"pt\",\"note\":", 38) == 0, "header starts %.40s", bytes + 8);
  size_t data_bytes = 0;
  for (int i = 0; i < n; i++) data_bytes += px_tensor_nbytes(&items[i].tensor);
  CHECK(file_len == 8 + hlen + data_bytes, "file %zu bytes, expected %llu", file_len,
        (unsigned long long)(8 + hlen + data_bytes));

  // The same tensors handed over in another order give the same file.
  px_named_tensor reversed[N_TENSORS];
  for (int i = 0; i < n; i++) reversed[i] = items[n - 1 - i];
  px_state_dict sd_rev = {reversed, n};
  px_kv meta_rev[2] = {meta[1], meta[0]};
  char path2[512];
  path_in(path2, sizeof path2, "reversed.safetensors");
  CHECK_OK(px_safetensors_save(path2, &sd_rev, meta_rev, 2));
  size_t len2;
  unsigned char *bytes2 = read_all(path2, &len2);
  CHECK(len2 == file_len && memcmp(bytes, bytes2, file_len) == 0, "file depends on the state dict's order");
  free(bytes2);
  free(bytes);

  // Load into a second model (sentinel-filled): strict, everything copied.
  px_named_tensor dst[N_TENSORS];
  for (int i = 0; i < n; i++) {
    dst[i] = items[i];
    CHECK_OK(px_tensor_new(&dst[i].tensor, items[i].tensor.dtype, items[i].tensor.ndim, items[i].tensor.shape));
    memset(dst[i].tensor.data, 0xAB, px_tensor_nbytes(&dst[i].tensor));
  }
  px_state_dict sd_dst = {dst, n};
  CHECK_OK(px_safetensors_load(path, &sd_dst, true));
  for (int i = 0; i < n; i++) {
    size_t nb = px_tensor_nbytes(&items[i].tensor);
    CHECK(nb == 0 || memcmp(dst[i].tensor.data, items[i].tensor.data, nb) == 0, "%s: loaded bytes differ", dst[i].name);
  }

  // Non-strict: a model with a subset of the file's tensors loads that subset.
  px_state_dict sd_sub = {dst + 2, 3};
  for (int i = 2; i < 5; i++) memset(dst[i].tensor.data, 0, px_tensor_nbytes(&dst[i].tensor));
  CHECK_OK(px_safetensors_load(path, &sd_sub, false));
  for (int i = 2; i < 5; i++)
    CHECK(memcmp(dst[i].tensor.data, items[i].tensor.data, px_tensor_nbytes(&items[i].tensor)) == 0, "%s: subset load",
          dst[i].name);

  // PyTorch's BatchNorm counter in the file does not fail a strict load of a
  // model that keeps no such buffer.
  int64_t tracked = 1234;
  px_named_tensor with_bn[2] = {items[0], {.name = "bn.num_batches_tracked"}};
  with_bn[1].tensor = px_tensor_view(&tracked, PX_I64, 0, NULL);
  px_state_dict sd_bn = {with_bn, 2};
  char path3[512];
  path_in(path3, sizeof path3, "bn.safetensors");
  CHECK_OK(px_safetensors_save(path3, &sd_bn, NULL, 0));
  px_state_dict sd_no_bn = {dst, 1};
  memset(dst[0].tensor.data, 0, px_tensor_nbytes(&dst[0].tensor));
  CHECK_OK(px_safetensors_load(path3, &sd_no_bn, true));
  CHECK(memcmp(dst[0].tensor.data, items[0].tensor.data, px_tensor_nbytes(&items[0].tensor)) == 0, "bn file load");
  CHECK_OK(px_safetensors_open(path3, &f));
  const px_named_tensor *bn = px_safetensors_find(f, "bn.num_batches_tracked");
  int64_t got = 0;
  if (bn) memcpy(&got, bn->tensor.data, sizeof got);
  CHECK(bn && bn->tensor.ndim == 0 && got == 1234, "0-d I64 read back as %lld", (long long)got);
  CHECK(px_safetensors_metadata(f, "format") == NULL, "no metadata was written");
  px_safetensors_close(f);

  // An empty state dict is a valid file: "{}" padded to 8.
  px_state_dict none = {NULL, 0};
  char path4[512];
  path_in(path4, sizeof path4, "empty.safetensors");
  CHECK_OK(px_safetensors_save(path4, &none, NULL, 0));
  CHECK_OK(px_safetensors_open(path4, &f));
  CHECK(px_safetensors_count(f) == 0, "empty file has %d tensors", px_safetensors_count(f));
  px_safetensors_close(f);

  for (int i = 0; i < n; i++) {
    px_tensor_free(&items[i].tensor);
    px_tensor_free(&dst[i].tensor);
  }
  remove_dir();
  return px_test_finish("test_safetensors_roundtrip_preserves_tensors");
}
