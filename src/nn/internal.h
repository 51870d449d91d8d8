// Internal contracts between nn/ layers (not part of the public API).
#ifndef PX_NN_INTERNAL_H
#define PX_NN_INTERNAL_H

#include "plexus/nn.h"

// True when m is a px_embedding.
bool px_is_embedding(const px_module *m);
// True when the embedding m has run forward and its backward has not run
// since: its grads_ready (which DDP takes as "wte.weight is complete") is
// still to come.  The tied head relies on this (tied_head.c).
bool px_embedding_pending(const px_module *m);

// Causal self-attention over given children (tensor parallel: attention.c):
// c_attn maps (N, T, in_dim) to (N, T, 3·dim) packed [q | k | v] of n_head
// heads of width dim/n_head, which are heads [head0, head0 + n_head) of
// heads_total (the dropout masks are those of the global heads); c_proj maps
// (N, T, dim) back to (N, T, in_dim).  Takes the children (freed on failure).
px_module *px_attention_with(int in_dim, int dim, int n_head, int head0, int heads_total, float attn_dropout,
                             px_module *c_attn, px_module *c_proj, px_module *resid_dropout);

// BatchNorm followed by ReLU in a Chain, fused (chain.c): the chain asks the
// BatchNorm for the ReLU before its forward (that forward only); the plain
// CPU path applies it (batchnorm.c) and says so, and the chain then tells
// the ReLU that its input is already max(·, 0): it passes it through, and
// its backward passes dy through (the BatchNorm's backward masks it).
// The other paths (CUDA, synchronized statistics) leave the ReLU to its
// module.
bool px_is_batchnorm(const px_module *m);
bool px_is_relu(const px_module *m);
void px_batchnorm_fuse_relu_next(px_module *bn);
bool px_batchnorm_relu_applied(const px_module *bn);
void px_relu_input_is_relu(px_module *relu);

// Residual followed by ReLU in a Chain, fused the same way (chain.c): the
// Residual applies the ReLU in its add on the CPU and says so; the ReLU
// then takes its input as its output and keeps it for its backward, whose
// mask [x > 0] of that output is the mask of the sum ([max(v, 0) > 0] =
// [v > 0]), so its backward is unchanged.
bool px_is_residual(const px_module *m);
void px_residual_fuse_relu_next(px_module *residual);
bool px_residual_relu_applied(const px_module *residual);
void px_relu_input_is_relu_kept(px_module *relu);

// Linear and Tanh neighbours in a Chain, fused into the Linear's GEMM where
// plexus's packed GEMM runs (linear.c, px_sgemm_epi), with the bits of the
// separate modules.  Linear then Tanh: the chain asks the Linear to apply
// the Tanh in its forward (that forward only); if it did, the Tanh takes
// its input as its output and keeps it for its backward.  Tanh then Linear:
// the chain asks the Linear's backward to multiply dx by 1 - x² (x, the
// Linear's input, is the Tanh's output); if it did, the Tanh's next
// backward passes dy through.
bool px_is_linear(const px_module *m);
bool px_is_tanh(const px_module *m);
void px_linear_fuse_tanh_next(px_module *linear);
bool px_linear_tanh_applied(const px_module *linear);
void px_linear_fuse_dtanh_prev(px_module *linear);
bool px_linear_dtanh_applied(const px_module *linear);
void px_tanh_input_is_tanh(px_module *tanh);
void px_tanh_dy_is_dx(px_module *tanh);

#endif
