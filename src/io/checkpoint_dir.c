// Checkpoint directories: their names, listing a run directory, removing a
// checkpoint, and rotation (which checkpoints to keep).
//
// Only names that are exactly ours are ever touched: a step directory is
// "step_" + the step as px_ckpt_step_name prints it, a temporary one
// ".step_<step>.partial|old.<host>.<pid>".  Anything else in the run
// directory (a "step_final" the user made, a log file, a symbolic link) is
// left alone.
#define _POSIX_C_SOURCE 200809L
#include "io/checkpoint.h"
#include "io/internal.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- names ---------------------------------------------------------------- */

void px_ckpt_step_name(int64_t step, char out[32]) { snprintf(out, 32, "step_%08" PRId64, step); }

// Digits at s (at least 8, at most 18: no overflow) as a step, if they are
// exactly what "%08" PRId64 prints; *end is the first byte after them.
static bool parse_step_digits(const char *s, int64_t *step, const char **end) {
  size_t n = 0;
  int64_t v = 0;
  while (isdigit((unsigned char)s[n])) {
    if (n == 18) return false;
    v = v * 10 + (s[n] - '0');
    n++;
  }
  if (n < 8 || (n > 8 && s[0] == '0')) return false;
  *step = v;
  *end = s + n;
  return true;
}

bool px_ckpt_parse_step_name(const char *name, int64_t *step) {
  const char *end;
  return strncmp(name, "step_", 5) == 0 && parse_step_digits(name + 5, step, &end) && *end == '\0';
}

static const char *kind_word(px_ckpt_temp_kind k) { return k == PX_CKPT_PARTIAL ? "partial" : "old"; }

void px_ckpt_temp_name(int64_t step, px_ckpt_temp_kind kind, const char *host, long pid, char *out, size_t cap) {
  snprintf(out, cap, ".step_%08" PRId64 ".%s.%s.%ld", step, kind_word(kind), host, pid);
}

bool px_ckpt_parse_temp_name(const char *name, px_ckpt_temp *out) {
  const char *p;
  if (strncmp(name, ".step_", 6) != 0 || !parse_step_digits(name + 6, &out->step, &p)) return false;
  if (strncmp(p, ".partial.", 9) == 0) {
    out->kind = PX_CKPT_PARTIAL;
    p += 9;
  } else if (strncmp(p, ".old.", 5) == 0) {
    out->kind = PX_CKPT_OLD;
    p += 5;
  } else return false;
  const char *dot = strrchr(p, '.');
  if (!dot || dot == p || (size_t)(dot - p) > PX_CKPT_HOST_MAX) return false;
  size_t nd = strlen(dot + 1);
  if (nd == 0 || nd > 10) return false;
  long pid = 0;
  for (const char *d = dot + 1; *d; d++) {
    if (!isdigit((unsigned char)*d)) return false;
    pid = pid * 10 + (*d - '0');
  }
  if (pid <= 0) return false;
  memcpy(out->host, p, (size_t)(dot - p));
  out->host[dot - p] = '\0';
  out->pid = pid;
  return true;
}

void px_ckpt_host(char out[PX_CKPT_HOST_MAX + 1]) {
  char buf[256] = "";
  if (gethostname(buf, sizeof buf - 1) != 0) buf[0] = '\0';
  buf[sizeof buf - 1] = '\0';
  size_t n = 0;
  for (; buf[n] && n < PX_CKPT_HOST_MAX; n++) {
    unsigned char c = (unsigned char)buf[n];
    out[n] = isalnum(c) || c == '.' || c == '_' || c == '-' ? (char)c : '_';
  }
  out[n] = '\0';
  if (n == 0) snprintf(out, PX_CKPT_HOST_MAX + 1, "localhost");
}

