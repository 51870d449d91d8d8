// The plexus command's options: one table drives the JSON config file, the
// long options, the defaults, the checks and --help (config.h).
#define _POSIX_C_SOURCE 200809L
#include "config.h"

#include <cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef enum opt_type { T_STR, T_INT, T_NUM, T_BOOL } opt_type;

typedef struct opt_def {
  const char *section, *key; /* JSON {"section": {"key": value}} */
  const char *flag;          /* long option, without "--" */
  opt_type type;
  size_t offset;       /* into px_config */
  const char *def;     /* default, as text ("" for none) */
  const char *choices; /* "a|b|c" for strings with fixed values, else NULL */
  double min, max;     /* numbers: the accepted range */
  int commands;        /* CFG_TRAIN | CFG_EVAL | ... */
  const char *help;
} opt_def;

#define F(field) offsetof(px_config, field)
#define ALL (CFG_TRAIN | CFG_EVAL | CFG_GENERATE)
#define TE (CFG_TRAIN | CFG_EVAL)
// The largest count an option takes: what a JSON number (a double) holds
// exactly and px_config_load_json reads back, so a run's saved config
// (state.json) always loads again (with 1e18, --seed 1e17 trained and then
// `plexus eval` refused its checkpoint's config).
#define BIG 9e15

