// Save on rank 0, report to all: the course's save0.
#include "plexus/io.h"

#include <stdio.h>
#include <string.h>

px_status px_safetensors_save0(px_comm *comm, const char *path, const px_state_dict *sd, const px_kv *metadata,
                               int n_metadata) {
  int32_t st = PX_OK;
  char msg[512] = "";
  if (px_comm_rank(comm) == 0) {
    st = (int32_t)px_safetensors_save(path, sd, metadata, n_metadata);
    if (st != PX_OK) snprintf(msg, sizeof msg, "%s", px_last_error());
  }
  // Every rank learns rank 0's status, so none trains on believing a
  // checkpoint exists when it does not.
  px_status cst = px_comm_broadcast(comm, &st, 1, PX_I32, 0);
  if (cst != PX_OK) return cst;
  if (st == PX_OK) return PX_OK;
  if (px_comm_rank(comm) == 0) return px_error((px_status)st, "%s", msg);
  return px_error((px_status)st, "rank 0 could not save %s", path);
}
