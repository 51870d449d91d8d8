/* px_pp_schedule_check refuses broken pipeline tables, naming the rank, the
 * action index and what is wrong: a missing receive, a missing send, sends
 * that cross (both neighbours send first: a deadlock when sends block until
 * received), a backward before its forward, a forward before its
 * activation arrived, a wrong peer, a duplicated forward, a stage on the
 * wrong rank and a missing optimizer step.  If this failed, a table that
 * hangs or loses a micro-batch would reach the executor.  The control: the
 * hand-written correct table passes. */
#include <stdio.h>
#include <string.h>

#include "px_test.h"

#define F(s, i) \
  { PX_PP_FORWARD, s, i, -1 }
#define B(s, i) \
  { PX_PP_BACKWARD, s, i, -1 }
#define SA(s, i, q) \
  { PX_PP_SEND_ACT, s, i, q }
#define RA(s, i, q) \
  { PX_PP_RECV_ACT, s, i, q }
#define SG(s, i, q) \
  { PX_PP_SEND_GRAD, s, i, q }
#define RG(s, i, q) \
  { PX_PP_RECV_GRAD, s, i, q }
#define OPT \
  { PX_PP_OPTIM_STEP, -1, -1, -1 }

/* 1F1B, p 2, m 2, every action blocking-safe. */
static const px_pp_action good0[] = {F(0, 0), SA(0, 0, 1), F(0, 1), SA(0, 1, 1), RG(0, 0, 1),
                                     B(0, 0), RG(0, 1, 1), B(0, 1), OPT};
static const px_pp_action good1[] = {RA(1, 0, 0), F(1, 0), RA(1, 1, 0), B(1, 0), SG(1, 0, 0),
                                     F(1, 1),     B(1, 1), SG(1, 1, 0), OPT};
/* The same micro-batches with Megatron's placement run one action at a
 * time: rank 0 sends micro 1's activation before receiving micro 0's
 * gradient, rank 1 sends that gradient before receiving the activation. */
static const px_pp_action cross0[] = {F(0, 0), SA(0, 0, 1), F(0, 1), SA(0, 1, 1), RG(0, 0, 1),
                                      B(0, 0), RG(0, 1, 1), B(0, 1), OPT};
static const px_pp_action cross1[] = {RA(1, 0, 0), F(1, 0), B(1, 0),     SG(1, 0, 0), RA(1, 1, 0),
                                      F(1, 1),     B(1, 1), SG(1, 1, 0), OPT};

typedef struct table {
  px_pp_action a[2][16];
  int n[2];
  px_pp_action *rows[2];
  px_pp_schedule s;
} table;

static void load(table *t, const px_pp_action *r0, int n0, const px_pp_action *r1, int n1) {
  memcpy(t->a[0], r0, (size_t)n0 * sizeof *r0);
  memcpy(t->a[1], r1, (size_t)n1 * sizeof *r1);
  t->n[0] = n0;
  t->n[1] = n1;
  t->rows[0] = t->a[0];
  t->rows[1] = t->a[1];
  t->s = (px_pp_schedule){PX_PP_1F1B, 2, 2, 1, t->n, t->rows};
}

static void drop(table *t, int r, int k) {
  memmove(&t->a[r][k], &t->a[r][k + 1], (size_t)(t->n[r] - k - 1) * sizeof t->a[r][0]);
  t->n[r]--;
}

static void insert(table *t, int r, int k, px_pp_action x) {
  memmove(&t->a[r][k + 1], &t->a[r][k], (size_t)(t->n[r] - k) * sizeof t->a[r][0]);
  t->a[r][k] = x;
  t->n[r]++;
}

/* The table is refused and the message holds every one of the phrases. */
static void refused(const char *what, table *t, const char *const *phrases) {
  px_clear_error();
  px_status st = px_pp_schedule_check(&t->s);
  CHECK(st == PX_ERR_INVALID, "%s: check returned %s", what, px_status_name(st));
  for (; *phrases; phrases++)
    CHECK(strstr(px_last_error(), *phrases) != NULL, "%s: message lacks \"%s\": %s", what, *phrases, px_last_error());
  printf("%s -> %s\n", what, px_last_error());
}

#define N(x) ((int)(sizeof x / sizeof x[0]))
#define PHRASES(...) ((const char *const[]){__VA_ARGS__, NULL})

