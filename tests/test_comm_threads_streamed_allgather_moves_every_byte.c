/* Claim: on 2, 3 and 4 threads, an all-gather large enough to be pushed in
 * claimed pieces with non-temporal stores (threads_coll.c, an output of
 * more than 16 MiB, STREAM_BYTES; an odd block so that pieces end mid cache line) puts
 * every rank's block, byte for byte, into every rank's recv, out of place
 * and in place, and writes nothing past the end of any recv; a smaller one
 * in claimed pieces without streaming does the same.  If it failed, ZeRO's
 * parameter all-gather would hand ranks parameters with holes or stale
 * pieces, or overwrite the caller's memory after the output. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 256

static unsigned char byte_of(int q, size_t i) {
  uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)(q + 1) * 0x9e3779b9u;
  x ^= x >> 13;
  x *= 0x5bd1e995u;
  return (unsigned char)(x >> 17);
}

static void check_allgather(px_comm *c, size_t count, bool in_place) {
  const int n = px_comm_size(c), r = px_comm_rank(c);
  size_t total = (size_t)n * count;
  unsigned char *send = malloc(count), *recv = malloc(total + GUARD);
  CHECK(send && recv, "out of memory");
  if (!send || !recv) return;
  memset(recv, 0xA5, total + GUARD);
  unsigned char *mine = in_place ? recv + (size_t)r * count : send;
  for (size_t i = 0; i < count; i++) mine[i] = byte_of(r, i);
  CHECK_OK(px_comm_allgather(c, mine, recv, count, PX_U8));
  size_t bad = 0, first = 0;
  for (int q = 0; q < n; q++)
    for (size_t i = 0; i < count; i++)
      if (recv[(size_t)q * count + i] != byte_of(q, i) && bad++ == 0) first = (size_t)q * count + i;
  CHECK(bad == 0, "%s allgather of %zu bytes a rank: rank %d has %zu wrong bytes, the first at %zu",
        in_place ? "in-place" : "out-of-place", count, r, bad, first);
  size_t over = 0;
  for (size_t i = total; i < total + GUARD; i++) over += recv[i] != 0xA5;
  CHECK(over == 0, "allgather of %zu bytes a rank wrote %zu bytes past rank %d's recv", count, over, r);
  CHECK_OK(px_comm_barrier(c));  // no rank frees a buffer a peer may still write
  free(send);
  free(recv);
}

static int rank_main(px_comm *c, void *arg) {
  (void)arg;
  // Past 16 MiB of output (STREAM_BYTES): streamed pieces.  Then claimed
  // pieces in the cache, below it (4 MiB and more at 2-4 ranks: streamed
  // until 2026-11-28, when the threshold was 4 MiB).
  const size_t counts[] = {8388625, 2097169, 65599};
  for (int k = 0; k < 3; k++) {
    check_allgather(c, counts[k], false);
    check_allgather(c, counts[k], true);
  }
  return 0;
}

int main(void) {
  for (int n = 2; n <= 4; n++) {
    int code = -1;
    CHECK_OK(px_comm_run(n, rank_main, NULL, &code));
    CHECK(code == 0, "px_comm_run(%d) exit code %d", n, code);
  }
  return px_test_finish("test_comm_threads_streamed_allgather_moves_every_byte");
}
