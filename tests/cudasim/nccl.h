/* cudasim: NCCL as communicators over the ranks of one process, on the simulated streams.

   Each rank is a host thread with its own simulated device (cudaSetDevice before
   ncclCommInitRankConfig; several ranks may share a device, as NCCL >= 2.30 allows with
   NCCL_MULTI_RANK_GPU_ENABLE=1). A unique id names a communicator clique in this process;
   ranks of another process never meet it (mpirun across processes is not simulated).

   Semantics, as NCCL's documentation and source give them:
   - ncclCommInitRankConfig: with config->blocking = 0 it returns ncclInProgress with the
     handle set, and ncclCommGetAsyncError reads ncclInProgress until every rank has joined;
     blocking (the default) it waits for them. nranks, rank, the id and duplicate ranks are
     checked; two ranks on one device need NCCL_MULTI_RANK_GPU_ENABLE=1 (ncclInvalidUsage,
     "duplicate GPU", found asynchronously as NCCL finds it).
   - ncclCommSplit is collective over the parent: on a non-blocking parent it returns
     ncclSuccess with *newcomm still NULL, the parent reads ncclInProgress until every rank
     has called it, and the child handle is written into *newcomm only then (from the
     thread of the last rank to arrive, as NCCL's asynchronous job writes it); on a blocking
     parent it waits. color NCCL_SPLIT_NOCOLOR gives NULL (ncclSuccess); ranks sorted by
     (key, old rank).
     splitShare (read on the parent's config) makes the child share the parent's abort
     flag. ncclCommAbort of the parent withdraws its rank from a running split (the child
     is then never written for that rank).
   - Collectives (ncclAllReduce, ncclReduceScatter, ncclAllGather, ncclBroadcast) are
     checked at the call (comm, type, op, root, the stream on the comm's device, buffers
     inside one allocation of the comm's device via cudasim::check_access, NCCL's in-place
     rules: all-reduce and broadcast with
     sendbuff == recvbuff, all-gather with sendbuff == recvbuff + rank * sendcount,
     reduce-scatter with recvbuff == sendbuff + rank * recvcount; any other overlap is an
     error), numbered in call order per communicator, and enqueued on the stream
     (cudasim::enqueue). On the stream's worker the rank waits for every rank's call of the
     same number, checks that they agree (operation, count, type, op, root: a mismatch sets
     every rank's asynchronous error to ncclInvalidUsage with a message naming the call and
     the ranks, printed once, instead of the hang or corruption a GPU gives), reduces into a
     temporary buffer, waits for every rank to have read, then writes recvbuff.
   - Reduction order (fixed, documented): element i of an all-reduce or reduce-scatter is
     ((x_0 + x_1) + x_2) + ... + x_{N-1} over ranks 0..N-1, each addition in fp32 rounded to
     the type for f32, f16 and bf16 (fp32 then the 16-bit rounding: exact as one rounding,
     24 >= 2 x 11 + 2), in fp64 for f64; ncclMax likewise. So all-reduce and reduce-scatter
     give the same bits: the harness cannot show NCCL's real order (ring or tree, chunked).
   - A peer that never arrives: the waiting rank's stream stays busy (cudaEventQuery says
     not ready, cudaStreamSynchronize blocks) until ncclCommAbort of its communicator, or
     of the parent sharing its abort flag, ends the wait (the collective then writes
     nothing), as an aborted NCCL kernel returns. A safety net for tests that would hang:
     after CUDASIM_NCCL_HANG_S seconds (default 300) the wait ends with the asynchronous
     error ncclSystemError and a message naming the call and the missing ranks.
   - ncclSend / ncclRecv: checked at the call like the collectives (peer in range, the
     buffer, the stream's device), numbered per peer and direction: the n-th send from rank
     a to rank b meets the n-th receive at b from a. The point-to-point calls of one group
     on one comm and stream run as one operation on the stream: every send posted first,
     then each receive waits for its send and copies, then each send waits to have been
     read (so ranks that exchange, an all-to-all, never wait for each other). A count or
     type that differs between a send and its receive sets both ranks' asynchronous error
     to ncclInvalidUsage with a message naming both calls; a peer that never posts waits
     like a collective's (abort, or CUDASIM_NCCL_HANG_S). ncclCommCount, ncclCommUserRank.
   - ncclGroupStart / ncclGroupEnd (per thread, nested): the collectives of a group are
     enqueued at the outermost ncclGroupEnd, in call order; its point-to-point calls as
     one operation per comm and stream.
   - ncclCommFinalize (returns ncclInProgress on a non-blocking comm until its streams'
     collectives are done), ncclCommDestroy, ncclCommAbort, ncclCommGetAsyncError,
     ncclGetLastError, ncclGetErrorString, ncclGetUniqueId, ncclGetVersion (2.30.0).

   Header-only (every function inline): include it in one or more C++ files. */
#ifndef CUDASIM_NCCL_H
#define CUDASIM_NCCL_H
#include <cuda_runtime.h>

#include "cudasim.h"
#include "sim_numeric.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <functional>
#include <vector>

