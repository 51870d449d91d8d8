// libFuzzer target: the plexus command's configuration parser
// (apps/plexus/config.c): a JSON config file (px_config_load_json) or a
// command line (px_config_parse), then the cross-option checks
// (px_config_validate) and the effective config written back as JSON
// (px_config_to_json) and read again.  The first byte picks the form: even,
// the rest is JSON text; odd, the rest is the arguments, one a line.  The
// command mask comes from its next bits (train, eval, generate).  Any
// input must give PX_OK or an error with a message, for every step; an
// accepted config must serialise.  Arguments naming --config are skipped
// (they would read a file named by the input: /dev/zero never ends).
#include "config.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_ARGS 64

static void check_status(px_status st) {
  if (st != PX_OK && !px_last_error()[0]) abort();  // an error must say what is wrong
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] & 1;
  const int commands = ((data[0] >> 1) & 7) ? (data[0] >> 1) & 7 : CFG_TRAIN;
  const char *text = (const char *)data + 1;
  const size_t n = size - 1;
  px_config c;
  px_config_defaults(&c);
  px_clear_error();
  px_status st;
  if (mode == 0) {
    st = px_config_load_json(&c, text, n, "fuzz.json", commands);
  } else {
    // One argument a line, "plexus" in front as the command's argv[0].
    char *buf = malloc(n + 1);
    if (!buf) abort();
    memcpy(buf, text, n);
    buf[n] = '\0';
    char *argv[MAX_ARGS + 1];
    int argc = 0;
    argv[argc++] = "plexus";
    for (char *p = buf; p && argc < MAX_ARGS;) {
      char *nl = strchr(p, '\n');
      if (nl) *nl = '\0';
      argv[argc++] = p;
      p = nl ? nl + 1 : NULL;
    }
    argv[argc] = NULL;
    bool names_file = false;
    for (int a = 1; a < argc; a++) names_file |= strncmp(argv[a], "--config", 8) == 0;
    st = names_file ? PX_OK : px_config_parse(&c, argc, argv, 1, commands);
    free(buf);
  }
  check_status(st);
  if (st == PX_OK) {
    px_clear_error();
    check_status(px_config_validate(&c, commands));
    char *json = px_config_to_json(&c, commands);
    if (!json) abort();  // an accepted config serialises
    px_config again;
    px_config_defaults(&again);
    px_clear_error();
    check_status(px_config_load_json(&again, json, strlen(json), "fuzz round trip", commands));
    px_config_free(&again);
    free(json);
  }
  px_config_free(&c);
  return 0;
}
