/* The estimator: the paper's table and DeepSpeed's formulas against numbers worked by hand
   here, the inverse against its defining property, and the errors. */
#include "zero.h"
#include "tests/zt.h"

static zero_estimate est(uint64_t params, int ranks, int stage, int offload)
{
    zero_estimate_desc d;
    zero_estimate e;
    zero_result r;
    memset(&d, 0, sizeof d);
    memset(&e, 0xff, sizeof e);
    d.params = params;
    d.ranks = ranks;
    d.stage = stage;
    d.offload = offload;
    r = zero_estimate_compute(&d, &e);
    if (r != ZERO_OK) fprintf(stderr, "  estimate failed: %s\n", zero_last_error());
    return e;
}

/* the ZeRO paper, Figure 1: Psi = 7.5B, N = 64, K = 12 */
ZT_TEST(paper_figure1)
{
    /* by hand: Psi/N = 7,500,000,000 / 64 = 117,187,500 exactly
       stage 0: 16 Psi                          = 120,000,000,000
       stage 1: 4 Psi + 12 * 117,187,500        = 30e9 + 1,406,250,000 = 31,406,250,000
       stage 2: 2 Psi + 14 * 117,187,500        = 15e9 + 1,640,625,000 = 16,640,625,000
       stage 3: 16 * 117,187,500                = 1,875,000,000 */
    static const uint64_t want[4] = {120000000000ull, 31406250000ull, 16640625000ull, 1875000000ull};
    static const char *paper[4] = {"120.0", "31.4", "16.6", "1.9"}; /* GB as printed in Fig. 1 */
    int s;
    for (s = 0; s < 4; s++) {
        zero_estimate e = est(7500000000ull, 64, s, 0);
        char buf[32];
        ZT_CHECKF(e.device_bytes == want[s], "stage %d: %llu", s, (unsigned long long)e.device_bytes);
        ZT_CHECK(e.params_bytes + e.grads_bytes + e.optimizer_bytes == e.device_bytes);
        ZT_CHECK(e.host_bytes == 0 && e.gather_bytes == 0);
        ZT_CHECK(e.mode == ZERO_ESTIMATE_PAPER && e.stage == s && e.ranks == 64 && e.params == 7500000000ull);
        snprintf(buf, sizeof buf, "%.1f", (double)e.device_bytes / 1e9);
        ZT_CHECKF(strcmp(buf, paper[s]) == 0, "stage %d: %s GB, paper %s GB", s, buf, paper[s]);
    }
    {
        zero_estimate e1 = est(7500000000ull, 64, 1, 0), e2 = est(7500000000ull, 64, 2, 0),
                      e3 = est(7500000000ull, 64, 3, 0);
        ZT_CHECK(e1.params_bytes == 15000000000ull && e1.grads_bytes == 15000000000ull &&
                 e1.optimizer_bytes == 1406250000ull);
        ZT_CHECK(e2.params_bytes == 15000000000ull && e2.grads_bytes == 234375000ull &&
                 e2.optimizer_bytes == 1406250000ull);
        ZT_CHECK(e3.params_bytes == 234375000ull && e3.grads_bytes == 234375000ull &&
                 e3.optimizer_bytes == 1406250000ull);
    }
}

ZT_TEST(paper_uneven_shards_round_up)
{
    /* Psi = 1,000,003, N = 7: S = ceil(Psi/N) = 142,858 (7 * 142,857 = 999,999, rest 4)
       stage 0: 16 * 1,000,003                      = 16,000,048
       stage 1: 4 * 1,000,003 + 12 * 142,858        = 4,000,012 + 1,714,296 = 5,714,308
       stage 2: 2 * 1,000,003 + 14 * 142,858        = 2,000,006 + 2,000,012 = 4,000,018
       stage 3: 16 * 142,858                        = 2,285,728 */
    static const uint64_t want[4] = {16000048ull, 5714308ull, 4000018ull, 2285728ull};
    int s;
    for (s = 0; s < 4; s++) {
        zero_estimate e = est(1000003ull, 7, s, 0);
        ZT_CHECKF(e.device_bytes == want[s], "stage %d: %llu", s, (unsigned long long)e.device_bytes);
    }
    /* N = 1: every stage is plain data parallelism, 16 Psi */
    for (s = 0; s < 4; s++) ZT_CHECK(est(12345ull, 1, s, 0).device_bytes == 16 * 12345ull);
    /* more ranks than parameters: each rank still holds one element of each shard */
    ZT_CHECK(est(3ull, 8, 3, 0).device_bytes == 16ull);
}

