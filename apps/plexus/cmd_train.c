// plexus train: the configured model on the configured data, data
// parallel over the ranks of whichever backend started us (app.h).
//
//   plexus train --threads 2 ...        two ranks as threads, no MPI
//   mpirun -n 4 plexus train ...        four MPI processes
//   srun plexus train ...               Slurm's launcher (MPI under PMI/PMIx)
//
// Every rank parses the same options, opens the data, builds the same model
// from the seed; DDP (inside px_train) broadcasts rank 0's weights.  Only
// rank 0 prints, writes logs and checkpoints.
//
//   plexus train --threads 4 --model gpt --tp 2 ...   a dp 2 × tp 2 mesh:
//                                      each rank its boxes of the GPT (px_tp_gpt)
#define _GNU_SOURCE
#include "app.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// Set by SIGTERM, SIGUSR1 (Slurm's --signal) or a first Ctrl-C: the ranks
// agree to end after the current step, with a checkpoint.
static volatile sig_atomic_t stop_requested;

static void on_stop_signal(int sig) {
  stop_requested = 1;
  if (sig == SIGINT) signal(SIGINT, SIG_DFL);  // a second Ctrl-C ends at once
}

typedef struct train_job {
  px_config cfg;
  char *config_json;
  char ckpt_dir[1024], jsonl[1024], tensorboard[1024], vocab_out[1100];
  bool build_vocab; /* rank 0 builds vocab_out from the training text (claim_run) */
  int lock_fd;      /* rank 0: the run directory's lock (px_app_run_dir_claim), else -1 */
  bool refused;     /* claim_run failed on every rank */
  int num_threads;  /* compute threads per rank requested (0: automatic) */
  char *unit_names; /* --zero-unit split at its commas (units point into it) */
  const char *units[256];
  int n_units;
  bool stopped_by_signal;
} train_job;

int px_app_fail(const char *cmd) {
  fprintf(stderr, "plexus %s: %s\n", cmd, px_last_error());
  return 1;
}

static int rank_fail(px_comm *comm, const char *what) {
  fprintf(stderr, "plexus train: rank %d: %s%s%s\n", px_comm_rank(comm), what, *what ? ": " : "", px_last_error());
  return 1;
}

static px_train_opts train_opts(const train_job *job) {
  const px_config *c = &job->cfg;
  px_train_opts o = PX_TRAIN_DEFAULTS;
  o.batch_size = (size_t)c->batch_size;
  o.workers = (int)c->workers;
  o.prefetch = (int)c->prefetch;
  o.skip_bad = c->skip_bad;
  const float lr = (float)c->lr;
  if (strcmp(c->optim, "sgd") == 0) {
    o.optim = px_sgd_defaults(lr);
    o.optim.momentum = (float)c->momentum;
    o.optim.nesterov = c->nesterov;
  } else {
    o.optim = strcmp(c->optim, "adam") == 0 ? px_adam_defaults(lr) : px_adamw_defaults(lr);
    o.optim.beta1 = (float)c->beta1;
    o.optim.beta2 = (float)c->beta2;
    o.optim.eps = (float)c->eps;
  }
  // AdamW's default decay is PyTorch's 0.01 unless the user chose one.
  if (strcmp(c->optim, "adamw") != 0 || px_config_given(c, "optim.weight_decay"))
    o.optim.weight_decay = (float)c->weight_decay;
  // The base rate is o.optim.lr alone (px_train_schedule); the schedule
  // gives its shape.
  o.schedule = (px_lr_schedule){.kind = strcmp(c->schedule, "cosine") == 0 ? PX_LR_COSINE
                                  : strcmp(c->schedule, "step") == 0       ? PX_LR_STEP
                                                                           : PX_LR_CONSTANT,
                                .warmup_steps = c->warmup_steps,
                                .step_size = c->step_size,
                                .gamma = (float)c->gamma,
                                .min_lr = (float)c->min_lr};
  o.clip_grad_norm = (float)c->clip_grad;
  o.accum_steps = (int)c->accum_steps;
  o.label_smoothing = (float)c->label_smoothing;
  o.epochs = c->epochs;
  o.max_steps = c->steps;
  o.stop_at_step = c->stop_at_step;
  o.stop_flag = &stop_requested;
  o.seed = (uint64_t)c->seed;
  o.eval_every = c->eval_every;
  o.eval_max_batches = c->eval_batches;
  // --bucket-mb 0 (the default) leaves the bucket size to the library,
  // whose defaults are the one source of truth (PX_DDP_DEFAULTS, and
  // PX_ZERO1/2_BUCKET_BYTES per stage); a size given applies to DDP and
  // ZeRO 1-2 alike (ZeRO's reduce-scatter buckets are DDP's cut in N).
  o.zero.stage = (int)c->zero;
  if (c->bucket_mb > 0) {
    // (px_ddp_wrap and px_zero_wrap clamp the first bucket to this size.)
    o.ddp.bucket_bytes = (size_t)(c->bucket_mb * 1048576.0);
    o.zero.bucket_bytes = o.ddp.bucket_bytes;
  }
  o.zero.units = job->n_units ? job->units : NULL;
  o.zero.n_units = job->n_units;
  o.zero.prefetch = c->zero_prefetch;
  o.zero.reshard_after_forward = c->zero_reshard;
  o.ckpt_dir = job->ckpt_dir[0] ? job->ckpt_dir : NULL;
  o.ckpt_every = c->ckpt_every;
  o.keep_last = (int)c->keep_last;
  o.resume = *c->resume ? c->resume : NULL;
  o.config_json = job->config_json;
  o.log_every = c->log_every;
  o.loss_spike_factor = c->loss_spike_factor;
  o.device = strcmp(c->device, "cuda") == 0 ? PX_CUDA : PX_CPU;
  o.precision = strcmp(c->precision, "bf16") == 0 ? PX_BF16 : PX_F32;
  o.ddp.reduce_dtype = strcmp(c->reduce_dtype, "bf16") == 0 ? PX_BF16 : PX_F32;
  return o;
}

