/* The loss scaler: exact scale sequences for planned overflow patterns, worked out by hand
   from DeepSpeed's rule (see the scaler implementation in zero.h), plus a second simulator written
   differently (a run-length counter instead of iteration arithmetic) for long random
   patterns, modes, defaults and validation. */
#include "zero.h"
#include "tests/zt.h"

static zero_scaler_desc dyn(float init, int window, int hyst, float min, float factor,
                            int consecutive)
{
    zero_scaler_desc d;
    memset(&d, 0, sizeof d);
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
        zero_scaler_update(&s, pattern[i] == 'O');
        ZT_CHECKF(s.scale == expected[i], "step %zu ('%c'): scale %g, expected %g", i,
                  pattern[i], (double)s.scale, (double)expected[i]);
        ZT_CHECK(s.iter == (int64_t)i + 1);
    }
}

ZT_TEST(hysteresis_1_window_3)
{
    /* init 16, window 3, hysteresis 1 (every overflow cuts), min 1, factor 2.
       Growth when (iter - last_overflow) % 3 == 0, last_overflow starting at -1:
       iter 0,1 good: 16 16; iter 2: (2+1)%3==0 -> 32; 3,4: 32 32; 5: 6%3==0 -> 64;
       6 O: 32 (last=6); 7,8: 32 32; 9: (9-6)%3==0 -> 64;
       10..16 O: 32 16 8 4 2 1 then max(0.5, 1) = 1. */
    static const float e[] = {16, 16, 32, 32, 32, 64, 32, 32, 32, 64, 32, 16, 8, 4, 2, 1, 1};
    zero_scaler_desc d = dyn(16, 3, 1, 1, 2, 0);
    run_pattern(&d, "GGGGGGOGGGOOOOOOO", e);
}

ZT_TEST(hysteresis_2_not_consecutive)
{
    /* init 1024, window 2, hysteresis 2, consecutive off: a good step does not refill
       the hysteresis, only a growth does.
       0 O: cur_h 2 -> 1, no cut, last=0        1024
       1 G: (1-0)%2 != 0                         1024
       2 O: cur_h == 1 -> cut, last=2            512
       3 G: (3-2)%2 != 0                         512
       4 G: (4-2)%2 == 0 -> grow, cur_h = 2      1024
       5 G: 3%2 != 0                             1024
       6 O: cur_h 2 -> 1, last=6                 1024
       7 O: cut, last=7                          512
       8 G: 1                                    512
       9 G: 2 -> grow                            1024 */
    static const float e[] = {1024, 1024, 512, 512, 1024, 1024, 1024, 512, 512, 1024};
    zero_scaler_desc d = dyn(1024, 2, 2, 1, 2, 0);
    run_pattern(&d, "OGOGGGOOGG", e);
}

ZT_TEST(hysteresis_2_consecutive)
{
    /* The same pattern with consecutive_hysteresis: every good step refills cur_h, so only
       back-to-back overflows cut.
       0 O: 2 -> 1, last=0                       1024
       1 G: cur_h = 2; 1%2 != 0                  1024
       2 O: 2 -> 1, no cut, last=2               1024
       3 G: cur_h = 2; 1                         1024
       4 G: 2%2 == 0 -> grow                     2048
       5 G: 3                                    2048
       6 O: 2 -> 1, last=6                       2048
       7 O: cut, last=7                          1024
       8 G: cur_h = 2; 1                         1024
       9 G: 2 -> grow                            2048 */
    static const float e[] = {1024, 1024, 1024, 1024, 2048, 2048, 2048, 1024, 1024, 2048};
    zero_scaler_desc d = dyn(1024, 2, 2, 1, 2, 1);
    run_pattern(&d, "OGOGGGOOGG", e);
}

ZT_TEST(hysteresis_3_window_1)
{
    /* init 8, window 1 (every good step grows), hysteresis 3, consecutive off.
       0 O: 3 -> 2              8
       1 G: grow, cur_h = 3     16
       2 O: 3 -> 2              16
       3 O: 2 -> 1              16
       4 O: cut                 8
       5 O: cut (cur_h stays 1) 4
       6 G: grow, cur_h = 3     8
       7 O: 3 -> 2              8 */
    static const float e[] = {8, 16, 16, 16, 8, 4, 8, 8};
    zero_scaler_desc d = dyn(8, 1, 3, 1, 2, 0);
    run_pattern(&d, "OGOOOOGO", e);
}

ZT_TEST(min_scale_clamp_with_factor_4)
{
    /* init 10, min 2, factor 4, window 2, hysteresis 1:
       0 O: 10/4 = 2.5                     2.5
       1 O: 2.5/4 = 0.625, clamped to 2    2
       2 O: 0.5 -> 2, last=2               2
       3 G: (3-2)%2 != 0                   2
       4 G: (4-2)%2 == 0 -> 2 * 4          8 */
    static const float e[] = {2.5f, 2, 2, 2, 8};
    zero_scaler_desc d = dyn(10, 2, 1, 2, 4, 0);
    run_pattern(&d, "OOOGG", e);
}

