/* test_frozen.c - frozen tensors (ZERO_TENSOR_FROZEN, fine-tuning): the plan's layout (each
   group's frozen tensors after its trained ones, both regions in N equal slices); training
   with frozen tensors equals, bit for bit, the same model where those tensors are constants
   (registered as trained with lr 0 and no decay) at stages 0-3, N = 1..4, with accumulation;
   frozen params bit-unchanged; memory per rank and traffic per step equal the frozen-aware
   formula (and the estimator's); checkpoints keep frozen tensors across world sizes and
   stages; misuse refused naming the tensor. */
#define _XOPEN_SOURCE 700 /* mkdtemp */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"

#include <stdlib.h>
#include <unistd.h>

/* ec_default_model with t0 (first of group 0), t4 (all of group 2) and t6 (middle of
   group 3) frozen; groups 0 and 3 mix frozen and trained tensors. */
static const int fz_frozen[EC_MAX_T] = {1, 0, 0, 0, 1, 0, 1, 0};

static void fz_cfg(ec_cfg *c, int stage, int world, zero_dtype dt, int accum, int steps)
{
    int t;
    ec_cfg_init(c, stage, world, dt, accum, steps);
    c->lr = 1e-2f;
    c->wd = 0.05f;
    for (t = 0; t < c->ntensors; t++)
        if (fz_frozen[t]) c->flags[t] |= ZERO_TENSOR_FROZEN;
}

/* The reference: the same model with nothing frozen, the frozen tensors trained at lr 0
   without decay (constants, but with gradients, master, m and v). */
static void fz_reference_cfg(const ec_cfg *c, ec_cfg *ref)
{
    int t;
    *ref = *c;
    ref->hp_on = 1;
    for (t = 0; t < ref->ntensors; t++) {
        ref->flags[t] &= ~ZERO_TENSOR_FROZEN;
        ref->lr_mul[t] = fz_frozen[t] ? 0.0 : 1.0;
        ref->hp_wd[t] = fz_frozen[t] ? 0.0 : ZERO_WEIGHT_DECAY_DEFAULT;
    }
}

/* Trained tensors: master, m, v and params equal; frozen ones: params equal, and equal to
   the initial values rounded to the param dtype. */
static int fz_same(const ec_cfg *c, const ec_result *a, const ec_result *ref, char *why, size_t n)
{
    size_t esz = zero_dtype_size(c->dtype);
    int t;
    for (t = 0; t < c->ntensors; t++) {
        size_t k = c->sizes[t], i;
        if (!fz_frozen[t] && (memcmp(a->master[t], ref->master[t], k * 4) ||
                              memcmp(a->m[t], ref->m[t], k * 4) || memcmp(a->v[t], ref->v[t], k * 4))) {
            snprintf(why, n, "tensor %d: master, m or v differs", t);
            return 0;
        }
        if (memcmp(a->param[t], ref->param[t], k * esz)) {
            snprintf(why, n, "tensor %d: params differ", t);
            return 0;
        }
        for (i = 0; fz_frozen[t] && i < k; i++) {
            unsigned char want[4];
            ec_from_f32(want, c->dtype, 0, ec_init_value(t, i));
            if (memcmp(a->param[t] + i * esz, want, esz)) {
                snprintf(why, n, "frozen tensor %d element %zu changed", t, i);
                return 0;
            }
        }
    }
    return 1;
}

