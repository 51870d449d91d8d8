/* zoo_cnn.c — the demo's CNN from the installed zoo (plexus/zoo.h) in a few
 * lines: build it, wrap it in a model, and train a few SGD steps on one
 * random batch of 28×28 grey images, which the loss must fall on (the
 * network memorises the batch).
 *
 *   ./build/zoo_cnn
 *   cc zoo_cnn.c $(pkg-config --cflags --libs plexus)      (installed library)
 */
#include <plexus/plexus.h>
#include <plexus/zoo.h>
#include <stdio.h>

#define N 16
#define CLASSES 10
#define STEPS 10

int main(void) {
  /* 1 channel, 28×28, width 8 (8 and 16 channels), 10 classes. */
  px_module *cnn = px_zoo_cnn(1, 28, 28, 8, CLASSES);
  px_model *model;
  if (!cnn || px_model_create(&model, cnn, /*seed=*/1) != PX_OK) {
    fprintf(stderr, "zoo_cnn: %s\n", px_last_error());
    return 1;
  }
  px_optim *opt;
  px_optim_opts sgd = px_sgd_defaults(0.05f);
  if (px_optim_create(&opt, model->param_data, model->grad_data, model->n_param_elems, &sgd) != PX_OK) {
    fprintf(stderr, "zoo_cnn: %s\n", px_last_error());
    return 1;
  }
  static float images[N * 28 * 28];
  int32_t labels[N];
  px_rng rng = px_rng_make(7, 0);
  for (int i = 0; i < N * 28 * 28; i++) images[i] = px_rng_uniform(&rng);
  for (int i = 0; i < N; i++) labels[i] = i % CLASSES;

  px_model_train(model, true);
  float first = 0, loss = 0;
  int failed = 0;
  for (int step = 0; step < STEPS && !failed; step++) {
    px_tensor x = px_tensor_f32(images, 4, N, 1, 28, 28), logits;
    px_model_zero_grad(model);
    if (px_model_forward(model, &x, &logits) != PX_OK) {
      failed = 1;
      break;
    }
    px_tensor dlogits = logits;
    dlogits.data = px_model_scratch(model, (size_t)N * CLASSES);
    if (!dlogits.data || px_cross_entropy_loss(&logits, labels, NULL, &loss, px_f32(&dlogits)) != PX_OK ||
        px_model_backward(model, &dlogits, NULL) != PX_OK || px_optim_step(opt) != PX_OK)
      failed = 1;
    if (step == 0) first = loss;
  }
  int ok = !failed && loss < first;
  printf("zoo_cnn: %zu parameters, loss %.4f -> %.4f after %d steps%s\n", model->n_param_elems, first, loss, STEPS,
         ok ? "" : " (FAILED)");
  if (failed) fprintf(stderr, "zoo_cnn: %s\n", px_last_error());
  px_optim_free(opt);
  px_model_free(model);
  return ok ? 0 : 1;
}
