/* bench_recompute.c — what activation checkpointing costs and saves on the
 * zoo's GPT: the step arena's high-water mark (activations, plus the loss
 * gradient and backward's temporaries), the process's peak resident size
 * (VmHWM, from /proc/self/status: parameters, gradients, Adam's moments,
 * the arena, the libraries) and the time of a training step.
 *
 *   bench_recompute [--policy none|full|selective|every:K] [--layers L]
 *                   [--batch B] [--context T] [--embd C] [--heads H]
 *                   [--vocab V] [--dropout P] [--steps S] [--threads N]
 *
 * prints one line that bench/run_recompute.sh parses:
 *
 *   recompute gpt policy=full layers=12 ... arena_mib=... vmhwm_mib=... step_ms=... best_step_ms=... cpu_ms=... steps=...
 *
 * A step is zero_grad, forward, cross-entropy over the vocabulary,
 * backward, AdamW, on B sequences of T random tokens.  One warm-up step
 * (the arena learns its size), then S timed steps: step_ms is their
 * median, best_step_ms the fastest, cpu_ms the median CPU time of the
 * process per step (with 1 thread: the step's own work, the steadiest
 * figure on a shared machine).
 * Run one policy per process: VmHWM is the process's peak.
 * This is a benchmark, not a test: it never fails on speed. */
#define _POSIX_C_SOURCE 199309L
#include <plexus/plexus.h>

#include <plexus/zoo.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double vmhwm_mib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) break;
  if (f) fclose(f);
  return kb < 0 ? -1.0 : (double)kb / 1024.0;
}

// CPU seconds of all this process's threads: on a shared machine the time
// a step took of ours, far steadier than wall time when others hold cores.
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  px_gpt_config cfg = {.vocab_size = 1024, .context = 128, .n_layer = 4, .n_head = 4, .n_embd = 256, .dropout = 0.1f};
  const char *policy = "none";
  int batch = 8, steps = 3, threads = 1;
  for (int a = 1; a < argc; a++) {
    const char *k = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
    if (!v) {
      fprintf(stderr, "bench_recompute: %s needs a value\n", k);
      return 2;
    }
    if (strcmp(k, "--policy") == 0) policy = v;
    else if (strcmp(k, "--layers") == 0) cfg.n_layer = atoi(v);
    else if (strcmp(k, "--batch") == 0) batch = atoi(v);
    else if (strcmp(k, "--context") == 0) cfg.context = atoi(v);
    else if (strcmp(k, "--embd") == 0) cfg.n_embd = atoi(v);
    else if (strcmp(k, "--heads") == 0) cfg.n_head = atoi(v);
    else if (strcmp(k, "--vocab") == 0) cfg.vocab_size = atoi(v);
    else if (strcmp(k, "--dropout") == 0) cfg.dropout = (float)atof(v);
    else if (strcmp(k, "--steps") == 0) steps = atoi(v);
    else if (strcmp(k, "--threads") == 0) threads = atoi(v);
    else {
      fprintf(stderr, "bench_recompute: unknown option %s\n", k);
      return 2;
    }
    a++;
  }
  if (batch < 1 || steps < 1 || threads < 1) {
    fprintf(stderr, "bench_recompute: batch, steps, threads >= 1\n");
    return 2;
  }
  px_set_num_threads(threads);
  px_recompute r;
  px_module *root = px_zoo_gpt(&cfg);
  px_model *md = NULL;
  if (px_recompute_parse(policy, &r) != PX_OK || !root || px_zoo_gpt_recompute(root, r) != PX_OK ||
      px_model_create(&md, root, 1) != PX_OK) {
    fprintf(stderr, "bench_recompute: %s\n", px_last_error());
    return 1;
  }
  px_optim *opt;
  px_optim_opts so = px_adamw_defaults(3e-4f);
  if (px_optim_create(&opt, md->param_data, md->grad_data, md->n_param_elems, &so) != PX_OK) {
    fprintf(stderr, "bench_recompute: %s\n", px_last_error());
    return 1;
  }
  const int T = cfg.context;
  int32_t *x = malloc((size_t)batch * T * sizeof *x), *y = malloc((size_t)batch * T * sizeof *y);
  double *ms = malloc((size_t)steps * sizeof *ms), *cpu = malloc((size_t)steps * sizeof *cpu);
  px_rng rng = px_rng_make(3, 0);
  for (int i = 0; i < batch * T; i++) {
    x[i] = (int32_t)px_rng_below(&rng, (uint64_t)cfg.vocab_size);
    y[i] = (x[i] + 1) % cfg.vocab_size;
  }
  px_tensor xt = px_tensor_view(x, PX_I32, 2, (int64_t[]){batch, T});
  float loss = 0;
  for (int s = -1; s < steps; s++) {
    double t0 = px_time_now(), c0 = cpu_now();
    px_tensor logits;
    px_model_zero_grad(md);
    px_status st = px_model_forward(md, &xt, &logits);
    float *dl = st == PX_OK ? px_model_scratch(md, (size_t)px_tensor_numel(&logits)) : NULL;
    if (st == PX_OK && !dl) st = PX_ERR_NOMEM;
    if (st == PX_OK) st = px_cross_entropy_loss(&logits, y, NULL, &loss, dl);
    px_tensor dy = logits;
    dy.data = dl;
    if (st == PX_OK) st = px_model_backward(md, &dy, NULL);
    if (st == PX_OK) st = px_optim_step(opt);
    if (st != PX_OK) {
      fprintf(stderr, "bench_recompute: %s\n", px_last_error());
      return 1;
    }
    if (s >= 0) {
      ms[s] = (px_time_now() - t0) * 1e3;
      cpu[s] = (cpu_now() - c0) * 1e3;
    }
  }
  qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
  qsort(cpu, (size_t)steps, sizeof *cpu, cmp_double);
  char name[32];
  printf("recompute gpt policy=%s layers=%d batch=%d context=%d embd=%d vocab=%d arena_mib=%.2f vmhwm_mib=%.1f "
         "step_ms=%.1f best_step_ms=%.1f cpu_ms=%.1f steps=%d loss=%.4f params=%zu\n",
         px_recompute_name(r, name, sizeof name), cfg.n_layer, batch, T, cfg.n_embd, cfg.vocab_size,
         (double)px_arena_high_water(md->arena) / 1048576.0, vmhwm_mib(), ms[steps / 2], ms[0], cpu[steps / 2], steps,
         (double)loss, md->n_param_elems);
  free(x);
  free(y);
  free(ms);
  free(cpu);
  px_optim_free(opt);
  px_model_free(md);
  return 0;
}
