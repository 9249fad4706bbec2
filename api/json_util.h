/* api/json_util.h — private helpers of wagma_api: typed field readers that fill a
 * wagma_api_error_t naming the field. Internal (wg_ prefix). */
#ifndef WAGMA_API_JSON_UTIL_H
#define WAGMA_API_JSON_UTIL_H

#include <stdint.h>

#include <jansson.h>

#include "wagma/api.h"

/* Writes field and a printf-style message into err (may be NULL). Returns WAGMA_EINVAL. */
int wg_api_fail(wagma_api_error_t *err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Joins "parent.child" into buf (or child alone when parent is ""). */
const char *wg_api_path(char *buf, size_t len, const char *parent, const char *child);

/* Readers: v must be non-NULL; check the type and the range [min, max]. */
int wg_api_int(const json_t *v, const char *field, int64_t min, int64_t max, int64_t *out,
               wagma_api_error_t *err);
int wg_api_u64(const json_t *v, const char *field, uint64_t max, uint64_t *out,
               wagma_api_error_t *err);
/* Accepts integers and reals; [min, max] inclusive unless the *_open flag is set. */
int wg_api_num(const json_t *v, const char *field, double min, int min_open, double max,
               int max_open, double *out, wagma_api_error_t *err);
int wg_api_bool(const json_t *v, const char *field, int *out, wagma_api_error_t *err);
/* Copies a string of at most cap-1 bytes. */
int wg_api_str(const json_t *v, const char *field, char *out, size_t cap, wagma_api_error_t *err);
/* Maps a string onto one of names[0..n-1]; the message lists the choices. */
int wg_api_enum(const json_t *v, const char *field, const char *const *names, int n, int *out,
                wagma_api_error_t *err);

/* Parses text into an object, or fails with field "" and jansson's position. */
json_t *wg_api_parse_object(const char *json, size_t len, wagma_api_error_t *err);

/* json_dumps with the flags every encoder uses (compact, keys in insertion order). */
int wg_api_dump(json_t *v, char **json);

#endif
