/* Claim: a staged copy that no longer matches its MANIFEST is found and
 * copied again by the next run of two ranks, rank 0 alone: a copy cut
 * short (truncated) under either check, a copy changed in place with its
 * size and mtime kept under the full check (CRC-32C of every byte: the
 * default) -- the size check passes it, which is that mode's documented
 * limit --, a missing copy, and a MANIFEST that is not one.  The replaced
 * copy equals the source again.  Failures name what failed on every rank:
 * an s3:// pattern with wildcards above its last '/' is refused naming it
 * (before any request), images given to px_stage_source (a listing is
 * staged by px_stage_images) is refused, and a stage directory that cannot be made fails on both
 * ranks (the waiting rank says the copying rank failed).
 *
 * If it failed, a run would train on a truncated or damaged shard left in
 * /dev/shm by an earlier one, or one rank would hang or train while the
 * other failed. */
#include "stage_test_util.h"

static void truncate_half(const char *path) {
  struct stat sb;
  CHECK(stat(path, &sb) == 0, "stat %s", path);
  CHECK(truncate(path, sb.st_size / 2) == 0, "truncate %s", path);
}

// Flip one byte in the middle, keeping the size and the mtime.
static void flip_byte(const char *path) {
  struct stat sb;
  CHECK(stat(path, &sb) == 0, "stat %s", path);
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0, "open %s", path);
  unsigned char c;
  off_t at = sb.st_size / 2;
  CHECK(pread(fd, &c, 1, at) == 1, "pread");
  c ^= 0x5a;
  CHECK(pwrite(fd, &c, 1, at) == 1, "pwrite");
  const struct timespec t[2] = {sb.st_atim, sb.st_mtim};
  CHECK(futimens(fd, t) == 0, "futimens");
  close(fd);
}

int main(void) {
  char src[4096], stage[4096], glob_src[4200], p[8400], q[8400];
  make_dirs("stage_damage", src, sizeof src, stage, sizeof stage);
  for (int k = 0; k < ST_SHARDS; k++) write_shard(src, k, 7);
  snprintf(glob_src, sizeof glob_src, "%s/shard_*.bin", src);
  stage_job j = {.stage = stage, .kind = "tokens", .source = glob_src, .verify = PX_STAGE_VERIFY_FULL};
  stage2(&j);
  CHECK(j.st[0] == PX_OK && j.st[1] == PX_OK && copies(&j) == ST_SHARDS, "first run: %s, copied %zu", j.err[0],
        copies(&j));
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", j.res[0].dir);
  snprintf(p, sizeof p, "%s/shard_%06d.bin", src, 1);
  snprintf(q, sizeof q, "%s/shard_%06d.bin", dir, 1);

  // 1. Truncated: found by the size check and by the full one.
  for (int mode = 0; mode < 2; mode++) {
    j.verify = mode ? PX_STAGE_VERIFY_SIZE : PX_STAGE_VERIFY_FULL;
    truncate_half(q);
    stage2(&j);
    CHECK(j.st[0] == PX_OK && copies(&j) == 1 && j.res[1].copied == 0 && j.res[0].damaged == 1,
          "%s check, truncated copy: %s, copied %zu (rank 1: %zu), damaged %zu; expected 1 copy by rank 0",
          mode ? "size" : "full", j.err[0], copies(&j), j.res[1].copied, j.res[0].damaged);
    CHECK(same_bytes(p, q), "the truncated copy was not restored");
  }

  // 2. Changed in place, size and mtime kept: the size check keeps it (its
  //    limit), the full check finds and replaces it.
  flip_byte(q);
  j.verify = PX_STAGE_VERIFY_SIZE;
  stage2(&j);
  CHECK(copies(&j) == 0, "size check: copied %zu; it reads sizes only and should not have noticed", copies(&j));
  CHECK(!same_bytes(p, q), "the flipped byte is gone without a copy");
  j.verify = PX_STAGE_VERIFY_FULL;
  stage2(&j);
  CHECK(j.st[0] == PX_OK && copies(&j) == 1 && j.res[0].damaged == 1,
        "full check, a byte changed in place: copied %zu, damaged %zu; expected 1 and 1", copies(&j), j.res[0].damaged);
  CHECK(same_bytes(p, q), "the damaged copy was not restored");

  // 3. A copy deleted: copied again.
  CHECK(unlink(q) == 0, "unlink %s", q);
  stage2(&j);
  CHECK(copies(&j) == 1 && same_bytes(p, q), "deleted copy: copied %zu", copies(&j));

  // 4. A MANIFEST that is not one: everything copied again.
  snprintf(q, sizeof q, "%s/MANIFEST", dir);
  CHECK_OK(px_write_file_atomic(q, "garbage\n", 8));
  stage2(&j);
  CHECK(copies(&j) == ST_SHARDS, "a garbled manifest: copied %zu, expected %d", copies(&j), ST_SHARDS);
  stage2(&j);
  CHECK(copies(&j) == 0, "after re-staging, a run copied %zu", copies(&j));

  // 5. Errors reach every rank with their reason.
  stage_job s3 = {.stage = stage, .kind = "tokens", .source = "s3://bucket/sh*/shard_*.bin"};
  stage2(&s3);
  CHECK(s3.st[0] == PX_ERR_INVALID && s3.st[1] != PX_OK, "an s3:// glob over several prefixes was accepted");
  CHECK(strstr(s3.err[0], "s3://bucket/sh*/shard_*.bin") && strstr(s3.err[0], "one \"directory\""), "s3 message: %s",
        s3.err[0]);
  stage_job img = {.stage = stage, .kind = "images", .source = src};
  stage2(&img);
  CHECK(img.st[0] == PX_ERR_UNSUPPORTED && strstr(img.err[0], "--data images is staged by px_stage_images"),
        "images: %s", img.err[0]);
  snprintf(p, sizeof p, "%.4000s_a_file", src);
  CHECK_OK(px_write_file_atomic(p, "x", 1));
  snprintf(q, sizeof q, "%.4100s/sub", p);  // below a regular file: cannot be made
  stage_job bad = {.stage = q, .kind = "tokens", .source = glob_src};
  stage2(&bad);
  CHECK(bad.st[0] != PX_OK && strstr(bad.err[0], p), "unmakeable stage dir: rank 0 says %s", bad.err[0]);
  CHECK(bad.st[1] != PX_OK && strstr(bad.err[1], "failed on another rank"), "the waiting rank says %s", bad.err[1]);
  unlink(p);

  remove_dir(stage);
  remove_dir(src);
  return px_test_finish("test_stage_detects_a_damaged_copy");
}
