// One copy of the model's buffers under DDP and ZeRO (parallel/internal.h):
// PyTorch DDP's broadcast_buffers.  Buffers (batch norm's running
// statistics) change only in a training forward, each rank with its own
// batch; the root's are broadcast before the next forward, so training
// continues from the root's statistics and an evaluation, and the
// checkpoint rank 0 saves after it, see the same numbers on every rank.
//
// The broadcast is blocking: the buffers of the zoo's models are a few
// hundred to a few thousand floats (ResNet-18: 9,600), well under the
// latency of the first bucket, so there is little to overlap.
#include "parallel/internal.h"

#include <stdio.h>

px_status px_parallel_sync_buffers(px_model *md, px_comm *comm, int root, bool *dirty, bool training) {
  px_status st = PX_OK;
  if (md->n_buffer_elems == 0) return PX_OK;
  if (*dirty) {
    char label[96];
    snprintf(label, sizeof label, "buffers: broadcast of rank %d's running statistics (step %llu)", root,
             (unsigned long long)md->ctx.step);
    px_comm_set_label(comm, label);
    st = px_comm_broadcast(comm, md->buffer_data, md->n_buffer_elems, PX_F32, root);
    *dirty = false;
  }
  if (training) *dirty = true;
  return st;
}
