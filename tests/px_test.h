/* px_test.h — the few macros every plexus test uses.
 * A failed CHECK prints where and what, and the test exits 1 at the end. */
#ifndef PX_TEST_H
#define PX_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "plexus/plexus.h"

/* Atomic: ranks of the threads backend check from several threads. */
static _Atomic int px_test_failures = 0;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      px_test_failures++;                                                      \
    }                                                                          \
  } while (0)

/* A call that must succeed; on failure prints px_last_error() and exits. */
#define CHECK_OK(call)                                                                                                 \
  do {                                                                                                                 \
    px_status st_ = (call);                                                                                            \
    if (st_ != PX_OK) {                                                                                                \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, px_status_name(st_), px_last_error()); \
      exit(1);                                                                                                         \
    }                                                                                                                  \
  } while (0)

#define CHECK_CLOSE(a, b, tol)                                                                          \
  CHECK(fabs((double)(a) - (double)(b)) <= (tol)*fmax(1.0, fmax(fabs((double)(a)), fabs((double)(b)))), \
        "%s = %.9g, %s = %.9g, tol %.3g", #a, (double)(a), #b, (double)(b), (double)(tol))

#if defined(__GLIBC__) && !defined(PX_FUZZ)
#include <execinfo.h>
#include <signal.h>
#include <unistd.h>
/* A test that crashes prints its stack before it dies (stdout, buffered into
 * a pipe, is lost with the process; this goes to stderr).  Installed only
 * where nothing else handles the signal (a sanitizer's handler stays). */
static void px_test_crashed(int sig) {
  // Default actions first: should the unwinder fault too (it can under
  // qemu-user), the process ends at once.
  signal(sig, SIG_DFL);
  signal(SIGSEGV, SIG_DFL);
  static const char msg[] = "\npx_test: crashed (signal); the stack:\n";
  if (write(2, msg, sizeof msg - 1) < 0) {}
  void *pc[64];
  backtrace_symbols_fd(pc, backtrace(pc, 64), 2);
  raise(sig);
}
__attribute__((constructor)) static void px_test_trace_crashes(void) {
  const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL};
  for (int i = 0; i < 4; i++) {
    void (*old)(int) = signal(sigs[i], px_test_crashed);
    if (old != SIG_DFL) signal(sigs[i], old);
  }
}
#endif

static inline int px_test_finish(const char *name) {
  if (px_test_failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, px_test_failures);
    return 1;
  }
  printf("%s: ok\n", name);
  return 0;
}

#endif
