/* api/keys.c — the etcd key layout of docs/design.md §9 under a configurable prefix
 * (default /wagma), plus the classifier used on watch events and the hex form of the
 * data-plane secrets stored under <prefix>/secrets/. Names that would break the
 * layout (slashes, empty, too long) are refused. Pure functions, thread-safe. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "wagma/api.h"

int wagma_keys_init(wagma_keys_t *keys, const char *prefix) {
  char p[WAGMA_API_PREFIX_MAX];
  if (!prefix || !*prefix)
    prefix = "/wagma";
  size_t n = strlen(prefix);
  if (n > 100 || prefix[0] != '/')
    return WAGMA_EINVAL;
  memcpy(p, prefix, n + 1);
  if (n > 1 && p[n - 1] == '/')
    p[--n] = '\0';
  if (n == 1 || strstr(p, "//"))
    return WAGMA_EINVAL; /* "/" alone would put jobs at "//jobs" */
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)p[i];
    if (c < 0x21 || c == 0x7f)
      return WAGMA_EINVAL;
  }
  memcpy(keys->prefix, p, n + 1);
  return 0;
}

static int fmt(char *buf, size_t len, const char *f, ...) __attribute__((format(printf, 3, 4)));
static int fmt(char *buf, size_t len, const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  int n = vsnprintf(buf, len, f, ap);
  va_end(ap);
  if (n < 0)
    return WAGMA_EINVAL;
  return (size_t)n < len ? 0 : WAGMA_ERANGE;
}

int wagma_key_root(const wagma_keys_t *k, char *buf, size_t len) {
  return fmt(buf, len, "%s/", k->prefix);
}
/* "<prefix>/<dir>/<name>" for a valid name. */
static int dir_key(const wagma_keys_t *k, const char *dir, const char *name, char *buf,
                   size_t len) {
  if (!wagma_api_name_valid(name))
    return WAGMA_EINVAL;
  return fmt(buf, len, "%s/%s/%s", k->prefix, dir, name);
}
int wagma_key_agents_prefix(const wagma_keys_t *k, char *buf, size_t len) {
  return fmt(buf, len, "%s/agents/", k->prefix);
}
int wagma_key_agent(const wagma_keys_t *k, const char *agent, char *buf, size_t len) {
  return dir_key(k, "agents", agent, buf, len);
}
int wagma_key_assignments_prefix(const wagma_keys_t *k, char *buf, size_t len) {
  return fmt(buf, len, "%s/assignments/", k->prefix);
}
int wagma_key_assignment(const wagma_keys_t *k, const char *agent, char *buf, size_t len) {
  return dir_key(k, "assignments", agent, buf, len);
}
int wagma_key_jobs_prefix(const wagma_keys_t *k, char *buf, size_t len) {
  return fmt(buf, len, "%s/jobs/", k->prefix);
}
static int job_key(const wagma_keys_t *k, const char *job, const char *leaf, char *buf,
                   size_t len) {
  if (!wagma_api_name_valid(job))
    return WAGMA_EINVAL;
  return fmt(buf, len, "%s/jobs/%s/%s", k->prefix, job, leaf);
}
int wagma_key_job_prefix(const wagma_keys_t *k, const char *job, char *buf, size_t len) {
  return job_key(k, job, "", buf, len);
}
int wagma_key_job_spec(const wagma_keys_t *k, const char *job, char *buf, size_t len) {
  return job_key(k, job, "spec", buf, len);
}
int wagma_key_job_status(const wagma_keys_t *k, const char *job, char *buf, size_t len) {
  return job_key(k, job, "status", buf, len);
}
int wagma_key_job_plan(const wagma_keys_t *k, const char *job, char *buf, size_t len) {
  return job_key(k, job, "plan", buf, len);
}
int wagma_key_job_plans_prefix(const wagma_keys_t *k, const char *job, char *buf, size_t len) {
  return job_key(k, job, "plans/", buf, len);
}
/* Zero-padded to 20 digits (UINT64_MAX has 20), so the keys of a job sort by epoch. */
int wagma_key_job_plan_record(const wagma_keys_t *k, const char *job, uint64_t epoch, char *buf,
                              size_t len) {
  if (!wagma_api_name_valid(job))
    return WAGMA_EINVAL;
  return fmt(buf, len, "%s/jobs/%s/plans/%020llu", k->prefix, job, (unsigned long long)epoch);
}
int wagma_key_job_checkpoint(const wagma_keys_t *k, const char *job, char *buf, size_t len) {
  return job_key(k, job, "checkpoint", buf, len);
}
int wagma_key_job_progress_prefix(const wagma_keys_t *k, const char *job, char *buf, size_t len) {
  return job_key(k, job, "progress/", buf, len);
}
int wagma_key_job_progress(const wagma_keys_t *k, const char *job, const char *agent, char *buf,
                           size_t len) {
  if (!wagma_api_name_valid(job) || !wagma_api_name_valid(agent))
    return WAGMA_EINVAL;
  return fmt(buf, len, "%s/jobs/%s/progress/%s", k->prefix, job, agent);
}
int wagma_key_leader(const wagma_keys_t *k, char *buf, size_t len) {
  return fmt(buf, len, "%s/coordinator/leader", k->prefix);
}
int wagma_key_quarantine(const wagma_keys_t *k, const char *agent, char *buf, size_t len) {
  return dir_key(k, "quarantine", agent, buf, len);
}
int wagma_key_quarantine_prefix(const wagma_keys_t *k, char *buf, size_t len) {
  return fmt(buf, len, "%s/quarantine/", k->prefix);
}

