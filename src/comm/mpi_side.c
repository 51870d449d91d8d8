// The MPI backend's side channel (mpi_side.h says what it carries).
//
// Why stalled ranks push short messages, and not a one-sided window or a
// heartbeat on every collective:
//   - Open MPI (4.1 here) has no progress thread: a message moves only
//     while some thread of the sending and of the receiving process is
//     inside MPI.  The ranks that matter are the ones waiting in the stalled
//     collective: they sit inside MPI (a blocking collective spins in
//     opal_progress; plexus's polling wait calls MPI_Test), so an eager
//     message between two of them is delivered; the watchdog thread sends
//     and receives with MPI_THREAD_MULTIPLE while its caller blocks.
//   - A passive-target window (MPI_Put / MPI_Accumulate of each rank's last
//     sequence number, MPI_Get at expiry) needs the *target* to make
//     progress over TCP (osc/pt2pt, or osc/rdma's emulation without RDMA
//     hardware): a read from a stopped rank, or one computing outside MPI,
//     would hang the watchdog itself; and every collective would pay a
//     one-sided operation on the fast path.
//   - A heartbeat or an arrival record per collective costs a message per
//     collective per peer while nothing is wrong.  Here nothing is sent
//     until a wait has stalled (0.25 s and more, mpi.c): then one message
//     to each member, and one when the wait ends.
// What it cannot see: a rank that posted the collective (a non-blocking
// one, DDP's buckets) and then stopped before any wait of its own stalled
// has said nothing, and is named as having "sent no word of waiting in a
// collective".  It is the rank at fault either way.  Nor can a message
// cross a cut link: both sides of one name each other so.
//
// Messages: one fixed record (struct rec) of MPI_BYTEs with tag SIDE_TAG on
// a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN (the channel is best
// effort: a failed send is skipped, never fatal).  Each destination has one
// send slot; a record for a peer whose previous record has not left yet is
// dropped (that peer is not receiving: it is not the one whose watchdog
// will read it).  Received with MPI_Improbe/MPI_Mrecv, so no receive is
// ever left posted (nothing to cancel at the end); records not read by the
// end of the run are discarded by MPI_Comm_free.
#define _POSIX_C_SOURCE 200809L
#include "comm/mpi_side.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#ifdef PX_HAVE_MPI

#include "comm/internal.h"

#include <mpi.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#define SIDE_TAG 7117
#define HOST_MAX 64
/* Ranks named in full (host and state) in one message; the list of ranks
 * goes on to LIST_MAX. */
#define DETAIL_MAX 4
#define LIST_MAX 32

enum { KIND_WAITING = 1, KIND_LEFT = 2 };

typedef struct rec {
  uint64_t key, started, waiting;
  int32_t world_rank, kind;
  char what[24];
  char label[PX_COMM_LABEL_MAX];
} rec;

typedef struct slot {
  MPI_Request req;
  rec buf;
} slot;

static struct {
  pthread_mutex_t mu;
  bool ready;
  MPI_Comm comm;
  int rank, size;
  char (*hosts)[HOST_MAX];
  rec *heard; /* the newest record from each world rank */
  bool *has;
  slot *out;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER, .comm = MPI_COMM_NULL};

