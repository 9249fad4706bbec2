/* coordinator/pages.c — the pages of GET /v1/jobs: which job ids come after a position, in
 * etcd key order, with a bounded number of etcd round trips, and the opaque continue token
 * that carries the position.
 *
 * The order is the order of the job keys: id y before id z when "y/" sorts before "z/"
 * bytewise (so "a-b" and "a.b" come before "a", which comes before "a0"). A page holds the
 * ids after the previous page's last one: every job that exists from the first page to the
 * last is listed exactly once, whatever is created or removed meanwhile (those appear at most
 * once: when their key lies after the position).
 *
 * The etcd client reads prefixes only (no range from a key), so "the ids after x" is found
 * from prefixes of "x/": level j covers the ids that share x's first j characters. Going up
 * from the deepest level, a level is read with one keys-only Range of its prefix (limit
 * WG_LIST_PROBE_KEYS); when the prefix holds more keys than that and none of those read lies
 * after x, the level's children after x's character are asked instead: one Txn says which of
 * them hold keys, and each one that does is read in order. Deep prefixes are small, so a
 * page costs a few round trips plus one per WG_LIST_PROBE_KEYS keys of the ids it returns.
 * The position is (the last id returned, the level to go on at); the token is that position,
 * base64url-encoded, so a walk cut short by the round-trip budget resumes where it stopped.
 *
 * Pure (all etcd access goes through wg_walk_io_t), no state; thread-safe. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pages.h"

/* The bytes that follow a prefix inside the jobs prefix: the characters of names and the '/'
 * that ends one, in increasing byte order. */
static const char key_chars[] =
    "-./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz";

/* Compares a + "/" with b + "/" bytewise, without building them. */
int wg_job_key_cmp(const char *a, const char *b) {
  size_t i = 0;
  while (a[i] && a[i] == b[i])
    i++;
  unsigned ca = a[i] ? (unsigned char)a[i] : '/', cb = b[i] ? (unsigned char)b[i] : '/';
  if (ca != cb)
    return ca < cb ? -1 : 1;
  if (!a[i] && !b[i])
    return 0;
  /* One ended where the other has a '/': not a name; the shorter sorts first. */
  return a[i] ? 1 : -1;
}

typedef struct walk {
  const wg_walk_io_t *io;
  wg_walk_pos_t *pos;
  size_t want, probe_keys;
  int budget;
  char (*ids)[WAGMA_API_NAME_MAX];
  size_t n;
} walk_t;

/* Appends id when it lies after the position; 1 when the page is full. */
static int emit(walk_t *w, const char *id) {
  if (w->pos->level != WG_WALK_START && wg_job_key_cmp(id, w->pos->last) <= 0)
    return w->n == w->want;
  snprintf(w->ids[w->n++], WAGMA_API_NAME_MAX, "%s", id);
  snprintf(w->pos->last, sizeof w->pos->last, "%s", id);
  w->pos->level = (int)strlen(id);
  return w->n == w->want;
}

/* The id of a relative key "id/..." into id; 0 when the key is not one of a job. */
static int key_id(const char *key, char *id) {
  const char *slash = strchr(key, '/');
  size_t n = slash ? (size_t)(slash - key) : 0;
  if (n == 0 || n >= WAGMA_API_NAME_MAX)
    return 0;
  memcpy(id, key, n);
  id[n] = '\0';
  return wagma_api_name_valid(id);
}

/* Emits the ids of a key list in order. *emitted = how many; 1 when the page is full. */
static int emit_keys(walk_t *w, const wg_keylist_t *kl, int *emitted) {
  char prev[WAGMA_API_NAME_MAX] = "", id[WAGMA_API_NAME_MAX];
  *emitted = 0;
  for (size_t i = 0; i < kl->n; i++) {
    if (!key_id(kl->keys[i], id) || strcmp(id, prev) == 0)
      continue;
    snprintf(prev, sizeof prev, "%s", id);
    size_t before = w->n;
    int full = emit(w, id);
    *emitted += w->n > before;
    if (full)
      return 1;
  }
  return 0;
}

/* One keys-only read, budgeted. */
static int read_keys(walk_t *w, const char *prefix, wg_keylist_t *kl) {
  memset(kl, 0, sizeof *kl);
  w->budget--;
  return w->io->keys(w->io->user, prefix, w->probe_keys, kl);
}

enum { STEP_GO_ON = 0, STEP_STOP = 1 };

/* The children of level j of the position whose character comes after the position's:
 * which exist (one Txn), then each in order. */
static int children(walk_t *w, const char *s, int j, int *e) {
  const char *cands[sizeof key_chars];
  char bufs[sizeof key_chars][WAGMA_API_NAME_MAX + 2];
  int ex[sizeof key_chars];
  size_t nc = 0;
  for (const char *c = key_chars; *c; c++) {
    if ((unsigned char)*c <= (unsigned char)s[j] || (*c == '/' && j == 0))
      continue;
    snprintf(bufs[nc], sizeof bufs[nc], "%.*s%c", j, s, *c);
    cands[nc] = bufs[nc];
    nc++;
  }
  if (nc == 0)
    return STEP_GO_ON;
  if (w->budget <= 0)
    return STEP_STOP;
  w->budget--;
  if ((*e = w->io->exists(w->io->user, cands, nc, ex)))
    return STEP_STOP;
  for (size_t i = 0; i < nc; i++) {
    if (!ex[i])
      continue;
    size_t len = strlen(cands[i]);
    if (cands[i][len - 1] == '/') { /* the job whose id is this level's prefix */
      char id[WAGMA_API_NAME_MAX];
      snprintf(id, sizeof id, "%.*s", (int)(len - 1), cands[i]);
      if (wagma_api_name_valid(id) && emit(w, id))
        return STEP_STOP;
      w->pos->level = j;
      continue;
    }
    if (w->budget <= 0)
      return STEP_STOP;
    wg_keylist_t kl;
    if ((*e = read_keys(w, cands[i], &kl)))
      return STEP_STOP;
    int emitted = 0, full = emit_keys(w, &kl, &emitted), more = kl.more;
    w->io->free_keys(w->io->user, &kl);
    if (full)
      return STEP_STOP;
    if (more && emitted)
      return STEP_GO_ON; /* the rest of this child lies after the new position: go on there */
    if (emitted)
      w->pos->level = j; /* the child is covered: its siblings next */
  }
  w->pos->level = j - 1;
  return STEP_GO_ON;
}

