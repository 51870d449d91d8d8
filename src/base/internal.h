// Internal helpers every layer of plexus may use (src/base/ depends on libc
// only): propagating errors, checking plexus's own invariants, making
// directories, writing files atomically.
#ifndef PX_BASE_INTERNAL_H
#define PX_BASE_INTERNAL_H

#include <stddef.h>

#include "plexus/base.h"

// Return the status of `call` from the enclosing function unless it is PX_OK
// (the message px_error left stays for px_last_error).
#define TRY(call)                 \
  do {                            \
    px_status st_ = (call);       \
    if (st_ != PX_OK) return st_; \
  } while (0)

// An invariant of plexus's own code (not of the caller's input, which gets
// PX_ERR_INVALID or PX_ERR_SHAPE naming what was wrong): when `cond` is
// false, return PX_ERR_INTERNAL from the enclosing function with the file,
// line and condition in the message.  ggml's assert, but a value: the
// caller's job (other ranks, its checkpoints) survives a bug here.
#define PX_CHECK(cond)                                                                                           \
  do {                                                                                                           \
    if (!(cond))                                                                                                 \
      return px_error(PX_ERR_INTERNAL, "%s:%d: internal check failed: %s (a bug in plexus)", __FILE__, __LINE__, \
                      #cond);                                                                                    \
  } while (0)

/* ---- atomic writes (atomic.c) -------------------------------------------- */

// One piece of a file to write; a file is the concatenation of its chunks,
// so a checkpoint streams header and tensors without first copying them into
// one buffer of the file's size.
typedef struct px_io_chunk {
  const void *data;
  size_t size;
} px_io_chunk;

// px_write_file_atomic for a file given as n chunks.
px_status px_io_write_chunks_atomic(const char *path, const px_io_chunk *chunks, int n);

// strerror(err) into buf, safely from any thread (ranks of the threads
// backend write their shards concurrently); returns buf.
const char *px_io_strerror(int err, char *buf, size_t len);

/* ---- processes on this node (node.c) -------------------------------------- */

// How many of the job's processes run on this node (1 until comm/ records
// more at start-up); the default of the thread setting divides the node's
// cores among them.
void px_node_set_processes(int n);
int px_node_processes(void);

#endif
