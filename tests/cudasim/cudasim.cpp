/* cudasim.cpp - the CUDA runtime of the harness (tests/cudasim/README.md, docs/cuda.md).

   Devices: CUDASIM_DEVICES of them (default 4), each CUDASIM_MEM bytes (default 16G) and
   CUDASIM_SMS multiprocessors (default 4). Device memory is host memory (posix_memalign),
   registered by address with its device, so a kernel argument or a copy operand can be
   checked (check_access). Streams are worker threads; an op waits for the ops it depends on
   (its stream's earlier ops, the legacy-stream rules, cudaStreamWaitEvent) through the
   mutex of the stream it waits on, so ThreadSanitizer sees exactly CUDA's ordering and no
   more. A kernel runs block by block on its stream's worker; the threads of a block are
   fibers (own stacks, switched at __syncthreads and shuffles). */
#include "cudasim.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <elf.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CUDASIM_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define CUDASIM_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(CUDASIM_ASAN)
#define CUDASIM_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(CUDASIM_TSAN)
#define CUDASIM_TSAN 1
#endif
#ifdef CUDASIM_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef CUDASIM_TSAN
extern "C" {
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void *fiber);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
}
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace cudasim {
struct stream_impl;
}

struct CUstream_st {
    std::shared_ptr<cudasim::stream_impl> s;
};

namespace cudasim {

/* ====================================================================================
   Configuration, errors
   ==================================================================================== */

static size_t env_size(const char *name, size_t def)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end = NULL;
    double x = strtod(v, &end);
    if (end && (*end == 'k' || *end == 'K')) x *= 1024.0;
    else if (end && (*end == 'm' || *end == 'M')) x *= 1024.0 * 1024.0;
    else if (end && (*end == 'g' || *end == 'G')) x *= 1024.0 * 1024.0 * 1024.0;
    return x > 0 ? (size_t)x : 0;
}

enum { MAX_DEV = 16 };

struct alloc_rec {
    size_t size;
    int device; /* -1: pinned host memory */
};

struct device_state {
    std::shared_ptr<stream_impl> legacy;
    std::vector<std::weak_ptr<stream_impl>> streams; /* every stream of the device */
    size_t used = 0;
    std::atomic<int> sticky{0};
    bool peer[MAX_DEV] = {};
};

struct globals {
    std::mutex mu; /* the registries below (never held while waiting for a stream) */
    int ndev;
    size_t mem;
    int sms;
    long long race_seed = -1;
    unsigned race_us = 1000;
    bool allow_pageable = false;
    bool quiet = false;
    size_t stack_bytes;
    device_state dev[MAX_DEV];
    std::map<uintptr_t, alloc_rec> allocs;
    std::map<uintptr_t, alloc_rec> freed; /* recent frees, for messages */
    std::set<CUstream_st *> handles;
    std::set<CUevent_st *> events;
    std::mutex msg_mu;
    std::map<int, std::string> code_msg;
    std::string last_msg;
    std::atomic<unsigned> stream_ids{0};
};

static globals &G()
{
    static globals *g = [] {
        globals *x = new globals; /* never destroyed: workers may outlive main */
        x->ndev = (int)env_size("CUDASIM_DEVICES", 4);
        if (x->ndev > MAX_DEV) x->ndev = MAX_DEV;
        x->mem = env_size("CUDASIM_MEM", (size_t)16 << 30);
        x->sms = (int)env_size("CUDASIM_SMS", 4);
        if (x->sms < 1) x->sms = 1;
        const char *r = getenv("CUDASIM_RACE");
        if (r && *r) x->race_seed = atoll(r);
        x->race_us = (unsigned)env_size("CUDASIM_RACE_US", 1000);
        const char *p = getenv("CUDASIM_PAGEABLE");
        x->allow_pageable = !(p && strcmp(p, "error") == 0);
        const char *q = getenv("CUDASIM_QUIET");
        x->quiet = q && *q == '1';
        x->stack_bytes = env_size("CUDASIM_STACK", (size_t)256 << 10);
        if (x->stack_bytes < ((size_t)64 << 10)) x->stack_bytes = (size_t)64 << 10;
        return x;
    }();
    return *g;
}

static thread_local int tl_device = 0;
static thread_local cudaError_t tl_last = cudaSuccess;
static thread_local stream_impl *tl_worker = nullptr; /* the stream whose op this thread runs */
static thread_local cudaError_t tl_op_error = cudaSuccess;

static const char *base_string(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorPeerAccessAlreadyEnabled: return "peer access is already enabled";
    case cudaErrorPeerAccessNotEnabled: return "peer access has not been enabled";
    case cudaErrorAssert: return "device-side assert triggered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "unknown error";
    }
}

static const char *base_name(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorPeerAccessAlreadyEnabled: return "cudaErrorPeerAccessAlreadyEnabled";
    case cudaErrorPeerAccessNotEnabled: return "cudaErrorPeerAccessNotEnabled";
    case cudaErrorAssert: return "cudaErrorAssert";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
    }
}

static void vfail(cudaError_t e, const char *fmt, va_list ap)
{
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    globals &g = G();
    {
        std::lock_guard<std::mutex> lk(g.msg_mu);
        g.last_msg = buf;
        g.code_msg[(int)e] = buf;
    }
    if (!g.quiet) fprintf(stderr, "cudasim: %s\n", buf);
    if (tl_worker) {
        if (tl_op_error == cudaSuccess) tl_op_error = e;
    } else {
        tl_last = e;
    }
}

void fail(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(e, fmt, ap);
    va_end(ap);
}

