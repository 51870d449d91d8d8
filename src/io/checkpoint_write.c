// Writing checkpoints.  The order of operations is the guarantee:
//
//   1. mkdir <dir>/.step_<step>.partial.<host>.<pid>/
//   2. each file: written and fsynced, its SHA-256 computed from the same
//      bytes meanwhile;  then SHA256SUMS, fsynced;  then the directory
//   3. rename the directory to <dir>/step_<step>  (atomic), fsync <dir>
//   4. rotation (checkpoint_dir.c)
//
// A crash before 3 leaves a .partial directory, which readers skip and the
// next write on this host removes; after 3 the checkpoint is complete.  When
// step_<step> exists already, step 3 swaps the two directories in one
// renameat2(RENAME_EXCHANGE) and then deletes the old one, so at every
// moment one complete step_<step> exists; on file systems without the swap,
// the old directory is first renamed aside (.old), and a writer that dies
// between the two renames leaves it to be put back by the next write.
#define _GNU_SOURCE  // renameat2 and RENAME_EXCHANGE (glibc 2.28)
#include "io/checkpoint.h"
#include "io/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PX_CKPT_STEP_MAX INT64_C(999999999999999999)  // 18 digits: what a reader parses

/* ---- small file-system helpers ------------------------------------------------ */

px_status px_ckpt_fsync_dir(const char *dir, const char *ckpt) {
  char why[128];
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return px_error(PX_ERR_IO, "checkpoint %s: cannot open directory %s to fsync it: %s", ckpt, dir,
                    px_io_strerror(err, why, sizeof why));
  }
  px_status st = PX_OK;
  // Some file systems cannot fsync a directory (EINVAL): nothing to do there.
  if (fsync(fd) != 0 && errno != EINVAL && errno != ENOTSUP) {
    int err = errno;
    st = px_error(PX_ERR_IO, "checkpoint %s: fsync of directory %s failed: %s", ckpt, dir,
                  px_io_strerror(err, why, sizeof why));
  }
  close(fd);
  return st;
}

// mkdir -p, each new directory made durable in its parent (base's one copy).
px_status px_ckpt_make_dirs(char *dir, const char *ckpt) {
  char what[1100];
  snprintf(what, sizeof what, "checkpoint %s", ckpt);
  return px_mkdir_p(dir, what, true);
}

static int write_all(int fd, const unsigned char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w == 0) errno = EIO;  // not expected from a regular file; never loop forever
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

// SHA-256 of the concatenation of chunks, and each chunk's CRC-32C, on a
// thread of its own while the caller's thread writes the same bytes: both
// only read them, and hashing, even with SHA-NI, is slow enough to add
// noticeably to the write's time otherwise (docs/PERFORMANCE.md, "Figures
// behind code comments").  The CRC runs block by block right after the
// SHA-256 of the same block, while it is still in cache: one pass over
// memory for both checksums.
typedef struct hash_job {
  const px_io_chunk *chunks;
  int n;
  uint32_t *crcs;  // n entries, or NULL
  unsigned char digest[PX_SHA256_BYTES];
} hash_job;

#define HASH_BLOCK ((size_t)256 << 10)     // fits L2 alongside the SHA state
#define WRITEBACK_SLICE ((size_t)8 << 20)  // writeback is started every 8 MiB written

static void *hash_chunks(void *arg) {
  hash_job *job = arg;
  px_sha256 s;
  px_sha256_init(&s);
  for (int i = 0; i < job->n; i++) {
    const unsigned char *p = job->chunks[i].data;
    size_t left = job->chunks[i].size;
    uint32_t crc = 0;
    while (left) {
      size_t k = left < HASH_BLOCK ? left : HASH_BLOCK;
      px_sha256_update(&s, p, k);
      if (job->crcs) crc = px_ckpt_crc32c(crc, p, k);
      p += k;
      left -= k;
    }
    if (job->crcs) job->crcs[i] = crc;
  }
  px_sha256_final(&s, job->digest);
  return NULL;
}

