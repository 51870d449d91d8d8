/* train_mnist.c — the training loop as a library call: a small CNN on
 * Fashion-MNIST (or MNIST), data parallel, with evaluation, checkpoints
 * and resume, in one px_train call per rank.
 *
 *   ./build/train_mnist                          2 ranks as threads, 3 epochs
 *   ./build/train_mnist --threads 1 --epochs 1 --subset 6000
 *   mpirun -n 2 ./build/train_mnist              2 MPI processes
 *
 * Options: --threads N (ranks as threads), --epochs N, --subset N (the
 * first N training images), --data DIR (default Debian's Fashion-MNIST),
 * --out DIR (checkpoints and metrics.jsonl; default runs/train_mnist).
 * Run it twice: the second run resumes from the newest checkpoint and has
 * nothing left to do unless --epochs grew. */
#include <plexus/plexus.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct args {
  int threads, epochs;
  size_t subset;
  const char *data, *out;
} args;

// conv(1→16, 3×3) – BN – ReLU – pool, conv(16→32) – BN – ReLU – pool,
// linear(32·7·7 → 10)
static px_module *network(void) {
  return px_chain_of(10, px_conv2d(1, 16, 3, 1, 1, false), px_batchnorm(16, 1e-5f, 0.1f), px_relu(), px_maxpool2d(2, 2),
                     px_conv2d(16, 32, 3, 1, 1, false), px_batchnorm(32, 1e-5f, 0.1f), px_relu(), px_maxpool2d(2, 2),
                     px_flatten(), px_linear(32 * 7 * 7, 10, true));
}

static int rank_main(px_comm *comm, void *argp) {
  const args *a = argp;
  const int rank = px_comm_rank(comm);
  px_dataset *train = NULL, *test = NULL, *part = NULL;
  px_model *model = NULL;
  px_logger *log = NULL;
  int rc = 1;
  char ckpt[512], jsonl[512];
  snprintf(ckpt, sizeof ckpt, "%s/checkpoints", a->out);
  snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", a->out);
  // Fashion-MNIST's training pixels have mean 0.2860 and std 0.3530.
  if (px_mnist_open(&train, a->data, "train", 0.2860f, 0.3530f) != PX_OK ||
      px_mnist_open(&test, a->data, "test", 0.2860f, 0.3530f) != PX_OK)
    goto out;
  if (a->subset && a->subset < train->length && px_dataset_subset(&part, train, 0, a->subset) != PX_OK) goto out;
  if (px_model_create(&model, network(), /*seed=*/1) != PX_OK) goto out;  // the same model on every rank

  px_train_opts o = PX_TRAIN_DEFAULTS;  // Adam(1e-3), batch 64 per rank, 1 loader thread
  o.epochs = a->epochs;
  o.ckpt_dir = ckpt;
  o.resume = "auto";  // the newest good checkpoint, if there is one
  o.log_every = 100;
  px_logger_opts lo = {.rank = rank, .console = true, .progress = -1, .jsonl_path = jsonl};
  if (px_logger_create(&log, &lo) != PX_OK) goto out;
  px_train_result r;
  if (px_train(comm, model, part ? part : train, test, &o, log, &r) != PX_OK) goto out;
  if (rank == 0)
    printf("train_mnist: %lld steps; test loss %.4f, accuracy %.4f\n", (long long)r.steps, r.eval.loss,
           r.eval.accuracy);
  rc = 0;
out:
  if (rc) fprintf(stderr, "train_mnist: rank %d: %s\n", rank, px_last_error());
  px_logger_free(log);
  px_model_free(model);
  px_dataset_free(part);
  px_dataset_free(test);
  px_dataset_free(train);
  return rc;
}

int main(int argc, char **argv) {
  args a = {.threads = 2,
            .epochs = 3,
            .subset = 0,
            .data = "/usr/share/datasets/fashion-mnist",
            .out = "runs/train_mnist"};
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "train_mnist: %s needs a value (see the comment at the top of examples/train_mnist.c)\n",
              argv[i]);
      return 2;
    }
    if (strcmp(argv[i], "--threads") == 0) a.threads = atoi(v);
    else if (strcmp(argv[i], "--epochs") == 0) a.epochs = atoi(v);
    else if (strcmp(argv[i], "--subset") == 0) a.subset = (size_t)atol(v);
    else if (strcmp(argv[i], "--data") == 0) a.data = v;
    else if (strcmp(argv[i], "--out") == 0) a.out = v;
    else {
      fprintf(stderr, "train_mnist: unknown option %s\n", argv[i]);
      return 2;
    }
    i++;
  }
  if (a.threads < 1 || a.epochs < 1) {
    fprintf(stderr, "train_mnist: --threads and --epochs must be at least 1\n");
    return 2;
  }
  int code = 0;
  if (px_comm_run(a.threads, rank_main, &a, &code) != PX_OK) {
    fprintf(stderr, "train_mnist: %s\n", px_last_error());
    return 1;
  }
  return code;
}
