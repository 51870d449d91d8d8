// mpi_copy_mechanism: starts the MPI backend (px_comm_init_mpi, which
// initialises MPI) and prints, for each rank, what Open MPI's shared-memory
// transport was set to move large messages with, read back from Open MPI
// itself through the MPI tool interface (MPI_T control variables), and the
// size of the fragments it copies them in:
//
//   rank 0: btl_vader_single_copy_mechanism=none
//   rank 0: btl_vader_max_send_size=131072
//
// Exit 77 (a skip) without MPI, or when the MPI is not Open MPI (no such
// variable).  Driven by tests/test_mpi_backend_asks_open_mpi_for_the_double_copy_unless_told.py.
#include "plexus/plexus.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef PX_TEST_HAVE_MPI
#include <mpi.h>

// The name of value v of the enumeration of control variable idx ("" if none).
static void enum_name(int idx, int v, char *out, int cap) {
  char name[256], desc[1024];
  int nl = sizeof name, dl = sizeof desc, verbosity, bind, scope;
  MPI_Datatype dt;
  MPI_T_enum et;
  out[0] = '\0';
  if (MPI_T_cvar_get_info(idx, name, &nl, &verbosity, &dt, &et, desc, &dl, &bind, &scope) != MPI_SUCCESS ||
      et == MPI_T_ENUM_NULL)
    return;
  int n = 0;
  char en[128];
  int el = sizeof en;
  if (MPI_T_enum_get_info(et, &n, en, &el) != MPI_SUCCESS) return;
  for (int i = 0; i < n; i++) {
    int value = 0, len = cap;
    if (MPI_T_enum_get_item(et, i, &value, out, &len) == MPI_SUCCESS && value == v) return;
  }
  out[0] = '\0';
}
#endif

int main(void) {
#ifndef PX_TEST_HAVE_MPI
  printf("built without MPI\n");
  return 77;
#else
  px_comm *c = NULL;
  if (px_comm_init_mpi(&c) != PX_OK) {
    fprintf(stderr, "mpi_copy_mechanism: %s\n", px_last_error());
    return 1;
  }
  int provided = 0, found = 0, rc = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) {
    fprintf(stderr, "mpi_copy_mechanism: MPI_T_init_thread failed\n");
    rc = 1;
  }
  const char *vars[] = {"btl_vader_single_copy_mechanism", "btl_sm_single_copy_mechanism"};
  for (int k = 0; k < 2 && rc == 0; k++) {
    int idx = -1, count = 0, v = -1;
    MPI_T_cvar_handle h;
    if (MPI_T_cvar_get_index(vars[k], &idx) != MPI_SUCCESS) continue;
    if (MPI_T_cvar_handle_alloc(idx, NULL, &h, &count) != MPI_SUCCESS || count != 1) continue;
    if (MPI_T_cvar_read(h, &v) == MPI_SUCCESS) {
      char name[128];
      enum_name(idx, v, name, sizeof name);
      printf("rank %d: %s=%s\n", px_comm_rank(c), vars[k], name[0] ? name : "?");
      found = 1;
    }
    MPI_T_cvar_handle_free(&h);
  }
  // The fragment size of the double copy (a size_t variable).
  const char *sizes[] = {"btl_vader_max_send_size", "btl_sm_max_send_size"};
  for (int k = 0; k < 2 && rc == 0; k++) {
    int idx = -1, count = 0;
    MPI_T_cvar_handle h;
    if (MPI_T_cvar_get_index(sizes[k], &idx) != MPI_SUCCESS) continue;
    if (MPI_T_cvar_handle_alloc(idx, NULL, &h, &count) != MPI_SUCCESS || count != 1) continue;
    char name[256], desc[1024];
    int nl = sizeof name, dl = sizeof desc, verbosity, bind, scope;
    MPI_Datatype dt = MPI_DATATYPE_NULL;
    MPI_T_enum et;
    int dsize = 0;
    unsigned char buf[16] = {0};
    if (MPI_T_cvar_get_info(idx, name, &nl, &verbosity, &dt, &et, desc, &dl, &bind, &scope) == MPI_SUCCESS &&
        MPI_Type_size(dt, &dsize) == MPI_SUCCESS && dsize > 0 && dsize <= (int)sizeof buf &&
        MPI_T_cvar_read(h, buf) == MPI_SUCCESS) {
      unsigned long long v = 0;
      if (dsize == 8) {
        uint64_t x;
        memcpy(&x, buf, 8);
        v = x;
      } else if (dsize == 4) {
        uint32_t x;
        memcpy(&x, buf, 4);
        v = x;
      }
      printf("rank %d: %s=%llu\n", px_comm_rank(c), sizes[k], v);
    }
    MPI_T_cvar_handle_free(&h);
  }
  if (rc == 0) MPI_T_finalize();
  px_comm_free(c);
  px_comm_finalize_mpi();
  if (rc == 0 && !found) {
    printf("this MPI has no btl_vader/btl_sm single_copy_mechanism (not Open MPI)\n");
    return 77;
  }
  return rc;
#endif
}
