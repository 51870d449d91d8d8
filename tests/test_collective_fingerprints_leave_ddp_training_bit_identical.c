/* Claim: the collective-fingerprint debug mode changes no result and
 * reports no divergence where there is none.  Under the threads backend
 * with 2 and 4 ranks, DDP training (a CNN with Adam in 1 MiB buckets, whose
 * gradients are summed by asynchronous all-reduces during backward) ends
 * with bit-identical parameters with the mode on and off, and the mode on
 * did check every collective (the world communicator's count of checked
 * calls is at least one per step; 0 with it off).  And every claim of
 * test_ddp_equals_single_process (equivalence for three bucket sizes,
 * accumulation, join, the refusal of mismatched models) holds with
 * PX_DEBUG_COLLECTIVES=1.
 * If it failed, the mode would raise false alarms on correct training, or
 * the exchange would disturb the collectives it guards. */
#define _POSIX_C_SOURCE 200809L
#include "ddp_cases.h"

#include "comm/internal.h"  // px_comm's debug_seq: how many collectives were checked

typedef struct run_out {
  bool on;
  float *params[4];
  size_t n;
  uint64_t checked[4];
} run_out;

static int train_rank(px_comm *c, void *arg) {
  run_out *o = arg;
  const int rank = px_comm_rank(c);
  px_comm_set_debug_collectives(c, o->on);
  px_model *md;
  CHECK_OK(px_model_create(&md, make_model(MODEL_CNN), 100 + (uint64_t)rank));
  px_ddp_opts opts = PX_DDP_DEFAULTS;
  opts.bucket_bytes = opts.first_bucket_bytes = 1u << 10;  // several buckets: several all-reduces in flight
  px_ddp *d;
  CHECK_OK(px_ddp_wrap(&d, md, c, &opts));
  px_optim *opt = make_opt(md, OPT_ADAM);
  for (int s = 0; s < STEPS; s++) {
    px_model_zero_grad(md);
    step_grads(md, MODEL_CNN, s, rank * B, B, 1.0f);
    CHECK_OK(px_ddp_sync(d));
    CHECK_OK(px_optim_step(opt));
  }
  const size_t n = md->n_param_elems;
  if (rank == 0) o->n = n;  // one writer: the ranks are threads
  o->params[rank] = malloc(n * sizeof(float));
  memcpy(o->params[rank], md->param_data, n * sizeof(float));
  o->checked[rank] = c->debug_seq;
  px_optim_free(opt);
  px_ddp_free(d);
  px_model_free(md);
  return 0;
}

int main(void) {
  for (int n = 2; n <= 4; n *= 2) {
    run_out off = {.on = false}, on = {.on = true};
    int code = -1;
    CHECK_OK(px_comm_run(n, train_rank, &off, &code));
    CHECK(code == 0, "%d ranks, mode off: exit %d", n, code);
    CHECK_OK(px_comm_run(n, train_rank, &on, &code));
    CHECK(code == 0, "%d ranks, mode on: exit %d (%s)", n, code, px_last_error());
    for (int r = 0; r < n; r++) {
      CHECK(on.n == off.n && off.params[r] && on.params[r] &&
              memcmp(off.params[r], on.params[r], off.n * sizeof(float)) == 0,
            "%d ranks, rank %d: parameters differ with the mode on", n, r);
      CHECK(off.checked[r] == 0, "%d ranks, rank %d: %llu collectives checked with the mode off", n, r,
            (unsigned long long)off.checked[r]);
      CHECK(on.checked[r] >= STEPS, "%d ranks, rank %d: only %llu collectives checked in %d steps", n, r,
            (unsigned long long)on.checked[r], STEPS);
      free(off.params[r]);
      free(on.params[r]);
    }
    printf("%d ranks: bit-identical parameters, %llu collectives checked on rank 0\n", n,
           (unsigned long long)on.checked[0]);
  }
  setenv("PX_DEBUG_COLLECTIVES", "1", 1);
  for (int n = 2; n <= 4; n *= 2) {
    int code = 0;
    CHECK_OK(px_comm_run(n, run_all, NULL, &code));
    CHECK(code == 0, "%d threads, PX_DEBUG_COLLECTIVES=1: a rank failed (%d)", n, code);
  }
  return px_test_finish("test_collective_fingerprints_leave_ddp_training_bit_identical");
}
