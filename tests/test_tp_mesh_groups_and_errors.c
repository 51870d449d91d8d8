/* Claim: px_mesh lays the world out as dp × tp × pp with tensor-parallel
 * ranks innermost (rank = (pp·dp + dp)·tp + tp), gives each rank its
 * coordinates and one communicator per dimension holding exactly the ranks
 * that share the other two coordinates (checked by summing world ranks over
 * each group), infers dp when asked, and refuses sizes whose product is not
 * the world size with one message naming the sizes and the world size.
 * If this fails, tensor-parallel groups are not neighbours, or a group mixes
 * ranks of another replica (its all-reduces would sum foreign activations). */
#include "px_test.h"

#include <string.h>

typedef struct shape3 {
  int dp, tp, pp;
} shape3;

static void check_mesh(px_comm *c, shape3 s) {
  const int world = px_comm_size(c), rank = px_comm_rank(c);
  px_mesh *m;
  CHECK_OK(px_mesh_create(&m, c, s.dp, s.tp, s.pp));
  const int dp = m->dp, tp = s.tp, pp = s.pp;
  CHECK(dp * tp * pp == world, "inferred dp %d × tp %d × pp %d != world %d", dp, tp, pp, world);
  CHECK(m->rank == (m->pp_rank * dp + m->dp_rank) * tp + m->tp_rank, "rank %d is not at (dp %d, tp %d, pp %d)", rank,
        m->dp_rank, m->tp_rank, m->pp_rank);
  CHECK(px_comm_size(m->tp_comm) == tp && px_comm_size(m->dp_comm) == dp && px_comm_size(m->pp_comm) == pp,
        "group sizes tp %d dp %d pp %d", px_comm_size(m->tp_comm), px_comm_size(m->dp_comm), px_comm_size(m->pp_comm));
  CHECK(px_comm_rank(m->tp_comm) == m->tp_rank && px_comm_rank(m->dp_comm) == m->dp_rank &&
          px_comm_rank(m->pp_comm) == m->pp_rank,
        "rank %d: ranks inside the groups are not its coordinates", rank);
  CHECK(m->tp_group.comm == m->tp_comm && m->tp_group.size == tp && m->tp_group.rank == m->tp_rank,
        "the tp group does not mirror tp_comm");
  // Σ world ranks over each group = the ranks that share the other coordinates.
  int64_t sums[3] = {rank, rank, rank}, want[3] = {0, 0, 0};
  for (int t = 0; t < tp; t++) want[0] += (m->pp_rank * dp + m->dp_rank) * tp + t;
  for (int d = 0; d < dp; d++) want[1] += (m->pp_rank * dp + d) * tp + m->tp_rank;
  for (int p = 0; p < pp; p++) want[2] += (p * dp + m->dp_rank) * tp + m->tp_rank;
  CHECK_OK(px_comm_allreduce(m->tp_comm, &sums[0], 1, PX_I64, PX_SUM));
  CHECK_OK(px_comm_allreduce(m->dp_comm, &sums[1], 1, PX_I64, PX_SUM));
  CHECK_OK(px_comm_allreduce(m->pp_comm, &sums[2], 1, PX_I64, PX_SUM));
  CHECK(sums[0] == want[0] && sums[1] == want[1] && sums[2] == want[2],
        "rank %d (dp %d tp %d pp %d): group rank sums tp %lld dp %lld pp %lld, want %lld %lld %lld", rank, s.dp, tp, pp,
        (long long)sums[0], (long long)sums[1], (long long)sums[2], (long long)want[0], (long long)want[1],
        (long long)want[2]);
  if (rank == world - 1) {
    char buf[160];
    printf("  %s\n", px_mesh_describe(m, buf, sizeof buf));
  }
  px_mesh_free(m);
}

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 60);
  const int world = px_comm_size(c);
  const shape3 ok4[] = {{2, 2, 1}, {1, 4, 1}, {4, 1, 1}, {1, 2, 2}, {0, 2, 1}, {0, 1, 2}};
  const shape3 ok8[] = {{2, 2, 2}, {0, 4, 1}, {1, 2, 4}, {4, 2, 1}};
  if (world == 4)
    for (size_t i = 0; i < sizeof ok4 / sizeof *ok4; i++) check_mesh(c, ok4[i]);
  else
    for (size_t i = 0; i < sizeof ok8 / sizeof *ok8; i++) check_mesh(c, ok8[i]);
  // Bad sizes: the same clear error on every rank, nothing split (no hang).
  px_mesh *m = (px_mesh *)1;
  px_status st = px_mesh_create(&m, c, 3, 2, 1);
  char want[160];
  snprintf(want, sizeof want, "dp 3 × tp 2 × pp 1 = 6 ranks, but the world has %d", world);
  CHECK(st == PX_ERR_INVALID && m == NULL && strstr(px_last_error(), want), "a mesh of 6 on %d ranks: %s \"%s\"", world,
        px_status_name(st), px_last_error());
  if (px_comm_rank(c) == 0) printf("  refused: %s\n", px_last_error());
  st = px_mesh_create(&m, c, 0, 3, 1);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "tp 3 × pp 1 = 3 does not divide the world size"),
        "inferring dp with tp 3: %s \"%s\"", px_status_name(st), px_last_error());
  st = px_mesh_create(&m, c, 1, 0, 1);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "must be positive"), "tp 0: \"%s\"", px_last_error());
  return px_test_failures ? 1 : 0;
}

int main(void) {
  for (int n = 4; n <= 8; n *= 2) {
    int code = 0;
    CHECK_OK(px_comm_run(n, run_all, NULL, &code));
    CHECK(code == 0, "%d threads: a rank failed (%d)", n, code);
  }
  return px_test_finish("test_tp_mesh_groups_and_errors");
}