ZT_TEST(paper_offload)
{
    /* Psi = 7.5B, N = 64, optimizer state on the host:
       stage 0: device 2 Psi + 2 Psi = 30e9;          host 12 Psi = 90e9 per rank
       stage 1: device 30e9;                          host 12 * 117,187,500 = 1,406,250,000
       stage 2: device 15e9 + 234,375,000;            host 1,406,250,000
       stage 3: device 2 * 234,375,000 = 468,750,000; host 1,406,250,000 */
    static const uint64_t dev[4] = {30000000000ull, 30000000000ull, 15234375000ull, 468750000ull};
    static const uint64_t host[4] = {90000000000ull, 1406250000ull, 1406250000ull, 1406250000ull};
    int s;
    for (s = 0; s < 4; s++) {
        zero_estimate e = est(7500000000ull, 64, s, 1);
        ZT_CHECKF(e.device_bytes == dev[s] && e.host_bytes == host[s] && e.optimizer_bytes == 0,
                  "stage %d: device %llu host %llu", s, (unsigned long long)e.device_bytes,
                  (unsigned long long)e.host_bytes);
        ZT_CHECK(e.params_bytes + e.grads_bytes == e.device_bytes);
    }
}

ZT_TEST(paper_byte_sizes)
{
    /* bf16 params, fp32 grads, K = 16: stage 2, Psi = 1000, N = 3: S = 334
       2 * 1000 + (4 + 16) * 334 = 2000 + 6680 = 8680 */
    zero_estimate_desc d;
    zero_estimate e;
    memset(&d, 0, sizeof d);
    d.params = 1000;
    d.ranks = 3;
    d.stage = 2;
    d.grad_bytes = 4;
    d.optimizer_bytes = 16;
    ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_OK);
    ZT_CHECK(e.device_bytes == 8680 && e.params_bytes == 2000 && e.grads_bytes == 1336 &&
             e.optimizer_bytes == 5344);
}

/* optimizer_dtype = bf16: K = 6. Stage 0, Psi = 1000: (2 + 2 + 6) * 1000 = 10000 (10 Psi);
   stage 1, N = 3: 4 * 1000 + 6 * 334 = 6004; offloaded: the 2004 bytes move to the host. */
ZT_TEST(paper_bf16_optimizer_states)
{
    zero_estimate_desc d;
    zero_estimate e;
    memset(&d, 0, sizeof d);
    d.params = 1000;
    d.ranks = 3;
    d.optimizer_dtype = ZERO_BF16;
    ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_OK);
    ZT_CHECK(e.device_bytes == 10000 && e.optimizer_bytes == 6000);
    d.stage = 1;
    ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_OK);
    ZT_CHECK(e.device_bytes == 6004 && e.optimizer_bytes == 2004);
    d.offload = 1;
    ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_OK);
    ZT_CHECK(e.device_bytes == 4000 && e.host_bytes == 2004);
    d.offload = 0;
    d.optimizer_bytes = 6; /* consistent: allowed */
    ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_OK && e.optimizer_bytes == 2004);
    d.optimizer_bytes = 12; /* contradicts bf16 */
    ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    d.optimizer_bytes = 0;
    d.optimizer_dtype = ZERO_F16;
    ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    d.optimizer_dtype = ZERO_BF16;
    d.mode = ZERO_ESTIMATE_DEEPSPEED;
    d.stage = 2;
    ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
}

static zero_estimate ds(uint64_t params, int ranks, int gpn, int stage, int offload,
                        int offload_params, int no_zero_init, uint64_t largest)
{
    zero_estimate_desc d;
    zero_estimate e;
    memset(&d, 0, sizeof d);
    memset(&e, 0xff, sizeof e);
    d.mode = ZERO_ESTIMATE_DEEPSPEED;
    d.params = params;
    d.ranks = ranks;
    d.gpus_per_node = gpn;
    d.stage = stage;
    d.offload = offload;
    d.offload_params = offload_params;
    d.no_zero_init = no_zero_init;
    d.largest_layer_params = largest;
    if (zero_estimate_compute(&d, &e) != ZERO_OK) fprintf(stderr, "  ds failed: %s\n", zero_last_error());
    return e;
}

