/* test_mpi_hier.c - beyond one node over MPI (issue 26), run as R ranks per node with
   R = 2 when the process count is even (mpirun -np 4: 2 nodes x 2), else 1: zero_comm_split
   on the MPI comm (MPI_Comm_split) gives the node and cross-node groups with their ranks,
   reductions in them equal the same order's reference bit for bit, color < 0 gives none;
   the engine with an explicit ranks_per_node = R over MPI equals the threads run with the
   same R (tests/engine_common.h) on this rank: its state elements, its step infos and every
   step's traffic, intra- and inter-node bytes included; and MiCS (mics_shard_size = 2,
   stages 1-3) over MPI equals its threads run the same way; hpZ (hpz_partition_size = 2,
   stage 3) over MPI equals its threads run (states, infos, traffic) and, bit for bit in
   every state element, plain stage 3; qgZ (two-level at 2 nodes x 2, with qwZ at stage 3)
   over MPI equals its threads run. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#define ZERO_MPI_IMPLEMENTATION
#include "zero_mpi.h"
#include "tests/mpi/zt_mpi.h"
#include "tests/engine_common.h"
#include "tests/mpi/zt_mpi_engine.h"

static zero_comm *g_comm;
static int g_R;

static float sp_value(int rank, size_t i) { return (float)(0.1 + 0.37 * rank + 1e-3 * (double)i) / 3.0f; }

ZT_TEST(split_mpi)
{
    zero_comm *node = NULL, *cross = NULL, *none = NULL;
    int R = g_R, rank = zm_rank, q;
    float in[3], out[3];
    size_t i;
    zero_result r = zero_comm_split(g_comm, rank / R, rank, &node);
    ZT_CHECKF(r == ZERO_OK, "rank %d: %s", rank, zero_last_error());
    if (r != ZERO_OK) return;
    ZT_CHECK(node && node->world == R && node->rank == rank % R);
    r = zero_comm_split(g_comm, rank % R, zm_world - rank, &cross); /* reversed by key */
    ZT_CHECKF(r == ZERO_OK, "rank %d: %s", rank, zero_last_error());
    if (r != ZERO_OK) return;
    ZT_CHECK(cross && cross->world == zm_world / R && cross->rank == (zm_world - 1 - rank) / R);
    r = zero_comm_split(g_comm, rank == 0 ? 1 : -1, 0, &none);
    ZT_CHECK(r == ZERO_OK && (rank == 0) == (none != NULL));
    for (i = 0; i < 3; i++) in[i] = sp_value(rank, i);
    ZT_CHECK(node->ops->all_reduce(node, in, out, 3, ZERO_F32, ZERO_OP_SUM, NULL) == ZERO_OK);
    for (i = 0; i < 3; i++) {
        int b = rank / R * R;
        float acc = sp_value(b, i);
        for (q = b + 1; q < b + R; q++) acc += sp_value(q, i);
        ZT_CHECKF(memcmp(&acc, &out[i], 4) == 0, "rank %d node sum element %zu", rank, i);
    }
    ZT_CHECK(cross->ops->all_reduce(cross, in, out, 3, ZERO_F32, ZERO_OP_SUM, NULL) == ZERO_OK);
    for (i = 0; i < 3; i++) { /* in the cross comm's rank order: the highest node first */
        int last = (zm_world / R - 1) * R + rank % R;
        float acc = sp_value(last, i);
        for (q = last - R; q >= 0; q -= R) acc += sp_value(q, i);
        ZT_CHECKF(memcmp(&acc, &out[i], 4) == 0, "rank %d cross sum element %zu", rank, i);
    }
    /* The children speak the packet protocol on their own communicators (each its own
       collective numbers): a small all_to_all on the node comm between two collectives of
       the parent, a large one (a data round) after, and a mismatch on the cross comm that
       leaves it usable. */
    {
        enum { BIG = 70000 }; /* 280 KB per block: above the packets' inline size */
        float *a2a_in = (float *)malloc((size_t)R * BIG * 4), *a2a_out = (float *)malloc((size_t)R * BIG * 4);
        float one = 1.0f, sum = 0.0f;
        size_t n;
        int small;
        ZT_CHECK(a2a_in && a2a_out);
        for (small = 1; a2a_in && a2a_out && small >= 0; small--) {
            n = small ? 5 : BIG;
            for (q = 0; q < R; q++)
                for (i = 0; i < n; i++) a2a_in[(size_t)q * n + i] = sp_value(rank * 100 + q, i);
            ZT_CHECK(g_comm->ops->all_reduce(g_comm, &one, &sum, 1, ZERO_F32, ZERO_OP_SUM, NULL) == ZERO_OK);
            ZT_CHECK(sum == (float)zm_world);
            ZT_CHECKF(node->ops->all_to_all(node, a2a_in, a2a_out, n, ZERO_F32, NULL) == ZERO_OK, "rank %d: %s",
                      rank, zero_last_error());
            for (q = 0; q < R; q++) { /* block q came from node rank q (world rank b + q), its block 'mine' */
                int from = rank / R * R + q, ok = 1;
                for (i = 0; i < n; i++)
                    if (a2a_out[(size_t)q * n + i] != sp_value(from * 100 + rank % R, i)) ok = 0;
                ZT_CHECKF(ok, "rank %d: all_to_all numel %zu block %d", rank, n, q);
            }
        }
        free(a2a_in);
        free(a2a_out);
        if (cross->world > 1) {
            r = rank < R ? cross->ops->all_gather(cross, in, out, 1, ZERO_F32, NULL)
                         : cross->ops->all_to_all(cross, in, out, 1, ZERO_F32, NULL);
            ZT_CHECKF(r == ZERO_ERROR_MISMATCH, "rank %d: cross mismatch: %s", rank, zero_result_string(r));
        }
        ZT_CHECK(cross->ops->barrier(cross) == ZERO_OK);
        ZT_CHECK(g_comm->ops->barrier(g_comm) == ZERO_OK);
    }
    zero_comm_destroy(none);
    zero_comm_destroy(cross);
    zero_comm_destroy(node);
}


