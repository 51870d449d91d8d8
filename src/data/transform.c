// Image transforms fused into one pass: for each pixel of the crop window
// (in the coordinates of the resized image, columns mirrored when flipped)
// sample the decoded image bilinearly — or copy it when there is no resize —
// and write the normalised value through a 256-entry table per channel.  No
// intermediate resized or cropped image is ever made.
#include "data/transform.h"

#include <math.h>
#include <stdlib.h>

px_status px_transform_init(px_transform *t, int resize, int crop, bool random_crop, bool hflip, const float mean[3],
                            const float std[3]) {
  if (resize < 0 || crop < 0 || resize > 65500 || crop > 65500)
    return px_error(PX_ERR_INVALID, "image transform: resize %d and crop %d must be in 0..65500", resize, crop);
  if (random_crop && crop == 0) return px_error(PX_ERR_INVALID, "image transform: random_crop needs a crop size > 0");
  *t = (px_transform){.resize = resize, .crop = crop, .random_crop = random_crop, .hflip = hflip};
  for (int c = 0; c < 3; c++) {
    if (!(std[c] != 0.0f) || !isfinite(std[c]) || !isfinite(mean[c]))
      return px_error(PX_ERR_INVALID,
                      "image transform: channel %d has mean %g, std %g; std must be finite and non-zero", c,
                      (double)mean[c], (double)std[c]);
    t->mean[c] = mean[c];
    t->std[c] = std[c];
    // The same float operations as torchvision's ToTensor then Normalize:
    // v/255, minus mean, divided by std.
    for (int v = 0; v < 256; v++) t->lut[c][v] = ((float)v / 255.0f - mean[c]) / std[c];
  }
  return PX_OK;
}

void px_transform_resized_size(const px_transform *t, int w, int h, int *out_w, int *out_h) {
  *out_w = w;
  *out_h = h;
  if (t->resize <= 0) return;
  // torchvision: shorter side -> s, longer -> int(s·long/short) (truncated).
  int64_t s = t->resize;
  if (w <= h) {
    *out_w = (int)s;
    *out_h = (int)(s * h / w);
  } else {
    *out_h = (int)s;
    *out_w = (int)(s * w / h);
  }
}

void px_transform_output_size(const px_transform *t, int w, int h, int *out_w, int *out_h) {
  if (t->crop > 0) {
    *out_w = *out_h = t->crop;
    return;
  }
  px_transform_resized_size(t, w, h, out_w, out_h);
}

int px_transform_half_round_even(int x) {
  // round(x / 2): exact for even x; for odd x the half goes to the even one.
  int q = x / 2;  // x >= 0 here
  if (x % 2 == 0) return q;
  return (q % 2 == 0) ? q : q + 1;
}

px_status px_transform_plan_make(const px_transform *t, const px_image *img, const char *name, px_rng *rng,
                                 px_transform_plan *plan) {
  int rw, rh;
  px_transform_resized_size(t, img->width, img->height, &rw, &rh);
  *plan = (px_transform_plan){.resized_w = rw, .resized_h = rh, .out_w = rw, .out_h = rh};
  if (t->crop > 0) {
    if (rw < t->crop || rh < t->crop)
      return px_error(PX_ERR_FORMAT, "image %s: %d×%d (%d×%d after resize) is smaller than the %d×%d crop", name,
                      img->width, img->height, rw, rh, t->crop, t->crop);
    plan->out_w = plan->out_h = t->crop;
    if (t->random_crop) {
      plan->top = (int)px_rng_below(rng, (uint64_t)(rh - t->crop) + 1);
      plan->left = (int)px_rng_below(rng, (uint64_t)(rw - t->crop) + 1);
    } else {
      plan->top = px_transform_half_round_even(rh - t->crop);
      plan->left = px_transform_half_round_even(rw - t->crop);
    }
  }
  if (t->hflip) plan->flip = px_rng_uniform(rng) < 0.5f;
  return PX_OK;
}

