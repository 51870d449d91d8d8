/* Claim: the CUDA runtime (src/tensor/cuda/px_cuda.h) does what the CPU path
 * does.  The caching allocator hands a freed block back for the next request
 * of its size class without growing what it reserves; copies host -> device
 * -> device -> host round-trip bit for bit; px_cuda_sgemm equals px_sgemm
 * for the four transpose combinations, odd sizes and padded leading
 * dimensions to 1e-5 relative (full f32: no TF32), with beta 0 ignoring a
 * NaN-poisoned C; the bf16 GEMM equals px_sgemm of the bf16-rounded operands
 * to 1e-4 and the f32 product to 1e-2; fill, scale, add give the CPU's bits,
 * axpy its values to 1e-6, to_bf16 the bits of the CPU's px_f32_to_bf16
 * (ties, NaN, inf, subnormals included), sumsq px_sumsq to 1e-10 and the same
 * bits on every call, any_nonfinite finds one inf or NaN anywhere; the device
 * arena zeroes (calloc) and moves overlapping blocks (rewind_keep) right.
 * Outputs are poisoned first, data random.  Exits 77 (skipped) without a GPU.
 *
 * If it failed, every GPU kernel built on this runtime would compute on
 * wrong memory or wrong GEMMs, and the GPU/CPU parity tests would not know
 * which layer to blame. */
#include "px_test.h"

#include "tensor/bf16.h"
#include "tensor/cuda/px_cuda.h"

#include <string.h>

static uint64_t rs = 88172645463325252ull;
static float urand(float lo, float hi) {
  rs ^= rs << 13;
  rs ^= rs >> 7;
  rs ^= rs << 17;
  return lo + (hi - lo) * (float)(rs >> 40) * (1.0f / 16777216.0f);
}

static float *dev_from(const float *h, size_t n) {
  float *d = px_cuda_malloc(n * sizeof(float));
  CHECK(d != NULL, "px_cuda_malloc: %s", px_last_error());
  CHECK_OK(px_cuda_to_device(d, h, n * sizeof(float)));
  return d;
}

static void nan_fill(float *h, size_t n) {
  for (size_t i = 0; i < n; i++) h[i] = NAN;
}

static void check_allocator(void) {
  const size_t r0 = px_cuda_reserved_bytes(), a0 = px_cuda_allocated_bytes();
  void *p = px_cuda_malloc(1000);
  CHECK(p != NULL && ((uintptr_t)p % 256) == 0, "malloc(1000) = %p", p);
  const size_t r1 = px_cuda_reserved_bytes();
  CHECK(r1 >= r0 + 1000 && px_cuda_allocated_bytes() >= a0 + 1000, "reserved %zu -> %zu", r0, r1);
  px_cuda_free(p);
  CHECK(px_cuda_allocated_bytes() == a0, "allocated %zu after free, %zu before", px_cuda_allocated_bytes(), a0);
  void *q = px_cuda_malloc(900); /* the same 512-byte class */
  CHECK(q == p, "malloc(900) after free(malloc(1000)): %p, cached %p", q, p);
  CHECK(px_cuda_reserved_bytes() == r1, "reserved grew to %zu from %zu", px_cuda_reserved_bytes(), r1);
  px_cuda_free(q);
  // Large: 2 MiB classes.
  void *big = px_cuda_malloc((size_t)3 << 20);
  CHECK(big != NULL, "malloc(3 MiB): %s", px_last_error());
  const size_t r2 = px_cuda_reserved_bytes();
  px_cuda_free(big);
  void *big2 = px_cuda_malloc(((size_t)7 << 19) + 5); /* 3.5 MiB: the same 4 MiB class */
  CHECK(big2 == big && px_cuda_reserved_bytes() == r2, "large block not reused (%p, %p)", big2, big);
  px_cuda_free(big2);
  // A steady state: the same sizes again and again reserve nothing more.
  for (int round = 0; round < 3; round++) {
    void *x[4] = {px_cuda_malloc(64), px_cuda_malloc(4096), px_cuda_malloc((size_t)5 << 20), px_cuda_malloc(70000)};
    for (int i = 0; i < 4; i++) CHECK(x[i] != NULL, "malloc %d", i);
    static size_t steady;
    if (round == 0) steady = px_cuda_reserved_bytes();
    CHECK(px_cuda_reserved_bytes() == steady, "round %d reserved %zu, first %zu", round, px_cuda_reserved_bytes(),
          steady);
    for (int i = 0; i < 4; i++) px_cuda_free(x[i]);
  }
  px_cuda_free(NULL);
}

