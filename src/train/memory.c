// Memory a rank holds, in the terms of the ZeRO paper: parameters,
// gradients, optimizer state, (stage 3) gathered units, and activations.
//
// Under ZeRO the library keeps the account (px_zero_memory_of); under DDP
// or one process the same figures follow from the model, as every rank
// holds the whole of each (f32, Ψ parameters, Adam's 2 slots):
//
//   params 4Ψ   grads 4Ψ   optimizer state n_state · 4Ψ   gathered 0
//   activations: the step arena's high-water mark (the most a step has
//   taken from it)
//
// The process's peak resident memory (VmHWM) is beside it: what the
// operating system saw, libraries, buffers of the communication backend
// and the data loader included.
#include "train/internal.h"

#include <stdio.h>
#include <string.h>

size_t px_train_peak_rss(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  size_t kib = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %zu kB", &kib) == 1) break;
  fclose(f);
  return kib * 1024;
}

const char *px_train_bytes_str(size_t bytes, char *buf, size_t cap) {
  const double b = (double)bytes;
  if (b >= 1024.0 * 1024.0 * 1024.0) snprintf(buf, cap, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
  else if (b >= 1024.0 * 1024.0) snprintf(buf, cap, "%.2f MiB", b / (1024.0 * 1024.0));
  else if (b >= 1024.0) snprintf(buf, cap, "%.1f KiB", b / 1024.0);
  else snprintf(buf, cap, "%zu B", bytes);
  return buf;
}

px_status px_trainer_memory(px_trainer *t, px_zero_memory *mine, px_zero_memory *max, size_t *peak_rss) {
  memset(mine, 0, sizeof *mine);
  const px_model *md = t->model;
  if (t->zero) {
    px_zero_memory_of(t->zero, mine);
  } else {
    mine->params = md->n_param_elems * sizeof(float);
    mine->grads = md->n_param_elems * sizeof(float);
    mine->gathered = 0;
    mine->arena_peak = md->arena ? px_arena_high_water(md->arena) : 0;
  }
  // The optimizer's state is the caller's to count (parallel.h).
  mine->optim_state = t->opt ? (size_t)t->opt->n_state * t->opt->n * sizeof(float) : 0;
  int64_t v[6] = {(int64_t)mine->params,   (int64_t)mine->grads,      (int64_t)mine->optim_state,
                  (int64_t)mine->gathered, (int64_t)mine->arena_peak, (int64_t)px_train_peak_rss()};
  px_status st = px_comm_allreduce(t->comm, v, 6, PX_I64, PX_MAX);
  if (st != PX_OK) return st;
  *max = (px_zero_memory){.params = (size_t)v[0],
                          .grads = (size_t)v[1],
                          .optim_state = (size_t)v[2],
                          .gathered = (size_t)v[3],
                          .arena_peak = (size_t)v[4]};
  *peak_rss = (size_t)v[5];
  return PX_OK;
}