#define NCCL_MAJOR 2
#define NCCL_MINOR 30
#define NCCL_PATCH 0
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)
#define NCCL_UNIQUE_ID_BYTES 128
#define NCCL_SPLIT_NOCOLOR -1

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;
typedef enum {
    ncclInt8 = 0, ncclChar = 0, ncclUint8 = 1, ncclInt32 = 2, ncclInt = 2, ncclUint32 = 3, ncclInt64 = 4,
    ncclUint64 = 5, ncclFloat16 = 6, ncclHalf = 6, ncclFloat32 = 7, ncclFloat = 7, ncclFloat64 = 8,
    ncclDouble = 8, ncclBfloat16 = 9
} ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

#define NCCL_CONFIG_UNDEF_INT (-2147483647 - 1)
#define NCCL_CONFIG_UNDEF_PTR NULL
typedef struct ncclConfig_v22800 {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER                                                                                   \
    {                                                                                                             \
        sizeof(ncclConfig_t), 0xcafebeefu, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_CONFIG_UNDEF_INT, \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR,           \
            NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR                                    \
    }

namespace cudasim_nccl {
struct state;
}
struct ncclComm {
    std::shared_ptr<cudasim_nccl::state> s;
};
typedef struct ncclComm *ncclComm_t;

namespace cudasim_nccl {

struct clique;

/* A communicator of one rank. The handle (ncclComm_t) holds a reference and every enqueued
   collective one more, so a comm destroyed or aborted under queued work stays valid for
   that work (which then ends without writing). */
struct state {
    std::shared_ptr<clique> cl;
    int rank = 0, nranks = 1, device = 0;
    bool blocking = true, share = false;
    std::string name;
    std::shared_ptr<std::atomic<bool>> abort_flag;
    std::atomic<bool> dead{false};      /* destroyed or aborted                  */
    std::atomic<bool> finalized{false};
    std::atomic<int> err{ncclSuccess};  /* sticky asynchronous error             */
    std::atomic<int> pending{0};        /* collectives enqueued, not finished     */
    int splitting = 0;                  /* splits begun as parent, unfinished (cl->mu) */
    uint64_t next_coll = 0, next_split = 0; /* call numbers, the caller's thread */
    std::map<int, uint64_t> next_send, next_recv; /* point-to-point numbers, by peer */
    bool stopped() const { return dead.load() || abort_flag->load(); }
};

/* One collective call, matched across the clique's ranks by its number. */
struct coll {
    int kind = -1; /* 0 all-gather, 1 reduce-scatter, 2 all-reduce, 3 broadcast */
    size_t count = 0;
    ncclDataType_t type = ncclFloat32;
    ncclRedOp_t op = ncclSum;
    int root = 0, first = -1;
    int arrived = 0, read = 0, left = 0;
    bool bad = false;
    std::string why;
    std::vector<const void *> send;
};

/* One point-to-point transfer: the n-th ncclSend from rank a to rank b meets the n-th
   ncclRecv at b from a, whichever arrives first. The sender posts its buffer and waits
   until the receiver has copied it (or found a mismatch). */
struct p2p {
    bool posted = false, rpresent = false, consumed = false, bad = false;
    const void *src = nullptr;
    size_t scount = 0, rcount = 0;
    ncclDataType_t stype = ncclFloat32, rtype = ncclFloat32;
    std::string why;
};

/* A split in progress: each rank's arguments and where its child goes. */
struct split_call {
    int arrived = 0;
    std::vector<int> color, key, here, child_blocking;
    std::vector<ncclComm_t *> out;
    std::vector<std::shared_ptr<state>> parent;
};

/* The ranks of one communicator. */
struct clique {
    std::mutex mu;
    std::condition_variable cv;
    int nranks = 0, joined = 0;
    ncclResult_t init = ncclInProgress; /* every rank joined: ncclSuccess or the error */
    std::string init_why;
    std::vector<int> device, here;
    std::string name;
    std::map<uint64_t, coll> colls;
    std::map<uint64_t, split_call> splits;
    std::map<std::tuple<int, int, uint64_t>, p2p> p2ps; /* (sender, receiver, number) */
};

struct globals {
    std::mutex mu;
    std::map<std::string, std::shared_ptr<clique>> forming; /* by unique id */
    std::string last_error;
    std::atomic<uint64_t> ids{0};
};
inline globals &g()
{
    static globals *G = new globals; /* never destroyed: stream workers may outlive main */
    return *G;
}

inline ncclResult_t set_last(ncclResult_t r, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    std::lock_guard<std::mutex> lk(g().mu);
    g().last_error = buf;
    return r;
}

inline int hang_seconds()
{
    const char *e = std::getenv("CUDASIM_NCCL_HANG_S");
    int s = e ? std::atoi(e) : 0;
    return s > 0 ? s : 300;
}

inline const char *kind_name(int k)
{
    static const char *n[] = {"ncclAllGather", "ncclReduceScatter", "ncclAllReduce", "ncclBroadcast", "ncclSend",
                              "ncclRecv"};
    return k >= 0 && k < 6 ? n[k] : "?";
}

inline const char *type_name(ncclDataType_t t)
{
    switch (t) {
    case ncclFloat16: return "ncclFloat16";
    case ncclFloat32: return "ncclFloat32";
    case ncclFloat64: return "ncclFloat64";
    case ncclBfloat16: return "ncclBfloat16";
    default: return "an unsimulated type";
    }
}

inline bool num_kind(ncclDataType_t t, cudasim_num::kind *k)
{
    switch (t) {
    case ncclFloat16: *k = cudasim_num::F16; return true;
    case ncclFloat32: *k = cudasim_num::F32; return true;
    case ncclFloat64: *k = cudasim_num::F64; return true;
    case ncclBfloat16: *k = cudasim_num::BF16; return true;
    default: return false;
    }
}

/* Waits on cl->cv until done() or the rank stops (abort, destroy); after the hang limit
   fails the comm with 'what' and returns false. lk holds cl->mu. */
template <typename F>
inline bool wait_for(state &s, std::unique_lock<std::mutex> &lk, F done, const std::function<std::string()> &what)
{
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(hang_seconds());
    while (!done()) {
        if (s.stopped()) return false;
        if (std::chrono::steady_clock::now() > until) {
            std::string w = what();
            std::fprintf(stderr, "cudasim nccl: %s\n", w.c_str());
            set_last(ncclSystemError, "%s", w.c_str());
            s.err = ncclSystemError;
            return false;
        }
        s.cl->cv.wait_for(lk, std::chrono::milliseconds(20));
    }
    return true;
}

inline std::string missing(const clique &cl, const std::function<bool(int)> &has)
{
    std::string m;
    for (int r = 0; r < cl.nranks; r++)
        if (!has(r)) m += (m.empty() ? "" : ", ") + std::to_string(r);
    return m;
}

/* Every rank has joined (cl->mu held): NCCL's asynchronous checks. */
inline void init_done(clique &cl)
{
    const char *multi = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    cl.init = ncclSuccess;
    for (int a = 0; a < cl.nranks && cl.init == ncclSuccess; a++)
        for (int b = a + 1; b < cl.nranks; b++)
            if (cl.device[a] == cl.device[b] && !(multi && std::atoi(multi) == 1)) {
                char buf[200];
                std::snprintf(buf, sizeof buf,
                              "Duplicate GPU detected: rank %d and rank %d both on CUDA device %d "
                              "(NCCL_MULTI_RANK_GPU_ENABLE=1 allows it)",
                              a, b, cl.device[a]);
                cl.init = ncclInvalidUsage;
                cl.init_why = buf;
                break;
            }
    cl.cv.notify_all();
}

/* The comm's asynchronous state, as ncclCommGetAsyncError reads it. */
inline ncclResult_t async_state(state &s)
{
    if (s.err.load() != ncclSuccess) return (ncclResult_t)s.err.load();
    std::lock_guard<std::mutex> lk(s.cl->mu);
    if (s.cl->init != ncclSuccess) {
        if (s.cl->init != ncclInProgress) set_last(s.cl->init, "%s", s.cl->init_why.c_str());
        return s.cl->init;
    }
    if (s.splitting > 0) return ncclInProgress;
    if (s.finalized.load() && s.pending.load() > 0) return ncclInProgress;
    return ncclSuccess;
}

inline std::shared_ptr<state> of(ncclComm_t c) { return c ? c->s : nullptr; }

/* One collective's arguments, as enqueued. */
struct call {
    int kind;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t op;
    int root;
    std::shared_ptr<state> sp; /* not the handle: a grouped call outlives a destroyed one */
    cudaStream_t stream;
    uint64_t pseq = 0; /* ncclSend / ncclRecv (kind 4 / 5, peer in root): the number */
};

/* Runs call number 'seq' of rank s on its stream's worker. */
inline void run(const std::shared_ptr<state> &sp, const call &c, uint64_t seq)
{
    state &s = *sp;
    clique &cl = *s.cl;
    const int n = s.nranks, me = s.rank;
    cudasim_num::kind k = cudasim_num::F32;
    num_kind(c.type, &k);
    const size_t es = cudasim_num::kind_size(k);
    std::unique_lock<std::mutex> lk(cl.mu);
    coll &x = cl.colls[seq];
    if (x.kind < 0) {
        x.kind = c.kind, x.count = c.count, x.type = c.type, x.op = c.op, x.root = c.root, x.first = me;
        x.send.assign((size_t)n, nullptr);
    } else if (!x.bad && (x.kind != c.kind || x.count != c.count || x.type != c.type ||
                          (c.kind == 1 || c.kind == 2 ? x.op != c.op : false) || (c.kind == 3 && x.root != c.root))) {
        char buf[700];
        std::snprintf(buf, sizeof buf,
                      "collective #%llu of communicator '%s' (%d ranks) does not match across ranks: rank %d "
                      "called %s(count %zu, %s, op %d, root %d), rank %d called %s(count %zu, %s, op %d, root %d)",
                      (unsigned long long)seq + 1, cl.name.c_str(), n, x.first, kind_name(x.kind), x.count,
                      type_name(x.type), (int)x.op, x.root, me, kind_name(c.kind), c.count, type_name(c.type),
                      (int)c.op, c.root);
        x.bad = true;
        x.why = buf;
        std::fprintf(stderr, "cudasim nccl: %s\n", buf);
    }
    x.send[(size_t)me] = c.send;
    x.arrived++;
    cl.cv.notify_all();
    auto what = [&]() {
        return std::string(kind_name(c.kind)) + " #" + std::to_string(seq + 1) + " of communicator '" + cl.name +
               "': rank " + std::to_string(me) + " waited " + std::to_string(hang_seconds()) +
               " s (CUDASIM_NCCL_HANG_S) for ranks that never called it: " +
               missing(cl, [&](int r) { return x.send[(size_t)r] != nullptr || r == me; });
    };
    bool ok = wait_for(s, lk, [&]() { return x.arrived == n; }, what);
    if (ok && x.bad) {
        set_last(ncclInvalidUsage, "%s", x.why.c_str());
        s.err = ncclInvalidUsage;
        ok = false;
    }
    std::vector<unsigned char> tmp;
    if (ok) {
        lk.unlock();
        const size_t cnt = c.count;
        if (c.kind == 0) { /* all-gather: rank r's block at r * count */
            tmp.resize((size_t)n * cnt * es);
            for (int r = 0; r < n; r++) std::memcpy(tmp.data() + (size_t)r * cnt * es, x.send[(size_t)r], cnt * es);
        } else if (c.kind == 3) { /* broadcast */
            tmp.resize(cnt * es);
            std::memcpy(tmp.data(), x.send[(size_t)c.root], cnt * es);
        } else { /* reductions over ranks 0..n-1 in order */
            const size_t base = c.kind == 1 ? (size_t)me * cnt : 0;
            tmp.resize(cnt * es);
            for (size_t i = 0; i < cnt; i++) {
                if (k == cudasim_num::F64) {
                    double a = cudasim_num::load(x.send[0], base + i, k);
                    for (int r = 1; r < n; r++) {
                        double b = cudasim_num::load(x.send[(size_t)r], base + i, k);
                        a = c.op == ncclMax ? (b > a ? b : a) : a + b;
                    }
                    cudasim_num::store(tmp.data(), i, k, a);
                } else {
                    float a = (float)cudasim_num::load(x.send[0], base + i, k);
                    for (int r = 1; r < n; r++) {
                        float b = (float)cudasim_num::load(x.send[(size_t)r], base + i, k);
                        a = c.op == ncclMax ? (b > a ? b : a) : a + b;
                        a = cudasim_num::round_to(k, a); /* rounded to the type at every step */
                    }
                    cudasim_num::store(tmp.data(), i, k, a);
                }
            }
        }
        lk.lock();
    }
    x.read++;
    cl.cv.notify_all();
    if (ok) ok = wait_for(s, lk, [&]() { return x.read == n; }, what);
    if (ok) {
        lk.unlock();
        std::memcpy(c.recv, tmp.data(), tmp.size());
        lk.lock();
    }
    if (++x.left == n) cl.colls.erase(seq);
}

/* Enqueues one collective on its stream. */
inline ncclResult_t launch(const call &c)
{
    std::shared_ptr<state> sp = c.sp;
    uint64_t seq = sp->next_coll++;
    sp->pending++;
    cudaError_t e = cudasim::enqueue(c.stream, kind_name(c.kind), [sp, c, seq]() -> cudaError_t {
        run(sp, c, seq);
        sp->pending--;
        return cudaSuccess;
    });
    if (e != cudaSuccess) {
        sp->pending--;
        return set_last(ncclUnhandledCudaError, "%s: cannot enqueue on the stream: %s", kind_name(c.kind),
                        cudaGetErrorString(e));
    }
    return ncclSuccess;
}

/* Both sides of p2p x are there: a mismatch in count or type marks it bad (cl.mu held). */
inline void p2p_match(clique &cl, p2p &x, int from, int to, uint64_t n)
{
    if (!x.posted || !x.rpresent || x.bad || (x.scount == x.rcount && x.stype == x.rtype)) return;
    char buf[600];
    std::snprintf(buf, sizeof buf,
                  "point-to-point #%llu from rank %d to rank %d of communicator '%s' does not match: "
                  "ncclSend(count %zu, %s) at rank %d, ncclRecv(count %zu, %s) at rank %d",
                  (unsigned long long)n + 1, from, to, cl.name.c_str(), x.scount, type_name(x.stype), from,
                  x.rcount, type_name(x.rtype), to);
    x.bad = true;
    x.why = buf;
    std::fprintf(stderr, "cudasim nccl: %s\n", buf);
}

/* The point-to-point calls of one group of rank s on one stream, on its worker: every send
   posted first (so that ranks that send to each other do not wait for each other), then
   each receive waits for its sender and copies, then the sends wait to have been read. */
inline void run_p2p(const std::shared_ptr<state> &sp, const std::vector<call> &ops)
{
    state &s = *sp;
    clique &cl = *s.cl;
    const int me = s.rank;
    std::unique_lock<std::mutex> lk(cl.mu);
    auto fail_with = [&](const std::string &why) {
        set_last(ncclInvalidUsage, "%s", why.c_str());
        s.err = ncclInvalidUsage;
    };
    for (const call &c : ops) {
        if (c.kind != 4) continue;
        p2p &x = cl.p2ps[std::make_tuple(me, c.root, c.pseq)];
        x.posted = true, x.src = c.send, x.scount = c.count, x.stype = c.type;
        p2p_match(cl, x, me, c.root, c.pseq);
    }
    cl.cv.notify_all();
    for (const call &c : ops) {
        if (c.kind != 5) continue;
        p2p &x = cl.p2ps[std::make_tuple(c.root, me, c.pseq)];
        x.rpresent = true, x.rcount = c.count, x.rtype = c.type;
        p2p_match(cl, x, c.root, me, c.pseq);
        cl.cv.notify_all();
        bool ok = wait_for(s, lk, [&]() { return x.posted; }, [&]() {
            return "ncclRecv #" + std::to_string(c.pseq + 1) + " of communicator '" + cl.name + "': rank " +
                   std::to_string(me) + " waited " + std::to_string(hang_seconds()) +
                   " s (CUDASIM_NCCL_HANG_S) for the matching ncclSend of rank " + std::to_string(c.root);
        });
        if (!ok) continue; /* stopped or timed out: nothing written, the sender keeps waiting */
        if (x.bad) {
            fail_with(x.why);
        } else if (c.count > 0) {
            cudasim_num::kind k = cudasim_num::F32;
            num_kind(c.type, &k);
            const void *src = x.src;
            lk.unlock();
            std::memcpy(c.recv, src, c.count * cudasim_num::kind_size(k));
            lk.lock();
        }
        x.consumed = true;
        cl.cv.notify_all();
    }
    for (const call &c : ops) {
        if (c.kind != 4) continue;
        auto key = std::make_tuple(me, c.root, c.pseq);
        p2p &x = cl.p2ps[key];
        bool ok = wait_for(s, lk, [&]() { return x.consumed; }, [&]() {
            return "ncclSend #" + std::to_string(c.pseq + 1) + " of communicator '" + cl.name + "': rank " +
                   std::to_string(me) + " waited " + std::to_string(hang_seconds()) +
                   " s (CUDASIM_NCCL_HANG_S) for the matching ncclRecv of rank " + std::to_string(c.root);
        });
        if (!ok) continue;
        if (x.bad) fail_with(x.why);
        cl.p2ps.erase(key);
    }
}

/* Enqueues one group's point-to-point calls of one comm and stream as one operation. */
inline ncclResult_t launch_p2p(const std::vector<call> &ops)
{
    std::shared_ptr<state> sp = ops[0].sp;
    sp->pending++;
    cudaError_t e = cudasim::enqueue(ops[0].stream, "ncclSend/ncclRecv", [sp, ops]() -> cudaError_t {
        run_p2p(sp, ops);
        sp->pending--;
        return cudaSuccess;
    });
    if (e != cudaSuccess) {
        sp->pending--;
        return set_last(ncclUnhandledCudaError, "ncclSend/ncclRecv: cannot enqueue on the stream: %s",
                        cudaGetErrorString(e));
    }
    return ncclSuccess;
}

inline std::vector<call> &group_calls()
{
    static thread_local std::vector<call> v;
    return v;
}
inline int &group_depth()
{
    static thread_local int d = 0;
    return d;
}

inline bool overlap(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* The checks every call makes first: a live, initialized comm and a simulated datatype. */
inline ncclResult_t usable(const char *who, ncclComm_t comm, ncclDataType_t type, std::shared_ptr<state> *spp,
                           cudasim_num::kind *k)
{
    std::shared_ptr<state> sp = of(comm);
    *spp = sp;
    if (!sp) return set_last(ncclInvalidArgument, "%s: comm is NULL", who);
    if (sp->stopped()) return set_last(ncclInvalidUsage, "%s: the communicator was aborted or destroyed", who);
    {
        std::lock_guard<std::mutex> lk(sp->cl->mu);
        if (sp->cl->init != ncclSuccess)
            return set_last(ncclInvalidUsage, "%s: the communicator is not initialized (%s)", who,
                            sp->cl->init == ncclInProgress ? "its init is in progress" : sp->cl->init_why.c_str());
    }
    if (!num_kind(type, k)) return set_last(ncclInvalidArgument, "%s: datatype %d is not simulated", who, (int)type);
    return ncclSuccess;
}

/* The stream must be on the comm's device (a launch there fails in CUDA too). */
inline ncclResult_t stream_on_device(const char *who, const state &st, cudaStream_t stream)
{
    int sd = cudasim::stream_device(stream);
    if (sd >= 0 && sd != st.device) {
        cudasim::fail(cudaErrorInvalidResourceHandle, "%s: the stream is on device %d, the communicator on device %d",
                      who, sd, st.device);
        return set_last(ncclInvalidArgument, "%s: the stream is on device %d, the communicator on device %d", who, sd,
                        st.device);
    }
    return ncclSuccess;
}

/* The checks at the call, then enqueue (or keep for the group's end). */
inline ncclResult_t collective(int kind, const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    const char *who = kind_name(kind);
    std::shared_ptr<state> sp;
    cudasim_num::kind k = cudasim_num::F32;
    ncclResult_t ok = usable(who, comm, type, &sp, &k);
    if (ok != ncclSuccess) return ok;
    if ((kind == 1 || kind == 2) && op != ncclSum && op != ncclMax)
        return set_last(ncclInvalidArgument, "%s: op %d is not simulated (ncclSum, ncclMax)", who, (int)op);
    if (kind == 3 && (root < 0 || root >= sp->nranks))
        return set_last(ncclInvalidArgument, "%s: root %d of %d ranks", who, root, sp->nranks);
    if (count == 0) return ncclSuccess;
    const size_t es = cudasim_num::kind_size(k), n = (size_t)sp->nranks, me = (size_t)sp->rank;
    size_t sbytes = count * es, rbytes = count * es;
    if (kind == 0) rbytes *= n;
    if (kind == 1) sbytes *= n;
    const bool uses_send = kind != 3 || (int)me == root;
    if ((uses_send && !send) || !recv) return set_last(ncclInvalidArgument, "%s: NULL buffer", who);
    if (uses_send && !cudasim::check_access(sp->device, send, sbytes, who, "sendbuff"))
        return set_last(ncclInvalidArgument, "%s: sendbuff %p (%zu bytes) is not device memory of the comm's device %d",
                        who, send, sbytes, sp->device);
    if (!cudasim::check_access(sp->device, recv, rbytes, who, "recvbuff"))
        return set_last(ncclInvalidArgument, "%s: recvbuff %p (%zu bytes) is not device memory of the comm's device %d",
                        who, recv, rbytes, sp->device);
    if ((ok = stream_on_device(who, *sp, stream)) != ncclSuccess) return ok;
    if (uses_send && overlap(send, sbytes, recv, rbytes)) {
        const char *s = (const char *)send, *r = (const char *)recv;
        bool inplace = kind == 0   ? s == r + me * sbytes
                       : kind == 1 ? r == s + me * rbytes
                                   : s == r;
        if (!inplace) {
            std::fprintf(stderr, "cudasim nccl: %s: sendbuff %p and recvbuff %p overlap without being in place\n", who,
                         send, recv);
            return set_last(ncclInvalidArgument,
                            "%s: sendbuff and recvbuff overlap but are not in place (NCCL: all-gather sendbuff == "
                            "recvbuff + rank * sendcount, reduce-scatter recvbuff == sendbuff + rank * recvcount, "
                            "else sendbuff == recvbuff)",
                            who);
        }
    }
    call c = {kind, uses_send ? send : nullptr, recv, count, type, op, root, sp, stream};
    if (group_depth() > 0) {
        group_calls().push_back(c);
        return ncclSuccess;
    }
    return launch(c);
}

/* ncclSend (kind 4) / ncclRecv (kind 5): the checks at the call, then enqueue or keep. */
inline ncclResult_t p2p_call(int kind, const void *send, void *recv, size_t count, ncclDataType_t type, int peer,
                             ncclComm_t comm, cudaStream_t stream)
{
    const char *who = kind_name(kind);
    std::shared_ptr<state> sp;
    cudasim_num::kind k = cudasim_num::F32;
    ncclResult_t ok = usable(who, comm, type, &sp, &k);
    if (ok != ncclSuccess) return ok;
    if (peer < 0 || peer >= sp->nranks)
        return set_last(ncclInvalidArgument, "%s: peer %d of %d ranks", who, peer, sp->nranks);
    const void *buf = kind == 4 ? send : (const void *)recv;
    const size_t bytes = count * cudasim_num::kind_size(k);
    if (count > 0 && !buf) return set_last(ncclInvalidArgument, "%s: NULL buffer", who);
    if (count > 0 && !cudasim::check_access(sp->device, buf, bytes, who, kind == 4 ? "sendbuff" : "recvbuff"))
        return set_last(ncclInvalidArgument, "%s: buffer %p (%zu bytes) is not device memory of the comm's device %d",
                        who, buf, bytes, sp->device);
    if ((ok = stream_on_device(who, *sp, stream)) != ncclSuccess) return ok;
    call c = {kind, kind == 4 ? send : nullptr, kind == 5 ? recv : nullptr, count, type, ncclSum, peer, sp, stream};
    c.pseq = kind == 4 ? sp->next_send[peer]++ : sp->next_recv[peer]++;
    if (group_depth() > 0) {
        group_calls().push_back(c);
        return ncclSuccess;
    }
    return launch_p2p(std::vector<call>(1, c));
}

inline std::string id_key(const ncclUniqueId &id) { return std::string(id.internal, sizeof id.internal); }

} /* namespace cudasim_nccl */

inline const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

inline const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    static thread_local std::string copy;
    std::lock_guard<std::mutex> lk(cudasim_nccl::g().mu);
    copy = cudasim_nccl::g().last_error;
    return copy.c_str();
}

inline ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id) return cudasim_nccl::set_last(ncclInvalidArgument, "ncclGetUniqueId: id is NULL");
    std::memset(id, 0, sizeof *id);
    std::random_device rd;
    uint64_t w[3] = {0x6375646173696d00ull /* "cudasim" */, cudasim_nccl::g().ids.fetch_add(1) + 1,
                     ((uint64_t)rd() << 32) ^ rd()};
    std::memcpy(id->internal, w, sizeof w);
    return ncclSuccess;
}

