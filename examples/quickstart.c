/* quickstart.c — the FluxMPI quick start in C, data parallel.
 *
 * An MLP 1 → 256 → 512 → 256 → 1 with tanh learns y = x² on [-1, 1]
 * with Adam(1e-3), printing the global mean loss of each epoch.
 *
 *   ./build/quickstart                  one process
 *   ./build/quickstart --threads 2      two ranks as threads (no MPI needed)
 *   mpirun -n 2 ./build/quickstart      two MPI processes
 *
 * Each rank sees its own slice of every global batch (the distributed
 * sampler); DDP averages the gradients, so every rank takes the same step
 * and the run computes what one process with the whole batch would. */
#include <plexus/plexus.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_SAMPLES 1024
#define BATCH 16 /* per rank */
#define EPOCHS 30

static int fail(px_comm *comm, const char *what) {
  fprintf(stderr, "quickstart: rank %d: %s: %s\n", px_comm_rank(comm), what, px_last_error());
  return 1;
}

static int train(px_comm *comm, void *arg) {
  (void)arg;
  // The model: parameters live in one flat buffer.  Seeding with the rank
  // makes every rank different on purpose: DDP starts them all from rank 0.
  px_model *model;
  px_module *mlp = px_chain_of(7, px_linear(1, 256, true), px_tanh(), px_linear(256, 512, true), px_tanh(),
                               px_linear(512, 256, true), px_tanh(), px_linear(256, 1, true));
  if (px_model_create(&model, mlp, /*seed=*/(uint64_t)px_comm_rank(comm)) != PX_OK) return fail(comm, "model");
  px_ddp *ddp;
  if (px_ddp_wrap(&ddp, model, comm, NULL) != PX_OK) return fail(comm, "ddp");

  // Adam over the flat parameter and gradient buffers.
  px_optim *opt;
  px_optim_opts adam = px_adam_defaults(1e-3f);
  if (px_optim_create(&opt, model->param_data, model->grad_data, model->n_param_elems, &adam) != PX_OK)
    return fail(comm, "optimizer");

  // Data: x uniform in [-1, 1], y = x² (the same on every rank; each rank
  // its own copy, since ranks may be threads of one process).
  float xs[N_SAMPLES], ys[N_SAMPLES];
  px_rng rng = px_rng_make(0, 0);
  for (int i = 0; i < N_SAMPLES; i++) {
    xs[i] = 2.0f * px_rng_uniform(&rng) - 1.0f;
    ys[i] = xs[i] * xs[i];
  }
  px_sampler sampler;
  if (px_sampler_init(&sampler, N_SAMPLES, px_comm_rank(comm), px_comm_size(comm), true, 0, true) != PX_OK)
    return fail(comm, "sampler");
  float xb[BATCH], yb[BATCH];
  const int steps = (int)(sampler.num_samples / BATCH);

  px_print0(comm, "quickstart: %zu parameters, %d ranks (%s), batch %d per rank\n", model->n_param_elems,
            px_comm_size(comm), px_comm_backend_name(px_comm_backend_of(comm)), BATCH);
  double t0 = px_time_now();
  for (int epoch = 1; epoch <= EPOCHS; epoch++) {
    px_sampler_set_epoch(&sampler, (uint64_t)epoch);
    double sum = 0;
    for (int s = 0; s < steps; s++) {
      for (int i = 0; i < BATCH; i++) {
        size_t k = sampler.indices[s * BATCH + i];
        xb[i] = xs[k];
        yb[i] = ys[k];
      }
      px_tensor x = px_tensor_f32(xb, 2, BATCH, 1, 0, 0), y = px_tensor_f32(yb, 2, BATCH, 1, 0, 0);
      px_tensor pred;
      float loss;
      px_model_zero_grad(model);
      if (px_model_forward(model, &x, &pred) != PX_OK) return fail(comm, "forward");
      px_tensor dpred = pred;  // ∂loss/∂pred, from the step arena
      dpred.data = px_model_scratch(model, BATCH);
      if (px_mse_loss(&pred, &y, &loss, px_f32(&dpred)) != PX_OK) return fail(comm, "loss");
      if (px_model_backward(model, &dpred, NULL) != PX_OK) return fail(comm, "backward");
      if (px_ddp_sync(ddp) != PX_OK) return fail(comm, "gradient all-reduce");
      if (px_optim_step(opt) != PX_OK) return fail(comm, "step");
      sum += loss;
    }
    double mean = sum / steps;
    if (px_comm_mean(comm, &mean) != PX_OK) return fail(comm, "loss all-reduce");
    px_print0(comm, "Epoch %3d: Loss %.6f\n", epoch, mean);
  }
  px_print0(comm, "quickstart: %.2f s\n", px_time_now() - t0);
  px_sampler_free(&sampler);
  px_optim_free(opt);
  px_ddp_free(ddp);
  px_model_free(model);
  return 0;
}

int main(int argc, char **argv) {
  int threads = 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: quickstart [--threads N]   (or: mpirun -n N quickstart)\n");
      return 2;
    }
  }
  int code = 0;
  if (px_comm_run(threads, train, NULL, &code) != PX_OK) {
    fprintf(stderr, "quickstart: %s\n", px_last_error());
    return 1;
  }
  return code;
}
