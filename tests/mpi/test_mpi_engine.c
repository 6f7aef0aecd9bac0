/* test_mpi_engine.c - the engine over zero_mpi.h under mpirun equals the engine over the
   local comm (threads) at the same N, bit for bit.

   Each process runs the threads reference in-process (tests/engine_common.h's ec_run:
   'world' ranks as threads) and then its own rank of the same run over MPI (ec_rank_fn with
   the MPI comm), and compares what its rank holds: master weights, m, v and params of
   every element it owns, every step's zero_step_info (loss scale, skipped, grad norm) and
   every step's traffic. Stages 0-3, fp16, bf16 and fp32, with and without gradient accumulation,
   an fp32 gradient-communication dtype, and a NaN step. Then an injected failure on one
   rank: the others fail fast (ZERO_ERROR_COMM), nobody hangs. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#define ZERO_MPI_IMPLEMENTATION
#include "zero_mpi.h"
#include "tests/mpi/zt_mpi.h"
#include "tests/engine_common.h"
#include "tests/mpi/zt_mpi_engine.h"

static zero_comm *new_comm(int timeout_ms)
{
    zero_mpi_desc d;
    zero_comm *c = NULL;
    memset(&d, 0, sizeof d);
    d.timeout_ms = timeout_ms;
    if (zero_mpi_create(&d, &c) != ZERO_OK) fprintf(stderr, "rank %d: %s\n", zm_rank, zero_last_error());
    return c;
}


static int is_ff(const unsigned char *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (p[i] != 0xff) return 0;
    return 1;
}

/* Compares this rank's part of got with the reference; checks across ranks that every
   master / m / v element is held by exactly one rank and every param element by some. */
