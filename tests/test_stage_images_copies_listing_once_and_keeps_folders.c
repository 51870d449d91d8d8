/* Claim: px_stage_images with two ranks of one node (the threads backend)
 * copies an image listing, every image it names and (ImageNet layout) the
 * synset mapping exactly once, all by local rank 0; both ranks get the same
 * staged listing, whose directory holds each image under its path below
 * the source root (a/0.png and b/0.png both, synset folders), and the image
 * dataset opened from it (root NULL) gives the same samples as the source.
 * An image listed twice is copied once; a second run copies nothing; an
 * image file in a sub-folder of the stage that the listing does not name
 * is removed; a path that leaves the root is refused naming the CSV line.
 *
 * If it failed, every rank would copy, images of one name in different
 * folders would overwrite each other, or the staged listing would read
 * other images than the source's. */
#include "stage_test_util.h"

typedef struct img_job {
  const char *stage;
  px_image_opts src;
  px_staged_images out[ST_RANKS];
  px_stage_result res[ST_RANKS];
  px_status st[ST_RANKS];
  char err[ST_RANKS][512];
} img_job;

static int img_rank(px_comm *c, void *arg) {
  img_job *j = arg;
  const int r = px_comm_rank(c);
  j->st[r] = px_stage_images(c, j->stage, &j->src, PX_STAGE_VERIFY_FULL, &j->out[r], &j->res[r]);
  snprintf(j->err[r], sizeof j->err[r], "%s", j->st[r] == PX_OK ? "" : px_last_error());
  return 0;
}

static void stage_images2(img_job *j) {
  memset(j->res, 0, sizeof j->res);
  int code = -1;
  CHECK_OK(px_comm_run(ST_RANKS, img_rank, j, &code));
  CHECK(code == 0, "px_comm_run exit code %d", code);
  CHECK(j->res[1].files == 0 && j->res[1].copied == 0 && j->res[1].dir[0] == 0,
        "rank 1 staged too (%zu files looked at, %zu copied)", j->res[1].files, j->res[1].copied);
  if (j->st[0] == PX_OK && j->st[1] == PX_OK)
    CHECK(strcmp(j->out[0].csv, j->out[1].csv) == 0, "ranks got different listings: %s, %s", j->out[0].csv,
          j->out[1].csv);
}

static void write_image(const char *path, int seed, bool png) {
  uint8_t px[12 * 12 * 3];
  for (size_t i = 0; i < sizeof px; i++) px[i] = (uint8_t)((i * 37u + (unsigned)seed * 101u) % 251u);
  px_image img = {.width = 12, .height = 12, .channels = 3, .data = px};
  CHECK_OK(px_image_save(path, &img, 90));
}

// Every sample from the source listing equals the one from the staged listing.
static void same_samples(const px_image_opts *src, const img_job *j) {
  px_image_opts a = *src, b = *src;
  b.csv = j->out[0].csv;
  b.root = NULL;
  b.synsets = *j->out[0].synsets ? j->out[0].synsets : NULL;
  px_dataset *da = NULL, *db = NULL;
  CHECK_OK(px_image_dataset_open(&da, &a));
  CHECK_OK(px_image_dataset_open(&db, &b));
  if (!da || !db) return;
  CHECK(da->length == db->length && da->length > 0, "%zu samples from the source, %zu from the stage", da->length,
        db->length);
  px_batch ba, bb;
  CHECK_OK(px_batch_alloc(&ba, da, 1));
  CHECK_OK(px_batch_alloc(&bb, db, 1));
  px_rng rng = px_rng_make(1, 0);
  size_t differ = 0;
  for (size_t i = 0; i < da->length; i++) {
    CHECK_OK(px_dataset_get(da, i, &ba, 0, &rng));
    CHECK_OK(px_dataset_get(db, i, &bb, 0, &rng));
    differ += memcmp(ba.x.data, bb.x.data, px_tensor_nbytes(&ba.x)) != 0 ||
      memcmp(ba.y.data, bb.y.data, px_tensor_nbytes(&ba.y)) != 0;
  }
  CHECK(differ == 0, "%zu of %zu samples differ between source and stage", differ, da->length);
  px_batch_free(&ba);
  px_batch_free(&bb);
  px_dataset_free(da);
  px_dataset_free(db);
}

