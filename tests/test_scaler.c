/* The loss scaler: exact scale sequences for planned overflow patterns, worked out by hand
   from DeepSpeed's rule as of 0.17.1 (growth when stable = iter - last_overflow - 1 is a
   positive multiple of the window; an overflow that would cut a scale already at the
   minimum raises by default), plus a second simulator written differently (a run-length
   counter instead of iteration arithmetic) for long random patterns, modes, defaults and
   validation. */
#include "zero.h"
#include "tests/zt.h"

#include <math.h>
#include <stdio.h>

/* at_min: SKIP (clamp and go on), so that the hand-worked patterns can run into the
   minimum; the error is tested on its own below. */
static zero_scaler_desc dyn(float init, int window, int hyst, float min, float factor,
                            int consecutive)
{
    zero_scaler_desc d;
    memset(&d, 0, sizeof d);
    d.at_min = ZERO_SCALER_AT_MIN_SKIP;
    d.mode = ZERO_SCALER_DYNAMIC;
    d.init_scale = init;
    d.window = window;
    d.hysteresis = hyst;
    d.min_scale = min;
    d.factor = factor;
    d.consecutive_hysteresis = consecutive;
    return d;
}

/* Runs pattern ('G' good step, 'O' overflow) and compares the scale after every update with
   expected[]. */
static void run_pattern(const zero_scaler_desc *d, const char *pattern, const float *expected)
{
    zero_scaler s;
    size_t i;
    ZT_CHECK(zero_scaler_init(&s, d, ZERO_F16) == ZERO_OK);
    for (i = 0; pattern[i]; i++) {
        ZT_CHECK(zero_scaler_update(&s, pattern[i] == 'O') == ZERO_OK);
        ZT_CHECKF(s.scale == expected[i], "step %zu ('%c'): scale %g, expected %g", i,
                  pattern[i], (double)s.scale, (double)expected[i]);
        ZT_CHECK(s.iter == (int64_t)i + 1);
    }
}

ZT_TEST(hysteresis_1_window_3)
{
    /* init 16, window 3, hysteresis 1 (every overflow cuts), min 1, factor 2.
       Growth when stable = iter - last_overflow - 1 is > 0 and % 3 == 0, last_overflow
       starting at -1: iter 0,1,2 good (stable 0,1,2): 16 16 16; iter 3 (stable 3) -> 32;
       4,5: 32 32; 6 O: 16 (last=6); 7,8,9 (stable 0,1,2): 16 16 16; 10 (stable 3) -> 32;
       11..17 O: 16 8 4 2 1, then max(0.5, 1) = 1 twice (at_min SKIP).
       (DeepSpeed <= 0.17.0 grew at iter 2, 5 and 9.) */
    static const float e[] = {16, 16, 16, 32, 32, 32, 16, 16, 16, 16, 32, 16, 8, 4, 2, 1, 1, 1};
    zero_scaler_desc d = dyn(16, 3, 1, 1, 2, 0);
    run_pattern(&d, "GGGGGGOGGGGOOOOOOO", e);
}

ZT_TEST(hysteresis_2_not_consecutive)
{
    /* init 1024, window 2, hysteresis 2, consecutive off: a good step does not refill
       the hysteresis, only a growth does.
       0 O: cur_h 2 -> 1, no cut, last=0        1024
       1 G: stable 1-0-1 = 0                     1024
       2 O: cur_h == 1 -> cut, last=2            512
       3 G: stable 0                             512
       4 G: stable 1                             512
       5 G: stable 2 -> grow, cur_h = 2          1024
       6 O: cur_h 2 -> 1, last=6                 1024
       7 O: cut, last=7                          512
       8 G: 0                                    512
       9 G: 1                                    512
      10 G: 2 -> grow                            1024 */
    static const float e[] = {1024, 1024, 512, 512, 512, 1024, 1024, 512, 512, 512, 1024};
    zero_scaler_desc d = dyn(1024, 2, 2, 1, 2, 0);
    run_pattern(&d, "OGOGGGOOGGG", e);
}

