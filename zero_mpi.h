/* zero_mpi.h - the MPI communicator for zero.h: ZeRO across processes and nodes.

   WHAT IT IS
   An add-on header for zero.h (include zero.h first). It gives the engine a zero_comm whose
   ranks are the processes of an MPI communicator (mpirun, srun), one ZeRO rank per process,
   on host memory (device memory where the MPI library is CUDA-aware). Its reductions equal
   the local comm's bit for bit (rank order 0..N-1, fp32 accumulation, one rounding), so a
   run under mpirun gives the same parameters as the same run on N threads. It also passes
   NCCL's unique id with an MPI broadcast (zero_mpi_nccl_unique_id) for programs that
   already run under mpirun.

   Do this in the one file that defines ZERO_IMPLEMENTATION, after it:

       #define ZERO_IMPLEMENTATION
       #include "zero.h"
       #define ZERO_MPI_IMPLEMENTATION
       #include "zero_mpi.h"

   and compile it with mpicc (or any C/C++ compiler given MPI's include path and library).
   Every other file includes "zero.h" and "zero_mpi.h" without the defines.

   A RANK'S PROGRAM (mpirun -np 4 ./train)
       MPI_Init(&argc, &argv);
       zero_mpi_desc md = {0};               // zero = MPI_COMM_WORLD, 60 s timeout
       zero_comm *comm;
       zero_mpi_create(&md, &comm);          // collective over the MPI communicator
       ... engine_desc.comm = comm; rank = comm->rank, world = comm->world ...
       zero_comm_destroy(comm);              // collective when healthy (see LEAVING)
       MPI_Finalize();

   HOW A COLLECTIVE RUNS (docs/mpi.md has the whole protocol and its cost)
       1. Packet round: every rank sends every peer one packet, the call's signature (12
          fields in 56 bytes: kind, dtype, count, op, root, this comm's own sequence
          number, an invalid-arguments flag, the caller's zero_comm_tag: role, group, seq,
          count)
          followed, for a small collective, by this rank's data for that peer. Where every
          rank of the comm runs on one node, packets go through shared memory of the
          comm's own (a /dev/shm file every rank maps at create; the sender writes into
          the peer's inbox slot, a flag last; up to ZERO_MPI_INLINE_BYTES_SHM, 16 KiB, of
          data per peer, 64 KiB where some node runs more ranks than cores); elsewhere, or built with ZERO_MPI_SHM 0, as MPI messages (at
          most ZERO_MPI_INLINE_BYTES, 3488 bytes, per peer, so a packet stays an eager
          message; 64 KiB where some node runs more ranks than cores). A slot or receive
          holds the largest packet, so a peer that called something else is read whole,
          never truncated. Every
          rank then holds every signature: on disagreement every rank returns
          ZERO_ERROR_MISMATCH with the same sentence naming the first rank that differs
          from rank 0; nothing is written.
       2. The result. Small: from the packets (an all_reduce whose buffer fits a packet
          sends all of it while (N-1) x its bytes <= 64 KiB, and every rank sums all of it;
          else slices, then a gather round of the reduced slices). Larger: a data round,
          point to point from the caller's buffers into the caller's buffers (MPI_Isend /
          MPI_Irecv of at most 1 GiB each):
            all_gather      each rank sends its block to every peer
            reduce_scatter  rank p receives block p of every peer's send (an all-to-all),
                            then sums them in rank order 0..N-1 in fp32 and rounds once
            all_to_all      the same blocks, copied (no sum)
            all_reduce      the same on slice p of the buffer, then an all-gather of slices
                            (or, while (N-1) x bytes <= 64 KiB, the whole buffer to every
                            peer and every rank sums all of it: one round)
            broadcast       the root sends to every peer
            barrier         the packet round alone
          Traffic per rank is (N-1)/N of the buffer for all_gather and reduce_scatter, and
          2 (N-1)/N for all_reduce, as the engine counts it (the one-round all_reduce
          sends the whole buffer to each peer). MPI_SUM is never used (its
          order is unspecified and MPI has no fp16 / bf16).
       Every op speaks this protocol, all_to_all (blocks as reduce_scatter's, no sum) and
       the comms zero_comm_split makes included (each its own communicator, collective
       numbers and packets). Every wait polls (MPI_Testsome, or the packets' flags in
       shared memory) against the collective's
       deadline (timeout_ms from the first clock check of its waits, microseconds after
       its start): nothing blocks longer. It spins for
       ZERO_MPI_SPIN_MS (2 ms; define it before the implementation to change it), yielding
       the core between polls only when the node runs more ranks than it has cores (as
       Open MPI's own waits do), then sleeps 50 us between polls, so a rank waiting for a
       much slower peer leaves it the core.

   FAILURE
       TIMEOUT   a collective not complete by its deadline returns ZERO_ERROR_TIMEOUT and
                 breaks the comm; with abort_on_timeout set the process calls MPI_Abort
                 instead of returning. The rank first tells every peer it gave up (a
                 message, and a record in the shared memory where there is one), so a
                 peer that joins after the deadline returns TIMEOUT too: in that
                 collective, or (when MPI delivered the message after the packets, and
                 the collective completed from the packets already sent, with every
                 rank's data) at once in its next call. The timed-out MPI requests cannot be cancelled: the
                 buffers of that call may still be written by MPI, and the comm's scratch and
                 duplicated communicator are then never freed. After a timeout the sensible thing is to end the job.
       MISMATCH  ranks called different collectives (or the same with different arguments
                 or tags): every rank returns ZERO_ERROR_MISMATCH naming both calls; a rank
                 whose own arguments were invalid returns ZERO_ERROR_INVALID_ARGUMENT. The
                 comm stays usable (when the ranks' sequences agree again).
       COMM      an MPI call failed (MPI's error string kept), or a peer left (destroyed its
                 comm) or called zero_mpi_abort() while this rank was in a collective: every
                 rank in that collective returns ZERO_ERROR_COMM and the comm is broken.
       A broken comm fails every later collective at once with the first cause.

   LEAVING
       zero_comm_destroy() on a healthy comm runs one last packet round (kind "leave",
       bounded by timeout_ms), so a rank that leaves early (an error in its own code) makes
       its peers' next collective fail with ZERO_ERROR_COMM at once instead of waiting for
       the timeout; when every rank leaves together it is a barrier. On a broken comm it
       only frees.

   THREADS
       One thread uses a comm at a time. MPI_THREAD_FUNNELED is enough when that is the
       thread that initialised MPI; otherwise initialise MPI with MPI_THREAD_SERIALIZED.

   DEVICE MEMORY
       With desc.device set, buffers are that device's memory: the comm waits for the
       device's comm queue, hands the pointers to MPI (which must then be CUDA-aware for
       GPU memory: zero_mpi_cuda_aware(); zero_mpi_create fails otherwise), and reduces
       on the host after downloading the received blocks (uploading the result). With the
       host device this path runs anywhere (the tests use it); on GPUs it is compiled
       but not verified (docs/mpi.md).

   LICENSE: MIT, see the end of zero.h.
*/
#ifndef ZERO_H
#error "zero_mpi.h: include zero.h before zero_mpi.h"
#endif

#ifndef ZERO_MPI_H
#define ZERO_MPI_H

/* MPI's deprecated C++ bindings are not needed (and not -Wpedantic clean) */
#if defined(__cplusplus) && !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX 1
#endif
#if defined(__cplusplus) && !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================================
   MPI comm: one ZeRO rank per MPI process, reductions bit-identical to the local comm.
   ====================================================================================== */

#define ZERO_MPI_DEFAULT_TIMEOUT_MS 60000

/* Zero means default. */
typedef struct zero_mpi_desc {
    MPI_Comm comm;            /* the ranks; all-zero bytes = MPI_COMM_WORLD. Duplicated at
                                 create, so the caller's communicator carries none of the
                                 comm's messages and may be freed afterwards                 */
    int timeout_ms;           /* per collective, from its first poll; 0 = 60000             */
    int abort_on_timeout;     /* 1: MPI_Abort(comm, 1) on a timeout instead of returning    */
    zero_device *device;      /* NULL: buffers are host memory; else this device's memory
                                 (not owned; outlives the comm)                            */
    zero_allocator allocator; /* for the comm's own memory; all NULL = ZERO_MALLOC          */
} zero_mpi_desc;

/* COLLECTIVE over desc->comm (MPI_Comm_idup, then an all-reduce of one int: whether a node
   runs more ranks than cores; then, when every rank can map it, the shared memory for the
   packets: rank 0 creates a /dev/shm file and broadcasts its name, an all-reduce agrees;
   each waited for at most timeout_ms). Creates this
   process's comm: rank and world are its MPI rank and size. MPI must be initialised.
   Destroy with zero_comm_destroy(). Errors: INVALID_ARGUMENT (NULL, negative timeout,
   half an allocator); INVALID_STATE (MPI not initialised or finalised); UNSUPPORTED
   (desc->device is not the host device and MPI is not CUDA-aware); OUT_OF_MEMORY; TIMEOUT
   (a rank did not join; the pending duplication keeps its small handle memory); COMM (an
   MPI call failed, its error string kept). *out is written only on success. */
ZERODEF zero_result zero_mpi_create(const zero_mpi_desc *desc, zero_comm **out);

/* 1 when comm was made by zero_mpi_create. */
ZERODEF int zero_mpi_is(const zero_comm *comm);

/* ZERO_OK, or the error that broke the comm (zero_last_error() then has the cause).
   INVALID_ARGUMENT when comm is not an MPI comm. Local. */
ZERODEF zero_result zero_mpi_status(zero_comm *comm);

/* For a rank that gives up: tells its peers (one packet round of kind "abort", at
   most timeout_ms) and breaks the comm, so peers waiting in a collective, or entering
   their next one, return ZERO_ERROR_COMM naming this rank. Returns ZERO_OK once the comm
   is broken (also when the peers could not be told in time). INVALID_ARGUMENT when comm
   is not an MPI comm. */
ZERODEF zero_result zero_mpi_abort(zero_comm *comm);

/* The duplicated communicator the comm runs on (to use MPI directly on the same ranks;
   do not free it). MPI_COMM_NULL when comm is not an MPI comm. */
ZERODEF MPI_Comm zero_mpi_handle(zero_comm *comm);

/* 1 when this MPI library was built CUDA-aware and says so at run time
   (MPIX_Query_cuda_support where the library has it; define ZERO_MPI_CUDA_AWARE=1 to
   assert it for libraries without that query). */
ZERODEF int zero_mpi_cuda_aware(void);

/* COLLECTIVE over comm: root's 'bytes' bytes at buf are copied to buf on every rank
   (MPI_Ibcast in pieces of at most 1 GiB, waited for at most timeout_ms; 0 = the default).
   For ids and small configuration blobs. Errors: INVALID_ARGUMENT; TIMEOUT (the request
   stays pending: end the job); COMM. */
ZERODEF zero_result zero_mpi_bcast_bytes(MPI_Comm comm, int root, void *buf, size_t bytes,
                                         int timeout_ms);

#if defined(ZERO_NCCL_H) && !defined(ZERO_NCCL_BOOTSTRAP_ONLY)
/* Declared when zero_nccl.h (the full header) was included before zero_mpi.h: rank
   'root' of comm draws a fresh NCCL unique id (zero_nccl_unique_id) and broadcasts it, so
   every rank holds the same ZERO_NCCL_ID_BYTES at id. Then, on each rank:
       nd.unique_id = id; nd.rank = mpi_rank; nd.world = mpi_size; zero_nccl_create(&nd, &c);
   No TCP bootstrap, no MASTER_ADDR. COLLECTIVE. Errors: those of zero_nccl_unique_id
   (root only: the others then wait for the timeout) and zero_mpi_bcast_bytes. */
ZERODEF zero_result zero_mpi_nccl_unique_id(MPI_Comm comm, int root, void *id, int timeout_ms);
#endif

#ifdef __cplusplus
}
#endif

#endif /* ZERO_MPI_H */

/* ======================================================================================
   IMPLEMENTATION
   ====================================================================================== */
#if defined(ZERO_MPI_IMPLEMENTATION) && !defined(ZERO_MPI_IMPLEMENTATION_DONE)
#define ZERO_MPI_IMPLEMENTATION_DONE

#ifndef ZERO_IMPLEMENTATION_DONE
#error "zero_mpi.h: define ZERO_MPI_IMPLEMENTATION in the file that defines ZERO_IMPLEMENTATION, after including zero.h"
#endif

#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h> /* MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support */
#endif
#include <limits.h>
#include <sched.h>
/* Packets through shared memory where every rank of the comm shares one node (docs/mpi.md,
   "Shared memory"): 1 = where the node allows it (a file in /dev/shm that every rank maps;
   else the packets go through MPI), 0 = always through MPI. Every rank must use the same
   value. It needs the atomics of zero.h's local comm (GCC/Clang builtins). */
