/* Claim: px_optim_step applies torch.optim's update rules (PyTorch 1.13,
 * one parameter group) for SGD (momentum, dampening, Nesterov, L2 weight
 * decay), Adam (L2 weight decay, bias correction) and AdamW (decoupled
 * weight decay).  If this fails, training with plexus drifts from the same
 * run in PyTorch: a wrong first momentum step, a dampening applied to the
 * wrong term, Nesterov's look-ahead missing, bias correction off by a step,
 * AdamW's decay leaking into the moments, grads modified by the step, or the
 * OpenMP path (n >= 32768) disagreeing with the serial one.
 *
 * The reference is a separate double-precision implementation of the
 * algorithms as PyTorch's documentation states them, element by element. */
#include "px_test.h"

#include <string.h>

// ---- Reference, in double ------------------------------------------------
typedef struct ref_optim {
  px_optim_opts o;  // the same (float) hyperparameters, read as double
  size_t n;
  double *p, *buf, *m, *v;
  int64_t t;  // steps taken
} ref_optim;

static ref_optim ref_make(const px_optim_opts *o, const float *p0, size_t n) {
  ref_optim r = {.o = *o, .n = n, .t = 0};
  r.p = calloc(n, sizeof(double));
  r.buf = calloc(n, sizeof(double));
  r.m = calloc(n, sizeof(double));
  r.v = calloc(n, sizeof(double));
  for (size_t i = 0; i < n; i++) r.p[i] = p0[i];
  return r;
}

static void ref_free(ref_optim *r) {
  free(r->p);
  free(r->buf);
  free(r->m);
  free(r->v);
}

static void ref_step(ref_optim *r, const float *grads) {
  r->t++;
  const double lr = r->o.lr, wd = r->o.weight_decay;
  for (size_t i = 0; i < r->n; i++) {
    double g = grads[i];
    if (r->o.kind == PX_OPTIM_SGD) {
      // torch.optim.SGD documentation, maximize = False.
      const double mu = r->o.momentum, tau = r->o.dampening;
      if (wd != 0) g = g + wd * r->p[i];
      if (mu != 0) {
        if (r->t > 1) r->buf[i] = mu * r->buf[i] + (1 - tau) * g;
        else r->buf[i] = g;
        if (r->o.nesterov) g = g + mu * r->buf[i];
        else g = r->buf[i];
      }
      r->p[i] = r->p[i] - lr * g;
    } else {
      // torch.optim.Adam / AdamW documentation, amsgrad = False.
      const double b1 = r->o.beta1, b2 = r->o.beta2, eps = r->o.eps;
      if (r->o.kind == PX_OPTIM_ADAMW) r->p[i] = r->p[i] - lr * wd * r->p[i];
      else if (wd != 0) g = g + wd * r->p[i];
      r->m[i] = b1 * r->m[i] + (1 - b1) * g;
      r->v[i] = b2 * r->v[i] + (1 - b2) * g * g;
      double m_hat = r->m[i] / (1 - pow(b1, (double)r->t));
      double v_hat = r->v[i] / (1 - pow(b2, (double)r->t));
      r->p[i] = r->p[i] - lr * m_hat / (sqrt(v_hat) + eps);
    }
  }
}

// Largest |a - b| / max(1, |b|): parameters and moments here are O(1) or
// smaller, so this is an absolute error that a wrong rule exceeds by far.
static double max_err(const float *a, const double *b, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - b[i]) / fmax(1.0, fabs(b[i]));
    if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
  }
  return worst;
}