int wagma_key_secrets_prefix(const wagma_keys_t *k, char *buf, size_t len) {
  return fmt(buf, len, "%s/secrets/", k->prefix);
}
int wagma_key_job_secrets_prefix(const wagma_keys_t *k, const char *job, char *buf, size_t len) {
  if (!wagma_api_name_valid(job))
    return WAGMA_EINVAL;
  return fmt(buf, len, "%s/secrets/%s/", k->prefix, job);
}
int wagma_key_secret(const wagma_keys_t *k, const char *job, uint64_t epoch, char *buf,
                     size_t len) {
  if (!wagma_api_name_valid(job))
    return WAGMA_EINVAL;
  return fmt(buf, len, "%s/secrets/%s/%020llu", k->prefix, job, (unsigned long long)epoch);
}
int wagma_key_secret_epoch(const char *key, size_t len, uint64_t *epoch) {
  uint64_t v = 0;
  if (len < 21 || key[len - 21] != '/')
    return WAGMA_EINVAL;
  for (size_t i = len - 20; i < len; i++) {
    if (key[i] < '0' || key[i] > '9' || v > (UINT64_MAX - (uint64_t)(key[i] - '0')) / 10)
      return WAGMA_EINVAL;
    v = v * 10 + (uint64_t)(key[i] - '0');
  }
  *epoch = v;
  return 0;
}

int wagma_secret_to_hex(const uint8_t *secret, size_t n, char *hex, size_t hex_len) {
  static const char digits[] = "0123456789abcdef";
  if (!secret || !hex || n == 0)
    return WAGMA_EINVAL;
  if (hex_len < 2 * n + 1)
    return WAGMA_ERANGE;
  for (size_t i = 0; i < n; i++) {
    hex[2 * i] = digits[secret[i] >> 4];
    hex[2 * i + 1] = digits[secret[i] & 15];
  }
  hex[2 * n] = '\0';
  return 0;
}

