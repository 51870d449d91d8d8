// bench_checkpoint_sharded: save and load speed of a sharded (ZeRO-3)
// checkpoint, per rank and in aggregate, as the training loop writes it:
// every rank writes its slice of the parameters (model.rank*) and of Adam's
// two moments (optim.rank*) as pieces of named tensors with
// px_checkpoint_write_all (hashing while writing, fsync, SHA256SUMS by rank
// 0, rename), and loads its slice back with px_checkpoint_load_boxes.
//
//   bench_checkpoint_sharded [--ranks N] [--dir DIR] [--params P] [--repeats R] [--settle S]
//
//   --ranks N     ranks as threads (default 1); under mpirun, the MPI ranks
//   --dir DIR     where the checkpoints go (default /var/tmp): a disk, not tmpfs
//   --params P    parameters (default 52428800: 200 MiB of F32, so a
//                 checkpoint of 600 MiB with Adam's exp_avg and exp_avg_sq),
//                 as 24 tensors of uneven sizes (none a multiple of N)
//   --repeats R   timed saves (each followed by a cold, a warm and a
//                 settled cold load)
//   --settle S    seconds between the drop and the settled cold load
//                 (default 3; 0 leaves that load out)
//
// Load "cold": the checkpoint's files are dropped from the page cache first
// (posix_fadvise DONTNEED after fdatasync), so they come from the disk;
// "warm": right after, from the page cache, as when a run resumes right
// after a save; "settled cold": dropped again, then S seconds of waiting
// before the load.  The wait matters on a virtual machine that hands free
// memory back to its host (Linux's free page reporting, which this CI
// machine's kernel runs with page_reporting_order=11): within about 2 s
// of the drop the freed page-cache memory is reported, and the first
// touch of reported memory is slow (the host maps it again), so a read
// into fresh page cache right after a drop and one a few seconds later
// run at different speeds, for dd as for plexus (docs/PERFORMANCE.md).
// bench/run_checkpoint.sh waits the same S before dd's settled read.
// Each figure is the median over the repeats (best in
// brackets).  Times are the slowest rank's (a collective save or load ends
// when its last rank is done); "per rank" is the checkpoint's bytes / N /
// that time, "aggregate" the checkpoint's bytes / that time.  Also printed:
// the bytes each rank actually reads per load (through the index, only its
// own pieces, each checked against its CRC-32C).  One line per figure:
//
//   RESULT op=save ranks=2 bytes=629145600 median_s=.. best_s=.. agg_MBps=.. per_rank_MBps=.. cpu_s=..
//
// A timed save is px_checkpoint_write_all with keep_last 0: until the
// checkpoint is committed (files fsynced, SHA256SUMS, rename).  Removing
// the previous checkpoint (what keep_last's rotation does in training) is
// not writing and dd's figure leaves out its own rm, so it is timed apart:
// after each repeat's loads rank 0 removes the checkpoint just written and
// reports the median time ("NOTE removing ...").  Until 2026-11-25 the
// timed save ran with keep_last 1 and so included deleting the previous
// repeat's 629 MB in repeats 2 and 3.
//
// cpu_s: CPU seconds (user + system, getrusage) per save or load: of every
// rank under the threads backend (one process), of rank 0's process under
// MPI.  On a machine shared with other work the wall times follow the CPU
// share the bench gets; cpu_s does not.
#define _GNU_SOURCE
#include "plexus/plexus.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/sha256.h"

enum { N_TENSORS = 24, MAX_REPEATS = 64 };

typedef struct bench {
  const char *dir;
  size_t params;
  int repeats;
  double settle;  // --settle: seconds from the drop to the settled cold load
  int64_t shape[N_TENSORS][2];
  size_t numel[N_TENSORS], start[N_TENSORS];  // start: offset in the flat concatenation
} bench;

