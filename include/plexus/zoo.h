/* plexus/zoo.h — the model zoo: the models the plexus command trains, built
 * in a line each (src/zoo/; examples/zoo_cnn.c trains the CNN).
 *
 * Each builder returns a module tree ready for px_model_create, or NULL
 * with px_last_error() set.  Parameter names follow the PyTorch models users
 * already have weights for, so a safetensors file saved from them loads with
 * px_safetensors_load:
 *
 *   mlp       "0.weight", "2.weight", ...       (nn.Sequential order)
 *   cnn       "0.weight", "1.weight", ...       (nn.Sequential order)
 *   resnet    torchvision's names ("conv1.weight", "layer1.0.bn1.running_mean",
 *             "layer2.0.downsample.0.weight", "fc.bias")
 *   gpt       Hugging Face GPT-2's names and layouts ("wte.weight",
 *             "h.0.attn.c_attn.weight" stored (in, out) as GPT-2's Conv1D
 *             stores it, "ln_f.bias"); the output projection is tied to wte.
 *
 * Image models take x: (N, C, H, W) f32 and return logits (N, classes).
 * The GPT takes x: (N, T) i32 token ids (T <= context) and returns logits
 * (N, T, vocab_size). */
#ifndef PLEXUS_ZOO_H
#define PLEXUS_ZOO_H

#include "plexus/base.h"
#include "plexus/nn.h"

#pragma GCC visibility push(default)
#ifdef __cplusplus
extern "C" {
#endif

/* Flatten, then `depth` hidden layers of `hidden` units with ReLU, then a
 * linear layer to `classes`. */
px_module *px_zoo_mlp(int in_features, int hidden, int depth, int classes);

/* Two convolution stages, each conv 3×3 (pad 1) – batchnorm – ReLU –
 * max-pool 2, with `width` and 2·width channels, then linear to 128,
 * ReLU, dropout and linear to `classes`.  H and W divisible by 4. */
px_module *px_zoo_cnn(int in_channels, int height, int width, int channels, int classes);

/* ResNet for small images (28×28, 32×32), He et al. 2016 §4.2: a 3×3
 * stem with `width` channels, three stages of `blocks` basic blocks with
 * width, 2·width, 4·width channels (stride 2 at the start of stages 2 and
 * 3, 1×1 projection shortcuts), global average pooling and fc.
 * blocks = 3, width = 16 is ResNet-20. */
px_module *px_zoo_resnet_small(int in_channels, int classes, int blocks, int width);

/* torchvision's resnet18 for 224×224 inputs: 7×7/2 stem, max-pool 3/2,
 * four stages of two basic blocks (64, 128, 256, 512 channels), global
 * average pooling, fc. */
px_module *px_zoo_resnet18(int in_channels, int classes);

/* GPT-2 style decoder-only transformer. */
typedef struct px_gpt_config {
  int vocab_size; /* V */
  int context;    /* positions in wpe: the longest T */
  int n_layer;
  int n_head;
  int n_embd;    /* C; divisible by n_head */
  float dropout; /* embedding, attention-probability and residual dropout */
} px_gpt_config;

/* The GPT of cfg (names, layouts and initialisation: above). */
px_module *px_zoo_gpt(const px_gpt_config *cfg);

/* Activation checkpointing (nn.h, docs/RECOMPUTE.md) on a tree built by
 * px_zoo_gpt / px_zoo_resnet_small / px_zoo_resnet18, before
 * px_model_create; parameter names do not change.
 *   gpt     full/every:K: each block h.<l> a checkpointed unit; selective:
 *           in every block GELU -> mlp.c_proj a px_checkpoint_pair (the GELU
 *           output is recomputed; attention never stores its probabilities)
 *   resnet  full/every:K: each BasicBlock (layer<s>.<b>), counted across
 *           stages; selective: bn1 -> relu -> conv2 a pair (the two
 *           normalised/rectified maps are recomputed, conv1's output kept) */
px_status px_zoo_gpt_recompute(px_module *gpt, px_recompute r);
px_status px_zoo_resnet_recompute(px_module *resnet, px_recompute r);

/* Fill a model built by px_zoo_gpt from a Hugging Face GPT-2 safetensors
 * file (GPT2Model or GPT2LMHeadModel: keys with or without "transformer.").
 * The causal-mask buffers "h.<l>.attn.bias" / "h.<l>.attn.masked_bias" and
 * the tied "lm_head.weight" are skipped; every other tensor must be a
 * parameter of the model with its shape and F32, and every parameter must
 * be in the file.  All or nothing: on an error (naming the tensor and the
 * file) the model is unchanged. */
px_status px_zoo_gpt_load_hf(px_model *model, const char *path);

#ifdef __cplusplus
}
#endif
#pragma GCC visibility pop

#endif
