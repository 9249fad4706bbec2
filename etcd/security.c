/* security.c — TLS credentials and etcd authentication of a handle.
 *
 * TLS: the CA bundle and the client certificate + key are read from their PEM files at open
 * into SSL channel credentials (gRPC's own TLS; the server name checked is the endpoint's
 * host, so etcd's certificate must name it, as a DNS name or an IP address). The files are
 * looked at again at most once a second, from calls (stat: device, inode, size, mtime); when
 * one changed they are read again and client.c gives every endpoint a new channel on the new
 * credentials, so a renewed client certificate or a rotated CA takes effect on the next
 * connection, without a restart (wg_etcd_tls_changed).
 * Authentication: a handle with a username calls /etcdserverpb.Auth/Authenticate (through the
 * unary engine, without a token) and sends the token it gets as the "token" metadata of every
 * call and stream. etcd forgets or refuses a token when it expires (--auth-token-ttl of a
 * simple token left unused), when etcd restarts (simple tokens live in memory), and when the
 * auth store's revision moves (a user, role or password changed); the call that meets the
 * rejection drops that token (by generation, so concurrent callers drop it once) and calls
 * again with a new one. The password is re-read from password_file at each authentication,
 * so a rotated secret works without a restart.
 *
 * Owns: the handle's username, password, password_file and token (under auth_lock), and the
 * TLS paths and their signatures (under tls_lock).
 * Threads: none; callers of any thread. Authenticate runs under auth_lock, so only one
 * caller authenticates at a time and the others wait for its token (bounded by that call's
 * deadline). Lock order: auth_lock, then etcd->lock (taken by the unary engine). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <grpc/grpc_security.h>

#include "etcd_internal.h"

#define AUTHENTICATE "/etcdserverpb.Auth/Authenticate"
#define PEM_MAX (1 << 20)

/* Reads a whole file (at most PEM_MAX bytes) into a NUL-terminated string. NULL with err. */
static char *read_file(const char *what, const char *path, char *err, size_t err_len) {
  FILE *f = fopen(path, "rb");
  char *text = NULL;
  size_t n = 0;
  if (f == NULL) {
    snprintf(err, err_len, "%s %s: cannot open", what, path);
    return NULL;
  }
  text = malloc(PEM_MAX + 1);
  if (text != NULL)
    n = fread(text, 1, PEM_MAX + 1, f);
  if (text != NULL && (ferror(f) || n > PEM_MAX)) {
    snprintf(err, err_len, "%s %s: %s", what, path, ferror(f) ? "cannot read" : "too large");
    free(text);
    text = NULL;
  } else if (text == NULL) {
    snprintf(err, err_len, "out of memory");
  } else {
    text[n] = '\0';
  }
  fclose(f);
  return text;
}

static char *read_pem(const char *what, const char *path, char *err, size_t err_len) {
  char *text = read_file(what, path, err, err_len);
  if (text != NULL && strstr(text, "-----BEGIN ") == NULL) {
    snprintf(err, err_len, "%s %s: not a PEM file", what, path);
    free(text);
    return NULL;
  }
  return text;
}

/* The password: the option, or password_file's first line. Caller frees. NULL with err. */
static char *read_password(const char *password, const char *file, char *err, size_t err_len) {
  char *text;
  size_t n;
  if (password != NULL)
    return strdup(password);
  text = read_file("etcd password file", file, err, err_len);
  if (text == NULL)
    return NULL;
  n = strcspn(text, "\r\n");
  text[n] = '\0';
  if (n == 0) {
    snprintf(err, err_len, "etcd password file %s is empty", file);
    free(text);
    return NULL;
  }
  return text;
}

int wg_etcd_security_check(const wagma_etcd_options_t *o, int *tls, char *err, size_t err_len) {
  *tls = o->ca_file != NULL || o->cert_file != NULL || o->key_file != NULL;
  if ((o->cert_file == NULL) != (o->key_file == NULL)) {
    snprintf(err, err_len, "a client certificate needs both the certificate and its key");
    return WAGMA_EINVAL;
  }
  const char *files[3][2] = {{"etcd CA file", o->ca_file},
                             {"etcd client certificate", o->cert_file},
                             {"etcd client key", o->key_file}};
  for (int i = 0; i < 3; i++) {
    if (files[i][1] == NULL)
      continue;
    char *pem = read_pem(files[i][0], files[i][1], err, err_len);
    if (pem == NULL)
      return WAGMA_EINVAL;
    free(pem);
  }
  if (o->username != NULL) {
    if (o->username[0] == '\0') {
      snprintf(err, err_len, "empty etcd user name");
      return WAGMA_EINVAL;
    }
    if (o->password == NULL && o->password_file == NULL) {
      snprintf(err, err_len, "etcd user %s needs a password (or a password file)", o->username);
      return WAGMA_EINVAL;
    }
    char *password = read_password(o->password, o->password_file, err, err_len);
    if (password == NULL)
      return WAGMA_EINVAL;
    free(password);
  } else if (o->password != NULL || o->password_file != NULL) {
    snprintf(err, err_len, "an etcd password without a user");
    return WAGMA_EINVAL;
  }
  return 0;
}