int main(void) {
  table t;
  load(&t, good0, N(good0), good1, N(good1));
  CHECK(px_pp_schedule_check(&t.s) == PX_OK, "the correct table: %s", px_last_error());

  load(&t, good0, N(good0), good1, N(good1));
  drop(&t, 1, 2); /* rank 1 no longer receives micro 1's activation */
  refused("missing receive", &t,
          PHRASES("missing receive", "rank 1 has no RECV_ACT stage 1 micro 1", "rank 0 sends at action 3"));

  load(&t, good0, N(good0), good1, N(good1));
  drop(&t, 0, 3); /* rank 0 no longer sends it */
  refused("missing send", &t,
          PHRASES("missing send", "rank 0 has no SEND_ACT stage 0 micro 1", "rank 1 receives at action 2"));

  load(&t, good0, N(good0), good1, N(good1));
  drop(&t, 1, 4); /* a gradient nobody sends */
  refused("missing gradient send", &t, PHRASES("missing send", "rank 1 has no SEND_GRAD stage 1 micro 0"));

  load(&t, cross0, N(cross0), cross1, N(cross1));
  refused("crossed blocking sends", &t,
          PHRASES("deadlock", "rank 0 at action 3 (SEND_ACT stage 0 micro 1 to rank 1) waits for rank 1",
                  "rank 1 at action 3 (SEND_GRAD stage 1 micro 0 to rank 0) waits for rank 0"));

  load(&t, good0, N(good0), good1, N(good1));
  t.a[1][5] = (px_pp_action)B(1, 1); /* swap F(1,1) and B(1,1) */
  t.a[1][6] = (px_pp_action)F(1, 1);
  refused("backward before forward", &t,
          PHRASES("rank 1, action 5 (BACKWARD stage 1 micro 1)", "backward before its forward"));

  load(&t, good0, N(good0), good1, N(good1));
  t.a[1][0] = (px_pp_action)F(1, 0); /* swap RA(1,0) and F(1,0) */
  t.a[1][1] = (px_pp_action)RA(1, 0, 0);
  refused("forward before its activation", &t,
          PHRASES("rank 1, action 0 (FORWARD stage 1 micro 0)", "before its activation arrived"));

  load(&t, good0, N(good0), good1, N(good1));
  t.a[0][4] = (px_pp_action)B(0, 0); /* backward before the gradient arrived */
  t.a[0][5] = (px_pp_action)RG(0, 0, 1);
  refused("backward before its gradient", &t,
          PHRASES("rank 0, action 4 (BACKWARD stage 0 micro 0)", "before its gradient arrived"));

  load(&t, good0, N(good0), good1, N(good1));
  t.a[0][1].peer = 0; /* an activation sent to itself */
  refused("wrong peer", &t,
          PHRASES("rank 0, action 1 (SEND_ACT stage 0 micro 0 to rank 0)", "wrong peer", "on rank 1"));

  load(&t, good0, N(good0), good1, N(good1));
  insert(&t, 0, 1, (px_pp_action)F(0, 0)); /* micro 0 forwarded twice */
  refused("duplicated forward", &t,
          PHRASES("rank 0, action 1 (FORWARD stage 0 micro 0)", "done twice", "first at action 0"));

  load(&t, good0, N(good0), good1, N(good1));
  t.a[0][2].stage = 1; /* stage 1 is rank 1's */
  refused("stage on the wrong rank", &t, PHRASES("rank 0, action 2", "stage 1 lives on rank 1"));

  load(&t, good0, N(good0), good1, N(good1));
  drop(&t, 0, 7); /* no backward of micro 1 on rank 0: its gradient arrives for nothing */
  refused("a backward never run", &t, PHRASES("rank 0 never runs BACKWARD stage 0 micro 1"));

  load(&t, good0, N(good0), good1, N(good1));
  t.n[1]--; /* no optimizer step on rank 1 */
  refused("missing optimizer step", &t, PHRASES("rank 1 has no OPTIM_STEP"));

  /* A generated table, then one action moved: it must be refused too (the
   * checker is not fooled by a table that is only slightly off). */
  px_pp_schedule *g = NULL;
  CHECK_OK(px_pp_schedule_make(PX_PP_INTERLEAVED, 2, 4, 2, &g));
  px_pp_action *row = g->actions[1];
  int k = 0;
  while (row[k].op != PX_PP_RECV_ACT) k++;
  px_pp_action recv = row[k];
  int f = k;
  while (!(row[f].op == PX_PP_FORWARD && row[f].stage == recv.stage && row[f].micro == recv.micro)) f++;
  memmove(&row[k], &row[k + 1], (size_t)(f - k) * sizeof *row); /* the receive after its forward */
  row[f] = recv;
  px_status st = px_pp_schedule_check(g);
  CHECK(st == PX_ERR_INVALID && strstr(px_last_error(), "before its activation arrived"), "moved receive: %s",
        px_last_error());
  px_pp_schedule_free(g);
  return px_test_finish("test_pp_schedule_checker_refuses_broken_tables");
}
