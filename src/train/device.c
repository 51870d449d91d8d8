// The training loop's device side (issue 15, docs/GPU.md): where the model
// computes, and what the loop does differently when that is a GPU.
//
//   px_train_to_device   GPU = local rank % GPUs of the node (px_cuda_init on
//                        the rank's thread), the model moved there, its
//                        GEMMs' operand dtype (f32, or bf16)
//   micro-batches        x and y copied into device buffers allocated once
//                        (grown when a batch is larger)
//   loss, dlogits        on the device (px_cross_entropy_loss dispatches on
//                        the logits' device; dlogits from the device arena)
//   gradient norm        Σ g² on the device (double), clipped there
//   DDP                  over NCCL (t->nccl) when there is more than one
//                        rank; every host figure of the loop (the step's loss
//                        agreement, the stop flag, evaluation sums, memory,
//                        checkpoint and resume agreements) stays on comm
//   checkpoints          pulled into the host mirrors before a save (the
//                        files are a CPU run's); pushed after a resume
//
// Everything here builds without CUDA too: then PX_CUDA is refused with a
// message naming the option.
#include "base/internal.h"
#include "train/internal.h"

#ifdef PX_HAVE_CUDA
#include "tensor/cuda/px_cuda.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int px_train_cuda_devices(void) {
#ifdef PX_HAVE_CUDA
  return px_cuda_device_count();
#else
  return -1;
#endif
}

// One rank's part of px_train_to_device.
static px_status to_device_here(px_comm *comm, px_model *model, px_device device, px_dtype precision) {
  if (precision != PX_F32 && precision != PX_BF16)
    return px_error(PX_ERR_INVALID, "--precision (train.precision) %s: expected f32 or bf16", px_dtype_name(precision));
  if (device == PX_CPU) {
    if (precision == PX_BF16)
      return px_error(PX_ERR_UNSUPPORTED,
                      "--precision bf16 (train.precision): bf16 runs on the GPU only (--device "
                      "cuda); on the CPU plexus computes in f32 (--precision f32)");
    if (model->device != PX_CPU) return px_error(PX_ERR_UNSUPPORTED, "--device cpu: this model is already on a GPU");
    return PX_OK;
  }
  if (device != PX_CUDA) return px_error(PX_ERR_INVALID, "--device (train.device): unknown device %d", (int)device);
#ifndef PX_HAVE_CUDA
  (void)comm;
  return px_error(PX_ERR_UNSUPPORTED,
                  "--device cuda (train.device): this plexus was built without CUDA (CMake found "
                  "no CUDA toolkit); rebuild where nvcc and the CUDA libraries are installed, or use --device cpu");
#else
  const int n = px_cuda_device_count();
  if (n < 1)
    return px_error(PX_ERR_UNSUPPORTED,
                    "--device cuda (train.device): no CUDA device is visible to this process (no "
                    "NVIDIA GPU, or no driver%s); use --device cpu",
                    getenv("CUDA_VISIBLE_DEVICES") ? ", or CUDA_VISIBLE_DEVICES hides them" : "");
  const int gpu = px_comm_local_rank(comm) % n;
  px_status st = px_cuda_init(gpu);
  if (st != PX_OK) return px_error_wrap(st, "--device cuda: GPU %d (local rank %d)", gpu, px_comm_local_rank(comm));
  if (model->device != PX_CUDA && (st = px_model_to_device(model, PX_CUDA, gpu)) != PX_OK)
    return px_error_wrap(st, "--device cuda: the model onto GPU %d", gpu);
  if ((st = px_model_set_compute_dtype(model, precision)) != PX_OK)
    return px_error_wrap(st, "--precision %s", precision == PX_BF16 ? "bf16" : "f32");
  return PX_OK;
#endif
}

