/* coordinator/reach.c — the partition rule (reach.h, docs/design.md §7.3): from the members'
 * reports of peers they cannot reach, the links that are cut, and the members left out so
 * that no cut link remains among those kept. Pure; no threads. Cost: O(E log E) for the E
 * reported links (at most n x WAGMA_API_UNREACHABLE_MAX), plus O(n) per member left out. */
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

/* 1 when member x should go before member y (both still in, with degrees deg). */
static int worse(const wg_reach_member_t *m, const int *deg, const int *named, int x, int y) {
  if (deg[x] != deg[y])
    return deg[x] > deg[y];
  if (named[x] != named[y])
    return named[x] > named[y];
  if (m[x].iteration != m[y].iteration)
    return m[x].iteration < m[y].iteration;
  return x > y;
}

int wg_reach_decide(const wg_reach_member_t *m, int n, double grace_s, int *out) {
  size_t cap = 0, nr = 0;
  for (int r = 0; r < n; r++) {
    out[r] = 0;
    if (m[r].present && m[r].nunreachable > 0)
      cap += (size_t)m[r].nunreachable;
  }
  if (cap == 0)
    return 0;
  pair_t *reports = malloc(cap * sizeof *reports), *links = malloc(2 * cap * sizeof *links);
  int *deg = calloc((size_t)n, sizeof *deg), *named = calloc((size_t)n, sizeof *named);
  int *start = calloc((size_t)n + 1, sizeof *start);
  int rc = 0;
  if (!reports || !links || !deg || !named || !start) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  /* Reports that count: present reporter, present peer in range, long enough. */
  for (int r = 0; r < n; r++) {
    for (int i = 0; m[r].present && i < m[r].nunreachable; i++) {
      int p = m[r].unreachable[i].rank;
      if (p >= 0 && p < n && p != r && m[p].present && m[r].unreachable[i].seconds >= grace_s)
        reports[nr++] = (pair_t){r, p};
    }
  }
  nr = uniq(reports, nr);
  if (nr == 0)
    goto out;
  /* Each cut link both ways (a link reported by both sides once), as adjacency lists. */
  size_t nl = 0;
  for (size_t i = 0; i < nr; i++) {
    named[reports[i].b]++;
    links[nl++] = reports[i];
    links[nl++] = (pair_t){reports[i].b, reports[i].a};
  }
  nl = uniq(links, nl);
  for (size_t i = 0; i < nl; i++) {
    deg[links[i].a]++;
    start[links[i].a + 1]++;
  }
  for (int r = 0; r < n; r++)
    start[r + 1] += start[r];
  /* Greedy: the worst member with a cut link goes, until none is left among those in. */
  int left = 0;
  for (;;) {
    int worst = -1;
    for (int r = 0; r < n; r++)
      if (!out[r] && deg[r] > 0 && (worst < 0 || worse(m, deg, named, r, worst)))
        worst = r;
    if (worst < 0)
      break;
    out[worst] = 1;
    left++;
    for (int k = start[worst]; k < start[worst + 1]; k++) {
      int p = links[k].b;
      if (!out[p]) {
        deg[p]--;
        /* it no longer names p (for the tie-break): count only reports among those in */
        named[p] -= bsearch(&(pair_t){worst, p}, reports, nr, sizeof *reports, cmp_pair) != NULL;
      }
    }
    deg[worst] = 0;
  }
  if (2 * left >= n) {
    memset(out, 0, (size_t)n * sizeof *out);
    rc = WG_REACH_NO_MAJORITY;
  } else {
    rc = left;
  }
out:
  free(reports);
  free(links);
  free(deg);
  free(named);
  free(start);
  return rc;
}
