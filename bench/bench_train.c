/* bench_train.c — training throughput of plexus, to compare with PyTorch.
 *
 *   bench_train --model mlp|cnn|zoo_cnn|resnet_small|resnet18 --batch B --threads T
 *               [--seconds S] [--warmup W] [--ranks N] [--overlap on|off|none]
 *               [--bucket-mb MB]
 *   bench_train --info      (one line about the BLAS in use, for the record)
 *
 * Data parallel (bench/run_comm.sh's scaling table): under an MPI launcher
 * (mpiexec -n 2 bench_train ...) or with --ranks N (N ranks as threads),
 * each rank trains on its own batch of B (the per-rank batch) with the
 * model wrapped in px_ddp, T threads per rank; samples_per_s counts every
 * rank's samples.  --overlap off turns DDP's overlap of the all-reduce with
 * backward off: the buckets stay quiet during backward and one all-reduce
 * of the whole gradient follows it (the same bytes, nothing hidden), to
 * measure how much communication the overlap hides.  --overlap none (a
 * benchmark setting only) drops the communication: no DDP wrap and no
 * all-reduce, each rank steps on its own gradient; the same computation, so
 * its step time is the floor that a perfect overlap would reach
 * (bench/run_rig.sh: the share of the communication hidden).
 *
 * prints one line that bench/run.sh parses:
 *
 *   plexus mlp batch=16 threads=1 samples_per_s=123456.7 steps=... seconds=... cpu_s=... loss=...
 *
 * (with ranks=N backend=mpi|threads overlap=on|off|none added when N > 1).
 *
 * cpu_s is the CPU time all threads of the process spent in the timed
 * steps: near threads × seconds when the run had its cores to itself, well
 * below it when other work on the machine took them.
 *
 * Each timed iteration is a full training step: zero_grad, forward, loss,
 * backward, optimizer step (the optimizer leaves the gradients zero as it
 * reads them, px_optim_step_zero_grads, as `plexus train` does: so zero_grad
 * only runs before the first step).  bench/bench_train_torch.py does the same step
 * with PyTorch on the same shapes; the two are meant to run side by side in
 * one invocation (bench/run.sh), so that machine load hits both alike.
 *
 *   mlp: Linear(1,256)-Tanh-Linear(256,512)-Tanh-Linear(512,256)-Tanh-Linear(256,1)
 *        MSE loss, Adam(lr 1e-3); x uniform in [-1, 1], y = x².
 *   cnn: Conv2d(1,8,3,p=1)-BatchNorm2d(8)-ReLU-MaxPool2d(2)
 *        -Conv2d(8,16,3,p=1)-BatchNorm2d(16)-ReLU-MaxPool2d(2)-Flatten-Linear(784,10)
 *        cross-entropy, SGD(lr 0.01, momentum 0.9); x ~ N(0, 1) of (B,1,28,28),
 *        labels uniform in [0, 10).
 *   The zoo's models (apps/plexus/zoo.h), cross-entropy and SGD(lr 0.01,
 *   momentum 0.9) as the cnn, x ~ N(0, 1), labels uniform:
 *   zoo_cnn:      px_zoo_cnn(1, 28, 28, 32, 10), the Fashion-MNIST model of
 *                 `plexus train`, on (B,1,28,28)
 *   resnet_small: ResNet-20, px_zoo_resnet_small(3, 10, 3, 16), on (B,3,32,32)
 *   resnet18:     px_zoo_resnet18(3, 1000) on (B,3,224,224)
 *
 * The data are generated once, before timing: N_BATCHES batches that the
 * loop cycles through.  This is a benchmark, not a test: it never fails on
 * speed. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime(CLOCK_PROCESS_CPUTIME_ID) */
#include <plexus/plexus.h>

#include <plexus/zoo.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_BATCHES 4

typedef enum { MODEL_MLP, MODEL_CNN, MODEL_ZOO_CNN, MODEL_RESNET_SMALL, MODEL_RESNET18 } model_kind;

static const char *const model_names[] = {"mlp", "cnn", "zoo_cnn", "resnet_small", "resnet18"};
/* Input (C, H, W) and classes of the image models. */
static const int model_input[][4] = {{0, 0, 0, 0},
                                     {1, 28, 28, 10},
                                     {1, 28, 28, 10},
                                     {3, 32, 32, 10},
                                     {3, 224, 224, 1000}};

