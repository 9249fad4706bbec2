/* fuzz_proto.c — libFuzzer target: the agent's side of the agent <-> program protocol
 * (worker/proto.h) on arbitrary bytes from a program: the frames are taken out of a receive
 * buffer in chunks the input's first byte picks, and each message is read as the agent reads
 * it (wg_proto_program_message, hello first). Nothing may read out of bounds, leak or abort;
 * a frame the decoder accepts must be a JSON object with a string "type", and an accepted
 * progress record must re-encode. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"
#include "wagma/api.h"
#include "wagma/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t chunk = 1;
  if (size >= 1) {
    chunk = 1u + data[0] * 64u;
    data++;
    size--;
  }
  wg_proto_buf_t b = {0};
  int hello = 0;
  char why[200];
  for (size_t at = 0; at < size;) {
    size_t n = size - at < chunk ? size - at : chunk;
    if (wg_proto_buf_append(&b, data + at, n) != 0)
      break;
    at += n;
    json_t *m;
    int t;
    while ((t = wg_proto_take(&b, &m, why, sizeof why)) == 1) {
      if (!json_is_object(m) || !json_is_string(json_object_get(m, "type")))
        abort();
      wagma_progress_t p;
      wg_proto_checkpoint_t ck;
      int kind = wg_proto_program_message(m, hello, &p, &ck, why, sizeof why);
      if (kind == WG_PROTO_HELLO) {
        hello = 1;
      } else if (kind == WG_PROTO_PROGRESS) {
        char *json = NULL;
        if (wagma_progress_to_json(&p, &json) != 0)
          abort();
        free(json);
      } else if (kind == WG_PROTO_CHECKPOINT) {
        if (!ck.path[0] || ck.path[0] == '/' || strlen(ck.path) >= sizeof ck.path)
          abort();
      } else if (kind != WAGMA_EPROTO) {
        abort();
      }
      json_decref(m);
    }
    if (t < 0)
      break; /* the agent drops the program here */
  }
  wg_proto_buf_free(&b);
  return 0;
}
