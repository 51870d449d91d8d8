/* bench_tp.c — memory per rank and throughput of the tensor-parallel GPT.
 *
 *   bench_tp [--ranks R] [--tp P] [--batch B] [--steps S] [--warmup W] [--sp 1]
 *            [--vocab V] [--context T] [--layers L] [--heads H] [--embd C]
 *
 * R ranks of the threads backend (1 BLAS/OpenMP thread each) as a mesh
 * dp = R/P × tp = P; --tp 1 with R > 1 is plain DDP.  The global batch is B
 * sequences of T tokens: each dp group takes B/dp of them.  Each timed step:
 * zero_grad, forward, (vocabulary-parallel) cross-entropy, backward, DDP
 * sync when dp > 1, clipping at 1.0, AdamW.  --sp 1: sequence parallelism.
 * Prints one line per run:
 *
 *   plexus tp ranks=2 dp=1 tp=2 sp=0 batch=8 tokens_per_s=... step_ms=... params_per_rank=...
 *          state_bytes_per_rank=... arena_bytes=... tp_comm_ms=... tp_comm_share=...
 *
 * tp_comm_ms: rank 0's time per step inside the tp collectives (px_tp_counts
 * .seconds: waiting for a slower rank included); tp_comm_share: that over
 * the step time.
 *
 * state_bytes_per_rank = parameters + gradients + AdamW's two moments, 4 bytes
 * each, of this rank's boxes; arena_bytes = the activation arena's high-water
 * mark on rank 0.  Defaults: vocabulary 8192, context 128, 4 layers, 8 heads,
 * width 256.  A benchmark, not a test: it never fails on speed. */
#include <plexus/plexus.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct args {
  int ranks, tp, batch, steps, warmup, sp;
  px_tp_gpt_config cfg;
} args;

typedef struct result {
  double seconds, tp_seconds;
  size_t params, arena;
} result;

static result results[64];

static int run(px_comm *c, void *arg) {
  const args *a = arg;
  px_set_num_threads(1);
  px_mesh *mesh;
  if (px_mesh_create(&mesh, c, 0, a->tp, 1) != PX_OK) {
    fprintf(stderr, "bench_tp: %s\n", px_last_error());
    return 1;
  }
  const int per = a->batch / mesh->dp, T = a->cfg.context, V = a->cfg.vocab_size;
  px_model *md;
  px_tp_gpt_config cfg = a->cfg;
  if (px_model_create(&md, px_tp_gpt(&mesh->tp_group, &cfg), 1) != PX_OK) {
    fprintf(stderr, "bench_tp: %s\n", px_last_error());
    px_mesh_free(mesh);
    return 1;
  }
  px_ddp *ddp = NULL;
  px_optim *o = NULL;
  px_optim_opts oo = px_adamw_defaults(3e-4f);
  px_status st = mesh->dp > 1 ? px_ddp_wrap(&ddp, md, mesh->dp_comm, NULL) : PX_OK;
  if (st == PX_OK) st = px_optim_create(&o, md->param_data, md->grad_data, md->n_param_elems, &oo);
  int32_t *x = malloc((size_t)per * (T + 1) * sizeof *x), *y = malloc((size_t)per * T * sizeof *y);
  px_rng r = px_rng_make(9, (uint64_t)mesh->dp_rank);
  double t0 = 0;
  for (int s = 0; st == PX_OK && s < a->warmup + a->steps; s++) {
    if (s == a->warmup) {
      px_comm_barrier(c);
      t0 = px_time_now();
      mesh->tp_group.counts = (px_tp_counts){0};
    }
    for (int i = 0; i < per * T; i++) {
      x[i] = (int32_t)px_rng_below(&r, (uint64_t)V);
      y[i] = (x[i] + 1) % V;
    }
    px_tensor xt = px_tensor_view(x, PX_I32, 2, (int64_t[]){per, T}), lt;
    px_model_zero_grad(md);
    if ((st = px_model_forward(md, &xt, &lt)) != PX_OK) break;
    px_tensor dl = lt;
    dl.data = px_model_scratch(md, (size_t)px_tensor_numel(&lt));
    float loss;
    if ((st = px_tp_cross_entropy(&mesh->tp_group, &lt, V, y, -100, &loss, px_f32(&dl))) != PX_OK) break;
    if ((st = px_model_backward(md, &dl, NULL)) != PX_OK) break;
    if (ddp && (st = px_ddp_sync(ddp)) != PX_OK) break;
    if ((st = px_tp_clip_grad_norm(&mesh->tp_group, md, 1.0f, NULL)) != PX_OK) break;
    st = px_optim_step(o);
  }
  if (st == PX_OK) px_comm_barrier(c);
  const int rank = px_comm_rank(c);
  if (rank < 64)
    results[rank] = (result){.seconds = px_time_now() - t0,
                             .tp_seconds = mesh->tp_group.counts.seconds,
                             .params = md->n_param_elems,
                             .arena = px_arena_high_water(md->arena)};
  if (st != PX_OK) fprintf(stderr, "bench_tp rank %d: %s\n", rank, px_last_error());
  free(x);
  free(y);
  px_optim_free(o);
  if (ddp) px_ddp_free(ddp);
  px_model_free(md);
  px_mesh_free(mesh);
  return st == PX_OK ? 0 : 1;
}

static int int_arg(int argc, char **argv, const char *name, int def) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0) return atoi(argv[i + 1]);
  return def;
}

int main(int argc, char **argv) {
  args a = {.ranks = int_arg(argc, argv, "--ranks", 2),
            .tp = int_arg(argc, argv, "--tp", 2),
            .batch = int_arg(argc, argv, "--batch", 8),
            .steps = int_arg(argc, argv, "--steps", 10),
            .warmup = int_arg(argc, argv, "--warmup", 2),
            .sp = int_arg(argc, argv, "--sp", 0)};
  a.cfg = (px_tp_gpt_config){.vocab_size = int_arg(argc, argv, "--vocab", 8192),
                             .context = int_arg(argc, argv, "--context", 128),
                             .n_layer = int_arg(argc, argv, "--layers", 4),
                             .n_head = int_arg(argc, argv, "--heads", 8),
                             .n_embd = int_arg(argc, argv, "--embd", 256),
                             .dropout = 0.0f,
                             .sequence_parallel = a.sp != 0};
  if (a.ranks < 1 || a.ranks > 64 || a.tp < 1 || a.ranks % a.tp || a.batch % (a.ranks / a.tp) || a.steps < 1) {
    fprintf(stderr, "bench_tp: --ranks (1..64) must be a multiple of --tp, --batch a multiple of ranks/tp\n");
    return 2;
  }
  int code = 0;
  if (px_comm_run(a.ranks, run, &a, &code) != PX_OK || code != 0) {
    fprintf(stderr, "bench_tp: failed: %s\n", px_last_error());
    return 1;
  }
  const double sec = results[0].seconds / a.steps;
  const double comm = results[0].tp_seconds / a.steps;
  printf("plexus tp ranks=%d dp=%d tp=%d sp=%d batch=%d tokens_per_s=%.0f step_ms=%.1f params_per_rank=%zu "
         "state_bytes_per_rank=%zu arena_bytes=%zu tp_comm_ms=%.1f tp_comm_share=%.3f\n",
         a.ranks, a.ranks / a.tp, a.tp, a.sp != 0, a.batch, (double)a.batch * a.cfg.context / sec, sec * 1e3,
         results[0].params, results[0].params * 16, results[0].arena, comm * 1e3, comm / sec);
  return 0;
}