/* DeepSpeed's own example (docs/code-docs/source/memory.rst): t5-3b as 2851e6 params,
   32e6 largest layer, 1 node x 8 GPUs. Its printout (GiB, 2 decimals) for the cold
   estimator: 71.69/0.12, 127.45/0.12, 63.72/0.78, 127.45/0.78, 1.43/6.09, 127.45/6.09. */
ZT_TEST(deepspeed_stage3_t5_3b)
{
    struct {
        int offload, offload_params, no_zero_init;
        uint64_t cpu, gpu;
        const char *cpu_gib, *gpu_gib;
    } rows[6] = {
        /* by hand (P = 2,851,000,000, L = 32,000,000, 8 GPUs, 1 node, factor 1.5):
           gpu: 4L = 128,000,000; + int(2P/8) = 712,750,000; + int(18P/8) = 6,414,750,000
           cpu: P*18*1*1.5 = 76,977,000,000; P*max(32,18)*1.5 = 136,848,000,000;
                P*16*1.5 = 68,424,000,000; L*4*8*1.5 = 1,536,000,000; P*4*8*1.5 = 136,848,000,000 */
        {1, 1, 0, 76977000000ull, 128000000ull, "71.69", "0.12"},
        {1, 1, 1, 136848000000ull, 128000000ull, "127.45", "0.12"},
        {1, 0, 0, 68424000000ull, 840750000ull, "63.72", "0.78"},
        {1, 0, 1, 136848000000ull, 840750000ull, "127.45", "0.78"},
        {0, 0, 0, 1536000000ull, 6542750000ull, "1.43", "6.09"},
        {0, 0, 1, 136848000000ull, 6542750000ull, "127.45", "6.09"},
    };
    int i;
    for (i = 0; i < 6; i++) {
        zero_estimate e = ds(2851000000ull, 8, 8, 3, rows[i].offload, rows[i].offload_params,
                             rows[i].no_zero_init, 32000000ull);
        char c[32], g[32];
        ZT_CHECKF(e.host_bytes == rows[i].cpu && e.device_bytes == rows[i].gpu,
                  "row %d: cpu %llu gpu %llu", i, (unsigned long long)e.host_bytes,
                  (unsigned long long)e.device_bytes);
        ZT_CHECK(e.gather_bytes == 128000000ull);
        ZT_CHECK(e.params_bytes == 0 && e.grads_bytes == 0 && e.optimizer_bytes == 0);
        snprintf(c, sizeof c, "%.2f", (double)e.host_bytes / 1073741824.0);
        snprintf(g, sizeof g, "%.2f", (double)e.device_bytes / 1073741824.0);
        ZT_CHECKF(strcmp(c, rows[i].cpu_gib) == 0 && strcmp(g, rows[i].gpu_gib) == 0,
                  "row %d: %s/%s GiB, DeepSpeed printed %s/%s", i, c, g, rows[i].cpu_gib,
                  rows[i].gpu_gib);
    }
}

ZT_TEST(deepspeed_stage2)
{
    zero_estimate e;
    /* t5-3b, 8 GPUs: offload: gpu 2P = 5,702,000,000 (DeepSpeed printed 5.31 GiB),
       cpu P * max(4*8, 16) * 1.5 = 136,848,000,000 (127.45 GiB) */
    e = ds(2851000000ull, 8, 8, 2, 1, 0, 0, 0);
    ZT_CHECK(e.device_bytes == 5702000000ull && e.host_bytes == 136848000000ull);
    /* no offload (formula after PR #5099): 2P + int(18P/8) = 5,702,000,000 + 6,414,750,000
       = 12,116,750,000; cpu P * 4 * 8 * 1.5 = 136,848,000,000 */
    e = ds(2851000000ull, 8, 8, 2, 0, 0, 0, 0);
    ZT_CHECK(e.device_bytes == 12116750000ull && e.host_bytes == 136848000000ull);
    /* int() truncates: Psi = 1,000,003, N = 7: 18 Psi / 7 = 2,571,436.28 -> 2,571,436;
       + 2 Psi = 4,571,442. cpu with 1 GPU per node: 1,000,003 * 4 * 1 * 1.5 = 6,000,018 */
    e = ds(1000003ull, 7, 0, 2, 0, 0, 0, 0);
    ZT_CHECK(e.device_bytes == 4571442ull && e.host_bytes == 6000018ull);
    /* offload on 64 GPUs: DeepSpeed's code multiplies by 4 * total_gpus (not per node):
       7.5e9 * max(256, 16) * 1.5 = 2,880,000,000,000 */
    e = ds(7500000000ull, 64, 8, 2, 1, 0, 0, 0);
    ZT_CHECK(e.device_bytes == 15000000000ull && e.host_bytes == 2880000000000ull);
}

