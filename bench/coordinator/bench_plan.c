/* bench_plan — time to compute a plan as the coordinator does (wagma_plan_build + member
 * table + JSON encoding), and what an agent pays to decode it, for P = 100, 1000, 10000
 * (or the sizes given as arguments). Baseline, named: the design budget of 100 ms per plan at
 * P = 10000; the ratio printed is budget / measured (higher is better).
 *   build-coord/bench/coordinator/bench_plan [P...] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"
#include "coord.h"
#include "wagma/collective.h"

#define BUDGET_S 0.100

int main(int argc, char **argv) {
  int sizes[16] = {100, 1000, 10000}, nsizes = 3;
  if (argc > 1) {
    nsizes = 0;
    for (int i = 1; i < argc && nsizes < 16; i++)
      sizes[nsizes++] = atoi(argv[i]);
  }
  printf("| P | S | phases | build+encode (ms) | plan JSON (KiB) | agent decode (ms) | budget "
         "100 ms / build |\n|---|---|---|---|---|---|---|\n");
  for (int k = 0; k < nsizes; k++) {
    int p = sizes[k], s = 4;
    char(*names)[32] = calloc((size_t)p, sizeof *names);
    char(*addrs)[32] = calloc((size_t)p, sizeof *addrs);
    wg_plan_member_t *m = calloc((size_t)p, sizeof *m);
    for (int r = 0; r < p; r++) {
      snprintf(names[r], sizeof names[r], "agent-%05d", r);
      snprintf(addrs[r], sizeof addrs[r], "10.%d.%d.%d:7000", r / 65536, (r / 256) % 256, r % 256);
      m[r] = (wg_plan_member_t){.name = names[r], .address = addrs[r], .joiner = r % 10 == 0};
    }
    wg_plan_request_t req = {.epoch = 7,
                             .start_round = 1234,
                             .group_size = s,
                             .staleness_bound = 8,
                             .global_sync = WAGMA_SYNC_BARRIER,
                             .nmembers = p,
                             .members = m};
    int reps = p >= 10000 ? 10 : p >= 1000 ? 50 : 500;
    double best = 1e9, best_dec = 1e9;
    size_t bytes = 0;
    int nphases = 0;
    for (int i = 0; i < reps; i++) {
      char *json = NULL;
      double secs = 0;
      if (wg_planner_build_json(&req, &json, &secs)) {
        fprintf(stderr, "plan for P=%d failed\n", p);
        return 1;
      }
      if (secs < best)
        best = secs;
      bytes = strlen(json);
      wagma_plan_t plan;
      char err[128];
      double t0 = wg_mono();
      if (wagma_plan_from_json(json, bytes, &plan, err, sizeof err)) {
        fprintf(stderr, "decode failed: %s\n", err);
        return 1;
      }
      double dec = wg_mono() - t0;
      if (dec < best_dec)
        best_dec = dec;
      nphases = plan.nphases;
      wagma_plan_free(&plan);
      free(json);
    }
    printf("| %d | %d | %d | %.3f | %.1f | %.3f | %.0fx |\n", p, s, nphases, best * 1e3,
           bytes / 1024.0, best_dec * 1e3, BUDGET_S / best);
    free(names);
    free(addrs);
    free(m);
  }
  return 0;
}
