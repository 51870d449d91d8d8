/* Claim: px_write_file_atomic (and px_safetensors_save, which uses it)
 * replaces a file whole: after writing over an existing file the directory
 * holds the new contents under the old name and no "<path>.tmp.<pid>"
 * leftovers; when the write fails (no such directory, the target is a
 * directory) it returns PX_ERR_IO naming the path and the system's reason,
 * removes its temporary file and leaves what was there before.  If this
 * failed, a crash or a full disk during a checkpoint could destroy the
 * previous checkpoint, or litter the run directory. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

// Names in dir other than . and .., joined by spaces; returns how many.
static int list_dir(const char *d, char *out, size_t len) {
  DIR *dp = opendir(d);
  int n = 0;
  out[0] = '\0';
  if (!dp) return -1;
  struct dirent *e;
  while ((e = readdir(dp))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    size_t k = strlen(out);
    snprintf(out + k, len - k, "%s%s", n ? " " : "", e->d_name);
    n++;
  }
  closedir(dp);
  return n;
}

static bool file_is(const char *path, const char *contents) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  char buf[256];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  return n == strlen(contents) && memcmp(buf, contents, n) == 0;
}

int main(void) {
  snprintf(dir, sizeof dir, "/tmp/px_st_atomic_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  char path[256], names[1024];
  snprintf(path, sizeof path, "%s/state.bin", dir);

  // Create, then write over: new contents, one file, no temporaries.
  CHECK_OK(px_write_file_atomic(path, "old contents", 12));
  CHECK(file_is(path, "old contents"), "first write");
  CHECK_OK(px_write_file_atomic(path, "new", 3));
  CHECK(file_is(path, "new"), "overwrite did not replace the contents");
  int n = list_dir(dir, names, sizeof names);
  CHECK(n == 1 && strcmp(names, "state.bin") == 0, "directory holds: %s", names);
  CHECK_OK(px_write_file_atomic(path, NULL, 0));
  CHECK(file_is(path, ""), "empty write");

  // A safetensors checkpoint written over an older one.
  char ckpt[256];
  snprintf(ckpt, sizeof ckpt, "%s/model.safetensors", dir);
  float w[6] = {1, 2, 3, 4, 5, 6};
  px_named_tensor item = {"w", px_tensor_f32(w, 2, 2, 3, 0, 0)};
  px_state_dict sd = {&item, 1};
  CHECK_OK(px_safetensors_save(ckpt, &sd, NULL, 0));
  w[0] = 100;
  CHECK_OK(px_safetensors_save(ckpt, &sd, NULL, 0));
  n = list_dir(dir, names, sizeof names);
  CHECK(n == 2 && strstr(names, "model.safetensors") && !strstr(names, ".tmp."), "directory holds: %s", names);
  float back[6] = {0};
  px_named_tensor into = {"w", px_tensor_f32(back, 2, 2, 3, 0, 0)};
  px_state_dict sd_into = {&into, 1};
  CHECK_OK(px_safetensors_load(ckpt, &sd_into, true));
  CHECK(back[0] == 100 && back[5] == 6, "second save not the one read back: %g", back[0]);

  // A path with no directory part: the directory to fsync is ".".
  char cwd[512];
  CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
  CHECK(chdir(dir) == 0, "chdir");
  CHECK_OK(px_write_file_atomic("relative.bin", "rel", 3));
  CHECK(chdir(cwd) == 0, "chdir back");
  char rel[300];
  snprintf(rel, sizeof rel, "%s/relative.bin", dir);
  CHECK(file_is(rel, "rel"), "relative path write");
  remove(rel);

  // Failure before anything is written: the directory does not exist.
  char nowhere[300];
  snprintf(nowhere, sizeof nowhere, "%s/no/such/dir/x.bin", dir);
  px_status st = px_write_file_atomic(nowhere, "x", 1);
  CHECK(st == PX_ERR_IO, "write into a missing directory: %s", px_status_name(st));
  CHECK(strstr(px_last_error(), nowhere) && strstr(px_last_error(), "No such file or directory"), "message: %s",
        px_last_error());

  // Failure after the temporary file is written: the rename cannot replace
  // a directory.  The temporary must be gone, the directory still there.
  char sub[300];
  snprintf(sub, sizeof sub, "%s/sub", dir);
  CHECK(mkdir(sub, 0700) == 0, "mkdir");
  st = px_write_file_atomic(sub, "data", 4);
  CHECK(st == PX_ERR_IO && strstr(px_last_error(), sub) && strstr(px_last_error(), "rename"), "%s: %s",
        px_status_name(st), px_last_error());
  n = list_dir(dir, names, sizeof names);
  CHECK(n == 3 && !strstr(names, ".tmp."), "after a failed write the directory holds: %s", names);
  struct stat sb;
  CHECK(stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode), "the directory was replaced");
  st = px_safetensors_save(sub, &sd, NULL, 0);
  CHECK(st == PX_ERR_IO && strstr(px_last_error(), sub), "save over a directory: %s: %s", px_status_name(st),
        px_last_error());
  n = list_dir(dir, names, sizeof names);
  CHECK(n == 3 && !strstr(names, ".tmp."), "after a failed save the directory holds: %s", names);
  CHECK(file_is(path, ""), "an unrelated file changed");

  rmdir(sub);
  remove(ckpt);
  remove(path);
  rmdir(dir);
  return px_test_finish("test_safetensors_atomic_write_leaves_no_temp_files");
}
