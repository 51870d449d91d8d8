/* Claim: after each px_checkpoint_write with keep_last = k, the run
 * directory holds the k newest complete checkpoints by step number (all of
 * them with k = 0); a checkpoint that lost a file or its SHA256SUMS does not
 * count towards k, so it never pushes out a good one; a corrupted newer
 * checkpoint never causes the newest good one (the one just written) to be
 * deleted; the .partial and .old directories of dead writers on this host
 * are removed (an .old one whose step is missing is put back), those of live
 * processes and of other hosts stay; names that are not ours (step_final,
 * step_7, a symbolic link, a file) are never touched.  If it failed, a run
 * would fill its disk, delete the checkpoint it needs to resume, or delete
 * files that are not its own. */
#include "ckpt_test_util.h"

#include <sys/wait.h>

#include "io/checkpoint.h"

static char root[64];
static ckpt_state state;

static void write_step(const char *dir, int64_t step, int keep_last) {
  CHECK_OK(px_checkpoint_write(dir, step, state.items, 3, keep_last, NULL, 0));
}

// The step directories of dir, as "1 2 5".
static void steps_in(const char *dir, char *out, size_t cap) {
  char names[4096];
  ckpt_list_dir(dir, names, sizeof names);
  out[0] = '\0';
  for (char *tok = strtok(names, " "); tok; tok = strtok(NULL, " ")) {
    int64_t s;
    char path[700];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, tok);
    if (!px_ckpt_parse_step_name(tok, &s) || lstat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
    size_t k = strlen(out);
    snprintf(out + k, cap - k, "%s%lld", k ? " " : "", (long long)s);
  }
}

static void expect_steps(const char *dir, const char *want, const char *when) {
  char got[1024];
  steps_in(dir, got, sizeof got);
  CHECK(strcmp(got, want) == 0, "%s: steps in %s are \"%s\", expected \"%s\"", when, dir, got, want);
}

static void expect_latest(const char *dir, int64_t step, const char *when) {
  char path[512], want[512], note[4096];
  snprintf(want, sizeof want, "%s/step_%08lld", dir, (long long)step);
  px_status st = px_checkpoint_latest(dir, path, sizeof path, note, sizeof note);
  CHECK(st == PX_OK && strcmp(path, want) == 0, "%s: latest is %s (%s), expected %s", when, path, px_last_error(),
        want);
}

static long dead_pid(void) {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, NULL, 0);
  return (long)pid;
}

static bool exists(const char *dir, const char *name) {
  char path[700];
  struct stat sb;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  return lstat(path, &sb) == 0;
}

