// DDP: buckets of the flat gradient buffer, all-reduced asynchronously as
// backward fills them (DESIGN decisions 1 and 2).
//
//   grad_data: [ p0 | p1 | p2 | p3 | p4 | p5 ]      layout = forward order
//   buckets:              [   b1   ][    b0   ]     reverse order, b0 first
//
// Backward produces gradients from the last layer to the first, so bucket
// b0 (the end of the buffer) fills first; its all-reduce runs while backward
// computes the rest.  Buckets launch strictly in index order on every rank,
// so all ranks issue the same collectives in the same order.
//
// On the GPU (model->device == PX_CUDA) the communicator must be an NCCL
// one: the buckets are slices of the device gradient buffer, each
// all-reduced on the communication stream after the backward kernels that
// filled it (nccl.c orders them by an event), and the averaging scale runs
// on the compute stream after every bucket's all-reduce.  With reduce_dtype
// PX_BF16 a bucket is cast to bf16 before its all-reduce (into d->bf16, the
// same offsets) and cast back after it: half the bytes on the wire, sums
// rounded to bf16 (PyTorch FSDP's reduce_dtype).
#include "plexus/parallel.h"
#include "parallel/internal.h"
#include "parallel/rank_sum.h"
#ifdef PX_HAVE_CUDA
#include "tensor/cuda/px_cuda.h"
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bucket {
  size_t offset, count; /* grad_data[offset, offset + count) */
  int pending;          /* parameters not yet ready this step */
  int n_params;
  pxr_sum *req; /* sums in rank order, as ZeRO's reduce-scatters */
  double t_start;
  double t_done; /* first seen complete (0: not yet this step) */
} bucket;

struct px_ddp {
  px_model *model;
  px_comm *comm;
  pxr_ctx rsum;
  px_ddp_opts opts;
  bucket *buckets;
  int n_buckets;
  int *param_bucket; /* (n_params,) bucket of each parameter */
  bool *param_ready; /* (n_params,) */
  bool *module_ran;  /* (n_modules,) ran forward this step */
  int next_launch;   /* buckets launch in index order */
  bool sync;
  bool attached;
  int hook_handle;    /* px_model_attach_hooks */
  int divisor;        /* ranks whose gradients are averaged */
  bool buffers_dirty; /* a training forward changed the buffers since their broadcast */
  px_status error;    /* first failure inside a hook */
  char error_msg[512];
  uint16_t *bf16; /* reduce_dtype PX_BF16: the gradients' bf16 copy (device), bucket by bucket */
};

static int param_index(const px_model *md, const px_param *p) { return px_parallel_param_index(md, p); }

static void fail(px_ddp *d, px_status st) {
  if (d->error == PX_OK) {
    d->error = st;
    snprintf(d->error_msg, sizeof d->error_msg, "%s", px_last_error());
  }
}

/* Whether a bucket's all-reduce can average it itself (PX_AVG), in place of
 * the sum and scale_grads' pass after it, with the same bits: on the host,
 * through the backend's own all-reduce (rank_sum.h: 2 ranks, or the threads
 * backend), when every rank's gradient counts and their number is a power
 * of two, so that the backend's sum ÷ n is the sum × (1/n) exactly.  The
 * threads backend divides inside its reduction pass: one pass over the
 * gradients fewer a step (docs/PERFORMANCE.md, "Figures behind code
 * comments"); MPI divides after the sum, as scale_grads would. */
static bool average_in_collective(const px_ddp *d) {
  const int n = d->divisor;
  return !d->bf16 && d->model->device == PX_CPU && !d->rsum.p2p && n == px_comm_size(d->comm) && (n & (n - 1)) == 0;
}

/* grads /= divisor (as a multiplication by 1/divisor), where they live,
 * unless this step's all-reduces averaged them (the divisor changes only
 * at px_ddp_join, between steps). */
