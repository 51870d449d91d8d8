/* Claim: the image models of the zoo (apps/plexus/zoo.h) have the parameter
 * counts, names, order and output shapes of the PyTorch models they follow,
 * and start from torchvision's initialisation:
 *   - counts as torch counts them (resnet18: 11,689,512 parameters for 1000
 *     classes, 11,181,642 for 10; ResNet-20 with projection shortcuts:
 *     272,474; the cnn of width 32: 421,738; numbers from
 *     sum(p.numel() for p in model.parameters()) in torch 1.13);
 *   - the state dict in torchvision's order ("conv1.weight", "bn1.weight",
 *     "bn1.bias", "bn1.running_mean", ...) with torchvision's names;
 *   - every ResNet conv weight ~ N(0, 2/fan_out) (kaiming normal, fan_out,
 *     as torchvision), batchnorm weight 1, bias 0, running mean 0, var 1; the
 *     fc and the cnn/mlp layers U(±1/√fan_in) (PyTorch's defaults);
 *   - logits (N, classes) for the input sizes zoo.h names (and ResNet-18 on
 *     inputs down to 32×32, where layer4 is 1×1);
 *   - nonsensical arguments refused with NULL and a message naming the model.
 * If this fails, a torchvision checkpoint does not load (or loads into the
 * wrong places), or training starts from another distribution than the
 * PyTorch run a user compares with (a fan_in/fan_out swap makes ResNet-18's
 * stem 4.6x too wide), or the CLI builds a model that cannot take its
 * data. */
#include "px_test.h"
#include <plexus/zoo.h>

#include <math.h>
#include <string.h>

static px_model *create(px_module *root) {
  px_model *md = NULL;
  CHECK_OK(px_model_create(&md, root, 11));
  return md;
}

static void check_forward(px_model *md, int64_t n, int64_t c, int64_t h, int64_t w, int64_t classes, const char *what) {
  if (!md) return;
  px_tensor x;
  int64_t shape[4] = {n, c, h, w};
  CHECK_OK(px_tensor_new(&x, PX_F32, 4, shape));
  for (int64_t i = 0; i < px_tensor_numel(&x); i++) px_f32(&x)[i] = (float)((i * 7919) % 97) / 97.0f - 0.5f;
  px_tensor y;
  px_model_train(md, true);
  CHECK_OK(px_model_forward(md, &x, &y));
  CHECK(y.ndim == 2 && y.shape[0] == n && y.shape[1] == classes, "%s: logits (%lld, %lld)", what, (long long)n,
        (long long)classes);
  bool finite = true;
  for (int64_t i = 0; i < px_tensor_numel(&y); i++) finite &= isfinite(px_f32(&y)[i]) != 0;
  CHECK(finite, "%s: finite logits", what);
  px_tensor_free(&x);
}

// Sample standard deviation of a parameter (mean assumed 0).
static double rms(const px_param *p) {
  double s = 0;
  for (size_t i = 0; i < p->numel; i++) s += (double)p->data[i] * p->data[i];
  return sqrt(s / (double)p->numel);
}

// Every conv weight N(0, 2/fan_out), every batchnorm (1, 0, 0, 1), the fc U(±1/√in).
static void check_resnet_init(const px_model *md, const char *what) {
  int convs = 0;
  for (int i = 0; i < md->n_modules; i++) {
    const px_module *m = md->modules[i];
    const char *type = m->ops->type;
    if (strcmp(type, "Conv2d") == 0) {
      const px_param *w = &m->params[0];
      double want = sqrt(2.0 / (double)(w->shape[0] * w->shape[2] * w->shape[3]));
      // The rms of n normal draws is within 4/√(2n) relative of σ (4 standard errors).
      double tol = 4.0 / sqrt(2.0 * (double)w->numel);
      CHECK(fabs(rms(w) / want - 1.0) < tol, "%s: %s has std %.5f, kaiming fan_out wants %.5f", what, w->name, rms(w),
            want);
      CHECK(m->n_params == 1, "%s: %s: ResNet convs have no bias", what, w->name);
      convs++;
    } else if (strcmp(type, "BatchNorm") == 0) {
      const float want[4] = {1, 0, 0, 1};
      for (int k = 0; k < 4; k++) {
        bool ok = true;
        for (size_t e = 0; e < m->params[k].numel; e++) ok &= m->params[k].data[e] == want[k];
        CHECK(ok, "%s: %s starts at %g", what, m->params[k].name, (double)want[k]);
      }
    } else if (strcmp(type, "Linear") == 0) {
      const px_param *w = &m->params[0];
      double bound = 1.0 / sqrt((double)w->shape[1]), mx = 0;
      for (size_t e = 0; e < w->numel; e++) mx = fmax(mx, fabs(w->data[e]));
      CHECK(mx <= bound && mx > 0.9 * bound, "%s: %s: max |w| %.5f, U(±%.5f) expected", what, w->name, mx, bound);
    }
  }
  CHECK(convs > 0, "%s: has convolutions", what);
}

