/* The harness's NCCL and cuBLAS simulations tested on their own (tests/cudasim/nccl.h,
   cublas_v2.h), with ranks as threads, one simulated device each:

   - non-blocking init: ncclInProgress from the call and from ncclCommGetAsyncError until
     the last rank joins; a split on the non-blocking parent returns ncclSuccess with the
     child NULL until every rank has called it, then the child is there;
   - the four collectives at 1, 2, 3 and 4 ranks, every dtype, sum and max, in place (NCCL's
     rules) and out of place, grouped, against a host reference in the documented order
     (ranks 0..N-1, one rounding to the type per addition): bit for bit;
   - seeded defects, each caught with a message that names it: counts that differ across
     ranks (ncclInvalidUsage naming the collective, the ranks and both counts, no hang), a
     peer that never arrives (the stream stays busy until ncclCommAbort ends the wait),
     overlapping buffers that are not in place, pageable host memory as a buffer, a stream
     of another device, two
     ranks on one device without NCCL_MULTI_RANK_GPU_ENABLE;
   - cuBLAS: cublasGemmEx in the four transposes and cublasGemmStridedBatchedEx against a
     loop in the documented order, fp32 and bf16/fp16 operands, beta != 0, and an operand
     that overruns its allocation refused with a message naming the call and the operand.

   Built and run by make test-cuda-sim only (the real NCCL would hang on the mismatch). */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "cudasim.h"
#include "tests/zt.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using cudasim_num::kind;

static ncclDataType_t nccl_type(kind k)
{
    return k == cudasim_num::F32 ? ncclFloat32 : k == cudasim_num::F64 ? ncclFloat64
                                               : k == cudasim_num::F16 ? ncclFloat16
                                                                       : ncclBfloat16;
}

/* Values of different magnitudes per rank, so that sums depend on their order (the
   reference must follow the documented one to match bit for bit). */
static double val(int rank, size_t i)
{
    return std::ldexp(std::sin(1.7 * rank + 0.3 * (double)i + 0.1), (rank * 5 + (int)i) % 7 - 3);
}

/* Runs fn(rank) on n threads, each on device rank % devices. */
template <typename F>
static void ranks(int n, int devices, F fn)
{
    std::vector<std::thread> th;
    for (int r = 0; r < n; r++)
        th.emplace_back([=]() {
            cudaSetDevice(r % devices);
            fn(r);
        });
    for (auto &t : th) t.join();
}

static ncclUniqueId new_id()
{
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    return id;
}

/* A blocking comm per rank (every rank joins). */
static ncclComm_t init_blocking(const ncclUniqueId &id, int n, int r)
{
    ncclComm_t c = nullptr;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.commName = "test";
    if (ncclCommInitRankConfig(&c, n, id, r, &cfg) != ncclSuccess) return nullptr;
    return c;
}

ZT_TEST(nonblocking_init_and_split)
{
    ncclUniqueId id = new_id();
    ncclComm_t c[2] = {nullptr, nullptr}, child[2] = {nullptr, nullptr};
    ncclResult_t r0, st0 = ncclSuccess, st_after = ncclInProgress, split0, st_split = ncclSuccess, st_done = ncclInProgress;
    ncclComm_t child0_before = (ncclComm_t)1;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.splitShare = 1;
    cudaSetDevice(0);
    r0 = ncclCommInitRankConfig(&c[0], 2, id, 0, &cfg);
    ncclCommGetAsyncError(c[0], &st0);
    std::thread t([&]() {
        ncclConfig_t cf = NCCL_CONFIG_INITIALIZER;
        cf.blocking = 0;
        cf.splitShare = 1;
        cudaSetDevice(1);
        ncclCommInitRankConfig(&c[1], 2, id, 1, &cf);
    });
    t.join();
    ncclCommGetAsyncError(c[0], &st_after);
    ZT_CHECKF(r0 == ncclInProgress, "init returned %d", (int)r0);
    ZT_CHECKF(st0 == ncclInProgress, "async state %d before the peer joined", (int)st0);
    ZT_CHECKF(st_after == ncclSuccess, "async state %d after", (int)st_after);
    /* the split: rank 0 first; its child stays NULL until rank 1 calls */
    {
        ncclConfig_t cc = NCCL_CONFIG_INITIALIZER;
        cc.blocking = 1;
        split0 = ncclCommSplit(c[0], 0, 0, &child[0], &cc);
        child0_before = child[0];
        ncclCommGetAsyncError(c[0], &st_split);
        std::thread t1([&]() {
            ncclConfig_t c1 = NCCL_CONFIG_INITIALIZER;
            c1.blocking = 1;
            ncclCommSplit(c[1], 0, 1, &child[1], &c1);
        });
        t1.join();
        ncclCommGetAsyncError(c[0], &st_done);
    }
    ZT_CHECKF(split0 == ncclSuccess, "split returned %d", (int)split0);
    ZT_CHECKF(child0_before == nullptr, "the child was there before the peer split");
    ZT_CHECKF(st_split == ncclInProgress, "parent state %d during the split", (int)st_split);
    ZT_CHECKF(st_done == ncclSuccess && child[0] && child[1], "after: state %d, children %p %p", (int)st_done,
              (void *)child[0], (void *)child[1]);
    for (int r = 0; r < 2; r++) {
        if (child[r]) ncclCommDestroy(child[r]);
        ncclCommAbort(c[r]);
    }
}

