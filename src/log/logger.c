/* logger.c — the log layer: console lines or a live progress bar, JSONL
 * records, TensorBoard event files and user hooks.  Rank 0 writes; other
 * ranks hold a logger whose calls return PX_OK and do nothing.
 *
 * TensorBoard records are framed as TFRecord:
 *   uint64 len (LE) | uint32 masked_crc32c(len bytes) | data | uint32 masked_crc32c(data)
 * and `data` is a hand-encoded tensorboard.Event protobuf:
 *   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
 *   Summary { repeated Value value = 1; }  Value { string tag = 1; float simple_value = 2; } */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "plexus/log.h"

#include <cJSON.h>

struct px_logger {
  bool active; /* rank 0 */
  bool console;
  bool bar;              /* redraw one line with \r */
  bool bar_open;         /* a bar line is on screen without its newline */
  double bar_drawn;      /* wall time of the last frame (px_log_progress: at most 10 a second) */
  px_step_metrics shown; /* the last full metrics (px_log_step): loss, lr, gnorm between them */
  bool have_shown;
  FILE *con;
  FILE *jsonl;
  char *jsonl_path;
  FILE *tb;
  char *tb_path;
  px_log_hooks hooks[PX_LOG_MAX_HOOKS];
  int n_hooks;
};

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char *dup_str(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

/* ---- protobuf encoding (only what Event needs) ------------------------- */

typedef struct pbuf {
  unsigned char b[1024];
  size_t n;
  bool overflow;
} pbuf;

static void pb_byte(pbuf *p, unsigned char c) {
  if (p->n < sizeof p->b) p->b[p->n++] = c;
  else p->overflow = true;
}
static void pb_varint(pbuf *p, uint64_t v) {
  while (v >= 0x80) {
    pb_byte(p, (unsigned char)(v | 0x80));
    v >>= 7;
  }
  pb_byte(p, (unsigned char)v);
}
static void pb_key(pbuf *p, unsigned field, unsigned wire) { pb_varint(p, ((uint64_t)field << 3) | wire); }
static void pb_bytes(pbuf *p, unsigned field, const void *d, size_t n) {
  pb_key(p, field, 2);
  pb_varint(p, n);
  for (size_t i = 0; i < n; i++) pb_byte(p, ((const unsigned char *)d)[i]);
}
static void pb_double(pbuf *p, unsigned field, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  pb_key(p, field, 1);
  for (int i = 0; i < 8; i++) pb_byte(p, (unsigned char)(u >> (8 * i)));
}
static void pb_float(pbuf *p, unsigned field, float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  pb_key(p, field, 5);
  for (int i = 0; i < 4; i++) pb_byte(p, (unsigned char)(u >> (8 * i)));
}

/* One TFRecord of n bytes. */
static px_status tb_write_bytes(px_logger *l, const unsigned char *data, size_t n) {
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)n >> (8 * i));
  uint32_t c1 = px_crc32c_masked(len, 8), c2 = px_crc32c_masked(data, n);
  unsigned char c1b[4], c2b[4];
  for (int i = 0; i < 4; i++) {
    c1b[i] = (unsigned char)(c1 >> (8 * i));
    c2b[i] = (unsigned char)(c2 >> (8 * i));
  }
  if (fwrite(len, 1, 8, l->tb) != 8 || fwrite(c1b, 1, 4, l->tb) != 4 || fwrite(data, 1, n, l->tb) != n ||
      fwrite(c2b, 1, 4, l->tb) != 4 || fflush(l->tb) != 0)
    return px_error(PX_ERR_IO, "tensorboard: %s: write failed: %s", l->tb_path, strerror(errno));
  return PX_OK;
}

static px_status tb_write_record(px_logger *l, const pbuf *ev) {
  if (ev->overflow)
    return px_error(PX_ERR_INVALID, "tensorboard: %s: event larger than %zu bytes (tag too long?)", l->tb_path,
                    sizeof ev->b);
  return tb_write_bytes(l, ev->b, ev->n);
}

