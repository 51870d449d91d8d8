// Node-local staging of a dataset's files (data.h, "Node-local staging").
//
// stage_dir/<label>-<12 hex of SHA-256 of the source>/ holds the copies
// under their names and MANIFEST, written atomically last:
//
//   plexus-stage 1
//   source <the source path as the data kind names it>
//   <crc32c, 8 hex> <size> <version> <name>     (one per file)
//
// A name is the file's base name (mnist, tokens, text, hdf5: the files lie
// side by side), or for an image listing its path below the listing's root
// ("n01440764/n01440764_10026.JPEG": sub-directories are made), beside the
// listing itself (and the synset mapping), so that the staged listing's
// directory is the staged images' root.
//
// where the version is a local file's mtime "s.ns" or an S3 object's
// "etag:ETAG" from the listing (s3.h).  S3 objects are copied by ranged
// GETs of S3_CHUNK bytes.
//
// A set is reused file by file: a file whose source still has the recorded
// size and version, and whose copy has the recorded size (and, verifying in
// full, the recorded CRC-32C), is kept; any other is copied again.  No
// MANIFEST (a copy cut short) means every file is copied.  The manifest is
// removed before the first copy and rewritten after the last, so a run that
// dies mid-copy leaves a set the next run redoes.  Copies are written to a
// temporary name and renamed; an flock on .lock keeps two jobs of one node
// from staging the same set at once.
#define _GNU_SOURCE
#include "plexus/comm.h"
#include "plexus/data.h"
#include "plexus/io.h"

#include "data/csv.h"
#include "data/file.h"
#include "data/s3.h"
#include "io/checkpoint.h"  // px_ckpt_crc32c: the hardware CRC-32C

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define COPY_BUF ((size_t)1 << 20)   // 1 MiB reads and writes (the buffer stays in cache between read, CRC and write)
#define S3_CHUNK ((size_t)16 << 20)  // an S3 object is copied by ranged GETs of 16 MiB (one buffer, reused)
#define MANIFEST "MANIFEST"
#define MANIFEST_MAGIC "plexus-stage 1"
#define NAME_CAP 1024                     // a staged name (with its sub-directories) is shorter
#define VER_CAP 96                        // a version: "s.ns" or "etag:ETAG" (longer ETags are cut)
#define PATH_CAP (4096 + NAME_CAP + 160)  // the set's directory and a name
#define TMP_CAP (2 * PATH_CAP)            // and a temporary's suffix

// ver: the source's version as the manifest records it: a local file's
// mtime "s.ns"; an S3 object's "etag:ETAG" ("etag:" alone when the store
// lists no ETag: then size only tells a replaced object).
typedef struct entry {
  const char *name;  // the caller's (names[i], or the base name of files[i])
  uint64_t size;
  char ver[VER_CAP];
  uint32_t crc;
  bool have;  // found in the old manifest
} entry;

// The set's names sorted, for lookups (a set of ImageNet's 1.28 M images is
// looked up name by name in the manifest and the directory).
typedef struct named {
  const char *name;
  size_t i;
} named;

