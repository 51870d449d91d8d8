// The prefetching loader: worker threads fill batches ahead of the loop.
//
// Batches live in a ring of `ring` slots; batch k of the epoch always goes
// to slot k % ring.  A worker claims the lowest unclaimed batch k as soon as
// its slot is free (the loop has moved past batch k - ring), fills it, and
// marks it ready; px_loader_next hands out batches strictly in order and
// frees the previous one's slot.  Which worker fills which batch varies
// from run to run; what goes into a batch does not: rows come from the
// sampler's order, and each sample's random transforms from its own Philox
// stream keyed by (seed, epoch, index).
#include "plexus/data.h"

#include "data/s3.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SLOT_EMPTY = 0, SLOT_FILLING, SLOT_READY };

typedef struct slot {
  px_batch batch;
  int state;
  px_status status;  // of the fill; PX_OK or the first failing sample's
  char error[512];   // its message, copied from the worker's thread
} slot;

struct px_loader {
  px_dataset *d;
  px_loader_opts o;
  px_sampler sampler;
  size_t num_batches;
  int ring;
  slot *slots;

  pthread_mutex_t mu;
  pthread_cond_t work;   // workers wait here for a claimable batch
  pthread_cond_t ready;  // the loop waits here for its batch, start_epoch for idle workers
  pthread_t *threads;
  int n_threads;
  bool sync_ready;  // mu, work and ready are initialised
  bool stop;
  bool running;  // an epoch has been started
  uint64_t epoch;
  size_t next_claim;  // lowest batch not yet claimed
  size_t next_out;    // batch px_loader_next hands out next
  bool holding;       // the loop holds batch next_out - 1
  int filling;        // workers inside a fill

  size_t skipped;
  char first_skip[512];
  bool reported;
  double wait_s;
  atomic_bool no_s3;  // a batch's dry run recorded no S3 read: the dataset reads none
};

// The sample's own stream: a function of (seed, epoch, index) only.
static px_rng sample_rng(uint64_t seed, uint64_t epoch, size_t index) {
  uint64_t z = epoch * 0x9E3779B97F4A7C15ull + (uint64_t)index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return px_rng_make(seed, z ^ (z >> 31));
}

// Fill batch `number` into s (no lock held; the sampler is not changed
// while any fill runs).  Bad samples are skipped or end the fill.
static void fill(px_loader *l, slot *s, size_t number, size_t *skipped, char *skip_msg, size_t cap) {
  px_batch *b = &s->batch;
  size_t bs = l->o.batch_size;
  size_t first = number * bs;
  size_t last = first + bs;
  if (last > l->sampler.num_samples) last = l->sampler.num_samples;
  size_t row = 0;
  s->status = PX_OK;
  s->error[0] = '\0';
  // S3 reads, several in flight (s3.h, "Batch fetch"): a dry run of the
  // batch's gets records the requests they make, which go out together;
  // the real gets below are then answered from what came back.  A dataset
  // whose first sample reads nothing from S3 is not dry-run again.
  bool batched = false;
  if (!atomic_load_explicit(&l->no_s3, memory_order_relaxed) && px_s3_batch_begin()) {
    for (size_t k = first; k < last; k++) {
      size_t index = l->sampler.indices[k];
      px_rng rng = sample_rng(l->o.seed, l->epoch, index);
      (void)px_dataset_get(l->d, index, b, k - first, &rng);  // its rows are written again below
      if (k == first && px_s3_batch_planned() == 0) break;
    }
    batched = px_s3_batch_fetch();
    if (!batched) atomic_store_explicit(&l->no_s3, true, memory_order_relaxed);
  }
  for (size_t k = first; k < last; k++) {
    size_t index = l->sampler.indices[k];
    px_rng rng = sample_rng(l->o.seed, l->epoch, index);
    px_status st = px_dataset_get(l->d, index, b, row, &rng);
    if (st == PX_OK) {
      b->indices[row++] = index;
      continue;
    }
    if (l->o.skip_bad && (st == PX_ERR_FORMAT || st == PX_ERR_IO)) {
      if (*skipped == 0) snprintf(skip_msg, cap, "%s", px_last_error());
      (*skipped)++;
      continue;
    }
    s->status = st;
    snprintf(s->error, sizeof s->error, "%s", px_last_error());
    break;
  }
  if (batched) px_s3_batch_end();
  b->n = row;
  b->x.shape[0] = (int64_t)row;
  b->y.shape[0] = (int64_t)row;
  b->epoch = l->epoch;
  b->number = number;
}

