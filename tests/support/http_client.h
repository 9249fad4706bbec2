/* http_client.h — one HTTP request through libcurl for integration tests (CMake target
 * wagma_test_http_client): 10 s deadline, no signals, the body and a few headers captured.
 * Returns 0 / -1 and never aborts (test code asserts). */
#ifndef WAGMA_TEST_HTTP_CLIENT_H
#define WAGMA_TEST_HTTP_CLIENT_H

#include <stddef.h>

typedef struct http_result {
  long status; /* 0 when no answer */
  char *body;  /* NUL-terminated, owned (http_result_free) */
  size_t len;
  char allow[128];
  char content_type[128];
  char location[192];
  int www_authenticate;
} http_result_t;

/* One request to url. body may be NULL (body_len bytes otherwise); content_type NULL = none;
 * token NULL = no Authorization. r is always filled (body "" at least, unless out of memory);
 * returns 0 when an answer came, -1 otherwise. */
int http_request(const char *method, const char *url, const char *body, size_t body_len,
                 const char *content_type, const char *token, http_result_t *r);
void http_result_free(http_result_t *r);

#endif
