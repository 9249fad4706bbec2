/* raw_http.h — HTTP/1.1 on raw sockets for the coordinator's REST server tests: requests
 * written byte for byte (an HTTP client library would refuse or repair malformed ones),
 * answers split by status line and Content-Length, source addresses chosen (any 127.0.0.0/8
 * address reaches a server on 127.0.0.1, and the server counts connections per address).
 * Test code: returns -1 / 0 on failure, never aborts. */
#ifndef WAGMA_TEST_RAW_HTTP_H
#define WAGMA_TEST_RAW_HTTP_H

#include <stddef.h>

/* A TCP connection from src (NULL = any) to 127.0.0.1:port; blocking, with SO_RCVTIMEO of
 * timeout_s. -1 on failure. */
int raw_connect(const char *src, int port, double timeout_s);

typedef struct raw_answer {
  int status; /* 0: none */
  char content_type[128];
  char retry_after[16];
  char body[8192];
  size_t body_len; /* as received (may exceed sizeof body - 1: then body is cut) */
} raw_answer_t;

/* Sends len bytes on a fresh connection from src and reads until the server closes or
 * timeout_s passes; splits what came into up to max answers. *status_lines (may be NULL) =
 * how many status lines ("HTTP/1.x NNN ") the whole stream holds, wherever they are.
 * Returns the number of answers. */
int raw_exchange(const char *src, int port, const void *bytes, size_t len, raw_answer_t *a, int max,
                 int *status_lines, double timeout_s);

/* GET path on a fresh connection from src with Connection: close; returns the seconds until
 * the whole answer came (timeout_s when none did; then *status = 0). */
double raw_get_timed(const char *src, int port, const char *path, int *status, double timeout_s);

double raw_now(void);

#endif