static void fill_uniform(float *x, size_t n, px_rng *rng, float lo, float hi) {
  for (size_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * px_rng_uniform(rng);
}

// Runs `steps` updates of plexus and the reference from the same start with
// the same fresh gradients each step; at step 3 the learning rate is halved
// (px_optim_set_lr), as a scheduler would.  Params and state must stay
// within tol of the reference after every step.
static void check_matches_reference(const char *label, px_optim_opts opts, size_t n, int steps, double tol) {
  float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g), *g_copy = malloc(n * sizeof *g);
  px_rng rng = px_rng_make(1234, (uint64_t)n);
  fill_uniform(p, n, &rng, -2.0f, 2.0f);
  ref_optim ref = ref_make(&opts, p, n);
  px_optim *o = NULL;
  CHECK_OK(px_optim_create(&o, p, g, n, &opts));
  int expect_slots = opts.kind == PX_OPTIM_SGD ? (opts.momentum != 0 ? 1 : 0) : 2;
  CHECK(o->n_state == expect_slots, "%s: %d state slots, expected %d", label, o->n_state, expect_slots);

  double worst_p = 0, worst_state = 0;
  for (int s = 0; s < steps; s++) {
    if (s == 3) {
      px_optim_set_lr(o, opts.lr * 0.5f);
      ref.o.lr = opts.lr * 0.5f;
    }
    fill_uniform(g, n, &rng, -1.0f, 1.0f);
    if (s == 1) g[0] = 0.0f;  // a zero gradient mid-run: the moments only decay
    memcpy(g_copy, g, n * sizeof *g);
    CHECK_OK(px_optim_step(o));
    ref_step(&ref, g);
    CHECK(memcmp(g, g_copy, n * sizeof *g) == 0, "%s: step %d modified the gradients", label, s);
    CHECK(o->step == s + 1, "%s: step counter %lld after %d steps", label, (long long)o->step, s + 1);
    worst_p = fmax(worst_p, max_err(p, ref.p, n));
    const char *name = NULL;
    if (opts.kind == PX_OPTIM_SGD && expect_slots == 1) {
      float *buf = px_optim_state_slot(o, 0, &name);
      CHECK(buf && name && strcmp(name, "momentum_buffer") == 0, "%s: slot 0 is %s", label, name ? name : "NULL");
      if (buf) worst_state = fmax(worst_state, max_err(buf, ref.buf, n));
    } else if (opts.kind != PX_OPTIM_SGD) {
      float *m = px_optim_state_slot(o, 0, &name);
      CHECK(m && name && strcmp(name, "exp_avg") == 0, "%s: slot 0 is %s", label, name ? name : "NULL");
      if (m) worst_state = fmax(worst_state, max_err(m, ref.m, n));
      float *v = px_optim_state_slot(o, 1, &name);
      CHECK(v && name && strcmp(name, "exp_avg_sq") == 0, "%s: slot 1 is %s", label, name ? name : "NULL");
      if (v) worst_state = fmax(worst_state, max_err(v, ref.v, n));
    }
  }
  CHECK(px_optim_state_slot(o, expect_slots, NULL) == NULL, "%s: slot %d should be out of range", label, expect_slots);
  CHECK(px_optim_state_slot(o, -1, NULL) == NULL, "%s: slot -1 should be out of range", label);
  CHECK(worst_p <= tol, "%s (n=%zu): params differ from the reference by %.3g (tol %.3g)", label, n, worst_p, tol);
  CHECK(worst_state <= tol, "%s (n=%zu): state differs from the reference by %.3g (tol %.3g)", label, n, worst_state,
        tol);
  printf("  %-34s n=%-6zu params err %.2e  state err %.2e\n", label, n, worst_p, worst_state);
  px_optim_free(o);
  ref_free(&ref);
  free(p);
  free(g);
  free(g_copy);
}

// Runs one optimizer `steps` times on a copy of p0 with the same gradients.
static void run_steps(px_optim_opts opts, const float *p0, float *p, const float *const *grads, size_t n, int steps) {
  float *g = malloc(n * sizeof *g);
  memcpy(p, p0, n * sizeof *p);
  px_optim *o = NULL;
  CHECK_OK(px_optim_create(&o, p, g, n, &opts));
  for (int s = 0; s < steps; s++) {
    memcpy(g, grads[s], n * sizeof *g);
    CHECK_OK(px_optim_step(o));
  }
  px_optim_free(o);
  free(g);
}

