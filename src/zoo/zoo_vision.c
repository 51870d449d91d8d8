// The image models of the zoo (zoo.h): an MLP, a small CNN, and ResNets
// with torchvision's structure, parameter names and initialisation.
//
//   mlp      Flatten, [Linear - ReLU] × depth, Linear           "0.weight", "2.weight", ...
//   cnn      [Conv 3×3 - BN - ReLU - MaxPool 2] × 2, Flatten,
//            Linear - ReLU - Dropout - Linear                   "0.weight", "1.running_mean", ...
//   resnet   stem, stages of BasicBlocks, global average pool, fc   "conv1.weight", "layer1.0.bn1.bias",
//                                                                    "layer2.0.downsample.0.weight", "fc.bias"
//
// A BasicBlock is y = relu(inner(x) + shortcut(x)), inner = conv1 3×3/s -
// bn1 - relu - conv2 3×3 - bn2, shortcut the identity, or "downsample" =
// conv 1×1/s - bn where the stride or the width changes (torchvision's
// _make_layer rule).  In the module tree a block is a chain of a residual
// (transparent in names) and a ReLU; the residual's inner chain is
// transparent too, so its children's names are the block's.
//
// Initialisation as torchvision's ResNet.__init__: convolutions
// kaiming_normal_(mode="fan_out", nonlinearity="relu"), i.e. N(0, 2/fan_out)
// with fan_out = out_channels·k·k; batchnorm weight 1, bias 0; fc PyTorch's
// Linear default U(±1/√in).  The MLP and the CNN keep PyTorch's defaults
// for every layer (those of px_linear and px_conv2d).
#include <plexus/zoo.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#define BN_EPS 1e-5f
#define BN_MOMENTUM 0.1f
#define CNN_HIDDEN 128
#define CNN_DROPOUT 0.25f

// Adds `child` to `parent` as `name`.  On failure (child NULL because its
// constructor failed, or out of memory) frees the child and clears *ok;
// once *ok is false it only frees, so the first error's message stays.
static void put(px_module *parent, const char *name, px_module *child, bool *ok) {
  if (*ok && child && px_module_add_child(parent, name, child) == PX_OK) return;
  if (child && !child->parent) px_module_free(child);
  *ok = false;
}

// Sequential names "0", "1", ... from *index on (the MLP's Flatten has a
// name of its own, so its first linear is "0" as in nn.Sequential).
static void put_next(px_module *parent, int *index, px_module *child, bool *ok) {
  char name[16];
  snprintf(name, sizeof name, "%d", (*index)++);
  put(parent, name, child, ok);
}

// The container, or NULL (freed) when anything failed.
static px_module *finish(px_module *m, bool ok) {
  if (ok) return m;
  px_module_free(m);
  return NULL;
}

px_module *px_zoo_mlp(int in_features, int hidden, int depth, int classes) {
  if (in_features < 1 || classes < 1 || depth < 0 || (depth > 0 && hidden < 1)) {
    px_error(PX_ERR_INVALID,
             "zoo mlp(in_features=%d, hidden=%d, depth=%d, classes=%d): features, classes and "
             "(with depth > 0) hidden must be positive, depth >= 0",
             in_features, hidden, depth, classes);
    return NULL;
  }
  px_module *m = px_chain();
  bool ok = m != NULL;
  int index = 0, width = in_features;
  put(m, "flatten", px_flatten(), &ok);  // (N, ...) -> (N, in_features)
  for (int d = 0; d < depth; d++) {
    put_next(m, &index, px_linear(width, hidden, true), &ok);
    put_next(m, &index, px_relu(), &ok);
    width = hidden;
  }
  put_next(m, &index, px_linear(width, classes, true), &ok);
  return finish(m, ok);
}

px_module *px_zoo_cnn(int in_channels, int height, int width, int channels, int classes) {
  if (in_channels < 1 || channels < 1 || classes < 1 || height < 4 || width < 4 || height % 4 || width % 4) {
    px_error(PX_ERR_INVALID,
             "zoo cnn(in_channels=%d, %dx%d, channels=%d, classes=%d): channels and classes must be "
             "positive and the image's height and width positive multiples of 4 (two 2x2 max-pools)",
             in_channels, height, width, channels, classes);
    return NULL;
  }
  // (N, C, H, W) -> (N, c, H/2, W/2) -> (N, 2c, H/4, W/4) -> (N, 2c·H/4·W/4) -> (N, 128) -> (N, classes)
  // No conv bias: each conv feeds a batchnorm, which subtracts the channel mean.
  const int c2 = 2 * channels, flat = c2 * (height / 4) * (width / 4);
  px_module *m = px_chain();
  bool ok = m != NULL;
  int index = 0;
  put_next(m, &index, px_conv2d(in_channels, channels, 3, 1, 1, false), &ok);
  put_next(m, &index, px_batchnorm(channels, BN_EPS, BN_MOMENTUM), &ok);
  put_next(m, &index, px_relu(), &ok);
  put_next(m, &index, px_maxpool2d(2, 2), &ok);
  put_next(m, &index, px_conv2d(channels, c2, 3, 1, 1, false), &ok);
  put_next(m, &index, px_batchnorm(c2, BN_EPS, BN_MOMENTUM), &ok);
  put_next(m, &index, px_relu(), &ok);
  put_next(m, &index, px_maxpool2d(2, 2), &ok);
  put_next(m, &index, px_flatten(), &ok);
  put_next(m, &index, px_linear(flat, CNN_HIDDEN, true), &ok);
  put_next(m, &index, px_relu(), &ok);
  put_next(m, &index, px_dropout(CNN_DROPOUT), &ok);
  put_next(m, &index, px_linear(CNN_HIDDEN, classes, true), &ok);
  return finish(m, ok);
}

