/* zero_cases.h — ZeRO claims, written once over px_comm so the same code
 * runs under the threads backend and under mpirun.  The reference is DDP on
 * the same ranks, batches and seeds: every rank trains a DDP model and a
 * ZeRO model and compares the ZeRO model's gathered parameters with DDP's,
 * tensor by tensor. */
#ifndef PX_ZERO_CASES_H
#define PX_ZERO_CASES_H

#include "px_test.h"
#include <plexus/zoo.h>

#include <string.h>

enum { MODEL_MLP, MODEL_CNN, MODEL_GPT };
enum { OPT_SGD, OPT_ADAM, OPT_ADAMW };

#define ZB 3 /* samples (sequences) per rank per micro-step */
#define ZSTEPS 20
#define ZIMG 8 /* CNN input (1, 8, 8) */
#define ZV 37  /* GPT vocabulary */
#define ZT 6   /* GPT sequence length */

static const char *model_name[] = {"mlp", "cnn", "gpt"};
static const char *opt_name[] = {"sgd", "adam", "adamw"};

/* 157 parameters (not a multiple of 2, 3 or 4): the last Linear(1, 2) has 2
 * elements, fewer than 3 or 4 ranks, and Linear(5, 1)'s bias is one
 * element (a bucket smaller than N with one-parameter buckets). */
static px_module *zmake_model(int kind) {
  if (kind == MODEL_MLP)
    return px_chain_of(6, px_linear(3, 16, true), px_tanh(), px_linear(16, 5, true), px_tanh(), px_linear(5, 1, true),
                       px_linear(1, 2, false));
  if (kind == MODEL_CNN)
    // No conv bias: batch norm subtracts it again, so its gradient is zero
    // up to rounding, which Adam would amplify into noise.
    return px_chain_of(10, px_conv2d(1, 4, 3, 1, 1, false), px_batchnorm(4, 1e-5f, 0.1f), px_relu(), px_maxpool2d(2, 2),
                       px_conv2d(4, 6, 3, 1, 1, false), px_batchnorm(6, 1e-5f, 0.1f), px_relu(), px_maxpool2d(2, 2),
                       px_flatten(), px_linear(6 * 2 * 2, 3, true));
  const px_gpt_config cfg = {.vocab_size = ZV, .context = 8, .n_layer = 2, .n_head = 2, .n_embd = 8, .dropout = 0};
  return px_zoo_gpt(&cfg);
}

/* Global sample i of step s (deterministic, the same on every rank). */
static void zsample(int kind, int step, int i, float *x, int32_t *ids, int32_t *label, float *target) {
  px_rng r = px_rng_make(1000 + (uint64_t)step, (uint64_t)i);
  if (kind == MODEL_GPT) {
    int32_t seq[ZT + 1];
    for (int t = 0; t <= ZT; t++) seq[t] = (int32_t)px_rng_below(&r, ZV);
    memcpy(ids, seq, ZT * sizeof *ids);
    memcpy(label, seq + 1, ZT * sizeof *label);
    return;
  }
  size_t n = kind == MODEL_MLP ? 3 : ZIMG * ZIMG;
  for (size_t k = 0; k < n; k++) x[k] = 2.0f * px_rng_uniform(&r) - 1.0f;
  *label = (int32_t)px_rng_below(&r, 3);
  target[0] = x[0] * x[1];
  target[1] = x[2] - x[0];
}

/* Forward and backward on rows [first, first + count) of step s's global
 * batch, the loss gradient scaled by `scale`. */
static void zstep_grads(px_model *md, int kind, int step, int first, int count, float scale) {
  float x[ZB * 4 * ZIMG * ZIMG], t[ZB * 4 * 2];
  int32_t ids[ZB * 4 * ZT], lab[ZB * 4 * ZT];
  const size_t n = kind == MODEL_MLP ? 3 : ZIMG * ZIMG;
  for (int i = 0; i < count; i++)
    zsample(kind, step, first + i, x + (size_t)i * n, ids + i * ZT, kind == MODEL_GPT ? lab + i * ZT : lab + i,
            t + 2 * i);
  px_tensor X = kind == MODEL_MLP ? px_tensor_f32(x, 2, count, 3, 0, 0)
    : kind == MODEL_CNN           ? px_tensor_f32(x, 4, count, 1, ZIMG, ZIMG)
                                  : px_tensor_view(ids, PX_I32, 2, (int64_t[]){count, ZT});
  px_tensor Y, dY;
  CHECK_OK(px_model_forward(md, &X, &Y));
  dY = Y;
  dY.data = px_model_scratch(md, (size_t)px_tensor_numel(&Y));
  float loss;
  if (kind == MODEL_MLP) {
    px_tensor T = px_tensor_f32(t, 2, count, 2, 0, 0);
    CHECK_OK(px_mse_loss(&Y, &T, &loss, px_f32(&dY)));
  } else {
    CHECK_OK(px_cross_entropy_loss(&Y, lab, NULL, &loss, px_f32(&dY)));
  }
  px_scale(px_f32(&dY), (size_t)px_tensor_numel(&Y), scale);
  CHECK_OK(px_model_backward(md, &dY, NULL));
}