// Rank 0 loads --init and tells everyone how it went; the weights reach
// the other ranks through DDP's broadcast at wrap.
static px_status load_init(px_comm *comm, px_model *model, const px_config *c) {
  if (!*c->init) return PX_OK;
  int32_t status = 0;
  char msg[1024] = "";
  if (px_comm_rank(comm) == 0) {
    px_status st;
    struct stat sb;
    if (stat(c->init, &sb) == 0 && S_ISDIR(sb.st_mode)) {
      // A checkpoint (or a directory of them) of any layout: DDP's whole
      // model, or every rank's pieces under ZeRO 3.
      st = px_train_load_weights(model, c->init, NULL, 0);
    } else if (strcmp(c->model, "gpt") == 0) {
      st = px_zoo_gpt_load_hf(model, c->init);
    } else {
      px_state_dict sd;
      st = px_model_state_dict(model, &sd);
      if (st == PX_OK) st = px_safetensors_load(c->init, &sd, true);
      px_state_dict_free(&sd);
    }
    status = (int32_t)st;
    if (st != PX_OK) snprintf(msg, sizeof msg, "--init: %s", px_last_error());
  }
  px_status cst = px_comm_broadcast(comm, &status, 1, PX_I32, 0);
  if (cst == PX_OK) cst = px_comm_broadcast(comm, msg, sizeof msg, PX_U8, 0);
  if (cst != PX_OK) return cst;
  return status == 0 ? PX_OK : px_error((px_status)status, "%s", msg);
}