ZT_TEST(hysteresis_2_consecutive)
{
    /* The same pattern with consecutive_hysteresis: every good step refills cur_h, so only
       back-to-back overflows cut.
       0 O: 2 -> 1, last=0                       1024
       1 G: cur_h = 2; stable 0                  1024
       2 O: 2 -> 1, no cut, last=2               1024
       3 G: cur_h = 2; stable 0                  1024
       4 G: stable 1                             1024
       5 G: stable 2 -> grow                     2048
       6 O: 2 -> 1, last=6                       2048
       7 O: cut, last=7                          1024
       8 G: cur_h = 2; 0                         1024
       9 G: 1                                    1024
      10 G: 2 -> grow                            2048 */
    static const float e[] = {1024, 1024, 1024, 1024, 1024, 2048, 2048, 1024, 1024, 1024, 2048};
    zero_scaler_desc d = dyn(1024, 2, 2, 1, 2, 1);
    run_pattern(&d, "OGOGGGOOGGG", e);
}

ZT_TEST(hysteresis_3_window_1)
{
    /* init 8, window 1 (every good step but the first after an overflow grows),
       hysteresis 3, consecutive off.
       0 O: 3 -> 2, last=0            8
       1 G: stable 0                  8
       2 G: stable 1: grow, cur_h = 3 16
       3 O: 3 -> 2                    16
       4 O: 2 -> 1                    16
       5 O: cut                       8
       6 O: cut (cur_h stays 1)       4
       7 G: stable 0                  4
       8 G: stable 1: grow, cur_h = 3 8
       9 O: 3 -> 2                    8 */
    static const float e[] = {8, 8, 16, 16, 16, 8, 4, 4, 8, 8};
    zero_scaler_desc d = dyn(8, 1, 3, 1, 2, 0);
    run_pattern(&d, "OGGOOOOGGO", e);
}

ZT_TEST(min_scale_clamp_with_factor_4)
{
    /* init 10, min 2, factor 4, window 2, hysteresis 1, at_min SKIP:
       0 O: 10/4 = 2.5                     2.5
       1 O: 2.5/4 = 0.625, clamped to 2    2
       2 O: at the minimum: 2, last=2      2
       3 G: stable 0                       2
       4 G: stable 1                       2
       5 G: stable 2 -> 2 * 4              8 */
    static const float e[] = {2.5f, 2, 2, 2, 2, 8};
    zero_scaler_desc d = dyn(10, 2, 1, 2, 4, 0);
    run_pattern(&d, "OOOGGG", e);
}

ZT_TEST(overflow_at_min_scale_is_an_error_by_default)
{
    /* The same start with at_min left at 0 (DeepSpeed's raise_error_at_min_scale = true):
       the cut to the minimum is fine, the next cut is refused and changes nothing. With
       hysteresis 2 an overflow at the minimum that is only absorbed is no error. */
    zero_scaler_desc d = dyn(10, 2, 1, 2, 4, 0);
    zero_scaler s, before;
    d.at_min = ZERO_SCALER_AT_MIN_DEFAULT;
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_F16) == ZERO_OK && s.error_at_min);
    ZT_CHECK(zero_scaler_update(&s, 1) == ZERO_OK && s.scale == 2.5f);
    ZT_CHECK(zero_scaler_update(&s, 1) == ZERO_OK && s.scale == 2.0f);
    before = s;
    ZT_CHECK(zero_scaler_update(&s, 1) == ZERO_ERROR_LOSS_SCALE);
    ZT_CHECK(memcmp(&s, &before, sizeof s) == 0);
    ZT_CHECK(zero_scaler_update(&s, 0) == ZERO_OK && s.iter == 3); /* a good step goes on */
    d.at_min = ZERO_SCALER_AT_MIN_ERROR;
    d.hysteresis = 2;
    d.init_scale = 2;
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_F16) == ZERO_OK);
    ZT_CHECK(zero_scaler_update(&s, 1) == ZERO_OK && s.cur_hysteresis == 1); /* absorbed */
    ZT_CHECK(zero_scaler_update(&s, 1) == ZERO_ERROR_LOSS_SCALE && s.scale == 2.0f);
    /* static and none never raise */
    d.mode = ZERO_SCALER_STATIC;
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_F16) == ZERO_OK);
    ZT_CHECK(zero_scaler_update(&s, 1) == ZERO_OK && zero_scaler_update(&s, 1) == ZERO_OK);
    ZT_CHECK(zero_scaler_update(NULL, 1) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strcmp(zero_result_string(ZERO_ERROR_LOSS_SCALE), "unknown result") != 0);
}

