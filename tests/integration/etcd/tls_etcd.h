/* tls_etcd.h — an etcd with TLS, client-certificate auth and etcd users for the TLS tests
 * (test_etcd_tls.c, test_etcd_tls_daemons.c).
 *
 * Makes, with the openssl CLI, in a fresh temp dir: a CA (ca.crt), etcd's server pair
 * (server.crt/key, IP 127.0.0.1), a client pair with CN "wagma" (client.crt/key), an unrelated
 * CA (other-ca.crt) and a password file (password: "wagmapw"). Starts one etcd member with
 * https://, --client-cert-auth and the given extra flags, then adds the users root
 * (password rootpw) and wagma (role wagma: read-write on /wagma/ only) and enables auth;
 * etcdctl then runs as root. Test code: returns 0 / -1 with a message on stderr. */
#ifndef WAGMA_TEST_TLS_ETCD_H
#define WAGMA_TEST_TLS_ETCD_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "etcd_fixture.h"

typedef struct tls_etcd {
  char dir[256];
  etcd_fixture_t *etcd;
} tls_etcd_t;

/* dir/name (a ring of 8 buffers: valid for the next 7 calls). */
static inline const char *tls_etcd_path(tls_etcd_t *t, const char *name) {
  static char paths[8][320];
  static int next;
  char *p = paths[next++ % 8];
  snprintf(p, sizeof paths[0], "%s/%s", t->dir, name);
  return p;
}

static inline int tls_etcd_sh(const char *fmt, ...) {
  char command[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(command, sizeof command, fmt, args);
  va_end(args);
  int status = system(command);
  return status == -1 || !WIFEXITED(status) ? -1 : WEXITSTATUS(status);
}

static inline int tls_etcd_write(tls_etcd_t *t, const char *name, const char *text) {
  FILE *f = fopen(tls_etcd_path(t, name), "w");
  if (f == NULL)
    return -1;
  fputs(text, f);
  return fclose(f);
}

static inline const char *tls_etcd_etcdctl_tls(tls_etcd_t *t) {
  static char args[1024];
  snprintf(args, sizeof args, "--cacert=%s/ca.crt --cert=%s/client.crt --key=%s/client.key", t->dir,
           t->dir, t->dir);
  return args;
}

/* Starts it (extra: more etcd flags, NULL-terminated, at most 7, may be NULL). */
static inline int tls_etcd_start(tls_etcd_t *t, const char *const *extra) {
  const char *tmp = getenv("TMPDIR");
  const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  char root[1200];
  memset(t, 0, sizeof *t);
  snprintf(t->dir, sizeof t->dir, "%s/wagma-etcd-tls-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  if (mkdtemp(t->dir) == NULL)
    return -1;
  if (tls_etcd_write(t, "server.ext",
                     "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                     "extendedKeyUsage=serverAuth,clientAuth\n") != 0 ||
      tls_etcd_write(t, "client.ext", "extendedKeyUsage=clientAuth\n") != 0 ||
      tls_etcd_write(t, "password", "wagmapw\n") != 0 ||
      tls_etcd_sh("cd %s && openssl req -x509 %s -keyout ca.key -out ca.crt -days 2"
                  " -subj /CN=wagma-test-ca 2>/dev/null"
                  " && openssl req -x509 %s -keyout other-ca.key -out other-ca.crt -days 2"
                  " -subj /CN=someone-else 2>/dev/null"
                  " && openssl req %s -keyout server.key -out server.csr -subj /CN=etcd 2>/dev/null"
                  " && openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial"
                  " -out server.crt -days 2 -extfile server.ext 2>/dev/null"
                  " && openssl req %s -keyout client.key -out client.csr -subj /CN=wagma"
                  " 2>/dev/null && openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key"
                  " -CAcreateserial -out client.crt -days 2 -extfile client.ext 2>/dev/null",
                  t->dir, ec, ec, ec, ec) != 0) {
    fprintf(stderr, "tls_etcd: cannot make the certificates with openssl in %s\n", t->dir);
    return -1;
  }
  etcd_fixture_options_t options = {.cert_file = tls_etcd_path(t, "server.crt"),
                                    .key_file = tls_etcd_path(t, "server.key"),
                                    .trusted_ca_file = tls_etcd_path(t, "ca.crt"),
                                    .client_cert_auth = 1,
                                    .etcdctl_args = tls_etcd_etcdctl_tls(t)};
  for (int i = 0; extra != NULL && extra[i] != NULL && i < 7; i++)
    options.extra_args[i] = extra[i];
  if (etcd_fixture_start_with(1, &options, &t->etcd) != 0)
    return -1;
  if (etcd_fixture_etcdctl(t->etcd, "user add root:rootpw --interactive=false") != 0 ||
      etcd_fixture_etcdctl(t->etcd, "role add wagma") != 0 ||
      etcd_fixture_etcdctl(t->etcd,
                           "role grant-permission wagma --prefix=true readwrite /wagma/") != 0 ||
      etcd_fixture_etcdctl(t->etcd, "user add wagma:wagmapw --interactive=false") != 0 ||
      etcd_fixture_etcdctl(t->etcd, "user grant-role wagma wagma") != 0 ||
      etcd_fixture_etcdctl(t->etcd, "auth enable") != 0) {
    fprintf(stderr, "tls_etcd: cannot set the users up\n");
    return -1;
  }
  snprintf(root, sizeof root, "%s --user=root:rootpw", tls_etcd_etcdctl_tls(t));
  etcd_fixture_set_etcdctl_args(t->etcd, root);
  return 0;
}

static inline void tls_etcd_stop(tls_etcd_t *t) {
  etcd_fixture_stop(t->etcd);
  t->etcd = NULL;
  if (t->dir[0] && getenv("WAGMA_KEEP_ETCD_DIR") == NULL)
    tls_etcd_sh("rm -rf '%s'", t->dir); /* our own mkdtemp directory */
}

#endif