static const opt_def opts[] = {
  {"run", "out", "out", T_STR, F(out), "", NULL, 0, 0, CFG_TRAIN,
   "run directory: checkpoints in OUT/checkpoints, metrics in OUT/metrics.jsonl, TensorBoard files in OUT/tensorboard"},

  {"model", "name", "model", T_STR, F(model), "cnn", "mlp|cnn|resnet|resnet18|gpt", 0, 0, ALL,
   "model of the zoo (docs/MODELS.md)"},
  {"model", "hidden", "hidden", T_INT, F(hidden), "256", NULL, 1, 1 << 20, ALL, "mlp: units per hidden layer"},
  {"model", "depth", "depth", T_INT, F(depth), "2", NULL, 0, 64, ALL, "mlp: hidden layers"},
  {"model", "channels", "channels", T_INT, F(channels), "32", NULL, 1, 4096, ALL,
   "cnn: channels of the first convolution (the second has twice as many)"},
  {"model", "width", "width", T_INT, F(width), "16", NULL, 1, 4096, ALL, "resnet: channels of the first stage"},
  {"model", "blocks", "blocks", T_INT, F(blocks), "3", NULL, 1, 64, ALL,
   "resnet: basic blocks per stage (3: ResNet-20)"},
  {"model", "n_layer", "n-layer", T_INT, F(n_layer), "4", NULL, 1, 256, ALL, "gpt: transformer blocks"},
  {"model", "n_head", "n-head", T_INT, F(n_head), "4", NULL, 1, 256, ALL, "gpt: attention heads"},
  {"model", "n_embd", "n-embd", T_INT, F(n_embd), "256", NULL, 1, 65536, ALL, "gpt: width (divisible by n-head)"},
  {"model", "context", "context", T_INT, F(context), "128", NULL, 1, 1 << 20, ALL,
   "gpt: context length; training windows are this many tokens"},
  {"model", "vocab_size", "vocab-size", T_INT, F(vocab_size), "0", NULL, 0, 1 << 30, ALL,
   "gpt: vocabulary size (0: from the vocabulary file or the data)"},
  {"model", "dropout", "dropout", T_NUM, F(dropout), "0", NULL, 0, 0.999, ALL, "gpt: dropout probability"},
  {"model", "init", "init", T_STR, F(init), "", NULL, 0, 0, CFG_TRAIN,
   "initial weights: a safetensors file with the model's names (torchvision ResNet, GPT-2, a plexus checkpoint's "
   "model.safetensors), or a plexus checkpoint directory of any layout"},

  {"data", "source", "data", T_STR, F(data), "mnist", "mnist|images|imagenet|tokens|text|hdf5", 0, 0, ALL,
   "dataset format (docs/DATA.md)"},
  {"data", "path", "data-path", T_STR, F(data_path), "/usr/share/datasets/fashion-mnist", NULL, 0, 0, ALL,
   "training data: mnist: a directory of IDX files; images/imagenet: the CSV listing; tokens: a glob of shards; "
   "text: a text file; hdf5: an HDF5 file"},
  {"data", "val_path", "val-path", T_STR, F(val_path), "", NULL, 0, 0, ALL,
   "held-out data in the same format (mnist: the directory's test split is used when empty)"},
  {"data", "image_root", "image-root", T_STR, F(image_root), "", NULL, 0, 0, ALL,
   "images/imagenet: directory the CSV's paths are relative to (default: the CSV's directory)"},
  {"data", "val_image_root", "val-image-root", T_STR, F(val_image_root), "", NULL, 0, 0, ALL,
   "images/imagenet: directory the held-out CSV's paths are relative to (default: --image-root, else that "
   "CSV's directory)"},
  {"data", "synsets", "synsets", T_STR, F(synsets), "", NULL, 0, 0, ALL, "imagenet: LOC_synset_mapping.txt"},
  {"data", "image_channels", "image-channels", T_INT, F(image_channels), "3", NULL, 1, 3, ALL,
   "images/imagenet: 3 (RGB) or 1 (gray)"},
  {"data", "resize", "resize", T_INT, F(resize), "0", NULL, 0, 65536, ALL,
   "images: resize the shorter side to this (0: keep)"},
  {"data", "crop", "crop", T_INT, F(crop), "0", NULL, 0, 65536, ALL, "images: square crop of this size (0: none)"},
  {"data", "random_crop", "random-crop", T_BOOL, F(random_crop), "false", NULL, 0, 0, CFG_TRAIN,
   "images: random crops for training (evaluation takes the center)"},
  {"data", "hflip", "hflip", T_BOOL, F(hflip), "false", NULL, 0, 0, CFG_TRAIN,
   "images: random horizontal flips for training"},
  {"data", "mean", "mean", T_STR, F(mean), "", NULL, 0, 0, ALL,
   "normalisation mean per channel, \"m\" or \"r,g,b\" (default: mnist 0.2860, images 0.485,0.456,0.406, "
   "hdf5 0)"},
  {"data", "std", "std", T_STR, F(std), "", NULL, 0, 0, ALL,
   "normalisation std per channel (default: mnist 0.3530, images 0.229,0.224,0.225, hdf5 1)"},
  {"data", "tokenizer", "tokenizer", T_STR, F(tokenizer), "word", "word|byte", 0, 0, ALL,
   "text: word-level (WikiText-2) or byte-level"},
  {"data", "vocab", "vocab", T_STR, F(vocab), "", NULL, 0, 0, ALL,
   "tokens/text: the vocabulary file (text: built from the training file and saved in the run directory when "
   "empty)"},
  {"data", "batch_size", "batch-size", T_INT, F(batch_size), "64", NULL, 1, 1 << 24, ALL, "samples per rank per step"},
  {"data", "workers", "workers", T_INT, F(workers), "1", NULL, 0, 256, ALL, "loader threads per rank"},
  {"data", "prefetch", "prefetch", T_INT, F(prefetch), "0", NULL, 0, 4096, ALL,
   "batches prepared ahead (0: two per worker)"},
  {"data", "train_subset", "train-subset", T_INT, F(train_subset), "0", NULL, 0, BIG, CFG_TRAIN,
   "use only the first N training samples (0: all)"},
  {"data", "val_subset", "val-subset", T_INT, F(val_subset), "0", NULL, 0, BIG, ALL,
   "use only the first N held-out samples (0: all)"},
  {"data", "skip_bad", "skip-bad", T_BOOL, F(skip_bad), "false", NULL, 0, 0, TE,
   "skip bad records (counted and reported each epoch) instead of stopping"},
  {"data", "stage", "stage", T_STR, F(stage), "", NULL, 0, 0, CFG_TRAIN,
   "copy the data's files once per node into this directory (/dev/shm) and train from the copy; later runs reuse "
   "a verified copy (mnist, tokens, text, hdf5, images, imagenet)"},
  {"data", "stage_verify", "stage-verify", T_STR, F(stage_verify), "full", "full|size", 0, 0, CFG_TRAIN,
   "--stage: check a reused copy's size and CRC-32C (full) or its size only (size)"},

  {"optim", "name", "optim", T_STR, F(optim), "adam", "sgd|adam|adamw", 0, 0, CFG_TRAIN, "optimizer"},
  {"optim", "lr", "lr", T_NUM, F(lr), "0.001", NULL, 1e-12, 1e6, CFG_TRAIN, "learning rate"},
  {"optim", "momentum", "momentum", T_NUM, F(momentum), "0", NULL, 0, 0.999999, CFG_TRAIN, "sgd: momentum"},
  {"optim", "nesterov", "nesterov", T_BOOL, F(nesterov), "false", NULL, 0, 0, CFG_TRAIN, "sgd: Nesterov momentum"},
  {"optim", "weight_decay", "weight-decay", T_NUM, F(weight_decay), "0", NULL, 0, 1e6, CFG_TRAIN,
   "weight decay (sgd, adam: L2 in the gradient; adamw: decoupled)"},
  {"optim", "beta1", "beta1", T_NUM, F(beta1), "0.9", NULL, 0, 0.999999, CFG_TRAIN, "adam/adamw: beta1"},
  {"optim", "beta2", "beta2", T_NUM, F(beta2), "0.999", NULL, 0, 0.999999999, CFG_TRAIN, "adam/adamw: beta2"},
  {"optim", "eps", "eps", T_NUM, F(eps), "1e-08", NULL, 1e-30, 1, CFG_TRAIN, "adam/adamw: epsilon"},
  {"optim", "schedule", "schedule", T_STR, F(schedule), "constant", "constant|step|cosine", 0, 0, CFG_TRAIN,
   "learning-rate schedule per optimizer step"},
  {"optim", "warmup_steps", "warmup-steps", T_INT, F(warmup_steps), "0", NULL, 0, BIG, CFG_TRAIN,
   "linear warm-up steps"},
  {"optim", "step_size", "step-size", T_INT, F(step_size), "1000", NULL, 1, BIG, CFG_TRAIN,
   "step schedule: multiply the rate by gamma every this many steps"},
  {"optim", "gamma", "gamma", T_NUM, F(gamma), "0.1", NULL, 0, 1, CFG_TRAIN, "step schedule: factor"},
  {"optim", "min_lr", "min-lr", T_NUM, F(min_lr), "0", NULL, 0, 1e6, CFG_TRAIN, "cosine schedule: final rate"},
  {"optim", "clip_grad", "clip-grad", T_NUM, F(clip_grad), "0", NULL, 0, 1e12, CFG_TRAIN,
   "clip the global gradient norm to this (0: off)"},
  {"optim", "label_smoothing", "label-smoothing", T_NUM, F(label_smoothing), "0", NULL, 0, 1, CFG_TRAIN,
   "cross-entropy label smoothing"},

  {"train", "epochs", "epochs", T_INT, F(epochs), "5", NULL, 1, BIG, CFG_TRAIN, "epochs (when --steps is 0)"},
  {"train", "steps", "steps", T_INT, F(steps), "0", NULL, 0, BIG, CFG_TRAIN,
   "optimizer steps to train (0: --epochs decides)"},
  {"train", "stop_at_step", "stop-at-step", T_INT, F(stop_at_step), "0", NULL, 0, BIG, CFG_TRAIN,
   "end this job after step N with a checkpoint, to be resumed (--epochs/--steps and the schedule still "
   "describe the whole run; SIGTERM, SIGUSR1 and Ctrl-C do the same at the next step)"},
  {"train", "accum_steps", "accum-steps", T_INT, F(accum_steps), "1", NULL, 1, 1 << 20, CFG_TRAIN,
   "micro-batches per optimizer step (gradient accumulation)"},
  {"train", "recompute", "recompute", T_STR, F(recompute), "none", NULL, 0, 0, CFG_TRAIN,
   "activation checkpointing for gpt and resnet: none, full (every block recomputed in backward), every:K "
   "(blocks 0, K, 2K, ...), selective (only cheap activations: GELU / batchnorm+ReLU) (docs/RECOMPUTE.md)"},
  {"train", "eval_every", "eval-every", T_INT, F(eval_every), "0", NULL, 0, BIG, CFG_TRAIN,
   "evaluate every N steps (0: at the end of each epoch)"},
  {"train", "eval_batches", "eval-batches", T_INT, F(eval_batches), "0", NULL, 0, BIG, ALL,
   "evaluate on at most N batches per rank (0: the whole held-out split)"},
  {"train", "log_every", "log-every", T_INT, F(log_every), "50", NULL, 1, BIG, CFG_TRAIN, "steps between log lines"},
  {"train", "seed", "seed", T_INT, F(seed), "0", NULL, 0, BIG, ALL,
   "seed of the weights, the data order, augmentation, dropout and sampling"},
  {"train", "loss_spike_factor", "loss-spike-factor", T_NUM, F(loss_spike_factor), "0", NULL, 0, 1e12, CFG_TRAIN,
   "stop every rank, naming the step, when a step's loss exceeds F x its running mean (from the second step: "
   "the mean of the steps before it, after 10 steps a moving average); 0: off (a loss or gradient norm that is "
   "not finite always stops the run)"},

  {"parallel", "backend", "backend", T_STR, F(backend), "auto", "auto|self|threads|mpi", 0, 0, ALL,
   "auto: MPI when started by mpirun/srun, else threads when --threads > 1, else one process"},
  {"parallel", "threads", "threads", T_INT, F(threads), "1", NULL, 1, 4096, ALL,
   "ranks as threads of this process (the threads backend; no MPI needed)"},
  {"parallel", "num_threads", "num-threads", T_INT, F(num_threads), "0", NULL, 0, 4096, ALL,
   "compute threads per rank (0: this node's cores divided among its ranks)"},
  {"parallel", "bucket_mb", "bucket-mb", T_NUM, F(bucket_mb), "0", NULL, 0, 1 << 20, CFG_TRAIN,
   "gradient bucket size in MiB (DDP, ZeRO 1-2); 0: the library's default for the strategy (DDP: 4, ZeRO 1: 25, "
   "ZeRO 2: 8)"},
  {"parallel", "zero", "zero", T_INT, F(zero), "0", NULL, 0, BIG, CFG_TRAIN,
   "sharded data parallel (ZeRO): 0 DDP (every rank holds everything), 1 shard the optimizer state, 2 and the "
   "gradients, 3 and the parameters (docs/PARALLEL.md)"},
  {"parallel", "zero_unit", "zero-unit", T_STR, F(zero_unit), "", NULL, 0, 0, CFG_TRAIN,
   "--zero 3: the modules whose parameters are gathered together, NAME[,NAME...] (\"h.0,h.1\"; default: a GPT's "
   "blocks h.0..h.L-1, a ResNet's stages layer1..., other models each child of the model's root)"},
  {"parallel", "zero_prefetch", "zero-prefetch", T_BOOL, F(zero_prefetch), "true", NULL, 0, 0, CFG_TRAIN,
   "--zero 3: gather the next unit's parameters while this one computes"},
  {"parallel", "zero_reshard", "zero-reshard", T_BOOL, F(zero_reshard), "true", NULL, 0, 0, CFG_TRAIN,
   "--zero 3: free a unit's gathered parameters after its forward and gather again for backward (less memory); "
   "off: keep them until its backward (one gather fewer)"},
  {"parallel", "pp", "pp", T_INT, F(pp), "1", NULL, 1, 4096, CFG_TRAIN,
   "pipeline parallel: the model cut into this many stages; --dp x --tp x --pp = the ranks (3D; docs/PARALLEL.md)"},
  {"parallel", "micro_batches", "micro-batches", T_INT, F(micro_batches), "1", NULL, 1, 1 << 20, CFG_TRAIN,
   "--pp: micro-batches per step (--batch-size must be a multiple)"},
  {"parallel", "schedule_pp", "schedule-pp", T_STR, F(schedule_pp), "1f1b", "gpipe|1f1b|interleaved", 0, 0, CFG_TRAIN,
   "--pp: the pipeline schedule (interleaved: 2 stages per rank)"},
  {"parallel", "timeout", "timeout", T_NUM, F(timeout), "600", NULL, 0, 1e9, ALL,
   "seconds a rank waits for its peers before the job ends with an error naming them (0: forever)"},
  // The device mesh: dp × tp (× pp) = the world's ranks, tp innermost.
  {"parallel", "dp", "dp", T_INT, F(dp), "0", NULL, 0, 1 << 20, CFG_TRAIN,
   "data-parallel ranks of the mesh (0: the world size / (tp x pp))"},
  {"parallel", "tp", "tp", T_INT, F(tp), "1", NULL, 1, 4096, CFG_TRAIN,
   "tensor-parallel ranks (--model gpt): each layer's weights split over tp neighbouring ranks (docs/PARALLEL.md)"},
  {"parallel", "sequence_parallel", "sequence-parallel", T_BOOL, F(sequence_parallel), "false", NULL, 0, 0, CFG_TRAIN,
   "--tp > 1: layer norms, dropout and residuals on context/tp positions a rank (context a multiple of "
   "tp)"},

  {"checkpoint", "dir", "ckpt-dir", T_STR, F(ckpt_dir), "", NULL, 0, 0, CFG_TRAIN,
   "checkpoint directory (default OUT/checkpoints with --out; none without)"},
  {"checkpoint", "every", "ckpt-every", T_INT, F(ckpt_every), "0", NULL, 0, BIG, CFG_TRAIN,
   "checkpoint every N steps (0: at the end of each epoch)"},
  {"checkpoint", "keep_last", "keep-last", T_INT, F(keep_last), "3", NULL, 0, 1 << 20, CFG_TRAIN,
   "checkpoints kept (0: all); the newest good one is never deleted"},
  {"checkpoint", "resume", "resume", T_STR, F(resume), "", NULL, 0, 0, CFG_TRAIN,
   "\"auto\": continue from the newest good checkpoint in the checkpoint directory, if any; or a checkpoint path"},

  {"log", "jsonl", "jsonl", T_STR, F(jsonl), "", NULL, 0, 0, CFG_TRAIN,
   "metrics as JSON lines (default OUT/metrics.jsonl with --out)"},
  {"log", "tensorboard", "tensorboard", T_STR, F(tensorboard), "", NULL, 0, 0, CFG_TRAIN,
   "TensorBoard event files in this directory (default OUT/tensorboard with --out)"},
  {"log", "progress", "progress", T_STR, F(progress), "auto", "auto|bar|lines", 0, 0, CFG_TRAIN,
   "console: a live bar on a terminal, plain lines otherwise"},
  {"log", "quiet", "quiet", T_BOOL, F(quiet), "false", NULL, 0, 0, ALL, "no console output but errors and results"},

  {"eval", "checkpoint", "checkpoint", T_STR, F(checkpoint), "", NULL, 0, 0, CFG_EVAL | CFG_GENERATE,
   "a checkpoint directory, or a directory of checkpoints (the newest good one); its saved config is the "
   "starting point, options override it"},
  {"eval", "split", "split", T_STR, F(split), "val", "val|train", 0, 0, CFG_EVAL,
   "the held-out split (mnist: the test files) or the training split (without augmentation)"},

  {"generate", "prompt", "prompt", T_STR, F(prompt), "", NULL, 0, 0, CFG_GENERATE, "text to continue"},
  {"generate", "tokens", "tokens", T_INT, F(tokens), "100", NULL, 1, 1 << 24, CFG_GENERATE, "tokens to generate"},
  {"generate", "temperature", "temperature", T_NUM, F(temperature), "1", NULL, 0, 100, CFG_GENERATE,
   "sampling temperature (0: greedy)"},
  {"generate", "top_k", "top-k", T_INT, F(top_k), "0", NULL, 0, 1 << 24, CFG_GENERATE,
   "sample from the k most likely tokens (0: all)"},

  // Added by issue 16 (kept at the end: px_config.given is by index).
  {"run", "overwrite", "overwrite", T_BOOL, F(overwrite), "false", NULL, 0, 0, CFG_TRAIN,
   "--out already holding a run (checkpoints, metrics, TensorBoard files): delete that run's files first "
   "(without it such a directory is refused, unless --resume; never saved in a config)"},
  {"model", "sync_bn", "sync-bn", T_BOOL, F(sync_bn), "false", NULL, 0, 0, CFG_TRAIN,
   "cnn/resnet: synchronized batch norm: batch statistics over all data-parallel ranks in forward and "
   "backward, as torch.nn.SyncBatchNorm"},
  // Added by issue 15.
  {"train", "device", "device", T_STR, F(device), "cpu", "cpu|cuda", 0, 0, TE,
   "where the model computes; cuda takes one GPU per rank (local rank modulo the node's GPUs) and, with more "
   "than one rank, runs DDP over NCCL (docs/GPU.md); plexus eval evaluates on the CPU unless given"},
  {"train", "precision", "precision", T_STR, F(precision), "f32", "f32|bf16", 0, 0, TE,
   "matrix products' operands: f32, or bf16 with --device cuda (f32 accumulation; weights, gradients and "
   "optimizer state stay f32)"},
  {"train", "reduce_dtype", "reduce-dtype", T_STR, F(reduce_dtype), "f32", "f32|bf16", 0, 0, CFG_TRAIN,
   "the dtype DDP sums gradients in across ranks: f32, or bf16 with --device cuda (each bucket cast to bf16 "
   "for NCCL and back: half the bytes, sums rounded to bf16; PyTorch FSDP's reduce_dtype)"},
  // Added by issue 19: the HDF5 source (--data hdf5).
  {"data", "h5_layout", "h5-layout", T_STR, F(h5_layout), "images", "images|tokens", 0, 0, ALL,
   "hdf5: images (an image dataset and a label dataset) or tokens (a 1-D token array cut into windows of "
   "--context; the vocabulary size from --vocab-size)"},
  {"data", "h5_x", "h5-x", T_STR, F(h5_x), "", NULL, 0, 0, ALL,
   "hdf5: the dataset of the inputs, (N, H, W) or (N, C, H, W) uint8 or float32 images, or the 1-D integer "
   "tokens (default: \"images\", or \"tokens\" with --h5-layout tokens)"},
  {"data", "h5_y", "h5-y", T_STR, F(h5_y), "labels", NULL, 0, 0, ALL,
   "hdf5: the dataset of the (N,) integer labels (--h5-layout images)"},
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

_Static_assert(sizeof opts / sizeof opts[0] <= sizeof(((px_config *)0)->given), "px_config.given too small");

static char **str_at(px_config *c, const opt_def *d) { return (char **)((char *)c + d->offset); }
static int64_t *int_at(px_config *c, const opt_def *d) { return (int64_t *)((char *)c + d->offset); }
static double *num_at(px_config *c, const opt_def *d) { return (double *)((char *)c + d->offset); }
static bool *bool_at(px_config *c, const opt_def *d) { return (bool *)((char *)c + d->offset); }

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

// Levenshtein distance, for "did you mean" (names are short).
static size_t edit_distance(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  if (na > 63 || nb > 63) return 99;
  size_t row[64];
  for (size_t j = 0; j <= nb; j++) row[j] = j;
  for (size_t i = 1; i <= na; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= nb; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      if (up + 1 < best) best = up + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[nb];
}

// " (did you mean --lr?)" for the closest flag or key within distance 3,
// or for a key put in the wrong section ("log.log_every" -> train.log_every).
static void suggest(char *buf, size_t cap, const char *given, bool as_flag) {
  buf[0] = '\0';
  size_t best = 4;
  const char *dot = as_flag ? NULL : strchr(given, '.');
  if (dot)
    for (int i = 0; i < N_OPTS; i++)
      if (strcmp(opts[i].key, dot + 1) == 0) {
        snprintf(buf, cap, " (did you mean %s.%s?)", opts[i].section, opts[i].key);
        return;
      }
  for (int i = 0; i < N_OPTS; i++) {
    char key[96];
    if (as_flag) snprintf(key, sizeof key, "%s", opts[i].flag);
    else snprintf(key, sizeof key, "%s.%s", opts[i].section, opts[i].key);
    size_t d = edit_distance(given, key);
    if (d < best) {
      best = d;
      snprintf(buf, cap, " (did you mean %s%s?)", as_flag ? "--" : "", key);
    }
  }
}

static px_status set_value(px_config *c, int i, const char *text, const char *where) {
  const opt_def *d = &opts[i];
  char *end;
  switch (d->type) {
  case T_STR: {
    if (d->choices && *text) {
      bool ok = false;
      const char *p = d->choices;
      size_t n = strlen(text);
      while (*p) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, text, n) == 0) ok = true;
        p += len + (bar ? 1 : 0);
      }
      if (!ok) return px_error(PX_ERR_INVALID, "%s: \"%s\" is not one of %s", where, text, d->choices);
    }
    char *v = dup_str(text);
    if (!v) return px_error(PX_ERR_NOMEM, "%s: out of memory", where);
    free(*str_at(c, d));
    *str_at(c, d) = v;
    break;
  }
  case T_INT: {
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (!*text || *end || errno) return px_error(PX_ERR_INVALID, "%s: expected an integer, got \"%s\"", where, text);
    if ((double)v < d->min || (double)v > d->max)
      return px_error(PX_ERR_INVALID, "%s: %lld is outside [%.0f, %.0f]", where, v, d->min, d->max);
    *int_at(c, d) = v;
    break;
  }
  case T_NUM: {
    errno = 0;
    double v = strtod(text, &end);
    if (!*text || *end || errno || !isfinite(v))
      return px_error(PX_ERR_INVALID, "%s: expected a number, got \"%s\"", where, text);
    if (v < d->min || v > d->max)
      return px_error(PX_ERR_INVALID, "%s: %g is outside [%g, %g]", where, v, d->min, d->max);
    *num_at(c, d) = v;
    break;
  }
  case T_BOOL:
    if (strcmp(text, "true") == 0 || strcmp(text, "1") == 0) *bool_at(c, d) = true;
    else if (strcmp(text, "false") == 0 || strcmp(text, "0") == 0) *bool_at(c, d) = false;
    else return px_error(PX_ERR_INVALID, "%s: expected true or false, got \"%s\"", where, text);
    break;
  }
  c->given[i] = 1;
  return PX_OK;
}