int main(void) {
  char src[4096], stage[4096], p[8400], q[8400], csv[4200];
  make_dirs("stage_images", src, sizeof src, stage, sizeof stage);

  // 1. path,label: a/0.png ... a/3.png and b/0.png ... b/3.png (JPEGs in b),
  //    a/0.png listed twice (once as ./a/0.png).
  char rows[4096] = "path,label\n";
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 4; i++) {
      snprintf(p, sizeof p, "%s/%c", src, 'a' + k);
      CHECK_OK(px_mkdir_p(p, "test", false));
      snprintf(p, sizeof p, "%s/%c/%d.%s", src, 'a' + k, i, k ? "jpg" : "png");
      write_image(p, 10 * k + i, k == 0);
      snprintf(rows + strlen(rows), sizeof rows - strlen(rows), "%c/%d.%s,%d\n", 'a' + k, i, k ? "jpg" : "png", k);
    }
  strcat(rows, "./a/0.png,0\n");
  snprintf(csv, sizeof csv, "%s/list.csv", src);
  CHECK_OK(px_write_file_atomic(csv, rows, strlen(rows)));
  img_job j = {.stage = stage, .src = PX_IMAGE_DEFAULTS};
  j.src.csv = csv;
  stage_images2(&j);
  CHECK(j.st[0] == PX_OK && j.st[1] == PX_OK, "staging failed: %s | %s", j.err[0], j.err[1]);
  CHECK(j.res[0].copied == 9 && j.res[0].files == 9, "first run: rank 0 copied %zu of %zu; expected 9 of 9",
        j.res[0].copied, j.res[0].files);
  const char *dir = j.res[0].dir;
  snprintf(q, sizeof q, "%s/list.csv", dir);
  CHECK(strcmp(j.out[0].csv, q) == 0 && j.out[0].synsets[0] == 0, "staged listing %s, expected %s", j.out[0].csv, q);
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 4; i++) {
      snprintf(p, sizeof p, "%s/%c/%d.%s", src, 'a' + k, i, k ? "jpg" : "png");
      snprintf(q, sizeof q, "%s/%c/%d.%s", dir, 'a' + k, i, k ? "jpg" : "png");
      CHECK(same_bytes(p, q), "staged %s differs from %s", q, p);
    }
  same_samples(&j.src, &j);

  // 2. Again: nothing copied.  A stray image in a staged folder goes.
  snprintf(q, sizeof q, "%s/b/old.png", dir);
  CHECK_OK(px_write_file_atomic(q, "x", 1));
  stage_images2(&j);
  CHECK(j.st[0] == PX_OK && j.res[0].copied == 0 && j.res[0].reused == 9, "second run: %s, copied %zu, reused %zu",
        j.err[0], j.res[0].copied, j.res[0].reused);
  CHECK(access(q, F_OK) != 0, "a file the listing does not name survived in %s", q);

  // 3. ImageNet: the mapping, synset folders below --image-root, a val image in the root itself.
  static const char *syn[] = {"n01440764", "n01443537"};
  char root[4200], inet[4100];
  snprintf(inet, sizeof inet, "%.4000s/inet", src);
  snprintf(root, sizeof root, "%s/train", inet);
  snprintf(rows, sizeof rows, "ImageId,PredictionString\n");
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 3; i++) {
      snprintf(p, sizeof p, "%s/%s", root, syn[k]);
      CHECK_OK(px_mkdir_p(p, "test", false));
      snprintf(p, sizeof p, "%s/%s/%s_%d.JPEG", root, syn[k], syn[k], i);
      write_image(p, 40 + 3 * k + i, false);
      snprintf(rows + strlen(rows), sizeof rows - strlen(rows), "%s_%d,%s 1 1 9 9\n", syn[k], i, syn[k]);
    }
  snprintf(p, sizeof p, "%s/ILSVRC2012_val_00000001.JPEG", root);
  write_image(p, 77, false);
  strcat(rows, "ILSVRC2012_val_00000001,n01443537 2 2 8 8\n");
  snprintf(csv, sizeof csv, "%s/LOC_train_solution.csv", inet);
  CHECK_OK(px_write_file_atomic(csv, rows, strlen(rows)));
  char synsets[4200];
  snprintf(synsets, sizeof synsets, "%s/LOC_synset_mapping.txt", inet);
  const char *mapping = "n01440764 tench\nn01443537 goldfish\n";
  CHECK_OK(px_write_file_atomic(synsets, mapping, strlen(mapping)));
  img_job in = {.stage = stage, .src = PX_IMAGE_DEFAULTS};
  in.src.csv = csv;
  in.src.root = root;
  in.src.layout = PX_CSV_IMAGENET;
  in.src.synsets = synsets;
  stage_images2(&in);
  CHECK(in.st[0] == PX_OK && in.st[1] == PX_OK, "imagenet staging failed: %s | %s", in.err[0], in.err[1]);
  CHECK(in.res[0].copied == 9 && in.res[0].files == 9, "imagenet: rank 0 copied %zu of %zu; expected 9 of 9",
        in.res[0].copied, in.res[0].files);
  snprintf(q, sizeof q, "%s/LOC_synset_mapping.txt", in.res[0].dir);
  CHECK(strcmp(in.out[0].synsets, q) == 0 && same_bytes(synsets, q), "staged mapping %s, expected %s",
        in.out[0].synsets, q);
  snprintf(p, sizeof p, "%s/%s/%s_2.JPEG", root, syn[1], syn[1]);
  snprintf(q, sizeof q, "%s/%s/%s_2.JPEG", in.res[0].dir, syn[1], syn[1]);
  CHECK(same_bytes(p, q), "staged %s differs from %s", q, p);
  same_samples(&in.src, &in);

  // 4. A path that leaves the root: refused on both ranks, naming the line.
  snprintf(csv, sizeof csv, "%s/bad.csv", src);
  const char *bad = "path,label\na/0.png,0\na/../../x.png,1\n";
  CHECK_OK(px_write_file_atomic(csv, bad, strlen(bad)));
  img_job b = {.stage = stage, .src = PX_IMAGE_DEFAULTS};
  b.src.csv = csv;
  stage_images2(&b);
  CHECK(b.st[0] == PX_ERR_INVALID && strstr(b.err[0], "line 3") && strstr(b.err[0], "\"..\""), "rank 0 says %s",
        b.err[0]);
  CHECK(b.st[1] != PX_OK && strstr(b.err[1], "failed on another rank"), "rank 1 says %s", b.err[1]);

  remove_dir(stage);
  remove_dir(src);
  return px_test_finish("test_stage_images_copies_listing_once_and_keeps_folders");
}