ZT_TEST(defaults_grow_on_the_good_step_after_1000)
{
    zero_scaler s;
    int i;
    ZT_CHECK(zero_scaler_init(&s, NULL, ZERO_F16) == ZERO_OK);
    ZT_CHECK(s.dynamic && s.scale == 65536.0f && s.window == 1000 && s.hysteresis == 2 &&
             s.cur_hysteresis == 2 && s.min_scale == 1.0f && s.factor == 2.0f &&
             !s.consecutive_hysteresis && s.iter == 0 && s.last_overflow_iter == -1);
    ZT_CHECK(s.error_at_min);
    for (i = 0; i < 1000; i++) zero_scaler_update(&s, 0);
    ZT_CHECK(s.scale == 65536.0f); /* 1000 good steps: not yet (DeepSpeed <= 0.17.0 grew here) */
    zero_scaler_update(&s, 0);
    ZT_CHECK(s.scale == 131072.0f); /* the 1001st: 1000 good steps before it */
    zero_scaler_update(&s, 1);      /* iter 1001: absorbed by hysteresis (2 -> 1) */
    ZT_CHECK(s.scale == 131072.0f && s.cur_hysteresis == 1);
    zero_scaler_update(&s, 1); /* iter 1002: cut */
    ZT_CHECK(s.scale == 65536.0f && s.last_overflow_iter == 1002);
    for (i = 0; i < 1000; i++) zero_scaler_update(&s, 0);
    ZT_CHECK(s.scale == 65536.0f);
    zero_scaler_update(&s, 0); /* iter 2003: 1000 good steps after the cut before it */
    ZT_CHECK(s.scale == 131072.0f && s.cur_hysteresis == 2 && s.iter == 2004);
}

/* A second simulator, structured differently: it counts the run of good steps since the
   last overflow (the start counts as an overflow just before step 0) and the overflows
   absorbed since the last refill. DeepSpeed 0.17.1's growth: a good step that has a
   positive multiple of 'window' good steps before it in the run. Returns 1 where
   DeepSpeed would raise (a cut due while the scale is at the minimum), changing nothing. */
typedef struct sim {
    double scale, min, factor;
    int window, hyst, consecutive, raise;
    long run;     /* good steps since the last overflow, this one included */
    int absorbed; /* overflows absorbed since the hysteresis was last refilled */
} sim;

static int sim_step(sim *m, int overflow)
{
    if (overflow) {
        if (m->hyst - m->absorbed <= 1) {
            if (m->raise && m->scale <= m->min) return 1;
            m->scale = m->scale / m->factor < m->min ? m->min : m->scale / m->factor;
        } else {
            m->absorbed++;
        }
        m->run = 0;
        return 0;
    }
    m->run++;
    if (m->consecutive) m->absorbed = 0;
    if (m->run > 1 && (m->run - 1) % m->window == 0) {
        m->absorbed = 0;
        m->scale *= m->factor;
    }
    return 0;
}