#ifndef ZERO_MPI_SHM
#define ZERO_MPI_SHM 1
#endif
#if ZERO_MPI_SHM && ZERO__LOCAL_CAN_SPIN && defined(__linux__)
#define ZERO__MPI_SHM_OK 1
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#else
#define ZERO__MPI_SHM_OK 0
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The MPI comm. A collective = a packet round (each rank's signature, and a small
   collective's data, to every peer) then, for a large collective, a data round of
   point-to-point messages; reductions reuse the local comm's zero__local_reduce and
   zero__local_slice. */

enum {
    ZERO__MPI_BARRIER = 1,
    ZERO__MPI_ALL_GATHER,
    ZERO__MPI_REDUCE_SCATTER,
    ZERO__MPI_ALL_REDUCE,
    ZERO__MPI_BROADCAST,
    ZERO__MPI_LEAVE,
    ZERO__MPI_ABORT,
    ZERO__MPI_ALL_TO_ALL /* last: the earlier kinds keep their values in the signature */
};

/* Signature fields (int64 each in memory; packed into ZERO__MPI_HDR bytes on the wire). */
enum {
    ZERO__MPI_F_MAGIC,
    ZERO__MPI_F_KIND,
    ZERO__MPI_F_DTYPE,
    ZERO__MPI_F_OP,
    ZERO__MPI_F_ROOT,
    ZERO__MPI_F_NUMEL,
    ZERO__MPI_F_SEQ,
    ZERO__MPI_F_BAD,
    ZERO__MPI_F_ROLE,
    ZERO__MPI_F_GROUP,
    ZERO__MPI_F_TAGSEQ,
    ZERO__MPI_F_TAGCOUNT,
    ZERO__MPI_NF
};

/* How long a wait polls MPI without sleeping (then it sleeps 50 us between polls). */
#ifndef ZERO_MPI_SPIN_MS
#define ZERO_MPI_SPIN_MS 2.0
#endif

#define ZERO__MPI_MAGIC ((int64_t)0x5a4d5004) /* "ZMP" + protocol version 4 (packets in shared memory) */
/* Bytes per message (counts are ints); tests shrink it to exercise the splitting. */
#ifndef ZERO_MPI_PIECE_BYTES
#define ZERO_MPI_PIECE_BYTES ((size_t)1 << 30)
#endif
#define ZERO__MPI_PIECE ((size_t)(ZERO_MPI_PIECE_BYTES))
/* Payload bytes a packet may carry to one peer (the data of a small collective travels
   with its signature): this, but at most the piece and at most 8 MiB / world (at least
   1 KiB); every rank of a job must use the same value. 3488: with the 56-byte signature a
   packet stays within 3.5 KiB, so Open MPI's shared-memory transport sends it eagerly
   through its per-peer fast box (about 3.8 KiB; above it the eager queue, and from 4 KiB
   minus its own header the rendezvous protocol, a round trip more). A larger block goes
   point to point after the packets, from the caller's buffer into the caller's (no copy
   into or out of a packet). */
#ifndef ZERO_MPI_INLINE_BYTES
#define ZERO_MPI_INLINE_BYTES ((size_t)3488)
#endif
/* The same when some node runs more ranks than it has cores (every rank learns it at
   create): there each round waits for every peer to be scheduled, and one round that
   copies its data into and out of the packets beats a packet round and a data round
   (measured at 4 ranks on 2 cores: 64 KiB all_gather 0.62x Open MPI's with two rounds,
   0.96x with one). */
#ifndef ZERO_MPI_INLINE_BYTES_OVERSUBSCRIBED
#define ZERO_MPI_INLINE_BYTES_OVERSUBSCRIBED ((size_t)64 << 10)
#endif
/* The same for packets in shared memory (ZERO_MPI_SHM; where some node runs more ranks
   than cores, ZERO_MPI_INLINE_BYTES_OVERSUBSCRIBED as above). No transport's fast box or
   eager limit bounds these packets, only memory (every rank's inbox holds two packets of
   every peer: world^2 x 2 slots in all, kept within 16 MiB by a smaller payload for large
   worlds) and the copies: a packet's payload is copied into the peer's slot and out of it,
   where Open MPI's point-to-point moves a large block with one copy (Linux CMA). Measured
   at 2 ranks on this loaded machine (load 7-9), ours / Open MPI's all_gather: 16 KiB
   buffers 1.8-3.1x in the packets, 1.7-1.9x with a data round; 64 KiB (32 KiB blocks)
   0.77-0.85x in the packets, 0.87-0.95x with a data round. */
#ifndef ZERO_MPI_INLINE_BYTES_SHM
#define ZERO_MPI_INLINE_BYTES_SHM ((size_t)16 << 10)
#endif
/* An all_reduce sends its whole buffer to every peer, and every rank sums all of it (one
   round instead of a reduce-scatter and an all-gather of slices; the same rank-ordered
   sums), while (world - 1) x its bytes is at most this: in the packets when the buffer
   fits one, else in one data round after them. At 2 ranks the bytes sent are the same
   either way and one round saves a latency; with more ranks it sends (world - 1) x the
   buffer instead of 2 (world - 1) / world x. */
#ifndef ZERO_MPI_ALLREDUCE_ONE_ROUND_BYTES
#define ZERO_MPI_ALLREDUCE_ONE_ROUND_BYTES ((size_t)64 << 10)
#endif
/* The signature on the wire: 56 bytes (u32 magic; u8 kind, dtype, op, invalid flag; i32
   root, role, group, 0; u64 numel, own sequence number, tag seq, tag count), so a packet
   that carries 2 KiB of data stays below 2112 bytes, where glibc's memcpy (Open MPI's
   copies into and out of its shared memory) switches to `rep movsb` on CPUs with fast
   short rep-mov, which AMD Zen 3 runs up to 25x slower when source and destination are
   1-31 bytes apart modulo 64 (measured here: 2144 bytes in 1.1 us instead of 45 ns). */
#define ZERO__MPI_HDR ((size_t)56)
#define ZERO__MPI_TAG_DATA 0x5a31
#define ZERO__MPI_TAG_GATHER 0x5a32
#define ZERO__MPI_TAG_PACKET 0x5a33 /* signature + inline payload, one per peer per collective */
#define ZERO__MPI_TAG_GAVEUP 0x5a34 /* "I timed out in my collective #seq", to every peer */

typedef struct zero__mpi_comm {
    zero_comm base;
    MPI_Comm mc;
    int timeout_ms, abort_on_timeout;
    zero_device *device;
    zero_allocator allocator;
    zero_simd simd;
    unsigned long long seq;  /* collectives called on this comm                         */
    double deadline;         /* the current collective's, in zero__mpi_now_ms; 0 = not yet
                                set (its first wait sets it at its first clock check)     */
    zero_result broken;      /* ZERO_OK, or why every call now fails                    */
    char broken_msg[320];
    int leak;                /* a timed-out request may still use sig/pkt/scratch: keep them */
    int64_t *sig;            /* [4 * NF]: [0, 4) the gave-up message this rank sends, [8, 12)
                                the one received (gaveup_req)                              */
    MPI_Request gaveup_req;  /* a receive of a peer's gave-up message, posted from create    */
    int gaveup_got;          /* it completed: sig[8..12) holds the message                  */
    int yield;               /* more ranks on this node than cores: yield while spinning   */
    int oversubscribed;      /* some node of the comm runs more ranks than cores (agreed)  */
    int *idx;                /* [nreqs_cap]: MPI_Testsome's indices                         */
    int64_t *sigs;           /* [world * NF]: every rank's signature of this collective    */
    unsigned char *pkt_in;   /* [world * SLOT]: the packets received, peer p's at p * SLOT */
    unsigned char *pkt_out;  /* [world * SLOT]: the packets sent, to peer p at p * SLOT    */
    unsigned char *pkt_mem;  /* the allocation that holds both, 64-byte aligned in it
                                (NULL with packets in shared memory)                        */
    unsigned char *scratch;  /* received blocks of a reduction                             */
    size_t scratch_bytes;
    MPI_Request *reqs;       /* the data round's requests                                */
    size_t nreqs_cap;
    const void **srcs;       /* [world]: the inputs of one reduction                      */
    size_t *plen;            /* [world]: payload bytes of the packet to peer p            */
    size_t inl, slot;        /* payload bytes a packet may carry; bytes per packet buffer */
    unsigned char *shm;      /* the shared packets (NULL: packets go through MPI): world
                                regions of shm_region bytes, rank r's at r * shm_region      */
    size_t shm_bytes, shm_region;
    unsigned char *got;      /* [world]: a peer's packet arrived (shared-memory waits)     */
    unsigned char hdr[64];   /* this rank's signature on the wire (shared memory)          */
} zero__mpi_comm;

static void zero__mpi_destroy(zero_comm *comm);

static zero__mpi_comm *zero__mpi_get(zero_comm *comm)
{
    if (!comm || !comm->ops || comm->ops->destroy != zero__mpi_destroy || !comm->impl) return NULL;
    return (zero__mpi_comm *)comm->impl;
}

static const char *zero__mpi_kind_name(int64_t kind)
{
    switch (kind) {
    case ZERO__MPI_BARRIER: return "barrier";
    case ZERO__MPI_ALL_GATHER: return "all_gather";
    case ZERO__MPI_REDUCE_SCATTER: return "reduce_scatter";
    case ZERO__MPI_ALL_REDUCE: return "all_reduce";
    case ZERO__MPI_BROADCAST: return "broadcast";
    case ZERO__MPI_LEAVE: return "leave";
    case ZERO__MPI_ABORT: return "abort";
    case ZERO__MPI_ALL_TO_ALL: return "all_to_all";
    }
    return "?";
}

static double zero__mpi_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail with a valid clock and pointer */
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* "MPI_Isend: MPI_ERR_TRUNCATE: message truncated" into buf. */
static void zero__mpi_errtext(int rc, char *buf, size_t size)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS || len <= 0)
        snprintf(text, sizeof text, "MPI error %d", rc);
    else
        text[len < MPI_MAX_ERROR_STRING ? len : MPI_MAX_ERROR_STRING - 1] = '\0';
    snprintf(buf, size, "%s", text);
}

/* Breaks the comm once (later causes are ignored); returns the error with its message. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static zero_result zero__mpi_break(zero__mpi_comm *c, zero_result why, const char *fmt, ...)
{
    va_list ap;
    if (c->broken == ZERO_OK) {
        c->broken = why;
        va_start(ap, fmt);
        vsnprintf(c->broken_msg, sizeof c->broken_msg, fmt, ap);
        va_end(ap);
    }
    if (why == ZERO_ERROR_TIMEOUT && c->abort_on_timeout) {
        fprintf(stderr, "zero_mpi: rank %d: %s: calling MPI_Abort (abort_on_timeout)\n",
                c->base.rank, c->broken_msg);
        fflush(stderr);
        MPI_Abort(c->mc, 1);
    }
    return zero__fail(c->broken, "%s", c->broken_msg);
}

/* A rank that times out tells every peer, with a small message of its own tag (its
   request freed at once; the buffer, c->sig, is kept with the comm's leaked buffers):
   {magic, its collective number, its timeout, its rank}. A peer that joins that
   collective late would otherwise complete it from the packets the timed-out rank had
   already sent (MPI cannot take a send back). Every comm keeps a receive for this message
   posted (gaveup_req, from create), and every wait tests it together with its own
   requests: MPI matches the message as it delivers the packets, at no cost per
   collective, and the wait fails with the timeout instead of returning stale success. */
static void zero__mpi_gaveup_send(zero__mpi_comm *c)
{
    int p;
    c->sig[0] = ZERO__MPI_MAGIC;
    c->sig[1] = (int64_t)c->seq;
    c->sig[2] = c->timeout_ms;
    c->sig[3] = c->base.rank;
    if (c->shm) { /* this rank's gave-up record, read by its peers' shared-memory waits */
        uint64_t *rec = (uint64_t *)(void *)(c->shm + (size_t)c->base.rank * c->shm_region);
        rec[1] = (uint64_t)c->timeout_ms;
        ZERO__STORE_REL(&rec[0], (uint64_t)c->seq);
    }
    for (p = 0; p < c->base.world; p++) {
        MPI_Request r;
        if (p == c->base.rank) continue;
        if (MPI_Isend(c->sig, 4, MPI_INT64_T, p, ZERO__MPI_TAG_GAVEUP, c->mc, &r) == MPI_SUCCESS)
            (void)MPI_Request_free(&r); /* best effort: the comm is broken either way */
    }
}