/* ---- the HParams plugin's session-start record ------------------------------
 * A growable encoder: a run's hyperparameters can be kilobytes.  Field
 * numbers (tensorboard/plugins/hparams/plugin_data.proto, summary.proto,
 * tensor.proto, google/protobuf/struct.proto):
 *   Event        { wall_time = 1 (double); step = 2; summary = 5 }
 *   Summary      { repeated Value value = 1 }
 *   Value        { tag = 1 "_hparams_/session_start_info"; tensor = 8; metadata = 9 }
 *   TensorProto  { dtype = 1 (DT_FLOAT = 1); tensor_shape = 2 (scalar: empty); float_val = 5 (packed) }
 *   SummaryMetadata { plugin_data = 1 }   PluginData { plugin_name = 1 "hparams"; content = 2 (bytes) }
 *   HParamsPluginData { version = 1 (0, left out); session_start_info = 3 }
 *   SessionStartInfo  { map<string, google.protobuf.Value> hparams = 1; group_name = 4; start_time_secs = 5 }
 *   map entry    { key = 1; value = 2 }
 *   google.protobuf.Value { number_value = 2 (double); string_value = 3; bool_value = 4 } */
typedef struct dbuf {
  unsigned char *b;
  size_t n, cap;
  bool oom;
} dbuf;

static void db_put(dbuf *d, const void *src, size_t n) {
  if (d->oom) return;
  if (d->n + n > d->cap) {
    size_t cap = d->cap ? d->cap : 256;
    while (cap < d->n + n) cap *= 2;
    unsigned char *nb = realloc(d->b, cap);
    if (!nb) {
      d->oom = true;
      return;
    }
    d->b = nb;
    d->cap = cap;
  }
  memcpy(d->b + d->n, src, n);
  d->n += n;
}
static void db_varint(dbuf *d, uint64_t v) {
  unsigned char t[10];
  size_t k = 0;
  while (v >= 0x80) {
    t[k++] = (unsigned char)(v | 0x80);
    v >>= 7;
  }
  t[k++] = (unsigned char)v;
  db_put(d, t, k);
}
static void db_key(dbuf *d, unsigned field, unsigned wire) { db_varint(d, ((uint64_t)field << 3) | wire); }
static void db_bytes(dbuf *d, unsigned field, const void *p, size_t n) {
  db_key(d, field, 2);
  db_varint(d, n);
  if (n) db_put(d, p, n);
}
static void db_msg(dbuf *d, unsigned field, dbuf *m) {
  if (m->oom) d->oom = true;
  db_bytes(d, field, m->b, m->n);
  free(m->b);
  *m = (dbuf){0};
}
static void db_double(dbuf *d, unsigned field, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  unsigned char t[8];
  for (int i = 0; i < 8; i++) t[i] = (unsigned char)(u >> (8 * i));
  db_key(d, field, 1);
  db_put(d, t, 8);
}

/* One map entry of SessionStartInfo.hparams per scalar of j, nested
 * objects flattened with "." ("optim.lr"); arrays become their JSON text,
 * nulls are left out. */
static void hparams_entries(dbuf *info, const cJSON *j, const char *prefix) {
  for (const cJSON *it = j->child; it; it = it->next) {
    if (!it->string) continue;
    size_t kn = strlen(prefix) + strlen(it->string) + 2;
    char *key = malloc(kn);
    if (!key) {
      info->oom = true;
      return;
    }
    snprintf(key, kn, "%s%s%s", prefix, *prefix ? "." : "", it->string);
    if (cJSON_IsObject(it)) {
      hparams_entries(info, it, key);
      free(key);
      continue;
    }
    dbuf val = {0}, entry = {0};
    char *text = NULL;
    if (cJSON_IsBool(it)) {
      db_key(&val, 4, 0);
      db_varint(&val, cJSON_IsTrue(it) ? 1 : 0);
    } else if (cJSON_IsNumber(it)) {
      db_double(&val, 2, it->valuedouble);
    } else if (cJSON_IsString(it)) {
      db_bytes(&val, 3, it->valuestring, strlen(it->valuestring));
    } else if (cJSON_IsArray(it) && (text = cJSON_PrintUnformatted(it)) != NULL) {
      db_bytes(&val, 3, text, strlen(text));
      cJSON_free(text);
    } else {
      free(key);
      continue; /* null */
    }
    db_bytes(&entry, 1, key, strlen(key));
    db_msg(&entry, 2, &val);
    db_msg(info, 1, &entry);
    free(key);
  }
}

