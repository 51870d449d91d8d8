// Errors are values: a status code plus a per-thread message.
#define _POSIX_C_SOURCE 200809L
#include "plexus/base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define PX_ERR_MAX 1024
static _Thread_local char err_msg[PX_ERR_MAX];

const char *px_last_error(void) { return err_msg; }

void px_clear_error(void) { err_msg[0] = '\0'; }

const char *px_status_name(px_status s) {
  switch (s) {
  case PX_OK: return "PX_OK";
  case PX_ERR_INVALID: return "PX_ERR_INVALID";
  case PX_ERR_SHAPE: return "PX_ERR_SHAPE";
  case PX_ERR_IO: return "PX_ERR_IO";
  case PX_ERR_FORMAT: return "PX_ERR_FORMAT";
  case PX_ERR_NOMEM: return "PX_ERR_NOMEM";
  case PX_ERR_NOT_FOUND: return "PX_ERR_NOT_FOUND";
  case PX_ERR_UNSUPPORTED: return "PX_ERR_UNSUPPORTED";
  case PX_ERR_COMM: return "PX_ERR_COMM";
  case PX_ERR_TIMEOUT: return "PX_ERR_TIMEOUT";
  case PX_ERR_INTERNAL: return "PX_ERR_INTERNAL";
  }
  return "PX_ERR_UNKNOWN";
}

px_status px_error(px_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  va_end(ap);
  return s;
}

px_status px_error_wrap(px_status s, const char *fmt, ...) {
  char prefix[PX_ERR_MAX], old[PX_ERR_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, err_msg, sizeof old);
  // Truncation is fine: a long message keeps its start.
  size_t k = strlen(prefix);
  memcpy(err_msg, prefix, k);
  if (k + 2 < sizeof err_msg) {
    err_msg[k++] = ':';
    err_msg[k++] = ' ';
  }
  size_t rest = strnlen(old, sizeof old);
  if (rest > sizeof err_msg - 1 - k) rest = sizeof err_msg - 1 - k;
  memcpy(err_msg + k, old, rest);
  err_msg[k + rest] = '\0';
  return s;
}
