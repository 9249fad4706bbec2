/* libFuzzer target: the job spec decoder (and the PATCH decoder) on arbitrary bytes.
 * Invariants checked: no crash or sanitizer report; a decoded spec validates, re-encodes and
 * decodes to the same spec (same encoding); a failure names a field and a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wagma/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  wagma_job_spec_t spec, again;
  wagma_job_patch_t patch;
  wagma_api_error_t err;
  char *json = NULL;
  if (wagma_job_spec_from_json((const char *)data, size, &spec, &err) == 0) {
    if (wagma_job_spec_validate(&spec, &err) != 0)
      abort();
    if (wagma_job_spec_to_json(&spec, &json) != 0)
      abort();
    if (wagma_job_spec_from_json(json, strlen(json), &again, &err) != 0)
      abort();
    char *json2 = NULL; /* struct padding differs: compare the encodings */
    if (wagma_job_spec_to_json(&again, &json2) != 0 || strcmp(json, json2) != 0)
      abort();
    free(json);
    free(json2);
  } else if (err.message[0] == '\0') {
    abort();
  }
  if (wagma_job_patch_from_json((const char *)data, size, &patch, &err) == 0) {
    wagma_job_spec_init(&spec);
    spec.workers = spec.min_workers = spec.max_workers = 4;
    wagma_job_patch_apply(&patch, &spec, &err);
  }
  return 0;
}
