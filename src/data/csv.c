// Strict CSV records, the ImageNet synset mapping, and the two image
// listings built from them (csv.h).  Everything works on text in memory, so
// the fuzzer (tests/fuzz/fuzz_csv.c) drives exactly the code that reads files.
#include "data/csv.h"

#include <stdlib.h>
#include <string.h>

void px_csv_init(px_csv *c, const char *text, size_t size, const char *name) {
  *c = (px_csv){.name = name ? name : "(csv)", .text = text, .size = text ? size : 0, .next_line = 1};
  // A UTF-8 byte order mark (spreadsheets write one) is not part of the header.
  if (c->size >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) c->pos = 3;
}

void px_csv_free(px_csv *c) {
  free(c->buf);
  free(c->start);
  free(c->len);
  *c = (px_csv){0};
}

static px_status buf_put(px_csv *c, size_t *used, char ch) {
  if (*used + 1 >= c->buf_cap) {
    size_t cap = c->buf_cap ? 2 * c->buf_cap : 256;
    char *p = realloc(c->buf, cap);
    if (!p) return px_error(PX_ERR_NOMEM, "csv %s: out of memory at line %zu", c->name, c->line);
    c->buf = p;
    c->buf_cap = cap;
  }
  c->buf[(*used)++] = ch;
  return PX_OK;
}

static px_status field_begin(px_csv *c, size_t used) {
  if (c->nfields == c->fields_cap) {
    int cap = c->fields_cap ? 2 * c->fields_cap : 8;
    size_t *s = realloc(c->start, sizeof *s * (size_t)cap);
    if (s) c->start = s;
    size_t *l = s ? realloc(c->len, sizeof *l * (size_t)cap) : NULL;
    if (l) c->len = l;
    if (!s || !l) return px_error(PX_ERR_NOMEM, "csv %s: out of memory at line %zu", c->name, c->line);
    c->fields_cap = cap;
  }
  c->start[c->nfields] = used;
  c->len[c->nfields] = 0;
  c->nfields++;
  return PX_OK;
}

px_status px_csv_next(px_csv *c, bool *got) {
  *got = false;
  const char *t = c->text;
  // Skip empty lines ("\n" or "\r\n").
  for (;;) {
    if (c->pos < c->size && t[c->pos] == '\n') {
      c->pos++;
      c->next_line++;
    } else if (c->pos + 1 < c->size && t[c->pos] == '\r' && t[c->pos + 1] == '\n') {
      c->pos += 2;
      c->next_line++;
    } else {
      break;
    }
  }
  if (c->pos >= c->size) return PX_OK;
  c->line = c->next_line;
  c->nfields = 0;
  size_t used = 0;
  px_status st = field_begin(c, used);
  bool quoted = false, after_quote = false;  // inside "..."; just after its closing quote
  bool field_start = true;
  for (;;) {
    if (c->pos >= c->size) {
      if (quoted)
        return px_error(PX_ERR_FORMAT, "csv %s: line %zu: a quoted field is not closed before the end of the file",
                        c->name, c->line);
      break;
    }
    char ch = t[c->pos];
    if (ch == '\0')
      return px_error(PX_ERR_FORMAT, "csv %s: line %zu: a NUL byte; expected text", c->name, c->next_line);
    if (quoted) {
      c->pos++;
      if (ch == '"') {
        if (c->pos < c->size && t[c->pos] == '"') {  // "" is one quote
          c->pos++;
          st = buf_put(c, &used, '"');
        } else {
          quoted = false;
          after_quote = true;
        }
      } else {
        if (ch == '\n') c->next_line++;
        st = buf_put(c, &used, ch);
      }
      if (st != PX_OK) return st;
      continue;
    }
    if (ch == '\n' || (ch == '\r' && c->pos + 1 < c->size && t[c->pos + 1] == '\n')) {
      c->pos += ch == '\r' ? 2 : 1;
      c->next_line++;
      break;
    }
    if (ch == ',') {
      c->pos++;
      st = buf_put(c, &used, '\0');
      if (st == PX_OK) st = field_begin(c, used);
      if (st != PX_OK) return st;
      after_quote = false;
      field_start = true;
      continue;
    }
    if (after_quote)
      return px_error(PX_ERR_FORMAT,
                      "csv %s: line %zu: field %d has text after its closing quote; expected a comma or the line's end",
                      c->name, c->line, c->nfields);
    if (ch == '"') {
      if (!field_start)
        return px_error(PX_ERR_FORMAT,
                        "csv %s: line %zu: field %d has a quote inside an unquoted field; quote the whole field and "
                        "write \"\" for a quote",
                        c->name, c->line, c->nfields);
      quoted = true;
      field_start = false;
      c->pos++;
      continue;
    }
    if (ch == '\r')
      return px_error(PX_ERR_FORMAT, "csv %s: line %zu: a carriage return not followed by a newline", c->name, c->line);
    field_start = false;
    c->pos++;
    st = buf_put(c, &used, ch);
    if (st != PX_OK) return st;
  }
  st = buf_put(c, &used, '\0');
  if (st != PX_OK) return st;
  for (int k = 0; k < c->nfields; k++) c->len[k] = strlen(c->buf + c->start[k]);
  *got = true;
  return PX_OK;
}

