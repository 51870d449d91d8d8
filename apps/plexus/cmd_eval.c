// plexus eval: a checkpoint's model on a split, over as many ranks as
// launched (threads or MPI); the figures are exact over the whole split.
//
//   plexus eval --checkpoint runs/fmnist/checkpoints            newest good one
//   plexus eval --checkpoint runs/fmnist/checkpoints/step_00000938 --split train
//
// The model and data come from the config saved in the checkpoint;
// options override it (a moved dataset: --data-path).
#define _POSIX_C_SOURCE 200809L
#include "app.h"

#include <stdio.h>
#include <string.h>

typedef struct eval_job {
  px_config cfg;
  char ckpt[1024];
  int64_t step;
} eval_job;

static int eval_rank(px_comm *comm, void *arg) {
  eval_job *job = arg;
  const px_config *c = &job->cfg;
  const int rank = px_comm_rank(comm);
  if (c->timeout > 0) px_comm_set_timeout(comm, c->timeout);
  px_app_data train = {0}, split = {0};
  px_model *model = NULL;
  px_module *root = NULL;
  px_data_shape shape;
  int rc = 0;
  // The training split gives the model's shape (classes, vocabulary).
  px_status st = px_app_open_data(c, true, NULL, &train);
  if (st == PX_OK) st = px_app_data_shape(c, &train, &shape);
  if (st == PX_OK && strcmp(c->split, "val") == 0) {
    st = px_app_open_data(c, false, NULL, &split);
    if (st == PX_OK && !split.set)
      st = px_error(PX_ERR_INVALID, "no held-out split: give --val-path, or --split train");
  }
  px_dataset *set = split.set ? split.set : train.set;
  if (st == PX_OK) st = px_app_build_model(c, &shape, &root);
  if (st == PX_OK) st = px_model_create(&model, root, (uint64_t)c->seed);
  // Every rank reads the weights (evaluation only reads; nothing to agree on).
  if (st == PX_OK) st = px_train_load_weights(model, job->ckpt, NULL, 0);
  // --device cuda: the loaded weights onto this rank's GPU.
  if (st == PX_OK && strcmp(c->device, "cuda") == 0)
    st = px_train_to_device(comm, model, PX_CUDA, strcmp(c->precision, "bf16") == 0 ? PX_BF16 : PX_F32);
  px_eval_metrics m;
  if (st == PX_OK) st = px_evaluate(comm, model, set, (size_t)c->batch_size, (int)c->workers, c->eval_batches, &m);
  if (st != PX_OK) {
    fprintf(stderr, "plexus eval: rank %d: %s\n", rank, px_last_error());
    rc = 1;
  } else if (rank == 0) {
    const bool lm = m.accuracy != m.accuracy;
    printf("plexus eval: %s (step %lld), %s split: %lld %s, loss %.6f", job->ckpt, (long long)job->step, c->split,
           (long long)m.samples, lm ? "tokens" : "samples", m.loss);
    if (!lm) printf(", accuracy %.6f", m.accuracy);
    if (m.perplexity == m.perplexity) printf(", perplexity %.2f", m.perplexity);
    printf("\n");
    fflush(stdout);
  }
  px_model_free(model);
  px_app_data_free(&split);
  px_app_data_free(&train);
  return rc;
}

static void eval_usage(FILE *f) {
  fprintf(f,
          "usage: plexus eval --checkpoint PATH [--split val|train] [--OPTION VALUE ...]\n"
          "\n"
          "Evaluates a checkpoint (or the newest good one in a directory of them) on the held-out split:\n"
          "loss, and accuracy for classifiers or perplexity for language models. The model and data are\n"
          "those of the config saved in the checkpoint; options override them. Runs on one process, on\n"
          "--threads N ranks, or under mpirun/srun; the figures are exact over the whole split. --device cuda\n"
          "evaluates on the GPUs (one per rank); the checkpoint's device is not inherited.\n");
  px_config_print_help(f, CFG_EVAL);
}

int px_cmd_eval(int argc, char **argv) {
  for (int a = 1; a < argc; a++)
    if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0) {
      eval_usage(stdout);
      return 0;
    }
  eval_job job;
  memset(&job, 0, sizeof job);
  px_config *c = &job.cfg;
  px_config_defaults(c);
  int rc = 1;
  const char *ck = px_app_find_option(argc, argv, "checkpoint");
  char note[2048];
  if (!ck) {
    px_error(PX_ERR_INVALID, "--checkpoint PATH is required (a checkpoint, or a directory of them)");
    goto out;
  }
  if (px_app_resolve_checkpoint(ck, job.ckpt, sizeof job.ckpt, note, sizeof note) != PX_OK) goto out;
  if (note[0]) fprintf(stderr, "plexus eval: %s\n", note);
  if (px_app_checkpoint_config(job.ckpt, c, CFG_EVAL, &job.step) != PX_OK) goto out;
  // Where to evaluate is this command's choice, not the training run's:
  // a checkpoint trained on GPUs evaluates on the CPU unless --device cuda.
  if (px_config_reset(c, "train.device") != PX_OK || px_config_reset(c, "train.precision") != PX_OK) goto out;
  if (px_config_parse(c, argc, argv, 1, CFG_EVAL) != PX_OK || px_config_validate(c, CFG_EVAL) != PX_OK) goto out;
  if (c->threads > 1 && px_comm_mpi_launched()) {
    px_error(PX_ERR_INVALID, "--threads under an MPI launcher: use one rank per process");
    goto out;
  }
  int exit_code = 0;
  if (px_comm_run(px_comm_mpi_launched() ? 1 : (int)c->threads, eval_rank, &job, &exit_code) != PX_OK) goto out;
  if (exit_code != 0) {
    px_config_free(c);
    return exit_code;
  }
  rc = 0;
out:
  if (rc) px_app_fail("eval");
  px_config_free(c);
  return rc;
}