static void compare(const ec_cfg *c, const ec_result *ref, const ec_result *got, const char *label)
{
    size_t esz = zero_dtype_size(c->dtype);
    long long held[2] = {0, 0}, total = 0, all[2];
    int t, s, bad = 0;
    ZT_CHECKF(ref->rc == ZERO_OK, "%s: threads reference failed: %s", label, ref->err);
    ZT_CHECKF(got->rc == ZERO_OK, "rank %d: %s: MPI run failed: %s", zm_rank, label, got->err);
    if (ref->rc != ZERO_OK || got->rc != ZERO_OK) return;
    for (t = 0; t < c->ntensors; t++) {
        size_t i, n = c->sizes[t];
        unsigned char *cover = (unsigned char *)calloc(n, 1), *cover_all = (unsigned char *)calloc(n, 1);
        total += (long long)n;
        for (i = 0; i < n; i++) {
            const float *states[3] = {got->master[t], got->m[t], got->v[t]};
            const float *refs[3] = {ref->master[t], ref->m[t], ref->v[t]};
            int k;
            if (!is_ff((const unsigned char *)&got->master[t][i], 4)) {
                held[0]++;
                for (k = 0; k < 3; k++)
                    if (memcmp(&states[k][i], &refs[k][i], 4) != 0 && bad++ < 5)
                        ZT_CHECKF(0, "rank %d: %s: tensor %d element %zu: %s differs (%.9g vs %.9g)", zm_rank,
                                  label, t, i, k == 0 ? "master" : k == 1 ? "m" : "v", (double)states[k][i],
                                  (double)refs[k][i]);
            }
            if (!is_ff(got->param[t] + i * esz, esz)) {
                cover[i] = 1;
                if (memcmp(got->param[t] + i * esz, ref->param[t] + i * esz, esz) != 0 && bad++ < 5)
                    ZT_CHECKF(0, "rank %d: %s: tensor %d element %zu: param differs", zm_rank, label, t, i);
            }
        }
        MPI_Allreduce(cover, cover_all, (int)n, MPI_UNSIGNED_CHAR, MPI_MAX, MPI_COMM_WORLD);
        for (i = 0; i < n; i++) held[1] += cover_all[i];
        free(cover);
        free(cover_all);
    }
    MPI_Allreduce(held, all, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    all[1] = held[1]; /* already a union */
    ZT_CHECKF(all[0] == total, "%s: master elements held over all ranks %lld, want %lld", label, all[0], total);
    ZT_CHECKF(all[1] == total, "%s: param elements held %lld, want %lld", label, all[1], total);
    for (s = 0; s < c->steps; s++) {
        ZT_CHECKF(memcmp(&got->info[zm_rank][s], &ref->info[zm_rank][s], sizeof got->info[0][0]) == 0,
                  "rank %d: %s: step %d info differs (norm %.9g vs %.9g)", zm_rank, label, s,
                  (double)got->info[zm_rank][s].grad_norm, (double)ref->info[zm_rank][s].grad_norm);
        ZT_CHECKF(memcmp(&got->traffic_last[zm_rank][s], &ref->traffic_last[zm_rank][s],
                         sizeof got->traffic_last[0][0]) == 0,
                  "rank %d: %s: step %d traffic differs", zm_rank, label, s);
    }
}

static zero_comm *g_comm;

static void check_cfg(ec_cfg *c, const char *label)
{
    ec_ctx ctx;
    ec_result *ref = ec_run(c), *got = run_mpi_rank(c, &ctx, g_comm, ec_rank_fn);
    compare(c, ref, got, label);
    ec_result_free(ref);
    ec_result_free(got);
}

ZT_TEST(engine_mpi_equals_threads)
{
    static const zero_dtype dts[] = {ZERO_F16, ZERO_BF16};
    int st, d, acc, steps = zt_quick() ? 2 : 3;
    for (d = 0; d < 2; d++)
        for (acc = 1; acc <= 3; acc += 2)
            for (st = 0; st <= 3; st++) {
                ec_cfg c;
                char label[96];
                ec_cfg_init(&c, st, zm_world, dts[d], acc, steps);
                if (st == 3) c.max_live = 0; /* default pool */
                snprintf(label, sizeof label, "stage %d %s accum %d", st, zero_dtype_name(dts[d]), acc);
                check_cfg(&c, label);
            }
}

/* fp32 params and gradients: sums of fp32 values depend on their order (sums of 2-4
   fp16/bf16 values in fp32 mostly do not), so this is where a wrong reduction order shows. */
ZT_TEST(engine_mpi_fp32_params)
{
    int st;
    for (st = 0; st <= 3; st++) {
        ec_cfg c;
        char label[96];
        ec_cfg_init(&c, st, zm_world, ZERO_F32, 2, 3);
        snprintf(label, sizeof label, "stage %d f32 accum 2", st);
        check_cfg(&c, label);
    }
}

ZT_TEST(engine_mpi_fp32_comm_and_nan_step)
{
    int st;
    for (st = 0; st <= 3; st += 3) {
        ec_cfg c;
        char label[96];
        ec_cfg_init(&c, st, zm_world, ZERO_F16, 2, 4);
        c.comm_dtype = ZERO_F32;
        c.nfault = 1;
        c.fault_steps[0] = 1;
        c.fault_rank = zm_world - 1;
        c.bucket = 64; /* several reduce buckets per group */
        snprintf(label, sizeof label, "stage %d f16, fp32 comm, NaN at step 1", st);
        check_cfg(&c, label);
    }
}

/* An injected failure: rank 1's comm fails its 5th collective (tests/engine_common.h's
   wrapper); its engine returns the error and the rank destroys its comm. The other ranks'
   next collective learns that rank 1 left: ZERO_ERROR_COMM, long before the timeout. */
ZT_TEST(engine_failure_on_one_rank)
{
    zero_comm *comm = new_comm(20000);
    ec_cfg c;
    ec_ctx ctx;
    ec_result *got;
    double t0 = zt_now_ms(), dt;
    if (!comm) return;
    ec_cfg_init(&c, 3, zm_world, ZERO_F16, 1, 3);
    ec_wrap_reset(zm_rank == 1 ? 4 : -1);
    c.wrap_ops = &ec_wrap_ops;
    got = run_mpi_rank(&c, &ctx, comm, ec_rank_fn);
    zero_comm_destroy(comm);
    dt = zt_now_ms() - t0;
    ZT_CHECKF(got->rc != ZERO_OK, "rank %d: the run succeeded", zm_rank);
    if (zm_rank == 1) ZT_CHECKF(strstr(got->err, "injected"), "rank 1: %s", got->err);
    else
        ZT_CHECKF(got->rc == ZERO_ERROR_COMM && strstr(got->err, "rank 1 left the group"), "rank %d: %s: %s",
                  zm_rank, zero_result_string(got->rc), got->err);
    ZT_CHECKF(dt < 10000, "rank %d: took %.0f ms", zm_rank, dt);
    ec_result_free(got);
    ec_wrap_reset(-1);
}

/* zero_engine_allreduce with a count that differs on the last rank, at every boundary of
   its 64-byte pieces (and different dtypes and ops): ZERO_ERROR_MISMATCH on every process,
   no value changed, no wait for the timeout; equal calls sum correctly. The comm's tag
   carries the whole count (zero_mpi.h's signature field TAGCOUNT). */
static zero_result allreduce_engine(zero_device **dev, zero_engine **e)
{
    zero_engine_desc d;
    zero_result r = zero_host_device_create(NULL, dev);
    if (r) return r;
    memset(&d, 0, sizeof d);
    d.stage = 2;
    d.device = *dev;
    d.comm = g_comm;
    if ((r = zero_engine_create(&d, e))) return r;
    if ((r = zero_engine_add_tensor(*e, "w", 64, 0, 0, NULL))) return r;
    return zero_engine_commit(*e);
}

ZT_TEST(engine_allreduce_counts_differ)
{
    static const size_t f64_counts[] = {0, 1, 7, 8, 9, 15, 16, 17, 40};
    size_t i, j, k;
    double v[40], v0[40];
    for (i = 0; i < 9; i++)
        for (j = 0; j < 11; j++) {
            zero_device *dev = NULL;
            zero_engine *e = NULL;
            size_t count = f64_counts[i];
            zero_dtype dt = ZERO_F64;
            zero_op op = ZERO_OP_SUM;
            zero_result r;
            double t0 = zt_now_ms();
            if (j < 9 && f64_counts[j] == count) continue;
            if (zm_rank == zm_world - 1) {
                if (j < 9) count = f64_counts[j];
                else if (j == 9) dt = ZERO_F32; /* same count, another dtype */
                else op = ZERO_OP_MAX;          /* same count, another op */
            }
            for (k = 0; k < 40; k++) v[k] = v0[k] = zm_rank + 0.25 * (double)k;
            r = allreduce_engine(&dev, &e);
            ZT_CHECKF(r == ZERO_OK, "rank %d: %s", zm_rank, zero_last_error());
            if (r == ZERO_OK) {
                r = zero_engine_allreduce(e, v, count, dt, op);
                ZT_CHECKF(r == ZERO_ERROR_MISMATCH, "rank %d, case %zu/%zu: %s (%s)", zm_rank, i, j,
                          zero_result_string(r), zero_last_error());
                ZT_CHECKF(memcmp(v, v0, sizeof v) == 0, "rank %d, case %zu/%zu: values changed", zm_rank, i, j);
                ZT_CHECKF(zt_now_ms() - t0 < 10000, "rank %d: took %.0f ms", zm_rank, zt_now_ms() - t0);
            }
            zero_engine_destroy(e);
            zero_device_destroy(dev);
        }
    { /* equal calls still work: a sum across the piece boundary */
        zero_device *dev = NULL;
        zero_engine *e = NULL;
        zero_result r = allreduce_engine(&dev, &e);
        for (k = 0; k < 17; k++) v[k] = zm_rank + 0.25 * (double)k;
        if (r == ZERO_OK) r = zero_engine_allreduce(e, v, 17, ZERO_F64, ZERO_OP_SUM);
        ZT_CHECKF(r == ZERO_OK, "rank %d: %s", zm_rank, zero_last_error());
        for (k = 0; k < 17 && r == ZERO_OK; k++)
            ZT_CHECKF(v[k] == zm_world * (zm_world - 1) / 2.0 + zm_world * 0.25 * (double)k, "rank %d: [%zu] = %g",
                      zm_rank, k, v[k]);
        zero_engine_destroy(e);
        zero_device_destroy(dev);
    }
}

/* ZeRO++'s quantized collectives (qwZ at stage 3, qgZ int4 and int8 at stages 1-3): over
   MPI (all_to_all) the same bits as over the threads' local comm. */
ZT_TEST(engine_mpi_quantized)
{
    int st, bits;
    for (bits = 4; bits <= 8; bits += 4)
        for (st = 1; st <= 3; st++) {
            ec_cfg c;
            char label[96];
            ec_cfg_init(&c, st, zm_world, ZERO_BF16, 2, 2);
            c.quant_g = 1;
            c.quant_bits = bits;
            c.quant_w = st == 3;
            c.quant_block = 16;
            snprintf(label, sizeof label, "stage %d bf16 qgZ int%d%s", st, bits, st == 3 ? " qwZ" : "");
            check_cfg(&c, label);
        }
}

int main(int argc, char **argv)
{
    zm_init(&argc, &argv);
    if (zm_world > EC_MAX_RANKS) {
        if (zm_rank == 0) printf("test_mpi_engine: at most %d processes\n", EC_MAX_RANKS);
        return zm_summary();
    }
    g_comm = new_comm(60000);
    if (!g_comm) return zm_summary();
    ZM_RUN(engine_mpi_equals_threads);
    ZM_RUN(engine_mpi_fp32_params);
    ZM_RUN(engine_mpi_fp32_comm_and_nan_step);
    ZM_RUN(engine_mpi_quantized);
    if (zm_world >= 2) ZM_RUN(engine_allreduce_counts_differ);
    zero_comm_destroy(g_comm);
    if (zm_world >= 2) ZM_RUN(engine_failure_on_one_rank);
    return zm_summary();
}
