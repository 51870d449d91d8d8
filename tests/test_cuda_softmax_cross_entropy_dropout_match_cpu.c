/* Claim: on the GPU, the Softmax module (forward, backward), cross-entropy
 * (px_cross_entropy_loss with device logits and targets: the mean loss and
 * dlogits, ignore_index rows, label smoothing, every row ignored, dlogits
 * aliasing the logits, no dlogits, a target that is not a class) and
 * Dropout / px_dropout_part (training and eval, forward and backward) give
 * the CPU's results: softmax and cross-entropy to 1e-5 (max |gpu - cpu| /
 * max |cpu|; the loss relative), dropout bit for bit (the same Philox words
 * on the device as on the CPU for the same seed, stream, step and element). */
#include "cuda_compare.h"

static void fill(float *x, size_t n, uint64_t seed, float lo, float hi) {
  px_rng r = px_rng_make(seed, 2);
  for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * px_rng_uniform(&r);
}

static void check_softmax(int64_t R, int64_t D, float lo, float hi, int idx) {
  px_module *m = px_softmax();
  const size_t n = (size_t)(R * D);
  float *x = malloc(n * sizeof *x), *dy = malloc(n * sizeof *dy), *y_cpu = malloc(n * sizeof *y_cpu),
        *dx_cpu = malloc(n * sizeof *dx_cpu);
  if (!m || !x || !dy || !y_cpu || !dx_cpu) exit(1);
  fill(x, n, 10 + (uint64_t)idx, lo, hi);
  fill(dy, n, 20 + (uint64_t)idx, -1, 1);
  px_tensor X = px_tensor_f32(x, 2, R, D, 0, 0), DY = px_tensor_f32(dy, 2, R, D, 0, 0), y, dx;
  px_ctx cpu = cc_ctx(PX_CPU, true, 1, 0), gpu = cc_ctx(PX_CUDA, true, 1, 0);
  CHECK_OK(px_module_forward(m, &cpu, &X, &y));
  memcpy(y_cpu, y.data, n * sizeof(float));
  CHECK_OK(px_module_backward(m, &cpu, &DY, &dx));
  memcpy(dx_cpu, dx.data, n * sizeof(float));
  px_tensor Xd = cc_device_tensor(&X), DYd = cc_device_tensor(&DY);
  CHECK_OK(px_module_forward(m, &gpu, &Xd, &y));
  CHECK_OK(px_module_backward(m, &gpu, &DYd, &dx));
  float *yg = cc_to_host(&y), *dxg = cc_to_host(&dx);
  char what[96];
  snprintf(what, sizeof what, "softmax (%lld, %lld) in [%g, %g]: y", (long long)R, (long long)D, (double)lo,
           (double)hi);
  cc_compare(what, yg, y_cpu, n, 1e-5);
  snprintf(what, sizeof what, "softmax (%lld, %lld) in [%g, %g]: dx", (long long)R, (long long)D, (double)lo,
           (double)hi);
  cc_compare(what, dxg, dx_cpu, n, 1e-5);
  free(yg);
  free(dxg);
  free(x);
  free(dy);
  free(y_cpu);
  free(dx_cpu);
  px_cuda_free(Xd.data);
  px_cuda_free(DYd.data);
  px_arena_free(cpu.arena);
  px_arena_free(gpu.arena);
  px_module_free(m);
}

