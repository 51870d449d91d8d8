/* Claim: px_zero_segments describes the shards exactly (and
 * px_zero_set_params writes where it says), as a checkpoint
 * will record them (boxes of the flat layout): over all ranks the segments
 * cover every parameter element exactly once and no padding, each segment
 * lies inside the shard, and the shard holds the model's values there —
 * for stages 1-2 (buckets) and 3 (default units, and named units whose root
 * unit is three separate flat ranges), N = 3 ranks.  If it fails, a sharded
 * checkpoint would lose, duplicate or misplace parameters. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

static px_module *gpt(void) {
  const px_gpt_config cfg = {.vocab_size = 13, .context = 4, .n_layer = 2, .n_head = 1, .n_embd = 4, .dropout = 0};
  return px_zoo_gpt(&cfg);
}

static int run_all(px_comm *c, void *arg) {
  (void)arg;
  const int N = px_comm_size(c);
  static const char *blocks[] = {"h.0", "h.1"};
  for (int variant = 0; variant < 4; variant++) {
    const int stage = variant < 2 ? variant + 1 : 3;
    px_model *md;
    CHECK_OK(px_model_create(&md, gpt(), 4));
    const size_t n = md->n_param_elems;
    float *want = malloc(n * sizeof *want);
    memcpy(want, md->param_data, n * sizeof *want);  // seed 4 on every rank: the broadcast changes nothing
    px_zero_opts o = PX_ZERO_DEFAULTS;
    o.stage = stage;
    o.bucket_bytes = o.first_bucket_bytes = 200;
    if (variant == 3) {
      o.units = blocks;
      o.n_units = 2;
    }
    px_zero *z;
    CHECK_OK(px_zero_wrap(&z, md, c, &o));
    float *shard;
    size_t sn;
    px_zero_shard(z, &shard, NULL, &sn);
    // Stages 1-2 keep their pieces in place in param_data: no shard copy.
    CHECK((shard == NULL) == (stage < 3), "stage %d: shard params %p", stage, (void *)shard);
#define SHARD_AT(s, i) (shard ? shard[so[s] + (i)] : md->param_data[fo[s] + (i)])
    int k = px_zero_segments(z, NULL, NULL, NULL, 0);
    size_t *fo = calloc((size_t)k + 1, sizeof *fo), *so = calloc((size_t)k + 1, sizeof *so),
           *cnt = calloc((size_t)k + 1, sizeof *cnt);
    CHECK(px_zero_segments(z, fo, so, cnt, k) == k, "the count changed between calls");
    // Each rank marks its elements; the sum over ranks must be 1 everywhere.
    int32_t *cover = calloc(n, sizeof *cover);
    for (int s = 0; s < k; s++) {
      CHECK(so[s] + cnt[s] <= sn && fo[s] + cnt[s] <= n && cnt[s] > 0, "segment %d out of bounds", s);
      for (size_t i = 0; i < cnt[s] && fo[s] + i < n && so[s] + i < sn; i++) {
        cover[fo[s] + i]++;
        CHECK(SHARD_AT(s, i) == want[fo[s] + i], "stage %d: shard[%zu] is not flat[%zu]", stage, so[s] + i, fo[s] + i);
      }
    }
    CHECK_OK(px_comm_allreduce(c, cover, n, PX_I32, PX_SUM));
    // px_zero_set_params: new values land where the segments say, and
    // gathering gives them back whole.
    float *fresh = malloc(n * sizeof *fresh), *back = malloc(n * sizeof *back);
    for (size_t i = 0; i < n; i++) fresh[i] = (float)i * 0.25f - 3.0f;
    CHECK_OK(px_zero_set_params(z, fresh));
    for (int s = 0; s < k; s++)
      for (size_t i = 0; i < cnt[s] && fo[s] + i < n && so[s] + i < sn; i++)
        CHECK(SHARD_AT(s, i) == fresh[fo[s] + i], "set_params: shard[%zu] is not the new flat[%zu]", so[s] + i,
              fo[s] + i);
    CHECK_OK(px_zero_gather_params(z, back));
    CHECK(memcmp(back, fresh, n * sizeof *back) == 0, "stage %d: set_params then gather_params differ", stage);
    CHECK_OK(px_zero_set_params(z, want));  // back to the model's values for the checks below
    free(fresh);
    free(back);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) wrong += cover[i] != 1;
    CHECK(wrong == 0, "variant %d (stage %d): %zu of %zu elements are not covered exactly once", variant, stage, wrong,
          n);
    if (px_comm_rank(c) == 0)
      printf("  N %d stage %d%s: %d segments on rank 0, shard %zu of %zu floats\n", N, stage,
             variant == 3 ? " (units h.0, h.1)" : "", k, sn, n);
    CHECK_OK(px_zero_free(z));
    CHECK(memcmp(md->param_data, want, n * sizeof *want) == 0, "stage %d: free changed the parameters", stage);
    free(fo);
    free(so);
    free(cnt);
    free(cover);
    free(want);
    px_model_free(md);
  }
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(3, run_all, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_zero_segments_cover_the_model_once");
}