ZT_TEST(defaults_grow_after_exactly_1000_good_steps)
{
    zero_scaler s;
    int i;
    ZT_CHECK(zero_scaler_init(&s, NULL, ZERO_F16) == ZERO_OK);
    ZT_CHECK(s.dynamic && s.scale == 65536.0f && s.window == 1000 && s.hysteresis == 2 &&
             s.cur_hysteresis == 2 && s.min_scale == 1.0f && s.factor == 2.0f &&
             !s.consecutive_hysteresis && s.iter == 0 && s.last_overflow_iter == -1);
    for (i = 0; i < 999; i++) zero_scaler_update(&s, 0);
    ZT_CHECK(s.scale == 65536.0f); /* 999 good steps: not yet */
    zero_scaler_update(&s, 0);
    ZT_CHECK(s.scale == 131072.0f); /* the 1000th */
    zero_scaler_update(&s, 1);      /* iter 1000: absorbed by hysteresis (2 -> 1) */
    ZT_CHECK(s.scale == 131072.0f && s.cur_hysteresis == 1);
    zero_scaler_update(&s, 1); /* iter 1001: cut */
    ZT_CHECK(s.scale == 65536.0f && s.last_overflow_iter == 1001);
    for (i = 0; i < 999; i++) zero_scaler_update(&s, 0);
    ZT_CHECK(s.scale == 65536.0f);
    zero_scaler_update(&s, 0); /* iter 2001: 1000 good steps after the cut */
    ZT_CHECK(s.scale == 131072.0f && s.cur_hysteresis == 2 && s.iter == 2002);
}

/* A second simulator, structured differently: it counts the run of good steps since the
   last overflow (the start counts as an overflow just before step 0) and the overflows
   absorbed since the last refill. */
typedef struct sim {
    double scale, min, factor;
    int window, hyst, consecutive;
    long run;     /* steps since the last overflow, this one included */
    int absorbed; /* overflows absorbed since the hysteresis was last refilled */
} sim;

static void sim_step(sim *m, int overflow)
{
    if (overflow) {
        m->run = 0;
        if (m->hyst - m->absorbed <= 1) {
            m->scale = m->scale / m->factor < m->min ? m->min : m->scale / m->factor;
        } else {
            m->absorbed++;
        }
        return;
    }
    m->run++;
    if (m->consecutive) m->absorbed = 0;
    if (m->run % m->window == 0) {
        m->absorbed = 0;
        m->scale *= m->factor;
    }
}

ZT_TEST(random_patterns_match_a_second_simulator)
{
    int trial, step, steps = zt_quick() ? 2000 : 20000;
    zt_seed(11);
    for (trial = 0; trial < 40; trial++) {
        zero_scaler s;
        sim m;
        int window = 1 + (int)(zt_rand64() % 7), hyst = 1 + (int)(zt_rand64() % 4);
        int consecutive = (int)(zt_rand64() % 2);
        double p_over = 0.05 + 0.5 * zt_uniform();
        /* powers of two stay exact in both float and double over these ranges */
        zero_scaler_desc d = dyn(1024, window, hyst, 1.0f / 64, 2, consecutive);
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
            zero_scaler_update(&s, o);
            sim_step(&m, o);
            if (m.scale > 1e30) m.scale = s.scale; /* past the test's range: resync */
            if ((double)s.scale != m.scale) {
                ZT_CHECKF(0, "trial %d (window %d hyst %d consecutive %d) step %d: %g vs %g",
                          trial, window, hyst, consecutive, step, (double)s.scale, m.scale);
                return;
            }
        }
    }
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
    zero_scaler_update(NULL, 1); /* no-op */
}

ZT_TEST(validation_names_the_field_and_writes_nothing)
{
    static const struct {
        const char *field;
        zero_scaler_desc d;
    } bad[] = {
        {"init_scale", {ZERO_SCALER_DYNAMIC, -1.0f, 0, 0, 0, 0, 0}},
        {"init_scale", {ZERO_SCALER_STATIC, INFINITY, 0, 0, 0, 0, 0}},
        {"init_scale", {ZERO_SCALER_DYNAMIC, NAN, 0, 0, 0, 0, 0}},
        {"window", {ZERO_SCALER_DYNAMIC, 0, -5, 0, 0, 0, 0}},
        {"hysteresis", {ZERO_SCALER_DYNAMIC, 0, 0, -1, 0, 0, 0}},
        {"min_scale", {ZERO_SCALER_DYNAMIC, 0, 0, 0, -2.0f, 0, 0}},
        {"min_scale", {ZERO_SCALER_DYNAMIC, 0, 0, 0, NAN, 0, 0}},
        {"min_scale", {ZERO_SCALER_DYNAMIC, 4.0f, 0, 0, 8.0f, 0, 0}}, /* above init */
        {"factor", {ZERO_SCALER_DYNAMIC, 0, 0, 0, 0, 1.0f, 0}},
        {"factor", {ZERO_SCALER_DYNAMIC, 0, 0, 0, 0, 0.5f, 0}},
        {"factor", {ZERO_SCALER_DYNAMIC, 0, 0, 0, 0, INFINITY, 0}},
        {"mode", {(zero_scaler_mode)7, 0, 0, 0, 0, 0, 0}},
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

int main(void)
{
    ZT_RUN(hysteresis_1_window_3);
    ZT_RUN(hysteresis_2_not_consecutive);
    ZT_RUN(hysteresis_2_consecutive);
    ZT_RUN(hysteresis_3_window_1);
    ZT_RUN(min_scale_clamp_with_factor_4);
    ZT_RUN(defaults_grow_after_exactly_1000_good_steps);
    ZT_RUN(random_patterns_match_a_second_simulator);
    ZT_RUN(scale_never_becomes_infinite);
    ZT_RUN(static_none_and_default_modes);
    ZT_RUN(validation_names_the_field_and_writes_nothing);
    return zt_summary();
}