void px_config_defaults(px_config *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < N_OPTS; i++) {
    char where[64];
    snprintf(where, sizeof where, "default of --%s", opts[i].flag);
    (void)set_value(c, i, opts[i].def, where);  // the table's defaults are valid
    c->given[i] = 0;
  }
}

void px_config_free(px_config *c) {
  for (int i = 0; i < N_OPTS; i++)
    if (opts[i].type == T_STR) {
      free(*str_at(c, &opts[i]));
      *str_at(c, &opts[i]) = NULL;
    }
}

px_status px_config_reset(px_config *c, const char *key) {
  const char *dot = strchr(key, '.');
  for (int i = 0; dot && i < N_OPTS; i++)
    if (strncmp(opts[i].section, key, (size_t)(dot - key)) == 0 && opts[i].section[dot - key] == '\0' &&
        strcmp(opts[i].key, dot + 1) == 0) {
      char where[64];
      snprintf(where, sizeof where, "default of --%s", opts[i].flag);
      px_status st = set_value(c, i, opts[i].def, where);
      c->given[i] = 0;
      return st;
    }
  return px_error(PX_ERR_INVALID, "config: no option %s", key);
}

bool px_config_given(const px_config *c, const char *key) {
  const char *dot = strchr(key, '.');
  if (!dot) return false;
  for (int i = 0; i < N_OPTS; i++)
    if (strncmp(opts[i].section, key, (size_t)(dot - key)) == 0 && opts[i].section[dot - key] == '\0' &&
        strcmp(opts[i].key, dot + 1) == 0)
      return c->given[i];
  return false;
}