// ignore_every: every k-th row's target is ignore_index (0: none; 1: all).
static void check_ce(int64_t N, int C, float eps, int ignore_every, bool alias, bool grad, int idx) {
  const size_t n = (size_t)N * (size_t)C;
  float *z = malloc(n * sizeof *z), *dz_cpu = malloc(n * sizeof *dz_cpu);
  int32_t *t = malloc((size_t)N * sizeof *t);
  if (!z || !dz_cpu || !t) exit(1);
  fill(z, n, 30 + (uint64_t)idx, -4, 4);
  px_rng r = px_rng_make(40 + (uint64_t)idx, 3);
  const px_ce_opts o = {.ignore_index = -7, .label_smoothing = eps};
  for (int64_t i = 0; i < N; i++)
    t[i] = ignore_every && i % ignore_every == 0 ? o.ignore_index : (int32_t)px_rng_below(&r, (uint64_t)C);
  px_tensor Z = px_tensor_f32(z, 2, N, C, 0, 0);
  float loss_cpu = -1, loss_gpu = -2;
  CHECK_OK(px_cross_entropy_loss(&Z, t, &o, &loss_cpu, grad ? dz_cpu : NULL));
  px_tensor Zd = cc_device_tensor(&Z);
  int32_t *td = cc_to_device(t, (size_t)N * sizeof *t);
  float *dzd = !grad ? NULL : alias ? (float *)Zd.data : px_cuda_malloc(n * sizeof(float));
  CHECK_OK(px_cross_entropy_loss(&Zd, td, &o, &loss_gpu, dzd));
  char what[128];
  snprintf(what, sizeof what, "cross-entropy (%lld, %d) smoothing %g, ignore every %d%s%s: ", (long long)N, C,
           (double)eps, ignore_every, alias ? ", dlogits = logits" : "", grad ? "" : ", no dlogits");
  CHECK(fabs((double)loss_gpu - loss_cpu) <= 1e-5 * fmax(fabs((double)loss_cpu), 1e-30) ||
          (loss_cpu == 0.0f && loss_gpu == 0.0f),
        "%sloss gpu %.9g cpu %.9g", what, (double)loss_gpu, (double)loss_cpu);
  if (grad) {
    float *g = malloc(n * sizeof *g);
    if (!g) exit(1);
    CHECK_OK(px_cuda_to_host(g, dzd, n * sizeof(float)));
    strcat(what, "dlogits");
    cc_compare(what, g, dz_cpu, n, 1e-5);
    free(g);
    if (!alias) px_cuda_free(dzd);
  }
  printf("cross-entropy case %d: loss cpu %.9g gpu %.9g\n", idx, (double)loss_cpu, (double)loss_gpu);
  px_cuda_free(Zd.data);
  px_cuda_free(td);
  free(z);
  free(dz_cpu);
  free(t);
}

static void check_ce_bad_target(void) {
  float z[3 * 4] = {0};
  int32_t t[3] = {1, 4, 2};  // 4 is not a class of 4
  px_tensor Z = px_tensor_f32(z, 2, 3, 4, 0, 0);
  px_tensor Zd = cc_device_tensor(&Z);
  int32_t *td = cc_to_device(t, sizeof t);
  float loss = 0;
  px_status st = px_cross_entropy_loss(&Zd, td, NULL, &loss, NULL);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "row 1"), "bad target: %s: %s", px_status_name(st),
        px_last_error());
  px_cuda_free(Zd.data);
  px_cuda_free(td);
}

