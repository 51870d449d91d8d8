/* Claim: where no GPU can run the model (a build without CUDA, or a CUDA
 * build on a machine with no device), px_model_to_device(PX_CUDA) refuses
 * with PX_ERR_UNSUPPORTED and a message naming the reason, and leaves the
 * model on the host, untouched and usable; bf16 computation is refused on a
 * CPU model with its own message; the CPU no-ops (to PX_CPU, pull, push,
 * f32) succeed.  On a machine with a GPU this test has nothing to check and
 * exits 77 (skipped); test_model_moves_to_cuda_and_back_bit_exact runs there.
 *
 * If it failed, `plexus train --device cuda` on a CPU machine could crash,
 * half-move the model, or say nothing useful. */
#include "px_test.h"

#include <string.h>

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/px_cuda.h"
#endif

int main(void) {
#ifdef PX_HAVE_CUDA
  if (px_cuda_device_count() > 0) {
    printf("test_model_to_cuda_refused_clearly_without_gpu: a GPU is present; skipped\n");
    return 77;
  }
  const char *reason = "no CUDA device found";
#else
  const char *reason = "plexus was built without CUDA";
#endif
  px_model *m = NULL;
  CHECK_OK(px_model_create(&m,
                           px_chain_of(3, px_linear(5, 7, true), px_batchnorm(7, 1e-5f, 0.1f), px_linear(7, 3, true)),
                           11));
  const size_t n = m->n_param_elems, nb = m->n_buffer_elems;
  float *before = malloc(n * sizeof(float));
  CHECK(before != NULL, "malloc");
  memcpy(before, m->param_data, n * sizeof(float));
  float *pd = m->param_data, *gd = m->grad_data, *bd = m->buffer_data;
  px_arena *arena = m->arena;

  px_clear_error();
  px_status st = px_model_to_device(m, PX_CUDA, 0);
  CHECK(st == PX_ERR_UNSUPPORTED, "to_device(PX_CUDA) returned %s", px_status_name(st));
  CHECK(strstr(px_last_error(), reason) != NULL, "message \"%s\" does not say \"%s\"", px_last_error(), reason);
  // Nothing moved.
  CHECK(m->device == PX_CPU && m->ctx.device == PX_CPU, "device %d, ctx device %d", (int)m->device, (int)m->ctx.device);
  CHECK(m->param_data == pd && m->grad_data == gd && m->buffer_data == bd && m->arena == arena && m->ctx.arena == arena,
        "the flat buffers or the arena changed");
  CHECK(m->host_param_data == NULL && m->host_buffer_data == NULL, "host mirrors set on a CPU model");
  CHECK(memcmp(before, m->param_data, n * sizeof(float)) == 0, "parameters changed");
  for (int i = 0; i < m->n_params; i++)
    CHECK(m->params[i]->data == pd + m->params[i]->offset && m->params[i]->grad == gd + m->params[i]->offset,
          "parameter %s re-pointed", m->params[i]->name);
  CHECK(nb > 0 && m->buffers[0]->data == bd, "buffer re-pointed");

  // bf16 on the CPU: refused, f32 kept.
  px_clear_error();
  st = px_model_set_compute_dtype(m, PX_BF16);
  CHECK(st == PX_ERR_UNSUPPORTED, "set_compute_dtype(BF16) on CPU returned %s", px_status_name(st));
  CHECK(strstr(px_last_error(), "bf16 computation needs the model on CUDA (--device cuda)") != NULL &&
          strstr(px_last_error(), "the CPU path computes in f32") != NULL,
        "message \"%s\"", px_last_error());
  CHECK(m->ctx.compute_dtype == PX_F32, "compute dtype changed to %d", (int)m->ctx.compute_dtype);
  st = px_model_set_compute_dtype(m, PX_F16);
  CHECK(st == PX_ERR_UNSUPPORTED, "set_compute_dtype(F16) returned %s", px_status_name(st));
  CHECK_OK(px_model_set_compute_dtype(m, PX_F32));

  // The CPU no-ops.
  CHECK_OK(px_model_to_device(m, PX_CPU, 0));
  CHECK_OK(px_model_pull(m));
  CHECK_OK(px_model_push(m));
  CHECK(m->param_data == pd && memcmp(before, m->param_data, n * sizeof(float)) == 0, "a CPU no-op changed the model");
  CHECK(px_model_to_device(m, (px_device)7, 0) == PX_ERR_INVALID, "unknown device accepted");

  // Still a working model: a forward and backward on the host.
  const int64_t xs[2] = {4, 5}, ys[2] = {4, 3};
  float xd[20], dyd[12];
  for (int i = 0; i < 20; i++) xd[i] = 0.1f * (float)(i % 7) - 0.3f;
  for (int i = 0; i < 12; i++) dyd[i] = 0.05f * (float)(i % 5);
  px_tensor x = px_tensor_view(xd, PX_F32, 2, xs), y, dy = px_tensor_view(dyd, PX_F32, 2, ys);
  px_model_zero_grad(m);
  CHECK_OK(px_model_forward(m, &x, &y));
  CHECK(y.device == PX_CPU && y.ndim == 2 && y.shape[0] == 4 && y.shape[1] == 3, "forward output");
  CHECK_OK(px_model_backward(m, &dy, NULL));
  double g = 0;
  for (size_t i = 0; i < n; i++) g += fabs(m->grad_data[i]);
  CHECK(g > 0, "no gradient after backward");
  free(before);
  px_model_free(m);
  return px_test_finish("test_model_to_cuda_refused_clearly_without_gpu");
}
