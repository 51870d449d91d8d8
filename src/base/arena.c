// Bump allocator for activations.  Chunks grow while the first steps learn
// how much a step needs; reset merges them into one block, so steady state
// allocates nothing (DESIGN decision 4).
#include "plexus/base.h"

#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN 64

typedef struct chunk {
  struct chunk *prev;
  size_t size;
  size_t used;
  unsigned char *mem;
} chunk;

struct px_arena {
  const px_arena_mem *mem; /* where the chunks live */
  chunk *head;             /* current chunk; older ones behind it */
  chunk *spare;            /* chunks emptied by a rewind, freed at the next reset */
  size_t total_used;       /* bytes handed out since the last reset */
  size_t high_water;
  uint64_t system_allocs;
};

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static void *host_alloc(size_t bytes) { return aligned_alloc(ARENA_ALIGN, round_up(bytes, ARENA_ALIGN)); }
static void host_zero(void *p, size_t bytes) { memset(p, 0, bytes); }
static void host_move(void *dst, const void *src, size_t bytes) { memmove(dst, src, bytes); }
static const px_arena_mem host_mem = {host_alloc, free, host_zero, host_move};

static chunk *chunk_new(const px_arena_mem *mem, size_t size) {
  chunk *c = malloc(sizeof *c);
  if (!c) return NULL;
  c->mem = mem->alloc(round_up(size, ARENA_ALIGN));
  if (!c->mem) {
    free(c);
    return NULL;
  }
  c->prev = NULL;
  c->size = size;
  c->used = 0;
  return c;
}

px_arena *px_arena_create(size_t initial_bytes) { return px_arena_create_with(initial_bytes, NULL); }

px_arena *px_arena_create_with(size_t initial_bytes, const px_arena_mem *mem) {
  px_arena *a = calloc(1, sizeof *a);
  if (!a) {
    px_error(PX_ERR_NOMEM, "arena: out of memory");
    return NULL;
  }
  a->mem = mem ? mem : &host_mem;
  if (initial_bytes < (1u << 20)) initial_bytes = 1u << 20;
  a->head = chunk_new(a->mem, initial_bytes);
  if (!a->head) {
    free(a);
    px_error(PX_ERR_NOMEM, "arena: cannot allocate %zu bytes", initial_bytes);
    return NULL;
  }
  a->system_allocs = 1;
  return a;
}

static void free_chunks(const px_arena_mem *mem, chunk *c) {
  while (c) {
    chunk *p = c->prev;
    mem->free(c->mem);
    free(c);
    c = p;
  }
}

void px_arena_free(px_arena *a) {
  if (!a) return;
  free_chunks(a->mem, a->head);
  free_chunks(a->mem, a->spare);
  free(a);
}

void *px_arena_alloc(px_arena *a, size_t bytes) {
  size_t need = round_up(bytes ? bytes : 1, ARENA_ALIGN);
  chunk *c = a->head;
  if (c->used + need > c->size && a->spare) {
    // A chunk a rewind emptied, if one is big enough: during the first
    // steps, before the arena is one block, checkpointed units would
    // otherwise grow a new chunk for every unit.  (rewind_keep's source may
    // lie in it: the new block starts at the chunk's start, below the
    // source, and memmove copies down.)
    chunk **link = &a->spare;
    while (*link && (*link)->size < need) link = &(*link)->prev;
    if (*link) {
      chunk *reuse = *link;
      *link = reuse->prev;
      reuse->prev = c;
      reuse->used = 0;
      a->head = c = reuse;
    }
  }
  if (c->used + need > c->size) {
    size_t size = c->size * 2;
    if (size < need) size = need;
    chunk *n = chunk_new(a->mem, size);
    if (!n) {
      px_error(PX_ERR_NOMEM, "arena: cannot allocate %zu bytes", size);
      return NULL;
    }
    n->prev = c;
    a->head = c = n;
    a->system_allocs++;
  }
  void *p = c->mem + c->used;
  c->used += need;
  a->total_used += need;
  if (a->total_used > a->high_water) a->high_water = a->total_used;
  return p;
}

void *px_arena_calloc(px_arena *a, size_t bytes) {
  void *p = px_arena_alloc(a, bytes);
  if (p) a->mem->zero(p, bytes);
  return p;
}

void px_arena_reset(px_arena *a) {
  free_chunks(a->mem, a->spare);
  a->spare = NULL;
  if (a->head->prev) {
    // Several chunks: replace them all by one that holds the high water.
    chunk *big = chunk_new(a->mem, a->high_water);
    if (big) {
      free_chunks(a->mem, a->head);
      a->head = big;
      a->system_allocs++;
    } else {
      // Keep the chunks; drop all but the newest (largest).
      free_chunks(a->mem, a->head->prev);
      a->head->prev = NULL;
    }
  }
  a->head->used = 0;
  a->total_used = 0;
}

// A mark is the head chunk and its fill.  Rewinding pops the chunks grown
// since (they go to `spare`, unfreed, so what they hold stays readable until
// the next reset) and restores the fill.  In steady state the arena is one
// chunk and a rewind is two stores.
px_arena_mark px_arena_get_mark(const px_arena *a) {
  return (px_arena_mark){.chunk = a->head, .used = a->head->used, .total = a->total_used};
}

void px_arena_rewind(px_arena *a, px_arena_mark m) {
  while (a->head != m.chunk && a->head->prev) {
    chunk *c = a->head;
    a->head = c->prev;
    c->prev = a->spare;
    a->spare = c;
  }
  a->head->used = m.used;
  a->total_used = m.total;
}

// Whether p was handed out after m (it lies in m's chunk past m.used, or in
// a chunk grown since).
static bool since_mark(const px_arena *a, px_arena_mark m, const void *p) {
  const unsigned char *q = p;
  for (const chunk *c = a->head; c; c = c->prev) {
    const bool inside = q >= c->mem && q < c->mem + c->size;
    if (c == m.chunk) return inside && q >= c->mem + m.used;
    if (inside) return true;
  }
  return false;
}

void *px_arena_rewind_keep(px_arena *a, px_arena_mark m, void *p, size_t bytes) {
  if (!p || !since_mark(a, m, p)) {
    px_arena_rewind(a, m);
    return p;
  }
  px_arena_rewind(a, m);
  // The new block starts at or below p in the same chunk (memmove handles
  // the overlap), or in another chunk while p sits in a spare one.
  void *dst = px_arena_alloc(a, bytes);
  if (dst && dst != p) a->mem->move(dst, p, bytes);
  return dst;
}

size_t px_arena_used(const px_arena *a) { return a->total_used; }

size_t px_arena_capacity(const px_arena *a) {
  size_t s = 0;
  for (const chunk *c = a->head; c; c = c->prev) s += c->size;
  for (const chunk *c = a->spare; c; c = c->prev) s += c->size;
  return s;
}

uint64_t px_arena_system_allocs(const px_arena *a) { return a->system_allocs; }

size_t px_arena_high_water(const px_arena *a) { return a->high_water; }
