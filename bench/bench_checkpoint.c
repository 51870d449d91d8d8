// bench_checkpoint: checkpoint write, verify and load speed on a checkpoint
// the size of ResNet-18 with Adam state (11,689,512 float parameters: the
// model 46.8 MB, exp_avg and exp_avg_sq 93.5 MB, and a state.json), in MB/s
// of checkpoint bytes.  Baselines in the same run: SHA-256 alone (portable
// and SHA-NI), and px_safetensors_save of the same two files (atomic, fsynced,
// no hashing).  Each figure is the best of REPEATS runs.
//
//   bench_checkpoint [DIR [REPEATS]]     DIR default /tmp; it must not be tmpfs
//                                        to measure a disk
//
// The write includes every fsync; the reads (verify, load) come mostly from
// the page cache, as they do when a run resumes right after writing.
#define _POSIX_C_SOURCE 200809L
#include "plexus/plexus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/sha256.h"

#define N_PARAMS 11689512  // torchvision resnet18(): sum(p.numel() for p in model.parameters())

static double best(double a, double b) { return a < b ? a : b; }

int main(int argc, char **argv) {
  const char *base = argc > 1 ? argv[1] : "/tmp";
  int repeats = argc > 2 ? atoi(argv[2]) : 5;
  char dir[512], path[1024], file[1100];
  snprintf(dir, sizeof dir, "%s/px_bench_ckpt_%ld", base, (long)getpid());

  // Parameters as a few tensors of ResNet-18-like sizes; the values matter
  // only in that they are not all zero.
  float *w = malloc((size_t)N_PARAMS * sizeof *w), *m = malloc((size_t)N_PARAMS * sizeof *m),
        *v = malloc((size_t)N_PARAMS * sizeof *v);
  if (!w || !m || !v) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  px_rng r = px_rng_make(1, 0);
  for (size_t i = 0; i < N_PARAMS; i++) {
    w[i] = px_rng_normal(&r);
    m[i] = 0.1f * w[i];
    v[i] = w[i] * w[i];
  }
  enum { SPLIT = 8 };  // 8 tensors per state dict
  px_named_tensor model_t[SPLIT], optim_t[2 * SPLIT];
  size_t per = N_PARAMS / SPLIT;
  for (int k = 0; k < SPLIT; k++) {
    size_t n = k == SPLIT - 1 ? N_PARAMS - per * (SPLIT - 1) : per;
    snprintf(model_t[k].name, PX_NAME_MAX, "layer%d.weight", k);
    model_t[k].tensor = px_tensor_f32(w + per * (size_t)k, 1, (int64_t)n, 0, 0, 0);
    snprintf(optim_t[2 * k].name, PX_NAME_MAX, "exp_avg.%d", k);
    optim_t[2 * k].tensor = px_tensor_f32(m + per * (size_t)k, 1, (int64_t)n, 0, 0, 0);
    snprintf(optim_t[2 * k + 1].name, PX_NAME_MAX, "exp_avg_sq.%d", k);
    optim_t[2 * k + 1].tensor = px_tensor_f32(v + per * (size_t)k, 1, (int64_t)n, 0, 0, 0);
  }
  px_state_dict model = {model_t, SPLIT}, optim = {optim_t, 2 * SPLIT};
  const char *json = "{\"step\": 1000, \"epoch\": 3}\n";
  px_ckpt_item items[3] = {{.name = "model.safetensors", .tensors = &model},
                           {.name = "optim.safetensors", .tensors = &optim},
                           {.name = "state.json", .bytes = json, .n_bytes = strlen(json)}};
  double mb = 3.0 * N_PARAMS * sizeof(float) / 1e6;

  // SHA-256 alone, in memory.
  double t_port = 1e9, t_ni = 1e9;
  for (int rep = 0; rep < repeats; rep++) {
    for (int impl = 0; impl < 2; impl++) {
      if (impl == 1 && !px_sha256_have_shani()) continue;
      px_sha256 s;
      unsigned char d[PX_SHA256_BYTES];
      double t0 = px_time_now();
      px_sha256_init_impl(&s, impl ? PX_SHA256_SHANI : PX_SHA256_PORTABLE);
      px_sha256_update(&s, w, (size_t)N_PARAMS * sizeof *w);
      px_sha256_final(&s, d);
      double t = px_time_now() - t0;
      if (impl) t_ni = best(t_ni, t);
      else t_port = best(t_port, t);
    }
  }
  double mb1 = (double)N_PARAMS * sizeof(float) / 1e6;
  printf("sha256 portable      %8.0f MB/s\n", mb1 / t_port);
  if (px_sha256_have_shani()) printf("sha256 sha-ni        %8.0f MB/s\n", mb1 / t_ni);

  double t_save = 1e9, t_write = 1e9, t_verify = 1e9, t_load = 1e9;
  for (int rep = 0; rep < repeats; rep++) {
    // Baseline: the two safetensors files, atomically, no hashing.
    double t0 = px_time_now();
    snprintf(file, sizeof file, "%s.model.safetensors", dir);
    if (px_safetensors_save(file, &model, NULL, 0) != PX_OK) goto fail;
    snprintf(file, sizeof file, "%s.optim.safetensors", dir);
    if (px_safetensors_save(file, &optim, NULL, 0) != PX_OK) goto fail;
    t_save = best(t_save, px_time_now() - t0);
    snprintf(file, sizeof file, "%s.model.safetensors", dir);
    unlink(file);
    snprintf(file, sizeof file, "%s.optim.safetensors", dir);
    unlink(file);

    t0 = px_time_now();
    if (px_checkpoint_write(dir, 1000 + rep, items, 3, 1, path, sizeof path) != PX_OK) goto fail;
    t_write = best(t_write, px_time_now() - t0);

    t0 = px_time_now();
    if (px_checkpoint_verify(path) != PX_OK) goto fail;
    t_verify = best(t_verify, px_time_now() - t0);

    t0 = px_time_now();
    if (px_checkpoint_load_tensors(path, "model.safetensors", &model, true) != PX_OK) goto fail;
    if (px_checkpoint_load_tensors(path, "optim.safetensors", &optim, true) != PX_OK) goto fail;
    t_load = best(t_load, px_time_now() - t0);
  }
  printf("checkpoint of %.1f MB in %s (best of %d; SHA-256 %s):\n", mb, base, repeats, px_sha256_impl_name());
  printf("  safetensors_save x2  %8.0f MB/s  (%.3f s, no hashing: the baseline)\n", mb / t_save, t_save);
  printf("  checkpoint_write     %8.0f MB/s  (%.3f s)\n", mb / t_write, t_write);
  printf("  checkpoint_verify    %8.0f MB/s  (%.3f s)\n", mb / t_verify, t_verify);
  printf("  load_tensors x2      %8.0f MB/s  (%.3f s)\n", mb / t_load, t_load);
  snprintf(file, sizeof file, "rm -rf '%s'", dir);
  if (system(file) != 0) fprintf(stderr, "could not remove %s\n", dir);
  free(w);
  free(m);
  free(v);
  return 0;

fail:
  fprintf(stderr, "bench_checkpoint: %s\n", px_last_error());
  return 1;
}