static void check_copies(void) {
  const size_t n = 100003;
  float *h = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) h[i] = urand(-3, 3);
  float *d = dev_from(h, n), *d2 = px_cuda_malloc(n * sizeof(float));
  CHECK_OK(px_cuda_fill(d2, n, NAN));
  CHECK_OK(px_cuda_copy(d2, d, n * sizeof(float)));
  nan_fill(back, n);
  CHECK_OK(px_cuda_to_host(back, d2, n * sizeof(float)));
  CHECK(memcmp(h, back, n * sizeof(float)) == 0, "round trip host -> device -> device -> host differs");
  CHECK_OK(px_cuda_zero(d2, n * sizeof(float)));
  CHECK_OK(px_cuda_to_host(back, d2, n * sizeof(float)));
  size_t nz = 0;
  for (size_t i = 0; i < n; i++) nz += back[i] != 0.0f;
  CHECK(nz == 0, "%zu nonzero after px_cuda_zero", nz);
  CHECK_OK(px_cuda_sync());
  px_cuda_free(d);
  px_cuda_free(d2);
  free(h);
  free(back);
}

/* Stored row-major: op(A) (M, K) is A (K, M) when transposed. */
static void check_gemm(bool ta, bool tb, int M, int N, int K) {
  const int ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
  const int lda = ac + 3, ldb = bc + 1, ldc = N + 2;
  const size_t na = (size_t)ar * lda, nb = (size_t)br * ldb, nc = (size_t)M * ldc;
  float *A = malloc(na * sizeof(float)), *B = malloc(nb * sizeof(float)), *C0 = malloc(nc * sizeof(float));
  float *ref = malloc(nc * sizeof(float)), *got = malloc(nc * sizeof(float));
  for (size_t i = 0; i < na; i++) A[i] = urand(-1, 1);
  for (size_t i = 0; i < nb; i++) B[i] = urand(-1, 1);
  for (size_t i = 0; i < nc; i++) C0[i] = urand(-1, 1);
  float *dA = dev_from(A, na), *dB = dev_from(B, nb);
  for (int pass = 0; pass < 2; pass++) {
    const float alpha = 0.7f, beta = pass == 0 ? 0.0f : 0.3f;
    // beta 0: C must not be read (poisoned with NaN on the device).
    for (size_t i = 0; i < nc; i++) ref[i] = pass == 0 ? 0.0f : C0[i];
    if (pass == 0) nan_fill(got, nc);
    else memcpy(got, C0, nc * sizeof(float));
    float *dC = dev_from(got, nc);
    px_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, ref, ldc);
    CHECK_OK(px_cuda_sgemm(ta, tb, M, N, K, alpha, dA, lda, dB, ldb, beta, dC, ldc));
    CHECK_OK(px_cuda_to_host(got, dC, nc * sizeof(float)));
    int bad = 0;
    for (int i = 0; i < M; i++)
      for (int j = 0; j < N; j++) {
        const double r = ref[(size_t)i * ldc + j], g = got[(size_t)i * ldc + j];
        if (!(fabs(r - g) <= 1e-5 * fmax(1.0, fabs(r))) && bad++ < 3)
          CHECK(0, "sgemm ta %d tb %d (%d, %d, %d) beta %g: C[%d, %d] %.9g, CPU %.9g", ta, tb, M, N, K, beta, i, j, g,
                r);
      }
    px_cuda_free(dC);
  }
  // bf16: the operands rounded on the device, the product against the CPU's
  // GEMM of the same rounded values (1e-4) and of the f32 values (1e-2).
  for (size_t i = 0; i < na; i++) A[i] *= 0.5f;
  for (size_t i = 0; i < nb; i++) B[i] *= 0.5f;
  CHECK_OK(px_cuda_to_device(dA, A, na * sizeof(float)));
  CHECK_OK(px_cuda_to_device(dB, B, nb * sizeof(float)));
  uint16_t *hA = px_cuda_malloc(na * 2), *hB = px_cuda_malloc(nb * 2);
  CHECK_OK(px_cuda_to_bf16(hA, dA, na));
  CHECK_OK(px_cuda_to_bf16(hB, dB, nb));
  float *Ar = malloc(na * sizeof(float)), *Br = malloc(nb * sizeof(float)), *ref32 = malloc(nc * sizeof(float));
  for (size_t i = 0; i < na; i++) Ar[i] = px_bf16_to_f32(px_f32_to_bf16(A[i]));
  for (size_t i = 0; i < nb; i++) Br[i] = px_bf16_to_f32(px_f32_to_bf16(B[i]));
  memset(ref, 0, nc * sizeof(float));
  memset(ref32, 0, nc * sizeof(float));
  px_sgemm(ta, tb, M, N, K, 1.0f, Ar, lda, Br, ldb, 0.0f, ref, ldc);
  px_sgemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, ref32, ldc);
  nan_fill(got, nc);
  float *dC = dev_from(got, nc);
  CHECK_OK(px_cuda_gemm_bf16(ta, tb, M, N, K, 1.0f, hA, lda, hB, ldb, 0.0f, dC, ldc));
  CHECK_OK(px_cuda_to_host(got, dC, nc * sizeof(float)));
  int bad = 0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      const size_t k = (size_t)i * ldc + j;
      const double g = got[k];
      if (!(fabs(g - ref[k]) <= 1e-4 * fmax(1.0, fabs(ref[k])) &&
            fabs(g - ref32[k]) <= 1e-2 * fmax(1.0, fabs(ref32[k]))) &&
          bad++ < 3)
        CHECK(0, "bf16 gemm ta %d tb %d (%d, %d, %d): C[%d, %d] %.9g, CPU of rounded %.9g, of f32 %.9g", ta, tb, M, N,
              K, i, j, g, (double)ref[k], (double)ref32[k]);
    }
  px_cuda_free(dC);
  px_cuda_free(hA);
  px_cuda_free(hB);
  px_cuda_free(dA);
  px_cuda_free(dB);
  free(A), free(B), free(C0), free(ref), free(got), free(Ar), free(Br), free(ref32);
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void check_elementwise(void) {
  const size_t n = 3000017; /* more than one grid-stride pass */
  float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
  float *got = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; i++) x[i] = urand(-2, 2), y[i] = urand(-2, 2);
  float *dx = dev_from(x, n), *dy = dev_from(y, n), *dout = px_cuda_malloc(n * sizeof(float));

  CHECK_OK(px_cuda_fill(dout, n, 1.25f));
  CHECK_OK(px_cuda_to_host(got, dout, n * sizeof(float)));
  px_fill(ref, n, 1.25f);
  CHECK(memcmp(got, ref, n * sizeof(float)) == 0, "fill");

  CHECK_OK(px_cuda_fill(dout, n, NAN));
  CHECK_OK(px_cuda_add(dout, dx, dy, n));
  CHECK_OK(px_cuda_to_host(got, dout, n * sizeof(float)));
  px_add(ref, x, y, n);
  CHECK(memcmp(got, ref, n * sizeof(float)) == 0, "add");

  CHECK_OK(px_cuda_copy(dout, dx, n * sizeof(float)));
  CHECK_OK(px_cuda_scale(dout, n, -0.37f));
  CHECK_OK(px_cuda_to_host(got, dout, n * sizeof(float)));
  memcpy(ref, x, n * sizeof(float));
  px_scale(ref, n, -0.37f);
  CHECK(memcmp(got, ref, n * sizeof(float)) == 0, "scale");

  CHECK_OK(px_cuda_copy(dout, dy, n * sizeof(float)));
  CHECK_OK(px_cuda_axpy(dout, dx, n, 0.61f));
  CHECK_OK(px_cuda_to_host(got, dout, n * sizeof(float)));
  memcpy(ref, y, n * sizeof(float));
  px_axpy(ref, x, n, 0.61f);
  int bad = 0;
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - ref[i]) <= 1e-6 * fmax(1.0, fabs(ref[i]))) && bad++ < 3)
      CHECK(0, "axpy [%zu] %.9g, CPU %.9g", i, (double)got[i], (double)ref[i]);

  // to_bf16: random values plus the awkward ones.
  const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                              0x7f800001u, 0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                              0x7f7fffffu, 0xff7fffffu, 0x3f7fff80u, 0x477fff00u};
  const size_t ns = sizeof special / sizeof special[0];
  for (size_t i = 0; i < ns; i++) x[i] = from_bits(special[i]);
  for (size_t i = ns; i < 4096; i++) { /* random bit patterns: every exponent, NaNs too */
    (void)urand(0, 1);
    x[i] = from_bits((uint32_t)(rs >> 17));
  }
  CHECK_OK(px_cuda_to_device(dx, x, n * sizeof(float)));
  uint16_t *dh = px_cuda_malloc(n * 2), *h = malloc(n * 2);
  CHECK_OK(px_cuda_zero(dh, n * 2));
  memset(h, 0xff, n * 2);
  CHECK_OK(px_cuda_to_bf16(dh, dx, n));
  CHECK_OK(px_cuda_to_host(h, dh, n * 2));
  bad = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &x[i], 4);
    if (h[i] != px_f32_to_bf16(x[i]) && bad++ < 5)
      CHECK(0, "to_bf16 of %08x: device %04x, CPU %04x", u, h[i], px_f32_to_bf16(x[i]));
  }
  // The CPU reference itself on known answers: ties go to even.
  CHECK(px_f32_to_bf16(from_bits(0x3f808000u)) == 0x3f80 && px_f32_to_bf16(from_bits(0x3f818000u)) == 0x3f82 &&
          px_f32_to_bf16(from_bits(0x3f80ffffu)) == 0x3f81 && px_f32_to_bf16(1.0f) == 0x3f80 &&
          px_f32_to_bf16(from_bits(0x7f7fffffu)) == 0x7f80 && (px_f32_to_bf16(NAN) & 0x7fc0) == 0x7fc0,
        "px_f32_to_bf16 known answers");
  CHECK(px_bf16_to_f32(0x3f80) == 1.0f && px_bf16_to_f32(0xc000) == -2.0f, "px_bf16_to_f32");

  // sumsq and any_nonfinite on finite data.
  for (size_t i = 0; i < n; i++) x[i] = urand(-2, 2);
  CHECK_OK(px_cuda_to_device(dx, x, n * sizeof(float)));
  double s1 = -1, s2 = -2;
  CHECK_OK(px_cuda_sumsq(dx, n, &s1));
  CHECK_OK(px_cuda_sumsq(dx, n, &s2));
  const double sref = px_sumsq(x, n);
  CHECK(fabs(s1 - sref) <= 1e-10 * sref, "sumsq %.17g, CPU %.17g", s1, sref);
  CHECK(memcmp(&s1, &s2, sizeof s1) == 0, "sumsq not deterministic: %.17g then %.17g", s1, s2);
  CHECK_OK(px_cuda_sumsq(dx, 1, &s1));
  CHECK(s1 == (double)x[0] * x[0], "sumsq of one element %.17g", s1);
  CHECK_OK(px_cuda_sumsq(dx, 0, &s1));
  CHECK(s1 == 0.0, "sumsq of nothing %g", s1);
  bool any = true;
  CHECK_OK(px_cuda_any_nonfinite(dx, n, &any));
  CHECK(!any, "any_nonfinite on finite data");
  const float bad_values[2] = {INFINITY, NAN};
  const size_t where[3] = {0, n / 2 + 1, n - 1};
  for (int v = 0; v < 2; v++)
    for (int w = 0; w < 3; w++) {
      CHECK_OK(px_cuda_to_device(dx + where[w], &bad_values[v], sizeof(float)));
      any = false;
      CHECK_OK(px_cuda_any_nonfinite(dx, n, &any));
      CHECK(any, "any_nonfinite missed %g at %zu", (double)bad_values[v], where[w]);
      CHECK_OK(px_cuda_to_device(dx + where[w], &x[where[w]], sizeof(float)));
    }
  CHECK_OK(px_cuda_any_nonfinite(dx, n, &any));
  CHECK(!any, "any_nonfinite after restoring");
  CHECK_OK(px_cuda_any_nonfinite(dx, 0, &any));
  CHECK(!any, "any_nonfinite of nothing");

  px_cuda_free(dx), px_cuda_free(dy), px_cuda_free(dout), px_cuda_free(dh);
  free(x), free(y), free(ref), free(got), free(h);
}

