// plexus plot: training curves of one or more runs, from each run's
// metrics.jsonl (docs/LOGGING.md), into a PNG and an SVG drawn with cairo.
//
//   plexus plot runs/a runs/b --out curves      -> curves.png, curves.svg
//
// One panel per quantity that some run logged (train loss, eval loss, eval
// accuracy, eval perplexity, learning rate), step on the x axis, one curve
// per run in its own colour (a single stroked path per run per panel), and
// a legend with the run names.  Built only when CMake finds cairo.
#define _POSIX_C_SOURCE 200809L /* getline */
#include "app.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { Q_TRAIN_LOSS, Q_EVAL_LOSS, Q_EVAL_ACC, Q_EVAL_PPL, Q_LR, Q_COUNT };
static const char *const q_title[Q_COUNT] = {"train loss", "eval loss", "eval accuracy", "eval perplexity",
                                             "learning rate"};

typedef struct series {
  double *x, *y;
  size_t n, cap;
} series;

typedef struct run {
  char name[256];
  series q[Q_COUNT];
} run;

/* Matplotlib's tab10, the colours a reader of other tools' plots expects. */
static const double palette[10][3] = {{31, 119, 180}, {255, 127, 14},  {44, 160, 44},   {214, 39, 40},  {148, 103, 189},
                                      {140, 86, 75},  {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}};

static int series_push(series *s, double x, double y) {
  if (s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    double *nx = realloc(s->x, cap * sizeof *nx);
    if (!nx) return 0;
    s->x = nx;
    double *ny = realloc(s->y, cap * sizeof *ny);
    if (!ny) return 0;
    s->y = ny;
    s->cap = cap;
  }
  s->x[s->n] = x;
  s->y[s->n] = y;
  s->n++;
  return 1;
}

/* A finite number field of o, or NAN (absent, null: JSON has no NaN). */
static double num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) && isfinite(v->valuedouble) ? v->valuedouble : NAN;
}

static int add_point(run *r, int q, double x, double y) {
  if (!isfinite(x) || !isfinite(y)) return 1;
  return series_push(&r->q[q], x, y);
}

/* Read RUN/metrics.jsonl (or RUN itself when it is a file). */
static int read_run(const char *path, run *r) {
  char file[1024];
  FILE *f = NULL;
  size_t len = strlen(path);
  while (len > 1 && path[len - 1] == '/') len--;
  snprintf(file, sizeof file, "%.*s/metrics.jsonl", (int)len, path);
  f = fopen(file, "r");
  if (!f && len > 6 && strcmp(path + len - 6, ".jsonl") == 0) {
    snprintf(file, sizeof file, "%.*s", (int)len, path);
    f = fopen(file, "r");
  }
  if (!f) {
    fprintf(stderr, "plexus plot: cannot open %s: %s (expected a run directory of plexus train --out)\n", file,
            strerror(errno));
    return 0;
  }
  /* The legend name: the run directory's last component. */
  const char *base = path;
  for (size_t i = 0; i < len; i++)
    if (path[i] == '/') base = path + i + 1;
  snprintf(r->name, sizeof r->name, "%.*s", (int)(len - (size_t)(base - path)), base);
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  long lineno = 0;
  int ok = 1;
  while (ok && (got = getline(&line, &cap, f)) >= 0) {
    lineno++;
    if (got == 0 || line[0] == '\n') continue;
    cJSON *o = cJSON_Parse(line);
    if (!o) {
      /* A run killed mid-write may leave a truncated last line: skip it. */
      fprintf(stderr, "plexus plot: %s:%ld: not a JSON object, skipped\n", file, lineno);
      continue;
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(o, "type");
    double step = num(o, "step");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "step") == 0) {
      ok = add_point(r, Q_TRAIN_LOSS, step, num(o, "loss")) && add_point(r, Q_LR, step, num(o, "lr"));
    } else if (cJSON_IsString(type) && strcmp(type->valuestring, "eval") == 0) {
      ok = add_point(r, Q_EVAL_LOSS, step, num(o, "loss")) && add_point(r, Q_EVAL_ACC, step, num(o, "accuracy")) &&
        add_point(r, Q_EVAL_PPL, step, num(o, "perplexity"));
    }
    cJSON_Delete(o);
  }
  free(line);
  fclose(f);
  if (!ok) fprintf(stderr, "plexus plot: out of memory reading %s\n", file);
  return ok;
}

/* Tick spacing: 1, 2 or 5 times a power of ten, about `want` ticks. */
static double nice_step(double span, int want) {
  if (!(span > 0)) return 1;
  double raw = span / want, p = pow(10, floor(log10(raw))), m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void text_at(cairo_t *cr, double x, double y, const char *s, double ax, double ay) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s, &e);
  cairo_move_to(cr, x - ax * e.width - e.x_bearing, y + ay * e.height);
  cairo_show_text(cr, s);
}

