/* Claim: px_stage_source with two ranks of one node (the threads backend:
 * local rank = rank) copies each of a dataset's files exactly once (local
 * rank 0 copies, rank 1 copies nothing and gets the same staged path), and
 * the copy reads as the source: the same bytes, and the token dataset and
 * the MNIST (IDX) dataset opened from the stage give the same samples as
 * from the source.  A second run copies nothing (the files keep their
 * inodes); a source file that changed (size, mtime) is copied again alone;
 * a set without its MANIFEST (a copy cut short) is copied again whole; a
 * shard gone from the source disappears from the stage.
 *
 * If it failed, every rank of a node would copy (N× the I/O), later runs
 * would copy again or train on stale files, or the staged glob would
 * match shards the source no longer has. */
#include "stage_test_util.h"

// Every sample of the dataset at a equals the one at b (the whole x and y).
static void same_samples(const char *kind, const char *a, const char *b) {
  px_dataset *da = NULL, *db = NULL;
  if (strcmp(kind, "tokens") == 0) {
    CHECK_OK(px_token_dataset_open(&da, a, 64, false, 512));
    CHECK_OK(px_token_dataset_open(&db, b, 64, false, 512));
  } else {
    CHECK_OK(px_mnist_open(&da, a, "test", 0.5f, 0.25f));
    CHECK_OK(px_mnist_open(&db, b, "test", 0.5f, 0.25f));
  }
  CHECK(da->length == db->length && da->length > 0, "%s: %zu samples from the source, %zu from the stage", kind,
        da->length, db->length);
  px_batch ba, bb;
  CHECK_OK(px_batch_alloc(&ba, da, 1));
  CHECK_OK(px_batch_alloc(&bb, db, 1));
  px_rng rng = px_rng_make(1, 0);
  size_t differ = 0;
  for (size_t i = 0; i < da->length && i < db->length; i += (da->length / 200) + 1) {
    CHECK_OK(px_dataset_get(da, i, &ba, 0, &rng));
    CHECK_OK(px_dataset_get(db, i, &bb, 0, &rng));
    differ += memcmp(ba.x.data, bb.x.data, px_tensor_nbytes(&ba.x)) != 0 ||
      memcmp(ba.y.data, bb.y.data, px_tensor_nbytes(&ba.y)) != 0;
  }
  CHECK(differ == 0, "%s: %zu sampled records differ between source and stage", kind, differ);
  px_batch_free(&ba);
  px_batch_free(&bb);
  px_dataset_free(da);
  px_dataset_free(db);
}

