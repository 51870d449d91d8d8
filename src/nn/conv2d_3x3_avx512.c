// The direct 3×3 kernels (conv2d_3x3_body.inc) compiled for AVX-512F + FMA:
// 16 floats per vector and, with 32 vector registers, 8 output channels per
// block (the forward's 8 × 3 accumulators, dW's 8 × 3).  CMakeLists.txt
// compiles this file with -mavx512f -mfma and defines PX_C3_AVX2_VARIANT on
// x86-64 in a portable (not PX_NATIVE) build; conv2d_3x3.c calls these where
// cpuid reports AVX-512F and FMA.  Elsewhere the file is empty but for a
// declaration (ISO C wants one).
#include "nn/conv2d_3x3.h"

#if defined(PX_C3_AVX2_VARIANT) && defined(__AVX512F__) && defined(__FMA__)
#include <string.h>
#define PX_C3_NAME(n) n##_avx512
#define PX_C3_VL 16
#define PX_C3_OB_ 8
#include "nn/conv2d_3x3_body.inc"
#else
typedef int px_c3_avx512_not_built;
#endif
