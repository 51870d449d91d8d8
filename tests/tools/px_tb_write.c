/* px_tb_write — writes a TensorBoard event file with known scalars into the
 * directory argv[1], for tests/test_tensorboard_events_decode_with_protoc.py.
 * Steps s = 1..3: train/loss = 1/s, train/lr = 0.01*s, train/grad_norm = s+0.5,
 * train/samples_per_s = 100*s; eval at step 3: eval/loss = 0.25,
 * eval/accuracy = 0.75, perplexity NAN (must be skipped);
 * px_log_scalar("custom/x", 7, -2.5).
 * `px_tb_write DIR hparams` writes instead only the HParams record of
 * px_log_hparams for HPARAMS_JSON below, group "grp", for
 * tests/test_tensorboard_hparams_records_decode.py. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plexus/plexus.h"

#define HPARAMS_JSON                                                                       \
  "{\"model\":{\"name\":\"cnn\",\"width\":32},\"optim\":{\"lr\":0.002,\"nesterov\":true}," \
  "\"data\":{\"path\":null,\"mean\":[0.5,0.25]},\"seed\":-3}"

int main(int argc, char **argv) {
  if (argc != 2 && !(argc == 3 && strcmp(argv[2], "hparams") == 0)) {
    fprintf(stderr, "usage: px_tb_write DIR [hparams]\n");
    return 2;
  }
  px_logger *l = NULL;
  px_logger_opts o = {.rank = 0, .console = false, .progress = 0, .tensorboard_dir = argv[1]};
  px_status s = px_logger_create(&l, &o);
  if (argc == 3) {
    if (s == PX_OK) s = px_log_hparams(l, HPARAMS_JSON, "grp");
    /* Not an object: refused, nothing written. */
    if (s == PX_OK && px_log_hparams(l, "[1,2]", NULL) != PX_ERR_INVALID) {
      fprintf(stderr, "px_tb_write: px_log_hparams accepted a JSON array\n");
      s = PX_ERR_INTERNAL;
    }
    px_logger_free(l);
    if (s != PX_OK) {
      fprintf(stderr, "px_tb_write: %s: %s\n", px_status_name(s), px_last_error());
      return 1;
    }
    return 0;
  }
  for (int i = 1; i <= 3 && s == PX_OK; i++) {
    px_step_metrics m = {.step = i,
                         .total_steps = 3,
                         .epoch = 0,
                         .total_epochs = 1,
                         .loss = 1.0 / i,
                         .lr = 0.01 * i,
                         .grad_norm = i + 0.5,
                         .samples_per_s = 100.0 * i,
                         .eta_s = 0};
    s = px_log_step(l, &m);
  }
  px_eval_metrics e = {.step = 3, .epoch = 0, .loss = 0.25, .accuracy = 0.75, .perplexity = NAN, .samples = 10};
  if (s == PX_OK) s = px_log_eval(l, &e);
  if (s == PX_OK) s = px_log_scalar(l, "custom/x", 7, -2.5);
  if (s == PX_OK) s = px_logger_flush(l);
  px_logger_free(l);
  if (s != PX_OK) {
    fprintf(stderr, "px_tb_write: %s: %s\n", px_status_name(s), px_last_error());
    return 1;
  }
  return 0;
}
