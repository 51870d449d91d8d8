/* bench_comm.c — latency and bus bandwidth of px_comm's collectives and
 * point-to-point, against raw MPI on the same buffers and against memcpy.
 *
 *   mpiexec -n 2 bench_comm [options]     px_comm's MPI backend, then raw MPI
 *   bench_comm --threads 2 [options]      px_comm's threads backend
 *
 *   --ops LIST     comma-separated: allreduce,allgather,reduce_scatter,broadcast,sendrecv
 *                  (default: all five)
 *   --min BYTES    smallest size (default 4096)        --max BYTES  largest (default 256 MiB)
 *   --factor F     size step (default 4)
 *   --seconds S    timed budget of one (op, size, side) (default 0.25)
 *   --rounds R     split that budget into R rounds (default 5; at least 1 iteration
 *                  each, 3 when R is 1); px_comm and raw MPI alternate round by
 *                  round (raw first in odd rounds), and each figure is the median round
 *   --async        time px_comm's i-variant + px_request_wait instead of the blocking call
 *   --no-raw       skip raw MPI          --no-memcpy   skip the memcpy line
 *   --mpi-thread single|serialized|multiple   initialise MPI at this thread
 *                  level before px_comm does (to measure what the level
 *                  costs; with PX_COMM_MPI_WAIT=poll px_comm's blocking
 *                  collectives then take the polling wait at any level)
 *
 * One line per measurement, parsed by bench/run_comm.sh:
 *
 *   comm impl=px-mpi op=allreduce bytes=1048576 iters=46 us=512.3 algbw=2.047 busbw=2.047 ranks=2 us_min=480.1 rounds=5
 *
 * Conventions (nccl-tests, docs/PERFORMANCE.md): `bytes` is the size of one
 * rank's buffer (allreduce, broadcast, send/recv), of the whole gathered
 * output (allgather) or of the whole input (reduce_scatter); iters the
 * iterations of one round; us is the time of one operation, the slowest
 * rank's average over the iterations of a round, the median round;
 * us_min the slowest rank's fastest single iteration (on a loaded machine
 * the average measures the load, the fastest iteration the operation);
 * algbw = bytes / time in GB/s (1e9); busbw = algbw × 2(n−1)/n for
 * allreduce, × (n−1)/n for allgather and reduce_scatter, × 1 for broadcast.
 * send/recv is a ping-pong between ranks 0 and 1: us is half a round trip,
 * busbw = bytes / us.  memcpy (impl=memcpy op=memcpy) copies `bytes` from
 * one buffer to another on rank 0: the machine's own copy bandwidth, the
 * ceiling of any shared-memory transport.  Under the threads backend the
 * other side of each round is the copy bound of threads.c's opening
 * comment: every rank memcpy-ing `bytes` at the same moment
 * (impl=copy-bound op=<the collective it was timed beside>, busbw =
 * bytes / time), against which run_comm.sh reports each collective's
 * fraction (bound time / collective time; the bound of a reduce_scatter is
 * (n+1)/(2n) of that copy, of the others all of it).
 *
 * Raw MPI runs in the same processes, on the same buffers, with MPI's
 * blocking calls on MPI_COMM_WORLD, in rounds alternating with px_comm's
 * (so a load that comes and goes on a shared machine hits both alike).  This is a
 * benchmark, not a test: it never fails on speed. */
#define _POSIX_C_SOURCE 200809L
#include <plexus/plexus.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef PX_HAVE_MPI
#include <mpi.h>
#endif

typedef enum { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_SENDRECV, N_OPS } op_kind;
static const char *const op_names[N_OPS] = {"allreduce", "allgather", "reduce_scatter", "broadcast", "sendrecv"};

#define MAX_ROUNDS 64

typedef struct opts {
  bool ops[N_OPS];
  size_t min_bytes, max_bytes;
  double factor;
  double seconds;
  int threads;
  int rounds;
  bool async, raw, memcpy_line;
  const char *mpi_thread;
} opts;

