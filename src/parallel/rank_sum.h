// Gradient sums over ranks in rank order, x_0 + x_1 + ... + x_{N-1} left to
// right for every element, whatever the backend and the buffer's length:
// DDP's all-reduce and ZeRO's reduce-scatter then agree to the bit, so the
// stages train to DDP's parameters exactly (issue 11).  Not public API.
//
// The threads backend already sums in rank order, and any backend does with
// 2 ranks (a + b == b + a): there the backend's own collective runs.  Under
// MPI with 3 or more ranks, Open MPI's ring all-reduce adds each segment of
// a buffer starting from a different rank (segment e: x_{e-1} + x_e + ...),
// and MPI_Reduce_scatter_block in yet another order, so both are built here
// from point-to-point messages on a private communicator:
//
//   reduce-scatter (piece n, send = N pieces): N-1 rounds; in round k rank r
//     sends piece r+k to rank r+k and receives rank r-k's piece r, into one
//     spare piece (round 1) or the piece it sent the round before; then
//     recv = x_0 + x_1 + ... from where each contribution lies.  The same
//     bytes on the wire as the ring, one spare piece of memory.
//   all-reduce (count): the same over segments of ceil(count / N) (the
//     contributions go to a spare buffer: segments may differ in length),
//     then every rank sends its summed segment to every other.
#ifndef PX_PARALLEL_RANK_SUM_H
#define PX_PARALLEL_RANK_SUM_H

#include "plexus/comm.h"

#include <stdint.h>

typedef struct pxr_sum pxr_sum;

typedef struct pxr_ctx {
  px_comm *comm;    /* the caller's communicator */
  px_comm *p2p;     /* private communicator for the messages, NULL: the backend's collectives */
  uint32_t seq;     /* operations started: the tag of each, the same on every rank */
} pxr_ctx;

/* Collective over comm (a communicator split) where the messages are needed. */
px_status pxr_init(pxr_ctx *x, px_comm *comm);
void pxr_fini(pxr_ctx *x);

/* Sum over ranks of send (N·piece floats) and rank r's piece into recv
 * (piece floats; may be send + r·piece).  The other pieces of send are
 * scratch until it completes.  *out: wait with pxr_wait. */
px_status pxr_reduce_scatter(pxr_ctx *x, float *send, float *recv, size_t piece, pxr_sum **out);
/* In-place sum over ranks of buf (count floats). */
px_status pxr_allreduce(pxr_ctx *x, float *buf, size_t count, pxr_sum **out);
/* Moves the operation on (MPI progresses inside MPI calls only); *done
 * says whether it completed.  Does not free. */
px_status pxr_test(pxr_sum *s, bool *done);
/* Completes and frees it.  On a failure the messages still in flight are
 * left to the communicator's abort (the job ends). */
px_status pxr_wait(pxr_sum *s);

#endif
