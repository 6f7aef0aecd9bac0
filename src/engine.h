/* Engine declarations (section of zero.h): ZeRO stages 0-3, written once against
   zero_device and zero_comm.

   One engine per rank. Every rank runs the same program (SPMD): the same registrations,
   the same calls in the same order; calls marked COLLECTIVE must be made by every rank of
   the comm. The engine owns the fp16/bf16/fp32 parameters, the gradients, the fp32
   master weights and Adam moments, and hands out device pointers into them.

   LIFECYCLE
       zero_engine_create(&desc, &e)            local: resolves the descriptor
       zero_engine_add_tensor(e, ...)           local: registers tensors (group = layer)
       zero_engine_commit(e)                    COLLECTIVE: lays out, checks that every rank
                                                registered the same (MISMATCH otherwise),
                                                allocates everything at once
       zero_engine_set_tensor(e, t, values)     local: initial fp32 values (same on every rank)
       loop over steps:
         loop accum_steps times (micro-steps):
           forward, g = 0..G-1:  zero_engine_gather(e, g, &p) ... zero_engine_release(e, g)
           backward, g = G-1..0: zero_engine_gather(e, g, &p); zero_engine_grads(e, g, &dg);
                                 write dL*scale/dp into dg; zero_engine_release(e, g);
                                 zero_engine_grads_ready(e, g)
         zero_engine_step(e, &info)             COLLECTIVE
       zero_engine_destroy(e)

   gather and prefetch are COLLECTIVE at stage 3, grads at stages 2-3, grads_ready and step at
   every stage: call them in the same order on every rank (release is local). At stages 0-2 gather and release only
   count references, so code written for stage 3 runs unchanged at every stage.

   GRADIENTS. The user writes gradients of (local mean loss * zero_engine_loss_scale(e)) in
   the param dtype into the buffer zero_engine_grads() hands out (zero-filled when handed
   out, so a backward may add into it). The engine averages over ranks and micro-steps:
   the multiplier is 1 / (loss_scale * world * accum_steps), times the clip coefficient.
   Each micro-step's gradients are reduced as soon as their group is ready (all-reduce at
   stage 0, reduce-scatter to the owner at stages 1-3) and accumulated in the comm dtype:
   the first micro-step's reduced values are stored as they are, each later one is added
   (one rounding), in the same order at every stage. Only the elements of registered
   tensors may be written; the padding between them must stay zero.

   QUEUES. The user's forward/backward belongs on ZERO_QUEUE_COMPUTE; collectives run on
   ZERO_QUEUE_COMM, ordered by events; the host waits only where it reads a value (end of
   step(), read_tensor). Pointers handed out are valid for compute-queue work enqueued after
   the call that returned them and until the matching release / grads_ready.

   DETERMINISM. With the local comm (rank-order sums, one rounding) stages 0, 1, 2 and 3 give
   bit-identical parameters, master weights and moments at the same world size, run after
   run. See docs/engine.md for what preserves and what breaks this.

   ERRORS. Every call validates the state and arguments and returns an error (detail in
   zero_last_error()) instead of aborting; a failed call changes nothing unless it says
   otherwise. After a device or comm failure inside a collective call the engine is
   "broken": every later call returns ZERO_ERROR_INVALID_STATE, and zero_engine_destroy()
   is always safe. */

/* The engine's stages (the paper's P_os, P_os+g, P_os+g+p). */
#define ZERO_STAGE_0 0 /* plain data parallel: everything whole on every rank         */
#define ZERO_STAGE_1 1 /* P_os: fp32 master, m, v partitioned                          */
#define ZERO_STAGE_2 2 /* P_os+g: also the gradients                                   */
#define ZERO_STAGE_3 3 /* P_os+g+p: also the fp16/bf16 params, gathered per group      */

