/* worker/proto.h — the agent <-> program protocol, private to wagma-agent and libwagma (the
 * wire format is documented in docs/programs.md).
 *
 * A stream socket (AF_UNIX, SOCK_STREAM) carries frames: a 4-byte little-endian length n
 * (1 <= n <= WG_PROTO_FRAME_MAX) and n bytes of one JSON object with a string "type".
 *   program -> agent: hello {"version","pid"}, progress {"progress": <progress record>},
 *                     checkpoint {"path" (relative to the checkpoint root), "iteration",
 *                     "epoch"}
 *   agent -> program: config {"version", the job's configuration}, plan {"plan": <plan>,
 *                     "secret": <64 hex characters or "">}, stop {"reason"}
 * The decoder works on a buffer the caller fills (wg_proto_buf_t), so it can be fuzzed and used
 * on a non-blocking descriptor; it never trusts a length before checking it. */
#ifndef WAGMA_WORKER_PROTO_H
#define WAGMA_WORKER_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define WG_PROTO_VERSION 1
#define WG_PROTO_FRAME_MAX (4u << 20) /* a plan of 10000 members is ~1 MiB */
/* the environment the agent sets for the program it launches */
#define WG_PROTO_ENV_SOCKET "WAGMA_AGENT_SOCKET" /* path of the agent's socket */
#define WG_PROTO_ENV_LISTEN_FD "WAGMA_LISTEN_FD" /* the data plane's bound listening socket */

typedef struct wg_proto_buf {
  uint8_t *data;
  size_t len, cap;
} wg_proto_buf_t;

void wg_proto_buf_free(wg_proto_buf_t *b);
/* Appends n bytes. 0 or WAGMA_ENOMEM. */
int wg_proto_buf_append(wg_proto_buf_t *b, const void *p, size_t n);
/* Reads what fd has now (non-blocking or after poll) into b: > 0 bytes read, 0 at end of
 * stream, WAGMA_EBUSY when nothing is there (EAGAIN), WAGMA_EIO on an error, WAGMA_EPROTO when
 * b already holds a whole frame's worth beyond the limit. */
int wg_proto_buf_fill(wg_proto_buf_t *b, int fd);
/* Takes the first whole frame out of b: 1 with *msg (the caller json_decref's it), 0 when b
 * holds no whole frame yet, WAGMA_EPROTO (a bad length, not JSON, not an object, no string
 * "type") with why in err (err_len bytes; may be NULL). */
int wg_proto_take(wg_proto_buf_t *b, json_t **msg, char *err, size_t err_len);

/* Writes msg as one frame before deadline (wg_now seconds; poll on a non-blocking fd, plain
 * writes on a blocking one). 0, WAGMA_ETIMEDOUT, WAGMA_EIO (the peer left), WAGMA_ENOMEM,
 * WAGMA_ERANGE (larger than WG_PROTO_FRAME_MAX). Never raises SIGPIPE. */
int wg_proto_send(int fd, const json_t *msg, double deadline);

/* The "type" of a message ("" when absent). Borrowed. */
const char *wg_proto_type(const json_t *msg);

/* A checkpoint the program saved (its "checkpoint" message). */
typedef struct wg_proto_checkpoint {
  char path[384]; /* WAGMA_API_CHECKPOINT_PATH_MAX: relative, never starting with '/' */
  uint64_t iteration, epoch;
} wg_proto_checkpoint_t;

/* The agent's reading of a program's message (the untrusted side of the protocol): before the
 * hello (hello_seen 0) only a hello of WG_PROTO_VERSION is accepted; after it progress, whose
 * record must decode (wagma_progress_from_json) into *progress, or checkpoint into *ck.
 * Returns WG_PROTO_HELLO, WG_PROTO_PROGRESS or WG_PROTO_CHECKPOINT, or WAGMA_EPROTO with why
 * (len bytes). Pure. */
enum { WG_PROTO_HELLO = 1, WG_PROTO_PROGRESS = 2, WG_PROTO_CHECKPOINT = 3 };
struct wagma_progress;
int wg_proto_program_message(const json_t *msg, int hello_seen, struct wagma_progress *progress,
                             wg_proto_checkpoint_t *ck, char *why, size_t len);

#endif
