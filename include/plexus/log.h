/* plexus/log.h — the log layer: console progress, JSONL, TensorBoard event
 * files and user hooks.  Only rank 0 writes; every other rank gets a logger
 * whose calls succeed and do nothing, so training code calls it unguarded.
 * Files are appended and flushed per record: a killed run leaves every
 * complete record readable.  See docs/LOGGING.md. */
#ifndef PLEXUS_LOG_H
#define PLEXUS_LOG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "plexus/base.h"

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

typedef struct px_logger px_logger;

typedef struct px_logger_opts {
  int rank;                    /* only rank 0 writes anything; other ranks get a logger that does nothing */
  bool console;                /* lines/progress on stdout */
  int progress;                /* -1: a live bar if stdout is a terminal (TERM not dumb) and no launcher's variables
                                  (OMPI_COMM_WORLD_SIZE, PMI_*, PMIX_RANK, SLURM_PROCID) are set, else plain
                                  lines; 0: lines; 1: bar */
  const char *jsonl_path;      /* NULL: none.  One JSON object per line, flushed per record */
  const char *tensorboard_dir; /* NULL: none.  events.out.tfevents.<secs>.<host>.<pid> inside it (created) */
  const char *run_name;        /* shown in the console header */
  FILE *console_stream;        /* NULL: stdout.  Tests point it at a file. */
} px_logger_opts;

typedef struct px_step_metrics {
  int64_t step, total_steps; /* optimizer steps */
  int64_t epoch, total_epochs;
  double loss, lr, grad_norm;
  double samples_per_s; /* global, all ranks */
  double eta_s;
} px_step_metrics;

typedef struct px_eval_metrics {
  int64_t step, epoch;
  double loss, accuracy; /* accuracy NAN when not a classifier */
  double perplexity;     /* NAN unless a language model */
  int64_t samples;
} px_eval_metrics;

typedef struct px_log_hooks {
  void (*on_step)(const px_step_metrics *m, void *user);
  void (*on_epoch)(int64_t epoch, int64_t step, void *user);
  void (*on_eval)(const px_eval_metrics *m, void *user);
  void *user;
} px_log_hooks;

#define PX_LOG_MAX_HOOKS 16

/* A logger for opts (on ranks other than 0 one that does nothing); free with px_logger_free. */
px_status px_logger_create(px_logger **out, const px_logger_opts *opts);
/* Hooks are called in the order added, on rank 0 only. */
px_status px_log_add_hooks(px_logger *l, const px_log_hooks *h);
/* console line/bar + JSONL + TB scalars train/loss, train/lr,
 * train/grad_norm, train/samples_per_s; then hooks. */
px_status px_log_step(px_logger *l, const px_step_metrics *m);
/* The live bar only (a terminal, --progress bar): redraws it for a step
 * between px_log_step's records, at most ~10 times a second; fields that
 * are NAN keep the last record's values.  Writes no file, calls no hook;
 * does nothing with plain lines. */
px_status px_log_progress(px_logger *l, const px_step_metrics *m);
/* eval/loss, eval/accuracy, eval/perplexity (NAN ones skipped). */
px_status px_log_eval(px_logger *l, const px_eval_metrics *m);
px_status px_log_epoch(px_logger *l, int64_t epoch, int64_t step);
px_status px_log_scalar(px_logger *l, const char *tag, int64_t step, double value);
/* The run's hyperparameters for TensorBoard's HParams tab: one
 * "_hparams_/session_start_info" record (the HParams plugin's
 * SessionStartInfo: every scalar of the JSON object `json_object`, nested
 * objects flattened with "." (e.g. the "train.lr" of plexus's config.json),
 * arrays as their JSON text; group_name `group` (NULL or "": none),
 * start_time_secs now).  Nothing without a TensorBoard directory or on
 * ranks other than 0; PX_ERR_INVALID when json_object is not an object. */
px_status px_log_hparams(px_logger *l, const char *json_object, const char *group);
/* A console line (rank 0); ends an active bar line first. */
px_status px_log_text(px_logger *l, const char *fmt, ...)
#if defined(__GNUC__)
  __attribute__((format(printf, 2, 3)))
#endif
  ;
/* Flush the console, JSONL and TensorBoard files; px_logger_free closes them and frees l. */
px_status px_logger_flush(px_logger *l);
void px_logger_free(px_logger *l);

/* CRC-32C (Castagnoli), as TensorBoard's record framing uses it. */
uint32_t px_crc32c(uint32_t crc, const void *data, size_t n);
/* TensorBoard's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t px_crc32c_masked(const void *data, size_t n);

#pragma GCC visibility pop

#endif
