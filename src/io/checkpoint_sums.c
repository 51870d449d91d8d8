// SHA256SUMS of a checkpoint: reading and parsing it, and checking without
// hashing that the directory holds exactly the files it lists.  Used by the
// reader (checkpoint_read.c: verify, latest, reads) and by rotation
// (checkpoint_dir.c), so neither of those two calls into the other for it.
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
  if (n > 60 && k + 4 < cap) {
    memcpy(out + k, "...", 3);
    k += 3;
  }
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
  if (st != PX_OK) {
    free(*text);
    *text = NULL;
  }
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
  if (st != PX_OK)
    return px_error_wrap(st == PX_ERR_NOMEM ? st : PX_ERR_FORMAT, "checkpoint %s: cannot read SHA256SUMS", ckpt);

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
      bad = px_error(PX_ERR_FORMAT,
                     "checkpoint %s: SHA256SUMS line %d is malformed: expected \"<64 hex digits>  "
                     "<file name>\", found \"%s\"",
                     ckpt, ln, shown);
      break;
    }
    size_t name_len = n - 66;
    if (name_len > PX_CKPT_NAME_MAX) {
      bad = px_error(PX_ERR_FORMAT,
                     "checkpoint %s: SHA256SUMS line %d names a file of %zu bytes, longer than a file "
                     "name can be",
                     ckpt, ln, name_len);
      break;
    }
    memcpy(item->name, line + 66, name_len);
    item->name[name_len] = '\0';
    if (!px_ckpt_name_ok(item->name, &why)) {
      show_line(item->name, name_len, shown, sizeof shown);
      bad = px_error(PX_ERR_FORMAT,
                     "checkpoint %s: SHA256SUMS line %d lists \"%s\", which %s; a checkpoint lists only "
                     "plain file names beside SHA256SUMS",
                     ckpt, ln, shown, why);
      break;
    }
    for (int k = 0; k < out->n; k++)
      if (strcmp(out->items[k].name, item->name) == 0) {
        bad = px_error(PX_ERR_FORMAT, "checkpoint %s: SHA256SUMS lists \"%s\" twice (lines %d and %d)", ckpt,
                       item->name, k + 1, ln);
        break;
      }
    out->n++;
    line = nl + 1;
  }
  free(text);
  if (bad != PX_OK) px_ckpt_sums_free(out);
  return bad;
}

const px_ckpt_sum *px_ckpt_sum_find(const px_ckpt_sums *s, const char *name) {
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
      st = err == ENOENT ? px_error(PX_ERR_FORMAT,
                                    "checkpoint %s: file \"%s\" is listed in SHA256SUMS (SHA-256 %s) but "
                                    "missing",
                                    ckpt, sums->items[i].name, hex)
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
    if (!px_ckpt_sum_find(sums, de->d_name))
      st = px_error(PX_ERR_FORMAT,
                    "checkpoint %s: it holds \"%s\", which SHA256SUMS does not list (was SHA256SUMS "
                    "truncated, or the file added after the checkpoint was written?)",
                    ckpt, de->d_name);
  }
  closedir(dp);
  return st;
}

/* ---- verify -------------------------------------------------------------- */
