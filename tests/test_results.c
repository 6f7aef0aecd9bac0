/* Results, error detail, dtypes and allocation hooks. */
#define _XOPEN_SOURCE 700 /* zero.h is linked (build/zero_impl.o); its private helpers: tests/zt_private.h */
#include "zero.h"
#include "tests/zt.h"
#include "tests/zt_private.h"

ZT_TEST(result_strings_are_distinct)
{
    zero_result all[] = {ZERO_OK, ZERO_ERROR_INVALID_ARGUMENT, ZERO_ERROR_OUT_OF_MEMORY,
                         ZERO_ERROR_INVALID_STATE, ZERO_ERROR_NOT_FOUND, ZERO_ERROR_OVERFLOW,
                         ZERO_ERROR_MISMATCH, ZERO_ERROR_DEVICE, ZERO_ERROR_COMM,
                         ZERO_ERROR_TIMEOUT, ZERO_ERROR_IO, ZERO_ERROR_UNSUPPORTED,
                         ZERO_ERROR_LOSS_SCALE};
    size_t n = sizeof all / sizeof all[0], i, j;
    for (i = 0; i < n; i++) {
        ZT_CHECK(zero_result_string(all[i]) != NULL);
        ZT_CHECKF(i == 0 || (int)all[i] < 0, "code %d", (int)all[i]);
        for (j = 0; j < i; j++)
            ZT_CHECKF(strcmp(zero_result_string(all[i]), zero_result_string(all[j])) != 0,
                      "%d and %d share a string", (int)all[i], (int)all[j]);
    }
    ZT_CHECK(strcmp(zero_result_string((zero_result)-999), "unknown result") == 0);
}

ZT_TEST(error_detail_is_kept_and_cleared)
{
    zero_result r = zt_fail(ZERO_ERROR_INVALID_ARGUMENT, "world = %d", -3);
    ZT_CHECK(r == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strcmp(zero_last_error(), "world = -3") == 0);
    zero_clear_error();
    ZT_CHECK(zero_last_error()[0] == '\0');
}

ZT_TEST(dtype_sizes)
{
    ZT_CHECK(zero_dtype_size(ZERO_F32) == sizeof(float));
    ZT_CHECK(zero_dtype_size(ZERO_F64) == sizeof(double));
    ZT_CHECK(zero_dtype_size(ZERO_F16) == 2 && zero_dtype_size(ZERO_BF16) == 2);
    ZT_CHECK(zero_dtype_size(ZERO_DTYPE_DEFAULT) == 0);
    ZT_CHECK(strcmp(zero_dtype_name(ZERO_BF16), "bf16") == 0);
}

static size_t hook_live;
static void *hook_alloc(size_t bytes, void *user)
{
    (void)user;
    hook_live++;
    return malloc(bytes);
}
static void hook_free(void *p, void *user)
{
    (void)user;
    hook_live--;
    free(p);
}

ZT_TEST(allocator_hooks_are_used)
{
    zero_allocator a = {hook_alloc, hook_free, NULL};
    void *p = zt_alloc(&a, 64);
    ZT_CHECK(p != NULL && hook_live == 1);
    zt_free(&a, p);
    ZT_CHECK(hook_live == 0);
    ZT_CHECK(zt_alloc(&a, 0) == NULL && hook_live == 0);
}

ZT_TEST(size_arithmetic_detects_overflow)
{
    size_t out = 0;
    ZT_CHECK(zt_mul_size((size_t)-1 / 2 + 1, 2, &out) == -1);
    ZT_CHECK(zt_mul_size(1000, 8, &out) == 0 && out == 8000);
    ZT_CHECK(zt_add_size((size_t)-1, 1, &out) == -1);
    ZT_CHECK(zt_add_size(5, 6, &out) == 0 && out == 11);
}

int main(void)
{
    ZT_RUN(result_strings_are_distinct);
    ZT_RUN(error_detail_is_kept_and_cleared);
    ZT_RUN(dtype_sizes);
    ZT_RUN(allocator_hooks_are_used);
    ZT_RUN(size_arithmetic_detects_overflow);
    return zt_summary();
}
