/* comm/mpi_side.h — the MPI backend's side channel (mpi_side.c): which
 * ranks reached a stalled collective, so the watchdog can name the others.
 *
 * Every collective of a communicator gets a number (its sequence number:
 * the ranks call collectives in the same order, so the numbers agree).  A
 * rank whose wait stalls (a peer is late: mpi.c's spin, 0.25 s and up)
 * tells the other members of that communicator, once, on a duplicate of
 * MPI_COMM_WORLD: "I am waiting in collective #s of communicator K and have
 * started every collective up to #n on it".  When the wait ends it says
 * that too.  A rank whose watchdog expires reads what it has heard: the
 * members that told it they reached #s arrived; the others are named, with
 * their host and what they said last (waiting in another collective, or
 * nothing: stopped, killed, cut off, or still computing).
 *
 * Nothing is sent while collectives keep completing within the spin: the
 * cost on the fast path is one atomic increment per collective (the
 * number).  Messages are small (under 200 bytes, so eager on every
 * transport), sent and received only by a rank that is already waiting
 * inside MPI, whose blocking call drives MPI's progress: no progress thread
 * is needed (mpi_side.c's opening comment says why not a one-sided window).
 */
#ifndef PX_COMM_MPI_SIDE_H
#define PX_COMM_MPI_SIDE_H

#include <stddef.h>
#include <stdint.h>

/* What a rank is waiting in, as the side channel needs it.  members: the
 * world ranks of the communicator's ranks (n of them); they and the label
 * must stay valid while the call is in use. */
typedef struct px_mpi_call {
  uint64_t key;     /* the communicator's: equal on every member, unequal across communicators */
  uint64_t seq;     /* this collective's number on it (from 1) */
  uint64_t started; /* collectives this rank has started on it (>= seq) */
  const int *members;
  int n;
  int world_rank;    /* this rank's */
  const char *what;  /* "allreduce", ... */
  const char *label; /* the communicator's label when the call started */
} px_mpi_call;

#ifdef PX_HAVE_MPI
/* Collective over MPI_COMM_WORLD, once per process (later calls return 0):
 * duplicates it for the channel and gathers every rank's host name.
 * Non-zero (an MPI error code) when that fails: the watchdog then names no
 * one, as before. */
int px_mpi_side_init(void);
/* Frees the channel; before MPI_Finalize. */
void px_mpi_side_finalize(void);
#endif

/* This rank's wait for `call` has stalled: tell the members (once per call;
 * the caller remembers that it did).  Thread-safe. */
void px_mpi_side_stalled(const px_mpi_call *call);
/* The stalled wait for `call` has ended. */
void px_mpi_side_cleared(const px_mpi_call *call);
/* Receive what has come in.  Cheap when nothing has. */
void px_mpi_side_drain(void);

/* The host name of a world rank ("?" when unknown). */
const char *px_mpi_side_host(int world_rank);

/* The watchdog's verdict for `call`: "waiting on ranks [1]: rank 1 (host
 * b) ..." into out (always terminated). */
void px_mpi_side_verdict(const px_mpi_call *call, char *out, size_t cap);

#endif
