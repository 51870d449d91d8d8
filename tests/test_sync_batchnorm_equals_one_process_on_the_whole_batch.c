/* Claim: a model with synchronized batch norm (px_sync_batchnorm_convert)
 * under DDP on N = 2 and 3 ranks (threads), each rank holding B samples,
 * computes what one process with plain batch norm computes on the N·B
 * batch, to 1e-5: the forward output of every sample, the parameter
 * gradients (DDP's average), the input gradients (N times the one
 * process's: each rank's loss is the mean over its B samples), and the
 * running statistics after two training steps on every rank; and the
 * evaluation output afterwards.  Without synchronization the same run
 * differs (checked too): each rank would normalise with its own batch.
 *
 * If it fails, --sync-bn does not train the model a single process trains
 * on the whole batch (PyTorch's SyncBatchNorm contract). */
#include "px_test.h"

#include <math.h>
#include <string.h>

enum { B = 4, CIN = 2, COUT = 3, H = 5, W = 5, MAXN = 3 };
#define SAMPLE (CIN * H * W)
#define OUT_SAMPLE (COUT * H * W)

typedef struct ref {
  int n;                             /* ranks */
  float x[MAXN * B * SAMPLE];        /* the whole batch */
  float r[MAXN * B * OUT_SAMPLE];    /* the loss's projection */
  float y[2][MAXN * B * OUT_SAMPLE]; /* one process: outputs of steps 1, 2 */
  float dx[MAXN * B * SAMPLE];       /* step 1's input gradient */
  float grads[4096];                 /* step 1's parameter gradients */
  float buffers[64];                 /* running statistics after 2 steps */
  float eval_y[MAXN * B * OUT_SAMPLE];
  size_t n_params, n_buffers;
  bool sync;      /* the ranks convert to sync batch norm */
  double worst_y; /* largest difference seen (the unsynchronized case) */
} ref;

static px_module *build(void) {
  return px_chain_of(3, px_conv2d(CIN, COUT, 3, 1, 1, true), px_batchnorm(COUT, 1e-5f, 0.1f), px_relu());
}

static bool close_to(double a, double b, double tol) { return fabs(a - b) <= tol * fmax(1.0, fmax(fabs(a), fabs(b))); }

// One SGD-free step: forward, loss = Σ y·r / rows, backward.  Returns y.
static void step(px_model *md, const float *x, const float *r, int rows, px_tensor *y, float *dx_out) {
  px_tensor xt = px_tensor_f32((float *)x, 4, rows, CIN, H, W);
  CHECK_OK(px_model_forward(md, &xt, y));
  const size_t ny = (size_t)px_tensor_numel(y);
  float *dy = px_model_scratch(md, ny);
  for (size_t i = 0; i < ny; i++) dy[i] = r[i] / (float)rows;
  px_tensor dyt = *y;
  dyt.data = dy;
  px_tensor dxt;
  px_model_zero_grad(md);
  CHECK_OK(px_model_backward(md, &dyt, &dxt));
  if (dx_out) memcpy(dx_out, px_f32(&dxt), (size_t)px_tensor_numel(&dxt) * sizeof(float));
}

static void one_process(ref *R) {
  px_model *md = NULL;
  CHECK_OK(px_model_create(&md, build(), 7));
  const int rows = R->n * B;
  px_tensor y;
  step(md, R->x, R->r, rows, &y, R->dx);
  memcpy(R->y[0], px_f32(&y), (size_t)rows * OUT_SAMPLE * sizeof(float));
  R->n_params = md->n_param_elems;
  memcpy(R->grads, md->grad_data, md->n_param_elems * sizeof(float));
  step(md, R->x, R->r, rows, &y, NULL);
  memcpy(R->y[1], px_f32(&y), (size_t)rows * OUT_SAMPLE * sizeof(float));
  R->n_buffers = md->n_buffer_elems;
  memcpy(R->buffers, md->buffer_data, md->n_buffer_elems * sizeof(float));
  px_model_train(md, false);
  px_tensor xt = px_tensor_f32(R->x, 4, rows, CIN, H, W);
  CHECK_OK(px_model_forward(md, &xt, &y));
  memcpy(R->eval_y, px_f32(&y), (size_t)rows * OUT_SAMPLE * sizeof(float));
  px_model_free(md);
}

