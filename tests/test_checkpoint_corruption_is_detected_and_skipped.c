/* Claim: any damage to a checkpoint makes px_checkpoint_verify fail with
 * PX_ERR_FORMAT and a message that names the checkpoint and the file (and,
 * for changed bytes, the expected and the found SHA-256): a flipped byte or
 * a truncation of any file, a missing file, a missing, empty, truncated or
 * malformed SHA256SUMS, a listed name with '/' or "..", a file SHA256SUMS
 * does not list.  px_checkpoint_latest then skips the damaged checkpoint,
 * says why in its note, and returns the previous one; loads from the
 * damaged one fail and leave the model untouched.  If it failed, a run
 * could resume from silently corrupted weights, or refuse to resume when a
 * good older checkpoint exists. */
#include "ckpt_test_util.h"

#include "io/sha256.h"

static char root[64];
static int case_no;

typedef enum { FLIP, FLIP_FIRST, TRUNCATE, REMOVE } damage_kind;
static const char *damage_name[] = {"a flipped byte", "a flipped first byte", "a truncation", "a missing file"};

// A fresh run directory with good step 1 and step 2; returns step 2's path.
static void fresh_run(char *dir, size_t dcap, char *step2, size_t scap) {
  snprintf(dir, dcap, "%s/case%02d", root, case_no++);
  ckpt_state s1, s2;
  ckpt_state_init(&s1, 1);
  ckpt_state_init(&s2, 2);
  CHECK_OK(px_checkpoint_write(dir, 1, s1.items, 3, 0, NULL, 0));
  CHECK_OK(px_checkpoint_write(dir, 2, s2.items, 3, 0, step2, scap));
  CHECK_OK(px_checkpoint_verify(step2));
}

static const char *hash_of(const char *path, char hex[PX_SHA256_HEX]) {
  unsigned char d[PX_SHA256_BYTES];
  if (px_sha256_file(path, d, NULL) != PX_OK) return "(unreadable)";
  px_sha256_hex(d, hex);
  return hex;
}

// Verify fails naming ckpt and every word in needles; latest falls back to
// step 1 with a note naming step 2 and the first needle; with loads_fail,
// some file of it no longer loads.
static void expect_damage_(const char *dir, const char *ckpt, const char *what, const char *const *needles, int n,
                           bool loads_fail) {
  px_status st = px_checkpoint_verify(ckpt);
  char msg[1100];
  snprintf(msg, sizeof msg, "%s", px_last_error());
  CHECK(st == PX_ERR_FORMAT, "%s: verify returned %s: %s", what, px_status_name(st), msg);
  CHECK(strstr(msg, ckpt) != NULL, "%s: the message does not name the checkpoint: %s", what, msg);
  for (int i = 0; i < n; i++)
    CHECK(strstr(msg, needles[i]) != NULL, "%s: the message does not say \"%s\": %s", what, needles[i], msg);

  char path[512], note[4096], want[512];
  CHECK_OK(px_checkpoint_latest(dir, path, sizeof path, note, sizeof note));
  snprintf(want, sizeof want, "%s/step_00000001", dir);
  CHECK(strcmp(path, want) == 0, "%s: latest is %s, expected %s", what, path, want);
  CHECK(strstr(note, "step_00000002") && strstr(note, needles[0]) && !strstr(note, "step_00000001"),
        "%s: the note does not say why step 2 was skipped: %s", what, note);

  // A load from the damaged checkpoint fails whole: nothing is copied.
  ckpt_state into, zero;
  ckpt_state_init(&into, 0);
  ckpt_state_zero(&into);
  zero = into;
  px_status a = px_checkpoint_load_tensors(ckpt, "model.safetensors", &into.model, true);
  px_status b = px_checkpoint_load_tensors(ckpt, "optim.safetensors", &into.optim, true);
  void *bytes = NULL;
  size_t nb;
  px_status c = px_checkpoint_read_file(ckpt, "state.json", &bytes, &nb);
  free(bytes);
  if (loads_fail)
    CHECK(a != PX_OK || b != PX_OK || c != PX_OK, "%s: every file of the damaged checkpoint still loads", what);
  if (a != PX_OK) CHECK(!memcmp(into.w, zero.w, sizeof zero.w), "%s: a failed load changed the model", what);
}

static void expect_damage(const char *dir, const char *ckpt, const char *what, const char *const *needles, int n) {
  expect_damage_(dir, ckpt, what, needles, n, true);
}