/* fail() and return e */
static cudaError_t err(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static cudaError_t err(cudaError_t e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(e, fmt, ap);
    va_end(ap);
    return e;
}

std::string last_message()
{
    globals &g = G();
    std::lock_guard<std::mutex> lk(g.msg_mu);
    return g.last_msg;
}

int device_count() { return G().ndev; }

static thread_local int tl_worker_device = -1; /* the device of the stream whose op this thread runs */

int current_device() { return tl_worker_device >= 0 ? tl_worker_device : tl_device; }

static void set_sticky(int dev, cudaError_t e)
{
    int z = 0;
    if (dev >= 0 && dev < MAX_DEV) G().dev[dev].sticky.compare_exchange_strong(z, (int)e, std::memory_order_relaxed);
}

static cudaError_t sticky(int dev)
{
    return dev >= 0 && dev < MAX_DEV ? (cudaError_t)G().dev[dev].sticky.load(std::memory_order_relaxed) : cudaSuccess;
}

/* A call on a device whose context has faulted returns the fault, as CUDA's do. */
#define STICKY_RETURN(dev)                                                                    \
    do {                                                                                      \
        cudaError_t st_ = sticky(dev);                                                        \
        if (st_ != cudaSuccess) return tl_last = st_;                                         \
    } while (0)

/* ====================================================================================
   Streams
   ==================================================================================== */

struct op {
    std::function<cudaError_t()> fn;
    const char *what;
    std::vector<std::pair<std::shared_ptr<stream_impl>, uint64_t>> deps;
    uint64_t seq;
};

struct stream_impl {
    int device;
    bool blocking, legacy;
    unsigned id;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<op> q;
    uint64_t enqueued = 0, completed = 0;
    cudaError_t error = cudaSuccess;
    bool dying = false;
    std::mt19937_64 rng;
};

static void worker_main(std::shared_ptr<stream_impl> s);

static std::shared_ptr<stream_impl> new_stream(int device, bool blocking, bool legacy)
{
    globals &g = G();
    auto s = std::make_shared<stream_impl>();
    s->device = device;
    s->blocking = blocking;
    s->legacy = legacy;
    s->id = g.stream_ids.fetch_add(1);
    s->rng.seed((uint64_t)(g.race_seed < 0 ? 0 : g.race_seed) * 1000003u + s->id);
    std::thread(worker_main, s).detach();
    return s;
}

static std::shared_ptr<stream_impl> legacy_of(int dev)
{
    globals &g = G();
    std::lock_guard<std::mutex> lk(g.mu);
    device_state &d = g.dev[dev];
    if (!d.legacy) {
        d.legacy = new_stream(dev, true, true);
        d.streams.push_back(d.legacy);
    }
    return d.legacy;
}

static thread_local CUstream_st *tl_per_thread[MAX_DEV];

/* The stream object of a handle (NULL, with the error set, when invalid). */
static std::shared_ptr<stream_impl> resolve(cudaStream_t h, const char *who)
{
    globals &g = G();
    int dev = current_device();
    if (h == nullptr || h == cudaStreamLegacy) return legacy_of(dev);
    if (h == cudaStreamPerThread) {
        if (!tl_per_thread[dev]) {
            CUstream_st *ps = new CUstream_st;
            ps->s = new_stream(dev, true, false);
            std::lock_guard<std::mutex> lk(g.mu);
            g.handles.insert(ps);
            g.dev[dev].streams.push_back(ps->s);
            tl_per_thread[dev] = ps;
        }
        return tl_per_thread[dev]->s;
    }
    std::lock_guard<std::mutex> lk(g.mu);
    if (!g.handles.count(h)) {
        fail(cudaErrorInvalidResourceHandle, "%s: stream %p is not a live stream (destroyed, or never created)", who,
             (void *)h);
        return nullptr;
    }
    return h->s;
}

/* The current last-enqueued seq of s. */
static uint64_t tail_of(stream_impl *s)
{
    std::lock_guard<std::mutex> lk(s->mu);
    return s->enqueued;
}

static void wait_done(stream_impl *s, uint64_t seq)
{
    std::unique_lock<std::mutex> lk(s->mu);
    s->cv.wait(lk, [&] { return s->completed >= seq; });
}

/* Queues an op; returns its seq (0 on error). */
static uint64_t push(const std::shared_ptr<stream_impl> &s, const char *what, std::function<cudaError_t()> fn,
                     std::vector<std::pair<std::shared_ptr<stream_impl>, uint64_t>> deps = {})
{
    globals &g = G();
    /* the legacy stream waits for every blocking stream of its device, and a blocking
       stream for the legacy stream (CUDA's implicit synchronization) */
    if (s->legacy) {
        std::vector<std::shared_ptr<stream_impl>> others;
        {
            std::lock_guard<std::mutex> lk(g.mu);
            for (auto &w : g.dev[s->device].streams)
                if (auto o = w.lock())
                    if (o != s && o->blocking) others.push_back(o);
        }
        for (auto &o : others) {
            uint64_t t = tail_of(o.get());
            if (t) deps.emplace_back(o, t);
        }
    } else if (s->blocking) {
        auto l = legacy_of(s->device);
        uint64_t t = tail_of(l.get());
        if (t) deps.emplace_back(l, t);
    }
    std::lock_guard<std::mutex> lk(s->mu);
    op o;
    o.fn = std::move(fn);
    o.what = what;
    o.deps = std::move(deps);
    o.seq = ++s->enqueued;
    s->q.push_back(std::move(o));
    s->cv.notify_all();
    return s->enqueued;
}

static void worker_main(std::shared_ptr<stream_impl> s)
{
    globals &g = G();
    tl_worker = s.get();
    tl_worker_device = s->device;
    for (;;) {
        op o;
        {
            std::unique_lock<std::mutex> lk(s->mu);
            s->cv.wait(lk, [&] { return !s->q.empty() || s->dying; });
            if (s->q.empty()) break;
            o = std::move(s->q.front());
            s->q.pop_front();
        }
        for (auto &d : o.deps) wait_done(d.first.get(), d.second);
        o.deps.clear();
        if (g.race_seed >= 0 && g.race_us > 0) {
            unsigned us = (unsigned)(s->rng() % (g.race_us + 1));
            std::this_thread::sleep_for(std::chrono::microseconds(us));
        }
        cudaError_t r = cudaSuccess;
        if (sticky(s->device) == cudaSuccess) {
            tl_op_error = cudaSuccess;
            r = o.fn();
            if (r == cudaSuccess) r = tl_op_error;
            if (r != cudaSuccess) set_sticky(s->device, r);
        }
        o.fn = nullptr; /* the op's captures go before it completes */
        std::lock_guard<std::mutex> lk(s->mu);
        if (r != cudaSuccess && s->error == cudaSuccess) s->error = r;
        s->completed = o.seq;
        s->cv.notify_all();
    }
    tl_worker = nullptr;
}

cudaError_t enqueue(cudaStream_t h, const char *what, std::function<cudaError_t()> fn)
{
    auto s = resolve(h, what);
    if (!s) return cudaErrorInvalidResourceHandle;
    STICKY_RETURN(s->device);
    push(s, what, std::move(fn));
    return cudaSuccess;
}

int stream_device(cudaStream_t h)
{
    auto s = resolve(h, "stream_device");
    return s ? s->device : -1;
}

static std::vector<std::shared_ptr<stream_impl>> device_streams(int dev)
{
    globals &g = G();
    std::vector<std::shared_ptr<stream_impl>> v;
    std::lock_guard<std::mutex> lk(g.mu);
    for (auto &w : g.dev[dev].streams)
        if (auto o = w.lock()) v.push_back(o);
    return v;
}

static void sync_device(int dev)
{
    for (auto &s : device_streams(dev)) wait_done(s.get(), tail_of(s.get()));
}

void drain_all()
{
    for (int d = 0; d < G().ndev; d++) sync_device(d);
}

/* ====================================================================================
   Memory registry
   ==================================================================================== */

/* Under g.mu: the allocation holding p (p may be its end), or allocs.end(). */
static std::map<uintptr_t, alloc_rec>::iterator find_alloc(globals &g, uintptr_t p)
{
    auto it = g.allocs.upper_bound(p);
    if (it == g.allocs.begin()) return g.allocs.end();
    --it;
    if (p >= it->first && p <= it->first + it->second.size) return it;
    return g.allocs.end();
}

int device_of(const void *p)
{
    globals &g = G();
    std::lock_guard<std::mutex> lk(g.mu);
    auto it = find_alloc(g, (uintptr_t)p);
    if (it == g.allocs.end() || (uintptr_t)p == it->first + it->second.size) return -1;
    return it->second.device;
}

/* What p is, for messages. */
static std::string describe(globals &g, uintptr_t p)
{
    char buf[256];
    auto it = g.freed.upper_bound(p);
    if (it != g.freed.begin()) {
        --it;
        if (p >= it->first && p < it->first + it->second.size) {
            snprintf(buf, sizeof buf, "freed memory (a %zu-byte %s allocation, offset %zu)", it->second.size,
                     it->second.device < 0 ? "pinned" : "device", (size_t)(p - it->first));
            return buf;
        }
    }
    return "pageable host memory (not from cudaMalloc or cudaHostAlloc)";
}

bool check_access(int device, const void *ptr, size_t bytes, const char *who, const char *arg)
{
    globals &g = G();
    uintptr_t p = (uintptr_t)ptr;
    std::string what;
    {
        std::lock_guard<std::mutex> lk(g.mu);
        auto it = find_alloc(g, p);
        if (it == g.allocs.end() || (bytes > 0 && p == it->first + it->second.size)) {
            what = describe(g, p);
        } else {
            const alloc_rec &a = it->second;
            size_t off = (size_t)(p - it->first);
            if (a.device >= 0 && a.device != device && !(device >= 0 && g.dev[device].peer[a.device])) {
                char buf[200];
                snprintf(buf, sizeof buf, "memory of device %d (the access is on device %d, without peer access)",
                         a.device, device);
                what = buf;
            } else if (bytes > a.size - off) {
                char buf[200];
                snprintf(buf, sizeof buf, "%zu bytes at offset %zu of a %zu-byte %s allocation: past its end", bytes,
                         off, a.size, a.device < 0 ? "pinned" : "device");
                what = buf;
            } else {
                return true;
            }
        }
    }
    fail(cudaErrorIllegalAddress, "%s: %s = %p is %s", who, arg, ptr, what.c_str());
    return false;
}

void arena_poison(const void *p, size_t bytes)
{
#ifdef CUDASIM_ASAN
    int dev = device_of(p);
    if (dev >= 0) sync_device(dev); /* work queued before the free may still use it */
    __asan_poison_memory_region(p, bytes);
#else
    (void)p;
    (void)bytes;
#endif
}

void arena_unpoison(const void *p, size_t bytes)
{
#ifdef CUDASIM_ASAN
    __asan_unpoison_memory_region(p, bytes);
#else
    (void)p;
    (void)bytes;
#endif
}

/* ====================================================================================
   Kernels: fibers
   ==================================================================================== */

struct block_state;

enum { F_READY, F_BAR, F_WARP, F_DONE, F_DEAD };

struct fiber {
    uint3 tid; /* first member: thread_idx() */
    void *sp = nullptr;
    char *stack = nullptr; /* the mapping, guard page first */
    size_t size = 0;
    int state = F_DONE;
    int lane = 0, warp = 0, lin = 0;
    const void *site = nullptr;
    int bar_val = 0, bar_ret = 0;
    unsigned long long shfl_ret = 0;
    bool dirty = false; /* abandoned mid-kernel: unpoison before reuse */
    void *tsan = nullptr;
    void *asan_fake = nullptr;
#if !defined(__x86_64__)
    ucontext_t uc;
#endif
};

thread_local fiber *cur_fiber = nullptr;
thread_local kctx *cur_kernel = nullptr;

struct warp_state {
    int live, exited, waiting;
    unsigned long long vals[32];
    int mode[32], arg[32], width[32];
    const void *site;
};

struct block_state {
    int n, live, exited, done;
    int bar_waiting;
    const void *bar_site;
    bool bar_site_mixed;
    std::vector<warp_state> warps;
    bool error;
    std::function<void()> *body;
};

struct worker_fibers {
    std::vector<fiber *> pool;
    void *sched_sp = nullptr;
    void *sched_tsan = nullptr;
    const void *sched_bottom = nullptr;
    size_t sched_size = 0;
    void *sched_fake = nullptr;
    block_state *blk = nullptr;
#if !defined(__x86_64__)
    ucontext_t sched_uc;
#endif
    ~worker_fibers()
    {
        for (fiber *f : pool) {
#ifdef CUDASIM_TSAN
            if (f->tsan) __tsan_destroy_fiber(f->tsan);
#endif
            munmap(f->stack, f->size);
            delete f;
        }
    }
};
static thread_local worker_fibers *tl_wf = nullptr;

const uint3 &thread_idx() { return cur_fiber->tid; }

#if defined(__x86_64__)
extern "C" void cudasim_swap(void **save_sp, void *new_sp);
extern "C" void cudasim_fiber_entry(void);
asm(".text\n"
    ".globl cudasim_swap\n"
    ".type cudasim_swap,@function\n"
    "cudasim_swap:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size cudasim_swap,.-cudasim_swap\n"
    ".globl cudasim_fiber_entry\n"
    ".type cudasim_fiber_entry,@function\n"
    "cudasim_fiber_entry:\n"
    "  movq %r12, %rdi\n"
    "  callq *%r13\n"
    "  ud2\n"
    ".size cudasim_fiber_entry,.-cudasim_fiber_entry\n");
#endif

static void fiber_main(fiber *f);

/* Scheduler -> fiber f. */
static void switch_to(worker_fibers *wf, fiber *f)
{
    cur_fiber = f;
#ifdef CUDASIM_ASAN
    __sanitizer_start_switch_fiber(&wf->sched_fake, f->stack + getpagesize(), f->size - getpagesize());
#endif
#ifdef CUDASIM_TSAN
    __tsan_switch_to_fiber(f->tsan, 0);
#endif
#if defined(__x86_64__)
    cudasim_swap(&wf->sched_sp, f->sp);
#else
    swapcontext(&wf->sched_uc, &f->uc);
#endif
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(wf->sched_fake, nullptr, nullptr);
#endif
    cur_fiber = nullptr;
}

/* Fiber f -> the scheduler (dying: f never resumes). */
static void yield(fiber *f, bool dying)
{
    worker_fibers *wf = tl_wf;
#ifdef CUDASIM_ASAN
    __sanitizer_start_switch_fiber(dying ? nullptr : &f->asan_fake, wf->sched_bottom, wf->sched_size);
#else
    (void)dying;
#endif
#ifdef CUDASIM_TSAN
    __tsan_switch_to_fiber(wf->sched_tsan, 0);
#endif
#if defined(__x86_64__)
    cudasim_swap(&f->sp, wf->sched_sp);
#else
    swapcontext(&f->uc, &wf->sched_uc);
#endif
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, &wf->sched_bottom, &wf->sched_size);
#endif
}