grpc_channel_credentials *wg_etcd_credentials(const wagma_etcd_options_t *o, int tls, char *err,
                                              size_t err_len) {
  grpc_channel_credentials *creds = NULL;
  char *ca = NULL, *cert = NULL, *key = NULL;
  if (!tls)
    return grpc_insecure_credentials_create();
  if (o->ca_file != NULL && (ca = read_pem("etcd CA file", o->ca_file, err, err_len)) == NULL)
    goto out;
  if (o->cert_file != NULL &&
      ((cert = read_pem("etcd client certificate", o->cert_file, err, err_len)) == NULL ||
       (key = read_pem("etcd client key", o->key_file, err, err_len)) == NULL))
    goto out;
  grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
  creds = grpc_ssl_credentials_create(ca, cert != NULL ? &pair : NULL, NULL, NULL);
  if (creds == NULL)
    snprintf(err, err_len, "cannot create TLS credentials");
out:
  free(ca);
  free(cert);
  if (key != NULL) {
    memset(key, 0, strlen(key));
    free(key);
  }
  return creds;
}

/* ---- TLS rotation ------------------------------------------------------------------- */

static wg_etcd_file_sig_t file_sig(const char *path) {
  wg_etcd_file_sig_t sig;
  struct stat st;
  memset(&sig, 0, sizeof sig);
  if (path == NULL || stat(path, &st) != 0) {
    sig.missing = 1;
    return sig;
  }
  sig.dev = (unsigned long long)st.st_dev;
  sig.ino = (unsigned long long)st.st_ino;
  sig.size = (unsigned long long)st.st_size;
  sig.mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
  return sig;
}

static int same_sig(const wg_etcd_file_sig_t *a, const wg_etcd_file_sig_t *b) {
  return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime_ns == b->mtime_ns &&
         a->missing == b->missing;
}

int wg_etcd_tls_init(wagma_etcd_t *etcd, const wagma_etcd_options_t *o) {
  const char *paths[3] = {o->ca_file, o->cert_file, o->key_file};
  for (int i = 0; i < 3; i++) {
    if (paths[i] != NULL && (etcd->tls_paths[i] = strdup(paths[i])) == NULL)
      return WAGMA_ENOMEM;
    etcd->tls_sigs[i] = file_sig(paths[i]);
  }
  etcd->tls_checked_ms = wg_etcd_now_ms();
  return 0;
}

grpc_channel_credentials *wg_etcd_tls_changed(wagma_etcd_t *etcd) {
  wg_etcd_file_sig_t now[3];
  grpc_channel_credentials *creds = NULL;
  int changed = 0;
  char err[256] = "";
  if (!etcd->tls || pthread_mutex_trylock(&etcd->tls_lock) != 0)
    return NULL; /* another caller is looking */
  int64_t t = wg_etcd_now_ms();
  if (t - etcd->tls_checked_ms < WG_ETCD_TLS_CHECK_MS)
    goto out;
  etcd->tls_checked_ms = t;
  for (int i = 0; i < 3; i++) {
    now[i] = file_sig(etcd->tls_paths[i]);
    changed |= etcd->tls_paths[i] != NULL && !same_sig(&now[i], &etcd->tls_sigs[i]);
  }
  if (!changed)
    goto out;
  wagma_etcd_options_t o = {.ca_file = etcd->tls_paths[0],
                            .cert_file = etcd->tls_paths[1],
                            .key_file = etcd->tls_paths[2]};
  creds = wg_etcd_credentials(&o, 1, err, sizeof err);
  if (creds == NULL) {
    if (!etcd->tls_unreadable) /* once per failing spell */
      wg_logf(etcd->log_fn, etcd->log_user, WAGMA_LOG_WARN,
              "etcd: the TLS files changed but do not read yet (%s): keeping the credentials in "
              "use, looking again in %d ms",
              err, WG_ETCD_TLS_CHECK_MS);
    etcd->tls_unreadable = 1;
    goto out;
  }
  etcd->tls_unreadable = 0;
  memcpy(etcd->tls_sigs, now, sizeof now);
out:
  pthread_mutex_unlock(&etcd->tls_lock);
  return creds;
}

/* ---- authentication ----------------------------------------------------------------- */

