/* agent/ckroot.c — the agent's checkpoint root: every checkpoint file the agent writes or reads
 * lies under it (--checkpoint-root, docs/agent.md "Checkpoints").
 *
 * The job spec's checkpoint.path and the checkpoint record's path (both in etcd, both written by
 * others) are paths RELATIVE to the root. A path is taken only when it is relative, has no empty,
 * "." or ".." component and no control character (the rule the spec validator applies), and it
 * is opened one component at a time from the root's directory fd with O_NOFOLLOW (openat), so
 * no symbolic link below the root is followed: a link planted under the root (to /etc, to
 * another job's directory outside) is refused, not written through. The root itself is resolved
 * once at startup (realpath) and held open, so replacing it afterwards changes nothing.
 *
 * No threads of its own; the root is opened by main before the runner starts and only read
 * afterwards (its fd is used with openat, which is thread-safe). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/ckroot.h"
#include "agent/train/train.h"
#include "wagma/status.h"

int wg_ckroot_open(const char *dir, wg_ckroot_t *root, char *err, size_t err_len) {
  char real[PATH_MAX];
  root->fd = -1;
  root->path[0] = '\0';
  if (!dir || !dir[0])
    dir = ".";
  if (!realpath(dir, real)) {
    snprintf(err, err_len, "--checkpoint-root %s: %s", dir, strerror(errno));
    return WAGMA_EINVAL;
  }
  int fd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, err_len, "--checkpoint-root %s: %s", dir, strerror(errno));
    return WAGMA_EINVAL;
  }
  if (strlen(real) >= sizeof root->path) {
    close(fd);
    snprintf(err, err_len, "--checkpoint-root %s: longer than %zu bytes", dir,
             sizeof root->path - 1);
    return WAGMA_EINVAL;
  }
  root->fd = fd;
  snprintf(root->path, sizeof root->path, "%s", real);
  return 0;
}

void wg_ckroot_close(wg_ckroot_t *root) {
  if (root->fd >= 0)
    close(root->fd);
  root->fd = -1;
}

const char *wg_ckroot_path_problem(const char *rel) {
  if (!rel || !rel[0])
    return "is empty";
  if (rel[0] == '/')
    return "is absolute (it must be relative to the checkpoint root)";
  for (const unsigned char *p = (const unsigned char *)rel; *p; p++)
    if (*p < 0x20 || *p == 0x7f)
      return "contains control characters";
  for (const char *c = rel;;) {
    size_t n = strcspn(c, "/");
    if (n == 0)
      return "has an empty component ('//' or a trailing '/')";
    if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
      return "has a '.' or '..' component";
    if (n > NAME_MAX)
      return "has a component longer than NAME_MAX";
    if (c[n] == '\0')
      return NULL;
    c += n + 1;
  }
}

/* Why openat(dirfd, name, O_NOFOLLOW...) failed: a link is named as such. */
static const char *open_problem(int dirfd, const char *name, int saved) {
  struct stat st;
  if ((saved == ELOOP || saved == ENOTDIR) && fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
      S_ISLNK(st.st_mode))
    return "is a symbolic link (links are not followed under the checkpoint root)";
  return strerror(saved);
}

int wg_ckroot_opendir(const wg_ckroot_t *root, const char *rel, int create, char *err,
                      size_t err_len) {
  char comp[NAME_MAX + 1];
  const char *why;
  if (root->fd < 0) {
    snprintf(err, err_len, "no checkpoint root");
    return WAGMA_EINVAL;
  }
  int fd = fcntl(root->fd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, err_len, "checkpoint root %s: %s", root->path, strerror(errno));
    return WAGMA_EIO;
  }
  if (!rel || !rel[0])
    return fd; /* the root itself */
  if ((why = wg_ckroot_path_problem(rel))) {
    close(fd);
    snprintf(err, err_len, "checkpoint path '%.200s' %s: refused", rel, why);
    return WAGMA_EPERM;
  }
  for (const char *c = rel; *c;) {
    size_t n = strcspn(c, "/");
    memcpy(comp, c, n);
    comp[n] = '\0';
    int next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0 && errno == ENOENT && create) {
      if (mkdirat(fd, comp, 0755) != 0 && errno != EEXIST) {
        int saved = errno;
        snprintf(err, err_len, "%s/%.*s: cannot create: %s", root->path, (int)(c - rel + n), rel,
                 strerror(saved));
        close(fd);
        return WAGMA_EIO;
      }
      next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (next < 0) {
      int saved = errno;
      why = open_problem(fd, comp, saved);
      snprintf(err, err_len, "%s/%.*s: %s", root->path, (int)(c - rel + n), rel, why);
      close(fd);
      return saved == ENOENT                      ? WAGMA_ENOTFOUND
             : saved == ELOOP || saved == ENOTDIR ? WAGMA_EPERM
                                                  : WAGMA_EIO;
    }
    close(fd);
    fd = next;
    c += n;
    if (*c == '/')
      c++;
  }
  return fd;
}

int wg_ckroot_save(const wg_ckroot_t *root, const char *rel_dir, const char *name, wagma_model_t *m,
                   wagma_optim_t *o, uint64_t iteration, char *err, size_t err_len) {
  char why[320];
  int dirfd = wg_ckroot_opendir(root, rel_dir, 1, err, err_len);
  if (dirfd < 0)
    return dirfd;
  int e = wagma_checkpoint_save_at(dirfd, name, m, o, iteration, why, sizeof why);
  close(dirfd);
  if (e)
    snprintf(err, err_len, "%s/%s: %s", root->path, rel_dir, why);
  return e;
}

int wg_ckroot_load(const wg_ckroot_t *root, const char *rel_file, wagma_model_t *m,
                   wagma_optim_t *o, uint64_t *iteration, char *err, size_t err_len) {
  char dir[PATH_MAX], why[320];
  const char *problem = wg_ckroot_path_problem(rel_file);
  if (problem) {
    snprintf(err, err_len, "checkpoint path '%.200s' %s: refused", rel_file ? rel_file : "",
             problem);
    return WAGMA_EPERM;
  }
  const char *slash = strrchr(rel_file, '/');
  const char *name = slash ? slash + 1 : rel_file;
  snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - rel_file) : 0, rel_file);
  int dirfd = wg_ckroot_opendir(root, dir, 0, err, err_len);
  if (dirfd < 0)
    return dirfd;
  int e = wagma_checkpoint_load_at(dirfd, name, m, o, iteration, why, sizeof why);
  close(dirfd);
  if (e)
    snprintf(err, err_len, "%s%s%s: %s", root->path, dir[0] ? "/" : "", dir, why);
  return e;
}
