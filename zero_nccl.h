/* zero_nccl.h - the NCCL communicator and the launcher bootstrap for zero.h.

   WHAT IT IS
   An add-on header for zero.h (include zero.h first). It gives the engine a zero_comm whose
   collectives are NCCL's, one ZeRO rank per process and GPU, on the engine's comm stream;
   and a small TCP bootstrap that reads rank, world size and rank 0's address from the
   launcher's environment (torchrun, mpirun, srun) and hands NCCL's 128-byte unique id from
   rank 0 to every other rank.

   Do this in the one file that defines ZERO_IMPLEMENTATION, after it:

       #define ZERO_IMPLEMENTATION
       #include "zero.h"
       #define ZERO_NCCL_IMPLEMENTATION
       #include "zero_nccl.h"

   and compile that file with nvcc (or any C/C++ compiler given CUDA's and NCCL's include
   paths), linking -lnccl (nvcc links the CUDA runtime). Every other file includes
   "zero.h" and "zero_nccl.h" without the defines. The declarations need neither CUDA nor
   NCCL headers: streams and handles are void pointers.

   With ZERO_NCCL_BOOTSTRAP_ONLY defined before the include (in every file), only the
   bootstrap is declared and compiled: plain C11 + POSIX sockets, no CUDA or NCCL headers,
   so any program can pass a blob of up to ZERO_BOOTSTRAP_MAX_ID_BYTES bytes from rank 0
   to every rank (tests/test_bootstrap.c does).

   A RANK'S PROGRAM
       zero_bootstrap_desc boot;
       zero_nccl_desc nd = {0};
       zero_comm *comm;
       zero_bootstrap_env(&boot);            // rank, world, rank 0's address (see below)
       zero_nccl_select_device(&boot, NULL); // cudaSetDevice(LOCAL_RANK % visible GPUs)
       nd.bootstrap = &boot;
       zero_nccl_create(&nd, &comm);         // id over TCP, then ncclCommInitRankConfig
       ... engine_desc.comm = comm; the engine passes its comm stream to every collective ...
       zero_comm_destroy(comm);
   Every call returns a zero_result; zero_last_error() has the detail (NCCL's own message
   from ncclGetErrorString and ncclGetLastError, errno's text, the variable at fault).

   LAUNCHING (examples/train_gpu.cu is such a program)
       one GPU, one process     ./train                         no launcher variables: world 1
       torchrun, one node       torchrun --standalone --nproc-per-node=8 --no-python ./train
       torchrun, several nodes  torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d \
                                    --rdzv-endpoint=host0:29400 --no-python ./train
       OpenMPI                  mpirun -np 16 -H host0:8,host1:8 -x MASTER_ADDR=host0 ./train
                                (one node: mpirun -np 8 ./train needs no MASTER_ADDR)
       Slurm                    srun -N 2 --ntasks-per-node=8 --gpus-per-node=8 ./train
       by hand, 2 ranks         RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./train &
                                RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 ./train

   THE ENVIRONMENT (zero_bootstrap_env)
       Rank and world size: the first family present wins, so a launcher nested in another
       (torchrun or mpirun inside a Slurm job) is read correctly:
         1. RANK, WORLD_SIZE [, LOCAL_RANK, LOCAL_WORLD_SIZE]                  torchrun / by hand
         2. OMPI_COMM_WORLD_RANK, _SIZE [, _LOCAL_RANK, _LOCAL_SIZE]          OpenMPI mpirun
         3. SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS, SLURM_NPROCS)
            [, SLURM_LOCALID]                                                 Slurm srun
         none of them: a single process, rank 0 of 1 (no network at all).
       Rank 0's address: MASTER_ADDR; else, under Slurm, the first host of
       SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST, SLURM_NODELIST), where srun's block
       distribution puts task 0; else 127.0.0.1 when every rank runs on this node (local
       world = world, or one Slurm node); else INVALID_ARGUMENT (pass MASTER_ADDR).
       Port: ZERO_BOOTSTRAP_PORT; else MASTER_PORT, plus one when torchrun's agent already
       serves its store there (TORCHELASTIC_USE_AGENT_STORE=True); else, under Slurm,
       20000 + SLURM_JOB_ID % 10000; else 29500.
       Listening address (rank 0): ZERO_BOOTSTRAP_BIND ("*" = every interface, or one
       address of this host); unset: rank 0's address above when it is one of this host's
       (a loopback address only when numeric or when every rank is on this node: a host
       name that resolves to 127.0.1.1 here may be another address elsewhere), else every
       interface.
       Timeouts: ZERO_BOOTSTRAP_TIMEOUT_MS (default 300000) for the id exchange,
       ZERO_NCCL_TIMEOUT_MS (default 600000) for the communicator.
       Missing companions (RANK without WORLD_SIZE), empty, non-numeric or out-of-range
       values are ZERO_ERROR_INVALID_ARGUMENT naming the variable and its value.

   THE EXCHANGE (zero_bootstrap_exchange)
       Rank 0 listens on the port (on the listening address above; every interface is IPv6
       and IPv4; SO_REUSEADDR) and sends the id to each rank that says hello; every other
       rank connects to rank 0's address, retrying until the deadline because rank 0 may
       start late (or its name may not resolve yet); the error names the most informative
       reason seen ("connection refused: nobody is listening on HOST:PORT" rather than the
       last attempt's "timed out"). Bytes that cannot start a message (not the magic) fail
       the exchange at once, showing what arrived. The bootstrap authenticates nobody: see
       docs/nccl.md for what it trusts. Messages are framed: a 32-byte header (magic "ZER0", protocol version,
       type, world size, rank, id size, payload size, FNV-1a checksum of the payload,
       status) checked on both sides. Rank 0 returns once every rank has acknowledged the
       id. Errors: IO when the port is in use; TIMEOUT when a peer never arrives (rank 0)
       or rank 0 never answers (others); COMM for a malformed message (wrong magic,
       version, type, sizes or checksum); MISMATCH when ranks disagree (world size, a rank
       claimed twice). Rank 0 tells the peers it is connected to why it failed.

   WHAT CAN BLOCK, AND FOR HOW LONG (B = bootstrap timeout, T = the comm's timeout_ms)
       zero_bootstrap_exchange    at most B; plus, for a host name (not a numeric address),
                                  the system resolver, whose own timeout (resolv.conf) bounds
                                  each getaddrinfo() call.
       zero_nccl_create           at most B + 2 T (the id, then NCCL's own rendezvous and
                                  the split into the blocking communicator, each polled).
       zero_comm_split            at most 2 T (two splits, each polled; see below).
       all_gather, reduce_scatter, all_reduce, broadcast, all_to_all, group_end
                                  enqueue only, on the calling thread (the collectives'
                                  communicator is blocking). Every peer connection is made
                                  during create (NCCL_RUNTIME_CONNECT=0, set by create
                                  when the environment does not set it), so no collective
                                  waits for a peer on the host. A rank with 128 of its
                                  collectives unfinished on one stream waits (at most T)
                                  for the oldest before enqueuing more, so NCCL's own work
                                  queue can never fill and block without a deadline. The
                                  watchdog never aborts while a thread is inside an NCCL
                                  call (NCCL's thread-safety rules): a call blocked past T
                                  (NCCL_RUNTIME_CONNECT=1 given by the user, which lets the
                                  first collective of an algorithm connect) is reported at
                                  T and aborted when it returns, not sooner.
       barrier                    at most 2 T (waits for this rank's collectives, then a
                                  one-element all-reduce).
       zero_nccl_wait             at most its timeout.
       destroy                    at most 2 T (wait for this rank's collectives, then
                                  ncclCommFinalize of the non-blocking communicator, polled;
                                  the blocking one's finalize waits for no peer: every
                                  collective has finished and its proxy is the shared
                                  one), then it aborts.
       anything else waiting for the GPU (cudaStreamSynchronize, the engine's step)
                                  a watchdog thread per comm aborts the communicator when a
                                  collective has not finished T after it was enqueued (or
                                  NCCL reports an asynchronous error), which ends NCCL's
                                  kernels, so such waits return (with undefined buffer
                                  contents) and the next call on the comm returns the error.
       When a collective does not finish in time the communicator is aborted
       (ncclCommAbort) and this and every later call returns ZERO_ERROR_TIMEOUT (an
       asynchronous NCCL error: ZERO_ERROR_COMM); only destroy remains useful. Every rank
       that can still return does so within about T + T/20.

   SUB-COMMUNICATORS AND ALL-TO-ALL (the hierarchical modes: MiCS, hpZ, qgZ)
       zero_comm_split(comm, color, key, &sub) is ncclCommSplit of comm's non-blocking
       communicator (color < 0: NCCL_SPLIT_NOCOLOR, sub = NULL; ranks ordered by key, ties
       by their rank in comm), polled until done or T (then comm is aborted, like a
       collective a peer never joined), then a second split of the result into sub's
       blocking communicator. sub is a comm like comm: its own collectives, watchdog and
       timeout, destroyed before or after comm. Every communicator of the family shares
       NCCL's resources (splitShare: no second set of buffers) and NCCL's abort flag: one
       aborted (a timeout, zero_nccl_abort) stops the others' kernels too, so each of them
       fails at its next call with COMM saying so; and the family is one comm for NCCL's
       thread rule: use its comms from one thread at a time (the engine does).
       all_to_all is ncclSend + ncclRecv per peer inside ncclGroupStart/End (ncclAlltoAll
       exists only from NCCL 2.28; send/recv from 2.7, so every NCCL the comm supports, 2.18
       and newer, has them); it is a copy: the same bits on every backend.

   SEVERAL RANKS ON ONE GPU
       NCCL 2.30 and newer accept several ranks of one communicator on one GPU with
       NCCL_MULTI_RANK_GPU_ENABLE=1 (older NCCL rejects them: "duplicate GPU"). Use it for
       tests: ranks as threads of one process (one comm and stream each) or as processes.

   THREADS
       One thread uses a comm (and the comms split from it) at a time (NCCL's rule);
       group_start/group_end and the calls between them come from one thread. The watchdog
       shares the comm under a mutex (one for the family): to call NCCL yourself on
       zero_nccl_handle(), hold zero_nccl_lock() around those calls.

   LICENSE: MIT, see the end of zero.h.
*/
#ifndef ZERO_H
#error "zero_nccl.h: include zero.h before zero_nccl.h"
#endif

#ifndef ZERO_NCCL_H
#define ZERO_NCCL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================================
   Bootstrap: launcher environment and the TCP exchange of an id (plain C, POSIX).
   ====================================================================================== */

#define ZERO_BOOTSTRAP_ADDR_MAX 256            /* bytes of a host name, with its NUL     */
#define ZERO_BOOTSTRAP_MAX_ID_BYTES 4096       /* largest blob the exchange carries      */
#define ZERO_BOOTSTRAP_MAX_WORLD (1 << 24)
#define ZERO_BOOTSTRAP_DEFAULT_PORT 29500
#define ZERO_BOOTSTRAP_DEFAULT_TIMEOUT_MS 300000

/* Where zero_bootstrap_env() found rank and world size. */
typedef enum zero_launcher {
    ZERO_LAUNCHER_NONE = 0,     /* no launcher variables: a single process, rank 0 of 1 */
    ZERO_LAUNCHER_TORCHRUN = 1, /* RANK / WORLD_SIZE (torchrun, or set by hand)         */
    ZERO_LAUNCHER_OPENMPI = 2,  /* OMPI_COMM_WORLD_*                                    */
    ZERO_LAUNCHER_SLURM = 3     /* SLURM_PROCID / SLURM_NTASKS                          */
} zero_launcher;

/* One rank's view of the job. Filled by zero_bootstrap_env(), or by hand. */
typedef struct zero_bootstrap_desc {
    int rank;                           /* 0 .. world-1                                     */
    int world;                          /* ranks in the job, >= 1                           */
    int local_rank;                     /* rank on this node; -1 when the launcher is silent */
    int local_world;                    /* ranks on this node; -1 when unknown              */
    char addr[ZERO_BOOTSTRAP_ADDR_MAX]; /* rank 0's host name or numeric address           */
    int port;                           /* the TCP port rank 0 listens on, 1..65535 (0 on
                                           rank 0 = any free port, zero_bootstrap_listen)   */
    int timeout_ms;                     /* for the whole exchange; 0 = the default           */
    zero_launcher launcher;             /* informational                                    */
    char bind_addr[ZERO_BOOTSTRAP_ADDR_MAX]; /* rank 0: the local address to listen on.
                                           "" = the default: addr when it is an address of
                                           this host (a loopback one only when given as a
                                           numeric address or when every rank is on this
                                           node), else every interface; "*" = every
                                           interface; else a host name or numeric address
                                           of this host (ZERO_BOOTSTRAP_BIND)               */
} zero_bootstrap_desc;

/* Looks a variable up: its value, or NULL when unset. */
typedef const char *(*zero_bootstrap_getenv_fn)(const char *name, void *user);

/* Fills *out from the process environment by the rules in the manual above. *out is
   written only on success. Errors: INVALID_ARGUMENT naming the variable and value. */
ZERODEF zero_result zero_bootstrap_env(zero_bootstrap_desc *out);

/* The same rules over any lookup (tests, a config file). */
ZERODEF zero_result zero_bootstrap_env_from(zero_bootstrap_getenv_fn get, void *user,
                                            zero_bootstrap_desc *out);

/* "none", "torchrun", "openmpi", "slurm" or "?" */
ZERODEF const char *zero_launcher_name(zero_launcher launcher);

/* Rank 0 sends id_bytes bytes at id to every rank; every other rank receives them into
   id (written only on success). world 1 returns at once. Blocks at most desc->timeout_ms
   (see the manual for the name-lookup caveat). Every rank passes the same id_bytes
   (1..ZERO_BOOTSTRAP_MAX_ID_BYTES) and world. Errors: INVALID_ARGUMENT; IO (port in use,
   socket failures, errno's text kept); TIMEOUT; COMM (malformed message); MISMATCH
   (ranks disagree). */
ZERODEF zero_result zero_bootstrap_exchange(const zero_bootstrap_desc *desc, void *id,
                                            size_t id_bytes);

/* Rank 0's side in two steps, for when the port must be known before the peers start
   (port 0 = an ephemeral port, as tests do): listen, read the port, start the peers,
   serve. The server holds one listening socket; it may be inherited across fork(). */
typedef struct zero_bootstrap_server zero_bootstrap_server;

/* Listens on desc->port (0 = any free port) for desc->world - 1 peers, on the address
   desc->bind_addr chooses (see zero_bootstrap_desc). Errors: INVALID_ARGUMENT; IO (port in
   use, with a hint; a bind_addr that is not an address of this host); OUT_OF_MEMORY. */
ZERODEF zero_result zero_bootstrap_listen(const zero_bootstrap_desc *desc,
                                          zero_bootstrap_server **out);

/* The port the server listens on (the ephemeral one when asked for port 0); -1 for NULL. */
ZERODEF int zero_bootstrap_server_port(const zero_bootstrap_server *server);

/* The numeric address the server listens on, "*" for every interface; "" for NULL. Owned
   by the server. */
ZERODEF const char *zero_bootstrap_server_addr(const zero_bootstrap_server *server);

/* Sends id to every peer, each once, and returns when all have acknowledged it, or at
   the desc's timeout counted from this call. Errors as zero_bootstrap_exchange. */
ZERODEF zero_result zero_bootstrap_serve(zero_bootstrap_server *server, const void *id,
                                         size_t id_bytes);

/* Closes the listening socket and frees the server. NULL is ignored. */
ZERODEF void zero_bootstrap_server_close(zero_bootstrap_server *server);

#ifndef ZERO_NCCL_BOOTSTRAP_ONLY
/* ======================================================================================
   NCCL comm: zero_comm_ops over one NCCL communicator (blocking collectives, watched).
   ====================================================================================== */

#define ZERO_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
#define ZERO_NCCL_DEFAULT_TIMEOUT_MS 600000
/* NCCL_VERSION(2,30,0): several ranks of one communicator on one GPU. */
#define ZERO_NCCL_MULTI_RANK_GPU_VERSION 23000

/* Zero-initialised = defaults. The comm uses the CUDA device current on the calling
   thread when it is created (zero_nccl_select_device() picks one by local rank). */
typedef struct zero_nccl_desc {
    const void *unique_id;                /* ZERO_NCCL_ID_BYTES from zero_nccl_unique_id()
                                             on rank 0, shared by the caller (MPI, a file,
                                             threads); NULL = exchange it over TCP          */
    int rank, world;                      /* required with unique_id; otherwise 0, or equal
                                             to the bootstrap's                             */
    const zero_bootstrap_desc *bootstrap; /* without unique_id; NULL = zero_bootstrap_env() */
    int timeout_ms;                       /* see "what can block"; 0 = ZERO_NCCL_TIMEOUT_MS
                                             or ZERO_NCCL_DEFAULT_TIMEOUT_MS               */
    int disable_watchdog;                 /* 1 = no watchdog thread: only this comm's own
                                             calls enforce the timeout                      */
    const char *name;                     /* NCCL's commName (logs); NULL = none            */
    zero_allocator allocator;             /* host memory of the comm; NULL = ZERO_MALLOC    */
} zero_nccl_desc;

/* Creates this rank's comm: gets the id (unique_id, or ncclGetUniqueId on rank 0 and the
   TCP exchange), then ncclCommInitRankConfig with blocking = 0, polled until ready or the
   timeout, then ncclCommSplit into a blocking communicator sharing its resources
   (splitShare): the split runs in the background under the non-blocking parent, which is
   polled until it finishes (on timeout the parent is aborted, which ends the split, and
   then the child if NCCL returned one); the collectives run on the child (a non-blocking
   one would start a thread per collective). Sets NCCL_RUNTIME_CONNECT=0 in the
   environment when it is unset, before the first NCCL call, so that NCCL makes every peer
   connection inside this deadline-bounded init (NCCL >= 2.22; older NCCL always does;
   NCCL reads the variable once per process, at its first communicator). COLLECTIVE over
   the job's processes. The comm also holds
   one CUDA stream, a 256-byte device scratch buffer (barrier) and 2048 CUDA events (128 per
   stream it watches); they are not counted by the engine. Errors: INVALID_ARGUMENT; the bootstrap's; DEVICE (CUDA); COMM, INVALID_STATE,
   TIMEOUT from NCCL, with NCCL's message. *out is NULL on error. */
