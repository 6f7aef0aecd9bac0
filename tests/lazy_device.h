/* A host device whose large buffers (>= LZ_BIG bytes) are untouched anonymous mappings: the
   kernel hands out zero pages on first touch, so an engine can commit real model shapes
   (GPT-2 124M on 4 thread-ranks: ~3.5 GB) while only what is written takes memory, and the
   engine's own byte counts stay exact. Small buffers go to the host device. Include after
   zero.h in a test compiled with _DEFAULT_SOURCE (MAP_ANONYMOUS, MAP_NORESERVE). */
#ifndef ZERO_TESTS_LAZY_DEVICE_H
#define ZERO_TESTS_LAZY_DEVICE_H
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>

#define LZ_MAX 64
#define LZ_BIG ((size_t)1 << 20)
static const zero_device_ops *lz_host_ops;
static zero_device_ops lz_ops;
static pthread_mutex_t lz_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t n; } lz_maps[LZ_MAX];

static int lz_find(const void *p)
{
    int i;
    for (i = 0; i < LZ_MAX; i++)
        if (lz_maps[i].p && (const char *)p >= (const char *)lz_maps[i].p &&
            (const char *)p < (const char *)lz_maps[i].p + lz_maps[i].n)
            return i;
    return -1;
}

static zero_result lz_alloc(zero_device *d, size_t bytes, zero_mem_category cat, void **out)
{
    void *p;
    int i;
    if (bytes < LZ_BIG) return lz_host_ops->alloc(d, bytes, cat, out);
    p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return ZERO_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lz_mu);
    for (i = 0; i < LZ_MAX && lz_maps[i].p; i++) {}
    if (i < LZ_MAX) lz_maps[i].p = p, lz_maps[i].n = bytes;
    pthread_mutex_unlock(&lz_mu);
    if (i == LZ_MAX) {
        munmap(p, bytes);
        return ZERO_ERROR_OUT_OF_MEMORY;
    }
    *out = p;
    return ZERO_OK;
}

static zero_result lz_free(zero_device *d, void *p)
{
    int i;
    pthread_mutex_lock(&lz_mu);
    i = lz_find(p);
    if (i >= 0) {
        munmap(lz_maps[i].p, lz_maps[i].n);
        lz_maps[i].p = NULL;
    }
    pthread_mutex_unlock(&lz_mu);
    return i < 0 ? lz_host_ops->free(d, p) : ZERO_OK;
}

static zero_result lz_fill_zero(zero_device *d, zero_queue q, void *p, size_t bytes)
{
    int i;
    pthread_mutex_lock(&lz_mu);
    i = lz_find(p);
    pthread_mutex_unlock(&lz_mu);
    if (i >= 0) return ZERO_OK; /* untouched since mmap: zero pages already */
    return lz_host_ops->fill_zero(d, q, p, bytes);
}

static zero_result lz_device_create(zero_device **out, zero_device **host)
{
    zero_result r = zero_host_device_create(NULL, host);
    zero_device *d;
    if (r != ZERO_OK) return r;
    lz_host_ops = (*host)->ops;
    lz_ops = *(*host)->ops;
    lz_ops.alloc = lz_alloc;
    lz_ops.free = lz_free;
    lz_ops.fill_zero = lz_fill_zero;
    d = (zero_device *)malloc(sizeof *d);
    if (!d) return ZERO_ERROR_OUT_OF_MEMORY;
    *d = **host;
    d->ops = &lz_ops;
    *out = d;
    return ZERO_OK;
}
#endif