static zero_result zero__mpi_gaveup_fail(zero__mpi_comm *c, const int64_t *msg, const char *what)
{
    c->leak = 1;
    if (msg[0] != ZERO__MPI_MAGIC) /* not ours: cannot happen on the comm's own communicator */
        return zero__mpi_break(c, ZERO_ERROR_COMM, "%s #%llu (rank %d): a malformed gave-up message", what,
                               c->seq, c->base.rank);
    return zero__mpi_break(c, ZERO_ERROR_TIMEOUT,
                           "%s #%llu (rank %d): rank %lld timed out after %lld ms in its collective #%lld and "
                           "left the collective (this rank joined too late)",
                           what, c->seq, c->base.rank, (long long)msg[3], (long long)msg[2], (long long)msg[1]);
}

/* Shared memory (c->shm): rank r's region starts with a 64-byte line, its gave-up record
   (u64: the collective it timed out in, 0 = none; u64: its timeout in ms; u64: rank 0's
   setup cookie), then its inbox: for each parity of the collective number (0, 1), one slot
   per sender of c->slot bytes: a 64-byte line (the 56-byte signature, then a u64 flag, the
   collective number the packet belongs to, stored last with release order) and the
   payload. Two parities suffice without acknowledgements: a sender reaches collective k + 2
   only after every rank's packet of k + 1, which its receiver sends after it finished
   reading the packets of k. */
static unsigned char *zero__mpi_slot(const zero__mpi_comm *c, int owner, int sender)
{
    return c->shm + (size_t)owner * c->shm_region + 64 +
           ((size_t)(c->seq & 1) * (size_t)c->base.world + (size_t)sender) * c->slot;
}

/* This rank's payload for peer p: p's inbox slot in shared memory, else the packet buffer
   (one for every peer unless per_peer). */
static unsigned char *zero__mpi_pay_out(const zero__mpi_comm *c, int p, int per_peer)
{
    if (c->shm) return zero__mpi_slot(c, p, c->base.rank) + 64;
    return c->pkt_out + (per_peer ? (size_t)p * c->slot : 0) + ZERO__MPI_HDR;
}

/* Peer p's packet to this rank: its signature, and its payload. */
static unsigned char *zero__mpi_hdr_in(const zero__mpi_comm *c, int p)
{
    return c->shm ? zero__mpi_slot(c, c->base.rank, p) : c->pkt_in + (size_t)p * c->slot;
}
static unsigned char *zero__mpi_pay_in(const zero__mpi_comm *c, int p)
{
    return zero__mpi_hdr_in(c, p) + (c->shm ? 64 : ZERO__MPI_HDR);
}

/* The deadline, the spinning and the sleeping of every wait, checked every 32 polls:
   returns 1 once the deadline has passed (the caller then gives up). */
static int zero__mpi_pace(zero__mpi_comm *c, unsigned *polls, double *start)
{
    double t;
    if ((++*polls & 31u) != 0) return 0;
    t = zero__mpi_now_ms();
    if (*start == 0) *start = t;
    if (c->deadline == 0) c->deadline = t + c->timeout_ms; /* this collective's first check */
    if (t > c->deadline) return 1;
    /* Spin for the first ZERO_MPI_SPIN_MS (yielding the core between polls when this node
       has more ranks than cores, as MPI's own waits do), then poll every 50 us: a rank
       waiting for a much slower peer leaves it the core. */
    if (t - *start < ZERO_MPI_SPIN_MS) {
        if (c->yield) sched_yield();
    } else {
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static zero_result zero__mpi_timed_out(zero__mpi_comm *c, const char *what, const char *phase)
{
    c->leak = 1;
    zero__mpi_gaveup_send(c);
    return zero__mpi_break(c, ZERO_ERROR_TIMEOUT, "rank %d timed out after %d ms in %s #%llu (%s): a peer did not join",
                           c->base.rank, c->timeout_ms, what, c->seq, phase);
}

/* The packet round's wait in shared memory: until every peer's packet of this collective
   has arrived (its flag holds this collective's number) or the deadline passes. A peer's
   gave-up record for an earlier collective fails the wait at once, one for this collective
   when the packets are in or at this rank's deadline (as zero__mpi_wait's gave-up
   messages). */
static zero_result zero__mpi_shm_wait(zero__mpi_comm *c, const char *what)
{
    unsigned polls = 0;
    double start = 0;
    int world = c->base.world, rank = c->base.rank, p, left = world - 1, late = 0;
    uint64_t seq = (uint64_t)c->seq;
    int64_t msg[4] = {0, 0, 0, 0};
    memset(c->got, 0, (size_t)world);
    for (;;) {
        for (p = 0; p < world; p++) {
            const uint64_t *rec;
            uint64_t g;
            if (p == rank) continue;
            if (!c->got[p] && ZERO__LOAD_ACQ((const uint64_t *)(const void *)(zero__mpi_slot(c, rank, p) + 56)) == seq) {
                c->got[p] = 1;
                left--;
            }
            rec = (const uint64_t *)(const void *)(c->shm + (size_t)p * c->shm_region);
            g = ZERO__LOAD_ACQ(&rec[0]);
            if (g != 0 && g <= seq) {
                msg[0] = ZERO__MPI_MAGIC;
                msg[1] = (int64_t)g;
                msg[2] = (int64_t)rec[1];
                msg[3] = p;
                if (g < seq) return zero__mpi_gaveup_fail(c, msg, what);
                late = 1;
            }
        }
        if (left == 0) return late ? zero__mpi_gaveup_fail(c, msg, what) : ZERO_OK;
        if (zero__mpi_pace(c, &polls, &start)) return zero__mpi_timed_out(c, what, "packet round");
        ZERO__CPU_RELAX();
    }
}

/* Polls n requests until all complete or the deadline passes. On a timeout the requests
   stay pending (MPI cannot cancel collectives, nor reliably sends): the comm is broken,
   every peer is told (zero__mpi_gaveup_send), and its buffers are kept for the rest of
   the process. A peer's gave-up message (gaveup_req, tested with the requests in one
   MPI_Testsome, so a message MPI delivered with the packets is seen in the same poll)
   for an earlier collective fails the wait at once; one for this collective fails it when
   it completes or at this rank's own deadline (each rank waits its own timeout, so no
   rank returns before it). reqs has room for n + 1 requests (zero__mpi_reqs). */
static zero_result zero__mpi_wait(zero__mpi_comm *c, int n, MPI_Request *reqs, const char *what,
                                  const char *phase)
{
    unsigned polls = 0;
    double start = 0;
    const int64_t *msg = c->sig + 8;
    int left = n;
    for (;;) {
        int i, m = n, outcount = 0, rc;
        if (c->gaveup_req != MPI_REQUEST_NULL) reqs[m++] = c->gaveup_req;
        rc = MPI_Testsome(m, reqs, &outcount, c->idx, MPI_STATUSES_IGNORE);
        if (m > n) c->gaveup_req = reqs[n]; /* MPI_REQUEST_NULL once it completed */
        if (rc != MPI_SUCCESS) {
            char e[MPI_MAX_ERROR_STRING + 1];
            zero__mpi_errtext(rc, e, sizeof e);
            c->leak = 1;
            return zero__mpi_break(c, ZERO_ERROR_COMM, "%s #%llu (rank %d): MPI_Testsome in the %s failed: %s",
                                   what, c->seq, c->base.rank, phase, e);
        }
        if (outcount != MPI_UNDEFINED)
            for (i = 0; i < outcount; i++)
                if (c->idx[i] < n) left--;
        if (c->gaveup_req == MPI_REQUEST_NULL && !c->gaveup_got) {
            c->gaveup_got = 1;
            if (msg[0] != ZERO__MPI_MAGIC || msg[1] < (int64_t)c->seq) return zero__mpi_gaveup_fail(c, msg, what);
        }
        if (left <= 0) {
            if (c->gaveup_got && msg[1] <= (int64_t)c->seq) return zero__mpi_gaveup_fail(c, msg, what);
            return ZERO_OK;
        }
        if (zero__mpi_pace(c, &polls, &start)) return zero__mpi_timed_out(c, what, phase);
    }
}

/* One signature as a readable call: "all_reduce(numel 8, f16, sum, tag role 2 group 1 seq 40)". */
static void zero__mpi_describe(char *buf, size_t size, const int64_t *f)
{
    const char *name = zero__mpi_kind_name(f[ZERO__MPI_F_KIND]);
    char tag[128], count[40];
    int kind = (int)f[ZERO__MPI_F_KIND];
    tag[0] = count[0] = '\0';
    if (f[ZERO__MPI_F_TAGCOUNT] != 0)
        snprintf(count, sizeof count, " count %llu", (unsigned long long)f[ZERO__MPI_F_TAGCOUNT]);
    if (f[ZERO__MPI_F_ROLE] != 0)
        snprintf(tag, sizeof tag, ", tag role %lld group %lld seq %lld%s", (long long)f[ZERO__MPI_F_ROLE],
                 (long long)f[ZERO__MPI_F_GROUP], (long long)f[ZERO__MPI_F_TAGSEQ], count);
    if (f[ZERO__MPI_F_MAGIC] != ZERO__MPI_MAGIC)
        snprintf(buf, size, "a call of another zero_mpi.h version or program (magic %llx)",
                 (unsigned long long)f[ZERO__MPI_F_MAGIC]);
    else if (f[ZERO__MPI_F_BAD])
        snprintf(buf, size, "%s(invalid arguments) as its #%lld", name, (long long)f[ZERO__MPI_F_SEQ]);
    else if (kind == ZERO__MPI_BARRIER || kind == ZERO__MPI_LEAVE || kind == ZERO__MPI_ABORT)
        snprintf(buf, size, "%s(%s) as its #%lld", name, tag[0] ? tag + 2 : "",
                 (long long)f[ZERO__MPI_F_SEQ]);
    else if (kind == ZERO__MPI_BROADCAST)
        snprintf(buf, size, "broadcast(numel %llu, %s, root %lld%s) as its #%lld",
                 (unsigned long long)f[ZERO__MPI_F_NUMEL],
                 zero_dtype_name((zero_dtype)f[ZERO__MPI_F_DTYPE]), (long long)f[ZERO__MPI_F_ROOT], tag,
                 (long long)f[ZERO__MPI_F_SEQ]);
    else if (kind == ZERO__MPI_ALL_GATHER || kind == ZERO__MPI_ALL_TO_ALL)
        snprintf(buf, size, "%s(numel %llu, %s%s) as its #%lld", name,
                 (unsigned long long)f[ZERO__MPI_F_NUMEL],
                 zero_dtype_name((zero_dtype)f[ZERO__MPI_F_DTYPE]), tag, (long long)f[ZERO__MPI_F_SEQ]);
    else
        snprintf(buf, size, "%s(numel %llu, %s, %s%s) as its #%lld", name,
                 (unsigned long long)f[ZERO__MPI_F_NUMEL],
                 zero_dtype_name((zero_dtype)f[ZERO__MPI_F_DTYPE]),
                 f[ZERO__MPI_F_OP] == ZERO_OP_MAX ? "max" : "sum", tag, (long long)f[ZERO__MPI_F_SEQ]);
}

/* The signature f (NF fields) on the wire (ZERO__MPI_HDR bytes), and back. Every field
   of a call this rank can make fits its wire width (kinds, dtypes and ops are small enums,
   root and the tag's role and group are ints), so two calls agree exactly when their wire
   headers are equal. */
static void zero__mpi_pack(unsigned char *w, const int64_t *f)
{
    uint32_t h[6];
    uint64_t q[4];
    h[0] = (uint32_t)f[ZERO__MPI_F_MAGIC];
    h[1] = (uint32_t)(f[ZERO__MPI_F_KIND] & 0xff) | (uint32_t)(f[ZERO__MPI_F_DTYPE] & 0xff) << 8 |
           (uint32_t)(f[ZERO__MPI_F_OP] & 0xff) << 16 | (uint32_t)(f[ZERO__MPI_F_BAD] & 0xff) << 24;
    h[2] = (uint32_t)f[ZERO__MPI_F_ROOT];
    h[3] = (uint32_t)f[ZERO__MPI_F_ROLE];
    h[4] = (uint32_t)f[ZERO__MPI_F_GROUP];
    h[5] = 0;
    q[0] = (uint64_t)f[ZERO__MPI_F_NUMEL];
    q[1] = (uint64_t)f[ZERO__MPI_F_SEQ];
    q[2] = (uint64_t)f[ZERO__MPI_F_TAGSEQ];
    q[3] = (uint64_t)f[ZERO__MPI_F_TAGCOUNT];
    memcpy(w, h, sizeof h);
    memcpy(w + sizeof h, q, sizeof q);
}

static void zero__mpi_unpack(int64_t *f, const unsigned char *w)
{
    uint32_t h[6];
    uint64_t q[4];
    memcpy(h, w, sizeof h);
    memcpy(q, w + sizeof h, sizeof q);
    f[ZERO__MPI_F_MAGIC] = (int64_t)h[0];
    f[ZERO__MPI_F_KIND] = (int64_t)(h[1] & 0xff);
    f[ZERO__MPI_F_DTYPE] = (int64_t)(h[1] >> 8 & 0xff);
    f[ZERO__MPI_F_OP] = (int64_t)(h[1] >> 16 & 0xff);
    f[ZERO__MPI_F_BAD] = (int64_t)(h[1] >> 24);
    f[ZERO__MPI_F_ROOT] = (int64_t)(int32_t)h[2];
    f[ZERO__MPI_F_ROLE] = (int64_t)(int32_t)h[3];
    f[ZERO__MPI_F_GROUP] = (int64_t)(int32_t)h[4];
    f[ZERO__MPI_F_NUMEL] = (int64_t)q[0];
    f[ZERO__MPI_F_SEQ] = (int64_t)q[1];
    f[ZERO__MPI_F_TAGSEQ] = (int64_t)q[2];
    f[ZERO__MPI_F_TAGCOUNT] = (int64_t)q[3];
}

/* The packet round: every rank sends every peer one packet, its signature (NF int64:
   magic, kind, dtype, op, root, numel, its own collective number, the invalid-arguments
   flag, the caller's tag) followed by c->plen[p] payload bytes (the data of a small
   collective; 0 for a large one, whose data follows in a second round). The packets to
   peers are at pkt_out + p * SLOT (per_peer) or all at pkt_out (the same packet to
   everyone); the header is written here. Receives take up to SLOT bytes, so a peer that
   called something else (another count, another kind) is read whole, never truncated.
   Every rank then holds every rank's signature (c->sigs) and reaches the same verdict:
   ZERO_OK when all agree; otherwise the error every rank returns (INVALID_ARGUMENT for a
   rank's own bad arguments, its 'why'), with the comm broken where a peer left or
   aborted. Nothing is written to the caller's buffers here. */
static zero_result zero__mpi_round(zero__mpi_comm *c, const int64_t *mine, int per_peer, const char *why)
{
    const char *what = zero__mpi_kind_name(mine[ZERO__MPI_F_KIND]);
    zero_result res;
    int r, s, world = c->base.world, rank = c->base.rank, rc = MPI_SUCCESS, n = 0, agree = 1;
    int bad_rank = -1, other = -1, gone = -1;
    char a[192], b[192];
    unsigned char *wire;
    if (c->shm) { /* into every peer's inbox, the flag last: the packet is complete */
        wire = c->hdr;
        zero__mpi_pack(wire, mine);
        for (s = 0; s < world; s++) {
            unsigned char *slot;
            if (s == rank) continue;
            slot = zero__mpi_slot(c, s, rank);
            memcpy(slot, wire, ZERO__MPI_HDR);
            ZERO__STORE_REL((uint64_t *)(void *)(slot + 56), (uint64_t)c->seq);
        }
        res = zero__mpi_shm_wait(c, what);
        if (res != ZERO_OK) return res;
        goto verdict;
    }
    wire = c->pkt_out + (per_peer && rank == 0 && world > 1 ? c->slot : 0);
    zero__mpi_pack(wire, mine); /* into the first packet, copied into the others */
    for (s = 0; per_peer && s < world; s++) {
        unsigned char *out = c->pkt_out + (size_t)s * c->slot;
        if (s != rank && out != wire) memcpy(out, wire, ZERO__MPI_HDR);
    }
    for (s = 1; s < world && rc == MPI_SUCCESS; s++) {
        int p = (rank + world - s) % world;
        unsigned char *h = c->pkt_in + (size_t)p * c->slot;
        memset(h, 0, 4); /* a short packet cannot pass for the last one's header */
        rc = MPI_Irecv(h, (int)c->slot, MPI_BYTE, p, ZERO__MPI_TAG_PACKET, c->mc, &c->reqs[n++]);
    }
    for (s = 1; s < world && rc == MPI_SUCCESS; s++) {
        int p = (rank + s) % world;
        unsigned char *out = per_peer ? c->pkt_out + (size_t)p * c->slot : wire;
        rc = MPI_Isend(out, (int)(ZERO__MPI_HDR + c->plen[p]), MPI_BYTE, p, ZERO__MPI_TAG_PACKET, c->mc,
                       &c->reqs[n++]);
    }
    if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING + 1];
        zero__mpi_errtext(rc, e, sizeof e);
        c->leak = 1; /* the requests already posted stay pending */
        return zero__mpi_break(c, ZERO_ERROR_COMM, "%s #%llu (rank %d): posting a packet failed: %s", what,
                               c->seq, rank, e);
    }
    res = zero__mpi_wait(c, n, c->reqs, what, "packet round");
    if (res != ZERO_OK) return res;
verdict:
    for (r = 0; r < world && agree; r++)
        if (r != rank && memcmp(zero__mpi_hdr_in(c, r), wire, ZERO__MPI_HDR) != 0) agree = 0;
    if (agree) return ZERO_OK;

    /* Disagreement: every rank holds every signature and names the same difference. */
    for (r = 0; r < world; r++)
        zero__mpi_unpack(c->sigs + (size_t)r * ZERO__MPI_NF, r == rank ? wire : zero__mpi_hdr_in(c, r));
    for (r = 0; r < world; r++) {
        const int64_t *f = c->sigs + (size_t)r * ZERO__MPI_NF;
        if (gone < 0 && (f[ZERO__MPI_F_KIND] == ZERO__MPI_LEAVE || f[ZERO__MPI_F_KIND] == ZERO__MPI_ABORT))
            gone = r;
        if (bad_rank < 0 && f[ZERO__MPI_F_BAD]) bad_rank = r;
        if (other < 0 && memcmp(f, c->sigs, ZERO__MPI_NF * sizeof *f) != 0) other = r;
    }
    if (other < 0) other = 0; /* cannot happen: some signature differs from this rank's */
    if (gone >= 0) {
        const int64_t *g = c->sigs + (size_t)gone * ZERO__MPI_NF;
        int peer = gone == 0 ? other : 0;
        zero__mpi_describe(b, sizeof b, c->sigs + (size_t)peer * ZERO__MPI_NF);
        return zero__mpi_break(c, ZERO_ERROR_COMM,
                               "%s (rank %d): rank %d %s at its collective #%lld while rank %d called %s",
                               what, c->base.rank, gone,
                               g[ZERO__MPI_F_KIND] == ZERO__MPI_LEAVE ? "left the group (destroyed its comm)"
                                                                      : "called zero_mpi_abort",
                               (long long)g[ZERO__MPI_F_SEQ], peer, b);
    }
    if (mine[ZERO__MPI_F_BAD]) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s", why);
    if (bad_rank >= 0)
        return zero__fail(ZERO_ERROR_MISMATCH,
                          "%s (rank %d): collective #%llu: rank %d passed invalid arguments to %s", what,
                          c->base.rank, c->seq, bad_rank,
                          zero__mpi_kind_name(c->sigs[(size_t)bad_rank * ZERO__MPI_NF + ZERO__MPI_F_KIND]));
    zero__mpi_describe(a, sizeof a, c->sigs);
    zero__mpi_describe(b, sizeof b, c->sigs + (size_t)other * ZERO__MPI_NF);
    return zero__fail(ZERO_ERROR_MISMATCH, "%s (rank %d): ranks disagree: rank 0 called %s, rank %d called %s",
                      what, c->base.rank, a, other, b);
}