/* One Event holding up to n scalar values at `step`. */
static px_status tb_scalars(px_logger *l, int64_t step, const char *const *tags, const double *vals, int n) {
  if (!l->tb) return PX_OK;
  pbuf summary = {0}, ev = {0};
  int kept = 0;
  for (int i = 0; i < n; i++) {
    if (!isfinite(vals[i])) continue; /* NAN: "not measured"; skip rather than plot garbage */
    pbuf val = {0};
    pb_bytes(&val, 1, tags[i], strlen(tags[i]));
    pb_float(&val, 2, (float)vals[i]);
    if (val.overflow) return px_error(PX_ERR_INVALID, "tensorboard: tag '%.40s...' is too long", tags[i]);
    pb_bytes(&summary, 1, val.b, val.n);
    kept++;
  }
  if (kept == 0) return PX_OK;
  pb_double(&ev, 1, wall_now());
  pb_key(&ev, 2, 0);
  pb_varint(&ev, (uint64_t)step);
  pb_bytes(&ev, 5, summary.b, summary.n);
  if (summary.overflow) ev.overflow = true;
  return tb_write_record(l, &ev);
}

static px_status tb_open(px_logger *l, const char *dir) {
  px_status s = px_mkdir_p(dir, "tensorboard", false);
  if (s != PX_OK) return s;
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
  host[sizeof host - 1] = '\0';
  size_t n = strlen(dir) + strlen(host) + 96;
  l->tb_path = malloc(n);
  if (!l->tb_path) return px_error(PX_ERR_NOMEM, "tensorboard: out of memory");
  snprintf(l->tb_path, n, "%s/events.out.tfevents.%lld.%s.%ld", dir, (long long)time(NULL), host, (long)getpid());
  l->tb = fopen(l->tb_path, "ab");
  if (!l->tb) return px_error(PX_ERR_IO, "tensorboard: cannot open %s for writing: %s", l->tb_path, strerror(errno));
  pbuf ev = {0};
  pb_double(&ev, 1, wall_now());
  pb_bytes(&ev, 3, "brain.Event:2", 13);
  return tb_write_record(l, &ev);
}

/* ---- JSONL --------------------------------------------------------------- */

/* JSON has no NaN/Infinity: non-finite numbers are written as null. */
static void json_num(FILE *f, const char *key, double v) {
  if (isfinite(v)) fprintf(f, ",\"%s\":%.9g", key, v);
  else fprintf(f, ",\"%s\":null", key);
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
    else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
    else fputc(*p, f);
  }
  fputc('"', f);
}

static px_status json_end(px_logger *l) {
  fprintf(l->jsonl, ",\"time\":%.6f}\n", wall_now());
  if (fflush(l->jsonl) != 0 || ferror(l->jsonl))
    return px_error(PX_ERR_IO, "jsonl: %s: write failed: %s", l->jsonl_path, strerror(errno));
  return PX_OK;
}

/* ---- console --------------------------------------------------------------- */

static void fmt_hms(char *buf, size_t n, double s) {
  if (!isfinite(s) || s < 0) {
    snprintf(buf, n, "-:--:--");
    return;
  }
  long long t = (long long)(s + 0.5);
  snprintf(buf, n, "%lld:%02lld:%02lld", t / 3600, (t / 60) % 60, t % 60);
}

/* Under a launcher (Open MPI, Hydra/PMI, PMIx, Slurm's srun) the output is
 * a log even when it looks like a terminal: Open MPI gives each rank a
 * pseudo-terminal when mpirun's own output is one, and a file behind
 * mpirun still reaches the rank through it.  A bar there would fill the
 * log with carriage returns and escape codes. */
static bool under_launcher(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++)
    if (getenv(vars[i])) return true;
  return false;
}

static bool is_terminal(FILE *f) {
  const char *term = getenv("TERM");
  return isatty(fileno(f)) && !(term && strcmp(term, "dumb") == 0);
}

static void bar_draw(px_logger *l, const px_step_metrics *m) {
  char eta[32], bar[32];
  fmt_hms(eta, sizeof eta, m->eta_s);
  const int w = 20;
  int fill = m->total_steps > 0 ? (int)(w * (double)m->step / (double)m->total_steps) : 0;
  if (fill > w) fill = w;
  if (fill < 0) fill = 0;
  for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
  bar[w] = '\0';
  /* Before the first record the loss and norm are not known yet: "-". */
  char loss[32] = "-", gnorm[32] = "-";
  if (isfinite(m->loss)) snprintf(loss, sizeof loss, "%.4f", m->loss);
  if (isfinite(m->grad_norm)) snprintf(gnorm, sizeof gnorm, "%.3g", m->grad_norm);
  /* \033[K clears what a longer previous frame left behind. */
  fprintf(l->con, "\r[%s] %lld/%lld ep %lld/%lld loss %s lr %.3g gnorm %s %.1f samples/s eta %s\033[K", bar,
          (long long)m->step, (long long)m->total_steps, (long long)m->epoch, (long long)m->total_epochs, loss, m->lr,
          gnorm, m->samples_per_s, eta);
  l->bar_open = true;
  l->bar_drawn = wall_now();
  fflush(l->con);
}

