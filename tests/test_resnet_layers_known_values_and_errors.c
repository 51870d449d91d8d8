/* Claim: the layers added for the ResNets compute known values by hand and
 * refuse what they cannot do:
 *   - max-pool with padding picks each window's maximum among real pixels
 *     only (padding is -inf, never 0: an all-negative plane stays negative)
 *     and sends the gradient back to it, summing where windows share it,
 *     for every window, stride, padding and plane size up to 9×8 (against
 *     the definition: windows clipped at the top, left, bottom and right);
 *   - global average pooling gives each plane's mean and spreads dy/(H·W);
 *   - the residual with a shortcut adds the two branches, and names the
 *     parameters as torchvision's BasicBlock does ("conv1.weight",
 *     "downsample.0.weight", "downsample.1.running_var");
 *   - bad shapes give PX_ERR_SHAPE with a message naming the layer and the
 *     shapes (for a residual, both branches' outputs and the shortcut's
 *     name); nonsensical constructions give NULL and a message, and free
 *     what they were handed (LeakSanitizer would see it otherwise).
 * If this fails, ResNet's stem pool, head or skip connections compute
 * something else than torchvision's, or its weights load under wrong names. */
#include "px_test.h"

#include <string.h>

static void check_padded_maxpool(void) {
  // k=3, s=2, p=1 on 4×4: windows rows {0,1} or {1,2,3}, cols {0,1} or {1,2,3}.
  //   x = [ 1  5  2  0 ]      y = [ 5  8 ]     dy = [ 1  2 ]    dx: 1 at (0,1), 2 + 4 at (1,2), 3 at (2,0)
  //       [ 3  4  8  1 ]          [ 9  8 ]          [ 3  4 ]
  //       [ 9  2  6  7 ]
  //       [ 0  3  1  4 ]
  float x[16] = {1, 5, 2, 0, 3, 4, 8, 1, 9, 2, 6, 7, 0, 3, 1, 4};
  const float want_y[4] = {5, 8, 9, 8};
  const float want_dx[16] = {0, 1, 0, 0, 0, 0, 6, 0, 3, 0, 0, 0, 0, 0, 0, 0};
  px_model *md;
  CHECK_OK(px_model_create(&md, px_maxpool2d_padded(3, 2, 1), 1));
  px_tensor t = px_tensor_f32(x, 4, 1, 1, 4, 4), y, dx;
  CHECK_OK(px_model_forward(md, &t, &y));
  CHECK(y.ndim == 4 && y.shape[2] == 2 && y.shape[3] == 2, "padded maxpool of 4x4 gives 2x2");
  for (int i = 0; i < 4; i++)
    CHECK(px_f32(&y)[i] == want_y[i], "padded maxpool y[%d] = %g, want %g", i, (double)px_f32(&y)[i],
          (double)want_y[i]);
  float g[4] = {1, 2, 3, 4};
  px_tensor dy = px_tensor_f32(g, 4, 1, 1, 2, 2);
  CHECK_OK(px_model_backward(md, &dy, &dx));
  for (int i = 0; i < 16; i++)
    CHECK(px_f32(&dx)[i] == want_dx[i], "padded maxpool dx[%d] = %g, want %g", i, (double)px_f32(&dx)[i],
          (double)want_dx[i]);
  // All negative: zero padding would win every border window.
  for (int i = 0; i < 16; i++) x[i] = -x[i] - 1.0f;
  CHECK_OK(px_model_forward(md, &t, &y));
  const float want_neg[4] = {-2, -1, -1, -2};  // max of -(x+1) over the same windows
  for (int i = 0; i < 4; i++)
    CHECK(px_f32(&y)[i] == want_neg[i], "negative plane: y[%d] = %g, want %g", i, (double)px_f32(&y)[i],
          (double)want_neg[i]);
  px_model_free(md);
}