int px_mpi_side_init(void) {
  if (S.ready) return 0;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &S.comm);
  if (rc != MPI_SUCCESS) return rc;
  MPI_Comm_set_errhandler(S.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(S.comm, &S.rank);
  MPI_Comm_size(S.comm, &S.size);
  S.hosts = calloc((size_t)S.size, sizeof *S.hosts);
  S.heard = calloc((size_t)S.size, sizeof *S.heard);
  S.has = calloc((size_t)S.size, sizeof *S.has);
  S.out = calloc((size_t)S.size, sizeof *S.out);
  char me[HOST_MAX] = {0};
  if (gethostname(me, sizeof me - 1) != 0) snprintf(me, sizeof me, "?");
  // Every rank agrees that all allocated before the gather (collective).
  int ok_all = S.hosts && S.heard && S.has && S.out;
  rc = MPI_Allreduce(MPI_IN_PLACE, &ok_all, 1, MPI_INT, MPI_MIN, S.comm);
  if (rc == MPI_SUCCESS && ok_all) rc = MPI_Allgather(me, HOST_MAX, MPI_CHAR, S.hosts, HOST_MAX, MPI_CHAR, S.comm);
  if (rc != MPI_SUCCESS || !ok_all) {
    free(S.hosts), free(S.heard), free(S.has), free(S.out);
    S.hosts = NULL, S.heard = NULL, S.has = NULL, S.out = NULL;
    MPI_Comm_free(&S.comm);
    return rc != MPI_SUCCESS ? rc : MPI_ERR_NO_MEM;
  }
  for (int i = 0; i < S.size; i++) {
    S.hosts[i][HOST_MAX - 1] = 0;
    S.out[i].req = MPI_REQUEST_NULL;
  }
  S.ready = true;
  return 0;
}

void px_mpi_side_finalize(void) {
  pthread_mutex_lock(&S.mu);
  if (S.ready) {
    S.ready = false;
    for (int i = 0; i < S.size; i++) {
      if (S.out[i].req == MPI_REQUEST_NULL) continue;
      int done = 0;
      MPI_Test(&S.out[i].req, &done, MPI_STATUS_IGNORE);
      if (!done) MPI_Request_free(&S.out[i].req);
    }
    MPI_Comm_free(&S.comm);
    free(S.hosts), free(S.heard), free(S.has), free(S.out);
    S.hosts = NULL, S.heard = NULL, S.has = NULL, S.out = NULL;
  }
  pthread_mutex_unlock(&S.mu);
}

static void copy_str(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src ? src : ""); }

