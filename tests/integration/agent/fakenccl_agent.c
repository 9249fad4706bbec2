/* fakenccl_agent.c — what makes wagma-agent-fakenccl: the agent's sources compiled with
 * wagma_comm_create and wagma_comm_transport_check renamed to the two functions below, which
 * route WAGMA_TRANSPORT_NCCL to the NCCL transport built against tests/fake_nccl (ranks are
 * processes, device memory is host memory). So agents with --transport nccl train CPU jobs
 * (WAGMA_AGENT_NCCL_ON_CPU lifts --device cuda) and average them through the NCCL transport's
 * whole path (lane thread, agreement, keeper, communicators kept, shrunk and made afresh
 * across epochs) on a machine without a GPU. Other transports go to the real calls. */
#include "engine_internal.h"
#include "nccl_internal.h"

int fakenccl_agent_comm_create(const wagma_comm_options_t *options, wagma_comm_t **comm);
int fakenccl_agent_transport_check(wagma_transport_kind_t kind, int device, char *err,
                                   size_t err_len);

int fakenccl_agent_comm_create(const wagma_comm_options_t *options, wagma_comm_t **comm) {
  if (options && options->transport == WAGMA_TRANSPORT_NCCL)
    return wg_comm_create_with(options, &wg_ncclfake_transport, comm);
  return wagma_comm_create(options, comm);
}

int fakenccl_agent_transport_check(wagma_transport_kind_t kind, int device, char *err,
                                   size_t err_len) {
  if (kind == WAGMA_TRANSPORT_NCCL)
    return WG_NCCL(device_check)(device, err, err_len);
  return wagma_comm_transport_check(kind, device, err, err_len);
}