px_status px_ckpt_write_file(const char *path, const char *ckpt, const char *name, const px_io_chunk *chunks, int n,
                             unsigned char digest[PX_SHA256_BYTES]) {
  return px_ckpt_write_file_crc(path, ckpt, name, chunks, n, digest, NULL);
}

// Writes the concatenation of chunks to path (a new file) and fsyncs it.
static px_status write_sync(const char *path, const char *ckpt, const char *name, const px_io_chunk *chunks, int n) {
  char why[128];
  const char *step = "create";
  int err = 0;
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) goto fail;
  step = "write";
  {
    // Written in slices, each handed to the disk (writeback started, not
    // waited for) as soon as it is in the page cache, so the disk works
    // while the rest is written and the fsync below only waits for the
    // tail: write then fsync in sequence took write + disk time.
    off_t done = 0, flushed = 0;
    for (int i = 0; i < n; i++) {
      const unsigned char *p = chunks[i].data;
      size_t left = chunks[i].size;
      while (left) {
        size_t k = left < WRITEBACK_SLICE ? left : WRITEBACK_SLICE;
        if (write_all(fd, p, k) != 0) goto fail;
        p += k;
        left -= k;
        done += (off_t)k;
        if (done - flushed >= (off_t)WRITEBACK_SLICE) {
          (void)sync_file_range(fd, flushed, done - flushed, SYNC_FILE_RANGE_WRITE);  // a hint: errors are fsync's
          flushed = done;
        }
      }
    }
  }
  step = "fsync";
  if (fsync(fd) != 0) goto fail;
  step = "close";
  int f = fd;
  fd = -1;
  if (close(f) != 0) goto fail;
  return PX_OK;

fail:
  err = errno;
  if (fd >= 0) close(fd);
  return px_error(PX_ERR_IO,
                  "checkpoint %s: %s of file \"%s\" failed: %s; the checkpoints already in the directory "
                  "are untouched",
                  ckpt, step, name, px_io_strerror(err, why, sizeof why));
}

// Writes the concatenation of chunks to path (a new file), fsynced, its
// SHA-256 into digest and, when crcs is not NULL, each chunk's CRC-32C.
px_status px_ckpt_write_file_crc(const char *path, const char *ckpt, const char *name, const px_io_chunk *chunks, int n,
                                 unsigned char digest[PX_SHA256_BYTES], uint32_t *crcs) {
  size_t total = 0;
  for (int i = 0; i < n; i++) total += chunks[i].size;
  hash_job job = {chunks, n, crcs, {0}};
  pthread_t hasher;
  // Small files are hashed here: a thread costs more than it saves.
  bool threaded = total >= ((size_t)4 << 20) && pthread_create(&hasher, NULL, hash_chunks, &job) == 0;
  px_status st = write_sync(path, ckpt, name, chunks, n);
  if (threaded) pthread_join(hasher, NULL);
  else if (st == PX_OK) hash_chunks(&job);
  if (st == PX_OK) memcpy(digest, job.digest, PX_SHA256_BYTES);
  return st;
}

px_status px_ckpt_write_item(const char *tmp, const char *final, const px_ckpt_item *it, char hex[PX_SHA256_HEX]) {
  return px_ckpt_write_item_crc(tmp, final, it, hex, NULL, NULL);
}