// Every (k, s, p) with p <= k/2 on every plane size from 1×1 to 9×8 the
// window fits: y and the argmax the gradient goes to against the definition
// (the first maximum in scan order over the window's pixels inside the
// plane), planes of distinct values so the argmax is unique.
static void check_padded_maxpool_exhaustive(void) {
  static float x[2 * 9 * 8], dyb[2 * 12 * 12];  // H' <= H + 1 (s = 1, even k, p = k/2)
  int cases = 0, bad = 0;
  for (int k = 1; k <= 5; k++)
    for (int s = 1; s <= 3; s++)
      for (int p = 0; p <= k / 2; p++)
        for (int H = 1; H <= 9; H++)
          for (int W = 1; W <= 8; W++) {
            if (H + 2 * p < k || W + 2 * p < k) continue;
            const int Ho = (H + 2 * p - k) / s + 1, Wo = (W + 2 * p - k) / s + 1;
            for (int i = 0; i < 2 * H * W; i++) x[i] = (float)((i * 37 + H * 11 + W) % (2 * H * W + 1)) - 0.5f * H * W;
            px_model *md;
            CHECK_OK(px_model_create(&md, px_maxpool2d_padded(k, s, p), 1));
            px_tensor t = px_tensor_f32(x, 4, 1, 2, H, W), y, dx;
            CHECK_OK(px_model_forward(md, &t, &y));
            CHECK(y.shape[2] == Ho && y.shape[3] == Wo, "k=%d s=%d p=%d on %dx%d: %lldx%lld, want %dx%d", k, s, p, H, W,
                  (long long)y.shape[2], (long long)y.shape[3], Ho, Wo);
            // dy = 1 everywhere: dx counts how often each pixel was a window's argmax.
            for (int i = 0; i < 2 * Ho * Wo; i++) dyb[i] = 1.0f;
            px_tensor dy = px_tensor_f32(dyb, 4, 1, 2, Ho, Wo);
            CHECK_OK(px_model_backward(md, &dy, &dx));
            float count[2 * 9 * 8] = {0};
            for (int c = 0; c < 2; c++)
              for (int oh = 0; oh < Ho; oh++)
                for (int ow = 0; ow < Wo; ow++) {
                  float best = 0;
                  int at = -1;
                  for (int i = 0; i < k; i++)
                    for (int j = 0; j < k; j++) {
                      const int h = oh * s - p + i, w = ow * s - p + j;
                      if (h < 0 || h >= H || w < 0 || w >= W) continue;
                      const float v = x[(c * H + h) * W + w];
                      if (at < 0 || v > best) {
                        best = v;
                        at = (c * H + h) * W + w;
                      }
                    }
                  count[at] += 1.0f;
                  bad += px_f32(&y)[(c * Ho + oh) * Wo + ow] != best;
                }
            for (int i = 0; i < 2 * H * W; i++) bad += px_f32(&dx)[i] != count[i];
            cases++;
            px_model_free(md);
          }
  CHECK(bad == 0, "padded maxpool differs from the definition in %d values over %d cases", bad, cases);
}

static void check_global_avgpool(void) {
  float x[8] = {1, 2, 3, 4, -1, 0, 0, 5};  // (1, 2, 2, 2): means 2.5 and 1
  px_model *md;
  CHECK_OK(px_model_create(&md, px_global_avgpool2d(), 1));
  px_tensor t = px_tensor_f32(x, 4, 1, 2, 2, 2), y, dx;
  CHECK_OK(px_model_forward(md, &t, &y));
  CHECK(y.ndim == 2 && y.shape[0] == 1 && y.shape[1] == 2, "global avgpool gives (N, C)");
  CHECK(px_f32(&y)[0] == 2.5f && px_f32(&y)[1] == 1.0f, "global avgpool: %g %g, want 2.5 1", (double)px_f32(&y)[0],
        (double)px_f32(&y)[1]);
  float g[2] = {4, 8};
  px_tensor dy = px_tensor_f32(g, 2, 1, 2, 0, 0);
  CHECK_OK(px_model_backward(md, &dy, &dx));
  for (int i = 0; i < 8; i++)
    CHECK(px_f32(&dx)[i] == (i < 4 ? 1.0f : 2.0f), "global avgpool dx[%d] = %g", i, (double)px_f32(&dx)[i]);
  px_model_free(md);
}