int main(void) {
  // Defaults are PyTorch's.
  px_optim_opts d = px_sgd_defaults(0.1f);
  CHECK(d.kind == PX_OPTIM_SGD && d.lr == 0.1f && d.momentum == 0 && d.dampening == 0 && !d.nesterov &&
          d.weight_decay == 0,
        "SGD defaults");
  d = px_adam_defaults(1e-3f);
  CHECK(d.kind == PX_OPTIM_ADAM && d.lr == 1e-3f && d.beta1 == 0.9f && d.beta2 == 0.999f && d.eps == 1e-8f &&
          d.weight_decay == 0,
        "Adam defaults");
  d = px_adamw_defaults(1e-3f);
  CHECK(d.kind == PX_OPTIM_ADAMW && d.lr == 1e-3f && d.beta1 == 0.9f && d.beta2 == 0.999f && d.eps == 1e-8f &&
          d.weight_decay == 0.01f,
        "AdamW defaults");

  // Hand-computed first steps.  SGD: p = 1 - 0.1·0.5 = 0.95.  Nesterov
  // (momentum 0.9): buf = g, p = 1 - 0.1·(g + 0.9·g) = 0.905.  Adam: the
  // first step is lr·m̂/(√v̂ + eps) = lr·g/(|g| + eps) ≈ lr·sign(g).
  {
    float p = 1.0f, g = 0.5f;
    px_optim *o = NULL;
    px_optim_opts so = px_sgd_defaults(0.1f);
    CHECK_OK(px_optim_create(&o, &p, &g, 1, &so));
    CHECK_OK(px_optim_step(o));
    CHECK_CLOSE(p, 0.95, 1e-7);
    px_optim_free(o);
    p = 1.0f;
    so.momentum = 0.9f;
    so.nesterov = true;
    CHECK_OK(px_optim_create(&o, &p, &g, 1, &so));
    CHECK_OK(px_optim_step(o));
    CHECK_CLOSE(p, 0.905, 1e-7);
    px_optim_free(o);
    float pa[2] = {1.0f, 1.0f}, ga[2] = {0.5f, -3.0f};
    px_optim_opts ao = px_adam_defaults(0.01f);
    CHECK_OK(px_optim_create(&o, pa, ga, 2, &ao));
    CHECK_OK(px_optim_step(o));
    CHECK_CLOSE(pa[0], 0.99, 1e-6);
    CHECK_CLOSE(pa[1], 1.01, 1e-6);
    px_optim_free(o);
  }

  // Every rule against the reference, on a short odd-length vector (vector
  // body and scalar tail) and a long one (the OpenMP path).
  // Tolerances: SGD is a few roundings per step.  In Adam, d = g + wd·p can
  // cancel to near 0, where m/√v is ill-conditioned, so float and double
  // differ by up to ~1e-4 of one lr-sized step there; a wrong rule (bias
  // correction off by a step, eps inside the root, decay in the moments)
  // errs by a sizeable fraction of a step.
  const size_t sizes[2] = {37, 100003};
  const double sgd_tol = 2e-6, adam_tol = 1e-5;
  for (int k = 0; k < 2; k++) {
    size_t n = sizes[k];
    px_optim_opts o;
    o = px_sgd_defaults(0.1f);
    check_matches_reference("sgd", o, n, 6, sgd_tol);
    o.weight_decay = 0.05f;
    check_matches_reference("sgd + weight decay", o, n, 6, sgd_tol);
    o = px_sgd_defaults(0.1f);
    o.momentum = 0.9f;
    check_matches_reference("sgd momentum", o, n, 6, sgd_tol);
    o.dampening = 0.3f;
    o.weight_decay = 0.01f;
    check_matches_reference("sgd momentum + dampening + wd", o, n, 6, sgd_tol);
    o = px_sgd_defaults(0.1f);
    o.momentum = 0.8f;
    o.nesterov = true;
    o.weight_decay = 0.02f;
    check_matches_reference("sgd nesterov + wd", o, n, 6, sgd_tol);
    o = px_adam_defaults(0.05f);
    check_matches_reference("adam", o, n, 6, adam_tol);
    o.weight_decay = 0.1f;
    o.beta1 = 0.8f;
    o.beta2 = 0.99f;
    o.eps = 1e-6f;
    check_matches_reference("adam betas/eps + L2 wd", o, n, 6, adam_tol);
    o = px_adamw_defaults(0.05f);
    check_matches_reference("adamw (wd 0.01)", o, n, 6, adam_tol);
    o.weight_decay = 0.5f;
    check_matches_reference("adamw (wd 0.5)", o, n, 6, adam_tol);
  }

  // AdamW decouples decay: with zero gradients its moments stay 0, so each
  // step only shrinks p by (1 - lr·wd); Adam's L2 term instead feeds wd·p
  // through the moments, and its first step moves p by lr·sign(p).
  {
    enum { N = 5, STEPS = 4 };
    float p0[N] = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f}, zero[N] = {0};
    const float *grads[STEPS] = {zero, zero, zero, zero};
    float pw[N], pa[N];
    px_optim_opts w = px_adamw_defaults(0.1f), a = px_adam_defaults(0.1f);
    w.weight_decay = a.weight_decay = 0.2f;
    run_steps(w, p0, pw, grads, N, STEPS);
    run_steps(a, p0, pa, grads, N, 1);
    for (int i = 0; i < N; i++) {
      CHECK_CLOSE(pw[i], p0[i] * pow(1.0 - 0.1 * 0.2, STEPS), 1e-6);
      CHECK_CLOSE(pa[i], p0[i] - 0.1 * (p0[i] > 0 ? 1 : -1), 1e-6);
    }
  }

  // AdamW with weight decay is not Adam with weight decay (on random
  // gradients too), while AdamW with wd = 0 is exactly Adam with wd = 0.
  {
    enum { N = 64, STEPS = 5 };
    float p0[N], pw[N], pa[N], gbuf[STEPS][N];
    const float *grads[STEPS];
    px_rng rng = px_rng_make(99, 0);
    fill_uniform(p0, N, &rng, -1.0f, 1.0f);
    for (int s = 0; s < STEPS; s++) {
      fill_uniform(gbuf[s], N, &rng, -1.0f, 1.0f);
      grads[s] = gbuf[s];
    }
    px_optim_opts w = px_adamw_defaults(0.01f), a = px_adam_defaults(0.01f);
    w.weight_decay = a.weight_decay = 0.1f;
    run_steps(w, p0, pw, grads, N, STEPS);
    run_steps(a, p0, pa, grads, N, STEPS);
    double diff = 0;
    for (int i = 0; i < N; i++) diff = fmax(diff, fabs((double)pw[i] - pa[i]));
    CHECK(diff > 1e-4, "AdamW(wd=0.1) and Adam(wd=0.1) agree to %.3g: decay is not decoupled", diff);
    w.weight_decay = a.weight_decay = 0.0f;
    run_steps(w, p0, pw, grads, N, STEPS);
    run_steps(a, p0, pa, grads, N, STEPS);
    CHECK(memcmp(pw, pa, sizeof pw) == 0, "AdamW(wd=0) differs from Adam(wd=0)");
  }

  // An empty shard (n = 0, as a ZeRO rank may hold) steps without touching memory.
  {
    px_optim *o = NULL;
    px_optim_opts a = px_adam_defaults(0.1f);
    CHECK_OK(px_optim_create(&o, NULL, NULL, 0, &a));
    CHECK_OK(px_optim_step(o));
    CHECK(o->step == 1, "empty optimizer did not count its step");
    px_optim_free(o);
  }

  return px_test_finish("test_optim_sgd_adam_adamw_match_pytorch_rules");
}
