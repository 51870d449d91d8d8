/* comm/mpi_watch.h — the MPI backend's watchdog thread (mpi_watch.c).
 *
 * A blocking px_comm collective under MPI calls MPI's own blocking
 * collective (MPI_Allreduce, ...), which cannot time out and spins while it
 * waits.  Around that call the calling thread arms the watch with what it is
 * in; one thread per process watches the armed call and
 *   - once it has waited `spin` seconds (it has stalled: a peer is late),
 *     throttles the caller: a signal every ~2 ms whose handler naps 2 ms,
 *     so the spinning call uses a few % of a core until the peer arrives;
 *   - at `timeout` seconds prints the watchdog's message and ends the job
 *     with MPI_Abort (so MPI must provide MPI_THREAD_MULTIPLE).
 * Arming and disarming are a few atomic stores: no lock, no system call
 * while collectives keep coming (the thread sleeps only after 1 s of none,
 * and the first arm after that wakes it). */
#ifndef PX_COMM_MPI_WATCH_H
#define PX_COMM_MPI_WATCH_H

#include "comm/mpi_side.h"

#include <stdbool.h>

/* Starts the thread and installs the throttle's signal handler, once per
 * process.  False (and the MPI backend keeps its polling waits) when the
 * thread cannot start or the signal is already handled by the program. */
bool px_mpi_watch_start(void);

/* The calling thread is about to block in `what` on a communicator whose
 * world rank is world_rank; label (copied, up to PX_COMM_LABEL_MAX - 1
 * bytes) is printed at expiry.
 * peer >= 0 for point-to-point.  timeout <= 0: no deadline, still throttled.
 * call (copied; NULL for point-to-point): the collective for the side
 * channel (mpi_side.h): once the call stalls the watcher tells the members,
 * and at expiry names those that did not arrive.
 * False when another thread's call is armed: use the polling wait then. */
bool px_mpi_watch_arm(const char *what, const char *label, int world_rank, int peer, double timeout, double spin,
                      const px_mpi_call *call);
void px_mpi_watch_disarm(void);

/* The watchdog's message, printed to stderr by either wait: "plexus: rank
 * R (host H): watchdog: WHAT (LABEL) did not complete within T s; " then
 * `verdict` (px_mpi_side_verdict's, or px_mpi_watch_peer_verdict's). */
void px_mpi_watch_message(int world_rank, const char *what, const char *label, double timeout, const char *verdict);
/* SIGTERM while a wait is stalled.  Open MPI ends the survivors of a rank
 * that died (kill -9, a crash) with SIGTERM, then SIGKILL about 2 s later:
 * before their watchdog.  px_mpi_watch_term_hook chains a SIGTERM handler
 * in front of the program's own (once; only where the program has one:
 * with the default action the process ends at once, as before), which
 * notes the time; px_mpi_watch_term_since(start) is true, once per signal,
 * for a stalled wait that began before it, which then prints its message
 * (px_mpi_watch_term_message) and goes on waiting. */
void px_mpi_watch_term_hook(void);
bool px_mpi_watch_term_since(double start);
void px_mpi_watch_term_message(int world_rank, const char *what, const char *label, double waited, const char *verdict);

/* The verdict of a point-to-point wait: "waiting on ranks [P] (host H)". */
void px_mpi_watch_peer_verdict(int peer_world_rank, int peer, char *out, size_t cap);

#endif