ZERODEF zero_result zero_nccl_create(const zero_nccl_desc *desc, zero_comm **out);

/* Writes a fresh NCCL unique id (ZERO_NCCL_ID_BYTES) to id: rank 0's part of sharing it
   yourself. Errors: INVALID_ARGUMENT, COMM. */
ZERODEF zero_result zero_nccl_unique_id(void *id);

/* Makes the GPU for this rank current: local_rank (rank when the launcher gave none)
   modulo the visible GPUs. boot NULL = device 0. out_device may be NULL. Errors:
   UNSUPPORTED when no GPU is visible; DEVICE. */
ZERODEF zero_result zero_nccl_select_device(const zero_bootstrap_desc *boot, int *out_device);

/* The NCCL library's version at run time (NCCL_VERSION_CODE encoding, 22809 for 2.28.9);
   0 if it cannot be read. Multi-rank GPUs need >= ZERO_NCCL_MULTI_RANK_GPU_VERSION. */
ZERODEF int zero_nccl_version(void);

/* 1 when comm was made by zero_nccl_create() or split from such a comm (zero_comm_split). */
ZERODEF int zero_nccl_is(const zero_comm *comm);

/* Waits until every collective this rank has enqueued on this comm has finished on the
   GPU, polling (cudaEventQuery and ncclCommGetAsyncError) for at most timeout_ms (0 = the
   comm's timeout). On an asynchronous NCCL error, or when time runs out, the communicator
   is aborted and COMM or TIMEOUT returned (then and by every later call). */
ZERODEF zero_result zero_nccl_wait(zero_comm *comm, int timeout_ms);

/* ZERO_OK while the comm is healthy, else the error that broke it (with its message).
   Polls NCCL's asynchronous error state without waiting. */
ZERODEF zero_result zero_nccl_status(zero_comm *comm);

/* Aborts the communicator now (another rank reported a failure): NCCL's kernels stop,
   this and every later call returns ZERO_ERROR_COMM. Any thread (not a signal handler). */
ZERODEF zero_result zero_nccl_abort(zero_comm *comm);

/* The ncclComm_t of the collectives, as a pointer (NULL once aborted): a blocking
   communicator (split from the non-blocking one of the init, sharing its resources). Hold
   zero_nccl_lock() around your own NCCL calls on it while the watchdog runs (the watchdog
   cannot abort while you hold it, so a call of yours that hangs is not bounded by the
   timeout); do not destroy it. */
ZERODEF void *zero_nccl_handle(zero_comm *comm);
ZERODEF void zero_nccl_lock(zero_comm *comm);
ZERODEF void zero_nccl_unlock(zero_comm *comm);
#endif /* ZERO_NCCL_BOOTSTRAP_ONLY */

#ifdef __cplusplus
}
#endif

#endif /* ZERO_NCCL_H */

/* ======================================================================================
   IMPLEMENTATION
   ====================================================================================== */
#if defined(ZERO_NCCL_IMPLEMENTATION) && !defined(ZERO_NCCL_IMPLEMENTATION_DONE)
#define ZERO_NCCL_IMPLEMENTATION_DONE

#ifndef ZERO_IMPLEMENTATION_DONE
#error "zero_nccl.h: define ZERO_NCCL_IMPLEMENTATION in the file that defines ZERO_IMPLEMENTATION, after including zero.h"
#endif

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#ifndef ZERO_NCCL_BOOTSTRAP_ONLY
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- time ---- */

static int64_t zero_nccl__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail with a valid clock and pointer */
    return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

static int64_t zero_nccl__deadline(int timeout_ms)
{
    return zero_nccl__now_ns() + (int64_t)timeout_ms * 1000000;
}

/* Milliseconds left until deadline, rounded up, for poll(); 0 once it has passed. */
static int zero_nccl__left_ms(int64_t deadline)
{
    int64_t left = deadline - zero_nccl__now_ns();
    if (left <= 0) return 0;
    left = (left + 999999) / 1000000;
    return left > INT_MAX ? INT_MAX : (int)left;
}

static void zero_nccl__sleep_ns(int64_t ns)
{
    struct timespec ts, rem;
    if (ns <= 0) return;
    ts.tv_sec = (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    while (nanosleep(&ts, &rem) != 0 && errno == EINTR) ts = rem;
}

/* ---- the launcher's environment ---- */

ZERODEF const char *zero_launcher_name(zero_launcher launcher)
{
    switch (launcher) {
    case ZERO_LAUNCHER_NONE: return "none";
    case ZERO_LAUNCHER_TORCHRUN: return "torchrun";
    case ZERO_LAUNCHER_OPENMPI: return "openmpi";
    case ZERO_LAUNCHER_SLURM: return "slurm";
    }
    return "?";
}

static const char *zero_nccl__getenv(const char *name, void *user)
{
    (void)user;
    return getenv(name);
}

/* Reads variable 'name' as an integer in [lo, hi]. *present = 0 (and ZERO_OK) when unset.
   Set but empty, not a whole integer, or out of range: INVALID_ARGUMENT. */
static zero_result zero_nccl__env_long(zero_bootstrap_getenv_fn get, void *user, const char *name,
                                       long lo, long hi, long *out, int *present)
{
    const char *v = get(name, user);
    char *end = NULL;
    long x;
    *present = 0;
    if (!v) return ZERO_OK;
    *present = 1;
    if (!*v)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_bootstrap_env: %s is set but empty", name);
    errno = 0;
    x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || v[0] == ' ' || v[0] == '\t')
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_bootstrap_env: %s=\"%.64s\" is not an integer", name, v);
    if (errno == ERANGE || x < lo || x > hi)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_bootstrap_env: %s=%.64s is out of range [%ld, %ld]", name, v, lo,
                          hi);
    *out = x;
    return ZERO_OK;
}

static zero_result zero_nccl__env_int(zero_bootstrap_getenv_fn get, void *user, const char *name,
                                      long lo, long hi, int *out, int *present)
{
    long x = 0;
    zero_result r = zero_nccl__env_long(get, user, name, lo, hi, &x, present);
    if (r == ZERO_OK && *present) *out = (int)x;
    return r;
}

/* The first host of a Slurm node list: "gpu[007-010,012],cpu1" -> "gpu007",
   "rack[1-2]-n[01-04]" -> "rack1-n01", "a,b" -> "a". 0 on success, -1 when malformed or
   longer than out_size - 1. */
static int zero_nccl__first_host(const char *list, char *out, size_t out_size)
{
    const char *p = list;
    size_t o = 0;
    if (!p || out_size < 2) return -1;
    while (*p && *p != ',') {
        if (*p == '[') {
            p++;
            if (*p == ']' || *p == ',' || *p == '-' || !*p) return -1;
            while (*p && *p != '-' && *p != ',' && *p != ']') {
                if (o + 1 >= out_size) return -1;
                out[o++] = *p++;
            }
            while (*p && *p != ']') p++;
            if (*p != ']') return -1;
            p++;
        } else if (*p == ']') {
            return -1;
        } else {
            if (o + 1 >= out_size) return -1;
            out[o++] = *p++;
        }
    }
    out[o] = '\0';
    return o ? 0 : -1;
}

/* "True", "true", "1", "yes" */
static int zero_nccl__truthy(const char *v)
{
    if (!v) return 0;
    return strcmp(v, "1") == 0 || strcmp(v, "True") == 0 || strcmp(v, "true") == 0 ||
           strcmp(v, "TRUE") == 0 || strcmp(v, "yes") == 0;
}

ZERODEF zero_result zero_bootstrap_env_from(zero_bootstrap_getenv_fn get, void *user,
                                            zero_bootstrap_desc *out)
{
    zero_bootstrap_desc d;
    zero_result r;
    int have_rank = 0, have_world = 0, have = 0, single_node = 0;
    long port = 0, job = 0;
    const char *rank_var = "RANK", *world_var = "WORLD_SIZE";
    const char *v;

    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_bootstrap_env: out is NULL");
    if (!get) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_bootstrap_env: get is NULL");
    memset(&d, 0, sizeof d);
    d.rank = 0;
    d.world = 1;
    d.local_rank = -1;
    d.local_world = -1;
    d.launcher = ZERO_LAUNCHER_NONE;

    /* Rank and world size: the first family present wins. */
    if (get("RANK", user)) {
        d.launcher = ZERO_LAUNCHER_TORCHRUN;
    } else if (get("OMPI_COMM_WORLD_RANK", user)) {
        d.launcher = ZERO_LAUNCHER_OPENMPI;
        rank_var = "OMPI_COMM_WORLD_RANK";
        world_var = "OMPI_COMM_WORLD_SIZE";
    } else if (get("SLURM_PROCID", user)) {
        d.launcher = ZERO_LAUNCHER_SLURM;
        rank_var = "SLURM_PROCID";
        world_var = get("SLURM_STEP_NUM_TASKS", user) ? "SLURM_STEP_NUM_TASKS"
                    : get("SLURM_NTASKS", user)       ? "SLURM_NTASKS"
                                                      : "SLURM_NPROCS";
    } else if (get("WORLD_SIZE", user)) {
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_bootstrap_env: WORLD_SIZE is set but RANK is not");
    }

    if (d.launcher != ZERO_LAUNCHER_NONE) {
        long lrank = 0, lworld = 0;
        r = zero_nccl__env_long(get, user, world_var, 1, ZERO_BOOTSTRAP_MAX_WORLD, &lworld,
                                &have_world);
        if (r != ZERO_OK) return r;
        if (!have_world)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_bootstrap_env: %s is set but %s is not", rank_var,
                              d.launcher == ZERO_LAUNCHER_SLURM
                                  ? "SLURM_STEP_NUM_TASKS, SLURM_NTASKS or SLURM_NPROCS"
                                  : world_var);
        r = zero_nccl__env_long(get, user, rank_var, 0, lworld - 1, &lrank, &have_rank);
        if (r != ZERO_OK) return r;
        d.rank = (int)lrank;
        d.world = (int)lworld;
    }

    /* Local rank and local world size, when the launcher says. */
    switch (d.launcher) {
    case ZERO_LAUNCHER_TORCHRUN:
        r = zero_nccl__env_int(get, user, "LOCAL_WORLD_SIZE", 1, d.world, &d.local_world, &have);
        if (r != ZERO_OK) return r;
        r = zero_nccl__env_int(get, user, "LOCAL_RANK", 0,
                               d.local_world > 0 ? d.local_world - 1 : d.world - 1,
                               &d.local_rank, &have);
        if (r != ZERO_OK) return r;
        break;
    case ZERO_LAUNCHER_OPENMPI:
        r = zero_nccl__env_int(get, user, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, d.world, &d.local_world,
                               &have);
        if (r != ZERO_OK) return r;
        r = zero_nccl__env_int(get, user, "OMPI_COMM_WORLD_LOCAL_RANK", 0,
                               d.local_world > 0 ? d.local_world - 1 : d.world - 1,
                               &d.local_rank, &have);
        if (r != ZERO_OK) return r;
        break;
    case ZERO_LAUNCHER_SLURM: {
        int nodes = 0;
        r = zero_nccl__env_int(get, user, "SLURM_LOCALID", 0, d.world - 1, &d.local_rank, &have);
        if (r != ZERO_OK) return r;
        r = zero_nccl__env_int(get, user,
                               get("SLURM_STEP_NUM_NODES", user) ? "SLURM_STEP_NUM_NODES"
                                                                 : "SLURM_NNODES",
                               1, ZERO_BOOTSTRAP_MAX_WORLD, &nodes, &have);
        if (r != ZERO_OK) return r;
        if (have && nodes == 1) d.local_world = d.world;
        break;
    }
    case ZERO_LAUNCHER_NONE:
        d.local_rank = 0;
        d.local_world = 1;
        break;
    }
    single_node = d.world == 1 || (d.local_world > 0 && d.local_world == d.world);

    /* Rank 0's address. */
    v = get("MASTER_ADDR", user);
    if (v) {
        if (!*v)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_bootstrap_env: MASTER_ADDR is set but empty");
        if (strlen(v) >= sizeof d.addr)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_bootstrap_env: MASTER_ADDR is longer than %d bytes",
                              ZERO_BOOTSTRAP_ADDR_MAX - 1);
        memcpy(d.addr, v, strlen(v) + 1);
    } else if (d.launcher == ZERO_LAUNCHER_SLURM &&
               ((v = get("SLURM_STEP_NODELIST", user)) != NULL ||
                (v = get("SLURM_JOB_NODELIST", user)) != NULL ||
                (v = get("SLURM_NODELIST", user)) != NULL)) {
        if (zero_nccl__first_host(v, d.addr, sizeof d.addr) != 0)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_bootstrap_env: cannot read the first host of the Slurm node "
                              "list \"%.128s\"; set MASTER_ADDR",
                              v);
    } else if (single_node) {
        memcpy(d.addr, "127.0.0.1", sizeof "127.0.0.1");
    } else {
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_bootstrap_env: MASTER_ADDR is not set and the %d ranks are not "
                          "all on this node (%s launcher): set MASTER_ADDR to rank 0's host%s",
                          d.world, zero_launcher_name(d.launcher),
                          d.launcher == ZERO_LAUNCHER_OPENMPI ? " (mpirun -x MASTER_ADDR=host)"
                                                              : "");
    }

    /* Port. */
    r = zero_nccl__env_long(get, user, "ZERO_BOOTSTRAP_PORT", 1, 65535, &port, &have);
    if (r != ZERO_OK) return r;
    if (!have) {
        r = zero_nccl__env_long(get, user, "MASTER_PORT", 1, 65535, &port, &have);
        if (r != ZERO_OK) return r;
        if (have && zero_nccl__truthy(get("TORCHELASTIC_USE_AGENT_STORE", user))) {
            /* torchrun's agent serves its TCPStore on MASTER_PORT itself */
            if (port == 65535)
                return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                                  "zero_bootstrap_env: MASTER_PORT=65535 leaves no port above it "
                                  "for the bootstrap; set ZERO_BOOTSTRAP_PORT");
            port += 1;
        }
    }
    if (!have && d.launcher == ZERO_LAUNCHER_SLURM) {
        r = zero_nccl__env_long(get, user, "SLURM_JOB_ID", 0, LONG_MAX, &job, &have);
        if (r != ZERO_OK) return r;
        if (have) port = 20000 + job % 10000;
    }
    if (!have) port = ZERO_BOOTSTRAP_DEFAULT_PORT;
    d.port = (int)port;

    /* Listening address (rank 0). */
    v = get("ZERO_BOOTSTRAP_BIND", user);
    if (v) {
        if (v[0] == '\0')
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_bootstrap_env: ZERO_BOOTSTRAP_BIND is set but empty (\"*\" "
                              "= every interface)");
        if (strlen(v) >= sizeof d.bind_addr)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_bootstrap_env: ZERO_BOOTSTRAP_BIND is longer than %d bytes",
                              ZERO_BOOTSTRAP_ADDR_MAX - 1);
        memcpy(d.bind_addr, v, strlen(v) + 1);
    }

    /* Timeout. */
    r = zero_nccl__env_int(get, user, "ZERO_BOOTSTRAP_TIMEOUT_MS", 1, INT_MAX, &d.timeout_ms,
                           &have);
    if (r != ZERO_OK) return r;
    if (!have) d.timeout_ms = ZERO_BOOTSTRAP_DEFAULT_TIMEOUT_MS;

    *out = d;
    return ZERO_OK;
}

ZERODEF zero_result zero_bootstrap_env(zero_bootstrap_desc *out)
{
    return zero_bootstrap_env_from(zero_nccl__getenv, NULL, out);
}

/* ---- the wire format ---- */

#define ZERO_NCCL__MAGIC 0x5A455230u /* "ZER0" */
#define ZERO_NCCL__PROTOCOL 1u
#define ZERO_NCCL__HDR 32
#define ZERO_NCCL__MAX_ERROR_TEXT 512
#define ZERO_NCCL__MAX_CONNS 256 /* connections rank 0 holds open at once */

enum { ZERO_NCCL__HELLO = 1, ZERO_NCCL__ID = 2, ZERO_NCCL__ACK = 3, ZERO_NCCL__ERROR = 4 };

/* Header, big-endian: magic u32 | version u16 | type u16 | world u32 | rank u32 |
   id_bytes u32 | payload_bytes u32 | checksum u32 (FNV-1a of the payload) | status i32.
   rank is the sender's (0 in rank 0's messages); status is a zero_result in ERROR. */
typedef struct zero_nccl__hdr {
    uint32_t magic;
    uint32_t version;
    uint32_t type;
    uint32_t world;
    uint32_t rank;
    uint32_t id_bytes;
    uint32_t payload_bytes;
    uint32_t checksum;
    int32_t status;
} zero_nccl__hdr;

static void zero_nccl__put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static uint32_t zero_nccl__get32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static uint32_t zero_nccl__fnv1a(const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    uint32_t h = 2166136261u;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= p[i];
        h *= 16777619u;
    }
    return h;
}

static void zero_nccl__encode(const zero_nccl__hdr *h, unsigned char *out)
{
    zero_nccl__put32(out + 0, h->magic);
    out[4] = (unsigned char)(h->version >> 8);
    out[5] = (unsigned char)h->version;
    out[6] = (unsigned char)(h->type >> 8);
    out[7] = (unsigned char)h->type;
    zero_nccl__put32(out + 8, h->world);
    zero_nccl__put32(out + 12, h->rank);
    zero_nccl__put32(out + 16, h->id_bytes);
    zero_nccl__put32(out + 20, h->payload_bytes);
    zero_nccl__put32(out + 24, h->checksum);
    zero_nccl__put32(out + 28, (uint32_t)h->status);
}

