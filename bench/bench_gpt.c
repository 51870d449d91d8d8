/* bench_gpt.c — GPT training throughput of plexus, to compare with PyTorch.
 *
 *   bench_gpt [--threads T] [--ranks R] [--batch B] [--seconds S] [--warmup W]
 *             [--vocab V] [--context T] [--layers L] [--heads H] [--embd C]
 *             [--zero S] [--no-prefetch] [--no-reshard] [--memory STEPS] [--overlap on|off|none]
 *             [--bucket-mb MB]
 *   bench_gpt --peak --threads T     cblas_sgemm GFLOP/s on large square matrices
 *   bench_gpt --info                 the BLAS in use, for the record
 *
 * prints one line that bench/run_gpt.sh parses:
 *
 *   plexus gpt batch=8 threads=1 ranks=1 tokens_per_s=... gflops=... best_tokens_per_s=... steps=...
 *          seconds=... cpu_s=... loss=... params=... flops_per_token=...
 *
 * The model is the zoo's GPT (px_zoo_gpt), by default vocabulary 8192,
 * context 128, 4 layers, 4 heads, width 256, dropout 0, trained on batches
 * of B sequences of `context` random tokens with next-token targets.  Each
 * timed iteration is a full training step: zero_grad, forward, cross-entropy
 * over the vocabulary, backward, AdamW (lr 3e-4, weight decay 0.1).
 * bench/bench_gpt_torch.py does the same step with PyTorch.
 *
 * --ranks R > 1: data parallel on R ranks of the threads backend (DDP),
 * each with T threads and its own batch of B sequences; tokens/s counts all
 * ranks.  --overlap (DDP): on, the buckets all-reduced during backward (the
 * default); off, one all-reduce of the whole gradient after backward (the
 * same bytes, nothing hidden); none, a benchmark setting only: no DDP and no
 * all-reduce, the same computation (bench/run_rig.sh).  Rank 0 times two first steps, picks the number of warm-up and of
 * timed steps and tells the others, so all ranks run the same steps.
 *
 * gflops = tokens/s × flops_per_token, flops_per_token = 6·N + 6·L·C·T
 * (N = parameters; 6·L·C·T is the causal attention's score and weighted-sum
 * products, forward and backward, half of nanoGPT's 12·L·C·T since masked
 * scores are never computed).
 *
 * --zero S (1, 2, 3): sharded data parallel (px_zero_wrap) instead of DDP;
 * the optimizer steps this rank's shard, px_zero_after_step follows; the
 * line then says zero=S (prefetch and reshard too for stage 3).  Under
 * mpirun/srun the ranks are the launcher's processes (--ranks is ignored).
 *
 * Stage 3's units are the transformer blocks h.0 ... h.{L-1} (as FSDP
 * wraps each block); wte, wpe and ln_f form the root unit.
 *
 * --memory STEPS: no timing; STEPS training steps, then one line per run
 * with the library's memory account per rank (the maximum over ranks) and
 * the process's peak resident memory (VmHWM) minus its value before the
 * model was built (the baseline: the program, MPI, BLAS), twice:
 * vmhwm_setup_delta is the peak up to the end of setup (plexus builds
 * every model whole, then a ZeRO wrap shards it and frees what the stage
 * does not keep: that peak is the whole model's), vmhwm_train_delta the
 * peak during the STEPS steps, the high-water mark having been reset after
 * setup (echo 5 > /proc/self/clear_refs).  Meaningful per rank under
 * mpirun (threads ranks share one process):
 *
 *   plexus memory zero=S ranks=N params=Ψ acct_params=.. acct_grads=.. acct_optim=.. acct_gathered=..
 *          acct_arena=.. acct_total=.. vmhwm_setup_delta=.. vmhwm_train_delta=.. vmhwm_baseline=..
 *
 * best_tokens_per_s is the same from the fastest single step: on a shared
 * machine the figure least disturbed by other work, for comparing variants.
 * cpu_s is the CPU time all threads of the process spent in the timed steps:
 * near threads × ranks × seconds when the run had its cores to itself.
 * This is a benchmark, not a test: it never fails on speed. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime(CLOCK_PROCESS_CPUTIME_ID) */
#include <plexus/plexus.h>

#include <plexus/zoo.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_BATCHES 4

