// Reading checkpoints: SHA256SUMS, verification, the newest good checkpoint
// of a run directory, and reads of single files checked against their
// SHA-256.
//
// SHA256SUMS is what `sha256sum` prints: per file one line
//   <64 hex digits><space><space or '*'><file name>\n
// ('*' marks binary mode, which changes nothing on POSIX).  plexus writes
// lowercase and two spaces, and reads what sha256sum -c accepts, except the
// backslash-escaped names sha256sum uses for names with '\\' or newlines,
// which plexus never writes.
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

/* ---- SHA256SUMS ------------------------------------------------------------ */

static int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Up to 60 bytes of a line for a message, non-printable bytes as \xNN.
static void show_line(const char *s, size_t n, char *out, size_t cap) {
  size_t k = 0;
  for (size_t i = 0; i < n && i < 60 && k + 5 < cap; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 0x20 && c < 0x7f && c != '"') out[k++] = (char)c;
    else k += (size_t)snprintf(out + k, cap - k, "\\x%02x", c);
  }
  if (n > 60 && k + 4 < cap) { memcpy(out + k, "...", 3); k += 3; }
  out[k] = '\0';
}

static px_status read_small_file(const char *path, char **text, size_t *len) {
  char why[128];
  *text = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    return px_error(err == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "%s", px_io_strerror(err, why, sizeof why));
  }
  struct stat sb;
  px_status st = PX_OK;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) st = px_error(PX_ERR_FORMAT, "it is not a regular file");
  else if ((uint64_t)sb.st_size > PX_CKPT_SUMS_MAX)
    st = px_error(PX_ERR_FORMAT, "it is %" PRIu64 " bytes, more than the %u a checksum list of a checkpoint needs",
                  (uint64_t)sb.st_size, PX_CKPT_SUMS_MAX);
  else if (!(*text = malloc((size_t)sb.st_size + 1))) st = px_error(PX_ERR_NOMEM, "out of memory");
  else {
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
      ssize_t r = read(fd, *text + got, (size_t)sb.st_size - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += (size_t)r;
    }
    if (got != (size_t)sb.st_size) {
      int err = errno;
      st = px_error(PX_ERR_IO, "reading it failed: %s", px_io_strerror(err, why, sizeof why));
    }
    (*text)[got] = '\0';
    *len = got;
  }
  close(fd);
  if (st != PX_OK) { free(*text); *text = NULL; }
  return st;
}

void px_ckpt_sums_free(px_ckpt_sums *s) {
  free(s->items);
  s->items = NULL;
  s->n = 0;
}