// The run's results on rank 0 (px_train's or the pipeline's), and the exit
// status a stop by signal asks for.
static void report(px_comm *comm, train_job *job, const px_train_result *res) {
  const px_config *c = &job->cfg;
  const int rank = px_comm_rank(comm);
  if (rank == 0) {
    // Results go to stdout even with --quiet: they are what the run is for.
    if (res->stopped)
      printf("plexus train: stopped at step %lld after %.1f s (%.0f samples/s)", (long long)res->steps, res->seconds,
             res->samples_per_s);
    else
      printf("plexus train: done: %lld steps in %.1f s (%.0f samples/s)", (long long)res->steps, res->seconds,
             res->samples_per_s);
    if (res->eval.samples > 0) {
      // MNIST-layout directories hold a test split; other sources a held-out one.
      printf("; %s loss %.4f", strcmp(c->data, "mnist") == 0 ? "test" : "held-out", res->eval.loss);
      if (res->eval.accuracy == res->eval.accuracy) printf(", accuracy %.4f", res->eval.accuracy);
      if (res->eval.perplexity == res->eval.perplexity) printf(", perplexity %.2f", res->eval.perplexity);
    }
    printf("\n");
    if (res->last_checkpoint[0]) printf("plexus train: last checkpoint %s\n", res->last_checkpoint);
    fflush(stdout);
  }
  // Every process ends with the same exit status: under MPI each holds its
  // own job (a rank whose peer got the signal stopped too); under threads
  // rank 0 speaks for the process.
  const bool at_budget = c->stop_at_step > 0 && res->steps >= c->stop_at_step;
  if (res->stopped && !at_budget && (rank == 0 || px_comm_backend_of(comm) == PX_COMM_MPI))
    job->stopped_by_signal = true;
}

// The device mesh of --dp/--tp (a pipeline dimension slots in as pp):
// NULL when the run is plain data parallel (tp 1 and no --dp), else a mesh
// over comm, described on rank 0.  A product that is not the world size
// fails on every rank alike; rank 0 says so, once.
static px_status make_mesh(px_comm *comm, const px_config *c, px_mesh **out) {
  *out = NULL;
  const int dp = (int)c->dp, tp = (int)c->tp, pp = 1;
  if (tp == 1 && dp == 0 && pp == 1) return PX_OK;
  px_status st = px_mesh_create(out, comm, dp, tp, pp);
  if (st != PX_OK) {
    if (px_comm_rank(comm) == 0) fprintf(stderr, "plexus train: --dp/--tp: %s\n", px_last_error());
    return st;
  }
  char line[256];
  if (px_comm_rank(comm) == 0 && !c->quiet) printf("plexus train: %s\n", px_mesh_describe(*out, line, sizeof line));
  return PX_OK;
}

// --init into a tensor-parallel model: every rank builds the whole zoo
// GPT, loads --init into it as load_init does (a checkpoint of any layout,
// or GPT-2 weights), and keeps its boxes (px_tp_load_state_dict).  Every
// rank reads the file; all fail if one does.
static px_status load_init_tp(px_comm *comm, px_model *model, const px_config *c, const px_data_shape *s) {
  px_module *root = NULL;
  px_model *whole = NULL;
  px_status st = px_app_build_model(c, s, &root);
  if (st == PX_OK) st = px_model_create(&whole, root, (uint64_t)c->seed);
  if (st == PX_OK) {
    struct stat sb;
    st = stat(c->init, &sb) == 0 && S_ISDIR(sb.st_mode) ? px_train_load_weights(whole, c->init, NULL, 0)
                                                        : px_zoo_gpt_load_hf(whole, c->init);
  }
  if (st == PX_OK) {
    px_state_dict sd;
    st = px_model_state_dict(whole, &sd);
    if (st == PX_OK) st = px_tp_load_state_dict(model, &sd);
    px_state_dict_free(&sd);
  }
  px_model_free(whole);
  char msg[1024] = "";
  if (st != PX_OK) snprintf(msg, sizeof msg, "--init: %s", px_last_error());
  int32_t bad = st != PX_OK;
  px_status cst = px_comm_allreduce(comm, &bad, 1, PX_I32, PX_MAX);
  if (st != PX_OK) return px_error(st, "%s", msg);
  if (cst != PX_OK) return cst;
  return bad ? px_error(PX_ERR_INVALID, "--init: another rank could not load %s", c->init) : PX_OK;
}

