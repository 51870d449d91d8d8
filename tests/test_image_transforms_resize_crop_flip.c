// The fused image transform gives what the separate steps give: bilinear
// resize of the shorter side (align_corners=False, hand-computed values),
// the center crop where torchvision puts it (halves round to even), a
// mirror when flipped, (v/255 - mean)/std per channel; random crops and flips
// are a function of the sample's rng (same seed, same sample; different
// seeds, different crops, about half flipped).  If this fails, models see
// shifted, blurred or mis-normalised images, or runs are not reproducible.
#include "px_test.h"
#include "data/transform.h"

#include <stdlib.h>
#include <string.h>

static const float zero3[3] = {0, 0, 0}, one3[3] = {1, 1, 1};

static px_image gray_image(int w, int h, const uint8_t *v) {
  px_image img = {.width = w, .height = h, .channels = 1, .data = malloc((size_t)w * h)};
  memcpy(img.data, v, (size_t)w * h);
  return img;
}

// Every pixel distinct: v = (y·W + x)·c-dependent, so a misplaced crop shows.
static px_image pattern(int w, int h, int c) {
  px_image img = {.width = w, .height = h, .channels = c, .data = malloc((size_t)w * h * c)};
  for (int y = 0; y < h; y++)
    for (int x = 0; x < w; x++)
      for (int k = 0; k < c; k++) img.data[((size_t)y * w + x) * c + k] = (uint8_t)((y * w + x) * 3 + k * 71);
  return img;
}

static float *run(const px_transform *t, const px_image *img, px_rng *rng, px_transform_plan *plan) {
  CHECK_OK(px_transform_plan_make(t, img, "test", rng, plan));
  float *out = malloc(sizeof(float) * (size_t)img->channels * plan->out_w * plan->out_h);
  px_transform_apply(t, img, plan, out);
  return out;
}

static void resize_matches_hand_computed_bilinear(void) {
  // 4×2 -> shorter side 4: 8×4, scale 1/2 both ways.  Source x of output
  // column j: (j + 0.5)/2 - 0.5 = 0.5j - 0.25 (clamped at 0): 0, .25, .75,
  // 1.25, ... 3.25 (the last column repeats).  Row 0 interpolated along x:
  // [0, 25, 75, 125, 175, 160, 80, 40]; rows mix it with row 1 (all 100)
  // at source y 0, .25, .75, 1.25(-> row 1 only); then round half to even.
  const uint8_t src[8] = {0, 100, 200, 40, 100, 100, 100, 100};
  const int want[4][8] = {{0, 25, 75, 125, 175, 160, 80, 40},
                          {25, 44, 81, 119, 156, 145, 85, 55},
                          {75, 81, 94, 106, 119, 115, 95, 85},
                          {100, 100, 100, 100, 100, 100, 100, 100}};
  px_image img = gray_image(4, 2, src);
  px_transform t;
  CHECK_OK(px_transform_init(&t, 4, 0, false, false, zero3, one3));
  px_rng rng = px_rng_make(1, 0);
  px_transform_plan plan;
  float *out = run(&t, &img, &rng, &plan);
  CHECK(plan.out_w == 8 && plan.out_h == 4, "4×2 resized to %d×%d, want 8×4", plan.out_w, plan.out_h);
  int bad = 0;
  for (int y = 0; y < 4; y++)
    for (int x = 0; x < 8; x++)
      if (out[y * 8 + x] != (float)want[y][x] / 255.0f) {
        if (bad++ < 5) fprintf(stderr, "  (%d,%d): %g, want %d\n", y, x, out[y * 8 + x] * 255.0, want[y][x]);
      }
  CHECK(bad == 0, "%d resized pixels differ from the hand-computed bilinear values", bad);
  free(out);
  px_image_free(&img);

  // The longer side is truncated like torchvision's int(s·long/short).
  int w, h;
  px_transform_resized_size(&t, 5, 3, &w, &h);
  CHECK(w == 6 && h == 4, "5×3 with shorter side 4: %d×%d, want 6×4 (4·5/3 = 6.67 truncated)", w, h);
  px_transform_resized_size(&t, 3, 7, &w, &h);
  CHECK(w == 4 && h == 9, "3×7 with shorter side 4: %d×%d, want 4×9", w, h);
}

static void center_crop_is_where_torchvision_puts_it(void) {
  CHECK(px_transform_half_round_even(3) == 2 && px_transform_half_round_even(5) == 2 &&
          px_transform_half_round_even(4) == 2 && px_transform_half_round_even(1) == 0,
        "round(x/2) with halves to even: 3->2, 5->2, 4->2, 1->0");
  // 9×6 crop 4: top = round(2/2) = 1, left = round(5/2) = 2 (half to even).
  px_image img = pattern(9, 6, 1);
  px_transform t;
  CHECK_OK(px_transform_init(&t, 0, 4, false, false, zero3, one3));
  px_rng rng = px_rng_make(1, 0);
  px_transform_plan plan;
  float *out = run(&t, &img, &rng, &plan);
  CHECK(plan.top == 1 && plan.left == 2, "center crop at (%d,%d), want (1,2)", plan.top, plan.left);
  int bad = 0;
  for (int y = 0; y < 4; y++)
    for (int x = 0; x < 4; x++) bad += out[y * 4 + x] != (float)img.data[(1 + y) * 9 + 2 + x] / 255.0f;
  CHECK(bad == 0, "%d cropped pixels are not the source's", bad);
  free(out);
  px_image_free(&img);
  // Smaller than the crop: an error naming the image.
  px_image small = pattern(3, 8, 1);
  CHECK(px_transform_plan_make(&t, &small, "small.png", &rng, &plan) == PX_ERR_FORMAT, "3×8 cropped to 4");
  CHECK(strstr(px_last_error(), "small.png") && strstr(px_last_error(), "3×8"), "message: %s", px_last_error());
  px_image_free(&small);
}

