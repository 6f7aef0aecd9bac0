/* zero_nccl.h's NCCL comm on the CPU, against mocks of CUDA's and NCCL's entry points
   (tests/mock/cuda_runtime.h, tests/mock/nccl.h: the build puts tests/mock first on the
   include path). What it checks is how the comm drives NCCL, where a GPU run would only
   show a hang or a crash:

   - the split: NCCL runs ncclCommSplit under the non-blocking parent and writes the child
     handle only when it has finished; create must poll the parent until then, and return
     a comm whose collectives run on that child;
   - the split's failures: a timeout aborts the parent (which ends the split) and then any
     child NCCL returned; a synchronous or asynchronous error, or a split that finishes
     without a child, fail create; nothing is left alive;
   - NCCL's thread-safety rule: while the caller is inside a collective (blocked there
     past the timeout), the watchdog makes no NCCL call (it used to abort the parent under
     the call); the call's own thread aborts when it returns, and the comm says TIMEOUT;
   - a collective that never finishes on the GPU, with no call in flight: the watchdog
     aborts both communicators within the timeout;
   - zero_comm_split: a comm whose collectives run on its own child communicator; color < 0
     gives none; the family's one-thread rule (a sub-comm's collective blocked inside NCCL:
     neither watchdog makes an NCCL call meanwhile) and its shared abort (the parent's next
     call fails with COMM); destroy in either order; a split a peer never joins (TIMEOUT,
     the parent aborted, and the child NCCL returned at the abort too);
   - NCCL_RUNTIME_CONNECT=0 set for NCCL's init when the environment has none, and a
     value the user set kept. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#define ZERO_NCCL_IMPLEMENTATION
#include "zero_nccl.h"
#include "tests/zt.h"

#include <time.h>

#define T_MS 200 /* the comm's timeout in these tests */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static zero_result create(zero_comm **comm, int no_watchdog)
{
    static const unsigned char id[ZERO_NCCL_ID_BYTES] = {1};
    zero_nccl_desc nd;
    memset(&nd, 0, sizeof nd);
    nd.unique_id = id;
    nd.rank = 0;
    nd.world = 2;
    nd.timeout_ms = T_MS;
    nd.disable_watchdog = no_watchdog;
    return zero_nccl_create(&nd, comm);
}

/* Every communicator the mock made is aborted or destroyed, every event freed, and no two
   threads were ever inside NCCL at once. */
static void check_clean(const char *label)
{
    ZT_CHECKF(mock_nccl_live() == 0, "%s: %d communicators left alive", label, mock_nccl_live());
    ZT_CHECKF(mock_cuda.events_live == 0, "%s: %d CUDA events left", label, mock_cuda.events_live);
    ZT_CHECKF(mock_nccl.violations == 0, "%s: %s", label, mock_nccl.violation);
}

ZT_TEST(split_in_progress_then_ready)
{
    int polls;
    for (polls = 0; polls <= 6; polls += 3) {
        zero_comm *comm = NULL;
        zero_result r;
        char label[32];
        float buf[4] = {0};
        snprintf(label, sizeof label, "split polls %d", polls);
        mock_nccl_reset();
        mock_nccl.init_polls = 2;
        mock_nccl.split_polls = polls;
        r = create(&comm, 0);
        ZT_CHECKF(r == ZERO_OK, "%s: %s", label, zero_last_error());
        if (r != ZERO_OK) continue;
        /* the parent was polled until the split finished, and the comm holds its child */
        ZT_CHECKF(mock_nccl.parent_polls_in_split >= polls + 1, "%s: %d polls", label,
                  mock_nccl.parent_polls_in_split);
        ZT_CHECKF(zero_nccl_handle(comm) != NULL && ((ncclComm_t)zero_nccl_handle(comm))->is_child &&
                      ((ncclComm_t)zero_nccl_handle(comm))->blocking,
                  "%s: the handle is %p, not the blocking child", label, zero_nccl_handle(comm));
        r = comm->ops->all_reduce(comm, buf, buf, 4, ZERO_F32, ZERO_OP_SUM, NULL);
        ZT_CHECKF(r == ZERO_OK, "%s: all_reduce: %s", label, zero_last_error());
        ZT_CHECKF(mock_nccl.last_coll_comm == (ncclComm_t)zero_nccl_handle(comm), "%s: ran on %p", label,
                  (void *)mock_nccl.last_coll_comm);
        ZT_CHECKF(zero_nccl_wait(comm, 0) == ZERO_OK, "%s: %s", label, zero_last_error());
        zero_comm_destroy(comm);
        check_clean(label);
    }
}

