// Collective fingerprints (comm/fingerprint.h): what each rank is about to
// call, exchanged and compared before the call, so that a mismatched
// collective is an error naming both sides instead of a hang or a silent
// wrong sum (PyTorch's TORCH_DISTRIBUTED_DEBUG=DETAIL does the same).
//
// The exchange is the backend's own blocking allgather on bytes
// (c->ops->allgather: never the public entry point, so it is not itself
// checked).  Every collective of a checked communicator is preceded by one
// such exchange of the same size on every rank, so exchanges always pair up
// in call order: a rank that skips a collective meets the others with its
// NEXT collective's record, which differs from theirs (another operation,
// size or call site) and is reported.  A rank that skips a collective and
// never calls another leaves the others in the exchange until the
// watchdog, whose message shows the label set here for the exchange.
#define _POSIX_C_SOURCE 200809L
#include "comm/fingerprint.h"
#include "base/internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { SITE_MAX = 64 };

/* The bytes exchanged: fixed size, zero-filled, no pointers. */
typedef struct record {
  uint64_t seq;
  uint64_t count;
  int32_t kind, dtype, op, root, line, rank;
  char site[SITE_MAX];           /* the tail of __FILE__: "parallel/ddp.c" */
  char label[PX_COMM_LABEL_MAX]; /* shown, not compared (see below) */
} record;
_Static_assert(sizeof(record) == 232, "docs/RELIABILITY.md and plexus/comm.h give the record's size");

bool pxf_env_enabled(void) {
  const char *v = getenv("PX_DEBUG_COLLECTIVES");
  if (!v) return false;
  const char *on[] = {"1", "on", "true", "yes", "detail"};
  for (size_t i = 0; i < sizeof on / sizeof *on; i++)
    if (strcasecmp(v, on[i]) == 0) return true;
  return false;
}

static const char *kind_name(int k) {
  switch ((pxf_kind)k) {
  case PXF_ALLREDUCE: return "allreduce";
  case PXF_BROADCAST: return "broadcast";
  case PXF_ALLGATHER: return "allgather";
  case PXF_REDUCE_SCATTER: return "reduce_scatter";
  case PXF_BARRIER: return "barrier";
  case PXF_IALLREDUCE: return "iallreduce";
  case PXF_IBROADCAST: return "ibroadcast";
  case PXF_IALLGATHER: return "iallgather";
  case PXF_IREDUCE_SCATTER: return "ireduce_scatter";
  case PXF_SPLIT: return "split";
  }
  return "?";
}

/* The last two components of a path ("src/parallel/ddp.c" -> "parallel/ddp.c"),
 * or the file's name alone where they do not fit: enough to find the file,
 * and the same on every rank of one build. */
static void site_of(char *out, const char *file) {
  if (!file) {
    out[0] = '\0';
    return;
  }
  const char *base = strrchr(file, '/'), *two = file;
  base = base ? base + 1 : file;
  if (base > file + 1) {
    const char *p = base - 1;  // the slash before the name
    while (p > file && p[-1] != '/') p--;
    two = p;
  }
  const char *start = strlen(two) < SITE_MAX ? two : base;
  size_t n = strlen(start);
  if (n >= SITE_MAX) start += n - (SITE_MAX - 1);  // keep the tail: the extension and most of the name
  snprintf(out, SITE_MAX, "%s", start);
}

/* One side of the message: "allreduce 1024 F32 SUM 'DDP step 3, bucket 2' at parallel/ddp.c:212". */
static void describe(char *out, size_t cap, const record *r, bool with_seq) {
  char what[96];
  const char *dt = (unsigned)r->dtype < PX_DTYPE_COUNT ? px_dtype_name((px_dtype)r->dtype) : "?";
  switch ((pxf_kind)r->kind) {
  case PXF_ALLREDUCE:
  case PXF_IALLREDUCE:
  case PXF_REDUCE_SCATTER:
  case PXF_IREDUCE_SCATTER:
    snprintf(what, sizeof what, "%s %llu %s %s", kind_name(r->kind), (unsigned long long)r->count, dt,
             px_comm_op_name((px_reduce_op)r->op));
    break;
  case PXF_BROADCAST:
  case PXF_IBROADCAST:
    snprintf(what, sizeof what, "%s %llu %s from root %d", kind_name(r->kind), (unsigned long long)r->count, dt,
             r->root);
    break;
  case PXF_ALLGATHER:
  case PXF_IALLGATHER:
    snprintf(what, sizeof what, "%s %llu %s", kind_name(r->kind), (unsigned long long)r->count, dt);
    break;
  default: snprintf(what, sizeof what, "%s", kind_name(r->kind)); break;
  }
  char seq[32] = "";
  if (with_seq) snprintf(seq, sizeof seq, " (its collective #%llu)", (unsigned long long)r->seq);
  char site[SITE_MAX + 16];
  if (r->site[0]) snprintf(site, sizeof site, "%s:%d", r->site, r->line);
  else snprintf(site, sizeof site, "an unknown site");
  snprintf(out, cap, "%s '%s' at %s%s", what, r->label[0] ? r->label : "no label set", site, seq);
}