// The GPT in tensor-parallel form over the mesh's tp group: the zoo GPT's
// names and, per rank, boxes of its parameters.
static px_status build_tp_gpt(const px_config *c, const px_data_shape *s, px_mesh *mesh, px_module **out) {
  *out = NULL;
  if (!s->tokens)
    return px_error(PX_ERR_INVALID, "--tp %d: a GPT reads token data (--data tokens or text), not --data %s", mesh->tp,
                    c->data);
  px_tp_gpt_config g = {.vocab_size = (int)s->vocab_size,
                        .context = (int)c->context,
                        .n_layer = (int)c->n_layer,
                        .n_head = (int)c->n_head,
                        .n_embd = (int)c->n_embd,
                        .dropout = (float)c->dropout,
                        .sequence_parallel = c->sequence_parallel};
  px_module *m = px_tp_gpt(&mesh->tp_group, &g);
  if (!m) return px_error_wrap(PX_ERR_INVALID, "--model gpt --tp %d", mesh->tp);
  px_recompute r = {0};
  px_status st = c->recompute ? px_recompute_parse(c->recompute, &r) : PX_OK;
  if (st == PX_OK && r.kind != PX_RECOMPUTE_NONE) st = px_zoo_gpt_recompute(m, r);
  if (st != PX_OK) {
    px_module_free(m);
    return px_error_wrap(st, "--recompute %s with --tp %d", c->recompute, mesh->tp);
  }
  *out = m;
  return PX_OK;
}

// The run's outputs, by the process of rank 0: the --out directory claimed
// (locked; an earlier run refused or, with --overwrite, cleared), then the
// vocabulary and config.json written.
static px_status claim_outputs(train_job *job) {
  const px_config *c = &job->cfg;
  px_status st = *c->out ? px_app_run_dir_claim(c->out, *c->resume != '\0', c->overwrite, &job->lock_fd) : PX_OK;
  if (st == PX_OK && job->build_vocab) {
    px_vocab *v = NULL;
    st = px_vocab_build(&v, c->data_path);
    if (st == PX_OK) st = px_vocab_save(v, job->vocab_out);
    px_vocab_free(v);
  }
  if (st == PX_OK && *c->out) {
    // The effective configuration beside the run's files (the console
    // gets one line); written whole, then renamed into place.
    char path[1100], tmp[1200];
    snprintf(path, sizeof path, "%s/config.json", c->out);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    bool ok = f && fputs(job->config_json, f) >= 0 && fputc('\n', f) != EOF;
    ok = f && fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) st = px_error(PX_ERR_IO, "--out: cannot write %s", path);
  }
  return st;
}

// Rank 0 claims the outputs and every rank agrees (one broadcast), so all
// stop alike, under any backend.  A process of another machine that does
// not see rank 0's vocabulary file (no shared file system) builds its own,
// as before.
static px_status claim_run(px_comm *comm, train_job *job) {
  const px_config *c = &job->cfg;
  int32_t status = 0;
  char msg[1024] = "";
  if (px_comm_rank(comm) == 0) {
    px_status st = claim_outputs(job);
    status = (int32_t)st;
    if (st != PX_OK) snprintf(msg, sizeof msg, "%s", px_last_error());
  }
  px_status cst = px_comm_broadcast(comm, &status, 1, PX_I32, 0);
  if (cst == PX_OK) cst = px_comm_broadcast(comm, msg, sizeof msg, PX_U8, 0);
  if (cst != PX_OK) return cst;
  if (status != 0) return px_error((px_status)status, "%s", msg);
  struct stat sb;
  if (job->build_vocab && px_comm_rank(comm) != 0 && stat(job->vocab_out, &sb) != 0) {
    px_vocab *v = NULL;
    px_status st = px_vocab_build(&v, c->data_path);
    if (st == PX_OK) st = px_vocab_save(v, job->vocab_out);
    px_vocab_free(v);
    if (st != PX_OK) return st;
  }
  return PX_OK;
}

// Where the run's files go, for the start-up line.
static void describe_output(const train_job *job, char *buf, size_t cap) {
  const px_config *c = &job->cfg;
  if (*c->out) snprintf(buf, cap, "output %s", c->out);
  else if (job->ckpt_dir[0] || job->jsonl[0] || job->tensorboard[0])
    snprintf(buf, cap, "output%s%s%s%s%s%s", job->ckpt_dir[0] ? " checkpoints " : "", job->ckpt_dir,
             job->jsonl[0] ? " metrics " : "", job->jsonl, job->tensorboard[0] ? " tensorboard " : "",
             job->tensorboard);
  else snprintf(buf, cap, "no --out: nothing will be saved (no checkpoints, metrics or TensorBoard files)");
}