typedef struct bench_opts {
  model_kind model;
  int batch;
  int threads;
  double seconds;   /* timed budget */
  double warmup;    /* untimed budget before it */
  int ranks;        /* threads-backend ranks (an MPI launcher decides its own) */
  int overlap;      /* DDP: 1 all-reduce buckets during backward, 0 one all-reduce after it, -1 none */
  double bucket_mb; /* DDP bucket capacity in MiB; 0: the library's default */
} bench_opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: bench_train --model mlp|cnn|zoo_cnn|resnet_small|resnet18 --batch B --threads T\n"
          "                   [--seconds S] [--warmup W] [--ranks N] [--overlap on|off|none]\n"
          "                   [--bucket-mb MB]\n"
          "       bench_train --info\n"
          "  Trains the quick-start MLP, the 28x28 CNN or a model of the zoo for about S seconds\n"
          "  (default 2.5) after W seconds of warm-up (default 0.5) and prints samples/s.\n");
}

static int parse_args(int argc, char **argv, bench_opts *o) {
  *o = (bench_opts){.model = MODEL_MLP,
                    .batch = 16,
                    .threads = 1,
                    .seconds = 2.5,
                    .warmup = 0.5,
                    .ranks = 1,
                    .overlap = 1};
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
    if (i + 1 >= argc) {
      fprintf(stderr, "bench_train: %s needs a value\n", a);
      return -1;
    }
    const char *v = argv[++i];
    if (strcmp(a, "--model") == 0) {
      int k = 0;
      while (k < 5 && strcmp(v, model_names[k]) != 0) k++;
      if (k == 5) {
        fprintf(stderr, "bench_train: --model is mlp, cnn, zoo_cnn, resnet_small or resnet18, not \"%s\"\n", v);
        return -1;
      }
      o->model = (model_kind)k;
    } else if (strcmp(a, "--batch") == 0) {
      o->batch = atoi(v);
    } else if (strcmp(a, "--threads") == 0) {
      o->threads = atoi(v);
    } else if (strcmp(a, "--seconds") == 0) {
      o->seconds = atof(v);
    } else if (strcmp(a, "--warmup") == 0) {
      o->warmup = atof(v);
    } else if (strcmp(a, "--ranks") == 0) {
      o->ranks = atoi(v);
    } else if (strcmp(a, "--overlap") == 0) {
      if (strcmp(v, "on") && strcmp(v, "off") && strcmp(v, "none")) {
        fprintf(stderr, "bench_train: --overlap is on, off or none, not \"%s\"\n", v);
        return -1;
      }
      o->overlap = strcmp(v, "on") == 0 ? 1 : strcmp(v, "off") == 0 ? 0 : -1;
    } else if (strcmp(a, "--bucket-mb") == 0) {
      o->bucket_mb = atof(v);
      if (!(o->bucket_mb > 0)) {
        fprintf(stderr, "bench_train: --bucket-mb is a size in MiB > 0, not \"%s\"\n", v);
        return -1;
      }
    } else {
      fprintf(stderr, "bench_train: unknown option %s\n", a);
      usage(stderr);
      return -1;
    }
  }
  if (o->batch < 1 || o->threads < 1 || o->ranks < 1 || o->seconds <= 0 || o->warmup < 0) {
    fprintf(stderr, "bench_train: --batch, --threads and --ranks must be >= 1, --seconds > 0, --warmup >= 0\n");
    return -1;
  }
  return 0;
}

static px_module *build_mlp(void) {
  return px_chain_of(7, px_linear(1, 256, true), px_tanh(), px_linear(256, 512, true), px_tanh(),
                     px_linear(512, 256, true), px_tanh(), px_linear(256, 1, true));
}

static px_module *build_cnn(void) {
  // (B,1,28,28) -> (B,8,28,28) -> pool (B,8,14,14) -> (B,16,14,14) -> pool (B,16,7,7) -> (B,784) -> (B,10)
  return px_chain_of(10, px_conv2d(1, 8, 3, 1, 1, true), px_batchnorm(8, 1e-5f, 0.1f), px_relu(), px_maxpool2d(2, 2),
                     px_conv2d(8, 16, 3, 1, 1, true), px_batchnorm(16, 1e-5f, 0.1f), px_relu(), px_maxpool2d(2, 2),
                     px_flatten(), px_linear(16 * 7 * 7, 10, true));
}

/* Everything one training step touches. */
typedef struct bench {
  const bench_opts *o;
  px_comm *comm;
  px_ddp *ddp;     /* NULL in a world of one */
  bool grads_zero; /* the last step left the gradients zero */
  px_model *model;
  px_optim *optim;
  size_t in_per_sample; /* floats of one input sample */
  float *inputs;        /* (N_BATCHES, B, in_per_sample) */
  float *targets_f;     /* mlp: (N_BATCHES, B, 1) */
  int32_t *targets_i;   /* cnn: (N_BATCHES, B) */
  float last_loss;
} bench;

static int fail(const char *what) {
  fprintf(stderr, "bench_train: %s: %s\n", what, px_last_error());
  return 1;
}

