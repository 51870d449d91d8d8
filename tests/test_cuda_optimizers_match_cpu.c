/* Claim: on the GPU, SGD (plain; momentum with dampening and weight decay;
 * Nesterov with weight decay), Adam (L2) and AdamW take, over 10 steps of
 * random gradients, the parameters and state of the CPU optimizer to 1e-6
 * relative (the kernels round like the CPU loops, so they should agree to
 * the bit: the count of differing elements is printed), contiguous and as
 * segments with a gap; px_optim_pull / px_optim_push carry the state both
 * ways (a state loaded on the host into the slots steps on the device as on
 * the CPU); px_clip_grad_norm_on on the device gives the CPU's norm and
 * clipped gradients; host buffers are refused by px_optim_to_device.  Exits
 * 77 (skipped) without a GPU.  If it fails, training on the GPU drifts from
 * the CPU and a resumed checkpoint does not continue the same run. */
#include "px_test.h"
#include "tensor/cuda/px_cuda.h"

#include <stdint.h>
#include <string.h>

enum { STEPS = 10 };

static float *dev_copy(const float *h, size_t n) {
  float *d = px_cuda_malloc(n * sizeof *d + 4);
  if (!d) {
    fprintf(stderr, "px_cuda_malloc: %s\n", px_last_error());
    exit(1);
  }
  if (n) CHECK_OK(px_cuda_to_device(d, h, n * sizeof *d));
  return d;
}

static void fill(float *x, size_t n, uint64_t seed, uint64_t stream, float scale) {
  px_rng r = px_rng_make(seed, stream);
  for (size_t i = 0; i < n; i++) x[i] = scale * px_rng_normal(&r);
}

static size_t differing_bits(const float *a, const float *b, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) k += memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return k;
}

/* Relative to each element, floored at the array's rms (as the DDP tests
 * compare): rounding is absolute at the scale of the array. */
static void compare(const char *what, const char *name, const float *gpu, const float *cpu, size_t n) {
  double rms = n ? sqrt(px_sumsq(cpu, n) / (double)n) : 0;
  double w = px_max_rel_diff(gpu, cpu, n, rms > 0 ? rms : 1e-30);
  size_t k = differing_bits(gpu, cpu, n);
  printf("  %-28s %-10s max rel diff %.3g, %zu of %zu elements differ in their bits\n", what, name, w, k, n);
  CHECK(w <= 1e-6, "%s: %s differs from the CPU by %.3g relative", what, name, w);
}

/* The CPU optimizer and the device one over the same n floats: both step
 * STEPS times on the same gradients; params and every state slot agree. */
static void case_optim(const char *what, px_optim_opts opts, size_t n, bool segments) {
  float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g), *host = malloc(n * sizeof *host);
  fill(p, n, 7, n, 1.0f);
  float *dp = dev_copy(p, n), *dg = dev_copy(p, n);
  px_optim *cpu, *gpu;
  // Segments: [0, a) and [a + gap, n) of both the buffers and the state.
  const size_t a = n / 3, gap = 5;
  if (segments) {
    px_optim_segment cs[2] = {{p, g, a, 0}, {p + a + gap, g + a + gap, n - a - gap, a + gap}};
    px_optim_segment gs[2] = {{dp, dg, a, 0}, {dp + a + gap, dg + a + gap, n - a - gap, a + gap}};
    CHECK_OK(px_optim_create_segments(&cpu, cs, 2, n, &opts));
    CHECK_OK(px_optim_create_segments(&gpu, gs, 2, n, &opts));
  } else {
    CHECK_OK(px_optim_create(&cpu, p, g, n, &opts));
    CHECK_OK(px_optim_create(&gpu, dp, dg, n, &opts));
  }
  CHECK_OK(px_optim_to_device(gpu));
  CHECK(gpu->device == PX_CUDA, "%s: px_optim_to_device left device %d", what, (int)gpu->device);
  for (int s = 0; s < STEPS; s++) {
    fill(g, n, 11 + (uint64_t)s, n, 0.1f);
    CHECK_OK(px_cuda_to_device(dg, g, n * sizeof *g));
    CHECK_OK(px_optim_step(cpu));
    CHECK_OK(px_optim_step(gpu));
  }
  CHECK_OK(px_cuda_to_host(host, dp, n * sizeof *host));
  compare(what, "params", host, p, n);
  CHECK_OK(px_optim_pull(gpu));
  for (int k = 0; k < cpu->n_state; k++) {
    const char *name;
    float *cs = px_optim_state_slot(cpu, k, &name), *gs = px_optim_state_slot(gpu, k, NULL);
    compare(what, name, gs, cs, n);
  }
  // A checkpoint loaded into the slots on the host: halve the state on both,
  // push it to the device, step once more: they still agree.
  for (int k = 0; k < cpu->n_state; k++) {
    float *cs = px_optim_state_slot(cpu, k, NULL), *gs = px_optim_state_slot(gpu, k, NULL);
    for (size_t i = 0; i < n; i++) {
      cs[i] *= 0.5f;
      gs[i] = cs[i];
    }
  }
  CHECK_OK(px_optim_push(gpu));
  // pull right after push returns what was pushed, bit for bit
  if (gpu->n_state > 0) {
    float *gs0 = px_optim_state_slot(gpu, 0, NULL);
    memset(gs0, 0xff, n * sizeof *gs0);
    CHECK_OK(px_optim_pull(gpu));
    size_t k = differing_bits(gs0, px_optim_state_slot(cpu, 0, NULL), n);
    CHECK(k == 0, "%s: pull after push gave %zu elements other than those pushed", what, k);
  }
  fill(g, n, 99, n, 0.1f);
  CHECK_OK(px_cuda_to_device(dg, g, n * sizeof *g));
  CHECK_OK(px_optim_step(cpu));
  CHECK_OK(px_optim_step(gpu));
  CHECK_OK(px_cuda_to_host(host, dp, n * sizeof *host));
  compare(what, "params after push", host, p, n);
  CHECK_OK(px_optim_pull(gpu));
  for (int k = 0; k < cpu->n_state; k++) {
    const char *name;
    float *cs = px_optim_state_slot(cpu, k, &name), *gs = px_optim_state_slot(gpu, k, NULL);
    compare(what, name, gs, cs, n);
  }
  px_optim_free(cpu);
  px_optim_free(gpu);
  px_cuda_free(dp);
  px_cuda_free(dg);
  free(p);
  free(g);
  free(host);
}

