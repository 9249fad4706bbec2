/* gpu.h — the GPU an agent trains on (`wagma-agent --gpu N`, docs/agent.md): the value of
 * CUDA_VISIBLE_DEVICES that makes GPU N the agent's and its programs' device 0. Pure: no CUDA
 * call, no environment read here (gpu.c). */
#ifndef WAGMA_AGENT_GPU_H
#define WAGMA_AGENT_GPU_H

#include <stddef.h>

#define WG_GPU_MAX 1023 /* the highest --gpu index accepted */

/* The CUDA_VISIBLE_DEVICES value naming GPU `index` of what the agent inherited: `inherited`
 * NULL (not set) gives "index" itself; otherwise its index-th comma-separated entry (an index,
 * a GPU-UUID or a MIG id, spaces around it dropped), so an operator's or a device plugin's
 * list is honoured. 0 and out, or -1 with a reason in err: an empty list (no GPU visible), an
 * index past its end, an empty entry, an index outside 0..WG_GPU_MAX or an out buffer too
 * small. */
int wg_gpu_visible_devices(const char *inherited, int index, char *out, size_t out_len, char *err,
                           size_t err_len);

#endif
