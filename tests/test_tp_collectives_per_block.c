/* Claim: the tensor-parallel GPT communicates as Megatron's does — per
 * transformer block exactly two all-reduces of (N, T, C) floats forward
 * (the row-parallel attention projection and mlp.c_proj) and two backward
 * (the column-parallel c_attn and c_fc), no all-gather; outside the blocks
 * one forward (the vocabulary-parallel embedding) and one backward (the
 * tied head's input gradient); the vocabulary-parallel cross-entropy three
 * all-reduces of N·T numbers and never the (N, T, V) logits.  With sequence
 * parallelism each of those all-reduces becomes an all-gather / reduce-
 * scatter pair of the same (N, T, C) floats: per block two all-gathers (before
 * c_attn and c_fc) and two reduce-scatters (after the projections) forward,
 * the same backward, one pair more outside the blocks (wte's reduce-scatter,
 * the head's all-gather), no activation all-reduce; backward adds one
 * all-gather per column-parallel layer and for the head (their input is
 * gathered again rather than kept whole, as Megatron-LM does) and one
 * all-reduce of parameter gradients per replicated module on the split
 * sequence (2 layer norms a block, ln_f, wpe).  Counted by the layers' group
 * (px_tp_counts) for 1, 2 and 3 layers at tp = 2 and 4, forward, loss and
 * backward apart.  In eval mode the same forward counts.
 * If this fails, a layer communicates twice where once is enough (a
 * column-parallel layer all-reducing forward, an all-gather of the logits),
 * or a block misses the reduction that makes its output whole. */
#include "px_test.h"

#include <string.h>

enum { N = 2, T = 8, C = 16, V = 29 };

typedef unsigned long long ull;

