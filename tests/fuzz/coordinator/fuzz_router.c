/* libFuzzer target: the REST router on arbitrary (method, path) pairs. The input is split at
 * the first NUL into method and path. Invariants: no crash; a match names a valid job id when
 * the route has one; 405 comes with an Allow list; statuses are 0, 404 or 405 only. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char buf[1024];
  wg_route_t r;
  if (size >= sizeof buf)
    return 0;
  memcpy(buf, data, size);
  buf[size] = '\0';
  const char *method = buf;
  size_t mlen = strlen(buf);
  const char *path = mlen < size ? buf + mlen + 1 : "/";
  wg_route(method, path, &r);
  if (r.status != 0 && r.status != 404 && r.status != 405)
    abort();
  if (r.status == 405 && r.allow[0] == '\0')
    abort();
  if (r.status == 0 && r.id == WG_ROUTE_NONE)
    abort();
  if (r.status == 0 && r.id >= WG_ROUTE_JOB_GET && r.id <= WG_ROUTE_JOB_PLAN &&
      !wagma_api_name_valid(r.job))
    abort();
  return 0;
}
