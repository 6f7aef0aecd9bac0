/* Local comm declarations (section of zero.h): N ranks as threads of one process.

   A group holds 'world' ranks; each rank gets its own zero_comm and calls every collective
   from its own thread. Collectives complete before they return (queue is ignored and
   should be NULL). Semantics (docs/backends.md):

   - Determinism. SUM reduces in rank order 0..N-1, starting from rank 0's element,
     accumulating in fp32 (fp64 for F64) and rounding once to the dtype. An element's
     result therefore depends only on the N input elements: block r of a reduce_scatter is
     bit for bit the same elements of an all_reduce of the same input. MAX takes the
     largest element (NaN if any input is NaN).
   - Agreement. Every collective checks that all ranks called the same collective with the
     same numel, dtype, op and root. If not, every rank returns ZERO_ERROR_MISMATCH (a rank
     whose own arguments were invalid returns ZERO_ERROR_INVALID_ARGUMENT) and the group
     stays usable.
   - Failure. A rank that waits more than timeout_ms for its peers returns
     ZERO_ERROR_TIMEOUT, zero_local_abort() or destroying a comm makes waiting peers return
     ZERO_ERROR_COMM; either breaks the group, and every later collective on it fails at
     once with the same code and a message naming the cause. No rank returns (even with an
     error) while a peer may still read its buffers.
   - In place. all_gather with send == recv + rank * send_numel, all_reduce with
     send == recv, and reduce_scatter with recv == send + rank * recv_numel all work.
   - numel 0 is a valid collective (a synchronisation point whose arguments are checked);
     the buffers may then be NULL. */

typedef struct zero_local_desc {
    int world;                /* ranks, >= 1                                           */
    int timeout_ms;           /* how long a rank waits for its peers; 0 = 60000        */
    zero_allocator allocator; /* for the group and its comms; all NULL = ZERO_MALLOC   */
} zero_local_desc;

typedef struct zero_local_group zero_local_group;

/* A new group of desc->world ranks. INVALID_ARGUMENT: world < 1, timeout_ms < 0. */
ZERODEF zero_result zero_local_group_create(const zero_local_desc *desc, zero_local_group **out);

/* Releases the group. Meant for after every comm of it is destroyed; if some are still
   alive, the memory is released when the last of them is destroyed. NULL is ignored. */
ZERODEF void zero_local_group_destroy(zero_local_group *group);

/* Rank 'rank''s comm (one per rank; the rank's thread uses it). INVALID_ARGUMENT for a
   rank outside 0..world-1, INVALID_STATE when that rank already has a comm. */
ZERODEF zero_result zero_local_comm_create(zero_local_group *group, int rank, zero_comm **out);

/* Any backend's comm: comm->ops->destroy(comm). NULL is ignored. Destroying a local comm
   breaks its group (peers waiting in a collective return ZERO_ERROR_COMM). */
ZERODEF void zero_comm_destroy(zero_comm *comm);

/* Wakes every rank waiting in a collective of comm's group with ZERO_ERROR_COMM and breaks
   the group. Callable from any thread. INVALID_ARGUMENT when comm is not a local comm. */
ZERODEF zero_result zero_local_abort(zero_comm *comm);

/* Runs fn(rank, comm, user) on 'world' threads with a fresh group (default timeout) and
   waits for all of them. A rank whose fn returns an error (or returns at all) destroys its
   comm, so peers still waiting for it fail with ZERO_ERROR_COMM instead of hanging.
   Returns ZERO_OK when every rank returned ZERO_OK; otherwise the error of the lowest
   rank that failed before the group broke (the root cause), or else of the lowest failing
   rank; zero_last_error() on the calling thread then says "rank R: <its message>". */
ZERODEF zero_result zero_local_run(int world, zero_result (*fn)(int rank, zero_comm *comm, void *user),
                                   void *user);

/* As zero_local_run() with a descriptor (world, timeout, allocator). */
ZERODEF zero_result zero_local_run_desc(const zero_local_desc *desc,
                                        zero_result (*fn)(int rank, zero_comm *comm, void *user),
                                        void *user);