static int train_rank(px_comm *comm, void *arg) {
  train_job *job = arg;
  const px_config *c = &job->cfg;
  const int rank = px_comm_rank(comm);
  if (c->timeout > 0) px_comm_set_timeout(comm, c->timeout);
  else px_comm_set_timeout(comm, 0);
  // --num-threads; without it the library's default applies (under MPI
  // this process's share of the node's cores, tensor/threads.c).
  if (job->num_threads > 0) px_set_num_threads(job->num_threads);
  if (claim_run(comm, job) != PX_OK) {
    // Every rank stopped here, agreed: end cleanly (no abort), exit 1.
    if (rank == 0) fprintf(stderr, "plexus train: %s\n", px_last_error());
    if (rank == 0 || px_comm_backend_of(comm) == PX_COMM_MPI) job->refused = true;  // one job per process
    return 0;
  }
  char world[96], output[3200];
  snprintf(world, sizeof world, "%d rank%s (%s backend%s)", px_comm_size(comm), px_comm_size(comm) == 1 ? "" : "s",
           px_comm_backend_name(px_comm_backend_of(comm)),
           px_comm_debug_collectives(comm) ? ", collective fingerprints on" : "");
  describe_output(job, output, sizeof output);
  if (rank == 0 && !c->quiet && c->pp > 1) printf("plexus train: %s; %s\n", world, output);

  px_logger_opts lo = {.rank = rank,
                       .console = !c->quiet,
                       .progress = strcmp(c->progress, "bar") == 0 ? 1
                         : strcmp(c->progress, "lines") == 0       ? 0
                                                                   : -1,
                       .jsonl_path = job->jsonl[0] ? job->jsonl : NULL,
                       .tensorboard_dir = job->tensorboard[0] ? job->tensorboard : NULL};
  // --stage: the node's copy of the data; from here on c reads from it.
  px_app_staged staged;
  if (*c->stage) {
    if (px_app_stage_data(comm, c, &staged) != PX_OK) return rank_fail(comm, "");  // the message starts "--stage"
    c = &staged.cfg;
  }
  if (c->pp > 1) {  // pipeline parallel: its own loop (cmd_train_pp.c), the same options, logs and report
    const px_train_opts po = train_opts(job);
    px_train_result res;
    if (px_app_train_pp(comm, c, &po, &lo, &res) != PX_OK) return rank_fail(comm, "");
    report(comm, job, &res);
    return 0;
  }
  px_app_data train = {0}, val = {0};
  px_model *model = NULL;
  px_logger *log = NULL;
  px_mesh *mesh = NULL;
  int rc = 0;
  px_data_shape shape;
  px_module *root = NULL;
  if (make_mesh(comm, c, &mesh) != PX_OK) {
    rc = 1;
    goto done;
  }
  const bool tp = mesh && mesh->tp > 1;
  if (px_app_open_data(c, true, NULL, &train) != PX_OK) {
    rc = rank_fail(comm, "training data");
    goto done;
  }
  if (px_app_open_data(c, false, NULL, &val) != PX_OK) {
    rc = rank_fail(comm, "held-out data");
    goto done;
  }
  if (px_app_data_shape(c, &train, &shape) != PX_OK ||
      (tp ? build_tp_gpt(c, &shape, mesh, &root) : px_app_build_model(c, &shape, &root)) != PX_OK ||
      px_model_create(&model, root, (uint64_t)c->seed) != PX_OK) {
    rc = rank_fail(comm, "model");
    goto done;
  }
  // --sync-bn: batch statistics over the data-parallel ranks (the world:
  // models with batch norm are not tensor parallel).
  int n_sync_bn = 0;
  if (c->sync_bn && !tp && px_sync_batchnorm_convert(root, comm, &n_sync_bn) != PX_OK) {
    rc = rank_fail(comm, "--sync-bn");
    goto done;
  }
  if ((tp && *c->init ? load_init_tp(comm, model, c, &shape) : load_init(comm, model, c)) != PX_OK) {
    rc = rank_fail(comm, "");
    goto done;
  }
  if (px_logger_create(&log, &lo) != PX_OK || px_log_hparams(log, job->config_json, NULL) != PX_OK) {
    rc = rank_fail(comm, "logging");
    goto done;
  }
  // The start-up line: model and size, world, data, output.
  char held[64];
  if (val.set) snprintf(held, sizeof held, "%zu held-out", val.set->length);
  else snprintf(held, sizeof held, "no held-out split");
  if (!c->quiet && rank == 0 && tp) {
    px_log_text(log,
                "plexus train: model %s, tensor parallel over %d ranks%s: %zu parameters on tp rank 0; %s; data "
                "%s: %zu training samples, %s; %s",
                c->model, mesh->tp, c->sequence_parallel ? " (sequence parallel)" : "", model->n_param_elems, world,
                c->data, train.set->length, held, output);
  } else if (!c->quiet && rank == 0) {
    char bn[48] = "";
    if (n_sync_bn) snprintf(bn, sizeof bn, " (%d sync batch norm%s)", n_sync_bn, n_sync_bn == 1 ? "" : "s");
    px_log_text(log, "plexus train: model %s: %zu parameters%s; %s; data %s: %zu training samples, %s; %s", c->model,
                model->n_param_elems, bn, world, c->data, train.set->length, held, output);
  }
  px_train_opts o = train_opts(job);
  if (tp) {
    o.mesh = mesh;
    o.tp_vocab = (int)shape.vocab_size;
  }
  px_train_result res;
  if (px_train(comm, model, train.set, val.set, &o, log, &res) != PX_OK) {
    rc = rank_fail(comm, "");
    goto done;
  }
  report(comm, job, &res);
done:
  px_logger_free(log);
  px_model_free(model);
  px_mesh_free(mesh);  // after the model: its layers point at the mesh's tp group
  px_app_data_free(&val);
  px_app_data_free(&train);
  return rc;
}

