/* bench_pp.c — measured pipeline bubble and activation memory.
 *
 *   bench_pp [--ranks P] [--micro M] [--schedule gpipe|1f1b|interleaved]
 *            [--chunks V] [--rows R] [--width W] [--steps S] [--warmup K]
 *            [--sleep-ms F]
 *
 * P ranks of the threads backend (1 BLAS/OpenMP thread each) run a chain of
 * 8 Linear(W, W) + ReLU layers cut into P·V stages of equal cost, one
 * micro-batch = R rows, the batch M·R rows.  Each timed step runs the
 * schedule's table (px_pp_step: forwards, backwards, sends and receives,
 * SGD).  Per stage it reports the idle share 1 - compute/step (compute =
 * time in forward, backward and the loss; the rest is waiting for a peer,
 * the bubble), averaged over the timed steps, beside the formula
 * (p - 1)/(m + p - 1), or (p - 1)/(v·m + p - 1) interleaved; and rank 0's
 * activation memory: the high-water mark of its slots' arenas (one slot per
 * micro-batch in flight).  One line per run:
 *
 *   plexus pp schedule=1f1b p=4 m=8 v=1 formula=0.273 idle=0.281,0.279,0.280,0.282
 *             stage0_slots=4 stage0_act_bytes=... step_ms=...
 *
 * --sleep-ms F replaces the layers by ones that sleep F ms forward and 2F
 * backward per stage's share (8 of them, cut evenly): the bubble of the
 * schedule and the executor with exact, equal stage costs and no competition
 * for cores.
 *
 * A benchmark, not a test: it never fails on speed.  With more ranks than
 * cores the ranks share cores, and a rank's compute stretches while its
 * peers compute too: read p = 4 on a 2-core machine with that in mind. */
#include <plexus/plexus.h>

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { LAYERS = 8 };

typedef struct args {
  int ranks, micro, chunks, rows, width, steps, warmup;
  double sleep_ms;  // > 0: layers that sleep (forward sleep_ms, backward twice that) instead of computing
  px_pp_kind kind;
} args;

typedef struct shared {
  const args *a;
  double idle[64];
  size_t act_bytes;
  int slots;
  double step_ms;
} shared;

// A layer of fixed cost that needs no core: y = x after sleeping (the
// bubble of the schedule and the executor alone, whatever else the
// machine runs).
typedef struct sleeper {
  px_module base;
  double fwd_s;
} sleeper;

static void nap(double s) {
  struct timespec t = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&t, &t) != 0) {}
}

static px_status sleep_forward(px_module *m, px_ctx *ctx, const px_tensor *x, px_tensor *y) {
  px_status st = px_ctx_tensor_like(ctx, y, x);
  if (st != PX_OK) return st;
  memcpy(y->data, x->data, px_tensor_nbytes(x));
  nap(((sleeper *)m)->fwd_s);
  return PX_OK;
}

static px_status sleep_backward(px_module *m, px_ctx *ctx, const px_tensor *dy, px_tensor *dx) {
  nap(2 * ((sleeper *)m)->fwd_s);
  if (!dx) return PX_OK;
  px_status st = px_ctx_tensor_like(ctx, dx, dy);
  if (st == PX_OK) memcpy(dx->data, dy->data, px_tensor_nbytes(dy));
  return st;
}

static const px_module_ops sleep_ops = {.type = "Sleep", .forward = sleep_forward, .backward = sleep_backward};

static px_module *build(void *arg) {
  const args *a = arg;
  px_module *c = px_chain();
  if (a->sleep_ms > 0) {
    for (int i = 0; c && i < LAYERS; i++) {
      sleeper *z = (sleeper *)px_module_alloc(sizeof *z, &sleep_ops);
      if (!z) {
        px_module_free(c);
        return NULL;
      }
      z->fwd_s = a->sleep_ms * 1e-3;
      if (px_chain_add(c, &z->base) != PX_OK) {
        px_module_free(&z->base);
        px_module_free(c);
        return NULL;
      }
    }
    return c;
  }
  for (int i = 0; c && i < LAYERS; i++) {
    if (px_chain_add(c, px_linear(a->width, a->width, true)) != PX_OK || px_chain_add(c, px_relu()) != PX_OK) {
      px_module_free(c);
      return NULL;
    }
  }
  return c;
}

static px_status mse(void *user, const px_tensor *out, int micro, float *loss, float *dout) {
  (void)user;
  (void)micro;
  // Against zeros: cheap next to the stages, and the same for every micro-batch.
  const size_t n = (size_t)px_tensor_numel(out);
  const float *y = px_f32(out);
  double s = 0;
  for (size_t i = 0; i < n; i++) {
    s += (double)y[i] * y[i];
    dout[i] = 2.0f * y[i] / (float)n;
  }
  *loss = (float)(s / (double)n);
  return PX_OK;
}

