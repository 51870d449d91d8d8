/* Claim: ZeRO refuses what it cannot do, on every rank, with a message that
 * says what was expected and where: a stage outside 1..3; a unit name that
 * names no module (the message lists the model's top-level modules); units
 * that nest, repeat, hold no parameters or name the root; a model that
 * differs between ranks (the first differing parameter named, as DDP does);
 * options that differ between ranks.  A failed wrap leaves the model as it
 * was (flat buffers and listeners).  A collective that fails inside a hook
 * (a peer gave up mid-step) is reported by px_zero_sync, which ends the job
 * so no peer hangs.  If it fails, a user's mistake hangs or crashes a job,
 * or is reported without saying what to fix. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

static px_module *small_gpt(void) {
  const px_gpt_config cfg = {.vocab_size = 11, .context = 4, .n_layer = 2, .n_head = 1, .n_embd = 4, .dropout = 0};
  return px_zoo_gpt(&cfg);
}

/* wrap must fail with PX_ERR_INVALID and a message containing every needle. */
static void refused(px_comm *c, px_model *md, const px_zero_opts *o, const char *what, const char *n1, const char *n2) {
  float *before = md->param_data, *gbefore = md->grad_data;
  px_zero *z = (px_zero *)1;
  px_status st = px_zero_wrap(&z, md, c, o);
  const char *msg = px_last_error();
  CHECK(st == PX_ERR_INVALID && z == NULL && strstr(msg, n1) && (!n2 || strstr(msg, n2)),
        "%s: got %s \"%s\", expected PX_ERR_INVALID naming \"%s\"%s%s", what, px_status_name(st), msg, n1,
        n2 ? " and " : "", n2 ? n2 : "");
  CHECK(md->param_data == before && md->grad_data == gbefore && md->ctx.n_hooks == 0,
        "%s: a refused wrap changed the model", what);
  if (px_comm_rank(c) == 0) printf("  %-28s %s\n", what, msg);
}

static int option_errors(px_comm *c, void *arg) {
  (void)arg;
  px_model *md;
  CHECK_OK(px_model_create(&md, small_gpt(), 1));
  px_zero_opts o = PX_ZERO_DEFAULTS;
  o.stage = 0;
  refused(c, md, &o, "stage 0", "stage 0", "expected 1");
  o.stage = 4;
  refused(c, md, &o, "stage 4", "stage 4", "expected 1");
  o.stage = 3;
  const char *unknown[] = {"h.0", "blocks.7"};
  o.units = unknown;
  o.n_units = 2;
  refused(c, md, &o, "unknown unit", "\"blocks.7\"", "\"wte\" (Embedding)");
  const char *nested[] = {"h.1.attn", "h"};
  o.units = nested;
  refused(c, md, &o, "nested units", "unit \"h\" contains unit \"h.1.attn\"", NULL);
  const char *twice[] = {"h.0", "h.0"};
  o.units = twice;
  refused(c, md, &o, "unit named twice", "\"h.0\" is named twice", NULL);
  const char *empty[] = {"drop"};
  o.units = empty;
  o.n_units = 1;
  refused(c, md, &o, "unit without parameters", "\"drop\" (Dropout) holds no parameters", NULL);
  const char *root[] = {""};
  o.units = root;
  refused(c, md, &o, "the root as a unit", "empty name", NULL);
  o.units = NULL;
  o.n_units = 2;
  refused(c, md, &o, "unit count without names", "no array of names", NULL);
  px_model_free(md);
  return px_test_failures ? 1 : 0;
}

static int mismatches(px_comm *c, void *arg) {
  (void)arg;
  const int rank = px_comm_rank(c), world = px_comm_size(c);
  // The last rank's model is wider: refused everywhere, naming 2.weight.
  px_model *md;
  int width = rank == world - 1 ? 17 : 16;
  CHECK_OK(px_model_create(&md, px_chain_of(3, px_linear(4, 8, true), px_relu(), px_linear(8, width, true)), 1));
  for (int stage = 1; stage <= 3; stage++) {
    px_zero_opts o = PX_ZERO_DEFAULTS;
    o.stage = stage;
    refused(c, md, &o, "models differ", "ZeRO: parameter", "\"2.weight\"");
  }
  px_model_free(md);
  // Same model, different options: rank 0 asks for stage 2, the others 3.
  CHECK_OK(px_model_create(&md, px_chain_of(3, px_linear(4, 8, true), px_relu(), px_linear(8, 16, true)), 1));
  px_zero_opts o = PX_ZERO_DEFAULTS;
  o.stage = rank == 0 ? 2 : 3;
  refused(c, md, &o, "options differ", "different options", NULL);
  px_model_free(md);
  return px_test_failures ? 1 : 0;
}

/* Rank 1 gives up after rank 0's forward; rank 0's collectives in backward
 * fail inside the hooks, and px_zero_sync reports it. */
static int peer_fails(px_comm *c, void *arg) {
  const int stage = *(const int *)arg, rank = px_comm_rank(c);
  px_model *md;
  CHECK_OK(px_model_create(&md, px_chain_of(3, px_linear(4, 8, true), px_tanh(), px_linear(8, 2, true)), 1));
  px_zero_opts o = PX_ZERO_DEFAULTS;
  o.stage = stage;
  o.bucket_bytes = o.first_bucket_bytes = 16;
  px_zero *z;
  CHECK_OK(px_zero_wrap(&z, md, c, &o));
  float x[2 * 4] = {0.1f, 0.2f, 0.3f, 0.4f, -0.1f, -0.2f, 0.5f, 0.6f};
  px_tensor X = px_tensor_f32(x, 2, 2, 4, 0, 0), Y;
  CHECK_OK(px_model_forward(md, &X, &Y));
  // Rank 1 gives up only once rank 0 is past its forward (a message says
  // so), so what fails is rank 0's backward, inside the hooks.
  int32_t token = 1;
  if (rank == 1) {
    CHECK_OK(px_comm_recv(c, &token, 1, PX_I32, 0, 7));
    px_comm_abort(c, "rank 1 gives up (planted by the test)");
  } else {
    CHECK_OK(px_comm_send(c, &token, 1, PX_I32, 1, 7));
    px_tensor dY = Y;
    dY.data = px_model_scratch(md, 4);
    px_fill(px_f32(&dY), 4, 1.0f);
    px_status bst = px_model_backward(md, &dY, NULL);
    px_status st = bst == PX_OK ? px_zero_sync(z) : bst;
    CHECK(st == PX_ERR_COMM && strstr(px_last_error(), "rank 1 gives up"),
          "stage %d: a peer's failure inside backward gives %s \"%s\", expected PX_ERR_COMM with its reason", stage,
          px_status_name(st), px_last_error());
    if (stage == 3) printf("  peer failed: %s\n", px_last_error());
  }
  px_zero_free(z);  // fails too (the job is over), but frees
  px_model_free(md);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, option_errors, NULL, &code));
  CHECK(code == 0, "option errors: rank failed");
  CHECK_OK(px_comm_run(2, option_errors, NULL, &code));
  CHECK(code == 0, "option errors with 2 ranks: a rank failed");
  CHECK_OK(px_comm_run(3, mismatches, NULL, &code));
  CHECK(code == 0, "mismatches: a rank failed");
  for (int stage = 1; stage <= 3; stage++) {
    CHECK_OK(px_comm_run(2, peer_fails, &stage, &code));
    CHECK(code == 0, "stage %d peer failure: a rank failed its checks", stage);
  }
  return px_test_finish("test_zero_refuses_bad_options_and_reports_failures");
}