static int named_cmp(const void *a, const void *b) {
  return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

// The index of `name` in the set, or -1.
static ptrdiff_t find_name(const named *by, size_t n, const char *name) {
  const named key = {name, 0};
  const named *hit = n ? bsearch(&key, by, n, sizeof *by, named_cmp) : NULL;
  return hit ? (ptrdiff_t)hit->i : -1;
}

static void local_ver(const struct stat *sb, char *out, size_t cap) {
  snprintf(out, cap, "%" PRId64 ".%09" PRId64, (int64_t)sb->st_mtim.tv_sec, (int64_t)sb->st_mtim.tv_nsec);
}

// An ETag as one manifest field: no spaces or control characters.
static void s3_ver(const char *etag, char *out, size_t cap) {
  int w = snprintf(out, cap, "etag:%s", etag ? etag : "");
  for (char *p = out; w > 0 && *p; p++)
    if ((unsigned char)*p <= ' ') *p = '_';
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static px_status unstaged_kind(const char *kind) {
  if (strcmp(kind, "images") == 0 || strcmp(kind, "imagenet") == 0)
    return px_error(PX_ERR_UNSUPPORTED,
                    "--stage: --data %s is staged by px_stage_images (the listing, its images below the root and "
                    "the synset mapping), not as a list of files",
                    kind);
  return px_error(PX_ERR_UNSUPPORTED,
                  "--stage: --data %s is not staged; staging covers mnist (IDX), tokens (shards), text, hdf5 (one "
                  "file), images and imagenet (a listing and its images)",
                  kind);
}

void px_stage_files_free(char **files, size_t n) {
  if (!files) return;
  for (size_t i = 0; i < n; i++) free(files[i]);
  free(files);
}

static px_status push(char ***files, size_t *n, const char *path) {
  char **p = realloc(*files, (*n + 1) * sizeof *p);
  if (!p) return px_error(PX_ERR_NOMEM, "stage: out of memory listing files");
  *files = p;
  if (!(p[*n] = strdup(path))) return px_error(PX_ERR_NOMEM, "stage: out of memory listing files");
  (*n)++;
  return PX_OK;
}

// The objects a data kind reads from an s3:// source, listed once with
// their sizes and ETags (data/s3.h): "mnist" the four IDX objects under the
// prefix (NAME, else NAME.gz), "tokens" the pattern's objects (a glob in
// the last part, or a key prefix whose objects lie side by side), "text"
// and "hdf5" the one object.
static px_status s3_source_files(const char *kind, const char *path, char ***urls, uint64_t **sizes, char ***etags,
                                 size_t *n) {
  *urls = *etags = NULL;
  *sizes = NULL;
  *n = 0;
  const char *slash = strrchr(path, '/');  // s3://bucket has one at 4
  const char *last = slash + 1;
  px_status st = PX_OK;
  if (strcmp(kind, "mnist") == 0) {
    static const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                  "t10k-labels-idx1-ubyte"};
    if (strpbrk(path, "*?["))
      return px_error(PX_ERR_INVALID, "--stage: mnist %s: expected the prefix the IDX files are under, not a pattern",
                      path);
    size_t plen = strlen(path);
    char *prefix = malloc(plen + 3);
    if (!prefix) return px_error(PX_ERR_NOMEM, "--stage: out of memory");
    snprintf(prefix, plen + 3, "%s%s*", path, plen > 0 && path[plen - 1] == '/' ? "" : "/");
    char **u = NULL, **t = NULL;
    uint64_t *z = NULL;
    size_t m = 0;
    // PREFIX/* (one level): a "folder" marker key PREFIX/ is listed, not taken.
    st = px_s3_list_etags(prefix, "--stage: mnist", &u, &z, &t, &m);
    prefix[strlen(prefix) - 1] = '\0';
    for (size_t k = 0; k < 4 && st == PX_OK; k++) {
      size_t pick = m;
      for (int gz = 0; gz < 2 && pick == m; gz++)
        for (size_t j = 0; j < m && pick == m; j++) {
          if (!u[j]) continue;  // taken by an earlier name
          const char *rest = u[j] + strlen(prefix);
          if (strncmp(rest, names[k], strlen(names[k])) == 0 && strcmp(rest + strlen(names[k]), gz ? ".gz" : "") == 0)
            pick = j;
        }
      if (pick == m) continue;
      char **nu = realloc(*urls, (*n + 1) * sizeof *nu);
      if (nu) *urls = nu;
      char **nt = realloc(*etags, (*n + 1) * sizeof *nt);
      if (nt) *etags = nt;
      uint64_t *nz = realloc(*sizes, (*n + 1) * sizeof *nz);
      if (nz) *sizes = nz;
      if (!nu || !nt || !nz) {
        st = px_error(PX_ERR_NOMEM, "--stage: out of memory");
        break;
      }
      (*urls)[*n] = u[pick];
      (*etags)[*n] = t[pick];
      (*sizes)[*n] = z[pick];
      u[pick] = t[pick] = NULL;
      (*n)++;
    }
    if (st == PX_OK && *n == 0)
      st = px_error(PX_ERR_NOT_FOUND, "--stage: mnist %s holds none of the IDX files (train-images-idx3-ubyte, ...)",
                    prefix);
    px_s3_etags_free(t, m);
    px_s3_list_free(u, z, m);
    free(prefix);
  } else if (strcmp(kind, "tokens") == 0 || strcmp(kind, "text") == 0 || strcmp(kind, "hdf5") == 0) {
    const bool tokens = strcmp(kind, "tokens") == 0;
    const char *wild = strpbrk(path, "*?[");
    if (tokens && wild && wild < slash)
      return px_error(PX_ERR_INVALID,
                      "--stage: tokens %s: the pattern may only match names in one \"directory\" "
                      "(wildcards after the last '/'), since the stage holds the shards side by side",
                      path);
    if (tokens && !wild && !*last)
      return px_error(PX_ERR_INVALID,
                      "--stage: tokens %s: give the shards as a glob (%s*.bin) or a prefix that "
                      "includes the start of their names (%sshard_): the staged copy is read as DIR/<that>*",
                      path, path, path);
    char what[32];
    snprintf(what, sizeof what, "--stage: %s", kind);
    st = px_s3_list_etags(path, what, urls, sizes, etags, n);
    if (st == PX_OK && !tokens && (*n != 1 || strcmp((*urls)[0], path) != 0))
      st = px_error(PX_ERR_NOT_FOUND, "--stage: %s %s: no object with exactly this key (%zu key(s) start with it)",
                    kind, path, *n);
    // A prefix's objects must be what DIR/<last part>* finds in the stage:
    // none of them below a further '/'.
    for (size_t j = 0; j < *n && st == PX_OK && tokens && !wild; j++)
      if (strchr((*urls)[j] + (size_t)(last - path), '/'))
        st = px_error(PX_ERR_INVALID,
                      "--stage: tokens %s: the object %s lies below a further '/'; stage a glob of "
                      "one \"directory\" (%s*.bin) instead",
                      path, (*urls)[j], path);
  } else {
    return unstaged_kind(kind);
  }
  if (st != PX_OK) {
    px_s3_etags_free(*etags, *n);
    px_s3_list_free(*urls, *sizes, *n);
    *urls = *etags = NULL;
    *sizes = NULL;
    *n = 0;
  }
  return st;
}

px_status px_stage_source_files(const char *kind, const char *path, char ***files, size_t *n) {
  *files = NULL;
  *n = 0;
  if (!kind || !path || !*path) return px_error(PX_ERR_INVALID, "stage: no data kind or path given");
  if (px_s3_is_url(path)) {
    uint64_t *sizes;
    char **etags;
    px_status st = s3_source_files(kind, path, files, &sizes, &etags, n);
    if (st == PX_OK) {
      px_s3_etags_free(etags, *n);
      free(sizes);
    }
    return st;
  }
  px_status st = PX_OK;
  struct stat sb;
  if (strcmp(kind, "mnist") == 0) {
    // The files px_mnist_open would read, both splits: NAME, else NAME.gz.
    static const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                                  "t10k-labels-idx1-ubyte"};
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
      return px_error(PX_ERR_NOT_FOUND, "--stage: mnist %s is not a directory", path);
    char p[4200];
    for (size_t k = 0; k < 4 && st == PX_OK; k++) {
      snprintf(p, sizeof p, "%s/%s", path, names[k]);
      if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) {
        st = push(files, n, p);
        continue;
      }
      snprintf(p, sizeof p, "%s/%s.gz", path, names[k]);
      if (stat(p, &sb) == 0 && S_ISREG(sb.st_mode)) st = push(files, n, p);
    }
    if (st == PX_OK && *n == 0)
      st = px_error(PX_ERR_NOT_FOUND, "--stage: mnist %s holds none of the IDX files (train-images-idx3-ubyte, ...)",
                    path);
  } else if (strcmp(kind, "tokens") == 0) {
    // The shards px_token_dataset_open would read: the glob, sorted.
    const char *slash = strrchr(path, '/');
    if (slash && strpbrk(path, "*?[") && strpbrk(path, "*?[") < slash)
      return px_error(PX_ERR_INVALID,
                      "--stage: tokens %s: the pattern may only match names in one directory "
                      "(wildcards in the last part), since the stage holds the shards side by side",
                      path);
    glob_t g;
    int rc = glob(path, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) {
      globfree(&g);
      return px_error(PX_ERR_NOT_FOUND, "--stage: tokens: no shard matches %s", path);
    }
    if (rc != 0) {
      globfree(&g);
      return px_error(PX_ERR_IO, "--stage: tokens: cannot expand \"%s\" (glob error %d)", path, rc);
    }
    for (size_t i = 0; i < g.gl_pathc && st == PX_OK; i++) st = push(files, n, g.gl_pathv[i]);
    globfree(&g);
  } else if (strcmp(kind, "text") == 0 || strcmp(kind, "hdf5") == 0) {
    st = push(files, n, path);
  } else {
    return unstaged_kind(kind);
  }
  if (st != PX_OK) {
    px_stage_files_free(*files, *n);
    *files = NULL;
    *n = 0;
  }
  return st;
}

