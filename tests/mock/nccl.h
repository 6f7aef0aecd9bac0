/* A CPU stand-in for the NCCL entry points zero_nccl.h calls, with NCCL's documented
   behaviour where the comm's correctness depends on it (tests/test_nccl_mock.c):

   - ncclCommInitRankConfig with blocking = 0 returns ncclInProgress with the handle set;
     ncclCommGetAsyncError reads ncclInProgress for mock_nccl.init_polls polls.
   - ncclCommSplit runs the split under the parent: it returns ncclSuccess with *newcomm
     still NULL, the parent reads ncclInProgress for mock_nccl.split_polls polls (-1:
     never), and only the poll that finishes it writes the child into *newcomm (NCCL's
     async job does). ncclCommAbort of the parent ends a running split first (NCCL joins
     it); with mock_nccl.split_done_at_abort the split has just finished by then and its
     child is written, which the caller must abort too.
   - a collective sleeps mock_nccl.call_ms (a blocking call waiting on the host for a peer:
     NCCL's lazy connect), returning early with an error once the shared abort flag is up.
   - every entry point counts the threads inside the mock; a second thread entering while
     one is inside is a violation of NCCL's thread-safety rules (one thread at a time on a
     communicator, and on a parent and its splitShare child together).
   Only for that test: every function is static inline, one translation unit. */
#ifndef NCCL_H_
#define NCCL_H_
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cuda_runtime.h"

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclTimeout = 8
} ncclResult_t;
typedef enum { ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclMax = 2 } ncclRedOp_t;
#define NCCL_SPLIT_NOCOLOR -1
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct ncclConfig_v0 {
    size_t size;
    unsigned magic, version;
    int blocking, splitShare;
    const char *commName;
} ncclConfig_t;
#define NCCL_CONFIG_UNDEF_INT (-2147483647 - 1)
#define NCCL_CONFIG_INITIALIZER \
    { sizeof(ncclConfig_t), 0xcafebeefu, 22809u, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NULL }

#define MOCK_NCCL_COMMS 64
typedef struct mock_nccl_comm {
    int used, blocking, is_child, share;
    int init_polls;               /* ncclInProgress for this many more polls      */
    ncclResult_t state;           /* the asynchronous state once settled          */
    int split_running, split_polls, split_color;
    struct mock_nccl_comm **split_out;
    int aborted, finalized, destroyed;
} mock_nccl_comm;
typedef mock_nccl_comm *ncclComm_t;

static struct {
    pthread_mutex_t mu;
    int inside;          /* threads inside an entry point now        */
    int violations;      /* a second thread entered meanwhile        */
    char violation[160];
    /* knobs, reset by mock_nccl_reset */
    int init_polls, split_polls, split_done_at_abort, split_lose_child;
    ncclResult_t split_sync_result, split_async_result;
    int call_ms;
    /* observations */
    int parent_polls_in_split;
    int collectives;
    ncclComm_t last_coll_comm;
    char env_at_init[16];
    volatile int abort_flag; /* the flag a parent and its splitShare child share */
    mock_nccl_comm comms[MOCK_NCCL_COMMS];
} mock_nccl = {PTHREAD_MUTEX_INITIALIZER, 0, 0, {0}, 0, 0, 0, 0, ncclSuccess, ncclSuccess, 0, 0, 0, NULL,
               {0}, 0, {{0}}};

static inline void mock_nccl_reset(void)
{
    pthread_mutex_lock(&mock_nccl.mu);
    mock_nccl.violations = 0;
    mock_nccl.violation[0] = '\0';
    mock_nccl.init_polls = mock_nccl.split_polls = mock_nccl.split_done_at_abort = 0;
    mock_nccl.split_lose_child = 0;
    mock_nccl.split_sync_result = mock_nccl.split_async_result = ncclSuccess;
    mock_nccl.call_ms = 0;
    mock_nccl.parent_polls_in_split = mock_nccl.collectives = 0;
    mock_nccl.last_coll_comm = NULL;
    mock_nccl.env_at_init[0] = '\0';
    mock_nccl.abort_flag = 0;
    memset(mock_nccl.comms, 0, sizeof mock_nccl.comms);
    pthread_mutex_unlock(&mock_nccl.mu);
    mock_cuda.hung = 0;
}

/* Communicators neither aborted nor destroyed. */
static inline int mock_nccl_live(void)
{
    int i, n = 0;
    for (i = 0; i < MOCK_NCCL_COMMS; i++)
        n += mock_nccl.comms[i].used && !mock_nccl.comms[i].aborted && !mock_nccl.comms[i].destroyed;
    return n;
}

