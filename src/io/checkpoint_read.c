// Reading checkpoints: verification, the newest good checkpoint of a run
// directory, and reads of single files checked against their SHA-256
// (SHA256SUMS itself: checkpoint_sums.c, which the directory code's
// rotation uses too).
#define _POSIX_C_SOURCE 200809L
#include "io/checkpoint.h"
#include "io/internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static px_status check_is_dir(const char *ckpt) {
  if (!ckpt || !*ckpt) return px_error(PX_ERR_INVALID, "checkpoint: empty path");
  struct stat sb;
  char why[128];
  if (stat(ckpt, &sb) != 0) {
    int err = errno;
    return px_error(err == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "checkpoint %s: %s", ckpt,
                    px_io_strerror(err, why, sizeof why));
  }
  if (!S_ISDIR(sb.st_mode)) return px_error(PX_ERR_FORMAT, "checkpoint %s is not a directory", ckpt);
  return PX_OK;
}

static px_status mismatch(const char *ckpt, const px_ckpt_sum *want, const unsigned char *got, uint64_t size) {
  char want_hex[PX_SHA256_HEX], got_hex[PX_SHA256_HEX];
  px_sha256_hex(want->digest, want_hex);
  px_sha256_hex(got, got_hex);
  return px_error(PX_ERR_FORMAT,
                  "checkpoint %s: file \"%s\" has SHA-256 %s but SHA256SUMS expects %s (%" PRIu64
                  " bytes read); the file is corrupted or truncated",
                  ckpt, want->name, got_hex, want_hex, size);
}

px_status px_checkpoint_verify(const char *ckpt_path) {
  px_status st = check_is_dir(ckpt_path);
  if (st != PX_OK) return st;
  px_ckpt_sums sums;
  if ((st = px_ckpt_sums_read(ckpt_path, &sums)) != PX_OK) return st;
  // Cheap checks first: a missing file fails before hashing gigabytes.
  st = px_ckpt_check_files(ckpt_path, &sums);
  size_t plen = strlen(ckpt_path) + PX_CKPT_NAME_MAX + 2;
  char *path = st == PX_OK ? malloc(plen) : NULL;
  if (st == PX_OK && !path) st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", ckpt_path);
  for (int i = 0; i < sums.n && st == PX_OK; i++) {
    unsigned char got[PX_SHA256_BYTES];
    uint64_t size = 0;
    snprintf(path, plen, "%s/%s", ckpt_path, sums.items[i].name);
    st = px_sha256_file(path, got, &size);
    if (st != PX_OK)
      st = px_error_wrap(st == PX_ERR_NOMEM ? st : PX_ERR_FORMAT, "checkpoint %s: file \"%s\"", ckpt_path,
                         sums.items[i].name);
    else if (memcmp(got, sums.items[i].digest, PX_SHA256_BYTES) != 0)
      st = mismatch(ckpt_path, &sums.items[i], got, size);
  }
  free(path);
  px_ckpt_sums_free(&sums);
  return st;
}

/* ---- reading one file ------------------------------------------------------ */