inline ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                           ncclConfig_t *config)
{
    using namespace cudasim_nccl;
    uint64_t magic;
    if (!comm) return set_last(ncclInvalidArgument, "ncclCommInitRankConfig: comm is NULL");
    *comm = nullptr;
    std::memcpy(&magic, commId.internal, sizeof magic);
    if (magic != 0x6375646173696d00ull)
        return set_last(ncclInvalidArgument, "ncclCommInitRankConfig: the unique id was not made by ncclGetUniqueId");
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return set_last(ncclInvalidArgument, "ncclCommInitRankConfig: rank %d of nranks %d", rank, nranks);
    auto sp = std::make_shared<state>();
    sp->rank = rank, sp->nranks = nranks, sp->device = cudasim::current_device();
    sp->blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
    sp->share = config && config->splitShare != NCCL_CONFIG_UNDEF_INT && config->splitShare != 0;
    sp->name = config && config->commName ? config->commName : "";
    sp->abort_flag = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<clique> cl;
    {
        std::lock_guard<std::mutex> lk(g().mu);
        auto it = g().forming.find(id_key(commId));
        if (it == g().forming.end()) {
            cl = std::make_shared<clique>();
            cl->nranks = nranks;
            cl->device.assign((size_t)nranks, -1);
            cl->here.assign((size_t)nranks, 0);
            cl->name = sp->name;
            g().forming[id_key(commId)] = cl;
        } else {
            cl = it->second;
        }
    }
    {
        std::unique_lock<std::mutex> lk(cl->mu);
        if (cl->nranks != nranks)
            return set_last(ncclInvalidArgument, "ncclCommInitRankConfig: nranks %d, but another rank passed %d",
                            nranks, cl->nranks);
        if (cl->here[(size_t)rank])
            return set_last(ncclInvalidArgument, "ncclCommInitRankConfig: rank %d joined twice", rank);
        cl->here[(size_t)rank] = 1;
        cl->device[(size_t)rank] = sp->device;
        sp->cl = cl;
        if (++cl->joined == nranks) {
            init_done(*cl);
            std::lock_guard<std::mutex> gl(g().mu);
            g().forming.erase(id_key(commId));
        }
    }
    *comm = new ncclComm{sp};
    if (!sp->blocking) return ncclInProgress;
    std::unique_lock<std::mutex> lk(cl->mu);
    wait_for(*sp, lk, [&]() { return cl->init != ncclInProgress; }, [&]() {
        return "ncclCommInitRankConfig: rank " + std::to_string(rank) + " waited for ranks that never joined: " +
               missing(*cl, [&](int r) { return cl->here[(size_t)r] != 0; });
    });
    if (cl->init == ncclInProgress) return (ncclResult_t)sp->err.load();
    if (cl->init != ncclSuccess) return set_last(cl->init, "%s", cl->init_why.c_str());
    return ncclSuccess;
}

inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    auto sp = cudasim_nccl::of(comm);
    if (!sp || !asyncError) return cudasim_nccl::set_last(ncclInvalidArgument, "ncclCommGetAsyncError: NULL argument");
    *asyncError = cudasim_nccl::async_state(*sp);
    return ncclSuccess;
}

inline ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    using namespace cudasim_nccl;
    auto sp = of(comm);
    if (!sp || !newcomm) return set_last(ncclInvalidArgument, "ncclCommSplit: NULL argument");
    *newcomm = nullptr;
    if (sp->stopped()) return set_last(ncclInvalidUsage, "ncclCommSplit: the parent was aborted or destroyed");
    clique &cl = *sp->cl;
    std::unique_lock<std::mutex> lk(cl.mu);
    if (cl.init != ncclSuccess)
        return set_last(ncclInvalidUsage, "ncclCommSplit: the parent is not initialized");
    const uint64_t seq = sp->next_split++;
    const int n = sp->nranks, me = sp->rank;
    split_call &x = cl.splits[seq];
    if (x.color.empty()) {
        x.color.assign((size_t)n, 0), x.key.assign((size_t)n, 0), x.here.assign((size_t)n, 0);
        x.child_blocking.assign((size_t)n, 1), x.out.assign((size_t)n, nullptr), x.parent.assign((size_t)n, nullptr);
    }
    x.color[(size_t)me] = color, x.key[(size_t)me] = key, x.here[(size_t)me] = 1;
    x.child_blocking[(size_t)me] = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
    x.out[(size_t)me] = newcomm;
    x.parent[(size_t)me] = sp;
    sp->splitting++;
    if (++x.arrived == n) { /* the last rank makes every child and writes the handles */
        std::map<int, std::vector<int>> by;
        for (int r = 0; r < n; r++)
            if (x.color[(size_t)r] != NCCL_SPLIT_NOCOLOR) by[x.color[(size_t)r]].push_back(r);
        for (auto &kv : by) {
            std::vector<int> &m = kv.second;
            std::stable_sort(m.begin(), m.end(), [&](int a, int b) { return x.key[(size_t)a] < x.key[(size_t)b]; });
            auto ncl = std::make_shared<clique>();
            ncl->nranks = (int)m.size(), ncl->joined = ncl->nranks, ncl->init = ncclSuccess;
            ncl->here.assign(m.size(), 1);
            ncl->name = cl.name;
            for (size_t i = 0; i < m.size(); i++) ncl->device.push_back(cl.device[(size_t)m[i]]);
            for (size_t i = 0; i < m.size(); i++) {
                auto &p = x.parent[(size_t)m[i]];
                auto cs = std::make_shared<state>();
                cs->cl = ncl, cs->rank = (int)i, cs->nranks = (int)m.size(), cs->device = p->device;
                cs->blocking = x.child_blocking[(size_t)m[i]] != 0, cs->share = p->share, cs->name = p->name;
                cs->abort_flag = p->share ? p->abort_flag : std::make_shared<std::atomic<bool>>(false);
                *x.out[(size_t)m[i]] = new ncclComm{cs};
            }
        }
        for (int r = 0; r < n; r++) x.parent[(size_t)r]->splitting--;
        cl.splits.erase(seq);
        cl.cv.notify_all();
        return ncclSuccess;
    }
    if (!sp->blocking) return ncclSuccess; /* the child comes with the parent's settling */
    wait_for(*sp, lk, [&]() { return cl.splits.find(seq) == cl.splits.end(); }, [&]() {
        return std::string("ncclCommSplit: rank ") + std::to_string(me) + " waited for ranks that never called it";
    });
    if (*newcomm || (color == NCCL_SPLIT_NOCOLOR && cl.splits.find(seq) == cl.splits.end())) return ncclSuccess;
    return (ncclResult_t)(sp->err.load() ? sp->err.load() : ncclInvalidUsage);
}

