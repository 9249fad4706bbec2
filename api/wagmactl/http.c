/* http.c — one HTTP request of wagmactl through libcurl's easy interface.
 *
 * Every request has a deadline: CURLOPT_TIMEOUT_MS covers the whole exchange (connect
 * included), CURLOPT_CONNECTTIMEOUT_MS the connect. Only http and https are allowed, no
 * redirects are followed (the API has none), signals are not used (NOSIGNAL). The answer is
 * kept whatever its status; a request that got no answer comes back with status 0 and
 * libcurl's words. Response bodies are capped at WG_CTL_MAX_RESPONSE. Single-threaded. */
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "ctl.h"

int wg_ctl_http_global_init(void) {
  return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

void wg_ctl_http_global_cleanup(void) {
  curl_global_cleanup();
}

typedef struct sink {
  char *buf;
  size_t len, cap;
  int overflow;
} sink_t;

static size_t on_data(char *data, size_t size, size_t nmemb, void *user) {
  sink_t *s = user;
  size_t n = size * nmemb;
  if (s->len + n + 1 > WG_CTL_MAX_RESPONSE) {
    s->overflow = 1;
    return 0; /* aborts the transfer (CURLE_WRITE_ERROR) */
  }
  if (s->len + n + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->len + n + 1)
      cap *= 2;
    char *nb = realloc(s->buf, cap);
    if (!nb)
      return 0;
    s->buf = nb;
    s->cap = cap;
  }
  memcpy(s->buf + s->len, data, n);
  s->len += n;
  s->buf[s->len] = '\0';
  return n;
}

void wg_ctl_response_free(wg_ctl_response_t *res) {
  free(res->body);
  memset(res, 0, sizeof *res);
}

/* Ownership: res->body is allocated here (also on failure) and freed by
 * wg_ctl_response_free. */
int wg_ctl_http_request(const wg_ctl_conn_t *conn, const char *method, const char *path,
                        const char *body, size_t body_len, wg_ctl_response_t *res) {
  memset(res, 0, sizeof *res);
  sink_t sink = {0};
  struct curl_slist *headers = NULL;
  char *url = NULL;
  char *auth = NULL;
  int rc = -1;
  CURL *curl = curl_easy_init();
  if (!curl) {
    snprintf(res->error, sizeof res->error, "cannot initialise libcurl");
    goto out;
  }
  size_t url_len = strlen(conn->server) + strlen(path) + 1;
  url = malloc(url_len);
  if (!url) {
    snprintf(res->error, sizeof res->error, "out of memory");
    goto out;
  }
  snprintf(url, url_len, "%s%s", conn->server, path);

  char errbuf[CURL_ERROR_SIZE] = "";
  long timeout_ms = (long)(conn->timeout_s * 1000.0);
  if (timeout_ms < 1)
    timeout_ms = 1;
  curl_easy_setopt(curl, CURLOPT_URL, url);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "wagmactl/0.1");
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &sink);

  headers = curl_slist_append(headers, "Accept: application/json");
  if (conn->token && *conn->token) {
    size_t n = strlen(conn->token) + sizeof "Authorization: Bearer ";
    auth = malloc(n);
    if (!auth) {
      snprintf(res->error, sizeof res->error, "out of memory");
      goto out;
    }
    snprintf(auth, n, "Authorization: Bearer %s", conn->token);
    headers = curl_slist_append(headers, auth);
  }
  if (body) {
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:"); /* no 100-continue round trip */
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  }
  if (strcmp(method, "GET") != 0 && !(body && strcmp(method, "POST") == 0))
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);

  CURLcode cc = curl_easy_perform(curl);
  if (cc != CURLE_OK) {
    res->timed_out = cc == CURLE_OPERATION_TIMEDOUT;
    if (sink.overflow)
      snprintf(res->error, sizeof res->error, "answer larger than %u bytes", WG_CTL_MAX_RESPONSE);
    else
      snprintf(res->error, sizeof res->error, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
    goto out;
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &res->status);
  if (res->status <= 0) {
    snprintf(res->error, sizeof res->error, "no HTTP status in the answer");
    res->status = 0;
    goto out;
  }
  rc = 0;
out:
  res->body = sink.buf ? sink.buf : calloc(1, 1);
  res->len = sink.buf ? sink.len : 0;
  curl_slist_free_all(headers);
  free(auth);
  free(url);
  if (curl)
    curl_easy_cleanup(curl);
  return rc;
}