// stage_dir/<label>-<hash of key>: label = the last path part of `source`
// with wildcards and odd characters as '_'.
static px_status set_dir(const char *stage_dir, const char *source, const char *key, char *out, size_t cap) {
  char hex[65];
  px_digest_sha256(key, strlen(key), hex);
  char label[64];
  const char *b = base_name(source);
  if (!*b) {  // "dir/": the part before the slash
    size_t len = strlen(source);
    while (len > 0 && source[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && source[start - 1] != '/') start--;
    snprintf(label, sizeof label, "%.*s", (int)(len - start), source + start);
  } else {
    snprintf(label, sizeof label, "%s", b);
  }
  for (char *p = label; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-' ||
          *p == '_'))
      *p = '_';
  if (!*label) snprintf(label, sizeof label, "data");
  int w = snprintf(out, cap, "%s/%s-%.12s", stage_dir, label, hex);
  if (w < 0 || (size_t)w >= cap) return px_error(PX_ERR_INVALID, "--stage %s: the path is too long", stage_dir);
  return PX_OK;
}

px_status px_stage_path(const char *stage_dir, const char *kind, const char *source, char *out, size_t cap) {
  char dir[4096];
  px_status st = set_dir(stage_dir, source, source, dir, sizeof dir);
  if (st != PX_OK) return st;
  int w;
  if (strcmp(kind, "mnist") == 0) w = snprintf(out, cap, "%s", dir);
  else if (strcmp(kind, "tokens") == 0 && px_s3_is_url(source) && !strpbrk(base_name(source), "*?["))
    w = snprintf(out, cap, "%s/%s*", dir, base_name(source));    // an S3 key prefix: the objects that start with it
  else w = snprintf(out, cap, "%s/%s", dir, base_name(source));  // tokens: the same glob; text: the file
  if (w < 0 || (size_t)w >= cap) return px_error(PX_ERR_INVALID, "--stage %s: the path is too long", stage_dir);
  return PX_OK;
}

// Read the old manifest into the entries it names.
static void read_manifest(const char *dir, const char *source, entry *e, const named *by, size_t n) {
  char p[4200];
  snprintf(p, sizeof p, "%s/" MANIFEST, dir);
  FILE *f = fopen(p, "r");
  if (!f) return;
  char line[PATH_CAP];
  bool ok = fgets(line, sizeof line, f) && strncmp(line, MANIFEST_MAGIC "\n", sizeof MANIFEST_MAGIC) == 0;
  if (ok && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    ok = strncmp(line, "source ", 7) == 0 && strcmp(line + 7, source) == 0;
  } else {
    ok = false;
  }
  while (ok && fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    unsigned crc;
    uint64_t size;
    char ver[VER_CAP];
    int off = 0;
    if (sscanf(line, "%8x %" SCNu64 " %95s %n", &crc, &size, ver, &off) != 3 || off == 0) break;
    const ptrdiff_t i = find_name(by, n, line + off);
    if (i < 0) continue;
    e[i].have = true;
    e[i].crc = crc;
    e[i].size = size;
    snprintf(e[i].ver, sizeof e[i].ver, "%s", ver);
  }
  fclose(f);
}

// CRC-32C of a whole file (the copy being verified); false on a read error.
static bool crc_file(const char *path, void *buf, uint64_t *size, uint32_t *crc) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  uint32_t c = 0;
  uint64_t total = 0;
  for (;;) {
    ssize_t got = read(fd, buf, COPY_BUF);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      close(fd);
      return false;
    }
    if (got == 0) break;
    c = px_ckpt_crc32c(c, buf, (size_t)got);
    total += (uint64_t)got;
  }
  close(fd);
  *size = total;
  *crc = c;
  return true;
}

static px_status write_all(int fd, const unsigned char *p, size_t n, const char *tmp) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0)
      return px_error(PX_ERR_IO, "--stage: writing %s failed: %s%s", tmp, strerror(errno),
                      errno == ENOSPC ? " (the stage directory is full: a smaller dataset, or another directory)" : "");
    p += w;
    n -= (size_t)w;
  }
  return PX_OK;
}

// dir/name and its temporary ".<last part>.tmp.<host>.<pid>" in the same
// directory (the rename is then atomic).
static void dst_paths(const char *dir, const char *name, char dst[PATH_CAP], char tmp[TMP_CAP]) {
  char host[64] = "host";
  gethostname(host, sizeof host - 1);
  snprintf(dst, PATH_CAP, "%s/%s", dir, name);
  const char *b = base_name(dst);
  snprintf(tmp, TMP_CAP, "%.*s.%s.tmp.%s.%ld", (int)(b - dst), dst, b, host, (long)getpid());
}

