/* libFuzzer target: the REST router on arbitrary (method, path) pairs, and the raw request
 * target check on the same path bytes. The input is split at the first NUL into method and
 * path (the target check sees every byte after that NUL, NULs included). Invariants: no
 * crash; a match names a valid job id when the route has one; 405 comes with an Allow list;
 * statuses are 0, 404 or 405 only; the target check answers 0 or 400, with a reason exactly
 * when 400, and never accepts a target holding a NUL byte or a %00. */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "router.h"

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

  size_t tlen = mlen < size ? size - mlen - 1 : 0;
  const char *target = mlen < size ? buf + mlen + 1 : "";
  const char *why = NULL;
  int status = wg_route_target_check(target, tlen, &why);
  if ((status != 0 && status != 400) || (status == 400) != (why != NULL))
    abort();
  if (status == 0 && (memchr(target, '\0', tlen) != NULL || memmem(target, tlen, "%00", 3)))
    abort();
  return 0;
}
