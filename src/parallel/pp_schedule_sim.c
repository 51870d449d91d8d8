/* pp_schedule_sim.c — timing a pipeline table, and printing it for a person
 * (plexus/pipeline.h).
 *
 * The timing model is the executor's (pp_schedule.c, "The executor's
 * convention"): a rank runs its actions in order; a forward costs tf, a
 * backward tb; communication is free; a SEND is posted and does not wait, a
 * RECV is posted and does not wait either — the compute that needs the
 * data waits for it (until its send has been posted).  So a receive placed
 * early in the table never holds back a compute that does not need it, and
 * the timing is that of the compute orders alone, whatever tf and tb are.
 * The busy share of rank r is its compute time over the makespan (the time
 * the last rank finishes); 1 - busy is the bubble. */
#include "plexus/pipeline.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Play the table: start[r][k] receives the time action k of rank r starts
 * (a compute) or is posted (a transfer). */
static px_status play(const px_pp_schedule *s, double tf, double tb, double **start, double *busy, double *makespan) {
  int p = s->p, m = s->m, S = s->p * s->v;
  size_t sm = (size_t)S * (size_t)m;
  /* When the activation out of / gradient into (stage, micro) was sent, or
   * made on this rank (p = 1 hands over locally); -1 not yet. */
  double *act_out = malloc(sm * sizeof *act_out), *grad_in = malloc(sm * sizeof *grad_in);
  double *clock = calloc((size_t)p, sizeof *clock);
  int *pc = calloc((size_t)p, sizeof *pc);
  px_status st = PX_OK;
  if (!act_out || !grad_in || !clock || !pc) {
    st = px_error(PX_ERR_NOMEM, "pipeline schedule simulate: out of memory");
    goto done;
  }
  for (size_t x = 0; x < sm; x++) act_out[x] = grad_in[x] = -1;
  for (int r = 0; r < p; r++) busy[r] = 0;
  for (int progress = 1; progress;) {
    progress = 0;
    for (int r = 0; r < p; r++) {
      while (pc[r] < s->n_actions[r]) {
        const px_pp_action *a = &s->actions[r][pc[r]];
        size_t x = (size_t)a->stage * (size_t)m + (size_t)a->micro;
        double t = clock[r];
        /* A compute's input from another rank: the time its send was
         * posted (not yet: wait for the sender to get there). */
        double sent = 0;
        if (p > 1 && a->op == PX_PP_FORWARD && a->stage > 0) sent = act_out[x - (size_t)m];
        if (p > 1 && a->op == PX_PP_BACKWARD && a->stage < S - 1) sent = grad_in[x + (size_t)m];
        if (sent < 0) goto wait;
        if (sent > t) clock[r] = t = sent;
        switch (a->op) {
        case PX_PP_FORWARD:
          clock[r] += tf;
          busy[r] += tf;
          if (p == 1) act_out[x] = clock[r];
          break;
        case PX_PP_BACKWARD:
          clock[r] += tb;
          busy[r] += tb;
          if (p == 1) grad_in[x] = clock[r];
          break;
        case PX_PP_SEND_ACT: act_out[x] = t; break;
        case PX_PP_SEND_GRAD: grad_in[x] = t; break;
        case PX_PP_RECV_ACT:
        case PX_PP_RECV_GRAD:
        case PX_PP_OPTIM_STEP: break;
        }
        if (start) start[r][pc[r]] = t;
        pc[r]++;
        progress = 1;
      }
    wait:;
    }
  }
  for (int r = 0; r < p; r++)
    if (pc[r] < s->n_actions[r]) {
      st = px_error(PX_ERR_INTERNAL, "pipeline schedule simulate: rank %d stuck at action %d", r, pc[r]);
      goto done;
    }
  *makespan = 0;
  for (int r = 0; r < p; r++)
    if (clock[r] > *makespan) *makespan = clock[r];
done:
  free(act_out);
  free(grad_in);
  free(clock);
  free(pc);
  return st;
}

px_status px_pp_schedule_simulate(const px_pp_schedule *s, double tf, double tb, double *busy_fraction,
                                  double *makespan) {
  if (!(tf >= 0) || !(tb >= 0) || !isfinite(tf) || !isfinite(tb) || tf + tb <= 0)
    return px_error(PX_ERR_INVALID,
                    "pipeline schedule simulate: costs tf %g and tb %g; expected finite, >= 0, not both 0", tf, tb);
  /* A table that does not pass the check has no timing. */
  px_status st = px_pp_schedule_check(s);
  if (st != PX_OK) return st;
  double *busy = malloc((size_t)s->p * sizeof *busy), span = 0;
  if (!busy) return px_error(PX_ERR_NOMEM, "pipeline schedule simulate: out of memory");
  if ((st = play(s, tf, tb, NULL, busy, &span)) == PX_OK) {
    if (busy_fraction)
      for (int r = 0; r < s->p; r++) busy_fraction[r] = span > 0 ? busy[r] / span : 0;
    if (makespan) *makespan = span;
  }
  free(busy);
  return st;
}

