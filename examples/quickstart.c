/* quickstart.c — the FluxMPI quick start in C.
 *
 * An MLP 1 → 256 → 512 → 256 → 1 with tanh learns y = x² on [-1, 1]
 * with Adam(1e-3), printing the mean loss of each epoch.
 *
 *   ./build/quickstart            (PX_NUM_THREADS=2 to use two threads)
 */
#include <plexus/plexus.h>
#include <stdio.h>

#define N_SAMPLES 1024
#define BATCH 16
#define EPOCHS 30

static int fail(const char *what) {
  fprintf(stderr, "quickstart: %s: %s\n", what, px_last_error());
  return 1;
}

int main(void) {
  // The model: parameters live in one flat buffer, initialised from a seed.
  px_model *model;
  px_module *mlp = px_chain_of(7, px_linear(1, 256, true), px_tanh(),
                               px_linear(256, 512, true), px_tanh(),
                               px_linear(512, 256, true), px_tanh(),
                               px_linear(256, 1, true));
  if (px_model_create(&model, mlp, /*seed=*/42) != PX_OK) return fail("model");

  // Adam over the flat parameter and gradient buffers.
  px_optim *opt;
  px_optim_opts adam = px_adam_defaults(1e-3f);
  if (px_optim_create(&opt, model->param_data, model->grad_data, model->n_param_elems, &adam) != PX_OK)
    return fail("optimizer");

  // Data: x uniform in [-1, 1], y = x².
  static float xs[N_SAMPLES], ys[N_SAMPLES];
  px_rng rng = px_rng_make(0, 0);
  for (int i = 0; i < N_SAMPLES; i++) {
    xs[i] = 2.0f * px_rng_uniform(&rng) - 1.0f;
    ys[i] = xs[i] * xs[i];
  }

  printf("quickstart: %zu parameters, %d samples, batch %d\n", model->n_param_elems, N_SAMPLES, BATCH);
  double t0 = px_time_now();
  for (int epoch = 1; epoch <= EPOCHS; epoch++) {
    double sum = 0;
    for (int b = 0; b < N_SAMPLES / BATCH; b++) {
      px_tensor x = px_tensor_f32(xs + b * BATCH, 2, BATCH, 1, 0, 0);
      px_tensor y = px_tensor_f32(ys + b * BATCH, 2, BATCH, 1, 0, 0);
      px_tensor pred;
      float loss;
      px_model_zero_grad(model);
      if (px_model_forward(model, &x, &pred) != PX_OK) return fail("forward");
      px_tensor dpred = pred;  // ∂loss/∂pred, from the step arena
      dpred.data = px_model_scratch(model, BATCH);
      if (px_mse_loss(&pred, &y, &loss, px_f32(&dpred)) != PX_OK) return fail("loss");
      if (px_model_backward(model, &dpred, NULL) != PX_OK) return fail("backward");
      if (px_optim_step(opt) != PX_OK) return fail("step");
      sum += loss;
    }
    printf("Epoch %3d: Loss %.6f\n", epoch, sum / (N_SAMPLES / BATCH));
  }
  printf("quickstart: %.2f s\n", px_time_now() - t0);
  px_optim_free(opt);
  px_model_free(model);
  return 0;
}