#if !defined(__x86_64__)
static void fiber_trampoline(unsigned lo, unsigned hi)
{
    fiber_main((fiber *)(((uintptr_t)hi << 32) | (uintptr_t)lo));
}
#endif

static void fiber_prepare(worker_fibers *wf, fiber *f)
{
    if (!f->stack) {
        size_t page = (size_t)getpagesize();
        f->size = (G().stack_bytes + page - 1) / page * page + page;
        void *m = mmap(nullptr, f->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "cudasim: mmap of a %zu-byte fiber stack failed\n", f->size);
            abort();
        }
        f->stack = (char *)m;
        mprotect(f->stack, page, PROT_NONE); /* a stack overflow faults */
#ifdef CUDASIM_TSAN
        f->tsan = __tsan_create_fiber(0);
#endif
    }
#ifdef CUDASIM_ASAN
    if (f->dirty) __asan_unpoison_memory_region(f->stack + getpagesize(), f->size - getpagesize());
#endif
    f->dirty = false;
    (void)wf;
#if defined(__x86_64__)
    uintptr_t top = ((uintptr_t)(f->stack + f->size)) & ~(uintptr_t)15;
    void **sp = (void **)(top - 72);
    sp[0] = nullptr;                             /* r15 */
    sp[1] = nullptr;                             /* r14 */
    sp[2] = (void *)&fiber_main;                 /* r13: called by the entry */
    sp[3] = (void *)f;                           /* r12: its argument */
    sp[4] = nullptr;                             /* rbx */
    sp[5] = nullptr;                             /* rbp */
    sp[6] = (void *)&cudasim_fiber_entry;        /* ret */
    f->sp = sp;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack + getpagesize();
    f->uc.uc_stack.ss_size = f->size - getpagesize();
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, (void (*)())fiber_trampoline, 2, (unsigned)(uintptr_t)f, (unsigned)((uintptr_t)f >> 32));
#endif
}

