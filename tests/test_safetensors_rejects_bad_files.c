/* Claim: px_safetensors_load refuses every file that does not fit the model
 * or is not a well-formed safetensors file (missing tensor, wrong shape,
 * wrong dtype, extra tensor under strict, truncated body, lying offsets,
 * oversize header length, malformed JSON, ...) with the right status code
 * and a message that names the file and the tensor, and it leaves the
 * model's memory untouched: the checks all come before the first copy.  If
 * this failed, a bad checkpoint would half-load into a model, or crash the
 * reader, or leave the user guessing which tensor was wrong. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdint.h>
#include <string.h>
#include <unistd.h>

static char dir[64];
static char path[256];

// The model: a 2-layer MLP's state, every byte set to a sentinel.
#define SENTINEL 0x5A
static float w0[4 * 2], b0[4], w1[1 * 4];
static const int64_t s_w0[2] = {4, 2}, s_b0[1] = {4}, s_w1[2] = {1, 4};
static px_named_tensor model_items[3];
static px_state_dict model = {model_items, 3};

static void fill_sentinel(void) {
  memset(w0, SENTINEL, sizeof w0);
  memset(b0, SENTINEL, sizeof b0);
  memset(w1, SENTINEL, sizeof w1);
}

static bool untouched(void) {
  const unsigned char *bufs[3] = {(const unsigned char *)w0, (const unsigned char *)b0, (const unsigned char *)w1};
  const size_t lens[3] = {sizeof w0, sizeof b0, sizeof w1};
  for (int k = 0; k < 3; k++)
    for (size_t i = 0; i < lens[k]; i++)
      if (bufs[k][i] != SENTINEL) return false;
  return true;
}

// Writes le64(header_len) | json | body: the length field may lie.
static void write_raw(const char *json, uint64_t header_len, const void *body, size_t body_len) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(1);
  }
  size_t n = strlen(json);
  uint64_t hl = header_len;
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)(hl >> (8 * i));
  fwrite(len, 1, 8, f);
  fwrite(json, 1, n, f);
  if (body_len) fwrite(body, 1, body_len, f);
  fclose(f);
}

static unsigned char zeros[4096];

static void write_json(const char *json, size_t body_len) { write_raw(json, strlen(json), zeros, body_len); }

// Loads `path` into the model and checks status, message and memory.
// `name` (may be NULL) must appear in the message, as must the file name.
static void expect_reject_at(int line, bool strict, px_status want, const char *name, const char *also) {
  fill_sentinel();
  px_clear_error();
  px_status st = px_safetensors_load(path, &model, strict);
  const char *msg = px_last_error();
  if (getenv("PX_TEST_VERBOSE")) fprintf(stderr, "line %d: %s\n", line, msg);
  CHECK(st == want, "line %d: status %s, expected %s; message: %s", line, px_status_name(st), px_status_name(want),
        msg);
  CHECK(strstr(msg, path) != NULL, "line %d: message does not name the file: %s", line, msg);
  if (name) CHECK(strstr(msg, name) != NULL, "line %d: message does not name \"%s\": %s", line, name, msg);
  if (also) CHECK(strstr(msg, also) != NULL, "line %d: message lacks \"%s\": %s", line, also, msg);
  CHECK(untouched(), "line %d: the model's memory changed on a failed load", line);
  // Opening alone must agree for file-level problems (not model mismatches).
  if (want != PX_ERR_NOT_FOUND && want != PX_ERR_SHAPE && strstr(msg, "expects") == NULL &&
      strstr(msg, "not in the model") == NULL) {
    px_safetensors *f = (px_safetensors *)1;
    CHECK(px_safetensors_open(path, &f) == want && f == NULL, "line %d: open accepted what load refused", line);
  }
}
#define expect_reject(strict, want, name, also) expect_reject_at(__LINE__, strict, want, name, also)

// Saves a state dict of (name, dtype, shape) views over `zeros`.
typedef struct spec {
  const char *name;
  px_dtype dtype;
  int ndim;
  int64_t shape[4];
} spec;

static void save_specs(const spec *s, int n) {
  px_named_tensor items[8];
  for (int i = 0; i < n; i++) {
    memset(&items[i], 0, sizeof items[i]);
    snprintf(items[i].name, PX_NAME_MAX, "%s", s[i].name);
    items[i].tensor = px_tensor_view(zeros, s[i].dtype, s[i].ndim, s[i].shape);
  }
  px_state_dict sd = {items, n};
  CHECK_OK(px_safetensors_save(path, &sd, NULL, 0));
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_st_reject_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  memset(model_items, 0, sizeof model_items);
  snprintf(model_items[0].name, PX_NAME_MAX, "0.weight");
  model_items[0].tensor = px_tensor_view(w0, PX_F32, 2, s_w0);
  snprintf(model_items[1].name, PX_NAME_MAX, "0.bias");
  model_items[1].tensor = px_tensor_view(b0, PX_F32, 1, s_b0);
  snprintf(model_items[2].name, PX_NAME_MAX, "1.weight");
  model_items[2].tensor = px_tensor_view(w1, PX_F32, 2, s_w1);

  const spec good[3] = {{"0.weight", PX_F32, 2, {4, 2}}, {"0.bias", PX_F32, 1, {4}}, {"1.weight", PX_F32, 2, {1, 4}}};

  /* ---- files that do not fit the model ---- */
  // Missing tensor: the two present ones must not be copied either.
  save_specs(good, 2);
  expect_reject(true, PX_ERR_NOT_FOUND, "\"1.weight\"", "missing");
  expect_reject(false, PX_ERR_NOT_FOUND, "\"1.weight\"", "missing");
  // Wrong shape, printed both ways.
  const spec wrong_shape[3] = {{"0.weight", PX_F32, 2, {2, 4}}, good[1], good[2]};
  save_specs(wrong_shape, 3);
  expect_reject(true, PX_ERR_SHAPE, "\"0.weight\"", "has shape (2, 4) but the model expects (4, 2)");
  // Wrong dtype, named both ways.
  const spec wrong_dtype[3] = {good[0], {"0.bias", PX_F64, 1, {4}}, good[2]};
  save_specs(wrong_dtype, 3);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "has dtype F64 but the model expects F32");
  // Two problems: the first is the message, the rest are counted.
  const spec two_wrong[3] = {{"0.weight", PX_F32, 1, {8}}, {"0.bias", PX_I32, 1, {4}}, good[2]};
  save_specs(two_wrong, 3);
  expect_reject(true, PX_ERR_SHAPE, "\"0.weight\"", "(and 1 more mismatch)");
  // An extra tensor: refused under strict, ignored otherwise; PyTorch's
  // BatchNorm counter is never an error.
  const spec extra[5] = {good[0],
                         good[1],
                         good[2],
                         {"2.weight", PX_F32, 1, {3}},
                         {"bn.num_batches_tracked", PX_I64, 0, {0}}};
  save_specs(extra, 5);
  expect_reject(true, PX_ERR_FORMAT, "\"2.weight\"", "not in the model");
  fill_sentinel();
  CHECK_OK(px_safetensors_load(path, &model, false));
  CHECK(w0[0] == 0.0f && b0[3] == 0.0f && w1[3] == 0.0f, "non-strict load with an extra tensor did not copy");

  /* ---- files that are damaged or lie ---- */
  // Truncated: the good file cut 5 bytes short; the last tensor in the file
  // ("1.weight": all F32, so by name) reaches past the end.
  save_specs(good, 3);
  {
    FILE *f = fopen(path, "rb");
    unsigned char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    f = fopen(path, "wb");
    fwrite(buf, 1, n - 5, f);
    fclose(f);
    expect_reject(true, PX_ERR_FORMAT, "\"1.weight\"", "truncated");
    // Cut inside the header: the declared length exceeds what is left.
    f = fopen(path, "wb");
    fwrite(buf, 1, 30, f);
    fclose(f);
    expect_reject(true, PX_ERR_FORMAT, NULL, "truncated");
    // Shorter than the length field itself; an empty file.
    f = fopen(path, "wb");
    fwrite(buf, 1, 5, f);
    fclose(f);
    expect_reject(true, PX_ERR_FORMAT, NULL, "too short");
    f = fopen(path, "wb");
    fclose(f);
    expect_reject(true, PX_ERR_FORMAT, NULL, "0 bytes");
  }
  // Header length larger than the file, and over the 100 MB limit.
  write_raw("{}", 1000, NULL, 0);
  expect_reject(true, PX_ERR_FORMAT, NULL, "1000 bytes");
  write_raw("{}", 200000000, NULL, 0);
  expect_reject(true, PX_ERR_FORMAT, NULL, "100 MB");
  write_raw("{}", UINT64_MAX - 1, NULL, 0);
  expect_reject(true, PX_ERR_FORMAT, NULL, "100 MB");

  // Offsets that lie.
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,1000]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "[0, 1000]");
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,12]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "need 16 bytes");
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "begin <= end");
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,8,16]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "expected 2");
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"1.weight\":{\"dtype\":\"F32\",\"shape\":[1,4],\"data_offsets\":[8,24]},"
             "\"0.weight\":{\"dtype\":\"F32\",\"shape\":[4,2],\"data_offsets\":[24,56]}}",
             56);
  expect_reject(true, PX_ERR_FORMAT, "\"1.weight\"", "overlap");
  // A tensor inside another one that lies further on.
  write_json("{\"0.weight\":{\"dtype\":\"F32\",\"shape\":[4,2],\"data_offsets\":[0,32]},"
             "\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[40,56]},"
             "\"1.weight\":{\"dtype\":\"F32\",\"shape\":[1,4],\"data_offsets\":[36,52]}}",
             56);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "\"1.weight\"");
  // Shape whose byte size overflows 64 bits, and one too large for int64.
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4],\"data_offsets\":[0,16]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "overflows");
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[18446744073709551615],\"data_offsets\":[0,16]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "2^63");
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,99999999999999999999999]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "64 bits");

  // Entries that are not what they should be.
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "found -4");
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4.0],\"data_offsets\":[0,16]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "integer");
  write_json("{\"0.bias\":{\"dtype\":\"F33\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "unknown dtype \"F33\"");
  write_json("{\"0.bias\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", 16);
  expect_reject(true, PX_ERR_UNSUPPORTED, "\"0.bias\"", "F8_E4M3");
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,4],\"data_offsets\":[0,16]}}", 16);
  expect_reject(true, PX_ERR_UNSUPPORTED, "\"0.bias\"", "5 dimensions");
  write_json("{\"0.bias\":{\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "no \"dtype\"");
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "twice");
  write_json("{\"0.bias\":{\"dtype\":32,\"shape\":[4],\"data_offsets\":[0,16]}}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "expected a string");
  write_json("{\"0.bias\":[4]}", 16);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "expected '{'");
  write_json("{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}",
             32);
  expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "twice");
  write_json("{\"__metadata__\":{\"a\":\"1\"},\"__metadata__\":{}}", 0);
  expect_reject(true, PX_ERR_FORMAT, NULL, "__metadata__");
  write_json("{\"__metadata__\":{\"a\":\"1\",\"a\":\"2\"}}", 0);
  expect_reject(true, PX_ERR_FORMAT, "\"a\"", "twice");
  write_json("{\"__metadata__\":{\"epoch\":3}}", 0);
  expect_reject(true, PX_ERR_FORMAT, "\"epoch\"", "expected a string");
  {
    // Nesting deep enough to exhaust a naive recursive parser's stack.
    static char deep[300000];
    int k = snprintf(deep, sizeof deep, "{\"0.bias\":{\"x\":");
    for (int i = 0; i < 100000; i++) deep[k++] = '[';
    deep[k] = '\0';
    write_json(deep, 0);
    expect_reject(true, PX_ERR_FORMAT, "\"0.bias\"", "nested");
  }

  // Not JSON, or not the JSON safetensors needs.
  static const char *const garbage[] = {
    "not json at all",
    "",
    "[1, 2, 3]",
    "{\"0.bias\": ",
    "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},}",
    "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}} trailing",
    "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}\0\0\0",
    "{0.bias:{}}",
    "{'0.bias':{}}",
    "{\"0.bias\" {}}",
    "{\"bad \\x escape\":{}}",
    "{\"lone \\ud800 surrogate\":{}}",
    "{\"nul \\u0000 inside\":{}}",
    "{\"raw\ncontrol\":{}}",
    "{\"bad utf8 \xc3\x28\":{}}",
    "{\"overlong \xc0\xaf\":{}}",
    "{\"unterminated",
    "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4,],\"data_offsets\":[0,16]}}",
    "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[04],\"data_offsets\":[0,16]}}",
    "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16],\"x\":tru}}",
    "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16],\"x\":1.}}",
    "{\"0.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16],\"x\":-}}",
  };
  for (size_t i = 0; i < sizeof garbage / sizeof garbage[0]; i++) {
    // The NUL-padded one: write its bytes explicitly.
    if (strstr(garbage[i], "}}") && i == 6) {
      const char *g = garbage[i];
      size_t n = strlen(g) + 3;
      FILE *f = fopen(path, "wb");
      unsigned char len[8] = {(unsigned char)n, 0, 0, 0, 0, 0, 0, 0};
      fwrite(len, 1, 8, f);
      fwrite(g, 1, n, f);
      fwrite(zeros, 1, 16, f);
      fclose(f);
    } else {
      write_json(garbage[i], 16);
    }
    fill_sentinel();
    px_status st = px_safetensors_load(path, &model, true);
    const char *msg = px_last_error();
    if (getenv("PX_TEST_VERBOSE")) fprintf(stderr, "garbage %zu: %s\n", i, msg);
    CHECK(st == PX_ERR_FORMAT, "garbage %zu: status %s (%s)", i, px_status_name(st), msg);
    CHECK(strstr(msg, path) != NULL && strstr(msg, "header"), "garbage %zu: message %s", i, msg);
    CHECK(untouched(), "garbage %zu: memory changed", i);
  }

  // Files that are not there, or not files.
  char missing[300];
  snprintf(missing, sizeof missing, "%s/does-not-exist.safetensors", dir);
  px_status st = px_safetensors_load(missing, &model, true);
  CHECK(st == PX_ERR_IO && strstr(px_last_error(), missing) && strstr(px_last_error(), "No such file"),
        "missing file: %s: %s", px_status_name(st), px_last_error());
  st = px_safetensors_load(dir, &model, true);
  CHECK(st == PX_ERR_IO && strstr(px_last_error(), dir), "a directory: %s: %s", px_status_name(st), px_last_error());

  // And the good file still loads into the same model.
  save_specs(good, 3);
  fill_sentinel();
  CHECK_OK(px_safetensors_load(path, &model, true));
  CHECK(w0[7] == 0.0f && b0[0] == 0.0f && w1[0] == 0.0f, "good file did not load");

  // Saving refuses state dicts it could not write faithfully.
  px_named_tensor dup[2] = {model_items[0], model_items[0]};
  px_state_dict sd_dup = {dup, 2};
  CHECK(px_safetensors_save(path, &sd_dup, NULL, 0) == PX_ERR_INVALID && strstr(px_last_error(), "0.weight"),
        "duplicate names saved: %s", px_last_error());
  px_named_tensor reserved = model_items[0];
  snprintf(reserved.name, PX_NAME_MAX, "__metadata__");
  px_state_dict sd_res = {&reserved, 1};
  CHECK(px_safetensors_save(path, &sd_res, NULL, 0) == PX_ERR_INVALID, "\"__metadata__\" saved as a tensor name");
  px_kv kv2[2] = {{"k", "1"}, {"k", "2"}};
  CHECK(px_safetensors_save(path, &model, kv2, 2) == PX_ERR_INVALID, "duplicate metadata keys saved");

  remove(path);
  rmdir(dir);
  return px_test_finish("test_safetensors_rejects_bad_files");
}