static void case_clip(size_t n, float max_norm) {
  float *g = malloc(n * sizeof *g), *host = malloc(n * sizeof *host);
  fill(g, n, 5, n, 1.0f);
  float *dg = dev_copy(g, n);
  float dn = -1;
  CHECK_OK(px_clip_grad_norm_on(PX_CUDA, dg, n, max_norm, &dn));
  float cn = px_clip_grad_norm(g, n, max_norm);
  CHECK_CLOSE(dn, cn, 1e-6);
  CHECK_OK(px_cuda_to_host(host, dg, n * sizeof *host));
  compare("clip_grad_norm", max_norm < cn ? "clipped" : "untouched", host, g, n);
  px_cuda_free(dg);
  free(g);
  free(host);
}

int main(void) {
  if (px_cuda_device_count() == 0) {
    printf("test_cuda_optimizers_match_cpu: no CUDA device, skipped\n");
    return 77;
  }
  CHECK_OK(px_cuda_init(0));
  printf("device: %s\n", px_cuda_device_name());

  px_optim_opts sgd = px_sgd_defaults(0.05f);
  px_optim_opts mom = px_sgd_defaults(0.05f);
  mom.momentum = 0.9f;
  mom.dampening = 0.1f;
  mom.weight_decay = 1e-2f;
  px_optim_opts nes = px_sgd_defaults(0.05f);
  nes.momentum = 0.9f;
  nes.nesterov = true;
  nes.weight_decay = 1e-2f;
  px_optim_opts adam = px_adam_defaults(1e-3f);
  adam.weight_decay = 1e-2f;
  px_optim_opts adamw = px_adamw_defaults(1e-3f);

  const size_t sizes[] = {1, 1000, 100003};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    const size_t n = sizes[i];
    printf("n = %zu\n", n);
    case_optim("sgd", sgd, n, false);
    case_optim("sgd momentum+dampening+wd", mom, n, false);
    case_optim("sgd nesterov+wd", nes, n, false);
    case_optim("adam (L2)", adam, n, false);
    case_optim("adamw", adamw, n, false);
    if (n > 10) {
      case_optim("sgd nesterov, segments", nes, n, true);
      case_optim("adamw, segments", adamw, n, true);
    }
  }
  case_clip(100003, 1.0f);
  case_clip(1000, 1e6f);

  // Host buffers are refused with a message.
  float hp[4] = {0}, hg[4] = {0};
  px_optim *o;
  CHECK_OK(px_optim_create(&o, hp, hg, 4, &adamw));
  px_status st = px_optim_to_device(o);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "host memory"),
        "px_optim_to_device on host buffers: %s, \"%s\"", px_status_name(st), px_last_error());
  CHECK(o->device == PX_CPU, "a refused px_optim_to_device moved the optimizer");
  px_optim_free(o);
  return px_test_finish("test_cuda_optimizers_match_cpu");
}
