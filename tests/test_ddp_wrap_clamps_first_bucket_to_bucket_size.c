/* Claim: px_ddp_wrap clamps the first bucket to the bucket size, so a
 * caller that only shrinks bucket_bytes (keeping PX_DDP_DEFAULTS' 1 MiB
 * first bucket) gets the same buckets as one that sets both to the small
 * size -- the clamp plexus train used to do itself, now in the library for
 * every caller.  If it failed, the small parameters at the end of the model
 * would all fall into one 1 MiB first bucket and communication would start
 * later than asked. */
#include "px_test.h"

static px_module *make_model(void) {
  // 8 small layers: 64 + 8 floats each, far under 1 MiB in all.
  return px_chain_of(8, px_linear(8, 8, true), px_linear(8, 8, true), px_linear(8, 8, true), px_linear(8, 8, true),
                     px_linear(8, 8, true), px_linear(8, 8, true), px_linear(8, 8, true), px_linear(8, 8, true));
}

static int run(px_comm *c, void *arg) {
  (void)arg;
  px_model *md;
  CHECK_OK(px_model_create(&md, make_model(), 3));
  // Only the bucket size: the first keeps its default of 1 MiB.
  px_ddp_opts small = PX_DDP_DEFAULTS;
  small.bucket_bytes = 300;
  CHECK(small.first_bucket_bytes > small.bucket_bytes, "the default first bucket is not larger");
  // Both set to the small size: the buckets the clamp must give.
  px_ddp_opts both = small;
  both.first_bucket_bytes = small.bucket_bytes;
  px_ddp *d;
  CHECK_OK(px_ddp_wrap(&d, md, c, &both));
  const int want = px_ddp_bucket_count(d);
  size_t want_off[64], want_cnt[64];
  if (want > 64) return 1;
  CHECK(want > 2 && want <= 64, "%d buckets with both at 300 bytes", want);
  for (int b = 0; b < want; b++) px_ddp_bucket_range(d, b, &want_off[b], &want_cnt[b]);
  px_ddp_free(d);
  CHECK_OK(px_ddp_wrap(&d, md, c, &small));
  CHECK(px_ddp_bucket_count(d) == want, "%d buckets with only bucket_bytes 300, %d with both", px_ddp_bucket_count(d),
        want);
  for (int b = 0; b < want; b++) {
    size_t off, cnt;
    px_ddp_bucket_range(d, b, &off, &cnt);
    CHECK(off == want_off[b] && cnt == want_cnt[b], "bucket %d: [%zu, +%zu), expected [%zu, +%zu)", b, off, cnt,
          want_off[b], want_cnt[b]);
  }
  // The first bucket (the model's end) holds no more than bucket_bytes
  // (a bucket holds at least one parameter; each here is under 300 bytes).
  size_t off0, cnt0;
  px_ddp_bucket_range(d, 0, &off0, &cnt0);
  CHECK(cnt0 * sizeof(float) <= small.bucket_bytes, "first bucket %zu bytes", cnt0 * sizeof(float));
  px_ddp_free(d);
  px_model_free(md);
  return 0;
}

int main(void) {
  int code = 1;
  CHECK_OK(px_comm_run(1, run, NULL, &code));
  CHECK(code == 0, "exit code %d", code);
  if (px_test_failures) return 1;
  printf("ok: px_ddp_wrap clamps the first bucket (1 MiB default) to a 300-byte bucket size\n");
  return 0;
}