// A batch k may be claimed when it exists and its slot is free: the loop
// has released batch k - ring (it releases batch j on the call after the
// one that returned it).
static bool claimable(const px_loader *l) {
  if (!l->running || l->next_claim >= l->num_batches) return false;
  size_t released = l->next_out - (l->holding ? 1 : 0);  // batches < released are done with
  return l->next_claim < released + (size_t)l->ring;
}

static void note_skips(px_loader *l, size_t skipped, const char *msg) {
  if (skipped == 0) return;
  if (l->skipped == 0) snprintf(l->first_skip, sizeof l->first_skip, "%s", msg);
  l->skipped += skipped;
}

static void *worker_main(void *arg) {
  px_loader *l = arg;
  char msg[512];
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->stop && !claimable(l)) pthread_cond_wait(&l->work, &l->mu);
    if (l->stop) break;
    size_t number = l->next_claim++;
    slot *s = &l->slots[number % (size_t)l->ring];
    s->state = SLOT_FILLING;
    l->filling++;
    pthread_mutex_unlock(&l->mu);

    size_t skipped = 0;
    fill(l, s, number, &skipped, msg, sizeof msg);

    pthread_mutex_lock(&l->mu);
    note_skips(l, skipped, msg);
    s->state = SLOT_READY;
    l->filling--;
    pthread_cond_broadcast(&l->ready);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

px_status px_loader_create(px_loader **out, px_dataset *d, const px_loader_opts *opts) {
  *out = NULL;
  if (!d || !opts) return px_error(PX_ERR_INVALID, "loader: NULL dataset or options");
  px_loader_opts o = *opts;
  if (o.world == 0) o.world = 1;
  if (o.batch_size == 0) return px_error(PX_ERR_INVALID, "loader: batch_size must be at least 1");
  if (o.workers < 0 || o.workers > 256)
    return px_error(PX_ERR_INVALID, "loader: workers must be in [0, 256], got %d", o.workers);
  if (o.prefetch < 0) return px_error(PX_ERR_INVALID, "loader: prefetch must be >= 0, got %d", o.prefetch);

  px_loader *l = calloc(1, sizeof *l);
  if (!l) return px_error(PX_ERR_NOMEM, "loader: out of memory");
  l->d = d;
  l->o = o;
  px_status st = px_sampler_init(&l->sampler, d->length, o.rank, o.world, o.shuffle, o.seed, o.drop_last);
  if (st != PX_OK) {
    free(l);
    return px_error_wrap(st, "loader (%s dataset)", d->kind);
  }
  size_t n = l->sampler.num_samples;
  l->num_batches = o.drop_last_batch ? n / o.batch_size : (n + o.batch_size - 1) / o.batch_size;
  if (l->num_batches == 0) {
    px_sampler_free(&l->sampler);
    free(l);
    return px_error(PX_ERR_INVALID, "loader: %zu samples per rank make no full batch of %zu (drop_last_batch is set)",
                    n, o.batch_size);
  }
  // Enough slots for every worker to fill one while the loop holds one.
  int ring = o.prefetch > 0 ? o.prefetch : 2 * (o.workers > 1 ? o.workers : 1);
  if (ring < o.workers + 1) ring = o.workers + 1;
  if (o.workers == 0) ring = 1;
  l->ring = ring;
  l->slots = calloc((size_t)ring, sizeof *l->slots);
  if (!l->slots) {
    px_loader_free(l);
    return px_error(PX_ERR_NOMEM, "loader: out of memory");
  }
  for (int i = 0; i < ring; i++) {
    st = px_batch_alloc(&l->slots[i].batch, d, o.batch_size);
    if (st != PX_OK) {
      px_loader_free(l);
      return px_error_wrap(st, "loader");
    }
  }
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->work, NULL);
  pthread_cond_init(&l->ready, NULL);
  l->sync_ready = true;
  if (o.workers > 0) {
    l->threads = calloc((size_t)o.workers, sizeof *l->threads);
    if (!l->threads) {
      px_loader_free(l);
      return px_error(PX_ERR_NOMEM, "loader: out of memory");
    }
    for (int i = 0; i < o.workers; i++) {
      if (pthread_create(&l->threads[i], NULL, worker_main, l) != 0) {
        px_loader_free(l);
        return px_error(PX_ERR_INTERNAL, "loader: could not start worker thread %d of %d", i, o.workers);
      }
      l->n_threads++;
    }
  }
  *out = l;
  return PX_OK;
}

