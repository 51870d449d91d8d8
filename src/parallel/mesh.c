// The device mesh: the world's ranks as a dp × tp × pp grid, tensor-parallel
// ranks innermost, pipeline outermost (DESIGN decision 10):
//
//   rank = (pp_rank · dp + dp_rank) · tp + tp_rank
//
// so the P ranks of one tensor-parallel group are neighbours (one node under
// a launcher that fills nodes in rank order), where their two all-reduces
// per block are cheapest.  Each dimension's communicator comes from one
// px_comm_split, the color naming the other two coordinates:
//   tp group: color = pp_rank · dp + dp_rank   key = tp_rank
//   dp group: color = pp_rank · tp + tp_rank   key = dp_rank
//   pp group: color = dp_rank · tp + tp_rank   key = pp_rank
#include "plexus/tensor_parallel.h"

#include <stdio.h>
#include <stdlib.h>

px_tp_group px_tp_group_of(px_comm *comm) {
  return (px_tp_group){.comm = comm, .rank = px_comm_rank(comm), .size = px_comm_size(comm)};
}

px_status px_mesh_create(px_mesh **out, px_comm *world, int dp, int tp, int pp) {
  if (!out) return px_error(PX_ERR_INVALID, "mesh: no output pointer");
  *out = NULL;
  const int n = px_comm_size(world);
  if (tp <= 0 || pp <= 0)
    return px_error(PX_ERR_INVALID, "mesh: tp = %d and pp = %d must be positive (world size %d)", tp, pp, n);
  if (dp <= 0) {
    if (n % (tp * pp) != 0)
      return px_error(PX_ERR_INVALID, "mesh: cannot infer dp: tp %d × pp %d = %d does not divide the world size %d", tp,
                      pp, tp * pp, n);
    dp = n / (tp * pp);
  }
  if ((int64_t)dp * tp * pp != n)
    return px_error(PX_ERR_INVALID,
                    "mesh: dp %d × tp %d × pp %d = %lld ranks, but the world has %d; the sizes' "
                    "product must equal the world size",
                    dp, tp, pp, (long long)dp * tp * pp, n);
  px_mesh *m = calloc(1, sizeof *m);
  if (!m) return px_error(PX_ERR_NOMEM, "mesh: out of memory");
  m->world = n;
  m->rank = px_comm_rank(world);
  m->dp = dp;
  m->tp = tp;
  m->pp = pp;
  m->tp_rank = m->rank % tp;
  m->dp_rank = (m->rank / tp) % dp;
  m->pp_rank = m->rank / (tp * dp);
  m->world_comm = world;
  px_status st = px_comm_split(world, m->pp_rank * dp + m->dp_rank, m->tp_rank, &m->tp_comm);
  if (st == PX_OK) st = px_comm_split(world, m->pp_rank * tp + m->tp_rank, m->dp_rank, &m->dp_comm);
  if (st == PX_OK) st = px_comm_split(world, m->dp_rank * tp + m->tp_rank, m->pp_rank, &m->pp_comm);
  if (st != PX_OK) {
    px_error_wrap(st, "mesh dp %d × tp %d × pp %d: splitting the world", dp, tp, pp);
    px_mesh_free(m);
    return st;
  }
  m->tp_group = px_tp_group_of(m->tp_comm);
  *out = m;
  return PX_OK;
}

void px_mesh_free(px_mesh *m) {
  if (!m) return;
  px_comm_free(m->tp_comm);
  px_comm_free(m->dp_comm);
  px_comm_free(m->pp_comm);
  free(m);
}

const char *px_mesh_describe(const px_mesh *m, char *buf, size_t len) {
  snprintf(buf, len, "mesh dp %d × tp %d × pp %d (world %d); rank %d = (dp %d, tp %d, pp %d)", m->dp, m->tp, m->pp,
           m->world, m->rank, m->dp_rank, m->tp_rank, m->pp_rank);
  return buf;
}