static void zero_nccl__decode(const unsigned char *in, zero_nccl__hdr *h)
{
    h->magic = zero_nccl__get32(in + 0);
    h->version = ((uint32_t)in[4] << 8) | in[5];
    h->type = ((uint32_t)in[6] << 8) | in[7];
    h->world = zero_nccl__get32(in + 8);
    h->rank = zero_nccl__get32(in + 12);
    h->id_bytes = zero_nccl__get32(in + 16);
    h->payload_bytes = zero_nccl__get32(in + 20);
    h->checksum = zero_nccl__get32(in + 24);
    h->status = (int32_t)zero_nccl__get32(in + 28);
}

static void zero_nccl__make_hdr(zero_nccl__hdr *h, unsigned type, int world, int rank,
                                size_t id_bytes, const void *payload, size_t payload_bytes,
                                zero_result status)
{
    h->magic = ZERO_NCCL__MAGIC;
    h->version = ZERO_NCCL__PROTOCOL;
    h->type = type;
    h->world = (uint32_t)world;
    h->rank = (uint32_t)rank;
    h->id_bytes = (uint32_t)id_bytes;
    h->payload_bytes = (uint32_t)payload_bytes;
    h->checksum = zero_nccl__fnv1a(payload, payload_bytes);
    h->status = (int32_t)status;
}

static const char *zero_nccl__type_name(uint32_t type)
{
    switch (type) {
    case ZERO_NCCL__HELLO: return "hello";
    case ZERO_NCCL__ID: return "id";
    case ZERO_NCCL__ACK: return "ack";
    case ZERO_NCCL__ERROR: return "error";
    }
    return "unknown";
}

/* Checks the fields every message shares: magic and version (COMM), world (MISMATCH),
   id size (COMM). 'who' names the side reporting, 'from' the sender. */
static zero_result zero_nccl__check_common(const zero_nccl__hdr *h, int world, size_t id_bytes,
                                           const char *who, const char *from)
{
    if (h->magic != ZERO_NCCL__MAGIC)
        return zero__fail(ZERO_ERROR_COMM,
                          "%s: malformed message from %s: magic 0x%08x, expected 0x%08x: not a "
                          "zero bootstrap peer (another program on this port?)",
                          who, from, (unsigned)h->magic, (unsigned)ZERO_NCCL__MAGIC);
    if (h->version != ZERO_NCCL__PROTOCOL)
        return zero__fail(ZERO_ERROR_COMM,
                          "%s: message from %s speaks bootstrap protocol %u, this build speaks %u "
                          "(mixed builds of zero_nccl.h?)",
                          who, from, (unsigned)h->version, (unsigned)ZERO_NCCL__PROTOCOL);
    if (h->type == ZERO_NCCL__ERROR) return ZERO_OK; /* the caller reads the reason */
    if (h->world != (uint32_t)world)
        return zero__fail(ZERO_ERROR_MISMATCH,
                          "%s: %s says the world size is %u, this rank has %d: the ranks were "
                          "launched with different world sizes",
                          who, from, (unsigned)h->world, world);
    if (h->id_bytes != (uint32_t)id_bytes)
        return zero__fail(ZERO_ERROR_COMM,
                          "%s: malformed message from %s: id of %u bytes, expected %u", who, from,
                          (unsigned)h->id_bytes, (unsigned)id_bytes);
    return ZERO_OK;
}

/* Whether the first n bytes received can start a message: they must be the magic's. */
static int zero_nccl__prefix_ok(const unsigned char *in, size_t n)
{
    size_t i;
    for (i = 0; i < n && i < 4; i++)
        if (in[i] != (unsigned char)(ZERO_NCCL__MAGIC >> (24 - 8 * i))) return 0;
    return 1;
}

/* Bytes as a quoted C string (printable ASCII as is, the rest escaped), at most 32. */
static void zero_nccl__show_bytes(const unsigned char *in, size_t n, char *out, size_t size)
{
    size_t i, o = 0;
    if (size < 8) return;
    out[o++] = '"';
    for (i = 0; i < n && i < 32 && o + 6 < size; i++) {
        unsigned char c = in[i];
        if (c == '\r' || c == '\n' || c == '\t') {
            out[o++] = '\\';
            out[o++] = c == '\r' ? 'r' : c == '\n' ? 'n' : 't';
        } else if (c >= 32 && c < 127 && c != '"' && c != '\\') {
            out[o++] = (char)c;
        } else {
            o += (size_t)snprintf(out + o, size - o, "\\x%02x", c);
        }
    }
    out[o++] = '"';
    out[o] = '\0';
    if (n > 32 && o + 4 < size) snprintf(out + o, size - o, "...");
}

/* ---- sockets ---- */

static void zero_nccl__close(int fd)
{
    if (fd >= 0) (void)close(fd); /* no retry on EINTR: the fd is released either way */
}

static int zero_nccl__prepare_fd(int fd)
{
    int flags = fcntl(fd, F_GETFD);
    if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0) return -1;
    flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return -1;
    return 0;
}

static void zero_nccl__nodelay(int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* latency only */
}

static void zero_nccl__peer_name(const struct sockaddr_storage *ss, char *out, size_t size)
{
    char ip[64];
    unsigned port = 0;
    ip[0] = '\0';
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)(const void *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
        port = ntohs(a->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)(const void *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
        port = ntohs(a->sin6_port);
    }
    snprintf(out, size, "%s:%u", ip[0] ? ip : "?", port);
}

#ifdef MSG_NOSIGNAL
#define ZERO_NCCL__SEND_FLAGS MSG_NOSIGNAL /* a closed peer is an error, not SIGPIPE */
#else
#define ZERO_NCCL__SEND_FLAGS 0
#endif

/* Waits until fd is ready for events (POLLIN or POLLOUT) or the deadline passes. 0 when
   ready; -1 with errno (ETIMEDOUT at the deadline). */
static int zero_nccl__poll_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        struct pollfd pfd;
        int left = zero_nccl__left_ms(deadline), pr;
        if (left == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        pfd.fd = fd;
        pfd.events = events;
        pfd.revents = 0;
        pr = poll(&pfd, 1, left);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) return -1;
        if (pr > 0) return 0;
    }
}

/* Sends n bytes by the deadline. 0, or -1 with errno (ETIMEDOUT at the deadline). */
static int zero_nccl__send_all(int fd, const void *buf, size_t n, int64_t deadline)
{
    const char *p = (const char *)buf;
    size_t done = 0;
    while (done < n) {
        ssize_t s = send(fd, p + done, n - done, ZERO_NCCL__SEND_FLAGS);
        if (s > 0) {
            done += (size_t)s;
            continue;
        }
        if (s < 0 && errno == EINTR) continue;
        if (s < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        if (zero_nccl__poll_fd(fd, POLLOUT, deadline) != 0) return -1;
    }
    return 0;
}

/* Receives n bytes by the deadline. 0; -1 with errno (ETIMEDOUT at the deadline); -2 at
   end of stream. *got says how many arrived. */
static int zero_nccl__recv_all(int fd, void *buf, size_t n, int64_t deadline, size_t *got)
{
    char *p = (char *)buf;
    *got = 0;
    while (*got < n) {
        ssize_t r = recv(fd, p + *got, n - *got, 0);
        if (r > 0) {
            *got += (size_t)r;
            continue;
        }
        if (r == 0) return -2;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        if (zero_nccl__poll_fd(fd, POLLIN, deadline) != 0) return -1;
    }
    return 0;
}

/* Receives a message header by the deadline, checking each arrival against the magic.
   As zero_nccl__recv_all, plus -3 as soon as the bytes cannot be a header. */
static int zero_nccl__recv_hdr(int fd, unsigned char *buf, int64_t deadline, size_t *got)
{
    *got = 0;
    while (*got < ZERO_NCCL__HDR) {
        ssize_t r = recv(fd, buf + *got, ZERO_NCCL__HDR - *got, 0);
        if (r > 0) {
            *got += (size_t)r;
            if (!zero_nccl__prefix_ok(buf, *got)) return -3;
            continue;
        }
        if (r == 0) return -2;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
        if (zero_nccl__poll_fd(fd, POLLIN, deadline) != 0) return -1;
    }
    return 0;
}

static zero_result zero_nccl__check_desc(const zero_bootstrap_desc *d, const char *who, int server)
{
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: desc is NULL", who);
    if (d->world < 1 || d->world > ZERO_BOOTSTRAP_MAX_WORLD)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: world = %d (must be 1..%d)", who,
                          d->world, ZERO_BOOTSTRAP_MAX_WORLD);
    if (d->rank < 0 || d->rank >= d->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: rank = %d (must be 0..%d)", who,
                          d->rank, d->world - 1);
    if (d->timeout_ms < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: timeout_ms = %d (must be >= 0)", who,
                          d->timeout_ms);
    if (d->port < (server ? 0 : 1) || d->port > 65535)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: port = %d (must be %d..65535)", who,
                          d->port, server ? 0 : 1);
    if (!server && (d->addr[0] == '\0' || memchr(d->addr, '\0', sizeof d->addr) == NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: addr (rank 0's host) is empty or not NUL-terminated", who);
    if (server && (memchr(d->addr, '\0', sizeof d->addr) == NULL ||
                   memchr(d->bind_addr, '\0', sizeof d->bind_addr) == NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: addr or bind_addr is not NUL-terminated", who);
    return ZERO_OK;
}

static int zero_nccl__timeout_of(const zero_bootstrap_desc *d)
{
    return d->timeout_ms > 0 ? d->timeout_ms : ZERO_BOOTSTRAP_DEFAULT_TIMEOUT_MS;
}

/* ---- rank 0: listen and serve ---- */

struct zero_bootstrap_server {
    int fd;
    int port;
    int world;
    int timeout_ms;
    char addr[64]; /* numeric, or "*" for every interface */
};

/* A listening socket on one socket address (port included). 0, or -1 with *err. */
static int zero_nccl__listen_on(const struct sockaddr *sa, socklen_t salen, int *out_fd,
                                int *out_port, int *err)
{
    struct sockaddr_storage ss;
    socklen_t len = (socklen_t)sizeof ss;
    int one = 1, zero = 0, ok, fd = socket(sa->sa_family, SOCK_STREAM, 0);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    ok = zero_nccl__prepare_fd(fd) == 0 &&
         setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0;
    /* every interface over IPv6 takes IPv4 too */
    if (ok && sa->sa_family == AF_INET6 &&
        IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr))
        ok = setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero) == 0;
    ok = ok && bind(fd, sa, salen) == 0 && listen(fd, SOMAXCONN) == 0 &&
         getsockname(fd, (struct sockaddr *)&ss, &len) == 0;
    if (!ok) {
        *err = errno;
        zero_nccl__close(fd);
        return -1;
    }
    *out_port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)(void *)&ss)->sin6_port)
                                         : ntohs(((struct sockaddr_in *)(void *)&ss)->sin_port);
    *out_fd = fd;
    return 0;
}