// y = A·x + B·x with A, B set by hand: 2 features.
static void check_residual_sum(void) {
  px_model *md;
  CHECK_OK(px_model_create(&md, px_residual_shortcut(px_linear(2, 2, false), px_linear(2, 2, false), "proj"), 1));
  px_param *a = px_model_find(md, "weight"), *b = px_model_find(md, "proj.weight");
  CHECK(a && b, "inner is transparent (\"weight\"), the shortcut named (\"proj.weight\")");
  if (!a || !b) {
    px_model_free(md);
    return;
  }
  const float A[4] = {1, 2, 3, 4}, B[4] = {10, 0, 0, -1};
  memcpy(a->data, A, sizeof A);
  memcpy(b->data, B, sizeof B);
  float x[2] = {1, -1};
  px_tensor t = px_tensor_f32(x, 2, 1, 2, 0, 0), y, dx;
  CHECK_OK(px_model_forward(md, &t, &y));
  // A·x = (-1, -1), B·x = (10, 1)
  CHECK(px_f32(&y)[0] == 9.0f && px_f32(&y)[1] == 0.0f, "residual sum: %g %g, want 9 0", (double)px_f32(&y)[0],
        (double)px_f32(&y)[1]);
  float g[2] = {1, 2};
  px_tensor dy = px_tensor_f32(g, 2, 1, 2, 0, 0);
  px_model_zero_grad(md);
  CHECK_OK(px_model_backward(md, &dy, &dx));
  // dx = Aᵀ·g + Bᵀ·g = (7, 10) + (10, -2)
  CHECK(px_f32(&dx)[0] == 17.0f && px_f32(&dx)[1] == 8.0f, "residual dx: %g %g, want 17 8", (double)px_f32(&dx)[0],
        (double)px_f32(&dx)[1]);
  // dB = g·xᵀ = [[1, -1], [2, -2]]
  CHECK(b->grad[0] == 1.0f && b->grad[1] == -1.0f && b->grad[2] == 2.0f && b->grad[3] == -2.0f,
        "shortcut gradient accumulated");
  px_model_free(md);
}

