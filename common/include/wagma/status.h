/* wagma/status.h — the one status type and logger callback shared by every wagma library.
 *
 * Functions that can fail return int: 0 (WAGMA_OK) or a negative WAGMA_E* code.
 * wagma_strerror() maps a code to a fixed string; detail messages live on each handle.
 * Libraries never print: they call a wagma_log_fn the caller supplies (may be NULL). */
#ifndef WAGMA_STATUS_H
#define WAGMA_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

enum wagma_status {
  WAGMA_OK = 0,
  WAGMA_EINVAL = -1,      /* bad argument or malformed input */
  WAGMA_ENOMEM = -2,      /* allocation failed */
  WAGMA_EIO = -3,         /* system call or socket error */
  WAGMA_ETIMEDOUT = -4,   /* a deadline passed */
  WAGMA_EPROTO = -5,      /* corrupt, short or oversized frame / response */
  WAGMA_EEPOCH = -6,      /* message or operation from another epoch */
  WAGMA_ECLOSED = -7,     /* the handle was closed or torn down meanwhile */
  WAGMA_EPEER = -8,       /* a peer died or left */
  WAGMA_ENOTFOUND = -9,   /* key, job, lease or object does not exist */
  WAGMA_EEXIST = -10,     /* already exists */
  WAGMA_ECONFLICT = -11,  /* compare failed, concurrent modification */
  WAGMA_EUNAVAIL = -12,   /* service (etcd, peer) unreachable */
  WAGMA_ECOMPACTED = -13, /* requested revision was compacted */
  WAGMA_EPERM = -14,      /* not allowed (auth, not leader) */
  WAGMA_ERANGE = -15,     /* value out of range, buffer too small */
  WAGMA_ENOSYS = -16,     /* not supported in this build */
  WAGMA_ECANCELED = -17,  /* operation canceled by the caller */
  WAGMA_EBUSY = -18,      /* resource in use, try later */
  WAGMA_EINTERNAL = -19,  /* invariant broken: a bug */
};

/* Returns a static, never-NULL description of a status code. */
const char *wagma_strerror(int status);

enum wagma_log_level { WAGMA_LOG_DEBUG = 0, WAGMA_LOG_INFO, WAGMA_LOG_WARN, WAGMA_LOG_ERROR };

/* Logger callback: called from any library thread; must be thread-safe. msg is only
 * valid during the call. */
typedef void (*wagma_log_fn)(void *user, int level, const char *msg);

const char *wagma_log_level_name(int level);

#ifdef __cplusplus
}
#endif
#endif
