/* config.h — the plexus command's configuration: one table of options,
 * each with its JSON key (section.key), its long option, type, default,
 * range and help.  A JSON config file sets any of them; long options
 * override the file; the effective configuration prints and saves as JSON
 * of the same shape, so a saved one can be fed back with --config. */
#ifndef PX_APP_CONFIG_H
#define PX_APP_CONFIG_H

#include <plexus/plexus.h>
#include <stdio.h>

typedef struct px_config {
  /* run */
  char *out;
  /* model */
  char *model;
  int64_t hidden, depth, channels, width, blocks;
  int64_t n_layer, n_head, n_embd, context, vocab_size;
  double dropout;
  char *init;
  /* data */
  char *data;
  char *data_path, *val_path, *image_root, *val_image_root, *synsets;
  int64_t image_channels, resize, crop;
  bool random_crop, hflip;
  char *mean, *std;
  char *tokenizer, *vocab;
  char *h5_layout, *h5_x, *h5_y; /* --data hdf5: layout and dataset names */
  int64_t batch_size, workers, prefetch, train_subset, val_subset;
  bool skip_bad;
  char *stage, *stage_verify; /* data.stage: node-local copy directory ("": none); data.stage_verify: full|size */
  /* optim */
  char *optim;
  double lr, momentum, weight_decay, beta1, beta2, eps;
  bool nesterov;
  char *schedule;
  int64_t warmup_steps, step_size;
  double gamma, min_lr, clip_grad, label_smoothing;
  /* train */
  int64_t epochs, steps, stop_at_step, accum_steps, eval_every, eval_batches, log_every;
  int64_t seed;
  char *recompute;          /* train.recompute: none|full|selective|every:K */
  double loss_spike_factor; /* train.loss_spike_factor: 0 off (px_train_opts) */
  /* parallel */
  char *backend;
  int64_t threads, num_threads;
  double bucket_mb, timeout;
  int64_t zero;              /* ZeRO stage: 0 = DDP */
  int64_t pp, micro_batches; /* pipeline stages (ranks) and micro-batches per step (cmd_train_pp.c) */
  char *schedule_pp;         /* gpipe|1f1b|interleaved */
  char *zero_unit; /* stage-3 units, "h.0,h.1" ("": a GPT's blocks, a ResNet's stages, else the root's children) */
  bool zero_prefetch, zero_reshard;
  int64_t dp, tp; /* the mesh: dp 0 = world / tp */
  bool sequence_parallel;
  /* checkpoint */
  char *ckpt_dir;
  int64_t ckpt_every, keep_last;
  char *resume;
  /* log */
  char *jsonl, *tensorboard, *progress;
  bool quiet;
  /* eval and generate */
  char *checkpoint, *split;
  /* generate (plexus generate) */
  char *prompt;
  int64_t tokens, top_k;
  double temperature;
  /* issue 16 */
  bool overwrite; /* run.overwrite: --out holding a run is cleared first */
  bool sync_bn;   /* model.sync_bn: batch norm statistics over the data-parallel ranks */
  /* issue 15 */
  char *device;       /* train.device: cpu|cuda */
  char *precision;    /* train.precision: f32|bf16 (bf16 on cuda only) */
  char *reduce_dtype; /* train.reduce_dtype: f32|bf16 (bf16 on cuda only): DDP's gradient sums */
  /* Which options were given (file or command line), by table index. */
  unsigned char given[128];
} px_config;

/* Which commands an option belongs to (a mask): --help lists per command. */
enum { CFG_TRAIN = 1, CFG_EVAL = 2, CFG_GENERATE = 4 };

void px_config_defaults(px_config *c);
void px_config_free(px_config *c);
/* Parse argv[first..argc): "--config FILE" is read first (wherever it is),
 * then every other option in order.  Errors name the option or the file
 * and key, and say what was expected.  `commands` is the mask of the
 * running command: options of other commands are refused. */
px_status px_config_parse(px_config *c, int argc, char **argv, int first, int commands);
/* Set options from JSON text (a config file, or the config saved in a
 * checkpoint).  `name` is used in messages. */
px_status px_config_load_json(px_config *c, const char *text, size_t n, const char *name, int commands);
/* Checks across options (ranges, files that must exist, combinations). */
px_status px_config_validate(const px_config *c, int commands);
/* The effective configuration as JSON, sections as objects (malloc'ed). */
char *px_config_to_json(const px_config *c, int commands);
/* --print-config: the effective configuration with only what applies to
 * this model, data, optimizer and parallel layout (an option whose help
 * starts "gpt:" is left out for a CNN, "--zero 3:" without --zero 3, ...). */
char *px_config_to_json_applicable(const px_config *c, int commands);
/* --help text for a command. */
void px_config_print_help(FILE *f, int commands);
/* Set the option with this JSON key back to its default, as not given
 * (a checkpoint's saved train.device does not choose plexus eval's). */
px_status px_config_reset(px_config *c, const char *key);
/* Whether the option with this JSON key ("optim.lr") was given. */
bool px_config_given(const px_config *c, const char *key);

/* Parse "a,b,c" or "a" (repeated) into three floats. */
px_status px_config_floats3(const char *s, const char *what, float out[3]);

#endif