// Copy src into dir/name through a temporary file, the CRC-32C computed on
// the way; the copy gets the source's mtime.  *e gets size, mtime, crc.
static px_status copy_one(const char *src, const char *dir, void *buf, entry *e) {
  char tmp[TMP_CAP], dst[PATH_CAP];
  dst_paths(dir, e->name, dst, tmp);
  int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0)
    return px_error(errno == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "--stage: cannot open %s: %s", src,
                    strerror(errno));
  struct stat sb;
  if (fstat(in, &sb) != 0) {
    close(in);
    return px_error(PX_ERR_IO, "--stage: cannot stat %s: %s", src, strerror(errno));
  }
  posix_fadvise(in, 0, 0, POSIX_FADV_SEQUENTIAL);
  int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) {
    close(in);
    return px_error(PX_ERR_IO, "--stage: cannot create %s: %s", tmp, strerror(errno));
  }
  px_status st = PX_OK;
  uint32_t crc = 0;
  uint64_t total = 0;
  while (st == PX_OK) {
    ssize_t got = read(in, buf, COPY_BUF);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      st = px_error(PX_ERR_IO, "--stage: reading %s failed after %" PRIu64 " bytes: %s", src, total, strerror(errno));
      break;
    }
    if (got == 0) break;
    crc = px_ckpt_crc32c(crc, buf, (size_t)got);
    st = write_all(out, buf, (size_t)got, tmp);
    total += (uint64_t)got;
  }
  if (st == PX_OK && total != (uint64_t)sb.st_size)
    st = px_error(PX_ERR_IO, "--stage: %s changed while it was copied (%" PRIu64 " bytes read, %lld expected)", src,
                  total, (long long)sb.st_size);
  if (st == PX_OK) {
    const struct timespec times[2] = {sb.st_atim, sb.st_mtim};
    if (futimens(out, times) != 0 || fsync(out) != 0)
      st = px_error(PX_ERR_IO, "--stage: finishing %s failed: %s", tmp, strerror(errno));
  }
  close(in);
  if (close(out) != 0 && st == PX_OK) st = px_error(PX_ERR_IO, "--stage: closing %s failed: %s", tmp, strerror(errno));
  if (st == PX_OK && rename(tmp, dst) != 0)
    st = px_error(PX_ERR_IO, "--stage: renaming %s to %s failed: %s", tmp, dst, strerror(errno));
  if (st != PX_OK) {
    unlink(tmp);
    return st;
  }
  e->size = total;
  local_ver(&sb, e->ver, sizeof e->ver);
  e->crc = crc;
  return PX_OK;
}

// Copy the S3 object url (size bytes as listed) into dir/name through a
// temporary file: ranged GETs of S3_CHUNK bytes into one buffer (each
// retried by s3.c on a dropped connection or a 5xx), the CRC-32C computed
// on the way.  *e gets size and crc (its ver is the listing's).
static px_status copy_s3(const char *url, uint64_t size, const char *dir, void *buf, entry *e) {
  char tmp[TMP_CAP], dst[PATH_CAP];
  dst_paths(dir, e->name, dst, tmp);
  int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out < 0) return px_error(PX_ERR_IO, "--stage: cannot create %s: %s", tmp, strerror(errno));
  px_status st = PX_OK;
  uint32_t crc = 0;
  for (uint64_t off = 0; off < size && st == PX_OK;) {
    size_t want = size - off < S3_CHUNK ? (size_t)(size - off) : S3_CHUNK;
    st = px_s3_read_range(url, "--stage", off, want, buf);
    if (st != PX_OK) {
      st = px_error_wrap(st, "--stage: copying %s (listed at %" PRIu64 " bytes) stopped at byte %" PRIu64, url, size,
                         off);
      break;
    }
    crc = px_ckpt_crc32c(crc, buf, want);
    st = write_all(out, buf, want, tmp);
    off += want;
  }
  if (st == PX_OK && fsync(out) != 0)
    st = px_error(PX_ERR_IO, "--stage: finishing %s failed: %s", tmp, strerror(errno));
  if (close(out) != 0 && st == PX_OK) st = px_error(PX_ERR_IO, "--stage: closing %s failed: %s", tmp, strerror(errno));
  if (st == PX_OK && rename(tmp, dst) != 0)
    st = px_error(PX_ERR_IO, "--stage: renaming %s to %s failed: %s", tmp, dst, strerror(errno));
  if (st != PX_OK) {
    unlink(tmp);
    return st;
  }
  e->size = size;
  e->crc = crc;
  return PX_OK;
}

// Remove what is not part of the set (shards of an older version of the
// dataset, which the staged glob would match; images an older listing
// named; temporaries of a crashed run) from dir/rel and below ("" at the
// top); sub-directories left empty go too.  Returns the files removed.
static size_t remove_strays_in(const char *dir, const char *rel, const named *by, size_t n, int depth) {
  char p[PATH_CAP];
  snprintf(p, sizeof p, "%s%s%s", dir, *rel ? "/" : "", rel);
  DIR *d = opendir(p);
  if (!d) return 0;
  size_t removed = 0;
  struct dirent *de;
  char r[NAME_CAP + 256];
  while ((de = readdir(d))) {
    const char *nm = de->d_name;
    if (strcmp(nm, ".") == 0 || strcmp(nm, "..") == 0) continue;
    if (!*rel && (strcmp(nm, ".lock") == 0 || strcmp(nm, MANIFEST) == 0)) continue;
    int w = snprintf(r, sizeof r, "%s%s%s", rel, *rel ? "/" : "", nm);
    if (w < 0 || (size_t)w >= sizeof r) continue;  // longer than any staged name: not the set's, left alone
    snprintf(p, sizeof p, "%s/%s", dir, r);
    bool is_dir = de->d_type == DT_DIR;
    if (de->d_type == DT_UNKNOWN) {
      struct stat sb;
      is_dir = lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
    }
    if (is_dir) {
      if (depth < 32) {
        removed += remove_strays_in(dir, r, by, n, depth + 1);
        rmdir(p);  // fails, as it should, while it holds anything
      }
      continue;
    }
    if (find_name(by, n, r) < 0) removed += unlink(p) == 0;
  }
  closedir(d);
  return removed;
}

// The size and ETag (malloc'ed; "" when S3 gave none) of the one object whose
// key is exactly url's, listed alone.
static px_status s3_one_object(const char *url, uint64_t *size, char **etag) {
  char **u = NULL, **t = NULL;
  uint64_t *z = NULL;
  size_t n = 0;
  *etag = NULL;
  px_status st = px_s3_list_etags(url, "--stage", &u, &z, &t, &n);
  if (st == PX_OK && (n != 1 || strcmp(u[0], url) != 0))
    st = px_error(PX_ERR_NOT_FOUND, "--stage: %s: no object with exactly this key", url);
  if (st == PX_OK) {
    *size = z[0];
    *etag = strdup(t[0] ? t[0] : "");
    if (!*etag) st = px_error(PX_ERR_NOMEM, "--stage: out of memory");
  }
  px_s3_etags_free(t, n);
  px_s3_list_free(u, z, n);
  return st;
}

