/* collective/plan.c — plans and groups: the group rule, plan lifetime, validation, lookups.
 *
 * Design note. Pure functions, no threads, no globals; a plan owns its arrays.
 *
 * The group rule (wagma_plan_build) works on positions 0..P-1 (position i holds rank
 * rank_order[i]) and builds a hierarchy of contiguous blocks of positions ("units"). Level 0:
 * every position is a unit. Phase j merges the units of level j into the units of level j+1;
 * the last phase leaves one unit (everything). Inside each unit W of level j+1, phase j lists
 * W's positions column by column (offset 0 of every sub-unit, then offset 1, ..., skipping
 * exhausted sub-units) and cuts that list into g balanced chunks, g = the smallest sub-unit
 * size clamped to [ceil(|W|/(2S-1)), floor(|W|/S)] (1 when |W| < S). The chunks are the
 * groups of phase j. The levels:
 *  - top-down chain (the normal case, P >= 2S): u_1 phase-0 groups with u_1 in
 *    [ceil(P/(2S-1)), floor(P/S)] and u_1 = r_1 * ... * r_{L-1}, radices in [2, 2S-1]; level j
 *    has u_j = r_j * ... * r_{L-1} units, unit i = positions [floor(i P/u_j), floor((i+1) P/u_j))
 *    (sizes differ by at most 1, levels nest). P = S^k takes u_1 = S^(k-1) and radices S.
 *    Otherwise choose_chain prefers an exact chain (u_1 divides P, radices >= S), then the
 *    fewest radices, then radices closest to S.
 *  - bottom-up runs (P < 2S: one phase; also the fallback if no u_1 in the interval is
 *    (2S-1)-smooth, never seen for P <= 12000, S <= 12): level j+1 = max(1, floor(u_j / S))
 *    balanced runs of consecutive units of level j.
 * Properties (tested in tests/unit/plan):
 *  - P = S^k: the units of level j are the blocks of S^j positions, each unit of level j+1 has
 *    S equal sub-units and g = S^j chunks of exactly S, one per offset: the butterfly.
 *  - band: every W has |W| >= S when P >= S, and S*g <= |W| <= (2S-1)*g, so every group has
 *    S..2S-1 members; P < S gives one group of P.
 *  - connectivity: phase 0 makes each level-1 unit one group (S..2S-1 positions). For j >= 1 a
 *    unit W has m <= 2S-1 sub-units of size >= 2: its first chunk covers offset 0 of sub-units
 *    0..c0-1 and its second (c0 + c1 >= 2S > m) the rest of offset 0 and offset 1 of
 *    sub-unit 0, so phases 0..j connect every unit of level j+1. A window of L consecutive
 *    phases is all L phases.
 *  - L <= the bottom-up count floor(log_S(P/2)) + 1 <= ceil(log_S P).
 *  - exact mean after L fresh rounds for exact chains (P = S^k, and e.g. 12 = 3 x 4 for S = 3):
 *    every group takes one member per sub-unit; otherwise close (tests print the worst).
 * Groups list their ranks in increasing order; the groups of a phase are ordered by their
 * smallest rank. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "wagma/collective.h"
#include "wagma/log_internal.h"

#define PLAN_DEFAULT_STALENESS 8
#define PLAN_MAX_PHASES 64 /* P < 2^31 and S >= 2 give at most 31 */

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* ---------------------------------------------------------------------------------------- */
/* Lifetime                                                                                 */

void wagma_plan_free(wagma_plan_t *plan) {
  if (!plan)
    return;
  if (plan->phases) {
    for (int j = 0; j < plan->nphases; j++) {
      free(plan->phases[j].offsets);
      free(plan->phases[j].ranks);
      free(plan->phases[j].group_of);
    }
  }
  free(plan->phases);
  free(plan->members);
  memset(plan, 0, sizeof(*plan));
}

/* Ownership: *dst is overwritten (not freed) and owns new arrays on success; on error it is
 * zeroed. src is only read; dst == src is refused (WAGMA_EINVAL, nothing touched). */