static px_optim_opts zopt_opts(int opt) {
  px_optim_opts oo = opt == OPT_SGD ? px_sgd_defaults(0.05f)
    : opt == OPT_ADAM               ? px_adam_defaults(1e-2f)
                                    : px_adamw_defaults(1e-2f);
  if (opt == OPT_SGD) oo.momentum = 0.9f;
  return oo;
}

typedef struct zrun {
  int kind, opt;
  float clip; /* max_norm; 0: no clipping */
  int micro;  /* micro-steps per step (no_sync on all but the last) */
  int steps;
} zrun;

/* Rank r's rows of micro-step m: the micro-batch is N·ZB rows. */
static int zfirst_row(int world, int rank, int m) { return (m * world + rank) * ZB; }

/* DDP, the reference. */
static px_model *train_ddp(px_comm *c, const zrun *r) {
  const int rank = px_comm_rank(c), world = px_comm_size(c);
  px_model *md;
  CHECK_OK(px_model_create(&md, zmake_model(r->kind), 100 + (uint64_t)rank));  // wrap broadcasts rank 0's
  px_ddp_opts o = PX_DDP_DEFAULTS;
  o.bucket_bytes = o.first_bucket_bytes = 256;
  px_ddp *d;
  CHECK_OK(px_ddp_wrap(&d, md, c, &o));
  px_optim *opt;
  px_optim_opts oo = zopt_opts(r->opt);
  CHECK_OK(px_optim_create(&opt, md->param_data, md->grad_data, md->n_param_elems, &oo));
  for (int s = 0; s < r->steps; s++) {
    px_model_zero_grad(md);
    for (int m = 0; m < r->micro; m++) {
      px_ddp_set_sync(d, m == r->micro - 1);
      zstep_grads(md, r->kind, s, zfirst_row(world, rank, m), ZB, 1.0f / (float)r->micro);
    }
    CHECK_OK(px_ddp_sync(d));
    if (r->clip > 0) px_clip_grad_norm(md->grad_data, md->n_param_elems, r->clip);
    CHECK_OK(px_optim_step(opt));
  }
  px_optim_free(opt);
  px_ddp_free(d);
  return md;
}

/* ZeRO with opts; returns the model after px_zero_free (whole again). */
static px_model *train_zero(px_comm *c, const zrun *r, const px_zero_opts *zo, px_zero_memory *mem) {
  const int rank = px_comm_rank(c), world = px_comm_size(c);
  px_model *md;
  CHECK_OK(px_model_create(&md, zmake_model(r->kind), 100 + (uint64_t)rank));
  px_zero *z;
  CHECK_OK(px_zero_wrap(&z, md, c, zo));
  px_optim *opt;
  px_optim_opts oo = zopt_opts(r->opt);
  CHECK_OK(px_zero_optim_create(z, &opt, &oo));
  for (int s = 0; s < r->steps; s++) {
    px_zero_zero_grad(z);
    for (int m = 0; m < r->micro; m++) {
      px_zero_set_sync(z, m == r->micro - 1);
      zstep_grads(md, r->kind, s, zfirst_row(world, rank, m), ZB, 1.0f / (float)r->micro);
    }
    CHECK_OK(px_zero_sync(z));
    if (r->clip > 0) CHECK_OK(px_zero_clip_grad_norm(z, r->clip, NULL));
    CHECK_OK(px_optim_step(opt));
    CHECK_OK(px_zero_after_step(z));
  }
  if (mem) px_zero_memory_of(z, mem);
  // The gathered parameters equal what px_zero_free hands back.
  float *gathered = malloc(md->n_param_elems * sizeof *gathered);
  CHECK_OK(px_zero_gather_params(z, gathered));
  px_optim_free(opt);
  CHECK_OK(px_zero_free(z));
  CHECK(md->param_data && md->grad_data, "after px_zero_free the model holds param_data and grad_data again");
  CHECK(memcmp(gathered, md->param_data, md->n_param_elems * sizeof *gathered) == 0,
        "px_zero_gather_params differs from the parameters px_zero_free restored");
  free(gathered);
  return md;
}