enum { W_PANEL = 520, H_PANEL = 300, MARGIN_L = 70, MARGIN_R = 20, MARGIN_T = 30, MARGIN_B = 40, LEGEND_H = 34 };

static void draw_panel(cairo_t *cr, double x0, double y0, int q, const run *runs, int nruns) {
  double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
  for (int r = 0; r < nruns; r++)
    for (size_t i = 0; i < runs[r].q[q].n; i++) {
      xmin = fmin(xmin, runs[r].q[q].x[i]), xmax = fmax(xmax, runs[r].q[q].x[i]);
      ymin = fmin(ymin, runs[r].q[q].y[i]), ymax = fmax(ymax, runs[r].q[q].y[i]);
    }
  if (xmax <= xmin) xmin -= 1, xmax += 1;
  if (ymax <= ymin) {
    double d = ymin != 0 ? fabs(ymin) * 0.1 : 1;
    ymin -= d, ymax += d;
  }
  double pad = (ymax - ymin) * 0.05;
  ymin -= pad, ymax += pad;
  double px = x0 + MARGIN_L, py = y0 + MARGIN_T;
  double pw = W_PANEL - MARGIN_L - MARGIN_R, ph = H_PANEL - MARGIN_T - MARGIN_B;
#define SX(v) (px + ((v)-xmin) / (xmax - xmin) * pw)
#define SY(v) (py + ph - ((v)-ymin) / (ymax - ymin) * ph)
  cairo_set_font_size(cr, 11);
  char buf[64];
  /* Grid and tick labels. */
  /* Steps are integers: no tick between two. */
  double xs = fmax(1, nice_step(xmax - xmin, 6)), ys = nice_step(ymax - ymin, 5);
  cairo_set_line_width(cr, 1);
  for (double t = ceil(xmin / xs) * xs; t <= xmax + xs * 1e-9; t += xs) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, SX(t), py);
    cairo_line_to(cr, SX(t), py + ph);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    snprintf(buf, sizeof buf, "%.6g", fabs(t) < xs * 1e-9 ? 0.0 : t);
    text_at(cr, SX(t), py + ph + 6, buf, 0.5, 1);
  }
  for (double t = ceil(ymin / ys) * ys; t <= ymax + ys * 1e-9; t += ys) {
    cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
    cairo_move_to(cr, px, SY(t));
    cairo_line_to(cr, px + pw, SY(t));
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    snprintf(buf, sizeof buf, "%.4g", fabs(t) < ys * 1e-9 ? 0.0 : t);
    text_at(cr, px - 6, SY(t), buf, 1, 0.5);
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  cairo_rectangle(cr, px, py, pw, ph);
  cairo_stroke(cr);
  cairo_set_font_size(cr, 13);
  text_at(cr, px + pw / 2, y0 + 8, q_title[q], 0.5, 1);
  cairo_set_font_size(cr, 11);
  text_at(cr, px + pw / 2, py + ph + 22, "step", 0.5, 1);
  /* The curves: one path per run, clipped to the plot area. */
  cairo_save(cr);
  cairo_rectangle(cr, px, py, pw, ph);
  cairo_clip(cr);
  cairo_set_line_width(cr, 2);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  for (int r = 0; r < nruns; r++) {
    const series *s = &runs[r].q[q];
    if (s->n == 0) continue;
    const double *c = palette[r % 10];
    cairo_set_source_rgb(cr, c[0] / 255, c[1] / 255, c[2] / 255);
    cairo_move_to(cr, SX(s->x[0]), SY(s->y[0]));
    for (size_t i = 1; i < s->n; i++) cairo_line_to(cr, SX(s->x[i]), SY(s->y[i]));
    if (s->n == 1) { /* one point: a round dot (a zero-length stroke with round caps) */
      cairo_set_line_width(cr, 7);
      cairo_set_line_cap(cr, CAIRO_LINE_CAP_ROUND);
      cairo_line_to(cr, SX(s->x[0]), SY(s->y[0]));
    }
    cairo_stroke(cr);
    cairo_set_line_width(cr, 2);
    cairo_set_line_cap(cr, CAIRO_LINE_CAP_BUTT);
  }
  cairo_restore(cr);
#undef SX
#undef SY
}

/* The whole figure: a legend across the top, panels two to a row. */
static void draw(cairo_t *cr, const int *panels, int npanels, const run *runs, int nruns, int w, int h) {
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, 12);
  double lx = MARGIN_L;
  for (int r = 0; r < nruns; r++) {
    const double *c = palette[r % 10];
    /* A filled swatch, not a stroke: the strokes are the curves. */
    cairo_set_source_rgb(cr, c[0] / 255, c[1] / 255, c[2] / 255);
    cairo_rectangle(cr, lx, 13, 22, 6);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0, 0, 0);
    cairo_text_extents_t e;
    cairo_text_extents(cr, runs[r].name, &e);
    text_at(cr, lx + 28, 16, runs[r].name, 0, 0.5);
    lx += 28 + e.x_advance + 24;
  }
  (void)w, (void)h;
  for (int i = 0; i < npanels; i++)
    draw_panel(cr, (i % 2) * W_PANEL, LEGEND_H + (i / 2) * H_PANEL, panels[i], runs, nruns);
}

