/* bench_stage — node-local staging (px_stage_files) against cp(1), side by
 * side, and what verifying a reused copy costs.
 *
 *   bench_stage [--mb 1024] [--files 4] [--src DIR] [--stage DIR] [--rounds 3]
 *
 * Writes FILES files of MB/FILES megabytes into SRC (default: the working
 * directory's bench_stage_src, on disk) and reads them once, so that the
 * source is in the page cache for both sides (what a second epoch of a
 * cluster's parallel file system cache would also give; a cold source is
 * the disk's speed for both).  Then, ROUNDS times alternating: px_stage_files
 * into STAGE (default /dev/shm) from scratch (copy + CRC-32C on the way +
 * MANIFEST), and `cp` of the same files into STAGE/cp.  Then a reuse with
 * the full check (CRC-32C of every staged byte) and one with the size check.
 * Prints MB/s (1 MB = 10^6 bytes) per run and the medians. */
#define _GNU_SOURCE
#include "plexus/plexus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int sh(const char *cmd) {
  int rc = system(cmd);
  if (rc != 0) fprintf(stderr, "bench_stage: \"%s\" failed (%d)\n", cmd, rc);
  return rc;
}

int main(int argc, char **argv) {
  long mb = 1024, nfiles = 4, rounds = 3;
  const char *src = "bench_stage_src", *stage = "/dev/shm";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--mb")) mb = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--files")) nfiles = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "--src")) src = argv[i + 1];
    else if (!strcmp(argv[i], "--stage")) stage = argv[i + 1];
    else if (!strcmp(argv[i], "--rounds")) rounds = atol(argv[i + 1]);
    else {
      fprintf(stderr, "bench_stage: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (mb < 1 || nfiles < 1 || rounds < 1 || rounds > 64) return 2;
  char cmd[16384], stdir[4096], cpdir[4200];
  snprintf(stdir, sizeof stdir, "%s/bench_stage_%ld", stage, (long)getpid());
  snprintf(cpdir, sizeof cpdir, "%s/cp", stdir);
  if (px_mkdir_p(src, "bench_stage", false) != PX_OK || px_mkdir_p(cpdir, "bench_stage", false) != PX_OK) {
    fprintf(stderr, "bench_stage: %s\n", px_last_error());
    return 1;
  }
  // The source: pseudo-random bytes (incompressible, no zero pages).
  const size_t per = (size_t)mb * 1000000 / (size_t)nfiles;
  char **files = calloc((size_t)nfiles, sizeof *files);
  unsigned char *buf = malloc(per);
  px_rng rng = px_rng_make(7, 0);
  for (long k = 0; k < nfiles; k++) {
    files[k] = malloc(4200);
    snprintf(files[k], 4200, "%s/part_%03ld.bin", src, k);
    struct stat sb;
    if (stat(files[k], &sb) == 0 && (size_t)sb.st_size == per) continue;  // made by an earlier run
    for (size_t i = 0; i + 4 <= per; i += 4) {
      uint32_t r = px_rng_u32(&rng);
      memcpy(buf + i, &r, 4);
    }
    if (px_write_file_atomic(files[k], buf, per) != PX_OK) {
      fprintf(stderr, "bench_stage: %s\n", px_last_error());
      return 1;
    }
  }
  free(buf);
  snprintf(cmd, sizeof cmd, "cat %s/part_*.bin > /dev/null", src);  // into the page cache
  if (sh(cmd)) return 1;
  const double total_mb = (double)per * (double)nfiles / 1e6;
  double st_mbs[64], cp_mbs[64];
  printf("bench_stage: %ld files, %.0f MB, from %s into %s\n", nfiles, total_mb, src, stage);
  for (long r = 0; r < rounds; r++) {
    snprintf(cmd, sizeof cmd, "rm -rf %s/part_* %s/*/ 2>/dev/null; mkdir -p %s", stdir, stdir, cpdir);
    sh(cmd);
    px_stage_result res;
    double t0 = px_time_now();
    if (px_stage_files(stdir, src, files, (size_t)nfiles, PX_STAGE_VERIFY_FULL, &res) != PX_OK) {
      fprintf(stderr, "bench_stage: %s\n", px_last_error());
      return 1;
    }
    double t_stage = px_time_now() - t0;
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", cpdir, cpdir);
    sh(cmd);
    snprintf(cmd, sizeof cmd, "cp %s/part_*.bin %s/", src, cpdir);
    t0 = px_time_now();
    if (sh(cmd)) return 1;
    double t_cp = px_time_now() - t0;
    st_mbs[r] = total_mb / t_stage;
    cp_mbs[r] = total_mb / t_cp;
    printf("round %ld: px_stage_files %.0f MB/s (%.2f s, %zu files copied), cp %.0f MB/s (%.2f s)\n", r + 1, st_mbs[r],
           t_stage, res.copied, cp_mbs[r], t_cp);
    fflush(stdout);
  }
  double full[64], size[64];
  for (long r = 0; r < rounds; r++) {
    px_stage_result res;
    double t0 = px_time_now();
    if (px_stage_files(stdir, src, files, (size_t)nfiles, PX_STAGE_VERIFY_FULL, &res) != PX_OK || res.copied) {
      fprintf(stderr, "bench_stage: the reuse copied (%s)\n", px_last_error());
      return 1;
    }
    full[r] = px_time_now() - t0;
    t0 = px_time_now();
    if (px_stage_files(stdir, src, files, (size_t)nfiles, PX_STAGE_VERIFY_SIZE, &res) != PX_OK || res.copied) {
      fprintf(stderr, "bench_stage: the reuse copied (%s)\n", px_last_error());
      return 1;
    }
    size[r] = px_time_now() - t0;
  }
  double mf = median(full, (int)rounds), ms = median(size, (int)rounds);
  double ss = median(st_mbs, (int)rounds), cc = median(cp_mbs, (int)rounds);
  printf("median: px_stage_files %.0f MB/s, cp %.0f MB/s (ratio %.2f); reuse with the full check %.3f s "
         "(%.0f MB/s of CRC-32C), with the size check %.4f s\n",
         ss, cc, ss / cc, mf, total_mb / mf, ms);
  snprintf(cmd, sizeof cmd, "rm -rf %s", stdir);
  sh(cmd);
  for (long k = 0; k < nfiles; k++) free(files[k]);
  free(files);
  return 0;
}