// ---- ResNets -------------------------------------------------------------

// Conv without bias, weight ~ N(0, 2/fan_out), fan_out = out·k·k.
static px_module *conv_kaiming(int in_c, int out_c, int k, int stride, int padding) {
  px_module *c = px_conv2d(in_c, out_c, k, stride, padding, false);
  if (c) {
    c->params[0].init = PX_INIT_NORMAL;
    c->params[0].init_a = sqrtf(2.0f / (float)(out_c * k * k));
  }
  return c;
}

// relu(inner(x) + shortcut(x)), torchvision's BasicBlock(in_c, out_c, stride).
static px_module *basic_block(int in_c, int out_c, int stride) {
  px_module *inner = px_chain();
  bool ok = inner != NULL;
  put(inner, "conv1", conv_kaiming(in_c, out_c, 3, stride, 1), &ok);
  put(inner, "bn1", px_batchnorm(out_c, BN_EPS, BN_MOMENTUM), &ok);
  put(inner, "relu", px_relu(), &ok);
  put(inner, "conv2", conv_kaiming(out_c, out_c, 3, 1, 1), &ok);
  put(inner, "bn2", px_batchnorm(out_c, BN_EPS, BN_MOMENTUM), &ok);
  inner = finish(inner, ok);
  px_module *res;
  if (stride != 1 || in_c != out_c) {
    px_module *down = px_chain_of(2, conv_kaiming(in_c, out_c, 1, stride, 0), px_batchnorm(out_c, BN_EPS, BN_MOMENTUM));
    res = px_residual_shortcut(inner, down, "downsample");
  } else {
    res = px_residual_shortcut(inner, NULL, NULL);
  }
  px_module *block = px_chain();
  ok = block != NULL;
  put(block, "", res, &ok);
  put(block, "relu", px_relu(), &ok);
  return finish(block, ok);
}

// torchvision's _make_layer: `blocks` BasicBlocks named "0", "1", ...; the
// first changes the width and applies the stride.
static px_module *stage(int in_c, int out_c, int blocks, int stride) {
  px_module *m = px_chain();
  bool ok = m != NULL;
  int index = 0;
  for (int b = 0; b < blocks; b++) put_next(m, &index, basic_block(b ? out_c : in_c, out_c, b ? 1 : stride), &ok);
  return finish(m, ok);
}

px_module *px_zoo_resnet_small(int in_channels, int classes, int blocks, int width) {
  if (in_channels < 1 || classes < 1 || blocks < 1 || width < 1 || width > (1 << 20)) {
    px_error(PX_ERR_INVALID,
             "zoo resnet_small(in_channels=%d, classes=%d, blocks=%d, width=%d): all must be "
             "positive",
             in_channels, classes, blocks, width);
    return NULL;
  }
  // (N, C, H, W) -> (N, w, H, W) -> (N, 2w, H/2, W/2) -> (N, 4w, H/4, W/4) -> (N, 4w) -> (N, classes)
  px_module *m = px_chain();
  bool ok = m != NULL;
  put(m, "conv1", conv_kaiming(in_channels, width, 3, 1, 1), &ok);
  put(m, "bn1", px_batchnorm(width, BN_EPS, BN_MOMENTUM), &ok);
  put(m, "relu", px_relu(), &ok);
  put(m, "layer1", stage(width, width, blocks, 1), &ok);
  put(m, "layer2", stage(width, 2 * width, blocks, 2), &ok);
  put(m, "layer3", stage(2 * width, 4 * width, blocks, 2), &ok);
  put(m, "avgpool", px_global_avgpool2d(), &ok);
  put(m, "fc", px_linear(4 * width, classes, true), &ok);
  return finish(m, ok);
}