// The size and version (entry.ver) of a source file now: a local file's
// stat; an S3 object's listing (given, or asked for here: one LIST).
static px_status source_state(const char *file, const uint64_t *s3_size, const char *s3_etag, uint64_t *size, char *ver,
                              size_t cap) {
  if (px_s3_is_url(file)) {
    if (s3_size) {
      *size = *s3_size;
      s3_ver(s3_etag, ver, cap);
      return PX_OK;
    }
    char *etag = NULL;
    px_status st = s3_one_object(file, size, &etag);
    if (st == PX_OK) s3_ver(etag, ver, cap);
    free(etag);
    return st;
  }
  struct stat ss;
  if (stat(file, &ss) != 0)
    return px_error(errno == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "--stage: cannot stat %s: %s", file,
                    strerror(errno));
  if (!S_ISREG(ss.st_mode)) return px_error(PX_ERR_INVALID, "--stage: %s is not a regular file", file);
  *size = (uint64_t)ss.st_size;
  local_ver(&ss, ver, cap);
  return PX_OK;
}

// A staged name: not empty, shorter than NAME_CAP, no newline, not MANIFEST,
// no leading blank (the manifest's fields are blank-separated), and no part
// between slashes empty or starting with '.' (the stage's own .lock and
// temporaries; "." and ".." would leave the set's directory).
static bool name_ok(const char *name) {
  if (!*name || strlen(name) >= NAME_CAP || strchr(name, '\n') || strcmp(name, MANIFEST) == 0 || *name == ' ' ||
      *name == '\t')
    return false;
  for (const char *p = name;;) {
    if (*p == '.' || *p == '/' || *p == '\0') return false;  // the part starts with '.' or is empty
    const char *slash = strchr(p, '/');
    if (!slash) return true;
    p = slash + 1;
  }
}

// px_stage_files, with each file's name in the set (names: NULL, or one per
// file; NULL: base names), and the sizes and ETags of S3 objects when the
// caller listed them (s3_sizes, s3_etags: NULL, or one per file).  The set's
// directory is named after `label` and the hash of `source`, which the
// manifest records.
static px_status stage_set(const char *stage_dir, const char *label, const char *source, char *const *files,
                           char *const *names, size_t n, const uint64_t *s3_sizes, char *const *s3_etags,
                           px_stage_verify verify, px_stage_result *res) {
  memset(res, 0, sizeof *res);
  const double t0 = px_time_now();
  if (!stage_dir || !*stage_dir) return px_error(PX_ERR_INVALID, "--stage: no directory given");
  if (strchr(source, '\n')) return px_error(PX_ERR_INVALID, "--stage: the source \"%s\" holds a newline", source);
  char dir[4096];
  px_status st = set_dir(stage_dir, label, source, dir, sizeof dir);
  if (st != PX_OK) return st;
  snprintf(res->dir, sizeof res->dir, "%s", dir);
  res->files = n;
  entry *e = calloc(n ? n : 1, sizeof *e);
  named *by = calloc(n ? n : 1, sizeof *by);
  uint64_t *cur_size = calloc(n ? n : 1, sizeof *cur_size);  // the sources' size now
  bool *need = calloc(n ? n : 1, sizeof *need);
  void *buf = malloc(COPY_BUF), *s3_buf = NULL;
  if (!e || !by || !buf || !cur_size || !need) {
    free(e);
    free(by);
    free(cur_size);
    free(need);
    free(buf);
    return px_error(PX_ERR_NOMEM, "--stage: out of memory for a set of %zu files", n);
  }
  for (size_t i = 0; i < n && st == PX_OK; i++) {
    e[i].name = names ? names[i] : base_name(files[i]);
    by[i] = (named){e[i].name, i};
    if (!name_ok(e[i].name))
      st = px_error(PX_ERR_INVALID,
                    "--stage: %s: its name in the stage \"%.200s\" is empty, too long (%d bytes at most), holds a "
                    "newline, starts with a blank, is " MANIFEST
                    " or has a part that is empty or starts with '.' (the stage's own names)",
                    files[i], e[i].name, NAME_CAP - 1);
  }
  if (st == PX_OK) qsort(by, n, sizeof *by, named_cmp);
  for (size_t k = 1; k < n && st == PX_OK; k++)
    if (strcmp(by[k - 1].name, by[k].name) == 0)
      st = px_error(PX_ERR_INVALID, "--stage: %s and %s would both be staged as %s%s", files[by[k - 1].i],
                    files[by[k].i], by[k].name, names ? "" : " (the stage holds the files side by side by name)");
  int lock = -1;
  if (st == PX_OK) st = px_mkdir_p(dir, "--stage", false);
  if (st == PX_OK) {
    char lp[4200];
    snprintf(lp, sizeof lp, "%s/.lock", dir);
    lock = open(lp, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0) st = px_error(PX_ERR_IO, "--stage: cannot create %s: %s", lp, strerror(errno));
    else
      while (flock(lock, LOCK_EX) != 0 && errno == EINTR) {}
  }
  // Which files to copy: those whose source moved on or whose copy is not
  // the one the manifest describes.
  size_t n_need = 0;
  uint64_t need_bytes = 0;
  if (st == PX_OK) read_manifest(dir, source, e, by, n);
  for (size_t i = 0; i < n && st == PX_OK; i++) {
    struct stat ds;
    char cur_ver[VER_CAP];
    st = source_state(files[i], s3_sizes ? &s3_sizes[i] : NULL, s3_etags ? s3_etags[i] : NULL, &cur_size[i], cur_ver,
                      sizeof cur_ver);
    if (st != PX_OK) break;
    res->bytes += cur_size[i];
    char dp[PATH_CAP];
    snprintf(dp, sizeof dp, "%s/%s", dir, e[i].name);
    const bool same_source = e[i].have && e[i].size == cur_size[i] && strcmp(e[i].ver, cur_ver) == 0;
    bool ok = same_source && stat(dp, &ds) == 0 && S_ISREG(ds.st_mode) && (uint64_t)ds.st_size == e[i].size;
    if (ok && verify == PX_STAGE_VERIFY_FULL) {
      uint64_t sz = 0;
      uint32_t crc = 0;
      ok = crc_file(dp, buf, &sz, &crc) && sz == e[i].size && crc == e[i].crc;
      res->bytes_verified += sz;
    }
    if (!ok) {
      res->damaged += same_source;
      need[i] = true;
      n_need++;
      need_bytes += cur_size[i];
      // The version to record: an S3 object's from the listing (a local
      // file's is taken again when it is copied).
      snprintf(e[i].ver, sizeof e[i].ver, "%s", cur_ver);
    }
  }
  if (st == PX_OK && n_need > 0) {
    // The old manifest goes first: a run that dies from here on leaves no
    // manifest, and the next one copies everything again.
    char mp[4200];
    snprintf(mp, sizeof mp, "%s/" MANIFEST, dir);
    if (unlink(mp) != 0 && errno != ENOENT)
      st = px_error(PX_ERR_IO, "--stage: cannot remove %s: %s", mp, strerror(errno));
    // Files not in the set go before the space is counted: a set shrunk
    // since the last run frees what it no longer holds.
    if (st == PX_OK) remove_strays_in(dir, "", by, n, 0);
    struct statvfs vfs;
    if (st == PX_OK && statvfs(dir, &vfs) == 0) {
      uint64_t have = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
      if (need_bytes > have)
        st = px_error(PX_ERR_IO, "--stage: %s has %.1f MB free; the %zu file(s) to copy from %s need %.1f MB",
                      stage_dir, (double)have / 1e6, n_need, source, (double)need_bytes / 1e6);
    }
    char made[PATH_CAP] = "";  // the last sub-directory made (a listing's images come folder by folder)
    for (size_t i = 0; i < n && st == PX_OK; i++) {
      if (!need[i]) continue;
      const char *slash = strrchr(e[i].name, '/');
      if (slash) {
        char sub[PATH_CAP];
        snprintf(sub, sizeof sub, "%s/%.*s", dir, (int)(slash - e[i].name), e[i].name);
        if (strcmp(sub, made) != 0) {
          st = px_mkdir_p(sub, "--stage", false);
          if (st != PX_OK) break;
          snprintf(made, sizeof made, "%s", sub);
        }
      }
      if (px_s3_is_url(files[i])) {
        if (!s3_buf && !(s3_buf = malloc(S3_CHUNK))) {
          st = px_error(PX_ERR_NOMEM, "--stage: out of memory for a %zu MiB copy buffer", S3_CHUNK >> 20);
          break;
        }
        st = copy_s3(files[i], cur_size[i], dir, s3_buf, &e[i]);
      } else {
        st = copy_one(files[i], dir, buf, &e[i]);
      }
      if (st == PX_OK) {
        res->copied++;
        res->bytes_copied += e[i].size;
      }
    }
  }
  // Nothing to copy, but a file dropped from the source: the manifest is
  // rewritten without it.
  const bool dropped = st == PX_OK && n_need == 0 && remove_strays_in(dir, "", by, n, 0) > 0;
  if (st == PX_OK && (n_need > 0 || dropped)) {
    size_t cap = 64 + strlen(source);
    for (size_t i = 0; i < n; i++) cap += 8 + 1 + 20 + 1 + strlen(e[i].ver) + 1 + strlen(e[i].name) + 1;
    char *m = malloc(cap);
    if (!m) {
      st = px_error(PX_ERR_NOMEM, "--stage: out of memory");
    } else {
      size_t len = (size_t)snprintf(m, cap, MANIFEST_MAGIC "\nsource %s\n", source);
      for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(m + len, cap - len, "%08x %" PRIu64 " %s %s\n", e[i].crc, e[i].size, e[i].ver,
                                e[i].name);
      char mp[4200];
      snprintf(mp, sizeof mp, "%s/" MANIFEST, dir);
      st = px_write_file_atomic(mp, m, len);
      free(m);
    }
  }
  if (lock >= 0) close(lock);  // releases the flock
  free(need);
  free(e);
  free(by);
  free(cur_size);
  free(buf);
  free(s3_buf);
  res->reused = st == PX_OK ? n - res->copied : 0;
  res->seconds = px_time_now() - t0;
  return st;
}