typedef struct bench_opts {
  px_gpt_config cfg;
  int batch, threads, ranks;
  double seconds, warmup;
  bool peak;
  int zero;               /* 0: DDP; 1-3: ZeRO stage */
  bool prefetch, reshard; /* stage 3 */
  int memory_steps;       /* > 0: the memory report instead of timing */
  int overlap;            /* DDP: 1 buckets during backward, 0 one all-reduce after it, -1 none */
  double bucket_mb;       /* DDP bucket capacity in MiB; 0: the library's default */
} bench_opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_gpt [--threads T] [--ranks R] [--batch B] [--seconds S] [--warmup W]\n"
          "                 [--vocab V] [--context T] [--layers L] [--heads H] [--embd C]\n"
          "                 [--zero S] [--no-prefetch] [--no-reshard] [--memory STEPS]\n"
          "                 [--overlap on|off|none] [--bucket-mb MB]\n"
          "       bench_gpt --peak --threads T\n"
          "       bench_gpt --info\n");
}

static int parse_args(int argc, char **argv, bench_opts *o) {
  *o = (bench_opts){.cfg = {.vocab_size = 8192, .context = 128, .n_layer = 4, .n_head = 4, .n_embd = 256},
                    .batch = 8,
                    .threads = 1,
                    .ranks = 1,
                    .seconds = 5.0,
                    .warmup = 1.0,
                    .prefetch = true,
                    .reshard = true,
                    .overlap = 1};
  struct {
    const char *flag;
    int *dst;
  } ints[] = {
    {"--threads", &o->threads},      {"--ranks", &o->ranks},         {"--batch", &o->batch},
    {"--vocab", &o->cfg.vocab_size}, {"--context", &o->cfg.context}, {"--layers", &o->cfg.n_layer},
    {"--heads", &o->cfg.n_head},     {"--embd", &o->cfg.n_embd},     {"--zero", &o->zero},
    {"--memory", &o->memory_steps},
  };
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      exit(0);
    }
    if (strcmp(a, "--info") == 0) {
      printf("plexus blas: %s\n", px_blas_info());
      exit(0);
    }
    if (strcmp(a, "--peak") == 0) {
      o->peak = true;
      continue;
    }
    if (strcmp(a, "--no-prefetch") == 0) {
      o->prefetch = false;
      continue;
    }
    if (strcmp(a, "--no-reshard") == 0) {
      o->reshard = false;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "bench_gpt: %s needs a value\n", a);
      return -1;
    }
    const char *v = argv[++i];
    bool known = false;
    for (size_t k = 0; k < sizeof ints / sizeof *ints; k++)
      if (strcmp(a, ints[k].flag) == 0) {
        *ints[k].dst = atoi(v);
        known = true;
      }
    if (known) continue;
    if (strcmp(a, "--seconds") == 0) o->seconds = atof(v);
    else if (strcmp(a, "--warmup") == 0) o->warmup = atof(v);
    else if (strcmp(a, "--bucket-mb") == 0 && atof(v) > 0) o->bucket_mb = atof(v);
    else if (strcmp(a, "--overlap") == 0 && (!strcmp(v, "on") || !strcmp(v, "off") || !strcmp(v, "none")))
      o->overlap = strcmp(v, "on") == 0 ? 1 : strcmp(v, "off") == 0 ? 0 : -1;
    else {
      fprintf(stderr, "bench_gpt: unknown option %s\n", a);
      usage(stderr);
      return -1;
    }
  }
  if (o->batch < 1 || o->threads < 1 || o->ranks < 1 || o->seconds <= 0 || o->warmup < 0) {
    fprintf(stderr, "bench_gpt: --batch, --threads and --ranks must be >= 1, --seconds > 0, --warmup >= 0\n");
    return -1;
  }
  if (o->zero < 0 || o->zero > 3 || o->memory_steps < 0) {
    fprintf(stderr, "bench_gpt: --zero is 0 (DDP), 1, 2 or 3; --memory a number of steps\n");
    return -1;
  }
  return 0;
}

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- The sgemm peak ----------------------------------------------------- */

