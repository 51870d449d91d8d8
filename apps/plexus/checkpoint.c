// Checkpoints as the eval and generate commands see them: where the newest
// good one is, and the config the run saved in it; the run directory that
// plexus train claims (app.h).
#define _GNU_SOURCE /* flock, nftw, pread */
#include "app.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

px_status px_app_resolve_checkpoint(const char *path, char *resolved, size_t cap, char *note, size_t note_cap) {
  if (note && note_cap) note[0] = '\0';
  if (px_checkpoint_verify(path) == PX_OK) {
    snprintf(resolved, cap, "%s", path);
    return PX_OK;
  }
  char why[512];
  snprintf(why, sizeof why, "%s", px_last_error());
  char scratch[1024];
  px_status st = px_checkpoint_latest(path, resolved, cap, note ? note : scratch, note ? note_cap : sizeof scratch);
  if (st != PX_OK) return px_error(st, "%s is neither a good checkpoint (%s) nor a directory holding one", path, why);
  return PX_OK;
}

const char *px_app_find_option(int argc, char **argv, const char *flag) {
  size_t n = strlen(flag);
  for (int a = 1; a < argc; a++) {
    if (strncmp(argv[a], "--", 2) != 0 || strncmp(argv[a] + 2, flag, n) != 0) continue;
    if (argv[a][2 + n] == '\0' && a + 1 < argc) return argv[a + 1];
    if (argv[a][2 + n] == '=') return argv[a] + 3 + n;
  }
  return NULL;
}

px_status px_app_checkpoint_config(const char *ckpt, px_config *c, int commands, int64_t *step) {
  void *bytes;
  size_t n;
  px_status st = px_checkpoint_read_file(ckpt, "state.json", &bytes, &n);
  if (st != PX_OK) return st;
  cJSON *j = cJSON_ParseWithLength(bytes, n);
  free(bytes);
  if (!j) return px_error(PX_ERR_FORMAT, "checkpoint %s: state.json is not valid JSON", ckpt);
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "step");
  *step = cJSON_IsNumber(s) ? (int64_t)s->valuedouble : -1;
  const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(j, "config");
  if (!cJSON_IsObject(cfg)) {
    cJSON_Delete(j);
    return px_error(PX_ERR_FORMAT,
                    "checkpoint %s: state.json holds no \"config\" object: was it written by "
                    "plexus train?",
                    ckpt);
  }
  char *text = cJSON_PrintUnformatted(cfg);
  cJSON_Delete(j);
  if (!text) return px_error(PX_ERR_NOMEM, "out of memory");
  char name[600];
  snprintf(name, sizeof name, "%s/state.json", ckpt);
  st = px_config_load_json(c, text, strlen(text), name, commands);
  free(text);
  return st;
}

/* ---- The run directory (--out): one run at a time, never two mixed ---------- */

// What plexus train writes into --out: a run is there when one of them
// holds something.
static const char *const run_entries[] = {"checkpoints", "metrics.jsonl", "tensorboard", "config.json", "vocab.txt"};

// "3 checkpoints (newest step_00000600), metrics.jsonl (41 records), ..."
// into what; false when nothing of a run is there.
static bool describe_run(const char *dir, char *what, size_t cap) {
  size_t used = 0;
  what[0] = '\0';
  char path[1200];
  snprintf(path, sizeof path, "%s/checkpoints", dir);
  DIR *d = opendir(path);
  if (d) {
    int n = 0;
    char newest[256] = "";
    for (struct dirent *e; (e = readdir(d));) {
      if (e->d_name[0] == '.') continue;
      n++;
      if (strncmp(e->d_name, "step_", 5) == 0 && strcmp(e->d_name, newest) > 0)
        snprintf(newest, sizeof newest, "%s", e->d_name);
    }
    closedir(d);
    if (n > 0)
      used += (size_t)snprintf(what + used, cap - used, "checkpoints/ (%d entr%s%s%s)", n, n == 1 ? "y" : "ies",
                               *newest ? ", newest " : "", newest);
  }
  snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
  FILE *f = fopen(path, "r");
  if (f) {
    long lines = 0;
    for (int ch; (ch = fgetc(f)) != EOF;) lines += ch == '\n';
    fclose(f);
    if (lines > 0 && used < cap)
      used += (size_t)snprintf(what + used, cap - used, "%smetrics.jsonl (%ld records)", used ? ", " : "", lines);
  }
  snprintf(path, sizeof path, "%s/tensorboard", dir);
  d = opendir(path);
  if (d) {
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, "events.out.tfevents.", 20) == 0;
    closedir(d);
    if (n > 0 && used < cap)
      used += (size_t)snprintf(what + used, cap - used, "%stensorboard/ (%d event file%s)", used ? ", " : "", n,
                               n == 1 ? "" : "s");
  }
  return used > 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