px_status px_ckpt_write_item_crc(const char *tmp, const char *final, const px_ckpt_item *it, char hex[PX_SHA256_HEX],
                                 px_ckpt_chunk_crc **crcs, int *n_crcs) {
  if (crcs) *crcs = NULL;
  if (n_crcs) *n_crcs = 0;
  size_t plen = strlen(tmp) + strlen(final) + strlen(it->name) + 2;
  char *file = malloc(plen), *label = malloc(plen);
  if (!file || !label) {
    free(file);
    free(label);
    return px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory for a path", final);
  }
  snprintf(file, plen, "%s/%s", tmp, it->name);
  snprintf(label, plen, "%s/%s", final, it->name);  // the name a user will see in messages
  unsigned char digest[PX_SHA256_BYTES];
  px_status st;
  if (it->tensors) {
    px_st_image img;
    st = px_st_image_build(label, it->tensors, it->metadata, it->n_metadata, &img);
    if (st == PX_OK) {
      uint32_t *c = crcs ? malloc((size_t)(img.n_chunks > 0 ? img.n_chunks : 1) * sizeof *c) : NULL;
      px_ckpt_chunk_crc *out = crcs ? malloc((size_t)(img.n_chunks > 0 ? img.n_chunks : 1) * sizeof *out) : NULL;
      if (crcs && (!c || !out)) st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", label);
      else st = px_ckpt_write_file_crc(file, final, it->name, img.chunks, img.n_chunks, digest, c);
      if (st == PX_OK && crcs) {
        for (int i = 0; i < img.n_chunks; i++)
          out[i] = (px_ckpt_chunk_crc){img.chunks[i].data, img.chunks[i].size, c[i]};
        *crcs = out;
        *n_crcs = img.n_chunks;
        out = NULL;
      }
      free(out);
      free(c);
      px_st_image_free(&img);
    }
  } else {
    px_io_chunk c = {it->bytes, it->n_bytes};
    st = px_ckpt_write_file(file, final, it->name, &c, 1, digest);
  }
  if (st == PX_OK) px_sha256_hex(digest, hex);
  free(file);
  free(label);
  return st;
}

/* ---- several items at once ---------------------------------------------------------- */

// Items of at least this many bytes get a thread of their own.
#define ITEM_THREAD_MIN ((size_t)4 << 20)

static size_t item_bytes(const px_ckpt_item *it) {
  if (!it->tensors) return it->n_bytes;
  size_t n = 0;
  for (int i = 0; i < it->tensors->count; i++) n += px_tensor_nbytes(&it->tensors->items[i].tensor);
  return n;
}

// A large item: its bytes as chunks, written by a thread of its own while
// the caller's thread hashes it (paired with another one: px_sha256_update2).
typedef struct big_item {
  const char *final, *name;
  char *file, *label;
  px_st_image img;
  bool has_img;
  px_io_chunk one;
  const px_io_chunk *chunks;
  int n_chunks;
  uint32_t *crc;  // per chunk, when wanted
  px_sha256 sha;
  int at;  // hashing: the chunk, and the bytes of it done
  size_t off;
  px_status st;
  char msg[1024];  // the writer thread's error message
} big_item;

static void *write_big(void *arg) {
  big_item *b = arg;
  b->st = write_sync(b->file, b->final, b->name, b->chunks, b->n_chunks);
  if (b->st != PX_OK) snprintf(b->msg, sizeof b->msg, "%s", px_last_error());
  return NULL;
}

// The next at most HASH_BLOCK bytes of b still to hash (within one chunk).
static size_t next_span(big_item *b, const unsigned char **p) {
  while (b->at < b->n_chunks && b->off == b->chunks[b->at].size) {
    b->at++;
    b->off = 0;
  }
  if (b->at == b->n_chunks) return 0;
  size_t k = b->chunks[b->at].size - b->off;
  *p = (const unsigned char *)b->chunks[b->at].data + b->off;
  return k < HASH_BLOCK ? k : HASH_BLOCK;
}

static void hashed(big_item *b, const unsigned char *p, size_t k) {
  if (b->crc) b->crc[b->at] = px_ckpt_crc32c(b->crc[b->at], p, k);
  b->off += k;
}

// Hashes every big item, two at a time while two are left: x and y (x <
// y) are the pair; every item below y but x is done; y == n: x alone.
static void hash_big(big_item *bs, int n) {
  int x = 0, y = 1;
  while (x < n) {
    const unsigned char *px = NULL, *py = NULL;
    const size_t kx = next_span(&bs[x], &px);
    if (!kx) {
      x = y;
      y = x + 1;
      continue;
    }
    const size_t ky = y < n ? next_span(&bs[y], &py) : 0;
    if (y < n && !ky) {
      y++;
      continue;
    }
    if (y < n) {
      px_sha256_update2(&bs[x].sha, px, kx, &bs[y].sha, py, ky);
      hashed(&bs[y], py, ky);
    } else {
      px_sha256_update(&bs[x].sha, px, kx);
    }
    hashed(&bs[x], px, kx);
  }
}

