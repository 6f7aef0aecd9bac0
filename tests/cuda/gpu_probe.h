/* The first lines of every GPU test program: skip (exit 0, each of its ntests counted as
   skipped) only when there is no CUDA device; an unusable one (an old driver, ...) fails
   with CUDA's error, so a run cannot pass while testing nothing. Returns -1 to go on, or
   the exit status to return from main. Needs zero_cuda.h (zero_cuda_device_probe). */
#ifndef ZERO_TESTS_GPU_PROBE_H
#define ZERO_TESTS_GPU_PROBE_H
#include <stdio.h>

static int zt_gpu_probe(int ntests)
{
    int ndev = 0;
    if (zero_cuda_device_probe(&ndev) != ZERO_OK) {
        printf("  FAIL: %s\n", zero_last_error());
        printf("zt: 0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    if (ndev == 0) {
        printf("  skip: no CUDA device\n");
        printf("zt: 0 passed, 0 failed, %d skipped\n", ntests);
        return 0;
    }
    return -1;
}

#endif