/* The reference: rank order, fp32 (fp64 for f64) with a rounding to the type per step. */
static double ref_reduce(kind k, bool max, int n, size_t i, size_t base)
{
    unsigned char buf[8];
    double a;
    cudasim_num::store(buf, 0, k, val(0, base + i));
    a = cudasim_num::load(buf, 0, k);
    for (int r = 1; r < n; r++) {
        double b;
        cudasim_num::store(buf, 0, k, val(r, base + i));
        b = cudasim_num::load(buf, 0, k);
        if (k == cudasim_num::F64) a = max ? (b > a ? b : a) : a + b;
        else {
            float fa = (float)a, fb = (float)b, s = max ? (fb > fa ? fb : fa) : fa + fb;
            a = cudasim_num::round_to(k, s);
        }
    }
    return a;
}

struct coll_out {
    int bad = 0;
    char why[200] = "";
};

/* Every collective, dtype and op at n ranks, in and out of place, the last ones grouped. */
static void collectives(int n)
{
    ncclUniqueId id = new_id();
    std::vector<coll_out> out((size_t)n);
    const size_t cnt = 37;
    ranks(n, 4, [&](int r) {
        coll_out &o = out[(size_t)r];
        ncclComm_t comm = init_blocking(id, n, r);
        cudaStream_t st;
        if (!comm) {
            o.bad = 1;
            std::snprintf(o.why, sizeof o.why, "init failed");
            return;
        }
        cudaStreamCreate(&st);
        for (int ki = 0; ki < 4; ki++) {
            kind k = (kind)ki;
            size_t es = cudasim_num::kind_size(k), total = cnt * (size_t)n;
            std::vector<unsigned char> h(total * es), got(total * es);
            void *a, *b;
            cudaMalloc(&a, total * es);
            cudaMalloc(&b, total * es);
            for (int kind_ = 0; kind_ < 4; kind_++)
                for (int inplace = 0; inplace < 2; inplace++)
                    for (int mx = 0; mx < (kind_ == 1 || kind_ == 2 ? 2 : 1); mx++) {
                        const bool grouped = inplace && mx == 0;
                        size_t sendn = kind_ == 1 ? total : cnt, recvn = kind_ == 0 ? total : cnt;
                        /* the send data at its place: in place all-gather sends from b + r cnt */
                        for (size_t i = 0; i < total; i++) cudasim_num::store(h.data(), i, k, val(r, i));
                        const void *send = a;
                        void *recv = b;
                        if (inplace) {
                            if (kind_ == 0) {
                                std::vector<unsigned char> hb(total * es);
                                for (size_t i = 0; i < cnt; i++)
                                    cudasim_num::store(hb.data(), (size_t)r * cnt + i, k, val(r, i));
                                cudaMemcpy(b, hb.data(), total * es, cudaMemcpyHostToDevice);
                                send = (char *)b + (size_t)r * cnt * es;
                            } else {
                                cudaMemcpy(b, h.data(), sendn * es, cudaMemcpyHostToDevice);
                                send = b;
                                recv = kind_ == 1 ? (char *)b + (size_t)r * cnt * es : b;
                            }
                        } else {
                            cudaMemcpy(a, h.data(), sendn * es, cudaMemcpyHostToDevice);
                        }
                        ncclResult_t nr;
                        if (grouped) ncclGroupStart();
                        switch (kind_) {
                        case 0: nr = ncclAllGather(send, recv, cnt, nccl_type(k), comm, st); break;
                        case 1: nr = ncclReduceScatter(send, recv, cnt, nccl_type(k), mx ? ncclMax : ncclSum, comm, st); break;
                        case 2: nr = ncclAllReduce(send, recv, cnt, nccl_type(k), mx ? ncclMax : ncclSum, comm, st); break;
                        default: nr = ncclBroadcast(send, recv, cnt, nccl_type(k), n - 1, comm, st); break;
                        }
                        if (grouped) ncclGroupEnd();
                        cudaStreamSynchronize(st);
                        cudaMemcpy(got.data(), recv, recvn * es, cudaMemcpyDeviceToHost);
                        for (size_t i = 0; i < recvn && nr == ncclSuccess && !o.bad; i++) {
                            unsigned char want[8];
                            double w;
                            if (kind_ == 0) w = val((int)(i / cnt), i % cnt);
                            else if (kind_ == 3) w = val(n - 1, i);
                            else w = ref_reduce(k, mx != 0, n, i, kind_ == 1 ? (size_t)r * cnt : 0);
                            cudasim_num::store(want, 0, k, w);
                            if (std::memcmp(want, got.data() + i * es, es) != 0) {
                                o.bad = 1;
                                std::snprintf(o.why, sizeof o.why, "rank %d %s dtype %d inplace %d max %d element %zu",
                                              r, cudasim_nccl::kind_name(kind_), ki, inplace, mx, i);
                            }
                        }
                        if (nr != ncclSuccess && !o.bad) {
                            o.bad = 1;
                            std::snprintf(o.why, sizeof o.why, "%s returned %d", cudasim_nccl::kind_name(kind_), (int)nr);
                        }
                    }
            cudaFree(a);
            cudaFree(b);
        }
        cudaStreamDestroy(st);
        ncclCommDestroy(comm);
    });
    for (int r = 0; r < n; r++) ZT_CHECKF(!out[(size_t)r].bad, "%d ranks: %s", n, out[(size_t)r].why);
}