px_status px_train_to_device(px_comm *comm, px_model *model, px_device device, px_dtype precision) {
  if (!model) return px_error(PX_ERR_INVALID, "train: NULL model");
  px_status st = to_device_here(comm, model, device, precision);
  if (px_comm_size(comm) == 1) return st;
  // Every rank learns whether all have their device: none goes on alone
  // (a rank past this point would wait in DDP's first collective).
  int32_t bad = st != PX_OK;
  char why[1024] = "";
  if (bad) snprintf(why, sizeof why, "%s", px_last_error());
  px_status cst = px_comm_allreduce(comm, &bad, 1, PX_I32, PX_MAX);
  if (st != PX_OK) return px_error(st, "%s", why);
  if (cst != PX_OK) return cst;
  if (bad) return px_error(PX_ERR_UNSUPPORTED, "--device: another rank could not put its model on its device");
  return PX_OK;
}

#ifdef PX_HAVE_CUDA
// A device buffer of at least `need` bytes in *p (holding *have).
static px_status grow(void **p, size_t *have, size_t need, const char *what) {
  if (need <= *have) return PX_OK;
  px_cuda_free(*p);
  *p = NULL;
  *have = 0;
  if (!(*p = px_cuda_malloc(need))) return px_error_wrap(PX_ERR_NOMEM, "train: %s on the GPU (%zu bytes)", what, need);
  *have = need;
  return PX_OK;
}
#endif

px_status px_dev_batch_stage(px_dev_batch *d, const px_model *model, const px_batch *b, px_tensor *x,
                             const int32_t **y) {
  *x = b->x;
  *y = (const int32_t *)b->y.data;
  if (model->device != PX_CUDA) return PX_OK;
#ifdef PX_HAVE_CUDA
  const size_t xb = (size_t)px_tensor_numel(&b->x) * px_dtype_size(b->x.dtype);
  const size_t yb = (size_t)px_tensor_numel(&b->y) * px_dtype_size(b->y.dtype);
  TRY(grow(&d->x, &d->x_bytes, xb > 0 ? xb : 1, "the batch's inputs"));
  TRY(grow(&d->y, &d->y_bytes, yb > 0 ? yb : 1, "the batch's targets"));
  if (xb) TRY(px_cuda_to_device(d->x, b->x.data, xb));
  if (yb) TRY(px_cuda_to_device(d->y, b->y.data, yb));
  x->data = d->x;
  x->device = PX_CUDA;
  x->owned = false;
  *y = (const int32_t *)d->y;
  return PX_OK;
#else
  (void)d;
  return px_error(PX_ERR_UNSUPPORTED, "train: the model is on a GPU but this plexus was built without CUDA");
#endif
}

void px_dev_batch_free(px_dev_batch *d) {
#ifdef PX_HAVE_CUDA
  px_cuda_free(d->x);
  px_cuda_free(d->y);
#endif
  memset(d, 0, sizeof *d);
}

px_status px_device_scale(const px_model *model, float *x, size_t n, float a) {
#ifdef PX_HAVE_CUDA
  if (model->device == PX_CUDA) return px_cuda_scale(x, n, a);
#endif
  (void)model;
  px_scale(x, n, a);
  return PX_OK;
}

px_status px_device_grad_norm(px_model *model, float max_norm, double *norm) {
  float *g = model->grad_data;
  const size_t n = model->n_param_elems;
  if (max_norm > 0.0f) {  // px_clip_grad_norm's rule, on the model's device
    float nf;
    TRY(px_clip_grad_norm_on(model->device, g, n, max_norm, &nf));
    *norm = nf;
    return PX_OK;
  }
  double ss;
  TRY(px_sumsq_on(model->device, g, n, &ss));
  *norm = sqrt(ss);
  return PX_OK;
}

px_status px_device_count_correct(const px_tensor *logits, const int32_t *y_host, int64_t *correct) {
  if (logits->device != PX_CUDA) {
    *correct = px_count_correct(logits, y_host);
    return PX_OK;
  }
#ifdef PX_HAVE_CUDA
  const size_t n = (size_t)px_tensor_numel(logits);
  float *h = malloc((n > 0 ? n : 1) * sizeof *h);
  if (!h) return px_error(PX_ERR_NOMEM, "evaluate: out of memory for the logits' host copy (%zu floats)", n);
  px_status st = px_cuda_to_host(h, logits->data, n * sizeof *h);
  if (st == PX_OK) {
    const px_tensor v = px_tensor_view(h, PX_F32, logits->ndim, logits->shape);
    *correct = px_count_correct(&v, y_host);
  }
  free(h);
  return st;
#else
  return px_error(PX_ERR_UNSUPPORTED, "evaluate: logits on a GPU but this plexus was built without CUDA");
#endif
}