static void block_error(block_state *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void block_error(block_state *b, const char *fmt, ...)
{
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kctx *k = cur_kernel;
    fail(cudaErrorLaunchFailure, "kernel %s, block (%u,%u,%u) of grid (%u,%u,%u) x (%u,%u,%u) threads: %s", k->name,
         k->block_idx.x, k->block_idx.y, k->block_idx.z, k->grid.x, k->grid.y, k->grid.z, k->block.x, k->block.y,
         k->block.z, msg);
    b->error = true;
}

/* Under the block: releases the block barrier if every live thread waits at it. */
static void bar_try_release(block_state *b)
{
    if (b->bar_waiting == 0 || b->bar_waiting < b->live) return;
    if (b->exited > 0) {
        block_error(b, "__syncthreads reached by %d of its %d threads (%d had exited): a barrier in divergent code",
                    b->bar_waiting, b->n, b->exited);
        return;
    }
    worker_fibers *wf = tl_wf;
    int op = -1, acc = 0;
    for (int i = 0; i < b->n; i++) {
        fiber *f = wf->pool[i];
        if (f->state != F_BAR) continue;
        if (op < 0) { /* the op (or, and, count) rides in bar_ret until the release */
            op = f->bar_ret;
            acc = op == 1;
        }
        if (op == 0) acc |= f->bar_val != 0;
        else if (op == 1) acc &= f->bar_val != 0;
        else acc += f->bar_val != 0;
    }
    for (int i = 0; i < b->n; i++) {
        fiber *f = wf->pool[i];
        if (f->state == F_BAR) {
            f->bar_ret = acc;
            f->state = F_READY;
        }
    }
    b->bar_waiting = 0;
    b->bar_site = nullptr;
    b->bar_site_mixed = false;
}

static void warp_try_release(block_state *b, int w)
{
    warp_state &ws = b->warps[w];
    if (ws.waiting == 0 || ws.waiting < ws.live) return;
    if (ws.exited > 0) {
        block_error(b, "a full-mask warp shuffle in warp %d reached by %d lanes (%d had exited)", w, ws.waiting,
                    ws.exited);
        return;
    }
    worker_fibers *wf = tl_wf;
    int base = w * 32, nl = std::min(32, b->n - base);
    for (int l = 0; l < nl; l++) {
        fiber *f = wf->pool[base + l];
        if (f->state != F_WARP) continue;
        int width = ws.width[l] > 0 && ws.width[l] <= 32 ? ws.width[l] : 32;
        int seg = l / width * width, src = l;
        switch (ws.mode[l]) {
        case 0: src = l + ws.arg[l]; if (src >= seg + width) src = l; break;
        case 1: src = l - ws.arg[l]; if (src < seg) src = l; break;
        case 2: src = l ^ ws.arg[l]; if (src >= seg + width || src < seg) src = l; break;
        default: src = seg + ((ws.arg[l] % width) + width) % width; break;
        }
        if (src >= nl) src = l; /* a lane past the block: its own value */
        f->shfl_ret = ws.vals[src];
        f->state = F_READY;
    }
    ws.waiting = 0;
    ws.site = nullptr;
}

static void fiber_main(fiber *f)
{
    worker_fibers *wf = tl_wf;
#ifdef CUDASIM_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &wf->sched_bottom, &wf->sched_size);
#endif
    block_state *b = wf->blk;
    (*b->body)();
    f->state = F_DONE;
    b->live--;
    b->exited++;
    b->done++;
    b->warps[f->warp].live--;
    b->warps[f->warp].exited++;
    bar_try_release(b);
    warp_try_release(b, f->warp);
    yield(f, true);
    __builtin_trap(); /* never resumed */
}

void syncthreads_site(const void *site) { (void)syncthreads_op_site(0, 0, site); }

int syncthreads_op_site(int v, int op, const void *site)
{
    fiber *f = cur_fiber;
    if (!f) return v; /* host code */
    block_state *b = tl_wf->blk;
    f->bar_val = v;
    f->bar_ret = op;
    f->state = F_BAR;
    b->bar_site = site; /* (call sites are not compared: the optimiser duplicates calls) */
    b->bar_waiting++;
    bar_try_release(b);
    if (f->state != F_READY) yield(f, false);
    if (b->error) { /* abandoned: never returns into the kernel */
        f->state = F_DEAD;
        f->dirty = true;
        yield(f, false);
    }
    return f->bar_ret;
}

unsigned long long shfl(unsigned long long v, int mode, int arg, int width, unsigned mask, const void *site)
{
    fiber *f = cur_fiber;
    block_state *b = tl_wf->blk;
    if (mask != 0xffffffffu) {
        block_error(b, "a warp shuffle with mask 0x%08x (the harness models full-mask shuffles only)", mask);
        f->state = F_DEAD;
        f->dirty = true;
        yield(f, false);
    }
    warp_state &ws = b->warps[f->warp];
    ws.vals[f->lane] = v;
    ws.mode[f->lane] = mode;
    ws.arg[f->lane] = arg;
    ws.width[f->lane] = width;
    ws.site = site;
    f->state = F_WARP;
    ws.waiting++;
    warp_try_release(b, f->warp);
    if (f->state != F_READY) yield(f, false);
    if (b->error) {
        f->state = F_DEAD;
        f->dirty = true;
        yield(f, false);
    }
    return f->shfl_ret;
}

void kernel_trap(const char *what)
{
    block_error(tl_wf->blk, "%s", what);
}

/* Runs one block; false on an error (already reported). */
static bool run_block(worker_fibers *wf, block_state &b)
{
    kctx *k = cur_kernel;
    for (int i = 0; i < b.n; i++) {
        fiber *f = wf->pool[i];
        fiber_prepare(wf, f);
        f->lin = i;
        f->tid.x = (unsigned)i % k->block.x;
        f->tid.y = (unsigned)i / k->block.x % k->block.y;
        f->tid.z = (unsigned)i / (k->block.x * k->block.y);
        f->lane = i % 32;
        f->warp = i / 32;
        f->state = F_READY;
    }
    b.live = b.n;
    b.exited = b.done = b.bar_waiting = 0;
    b.bar_site = nullptr;
    b.bar_site_mixed = false;
    b.error = false;
    for (size_t w = 0; w < b.warps.size(); w++) {
        b.warps[w].live = std::min(32, b.n - (int)w * 32);
        b.warps[w].exited = b.warps[w].waiting = 0;
        b.warps[w].site = nullptr;
    }
    for (;;) {
        bool progress = false;
        for (int i = 0; i < b.n && !b.error; i++)
            if (wf->pool[i]->state == F_READY) {
                switch_to(wf, wf->pool[i]);
                progress = true;
            }
        if (b.error) break;
        if (b.done == b.n) return true;
        if (!progress) {
            int at_bar = 0, at_warp = 0;
            for (int i = 0; i < b.n; i++) {
                at_bar += wf->pool[i]->state == F_BAR;
                at_warp += wf->pool[i]->state == F_WARP;
            }
            block_error(&b, "deadlock: %d threads wait at __syncthreads, %d at a warp shuffle, %d exited", at_bar,
                        at_warp, b.exited);
            break;
        }
    }
    for (int i = 0; i < b.n; i++)
        if (wf->pool[i]->state != F_DONE) wf->pool[i]->dirty = true;
    return false;
}

static cudaError_t run_grid(const launch_info &li, std::function<void()> &body)
{
    if (!tl_wf) {
        tl_wf = new worker_fibers; /* freed with the thread (below) */
#ifdef CUDASIM_TSAN
        tl_wf->sched_tsan = __tsan_get_current_fiber();
#endif
    }
    static thread_local std::unique_ptr<worker_fibers> owner(tl_wf);
    worker_fibers *wf = tl_wf;
    kctx k;
    k.grid = li.grid;
    k.block = li.block;
    k.name = li.kernel;
    cur_kernel = &k;
    block_state b;
    b.n = (int)(li.block.x * li.block.y * li.block.z);
    b.warps.resize((size_t)(b.n + 31) / 32);
    b.body = &body;
    while ((int)wf->pool.size() < b.n) wf->pool.push_back(new fiber);
    wf->blk = &b;
    bool ok = true;
    for (unsigned z = 0; z < li.grid.z && ok; z++)
        for (unsigned y = 0; y < li.grid.y && ok; y++)
            for (unsigned x = 0; x < li.grid.x && ok; x++) {
                k.block_idx = uint3{x, y, z};
                ok = run_block(wf, b);
            }
    wf->blk = nullptr;
    cur_kernel = nullptr;
    return ok ? cudaSuccess : cudaErrorLaunchFailure;
}

/* ====================================================================================
   Launch checks: __launch_bounds__ (section cudasim_lbN) and static __shared__ (the
   kernel's thread_local statics, from the executable's symbol table)
   ==================================================================================== */

struct elf_info {
    std::vector<std::pair<std::pair<uintptr_t, uintptr_t>, int>> lb; /* [lo, hi) -> N */
    std::map<uintptr_t, std::string> funcs;                          /* address -> symbol */
    std::map<std::string, size_t> local_tls;                         /* "_ZZ<fn>E..." -> size */
    bool ok = false;
};

static int phdr_cb(struct dl_phdr_info *info, size_t, void *data)
{
    *(uintptr_t *)data = (uintptr_t)info->dlpi_addr;
    return 1; /* the first object is the executable */
}

static elf_info &elf()
{
    static elf_info *ei = [] {
        elf_info *e = new elf_info;
        uintptr_t bias = 0;
        dl_iterate_phdr(phdr_cb, &bias);
        FILE *fp = fopen("/proc/self/exe", "rb");
        if (!fp) return e;
        std::vector<char> img;
        char buf[1 << 16];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, fp)) > 0) img.insert(img.end(), buf, buf + n);
        fclose(fp);
        if (img.size() < sizeof(Elf64_Ehdr) || memcmp(img.data(), ELFMAG, SELFMAG) != 0) return e;
        const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img.data();
        if (eh->e_shoff == 0 || eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) > img.size()) return e;
        const Elf64_Shdr *sh = (const Elf64_Shdr *)(img.data() + eh->e_shoff);
        const char *shstr = img.data() + sh[eh->e_shstrndx].sh_offset;
        for (int i = 0; i < eh->e_shnum; i++) {
            const char *nm = shstr + sh[i].sh_name;
            if (strncmp(nm, "cudasim_lb", 10) == 0)
                e->lb.push_back({{bias + sh[i].sh_addr, bias + sh[i].sh_addr + sh[i].sh_size}, atoi(nm + 10)});
            if (sh[i].sh_type == SHT_SYMTAB) {
                const Elf64_Sym *sym = (const Elf64_Sym *)(img.data() + sh[i].sh_offset);
                size_t cnt = sh[i].sh_size / sizeof(Elf64_Sym);
                const char *str = img.data() + sh[sh[i].sh_link].sh_offset;
                for (size_t j = 0; j < cnt; j++) {
                    int type = ELF64_ST_TYPE(sym[j].st_info);
                    const char *sn = str + sym[j].st_name;
                    if (type == STT_FUNC && sym[j].st_value) e->funcs[bias + sym[j].st_value] = sn;
                    else if (type == STT_TLS && strncmp(sn, "_ZZ", 3) == 0) e->local_tls[sn] = sym[j].st_size;
                }
            }
        }
        e->ok = true;
        return e;
    }();
    return *ei;
}