static int zero_nccl__is_loopback(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

static int zero_nccl__is_numeric(const char *host)
{
    unsigned char buf[sizeof(struct in6_addr)];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* Every interface: IPv6 accepting IPv4 too, else IPv4. 0, or -1 with *err. */
static int zero_nccl__listen_any(int port, int *out_fd, int *out_port, int *err)
{
    struct sockaddr_in6 a6;
    struct sockaddr_in a4;
    memset(&a6, 0, sizeof a6);
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_any;
    a6.sin6_port = htons((uint16_t)port);
    if (zero_nccl__listen_on((const struct sockaddr *)(const void *)&a6, (socklen_t)sizeof a6,
                             out_fd, out_port, err) == 0)
        return 0;
    if (*err == EADDRINUSE || *err == EACCES) return -1; /* IPv4 would say the same */
    memset(&a4, 0, sizeof a4);
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons((uint16_t)port);
    return zero_nccl__listen_on((const struct sockaddr *)(const void *)&a4, (socklen_t)sizeof a4,
                                out_fd, out_port, err);
}

/* The addresses 'host' resolves to, in order, skipping loopback ones unless allowed: 0 on
   the first that listens (its numeric form in addr); -1 with *err (EADDRNOTAVAIL when
   none is an address of this host, 0 with *why set when host does not resolve). */
static int zero_nccl__listen_host(const char *host, int port, int allow_loopback, int *out_fd,
                                  int *out_port, char *addr, size_t addr_size, int *err,
                                  const char **why)
{
    struct addrinfo hints, *res = NULL, *ai;
    char port_str[16];
    int rc;
    *err = EADDRNOTAVAIL;
    *why = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    snprintf(port_str, sizeof port_str, "%d", port);
    rc = getaddrinfo(host, port_str, &hints, &res);
    if (rc != 0) {
        *err = 0;
        *why = rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc);
        return -1;
    }
    for (ai = res; ai; ai = ai->ai_next) {
        int e = 0;
        if (!allow_loopback && zero_nccl__is_loopback(ai->ai_addr)) continue;
        if (zero_nccl__listen_on(ai->ai_addr, ai->ai_addrlen, out_fd, out_port, &e) == 0) {
            if (getnameinfo(ai->ai_addr, ai->ai_addrlen, addr, (socklen_t)addr_size, NULL, 0,
                            NI_NUMERICHOST) != 0)
                snprintf(addr, addr_size, "%.60s", host);
            freeaddrinfo(res);
            return 0;
        }
        if (*err == EADDRNOTAVAIL || e == EADDRINUSE || e == EACCES) *err = e;
        if (e == EADDRINUSE || e == EACCES) break;
    }
    freeaddrinfo(res);
    return -1;
}

/* Rank 0's listening socket on the address desc->bind_addr chooses (see its comment). */
static zero_result zero_nccl__listen_fd(const zero_bootstrap_desc *d, int *out_fd, int *out_port,
                                        char *addr, size_t addr_size)
{
    int port = d->port, err = 0, explicit_bind = d->bind_addr[0] != '\0';
    const char *host = explicit_bind ? d->bind_addr : d->addr, *why = NULL;
    if (host[0] != '\0' && strcmp(host, "*") != 0) {
        int allow_loopback = explicit_bind || zero_nccl__is_numeric(host) ||
                             d->local_world == d->world;
        if (zero_nccl__listen_host(host, port, allow_loopback, out_fd, out_port, addr, addr_size,
                                   &err, &why) == 0)
            return ZERO_OK;
        if (explicit_bind && why)
            return zero__fail(ZERO_ERROR_IO,
                              "zero_bootstrap_listen: cannot resolve the listening address "
                              "\"%s\" (bind_addr, ZERO_BOOTSTRAP_BIND): %s",
                              host, why);
        if (explicit_bind && err != EADDRINUSE && err != EACCES)
            return zero__fail(ZERO_ERROR_IO,
                              "zero_bootstrap_listen: rank 0 cannot listen on %s port %d (bind_addr, "
                              "ZERO_BOOTSTRAP_BIND): %s%s",
                              host, port, strerror(err),
                              err == EADDRNOTAVAIL ? ": it is not an address of this host (\"*\" "
                                                     "listens on every interface)"
                                                   : "");
        /* the default: rank 0's address is not this host's (or resolves elsewhere): every
           interface, as a port in use is reported below either way */
    }
    if (err != EADDRINUSE && err != EACCES) {
        if (zero_nccl__listen_any(port, out_fd, out_port, &err) == 0) {
            snprintf(addr, addr_size, "*");
            return ZERO_OK;
        }
    }
    if (err == EADDRINUSE)
        return zero__fail(ZERO_ERROR_IO,
                          "zero_bootstrap_listen: rank 0 cannot listen on port %d: it is already "
                          "in use on this host (%s). Another job or program holds it: pick "
                          "another MASTER_PORT or set ZERO_BOOTSTRAP_PORT (torchrun's agent "
                          "keeps MASTER_PORT itself when TORCHELASTIC_USE_AGENT_STORE=True)",
                          port, strerror(err));
    if (err == EACCES)
        return zero__fail(ZERO_ERROR_IO,
                          "zero_bootstrap_listen: rank 0 may not listen on port %d (%s): use a "
                          "port above 1023",
                          port, strerror(err));
    return zero__fail(ZERO_ERROR_IO, "zero_bootstrap_listen: rank 0 cannot listen on port %d: %s",
                      port, strerror(err));
}

ZERODEF zero_result zero_bootstrap_listen(const zero_bootstrap_desc *desc,
                                          zero_bootstrap_server **out)
{
    zero_bootstrap_server *s;
    zero_result r;
    int fd = -1, port = 0;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_bootstrap_listen: out is NULL");
    *out = NULL;
    r = zero_nccl__check_desc(desc, "zero_bootstrap_listen", 1);
    if (r != ZERO_OK) return r;
    if (desc->rank != 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_bootstrap_listen: only rank 0 listens (rank = %d)", desc->rank);
    s = (zero_bootstrap_server *)zero__alloc(NULL, sizeof *s);
    if (!s) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_bootstrap_listen: out of memory");
    s->addr[0] = '\0';
    r = zero_nccl__listen_fd(desc, &fd, &port, s->addr, sizeof s->addr);
    if (r != ZERO_OK) {
        zero__free(NULL, s);
        return r;
    }
    s->fd = fd;
    s->port = port;
    s->world = desc->world;
    s->timeout_ms = zero_nccl__timeout_of(desc);
    *out = s;
    return ZERO_OK;
}

ZERODEF int zero_bootstrap_server_port(const zero_bootstrap_server *server)
{
    return server ? server->port : -1;
}

ZERODEF const char *zero_bootstrap_server_addr(const zero_bootstrap_server *server)
{
    return server ? server->addr : "";
}

ZERODEF void zero_bootstrap_server_close(zero_bootstrap_server *server)
{
    if (!server) return;
    zero_nccl__close(server->fd);
    zero__free(NULL, server);
}

enum { ZERO_NCCL__WAIT_HELLO = 0, ZERO_NCCL__SEND_ID = 1, ZERO_NCCL__WAIT_ACK = 2 };
/* rank states on rank 0: ABSENT (no hello), SERVING (hello accepted, the id going out),
   SENT (the whole id sent, no ack yet), DONE (acknowledged), LOST (left after the id
   went out, without acknowledging) */
enum {
    ZERO_NCCL__ABSENT = 0,
    ZERO_NCCL__SERVING = 1,
    ZERO_NCCL__DONE = 2,
    ZERO_NCCL__LOST = 3,
    ZERO_NCCL__SENT = 4
};

typedef struct zero_nccl__conn {
    int fd;
    int state;
    int rank;     /* once its hello was accepted */
    size_t got;   /* bytes of the incoming header */
    size_t sent;  /* bytes of the id frame sent */
    unsigned char in[ZERO_NCCL__HDR];
    char peer[80];
} zero_nccl__conn;

typedef struct zero_nccl__serve_ctx {
    int world;
    size_t id_bytes;
    const unsigned char *frame; /* header + id, the same for every peer */
    size_t frame_bytes;
    unsigned char *rank_state;  /* [world] */
    int done;
} zero_nccl__serve_ctx;

/* Validates a complete hello. */
static zero_result zero_nccl__accept_hello(zero_nccl__serve_ctx *x, zero_nccl__conn *c)
{
    zero_nccl__hdr h;
    zero_result r;
    char from[128];
    zero_nccl__decode(c->in, &h);
    snprintf(from, sizeof from, "peer %s", c->peer);
    r = zero_nccl__check_common(&h, x->world, x->id_bytes, "zero_bootstrap_serve", from);
    if (r != ZERO_OK) return r;
    if (h.type != ZERO_NCCL__HELLO || h.payload_bytes != 0 ||
        h.checksum != zero_nccl__fnv1a(NULL, 0))
        return zero__fail(ZERO_ERROR_COMM,
                          "zero_bootstrap_serve: malformed message from peer %s: a %s message "
                          "with %u payload bytes where a hello was expected",
                          c->peer, zero_nccl__type_name(h.type), (unsigned)h.payload_bytes);
    if (h.rank == 0 || h.rank >= (uint32_t)x->world)
        return zero__fail(ZERO_ERROR_MISMATCH,
                          "zero_bootstrap_serve: peer %s claims rank %u in a world of %d: two "
                          "processes think they are rank 0, or the world sizes differ",
                          c->peer, (unsigned)h.rank, x->world);
    if (x->rank_state[h.rank] == ZERO_NCCL__DONE)
        return zero__fail(ZERO_ERROR_MISMATCH,
                          "zero_bootstrap_serve: peer %s claims rank %u, which another process "
                          "already took: two processes were given the same rank",
                          c->peer, (unsigned)h.rank);
    c->rank = (int)h.rank;
    return ZERO_OK;
}

static zero_result zero_nccl__accept_ack(zero_nccl__serve_ctx *x, zero_nccl__conn *c)
{
    zero_nccl__hdr h;
    zero_result r;
    char from[128];
    zero_nccl__decode(c->in, &h);
    snprintf(from, sizeof from, "rank %d (%s)", c->rank, c->peer);
    r = zero_nccl__check_common(&h, x->world, x->id_bytes, "zero_bootstrap_serve", from);
    if (r != ZERO_OK) return r;
    if (h.type != ZERO_NCCL__ACK || h.payload_bytes != 0 || h.rank != (uint32_t)c->rank)
        return zero__fail(ZERO_ERROR_COMM,
                          "zero_bootstrap_serve: malformed message from %s: a %s message (rank "
                          "%u, %u payload bytes) where an ack was expected",
                          from, zero_nccl__type_name(h.type), (unsigned)h.rank,
                          (unsigned)h.payload_bytes);
    return ZERO_OK;
}

/* Advances one connection. Sets *drop when it is finished or gone. Errors are fatal for
   the whole exchange (malformed, mismatch). */
static zero_result zero_nccl__serve_conn(zero_nccl__serve_ctx *x, zero_nccl__conn *c, short revents,
                                         int *drop)
{
    zero_result r;
    *drop = 0;
    if (c->state == ZERO_NCCL__WAIT_HELLO || c->state == ZERO_NCCL__WAIT_ACK) {
        ssize_t n;
        if (!(revents & (POLLIN | POLLHUP | POLLERR))) return ZERO_OK;
        n = recv(c->fd, c->in + c->got, ZERO_NCCL__HDR - c->got, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return ZERO_OK;
        if (n <= 0) {
            /* Closed or reset. Before a hello: a stray connection, ignored. After the id
               went out: the peer left without acknowledging. */
            if (c->state == ZERO_NCCL__WAIT_ACK) x->rank_state[c->rank] = ZERO_NCCL__LOST;
            *drop = 1;
            return ZERO_OK;
        }
        c->got += (size_t)n;
        if (!zero_nccl__prefix_ok(c->in, c->got)) { /* fail fast: not our protocol */
            char shown[160];
            zero_nccl__show_bytes(c->in, c->got, shown, sizeof shown);
            return zero__fail(ZERO_ERROR_COMM,
                              "zero_bootstrap_serve: malformed message from peer %s: it sent %s, "
                              "not the magic \"ZER0\": not a zero bootstrap peer (another "
                              "program on this port?)",
                              c->peer, shown);
        }
        if (c->got < ZERO_NCCL__HDR) return ZERO_OK;
        if (c->state == ZERO_NCCL__WAIT_ACK) {
            r = zero_nccl__accept_ack(x, c);
            if (r != ZERO_OK) return r;
            if (x->rank_state[c->rank] == ZERO_NCCL__DONE)
                return zero__fail(ZERO_ERROR_MISMATCH,
                                  "zero_bootstrap_serve: rank %d was acknowledged twice (peer "
                                  "%s): two processes were given the same rank",
                                  c->rank, c->peer);
            x->rank_state[c->rank] = ZERO_NCCL__DONE;
            x->done++;
            *drop = 1;
            return ZERO_OK;
        }
        r = zero_nccl__accept_hello(x, c);
        if (r != ZERO_OK) return r;
        /* A rank reconnecting after a broken attempt replaces its old connection's claim. */
        x->rank_state[c->rank] = ZERO_NCCL__SERVING;
        c->state = ZERO_NCCL__SEND_ID;
        c->sent = 0;
        revents = POLLOUT; /* try at once: the frame usually fits the socket buffer */
    }
    if (c->state == ZERO_NCCL__SEND_ID) {
        ssize_t n;
        if (!(revents & (POLLOUT | POLLHUP | POLLERR))) return ZERO_OK;
        n = send(c->fd, x->frame + c->sent, x->frame_bytes - c->sent, ZERO_NCCL__SEND_FLAGS);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return ZERO_OK;
        if (n <= 0) {
            x->rank_state[c->rank] = ZERO_NCCL__ABSENT; /* it may come back */
            *drop = 1;
            return ZERO_OK;
        }
        c->sent += (size_t)n;
        if (c->sent == x->frame_bytes) {
            c->state = ZERO_NCCL__WAIT_ACK;
            c->got = 0;
            x->rank_state[c->rank] = ZERO_NCCL__SENT;
        }
    }
    return ZERO_OK;
}

/* "3, 5, 9 and 12 more" */
static void zero_nccl__list_ranks(const unsigned char *state, int world, int which, char *out,
                                  size_t size, int *count)
{
    int r, shown = 0, n = 0;
    size_t o = 0;
    out[0] = '\0';
    for (r = 1; r < world; r++) {
        if (state[r] != which && !(which == ZERO_NCCL__ABSENT && state[r] == ZERO_NCCL__SERVING) &&
            !(which == ZERO_NCCL__LOST && state[r] == ZERO_NCCL__SENT))
            continue;
        n++;
        if (shown < 16 && o + 16 < size) {
            int w = snprintf(out + o, size - o, "%s%d", shown ? ", " : "", r);
            if (w > 0) o += (size_t)w;
            shown++;
        }
    }
    if (n > shown && o + 24 < size) snprintf(out + o, size - o, " and %d more", n - shown);
    *count = n;
}

ZERODEF zero_result zero_bootstrap_serve(zero_bootstrap_server *server, const void *id,
                                         size_t id_bytes)
{
    zero_nccl__serve_ctx x;
    zero_nccl__hdr h;
    zero_nccl__conn *conns = NULL;
    struct pollfd *pfds = NULL;
    unsigned char *frame = NULL, *rank_state = NULL;
    int nconns = 0, i, need;
    int64_t deadline, accept_pause_until = 0;
    zero_result result = ZERO_OK;

    if (!server) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_bootstrap_serve: server is NULL");
    if (!id) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_bootstrap_serve: id is NULL");
    if (id_bytes == 0 || id_bytes > ZERO_BOOTSTRAP_MAX_ID_BYTES)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_bootstrap_serve: id_bytes = %zu (must be 1..%d)", id_bytes,
                          ZERO_BOOTSTRAP_MAX_ID_BYTES);
    need = server->world - 1;
    if (need == 0) return ZERO_OK;
    deadline = zero_nccl__deadline(server->timeout_ms);

    frame = (unsigned char *)zero__alloc(NULL, ZERO_NCCL__HDR + id_bytes);
    rank_state = (unsigned char *)zero__alloc(NULL, (size_t)server->world);
    conns = (zero_nccl__conn *)zero__alloc(NULL, sizeof *conns * ZERO_NCCL__MAX_CONNS);
    pfds = (struct pollfd *)zero__alloc(NULL, sizeof *pfds * (ZERO_NCCL__MAX_CONNS + 1));
    if (!frame || !rank_state || !conns || !pfds) {
        zero__free(NULL, frame);
        zero__free(NULL, rank_state);
        zero__free(NULL, conns);
        zero__free(NULL, pfds);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_bootstrap_serve: out of memory");
    }
    memset(rank_state, 0, (size_t)server->world);
    zero_nccl__make_hdr(&h, ZERO_NCCL__ID, server->world, 0, id_bytes, id, id_bytes, ZERO_OK);
    zero_nccl__encode(&h, frame);
    memcpy(frame + ZERO_NCCL__HDR, id, id_bytes);
    x.world = server->world;
    x.id_bytes = id_bytes;
    x.frame = frame;
    x.frame_bytes = ZERO_NCCL__HDR + id_bytes;
    x.rank_state = rank_state;
    x.done = 0;

    while (x.done < need) {
        int left = zero_nccl__left_ms(deadline), np = 0, pr, listening;
        if (left == 0) {
            char absent[200], lost[200], lost_text[260];
            int n_absent = 0, n_lost = 0;
            zero_nccl__list_ranks(rank_state, server->world, ZERO_NCCL__ABSENT, absent,
                                  sizeof absent, &n_absent);
            zero_nccl__list_ranks(rank_state, server->world, ZERO_NCCL__LOST, lost, sizeof lost,
                                  &n_lost);
            lost_text[0] = '\0';
            if (n_lost)
                snprintf(lost_text, sizeof lost_text, "%srank(s) %s received the id but never "
                         "acknowledged it", n_absent ? "; " : "", lost);
            result = zero__fail(ZERO_ERROR_TIMEOUT,
                                "zero_bootstrap_serve: rank 0 timed out after %d ms with %d of %d "
                                "peers served: %s%s%s%s. Were all ranks started, with the same "
                                "MASTER_ADDR, port %d and world size, and can they reach this "
                                "host (firewall; rank 0 listens on %s)?",
                                server->timeout_ms, x.done, need, n_absent ? "rank(s) " : "",
                                n_absent ? absent : "", n_absent ? " never got the id" : "",
                                lost_text, server->port,
                                strcmp(server->addr, "*") == 0 ? "every interface" : server->addr);
            break;
        }
        listening = nconns < ZERO_NCCL__MAX_CONNS && zero_nccl__now_ns() >= accept_pause_until;
        if (listening) {
            pfds[np].fd = server->fd;
            pfds[np].events = POLLIN;
            pfds[np].revents = 0;
            np++;
        }
        for (i = 0; i < nconns; i++) {
            pfds[np].fd = conns[i].fd;
            pfds[np].events = conns[i].state == ZERO_NCCL__SEND_ID ? POLLOUT : POLLIN;
            pfds[np].revents = 0;
            np++;
        }
        if (!listening && left > 10) left = 10; /* re-check the accept pause */
        pr = poll(pfds, (nfds_t)np, left);
        if (pr < 0 && errno == EINTR) continue;
        if (pr < 0) {
            result = zero__fail(ZERO_ERROR_IO, "zero_bootstrap_serve: poll: %s", strerror(errno));
            break;
        }
        /* connections first (their indices match pfds before any change) */
        for (i = 0; i < nconns; i++) {
            int drop = 0;
            short rev = pfds[i + (listening ? 1 : 0)].revents;
            if (!rev) continue;
            result = zero_nccl__serve_conn(&x, &conns[i], rev, &drop);
            if (result != ZERO_OK) break;
            if (drop) {
                zero_nccl__close(conns[i].fd);
                conns[i].fd = -1;
            }
        }
        if (result != ZERO_OK) break;
        {
            int k = 0;
            for (i = 0; i < nconns; i++)
                if (conns[i].fd >= 0) conns[k++] = conns[i];
            nconns = k;
        }
        if (listening && (pfds[0].revents & POLLIN)) {
            while (nconns < ZERO_NCCL__MAX_CONNS) {
                struct sockaddr_storage ss;
                socklen_t len = (socklen_t)sizeof ss;
                int fd = accept(server->fd, (struct sockaddr *)&ss, &len);
                if (fd < 0) {
                    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
                    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                        if (nconns == 0) {
                            result = zero__fail(ZERO_ERROR_IO,
                                                "zero_bootstrap_serve: accept: %s (raise the "
                                                "open-file limit, ulimit -n)",
                                                strerror(errno));
                        }
                        accept_pause_until = zero_nccl__now_ns() + 10000000; /* let some close */
                        break;
                    }
                    result = zero__fail(ZERO_ERROR_IO, "zero_bootstrap_serve: accept: %s",
                                        strerror(errno));
                    break;
                }
                if (zero_nccl__prepare_fd(fd) != 0) {
                    zero_nccl__close(fd);
                    continue;
                }
                zero_nccl__nodelay(fd);
                memset(&conns[nconns], 0, sizeof conns[nconns]);
                conns[nconns].fd = fd;
                conns[nconns].state = ZERO_NCCL__WAIT_HELLO;
                conns[nconns].rank = -1;
                zero_nccl__peer_name(&ss, conns[nconns].peer, sizeof conns[nconns].peer);
                nconns++;
            }
            if (result != ZERO_OK) break;
        }
    }

    if (result != ZERO_OK) {
        /* Tell the peers still connected why (best effort, one non-blocking send each), so
           they fail at once with rank 0's reason instead of timing out. */
        unsigned char msg[ZERO_NCCL__HDR + ZERO_NCCL__MAX_ERROR_TEXT];
        const char *text = zero_last_error();
        size_t len = strlen(text);
        if (len > ZERO_NCCL__MAX_ERROR_TEXT) len = ZERO_NCCL__MAX_ERROR_TEXT;
        zero_nccl__make_hdr(&h, ZERO_NCCL__ERROR, server->world, 0, id_bytes, text, len, result);
        zero_nccl__encode(&h, msg);
        memcpy(msg + ZERO_NCCL__HDR, text, len);
        for (i = 0; i < nconns; i++)
            (void)send(conns[i].fd, msg, ZERO_NCCL__HDR + len, ZERO_NCCL__SEND_FLAGS);
    }
    for (i = 0; i < nconns; i++) zero_nccl__close(conns[i].fd);
    zero__free(NULL, frame);
    zero__free(NULL, rank_state);
    zero__free(NULL, conns);
    zero__free(NULL, pfds);
    return result;
}

/* ---- the other ranks: connect and receive ---- */

/* Why a connect to ai failed with errno err, naming the address. */
static void zero_nccl__connect_why(const struct addrinfo *ai, int err, char *why, size_t size)
{
    char name[80];
    zero_nccl__peer_name((const struct sockaddr_storage *)(const void *)ai->ai_addr, name,
                         sizeof name);
    if (err == ECONNREFUSED)
        snprintf(why, size, "connection refused: nobody is listening on %s", name);
    else
        snprintf(why, size, "connect to %s: %s", name, strerror(err));
}

/* One connection attempt to one address, by the deadline. The fd, or -1 with 'why';
   *cut = 1 when the attempt was still pending at the deadline (it says little). */
static int zero_nccl__connect(const struct addrinfo *ai, int64_t deadline, char *why, size_t size,
                              int *cut)
{
    int fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
    int err = 0;
    socklen_t len = (socklen_t)sizeof err;
    *cut = 0;
    if (fd < 0) {
        snprintf(why, size, "socket: %s", strerror(errno));
        return -1;
    }
    if (zero_nccl__prepare_fd(fd) != 0) {
        snprintf(why, size, "fcntl: %s", strerror(errno));
        zero_nccl__close(fd);
        return -1;
    }
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        if (errno != EINPROGRESS && errno != EINTR) {
            zero_nccl__connect_why(ai, errno, why, size);
            zero_nccl__close(fd);
            return -1;
        }
        /* the connection proceeds asynchronously */
        if (zero_nccl__poll_fd(fd, POLLOUT, deadline) != 0) {
            if (errno == ETIMEDOUT) {
                char name[80];
                zero_nccl__peer_name((const struct sockaddr_storage *)(const void *)ai->ai_addr,
                                     name, sizeof name);
                snprintf(why, size, "connect to %s: no answer before the deadline (a firewall "
                         "dropping packets, or a host that is down?)", name);
                *cut = 1;
            } else {
                snprintf(why, size, "poll: %s", strerror(errno));
            }
            zero_nccl__close(fd);
            return -1;
        }
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        if (err != 0) {
            zero_nccl__connect_why(ai, err, why, size);
            zero_nccl__close(fd);
            return -1;
        }
    }
    zero_nccl__nodelay(fd);
    return fd;
}

