// The direct 3×3 kernels (conv2d_3x3_body.inc) compiled for AVX2 + FMA:
// CMakeLists.txt compiles this file with -mavx2 -mfma and defines
// PX_C3_AVX2_VARIANT on x86-64 in a portable (not PX_NATIVE) build;
// conv2d_3x3.c calls these where cpuid reports AVX2 and FMA but not
// AVX-512F (or PX_CONV_ISA=avx2 asks for them).  Elsewhere the file is empty
// but for a declaration (ISO C wants one).
#include "nn/conv2d_3x3.h"

#if defined(PX_C3_AVX2_VARIANT) && defined(__AVX2__) && defined(__FMA__)
#include <string.h>
#define PX_C3_NAME(n) n##_avx2
#define PX_C3_VL 8
#define PX_C3_OB_ 4
#include "nn/conv2d_3x3_body.inc"
#else
typedef int px_c3_avx2_not_built;
#endif