static px_status scale_grads(px_ddp *d) {
  const float a = 1.0f / (float)d->divisor;
#ifdef PX_HAVE_CUDA
  if (d->model->device == PX_CUDA) return px_cuda_scale(d->model->grad_data, d->model->n_param_elems, a);
#endif
  if (!average_in_collective(d)) px_scale(d->model->grad_data, d->model->n_param_elems, a);
  return PX_OK;
}

/* A device model's gradients travel over NCCL, a host model's over a host backend. */
static px_status check_device(const px_model *model, px_comm *comm) {
  const bool nccl = px_comm_backend_of(comm) == PX_COMM_NCCL;
  if (model->device == PX_CUDA && !nccl)
    return px_error(PX_ERR_INVALID,
                    "DDP: the model is on the GPU but the communicator is the %s backend's; a "
                    "device model's DDP needs an NCCL communicator (px_comm_nccl_create over this one)",
                    px_comm_backend_name(px_comm_backend_of(comm)));
  if (model->device != PX_CUDA && nccl)
    return px_error(PX_ERR_INVALID,
                    "DDP: the communicator is NCCL's (device buffers) but the model is on the CPU; "
                    "move the model with px_model_to_device, or wrap it with the bootstrap communicator");
  return PX_OK;
}

/* The last bucket fills when backward has nothing left to compute, so
 * its all-reduce has nothing to overlap with.  Under MPI it then runs as a
 * blocking MPI_Allreduce: Open MPI's non-blocking all-reduce (libnbc) plus
 * the wait took 3× as long on 1 MB between 2 ranks (the MLP's gradient at
 * batch 16: docs/PERFORMANCE.md, "Figures behind code comments").  Only
 * where the sum is MPI's own (2 ranks: with 3 or more, rank_sum.c's
 * rank-order sums run instead) on the CPU in f32, so the bits are the
 * same: a sum of two is one addition either way. */
static bool last_bucket_blocking(const px_ddp *d, int b) {
  return b == d->n_buckets - 1 && !d->bf16 && d->model->device == PX_CPU && !d->rsum.p2p &&
    px_comm_backend_of(d->comm) == PX_COMM_MPI;
}

static void launch_ready_buckets(px_ddp *d) {
  while (d->next_launch < d->n_buckets && d->buckets[d->next_launch].pending == 0) {
    bucket *b = &d->buckets[d->next_launch];
    char label[64];
    snprintf(label, sizeof label, "DDP step %llu, bucket %d", (unsigned long long)d->model->ctx.step, d->next_launch);
    px_comm_set_label(d->comm, label);
    b->t_start = px_time_now();
    b->t_done = 0;
    px_status st;
    if (d->bf16) {
      // Cast on the compute stream after the kernels that made the
      // gradients; NCCL's stream waits for it (nccl.c's ready event).
      st = PX_ERR_INTERNAL;
#ifdef PX_HAVE_CUDA
      st = px_cuda_to_bf16(d->bf16 + b->offset, d->model->grad_data + b->offset, b->count);
      if (st == PX_OK) st = pxr_allreduce_native(&d->rsum, d->bf16 + b->offset, b->count, PX_BF16, PX_SUM, &b->req);
#endif
    } else if (last_bucket_blocking(d, d->next_launch)) {
      b->req = NULL;
      st = px_comm_allreduce(d->comm, d->model->grad_data + b->offset, b->count, PX_F32,
                             average_in_collective(d) ? PX_AVG : PX_SUM);
      b->t_done = px_time_now();
    } else if (average_in_collective(d)) {
      st = pxr_allreduce_native(&d->rsum, d->model->grad_data + b->offset, b->count, PX_F32, PX_AVG, &b->req);
    } else {
      st = pxr_allreduce(&d->rsum, d->model->grad_data + b->offset, b->count, &b->req);
    }
    if (st != PX_OK) {
      fail(d, st);
      b->req = NULL;
    }
    d->next_launch++;
  }
}

static void mark_ready(px_ddp *d, int i) {
  if (i < 0 || d->param_ready[i]) return;
  d->param_ready[i] = true;
  d->buckets[d->param_bucket[i]].pending--;
  launch_ready_buckets(d);
}