/* Hello, id, ack over a connected fd. *retry = 1 when the attempt broke in a way a
   later attempt may not (rank 0 closed or reset before replying). */
static zero_result zero_nccl__client_session(int fd, const zero_bootstrap_desc *d, void *id,
                                             size_t id_bytes, int64_t deadline, int *retry,
                                             char *why, size_t why_size)
{
    unsigned char buf[ZERO_NCCL__HDR];
    unsigned char *payload;
    zero_nccl__hdr h;
    size_t got = 0;
    int rc;
    zero_result r;
    char from[ZERO_BOOTSTRAP_ADDR_MAX + 32];

    *retry = 0;
    snprintf(from, sizeof from, "rank 0 (%s:%d)", d->addr, d->port);
    zero_nccl__make_hdr(&h, ZERO_NCCL__HELLO, d->world, d->rank, id_bytes, NULL, 0, ZERO_OK);
    zero_nccl__encode(&h, buf);
    if (zero_nccl__send_all(fd, buf, ZERO_NCCL__HDR, deadline) != 0) {
        if (errno == ETIMEDOUT)
            return zero__fail(ZERO_ERROR_TIMEOUT,
                              "zero_bootstrap_exchange: rank %d: connected to %s but could not "
                              "send its hello within %d ms",
                              d->rank, from, zero_nccl__timeout_of(d));
        snprintf(why, why_size, "send to %s: %s", from, strerror(errno));
        *retry = 1;
        return ZERO_ERROR_IO;
    }
    rc = zero_nccl__recv_hdr(fd, buf, deadline, &got);
    if (rc == -3) { /* fail fast: bytes that cannot start a message */
        char shown[160];
        zero_nccl__show_bytes(buf, got, shown, sizeof shown);
        return zero__fail(ZERO_ERROR_COMM,
                          "zero_bootstrap_exchange: rank %d: malformed message from %s: it sent "
                          "%s, not the magic \"ZER0\": not a zero bootstrap peer (another "
                          "program on this port? check MASTER_PORT / ZERO_BOOTSTRAP_PORT)",
                          d->rank, from, shown);
    }
    if (rc != 0) {
        if (rc == -1 && errno == ETIMEDOUT && got == 0)
            return zero__fail(ZERO_ERROR_TIMEOUT,
                              "zero_bootstrap_exchange: rank %d: connected to %s but got no "
                              "reply within %d ms",
                              d->rank, from, zero_nccl__timeout_of(d));
        if (rc == -1 && errno == ETIMEDOUT) {
            char shown[160];
            zero_nccl__show_bytes(buf, got, shown, sizeof shown);
            return zero__fail(ZERO_ERROR_TIMEOUT,
                              "zero_bootstrap_exchange: rank %d: %s sent %zu of %d header bytes "
                              "(%s) and then nothing within %d ms",
                              d->rank, from, got, ZERO_NCCL__HDR, shown,
                              zero_nccl__timeout_of(d));
        }
        if (got == 0) { /* closed or reset before replying: rank 0 may be restarting */
            snprintf(why, why_size, "%s closed the connection without replying%s%s", from,
                     rc == -1 ? ": " : "", rc == -1 ? strerror(errno) : "");
            *retry = 1;
            return ZERO_ERROR_IO;
        }
        return zero__fail(ZERO_ERROR_COMM,
                          "zero_bootstrap_exchange: rank %d: %s closed the connection in the "
                          "middle of a message (%zu of %d header bytes)",
                          d->rank, from, got, ZERO_NCCL__HDR);
    }
    zero_nccl__decode(buf, &h);
    r = zero_nccl__check_common(&h, d->world, id_bytes, "zero_bootstrap_exchange", from);
    if (r != ZERO_OK) return r;
    if (h.type == ZERO_NCCL__ERROR) {
        char text[ZERO_NCCL__MAX_ERROR_TEXT + 1];
        zero_result code = ZERO_ERROR_COMM;
        size_t n = h.payload_bytes;
        if (n > ZERO_NCCL__MAX_ERROR_TEXT)
            return zero__fail(ZERO_ERROR_COMM,
                              "zero_bootstrap_exchange: rank %d: malformed error message from %s "
                              "(%u bytes of text)",
                              d->rank, from, (unsigned)h.payload_bytes);
        rc = zero_nccl__recv_all(fd, text, n, deadline, &got);
        text[rc == 0 ? n : got] = '\0';
        if (h.status < 0 && h.status >= (int32_t)ZERO_ERROR_UNSUPPORTED) code = (zero_result)h.status;
        return zero__fail(code, "zero_bootstrap_exchange: rank %d: rank 0 failed: %s", d->rank,
                          text);
    }
    if (h.type != ZERO_NCCL__ID || h.rank != 0 || h.payload_bytes != (uint32_t)id_bytes)
        return zero__fail(ZERO_ERROR_COMM,
                          "zero_bootstrap_exchange: rank %d: malformed message from %s: a %s "
                          "message from rank %u with %u payload bytes where an id of %zu bytes "
                          "was expected",
                          d->rank, from, zero_nccl__type_name(h.type), (unsigned)h.rank,
                          (unsigned)h.payload_bytes, id_bytes);
    payload = (unsigned char *)zero__alloc(NULL, id_bytes);
    if (!payload)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_bootstrap_exchange: out of memory");
    rc = zero_nccl__recv_all(fd, payload, id_bytes, deadline, &got);
    if (rc != 0) {
        int timed_out = rc == -1 && errno == ETIMEDOUT;
        zero__free(NULL, payload);
        if (timed_out)
            return zero__fail(ZERO_ERROR_TIMEOUT,
                              "zero_bootstrap_exchange: rank %d: the id from %s did not arrive "
                              "within %d ms",
                              d->rank, from, zero_nccl__timeout_of(d));
        return zero__fail(ZERO_ERROR_COMM,
                          "zero_bootstrap_exchange: rank %d: %s closed the connection after %zu "
                          "of %zu id bytes",
                          d->rank, from, got, id_bytes);
    }
    if (zero_nccl__fnv1a(payload, id_bytes) != h.checksum) {
        zero__free(NULL, payload);
        return zero__fail(ZERO_ERROR_COMM,
                          "zero_bootstrap_exchange: rank %d: malformed message from %s: the id's "
                          "checksum does not match",
                          d->rank, from);
    }
    /* Acknowledge. If this fails rank 0 reports it; this rank has the id either way. */
    zero_nccl__make_hdr(&h, ZERO_NCCL__ACK, d->world, d->rank, id_bytes, NULL, 0, ZERO_OK);
    zero_nccl__encode(&h, buf);
    (void)zero_nccl__send_all(fd, buf, ZERO_NCCL__HDR, deadline);
    memcpy(id, payload, id_bytes);
    zero__free(NULL, payload);
    return ZERO_OK;
}

/* Connects to rank 0, retrying until the deadline. The reason reported at the deadline is
   the most informative one seen: an attempt cut short by the deadline ("no answer before
   the deadline") does not replace what an earlier attempt found out (connection refused,
   name not resolved), and no attempt starts once the deadline has passed. */
static zero_result zero_nccl__client(const zero_bootstrap_desc *d, void *id, size_t id_bytes)
{
    int timeout = zero_nccl__timeout_of(d), have_why = 0;
    int64_t deadline = zero_nccl__deadline(timeout), backoff_ns = 10000000;
    char port_str[16], why[768], attempt[768];
    snprintf(port_str, sizeof port_str, "%d", d->port);
    snprintf(why, sizeof why, "no attempt finished");
    for (;;) {
        struct addrinfo hints, *res = NULL, *ai;
        int fd = -1, rc, cut = 0;
        int64_t left;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_flags = AI_NUMERICSERV;
        attempt[0] = '\0';
        rc = getaddrinfo(d->addr, port_str, &hints, &res);
        if (rc != 0) {
            /* retried: in containers rank 0's name may resolve only once its pod is up */
            snprintf(attempt, sizeof attempt, "cannot resolve \"%s\": %s", d->addr,
                     rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
        } else {
            /* every address in turn; a cut-short attempt does not hide another's reason */
            for (ai = res; ai && fd < 0; ai = ai->ai_next) {
                char one[768];
                int one_cut = 0;
                fd = zero_nccl__connect(ai, deadline, one, sizeof one, &one_cut);
                if (fd < 0 && (!one_cut || attempt[0] == '\0')) {
                    memcpy(attempt, one, sizeof attempt);
                    cut = one_cut;
                }
            }
            freeaddrinfo(res);
        }
        if (fd >= 0) {
            int retry = 0;
            zero_result r = zero_nccl__client_session(fd, d, id, id_bytes, deadline, &retry,
                                                      attempt, sizeof attempt);
            zero_nccl__close(fd);
            if (!retry) return r;
            cut = 0;
        }
        if (attempt[0] != '\0' && !(cut && have_why)) {
            memcpy(why, attempt, sizeof why);
            have_why = 1;
        }
        left = deadline - zero_nccl__now_ns();
        if (left > 0) {
            zero_nccl__sleep_ns(backoff_ns < left ? backoff_ns : left);
            backoff_ns = backoff_ns * 2 > 500000000 ? 500000000 : backoff_ns * 2;
            left = deadline - zero_nccl__now_ns();
        }
        if (left <= 1000000) /* under a millisecond: an attempt could only time out */
            return zero__fail(ZERO_ERROR_TIMEOUT,
                              "zero_bootstrap_exchange: rank %d could not get the id from rank 0 "
                              "at %s:%d within %d ms (%s). Is rank 0 running, and do "
                              "MASTER_ADDR and the port (ZERO_BOOTSTRAP_PORT / MASTER_PORT) "
                              "match on every rank?",
                              d->rank, d->addr, d->port, timeout, why);
    }
}

ZERODEF zero_result zero_bootstrap_exchange(const zero_bootstrap_desc *desc, void *id,
                                            size_t id_bytes)
{
    zero_result r = zero_nccl__check_desc(desc, "zero_bootstrap_exchange", desc && desc->rank == 0);
    if (r != ZERO_OK) return r;
    if (!id) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_bootstrap_exchange: id is NULL");
    if (id_bytes == 0 || id_bytes > ZERO_BOOTSTRAP_MAX_ID_BYTES)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_bootstrap_exchange: id_bytes = %zu (must be 1..%d)", id_bytes,
                          ZERO_BOOTSTRAP_MAX_ID_BYTES);
    if (desc->world == 1) return ZERO_OK;
    if (desc->rank == 0) {
        zero_bootstrap_server *s = NULL;
        if (desc->port == 0)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_bootstrap_exchange: port 0: the peers could not know it "
                              "(use zero_bootstrap_listen for an ephemeral port)");
        r = zero_bootstrap_listen(desc, &s);
        if (r != ZERO_OK) return r;
        r = zero_bootstrap_serve(s, id, id_bytes);
        zero_bootstrap_server_close(s);
        return r;
    }
    return zero_nccl__client(desc, id, id_bytes);
}

#ifndef ZERO_NCCL_BOOTSTRAP_ONLY
/* ======================================================================================
   The NCCL comm.
   ====================================================================================== */
#define ZERO_NCCL__MAX_STREAMS 16 /* distinct streams with collectives in flight */
#define ZERO_NCCL__RING 128       /* events in flight per stream: one per collective
                                     (or per group), recorded by the calling thread, so
                                     at most 128 unconfirmed collectives per stream     */
#define ZERO_NCCL__EVERY 1        /* collectives per event                          */

/* The first collective an event covers (the first after the previous event). */
typedef struct zero_nccl__mark {
    int64_t issued_ns; /* enqueued                                                   */
    int64_t clock_ns;  /* the timeout counts from here: the enqueue, moved up to when the
                          watchdog saw the previous collective on the stream finish  */
    uint64_t seq;
    const char *what;
} zero_nccl__mark;

typedef struct zero_nccl__slot {
    int used;
    cudaStream_t stream;
    cudaEvent_t ev[ZERO_NCCL__RING];
    zero_nccl__mark mark[ZERO_NCCL__RING];
    int head, count;     /* recorded events not yet seen complete, oldest at head   */
    int unrecorded;      /* collectives after the newest event                       */
    zero_nccl__mark tail; /* the first of them                                       */
    int group_ops;       /* collectives on this stream in the open group             */
} zero_nccl__slot;

/* The comms of one family: a comm from zero_nccl_create and every comm split from it (or
   from one of those). Their NCCL communicators are splitShare children of one another, so
   they share NCCL's resources and its abort flag, and NCCL's thread-safety rule covers them
   together: one mutex for the family, and no NCCL call from a watchdog while any of them is
   inside a blocking NCCL call. */
typedef struct zero_nccl__family {
    pthread_mutex_t lock;
    int refs;              /* comms holding it (under lock)                           */
    int in_call;           /* comms of the family inside a blocking NCCL call now     */
    int broken;            /* an NCCL communicator of the family was aborted           */
    char why[640];         /* the first abort's reason                                 */
    zero_allocator allocator;
} zero_nccl__family;

typedef struct zero_nccl__comm {
    zero_comm base;
    zero_allocator allocator;
    ncclComm_t nccl;            /* the collectives' communicator: blocking (split from
                                   'parent'); NULL once aborted or destroyed            */
    ncclComm_t parent;          /* the non-blocking communicator of the init (deadline-
                                   bounded); 'nccl' shares its resources and abort flag */
    int in_call;                /* the caller is inside a blocking NCCL call on 'nccl',
                                   without the lock: no other NCCL call on either
                                   communicator until it returns (NCCL's thread safety) */
    int64_t call_start_ns;      /* when that call began (the watchdog bounds it by T)    */
    const char *call_what;
    int device;
    int timeout_ms;
    zero_result failure;        /* ZERO_OK, or why every call now fails                  */
    char failure_text[640];
    int in_group;               /* depth of group_start                                 */
    int abort_pending;          /* a failure inside a group: abort at group_end          */
    uint64_t seq;               /* collectives enqueued                                  */
    struct zero_nccl__family *fam; /* shared by the comms split from one another         */
    pthread_mutex_t *lock;      /* &fam->lock: every NCCL call and the slots, shared with
                                   the watchdogs of the whole family                     */
    pthread_cond_t cond;
    int cond_ready;
    int no_watchdog;            /* desc.disable_watchdog, inherited by split comms        */
    const char *name;           /* desc.name (NCCL's commName), inherited by split comms  */
    pthread_t watchdog;
    int watchdog_running, stop;
    int poll_ms;
    cudaStream_t internal;      /* barrier                                              */
    float *scratch;             /* barrier, 256 bytes                                   */
    int slots_ready;
    zero_nccl__slot slots[ZERO_NCCL__MAX_STREAMS];
} zero_nccl__comm;

static zero_result zero_nccl__map(ncclResult_t r)
{
    switch ((int)r) {
    case ncclSuccess: return ZERO_OK;
    case ncclUnhandledCudaError: return ZERO_ERROR_DEVICE;
    case ncclInvalidArgument: return ZERO_ERROR_INVALID_ARGUMENT;
    case ncclInvalidUsage: return ZERO_ERROR_INVALID_STATE;
    case 8: return ZERO_ERROR_TIMEOUT; /* ncclTimeout, in newer NCCL */
    default: break;
    }
    return ZERO_ERROR_COMM;
}

/* NCCL's text for r and its last error message. */
static void zero_nccl__detail(ncclComm_t comm, ncclResult_t r, char *out, size_t size)
{
    const char *last = ncclGetLastError(comm);
    snprintf(out, size, "%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "",
             last && *last ? last : " (NCCL_DEBUG=WARN prints NCCL's own report)");
}

/* Lock held. Frees the NCCL communicators at once, or at group_end inside a group (NCCL's
   group still refers to them). While a thread is inside an NCCL call on 'nccl' (in_call)
   nothing is aborted: NCCL forbids operating a communicator, or a parent and its
   splitShare child, from two threads at once, and ncclCommAbort of either would free
   state under the call. The abort is left pending; the caller carries it out when it
   takes the lock back (zero_nccl__call_end, group_end). The parent goes first, then the
   child: NCCL's order for a split that may still be running under the parent (the
   parent's abort ends it; then the child, if NCCL returned one). The same holds while
   another comm of the family is inside a call (they share NCCL's state): the abort then
   waits for this comm's next poll or call (zero_nccl__pending). An abort raises NCCL's
   abort flag, which the family shares: it marks the family broken, and every other comm
   of it fails at its next poll or call. */
static void zero_nccl__abort_locked(zero_nccl__comm *c)
{
    int s;
    if (!c->nccl && !c->parent) return;
    /* a call stuck inside ncclGroupEnd is inside a group too */
    if (c->in_call || c->in_group || c->fam->in_call) {
        c->abort_pending = 1;
        return;
    }
    if (!c->fam->broken) {
        c->fam->broken = 1;
        snprintf(c->fam->why, sizeof c->fam->why, "%s",
                 c->failure != ZERO_OK ? c->failure_text : "a communicator of it was destroyed after a failed finalize");
    }
    if (c->parent) (void)ncclCommAbort(c->parent); /* synchronous; its result changes nothing now */
    c->parent = NULL;
    if (c->nccl) (void)ncclCommAbort(c->nccl);
    c->nccl = NULL;
    for (s = 0; s < ZERO_NCCL__MAX_STREAMS; s++) {
        c->slots[s].count = 0;
        c->slots[s].unrecorded = 0;
        c->slots[s].group_ops = 0;
    }
}