// The README's demo, word for word ("Training from the command line";
// tests/test_cli_startup_output_is_short_and_help_matches_readme.py
// compares them).
#define README_DEMO                                                                                      \
  "plexus train --threads 2 --model cnn --data mnist --data-path /usr/share/datasets/fashion-mnist \\\n" \
  "               --epochs 5 --lr 0.002 --schedule cosine --warmup-steps 100 --out runs/fmnist-cnn"

static void train_usage(FILE *f) {
  fprintf(f,
          "usage: plexus train [--config FILE] [--OPTION VALUE ...]\n"
          "\n"
          "Trains a model of the zoo data parallel: one process (default), --threads N ranks in this process,\n"
          "or one rank per process under mpirun/mpiexec/srun; --zero 1|2|3 shards the optimizer state, the\n"
          "gradients and the parameters over the ranks (ZeRO); --tp N splits a GPT's layers over N neighbouring\n"
          "ranks (tensor parallel, --dp M x --tp N = the ranks). Options override the JSON config file; the\n"
          "effective config is saved as OUT/config.json and in every checkpoint (--print-config prints what\n"
          "applies to the model, and exits). --out refuses a directory holding another run unless --resume\n"
          "auto or --overwrite. --debug-collectives compares every collective's arguments across ranks first\n"
          "(PX_DEBUG_COLLECTIVES=1). Each option's JSON key is in brackets. Example (the README's demo):\n"
          "\n"
          "  " README_DEMO "\n");
  px_config_print_help(f, CFG_TRAIN);
}

/* --zero 3 without --zero-unit: the zoo's natural units (issue 11), so a
 * unit is what gathers at once: a GPT's blocks "h.0" ... "h.L-1" (its root
 * children would make all of "h" one unit), a ResNet's stages "layer1" ...
 * (stem and head join the root unit).  Other models: "" (the library's
 * default, each child of the root). */
static const char *default_units(const px_config *c, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  if (strcmp(c->model, "gpt") == 0) {
    for (int64_t l = 0; l < c->n_layer && used + 16 < cap; l++)
      used += (size_t)snprintf(buf + used, cap - used, "%sh.%lld", l ? "," : "", (long long)l);
  } else if (strcmp(c->model, "resnet") == 0 || strcmp(c->model, "resnet18") == 0) {
    snprintf(buf, cap, strcmp(c->model, "resnet18") == 0 ? "layer1,layer2,layer3,layer4" : "layer1,layer2,layer3");
  }
  return buf;
}

