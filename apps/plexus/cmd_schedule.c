// plexus schedule: print a pipeline schedule's per-rank action table and
// its simulated bubble against the formula (plexus/pipeline.h).
//
//   plexus schedule --pp 4 --micro-batches 8 --schedule-pp 1f1b
//   plexus schedule --pp 2 --micro-batches 4 --schedule-pp interleaved --virtual 2
#include "app.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void schedule_usage(FILE *f) {
  fprintf(f,
          "usage: plexus schedule --pp P --micro-batches M [--schedule-pp gpipe|1f1b|interleaved]\n"
          "                       [--virtual V] [--tf T] [--tb T] [--list] [--no-table]\n"
          "\n"
          "Generates the pipeline schedule every rank would run, checks it by simulation (every send\n"
          "has its receive, no cycle of waits even when every send blocks), prints it as a table with\n"
          "one column per pipeline rank and one row per time slot, and the simulated bubble of each\n"
          "rank against (p-1)/(m+p-1) (gpipe, 1f1b) or (p-1)/(v*m+p-1) (interleaved).\n"
          "\n"
          "  --pp P               pipeline ranks (>= 1)\n"
          "  --micro-batches M    micro-batches per step (>= 1; a multiple of P for interleaved)\n"
          "  --schedule-pp KIND   gpipe, 1f1b or interleaved (default 1f1b)\n"
          "  --virtual V          model chunks per rank, interleaved only (default 1)\n"
          "  --tf T, --tb T       forward and backward cost of one stage on one micro-batch for the\n"
          "                       simulated bubble (default 1 and 1; the table's slots are always 1)\n"
          "  --list               also print each rank's actions in order, one a line\n"
          "  --no-table           print only the bubble\n");
}

static int parse_int(const char *flag, const char *v, int *out) {
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (*v == '\0' || *end || errno || x < 1 || x > 1000000) {
    fprintf(stderr, "plexus schedule: %s: expected a positive integer, got \"%s\"\n", flag, v);
    return 0;
  }
  *out = (int)x;
  return 1;
}

static int parse_cost(const char *flag, const char *v, double *out) {
  char *end;
  errno = 0;
  double x = strtod(v, &end);
  if (*v == '\0' || *end || errno || !isfinite(x) || x < 0) {
    fprintf(stderr, "plexus schedule: %s: expected a non-negative number, got \"%s\"\n", flag, v);
    return 0;
  }
  *out = x;
  return 1;
}

int px_cmd_schedule(int argc, char **argv) {
  int p = 0, m = 0, v = 1, list = 0, table = 1;
  double tf = 1, tb = 1;
  const char *kind_name = "1f1b";
  for (int a = 1; a < argc; a++) {
    const char *arg = argv[a];
    if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
      schedule_usage(stdout);
      return 0;
    }
    if (strcmp(arg, "--list") == 0) {
      list = 1;
      continue;
    }
    if (strcmp(arg, "--no-table") == 0) {
      table = 0;
      continue;
    }
    if (a + 1 >= argc) {
      fprintf(stderr, "plexus schedule: %s needs a value (see --help)\n", arg);
      return 2;
    }
    const char *val = argv[++a];
    int ok = 1;
    if (strcmp(arg, "--pp") == 0) ok = parse_int(arg, val, &p);
    else if (strcmp(arg, "--micro-batches") == 0) ok = parse_int(arg, val, &m);
    else if (strcmp(arg, "--virtual") == 0) ok = parse_int(arg, val, &v);
    else if (strcmp(arg, "--schedule-pp") == 0) kind_name = val;
    else if (strcmp(arg, "--tf") == 0) ok = parse_cost(arg, val, &tf);
    else if (strcmp(arg, "--tb") == 0) ok = parse_cost(arg, val, &tb);
    else {
      fprintf(stderr, "plexus schedule: unknown option %s (see --help)\n", arg);
      return 2;
    }
    if (!ok) return 2;
  }
  if (p < 1 || m < 1) {
    fprintf(stderr, "plexus schedule: --pp and --micro-batches are required\n");
    schedule_usage(stderr);
    return 2;
  }
  px_pp_kind kind;
  if (px_pp_kind_parse(kind_name, &kind) != PX_OK) return px_app_fail("schedule");
  px_pp_schedule *s = NULL;
  if (px_pp_schedule_make(kind, p, m, v, &s) != PX_OK) return px_app_fail("schedule");
  if (table) {
    px_pp_schedule_print(s, stdout);
    printf("\n");
  }
  if (list) {
    for (int r = 0; r < p; r++) {
      printf("rank %d: %d actions\n", r, s->n_actions[r]);
      for (int k = 0; k < s->n_actions[r]; k++) {
        const px_pp_action *a = &s->actions[r][k];
        printf("  %4d %-10s", k, px_pp_op_name(a->op));
        if (a->op != PX_PP_OPTIM_STEP) printf(" stage %d micro %d", a->stage, a->micro);
        if (a->peer >= 0)
          printf(" %s rank %d", a->op == PX_PP_SEND_ACT || a->op == PX_PP_SEND_GRAD ? "to" : "from", a->peer);
        printf("\n");
      }
    }
    printf("\n");
  }
  double *busy = malloc((size_t)p * sizeof *busy), span = 0;
  if (!busy || px_pp_schedule_simulate(s, tf, tb, busy, &span) != PX_OK) {
    free(busy);
    px_pp_schedule_free(s);
    return px_app_fail("schedule");
  }
  double formula = px_pp_bubble_formula(kind, p, m, v);
  printf("bubble (idle share of the step), simulated with tf = %g, tb = %g, communication free:\n", tf, tb);
  printf("  formula %s = %.4f\n", kind == PX_PP_INTERLEAVED ? "(p-1)/(v*m+p-1)" : "(p-1)/(m+p-1)", formula);
  for (int r = 0; r < p; r++) printf("  rank %d: bubble %.4f\n", r, 1.0 - busy[r]);
  printf("makespan %g; compute per rank %g (%d stage(s) x %d micro-batch(es) x (tf + tb))\n", span,
         (double)v * m * (tf + tb), v, m);
  free(busy);
  px_pp_schedule_free(s);
  return 0;
}