// This rank's pieces of the flat concatenation [lo, hi): one per tensor it
// touches, key prefixed by `slot` ("" for parameters, "exp_avg." ...).
static int rank_pieces(const bench *b, size_t lo, size_t hi, const char *slot, float *data, px_tensor_piece *out) {
  int n = 0;
  for (int k = 0; k < N_TENSORS; k++) {
    size_t a = b->start[k], e = a + b->numel[k];
    size_t s = a > lo ? a : lo, t = e < hi ? e : hi;
    if (s >= t) continue;
    px_tensor_piece *p = &out[n++];
    memset(p, 0, sizeof *p);
    snprintf(p->key, sizeof p->key, "%sblock%02d.weight", slot, k);
    p->ndim = 2;
    p->shape[0] = b->shape[k][0];
    p->shape[1] = b->shape[k][1];
    p->offset = s - a;
    p->count = t - s;
    p->data = data + (s - lo);
  }
  return n;
}

static double median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
      double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double best_of(const double *v, int n) {
  double b = v[0];
  for (int i = 1; i < n; i++) b = v[i] < b ? v[i] : b;
  return b;
}

// Drops a checkpoint's files from the page cache (rank 0, after a barrier).
static void drop_cache(const char *ckpt) {
  DIR *d = opendir(ckpt);
  if (!d) return;
  struct dirent *e;
  char p[2048];
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(p, sizeof p, "%s/%s", ckpt, e->d_name);
    int fd = open(p, O_RDONLY);
    if (fd < 0) continue;
    if (fdatasync(fd) != 0 || posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)
      fprintf(stderr, "bench_checkpoint_sharded: could not drop %s from the page cache\n", p);
    close(fd);
  }
  closedir(d);
}

// Where a warm load's time goes, on rank 0 alone: reading the files of
// the checkpoint (read(2) into freshly allocated memory, as the loader
// does, and again into the same memory), SHA-256 over those bytes, and
// px_checkpoint_read_file (both, as the loader does it); against the
// whole px_checkpoint_load_boxes of the same files, one rank.
static void breakdown(const char *ckpt, size_t bytes) {
  DIR *d = opendir(ckpt);
  if (!d) return;
  char names[64][256], p[2048];
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 64)
    if (strstr(e->d_name, ".safetensors")) snprintf(names[n++], sizeof names[0], "%s", e->d_name);
  closedir(d);
  double t_read = 0, t_reread = 0, t_hash = 0, t_rf = 0;
  for (int i = 0; i < n; i++) {
    if ((size_t)snprintf(p, sizeof p, "%s/%s", ckpt, names[i]) >= sizeof p) continue;
    int fd = open(p, O_RDONLY);
    off_t len = fd >= 0 ? lseek(fd, 0, SEEK_END) : -1;
    char *buf = len > 0 ? malloc((size_t)len) : NULL;
    if (!buf) {
      if (fd >= 0) close(fd);
      return;
    }
    double t0 = px_time_now();
    size_t got = 0;
    while (got < (size_t)len) {
      ssize_t k = pread(fd, buf + got, (size_t)len - got, (off_t)got);
      if (k <= 0) break;
      got += (size_t)k;
    }
    t_read += px_time_now() - t0;
    // Again into the same, now mapped, memory: the difference is the
    // first touch of freshly allocated pages (a fault and zeroing each).
    t0 = px_time_now();
    for (size_t at = 0; at < got;) {
      ssize_t k = pread(fd, buf + at, got - at, (off_t)at);
      if (k <= 0) break;
      at += (size_t)k;
    }
    t_reread += px_time_now() - t0;
    close(fd);
    t0 = px_time_now();
    px_sha256 sh;
    unsigned char dg[PX_SHA256_BYTES];
    px_sha256_init(&sh);
    px_sha256_update(&sh, buf, got);
    px_sha256_final(&sh, dg);
    t_hash += px_time_now() - t0;
    free(buf);
    void *bytes_rf;
    size_t n_rf;
    t0 = px_time_now();
    if (px_checkpoint_read_file(ckpt, names[i], &bytes_rf, &n_rf) == PX_OK) free(bytes_rf);
    t_rf += px_time_now() - t0;
  }
  printf("BREAKDOWN one thread, warm, %zu bytes: read(2) into new memory %.0f MB/s, into touched memory %.0f MB/s, "
         "sha256 (%s) %.0f MB/s, px_checkpoint_read_file (read + sha256) %.0f MB/s\n",
         bytes, bytes / t_read / 1e6, bytes / t_reread / 1e6, px_sha256_impl_name(), bytes / t_hash / 1e6,
         bytes / t_rf / 1e6);
}