static void big_free(big_item *b) {
  if (b->has_img) px_st_image_free(&b->img);
  free(b->crc);
  free(b->file);
  free(b->label);
}

px_status px_ckpt_write_items(const char *tmp, const char *final, const px_ckpt_item *items, int n_items,
                              char (*hex)[PX_SHA256_HEX], px_ckpt_chunk_crc **crcs, int *n_crcs) {
  int n_big = 0;
  for (int i = 0; i < n_items; i++) n_big += item_bytes(&items[i]) >= ITEM_THREAD_MIN;
  big_item *bs = n_big >= 2 ? calloc((size_t)n_big, sizeof *bs) : NULL;
  pthread_t *tid = n_big >= 2 ? calloc((size_t)n_big, sizeof *tid) : NULL;
  bool *threaded = n_big >= 2 ? calloc((size_t)n_big, sizeof *threaded) : NULL;
  px_status st = PX_OK;
  if (n_big >= 2 && (!bs || !tid || !threaded)) st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", final);
  // Two large items or more: each written by a thread of its own, all
  // hashed here, two at a time; then the small ones, one by one.
  int nb = 0;
  for (int i = 0; i < n_items && st == PX_OK && n_big >= 2; i++) {
    const px_ckpt_item *it = &items[i];
    if (item_bytes(it) < ITEM_THREAD_MIN) continue;
    big_item *b = &bs[nb++];
    size_t plen = strlen(tmp) + strlen(final) + strlen(it->name) + 2;
    b->final = final;
    b->name = it->name;
    b->file = malloc(plen);
    b->label = malloc(plen);
    if (!b->file || !b->label) {
      st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory for a path", final);
      break;
    }
    snprintf(b->file, plen, "%s/%s", tmp, it->name);
    snprintf(b->label, plen, "%s/%s", final, it->name);
    if (it->tensors) {
      if ((st = px_st_image_build(b->label, it->tensors, it->metadata, it->n_metadata, &b->img)) != PX_OK) break;
      b->has_img = true;
      b->chunks = b->img.chunks;
      b->n_chunks = b->img.n_chunks;
    } else {
      b->one = (px_io_chunk){it->bytes, it->n_bytes};
      b->chunks = &b->one;
      b->n_chunks = 1;
    }
    if (crcs && it->tensors && !(b->crc = calloc((size_t)(b->n_chunks > 0 ? b->n_chunks : 1), sizeof *b->crc))) {
      st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", final);
      break;
    }
    px_sha256_init(&b->sha);
  }
  if (st == PX_OK && n_big >= 2) {
    for (int k = 0; k < nb; k++) threaded[k] = pthread_create(&tid[k], NULL, write_big, &bs[k]) == 0;
    hash_big(bs, nb);
    for (int k = 0; k < nb; k++) {
      if (threaded[k]) pthread_join(tid[k], NULL);
      else write_big(&bs[k]);
    }
    for (int k = 0, i = 0; i < n_items; i++) {
      if (item_bytes(&items[i]) < ITEM_THREAD_MIN) continue;
      big_item *b = &bs[k++];
      if (b->st != PX_OK) {
        if (st == PX_OK) st = px_error(b->st, "%s", b->msg);
        continue;
      }
      unsigned char digest[PX_SHA256_BYTES];
      px_sha256_final(&b->sha, digest);
      px_sha256_hex(digest, hex[i]);
      if (crcs && b->crc) {
        px_ckpt_chunk_crc *out = malloc((size_t)(b->n_chunks > 0 ? b->n_chunks : 1) * sizeof *out);
        if (!out) {
          if (st == PX_OK) st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", final);
          continue;
        }
        for (int c = 0; c < b->n_chunks; c++)
          out[c] = (px_ckpt_chunk_crc){b->chunks[c].data, b->chunks[c].size, b->crc[c]};
        crcs[i] = out;
        n_crcs[i] = b->n_chunks;
      }
    }
  }
  for (int i = 0; i < n_items && st == PX_OK; i++) {
    if (n_big >= 2 && item_bytes(&items[i]) >= ITEM_THREAD_MIN) continue;
    st = px_ckpt_write_item_crc(tmp, final, &items[i], hex[i], crcs ? &crcs[i] : NULL, n_crcs ? &n_crcs[i] : NULL);
  }
  for (int k = 0; k < nb; k++) big_free(&bs[k]);
  free(bs);
  free(tid);
  free(threaded);
  return st;
}