/* The elements this rank holds (not 0xff) equal the threads run's; its infos and traffic. */
static void compare(const ec_cfg *c, const ec_result *ref, const ec_result *got, const char *label)
{
    int t, s, bad = 0;
    ZT_CHECKF(ref->rc == ZERO_OK && got->rc == ZERO_OK, "rank %d %s: %s %s", zm_rank, label, ref->err,
              got->err);
    if (ref->rc != ZERO_OK || got->rc != ZERO_OK) return;
    for (t = 0; t < c->ntensors; t++) {
        size_t i;
        for (i = 0; i < c->sizes[t]; i++) {
            uint32_t ff = 0xffffffffu;
            if (memcmp(&got->master[t][i], &ff, 4) == 0) continue;
            if ((memcmp(&got->master[t][i], &ref->master[t][i], 4) ||
                 memcmp(&got->m[t][i], &ref->m[t][i], 4) || memcmp(&got->v[t][i], &ref->v[t][i], 4)) &&
                bad++ < 3)
                ZT_CHECKF(0, "rank %d %s: tensor %d element %zu differs", zm_rank, label, t, i);
        }
    }
    for (s = 0; s < c->steps; s++) {
        const zero_traffic *a = &got->traffic_last[zm_rank][s], *b = &ref->traffic_last[zm_rank][s];
        ZT_CHECKF(memcmp(&got->info[zm_rank][s], &ref->info[zm_rank][s], sizeof got->info[0][0]) == 0,
                  "rank %d %s: step %d info differs", zm_rank, label, s);
        ZT_CHECKF(memcmp(a, b, sizeof *a) == 0, "rank %d %s: step %d traffic differs (inter %.17g vs "
                  "%.17g)", zm_rank, label, s, a->inter_bytes[ZERO_COLL_ALL_GATHER],
                  b->inter_bytes[ZERO_COLL_ALL_GATHER]);
    }
}