/* memcpy that avoids `rep movsb` where it is slow: glibc copies 2112 bytes to about 1 MiB
   with it on CPUs with fast short rep-mov, and AMD Zen 3 runs it up to 25x slower when the
   destination is 1-31 bytes past the source modulo 64 (this machine: 64 KiB in 21 us
   instead of 1.5 us). Those copies go in pieces of 2 KiB (glibc's vector loop: 3.7 us);
   the others, and every copy on other CPUs' terms, are one memcpy. */
static void zero__mpi_copy(void *dst, const void *src, size_t bytes)
{
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    size_t skew = (size_t)((uintptr_t)d - (uintptr_t)s) % 64;
    if (bytes > 2048 && bytes < ((size_t)1 << 20) && skew >= 1 && skew <= 31) {
        for (; bytes > 2048; bytes -= 2048, d += 2048, s += 2048) memcpy(d, s, 2048);
    }
    memcpy(d, s, bytes);
}

/* ---- the data round ---- */

/* Room for n requests, and one more for the wait's gave-up receive. */
static int zero__mpi_reqs(zero__mpi_comm *c, size_t n)
{
    MPI_Request *grown;
    int *idx;
    if (n + 1 <= c->nreqs_cap) return 1;
    grown = (MPI_Request *)zero__alloc(&c->allocator, (n + 1) * sizeof *grown);
    idx = (int *)zero__alloc(&c->allocator, (n + 1) * sizeof *idx);
    if (!grown || !idx) {
        zero__free(&c->allocator, grown);
        zero__free(&c->allocator, idx);
        return 0;
    }
    zero__free(&c->allocator, c->reqs);
    zero__free(&c->allocator, c->idx);
    c->reqs = grown;
    c->idx = idx;
    c->nreqs_cap = n + 1;
    return 1;
}

static int zero__mpi_scratch(zero__mpi_comm *c, size_t bytes)
{
    unsigned char *grown;
    if (bytes <= c->scratch_bytes) return 1;
    grown = (unsigned char *)zero__alloc(&c->allocator, bytes);
    if (!grown) return 0;
    zero__free(&c->allocator, c->scratch);
    c->scratch = grown;
    c->scratch_bytes = bytes;
    return 1;
}

/* Where rank c sends to / receives from peer p in one exchange (NULL/0: nothing). */
typedef struct zero__mpi_xfer {
    const unsigned char *(*send_at)(void *ctx, int peer, size_t *bytes);
    unsigned char *(*recv_at)(void *ctx, int peer, size_t *bytes);
    void *ctx;
    unsigned char *own_dst; /* own_bytes from own_src to own_dst (this rank's own block of */
    const unsigned char *own_src; /* an all_gather or all_to_all), copied while the     */
    size_t own_bytes;             /* messages are in flight                             */
} zero__mpi_xfer;

static size_t zero__mpi_pieces(size_t bytes) { return (bytes + ZERO__MPI_PIECE - 1) / ZERO__MPI_PIECE; }

/* Posts every receive, then every send (peers in the order rank+1, rank+2, ... so no peer
   is everyone's first), in pieces of at most ZERO__MPI_PIECE bytes, and waits. */
static zero_result zero__mpi_exchange(zero__mpi_comm *c, const zero__mpi_xfer *x, int tag, const char *what)
{
    int world = c->base.world, rank = c->base.rank, s, rc = MPI_SUCCESS;
    size_t n = 0, need = 0, bytes, off;
    for (s = 1; s < world; s++) {
        int p = (rank + s) % world;
        if (x->send_at(x->ctx, p, &bytes)) need += zero__mpi_pieces(bytes);
        if (x->recv_at(x->ctx, p, &bytes)) need += zero__mpi_pieces(bytes);
    }
    if (need == 0 && x->own_bytes) { /* no peer has data: only the own block */
        if (c->device) return c->device->ops->copy(c->device, ZERO_QUEUE_COMM, x->own_dst, x->own_src, x->own_bytes);
        zero__mpi_copy(x->own_dst, x->own_src, x->own_bytes);
    }
    if (need == 0) return ZERO_OK;
    if (need > (size_t)INT_MAX || !zero__mpi_reqs(c, need))
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s (rank %d): %zu MPI requests", what, rank, need);
    for (s = 1; s < world && rc == MPI_SUCCESS; s++) {
        int p = (rank + world - s) % world;
        unsigned char *dst = x->recv_at(x->ctx, p, &bytes);
        for (off = 0; dst && off < bytes && rc == MPI_SUCCESS; off += ZERO__MPI_PIECE) {
            size_t len = bytes - off < ZERO__MPI_PIECE ? bytes - off : ZERO__MPI_PIECE;
            rc = MPI_Irecv(dst + off, (int)len, MPI_BYTE, p, tag, c->mc, &c->reqs[n++]);
        }
    }
    for (s = 1; s < world && rc == MPI_SUCCESS; s++) {
        int p = (rank + s) % world;
        const unsigned char *src = x->send_at(x->ctx, p, &bytes);
        for (off = 0; src && off < bytes && rc == MPI_SUCCESS; off += ZERO__MPI_PIECE) {
            size_t len = bytes - off < ZERO__MPI_PIECE ? bytes - off : ZERO__MPI_PIECE;
            rc = MPI_Isend((void *)(src + off), (int)len, MPI_BYTE, p, tag, c->mc, &c->reqs[n++]);
        }
    }
    if (rc != MPI_SUCCESS) {
        char e[MPI_MAX_ERROR_STRING + 1];
        zero__mpi_errtext(rc, e, sizeof e);
        c->leak = 1; /* the requests already posted stay pending */
        return zero__mpi_break(c, ZERO_ERROR_COMM, "%s #%llu (rank %d): posting a message failed: %s", what,
                               c->seq, rank, e);
    }
    if (x->own_bytes) { /* queued on the device's comm queue, which the caller syncs */
        zero_result r = ZERO_OK, w;
        if (c->device) r = c->device->ops->copy(c->device, ZERO_QUEUE_COMM, x->own_dst, x->own_src, x->own_bytes);
        else zero__mpi_copy(x->own_dst, x->own_src, x->own_bytes);
        w = zero__mpi_wait(c, (int)n, c->reqs, what, "data round"); /* the messages complete either way */
        return w != ZERO_OK ? w : r;
    }
    return zero__mpi_wait(c, (int)n, c->reqs, what, "data round");
}