ZT_TEST(collectives_1) { collectives(1); }
ZT_TEST(collectives_2) { collectives(2); }
ZT_TEST(collectives_3) { collectives(3); }
ZT_TEST(collectives_4) { collectives(4); }

/* Two ranks of one comm each make call(rank, buffer of 64 floats, comm, stream), calls that do
   not match: both must end with ncclInvalidUsage (not a hang) and a message naming both
   calls (mine and theirs) and "does not match". */
static void mismatched_pair(const std::function<void(int, void *, ncclComm_t, cudaStream_t)> &call,
                            const char *mine, const char *theirs)
{
    ncclUniqueId id = new_id();
    ncclResult_t state[2] = {ncclSuccess, ncclSuccess};
    std::string msg[2];
    ranks(2, 4, [&](int r) {
        ncclComm_t comm = init_blocking(id, 2, r);
        cudaStream_t st;
        void *p;
        cudaStreamCreate(&st);
        cudaMalloc(&p, 64 * sizeof(float));
        call(r, p, comm, st);
        cudaStreamSynchronize(st); /* returns: the harness reports instead of hanging */
        ncclCommGetAsyncError(comm, &state[r]);
        msg[r] = ncclGetLastError(comm);
        cudaFree(p);
        cudaStreamDestroy(st);
        ncclCommAbort(comm);
    });
    for (int r = 0; r < 2; r++) {
        ZT_CHECKF(state[r] == ncclInvalidUsage, "rank %d: async state %d", r, (int)state[r]);
        ZT_CHECKF(msg[r].find(mine) != std::string::npos && msg[r].find(theirs) != std::string::npos &&
                      msg[r].find("does not match") != std::string::npos,
                  "rank %d: message '%s'", r, msg[r].c_str());
    }
}

ZT_TEST(mismatched_counts_named)
{
    mismatched_pair([](int r, void *p, ncclComm_t comm, cudaStream_t st) {
        ncclAllReduce(p, p, r == 0 ? 16 : 12, ncclFloat32, ncclSum, comm, st);
    }, "ncclAllReduce(count 16", "ncclAllReduce(count 12");
}