ZT_TEST(frozen_plan_layout)
{
    zero_plan *p = NULL;
    zero_tensor_info ti;
    zero_group_info gi;
    zero_range rg;
    int a, b, c2, d;
    uint64_t h_plain = 0;
    ZT_CHECK(zero_plan_create(&p, NULL) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "a", 10, 0, &a) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "b", 7, 0, &b) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "c", 5, 0, &c2) == ZERO_OK);
    ZT_CHECK(zero_plan_add(p, "d", 9, 1, &d) == ZERO_OK);
    ZT_CHECK(zero_plan_freeze(p, b) == ZERO_OK);
    ZT_CHECK(zero_plan_freeze(p, d) == ZERO_OK);
    ZT_CHECK(zero_plan_freeze(p, 9) == ZERO_ERROR_NOT_FOUND);
    ZT_CHECK(zero_plan_commit(p, 3, 4, 0) == ZERO_OK);
    ZT_CHECK(zero_plan_freeze(p, a) == ZERO_ERROR_INVALID_STATE);
    /* group 0: a [0, 10), c [12, 17), padded to 24 (unit 12); b [24, 31), padded to 36 */
    zero_plan_tensor(p, a, &ti);
    ZT_CHECK(ti.offset == 0 && !ti.frozen);
    zero_plan_tensor(p, c2, &ti);
    ZT_CHECK(ti.offset == 12 && !ti.frozen);
    zero_plan_tensor(p, b, &ti);
    ZT_CHECKF(ti.offset == 24 && ti.frozen, "b at %zu", ti.offset);
    zero_plan_group(p, 0, &gi);
    ZT_CHECKF(gi.numel == 36 && gi.frozen_numel == 12 && gi.shard_numel == 12 &&
                  gi.used_numel == 31 && gi.num_tensors == 3 && gi.tensors[0] == a &&
                  gi.tensors[1] == b && gi.tensors[2] == c2,
              "numel %zu frozen %zu", gi.numel, gi.frozen_numel);
    /* the trained region's slices; the frozen tensor meets its region's slices */
    zero_plan_shard(p, 0, 1, &rg);
    ZT_CHECK(rg.offset == 8 && rg.numel == 8);
    zero_plan_intersect(p, b, 0, &rg);
    ZT_CHECK(rg.offset == 24 && rg.numel == 4);
    zero_plan_intersect(p, b, 1, &rg);
    ZT_CHECK(rg.offset == 28 && rg.numel == 3);
    zero_plan_intersect(p, b, 2, &rg);
    ZT_CHECK(rg.numel == 0 && rg.offset == 31);
    zero_plan_intersect(p, c2, 1, &rg);
    ZT_CHECK(rg.offset == 12 && rg.numel == 4);
    /* group 1: only a frozen tensor */
    zero_plan_group(p, 1, &gi);
    ZT_CHECK(gi.numel == 12 && gi.frozen_numel == 12);
    zero_plan_shard(p, 1, 2, &rg);
    ZT_CHECK(rg.numel == 0);
    /* frozen tensors change the hash; a plan without them hashes as before */
    {
        zero_plan *q = NULL;
        ZT_CHECK(zero_plan_create(&q, NULL) == ZERO_OK);
        zero_plan_add(q, "a", 10, 0, NULL);
        zero_plan_add(q, "b", 7, 0, NULL);
        zero_plan_add(q, "c", 5, 0, NULL);
        zero_plan_add(q, "d", 9, 1, NULL);
        ZT_CHECK(zero_plan_commit(q, 3, 4, 0) == ZERO_OK);
        h_plain = zero_plan_hash(q);
        ZT_CHECK(h_plain != zero_plan_hash(p));
        zero_plan_tensor(q, b, &ti);
        ZT_CHECK(ti.offset == 12 && !ti.frozen); /* registration order without freezing */
        zero_plan_destroy(q);
    }
    zero_plan_destroy(p);
}

/* Every stage and N = 1..4, fp16 and bf16, with and without accumulation: the frozen run is
   the lr-0 reference bit for bit. */
