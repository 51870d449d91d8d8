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
//   reduce-scatter (send = N segments; rank r gets the sum of segment r):
//     N-1 rounds, all in flight at once; in round k rank r sends segment
//     r+k to rank r+k and receives rank r-k's contribution to segment r,
//     in messages of 131072 floats (512 KiB).  The receive of a round's
//     chunk i >= 2 lands where the round's send of chunk i-2 came from,
//     once that send completed, the first 2 chunks in a head of their own;
//     then out = x_0 + x_1 + ... from where each contribution lies.  The
//     same bytes on the wire as the ring; besides the buffer, at most
//     (N-1)·1 MiB of heads (no spare piece: a piece of a 27 MiB group is
//     6.75 MiB at N = 4).  Smaller messages (128 KiB) measured slower
//     with 4 ranks on 2 busy cores: every wait for a send is a handshake.
//   all-reduce (count): the same over N segments of count/N floats (the
//     first count%N one more: a contribution always fits where it lands),
//     then every rank sends its summed segment to every other.
#ifndef PX_PARALLEL_RANK_SUM_H
#define PX_PARALLEL_RANK_SUM_H

#include "plexus/comm.h"

#include <stdint.h>

typedef struct pxr_sum pxr_sum;

typedef struct pxr_ctx {
  px_comm *comm; /* the caller's communicator */
  px_comm *p2p;  /* private communicator for the messages, NULL: the backend's collectives */
  uint32_t seq;  /* operations started: the tag of each, the same on every rank */
} pxr_ctx;

/* Collective over comm (a communicator split) where the messages are needed. */
px_status pxr_init(pxr_ctx *x, px_comm *comm);
void pxr_fini(pxr_ctx *x);

/* Sum over ranks of send (N·piece floats) and rank r's piece into recv
 * (piece floats; may be send + r·piece).  The other pieces of send are
 * scratch until it completes (they hold other ranks' contributions after).  *out: wait with pxr_wait. */
px_status pxr_reduce_scatter(pxr_ctx *x, float *send, float *recv, size_t piece, pxr_sum **out);
/* The backend's own non-blocking all-reduce (op: PX_SUM or PX_AVG) of
 * count elements of any dtype it reduces (NCCL: bf16 too), waited for like
 * the others; no rank order is promised beyond the backend's. */
px_status pxr_allreduce_native(pxr_ctx *x, void *buf, size_t count, px_dtype dtype, px_reduce_op op, pxr_sum **out);
/* In-place sum over ranks of buf (count floats). */
px_status pxr_allreduce(pxr_ctx *x, float *buf, size_t count, pxr_sum **out);
/* Moves the operation on (MPI progresses inside MPI calls only); *done
 * says whether it completed.  Does not free. */
px_status pxr_test(pxr_sum *s, bool *done);
/* Completes and frees it.  On a failure the messages still in flight are
 * left to the communicator's abort (the job ends). */
px_status pxr_wait(pxr_sum *s);

#endif
