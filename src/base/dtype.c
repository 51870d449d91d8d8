// Element types: sizes and safetensors names.
#include "plexus/base.h"

#include <string.h>

static const struct {
  const char *name;
  size_t size;
} dtype_info[PX_DTYPE_COUNT] = {
  [PX_F32] = {"F32", 4}, [PX_F64] = {"F64", 8}, [PX_F16] = {"F16", 2},   [PX_BF16] = {"BF16", 2}, [PX_I8] = {"I8", 1},
  [PX_I16] = {"I16", 2}, [PX_I32] = {"I32", 4}, [PX_I64] = {"I64", 8},   [PX_U8] = {"U8", 1},     [PX_U16] = {"U16", 2},
  [PX_U32] = {"U32", 4}, [PX_U64] = {"U64", 8}, [PX_BOOL] = {"BOOL", 1},
};

size_t px_dtype_size(px_dtype t) { return (unsigned)t < PX_DTYPE_COUNT ? dtype_info[t].size : 0; }

const char *px_dtype_name(px_dtype t) { return (unsigned)t < PX_DTYPE_COUNT ? dtype_info[t].name : "?"; }

px_status px_dtype_parse(const char *name, px_dtype *out) {
  for (int i = 0; i < PX_DTYPE_COUNT; i++)
    if (strcmp(name, dtype_info[i].name) == 0) {
      *out = (px_dtype)i;
      return PX_OK;
    }
  return px_error(PX_ERR_FORMAT, "unknown dtype \"%s\"", name);
}
