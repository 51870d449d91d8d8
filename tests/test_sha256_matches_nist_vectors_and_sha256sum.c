/* Claim: plexus's SHA-256 (src/io/sha256.c), in both its portable and its
 * SHA-NI implementation, gives the FIPS 180-4 / NIST example digests ("abc",
 * the 448-bit and 896-bit messages, one million 'a', the empty message),
 * the same digest however a message is split across updates, the same
 * digest from either implementation for every length around the block and
 * padding boundaries, the same digest as coreutils' sha256sum for every
 * length 0..130 (all padding cases), and the same digest for a file (streamed in pieces)
 * as coreutils' sha256sum; two messages hashed at once (px_sha256_update2,
 * the two-stream SHA-NI loop) give each its own digest, for lengths around
 * the block boundaries and after a partial block.  If it failed, every checkpoint's SHA256SUMS
 * would be wrong: `sha256sum -c` would reject good checkpoints, and plexus
 * could accept corrupted ones. */
#define _POSIX_C_SOURCE 200809L
#include "px_test.h"

#include <string.h>
#include <unistd.h>

#include "io/sha256.h"

static void digest_hex(px_sha256_impl impl, const void *p, size_t n, char hex[PX_SHA256_HEX]) {
  px_sha256 s;
  unsigned char d[PX_SHA256_BYTES];
  px_sha256_init_impl(&s, impl);
  px_sha256_update(&s, p, n);
  px_sha256_final(&s, d);
  px_sha256_hex(d, hex);
}

