/* Claim: on a GPU a run stopped at step 5 and resumed to step 10 ends with
 * the same bytes as one that never stopped: model.safetensors and
 * optim.safetensors of the two step-10 checkpoints are identical, in f32
 * and in bf16.  The GPT has dropout (the forward counter must carry over),
 * AdamW's moments and step count and clipping; a checkpoint on the GPU is
 * written from the host mirrors (pulled) and a resume pushes them back.
 * The weights must have moved between steps 5 and 10 (else equal files
 * prove nothing).  Exits 77 (skipped) without CUDA or a GPU.
 *
 * If it fails, a save does not pull the device state (stale weights or
 * moments in the files), a resume does not push it, or a device kernel is
 * not deterministic from run to run (atomics in a reduction, say). */
#define _DEFAULT_SOURCE /* mkdtemp */
#include "cuda_train_cases.h"

#include <stdio.h>

static char dir[64];

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(len > 0 ? (size_t)len : 1);
  *n = b && len >= 0 ? fread(b, 1, (size_t)len, f) : 0;
  fclose(f);
  return b;
}

// Whether file `name` of checkpoints a and b has the same bytes.
static bool same_file(const char *a, const char *b, const char *name) {
  char pa[1024], pb[1024];
  snprintf(pa, sizeof pa, "%s/%s", a, name);
  snprintf(pb, sizeof pb, "%s/%s", b, name);
  size_t na = 0, nb = 0;
  unsigned char *x = slurp(pa, &na), *y = slurp(pb, &nb);
  CHECK(x && y && na > 0, "cannot read %s or %s", pa, pb);
  const bool same = x && y && na == nb && memcmp(x, y, na) == 0;
  free(x);
  free(y);
  return same;
}

static void one(px_dtype precision, const char *label) {
  char straight[256], stopped[256], end_a[512], end_b[512], mid[512];
  snprintf(straight, sizeof straight, "%s/%s_straight", dir, label);
  snprintf(stopped, sizeof stopped, "%s/%s_stopped", dir, label);
  ct_run r = {.device = PX_CUDA, .precision = precision, .steps = 10, .ckpt_every = 5, .ckpt_dir = straight};
  CHECK_OK(ct_train(&r, NULL, end_a, sizeof end_a));
  r.ckpt_dir = stopped;
  r.stop_at = 5;
  CHECK_OK(ct_train(&r, NULL, mid, sizeof mid));
  r.stop_at = 0;
  r.resume = "auto";
  CHECK_OK(ct_train(&r, NULL, end_b, sizeof end_b));
  CHECK(strstr(end_a, "step_00000010") && strstr(end_b, "step_00000010"), "%s: last checkpoints %s and %s", label,
        end_a, end_b);
  CHECK(strstr(mid, "step_00000005") != NULL, "%s: the stopped run's checkpoint is %s", label, mid);
  CHECK(same_file(end_a, end_b, "model.safetensors"), "%s: model.safetensors differs after the resume", label);
  CHECK(same_file(end_a, end_b, "optim.safetensors"), "%s: optim.safetensors differs after the resume", label);
  CHECK(!same_file(mid, end_a, "model.safetensors"), "%s: steps 6-10 did not change the weights", label);
  printf("%s: the resumed run's step-10 checkpoint equals the uninterrupted run's\n", label);
}

int main(void) {
  ct_skip_without_gpu("test_cuda_resume_is_bit_exact");
  snprintf(dir, sizeof dir, "/tmp/px_cuda_resume_XXXXXX");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  one(PX_F32, "f32");
  one(PX_BF16, "bf16");
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return px_test_finish("test_cuda_resume_is_bit_exact");
}
