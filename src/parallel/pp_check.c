/* pp_check.c — px_pp_schedule_check: prove a pipeline table runs, by
 * simulating it on the strictest transport (plexus/pipeline.h).
 *
 * Two passes.  The first reads each action alone: a known op, a stage and
 * micro-batch in range, the stage on this rank (stage mod p), the peer where
 * the stage map puts the neighbouring stage, every (stage, micro) forwarded
 * and backwarded exactly once and every transfer between two ranks sent
 * and received exactly once, OPTIM_STEP once and last.  The second runs the
 * ranks together, every action blocking: a send completes only when its
 * receive is the receiver's current action and a receive only when its send
 * is the sender's (a rendezvous, as MPI_Ssend), a compute only after what it
 * needs (its activation or gradient received, or made earlier on this rank).
 * When no rank can move and some have actions left, that is a deadlock,
 * reported with each stuck rank's action and whom it waits for.
 *
 * A table that passes also runs when sends are buffered or posted early
 * (the executor's non-blocking runs of SEND/RECV): those only make a send
 * complete sooner. */
#include "plexus/pipeline.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "SEND_ACT stage 0 micro 1 to rank 1". */
static void describe(const px_pp_action *a, char *buf, size_t cap) {
  const char *name = px_pp_op_name(a->op);
  switch (a->op) {
  case PX_PP_SEND_ACT:
  case PX_PP_SEND_GRAD: snprintf(buf, cap, "%s stage %d micro %d to rank %d", name, a->stage, a->micro, a->peer); break;
  case PX_PP_RECV_ACT:
  case PX_PP_RECV_GRAD:
    snprintf(buf, cap, "%s stage %d micro %d from rank %d", name, a->stage, a->micro, a->peer);
    break;
  case PX_PP_OPTIM_STEP: snprintf(buf, cap, "%s", name); break;
  default: snprintf(buf, cap, "%s stage %d micro %d", name, a->stage, a->micro); break;
  }
}

/* Where each (stage, micro) thing happens: the action index on its rank, or
 * -1.  Indexed stage·m + micro; the rank is the stage's (stage mod p). */
enum { AT_F, AT_B, AT_SEND_A, AT_RECV_A, AT_SEND_G, AT_RECV_G, AT_N };

typedef struct checker {
  const px_pp_schedule *s;
  int p, m, S;
  int *at[AT_N];
  char head[96]; /* "pipeline schedule 1f1b (p 2, m 4, v 1)" */
} checker;

static px_status fail_at(const checker *c, int r, int k, const char *fmt, const char *detail) {
  char what[96];
  describe(&c->s->actions[r][k], what, sizeof what);
  return px_error(PX_ERR_INVALID, "%s: rank %d, action %d (%s): %s%s", c->head, r, k, what, fmt, detail ? detail : "");
}

static int at_slot(int op) {
  switch (op) {
  case PX_PP_FORWARD: return AT_F;
  case PX_PP_BACKWARD: return AT_B;
  case PX_PP_SEND_ACT: return AT_SEND_A;
  case PX_PP_RECV_ACT: return AT_RECV_A;
  case PX_PP_SEND_GRAD: return AT_SEND_G;
  default: return AT_RECV_G;
  }
}

