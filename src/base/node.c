// How many of the job's processes share this node.  comm/ records it once
// it knows (px_comm_run under an MPI launcher: the world's local size, from
// MPI_Comm_split_type SHARED); the thread setting (tensor/threads.c) reads
// it for its default, the node's cores divided among those processes.  Here,
// in base/, because comm/ may not use tensor/ (docs/ARCHITECTURE.md).
#include "base/internal.h"

static _Atomic int node_processes = 1;

void px_node_set_processes(int n) { node_processes = n > 1 ? n : 1; }

int px_node_processes(void) { return node_processes; }
