// Internal helpers of the tensor layer shared by kernels in src/.
#ifndef PX_TENSOR_INTERNAL_H
#define PX_TENSOR_INTERNAL_H

#include <stddef.h>

// Read PX_NUM_THREADS once and apply it to OpenMP and OpenBLAS.
void px_threads_init(void);

// Below this many elements an OpenMP region costs more than it saves.
#define PX_PAR_MIN 32768

// `#pragma omp parallel for if (PX_PAR(n))`
#define PX_PAR(n) ((n) >= PX_PAR_MIN)

#endif