/* Zero-initialised = defaults (see each field). */
typedef struct zero_engine_desc {
    int stage;                   /* 0..3 (0 = plain data parallel)                             */
    zero_dtype param_dtype;      /* DEFAULT = ZERO_F16; or ZERO_BF16, ZERO_F32. User gradients
                                    are in this dtype too.                                      */
    zero_dtype grad_comm_dtype;  /* reduction and accumulation dtype: DEFAULT = param_dtype;
                                    ZERO_F32 for accuracy (twice the gradient traffic)          */
    zero_adam_desc adam;         /* Adam/AdamW hyper-parameters (zero = defaults, AdamW)        */
    zero_scaler_desc scaler;     /* loss scaling (zero = dynamic for fp16, none otherwise)      */
    float clip_norm;             /* global gradient-norm clipping; 0 = none                     */
    int accum_steps;             /* micro-steps per step; 0 = 1                                 */
    size_t reduce_bucket_numel;  /* ready gradients are reduced once they total this many
                                    elements (and at the end of every micro-step); 0 = each
                                    group as soon as it is ready. Stages 2-3: the gradient
                                    bucket pool holds max(this, 2 x largest group) elements,
                                    in slots of the largest group's size.                        */
    size_t max_live_numel;       /* stage 3: gathered elements held at once, at most (the
                                    gather pool: slots of the largest non-persistent group);
                                    0 = (2 + prefetch depth) x largest non-persistent group.
                                    INVALID_ARGUMENT at commit if one group exceeds it.          */
    int prefetch_depth;          /* stage 3: groups gathered ahead; 0 = 1, negative = none      */
    size_t persist_numel;        /* stage 3: groups with fewer used elements stay whole on
                                    every rank (DeepSpeed's param_persistence_threshold);
                                    0 = none persistent (the paper's 3 Psi traffic)             */
    size_t align_numel;          /* tensor alignment in elements; 0 = ZERO_DEFAULT_ALIGN_NUMEL  */
    zero_device *device;         /* required; not owned                                         */
    zero_comm *comm;             /* required; not owned. world = comm->world                    */
    zero_allocator allocator;    /* host-side memory of the engine; all NULL = ZERO_MALLOC      */
    int host_threads;            /* threads for the engine's host-side work (conversions in
                                    set/read_tensor, later offload); 0 = 1                       */
} zero_engine_desc;

typedef struct zero_engine zero_engine;

/* Tensor flags for zero_engine_add_tensor(). */
#define ZERO_TENSOR_NO_DECAY 1u /* excluded from weight decay (biases, norms)                  */

/* Per-step outcome, filled by zero_engine_step(). */
typedef struct zero_step_info {
    int64_t step;          /* optimizer steps taken so far (skipped steps not counted)      */
    int skipped;           /* 1 when some rank saw inf/NaN: nothing was updated             */
    float loss_scale;      /* the scale this step's gradients carried                       */
    float next_loss_scale; /* the scale for the next step's gradients                       */
    float grad_norm;       /* global L2 norm of the averaged unscaled gradient, before
                              clipping; -1 when skipped                                      */
    float clip_coef;       /* clip_norm / (grad_norm + 1e-6) when clipping, else 1          */
    float grad_mul;        /* what multiplied the accumulated gradients: 1 / (scale * world
                              * accum) * clip_coef; 0 when skipped                           */
} zero_step_info;

/* Collective kinds of the traffic counters. */
typedef enum zero_coll {
    ZERO_COLL_ALL_GATHER = 0,
    ZERO_COLL_REDUCE_SCATTER = 1,
    ZERO_COLL_ALL_REDUCE = 2,
    ZERO_COLL_BROADCAST = 3,
    ZERO_COLL_CONTROL = 4, /* small control all-reduces: inf flag, norm, plan hash  */
    ZERO_COLL_COUNT = 5
} zero_coll;

/* Traffic per rank, as bus volume: an all-gather or reduce-scatter over a total of T
   elements moves T (N-1)/N per rank, an all-reduce 2 T (N-1)/N, a broadcast T (N-1)/N;
   nothing at N = 1. Control all-reduces are counted apart (ZERO_COLL_CONTROL) so the
   payload can be compared with the paper (2 Psi or 3 Psi per step, times (N-1)/N). */
typedef struct zero_traffic {
    uint64_t calls[ZERO_COLL_COUNT];
    double numel[ZERO_COLL_COUNT]; /* elements moved per rank (exact below 2^53)          */
    double bytes[ZERO_COLL_COUNT]; /* the same in bytes of each call's dtype              */
} zero_traffic;

/* Device bytes this rank's engine holds, by category, now and at peak (since commit). */
typedef struct zero_engine_memory {
    size_t bytes[ZERO_MEM_COUNT];
    size_t peak_bytes[ZERO_MEM_COUNT];
    size_t total_bytes;      /* sum of bytes[]                                            */
    size_t peak_total_bytes; /* peak of the sum                                           */
    size_t allocations;      /* live device allocations                                   */
} zero_engine_memory;

/* Stage 3 gather accounting (zeros at stages 0-2). Live numel counts gathered elements of
   non-persistent groups held in the gather pool, whether in use or prefetched. */
