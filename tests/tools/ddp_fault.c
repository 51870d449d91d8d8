/* ddp_fault — a DDP training loop in which rank 1 fails mid-step, for
 * tests/test_ddp_fault_ends_job.py.
 *
 *   ddp_fault --mode exit|hang [--threads N] [--timeout S]
 *     exit: rank 1 leaves in the middle of step 3 (after forward, before
 *           backward): returns 3 from its rank function (threads), or calls
 *           exit(3) without finalising MPI (a crashed process);
 *     hang: rank 1 stops taking part in step 3 (sleeps 4 × timeout) while the
 *           others wait in DDP's bucket all-reduce: their watchdog must fire. */
#define _POSIX_C_SOURCE 200809L
#include <plexus/plexus.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *mode = "exit";
static double timeout_s = 2.0;

static int train(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, timeout_s);
  px_model *md;
  if (px_model_create(&md, px_chain_of(3, px_linear(4, 64, true), px_tanh(), px_linear(64, 1, true)), 1) != PX_OK)
    return 2;
  px_ddp *d;
  if (px_ddp_wrap(&d, md, c, NULL) != PX_OK) {
    fprintf(stderr, "wrap: %s\n", px_last_error());
    return 2;
  }
  float x[8 * 4], t[8];
  for (int i = 0; i < 32; i++) x[i] = (float)i / 32.0f;
  for (int i = 0; i < 8; i++) t[i] = (float)i / 8.0f;
  px_tensor X = px_tensor_f32(x, 2, 8, 4, 0, 0), T = px_tensor_f32(t, 2, 8, 1, 0, 0), Y;
  for (int step = 0; step < 6; step++) {
    px_model_zero_grad(md);
    if (px_model_forward(md, &X, &Y) != PX_OK) return 2;
    if (step == 3 && px_comm_rank(c) == 1) {
      if (strcmp(mode, "hang") == 0) {
        struct timespec ts = {(time_t)(4 * timeout_s), 0};
        nanosleep(&ts, NULL);
        return 0;
      }
      if (px_comm_backend_of(c) == PX_COMM_MPI) exit(3);
      return 3;
    }
    px_tensor dY = Y;
    float loss;
    dY.data = px_model_scratch(md, 8);
    px_mse_loss(&Y, &T, &loss, px_f32(&dY));
    if (px_model_backward(md, &dY, NULL) != PX_OK) return 2;
    px_status st = px_ddp_sync(d);
    if (st != PX_OK) {
      fprintf(stderr, "ddp_fault: rank %d: step %d: %s: %s\n", px_comm_rank(c), step, px_status_name(st),
              px_last_error());
      return 1;
    }
  }
  px_ddp_free(d);
  px_model_free(md);
  return 0;
}

int main(int argc, char **argv) {
  int threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--mode") == 0) mode = argv[i + 1];
    else if (strcmp(argv[i], "--threads") == 0) threads = atoi(argv[i + 1]);
    else if (strcmp(argv[i], "--timeout") == 0) timeout_s = atof(argv[i + 1]);
  }
  int code = 0;
  if (px_comm_run(threads, train, NULL, &code) != PX_OK) {
    fprintf(stderr, "ddp_fault: %s\n", px_last_error());
    return 1;
  }
  return code;
}