static inline void mock_nccl_enter(const char *fn)
{
    pthread_mutex_lock(&mock_nccl.mu);
    if (mock_nccl.inside++ > 0 && mock_nccl.violations++ == 0)
        snprintf(mock_nccl.violation, sizeof mock_nccl.violation,
                 "%s entered while another thread was inside NCCL", fn);
}
static inline void mock_nccl_unlock(void) { pthread_mutex_unlock(&mock_nccl.mu); }
static inline void mock_nccl_leave(void)
{
    pthread_mutex_lock(&mock_nccl.mu);
    mock_nccl.inside--;
    pthread_mutex_unlock(&mock_nccl.mu);
}

static inline mock_nccl_comm *mock_nccl_new(int blocking)
{
    int i;
    for (i = 0; i < MOCK_NCCL_COMMS; i++)
        if (!mock_nccl.comms[i].used) {
            memset(&mock_nccl.comms[i], 0, sizeof mock_nccl.comms[i]);
            mock_nccl.comms[i].used = 1;
            mock_nccl.comms[i].blocking = blocking;
            return &mock_nccl.comms[i];
        }
    return NULL;
}

/* Lock held. The split running under parent p finishes: its child is written. */
static inline void mock_nccl_split_finish(mock_nccl_comm *p)
{
    mock_nccl_comm *child = NULL;
    p->split_running = 0;
    p->state = mock_nccl.split_async_result;
    if (p->state == ncclSuccess && !mock_nccl.split_lose_child && p->split_color != NCCL_SPLIT_NOCOLOR) {
        child = mock_nccl_new(1);
        if (child) {
            child->is_child = 1;
            child->share = 1;
        }
    }
    if (child) *p->split_out = child;
}

static inline const char *ncclGetErrorString(ncclResult_t r)
{
    return r == ncclSuccess ? "no error" : r == ncclInProgress ? "in progress" : "mock NCCL error";
}
static inline const char *ncclGetLastError(ncclComm_t c)
{
    (void)c;
    return "";
}
static inline ncclResult_t ncclGetVersion(int *v)
{
    *v = 22809;
    return ncclSuccess;
}
static inline ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 7, sizeof *id);
    return ncclSuccess;
}

static inline ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int n, ncclUniqueId id, int rank,
                                                  ncclConfig_t *cfg)
{
    const char *env = getenv("NCCL_RUNTIME_CONNECT");
    mock_nccl_comm *c;
    (void)id;
    mock_nccl_enter("ncclCommInitRankConfig");
    snprintf(mock_nccl.env_at_init, sizeof mock_nccl.env_at_init, "%s", env ? env : "(unset)");
    c = mock_nccl_new(cfg->blocking != 0);
    if (c) c->init_polls = c->blocking ? 0 : mock_nccl.init_polls;
    *comm = c;
    mock_nccl_unlock();
    mock_nccl_leave();
    if (!c || n < 1 || rank < 0 || rank >= n) return ncclInvalidArgument;
    return c->blocking ? ncclSuccess : ncclInProgress;
}

static inline ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                         ncclConfig_t *cfg)
{
    ncclResult_t r = ncclSuccess;
    (void)key;
    mock_nccl_enter("ncclCommSplit");
    *newcomm = NULL; /* NCCL: NULL until the split has fully completed */
    if (mock_nccl.split_sync_result != ncclSuccess) {
        r = mock_nccl.split_sync_result;
    } else if (!comm || comm->aborted || comm->init_polls > 0) {
        r = ncclInvalidArgument;
    } else {
        comm->split_running = 1;
        comm->split_polls = mock_nccl.split_polls;
        comm->split_out = newcomm;
        comm->split_color = color;
        comm->state = ncclInProgress;
        comm->share = cfg && cfg->splitShare == 1;
        if (comm->blocking) mock_nccl_split_finish(comm);
    }
    mock_nccl_unlock();
    mock_nccl_leave();
    return r;
}

static inline ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state)
{
    ncclResult_t r = ncclSuccess;
    mock_nccl_enter("ncclCommGetAsyncError");
    if (!comm || comm->aborted || comm->destroyed) {
        r = ncclInvalidArgument;
    } else if (comm->init_polls > 0) {
        comm->init_polls--;
        *state = ncclInProgress;
    } else if (comm->split_running) {
        mock_nccl.parent_polls_in_split++;
        if (comm->split_polls == 0) mock_nccl_split_finish(comm);
        else if (comm->split_polls > 0) comm->split_polls--;
        *state = comm->state;
    } else {
        *state = comm->state;
    }
    mock_nccl_unlock();
    mock_nccl_leave();
    return r;
}