ZT_TEST(deepspeed_stage3_multi_node)
{
    zero_estimate e;
    /* 64 ranks = 8 nodes x 8: gpus_factor = 1/8. zero.Init, all offloaded:
       cpu = 7.5e9 * 18 * 0.125 * 1.5 = 25,312,500,000; gpu = 4 * 5e8 = 2e9 */
    e = ds(7500000000ull, 64, 8, 3, 1, 1, 0, 500000000ull);
    ZT_CHECK(e.host_bytes == 25312500000ull && e.device_bytes == 2000000000ull);
    /* without zero.Init: max(4*8, 18/8) = 32: 7.5e9 * 32 * 1.5 = 360e9 */
    e = ds(7500000000ull, 64, 8, 3, 1, 1, 1, 500000000ull);
    ZT_CHECK(e.host_bytes == 360000000000ull);
    /* 1 GPU per node on 2 nodes, without zero.Init, params on GPU: max(4, 16/2 = 8.0) = 8.0:
       1000 * 8.0 * 1.5 = 12000; gpu = 4*10 + int(2*1000/2) = 1040 */
    e = ds(1000ull, 2, 1, 3, 1, 0, 1, 10ull);
    ZT_CHECK(e.host_bytes == 12000ull && e.device_bytes == 1040ull);
    /* 3 nodes: gpus_factor = 1/3 is inexact in binary; DeepSpeed's double arithmetic gives
       int(7 * 16 * (1/3) * 1.5) = int(55.99999999999999) = 55 where exact arithmetic gives 56;
       gpu = 4 * 1 + int(2 * 7 / 3) = 8 */
    e = ds(7ull, 3, 1, 3, 1, 0, 0, 1ull);
    ZT_CHECKF(e.host_bytes == 55ull && e.device_bytes == 8ull, "%llu %llu",
              (unsigned long long)e.host_bytes, (unsigned long long)e.device_bytes);
}

/* ---- the inverse ---- */

/* The forward query accepts Psi = p and its device bytes fit. */
static int forward_fits(zero_estimate_desc d, uint64_t p, uint64_t memory)
{
    zero_estimate e;
    d.params = p;
    return zero_estimate_compute(&d, &e) == ZERO_OK && e.device_bytes <= memory;
}

/* The inverse agrees with the forward query: OK with psi: psi is accepted and fits and
   psi + 1 does not; OVERFLOW: the largest Psi the forward query accepts and fits (found
   here by bisection over the forward query alone, monotone in Psi) is followed by one the
   forward query refuses with OVERFLOW, i.e. the bound is the host byte count, not the
   device memory. */
static int check_inverse(zero_estimate_desc d, uint64_t memory)
{
    uint64_t psi = 0;
    zero_estimate e;
    zero_result r = zero_estimate_max_params(&d, memory, &psi);
    if (r == ZERO_ERROR_OVERFLOW) {
        uint64_t lo = d.mode == ZERO_ESTIMATE_DEEPSPEED && d.stage == 3 ? d.largest_layer_params : 1;
        uint64_t hi = ZERO_ESTIMATE_MAX_PARAMS;
        if (forward_fits(d, lo, memory)) {
            if (forward_fits(d, hi, memory)) return 4; /* everything fits: no overflow */
            while (hi - lo > 1) {
                uint64_t mid = lo + (hi - lo) / 2;
                if (forward_fits(d, mid, memory)) lo = mid;
                else hi = mid;
            }
        } else {
            hi = lo; /* the smallest model itself */
        }
        d.params = hi;
        return zero_estimate_compute(&d, &e) == ZERO_ERROR_OVERFLOW ? 0 : 5;
    }
    if (r != ZERO_OK) return 1;
    if (psi == 0) { /* the smallest model must not fit */
        d.params = d.mode == ZERO_ESTIMATE_DEEPSPEED && d.stage == 3 ? d.largest_layer_params : 1;
        return zero_estimate_compute(&d, &e) == ZERO_OK && e.device_bytes <= memory;
    }
    d.params = psi;
    if (zero_estimate_compute(&d, &e) != ZERO_OK || e.device_bytes > memory) return 2;
    if (psi == ZERO_ESTIMATE_MAX_PARAMS) return 0;
    d.params = psi + 1;
    if (zero_estimate_compute(&d, &e) == ZERO_OK && e.device_bytes <= memory) return 3;
    return 0;
}

