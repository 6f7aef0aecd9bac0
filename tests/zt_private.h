/* zero.h's private helpers that tests call, under external names: defined in
   tests/zero_impl.c (build/zero_impl.o), so a test that links that object needs no
   implementation of its own. zt_fail is zero__fail: records the detail zero_last_error()
   returns and returns 'result' (an injected failure's message). */
#ifndef ZT_PRIVATE_H
#define ZT_PRIVATE_H
#include "zero.h"

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
zero_result zt_fail(zero_result result, const char *fmt, ...);
void *zt_alloc(const zero_allocator *a, size_t bytes);
void zt_free(const zero_allocator *a, void *ptr);
int zt_mul_size(size_t n, size_t size, size_t *out);
int zt_add_size(size_t a, size_t b, size_t *out);
/* The host Adam streams its param copy (non-temporal stores) when a range moves more than
   'bytes' (0: the last-level cache's size, the default). */
void zt_set_adam_stream_bytes(size_t bytes);
#endif