static int launch_bound(const void *fn)
{
    for (auto &r : elf().lb)
        if ((uintptr_t)fn >= r.first.first && (uintptr_t)fn < r.first.second) return r.second;
    return 0;
}

/* Bytes of the kernel's static __shared__ variables (thread_local statics of its body). */
static size_t static_shared(const void *fn)
{
    elf_info &e = elf();
    auto it = e.funcs.find((uintptr_t)fn);
    if (it == e.funcs.end() || it->second.size() < 3 || it->second.compare(0, 2, "_Z") != 0) return 0;
    std::string prefix = "_ZZ" + it->second.substr(2) + "E";
    size_t total = 0;
    for (auto t = e.local_tls.lower_bound(prefix); t != e.local_tls.end() && t->first.compare(0, prefix.size(), prefix) == 0; ++t)
        total += t->second;
    return total;
}

} // namespace cudasim

/* ====================================================================================
   The launch entry points (cuda_runtime.h)
   ==================================================================================== */
namespace cudasim {

bool launch_check(const launch_info &li)
{
    const char *k = li.kernel;
    unsigned long long threads = (unsigned long long)li.block.x * li.block.y * li.block.z;
    int dev = current_device();
    if (sticky(dev) != cudaSuccess) {
        tl_last = sticky(dev);
        return false;
    }
    if (li.grid.x == 0 || li.grid.y == 0 || li.grid.z == 0 || li.block.x == 0 || li.block.y == 0 || li.block.z == 0) {
        fail(cudaErrorInvalidConfiguration, "launch of %s: grid (%u,%u,%u) x block (%u,%u,%u) has a zero dimension", k,
             li.grid.x, li.grid.y, li.grid.z, li.block.x, li.block.y, li.block.z);
        return false;
    }
    if (threads > 1024 || li.block.x > 1024 || li.block.y > 1024 || li.block.z > 64) {
        fail(cudaErrorInvalidConfiguration,
             "launch of %s: %llu threads per block (%u,%u,%u): at most 1024 (x, y <= 1024, z <= 64)", k, threads,
             li.block.x, li.block.y, li.block.z);
        return false;
    }
    if (li.grid.x > 2147483647u || li.grid.y > 65535u || li.grid.z > 65535u) {
        fail(cudaErrorInvalidConfiguration, "launch of %s: grid (%u,%u,%u): y and z at most 65535, x at most 2^31-1", k,
             li.grid.x, li.grid.y, li.grid.z);
        return false;
    }
    int lb = launch_bound(li.fn);
    if (lb > 0 && threads > (unsigned long long)lb) {
        fail(cudaErrorLaunchOutOfResources, "launch of %s: %llu threads per block above its __launch_bounds__(%d)", k,
             threads, lb);
        return false;
    }
    size_t shared = static_shared(li.fn);
    if (shared + li.shmem > 48 * 1024) {
        fail(cudaErrorInvalidValue,
             "launch of %s: %zu bytes of static __shared__ + %zu dynamic: above the 48 KiB a block may have "
             "without an opt-in", k, shared, li.shmem);
        return false;
    }
    if (li.param_bytes > 32764) {
        fail(cudaErrorInvalidValue, "launch of %s: %zu bytes of kernel parameters (at most 32764)", k, li.param_bytes);
        return false;
    }
    return true;
}

/* The text of argument k of "a, b(c, d), e". */
static std::string arg_text(const char *args, int k)
{
    int depth = 0, i = 0;
    std::string cur;
    for (const char *p = args; *p; p++) {
        if (*p == '(' || *p == '[' || *p == '{') depth++;
        if (*p == ')' || *p == ']' || *p == '}') depth--;
        if (*p == ',' && depth == 0) {
            if (i == k) break;
            i++;
            cur.clear();
            continue;
        }
        cur += *p;
    }
    size_t a = cur.find_first_not_of(" \t\n"), b = cur.find_last_not_of(" \t\n");
    return a == std::string::npos ? std::string("?") : cur.substr(a, b - a + 1);
}

bool launch_check_ptr(const launch_info &li, int k, const void *p)
{
    if (!p) return true;
    std::string who = std::string("kernel ") + li.kernel;
    std::string arg = "argument " + std::to_string(k + 1) + " (" + arg_text(li.args, k) + ")";
    if (check_access(current_device(), p, 0, who.c_str(), arg.c_str())) return true;
    set_sticky(current_device(), cudaErrorIllegalAddress); /* the kernel would have faulted */
    return false;
}

void launch_enqueue(const launch_info &li, std::function<void()> body)
{
    auto s = resolve(li.stream, li.kernel);
    if (!s) return;
    launch_info copy = li;
    push(s, li.kernel, [copy, body]() mutable { return run_grid(copy, body); });
}

} // namespace cudasim