int main(void) {
  char src[4096], stage[4096], glob_src[4200], p[8400], q[8400];
  make_dirs("stage_once", src, sizeof src, stage, sizeof stage);
  for (int k = 0; k < ST_SHARDS; k++) write_shard(src, k, 0);
  snprintf(p, sizeof p, "%s/notes.txt", src);  // not matched by the glob: not staged
  CHECK_OK(px_write_file_atomic(p, "x", 1));
  snprintf(glob_src, sizeof glob_src, "%s/shard_*.bin", src);

  // 1. The first run: one copy per file, all by rank 0.
  stage_job j = {.stage = stage, .kind = "tokens", .source = glob_src, .verify = PX_STAGE_VERIFY_FULL};
  stage2(&j);
  CHECK(j.st[0] == PX_OK && j.st[1] == PX_OK, "staging failed: %s | %s", j.err[0], j.err[1]);
  CHECK(j.res[0].copied == ST_SHARDS && j.res[1].copied == 0 && copies(&j) == ST_SHARDS,
        "first run: rank 0 copied %zu, rank 1 %zu; expected %d and 0", j.res[0].copied, j.res[1].copied, ST_SHARDS);
  CHECK(j.res[0].files == ST_SHARDS, "the set has %zu files", j.res[0].files);
  CHECK(strcmp(j.staged[0], j.staged[1]) == 0, "ranks got different paths: %s, %s", j.staged[0], j.staged[1]);
  CHECK(strncmp(j.staged[0], stage, strlen(stage)) == 0 && strstr(j.staged[0], "/shard_*.bin"),
        "staged path %s is not the glob inside %s", j.staged[0], stage);
  const char *dir = j.res[0].dir;
  ino_t ino[ST_SHARDS];
  for (int k = 0; k < ST_SHARDS; k++) {
    snprintf(p, sizeof p, "%s/shard_%06d.bin", src, k);
    snprintf(q, sizeof q, "%s/shard_%06d.bin", dir, k);
    CHECK(same_bytes(p, q), "staged %s differs from %s", q, p);
    ino[k] = inode_of(q);
  }
  snprintf(q, sizeof q, "%s/notes.txt", dir);
  CHECK(access(q, F_OK) != 0, "a file the glob does not match was staged");
  snprintf(q, sizeof q, "%s/MANIFEST", dir);
  CHECK(access(q, F_OK) == 0, "no MANIFEST in %s", dir);
  same_samples("tokens", glob_src, j.staged[0]);

  // 2. A second run reuses the copy: nothing copied, same inodes.
  stage2(&j);
  CHECK(j.st[0] == PX_OK && j.st[1] == PX_OK, "second run failed: %s | %s", j.err[0], j.err[1]);
  CHECK(copies(&j) == 0 && j.res[0].reused == ST_SHARDS, "second run copied %zu, reused %zu", copies(&j),
        j.res[0].reused);
  CHECK(j.res[0].bytes_verified == j.res[0].bytes, "full verification read %llu of %llu bytes",
        (unsigned long long)j.res[0].bytes_verified, (unsigned long long)j.res[0].bytes);
  for (int k = 0; k < ST_SHARDS; k++) {
    snprintf(q, sizeof q, "%s/shard_%06d.bin", dir, k);
    CHECK(inode_of(q) == ino[k], "shard %d was replaced on a run that should reuse it", k);
  }

  // 3. A source file that changed is copied again, alone.
  write_shard(src, 1, 12345);
  stage2(&j);
  CHECK(copies(&j) == 1 && j.res[0].reused == ST_SHARDS - 1, "changed source: copied %zu, reused %zu (expected 1, %d)",
        copies(&j), j.res[0].reused, ST_SHARDS - 1);
  snprintf(p, sizeof p, "%s/shard_%06d.bin", src, 1);
  snprintf(q, sizeof q, "%s/shard_%06d.bin", dir, 1);
  CHECK(same_bytes(p, q), "the changed shard was not re-staged");
  same_samples("tokens", glob_src, j.staged[0]);

  // 4. No MANIFEST (a copy cut short): everything is copied again.
  snprintf(q, sizeof q, "%s/MANIFEST", dir);
  CHECK(unlink(q) == 0, "unlink %s", q);
  stage2(&j);
  CHECK(copies(&j) == ST_SHARDS && j.res[1].copied == 0, "no manifest: copied %zu (expected %d, by rank 0)", copies(&j),
        ST_SHARDS);

  // 5. A shard gone from the source is gone from the stage (the staged
  //    glob must match what the source's matches); a stray temporary too.
  snprintf(p, sizeof p, "%s/shard_%06d.bin", src, ST_SHARDS - 1);
  CHECK(unlink(p) == 0, "unlink %s", p);
  snprintf(q, sizeof q, "%s/.shard_000000.bin.tmp.deadhost.1", dir);
  CHECK_OK(px_write_file_atomic(q, "junk", 4));
  stage2(&j);
  CHECK(j.st[0] == PX_OK && copies(&j) == 0 && j.res[0].files == ST_SHARDS - 1,
        "after removing a shard: %s, copied %zu, set of %zu", j.err[0], copies(&j), j.res[0].files);
  snprintf(q, sizeof q, "%s/shard_%06d.bin", dir, ST_SHARDS - 1);
  CHECK(access(q, F_OK) != 0, "the removed shard is still staged");
  snprintf(q, sizeof q, "%s/.shard_000000.bin.tmp.deadhost.1", dir);
  CHECK(access(q, F_OK) != 0, "a stray temporary survived");
  snprintf(q, sizeof q, "%s/MANIFEST", dir);
  unsigned char *man = NULL;
  size_t man_n = 0;
  CHECK(read_all(q, &man, &man_n), "no MANIFEST after dropping a shard");
  if (man) {
    man[man_n] = 0;
    CHECK(!strstr((char *)man, "shard_000002.bin") && strstr((char *)man, "shard_000001.bin"),
          "the MANIFEST still lists the dropped shard:\n%s", (char *)man);
  }
  free(man);
  same_samples("tokens", glob_src, j.staged[0]);

  // 6. MNIST: the IDX files of the directory (here the real Fashion-MNIST,
  //    gzip'ed, when the machine has it), copied once and read back alike.
  const char *fm = "/usr/share/datasets/fashion-mnist";
  if (access(fm, R_OK) == 0) {
    stage_job m = {.stage = stage, .kind = "mnist", .source = fm, .verify = PX_STAGE_VERIFY_FULL};
    stage2(&m);
    CHECK(m.st[0] == PX_OK && m.st[1] == PX_OK, "mnist staging failed: %s | %s", m.err[0], m.err[1]);
    CHECK(m.res[0].copied == 4 && m.res[1].copied == 0, "mnist: rank 0 copied %zu, rank 1 %zu (expected 4, 0)",
          m.res[0].copied, m.res[1].copied);
    same_samples("mnist", fm, m.staged[0]);
    stage2(&m);
    CHECK(copies(&m) == 0 && m.res[0].reused == 4, "mnist second run copied %zu", copies(&m));
    printf("mnist: %.1f MB staged\n", (double)m.res[0].bytes / 1e6);
  } else {
    printf("mnist part not run: %s is absent (the token part stands alone)\n", fm);
  }

  remove_dir(stage);
  remove_dir(src);
  return px_test_finish("test_stage_copies_once_per_node_and_is_reused");
}
