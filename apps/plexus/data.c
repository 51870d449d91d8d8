// Opening the configured data (app.h): one place maps --data and its
// options onto the data layer's sources (data.h).
#include "app.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void px_app_data_free(px_app_data *d) {
  if (d->set && d->set != d->base) px_dataset_free(d->set);
  px_dataset_free(d->base);
  px_vocab_free(d->vocab);
  memset(d, 0, sizeof *d);
}

// The directory part of a path ("." when there is none).
static void dir_of(const char *path, char *out, size_t cap) {
  const char *slash = strrchr(path, '/');
  if (!slash) snprintf(out, cap, ".");
  else if (slash == path) snprintf(out, cap, "/");
  else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

static px_status open_images(const px_config *c, bool train, const char *csv, px_dataset **out) {
  px_image_opts io = PX_IMAGE_DEFAULTS;
  char root[1024];
  io.csv = csv;
  const char *given_root = !train && *c->val_image_root ? c->val_image_root : c->image_root;
  if (*given_root) {
    snprintf(root, sizeof root, "%s", given_root);
  } else {
    dir_of(csv, root, sizeof root);
  }
  io.root = root;
  io.layout = strcmp(c->data, "imagenet") == 0 ? PX_CSV_IMAGENET : PX_CSV_PATH_LABEL;
  io.synsets = *c->synsets ? c->synsets : NULL;
  io.channels = (int)c->image_channels;
  io.resize = (int)c->resize;
  io.crop = (int)c->crop;
  io.random_crop = train && c->random_crop;
  io.hflip = train && c->hflip;
  float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  if (*c->mean && px_config_floats3(c->mean, "--mean", mean) != PX_OK) return PX_ERR_INVALID;
  if (*c->std && px_config_floats3(c->std, "--std", std) != PX_OK) return PX_ERR_INVALID;
  memcpy(io.mean, mean, sizeof mean);
  memcpy(io.std, std, sizeof std);
  return px_image_dataset_open(out, &io);
}

// --data hdf5: one file (--data-path, or --val-path for held-out data) with
// the datasets --h5-x and --h5-y in the layout --h5-layout (data.h).
static px_status open_hdf5(const px_config *c, bool train, px_vocab **vocab, px_dataset **out) {
  px_hdf5_opts o = PX_HDF5_DEFAULTS;
  const bool tokens = strcmp(c->h5_layout, "tokens") == 0;
  o.path = train ? c->data_path : c->val_path;
  o.layout = tokens ? PX_HDF5_TOKENS : PX_HDF5_IMAGES;
  o.x = *c->h5_x ? c->h5_x : tokens ? "tokens" : "images";
  o.y = c->h5_y;
  if (*c->mean && px_config_floats3(c->mean, "--mean", o.mean) != PX_OK) return PX_ERR_INVALID;
  if (*c->std && px_config_floats3(c->std, "--std", o.std) != PX_OK) return PX_ERR_INVALID;
  if (tokens) {
    if (*c->vocab) {
      px_status st = px_vocab_load(vocab, c->vocab);
      if (st != PX_OK) return st;
    }
    o.T = c->context;
    o.random_offset = train;  // as --data tokens: random window offsets for training
    o.vocab_size = c->vocab_size > 0 ? (size_t)c->vocab_size : *vocab ? px_vocab_size(*vocab) : 0;
  }
  return px_hdf5_dataset_open(out, &o);
}

static px_status open_vocab(const px_config *c, const char *vocab_out, px_vocab **out) {
  *out = NULL;
  if (strcmp(c->data, "text") == 0 && strcmp(c->tokenizer, "byte") == 0) return px_vocab_byte(out);
  if (*c->vocab) return px_vocab_load(out, c->vocab);
  if (strcmp(c->data, "tokens") == 0) return PX_OK;  // the size then comes from --vocab-size ... or the model
  // A word-level vocabulary from the training text, saved beside the run.
  px_status st = px_vocab_build(out, c->data_path);
  if (st == PX_OK && vocab_out) st = px_vocab_save(*out, vocab_out);
  if (st != PX_OK) {
    px_vocab_free(*out);
    *out = NULL;
  }
  return st;
}

static px_stage_verify stage_verify(const px_config *c) {
  return strcmp(c->stage_verify, "size") == 0 ? PX_STAGE_VERIFY_SIZE : PX_STAGE_VERIFY_FULL;
}

// Local rank 0's line saying what staging `source` did.
static void stage_said(px_comm *comm, const px_config *c, const char *source, const px_stage_result *res) {
  if (px_comm_local_rank(comm) != 0 || c->quiet) return;
  const px_stage_result r = *res;
  const double mb = (double)r.bytes_copied / 1e6;
  printf("plexus train: stage: rank %d (local rank 0): %s: copied %zu of %zu files (%.1f MB in %.2f s, %.0f MB/s), "
         "reused %zu, damaged %zu (copied again), into %s\n",
         px_comm_rank(comm), source, r.copied, r.files, mb, r.seconds, r.seconds > 0 ? mb / r.seconds : 0.0, r.reused,
         r.damaged, r.dir);
  fflush(stdout);
}

// One source: stage it, point *path at the copy, say what happened.
static px_status stage_one(px_comm *comm, const px_config *c, const char *source, char *staged, size_t cap) {
  px_stage_result r;
  px_status st = px_stage_source(comm, c->stage, c->data, source, stage_verify(c), staged, cap, &r);
  if (st == PX_OK) stage_said(comm, c, source, &r);
  return st;
}

// An image listing (training or held-out), its images and the synset
// mapping: the staged listing into csv_out (its directory is the staged
// root), the staged mapping into out->synsets.
static px_status stage_listing(px_comm *comm, const px_config *c, bool train, char *csv_out, size_t cap,
                               px_app_staged *out) {
  px_image_opts o = PX_IMAGE_DEFAULTS;
  o.csv = train ? c->data_path : c->val_path;
  const char *root = !train && *c->val_image_root ? c->val_image_root : c->image_root;  // as open_images reads it
  o.root = *root ? root : NULL;
  o.layout = strcmp(c->data, "imagenet") == 0 ? PX_CSV_IMAGENET : PX_CSV_PATH_LABEL;
  o.synsets = *c->synsets ? c->synsets : NULL;
  px_staged_images staged;
  px_stage_result r;
  px_status st = px_stage_images(comm, c->stage, &o, stage_verify(c), &staged, &r);
  if (st != PX_OK) return st;
  snprintf(csv_out, cap, "%s", staged.csv);
  if (*staged.synsets) snprintf(out->synsets, sizeof out->synsets, "%s", staged.synsets);
  stage_said(comm, c, o.csv, &r);
  return PX_OK;
}

px_status px_app_stage_data(px_comm *comm, const px_config *c, px_app_staged *out) {
  out->cfg = *c;
  if (strcmp(c->data, "images") == 0 || strcmp(c->data, "imagenet") == 0) {
    out->no_root[0] = '\0';
    px_status st = stage_listing(comm, c, true, out->data_path, sizeof out->data_path, out);
    if (st == PX_OK && *c->val_path) st = stage_listing(comm, c, false, out->val_path, sizeof out->val_path, out);
    if (st != PX_OK) return st;
    out->cfg.data_path = out->data_path;
    if (*c->val_path) out->cfg.val_path = out->val_path;
    out->cfg.image_root = out->cfg.val_image_root = out->no_root;
    if (*out->synsets) out->cfg.synsets = out->synsets;
    return PX_OK;
  }
  px_status st = stage_one(comm, c, c->data_path, out->data_path, sizeof out->data_path);
  if (st != PX_OK) return st;
  out->cfg.data_path = out->data_path;
  if (*c->val_path) {
    st = stage_one(comm, c, c->val_path, out->val_path, sizeof out->val_path);
    if (st != PX_OK) return st;
    out->cfg.val_path = out->val_path;
  }
  return PX_OK;
}

px_status px_app_open_data(const px_config *c, bool train, const char *vocab_out, px_app_data *out) {
  memset(out, 0, sizeof *out);
  const char *src = c->data;
  px_status st = PX_OK;
  float mean[3] = {0.2860f, 0.2860f, 0.2860f}, std[3] = {0.3530f, 0.3530f, 0.3530f};
  if (strcmp(src, "mnist") == 0) {
    if (*c->mean && px_config_floats3(c->mean, "--mean", mean) != PX_OK) return PX_ERR_INVALID;
    if (*c->std && px_config_floats3(c->std, "--std", std) != PX_OK) return PX_ERR_INVALID;
    if (train) {
      st = px_mnist_open(&out->base, c->data_path, "train", mean[0], std[0]);
    } else {
      const char *dir = *c->val_path ? c->val_path : c->data_path;
      st = px_mnist_open(&out->base, dir, "test", mean[0], std[0]);
    }
  } else if (strcmp(src, "images") == 0 || strcmp(src, "imagenet") == 0) {
    if (!train && !*c->val_path) return PX_OK;
    st = open_images(c, train, train ? c->data_path : c->val_path, &out->base);
  } else if (strcmp(src, "tokens") == 0 || strcmp(src, "text") == 0) {
    if (!train && !*c->val_path) return PX_OK;
    st = open_vocab(c, train ? vocab_out : NULL, &out->vocab);
    const char *path = train ? c->data_path : c->val_path;
    if (st == PX_OK && strcmp(src, "tokens") == 0) {
      size_t vocab = c->vocab_size > 0 ? (size_t)c->vocab_size : out->vocab ? px_vocab_size(out->vocab) : 0;
      st = px_token_dataset_open(&out->base, path, c->context, train, vocab);
    } else if (st == PX_OK) {
      st = px_text_dataset_open(&out->base, path, out->vocab, c->context, train);
    }
  } else if (strcmp(src, "hdf5") == 0) {
    if (!train && !*c->val_path) return PX_OK;
    st = open_hdf5(c, train, &out->vocab, &out->base);
  } else {
    st = px_error(PX_ERR_INVALID, "--data %s: unknown source", src);
  }
  if (st != PX_OK) {
    px_app_data_free(out);
    return st;
  }
  out->set = out->base;
  int64_t subset = train ? c->train_subset : c->val_subset;
  if (subset > 0 && (size_t)subset < out->base->length) {
    st = px_dataset_subset(&out->set, out->base, 0, (size_t)subset);
    if (st != PX_OK) {
      out->set = NULL;
      px_app_data_free(out);
      return st;
    }
  }
  return PX_OK;
}

px_status px_app_data_shape(const px_config *c, const px_app_data *d, px_data_shape *out) {
  memset(out, 0, sizeof *out);
  const px_dataset *s = d->base;
  if (s->x_dtype == PX_I32) {
    out->tokens = true;
    out->vocab_size = c->vocab_size > 0 ? (size_t)c->vocab_size : d->vocab ? px_vocab_size(d->vocab) : s->num_classes;
    if (out->vocab_size == 0)
      return px_error(PX_ERR_INVALID,
                      "--data %s: the vocabulary size is unknown: give --vocab (the vocabulary "
                      "file written with the shards) or --vocab-size",
                      c->data);
    return PX_OK;
  }
  if (s->x_ndim == 3) {
    out->channels = (int)s->x_shape[0];
    out->height = (int)s->x_shape[1];
    out->width = (int)s->x_shape[2];
  } else {
    out->channels = 1;
    out->height = 1;
    out->width = (int)(s->x_ndim >= 1 ? s->x_shape[0] : 1);
  }
  out->classes = s->num_classes;
  if (out->classes < 2)
    return px_error(PX_ERR_INVALID, "--data %s: found %zu class(es) in the labels; a classifier needs at least 2",
                    c->data, out->classes);
  return PX_OK;
}

px_status px_app_build_model(const px_config *c, const px_data_shape *s, px_module **out) {
  *out = NULL;
  const char *m = c->model;
  const bool lm = strcmp(m, "gpt") == 0;
  if (lm != s->tokens)
    return px_error(PX_ERR_INVALID, "--model %s does not fit --data %s: %s", m, c->data,
                    lm ? "a GPT reads token data (--data tokens or text)"
                       : "token data needs a language model (--model gpt)");
  const int classes = (int)s->classes;
  if (strcmp(m, "mlp") == 0) {
    *out = px_zoo_mlp(s->channels * s->height * s->width, (int)c->hidden, (int)c->depth, classes);
  } else if (strcmp(m, "cnn") == 0) {
    if (s->height % 4 || s->width % 4)
      return px_error(PX_ERR_INVALID, "--model cnn needs image sides divisible by 4, got %dx%d (use --resize/--crop)",
                      s->height, s->width);
    *out = px_zoo_cnn(s->channels, s->height, s->width, (int)c->channels, classes);
  } else if (strcmp(m, "resnet") == 0) {
    *out = px_zoo_resnet_small(s->channels, classes, (int)c->blocks, (int)c->width);
  } else if (strcmp(m, "resnet18") == 0) {
    *out = px_zoo_resnet18(s->channels, classes);
  } else if (lm) {
    px_gpt_config g = {.vocab_size = (int)s->vocab_size,
                       .context = (int)c->context,
                       .n_layer = (int)c->n_layer,
                       .n_head = (int)c->n_head,
                       .n_embd = (int)c->n_embd,
                       .dropout = (float)c->dropout};
    *out = px_zoo_gpt(&g);
  } else {
    return px_error(PX_ERR_INVALID, "--model %s: not in the zoo (mlp, cnn, resnet, resnet18, gpt)", m);
  }
  if (!*out) return px_error_wrap(PX_ERR_INVALID, "--model %s", m);
  // Activation checkpointing (train.recompute; other commands leave it "none").
  px_recompute r = {0};
  px_status st = c->recompute ? px_recompute_parse(c->recompute, &r) : PX_OK;
  if (st == PX_OK && r.kind != PX_RECOMPUTE_NONE)
    st = lm ? px_zoo_gpt_recompute(*out, r)
      : strncmp(m, "resnet", 6) == 0
      ? px_zoo_resnet_recompute(*out, r)
      : px_error(PX_ERR_INVALID, "--recompute: --model %s has no blocks to recompute", m);
  if (st != PX_OK) {
    px_module_free(*out);
    *out = NULL;
    return px_error_wrap(st, "--recompute %s", c->recompute);
  }
  return PX_OK;
}
