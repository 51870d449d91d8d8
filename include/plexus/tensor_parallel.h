/* plexus/tensor_parallel.h — the device mesh and tensor parallelism
 * (Megatron-LM's intra-layer model parallelism).
 *
 * Mesh (DESIGN decision 10).  The world's ranks form a dp × tp × pp grid,
 * tensor-parallel ranks innermost (neighbours: on one node), pipeline
 * outermost:
 *     rank = (pp_rank · dp + dp_rank) · tp + tp_rank
 * One communicator per dimension, from px_comm_split: tp_comm holds the tp
 * ranks that share (dp_rank, pp_rank), dp_comm those that share (tp_rank,
 * pp_rank), pp_comm those that share (dp_rank, tp_rank).
 *
 * Layers.  A tensor-parallel group of size P splits one weight matrix:
 *   column-parallel   W = [W_0 | … | W_{P-1}] along the OUTPUT features:
 *                     rank r computes y_r = x · W_r (its out/P features);
 *                     x must be the same on every rank ("copy to the tp
 *                     region": identity forward, all-reduce of dx backward).
 *   row-parallel      W split along the INPUT features; x arrives split
 *                     (x_r, the column-parallel layer's output): y =
 *                     Σ_r x_r · W_r ("reduce from the tp region": all-reduce
 *                     forward, identity backward), then the bias, once.
 * A column-parallel layer followed by a row-parallel one (the MLP; q, k, v
 * then the attention projection) communicates once forward and once
 * backward.  Both take nn.Linear's layout (W: (out, in)) or GPT-2's Conv1D
 * layout (W: (in, out)).
 *
 * Boxes (DESIGN decision 8).  A tensor-parallel parameter keeps the global
 * name ("h.0.attn.c_attn.weight") and holds a box of the global tensor: one
 * to three slices along its split dimension (c_attn's q, k and v thirds
 * each give this rank its heads' columns).  px_tp_param_box says which, so
 * a checkpoint can store boxes and a full model's tensors can be sliced in.
 *
 * Errors are px_status values with px_last_error() messages, as everywhere. */
#ifndef PLEXUS_TENSOR_PARALLEL_H
#define PLEXUS_TENSOR_PARALLEL_H

#include "plexus/comm.h"
#include "plexus/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Exported from libplexus.so, which hides everything else (-fvisibility=hidden). */
#pragma GCC visibility push(default)

/* ---- The tensor-parallel group --------------------------------------------
 * The communicator the layers use, and counts of what they sent: forward and
 * backward collectives are counted apart, so a test can say "one all-reduce
 * per block forward, one backward". */
typedef struct px_tp_counts {
  uint64_t fwd_allreduce, bwd_allreduce;
  uint64_t fwd_allgather, bwd_allgather;
  uint64_t fwd_reduce_scatter, bwd_reduce_scatter;
  uint64_t elems; /* elements moved by all of them */
  double seconds; /* wall time inside them (waiting for slower ranks included) */
} px_tp_counts;

typedef struct px_tp_group {
  px_comm *comm; /* not owned; NULL = a group of one */
  int rank, size;
  px_tp_counts counts;
} px_tp_group;

/* A group over `comm` (NULL: tp = 1), counts zero.  Layers keep a pointer
 * to the group: it (and a mesh holding it) must outlive the model. */
px_tp_group px_tp_group_of(px_comm *comm);

/* ---- The mesh ---------------------------------------------------------------- */
typedef struct px_mesh {
  int world, rank;
  int dp, tp, pp;                       /* sizes; dp · tp · pp = world */
  int dp_rank, tp_rank, pp_rank;        /* this rank's coordinates */
  px_comm *world_comm;                  /* not owned */
  px_comm *dp_comm, *tp_comm, *pp_comm; /* owned */
  px_tp_group tp_group;                 /* over tp_comm */
} px_mesh;

/* Collective over `world`.  dp <= 0 asks for dp = world / (tp · pp).  Sizes
 * whose product is not the world's size are PX_ERR_INVALID with a message
 * naming all four numbers; every rank fails alike (nothing is split). */
px_status px_mesh_create(px_mesh **out, px_comm *world, int dp, int tp, int pp);
void px_mesh_free(px_mesh *m);
/* "mesh dp 2 × tp 2 × pp 1 (world 4); rank 3 = (dp 1, tp 1, pp 0)" */
const char *px_mesh_describe(const px_mesh *m, char *buf, size_t len);

