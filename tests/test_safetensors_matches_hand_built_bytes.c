/* Claim: plexus reads safetensors files that it did not write, and writes
 * the bytes the format's reference serializer (Hugging Face's safetensors,
 * the one PyTorch uses) writes.  The files here are built by hand, byte by
 * byte: 8-byte little-endian header length, JSON, data.  The first ones are
 * the reference serializer's own known outputs; the last is what another
 * writer may legally produce (keys in any order, whitespace, escapes, an
 * unknown field, a gap, an unpadded header so the data is unaligned).  If
 * this failed, plexus would only agree with itself, not with PyTorch. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

static char dir[64];
static char path[256], path_ours[256];

// Writes le64(strlen(json)) | json | body.
static void write_file(const char *p, const char *json, const void *body, size_t body_len) {
  FILE *f = fopen(p, "wb");
  if (!f) {
    perror(p);
    exit(1);
  }
  size_t n = strlen(json);
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)n >> (8 * i));
  fwrite(len, 1, 8, f);
  fwrite(json, 1, n, f);
  if (body_len) fwrite(body, 1, body_len, f);
  fclose(f);
}

static bool same_file(const char *a, const char *b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  bool same = fa && fb;
  while (same) {
    int ca = fgetc(fa), cb = fgetc(fb);
    if (ca != cb) same = false;
    if (ca == EOF || cb == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

static void le32f(unsigned char *o, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  for (int i = 0; i < 4; i++) o[i] = (unsigned char)(u >> (8 * i));
}

// The reference serializer's output for one F32 tensor holding 0..5: the
// file it writes, then what plexus reads from it and writes for it.
static void check_reference_f32(const char *name, int ndim, const int64_t *shape, const char *json) {
  unsigned char body[24];
  for (int i = 0; i < 6; i++) le32f(body + 4 * i, (float)i);
  write_file(path, json, body, sizeof body);

  px_safetensors *f;
  CHECK_OK(px_safetensors_open(path, &f));
  const px_named_tensor *t = px_safetensors_find(f, name);
  CHECK(t != NULL && px_safetensors_count(f) == 1, "%s: not read", name);
  if (t) {
    CHECK(t->tensor.dtype == PX_F32 && t->tensor.ndim == ndim, "%s: dtype %s ndim %d", name,
          px_dtype_name(t->tensor.dtype), t->tensor.ndim);
    for (int d = 0; d < ndim && d < t->tensor.ndim; d++)
      CHECK(t->tensor.shape[d] == shape[d], "%s: shape[%d]", name, d);
    float v[6];
    memcpy(v, t->tensor.data, sizeof v);
    for (int i = 0; i < 6; i++) CHECK(v[i] == (float)i, "%s: element %d = %g", name, i, v[i]);
  }
  px_safetensors_close(f);

  float data[6] = {0, 1, 2, 3, 4, 5};
  px_named_tensor item = {.tensor = px_tensor_view(data, PX_F32, ndim, shape)};
  snprintf(item.name, PX_NAME_MAX, "%s", name);
  px_state_dict sd = {&item, 1};
  CHECK_OK(px_safetensors_save(path_ours, &sd, NULL, 0));
  CHECK(same_file(path, path_ours), "%s: plexus wrote other bytes than the reference serializer", name);
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_st_bytes_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path, sizeof path, "%s/theirs.safetensors", dir);
  snprintf(path_ours, sizeof path_ours, "%s/ours.safetensors", dir);

  // Header of exactly 64 bytes: no padding.
  const int64_t s123[3] = {1, 2, 3}, s1123[4] = {1, 1, 2, 3};
  const char *j1 = "{\"attn.0\":{\"dtype\":\"F32\",\"shape\":[1,2,3],\"data_offsets\":[0,24]}}";
  CHECK(strlen(j1) == 64, "header 1 is %zu bytes", strlen(j1));
  check_reference_f32("attn.0", 3, s123, j1);
  // 65 bytes of JSON padded with 7 spaces to 72, so the floats are aligned.
  const char *j2 = "{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       ";
  CHECK(strlen(j2) == 72, "header 2 is %zu bytes", strlen(j2));
  check_reference_f32("attn0", 4, s1123, j2);

  // No tensors: "{}" and six spaces; with one metadata pair: 35 + 5 spaces.
  px_state_dict none = {NULL, 0};
  write_file(path, "{}      ", NULL, 0);
  CHECK_OK(px_safetensors_save(path_ours, &none, NULL, 0));
  CHECK(same_file(path, path_ours), "empty file differs");
  write_file(path, "{\"__metadata__\":{\"framework\":\"pt\"}}     ", NULL, 0);
  px_kv fw = {"framework", "pt"};
  CHECK_OK(px_safetensors_save(path_ours, &none, &fw, 1));
  CHECK(same_file(path, path_ours), "metadata-only file differs");
  px_safetensors *f;
  CHECK_OK(px_safetensors_open(path, &f));
  CHECK(px_safetensors_count(f) == 0, "count");
  const char *fv = px_safetensors_metadata(f, "framework");
  CHECK(fv && strcmp(fv, "pt") == 0, "framework = %s", fv ? fv : "(null)");
  px_safetensors_close(f);

  // Several dtypes: the reference serializer orders tensors by descending
  // dtype (U64 I64 F64 F32 U32 I32 BF16 F16 U16 I16 I8 U8 BOOL), then name,
  // so each stays aligned; the JSON lists them in that order.
  {
    const char *json = "{\"d\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]},"
                       "\"c\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]},"
                       "\"e\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[16,20]},"
                       "\"b\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[20,24]},"
                       "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[24,27]}}";
    char padded[512];
    size_t jl = strlen(json), pl = (jl + 7) / 8 * 8;
    memcpy(padded, json, jl);
    memset(padded + jl, ' ', pl - jl);
    padded[pl] = '\0';
    int64_t d = -5;
    double c = 2.5;
    float e = -1.25f;
    uint16_t b[2] = {0x3C00, 0xC000};  // 1.0 and -2.0 in IEEE half
    uint8_t a[3] = {1, 2, 255};
    unsigned char body[27];
    memcpy(body, &d, 8);  // little-endian host, as the format
    memcpy(body + 8, &c, 8);
    memcpy(body + 16, &e, 4);
    memcpy(body + 20, b, 4);
    memcpy(body + 24, a, 3);
    write_file(path, padded, body, sizeof body);

    const int64_t one = 1, two = 2, three = 3;
    px_named_tensor items[5] = {{"a", px_tensor_view(a, PX_U8, 1, &three)},
                                {"b", px_tensor_view(b, PX_F16, 1, &two)},
                                {"c", px_tensor_view(&c, PX_F64, 1, &one)},
                                {"d", px_tensor_view(&d, PX_I64, 1, &one)},
                                {"e", px_tensor_view(&e, PX_F32, 1, &one)}};
    px_state_dict sd = {items, 5};
    CHECK_OK(px_safetensors_save(path_ours, &sd, NULL, 0));
    CHECK(same_file(path, path_ours), "mixed-dtype file differs from the reference layout");

    int64_t d2 = 0;
    double c2 = 0;
    float e2 = 0;
    uint16_t b2[2] = {0, 0};
    uint8_t a2[3] = {0, 0, 0};
    px_named_tensor into[5] = {{"a", px_tensor_view(a2, PX_U8, 1, &three)},
                               {"b", px_tensor_view(b2, PX_F16, 1, &two)},
                               {"c", px_tensor_view(&c2, PX_F64, 1, &one)},
                               {"d", px_tensor_view(&d2, PX_I64, 1, &one)},
                               {"e", px_tensor_view(&e2, PX_F32, 1, &one)}};
    px_state_dict sd_into = {into, 5};
    CHECK_OK(px_safetensors_load(path, &sd_into, true));
    CHECK(d2 == -5 && c2 == 2.5 && e2 == -1.25f && b2[0] == 0x3C00 && b2[1] == 0xC000 && a2[0] == 1 && a2[2] == 255,
          "mixed-dtype values read back wrong");
  }

  // What another writer may produce.  Header length is odd (no padding), so
  // the F64 at body offset 0 sits at an odd address: readers must memcpy.
  {
    const char *json =
      "{\n"
      "  \"z.last\": {\"shape\": [2], \"dtype\": \"U16\", \"data_offsets\": [20, 24],\n"
      "             \"extra\": {\"a\": [1, -2.5e3, 0.5E+2, true, false, null, \"s\\n\", {}, []]}},\n"
      "  \"caf\\u00e9 \\ud83d\\ude00\": {\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[0,8]},\n"
      "  \"__metadata__\": {\"k\\\"ey\": \"v\\\\al\\u00E9\\/\", \"empty\": \"\"},\n"
      "  \"ints\" : { \"dtype\" : \"I32\" , \"shape\" : [ 1 , 2 ] , \"data_offsets\" : [ 8 , 16 ] } ,\n"
      "  \"nothing\": {\"dtype\": \"BF16\", \"shape\": [0, 4], \"data_offsets\": [16, 16]}\n"
      "}";
    char header[1024];
    snprintf(header, sizeof header, "%s%s", json, strlen(json) % 2 ? "" : "\n");  // odd length
    unsigned char body[24];
    double pi = 3.5;
    int32_t ints[2] = {-7, 123456};
    uint16_t u16[2] = {1, 65535};
    memcpy(body, &pi, 8);
    memcpy(body + 8, ints, 8);
    memset(body + 16, 0xEE, 4);  // a gap no tensor claims
    memcpy(body + 20, u16, 4);
    write_file(path, header, body, sizeof body);

    CHECK_OK(px_safetensors_open(path, &f));
    CHECK(px_safetensors_count(f) == 4, "count %d", px_safetensors_count(f));
    const char *cafe = "caf\xc3\xa9 \xf0\x9f\x98\x80";
    const px_named_tensor *t = px_safetensors_find(f, cafe);
    CHECK(t && t->tensor.dtype == PX_F64 && t->tensor.ndim == 0, "escaped name or 0-d F64");
    if (t) {
      CHECK((uintptr_t)t->tensor.data % 2 == 1, "the test meant the F64 to be unaligned");
      double got;
      memcpy(&got, t->tensor.data, 8);
      CHECK(got == 3.5, "F64 = %g", got);
    }
    t = px_safetensors_find(f, "ints");
    CHECK(t && t->tensor.dtype == PX_I32 && t->tensor.ndim == 2 && t->tensor.shape[0] == 1 && t->tensor.shape[1] == 2,
          "ints");
    if (t) {
      int32_t got[2];
      memcpy(got, t->tensor.data, 8);
      CHECK(got[0] == -7 && got[1] == 123456, "ints = %d %d", got[0], got[1]);
    }
    t = px_safetensors_find(f, "z.last");
    if (t) {
      uint16_t got[2];
      memcpy(got, t->tensor.data, 4);
      CHECK(got[0] == 1 && got[1] == 65535, "u16 = %u %u", got[0], got[1]);
    }
    CHECK(t != NULL, "z.last");
    t = px_safetensors_find(f, "nothing");
    CHECK(t && t->tensor.dtype == PX_BF16 && t->tensor.shape[0] == 0 && t->tensor.shape[1] == 4, "empty BF16");
    // Header order is kept.
    CHECK(strcmp(px_safetensors_get(f, 0)->name, "z.last") == 0 &&
            strcmp(px_safetensors_get(f, 3)->name, "nothing") == 0,
          "header order");
    const char *mv = px_safetensors_metadata(f, "k\"ey");
    CHECK(mv && strcmp(mv, "v\\al\xc3\xa9/") == 0, "metadata value %s", mv ? mv : "(null)");
    mv = px_safetensors_metadata(f, "empty");
    CHECK(mv && mv[0] == '\0', "empty metadata value");
    px_safetensors_close(f);

    // A model holding these tensors loads them strictly; the empty one has
    // no memory at all.
    double pi2 = 0;
    int32_t ints2[2] = {0, 0};
    uint16_t u2[2] = {0, 0};
    const int64_t s12[2] = {1, 2}, s2 = 2, s04[2] = {0, 4};
    px_named_tensor m[4] = {{"ints", px_tensor_view(ints2, PX_I32, 2, s12)},
                            {"z.last", px_tensor_view(u2, PX_U16, 1, &s2)},
                            {"nothing", px_tensor_view(NULL, PX_BF16, 2, s04)},
                            {"", px_tensor_view(&pi2, PX_F64, 0, NULL)}};
    snprintf(m[3].name, PX_NAME_MAX, "%s", cafe);
    px_state_dict sd = {m, 4};
    CHECK_OK(px_safetensors_load(path, &sd, true));
    CHECK(pi2 == 3.5 && ints2[1] == 123456 && u2[1] == 65535, "loaded values");
  }

  remove(path);
  remove(path_ours);
  rmdir(dir);
  return px_test_finish("test_safetensors_matches_hand_built_bytes");
}