static int rank_fn(px_comm *comm, void *arg) {
  ref *R = arg;
  const int k = px_comm_rank(comm), n = px_comm_size(comm);
  px_module *root = build();
  int converted = 0;
  if (R->sync) CHECK_OK(px_sync_batchnorm_convert(root, comm, &converted));
  CHECK(converted == (R->sync ? 1 : 0), "converted %d batch norms", converted);
  px_model *md = NULL;
  CHECK_OK(px_model_create(&md, root, 7));
  px_ddp *ddp = NULL;
  CHECK_OK(px_ddp_wrap(&ddp, md, comm, NULL));
  const float *x = R->x + (size_t)k * B * SAMPLE, *r = R->r + (size_t)k * B * OUT_SAMPLE;
  float dx[B * SAMPLE];
  double worst = 0;
  for (int s = 0; s < 2; s++) {
    px_tensor y;
    step(md, x, r, B, &y, s == 0 ? dx : NULL);
    CHECK_OK(px_ddp_sync(ddp));
    const float *want = R->y[s] + (size_t)k * B * OUT_SAMPLE;
    for (int i = 0; i < B * OUT_SAMPLE; i++) {
      worst = fmax(worst, fabs(px_f32(&y)[i] - want[i]));
      if (R->sync && !close_to(px_f32(&y)[i], want[i], 1e-5)) {
        CHECK(false, "%d ranks, rank %d, step %d: y[%d] = %.8g, one process %.8g", n, k, s + 1, i,
              (double)px_f32(&y)[i], (double)want[i]);
        break;
      }
    }
    if (s == 0 && R->sync) {
      for (size_t i = 0; i < R->n_params; i++)
        if (!close_to(md->grad_data[i], R->grads[i], 1e-5)) {
          CHECK(false, "%d ranks, rank %d: gradient %zu = %.8g, one process %.8g", n, k, i, (double)md->grad_data[i],
                (double)R->grads[i]);
          break;
        }
      const float *want_dx = R->dx + (size_t)k * B * SAMPLE;
      for (int i = 0; i < B * SAMPLE; i++)
        if (!close_to(dx[i] / (float)n, want_dx[i], 1e-5)) {
          CHECK(false, "%d ranks, rank %d: input gradient %d / N = %.8g, one process %.8g", n, k, i,
                (double)(dx[i] / (float)n), (double)want_dx[i]);
          break;
        }
    }
  }
  if (R->sync)
    for (size_t i = 0; i < R->n_buffers; i++)
      CHECK(close_to(md->buffer_data[i], R->buffers[i], 1e-5),
            "%d ranks, rank %d: running statistic %zu = %.8g, "
            "one process %.8g",
            n, k, i, (double)md->buffer_data[i], (double)R->buffers[i]);
  px_model_train(md, false);
  px_tensor xt = px_tensor_f32((float *)x, 4, B, CIN, H, W), y;
  CHECK_OK(px_model_forward(md, &xt, &y));
  if (R->sync)
    for (int i = 0; i < B * OUT_SAMPLE; i++)
      if (!close_to(px_f32(&y)[i], R->eval_y[(size_t)k * B * OUT_SAMPLE + i], 1e-5)) {
        CHECK(false, "%d ranks, rank %d: evaluation output %d differs", n, k, i);
        break;
      }
  if (k == 0) R->worst_y = worst;
  px_ddp_free(ddp);
  px_model_free(md);
  return 0;
}

int main(void) {
  static ref R;
  for (int n = 2; n <= MAXN; n++) {
    memset(&R, 0, sizeof R);
    R.n = n;
    px_rng g = px_rng_make(11, (uint64_t)n);
    // Each rank's samples drawn around a different mean, so per-rank and
    // global statistics differ clearly.
    for (int i = 0; i < n * B * SAMPLE; i++)
      R.x[i] = px_rng_uniform(&g) * 2.0f - 1.0f + 0.7f * (float)(i / (B * SAMPLE));
    for (int i = 0; i < n * B * OUT_SAMPLE; i++) R.r[i] = px_rng_uniform(&g) * 2.0f - 1.0f;
    one_process(&R);
    for (int sync = 1; sync >= 0; sync--) {
      R.sync = sync;
      int code = 0;
      CHECK_OK(px_comm_run(n, rank_fn, &R, &code));
      CHECK(code == 0, "%d ranks: a rank failed", n);
      if (!sync)
        CHECK(R.worst_y > 1e-2,
              "%d ranks without sync: outputs equal the whole batch's (%.3g): the test "
              "data does not tell the two apart",
              n, R.worst_y);
    }
  }
  return px_test_finish("test_sync_batchnorm_equals_one_process_on_the_whole_batch");
}
