/* bench/bench_infinity.c at a small Psi: the same code that trains a model larger than the
   machine's memory (params, gradients and optimizer state off the device) here trains
   Psi = 393216 on 2 ranks under a device budget smaller than the gradient shard alone, and
   must give the plain run's losses and final params bit for bit, with a falling loss. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#define ZERO_BENCH_INFINITY
#include "bench/bench_common.h" /* bench_infinity's model and training loop (inf_train) */
#include "tests/zt.h"

ZT_TEST(infinity_small_psi_equals_the_plain_run)
{
    char dir[64];
    inf_cfg c;
    inf_result off, plain;
    int s;
    snprintf(dir, sizeof dir, "/tmp/zero-test-infinity-XXXXXX");
    ZT_CHECK(mkdtemp(dir) != NULL);
    memset(&c, 0, sizeof c);
    c.params = 393216;
    c.groups = 12;
    c.ranks = 2;
    c.steps = 3;
    c.dir = dir;
    c.budget = 300000; /* the bf16 gradient shard alone is 2 Psi / N = 393216 bytes */
    ZT_CHECKF(inf_train(&c, &off) == ZERO_OK, "%s", off.err);
    c.plain = 1;
    ZT_CHECKF(inf_train(&c, &plain) == ZERO_OK, "%s", plain.err);
    if (off.rc != ZERO_OK || plain.rc != ZERO_OK) return;
    for (s = 0; s <= c.steps; s++)
        ZT_CHECKF(off.loss[s] == plain.loss[s], "step %d: loss %.9g vs %.9g", s, off.loss[s], plain.loss[s]);
    ZT_CHECK(off.param_hash == plain.param_hash);
    ZT_CHECKF(off.loss[c.steps] < 0.5 * off.loss[0], "loss %.6g -> %.6g", off.loss[0], off.loss[c.steps]);
    /* nothing of the model on the device, within the budget; the states on NVMe */
    ZT_CHECK(off.dev.bytes[ZERO_MEM_PARAM] == 0 && off.dev.bytes[ZERO_MEM_GRAD] == 0 &&
             off.dev.bytes[ZERO_MEM_MASTER] == 0);
    ZT_CHECKF(off.dev.peak_total_bytes <= c.budget, "device peak %zu", off.dev.peak_total_bytes);
    ZT_CHECK(off.nvme.bytes[ZERO_MEM_MASTER] == 4 * (size_t)c.params / 2);
    ZT_CHECK(plain.dev.total_bytes > 16 * (size_t)c.params / 2);
    /* steps after the first move the optimizer records both ways */
    ZT_CHECK(off.io_read[1] >= 12 * (size_t)c.params / 2 && off.io_written[1] >= 12 * (size_t)c.params / 2);
    ZT_CHECK(rmdir(dir) == 0);
}

/* --grads-nvme: the gradients on NVMe too give the same losses and params as the plain run
   and as the host tier of the gradients; the host holds staging instead of the gradient
   shard (which is in the NVMe tier), and the same host bytes at twice the Psi. */
ZT_TEST(infinity_gradients_on_nvme)
{
    char dir[64];
    inf_cfg c;
    inf_result nv, host, plain, big;
    int s;
    snprintf(dir, sizeof dir, "/tmp/zero-test-infinity-XXXXXX");
    ZT_CHECK(mkdtemp(dir) != NULL);
    memset(&c, 0, sizeof c);
    c.params = 393216;
    c.groups = 12;
    c.ranks = 2;
    c.steps = 3;
    c.dir = dir;
    c.budget = 300000;
    ZT_CHECKF(inf_train(&c, &host) == ZERO_OK, "%s", host.err);
    c.grads_nvme = 1;
    ZT_CHECKF(inf_train(&c, &nv) == ZERO_OK, "%s", nv.err);
    c.plain = 1;
    ZT_CHECKF(inf_train(&c, &plain) == ZERO_OK, "%s", plain.err);
    c.plain = 0;
    c.params *= 2; /* twice the layers of the same size */
    c.groups *= 2;
    ZT_CHECKF(inf_train(&c, &big) == ZERO_OK, "%s", big.err);
    if (nv.rc != ZERO_OK || host.rc != ZERO_OK || plain.rc != ZERO_OK || big.rc != ZERO_OK) return;
    for (s = 0; s <= c.steps; s++)
        ZT_CHECKF(nv.loss[s] == plain.loss[s] && nv.loss[s] == host.loss[s], "step %d: loss %.9g vs %.9g, %.9g",
                  s, nv.loss[s], plain.loss[s], host.loss[s]);
    ZT_CHECK(nv.param_hash == plain.param_hash && nv.param_hash == host.param_hash);
    /* the bf16 gradient shard (2 Psi / N) left host memory for the NVMe tier */
    ZT_CHECK(host.host.bytes[ZERO_MEM_GRAD] >= 393216 && nv.nvme.bytes[ZERO_MEM_GRAD] == 393216);
    ZT_CHECKF(nv.host.total_bytes < host.host.total_bytes, "host %zu vs %zu", nv.host.total_bytes,
              host.host.total_bytes);
    ZT_CHECKF(big.host.total_bytes == nv.host.total_bytes, "host %zu at 2 Psi vs %zu", big.host.total_bytes,
              nv.host.total_bytes);
    ZT_CHECK(big.nvme.bytes[ZERO_MEM_GRAD] == 2 * nv.nvme.bytes[ZERO_MEM_GRAD]);
    ZT_CHECK(rmdir(dir) == 0);
}

int main(void)
{
    ZT_RUN(infinity_small_psi_equals_the_plain_run);
    ZT_RUN(infinity_gradients_on_nvme);
    return zt_summary();
}