ZT_TEST(frozen_equals_constant_reference)
{
    static const zero_dtype dts[2] = {ZERO_F16, ZERO_BF16};
    int world, stage, di, rk;
    for (di = 0; di < 2; di++)
        for (world = 1; world <= 4; world++)
            for (stage = 0; stage <= 3; stage++) {
                ec_cfg c, rc;
                ec_result *a, *ref;
                char why[160];
                fz_cfg(&c, stage, world, dts[di], di ? 2 : 1, 4);
                fz_reference_cfg(&c, &rc);
                memset(ec_frozen_bad, 0, sizeof ec_frozen_bad);
                a = ec_run(&c);
                ref = ec_run(&rc);
                for (rk = 0; rk < world; rk++)
                    ZT_CHECKF(ec_frozen_bad[rk] == 0, "N=%d stage %d rank %d: %d gathered frozen "
                              "elements changed", world, stage, rk, ec_frozen_bad[rk]);
                ZT_CHECKF(a->rc == ZERO_OK && ref->rc == ZERO_OK, "N=%d stage %d: %s %s", world, stage,
                          a->err, ref->err);
                ZT_CHECKF(a->params_agree, "N=%d stage %d: ranks hold different params", world, stage);
                if (a->rc == ZERO_OK && ref->rc == ZERO_OK)
                    ZT_CHECKF(fz_same(&c, a, ref, why, sizeof why), "%s N=%d stage %d: %s",
                              zero_dtype_name(dts[di]), world, stage, why);
                ec_result_free(a);
                ec_result_free(ref);
            }
}

ZT_TEST(frozen_stages_identical)
{
    ec_cfg c;
    fz_cfg(&c, 0, 3, ZERO_BF16, 2, 3);
    c.comm_dtype = ZERO_F32;
    ec_check_stages_identical(&c, "N=3 bf16 fp32 comm accum 2 frozen");
    fz_cfg(&c, 0, 2, ZERO_F16, 1, 3);
    c.persist = 20; /* stage 3: group 2 (only frozen) and group 0 persistent */
    c.prefetch = 2;
    ec_check_stages_identical(&c, "N=2 f16 persistence prefetch frozen");
}

/* Per rank, P params of which F frozen (plan sizes, padded), T = P - F, N ranks, param and
   comm dtype p bytes, accumulation 1 (the accumulator is the gradient buffer at stages 0-1):
       params     2 P (stages 0-2), 2 P / N (stage 3)
       gradients  2 T (stages 0-1), 2 T / N (stages 2-3)
       master, m, v: 4 T each at stage 0, 4 T / N at stages 1-3
   and per step f = (N - 1) / N: all-reduce 2 T f (stage 0); reduce-scatter T f and
   all-gather T f (stages 1-2); reduce-scatter T f and all-gather 2 P f (stage 3). The
   estimator with frozen = F gives the same model-state bytes. */