typedef struct zdiff {
  double worst;      /* max over tensors of the per-tensor relative difference */
  double worst_norm; /* max over tensors of ||a - b|| / ||b|| (reported beside it) */
  const char *name;  /* the worst tensor */
  int bitwise;       /* tensors equal to the bit */
  int tensors;
} zdiff;

static double zslice_rel(const float *a, const float *b, size_t n) {
  double rms = sqrt(px_sumsq(b, n) / (double)n);
  return px_max_rel_diff(a, b, n, rms > 0 ? rms : 1e-30);
}

/* Per tensor: max_i |a_i - b_i| / max(|a_i|, |b_i|, rms(b)).  One
 * exception: the key third of a GPT's c_attn.bias.  Its exact gradient is
 * zero (softmax ignores q·b_k, the same for every key), so its float32
 * gradient is pure rounding noise that depends on the summation order:
 * Adam turns it into steps of ±lr (test_gpt_matches_pytorch.py explains
 * it), and even SGD leaves a tensor that is nothing but noise, whose
 * relative difference means nothing.  Compared are the q and v thirds.
 * The bitwise count always takes whole tensors. */
static zdiff zcompare(const px_model *a, const px_model *b) {
  zdiff d = {0, 0, "", 0, b->n_params};
  for (int i = 0; i < b->n_params; i++) {
    const px_param *pb = b->params[i];
    const float *pa = a->param_data + pb->offset;
    double w = zslice_rel(pa, pb->data, pb->numel);
    if (strstr(pb->name, "c_attn.bias")) {
      const size_t C = pb->numel / 3;
      double wq = zslice_rel(pa, pb->data, C), wv = zslice_rel(pa + 2 * C, pb->data + 2 * C, C);
      w = wq > wv ? wq : wv;
    }
    double dd = 0;
    for (size_t k = 0; k < pb->numel; k++) dd += ((double)pa[k] - pb->data[k]) * ((double)pa[k] - pb->data[k]);
    double nb = px_sumsq(pb->data, pb->numel), wn = sqrt(dd) / (nb > 0 ? sqrt(nb) : 1e-30);
    if (wn > d.worst_norm) d.worst_norm = wn;
    if (memcmp(pa, pb->data, pb->numel * sizeof(float)) == 0) d.bitwise++;
    if (w > d.worst) {
      d.worst = w;
      d.name = pb->name;
    }
  }
  return d;
}

/* Largest relative differences any case has shown (for the report line):
 * the bound's measure, and ||a - b|| / ||b|| per tensor. */
static double zworst_seen = 0, zworst_norm_seen = 0;

/* Claim: stage s trains to DDP's parameters (1e-6 relative per tensor;
 * to the bit when `bitwise` says the summation order is DDP's). */
static void zcase(px_comm *c, const zrun *r, const px_model *ddp, const px_zero_opts *zo, bool bitwise,
                  const char *what) {
  px_model *md = train_zero(c, r, zo, NULL);
  zdiff d = zcompare(md, ddp);
  const int rank = px_comm_rank(c), world = px_comm_size(c);
  // DDP's all-reduce and ZeRO's reduce-scatter both sum ranks in rank
  // order on every backend (src/parallel/rank_sum.h: under MPI with 3 or
  // more ranks both are built from messages, since Open MPI's ring and
  // MPI_Reduce_scatter_block add in orders of their own), so the bound is
  // 1e-6 everywhere and bitwise where nothing else changes the order.
  const double tol = 1e-6;
  CHECK(d.worst <= tol, "rank %d/%d %s %s clip %g, stage %d %s: \"%s\" differs from DDP by %.3g relative", rank, world,
        model_name[r->kind], opt_name[r->opt], (double)r->clip, zo->stage, what, d.name, d.worst);
  if (bitwise)
    CHECK(d.bitwise == d.tensors,
          "rank %d/%d %s %s stage %d %s: only %d of %d tensors equal DDP's to the bit "
          "(worst \"%s\" %.3g)",
          rank, world, model_name[r->kind], opt_name[r->opt], zo->stage, what, d.bitwise, d.tensors, d.name, d.worst);
  if (rank == 0 && d.worst > zworst_seen) zworst_seen = d.worst;  // one writer: rank 0's thread
  if (rank == 0 && d.worst_norm > zworst_norm_seen) zworst_norm_seen = d.worst_norm;
  if (rank == 0)
    printf("  %d ranks %s %-5s clip %-3g micro %d stage %d %-22s bitwise %2d/%2d tensors, worst %.2e (norm %.2e)%s%s\n",
           world, model_name[r->kind], opt_name[r->opt], (double)r->clip, r->micro, zo->stage, what, d.bitwise,
           d.tensors, d.worst, d.worst_norm, d.worst > 0 ? " " : "", d.worst > 0 ? d.name : "");
  px_model_free(md);
}