/* The layouts of the exchanges. */
typedef struct zero__mpi_lay {
    const unsigned char *send;
    unsigned char *recv;
    unsigned char *scratch;
    size_t block;   /* bytes per rank (all_gather, reduce_scatter, broadcast)            */
    size_t numel, es;
    int world, rank, root;
} zero__mpi_lay;

/* all_gather: my block to everyone; peer p's block into recv + p * block. */
static const unsigned char *zero__mpi_ag_send(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    (void)p;
    *bytes = l->block;
    return l->block ? l->send : NULL;
}
static unsigned char *zero__mpi_ag_recv(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    *bytes = l->block;
    return l->block ? l->recv + (size_t)p * l->block : NULL;
}
/* all_to_all: block p of my send to p (zero__mpi_rs_send); peer p's block 'rank' into
   recv + p * block. */
static unsigned char *zero__mpi_a2a_recv(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    *bytes = l->block;
    return l->block ? l->recv + (size_t)p * l->block : NULL;
}
/* reduce_scatter: block p of my send to p; peer p's block 'rank' into scratch + p * block. */
static const unsigned char *zero__mpi_rs_send(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    *bytes = l->block;
    return l->block ? l->send + (size_t)p * l->block : NULL;
}
static unsigned char *zero__mpi_rs_recv(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    *bytes = l->block;
    return l->block ? l->scratch + (size_t)p * l->block : NULL;
}
/* all_reduce, first half: slice p of my send to p; peer p's slice 'rank' into scratch. */
static const unsigned char *zero__mpi_ar1_send(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    size_t off, len;
    zero__local_slice(l->numel, l->es, l->world, p, &off, &len);
    *bytes = len * l->es;
    return len ? l->send + off * l->es : NULL;
}
static unsigned char *zero__mpi_ar1_recv(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    size_t off, len;
    zero__local_slice(l->numel, l->es, l->world, l->rank, &off, &len);
    *bytes = len * l->es;
    return len ? l->scratch + (size_t)p * len * l->es : NULL;
}
/* all_reduce, second half: my reduced slice to everyone; peer p's into its place. */
static const unsigned char *zero__mpi_ar2_send(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    size_t off, len;
    (void)p;
    zero__local_slice(l->numel, l->es, l->world, l->rank, &off, &len);
    *bytes = len * l->es;
    return len ? l->recv + off * l->es : NULL;
}
static unsigned char *zero__mpi_ar2_recv(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    size_t off, len;
    zero__local_slice(l->numel, l->es, l->world, p, &off, &len);
    *bytes = len * l->es;
    return len ? l->recv + off * l->es : NULL;
}
/* broadcast: the root sends to everyone, the others receive from the root. */
static const unsigned char *zero__mpi_bc_send(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    (void)p;
    *bytes = l->block;
    return l->rank == l->root && l->block ? l->send : NULL;
}
static unsigned char *zero__mpi_bc_recv(void *ctx, int p, size_t *bytes)
{
    zero__mpi_lay *l = (zero__mpi_lay *)ctx;
    *bytes = l->block;
    return l->rank != l->root && p == l->root && l->block ? l->recv : NULL;
}

/* Device memory: the device's comm queue must be idle before MPI touches its buffers. */
static zero_result zero__mpi_dev_sync(zero__mpi_comm *c)
{
    return c->device ? c->device->ops->sync(c->device, ZERO_QUEUE_COMM) : ZERO_OK;
}

/* out (numel elements at 'dst', device memory when c->device) = the rank-ordered reduction
   of srcs[0..world-1] (host memory, except srcs[rank] = own, on the device when c->device). */
static zero_result zero__mpi_reduce(zero__mpi_comm *c, void *dst, const unsigned char *own,
                                    unsigned char *host_own, size_t numel, zero_dtype dtype, zero_op op)
{
    zero_result r;
    size_t bytes = numel * zero_dtype_size(dtype);
    if (!c->device) {
        c->srcs[c->base.rank] = own;
        zero__local_reduce(dst, c->srcs, c->base.world, numel, dtype, op, c->simd);
        return ZERO_OK;
    }
    /* Download my own block, reduce on the host into it, upload the result. */
    r = c->device->ops->download(c->device, ZERO_QUEUE_COMM, host_own, own, bytes);
    if (r == ZERO_OK) r = c->device->ops->sync(c->device, ZERO_QUEUE_COMM);
    if (r != ZERO_OK) return r;
    c->srcs[c->base.rank] = host_own;
    zero__local_reduce(host_own, c->srcs, c->base.world, numel, dtype, op, c->simd);
    r = c->device->ops->upload(c->device, ZERO_QUEUE_COMM, dst, host_own, bytes);
    if (r == ZERO_OK) r = c->device->ops->sync(c->device, ZERO_QUEUE_COMM);
    return r;
}

/* An all_reduce of 'bytes' sends the whole buffer to every peer (one round) rather than
   slices (ZERO_MPI_ALLREDUCE_ONE_ROUND_BYTES). */
static int zero__mpi_whole(int world, size_t bytes)
{
    return bytes <= (size_t)(ZERO_MPI_ALLREDUCE_ONE_ROUND_BYTES) / (size_t)(world > 1 ? world - 1 : 1);
}

/* How a collective's data travels (chosen from the signature's fields). */
enum {
    ZERO__MPI_HEADER_ONLY,   /* signatures first, then the data round (large messages)      */
    ZERO__MPI_INLINE_BLOCKS, /* all_gather / broadcast / reduce_scatter / all_to_all: blocks in
                                the packets                                                    */
    ZERO__MPI_ONE_ROUND,     /* all_reduce: the whole buffer in every packet                 */
    ZERO__MPI_INLINE_SLICES  /* all_reduce: slice p in the packet to p, then the gather round */
};

/* bytes from src (device memory when c->device) into host_dst; queued on the device's comm
   queue, which the caller syncs. */
static zero_result zero__mpi_stage_in(zero__mpi_comm *c, unsigned char *host_dst, const void *src, size_t bytes)
{
    if (c->device) return c->device->ops->download(c->device, ZERO_QUEUE_COMM, host_dst, src, bytes);
    zero__mpi_copy(host_dst, src, bytes);
    return ZERO_OK;
}

/* The same bytes to every peer: into each peer's inbox in shared memory, else once into the
   packet that goes to every peer. */
static zero_result zero__mpi_stage_all(zero__mpi_comm *c, const void *src, size_t bytes)
{
    zero_result r = ZERO_OK;
    int p;
    if (!c->shm) return zero__mpi_stage_in(c, zero__mpi_pay_out(c, 0, 0), src, bytes);
    for (p = 0; p < c->base.world && r == ZERO_OK; p++)
        if (p != c->base.rank) r = zero__mpi_stage_in(c, zero__mpi_pay_out(c, p, 0), src, bytes);
    return r;
}

/* bytes from host_src into dst (device memory when c->device), likewise. */
static zero_result zero__mpi_stage_out(zero__mpi_comm *c, void *dst, const unsigned char *host_src, size_t bytes)
{
    if (c->device) return c->device->ops->upload(c->device, ZERO_QUEUE_COMM, dst, host_src, bytes);
    zero__mpi_copy(dst, host_src, bytes);
    return ZERO_OK;
}

/* After an agreed packet round that carried the data: the results from the packets. */
static zero_result zero__mpi_finish_inline(zero__mpi_comm *c, int kind, int mode, const void *send, void *recv,
                                           size_t numel, zero_dtype dtype, zero_op op, int root)
{
    const char *what = zero__mpi_kind_name(kind);
    int world = c->base.world, rank = c->base.rank, p;
    size_t es = zero_dtype_size(dtype), block = numel * es, off, len;
    unsigned char *out = (unsigned char *)recv;
    zero_result res = ZERO_OK;
#define ZERO__MPI_PAYLOAD(p) zero__mpi_pay_in(c, p)
    if (kind == ZERO__MPI_ALL_GATHER) {
        unsigned char *mine = out + (size_t)rank * block;
        if (mine != (const unsigned char *)send) {
            if (c->device) res = c->device->ops->copy(c->device, ZERO_QUEUE_COMM, mine, send, block);
            else zero__mpi_copy(mine, send, block);
        }
        for (p = 0; p < world && res == ZERO_OK; p++)
            if (p != rank) res = zero__mpi_stage_out(c, out + (size_t)p * block, ZERO__MPI_PAYLOAD(p), block);
        if (res == ZERO_OK) res = zero__mpi_dev_sync(c);
        return res;
    }
    if (kind == ZERO__MPI_ALL_TO_ALL) { /* my own block, then block 'rank' of every peer */
        const unsigned char *own = (const unsigned char *)send + (size_t)rank * block;
        if (c->device) res = c->device->ops->copy(c->device, ZERO_QUEUE_COMM, out + (size_t)rank * block, own, block);
        else zero__mpi_copy(out + (size_t)rank * block, own, block);
        for (p = 0; p < world && res == ZERO_OK; p++)
            if (p != rank) res = zero__mpi_stage_out(c, out + (size_t)p * block, ZERO__MPI_PAYLOAD(p), block);
        if (res == ZERO_OK) res = zero__mpi_dev_sync(c);
        return res;
    }
    if (kind == ZERO__MPI_BROADCAST) {
        if (rank != root) res = zero__mpi_stage_out(c, out, ZERO__MPI_PAYLOAD(root), block);
        if (res == ZERO_OK) res = zero__mpi_dev_sync(c);
        return res;
    }
    /* The reductions: peers' contributions from the packets, this rank's own from its
       buffer (downloaded into scratch on a device), summed in rank order. */
    if (kind == ZERO__MPI_REDUCE_SCATTER || mode == ZERO__MPI_ONE_ROUND) {
        size_t n = numel; /* reduce_scatter: my block; one round: the whole buffer */
        const unsigned char *own = (const unsigned char *)send + (kind == ZERO__MPI_REDUCE_SCATTER ? (size_t)rank * block : 0);
        if (c->device && !zero__mpi_scratch(c, n * es))
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s (rank %d): %zu bytes of scratch", what, rank, n * es);
        for (p = 0; p < world; p++) c->srcs[p] = ZERO__MPI_PAYLOAD(p);
        return zero__mpi_reduce(c, recv, own, c->scratch, n, dtype, op);
    }
    /* all_reduce in slices: my reduced slice, then the gather round of the slices */
    zero__local_slice(numel, es, world, rank, &off, &len);
    if (len) {
        if (c->device && !zero__mpi_scratch(c, len * es))
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s (rank %d): %zu bytes of scratch", what, rank, len * es);
        for (p = 0; p < world; p++) c->srcs[p] = ZERO__MPI_PAYLOAD(p);
        res = zero__mpi_reduce(c, out + off * es, (const unsigned char *)send + off * es, c->scratch, len, dtype, op);
        if (res != ZERO_OK) return res;
    }
    {
        zero__mpi_lay lay;
        zero__mpi_xfer x;
        memset(&lay, 0, sizeof lay);
        memset(&x, 0, sizeof x);
        lay.recv = out;
        lay.numel = numel;
        lay.es = es;
        lay.world = world;
        lay.rank = rank;
        x.ctx = &lay;
        x.send_at = zero__mpi_ar2_send;
        x.recv_at = zero__mpi_ar2_recv;
        return zero__mpi_exchange(c, &x, ZERO__MPI_TAG_GATHER, what);
    }
#undef ZERO__MPI_PAYLOAD
}