ZT_TEST(split_timeout_aborts_parent_then_child)
{
    int at_abort;
    for (at_abort = 0; at_abort < 2; at_abort++) {
        zero_comm *comm = (zero_comm *)&comm;
        zero_result r;
        double t0, ms;
        char label[48];
        snprintf(label, sizeof label, "split done at abort %d", at_abort);
        mock_nccl_reset();
        mock_nccl.split_polls = -1; /* a peer never joins the split */
        mock_nccl.split_done_at_abort = at_abort;
        t0 = now_ms();
        r = create(&comm, 0);
        ms = now_ms() - t0;
        ZT_CHECKF(r == ZERO_ERROR_TIMEOUT && comm == NULL, "%s: %s (%s)", label, zero_result_string(r),
                  zero_last_error());
        ZT_CHECKF(ms >= 0.9 * T_MS && ms < 3.0 * T_MS, "%s: returned after %.0f ms", label, ms);
        ZT_CHECKF(strstr(zero_last_error(), "ncclCommSplit") != NULL, "%s: %s", label, zero_last_error());
        ZT_CHECKF(mock_nccl.comms[0].aborted, "%s: the parent was not aborted", label);
        check_clean(label); /* with at_abort, the child NCCL returned was aborted too */
    }
}

ZT_TEST(split_errors_fail_create)
{
    int k;
    for (k = 0; k < 3; k++) {
        zero_comm *comm = (zero_comm *)&comm;
        zero_result r, want = k == 0 ? ZERO_ERROR_INVALID_STATE : ZERO_ERROR_COMM;
        const char *label = k == 0 ? "refused at the call" : k == 1 ? "failed in the background"
                                                                   : "finished without a child";
        mock_nccl_reset();
        mock_nccl.split_polls = 2;
        if (k == 0) mock_nccl.split_sync_result = ncclInvalidUsage;
        if (k == 1) mock_nccl.split_async_result = ncclRemoteError;
        if (k == 2) mock_nccl.split_lose_child = 1;
        r = create(&comm, 0);
        ZT_CHECKF(r == want && comm == NULL, "%s: %s (%s)", label, zero_result_string(r), zero_last_error());
        ZT_CHECKF(strstr(zero_last_error(), "ncclCommSplit") != NULL, "%s: %s", label, zero_last_error());
        check_clean(label);
    }
}

/* A collective blocked inside NCCL past the timeout (a peer that never answers while NCCL
   waits on the host): no NCCL call from the watchdog meanwhile; the call's thread aborts
   when the call returns; TIMEOUT from then on. */
ZT_TEST(watchdog_never_aborts_under_a_call)
{
    zero_comm *comm = NULL;
    zero_result r;
    float buf[4] = {0};
    double t0, ms;
    mock_nccl_reset();
    ZT_CHECK(create(&comm, 0) == ZERO_OK);
    if (!comm) return;
    mock_nccl.call_ms = 3 * T_MS;
    t0 = now_ms();
    r = comm->ops->all_reduce(comm, buf, buf, 4, ZERO_F32, ZERO_OP_SUM, NULL);
    ms = now_ms() - t0;
    ZT_CHECKF(mock_nccl.violations == 0, "%s", mock_nccl.violation);
    ZT_CHECKF(r == ZERO_ERROR_TIMEOUT, "all_reduce: %s: %s", zero_result_string(r), zero_last_error());
    ZT_CHECKF(strstr(zero_last_error(), "blocked inside NCCL") != NULL, "%s", zero_last_error());
    ZT_CHECKF(ms >= 2.9 * T_MS, "the call was cut short after %.0f ms", ms);
    ZT_CHECKF(mock_nccl_live() == 0, "%d communicators alive after the call returned", mock_nccl_live());
    ZT_CHECK(zero_nccl_status(comm) == ZERO_ERROR_TIMEOUT);
    ZT_CHECK(comm->ops->all_reduce(comm, buf, buf, 4, ZERO_F32, ZERO_OP_SUM, NULL) == ZERO_ERROR_TIMEOUT);
    zero_comm_destroy(comm);
    check_clean("blocked call");
}