ZT_TEST(engine_topology_mpi_equals_threads)
{
    int st;
    for (st = 0; st <= 3; st++) {
        ec_cfg c;
        ec_ctx ctx;
        ec_result *ref, *got;
        char label[64];
        ec_cfg_init(&c, st, zm_world, ZERO_BF16, 2, 2);
        c.ranks_per_node = g_R;
        snprintf(label, sizeof label, "stage %d R %d", st, g_R);
        ref = ec_run(&c);
        got = run_mpi_rank(&c, &ctx, g_comm, ec_rank_fn);
        compare(&c, ref, got, label);
        if (g_R < zm_world && got->rc == ZERO_OK)
            ZT_CHECKF(got->traffic_last[zm_rank][1].inter_bytes[ZERO_COLL_ALL_GATHER] > 0.0 ||
                          st == 0,
                      "rank %d %s: no inter-node bytes", zm_rank, label);
        ec_result_free(ref);
        ec_result_free(got);
    }
}

/* MiCS over MPI: S = 2 at an even count above 2 (np 4: shard groups inside the nodes,
   replicas across them), stages 1-3, equals the threads run (states, infos, traffic). */
ZT_TEST(mics_mpi_equals_threads)
{
    int st;
    if (zm_world % 2 != 0 || zm_world < 4) ZT_SKIP("MiCS needs an even count above 2");
    for (st = 1; st <= 3; st++) {
        ec_cfg c;
        ec_ctx ctx;
        ec_result *ref, *got;
        char label[64];
        ec_cfg_init(&c, st, zm_world, ZERO_BF16, 2, 2);
        c.ranks_per_node = g_R;
        c.mics = 2;
        snprintf(label, sizeof label, "MiCS S 2 stage %d R %d", st, g_R);
        ref = ec_run(&c);
        got = run_mpi_rank(&c, &ctx, g_comm, ec_rank_fn);
        compare(&c, ref, got, label);
        if (got->rc == ZERO_OK)
            ZT_CHECKF(got->traffic_last[zm_rank][1].calls[ZERO_COLL_ALL_REDUCE] > 0,
                      "rank %d %s: no replica all-reduce", zm_rank, label);
        ec_result_free(ref);
        ec_result_free(got);
    }
}

/* hpZ over MPI: S = 2 inside nodes of R = 2 (np 4: 2 nodes x 2), stage 3, accumulation:
   equals the threads run (states, infos, every step's traffic), and its state elements equal
   plain stage 3's (threads run, no hpZ) bit for bit; the all-gathers inside the node grow,
   those between nodes are one per group per step. */
ZT_TEST(hpz_mpi_equals_threads_and_plain)
{
    ec_cfg c;
    ec_ctx ctx;
    ec_result *ref, *got, *plain;
    int t, bad = 0;
    if (zm_world % 2 != 0 || zm_world < 4) ZT_SKIP("hpZ needs an even count above 2");
    ec_cfg_init(&c, 3, zm_world, ZERO_BF16, 2, 3);
    c.ranks_per_node = g_R;
    c.hpz = 2;
    ref = ec_run(&c);
    got = run_mpi_rank(&c, &ctx, g_comm, ec_rank_fn);
    compare(&c, ref, got, "hpZ S 2 stage 3");
    c.hpz = 0;
    plain = ec_run(&c);
    ZT_CHECKF(plain->rc == ZERO_OK, "%s", plain->err);
    for (t = 0; t < c.ntensors && got->rc == ZERO_OK && plain->rc == ZERO_OK; t++) {
        size_t i;
        for (i = 0; i < c.sizes[t]; i++) {
            uint32_t ff = 0xffffffffu;
            if (memcmp(&got->master[t][i], &ff, 4) == 0) continue;
            if ((memcmp(&got->master[t][i], &plain->master[t][i], 4) ||
                 memcmp(&got->m[t][i], &plain->m[t][i], 4) || memcmp(&got->v[t][i], &plain->v[t][i], 4)) &&
                bad++ < 3)
                ZT_CHECKF(0, "rank %d hpZ over MPI vs plain stage 3: tensor %d element %zu differs", zm_rank, t, i);
        }
    }
    if (got->rc == ZERO_OK && plain->rc == ZERO_OK) {
        const zero_traffic *h = &got->traffic_last[zm_rank][2], *f = &plain->traffic_last[zm_rank][2];
        ZT_CHECKF(h->inter_bytes[ZERO_COLL_ALL_GATHER] * 4.0 == f->inter_bytes[ZERO_COLL_ALL_GATHER] &&
                      h->calls[ZERO_COLL_ALL_GATHER] == f->calls[ZERO_COLL_ALL_GATHER],
                  "rank %d: all-gather bytes between nodes %.17g, plain %.17g (want a quarter at A = 2)",
                  zm_rank, h->inter_bytes[ZERO_COLL_ALL_GATHER], f->inter_bytes[ZERO_COLL_ALL_GATHER]);
    }
    ec_result_free(ref);
    ec_result_free(got);
    ec_result_free(plain);
}

