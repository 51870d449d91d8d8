// mkdir -p, the one copy: every missing component of a path is created;
// with `durable`, each new directory is made durable in its parent (fsync of
// the parent), as a checkpoint directory must be before its files count.
#define _POSIX_C_SOURCE 200809L
#include "plexus/base.h"
#include "base/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// fsync the directory that holds p's last component ("a/b" -> "a").
static px_status fsync_parent(char *p, const char *what, const char *path) {
  char *slash = strrchr(p, '/');
  const char *dir = !slash ? "." : (slash == p ? "/" : p);
  char keep = 0;
  if (slash && slash != p) {
    keep = *slash;
    *slash = '\0';
  }
  char why[128];
  px_status st = PX_OK;
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP)) {
    int err = errno;
    st = px_error(PX_ERR_IO, "%s: cannot make directory %s durable (for %s): %s", what, dir, path,
                  px_io_strerror(err, why, sizeof why));
  }
  if (fd >= 0) close(fd);
  if (keep) *slash = keep;
  return st;
}

px_status px_mkdir_p(const char *path, const char *what, bool durable) {
  if (!what) what = "mkdir";
  if (!path || !*path) return px_error(PX_ERR_INVALID, "%s: empty directory path", what);
  char why[128];
  size_t n = strlen(path);
  char *p = malloc(n + 1);
  if (!p) return px_error(PX_ERR_NOMEM, "%s: out of memory", what);
  memcpy(p, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0777) == 0) {
      if (durable) {
        px_status st = fsync_parent(p, what, path);
        if (st != PX_OK) {
          free(p);
          return st;
        }
      }
    } else if (errno != EEXIST) {
      int err = errno;
      px_status s = px_error(PX_ERR_IO, "%s: cannot create directory %s (for %s): %s", what, p, path,
                             px_io_strerror(err, why, sizeof why));
      free(p);
      return s;
    }
    p[i] = c;
  }
  free(p);
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
    return px_error(PX_ERR_IO, "%s: %s exists and is not a directory", what, path);
  return PX_OK;
}
