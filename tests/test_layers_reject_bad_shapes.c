/* Claim: Conv2d, MaxPool2d, AvgPool2d, BatchNorm, LayerNorm, Softmax and
 * Flatten reject an input of the wrong shape with PX_ERR_SHAPE and a
 * message that names the layer type, the shape received, and (for layers
 * with parameters) the parameter's full name in the model; inputs too small
 * for a kernel are rejected too; constructors refuse nonsensical
 * configurations with PX_ERR_INVALID and NULL.  If this fails, a user who
 * wires a model wrongly gets a crash, silent garbage from out-of-bounds
 * reads, or a message that does not say which layer to fix. */
#include "px_test.h"

#include <string.h>

// Wrap `layer` as child "0" of a chain (so its parameters are "0.weight"),
// feed it `x` and check the error and its message.
static void expect_shape_error(px_module *layer, const px_tensor *x, const char *type, const char *shape,
                               const char *also) {
  px_model *md;
  CHECK_OK(px_model_create(&md, px_chain_of(1, layer), 1));
  px_tensor y;
  px_clear_error();
  px_status st = px_model_forward(md, x, &y);
  const char *msg = px_last_error();
  CHECK(st == PX_ERR_SHAPE, "%s given %s: got %s (%s)", type, shape, px_status_name(st), msg);
  CHECK(strstr(msg, type) != NULL, "message names the layer type %s: %s", type, msg);
  CHECK(strstr(msg, shape) != NULL, "message names the received shape %s: %s", shape, msg);
  if (also) CHECK(strstr(msg, also) != NULL, "message contains \"%s\": %s", also, msg);
  px_model_free(md);
}

static void expect_invalid(px_module *m, const char *what) {
  CHECK(m == NULL, "%s: constructor accepted a nonsensical configuration", what);
  if (m) px_module_free(m);
  CHECK(strlen(px_last_error()) > 0, "%s: no message", what);
}

int main(void) {
  static float buf[4 * 3 * 28 * 28];
  px_tensor mnist = px_tensor_f32(buf, 4, 4, 1, 28, 28);
  px_tensor flat = px_tensor_f32(buf, 2, 4, 784, 0, 0);
  px_tensor tiny = px_tensor_f32(buf, 4, 4, 3, 2, 2);
  px_tensor vec = px_tensor_f32(buf, 1, 5, 0, 0, 0);
  px_tensor scalar = px_tensor_f32(buf, 0, 0, 0, 0, 0);

  // Conv2d: wrong channels (the example in the contract), wrong rank, too small.
  expect_shape_error(px_conv2d(3, 8, 3, 1, 0, true), &mnist, "Conv2d", "(4, 1, 28, 28)", "\"0.weight\"");
  expect_shape_error(px_conv2d(3, 8, 3, 1, 0, true), &mnist, "Conv2d", "(4, 1, 28, 28)", "1 channels, expected 3");
  expect_shape_error(px_conv2d(1, 8, 3, 1, 0, false), &flat, "Conv2d", "(4, 784)", "4-D");
  expect_shape_error(px_conv2d(3, 8, 3, 1, 0, true), &tiny, "Conv2d", "(4, 3, 2, 2)", "smaller than the kernel");
  // ... but padding can make a small input big enough: (2 + 2 - 3)/1 + 1 = 2.
  {
    px_model *md;
    CHECK_OK(px_model_create(&md, px_conv2d(3, 2, 3, 1, 1, true), 1));
    px_tensor y;
    CHECK_OK(px_model_forward(md, &tiny, &y));
    CHECK(y.ndim == 4 && y.shape[2] == 2 && y.shape[3] == 2, "padded conv of 2x2 gives 2x2");
    px_model_free(md);
  }

  // Pools: wrong rank, window larger than the input.
  expect_shape_error(px_maxpool2d(2, 2), &flat, "MaxPool2d", "(4, 784)", "4-D");
  expect_shape_error(px_maxpool2d(3, 1), &tiny, "MaxPool2d", "(4, 3, 2, 2)", "3x3 window");
  expect_shape_error(px_avgpool2d(2, 0), &vec, "AvgPool2d", "(5,)", NULL);
  expect_shape_error(px_avgpool2d(3, 0), &tiny, "AvgPool2d", "(4, 3, 2, 2)", "3x3 window");

  // BatchNorm: wrong channels in 2-D and 4-D, rank 1, one value per channel in training.
  expect_shape_error(px_batchnorm(16, 1e-5f, 0.1f), &mnist, "BatchNorm", "(4, 1, 28, 28)", "\"0.weight\"");
  expect_shape_error(px_batchnorm(16, 1e-5f, 0.1f), &flat, "BatchNorm", "(4, 784)", "expected 16");
  expect_shape_error(px_batchnorm(5, 1e-5f, 0.1f), &vec, "BatchNorm", "(5,)", NULL);
  {
    px_tensor one = px_tensor_f32(buf, 2, 1, 3, 0, 0);
    expect_shape_error(px_batchnorm(3, 1e-5f, 0.1f), &one, "BatchNorm", "(1, 3)", "more than 1");
  }

  // LayerNorm: wrong last dimension.
  expect_shape_error(px_layernorm(64, 1e-5f), &flat, "LayerNorm", "(4, 784)", "\"0.weight\"");
  expect_shape_error(px_layernorm(64, 1e-5f), &mnist, "LayerNorm", "(4, 1, 28, 28)", "64");

  // Softmax needs a dimension; Flatten needs a batch dimension and one more.
  expect_shape_error(px_softmax(), &scalar, "Softmax", "()", NULL);
  expect_shape_error(px_flatten(), &vec, "Flatten", "(5,)", NULL);

  // Constructors.
  expect_invalid(px_conv2d(0, 8, 3, 1, 0, true), "Conv2d in_channels 0");
  expect_invalid(px_conv2d(3, -1, 3, 1, 0, true), "Conv2d out_channels -1");
  expect_invalid(px_conv2d(3, 8, 0, 1, 0, true), "Conv2d kernel 0");
  expect_invalid(px_conv2d(3, 8, 3, 0, 0, true), "Conv2d stride 0");
  expect_invalid(px_conv2d(3, 8, 3, 1, -1, true), "Conv2d padding -1");
  expect_invalid(px_maxpool2d(0, 2), "MaxPool2d kernel 0");
  expect_invalid(px_avgpool2d(-2, 2), "AvgPool2d kernel -2");
  expect_invalid(px_batchnorm(0, 1e-5f, 0.1f), "BatchNorm channels 0");
  expect_invalid(px_batchnorm(4, -1.0f, 0.1f), "BatchNorm eps -1");
  expect_invalid(px_batchnorm(4, 1e-5f, 1.5f), "BatchNorm momentum 1.5");
  expect_invalid(px_layernorm(0, 1e-5f), "LayerNorm dim 0");
  expect_invalid(px_dropout(1.0f), "Dropout p=1");
  expect_invalid(px_dropout(-0.1f), "Dropout p=-0.1");
  expect_invalid(px_dropout(NAN), "Dropout p=NaN");
  CHECK(strstr(px_last_error(), "Dropout") != NULL, "dropout message names the layer: %s", px_last_error());
  return px_test_finish("test_layers_reject_bad_shapes");
}
