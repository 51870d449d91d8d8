/* Claim: under mpiexec with pp = the world size (1, 2, 3 and 4 processes), a
 * chain model cut into stages and trained through the generated GPipe, 1F1B
 * and interleaved (v = 2) tables with 4 micro-batches (interleaved: 6 at
 * p = 3, a multiple of p) gives the single
 * process's loss at every one of 20 AdamW steps, its parameters after them
 * (1e-5 relative) and its evaluation loss (tests/pp_cases.h).  With one
 * process every stage is on rank 0 and handed over in memory.  And the GPT
 * with its tied embedding and head on the first and last stage (1F1B),
 * without dropout and with dropout 0.1 (against one process running the
 * same 4 micro-batches with gradient accumulation).
 * If this fails and the threads twin passes: a message's size or tag
 * differs between the MPI and threads transports, or a send buffer was
 * reused before MPI finished with it. */
#include "pp_cases.h"

static int run(px_comm *c, void *arg) {
  (void)arg;
  px_comm_set_timeout(c, 120);
  const int p = px_comm_size(c);
  const int m_il = 4 % p == 0 ? 4 : 6;  // interleaved needs m % p == 0 (p = 3: 6)
  const struct {
    px_pp_kind kind;
    int m, v;
  } cases[] = {{PX_PP_GPIPE, 4, 1}, {PX_PP_1F1B, 4, 1}, {PX_PP_1F1B, 1, 1}, {PX_PP_INTERLEAVED, m_il, 2}};
  for (int i = 0; i < 4; i++) {
    px_pp_schedule *s;
    CHECK_OK(px_pp_schedule_make(cases[i].kind, p, cases[i].m, cases[i].v, &s));
    char what[96];
    snprintf(what, sizeof what, "%s p %d m %d v %d (%s)", px_pp_kind_name(cases[i].kind), p, cases[i].m, cases[i].v,
             px_comm_backend_name(px_comm_backend_of(c)));
    ppc_case(c, s, 6, NULL, i == 1 ? 0.3f : 0.0f, i == 3 ? 0.2f : 0.0f,
             what);  // interleaved: with dropout  // 1F1B: with gradient-norm clipping
    px_pp_schedule_free(s);
  }
  // The GPT: wte on the first stage, its tied head (and a copy of wte.weight) on the last.
  px_pp_schedule *s;
  CHECK_OK(px_pp_schedule_make(PX_PP_1F1B, p, 4, 1, &s));
  ppg_case(c, s, 0.0f, "1f1b m 4 (mpi)");
  ppg_case(c, s, 0.1f, "1f1b m 4, dropout (mpi)");
  px_pp_schedule_free(s);
  return px_test_failures ? 1 : 0;
}

int main(void) {
  int code = 0;
  CHECK_OK(px_comm_run(1, run, NULL, &code));
  CHECK(code == 0, "a rank failed (%d)", code);
  return px_test_finish("test_pp_exec_equals_single_process_mpi");
}