/* End a bar line so the next text starts on a fresh line. */
static void bar_close(px_logger *l) {
  if (l->bar_open) {
    fputc('\n', l->con);
    l->bar_open = false;
  }
}

/* ---- public API ------------------------------------------------------------- */

px_status px_logger_create(px_logger **out, const px_logger_opts *opts) {
  if (!out || !opts) return px_error(PX_ERR_INVALID, "px_logger_create: NULL argument");
  *out = NULL;
  px_logger *l = calloc(1, sizeof *l);
  if (!l) return px_error(PX_ERR_NOMEM, "px_logger_create: out of memory");
  if (opts->rank != 0) {
    *out = l;
    return PX_OK;
  }
  l->active = true;
  l->console = opts->console;
  l->con = opts->console_stream ? opts->console_stream : stdout;
  l->bar = opts->progress == 1 || (opts->progress < 0 && is_terminal(l->con) && !under_launcher());
  if (opts->jsonl_path) {
    l->jsonl_path = dup_str(opts->jsonl_path);
    // The file's directory is made like the TensorBoard one (mkdir -p).
    const char *slash = strrchr(opts->jsonl_path, '/');
    if (slash && slash != opts->jsonl_path) {
      char *parent = dup_str(opts->jsonl_path);
      px_status s = parent ? PX_OK : px_error(PX_ERR_NOMEM, "jsonl: out of memory");
      if (parent) {
        parent[slash - opts->jsonl_path] = '\0';
        s = px_mkdir_p(parent, "jsonl", false);
        free(parent);
      }
      if (s != PX_OK) {
        px_logger_free(l);
        return s;
      }
    }
    l->jsonl = fopen(opts->jsonl_path, "a");
    if (!l->jsonl) {
      px_status s = px_error(PX_ERR_IO, "jsonl: cannot open %s for appending: %s", opts->jsonl_path, strerror(errno));
      px_logger_free(l);
      return s;
    }
  }
  if (opts->tensorboard_dir) {
    px_status s = tb_open(l, opts->tensorboard_dir);
    if (s != PX_OK) {
      px_logger_free(l);
      return s;
    }
  }
  if (l->console && opts->run_name) {
    fprintf(l->con, "== run %s ==\n", opts->run_name);
    fflush(l->con);
  }
  *out = l;
  return PX_OK;
}

px_status px_log_add_hooks(px_logger *l, const px_log_hooks *h) {
  if (!l || !h) return px_error(PX_ERR_INVALID, "px_log_add_hooks: NULL argument");
  if (l->n_hooks == PX_LOG_MAX_HOOKS)
    return px_error(PX_ERR_INVALID, "px_log_add_hooks: at most %d hook sets", PX_LOG_MAX_HOOKS);
  l->hooks[l->n_hooks++] = *h;
  return PX_OK;
}

px_status px_log_step(px_logger *l, const px_step_metrics *m) {
  if (!l || !m) return px_error(PX_ERR_INVALID, "px_log_step: NULL argument");
  if (!l->active) return PX_OK;
  if (l->console) {
    char eta[32];
    fmt_hms(eta, sizeof eta, m->eta_s);
    l->shown = *m;
    l->have_shown = true;
    if (l->bar) {
      bar_draw(l, m);
    } else {
      fprintf(l->con, "step %lld/%lld epoch %lld/%lld loss %.6f lr %.4g grad_norm %.4g samples/s %.1f eta %s\n",
              (long long)m->step, (long long)m->total_steps, (long long)m->epoch, (long long)m->total_epochs, m->loss,
              m->lr, m->grad_norm, m->samples_per_s, eta);
    }
    fflush(l->con);
  }
  px_status s = PX_OK;
  if (l->jsonl) {
    fprintf(l->jsonl, "{\"type\":\"step\",\"step\":%lld,\"total_steps\":%lld,\"epoch\":%lld", (long long)m->step,
            (long long)m->total_steps, (long long)m->epoch);
    json_num(l->jsonl, "loss", m->loss);
    json_num(l->jsonl, "lr", m->lr);
    json_num(l->jsonl, "grad_norm", m->grad_norm);
    json_num(l->jsonl, "samples_per_s", m->samples_per_s);
    json_num(l->jsonl, "eta_s", m->eta_s);
    s = json_end(l);
    if (s != PX_OK) return s;
  }
  static const char *const tags[4] = {"train/loss", "train/lr", "train/grad_norm", "train/samples_per_s"};
  const double vals[4] = {m->loss, m->lr, m->grad_norm, m->samples_per_s};
  s = tb_scalars(l, m->step, tags, vals, 4);
  if (s != PX_OK) return s;
  for (int i = 0; i < l->n_hooks; i++)
    if (l->hooks[i].on_step) l->hooks[i].on_step(m, l->hooks[i].user);
  return PX_OK;
}