/* A collective that never finishes on the GPU while no thread is inside NCCL: the
   watchdog aborts both communicators within the timeout (and one watchdog period). */
ZT_TEST(watchdog_aborts_a_hung_collective)
{
    zero_comm *comm = NULL;
    zero_result r = ZERO_OK;
    float buf[4] = {0};
    double t0, ms;
    mock_nccl_reset();
    ZT_CHECK(create(&comm, 0) == ZERO_OK);
    if (!comm) return;
    mock_cuda.hung = 1;
    t0 = now_ms();
    ZT_CHECK(comm->ops->all_reduce(comm, buf, buf, 4, ZERO_F32, ZERO_OP_SUM, NULL) == ZERO_OK);
    while (now_ms() - t0 < 5.0 * T_MS && (r = zero_nccl_status(comm)) == ZERO_OK) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    ms = now_ms() - t0;
    ZT_CHECKF(r == ZERO_ERROR_TIMEOUT, "status %s: %s", zero_result_string(r), zero_last_error());
    ZT_CHECKF(ms >= 0.9 * T_MS && ms < 3.0 * T_MS, "the watchdog took %.0f ms", ms);
    ZT_CHECKF(mock_nccl_live() == 0 && mock_nccl.comms[0].aborted, "%d communicators alive",
              mock_nccl_live());
    zero_comm_destroy(comm);
    check_clean("hung collective");
}

/* zero_comm_split on the NCCL comm (the mock's world is 1: rank 0 of 1 in every child). */
ZT_TEST(split_family)
{
    int order;
    for (order = 0; order < 2; order++) {
        zero_comm *comm = NULL, *sub = NULL, *none = (zero_comm *)&order;
        zero_result r;
        float buf[4] = {0}, out[4];
        char label[64];
        snprintf(label, sizeof label, "split, destroy %s first", order ? "the parent" : "the child");
        mock_nccl_reset();
        ZT_CHECK(create(&comm, 0) == ZERO_OK);
        if (!comm) return;
        mock_nccl.split_polls = 2;
        r = zero_comm_split(comm, 3, 7, &sub);
        ZT_CHECKF(r == ZERO_OK && sub && zero_nccl_is(sub) && sub->rank == 0 && sub->world == 1, "%s: %s: %s", label,
                  zero_result_string(r), zero_last_error());
        if (!sub) {
            zero_comm_destroy(comm);
            return;
        }
        ZT_CHECK(zero_comm_split(comm, -1, 0, &none) == ZERO_OK && none == NULL);
        ZT_CHECK(zero_nccl_handle(sub) != NULL && zero_nccl_handle(sub) != zero_nccl_handle(comm));
        ZT_CHECK(sub->ops->all_reduce(sub, buf, buf, 4, ZERO_F32, ZERO_OP_SUM, NULL) == ZERO_OK);
        ZT_CHECK(mock_nccl.last_coll_comm == (ncclComm_t)zero_nccl_handle(sub));
        ZT_CHECK(comm->ops->all_to_all(comm, buf, out, 2, ZERO_F32, NULL) == ZERO_OK);
        ZT_CHECK(zero_nccl_wait(sub, 0) == ZERO_OK && zero_nccl_wait(comm, 0) == ZERO_OK);
        /* the child's call blocks inside NCCL past the timeout: both watchdogs keep out */
        mock_nccl.call_ms = 3 * T_MS;
        r = sub->ops->all_reduce(sub, buf, buf, 4, ZERO_F32, ZERO_OP_SUM, NULL);
        ZT_CHECKF(mock_nccl.violations == 0, "%s: %s", label, mock_nccl.violation);
        ZT_CHECKF(r == ZERO_ERROR_TIMEOUT, "%s: %s: %s", label, zero_result_string(r), zero_last_error());
        mock_nccl.call_ms = 0;
        r = comm->ops->all_reduce(comm, buf, buf, 4, ZERO_F32, ZERO_OP_SUM, NULL);
        ZT_CHECKF(r == ZERO_ERROR_COMM && strstr(zero_last_error(), "abort flag") != NULL, "%s: parent after: %s: %s",
                  label, zero_result_string(r), zero_last_error());
        zero_comm_destroy(order ? comm : sub);
        zero_comm_destroy(order ? sub : comm);
        check_clean(label);
    }
}

