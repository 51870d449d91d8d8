/* test_log_console_jsonl_and_hooks.c — the log layer's console, JSONL and
 * hook outputs.  If this fails: plain-mode lines lack the step/loss/ETA
 * fields or contain \r; bar mode does not redraw with \r or garbles text
 * lines into the bar; JSONL lines are not valid JSON, lose values, or write
 * NaN instead of null; hooks are not called (or with wrong metrics); rank 1
 * writes files or console output; CRC-32C differs from the standard check
 * value; or an unwritable path is not an error naming it. */
#define _POSIX_C_SOURCE 200809L
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "px_test.h"

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = calloc((size_t)n + 1, 1);
  if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  fclose(f);
  return b;
}

typedef struct hook_rec {
  int steps, epochs, evals;
  px_step_metrics last_step;
  px_eval_metrics last_eval;
  int64_t last_epoch;
} hook_rec;
static void h_step(const px_step_metrics *m, void *u) {
  hook_rec *r = u;
  r->steps++;
  r->last_step = *m;
}
static void h_epoch(int64_t e, int64_t s, void *u) {
  hook_rec *r = u;
  (void)s;
  r->epochs++;
  r->last_epoch = e;
}
static void h_eval(const px_eval_metrics *m, void *u) {
  hook_rec *r = u;
  r->evals++;
  r->last_eval = *m;
}

static px_step_metrics step_m(int64_t i) {
  px_step_metrics m = {.step = i,
                       .total_steps = 10,
                       .epoch = 1,
                       .total_epochs = 2,
                       .loss = 2.5 / (double)i,
                       .lr = 1e-3 * (double)i,
                       .grad_norm = 0.5 + (double)i,
                       .samples_per_s = 1000.0 + (double)i,
                       .eta_s = 3725.0};
  return m;
}