ZT_TEST(frozen_memory_and_traffic_formula)
{
    int world, stage, s, rk;
    for (world = 1; world <= 4; world++)
        for (stage = 0; stage <= 3; stage++) {
            ec_cfg c;
            ec_result *r;
            size_t P, F, T, N = (size_t)world, p = 2, want[ZERO_MEM_COUNT];
            double f = (double)(world - 1) / world;
            zero_estimate_desc ed;
            zero_estimate est;
            fz_cfg(&c, stage, world, ZERO_F16, 1, 2);
            r = ec_run(&c);
            ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
            if (r->rc != ZERO_OK) {
                ec_result_free(r);
                continue;
            }
            P = r->plan_total;
            F = r->frozen_total;
            T = P - F;
            ZT_CHECK(F > 0 && T > 0 && T % N == 0 && F % N == 0);
            memset(want, 0, sizeof want);
            want[ZERO_MEM_PARAM] = (stage < 3 ? P : P / N) * p;
            want[ZERO_MEM_GRAD] = (stage < 2 ? T : T / N) * p;
            want[ZERO_MEM_MASTER] = want[ZERO_MEM_MOMENT1] = want[ZERO_MEM_MOMENT2] =
                4 * (stage == 0 ? T : T / N);
            for (rk = 0; rk < world; rk++) {
                int k;
                for (k = ZERO_MEM_PARAM; k <= ZERO_MEM_MOMENT2; k++)
                    ZT_CHECKF(r->mem[rk].bytes[k] == want[k],
                              "N=%d stage %d rank %d %s: %zu bytes, formula %zu (P %zu F %zu)", world,
                              stage, rk, zero_mem_category_name((zero_mem_category)k),
                              r->mem[rk].bytes[k], want[k], P, F);
                for (s = 0; s < c.steps; s++) {
                    const zero_traffic *t = &r->traffic_last[rk][s];
                    double ag = stage == 0 ? 0 : stage < 3 ? T * f : 2 * P * f;
                    double rs = stage == 0 ? 0 : T * f, ar = stage == 0 ? 2 * T * f : 0;
                    ZT_CHECKF(t->numel[ZERO_COLL_ALL_GATHER] == ag &&
                                  t->numel[ZERO_COLL_REDUCE_SCATTER] == rs &&
                                  t->numel[ZERO_COLL_ALL_REDUCE] == ar,
                              "N=%d stage %d rank %d step %d: ag %.1f rs %.1f ar %.1f, formula %.1f "
                              "%.1f %.1f",
                              world, stage, rk, s, t->numel[ZERO_COLL_ALL_GATHER],
                              t->numel[ZERO_COLL_REDUCE_SCATTER], t->numel[ZERO_COLL_ALL_REDUCE], ag, rs,
                              ar);
                }
            }
            /* the estimator's frozen-aware model states, exactly */
            memset(&ed, 0, sizeof ed);
            ed.params = P;
            ed.frozen = F;
            ed.ranks = world;
            ed.stage = stage;
            ZT_CHECK(zero_estimate_compute(&ed, &est) == ZERO_OK);
            ZT_CHECKF(est.params_bytes == want[ZERO_MEM_PARAM] &&
                          est.grads_bytes == want[ZERO_MEM_GRAD] &&
                          est.optimizer_bytes == 3 * want[ZERO_MEM_MASTER],
                      "N=%d stage %d: estimator %llu %llu %llu", world, stage,
                      (unsigned long long)est.params_bytes, (unsigned long long)est.grads_bytes,
                      (unsigned long long)est.optimizer_bytes);
            ec_result_free(r);
        }
    {   /* estimator checks: frozen > params, DeepSpeed mode */
        zero_estimate_desc ed;
        zero_estimate est;
        memset(&ed, 0, sizeof ed);
        ed.params = 100;
        ed.frozen = 101;
        ed.ranks = 2;
        ZT_CHECK(zero_estimate_compute(&ed, &est) == ZERO_ERROR_INVALID_ARGUMENT &&
                 strstr(zero_last_error(), "frozen = 101") != NULL);
        ed.frozen = 40;
        ed.mode = ZERO_ESTIMATE_DEEPSPEED;
        ed.stage = 2;
        ZT_CHECK(zero_estimate_compute(&ed, &est) == ZERO_ERROR_INVALID_ARGUMENT);
    }
}

/* ---- checkpoints ---- */

static ec_result *fz_run(const ec_cfg *c, const char *save, const char *load, int first, int last)
{
    ec_job job;
    memset(&job, 0, sizeof job);
    job.save_dir = save;
    job.load_dir = load;
    job.first = first;
    job.last = last;
    return ec_run_job(c, &job);
}

/* Saved at N = 2 (every stage), loaded at N' in {1, 2, 3} and every stage: the run continues
   as the straight one at N' would from the same state (trained tensors' master, m, v and
   every param bit for bit), and the checkpoint reader gives the frozen params. */