/* The first pass: each action alone, then completeness. */
static px_status check_static(checker *c) {
  const px_pp_schedule *s = c->s;
  int p = c->p, m = c->m, S = c->S;
  char buf[160];
  for (int r = 0; r < p; r++) {
    int n = s->n_actions[r];
    bool optim = false;
    for (int k = 0; k < n; k++) {
      const px_pp_action *a = &s->actions[r][k];
      if ((int)a->op < PX_PP_FORWARD || (int)a->op > PX_PP_OPTIM_STEP)
        return px_error(PX_ERR_INVALID, "%s: rank %d, action %d: unknown op %d", c->head, r, k, (int)a->op);
      if (a->op == PX_PP_OPTIM_STEP) {
        if (k != n - 1) return fail_at(c, r, k, "the optimizer step must be the rank's last action", NULL);
        optim = true;
        continue;
      }
      if (a->stage < 0 || a->stage >= S) {
        snprintf(buf, sizeof buf, " (there are %d stages: p %d x v %d)", S, p, s->v);
        return fail_at(c, r, k, "stage out of range", buf);
      }
      if (a->micro < 0 || a->micro >= m) {
        snprintf(buf, sizeof buf, " (there are %d micro-batches)", m);
        return fail_at(c, r, k, "micro-batch out of range", buf);
      }
      if (a->stage % p != r) {
        snprintf(buf, sizeof buf, "stage %d lives on rank %d (stage mod p), not on rank %d", a->stage, a->stage % p, r);
        return fail_at(c, r, k, buf, NULL);
      }
      /* The neighbour a transfer goes to or comes from. */
      int other = -1;
      if (a->op == PX_PP_SEND_ACT || a->op == PX_PP_RECV_GRAD) {
        if (a->stage == S - 1) return fail_at(c, r, k, "the last stage has no next stage to exchange with", NULL);
        other = (a->stage + 1) % p;
      } else if (a->op == PX_PP_RECV_ACT || a->op == PX_PP_SEND_GRAD) {
        if (a->stage == 0) return fail_at(c, r, k, "the first stage has no previous stage to exchange with", NULL);
        other = (a->stage - 1) % p;
      }
      if (other >= 0) {
        if (other == r)
          return fail_at(c, r, k,
                         "a transfer to the same rank (with p = 1 neighbouring stages hand over locally, "
                         "without a send or receive)",
                         NULL);
        if (a->peer != other) {
          snprintf(buf, sizeof buf, "wrong peer: the neighbouring stage is on rank %d, not rank %d", other, a->peer);
          return fail_at(c, r, k, buf, NULL);
        }
      }
      int slot = at_slot(a->op);
      int *where = &c->at[slot][(size_t)a->stage * (size_t)m + (size_t)a->micro];
      if (*where >= 0) {
        snprintf(buf, sizeof buf, " (first at action %d)", *where);
        return fail_at(c, r, k, "done twice", buf);
      }
      *where = k;
    }
    if (!optim)
      return px_error(PX_ERR_INVALID, "%s: rank %d has no OPTIM_STEP (expected as its last action)", c->head, r);
  }
  /* Every (stage, micro) forwarded and backwarded once. */
  for (int st = 0; st < S; st++)
    for (int i = 0; i < m; i++) {
      size_t x = (size_t)st * (size_t)m + (size_t)i;
      if (c->at[AT_F][x] < 0)
        return px_error(PX_ERR_INVALID, "%s: rank %d never runs FORWARD stage %d micro %d", c->head, st % p, st, i);
      if (c->at[AT_B][x] < 0)
        return px_error(PX_ERR_INVALID, "%s: rank %d never runs BACKWARD stage %d micro %d", c->head, st % p, st, i);
    }
  /* Every transfer between two ranks sent once and received once. */
  if (p > 1)
    for (int st = 0; st + 1 < S; st++) {
      int lo = st % p, hi = (st + 1) % p;
      for (int i = 0; i < m; i++) {
        size_t x = (size_t)st * (size_t)m + (size_t)i, y = x + (size_t)m;
        int sa = c->at[AT_SEND_A][x], ra = c->at[AT_RECV_A][y];
        int sg = c->at[AT_SEND_G][y], rg = c->at[AT_RECV_G][x];
        if (sa >= 0 && ra < 0)
          return px_error(PX_ERR_INVALID,
                          "%s: missing receive: rank %d has no RECV_ACT stage %d micro %d for the activation "
                          "rank %d sends at action %d",
                          c->head, hi, st + 1, i, lo, sa);
        if (ra >= 0 && sa < 0)
          return px_error(PX_ERR_INVALID,
                          "%s: missing send: rank %d has no SEND_ACT stage %d micro %d for the activation "
                          "rank %d receives at action %d",
                          c->head, lo, st, i, hi, ra);
        if (sa < 0)
          return px_error(PX_ERR_INVALID,
                          "%s: rank %d never sends stage %d's activation of micro %d to rank %d (SEND_ACT), "
                          "nor does rank %d receive it (RECV_ACT stage %d micro %d)",
                          c->head, lo, st, i, hi, hi, st + 1, i);
        if (sg >= 0 && rg < 0)
          return px_error(PX_ERR_INVALID,
                          "%s: missing receive: rank %d has no RECV_GRAD stage %d micro %d for the gradient "
                          "rank %d sends at action %d",
                          c->head, lo, st, i, hi, sg);
        if (rg >= 0 && sg < 0)
          return px_error(PX_ERR_INVALID,
                          "%s: missing send: rank %d has no SEND_GRAD stage %d micro %d for the gradient "
                          "rank %d receives at action %d",
                          c->head, hi, st + 1, i, lo, rg);
        if (sg < 0)
          return px_error(PX_ERR_INVALID,
                          "%s: rank %d never sends stage %d's input gradient of micro %d to rank %d (SEND_GRAD), "
                          "nor does rank %d receive it (RECV_GRAD stage %d micro %d)",
                          c->head, hi, st + 1, i, lo, lo, st, i);
      }
    }
  return PX_OK;
}