static const char *type_name(opt_type t) {
  return t == T_STR ? "a string" : t == T_INT ? "an integer" : t == T_NUM ? "a number" : "true or false";
}

px_status px_config_load_json(px_config *c, const char *text, size_t n, const char *name, int commands) {
  cJSON *root = cJSON_ParseWithLength(text, n);
  if (!root) {
    const char *at = cJSON_GetErrorPtr();
    size_t line = 1;
    if (at && at >= text && at <= text + n)
      for (const char *p = text; p < at; p++) line += *p == '\n';
    return px_error(PX_ERR_FORMAT, "config %s: not valid JSON (near line %zu)", name, line);
  }
  px_status st = PX_OK;
  if (!cJSON_IsObject(root))
    st = px_error(PX_ERR_FORMAT, "config %s: expected an object of sections ({\"model\": {...}, \"data\": {...}})",
                  name);
  for (cJSON *sec = root->child; st == PX_OK && sec; sec = sec->next) {
    bool known_section = false;
    for (int i = 0; i < N_OPTS; i++) known_section |= strcmp(opts[i].section, sec->string) == 0;
    if (!known_section) {
      st = px_error(PX_ERR_INVALID,
                    "config %s: unknown section \"%s\"; expected run, model, data, optim, train, parallel, "
                    "checkpoint, log, eval or generate",
                    name, sec->string);
      break;
    }
    if (!cJSON_IsObject(sec)) {
      st = px_error(PX_ERR_INVALID, "config %s: \"%s\" must be an object of settings", name, sec->string);
      break;
    }
    for (cJSON *item = sec->child; st == PX_OK && item; item = item->next) {
      char key[160], where[256];
      snprintf(key, sizeof key, "%s.%s", sec->string, item->string);
      snprintf(where, sizeof where, "config %s: %s", name, key);
      int found = -1;
      for (int i = 0; i < N_OPTS; i++)
        if (strcmp(opts[i].section, sec->string) == 0 && strcmp(opts[i].key, item->string) == 0) found = i;
      if (found < 0) {
        char hint[192];
        suggest(hint, sizeof hint, key, false);
        st = px_error(PX_ERR_INVALID, "config %s: unknown key \"%s\"%s", name, key, hint);
        break;
      }
      const opt_def *d = &opts[found];
      if (!(d->commands & commands)) continue;  // another command's setting: kept in saved configs, ignored here
      char buf[64];
      const char *val = NULL;
      if (d->type == T_STR && cJSON_IsString(item)) val = item->valuestring;
      else if (d->type == T_BOOL && cJSON_IsBool(item)) val = cJSON_IsTrue(item) ? "true" : "false";
      else if ((d->type == T_INT || d->type == T_NUM) && cJSON_IsNumber(item)) {
        if (d->type == T_INT) {
          if (item->valuedouble != floor(item->valuedouble) || fabs(item->valuedouble) > 9e15) {
            st = px_error(PX_ERR_INVALID, "%s: expected an integer, got %g", where, item->valuedouble);
            break;
          }
          snprintf(buf, sizeof buf, "%.0f", item->valuedouble);
        } else {
          snprintf(buf, sizeof buf, "%.17g", item->valuedouble);
        }
        val = buf;
      }
      if (!val) {
        char *shown = cJSON_PrintUnformatted(item);
        st = px_error(PX_ERR_INVALID, "%s: expected %s, got %.60s", where, type_name(d->type), shown ? shown : "?");
        free(shown);
        break;
      }
      st = set_value(c, found, val, where);
    }
  }
  cJSON_Delete(root);
  return st;
}