ZT_TEST(random_patterns_match_a_second_simulator)
{
    int trial, step, steps = zt_quick() ? 2000 : 20000;
    long total_raised = 0;
    zt_seed(11);
    for (trial = 0; trial < 40; trial++) {
        zero_scaler s;
        sim m;
        int window = 1 + (int)(zt_rand64() % 7), hyst = 1 + (int)(zt_rand64() % 4);
        int consecutive = (int)(zt_rand64() % 2);
        double p_over = 0.05 + 0.5 * zt_uniform();
        /* powers of two stay exact in both float and double over these ranges */
        zero_scaler_desc d = dyn(1024, window, hyst, 1.0f / 64, 2, consecutive);
        int raised = 0;
        m.raise = trial % 2; /* half the trials with DeepSpeed's default */
        if (m.raise) d.at_min = ZERO_SCALER_AT_MIN_DEFAULT;
        ZT_CHECK(zero_scaler_init(&s, &d, ZERO_F16) == ZERO_OK);
        m.scale = 1024;
        m.min = 1.0 / 64;
        m.factor = 2;
        m.window = window;
        m.hyst = hyst;
        m.consecutive = consecutive;
        m.run = 0;
        m.absorbed = 0;
        for (step = 0; step < steps; step++) {
            int o = zt_uniform() < p_over;
            zero_result r = zero_scaler_update(&s, o);
            int ra = sim_step(&m, o);
            raised += ra;
            if (r != (ra ? ZERO_ERROR_LOSS_SCALE : ZERO_OK)) {
                ZT_CHECKF(0, "trial %d step %d: update returned %d, simulator raised %d", trial,
                          step, (int)r, ra);
                return;
            }
            if (m.scale > 1e30) m.scale = s.scale; /* past the test's range: resync */
            if ((double)s.scale != m.scale) {
                ZT_CHECKF(0, "trial %d (window %d hyst %d consecutive %d) step %d: %g vs %g",
                          trial, window, hyst, consecutive, step, (double)s.scale, m.scale);
                return;
            }
        }
        total_raised += raised;
    }
    ZT_CHECKF(total_raised > 0, "no trial reached the minimum: the error path went untested");
}

ZT_TEST(scale_never_becomes_infinite)
{
    zero_scaler s;
    zero_scaler_desc d = dyn(0x1p126f, 1, 2, 1, 2, 0);
    int i;
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_F16) == ZERO_OK);
    for (i = 0; i < 10; i++) zero_scaler_update(&s, 0);
    ZT_CHECK(s.scale == 0x1p127f);
}

ZT_TEST(static_none_and_default_modes)
{
    zero_scaler s;
    zero_scaler_desc d;
    int i;
    memset(&d, 0, sizeof d);
    d.mode = ZERO_SCALER_STATIC;
    d.init_scale = 128;
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_F16) == ZERO_OK && !s.dynamic && s.scale == 128);
    for (i = 0; i < 50; i++) zero_scaler_update(&s, i % 3 == 0);
    ZT_CHECK(s.scale == 128 && s.iter == 50 && s.last_overflow_iter == 48);
    d.mode = ZERO_SCALER_NONE;
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_F16) == ZERO_OK && !s.dynamic && s.scale == 1);
    zero_scaler_update(&s, 1);
    ZT_CHECK(s.scale == 1 && s.iter == 1);
    d.mode = ZERO_SCALER_DEFAULT;
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_BF16) == ZERO_OK && !s.dynamic && s.scale == 1);
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_F32) == ZERO_OK && !s.dynamic && s.scale == 1);
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_F16) == ZERO_OK && s.dynamic && s.scale == 128);
    d.init_scale = 0;
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_F16) == ZERO_OK && s.dynamic && s.scale == 65536);
    d.mode = ZERO_SCALER_DYNAMIC; /* dynamic on bf16 when asked for */
    ZT_CHECK(zero_scaler_init(&s, &d, ZERO_BF16) == ZERO_OK && s.dynamic);
    ZT_CHECK(zero_scaler_update(NULL, 1) == ZERO_ERROR_INVALID_ARGUMENT); /* no-op */
}