int wg_etcd_auth_init(wagma_etcd_t *etcd, const wagma_etcd_options_t *o) {
  if ((o->username != NULL && (etcd->username = strdup(o->username)) == NULL) ||
      (o->password != NULL && (etcd->password = strdup(o->password)) == NULL) ||
      (o->password_file != NULL && (etcd->password_file = strdup(o->password_file)) == NULL))
    return WAGMA_ENOMEM;
  return 0;
}

static void free_secret(char *secret) {
  if (secret == NULL)
    return;
  memset(secret, 0, strlen(secret));
  free(secret);
}

void wg_etcd_auth_destroy(wagma_etcd_t *etcd) {
  free(etcd->username);
  free_secret(etcd->password);
  free(etcd->password_file);
  free_secret(etcd->token);
  etcd->username = etcd->password = etcd->password_file = etcd->token = NULL;
  for (int i = 0; i < 3; i++) {
    free(etcd->tls_paths[i]);
    etcd->tls_paths[i] = NULL;
  }
  pthread_mutex_destroy(&etcd->tls_lock);
  pthread_mutex_destroy(&etcd->auth_lock);
}

int wg_etcd_token_rejected(grpc_status_code code, const char *details) {
  if (code == GRPC_STATUS_UNAUTHENTICATED)
    return 1;
  return details != NULL && (strstr(details, "invalid auth token") != NULL ||
                             strstr(details, "revision of auth store is old") != NULL ||
                             strstr(details, "user name is empty") != NULL);
}

/* Authenticate under auth_lock: sets etcd->token ("" when etcd's auth is off). */
static int authenticate_locked(wagma_etcd_t *etcd, int64_t deadline_ms) {
  Etcdserverpb__AuthenticateRequest request = ETCDSERVERPB__AUTHENTICATE_REQUEST__INIT;
  Etcdserverpb__AuthenticateResponse *response = NULL;
  char why[256];
  char *password = read_password(etcd->password, etcd->password_file, why, sizeof why);
  int rc;
  if (password == NULL) {
    wg_etcd_set_error(etcd, "etcd authentication as %s: %s", etcd->username, why);
    return WAGMA_EINVAL;
  }
  request.name = etcd->username;
  request.password = password;
  rc = wg_etcd_unary_token(etcd, AUTHENTICATE, &request.base,
                           &etcdserverpb__authenticate_response__descriptor,
                           (ProtobufCMessage **)&response, deadline_ms, NULL, NULL, NULL);
  free_secret(password);
  free_secret(etcd->token);
  etcd->token = NULL;
  if (rc == 0) {
    etcd->token = strdup(response->token != NULL ? response->token : "");
    rc = etcd->token == NULL ? WAGMA_ENOMEM : 0;
    wg_logf(etcd->log_fn, etcd->log_user, WAGMA_LOG_DEBUG, "etcd: authenticated as %s",
            etcd->username);
  } else if (strstr(wagma_etcd_errmsg(etcd), "authentication is not enabled") != NULL) {
    /* etcd runs without auth: no token to send. Asked again when a call says one is needed. */
    etcd->token = strdup("");
    rc = etcd->token == NULL ? WAGMA_ENOMEM : 0;
    wg_logf(etcd->log_fn, etcd->log_user, WAGMA_LOG_INFO,
            "etcd: authentication is not enabled; calling without a token");
  } else {
    char detail[WG_ETCD_ERRMSG_MAX];
    snprintf(detail, sizeof detail, "%s", wagma_etcd_errmsg(etcd));
    wg_etcd_set_error(etcd, "etcd authentication as user %s failed: %s", etcd->username, detail);
  }
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  if (rc == 0)
    etcd->token_gen++;
  return rc;
}

int wg_etcd_token(wagma_etcd_t *etcd, int64_t deadline_ms, char **token, uint64_t *gen) {
  int rc = 0;
  *token = NULL;
  *gen = 0;
  if (etcd->username == NULL)
    return 0;
  pthread_mutex_lock(&etcd->auth_lock);
  if (etcd->token == NULL)
    rc = authenticate_locked(etcd, deadline_ms);
  if (rc == 0) {
    *gen = etcd->token_gen;
    if (etcd->token[0] != '\0' && (*token = strdup(etcd->token)) == NULL)
      rc = WAGMA_ENOMEM;
  }
  pthread_mutex_unlock(&etcd->auth_lock);
  return rc;
}

void wg_etcd_token_reject(wagma_etcd_t *etcd, uint64_t gen) {
  if (etcd->username == NULL)
    return;
  pthread_mutex_lock(&etcd->auth_lock);
  if (etcd->token != NULL && etcd->token_gen == gen) {
    free_secret(etcd->token);
    etcd->token = NULL;
    wg_logf(etcd->log_fn, etcd->log_user, WAGMA_LOG_INFO,
            "etcd: token rejected (expired, etcd restarted or auth changed); authenticating again");
  }
  pthread_mutex_unlock(&etcd->auth_lock);
}