/* Is rank q's current action the receive matching send a of rank r? */
static bool matches(const px_pp_schedule *s, const int *pc, const px_pp_action *a, int r) {
  int q = a->peer;
  if (pc[q] >= s->n_actions[q]) return false;
  const px_pp_action *b = &s->actions[q][pc[q]];
  if (b->micro != a->micro || b->peer != r) return false;
  if (a->op == PX_PP_SEND_ACT) return b->op == PX_PP_RECV_ACT && b->stage == a->stage + 1;
  return b->op == PX_PP_RECV_GRAD && b->stage == a->stage - 1;
}

/* The second pass: all ranks together, every action blocking. */
static px_status check_run(checker *c) {
  const px_pp_schedule *s = c->s;
  int p = c->p, m = c->m, S = c->S;
  size_t sm = (size_t)S * (size_t)m;
  /* What has happened: forward / backward done, activation into / gradient
   * out of (stage, micro) received. */
  bool *fwd = calloc(sm, 1), *bwd = calloc(sm, 1), *act_in = calloc(sm, 1), *grad_out = calloc(sm, 1);
  int *pc = calloc((size_t)p, sizeof *pc);
  px_status st = PX_OK;
  char buf[200];
  if (!fwd || !bwd || !act_in || !grad_out || !pc) {
    st = px_error(PX_ERR_NOMEM, "pipeline schedule check: out of memory");
    goto done;
  }
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; r++) {
      while (pc[r] < s->n_actions[r]) {
        int k = pc[r];
        const px_pp_action *a = &s->actions[r][k];
        size_t x = (size_t)a->stage * (size_t)m + (size_t)a->micro;
        bool advance = true;
        switch (a->op) {
        case PX_PP_FORWARD:
          if (a->stage > 0 && (a->stage - 1) % p == r && !fwd[x - (size_t)m]) {
            st = fail_at(c, r, k, "forward before the previous stage's forward on this rank", NULL);
            goto done;
          }
          if (a->stage > 0 && (a->stage - 1) % p != r && !act_in[x]) {
            snprintf(buf, sizeof buf, " (RECV_ACT at action %d)", c->at[AT_RECV_A][x]);
            st = fail_at(c, r, k, "forward before its activation arrived", buf);
            goto done;
          }
          fwd[x] = true;
          break;
        case PX_PP_BACKWARD:
          if (!fwd[x]) {
            snprintf(buf, sizeof buf, " (FORWARD at action %d)", c->at[AT_F][x]);
            st = fail_at(c, r, k, "backward before its forward", buf);
            goto done;
          }
          if (a->stage < S - 1 && (a->stage + 1) % p == r && !bwd[x + (size_t)m]) {
            st = fail_at(c, r, k, "backward before the next stage's backward on this rank", NULL);
            goto done;
          }
          if (a->stage < S - 1 && (a->stage + 1) % p != r && !grad_out[x]) {
            snprintf(buf, sizeof buf, " (RECV_GRAD at action %d)", c->at[AT_RECV_G][x]);
            st = fail_at(c, r, k, "backward before its gradient arrived", buf);
            goto done;
          }
          bwd[x] = true;
          break;
        case PX_PP_SEND_ACT:
        case PX_PP_SEND_GRAD: {
          bool act = a->op == PX_PP_SEND_ACT;
          if (act ? !fwd[x] : !bwd[x]) {
            snprintf(buf, sizeof buf, " (%s at action %d)", act ? "FORWARD" : "BACKWARD", c->at[act ? AT_F : AT_B][x]);
            st = fail_at(c, r, k,
                         act ? "sends an activation before computing it" : "sends a gradient before computing it", buf);
            goto done;
          }
          if (!matches(s, pc, a, r)) {
            advance = false;
            break;
          }
          if (act) act_in[x + (size_t)m] = true;
          else grad_out[x - (size_t)m] = true;
          pc[a->peer]++; /* the receive completes with the send */
          break;
        }
        case PX_PP_RECV_ACT:
        case PX_PP_RECV_GRAD:
          advance = false; /* completed by its sender's turn */
          break;
        case PX_PP_OPTIM_STEP: break;
        }
        if (!advance) break;
        pc[r]++;
        progress = true;
      }
    }
  }
  int stuck = 0;
  for (int r = 0; r < p; r++) stuck += pc[r] < s->n_actions[r];
  if (stuck) {
    /* Name every stuck rank: where it is and whom it waits for. */
    char msg[900];
    size_t len = (size_t)snprintf(msg, sizeof msg, "%s: deadlock, %d rank(s) wait forever:", c->head, stuck);
    for (int r = 0; r < p && len < sizeof msg; r++) {
      if (pc[r] >= s->n_actions[r]) continue;
      const px_pp_action *a = &s->actions[r][pc[r]];
      char what[96], theirs[128] = "its end";
      describe(a, what, sizeof what);
      int q = a->peer;
      if (q >= 0 && q < p && pc[q] < s->n_actions[q]) {
        char d[96];
        describe(&s->actions[q][pc[q]], d, sizeof d);
        snprintf(theirs, sizeof theirs, "action %d (%s)", pc[q], d);
      }
      len += (size_t)snprintf(msg + len, sizeof msg - len,
                              " rank %d at action %d (%s) waits for rank %d, which is at %s;", r, pc[r], what, q,
                              theirs);
    }
    st = px_error(PX_ERR_INVALID, "%s", msg);
  }
