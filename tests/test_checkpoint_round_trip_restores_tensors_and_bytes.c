/* Claim: px_checkpoint_write makes <dir>/step_<8 digits>/ with the caller's
 * files and a SHA256SUMS that coreutils' `sha256sum -c` accepts; the
 * checkpoint verifies, px_checkpoint_latest finds the newest one, and
 * loading it back (state dicts through px_checkpoint_load_tensors, bytes
 * through px_checkpoint_read_file) restores every value exactly.  The
 * safetensors files are byte for byte what px_safetensors_save writes.
 * Writing a step that exists replaces it whole and leaves no temporary
 * directory (by an atomic swap, or, where the file system cannot swap, by
 * renaming the old one aside first); bad arguments are refused before
 * anything is written.  If it
 * failed, a resumed run would not continue where it stopped, or users could
 * not check a checkpoint with standard tools. */
#include "ckpt_test_util.h"

#include "io/checkpoint.h"
#include "io/sha256.h"

static char root[64];

static void check_sha256sum_accepts(const char *ckpt) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "cd '%s' && sha256sum --check --strict --quiet SHA256SUMS", ckpt);
  int rc = system(cmd);
  CHECK(rc == 0, "sha256sum -c rejected %s (exit %d)", ckpt, rc);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/px_ckpt_rt_XXXXXX");
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }
  char dir[256], path[512], want[512], note[2048], file[640], names[2048];
  snprintf(dir, sizeof dir, "%s/run/ckpts", root);  // created on the first write

  // ---- write, verify, load back ----
  ckpt_state a, back;
  ckpt_state_init(&a, 7);
  CHECK_OK(px_checkpoint_write(dir, 100, a.items, 3, 0, path, sizeof path));
  snprintf(want, sizeof want, "%s/step_00000100", dir);
  CHECK(strcmp(path, want) == 0, "path_out %s, expected %s", path, want);
  CHECK(ckpt_list_dir(path, names, sizeof names) == 4 &&
          !strcmp(names, "SHA256SUMS model.safetensors optim.safetensors state.json"),
        "the checkpoint holds: %s", names);
  CHECK(ckpt_list_dir(dir, names, sizeof names) == 1 && !strcmp(names, "step_00000100"), "dir holds: %s", names);
  CHECK_OK(px_checkpoint_verify(path));
  check_sha256sum_accepts(path);

  // SHA256SUMS: one line per item in item order, lowercase hex, two spaces.
  snprintf(file, sizeof file, "%s/SHA256SUMS", path);
  char *sums = ckpt_read_text(file);
  char expect[1024] = "";
  for (int i = 0; i < 3; i++) {
    unsigned char d[PX_SHA256_BYTES];
    char hex[PX_SHA256_HEX], p2[700];
    snprintf(p2, sizeof p2, "%s/%s", path, a.items[i].name);
    CHECK_OK(px_sha256_file(p2, d, NULL));
    px_sha256_hex(d, hex);
    size_t k = strlen(expect);
    snprintf(expect + k, sizeof expect - k, "%s  %s\n", hex, a.items[i].name);
  }
  CHECK(sums && strcmp(sums, expect) == 0, "SHA256SUMS is\n%s\nexpected\n%s", sums ? sums : "(unreadable)", expect);
  free(sums);

  CHECK_OK(px_checkpoint_latest(dir, path, sizeof path, note, sizeof note));
  CHECK(strcmp(path, want) == 0 && note[0] == '\0', "latest %s (note \"%s\"), expected %s", path, note, want);
  ckpt_state_init(&back, 7);
  ckpt_state_zero(&back);
  CHECK_OK(ckpt_state_load(path, &back));
  CHECK(ckpt_state_equal(&a, &back), "loaded values differ from the saved ones");
  void *bytes;
  size_t n;
  CHECK_OK(px_checkpoint_read_file(path, "state.json", &bytes, &n));
  CHECK(n == strlen(a.json) && memcmp(bytes, a.json, n) == 0, "state.json read back as %.*s", (int)n, (char *)bytes);
  free(bytes);

  // The safetensors file is exactly px_safetensors_save's (metadata included).
  snprintf(file, sizeof file, "%s/direct.safetensors", root);
  CHECK_OK(px_safetensors_save(file, &a.model, a.items[0].metadata, 1));
  char *direct = ckpt_read_text(file);
  snprintf(file, sizeof file, "%s/model.safetensors", path);
  char *in_ckpt = ckpt_read_text(file);
  long sz = ckpt_file_size(file);
  CHECK(direct && in_ckpt && sz > 0 && memcmp(direct, in_ckpt, (size_t)sz) == 0,
        "model.safetensors differs from "
        "px_safetensors_save's file");
  free(direct);
  free(in_ckpt);

  // A zero-byte item.
  px_ckpt_item empty = {.name = "EMPTY", .bytes = NULL, .n_bytes = 0};
  CHECK_OK(px_checkpoint_write(dir, 3, &empty, 1, 0, NULL, 0));
  snprintf(path, sizeof path, "%s/step_00000003", dir);
  CHECK_OK(px_checkpoint_verify(path));
  CHECK_OK(px_checkpoint_read_file(path, "EMPTY", &bytes, &n));
  CHECK(n == 0, "empty item read back as %zu bytes", n);
  free(bytes);
  check_sha256sum_accepts(path);

  // ---- latest is the highest step, not the last written ----
  ckpt_state b;
  ckpt_state_init(&b, 8);
  CHECK_OK(px_checkpoint_write(dir, 200, b.items, 3, 0, NULL, 0));
  CHECK_OK(px_checkpoint_write(dir, 50, a.items, 3, 0, NULL, 0));
  CHECK_OK(px_checkpoint_latest(dir, path, sizeof path, note, sizeof note));
  snprintf(want, sizeof want, "%s/step_00000200", dir);
  CHECK(strcmp(path, want) == 0, "latest %s, expected %s", path, want);
  // Steps past 8 digits sort by number, not by name.
  CHECK_OK(px_checkpoint_write(dir, 123456789, a.items, 3, 0, path, sizeof path));
  CHECK_OK(px_checkpoint_write(dir, 99999999, b.items, 3, 0, NULL, 0));
  CHECK_OK(px_checkpoint_latest(dir, want, sizeof want, note, sizeof note));
  CHECK(strcmp(path, want) == 0 && strstr(path, "step_123456789"), "latest %s, expected %s", want, path);

  // ---- writing over a step replaces it whole, leaves no temporaries ----
  ckpt_state c;
  ckpt_state_init(&c, 9);
  CHECK_OK(px_checkpoint_write(dir, 200, c.items, 2, 0, path, sizeof path));  // no state.json this time
  CHECK_OK(px_checkpoint_verify(path));
  CHECK(ckpt_list_dir(path, names, sizeof names) == 3 &&
          !strcmp(names, "SHA256SUMS model.safetensors optim.safetensors"),
        "replaced checkpoint holds: %s", names);
  ckpt_state_init(&back, 0);
  ckpt_state_zero(&back);
  CHECK_OK(ckpt_state_load(path, &back));
  CHECK(ckpt_state_equal(&c, &back), "the replaced checkpoint still has the old values");
  CHECK(ckpt_list_dir(dir, names, sizeof names) == 6 &&
          !strcmp(names, "step_00000003 step_00000050 step_00000100 step_00000200 step_123456789 step_99999999"),
        "dir holds: %s", names);

  // ---- reading what is not there ----
  CHECK(px_checkpoint_read_file(path, "state.json", &bytes, &n) == PX_ERR_NOT_FOUND &&
          strstr(px_last_error(), "state.json") && strstr(px_last_error(), path),
        "reading an unlisted file: %s", px_last_error());
  CHECK(px_checkpoint_read_file(path, "../step_00000100/state.json", &bytes, &n) == PX_ERR_INVALID,
        "a name with .. was read: %s", px_last_error());
  CHECK(px_checkpoint_load_tensors(path, "model.safetensors", &b.optim, true) == PX_ERR_NOT_FOUND &&
          strstr(px_last_error(), "exp_avg"),
        "loading the wrong state dict: %s", px_last_error());
  snprintf(file, sizeof file, "%s/step_00000777", dir);
  CHECK(px_checkpoint_verify(file) == PX_ERR_NOT_FOUND && strstr(px_last_error(), "step_00000777"),
        "verify of a missing checkpoint: %s", px_last_error());
  snprintf(file, sizeof file, "%s/nothing-here", root);
  CHECK(px_checkpoint_latest(file, path, sizeof path, note, sizeof note) == PX_ERR_NOT_FOUND && note[0] == '\0',
        "latest in a missing directory: %s", px_last_error());
  snprintf(file, sizeof file, "%s/empty", root);
  mkdir(file, 0755);
  CHECK(px_checkpoint_latest(file, path, sizeof path, note, sizeof note) == PX_ERR_NOT_FOUND,
        "latest in an empty directory: %s", px_last_error());

  // ---- bad arguments: refused, nothing written ----
  const char *bad_names[] = {"", "a/b", "..", "x..y", ".hidden", "SHA256SUMS", "tab\there", "back\\slash"};
  for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
    px_ckpt_item it = {.name = bad_names[i], .bytes = "x", .n_bytes = 1};
    CHECK(px_checkpoint_write(dir, 5, &it, 1, 0, NULL, 0) == PX_ERR_INVALID, "name \"%s\" accepted", bad_names[i]);
  }
  px_ckpt_item twice[2] = {{.name = "a", .bytes = "x", .n_bytes = 1}, {.name = "a", .bytes = "y", .n_bytes = 1}};
  CHECK(px_checkpoint_write(dir, 5, twice, 2, 0, NULL, 0) == PX_ERR_INVALID && strstr(px_last_error(), "\"a\""),
        "two items of one name: %s", px_last_error());
  CHECK(px_checkpoint_write(dir, 5, twice, 0, 0, NULL, 0) == PX_ERR_INVALID, "no items accepted");
  CHECK(px_checkpoint_write(dir, -1, twice, 1, 0, NULL, 0) == PX_ERR_INVALID, "step -1 accepted");
  CHECK(px_checkpoint_write(dir, 5, twice, 1, -2, NULL, 0) == PX_ERR_INVALID, "keep_last -2 accepted");
  char small[8];
  CHECK(px_checkpoint_write(dir, 5, twice, 1, 0, small, sizeof small) == PX_ERR_INVALID, "a short path_out accepted");
  px_ckpt_item no_data = {.name = "x", .bytes = NULL, .n_bytes = 4};
  CHECK(px_checkpoint_write(dir, 5, &no_data, 1, 0, NULL, 0) == PX_ERR_INVALID, "bytes without data accepted");
  // A state dict safetensors refuses: error names it, the partial is removed.
  px_named_tensor dup[2] = {{"t", px_tensor_f32(a.b, 1, 3, 0, 0, 0)}, {"t", px_tensor_f32(a.b, 1, 3, 0, 0, 0)}};
  px_state_dict dup_sd = {dup, 2};
  px_ckpt_item dup_it = {.name = "model.safetensors", .tensors = &dup_sd};
  CHECK(px_checkpoint_write(dir, 5, &dup_it, 1, 0, NULL, 0) == PX_ERR_INVALID && strstr(px_last_error(), "\"t\""),
        "a state dict with a name twice: %s", px_last_error());
  CHECK(ckpt_list_dir(dir, names, sizeof names) == 6 && !strstr(names, "step_00000005") && !strstr(names, ".partial"),
        "after refused writes the directory holds: %s", names);

  // A trailing slash names the same directory.
  snprintf(file, sizeof file, "%s/", dir);
  CHECK_OK(px_checkpoint_write(file, 300, a.items, 3, 0, path, sizeof path));
  snprintf(want, sizeof want, "%s/step_00000300", dir);
  CHECK(strcmp(path, want) == 0, "path_out %s, expected %s", path, want);

  // ---- the replacement path for file systems that cannot swap two
  // directories: the old checkpoint aside (.old), the new one in ----
  {
    char other[256], from[700], tmp[700], fin[700], old[700], host[PX_CKPT_HOST_MAX + 1], name[384];
    snprintf(other, sizeof other, "%s/other", root);
    ckpt_state d;
    ckpt_state_init(&d, 11);
    CHECK_OK(px_checkpoint_write(other, 200, d.items, 3, 0, NULL, 0));
    px_ckpt_host(host);
    px_ckpt_temp_name(200, PX_CKPT_PARTIAL, host, (long)getpid(), name, sizeof name);
    snprintf(tmp, sizeof tmp, "%s/%s", dir, name);
    snprintf(from, sizeof from, "%s/step_00000200", other);
    CHECK(rename(from, tmp) == 0, "rename %s", from);
    snprintf(fin, sizeof fin, "%s/step_00000200", dir);
    CHECK_OK(px_ckpt_install(dir, tmp, fin, 200, false, old, sizeof old));
    CHECK(strstr(old, "/.step_00000200.old.") != NULL, "the replaced checkpoint was set aside as %s", old);
    CHECK_OK(px_checkpoint_verify(old));
    CHECK_OK(px_checkpoint_verify(fin));
    ckpt_state_init(&back, 0);
    ckpt_state_zero(&back);
    CHECK_OK(ckpt_state_load(fin, &back));
    CHECK(ckpt_state_equal(&d, &back), "step 200 does not hold the new checkpoint");
    ckpt_state_zero(&back);
    CHECK_OK(ckpt_state_load(old, &back));
    CHECK(ckpt_state_equal(&c, &back), "the .old directory does not hold the replaced checkpoint");
    CHECK_OK(px_ckpt_remove_tree(old));
    CHECK(ckpt_file_size(old) < 0 && ckpt_file_size(tmp) < 0, "temporaries left");
  }

  ckpt_rm_rf(root);
  return px_test_finish("test_checkpoint_round_trip_restores_tensors_and_bytes");
}
