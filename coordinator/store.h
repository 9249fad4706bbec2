/* coordinator/store.h — one job read from etcd and its REST view (store.c): the record, its
 * iteration and result. */
#ifndef WAGMA_COORD_STORE_H
#define WAGMA_COORD_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "coord.h"
#include "wagma/api.h"
#include "wagma/etcd.h"

typedef struct wg_progress_entry {
  char agent[WAGMA_API_NAME_MAX];
  wagma_progress_t progress;
  int64_t mod; /* mod revision of the progress key: which registration of the agent wrote it */
} wg_progress_entry_t;

typedef struct wg_job_record {
  char id[WAGMA_API_NAME_MAX];
  int has_spec, has_status;
  wagma_job_spec_t spec;
  int64_t spec_mod;
  wagma_job_status_t status;
  int64_t status_mod;
  char *plan_json; /* NULL when no plan */
  size_t plan_len;
  int64_t plan_mod;
  int has_checkpoint;
  wagma_checkpoint_record_t checkpoint; /* the job's checkpoint record, when has_checkpoint */
  int nprogress;
  wg_progress_entry_t *progress;
} wg_job_record_t;

/* Fills rec from the kvs of one job (keys under <prefix>/jobs/<id>/). Records that do not
 * decode are skipped (logged). */
int wg_job_record_from_kvs(wg_coord_t *c, const char *id, const wagma_etcd_kv_t *kvs, size_t n,
                           wg_job_record_t *rec);
void wg_job_record_free(wg_job_record_t *rec);
/* Reads one job. WAGMA_ENOTFOUND when it has no spec. */
int wg_store_load_job(wg_coord_t *c, const char *id, wg_job_record_t *rec);
/* The job's iteration as REST shows it: status.iteration (the high-water mark written at each
 * plan change) or the highest iteration an agent reported in the status' epoch, whichever is
 * larger. Reports of older epochs do not count: a survivor may have reported an iteration of
 * the old epoch past the new plan's start_round, which it counts again in the new epoch, and
 * the job's iteration must not go back when it does. */
uint64_t wg_job_record_iteration(const wg_job_record_t *rec);
/* The job's result when it ends at `finished` (unix s): the final reports of its last epoch
 * (those that reported "done" when any did, else those running or failed; never an agent's
 * "unavailable"), status.summary. */
void wg_job_record_summary(const wg_job_record_t *rec, double finished, wagma_job_summary_t *out);
/* The REST view of a job: {"id","spec","status","warnings","members"} (members only when
 * with_members; warnings: wagma_job_spec_warnings, [] when none). */
json_t *wg_job_record_to_value(const wg_job_record_t *rec, int with_members);

#endif