px_status px_checkpoint_read_file(const char *ckpt_path, const char *name, void **bytes, size_t *n) {
  if (!bytes || !n) return px_error(PX_ERR_INVALID, "checkpoint: read_file: bytes and n must not be NULL");
  *bytes = NULL;
  *n = 0;
  px_status st = check_is_dir(ckpt_path);
  if (st != PX_OK) return st;
  const char *why;
  if (!px_ckpt_name_ok(name, &why))
    return px_error(PX_ERR_INVALID, "checkpoint %s: cannot read file \"%s\": the name %s", ckpt_path, name ? name : "",
                    why);
  px_ckpt_sums sums;
  if ((st = px_ckpt_sums_read(ckpt_path, &sums)) != PX_OK) return st;
  const px_ckpt_sum *want = px_ckpt_sum_find(&sums, name);
  if (!want) {
    // "a, b, c", cut short where the buffer ends.
    char listed[256];
    size_t k = 0;
    for (int i = 0; i < sums.n; i++) {
      const char *parts[2] = {i ? ", " : "", sums.items[i].name};
      for (int j = 0; j < 2; j++)
        for (const char *c = parts[j]; *c && k + 1 < sizeof listed; c++) listed[k++] = *c;
    }
    listed[k] = '\0';

    px_ckpt_sums_free(&sums);
    return px_error(PX_ERR_NOT_FOUND, "checkpoint %s has no file \"%s\" (SHA256SUMS lists: %s)", ckpt_path, name,
                    listed);
  }

  char why_io[128];
  size_t plen = strlen(ckpt_path) + strlen(name) + 2;
  char *path = malloc(plen);
  unsigned char *buf = NULL;
  int fd = -1;
  if (!path) {
    st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", ckpt_path);
    goto done;
  }
  snprintf(path, plen, "%s/%s", ckpt_path, name);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (fd < 0 || fstat(fd, &sb) != 0) {
    int err = errno;
    st = px_error(err == ENOENT ? PX_ERR_FORMAT : PX_ERR_IO, "checkpoint %s: cannot read file \"%s\": %s", ckpt_path,
                  name, px_io_strerror(err, why_io, sizeof why_io));
    goto done;
  }
  if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size >= SIZE_MAX) {
    st = px_error(PX_ERR_FORMAT, "checkpoint %s: \"%s\" is not a regular file of a size this machine can hold",
                  ckpt_path, name);
    goto done;
  }
  size_t size = (size_t)sb.st_size, got = 0;
  // One byte more than the size: a file that grew since fstat is noticed.
  if (!(buf = malloc(size + 1))) {
    st = px_error(PX_ERR_NOMEM, "checkpoint %s: cannot allocate %zu bytes to read \"%s\"", ckpt_path, size, name);
    goto done;
  }
  for (;;) {
    ssize_t r = read(fd, buf + got, size + 1 - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      int err = errno;
      st = px_error(PX_ERR_IO, "checkpoint %s: reading file \"%s\" failed: %s", ckpt_path, name,
                    px_io_strerror(err, why_io, sizeof why_io));
      goto done;
    }
    if (r == 0 || (got += (size_t)r) == size + 1) break;
  }
  unsigned char digest[PX_SHA256_BYTES];
  px_sha256_bytes(buf, got, digest);
  if (memcmp(digest, want->digest, PX_SHA256_BYTES) != 0) {
    st = mismatch(ckpt_path, want, digest, got);
    goto done;
  }
  *bytes = buf;
  *n = got;
  buf = NULL;

done:
  if (fd >= 0) close(fd);
  free(buf);
  free(path);
  px_ckpt_sums_free(&sums);
  return st;
}

px_status px_checkpoint_load_tensors(const char *ckpt_path, const char *name, const px_state_dict *sd, bool strict) {
  if (!sd)
    return px_error(PX_ERR_INVALID, "checkpoint %s: load_tensors: no state dict given", ckpt_path ? ckpt_path : "");
  void *bytes;
  size_t n;
  px_status st = px_checkpoint_read_file(ckpt_path, name, &bytes, &n);
  if (st != PX_OK) return st;
  size_t plen = strlen(ckpt_path) + strlen(name) + 2;
  char *path = malloc(plen);
  if (!path) {
    free(bytes);
    return px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", ckpt_path);
  }
  snprintf(path, plen, "%s/%s", ckpt_path, name);
  px_safetensors *f;
  st = px_st_open_buffer(path, bytes, n, &f);  // owns bytes from here on
  if (st == PX_OK) {
    st = px_st_load_open(f, sd, strict);
    px_safetensors_close(f);
  }
  free(path);
  return st;
}

/* ---- the newest good checkpoint --------------------------------------------- */