static int hex_digit(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

int wagma_secret_from_hex(const char *hex, size_t hex_len, uint8_t *secret, size_t n) {
  if (!hex || !secret || n == 0 || hex_len != 2 * n)
    return WAGMA_EINVAL;
  for (size_t i = 0; i < n; i++) {
    int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return WAGMA_EINVAL;
    secret[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

/* Copies the segment [s, s+n) into out (WAGMA_API_NAME_MAX bytes) if it is a valid name. */
static int take_name(const char *s, size_t n, char *out) {
  char tmp[WAGMA_API_NAME_MAX];
  if (n == 0 || n >= sizeof tmp)
    return 0;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  if (!wagma_api_name_valid(tmp))
    return 0;
  if (out)
    memcpy(out, tmp, n + 1);
  return 1;
}

static int seg_eq(const char *s, size_t n, const char *lit) {
  return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

static int seg_epoch(const char *s, size_t n) {
  if (n != 20)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9')
      return 0;
  return 1;
}

wagma_key_kind_t wagma_key_parse(const wagma_keys_t *k, const char *key, size_t len, char *job,
                                 char *agent) {
  size_t pl = strlen(k->prefix);
  if (len <= pl + 1 || memcmp(key, k->prefix, pl) != 0 || key[pl] != '/')
    return WAGMA_KEY_UNKNOWN;
  const char *s = key + pl + 1, *end = key + len;
  const char *segs[5];
  size_t lens[5];
  int nseg = 0;
  while (s <= end && nseg < 5) {
    const char *slash = memchr(s, '/', (size_t)(end - s));
    const char *e = slash ? slash : end;
    segs[nseg] = s;
    lens[nseg] = (size_t)(e - s);
    nseg++;
    if (!slash)
      break;
    s = slash + 1;
    if (s == end) { /* trailing slash: an empty last segment */
      segs[nseg] = s;
      lens[nseg] = 0;
      nseg++;
      break;
    }
  }
  if (nseg == 2 && seg_eq(segs[0], lens[0], "agents"))
    return take_name(segs[1], lens[1], agent) ? WAGMA_KEY_AGENT : WAGMA_KEY_UNKNOWN;
  if (nseg == 2 && seg_eq(segs[0], lens[0], "assignments"))
    return take_name(segs[1], lens[1], agent) ? WAGMA_KEY_ASSIGNMENT : WAGMA_KEY_UNKNOWN;
  if (nseg == 2 && seg_eq(segs[0], lens[0], "quarantine"))
    return take_name(segs[1], lens[1], agent) ? WAGMA_KEY_QUARANTINE : WAGMA_KEY_UNKNOWN;
  if (nseg == 2 && seg_eq(segs[0], lens[0], "coordinator") && seg_eq(segs[1], lens[1], "leader"))
    return WAGMA_KEY_LEADER;
  if (nseg == 3 && seg_eq(segs[0], lens[0], "secrets"))
    return seg_epoch(segs[2], lens[2]) && take_name(segs[1], lens[1], job) ? WAGMA_KEY_SECRET
                                                                           : WAGMA_KEY_UNKNOWN;
  if (nseg >= 3 && seg_eq(segs[0], lens[0], "jobs")) {
    if (!take_name(segs[1], lens[1], job))
      return WAGMA_KEY_UNKNOWN;
    if (nseg == 3) {
      if (seg_eq(segs[2], lens[2], "spec"))
        return WAGMA_KEY_JOB_SPEC;
      if (seg_eq(segs[2], lens[2], "status"))
        return WAGMA_KEY_JOB_STATUS;
      if (seg_eq(segs[2], lens[2], "plan"))
        return WAGMA_KEY_JOB_PLAN;
      if (seg_eq(segs[2], lens[2], "checkpoint"))
        return WAGMA_KEY_JOB_CHECKPOINT;
    }
    if (nseg == 4 && seg_eq(segs[2], lens[2], "progress"))
      return take_name(segs[3], lens[3], agent) ? WAGMA_KEY_JOB_PROGRESS : WAGMA_KEY_UNKNOWN;
    if (nseg == 4 && seg_eq(segs[2], lens[2], "plans"))
      return seg_epoch(segs[3], lens[3]) ? WAGMA_KEY_JOB_PLAN_RECORD : WAGMA_KEY_UNKNOWN;
  }
  return WAGMA_KEY_UNKNOWN;
}