ZT_TEST(peer_never_arrives_abort_unblocks)
{
    ncclUniqueId id = new_id();
    cudaError_t busy = cudaSuccess, after = cudaErrorNotReady;
    float got = -1;
    ranks(2, 4, [&](int r) {
        ncclComm_t comm = init_blocking(id, 2, r);
        if (r == 1) { /* joins the comm, never the collective */
            std::this_thread::sleep_for(std::chrono::milliseconds(400));
            ncclCommAbort(comm);
            return;
        }
        cudaStream_t st;
        float *p, one = 1.0f;
        cudaStreamCreate(&st);
        cudaMalloc((void **)&p, sizeof(float));
        cudaMemcpy(p, &one, sizeof one, cudaMemcpyHostToDevice);
        ncclAllReduce(p, p, 1, ncclFloat32, ncclSum, comm, st);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        busy = cudaStreamQuery(st);
        ncclCommAbort(comm); /* another thread would do it: the watchdog */
        cudaStreamSynchronize(st);
        after = cudaStreamQuery(st);
        cudaMemcpy(&got, p, sizeof got, cudaMemcpyDeviceToHost);
        cudaFree(p);
        cudaStreamDestroy(st);
    });
    ZT_CHECKF(busy == cudaErrorNotReady, "the stream was not busy: %d", (int)busy);
    ZT_CHECKF(after == cudaSuccess, "after the abort: %d", (int)after);
    ZT_CHECKF(got == 1.0f, "the aborted all-reduce wrote %g", (double)got);
}

/* ncclSend / ncclRecv: an all-to-all (every rank sends block p to rank p, itself included,
   inside one group: the sends of every rank are posted before any receive waits), then a
   ring of single calls outside groups on two streams (rank r's send to r+1 on one, its
   receive from r-1 on the other), every dtype, bit for bit. */
static void p2p_exchange(int n)
{
    ncclUniqueId id = new_id();
    std::vector<std::string> bad((size_t)n);
    const size_t cnt = 19;
    ranks(n, 4, [&](int r) {
        ncclComm_t comm = init_blocking(id, n, r);
        cudaStream_t st, st2;
        if (!comm) {
            bad[(size_t)r] = "init failed";
            return;
        }
        cudaStreamCreate(&st);
        cudaStreamCreate(&st2);
        for (int ki = 0; ki < 4 && bad[(size_t)r].empty(); ki++) {
            kind k = (kind)ki;
            size_t es = cudasim_num::kind_size(k), total = cnt * (size_t)n;
            std::vector<unsigned char> h(total * es), got(total * es);
            void *a, *b;
            cudaMalloc(&a, total * es);
            cudaMalloc(&b, total * es);
            for (size_t i = 0; i < total; i++) cudasim_num::store(h.data(), i, k, val(r, i));
            cudaMemcpy(a, h.data(), total * es, cudaMemcpyHostToDevice);
            ncclResult_t nr = ncclGroupStart();
            for (int p = 0; p < n; p++) {
                if (nr == ncclSuccess) nr = ncclSend((char *)a + (size_t)p * cnt * es, cnt, nccl_type(k), p, comm, st);
                if (nr == ncclSuccess) nr = ncclRecv((char *)b + (size_t)p * cnt * es, cnt, nccl_type(k), p, comm, st);
            }
            ncclResult_t ne = ncclGroupEnd();
            cudaStreamSynchronize(st);
            cudaMemcpy(got.data(), b, total * es, cudaMemcpyDeviceToHost);
            if (nr != ncclSuccess || ne != ncclSuccess) bad[(size_t)r] = "all-to-all calls failed";
            for (size_t i = 0; i < total && bad[(size_t)r].empty(); i++) {
                unsigned char want[8]; /* block p came from rank p's block r */
                cudasim_num::store(want, 0, k, val((int)(i / cnt), (size_t)r * cnt + i % cnt));
                if (std::memcmp(want, got.data() + i * es, es) != 0)
                    bad[(size_t)r] = "all-to-all dtype " + std::to_string(ki) + " element " + std::to_string(i);
            }
            /* the ring: single calls, the receive queued on another stream than the send */
            nr = ncclRecv(b, cnt, nccl_type(k), (r + n - 1) % n, comm, st2);
            if (nr == ncclSuccess) nr = ncclSend(a, cnt, nccl_type(k), (r + 1) % n, comm, st);
            cudaStreamSynchronize(st);
            cudaStreamSynchronize(st2);
            cudaMemcpy(got.data(), b, cnt * es, cudaMemcpyDeviceToHost);
            if (nr != ncclSuccess && bad[(size_t)r].empty()) bad[(size_t)r] = "ring calls failed";
            for (size_t i = 0; i < cnt && bad[(size_t)r].empty(); i++) {
                unsigned char want[8];
                cudasim_num::store(want, 0, k, val((r + n - 1) % n, i));
                if (std::memcmp(want, got.data() + i * es, es) != 0)
                    bad[(size_t)r] = "ring dtype " + std::to_string(ki) + " element " + std::to_string(i);
            }
            cudaFree(a);
            cudaFree(b);
        }
        ncclResult_t st_ = ncclSuccess;
        ncclCommGetAsyncError(comm, &st_);
        if (st_ != ncclSuccess && bad[(size_t)r].empty()) bad[(size_t)r] = "async error " + std::to_string((int)st_);
        cudaStreamDestroy(st);
        cudaStreamDestroy(st2);
        ncclCommDestroy(comm);
    });
    for (int r = 0; r < n; r++) ZT_CHECKF(bad[(size_t)r].empty(), "%d ranks, rank %d: %s", n, r, bad[(size_t)r].c_str());
}