typedef struct zero_gather_stats {
    size_t limit_numel;     /* the pool: slots * slot_numel (<= max_live_numel)          */
    size_t slot_numel;      /* largest non-persistent group                              */
    int slots;
    size_t live_numel;      /* gathered now                                              */
    size_t peak_live_numel; /* most gathered at once since commit                        */
    int live_groups;        /* non-persistent groups gathered now (in use or prefetched) */
    uint64_t gathers;       /* all-gathers issued for non-persistent groups              */
    uint64_t prefetches;    /* of which issued ahead of use                              */
    uint64_t prefetch_hits; /* gathers served by a prefetch                              */
    uint64_t evictions;     /* prefetched groups dropped unused                          */
} zero_gather_stats;

/* What zero_engine_read_tensor() reads. */
typedef enum zero_state_kind {
    ZERO_STATE_PARAM = 0,  /* fp16/bf16/fp32 params (param dtype)                     */
    ZERO_STATE_MASTER = 1, /* fp32 master weights                                      */
    ZERO_STATE_M = 2,      /* fp32 Adam first moment                                   */
    ZERO_STATE_V = 3       /* fp32 Adam second moment                                  */
} zero_state_kind;

/* A new, uncommitted engine for one rank. Resolves and validates the descriptor (stage,
   dtypes, Adam and scaler settings, device and comm present); allocates only host memory.
   Errors: INVALID_ARGUMENT naming the field; OUT_OF_MEMORY. *out is NULL on error. */
ZERODEF zero_result zero_engine_create(const zero_engine_desc *desc, zero_engine **out);

/* Frees everything the engine allocated (device and host). Does not touch the device or
   the comm themselves. Safe at any point, also after errors; NULL is ignored. Never runs a
   collective. */
ZERODEF void zero_engine_destroy(zero_engine *e);

/* The descriptor with every default filled in (valid after create). */
ZERODEF zero_result zero_engine_get_desc(const zero_engine *e, zero_engine_desc *out);

/* Registers a tensor of numel elements in group 'group' (0..G-1; groups are gathered in
   ascending order in forward). flags: 0 or ZERO_TENSOR_NO_DECAY. Tensor ids are 0, 1, ...
   in registration order. Errors: INVALID_STATE after commit; INVALID_ARGUMENT for a bad
   name, numel 0, a negative group or unknown flags. */
ZERODEF zero_result zero_engine_add_tensor(zero_engine *e, const char *name, size_t numel,
                                           int group, unsigned flags, int *out_tensor);

/* COLLECTIVE. Lays out the plan for comm->world, checks with one control all-reduce that
   every rank has the same plan and settings (ZERO_ERROR_MISMATCH on every rank otherwise,
   before any large allocation), then calls device->ops->reserve (if any) and allocates every
   buffer; everything starts at zero. Nothing is allocated after this until destroy.
   Errors: INVALID_STATE if already committed or no tensor registered; INVALID_ARGUMENT for
   bad group ids or a stage-3 group larger than max_live_numel; MISMATCH; OUT_OF_MEMORY,
   DEVICE, COMM. After a failed commit the engine can only be destroyed. */
ZERODEF zero_result zero_engine_commit(zero_engine *e);

/* The committed plan (layout queries: zero_plan_tensor, zero_plan_group, ...); NULL
   before commit. Owned by the engine. */
ZERODEF const zero_plan *zero_engine_plan(const zero_engine *e);

/* Sets a tensor's values from numel fp32 host values (every rank passes the same): the
   master weights this rank owns and the params it stores (rounded to the param dtype).
   Moments are left as they are (zero after commit). Local, synchronous. Errors:
   INVALID_STATE before commit or between micro-steps of a step; NOT_FOUND; INVALID_ARGUMENT
   for NULL values. */
ZERODEF zero_result zero_engine_set_tensor(zero_engine *e, int tensor, const float *values);

/* Reads this rank's copy of a tensor's state into host memory, in tensor coordinates:
   host_dst holds the tensor's numel elements (param dtype for PARAM, fp32 otherwise); only
   the range this rank holds is written and returned in *out_range (offset and numel within
   the tensor): MASTER, M and V: the tensor's intersection with this rank's shard (at every
   stage, stage 0 included); PARAM: the whole tensor at stages 0-2 and for persistent
   groups, the shard intersection otherwise. Local, synchronous (waits for the device). */
ZERODEF zero_result zero_engine_read_tensor(zero_engine *e, int tensor, zero_state_kind kind,
                                            void *host_dst, zero_range *out_range);