static void usage(FILE *f) {
  fprintf(f,
          "usage: mpiexec -n 2 bench_comm [options]   or   bench_comm --threads 2 [options]\n"
          "  --ops allreduce,allgather,reduce_scatter,broadcast,sendrecv   --min BYTES --max BYTES\n"
          "  --factor F --seconds S --rounds R --async --no-raw --no-memcpy\n"
          "  --mpi-thread single|serialized|multiple\n");
}

static int parse_args(int argc, char **argv, opts *o) {
  *o = (opts){.min_bytes = 4096,
              .max_bytes = 256u << 20,
              .factor = 4,
              .seconds = 0.25,
              .threads = 1,
              .rounds = 5,
              .raw = true,
              .memcpy_line = true};
  bool any = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      exit(0);
    }
    if (!strcmp(a, "--async")) {
      o->async = true;
      continue;
    }
    if (!strcmp(a, "--no-raw")) {
      o->raw = false;
      continue;
    }
    if (!strcmp(a, "--no-memcpy")) {
      o->memcpy_line = false;
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "bench_comm: %s needs a value\n", a);
      return -1;
    }
    const char *v = argv[++i];
    if (!strcmp(a, "--ops")) {
      char list[256];
      snprintf(list, sizeof list, "%s", v);
      for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        int k = 0;
        while (k < N_OPS && strcmp(tok, op_names[k])) k++;
        if (k == N_OPS) {
          fprintf(stderr, "bench_comm: unknown op \"%s\"\n", tok);
          return -1;
        }
        o->ops[k] = any = true;
      }
    } else if (!strcmp(a, "--min")) o->min_bytes = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--max")) o->max_bytes = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--factor")) o->factor = atof(v);
    else if (!strcmp(a, "--seconds")) o->seconds = atof(v);
    else if (!strcmp(a, "--threads")) o->threads = atoi(v);
    else if (!strcmp(a, "--rounds")) o->rounds = atoi(v);
    else if (!strcmp(a, "--mpi-thread")) o->mpi_thread = v;
    else {
      fprintf(stderr, "bench_comm: unknown option %s\n", a);
      usage(stderr);
      return -1;
    }
  }
  if (!any)
    for (int k = 0; k < N_OPS; k++) o->ops[k] = true;
  if (o->min_bytes < 16 || o->max_bytes < o->min_bytes || o->factor <= 1 || o->seconds <= 0 || o->threads < 1 ||
      o->rounds < 1 || o->rounds > MAX_ROUNDS) {
    fprintf(stderr,
            "bench_comm: need 16 <= --min <= --max, --factor > 1, --seconds > 0, --threads >= 1, "
            "1 <= --rounds <= %d\n",
            MAX_ROUNDS);
    return -1;
  }
  return 0;
}

/* Buffers of one rank, sized for the largest case: send and recv of
 * max_bytes each (allgather's output and reduce_scatter's input are the
 * whole max_bytes, one rank's part is max_bytes / n). */
typedef struct rank_bufs {
  float *send, *recv;
} rank_bufs;

/* One operation on px_comm: floats, count = elements of one rank's part. */
static px_status px_once(px_comm *c, const opts *o, op_kind op, rank_bufs *b, size_t bytes) {
  const int n = px_comm_size(c), r = px_comm_rank(c);
  const size_t all = bytes / sizeof(float), part = all / (size_t)n;
  px_request *q = NULL;
  px_status st = PX_OK;
  switch (op) {
  case OP_ALLREDUCE:
    if (!o->async) return px_comm_allreduce(c, b->send, all, PX_F32, PX_SUM);
    st = px_comm_iallreduce(c, b->send, all, PX_F32, PX_SUM, &q);
    break;
  case OP_ALLGATHER:
    if (!o->async) return px_comm_allgather(c, b->send, b->recv, part, PX_F32);
    st = px_comm_iallgather(c, b->send, b->recv, part, PX_F32, &q);
    break;
  case OP_REDUCE_SCATTER:
    if (!o->async) return px_comm_reduce_scatter(c, b->send, b->recv, part, PX_F32, PX_SUM);
    st = px_comm_ireduce_scatter(c, b->send, b->recv, part, PX_F32, PX_SUM, &q);
    break;
  case OP_BROADCAST:
    if (!o->async) return px_comm_broadcast(c, b->send, all, PX_F32, 0);
    st = px_comm_ibroadcast(c, b->send, all, PX_F32, 0, &q);
    break;
  case OP_SENDRECV:
    // Ping-pong between ranks 0 and 1; the others sit it out.
    if (r == 0) {
      if ((st = px_comm_send(c, b->send, all, PX_F32, 1, 7)) != PX_OK) return st;
      return px_comm_recv(c, b->recv, all, PX_F32, 1, 7);
    }
    if (r == 1) {
      if ((st = px_comm_recv(c, b->recv, all, PX_F32, 0, 7)) != PX_OK) return st;
      return px_comm_send(c, b->send, all, PX_F32, 0, 7);
    }
    return PX_OK;
  default: break;
  }
  if (st != PX_OK) return st;
  return px_request_wait(q);
}

