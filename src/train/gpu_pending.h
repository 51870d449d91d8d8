/* train/gpu_pending.h — TEMPORARY: the device functions the training loop
 * calls that other branches of issue 15 are adding (model.c, optim, comm).
 * Each declaration goes away when its definition lands on main (the header
 * is deleted with the last).  Only read under PX_HAVE_CUDA. */
#ifndef PX_TRAIN_GPU_PENDING_H
#define PX_TRAIN_GPU_PENDING_H

#ifdef PX_HAVE_CUDA
#include "plexus/comm.h"
#include "plexus/nn.h"
#include "plexus/optim.h"

/* model.c: move the flat buffers to `device` (GPU index gpu); the host
 * mirrors (host_param_data, host_buffer_data) keep a copy that state dicts
 * view; pull refreshes the mirrors, push copies them to the device. */
px_status px_model_to_device(px_model *m, px_device device, int gpu);
px_status px_model_pull(px_model *m);
px_status px_model_push(px_model *m);
px_status px_model_set_compute_dtype(px_model *m, px_dtype dtype);

/* optim: the state on the device (params/grads are already device
 * pointers); px_optim_state_slot returns the host mirror, refreshed by pull. */
px_status px_optim_to_device(px_optim *o);
px_status px_optim_pull(px_optim *o);
px_status px_optim_push(px_optim *o);

/* comm/nccl.c: an NCCL communicator over bootstrap's ranks (device buffers),
 * created after px_cuda_init on the calling thread; px_comm_free frees it. */
px_status px_comm_nccl_create(px_comm *bootstrap, px_comm **out);
#endif

#endif