/* A split a peer never joins: TIMEOUT within the timeout, the parent aborted (which ends
   the split; the mock then writes the child, which must be aborted too), nothing left. */
ZT_TEST(split_peer_never_joins)
{
    zero_comm *comm = NULL, *sub = NULL;
    zero_result r;
    double t0, ms;
    mock_nccl_reset();
    ZT_CHECK(create(&comm, 0) == ZERO_OK);
    if (!comm) return;
    mock_nccl.split_polls = -1;
    mock_nccl.split_done_at_abort = 1;
    t0 = now_ms();
    r = zero_comm_split(comm, 0, 0, &sub);
    ms = now_ms() - t0;
    ZT_CHECKF(r == ZERO_ERROR_TIMEOUT && sub == NULL && strstr(zero_last_error(), "ncclCommSplit"), "%s: %s",
              zero_result_string(r), zero_last_error());
    ZT_CHECKF(ms >= 0.9 * T_MS && ms < 3.0 * T_MS, "the split gave up after %.0f ms", ms);
    ZT_CHECKF(mock_nccl_live() == 0, "%d communicators alive", mock_nccl_live());
    ZT_CHECK(zero_nccl_status(comm) == ZERO_ERROR_TIMEOUT);
    zero_comm_destroy(comm);
    check_clean("split never joined");
}

ZT_TEST(connect_at_init_unless_the_user_says)
{
    const char *saved = getenv("NCCL_RUNTIME_CONNECT");
    char keep[64];
    int k;
    snprintf(keep, sizeof keep, "%s", saved ? saved : "");
    for (k = 0; k < 2; k++) {
        zero_comm *comm = NULL;
        if (k == 0) unsetenv("NCCL_RUNTIME_CONNECT");
        else setenv("NCCL_RUNTIME_CONNECT", "1", 1);
        mock_nccl_reset();
        ZT_CHECK(create(&comm, 1) == ZERO_OK);
        ZT_CHECKF(strcmp(mock_nccl.env_at_init, k == 0 ? "0" : "1") == 0, "NCCL saw NCCL_RUNTIME_CONNECT=%s",
                  mock_nccl.env_at_init);
        zero_comm_destroy(comm);
        check_clean(k == 0 ? "unset" : "user's 1");
    }
    if (saved) setenv("NCCL_RUNTIME_CONNECT", keep, 1);
    else unsetenv("NCCL_RUNTIME_CONNECT");
}

int main(void)
{
    ZT_RUN(split_in_progress_then_ready);
    ZT_RUN(split_timeout_aborts_parent_then_child);
    ZT_RUN(split_errors_fail_create);
    ZT_RUN(watchdog_never_aborts_under_a_call);
    ZT_RUN(watchdog_aborts_a_hung_collective);
    ZT_RUN(split_family);
    ZT_RUN(split_peer_never_joins);
    ZT_RUN(connect_at_init_unless_the_user_says);
    return zt_summary();
}