/* The device arena: calloc zeroes; rewind_keep moves a block down onto a
 * range it overlaps, through the scratch path (small gap) and the stepwise
 * path (gap at least an eighth). */
static void check_arena(void) {
  px_arena *a = px_cuda_arena_create(0);
  CHECK(a != NULL, "px_cuda_arena_create: %s", px_last_error());
  const size_t nb = 100000;
  float *h = malloc(nb * sizeof(float)), *back = malloc(nb * sizeof(float));
  for (size_t i = 0; i < nb; i++) h[i] = (float)i;
  for (int path = 0; path < 2; path++) {
    px_arena_reset(a);
    float *z = px_arena_calloc(a, 5000 * sizeof(float));
    CHECK(z != NULL, "calloc");
    CHECK_OK(px_cuda_to_host(back, z, 5000 * sizeof(float)));
    size_t nz = 0;
    for (int i = 0; i < 5000; i++) nz += back[i] != 0.0f;
    CHECK(nz == 0, "device arena calloc left %zu nonzero", nz);
    px_arena_mark m = px_arena_get_mark(a);
    void *first = px_arena_alloc(a, path == 0 ? 1024 : 65536);
    float *blk = px_arena_alloc(a, nb * sizeof(float));
    CHECK(first && blk, "alloc");
    CHECK_OK(px_cuda_to_device(blk, h, nb * sizeof(float)));
    float *kept = px_arena_rewind_keep(a, m, blk, nb * sizeof(float));
    CHECK(kept == first, "rewind_keep moved to %p, expected %p", (void *)kept, first);
    nan_fill(back, nb);
    CHECK_OK(px_cuda_to_host(back, kept, nb * sizeof(float)));
    CHECK(memcmp(back, h, nb * sizeof(float)) == 0, "rewind_keep (gap %s) corrupted the block",
          path == 0 ? "1 KiB" : "64 KiB");
  }
  px_arena_free(a);
  free(h), free(back);
}