/* ---- Boxes ----------------------------------------------------------------- */
#define PX_TP_MAX_PARTS 3
typedef struct px_tp_box {
  int split_dim; /* -1: replicated (the whole tensor) */
  int n_parts;   /* slices along split_dim */
  int64_t global_shape[2];
  int64_t global_offset[PX_TP_MAX_PARTS]; /* along split_dim, in the global tensor */
  int64_t local_offset[PX_TP_MAX_PARTS];  /* along split_dim, in this rank's tensor */
  int64_t size[PX_TP_MAX_PARTS];
} px_tp_box;

/* The box of a parameter of a tensor-parallel module (split_dim >= 0), or
 * of any other parameter (split_dim = -1: every tp rank holds it whole). */
px_tp_box px_tp_param_box(const px_param *p);
/* Copy this rank's box of `global` (the whole tensor, row-major) into
 * `local` (p's numel floats).  Works for a replicated p too. */
void px_tp_box_take(const px_param *p, const float *global, float *local);
/* Fill every parameter of `model` with its box of the tensor of the same
 * name in `global` (a full model's state dict): how a single-process model
 * (or, later, a checkpoint) moves into tensor-parallel form.  Names or
 * global shapes that do not match are errors naming the parameter. */
px_status px_tp_load_state_dict(px_model *model, const px_state_dict *global);

/* ---- Layers ------------------------------------------------------------------ */
typedef enum px_tp_layout {
  PX_TP_LINEAR = 0, /* nn.Linear: weight (out, in) */
  PX_TP_CONV1D      /* GPT-2's Conv1D: weight (in, out) */
} px_tp_layout;

/* Column-parallel: weight (out/P, in) or (in, out/P), bias (out/P,).  With
 * parts > 1 the global out features are `parts` equal blocks (c_attn's q, k,
 * v: parts = 3) and each block is split over the P ranks, so rank r holds
 * block b's columns [b·out/parts + r·w, … + w), w = out/(parts·P).
 * gather_output: all-gather y into (…, out) (forward), take this rank's
 * columns of dy (backward, no communication); only with parts = 1.
 * out must be a multiple of parts · P.  Initialisation: the values the
 * single-process layer of the same place in the model gets (the global
 * tensor is drawn from the module's stream and this rank keeps its box). */
px_module *px_tp_column_parallel(px_tp_group *g, px_tp_layout layout, int in_features, int out_features, bool bias,
                                 int parts, bool gather_output);
/* Row-parallel: weight (out, in/P) or (in/P, out), bias (out,) replicated
 * and added after the all-reduce.  The input is already split (…, in/P)
 * (a column-parallel layer's output). */
px_module *px_tp_row_parallel(px_tp_group *g, px_tp_layout layout, int in_features, int out_features, bool bias);

/* ---- Sequence parallelism (Megatron-LM, Korthikanti et al. 2022) ----------
 * Between the tensor-parallel regions, activations (N, T, C) are split along
 * the sequence: rank r holds positions [r·T/P, (r+1)·T/P), so layer norms,
 * dropout and residual adds run on T/P positions.  The all-reduce around a
 * column → row pair becomes an all-gather before it and a reduce-scatter
 * after it (the same bytes, in two halves):
 *   px_tp_sequence_gather   (N, T/P, C) -> (N, T, C): all-gather forward,
 *                           reduce-scatter of dy backward
 *   px_tp_sequence_scatter  (N, T, C) partial sums -> (N, T/P, C): reduce-
 *                           scatter forward, all-gather of dy backward
 * With sequence_parallel set, a column-parallel layer leaves its dx partial
 * (the gather's backward sums it) and a row-parallel layer leaves y partial
 * (the scatter sums it), adding its bias on tp rank 0 only so the sum holds
 * it once.  T must be a multiple of P.  (px_tp_gpt uses the form below.) */
px_module *px_tp_sequence_gather(px_tp_group *g);
px_module *px_tp_sequence_scatter(px_tp_group *g);
void px_tp_set_sequence_parallel(px_module *tp_linear, bool on);
/* The same with the collectives inside the layers, so the module tree is
 * the single process's (dropout masks and init streams are keyed by the
 * pre-order uid: an inserted gather/scatter module would shift them).  A
 * column-parallel layer takes (N, T/P, in), all-gathers it to (N, T, in)
 * and reduce-scatters dx back; a row-parallel one reduce-scatters its
 * partial (N, T, out) to (N, T/P, out), adds its bias on every rank, and
 * all-gathers dy backward.  Not for a gathered output.  On a
 * px_tp_vocab_embedding: reduce-scatter of its output along T instead of
 * the all-reduce (ids (N, T)); on a px_tp_vocab_tied_head: all-gather of
 * its input (N, T/P, C). */
void px_tp_set_sequence_split(px_module *tp_linear, bool on);