static void begin_step(px_ddp *d) {
  memset(d->param_ready, 0, (size_t)d->model->n_params * sizeof *d->param_ready);
  memset(d->module_ran, 0, (size_t)d->model->n_modules * sizeof *d->module_ran);
  for (int b = 0; b < d->n_buckets; b++) {
    d->buckets[b].pending = d->buckets[b].n_params;
    d->buckets[b].req = NULL;
  }
  d->next_launch = 0;
  d->error = PX_OK;
}

static void on_pre_forward(void *user, px_module *m) {
  px_ddp *d = user;
  if (!d->attached || m != d->model->root || d->model->ctx.recomputing) return;
  begin_step(d);
  // The root's running statistics before every forward that follows a
  // training one (PyTorch's broadcast_buffers); a failure surfaces in
  // px_ddp_sync.
  px_status st = px_parallel_sync_buffers(d->model, d->comm, d->opts.root, &d->buffers_dirty, d->model->ctx.training);
  if (st != PX_OK) fail(d, st);
}

static void on_post_forward(void *user, px_module *m) {
  px_ddp *d = user;
  if (d->attached) d->module_ran[m->uid] = true;
}

static void on_pre_backward(void *user, px_module *m) {
  px_ddp *d = user;
  if (!d->attached || !d->sync || m != d->model->root || !d->opts.find_unused_parameters) return;
  // Parameters of modules that did not run get no gradient: ready now, so
  // their buckets still complete on every rank.
  for (int i = 0; i < d->model->n_params; i++)
    if (!d->module_ran[d->model->params[i]->owner->uid]) mark_ready(d, i);
}

/* MPI (Open MPI) moves a non-blocking collective only inside MPI calls:
 * left alone during backward, a bucket's all-reduce would sit still until
 * px_ddp_sync waits for it, and nothing would overlap.  So every hook that
 * backward fires tests the buckets in flight, oldest first (they complete
 * in launch order, so the first one not done ends the round).  A failed
 * test is left for px_ddp_sync's wait, which reports it. */
static void progress_buckets(px_ddp *d) {
  for (int b = 0; b < d->next_launch; b++) {
    bucket *bk = &d->buckets[b];
    bool done = false;
    if (!bk->req || bk->t_done > 0) continue;
    if (pxr_test(bk->req, &done) != PX_OK || !done) return;
    bk->t_done = px_time_now();
  }
}

static void on_grads_ready(void *user, px_module *m) {
  px_ddp *d = user;
  if (!d->attached || !d->sync) return;
  for (int k = 0; k < m->n_params; k++)
    if (!m->params[k].is_buffer) mark_ready(d, param_index(d->model, &m->params[k]));
  progress_buckets(d);
}

static px_status build_buckets(px_ddp *d) {
  px_model *md = d->model;
  d->buckets = calloc((size_t)md->n_params + 1, sizeof *d->buckets);
  d->param_bucket = calloc((size_t)md->n_params + 1, sizeof *d->param_bucket);
  d->param_ready = calloc((size_t)md->n_params + 1, sizeof *d->param_ready);
  d->module_ran = calloc((size_t)md->n_modules + 1, sizeof *d->module_ran);
  if (!d->buckets || !d->param_bucket || !d->param_ready || !d->module_ran)
    return px_error(PX_ERR_NOMEM, "DDP: out of memory");
  // Walk parameters from the last to the first; close a bucket when the
  // next parameter would overflow it (a bucket holds at least one).
  size_t cap = d->opts.first_bucket_bytes, used = 0;
  int b = -1;
  for (int i = md->n_params - 1; i >= 0; i--) {
    size_t bytes = md->params[i]->numel * sizeof(float);
    if (b < 0 || (used > 0 && used + bytes > cap)) {
      if (b >= 0) cap = d->opts.bucket_bytes;
      b++;
      used = 0;
    }
    bucket *bk = &d->buckets[b];
    bk->offset = md->params[i]->offset;
    bk->count += md->params[i]->numel;
    bk->n_params++;
    used += bytes;
    d->param_bucket[i] = b;
  }
  d->n_buckets = b + 1;
  return PX_OK;
}

