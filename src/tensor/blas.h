// The BLAS functions plexus uses, resolved when libplexus loads (blas.c).
#ifndef PX_TENSOR_BLAS_H
#define PX_TENSOR_BLAS_H

#include <cblas.h>

typedef void (*px_sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, const int, const int,
                            const int, const float, const float *, const int, const float *, const int, const float,
                            float *, const int);

typedef struct px_blas_table {
  px_sgemm_fn sgemm; /* NULL: OpenBLAS missing, use the C loop */
  void (*set_num_threads)(int);
  char *(*get_config)(void);
  char *(*get_corename)(void);
} px_blas_table;

extern px_blas_table px_blas;

#endif
