/* Claim: px_train on a GPU (device PX_CUDA) follows the CPU run: a small
 * GPT (2 layers, width 64, 4 heads, context 32, vocabulary 96, dropout 0.1)
 * trained 20 AdamW steps with gradient clipping (max norm 1) and 2
 * micro-batches per step, from the same seed on the same batches, has at
 * every step a loss within 1e-4 (relative) of the CPU run's in f32, and
 * within 2e-2 in bf16 (--precision bf16: the GEMMs' operands in bf16); the
 * gradient norms the steps log agree as well (1e-3 in f32, 5e-2 in bf16).
 * The loss must also fall (the runs train at all).  Exits 77 (skipped)
 * without CUDA or a GPU.
 *
 * If it fails in f32, some device kernel of the GPT's forward or backward,
 * the cross-entropy, clipping, AdamW, the dropout masks (the counter-based
 * RNG), or the batch's copy to the device differs from the CPU path; in bf16
 * alone, the bf16 GEMMs lose more than rounding should. */
#include "cuda_train_cases.h"

static double rel(double a, double b) { return fabs(a - b) / fmax(1e-12, fmax(fabs(a), fabs(b))); }

int main(void) {
  ct_skip_without_gpu("test_cuda_gpt_training_follows_cpu_losses");
  enum { STEPS = 20 };
  static ct_losses cpu, gpu, bf;
  ct_run r = {.device = PX_CPU, .precision = PX_F32, .steps = STEPS, .accum = 2};
  CHECK_OK(ct_train(&r, &cpu, NULL, 0));
  r.device = PX_CUDA;
  CHECK_OK(ct_train(&r, &gpu, NULL, 0));
  r.precision = PX_BF16;
  CHECK_OK(ct_train(&r, &bf, NULL, 0));
  CHECK(cpu.n == STEPS && gpu.n == STEPS && bf.n == STEPS, "steps logged: cpu %lld, cuda %lld, bf16 %lld",
        (long long)cpu.n, (long long)gpu.n, (long long)bf.n);
  double worst_f32 = 0, worst_bf16 = 0, worst_norm_f32 = 0, worst_norm_bf16 = 0;
  printf("step  cpu loss     cuda f32     cuda bf16    (cpu norm / cuda f32 / bf16)\n");
  for (int s = 1; s <= STEPS; s++) {
    printf("%4d  %.7f  %.7f  %.7f   (%.5f / %.5f / %.5f)\n", s, cpu.loss[s], gpu.loss[s], bf.loss[s], cpu.norm[s],
           gpu.norm[s], bf.norm[s]);
    CHECK(isfinite(gpu.loss[s]) && isfinite(bf.loss[s]), "step %d: a loss is not finite", s);
    worst_f32 = fmax(worst_f32, rel(cpu.loss[s], gpu.loss[s]));
    worst_bf16 = fmax(worst_bf16, rel(cpu.loss[s], bf.loss[s]));
    worst_norm_f32 = fmax(worst_norm_f32, rel(cpu.norm[s], gpu.norm[s]));
    worst_norm_bf16 = fmax(worst_norm_bf16, rel(cpu.norm[s], bf.norm[s]));
    CHECK(rel(cpu.loss[s], gpu.loss[s]) <= 1e-4, "step %d: f32 loss on the GPU %.9g, on the CPU %.9g", s, gpu.loss[s],
          cpu.loss[s]);
    CHECK(rel(cpu.loss[s], bf.loss[s]) <= 2e-2, "step %d: bf16 loss on the GPU %.9g, f32 on the CPU %.9g", s,
          bf.loss[s], cpu.loss[s]);
    CHECK(rel(cpu.norm[s], gpu.norm[s]) <= 1e-3, "step %d: f32 gradient norm on the GPU %.9g, on the CPU %.9g", s,
          gpu.norm[s], cpu.norm[s]);
    CHECK(rel(cpu.norm[s], bf.norm[s]) <= 5e-2, "step %d: bf16 gradient norm on the GPU %.9g, on the CPU %.9g", s,
          bf.norm[s], cpu.norm[s]);
  }
  CHECK(cpu.loss[STEPS] < cpu.loss[1] - 0.1, "the CPU run did not learn: %.4f -> %.4f", cpu.loss[1], cpu.loss[STEPS]);
  printf("largest relative difference from the CPU: loss f32 %.3g, bf16 %.3g; gradient norm f32 %.3g, bf16 %.3g\n",
         worst_f32, worst_bf16, worst_norm_f32, worst_norm_bf16);
  return px_test_finish("test_cuda_gpt_training_follows_cpu_losses");
}