px_status px_ddp_wrap(px_ddp **out, px_model *model, px_comm *comm, const px_ddp_opts *opts) {
  *out = NULL;
  px_ddp_opts o = opts ? *opts : PX_DDP_DEFAULTS;
  if (o.bucket_bytes == 0) o.bucket_bytes = PX_DDP_DEFAULTS.bucket_bytes;
  // The first bucket is the small one that starts communication early: a
  // bucket size below the default first size (1 MiB) makes it that size
  // too, so a caller who shrinks the buckets need not know of the first.
  // ZeRO's px_zero_wrap does the same.
  if (o.first_bucket_bytes > o.bucket_bytes) o.first_bucket_bytes = o.bucket_bytes;
  if (o.first_bucket_bytes == 0) o.first_bucket_bytes = o.bucket_bytes;
  if (o.root < 0 || o.root >= px_comm_size(comm))
    return px_error(PX_ERR_INVALID, "DDP: root rank %d outside [0, %d)", o.root, px_comm_size(comm));
  px_status st = check_device(model, comm);
  if (st != PX_OK) return st;
  if (o.reduce_dtype != PX_F32 && o.reduce_dtype != PX_BF16)
    return px_error(PX_ERR_UNSUPPORTED, "DDP: gradients are reduced in f32 or bf16, not %s",
                    px_dtype_name(o.reduce_dtype));
  if (o.reduce_dtype == PX_BF16 && model->device != PX_CUDA)
    return px_error(PX_ERR_UNSUPPORTED,
                    "DDP: bf16 gradient reduction runs over NCCL on the GPU (--device cuda); "
                    "on the CPU gradients are reduced in f32");
  st = px_parallel_check_layout(model, comm, "DDP");
  if (st != PX_OK) return st;
  // FluxMPI's synchronize!: everyone starts from the root's parameters and
  // running statistics.
  px_comm_set_label(comm, "DDP wrap: broadcast parameters");
  if ((st = px_comm_broadcast(comm, model->param_data, model->n_param_elems, PX_F32, o.root)) != PX_OK) return st;
  if (model->n_buffer_elems &&
      (st = px_comm_broadcast(comm, model->buffer_data, model->n_buffer_elems, PX_F32, o.root)) != PX_OK)
    return st;
  px_ddp *d = calloc(1, sizeof *d);
  if (!d) return px_error(PX_ERR_NOMEM, "DDP: out of memory");
  d->model = model;
  d->comm = comm;
  d->opts = o;
  d->sync = true;
  d->divisor = px_comm_size(comm);
#ifdef PX_HAVE_CUDA
  if (o.reduce_dtype == PX_BF16 &&
      !(d->bf16 = px_cuda_malloc((model->n_param_elems ? model->n_param_elems : 1) * sizeof(uint16_t)))) {
    px_ddp_free(d);
    return px_error_wrap(PX_ERR_NOMEM, "DDP: the gradients' bf16 copy");
  }
#endif
  if ((st = build_buckets(d)) != PX_OK || (st = pxr_init(&d->rsum, comm)) != PX_OK) {
    px_ddp_free(d);
    return st;
  }
  px_hooks h = {.user = d,
                .pre_forward = on_pre_forward,
                .post_forward = on_post_forward,
                .pre_backward = on_pre_backward,
                .grads_ready = on_grads_ready};
  if ((st = px_model_attach_hooks(model, &h, &d->hook_handle)) != PX_OK) {
    px_ddp_free(d);
    return st;
  }
  d->attached = true;
  begin_step(d);
  *out = d;
  return PX_OK;
}

void px_ddp_free(px_ddp *d) {
  if (!d) return;
  // The hook table keeps a pointer to d: remove it (the slot is reused).
  px_model_remove_hooks(d->model, d->hook_handle);
  free(d->buckets);
  free(d->param_bucket);
  free(d->param_ready);
  free(d->module_ran);
  pxr_fini(&d->rsum);
#ifdef PX_HAVE_CUDA
  px_cuda_free(d->bf16);
#endif
  free(d);
}