int main(void) {
  /* CRC-32C standard check value. */
  CHECK(px_crc32c(0, "123456789", 9) == 0xE3069283u, "crc32c = %08x", px_crc32c(0, "123456789", 9));
  CHECK(px_crc32c(px_crc32c(0, "1234", 4), "56789", 5) == 0xE3069283u, "incremental crc32c differs");

  char dir[] = "/tmp/px_log_test_XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  char con_path[256], jsonl_path[256], tb_dir[256], bar_path[256];
  snprintf(con_path, sizeof con_path, "%s/console.txt", dir);
  snprintf(bar_path, sizeof bar_path, "%s/bar.txt", dir);
  snprintf(jsonl_path, sizeof jsonl_path, "%s/log.jsonl", dir);
  snprintf(tb_dir, sizeof tb_dir, "%s/tb/a/b", dir);

  /* Plain lines + JSONL + TB + hooks. */
  FILE *con = fopen(con_path, "w");
  px_logger *l = NULL;
  px_logger_opts o = {.rank = 0,
                      .console = true,
                      .progress = 0,
                      .jsonl_path = jsonl_path,
                      .tensorboard_dir = tb_dir,
                      .run_name = "unit",
                      .console_stream = con};
  CHECK_OK(px_logger_create(&l, &o));
  hook_rec rec[9] = {0};
  for (int i = 0; i < 9; i++) {
    px_log_hooks h = {h_step, h_epoch, h_eval, &rec[i]};
    CHECK_OK(px_log_add_hooks(l, &h));
  }
  for (int64_t i = 1; i <= 3; i++) {
    px_step_metrics m = step_m(i);
    CHECK_OK(px_log_step(l, &m));
  }
  CHECK_OK(px_log_epoch(l, 1, 3));
  px_eval_metrics ev = {.step = 3, .epoch = 1, .loss = 0.75, .accuracy = 0.875, .perplexity = NAN, .samples = 64};
  CHECK_OK(px_log_eval(l, &ev));
  CHECK_OK(px_log_scalar(l, "custom/\"q\"", 3, 42.5));
  CHECK_OK(px_log_text(l, "hello %d", 7));
  px_logger_free(l);
  fclose(con);

  for (int i = 0; i < 9; i++) {
    CHECK(rec[i].steps == 3 && rec[i].epochs == 1 && rec[i].evals == 1, "hook %d counts %d %d %d", i, rec[i].steps,
          rec[i].epochs, rec[i].evals);
    CHECK(rec[i].last_step.step == 3 && rec[i].last_step.loss == 2.5 / 3.0, "hook %d step metrics", i);
    CHECK(rec[i].last_eval.accuracy == 0.875 && rec[i].last_epoch == 1, "hook %d eval/epoch", i);
  }

  char *txt = slurp(con_path);
  CHECK(txt != NULL, "console file");
  if (txt) {
    CHECK(strchr(txt, '\r') == NULL, "plain mode wrote \\r");
    CHECK(strstr(txt, "run unit") != NULL, "header missing: %s", txt);
    CHECK(strstr(txt, "step 2/10 epoch 1/2 loss 1.250000") != NULL, "step line missing: %s", txt);
    CHECK(strstr(txt, "eta 1:02:05") != NULL, "ETA h:mm:ss missing: %s", txt);
    CHECK(strstr(txt, "samples/s 1003.0") != NULL, "samples/s missing: %s", txt);
    CHECK(strstr(txt, "accuracy 0.8750") != NULL && strstr(txt, "perplexity") == NULL, "eval line: %s", txt);
    CHECK(strstr(txt, "\nhello 7\n") != NULL, "text line: %s", txt);
    int lines = 0;
    for (char *p = txt; *p; p++) lines += *p == '\n';
    CHECK(lines == 6, "expected 6 lines (header, 3 steps, eval, text), got %d", lines);
  }
  free(txt);

  /* JSONL parsed back with cJSON. */
  char *js = slurp(jsonl_path);
  CHECK(js != NULL, "jsonl file");
  int n_step = 0, n_eval = 0, n_epoch = 0, n_scalar = 0;
  for (char *line = js ? strtok(js, "\n") : NULL; line; line = strtok(NULL, "\n")) {
    cJSON *j = cJSON_Parse(line);
    CHECK(j != NULL, "invalid JSON line: %s", line);
    if (!j) continue;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(j, "type"));
    CHECK(cJSON_IsNumber(cJSON_GetObjectItem(j, "time")) && cJSON_GetObjectItem(j, "time")->valuedouble > 1.6e9,
          "time: %s", line);
    if (type && !strcmp(type, "step")) {
      n_step++;
      int64_t s = (int64_t)cJSON_GetObjectItem(j, "step")->valuedouble;
      px_step_metrics m = step_m(s);
      CHECK_CLOSE(cJSON_GetObjectItem(j, "loss")->valuedouble, m.loss, 1e-8);
      CHECK_CLOSE(cJSON_GetObjectItem(j, "lr")->valuedouble, m.lr, 1e-8);
      CHECK_CLOSE(cJSON_GetObjectItem(j, "grad_norm")->valuedouble, m.grad_norm, 1e-8);
      CHECK_CLOSE(cJSON_GetObjectItem(j, "samples_per_s")->valuedouble, m.samples_per_s, 1e-8);
      CHECK(cJSON_GetObjectItem(j, "epoch")->valuedouble == 1, "epoch: %s", line);
      CHECK(s == n_step, "step order: %s", line);
    } else if (type && !strcmp(type, "eval")) {
      n_eval++;
      CHECK_CLOSE(cJSON_GetObjectItem(j, "accuracy")->valuedouble, 0.875, 1e-9);
      CHECK_CLOSE(cJSON_GetObjectItem(j, "loss")->valuedouble, 0.75, 1e-9);
      CHECK(cJSON_IsNull(cJSON_GetObjectItem(j, "perplexity")), "NAN perplexity not null: %s", line);
      CHECK(cJSON_GetObjectItem(j, "samples")->valuedouble == 64, "samples: %s", line);
    } else if (type && !strcmp(type, "epoch")) {
      n_epoch++;
      CHECK(cJSON_GetObjectItem(j, "step")->valuedouble == 3, "epoch step: %s", line);
    } else if (type && !strcmp(type, "scalar")) {
      n_scalar++;
      CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(j, "tag")), "custom/\"q\""), "tag escaping: %s", line);
      CHECK_CLOSE(cJSON_GetObjectItem(j, "value")->valuedouble, 42.5, 1e-12);
    } else {
      CHECK(0, "unknown record: %s", line);
    }
    cJSON_Delete(j);
  }
  CHECK(n_step == 3 && n_eval == 1 && n_epoch == 1 && n_scalar == 1, "record counts %d %d %d %d", n_step, n_eval,
        n_epoch, n_scalar);
  free(js);

  /* The TB directory was created (mkdir -p) and holds one event file. */
  struct stat st;
  CHECK(stat(tb_dir, &st) == 0 && S_ISDIR(st.st_mode), "tensorboard dir %s not created", tb_dir);

  /* Bar mode forced on a file: \r frames, text and eval on their own lines. */
  con = fopen(bar_path, "w");
  o = (px_logger_opts){.rank = 0, .console = true, .progress = 1, .console_stream = con};
  CHECK_OK(px_logger_create(&l, &o));
  for (int64_t i = 1; i <= 3; i++) {
    px_step_metrics m = step_m(i);
    CHECK_OK(px_log_step(l, &m));
  }
  CHECK_OK(px_log_text(l, "note"));
  px_step_metrics m4 = step_m(4);
  CHECK_OK(px_log_step(l, &m4));
  CHECK_OK(px_log_eval(l, &ev));
  px_logger_free(l);
  fclose(con);
  txt = slurp(bar_path);
  if (txt) {
    int cr = 0;
    for (char *p = txt; *p; p++) cr += *p == '\r';
    CHECK(cr == 4, "expected 4 \\r frames, got %d", cr);
    CHECK(strstr(txt, "\r[##..................] 1/10") != NULL, "first frame: %s", txt);
    CHECK(strstr(txt, "\r[######..............] 3/10") != NULL, "third frame: %s", txt);
    CHECK(strstr(txt, "\033[K\nnote\n\r[########") != NULL, "text not on its own line: %s", txt);
    CHECK(strstr(txt, "\033[K\neval step 3") != NULL, "eval not on its own line: %s", txt);
    CHECK(txt[strlen(txt) - 1] == '\n', "output does not end with a newline");
  }
  free(txt);

  /* Rank 1 writes nothing: no JSONL file, no TB dir, no console bytes. */
  char j1[256], tb1[256], c1[256];
  snprintf(j1, sizeof j1, "%s/rank1.jsonl", dir);
  snprintf(tb1, sizeof tb1, "%s/tb1", dir);
  snprintf(c1, sizeof c1, "%s/rank1.txt", dir);
  con = fopen(c1, "w");
  o = (px_logger_opts){.rank = 1,
                       .console = true,
                       .progress = 1,
                       .jsonl_path = j1,
                       .tensorboard_dir = tb1,
                       .run_name = "r1",
                       .console_stream = con};
  CHECK_OK(px_logger_create(&l, &o));
  hook_rec r1 = {0};
  px_log_hooks h1 = {h_step, h_epoch, h_eval, &r1};
  CHECK_OK(px_log_add_hooks(l, &h1));
  CHECK_OK(px_log_step(l, &m4));
  CHECK_OK(px_log_eval(l, &ev));
  CHECK_OK(px_log_text(l, "x"));
  CHECK_OK(px_log_scalar(l, "t", 1, 1.0));
  CHECK_OK(px_log_epoch(l, 1, 1));
  px_logger_free(l);
  fclose(con);
  CHECK(stat(j1, &st) != 0 && stat(tb1, &st) != 0, "rank 1 created files");
  CHECK(stat(c1, &st) == 0 && st.st_size == 0, "rank 1 printed to console");
  CHECK(r1.steps == 0 && r1.evals == 0, "rank 1 ran hooks");

  /* Unwritable paths: errors that name the path. */
  char bad[300];
  snprintf(bad, sizeof bad, "%s/console.txt/sub", dir); /* a file used as a directory */
  o = (px_logger_opts){.rank = 0, .tensorboard_dir = bad};
  CHECK(px_logger_create(&l, &o) == PX_ERR_IO && l == NULL, "TB under a file accepted");
  CHECK(strstr(px_last_error(), "console.txt") != NULL, "error does not name the path: %s", px_last_error());
  snprintf(bad, sizeof bad, "%s/console.txt/x.jsonl", dir);
  o = (px_logger_opts){.rank = 0, .jsonl_path = bad};
  CHECK(px_logger_create(&l, &o) == PX_ERR_IO, "JSONL under a file accepted");
  CHECK(strstr(px_last_error(), "console.txt") != NULL, "error does not name the path: %s", px_last_error());
  /* A JSONL file's missing directories are made, like TensorBoard's. */
  snprintf(bad, sizeof bad, "%s/new/dir/x.jsonl", dir);
  o = (px_logger_opts){.rank = 0, .jsonl_path = bad};
  CHECK(px_logger_create(&l, &o) == PX_OK, "JSONL in a new directory: %s", px_last_error());
  px_logger_free(l);
  CHECK(stat(bad, &st) == 0, "%s was not created", bad);

  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  CHECK(system(cmd) == 0, "cleanup");
  return px_test_finish("test_log_console_jsonl_and_hooks");
}