ZT_TEST(send_recv_1) { p2p_exchange(1); }
ZT_TEST(send_recv_3) { p2p_exchange(3); }
ZT_TEST(send_recv_4) { p2p_exchange(4); }

/* A send and its receive that disagree on the count: both ranks get ncclInvalidUsage with a
   message naming both calls (a GPU would hang or corrupt); a peer that never posts its send
   keeps the receiver's stream busy until the abort; an out-of-range peer is refused. */
ZT_TEST(send_recv_mismatch_and_missing_peer)
{
    ncclResult_t range = ncclSuccess;
    mismatched_pair([](int r, void *p, ncclComm_t comm, cudaStream_t st) {
        if (r == 0) ncclSend(p, 16, ncclFloat32, 1, comm, st);
        else ncclRecv(p, 12, ncclFloat32, 0, comm, st);
    }, "ncclSend(count 16", "ncclRecv(count 12");
    { /* after: ncclGetLastError is the process's, so not while the ranks above read it */
        ncclUniqueId id1 = new_id();
        ncclComm_t comm = init_blocking(id1, 1, 0);
        cudaStream_t st;
        void *p;
        cudaStreamCreate(&st);
        cudaMalloc(&p, 16);
        range = ncclSend(p, 1, ncclFloat32, 1, comm, st);
        cudaFree(p);
        cudaStreamDestroy(st);
        ncclCommDestroy(comm);
    }
    ZT_CHECKF(range == ncclInvalidArgument, "peer 1 of 1 rank: %d", (int)range);
    cudaError_t busy = cudaSuccess, after = cudaErrorNotReady;
    ncclUniqueId id2 = new_id();
    ranks(2, 4, [&](int r) {
        ncclComm_t comm = init_blocking(id2, 2, r);
        if (r == 1) { /* joins the comm, never sends */
            std::this_thread::sleep_for(std::chrono::milliseconds(400));
            ncclCommAbort(comm);
            return;
        }
        cudaStream_t st;
        void *p;
        cudaStreamCreate(&st);
        cudaMalloc(&p, 64);
        ncclRecv(p, 4, ncclFloat32, 1, comm, st);
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        busy = cudaStreamQuery(st);
        ncclCommAbort(comm);
        cudaStreamSynchronize(st);
        after = cudaStreamQuery(st);
        cudaFree(p);
        cudaStreamDestroy(st);
    });
    ZT_CHECKF(busy == cudaErrorNotReady, "the receiver's stream was not busy: %d", (int)busy);
    ZT_CHECKF(after == cudaSuccess, "after the abort: %d", (int)after);
}

/* ncclCommSplit's semantics, as NCCL documents them: the ranks of one color form a comm,
   ordered by key, ties by their rank in the parent; NCCL_SPLIT_NOCOLOR gives NULL; the
   child's collectives sum in the child's rank order (an all-gather shows the order). */