void px_ddp_set_sync(px_ddp *d, bool sync) { d->sync = sync; }

static px_status wait_all(px_ddp *d) {
  px_status first = PX_OK;
  for (int b = 0; b < d->n_buckets; b++) {
    if (!d->buckets[b].req) continue;
    px_status st = pxr_wait(d->buckets[b].req);
    if (d->buckets[b].t_done == 0) d->buckets[b].t_done = px_time_now();
    d->buckets[b].req = NULL;
#ifdef PX_HAVE_CUDA
    // bf16 reduction: the sums back into the f32 gradients (the compute
    // stream waits for the collective: nccl.c's finish).
    if (st == PX_OK && d->bf16)
      st = px_cuda_from_bf16(d->model->grad_data + d->buckets[b].offset, d->bf16 + d->buckets[b].offset,
                             d->buckets[b].count);
#endif
    if (st != PX_OK && first == PX_OK) first = st;
  }
  return first;
}

px_status px_ddp_sync(px_ddp *d) {
  if (!d->sync) return PX_OK;
  px_status st = PX_OK;
  if (d->error != PX_OK) st = px_error(d->error, "%s", d->error_msg);
  for (int i = 0; i < d->model->n_params && st == PX_OK; i++)
    if (!d->param_ready[i])
      st = px_error(PX_ERR_INVALID,
                    "DDP: parameter \"%s\" received no gradient this step (its module did not run "
                    "forward, or backward was not called); set find_unused_parameters if that is expected",
                    d->model->params[i]->name);
  if (st != PX_OK) {
    // Our peers are (or will be) inside collectives we will never join.
    wait_all(d);
    px_comm_abort(d->comm, px_last_error());
    return st;
  }
  if ((st = wait_all(d)) != PX_OK) return st;
  if ((st = scale_grads(d)) != PX_OK) return st;
  begin_step(d);
  return PX_OK;
}

px_status px_ddp_join(px_ddp *d, bool have_batch, int *active) {
  int32_t n = have_batch ? 1 : 0;
  px_comm_set_label(d->comm, "DDP join");
  px_status st = px_comm_allreduce(d->comm, &n, 1, PX_I32, PX_SUM);
  if (st != PX_OK) return st;
  *active = n;
  d->divisor = n > 0 ? n : px_comm_size(d->comm);
  return PX_OK;
}

px_status px_ddp_shadow(px_ddp *d) {
  // Join the buffers' broadcast the active ranks' forward makes, then
  // contribute zeros to every bucket, in the same order as they do.
  px_status bst = px_parallel_sync_buffers(d->model, d->comm, d->opts.root, &d->buffers_dirty, true);
  if (bst != PX_OK) return bst;
#ifdef PX_HAVE_CUDA
  if (d->model->device == PX_CUDA) {
    if (d->model->grad_data &&
        (bst = px_cuda_zero(d->model->grad_data, d->model->n_param_elems * sizeof(float))) != PX_OK)
      return bst;
  } else
#endif
    px_model_zero_grad(d->model);
  begin_step(d);
  bool keep = d->sync;
  d->sync = true;
  for (int i = 0; i < d->model->n_params; i++) mark_ready(d, i);
  d->sync = keep;
  px_status st = wait_all(d);
  if (st != PX_OK) return st;
  if ((st = scale_grads(d)) != PX_OK) return st;
  begin_step(d);
  return PX_OK;
}

int px_ddp_bucket_count(const px_ddp *d) { return d->n_buckets; }

void px_ddp_bucket_range(const px_ddp *d, int b, size_t *offset, size_t *count) {
  *offset = d->buckets[b].offset;
  *count = d->buckets[b].count;
}

double px_ddp_bucket_start_time(const px_ddp *d, int b) { return d->buckets[b].t_start; }

double px_ddp_bucket_done_time(const px_ddp *d, int b) { return d->buckets[b].t_done; }