/* One collective, start to end. */
static zero_result zero__mpi_collective(zero_comm *comm, int kind, const void *send, void *recv,
                                        size_t numel, zero_dtype dtype, zero_op op, int root)
{
    zero__mpi_comm *c = zero__mpi_get(comm);
    const char *what = zero__mpi_kind_name(kind);
    int64_t f[ZERO__MPI_NF];
    char why[192];
    size_t es, total = numel, bytes = 0;
    int world, rank, p, bad = 0, mode, per_peer;
    zero__mpi_lay lay;
    zero__mpi_xfer x;
    zero_result res;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: comm is not an MPI comm", what);
    if (c->broken != ZERO_OK)
        return zero__fail(c->broken, "%s (rank %d): the comm is broken: %s", what, comm->rank, c->broken_msg);
    world = comm->world;
    rank = comm->rank;
    c->deadline = 0; /* set by the first wait that checks the clock (zero__mpi_wait) */
    c->seq++;

    /* This rank's arguments (validated first so a bad call still joins the round). */
    why[0] = '\0';
    es = zero_dtype_size(dtype);
    if (kind != ZERO__MPI_BARRIER && kind != ZERO__MPI_LEAVE && kind != ZERO__MPI_ABORT) {
        bad = 1;
        if (es == 0) snprintf(why, sizeof why, "%s: unknown dtype %d", what, (int)dtype);
        else if (op != ZERO_OP_SUM && op != ZERO_OP_MAX) snprintf(why, sizeof why, "%s: unknown op %d", what, (int)op);
        else if (root < 0 || root >= world) snprintf(why, sizeof why, "%s: root = %d with world = %d", what, root, world);
        else if ((kind == ZERO__MPI_ALL_GATHER || kind == ZERO__MPI_REDUCE_SCATTER ||
                  kind == ZERO__MPI_ALL_TO_ALL) &&
                 zero__mul_size(numel, (size_t)world, &total) != 0)
            snprintf(why, sizeof why, "%s: numel %zu times world %d overflows", what, numel, world);
        else if (zero__mul_size(total, es, &bytes) != 0 || bytes > (size_t)INT64_MAX)
            snprintf(why, sizeof why, "%s: %zu elements of %s overflow", what, total, zero_dtype_name(dtype));
        else if (numel > 0 && (!send || !recv))
            snprintf(why, sizeof why, "%s: %s is NULL with numel = %zu", what,
                     !send ? (kind == ZERO__MPI_BROADCAST ? "buf" : "send") : "recv", numel);
        else bad = 0;
    }
    memset(f, 0, sizeof f);
    f[ZERO__MPI_F_MAGIC] = ZERO__MPI_MAGIC;
    f[ZERO__MPI_F_KIND] = kind;
    f[ZERO__MPI_F_SEQ] = (int64_t)c->seq;
    f[ZERO__MPI_F_BAD] = bad;
    if (!bad && kind != ZERO__MPI_BARRIER && kind != ZERO__MPI_LEAVE && kind != ZERO__MPI_ABORT) {
        f[ZERO__MPI_F_DTYPE] = (int64_t)dtype;
        f[ZERO__MPI_F_NUMEL] = (int64_t)numel;
        if (kind == ZERO__MPI_REDUCE_SCATTER || kind == ZERO__MPI_ALL_REDUCE) f[ZERO__MPI_F_OP] = (int64_t)op;
        if (kind == ZERO__MPI_BROADCAST) f[ZERO__MPI_F_ROOT] = root;
    }
    if (comm->tag.role != 0) {
        f[ZERO__MPI_F_ROLE] = comm->tag.role;
        f[ZERO__MPI_F_GROUP] = comm->tag.group;
        f[ZERO__MPI_F_TAGSEQ] = (int64_t)comm->tag.seq;
        f[ZERO__MPI_F_TAGCOUNT] = (int64_t)comm->tag.count;
    }
    /* The packets: small collectives carry this rank's data with the signature. The mode
       follows from the signature's fields alone (and the world), so ranks that agree
       agree on it too. */
    mode = ZERO__MPI_HEADER_ONLY;
    if (!bad && numel > 0 && kind != ZERO__MPI_BARRIER && kind != ZERO__MPI_LEAVE && kind != ZERO__MPI_ABORT) {
        if (kind == ZERO__MPI_ALL_REDUCE) {
            size_t off0, len0;
            zero__local_slice(numel, es, world, 0, &off0, &len0); /* slice 0 is the longest */
            if (bytes <= c->inl && zero__mpi_whole(world, bytes))
                mode = ZERO__MPI_ONE_ROUND;
            else if (len0 * es <= c->inl)
                mode = ZERO__MPI_INLINE_SLICES;
        } else if (numel * es <= c->inl) {
            mode = ZERO__MPI_INLINE_BLOCKS;
        }
    }
    for (p = 0; p < world; p++) c->plen[p] = 0;
    per_peer = 0;
    res = ZERO_OK;
    if (mode != ZERO__MPI_HEADER_ONLY) {
        res = zero__mpi_dev_sync(c);
        if (res != ZERO_OK) return res;
    }
    switch (mode) {
    case ZERO__MPI_INLINE_BLOCKS:
        if (kind == ZERO__MPI_REDUCE_SCATTER || kind == ZERO__MPI_ALL_TO_ALL) { /* block p to peer p */
            per_peer = 1;
            for (p = 0; p < world && res == ZERO_OK; p++) {
                if (p == rank) continue;
                c->plen[p] = numel * es;
                res = zero__mpi_stage_in(c, zero__mpi_pay_out(c, p, 1),
                                         (const unsigned char *)send + (size_t)p * numel * es, numel * es);
            }
        } else if (kind == ZERO__MPI_ALL_GATHER || rank == root) { /* my block to everyone */
            for (p = 0; p < world; p++) c->plen[p] = p == rank ? 0 : numel * es;
            res = zero__mpi_stage_all(c, send, numel * es);
        }
        break;
    case ZERO__MPI_ONE_ROUND: /* the whole buffer to everyone */
        for (p = 0; p < world; p++) c->plen[p] = p == rank ? 0 : bytes;
        res = zero__mpi_stage_all(c, send, bytes);
        break;
    case ZERO__MPI_INLINE_SLICES: /* slice p to peer p */
        per_peer = 1;
        for (p = 0; p < world && res == ZERO_OK; p++) {
            size_t off, len;
            if (p == rank) continue;
            zero__local_slice(numel, es, world, p, &off, &len);
            c->plen[p] = len * es;
            if (len)
                res = zero__mpi_stage_in(c, zero__mpi_pay_out(c, p, 1), (const unsigned char *)send + off * es,
                                         len * es);
        }
        break;
    default: break;
    }
    if (res == ZERO_OK && mode != ZERO__MPI_HEADER_ONLY) res = zero__mpi_dev_sync(c);
    if (res != ZERO_OK) return res; /* a device failure: the device reports it on every later call */
    res = zero__mpi_round(c, f, per_peer, why);
    if (res != ZERO_OK) return res;
    if (kind == ZERO__MPI_BARRIER || kind == ZERO__MPI_LEAVE || kind == ZERO__MPI_ABORT || numel == 0)
        return ZERO_OK;
    if (mode != ZERO__MPI_HEADER_ONLY) return zero__mpi_finish_inline(c, kind, mode, send, recv, numel, dtype, op, root);

    /* The data round. */
    res = zero__mpi_dev_sync(c);
    if (res != ZERO_OK) return res;
    memset(&lay, 0, sizeof lay);
    memset(&x, 0, sizeof x);
    lay.send = (const unsigned char *)send;
    lay.recv = (unsigned char *)recv;
    lay.numel = numel;
    lay.es = es;
    lay.world = world;
    lay.rank = rank;
    lay.root = root;
    x.ctx = &lay;
    switch (kind) {
    case ZERO__MPI_ALL_GATHER: {
        unsigned char *mine = lay.recv + (size_t)rank * numel * es;
        lay.block = numel * es;
        if (mine != lay.send) { /* copied while the blocks travel */
            x.own_dst = mine;
            x.own_src = lay.send;
            x.own_bytes = lay.block;
        }
        x.send_at = zero__mpi_ag_send;
        x.recv_at = zero__mpi_ag_recv;
        res = zero__mpi_exchange(c, &x, ZERO__MPI_TAG_GATHER, what);
        if (res == ZERO_OK) res = zero__mpi_dev_sync(c);
        return res;
    }
    case ZERO__MPI_ALL_TO_ALL: {
        unsigned char *mine = lay.recv + (size_t)rank * numel * es;
        lay.block = numel * es;
        x.own_dst = mine; /* copied while the blocks travel */
        x.own_src = lay.send + (size_t)rank * lay.block;
        x.own_bytes = lay.block;
        x.send_at = zero__mpi_rs_send;
        x.recv_at = zero__mpi_a2a_recv;
        res = zero__mpi_exchange(c, &x, ZERO__MPI_TAG_DATA, what);
        if (res == ZERO_OK) res = zero__mpi_dev_sync(c);
        return res;
    }
    case ZERO__MPI_BROADCAST:
        lay.block = numel * es;
        lay.send = lay.recv;
        x.send_at = zero__mpi_bc_send;
        x.recv_at = zero__mpi_bc_recv;
        return zero__mpi_exchange(c, &x, ZERO__MPI_TAG_DATA, what);
    case ZERO__MPI_REDUCE_SCATTER:
        lay.block = numel * es;
        if (!zero__mpi_scratch(c, (size_t)world * lay.block))
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s (rank %d): %zu bytes of scratch", what, rank,
                              (size_t)world * lay.block);
        lay.scratch = c->scratch;
        x.send_at = zero__mpi_rs_send;
        x.recv_at = zero__mpi_rs_recv;
        res = zero__mpi_exchange(c, &x, ZERO__MPI_TAG_DATA, what);
        if (res != ZERO_OK) return res;
        for (p = 0; p < world; p++) c->srcs[p] = lay.scratch + (size_t)p * lay.block;
        return zero__mpi_reduce(c, recv, lay.send + (size_t)rank * lay.block,
                                lay.scratch + (size_t)rank * lay.block, numel, dtype, op);
    default: { /* ZERO__MPI_ALL_REDUCE */
        size_t off, len;
        if (zero__mpi_whole(world, bytes)) { /* one round: every peer's whole buffer */
            if (!zero__mpi_scratch(c, (size_t)world * bytes))
                return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s (rank %d): %zu bytes of scratch", what, rank,
                                  (size_t)world * bytes);
            lay.block = bytes;
            lay.scratch = c->scratch;
            x.send_at = zero__mpi_ag_send; /* my whole buffer to every peer */
            x.recv_at = zero__mpi_rs_recv; /* peer p's into scratch + p * bytes */
            res = zero__mpi_exchange(c, &x, ZERO__MPI_TAG_DATA, what);
            if (res != ZERO_OK) return res;
            for (p = 0; p < world; p++) c->srcs[p] = lay.scratch + (size_t)p * bytes;
            return zero__mpi_reduce(c, recv, lay.send, lay.scratch + (size_t)rank * bytes, numel, dtype, op);
        }
        zero__local_slice(numel, es, world, rank, &off, &len);
        if (!zero__mpi_scratch(c, (size_t)world * len * es + 1))
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s (rank %d): %zu bytes of scratch", what, rank,
                              (size_t)world * len * es);
        lay.scratch = c->scratch;
        x.send_at = zero__mpi_ar1_send;
        x.recv_at = zero__mpi_ar1_recv;
        res = zero__mpi_exchange(c, &x, ZERO__MPI_TAG_DATA, what);
        if (res != ZERO_OK) return res;
        if (len) {
            for (p = 0; p < world; p++) c->srcs[p] = lay.scratch + (size_t)p * len * es;
            res = zero__mpi_reduce(c, lay.recv + off * es, lay.send + off * es,
                                   lay.scratch + (size_t)rank * len * es, len, dtype, op);
            if (res != ZERO_OK) return res;
        }
        x.send_at = zero__mpi_ar2_send;
        x.recv_at = zero__mpi_ar2_recv;
        return zero__mpi_exchange(c, &x, ZERO__MPI_TAG_GATHER, what);
    }
    }
}

static zero_result zero__mpi_all_gather(zero_comm *comm, const void *send, void *recv, size_t send_numel,
                                        zero_dtype dtype, void *queue)
{
    (void)queue;
    return zero__mpi_collective(comm, ZERO__MPI_ALL_GATHER, send, recv, send_numel, dtype, ZERO_OP_SUM, 0);
}

static zero_result zero__mpi_all_to_all(zero_comm *comm, const void *send, void *recv, size_t numel,
                                        zero_dtype dtype, void *queue)
{
    (void)queue;
    return zero__mpi_collective(comm, ZERO__MPI_ALL_TO_ALL, send, recv, numel, dtype, ZERO_OP_SUM, 0);
}

static zero_result zero__mpi_reduce_scatter(zero_comm *comm, const void *send, void *recv,
                                            size_t recv_numel, zero_dtype dtype, zero_op op, void *queue)
{
    (void)queue;
    return zero__mpi_collective(comm, ZERO__MPI_REDUCE_SCATTER, send, recv, recv_numel, dtype, op, 0);
}

