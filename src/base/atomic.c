// Atomic file writes.  The bytes go to "<path>.tmp.<pid>" in the target's
// directory; fsync makes them durable, rename(2) (atomic within one file
// system) swaps the new file in, and an fsync of the directory makes the
// rename itself durable.  A crash at any moment leaves the old file or the
// new one, never a torn one; a failure removes the temporary file.  In
// base/ (libc only) because data/ writes vocabularies, shards and images
// this way and must not depend on io/.
#define _POSIX_C_SOURCE 200809L
#include "plexus/base.h"
#include "base/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *px_io_strerror(int err, char *buf, size_t len) {
  // POSIX (XSI) strerror_r: returns 0 and fills buf.
  if (strerror_r(err, buf, len) != 0) snprintf(buf, len, "error %d", err);
  return buf;
}

// "dir/name" -> "dir", "name" -> ".", "/name" -> "/".
static char *parent_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  size_t n = slash ? (size_t)(slash - path) : 1;
  if (slash == path) n = 1;
  char *dir = malloc(n + 1);
  if (!dir) return NULL;
  if (!slash) memcpy(dir, ".", 1);
  else memcpy(dir, slash == path ? "/" : path, n);
  dir[n] = '\0';
  return dir;
}

static px_status fsync_dir_of(const char *path) {
  char *dir = parent_dir(path);
  if (!dir) return px_error(PX_ERR_NOMEM, "write %s: out of memory", path);
  char why[128];
  int fd = open(dir, O_RDONLY | O_DIRECTORY);
  if (fd < 0) {
    int err = errno;
    px_error(PX_ERR_IO, "write %s: cannot open its directory %s to fsync it: %s", path, dir,
             px_io_strerror(err, why, sizeof why));
    free(dir);
    return PX_ERR_IO;
  }
  // Some file systems cannot fsync a directory (EINVAL); the rename is done
  // and there is nothing more to make durable there.
  px_status st = PX_OK;
  if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP) {
    int err = errno;
    st = px_error(PX_ERR_IO, "write %s: fsync of directory %s failed: %s", path, dir,
                  px_io_strerror(err, why, sizeof why));
  }
  close(fd);
  free(dir);
  return st;
}

px_status px_io_write_chunks_atomic(const char *path, const px_io_chunk *chunks, int n) {
  if (!path || !*path) return px_error(PX_ERR_INVALID, "write: empty path");
  if (n < 0 || (n > 0 && !chunks)) return px_error(PX_ERR_INVALID, "write %s: no data given", path);
  size_t tmp_len = strlen(path) + 32;
  char *tmp = malloc(tmp_len);
  if (!tmp) return px_error(PX_ERR_NOMEM, "write %s: out of memory", path);
  snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid());

  const char *step = "create";
  FILE *f = fopen(tmp, "wb");
  if (!f) goto fail;
  step = "write";
  for (int i = 0; i < n; i++) {
    if (chunks[i].size == 0) continue;
    if (!chunks[i].data) {
      errno = EINVAL;
      goto fail;
    }
    if (fwrite(chunks[i].data, 1, chunks[i].size, f) != chunks[i].size) goto fail;
  }
  if (fflush(f) != 0) goto fail;
  step = "fsync";
  if (fsync(fileno(f)) != 0) goto fail;
  step = "close";
  FILE *g = f;
  f = NULL;
  if (fclose(g) != 0) goto fail;
  step = "rename";
  if (rename(tmp, path) != 0) goto fail;
  free(tmp);
  return fsync_dir_of(path);

fail:;
  int err = errno;
  if (f) fclose(f);
  remove(tmp);  // may not exist (create failed): nothing to report then
  char why[128];
  px_error(PX_ERR_IO, "write %s: %s of temporary file %s failed: %s", path, step, tmp,
           px_io_strerror(err, why, sizeof why));
  free(tmp);
  return PX_ERR_IO;
}

px_status px_write_file_atomic(const char *path, const void *data, size_t n) {
  px_io_chunk c = {data, n};
  return px_io_write_chunks_atomic(path, &c, 1);
}