/* Lock held. The comm's failure: the first one recorded wins; later calls repeat it. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static zero_result zero_nccl__fatal(zero_nccl__comm *c, zero_result code, const char *fmt, ...)
{
    if (c->failure == ZERO_OK) {
        va_list ap;
        int n = snprintf(c->failure_text, sizeof c->failure_text, "zero_nccl: rank %d/%d: ",
                         c->base.rank, c->base.world);
        if (n < 0 || (size_t)n >= sizeof c->failure_text) n = 0;
        va_start(ap, fmt);
        vsnprintf(c->failure_text + n, sizeof c->failure_text - (size_t)n, fmt, ap);
        va_end(ap);
        c->failure = code;
    }
    zero_nccl__abort_locked(c);
    return zero__fail(c->failure, "%s", c->failure_text);
}

static zero_result zero_nccl__failed(zero_nccl__comm *c)
{
    return zero__fail(c->failure, "%s", c->failure_text);
}

/* Lock held. Carries out an abort left pending (zero_nccl__abort_locked) once no call of
   the family is in flight; then, while this comm is still healthy, fails it when another
   comm of its family aborted NCCL's shared state. */
static zero_result zero_nccl__pending(zero_nccl__comm *c)
{
    if (c->abort_pending && !c->in_group && !c->fam->in_call) {
        c->abort_pending = 0;
        zero_nccl__abort_locked(c);
    }
    if (c->failure == ZERO_OK && c->fam->broken && (c->nccl || c->parent))
        return zero_nccl__fatal(c, ZERO_ERROR_COMM,
                                "a communicator split from the same NCCL communicator (this comm's "
                                "parent, a child or a sibling, which share NCCL's abort flag) was "
                                "aborted, so this one was too: %s",
                                c->fam->why);
    return c->failure != ZERO_OK ? zero_nccl__failed(c) : ZERO_OK;
}

/* Between polls: a few yields, then sleeps growing to 1 ms. */
static void zero_nccl__backoff(int *spins)
{
    if (*spins < 64) {
        sched_yield();
    } else {
        int64_t ns = 20000 << (*spins - 64 < 6 ? *spins - 64 : 6);
        zero_nccl__sleep_ns(ns > 1000000 ? 1000000 : ns);
    }
    (*spins)++;
}

/* Lock held. Polls comm's asynchronous state (ncclCommGetAsyncError), releasing the lock
   between polls, until it leaves ncclInProgress: ZERO_OK when it settled on ncclSuccess; an
   error, or the deadline passing, aborts (zero_nccl__fatal). "sequence" names what a peer
   may have issued differently; watchdog: 1 when the watchdog may abort the comm meanwhile
   (its verdict is checked after each wait). */
static zero_result zero_nccl__poll_settled(zero_nccl__comm *c, ncclComm_t comm, const char *what,
                                           const char *sequence, int64_t deadline, int watchdog)
{
    char detail[400];
    int spins = 0;
    for (;;) {
        ncclResult_t state = ncclInProgress;
        ncclResult_t q = ncclCommGetAsyncError(comm, &state);
        if (q != ncclSuccess) {
            zero_nccl__detail(comm, q, detail, sizeof detail);
            return zero_nccl__fatal(c, zero_nccl__map(q), "%s: ncclCommGetAsyncError failed: %s",
                                    what, detail);
        }
        if (state == ncclSuccess) return ZERO_OK;
        if (state != ncclInProgress) {
            zero_nccl__detail(comm, state, detail, sizeof detail);
            return zero_nccl__fatal(c, zero_nccl__map(state), "%s failed: %s", what, detail);
        }
        if (zero_nccl__now_ns() >= deadline)
            return zero_nccl__fatal(c, ZERO_ERROR_TIMEOUT,
                                    "%s did not complete within %d ms: a peer rank did not make "
                                    "the matching call (it crashed, hangs, or issued a different "
                                    "sequence of %s); the communicator was aborted",
                                    what, c->timeout_ms, sequence);
        pthread_mutex_unlock(c->lock);
        zero_nccl__backoff(&spins);
        pthread_mutex_lock(c->lock);
        if (watchdog && c->failure != ZERO_OK) return zero_nccl__failed(c); /* it aborted */
    }
}

/* Lock held. After an NCCL call on the non-blocking comm: ncclInProgress means "still
   being set up" (connections, init); polls the comm's state, releasing the lock between
   polls, until it settles or the deadline passes (then aborts). */
static zero_result zero_nccl__settle(zero_nccl__comm *c, ncclResult_t r, const char *what,
                                     int64_t deadline)
{
    char detail[400];
    if (r == ncclSuccess) return ZERO_OK;
    if (r != ncclInProgress) {
        ncclResult_t state = ncclSuccess;
        zero_nccl__detail(c->nccl, r, detail, sizeof detail);
        if (ncclCommGetAsyncError(c->nccl, &state) != ncclSuccess ||
            (state != ncclSuccess && state != ncclInProgress))
            return zero_nccl__fatal(c, zero_nccl__map(r), "%s failed: %s", what, detail);
        /* refused synchronously (arguments); the communicator is fine */
        return zero__fail(zero_nccl__map(r), "zero_nccl: rank %d/%d: %s failed: %s", c->base.rank,
                          c->base.world, what, detail);
    }
    return zero_nccl__poll_settled(c, c->nccl, what, "collectives", deadline, 1);
}

/* Lock held. After ncclCommSplit(c->parent, ..., child, ...) returned r: NCCL runs the
   split under the non-blocking parent and writes the child handle into *child only when it
   has finished (ncclCommSplit returns with it still NULL), meanwhile the parent's
   asynchronous state reads ncclInProgress. Polls the parent until it settles or the
   deadline passes; then the child must be there (want_child; NCCL_SPLIT_NOCOLOR gives
   none). On timeout or error c is failed and the parent aborted first (which ends the
   split before anything is freed), then the child: c->nccl by zero_nccl__abort_locked's
   order, or any other *child here. watchdog: 1 when c's watchdog runs (it may fail c
   meanwhile). */
static zero_result zero_nccl__split_wait(zero_nccl__comm *c, ncclResult_t r, int64_t deadline,
                                         const char *what, ncclComm_t *child, int want_child,
                                         int watchdog)
{
    char detail[400];
    zero_result zr;
    if (r != ncclSuccess && r != ncclInProgress) {
        zero_nccl__detail(c->parent, r, detail, sizeof detail);
        zr = zero_nccl__fatal(c, zero_nccl__map(r), "%s failed: %s", what, detail);
    } else {
        zr = zero_nccl__poll_settled(c, c->parent, what, "calls", deadline, watchdog);
        if (zr == ZERO_OK && want_child && !*child)
            zr = zero_nccl__fatal(c, ZERO_ERROR_COMM,
                                  "%s finished without a communicator (NCCL wrote no child handle)", what);
        if (zr == ZERO_OK && !want_child && *child)
            zr = zero_nccl__fatal(c, ZERO_ERROR_COMM,
                                  "%s with NCCL_SPLIT_NOCOLOR returned a communicator", what);
    }
    /* fatal aborted the parent (only a call of the family in flight on another thread,
       which the one-thread rule excludes, would defer it); the child goes after it */
    if (zr != ZERO_OK && child != &c->nccl && *child && !c->parent) {
        (void)ncclCommAbort(*child);
        *child = NULL;
    }
    return zr;
}

/* NCCL makes every peer connection a collective can use during a communicator's init (not
   in the first collective of each algorithm) when NCCL_RUNTIME_CONNECT is 0: then a
   blocking collective never waits for a peer on the host, and the init that does is
   deadline-bounded and abortable. NCCL >= 2.22 reads the variable (default 1) once per
   process, at its first communicator; older NCCL always connects at init. A value the
   environment already has is kept. */
static void zero_nccl__connect_at_init(void)
{
    if (!getenv("NCCL_RUNTIME_CONNECT")) (void)setenv("NCCL_RUNTIME_CONNECT", "0", 0);
}

/* Lock held. Records an event after the unrecorded collectives of s (room in the ring is
   the caller's business). */
static zero_result zero_nccl__record(zero_nccl__comm *c, zero_nccl__slot *s)
{
    int i = (s->head + s->count) % ZERO_NCCL__RING;
    cudaError_t e = cudaEventRecord(s->ev[i], s->stream);
    if (e != cudaSuccess)
        return zero_nccl__fatal(c, ZERO_ERROR_DEVICE, "cudaEventRecord after %s: %s", s->tail.what,
                                cudaGetErrorString(e));
    s->mark[i] = s->tail;
    s->count++;
    s->unrecorded = 0;
    return ZERO_OK;
}

/* Lock held. Drops the completed events of s; fails the comm when the oldest unfinished
   collective has been waited for longer than the timeout. Its clock starts when it was
   enqueued, or later, when the previous collective on the stream was seen finished (a
   collective cannot start before it): a deep queue of collectives, each within the timeout,
   does not time out the last one. Other work queued on the stream before a collective is
   not seen, so its time still counts (docs/nccl.md). */
static zero_result zero_nccl__retire(zero_nccl__comm *c, zero_nccl__slot *s, int64_t now)
{
    while (s->count > 0) {
        cudaError_t e = cudaEventQuery(s->ev[s->head]);
        if (e == cudaSuccess) {
            s->head = (s->head + 1) % ZERO_NCCL__RING;
            s->count--;
            if (s->count > 0 && s->mark[s->head].clock_ns < now) s->mark[s->head].clock_ns = now;
            continue;
        }
        if (e != cudaErrorNotReady)
            return zero_nccl__fatal(c, ZERO_ERROR_DEVICE,
                                    "CUDA error while waiting for %s #%llu: %s", s->mark[s->head].what,
                                    (unsigned long long)s->mark[s->head].seq, cudaGetErrorString(e));
        break;
    }
    if (s->count > 0) {
        const zero_nccl__mark *m = &s->mark[s->head];
        if (now - m->clock_ns > (int64_t)c->timeout_ms * 1000000)
            return zero_nccl__fatal(c, ZERO_ERROR_TIMEOUT,
                                    "%s #%llu, enqueued %.1f s ago on stream %p, has not finished "
                                    "within the timeout of %d ms (counted from its enqueue, or from "
                                    "the end of the collective before it): a peer rank did not join it "
                                    "(it crashed, hangs, or issued a different sequence of "
                                    "collectives); the communicator was aborted",
                                    m->what, (unsigned long long)m->seq,
                                    (double)(now - m->issued_ns) * 1e-9, (void *)s->stream,
                                    c->timeout_ms);
    }
    return ZERO_OK;
}

/* Lock held. One look at the comm: NCCL's asynchronous error, every stream's events,
   events for collectives not yet covered. *busy = 1 when collectives are unfinished. */
/* Lock held, not inside an NCCL call. The comm's asynchronous error, if any, as a fatal
   failure (the communicator is aborted); ZERO_OK while it is healthy or still settling. */
static zero_result zero_nccl__async_check(zero_nccl__comm *c)
{
    ncclResult_t state = ncclSuccess, q = ncclCommGetAsyncError(c->nccl, &state);
    if (q != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        char detail[400];
        ncclResult_t bad = q != ncclSuccess ? q : state;
        zero_nccl__detail(c->nccl, bad, detail, sizeof detail);
        return zero_nccl__fatal(c, zero_nccl__map(bad) == ZERO_ERROR_TIMEOUT ? ZERO_ERROR_TIMEOUT
                                                                           : ZERO_ERROR_COMM,
                                "asynchronous NCCL error: %s; the communicator was aborted",
                                detail);
    }
    return ZERO_OK;
}

static zero_result zero_nccl__poll_locked(zero_nccl__comm *c, int *busy)
{
    int64_t now = zero_nccl__now_ns();
    zero_result r;
    int i;
    *busy = 0;
    r = zero_nccl__pending(c);
    if (r != ZERO_OK) return r;
    if (c->in_call) { /* the caller is inside NCCL: no NCCL call here, only the deadline */
        *busy = 1;
        if (now - c->call_start_ns > (int64_t)c->timeout_ms * 1000000)
            return zero_nccl__fatal(c, ZERO_ERROR_TIMEOUT,
                                    "%s has been blocked inside NCCL for %.1f s (timeout %d ms): "
                                    "NCCL waits for a peer rank on the host (with "
                                    "NCCL_RUNTIME_CONNECT=1 the first collective of an algorithm "
                                    "connects; a peer that crashed or hangs never answers); the "
                                    "communicator is aborted when the call returns",
                                    c->call_what, (double)(now - c->call_start_ns) * 1e-9, c->timeout_ms);
    } else if (c->fam->in_call) { /* another comm of the family is inside NCCL: no NCCL call */
        *busy = 1;
    } else if ((r = zero_nccl__async_check(c)) != ZERO_OK) {
        return r;
    }
    for (i = 0; i < ZERO_NCCL__MAX_STREAMS; i++) {
        zero_nccl__slot *s = &c->slots[i];
        if (!s->used) continue;
        r = zero_nccl__retire(c, s, now);
        if (r != ZERO_OK) return r;
        /* events are recorded by the calling thread only (zero_nccl__note), right after
           its collectives: one recorded here, from another thread, could land behind
           unrelated later work on the stream (a false timeout) or inside a graph capture */
        if (s->count > 0 || s->unrecorded > 0) *busy = 1;
    }
    /* Asked again once the work is seen finished: an error raised between the first
       question and the last event's completion (a collective that failed, then let its
       stream go on) would otherwise read as a clean finish. */
    if (!*busy && !c->in_call && !c->fam->in_call) return zero_nccl__async_check(c);
    return ZERO_OK;
}

/* Lock held. The slot of 'stream', taking a free or idle one for a new stream. */
static zero_result zero_nccl__slot_for(zero_nccl__comm *c, cudaStream_t stream, zero_nccl__slot **out)
{
    int i, pick = -1;
    for (i = 0; i < ZERO_NCCL__MAX_STREAMS; i++) {
        zero_nccl__slot *s = &c->slots[i];
        if (s->used && s->stream == stream) {
            *out = s;
            return ZERO_OK;
        }
        if (!s->used && pick < 0) pick = i;
    }
    if (pick < 0) {
        int64_t now = zero_nccl__now_ns();
        for (i = 0; i < ZERO_NCCL__MAX_STREAMS && pick < 0; i++) {
            zero_nccl__slot *s = &c->slots[i];
            zero_result r = zero_nccl__retire(c, s, now);
            if (r != ZERO_OK) return r;
            if (s->count == 0 && s->unrecorded == 0 && s->group_ops == 0) pick = i;
        }
    }
    if (pick < 0)
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "zero_nccl: rank %d/%d: collectives are in flight on %d streams "
                          "already; wait for some (zero_nccl_wait) before using another",
                          c->base.rank, c->base.world, ZERO_NCCL__MAX_STREAMS);
    c->slots[pick].used = 1;
    c->slots[pick].stream = stream;
    c->slots[pick].head = 0;
    c->slots[pick].count = 0;
    c->slots[pick].unrecorded = 0;
    c->slots[pick].group_ops = 0;
    *out = &c->slots[pick];
    return ZERO_OK;
}

/* Lock held. Notes n collectives just enqueued on s: covered by an event at once when
   none is in flight, else every ZERO_NCCL__EVERY; with the ring full, waits (at most the
   timeout) for the oldest event first, which bounds the work NCCL holds per stream. */
static zero_result zero_nccl__note(zero_nccl__comm *c, zero_nccl__slot *s, const char *what, int n)
{
    int spins = 0;
    if (n <= 0) return ZERO_OK;
    if (s->unrecorded == 0) {
        s->tail.issued_ns = s->tail.clock_ns = zero_nccl__now_ns();
        s->tail.seq = c->seq + 1;
        s->tail.what = what;
    }
    s->unrecorded += n;
    c->seq += (uint64_t)n;
    if (s->count > 0 && s->unrecorded < ZERO_NCCL__EVERY) return ZERO_OK;
    while (s->count == ZERO_NCCL__RING) {
        zero_result r = zero_nccl__retire(c, s, zero_nccl__now_ns());
        if (r != ZERO_OK) return r;
        if (s->count < ZERO_NCCL__RING) break;
        pthread_mutex_unlock(c->lock);
        zero_nccl__backoff(&spins);
        pthread_mutex_lock(c->lock);
        if (c->failure != ZERO_OK) return zero_nccl__failed(c);
    }
    return zero_nccl__record(c, s);
}

static const char *zero_nccl__what[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",
                                        "all_to_all"};

/* Lock held on entry and on return. A blocking NCCL call on c->nccl is made WITHOUT the
   lock (in_call set), so the watchdog keeps watching the other streams' events and the
   call's own duration meanwhile; it makes no NCCL call while in_call (the caller's thread
   is the only one inside NCCL on either communicator). With every connection made at init
   the call only enqueues (the 128-per-stream bound keeps NCCL's work queue from filling).
   Back under the lock, an abort that came meanwhile is carried out here. */
static void zero_nccl__call_begin(zero_nccl__comm *c, const char *what)
{
    c->in_call = 1;
    c->fam->in_call++;
    c->call_what = what;
    c->call_start_ns = zero_nccl__now_ns();
    pthread_mutex_unlock(c->lock);
}

/* Lock taken back after the call, without carrying out a pending abort (group_end). */
static void zero_nccl__call_done(zero_nccl__comm *c)
{
    pthread_mutex_lock(c->lock);
    c->in_call = 0;
    c->fam->in_call--;
}

static void zero_nccl__call_end(zero_nccl__comm *c)
{
    zero_nccl__call_done(c);
    if (c->abort_pending && c->in_group == 0 && !c->fam->in_call) {
        c->abort_pending = 0;
        zero_nccl__abort_locked(c);
    }
}

static zero_nccl__comm *zero_nccl__of(zero_comm *comm);

/* Validation shared by the collectives. */
static zero_result zero_nccl__check_args(zero_nccl__comm *c, const char *what, const void *a,
                                         const void *b, size_t numel, size_t scale, zero_dtype dtype,
                                         ncclDataType_t *type)
{
    size_t bytes = 0, esize = zero_dtype_size(dtype);
    switch (dtype) {
    case ZERO_F32: *type = ncclFloat32; break;
    case ZERO_F16: *type = ncclFloat16; break;
    case ZERO_BF16: *type = ncclBfloat16; break;
    case ZERO_F64: *type = ncclFloat64; break;
    default:
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl %s: dtype = %d is not f32, f16, bf16 or f64",
                          what, (int)dtype);
    }
    if (numel > 0 && (!a || !b))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl %s: NULL buffer with numel = %zu",
                          what, numel);
    if (zero__mul_size(numel, scale, &bytes) != 0 || zero__mul_size(bytes, esize, &bytes) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_nccl %s: numel = %zu overflows size_t bytes",
                          what, numel);
    (void)c;
    return ZERO_OK;
}