int px_cmd_train(int argc, char **argv) {
  for (int a = 1; a < argc; a++)
    if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0) {
      train_usage(stdout);
      return 0;
    }
  train_job job;
  memset(&job, 0, sizeof job);
  job.lock_fd = -1;
  px_config_defaults(&job.cfg);
  px_config *c = &job.cfg;
  int rc = 0;
  // --print-config: the effective configuration (what applies to this
  // model), then exit without training.
  bool print_config = false;
  int kept = 1;
  for (int a = 1; a < argc; a++) {
    if (strcmp(argv[a], "--print-config") == 0) print_config = true;
    // Read by every communicator as it is made (include/plexus/comm.h).
    else if (strcmp(argv[a], "--debug-collectives") == 0) setenv("PX_DEBUG_COLLECTIVES", "1", 1);
    else argv[kept++] = argv[a];
  }
  argc = kept;
  if (px_config_parse(c, argc, argv, 1, CFG_TRAIN) != PX_OK || px_config_validate(c, CFG_TRAIN) != PX_OK) {
    rc = px_app_fail("train");
    goto out;
  }
  if (print_config) {
    char *text = px_config_to_json_applicable(c, CFG_TRAIN);
    if (!text) {
      px_error(PX_ERR_NOMEM, "out of memory");
      rc = px_app_fail("train");
      goto out;
    }
    printf("%s\n", text);
    free(text);
    goto out;
  }
  // --out DIR: the run's files in one place, unless named one by one.
  if (*c->out) {
    if (px_mkdir_p(c->out, "--out", false) != PX_OK) {
      rc = px_app_fail("train");
      goto out;
    }
    snprintf(job.ckpt_dir, sizeof job.ckpt_dir, "%s/checkpoints", c->out);
    snprintf(job.jsonl, sizeof job.jsonl, "%s/metrics.jsonl", c->out);
    snprintf(job.tensorboard, sizeof job.tensorboard, "%s/tensorboard", c->out);
  }
  if (*c->ckpt_dir) snprintf(job.ckpt_dir, sizeof job.ckpt_dir, "%s", c->ckpt_dir);
  if (*c->jsonl) snprintf(job.jsonl, sizeof job.jsonl, "%s", c->jsonl);
  if (*c->tensorboard) snprintf(job.tensorboard, sizeof job.tensorboard, "%s", c->tensorboard);
  // A word-level vocabulary built from the training text is saved with the
  // run, and the config names it, so eval and generate tokenize the same.
  if (strcmp(c->data, "text") == 0 && strcmp(c->tokenizer, "word") == 0 && !*c->vocab && (*c->out || job.ckpt_dir[0])) {
    // Built by rank 0 once the run directory is claimed (claim_run).
    if (*c->out) snprintf(job.vocab_out, sizeof job.vocab_out, "%s/vocab.txt", c->out);
    else if (px_mkdir_p(job.ckpt_dir, "--out", false) == PX_OK)
      snprintf(job.vocab_out, sizeof job.vocab_out, "%s/vocab.txt", job.ckpt_dir);
    if (!job.vocab_out[0]) {
      rc = px_app_fail("train");
      goto out;
    }
    job.build_vocab = true;
    char *dup = strdup(job.vocab_out);
    if (!dup) {
      px_error(PX_ERR_NOMEM, "out of memory");
      rc = px_app_fail("train");
      goto out;
    }
    free(c->vocab);
    c->vocab = dup;
  }
  if (strcmp(c->resume, "auto") == 0 && !job.ckpt_dir[0]) {
    px_error(PX_ERR_INVALID, "--resume auto needs --ckpt-dir or --out");
    rc = px_app_fail("train");
    goto out;
  }
  job.config_json = px_config_to_json(c, CFG_TRAIN);
  if (!job.config_json) {
    px_error(PX_ERR_NOMEM, "out of memory");
    rc = px_app_fail("train");
    goto out;
  }
  job.num_threads = (int)c->num_threads;
  char zoo_units[4096];
  const char *unit_spec = *c->zero_unit ? c->zero_unit
    : c->zero == 3                      ? default_units(c, zoo_units, sizeof zoo_units)
                                        : "";
  if (*unit_spec) {
    job.unit_names = strdup(unit_spec);
    if (!job.unit_names) {
      px_error(PX_ERR_NOMEM, "out of memory");
      rc = px_app_fail("train");
      goto out;
    }
    for (char *save = NULL, *u = strtok_r(job.unit_names, ",", &save); u; u = strtok_r(NULL, ",", &save)) {
      if (job.n_units == (int)(sizeof job.units / sizeof *job.units)) {
        px_error(PX_ERR_INVALID, "--zero-unit names more than %d modules", job.n_units);
        rc = px_app_fail("train");
        goto out;
      }
      job.units[job.n_units++] = u;
    }
  }
  // The backend: what launched us, unless told.
  const bool launched = px_comm_mpi_launched();
  int threads = (int)c->threads;
  if (strcmp(c->backend, "mpi") == 0 && !launched) {
    px_error(PX_ERR_INVALID,
             "--backend mpi: this process was not started by an MPI launcher (mpirun, mpiexec, "
             "or srun --mpi=pmix; srun's default --mpi=none starts processes that MPI cannot join)");
    rc = px_app_fail("train");
    goto out;
  }
  if ((strcmp(c->backend, "threads") == 0 || strcmp(c->backend, "self") == 0) && launched) {
    px_error(PX_ERR_INVALID, "--backend %s: started by an MPI launcher; run without it, or use --backend mpi/auto",
             c->backend);
    rc = px_app_fail("train");
    goto out;
  }
  if (strcmp(c->backend, "self") == 0) threads = 1;
  if (launched && threads > 1) {
    px_error(PX_ERR_INVALID, "--threads %d under an MPI launcher: use one rank per process (mpirun -n N) instead",
             threads);
    rc = px_app_fail("train");
    goto out;
  }
  // The mesh's sizes against the world, here when the world is ours (threads
  // or one process: one message, no rank started); under a launcher each
  // rank checks in make_mesh.
  if (!launched && (c->tp > 1 || c->dp > 0 || c->pp > 1)) {
    const int64_t tp_pp = c->tp * c->pp;
    const int64_t dp = c->dp > 0 ? c->dp : threads / tp_pp;
    if (c->dp == 0 && threads % tp_pp != 0) {
      if (c->pp > 1)
        px_error(PX_ERR_INVALID,
                 "--tp %lld × --pp %lld = %lld does not divide the world size %d (--threads %d): dp "
                 "cannot be inferred",
                 (long long)c->tp, (long long)c->pp, (long long)tp_pp, threads, threads);
      else
        px_error(PX_ERR_INVALID, "--tp %lld does not divide the world size %d (--threads %d): dp cannot be inferred",
                 (long long)c->tp, threads, threads);
      rc = px_app_fail("train");
      goto out;
    }
    if (dp * tp_pp != threads) {
      px_error(PX_ERR_INVALID,
               "--dp/--tp%s: mesh dp %lld × tp %lld × pp %lld = %lld ranks, but the world has %d "
               "(--threads %d); the sizes' product must equal the world size",
               c->pp > 1 ? "/--pp" : "", (long long)dp, (long long)c->tp, (long long)c->pp, (long long)(dp * tp_pp),
               threads, threads);
      rc = px_app_fail("train");
      goto out;
    }
  }
  // Threads backend: each rank gets num_threads compute threads.
  if (threads > 1 && job.num_threads > 0) {
    px_set_num_threads(job.num_threads * threads);
    job.num_threads = 0;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  int exit_code = 0;
  if (px_comm_run(threads, train_rank, &job, &exit_code) != PX_OK) {
    rc = px_app_fail("train");
    goto out;
  }
  // 75 (EX_TEMPFAIL): stopped by a signal after its checkpoint; run the same
  // command with --resume auto to go on (a requeued Slurm job does).
  rc = exit_code != 0 ? exit_code : job.refused ? 1 : job.stopped_by_signal ? 75 : 0;
out:
  px_app_run_dir_release(job.lock_fd);
  free(job.unit_names);
  free(job.config_json);
  px_config_free(c);
  return rc;
}