/* ---- arguments -------------------------------------------------------------------- */

px_status px_ckpt_check_items(const px_ckpt_item *items, int n_items) {
  if (n_items < 1 || !items)
    return px_error(PX_ERR_INVALID, "checkpoint: %d items given; a checkpoint holds at least one file", n_items);
  for (int i = 0; i < n_items; i++) {
    const char *why;
    if (!px_ckpt_name_ok(items[i].name, &why))
      return px_error(PX_ERR_INVALID, "checkpoint: item %d's name \"%s\" %s", i, items[i].name ? items[i].name : "",
                      why);
    if (!items[i].tensors && items[i].n_bytes > 0 && !items[i].bytes)
      return px_error(PX_ERR_INVALID, "checkpoint: item \"%s\" has %zu bytes but no data", items[i].name,
                      items[i].n_bytes);
    for (int k = 0; k < i; k++)
      if (strcmp(items[k].name, items[i].name) == 0)
        return px_error(PX_ERR_INVALID, "checkpoint: two items are named \"%s\" (items %d and %d)", items[i].name, k,
                        i);
  }
  return PX_OK;
}

// dir without trailing slashes ("/" stays "/"), malloc'ed.
char *px_ckpt_clean_dir(const char *dir) {
  size_t n = strlen(dir);
  while (n > 1 && dir[n - 1] == '/') n--;
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, dir, n);
    d[n] = '\0';
  }
  return d;
}

// "<dir>/step_<step>" into out; false when it does not fit.
bool px_ckpt_step_path(const char *dir, int64_t step, char *out, size_t cap) {
  char name[32];
  px_ckpt_step_name(step, name);
  int k = snprintf(out, cap, "%s%s%s", dir, strcmp(dir, "/") == 0 ? "" : "/", name);
  return k >= 0 && (size_t)k < cap;
}

/* ---- install: the rename that makes a checkpoint exist ------------------------------ */