static void one(px_comm *c, int L, bool sp) {
  px_tp_group g = px_tp_group_of(c);
  px_tp_gpt_config cfg =
    {.vocab_size = V, .context = T, .n_layer = L, .n_head = 4, .n_embd = C, .dropout = 0.1f, .sequence_parallel = sp};
  px_model *md;
  CHECK_OK(px_model_create(&md, px_tp_gpt(&g, &cfg), 3));
  int32_t ids[N * T], tg[N * T];
  for (int i = 0; i < N * T; i++) {
    ids[i] = (i * 7) % V;
    tg[i] = (i * 5 + 1) % V;
  }
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
  const uint64_t act = (uint64_t)N * T * C, pairs = (uint64_t)(2 * L + 1);
  const char *mode = sp ? "sequence parallel" : "";
  CHECK(y.ndim == 3 && y.shape[1] == T, "tp %d %s: logits hold %lld positions, want %d", g.size, mode,
        (long long)y.shape[1], T);
  if (!sp) {
    CHECK(fwd.fwd_allreduce == pairs && fwd.bwd_allreduce == 0 && fwd.fwd_allgather == 0 && fwd.fwd_reduce_scatter == 0,
          "tp %d, %d layers: forward made %llu all-reduces (want 2 per block + 1 = %d), %llu all-gathers, %llu "
          "reduce-scatters",
          g.size, L, (ull)fwd.fwd_allreduce, 2 * L + 1, (ull)fwd.fwd_allgather, (ull)fwd.fwd_reduce_scatter);
    CHECK(fwd.elems == pairs * act, "tp %d, %d layers: forward moved %llu floats, want %llu", g.size, L, (ull)fwd.elems,
          (ull)(pairs * act));
  } else {
    CHECK(fwd.fwd_allreduce == 0 && fwd.fwd_allgather == pairs && fwd.fwd_reduce_scatter == pairs,
          "tp %d, %d layers, SP: forward made %llu all-gathers and %llu reduce-scatters (want 2 per block + 1 = %d "
          "each) and %llu all-reduces (want 0)",
          g.size, L, (ull)fwd.fwd_allgather, (ull)fwd.fwd_reduce_scatter, 2 * L + 1, (ull)fwd.fwd_allreduce);
    CHECK(fwd.elems == 2 * pairs * act, "tp %d, %d layers, SP: forward moved %llu floats, want %llu", g.size, L,
          (ull)fwd.elems, (ull)(2 * pairs * act));
  }
  CHECK(ce.fwd_allreduce - fwd.fwd_allreduce == 3 && ce.elems - fwd.elems == 3 * (uint64_t)(N * T),
        "tp %d %s: the loss made %llu all-reduces of %llu numbers (want 3 of %d)", g.size, mode,
        (ull)(ce.fwd_allreduce - fwd.fwd_allreduce), (ull)(ce.elems - fwd.elems), 3 * N * T);
  if (!sp) {
    CHECK(all.bwd_allreduce == pairs && all.fwd_allreduce == ce.fwd_allreduce && all.bwd_allgather == 0 &&
            all.bwd_reduce_scatter == 0 && all.elems - ce.elems == pairs * act,
          "tp %d, %d layers: backward made %llu all-reduces of %llu floats (want 2 per block + 1 = %d of %llu)", g.size,
          L, (ull)all.bwd_allreduce, (ull)(all.elems - ce.elems), 2 * L + 1, (ull)(pairs * act));
  } else {
    // The replicated modules' gradients: ln_1, ln_2 (2C each) a block, ln_f (2C), wpe (T·C).
    const uint64_t grads = (uint64_t)(2 * L + 1) * 2 * C + (uint64_t)T * C;
    CHECK(all.bwd_allgather == 2 * pairs && all.bwd_reduce_scatter == pairs &&
            all.bwd_allreduce == (uint64_t)(2 * L + 2) && all.fwd_allreduce == ce.fwd_allreduce &&
            all.elems - ce.elems == 3 * pairs * act + grads,
          "tp %d, %d layers, SP: backward made %llu all-gathers (want %d: dy for the row-parallel layers and wte, x "
          "again for the column-parallel ones and the head), %llu reduce-scatters (want %d), %llu all-reduces (want "
          "%d: the layer norms' and wpe's gradients), %llu floats (want %llu)",
          g.size, L, (ull)all.bwd_allgather, 2 * (2 * L + 1), (ull)all.bwd_reduce_scatter, 2 * L + 1,
          (ull)all.bwd_allreduce, 2 * L + 2, (ull)(all.elems - ce.elems), (ull)(3 * pairs * act + grads));
  }
  CHECK(all.seconds > 0, "tp %d: no time counted in the collectives", g.size);
  // Eval: the same forward communication.
  px_model_train(md, false);
  g.counts = (px_tp_counts){0};
  CHECK_OK(px_model_forward(md, &x, &y));
  CHECK(g.counts.fwd_allreduce == (sp ? 0 : pairs) && g.counts.fwd_allgather == (sp ? pairs : 0) &&
          g.counts.fwd_reduce_scatter == (sp ? pairs : 0),
        "tp %d %s eval: %llu all-reduces, %llu all-gathers, %llu reduce-scatters", g.size, mode,
        (ull)g.counts.fwd_allreduce, (ull)g.counts.fwd_allgather, (ull)g.counts.fwd_reduce_scatter);
  if (px_comm_rank(c) == 0) {
    if (sp)
      printf("  tp %d, %d block(s), sequence parallel: forward %llu all-gathers + %llu reduce-scatters, loss %llu "
             "all-reduces, backward %llu all-gathers + %llu reduce-scatters + %llu gradient all-reduces; %llu floats\n",
             g.size, L, (ull)fwd.fwd_allgather, (ull)fwd.fwd_reduce_scatter,
             (ull)(ce.fwd_allreduce - fwd.fwd_allreduce), (ull)all.bwd_allgather, (ull)all.bwd_reduce_scatter,
             (ull)all.bwd_allreduce, (ull)all.elems);
    else
      printf("  tp %d, %d block(s): forward %llu all-reduces, loss %llu, backward %llu; %llu floats in all\n", g.size,
             L, (ull)fwd.fwd_allreduce, (ull)(ce.fwd_allreduce - fwd.fwd_allreduce), (ull)all.bwd_allreduce,
             (ull)all.elems);
  }
  px_model_free(md);
}

static int run(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 60);
  for (int sp = 0; sp <= 1; sp++)
    for (int L = 1; L <= 3; L++) one(c, L, sp);
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