static void check_resnet18(void) {
  px_model *md = create(px_zoo_resnet18(3, 1000));
  if (!md) return;
  CHECK(md->n_param_elems == 11689512, "resnet18(1000): %zu parameters, torchvision has 11689512", md->n_param_elems);
  CHECK(md->n_buffer_elems == 9600, "resnet18: %zu buffer elements, torchvision 9600", md->n_buffer_elems);
  // torchvision's state_dict order, less the num_batches_tracked counters.
  const char *first[] = {"conv1.weight",
                         "bn1.weight",
                         "bn1.bias",
                         "bn1.running_mean",
                         "bn1.running_var",
                         "layer1.0.conv1.weight",
                         "layer1.0.bn1.weight",
                         "layer1.0.bn1.bias",
                         "layer1.0.bn1.running_mean",
                         "layer1.0.bn1.running_var",
                         "layer1.0.conv2.weight"};
  const char *last[] = {"layer4.1.bn2.running_var", "fc.weight", "fc.bias"};
  px_state_dict sd;
  CHECK_OK(px_model_state_dict(md, &sd));
  CHECK(sd.count == 122 - 20, "resnet18: %d state dict tensors, torchvision 122 less 20 num_batches_tracked", sd.count);
  for (int i = 0; i < 11 && i < sd.count; i++)
    CHECK(strcmp(sd.items[i].name, first[i]) == 0, "resnet18 state dict [%d] is %s, want %s", i, sd.items[i].name,
          first[i]);
  for (int i = 0; i < 3 && sd.count >= 3; i++)
    CHECK(strcmp(sd.items[sd.count - 3 + i].name, last[i]) == 0, "resnet18 state dict [-%d] is %s, want %s", 3 - i,
          sd.items[sd.count - 3 + i].name, last[i]);
  px_state_dict_free(&sd);
  const char *named[] = {"layer2.0.downsample.0.weight", "layer2.0.downsample.1.bias",
                         "layer3.0.downsample.1.running_mean", "layer4.0.downsample.0.weight", "layer4.1.conv2.weight"};
  for (int i = 0; i < 5; i++) CHECK(px_model_find(md, named[i]) != NULL, "resnet18 has %s", named[i]);
  CHECK(px_model_find(md, "layer1.0.downsample.0.weight") == NULL, "layer1.0 keeps the identity shortcut");
  CHECK(px_model_find(md, "layer2.1.downsample.0.weight") == NULL, "layer2.1 keeps the identity shortcut");
  const px_param *w = px_model_find(md, "layer4.0.downsample.0.weight");
  CHECK(w && w->ndim == 4 && w->shape[0] == 512 && w->shape[1] == 256 && w->shape[2] == 1,
        "1x1 projection (512, 256, 1, 1)");
  check_resnet_init(md, "resnet18");
  px_model_free(md);

  md = create(px_zoo_resnet18(3, 10));
  if (!md) return;
  CHECK(md->n_param_elems == 11181642, "resnet18(10): %zu parameters, torchvision has 11181642", md->n_param_elems);
  check_forward(md, 1, 3, 224, 224, 10, "resnet18 224x224");
  check_forward(md, 2, 3, 32, 32, 10, "resnet18 32x32 (layer4 1x1)");
  px_model_free(md);
  md = create(px_zoo_resnet18(1, 7));
  check_forward(md, 2, 1, 64, 48, 7, "resnet18 grayscale 64x48");
  px_model_free(md);
}

static void check_resnet_small(void) {
  px_model *md = create(px_zoo_resnet_small(3, 10, 3, 16));
  if (!md) return;
  CHECK(md->n_param_elems == 272474, "ResNet-20: %zu parameters, torch 272474", md->n_param_elems);
  CHECK(md->n_buffer_elems == 1568, "ResNet-20: %zu buffer elements, torch 1568", md->n_buffer_elems);
  const char *named[] = {"conv1.weight",
                         "layer1.2.bn2.bias",
                         "layer2.0.downsample.0.weight",
                         "layer3.0.downsample.1.running_var",
                         "layer3.2.conv2.weight",
                         "fc.weight"};
  for (int i = 0; i < 6; i++) CHECK(px_model_find(md, named[i]) != NULL, "ResNet-20 has %s", named[i]);
  CHECK(px_model_find(md, "layer1.0.downsample.0.weight") == NULL, "layer1.0: identity shortcut");
  const px_param *fc = px_model_find(md, "fc.weight");
  CHECK(fc && fc->shape[0] == 10 && fc->shape[1] == 64, "fc (10, 4·16)");
  check_resnet_init(md, "ResNet-20");
  check_forward(md, 3, 3, 32, 32, 10, "ResNet-20 32x32");
  px_model_free(md);
  md = create(px_zoo_resnet_small(1, 10, 1, 8));
  check_forward(md, 2, 1, 28, 28, 10, "resnet_small 28x28");
  px_model_free(md);
}