#ifdef PX_HAVE_MPI
/* The same operation with MPI's own blocking calls. */
static int raw_once(op_kind op, rank_bufs *b, size_t bytes, int n, int r) {
  const int all = (int)(bytes / sizeof(float)), part = all / n;
  switch (op) {
  case OP_ALLREDUCE: return MPI_Allreduce(MPI_IN_PLACE, b->send, all, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  case OP_ALLGATHER: return MPI_Allgather(b->send, part, MPI_FLOAT, b->recv, part, MPI_FLOAT, MPI_COMM_WORLD);
  case OP_REDUCE_SCATTER: return MPI_Reduce_scatter_block(b->send, b->recv, part, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  case OP_BROADCAST: return MPI_Bcast(b->send, all, MPI_FLOAT, 0, MPI_COMM_WORLD);
  case OP_SENDRECV:
    if (r == 0) {
      int rc = MPI_Send(b->send, all, MPI_FLOAT, 1, 7, MPI_COMM_WORLD);
      return rc ? rc : MPI_Recv(b->recv, all, MPI_FLOAT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
    if (r == 1) {
      int rc = MPI_Recv(b->recv, all, MPI_FLOAT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      return rc ? rc : MPI_Send(b->send, all, MPI_FLOAT, 0, 7, MPI_COMM_WORLD);
    }
    return MPI_SUCCESS;
  default: return MPI_SUCCESS;
  }
}
#endif

/* busbw / algbw for n ranks (nccl-tests' factors). */
static double bus_factor(op_kind op, int n) {
  switch (op) {
  case OP_ALLREDUCE: return 2.0 * (n - 1) / n;
  case OP_ALLGATHER:
  case OP_REDUCE_SCATTER: return (double)(n - 1) / n;
  default: return 1.0;
  }
}

/* The median of k values (sorted in place). */
static double median(double *v, int k) {
  for (int i = 1; i < k; i++)
    for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
      double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
  return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

/* `kind` times like op (a ping-pong is halved, busbw by op's factor);
 * `name` is printed as the op. */
static void report(const px_comm *c, const char *impl, op_kind kind, size_t bytes, long iters, double seconds,
                   double best, int rounds, const char *name) {
  const op_kind op = kind;
  if (px_comm_rank(c) != 0) return;
  // A ping-pong's operation is half its round trip.
  const double half = op == OP_SENDRECV ? 2.0 : 1.0;
  double t = seconds / (double)iters / half;
  double algbw = (double)bytes / t / 1e9;
  printf("comm impl=%s op=%s bytes=%zu iters=%ld us=%.2f algbw=%.3f busbw=%.3f ranks=%d us_min=%.2f rounds=%d\n", impl,
         name, bytes, iters, 1e6 * t, algbw, algbw * bus_factor(op, px_comm_size(c)), px_comm_size(c),
         1e6 * best / half, rounds);
  fflush(stdout);
}

typedef struct shared {
  const opts *o;
  rank_bufs bufs[64]; /* threads backend: each rank's own buffers */
} shared;

static int fail(px_comm *c, const char *what) {
  fprintf(stderr, "bench_comm: rank %d: %s: %s\n", px_comm_rank(c), what, px_last_error());
  return 1;
}

/* Iterations for a budget: one untimed warm-up, one timed, then as many as
 * fit `seconds` by the slowest rank's single time (every rank must run the
 * same count). */
static px_status plan_iters(px_comm *c, double one, double seconds, long least, long *iters) {
  double worst = one;
  px_status st = px_comm_allreduce(c, &worst, 1, PX_F64, PX_MAX);
  if (st != PX_OK) return st;
  long k = worst > 0 ? (long)(seconds / worst) : 10000;
  *iters = k < least ? least : k > 10000 ? 10000 : k;
  return PX_OK;
}

static int rank_main(px_comm *c, void *arg) {
  shared *sh = arg;
  const opts *o = sh->o;
  const int n = px_comm_size(c), r = px_comm_rank(c);
  if (n > 64) {
    fprintf(stderr, "bench_comm: at most 64 ranks\n");
    return 1;
  }
  const char *impl = px_comm_backend_of(c) == PX_COMM_MPI ? (o->async ? "px-mpi-async" : "px-mpi")
    : px_comm_backend_of(c) == PX_COMM_THREADS            ? (o->async ? "px-threads-async" : "px-threads")
                                                          : "px-self";
  rank_bufs *b = &sh->bufs[r];
  b->send = malloc(o->max_bytes);
  b->recv = malloc(o->max_bytes);
  if (!b->send || !b->recv) {
    fprintf(stderr, "bench_comm: out of memory\n");
    return 1;
  }
  // Small values: in-place sums grow each iteration, and denormals or
  // overflow must not be what is measured.
  for (size_t i = 0; i < o->max_bytes / sizeof(float); i++) b->send[i] = b->recv[i] = 1e-6f;
  px_comm_set_timeout(c, 120);
  if (r == 0) {
    printf("# bench_comm: %s, %d ranks, %s\n", impl, n, o->async ? "i-variant + wait" : "blocking calls");
    fflush(stdout);
  }

  for (size_t bytes = o->min_bytes; bytes <= o->max_bytes;) {
    // Whole floats, and a part per rank of whole floats.
    size_t unit = sizeof(float) * (size_t)n;
    size_t sz = bytes / unit * unit;
    for (int op = 0; op < N_OPS; op++) {
      if (!o->ops[op]) continue;
      if (op == OP_SENDRECV && n < 2) continue;
      // The other side of each round: raw MPI under MPI; under threads the
      // copy bound (every rank memcpy-ing the size at once), so the
      // fraction of the bound is of two figures taken side by side.
      const bool threads = px_comm_backend_of(c) == PX_COMM_THREADS;
#ifdef PX_HAVE_MPI
      const bool raw = (o->raw && px_comm_backend_of(c) == PX_COMM_MPI) ||
        (o->memcpy_line && threads && n > 1 && op != OP_SENDRECV);
#else
      const bool raw = o->memcpy_line && threads && n > 1 && op != OP_SENDRECV;
#endif
      // Warm-up of each side, then one timed px_comm call plans the count
      // of iterations of a round: seconds / rounds per side, at least 1.
      if (px_once(c, o, op, b, sz) != PX_OK) return fail(c, op_names[op]);
      if (raw && threads) memcpy(b->recv, b->send, sz);
#ifdef PX_HAVE_MPI
      else if (raw && raw_once(op, b, sz, n, r) != MPI_SUCCESS) return fail(c, "raw MPI");
#endif
      if (px_comm_barrier(c) != PX_OK) return fail(c, "barrier");
      double t0 = px_time_now();
      if (px_once(c, o, op, b, sz) != PX_OK) return fail(c, op_names[op]);
      long iters;
      if (plan_iters(c, px_time_now() - t0, o->seconds / o->rounds, o->rounds > 1 ? 1 : 3, &iters) != PX_OK)
        return fail(c, "plan");
      // Rounds: px_comm then raw MPI, raw first in odd rounds, so a change
      // of the machine's load hits both sides alike; each round's time is
      // the slowest rank's, the figure the median round.
      double took[2][MAX_ROUNDS], best[2] = {1e30, 1e30};
      for (int round = 0; round < o->rounds; round++) {
        for (int turn = 0; turn < 2; turn++) {
          const int side = (turn + round) & 1;  // 0: px_comm, 1: raw MPI
          if (side == 1 && !raw) continue;
          if (px_comm_barrier(c) != PX_OK) return fail(c, "barrier");
          double prev = t0 = px_time_now();
          for (long i = 0; i < iters; i++) {
            if (side == 1 && threads) {
              memcpy(b->recv, b->send, sz);
#ifdef PX_HAVE_MPI
            } else if (side == 1) {
              if (raw_once(op, b, sz, n, r) != MPI_SUCCESS) return fail(c, "raw MPI");
#endif
            } else if (px_once(c, o, op, b, sz) != PX_OK) {
              return fail(c, op_names[op]);
            }
            double now = px_time_now();
            if (now - prev < best[side]) best[side] = now - prev;
            prev = now;
          }
          took[side][round] = prev - t0;
        }
      }
      for (int side = 0; side < (raw ? 2 : 1); side++) {
        if (px_comm_allreduce(c, took[side], (size_t)o->rounds, PX_F64, PX_MAX) != PX_OK ||
            px_comm_allreduce(c, &best[side], 1, PX_F64, PX_MAX) != PX_OK)
          return fail(c, "allreduce of times");
        // (the copy bound's line is a memcpy, not a ping-pong: its time is not halved)
        report(c, side ? (threads ? "copy-bound" : "raw-mpi") : impl, side && threads ? OP_BROADCAST : op, sz, iters,
               median(took[side], o->rounds), best[side], o->rounds, op_names[op]);
      }
    }
    if (o->memcpy_line && r == 0) {
      // The copy bandwidth of this machine at this size, measured in the
      // same run: memcpy(recv ← send), at least 3 copies and `seconds`.
      long k = 0;
      memcpy(b->recv, b->send, sz);
      double t0 = px_time_now(), t = t0;
      while (k < 3 || t - t0 < o->seconds) {
        memcpy(b->recv, b->send, sz);
        k++;
        t = px_time_now();
      }
      double per = (t - t0) / (double)k;
      printf("comm impl=memcpy op=memcpy bytes=%zu iters=%ld us=%.2f algbw=%.3f busbw=%.3f ranks=1\n", sz, k, 1e6 * per,
             (double)sz / per / 1e9, (double)sz / per / 1e9);
      fflush(stdout);
    }
    if (px_comm_barrier(c) != PX_OK) return fail(c, "barrier");
    size_t next = (size_t)((double)bytes * o->factor);
    if (next <= bytes) break;
    bytes = next;
  }
  free(b->send);
  free(b->recv);
  return 0;
}

int main(int argc, char **argv) {
  opts o;
  if (parse_args(argc, argv, &o) != 0) return 2;
  px_set_num_threads(1);
  shared sh = {.o = &o};
  int code = 0;
#ifdef PX_HAVE_MPI
  bool own_mpi = false;
  if (o.mpi_thread && px_comm_mpi_launched()) {
    int want = !strcmp(o.mpi_thread, "single") ? MPI_THREAD_SINGLE
      : !strcmp(o.mpi_thread, "serialized")    ? MPI_THREAD_SERIALIZED
                                               : MPI_THREAD_MULTIPLE;
    int got = 0;
    // As px_comm_init_mpi would (libnbc's ring all-reduce).
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    MPI_Init_thread(NULL, NULL, want, &got);
    own_mpi = true;
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    if (r == 0) printf("# bench_comm: MPI initialised at thread level %s (provided %d)\n", o.mpi_thread, got);
  }
#endif
  px_status st = px_comm_run(o.threads, rank_main, &sh, &code);
  if (st != PX_OK) {
    fprintf(stderr, "bench_comm: %s\n", px_last_error());
    return 1;
  }
#ifdef PX_HAVE_MPI
  if (own_mpi) MPI_Finalize();
#endif
  return code;
}