/* Which fields differ, for the message ("count, call site"). */
static void differences(char *out, size_t cap, const record *a, const record *b) {
  out[0] = '\0';
  size_t n = 0;
#define PXF_DIFF(cond, name)                                                                    \
  if (cond) n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "%s%s", n ? ", " : "", name); \
  if (n >= cap) return;
  PXF_DIFF(a->kind != b->kind, "operation")
  PXF_DIFF(a->count != b->count, "count")
  PXF_DIFF(a->dtype != b->dtype, "dtype")
  PXF_DIFF(a->op != b->op, "reduce op")
  PXF_DIFF(a->root != b->root, "root")
  PXF_DIFF(strcmp(a->site, b->site) != 0 || a->line != b->line, "call site")
  PXF_DIFF(a->seq != b->seq, "sequence number")
#undef PXF_DIFF
}

/* The label is not compared: plexus's own labels may name the rank's part
 * (a pipeline's tied-embedding all-reduce runs on the first and the last
 * stage, each labelled with its own stage), so comparing them would report
 * divergences that are none.  It is shown on both sides. */
static bool same(const record *a, const record *b) {
  return a->kind == b->kind && a->count == b->count && a->dtype == b->dtype && a->op == b->op && a->root == b->root &&
    a->line == b->line && a->seq == b->seq && strcmp(a->site, b->site) == 0;
}

px_status pxf_check(px_comm *c, const pxf_call *call) {
  const uint64_t seq = ++c->debug_seq;
  if (c->size <= 1) return PX_OK;  // a world of one agrees with itself
  record mine;
  memset(&mine, 0, sizeof mine);
  mine.seq = seq;
  mine.count = (uint64_t)call->count;
  mine.kind = (int32_t)call->kind;
  mine.dtype = (int32_t)call->dtype;
  mine.op = call->op;
  mine.root = call->root;
  mine.line = call->file ? call->line : 0;
  mine.rank = c->rank;
  site_of(mine.site, call->file);
  memcpy(mine.label, c->label, sizeof mine.label);
  mine.label[sizeof mine.label - 1] = '\0';

  record *all = malloc((size_t)c->size * sizeof *all);
  if (!all)
    return px_error(PX_ERR_NOMEM, "collective fingerprints: out of memory for %d records before %s #%llu", c->size,
                    kind_name(call->kind), (unsigned long long)seq);
  // While the exchange waits, the watchdog shows this label: a rank that
  // skipped this collective and never calls another keeps the others here.
  char saved[PX_COMM_LABEL_MAX];
  memcpy(saved, c->label, sizeof saved);
  char wait_label[PX_COMM_LABEL_MAX + 128];
  snprintf(wait_label, sizeof wait_label, "fingerprint exchange before %s #%llu at %s:%d, %s", kind_name(call->kind),
           (unsigned long long)seq, mine.site[0] ? mine.site : "?", mine.line, saved[0] ? saved : "no label set");
  size_t wn = strlen(wait_label);  // a long label is cut: its start says what it is
  if (wn >= sizeof c->label) wn = sizeof c->label - 1;
  memcpy(c->label, wait_label, wn);
  c->label[wn] = '\0';
  px_status st = c->ops->allgather(c, &mine, all, sizeof mine, PX_U8);
  memcpy(c->label, saved, sizeof saved);
  if (st != PX_OK) {
    free(all);
    return st;
  }
  // Every rank has every record and judges them the same way, so all of
  // them return the same verdict and none runs the collective.
  int first = -1, n_diff = 0;
  char ranks[96] = "";
  size_t rn = 0;
  for (int r = 1; r < c->size; r++) {
    all[r].label[sizeof all[r].label - 1] = '\0';
    all[r].site[sizeof all[r].site - 1] = '\0';
    if (same(&all[0], &all[r])) continue;
    if (first < 0) first = r;
    n_diff++;
    if (rn < sizeof ranks) rn += (size_t)snprintf(ranks + rn, sizeof ranks - rn, "%s%d", n_diff > 1 ? ", " : "", r);
  }
  if (first < 0) {
    free(all);
    return PX_OK;
  }
  all[0].label[sizeof all[0].label - 1] = '\0';
  all[0].site[sizeof all[0].site - 1] = '\0';
  const bool seqs_differ = all[0].seq != all[first].seq;
  char a[320], b[320], diff[96];
  describe(a, sizeof a, &all[0], seqs_differ);
  describe(b, sizeof b, &all[first], seqs_differ);
  differences(diff, sizeof diff, &all[0], &all[first]);
  st = px_error(PX_ERR_COMM,
                "collective #%llu differs between ranks (%s): rank 0 %s; rank %d %s; %d of %d rank(s) differ "
                "from rank 0 (%s) [PX_DEBUG_COLLECTIVES: no rank ran it]",
                (unsigned long long)all[0].seq, diff, a, first, b, n_diff, c->size, ranks);
  free(all);
  return st;
}
