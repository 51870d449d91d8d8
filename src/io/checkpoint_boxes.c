// Box arithmetic of pieces format version 2 (io.h): a piece is the flat
// range [offset, offset + count) of a box of a named global tensor, and
// loading into another layout copies, for every wanted piece, the elements
// it shares with every saved piece of the same key.
//
// The intersection of two (box, flat range) pieces is not a box: a flat
// range of a box is a ragged run of rows.  So each piece's range is first
// cut into at most 2·ndim − 1 boxes (a partial first row, whole blocks, a
// partial last row, at every level), and then every pair of those boxes is
// intersected as boxes, which copies by contiguous runs along the last
// dimension: every run copied is wholly inside both flat ranges, and the
// work is proportional to the elements shared plus one step per run.
//
// What each copy covered of the wanted piece (flat runs of its range, from
// which file) is kept, so that a hole or an overlap is found and named
// before anything reaches the caller's memory (all or nothing).
#define _DEFAULT_SOURCE  // MAP_ANONYMOUS, MADV_HUGEPAGE
#include "io/checkpoint.h"
#include "io/internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct px_ckpt_hit {
  int want;
  size_t lo, hi;             // flat elements of the wanted piece's box
  const char *file;          // a name the loader's caller keeps alive (SHA256SUMS)
  const unsigned char *src;  // where the elements are: in a file mapping (checked), or NULL: in staging
};

/* ---- boxes ----------------------------------------------------------------- */

static size_t prod(const int64_t *v, int from, int to) {
  size_t n = 1;
  for (int d = from; d < to; d++) n *= (size_t)v[d];
  return n;
}

bool px_ckpt_box_of(const px_tensor_piece *p, px_ckpt_box *out, char *why, size_t cap) {
  memset(out, 0, sizeof *out);
  out->key = p->key;
  if (p->ndim < 0 || p->ndim > PX_MAX_DIMS) {
    snprintf(why, cap, "a tensor of %d dimensions", p->ndim);
    return false;
  }
  bool whole = true;
  for (int d = 0; d < p->ndim; d++) {
    if (p->shape[d] < 0) {
      snprintf(why, cap, "a negative dimension");
      return false;
    }
    whole = whole && p->box_size[d] == 0;
  }
  // A 0-d tensor is one element: the box of shape (1,).
  out->ndim = p->ndim ? p->ndim : 1;
  out->tensor_ndim = p->ndim;
  for (int d = 0; d < out->ndim; d++) {
    out->shape[d] = p->ndim ? p->shape[d] : 1;
    out->off[d] = whole ? 0 : p->box_offset[d];
    out->size[d] = whole ? out->shape[d] : p->box_size[d];
    if (out->off[d] < 0 || out->size[d] < 0 || out->off[d] > out->shape[d] ||
        out->size[d] > out->shape[d] - out->off[d]) {
      snprintf(why, cap, "a box [%lld:%lld] in dimension %d of %lld", (long long)out->off[d],
               (long long)(out->off[d] + out->size[d]), d, (long long)out->shape[d]);
      return false;
    }
  }
  const size_t numel = prod(out->size, 0, out->ndim);
  if (p->offset > numel || p->count > numel - p->offset) {
    snprintf(why, cap, "elements [%zu, %zu) of a box of %zu", p->offset, p->offset + p->count, numel);
    return false;
  }
  out->offset = p->offset;
  out->count = p->count;
  return true;
}

bool px_ckpt_box_whole(const px_ckpt_box *b) {
  for (int d = 0; d < b->ndim; d++)
    if (b->off[d] != 0 || b->size[d] != b->shape[d]) return false;
  return true;
}

void px_ckpt_box_str(const px_ckpt_box *b, char *out, size_t cap) {
  size_t k = 0;
  out[0] = '\0';
  if (px_ckpt_box_whole(b)) return;
  for (int d = 0; d < b->ndim && k + 1 < cap; d++) {
    int m = snprintf(out + k, cap - k, "%s%lld:%lld", d ? ", " : "[", (long long)b->off[d],
                     (long long)(b->off[d] + b->size[d]));
    if (m < 0) break;
    k += (size_t)m;
  }
  if (k + 1 < cap) snprintf(out + k, cap - k, "]");
}

