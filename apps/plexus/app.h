/* app.h — what the plexus subcommands share: opening the configured data,
 * building the configured model, and the subcommands themselves. */
#ifndef PX_APP_H
#define PX_APP_H

#include "config.h"
#include <plexus/zoo.h>

/* A dataset opened from the config, with what owns it. */
typedef struct px_app_data {
  px_dataset *set;  /* what to iterate (a subset view, or base itself) */
  px_dataset *base; /* the source */
  px_vocab *vocab;  /* text/tokens: the vocabulary, when there is one */
} px_app_data;

/* What the model needs to know about the data. */
typedef struct px_data_shape {
  int channels, height, width; /* images */
  size_t classes;              /* classifiers */
  size_t vocab_size;           /* language models */
  bool tokens;                 /* a token stream (language model) */
} px_data_shape;

/* The training split (train = true: augmentation on) or the held-out one.
 * The held-out split may be absent: *out->set == NULL and PX_OK.  The
 * vocabulary of a text corpus is built from the training file when none
 * is given; vocab_out (may be NULL) is where to save it. */
px_status px_app_open_data(const px_config *c, bool train, const char *vocab_out, px_app_data *out);
void px_app_data_free(px_app_data *d);

/* --stage (data.stage): the configuration with its data paths pointing
 * into the node-local copy.  Collective over comm (px_stage_source, and
 * px_stage_images for --data images / imagenet: local rank 0 of each node
 * copies, the others wait).  out->cfg is a shallow copy of c whose
 * data_path and val_path point into *out (images: the staged listings,
 * image_root and val_image_root "" since a staged listing's directory is
 * its root, synsets the staged mapping); local rank 0 prints one line per
 * source saying what it copied and reused (unless --quiet). */
typedef struct px_app_staged {
  px_config cfg;
  char data_path[4096], val_path[4096], synsets[4096];
  char no_root[1]; /* "" */
} px_app_staged;
px_status px_app_stage_data(px_comm *comm, const px_config *c, px_app_staged *out);
px_status px_app_data_shape(const px_config *c, const px_app_data *d, px_data_shape *out);

/* The configured model of the zoo for data of this shape (not yet a
 * px_model). */
px_status px_app_build_model(const px_config *c, const px_data_shape *shape, px_module **out);

/* A checkpoint directory, or the newest good one in a directory of them,
 * into `resolved`; note (may be NULL) receives what was skipped. */
px_status px_app_resolve_checkpoint(const char *path, char *resolved, size_t cap, char *note, size_t note_cap);
/* Set c from the config saved in a checkpoint's state.json (options of
 * `commands` only); *step receives the checkpoint's step. */
px_status px_app_checkpoint_config(const char *ckpt, px_config *c, int commands, int64_t *step);
/* The run directory of plexus train --out (rank 0 only; the caller shares
 * the verdict): takes DIR/.plexus.lock (flock, held while *lock_fd is open;
 * it records this host and process), refuses when another run holds it
 * (naming that run's host and process), and when DIR already holds a run
 * (checkpoints, metrics.jsonl records, TensorBoard events) unless `resume`,
 * or `overwrite`: the old run's files are then moved aside and deleted
 * before anything is written. */
px_status px_app_run_dir_claim(const char *dir, bool resume, bool overwrite, int *lock_fd);
void px_app_run_dir_release(int lock_fd);
/* Find "--checkpoint X" / "--checkpoint=X" in argv (NULL if absent). */
const char *px_app_find_option(int argc, char **argv, const char *flag);

/* Subcommands: argv[0] is the subcommand's name.  Return the exit code. */
int px_cmd_train(int argc, char **argv);
int px_cmd_eval(int argc, char **argv);
int px_cmd_inspect(int argc, char **argv);
int px_cmd_checkpoint(int argc, char **argv);
int px_cmd_tokenize(int argc, char **argv);
int px_cmd_generate(int argc, char **argv);
int px_cmd_schedule(int argc, char **argv);
/* Built only with cairo (PX_HAVE_CAIRO). */
int px_cmd_plot(int argc, char **argv);

/* plexus train --pp P (cmd_train_pp.c): this rank's part of the pipeline,
 * run with the options and logger options of the normal path; *res filled
 * as px_train fills it (the caller reports it). */
px_status px_app_train_pp(px_comm *comm, const px_config *c, const px_train_opts *o, const px_logger_opts *log_opts,
                          px_train_result *res);

/* Checkpoints of plexus train --pp (pp_checkpoint.c; the tensors are
 * px_pp_checkpoint_save/_load's).  The position a checkpoint saves: the
 * next step, its epoch and first batch (of --batch-size samples: a
 * pipeline step is one loader batch), the samples trained on. */
typedef struct px_app_pp_ckpt {
  int64_t step, epoch, next_batch, batches_per_epoch, samples;
  int64_t last_step; /* of the last checkpoint written or resumed (-1: none) */
  char path[512];    /* its path */
} px_app_pp_ckpt;
/* Save at k's position into o->ckpt_dir (none: nothing; nor when k->step
 * was just saved), with state.json (rank 0); collective. */
px_status px_app_pp_save(px_comm *comm, const px_mesh *mesh, const px_config *c, const px_train_opts *o, px_pp *pp,
                         px_logger *log, px_app_pp_ckpt *k);
/* --resume auto|DIR (a checkpoint of any layout: this pipeline, another P,
 * DDP, ZeRO, tensor parallel) into pp and k's position (k->batches_per_epoch
 * set by the caller), or --init CKPT (the weights only); nothing without
 * either, or with --resume auto and no checkpoint yet.  Collective. */
px_status px_app_pp_resume(px_comm *comm, const px_mesh *mesh, const px_config *c, const px_train_opts *o, px_pp *pp,
                           px_logger *log, px_app_pp_ckpt *k);

/* Print "plexus <cmd>: <px_last_error()>" on stderr and return 1. */
int px_app_fail(const char *cmd);

#endif