bool px_ckpt_pid_alive(long pid) {
  if (pid <= 0) return true;  // not a process we could judge: leave its files alone
  return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

bool px_ckpt_name_ok(const char *name, const char **why) {
  if (!name || !*name) {
    *why = "is empty";
    return false;
  }
  if (strlen(name) > PX_CKPT_NAME_MAX) {
    *why = "is longer than 255 bytes";
    return false;
  }
  if (strcmp(name, PX_CKPT_SUMS) == 0) {
    *why = "is the name of the checksum file itself";
    return false;
  }
  if (strstr(name, "..")) {
    *why = "contains \"..\"";
    return false;
  }
  if (strchr(name, '/')) {
    *why = "contains '/' (a checkpoint holds files, not folders)";
    return false;
  }
  if (name[0] == '.') {
    *why = "starts with '.' (hidden and temporary names are not checkpoint files)";
    return false;
  }
  for (const unsigned char *c = (const unsigned char *)name; *c; c++)
    if (*c < 0x20 || *c == 0x7f || *c == '\\') {
      *why = "contains a control character or '\\' (sha256sum would escape it)";
      return false;
    }
  return true;
}

/* ---- listing --------------------------------------------------------------- */

static int cmp_entry(const void *a, const void *b) {
  const px_ckpt_entry *x = a, *y = b;
  if (x->is_temp != y->is_temp) return x->is_temp ? 1 : -1;   // steps first
  if (x->step != y->step) return x->step > y->step ? -1 : 1;  // newest first
  return strcmp(x->name, y->name);
}

px_status px_ckpt_list(const char *dir, px_ckpt_listing *out) {
  memset(out, 0, sizeof *out);
  char why[128];
  DIR *dp = opendir(dir);
  if (!dp) {
    int err = errno;
    return px_error(err == ENOENT ? PX_ERR_NOT_FOUND : PX_ERR_IO, "checkpoint: cannot list %s: %s", dir,
                    px_io_strerror(err, why, sizeof why));
  }
  int n = 0, cap = 0;
  px_ckpt_entry *e = NULL;
  px_status st = PX_OK;
  struct dirent *de;
  while ((de = readdir(dp))) {
    px_ckpt_entry cand;
    memset(&cand, 0, sizeof cand);
    if (strlen(de->d_name) > PX_CKPT_NAME_MAX) continue;
    if (px_ckpt_parse_step_name(de->d_name, &cand.step)) cand.is_temp = false;
    else if (px_ckpt_parse_temp_name(de->d_name, &cand.temp)) {
      cand.is_temp = true;
      cand.step = cand.temp.step;
    } else continue;
    struct stat sb;
    // A directory, not a link to one: a link is somebody else's.
    if (fstatat(dirfd(dp), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode)) continue;
    snprintf(cand.name, sizeof cand.name, "%s", de->d_name);
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      px_ckpt_entry *grown = realloc(e, (size_t)cap * sizeof *e);
      if (!grown) {
        st = px_error(PX_ERR_NOMEM, "checkpoint: out of memory listing %s", dir);
        break;
      }
      e = grown;
    }
    e[n++] = cand;
  }
  closedir(dp);
  if (st != PX_OK) {
    free(e);
    return st;
  }
  if (n) qsort(e, (size_t)n, sizeof *e, cmp_entry);
  out->entries = e;
  for (int i = 0; i < n; i++) {
    if (e[i].is_temp) out->n_temps++;
    else out->n_steps++;
  }
  return PX_OK;
}

void px_ckpt_listing_free(px_ckpt_listing *l) {
  free(l->entries);
  memset(l, 0, sizeof *l);
}

/* ---- removal --------------------------------------------------------------- */