/* "F3.1", "B3.1", "sA3.1", "rA3.1", "sG3.1", "rG3.1", "OPT". */
static int label(const px_pp_action *a, char *buf, size_t cap) {
  static const char *const tag[] = {"F", "B", "sA", "rA", "sG", "rG", "OPT"};
  if (a->op == PX_PP_OPTIM_STEP) return snprintf(buf, cap, "OPT");
  if ((int)a->op < 0 || (int)a->op > PX_PP_OPTIM_STEP) return snprintf(buf, cap, "?");
  return snprintf(buf, cap, "%s%d.%d", tag[a->op], a->stage, a->micro);
}

/* One row per unit time slot (tf = tb = 1): a rank's cell holds the compute
 * it runs in that slot, preceded by the receives it waits for first and
 * followed by the sends that go out when it ends; a last row holds the
 * optimizer steps. */
void px_pp_schedule_print(const px_pp_schedule *s, FILE *out) {
  if (!out) return;
  if (px_pp_schedule_check(s) != PX_OK) {
    fprintf(out, "(not a valid schedule: %s)\n", px_last_error());
    return;
  }
  int p = s->p;
  double **start = calloc((size_t)p, sizeof *start);
  int **row = calloc((size_t)p, sizeof *row);
  double *busy = malloc((size_t)p * sizeof *busy), span = 0;
  bool ok = start && row && busy;
  for (int r = 0; ok && r < p; r++) {
    start[r] = malloc(((size_t)s->n_actions[r] + 1) * sizeof **start);
    row[r] = malloc(((size_t)s->n_actions[r] + 1) * sizeof **row);
    ok = start[r] && row[r];
  }
  if (!ok || play(s, 1, 1, start, busy, &span) != PX_OK) {
    fprintf(out, "(cannot lay out the schedule: out of memory)\n");
    goto done;
  }
  int slots = (int)llround(span);
  /* Rows: a compute in the slot it starts; a send in the row of the
   * compute before it (the one that made its data); a receive in the row
   * of the compute after it; OPT in row `slots`. */
  for (int r = 0; r < p; r++) {
    int n = s->n_actions[r], last = 0;
    for (int k = 0; k < n; k++) {
      px_pp_op op = s->actions[r][k].op;
      if (op == PX_PP_FORWARD || op == PX_PP_BACKWARD) last = row[r][k] = (int)llround(start[r][k]);
      else if (op == PX_PP_OPTIM_STEP) row[r][k] = slots;
      else row[r][k] = op == PX_PP_SEND_ACT || op == PX_PP_SEND_GRAD ? last : -1;
    }
    for (int k = n - 1, next = slots; k >= 0; k--) {
      if (row[r][k] >= 0 && s->actions[r][k].op != PX_PP_SEND_ACT && s->actions[r][k].op != PX_PP_SEND_GRAD)
        next = row[r][k];
      if (row[r][k] < 0) row[r][k] = next;
    }
  }
  /* The width of the widest cell: the labels of a row, space-separated. */
  int width = 6;
  char cell[512], lab[32];
  int *len_row = malloc(((size_t)slots + 1) * sizeof *len_row);
  if (!len_row) goto done;
  for (int r = 0; r < p; r++) {
    for (int t = 0; t <= slots; t++) len_row[t] = -1;
    for (int k = 0; k < s->n_actions[r]; k++) {
      int *len = &len_row[row[r][k]];
      *len += 1 + label(&s->actions[r][k], lab, sizeof lab);
      if (*len > width) width = *len;
    }
  }
  free(len_row);
  if (width > (int)sizeof cell - 1) width = (int)sizeof cell - 1;
  fprintf(out, "schedule %s: %d pipeline rank(s), %d micro-batch(es), %d stage(s) (stage s on rank s mod %d)\n",
          px_pp_kind_name(s->kind), p, s->m, p * s->v, p);
  fprintf(out,
          "F3.1 = forward of stage 3 on micro-batch 1, B backward, sA/rA send/receive activation, "
          "sG/rG send/receive gradient, OPT optimizer step; one row per slot of tf = tb = 1\n\n");
  fprintf(out, "slot ");
  for (int r = 0; r < p; r++) {
    snprintf(lab, sizeof lab, "rank %d", r);
    fprintf(out, " | %-*s", width, lab);
  }
  fprintf(out, "\n-----");
  for (int r = 0; r < p; r++) {
    fprintf(out, "-+-");
    for (int j = 0; j < width; j++) fputc('-', out);
  }
  fputc('\n', out);
  for (int t = 0; t <= slots; t++) {
    if (t == slots) fprintf(out, "step ");
    else fprintf(out, "%4d ", t);
    for (int r = 0; r < p; r++) {
      /* In action order; a send sits in the row of the compute that made
       * its data even when a receive of the next row precedes it (both
       * are posted at the same instant, the end of that compute). */
      size_t len = 0;
      cell[0] = '\0';
      for (int k = 0; k < s->n_actions[r]; k++) {
        if (row[r][k] != t) continue;
        label(&s->actions[r][k], lab, sizeof lab);
        len += (size_t)snprintf(cell + len, sizeof cell - len, "%s%s", len ? " " : "", lab);
        if (len >= sizeof cell) len = sizeof cell - 1;
      }
      fprintf(out, " | %-*s", width, len ? cell : ".");
    }
    fputc('\n', out);
  }
done:
  for (int r = 0; r < p; r++) {
    if (start) free(start[r]);
    if (row) free(row[r]);
  }
  free(start);
  free(row);
  free(busy);
}