ZT_TEST(split_color_key_nocolor)
{
    const int n = 4;
    /* rank: color, key -> color 0 = {1 (key 0), 3 (key 1), 0 (key 5)}, color 7 = {2}; ... */
    const int color[n] = {0, 0, 7, 0}, key[n] = {5, 0, 3, 1};
    const int want_rank[n] = {2, 0, 0, 1}, want_size[n] = {3, 3, 1, 3};
    ncclUniqueId id = new_id();
    std::vector<std::string> bad((size_t)n);
    ranks(n, 4, [&](int r) {
        ncclComm_t comm = init_blocking(id, n, r), child = nullptr, none = (ncclComm_t)1, tie = nullptr;
        int cr = -1, cn = -1, tr = -1;
        ncclResult_t q = ncclCommSplit(comm, color[r], key[r], &child, nullptr);
        ncclResult_t q2 = ncclCommSplit(comm, r == 2 ? NCCL_SPLIT_NOCOLOR : 1, 0, r == 2 ? &none : &tie, nullptr);
        if (q != ncclSuccess || q2 != ncclSuccess || !child) {
            bad[(size_t)r] = "split failed";
        } else {
            ncclCommUserRank(child, &cr);
            ncclCommCount(child, &cn);
            if (cr != want_rank[r] || cn != want_size[r])
                bad[(size_t)r] = "rank " + std::to_string(cr) + " of " + std::to_string(cn);
            if (r == 2 && none != nullptr) bad[(size_t)r] = "NCCL_SPLIT_NOCOLOR gave a comm";
            if (r != 2) { /* equal keys: the parent's order, 0, 1, 3 -> 0, 1, 2 */
                ncclCommUserRank(tie, &tr);
                if (tr != (r == 3 ? 2 : r)) bad[(size_t)r] = "tie broken to rank " + std::to_string(tr);
            }
        }
        if (bad[(size_t)r].empty()) { /* all-gather each parent rank over the child */
            cudaStream_t st;
            float *d, mine = (float)r, got[4] = {-1, -1, -1, -1};
            cudaStreamCreate(&st);
            cudaMalloc((void **)&d, 5 * sizeof(float));
            cudaMemcpy(d + 4, &mine, sizeof mine, cudaMemcpyHostToDevice);
            ncclAllGather(d + 4, d, 1, ncclFloat32, child, st);
            cudaStreamSynchronize(st);
            cudaMemcpy(got, d, (size_t)cn * sizeof(float), cudaMemcpyDeviceToHost);
            for (int i = 0; i < cn; i++)
                for (int p = 0; p < n; p++)
                    if (color[p] == color[r] && want_rank[p] == i && got[i] != (float)p)
                        bad[(size_t)r] = "all-gather slot " + std::to_string(i) + " holds " + std::to_string(got[i]);
            cudaFree(d);
            cudaStreamDestroy(st);
        }
        if (child) ncclCommDestroy(child);
        if (tie) ncclCommDestroy(tie);
        ncclCommDestroy(comm);
    });
    for (int r = 0; r < n; r++) ZT_CHECKF(bad[(size_t)r].empty(), "rank %d: %s", r, bad[(size_t)r].c_str());
}

ZT_TEST(bad_buffers_refused)
{
    ncclUniqueId id = new_id();
    ncclResult_t overlap = ncclSuccess, pageable = ncclSuccess, other = ncclSuccess;
    std::string m1, m2, m3;
    ranks(1, 4, [&](int r) {
        ncclComm_t comm = init_blocking(id, 1, r);
        cudaStream_t st;
        float *p, host[8];
        cudaStreamCreate(&st);
        cudaMalloc((void **)&p, 16 * sizeof(float));
        overlap = ncclAllReduce(p, p + 1, 8, ncclFloat32, ncclSum, comm, st);
        m1 = ncclGetLastError(comm);
        pageable = ncclAllReduce(host, p, 8, ncclFloat32, ncclSum, comm, st);
        m2 = ncclGetLastError(comm);
        { /* a stream of another device */
            cudaStream_t s1;
            cudaSetDevice(1);
            cudaStreamCreate(&s1);
            cudaSetDevice(0);
            other = ncclAllReduce(p, p, 8, ncclFloat32, ncclSum, comm, s1);
            m3 = ncclGetLastError(comm);
            cudaStreamDestroy(s1);
        }
        cudaStreamSynchronize(st);
        cudaGetLastError(); /* check_access recorded its error as the last one */
        cudaFree(p);
        cudaStreamDestroy(st);
        ncclCommDestroy(comm);
    });
    ZT_CHECKF(overlap == ncclInvalidArgument && m1.find("not in place") != std::string::npos, "%d '%s'", (int)overlap,
              m1.c_str());
    ZT_CHECKF(pageable == ncclInvalidArgument && m2.find("sendbuff") != std::string::npos, "%d '%s'", (int)pageable,
              m2.c_str());
    ZT_CHECKF(other == ncclInvalidArgument && m3.find("stream is on device 1") != std::string::npos, "%d '%s'",
              (int)other, m3.c_str());
}

ZT_TEST(duplicate_gpu_needs_the_variable)
{
    ncclUniqueId id = new_id();
    ncclResult_t res[2];
    const char *old = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
    std::string keep = old ? old : "";
    unsetenv("NCCL_MULTI_RANK_GPU_ENABLE");
    ranks(2, 1, [&](int r) { /* both on device 0 */
        ncclComm_t c = nullptr;
        res[r] = ncclCommInitRankConfig(&c, 2, id, r, nullptr);
        if (c) ncclCommAbort(c);
    });
    if (old) setenv("NCCL_MULTI_RANK_GPU_ENABLE", keep.c_str(), 1);
    ZT_CHECKF(res[0] == ncclInvalidUsage && res[1] == ncclInvalidUsage, "%d %d", (int)res[0], (int)res[1]);
}