inline ncclResult_t ncclGroupStart(void)
{
    cudasim_nccl::group_depth()++;
    return ncclSuccess;
}

inline ncclResult_t ncclGroupEnd(void)
{
    using namespace cudasim_nccl;
    ncclResult_t r = ncclSuccess;
    if (group_depth() == 0) return set_last(ncclInvalidUsage, "ncclGroupEnd: no ncclGroupStart");
    if (--group_depth() > 0) return ncclSuccess;
    std::vector<call> calls;
    calls.swap(group_calls());
    std::vector<std::vector<call>> p2ps; /* one operation per (comm, stream), in call order */
    for (const call &c : calls) {
        if (c.kind >= 4) {
            size_t i = 0;
            while (i < p2ps.size() && !(p2ps[i][0].sp == c.sp && p2ps[i][0].stream == c.stream)) i++;
            if (i == p2ps.size()) p2ps.emplace_back();
            p2ps[i].push_back(c);
            continue;
        }
        ncclResult_t q = c.sp->stopped() ? ncclInvalidUsage : launch(c);
        if (r == ncclSuccess) r = q;
    }
    for (const std::vector<call> &ops : p2ps) {
        ncclResult_t q = ops[0].sp->stopped() ? ncclInvalidUsage : launch_p2p(ops);
        if (r == ncclSuccess) r = q;
    }
    return r;
}