int main(void) {
  static const struct {
    const char *msg;
    const char *hex;
  } nist[] = {
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",  // 448 bits
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},  // 896 bits
  };
  const char *million_a = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  printf("SHA-256 implementation on this CPU: %s\n", px_sha256_impl_name());

  px_sha256_impl impls[2] = {PX_SHA256_PORTABLE, PX_SHA256_SHANI};
  const char *impl_name[2] = {"portable", "sha-ni"};
  int n_impls = px_sha256_have_shani() ? 2 : 1;
  char hex[PX_SHA256_HEX], ref[PX_SHA256_HEX];
  size_t big = 1000000;
  unsigned char *a = malloc(big);
  memset(a, 'a', big);
  for (int k = 0; k < n_impls; k++) {
    for (size_t i = 0; i < sizeof nist / sizeof nist[0]; i++) {
      digest_hex(impls[k], nist[i].msg, strlen(nist[i].msg), hex);
      CHECK(strcmp(hex, nist[i].hex) == 0, "%s: SHA-256(\"%s\") = %s, expected %s", impl_name[k], nist[i].msg, hex,
            nist[i].hex);
    }
    digest_hex(impls[k], a, big, hex);
    CHECK(strcmp(hex, million_a) == 0, "%s: SHA-256(10^6 × 'a') = %s, expected %s", impl_name[k], hex, million_a);
    // One million 'a' fed in uneven pieces (1, 2, ... bytes): the buffering
    // of partial blocks must not change the digest.
    px_sha256 s;
    unsigned char d[PX_SHA256_BYTES];
    px_sha256_init_impl(&s, impls[k]);
    size_t off = 0, piece = 1;
    while (off < big) {
      size_t take = piece < big - off ? piece : big - off;
      px_sha256_update(&s, a + off, take);
      off += take;
      piece = piece * 7 % 191 + 1;
    }
    px_sha256_final(&s, d);
    px_sha256_hex(d, hex);
    CHECK(strcmp(hex, million_a) == 0, "%s: split updates give %s, expected %s", impl_name[k], hex, million_a);
  }

  // Both implementations agree on every length 0..300 (all padding cases:
  // the length fits in the last block or needs one more) of varied bytes.
  unsigned char msg[300];
  for (int i = 0; i < 300; i++) msg[i] = (unsigned char)(i * 151 + 7);
  if (n_impls == 2)
    for (size_t n = 0; n <= sizeof msg; n++) {
      digest_hex(PX_SHA256_PORTABLE, msg, n, ref);
      digest_hex(PX_SHA256_SHANI, msg, n, hex);
      CHECK(strcmp(hex, ref) == 0, "length %zu: sha-ni %s, portable %s", n, hex, ref);
    }

  // A file of 3 MiB + 17 bytes (more than one read piece) against sha256sum.
  char path[] = "/tmp/px_sha256_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0, "mkstemp");
  size_t fsize = (3u << 20) + 17;
  unsigned char *fb = malloc(fsize);
  uint32_t x = 12345;
  for (size_t i = 0; i < fsize; i++) {
    x = x * 1664525u + 1013904223u;
    fb[i] = (unsigned char)(x >> 24);
  }
  CHECK(write(fd, fb, fsize) == (ssize_t)fsize, "write");
  close(fd);
  unsigned char d[PX_SHA256_BYTES];
  uint64_t got_size = 0;
  CHECK_OK(px_sha256_file(path, d, &got_size));
  px_sha256_hex(d, hex);
  CHECK(got_size == fsize, "px_sha256_file read %llu bytes of %zu", (unsigned long long)got_size, fsize);
  char cmd[128], line[256] = "";
  snprintf(cmd, sizeof cmd, "sha256sum %s", path);
  FILE *p = popen(cmd, "r");
  CHECK(p && fgets(line, sizeof line, p), "could not run sha256sum");
  if (p) pclose(p);
  CHECK(strncmp(line, hex, 64) == 0, "px_sha256_file %s, sha256sum %.64s", hex, line);
  px_sha256_bytes(fb, fsize, d);
  px_sha256_hex(d, ref);
  CHECK(strcmp(ref, hex) == 0, "in memory %s, streamed from the file %s", ref, hex);
  unlink(path);
  CHECK(px_sha256_file(path, d, NULL) == PX_ERR_NOT_FOUND && strstr(px_last_error(), path), "a missing file: %s",
        px_last_error());

  // Every length 0..130 against sha256sum: the padding cases both
  // implementations share (length 55 fits in one block, 56 needs two).
  char dir[] = "/tmp/px_sha256_lengths_XXXXXX";
  CHECK(mkdtemp(dir) != NULL, "mkdtemp");
  enum { N_LEN = 131 };
  for (int n = 0; n < N_LEN; n++) {
    char name[96];
    snprintf(name, sizeof name, "%s/%03d", dir, n);
    FILE *f = fopen(name, "wb");
    CHECK(f && fwrite(fb, 1, (size_t)n, f) == (size_t)n, "write %s", name);
    if (f) fclose(f);
  }
  snprintf(cmd, sizeof cmd, "cd %s && sha256sum *", dir);
  p = popen(cmd, "r");
  int seen = 0;
  while (p && fgets(line, sizeof line, p)) {
    int n = atoi(line + 66);
    digest_hex(PX_SHA256_BEST, fb, (size_t)n, hex);
    CHECK(strncmp(line, hex, 64) == 0, "length %d: plexus %s, sha256sum %.64s", n, hex, line);
    seen++;
    char name[96];
    snprintf(name, sizeof name, "%s/%03d", dir, n);
    unlink(name);
  }
  if (p) pclose(p);
  CHECK(seen == N_LEN, "sha256sum printed %d lines, expected %d", seen, N_LEN);
  rmdir(dir);

  free(fb);
  free(a);
  // Two messages at once: each gets the digest it gets alone.
  {
    static unsigned char m1[4096 + 200], m2[4096 + 200];
    for (size_t i = 0; i < sizeof m1; i++) {
      m1[i] = (unsigned char)(i * 7 + 3);
      m2[i] = (unsigned char)(i * 13 + 101);
    }
    const size_t lens[] = {0, 1, 63, 64, 65, 127, 128, 1000, 4096, 4096 + 60};
    for (int impl = 0; impl < 2; impl++)
      for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (size_t pre = 0; pre < 70; pre += 23) {  // pre bytes first: a partial block, or not
          const size_t n = lens[li];
          px_sha256 sa, sb;
          px_sha256_init_impl(&sa, impl ? PX_SHA256_PORTABLE : PX_SHA256_BEST);
          px_sha256_init_impl(&sb, impl ? PX_SHA256_PORTABLE : PX_SHA256_BEST);
          px_sha256_update(&sa, m1, pre);
          px_sha256_update(&sb, m2, pre);
          // n bytes of the first, n + 5 of the second; then 64 and 59 more.
          px_sha256_update2(&sa, m1 + pre, n, &sb, m2 + pre, n + 5);
          px_sha256_update2(&sa, m1 + pre + n, 64, &sb, m2 + pre + n + 5, 59);
          unsigned char da[PX_SHA256_BYTES], db[PX_SHA256_BYTES];
          char ha[PX_SHA256_HEX], hb[PX_SHA256_HEX], ra[PX_SHA256_HEX], rb[PX_SHA256_HEX];
          px_sha256_final(&sa, da);
          px_sha256_final(&sb, db);
          px_sha256_hex(da, ha);
          px_sha256_hex(db, hb);
          digest_hex(PX_SHA256_PORTABLE, m1, pre + n + 64, ra);
          digest_hex(PX_SHA256_PORTABLE, m2, pre + n + 64, rb);  // n + 5 + 59 = n + 64
          CHECK(strcmp(ha, ra) == 0 && strcmp(hb, rb) == 0, "update2 (%s), %zu + %zu + 64 bytes",
                impl ? "portable" : px_sha256_impl_name(), pre, n);
        }
  }
  return px_test_finish("test_sha256_matches_nist_vectors_and_sha256sum");
}
