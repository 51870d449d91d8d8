// The threads backend's job failure: the first failure of a job wins and
// fails every waiter; the watchdog's and a vanished rank's messages
// (threads.c's opening comment, "Watchdog and failure").
#define _POSIX_C_SOURCE 200809L
#include "comm/threads.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *pxt_kind_name(tkind k) {
  static const char *names[] = {"allreduce", "broadcast", "allgather", "reduce_scatter",
                                "barrier",   "split",     "send",      "recv"};
  return names[k];
}

/* ---- Failure ------------------------------------------------------------------ */

/* Under j->mu.  The first failure wins; later ones are consequences. */
void pxt_job_fail_locked(tjob *j, px_status st, const char *msg) {
  if (j->failed) return;
  j->fail_status = st;
  snprintf(j->fail_msg, sizeof j->fail_msg, "%s", msg);
  // Spinners see this store; sleepers get the broadcast.
  atomic_store(&j->failed, true);
  pthread_cond_broadcast(&j->cv);
}

void pxt_op_set_error(top *op, px_status st, const char *msg) {
  op->status = st;
  snprintf(op->msg, sizeof op->msg, "%s", msg);
}

static const char *label_of(const top *op) { return op->label[0] ? op->label : "no label set"; }

/* Under j->mu: the job failed elsewhere; say why and what this rank gave up. */
void pxt_op_fail_from_job(top *op) {
  tjob *j = op->tc->job;
  op->status = j->fail_status;
  snprintf(op->msg, sizeof op->msg, "%s; giving up %s (%s)", j->fail_msg, pxt_kind_name(op->kind), label_of(op));
}

/* Under j->mu: this rank's deadline passed.  `missing` are ranks of the
 * group that have not arrived. */
void pxt_watchdog_locked(top *op, const bool *missing) {
  tcomm *tc = op->tc;
  tgroup *g = tc->g;
  char list[200] = "[", wlist[200] = "[";
  size_t k = 1, wk = 1;
  int shown = 0;
  for (int r = 0; r < g->size; r++) {
    if (!missing[r]) continue;
    if (shown == 32) {  // enough to act on; the rest would drown the message
      k += (size_t)snprintf(list + k, sizeof list - k, ", ...");
      wk += (size_t)snprintf(wlist + wk, sizeof wlist - wk, ", ...");
      break;
    }
    k += (size_t)snprintf(list + k, sizeof list - k, "%s%d", shown ? ", " : "", r);
    wk += (size_t)snprintf(wlist + wk, sizeof wlist - wk, "%s%d", shown ? ", " : "", g->world_rank[r]);
    shown++;
    if (k >= sizeof list - 8 || wk >= sizeof wlist - 8) break;
  }
  snprintf(list + (k < sizeof list - 2 ? k : sizeof list - 2), 2, "]");
  snprintf(wlist + (wk < sizeof wlist - 2 ? wk : sizeof wlist - 2), 2, "]");
  char msg[MSG_MAX];
  if (g->is_world)
    snprintf(msg, sizeof msg, "rank %d: watchdog: %s (%s) did not complete within %g s; waiting on ranks %s",
             tc->world_rank, pxt_kind_name(op->kind), label_of(op), op->timeout, list);
  else
    snprintf(msg, sizeof msg,
             "rank %d: watchdog: %s (%s) did not complete within %g s; waiting on ranks %s of this "
             "group of %d (world ranks %s)",
             tc->world_rank, pxt_kind_name(op->kind), label_of(op), op->timeout, list, g->size, wlist);
  fprintf(stderr, "plexus: %s\n", msg);
  pxt_job_fail_locked(tc->job, PX_ERR_TIMEOUT, msg);
  pxt_op_set_error(op, PX_ERR_TIMEOUT, msg);
}

/* Under j->mu: the first rank in `missing` whose function has returned, or
 * -1.  Such a rank can never arrive, so waiting for the watchdog would only
 * delay the same verdict (typically: a rank ran out of data a step early). */
int pxt_gone_rank_locked(const tcomm *tc, const bool *missing) {
  const tgroup *g = tc->g;
  if (!tc->job->finished) return -1;
  for (int r = 0; r < g->size; r++)
    if (missing[r] && tc->job->finished[g->world_rank[r]]) return r;
  return -1;
}

/* Under j->mu: fail the job because group rank `gone` has returned. */
void pxt_gone_locked(top *op, int gone) {
  tcomm *tc = op->tc;
  char msg[MSG_MAX];
  if (op->kind == K_RECV)
    snprintf(msg, sizeof msg,
             "rank %d returned from its function without sending the message (tag %d) that rank %d waits for "
             "in recv (%s)",
             tc->g->world_rank[gone], op->tag, tc->world_rank, label_of(op));
  else
    snprintf(msg, sizeof msg,
             "rank %d returned from its function while rank %d waits for it in %s (%s); every rank must "
             "make the same collective calls",
             tc->g->world_rank[gone], tc->world_rank, pxt_kind_name(op->kind), label_of(op));
  fprintf(stderr, "plexus: %s\n", msg);
  pxt_job_fail_locked(tc->job, PX_ERR_COMM, msg);
  pxt_op_set_error(op, PX_ERR_COMM, msg);
}