px_status px_csv_parse_label(const char *s, const char *name, size_t line, int32_t *out) {
  if (*s == '-' && s[1] >= '0' && s[1] <= '9')
    return px_error(PX_ERR_FORMAT, "csv %s: line %zu: label \"%s\" is negative; expected an integer >= 0", name, line,
                    s);
  if (!*s) return px_error(PX_ERR_FORMAT, "csv %s: line %zu: empty label; expected an integer >= 0", name, line);
  int64_t v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9')
      return px_error(PX_ERR_FORMAT, "csv %s: line %zu: label \"%.40s\" is not an integer >= 0", name, line, s);
    v = v * 10 + (*p - '0');
    if (v > INT32_MAX)
      return px_error(PX_ERR_FORMAT, "csv %s: line %zu: label \"%.40s\" is too large (above 2^31 - 1)", name, line, s);
  }
  *out = (int32_t)v;
  return PX_OK;
}

// ---- Synset mapping -----------------------------------------------------------
// Sorted as (name, class) pairs: no shared comparison context, so ranks on
// threads may open datasets at the same time.
typedef struct named_class {
  const char *name;
  size_t k;
} named_class;
static int by_name(const void *a, const void *b) {
  return strcmp(((const named_class *)a)->name, ((const named_class *)b)->name);
}

void px_synsets_free(px_synsets *s) {
  if (!s) return;
  for (size_t k = 0; k < s->count; k++) free(s->names[k]);
  free(s->names);
  free(s->order);
  *s = (px_synsets){0};
}

static bool is_space(char ch) { return ch == ' ' || ch == '\t'; }

px_status px_synsets_parse(const char *text, size_t size, const char *name, px_synsets *out) {
  *out = (px_synsets){0};
  if (!name) name = "(synsets)";
  size_t cap = 0, line = 0;
  px_synsets s = {0};
  size_t pos = 0;
  while (pos < size) {
    line++;
    size_t end = pos;
    while (end < size && text[end] != '\n') end++;
    size_t stop = end;
    if (stop > pos && text[stop - 1] == '\r') stop--;
    size_t w = pos;
    while (w < stop && !is_space(text[w])) {
      if (text[w] == '\0') {
        px_synsets_free(&s);
        return px_error(PX_ERR_FORMAT, "synsets %s: line %zu: a NUL byte; expected \"<synset> <description>\"", name,
                        line);
      }
      w++;
    }
    if (w == pos) {
      px_synsets_free(&s);
      return px_error(PX_ERR_FORMAT,
                      "synsets %s: line %zu: no synset; expected \"<synset> <description>\" on every line (line k is "
                      "class k - 1)",
                      name, line);
    }
    if (s.count == cap) {
      cap = cap ? 2 * cap : 1024;
      char **n = realloc(s.names, sizeof *n * cap);
      if (!n) {
        px_synsets_free(&s);
        return px_error(PX_ERR_NOMEM, "synsets %s: out of memory", name);
      }
      s.names = n;
    }
    char *word = malloc(w - pos + 1);
    if (!word) {
      px_synsets_free(&s);
      return px_error(PX_ERR_NOMEM, "synsets %s: out of memory", name);
    }
    memcpy(word, text + pos, w - pos);
    word[w - pos] = '\0';
    s.names[s.count++] = word;
    pos = end < size ? end + 1 : end;
  }
  if (s.count == 0)
    return px_error(PX_ERR_FORMAT, "synsets %s: empty; expected one \"<synset> <description>\" per class", name);
  s.order = malloc(sizeof *s.order * s.count);
  named_class *pairs = malloc(sizeof *pairs * s.count);
  if (!s.order || !pairs) {
    free(pairs);
    px_synsets_free(&s);
    return px_error(PX_ERR_NOMEM, "synsets %s: out of memory", name);
  }
  for (size_t k = 0; k < s.count; k++) pairs[k] = (named_class){s.names[k], k};
  qsort(pairs, s.count, sizeof *pairs, by_name);
  for (size_t k = 0; k < s.count; k++) s.order[k] = pairs[k].k;
  free(pairs);
  for (size_t k = 1; k < s.count; k++) {
    if (strcmp(s.names[s.order[k - 1]], s.names[s.order[k]]) == 0) {
      size_t a = s.order[k - 1] < s.order[k] ? s.order[k - 1] : s.order[k];
      size_t b = s.order[k - 1] < s.order[k] ? s.order[k] : s.order[k - 1];
      px_error(PX_ERR_FORMAT, "synsets %s: synset \"%.40s\" appears on lines %zu and %zu; each class needs its own",
               name, s.names[a], a + 1, b + 1);
      px_synsets_free(&s);
      return PX_ERR_FORMAT;
    }
  }
  *out = s;
  return PX_OK;
}

