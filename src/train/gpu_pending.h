/* train/gpu_pending.h — TEMPORARY: the device functions the training loop
 * calls that other branches of issue 15 are adding (optim, comm/nccl.c).
 * Each declaration goes away when its definition lands on main (the header
 * is deleted with the last).  Only read under PX_HAVE_CUDA.
 *
 * They are declared weak so that the CUDA build links before they land
 * (device.c then refuses with a message naming the missing function).
 * DELETE THIS HEADER once they are on main: a weak reference does not pull
 * an object out of libplexus.a, so a function alone in its file (nccl.c)
 * would stay missing in programs linked with the static library. */
#ifndef PX_TRAIN_GPU_PENDING_H
#define PX_TRAIN_GPU_PENDING_H

#ifdef PX_HAVE_CUDA
#include "plexus/comm.h"
#include "plexus/optim.h"

/* optim: the state on the device (params/grads are already device
 * pointers); px_optim_state_slot returns the host mirror, refreshed by pull. */
px_status px_optim_to_device(px_optim *o) __attribute__((weak));
px_status px_optim_pull(px_optim *o) __attribute__((weak));
px_status px_optim_push(px_optim *o) __attribute__((weak));

/* comm/nccl.c: an NCCL communicator over bootstrap's ranks (device buffers),
 * created after px_cuda_init on the calling thread; px_comm_free frees it. */
px_status px_comm_nccl_create(px_comm *bootstrap, px_comm **out) __attribute__((weak));
/* PX_ERR_UNSUPPORTED naming fn when it is not linked in (see above). */
#define PX_PENDING(fn)                                                                                      \
  do {                                                                                                      \
    if (!(fn))                                                                                              \
      return px_error(PX_ERR_UNSUPPORTED, "--device cuda: %s is not linked into this plexus (delete "        \
                      "src/train/gpu_pending.h once it is on main)", #fn);                                  \
  } while (0)
#endif

#endif