static px_status read_text(const char *path, char **out, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return px_error(PX_ERR_IO, "config %s: cannot open: %s", path, strerror(errno));
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (len < cap) break;
    char *nb = realloc(buf, cap * 2);
    if (!nb) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = nb;
    cap *= 2;
  }
  bool err = ferror(f);
  fclose(f);
  if (!buf) return px_error(PX_ERR_NOMEM, "config %s: out of memory", path);
  if (err) {
    free(buf);
    return px_error(PX_ERR_IO, "config %s: read error", path);
  }
  *out = buf;
  *n = len;
  return PX_OK;
}

px_status px_config_parse(px_config *c, int argc, char **argv, int first, int commands) {
  // The file first, wherever --config stands: options override it.
  for (int a = first; a < argc; a++) {
    const char *path = NULL;
    if (strcmp(argv[a], "--config") == 0) {
      if (a + 1 >= argc) return px_error(PX_ERR_INVALID, "--config needs a file");
      path = argv[a + 1];
    } else if (strncmp(argv[a], "--config=", 9) == 0) {
      path = argv[a] + 9;
    }
    if (!path) continue;
    char *text = NULL;
    size_t n = 0;
    px_status st = read_text(path, &text, &n);
    if (st != PX_OK) return st;
    st = px_config_load_json(c, text, n, path, commands);
    free(text);
    if (st != PX_OK) return st;
  }
  for (int a = first; a < argc; a++) {
    const char *arg = argv[a];
    if (strcmp(arg, "--config") == 0) {
      a++;
      continue;
    }
    if (strncmp(arg, "--config=", 9) == 0) continue;
    if (strncmp(arg, "--", 2) != 0 || !arg[2])
      return px_error(PX_ERR_INVALID, "unexpected argument \"%s\": options are --name value (see --help)", arg);
    char name[96];
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    if (len >= sizeof name) len = sizeof name - 1;
    memcpy(name, arg + 2, len);
    name[len] = '\0';
    bool negated = false;
    int found = -1;
    for (int i = 0; i < N_OPTS; i++)
      if (strcmp(opts[i].flag, name) == 0) found = i;
    if (found < 0 && strncmp(name, "no-", 3) == 0) {
      for (int i = 0; i < N_OPTS; i++)
        if (opts[i].type == T_BOOL && strcmp(opts[i].flag, name + 3) == 0) found = i;
      negated = found >= 0;
    }
    if (found < 0) {
      char hint[192];
      suggest(hint, sizeof hint, name, true);
      return px_error(PX_ERR_INVALID, "unknown option --%s%s; see --help", name, hint);
    }
    const opt_def *d = &opts[found];
    char where[128];
    snprintf(where, sizeof where, "--%s", d->flag);
    if (!(d->commands & commands)) return px_error(PX_ERR_INVALID, "--%s does not apply to this command", d->flag);
    const char *val;
    if (d->type == T_BOOL && !eq) {
      val = negated ? "false" : "true";
    } else if (negated) {
      return px_error(PX_ERR_INVALID, "--no-%s takes no value", d->flag);
    } else if (eq) {
      val = eq + 1;
    } else {
      if (a + 1 >= argc) return px_error(PX_ERR_INVALID, "--%s needs a value (%s)", d->flag, type_name(d->type));
      val = argv[++a];
    }
    px_status st = set_value(c, found, val, where);
    if (st != PX_OK) return st;
  }
  return PX_OK;
}