int64_t px_synsets_find(const px_synsets *s, const char *synset, size_t len) {
  size_t lo = 0, hi = s->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const char *name = s->names[s->order[mid]];
    int cmp = strncmp(name, synset, len);
    if (cmp == 0 && name[len] != '\0') cmp = 1;  // name is longer: it sorts after
    if (cmp == 0) return (int64_t)s->order[mid];
    if (cmp < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

void px_imagenet_first_synset(const char *s, const char **word, size_t *len) {
  while (is_space(*s)) s++;
  const char *e = s;
  while (*e && !is_space(*e)) e++;
  *word = s;
  *len = (size_t)(e - s);
}

// ---- Listings -------------------------------------------------------------------
void px_image_listing_free(px_image_listing *l) {
  if (!l) return;
  for (size_t k = 0; k < l->count; k++) free(l->paths[k]);
  free(l->paths);
  free(l->labels);
  free(l->lines);
  *l = (px_image_listing){0};
}

// root + "/" + a + b + c (a path written absolute in the CSV stays as it is).
static char *join_path(const char *root, const char *a, size_t na, const char *b, size_t nb, const char *c) {
  bool absolute = na > 0 && a[0] == '/';
  size_t nr = (root && !absolute) ? strlen(root) : 0;
  size_t nc = strlen(c);
  char *p = malloc(nr + 1 + na + nb + nc + 1);
  if (!p) return NULL;
  size_t k = 0;
  if (nr) {
    memcpy(p, root, nr);
    k = nr;
    if (p[k - 1] != '/') p[k++] = '/';
  }
  memcpy(p + k, a, na);
  k += na;
  memcpy(p + k, b, nb);
  k += nb;
  memcpy(p + k, c, nc);
  k += nc;
  p[k] = '\0';
  return p;
}

static px_status listing_push(px_image_listing *l, size_t *cap, char *path, int32_t label, size_t line,
                              const char *csv_name) {
  if (!path) return px_error(PX_ERR_NOMEM, "csv %s: out of memory at line %zu", csv_name, line);
  if (l->count == *cap) {
    size_t n = *cap ? 2 * *cap : 1024;
    char **p = realloc(l->paths, sizeof *p * n);
    if (p) l->paths = p;
    int32_t *y = p ? realloc(l->labels, sizeof *y * n) : NULL;
    if (y) l->labels = y;
    size_t *ln = y ? realloc(l->lines, sizeof *ln * n) : NULL;
    if (ln) l->lines = ln;
    if (!ln) {
      free(path);
      return px_error(PX_ERR_NOMEM, "csv %s: out of memory at line %zu", csv_name, line);
    }
    *cap = n;
  }
  l->paths[l->count] = path;
  l->labels[l->count] = label;
  l->lines[l->count] = line;
  l->count++;
  if ((size_t)label + 1 > l->num_classes) l->num_classes = (size_t)label + 1;
  return PX_OK;
}

static px_status parse_row(px_csv *c, px_csv_layout layout, const px_synsets *syn, const char *root,
                           px_image_listing *l, size_t *cap) {
  const char *name = c->name;
  if (c->nfields != 2)
    return px_error(PX_ERR_FORMAT, "csv %s: line %zu: %d field(s); expected 2 (%s)", name, c->line, c->nfields,
                    layout == PX_CSV_IMAGENET ? "ImageId,PredictionString" : "path,label");
  const char *f0 = px_csv_field(c, 0), *f1 = px_csv_field(c, 1);
  size_t n0 = c->len[0];
  if (layout == PX_CSV_PATH_LABEL) {
    if (n0 == 0) return px_error(PX_ERR_FORMAT, "csv %s: line %zu: empty path", name, c->line);
    int32_t label;
    px_status st = px_csv_parse_label(f1, name, c->line, &label);
    if (st != PX_OK) return st;
    return listing_push(l, cap, join_path(root, f0, n0, "", 0, ""), label, c->line, name);
  }
  if (n0 == 0) return px_error(PX_ERR_FORMAT, "csv %s: line %zu: empty ImageId", name, c->line);
  const char *word;
  size_t wlen;
  px_imagenet_first_synset(f1, &word, &wlen);
  if (wlen == 0)
    return px_error(PX_ERR_FORMAT, "csv %s: line %zu: empty PredictionString; expected \"<synset> x0 y0 x1 y1 ...\"",
                    name, c->line);
  int64_t k = px_synsets_find(syn, word, wlen);
  if (k < 0)
    return px_error(PX_ERR_FORMAT, "csv %s: line %zu: synset \"%.*s\" is not in the synset mapping (%zu classes)", name,
                    c->line, (int)(wlen > 40 ? 40 : wlen), word, syn->count);
  // Train layout: "n01440764_10026" lives in <root>/n01440764/; val images
  // ("ILSVRC2012_val_00000001") lie in <root> itself.
  bool train = n0 > wlen && strncmp(f0, word, wlen) == 0 && f0[wlen] == '_';
  char *path = train ? join_path(root, word, wlen, "/", 1, "") : join_path(root, "", 0, "", 0, "");
  if (path) {
    char *full = join_path(NULL, path, strlen(path), f0, n0, ".JPEG");
    free(path);
    path = full;
  }
  return listing_push(l, cap, path, (int32_t)k, c->line, name);
}

px_status px_image_listing_parse(const char *text, size_t size, const char *csv_name, px_csv_layout layout,
                                 const px_synsets *synsets, const char *root, px_image_listing *out) {
  *out = (px_image_listing){0};
  if (!csv_name) csv_name = "(csv)";
  if (layout != PX_CSV_PATH_LABEL && layout != PX_CSV_IMAGENET)
    return px_error(PX_ERR_INVALID, "csv %s: unknown layout %d", csv_name, (int)layout);
  if (layout == PX_CSV_IMAGENET && (!synsets || synsets->count == 0))
    return px_error(PX_ERR_INVALID, "csv %s: the ImageNet layout needs the synset mapping (LOC_synset_mapping.txt)",
                    csv_name);
  const char *h0 = layout == PX_CSV_IMAGENET ? "ImageId" : "path";
  const char *h1 = layout == PX_CSV_IMAGENET ? "PredictionString" : "label";
  px_csv c;
  px_csv_init(&c, text, size, csv_name);
  bool got;
  px_status st = px_csv_next(&c, &got);
  if (st == PX_OK && !got)
    st = px_error(PX_ERR_FORMAT, "csv %s: empty; expected the header \"%s,%s\"", csv_name, h0, h1);
  if (st == PX_OK && (c.nfields != 2 || strcmp(px_csv_field(&c, 0), h0) != 0 || strcmp(px_csv_field(&c, 1), h1) != 0))
    st = px_error(PX_ERR_FORMAT, "csv %s: line %zu: header \"%.60s%s%.60s\"%s; expected \"%s,%s\"", csv_name, c.line,
                  px_csv_field(&c, 0), c.nfields > 1 ? "," : "", c.nfields > 1 ? px_csv_field(&c, 1) : "",
                  c.nfields > 2 ? " and more fields" : "", h0, h1);
  px_image_listing l = {0};
  size_t cap = 0;
  while (st == PX_OK) {
    st = px_csv_next(&c, &got);
    if (st != PX_OK || !got) break;
    st = parse_row(&c, layout, synsets, root, &l, &cap);
  }
  px_csv_free(&c);
  if (st == PX_OK && l.count == 0) st = px_error(PX_ERR_FORMAT, "csv %s: a header but no images", csv_name);
  if (st != PX_OK) {
    px_image_listing_free(&l);
    return st;
  }
  if (layout == PX_CSV_IMAGENET) l.num_classes = synsets->count;
  *out = l;
  return PX_OK;
}