inline ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    using namespace cudasim_nccl;
    auto sp = of(comm);
    if (!sp) return set_last(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
    sp->finalized = true;
    if (!sp->blocking) return sp->pending.load() > 0 ? ncclInProgress : ncclSuccess;
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(hang_seconds());
    while (sp->pending.load() > 0 && !sp->stopped() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return sp->pending.load() > 0 ? set_last(ncclSystemError, "ncclCommFinalize: collectives never finished")
                                  : ncclSuccess;
}

/* Withdraws rank s from the clique's unfinished splits (its child is never written). */
inline void cudasim_nccl_withdraw(const std::shared_ptr<cudasim_nccl::state> &sp)
{
    std::lock_guard<std::mutex> lk(sp->cl->mu);
    for (auto &kv : sp->cl->splits) {
        auto &x = kv.second;
        size_t me = (size_t)sp->rank;
        if (me < x.here.size() && x.here[me] && x.parent[me] == sp) {
            x.here[me] = 0, x.arrived--, x.out[me] = nullptr, x.parent[me] = nullptr;
            sp->splitting--;
        }
    }
    sp->cl->cv.notify_all();
}

inline ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    auto sp = cudasim_nccl::of(comm);
    if (!sp) return cudasim_nccl::set_last(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
    sp->dead = true;
    cudasim_nccl_withdraw(sp);
    delete comm;
    return ncclSuccess;
}

inline ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    auto sp = cudasim_nccl::of(comm);
    if (!sp) return ncclSuccess; /* NCCL: aborting NULL is allowed */
    sp->abort_flag->store(true);
    sp->dead = true;
    cudasim_nccl_withdraw(sp);
    delete comm;
    return ncclSuccess;
}

inline ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return cudasim_nccl::collective(2, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}
inline ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                                      ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return cudasim_nccl::collective(1, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}
inline ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream)
{
    return cudasim_nccl::collective(0, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}
inline ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  int root, ncclComm_t comm, cudaStream_t stream)
{
    return cudasim_nccl::collective(3, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}
inline ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                            cudaStream_t stream)
{
    return cudasim_nccl::p2p_call(4, sendbuff, nullptr, count, datatype, peer, comm, stream);
}
inline ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                            cudaStream_t stream)
{
    return cudasim_nccl::p2p_call(5, nullptr, recvbuff, count, datatype, peer, comm, stream);
}
inline ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    auto sp = cudasim_nccl::of(comm);
    if (!sp || !count) return cudasim_nccl::set_last(ncclInvalidArgument, "ncclCommCount: NULL argument");
    *count = sp->nranks;
    return ncclSuccess;
}
inline ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    auto sp = cudasim_nccl::of(comm);
    if (!sp || !rank) return cudasim_nccl::set_last(ncclInvalidArgument, "ncclCommUserRank: NULL argument");
    *rank = sp->rank;
    return ncclSuccess;
}
#endif
