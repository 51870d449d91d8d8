/* stage_test_util.h — what the staging tests share: token shards in a
 * temporary source directory, a stage directory in /dev/shm (the course's
 * node-local place; /tmp where there is none), two ranks of the threads
 * backend staging a source, and file comparisons. */
#ifndef PX_STAGE_TEST_UTIL_H
#define PX_STAGE_TEST_UTIL_H

#define _GNU_SOURCE
#include "px_test.h"

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_RANKS 2
#define ST_SHARDS 3

typedef struct stage_job {
  const char *stage, *kind, *source;
  px_stage_verify verify;
  px_stage_result res[ST_RANKS];
  char staged[ST_RANKS][4096];
  px_status st[ST_RANKS];
  char err[ST_RANKS][512];
} stage_job;

static int stage_rank(px_comm *c, void *arg) {
  stage_job *j = arg;
  const int r = px_comm_rank(c);
  j->st[r] = px_stage_source(c, j->stage, j->kind, j->source, j->verify, j->staged[r], sizeof j->staged[r], &j->res[r]);
  snprintf(j->err[r], sizeof j->err[r], "%s", j->st[r] == PX_OK ? "" : px_last_error());
  return 0;
}

/* Two ranks as threads stage `source`; the copies are counted on every rank. */
static inline void stage2(stage_job *j) {
  memset(j->res, 0, sizeof j->res);
  int code = -1;
  CHECK_OK(px_comm_run(ST_RANKS, stage_rank, j, &code));
  CHECK(code == 0, "px_comm_run exit code %d", code);
  // Only local rank 0 touches the stage: the other rank neither copied nor
  // looked (a rank that staged too would fill in its result).
  for (int r = 1; r < ST_RANKS; r++)
    CHECK(j->res[r].files == 0 && j->res[r].copied == 0 && j->res[r].dir[0] == 0,
          "rank %d staged too (%zu files looked at, %zu copied)", r, j->res[r].files, j->res[r].copied);
}

static inline size_t copies(const stage_job *j) {
  size_t n = 0;
  for (int r = 0; r < ST_RANKS; r++) n += j->res[r].copied;
  return n;
}

/* Shard k of the source: 20,000 + 7,000·k uint16 tokens (vocabulary 512),
 * `salt` changing the values. */
static inline void write_shard(const char *dir, int k, uint32_t salt) {
  size_t n = 20000 + 7000 * (size_t)k;
  uint32_t *t = malloc(n * sizeof *t);
  for (size_t i = 0; i < n; i++) t[i] = (uint32_t)((i * 2654435761u + (uint32_t)k * 97u + salt) % 512u);
  char p[4200];
  snprintf(p, sizeof p, "%.4000s/shard_%06d.bin", dir, k);
  CHECK_OK(px_shard_write(p, t, n, 2));
  free(t);
}

static inline bool read_all(const char *path, unsigned char **buf, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return false;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  *buf = malloc((size_t)len + 1);
  *n = fread(*buf, 1, (size_t)len, f);
  fclose(f);
  return *n == (size_t)len;
}

static inline bool same_bytes(const char *a, const char *b) {
  unsigned char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  bool ok = read_all(a, &x, &nx) && read_all(b, &y, &ny) && nx == ny && memcmp(x, y, nx) == 0;
  free(x);
  free(y);
  return ok;
}

static inline ino_t inode_of(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? sb.st_ino : 0;
}

/* A fresh source directory under the test's working directory and a fresh
 * stage directory in /dev/shm. */
static void make_dirs(const char *name, char *src, size_t src_cap, char *stage, size_t stage_cap) {
  snprintf(src, src_cap, "%s_src", name);
  char cmd[8400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", src, src);
  CHECK(system(cmd) == 0, "%s", cmd);
  struct stat sb;
  const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : "/tmp";
  snprintf(stage, stage_cap, "%s/%s_%ld", base, name, (long)getpid());
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", stage);
  CHECK(system(cmd) == 0, "%s", cmd);
}

static void remove_dir(const char *dir) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0, "%s", cmd);
}

#endif
