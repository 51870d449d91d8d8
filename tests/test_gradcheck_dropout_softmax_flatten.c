/* Claim: Dropout (training with p = 0.3, and eval), Softmax and Flatten
 * compute input gradients that agree with central finite differences.
 * For dropout this also proves backward regenerates exactly the mask that
 * forward drew (a different mask would give order-one mismatches on the
 * dropped elements).  If this fails, gradients through these layers are
 * wrong: a stale or shifted dropout mask, a missing -Σ dy·y term in
 * softmax, or flatten handing back a gradient of the wrong shape. */
#include "gradcheck.h"

int main(void) {
  float x[4 * 3 * 5];
  gc_fill_uniform(x, 60, 71, -2, 2);
  px_tensor t = px_tensor_f32(x, 3, 4, 3, 5, 0);
  gradcheck("dropout p=0.3 train", px_dropout(0.3f), &t, (gc_opts){.train = true});
  gradcheck("dropout p=0.3 eval", px_dropout(0.3f), &t, (gc_opts){.train = false});
  gradcheck("dropout p=0 train", px_dropout(0.0f), &t, (gc_opts){.train = true});
  gradcheck("softmax", px_softmax(), &t, (gc_opts){0});
  // Large logits: the max-subtraction keeps exp finite.
  float big[2 * 6];
  gc_fill_uniform(big, 12, 72, 80, 90);
  px_tensor tb = px_tensor_f32(big, 2, 2, 6, 0, 0);
  gradcheck("softmax large logits", px_softmax(), &tb, (gc_opts){0});
  float x4[2 * 3 * 2 * 2];
  gc_fill_uniform(x4, 24, 73, -1, 1);
  px_tensor t4 = px_tensor_f32(x4, 4, 2, 3, 2, 2);
  // Flatten is a view: check it between two layers that own memory.
  gradcheck("flatten between linears",
            px_chain_of(3, px_linear(2, 3, true), px_flatten(), px_linear(3 * 2 * 3, 2, true)), &t4, (gc_opts){0});
  // Dropout inside a chain: its mask is keyed by its own uid.
  gradcheck("linear-dropout-softmax", px_chain_of(3, px_linear(5, 6, true), px_dropout(0.5f), px_softmax()), &t,
            (gc_opts){0});
  return px_test_finish("test_gradcheck_dropout_softmax_flatten");
}