static void plot_usage(FILE *f) {
  fprintf(f,
          "usage: plexus plot RUN... [--out FILE]\n"
          "\n"
          "Draws the training curves of the runs (directories of plexus train --out, read from their\n"
          "metrics.jsonl) into FILE.png and FILE.svg: train loss, eval loss, eval accuracy or perplexity\n"
          "and learning rate against step, one panel each (those some run logged), one curve per run,\n"
          "a legend with the run names (the directories' last components).\n"
          "\n"
          "  --out FILE   where to write (a .png or .svg ending is dropped; default: plot in the\n"
          "               current directory, i.e. plot.png and plot.svg)\n");
}

int px_cmd_plot(int argc, char **argv) {
  const char *out = "plot";
  const char **paths = calloc((size_t)argc, sizeof *paths);
  int npaths = 0, rc = 1;
  run *runs = NULL;
  if (!paths) return 1;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      plot_usage(stdout);
      free(paths);
      return 0;
    } else if (strcmp(argv[i], "--out") == 0) {
      if (i + 1 >= argc) {
        fprintf(stderr, "plexus plot: --out needs a file name\n");
        free(paths);
        return 2;
      }
      out = argv[++i];
    } else if (strncmp(argv[i], "--out=", 6) == 0) {
      out = argv[i] + 6;
    } else if (argv[i][0] == '-' && argv[i][1] == '-') {
      fprintf(stderr, "plexus plot: unknown option \"%s\"\n", argv[i]);
      plot_usage(stderr);
      free(paths);
      return 2;
    } else {
      paths[npaths++] = argv[i];
    }
  }
  if (npaths == 0) {
    fprintf(stderr, "plexus plot: expected at least one run directory\n");
    plot_usage(stderr);
    free(paths);
    return 2;
  }
  runs = calloc((size_t)npaths, sizeof *runs);
  if (!runs) goto done;
  for (int r = 0; r < npaths; r++)
    if (!read_run(paths[r], &runs[r])) goto done;
  int panels[Q_COUNT], npanels = 0;
  for (int q = 0; q < Q_COUNT; q++) {
    size_t n = 0;
    for (int r = 0; r < npaths; r++) n += runs[r].q[q].n;
    if (n) panels[npanels++] = q;
  }
  if (npanels == 0) {
    fprintf(stderr, "plexus plot: no step or eval records with numbers in %s%s\n", paths[0],
            npaths > 1 ? " or the other runs" : "");
    goto done;
  }
  int w = (npanels > 1 ? 2 : 1) * W_PANEL, h = LEGEND_H + ((npanels + 1) / 2) * H_PANEL;
  char base[1024], png[1100], svg[1100];
  size_t ol = strlen(out);
  if (ol > 4 && (strcmp(out + ol - 4, ".png") == 0 || strcmp(out + ol - 4, ".svg") == 0)) ol -= 4;
  snprintf(base, sizeof base, "%.*s", (int)ol, out);
  snprintf(png, sizeof png, "%s.png", base);
  snprintf(svg, sizeof svg, "%s.svg", base);

  cairo_surface_t *img = cairo_image_surface_create(CAIRO_FORMAT_ARGB32, w, h);
  cairo_t *cr = cairo_create(img);
  draw(cr, panels, npanels, runs, npaths, w, h);
  cairo_destroy(cr);
  cairo_status_t st = cairo_surface_write_to_png(img, png);
  cairo_surface_destroy(img);
  if (st != CAIRO_STATUS_SUCCESS) {
    fprintf(stderr, "plexus plot: cannot write %s: %s\n", png, cairo_status_to_string(st));
    goto done;
  }
  cairo_surface_t *vec = cairo_svg_surface_create(svg, w, h);
  cr = cairo_create(vec);
  draw(cr, panels, npanels, runs, npaths, w, h);
  cairo_destroy(cr);
  cairo_surface_finish(vec);
  st = cairo_surface_status(vec);
  cairo_surface_destroy(vec);
  if (st != CAIRO_STATUS_SUCCESS) {
    fprintf(stderr, "plexus plot: cannot write %s: %s\n", svg, cairo_status_to_string(st));
    goto done;
  }
  printf("plexus plot: %d run(s), %d panel(s) -> %s, %s\n", npaths, npanels, png, svg);
  rc = 0;
done:
  if (runs)
    for (int r = 0; r < npaths; r++)
      for (int q = 0; q < Q_COUNT; q++) free(runs[r].q[q].x), free(runs[r].q[q].y);
  free(runs);
  free(paths);
  cairo_debug_reset_static_data(); /* cairo's font caches (fontconfig keeps its own until exit) */
  return rc;
}