ZT_TEST(inverse_property_and_closed_forms)
{
    zero_estimate_desc d;
    uint64_t psi;
    int i, bad = 0, n = zt_quick() ? 2000 : 20000;
    memset(&d, 0, sizeof d);
    /* closed forms: stage 0: floor(M / 16); stage 3, N = 1024, M = 32e9:
       16 * ceil(Psi/1024) <= 32e9 <=> Psi <= 1024 * 2e9 = 2,048,000,000,000 */
    d.ranks = 1024;
    d.stage = 0;
    ZT_CHECK(zero_estimate_max_params(&d, 32000000000ull, &psi) == ZERO_OK && psi == 2000000000ull);
    d.stage = 3;
    ZT_CHECK(zero_estimate_max_params(&d, 32000000000ull, &psi) == ZERO_OK && psi == 2048000000000ull);
    d.stage = 3;
    ZT_CHECK(zero_estimate_max_params(&d, 32000000001ull, &psi) == ZERO_OK && psi == 2048000000000ull);
    ZT_CHECK(zero_estimate_max_params(&d, 15, &psi) == ZERO_OK && psi == 0);
    ZT_CHECK(zero_estimate_max_params(&d, 16, &psi) == ZERO_OK && psi == 1024);
    /* stage 1, N = 4, M = 1000: 4 Psi + 12 ceil(Psi/4) <= 1000: Psi = 142 gives 568 + 432 =
       1000; Psi = 143 gives 572 + 432 = 1004 */
    d.ranks = 4;
    d.stage = 1;
    ZT_CHECK(zero_estimate_max_params(&d, 1000, &psi) == ZERO_OK && psi == 142);
    /* random configurations, both modes */
    zt_seed(3);
    for (i = 0; i < n; i++) {
        uint64_t r = zt_rand64(), mem = zt_rand64() >> (zt_rand64() % 64);
        memset(&d, 0, sizeof d);
        d.ranks = 1 + (int)(r % 4096);
        d.stage = (int)((r >> 12) % 4);
        d.offload = (int)((r >> 14) & 1);
        if ((r >> 15) & 1) {
            d.mode = ZERO_ESTIMATE_DEEPSPEED;
            d.stage = 2 + (d.stage & 1);
            d.gpus_per_node = (r >> 16) & 1 ? 1 : 0;
            d.largest_layer_params = 1 + (zt_rand64() >> (20 + zt_rand64() % 44));
            d.offload_params = d.stage == 3 && d.offload && ((r >> 17) & 1);
        } else if ((r >> 18) & 1) {
            d.param_bytes = 1 + (int)((r >> 20) % 8);
            d.grad_bytes = 1 + (int)((r >> 24) % 8);
            d.optimizer_bytes = 1 + (int)((r >> 28) % 32);
        }
        if (check_inverse(d, mem)) {
            if (bad++ < 5)
                fprintf(stderr, "  inverse wrong: mode %d stage %d N %d offload %d mem %llu\n",
                        (int)d.mode, d.stage, d.ranks, d.offload, (unsigned long long)mem);
        }
    }
    ZT_CHECKF(bad == 0, "%d of %d", bad, n);
}