int wagma_plan_copy(wagma_plan_t *dst, const wagma_plan_t *src) {
  wagma_plan_t out;
  int rc = 0;
  if (dst && dst == src)
    return WAGMA_EINVAL;
  memset(&out, 0, sizeof(out));
  if (!dst || !src || src->nranks < 0 || src->nphases < 0 || (src->nranks > 0 && !src->members) ||
      (src->nphases > 0 && !src->phases)) {
    rc = WAGMA_EINVAL;
    goto out;
  }
  out = *src;
  out.members = NULL;
  out.phases = NULL;
  out.nphases = 0;
  size_t n = (size_t)src->nranks;
  if (n > 0) {
    out.members = malloc(n * sizeof(*out.members));
    if (!out.members) {
      rc = WAGMA_ENOMEM;
      goto out;
    }
    memcpy(out.members, src->members, n * sizeof(*out.members));
  }
  if (src->nphases > 0) {
    out.phases = calloc((size_t)src->nphases, sizeof(*out.phases));
    if (!out.phases) {
      rc = WAGMA_ENOMEM;
      goto out;
    }
  }
  for (int j = 0; j < src->nphases; j++) {
    const wagma_phase_t *sp = &src->phases[j];
    wagma_phase_t *dp = &out.phases[j];
    out.nphases = j + 1;
    if (sp->ngroups < 0 || !sp->offsets || (n > 0 && (!sp->ranks || !sp->group_of))) {
      rc = WAGMA_EINVAL;
      goto out;
    }
    dp->ngroups = sp->ngroups;
    dp->offsets = malloc(((size_t)sp->ngroups + 1) * sizeof(int));
    dp->ranks = malloc((n ? n : 1) * sizeof(int));
    dp->group_of = malloc((n ? n : 1) * sizeof(int));
    if (!dp->offsets || !dp->ranks || !dp->group_of) {
      rc = WAGMA_ENOMEM;
      goto out;
    }
    memcpy(dp->offsets, sp->offsets, ((size_t)sp->ngroups + 1) * sizeof(int));
    if (n > 0) {
      memcpy(dp->ranks, sp->ranks, n * sizeof(int));
      memcpy(dp->group_of, sp->group_of, n * sizeof(int));
    }
  }
out:
  if (rc != 0) {
    wagma_plan_free(&out);
    if (dst)
      memset(dst, 0, sizeof(*dst));
    return rc;
  }
  *dst = out;
  return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The group rule                                                                           */

/* Scratch for one wagma_plan_build call; every array has P (+1) entries. */
struct builder {
  int nranks, group_size;
  const int *rank_order; /* NULL = identity */
  int nradix;            /* top-down chain: radix[1..nradix]; 0 = bottom-up runs */
  int radix[PLAN_MAX_PHASES + 1];
  int *units; /* boundaries of the current level's units: units[0..nunits] */
  int nunits;
  int *next_units;  /* boundaries of the next level's units */
  int *order;       /* positions of a run, column by column */
  int *group_start; /* start of each group of the phase being built in group_ranks */
  int *group_ranks; /* the ranks of the phase, group after group */
  int *group_index; /* groups sorted by smallest rank */
};

static void sort_small(int *v, int n) {
  if (n > 16) {
    qsort(v, (size_t)n, sizeof(int), cmp_int);
    return;
  }
  for (int i = 1; i < n; i++) {
    int x = v[i], k = i;
    for (; k > 0 && v[k - 1] > x; k--)
      v[k] = v[k - 1];
    v[k] = x;
  }
}

/* Fewest radices in [2, 2S-1] whose product is u (prime factors packed first-fit decreasing
 * into bins of product <= 2S-1), written to radix[0..]; -1 when u has a prime factor > 2S-1. */
static int factor_radices(long long u, int S, int *radix, int max) {
  int primes[64], np = 0, n = 0;
  long long rest = u;
  for (long long d = 2; d * d <= rest && d <= 2LL * S - 1; d++)
    while (rest % d == 0 && np < 64) {
      primes[np++] = (int)d;
      rest /= d;
    }
  if (rest > 1) {
    if (rest > 2LL * S - 1 || np >= 64)
      return -1;
    primes[np++] = (int)rest;
  }
  for (int i = np - 1; i >= 0; i--) { /* primes[] is increasing: take them largest first */
    int k = 0;
    while (k < n && (long long)radix[k] * primes[i] > 2LL * S - 1)
      k++;
    if (k == n) {
      if (n == max)
        return -1;
      radix[n++] = 1;
    }
    radix[k] *= primes[i];
  }
  return n;
}

/* The phase count of the bottom-up runs: u -> max(1, floor(u/S)) until 1. */
static int bottom_up_phases(int P, int S) {
  int n = 0;
  for (long long u = P;;) {
    u = u / S > 1 ? u / S : 1;
    n++;
    if (u == 1)
      return n;
  }
}

/* The top-down chain: u_1 (the number of phase-0 groups) in [ceil(P/(2S-1)), floor(P/S)] and
 * its radices r_1..r_{L-1} in [2, 2S-1]. P = S^k takes u_1 = S^(k-1), radices S (the
 * butterfly). Otherwise the best u_1 by: exact first (S <= every radix and u_1 divides P: all
 * units of a level are equal, every group takes one member per unit, L rounds give the exact
 * mean), then fewest radices, then u_1 dividing P, then radices closest to S. Leaves
 * b->nradix = 0 (bottom-up runs) for P < 2S, when no u_1 factors into radices <= 2S-1, or
 * when the chain would be longer than the bottom-up rule. */
static void choose_chain(struct builder *b) {
  const int P = b->nranks, S = b->group_size;
  long long lo = (P + 2LL * S - 2) / (2LL * S - 1), hi = P / S;
  int best_exact = 0, best_n = INT_MAX, best_rem = 1;
  long long best_dist = LLONG_MAX;
  int tmp[PLAN_MAX_PHASES];
  b->nradix = 0;
  if (P < 2 * S)
    return; /* one phase */
  long long power = S;
  int k = 1;
  while (power < P) {
    power *= S;
    k++;
  }
  if (power == P) {
    b->nradix = k - 1;
    for (int i = 1; i < k; i++)
      b->radix[i] = S;
    return;
  }
  for (long long u = hi; u >= lo; u--) {
    int n = factor_radices(u, S, tmp, PLAN_MAX_PHASES - 1);
    if (n < 0)
      continue;
    int rem = P % u != 0, exact = !rem;
    long long dist = 0;
    for (int i = 0; i < n; i++) {
      dist += tmp[i] > S ? tmp[i] - S : S - tmp[i];
      exact = exact && tmp[i] >= S;
    }
    int better = exact != best_exact ? exact > best_exact
                 : n != best_n       ? n < best_n
                 : rem != best_rem   ? rem < best_rem
                                     : dist < best_dist;
    if (better) {
      best_exact = exact;
      best_n = n;
      best_rem = rem;
      best_dist = dist;
      b->nradix = n;
      for (int i = 0; i < n; i++)
        b->radix[i + 1] = tmp[i];
    }
  }
  if (b->nradix + 1 > bottom_up_phases(P, S))
    b->nradix = 0;
}

/* Boundaries of the units after phase j into b->next_units; returns their count. */
static int next_level(struct builder *b, int j) {
  const int P = b->nranks, S = b->group_size, u = b->nunits;
  if (b->nradix > 0) { /* level j+1 of the chain: floor(i * P / u_{j+1}) */
    long long next = 1;
    for (int i = j + 1; i <= b->nradix; i++)
      next *= b->radix[i];
    for (long long i = 0; i <= next; i++)
      b->next_units[i] = (int)(i * P / next);
    return (int)next;
  }
  int nruns = u / S > 1 ? u / S : 1; /* bottom-up: balanced runs of S..2S-1 units */
  for (int r = 0; r <= nruns; r++)
    b->next_units[r] = b->units[(int)((long long)r * u / nruns)];
  return nruns;
}

/* Builds phase j from the current level of b into *phase and moves b to the next level.
 * Ownership: phase's arrays are allocated here and owned by the caller's plan. */
static int build_phase(struct builder *b, int j, wagma_phase_t *phase) {
  const int P = b->nranks, S = b->group_size;
  const int nruns = next_level(b, j);
  int ngroups = 0, filled = 0, a = 0;

  for (int r = 0; r < nruns; r++) {
    int first = b->next_units[r], size = b->next_units[r + 1] - first;
    int e = a, smin = INT_MAX, smax = 0;
    while (b->units[e] < b->next_units[r + 1]) { /* the units of this run: a..e-1 */
      int s = b->units[e + 1] - b->units[e];
      smin = s < smin ? s : smin;
      smax = s > smax ? s : smax;
      e++;
    }
    /* column by column */
    int n = 0;
    for (int o = 0; o < smax; o++)
      for (int i = a; i < e; i++)
        if (b->units[i] + o < b->units[i + 1])
          b->order[n++] = b->units[i] + o;
    int lo = (size + 2 * S - 2) / (2 * S - 1), hi = size / S;
    if (lo < 1)
      lo = 1;
    if (hi < lo)
      hi = lo; /* only when size < S: one group */
    int g = smin < lo ? lo : smin > hi ? hi : smin;
    for (int k = 0; k < g; k++) {
      int cs = (int)((long long)k * size / g), ce = (int)((long long)(k + 1) * size / g);
      b->group_start[ngroups++] = filled;
      for (int x = cs; x < ce; x++) {
        int pos = b->order[x];
        b->group_ranks[filled++] = b->rank_order ? b->rank_order[pos] : pos;
      }
      sort_small(b->group_ranks + filled - (ce - cs), ce - cs);
    }
    (void)first;
    a = e;
  }
  b->group_start[ngroups] = filled;

  /* order the groups by their smallest rank: sort the first ranks (distinct), then map each
   * back to its group through group_of, used as rank -> unsorted group index meanwhile */
  for (int k = 0; k < ngroups; k++)
    b->order[k] = b->group_ranks[b->group_start[k]]; /* order is free again */
  int rc = 0;
  phase->ngroups = ngroups;
  phase->offsets = malloc(((size_t)ngroups + 1) * sizeof(int));
  phase->ranks = malloc((size_t)P * sizeof(int));
  phase->group_of = malloc((size_t)P * sizeof(int));
  if (!phase->offsets || !phase->ranks || !phase->group_of) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  for (int k = 0; k < ngroups; k++)
    phase->group_of[b->group_ranks[b->group_start[k]]] = k;
  memcpy(phase->ranks, b->order, (size_t)ngroups * sizeof(int));
  qsort(phase->ranks, (size_t)ngroups, sizeof(int), cmp_int);
  for (int k = 0; k < ngroups; k++)
    b->group_index[k] = phase->group_of[phase->ranks[k]];
  int at = 0;
  for (int k = 0; k < ngroups; k++) {
    int src = b->group_index[k];
    int len = b->group_start[src + 1] - b->group_start[src];
    phase->offsets[k] = at;
    memcpy(phase->ranks + at, b->group_ranks + b->group_start[src], (size_t)len * sizeof(int));
    at += len;
  }
  phase->offsets[ngroups] = at;
  for (int k = 0; k < ngroups; k++)
    for (int x = phase->offsets[k]; x < phase->offsets[k + 1]; x++)
      phase->group_of[phase->ranks[x]] = k;

  int *swap = b->units;
  b->units = b->next_units;
  b->next_units = swap;
  b->nunits = nruns;
out:
  return rc;
}

/* Ownership: *plan is overwritten (not freed); on success it owns its arrays, on error it is
 * zeroed. rank_order is only read. */
int wagma_plan_build(int nranks, int group_size, const int *rank_order, wagma_plan_t *plan) {
  struct builder b;
  int rc = 0;
  memset(&b, 0, sizeof(b));
  if (!plan)
    return WAGMA_EINVAL;
  memset(plan, 0, sizeof(*plan));
  if (nranks < 1 || group_size < 2 || group_size > INT_MAX / 2) {
    rc = WAGMA_EINVAL;
    goto out;
  }
  size_t n = (size_t)nranks;
  b.nranks = nranks;
  b.group_size = group_size;
  b.rank_order = rank_order;
  b.units = malloc((n + 1) * sizeof(int));
  b.next_units = malloc((n + 1) * sizeof(int));
  b.order = malloc(n * sizeof(int));
  b.group_start = malloc((n + 1) * sizeof(int));
  b.group_ranks = malloc(n * sizeof(int));
  b.group_index = malloc(n * sizeof(int));
  plan->members = calloc(n, sizeof(*plan->members));
  if (!b.units || !b.next_units || !b.order || !b.group_start || !b.group_ranks || !b.group_index ||
      !plan->members) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  if (rank_order) { /* a permutation of 0..P-1? */
    memset(b.order, 0, n * sizeof(int));
    for (int i = 0; i < nranks; i++) {
      int r = rank_order[i];
      if (r < 0 || r >= nranks || b.order[r]) {
        rc = WAGMA_EINVAL;
        goto out;
      }
      b.order[r] = 1;
    }
  }

  choose_chain(&b);
  int nphases = 0;
  if (b.nradix > 0) {
    nphases = b.nradix + 1;
  } else {
    nphases = bottom_up_phases(nranks, group_size);
  }
  if (nphases > PLAN_MAX_PHASES) {
    rc = WAGMA_EINTERNAL;
    goto out;
  }
  plan->phases = calloc((size_t)nphases, sizeof(*plan->phases));
  if (!plan->phases) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  plan->nranks = nranks;
  plan->group_size = group_size;
  plan->staleness_bound = PLAN_DEFAULT_STALENESS;
  plan->global_sync = WAGMA_GLOBAL_BARRIER;

  for (int i = 0; i <= nranks; i++)
    b.units[i] = i;
  b.nunits = nranks;
  for (int j = 0; j < nphases; j++) {
    plan->nphases = j + 1;
    rc = build_phase(&b, j, &plan->phases[j]);
    if (rc != 0)
      goto out;
  }
  if (b.nunits != 1)
    rc = WAGMA_EINTERNAL;
out:
  free(b.units);
  free(b.next_units);
  free(b.order);
  free(b.group_start);
  free(b.group_ranks);
  free(b.group_index);
  if (rc != 0)
    wagma_plan_free(plan);
  return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Validation                                                                               */

static int uf_find(int *parent, int x) {
  while (parent[x] != x) {
    parent[x] = parent[parent[x]];
    x = parent[x];
  }
  return x;
}

static int cmp_member_name(const void *a, const void *b) {
  const wagma_member_t *x = *(const wagma_member_t *const *)a;
  const wagma_member_t *y = *(const wagma_member_t *const *)b;
  int c = strcmp(x->name, y->name);
  return c != 0 ? c : (x > y) - (x < y);
}

static int validate_members(const wagma_plan_t *plan, char *err, size_t err_len) {
  const wagma_member_t **sorted = NULL;
  int rc = 0;
  for (int i = 0; i < plan->nranks; i++) {
    const wagma_member_t *m = &plan->members[i];
    if (!memchr(m->name, '\0', sizeof(m->name))) {
      wg_errf(err, err_len, "members[%d].name: not NUL-terminated within %d bytes", i,
              WAGMA_NAME_MAX);
      return WAGMA_EINVAL;
    }
    if (m->name[0] == '\0') {
      wg_errf(err, err_len, "members[%d].name: empty", i);
      return WAGMA_EINVAL;
    }
    if (!memchr(m->address, '\0', sizeof(m->address))) {
      wg_errf(err, err_len, "members[%d].address: not NUL-terminated within %d bytes", i,
              WAGMA_ADDRESS_MAX);
      return WAGMA_EINVAL;
    }
    if (m->joiner != 0 && m->joiner != 1) {
      wg_errf(err, err_len, "members[%d].joiner: %d, must be 0 or 1", i, m->joiner);
      return WAGMA_EINVAL;
    }
  }
  sorted = malloc((size_t)plan->nranks * sizeof(*sorted));
  if (!sorted) {
    wg_errf(err, err_len, "out of memory");
    return WAGMA_ENOMEM;
  }
  for (int i = 0; i < plan->nranks; i++)
    sorted[i] = &plan->members[i];
  qsort(sorted, (size_t)plan->nranks, sizeof(*sorted), cmp_member_name);
  for (int i = 1; i < plan->nranks; i++) {
    if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
      wg_errf(err, err_len, "members[%d].name: \"%s\" is also the name of members[%d]",
              (int)(sorted[i] - plan->members), sorted[i]->name,
              (int)(sorted[i - 1] - plan->members));
      rc = WAGMA_EINVAL;
      goto out;
    }
  }
out:
  free(sorted);
  return rc;
}

/* seen[r] == stamp marks ranks met in this phase. */
static int validate_phase(const wagma_plan_t *plan, int j, int *seen, char *err, size_t err_len) {
  const wagma_phase_t *ph = &plan->phases[j];
  const int P = plan->nranks;
  if (ph->ngroups < 1 || ph->ngroups > P) {
    wg_errf(err, err_len, "phases[%d].ngroups: %d, must be in [1, %d]", j, ph->ngroups, P);
    return WAGMA_EINVAL;
  }
  if (!ph->offsets || !ph->ranks || !ph->group_of) {
    wg_errf(err, err_len, "phases[%d]: %s is NULL", j,
            !ph->offsets ? "offsets"
            : !ph->ranks ? "ranks"
                         : "group_of");
    return WAGMA_EINVAL;
  }
  if (ph->offsets[0] != 0 || ph->offsets[ph->ngroups] != P) {
    wg_errf(err, err_len, "phases[%d].offsets: must run from 0 to %d, runs from %d to %d", j, P,
            ph->offsets[0], ph->offsets[ph->ngroups]);
    return WAGMA_EINVAL;
  }
  for (int g = 0; g < ph->ngroups; g++) {
    int lo = ph->offsets[g], hi = ph->offsets[g + 1];
    if (hi <= lo || hi > P) {
      wg_errf(err, err_len, "phases[%d][%d]: empty or bad group (offsets %d..%d)", j, g, lo, hi);
      return WAGMA_EINVAL;
    }
    if (P >= 2 && hi - lo < 2) {
      wg_errf(err, err_len, "phases[%d][%d]: group of one rank (%d); groups need 2 or more", j, g,
              ph->ranks[lo]);
      return WAGMA_EINVAL;
    }
  }
  for (int g = 0; g < ph->ngroups; g++) {
    for (int x = ph->offsets[g]; x < ph->offsets[g + 1]; x++) {
      int r = ph->ranks[x];
      if (r < 0 || r >= P) {
        wg_errf(err, err_len, "phases[%d][%d][%d]: rank %d out of range [0, %d)", j, g,
                x - ph->offsets[g], r, P);
        return WAGMA_EINVAL;
      }
      if (seen[r] == j + 1) {
        wg_errf(err, err_len, "phases[%d][%d]: rank %d appears twice", j, g, r);
        return WAGMA_EINVAL;
      }
      seen[r] = j + 1;
      if (x > ph->offsets[g] && ph->ranks[x - 1] >= r) {
        wg_errf(err, err_len, "phases[%d][%d]: ranks not in increasing order (%d before %d)", j, g,
                ph->ranks[x - 1], r);
        return WAGMA_EINVAL;
      }
    }
  }
  for (int r = 0; r < P; r++) {
    if (seen[r] != j + 1) {
      wg_errf(err, err_len, "phases[%d]: rank %d is in no group", j, r);
      return WAGMA_EINVAL;
    }
  }
  for (int g = 0; g < ph->ngroups; g++) {
    for (int x = ph->offsets[g]; x < ph->offsets[g + 1]; x++) {
      if (ph->group_of[ph->ranks[x]] != g) {
        wg_errf(err, err_len, "phases[%d].group_of[%d]: %d, but the rank is in group %d", j,
                ph->ranks[x], ph->group_of[ph->ranks[x]], g);
        return WAGMA_EINVAL;
      }
    }
  }
  return 0;
}

int wagma_plan_validate(const wagma_plan_t *plan, char *err, size_t err_len) {
  int *scratch = NULL;
  int rc = WAGMA_EINVAL;
  if (!plan) {
    wg_errf(err, err_len, "plan: NULL");
    goto out;
  }
  if (plan->nranks < 1) {
    wg_errf(err, err_len, "nranks: %d, must be >= 1", plan->nranks);
    goto out;
  }
  if (plan->group_size < 2 || plan->group_size > INT_MAX / 2) {
    wg_errf(err, err_len, "group_size: %d, must be in [2, %d]", plan->group_size, INT_MAX / 2);
    goto out;
  }
  if (plan->staleness_bound < 1) {
    wg_errf(err, err_len, "staleness_bound: %d, must be >= 1", plan->staleness_bound);
    goto out;
  }
  if (plan->global_sync != WAGMA_GLOBAL_BARRIER &&
      plan->global_sync != WAGMA_GLOBAL_WAIT_AVOIDING) {
    wg_errf(err, err_len, "global_sync: %d, must be barrier (0) or wait-avoiding (1)",
            (int)plan->global_sync);
    goto out;
  }
  if (!plan->members) {
    wg_errf(err, err_len, "members: NULL");
    goto out;
  }
  if (plan->nphases < 1 || plan->nphases > PLAN_MAX_PHASES * 16) {
    wg_errf(err, err_len, "nphases: %d, must be in [1, %d]", plan->nphases, PLAN_MAX_PHASES * 16);
    goto out;
  }
  if (!plan->phases) {
    wg_errf(err, err_len, "phases: NULL");
    goto out;
  }
  rc = validate_members(plan, err, err_len);
  if (rc != 0)
    goto out;
  scratch = calloc((size_t)plan->nranks, sizeof(int));
  if (!scratch) {
    wg_errf(err, err_len, "out of memory");
    rc = WAGMA_ENOMEM;
    goto out;
  }
  for (int j = 0; j < plan->nphases; j++) {
    rc = validate_phase(plan, j, scratch, err, err_len);
    if (rc != 0)
      goto out;
  }
  /* connectivity of the union of all phases (= any L consecutive phases) */
  for (int r = 0; r < plan->nranks; r++)
    scratch[r] = r;
  for (int j = 0; j < plan->nphases; j++) {
    const wagma_phase_t *ph = &plan->phases[j];
    for (int g = 0; g < ph->ngroups; g++) {
      int root = uf_find(scratch, ph->ranks[ph->offsets[g]]);
      for (int x = ph->offsets[g] + 1; x < ph->offsets[g + 1]; x++) {
        int other = uf_find(scratch, ph->ranks[x]);
        if (other != root)
          scratch[other] = root;
      }
    }
  }
  for (int r = 1; r < plan->nranks; r++) {
    if (uf_find(scratch, r) != uf_find(scratch, 0)) {
      wg_errf(err, err_len, "phases: the groups of all %d phases never connect rank %d to rank 0",
              plan->nphases, r);
      rc = WAGMA_EINVAL;
      goto out;
    }
  }
  rc = 0;
out:
  free(scratch);
  return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Lookups                                                                                  */

const wagma_phase_t *wagma_plan_phase(const wagma_plan_t *plan, uint64_t round) {
  if (!plan || plan->nphases < 1 || !plan->phases)
    return NULL;
  return &plan->phases[round % (uint64_t)plan->nphases];
}

int wagma_plan_group(const wagma_plan_t *plan, uint64_t round, int rank, int *group,
                     const int **ranks) {
  const wagma_phase_t *ph = wagma_plan_phase(plan, round);
  if (!ph || rank < 0 || rank >= plan->nranks || !ph->group_of || !ph->offsets)
    return WAGMA_EINVAL;
  int g = ph->group_of[rank];
  if (g < 0 || g >= ph->ngroups)
    return WAGMA_EINVAL;
  if (group)
    *group = g;
  if (ranks)
    *ranks = ph->ranks + ph->offsets[g];
  return ph->offsets[g + 1] - ph->offsets[g];
}

int wagma_plan_rank_of(const wagma_plan_t *plan, const char *name) {
  if (!plan || !name || (plan->nranks > 0 && !plan->members))
    return WAGMA_EINVAL;
  for (int i = 0; i < plan->nranks; i++)
    if (strncmp(plan->members[i].name, name, WAGMA_NAME_MAX) == 0 && strlen(name) < WAGMA_NAME_MAX)
      return i;
  return WAGMA_ENOTFOUND;
}