static void make_temp(const char *dir, int64_t step, px_ckpt_temp_kind kind, const char *host, long pid, char *name,
                      size_t cap) {
  char path[700];
  px_ckpt_temp_name(step, kind, host, pid, name, cap);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  CHECK(mkdir(path, 0755) == 0, "mkdir %s", path);
  snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, name);
  CHECK(ckpt_write_text(path, "half a file"), "write into %s", name);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/px_ckpt_rot_XXXXXX");
  if (!mkdtemp(root)) {
    perror("mkdtemp");
    return 1;
  }
  ckpt_state_init(&state, 3);
  char dir[256], path[700], want[256], when[64];

  // ---- keep_last 1, 2, 3 and 0 over six steps ----
  for (int k = 0; k <= 3; k++) {
    snprintf(dir, sizeof dir, "%s/keep%d", root, k);
    for (int s = 1; s <= 6; s++) {
      write_step(dir, s * 10, k);
      want[0] = '\0';
      int first = k == 0 || s <= k ? 1 : s - k + 1;
      for (int t = first; t <= s; t++) {
        size_t n = strlen(want);
        snprintf(want + n, sizeof want - n, "%s%d", n ? " " : "", t * 10);
      }
      snprintf(when, sizeof when, "keep_last %d after step %d", k, s * 10);
      expect_steps(dir, want, when);
    }
    expect_latest(dir, 60, "after six writes");
  }

  // ---- names that are not ours are left alone ----
  snprintf(dir, sizeof dir, "%s/foreign", root);
  write_step(dir, 1, 0);
  const char *foreign_dirs[] = {"step_final", "step_7", "step_000000001", "step_00000002.bak", "steps"};
  for (int i = 0; i < 5; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, foreign_dirs[i]);
    CHECK(mkdir(path, 0755) == 0, "mkdir %s", path);
  }
  snprintf(path, sizeof path, "%s/notes.txt", dir);
  CHECK(ckpt_write_text(path, "mine"), "notes");
  snprintf(path, sizeof path, "%s/step_00000099", dir);  // a link to a checkpoint: not ours either
  CHECK(symlink("step_00000001", path) == 0, "symlink");
  for (int s = 2; s <= 4; s++) write_step(dir, s, 1);
  expect_steps(dir, "4", "keep_last 1 among foreign names");
  for (int i = 0; i < 5; i++) CHECK(exists(dir, foreign_dirs[i]), "%s was removed", foreign_dirs[i]);
  CHECK(exists(dir, "notes.txt") && exists(dir, "step_00000099"), "a file or link that is not ours was removed");
  expect_latest(dir, 4, "a link named like a newer step is not followed");

  // ---- a checkpoint missing a file does not count towards keep_last ----
  snprintf(dir, sizeof dir, "%s/broken", root);
  write_step(dir, 1, 2);
  write_step(dir, 2, 2);
  snprintf(path, sizeof path, "%s/step_00000002/state.json", dir);
  CHECK(unlink(path) == 0, "unlink");
  write_step(dir, 3, 2);
  expect_steps(dir, "1 2 3", "keep_last 2 with step 2 broken");  // 1 and 3: the two good ones
  snprintf(path, sizeof path, "%s/step_00000003/model.safetensors", dir);
  CHECK(ckpt_flip_byte(path, 200), "flip");
  expect_latest(dir, 1, "steps 3 and 2 bad");
  write_step(dir, 4, 2);
  expect_steps(dir, "3 4", "keep_last 2 after step 4");  // 3 looks complete (flips are not hashed here)
  expect_latest(dir, 4, "after step 4");

  // ---- corrupted newer checkpoints (a run that resumed from an older one) ----
  snprintf(dir, sizeof dir, "%s/stale", root);
  write_step(dir, 5, 0);
  write_step(dir, 9, 0);
  write_step(dir, 8, 0);
  snprintf(path, sizeof path, "%s/step_00000009/model.safetensors", dir);
  CHECK(ckpt_flip_byte(path, -1), "flip");  // looks complete, fails verify
  snprintf(path, sizeof path, "%s/step_00000008/SHA256SUMS", dir);
  CHECK(unlink(path) == 0, "unlink");  // not complete at all
  expect_steps(dir, "5 8 9", "stale set-up");
  expect_latest(dir, 5, "9 corrupted, 8 without SHA256SUMS");
  // The resumed run's next checkpoint.  9 is kept (the newest is never
  // deleted) and counts as complete (rotation does not hash), so 8 (not
  // complete) and 5 go; 6, just written, stays.
  write_step(dir, 6, 1);
  expect_steps(dir, "6 9", "keep_last 1 with corrupted newer checkpoints");
  expect_latest(dir, 6, "the checkpoint just written");
  write_step(dir, 7, 1);
  expect_steps(dir, "7 9", "keep_last 1, next write");
  expect_latest(dir, 7, "the newest good one survives");
  write_step(dir, 9, 1);  // the run catches up and rewrites step 9
  expect_steps(dir, "9", "keep_last 1 after rewriting step 9");
  expect_latest(dir, 9, "rewritten step 9");

  // ---- temporaries: dead writers' go, live and foreign ones stay ----
  snprintf(dir, sizeof dir, "%s/temps", root);
  write_step(dir, 1, 0);
  write_step(dir, 4, 0);
  char host[PX_CKPT_HOST_MAX + 1], dead_partial[384], live_partial[384], other_host[384], dead_old[384],
    restorable[384], mine[384];
  px_ckpt_host(host);
  make_temp(dir, 2, PX_CKPT_PARTIAL, host, dead_pid(), dead_partial, sizeof dead_partial);
  make_temp(dir, 3, PX_CKPT_PARTIAL, host, (long)getppid(), live_partial, sizeof live_partial);
  make_temp(dir, 3, PX_CKPT_PARTIAL, "some-other-host", dead_pid(), other_host, sizeof other_host);
  make_temp(dir, 1, PX_CKPT_OLD, host, dead_pid(), dead_old, sizeof dead_old);
  make_temp(dir, 6, PX_CKPT_PARTIAL, host, (long)getpid(), mine, sizeof mine);  // this process's own leftover
  // A complete step 4 that a dead writer had set aside to replace it.
  char from[700];
  px_ckpt_temp_name(4, PX_CKPT_OLD, host, dead_pid(), restorable, sizeof restorable);
  snprintf(from, sizeof from, "%s/step_00000004", dir);
  snprintf(path, sizeof path, "%s/%s", dir, restorable);
  CHECK(rename(from, path) == 0, "rename");

  char out[512], note[8192];
  CHECK_OK(px_checkpoint_latest(dir, out, sizeof out, note, sizeof note));
  CHECK(strstr(out, "step_00000001") != NULL, "latest %s", out);
  char line[512];
  snprintf(line, sizeof line, "%s: incomplete: a writer was interrupted", dead_partial);
  CHECK(strstr(note, line), "note lacks \"%s\":\n%s", line, note);
  snprintf(line, sizeof line, "%s: incomplete: process %ld is still writing it", live_partial, (long)getppid());
  CHECK(strstr(note, line), "note lacks \"%s\":\n%s", line, note);
  snprintf(line, sizeof line, "%s: incomplete: a writer on host some-other-host", other_host);
  CHECK(strstr(note, line), "note lacks \"%s\":\n%s", line, note);
  snprintf(line, sizeof line, "%s: a checkpoint set aside while being replaced", restorable);
  CHECK(strstr(note, line), "note lacks \"%s\":\n%s", line, note);

  write_step(dir, 6, 0);
  CHECK(!exists(dir, dead_partial), "a dead writer's partial directory survived");
  CHECK(!exists(dir, dead_old), "a dead writer's .old directory (its step exists) survived");
  CHECK(!exists(dir, mine), "this process's own leftover partial survived its rewrite");
  CHECK(exists(dir, live_partial), "a live writer's partial directory was removed");
  CHECK(exists(dir, other_host), "another host's partial directory was removed");
  CHECK(!exists(dir, restorable) && exists(dir, "step_00000004"), "step 4 set aside by a dead writer was not put back");
  snprintf(path, sizeof path, "%s/step_00000004", dir);
  CHECK_OK(px_checkpoint_verify(path));
  expect_steps(dir, "1 4 6", "after clean-up");
  CHECK_OK(px_checkpoint_latest(dir, out, sizeof out, note, sizeof note));
  CHECK(strstr(note, dead_partial) == NULL && strstr(note, live_partial) != NULL, "note after clean-up:\n%s", note);

  ckpt_rm_rf(root);
  return px_test_finish("test_checkpoint_rotation_keeps_newest_complete");
}