px_status px_ckpt_sums_read(const char *ckpt, px_ckpt_sums *out) {
  memset(out, 0, sizeof *out);
  size_t plen = strlen(ckpt) + sizeof "/" PX_CKPT_SUMS;
  char *path = malloc(plen);
  if (!path) return px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", ckpt);
  snprintf(path, plen, "%s/%s", ckpt, PX_CKPT_SUMS);
  char *text;
  size_t len = 0;
  px_status st = read_small_file(path, &text, &len);
  free(path);
  if (st == PX_ERR_NOT_FOUND)
    return px_error(PX_ERR_FORMAT, "checkpoint %s: SHA256SUMS is missing, so this is not a complete checkpoint", ckpt);
  if (st != PX_OK) return px_error_wrap(st == PX_ERR_NOMEM ? st : PX_ERR_FORMAT, "checkpoint %s: cannot read SHA256SUMS", ckpt);

  px_status bad = PX_OK;
  if (len == 0) bad = px_error(PX_ERR_FORMAT, "checkpoint %s: SHA256SUMS is empty; expected one line per file", ckpt);
  else if (text[len - 1] != '\n')
    bad = px_error(PX_ERR_FORMAT, "checkpoint %s: SHA256SUMS does not end with a newline; was it truncated?", ckpt);
  else if (strlen(text) != len)
    bad = px_error(PX_ERR_FORMAT, "checkpoint %s: SHA256SUMS holds a NUL byte; is it a checksum list?", ckpt);
  int lines = 0;
  for (size_t i = 0; bad == PX_OK && i < len; i++) lines += text[i] == '\n';
  if (bad == PX_OK && !(out->items = calloc((size_t)lines, sizeof *out->items)))
    bad = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory reading SHA256SUMS", ckpt);

  char shown[300];
  const char *line = text;
  for (int ln = 1; bad == PX_OK && ln <= lines; ln++) {
    const char *nl = strchr(line, '\n');
    size_t n = (size_t)(nl - line);
    px_ckpt_sum *item = &out->items[out->n];
    bool ok = n > 66 && line[64] == ' ' && (line[65] == ' ' || line[65] == '*');
    for (int i = 0; ok && i < 32; i++) {
      int hi = hex_value(line[2 * i]), lo = hex_value(line[2 * i + 1]);
      ok = hi >= 0 && lo >= 0;
      item->digest[i] = (unsigned char)(hi << 4 | lo);
    }
    const char *why = NULL;
    if (!ok) {
      show_line(line, n, shown, sizeof shown);
      bad = px_error(PX_ERR_FORMAT, "checkpoint %s: SHA256SUMS line %d is malformed: expected \"<64 hex digits>  "
                     "<file name>\", found \"%s\"", ckpt, ln, shown);
      break;
    }
    size_t name_len = n - 66;
    if (name_len > PX_CKPT_NAME_MAX) {
      bad = px_error(PX_ERR_FORMAT, "checkpoint %s: SHA256SUMS line %d names a file of %zu bytes, longer than a file "
                     "name can be", ckpt, ln, name_len);
      break;
    }
    memcpy(item->name, line + 66, name_len);
    item->name[name_len] = '\0';
    if (!px_ckpt_name_ok(item->name, &why)) {
      show_line(item->name, name_len, shown, sizeof shown);
      bad = px_error(PX_ERR_FORMAT, "checkpoint %s: SHA256SUMS line %d lists \"%s\", which %s; a checkpoint lists only "
                     "plain file names beside SHA256SUMS", ckpt, ln, shown, why);
      break;
    }
    for (int k = 0; k < out->n; k++)
      if (strcmp(out->items[k].name, item->name) == 0) {
        bad = px_error(PX_ERR_FORMAT, "checkpoint %s: SHA256SUMS lists \"%s\" twice (lines %d and %d)", ckpt, item->name,
                       k + 1, ln);
        break;
      }
    out->n++;
    line = nl + 1;
  }
  free(text);
  if (bad != PX_OK) px_ckpt_sums_free(out);
  return bad;
}

static const px_ckpt_sum *find_sum(const px_ckpt_sums *s, const char *name) {
  for (int i = 0; i < s->n; i++)
    if (strcmp(s->items[i].name, name) == 0) return &s->items[i];
  return NULL;
}

px_status px_ckpt_check_files(const char *ckpt, const px_ckpt_sums *sums) {
  char why[128], hex[PX_SHA256_HEX];
  DIR *dp = opendir(ckpt);
  if (!dp) {
    int err = errno;
    return px_error(err == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "checkpoint %s: cannot list it: %s", ckpt,
                    px_io_strerror(err, why, sizeof why));
  }
  px_status st = PX_OK;
  for (int i = 0; i < sums->n && st == PX_OK; i++) {
    struct stat sb;
    px_sha256_hex(sums->items[i].digest, hex);
    if (fstatat(dirfd(dp), sums->items[i].name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
      int err = errno;
      st = err == ENOENT ? px_error(PX_ERR_FORMAT, "checkpoint %s: file \"%s\" is listed in SHA256SUMS (SHA-256 %s) but "
                                    "missing", ckpt, sums->items[i].name, hex)
                         : px_error(PX_ERR_IO, "checkpoint %s: cannot stat file \"%s\": %s", ckpt, sums->items[i].name,
                                    px_io_strerror(err, why, sizeof why));
    } else if (!S_ISREG(sb.st_mode)) {
      st = px_error(PX_ERR_FORMAT, "checkpoint %s: \"%s\" (listed in SHA256SUMS) is not a regular file", ckpt,
                    sums->items[i].name);
    }
  }
  // A file SHA256SUMS does not list: SHA256SUMS lost lines, or the file came
  // later; either way the checkpoint is not the one that was written.
  struct dirent *de;
  while (st == PX_OK && (de = readdir(dp))) {
    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strcmp(de->d_name, PX_CKPT_SUMS)) continue;
    if (!find_sum(sums, de->d_name))
      st = px_error(PX_ERR_FORMAT, "checkpoint %s: it holds \"%s\", which SHA256SUMS does not list (was SHA256SUMS "
                    "truncated, or the file added after the checkpoint was written?)", ckpt, de->d_name);
  }
  closedir(dp);
  return st;
}