px_status px_stage_files(const char *stage_dir, const char *source, char *const *files, size_t n,
                         px_stage_verify verify, px_stage_result *res) {
  return stage_set(stage_dir, source, source, files, NULL, n, NULL, NULL, verify, res);
}

// The source as an absolute path (its directory resolved: runs from other
// directories, or through a symlink, find the same staged set); a glob's
// last part is kept as it is.
static px_status canonical(const char *source, char *out, size_t cap) {
  if (strncmp(source, "s3://", 5) == 0) {
    snprintf(out, cap, "%s", source);
    return PX_OK;
  }
  char dir[4096], *real;
  const char *slash = strrchr(source, '/');
  const char *last = slash ? slash + 1 : source;
  if (!*last || !strpbrk(last, "*?[")) {  // a directory or a file: all of it
    real = realpath(source, NULL);
    if (!real)
      return px_error(errno == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "--stage: %s: %s", source, strerror(errno));
    snprintf(out, cap, "%s", real);
  } else {
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == source) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - source), source);
    real = realpath(dir, NULL);
    if (!real) return px_error(errno == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "--stage: %s: %s", dir, strerror(errno));
    snprintf(out, cap, "%s/%s", strcmp(real, "/") == 0 ? "" : real, last);
  }
  free(real);
  return PX_OK;
}

