/* The implementation of zero.h, and of zero_nccl.h's TCP bootstrap (the part that needs
   neither CUDA nor NCCL), compiled once (build/zero_impl.o) and linked into every test
   program that does not define ZERO_IMPLEMENTATION itself (see the Makefile). Below it, the
   few private helpers tests call, given external names (tests/zt_private.h declares them),
   so that those tests link this object instead of compiling zero.h again. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#define ZERO_NCCL_BOOTSTRAP_ONLY
#define ZERO_NCCL_IMPLEMENTATION
#include "zero_nccl.h"
#include "tests/zt_private.h"

zero_result zt_fail(zero_result result, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    return zero__fail(result, "%s", text);
}

void *zt_alloc(const zero_allocator *a, size_t bytes) { return zero__alloc(a, bytes); }
void zt_free(const zero_allocator *a, void *ptr) { zero__free(a, ptr); }
int zt_mul_size(size_t n, size_t size, size_t *out) { return zero__mul_size(n, size, out); }
int zt_add_size(size_t a, size_t b, size_t *out) { return zero__add_size(a, b, out); }
void zt_set_adam_stream_bytes(size_t bytes)
{
#ifdef ZERO__X86_SIMD
    zero__adam_stream_bytes = bytes;
#else
    (void)bytes;
#endif
}