static inline ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    mock_nccl_enter("ncclCommAbort");
    if (comm) {
        if (comm->split_running) { /* NCCL joins the split job first */
            if (mock_nccl.split_done_at_abort) mock_nccl_split_finish(comm);
            comm->split_running = 0;
        }
        comm->aborted = 1;
        if (comm->share || comm->is_child) mock_nccl.abort_flag = 1;
        mock_cuda.hung = 0; /* NCCL's kernels see the abort flag and exit */
    }
    mock_nccl_unlock();
    mock_nccl_leave();
    return ncclSuccess;
}

static inline ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t r = ncclSuccess;
    mock_nccl_enter("ncclCommFinalize");
    if (!comm || comm->aborted || comm->finalized) r = ncclInvalidArgument;
    else comm->finalized = 1;
    mock_nccl_unlock();
    mock_nccl_leave();
    return r;
}

static inline ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    ncclResult_t r = ncclSuccess;
    mock_nccl_enter("ncclCommDestroy");
    if (!comm || comm->destroyed) r = ncclInvalidArgument;
    else comm->destroyed = 1;
    mock_nccl_unlock();
    mock_nccl_leave();
    return r;
}

static inline ncclResult_t ncclGroupStart(void)
{
    mock_nccl_enter("ncclGroupStart");
    mock_nccl_unlock();
    mock_nccl_leave();
    return ncclSuccess;
}
static inline ncclResult_t ncclGroupEnd(void)
{
    mock_nccl_enter("ncclGroupEnd");
    mock_nccl_unlock();
    mock_nccl_leave();
    return ncclSuccess;
}

/* A collective on comm: refused on NULL or an aborted communicator; otherwise it "waits
   for a peer" call_ms, ending early (with an error) when the shared abort flag rises. */
static inline ncclResult_t mock_nccl_coll(const char *fn, ncclComm_t comm)
{
    ncclResult_t r = ncclSuccess;
    int ms;
    mock_nccl_enter(fn);
    mock_nccl.collectives++;
    mock_nccl.last_coll_comm = comm;
    ms = mock_nccl.call_ms;
    if (!comm) r = ncclInvalidArgument;
    else if (comm->aborted || comm->destroyed || comm->finalized) r = ncclInvalidUsage;
    mock_nccl_unlock();
    while (r == ncclSuccess && ms > 0) {
        struct timespec ts = {0, 1000000};
        if (mock_nccl.abort_flag) {
            r = ncclInternalError; /* NCCL's connect loop saw the abort flag */
            break;
        }
        nanosleep(&ts, NULL);
        ms--;
    }
    mock_nccl_leave();
    return r;
}
static inline ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                                         ncclComm_t comm, cudaStream_t st)
{
    (void)s, (void)r, (void)n, (void)t, (void)op, (void)st;
    return mock_nccl_coll("ncclAllReduce", comm);
}
static inline ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t comm,
                                         cudaStream_t st)
{
    (void)s, (void)r, (void)n, (void)t, (void)st;
    return mock_nccl_coll("ncclAllGather", comm);
}
static inline ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t,
                                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t st)
{
    (void)s, (void)r, (void)n, (void)t, (void)op, (void)st;
    return mock_nccl_coll("ncclReduceScatter", comm);
}
static inline ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
                                    cudaStream_t st)
{
    (void)s, (void)n, (void)t, (void)peer, (void)st;
    return mock_nccl_coll("ncclSend", comm);
}
static inline ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
                                    cudaStream_t st)
{
    (void)r, (void)n, (void)t, (void)peer, (void)st;
    return mock_nccl_coll("ncclRecv", comm);
}
static inline ncclResult_t ncclCommUserRank(ncclComm_t comm, int *rank)
{
    (void)comm;
    *rank = 0;
    return ncclSuccess;
}
static inline ncclResult_t ncclCommCount(ncclComm_t comm, int *count)
{
    (void)comm;
    *count = 1;
    return ncclSuccess;
}
static inline ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root,
                                         ncclComm_t comm, cudaStream_t st)
{
    (void)s, (void)r, (void)n, (void)t, (void)root, (void)st;
    return mock_nccl_coll("ncclBroadcast", comm);
}
#endif
