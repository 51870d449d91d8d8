/* Image transforms (internal): resize of the shorter side, center/random
 * crop, horizontal flip and normalisation, fused into one pass from the
 * decoded u8 H×W×C image to the f32 C×H×W sample.
 *
 * Conventions follow torchvision on tensors, so its pipelines compare:
 *   Resize(s):      shorter side -> s, longer -> floor(s·long/short);
 *                   bilinear, align_corners=False (no antialias), result
 *                   rounded to u8 as torchvision does for u8 tensors.
 *   CenterCrop(c):  top = round((H - c)/2), left = round((W - c)/2) with
 *                   Python's round (halves to even).
 *   RandomCrop(c):  top uniform in [0, H - c], left in [0, W - c].
 *   Flip:           mirror columns with p = 0.5.
 *   Normalize:      x = (v/255 - mean[c]) / std[c].
 * Only the pixels that survive the crop are resized or converted. */
#ifndef PX_DATA_TRANSFORM_H
#define PX_DATA_TRANSFORM_H

#include "plexus/data.h"

typedef struct px_transform {
  int resize;       /* shorter side to this (0: keep) */
  int crop;         /* square crop side (0: none) */
  bool random_crop; /* else center */
  bool hflip;       /* random flip, p = 0.5 */
  float mean[3], std[3];
  float lut[3][256]; /* lut[c][v] = (v/255 - mean[c]) / std[c], from px_transform_init */
} px_transform;

/* Check the options and fill the lookup table. */
px_status px_transform_init(px_transform *t, int resize, int crop, bool random_crop, bool hflip, const float mean[3],
                            const float std[3]);

/* The size after the resize step (the whole image, before cropping). */
void px_transform_resized_size(const px_transform *t, int w, int h, int *out_w, int *out_h);
/* The sample's height and width for an input of w×h (crop, else resized). */
void px_transform_output_size(const px_transform *t, int w, int h, int *out_w, int *out_h);

/* The crop window (in resized coordinates) and flip decision for one sample,
 * drawn from rng in this order: crop top, crop left (random crop only), then
 * the flip (hflip only).  Fails when the image is smaller than the crop. */
typedef struct px_transform_plan {
  int resized_w, resized_h; /* the image after the resize step */
  int top, left;            /* crop window origin */
  int out_w, out_h;         /* crop window size */
  bool flip;
} px_transform_plan;

px_status px_transform_plan_make(const px_transform *t, const px_image *img, const char *name, px_rng *rng,
                                 px_transform_plan *plan);

/* Write the sample for `plan` into out: (channels, out_h, out_w) f32. */
void px_transform_apply(const px_transform *t, const px_image *img, const px_transform_plan *plan, float *out);

/* Python's round() of x/2 for an integer x: halves go to the even neighbour. */
int px_transform_half_round_even(int x);

#endif