static px_zero_opts zopts(int stage, size_t bucket_bytes) {
  px_zero_opts o = PX_ZERO_DEFAULTS;
  o.stage = stage;
  o.bucket_bytes = o.first_bucket_bytes = bucket_bytes;
  return o;
}

/* Every stage against DDP for one model and optimizer.  `exact` says the
 * backend sums ranks in one fixed order for all-reduce and reduce-scatter
 * (threads; any backend with 2 ranks), so without clipping and
 * accumulation the stages must equal DDP to the bit. */
static void zall_stages(px_comm *c, int kind, int opt, float clip, bool exact) {
  zrun r = {.kind = kind, .opt = opt, .clip = clip, .micro = 1, .steps = ZSTEPS};
  px_model *ddp = train_ddp(c, &r);
  for (int stage = 1; stage <= 3; stage++) {
    // Stages 1-2: one-parameter buckets and 256 B buckets; stage 3: the
    // default units (the root's children), and for the GPT its blocks
    // (the root unit then holds wte, wpe and ln_f: three flat ranges).
    px_zero_opts o = zopts(stage, stage < 3 ? 1 : 256);
    zcase(c, &r, ddp, &o, exact && clip == 0, stage < 3 ? "1-param buckets" : "default units");
    if (stage < 3) {
      o = zopts(stage, 256);
      zcase(c, &r, ddp, &o, exact && clip == 0, "256 B buckets");
    } else if (kind == MODEL_GPT) {
      static const char *blocks[] = {"h.0", "h.1"};
      o.units = blocks;
      o.n_units = 2;
      zcase(c, &r, ddp, &o, exact && clip == 0, "units h.0 h.1");
      o.reshard_after_forward = false;
      zcase(c, &r, ddp, &o, exact && clip == 0, "h.0 h.1 no reshard");
    } else {
      o.reshard_after_forward = false;
      o.prefetch = false;
      zcase(c, &r, ddp, &o, exact && clip == 0, "no reshard, no prefetch");
    }
  }
  px_model_free(ddp);
}

/* Claim: gradient accumulation (no_sync on 3 of 4 micro-steps) gives DDP's
 * accumulated result: stage 1 sums locally and reduce-scatters once, as DDP
 * does (bitwise where DDP is); stages 2-3 reduce-scatter every micro-step
 * and add into the shard (another summation order: 1e-6).  The GPT runs
 * SGD here: Adam divides each gradient by its own magnitude, and in the
 * attention's query/key weights, whose gradients nearly cancel, it lifts
 * the float32 noise of a new summation order to ~2e-6 in 5 steps. */
static void zaccumulation(px_comm *c, int kind, bool exact) {
  zrun r = {.kind = kind, .opt = kind == MODEL_GPT ? OPT_SGD : OPT_ADAM, .clip = 0, .micro = 4, .steps = 5};
  px_model *ddp = train_ddp(c, &r);
  for (int stage = 1; stage <= 3; stage++) {
    px_zero_opts o = zopts(stage, 256);
    zcase(c, &r, ddp, &o, exact && stage == 1, "accumulation x4");
  }
  px_model_free(ddp);
}

/* Claim: with a delay before every collective (a missing wait would read
 * a buffer the collective has not filled yet) the result is unchanged. */
static void zdelayed(px_comm *c, int kind, bool exact) {
  zrun r = {.kind = kind, .opt = OPT_ADAM, .clip = 0, .micro = 1, .steps = 4};
  px_model *ddp = train_ddp(c, &r);
  for (int stage = 2; stage <= 3; stage++) {
    px_zero_opts o = zopts(stage, 256);
    o.test_delay_s = 0.002;
    zcase(c, &r, ddp, &o, exact, "2 ms before collectives");
  }
  px_model_free(ddp);
}

#endif