static zero_result zero__mpi_all_reduce(zero_comm *comm, const void *send, void *recv, size_t numel,
                                        zero_dtype dtype, zero_op op, void *queue)
{
    (void)queue;
    return zero__mpi_collective(comm, ZERO__MPI_ALL_REDUCE, send, recv, numel, dtype, op, 0);
}

static zero_result zero__mpi_broadcast(zero_comm *comm, void *buf, size_t numel, zero_dtype dtype, int root,
                                       void *queue)
{
    (void)queue;
    return zero__mpi_collective(comm, ZERO__MPI_BROADCAST, buf, buf, numel, dtype, ZERO_OP_SUM, root);
}

static zero_result zero__mpi_barrier(zero_comm *comm)
{
    zero__mpi_comm *c = zero__mpi_get(comm);
    zero_result r = c ? zero__mpi_dev_sync(c) : ZERO_OK;
    if (r != ZERO_OK) return r;
    return zero__mpi_collective(comm, ZERO__MPI_BARRIER, NULL, NULL, 0, ZERO_F32, ZERO_OP_SUM, 0);
}

/* ---- lifetime ---- */

/* Withdraws the posted gave-up receive (a receive cancels locally; MPI_Wait then returns
   at once) before the communicator is freed. Not after a timeout: the comm's buffers and
   communicator are kept then, and so is this request. */
static void zero__mpi_unpost(zero__mpi_comm *c)
{
    if (c->leak || c->gaveup_req == MPI_REQUEST_NULL) return;
    if (MPI_Cancel(&c->gaveup_req) == MPI_SUCCESS) (void)MPI_Wait(&c->gaveup_req, MPI_STATUS_IGNORE);
    else c->leak = 1; /* cannot withdraw it: keep what it may still write */
}

static void zero__mpi_free(zero__mpi_comm *c)
{
    zero_allocator a = c->allocator;
#if ZERO__MPI_SHM_OK
    if (c->shm) munmap(c->shm, c->shm_bytes); /* the peers keep their own mappings */
#endif
    zero__free(&a, c->got);
    if (!c->leak) { /* else a pending request may still write these: keep them */
        zero__free(&a, c->sig);
        zero__free(&a, c->sigs);
        zero__free(&a, c->scratch);
        zero__free(&a, c->pkt_mem);
    }
    zero__free(&a, c->reqs);
    zero__free(&a, c->idx);
    zero__free(&a, (void *)c->srcs);
    zero__free(&a, c->plen);
    zero__free(&a, c);
}

static void zero__mpi_destroy(zero_comm *comm)
{
    zero__mpi_comm *c = zero__mpi_get(comm);
    zero_comm_tag saved;
    if (!c) return;
    if (c->broken == ZERO_OK) {
        /* The last round: peers still in a collective learn that this rank left. */
        saved = comm->tag;
        memset(&comm->tag, 0, sizeof comm->tag);
        (void)zero__mpi_collective(comm, ZERO__MPI_LEAVE, NULL, NULL, 0, ZERO_F32, ZERO_OP_SUM, 0);
        comm->tag = saved;
    }
    /* After a timeout, requests may still be pending on the communicator, and Open MPI's
       progress engine follows freed communicators of pending nonblocking collectives: keep
       it (and the buffers) for the rest of the process. */
    zero__mpi_unpost(c);
    if (!c->leak) MPI_Comm_free(&c->mc);
    comm->impl = NULL; /* a stale handle is then rejected, not followed */
    zero__mpi_free(c);
}

static zero_result zero__mpi_split(zero_comm *comm, int color, int key, zero_comm **out);

static const zero_comm_ops zero__mpi_ops = {
    "mpi",
    zero__mpi_destroy,
    zero__mpi_all_gather,
    zero__mpi_reduce_scatter,
    zero__mpi_all_reduce,
    zero__mpi_broadcast,
    zero__mpi_barrier,
    NULL,
    NULL,
    zero__mpi_all_to_all,
    zero__mpi_split,
};

/* zero_comm_split: first an agreement round over the parent (an all-gather of every rank's
   color, deadline-bounded like every collective, so a rank that never calls split fails
   its peers with TIMEOUT instead of hanging them in MPI_Comm_split); then MPI_Comm_split,
   which every rank has reached, and zero_mpi_create on the result (duplicated; the split
   communicator is freed). The child has the parent's timeout, device and allocator. */
static zero_result zero__mpi_split(zero_comm *comm, int color, int key, zero_comm **out)
{
    zero__mpi_comm *c = zero__mpi_get(comm);
    zero_mpi_desc d;
    MPI_Comm part = MPI_COMM_NULL;
    zero_comm *child = NULL;
    zero_result r;
    double me[2], *all, fail;
    int rc, had;
    char e[MPI_MAX_ERROR_STRING + 1];
    if (!c || !out)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_comm_split: %s",
                          out ? "comm is not an MPI comm" : "out is NULL");
    *out = NULL;
    all = (double *)zero__alloc(&c->allocator, 2 * (size_t)comm->world * sizeof *all);
    me[0] = (double)color;
    me[1] = (double)key;
    had = all != NULL;
    r = zero__mpi_all_gather(comm, all ? me : NULL, all, all ? 2 : 0, ZERO_F64, NULL);
    zero__free(&c->allocator, all);
    if (r != ZERO_OK) return r;
    if (!had) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_comm_split: out of memory");
    rc = MPI_Comm_split(c->mc, color >= 0 ? color : MPI_UNDEFINED, key, &part);
    if (rc != MPI_SUCCESS) {
        zero__mpi_errtext(rc, e, sizeof e);
        return zero__mpi_break(c, ZERO_ERROR_COMM, "zero_comm_split: MPI_Comm_split failed: %s", e);
    }
    if (part != MPI_COMM_NULL) {
        memset(&d, 0, sizeof d);
        d.comm = part;
        d.timeout_ms = c->timeout_ms;
        d.abort_on_timeout = c->abort_on_timeout;
        d.device = c->device;
        d.allocator = c->allocator;
        r = zero_mpi_create(&d, &child);
        MPI_Comm_free(&part);
    }
    /* every rank learns whether every child was made */
    fail = r != ZERO_OK ? 1.0 : 0.0;
    if (zero__mpi_all_reduce(comm, &fail, &fail, 1, ZERO_F64, ZERO_OP_MAX, NULL) != ZERO_OK ||
        fail != 0.0) {
        zero_comm_destroy(child);
        if (r != ZERO_OK) return r;
        return zero__fail(ZERO_ERROR_COMM, "zero_comm_split (rank %d): another rank failed to "
                          "make its part of the split (its error names the cause)", comm->rank);
    }
    *out = child;
    return ZERO_OK;
}

ZERODEF int zero_mpi_cuda_aware(void)
{
#if defined(ZERO_MPI_CUDA_AWARE) && ZERO_MPI_CUDA_AWARE
    return 1;
#elif defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
    return MPIX_Query_cuda_support() ? 1 : 0;
#else
    return 0;
#endif
}

/* One request of zero_mpi_create, waited for until the deadline: MPI_SUCCESS, MPI's error
   code, or -1 when the deadline passed (the request stays pending). */
static int zero__mpi_wait_one(MPI_Request *req, double deadline)
{
    unsigned polls = 0;
    int done = 0, rc;
    for (;;) {
        rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || done) return rc;
        if ((++polls & 31u) == 0) {
            if (zero__mpi_now_ms() > deadline) return -1;
            sched_yield();
        }
    }
}

#if ZERO__MPI_SHM_OK
/* Shared-memory packets (zero__mpi_slot has the layout): rank 0 creates a file in /dev/shm
   of world regions and broadcasts its name with a random cookie; every rank maps it and
   checks the cookie (a rank on another node finds no such file, or another one); all
   agree (an all-reduce) and rank 0 removes the name. Where any rank failed, every rank
   sends its packets through MPI (returns ZERO_OK with c->shm NULL). Returns -1 on a
   timeout (a rank did not join; requests stay pending on c->sig), else MPI_SUCCESS or
   MPI's error code. Used up to 16 MiB in all (world^2 slots). */
static int zero__mpi_shm_refuse; /* test hook: nonzero = this rank fails to map the file */
static int zero__mpi_shm_setup(zero__mpi_comm *c, double deadline)
{
    static unsigned counter;
    int world = c->base.world, rank = c->base.rank, fd, rc;
    size_t inl = c->oversubscribed ? (size_t)(ZERO_MPI_INLINE_BYTES_OVERSUBSCRIBED) : (size_t)(ZERO_MPI_INLINE_BYTES_SHM);
    size_t room, slot, region, total;
    unsigned char *map = NULL;
    MPI_Request req;
    /* c->sig[16..27): {ok, cookie, bytes, name[64]}; c->sig[28], [29]: the agreement */
    int64_t *info = c->sig + 16;
    char *name = (char *)(void *)(info + 3);
    if (world < 2 || world > 512) return MPI_SUCCESS;
    /* the payload: at most the piece, 8 MiB / world, and what 16 MiB of slots leave */
    room = (((size_t)16 << 20) / (size_t)world - 64) / (2 * (size_t)world) / 64 * 64; /* bytes per slot */
    if (room < 64 + 1024) return MPI_SUCCESS; /* too many ranks: packets through MPI */
    if (inl > room - 64) inl = room - 64;
    if (inl > ZERO__MPI_PIECE) inl = ZERO__MPI_PIECE;
    if (inl > ((size_t)8 << 20) / (size_t)world) inl = ((size_t)8 << 20) / (size_t)world;
    slot = 64 + (inl + 63) / 64 * 64;
    region = 64 + 2 * (size_t)world * slot;
    total = region * (size_t)world;
    memset(info, 0, 11 * sizeof *info);
    if (rank == 0) {
        uint64_t cookie = (uint64_t)(zero__mpi_now_ms() * 1e6) ^ ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)c ^
                          ((uint64_t)__atomic_fetch_add(&counter, 1u, __ATOMIC_RELAXED) << 32);
        snprintf(name, 64, "/dev/shm/zero_mpi.%ld.%016llx", (long)getpid(), (unsigned long long)cookie);
        fd = open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0) {
            /* reserved, not only sized: a tmpfs without room for it (a container's 64 MiB
               /dev/shm, other comms' files) fails here, and the packets go through MPI,
               where a sized file would kill the process (SIGBUS) at the first packet */
            if (posix_fallocate(fd, 0, (off_t)total) == 0) {
                void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) map = (unsigned char *)m;
            }
            close(fd);
            if (!map) unlink(name);
        }
        if (map) {
            memcpy(map + 16, &cookie, sizeof cookie);
            info[0] = 1;
            info[1] = (int64_t)cookie;
            info[2] = (int64_t)total;
        }
    }
    rc = MPI_Ibcast(info, 11 * (int)sizeof *info, MPI_BYTE, 0, c->mc, &req);
    if (rc == MPI_SUCCESS) rc = zero__mpi_wait_one(&req, deadline);
    if (rc == MPI_SUCCESS && rank != 0 && info[0] == 1 && info[2] == (int64_t)total) {
        name[63] = '\0';
        fd = open(name, O_RDWR);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size == total) {
                void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
                if (m != MAP_FAILED) map = (unsigned char *)m;
            }
            close(fd);
        }
        if (map && memcmp(map + 16, &info[1], sizeof info[1]) != 0) { /* another node's file */
            munmap(map, total);
            map = NULL;
        }
    }
    if (map && zero__mpi_shm_refuse) { /* test hook: as a rank that could not map the file */
        munmap(map, total);
        map = NULL;
        if (rank == 0) unlink(name);
    }
    c->sig[28] = map != NULL;
    if (rc == MPI_SUCCESS) rc = MPI_Iallreduce(&c->sig[28], &c->sig[29], 1, MPI_INT64_T, MPI_MIN, c->mc, &req);
    if (rc == MPI_SUCCESS) rc = zero__mpi_wait_one(&req, deadline);
    if (rank == 0 && map) unlink(name); /* every rank has mapped it, or never will */
    if (rc == MPI_SUCCESS && c->sig[29] == 1) {
        c->shm = map;
        c->shm_bytes = total;
        c->shm_region = region;
        c->slot = slot;
        c->inl = inl;
    } else if (map) {
        munmap(map, total);
    }
    return rc;
}
#endif

/* zero_mpi_create's failure after the duplication: frees the comm and says which MPI step
   failed (rc: its error code). */
static zero_result zero__mpi_create_failed(zero__mpi_comm *c, int rc, const char *step)
{
    char e[MPI_MAX_ERROR_STRING + 1];
    zero__mpi_errtext(rc, e, sizeof e);
    MPI_Comm_free(&c->mc);
    zero__mpi_free(c);
    return zero__fail(ZERO_ERROR_COMM, "zero_mpi_create: %s failed: %s", step, e);
}

