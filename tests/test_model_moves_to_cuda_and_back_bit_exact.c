/* Claim: px_model_to_device(PX_CUDA) moves a model to the GPU without
 * changing a bit: the parameters, gradients and buffers on the device are
 * the host's, every parameter points into the device arrays, px_model_pull
 * brings back the same bits into the host mirrors (which the state dict
 * views), px_model_push sends edited mirrors, px_model_zero_grad zeroes on
 * the device, px_model_init on the device gives the CPU's initial values,
 * bf16 computation is accepted there, and px_model_to_device(PX_CPU) brings
 * the current values back; freeing the model returns its device memory to
 * the allocator.  Exits 77 (skipped) without a GPU.
 *
 * If it failed, a GPU run would start from other weights than the CPU run,
 * or checkpoints written from the mirrors would not hold the trained
 * weights. */
#include "px_test.h"

#include "tensor/cuda/px_cuda.h"

#include <string.h>

static px_module *net(void) {
  return px_chain_of(3, px_linear(5, 7, true), px_batchnorm(7, 1e-5f, 0.1f), px_linear(7, 3, true));
}

int main(void) {
  if (px_cuda_device_count() == 0) {
    printf("test_model_moves_to_cuda_and_back_bit_exact: no CUDA device; skipped\n");
    return 77;
  }
  setvbuf(stdout, NULL, _IONBF, 0);  // each phase is on record if the test dies
  px_model *m = NULL, *cpu = NULL;
  CHECK_OK(px_model_create(&m, net(), 11));
  CHECK_OK(px_model_create(&cpu, net(), 11));
  const size_t n = m->n_param_elems, nb = m->n_buffer_elems;
  // Gradients and buffers that are not all zeros, so their copies show.
  for (size_t i = 0; i < n; i++) m->grad_data[i] = 0.001f * (float)i - 0.01f;
  for (size_t i = 0; i < nb; i++) m->buffer_data[i] = 0.5f + 0.25f * (float)i;
  float *p0 = malloc(n * 4), *g0 = malloc(n * 4), *b0 = malloc(nb * 4),
        *tmp = malloc((n > 1000 ? n : 1000) * 4);  // also the 1000-float scratch below
  memcpy(p0, m->param_data, n * 4);
  memcpy(g0, m->grad_data, n * 4);
  memcpy(b0, m->buffer_data, nb * 4);
  const size_t alloc0 = px_cuda_allocated_bytes();

  printf("phase: to the device\n");
  CHECK_OK(px_model_to_device(m, PX_CUDA, 0));
  CHECK(m->device == PX_CUDA && m->ctx.device == PX_CUDA, "device %d ctx %d", (int)m->device, (int)m->ctx.device);
  CHECK(m->host_param_data && m->host_buffer_data && m->arena && m->ctx.arena == m->arena, "mirrors and arena");
  CHECK(px_cuda_current_device() == 0, "current device %d", px_cuda_current_device());
  for (int i = 0; i < m->n_params; i++)
    CHECK(m->params[i]->data == m->param_data + m->params[i]->offset &&
            m->params[i]->grad == m->grad_data + m->params[i]->offset,
          "%s not in the device arrays", m->params[i]->name);
  for (int i = 0; i < m->n_buffers; i++)
    CHECK(m->buffers[i]->data == m->buffer_data + m->buffers[i]->offset, "buffer %s", m->buffers[i]->name);
  memset(tmp, 0xff, n * 4);
  CHECK_OK(px_cuda_to_host(tmp, m->param_data, n * 4));
  CHECK(memcmp(tmp, p0, n * 4) == 0, "device parameters differ from the host's");
  memset(tmp, 0xff, n * 4);
  CHECK_OK(px_cuda_to_host(tmp, m->grad_data, n * 4));
  CHECK(memcmp(tmp, g0, n * 4) == 0, "device gradients differ from the host's");

  printf("phase: pull\n");
  // Pull into poisoned mirrors: the same bits.
  memset(m->host_param_data, 0xff, n * 4);
  memset(m->host_buffer_data, 0xff, nb * 4);
  CHECK_OK(px_model_pull(m));
  CHECK(memcmp(m->host_param_data, p0, n * 4) == 0, "pulled parameters differ");
  CHECK(memcmp(m->host_buffer_data, b0, nb * 4) == 0, "pulled buffers differ");

  printf("phase: state dict\n");
  // The state dict views the mirrors.
  px_state_dict sd;
  CHECK_OK(px_model_state_dict(m, &sd));
  for (int i = 0; i < sd.count; i++) {
    const px_param *p = px_model_find(m, sd.items[i].name);
    const float *want = (p->is_buffer ? m->host_buffer_data : m->host_param_data) + p->offset;
    CHECK(sd.items[i].tensor.data == want && sd.items[i].tensor.device == PX_CPU, "state dict %s", sd.items[i].name);
  }
  px_state_dict_free(&sd);

  printf("phase: push\n");
  // Push edited mirrors, pull them back into poison.
  for (size_t i = 0; i < n; i++) m->host_param_data[i] = p0[i] * 2.0f + 1.0f;
  for (size_t i = 0; i < nb; i++) m->host_buffer_data[i] = -b0[i];
  memcpy(tmp, m->host_param_data, n * 4);
  CHECK_OK(px_model_push(m));
  memset(m->host_param_data, 0xff, n * 4);
  memset(m->host_buffer_data, 0xff, nb * 4);
  CHECK_OK(px_model_pull(m));
  CHECK(memcmp(m->host_param_data, tmp, n * 4) == 0, "push then pull changed parameters");
  for (size_t i = 0; i < nb; i++) CHECK(m->host_buffer_data[i] == -b0[i], "buffer %zu", i);

  printf("phase: zero_grad\n");
  // zero_grad on the device.
  px_model_zero_grad(m);
  memset(tmp, 0xff, n * 4);
  CHECK_OK(px_cuda_to_host(tmp, m->grad_data, n * 4));
  size_t nz = 0;
  for (size_t i = 0; i < n; i++) nz += tmp[i] != 0.0f;
  CHECK(nz == 0, "%zu gradients nonzero after zero_grad", nz);

  printf("phase: init\n");
  // init on the device: the CPU model's initial values (seed 11).
  px_model_init(m, 11);
  memset(m->host_param_data, 0xff, n * 4);
  CHECK_OK(px_model_pull(m));
  CHECK(memcmp(m->host_param_data, cpu->param_data, n * 4) == 0, "init on CUDA differs from the CPU's");
  CHECK(memcmp(m->host_buffer_data, cpu->buffer_data, nb * 4) == 0, "buffers after init differ from the CPU's");
  for (int i = 0; i < m->n_params; i++)
    CHECK(m->params[i]->data == m->param_data + m->params[i]->offset, "init left %s on the host", m->params[i]->name);

  printf("phase: bf16, second move\n");
  // bf16 accepted on CUDA; moving again to the same GPU is a no-op.
  CHECK_OK(px_model_set_compute_dtype(m, PX_BF16));
  CHECK(m->ctx.compute_dtype == PX_BF16, "compute dtype");
  CHECK_OK(px_model_set_compute_dtype(m, PX_F32));
  float *dev_params = m->param_data;
  CHECK_OK(px_model_to_device(m, PX_CUDA, 0));
  CHECK(m->param_data == dev_params, "a second move to the same GPU moved");

  printf("phase: scratch\n");
  // Scratch from the device arena is device memory.
  float *scratch = px_model_scratch(m, 1000);
  CHECK(scratch != NULL, "scratch");
  CHECK_OK(px_cuda_fill(scratch, 1000, 3.0f));
  CHECK_OK(px_cuda_to_host(tmp, scratch, 1000 * 4));
  CHECK(tmp[0] == 3.0f && tmp[999] == 3.0f, "device scratch");

  printf("phase: back to the host\n");
  // Back to the host: the current values.
  CHECK_OK(px_cuda_to_device(m->grad_data, g0, n * 4));
  CHECK_OK(px_model_to_device(m, PX_CPU, 0));
  CHECK(m->device == PX_CPU && m->ctx.device == PX_CPU && !m->host_param_data && !m->host_buffer_data, "back on CPU");
  CHECK(memcmp(m->param_data, cpu->param_data, n * 4) == 0, "parameters back on the host differ");
  CHECK(memcmp(m->grad_data, g0, n * 4) == 0, "gradients back on the host differ");
  for (int i = 0; i < m->n_params; i++)
    CHECK(m->params[i]->data == m->param_data + m->params[i]->offset &&
            m->params[i]->grad == m->grad_data + m->params[i]->offset,
          "%s not re-pointed to the host", m->params[i]->name);
  CHECK(px_cuda_allocated_bytes() == alloc0, "device memory in use after coming back: %zu, before %zu",
        px_cuda_allocated_bytes(), alloc0);

  printf("phase: to the device again, free\n");
  // Once more to the device, then free: the allocator gets everything back.
  CHECK_OK(px_model_to_device(m, PX_CUDA, 0));
  px_model_free(m);
  CHECK(px_cuda_allocated_bytes() == alloc0, "device memory in use after px_model_free: %zu, before %zu",
        px_cuda_allocated_bytes(), alloc0);
  printf("phase: done\n");
  px_model_free(cpu);
  free(p0), free(g0), free(b0), free(tmp);
  return px_test_finish("test_model_moves_to_cuda_and_back_bit_exact");
}