// Dropout: the GPU's bytes equal the CPU's, forward and backward.
static void check_dropout(int64_t N, int64_t T, int64_t inner, float p, int part, int parts, bool training, int idx) {
  px_module *m = parts > 1 ? px_dropout_part(p, part, parts) : px_dropout(p);
  if (!m) exit(1);
  m->stream = 5u + (uint32_t)idx;
  cc_set_training(m, training);
  const size_t n = (size_t)(N * T * inner);
  float *x = malloc(n * sizeof *x), *dy = malloc(n * sizeof *dy), *y_cpu = malloc(n * sizeof *y_cpu),
        *dx_cpu = malloc(n * sizeof *dx_cpu);
  if (!x || !dy || !y_cpu || !dx_cpu) exit(1);
  fill(x, n, 50 + (uint64_t)idx, -2, 2);
  fill(dy, n, 60 + (uint64_t)idx, -2, 2);
  const int64_t shape[3] = {N, T, inner};
  px_tensor X = px_tensor_view(x, PX_F32, 3, shape), DY = px_tensor_view(dy, PX_F32, 3, shape), y, dx;
  const uint64_t seed = 99 + (uint64_t)idx, step = 11 + (uint64_t)idx;
  px_ctx cpu = cc_ctx(PX_CPU, training, seed, step), gpu = cc_ctx(PX_CUDA, training, seed, step);
  CHECK_OK(px_module_forward(m, &cpu, &X, &y));
  memcpy(y_cpu, y.data, n * sizeof(float));
  CHECK_OK(px_module_backward(m, &cpu, &DY, &dx));
  memcpy(dx_cpu, dx.data, n * sizeof(float));
  px_tensor Xd = cc_device_tensor(&X), DYd = cc_device_tensor(&DY);
  CHECK_OK(px_module_forward(m, &gpu, &Xd, &y));
  CHECK_OK(px_module_backward(m, &gpu, &DYd, &dx));
  CHECK(y.device == PX_CUDA && dx.device == PX_CUDA, "dropout case %d: outputs not on the device", idx);
  float *yg = cc_to_host(&y), *dxg = cc_to_host(&dx);
  size_t dropped = 0;
  for (size_t i = 0; i < n; i++) dropped += y_cpu[i] == 0.0f;
  CHECK(memcmp(yg, y_cpu, n * sizeof(float)) == 0, "dropout case %d (p %g, part %d of %d, %s): forward differs", idx,
        (double)p, part, parts, training ? "train" : "eval");
  CHECK(memcmp(dxg, dx_cpu, n * sizeof(float)) == 0, "dropout case %d (p %g, part %d of %d, %s): backward differs", idx,
        (double)p, part, parts, training ? "train" : "eval");
  // Not a vacuous comparison: training with p > 0 drops about p·n elements.
  if (training && p > 0 && n >= 1000)
    CHECK(fabs((double)dropped / (double)n - p) < 0.05, "dropout case %d: %zu of %zu dropped at p %g", idx, dropped, n,
          (double)p);
  printf("dropout case %d: %zu elements, %zu dropped, p %g, part %d of %d, %s\n", idx, n, dropped, (double)p, part,
         parts, training ? "train" : "eval");
  free(yg);
  free(dxg);
  free(x);
  free(dy);
  free(y_cpu);
  free(dx_cpu);
  px_cuda_free(Xd.data);
  px_cuda_free(DYd.data);
  px_arena_free(cpu.arena);
  px_arena_free(gpu.arena);
  px_module_free(m);
}

int main(void) {
  cc_require_gpu("test_cuda_softmax_cross_entropy_dropout_match_cpu");
  check_softmax(1, 1, -1, 1, 0);
  check_softmax(7, 13, -3, 3, 1);
  check_softmax(33, 1000, -5, 5, 2);
  check_softmax(4, 50, 80, 90, 3);  // large logits: the max is subtracted
  check_softmax(5, 4099, -10, 10, 4);

  check_ce(1, 1, 0.0f, 0, false, true, 0);
  check_ce(17, 10, 0.0f, 0, false, true, 1);
  check_ce(64, 257, 0.0f, 3, false, true, 2);    // some rows ignored
  check_ce(64, 257, 0.1f, 3, false, true, 3);    // and label smoothing
  check_ce(9, 31, 0.2f, 1, false, true, 4);      // every row ignored: loss 0, dlogits 0
  check_ce(100, 1000, 0.1f, 7, true, true, 5);   // dlogits = logits
  check_ce(40, 5000, 0.0f, 0, false, false, 6);  // loss only
  check_ce(8, 50257, 0.0f, 5, false, true, 7);   // GPT-2's vocabulary
  check_ce_bad_target();

  check_dropout(2, 3, 5, 0.3f, 0, 1, true, 0);  // 30 elements: blocks of 4 cut at the end
  check_dropout(4, 64, 97, 0.1f, 0, 1, true, 1);
  check_dropout(4, 64, 97, 0.5f, 0, 1, true, 2);
  check_dropout(3, 17, 33, 0.2f, 1, 3, true, 3);  // sequence part 1 of 3
  check_dropout(3, 17, 33, 0.2f, 2, 3, true, 4);
  check_dropout(4, 64, 97, 0.5f, 0, 1, false, 5);  // eval: identity
  check_dropout(4, 64, 97, 0.0f, 0, 1, true, 6);   // p = 0: identity
  return px_test_finish("test_cuda_softmax_cross_entropy_dropout_match_cpu");
}