px_status px_config_floats3(const char *s, const char *what, float out[3]) {
  double v[3];
  int n = 0;
  const char *p = s;
  while (*p && n < 3) {
    char *end;
    errno = 0;
    v[n] = strtod(p, &end);
    if (end == p || errno || !isfinite(v[n])) break;
    n++;
    p = end;
    while (*p == ' ') p++;
    if (*p == ',') p++;
    else break;
  }
  if (*p || (n != 1 && n != 3))
    return px_error(PX_ERR_INVALID,
                    "%s: expected one number or three separated by commas (\"0.5\" or "
                    "\"0.485,0.456,0.406\"), got \"%s\"",
                    what, s);
  for (int k = 0; k < 3; k++) out[k] = (float)(n == 1 ? v[0] : v[k]);
  return PX_OK;
}

// An s3:// path is checked when the data layer opens it (data/s3.h), with
// the store's own answer (NoSuchKey, credentials ...) in the message.
static bool path_exists(const char *p) {
  struct stat sb;
  return strncmp(p, "s3://", 5) == 0 || stat(p, &sb) == 0;
}

px_status px_config_validate(const px_config *c, int commands) {
  const char *src = c->data;
  if (!*c->data_path) return px_error(PX_ERR_INVALID, "--data-path (data.path) is empty: where is the training data?");
  bool is_glob = strpbrk(c->data_path, "*?[") != NULL;
  if (!is_glob && !path_exists(c->data_path))
    return px_error(PX_ERR_NOT_FOUND, "--data-path (data.path): %s does not exist", c->data_path);
  if (*c->val_path && !strpbrk(c->val_path, "*?[") && !path_exists(c->val_path))
    return px_error(PX_ERR_NOT_FOUND, "--val-path (data.val_path): %s does not exist", c->val_path);
  if (*c->stage && strcmp(src, "mnist") != 0 && strcmp(src, "tokens") != 0 && strcmp(src, "text") != 0 &&
      strcmp(src, "hdf5") != 0 && strcmp(src, "images") != 0 && strcmp(src, "imagenet") != 0)
    return px_error(PX_ERR_UNSUPPORTED,
                    "--stage (data.stage): --data %s is not staged; staging covers mnist (IDX "
                    "files), tokens (shards), text, hdf5, images and imagenet (the listing and its images)",
                    src);
  if (strcmp(src, "imagenet") == 0 && !*c->synsets)
    return px_error(PX_ERR_INVALID, "--data imagenet needs --synsets (LOC_synset_mapping.txt)");
  if (*c->synsets && !path_exists(c->synsets))
    return px_error(PX_ERR_NOT_FOUND, "--synsets (data.synsets): %s does not exist", c->synsets);
  if (*c->vocab && !path_exists(c->vocab) && !(commands & CFG_TRAIN && strcmp(src, "text") == 0))
    return px_error(PX_ERR_NOT_FOUND, "--vocab (data.vocab): %s does not exist", c->vocab);
  float tmp[3];
  if (*c->mean && px_config_floats3(c->mean, "--mean (data.mean)", tmp) != PX_OK) return PX_ERR_INVALID;
  if (*c->std && px_config_floats3(c->std, "--std (data.std)", tmp) != PX_OK) return PX_ERR_INVALID;
  if (*c->std)
    for (int k = 0; k < 3; k++)
      if (!(tmp[k] > 0))
        return px_error(PX_ERR_INVALID, "--std (data.std): every value must be > 0, got \"%s\"", c->std);
  if (c->n_embd % c->n_head != 0)
    return px_error(PX_ERR_INVALID, "--n-embd %lld is not divisible by --n-head %lld", (long long)c->n_embd,
                    (long long)c->n_head);
  if (commands & CFG_TRAIN) {
    px_recompute r;
    if (px_recompute_parse(c->recompute, &r) != PX_OK)
      return px_error_wrap(PX_ERR_INVALID, "--recompute (train.recompute)");
    const bool has_blocks = strcmp(c->model, "gpt") == 0 || strncmp(c->model, "resnet", 6) == 0;
    if (r.kind != PX_RECOMPUTE_NONE && !has_blocks)
      return px_error(PX_ERR_INVALID,
                      "--recompute %s: --model %s has no blocks to recompute; it applies to gpt, "
                      "resnet and resnet18",
                      c->recompute, c->model);
  }
  if (c->image_channels != 1 && c->image_channels != 3)
    return px_error(PX_ERR_INVALID, "--image-channels (data.image_channels) must be 1 or 3, got %lld",
                    (long long)c->image_channels);
  if ((commands & CFG_TRAIN) && strcmp(c->resume, "auto") == 0 && !*c->ckpt_dir && !*c->out)
    return px_error(PX_ERR_INVALID, "--resume auto needs --ckpt-dir or --out (where the checkpoints are)");
  if ((commands & CFG_TRAIN) && *c->resume && strcmp(c->resume, "auto") != 0 && !path_exists(c->resume))
    return px_error(PX_ERR_NOT_FOUND, "--resume (checkpoint.resume): %s does not exist", c->resume);
  if ((commands & CFG_TRAIN) && *c->init && !path_exists(c->init))
    return px_error(PX_ERR_NOT_FOUND, "--init (model.init): %s does not exist", c->init);
  if ((commands & CFG_TRAIN) && (c->zero < 0 || c->zero > 3))
    return px_error(PX_ERR_INVALID,
                    "--zero (parallel.zero) %lld: there is no such ZeRO stage; use 0 (DDP), 1 (shard "
                    "the optimizer state), 2 (and the gradients) or 3 (and the parameters)",
                    (long long)c->zero);
  if ((commands & CFG_TRAIN) && c->pp > 1) {  // 3D: --dp × --tp × --pp (cmd_train_pp.c)
    if (c->zero == 3)
      return px_error(PX_ERR_UNSUPPORTED,
                      "--zero 3 with --pp %lld: ZeRO stage 3 (parameters gathered unit by unit) "
                      "does not combine with the pipeline's micro-batch slots; use --zero 1 or 2 (the optimizer "
                      "state sharded over dp), as Megatron-LM and torchtitan do",
                      (long long)c->pp);
    if (c->accum_steps > 1)
      return px_error(PX_ERR_INVALID,
                      "--accum-steps %lld with --pp %lld: a pipeline step already accumulates the "
                      "gradients of its --micro-batches; for the same step use --micro-batches %lld (%lld × %lld) "
                      "and a --batch-size %lld times larger",
                      (long long)c->accum_steps, (long long)c->pp, (long long)(c->micro_batches * c->accum_steps),
                      (long long)c->micro_batches, (long long)c->accum_steps, (long long)c->accum_steps);
    if (c->sequence_parallel)
      return px_error(PX_ERR_UNSUPPORTED,
                      "--sequence-parallel with --pp %lld: the pipeline sends whole (N, T, C) "
                      "activations between stages; sequence parallelism inside a stage is not built with --pp "
                      "(drop --sequence-parallel)",
                      (long long)c->pp);
  }
  if ((commands & CFG_TRAIN) && c->tp > 1) {
    if (strcmp(c->model, "gpt") != 0)
      return px_error(PX_ERR_INVALID,
                      "--tp (parallel.tp) %lld: tensor parallelism splits a GPT's layers; --model %s "
                      "has none to split (use --model gpt, or --tp 1)",
                      (long long)c->tp, c->model);
    if (c->n_head % c->tp != 0)
      return px_error(PX_ERR_INVALID,
                      "--tp (parallel.tp) %lld does not divide --n-head %lld: each tp rank holds "
                      "whole attention heads (choose tp among the divisors of %lld)",
                      (long long)c->tp, (long long)c->n_head, (long long)c->n_head);
    if (c->zero == 3)
      return px_error(PX_ERR_UNSUPPORTED,
                      "--zero 3 with --tp %lld: ZeRO stage 3 over a tensor-parallel mesh is not "
                      "built; use --zero 1 or 2",
                      (long long)c->tp);
    if (c->sequence_parallel && c->context % c->tp != 0)
      return px_error(PX_ERR_INVALID,
                      "--sequence-parallel: --context %lld is not a multiple of --tp %lld (each tp "
                      "rank holds context/tp positions)",
                      (long long)c->context, (long long)c->tp);
  }
  if ((commands & CFG_TRAIN) && *c->zero_unit && c->zero != 3)
    return px_error(PX_ERR_INVALID,
                    "--zero-unit (parallel.zero_unit) \"%s\" applies to --zero 3 only (this run: "
                    "--zero %lld)",
                    c->zero_unit, (long long)c->zero);
  if ((commands & CFG_TRAIN) && *c->zero_unit) {
    // NAME[,NAME...]: no empty names ("h.0,,h.1", a trailing comma).
    const char *p = c->zero_unit;
    for (;;) {
      const char *comma = strchr(p, ',');
      size_t len = comma ? (size_t)(comma - p) : strlen(p);
      if (len == 0)
        return px_error(PX_ERR_INVALID,
                        "--zero-unit (parallel.zero_unit) \"%s\": an empty module name; expected "
                        "NAME[,NAME...] such as \"h.0,h.1\"",
                        c->zero_unit);
      if (!comma) break;
      p = comma + 1;
    }
  }
  if ((commands & CFG_TRAIN) && c->sync_bn && strcmp(c->model, "cnn") != 0 && strncmp(c->model, "resnet", 6) != 0)
    return px_error(PX_ERR_INVALID,
                    "--sync-bn (model.sync_bn): --model %s has no batch norm to synchronize; it "
                    "applies to cnn, resnet and resnet18",
                    c->model);
  if ((commands & CFG_TRAIN) && c->sync_bn && c->pp > 1)
    return px_error(PX_ERR_UNSUPPORTED,
                    "--sync-bn with --pp %lld: a pipeline stage's batch norm has no data-parallel "
                    "peers; run without --sync-bn",
                    (long long)c->pp);
  if ((commands & CFG_TRAIN) && c->loss_spike_factor != 0 && c->loss_spike_factor <= 1)
    return px_error(PX_ERR_INVALID,
                    "--loss-spike-factor (train.loss_spike_factor) %g: expected 0 (off) or a factor "
                    "above 1 (a loss above F x its running mean stops the run)",
                    c->loss_spike_factor);
  if ((commands & CFG_TRAIN) && c->loss_spike_factor > 0 && c->pp > 1)
    return px_error(PX_ERR_UNSUPPORTED,
                    "--loss-spike-factor with --pp %lld: the pipeline's training loop has no "
                    "loss-spike guard (a loss that is not finite still stops it)",
                    (long long)c->pp);
  if (commands & CFG_TRAIN) {
    // The samples of a step, batch x micro-batches x data-parallel ranks, in a 64-bit count.
    const int64_t ranks = c->dp > c->threads ? c->dp : c->threads;
    int64_t samples;
    if (__builtin_mul_overflow(c->batch_size, c->accum_steps, &samples) ||
        __builtin_mul_overflow(samples, ranks, &samples))
      return px_error(PX_ERR_INVALID,
                      "--batch-size %lld x --accum-steps %lld x %lld ranks: more samples a step than "
                      "a 64-bit count holds (%lld)",
                      (long long)c->batch_size, (long long)c->accum_steps, (long long)ranks, (long long)INT64_MAX);
  }
  if (commands & (CFG_TRAIN | CFG_EVAL)) {
    const bool cuda = strcmp(c->device, "cuda") == 0;
    if (strcmp(c->precision, "bf16") == 0 && !cuda)
      return px_error(PX_ERR_UNSUPPORTED,
                      "--precision bf16 (train.precision): bf16 runs on the GPU only (--device "
                      "cuda); on the CPU plexus computes in f32 (--precision f32)");
    if ((commands & CFG_TRAIN) && strcmp(c->reduce_dtype, "bf16") == 0 && !cuda)
      return px_error(PX_ERR_UNSUPPORTED,
                      "--reduce-dtype bf16 (train.reduce_dtype): bf16 gradient reduction runs over NCCL "
                      "on the GPU (--device cuda); on the CPU gradients are summed in f32 (--reduce-dtype f32)");
    // What the GPU path does not cover (issue 15: data parallel, DDP over NCCL).
    const char *cpu_only = NULL;
    char what[96];
    px_recompute r = {0};
    if (!cuda || !(commands & CFG_TRAIN)) cpu_only = NULL;
    else if (c->zero > 0) cpu_only = (snprintf(what, sizeof what, "--zero %lld (ZeRO)", (long long)c->zero), what);
    else if (c->tp > 1) cpu_only = (snprintf(what, sizeof what, "--tp %lld (tensor parallel)", (long long)c->tp), what);
    else if (c->pp > 1)
      cpu_only = (snprintf(what, sizeof what, "--pp %lld (pipeline parallel)", (long long)c->pp), what);
    else if (px_recompute_parse(c->recompute, &r) == PX_OK && r.kind != PX_RECOMPUTE_NONE)
      cpu_only = (snprintf(what, sizeof what, "--recompute %s", c->recompute), what);
    else if (c->sync_bn) cpu_only = "--sync-bn";
    if (cpu_only)
      return px_error(PX_ERR_UNSUPPORTED,
                      "%s with --device cuda is not built: on GPUs plexus trains data parallel "
                      "with DDP over NCCL; drop %s, or train on the CPU (--device cpu)",
                      cpu_only, cpu_only);
    // Refusals that hold on any machine come first; then the hardware.
    const int gpus = cuda ? px_train_cuda_devices() : 1;
    if (gpus < 0)
      return px_error(PX_ERR_UNSUPPORTED,
                      "--device cuda (train.device): this plexus was built without CUDA (CMake "
                      "found no CUDA toolkit); rebuild where nvcc and the CUDA libraries are installed, or use "
                      "--device cpu");
    if (gpus == 0)
      return px_error(PX_ERR_UNSUPPORTED,
                      "--device cuda (train.device): no CUDA device is visible to this process "
                      "(no NVIDIA GPU, or no driver%s); use --device cpu",
                      getenv("CUDA_VISIBLE_DEVICES") ? ", or CUDA_VISIBLE_DEVICES hides them" : "");
  }
  if ((commands & CFG_TRAIN) && strcmp(c->schedule, "cosine") == 0 && c->min_lr > c->lr)
    return px_error(PX_ERR_INVALID, "--min-lr %g is above --lr %g", c->min_lr, c->lr);
  return PX_OK;
}

