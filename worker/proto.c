/* worker/proto.c — frames of the agent <-> program protocol (proto.h): a growable receive
 * buffer, the frame decoder and a sender with a deadline. No threads, no globals; callers own
 * their buffers and descriptors. */
#include "proto.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wagma/api.h"
#include "wagma/clock_internal.h"
#include "wagma/status.h"

_Static_assert(sizeof(((wg_proto_checkpoint_t *)0)->path) == WAGMA_API_CHECKPOINT_PATH_MAX,
               "the checkpoint message's path is a checkpoint record's");

void wg_proto_buf_free(wg_proto_buf_t *b) {
  free(b->data);
  memset(b, 0, sizeof *b);
}

int wg_proto_buf_append(wg_proto_buf_t *b, const void *p, size_t n) {
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n)
      cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d)
      return WAGMA_ENOMEM;
    b->data = d;
    b->cap = cap;
  }
  memcpy(b->data + b->len, p, n);
  b->len += n;
  return 0;
}

int wg_proto_buf_fill(wg_proto_buf_t *b, int fd) {
  uint8_t chunk[16384];
  if (b->len > 4 + (size_t)WG_PROTO_FRAME_MAX)
    return WAGMA_EPROTO; /* the caller did not take the frames out: a frame cannot be this big */
  ssize_t n = read(fd, chunk, sizeof chunk);
  if (n < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? WAGMA_EBUSY : WAGMA_EIO;
  if (n == 0)
    return 0;
  int e = wg_proto_buf_append(b, chunk, (size_t)n);
  return e ? e : (int)n;
}

static int fail(char *err, size_t err_len, const char *why) {
  if (err && err_len)
    snprintf(err, err_len, "%s", why);
  return WAGMA_EPROTO;
}

int wg_proto_take(wg_proto_buf_t *b, json_t **msg, char *err, size_t err_len) {
  *msg = NULL;
  if (b->len < 4)
    return 0;
  uint32_t n = (uint32_t)b->data[0] | (uint32_t)b->data[1] << 8 | (uint32_t)b->data[2] << 16 |
               (uint32_t)b->data[3] << 24;
  if (n == 0 || n > WG_PROTO_FRAME_MAX)
    return fail(err, err_len, "a frame length of 0 or above the limit");
  if (b->len < 4 + (size_t)n)
    return 0;
  json_error_t je;
  json_t *o = json_loadb((const char *)b->data + 4, n, JSON_REJECT_DUPLICATES, &je);
  memmove(b->data, b->data + 4 + n, b->len - 4 - n);
  b->len -= 4 + (size_t)n;
  if (!o)
    return fail(err, err_len, "a frame that is not JSON");
  if (!json_is_object(o) || !json_is_string(json_object_get(o, "type"))) {
    json_decref(o);
    return fail(err, err_len, "a frame that is not an object with a string \"type\"");
  }
  *msg = o;
  return 1;
}

int wg_proto_send(int fd, const json_t *msg, double deadline) {
  char *text = json_dumps(msg, JSON_COMPACT);
  if (!text)
    return WAGMA_ENOMEM;
  size_t n = strlen(text);
  if (n == 0 || n > WG_PROTO_FRAME_MAX) {
    free(text);
    return WAGMA_ERANGE;
  }
  uint8_t head[4] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24)};
  struct part {
    const uint8_t *p;
    size_t left;
  } parts[2] = {{head, 4}, {(const uint8_t *)text, n}};
  int e = 0;
  for (int i = 0; i < 2 && !e; i++) {
    while (parts[i].left > 0) {
      ssize_t w = send(fd, parts[i].p, parts[i].left, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        parts[i].p += w;
        parts[i].left -= (size_t)w;
        continue;
      }
      if (w < 0 && errno == EINTR)
        continue;
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        e = WAGMA_EIO;
        break;
      }
      double left = deadline - wg_mono();
      if (left <= 0) {
        e = WAGMA_ETIMEDOUT;
        break;
      }
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int ms = (int)ceil(left * 1000.0);
      if (poll(&p, 1, ms > 1000 ? 1000 : ms) < 0 && errno != EINTR) {
        e = WAGMA_EIO;
        break;
      }
    }
  }
  free(text);
  return e;
}

const char *wg_proto_type(const json_t *msg) {
  const char *t = json_string_value(json_object_get(msg, "type"));
  return t ? t : "";
}

/* A checkpoint message: a relative path below the limit, integer iteration and epoch. */
static int checkpoint_message(const json_t *msg, wg_proto_checkpoint_t *ck, char *why, size_t len) {
  const char *path = json_string_value(json_object_get(msg, "path"));
  const json_t *it = json_object_get(msg, "iteration"), *ep = json_object_get(msg, "epoch");
  if (!path || !path[0] || path[0] == '/' || strlen(path) >= sizeof ck->path ||
      strlen(path) != json_string_length(json_object_get(msg, "path")))
    return fail(why, len, "a checkpoint without a relative path");
  if (!json_is_integer(it) || json_integer_value(it) < 0 || !json_is_integer(ep) ||
      json_integer_value(ep) < 0)
    return fail(why, len, "a checkpoint without its iteration and epoch");
  memset(ck, 0, sizeof *ck);
  memcpy(ck->path, path, strlen(path));
  ck->iteration = (uint64_t)json_integer_value(it);
  ck->epoch = (uint64_t)json_integer_value(ep);
  return WG_PROTO_CHECKPOINT;
}

int wg_proto_program_message(const json_t *msg, int hello_seen, struct wagma_progress *progress,
                             wg_proto_checkpoint_t *ck, char *why, size_t len) {
  const char *type = wg_proto_type(msg);
  if (!hello_seen) {
    const json_t *v = json_object_get(msg, "version");
    if (strcmp(type, "hello") != 0)
      return fail(why, len, "its first message is not hello");
    if (!json_is_integer(v) || json_integer_value(v) != WG_PROTO_VERSION)
      return fail(why, len, "it speaks another protocol version; this agent speaks 1");
    return WG_PROTO_HELLO;
  }
  if (strcmp(type, "checkpoint") == 0)
    return checkpoint_message(msg, ck, why, len);
  if (strcmp(type, "progress") != 0)
    return fail(why, len, "an unknown message type");
  wagma_api_error_t err;
  const json_t *rec = json_object_get(msg, "progress");
  char *text = json_is_object(rec) ? json_dumps(rec, JSON_COMPACT) : NULL;
  if (!text)
    return fail(why, len, "a progress message without a record");
  int e = wagma_progress_from_json(text, strlen(text), progress, &err);
  free(text);
  if (e) {
    if (why && len)
      snprintf(why, len, "a bad progress record: %.60s: %.100s", err.field, err.message);
    return WAGMA_EPROTO;
  }
  return WG_PROTO_PROGRESS;
}