ZT_TEST(inverse_deepspeed_edges)
{
    zero_estimate_desc d;
    uint64_t psi = 12345;
    memset(&d, 0, sizeof d);
    d.mode = ZERO_ESTIMATE_DEEPSPEED;
    d.ranks = 8;
    d.stage = 3;
    d.offload = 1;
    d.offload_params = 1;
    d.largest_layer_params = 1000;
    /* everything on the host: the GPU holds 4 * largest layer whatever Psi is */
    ZT_CHECK(zero_estimate_max_params(&d, 4000, &psi) == ZERO_OK && psi == ZERO_ESTIMATE_MAX_PARAMS);
    ZT_CHECK(zero_estimate_max_params(&d, 3999, &psi) == ZERO_OK && psi == 0);
    /* params on the GPU: 4000 + int(2 Psi / 8) <= 5000 <=> Psi <= 4003 */
    d.offload_params = 0;
    ZT_CHECK(zero_estimate_max_params(&d, 5000, &psi) == ZERO_OK && psi == 4003);
    ZT_CHECK(check_inverse(d, 5000) == 0);
}

/* An extreme additional_buffer_factor makes DeepSpeed's host bytes overflow long before the
   device is full: the inverse used to take that for "does not fit" and answered the last
   Psi before the overflow (or 0); it must say OVERFLOW, as the forward query does. */
ZT_TEST(inverse_host_overflow_is_overflow)
{
    static const double factors[] = {1e300, 1e12, 1e8};
    zero_estimate_desc d;
    zero_estimate e;
    uint64_t psi = 77;
    size_t i;
    memset(&d, 0, sizeof d);
    d.mode = ZERO_ESTIMATE_DEEPSPEED;
    d.ranks = 8;
    d.stage = 2;
    d.offload = 1; /* gpu 2 Psi; cpu Psi * max(4 * 8, 16) * factor */
    for (i = 0; i < 3; i++) {
        d.additional_buffer_factor = factors[i];
        ZT_CHECKF(zero_estimate_max_params(&d, 80000000000ull, &psi) == ZERO_ERROR_OVERFLOW,
                  "factor %g: %llu", factors[i], (unsigned long long)psi);
        ZT_CHECK(psi == 77 && strstr(zero_last_error(), "overflow") != NULL);
        ZT_CHECK(check_inverse(d, 80000000000ull) == 0);
        d.params = 40000000000ull; /* the device answer: 2 Psi = 80e9 */
        ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_ERROR_OVERFLOW);
    }
    /* a factor whose host bytes fit at the device answer: an ordinary answer */
    d.additional_buffer_factor = 1e3;
    ZT_CHECK(zero_estimate_max_params(&d, 80000000000ull, &psi) == ZERO_OK && psi == 40000000000ull);
    ZT_CHECK(check_inverse(d, 80000000000ull) == 0);
    /* a memory so small that nothing fits stays 0, whatever the host bytes */
    d.additional_buffer_factor = 1e300;
    ZT_CHECK(zero_estimate_max_params(&d, 1, &psi) == ZERO_OK && psi == 0);
    /* every Psi fits the device (stage 3, everything offloaded): the answer 2^53 must be
       one the forward query accepts */
    d.stage = 3;
    d.offload_params = 1;
    d.largest_layer_params = 1000;
    d.additional_buffer_factor = 1e6;
    ZT_CHECK(zero_estimate_max_params(&d, 4000, &psi) == ZERO_ERROR_OVERFLOW);
    ZT_CHECK(check_inverse(d, 4000) == 0);
    d.additional_buffer_factor = 0;
    ZT_CHECK(zero_estimate_max_params(&d, 4000, &psi) == ZERO_OK && psi == ZERO_ESTIMATE_MAX_PARAMS);
}

/* ---- errors ---- */