px_status px_log_progress(px_logger *l, const px_step_metrics *m) {
  if (!l || !m) return px_error(PX_ERR_INVALID, "px_log_progress: NULL argument");
  if (!l->active || !l->console || !l->bar) return PX_OK;
  if (l->bar_open && wall_now() - l->bar_drawn < 0.1) return PX_OK;  // at most ~10 frames a second
  px_step_metrics f = *m;
  // Between px_log_step's records the bar keeps their loss, rate and norm.
  if (!isfinite(f.loss)) f.loss = l->have_shown ? l->shown.loss : NAN;
  if (!isfinite(f.lr)) f.lr = l->have_shown ? l->shown.lr : NAN;
  if (!isfinite(f.grad_norm)) f.grad_norm = l->have_shown ? l->shown.grad_norm : NAN;
  if (!isfinite(f.samples_per_s)) f.samples_per_s = l->have_shown ? l->shown.samples_per_s : NAN;
  bar_draw(l, &f);
  return PX_OK;
}

px_status px_log_eval(px_logger *l, const px_eval_metrics *m) {
  if (!l || !m) return px_error(PX_ERR_INVALID, "px_log_eval: NULL argument");
  if (!l->active) return PX_OK;
  if (l->console) {
    bar_close(l);
    fprintf(l->con, "eval step %lld epoch %lld loss %.6f", (long long)m->step, (long long)m->epoch, m->loss);
    if (isfinite(m->accuracy)) fprintf(l->con, " accuracy %.4f", m->accuracy);
    if (isfinite(m->perplexity)) fprintf(l->con, " perplexity %.4f", m->perplexity);
    fprintf(l->con, " samples %lld\n", (long long)m->samples);
    fflush(l->con);
  }
  px_status s;
  if (l->jsonl) {
    fprintf(l->jsonl, "{\"type\":\"eval\",\"step\":%lld,\"epoch\":%lld", (long long)m->step, (long long)m->epoch);
    json_num(l->jsonl, "loss", m->loss);
    json_num(l->jsonl, "accuracy", m->accuracy);
    json_num(l->jsonl, "perplexity", m->perplexity);
    fprintf(l->jsonl, ",\"samples\":%lld", (long long)m->samples);
    s = json_end(l);
    if (s != PX_OK) return s;
  }
  static const char *const tags[3] = {"eval/loss", "eval/accuracy", "eval/perplexity"};
  const double vals[3] = {m->loss, m->accuracy, m->perplexity};
  s = tb_scalars(l, m->step, tags, vals, 3);
  if (s != PX_OK) return s;
  for (int i = 0; i < l->n_hooks; i++)
    if (l->hooks[i].on_eval) l->hooks[i].on_eval(m, l->hooks[i].user);
  return PX_OK;
}

px_status px_log_epoch(px_logger *l, int64_t epoch, int64_t step) {
  if (!l) return px_error(PX_ERR_INVALID, "px_log_epoch: NULL logger");
  if (!l->active) return PX_OK;
  if (l->jsonl) {
    fprintf(l->jsonl, "{\"type\":\"epoch\",\"epoch\":%lld,\"step\":%lld", (long long)epoch, (long long)step);
    px_status s = json_end(l);
    if (s != PX_OK) return s;
  }
  for (int i = 0; i < l->n_hooks; i++)
    if (l->hooks[i].on_epoch) l->hooks[i].on_epoch(epoch, step, l->hooks[i].user);
  return PX_OK;
}

