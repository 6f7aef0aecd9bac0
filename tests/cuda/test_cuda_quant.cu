/* Block quantization on the CUDA device (zero_cuda.h's quantize / dequantize ops, ZeRO++'s
   qwZ / qgZ) against the host device, bit for bit: every byte of the quantized buffer (scales,
   codes, padding) and every dequantized value (the fp32 sum of several buffers too), for f32,
   f16 and bf16, int8 and int4, block sizes 2 .. 1024, sizes with tails, with all-zero,
   inf and NaN blocks mixed in; hierarchical qgZ's two levels (dequantize into fp32,
   re-quantize, sum) on the engine's offsets. Then qwZ + the engine on the CUDA device with the CUDA local
   comm: the same params as the host device's run (stage 3, 4 ranks).
   Without a GPU it prints one skip line and exits 0 (runs under the CPU harness). */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "tests/zt.h"
#include "tests/cuda/gpu_probe.h"

#include <math.h>

#define NTESTS 4

static zero_device *H, *G; /* host oracle, CUDA device */

#define Z_OK(call)                                                                           \
    do {                                                                                     \
        zero_result r_ = (call);                                                             \
        ZT_CHECKF(r_ == ZERO_OK, "%s: %s: %s", #call, zero_result_string(r_), zero_last_error()); \
        if (r_ != ZERO_OK) return;                                                           \
    } while (0)

static const zero_dtype DTS[3] = {ZERO_F32, ZERO_F16, ZERO_BF16};

static void put(zero_dtype dt, void *p, size_t i, float f)
{
    if (dt == ZERO_F32) ((float *)p)[i] = f;
    else if (dt == ZERO_F16) ((uint16_t *)p)[i] = zero_f32_to_f16(f);
    else ((uint16_t *)p)[i] = zero_f32_to_bf16(f);
}

/* n elements, block-wise magnitudes; every 5th block all zero, every 7th with an inf or a
   NaN, the rest random with a subnormal now and then. */
static void gen(zero_dtype dt, void *p, size_t n, size_t block)
{
    size_t i;
    for (i = 0; i < n; i++) {
        size_t k = i / block;
        double mag = ldexp(1.0, (int)(k * 7 % 30) - 15);
        float f = (float)((zt_uniform() * 2.0 - 1.0) * mag);
        if (k % 5 == 3) f = (i & 1) ? -0.0f : 0.0f;
        if (k % 7 == 5 && i % block == 1) f = (k & 1) ? NAN : -INFINITY;
        if (zt_rand64() % 50 == 0) f = (float)ldexp(1.0, -140);
        put(dt, p, i, f);
    }
}

ZT_TEST(quantize_bit_identical)
{
    static const size_t sizes[] = {1, 2, 7, 255, 256, 257, 1000, 4099};
    static const size_t blocks[] = {2, 6, 64, 256, 1024};
    size_t si, bi, bytes = 0;
    int d, bits;
    unsigned char *hq = (unsigned char *)malloc(1 << 16), *gq = (unsigned char *)malloc(1 << 16);
    unsigned char *x = (unsigned char *)malloc(4099 * 4), *hy = (unsigned char *)malloc(4099 * 4),
                  *gy = (unsigned char *)malloc(4099 * 4);
    void *dx = NULL, *dq = NULL, *dy = NULL;
    int bad = 0, runs = 0;
    Z_OK(G->ops->alloc(G, 4099 * 4, ZERO_MEM_SCRATCH, &dx));
    Z_OK(G->ops->alloc(G, 1 << 16, ZERO_MEM_SCRATCH, &dq));
    Z_OK(G->ops->alloc(G, 4099 * 4, ZERO_MEM_SCRATCH, &dy));
    for (d = 0; d < 3; d++)
        for (bits = 4; bits <= 8; bits += 4)
            for (bi = 0; bi < sizeof blocks / sizeof *blocks; bi++)
                for (si = 0; si < sizeof sizes / sizeof *sizes; si++) {
                    size_t n = sizes[si], es = zero_dtype_size(DTS[d]), B = blocks[bi];
                    int count = 1 + (int)(si % 3);
                    size_t stride;
                    int j;
                    Z_OK(zero_quant_bytes(n, bits, B, &bytes));
                    stride = bytes;
                    if ((size_t)count * stride > (1 << 16)) count = 1;
                    for (j = 0; j < count; j++) {
                        gen(DTS[d], x, n, B);
                        Z_OK(H->ops->quantize(H, ZERO_QUEUE_COMPUTE, hq + (size_t)j * stride, x, DTS[d], n, bits, B));
                        Z_OK(G->ops->upload(G, ZERO_QUEUE_COMPUTE, dx, x, n * es));
                        Z_OK(G->ops->fill_zero(G, ZERO_QUEUE_COMPUTE, (unsigned char *)dq + (size_t)j * stride, stride));
                        Z_OK(G->ops->quantize(G, ZERO_QUEUE_COMPUTE, (unsigned char *)dq + (size_t)j * stride, dx,
                                              DTS[d], n, bits, B));
                    }
                    Z_OK(G->ops->download(G, ZERO_QUEUE_COMPUTE, gq, dq, (size_t)count * stride));
                    Z_OK(H->ops->dequantize(H, ZERO_QUEUE_COMPUTE, hy, DTS[d], hq, stride, count, n, bits, B));
                    Z_OK(G->ops->dequantize(G, ZERO_QUEUE_COMPUTE, dy, DTS[d], dq, stride, count, n, bits, B));
                    Z_OK(G->ops->download(G, ZERO_QUEUE_COMPUTE, gy, dy, n * es));
                    Z_OK(G->ops->sync(G, ZERO_QUEUE_COMPUTE));
                    runs++;
                    if (memcmp(hq, gq, (size_t)count * stride) != 0 || memcmp(hy, gy, n * es) != 0) {
                        if (bad < 3)
                            fprintf(stderr, "  %s int%d block %zu n %zu count %d: %s differ\n",
                                    zero_dtype_name(DTS[d]), bits, B, n, count,
                                    memcmp(hq, gq, (size_t)count * stride) ? "bytes" : "values");
                        bad++;
                    }
                }
    ZT_CHECKF(bad == 0, "%d of %d runs differ", bad, runs);
    G->ops->free(G, dx);
    G->ops->free(G, dq);
    G->ops->free(G, dy);
    free(hq);
    free(gq);
    free(x);
    free(hy);
    free(gy);
}


/* Hierarchical qgZ's arithmetic (the engine's quantized_gradient_levels = 2) on one rank's
   buffers, with the engine's offsets: the R x M blocks received inside the node at
   (i M + k) P, for each node k the R dequantized and summed into fp32, that fp32 block
   re-quantized at k P, and the M blocks summed into the param dtype. Every intermediate
   buffer and the result bit for bit the host's, for f32, f16 and bf16, int4 and int8, with
   the all-zero, inf and NaN blocks of gen(). */
ZT_TEST(two_level_bit_identical)
{
    static const int cases[][2] = {{2, 2}, {2, 4}, {4, 2}};
    size_t n = 1000, B = 64, P = 0;
    int d, bits, ci;
    unsigned char *x = (unsigned char *)malloc(n * 4), *hr = (unsigned char *)malloc(1 << 16),
                  *hs = (unsigned char *)malloc(1 << 16), *gr = (unsigned char *)malloc(1 << 16),
                  *gs = (unsigned char *)malloc(1 << 16), *hy = (unsigned char *)malloc(n * 4),
                  *gy = (unsigned char *)malloc(n * 4);
    float *hsum = (float *)malloc(n * 4);
    void *dx = NULL, *dr = NULL, *ds = NULL, *dsum = NULL, *dy = NULL;
    int bad = 0, runs = 0;
    Z_OK(G->ops->alloc(G, n * 4, ZERO_MEM_SCRATCH, &dx));
    Z_OK(G->ops->alloc(G, 1 << 16, ZERO_MEM_SCRATCH, &dr));
    Z_OK(G->ops->alloc(G, 1 << 16, ZERO_MEM_SCRATCH, &ds));
    Z_OK(G->ops->alloc(G, n * 4, ZERO_MEM_SCRATCH, &dsum));
    Z_OK(G->ops->alloc(G, n * 4, ZERO_MEM_SCRATCH, &dy));
    for (ci = 0; ci < 3; ci++)
        for (d = 0; d < 3; d++)
            for (bits = 4; bits <= 8; bits += 4) {
                size_t R = (size_t)cases[ci][0], M = (size_t)cases[ci][1], es = zero_dtype_size(DTS[d]), i, k;
                Z_OK(zero_quant_bytes(n, bits, B, &P));
                for (i = 0; i < R; i++)
                    for (k = 0; k < M; k++) {
                        size_t at = (i * M + k) * P;
                        gen(DTS[d], x, n, B);
                        Z_OK(H->ops->quantize(H, ZERO_QUEUE_COMM, hr + at, x, DTS[d], n, bits, B));
                        Z_OK(G->ops->upload(G, ZERO_QUEUE_COMM, dx, x, n * es));
                        Z_OK(G->ops->quantize(G, ZERO_QUEUE_COMM, (unsigned char *)dr + at, dx, DTS[d], n, bits, B));
                    }
                for (k = 0; k < M; k++) {
                    Z_OK(H->ops->dequantize(H, ZERO_QUEUE_COMM, hsum, ZERO_F32, hr + k * P, M * P, (int)R, n, bits, B));
                    Z_OK(H->ops->quantize(H, ZERO_QUEUE_COMM, hs + k * P, hsum, ZERO_F32, n, bits, B));
                    Z_OK(G->ops->dequantize(G, ZERO_QUEUE_COMM, dsum, ZERO_F32, (unsigned char *)dr + k * P, M * P,
                                            (int)R, n, bits, B));
                    Z_OK(G->ops->quantize(G, ZERO_QUEUE_COMM, (unsigned char *)ds + k * P, dsum, ZERO_F32, n, bits, B));
                }
                Z_OK(H->ops->dequantize(H, ZERO_QUEUE_COMM, hy, DTS[d], hs, P, (int)M, n, bits, B));
                Z_OK(G->ops->dequantize(G, ZERO_QUEUE_COMM, dy, DTS[d], ds, P, (int)M, n, bits, B));
                Z_OK(G->ops->download(G, ZERO_QUEUE_COMM, gr, dr, R * M * P));
                Z_OK(G->ops->download(G, ZERO_QUEUE_COMM, gs, ds, M * P));
                Z_OK(G->ops->download(G, ZERO_QUEUE_COMM, gy, dy, n * es));
                Z_OK(G->ops->sync(G, ZERO_QUEUE_COMM));
                runs++;
                if (memcmp(hr, gr, R * M * P) != 0 || memcmp(hs, gs, M * P) != 0 || memcmp(hy, gy, n * es) != 0) {
                    if (bad < 3)
                        fprintf(stderr, "  R %zu M %zu %s int%d: %s differ\n", R, M, zero_dtype_name(DTS[d]), bits,
                                memcmp(hr, gr, R * M * P) ? "first-level blocks"
                                : memcmp(hs, gs, M * P)   ? "re-quantized blocks"
                                                          : "values");
                    bad++;
                }
            }
    ZT_CHECKF(bad == 0, "%d of %d runs differ", bad, runs);
    G->ops->free(G, dx);
    G->ops->free(G, dr);
    G->ops->free(G, ds);
    G->ops->free(G, dsum);
    G->ops->free(G, dy);
    free(x);
    free(hr);
    free(hs);
    free(gr);
    free(gs);
    free(hy);
    free(gy);
    free(hsum);
}

ZT_TEST(bad_arguments)
{
    void *dq = NULL;
    Z_OK(G->ops->alloc(G, 256, ZERO_MEM_SCRATCH, &dq));
    ZT_CHECK(G->ops->quantize(G, ZERO_QUEUE_COMPUTE, dq, dq, ZERO_F64, 4, 8, 256) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(G->ops->quantize(G, ZERO_QUEUE_COMPUTE, dq, dq, ZERO_F32, 4, 5, 256) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(G->ops->quantize(G, ZERO_QUEUE_COMPUTE, (unsigned char *)dq + 1, dq, ZERO_F32, 4, 8, 256) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(G->ops->dequantize(G, ZERO_QUEUE_COMPUTE, dq, ZERO_F32, dq, 2, 2, 4, 8, 256) ==
             ZERO_ERROR_INVALID_ARGUMENT);
    G->ops->free(G, dq);
}

/* qwZ in the engine on the CUDA device (4 ranks, the CUDA local comm) against the host
   device with the local comm: the same params after 3 steps. */
typedef struct run_ctx {
    int cuda;
    uint16_t params[4][1000];
} run_ctx;

static zero_result qw_rank(int rank, zero_comm *comm, void *user)
{
    run_ctx *ctx = (run_ctx *)user;
    zero_device *dev = NULL;
    zero_comm *dcomm = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    int id, s;
    static const size_t numel = 1000;
    uint16_t *host = (uint16_t *)malloc(numel * 2);
    float init[1000];
    size_t i;
    zero_range rg;
    if (ctx->cuda) {
        r = zero_cuda_device_create(NULL, &dev);
        if (r == ZERO_OK) r = zero_cuda_local_comm_create(comm, dev, &dcomm);
    } else {
        r = zero_host_device_create(NULL, &dev);
    }
    memset(&d, 0, sizeof d);
    d.stage = 3;
    d.param_dtype = ZERO_BF16;
    d.device = dev;
    d.comm = dcomm ? dcomm : comm;
    d.quantized_weights = 1;
    d.quant_block_numel = 32;
    if (r == ZERO_OK) r = zero_engine_create(&d, &e);
    if (r == ZERO_OK) r = zero_engine_add_tensor(e, "w", numel, 0, 0, &id);
    if (r == ZERO_OK) r = zero_engine_commit(e);
    for (i = 0; i < numel; i++) init[i] = (float)sin(0.37 * (double)i);
    if (r == ZERO_OK) r = zero_engine_set_tensor(e, id, init);
    for (s = 0; s < 3 && r == ZERO_OK; s++) {
        void *p, *g;
        /* forward: the gradient is the forward's (quantized) params, so they reach the state */
        r = zero_engine_gather(e, 0, &p);
        if (r == ZERO_OK && dev->ops->download) r = dev->ops->download(dev, ZERO_QUEUE_COMPUTE, host, p, numel * 2);
        if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMPUTE);
        if (r == ZERO_OK) r = zero_engine_release(e, 0);
        if (r == ZERO_OK) r = zero_engine_gather(e, 0, &p);
        if (r == ZERO_OK) r = zero_engine_grads(e, 0, &g);
        if (r == ZERO_OK) r = dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, g, host, numel * 2);
        if (r == ZERO_OK) r = zero_engine_release(e, 0);
        if (r == ZERO_OK) r = zero_engine_grads_ready(e, 0);
        if (r == ZERO_OK) r = zero_engine_step(e, NULL);
    }
    if (r == ZERO_OK) r = zero_engine_read_tensor(e, id, ZERO_STATE_PARAM, ctx->params[rank], &rg);
    zero_engine_destroy(e);
    if (dcomm) zero_comm_destroy(dcomm);
    zero_device_destroy(dev);
    free(host);
    return r;
}

ZT_TEST(engine_qwz_same_as_host)
{
    static run_ctx a, b;
    int rk;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    b.cuda = 1;
    Z_OK(zero_local_run(4, qw_rank, &a));
    Z_OK(zero_local_run(4, qw_rank, &b));
    for (rk = 0; rk < 4; rk++) ZT_CHECKF(memcmp(a.params[rk], b.params[rk], sizeof a.params[rk]) == 0, "rank %d", rk);
}

int main(void)
{
    {
        int rc = zt_gpu_probe(NTESTS);
        if (rc >= 0) return rc;
    }
    if (zero_host_device_create(NULL, &H) != ZERO_OK || zero_cuda_device_create(NULL, &G) != ZERO_OK) {
        printf("FAIL setup: %s\n", zero_last_error());
        printf("zt: 0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    zt_seed(2611);
    ZT_RUN(quantize_bit_identical);
    ZT_RUN(two_level_bit_identical);
    ZT_RUN(bad_arguments);
    ZT_RUN(engine_qwz_same_as_host);
    zero_device_destroy(G);
    zero_device_destroy(H);
    return zt_summary();
}