// CPU seconds (user + system) this process has used: every rank's under
// the threads backend, this rank's under MPI.
static double cpu_now(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + 1e-6 * (double)u.ru_utime.tv_usec + (double)u.ru_stime.tv_sec +
    1e-6 * (double)u.ru_stime.tv_usec;
}

static double max_over_ranks(px_comm *c, double t) {
  px_comm_allreduce(c, &t, 1, PX_F64, PX_MAX);
  return t;
}

static void report(px_comm *c, const char *op, int N, size_t bytes, double *t, int n, double cpu) {
  if (px_comm_rank(c) != 0) return;
  double best = best_of(t, n), med = median(t, n);
  printf("RESULT op=%s ranks=%d bytes=%zu median_s=%.4f best_s=%.4f agg_MBps=%.1f per_rank_MBps=%.1f "
         "best_agg_MBps=%.1f cpu_s=%.3f (%s)\n",
         op, N, bytes, med, best, bytes / med / 1e6, bytes / med / 1e6 / N, bytes / best / 1e6, cpu / n,
         px_comm_backend_of(c) == PX_COMM_MPI ? "rank 0's process" : "every rank");
  fflush(stdout);
}

static int run_rank(px_comm *c, void *arg) {
  const bench *b = arg;
  const int r = px_comm_rank(c), N = px_comm_size(c);
  const size_t lo = b->params * (size_t)r / (size_t)N, hi = b->params * (size_t)(r + 1) / (size_t)N, n = hi - lo;
  float *w = malloc(n * sizeof *w), *m = malloc(n * sizeof *m), *v = malloc(n * sizeof *v);
  float *back = malloc(3 * n * sizeof *back);
  px_tensor_piece *mp = calloc(N_TENSORS, sizeof *mp), *op = calloc(2 * N_TENSORS, sizeof *op);
  px_tensor_piece *mw = calloc(N_TENSORS, sizeof *mw), *ow = calloc(2 * N_TENSORS, sizeof *ow);
  if (!w || !m || !v || !back || !mp || !op || !mw || !ow) {
    fprintf(stderr, "bench_checkpoint_sharded: rank %d: out of memory\n", r);
    return 1;
  }
  // One directory for every rank: rank 0's pid names it (under MPI each
  // rank is a process of its own).
  int64_t pid = (int64_t)getpid();
  char dir[700];
  px_comm_broadcast(c, &pid, 1, PX_I64, 0);
  snprintf(dir, sizeof dir, "%s/px_bench_ckpt_sharded_%lld", b->dir, (long long)pid);
  px_rng g = px_rng_make(7, (uint64_t)r);
  for (size_t i = 0; i < n; i++) {
    w[i] = px_rng_normal(&g);
    m[i] = 0.1f * w[i];
    v[i] = w[i] * w[i];
  }
  const int n_mp = rank_pieces(b, lo, hi, "", w, mp);
  const int n_om = rank_pieces(b, lo, hi, "exp_avg.", m, op);
  const int n_op = n_om + rank_pieces(b, lo, hi, "exp_avg_sq.", v, op + n_om);
  // What this rank loads back: the same slices, into `back`.
  memcpy(mw, mp, (size_t)n_mp * sizeof *mw);
  memcpy(ow, op, (size_t)n_op * sizeof *ow);
  for (int k = 0; k < n_mp; k++) mw[k].data = back + (mp[k].data - w);
  for (int k = 0; k < n_op; k++) ow[k].data = k < n_om ? back + n + (op[k].data - m) : back + 2 * n + (op[k].data - v);

  px_state_dict msd, osd;
  char *mjson = NULL, *ojson = NULL, model_file[64], optim_file[64], world_s[16], rank_s[16];
  px_status st = px_pieces_state_dict(mp, n_mp, &msd, &mjson);
  if (st == PX_OK) st = px_pieces_state_dict(op, n_op, &osd, &ojson);
  if (st != PX_OK) {
    fprintf(stderr, "bench_checkpoint_sharded: rank %d: %s\n", r, px_last_error());
    return 1;
  }
  snprintf(model_file, sizeof model_file, "model.rank%05d-of-%05d.safetensors", r, N);
  snprintf(optim_file, sizeof optim_file, "optim.rank%05d-of-%05d.safetensors", r, N);
  snprintf(world_s, sizeof world_s, "%d", N);
  snprintf(rank_s, sizeof rank_s, "%d", r);
  const px_kv mmeta[6] = {{"format", PX_PIECES_FORMAT}, {"version", PX_PIECES_VERSION}, {"pieces", mjson},
                          {"zero_stage", "3"},          {"world_size", world_s},        {"rank", rank_s}};
  const px_kv ometa[6] = {{"format", PX_PIECES_FORMAT}, {"version", PX_PIECES_VERSION}, {"pieces", ojson},
                          {"zero_stage", "3"},          {"world_size", world_s},        {"rank", rank_s}};
  const char *json = "{\"step\": 1000, \"zero_stage\": 3}\n";
  px_ckpt_item items[3] = {{.name = model_file, .tensors = &msd, .metadata = mmeta, .n_metadata = 6},
                           {.name = optim_file, .tensors = &osd, .metadata = ometa, .n_metadata = 6},
                           {.name = "state.json", .bytes = json, .n_bytes = strlen(json)}};
  const size_t bytes = 3 * b->params * sizeof(float);
  // t_load: cold, warm, settled cold
  double t_save[MAX_REPEATS] = {0}, t_load[3][MAX_REPEATS] = {{0}}, t_rm[MAX_REPEATS] = {0};
  double cpu_save = 0, cpu_load[3] = {0, 0, 0};
  const int kinds = b->settle > 0 ? 3 : 2;
  char path[1024];
  int rc = 0;
  for (int rep = 0; rep < b->repeats && rc == 0; rep++) {
    px_comm_barrier(c);
    double t0 = px_time_now(), c0 = cpu_now();
    st = px_checkpoint_write_all(c, dir, 1000 + rep, items, r == 0 ? 3 : 2, 0, path, sizeof path);
    t_save[rep] = max_over_ranks(c, px_time_now() - t0);
    cpu_save += cpu_now() - c0;
    if (st != PX_OK) {
      fprintf(stderr, "bench_checkpoint_sharded: rank %d: save: %s\n", r, px_last_error());
      rc = 1;
      break;
    }
    for (int kind = 0; kind < kinds && rc == 0; kind++) {
      if (kind != 1 && r == 0) drop_cache(path);
      memset(back, 0, 3 * n * sizeof *back);
      if (kind == 2) {
        const struct timespec pause = {(time_t)b->settle, (long)((b->settle - (double)(time_t)b->settle) * 1e9)};
        nanosleep(&pause, NULL);
      }
      px_comm_barrier(c);
      t0 = px_time_now();
      double c1 = cpu_now();
      st = px_checkpoint_load_boxes(path, "model", mw, n_mp);
      if (st == PX_OK) st = px_checkpoint_load_boxes(path, "optim", ow, n_op);
      const double t = max_over_ranks(c, px_time_now() - t0);
      cpu_load[kind] += cpu_now() - c1;
      t_load[kind][rep] = t;
      if (st != PX_OK || memcmp(back, w, n * sizeof *w) != 0 || memcmp(back + n, m, n * sizeof *m) != 0 ||
          memcmp(back + 2 * n, v, n * sizeof *v) != 0) {
        fprintf(stderr, "bench_checkpoint_sharded: rank %d: load: %s\n", r,
                st != PX_OK ? px_last_error() : "the data loaded differs from the data saved");
        rc = 1;
      }
    }
    // The checkpoint removed, untimed (as dd's rm): the next save writes
    // into a directory without it, and the removal's own time is reported.
    px_comm_barrier(c);
    if (r == 0 && rc == 0) {
      if (N == 1 && rep == b->repeats - 1) breakdown(path, bytes);
      t0 = px_time_now();
      if (px_ckpt_remove_tree(path) != PX_OK) fprintf(stderr, "bench_checkpoint_sharded: %s\n", px_last_error());
      t_rm[rep] = px_time_now() - t0;
    }
  }
  if (rc == 0) {
    report(c, "save", N, bytes, t_save, b->repeats, cpu_save);
    report(c, "load_cold", N, bytes, t_load[0], b->repeats, cpu_load[0]);
    report(c, "load_warm", N, bytes, t_load[1], b->repeats, cpu_load[1]);
    if (kinds == 3) report(c, "load_settled", N, bytes, t_load[2], b->repeats, cpu_load[2]);
    if (r == 0) {
      // What a load reads: through metadata.json, only the rank's own pieces
      // (pread, adjacent pieces in one read), plus each file's header.
      printf("NOTE each rank reads its %zu bytes of pieces per load (found through metadata.json) plus the "
             "headers\n",
             bytes / (size_t)N);
      printf("NOTE removing a checkpoint (what keep_last's rotation does; outside the timed save): %.3f s median\n",
             median(t_rm, b->repeats));
      char cmd[1200];
      snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
      if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
  }
  px_state_dict_free(&msd);
  px_state_dict_free(&osd);
  free(mjson);
  free(ojson);
  free(w);
  free(m);
  free(v);
  free(back);
  free(mp);
  free(op);
  free(mw);
  free(ow);
  return rc;
}

int main(int argc, char **argv) {
  bench b = {.dir = "/var/tmp", .params = 52428800, .repeats = 3, .settle = 3};
  int ranks = 1;
  for (int a = 1; a + 1 < argc; a += 2) {
    if (strcmp(argv[a], "--ranks") == 0) ranks = atoi(argv[a + 1]);
    else if (strcmp(argv[a], "--dir") == 0) b.dir = argv[a + 1];
    else if (strcmp(argv[a], "--params") == 0) b.params = (size_t)atoll(argv[a + 1]);
    else if (strcmp(argv[a], "--repeats") == 0) b.repeats = atoi(argv[a + 1]);
    else if (strcmp(argv[a], "--settle") == 0) {
      char *end;
      b.settle = strtod(argv[a + 1], &end);
      if (end == argv[a + 1] || *end) b.settle = -1;  // refused below
    } else {
      fprintf(stderr,
              "usage: bench_checkpoint_sharded [--ranks N] [--dir DIR] [--params P] [--repeats R] [--settle S]\n");
      return 2;
    }
  }
  if (ranks < 1 || b.repeats < 1 || b.repeats > MAX_REPEATS || b.params < 1000 || !(b.settle >= 0 && b.settle <= 60)) {
    fprintf(stderr,
            "bench_checkpoint_sharded: --ranks >= 1, 1 <= --repeats <= %d, --params >= 1000, 0 <= --settle <= 60\n",
            MAX_REPEATS);
    return 2;
  }
  // 24 tensors of uneven sizes (weights 1..24 of the total), 2-D with an
  // odd number of rows, so no shard boundary falls on a tensor boundary.
  size_t at = 0;
  for (int k = 0; k < N_TENSORS; k++) {
    size_t want = k == N_TENSORS - 1 ? b.params - at : b.params * (size_t)(k + 1) / 300;
    int64_t rows = 2 * (k % 5) + 1;
    while (rows > 1 && want % (size_t)rows) rows -= 2;
    b.shape[k][0] = rows;
    b.shape[k][1] = (int64_t)(want / (size_t)rows);
    b.numel[k] = want;
    b.start[k] = at;
    at += want;
  }
  int code = 0;
  px_status st = px_comm_run(ranks, run_rank, &b, &code);
  if (st != PX_OK) {
    fprintf(stderr, "bench_checkpoint_sharded: %s\n", px_last_error());
    return 1;
  }
  return code;
}