/* One full training step on batch k: zero_grad, forward, loss, backward, step. */
static px_status train_step(bench *b, int k) {
  const int B = b->o->batch;
  const int *in = model_input[b->o->model];
  px_tensor x = b->o->model == MODEL_MLP
    ? px_tensor_f32(b->inputs + (size_t)k * B, 2, B, 1, 0, 0)
    : px_tensor_f32(b->inputs + (size_t)k * B * b->in_per_sample, 4, B, in[0], in[1], in[2]);
  px_tensor pred;
  if (!b->grads_zero) px_model_zero_grad(b->model);
  b->grads_zero = false;
  px_status st = px_model_forward(b->model, &x, &pred);
  if (st != PX_OK) return st;
  px_tensor dpred = pred;  // ∂loss/∂pred, same shape, from the step arena
  dpred.data = px_model_scratch(b->model, (size_t)px_tensor_numel(&pred));
  if (!dpred.data) return PX_ERR_NOMEM;
  if (b->o->model == MODEL_MLP) {
    px_tensor y = px_tensor_f32(b->targets_f + (size_t)k * B, 2, B, 1, 0, 0);
    st = px_mse_loss(&pred, &y, &b->last_loss, px_f32(&dpred));
  } else {
    px_ce_opts ce = PX_CE_DEFAULTS;
    st = px_cross_entropy_loss(&pred, b->targets_i + (size_t)k * B, &ce, &b->last_loss, px_f32(&dpred));
  }
  if (st != PX_OK) return st;
  st = px_model_backward(b->model, &dpred, NULL);
  if (st != PX_OK) return st;
  if (b->ddp && b->o->overlap == 1) {
    st = px_ddp_sync(b->ddp);
  } else if (b->ddp && b->o->overlap == 0) {
    // No overlap: the whole gradient in one all-reduce after backward.
    st = px_comm_allreduce(b->comm, b->model->grad_data, b->model->n_param_elems, PX_F32, PX_AVG);
  }
  if (st != PX_OK) return st;
  // The optimizer covers the model's whole gradient buffer: left zero.
  st = px_optim_step_zero_grads(b->optim);
  b->grads_zero = st == PX_OK;
  return st;
}

static double cpu_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run steps for `budget` seconds (at least min_steps); returns steps taken,
 * their wall time in *elapsed and the process's CPU time in *cpu. */
static px_status run_for(bench *b, double budget, long min_steps, long *steps, double *elapsed, double *cpu) {
  long n = 0;
  double c0 = cpu_seconds();
  double t0 = px_time_now(), t = t0;
  // Ranks must take the same number of steps, so with more than one the
  // budget becomes a count: min_steps steps, timed, then as many as the
  // slowest rank's pace fits in the budget.
  if (px_comm_size(b->comm) > 1) {
    for (; n < min_steps; n++) {
      px_status st = train_step(b, (int)(n % N_BATCHES));
      if (st != PX_OK) return st;
    }
    double pace = (px_time_now() - t0) / (double)n;
    px_status st = px_comm_allreduce(b->comm, &pace, 1, PX_F64, PX_MAX);
    if (st != PX_OK) return st;
    long total = (long)(budget / pace);
    for (; n < total; n++)
      if ((st = train_step(b, (int)(n % N_BATCHES))) != PX_OK) return st;
    *steps = n;
    *elapsed = px_time_now() - t0;
    *cpu = cpu_seconds() - c0;
    // The slowest rank's time is the job's.
    return px_comm_allreduce(b->comm, elapsed, 1, PX_F64, PX_MAX);
  }
  while (n < min_steps || t - t0 < budget) {
    px_status st = train_step(b, (int)(n % N_BATCHES));
    if (st != PX_OK) return st;
    n++;
    t = px_time_now();
  }
  *steps = n;
  *elapsed = t - t0;
  *cpu = cpu_seconds() - c0;
  return PX_OK;
}