static int run_peak(const bench_opts *o) {
  px_set_num_threads(o->threads);
  const int n = 2048;
  float *a = malloc((size_t)n * n * sizeof *a), *b = malloc((size_t)n * n * sizeof *b),
        *c = malloc((size_t)n * n * sizeof *c);
  if (!a || !b || !c) {
    fprintf(stderr, "bench_gpt: out of memory\n");
    return 1;
  }
  px_rng r = px_rng_make(1, 1);
  for (size_t i = 0; i < (size_t)n * n; i++) {
    a[i] = px_rng_uniform(&r) - 0.5f;
    b[i] = px_rng_uniform(&r) - 0.5f;
  }
  // Best of the runs within the budget: the machine is shared.
  double best = 1e30, t_end = px_time_now() + o->seconds;
  int reps = 0;
  while (reps < 3 || px_time_now() < t_end) {
    double t0 = px_time_now();
    px_sgemm(false, false, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    double t = px_time_now() - t0;
    if (t < best) best = t;
    reps++;
  }
  printf("plexus sgemm n=%d threads=%d gflops=%.1f reps=%d\n", n, px_get_num_threads(),
         2.0 * n * (double)n * n / best * 1e-9, reps);
  free(a);
  free(b);
  free(c);
  return 0;
}

/* ---- Training ------------------------------------------------------------ */

typedef struct rank_state {
  const bench_opts *o;
  px_model *model;
  px_optim *optim;
  px_ddp *ddp;
  px_comm *comm;
  px_zero *zero;
  int32_t *x, *y; /* (N_BATCHES, B, T) ids and targets */
  float last_loss;
} rank_state;

static px_status train_step(rank_state *s, int k) {
  const int B = s->o->batch, T = s->o->cfg.context;
  px_tensor x = px_tensor_view(s->x + (size_t)k * B * T, PX_I32, 2, (int64_t[]){B, T}), logits;
  if (s->zero) px_zero_zero_grad(s->zero);
  else px_model_zero_grad(s->model);
  px_status st = px_model_forward(s->model, &x, &logits);
  if (st != PX_OK) return st;
  px_tensor dlogits = logits;
  dlogits.data = px_model_scratch(s->model, (size_t)px_tensor_numel(&logits));
  if (!dlogits.data) return PX_ERR_NOMEM;
  st = px_cross_entropy_loss(&logits, s->y + (size_t)k * B * T, NULL, &s->last_loss, px_f32(&dlogits));
  if (st == PX_OK) st = px_model_backward(s->model, &dlogits, NULL);
  if (st == PX_OK && s->ddp && s->o->overlap == 1) st = px_ddp_sync(s->ddp);
  if (st == PX_OK && s->ddp && s->o->overlap == 0)  // no overlap: the whole gradient after backward
    st = px_comm_allreduce(s->comm, s->model->grad_data, s->model->n_param_elems, PX_F32, PX_AVG);
  if (st == PX_OK && s->zero) st = px_zero_sync(s->zero);
  if (st == PX_OK) st = px_optim_step(s->optim);
  if (st == PX_OK && s->zero) st = px_zero_after_step(s->zero);
  return st;
}

// Resets VmHWM to the current resident size (Linux >= 4.0); false if it
// cannot.
static bool reset_hwm(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  bool ok = fputs("5", f) >= 0;
  return fclose(f) == 0 && ok;
}

// The memory report (--memory): the library's account per rank and the
// growth of the peak resident memory since before the model was built.
static int report_memory(px_comm *comm, rank_state *s, size_t baseline, size_t setup_hwm) {
  px_zero_memory m = {0};
  if (s->zero) {
    px_zero_memory_of(s->zero, &m);
  } else {
    m.params = m.grads = s->model->n_param_elems * sizeof(float);
    m.arena_peak = px_arena_high_water(s->model->arena);
  }
  m.optim_state = (size_t)s->optim->n_state * s->optim->n * sizeof(float);
  const size_t hwm = px_train_peak_rss();
  // Max over ranks of each figure, and of VmHWM - baseline.
  int64_t v[8] = {(int64_t)m.params,      (int64_t)m.grads,
                  (int64_t)m.optim_state, (int64_t)m.gathered,
                  (int64_t)m.arena_peak,  (int64_t)(hwm - baseline),
                  (int64_t)baseline,      (int64_t)(setup_hwm - baseline)};
  int64_t mx[8];
  memcpy(mx, v, sizeof v);
  if (comm && px_comm_size(comm) > 1 && px_comm_allreduce(comm, mx, 8, PX_I64, PX_MAX) != PX_OK) {
    fprintf(stderr, "bench_gpt: %s\n", px_last_error());
    return 1;
  }
  if (!comm || px_comm_rank(comm) == 0) {
    const int N = comm ? px_comm_size(comm) : 1;
    printf("plexus memory zero=%d ranks=%d prefetch=%d params=%zu acct_params=%lld acct_grads=%lld acct_optim=%lld "
           "acct_gathered=%lld acct_arena=%lld acct_total=%lld vmhwm_setup_delta=%lld vmhwm_train_delta=%lld "
           "vmhwm_baseline=%lld\n",
           s->o->zero, N, (int)s->o->prefetch, s->model->n_param_elems, (long long)mx[0], (long long)mx[1],
           (long long)mx[2], (long long)mx[3], (long long)mx[4], (long long)(mx[0] + mx[1] + mx[2] + mx[3] + mx[4]),
           (long long)mx[7], (long long)mx[5], (long long)mx[6]);
    fflush(stdout);
  }
  return 0;
}

typedef struct shared {
  const bench_opts *o;
  double elapsed, best, cpu, loss; /* best: the fastest step (rank 0's) */
  long steps;
  size_t params;
  int world;
  bool root; /* this process ran rank 0 (under MPI every process reaches main's end) */
} shared;

static int bench_rank(px_comm *comm, void *arg) {
  shared *sh = arg;
  const bench_opts *o = sh->o;
  const int rank = comm ? px_comm_rank(comm) : 0;
  rank_state s = {.o = o, .comm = comm};
  const size_t baseline = px_train_peak_rss();  // before the model: program, MPI, BLAS
  px_status st = px_model_create(&s.model, px_zoo_gpt(&o->cfg), 42);
  if (st != PX_OK) {
    fprintf(stderr, "bench_gpt: model: %s\n", px_last_error());
    return 1;
  }
  // DDP's options: the library's defaults, or --bucket-mb's capacity.
  px_ddp_opts dopts = PX_DDP_DEFAULTS;
  if (o->bucket_mb > 0) dopts.bucket_bytes = (size_t)(o->bucket_mb * 1048576.0);
  if (o->zero == 0 && o->overlap >= 0 && comm && px_comm_size(comm) > 1 &&
      (st = px_ddp_wrap(&s.ddp, s.model, comm, &dopts)) != PX_OK) {
    fprintf(stderr, "bench_gpt: DDP: %s\n", px_last_error());
    return 1;
  }
  px_optim_opts oo = px_adamw_defaults(3e-4f);
  oo.weight_decay = 0.1f;
  if (o->zero > 0) {
    px_zero_opts zo = PX_ZERO_DEFAULTS;
    zo.stage = o->zero;
    zo.prefetch = o->prefetch;
    zo.reshard_after_forward = o->reshard;
    // Stage 3: one unit per transformer block.
    char names[64][16];
    const char *units[64];
    const int L = o->cfg.n_layer < 64 ? o->cfg.n_layer : 64;
    for (int l = 0; l < L; l++) {
      snprintf(names[l], sizeof names[l], "h.%d", l);
      units[l] = names[l];
    }
    if (o->zero == 3) {
      zo.units = units;
      zo.n_units = L;
    }
    if (px_zero_wrap(&s.zero, s.model, comm, &zo) != PX_OK) {
      fprintf(stderr, "bench_gpt: ZeRO: %s\n", px_last_error());
      return 1;
    }
  }
  if ((s.zero
         ? px_zero_optim_create(s.zero, &s.optim, &oo)
         : px_optim_create(&s.optim, s.model->param_data, s.model->grad_data, s.model->n_param_elems, &oo)) != PX_OK) {
    fprintf(stderr, "bench_gpt: optimizer: %s\n", px_last_error());
    return 1;
  }
  const size_t n = (size_t)N_BATCHES * o->batch * o->cfg.context;
  s.x = malloc(n * sizeof *s.x);
  s.y = malloc(n * sizeof *s.y);
  if (!s.x || !s.y) {
    fprintf(stderr, "bench_gpt: out of memory\n");
    return 1;
  }
  px_rng r = px_rng_make(7, (uint64_t)rank);
  for (size_t i = 0; i < n; i++) {
    s.x[i] = (int32_t)px_rng_below(&r, (uint64_t)o->cfg.vocab_size);
    s.y[i] = (int32_t)px_rng_below(&r, (uint64_t)o->cfg.vocab_size);
  }
  if (o->memory_steps > 0) {
    const size_t setup_hwm = px_train_peak_rss();
    if (!reset_hwm())
      fprintf(stderr, "bench_gpt: cannot reset VmHWM (/proc/self/clear_refs): train_delta is the run's\n");
    for (int k = 0; st == PX_OK && k < o->memory_steps; k++) st = train_step(&s, k % N_BATCHES);
    if (st != PX_OK) {
      fprintf(stderr, "bench_gpt: rank %d: training step: %s\n", rank, px_last_error());
      return 1;
    }
    int rc = report_memory(comm, &s, baseline, setup_hwm);
    free(s.x);
    free(s.y);
    px_optim_free(s.optim);
    if (s.zero) px_zero_free(s.zero);
    px_model_free(s.model);
    return rc;
  }
  // Warm-up (the arena reaches its size, caches and thread pools settle):
  // two steps, then rank 0 picks from their time how many more warm-up
  // steps and how many timed steps everyone runs (ranks must run the same
  // steps: each is a round of collectives).
  double t0 = px_time_now();
  for (int k = 0; st == PX_OK && k < 2; k++) st = train_step(&s, k);
  const double per_step = (px_time_now() - t0) / 2.0;
  int64_t plan[2] = {(int64_t)(o->warmup / per_step), (int64_t)(o->seconds / per_step) + 1};
  if (plan[1] < 3) plan[1] = 3;
  if (st == PX_OK && comm && px_comm_size(comm) > 1) st = px_comm_broadcast(comm, plan, 2, PX_I64, 0);
  for (int64_t k = 0; st == PX_OK && k < plan[0]; k++) st = train_step(&s, (int)(k % N_BATCHES));
  const int64_t steps = plan[1];
  double c0 = cpu_seconds(), best = 1e30;
  t0 = px_time_now();
  for (int64_t i = 0; st == PX_OK && i < steps; i++) {
    double ts = px_time_now();
    st = train_step(&s, (int)(i % N_BATCHES));
    ts = px_time_now() - ts;
    best = ts < best ? ts : best;
  }
  double elapsed = px_time_now() - t0, cpu = cpu_seconds() - c0;
  if (st != PX_OK) {
    fprintf(stderr, "bench_gpt: rank %d: training step: %s\n", rank, px_last_error());
    return 1;
  }
  if (rank == 0) {
    sh->elapsed = elapsed;
    sh->best = best;
    sh->cpu = cpu;
    sh->steps = (long)steps;
    sh->loss = s.last_loss;
    sh->params = s.model->n_param_elems;
    sh->world = comm ? px_comm_size(comm) : 1;
    sh->root = true;
  }
  free(s.x);
  free(s.y);
  px_optim_free(s.optim);
  px_ddp_free(s.ddp);
  if (s.zero && px_zero_free(s.zero) != PX_OK) {
    fprintf(stderr, "bench_gpt: rank %d: %s\n", rank, px_last_error());
    return 1;
  }
  px_model_free(s.model);
  return 0;
}

int main(int argc, char **argv) {
  bench_opts o;
  if (parse_args(argc, argv, &o) != 0) return 2;
  if (o.peak) return run_peak(&o);
  shared sh = {.o = &o, .world = 1};
  int code = 0;
  if (px_comm_mpi_launched()) {
    // One rank per process, as many as the launcher started.
    px_set_num_threads(o.threads);
    if (px_comm_run(1, bench_rank, &sh, &code) != PX_OK) {
      fprintf(stderr, "bench_gpt: %s\n", px_last_error());
      return 1;
    }
  } else if (o.ranks > 1 || o.zero > 0) {
    // The threads backend gives each rank 1/R of the threads set here.
    px_set_num_threads(o.threads * o.ranks);
    if (px_comm_run(o.ranks, bench_rank, &sh, &code) != PX_OK) {
      fprintf(stderr, "bench_gpt: %s\n", px_last_error());
      return 1;
    }
  } else {
    px_set_num_threads(o.threads);
    code = bench_rank(NULL, &sh);
  }
  if (code) return 1;
  if (o.memory_steps > 0 || !sh.root) return 0;
  o.ranks = sh.world;
  const px_gpt_config *c = &o.cfg;
  const double tokens = (double)sh.steps * o.batch * c->context * o.ranks;
  const double fpt = 6.0 * (double)sh.params + 6.0 * c->n_layer * (double)c->n_embd * c->context;
  const double step_tokens = (double)o.batch * c->context * o.ranks;
  printf("plexus gpt batch=%d threads=%d ranks=%d zero=%d prefetch=%d reshard=%d tokens_per_s=%.1f gflops=%.2f "
         "best_tokens_per_s=%.1f steps=%ld seconds=%.3f cpu_s=%.3f loss=%.5g params=%zu flops_per_token=%.0f "
         "overlap=%s bucket_mb=%g\n",
         o.batch, o.threads, o.ranks, o.zero, o.prefetch, o.reshard, tokens / sh.elapsed,
         tokens * fpt / sh.elapsed * 1e-9, step_tokens / sh.best, sh.steps, sh.elapsed, sh.cpu, sh.loss, sh.params, fpt,
         o.overlap == 1     ? "on"
           : o.overlap == 0 ? "off"
                            : "none",
         o.bucket_mb > 0 ? o.bucket_mb : (double)PX_DDP_DEFAULTS.bucket_bytes / 1048576.0);
  return 0;
}