static void normalisation_and_layout_are_chw(void) {
  px_image img = pattern(5, 4, 3);
  const float mean[3] = {0.485f, 0.456f, 0.406f}, std[3] = {0.229f, 0.224f, 0.225f};
  px_transform t;
  CHECK_OK(px_transform_init(&t, 0, 0, false, false, mean, std));
  px_rng rng = px_rng_make(1, 0);
  px_transform_plan plan;
  float *out = run(&t, &img, &rng, &plan);
  int bad = 0;
  for (int c = 0; c < 3; c++)
    for (int y = 0; y < 4; y++)
      for (int x = 0; x < 5; x++) {
        float want = ((float)img.data[(y * 5 + x) * 3 + c] / 255.0f - mean[c]) / std[c];
        bad += out[(c * 4 + y) * 5 + x] != want;
      }
  CHECK(bad == 0, "%d values are not (v/255 - mean[c])/std[c] at [c][y][x]", bad);
  free(out);
  px_image_free(&img);
  float zstd[3] = {1, 0, 1};
  CHECK(px_transform_init(&t, 0, 0, false, false, mean, zstd) == PX_ERR_INVALID, "std 0 accepted");
  CHECK(px_transform_init(&t, 0, 0, true, false, mean, std) == PX_ERR_INVALID, "random crop of size 0 accepted");
}

// The fused pass equals: resize the whole image, crop, then mirror.
static void fused_equals_steps_and_random_choices_follow_the_rng(void) {
  px_image img = pattern(23, 17, 3);
  px_transform whole, fused;
  CHECK_OK(px_transform_init(&whole, 20, 0, false, false, zero3, one3));
  CHECK_OK(px_transform_init(&fused, 20, 12, true, true, zero3, one3));
  px_rng r0 = px_rng_make(0, 0);
  px_transform_plan pw;
  float *full = run(&whole, &img, &r0, &pw);  // 27×20
  CHECK(pw.out_w == 27 && pw.out_h == 20, "23×17 resized to %d×%d, want 27×20", pw.out_w, pw.out_h);
  int tops[9] = {0}, lefts[16] = {0}, flips = 0, mismatches = 0;
  const int seeds = 400;
  for (int seed = 0; seed < seeds; seed++) {
    px_rng a = px_rng_make(7, (uint64_t)seed), b = px_rng_make(7, (uint64_t)seed);
    px_transform_plan p, q;
    float *x = run(&fused, &img, &a, &p);
    float *y = run(&fused, &img, &b, &q);
    CHECK(memcmp(x, y, sizeof(float) * 3 * 12 * 12) == 0 && p.top == q.top && p.left == q.left && p.flip == q.flip,
          "seed %d: the same rng gave two different samples", seed);
    CHECK(p.top >= 0 && p.top <= 8 && p.left >= 0 && p.left <= 15, "crop at (%d,%d) outside the 27×20 image", p.top,
          p.left);
    tops[p.top]++;
    lefts[p.left]++;
    flips += p.flip;
    for (int c = 0; c < 3; c++)
      for (int r = 0; r < 12; r++)
        for (int col = 0; col < 12; col++) {
          int sc = p.flip ? 11 - col : col;
          mismatches += x[(c * 12 + r) * 12 + col] != full[(c * 20 + p.top + r) * 27 + p.left + sc];
        }
    free(x);
    free(y);
  }
  CHECK(mismatches == 0, "%d values of the fused resize+crop+flip differ from the steps done apart", mismatches);
  for (int k = 0; k <= 8; k++) CHECK(tops[k] > 0, "crop top %d never drawn in %d seeds", k, seeds);
  for (int k = 0; k <= 15; k++) CHECK(lefts[k] > 0, "crop left %d never drawn in %d seeds", k, seeds);
  CHECK(flips > seeds * 4 / 10 && flips < seeds * 6 / 10, "%d of %d samples flipped; want about half", flips, seeds);
  free(full);

  // Flip without resize or crop: exactly the mirror.
  px_transform f;
  CHECK_OK(px_transform_init(&f, 0, 0, false, true, zero3, one3));
  px_transform_plan p;
  int mirrored = 0, plain = 0;
  for (int seed = 0; seed < 8; seed++) {
    px_rng r = px_rng_make(3, (uint64_t)seed);
    float *x = run(&f, &img, &r, &p);
    int bad = 0;
    for (int c = 0; c < 3; c++)
      for (int y = 0; y < 17; y++)
        for (int col = 0; col < 23; col++) {
          int sc = p.flip ? 22 - col : col;
          bad += x[(c * 17 + y) * 23 + col] != (float)img.data[(y * 23 + sc) * 3 + c] / 255.0f;
        }
    CHECK(bad == 0, "seed %d (flip %d): %d values are not the (mirrored) source", seed, p.flip, bad);
    mirrored += p.flip;
    plain += !p.flip;
    free(x);
  }
  CHECK(mirrored > 0 && plain > 0, "8 seeds gave %d flipped, %d not", mirrored, plain);
  px_image_free(&img);
}

int main(void) {
  resize_matches_hand_computed_bilinear();
  center_crop_is_where_torchvision_puts_it();
  normalisation_and_layout_are_chw();
  fused_equals_steps_and_random_choices_follow_the_rng();
  return px_test_finish("test_image_transforms_resize_crop_flip");
}
