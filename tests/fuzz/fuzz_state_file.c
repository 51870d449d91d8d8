// libFuzzer target: a checkpoint's state.json (px_train_state_parse,
// src/train/state_file.c), what `--resume` reads before it trusts a
// checkpoint's position and layout.  Any bytes must give PX_OK or an error
// with a message; an accepted file's integers are in [0, 2^53] (what the
// resume arithmetic assumes: they multiply into sample counts), and the
// optimizer's name is a terminated string, empty unless it was one.  The seeds (corpus/state_file/) are a real
// DDP checkpoint's file, ZeRO-3 and tensor-parallel ones, one from before
// ZeRO, and near misses (a version 2, a step of 1e999 and one past 2^53:
// both were converted to int64_t out of range, undefined behaviour, before
// the parser bounded them).
#include "train/internal.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_EXACT 9007199254740992LL

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  px_train_state_file s;
  px_clear_error();
  px_status st = px_train_state_parse(data, size, "fuzz", &s);
  if (st != PX_OK) {
    if (!px_last_error()[0]) abort();  // an error must say what is wrong
    return 0;
  }
  const int64_t v[] = {s.step,       s.epoch,      s.next_batch,  s.forward_count, s.optimizer_step, s.param_count,
                       s.world_size, s.batch_size, s.accum_steps, s.zero_stage,    s.mesh_dp,        s.mesh_tp};
  for (size_t i = 0; i < sizeof v / sizeof *v; i++)
    if (v[i] < 0 || v[i] > MAX_EXACT) abort();
  if (memchr(s.optimizer, '\0', sizeof s.optimizer) == NULL) abort();
  if (!s.has_optimizer && s.optimizer[0]) abort();
  return 0;
}