ZT_TEST(validation_names_the_field_and_writes_nothing)
{
    static const struct {
        const char *field;
        zero_scaler_desc d;
    } bad[] = {
        {"init_scale", {ZERO_SCALER_DYNAMIC, -1.0f, 0, 0, 0, 0, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"init_scale", {ZERO_SCALER_STATIC, INFINITY, 0, 0, 0, 0, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"init_scale", {ZERO_SCALER_DYNAMIC, NAN, 0, 0, 0, 0, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"window", {ZERO_SCALER_DYNAMIC, 0, -5, 0, 0, 0, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"hysteresis", {ZERO_SCALER_DYNAMIC, 0, 0, -1, 0, 0, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"min_scale", {ZERO_SCALER_DYNAMIC, 0, 0, 0, -2.0f, 0, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"min_scale", {ZERO_SCALER_DYNAMIC, 0, 0, 0, NAN, 0, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"min_scale", {ZERO_SCALER_DYNAMIC, 4.0f, 0, 0, 8.0f, 0, 0, ZERO_SCALER_AT_MIN_DEFAULT}}, /* above init */
        {"factor", {ZERO_SCALER_DYNAMIC, 0, 0, 0, 0, 1.0f, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"factor", {ZERO_SCALER_DYNAMIC, 0, 0, 0, 0, 0.5f, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"factor", {ZERO_SCALER_DYNAMIC, 0, 0, 0, 0, INFINITY, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"mode", {(zero_scaler_mode)7, 0, 0, 0, 0, 0, 0, ZERO_SCALER_AT_MIN_DEFAULT}},
        {"at_min", {ZERO_SCALER_DYNAMIC, 0, 0, 0, 0, 0, 0, (zero_scaler_at_min)3}},
    };
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        zero_scaler s, before;
        memset(&s, 0xab, sizeof s);
        before = s;
        ZT_CHECKF(zero_scaler_init(&s, &bad[i].d, ZERO_F16) == ZERO_ERROR_INVALID_ARGUMENT,
                  "case %zu", i);
        ZT_CHECKF(strstr(zero_last_error(), bad[i].field) != NULL, "case %zu: \"%s\"", i,
                  zero_last_error());
        ZT_CHECKF(memcmp(&s, &before, sizeof s) == 0, "case %zu wrote the scaler", i);
    }
    ZT_CHECK(zero_scaler_init(NULL, NULL, ZERO_F16) == ZERO_ERROR_INVALID_ARGUMENT);
    {
        zero_scaler s;
        ZT_CHECK(zero_scaler_init(&s, NULL, ZERO_DTYPE_DEFAULT) == ZERO_ERROR_INVALID_ARGUMENT);
        ZT_CHECK(strstr(zero_last_error(), "param_dtype") != NULL);
    }
}

/* The engine: an overflow at the minimum scale fails zero_engine_step with LOSS_SCALE on
   every rank, skips the step (master and step count as before) and leaves the engine
   usable; with at_min = SKIP the same step is an ordinary skipped step. 2 ranks, fp16,
   init_scale = min_scale = 1, hysteresis 1; rank 1 puts an inf in the first step. */
typedef struct at_min_run {
    zero_scaler_at_min at_min;
    int async;                   /* async_step: step(e, NULL), then the verdict is read later */
    zero_result enqueued[2];     /* async: what step(e, NULL) returned                        */
    zero_result first[2], second[2];
    int skipped[2];
    int64_t steps_after_first[2], steps_after_second[2];
    int master_kept[2];
    char err[2][512];
} at_min_run;

static zero_result at_min_rank(int rank, zero_comm *comm, void *user)
{
    at_min_run *A = (at_min_run *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_step_info info;
    zero_range rg;
    float w[40], before[40], after[40];
    int t, i, k;
    zero_result r;
    for (i = 0; i < 40; i++) w[i] = 0.01f * (float)(i + 1), before[i] = after[i] = 0.0f;
    r = zero_host_device_create(NULL, &dev);
    if (r != ZERO_OK) return r;
    memset(&d, 0, sizeof d);
    d.stage = 2;
    d.device = dev;
    d.comm = comm;
    d.param_dtype = ZERO_F16;
    d.scaler.init_scale = 1.0f;
    d.scaler.hysteresis = 1;
    d.scaler.at_min = A->at_min;
    d.async_step = A->async;
    r = zero_engine_create(&d, &e);
    if (r == ZERO_OK) r = zero_engine_add_tensor(e, "w", 40, 0, 0, &t);
    if (r == ZERO_OK) r = zero_engine_commit(e);
    if (r == ZERO_OK) r = zero_engine_set_tensor(e, t, w);
    if (r == ZERO_OK) r = zero_engine_read_tensor(e, t, ZERO_STATE_MASTER, before, &rg);
    for (k = 0; k < 2 && r == ZERO_OK; k++) {
        uint16_t *g = NULL;
        r = zero_engine_grads(e, 0, (void **)&g);
        if (r != ZERO_OK) break;
        for (i = 0; i < 40; i++) g[i] = zero_f32_to_f16(0.5f);
        if (k == 0 && rank == 1) g[3] = zero_f32_to_f16(INFINITY);
        r = zero_engine_grads_ready(e, 0);
        if (r != ZERO_OK) break;
        memset(&info, 0, sizeof info);
        if (A->async && k == 0) {
            /* the step is enqueued; a value query reads the verdict but cannot return its
               error, which the next call that can (here last_step) returns once */
            A->enqueued[rank] = zero_engine_step(e, NULL);
            (void)zero_engine_loss_scale(e);
            r = zero_engine_last_step(e, &info);
        } else {
            r = zero_engine_step(e, &info);
        }
        if (k == 0) {
            A->first[rank] = r;
            A->skipped[rank] = info.skipped;
            A->steps_after_first[rank] = zero_engine_step_count(e);
            snprintf(A->err[rank], sizeof A->err[rank], "%s", zero_last_error());
            if (zero_engine_read_tensor(e, t, ZERO_STATE_MASTER, after, &rg) == ZERO_OK)
                A->master_kept[rank] = memcmp(before, after, sizeof before) == 0;
            if (r == ZERO_ERROR_LOSS_SCALE) r = ZERO_OK; /* go on: the engine is usable */
        } else {
            A->second[rank] = r;
            A->steps_after_second[rank] = zero_engine_step_count(e);
        }
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(engine_step_reports_overflow_at_min_scale)
{
    int m, mode, rank;
    for (m = 0; m < 3; m++) { /* default (error), SKIP, default with async_step */
        at_min_run A;
        memset(&A, 0, sizeof A);
        mode = m == 1;
        A.async = m == 2;
        A.at_min = mode ? ZERO_SCALER_AT_MIN_SKIP : ZERO_SCALER_AT_MIN_DEFAULT;
        A.first[0] = A.first[1] = A.second[0] = A.second[1] = ZERO_ERROR_INVALID_STATE;
        ZT_CHECKF(zero_local_run(2, at_min_rank, &A) == ZERO_OK, "%s", zero_last_error());
        for (rank = 0; rank < 2; rank++) {
            ZT_CHECKF(A.first[rank] == (mode ? ZERO_OK : ZERO_ERROR_LOSS_SCALE),
                      "at_min %d rank %d: %d", mode, rank, (int)A.first[rank]);
            if (!mode)
                ZT_CHECKF(strstr(A.err[rank], "minimum loss scale") &&
                              strstr(A.err[rank], "ZERO_SCALER_AT_MIN_SKIP"),
                          "the message says what to do: %s", A.err[rank]);
            ZT_CHECK(A.skipped[rank] == 1 && A.steps_after_first[rank] == 0);
            ZT_CHECK(A.master_kept[rank]);
            ZT_CHECK(A.second[rank] == ZERO_OK && A.steps_after_second[rank] == 1);
            if (A.async) ZT_CHECKF(A.enqueued[rank] == ZERO_OK, "async enqueue %d", (int)A.enqueued[rank]);
        }
    }
}

int main(void)
{
    ZT_RUN(hysteresis_1_window_3);
    ZT_RUN(hysteresis_2_not_consecutive);
    ZT_RUN(hysteresis_2_consecutive);
    ZT_RUN(hysteresis_3_window_1);
    ZT_RUN(min_scale_clamp_with_factor_4);
    ZT_RUN(overflow_at_min_scale_is_an_error_by_default);
    ZT_RUN(engine_step_reports_overflow_at_min_scale);
    ZT_RUN(defaults_grow_on_the_good_step_after_1000);
    ZT_RUN(random_patterns_match_a_second_simulator);
    ZT_RUN(scale_never_becomes_infinite);
    ZT_RUN(static_none_and_default_modes);
    ZT_RUN(validation_names_the_field_and_writes_nothing);
    return zt_summary();
}