// Removes name (relative to parent_fd, or a path with AT_FDCWD); a directory
// with everything in it.  Symbolic links are removed, never followed.  A
// checkpoint is one level of files: depth stops a pathological tree.
static px_status remove_at(int parent_fd, const char *name, const char *shown, int depth) {
  char why[128];
  struct stat sb;
  if (fstatat(parent_fd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return PX_OK;
    int err = errno;
    return px_error(PX_ERR_IO, "cannot stat %s: %s", shown, px_io_strerror(err, why, sizeof why));
  }
  if (S_ISDIR(sb.st_mode)) {
    if (depth > 8) return px_error(PX_ERR_IO, "not removing %s: nested deeper than a checkpoint ever is", shown);
    int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *dp = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dp) {
      int err = errno;
      if (fd >= 0) close(fd);
      return px_error(PX_ERR_IO, "cannot open %s to remove it: %s", shown, px_io_strerror(err, why, sizeof why));
    }
    px_status st = PX_OK;
    struct dirent *de;
    while ((de = readdir(dp))) {
      if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
      char child[PX_CKPT_NAME_MAX * 2 + 8];
      snprintf(child, sizeof child, "%s/%s", shown, de->d_name);
      px_status s = remove_at(dirfd(dp), de->d_name, child, depth + 1);
      if (s != PX_OK && st == PX_OK) st = s;
    }
    closedir(dp);
    if (st != PX_OK) return st;
    if (unlinkat(parent_fd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) {
      int err = errno;
      return px_error(PX_ERR_IO, "cannot remove %s: %s", shown, px_io_strerror(err, why, sizeof why));
    }
    return PX_OK;
  }
  if (unlinkat(parent_fd, name, 0) != 0 && errno != ENOENT) {
    int err = errno;
    return px_error(PX_ERR_IO, "cannot remove %s: %s", shown, px_io_strerror(err, why, sizeof why));
  }
  return PX_OK;
}

px_status px_ckpt_remove_tree(const char *path) { return remove_at(AT_FDCWD, path, path, 0); }

/* ---- rotation -------------------------------------------------------------- */

// Complete without hashing: SHA256SUMS well formed, its files present,
// nothing else.  Rotation counts only these, so a checkpoint that lost a
// file never takes the place of a good one.
static bool looks_complete(const char *path) {
  px_ckpt_sums sums;
  if (px_ckpt_sums_read(path, &sums) != PX_OK) return false;
  bool ok = px_ckpt_check_files(path, &sums) == PX_OK;
  px_ckpt_sums_free(&sums);
  return ok;
}

// The first failure is the message; later ones are only counted.
typedef struct failures {
  px_status status;
  int count;
  char first[512];
} failures;

static void failed(failures *f, px_status st) {
  if (f->count++ == 0) {
    f->status = st;
    snprintf(f->first, sizeof f->first, "%s", px_last_error());
  }
}

px_status px_ckpt_rotate(const char *dir, int64_t written, int keep_last) {
  char host[PX_CKPT_HOST_MAX + 1];
  px_ckpt_host(host);
  long me = (long)getpid();
  size_t plen = strlen(dir) + PX_CKPT_NAME_MAX + 2;
  char *path = malloc(plen), *to = malloc(plen);
  failures fl = {PX_OK, 0, ""};
  px_ckpt_listing l = {0};
  px_status st = !path || !to ? px_error(PX_ERR_NOMEM, "checkpoint: out of memory rotating %s", dir)
                              : px_ckpt_list(dir, &l);
  if (st != PX_OK) goto done;

  // Temporaries of writers that died on this host.  Another host's are not
  // ours to judge (we cannot see its processes); a live writer's never.
  bool relist = false;
  for (int i = l.n_steps; i < l.n_steps + l.n_temps; i++) {
    const px_ckpt_entry *e = &l.entries[i];
    if (strcmp(e->temp.host, host) != 0 || e->temp.pid == me || px_ckpt_pid_alive(e->temp.pid)) continue;
    snprintf(path, plen, "%s/%s", dir, e->name);
    if (e->temp.kind == PX_CKPT_OLD) {
      // A complete checkpoint its writer set aside to replace it, then died
      // before swapping the new one in: if the step is missing, put it back.
      char step_name[32];
      px_ckpt_step_name(e->step, step_name);
      snprintf(to, plen, "%s/%s", dir, step_name);
      struct stat sb;
      if (lstat(to, &sb) != 0 && errno == ENOENT && rename(path, to) == 0) {
        relist = true;
        continue;
      }
    }
    px_status s = px_ckpt_remove_tree(path);
    if (s != PX_OK) failed(&fl, px_error_wrap(s, "removing the leftovers of a dead writer"));
  }
  if (relist) {
    px_ckpt_listing_free(&l);
    if ((st = px_ckpt_list(dir, &l)) != PX_OK) goto done;
  }

  // Newest first: a checkpoint goes once keep_last complete ones are newer
  // (so never the newest: nothing is newer), unless it is the one just
  // written (which a corrupted newer one could otherwise push out).
  if (keep_last > 0) {
    int complete_newer = 0;
    for (int i = 0; i < l.n_steps; i++) {
      const px_ckpt_entry *e = &l.entries[i];
      snprintf(path, plen, "%s/%s", dir, e->name);
      bool complete = looks_complete(path);
      if (e->step != written && complete_newer >= keep_last) {
        // Renamed out of the step_* names first (one atomic rename), so that
        // a crash in the middle of the removal never leaves a step_*
        // directory with some of its files gone: what is left is a
        // .partial directory, which readers skip and the next rotation on
        // this host removes.
        char temp[384];
        px_ckpt_temp_name(e->step, PX_CKPT_PARTIAL, host, me, temp, sizeof temp);
        snprintf(to, plen, "%s/%s", dir, temp);
        if (rename(path, to) == 0) snprintf(path, plen, "%s", to);
        px_status s = px_ckpt_remove_tree(path);
        if (s != PX_OK) failed(&fl, px_error_wrap(s, "removing an old checkpoint (keep_last %d)", keep_last));
      }
      if (complete) complete_newer++;
    }
  }
  if (fl.count == 1) st = px_error(fl.status, "%s", fl.first);
  else if (fl.count > 1) st = px_error(fl.status, "%s (and %d more removals failed)", fl.first, fl.count - 1);

done:
  px_ckpt_listing_free(&l);
  free(path);
  free(to);
  return st;
}
