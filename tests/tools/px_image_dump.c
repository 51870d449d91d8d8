// px_image_dump: decode one image and run plexus's image transform, for
// tests/test_image_transforms_match_torchvision.py.
//
//   px_image_dump IMAGE OUT CHANNELS RESIZE CROP RANDOM_CROP HFLIP SEED
//                 MEAN0 MEAN1 MEAN2 STD0 STD1 STD2
//
// OUT gets one text line "C H W top left flip\n" (the crop window in resized
// coordinates and the flip drawn from px_rng_make(SEED, 0)), then the
// sample, C·H·W little-endian f32.
#include "data/transform.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  if (argc != 15) {
    fprintf(stderr,
            "usage: %s IMAGE OUT CHANNELS RESIZE CROP RANDOM_CROP HFLIP SEED MEAN0 MEAN1 MEAN2 STD0 STD1 STD2\n",
            argv[0]);
    return 2;
  }
  int channels = atoi(argv[3]);
  float mean[3], std[3];
  for (int c = 0; c < 3; c++) {
    mean[c] = strtof(argv[9 + c], NULL);
    std[c] = strtof(argv[12 + c], NULL);
  }
  px_transform t;
  px_image img;
  px_transform_plan plan;
  px_rng rng = px_rng_make(strtoull(argv[8], NULL, 10), 0);
  px_status st = px_transform_init(&t, atoi(argv[4]), atoi(argv[5]), atoi(argv[6]) != 0, atoi(argv[7]) != 0, mean, std);
  if (st == PX_OK) st = px_image_load(argv[1], channels, &img);
  if (st != PX_OK) {
    fprintf(stderr, "px_image_dump: %s\n", px_last_error());
    return 1;
  }
  st = px_transform_plan_make(&t, &img, argv[1], &rng, &plan);
  if (st != PX_OK) {
    fprintf(stderr, "px_image_dump: %s\n", px_last_error());
    return 1;
  }
  size_t n = (size_t)channels * (size_t)plan.out_h * (size_t)plan.out_w;
  float *out = malloc(sizeof(float) * n);
  if (!out) return 1;
  px_transform_apply(&t, &img, &plan, out);
  FILE *f = fopen(argv[2], "wb");
  if (!f) return 1;
  fprintf(f, "%d %d %d %d %d %d\n", channels, plan.out_h, plan.out_w, plan.top, plan.left, plan.flip ? 1 : 0);
  int ok = fwrite(out, sizeof(float), n, f) == n;
  ok &= fclose(f) == 0;
  free(out);
  px_image_free(&img);
  return ok ? 0 : 1;
}
