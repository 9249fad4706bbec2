/* nccl.h (fake) — the subset of the NCCL 2.28 API the NCCL transport (collective/nccl*.c)
 * calls, implemented by tests/fake_nccl/fake_nccl.c: each rank a process, ranks connected
 * over 127.0.0.1 (or each process's FAKE_NCCL_HOST), the unique id carrying the rendezvous
 * address. Names are mapped to
 * fakenccl_ symbols (see cuda_runtime_api.h); enum values and semantics are NCCL's:
 * non-blocking communicators (config.blocking = 0) return ncclInProgress and are polled with
 * ncclCommGetAsyncError; ncclSend/ncclRecv inside ncclGroupStart/ncclGroupEnd progress
 * together; ncclCommRevoke stops what is in flight; ncclCommShrink builds a communicator of
 * the ranks not excluded, ordered as in the parent.
 *
 * Faults (environment, read when a communicator is created):
 *   FAKE_NCCL_HANG_OP=N          the Nth send/recv this process posts never completes
 *   FAKE_NCCL_REMOTE_ERROR_OP=N  posting the Nth makes the async error ncclRemoteError
 *                                (and that operation never completes)
 *   FAKE_NCCL_INIT_HANG=1        initialisation stays ncclInProgress for ever
 *   FAKE_NCCL_DEVICES=N          devices cudaGetDeviceCount reports (default 1)
 *   FAKE_CUDA_NO_HOST_ALLOC=1    cudaHostAlloc fails (page-locked memory is short; read at
 *                                each call)
 *   FAKE_NCCL_LAUNCH_US=N        a non-blocking communicator's group reaches its stream N µs
 *                                after its worker takes it (default 300; ncclGroupEnd returns
 *                                ncclInProgress before, and the async error says so until then)
 *   FAKE_CUDA_SYNC_MS=N          calls that wait for the whole device take N ms first
 *   FAKE_CUDA_NO_MEMORY_POOLS=1  cudaMallocAsync / cudaFreeAsync are not supported
 * Not a fault: FAKE_NCCL_HOST=A.B.C.D, the IPv4 address this process's listeners bind and
 * its peers dial (default 127.0.0.1), for ranks in network namespaces of their own.
 * A peer that dies (SIGKILL) or freezes (SIGSTOP) makes operations with it never complete,
 * as NCCL does between processes of one host: no error is reported. */
#ifndef WAGMA_FAKE_NCCL_H
#define WAGMA_FAKE_NCCL_H

#include <limits.h>
#include <stddef.h>

#include "cuda_runtime_api.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef struct fakenccl_comm *ncclComm_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclFloat32 = 7,
  ncclFloat = 7
} ncclDataType_t;

typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} ncclConfig_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_INITIALIZER                                                                    \
  { sizeof(ncclConfig_t), 0xcafebeef, 22809, NCCL_CONFIG_UNDEF_INT }

#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01
#define NCCL_REVOKE_DEFAULT 0x00
#define NCCL_SPLIT_NOCOLOR -1

typedef enum { ncclSum = 0 } ncclRedOp_t; /* the fake reduces float32 sums only */

#define ncclGetUniqueId fakenccl_ncclGetUniqueId
#define ncclCommInitRankConfig fakenccl_ncclCommInitRankConfig
#define ncclCommGetAsyncError fakenccl_ncclCommGetAsyncError
#define ncclCommAbort fakenccl_ncclCommAbort
#define ncclCommRevoke fakenccl_ncclCommRevoke
#define ncclCommShrink fakenccl_ncclCommShrink
#define ncclCommSplit fakenccl_ncclCommSplit
#define ncclAllReduce fakenccl_ncclAllReduce
#define ncclSend fakenccl_ncclSend
#define ncclRecv fakenccl_ncclRecv
#define ncclGroupStart fakenccl_ncclGroupStart
#define ncclGroupEnd fakenccl_ncclGroupEnd
#define ncclGetErrorString fakenccl_ncclGetErrorString

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                            ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags);
/* Collective over comm: ranks of one colour form a communicator ordered by (key, rank in
 * comm); NCCL_SPLIT_NOCOLOR gets NULL. config NULL inherits comm's blocking mode. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config);
/* ncclFloat32 with ncclSum only; every rank gets the same bits: element i is
 * ((x_0[i] + x_1[i]) + x_2[i]) + ..., in communicator rank order. In place when
 * sendbuff == recvbuff. */
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
const char *ncclGetErrorString(ncclResult_t result);

#ifdef __cplusplus
}
#endif
#endif
