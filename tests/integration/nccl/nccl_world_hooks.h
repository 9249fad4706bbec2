/* nccl_world_hooks.h — the NCCL tests' hooks into the engine's process worlds
 * (tests/integration/engine/engine_world.c, compiled here with wagma_comm_create/destroy
 * routed to nw_comm_create/nw_comm_destroy): every communicator runs over the NCCL transport
 * (linked against tests/fake_nccl, or against NCCL with rank r on GPU r), and what its lane did is
 * recorded per rank in memory the forked ranks share with the parent. */
#ifndef WAGMA_TEST_NCCL_WORLD_HOOKS_H
#define WAGMA_TEST_NCCL_WORLD_HOOKS_H

#include <stdint.h>

#include "wagma/collective.h"

#define NW_MAXP 8

typedef struct nw_lane {
  int recorded;                 /* the rank destroyed its communicator */
  int state;                    /* nc_lane_state_t at destroy */
  int shrunk;                   /* the communicator was shrunk from the previous epoch's */
  uint64_t transfers;           /* payloads moved on the lane */
  uint64_t failures;            /* times the lane was revoked */
  uint64_t collectives;         /* rounds run as one group allreduce (nccl_groups.c) */
  uint64_t collective_failures; /* group communicators revoked */
  unsigned dead_mask;           /* ranks the transport knew dead (and buried) at destroy */
} nw_lane_t;

/* Shared with forked children; nw_init maps it (call once in the parent before forking),
 * nw_reset zeroes it. */
extern nw_lane_t *nw_lanes;
void nw_init(void);
void nw_reset(void);

int nw_comm_create(const wagma_comm_options_t *options, wagma_comm_t **comm);
void nw_comm_destroy(wagma_comm_t *comm);

#endif
