/* zero_cuda.h's host-side helpers that need no GPU, so this runs everywhere nvcc does:
   the vector/scalar split (zero_cuda__head). The kernels' conversions are zero.h's own
   integer converters (ZERO_HOSTDEV), checked on the CPU by tests/test_convert.c and on the
   GPU against the host device by test_cuda_kernels. */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "tests/zt.h"

ZT_TEST(test_vector_head)
{
    /* the first index where every pointer is 16-byte aligned, or -1 */
    char *base = (char *)(uintptr_t)0x10000;
    const void *p[3];
    size_t es[3] = {4, 4, 2};
    p[0] = base;
    p[1] = base + 64;
    p[2] = base + 32;
    ZT_CHECK(zero_cuda__head(p, es, 3) == 0);
    p[0] = base + 4; /* fp32 at element 1: aligned at elements 3, 7 */
    p[1] = base + 4;
    p[2] = base + 2; /* fp16 at element 1: aligned at element 7 */
    ZT_CHECK(zero_cuda__head(p, es, 3) == 7);
    p[0] = base + 12;
    p[1] = base + 12;
    p[2] = base + 2; /* fp32: heads 1, 5; fp16: head 7: none common */
    ZT_CHECK(zero_cuda__head(p, es, 3) == -1);
    p[2] = base + 14; /* fp16: 14 + 2h = 16 -> h = 1; fp32: 12 + 4 = 16 -> h = 1 */
    ZT_CHECK(zero_cuda__head(p, es, 3) == 1);
    p[1] = NULL; /* NULL pointers (no param) do not count */
    ZT_CHECK(zero_cuda__head(p, es, 3) == 1);
    p[0] = base + 1; /* not even element-aligned */
    ZT_CHECK(zero_cuda__head(p, es, 1) == -1);
}

/* The probe: without a GPU it must say 0 (skip), never an error, on a machine with no
   driver; where it succeeds it agrees with zero_cuda_device_count. */
ZT_TEST(test_probe)
{
    int n = -1;
    zero_result r = zero_cuda_device_probe(&n);
    ZT_CHECK(zero_cuda_device_probe(NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    if (r != ZERO_OK) {
        ZT_CHECKF(r == ZERO_ERROR_DEVICE && n == 0 && strstr(zero_last_error(), "cudaGetDeviceCount"), "%s",
                  zero_last_error());
        printf("  (probe: %s)\n", zero_last_error());
        return;
    }
    ZT_CHECK(n >= 0 && n == zero_cuda_device_count());
}

/* cudaStreamPerThread is refused before any CUDA call (so this runs without a GPU). */
ZT_TEST(test_per_thread_stream_refused)
{
    zero_cuda_desc desc;
    zero_device *dev = (zero_device *)&desc;
    memset(&desc, 0, sizeof desc);
    desc.compute_stream = (void *)cudaStreamPerThread;
    ZT_CHECK(zero_cuda_device_create(&desc, &dev) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(dev == NULL);
    ZT_CHECK(strstr(zero_last_error(), "cudaStreamPerThread") != NULL);
}

int main(void)
{
    ZT_RUN(test_vector_head);
    ZT_RUN(test_probe);
    ZT_RUN(test_per_thread_stream_refused);
    return zt_summary();
}