// The boxes (global coordinates) that the flat range [a, b) of box B
// covers, dimension d on, with the coordinates of dimensions < d fixed at
// fix[]: at most 2·(ndim − d) − 1 of them.
static void range_boxes(const px_ckpt_box *B, int d, int64_t *fix, size_t a, size_t b, px_ckpt_box *out, int *n) {
  if (a >= b) return;
  const int nd = B->ndim;
  if (d == nd - 1) {
    px_ckpt_box *o = &out[(*n)++];
    *o = *B;
    for (int k = 0; k < d; k++) {
      o->off[k] = fix[k];
      o->size[k] = 1;
    }
    o->off[d] = B->off[d] + (int64_t)a;
    o->size[d] = (int64_t)(b - a);
    return;
  }
  const size_t inner = prod(B->size, d + 1, nd);  // > 0, since a < b
  size_t r0 = a / inner, r1 = b / inner;
  const size_t a_in = a % inner, b_in = b % inner;
  if (r0 == r1) {
    fix[d] = B->off[d] + (int64_t)r0;
    range_boxes(B, d + 1, fix, a_in, b_in, out, n);
    return;
  }
  if (a_in) {
    fix[d] = B->off[d] + (int64_t)r0;
    range_boxes(B, d + 1, fix, a_in, inner, out, n);
    r0++;
  }
  if (r1 > r0) {
    px_ckpt_box *o = &out[(*n)++];
    *o = *B;
    for (int k = 0; k < d; k++) {
      o->off[k] = fix[k];
      o->size[k] = 1;
    }
    o->off[d] = B->off[d] + (int64_t)r0;
    o->size[d] = (int64_t)(r1 - r0);
  }
  if (b_in) {
    fix[d] = B->off[d] + (int64_t)r1;
    range_boxes(B, d + 1, fix, 0, b_in, out, n);
  }
}

static int cut(const px_ckpt_box *B, px_ckpt_box out[2 * PX_MAX_DIMS]) {
  int64_t fix[PX_MAX_DIMS];
  int n = 0;
  range_boxes(B, 0, fix, B->offset, B->offset + B->count, out, &n);
  return n;
}

// out = a ∩ b; false when empty.
static bool meet(const px_ckpt_box *a, const px_ckpt_box *b, px_ckpt_box *out) {
  *out = *a;
  for (int d = 0; d < a->ndim; d++) {
    const int64_t lo = a->off[d] > b->off[d] ? a->off[d] : b->off[d];
    const int64_t ha = a->off[d] + a->size[d], hb = b->off[d] + b->size[d];
    const int64_t hi = ha < hb ? ha : hb;
    if (hi <= lo) return false;
    out->off[d] = lo;
    out->size[d] = hi - lo;
  }
  return true;
}

bool px_ckpt_box_overlap(const px_ckpt_box *a, const px_ckpt_box *b) {
  px_ckpt_box ca[2 * PX_MAX_DIMS], cb[2 * PX_MAX_DIMS], m;
  const int na = cut(a, ca), nb = cut(b, cb);
  for (int i = 0; i < na; i++)
    for (int j = 0; j < nb; j++)
      if (meet(&ca[i], &cb[j], &m)) return true;
  return false;
}

// Flat index, in box B's row-major order, of the global coordinates g.
static size_t flat_in(const px_ckpt_box *B, const int64_t *g) {
  size_t f = 0;
  for (int d = 0; d < B->ndim; d++) f = f * (size_t)B->size[d] + (size_t)(g[d] - B->off[d]);
  return f;
}

/* ---- the loader -------------------------------------------------------------- */

#define STAGE_MAP_MIN ((size_t)4 << 20)  // staging this large is mmap'ed (huge pages)