// Whether option d matters to this configuration: its help's prefix
// ("gpt: ...", "images/imagenet: ...", "--zero 3: ...") names what it
// applies to.  Options without such a prefix always apply.
static bool applies(const opt_def *d, const px_config *c) {
  const char *h = d->help;
  const char *colon = strchr(h, ':');
  if (!colon || colon - h > 24) return true;
  char pre[32];
  snprintf(pre, sizeof pre, "%.*s", (int)(colon - h), h);
  const char *model = c->model, *data = c->data, *optim = c->optim;
  if (strcmp(pre, "mlp") == 0) return strcmp(model, "mlp") == 0;
  if (strcmp(pre, "cnn") == 0) return strcmp(model, "cnn") == 0;
  if (strcmp(pre, "resnet") == 0) return strncmp(model, "resnet", 6) == 0;
  if (strcmp(pre, "cnn/resnet") == 0) return strcmp(model, "cnn") == 0 || strncmp(model, "resnet", 6) == 0;
  if (strcmp(pre, "gpt") == 0) return strcmp(model, "gpt") == 0;
  if (strcmp(pre, "images") == 0 || strcmp(pre, "images/imagenet") == 0)
    return strcmp(data, "images") == 0 || strcmp(data, "imagenet") == 0;
  if (strcmp(pre, "imagenet") == 0) return strcmp(data, "imagenet") == 0;
  if (strcmp(pre, "tokens/text") == 0) return strcmp(data, "tokens") == 0 || strcmp(data, "text") == 0;
  if (strcmp(pre, "text") == 0) return strcmp(data, "text") == 0;
  if (strcmp(pre, "hdf5") == 0) return strcmp(data, "hdf5") == 0;
  if (strcmp(pre, "sgd") == 0) return strcmp(optim, "sgd") == 0;
  if (strcmp(pre, "adam/adamw") == 0) return strcmp(optim, "sgd") != 0;
  if (strcmp(pre, "step schedule") == 0) return strcmp(c->schedule, "step") == 0;
  if (strcmp(pre, "cosine schedule") == 0) return strcmp(c->schedule, "cosine") == 0;
  if (strcmp(pre, "--zero 3") == 0) return c->zero == 3;
  if (strcmp(pre, "--pp") == 0) return c->pp > 1;
  if (strcmp(pre, "--tp > 1") == 0) return c->tp > 1;
  if (strcmp(pre, "--stage") == 0) return *c->stage != 0;
  return true;
}