static void check_basic_block_names(void) {
  px_module *inner = px_chain();
  px_chain_add_named(inner, "conv1", px_conv2d(4, 8, 3, 2, 1, false));
  px_chain_add_named(inner, "bn1", px_batchnorm(8, 1e-5f, 0.1f));
  px_chain_add_named(inner, "relu", px_relu());
  px_chain_add_named(inner, "conv2", px_conv2d(8, 8, 3, 1, 1, false));
  px_chain_add_named(inner, "bn2", px_batchnorm(8, 1e-5f, 0.1f));
  px_module *down = px_chain_of(2, px_conv2d(4, 8, 1, 2, 0, false), px_batchnorm(8, 1e-5f, 0.1f));
  px_module *blk = px_chain();
  px_chain_add_named(blk, "", px_residual_shortcut(inner, down, "downsample"));
  px_chain_add_named(blk, "relu", px_relu());
  px_module *layer = px_chain();
  px_chain_add_named(layer, "0", blk);
  px_module *root = px_chain();
  px_chain_add_named(root, "layer2", layer);
  px_model *md;
  CHECK_OK(px_model_create(&md, root, 1));
  const char *names[] = {"layer2.0.conv1.weight",      "layer2.0.bn1.weight",
                         "layer2.0.bn1.running_mean",  "layer2.0.conv2.weight",
                         "layer2.0.bn2.bias",          "layer2.0.downsample.0.weight",
                         "layer2.0.downsample.1.bias", "layer2.0.downsample.1.running_var"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    CHECK(px_model_find(md, names[i]) != NULL, "BasicBlock has \"%s\"", names[i]);
  CHECK(md->n_params == 9 && md->n_buffers == 6, "3 convs + 3 batchnorms: %d params, %d buffers", md->n_params,
        md->n_buffers);
  // The shortcut's parameters come last in the layout (backward runs it first).
  px_param *last = md->params[md->n_params - 1];
  CHECK(strcmp(last->name, "layer2.0.downsample.1.bias") == 0, "last parameter is %s", last->name);
  float xb[2 * 4 * 6 * 6] = {0};
  px_tensor x = px_tensor_f32(xb, 4, 2, 4, 6, 6), y;
  CHECK_OK(px_model_forward(md, &x, &y));
  CHECK(y.shape[1] == 8 && y.shape[2] == 3 && y.shape[3] == 3, "block output (2, 8, 3, 3)");
  px_model_free(md);
}

static void expect_shape_error(px_module *m, const px_tensor *x, const char *const *parts, int n_parts) {
  px_model *md;
  CHECK_OK(px_model_create(&md, m, 1));
  px_tensor y;
  px_clear_error();
  px_status st = px_model_forward(md, x, &y);
  const char *msg = px_last_error();
  CHECK(st == PX_ERR_SHAPE, "%s: got %s (%s)", parts[0], px_status_name(st), msg);
  for (int i = 0; i < n_parts; i++) CHECK(strstr(msg, parts[i]) != NULL, "message contains \"%s\": %s", parts[i], msg);
  px_model_free(md);
}

static void check_errors(void) {
  static float buf[4 * 3 * 8 * 8];
  px_tensor img = px_tensor_f32(buf, 4, 4, 3, 8, 8);
  px_tensor flat = px_tensor_f32(buf, 2, 4, 784, 0, 0);
  px_tensor one = px_tensor_f32(buf, 4, 4, 3, 1, 1);

  // The branches disagree: stride 2 inside, stride 1 in the shortcut.
  const char *res[] = {"Residual", "(4, 3, 8, 8)", "(4, 5, 4, 4)", "(4, 5, 8, 8)", "\"downsample\""};
  expect_shape_error(px_residual_shortcut(px_conv2d(3, 5, 3, 2, 1, false), px_conv2d(3, 5, 1, 1, 0, false),
                                          "downsample"),
                     &img, res, 5);
  const char *gap[] = {"GlobalAvgPool2d", "(4, 784)", "4-D"};
  expect_shape_error(px_global_avgpool2d(), &flat, gap, 3);
  const char *pool[] = {"MaxPool2d", "(4, 3, 1, 1)", "padded by 1", "padding=1"};
  expect_shape_error(px_maxpool2d_padded(4, 2, 1), &one, pool, 4);
  // ... while padding lets a 1×1 plane through a 3×3 window: (1 + 2 - 3)/2 + 1 = 1.
  {
    px_model *md;
    CHECK_OK(px_model_create(&md, px_maxpool2d_padded(3, 2, 1), 1));
    px_tensor y;
    CHECK_OK(px_model_forward(md, &one, &y));
    CHECK(y.shape[2] == 1 && y.shape[3] == 1, "padded 3x3 pool of 1x1 gives 1x1");
    px_model_free(md);
  }

  // Constructors.
  px_module *m = px_maxpool2d_padded(3, 2, 2);
  CHECK(m == NULL && strstr(px_last_error(), "padding") != NULL, "padding 2 > 3/2 refused: %s", px_last_error());
  px_module_free(m);
  m = px_maxpool2d_padded(3, 2, -1);
  CHECK(m == NULL, "padding -1 refused");
  px_module_free(m);
  // A failed inner constructor: NULL, the shortcut freed, the message kept.
  px_clear_error();
  m = px_residual_shortcut(px_conv2d(0, 4, 3, 1, 1, false), px_conv2d(3, 4, 1, 1, 0, false), "downsample");
  CHECK(m == NULL && strstr(px_last_error(), "Conv2d(0 -> 4") != NULL,
        "residual with a failed inner branch: NULL and the conv's message: %s", px_last_error());
  // A failed shortcut constructor (NULL with a name): NULL, not the identity; the inner branch freed.
  m = px_residual_shortcut(px_conv2d(3, 4, 3, 1, 1, false), px_conv2d(3, 4, 1, 0, 0, false), "downsample");
  CHECK(m == NULL && strstr(px_last_error(), "stride=0") != NULL,
        "residual with a failed shortcut: NULL and the conv's message: %s", px_last_error());
  // A shortcut that already belongs to a container.
  px_module *owner = px_chain_of(1, px_relu());
  m = px_residual_shortcut(px_relu(), owner->children[0], "downsample");
  CHECK(m == NULL, "residual refuses a shortcut owned by another container");
  px_module_free(m);
  px_module_free(owner);
}

int main(void) {
  check_padded_maxpool();
  check_padded_maxpool_exhaustive();
  check_global_avgpool();
  check_residual_sum();
  check_basic_block_names();
  check_errors();
  return px_test_finish("test_resnet_layers_known_values_and_errors");
}