// align_corners=False: src = (dst + 0.5)·(in/out) - 0.5, clamped below at 0;
// the neighbours are floor(src) and the next one (the last repeats itself).
static void bilinear_index(int dst, float scale, int in, int *i0, int *i1, float *lambda) {
  float src = scale * ((float)dst + 0.5f) - 0.5f;
  if (src < 0.0f) src = 0.0f;
  int i = (int)src;
  if (i > in - 1) i = in - 1;
  *i0 = i;
  *i1 = i < in - 1 ? i + 1 : i;
  *lambda = src - (float)i;
}

// The crop of an image that is not resized: a gather through the table.
static void apply_plain(const px_transform *t, const px_image *img, const px_transform_plan *p, float *out) {
  const int C = img->channels, W = img->width;
  const size_t plane = (size_t)p->out_h * (size_t)p->out_w;
  for (int c = 0; c < C; c++) {
    const float *lut = t->lut[c];
    float *o = out + (size_t)c * plane;
    for (int y = 0; y < p->out_h; y++) {
      const uint8_t *row = img->data + ((size_t)(p->top + y) * (size_t)W + (size_t)p->left) * (size_t)C + c;
      float *orow = o + (size_t)y * (size_t)p->out_w;
      if (p->flip) {
        for (int x = 0, xs = p->out_w - 1; x < p->out_w; x++, xs--) orow[x] = lut[row[(size_t)xs * C]];
      } else if (C == 1) {
        for (int x = 0; x < p->out_w; x++) orow[x] = lut[row[x]];
      } else {
        for (int x = 0; x < p->out_w; x++) orow[x] = lut[row[(size_t)x * 3]];
      }
    }
  }
}

// The crop window of the resized image, computed straight from the source.
static void apply_resized(const px_transform *t, const px_image *img, const px_transform_plan *p, float *out) {
  const int C = img->channels, W = img->width, H = img->height;
  const float sx = (float)W / (float)p->resized_w, sy = (float)H / (float)p->resized_h;
  const size_t plane = (size_t)p->out_h * (size_t)p->out_w;
  // Per output column: the two source columns (as byte offsets) and weight.
  int *x0 = malloc(sizeof(int) * 2 * (size_t)p->out_w);
  float *lx = malloc(sizeof(float) * (size_t)p->out_w);
  if (!x0 || !lx) {
    free(x0);
    free(lx);
    // The plan could not be carried out; leave a recognisable NaN sample
    // rather than garbage.  (Allocation of a few KB failing means the
    // process is about to fail anyway.)
    for (size_t k = 0; k < plane * (size_t)C; k++) out[k] = NAN;
    return;
  }
  int *x1 = x0 + p->out_w;
  for (int x = 0; x < p->out_w; x++) {
    int rx = p->left + (p->flip ? p->out_w - 1 - x : x);
    int a, b;
    bilinear_index(rx, sx, W, &a, &b, &lx[x]);
    x0[x] = a * C;
    x1[x] = b * C;
  }
  for (int y = 0; y < p->out_h; y++) {
    int r0, r1;
    float ly;
    bilinear_index(p->top + y, sy, H, &r0, &r1, &ly);
    const uint8_t *row0 = img->data + (size_t)r0 * (size_t)W * (size_t)C;
    const uint8_t *row1 = img->data + (size_t)r1 * (size_t)W * (size_t)C;
    for (int c = 0; c < C; c++) {
      const float *lut = t->lut[c];
      float *orow = out + (size_t)c * plane + (size_t)y * (size_t)p->out_w;
      for (int x = 0; x < p->out_w; x++) {
        float l = lx[x];
        float top = (1.0f - l) * row0[x0[x] + c] + l * row0[x1[x] + c];
        float bot = (1.0f - l) * row1[x0[x] + c] + l * row1[x1[x] + c];
        float v = (1.0f - ly) * top + ly * bot;
        // Rounded to u8 as torchvision does after resizing a u8 tensor.
        int q = (int)lrintf(v);
        orow[x] = lut[q < 0 ? 0 : q > 255 ? 255 : q];
      }
    }
  }
  free(x0);
  free(lx);
}

void px_transform_apply(const px_transform *t, const px_image *img, const px_transform_plan *plan, float *out) {
  if (plan->resized_w == img->width && plan->resized_h == img->height) apply_plain(t, img, plan, out);
  else apply_resized(t, img, plan, out);
}