static void damage_file(const char *name, damage_kind kind) {
  char dir[256], ckpt[512], path[700], what[128], want[PX_SHA256_HEX], found[PX_SHA256_HEX];
  fresh_run(dir, sizeof dir, ckpt, sizeof ckpt);
  snprintf(path, sizeof path, "%s/%s", ckpt, name);
  snprintf(what, sizeof what, "%s in %s", damage_name[kind], name);
  hash_of(path, want);
  long size = ckpt_file_size(path);
  switch (kind) {
  case FLIP: CHECK(ckpt_flip_byte(path, size / 2), "flip"); break;
  case FLIP_FIRST: CHECK(ckpt_flip_byte(path, 0), "flip"); break;
  case TRUNCATE: CHECK(truncate(path, size - 1) == 0, "truncate"); break;
  case REMOVE: CHECK(unlink(path) == 0, "unlink"); break;
  }
  char quoted[300];
  snprintf(quoted, sizeof quoted, "\"%s\"", name);
  if (kind == REMOVE) {
    const char *needles[] = {quoted, "missing", want};
    expect_damage(dir, ckpt, what, needles, 3);
  } else {
    hash_of(path, found);
    const char *needles[] = {quoted, want, found};
    expect_damage(dir, ckpt, what, needles, 3);
    // The load of that very file names the mismatch too.
    if (strstr(name, ".safetensors")) {
      ckpt_state into;
      ckpt_state_init(&into, 0);
      ckpt_state_zero(&into);
      const px_state_dict *sd = strstr(name, "model") ? &into.model : &into.optim;
      CHECK(px_checkpoint_load_tensors(ckpt, name, sd, true) == PX_ERR_FORMAT && strstr(px_last_error(), want) &&
              strstr(px_last_error(), found),
            "%s: load_tensors: %s", what, px_last_error());
      ckpt_state zero;
      ckpt_state_init(&zero, 0);
      ckpt_state_zero(&zero);
      CHECK(ckpt_state_equal(&into, &zero), "%s: a failed load changed the model", what);
    }
  }
}

