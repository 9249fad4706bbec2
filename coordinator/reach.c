/* coordinator/reach.c — the partition rule (reach.h, docs/design.md §7.3): from the members'
 * reports of peers they cannot reach, the links that are cut, and the members left out: those
 * cut off from more than half of the others. Pure; no threads. Cost: O(E log E) for the E
 * reported links (at most n x WAGMA_API_UNREACHABLE_MAX), plus O(n). */
#include "reach.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  int a, b;
} pair_t;

static int cmp_pair(const void *x, const void *y) {
  const pair_t *p = x, *q = y;
  return p->a != q->a ? (p->a > q->a) - (p->a < q->a) : (p->b > q->b) - (p->b < q->b);
}

/* Sorts and removes duplicates; returns the new count. */
static size_t uniq(pair_t *v, size_t n) {
  size_t k = 0;
  qsort(v, n, sizeof *v, cmp_pair);
  for (size_t i = 0; i < n; i++)
    if (k == 0 || cmp_pair(&v[k - 1], &v[i]) != 0)
      v[k++] = v[i];
  return k;
}

int wg_reach_decide(const wg_reach_member_t *m, int n, double grace_s, int *out) {
  size_t cap = 0, nl = 0;
  int present = 0;
  for (int r = 0; r < n; r++) {
    out[r] = 0;
    present += m[r].present != 0;
    if (m[r].present && m[r].nunreachable > 0)
      cap += (size_t)m[r].nunreachable;
  }
  if (cap == 0)
    return 0;
  pair_t *links = malloc(2 * cap * sizeof *links);
  int *deg = calloc((size_t)n, sizeof *deg);
  int rc = 0;
  if (!links || !deg) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  /* Reports that count (present reporter, present peer in range, long enough), each cut link
   * both ways once (a link reported by both sides counts once). */
  for (int r = 0; r < n; r++) {
    for (int i = 0; m[r].present && i < m[r].nunreachable; i++) {
      int p = m[r].unreachable[i].rank;
      if (p >= 0 && p < n && p != r && m[p].present && m[r].unreachable[i].seconds >= grace_s) {
        links[nl++] = (pair_t){r, p};
        links[nl++] = (pair_t){p, r};
      }
    }
  }
  nl = uniq(links, nl);
  for (size_t i = 0; i < nl; i++)
    deg[links[i].a]++;
  int left = 0;
  for (int r = 0; r < n; r++) {
    out[r] = 2 * deg[r] > present - 1;
    left += out[r];
  }
  if (left > 0 && 2 * left >= present) {
    memset(out, 0, (size_t)n * sizeof *out);
    rc = WG_REACH_NO_MAJORITY;
  } else {
    rc = left;
  }
out:
  free(links);
  free(deg);
  return rc;
}