static void check_cnn_mlp(void) {
  px_model *md = create(px_zoo_cnn(1, 28, 28, 32, 10));
  if (!md) return;
  CHECK(md->n_param_elems == 421738, "cnn(32): %zu parameters, torch 421738", md->n_param_elems);
  const char *named[] = {"0.weight", "1.weight", "1.running_var", "4.weight", "5.bias",
                         "9.weight", "9.bias",   "12.weight",     "12.bias"};
  for (int i = 0; i < 9; i++) CHECK(px_model_find(md, named[i]) != NULL, "cnn has %s", named[i]);
  CHECK(px_model_find(md, "0.bias") == NULL, "cnn convs have no bias (a batchnorm follows)");
  const px_param *w0 = px_model_find(md, "0.weight"), *w9 = px_model_find(md, "9.weight");
  if (w0 && w9) {
    double mx = 0;
    for (size_t e = 0; e < w0->numel; e++) mx = fmax(mx, fabs(w0->data[e]));
    CHECK(mx <= 1.0 / 3.0 && mx > 0.9 / 3.0, "cnn 0.weight U(±1/√9): max %.4f", mx);
    CHECK(w9->shape[0] == 128 && w9->shape[1] == 64 * 7 * 7, "cnn 9.weight (128, 64·7·7)");
  }
  check_forward(md, 4, 1, 28, 28, 10, "cnn 28x28");
  px_model_free(md);
  md = create(px_zoo_cnn(3, 32, 32, 16, 100));
  check_forward(md, 2, 3, 32, 32, 100, "cnn 3x32x32");
  px_model_free(md);

  md = create(px_zoo_mlp(784, 256, 2, 10));
  if (!md) return;
  CHECK(md->n_param_elems == 269322, "mlp: %zu parameters, torch 269322", md->n_param_elems);
  const char *mlp_named[] = {"0.weight", "0.bias", "2.weight", "4.weight", "4.bias"};
  for (int i = 0; i < 5; i++) CHECK(px_model_find(md, mlp_named[i]) != NULL, "mlp has %s", mlp_named[i]);
  CHECK(md->n_params == 6, "mlp: 3 linears, %d parameters", md->n_params);
  check_forward(md, 5, 1, 28, 28, 10, "mlp on 1x28x28");
  px_model_free(md);
  md = create(px_zoo_mlp(12, 0, 0, 3));
  CHECK(md && md->n_params == 2 && px_model_find(md, "0.weight"), "mlp of depth 0: one linear \"0\"");
  check_forward(md, 2, 3, 2, 2, 3, "mlp depth 0");
  px_model_free(md);
}

static void expect_refused(px_module *m, const char *model, const char *what) {
  CHECK(m == NULL, "%s accepted", what);
  px_module_free(m);
  CHECK(strstr(px_last_error(), model) != NULL, "%s: message names %s: %s", what, model, px_last_error());
}

static void check_refusals(void) {
  expect_refused(px_zoo_mlp(0, 10, 1, 10), "mlp", "mlp with 0 inputs");
  expect_refused(px_zoo_mlp(10, 0, 1, 10), "mlp", "mlp with 0 hidden units at depth 1");
  expect_refused(px_zoo_mlp(10, 10, -1, 10), "mlp", "mlp of depth -1");
  expect_refused(px_zoo_cnn(1, 30, 28, 8, 10), "cnn", "cnn on 30x28 (not a multiple of 4)");
  expect_refused(px_zoo_cnn(1, 28, 28, 0, 10), "cnn", "cnn of 0 channels");
  expect_refused(px_zoo_cnn(1, 28, 28, 8, 0), "cnn", "cnn of 0 classes");
  expect_refused(px_zoo_resnet_small(3, 10, 0, 16), "resnet_small", "resnet_small of 0 blocks");
  expect_refused(px_zoo_resnet_small(3, 10, 3, 0), "resnet_small", "resnet_small of width 0");
  expect_refused(px_zoo_resnet18(0, 10), "resnet18", "resnet18 of 0 channels");
  expect_refused(px_zoo_resnet18(3, -1), "resnet18", "resnet18 of -1 classes");
  // A wrong input is a shape error naming the layer, not a crash.
  px_model *md = create(px_zoo_resnet18(3, 10));
  if (!md) return;
  static float buf[2 * 1 * 32 * 32];
  px_tensor x = px_tensor_f32(buf, 4, 2, 1, 32, 32), y;
  px_status st = px_model_forward(md, &x, &y);
  CHECK(st == PX_ERR_SHAPE && strstr(px_last_error(), "conv1.weight"), "1-channel input to resnet18(3): %s",
        px_last_error());
  px_model_free(md);
}

int main(void) {
  check_resnet18();
  check_resnet_small();
  check_cnn_mlp();
  check_refusals();
  return px_test_finish("test_zoo_models_names_shapes_and_init");
}