int main(void) {
  if (px_cuda_device_count() == 0) {
    printf("test_cuda_runtime_copies_gemm_and_elementwise_match_cpu: no CUDA device; skipped\n");
    return 77;
  }
  CHECK_OK(px_cuda_init(0));
  CHECK_OK(px_cuda_init(0)); /* again: a no-op */
  CHECK(px_cuda_current_device() == 0, "current device %d", px_cuda_current_device());
  printf("device: %s\n", px_cuda_device_name());
  CHECK(px_cuda_compute_stream() && px_cuda_comm_stream() && px_cuda_cublas(), "streams and handle");
  CHECK(px_cuda_init(px_cuda_device_count()) == PX_ERR_INVALID, "init of a device past the count");
  check_allocator();
  check_copies();
  const int sizes[][3] = {{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {129, 67, 31}, {64, 256, 128}};
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        check_gemm(ta, tb, sizes[s][0], sizes[s][1], sizes[s][2]);
  CHECK(px_cuda_sgemm(false, false, -1, 2, 2, 1, NULL, 2, NULL, 2, 0, NULL, 2) == PX_ERR_INVALID,
        "negative M accepted");
  CHECK(px_cuda_sgemm(false, false, 4, 4, 4, 1, NULL, 3, NULL, 4, 0, NULL, 4) == PX_ERR_INVALID, "lda < K accepted");
  check_elementwise();
  check_arena();
  CHECK_OK(px_cuda_sync());
  return px_test_finish("test_cuda_runtime_copies_gemm_and_elementwise_match_cpu");
}