// --overwrite: the old run's entries are renamed, each at once, into a
// hidden directory and only then deleted, so whatever happens the new run
// never starts beside a part of the old one.
static px_status clear_run(const char *dir) {
  char trash[1200];
  snprintf(trash, sizeof trash, "%s/.plexus-overwritten.%ld", dir, (long)getpid());
  if (mkdir(trash, 0777) != 0 && errno != EEXIST)
    return px_error(PX_ERR_IO, "--overwrite: cannot create %s: %s", trash, strerror(errno));
  for (size_t i = 0; i < sizeof run_entries / sizeof *run_entries; i++) {
    char from[1200], to[1400];
    snprintf(from, sizeof from, "%s/%s", dir, run_entries[i]);
    snprintf(to, sizeof to, "%s/%s", trash, run_entries[i]);
    if (rename(from, to) != 0 && errno != ENOENT)
      return px_error(PX_ERR_IO, "--overwrite: cannot move %s aside: %s", from, strerror(errno));
  }
  if (nftw(trash, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
    return px_error(PX_ERR_IO, "--overwrite: the old run moved to %s could not be deleted: %s", trash, strerror(errno));
  return PX_OK;
}

px_status px_app_run_dir_claim(const char *dir, bool resume, bool overwrite, int *lock_fd) {
  *lock_fd = -1;
  char path[1200];
  snprintf(path, sizeof path, "%s/.plexus.lock", dir);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return px_error(PX_ERR_IO, "--out %s: cannot open the run's lock %s: %s", dir, path, strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char holder[256] = "";
    ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
    holder[n > 0 ? n : 0] = '\0';
    char *nl = strchr(holder, '\n');
    if (nl) *nl = '\0';
    int err = errno;
    close(fd);
    if (err == EWOULDBLOCK || n >= 0)
      return px_error(PX_ERR_INVALID,
                      "--out %s: another run is writing into this directory (%s; lock %s); wait for "
                      "it to end, or give this run another --out",
                      dir,
                      *holder ? holder
                              : "its host and process "
                                "unknown",
                      path);
    return px_error(PX_ERR_IO, "--out %s: cannot lock %s: %s", dir, path, strerror(err));
  }
  char what[512];
  if (!resume && describe_run(dir, what, sizeof what)) {
    if (!overwrite) {
      close(fd);
      return px_error(PX_ERR_INVALID,
                      "--out %s already holds a run: %s; continue it with --resume auto, start a "
                      "new one with another --out, or replace it with --overwrite (deletes those files)",
                      dir, what);
    }
    px_status st = clear_run(dir);
    if (st != PX_OK) {
      close(fd);
      return st;
    }
  }
  // Who holds the lock, for a run that finds it taken.
  char host[256] = "?";
  if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  char line[400];
  int n = snprintf(line, sizeof line, "host %s, process %ld\n", host, (long)getpid());
  if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n) {
    close(fd);
    return px_error(PX_ERR_IO, "--out %s: cannot write %s: %s", dir, path, strerror(errno));
  }
  *lock_fd = fd;
  return PX_OK;
}

void px_app_run_dir_release(int lock_fd) {
  if (lock_fd >= 0) close(lock_fd);  // the lock goes with the descriptor
}
