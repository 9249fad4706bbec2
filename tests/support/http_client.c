/* http_client.c — see http_client.h. One curl easy handle per request; no shared state. The
 * caller runs curl_global_init once (libcurl also does it lazily). */
#include "http_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

typedef struct buf {
  char *p;
  size_t len;
} buf_t;

static size_t on_body(char *data, size_t size, size_t nmemb, void *user) {
  buf_t *b = user;
  size_t n = size * nmemb;
  char *np = realloc(b->p, b->len + n + 1);
  if (!np)
    return 0;
  memcpy(np + b->len, data, n);
  b->p = np;
  b->len += n;
  b->p[b->len] = '\0';
  return n;
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *user) {
  http_result_t *r = user;
  size_t n = size * nmemb;
  char line[512];
  size_t l = n < sizeof line - 1 ? n : sizeof line - 1;
  memcpy(line, data, l);
  line[l] = '\0';
  line[strcspn(line, "\r\n")] = '\0';
  if (strncasecmp(line, "Allow: ", 7) == 0)
    snprintf(r->allow, sizeof r->allow, "%.120s", line + 7);
  else if (strncasecmp(line, "Content-Type: ", 14) == 0)
    snprintf(r->content_type, sizeof r->content_type, "%.120s", line + 14);
  else if (strncasecmp(line, "Location: ", 10) == 0)
    snprintf(r->location, sizeof r->location, "%.180s", line + 10);
  else if (strncasecmp(line, "WWW-Authenticate: ", 18) == 0)
    r->www_authenticate = 1;
  return n;
}

int http_request(const char *method, const char *url, const char *body, size_t body_len,
                 const char *content_type, const char *token, http_result_t *r) {
  CURL *h = curl_easy_init();
  struct curl_slist *hdrs = NULL;
  buf_t b = {0};
  char line[512];
  int rc = -1;
  memset(r, 0, sizeof *r);
  if (!h)
    goto out;
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  if (strcmp(method, "HEAD") == 0)
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
  hdrs = curl_slist_append(hdrs, "Expect:");
  if (content_type) {
    snprintf(line, sizeof line, "Content-Type: %s", content_type);
    hdrs = curl_slist_append(hdrs, line);
  } else if (body) {
    hdrs = curl_slist_append(hdrs, "Content-Type:");
  }
  if (token) {
    snprintf(line, sizeof line, "Authorization: Bearer %s", token);
    hdrs = curl_slist_append(hdrs, line);
  }
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
  if (body) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  }
  if (curl_easy_perform(h) == CURLE_OK) {
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    rc = 0;
  }
out:
  r->body = b.p ? b.p : strdup("");
  r->len = b.len;
  curl_slist_free_all(hdrs);
  curl_easy_cleanup(h);
  return rc;
}

void http_result_free(http_result_t *r) {
  free(r->body);
  r->body = NULL;
}