enum { ZERO_NCCL__AG = 0, ZERO_NCCL__RS = 1, ZERO_NCCL__AR = 2, ZERO_NCCL__BC = 3, ZERO_NCCL__A2A = 4 };

/* all_to_all as NCCL's point-to-point calls in one group (ncclAlltoAll exists only from
   NCCL 2.28; ncclSend/ncclRecv from 2.7, so every NCCL this header supports has them):
   block p of send to rank p, block p of recv from rank p. Every call is made, so that the
   group closes whatever fails; the first failure is returned. */
static ncclResult_t zero_nccl__alltoall(const void *send, void *recv, size_t numel, size_t esize,
                                        ncclDataType_t type, int world, ncclComm_t nc,
                                        cudaStream_t stream)
{
    ncclResult_t nr = ncclGroupStart(), q;
    int p;
    if (nr != ncclSuccess) return nr;
    for (p = 0; p < world; p++) {
        q = ncclSend((const unsigned char *)send + (size_t)p * numel * esize, numel, type, p, nc, stream);
        if (nr == ncclSuccess) nr = q;
        q = ncclRecv((unsigned char *)recv + (size_t)p * numel * esize, numel, type, p, nc, stream);
        if (nr == ncclSuccess) nr = q;
    }
    q = ncclGroupEnd();
    return nr == ncclSuccess ? q : nr;
}

/* Enqueues one collective: under the lock, after the comm's health check, then notes it
   for the watchdog (inside a group: at group_end, when NCCL actually enqueues). */
static zero_result zero_nccl__coll(zero_comm *comm, int kind, const void *send, void *recv,
                                   size_t numel, zero_dtype dtype, zero_op op, int root, void *queue)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    const char *what = zero_nccl__what[kind];
    cudaStream_t stream = (cudaStream_t)queue;
    ncclDataType_t type = ncclFloat32;
    ncclRedOp_t red = ncclSum;
    zero_nccl__slot *s = NULL;
    ncclResult_t nr = ncclSuccess;
    zero_result r;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl %s: comm is not an NCCL comm", what);
    r = zero_nccl__check_args(c, what, send, recv, numel,
                              kind == ZERO_NCCL__AR || kind == ZERO_NCCL__BC ? 1 : (size_t)comm->world,
                              dtype, &type);
    if (r != ZERO_OK) return r;
    if (kind == ZERO_NCCL__A2A && numel > 0) {
        /* check_args proved world * numel * esize fits */
        size_t bytes = numel * (size_t)comm->world * zero_dtype_size(dtype);
        const unsigned char *a = (const unsigned char *)send, *b = (const unsigned char *)recv;
        if (a < b + bytes && b < a + bytes)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_nccl all_to_all: send and recv overlap (%zu bytes each at %p "
                              "and %p): it has no in-place form",
                              bytes, (const void *)a, (const void *)b);
    }
    if (kind == ZERO_NCCL__RS || kind == ZERO_NCCL__AR) {
        if (op == ZERO_OP_SUM) red = ncclSum;
        else if (op == ZERO_OP_MAX) red = ncclMax;
        else return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl %s: op = %d", what, (int)op);
    }
    if (kind == ZERO_NCCL__BC && (root < 0 || root >= comm->world))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl broadcast: root = %d (world %d)",
                          root, comm->world);
    if (stream == cudaStreamPerThread) /* NVIDIA/nccl#1976: another thread's stream there */
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_nccl %s: queue = cudaStreamPerThread names a different stream on "
                          "every thread (NCCL's and the watchdog's included): pass a stream of your own",
                          what);
    pthread_mutex_lock(c->lock);
    r = zero_nccl__pending(c);
    if (r != ZERO_OK) {
        pthread_mutex_unlock(c->lock);
        return r;
    }
    if (numel == 0) { /* every rank has 0 too: nothing to move */
        pthread_mutex_unlock(c->lock);
        return ZERO_OK;
    }
    r = zero_nccl__slot_for(c, stream, &s);
    if (r != ZERO_OK) {
        pthread_mutex_unlock(c->lock);
        return r;
    }
    {
        ncclComm_t nc = c->nccl;
        zero_nccl__call_begin(c, what);
        switch (kind) {
        case ZERO_NCCL__AG: nr = ncclAllGather(send, recv, numel, type, nc, stream); break;
        case ZERO_NCCL__RS: nr = ncclReduceScatter(send, recv, numel, type, red, nc, stream); break;
        case ZERO_NCCL__AR: nr = ncclAllReduce(send, recv, numel, type, red, nc, stream); break;
        case ZERO_NCCL__BC: nr = ncclBroadcast(recv, recv, numel, type, root, nc, stream); break;
        default:
            nr = zero_nccl__alltoall(send, recv, numel, zero_dtype_size(dtype), type, comm->world, nc, stream);
            break;
        }
        zero_nccl__call_end(c);
    }
    if (c->failure != ZERO_OK) r = zero_nccl__failed(c); /* the watchdog aborted meanwhile */
    else r = zero_nccl__settle(c, nr, what, zero_nccl__deadline(c->timeout_ms));
    if (r == ZERO_OK) {
        if (c->in_group) s->group_ops++;
        else r = zero_nccl__note(c, s, what, 1);
    }
    pthread_mutex_unlock(c->lock);
    return r;
}

static zero_result zero_nccl__all_gather(zero_comm *comm, const void *send, void *recv,
                                         size_t send_numel, zero_dtype dtype, void *queue)
{
    return zero_nccl__coll(comm, ZERO_NCCL__AG, send, recv, send_numel, dtype, ZERO_OP_SUM, 0, queue);
}

static zero_result zero_nccl__reduce_scatter(zero_comm *comm, const void *send, void *recv,
                                             size_t recv_numel, zero_dtype dtype, zero_op op,
                                             void *queue)
{
    return zero_nccl__coll(comm, ZERO_NCCL__RS, send, recv, recv_numel, dtype, op, 0, queue);
}

static zero_result zero_nccl__all_reduce(zero_comm *comm, const void *send, void *recv,
                                         size_t numel, zero_dtype dtype, zero_op op, void *queue)
{
    return zero_nccl__coll(comm, ZERO_NCCL__AR, send, recv, numel, dtype, op, 0, queue);
}

static zero_result zero_nccl__broadcast(zero_comm *comm, void *buf, size_t numel, zero_dtype dtype,
                                        int root, void *queue)
{
    return zero_nccl__coll(comm, ZERO_NCCL__BC, buf, buf, numel, dtype, ZERO_OP_SUM, root, queue);
}

static zero_result zero_nccl__all_to_all(zero_comm *comm, const void *send, void *recv,
                                         size_t numel, zero_dtype dtype, void *queue)
{
    return zero_nccl__coll(comm, ZERO_NCCL__A2A, send, recv, numel, dtype, ZERO_OP_SUM, 0, queue);
}

static zero_result zero_nccl__group_start(zero_comm *comm)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    zero_result r = ZERO_OK;
    ncclResult_t nr;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl group_start: comm is not an NCCL comm");
    pthread_mutex_lock(c->lock);
    r = zero_nccl__pending(c);
    if (r == ZERO_OK) {
        nr = ncclGroupStart();
        if (nr != ncclSuccess) {
            char detail[400];
            zero_nccl__detail(c->nccl, nr, detail, sizeof detail);
            r = zero__fail(zero_nccl__map(nr), "zero_nccl: rank %d/%d: ncclGroupStart failed: %s",
                           comm->rank, comm->world, detail);
        } else {
            c->in_group++;
        }
    }
    pthread_mutex_unlock(c->lock);
    return r;
}

static zero_result zero_nccl__group_end(zero_comm *comm)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    zero_result r = ZERO_OK;
    ncclResult_t nr;
    int i;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl group_end: comm is not an NCCL comm");
    pthread_mutex_lock(c->lock);
    if (c->in_group == 0) {
        r = c->failure != ZERO_OK
                ? zero_nccl__failed(c)
                : zero__fail(ZERO_ERROR_INVALID_STATE, "zero_nccl group_end: no group_start");
        pthread_mutex_unlock(c->lock);
        return r;
    }
    if (c->in_group == 1) { /* the outermost end launches: blocking, without the lock */
        zero_nccl__call_begin(c, "ncclGroupEnd");
        nr = ncclGroupEnd(); /* even after a failure: NCCL's group must be closed */
        zero_nccl__call_done(c);
    } else {
        nr = ncclGroupEnd();
    }
    c->in_group--;
    if (c->in_group > 0) { /* nested: the outermost end enqueues */
        r = c->failure != ZERO_OK ? zero_nccl__failed(c) : zero_nccl__settle(c, nr, "ncclGroupEnd", zero_nccl__deadline(c->timeout_ms));
        pthread_mutex_unlock(c->lock);
        return r;
    }
    if (c->abort_pending || c->failure != ZERO_OK) {
        c->abort_pending = 0;
        zero_nccl__abort_locked(c);
        r = zero_nccl__failed(c);
        pthread_mutex_unlock(c->lock);
        return r;
    }
    r = zero_nccl__settle(c, nr, "ncclGroupEnd", zero_nccl__deadline(c->timeout_ms));
    for (i = 0; i < ZERO_NCCL__MAX_STREAMS; i++) {
        zero_nccl__slot *s = &c->slots[i];
        int n = s->group_ops;
        s->group_ops = 0;
        if (r == ZERO_OK && n > 0) r = zero_nccl__note(c, s, "grouped collectives", n);
    }
    pthread_mutex_unlock(c->lock);
    return r;
}

/* Lock not held. Polls until nothing is unfinished or the deadline (then aborts). */
static zero_result zero_nccl__wait_until(zero_nccl__comm *c, int64_t deadline, const char *what)
{
    int spins = 0;
    zero_result r;
    pthread_mutex_lock(c->lock);
    for (;;) {
        int busy = 0;
        if (c->in_group) {
            r = zero__fail(ZERO_ERROR_INVALID_STATE, "zero_nccl %s: inside a group (group_end first)",
                           what);
            break;
        }
        r = zero_nccl__poll_locked(c, &busy);
        if (r != ZERO_OK || !busy) break;
        if (zero_nccl__now_ns() >= deadline) {
            r = zero_nccl__fatal(c, ZERO_ERROR_TIMEOUT,
                                 "%s: collectives still unfinished at the deadline: a peer rank "
                                 "did not join them (it crashed, hangs, or issued a different "
                                 "sequence of collectives); the communicator was aborted",
                                 what);
            break;
        }
        pthread_mutex_unlock(c->lock);
        zero_nccl__backoff(&spins);
        pthread_mutex_lock(c->lock);
    }
    pthread_mutex_unlock(c->lock);
    return r;
}

static zero_result zero_nccl__barrier(zero_comm *comm)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    zero_result r;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl barrier: comm is not an NCCL comm");
    r = zero_nccl__wait_until(c, zero_nccl__deadline(c->timeout_ms), "barrier");
    if (r != ZERO_OK) return r;
    r = zero_nccl__coll(comm, ZERO_NCCL__AR, c->scratch, c->scratch, 1, ZERO_F32, ZERO_OP_SUM, 0,
                        (void *)c->internal);
    if (r != ZERO_OK) return r;
    return zero_nccl__wait_until(c, zero_nccl__deadline(c->timeout_ms), "barrier");
}

static void *zero_nccl__watchdog_main(void *arg)
{
    zero_nccl__comm *c = (zero_nccl__comm *)arg;
    (void)cudaSetDevice(c->device); /* events carry their device; this is for clarity */
    pthread_mutex_lock(c->lock);
    while (!c->stop) {
        struct timespec ts;
        int64_t t;
        int busy = 0;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t = (int64_t)ts.tv_nsec + (int64_t)c->poll_ms * 1000000;
        ts.tv_sec += (time_t)(t / 1000000000);
        ts.tv_nsec = (long)(t % 1000000000);
        (void)pthread_cond_timedwait(&c->cond, c->lock, &ts);
        if (c->stop) break;
        if (c->failure == ZERO_OK && c->nccl) (void)zero_nccl__poll_locked(c, &busy);
    }
    pthread_mutex_unlock(c->lock);
    return NULL;
}

static void zero_nccl__destroy(zero_comm *comm);
static zero_result zero_nccl__split(zero_comm *comm, int color, int key, zero_comm **out);

static const zero_comm_ops zero_nccl__ops = {
    "nccl",
    zero_nccl__destroy,
    zero_nccl__all_gather,
    zero_nccl__reduce_scatter,
    zero_nccl__all_reduce,
    zero_nccl__broadcast,
    zero_nccl__barrier,
    zero_nccl__group_start,
    zero_nccl__group_end,
    zero_nccl__all_to_all,
    zero_nccl__split,
};

/* Frees what create made, in reverse; the NCCL comm must be gone. */
static void zero_nccl__free(zero_nccl__comm *c)
{
    int i, k;
    if (c->slots_ready) {
        for (i = 0; i < ZERO_NCCL__MAX_STREAMS; i++)
            for (k = 0; k < ZERO_NCCL__RING; k++)
                if (c->slots[i].ev[k]) (void)cudaEventDestroy(c->slots[i].ev[k]);
    }
    if (c->internal) (void)cudaStreamDestroy(c->internal);
    if (c->scratch) (void)cudaFree(c->scratch);
    if (c->cond_ready) pthread_cond_destroy(&c->cond);
    if (c->fam) { /* the last comm of the family frees it */
        zero_nccl__family *fam = c->fam;
        int last;
        pthread_mutex_lock(&fam->lock);
        last = --fam->refs == 0;
        pthread_mutex_unlock(&fam->lock);
        if (last) {
            pthread_mutex_destroy(&fam->lock);
            zero__free(&fam->allocator, fam);
        }
    }
    zero__free(&c->allocator, c);
}

/* A comm without its NCCL communicators: the host state, the watchdog's events, the barrier's
   stream and scratch, on the current CUDA device; in 'fam' (NULL: a new family). On error
   nothing is left and zero_last_error() says why ('fn' names the caller). */
static zero_result zero_nccl__new(const zero_allocator *allocator, int device, int timeout, int rank,
                                  int world, zero_nccl__family *fam, const char *fn,
                                  zero_nccl__comm **out)
{
    zero_nccl__comm *c;
    pthread_condattr_t attr;
    cudaError_t e;
    int i, k;
    *out = NULL;
    c = (zero_nccl__comm *)zero__alloc(allocator, sizeof *c);
    if (!c) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: out of memory", fn);
    memset(c, 0, sizeof *c);
    c->allocator = *allocator;
    c->device = device;
    c->timeout_ms = timeout;
    c->poll_ms = timeout / 20 < 1 ? 1 : (timeout / 20 > 100 ? 100 : timeout / 20);
    c->base.ops = &zero_nccl__ops;
    c->base.impl = c;
    c->base.rank = rank;
    c->base.world = world;
    if (fam) {
        pthread_mutex_lock(&fam->lock);
        fam->refs++;
        pthread_mutex_unlock(&fam->lock);
    } else {
        fam = (zero_nccl__family *)zero__alloc(allocator, sizeof *fam);
        if (!fam) {
            zero_nccl__free(c);
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: out of memory", fn);
        }
        memset(fam, 0, sizeof *fam);
        fam->allocator = *allocator;
        fam->refs = 1;
        if (pthread_mutex_init(&fam->lock, NULL) != 0) {
            zero__free(allocator, fam);
            zero_nccl__free(c);
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: pthread_mutex_init failed", fn);
        }
    }
    c->fam = fam;
    c->lock = &fam->lock;
    if (pthread_condattr_init(&attr) != 0) {
        zero_nccl__free(c);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: pthread_condattr_init failed", fn);
    }
    if (pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) != 0 || pthread_cond_init(&c->cond, &attr) != 0) {
        pthread_condattr_destroy(&attr);
        zero_nccl__free(c);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: pthread_cond_init failed", fn);
    }
    pthread_condattr_destroy(&attr);
    c->cond_ready = 1;

    c->slots_ready = 1;
    for (i = 0; i < ZERO_NCCL__MAX_STREAMS; i++)
        for (k = 0; k < ZERO_NCCL__RING; k++) {
            e = cudaEventCreateWithFlags(&c->slots[i].ev[k], cudaEventDisableTiming);
            if (e != cudaSuccess) {
                c->slots[i].ev[k] = NULL;
                zero_nccl__free(c);
                return zero__fail(ZERO_ERROR_DEVICE, "%s: cudaEventCreate: %s", fn, cudaGetErrorString(e));
            }
        }
    e = cudaStreamCreateWithFlags(&c->internal, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->scratch, 256);
    if (e == cudaSuccess) e = cudaMemsetAsync(c->scratch, 0, 256, c->internal); /* the barrier's stream */
    if (e != cudaSuccess) {
        zero_nccl__free(c);
        return zero__fail(ZERO_ERROR_DEVICE, "%s: stream or scratch: %s", fn, cudaGetErrorString(e));
    }
    *out = c;
    return ZERO_OK;
}

/* Starts the comm's watchdog unless it has none; on failure aborts and frees the comm. */
static zero_result zero_nccl__start(zero_nccl__comm *c, const char *fn)
{
    if (c->no_watchdog) return ZERO_OK;
    if (pthread_create(&c->watchdog, NULL, zero_nccl__watchdog_main, c) != 0) {
        pthread_mutex_lock(c->lock);
        zero_nccl__abort_locked(c);
        pthread_mutex_unlock(c->lock);
        zero_nccl__free(c);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: cannot start the watchdog thread", fn);
    }
    c->watchdog_running = 1;
    return ZERO_OK;
}

