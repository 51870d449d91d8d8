/* comm/fingerprint.h — collective fingerprints (PX_DEBUG_COLLECTIVES=1,
 * px_comm_set_debug_collectives): before each collective every rank of the
 * communicator exchanges a fixed-size record of what it is about to call
 * (operation, count, dtype, reduce op, root, call site, the communicator's
 * per-call sequence number; the label travels along for the message) with
 * the backend's own blocking allgather on bytes, and all of them compare
 * the records.  On the first divergence every rank returns PX_ERR_COMM with
 * a message naming both sides, and the collective is not run. */
#ifndef PX_COMM_FINGERPRINT_H
#define PX_COMM_FINGERPRINT_H

#include "comm/internal.h"

typedef enum pxf_kind {
  PXF_ALLREDUCE = 1,
  PXF_BROADCAST,
  PXF_ALLGATHER,
  PXF_REDUCE_SCATTER,
  PXF_BARRIER,
  PXF_IALLREDUCE,
  PXF_IBROADCAST,
  PXF_IALLGATHER,
  PXF_IREDUCE_SCATTER,
  PXF_SPLIT,
} pxf_kind;

/* What one rank is about to call.  op and root are -1 where the operation
 * has none; file/line is the caller's site (NULL/0: unknown). */
typedef struct pxf_call {
  pxf_kind kind;
  size_t count;
  px_dtype dtype;
  int op;
  int root;
  const char *file;
  int line;
} pxf_call;

/* True when PX_DEBUG_COLLECTIVES in the environment asks for the checks
 * ("1", "on", "true", "yes", "detail"; anything else, or unset, is off). */
bool pxf_env_enabled(void);

/* The exchange and comparison (the caller checked c->debug_collectives).
 * PX_OK when every rank's record matches; else PX_ERR_COMM on every rank,
 * with the same message, or the exchange's own error (a watchdog timeout
 * shows "fingerprint exchange before <op> #<n>" as its label: a rank that
 * never reached another collective). */
px_status pxf_check(px_comm *c, const pxf_call *call);

#endif