px_status px_ckpt_loader_init(px_ckpt_loader *L, const char *ckpt, const char *prefix, const px_tensor_piece *want,
                              int n, bool strict) {
  memset(L, 0, sizeof *L);
  L->ckpt = ckpt;
  L->prefix = prefix;
  L->want = want;
  L->n = n;
  L->strict = strict;
  L->wbox = calloc(n > 0 ? (size_t)n : 1, sizeof *L->wbox);
  L->stage = calloc(n > 0 ? (size_t)n : 1, sizeof *L->stage);
  if (!L->wbox || !L->stage) return px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", ckpt);
  size_t total = 0;
  for (int w = 0; w < n; w++) {
    char why[128];
    if (!px_ckpt_box_of(&want[w], &L->wbox[w], why, sizeof why) || (want[w].count && !want[w].data))
      return px_error(PX_ERR_INVALID, "checkpoint: load_boxes: wanted piece %d of \"%s\" is %s", w, want[w].key,
                      want[w].count && !want[w].data ? "without data" : why);
    total += want[w].count;
  }
  // Staging: what is read goes here first, and into the caller's memory
  // only once every wanted element is found exactly once.  A large one is
  // mapped with huge pages asked for: the first touch of freshly allocated
  // 4 KiB pages (a fault and a zeroing each) cost more than the read itself
  // (docs/PERFORMANCE.md, "Figures behind code comments").  Pieces checked
  // in a file mapping (checkpoint_index.c) never touch their staging.
  L->buf_bytes = (total ? total : 1) * sizeof(float);
#if defined(MAP_ANONYMOUS) && defined(MADV_HUGEPAGE)
  if (L->buf_bytes >= STAGE_MAP_MIN) {
    void *m = mmap(NULL, L->buf_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) {
      (void)madvise(m, L->buf_bytes, MADV_HUGEPAGE);  // a hint: without it (no THP), 4 KiB pages
      L->buf = m;
      L->buf_mapped = true;
    }
  }
#endif
  if (!L->buf && !(L->buf = malloc(L->buf_bytes)))
    return px_error(PX_ERR_NOMEM, "checkpoint %s: cannot allocate %zu bytes of staging", ckpt, total * sizeof(float));
  size_t at = 0;
  for (int w = 0; w < n; w++) {
    L->stage[w] = L->buf + at;
    at += want[w].count;
  }
  return PX_OK;
}

void px_ckpt_loader_free(px_ckpt_loader *L) {
  free(L->hits);
  for (int i = 0; i < L->n_maps; i++) munmap(L->maps[i], L->map_len[i]);
  free(L->maps);
  free(L->map_len);
#if defined(MAP_ANONYMOUS) && defined(MADV_HUGEPAGE)
  if (L->buf_mapped) munmap(L->buf, L->buf_bytes);
  else
#endif
    free(L->buf);
  free(L->stage);
  free(L->wbox);
  memset(L, 0, sizeof *L);
}

