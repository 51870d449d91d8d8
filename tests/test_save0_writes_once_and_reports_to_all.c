/* Claim: px_safetensors_save0 writes the file once, from rank 0, and every
 * rank returns rank 0's status, also when the save fails (an unwritable
 * path).  If it failed, N ranks would race to write one checkpoint, or
 * ranks would go on believing in a checkpoint that was never written. */
#include "px_test.h"

#include <string.h>
#include <unistd.h>

static int run(px_comm *c, void *arg) {
  (void)arg;
  float w[6] = {1, 2, 3, 4, 5, (float)px_comm_rank(c)};
  px_named_tensor t = {.name = "w"};
  t.tensor = px_tensor_f32(w, 2, 2, 3, 0, 0);
  px_state_dict sd = {.items = &t, .count = 1};
  CHECK_OK(px_safetensors_save0(c, "save0_test.safetensors", &sd, NULL, 0));
  px_safetensors *f;
  CHECK_OK(px_safetensors_open("save0_test.safetensors", &f));
  const px_named_tensor *got = px_safetensors_find(f, "w");
  float last;
  memcpy(&last, (const char *)got->tensor.data + 5 * sizeof(float), sizeof last);
  CHECK(last == 0.0f, "rank %d read %g: the file is not rank 0's", px_comm_rank(c), (double)last);
  px_safetensors_close(f);
  CHECK_OK(px_comm_barrier(c));
  px_status st = px_safetensors_save0(c, "/nonexistent-dir/x.safetensors", &sd, NULL, 0);
  CHECK(st == PX_ERR_IO && strstr(px_last_error(), "/nonexistent-dir/x.safetensors"), "rank %d: %s %s", px_comm_rank(c),
        px_status_name(st), px_last_error());
  return 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(3, run, NULL, &code));
  unlink("save0_test.safetensors");
  return px_test_finish("test_save0_writes_once_and_reports_to_all");
}