ZT_TEST(errors)
{
    zero_estimate_desc d, good;
    zero_estimate e;
    uint64_t psi = 77;
    memset(&good, 0, sizeof good);
    good.params = 1000;
    good.ranks = 4;
    good.stage = 1;
    memset(&e, 0, sizeof e);
    e.device_bytes = 4242;
#define BAD(field_stmt, code)                                                                \
    do {                                                                                     \
        d = good;                                                                            \
        field_stmt;                                                                          \
        ZT_CHECKF(zero_estimate_compute(&d, &e) == (code), "%s: %s", #field_stmt,           \
                  zero_last_error());                                                        \
        ZT_CHECK(e.device_bytes == 4242);                                                    \
    } while (0)
    BAD(d.ranks = 0, ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "ranks") != NULL);
    BAD(d.ranks = -3, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.stage = 4, ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "stage") != NULL);
    BAD(d.stage = -1, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.params = 0, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.params = ZERO_ESTIMATE_MAX_PARAMS + 1, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.mode = (zero_estimate_mode)7, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.param_bytes = -1, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.optimizer_bytes = 1025, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.gpus_per_node = -1, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.gpus_per_node = 3, ZERO_ERROR_INVALID_ARGUMENT); /* does not divide 4 */
    BAD(d.additional_buffer_factor = NAN, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.additional_buffer_factor = -1.0, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.additional_buffer_factor = INFINITY, ZERO_ERROR_INVALID_ARGUMENT);
    BAD(d.offload_params = 1, ZERO_ERROR_INVALID_ARGUMENT); /* paper mode */
    BAD((d.mode = ZERO_ESTIMATE_DEEPSPEED, d.stage = 1), ZERO_ERROR_INVALID_ARGUMENT);
    BAD((d.mode = ZERO_ESTIMATE_DEEPSPEED, d.stage = 3), ZERO_ERROR_INVALID_ARGUMENT); /* no layer */
    BAD((d.mode = ZERO_ESTIMATE_DEEPSPEED, d.stage = 3, d.largest_layer_params = 1001),
        ZERO_ERROR_INVALID_ARGUMENT);
    BAD((d.mode = ZERO_ESTIMATE_DEEPSPEED, d.stage = 3, d.largest_layer_params = 10, d.offload_params = 1),
        ZERO_ERROR_INVALID_ARGUMENT); /* offload_params without offload */
    /* 3072 bytes per parameter * 2^53 parameters does not fit 64 bits */
    BAD((d.params = ZERO_ESTIMATE_MAX_PARAMS, d.stage = 0, d.param_bytes = 1024, d.grad_bytes = 1024,
         d.optimizer_bytes = 1024), ZERO_ERROR_OVERFLOW);
    BAD((d.mode = ZERO_ESTIMATE_DEEPSPEED, d.stage = 2, d.offload = 1, d.params = ZERO_ESTIMATE_MAX_PARAMS,
         d.ranks = 1 << 30), ZERO_ERROR_OVERFLOW); /* 4 * total_gpus * Psi */
    ZT_CHECK(zero_estimate_compute(NULL, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_estimate_compute(&good, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_estimate_max_params(&good, 100, NULL) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(zero_estimate_max_params(NULL, 100, &psi) == ZERO_ERROR_INVALID_ARGUMENT);
    d = good;
    d.ranks = 0;
    ZT_CHECK(zero_estimate_max_params(&d, 100, &psi) == ZERO_ERROR_INVALID_ARGUMENT && psi == 77);
    /* the inverse ignores params, even 0 */
    d = good;
    d.params = 0;
    ZT_CHECK(zero_estimate_max_params(&d, 100, &psi) == ZERO_OK);
    /* defaults: a zero descriptor but for the required fields equals the explicit values */
    {
        zero_estimate a, b;
        d = good;
        zero_estimate_compute(&d, &a);
        d.mode = ZERO_ESTIMATE_PAPER;
        d.param_bytes = 2;
        d.grad_bytes = 2;
        d.optimizer_bytes = 12;
        d.gpus_per_node = 1;
        d.additional_buffer_factor = 1.5;
        zero_estimate_compute(&d, &b);
        ZT_CHECK(a.mode == b.mode && a.stage == b.stage && a.ranks == b.ranks && a.params == b.params &&
                 a.params_bytes == b.params_bytes && a.grads_bytes == b.grads_bytes &&
                 a.optimizer_bytes == b.optimizer_bytes && a.device_bytes == b.device_bytes &&
                 a.host_bytes == b.host_bytes && a.gather_bytes == b.gather_bytes);
    }
#undef BAD
}

int main(void)
{
    ZT_RUN(paper_figure1);
    ZT_RUN(paper_uneven_shards_round_up);
    ZT_RUN(paper_offload);
    ZT_RUN(paper_byte_sizes);
    ZT_RUN(paper_bf16_optimizer_states);
    ZT_RUN(deepspeed_stage3_t5_3b);
    ZT_RUN(deepspeed_stage2);
    ZT_RUN(deepspeed_stage3_multi_node);
    ZT_RUN(inverse_property_and_closed_forms);
    ZT_RUN(inverse_deepspeed_edges);
    ZT_RUN(inverse_host_overflow_is_overflow);
    ZT_RUN(errors);
    return zt_summary();
}