/* qgZ over MPI at R = 2 (np 4: 2 nodes x 2, the two-level scheme; np 2: R = N, flat), stages
   2 and 3, int4 with qwZ at stage 3, accumulation: equals the threads run with the same
   topology (states, infos, every step's traffic); the reduce-scatter bytes between nodes are
   (M - 1) / (N - R) of the flat scheme's, M = N / R (a half at 2 x 2). */
ZT_TEST(qgz_mpi_equals_threads)
{
    int st;
    if (zm_world % 2 != 0) ZT_SKIP("qgZ's two levels need an even count");
    for (st = 2; st <= 3; st++) {
        ec_cfg c;
        ec_ctx ctx;
        ec_result *ref, *got, *flat;
        char label[64];
        ec_cfg_init(&c, st, zm_world, ZERO_BF16, 2, 3);
        c.ranks_per_node = g_R;
        c.quant_g = 1;
        c.quant_w = st == 3;
        c.quant_block = 32;
        snprintf(label, sizeof label, "qgZ stage %d R %d", st, g_R);
        ref = ec_run(&c);
        got = run_mpi_rank(&c, &ctx, g_comm, ec_rank_fn);
        compare(&c, ref, got, label);
        c.quant_levels = 1;
        flat = ec_run(&c);
        if (got->rc == ZERO_OK && flat->rc == ZERO_OK && g_R < zm_world) {
            const zero_traffic *h = &got->traffic_last[zm_rank][2], *f = &flat->traffic_last[zm_rank][2];
            int M = zm_world / g_R;
            ZT_CHECKF(h->inter_bytes[ZERO_COLL_REDUCE_SCATTER] * (zm_world - g_R) ==
                          f->inter_bytes[ZERO_COLL_REDUCE_SCATTER] * (M - 1) &&
                          h->inter_bytes[ZERO_COLL_REDUCE_SCATTER] > 0.0,
                      "rank %d %s: reduce-scatter between nodes %.17g, flat %.17g", zm_rank, label,
                      h->inter_bytes[ZERO_COLL_REDUCE_SCATTER], f->inter_bytes[ZERO_COLL_REDUCE_SCATTER]);
        }
        ec_result_free(ref);
        ec_result_free(got);
        ec_result_free(flat);
    }
}

int main(int argc, char **argv)
{
    zero_mpi_desc d;
    zm_init(&argc, &argv);
    if (zm_world > EC_MAX_RANKS) {
        if (zm_rank == 0) printf("test_mpi_hier: at most %d processes\n", EC_MAX_RANKS);
        return zm_summary();
    }
    g_R = zm_world % 2 == 0 ? 2 : 1;
    memset(&d, 0, sizeof d);
    d.timeout_ms = 60000;
    if (zero_mpi_create(&d, &g_comm) != ZERO_OK) {
        fprintf(stderr, "rank %d: %s\n", zm_rank, zero_last_error());
        return zm_summary();
    }
    ZM_RUN(split_mpi);
    ZM_RUN(engine_topology_mpi_equals_threads);
    ZM_RUN(mics_mpi_equals_threads);
    ZM_RUN(hpz_mpi_equals_threads_and_plain);
    ZM_RUN(qgz_mpi_equals_threads);
    zero_comm_destroy(g_comm);
    return zm_summary();
}