/* C = alpha op(A) op(B) + beta C in the documented order, on the host. */
static void gemm_ref(bool ta, bool tb, int m, int n, int k, float alpha, const std::vector<float> &A, int lda,
                     const std::vector<float> &B, int ldb, float beta, std::vector<float> &C, int ldc)
{
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float s = 0.0f;
            for (int p = 0; p < k; p++) {
                float x = ta ? A[(size_t)p + (size_t)i * lda] : A[(size_t)i + (size_t)p * lda];
                float y = tb ? B[(size_t)j + (size_t)p * ldb] : B[(size_t)p + (size_t)j * ldb];
                float prod = x * y;
                s = s + prod;
            }
            float o = alpha * s;
            if (beta != 0.0f) {
                float cb = beta * C[(size_t)i + (size_t)j * ldc];
                o = o + cb;
            }
            C[(size_t)i + (size_t)j * ldc] = o;
        }
}

ZT_TEST(cublas_gemm_reference)
{
    cublasHandle_t h;
    cudaStream_t st;
    const int m = 5, n = 7, k = 9, pad = 3;
    cudaSetDevice(0);
    cudaStreamCreate(&st);
    ZT_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    cublasSetStream(h, st);
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        int lda = (ta ? k : m) + pad, ldb = (tb ? n : k) + pad, ldc = m + pad;
        size_t na = (size_t)lda * (ta ? m : k), nb = (size_t)ldb * (tb ? k : n), nc = (size_t)ldc * n;
        std::vector<float> A(na), B(nb), C(nc), R(nc), got(nc);
        for (size_t i = 0; i < na; i++) A[i] = (float)std::sin(0.37 * (double)i);
        for (size_t i = 0; i < nb; i++) B[i] = (float)std::cos(0.11 * (double)i);
        for (size_t i = 0; i < nc; i++) C[i] = R[i] = (float)i * 0.01f;
        float *dA, *dB, *dC, alpha = 1.5f, beta = 0.25f;
        cudaMalloc((void **)&dA, na * 4);
        cudaMalloc((void **)&dB, nb * 4);
        cudaMalloc((void **)&dC, nc * 4);
        cudaMemcpy(dA, A.data(), na * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, B.data(), nb * 4, cudaMemcpyHostToDevice);
        cudaMemcpy(dC, C.data(), nc * 4, cudaMemcpyHostToDevice);
        cublasStatus_t s = cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
                                        &alpha, dA, CUDA_R_32F, lda, dB, CUDA_R_32F, ldb, &beta, dC, CUDA_R_32F, ldc,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cudaStreamSynchronize(st);
        cudaMemcpy(got.data(), dC, nc * 4, cudaMemcpyDeviceToHost);
        gemm_ref(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, R, ldc);
        ZT_CHECKF(s == CUBLAS_STATUS_SUCCESS && std::memcmp(got.data(), R.data(), nc * 4) == 0, "transposes %d: %s",
                  t, cublasGetStatusString(s));
        /* the same product with C one column short of its allocation: refused */
        s = cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n + 1, k, &alpha, dA,
                         CUDA_R_32F, lda, dB, CUDA_R_32F, ldb, &beta, dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT);
        ZT_CHECKF(s == CUBLAS_STATUS_INVALID_VALUE && cudasim::last_message().find("cublasGemmEx") != std::string::npos,
                  "overrun: %s, '%s'", cublasGetStatusString(s), cudasim::last_message().c_str());
        cudaGetLastError();
        cudaFree(dA);
        cudaFree(dB);
        cudaFree(dC);
    }
    { /* a stream of another device than the handle's */
        cudaStream_t s1;
        float *d, one = 1.0f;
        cudaMalloc((void **)&d, 16 * sizeof(float));
        cudaSetDevice(2);
        cudaStreamCreate(&s1);
        cudaSetDevice(0);
        cublasSetStream(h, s1);
        cublasStatus_t s = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, d, CUDA_R_32F, 4, d, CUDA_R_32F, 4,
                                        &one, d, CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        ZT_CHECKF(s == CUBLAS_STATUS_INVALID_VALUE && cudasim::last_message().find("device 2") != std::string::npos,
                  "%s '%s'", cublasGetStatusString(s), cudasim::last_message().c_str());
        cudaGetLastError();
        cudaStreamDestroy(s1);
        cudaFree(d);
    }
    cublasDestroy(h);
    cudaStreamDestroy(st);
}