px_status px_loader_start_epoch(px_loader *l, uint64_t epoch, size_t first_batch) {
  if (first_batch > l->num_batches)
    return px_error(PX_ERR_INVALID, "loader: epoch has %zu batches; cannot start at batch %zu", l->num_batches,
                    first_batch);
  pthread_mutex_lock(&l->mu);
  // Let fills of the old epoch finish before the sampler's order changes.
  l->running = false;
  while (l->filling > 0) pthread_cond_wait(&l->ready, &l->mu);
  px_sampler_set_epoch(&l->sampler, epoch);
  for (int i = 0; i < l->ring; i++) l->slots[i].state = SLOT_EMPTY;
  l->epoch = epoch;
  l->next_claim = l->next_out = first_batch;
  l->holding = false;
  l->skipped = 0;
  l->first_skip[0] = '\0';
  l->reported = false;
  l->wait_s = 0;
  l->running = true;
  pthread_cond_broadcast(&l->work);
  pthread_mutex_unlock(&l->mu);
  return PX_OK;
}

px_status px_loader_next(px_loader *l, const px_batch **out) {
  *out = NULL;
  pthread_mutex_lock(&l->mu);
  if (!l->running) {
    pthread_mutex_unlock(&l->mu);
    return px_error(PX_ERR_INVALID, "loader: px_loader_next before px_loader_start_epoch");
  }
  if (l->holding) {  // the previous batch's slot is free again
    l->slots[(l->next_out - 1) % (size_t)l->ring].state = SLOT_EMPTY;
    l->holding = false;
    pthread_cond_broadcast(&l->work);
  }
  if (l->next_out >= l->num_batches) {
    if (l->skipped > 0 && !l->reported) {
      fprintf(stderr, "loader: skipped %zu bad record%s in epoch %llu (first: %s)\n", l->skipped,
              l->skipped == 1 ? "" : "s", (unsigned long long)l->epoch, l->first_skip);
      l->reported = true;
    }
    pthread_mutex_unlock(&l->mu);
    return PX_OK;
  }
  size_t number = l->next_out;
  slot *s = &l->slots[number % (size_t)l->ring];
  if (l->n_threads == 0) {
    // No workers: fill here, on the caller's thread.
    char msg[512];
    size_t skipped = 0;
    pthread_mutex_unlock(&l->mu);
    double t0 = px_time_now();
    fill(l, s, number, &skipped, msg, sizeof msg);
    pthread_mutex_lock(&l->mu);
    l->wait_s += px_time_now() - t0;
    note_skips(l, skipped, msg);
    l->next_claim = number + 1;
    s->state = SLOT_READY;
  } else if (s->state != SLOT_READY) {
    double t0 = px_time_now();
    while (s->state != SLOT_READY) pthread_cond_wait(&l->ready, &l->mu);
    l->wait_s += px_time_now() - t0;
  }
  l->next_out = number + 1;
  l->holding = true;
  px_status st = s->status;
  if (st != PX_OK) {
    // Keep the error on the caller's thread, where px_last_error reads it.
    px_error(st, "loader: batch %zu of epoch %llu: %s", number, (unsigned long long)l->epoch, s->error);
    pthread_mutex_unlock(&l->mu);
    return st;
  }
  pthread_mutex_unlock(&l->mu);
  *out = &s->batch;
  return PX_OK;
}

size_t px_loader_num_batches(const px_loader *l) { return l->num_batches; }

size_t px_loader_skipped(const px_loader *l) {
  pthread_mutex_lock((pthread_mutex_t *)&l->mu);
  size_t n = l->skipped;
  pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
  return n;
}

double px_loader_wait_seconds(const px_loader *l) { return l->wait_s; }

void px_loader_free(px_loader *l) {
  if (!l) return;
  if (l->n_threads > 0) {
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_broadcast(&l->work);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->n_threads; i++) pthread_join(l->threads[i], NULL);
  }
  if (l->slots)
    for (int i = 0; i < l->ring; i++) px_batch_free(&l->slots[i].batch);
  free(l->slots);
  free(l->threads);
  px_sampler_free(&l->sampler);
  if (l->sync_ready) {
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->work);
    pthread_cond_destroy(&l->ready);
  }
  free(l);
}