/* ---- verify -------------------------------------------------------------- */

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
  return px_error(PX_ERR_FORMAT, "checkpoint %s: file \"%s\" has SHA-256 %s but SHA256SUMS expects %s (%" PRIu64
                  " bytes read); the file is corrupted or truncated", ckpt, want->name, got_hex, want_hex, size);
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
    if (st != PX_OK) st = px_error_wrap(st == PX_ERR_NOMEM ? st : PX_ERR_FORMAT, "checkpoint %s: file \"%s\"", ckpt_path,
                                        sums.items[i].name);
    else if (memcmp(got, sums.items[i].digest, PX_SHA256_BYTES) != 0) st = mismatch(ckpt_path, &sums.items[i], got, size);
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
  const px_ckpt_sum *want = find_sum(&sums, name);
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
    return px_error(PX_ERR_NOT_FOUND, "checkpoint %s has no file \"%s\" (SHA256SUMS lists: %s)", ckpt_path, name, listed);
  }

  char why_io[128];
  size_t plen = strlen(ckpt_path) + strlen(name) + 2;
  char *path = malloc(plen);
  unsigned char *buf = NULL;
  int fd = -1;
  if (!path) { st = px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", ckpt_path); goto done; }
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
    st = px_error(PX_ERR_FORMAT, "checkpoint %s: \"%s\" is not a regular file of a size this machine can hold", ckpt_path,
                  name);
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
  if (memcmp(digest, want->digest, PX_SHA256_BYTES) != 0) { st = mismatch(ckpt_path, want, digest, got); goto done; }
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
  if (!sd) return px_error(PX_ERR_INVALID, "checkpoint %s: load_tensors: no state dict given", ckpt_path ? ckpt_path : "");
  void *bytes;
  size_t n;
  px_status st = px_checkpoint_read_file(ckpt_path, name, &bytes, &n);
  if (st != PX_OK) return st;
  size_t plen = strlen(ckpt_path) + strlen(name) + 2;
  char *path = malloc(plen);
  if (!path) { free(bytes); return px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", ckpt_path); }
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
  if (k + 1 < cap) { note[k] = '\n'; note[k + 1] = '\0'; }
}

px_status px_checkpoint_latest(const char *dir, char *path_out, size_t cap, char *note, size_t note_cap) {
  if (note && note_cap) note[0] = '\0';
  if (!dir || !*dir) return px_error(PX_ERR_INVALID, "checkpoint: latest: empty directory name");
  if (!path_out || cap == 0) return px_error(PX_ERR_INVALID, "checkpoint: latest %s: no buffer for the path", dir);
  path_out[0] = '\0';
  px_ckpt_listing l;
  px_status st = px_ckpt_list(dir, &l);
  if (st == PX_ERR_NOT_FOUND) return px_error(PX_ERR_NOT_FOUND, "checkpoint: no checkpoint in %s: the directory does "
                                              "not exist", dir);
  if (st != PX_OK) return st;
  char host[PX_CKPT_HOST_MAX + 1];
  px_ckpt_host(host);
  size_t plen = strlen(dir) + PX_CKPT_NAME_MAX + 2;
  char *path = malloc(plen);
  if (!path) { px_ckpt_listing_free(&l); return px_error(PX_ERR_NOMEM, "checkpoint: out of memory in %s", dir); }

  for (int i = l.n_steps; i < l.n_steps + l.n_temps; i++) {
    const px_ckpt_temp *t = &l.entries[i].temp;
    const char *what = t->kind == PX_CKPT_PARTIAL ? "incomplete" : "a checkpoint set aside while being replaced";
    if (strcmp(t->host, host) != 0)
      note_add(note, note_cap, "skipped %s/%s: %s: a writer on host %s was interrupted or is still writing", dir,
               l.entries[i].name, what, t->host);
    else if (px_ckpt_pid_alive(t->pid))
      note_add(note, note_cap, "skipped %s/%s: %s: process %ld is still writing it", dir, l.entries[i].name, what, t->pid);
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
    if (v == PX_ERR_NOMEM) { st = v; break; }
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