/* COLLECTIVE at stage 3. Makes group g's parameters available and returns a device pointer
   to its flat buffer (param dtype, group numel elements; tensor t at zero_plan_tensor's
   offset). Stage 3: all-gathers the group into a gather-pool slot unless it is already
   gathered or persistent, then prefetches up to prefetch_depth groups in the current
   direction (ascending in forward; descending once gradients were requested in this
   micro-step or when g does not exceed the previous group gathered) while slots are free.
   Stages 0-2: the whole param buffer, no communication. Gathers are counted: each needs a
   matching zero_engine_release(). Errors: NOT_FOUND for an unknown group; INVALID_STATE
   before commit or when the pool is full of groups in use (release some first). */
ZERODEF zero_result zero_engine_gather(zero_engine *e, int group, void **out_params);

/* Ends one use of group g's parameters. Stage 3: when the count drops to zero the slot is
   returned to the pool (after the compute work already enqueued). Persistent groups stay.
   Errors: NOT_FOUND; INVALID_STATE when g is not gathered (released twice). */
ZERODEF zero_result zero_engine_release(zero_engine *e, int group);

/* COLLECTIVE at stage 3 (a prefetch is an all-gather). Starts gathering group g ahead of
   use if it is not gathered and a slot is free; does nothing otherwise (a hint, not a
   reference: no release needed). Stages 0-2: nothing. */
ZERODEF zero_result zero_engine_prefetch(zero_engine *e, int group);

/* COLLECTIVE at stages 2-3 (when every bucket slot is taken it first reduces the ready
   groups still pending). The buffer for this micro-step's gradients of group g (param
   dtype, group numel elements, tensor layout as in gather), zero-filled. Stages 0-1: a
   slice of the whole gradient buffer; stages 2-3: a slot of the bucket pool. Calling it again before
   grads_ready returns the same buffer unchanged. Errors: NOT_FOUND; INVALID_STATE before
   commit, when g is already ready in this micro-step, when the step's micro-steps are all
   done, or (stages 2-3) when every bucket slot is held by groups not yet ready. */
ZERODEF zero_result zero_engine_grads(zero_engine *e, int group, void **out_grads);

/* COLLECTIVE. Group g's gradients for this micro-step are written (by work enqueued on the
   compute queue before this call). Its reduction starts (or joins the pending bucket);
   once every group is ready the micro-step is complete. The buffer must not be touched
   afterwards. Errors: NOT_FOUND; INVALID_STATE when zero_engine_grads(g) was not called in
   this micro-step, or g is already ready; COMM/DEVICE (engine broken). */
ZERODEF zero_result zero_engine_grads_ready(zero_engine *e, int group);

/* COLLECTIVE. The optimizer step, after exactly accum_steps complete micro-steps:
   unscale, inf/NaN check agreed by all ranks (skip together), global norm, clip,
   Adam/AdamW on this rank's shard (stage 0: on everything), all-gather of the updated
   params (stages 1-2; stage 3: persistent groups), loss-scaler update. Stage 3 drops
   prefetched groups (their values are stale). info may be NULL.
   Errors (nothing changed, engine usable): INVALID_STATE before commit, before any
   gradient, after a number of micro-steps other than accum_steps, or while a group is
   still gathered (release every group first). COMM/DEVICE: engine broken. */
ZERODEF zero_result zero_engine_step(zero_engine *e, zero_step_info *info);

/* The scale to multiply the loss by in this step's micro-steps (1 without scaling). */
ZERODEF float zero_engine_loss_scale(const zero_engine *e);

/* Optimizer steps taken (skipped steps not counted). */
ZERODEF int64_t zero_engine_step_count(const zero_engine *e);

/* Changes the learning rate from the next step on (schedules). INVALID_ARGUMENT for a
   negative or non-finite lr. */
ZERODEF zero_result zero_engine_set_lr(zero_engine *e, float lr);

/* Device bytes held by this rank's engine, by category, now and at peak. */
ZERODEF zero_result zero_engine_memory_usage(const zero_engine *e, zero_engine_memory *out);

/* Traffic of the last step (from the end of the previous step(), or commit, to the end of
   the last step(); may be NULL) and since commit (may be NULL). Commit's hash check counts
   in the total only. */
ZERODEF zero_result zero_engine_traffic(const zero_engine *e, zero_traffic *last_step,
                                        zero_traffic *total);

/* Elements moved over payload kinds (everything but ZERO_COLL_CONTROL). */
ZERODEF double zero_traffic_payload_numel(const zero_traffic *t);

/* Stage 3 gather-pool accounting. */
ZERODEF zero_result zero_engine_gather_stats(const zero_engine *e, zero_gather_stats *out);

/* "all_gather", "reduce_scatter", "all_reduce", "broadcast", "control" or "?". */
ZERODEF const char *zero_coll_name(zero_coll kind);
