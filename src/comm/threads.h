/* comm/threads.h — the objects of the threads backend, shared by
 * threads.c (jobs, groups, rendezvous, collectives, the progress thread,
 * px_comm_run) and threads_p2p.c (point-to-point).  threads.c's opening
 * comment says how they fit together.  Include after _POSIX_C_SOURCE. */
#ifndef PX_COMM_THREADS_H
#define PX_COMM_THREADS_H

#include "comm/internal.h"

#include <pthread.h>
#include <time.h>

#define MSG_MAX 512

typedef enum tkind {
  K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCE_SCATTER, K_BARRIER, K_SPLIT, K_SEND, K_RECV
} tkind;

typedef struct tjob {
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast on every change a waiter may wait for */
  int refs;          /* px_comm_run's, and one per group */
  bool failed;
  px_status fail_status;
  char fail_msg[MSG_MAX];
  bool have_exit;
  int first_exit_code;
  bool *finished;    /* (world size) the rank's function has returned */
} tjob;

struct tgroup;

/* What a rank brings to a collective; the last arriver of a split writes
 * the rank's new group into its post. */
typedef struct tpost {
  tkind kind;
  const void *send;
  void *recv;
  size_t count;
  px_dtype dtype;
  px_reduce_op op;
  int root;
  int color, key;
  struct tgroup *new_group;
  int new_rank;
} tpost;

/* A message sent before its receive was posted. */
typedef struct tmsg {
  int src, tag;
  size_t bytes;
  struct tmsg *next;
  unsigned char data[];
} tmsg;

typedef struct top top;

typedef struct tgroup {
  tjob *job;
  int size;
  int refs;          /* one per member's tcomm */
  int *world_rank;   /* (size) rank in the px_comm_run world, for messages */
  bool is_world;
  /* Rendezvous. */
  uint64_t gen;
  int arrived;
  bool *here;        /* (size) arrived at the current rendezvous */
  tpost *post;       /* (size) */
  int busy;          /* ranks between rendezvous, reading peers' buffers */
  bool *busy_rank;   /* (size) */
  /* Point-to-point, per destination rank, oldest first. */
  tmsg **inbox;      /* (size) */
  top **posted;      /* (size) receives waiting for their send */
} tgroup;

typedef struct tcomm {
  px_comm *c;
  tjob *job;
  tgroup *g;
  int rank;
  int world_rank;
  const void **srcs; /* (size) scratch for reductions */
  bool *missing;     /* (size) scratch for the watchdog: ranks not arrived */
  /* Started operations, oldest first; the head stays until it completes. */
  top *head, *tail;
  pthread_cond_t qcv;
  bool started, stop;
  pthread_t thread;
} tcomm;

/* One operation; a heap copy of it is the px_request of an i* call. */
struct top {
  px_request base;
  tcomm *tc;
  tkind kind;
  const void *send;
  void *recv;
  size_t count;
  px_dtype dtype;
  px_reduce_op op;
  int root;
  int peer, tag;
  int color, key;
  px_comm *split_out;
  char label[PX_COMM_LABEL_MAX];
  double timeout;
  bool posted;  /* a receive in its group's posted list */
  bool done;    /* set under the job mutex; the waiter may then free it */
  px_status status;
  char msg[2 * MSG_MAX]; /* room for the job's reason and what was given up */
  top *next;
};

/* ---- Deadlines --------------------------------------------------------------- */

typedef struct deadline {
  bool set;
  struct timespec at; /* CLOCK_MONOTONIC */
} deadline;

/* ---- Shared by threads.c and threads_p2p.c -------------------------------- */

deadline pxt_deadline_in(double seconds);
/* Waits on the job's condition variable: 0, or ETIMEDOUT once d passed. */
int pxt_job_wait(tjob *j, const deadline *d);
/* Under j->mu.  The first failure wins; later ones are consequences. */
void pxt_job_fail_locked(tjob *j, px_status st, const char *msg);
void pxt_op_set_error(top *op, px_status st, const char *msg);
/* Under j->mu: the job failed elsewhere; say why and what op gave up. */
void pxt_op_fail_from_job(top *op);
/* Under j->mu: op's deadline passed waiting for the ranks in `missing`
 * (group ranks): print, fail the job with PX_ERR_TIMEOUT, set op's error. */
void pxt_watchdog_locked(top *op, const bool *missing);
/* Under j->mu: group rank `gone` returned from its function while op
 * waits for it: print, fail the job with PX_ERR_COMM, set op's error. */
void pxt_gone_locked(top *op, int gone);
void pxt_op_init(top *op, px_comm *c, tkind kind);

px_status pxt_send(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag);
px_status pxt_recv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag);
px_status pxt_isend(px_comm *c, const void *buf, size_t count, px_dtype dtype, int dst, int tag,
                    px_request **req);
px_status pxt_irecv(px_comm *c, void *buf, size_t count, px_dtype dtype, int src, int tag,
                    px_request **req);
/* Waits for a receive (under the watchdog) until it is done. */
void pxt_wait_recv(top *op);

#endif