px_status px_stage_source(px_comm *comm, const char *stage_dir, const char *kind, const char *source,
                          px_stage_verify verify, char *staged, size_t cap, px_stage_result *res) {
  memset(res, 0, sizeof *res);
  px_status st = PX_OK;
  // Local rank 0 of each node copies; the others only wait.  The wait is a
  // reduction over the whole communicator: it is the barrier and it tells
  // every rank whether any node failed, so all fail together.
  char key[4096];
  st = canonical(source, key, sizeof key);
  if (st == PX_OK && px_comm_local_rank(comm) == 0 && px_s3_is_url(key)) {
    // One listing gives the objects, their sizes and ETags.
    char **urls = NULL, **etags = NULL;
    uint64_t *sizes = NULL;
    size_t n = 0;
    st = s3_source_files(kind, key, &urls, &sizes, &etags, &n);
    if (st == PX_OK) st = stage_set(stage_dir, key, key, urls, NULL, n, sizes, etags, verify, res);
    px_s3_etags_free(etags, n);
    px_s3_list_free(urls, sizes, n);
  } else if (st == PX_OK && px_comm_local_rank(comm) == 0) {
    char **files = NULL;
    size_t n = 0;
    st = px_stage_source_files(kind, key, &files, &n);
    if (st == PX_OK) st = px_stage_files(stage_dir, key, files, n, verify, res);
    px_stage_files_free(files, n);
  }
  int32_t failed = st != PX_OK;
  px_status cst = px_comm_allreduce(comm, &failed, 1, PX_I32, PX_MAX);
  if (cst != PX_OK) return px_error_wrap(cst, "--stage %s: waiting for the node's copy", stage_dir);
  if (st != PX_OK) return st;
  if (failed)
    return px_error(PX_ERR_IO,
                    "--stage %s: staging %s failed on another rank (the copying rank of its node says "
                    "why)",
                    stage_dir, source);
  return px_stage_path(stage_dir, kind, key, staged, cap);
}

// ---- Image listings (px_stage_images) ----------------------------------------

// A listing's image path as its name in the stage: "." parts and repeated
// slashes dropped.  An absolute path, a ".." part, or a name the stage
// cannot hold is an error naming the listing and the line.
static px_status image_name(const char *path, const char *csv, size_t line, char **out) {
  *out = NULL;
  if (path[0] == '/')
    return px_error(PX_ERR_INVALID,
                    "--stage: csv %s line %zu: the image path %s is absolute; staging copies the images below the "
                    "listing's root, so the listing must give paths relative to it (--image-root)",
                    csv, line, path);
  size_t len = strlen(path);
  char *name = malloc(len + 1);
  if (!name) return px_error(PX_ERR_NOMEM, "--stage: out of memory");
  size_t k = 0;
  for (const char *p = path; *p;) {
    const char *end = strchr(p, '/');
    size_t part = end ? (size_t)(end - p) : strlen(p);
    if (part == 2 && p[0] == '.' && p[1] == '.') {
      free(name);
      return px_error(PX_ERR_INVALID,
                      "--stage: csv %s line %zu: the image path %s has a \"..\" part; staging copies the images "
                      "below the listing's root, so the paths must stay below it",
                      csv, line, path);
    }
    if (part > 0 && !(part == 1 && p[0] == '.')) {
      if (k) name[k++] = '/';
      memcpy(name + k, p, part);
      k += part;
    }
    p += part + (end ? 1 : 0);
  }
  name[k] = '\0';
  if (!name_ok(name)) {
    px_error(PX_ERR_INVALID,
             "--stage: csv %s line %zu: the image path %s cannot be staged: expected a file name (%d bytes at most) "
             "whose parts do not start with '.' or a blank, and not " MANIFEST,
             csv, line, path, NAME_CAP - 1);
    free(name);
    return PX_ERR_INVALID;
  }
  *out = name;
  return PX_OK;
}

// An object's size and ETag: from the root's listing (urls sorted in by),
// else listed alone (the listing and the synset mapping may lie elsewhere).
static px_status s3_state(const char *url, const named *by, size_t m, const uint64_t *sizes, char *const *etags,
                          uint64_t *size, char **etag) {
  ptrdiff_t j = find_name(by, m, url);
  if (j >= 0) {
    *size = sizes[j];
    *etag = strdup(etags[j] ? etags[j] : "");
    return *etag ? PX_OK : px_error(PX_ERR_NOMEM, "--stage: out of memory");
  }
  return s3_one_object(url, size, etag);
}

typedef struct image_set {
  char **files, **names;  // (n,) sources and names in the stage
  uint64_t *sizes;        // (n,) S3 objects: from the listing (NULL for local files)
  char **etags;
  size_t n;
} image_set;

static void image_set_free(image_set *s) {
  px_stage_files_free(s->files, s->n);
  px_stage_files_free(s->names, s->n);
  if (s->etags) px_s3_etags_free(s->etags, s->n);
  free(s->sizes);
  memset(s, 0, sizeof *s);
}

static px_status set_push(image_set *s, const char *file, const char *name) {
  size_t n = s->n;
  char **f = realloc(s->files, (n + 1) * sizeof *f);
  if (f) s->files = f;
  char **nm = f ? realloc(s->names, (n + 1) * sizeof *nm) : NULL;
  if (nm) s->names = nm;
  if (!f || !nm) return px_error(PX_ERR_NOMEM, "--stage: out of memory listing images");
  f[n] = strdup(file);
  nm[n] = strdup(name);
  if (!f[n] || !nm[n]) {
    free(f[n]);
    free(nm[n]);
    return px_error(PX_ERR_NOMEM, "--stage: out of memory listing images");
  }
  s->n++;
  return PX_OK;
}