static int rank_main(px_comm *c, void *varg) {
  shared *sh = varg;
  const args *a = sh->a;
  px_comm_set_timeout(c, 300);
  px_set_num_threads(1);
  const int p = px_comm_size(c), r = px_comm_rank(c);
  px_pp_schedule *s;
  px_status st = px_pp_schedule_make(a->kind, p, a->micro, a->chunks, &s);
  if (st != PX_OK) {
    fprintf(stderr, "bench_pp: %s\n", px_last_error());
    return 1;
  }
  px_optim_opts oo = px_sgd_defaults(1e-4f);
  const px_pp_split split = {.kind = a->sleep_ms > 0 ? PX_PP_SPLIT_UNITS : PX_PP_SPLIT_PARAMS};
  px_pp_opts po = {.build = build, .build_arg = (void *)a, .split = &split, .seed = 1, .optim = &oo};
  px_pp *pp;
  if ((st = px_pp_create(&pp, c, s, &po)) != PX_OK) {
    fprintf(stderr, "bench_pp: %s\n", px_last_error());
    return 1;
  }
  const int64_t rows = (int64_t)a->micro * a->rows;
  float *x = malloc((size_t)rows * (size_t)a->width * sizeof *x);
  px_rng rng = px_rng_make(3, 0);
  for (int64_t i = 0; i < rows * a->width; i++) x[i] = px_rng_normal(&rng);
  px_tensor xt = px_tensor_view(x, PX_F32, 2, (int64_t[]){rows, a->width});
  double idle = 0, ms = 0;
  for (int i = 0; i < a->warmup + a->steps && st == PX_OK; i++) {
    float l;
    st = px_pp_step(pp, &xt, mse, NULL, &l);
    px_pp_stats ps;
    px_pp_stats_get(pp, &ps);
    if (i >= a->warmup) {
      idle += 1.0 - ps.compute_s / ps.step_s;
      ms += 1e3 * ps.step_s;
    }
  }
  if (st != PX_OK) fprintf(stderr, "bench_pp: rank %d: %s\n", r, px_last_error());
  sh->idle[r] = idle / a->steps;
  if (r == 0) {
    px_pp_stats ps;
    px_pp_stats_get(pp, &ps);
    sh->act_bytes = ps.arena_high;
    sh->slots = ps.slots;
    sh->step_ms = ms / a->steps;
  }
  free(x);
  px_pp_free(pp);
  px_pp_schedule_free(s);
  return st == PX_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  args a = {.ranks = 2, .micro = 8, .chunks = 1, .rows = 64, .width = 256, .steps = 5, .warmup = 2, .kind = PX_PP_1F1B};
  for (int i = 1; i < argc; i++) {
    const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "bench_pp: %s needs a value\n", k);
      return 2;
    }
    if (strcmp(k, "--ranks") == 0) a.ranks = atoi(v);
    else if (strcmp(k, "--micro") == 0) a.micro = atoi(v);
    else if (strcmp(k, "--chunks") == 0) a.chunks = atoi(v);
    else if (strcmp(k, "--rows") == 0) a.rows = atoi(v);
    else if (strcmp(k, "--width") == 0) a.width = atoi(v);
    else if (strcmp(k, "--steps") == 0) a.steps = atoi(v);
    else if (strcmp(k, "--warmup") == 0) a.warmup = atoi(v);
    else if (strcmp(k, "--sleep-ms") == 0) a.sleep_ms = atof(v);
    else if (strcmp(k, "--schedule") == 0) {
      if (px_pp_kind_parse(v, &a.kind) != PX_OK) {
        fprintf(stderr, "bench_pp: %s\n", px_last_error());
        return 2;
      }
    } else {
      fprintf(stderr, "bench_pp: unknown option %s\n", k);
      return 2;
    }
    i++;
  }
  if (a.ranks < 1 || a.ranks > 64 || a.steps < 1 || a.ranks * a.chunks > LAYERS) {
    fprintf(stderr, "bench_pp: 1 <= ranks <= 64, steps >= 1, ranks·chunks <= %d\n", LAYERS);
    return 2;
  }
  shared sh = {.a = &a};
  int code = 0;
  if (px_comm_run(a.ranks, rank_main, &sh, &code) != PX_OK || code != 0) {
    fprintf(stderr, "bench_pp: failed (%d)\n", code);
    return 1;
  }
  printf("plexus pp schedule=%s p=%d m=%d v=%d formula=%.3f idle=", px_pp_kind_name(a.kind), a.ranks, a.micro, a.chunks,
         px_pp_bubble_formula(a.kind, a.ranks, a.micro, a.chunks));
  for (int r = 0; r < a.ranks; r++) printf("%s%.3f", r ? "," : "", sh.idle[r]);
  printf(" stage0_slots=%d stage0_act_bytes=%zu step_ms=%.1f\n", sh.slots, sh.act_bytes, sh.step_ms);
  return 0;
}
