/* Claim: the step arena's marks release memory for reuse and keep what is
 * asked: after px_arena_rewind the next allocation gets the same bytes;
 * px_arena_rewind_keep moves the kept block down to the mark with its
 * contents (overlapping or not, within one chunk or from a chunk grown
 * since), leaves a block allocated before the mark where it is, and the
 * high-water mark keeps the peak.  A model with checkpointed units, once
 * warm, trains with no allocation from the system (DESIGN decision 4) and
 * a peak below the same model's without them.
 * If this fails, a checkpointed unit's output or input gradient is
 * corrupted by the rewind, or recomputation allocates every step. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

static void check_marks(void) {
  px_arena *a = px_arena_create(1u << 20);
  float *before = px_arena_alloc(a, 1000 * sizeof(float));
  for (int i = 0; i < 1000; i++) before[i] = (float)i;
  px_arena_mark m = px_arena_get_mark(a);
  const size_t used = px_arena_used(a);
  float *tmp = px_arena_alloc(a, 4096);
  px_arena_rewind(a, m);
  CHECK(px_arena_used(a) == used, "rewind left %zu bytes used, expected %zu", px_arena_used(a), used);
  CHECK(px_arena_alloc(a, 4096) == tmp, "the bytes released by a rewind were not reused");
  px_arena_rewind(a, m);
  // Keep a block that lies past a released one: it moves down to the mark.
  px_arena_alloc(a, 300000);
  float *out = px_arena_alloc(a, 50000 * sizeof(float));
  for (int i = 0; i < 50000; i++) out[i] = 0.5f * (float)i;
  const size_t peak = px_arena_high_water(a);
  float *kept = px_arena_rewind_keep(a, m, out, 50000 * sizeof(float));
  CHECK(kept == tmp, "kept block at %p, expected the mark's first allocation %p", (void *)kept, (void *)tmp);
  int bad = 0;
  for (int i = 0; i < 50000; i++) bad += kept[i] != 0.5f * (float)i;
  CHECK(bad == 0, "%d kept values changed by the move", bad);
  CHECK(px_arena_high_water(a) == peak, "high-water %zu after the rewind, peak was %zu", px_arena_high_water(a), peak);
  // A block from before the mark is not moved.
  CHECK(px_arena_rewind_keep(a, m, before, 1000 * sizeof(float)) == before, "a block older than the mark moved");
  // Across chunks: 3 MiB does not fit the 1 MiB chunk, so the arena grows;
  // the kept block comes back from the new chunk with its contents.
  px_arena_rewind(a, m);
  float *big = px_arena_alloc(a, 3u << 20);
  for (size_t i = 0; i < (3u << 20) / sizeof(float); i += 1024) big[i] = (float)i;
  float *back = px_arena_rewind_keep(a, m, big, 3u << 20);
  bad = 0;
  for (size_t i = 0; back && i < (3u << 20) / sizeof(float); i += 1024) bad += back[i] != (float)i;
  CHECK(back && bad == 0, "block kept across chunks: %p, %d values changed", (void *)back, bad);
  for (int i = 0; i < 1000; i++) bad += before[i] != (float)i;
  CHECK(bad == 0, "a block allocated before the mark changed");
  px_arena_free(a);
}

static size_t train_steps(const char *policy, uint64_t *allocs_warm, uint64_t *allocs_end) {
  const px_gpt_config cfg = {.vocab_size = 17, .context = 16, .n_layer = 3, .n_head = 2, .n_embd = 32, .dropout = 0.1f};
  px_module *m = px_zoo_gpt(&cfg);
  px_recompute r;
  CHECK_OK(px_recompute_parse(policy, &r));
  CHECK_OK(px_zoo_gpt_recompute(m, r));
  px_model *md;
  CHECK_OK(px_model_create(&md, m, 3));
  int32_t x[4 * 16], y[4 * 16];
  for (int i = 0; i < 64; i++) {
    x[i] = (i * 7) % 17;
    y[i] = (i * 7 + 1) % 17;
  }
  px_tensor X = px_tensor_view(x, PX_I32, 2, (int64_t[]){4, 16});
  for (int s = 0; s < 5; s++) {
    if (s == 2) *allocs_warm = px_arena_system_allocs(md->arena);
    px_tensor logits;
    CHECK_OK(px_model_forward(md, &X, &logits));
    px_tensor dl = logits;
    dl.data = px_model_scratch(md, (size_t)px_tensor_numel(&logits));
    float loss;
    CHECK_OK(px_cross_entropy_loss(&logits, y, NULL, &loss, px_f32(&dl)));
    CHECK_OK(px_model_backward(md, &dl, NULL));
  }
  *allocs_end = px_arena_system_allocs(md->arena);
  size_t hw = px_arena_high_water(md->arena);
  px_model_free(md);
  return hw;
}

int main(void) {
  check_marks();
  uint64_t w0, e0, w1, e1;
  size_t none = train_steps("none", &w0, &e0), full = train_steps("full", &w1, &e1);
  CHECK(e1 == w1, "--recompute full: the arena asked the system for memory %llu times after warm-up",
        (unsigned long long)(e1 - w1));
  CHECK(full < none, "high-water with full recomputation %zu, without %zu", full, none);
  return px_test_finish("test_arena_rewind_releases_and_keeps");
}