/* The vocabulary split: rank r holds rows [first, first + count) of a
 * (vocab, dim) table, first = r·vocab/P (integer division), so a vocabulary
 * not divisible by P is split unevenly (sizes differ by at most one); no
 * padding rows exist, so no logit has to be masked. */
void px_tp_vocab_range(int vocab, int tp_rank, int tp_size, int *first, int *count);

/* Vocabulary-parallel nn.Embedding: weight (count, dim), rows of the global
 * (vocab, dim) table.  y = Σ_r (rows of ids this rank holds, else 0): one
 * all-reduce forward, none backward.  Ids outside [0, vocab) are errors. */
px_module *px_tp_vocab_embedding(px_tp_group *g, int vocab, int dim);
/* Output projection tied to a px_tp_vocab_embedding: logits (…, count) of
 * this rank's vocabulary rows; x is copied into the tp region (all-reduce
 * of dx backward). */
px_module *px_tp_vocab_tied_head(px_tp_group *g, px_module *embedding);

/* Vocabulary-parallel cross-entropy (Megatron's): logits (R, count) are this
 * rank's columns [first, first + count) of the (R, vocab) logits, which no
 * rank ever holds whole.  Three all-reduces of R numbers: the row maxima
 * (MAX), the target logits (SUM; the rank holding the target contributes),
 * the sums of e^(z - max) (SUM).  loss = mean over rows whose target is not
 * ignore_index of log Σ e^z - z_target (the same on every rank);
 * dlogits (may be NULL) = (softmax - onehot) / rows, this rank's columns. */
px_status px_tp_cross_entropy(px_tp_group *g, const px_tensor *logits, int vocab, const int32_t *targets,
                              int ignore_index, float *loss, float *dlogits);

/* ---- The GPT in tensor-parallel form ------------------------------------------
 * The zoo's GPT (apps/plexus/zoo_gpt.c) with the same module tree, names
 * and (per rank: boxes of) parameters: q, k, v column-parallel (c_attn with
 * parts = 3, each rank n_head/P heads), the attention projection and
 * mlp.c_proj row-parallel, mlp.c_fc column-parallel, wte vocabulary-
 * parallel and the head tied to it.  Dropout masks are functions of the
 * global element index (attention: of the global head), so the model is
 * the single-process model's, computed in pieces.  The logits are (N, T,
 * count): use px_tp_cross_entropy.  n_head not divisible by P, n_embd not
 * divisible by n_head: PX_ERR_INVALID naming the sizes. */
typedef struct px_tp_gpt_config {
  int vocab_size, context, n_layer, n_head, n_embd;
  float dropout;
  /* Sequence parallelism: layer norms, dropout and residual adds on T/P
   * positions a rank, all-gathers / reduce-scatters at the tp regions'
   * boundaries instead of all-reduces (tp_gpt.c has the map).  The input
   * (N, T) ids are the same on every tp rank, T a multiple of P; the logits
   * are (N, T, count) as without. */
  bool sequence_parallel;
} px_tp_gpt_config;
/* The tensor-parallel GPT of cfg on group g (NULL with px_last_error set on failure). */
px_module *px_tp_gpt(px_tp_group *g, const px_tp_gpt_config *cfg);

/* ---- Gradient clipping -------------------------------------------------------
 * The global L2 norm of the gradients of a tensor-parallel model: a split
 * parameter counts with every rank's box, a replicated one once (its
 * gradient is the same on every tp rank).  One all-reduce over the tp group
 * (add one over dp yourself only if dp ranks hold different gradients, as
 * ZeRO's shards do; after DDP's all-reduce they are equal).  Scales the
 * gradients as px_clip_grad_norm does; *norm_out (may be NULL) the norm. */
px_status px_tp_clip_grad_norm(px_tp_group *g, px_model *model, float max_norm, float *norm_out);

/* The same under ZeRO stage 1 or 2 over the mesh's dp group (the tp model
 * wrapped with px_zero_wrap(&z, model, mesh->dp_comm, …)): each dp rank adds
 * the squares of its shard's elements (px_zero_segments says which flat
 * elements those are; a replicated parameter's only on tp rank 0), one f64
 * all-reduce over dp and one over tp give the global norm, and the shard is
 * scaled as px_clip_grad_norm would scale the whole.  Call after
 * px_zero_sync.  Stage 3 is refused (PX_ERR_UNSUPPORTED). */
struct px_zero;
px_status px_tp_zero_clip_grad_norm(const px_mesh *mesh, struct px_zero *z, px_model *model, float max_norm,
                                    float *norm_out);

#pragma GCC visibility pop

#ifdef __cplusplus
}
#endif
#endif