/* ====================================================================================
   The runtime API
   ==================================================================================== */
using namespace cudasim;

struct CUevent_st {
    struct record {
        std::shared_ptr<stream_impl> s;
        uint64_t seq = 0;
        std::chrono::steady_clock::time_point t;
    };
    std::mutex mu;
    std::shared_ptr<record> rec;
    unsigned flags = 0;
    int device = 0;
};

const char *cudaGetErrorString(cudaError_t e)
{
    static thread_local std::string ring[4];
    static thread_local int next = 0;
    globals &g = G();
    std::string s = base_string(e);
    {
        std::lock_guard<std::mutex> lk(g.msg_mu);
        auto it = g.code_msg.find((int)e);
        if (it != g.code_msg.end() && e != cudaSuccess) s += " (cudasim: " + it->second + ")";
    }
    std::string &slot = ring[next++ & 3];
    slot = s;
    return slot.c_str();
}

const char *cudaGetErrorName(cudaError_t e) { return base_name(e); }

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = tl_last;
    tl_last = cudaSuccess;
    return e != cudaSuccess ? e : sticky(current_device());
}

cudaError_t cudaPeekAtLastError(void) { return tl_last != cudaSuccess ? tl_last : sticky(current_device()); }

cudaError_t cudaGetDeviceCount(int *n)
{
    if (!n) return err(cudaErrorInvalidValue, "cudaGetDeviceCount: n is NULL");
    *n = G().ndev;
    return G().ndev > 0 ? cudaSuccess : err(cudaErrorNoDevice, "cudaGetDeviceCount: CUDASIM_DEVICES=0");
}

cudaError_t cudaGetDevice(int *d)
{
    if (!d) return err(cudaErrorInvalidValue, "cudaGetDevice: d is NULL");
    *d = current_device();
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= G().ndev) return err(cudaErrorInvalidDevice, "cudaSetDevice(%d): %d devices", d, G().ndev);
    tl_device = d;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    int dev = current_device();
    sync_device(dev);
    STICKY_RETURN(dev);
    return cudaSuccess;
}

cudaError_t cudaDeviceReset(void)
{
    int dev = current_device();
    sync_device(dev);
    G().dev[dev].sticky.store(0, std::memory_order_relaxed);
    for (auto &s : device_streams(dev)) {
        std::lock_guard<std::mutex> lk(s->mu);
        s->error = cudaSuccess;
    }
    tl_last = cudaSuccess;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int device)
{
    globals &g = G();
    if (!v) return err(cudaErrorInvalidValue, "cudaDeviceGetAttribute: v is NULL");
    if (device < 0 || device >= g.ndev) return err(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: device %d", device);
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrMaxBlockDimX: *v = 1024; break;
    case cudaDevAttrMaxGridDimX: *v = 2147483647; break;
    case cudaDevAttrMaxGridDimY: *v = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 49152; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMultiProcessorCount: *v = g.sms; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    default: return err(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not simulated", (int)a);
    }
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int device)
{
    globals &g = G();
    if (!p) return err(cudaErrorInvalidValue, "cudaGetDeviceProperties: p is NULL");
    if (device < 0 || device >= g.ndev) return err(cudaErrorInvalidDevice, "cudaGetDeviceProperties: device %d", device);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "cudasim (CPU simulation)");
    p->totalGlobalMem = g.mem;
    p->sharedMemPerBlock = 49152;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = g.sms;
    p->unifiedAddressing = 1;
    p->pciBusID = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    if (!can) return err(cudaErrorInvalidValue, "cudaDeviceCanAccessPeer: can is NULL");
    *can = device != peer && device >= 0 && peer >= 0 && device < G().ndev && peer < G().ndev;
    return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned flags)
{
    globals &g = G();
    int dev = current_device();
    if (flags != 0) return err(cudaErrorInvalidValue, "cudaDeviceEnablePeerAccess: flags must be 0");
    if (peer < 0 || peer >= g.ndev || peer == dev)
        return err(cudaErrorInvalidDevice, "cudaDeviceEnablePeerAccess(%d) from device %d", peer, dev);
    std::lock_guard<std::mutex> lk(g.mu);
    if (g.dev[dev].peer[peer])
        return err(cudaErrorPeerAccessAlreadyEnabled, "cudaDeviceEnablePeerAccess(%d): already enabled on device %d",
                   peer, dev);
    g.dev[dev].peer[peer] = true;
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    globals &g = G();
    int dev = current_device();
    STICKY_RETURN(dev);
    if (!free_bytes || !total_bytes) return err(cudaErrorInvalidValue, "cudaMemGetInfo: NULL argument");
    std::lock_guard<std::mutex> lk(g.mu);
    *total_bytes = g.mem;
    *free_bytes = g.mem - g.dev[dev].used;
    return cudaSuccess;
}

