/* agent/probe.h — whether this node reaches its peers' data-plane addresses again (probe.c):
 * the test an agent quarantined for being unreachable runs before it says it can rejoin
 * (docs/design.md §7.3). */
#ifndef WAGMA_AGENT_PROBE_H
#define WAGMA_AGENT_PROBE_H

#include "wagma/api.h"

/* Opens a TCP connection to each of the n "host:port" addresses (numeric hosts, or names
 * resolved here), all at once within timeout_s, and closes it at once without a byte sent. Returns
 * how many connected; the first that did not is named in why (len bytes, may be NULL) with
 * the cause. */
int wg_probe_reach(const char (*addrs)[WAGMA_API_ADDR_MAX], int n, double timeout_s, char *why,
                   size_t len);

#endif