static int rank_main(px_comm *comm, void *arg) {
  const bench_opts o = *(const bench_opts *)arg;
  px_set_num_threads(o.threads);

  bench b = {.o = &o, .comm = comm};
  // DDP's options: the library's defaults, or --bucket-mb's capacity (the
  // first bucket clamped to it by px_ddp_wrap).
  px_ddp_opts dopts = PX_DDP_DEFAULTS;
  if (o.bucket_mb > 0) dopts.bucket_bytes = (size_t)(o.bucket_mb * 1048576.0);
  const int rank = px_comm_rank(comm), world = px_comm_size(comm);
  px_module *root = o.model == MODEL_MLP ? build_mlp()
    : o.model == MODEL_CNN               ? build_cnn()
    : o.model == MODEL_ZOO_CNN           ? px_zoo_cnn(1, 28, 28, 32, 10)
    : o.model == MODEL_RESNET_SMALL      ? px_zoo_resnet_small(3, 10, 3, 16)
                                         : px_zoo_resnet18(3, 1000);
  if (px_model_create(&b.model, root, /*seed=*/42) != PX_OK) return fail("model");
  px_model_train(b.model, true);

  px_optim_opts oo = o.model == MODEL_MLP ? px_adam_defaults(1e-3f) : px_sgd_defaults(0.01f);
  if (o.model != MODEL_MLP) oo.momentum = 0.9f;
  if (px_optim_create(&b.optim, b.model->param_data, b.model->grad_data, b.model->n_param_elems, &oo) != PX_OK)
    return fail("optimizer");
  if (world > 1 && o.overlap >= 0 && px_ddp_wrap(&b.ddp, b.model, comm, &dopts) != PX_OK) return fail("DDP");
  // Overlap off: the buckets stay quiet (train_step's one all-reduce is
  // the step's only communication).  Before 2026-11-29 they did not, and
  // the off side all-reduced every gradient twice.
  if (b.ddp && o.overlap == 0) px_ddp_set_sync(b.ddp, false);

  // Data, generated once.
  const size_t B = (size_t)o.batch;
  const int *in = model_input[o.model];
  b.in_per_sample = o.model == MODEL_MLP ? 1 : (size_t)in[0] * in[1] * in[2];
  b.inputs = malloc(N_BATCHES * B * b.in_per_sample * sizeof *b.inputs);
  b.targets_f = malloc(N_BATCHES * B * sizeof *b.targets_f);
  b.targets_i = malloc(N_BATCHES * B * sizeof *b.targets_i);
  if (!b.inputs || !b.targets_f || !b.targets_i) {
    fprintf(stderr, "bench_train: out of memory\n");
    return 1;
  }
  px_rng rng = px_rng_make(0, (uint64_t)rank);  // each rank its own samples
  if (o.model == MODEL_MLP) {
    for (size_t i = 0; i < N_BATCHES * B; i++) {
      float v = 2.0f * px_rng_uniform(&rng) - 1.0f;
      b.inputs[i] = v;
      b.targets_f[i] = v * v;
    }
  } else {
    for (size_t i = 0; i < N_BATCHES * B * b.in_per_sample; i++) b.inputs[i] = px_rng_normal(&rng);
    for (size_t i = 0; i < N_BATCHES * B; i++) b.targets_i[i] = (int32_t)px_rng_below(&rng, (uint64_t)in[3]);
  }

  long steps = 0;
  double elapsed = 0, cpu = 0;
  // Warm-up: lets the arena reach its high-water size and the caches and
  // the OpenMP pool settle.
  if (run_for(&b, o.warmup, 3, &steps, &elapsed, &cpu) != PX_OK) return fail("warm-up step");
  if (run_for(&b, o.seconds, 5, &steps, &elapsed, &cpu) != PX_OK) return fail("training step");

  if (world == 1) {
    printf("plexus %s batch=%d threads=%d samples_per_s=%.1f steps=%ld seconds=%.3f cpu_s=%.3f loss=%.6g\n",
           model_names[o.model], o.batch, px_get_num_threads(), (double)steps * (double)B / elapsed, steps, elapsed,
           cpu, (double)b.last_loss);
  } else if (rank == 0) {
    // Every rank's samples; cpu_s is this process's (all ranks under threads).
    printf("plexus %s batch=%d threads=%d samples_per_s=%.1f steps=%ld seconds=%.3f cpu_s=%.3f loss=%.6g "
           "ranks=%d backend=%s overlap=%s bucket_mb=%g\n",
           model_names[o.model], o.batch, px_get_num_threads(), (double)steps * (double)B * world / elapsed, steps,
           elapsed, cpu, (double)b.last_loss, world, px_comm_backend_name(px_comm_backend_of(comm)),
           o.overlap == 1     ? "on"
             : o.overlap == 0 ? "off"
                              : "none",
           (double)dopts.bucket_bytes / 1048576.0);
  }
  fflush(stdout);

  free(b.inputs);
  free(b.targets_f);
  free(b.targets_i);
  px_ddp_free(b.ddp);
  px_optim_free(b.optim);
  px_model_free(b.model);
  return 0;
}

int main(int argc, char **argv) {
  bench_opts o;
  if (parse_args(argc, argv, &o) != 0) return 2;
  // Each rank sets its own threads; this sizes the pool px_comm_run divides.
  px_set_num_threads(o.threads);
  int code = 0;
  if (px_comm_run(o.ranks, rank_main, &o, &code) != PX_OK) return fail("start");
  return code;
}