static void zero_nccl__destroy(zero_comm *comm)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    int64_t deadline;
    int healthy;
    if (!c) return;
    deadline = zero_nccl__deadline(c->timeout_ms);
    pthread_mutex_lock(c->lock); /* the watchdog may be writing these */
    healthy = c->failure == ZERO_OK && c->nccl && c->in_group == 0;
    pthread_mutex_unlock(c->lock);
    if (healthy) (void)zero_nccl__wait_until(c, deadline, "destroy");
    /* The blocking child's finalize has no deadline of its own, but once every collective
       of this rank has finished (above) it waits for no peer: it syncs NCCL's internal
       streams and drops its share of the proxy, which the parent owns. The parent's
       finalize, which flushes the proxy, is polled with a deadline below. */
    pthread_mutex_lock(c->lock);
    if (c->failure == ZERO_OK && c->nccl && c->in_group == 0) {
        ncclComm_t child = c->nccl;
        ncclResult_t nr;
        zero_nccl__call_begin(c, "ncclCommFinalize");
        nr = ncclCommFinalize(child);
        zero_nccl__call_end(c);
        if (c->failure == ZERO_OK && nr == ncclSuccess && c->nccl == child) {
            (void)ncclCommDestroy(child); /* finalized: frees locally, without blocking */
            c->nccl = NULL;
        }
    }
    pthread_mutex_unlock(c->lock);
    if (c->watchdog_running) {
        pthread_mutex_lock(c->lock);
        c->stop = 1;
        pthread_cond_signal(&c->cond);
        pthread_mutex_unlock(c->lock);
        pthread_join(c->watchdog, NULL);
        c->watchdog_running = 0;
    }
    pthread_mutex_lock(c->lock);
    if (c->in_group && (c->nccl || c->parent)) { /* group_end never came: close NCCL's group, give up */
        while (c->in_group > 0) {
            (void)ncclGroupEnd();
            c->in_group--;
        }
        (void)zero_nccl__fatal(c, ZERO_ERROR_INVALID_STATE, "destroyed inside a group");
    }
    if (!c->nccl && c->parent && c->failure == ZERO_OK) {
        /* the non-blocking parent: finalize polled with a deadline (settle works on c->nccl) */
        ncclResult_t nr;
        zero_result r;
        c->nccl = c->parent;
        c->parent = NULL;
        nr = ncclCommFinalize(c->nccl);
        r = zero_nccl__settle(c, nr, "ncclCommFinalize", zero_nccl__deadline(c->timeout_ms));
        if (r == ZERO_OK && c->nccl) {
            (void)ncclCommDestroy(c->nccl);
            c->nccl = NULL;
        }
    }
    zero_nccl__abort_locked(c); /* whatever is left after a failure */
    pthread_mutex_unlock(c->lock);
    zero_nccl__free(c);
}


static zero_nccl__comm *zero_nccl__of(zero_comm *comm)
{
    if (!comm || comm->ops != &zero_nccl__ops) return NULL;
    return (zero_nccl__comm *)comm->impl;
}

ZERODEF int zero_nccl_is(const zero_comm *comm)
{
    return comm && comm->ops == &zero_nccl__ops;
}

ZERODEF int zero_nccl_version(void)
{
    int v = 0;
    if (ncclGetVersion(&v) != ncclSuccess) return 0;
    return v;
}

ZERODEF zero_result zero_nccl_unique_id(void *id)
{
    ncclUniqueId uid;
    ncclResult_t nr;
    if (!id) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl_unique_id: id is NULL");
    nr = ncclGetUniqueId(&uid);
    if (nr != ncclSuccess) {
        char detail[400];
        zero_nccl__detail(NULL, nr, detail, sizeof detail);
        return zero__fail(ZERO_ERROR_COMM, "zero_nccl_unique_id: ncclGetUniqueId failed: %s", detail);
    }
    memcpy(id, &uid, sizeof uid);
    return ZERO_OK;
}

ZERODEF zero_result zero_nccl_select_device(const zero_bootstrap_desc *boot, int *out_device)
{
    int n = 0, idx = 0, dev;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice || (e == cudaSuccess && n <= 0))
        return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_nccl_select_device: no CUDA device visible");
    if (e != cudaSuccess)
        return zero__fail(ZERO_ERROR_DEVICE, "zero_nccl_select_device: cudaGetDeviceCount: %s",
                          cudaGetErrorString(e));
    if (boot) idx = boot->local_rank >= 0 ? boot->local_rank : boot->rank;
    if (idx < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl_select_device: rank %d", idx);
    dev = idx % n;
    e = cudaSetDevice(dev);
    if (e != cudaSuccess)
        return zero__fail(ZERO_ERROR_DEVICE, "zero_nccl_select_device: cudaSetDevice(%d): %s", dev,
                          cudaGetErrorString(e));
    if (out_device) *out_device = dev;
    return ZERO_OK;
}

static zero_result zero_nccl__timeout(const zero_nccl_desc *desc, int *out)
{
    if (desc->timeout_ms < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl_create: timeout_ms = %d (must be >= 0)",
                          desc->timeout_ms);
    *out = ZERO_NCCL_DEFAULT_TIMEOUT_MS;
    if (desc->timeout_ms > 0) {
        *out = desc->timeout_ms;
    } else {
        int have = 0;
        zero_result r = zero_nccl__env_int(zero_nccl__getenv, NULL, "ZERO_NCCL_TIMEOUT_MS", 1,
                                           INT_MAX, out, &have);
        if (r != ZERO_OK) return r;
    }
    return ZERO_OK;
}

/* The id, rank and world: given, or from the bootstrap (ncclGetUniqueId on rank 0). */
static zero_result zero_nccl__get_id(const zero_nccl_desc *desc, ncclUniqueId *id, int *rank, int *world)
{
    zero_bootstrap_desc boot;
    zero_result r;
    if (desc->unique_id) {
        if (desc->world < 1 || desc->rank < 0 || desc->rank >= desc->world)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_nccl_create: rank %d of world %d (with unique_id both are "
                              "required)",
                              desc->rank, desc->world);
        memcpy(id, desc->unique_id, sizeof *id);
        *rank = desc->rank;
        *world = desc->world;
        return ZERO_OK;
    }
    if (desc->bootstrap) {
        boot = *desc->bootstrap;
    } else {
        r = zero_bootstrap_env(&boot);
        if (r != ZERO_OK) return r;
    }
    if ((desc->world != 0 && desc->world != boot.world) || (desc->world != 0 && desc->rank != boot.rank) ||
        (desc->world == 0 && desc->rank != 0))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_nccl_create: rank %d / world %d disagree with the bootstrap's "
                          "rank %d / world %d (leave them 0)",
                          desc->rank, desc->world, boot.rank, boot.world);
    memset(id, 0, sizeof *id);
    if (boot.rank == 0) {
        r = zero_nccl_unique_id(id);
        if (r != ZERO_OK) return r;
    }
    if (boot.world > 1) {
        r = zero_bootstrap_exchange(&boot, id, sizeof *id);
        if (r != ZERO_OK) return r;
    }
    *rank = boot.rank;
    *world = boot.world;
    return ZERO_OK;
}

ZERODEF zero_result zero_nccl_create(const zero_nccl_desc *desc, zero_comm **out)
{
    zero_nccl__comm *c;
    ncclUniqueId id;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t nr;
    cudaError_t e;
    zero_result r;
    int rank = 0, world = 1, timeout = 0, device = 0;

    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl_create: out is NULL");
    *out = NULL;
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl_create: desc is NULL");
    if ((desc->allocator.alloc == NULL) != (desc->allocator.free == NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_nccl_create: allocator needs both alloc and free, or neither");
    r = zero_nccl__timeout(desc, &timeout);
    if (r != ZERO_OK) return r;
    zero_nccl__connect_at_init(); /* before NCCL's first look at its environment */
    e = cudaGetDevice(&device);
    if (e != cudaSuccess)
        return zero__fail(ZERO_ERROR_DEVICE, "zero_nccl_create: cudaGetDevice: %s", cudaGetErrorString(e));
    r = zero_nccl__get_id(desc, &id, &rank, &world);
    if (r != ZERO_OK) return r;

    r = zero_nccl__new(&desc->allocator, device, timeout, rank, world, NULL, "zero_nccl_create", &c);
    if (r != ZERO_OK) return r;
    c->no_watchdog = desc->disable_watchdog != 0;
    c->name = desc->name;

    cfg.blocking = 0; /* every call returns; we poll with deadlines */
    cfg.splitShare = 1; /* NCCL reads it on the parent when splitting: the child shares */
    if (desc->name) cfg.commName = desc->name;
    pthread_mutex_lock(c->lock);
    nr = ncclCommInitRankConfig(&c->nccl, world, id, rank, &cfg);
    if (nr != ncclSuccess && nr != ncclInProgress) {
        char detail[400];
        zero_nccl__detail(c->nccl, nr, detail, sizeof detail);
        if (c->nccl) (void)ncclCommAbort(c->nccl);
        c->nccl = NULL;
        pthread_mutex_unlock(c->lock);
        zero_nccl__free(c);
        return zero__fail(zero_nccl__map(nr),
                          "zero_nccl_create: rank %d/%d: ncclCommInitRankConfig failed: %s%s", rank,
                          world, detail,
                          nr == ncclInvalidUsage && zero_nccl_version() < ZERO_NCCL_MULTI_RANK_GPU_VERSION
                              ? " (several ranks on one GPU need NCCL >= 2.30 and "
                                "NCCL_MULTI_RANK_GPU_ENABLE=1)"
                              : "");
    }
    r = zero_nccl__settle(c, nr, "ncclCommInitRankConfig", zero_nccl__deadline(timeout));
    if (r == ZERO_OK) {
        /* The collectives' communicator: a blocking child of the non-blocking one, sharing
           its resources (splitShare: no second set of buffers) and its abort flag. On a
           non-blocking communicator NCCL >= 2.23 runs every ncclGroupEnd, the implicit one
           of each collective included, on a new thread and returns ncclInProgress; on a
           blocking one a collective is enqueued by the calling thread and returns. The
           split runs in the background under the non-blocking parent: split_wait polls the
           parent, and the child handle exists only once it has finished. */
        ncclConfig_t ccfg = NCCL_CONFIG_INITIALIZER;
        ccfg.blocking = 1;
        ccfg.splitShare = 1;
        if (desc->name) ccfg.commName = desc->name;
        c->parent = c->nccl;
        c->nccl = NULL;
        nr = ncclCommSplit(c->parent, 0, rank, &c->nccl, &ccfg);
        r = zero_nccl__split_wait(c, nr, zero_nccl__deadline(timeout),
                                  "ncclCommSplit (the blocking communicator)", &c->nccl, 1, 0);
    }
    pthread_mutex_unlock(c->lock);
    if (r != ZERO_OK) { /* settle aborted the communicator; zero_last_error has why */
        char text[640];
        snprintf(text, sizeof text, "%.560s%s", zero_last_error(),
                 /* NCCL finds a duplicate GPU during the (asynchronous) init, not at the call */
                 r == ZERO_ERROR_INVALID_STATE && zero_nccl_version() < ZERO_NCCL_MULTI_RANK_GPU_VERSION
                     ? " (several ranks on one GPU need NCCL >= 2.30 and NCCL_MULTI_RANK_GPU_ENABLE=1)"
                     : "");
        pthread_mutex_lock(c->lock); /* a split refused synchronously left both alive */
        zero_nccl__abort_locked(c);
        pthread_mutex_unlock(c->lock);
        zero_nccl__free(c);
        return zero__fail(r, "%s", text);
    }

    r = zero_nccl__start(c, "zero_nccl_create");
    if (r != ZERO_OK) return r;
    *out = &c->base;
    return ZERO_OK;
}

/* zero_comm_ops.split. COLLECTIVE over comm. Two splits, each polled and bounded by the
   comm's timeout as create's are: the comm's non-blocking communicator splits by color and
   key into the new comm's non-blocking one (NCCL_SPLIT_NOCOLOR for color < 0: no comm, and
   *out = NULL), which then splits (every rank color 0, key 0: the same order) into its
   blocking communicator for the collectives. Both share NCCL's resources with the comm
   (splitShare, set on every communicator of the family), and its abort flag: the new comm
   joins the comm's family (zero_nccl__family). NCCL orders the new ranks by key, ties by
   the rank in comm (the zero_comm_ops contract). A failure of the first split fails comm
   (a peer that never joins it times out like a collective that never completes); a
   failure after it fails only the new comm, which is then freed; the family's shared abort
   flag then fails the others at their next call. */
static zero_result zero_nccl__split(zero_comm *comm, int color, int key, zero_comm **out)
{
    const char *fn = "zero_nccl split";
    zero_nccl__comm *c = zero_nccl__of(comm), *n = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER, ccfg = NCCL_CONFIG_INITIALIZER;
    ncclComm_t sub = NULL;
    ncclResult_t nr;
    zero_result r;
    cudaError_t e;
    int cur = -1, rank = -1, world = 0;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: comm is not an NCCL comm", fn);
    e = cudaGetDevice(&cur); /* the new comm's events, stream and scratch: on comm's device */
    if (e == cudaSuccess && cur != c->device) e = cudaSetDevice(c->device);
    if (e != cudaSuccess) {
        r = zero__fail(ZERO_ERROR_DEVICE, "%s: cudaSetDevice(%d): %s", fn, c->device, cudaGetErrorString(e));
        cur = -1;
        goto restore;
    }
    if (color >= 0) {
        r = zero_nccl__new(&c->allocator, c->device, c->timeout_ms, 0, 1, c->fam, fn, &n);
        if (r != ZERO_OK) goto restore; /* the peers time out in their split */
        n->no_watchdog = c->no_watchdog;
        n->name = c->name;
    }
    pthread_mutex_lock(c->lock);
    r = zero_nccl__pending(c);
    if (r == ZERO_OK && c->in_group)
        r = zero__fail(ZERO_ERROR_INVALID_STATE, "%s: inside a group (group_end first)", fn);
    if (r == ZERO_OK) {
        cfg.blocking = 0;
        cfg.splitShare = 1;
        if (c->name) cfg.commName = c->name;
        nr = ncclCommSplit(c->parent, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, &sub, &cfg);
        r = zero_nccl__split_wait(c, nr, zero_nccl__deadline(c->timeout_ms),
                                  "ncclCommSplit (a sub-communicator)", &sub, color >= 0,
                                  c->watchdog_running);
    }
    if (sub && n) { /* n owns it from here: its abort, or its destroy */
        n->parent = sub;
        sub = NULL;
    }
    if (r == ZERO_OK && n) {
        nr = ncclCommUserRank(n->parent, &rank);
        if (nr == ncclSuccess) nr = ncclCommCount(n->parent, &world);
        if (nr != ncclSuccess || rank < 0 || world < 1 || rank >= world) {
            char detail[400];
            zero_nccl__detail(n->parent, nr, detail, sizeof detail);
            r = zero_nccl__fatal(n, nr != ncclSuccess ? zero_nccl__map(nr) : ZERO_ERROR_COMM,
                                 "%s: ncclCommUserRank / ncclCommCount: rank %d of %d (%s)", fn, rank,
                                 world, detail);
        } else {
            n->base.rank = rank;
            n->base.world = world;
            ccfg.blocking = 1;
            ccfg.splitShare = 1;
            if (c->name) ccfg.commName = c->name;
            nr = ncclCommSplit(n->parent, 0, 0, &n->nccl, &ccfg);
            r = zero_nccl__split_wait(n, nr, zero_nccl__deadline(c->timeout_ms),
                                      "ncclCommSplit (the sub-communicator's blocking one)", &n->nccl, 1, 0);
        }
    }
    if (n && r != ZERO_OK) zero_nccl__abort_locked(n); /* what is left of it, parent first */
    pthread_mutex_unlock(c->lock);
    if (n && r != ZERO_OK) {
        zero_nccl__free(n);
        n = NULL;
    }
    if (n) {
        r = zero_nccl__start(n, fn); /* frees n on failure */
        if (r != ZERO_OK) n = NULL;
    }
    if (r == ZERO_OK) *out = n ? &n->base : NULL;
restore:
    if (cur >= 0 && cur != c->device) (void)cudaSetDevice(cur);
    return r;
}

ZERODEF zero_result zero_nccl_wait(zero_comm *comm, int timeout_ms)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl_wait: comm is not an NCCL comm");
    if (timeout_ms < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl_wait: timeout_ms = %d", timeout_ms);
    return zero_nccl__wait_until(c, zero_nccl__deadline(timeout_ms ? timeout_ms : c->timeout_ms),
                                 "zero_nccl_wait");
}

ZERODEF zero_result zero_nccl_status(zero_comm *comm)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    zero_result r;
    int busy = 0;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl_status: comm is not an NCCL comm");
    pthread_mutex_lock(c->lock);
    r = zero_nccl__poll_locked(c, &busy);
    pthread_mutex_unlock(c->lock);
    return r;
}

ZERODEF zero_result zero_nccl_abort(zero_comm *comm)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_nccl_abort: comm is not an NCCL comm");
    pthread_mutex_lock(c->lock);
    (void)zero_nccl__fatal(c, ZERO_ERROR_COMM, "the communicator was aborted (zero_nccl_abort)");
    pthread_mutex_unlock(c->lock);
    return ZERO_OK;
}

ZERODEF void *zero_nccl_handle(zero_comm *comm)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    return c ? (void *)c->nccl : NULL;
}

ZERODEF void zero_nccl_lock(zero_comm *comm)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    if (c) pthread_mutex_lock(c->lock);
}

ZERODEF void zero_nccl_unlock(zero_comm *comm)
{
    zero_nccl__comm *c = zero_nccl__of(comm);
    if (c) pthread_mutex_unlock(c->lock);
}
#endif /* ZERO_NCCL_BOOTSTRAP_ONLY */

#ifdef __cplusplus
}
#endif

#endif /* ZERO_NCCL_IMPLEMENTATION */