static char *to_json(const px_config *c, int commands, bool only_applicable) {
  cJSON *root = cJSON_CreateObject();
  if (!root) return NULL;
  px_config *cc = (px_config *)c;
  for (int i = 0; i < N_OPTS; i++) {
    const opt_def *d = &opts[i];
    if (!(d->commands & commands)) continue;
    // --overwrite is this invocation's decision: a config fed back with
    // --config must not delete another run.
    if (d->offset == F(overwrite)) continue;
    if (only_applicable && !applies(d, c)) continue;
    cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, d->section);
    if (!sec) sec = cJSON_AddObjectToObject(root, d->section);
    if (!sec) break;
    switch (d->type) {
    case T_STR: cJSON_AddStringToObject(sec, d->key, *str_at(cc, d)); break;
    case T_INT: cJSON_AddNumberToObject(sec, d->key, (double)*int_at(cc, d)); break;
    case T_NUM: cJSON_AddNumberToObject(sec, d->key, *num_at(cc, d)); break;
    case T_BOOL: cJSON_AddBoolToObject(sec, d->key, *bool_at(cc, d)); break;
    }
  }
  char *s = cJSON_Print(root);
  cJSON_Delete(root);
  return s;
}

char *px_config_to_json(const px_config *c, int commands) { return to_json(c, commands, false); }

char *px_config_to_json_applicable(const px_config *c, int commands) { return to_json(c, commands, true); }

void px_config_print_help(FILE *f, int commands) {
  const char *last = "";
  for (int i = 0; i < N_OPTS; i++) {
    const opt_def *d = &opts[i];
    if (!(d->commands & commands)) continue;
    if (strcmp(d->section, last) != 0) {
      fprintf(f, "\n%s:\n", d->section);
      last = d->section;
    }
    char left[64];
    const char *arg = d->type == T_BOOL ? "" : d->choices ? " WHICH" : d->type == T_STR ? " VALUE" : " N";
    snprintf(left, sizeof left, "  --%s%s", d->flag, arg);
    fprintf(f, "%-26s %s", left, d->help);
    if (d->choices) fprintf(f, " [%s]", d->choices);
    if (d->type == T_BOOL) fprintf(f, " (--no-%s to turn off; default %s)", d->flag, d->def);
    else if (*d->def) fprintf(f, " (default %s)", d->def);
    fprintf(f, "   [%s.%s]\n", d->section, d->key);
  }
}