/* Under S.mu. */
static void send_all(const px_mpi_call *c, int kind) {
  for (int i = 0; i < c->n; i++) {
    const int p = c->members[i];
    if (p == S.rank || p < 0 || p >= S.size) continue;
    slot *s = &S.out[p];
    if (s->req != MPI_REQUEST_NULL) {
      int done = 0;
      if (MPI_Test(&s->req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) continue;
    }
    memset(&s->buf, 0, sizeof s->buf);
    s->buf.key = c->key;
    s->buf.started = c->started;
    s->buf.waiting = c->seq;
    s->buf.world_rank = S.rank;
    s->buf.kind = kind;
    copy_str(s->buf.what, sizeof s->buf.what, c->what);
    copy_str(s->buf.label, sizeof s->buf.label, c->label);
    if (MPI_Isend(&s->buf, (int)sizeof s->buf, MPI_BYTE, p, SIDE_TAG, S.comm, &s->req) != MPI_SUCCESS)
      s->req = MPI_REQUEST_NULL;
  }
}

/* Under S.mu. */
static void drain_locked(void) {
  for (;;) {
    int flag = 0;
    MPI_Message msg;
    MPI_Status st;
    if (MPI_Improbe(MPI_ANY_SOURCE, SIDE_TAG, S.comm, &flag, &msg, &st) != MPI_SUCCESS || !flag) return;
    rec r;
    memset(&r, 0, sizeof r);
    if (MPI_Mrecv(&r, (int)sizeof r, MPI_BYTE, &msg, &st) != MPI_SUCCESS) return;
    const int src = st.MPI_SOURCE;
    if (src < 0 || src >= S.size) continue;
    r.what[sizeof r.what - 1] = 0;
    r.label[sizeof r.label - 1] = 0;
    S.heard[src] = r;
    S.has[src] = true;
  }
}

void px_mpi_side_stalled(const px_mpi_call *c) {
  pthread_mutex_lock(&S.mu);
  if (S.ready) {
    send_all(c, KIND_WAITING);
    drain_locked();
  }
  pthread_mutex_unlock(&S.mu);
}

void px_mpi_side_cleared(const px_mpi_call *c) {
  pthread_mutex_lock(&S.mu);
  if (S.ready) send_all(c, KIND_LEFT);
  pthread_mutex_unlock(&S.mu);
}

void px_mpi_side_drain(void) {
  // The watchdog and a polling wait may both drain: whoever holds the lock
  // does it for both.
  if (pthread_mutex_trylock(&S.mu) != 0) return;
  if (S.ready) drain_locked();
  pthread_mutex_unlock(&S.mu);
}

const char *px_mpi_side_host(int world_rank) {
  if (!S.hosts || world_rank < 0 || world_rank >= S.size) return "?";
  return S.hosts[world_rank];
}

#define PUT(...)                                                       \
  do {                                                                 \
    if (k < cap) k += (size_t)snprintf(out + k, cap - k, __VA_ARGS__); \
  } while (0)

void px_mpi_side_verdict(const px_mpi_call *c, char *out, size_t cap) {
  if (!cap) return;
  out[0] = 0;
  size_t k = 0;
  pthread_mutex_lock(&S.mu);
  if (!S.ready) {
    pthread_mutex_unlock(&S.mu);
    PUT("waiting on ranks: unknown (the side channel did not start)");
    return;
  }
  drain_locked();
  bool world = c->n == S.size;
  for (int i = 0; world && i < c->n; i++) world = c->members[i] == i;
  int missing[LIST_MAX], n_missing = 0, n_more = 0;
  for (int i = 0; i < c->n; i++) {
    const int p = c->members[i];
    if (p == S.rank) continue;
    const bool arrived = p >= 0 && p < S.size && S.has[p] && S.heard[p].key == c->key && S.heard[p].started >= c->seq;
    if (arrived) continue;
    if (n_missing < LIST_MAX) missing[n_missing++] = i;
    else n_more++;
  }
  if (n_missing == 0) {
    PUT("waiting on ranks: none missing: every other rank of %s said it reached this collective (#%llu of "
        "this group): a transport stall, or a peer that stalled inside it",
        world ? "the job" : "this group", (unsigned long long)c->seq);
    pthread_mutex_unlock(&S.mu);
    return;
  }
  PUT("waiting on ranks [");
  for (int j = 0; j < n_missing; j++) PUT("%s%d", j ? ", " : "", missing[j]);
  PUT("%s]", n_more ? ", ..." : "");
  if (!world) {
    PUT(" of this group of %d (world ranks [", c->n);
    for (int j = 0; j < n_missing; j++) PUT("%s%d", j ? ", " : "", c->members[missing[j]]);
    PUT("%s])", n_more ? ", ..." : "");
  }
  PUT(", which did not reach this collective (#%llu of this group)", (unsigned long long)c->seq);
  for (int j = 0; j < n_missing && j < DETAIL_MAX; j++) {
    const int p = c->members[missing[j]];
    const rec *r = S.has[p] ? &S.heard[p] : NULL;
    PUT("; %srank %d on host %s ", world ? "" : "world ", p, px_mpi_side_host(p));
    if (r && r->kind == KIND_WAITING && r->key == c->key)
      PUT("is waiting in %s (%s), collective #%llu of this group", r->what, r->label[0] ? r->label : "no label set",
          (unsigned long long)r->waiting);
    else if (r && r->kind == KIND_WAITING)
      PUT("is waiting in %s (%s) on another communicator", r->what, r->label[0] ? r->label : "no label set");
    else PUT("sent no word of waiting in a collective (it is stopped, killed, cut off, or still computing)");
  }
  if (n_missing > DETAIL_MAX) PUT("; ...");
  pthread_mutex_unlock(&S.mu);
}

#else

void px_mpi_side_stalled(const px_mpi_call *c) { (void)c; }
void px_mpi_side_cleared(const px_mpi_call *c) { (void)c; }
void px_mpi_side_drain(void) {}
const char *px_mpi_side_host(int world_rank) {
  (void)world_rank;
  return "?";
}
void px_mpi_side_verdict(const px_mpi_call *c, char *out, size_t cap) {
  (void)c;
  if (cap) snprintf(out, cap, "waiting on ranks: unknown (built without MPI)");
}

#endif