ZT_TEST(cublas_strided_batched_16bit)
{
    cublasHandle_t h;
    cudaStream_t st;
    const int m = 4, n = 3, k = 6, batch = 3;
    const long long sa = m * k + 2, sb = k * n + 1, sc = m * n + 5;
    cudaSetDevice(1);
    cudaStreamCreate(&st);
    cublasCreate(&h);
    cublasSetStream(h, st);
    for (int dt = 0; dt < 2; dt++) {
        kind kk = dt ? cudasim_num::F16 : cudasim_num::BF16;
        cudaDataType_t ct = dt ? CUDA_R_16F : CUDA_R_16BF;
        size_t na = (size_t)sa * batch, nb = (size_t)sb * batch, nc = (size_t)sc * batch;
        std::vector<uint16_t> A(na), B(nb), C(nc, 0), got(nc);
        for (size_t i = 0; i < na; i++) cudasim_num::store(A.data(), i, kk, (float)((int)(i % 13) - 6) * 0.25f);
        for (size_t i = 0; i < nb; i++) cudasim_num::store(B.data(), i, kk, (float)((int)(i % 7) - 3) * 0.5f);
        void *dA, *dB, *dC;
        float one = 1.0f, zero = 0.0f;
        cudaMalloc(&dA, na * 2);
        cudaMalloc(&dB, nb * 2);
        cudaMalloc(&dC, nc * 2);
        cudaMemcpy(dA, A.data(), na * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(dB, B.data(), nb * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(dC, C.data(), nc * 2, cudaMemcpyHostToDevice);
        cublasStatus_t s = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, ct, m, sa, dB, ct,
                                                      k, sb, &zero, dC, ct, m, sc, batch, CUBLAS_COMPUTE_32F,
                                                      CUBLAS_GEMM_DEFAULT);
        cudaStreamSynchronize(st);
        cudaMemcpy(got.data(), dC, nc * 2, cudaMemcpyDeviceToHost);
        int bad = s != CUBLAS_STATUS_SUCCESS;
        for (int b = 0; b < batch && !bad; b++)
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    float acc = 0.0f;
                    for (int p = 0; p < k; p++) {
                        float x = (float)cudasim_num::load(A.data(), (size_t)(b * sa + i + p * m), kk);
                        float y = (float)cudasim_num::load(B.data(), (size_t)(b * sb + p + j * k), kk);
                        float prod = x * y;
                        acc = acc + prod;
                    }
                    uint16_t want;
                    cudasim_num::store(&want, 0, kk, acc);
                    bad |= want != got[(size_t)(b * sc + i + j * m)];
                }
        ZT_CHECKF(!bad, "dtype %d: %s", dt, cublasGetStatusString(s));
        /* a batch stride two elements too long overruns A's allocation */
        s = cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, ct, m, sa + 2, dB, ct, k, sb,
                                       &zero, dC, ct, m, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        ZT_CHECKF(s == CUBLAS_STATUS_INVALID_VALUE && cudasim::last_message().find("A") != std::string::npos,
                  "overrun: %s '%s'", cublasGetStatusString(s), cudasim::last_message().c_str());
        cudaGetLastError();
        cudaFree(dA);
        cudaFree(dB);
        cudaFree(dC);
    }
    cublasDestroy(h);
    cudaStreamDestroy(st);
}

int main(void)
{
    setenv("CUDASIM_NCCL_HANG_S", "60", 0);
    ZT_RUN(nonblocking_init_and_split);
    ZT_RUN(collectives_1);
    ZT_RUN(collectives_2);
    ZT_RUN(collectives_3);
    ZT_RUN(collectives_4);
    ZT_RUN(mismatched_counts_named);
    ZT_RUN(peer_never_arrives_abort_unblocks);
    ZT_RUN(send_recv_1);
    ZT_RUN(send_recv_3);
    ZT_RUN(send_recv_4);
    ZT_RUN(send_recv_mismatch_and_missing_peer);
    ZT_RUN(split_color_key_nocolor);
    ZT_RUN(bad_buffers_refused);
    ZT_RUN(duplicate_gpu_needs_the_variable);
    ZT_RUN(cublas_gemm_reference);
    ZT_RUN(cublas_strided_batched_16bit);
    return zt_summary();
}