px_status px_log_scalar(px_logger *l, const char *tag, int64_t step, double value) {
  if (!l || !tag) return px_error(PX_ERR_INVALID, "px_log_scalar: NULL argument");
  if (!l->active) return PX_OK;
  if (l->jsonl) {
    fputs("{\"type\":\"scalar\",\"tag\":", l->jsonl);
    json_str(l->jsonl, tag);
    fprintf(l->jsonl, ",\"step\":%lld", (long long)step);
    json_num(l->jsonl, "value", value);
    px_status s = json_end(l);
    if (s != PX_OK) return s;
  }
  return tb_scalars(l, step, &tag, &value, 1);
}

px_status px_log_hparams(px_logger *l, const char *json_object, const char *group) {
  if (!l || !json_object) return px_error(PX_ERR_INVALID, "px_log_hparams: NULL argument");
  if (!l->active || !l->tb) return PX_OK;
  cJSON *j = cJSON_Parse(json_object);
  if (!j || !cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return px_error(PX_ERR_INVALID, "px_log_hparams: expected a JSON object of hyperparameters, got \"%.40s\"",
                    json_object);
  }
  double now = wall_now();
  dbuf info = {0}, plugin = {0}, pd = {0}, meta = {0}, tensor = {0}, shape = {0}, value = {0}, summary = {0}, ev = {0};
  hparams_entries(&info, j, "");
  cJSON_Delete(j);
  if (group && *group) db_bytes(&info, 4, group, strlen(group));
  db_double(&info, 5, now);
  db_msg(&plugin, 3, &info);      /* HParamsPluginData.session_start_info */
  db_bytes(&pd, 1, "hparams", 7); /* PluginData.plugin_name */
  db_msg(&pd, 2, &plugin);        /* PluginData.content */
  db_msg(&meta, 1, &pd);          /* SummaryMetadata.plugin_data */
  db_key(&tensor, 1, 0);          /* TensorProto.dtype = DT_FLOAT */
  db_varint(&tensor, 1);
  db_msg(&tensor, 2, &shape); /* a scalar */
  static const unsigned char zero_f32[4] = {0, 0, 0, 0};
  db_bytes(&tensor, 5, zero_f32, 4); /* float_val: [0] */
  static const char tag[] = "_hparams_/session_start_info";
  db_bytes(&value, 1, tag, sizeof tag - 1);
  db_msg(&value, 8, &tensor);
  db_msg(&value, 9, &meta);
  db_msg(&summary, 1, &value);
  db_double(&ev, 1, now);
  db_key(&ev, 2, 0);
  db_varint(&ev, 0);
  db_msg(&ev, 5, &summary);
  px_status s = ev.oom ? px_error(PX_ERR_NOMEM, "tensorboard: %s: out of memory encoding hparams", l->tb_path)
                       : tb_write_bytes(l, ev.b, ev.n);
  free(ev.b);
  return s;
}

px_status px_log_text(px_logger *l, const char *fmt, ...) {
  if (!l || !fmt) return px_error(PX_ERR_INVALID, "px_log_text: NULL argument");
  if (!l->active || !l->console) return PX_OK;
  bar_close(l);
  va_list ap;
  va_start(ap, fmt);
  vfprintf(l->con, fmt, ap);
  va_end(ap);
  size_t n = strlen(fmt);
  if (n == 0 || fmt[n - 1] != '\n') fputc('\n', l->con);
  fflush(l->con);
  return PX_OK;
}

px_status px_logger_flush(px_logger *l) {
  if (!l) return px_error(PX_ERR_INVALID, "px_logger_flush: NULL logger");
  if (l->con && l->active) fflush(l->con);
  if (l->jsonl && fflush(l->jsonl) != 0)
    return px_error(PX_ERR_IO, "jsonl: %s: flush failed: %s", l->jsonl_path, strerror(errno));
  if (l->tb && fflush(l->tb) != 0)
    return px_error(PX_ERR_IO, "tensorboard: %s: flush failed: %s", l->tb_path, strerror(errno));
  return PX_OK;
}

void px_logger_free(px_logger *l) {
  if (!l) return;
  if (l->active && l->console && l->con) {
    bar_close(l);
    fflush(l->con);
  }
  if (l->jsonl) fclose(l->jsonl);
  if (l->tb) fclose(l->tb);
  free(l->jsonl_path);
  free(l->tb_path);
  free(l);
}
