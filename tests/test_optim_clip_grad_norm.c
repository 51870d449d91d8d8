/* Claim: px_clip_grad_norm returns the global L2 norm before clipping and,
 * as torch.nn.utils.clip_grad_norm_ (1.13), scales the gradients by
 * max_norm/(norm + 1e-6) when that is below 1, so the clipped norm is
 * max_norm (to 1e-6 relative), and leaves them bit-for-bit alone otherwise.
 * px_clip_grad_scale applied per shard with the global norm gives the same
 * gradients as clipping the whole buffer (what ZeRO relies on).  If this
 * fails, clipping returns the clipped norm (logs lie), clips gradients that
 * are within bounds, misses the OpenMP path, or shards disagree. */
#include "px_test.h"

#include <string.h>

static double norm_of(const float *x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
  return sqrt(s);
}

int main(void) {
  // Hand example: (3, 4) has norm 5.
  {
    float g[2] = {3.0f, 4.0f};
    float norm = px_clip_grad_norm(g, 2, 1.0f);
    CHECK_CLOSE(norm, 5.0, 1e-7);
    CHECK_CLOSE(g[0], 3.0 / (5.0 + 1e-6), 1e-6);
    CHECK_CLOSE(g[1], 4.0 / (5.0 + 1e-6), 1e-6);
    CHECK_CLOSE(norm_of(g, 2), 1.0, 1e-5);
  }
  // The 1e-6 in torch's coefficient shows on tiny gradients: norm 5e-6 and
  // max_norm 1e-6 give coef = 1e-6 / 6e-6 = 1/6, not 1/5.
  {
    float g[2] = {3e-6f, 4e-6f};
    float norm = px_clip_grad_norm(g, 2, 1e-6f);
    CHECK_CLOSE(norm * 1e6, 5.0, 1e-6);
    CHECK_CLOSE(g[0] * 1e6, 3.0 / 6.0, 1e-5);
    CHECK_CLOSE(g[1] * 1e6, 4.0 / 6.0, 1e-5);
  }

  // Random buffers, short and long (OpenMP path), above and below max_norm.
  const size_t sizes[2] = {101, 200003};
  for (int k = 0; k < 2; k++) {
    size_t n = sizes[k];
    float *g = malloc(n * sizeof *g), *g0 = malloc(n * sizeof *g);
    px_rng rng = px_rng_make(7, (uint64_t)n);
    for (size_t i = 0; i < n; i++) g0[i] = px_rng_normal(&rng);
    const double norm0 = norm_of(g0, n);

    memcpy(g, g0, n * sizeof *g);
    const float max_norm = (float)(norm0 / 4);
    float norm = px_clip_grad_norm(g, n, max_norm);
    CHECK_CLOSE(norm, norm0, 1e-6);
    CHECK_CLOSE(norm_of(g, n), max_norm, 1e-5);
    // Direction kept: every element scaled by the same factor.
    const double coef = (double)max_norm / ((double)norm + 1e-6);
    double worst = 0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs(g[i] - g0[i] * coef));
    CHECK(worst < 1e-6, "n=%zu: clipped gradient is not g·coef (worst %.3g)", n, worst);

    // Under the bound (and at it, within float): untouched.
    memcpy(g, g0, n * sizeof *g);
    norm = px_clip_grad_norm(g, n, (float)(norm0 * 1.5));
    CHECK_CLOSE(norm, norm0, 1e-6);
    CHECK(memcmp(g, g0, n * sizeof *g) == 0, "n=%zu: gradients under max_norm were changed", n);
    norm = px_clip_grad_norm(g, n, (float)norm0 + 1e-3f);
    CHECK(memcmp(g, g0, n * sizeof *g) == 0, "n=%zu: gradients just under max_norm were changed", n);

    // Sharded: norm from per-shard sums of squares, then scale each shard.
    float *whole = malloc(n * sizeof *g);
    memcpy(whole, g0, n * sizeof *g);
    memcpy(g, g0, n * sizeof *g);
    float whole_norm = px_clip_grad_norm(whole, n, max_norm);
    size_t cut = n / 3;
    float global = (float)sqrt(px_sumsq(g, cut) + px_sumsq(g + cut, n - cut));
    CHECK_CLOSE(global, whole_norm, 1e-6);
    px_clip_grad_scale(g, cut, whole_norm, max_norm);
    px_clip_grad_scale(g + cut, n - cut, whole_norm, max_norm);
    CHECK(memcmp(g, whole, n * sizeof *g) == 0, "n=%zu: shard-wise clipping differs from whole-buffer clipping", n);
    free(whole);
    free(g);
    free(g0);
  }

  // Zero gradients and an empty buffer: norm 0, nothing to do.
  {
    float z[4] = {0};
    CHECK(px_clip_grad_norm(z, 4, 1.0f) == 0.0f, "zero gradient norm");
    CHECK(z[0] == 0 && z[3] == 0, "zero gradient changed");
    CHECK(px_clip_grad_norm(NULL, 0, 1.0f) == 0.0f, "empty buffer norm");
  }
  return px_test_finish("test_optim_clip_grad_norm");
}
