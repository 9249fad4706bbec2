/* gpu_count.h — the CUDA devices of this machine, for the NCCL tests that run one rank per GPU
 * (the real-NCCL builds of test_nccl_transport and test_nccl_engine). */
#ifndef WAGMA_TEST_NCCL_GPU_COUNT_H
#define WAGMA_TEST_NCCL_GPU_COUNT_H

/* cudaGetDeviceCount in a forked child, so that this process holds no CUDA context (a context
 * does not survive the fork of the ranks). The count (at most 100), or 0 when CUDA is unusable
 * or the child did not answer within 30 s. */
int gpu_count(void);

/* gpu_count, or -1 after printing "SKIP: <test> needs 2 or more CUDA GPUs ..." when there are
 * fewer than 2 (the caller then exits 77, ctest's skip). */
int gpu_count_for_ranks(const char *test);

#endif