px_module *px_zoo_resnet18(int in_channels, int classes) {
  if (in_channels < 1 || classes < 1) {
    px_error(PX_ERR_INVALID, "zoo resnet18(in_channels=%d, classes=%d): both must be positive", in_channels, classes);
    return NULL;
  }
  // (N, C, 224, 224) -> conv1 (N, 64, 112, 112) -> maxpool (N, 64, 56, 56) -> layer1 (N, 64, 56, 56)
  // -> layer2 (N, 128, 28, 28) -> layer3 (N, 256, 14, 14) -> layer4 (N, 512, 7, 7) -> (N, 512) -> (N, classes)
  px_module *m = px_chain();
  bool ok = m != NULL;
  put(m, "conv1", conv_kaiming(in_channels, 64, 7, 2, 3), &ok);
  put(m, "bn1", px_batchnorm(64, BN_EPS, BN_MOMENTUM), &ok);
  put(m, "relu", px_relu(), &ok);
  put(m, "maxpool", px_maxpool2d_padded(3, 2, 1), &ok);
  put(m, "layer1", stage(64, 64, 2, 1), &ok);
  put(m, "layer2", stage(64, 128, 2, 2), &ok);
  put(m, "layer3", stage(128, 256, 2, 2), &ok);
  put(m, "layer4", stage(256, 512, 2, 2), &ok);
  put(m, "avgpool", px_global_avgpool2d(), &ok);
  put(m, "fc", px_linear(512, classes, true), &ok);
  return finish(m, ok);
}

/* ---- Activation checkpointing ---------------------------------------------- */

static px_module *child_named(px_module *m, const char *name) {
  for (int i = 0; m && i < m->n_children; i++)
    if (strcmp(m->children[i]->name, name) == 0) return m->children[i];
  return NULL;
}

// inner = [conv1, bn1, relu, conv2, bn2] -> [conv1, pair("" = [bn1, relu], conv2), bn2]:
// the normalised and rectified maps (two activations of conv1's size) are
// recomputed from conv1's output in backward; conv2's GEMM is not redone.
static px_status bn_relu_pair(px_module *inner, const char *where) {
  if (inner->n_children != 5 || strcmp(inner->children[1]->name, "bn1") != 0 ||
      strcmp(inner->children[2]->name, "relu") != 0 || strcmp(inner->children[3]->name, "conv2") != 0)
    return px_error(PX_ERR_INVALID, "resnet recompute: %s is not conv1, bn1, relu, conv2, bn2", where);
  px_module *bn1 = inner->children[1], *relu = inner->children[2], *conv2 = inner->children[3];
  bn1->parent = relu->parent = conv2->parent = NULL;
  inner->children[1] = inner->children[4];
  inner->n_children = 2;  // [conv1, bn2] while the pair is built
  px_module *cheap = px_chain();
  bool ok = cheap != NULL;
  if (cheap) cheap->rng_transparent = true;  // a grouping only: bn1, relu, conv2 keep their init streams
  put(cheap, "bn1", bn1, &ok);
  put(cheap, "relu", relu, &ok);
  if (!ok) {
    px_module_free(cheap);
    if (conv2) px_module_free(conv2);
    return PX_ERR_NOMEM;
  }
  px_module *pair = px_checkpoint_pair("", cheap, "conv2", conv2);
  if (!pair) return PX_ERR_INVALID;
  // [conv1, bn2] -> [conv1, pair, bn2]; the chain has room (it held 5).
  inner->children[2] = inner->children[1];
  inner->children[1] = pair;
  inner->n_children = 3;
  pair->parent = inner;
  pair->name[0] = '\0';
  return PX_OK;
}

px_status px_zoo_resnet_recompute(px_module *resnet, px_recompute r) {
  int first = 0, stages = 0;
  char name[16];
  for (int s = 1; s <= 4; s++) {
    snprintf(name, sizeof name, "layer%d", s);
    px_module *stage = child_named(resnet, name);
    if (!stage) continue;
    stages++;
    if (r.kind != PX_RECOMPUTE_SELECTIVE) {
      px_status st = px_checkpoint_blocks(stage, r, first);
      if (st != PX_OK) return st;
      first += stage->n_children;
      continue;
    }
    for (int b = 0; b < stage->n_children; b++) {
      // block = [residual(inner, downsample?), relu]
      px_module *block = stage->children[b];
      char where[48];
      snprintf(where, sizeof where, "%s.%d", name, b);
      if (block->n_children != 2 || block->children[0]->n_children < 1)
        return px_error(PX_ERR_INVALID, "resnet recompute: %s is not a BasicBlock", where);
      px_status st = bn_relu_pair(block->children[0]->children[0], where);
      if (st != PX_OK) return st;
    }
  }
  if (!stages) return px_error(PX_ERR_INVALID, "resnet recompute: no layer1..layer4 (not built by the zoo?)");
  return PX_OK;
}
