/* checkpoint_write0_cases.h — the claims about px_checkpoint_write0, written
 * once over px_comm so the same code runs under the threads backend
 * (test_checkpoint_write0_reports_to_all.c) and under mpiexec with 1, 2 and
 * 4 processes (test_checkpoint_write0_reports_to_all_mpi.c). */
#ifndef PX_CHECKPOINT_WRITE0_CASES_H
#define PX_CHECKPOINT_WRITE0_CASES_H

#include "ckpt_test_util.h"

// FNV-1a of a message, so ranks can compare messages with an all-reduce.
static int32_t message_hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return (int32_t)(h & 0x7fffffff);
}

// Every rank got the same status and the same message.
static void check_same_everywhere(px_comm *c, px_status st, const char *what) {
  int32_t v[2] = {(int32_t)st, message_hash(st == PX_OK ? "" : px_last_error())};
  int32_t lo[2] = {v[0], v[1]}, hi[2] = {v[0], v[1]};
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", px_last_error());
  CHECK_OK(px_comm_allreduce(c, lo, 2, PX_I32, PX_MIN));
  CHECK_OK(px_comm_allreduce(c, hi, 2, PX_I32, PX_MAX));
  CHECK(lo[0] == hi[0], "%s: ranks returned different statuses (rank %d: %s)", what, px_comm_rank(c),
        px_status_name(st));
  CHECK(lo[1] == hi[1], "%s: ranks got different messages (rank %d: %s)", what, px_comm_rank(c), msg);
}

static int write0_cases(px_comm *c, void *arg) {
  (void)arg;
  int rank = px_comm_rank(c);
  // One directory for all ranks: rank 0 makes it and tells the others.
  char root[64] = "";
  if (rank == 0) {
    snprintf(root, sizeof root, "/tmp/px_ckpt_w0_XXXXXX");
    if (!mkdtemp(root)) root[0] = '\0';
  }
  CHECK_OK(px_comm_broadcast(c, root, sizeof root, PX_U8, 0));
  CHECK(root[0] != '\0', "rank 0 could not make a directory");
  char dir[128], path[512], want[512];
  snprintf(dir, sizeof dir, "%s/ckpts", root);

  // Every rank hands over its own state; the checkpoint must hold rank 0's.
  ckpt_state mine, rank0, back;
  ckpt_state_init(&mine, rank + 1);
  ckpt_state_init(&rank0, 1);
  for (int step = 1; step <= 3; step++) {
    px_status st = px_checkpoint_write0(c, dir, step, mine.items, 3, 2, path, sizeof path);
    check_same_everywhere(c, st, "a good write");
    CHECK(st == PX_OK, "rank %d: write0 of step %d: %s", rank, step, px_last_error());
    snprintf(want, sizeof want, "%s/step_%08d", dir, step);
    CHECK(strcmp(path, want) == 0, "rank %d: path_out %s, expected %s", rank, path, want);
  }
  CHECK_OK(px_checkpoint_verify(path));
  ckpt_state_init(&back, 0);
  ckpt_state_zero(&back);
  CHECK_OK(ckpt_state_load(path, &back));
  CHECK(ckpt_state_equal(&back, &rank0), "rank %d: the checkpoint does not hold rank 0's values", rank);
  char names[1024];
  ckpt_list_dir(dir, names, sizeof names);
  CHECK(!strcmp(names, "step_00000002 step_00000003"), "rank %d: keep_last 2 left %s", rank, names);
  CHECK_OK(px_comm_barrier(c));

  // An unwritable directory (below a regular file): every rank gets rank
  // 0's error and message, and no path.
  char bad[256];
  snprintf(bad, sizeof bad, "%s/plain_file", root);
  if (rank == 0) CHECK(ckpt_write_text(bad, "not a directory"), "write %s", bad);
  CHECK_OK(px_comm_barrier(c));
  snprintf(bad, sizeof bad, "%s/plain_file/ckpts", root);
  snprintf(path, sizeof path, "stale");
  px_status st = px_checkpoint_write0(c, bad, 4, mine.items, 3, 0, path, sizeof path);
  check_same_everywhere(c, st, "an unwritable directory");
  CHECK(st == PX_ERR_IO && strstr(px_last_error(), "plain_file"), "rank %d: %s: %s", rank, px_status_name(st),
        px_last_error());
  CHECK(path[0] == '\0', "rank %d: path_out is \"%s\" after a failed write", rank, path);

  // Bad arguments are rank 0's to find, every rank's to hear.
  st = px_checkpoint_write0(c, dir, 5, mine.items, 0, 0, path, sizeof path);
  check_same_everywhere(c, st, "no items");
  CHECK(st == PX_ERR_INVALID, "rank %d: no items gave %s", rank, px_status_name(st));

  CHECK_OK(px_comm_barrier(c));
  if (rank == 0) ckpt_rm_rf(root);
  return 0;
}

#endif
