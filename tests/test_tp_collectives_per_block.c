/* Claim: the tensor-parallel GPT communicates as Megatron's does — per
 * transformer block exactly two all-reduces of (N, T, C) floats forward
 * (the row-parallel attention projection and mlp.c_proj) and two backward
 * (the column-parallel c_attn and c_fc), no all-gather; outside the blocks
 * one forward (the vocabulary-parallel embedding) and one backward (the
 * tied head's input gradient); the vocabulary-parallel cross-entropy three
 * all-reduces of N·T numbers and never the (N, T, V) logits.  Counted by
 * the layers' group (px_tp_counts) for 1, 2 and 3 layers at tp = 2 and 4,
 * forward, loss and backward apart.  In eval mode the same forward counts.
 * If this fails, a layer communicates twice where once is enough (a
 * column-parallel layer all-reducing forward, an all-gather of the logits),
 * or a block misses the reduction that makes its output whole. */
#include "px_test.h"

#include <string.h>

enum { N = 2, T = 6, C = 16, V = 29 };

static int run(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 60);
  for (int L = 1; L <= 3; L++) {
    px_tp_group g = px_tp_group_of(c);
    px_tp_gpt_config cfg = {.vocab_size = V, .context = T, .n_layer = L, .n_head = 4, .n_embd = C, .dropout = 0.1f};
    px_model *md;
    CHECK_OK(px_model_create(&md, px_tp_gpt(&g, &cfg), 3));
    int32_t ids[N * T], tg[N * T];
    for (int i = 0; i < N * T; i++) { ids[i] = (i * 7) % V; tg[i] = (i * 5 + 1) % V; }
    px_tensor x = px_tensor_view(ids, PX_I32, 2, (int64_t[]){N, T}), y;
    CHECK_OK(px_model_forward(md, &x, &y));
    const px_tp_counts fwd = g.counts;
    px_tensor dy = y;
    dy.data = px_model_scratch(md, (size_t)px_tensor_numel(&y));
    float loss;
    CHECK_OK(px_tp_cross_entropy(&g, &y, V, tg, -100, &loss, px_f32(&dy)));
    const px_tp_counts ce = g.counts;
    CHECK_OK(px_model_backward(md, &dy, NULL));
    const px_tp_counts all = g.counts;
    const uint64_t act = (uint64_t)N * T * C;
    CHECK(fwd.fwd_allreduce == (uint64_t)(2 * L + 1) && fwd.bwd_allreduce == 0 && fwd.fwd_allgather == 0,
          "tp %d, %d layers: forward made %llu all-reduces (want 2 per block + 1 = %d) and %llu all-gathers", g.size,
          L, (unsigned long long)fwd.fwd_allreduce, 2 * L + 1, (unsigned long long)fwd.fwd_allgather);
    CHECK(fwd.elems == (uint64_t)(2 * L + 1) * act, "tp %d, %d layers: forward moved %llu floats, want %llu", g.size,
          L, (unsigned long long)fwd.elems, (unsigned long long)((2 * L + 1) * act));
    CHECK(ce.fwd_allreduce - fwd.fwd_allreduce == 3 && ce.elems - fwd.elems == 3 * (uint64_t)(N * T),
          "tp %d: the loss made %llu all-reduces of %llu numbers (want 3 of %d)", g.size,
          (unsigned long long)(ce.fwd_allreduce - fwd.fwd_allreduce), (unsigned long long)(ce.elems - fwd.elems),
          3 * N * T);
    CHECK(all.bwd_allreduce == (uint64_t)(2 * L + 1) && all.fwd_allreduce == ce.fwd_allreduce &&
          all.bwd_allgather == 0 && all.elems - ce.elems == (uint64_t)(2 * L + 1) * act,
          "tp %d, %d layers: backward made %llu all-reduces of %llu floats (want 2 per block + 1 = %d of %llu)",
          g.size, L, (unsigned long long)all.bwd_allreduce, (unsigned long long)(all.elems - ce.elems), 2 * L + 1,
          (unsigned long long)((2 * L + 1) * act));
    // Eval: the same forward communication.
    px_model_train(md, false);
    g.counts = (px_tp_counts){0};
    CHECK_OK(px_model_forward(md, &x, &y));
    CHECK(g.counts.fwd_allreduce == (uint64_t)(2 * L + 1), "tp %d eval: %llu all-reduces", g.size,
          (unsigned long long)g.counts.fwd_allreduce);
    if (px_comm_rank(c) == 0)
      printf("  tp %d, %d block(s): forward %llu all-reduces, loss %llu, backward %llu; %llu floats in all\n", g.size,
             L, (unsigned long long)fwd.fwd_allreduce, (unsigned long long)(ce.fwd_allreduce - fwd.fwd_allreduce),
             (unsigned long long)all.bwd_allreduce, (unsigned long long)all.elems);
    px_model_free(md);
  }
  return px_test_failures ? 1 : 0;
}

int main(void) {
  for (int n = 2; n <= 4; n *= 2) {
    int code = 0;
    CHECK_OK(px_comm_run(n, run, NULL, &code));
    CHECK(code == 0, "tp %d: a rank failed (%d)", n, code);
  }
  return px_test_finish("test_tp_collectives_per_block");
}
