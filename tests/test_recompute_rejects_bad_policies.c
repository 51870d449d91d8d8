/* Claim: a recompute policy that does not exist, and every:K with K < 1 or
 * not a number, are refused by the library with PX_ERR_INVALID and one
 * message that quotes the text and lists what is accepted; the accepted
 * forms parse and print back as given.  A pair whose consumer cannot take
 * a recomputed input (no rebind) and selective passed to the per-block
 * wrapper are refused too, with nothing leaked (ASan).
 * If this fails, a typo silently trains without (or with) recomputation. */
#include "px_test.h"

#include <string.h>

static void refused(const char *text, const char *needle) {
  px_recompute r = {.kind = PX_RECOMPUTE_FULL, .every = 5};
  px_status st = px_recompute_parse(text, &r);
  CHECK(st == PX_ERR_INVALID, "\"%s\": %s, expected PX_ERR_INVALID", text, px_status_name(st));
  CHECK(strstr(px_last_error(), text) && strstr(px_last_error(), needle),
        "\"%s\": message \"%s\" lacks the text "
        "or \"%s\"",
        text, px_last_error(), needle);
  CHECK(r.kind == PX_RECOMPUTE_NONE, "\"%s\": a refused policy left kind %d", text, (int)r.kind);
}

int main(void) {
  refused("fulll", "expected none, full, selective or every:K");
  refused("sometimes", "expected none, full, selective or every:K");
  refused("every:0", "K in every:K must be a whole number >= 1");
  refused("every:", ">= 1");
  refused("every:two", ">= 1");
  refused("every:-3", ">= 1");
  const char *good[5] = {"none", "full", "selective", "every:1", "every:12"};
  for (int i = 0; i < 5; i++) {
    px_recompute r;
    char buf[32];
    CHECK(px_recompute_parse(good[i], &r) == PX_OK, "\"%s\" refused: %s", good[i], px_last_error());
    CHECK(strcmp(px_recompute_name(r, buf, sizeof buf), good[i]) == 0 || (i == 3 && r.kind == PX_RECOMPUTE_EVERY),
          "\"%s\" prints back as \"%s\"", good[i], buf);
  }
  px_recompute r;
  CHECK_OK(px_recompute_parse("every:12", &r));
  CHECK(r.kind == PX_RECOMPUTE_EVERY && r.every == 12, "every:12 parsed as kind %d every %d", (int)r.kind, r.every);

  // Tanh keeps nothing a recomputed input could replace: no rebind.
  px_module *bad = px_checkpoint_pair("a", px_relu(), "b", px_tanh());
  CHECK(bad == NULL && strstr(px_last_error(), "Tanh") && strstr(px_last_error(), "rebind"),
        "pair with a Tanh consumer: %p, \"%s\"", (void *)bad, px_last_error());
  px_module *chain = px_chain_of(2, px_linear(2, 2, true), px_linear(2, 2, true));
  CHECK_OK(px_recompute_parse("selective", &r));
  CHECK(px_checkpoint_blocks(chain, r, 0) == PX_ERR_INVALID && strstr(px_last_error(), "selective"),
        "selective per block: \"%s\"", px_last_error());
  r = (px_recompute){.kind = PX_RECOMPUTE_EVERY, .every = 0};
  CHECK(px_checkpoint_blocks(chain, r, 0) == PX_ERR_INVALID && strstr(px_last_error(), "every:0"),
        "every:0 per block: \"%s\"", px_last_error());
  px_module_free(chain);
  return px_test_finish("test_recompute_rejects_bad_policies");
}