static bool same_shape(const px_ckpt_box *a, const px_ckpt_box *b) {
  if (a->ndim != b->ndim || a->tensor_ndim != b->tensor_ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

bool px_ckpt_loader_needs(const px_ckpt_loader *L, const px_ckpt_box *s, bool *key_known) {
  bool known = false;
  for (int w = 0; w < L->n; w++) {
    if (strcmp(L->wbox[w].key, s->key) != 0) continue;
    known = true;
    // Another shape is an error the add reports: the piece is needed.
    if (!same_shape(&L->wbox[w], s) || px_ckpt_box_overlap(&L->wbox[w], s)) {
      if (key_known) *key_known = true;
      return true;
    }
  }
  if (key_known) *key_known = known;
  return false;
}

static px_status note_hit(px_ckpt_loader *L, int w, size_t lo, size_t hi, const char *file, const unsigned char *src) {
  if (L->n_hits) {
    px_ckpt_hit *last = &L->hits[L->n_hits - 1];
    // The next run of the same copy (from the bytes that follow in the same mapping).
    if (last->want == w && last->file == file && last->hi == lo &&
        (last->src ? src == last->src + (last->hi - last->lo) * sizeof(float) : !src)) {
      last->hi = hi;
      return PX_OK;
    }
  }
  if (L->n_hits == L->cap_hits) {
    size_t cap = L->cap_hits ? 2 * L->cap_hits : 64;
    px_ckpt_hit *grown = realloc(L->hits, cap * sizeof *grown);
    if (!grown) return px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", L->ckpt);
    L->hits = grown;
    L->cap_hits = cap;
  }
  L->hits[L->n_hits++] = (px_ckpt_hit){w, lo, hi, file, src};
  return PX_OK;
}

px_status px_ckpt_loader_add(px_ckpt_loader *L, const char *path, const char *file, const px_ckpt_box *s,
                             const unsigned char *data) {
  bool known = false;
  px_ckpt_box sc[2 * PX_MAX_DIMS], wc[2 * PX_MAX_DIMS], m;
  int ns = -1;
  for (int w = 0; w < L->n; w++) {
    const px_ckpt_box *W = &L->wbox[w];
    if (strcmp(W->key, s->key) != 0) continue;
    known = true;
    if (!same_shape(W, s)) {
      char a[PX_SHAPE_STR_MAX], b[PX_SHAPE_STR_MAX];
      const px_tensor_piece *p = &L->want[w];
      return px_error(PX_ERR_SHAPE,
                      "%s: tensor \"%s\" has shape %s in the checkpoint but this run expects %s; was it "
                      "saved from another model?",
                      path, s->key, px_shape_str(s->tensor_ndim, s->shape, a, sizeof a),
                      px_shape_str(p->ndim, p->shape, b, sizeof b));
    }
    if (ns < 0) ns = cut(s, sc);
    const int nw = cut(W, wc);
    const int nd = W->ndim;
    for (int i = 0; i < ns; i++)
      for (int j = 0; j < nw; j++) {
        if (!meet(&sc[i], &wc[j], &m)) continue;
        // Rows of m: every coordinate but the last; each a run of
        // m.size[nd-1] elements contiguous in both boxes.
        int64_t g[PX_MAX_DIMS];
        for (int d = 0; d < nd; d++) g[d] = m.off[d];
        const size_t run = (size_t)m.size[nd - 1];
        for (;;) {
          const size_t fw = flat_in(W, g), fs = flat_in(s, g);
          memcpy(L->stage[w] + (fw - W->offset), data + (fs - s->offset) * sizeof(float), run * sizeof(float));
          px_status st = note_hit(L, w, fw, fw + run, file, NULL);
          if (st != PX_OK) return st;
          int d = nd - 2;
          for (; d >= 0; d--) {
            if (++g[d] < m.off[d] + m.size[d]) break;
            g[d] = m.off[d];
          }
          if (d < 0) break;
        }
      }
  }
  if (!known && L->strict)
    return px_error(PX_ERR_INVALID, "%s: a piece of tensor \"%s\", which this model does not have (another model?)",
                    path, s->key);
  return PX_OK;
}

float *px_ckpt_loader_direct(const px_ckpt_loader *L, const px_ckpt_box *s, int *w_out) {
  int hit = -1;
  for (int w = 0; w < L->n; w++) {
    const px_ckpt_box *W = &L->wbox[w];
    if (strcmp(W->key, s->key) != 0) continue;
    if (!same_shape(W, s)) return NULL;  // an error px_ckpt_loader_add reports
    if (!px_ckpt_box_overlap(W, s)) continue;
    if (hit >= 0) return NULL;  // feeds two wanted pieces
    hit = w;
  }
  if (hit < 0) return NULL;
  const px_ckpt_box *W = &L->wbox[hit];
  for (int d = 0; d < W->ndim; d++)
    if (W->off[d] != s->off[d] || W->size[d] != s->size[d]) return NULL;
  if (s->offset < W->offset || s->offset + s->count > W->offset + W->count) return NULL;
  *w_out = hit;
  return L->stage[hit] + (s->offset - W->offset);
}

px_status px_ckpt_loader_took(px_ckpt_loader *L, int w, const px_ckpt_box *s, const char *file) {
  return s->count ? note_hit(L, w, s->offset, s->offset + s->count, file, NULL) : PX_OK;
}

px_status px_ckpt_loader_took_from(px_ckpt_loader *L, int w, const px_ckpt_box *s, const char *file,
                                   const unsigned char *src) {
  return s->count ? note_hit(L, w, s->offset, s->offset + s->count, file, src) : PX_OK;
}

px_status px_ckpt_loader_keep_map(px_ckpt_loader *L, void *map, size_t len) {
  if (L->n_maps == L->cap_maps) {
    int cap = L->cap_maps ? 2 * L->cap_maps : 8;
    void **m = realloc(L->maps, (size_t)cap * sizeof *m);
    if (!m) return px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", L->ckpt);
    L->maps = m;
    size_t *l = realloc(L->map_len, (size_t)cap * sizeof *l);
    if (!l) return px_error(PX_ERR_NOMEM, "checkpoint %s: out of memory", L->ckpt);
    L->map_len = l;
    L->cap_maps = cap;
  }
  L->maps[L->n_maps] = map;
  L->map_len[L->n_maps++] = len;
  return PX_OK;
}

static int by_want_lo(const void *a, const void *b) {
  const px_ckpt_hit *x = a, *y = b;
  if (x->want != y->want) return x->want < y->want ? -1 : 1;
  return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : 0;
}

// " (box [0:3, 2:5]; first element at (1, 2))" for a wanted piece that is a
// box; "" for a whole tensor, whose flat elements say it all.
static void where(const px_ckpt_box *W, size_t flat, char *out, size_t cap) {
  out[0] = '\0';
  if (px_ckpt_box_whole(W)) return;
  char box[256];
  px_ckpt_box_str(W, box, sizeof box);
  int64_t g[PX_MAX_DIMS];
  for (int d = W->ndim - 1; d >= 0; d--) {
    g[d] = W->off[d] + (int64_t)(flat % (size_t)W->size[d]);
    flat /= (size_t)W->size[d];
  }
  char at[256];
  px_shape_str(W->ndim, g, at, sizeof at);
  snprintf(out, cap, " of the box %s (the first at %s)", box, at);
}

// Copies hits [from, to) into the caller's memory (px_ckpt_loader_finish).
static void copy_hits(const px_ckpt_loader *L, size_t from, size_t to) {
  for (size_t i = from; i < to;) {
    const px_ckpt_hit *h = &L->hits[i];
    const size_t base = L->wbox[h->want].offset;
    float *dst = L->want[h->want].data + (h->lo - base);
    size_t j = i + 1, hi = h->hi;
    if (h->src) {
      memcpy(dst, h->src, (h->hi - h->lo) * sizeof(float));
    } else {
      while (j < to && !L->hits[j].src && L->hits[j].want == h->want && L->hits[j].lo == hi) hi = L->hits[j++].hi;
      memcpy(dst, L->stage[h->want] + (h->lo - base), (hi - h->lo) * sizeof(float));
    }
    i = j;
  }
}

// From this many bytes on, the final copy runs on two threads: a large load
// spent a noticeable share of its time in it on one (docs/PERFORMANCE.md,
// "Figures behind code comments").
#define COPY_SPLIT_MIN ((size_t)64 << 20)

typedef struct copy_job {
  const px_ckpt_loader *L;
  size_t from, to;
} copy_job;

static void *copy_hits_job(void *arg) {
  const copy_job *j = arg;
  copy_hits(j->L, j->from, j->to);
  return NULL;
}

px_status px_ckpt_loader_finish(px_ckpt_loader *L) {
  if (L->n_hits) qsort(L->hits, L->n_hits, sizeof *L->hits, by_want_lo);
  size_t k = 0;
  char w_at[600];
  for (int w = 0; w < L->n; w++) {
    const px_tensor_piece *p = &L->want[w];
    const px_ckpt_box *W = &L->wbox[w];
    size_t at = W->offset;
    const char *last_file = NULL;
    for (; k < L->n_hits && L->hits[k].want == w; k++) {
      const px_ckpt_hit *h = &L->hits[k];
      if (h->lo != at) {
        const bool two = h->lo < at;
        where(W, two ? h->lo : at, w_at, sizeof w_at);
        return px_error(PX_ERR_FORMAT, "checkpoint %s: tensor \"%s\": elements [%zu, %zu)%s are %s (%s%s%s)", L->ckpt,
                        p->key, two ? h->lo : at, two ? at : h->lo, w_at,
                        two ? "in two saved pieces" : "in no saved piece", h->file, last_file ? ", after " : "",
                        last_file ? last_file : "");
      }
      at = h->hi;
      last_file = h->file;
    }
    if (at != W->offset + W->count) {
      where(W, at, w_at, sizeof w_at);
      return px_error(PX_ERR_FORMAT,
                      "checkpoint %s: tensor \"%s\": elements [%zu, %zu)%s are in no saved piece of the "
                      "files %s*.safetensors (a rank's file missing, or another model?)",
                      L->ckpt, p->key, at, W->offset + W->count, w_at, L->prefix);
    }
  }
  // Every element found exactly once: now, and only now, the caller's
  // memory.  Each hit's run from where it is: a file mapping (its CRC-32C
  // checked when it was recorded) or staging (runs of staging that follow
  // each other in one copy).  From COPY_SPLIT_MIN bytes on, the hits from
  // the one where half the bytes are done are copied on a second thread.
  size_t total = 0, split = L->n_hits;
  for (size_t i = 0; i < L->n_hits; i++) total += (L->hits[i].hi - L->hits[i].lo) * sizeof(float);
  if (total >= COPY_SPLIT_MIN) {
    size_t acc = 0;
    for (split = 0; split < L->n_hits && 2 * acc < total; split++)
      acc += (L->hits[split].hi - L->hits[split].lo) * sizeof(float);
  }
  copy_job second = {L, split, L->n_hits};
  pthread_t t;
  const bool threaded = split < L->n_hits && pthread_create(&t, NULL, copy_hits_job, &second) == 0;
  copy_hits(L, 0, threaded ? split : L->n_hits);
  if (threaded) pthread_join(t, NULL);
  return PX_OK;
}
