/* Claim: the internal helpers of src/base/internal.h return errors as values.
 * PX_CHECK on a false invariant returns PX_ERR_INTERNAL from the enclosing
 * function (no abort) with file, line and the condition in the message, and
 * passes a true one; TRY returns the first failing call's status and leaves
 * its message, running nothing after it.  px_mkdir_p (the one mkdir -p)
 * creates every missing parent, accepts an existing directory, with
 * `durable` too, and refuses a path through a regular file with PX_ERR_IO
 * naming it and the caller's prefix.  If this failed, a bug in plexus
 * would kill every rank of a job, or a run directory would not be made. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"
#include "base/internal.h"

#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int after_failure = 0;

static px_status checked(int x) {
  PX_CHECK(x > 0);
  return PX_OK;
}
static const int check_line = __LINE__ - 3;

static px_status fails(void) { return px_error(PX_ERR_SHAPE, "first failure"); }
static px_status counts(void) {
  after_failure++;
  return PX_OK;
}
static px_status tries(void) {
  TRY(counts());
  TRY(fails());
  TRY(counts());
  return PX_OK;
}

static bool is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int main(void) {
  CHECK(checked(1) == PX_OK, "a true invariant passes");
  px_status st = checked(0);
  CHECK(st == PX_ERR_INTERNAL, "got %s", px_status_name(st));
  char where[128];
  snprintf(where, sizeof where, "test_base_check_try_and_mkdir_return_errors_as_values.c:%d", check_line);
  CHECK(strstr(px_last_error(), where) && strstr(px_last_error(), "x > 0"), "message: %s (expected %s)",
        px_last_error(), where);

  st = tries();
  CHECK(st == PX_ERR_SHAPE && strstr(px_last_error(), "first failure"), "TRY: %s: %s", px_status_name(st),
        px_last_error());
  CHECK(after_failure == 1, "TRY ran %d call(s) of counts(), expected 1", after_failure);

  char dir[64] = "/tmp/px_mkdir_XXXXXX", path[256], file[256];
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(path, sizeof path, "%s/a/b/c", dir);
  CHECK_OK(px_mkdir_p(path, "test", false));
  CHECK(is_dir(path), "%s not made", path);
  CHECK_OK(px_mkdir_p(path, "test", false));      // exists: fine
  snprintf(path, sizeof path, "%s/a/d/e/", dir);  // trailing slash
  CHECK_OK(px_mkdir_p(path, NULL, true));
  CHECK(is_dir(path), "%s not made (durable)", path);
  snprintf(file, sizeof file, "%s/a/plain", dir);
  CHECK_OK(px_write_file_atomic(file, "x", 1));
  snprintf(path, sizeof path, "%s/a/plain/sub", dir);
  st = px_mkdir_p(path, "jsonl", false);
  CHECK(st == PX_ERR_IO && strstr(px_last_error(), "jsonl: ") == px_last_error() && strstr(px_last_error(), file),
        "through a file: %s: %s", px_status_name(st), px_last_error());
  st = px_mkdir_p(file, "tensorboard", false);
  CHECK(st == PX_ERR_IO && strstr(px_last_error(), "not a directory"), "a file: %s: %s", px_status_name(st),
        px_last_error());
  CHECK(px_mkdir_p("", "x", false) == PX_ERR_INVALID, "empty path accepted");

  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_base_check_try_and_mkdir_return_errors_as_values");
}