done:
  free(fwd);
  free(bwd);
  free(act_in);
  free(grad_out);
  free(pc);
  return st;
}

px_status px_pp_schedule_check(const px_pp_schedule *s) {
  if (!s) return px_error(PX_ERR_INVALID, "pipeline schedule check: no schedule");
  if (s->p < 1 || s->m < 1 || s->v < 1)
    return px_error(PX_ERR_INVALID, "pipeline schedule check: p %d, m %d, v %d; each must be at least 1", s->p, s->m,
                    s->v);
  if ((int64_t)s->p * s->v * s->m > (1 << 23))
    return px_error(PX_ERR_INVALID, "pipeline schedule check: p %d x v %d x m %d is too large", s->p, s->v, s->m);
  if (!s->n_actions || !s->actions) return px_error(PX_ERR_INVALID, "pipeline schedule check: the table is missing");
  for (int r = 0; r < s->p; r++)
    if (s->n_actions[r] < 0 || (s->n_actions[r] > 0 && !s->actions[r]))
      return px_error(PX_ERR_INVALID, "pipeline schedule check: rank %d's action list is missing", r);
  checker c = {.s = s, .p = s->p, .m = s->m, .S = s->p * s->v};
  snprintf(c.head, sizeof c.head, "pipeline schedule %s (p %d, m %d, v %d)", px_pp_kind_name(s->kind), s->p, s->m,
           s->v);
  size_t sm = (size_t)c.S * (size_t)c.m;
  px_status st = PX_OK;
  for (int j = 0; j < AT_N; j++) {
    c.at[j] = malloc(sm * sizeof *c.at[j]);
    if (!c.at[j]) {
      st = px_error(PX_ERR_NOMEM, "pipeline schedule check: out of memory");
      goto done;
    }
    for (size_t x = 0; x < sm; x++) c.at[j][x] = -1;
  }
  if ((st = check_static(&c)) == PX_OK) st = check_run(&c);
done:
  for (int j = 0; j < AT_N; j++) free(c.at[j]);
  return st;
}