ZT_TEST(frozen_checkpoints)
{
    char root[] = "/tmp/zero_frozen_XXXXXX";
    int s0, s1, w1;
    if (!mkdtemp(root)) ZT_SKIP("mkdtemp failed");
    for (s0 = 0; s0 <= 3; s0++) {
        char dir[300];
        ec_cfg c;
        ec_result *saved;
        snprintf(dir, sizeof dir, "%s/s%d", root, s0);
        fz_cfg(&c, s0, 2, ZERO_BF16, 1, 4);
        saved = fz_run(&c, dir, NULL, 0, 2);
        ZT_CHECKF(saved->rc == ZERO_OK, "save stage %d: %s", s0, saved->err);
        if (s0 == 1) { /* the reader: frozen params yes, their master no; the export */
            zero_checkpoint *ck = NULL;
            uint16_t got[64];
            char st[400];
            ZT_CHECK(zero_checkpoint_open(dir, &ck) == ZERO_OK);
            ZT_CHECK(ck && zero_checkpoint_verify(ck) == ZERO_OK);
            ZT_CHECK(ck && zero_checkpoint_read_tensor(ck, 0, ZERO_STATE_PARAM, got) == ZERO_OK &&
                     memcmp(got, saved->param[0], 37 * 2) == 0);
            ZT_CHECK(ck && zero_checkpoint_read_tensor(ck, 0, ZERO_STATE_MASTER, got) ==
                               ZERO_ERROR_INVALID_ARGUMENT &&
                     strstr(zero_last_error(), "'t0' is frozen") != NULL);
            snprintf(st, sizeof st, "%s/export.safetensors", root);
            ZT_CHECK(ck && zero_checkpoint_export(ck, st, ZERO_F32) == ZERO_OK);
            zero_checkpoint_close(ck);
        }
        for (s1 = 0; s1 <= 3 && saved->rc == ZERO_OK; s1++)
            for (w1 = 1; w1 <= 3; w1++) {
                ec_cfg c1;
                ec_result *straight, *resumed;
                char why[160];
                if (zt_quick() && w1 != 3 && s1 != s0) continue;
                fz_cfg(&c1, s1, w1, ZERO_BF16, 1, 4);
                /* the reference: the state after 2 steps at N = 2 is what both start from; at
                   N' = 2 the straight run is the reference, otherwise the frozen params and the
                   loaded masters are compared after the load alone */
                resumed = fz_run(&c1, NULL, dir, 2, w1 == 2 ? 4 : 2);
                ZT_CHECKF(resumed->rc == ZERO_OK, "stage %d -> N=%d stage %d: %s", s0, w1, s1,
                          resumed->err);
                straight = w1 == 2 ? fz_run(&c1, NULL, NULL, 0, 4) : NULL;
                if (resumed->rc == ZERO_OK) {
                    if (straight)
                        ZT_CHECKF(ec_same_state(&c1, straight, resumed, why, sizeof why),
                                  "stage %d -> stage %d (N=2): %s", s0, s1, why);
                    else
                        ZT_CHECKF(ec_same_state(&c1, saved, resumed, why, sizeof why),
                                  "stage %d -> N=%d stage %d: %s", s0, w1, s1, why);
                }
                if (straight) ec_result_free(straight);
                ec_result_free(resumed);
            }
        ec_result_free(saved);
    }
    {   /* an engine that does not freeze them refuses the checkpoint, naming the tensor */
        char dir[300];
        ec_cfg c;
        ec_result *r;
        snprintf(dir, sizeof dir, "%s/s1", root);
        ec_cfg_init(&c, 1, 2, ZERO_BF16, 1, 0);
        r = fz_run(&c, NULL, dir, 0, 0);
        ZT_CHECKF(r->rc == ZERO_ERROR_MISMATCH && strstr(r->err, "'t0' has flags") != NULL, "%s",
                  r->err);
        ec_result_free(r);
    }
    {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        ZT_CHECK(system(cmd) == 0);
    }
}

/* ---- misuse ---- */