static void note_add(char *note, size_t cap, const char *fmt, ...)
#if defined(__GNUC__)
  __attribute__((format(printf, 3, 4)))
#endif
  ;

static void note_add(char *note, size_t cap, const char *fmt, ...) {
  if (!note || cap == 0) return;
  size_t k = strnlen(note, cap - 1);
  if (k + 1 >= cap) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(note + k, cap - k, fmt, ap);
  va_end(ap);
  k = strnlen(note, cap - 1);
  if (k + 1 < cap) {
    note[k] = '\n';
    note[k + 1] = '\0';
  }
}

px_status px_checkpoint_latest(const char *dir, char *path_out, size_t cap, char *note, size_t note_cap) {
  if (note && note_cap) note[0] = '\0';
  if (!dir || !*dir) return px_error(PX_ERR_INVALID, "checkpoint: latest: empty directory name");
  if (!path_out || cap == 0) return px_error(PX_ERR_INVALID, "checkpoint: latest %s: no buffer for the path", dir);
  path_out[0] = '\0';
  px_ckpt_listing l;
  px_status st = px_ckpt_list(dir, &l);
  if (st == PX_ERR_NOT_FOUND)
    return px_error(PX_ERR_NOT_FOUND,
                    "checkpoint: no checkpoint in %s: the directory does "
                    "not exist",
                    dir);
  if (st != PX_OK) return st;
  char host[PX_CKPT_HOST_MAX + 1];
  px_ckpt_host(host);
  size_t plen = strlen(dir) + PX_CKPT_NAME_MAX + 2;
  char *path = malloc(plen);
  if (!path) {
    px_ckpt_listing_free(&l);
    return px_error(PX_ERR_NOMEM, "checkpoint: out of memory in %s", dir);
  }

  for (int i = l.n_steps; i < l.n_steps + l.n_temps; i++) {
    const px_ckpt_temp *t = &l.entries[i].temp;
    const char *what = t->kind == PX_CKPT_PARTIAL ? "incomplete" : "a checkpoint set aside while being replaced";
    if (strcmp(t->host, host) != 0)
      note_add(note, note_cap, "skipped %s/%s: %s: a writer on host %s was interrupted or is still writing", dir,
               l.entries[i].name, what, t->host);
    else if (px_ckpt_pid_alive(t->pid))
      note_add(note, note_cap, "skipped %s/%s: %s: process %ld is still writing it", dir, l.entries[i].name, what,
               t->pid);
    else
      note_add(note, note_cap, "skipped %s/%s: %s: a writer was interrupted (the next checkpoint write removes it)",
               dir, l.entries[i].name, what);
  }
  int skipped = 0;
  st = PX_ERR_NOT_FOUND;
  for (int i = 0; i < l.n_steps; i++) {
    snprintf(path, plen, "%s/%s", dir, l.entries[i].name);
    px_status v = px_checkpoint_verify(path);
    if (v == PX_OK) {
      if (strlen(path) >= cap) {
        st = px_error(PX_ERR_INVALID, "checkpoint: latest: the path %s needs %zu bytes, the buffer holds %zu", path,
                      strlen(path) + 1, cap);
      } else {
        memcpy(path_out, path, strlen(path) + 1);
        st = PX_OK;
      }
      break;
    }
    // A checkpoint that does not verify (or cannot be read) is skipped; only
    // running out of memory is an error of this call.
    if (v == PX_ERR_NOMEM) {
      st = v;
      break;
    }
    note_add(note, note_cap, "skipped %s", px_last_error());
    skipped++;
  }
  if (st == PX_ERR_NOT_FOUND) {
    if (skipped) st = px_error(PX_ERR_NOT_FOUND, "checkpoint: none of the %d checkpoints in %s verifies", skipped, dir);
    else st = px_error(PX_ERR_NOT_FOUND, "checkpoint: no checkpoint in %s", dir);
  }
  free(path);
  px_ckpt_listing_free(&l);
  return st;
}