px_status px_trainer_pull(px_model *model, px_optim *opt) {
#ifdef PX_HAVE_CUDA
  if (model->device == PX_CUDA) {
    TRY(px_model_pull(model));
    if (opt) TRY(px_optim_pull(opt));
  }
#endif
  (void)model;
  (void)opt;
  return PX_OK;
}

px_status px_trainer_push(px_model *model, px_optim *opt) {
#ifdef PX_HAVE_CUDA
  if (model->device == PX_CUDA) {
    TRY(px_model_push(model));
    if (opt) TRY(px_optim_push(opt));
  }
#endif
  (void)model;
  (void)opt;
  return PX_OK;
}

float *px_host_params(px_model *model) { return model->device == PX_CUDA ? model->host_param_data : model->param_data; }

float *px_host_buffers(px_model *model) {
  return model->device == PX_CUDA ? model->host_buffer_data : model->buffer_data;
}

void px_trainer_label(px_trainer *t, const char *label) {
  px_comm_set_label(t->comm, label);
  if (t->nccl) px_comm_set_label(t->nccl, label);
}

px_status px_trainer_device_setup(px_trainer *t) {
  const px_train_opts *o = &t->o;
  if (o->device == PX_CPU && o->precision == PX_F32 && t->model->device == PX_CPU) return PX_OK;
  TRY(px_train_to_device(t->comm, t->model, o->device, o->precision));
  if (o->device != PX_CUDA) return PX_OK;
#ifdef PX_HAVE_CUDA
  if (t->dp > 1) {
    // NCCL takes one GPU per rank: a node with more ranks than GPUs would
    // put two ranks on one (NCCL refuses), so every rank stops here.
    const int n = px_cuda_device_count(), local = px_comm_local_size(t->comm);
    int32_t bad = local > n;
    TRY(px_comm_allreduce(t->comm, &bad, 1, PX_I32, PX_MAX));
    if (bad)
      return px_error(PX_ERR_UNSUPPORTED,
                      "--device cuda: %d ranks on %s node but %d GPU%s: data parallel over NCCL "
                      "takes one GPU per rank; start at most as many ranks per node as it has GPUs",
                      local, local > n ? "this" : "a", n, n == 1 ? "" : "s");
    px_trainer_label(t, "NCCL communicator");
    px_status st = px_comm_nccl_create(t->comm, &t->nccl);
    if (st != PX_OK) return px_error_wrap(st, "--device cuda: NCCL for data parallel over %d ranks", t->dp);
    t->dp_comm = t->nccl;
  }
  return px_log_text(t->log, "device: %d GPU%s, one per rank (rank 0: GPU %d, %s); %s GEMMs%s", t->world,
                     t->world == 1 ? "" : "s", px_cuda_current_device(), px_cuda_device_name(),
                     o->precision == PX_BF16 ? "bf16" : "f32", t->nccl ? "; DDP over NCCL" : "");
#else
  return px_error(PX_ERR_UNSUPPORTED, "--device cuda: this plexus was built without CUDA");
#endif
}

px_status px_trainer_optim_to_device(px_trainer *t) {
#ifdef PX_HAVE_CUDA
  if (t->model->device == PX_CUDA && t->opt) {
    px_status st = px_optim_to_device(t->opt);
    if (st != PX_OK) return px_error_wrap(st, "--device cuda: the optimizer's state onto the GPU");
  }
#endif
  (void)t;
  return PX_OK;
}

void px_trainer_device_free(px_trainer *t) {
  px_dev_batch_free(&t->staged);
#ifdef PX_HAVE_CUDA
  px_comm_free(t->nccl);
#endif
  t->nccl = NULL;
}