static zero_result fz_misuse_rank(int rank, zero_comm *comm, void *user)
{
    int *fails = (int *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    void *buf = NULL;
    float out[16];
    int a = -1, b = -1, w = -1;
    (void)rank;
#define FZ_EXPECT(call, code, text)                                                          \
    do {                                                                                     \
        zero_result rr_ = (call);                                                            \
        if (rr_ != (code) || !strstr(zero_last_error(), (text))) {                           \
            fprintf(stderr, "  %s gave %d '%s'\n", #call, (int)rr_, zero_last_error());      \
            (*fails)++;                                                                      \
        }                                                                                    \
    } while (0)
    memset(&d, 0, sizeof d);
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    d.device = dev;
    d.comm = comm;
    d.param_dtype = ZERO_F32;
    r = zero_engine_create(&d, &e);
    if (r == ZERO_OK) {
        FZ_EXPECT(zero_engine_add_tensor(e, "x", 4, 0, 4u, NULL), ZERO_ERROR_INVALID_ARGUMENT,
                  "flags = 0x4");
        r = zero_engine_add_tensor(e, "wte", 16, 0, ZERO_TENSOR_FROZEN, &a);
    }
    if (r == ZERO_OK) r = zero_engine_add_tensor(e, "wpe", 8, 0, ZERO_TENSOR_FROZEN, &b);
    if (r == ZERO_OK) r = zero_engine_add_tensor(e, "w", 8, 1, 0, &w);
    if (r == ZERO_OK) r = zero_engine_commit(e);
    if (r == ZERO_OK) {
        FZ_EXPECT(zero_engine_grads(e, 0, &buf), ZERO_ERROR_INVALID_ARGUMENT,
                  "group 0 holds only frozen tensors ('wte', 'wpe')");
        FZ_EXPECT(zero_engine_grads_ready(e, 0), ZERO_ERROR_INVALID_ARGUMENT,
                  "group 0 holds only frozen tensors");
        FZ_EXPECT(zero_engine_read_tensor(e, a, ZERO_STATE_MASTER, out, NULL),
                  ZERO_ERROR_INVALID_ARGUMENT, "tensor 'wte' is frozen");
        FZ_EXPECT(zero_engine_read_tensor(e, b, ZERO_STATE_V, out, NULL), ZERO_ERROR_INVALID_ARGUMENT,
                  "'wpe' is frozen (ZERO_TENSOR_FROZEN): it has no second moment");
        if (zero_engine_read_tensor(e, a, ZERO_STATE_PARAM, out, NULL) != ZERO_OK) (*fails)++;
        /* the step trains the rest; a frozen-only group needs no grads_ready */
        if (zero_engine_grads(e, 1, &buf) != ZERO_OK || zero_engine_grads_ready(e, 1) != ZERO_OK ||
            zero_engine_step(e, NULL) != ZERO_OK)
            (*fails)++;
    }
    zero_engine_destroy(e);
    e = NULL;
    /* offload with frozen tensors: not supported yet, said at commit */
    if (r == ZERO_OK) {
        d.stage = 2;
        d.offload_optimizer = ZERO_OFFLOAD_CPU;
        r = zero_engine_create(&d, &e);
        if (r == ZERO_OK) r = zero_engine_add_tensor(e, "w", 8, 0, 0, NULL);
        if (r == ZERO_OK) r = zero_engine_add_tensor(e, "emb", 8, 0, ZERO_TENSOR_FROZEN, NULL);
        if (r == ZERO_OK)
            FZ_EXPECT(zero_engine_commit(e), ZERO_ERROR_UNSUPPORTED, "frozen tensors ('emb'");
    }
#undef FZ_EXPECT
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(frozen_misuse)
{
    int fails = 0;
    ZT_CHECK(zero_local_run(1, fz_misuse_rank, &fails) == ZERO_OK);
    ZT_CHECKF(fails == 0, "%d checks failed", fails);
}

int main(void)
{
    ZT_RUN(frozen_plan_layout);
    ZT_RUN(frozen_equals_constant_reference);
    ZT_RUN(frozen_stages_identical);
    ZT_RUN(frozen_memory_and_traffic_formula);
    ZT_RUN(frozen_checkpoints);
    ZT_RUN(frozen_misuse);
    return zt_summary();
}
