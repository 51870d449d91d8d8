/* test_dir.h — a scratch directory for tests that write files.
 *
 *   snprintf(dir, sizeof dir, "/tmp/px_idx_XXXXXX");  if (!mkdtemp(dir)) ...
 *   fopen(in_dir("a.idx"), "wb") ...
 *
 * in_dir joins a name to the directory; it cycles through four buffers, so
 * up to four results may be held at once (one call's two paths, say). */
#ifndef PX_TEST_DIR_H
#define PX_TEST_DIR_H

#include <stdio.h>

static char dir[64];

static const char *in_dir(const char *name) {
  static char buf[4][256];
  static int k = 0;
  k = (k + 1) % 4;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

#endif