static void forget_freed(globals &g, uintptr_t p, const alloc_rec &a)
{
    if (g.freed.size() > 4096) g.freed.erase(g.freed.begin());
    g.freed[p] = a;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    globals &g = G();
    int dev = current_device();
    if (!p) return err(cudaErrorInvalidValue, "cudaMalloc: p is NULL");
    *p = nullptr;
    STICKY_RETURN(dev);
    if (bytes == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lk(g.mu);
        if (bytes > g.mem - g.dev[dev].used)
            return err(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes) on device %d: %zu of %zu bytes free (CUDASIM_MEM)",
                       bytes, dev, g.mem - g.dev[dev].used, g.mem);
        g.dev[dev].used += bytes;
    }
    void *m = nullptr;
    if (posix_memalign(&m, 256, bytes) != 0 || !m) {
        std::lock_guard<std::mutex> lk(g.mu);
        g.dev[dev].used -= bytes;
        return err(cudaErrorMemoryAllocation, "cudaMalloc(%zu bytes): the host is out of memory", bytes);
    }
    std::lock_guard<std::mutex> lk(g.mu);
    g.allocs[(uintptr_t)m] = alloc_rec{bytes, dev};
    g.freed.erase((uintptr_t)m);
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    globals &g = G();
    if (!p) return cudaSuccess;
    int dev;
    {
        std::lock_guard<std::mutex> lk(g.mu);
        auto it = g.allocs.find((uintptr_t)p);
        if (it == g.allocs.end() || it->second.device < 0)
            return err(cudaErrorInvalidValue, "cudaFree(%p): not the start of a cudaMalloc allocation (%s)", p,
                       describe(g, (uintptr_t)p).c_str());
        dev = it->second.device;
    }
    sync_device(dev); /* cudaFree waits for the device, as CUDA's does */
    {
        std::lock_guard<std::mutex> lk(g.mu);
        auto it = g.allocs.find((uintptr_t)p);
        if (it == g.allocs.end())
            return err(cudaErrorInvalidValue, "cudaFree(%p): freed twice", p);
        g.dev[dev].used -= it->second.size;
        forget_freed(g, it->first, it->second);
        g.allocs.erase(it);
    }
    free(p);
    return sticky(dev);
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags)
{
    globals &g = G();
    (void)flags;
    if (!p) return err(cudaErrorInvalidValue, "cudaHostAlloc: p is NULL");
    *p = nullptr;
    if (bytes == 0) return cudaSuccess;
    void *m = nullptr;
    if (posix_memalign(&m, 4096, bytes) != 0 || !m)
        return err(cudaErrorMemoryAllocation, "cudaHostAlloc(%zu bytes): out of host memory", bytes);
    std::lock_guard<std::mutex> lk(g.mu);
    g.allocs[(uintptr_t)m] = alloc_rec{bytes, -1};
    g.freed.erase((uintptr_t)m);
    *p = m;
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaFreeHost(void *p)
{
    globals &g = G();
    if (!p) return cudaSuccess;
    drain_all(); /* as cudaFree: no copy may still read it */
    {
        std::lock_guard<std::mutex> lk(g.mu);
        auto it = g.allocs.find((uintptr_t)p);
        if (it == g.allocs.end() || it->second.device >= 0)
            return err(cudaErrorInvalidValue, "cudaFreeHost(%p): not the start of a cudaHostAlloc allocation", p);
        forget_freed(g, it->first, it->second);
        g.allocs.erase(it);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaHostRegister(void *p, size_t bytes, unsigned flags)
{
    globals &g = G();
    (void)flags;
    if (!p || !bytes) return err(cudaErrorInvalidValue, "cudaHostRegister: NULL or empty range");
    std::lock_guard<std::mutex> lk(g.mu);
    g.allocs[(uintptr_t)p] = alloc_rec{bytes, -2};
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p)
{
    globals &g = G();
    drain_all();
    std::lock_guard<std::mutex> lk(g.mu);
    auto it = g.allocs.find((uintptr_t)p);
    if (it == g.allocs.end() || it->second.device != -2)
        return err(cudaErrorInvalidValue, "cudaHostUnregister(%p): not registered", p);
    g.allocs.erase(it);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    globals &g = G();
    if (!a) return err(cudaErrorInvalidValue, "cudaPointerGetAttributes: a is NULL");
    memset(a, 0, sizeof *a);
    std::lock_guard<std::mutex> lk(g.mu);
    auto it = find_alloc(g, (uintptr_t)p);
    if (it == g.allocs.end() || (uintptr_t)p == it->first + it->second.size) {
        a->type = cudaMemoryTypeUnregistered;
        a->device = -2;
        a->hostPointer = (void *)p;
    } else if (it->second.device >= 0) {
        a->type = cudaMemoryTypeDevice;
        a->device = it->second.device;
        a->devicePointer = (void *)p;
    } else {
        a->type = cudaMemoryTypeHost;
        a->device = current_device();
        a->hostPointer = a->devicePointer = (void *)p;
    }
    return cudaSuccess;
}

/* ---- copies ---- */

enum { M_PAGEABLE, M_PINNED, M_DEVICE };

static int mem_kind(const void *p, int *dev)
{
    globals &g = G();
    std::lock_guard<std::mutex> lk(g.mu);
    auto it = find_alloc(g, (uintptr_t)p);
    if (it == g.allocs.end() || (uintptr_t)p == it->first + it->second.size) return M_PAGEABLE;
    *dev = it->second.device;
    return it->second.device >= 0 ? M_DEVICE : M_PINNED;
}

static const char *kind_name(enum cudaMemcpyKind k)
{
    switch (k) {
    case cudaMemcpyHostToHost: return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice: return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost: return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice: return "cudaMemcpyDeviceToDevice";
    default: return "cudaMemcpyDefault";
    }
}

/* Checks one operand of a copy on 'dev'. want_device: 1 device, 0 host, -1 either. */
static bool check_operand(const char *who, const char *arg, const void *p, size_t bytes, int want_device, bool async,
                          enum cudaMemcpyKind kind, int dev)
{
    int odev = -1, k = mem_kind(p, &odev);
    if (want_device == 1 && k != M_DEVICE) {
        fail(cudaErrorInvalidValue, "%s: %s = %p is %s, but the kind %s says device memory", who, arg, p,
             k == M_PINNED ? "pinned host memory" : "pageable host memory", kind_name(kind));
        return false;
    }
    if (want_device == 0 && k == M_DEVICE) {
        fail(cudaErrorInvalidValue, "%s: %s = %p is memory of device %d, but the kind %s says host memory", who, arg, p,
             odev, kind_name(kind));
        return false;
    }
    if (k == M_PAGEABLE) {
        if (async && !G().allow_pageable) {
            fail(cudaErrorInvalidValue,
                 "%s: %s = %p is pageable host memory: CUDA copies it synchronously through a staging buffer, "
                 "so the copy is not asynchronous (pin it: cudaHostAlloc; CUDASIM_PAGEABLE=error made this an error)",
                 who, arg, p);
            return false;
        }
        return true;
    }
    /* device memory of another device is a peer copy (CUDA does it with unified addressing) */
    return check_access(k == M_DEVICE ? odev : dev, p, bytes, who, arg);
}

static cudaError_t memcpy_common(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t h,
                                 bool async, const char *who)
{
    int dev = current_device();
    STICKY_RETURN(dev);
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return err(cudaErrorInvalidValue, "%s: %s is NULL", who, dst ? "src" : "dst");
    if ((int)kind < 0 || (int)kind > 4) return err(cudaErrorInvalidMemcpyDirection, "%s: kind %d", who, (int)kind);
    int want_dst = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice ? 1
                   : kind == cudaMemcpyDefault                                       ? -1
                                                                                     : 0;
    int want_src = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice ? 1
                   : kind == cudaMemcpyDefault                                       ? -1
                                                                                     : 0;
    if (!check_operand(who, "dst", dst, bytes, want_dst, async, kind, dev) ||
        !check_operand(who, "src", src, bytes, want_src, async, kind, dev))
        return tl_last;
    auto s = resolve(h, who);
    if (!s) return cudaErrorInvalidResourceHandle;
    uint64_t seq = push(s, who, [dst, src, bytes]() {
        memcpy(dst, src, bytes);
        return cudaSuccess;
    });
    /* a pageable operand (unless CUDASIM_PAGEABLE=error), or a synchronous call: the call
       returns after the copy; CUDA's staged copy is synchronous for the host side ("might
       be synchronous", its API synchronization notes) */
    int d1 = 0, d2 = 0;
    if (!async || mem_kind(dst, &d1) == M_PAGEABLE || mem_kind(src, &d2) == M_PAGEABLE) {
        wait_done(s.get(), seq);
        std::lock_guard<std::mutex> lk(s->mu);
        if (s->error != cudaSuccess) return tl_last = s->error;
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    return memcpy_common(dst, src, bytes, kind, nullptr, false, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t s)
{
    return memcpy_common(dst, src, bytes, kind, s, true, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpyPeerAsync(void *dst, int dst_dev, const void *src, int src_dev, size_t bytes, cudaStream_t s)
{
    (void)dst_dev;
    (void)src_dev;
    return memcpy_common(dst, src, bytes, cudaMemcpyDeviceToDevice, s, true, "cudaMemcpyPeerAsync");
}

static cudaError_t memset_common(void *p, int v, size_t bytes, cudaStream_t h, bool async, const char *who)
{
    int dev = current_device();
    STICKY_RETURN(dev);
    if (bytes == 0) return cudaSuccess;
    int odev = -1;
    if (mem_kind(p, &odev) != M_DEVICE)
        return err(cudaErrorInvalidValue, "%s: p = %p is not device memory", who, p);
    if (!check_access(odev, p, bytes, who, "p")) return tl_last = cudaErrorInvalidValue;
    auto s = resolve(h, who);
    if (!s) return cudaErrorInvalidResourceHandle;
    uint64_t seq = push(s, who, [p, v, bytes]() {
        memset(p, v, bytes);
        return cudaSuccess;
    });
    if (!async) wait_done(s.get(), seq);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t bytes) { return memset_common(p, v, bytes, nullptr, false, "cudaMemset"); }

cudaError_t cudaMemsetAsync(void *p, int v, size_t bytes, cudaStream_t s)
{
    return memset_common(p, v, bytes, s, true, "cudaMemsetAsync");
}

/* ---- streams ---- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned flags)
{
    globals &g = G();
    int dev = current_device();
    if (!out) return err(cudaErrorInvalidValue, "cudaStreamCreate: out is NULL");
    STICKY_RETURN(dev);
    CUstream_st *h = new CUstream_st;
    h->s = new_stream(dev, !(flags & cudaStreamNonBlocking), false);
    std::lock_guard<std::mutex> lk(g.mu);
    g.handles.insert(h);
    g.dev[dev].streams.push_back(h->s);
    *out = h;
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t h)
{
    globals &g = G();
    if (h == nullptr || h == cudaStreamLegacy || h == cudaStreamPerThread)
        return err(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: %p is a default stream", (void *)h);
    std::shared_ptr<stream_impl> s;
    {
        std::lock_guard<std::mutex> lk(g.mu);
        if (!g.handles.erase(h))
            return err(cudaErrorInvalidResourceHandle, "cudaStreamDestroy(%p): not a live stream", (void *)h);
        s = h->s;
        auto &v = g.dev[s->device].streams;
        v.erase(std::remove_if(v.begin(), v.end(),
                               [&](const std::weak_ptr<stream_impl> &w) { return w.lock() == s || w.expired(); }),
                v.end());
    }
    {
        std::lock_guard<std::mutex> lk(s->mu); /* its work still runs (CUDA's destroy does not wait) */
        s->dying = true;
        s->cv.notify_all();
    }
    delete h;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h)
{
    auto s = resolve(h, "cudaStreamSynchronize");
    if (!s) return cudaErrorInvalidResourceHandle;
    wait_done(s.get(), tail_of(s.get()));
    STICKY_RETURN(s->device);
    return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t h)
{
    auto s = resolve(h, "cudaStreamQuery");
    if (!s) return cudaErrorInvalidResourceHandle;
    STICKY_RETURN(s->device);
    std::lock_guard<std::mutex> lk(s->mu);
    return s->completed >= s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

static bool event_live(cudaEvent_t e)
{
    globals &g = G();
    std::lock_guard<std::mutex> lk(g.mu);
    return g.events.count(e) != 0;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t h, cudaEvent_t e, unsigned flags)
{
    (void)flags;
    if (!event_live(e))
        return err(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: event %p is not a live event", (void *)e);
    std::shared_ptr<CUevent_st::record> rec;
    {
        std::lock_guard<std::mutex> lk(e->mu);
        rec = e->rec;
    }
    auto s = resolve(h, "cudaStreamWaitEvent");
    if (!s) return cudaErrorInvalidResourceHandle;
    STICKY_RETURN(s->device);
    if (!rec) return cudaSuccess; /* never recorded: nothing to wait for */
    push(s, "cudaStreamWaitEvent", [] { return cudaSuccess; }, {{rec->s, rec->seq}});
    return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void *user)
{
    return enqueue(h, "cudaLaunchHostFunc", [fn, user]() {
        fn(user);
        return cudaSuccess;
    });
}

/* ---- events ---- */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned flags)
{
    globals &g = G();
    if (!out) return err(cudaErrorInvalidValue, "cudaEventCreate: out is NULL");
    STICKY_RETURN(current_device());
    CUevent_st *e = new CUevent_st;
    e->flags = flags;
    e->device = current_device();
    std::lock_guard<std::mutex> lk(g.mu);
    g.events.insert(e);
    *out = e;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *out) { return cudaEventCreateWithFlags(out, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    globals &g = G();
    {
        std::lock_guard<std::mutex> lk(g.mu);
        if (!g.events.erase(e))
            return err(cudaErrorInvalidResourceHandle, "cudaEventDestroy(%p): not a live event", (void *)e);
    }
    delete e; /* a pending record keeps its own state */
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t h)
{
    if (!event_live(e))
        return err(cudaErrorInvalidResourceHandle, "cudaEventRecord: event %p is not a live event", (void *)e);
    auto s = resolve(h, "cudaEventRecord");
    if (!s) return cudaErrorInvalidResourceHandle;
    STICKY_RETURN(s->device);
    auto rec = std::make_shared<CUevent_st::record>();
    rec->s = s;
    {
        /* the record's seq is known only once pushed; the op reads nothing of rec but t */
        std::lock_guard<std::mutex> lk(e->mu);
        rec->seq = push(s, "cudaEventRecord", [rec]() {
            rec->t = std::chrono::steady_clock::now();
            return cudaSuccess;
        });
        e->rec = rec;
    }
    return cudaSuccess;
}

static cudaError_t event_state(cudaEvent_t e, const char *who, std::shared_ptr<CUevent_st::record> *out)
{
    if (!event_live(e)) return err(cudaErrorInvalidResourceHandle, "%s: event %p is not a live event", who, (void *)e);
    std::lock_guard<std::mutex> lk(e->mu);
    *out = e->rec;
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    std::shared_ptr<CUevent_st::record> rec;
    cudaError_t r = event_state(e, "cudaEventQuery", &rec);
    if (r != cudaSuccess || !rec) return r;
    STICKY_RETURN(rec->s->device);
    std::lock_guard<std::mutex> lk(rec->s->mu);
    return rec->s->completed >= rec->seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    std::shared_ptr<CUevent_st::record> rec;
    cudaError_t r = event_state(e, "cudaEventSynchronize", &rec);
    if (r != cudaSuccess || !rec) return r;
    wait_done(rec->s.get(), rec->seq);
    STICKY_RETURN(rec->s->device);
    return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
    std::shared_ptr<CUevent_st::record> ra, rb;
    if (!ms) return err(cudaErrorInvalidValue, "cudaEventElapsedTime: ms is NULL");
    cudaError_t r = event_state(a, "cudaEventElapsedTime", &ra);
    if (r == cudaSuccess) r = event_state(b, "cudaEventElapsedTime", &rb);
    if (r != cudaSuccess) return r;
    if ((a->flags | b->flags) & cudaEventDisableTiming)
        return err(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event created with cudaEventDisableTiming");
    if (!ra || !rb) return err(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
    for (auto *rec : {&ra, &rb}) {
        std::lock_guard<std::mutex> lk((*rec)->s->mu);
        if ((*rec)->s->completed < (*rec)->seq) return cudaErrorNotReady;
    }
    *ms = std::chrono::duration<float, std::milli>(rb->t - ra->t).count();
    return cudaSuccess;
}