px_status px_ckpt_install(const char *dir, const char *tmp, const char *final, int64_t step, bool swap, char *old_left,
                          size_t cap) {
  char why[128];
  old_left[0] = '\0';
  if (rename(tmp, final) == 0) return PX_OK;
  int err = errno;
  if (err != EEXIST && err != ENOTEMPTY)
    return px_error(PX_ERR_IO, "checkpoint %s: renaming %s to it failed: %s", final, tmp,
                    px_io_strerror(err, why, sizeof why));
  struct stat sb;
  if (lstat(final, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return px_error(PX_ERR_IO,
                    "checkpoint %s: the name is taken by something that is not a checkpoint directory; "
                    "left alone",
                    final);
#ifdef RENAME_EXCHANGE
  // One atomic swap: step_<step> is the old checkpoint, then the new one.
  if (swap && renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
    snprintf(old_left, cap, "%s", tmp);
    return PX_OK;
  }
  err = errno;
  if (swap && err != EINVAL && err != ENOSYS && err != ENOTSUP)
    return px_error(PX_ERR_IO, "checkpoint %s: swapping in the new checkpoint %s failed: %s", final, tmp,
                    px_io_strerror(err, why, sizeof why));
#endif
  // No swap on this file system: the old one aside, the new one in.
  char host[PX_CKPT_HOST_MAX + 1], name[384];
  px_ckpt_host(host);
  px_ckpt_temp_name(step, PX_CKPT_OLD, host, (long)getpid(), name, sizeof name);
  snprintf(old_left, cap, "%s/%s", dir, name);
  px_status st = px_ckpt_remove_tree(old_left);  // our own leftover, if any
  if (st != PX_OK) {
    old_left[0] = '\0';
    return st;
  }
  if (rename(final, old_left) != 0) {
    err = errno;
    old_left[0] = '\0';
    return px_error(PX_ERR_IO, "checkpoint %s: moving the old checkpoint aside failed: %s", final,
                    px_io_strerror(err, why, sizeof why));
  }
  if (rename(tmp, final) != 0) {
    err = errno;
    rename(old_left, final);  // put the old one back; best effort
    old_left[0] = '\0';
    return px_error(PX_ERR_IO, "checkpoint %s: renaming %s to it failed: %s", final, tmp,
                    px_io_strerror(err, why, sizeof why));
  }
  return PX_OK;
}

/* ---- write ------------------------------------------------------------------------ */

// px_checkpoint_write; *complete tells whether step_<step> is in place
// (the status may still be an error from removing old checkpoints).
static px_status write_checkpoint(const char *dir_in, int64_t step, const px_ckpt_item *items, int n_items,
                                  int keep_last, char *path_out, size_t cap, bool *complete) {
  *complete = false;
  if (path_out && cap) path_out[0] = '\0';
  if (!dir_in || !*dir_in) return px_error(PX_ERR_INVALID, "checkpoint: empty directory name");
  if (step < 0 || step > PX_CKPT_STEP_MAX)
    return px_error(PX_ERR_INVALID, "checkpoint: step %" PRId64 " is out of range (0 to 10^18 - 1)", step);
  if (keep_last < 0)
    return px_error(PX_ERR_INVALID, "checkpoint: keep_last is %d; expected 0 (keep all) or more", keep_last);
  px_status st = px_ckpt_check_items(items, n_items);
  if (st != PX_OK) return st;

  char *dir = px_ckpt_clean_dir(dir_in);
  size_t plen = strlen(dir_in) + 2 * PX_CKPT_NAME_MAX + 8;
  char *final = malloc(plen), *tmp = malloc(plen), *file = malloc(plen), *old = malloc(plen);
  char *sums = malloc((size_t)n_items * (PX_SHA256_HEX + 2 + PX_CKPT_NAME_MAX + 1) + 1);
  bool made_tmp = false;
  if (!dir || !final || !tmp || !file || !old || !sums) {
    st = px_error(PX_ERR_NOMEM, "checkpoint: out of memory writing step %" PRId64 " in %s", step, dir_in);
    goto done;
  }
  px_ckpt_step_path(dir, step, final, plen);
  if (path_out && strlen(final) >= cap) {
    st = px_error(PX_ERR_INVALID, "checkpoint %s: path_out holds %zu bytes, the path needs %zu", final, cap,
                  strlen(final) + 1);
    goto done;
  }
  if ((st = px_ckpt_make_dirs(dir, final)) != PX_OK) goto done;

  char host[PX_CKPT_HOST_MAX + 1], name[384], why[128];
  px_ckpt_host(host);
  px_ckpt_temp_name(step, PX_CKPT_PARTIAL, host, (long)getpid(), name, sizeof name);
  snprintf(tmp, plen, "%s/%s", dir, name);
  if ((st = px_ckpt_remove_tree(tmp)) != PX_OK) goto done;  // this process's own earlier attempt
  if (mkdir(tmp, 0755) != 0) {
    int err = errno;
    st = px_error(PX_ERR_IO, "checkpoint %s: cannot create the temporary directory %s: %s", final, tmp,
                  px_io_strerror(err, why, sizeof why));
    goto done;
  }
  made_tmp = true;

  size_t sums_len = 0;
  {
    char(*hex)[PX_SHA256_HEX] = malloc((size_t)n_items * sizeof *hex);
    if (!hex) st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", final);
    else st = px_ckpt_write_items(tmp, final, items, n_items, hex, NULL, NULL);
    for (int i = 0; i < n_items && st == PX_OK; i++)
      sums_len += (size_t)sprintf(sums + sums_len, "%s  %s\n", hex[i], items[i].name);
    free(hex);
    if (st != PX_OK) goto done;
  }
  // SHA256SUMS last: a directory that has it had all its files written.
  unsigned char ignored[PX_SHA256_BYTES];
  snprintf(file, plen, "%s/%s", tmp, PX_CKPT_SUMS);
  px_io_chunk c = {sums, sums_len};
  if ((st = px_ckpt_write_file(file, final, PX_CKPT_SUMS, &c, 1, ignored)) != PX_OK) goto done;
  if ((st = px_ckpt_fsync_dir(tmp, final)) != PX_OK) goto done;

  if ((st = px_ckpt_install(dir, tmp, final, step, true, old, plen)) != PX_OK) goto done;
  made_tmp = false;
  if ((st = px_ckpt_fsync_dir(dir, final)) != PX_OK) goto done;
  *complete = true;
  if (path_out) memcpy(path_out, final, strlen(final) + 1);
  if (old[0] && (st = px_ckpt_remove_tree(old)) != PX_OK) {
    st = px_error_wrap(st, "checkpoint %s is complete, but removing the checkpoint it replaced failed", final);
    goto done;
  }
  st = px_ckpt_rotate(dir, step, keep_last);
  if (st != PX_OK) st = px_error_wrap(st, "checkpoint %s is complete, but rotation in %s failed", final, dir);

done:
  if (made_tmp) {
    // Keep the first error's message: the cleanup's own failure matters less.
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", px_last_error());
    px_ckpt_remove_tree(tmp);
    px_error(st, "%s", msg);
  }
  free(sums);
  free(old);
  free(file);
  free(tmp);
  free(final);
  free(dir);
  return st;
}

px_status px_checkpoint_write(const char *dir, int64_t step, const px_ckpt_item *items, int n_items, int keep_last,
                              char *path_out, size_t cap) {
  bool complete;
  return write_checkpoint(dir, step, items, n_items, keep_last, path_out, cap, &complete);
}

/* ---- write0: rank 0 writes, everyone learns how it went ------------------------------ */

px_status px_checkpoint_write0(px_comm *comm, const char *dir, int64_t step, const px_ckpt_item *items, int n_items,
                               int keep_last, char *path_out, size_t cap) {
  // Rank 0's outcome as bytes: status, whether step_<step> exists, message.
  struct {
    int32_t status;
    int32_t complete;
    char message[1024];
  } r;
  memset(&r, 0, sizeof r);
  if (!comm) return px_checkpoint_write(dir, step, items, n_items, keep_last, path_out, cap);  // a world of one
  if (px_comm_rank(comm) == 0) {
    bool complete = false;
    r.status = (int32_t)write_checkpoint(dir, step, items, n_items, keep_last, path_out, cap, &complete);
    r.complete = complete;
    if (r.status != PX_OK) snprintf(r.message, sizeof r.message, "%s", px_last_error());
  }
  // Every rank learns rank 0's status, so none trains on believing in a
  // checkpoint that does not exist, and none hangs when rank 0 failed.
  px_status cst = px_comm_broadcast(comm, &r, sizeof r, PX_U8, 0);
  if (cst != PX_OK) return cst;
  if (px_comm_rank(comm) == 0) return (px_status)r.status;
  bool fits = true;
  if (path_out && cap) {
    path_out[0] = '\0';
    char *d = r.complete ? px_ckpt_clean_dir(dir) : NULL;
    if (d && !(fits = px_ckpt_step_path(d, step, path_out, cap))) path_out[0] = '\0';
    free(d);
  }
  if (r.status != PX_OK) return px_error((px_status)r.status, "%s", r.message);
  if (!fits)
    return px_error(PX_ERR_INVALID,
                    "checkpoint: rank %d's path_out (%zu bytes) cannot hold the path of step %" PRId64 " in %s",
                    px_comm_rank(comm), cap, step, dir);
  return PX_OK;
}