int wg_jobs_walk(const wg_walk_io_t *io, wg_walk_pos_t *pos, size_t want, int *round_trips,
                 size_t probe_keys, char (*ids)[WAGMA_API_NAME_MAX], size_t *n, int *done) {
  walk_t w = {.io = io,
              .pos = pos,
              .want = want,
              .probe_keys = probe_keys,
              .budget = *round_trips,
              .ids = ids};
  int e = 0;
  *done = 0;
  *n = 0;
  while (w.n < w.want && w.budget > 0 && !*done) {
    wg_keylist_t kl;
    int emitted = 0;
    if (pos->level == WG_WALK_START) { /* no position yet: the first keys of all */
      if ((e = read_keys(&w, "", &kl)))
        break;
      int full = emit_keys(&w, &kl, &emitted), more = kl.more;
      io->free_keys(io->user, &kl);
      if (!full && (!more || !emitted))
        *done = 1; /* all read (or nothing usable to go on from) */
      continue;
    }
    if (pos->level < 0) {
      *done = 1;
      break;
    }
    char s[WAGMA_API_NAME_MAX + 1];
    snprintf(s, sizeof s, "%s/", pos->last);
    int j = pos->level;
    if (j > (int)strlen(pos->last))
      j = pos->level = (int)strlen(pos->last);
    char prefix[WAGMA_API_NAME_MAX + 1];
    snprintf(prefix, sizeof prefix, "%.*s", j, s);
    if ((e = read_keys(&w, prefix, &kl)))
      break;
    int full = emit_keys(&w, &kl, &emitted), more = kl.more;
    io->free_keys(io->user, &kl);
    if (full)
      break;
    if (!more) { /* the whole level was read: everything in it is behind the position */
      pos->level = j - 1;
      continue;
    }
    if (emitted)
      continue; /* went on to later ids of this level: go on from the new position */
    /* The level holds more keys than one read, all of them at or before the position: ask
     * its children after the position's character. */
    if (children(&w, s, j, &e) == STEP_STOP || e)
      break;
  }
  if (pos->level == -1)
    *done = 1; /* level 0 covered: nothing lies after the position */
  *n = w.n;
  *round_trips = w.budget < 0 ? 0 : w.budget;
  return e;
}

/* ---- the continue token ------------------------------------------------------------------ */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

int wg_list_token_encode(const wg_walk_pos_t *pos, char *out, size_t len) {
  char raw[WAGMA_API_NAME_MAX + 16];
  int rn = snprintf(raw, sizeof raw, "1:%d:%s", pos->level, pos->last);
  size_t need = ((size_t)rn * 4 + 2) / 3 + 1, o = 0;
  if (rn <= 0 || pos->level < 0 || need > len)
    return -1;
  for (int i = 0; i < rn; i += 3) {
    uint32_t v = (uint32_t)(uint8_t)raw[i] << 16;
    if (i + 1 < rn)
      v |= (uint32_t)(uint8_t)raw[i + 1] << 8;
    if (i + 2 < rn)
      v |= (uint8_t)raw[i + 2];
    out[o++] = b64[(v >> 18) & 63];
    out[o++] = b64[(v >> 12) & 63];
    if (i + 1 < rn)
      out[o++] = b64[(v >> 6) & 63];
    if (i + 2 < rn)
      out[o++] = b64[v & 63];
  }
  out[o] = '\0';
  return 0;
}

int wg_list_token_decode(const char *token, wg_walk_pos_t *pos) {
  char raw[WAGMA_API_NAME_MAX + 16];
  size_t tn = token ? strlen(token) : 0, rn = 0;
  uint32_t acc = 0;
  int bits = 0;
  if (tn == 0 || tn > ((sizeof raw - 1) * 4) / 3 || tn % 4 == 1)
    return -1;
  for (size_t i = 0; i < tn; i++) {
    const char *p = strchr(b64, token[i]);
    if (!p || !token[i])
      return -1;
    acc = acc << 6 | (uint32_t)(p - b64);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      raw[rn++] = (char)((acc >> bits) & 0xff);
    }
  }
  if (acc & ((1u << bits) - 1)) /* non-canonical: leftover bits must be zero */
    return -1;
  raw[rn] = '\0';
  if (memchr(raw, '\0', rn))
    return -1;
  int level = 0, off = 0;
  if (sscanf(raw, "1:%d:%n", &level, &off) != 1 || off == 0)
    return -1;
  const char *id = raw + off;
  if (!wagma_api_name_valid(id) || level < 0 || level > (int)strlen(id))
    return -1;
  char check[16];
  int cn = snprintf(check, sizeof check, "1:%d:", level);
  if (cn != off || memcmp(check, raw, (size_t)cn) != 0) /* one spelling per position */
    return -1;
  snprintf(pos->last, sizeof pos->last, "%s", id);
  pos->level = level;
  return 0;
}