ZERODEF zero_result zero_mpi_create(const zero_mpi_desc *desc, zero_comm **out)
{
    MPI_Comm zero_bytes_comm; /* all-zero bytes: "default" in a zeroed desc */
    zero__mpi_comm *c;
    zero_allocator a;
    MPI_Comm base;
    MPI_Request req;
    int inited = 0, finalized = 0, rank = 0, world = 0, rc, done = 0;
    double deadline;
    char e[MPI_MAX_ERROR_STRING + 1];
    memset(&zero_bytes_comm, 0, sizeof zero_bytes_comm);
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_mpi_create: out is NULL");
    *out = NULL;
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_mpi_create: desc is NULL");
    if (desc->timeout_ms < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_mpi_create: timeout_ms = %d (0 = default, else > 0)",
                          desc->timeout_ms);
    if ((desc->allocator.alloc != NULL) != (desc->allocator.free != NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_mpi_create: allocator needs both alloc and free, or neither");
    if (desc->device && (!desc->device->ops || !desc->device->ops->sync || !desc->device->ops->copy ||
                         !desc->device->ops->upload || !desc->device->ops->download))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_mpi_create: device lacks sync/copy/upload/download");
    if (desc->device && strcmp(desc->device->ops->name ? desc->device->ops->name : "", "host") != 0 &&
        !zero_mpi_cuda_aware())
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "zero_mpi_create: buffers on device \"%s\" need a CUDA-aware MPI, and this MPI "
                          "library is not (zero_mpi_cuda_aware() = 0)",
                          desc->device->ops->name ? desc->device->ops->name : "?");
    if (MPI_Initialized(&inited) != MPI_SUCCESS || !inited || MPI_Finalized(&finalized) != MPI_SUCCESS ||
        finalized)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_mpi_create: MPI is %s (call MPI_Init first)",
                          finalized ? "finalised" : "not initialised");
    base = memcmp(&desc->comm, &zero_bytes_comm, sizeof base) == 0 ? MPI_COMM_WORLD : desc->comm;
    if (base == MPI_COMM_NULL)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_mpi_create: desc->comm is MPI_COMM_NULL");
    a = desc->allocator;
    c = (zero__mpi_comm *)zero__alloc(&a, sizeof *c);
    if (!c) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_mpi_create: out of memory");
    memset(c, 0, sizeof *c);
    c->gaveup_req = MPI_REQUEST_NULL;
    c->allocator = a;
    c->timeout_ms = desc->timeout_ms ? desc->timeout_ms : ZERO_MPI_DEFAULT_TIMEOUT_MS;
    c->abort_on_timeout = desc->abort_on_timeout;
    c->device = desc->device;
    c->simd = zero_simd_detect();
    deadline = zero__mpi_now_ms() + c->timeout_ms;

    c->mc = MPI_COMM_NULL;
    rc = MPI_Comm_idup(base, &c->mc, &req); /* written when it completes: c->mc, not a local */
    if (rc == MPI_SUCCESS) rc = zero__mpi_wait_one(&req, deadline);
    if (rc == -1) /* c is kept: MPI writes c->mc when the duplication completes */
        return zero__fail(ZERO_ERROR_TIMEOUT,
                          "zero_mpi_create: MPI_Comm_idup did not complete in %d ms (a rank did not "
                          "call zero_mpi_create)",
                          desc->timeout_ms ? desc->timeout_ms : ZERO_MPI_DEFAULT_TIMEOUT_MS);
    done = rc == MPI_SUCCESS;
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(c->mc, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(c->mc, &rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(c->mc, &world);
    if (rc != MPI_SUCCESS) {
        zero__mpi_errtext(rc, e, sizeof e);
        if (done && c->mc != MPI_COMM_NULL) MPI_Comm_free(&c->mc);
        zero__free(&a, c);
        return zero__fail(ZERO_ERROR_COMM, "zero_mpi_create: duplicating the communicator failed: %s", e);
    }
    c->base.ops = &zero__mpi_ops;
    c->base.impl = c;
    c->base.rank = rank;
    c->base.world = world;
    c->sig = (int64_t *)zero__alloc(&a, 4 * ZERO__MPI_NF * sizeof(int64_t));
    c->sigs = (int64_t *)zero__alloc(&a, (size_t)world * ZERO__MPI_NF * sizeof(int64_t));
    c->srcs = (const void **)zero__alloc(&a, (size_t)world * sizeof *c->srcs);
    c->plen = (size_t *)zero__alloc(&a, (size_t)world * sizeof *c->plen);
    {   /* more ranks on this node than cores (mpirun's count, where it tells): yield while
           spinning, as Open MPI's own waits do when oversubscribed; and if any node is,
           the packets carry more (every rank must use the same size: agreed here) */
        const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        long cores = sysconf(_SC_NPROCESSORS_ONLN), local;
        if (!ls) ls = getenv("MPI_LOCALNRANKS"); /* MPICH's Hydra */
        local = ls ? strtol(ls, NULL, 10) : 0;
        c->yield = cores > 0 && local > cores;
        rc = MPI_Iallreduce(&c->yield, &c->oversubscribed, 1, MPI_INT, MPI_MAX, c->mc, &req);
        if (rc == MPI_SUCCESS) rc = zero__mpi_wait_one(&req, deadline);
        if (rc == -1) /* c stays: MPI may still write c->oversubscribed */
            return zero__fail(ZERO_ERROR_TIMEOUT, "zero_mpi_create: a rank did not join in %d ms", c->timeout_ms);
        if (rc != MPI_SUCCESS) return zero__mpi_create_failed(c, rc, "MPI_Iallreduce");
        c->inl = c->oversubscribed ? (size_t)(ZERO_MPI_INLINE_BYTES_OVERSUBSCRIBED) : (size_t)(ZERO_MPI_INLINE_BYTES);
    }
    if (c->inl > ZERO__MPI_PIECE) c->inl = ZERO__MPI_PIECE;
    if (c->inl > ((size_t)8 << 20) / (size_t)world) c->inl = ((size_t)8 << 20) / (size_t)world;
    if (c->inl < 1024) c->inl = ZERO__MPI_PIECE < 1024 ? ZERO__MPI_PIECE : 1024;
    c->slot = (ZERO__MPI_HDR + c->inl + 63) / 64 * 64;
    c->got = (unsigned char *)zero__alloc(&a, (size_t)world);
#if ZERO__MPI_SHM_OK
    if (c->sig) {
        rc = zero__mpi_shm_setup(c, deadline);
        if (rc == -1) /* c stays: MPI may still write c->sig */
            return zero__fail(ZERO_ERROR_TIMEOUT, "zero_mpi_create: a rank did not join in %d ms", c->timeout_ms);
        if (rc != MPI_SUCCESS) return zero__mpi_create_failed(c, rc, "setting up shared memory");
    }
#endif
    /* Packets start on 64-byte boundaries (slot is a multiple of 64): Open MPI's
       shared-memory fragments hold their data at a fixed offset modulo 64, so its copies
       of our packets (in and out) keep source and destination aligned alike (see
       ZERO__MPI_HDR on why that matters). In shared memory there are none: the packets
       are the peers' inbox slots, this rank's signature is c->hdr. */
    if (!c->shm) {
        c->pkt_mem = (unsigned char *)zero__alloc(&a, 2 * (size_t)world * c->slot + 64);
        if (c->pkt_mem) {
            c->pkt_in = c->pkt_mem + (64 - (size_t)((uintptr_t)c->pkt_mem % 64)) % 64;
            c->pkt_out = c->pkt_in + (size_t)world * c->slot;
        }
    }
    if (!c->sig || !c->sigs || !c->srcs || !c->plen || (!c->pkt_mem && !c->shm) || !c->got ||
        !zero__mpi_reqs(c, 2 * (size_t)world)) {
        MPI_Comm_free(&c->mc);
        zero__mpi_free(c);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_mpi_create: out of memory (world %d)", world);
    }
    rc = MPI_Irecv(c->sig + 8, 4, MPI_INT64_T, MPI_ANY_SOURCE, ZERO__MPI_TAG_GAVEUP, c->mc, &c->gaveup_req);
    if (rc != MPI_SUCCESS) {
        c->gaveup_req = MPI_REQUEST_NULL;
        return zero__mpi_create_failed(c, rc, "posting a receive");
    }
    *out = &c->base;
    return ZERO_OK;
}

ZERODEF int zero_mpi_is(const zero_comm *comm)
{
    return comm && comm->ops == &zero__mpi_ops && comm->impl != NULL;
}

ZERODEF zero_result zero_mpi_status(zero_comm *comm)
{
    zero__mpi_comm *c = zero__mpi_get(comm);
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_mpi_status: comm is not an MPI comm");
    if (c->broken != ZERO_OK) return zero__fail(c->broken, "%s", c->broken_msg);
    return ZERO_OK;
}

ZERODEF zero_result zero_mpi_abort(zero_comm *comm)
{
    zero__mpi_comm *c = zero__mpi_get(comm);
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_mpi_abort: comm is not an MPI comm");
    if (c->broken == ZERO_OK) {
        zero_comm_tag saved = comm->tag;
        memset(&comm->tag, 0, sizeof comm->tag);
        (void)zero__mpi_collective(comm, ZERO__MPI_ABORT, NULL, NULL, 0, ZERO_F32, ZERO_OP_SUM, 0);
        comm->tag = saved;
        if (c->broken == ZERO_OK) /* every rank aborted together */
            (void)zero__mpi_break(c, ZERO_ERROR_COMM, "rank %d called zero_mpi_abort", comm->rank);
    }
    return ZERO_OK;
}

ZERODEF MPI_Comm zero_mpi_handle(zero_comm *comm)
{
    zero__mpi_comm *c = zero__mpi_get(comm);
    return c ? c->mc : MPI_COMM_NULL;
}

ZERODEF zero_result zero_mpi_bcast_bytes(MPI_Comm comm, int root, void *buf, size_t bytes, int timeout_ms)
{
    double deadline;
    size_t off;
    int rc = MPI_SUCCESS, world = 0;
    char e[MPI_MAX_ERROR_STRING + 1];
    if (comm == MPI_COMM_NULL || (!buf && bytes) || timeout_ms < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_mpi_bcast_bytes: comm is MPI_COMM_NULL, buf NULL or timeout_ms < 0");
    rc = MPI_Comm_size(comm, &world);
    if (rc == MPI_SUCCESS && (root < 0 || root >= world))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_mpi_bcast_bytes: root = %d with world = %d", root,
                          world);
    deadline = zero__mpi_now_ms() + (timeout_ms ? timeout_ms : ZERO_MPI_DEFAULT_TIMEOUT_MS);
    for (off = 0; rc == MPI_SUCCESS && (off < bytes || (bytes == 0 && off == 0)); off += ZERO__MPI_PIECE) {
        size_t len = bytes - off < ZERO__MPI_PIECE ? bytes - off : ZERO__MPI_PIECE;
        MPI_Request req;
        int done = 0;
        unsigned polls = 0;
        rc = MPI_Ibcast((unsigned char *)buf + off, (int)len, MPI_BYTE, root, comm, &req);
        while (rc == MPI_SUCCESS && !done) {
            rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
            if (rc == MPI_SUCCESS && !done && (++polls & 31u) == 0) {
                if (zero__mpi_now_ms() > deadline)
                    return zero__fail(ZERO_ERROR_TIMEOUT,
                                      "zero_mpi_bcast_bytes: not complete after %d ms (a rank did not join)",
                                      timeout_ms ? timeout_ms : ZERO_MPI_DEFAULT_TIMEOUT_MS);
                sched_yield();
            }
        }
        if (bytes == 0) break;
    }
    if (rc != MPI_SUCCESS) {
        zero__mpi_errtext(rc, e, sizeof e);
        return zero__fail(ZERO_ERROR_COMM, "zero_mpi_bcast_bytes: %s", e);
    }
    return ZERO_OK;
}

#if defined(ZERO_NCCL_H) && !defined(ZERO_NCCL_BOOTSTRAP_ONLY)
ZERODEF zero_result zero_mpi_nccl_unique_id(MPI_Comm comm, int root, void *id, int timeout_ms)
{
    int rank = -1;
    if (!id) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_mpi_nccl_unique_id: id is NULL");
    if (comm == MPI_COMM_NULL || MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_mpi_nccl_unique_id: not a valid communicator");
    if (rank == root) {
        zero_result r = zero_nccl_unique_id(id);
        if (r != ZERO_OK) return r; /* the others time out in the broadcast */
    }
    return zero_mpi_bcast_bytes(comm, root, id, ZERO_NCCL_ID_BYTES, timeout_ms);
}
#endif

#ifdef __cplusplus
}
#endif

#endif /* ZERO_MPI_IMPLEMENTATION */