// Replace step 2's SHA256SUMS with text (NULL: remove it).
static void damage_sums(const char *text, const char *what, const char *const *needles, int n) {
  char dir[256], ckpt[512], path[700];
  fresh_run(dir, sizeof dir, ckpt, sizeof ckpt);
  snprintf(path, sizeof path, "%s/SHA256SUMS", ckpt);
  if (text) CHECK(ckpt_write_text(path, text), "write SHA256SUMS");
  else CHECK(unlink(path) == 0, "unlink SHA256SUMS");
  expect_damage(dir, ckpt, what, needles, n);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/px_ckpt_bad_XXXXXX");
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }

  const char *files[] = {"model.safetensors", "optim.safetensors", "state.json"};
  for (int f = 0; f < 3; f++)
    for (int k = FLIP; k <= REMOVE; k++) damage_file(files[f], (damage_kind)k);

  // SHA256SUMS itself.  Its good text, to damage in different ways:
  char dir[256], ckpt[512], path[700];
  fresh_run(dir, sizeof dir, ckpt, sizeof ckpt);
  snprintf(path, sizeof path, "%s/SHA256SUMS", ckpt);
  char *good = ckpt_read_text(path);
  size_t len = strlen(good);
  char *text = malloc(len + 200);

  {  // A flipped hex digit: the file it describes no longer matches.
    memcpy(text, good, len + 1);
    text[10] = text[10] == '0' ? '1' : '0';
    const char *needles[] = {"\"model.safetensors\"", "expects"};
    damage_sums(text, "a changed digit in SHA256SUMS", needles, 2);
  }
  {
    const char *needles[] = {"SHA256SUMS is missing"};
    damage_sums(NULL, "no SHA256SUMS", needles, 1);
  }
  {
    const char *needles[] = {"SHA256SUMS is empty"};
    damage_sums("", "an empty SHA256SUMS", needles, 1);
  }
  {  // Cut inside the last line: no final newline.
    memcpy(text, good, len - 5);
    text[len - 5] = '\0';
    const char *needles[] = {"SHA256SUMS does not end with a newline"};
    damage_sums(text, "SHA256SUMS cut inside a line", needles, 1);
  }
  {  // Cut after a whole line: state.json is no longer listed.
    char *second_nl = strchr(strchr(good, '\n') + 1, '\n');
    size_t k = (size_t)(second_nl - good) + 1;
    memcpy(text, good, k);
    text[k] = '\0';
    const char *needles[] = {"\"state.json\"", "does not list"};
    damage_sums(text, "SHA256SUMS that lost its last line", needles, 2);
  }
  {
    snprintf(text, len + 200, "%sthis is not a checksum line\n", good);
    const char *needles[] = {"SHA256SUMS line 4 is malformed", "this is not a checksum line"};
    damage_sums(text, "a malformed line in SHA256SUMS", needles, 2);
  }
  {  // 63 hex digits.
    snprintf(text, len + 200, "%s", good);
    memmove(text + 5, text + 6, len - 5);
    const char *needles[] = {"SHA256SUMS line 1 is malformed"};
    damage_sums(text, "a short hash in SHA256SUMS", needles, 1);
  }
  {
    snprintf(text, len + 200, "%s%.64s  ../elsewhere/state.json\n", good, good);
    const char *needles[] = {"../elsewhere/state.json", "\"..\"", "a checkpoint lists only plain file names"};
    damage_sums(text, "a name with .. in SHA256SUMS", needles, 3);
  }
  {
    snprintf(text, len + 200, "%s%.64s  sub/state.json\n", good, good);
    const char *needles[] = {"sub/state.json", "'/'"};
    damage_sums(text, "a name with / in SHA256SUMS", needles, 2);
  }
  {
    snprintf(text, len + 200, "%s%.66sstate.json\n", good, strrchr(good, '\n') - 76);
    const char *needles[] = {"\"state.json\" twice"};
    damage_sums(text, "a file listed twice in SHA256SUMS", needles, 1);
  }
  {  // A file nobody listed.
    fresh_run(dir, sizeof dir, ckpt, sizeof ckpt);
    snprintf(path, sizeof path, "%s/extra.bin", ckpt);
    CHECK(ckpt_write_text(path, "surprise"), "write extra.bin");
    const char *needles[] = {"\"extra.bin\"", "does not list"};
    // Reading single listed files still works: each is checked on its own.
    expect_damage_(dir, ckpt, "an unlisted file", needles, 2, false);
  }
  {  // sha256sum's binary-mode marker and uppercase hex are read as sha256sum reads them.
    fresh_run(dir, sizeof dir, ckpt, sizeof ckpt);
    snprintf(path, sizeof path, "%s/SHA256SUMS", ckpt);
    memcpy(text, good, len + 1);
    for (char *line = text; *line; line = strchr(line, '\n') + 1) {
      line[65] = '*';
      for (int i = 0; i < 64; i++) line[i] = (char)(line[i] >= 'a' ? line[i] - 32 : line[i]);
    }
    // (step 2's files differ from the case whose SHA256SUMS `good` is: use its own.)
    char *own = ckpt_read_text(path);
    for (char *line = own; *line; line = strchr(line, '\n') + 1) {
      line[65] = '*';
      for (int i = 0; i < 64; i++) line[i] = (char)(line[i] >= 'a' ? line[i] - 32 : line[i]);
    }
    CHECK(ckpt_write_text(path, own), "write");
    CHECK(px_checkpoint_verify(ckpt) == PX_OK, "\"<HEX> *name\" lines refused: %s", px_last_error());
    free(own);
  }

  // Every checkpoint damaged: none found, the note lists them all.
  fresh_run(dir, sizeof dir, ckpt, sizeof ckpt);
  snprintf(path, sizeof path, "%s/state.json", ckpt);
  CHECK(unlink(path) == 0, "unlink");
  snprintf(path, sizeof path, "%s/step_00000001/model.safetensors", dir);
  CHECK(ckpt_flip_byte(path, 100), "flip");
  char out[512], note[4096];
  px_status st = px_checkpoint_latest(dir, out, sizeof out, note, sizeof note);
  CHECK(st == PX_ERR_NOT_FOUND && strstr(px_last_error(), "none of the 2 checkpoints"), "latest: %s %s",
        px_status_name(st), px_last_error());
  CHECK(strstr(note, "step_00000001") && strstr(note, "step_00000002") && strstr(note, "\"state.json\"") &&
          strstr(note, "\"model.safetensors\""),
        "the note: %s", note);
  // A small note buffer is cut, never overrun.
  char tiny[24];
  memset(tiny, 'x', sizeof tiny);
  px_checkpoint_latest(dir, out, sizeof out, tiny, 16);
  CHECK(strlen(tiny) < 16 && tiny[16] == 'x', "a 16-byte note holds %zu bytes", strlen(tiny));

  free(text);
  free(good);
  ckpt_rm_rf(root);
  return px_test_finish("test_checkpoint_corruption_is_detected_and_skipped");
}