// The files of the set: the listing, the synset mapping (syn: "" for none)
// and every image the listing names (each once), under root.
static px_status image_files(const char *csv, const char *root, px_csv_layout layout, const char *syn, image_set *out) {
  memset(out, 0, sizeof *out);
  char *text = NULL, *syn_text = NULL;
  size_t size = 0, syn_size = 0;
  px_synsets syns = {0};
  px_image_listing list = {0};
  named *by = NULL;
  px_status st = PX_OK;
  if (*syn) {
    st = px_data_read_file(syn, "synsets", false, (void **)&syn_text, &syn_size);
    if (st == PX_OK) st = px_synsets_parse(syn_text, syn_size, syn, &syns);
  }
  if (st == PX_OK) st = px_data_read_file(csv, "csv", false, (void **)&text, &size);
  // The paths as the listing writes them (no root joined).
  if (st == PX_OK) st = px_image_listing_parse(text, size, csv, layout, &syns, NULL, &list);
  if (st == PX_OK && !(by = calloc(list.count ? list.count : 1, sizeof *by)))
    st = px_error(PX_ERR_NOMEM, "--stage: out of memory");
  size_t made = 0;
  for (; made < list.count && st == PX_OK; made++) {
    char *name;
    st = image_name(list.paths[made], csv, list.lines[made], &name);
    if (st == PX_OK) by[made] = (named){name, made};
  }
  if (st == PX_OK) qsort(by, list.count, sizeof *by, named_cmp);
  if (st == PX_OK) st = set_push(out, csv, base_name(csv));
  if (st == PX_OK && *syn) st = set_push(out, syn, base_name(syn));
  const size_t rlen = strlen(root);
  const bool slash = rlen > 0 && root[rlen - 1] == '/';
  for (size_t k = 0; k < list.count && st == PX_OK; k++) {
    if (k > 0 && strcmp(by[k - 1].name, by[k].name) == 0) continue;  // listed again: one copy
    const char *path = list.paths[by[k].i];
    size_t cap = rlen + strlen(path) + 2;
    char *file = malloc(cap);
    if (!file) {
      st = px_error(PX_ERR_NOMEM, "--stage: out of memory");
      break;
    }
    snprintf(file, cap, "%s%s%s", root, slash ? "" : "/", path);
    st = set_push(out, file, by[k].name);
    free(file);
  }
  for (size_t k = 0; k < made; k++) free((char *)by[k].name);
  free(by);
  px_image_listing_free(&list);
  px_synsets_free(&syns);
  free(text);
  free(syn_text);
  if (st == PX_OK && px_s3_is_url(root)) {
    // One listing of everything below the root gives the images' sizes and
    // ETags (a LIST per image would take as long as the copy).
    char *prefix = malloc(rlen + 2);
    char **u = NULL, **t = NULL;
    uint64_t *z = NULL;
    size_t m = 0;
    named *ub = NULL;
    if (!prefix) st = px_error(PX_ERR_NOMEM, "--stage: out of memory");
    if (st == PX_OK) {
      snprintf(prefix, rlen + 2, "%s%s", root, slash ? "" : "/");
      st = px_s3_list_etags(prefix, "--stage: images", &u, &z, &t, &m);
      if (st == PX_ERR_NOT_FOUND) st = PX_OK;  // nothing below the root: each image is then not found below
    }
    if (st == PX_OK && !(ub = calloc(m ? m : 1, sizeof *ub))) st = px_error(PX_ERR_NOMEM, "--stage: out of memory");
    for (size_t j = 0; j < m && st == PX_OK; j++) ub[j] = (named){u[j], j};
    if (st == PX_OK) qsort(ub, m, sizeof *ub, named_cmp);
    if (st == PX_OK) {
      out->sizes = calloc(out->n, sizeof *out->sizes);
      out->etags = calloc(out->n, sizeof *out->etags);
      if (!out->sizes || !out->etags) st = px_error(PX_ERR_NOMEM, "--stage: out of memory");
    }
    for (size_t i = 0; i < out->n && st == PX_OK; i++) {
      st = s3_state(out->files[i], ub, m, z, t, &out->sizes[i], &out->etags[i]);
      if (st != PX_OK && i >= (*syn ? 2u : 1u))
        st = px_error_wrap(st, "--stage: csv %s names the image %s (as %s below the root %s)", csv, out->files[i],
                           out->names[i], root);
    }
    free(ub);
    px_s3_etags_free(t, m);
    px_s3_list_free(u, z, m);
    free(prefix);
  }
  if (st != PX_OK) image_set_free(out);
  return st;
}

px_status px_stage_images(px_comm *comm, const char *stage_dir, const px_image_opts *src, px_stage_verify verify,
                          px_staged_images *out, px_stage_result *res) {
  memset(res, 0, sizeof *res);
  out->csv[0] = out->synsets[0] = '\0';
  if (!src || !src->csv || !*src->csv) return px_error(PX_ERR_INVALID, "--stage: images: no listing (CSV) given");
  const bool imagenet = src->layout == PX_CSV_IMAGENET;
  const char *kind = imagenet ? "imagenet" : "images";
  if (imagenet && (!src->synsets || !*src->synsets))
    return px_error(PX_ERR_INVALID, "--stage: imagenet %s: the synset mapping (--synsets) is needed to read it",
                    src->csv);
  char csv[4096], root[4096], syn[4096] = "";
  px_status st = canonical(src->csv, csv, sizeof csv);
  if (st == PX_OK && src->root && *src->root) {
    st = canonical(src->root, root, sizeof root);
  } else if (st == PX_OK) {  // the listing's directory
    const char *slash = strrchr(csv, '/');
    snprintf(root, sizeof root, "%.*s", slash == csv ? 1 : (int)(slash - csv), csv);
  }
  if (st == PX_OK && imagenet) st = canonical(src->synsets, syn, sizeof syn);
  // The set is the listing read from this root (and with this mapping).
  char key[3 * 4096 + 64];
  snprintf(key, sizeof key, "%s root=%s layout=%s%s%s", csv, root, kind, *syn ? " synsets=" : "", syn);
  if (st == PX_OK && px_comm_local_rank(comm) == 0) {
    image_set set;
    st = image_files(csv, root, src->layout, syn, &set);
    if (st == PX_OK) {
      st = stage_set(stage_dir, csv, key, set.files, set.names, set.n, set.sizes, set.etags, verify, res);
      image_set_free(&set);
    }
  }
  int32_t failed = st != PX_OK;
  px_status cst = px_comm_allreduce(comm, &failed, 1, PX_I32, PX_MAX);
  if (cst != PX_OK) return px_error_wrap(cst, "--stage %s: waiting for the node's copy", stage_dir);
  if (st != PX_OK) return st;
  if (failed)
    return px_error(PX_ERR_IO,
                    "--stage %s: staging %s %s failed on another rank (the copying rank of its node says why)",
                    stage_dir, kind, src->csv);
  char dir[4096];
  st = set_dir(stage_dir, csv, key, dir, sizeof dir);
  if (st != PX_OK) return st;
  int w = snprintf(out->csv, sizeof out->csv, "%s/%s", dir, base_name(csv));
  if (w >= 0 && (size_t)w < sizeof out->csv && *syn)
    w = snprintf(out->synsets, sizeof out->synsets, "%s/%s", dir, base_name(syn));
  if (w < 0 || (size_t)w >= sizeof out->csv)
    return px_error(PX_ERR_INVALID, "--stage %s: the path is too long", stage_dir);
  return PX_OK;
}
