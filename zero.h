/* zero.h - the Zero Redundancy Optimizer (ZeRO) as a single-file C library.

   Do this:
       #define ZERO_IMPLEMENTATION
   before you include this file in *one* C or C++ file to create the implementation.

       // in exactly one .c file
       #define ZERO_IMPLEMENTATION
       #include "zero.h"

   Every other file includes "zero.h" without the define.

   WHAT IT IS
   ZeRO (Rajbhandari et al., SC20, arXiv 1910.02054) removes the redundancy of plain data
   parallelism by partitioning, across N data-parallel ranks, the optimizer state (stage 1,
   P_os), the gradients (stage 2, P_os+g) and the parameters (stage 3, P_os+g+p). This file
   holds everything that does not need a GPU:

       results      zero_result, zero_result_string(), zero_last_error()
       memory       ZERO_MALLOC / ZERO_FREE hooks, zero_allocator in descriptors
       conversion   fp32 <-> fp16 / bf16, scalar and bulk (SIMD where the CPU has it)
       quantization int8 / int4 blocks with one scale each (ZeRO++'s qwZ and qgZ)
       plan         flat buffers, groups, shards, tensor views and intersections
       estimator    bytes per rank for stages 0-3 (paper and DeepSpeed formulas)
       comm         the collective interface; the in-process local comm (ranks as threads)
       device       the device interface; the host device (synchronous, on the CPU)
       optimizer    Adam / AdamW: one element expression shared by every backend
       scaler       dynamic loss scaling with DeepSpeed's rule (0.17.1+) and defaults
       nvme i/o     zero_io_*: asynchronous O_DIRECT file I/O (io_uring or a thread pool) with
                    a checksum per range, for ZeRO-Infinity's NVMe tier (Linux)
       engine       stages 0-3 written once against the two interfaces above
       checkpoint   crash-safe sharded save/load, resharding, safetensors in and out

   zero_cuda.h adds a CUDA device, zero_nccl.h an NCCL comm; the engine does not change.

   QUICK START: a complete program (one engine per rank; here 4 ranks as threads of one
   process). `make compile-tests` extracts the lines between the two markers and compiles
   and runs them as they are.
   ---- quick start: begin ----
   #define ZERO_IMPLEMENTATION
   #include "zero.h"
   #include <stdio.h>
   #include <string.h>

   #define G 2 // groups: the unit of gathering at stage 3, typically one layer each
   #define T 4 // tensors
   static const size_t numel[T] = {64 * 32, 32, 32 * 8, 8}; // w0, b0, w1, b1
   static const int group_of[T] = {0, 0, 1, 1};

   static zero_result rank_main(int rank, zero_comm *comm, void *user)
   {
       zero_device *dev = NULL;
       zero_engine *e = NULL;
       zero_engine_desc d;
       zero_step_info info;
       zero_result r;
       int ids[T], t, g, s; // keep every tensor's id: they are 0, 1, ... in order
       float init[64 * 32];
       (void)user;
       r = zero_host_device_create(NULL, &dev); // or zero_cuda_device_create (zero_cuda.h)
       if (r != ZERO_OK) return r;
       memset(&d, 0, sizeof d); // zero = defaults: fp16 params, AdamW, dynamic loss scale
       d.stage = 3;
       d.device = dev;
       d.comm = comm;
       d.adam.lr = 1e-3;
       d.debug_guards = 1; // while integrating (see WHILE INTEGRATING); off for speed later
       r = zero_engine_create(&d, &e);
       for (t = 0; t < T && r == ZERO_OK; t++) {
           char name[8];
           snprintf(name, sizeof name, "%c%d", t % 2 ? 'b' : 'w', t / 2);
           r = zero_engine_add_tensor(e, name, numel[t], group_of[t],
                                      t % 2 ? ZERO_TENSOR_NO_DECAY : 0, &ids[t]);
       }
       if (r == ZERO_OK) r = zero_engine_commit(e); // collective: layout, checks, memory
       for (t = 0; t < T && r == ZERO_OK; t++) { // the same values on every rank
           size_t i;
           for (i = 0; i < numel[t]; i++) init[i] = 0.01f * (float)((i * 7 + (size_t)t) % 13) - 0.06f;
           r = zero_engine_set_tensor(e, ids[t], init);
       }
       for (s = 0; s < 3 && r == ZERO_OK; s++) {
           void *p, *dg;
           for (g = 0; g < G && r == ZERO_OK; g++) { // forward, layer by layer
               r = zero_engine_gather(e, g, &p); // p: group g's flat params (fp16 here)
               // ... layer g's forward reads its tensors in p, placed as in the backward ...
               if (r == ZERO_OK) r = zero_engine_release(e, g);
           }
           for (g = G - 1; g >= 0 && r == ZERO_OK; g--) { // backward, in reverse
               r = zero_engine_gather(e, g, &p);
               if (r == ZERO_OK) r = zero_engine_grads(e, g, &dg); // zero-filled, same layout
               for (t = 0; t < T && r == ZERO_OK; t++) {
                   zero_tensor_info ti;
                   size_t i;
                   if (group_of[t] != g) continue;
                   // tensor t is ti.numel elements at ti.offset of p and of dg
                   r = zero_plan_tensor(zero_engine_plan(e), ids[t], &ti);
                   for (i = 0; r == ZERO_OK && i < ti.numel; i++) {
                       // the loss w^2 / 2 has gradient w; the engine wants d(loss * scale)/dw
                       // in the param dtype (the host device's pointers are host memory;
                       // with CUDA this loop is your kernel)
                       // (bf16 params: zero_bf16_to_f32 and zero_f32_to_bf16)
                       float w = zero_f16_to_f32(((const uint16_t *)p)[ti.offset + i]);
                       float grad = w * zero_engine_loss_scale(e);
                       ((uint16_t *)dg)[ti.offset + i] = zero_f32_to_f16(grad);
                   }
               }
               if (r == ZERO_OK) r = zero_engine_release(e, g);
               if (r == ZERO_OK) r = zero_engine_grads_ready(e, g); // collective
           }
           if (r == ZERO_OK) r = zero_engine_step(e, &info); // info.skipped, .grad_norm, ...
           if (r == ZERO_OK && rank == 0)
               printf("step %d: grad norm %.4f, loss scale %g\n", s, (double)info.grad_norm,
                      (double)info.loss_scale);
       }
       zero_engine_destroy(e); // safe after any error
       zero_device_destroy(dev);
       return r;
   }

   int main(void)
   {
       zero_result r = zero_local_run(4, rank_main, NULL); // 4 ranks as threads
       if (r != ZERO_OK) printf("%s: %s\n", zero_result_string(r), zero_last_error());
       return r == ZERO_OK ? 0 : 1;
   }
   ---- quick start: end ----

   The same code runs at stages 0, 1, 2 and 3 (gather/release only count references below
   stage 3) and gives bit-identical parameters at every stage. examples/train_mlp.c is a
   larger program (an MLP with a real forward and backward); docs/ has the longer story
   (engine.md, plan.md, optimizer.md, ...).

   MEMORY PER RANK (Psi params, N ranks, K = 12; checked by the test suite)
       stage 0  (2 + 2 + K) Psi          stage 2  2 Psi + (2 + K) Psi / N
       stage 1  4 Psi + K Psi / N        stage 3  (2 + 2 + K) Psi / N
   plus declared buffers (the reduce bucket, the arena). Traffic per step: 2 Psi (N-1)/N
   elements at stages 0-2, 3 Psi (N-1)/N at stage 3.

   BUFFERS AND LARGE LAYERS (docs/engine.md). Stage-3 gathered params and stage 2-3
   gradient buffers share one arena of d.max_live_numel elements, each taking its own size
   (default: the largest group beside 2 + prefetch depth groups of the second-largest
   size), so device bytes = model states + arena + bucket + scratch. A buffer that fits by
   size beside at most one other buffer in use (the pattern above) always finds room.
   Stage-3 prefetch follows the order of gathers the first micro-step recorded. A layer too
   large for the arena is registered in tiles and run tile by tile (memory-centric tiling):
       zero_engine_add_tiled_tensor(e, "wte", rows, cols, K, first_group, flags, &t0);
       zero_engine_tile_view(e, t0, i, &v);  // tile i: v.group, v.row0, v.rows, v.offset
   and a weight used twice (a tied embedding) may hand in its two gradient contributions
   one at a time: zero_engine_set_grad_parts(e, group, 2).

   OFFLOAD (ZeRO-Offload, ZeRO-Infinity; docs/offload.md). d.offload_optimizer = cpu moves
   the K Psi / N bytes of fp32 master, m and v to host memory and the Adam step to the CPU
   (stages 1-3); = nvme puts them in files under d.nvme_path. At stage 3 d.offload_param =
   cpu | nvme also moves the 2 Psi / N param shards off the device. The reduced gradient
   shard leaves the device as it is produced, into host memory, or with
   d.offload_gradients = nvme (and offload_optimizer = nvme) into a file, through host
   staging that does not grow with Psi. Results stay
   bit-identical to the run without offload. zero_host_device_desc.capacity gives the host
   device a memory budget, so a CPU run proves that a model too large for "device" memory
   trains; zero_engine_memory_tier() reports device, host and NVMe bytes.
   d.offload_optimizer_ratio = r (0 < r <= 1) offloads only the first H = max(1,
   floor(r S + 0.5)) elements of the rank's S-element optimizer shard; the device keeps
   and updates the rest (its Adam runs while the host's does): same bits at every r.
   Between training phases (another model generating, say), zero_engine_offload_states(e,
   ZERO_STATES_ALL, ZERO_OFFLOAD_CPU | _NVME) moves the device's params, gradients, master,
   m and v (any OR of ZERO_STATES_*) to host memory or a file and frees their device
   memory; zero_engine_reload_states(e) brings them back bit for bit.
   d.delayed_update = 1 with d.delayed_update_after = K (the ZeRO-Offload paper's DPU;
   offload_optimizer = cpu): after K updates, the host Adam of a step's gradients runs on
   a background thread while the next forward and backward run, and its params are
   published at the end of the next zero_engine_step: each forward then sees the params
   without the previous step's update (one step stale); the loss scaler and clipping see
   each step's own gradients as before. zero_engine_finish_update(e) publishes the pending
   update (call it before an export or a final evaluation). Checkpoints hold the pending
   update and resume bit for bit. Costs the host tier a second gradient shard and the
   pending params.

   BF16 OPTIMIZER STATES (docs/optimizer.md). d.optimizer_dtype = ZERO_BF16 stores master,
   m and v in bf16 (K = 6: 10 Psi bytes at stage 0 with 16-bit params and gradients instead
   of 16 Psi), each rounded stochastically after every step with random bits that are a
   pure function of (d.optimizer_seed, the step, the element's global index), so stages
   0-3, every N, the host and CUDA Adam and cpu offload stay bit-identical to each other.
   The training is close to, not the same as, the fp32-state run. read_tensor returns the
   states widened to fp32; checkpoints hold fp32 (bf16 -> bf16 resumes bit-exactly).

   ACTIVATIONS (ZeRO-R's activation offload, ZeRO-Infinity's activation tier;
   docs/offload.md). With d.offload_activations = cpu | nvme, zero_engine_stash(e, key, buf,
   bytes) parks a checkpointed activation (a block's input) in host memory or a file after
   the forward, and zero_engine_fetch(e, key, buf, bytes) brings it back before the block's
   recomputation in the backward, the NVMe tier reading ahead in reverse stash order. Local
   to each rank; the bytes come back exactly.

   FINE-TUNING (docs/engine.md). A tensor added with ZERO_TENSOR_FROZEN is used but not
   trained: no gradient, reduction, master, m or v; params replicated at stages 0-2 and
   partitioned at stage 3. Its group lays it out after the trained tensors, so the gradient
   buffer holds the trained ones only (zero_group_info.frozen_numel).

   BEYOND ONE NODE (docs/engine.md, "Inside and between nodes"). d.ranks_per_node = R says
   ranks [k R, (k + 1) R) share node k (0 = the launcher's LOCAL_WORLD_SIZE,
   OMPI_COMM_WORLD_LOCAL_SIZE or SLURM_NTASKS_PER_NODE, else one node); it changes no value.
   zero_engine_traffic splits every collective's bytes into intra_bytes and inter_bytes by
   it. zero_comm_split(comm, color, key, &sub) makes sub-communicators (local, MPI, NCCL comms).
   d.mics_shard_size = S (MiCS / HSDP, stages 1-3) partitions the model states within groups
   of S consecutive ranks and replicates them across the N / S groups: memory per rank is
   the flat engine's at N = S, gathers and reduce-scatters stay inside the group, and one
   all-reduce per step crosses the replicas. Exact: stages 1-3 give the same bits.
   d.hpz_partition_size = S (ZeRO++ hpZ, stage 3; S divides R) keeps beside the 1/N param
   shard a secondary copy cut over the S ranks of the node (+ p Psi / S bytes), taken from
   the first all-gather of a group after the params change; every later gather of the group
   (the backward's, the next micro-steps') runs inside the node: per step one gather crosses
   nodes instead of 2 A. Exact: the same bits as plain stage 3.

   PARAMETER GROUPS (docs/optimizer.md). zero_engine_set_tensor_hparams(e, t, lr_mul, wd)
   gives tensor t the lr engine_lr * lr_mul and its own weight decay after commit (PyTorch's
   parameter groups); the fused Adam kernels apply each tensor's constants in their one pass
   and checkpoints keep them.

   ZERO++ QUANTIZED COLLECTIVES (docs/engine.md, "Quantized collectives"; lossy by design).
   d.quantized_weights = 1 (stage 3, qwZ): the forward's all-gather of each group carries
   int8 blocks with one fp32 scale per block (about half the bytes at 16-bit); the
   backward's gathers stay exact (with hpZ they read the forward's values). d.quantized_gradients = 1 (stages 1-3, qgZ): the gradient
   reduce-scatter becomes int4 blocks (quantized_gradient_bits = 8 for int8) moved by the
   comm's all_to_all, summed in fp32 in rank order (the same bits every run and at stages
   1-3). On several nodes (1 < ranks_per_node < N) it is ZeRO++'s hierarchical scheme by
   default: all_to_all inside the node, fp32 sum, re-quantize, all_to_all across nodes (the
   bytes between nodes / R; two quantizations); d.quantized_gradient_levels = 1 keeps the
   flat one (one all_to_all over N, one quantization). d.quant_block_numel: elements per block (0 = 256). Every element comes back within
   scale/2 plus the dtypes' roundings (the Quantization section derives the bound); an
   inf/NaN block comes back NaN, so the loss scaler still sees an overflow. The optimizer
   state and checkpoints stay exact. zero_quantize / zero_dequantize expose the format.

   OPTIONS (define before including, in the implementation file)
       ZERO_STATIC            make every function static (private to one translation unit)
       ZERO_MALLOC(sz)        replace malloc; define ZERO_FREE(p) too, or neither
       ZERO_FREE(p)           replace free
       ZERO_NO_SIMD           use only the portable paths (same bits, slower)
       ZERO_DEBUG             debug mode on by default (zero_engine_desc.debug_guards)

   ENVIRONMENT
       ZERO_SIMD=portable|avx2|avx512   caps the host kernels' instruction set (never above
                                        what the CPU has); unset = the best available

   ERRORS
   Every fallible call returns a zero_result: ZERO_OK (0) or a negative code. The library
   never exits or aborts on bad input; zero_last_error() gives a readable sentence naming
   the argument and value at fault (kept per thread). A failed call changes nothing.

   WHILE INTEGRATING
   Build with -fsanitize=address,undefined (the suite runs so: make test-sanitize) and turn
   on the debug mode (d.debug_guards = 1, or compile with ZERO_DEBUG): the buffers that
   zero_engine_gather and zero_engine_grads hand out are then copies followed by guard
   bytes, checked at zero_engine_release and zero_engine_grads_ready, so a write past a
   buffer (fp32 gradients into an fp16 buffer, an index past the group's numel) is an
   INVALID_STATE naming the group and the buffer instead of a corrupted heap. They catch
   a write past the end of a handed-out buffer that touches its 64 guard bytes; not one
   that skips past them, nor a write before its start, nor reads, nor a write inside the
   buffer into the wrong tensor. Without guards the same bug corrupts memory the library
   owns and shows up later (a heap error, a wrong event).
   Ranks of the local comm (zero_local_run) are threads of one process: a static or global
   buffer in the rank function is shared by every rank; give each rank its own buffers and
   the same initial values (docs/engine.md, docs/backends.md). With guards on, the first
   step after zero_engine_set_tensor calls compares a hash of each tensor's values across
   ranks (a user-tagged all-reduce): different values are MISMATCH naming the tensor.
   Note that d.adam.lr = 0 means the default 1e-3 (filled in once, at create), while
   zero_engine_set_lr(e, 0) sets 0: the step takes the current lr as it is, so a schedule
   that ends at 0 moves no param at its last step (weight decay neither).

   LICENSE: MIT, see the end of this file.
*/
/* The implementation uses POSIX (threads, clocks). In the compilers' default modes
   (gnu99/gnu11, C++) the C library already offers it, with everything else it offers by
   default (M_PI, XSI and BSD names): zero.h defines no feature macro then, so including it
   first hides nothing from the user's code. Under strict ISO modes (-std=c99/c11,
   __STRICT_ANSI__) with no feature macro given, zero.h first asks for X/Open 7
   (_XOPEN_SOURCE 700: POSIX 2008 plus the XSI names, M_PI among them). When another header
   came first (<stdio.h>, ...) the request comes too late; the implementation then declares
   the few POSIX functions the C library hides (see the local comm), so it compiles
   whatever was included first. zero_nccl.h's bootstrap (sockets) wants zero.h first, or
   -D_POSIX_C_SOURCE=200809L, or gnu99/gnu11. */
#if defined(ZERO_IMPLEMENTATION) && defined(__STRICT_ANSI__) && !defined(_POSIX_C_SOURCE) && \
    !defined(_XOPEN_SOURCE) && !defined(_GNU_SOURCE) && !defined(_DEFAULT_SOURCE) &&         \
    !defined(_BSD_SOURCE) && !defined(_POSIX_SOURCE) && !defined(_WIN32)
#define _XOPEN_SOURCE 700
#endif

#ifndef ZERO_H
#define ZERO_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef ZERO_STATIC
#define ZERODEF static
#else
#ifdef __cplusplus
#define ZERODEF extern "C"
#else
#define ZERODEF extern
#endif
#endif

/* Functions that must run identically on the CPU and inside CUDA kernels. */
#if defined(__CUDACC__)
#define ZERO_HOSTDEV __host__ __device__
#else
#define ZERO_HOSTDEV
#endif

/* The element functions below are inlined even into the host's simd-target functions, so
   that fmaf and sqrtf compile to the target's instructions there (a call to libm's fmaf
   otherwise: several times slower). */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define ZERO__ALWAYS_INLINE __attribute__((always_inline))
#else
#define ZERO__ALWAYS_INLINE
#endif

#if defined(__cplusplus)
#define ZERO_INLINE inline
#else
#define ZERO_INLINE static inline
#endif

#if defined(ZERO_MALLOC) != defined(ZERO_FREE)
#error "zero.h: define both ZERO_MALLOC and ZERO_FREE, or neither"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================================
   Results: one enum for the whole library, 0 = success, negative = error.
   ====================================================================================== */

typedef enum zero_result {
    ZERO_OK = 0,
    ZERO_ERROR_INVALID_ARGUMENT = -1, /* a NULL pointer, a value out of range, a bad name   */
    ZERO_ERROR_OUT_OF_MEMORY = -2,    /* an allocation failed (host or device)             */
    ZERO_ERROR_INVALID_STATE = -3,    /* a call out of order: query before commit, ...     */
    ZERO_ERROR_NOT_FOUND = -4,        /* an unknown name, tensor or group                  */
    ZERO_ERROR_OVERFLOW = -5,         /* sizes whose sum or product does not fit size_t    */
    ZERO_ERROR_MISMATCH = -6,         /* ranks disagree (plan hash, sizes), or a checkpoint
                                         and the engine do (tensors, dtype)                */
    ZERO_ERROR_DEVICE = -7,           /* the device backend failed (CUDA error kept)       */
    ZERO_ERROR_COMM = -8,             /* a collective failed (NCCL error kept)             */
    ZERO_ERROR_TIMEOUT = -9,          /* a peer or collective did not answer in time       */
    ZERO_ERROR_IO = -10,              /* a file or socket operation failed (errno kept)    */
    ZERO_ERROR_UNSUPPORTED = -11,     /* not available in this build or on this machine    */
    ZERO_ERROR_LOSS_SCALE = -12       /* inf/NaN gradients at the minimum loss scale (fp16) */
} zero_result;

/* A short constant description of a result ("invalid argument"). Never NULL. */
ZERODEF const char *zero_result_string(zero_result result);

/* The detail of the last error raised on the calling thread: which call, which argument,
   which value, and any CUDA/NCCL/errno text. "" when none. The string is owned by the
   library and valid until the next failing call on this thread. */
ZERODEF const char *zero_last_error(void);

/* Clears the calling thread's last error. */
ZERODEF void zero_clear_error(void);

/* ======================================================================================
   Memory: allocation hooks. ZERO_MALLOC/ZERO_FREE replace malloc/free at compile time;
   a zero_allocator in a descriptor replaces them at run time (all fields NULL = default).
   ====================================================================================== */

typedef struct zero_allocator {
    void *(*alloc)(size_t bytes, void *user); /* NULL on failure */
    void (*free)(void *ptr, void *user);
    void *user;
} zero_allocator;

/* Element types. Value 0 means "the default" wherever a descriptor takes a dtype. */
typedef enum zero_dtype {
    ZERO_DTYPE_DEFAULT = 0,
    ZERO_F32 = 1,
    ZERO_F16 = 2,
    ZERO_BF16 = 3,
    ZERO_F64 = 4
} zero_dtype;

/* Bytes per element: 4, 2, 2, 8; 0 for an unknown dtype. */
ZERODEF size_t zero_dtype_size(zero_dtype dtype);
/* "f32", "f16", "bf16", "f64" or "?" */
ZERODEF const char *zero_dtype_name(zero_dtype dtype);

/* Which instruction set the host kernels use. AUTO picks the best the CPU supports
   (checked once with CPUID); every path gives the same bits. */
typedef enum zero_simd {
    ZERO_SIMD_AUTO = 0,
    ZERO_SIMD_PORTABLE = 1,
    ZERO_SIMD_AVX2 = 2,   /* AVX2 + FMA + F16C */
    ZERO_SIMD_AVX512 = 3  /* AVX-512 F + BW (+ F16C) */
} zero_simd;

/* The best path this CPU and build support (never AUTO). */
ZERODEF zero_simd zero_simd_detect(void);
/* "portable", "avx2", "avx512" */
ZERODEF const char *zero_simd_name(zero_simd simd);

/* ======================================================================================
   Conversion: fp32 <-> fp16 / bf16.
   ====================================================================================== */
/* Conversion declarations: fp32 <-> fp16 / bf16 (and fp64), one element
   at a time and in bulk.

   Rounding: every narrowing conversion rounds to nearest, ties to even, on the exact value
   (fp64 -> fp16/bf16 rounds once, never through fp32). Subnormals are produced and read in
   every direction (no flush to zero). A finite value whose magnitude rounds past the
   largest finite number becomes inf of its sign (fp16: |x| >= 65520 -> inf).

   NaN: stays NaN, keeps its sign and becomes quiet. Narrowing keeps the top payload bits
   that fit and sets the quiet bit (what x86 F16C's vcvtps2ph does: fp16 = sign | 0x7e00 |
   mantissa >> 13; bf16 = sign | 0x7fc0 | mantissa >> 16); widening keeps the payload and
   sets the quiet bit (fp32 = sign | 0x7fc00000 | fp16 mantissa << 13, or bf16 << 16).

   The scalar functions are integer arithmetic only, so they give the same bits whatever
   the floating-point environment (rounding mode, FTZ/DAZ); the SIMD paths are tested to
   give exactly those bits for every input. */

/* fp32 -> fp16 bits, round to nearest even. */
ZERODEF uint16_t zero_f32_to_f16(float value);
/* fp16 bits -> fp32 (exact). */
ZERODEF float zero_f16_to_f32(uint16_t bits);
/* fp32 -> bf16 bits, round to nearest even. */
ZERODEF uint16_t zero_f32_to_bf16(float value);
/* bf16 bits -> fp32 (exact). */
ZERODEF float zero_bf16_to_f32(uint16_t bits);

/* Converts numel elements of src (src_dtype) into dst (dst_dtype), for any pair of
   ZERO_F32, ZERO_F16, ZERO_BF16, ZERO_F64 (fp16/bf16 are uint16_t bit patterns). Every
   narrowing rounds once, as the scalar functions above; every widening is exact. Same
   dtype is a copy (memmove: dst may overlap src); for different dtypes dst and src must
   not overlap. Pointers need no alignment beyond that of a byte.
   simd: ZERO_SIMD_AUTO (zero_simd_detect()), or a path no higher than the CPU supports;
   every path gives the same bits. fp32 <-> fp16 and fp32 <-> bf16 (and fp16 <-> bf16)
   are vectorised; fp64 pairs are scalar.
   Errors: INVALID_ARGUMENT for an unknown dtype or simd value, or a NULL pointer with
   numel > 0; OVERFLOW when numel * element size does not fit size_t; UNSUPPORTED when
   simd names a path this CPU or build lacks. Nothing is written on error. */
ZERODEF zero_result zero_convert(void *dst, zero_dtype dst_dtype, const void *src,
                                 zero_dtype src_dtype, size_t numel, zero_simd simd);

/* ======================================================================================
   Quantization: symmetric int8 / int4 blocks with one fp32 scale per block, what ZeRO++'s
   quantized collectives carry (qwZ: the stage-3 forward all-gather; qgZ: the gradient
   reduce-scatter; docs/engine.md, "Quantized collectives").
   ====================================================================================== */
/* Quantization declarations.

   A buffer of numel elements is cut into blocks of 'block' elements (the last one, the
   tail, may be shorter). Block k holds its elements' codes q_i in [-Q, Q] (Q = 127 for
   int8, 7 for int4) and one fp32 scale s_k:

       absmax = max |x_i| over the block (x_i read exactly as fp32)
       s      = absmax / Q, rounded UP to the next fp32 (so |x_i| / s <= Q: no code clamps)
       q_i    = round-to-nearest-even(fl32(x_i / s))        (s = 0: q_i = 0)
       y_i    = round_to_dtype(fl32(q_i * s))               (dequantized)

   Error bound, per block (derived in docs/engine.md, tested per block against double):
       |x_i - y_i| <= s/2 + 2^-16 s + h32(absmax) + hT(absmax)
   where hT(v) is half the spacing of the output dtype T at magnitude v (fp32: 2^-24 v,
   fp16: 2^-11 v, bf16: 2^-8 v, and at least half T's smallest subnormal): s/2 is the
   code's rounding, 2^-16 s covers the fp32 division and product (2 Q 2^-24 s <= 2^-16 s),
   the h terms the fp32 product and the output rounding. All-zero blocks give s = 0 and
   y = +0 exactly.

   Non-finite: a block with an inf or NaN gets s = NaN and every code 0, so every element of
   the block dequantizes to NaN: the damage is never hidden. For gradients (qgZ) the loss
   scaler's inf/NaN check then sees the overflow exactly as without quantization.

   Layout of a quantized buffer (zero_quant_bytes): the nb = ceil(numel / block) fp32 scales
   first, then the codes (int8: one signed byte per element; int4: two per byte, element i
   in byte i / 2, the low nibble for even i, two's complement), zero bytes up to a multiple
   of 4. Bit for bit the same from the host functions and from zero_cuda.h's kernels.

   ZERO_QUANT_BLOCK_DEFAULT (256): DeepSpeed's quantizer picks groups of up to ~8000
   elements for kernel speed; 256 keeps the error local (one outlier coarsens 255 neighbours,
   not thousands) for 4 / 256 = 1.6 % extra bytes at int8 (3.1 % at int4). */

#define ZERO_QUANT_BLOCK_DEFAULT 256
#define ZERO_QUANT_BLOCK_MAX ((size_t)1 << 24)

/* Bytes of the quantized form of numel elements into *out. bits: 8 or 4; block: even, 2 ..
   ZERO_QUANT_BLOCK_MAX (0 = ZERO_QUANT_BLOCK_DEFAULT). INVALID_ARGUMENT otherwise, OVERFLOW
   when the size does not fit size_t. */
ZERODEF zero_result zero_quant_bytes(size_t numel, int bits, size_t block, size_t *out);

/* Quantizes numel elements of src (ZERO_F32, ZERO_F16 or ZERO_BF16) into dst, which holds
   zero_quant_bytes(numel, bits, block) bytes (layout above; every byte written). Errors:
   INVALID_ARGUMENT (dtype, bits, block, NULL with numel > 0), OVERFLOW; nothing written. */
ZERODEF zero_result zero_quantize(void *dst, const void *src, zero_dtype src_dtype, size_t numel,
                                  int bits, size_t block);

/* Dequantizes numel elements into dst (ZERO_F32, ZERO_F16 or ZERO_BF16). Errors as
   zero_quantize. */
ZERODEF zero_result zero_dequantize(void *dst, zero_dtype dst_dtype, const void *src,
                                    size_t numel, int bits, size_t block);

/* qgZ's reduction: count quantized buffers of numel elements each, at src + k * src_stride
   bytes (k = 0 .. count-1), dequantized in fp32 and summed in the order k = 0, 1, ... (from
   buffer 0's value, as the local comm sums in rank order), rounded once into dst's dtype.
   count = 1 is zero_dequantize. INVALID_ARGUMENT also for count < 1 or a stride below the
   buffers' size. */
ZERODEF zero_result zero_dequantize_sum(void *dst, zero_dtype dst_dtype, const void *src,
                                        size_t src_stride, int count, size_t numel, int bits,
                                        size_t block);

/* ======================================================================================
   Plan: tensors packed into flat, padded group buffers; shard r of a group is its r-th
   equal slice (what NCCL's reduce-scatter and all-gather need).
   ====================================================================================== */
/* Plan declarations. */

#define ZERO_DEFAULT_ALIGN_NUMEL 16

typedef struct zero_range {
    size_t offset; /* first element, in the group's flat buffer */
    size_t numel;
} zero_range;

typedef struct zero_tensor_info {
    const char *name; /* owned by the plan */
    int group;
    size_t offset;    /* first element in the group's flat buffer; a multiple of align */
    size_t numel;
    int frozen;       /* zero_plan_freeze: in the group's frozen region (no optimizer state) */
} zero_tensor_info;

typedef struct zero_group_info {
    size_t numel;        /* padded flat size: a multiple of world * align               */
    size_t used_numel;   /* end of the group's last tensor (<= numel)                   */
    size_t shard_numel;  /* numel / world (a rank's params at stage 3)                  */
    const int *tensors;  /* the group's tensor ids in registration order (plan-owned)  */
    int num_tensors;
    int persistent;      /* used_numel < persist_numel: stage 3 keeps it whole         */
    size_t frozen_numel; /* the frozen region [numel - frozen_numel, numel): the group's
                            frozen tensors, padded to a multiple of world * align; 0 when
                            none. The trained region [0, numel - frozen_numel) is padded
                            alike, so both split into N equal slices                     */
} zero_group_info;

typedef struct zero_plan zero_plan;

/* A new, empty plan. allocator may be NULL (ZERO_MALLOC/ZERO_FREE); otherwise it is copied
   and every allocation of the plan, the plan itself included, goes through it until
   zero_plan_destroy(). A committed plan is read-only: its queries may run concurrently. */
ZERODEF zero_result zero_plan_create(zero_plan **out, const zero_allocator *allocator);
ZERODEF void zero_plan_destroy(zero_plan *plan);

/* Registers a tensor of numel (> 0) elements in group 'group' (>= 0). Names are unique,
   non-empty, at most 255 bytes of UTF-8 (the plan keeps a copy; a name that is not UTF-8
   is refused, since safetensors headers and checkpoints store names as JSON/UTF-8 text).
   Tensor ids are 0, 1, 2... in registration order; out_tensor may be NULL. Errors: after
   commit (INVALID_STATE); NULL, empty, too long, not UTF-8 or duplicate name, numel 0,
   negative group (INVALID_ARGUMENT);
   OUT_OF_MEMORY. A failed add changes nothing. */
ZERODEF zero_result zero_plan_add(zero_plan *plan, const char *name, size_t numel, int group,
                                  int *out_tensor);

/* Marks tensor 'tensor' frozen (used, not trained: ZERO_TENSOR_FROZEN): commit lays a
   group's frozen tensors out after its trained ones, each region padded to a multiple of
   world * align and split into N equal slices. Rank r's part of the group is then its slice
   of the trained region followed by its slice of the frozen region (the stage-3 param
   shard); optimizer state and gradients cover the trained region only. A plan without
   frozen tensors lays out as before. Errors: INVALID_STATE after commit, NOT_FOUND, NULL
   plan (INVALID_ARGUMENT). */
ZERODEF zero_result zero_plan_freeze(zero_plan *plan, int tensor);

/* Lays out every group for 'world' ranks: each tensor start aligned to align_numel
   (0 = ZERO_DEFAULT_ALIGN_NUMEL), each group padded to a multiple of world * align_numel.
   Group ids must be exactly 0..G-1, each used. Groups with used_numel < persist_numel are
   marked persistent (0 = none); their shards are still the equal slices. Errors: world <= 0
   or a missing group id, named (INVALID_ARGUMENT); no tensors, or already committed
   (INVALID_STATE); a padded group or the total past SIZE_MAX (OVERFLOW); OUT_OF_MEMORY.
   Errors leave the plan uncommitted and unchanged. */
ZERODEF zero_result zero_plan_commit(zero_plan *plan, int world, size_t align_numel,
                                     size_t persist_numel);

ZERODEF int zero_plan_is_committed(const zero_plan *plan);
ZERODEF int zero_plan_world(const zero_plan *plan);          /* 0 before commit */
ZERODEF int zero_plan_num_groups(const zero_plan *plan);     /* 0 before commit */
ZERODEF int zero_plan_num_tensors(const zero_plan *plan);
ZERODEF size_t zero_plan_total_numel(const zero_plan *plan); /* sum of padded groups */
ZERODEF size_t zero_plan_align(const zero_plan *plan);       /* 0 before commit */

/* Queries: INVALID_STATE before commit, NOT_FOUND for an unknown id or name,
   INVALID_ARGUMENT for a rank outside 0..world-1 or a NULL out. */
ZERODEF zero_result zero_plan_group(const zero_plan *plan, int group, zero_group_info *out);
ZERODEF zero_result zero_plan_tensor(const zero_plan *plan, int tensor, zero_tensor_info *out);
ZERODEF zero_result zero_plan_find(const zero_plan *plan, const char *name, int *out_tensor);
/* Rank r's shard of a group's trained region: [r * S, (r + 1) * S), S = (numel -
   frozen_numel) / world; without frozen tensors S = shard_numel (the whole group). */
ZERODEF zero_result zero_plan_shard(const zero_plan *plan, int group, int rank, zero_range *out);
/* The part of a tensor inside rank r's slice of its region (trained or frozen), as a range
   of the group buffer (numel 0 when they do not meet). The offset within the tensor is out->offset minus the
   tensor's offset. An empty result has its offset clamped into the tensor, so that
   offset - tensor offset is always within 0..numel and never decreases with the rank. */
ZERODEF zero_result zero_plan_intersect(const zero_plan *plan, int tensor, int rank,
                                        zero_range *out);
/* A 64-bit hash of everything that shapes the layout (names, sizes, groups, world, align,
   which groups are persistent), FNV-1a over a fixed little-endian encoding (docs/plan.md):
   equal plans hash equal on every rank, host and build. Never 0 after commit; 0 before. */
ZERODEF uint64_t zero_plan_hash(const zero_plan *plan);

/* ======================================================================================
   Estimator: model-state bytes per rank by stage (the paper's table and DeepSpeed's).
   ====================================================================================== */
/* Estimator declarations: model-state bytes per rank for ZeRO stages
   0-3, the forward question (how many bytes does this model need?) and the inverse (how
   large a model fits?). Pure arithmetic on integers: no allocation, no device.

   Two modes:
   - ZERO_ESTIMATE_PAPER (the default): the table of the ZeRO paper (Rajbhandari et al.,
     SC20, arXiv 1910.02054, section 5), with Psi parameters, N ranks, 2-byte parameters,
     2-byte gradients and K = 12 bytes of optimizer state per parameter (Adam: fp32 master,
     m, v). A rank's shard holds ceil(Psi / N) elements (the plan pads groups to equal
     shards), so per rank:
         stage 0:  params 2 Psi   grads 2 Psi     optimizer K Psi       (2+2+K) Psi
         stage 1:  params 2 Psi   grads 2 Psi     optimizer K S         4 Psi + K S
         stage 2:  params 2 Psi   grads 2 S       optimizer K S         2 Psi + (2+K) S
         stage 3:  params 2 S     grads 2 S       optimizer K S         (2+2+K) S
     with S = ceil(Psi / N). With offload (ZeRO-Offload, arXiv 2101.06840) the optimizer
     state and the Adam step move to the host: the device keeps the same params and grads,
     its optimizer bytes become 0, and host_bytes = the optimizer bytes the stage would have
     kept on the device (K Psi at stage 0, K S at stages 1-3); gradient shards stream to the
     host through a bounded staging buffer that is not counted (docs/estimator.md).
     Tiers (ZeRO-Infinity, docs/offload.md): offload_optimizer = NVME reports the K S bytes
     in nvme_bytes instead of host_bytes; offload_param (stage 3) moves the 2 S param
     bytes off the device to host_bytes (CPU) or nvme_bytes (NVME).
     Constant-size buffers (reduce buckets, stage-3 gather buffers) are not counted either.
   - ZERO_ESTIMATE_DEEPSPEED: DeepSpeed's estimate_zero2_model_states_mem_needs (stage 2)
     and estimate_zero3_model_states_mem_needs (stage 3), re-derived from their published
     formulas (DeepSpeed after PR #5099, April 2024; see docs/estimator.md): device_bytes is
     DeepSpeed's gpu_mem (per GPU), host_bytes its cpu_mem (per node), gather_bytes its
     largest_layer_memory. No breakdown by category (those fields are 0). */

/* Where offloaded state lives (DeepSpeed's offload "device"). */
typedef enum zero_offload_device {
    ZERO_OFFLOAD_NONE = 0, /* on the device (no offload)                                */
    ZERO_OFFLOAD_CPU = 1,  /* host memory (pinned through the device: pin_memory)       */
    ZERO_OFFLOAD_NVME = 2  /* files under nvme_path (ZeRO-Infinity)                     */
} zero_offload_device;

/* zero_engine_desc.pin_memory: whether the offload tiers' host buffers are pinned memory of
   the device (dev->ops->host_alloc: cudaHostAlloc on CUDA), which transfers need to run
   asynchronously. Unlike DeepSpeed (pin_memory false by default), the default pins when
   the device offers pinned memory: without it every CUDA download is a synchronous
   pageable copy and the offloaded step's pipeline cannot overlap. */
#define ZERO_PIN_MEMORY_AUTO 0 /* the default: pinned when the device offers it (CUDA), plain
                                  memory otherwise (the host device)                        */
#define ZERO_PIN_MEMORY_ON 1   /* the same as AUTO, said explicitly                         */
#define ZERO_PIN_MEMORY_OFF (-1) /* plain memory from the engine's allocator (DeepSpeed's
                                  default; 0 meant this before the default changed)          */

/* "none", "cpu", "nvme" or "?". */
ZERODEF const char *zero_offload_device_name(zero_offload_device d);

typedef enum zero_estimate_mode {
    ZERO_ESTIMATE_DEFAULT = 0, /* = PAPER */
    ZERO_ESTIMATE_PAPER = 1,
    ZERO_ESTIMATE_DEEPSPEED = 2
} zero_estimate_mode;

/* The largest parameter count the estimator accepts (2^53: every count is then exact in the
   double arithmetic that DeepSpeed's formulas use). */
#define ZERO_ESTIMATE_MAX_PARAMS 9007199254740992ull

/* What to estimate. Zero-initialise and fill params, ranks and stage; every other zero
   field means its default. */
typedef struct zero_estimate_desc {
    uint64_t params;         /* Psi, 1..ZERO_ESTIMATE_MAX_PARAMS (ignored by max_params)  */
    int ranks;               /* N, data-parallel ranks (GPUs), >= 1                       */
    int stage;               /* 0..3 (DeepSpeed mode: 2 or 3)                             */
    zero_estimate_mode mode; /* 0 = paper                                                 */
    int offload;             /* nonzero: optimizer state on the host (DeepSpeed cpu_offload) */
    int param_bytes;         /* paper mode: bytes per parameter, 0 = 2 (1..1024)          */
    int grad_bytes;          /* paper mode: bytes per gradient, 0 = 2 (1..1024)           */
    int optimizer_bytes;     /* paper mode: K, bytes of optimizer state, 0 = 12 (1..1024) */
    /* DeepSpeed mode only: */
    int gpus_per_node;            /* 0 = 1 (DeepSpeed's default); must divide ranks      */
    uint64_t largest_layer_params;/* stage 3: required, <= params                         */
    int offload_params;           /* stage 3 with offload: parameters on the host too    */
    int no_zero_init;             /* stage 3: nonzero = without deepspeed.zero.Init      */
    double additional_buffer_factor; /* 0 = 1.5; finite and > 0                           */
    /* paper mode only: the tiers of ZeRO-Offload / ZeRO-Infinity (docs/offload.md). */
    zero_offload_device offload_optimizer; /* NONE (or 'offload' = 1: CPU); CPU: optimizer
                                  state in host_bytes; NVME: in nvme_bytes                  */
    zero_offload_device offload_param;     /* stage 3, with the optimizer offloaded: the
                                  param shards leave the device for host_bytes (CPU) or
                                  nvme_bytes (NVME)                                         */
    double offload_optimizer_ratio; /* paper mode, with offload_optimizer: the fraction r in
                                  (0, 1] of the optimizer state offloaded (0 = 1); the tier
                                  holds K H bytes, H = max(1, floor(r S + 0.5)) of the S
                                  optimizer elements per rank, the device K (S - H)       */
    int delayed_update;        /* paper mode, with offload_optimizer = CPU: the engine's
                                  delayed_update adds a second gradient shard and the pending
                                  params to host_bytes: (grad_bytes + param_bytes) x the
                                  optimizer elements per rank, ceil((Psi - F) / N) at
                                  stages 1-3 (the engine refuses offload at stage 0)       */
    uint64_t frozen;           /* paper mode: F of the Psi parameters are frozen
                                  (ZERO_TENSOR_FROZEN): params only, no gradient or
                                  optimizer state (0..params; max_params: Psi counts them) */
    zero_dtype optimizer_dtype; /* paper mode: the engine's optimizer_dtype: DEFAULT/F32 =
                                  K 12 (fp32 master, m, v), BF16 = K 6 (then optimizer_bytes
                                  must be 0 or 6): 10 Psi bytes at stage 0 with 16-bit
                                  params and grads                                          */
    /* paper mode, beyond one node (docs/engine.md, "Memory and traffic per mode"): */
    int ranks_per_node;        /* R: 0 = ranks (one node); must divide ranks               */
    int mics_shard_size;       /* S: MiCS (stages 1-3), 0 or ranks = flat; must divide ranks.
                                  The memory is the flat engine's at N = S               */
    int accum_steps;           /* micro-steps per step for the traffic; 0 = 1             */
    int hpz_partition_size;    /* S: ZeRO++ hpZ (stage 3), 0, 1 or ranks = off; must divide
                                  ranks_per_node; not with MiCS. The device keeps the
                                  secondary ceil(Psi / N) N / S params beside the shard, and
                                  each step all-gathers once over the N ranks and 2 A - 1
                                  times over the S ranks of the node                       */
} zero_estimate_desc;

/* Bytes of one configuration. */
typedef struct zero_estimate {
    zero_estimate_mode mode; /* resolved (never DEFAULT)                                  */
    int stage;
    int ranks;
    uint64_t params;
    /* paper mode: device bytes per rank by category (0 in DeepSpeed mode) */
    uint64_t params_bytes;    /* fp16/bf16 parameters                                    */
    uint64_t grads_bytes;     /* gradients                                               */
    uint64_t optimizer_bytes; /* fp32 master + m + v (0 when offloaded)                  */
    uint64_t device_bytes;    /* per rank: the sum above; DeepSpeed: gpu_mem per GPU       */
    uint64_t host_bytes;      /* paper: offloaded optimizer state per rank;
                                 DeepSpeed: cpu_mem per node                             */
    uint64_t gather_bytes;    /* DeepSpeed stage 3: largest_layer_memory (inside device_bytes) */
    uint64_t nvme_bytes;      /* paper mode: state per rank on the NVMe tier (offload_* = NVME) */
    /* paper mode: bytes per step of rank 0 (every rank's when S and R nest), as
       zero_traffic counts them (payload: no control all-reduces, no persistent groups):
       gradients reduced at grad_bytes per element (reduce-scatter; stage 0 all-reduce),
       params all-gathered at param_bytes (stages 1-2 once per step, stage 3 twice per
       micro-step; with hpZ once over N and 2 A - 1 times over the S ranks of the node),
       MiCS's replica all-reduce at grad_bytes; intra + inter = total up to rounding */
    double step_bytes, step_intra_bytes, step_inter_bytes;
} zero_estimate;

/* Fills *out for desc. Errors (INVALID_ARGUMENT naming the field): NULL pointers, params 0
   or above ZERO_ESTIMATE_MAX_PARAMS, ranks < 1, stage outside 0..3 (2..3 for DeepSpeed), an
   unknown mode, byte sizes outside 0..1024, gpus_per_node < 0 or not dividing ranks,
   largest_layer_params missing (DeepSpeed stage 3) or above params, offload_params
   without offload or outside DeepSpeed stage 3, offload_optimizer / offload_param out of
   range or in DeepSpeed mode, offload_param without an offloaded optimizer or outside
   stage 3, a NaN, infinite or negative
   additional_buffer_factor. OVERFLOW when a byte count does not fit 64 bits. *out is
   written only on success. */
ZERODEF zero_result zero_estimate_compute(const zero_estimate_desc *desc, zero_estimate *out);

/* The inverse: the largest Psi that zero_estimate_compute() accepts with a device_bytes
   per rank of at most device_memory, for the other fields of desc (desc->params is
   ignored). Exact: device_bytes(*out) <= device_memory < device_bytes(*out + 1) (or
   *out + 1 is not computable). *out = 0 when not even the smallest model fits (one
   parameter; DeepSpeed stage 3: Psi = largest_layer_params); ZERO_ESTIMATE_MAX_PARAMS
   when every accepted Psi fits (DeepSpeed stage 3 with parameters offloaded: the device
   holds 4 * largest layer whatever Psi is). Only the device bytes decide what fits (one
   past 64 bits never fits); OVERFLOW, as zero_estimate_compute gives for that Psi, when
   the host bytes of the answer do not fit 64 bits (e.g. an extreme
   additional_buffer_factor). Other errors as zero_estimate_compute (params aside); *out is
   written only on success. */
ZERODEF zero_result zero_estimate_max_params(const zero_estimate_desc *desc,
                                             uint64_t device_memory, uint64_t *out);

/* ======================================================================================
   Comm: the collective interface. Every backend implements zero_comm_ops; the engine
   calls nothing else. Counts are in elements, never bytes.
   ====================================================================================== */

typedef enum zero_op { ZERO_OP_SUM = 0, ZERO_OP_MAX = 1 } zero_op;

typedef struct zero_comm zero_comm;

/* A collective's identity beyond its arguments: which engine group it serves, in which role,
   and the engine's running collective count. Ranks whose control flow diverged (rank 0
   gathers group 0 while rank 1 gathers group 1 of the same size) call collectives with
   equal arguments but different tags. role 0 means untagged: nothing to compare. */
typedef struct zero_comm_tag {
    int32_t group; /* engine group, -1 for none                                     */
    int32_t role;  /* what the collective is for (the engine's roles); 0 = untagged */
    uint64_t seq;  /* the caller's collective sequence number                        */
    uint64_t count; /* the whole payload in elements when the caller splits it over
                       several collectives (zero_engine_allreduce: its count), so
                       ranks that split different totals disagree at the first
                       piece; 0 otherwise                                           */
} zero_comm_tag;

/* The roles of zero_comm_tag.role: what each engine collective is for. A stage-3 prefetch
   and a gather of the same group are one collective (both GATHER), so a rank that
   prefetched and a rank that gathered on demand still agree. */
typedef enum zero_comm_role {
    ZERO_ROLE_NONE = 0,         /* untagged (direct comm users): the tag is not compared    */
    ZERO_ROLE_GATHER = 1,       /* stage 3: all-gather of a group's params (gather/prefetch) */
    ZERO_ROLE_GRAD_REDUCE = 2,  /* a group's gradients: all-reduce (stage 0), reduce-scatter */
    ZERO_ROLE_PARAM_UPDATE = 3, /* step: all-gather of a group's updated param shards        */
    ZERO_ROLE_FLAG = 4,         /* step: all-reduce (max) of the inf/NaN flag                */
    ZERO_ROLE_NORM = 5,         /* step: all-reduce (sum) of the squared gradient norm       */
    ZERO_ROLE_COMMIT = 6,       /* commit: the plan-hash and allocation check                */
    ZERO_ROLE_CHECKPOINT = 7,   /* save/load: agreement all-reduces, state rebuilt by gathers */
    ZERO_ROLE_OFFLOAD = 8,      /* step, gather: all-reduce (max) of the NVMe tier's status  */
    ZERO_ROLE_USER = 9          /* zero_engine_allreduce: the user's values (a loss to log)  */
} zero_comm_role;

/* "gather", "grad_reduce", "param_update", "flag", "norm", "commit", "checkpoint", "offload",
   "user", "untagged" (role 0), or "?" for a value outside the enum. Never NULL; for messages. */
ZERODEF const char *zero_comm_role_name(int32_t role);

typedef struct zero_comm_ops {
    const char *name;
    void (*destroy)(zero_comm *comm);
    /* recv holds world * send_numel elements, rank r's block at r * send_numel. In place
       when send == recv + rank * send_numel. */
    zero_result (*all_gather)(zero_comm *comm, const void *send, void *recv, size_t send_numel,
                              zero_dtype dtype, void *queue);
    /* send holds world * recv_numel elements; rank r receives the reduction of block r. In
       place when recv == send + rank * recv_numel (as NCCL allows). */
    zero_result (*reduce_scatter)(zero_comm *comm, const void *send, void *recv,
                                  size_t recv_numel, zero_dtype dtype, zero_op op, void *queue);
    /* In place when send == recv. */
    zero_result (*all_reduce)(zero_comm *comm, const void *send, void *recv, size_t numel,
                              zero_dtype dtype, zero_op op, void *queue);
    zero_result (*broadcast)(zero_comm *comm, void *buf, size_t numel, zero_dtype dtype,
                             int root, void *queue);
    /* Host-side barrier across ranks (waits for this rank's queued collectives first). */
    zero_result (*barrier)(zero_comm *comm);
    /* Optional (may be NULL): calls between them form one group (NCCL's grouped calls). */
    zero_result (*group_start)(zero_comm *comm);
    zero_result (*group_end)(zero_comm *comm);
    /* Optional (may be NULL; quantized_gradients needs it): send holds world blocks of numel
       elements, block r for rank r; recv receives world blocks, block r from rank r. A pure
       copy (the bits arrive as sent). Not in place: send and recv must not overlap. */
    zero_result (*all_to_all)(zero_comm *comm, const void *send, void *recv, size_t numel,
                              zero_dtype dtype, void *queue);
    /* Optional (may be NULL: the engine then refuses the hierarchical modes, MiCS and hpZ,
       with UNSUPPORTED). COLLECTIVE over comm, like MPI_Comm_split: the ranks that pass the
       same color >= 0 form a new comm, ranked by key, ties by their rank in comm; a rank
       passing color < 0 gets *out = NULL. The new comm is independent of its parent (its
       own collectives, destroyed with zero_comm_destroy, before or after the parent). The
       engine asks for its groups once, at commit (zero_engine_desc.ranks_per_node). */
    zero_result (*split)(zero_comm *comm, int color, int key, zero_comm **out);
} zero_comm_ops;

/* comm->ops->split, or UNSUPPORTED (naming the backend) when the comm has none. COLLECTIVE;
   *out is NULL on error and for color < 0. INVALID_ARGUMENT for NULL comm or out. */
ZERODEF zero_result zero_comm_split(zero_comm *comm, int color, int key, zero_comm **out);

/* Determinism is a backend's promise: the local comm (and zero_cuda.h's device comm) sum
   in rank order 0..N-1 with one rounding, so an element's reduction is the same bits
   whichever collective computed it; NCCL's ring/tree orders are not, so on NCCL stage 0
   (all-reduce) may differ from stages 1-3 (reduce-scatter) in the last bits.

   A rank's handle. 'queue' arguments are the device's native queue for the comm queue
   (a cudaStream_t for CUDA, NULL for the host device); a backend that runs on the host
   completes the collective before returning. */
struct zero_comm {
    const zero_comm_ops *ops;
    void *impl;
    int rank;
    int world;
    zero_comm_tag tag; /* the identity of the next collective, set by the caller (the engine)
                          before each call; all zero = untagged. Backends compare it across
                          ranks where they can (docs/backends.md) and fail with
                          ZERO_ERROR_MISMATCH naming both sides. */
};

/* Local comm declarations: N ranks as threads of one process.

   A group holds 'world' ranks; each rank gets its own zero_comm and calls every collective
   from its own thread. Collectives complete before they return (queue is ignored and
   should be NULL). Semantics (docs/backends.md):

   - Determinism. SUM reduces in rank order 0..N-1, starting from rank 0's element,
     accumulating in fp32 (fp64 for F64) and rounding once to the dtype. An element's
     result therefore depends only on the N input elements: block r of a reduce_scatter is
     bit for bit the same elements of an all_reduce of the same input. MAX takes the
     largest element (NaN if any input is NaN).
   - Agreement. Every collective checks that all ranks called the same collective with the
     same numel, dtype, op and root, and with the same comm->tag (group, role and seq)
     where every rank's tag is set (role != 0; an untagged call is not compared on the
     tag). If not, every rank returns ZERO_ERROR_MISMATCH with a message naming both sides,
     e.g. "rank 0 all_gather group 0 (gather, seq 12) vs rank 1 all_gather group 1
     (gather, seq 12)" (a rank whose own arguments were invalid returns
     ZERO_ERROR_INVALID_ARGUMENT), and the group stays usable.
   - Failure. A rank that waits more than timeout_ms for its peers returns
     ZERO_ERROR_TIMEOUT, zero_local_abort() or destroying a comm makes waiting peers return
     ZERO_ERROR_COMM; either breaks the group, and every later collective on it fails at
     once with the same code and a message naming the cause. No rank returns (even with an
     error) while a peer may still read its buffers.
   - In place. all_gather with send == recv + rank * send_numel, all_reduce with
     send == recv, and reduce_scatter with recv == send + rank * recv_numel all work.
   - numel 0 is a valid collective (a synchronisation point whose arguments are checked);
     the buffers may then be NULL.
   - Split (zero_comm_split). The ranks of one color get a new group of their own (same
     timeout, spin and allocator), whose comms are threads of the same ranks: reductions
     in it sum in its own rank order (key order), the same rule as above. Breaking the
     parent does not break its children (each group fails on its own). */

typedef struct zero_local_desc {
    int world;                /* ranks, >= 1                                           */
    int timeout_ms;           /* how long a rank waits for its peers; 0 = 60000        */
    zero_allocator allocator; /* for the group and its comms; all NULL = ZERO_MALLOC   */
    int spin_us;              /* how long a rank waiting for its peers spins before it
                                 sleeps on the condition variable; 0 = 50, negative =
                                 never; at most 1000000 and a quarter of the timeout.
                                 Never spins when world exceeds the cores online (a
                                 spinning rank would then hold the core a peer needs). */
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

/* Runs fn(rank, comm, user) on 'world' threads with a fresh group and waits for all of
   them. The group has the default timeout (60 s), spin and allocator, and this call has no
   way to change them: use zero_local_run_desc() to set timeout_ms (or spin_us, the
   allocator). A rank whose fn returns an error (or returns at all) destroys its
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

/* ======================================================================================
   Device: memory, queues and the element kernels the engine needs. The host device runs
   everything synchronously on the CPU; zero_cuda.h enqueues kernels on CUDA streams.
   All pointers passed to ops are device pointers unless the name says host.
   ====================================================================================== */

/* What an allocation holds: the engine's accounting is by category. */
typedef enum zero_mem_category {
    ZERO_MEM_PARAM = 0, /* fp16/bf16/fp32 parameters, whole or shard              */
    ZERO_MEM_GRAD,      /* gradients, whole or shard, and their accumulators      */
    ZERO_MEM_MASTER,    /* fp32 master weights                                    */
    ZERO_MEM_MOMENT1,   /* Adam m                                                 */
    ZERO_MEM_MOMENT2,   /* Adam v                                                 */
    ZERO_MEM_BUCKET,    /* reduce bucket; the stage-2 arena (gradient buffers)    */
    ZERO_MEM_GATHER,    /* the stage-3 arena (gathered params, gradient buffers)  */
    ZERO_MEM_SCRATCH,   /* flags, scalars, partial sums                           */
    ZERO_MEM_ACTIVATION, /* the activation tier of zero_engine_stash (host, NVMe)  */
    ZERO_MEM_COUNT
} zero_mem_category;

ZERODEF const char *zero_mem_category_name(zero_mem_category category);

typedef enum zero_queue {
    ZERO_QUEUE_COMPUTE = 0, /* the user's forward/backward and the optimizer step */
    ZERO_QUEUE_COMM = 1,    /* collectives                                        */
    ZERO_QUEUE_OFFLOAD = 2, /* host <-> device streaming                          */
    ZERO_QUEUE_COUNT = 3
} zero_queue;

typedef struct zero_event zero_event; /* backend-defined */

/* One contiguous range for the Adam step. master, m, v are fp32 (state_dtype F32 or
   DEFAULT) or bf16 bit patterns (state_dtype BF16: the pointers hold uint16_t, cast);
   grad is read in grad_dtype; param (may be NULL) receives the updated master in
   param_dtype. Every field must be set (state_dtype, sr_key and sr_index too: a
   zero-initialised tail means fp32 states). */
typedef struct zero_adam_range {
    size_t numel;
    float *master;
    float *m;
    float *v;
    const void *grad;
    zero_dtype grad_dtype;
    void *param;
    zero_dtype param_dtype;
    zero_dtype state_dtype; /* master, m, v: DEFAULT or F32 (fp32), BF16 (bf16, stored by
                               stochastic rounding: zero_adam_update_bf16)                 */
    uint64_t sr_key;        /* BF16 states: zero_sr_key(seed, step) of this step           */
    uint64_t sr_index;      /* BF16 states: the global index of element 0 (the RNG counter) */
} zero_adam_range;

/* Per-step constants of Adam/AdamW, made on the host from the double hyper-parameters
   (zero_adam_coefs_make: each computed in double and rounded to float once). */
typedef struct zero_adam_coefs {
    float beta1, one_minus_beta1; /* (float)beta1, (float)(1 - beta1)        */
    float beta2, one_minus_beta2; /* (float)beta2, (float)(1 - beta2)        */
    float step_size;    /* lr / (1 - beta1^t)                        */
    float inv_sqrt_bc2; /* 1 / sqrt(1 - beta2^t)                     */
    float eps;
    float neg_lr_wd;    /* AdamW: -(lr * weight_decay), p = fmaf(neg_lr_wd, p, p); else 0 */
    float l2;           /* Adam: weight_decay (added to the gradient); AdamW: 0 */
} zero_adam_coefs;

typedef struct zero_device zero_device;

typedef struct zero_device_ops {
    const char *name;
    void (*destroy)(zero_device *dev);
    /* Memory: 'bytes' bytes, aligned to at least 64 bytes, tagged with a category. */
    zero_result (*alloc)(zero_device *dev, size_t bytes, zero_mem_category category, void **out);
    zero_result (*free)(zero_device *dev, void *ptr);
    /* Optional (may be NULL): called once before an engine's allocations with their total
       bytes and count, so a backend can take one arena (each allocation may need up to
       256 bytes of alignment slack on top of its size). */
    zero_result (*reserve)(zero_device *dev, size_t total_bytes, size_t num_allocations);
    /* Queues and events: 'wait' makes queue q wait for ev without blocking the host;
       'sync' blocks the host until queue q is idle. */
    zero_result (*event_create)(zero_device *dev, zero_event **out);
    void (*event_destroy)(zero_device *dev, zero_event *ev);
    zero_result (*record)(zero_device *dev, zero_queue q, zero_event *ev);
    zero_result (*wait)(zero_device *dev, zero_queue q, zero_event *ev);
    zero_result (*sync)(zero_device *dev, zero_queue q);
    /* The backend's handle for queue q (cudaStream_t), handed to the comm; NULL on host. */
    void *(*native_queue)(zero_device *dev, zero_queue q);
    /* Transfers, enqueued on q. */
    zero_result (*copy)(zero_device *dev, zero_queue q, void *dst, const void *src, size_t bytes);
    zero_result (*upload)(zero_device *dev, zero_queue q, void *dst, const void *host_src,
                          size_t bytes);
    zero_result (*download)(zero_device *dev, zero_queue q, void *host_dst, const void *src,
                            size_t bytes);
    /* Element kernels, enqueued on q. */
    zero_result (*fill_zero)(zero_device *dev, zero_queue q, void *dst, size_t bytes);
    zero_result (*cast)(zero_device *dev, zero_queue q, void *dst, zero_dtype dst_dtype,
                        const void *src, zero_dtype src_dtype, size_t numel);
    /* dst[i] = round_to_dtype((float)dst[i] + (float)src[i]) */
    zero_result (*add)(zero_device *dev, zero_queue q, void *dst, const void *src,
                       zero_dtype dtype, size_t numel);
    /* x[i] = round_to_dtype((float)x[i] * s) */
    zero_result (*scale)(zero_device *dev, zero_queue q, void *x, zero_dtype dtype,
                         size_t numel, float s);
    /* *flag (fp32, device) = 1 if any element is inf or NaN; left as it was otherwise. */
    zero_result (*nonfinite)(zero_device *dev, zero_queue q, const void *x, zero_dtype dtype,
                             size_t numel, float *flag);
    /* *acc (fp64, device) += sum of x[i]^2 in fp64, in an order fixed by numel alone (blocks
       of 65536, 8 lanes by index mod 8, a fixed tree): the host and CUDA devices give the
       same bits. */
    zero_result (*sumsq)(zero_device *dev, zero_queue q, const void *x, zero_dtype dtype,
                         size_t numel, double *acc);
    /* From the all-reduced sum of squares of the raw (scaled) gradients and the all-reduced
       non-finite flag: out[0] = gradient multiplier, out[1] = gradient norm, both fp32 on
       the device, by zero_grad_mul() below. No host round-trip. */
    zero_result (*grad_mul)(zero_device *dev, zero_queue q, const double *sumsq,
                            const float *nonfinite, float unscale, float clip_norm, float *out);
    /* Adam/AdamW on one range by zero_adam_update() below, gradients multiplied by
       *grad_mul; nothing is written when *skip != 0. grad_mul and skip are device fp32;
       skip may be NULL (never skip), grad_mul may not. coefs is a host pointer, read
       before the call returns. */
    zero_result (*adam)(zero_device *dev, zero_queue q, const zero_adam_range *range,
                        const zero_adam_coefs *coefs, const float *grad_mul, const float *skip);
    /* Optional (may be NULL): page-locked host memory for offload (fast, asynchronous
       upload/download); host_free takes what host_alloc gave. */
    zero_result (*host_alloc)(zero_device *dev, size_t bytes, void **out);
    zero_result (*host_free)(zero_device *dev, void *ptr);
    /* Optional (may be NULL): the device's memory capacity (its budget) and the bytes in use
       now; the engine names them when an allocation does not fit. */
    zero_result (*memory_info)(zero_device *dev, size_t *capacity, size_t *used);
    /* Optional (may be NULL; quantized_weights / quantized_gradients need them): block
       quantization, enqueued on q, with the bits of zero_quantize and zero_dequantize_sum
       (the Quantization section): quantize writes zero_quant_bytes(numel, bits, block) bytes
       at dst; dequantize sums count quantized buffers at src + k * src_stride into dst. */
    zero_result (*quantize)(zero_device *dev, zero_queue q, void *dst, const void *src,
                            zero_dtype src_dtype, size_t numel, int bits, size_t block);
    zero_result (*dequantize)(zero_device *dev, zero_queue q, void *dst, zero_dtype dst_dtype,
                              const void *src, size_t src_stride, int count, size_t numel,
                              int bits, size_t block);
} zero_device_ops;

struct zero_device {
    const zero_device_ops *ops;
    void *impl;
};

/* Host device declarations: zero_device_ops on the CPU.

   Every op runs synchronously on the calling thread (or on 'threads' workers it joins
   before returning), so queues are only names: events are real objects, record / wait /
   sync return ZERO_OK at once, native_queue() is NULL, and reserve is NULL (no arena). Memory comes
   from the allocator, 64-byte aligned; the device keeps a table of its live allocations,
   so freeing a pointer it did not allocate returns ZERO_ERROR_INVALID_ARGUMENT instead of
   crashing. Every op validates its arguments (NULL with numel > 0, unknown dtype, queue
   out of range) and returns an error rather than crash. With a capacity (a device memory
   budget) an allocation that would take the live bytes past it fails with OUT_OF_MEMORY
   naming the bytes asked, the budget and the bytes in use; memory_info reports both, so a
   CPU run can prove that a model too large for "device" memory trains with offload
   (docs/offload.md). The device is safe to use from
   several threads at once (allocation is locked; kernels share no state).

   Kernels (docs/backends.md): add, scale and cast compute in fp32 (fp64 for F64) and round
   once to the dtype, to nearest even; sumsq adds the squares in fp64 in an order fixed by
   numel alone (8 lanes over i mod 8 within blocks of ZERO_HOST_SUMSQ_BLOCK elements, the
   lanes combined in a fixed tree, the blocks in order), so its bits do not depend on the
   SIMD path or the thread count. */

/* Elements per block of sumsq; part of the definition of its result. */
#define ZERO_HOST_SUMSQ_BLOCK 65536

typedef struct zero_host_device_desc {
    zero_allocator allocator; /* all NULL = ZERO_MALLOC / ZERO_FREE                    */
    zero_simd simd;           /* AUTO = the best the CPU has; others must be supported */
    int threads;              /* worker threads for large kernels; 0 or 1 = the caller */
    size_t capacity;          /* device memory budget in bytes: an alloc that would take the
                                 live bytes past it fails with OUT_OF_MEMORY naming the bytes
                                 asked and the budget; 0 = no limit                         */
} zero_host_device_desc;

/* A new host device. desc NULL = defaults. INVALID_ARGUMENT: threads < 0;
   UNSUPPORTED: a simd path this CPU or build lacks. */
ZERODEF zero_result zero_host_device_create(const zero_host_device_desc *desc, zero_device **out);

/* Any backend's device: dev->ops->destroy(dev). NULL is ignored. The host device frees
   allocations still live at that point. */
ZERODEF void zero_device_destroy(zero_device *dev);

/* What a host device holds now: bytes requested per category (bytes[ZERO_MEM_COUNT], may be
   NULL) and the number of live allocations (may be NULL). INVALID_ARGUMENT when dev is not a
   host device. */
ZERODEF zero_result zero_host_device_stats(zero_device *dev, size_t *bytes, size_t *allocations);

/* ======================================================================================
   Optimizer: Adam / AdamW on fp32 master weights. zero_adam_update() is the one element
   expression every path uses (host SIMD, host portable, CUDA): each multiply-add is an
   explicit fmaf and no other product meets a sum, so no compiler contraction can change
   it, and an element's result does not depend on where it sits in a shard.
   ====================================================================================== */

/* The gradient multiplier and norm from the global sum of squares of raw gradients. */
ZERO_INLINE ZERO_HOSTDEV void zero_grad_mul(double sumsq, float nonfinite, float unscale,
                                            float clip_norm, float *out_mul, float *out_norm)
{
    float norm, coef = 1.0f;
    if (nonfinite != 0.0f) {
        *out_mul = 0.0f;
        *out_norm = -1.0f; /* the step is skipped; the norm is undefined */
        return;
    }
    norm = (float)(sqrt(sumsq) * (double)unscale);
    if (clip_norm > 0.0f && norm > clip_norm)
        coef = clip_norm / (norm + 1e-6f);
    *out_mul = unscale * coef;
    *out_norm = norm;
}

ZERO_INLINE ZERO_HOSTDEV ZERO__ALWAYS_INLINE void zero_adam_update(float g, float *p, float *m, float *v,
                                               const zero_adam_coefs *c)
{
    float mm, vv, denom, pp;
    g = fmaf(c->l2, *p, g);
    mm = fmaf(c->one_minus_beta1, g - *m, *m); /* lerp: m + (1 - beta1)(g - m), torch's form */
    vv = fmaf(c->beta2, *v, (c->one_minus_beta2 * g) * g);
    denom = fmaf(sqrtf(vv), c->inv_sqrt_bc2, c->eps);
    pp = fmaf(c->neg_lr_wd, *p, *p); /* p - lr*wd*p rounded once: the decay is not quantised */
    *p = fmaf(-c->step_size, mm / denom, pp);
    *m = mm;
    *v = vv;
}

/* bf16 optimizer states (zero_engine_desc.optimizer_dtype = ZERO_BF16): master, m and v
   are stored in bf16, each rounded STOCHASTICALLY from the fp32 result of zero_adam_update:
   with x between the neighbouring bf16 values a < x < b, x rounds to b with probability
   (x - a) / (b - a), so the expected stored value is x (unbiased: small updates are not
   lost on average, as they are with round-to-nearest). The random bits come from a
   counter-based RNG: a pure function of (seed, step, element index), so every element's
   result is the same wherever it is computed (any stage, rank count, shard, tile, thread,
   SIMD path or device). The index is the element's global index in the model: tensors in
   registration order, unpadded (zero_engine: the sum of the numel of the tensors before
   it, plus the element's index within its tensor). */

/* The 64-bit mixer of the RNG (splitmix64's finaliser: a bijection, every input bit
   reaching every output bit). */
ZERO_INLINE ZERO_HOSTDEV ZERO__ALWAYS_INLINE uint64_t zero_sr_mix(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/* The key of step 'step' (1-based optimizer step) under 'seed'. */
ZERO_INLINE ZERO_HOSTDEV ZERO__ALWAYS_INLINE uint64_t zero_sr_key(uint64_t seed, int64_t step)
{
    return zero_sr_mix(zero_sr_mix(seed ^ 0x5a45524f5352ull) + (uint64_t)step * 0x9e3779b97f4a7c15ull);
}

/* 64 random bits for element 'index' under 'key': bits 0-15 round the master, 16-31 m,
   32-47 v. */
ZERO_INLINE ZERO_HOSTDEV ZERO__ALWAYS_INLINE uint64_t zero_sr_bits(uint64_t key, uint64_t index)
{
    return zero_sr_mix(key + (index + 1) * 0x9e3779b97f4a7c15ull);
}

/* fp32 bit pattern x -> bf16 bits, stochastically with the 16 random bits r16 (0..65535):
   round up (away from zero) when the 16 bits dropped plus r16 carry, i.e. with
   probability dropped / 65536. Exact values (dropped = 0) never move; inf stays inf; NaN
   stays NaN (quiet); a value above the largest finite bf16 may round to inf, with the
   probability its distance gives. */
ZERO_INLINE ZERO_HOSTDEV ZERO__ALWAYS_INLINE uint16_t zero_bf16_bits_sr(uint32_t x, uint32_t r16)
{
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + (r16 & 0xffffu)) >> 16);
}

/* Bit casts for the element function below (host and CUDA). */
ZERO_INLINE ZERO_HOSTDEV ZERO__ALWAYS_INLINE uint32_t zero__sr_f32_bits(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    union { float f; uint32_t u; } x;
    x.f = f;
    return x.u;
#endif
}

ZERO_INLINE ZERO_HOSTDEV ZERO__ALWAYS_INLINE float zero__sr_f32_from(uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    union { float f; uint32_t u; } x;
    x.u = u;
    return x.f;
#endif
}

/* bf16 bits -> fp32, exact (a NaN stays a NaN, made quiet). */
ZERO_INLINE ZERO_HOSTDEV ZERO__ALWAYS_INLINE float zero_bf16_bits_to_f32(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u;
    return zero__sr_f32_from(x);
}

/* Adam on one element with bf16 states: master, m, v widened to fp32 (exact), the fp32
   zero_adam_update, each result stored by zero_bf16_bits_sr with its 16 bits of 'bits'
   (zero_sr_bits(key, index)). Returns the stored master as fp32 (what the param gets). */
ZERO_INLINE ZERO_HOSTDEV ZERO__ALWAYS_INLINE float zero_adam_update_bf16(float g, uint16_t *p, uint16_t *m,
                                                    uint16_t *v, const zero_adam_coefs *c,
                                                    uint64_t bits)
{
    float pp = zero_bf16_bits_to_f32(*p), mm = zero_bf16_bits_to_f32(*m),
          vv = zero_bf16_bits_to_f32(*v);
    zero_adam_update(g, &pp, &mm, &vv, c);
    *p = zero_bf16_bits_sr(zero__sr_f32_bits(pp), (uint32_t)bits);
    *m = zero_bf16_bits_sr(zero__sr_f32_bits(mm), (uint32_t)(bits >> 16));
    *v = zero_bf16_bits_sr(zero__sr_f32_bits(vv), (uint32_t)(bits >> 32));
    return zero_bf16_bits_to_f32(*p);
}

/* Optimizer declarations. */

typedef enum zero_adam_mode {
    ZERO_ADAM_DEFAULT = 0, /* AdamW */
    ZERO_ADAMW = 1,        /* decoupled weight decay: p -= lr * wd * p */
    ZERO_ADAM = 2          /* L2: wd * p added to the gradient         */
} zero_adam_mode;

/* The hyper-parameters are doubles, as the user (and PyTorch, DeepSpeed) write them: the
   per-step fp32 constants are derived from them in double and rounded once, so 1 - beta2
   is the float nearest 1e-3 for beta2 = 0.999, not 1 - 0.99900001f. */
typedef struct zero_adam_desc {
    zero_adam_mode mode;
    double lr;           /* 0 = 1e-3 (a descriptor's 0 is "unset"; to train with a learning
                            rate of 0, call zero_engine_set_lr(e, 0) after commit) */
    double beta1;        /* 0 = 0.9    */
    double beta2;        /* 0 = 0.999  */
    double eps;          /* 0 = 1e-8   */
    double weight_decay; /* 0 = none (tensors may opt out individually) */
} zero_adam_desc;

/* Fills defaults and validates: lr finite and >= 0, betas in [0, 1), eps finite and > 0,
   weight decay finite and >= 0. INVALID_ARGUMENT names the field. */
ZERODEF zero_result zero_adam_desc_resolve(zero_adam_desc *out, const zero_adam_desc *in);

/* The constants of step t (1-based) for a tensor with weight decay wd (its own, or 0 when it
   opts out), each computed in double and rounded once to float: beta1, 1 - beta1, beta2,
   1 - beta2, eps, step_size = lr / (1 - beta1^t), inv_sqrt_bc2 = 1 / sqrt(1 - beta2^t);
   AdamW: neg_lr_wd = -(lr * wd), l2 = 0; Adam: neg_lr_wd = 0, l2 = wd. desc is resolved
   first (zeros mean defaults). INVALID_ARGUMENT for step < 1, a bad desc or wd, a
   coefficient that is not finite in fp32, an eps that is 0 in fp32 or a beta that rounds
   to 1 in fp32. Nothing written on error. The lr is desc's, so a desc lr of 0 means 1e-3
   here: a schedule passes its values to zero_adam_coefs_make_lr. */
ZERODEF zero_result zero_adam_coefs_make(zero_adam_coefs *out, const zero_adam_desc *desc,
                                         double weight_decay, int64_t step);

/* As zero_adam_coefs_make, with the learning rate lr taken as given (0 = 0: the params and,
   AdamW, their decoupled decay lr * wd do not move; m and v still update): what a schedule
   calls, and what the engine's step uses (zero_engine_set_lr). desc's lr is not read;
   INVALID_ARGUMENT also for a negative or non-finite lr. */
ZERODEF zero_result zero_adam_coefs_make_lr(zero_adam_coefs *out, const zero_adam_desc *desc,
                                            double lr, double weight_decay, int64_t step);

/* Adam/AdamW on the host over one range, each element by zero_adam_update() with its
   gradient multiplied by grad_mul first; param (if any) receives the rounded master
   (nearest even). One pass: every element is read and written once.
   grad_dtype: F32, F16 or BF16; param_dtype (looked at only when param != NULL): the same.
   simd: AUTO (zero_simd_detect()) or a path the CPU supports (else UNSUPPORTED).
   threads: 0 or 1 = the calling thread only; T > 1 splits the range into T contiguous
   chunks starting at multiples of 64 elements (at most 256 threads, never more than there
   are chunks); a thread that cannot be started has its chunk run on the calling thread.
   Every path and thread count gives the same bits for finite inputs (NaN payloads may
   differ). Errors: INVALID_ARGUMENT for a NULL range/coefs, a NULL buffer with numel > 0,
   a dtype outside the above, an unknown simd or threads < 0; nothing is written then.
   The implementation refuses -ffast-math (#error): it allows approximate division/sqrt. */
ZERODEF zero_result zero_adam_host(const zero_adam_range *range, const zero_adam_coefs *coefs,
                                   float grad_mul, zero_simd simd, int threads);

/* ======================================================================================
   Scaler: dynamic loss scaling (fp16); bf16 and fp32 need none.
   ====================================================================================== */
/* Scaler declarations. Dynamic loss scaling as DeepSpeed (0.17.1 and later) does it:
   on an overflow the step is skipped and, once 'hysteresis' overflows have been absorbed,
   the scale is divided by 'factor' (never below min_scale); the good step that follows
   'window' good steps since the last overflow (or the start) multiplies it by 'factor'.
   An overflow that would cut a scale already at min_scale is an error by default
   (DeepSpeed's raise_error_at_min_scale = true); see zero_scaler_at_min. */

typedef enum zero_scaler_mode {
    ZERO_SCALER_DEFAULT = 0, /* dynamic for fp16 params, none for bf16 / fp32 */
    ZERO_SCALER_DYNAMIC = 1,
    ZERO_SCALER_STATIC = 2,  /* always init_scale */
    ZERO_SCALER_NONE = 3     /* scale 1 */
} zero_scaler_mode;

/* What an overflow does when the scale is already at min_scale and would be cut. */
typedef enum zero_scaler_at_min {
    ZERO_SCALER_AT_MIN_DEFAULT = 0, /* = ERROR, as DeepSpeed's raise_error_at_min_scale = true */
    ZERO_SCALER_AT_MIN_ERROR = 1,   /* zero_engine_step returns ZERO_ERROR_LOSS_SCALE          */
    ZERO_SCALER_AT_MIN_SKIP = 2     /* skip the step and go on (raise_error_at_min_scale=false) */
} zero_scaler_at_min;

typedef struct zero_scaler_desc {
    zero_scaler_mode mode;
    float init_scale;           /* 0 = 65536 (2^16)                         */
    int window;                 /* 0 = 1000 good steps before growing       */
    int hysteresis;             /* 0 = 2 overflows before shrinking          */
    float min_scale;            /* 0 = 1                                     */
    float factor;               /* 0 = 2                                     */
    int consecutive_hysteresis; /* 1: a good step refills the hysteresis     */
    zero_scaler_at_min at_min;  /* 0 = error (DeepSpeed's default)           */
} zero_scaler_desc;

typedef struct zero_scaler {
    float scale;
    float factor;
    float min_scale;
    int window;
    int hysteresis;     /* the configured value                 */
    int cur_hysteresis; /* overflows still absorbed before a cut */
    int consecutive_hysteresis;
    int dynamic;
    int error_at_min;          /* 1: an overflow that would cut min_scale is an error */
    int64_t iter;              /* updates so far                  */
    int64_t last_overflow_iter; /* -1 before the first overflow    */
} zero_scaler;

/* Resolves defaults for params of dtype param_dtype and validates (finite, positive
   values; window, hysteresis >= 1; factor > 1; dynamic: min_scale <= init_scale);
   INVALID_ARGUMENT names the field and writes nothing. desc may be NULL (all defaults).
   param_dtype is looked at only by the DEFAULT mode, which needs F16 (dynamic) or BF16,
   F32, F64 (none). */
ZERODEF zero_result zero_scaler_init(zero_scaler *scaler, const zero_scaler_desc *desc,
                                     zero_dtype param_dtype);
/* One step's outcome: overflow != 0 when any rank saw inf/NaN (the step is skipped).
   Dynamic: DeepSpeed's rule (docs/optimizer.md); a growth that would make the scale
   infinite leaves it as it is. Static and none: the scale stays; iter and
   last_overflow_iter still count. Returns ZERO_OK, or ZERO_ERROR_LOSS_SCALE (dynamic,
   error_at_min) for an overflow that would cut a scale already at min_scale: the scaler
   is then left unchanged, as DeepSpeed leaves it when it raises. INVALID_ARGUMENT for a
   NULL scaler. The error detail (zero_last_error) is set only by the engine's step. */
ZERODEF zero_result zero_scaler_update(zero_scaler *scaler, int overflow);

/* ======================================================================================
   NVMe I/O: the I/O engine of ZeRO-Infinity's NVMe tier. Owns asynchronous reads and
   writes of byte ranges between host buffers and per-rank files (io_uring through raw
   syscalls, or a pool of threads doing pread/pwrite), O_DIRECT with aligned buffers and a
   buffered fallback, the file store, and a checksum per written range. Linux; elsewhere
   zero_io_create() returns ZERO_ERROR_UNSUPPORTED. docs/nvme.md has the longer story.
   ====================================================================================== */
/* NVMe I/O declarations.

   MODEL
       zero_io_create(&desc, &io)                  one engine (a ring or a thread pool)
       zero_io_file_create(io, dir, "optim", rank, bytes, &f)
                                                   one preallocated file, removed on destroy
       zero_io_write(f, offset, buf, bytes, &t)    queued at once, split into block_size
       zero_io_read(f, offset, buf, bytes, &t)     requests, queue_depth of them in flight
       ... compute while the requests run ...
       zero_io_wait(io, t)                         ZERO_OK, or the error of that transfer
       zero_io_file_destroy(f); zero_io_destroy(io)

   ALIGNMENT. offset must be a multiple of ZERO_IO_ALIGN. buf and bytes may be anything:
   requests whose buffer address or length is not aligned go through an internal aligned
   bounce buffer (a copy); buffers from zero_io_buffer_alloc() with offsets and lengths in
   multiples of ZERO_IO_ALIGN go straight to the disk (no copy). A file's layout is
   therefore best planned in multiples of ZERO_IO_ALIGN (zero_io_align_up()).

   INTEGRITY. The file remembers every range written through it: offset, size and the
   CRC32C of its bytes. The engine's own threads compute it, one CRC per block_size
   request as the request completes, and the write's wait joins them with
   zero_crc32c_combine (the caller's thread never reads the bytes for it). A read must name
   exactly a range written before (same offset and size; anything else is
   INVALID_ARGUMENT); the engine's threads take the CRC of each block that arrives and its
   wait compares the joined CRC with the written one: a file changed or truncated under the
   engine, a short read or a write that failed gives ZERO_ERROR_IO naming the file, the
   offset and the cause, never silently wrong bytes. A write that overlaps earlier ranges
   forgets them.

   ORDERING. Requests of different tickets may complete in any order. Do not read a range
   whose write has not been waited for (INVALID_STATE), and do not touch a buffer between
   the call that queued it and the wait for its ticket. Every call is thread-safe.

   ERRORS. zero_io_wait() returns ZERO_ERROR_IO with "zero_io: read of <path> at offset
   <o> (<n> bytes): <cause>" in zero_last_error(); the first failing request of a ticket
   decides its error. A failed transfer leaves the engine usable: other tickets are not
   affected, and the failed range reads as an error until it is written again. */

#define ZERO_IO_ALIGN 4096u                  /* offsets, direct buffers and lengths          */
#define ZERO_IO_DEFAULT_BLOCK_SIZE (1u << 20) /* bytes per request (DeepSpeed: 1 MiB)         */
#define ZERO_IO_DEFAULT_QUEUE_DEPTH 8         /* requests in flight (DeepSpeed: 8)            */

typedef enum zero_io_backend {
    ZERO_IO_BACKEND_AUTO = 0,     /* io_uring where the kernel allows it, else threads       */
    ZERO_IO_BACKEND_IO_URING = 1, /* io_uring or UNSUPPORTED at create (ENOSYS, EPERM, ...)  */
    ZERO_IO_BACKEND_THREADS = 2   /* queue_depth threads doing pread / pwrite                */
} zero_io_backend;

typedef enum zero_io_direct {
    ZERO_IO_DIRECT_DEFAULT = 0,  /* O_DIRECT; buffered where the file system refuses it,
                                    said once through the log callback                       */
    ZERO_IO_DIRECT_REQUIRE = 1,  /* O_DIRECT or UNSUPPORTED at zero_io_file_create()          */
    ZERO_IO_DIRECT_OFF = 2       /* buffered I/O (the page cache)                             */
} zero_io_direct;

/* Receives one line of text (no newline) about a choice the engine made on its own (the
   buffered fallback). Called from the thread that made the call, never with a lock held. */
typedef void (*zero_io_log_fn)(const char *message, void *user);

/* Zero-initialised = defaults. */
typedef struct zero_io_desc {
    size_t block_size;       /* bytes per request; 0 = 1 MiB; a multiple of ZERO_IO_ALIGN  */
    int queue_depth;         /* requests in flight; 0 = 8; at most 1024                      */
    zero_io_backend backend; /* AUTO = io_uring if available, else threads                   */
    zero_io_direct direct;   /* DEFAULT = O_DIRECT with the buffered fallback                */
    zero_io_log_fn log;      /* NULL = one line on stderr, prefixed "zero: "                 */
    void *log_user;
    zero_allocator allocator; /* the engine's own memory and zero_io_buffer_alloc(); all NULL
                                 = ZERO_MALLOC / ZERO_FREE                                   */
} zero_io_desc;

typedef struct zero_io zero_io;
typedef struct zero_io_file zero_io_file;

/* A queued transfer. 0 is never a valid ticket. */
typedef uint64_t zero_io_ticket;

/* What an engine is and has done. */
typedef struct zero_io_stats {
    zero_io_backend backend;  /* resolved: IO_URING or THREADS                              */
    size_t block_size;
    int queue_depth;
    int buffered_fallbacks;   /* files opened buffered because O_DIRECT was refused          */
    uint64_t requests;        /* block requests completed (both directions)                  */
    uint64_t bytes_read;      /* bytes delivered by completed reads                          */
    uint64_t bytes_written;
    uint64_t bounced;         /* requests that went through a bounce buffer                  */
    int max_in_flight;        /* most requests in flight at once                             */
} zero_io_stats;

/* A new I/O engine. desc NULL = defaults. INVALID_ARGUMENT: block_size not a multiple of
   ZERO_IO_ALIGN, queue_depth outside 0..1024, an unknown backend or direct mode;
   UNSUPPORTED: backend IO_URING where io_uring_setup fails (the errno is in the message),
   or not Linux; OUT_OF_MEMORY; IO: a thread could not be started. */
ZERODEF zero_result zero_io_create(const zero_io_desc *desc, zero_io **out);

/* Waits for every queued request to finish (their results are dropped), stops the threads,
   closes the ring and frees the engine. Files must be destroyed first (their requests are
   waited for there); a file still open is destroyed here too. NULL is ignored. */
ZERODEF void zero_io_destroy(zero_io *io);

/* Fills *out. INVALID_ARGUMENT for NULL. */
ZERODEF zero_result zero_io_get_stats(zero_io *io, zero_io_stats *out);

/* "io_uring" or "threads" ("auto" for AUTO). Never NULL. */
ZERODEF const char *zero_io_backend_name(zero_io_backend backend);

/* x rounded up to a multiple of ZERO_IO_ALIGN (x itself when it is one). */
ZERO_INLINE uint64_t zero_io_align_up(uint64_t x)
{
    return (x + (ZERO_IO_ALIGN - 1u)) & ~(uint64_t)(ZERO_IO_ALIGN - 1u);
}

/* A host buffer of at least 'bytes' bytes (rounded up to ZERO_IO_ALIGN), aligned to
   ZERO_IO_ALIGN, from the engine's allocator; contents undefined. The caller owns it and
   frees it with zero_io_buffer_free() on the same engine. INVALID_ARGUMENT: io or out NULL,
   bytes 0; OVERFLOW; OUT_OF_MEMORY. */
ZERODEF zero_result zero_io_buffer_alloc(zero_io *io, size_t bytes, void **out);

/* Frees a buffer from zero_io_buffer_alloc() of this engine. NULL is ignored. */
ZERODEF void zero_io_buffer_free(zero_io *io, void *buf);

/* A new file of 'bytes' bytes (rounded up to ZERO_IO_ALIGN) under the directory 'dir',
   named "zero-<name>-r<rank>-<pid>-<token>.bin" (token: 16 random hex digits, so jobs that
   share a directory never collide, even with the same pid in different containers or after
   a restart; a name that exists draws another token), created exclusively (O_EXCL), locked
   with flock(LOCK_EX) for as long as the file lives (its job holds it; the kernel drops it
   when the job dies, even by kill -9), preallocated (fallocate, so the space is reserved now and a full disk is an error here,
   not in the middle of a step) and opened with O_DIRECT unless the engine's direct mode
   says otherwise. The file is removed by zero_io_file_destroy(). Errors, each naming the
   path and the cause: INVALID_ARGUMENT (NULL, empty name, name with '/', rank < 0,
   bytes 0); IO: dir missing (ENOENT) or not a directory, not writable (EACCES, EROFS),
   not enough space (ENOSPC, with the bytes asked and free), any other open / fallocate
   failure; UNSUPPORTED: O_DIRECT refused under ZERO_IO_DIRECT_REQUIRE. Nothing is left
   on disk on error. First it removes the swap files under dir ("zero-*-r*-<token>.bin",
   regular, not empty, this user's) whose lock is free, i.e. those of a job that is gone,
   each with a log line (the engine's log callback, else stderr); a live job's files are
   left alone. */
ZERODEF zero_result zero_io_file_create(zero_io *io, const char *dir, const char *name, int rank,
                                        uint64_t bytes, zero_io_file **out);

/* Waits for the file's queued requests (their tickets are forgotten), closes and removes
   the file, and frees the handle. Not while another thread waits for one of its tickets.
   NULL is ignored. */
ZERODEF void zero_io_file_destroy(zero_io_file *file);

/* The file's path (owned by the file), its size in bytes, and 1 when it is opened with
   O_DIRECT, 0 when buffered. NULL file: NULL / 0 / 0. */
ZERODEF const char *zero_io_file_path(const zero_io_file *file);
ZERODEF uint64_t zero_io_file_size(const zero_io_file *file);
ZERODEF int zero_io_file_direct(const zero_io_file *file);

/* Queues a write of bytes [0, bytes) of buf to [offset, offset + bytes) of the file and
   returns at once with *ticket; the data is on the file (not necessarily on the platter)
   when zero_io_wait(io, *ticket) returns ZERO_OK. buf stays owned by the caller and must
   not change until then (the engine's threads take its CRC32C after each block's write).
   INVALID_ARGUMENT: NULL,
   bytes 0, offset not a multiple of ZERO_IO_ALIGN, a range past the file's end;
   INVALID_STATE: a queued read of an overlapping range not yet waited for;
   OUT_OF_MEMORY. Nothing is queued on error. */
ZERODEF zero_result zero_io_write(zero_io_file *file, uint64_t offset, const void *buf,
                                  size_t bytes, zero_io_ticket *ticket);

/* Queues a read of [offset, offset + bytes) of the file into buf (which must not be read
   until the wait). The range must be one written before, exactly (offset and size).
   INVALID_ARGUMENT: NULL, bytes 0, an unaligned offset, a range never written or not
   exactly as written; INVALID_STATE: its write not yet waited for; IO: its last write
   failed; OUT_OF_MEMORY. Nothing is queued on error. */
ZERODEF zero_result zero_io_read(zero_io_file *file, uint64_t offset, void *buf, size_t bytes,
                                 zero_io_ticket *ticket);

/* Declares that [offset, offset + bytes) of the file holds zeros, as a file from
   zero_io_file_create() does where nothing was written (its space is reserved with
   posix_fallocate, whose unwritten extents read as zeros, or by extending it): the range
   can then be read back as if written with zeros, without writing them (a read checks
   that every byte arrived as zero instead of a checksum). INVALID_ARGUMENT as for
   zero_io_write; INVALID_STATE: the range overlaps one written or declared before;
   OUT_OF_MEMORY. */
ZERODEF zero_result zero_io_declare_zeros(zero_io_file *file, uint64_t offset, size_t bytes);

/* Blocks until every request of the ticket has finished and forgets the ticket. ZERO_OK,
   or ZERO_ERROR_IO with zero_last_error() naming the operation, file, offset and cause
   (an errno's text, "short read: n of m bytes at offset o (end of file: truncated under
   the engine?)", "checksum mismatch: the file changed under the engine"); then the
   contents of a read's buffer are undefined (read into a staging buffer). INVALID_ARGUMENT
   for an unknown ticket (never queued, already waited for, or being waited for by another
   thread). */
ZERODEF zero_result zero_io_wait(zero_io *io, zero_io_ticket ticket);

/* Waits for every ticket queued on the engine (except those another thread is waiting for
   in zero_io_wait) and forgets them; returns the first error, by ticket order. */
ZERODEF zero_result zero_io_wait_all(zero_io *io);

/* Fault injection, for tests: the engine counts block requests as they are issued, from 1
   after this call; request number 'request' then fails. kind ERRNO: with errno 'err'
   (ENOSPC, EIO, ...) instead of being issued; SHORT: it transfers nothing, as at the end of
   the file; OPEN_DIRECT: the next O_DIRECT open is refused with EINVAL, as tmpfs and
   overlayfs used to (request is ignored). A NULL fault (or kind NONE) clears it. One-shot:
   the fault fires once. INVALID_ARGUMENT for a NULL io or an unknown kind. */
typedef enum zero_io_fault_kind {
    ZERO_IO_FAULT_NONE = 0,
    ZERO_IO_FAULT_ERRNO = 1,
    ZERO_IO_FAULT_SHORT = 2,
    ZERO_IO_FAULT_OPEN_DIRECT = 3
} zero_io_fault_kind;

typedef struct zero_io_fault {
    zero_io_fault_kind kind;
    uint64_t request; /* 1 = the next request                        */
    int err;          /* ERRNO: the errno to report (e.g. ENOSPC, EIO) */
} zero_io_fault;

ZERODEF zero_result zero_io_inject_fault(zero_io *io, const zero_io_fault *fault);

/* A 64-bit checksum of bytes (the file store kept it per range until the store moved to
   CRC32C, which joins per block: kept for tools and tests). The bytes, zero-padded
   to a multiple of 32, are read as little-endian 32-bit words w_0, w_1, ...; lane j
   (0..7) takes words j, j + 8, j + 16, ... (K of them, K = padded bytes / 32) and keeps
   Fletcher's two sums mod 2^64: A_j = sum of its words, B_j = sum over i of (K - i) * its
   i-th word. h = bytes * P3, then for j = 0..7: h = mix(h, A_j), h = mix(h, B_j), where
   mix(h, v) = (h ^ (rotl(v * P2, 31) * P1)) * P1 + P4, and the result is h after
   xxHash64's final avalanche (P1..P4 are xxHash64's primes). Any change of one word, or a
   swap of two different words, changes A or B; the length is in it too. Plain adds over
   independent lanes, so it runs near memory speed (the engine checksums every byte it
   moves). Exposed for tests and tools. NULL gives 0. */
ZERODEF uint64_t zero_io_checksum(const void *data, size_t bytes);

/* ======================================================================================
   Engine: ZeRO stages 0-3 over a zero_device and a zero_comm.
   ====================================================================================== */
/* Engine declarations: ZeRO stages 0-3, written once against
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

   OFFLOAD (docs/offload.md). With offload_optimizer = cpu the rank's master, m and v live in
   host memory (pinned through dev->ops->host_alloc where the device has it, unless
   pin_memory = ZERO_PIN_MEMORY_OFF); the step keeps
   the inf/NaN check, the norm and the clip coefficient on the device (the same bits), then
   runs over tiles of at most sub_group_size elements: tile k+1's gradients go device -> host
   on ZERO_QUEUE_OFFLOAD while the host Adam (zero_adam_host, host_threads threads, the same
   element expression as the device's) updates tile k and earlier tiles' params go host ->
   device on ZERO_QUEUE_COMPUTE, ordered by events and host syncs. offload_optimizer = nvme
   keeps each tile's master, m, v as one checksummed range of a per-rank file under
   nvme_path (the NVMe I/O engine above: O_DIRECT, block_size, queue_depth), read
   buffer_count - 2 tiles ahead and written behind the Adam; offload_gradients = nvme adds
   the tile's reduced gradients (one range per tile of a per-rank gradient file, written as
   each group's reduction lands, read with the record). offload_param (stage 3) keeps
   the param shards of partitioned groups on the host (cpu) or in a file (nvme): a gather
   (or a prefetch) uploads the shard into its arena extent and all-gathers in place; with
   nvme the shards are read param_read_ahead groups ahead of the gathers, in the recorded
   order, while the caller computes. Between steps (set_tensor, read_tensor, checkpoints)
   the NVMe tier is reached through write-back caches written behind asynchronously. Every
   configuration gives the same bits as the run without offload.

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
    zero_dtype optimizer_dtype;  /* master, m and v: DEFAULT = ZERO_F32 (12 bytes per trained
                                    element); ZERO_BF16 = 6 bytes, each value rounded
                                    stochastically after every step (zero_adam_update_bf16,
                                    the RNG keyed by optimizer_seed, the step and the
                                    element's global index: every stage, rank count and
                                    offload tier gives the same bits). Not the same
                                    training as F32 (docs/optimizer.md). offload_optimizer =
                                    NVME: UNSUPPORTED for now. In the plan hash.              */
    uint64_t optimizer_seed;     /* optimizer_dtype BF16: the stochastic rounding's seed (any
                                    value, 0 included). In the plan hash.                     */
    zero_scaler_desc scaler;     /* loss scaling (zero = dynamic for fp16, none otherwise)      */
    float clip_norm;             /* global gradient-norm clipping; 0 = none                     */
    int accum_steps;             /* micro-steps per step; 0 = 1                                 */
    size_t reduce_bucket_numel;  /* ready gradients are reduced once they total this many
                                    elements (and at the end of every micro-step); 0 = each
                                    group as soon as it is ready, SIZE_MAX = once per
                                    micro-step. Also the reduce bucket: a reduction that needs
                                    staging (grad_comm_dtype != param_dtype) runs through a
                                    bucket of N x b comm-dtype elements, b = this / N (0: the
                                    second-largest group / N; at most the largest shard), a
                                    large group in bucket-sized pieces (same bits).             */
    size_t max_live_numel;       /* stages 2-3: the arena, elements of the param dtype held at
                                    once by stage-3 gathered params (in use or prefetched) and
                                    gradient buffers (zero_engine_grads), each its own size;
                                    0 = the largest group M + (2 + prefetch depth) x the second
                                    largest M2 (stage 2: M + 2 M2), and at least 2 M + depth x
                                    M2 when that is <= ZERO_ARENA_SMALL_NUMEL; SIZE_MAX = no
                                    limit. INVALID_ARGUMENT at commit (naming the group and the
                                    value that fits) if a group exceeds it.                    */
    int prefetch_depth;          /* stage 3: gathers of the recorded order run ahead; 0 = 1,
                                    negative = none                                            */
    size_t persist_numel;        /* stage 3: groups with fewer used elements stay whole on
                                    every rank (DeepSpeed's param_persistence_threshold);
                                    0 = none persistent (the paper's 3 Psi traffic)             */
    size_t align_numel;          /* tensor alignment in elements; 0 = ZERO_DEFAULT_ALIGN_NUMEL  */
    zero_device *device;         /* required; not owned                                         */
    zero_comm *comm;             /* required; not owned. world = comm->world                    */
    zero_allocator allocator;    /* host-side memory of the engine; all NULL = ZERO_MALLOC      */
    int host_threads;            /* threads of the host Adam when the optimizer is offloaded
                                    (>= 0; 0 = the online CPUs, at most 16; every count gives
                                    the same bits). Without offload the device's own threads.  */
    /* ZeRO-Offload / ZeRO-Infinity (docs/offload.md), with DeepSpeed's names and defaults:  */
    zero_offload_device offload_optimizer; /* where this rank's fp32 master, m and v live and
                                    the Adam step runs: NONE (device), CPU (host memory, host
                                    Adam), NVME (files under nvme_path). Stages 1-3.            */
    zero_offload_device offload_param; /* stage 3 only: where the fp16/bf16 param shards of
                                    partitioned groups live between gathers (uploaded into
                                    their arena extent before the all-gather). NONE, CPU, NVME.
                                    Needs offload_optimizer != NONE (DeepSpeed's rule).         */
    zero_offload_device offload_gradients; /* where this rank's reduced gradient shard lives
                                    between its reduction and the step, when offload_optimizer
                                    is set: NONE (0, the default) = the host tier (S elements
                                    of the comm dtype in host memory), CPU = the same, said
                                    explicitly (needs offload_optimizer); NVME (needs
                                    offload_optimizer = NVME) = the rank's gradient file under
                                    nvme_path, one range per optimizer tile, staged through
                                    host buffers of the largest shard (two, three with
                                    accumulation or gradient parts) and buffer_count tiles,
                                    so host memory does not grow with Psi.
                                    Same bits in every setting. Local to the rank (not in the
                                    plan hash). Resolved: 0 becomes CPU when offload_optimizer
                                    is set, stays NONE otherwise.                              */
    double offload_optimizer_ratio; /* partial offload (DeepSpeed's offload_optimizer.ratio,
                                    "Twin-Flow"): the fraction r in (0, 1] of this rank's
                                    optimizer shard (master, m, v) that lives in the tier of
                                    offload_optimizer; the rest stays on the device and the
                                    device's Adam updates it while the host's Adam runs on the
                                    host part. The split is at element granularity: the first
                                    H = max(1, floor(r S + 0.5)) (at most S) elements of the
                                    rank's shard (S elements, groups in order) are offloaded,
                                    so any r is honoured for any size. 0 = 1 (everything) when
                                    offload_optimizer is set; needs offload_optimizer (a
                                    nonzero r without it, NaN, r < 0 or r > 1:
                                    INVALID_ARGUMENT). r < 1 is not supported with offload_param
                                    or offload_gradients = NVME (INVALID_ARGUMENT). Same bits
                                    at every r; in the plan hash (ranks must agree). Resolved:
                                    0 becomes 1 when offload_optimizer is set.                 */
    int delayed_update;          /* DPU, the ZeRO-Offload paper's delayed parameter update
                                    (docs/offload.md, "Delayed parameter update"): 1 = once
                                    delayed_update_after updates have been applied, the host
                                    Adam of a step's gradients runs on a background thread
                                    while the caller's next forward and backward run, and its
                                    params are published at the end of the next
                                    zero_engine_step: each forward then sees the params
                                    without the previous step's update (one-step staleness).
                                    0 = off (default). Needs offload_optimizer = CPU at ratio 1
                                    and offload_param NONE or CPU (INVALID_ARGUMENT otherwise,
                                    saying why). Costs the host tier S c + S p bytes (a second
                                    gradient shard, the pending params). In the plan hash.     */
    int delayed_update_after;    /* DPU's warm-up K >= 0: the first K updates are applied at
                                    once, every later one is delayed (0 = delayed from the
                                    first). Nonzero needs delayed_update = 1.                  */
    const char *nvme_path;       /* directory of the NVMe tier's files; required with NVME     */
    int pin_memory;              /* ZERO_PIN_MEMORY_AUTO (0, the default) or _ON (1): host
                                    buffers through the device's pinned allocation
                                    (dev->ops->host_alloc, cudaHostAlloc on CUDA) when it has
                                    one; ZERO_PIN_MEMORY_OFF (-1): plain memory from
                                    'allocator'. Resolved by create to 1 (pinned) or -1.        */
    int buffer_count;            /* host staging buffers of the offloaded step's pipeline
                                    (>= 2; 0 = 4, DeepSpeed's offload_optimizer default)         */
    size_t buffer_size;          /* elements per staging buffer, at most (0 = 1e8, DeepSpeed's
                                    offload_param default); a tile never exceeds it             */
    size_t sub_group_size;       /* the offloaded step runs over tiles of at most this many
                                    elements (0 = 1e9, DeepSpeed's default)                    */
    size_t block_size;           /* NVMe I/O block in bytes (0 = 1 MiB; power of two >= 4096) */
    int queue_depth;             /* NVMe requests in flight (0 = 8; 1..1024)                   */
    int param_read_ahead;        /* stage 3, offload_param = nvme: param shards the gathers
                                    read ahead of their upload, in the recorded order (0 = 2;
                                    1..16); host shard buffers: 1 + this (at least 2)          */
    int async_step;              /* 1 = zero_engine_step(e, NULL) enqueues the step and returns
                                    without waiting for the device: its verdict (skipped, norm)
                                    reaches the loss scaler and the step count when the engine
                                    next needs them (zero_engine_loss_scale, _step_count,
                                    _last_step, the next step), read on the offload queue so
                                    that wait covers this step's work only, not what you queued
                                    after it. Queue the next forward pass before asking for the
                                    loss scale to overlap them. Results are the same bits. A
                                    step given an info pointer waits as before. 0 = always wait.
                                    ZERO_ERROR_LOSS_SCALE of an enqueued step is returned once,
                                    by the next call that can return it (_last_step, the next
                                    step, a checkpoint save or load), which then did nothing
                                    else; the value queries (_loss_scale, _step_count) read the
                                    verdict but leave its error to that call.                    */
    /* Activation offload (zero_engine_stash / zero_engine_fetch below; local to each rank,
       not part of the plan hash):                                                           */
    zero_offload_device offload_activations; /* where stashed activations live: NONE (no
                                    activation tier; stash is INVALID_STATE), CPU (a host arena
                                    of activation_host_bytes), NVME (a file of
                                    activation_nvme_bytes under nvme_path, staged through
                                    activation_host_bytes of host memory)                      */
    size_t activation_host_bytes; /* the host budget of the activation tier. CPU: the arena,
                                    required (> 0); NVME: the staging for transfers in flight
                                    and prefetches, 0 = 64 MiB. Each stash takes its bytes
                                    rounded up to ZERO_IO_ALIGN (4096).                        */
    size_t activation_nvme_bytes; /* NVME: the file's size, required (> 0): the most bytes
                                    stashed at once, each rounded up to ZERO_IO_ALIGN          */
    int debug_guards;            /* debug mode while integrating: 1 = zero_engine_gather and
                                    zero_engine_grads hand out a copy of the group's buffer
                                    followed by ZERO_DEBUG_GUARD_BYTES guard bytes, checked at
                                    zero_engine_release and zero_engine_grads_ready (which copy
                                    the gradients in); a changed guard byte is INVALID_STATE
                                    naming the group, the buffer, its size and dtype (writing
                                    fp32 values into an fp16 buffer is the usual cause). Costs
                                    two copies of each group on the device (not counted in
                                    zero_engine_memory_usage) and a device sync per check.
                                    Also: the step after zero_engine_set_tensor calls compares
                                    each tensor's values across ranks (a hash, all-reduced
                                    under ZERO_COLL_USER; every rank must set the same tensors):
                                    MISMATCH naming the first that differs.
                                    0 = on when the implementation is compiled with ZERO_DEBUG
                                    defined, else off; -1 = off. Local (not in the plan hash). */
    /* ZeRO++'s quantized collectives (docs/engine.md, "Quantized collectives"). Lossy by
       design: the values that cross are int8 / int4 blocks with one fp32 scale each (the
       Quantization section above); every rank must set the same values (the commit check
       compares them: MISMATCH naming the setting).                                         */
    int quantized_weights;       /* qwZ, stage 3: 1 = the first all-gather of each group in a
                                    micro-step (the forward's) carries int8 blocks + scales
                                    instead of the params (about half the bytes at 16-bit);
                                    later gathers of the group in the micro-step (the
                                    backward's) are exact. 0 = off. Needs the device's
                                    quantize / dequantize ops.                                 */
    int quantized_gradients;     /* qgZ, stages 1-3: 1 = the gradient reduce-scatter becomes
                                    quantize (each rank's N blocks), all_to_all, dequantize and
                                    sum in fp32 in rank order (deterministic; stages 1-3 give
                                    the same bits). Needs grad_comm_dtype = param_dtype and a
                                    comm with all_to_all. 0 = off.                             */
    int quantized_gradient_bits; /* qgZ's code width: 4 (0 = the default, ZeRO++'s) or 8     */
    int quantized_gradient_levels; /* qgZ's scheme: 2 = hierarchical (ZeRO++'s): quantize R
                                    blocks by destination local rank, all_to_all inside the
                                    node, sum in fp32, re-quantize N / R blocks by destination
                                    node, all_to_all across nodes among the ranks of the same
                                    local index, sum in fp32 (bytes between nodes / R, two
                                    quantizations); 1 = flat (one all_to_all over the N ranks,
                                    one quantization); 0 = the default: 2 when 1 < R < N
                                    (ranks_per_node), else 1. With R = 1 or R = N the two-level
                                    scheme is the flat one (one level is empty) and resolves
                                    to 1. Level 2 needs a comm with split.                    */
    size_t quant_block_numel;    /* elements per quantization block, even (0 =
                                    ZERO_QUANT_BLOCK_DEFAULT = 256); blocks never straddle a
                                    rank's shard                                              */
    /* Topology (docs/engine.md, "Beyond one node"):                                         */
    int ranks_per_node;          /* R: ranks [k R, (k + 1) R) of the comm share node k. 0 = from
                                    the launcher's environment, the first of LOCAL_WORLD_SIZE
                                    (torchrun), OMPI_COMM_WORLD_LOCAL_SIZE (Open MPI),
                                    SLURM_NTASKS_PER_NODE (srun) that is set, used when it
                                    divides the world, else the world (one node). Otherwise
                                    1..world and dividing it (INVALID_ARGUMENT). In the plan
                                    hash: every rank must agree (MISMATCH at commit). Changes
                                    no value: zero_traffic splits the bytes into intra- and
                                    inter-node by it, and the hierarchical modes build their
                                    groups on it.                                              */
    int mics_shard_size;         /* MiCS (FSDP2's HSDP), stages 1-3: S > 1 partitions the model
                                    states within groups of S consecutive ranks [k S, (k + 1) S)
                                    and replicates them across the N / S groups. Gradients are
                                    reduce-scattered inside the group (every reduction, as
                                    flat), the accumulated shard is all-reduced across the
                                    replicas once per step (at the accumulation boundary),
                                    params are all-gathered inside the group only. Memory per
                                    rank: the flat formulas at N = S. 0 or N = off. Must divide
                                    N; needs a comm with split (UNSUPPORTED otherwise); refused
                                    at stage 0, with any NVMe tier and with a partial
                                    offload_optimizer_ratio (docs/engine.md, "MiCS").          */
    int hpz_partition_size;      /* ZeRO++ hpZ, stage 3: S > 1 keeps, beside the primary 1/N
                                    param shard, a secondary copy of each partitioned group
                                    cut in S parts over the S consecutive ranks [k S, (k + 1) S)
                                    (the group's slice k' = rank % S of the gathered params,
                                    + p Psi / S bytes per rank), taken from the first all-gather
                                    of the group after the params last changed (the step,
                                    set_tensor, a load); every later gather of the group until
                                    they change all-gathers the secondary parts over those S
                                    ranks only, no shard upload. S must divide ranks_per_node
                                    (the group lies inside a node; S = R is ZeRO++'s default).
                                    Exact: the same bits as plain stage 3 (with qwZ the
                                    secondary holds the forward's dequantized values, so the
                                    backward reads those). 0, 1 or N = off (DeepSpeed's 1).
                                    Needs a comm with split; refused below stage 3, with MiCS,
                                    with offload_param = nvme (docs/engine.md, "hpZ").        */
} zero_engine_desc;

#define ZERO_DEBUG_GUARD_BYTES 64 /* debug_guards: guard bytes after each handed-out buffer */

typedef struct zero_engine zero_engine;

/* Tensor flags for zero_engine_add_tensor(). */
#define ZERO_TENSOR_NO_DECAY 1u /* excluded from weight decay (biases, norms)                  */
/* Used but not trained (fine-tuning): no gradient buffer, reduction, master, m, v or optimizer
   work; its params are replicated at stages 0-2 and partitioned and gathered at stage 3 like
   the others, and checkpoints keep them. The group lays its frozen tensors out after its
   trained ones (zero_plan_freeze), so the gradient buffer zero_engine_grads hands out holds
   the trained tensors only (the group's numel - frozen_numel elements). */
#define ZERO_TENSOR_FROZEN 2u

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
    ZERO_COLL_USER = 5,    /* zero_engine_allreduce: the user's own values          */
    ZERO_COLL_COUNT = 6
} zero_coll;

/* Traffic per rank, as bus volume: an all-gather or reduce-scatter over a total of T
   elements moves T (N-1)/N per rank, an all-reduce 2 T (N-1)/N, a broadcast T (N-1)/N;
   nothing at N = 1. Control all-reduces are counted apart (ZERO_COLL_CONTROL), and so are
   the user's (ZERO_COLL_USER, zero_engine_allreduce), so the payload can be compared with
   the paper (2 Psi or 3 Psi per step, times (N-1)/N). */
typedef struct zero_traffic {
    uint64_t calls[ZERO_COLL_COUNT];
    double numel[ZERO_COLL_COUNT]; /* elements moved per rank (exact below 2^53)          */
    double bytes[ZERO_COLL_COUNT]; /* the same in bytes of each call's dtype              */
    /* bytes[] split by the topology (zero_engine_desc.ranks_per_node): a collective over G
       ranks moves u elements between this rank and each of its G - 1 peers (u: the send
       block of an all-gather, the received block of a reduce-scatter, 2 T / G of an
       all-reduce of T), so intra = u x (its peers on this rank's node) and inter = u x (its
       peers on other nodes); intra + inter = bytes up to the rounding of 2 T / G. One node
       (the default): all intra. docs/engine.md, "Traffic". */
    double intra_bytes[ZERO_COLL_COUNT];
    double inter_bytes[ZERO_COLL_COUNT];
} zero_traffic;

/* Bytes this rank's engine holds on one tier (the device, for zero_engine_memory_usage), by
   category, now and at peak (since commit). */
typedef struct zero_engine_memory {
    size_t bytes[ZERO_MEM_COUNT];
    size_t peak_bytes[ZERO_MEM_COUNT];
    size_t total_bytes;      /* sum of bytes[]                                            */
    size_t peak_total_bytes; /* peak of the sum                                           */
    size_t allocations;      /* live device allocations                                   */
} zero_engine_memory;

/* The memory tiers of ZeRO-Infinity. */
typedef enum zero_mem_tier {
    ZERO_TIER_DEVICE = 0, /* the device's memory (what zero_engine_memory_usage reports)  */
    ZERO_TIER_HOST = 1,   /* host memory: offloaded state and the host staging buffers    */
    ZERO_TIER_NVME = 2,   /* bytes in the NVMe tier's files                               */
    ZERO_TIER_COUNT = 3
} zero_mem_tier;

/* The arena's accounting (stages 2-3; zeros at stages 0-1): the device buffer of
   max_live_numel elements that holds stage-3 gathered params (in use or prefetched) and
   stage 2-3 gradient buffers, each taking its group's size. */
typedef struct zero_gather_stats {
    size_t limit_numel;     /* the arena: max_live_numel, at most what can ever be live    */
    size_t live_numel;      /* arena elements held now (params and gradient buffers)       */
    size_t peak_live_numel; /* most held at once since commit (<= limit_numel)             */
    size_t grad_live_numel; /* of live_numel: gradient buffers handed out, not yet reduced */
    int live_groups;        /* non-persistent groups gathered now (in use or prefetched)   */
    uint64_t gathers;       /* all-gathers issued for non-persistent groups                */
    uint64_t prefetches;    /* of which issued ahead of use                                */
    uint64_t prefetch_hits; /* gathers served by a prefetch (prefetches used)              */
    uint64_t evictions;     /* prefetched groups dropped before use: for room, stale at a
                               step, a checkpoint load or set_tensor                       */
    uint64_t prefetch_wasted; /* prefetches issued and never used (= evictions)            */
    int trace_len;            /* gathers and gradient buffers per micro-step in the
                                 recorded order (0: none yet)                              */
    uint64_t trace_records;   /* orders recorded: the first micro-step, and each change    */
    /* offload_param = nvme: reads of param shards from the NVMe tier (a shard never written
       since commit is the file's zeros and is not read) */
    uint64_t nvme_reads_ahead;  /* issued ahead of the gather that wanted them              */
    uint64_t nvme_reads_demand; /* issued when wanted: a gather whose read was not ahead,
                                   set_tensor, read_tensor, checkpoints                     */
    uint64_t nvme_reads_wasted; /* read ahead and dropped unused (a step, a changed order)  */
    int nvme_reads_in_flight_max; /* most reads ahead in flight at once (<= param_read_ahead) */
    double nvme_read_wait_s;    /* seconds spent waiting for shard reads (their CRCs are
                                   taken by the I/O engine's threads as the blocks arrive)   */
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

/* The descriptor with every default filled in (valid after create): the resolved Adam
   and scaler settings (scaler.mode DYNAMIC or NONE in place of DEFAULT; init_scale 65536,
   window 1000, hysteresis 2, min_scale 1, factor 2 where 0 was given), dtypes, accum_steps,
   prefetch_depth, align_numel, host_threads; max_live_numel after commit at stages 2-3.
   adam.lr is the current learning rate (zero_engine_set_lr): 0 there is 0, which a new
   engine created from this descriptor would read as the default 1e-3. */
ZERODEF zero_result zero_engine_get_desc(const zero_engine *e, zero_engine_desc *out);

/* The default arena (max_live_numel = 0) holds the largest group's params and gradients at
   once (plus the prefetches) when that is at most this many elements; docs/engine.md. */
#define ZERO_ARENA_SMALL_NUMEL ((size_t)1 << 24)

/* Most gradient parts a group may have (zero_engine_set_grad_parts). */
#define ZERO_MAX_GRAD_PARTS 64

/* Local, before commit: group g's gradient arrives in 'parts' separate contributions per
   micro-step (default 1), for a weight used twice whose contributions are far apart in the
   backward, e.g. a tied embedding (the LM head's gradient at the start of the backward, the
   lookup's at the end). Each contribution is one zero_engine_grads (a zero-filled buffer) /
   write / zero_engine_grads_ready, reduced on its own, so the group's gradient buffer is not
   held between the uses. Contributions accumulate like micro-steps: the first of the step
   stores, each later one is added with one rounding, in call order, the same at every stage
   (so stages stay bit-identical; the sum differs in the last bits from writing both
   contributions into one buffer). A micro-step ends when every group has made all its
   parts ready. Costs one more reduction of the group per extra part, and at stages 0-1 the
   accumulator separate from the gradient buffer (docs/engine.md). Errors: INVALID_STATE
   after commit; INVALID_ARGUMENT for a negative group or parts outside 1..64 (commit: a
   group with no tensor); OUT_OF_MEMORY. */
ZERODEF zero_result zero_engine_set_grad_parts(zero_engine *e, int group, int parts);

/* One tile of a tensor registered in tiles (zero_engine_add_tiled_tensor). */
typedef struct zero_tile_view {
    int tensor;    /* the tile's tensor id                                              */
    int group;     /* its group: zero_engine_gather(group) / _grads(group) to use it    */
    size_t row0;   /* its first row in the whole tensor                                 */
    size_t rows;   /* its rows: elements [row0 * cols, (row0 + rows) * cols) of the whole */
    size_t cols;
    size_t offset; /* its first element in the group's flat buffer (0 before commit)    */
} zero_tile_view;

/* Local, before commit. Memory-centric tiling (ZeRO-Infinity): registers a rows x cols
   row-major tensor as k_tiles tensors, each in its own group (first_group + i for tile i),
   so that a layer too large for the arena (or for the memory target) is gathered, used and
   given gradients one tile at a time: only a tile's params and gradients need to be live.
   Tile i holds rows [row0_i, row0_i + rows_i), the rows split as evenly as possible (the
   first rows % k_tiles tiles take one row more), and is named "<name>.tile<i>" with shape
   [rows_i, cols]; *out_tensor = tile 0's tensor id (tile i is *out_tensor + i). Doing the
   same arithmetic tile by tile gives the same bits as the whole tensor: every engine
   operation is elementwise, in a fixed order per element (the global norm's fp64 sum is
   grouped differently: its last bits may differ). Checkpoints hold the tiles as separate
   tensors. Errors: INVALID_STATE after commit; INVALID_ARGUMENT for a NULL, empty or too
   long name, rows or cols 0, k_tiles outside 1..rows, first_group < 0, unknown flags;
   OVERFLOW; and those of zero_engine_add_tensor_shape for tile i (a name already taken,
   OUT_OF_MEMORY), after which tiles 0..i-1 stay registered and the call can be repeated
   under another name (or the engine destroyed). */
ZERODEF zero_result zero_engine_add_tiled_tensor(zero_engine *e, const char *name, size_t rows,
                                                 size_t cols, int k_tiles, int first_group,
                                                 unsigned flags, int *out_tensor);

/* Tile 'tile' of the tiled tensor whose tile 0 is tensor 'tensor' (the id
   zero_engine_add_tiled_tensor returned). NOT_FOUND when tensor is not a tiled tensor's
   tile 0 or tile is outside 0..k_tiles-1; INVALID_ARGUMENT for NULL. */
ZERODEF zero_result zero_engine_tile_view(const zero_engine *e, int tensor, int tile,
                                          zero_tile_view *out);

/* Registers a tensor of numel elements in group 'group' (0..G-1; groups are gathered in
   ascending order in forward). flags: 0, ZERO_TENSOR_NO_DECAY, ZERO_TENSOR_FROZEN. Tensor ids are 0, 1, ...
   in registration order. Errors: INVALID_STATE after commit; INVALID_ARGUMENT for a bad
   name, numel 0, a negative group or unknown flags. */
ZERODEF zero_result zero_engine_add_tensor(zero_engine *e, const char *name, size_t numel,
                                           int group, unsigned flags, int *out_tensor);

/* COLLECTIVE. Lays out the plan for comm->world, calls device->ops->reserve (if any) and
   allocates every buffer (everything starts at zero), then checks with one control
   all-reduce, which every rank joins even after its own plan or allocation failed, that
   every rank has the same plan and settings (ZERO_ERROR_MISMATCH on every rank otherwise)
   and that every rank allocated (a rank's allocation failure fails every rank's commit with
   its code). Nothing is allocated after this until destroy.
   Errors: INVALID_STATE if already committed or no tensor registered; INVALID_ARGUMENT for
   bad group ids or a stage-3 group larger than max_live_numel; MISMATCH; OUT_OF_MEMORY,
   DEVICE, COMM. After a failed commit the engine can only be destroyed.
   Offload: commit also allocates the host tier and creates the NVMe files (IO naming the
   path and cause: nvme_path missing, not writable, full). An OUT_OF_MEMORY from the device
   (a budget) names the bytes asked, the bytes this configuration needs, the device's
   capacity (dev->ops->memory_info) and the offload setting that would fit, by the
   estimator's model states plus this configuration's buffers. */
ZERODEF zero_result zero_engine_commit(zero_engine *e);

/* The committed plan (layout queries: zero_plan_tensor, zero_plan_group, ...); NULL
   before commit. Owned by the engine. */
ZERODEF const zero_plan *zero_engine_plan(const zero_engine *e);

/* Sets a tensor's values from numel fp32 host values (every rank passes the same): the
   master weights this rank owns and the params it stores (rounded to the param dtype).
   Moments are left as they are (zero after commit). Local, synchronous. Errors:
   INVALID_STATE before commit, between micro-steps of a step, or while the tensor's group
   is gathered (at every stage); NOT_FOUND; INVALID_ARGUMENT for NULL values. */
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
   offset). Stage 3: all-gathers the group into the arena (max_live_numel; it takes the
   group's size) unless it is already gathered or persistent, making room by reducing
   pending gradients and evicting prefetched groups not in use (the one used farthest
   ahead); then prefetches. Prefetch follows the order of gathers (and gradient buffers)
   that the first micro-step recorded: the next prefetch_depth gathers of that order, where
   they fit beside the gradient buffers it asks for first; a group used twice is prefetched
   where it is used next. A micro-step that departs from the order is re-recorded from the
   point of departure (nothing is prefetched while recording; a prefetch the new order does
   not use is dropped, never served stale). Stages 0-2: the whole param buffer, no communication. Gathers
   are counted: each needs a matching zero_engine_release(). Errors: NOT_FOUND for an
   unknown group; INVALID_STATE before commit or when the arena is full of groups in use and
   gradient buffers (the message names them and a max_live_numel at which a rerun of the
   same calls passes this one). Beside at most one other group in use or gradient buffer
   handed out, a group that fits by size always finds room (docs/engine.md, "Placement"). */
ZERODEF zero_result zero_engine_gather(zero_engine *e, int group, void **out_params);

/* Ends one use of group g's parameters. Stage 3: when the count drops to zero its extent is
   returned to the arena (after the compute work already enqueued). Persistent groups stay.
   Errors: NOT_FOUND; INVALID_STATE when g is not gathered (released twice). */
ZERODEF zero_result zero_engine_release(zero_engine *e, int group);

/* COLLECTIVE at stage 3 (a prefetch is an all-gather). Starts gathering group g ahead of
   use if it is not gathered and it fits the arena's free room; does nothing otherwise (a
   hint, not a use: not recorded in the order, and not a reference: no release needed).
   Stages 0-2: nothing. */
ZERODEF zero_result zero_engine_prefetch(zero_engine *e, int group);

/* COLLECTIVE at stages 2-3, and for a group with several gradient parts (it may first
   reduce the gradients still pending). The buffer for this micro-step's gradients of group g
   (param dtype, group numel elements, tensor layout as in gather), zero-filled. Stages 0-1:
   a slice of the whole gradient buffer; stages 2-3: an extent of the arena (max_live_numel),
   made room for by reducing pending gradients and evicting prefetched groups not in use.
   Calling it again before grads_ready returns the same buffer unchanged. A group far larger
   than the others (an untiled embedding): ask for its gradients after releasing its params
   where the backward allows it (a linear layer's weight gradient needs no weights), so the
   two need not share the arena. Errors: NOT_FOUND; INVALID_STATE before commit, when g is
   already ready in this micro-step (all its parts), when the step's micro-steps are all
   done, or (stages 2-3) when the arena is full of gathered groups in use and gradient
   buffers not yet ready (the message names them and a max_live_numel at which a rerun of
   the same calls passes this one; as for gather, a buffer that fits by size beside at most
   one other held buffer always finds room). */
ZERODEF zero_result zero_engine_grads(zero_engine *e, int group, void **out_grads);

/* COLLECTIVE. Group g's gradients for this micro-step (or this part of them) are written (by
   work enqueued on the compute queue before this call). Its reduction starts (or joins the
   pending bucket); once every group has made all its parts ready the micro-step is
   complete. The buffer must not be touched
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
   still gathered (release every group first). COMM/DEVICE: engine broken.
   LOSS_SCALE (on every rank alike): the gradients overflowed while the dynamic loss scale
   was already at scaler.min_scale, with scaler.at_min left at its default (DeepSpeed's
   raise_error_at_min_scale): the step was skipped like any overflow (info filled, the
   engine usable, the scaler unchanged), and the message says what to do. IO (NVMe tier:
   a read, write or checksum failed on some rank): every rank agrees on it through one
   control all-reduce and returns it, its engine broken; the failing rank's message names
   the file, offset and cause. */
ZERODEF zero_result zero_engine_step(zero_engine *e, zero_step_info *info);

/* The scale to multiply the loss by in this step's micro-steps (1 without scaling). */
ZERODEF float zero_engine_loss_scale(const zero_engine *e);

/* Optimizer steps taken (skipped steps not counted). */
ZERODEF int64_t zero_engine_step_count(const zero_engine *e);

/* The info of the last completed step (all zero before the first), waiting for it when it
   was enqueued with async_step and info NULL. Errors: INVALID_ARGUMENT (NULL), the
   device's (engine broken). */
ZERODEF zero_result zero_engine_last_step(zero_engine *e, zero_step_info *info);

/* delayed_update (docs/offload.md, "Delayed parameter update"): waits for the pending delayed
   update and publishes its params, so the next forward (or an export, an evaluation) sees
   every update taken so far. COLLECTIVE (stages 1-2 and persistent groups all-gather the
   published shards). Call it between zero_engine_step and the next micro-step (INVALID_STATE
   otherwise, or while a group is gathered). Without delayed_update, or with nothing pending:
   ZERO_OK, nothing done. Training may go on after it: the next delayed update is published
   at the end of the step after it, as always. */
ZERODEF zero_result zero_engine_finish_update(zero_engine *e);

/* Changes the learning rate from the next step on (schedules). lr = 0 sets 0 (the params
   stop moving; weight decay too): unlike zero_adam_desc.lr, where 0 means the default 1e-3.
   INVALID_ARGUMENT for a negative or non-finite lr. */
ZERODEF zero_result zero_engine_set_lr(zero_engine *e, double lr);

/* Per-tensor hyper-parameters (PyTorch's parameter groups). From the next step on, tensor
   'tensor' trains with the learning rate lr * lr_mul (lr: the engine's, as zero_engine_set_lr
   leaves it; lr_mul finite and >= 0, 0 = the tensor does not move) and its own weight decay
   (finite and >= 0; ZERO_WEIGHT_DECAY_DEFAULT = the engine's zero_adam_desc.weight_decay, 0
   for a ZERO_TENSOR_NO_DECAY tensor; an explicit value overrides the flag). AdamW decays by
   lr * lr_mul * weight_decay, as torch.optim.AdamW does with a group's own lr and
   weight_decay. Every rank must set the same values (they are not exchanged). The step makes
   one set of Adam constants per tensor and the fused kernels (host and CUDA) apply them in
   their one pass. Saved in checkpoints and restored by zero_engine_load. After commit, between
   steps or within one (the next step uses them). Errors: INVALID_STATE before commit;
   NOT_FOUND for an unknown tensor; INVALID_ARGUMENT for a value out of range (nothing
   changes). Defaults: lr_mul 1, weight decay ZERO_WEIGHT_DECAY_DEFAULT. */
#define ZERO_WEIGHT_DECAY_DEFAULT (-1.0)
ZERODEF zero_result zero_engine_set_tensor_hparams(zero_engine *e, int tensor, double lr_mul,
                                                   double weight_decay);

/* Tensor 'tensor''s lr multiplier and the weight decay it trains with (resolved: the
   engine's default or 0 where it applies; either pointer may be NULL). INVALID_STATE before
   commit, NOT_FOUND for an unknown tensor. */
ZERODEF zero_result zero_engine_tensor_hparams(const zero_engine *e, int tensor, double *lr_mul,
                                               double *weight_decay);

/* COLLECTIVE (every rank, same count, dtype and op, at the same point of the program).
   All-reduces 'count' values of the user's in host memory 'buf' in place, through the
   engine's comm: e.g. each rank's loss, summed for the log. dtype ZERO_F32 or ZERO_F64, op
   ZERO_OP_SUM or ZERO_OP_MAX; the local comm sums in rank order (the same bits on every
   rank). Each call is tagged ZERO_ROLE_USER, so a rank that calls it where another rank
   calls one of the engine's own collectives fails with ZERO_ERROR_MISMATCH instead of
   exchanging the wrong data (or hanging), and so do ranks that pass different counts, dtypes
   or ops (each 64-byte piece's tag carries the whole count; count 0 is one empty
   collective), on every comm that compares tags (local, CUDA device, MPI; not NCCL:
   docs/backends.md); its traffic is counted under ZERO_COLL_USER,
   apart from the engine's. It goes through the engine's 64-byte device scratch, one
   collective per 64 bytes, so it is meant for a few values. Call it between engine calls
   (after commit; any time in a step, not between a group's grads and grads_ready unless
   every rank does the same). Errors: INVALID_ARGUMENT (NULL buf with count > 0, another
   dtype or op), INVALID_STATE (before commit, engine broken); COMM/DEVICE/MISMATCH (the
   engine is broken, as after any failed collective). */
ZERODEF zero_result zero_engine_allreduce(zero_engine *e, void *buf, size_t count, zero_dtype dtype,
                                          zero_op op);

/* Device bytes held by this rank's engine, by category, now and at peak. */
ZERODEF zero_result zero_engine_memory_usage(const zero_engine *e, zero_engine_memory *out);

/* Bytes this rank's engine holds on one tier, by category, now and at peak (since commit);
   'allocations' counts the tier's buffers (files on NVME). ZERO_TIER_DEVICE gives what
   zero_engine_memory_usage gives. Host tier: the offloaded fp32 master, m, v
   (ZERO_MEM_MASTER/MOMENT1/MOMENT2), offloaded param shards (ZERO_MEM_PARAM), the reduced
   gradients (ZERO_MEM_GRAD: the shard, or with offload_gradients = nvme only its staging)
   and the staging buffers of the step (gradient tiles under ZERO_MEM_GRAD, param tiles
   under ZERO_MEM_PARAM, all declared in docs/offload.md). NVMe tier: the files (the
   gradient file's S elements of the comm dtype under ZERO_MEM_GRAD, each file's alignment
   under ZERO_MEM_SCRATCH). INVALID_ARGUMENT for NULL or a tier out of range. */
ZERODEF zero_result zero_engine_memory_tier(const zero_engine *e, zero_mem_tier tier,
                                            zero_engine_memory *out);

/* The I/O counters of the NVMe tier of the model states (offload_optimizer, offload_param
   or offload_gradients = NVME; the activation tier has its own): zero_io_get_stats() of
   the engine's I/O engine since commit, so bytes_read / bytes_written show what a step, a
   checkpoint or set_tensor moved. All zero (and ZERO_OK) without an NVMe tier. INVALID_ARGUMENT: NULL. */
ZERODEF zero_result zero_engine_nvme_stats(const zero_engine *e, zero_io_stats *out);

/* ---- Engine: moving the model states off the device between training phases ----------
   (DeepSpeed's offload_states / reload_states; docs/offload.md "Between phases".) */

/* zero_engine_offload_states' 'what': any OR of these. */
typedef enum zero_states_mask {
    ZERO_STATES_PARAMS = 1, /* the device's params (ZERO_MEM_PARAM: whole at stages 0-2; at
                               stage 3 the shards and the persistent groups)              */
    ZERO_STATES_GRADS = 2,  /* the device's gradient buffers (ZERO_MEM_GRAD: the user
                               gradients of stages 0-1, the accumulator, and with
                               offload_optimizer_ratio < 1 the device part's gradients)  */
    ZERO_STATES_MASTER = 4, /* fp32 master weights on the device (ZERO_MEM_MASTER)       */
    ZERO_STATES_M = 8,      /* Adam's m on the device (ZERO_MEM_MOMENT1)                 */
    ZERO_STATES_V = 16,     /* Adam's v on the device (ZERO_MEM_MOMENT2)                 */
    ZERO_STATES_ALL = 31
} zero_states_mask;

/* Local (no collective). Between steps, moves the device's copies of the states in 'what'
   to host memory (tier = ZERO_OFFLOAD_CPU: plain memory from the engine's allocator) or to
   a file under nvme_path (ZERO_OFFLOAD_NVME), and frees their device memory: the device
   tier's bytes (zero_engine_memory_usage) drop by exactly the bytes of those categories'
   device buffers, which the host or NVMe tier then reports under the same categories.
   States already off the device (offload_optimizer, offload_param) stay where they are;
   the gather arena, the reduce bucket and the scratch stay on the device. Until
   zero_engine_reload_states every call that reads or writes the engine's state returns
   INVALID_STATE (queries of memory, traffic and settings still answer; destroy frees
   everything). On the CUDA device the freed blocks return to the device's reserve, where
   any later allocation of that zero_device can take them.
   Errors (nothing changes): INVALID_STATE when the engine is not committed or is broken,
   states are offloaded already (a second call; reload first), a group is gathered
   (release it), a gradient buffer is handed out or a micro-step is under way (call it
   between zero_engine_step and the next micro-step); INVALID_ARGUMENT for what = 0 or
   unknown bits, tier not CPU or NVME, NVME without nvme_path; OUT_OF_MEMORY, IO. */
ZERODEF zero_result zero_engine_offload_states(zero_engine *e, unsigned what,
                                               zero_offload_device tier);

/* Local. Brings back what zero_engine_offload_states moved: device buffers of the same
   sizes, the same bits, and training goes on as if nothing had happened. Nothing
   offloaded: ZERO_OK, nothing done. On failure (OUT_OF_MEMORY on the device, IO) the
   states stay offloaded and the call may be retried. */
ZERODEF zero_result zero_engine_reload_states(zero_engine *e);

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

/* ---- Engine: activation offload (ZeRO-R's activation offload, ZeRO-Infinity's activation
   tier). docs/offload.md "Activations". ------------------------------------------------- */
/* With activation checkpointing a model keeps only each block's input through the forward
   and recomputes the block in the backward. These calls park such a checkpoint outside the
   device after the forward and bring it back before the backward:

       forward, block l:   ... x[l+1] = block(l, x[l]) ...
                           zero_engine_stash(e, l, x[l], bytes)    x[l] leaves the device
       backward, block l:  zero_engine_fetch(e, l, buf, bytes)     x[l] comes back into buf
                           recompute block l from buf, then its backward

   The tier is offload_activations in the descriptor: CPU keeps the bytes in a host arena of
   activation_host_bytes; NVME in a file of activation_nvme_bytes under nvme_path (created at
   commit with zero_io_file_create, removed at destroy), through activation_host_bytes of host
   staging. Both are allocated at commit; the calls allocate no memory (except the small key
   table, which grows with the number of distinct keys). Everything is local to the rank: no
   collective, and ranks may stash different keys and sizes.

   KEYS. Any int. A key holds one buffer from its stash until its fetch (or drop); it can then
   be stashed again (the next micro-step reuses the same keys).

   QUEUES AND BUFFERS (the contract).
   - stash: the copy reads device_src on ZERO_QUEUE_OFFLOAD after the work enqueued on
     ZERO_QUEUE_COMPUTE before the call, which does not wait for it. device_src must not be
     written or freed until that copy is done: compute-queue work enqueued after a later
     zero_engine_stash_fence() or zero_engine_fetch() (both make COMPUTE wait, on the device,
     for every stash copy enqueued so far) may overwrite it, and so may the host once it has
     synchronised the compute queue after such a call. On the host device every copy is done
     when the call returns.
   - fetch: device_dst receives the bytes on ZERO_QUEUE_OFFLOAD after the work enqueued on
     COMPUTE before the call (so device_dst may still be in use by it), and COMPUTE waits for
     them: compute-queue work enqueued after the call reads them. The host blocks only for an
     NVMe read that has not finished, never for the device copy.
   - NVMe: a stash's bytes reach host staging by the device copy; the next stash or fetch
     syncs the offload queue on the host and queues the file write (so the host runs at most
     one stash ahead of the device's copies; likewise a fetch waits for the previous fetch's
     copy before its staging is reused). Writes finish in the background; staging is given
     back oldest first when a stash needs room. A fetch serves the bytes from staging when
     they are still there (the last blocks of the forward are the first of the backward;
     such a key is never written), and then reads the next key in reverse stash order, the
     live key stashed last, into free staging ahead of its fetch (one prefetch in flight).

   ACCOUNTING. zero_engine_memory_tier() counts the arena (CPU) or the staging (NVME) in the
   host tier and the file in the NVMe tier, under ZERO_MEM_ACTIVATION, constant from commit to
   destroy; nothing on the device (the buffers are the caller's). zero_engine_activation_stats()
   reports what is stashed now, at peak, and how each fetch was served.

   ERRORS. INVALID_STATE: no activation tier configured, before commit, a broken engine, a key
   already stashed (fetch or drop it first), a key already fetched (each stash is fetched
   once; the tier remembers fetched and dropped keys while they number at most the live
   ones plus 16, so a key fetched long before is NOT_FOUND instead). NOT_FOUND: a key never
   stashed, or dropped. Keys are found in O(1) on average, and the key table holds at most
   about four entries per live key (it shrinks when keys are fetched). INVALID_ARGUMENT:
   NULL buffer, bytes 0, a fetch whose bytes differ from the stash's, a stash larger than
   the staging (NVME). OUT_OF_MEMORY: the tier is full (the message names the bytes asked, in use and the setting). IO: a write
   or read of the file failed (the message names the file, offset and cause): a failed write
   is reported by the fetch of its key, which then forgets the key; a failed read leaves the
   key stashed (fetch may be tried again). DEVICE: a copy failed (the engine is broken). A
   failed call changes nothing else; no call waits for another rank, so none can hang. */

/* What zero_engine_activation_stats() reports. Byte counts are the callers' (not rounded). */
typedef struct zero_activation_stats {
    size_t live_bytes;       /* stashed and not yet fetched or dropped                       */
    size_t peak_live_bytes;  /* most live at once since commit                               */
    int live_keys;           /* keys stashed now                                             */
    uint64_t stashes;        /* zero_engine_stash calls that succeeded                       */
    uint64_t fetches;        /* zero_engine_fetch calls that succeeded                       */
    uint64_t bytes_stashed;  /* sum over stashes                                             */
    uint64_t bytes_fetched;  /* sum over fetches                                             */
    /* NVME: how each fetch found its bytes (they sum to fetches); all 0 on CPU */
    uint64_t staging_hits;   /* still in host staging from the stash (no read)               */
    uint64_t prefetch_hits;  /* read ahead by a prefetch                                     */
    uint64_t demand_reads;   /* read by the fetch itself                                     */
    uint64_t prefetches;     /* reads started ahead of a fetch (a dropped one counts too)    */
    uint64_t nvme_bytes_written; /* to the file, rounded to ZERO_IO_ALIGN per stash          */
    uint64_t nvme_bytes_read;
} zero_activation_stats;

/* Parks 'bytes' bytes of device memory under 'key' in the activation tier: enqueues the copy
   and returns (the contract above). Local. Errors above; on error nothing was enqueued and
   the key is as it was. */
ZERODEF zero_result zero_engine_stash(zero_engine *e, int key, const void *device_src,
                                      size_t bytes);

/* Makes ZERO_QUEUE_COMPUTE wait (on the device; the host does not block) for every stash
   copy enqueued so far, so that compute work enqueued after it may overwrite their source
   buffers. Local. INVALID_STATE without a tier, before commit or on a broken engine. */
ZERODEF zero_result zero_engine_stash_fence(zero_engine *e);

/* Brings key's bytes back into device_dst (bytes must equal the stash's); the key is then
   free for a new stash (a second fetch is INVALID_STATE). Then starts the prefetch of the
   next key in reverse stash order (NVME). Also a stash fence. Local. Errors above. */
ZERODEF zero_result zero_engine_fetch(zero_engine *e, int key, void *device_dst, size_t bytes);

/* Forgets a stashed key without fetching it (an evaluation forward, an aborted step),
   waiting for its transfers. NOT_FOUND for a key not stashed now. Local. */
ZERODEF zero_result zero_engine_stash_drop(zero_engine *e, int key);

/* Drops every stashed key. Local. INVALID_STATE without a tier or before commit. */
ZERODEF zero_result zero_engine_stash_clear(zero_engine *e);

/* The activation tier's use and counters (all zero without a tier). INVALID_ARGUMENT for
   NULL. */
ZERODEF zero_result zero_engine_activation_stats(const zero_engine *e, zero_activation_stats *out);

/* ======================================================================================
   Checkpoints: sharded, crash-safe, checksummed save and load of an engine's state, a
   reader for checkpoint directories (consolidation, resharding), safetensors in and out.
   ====================================================================================== */
/* Checkpoint declarations. The byte format is in docs/checkpoint.md.

   A checkpoint is a directory holding one shard file per rank of the saving run
   (zero-<generation, 16 hex digits>-<rank, 5 digits>.shard: that rank's shard of every
   group's fp32 master, m, v and params) and a manifest (zero.manifest: the plan, the step,
   the Adam settings, the loss-scaler state, every shard file's size and header checksum).
   Every file is written under a new temporary name (a random suffix, created with O_EXCL |
   O_NOFOLLOW: a planted file or symlink is never written through), fsynced, renamed and its
   directory fsynced;
   the manifest is written last and is the commit point: a crash at any moment leaves the
   previous checkpoint in the directory loadable, or the new one complete. Older
   generations are removed after the new manifest is in place. Every file carries CRC32C
   checksums (header, and each section) and its sizes. The ranks must see one directory
   (one machine, or a shared file system). */

#define ZERO_TENSOR_MAX_DIMS 8

/* Like zero_engine_add_tensor(), with a shape (ndim 1..ZERO_TENSOR_MAX_DIMS, every dim
   > 0; numel = their product) that checkpoints and safetensors exports carry. Tensors
   added without a shape are exported as [numel]. Errors: those of add_tensor;
   INVALID_ARGUMENT for a bad ndim, a zero dim or NULL dims; OVERFLOW. */
ZERODEF zero_result zero_engine_add_tensor_shape(zero_engine *e, const char *name, int ndim,
                                                 const uint64_t *dims, int group,
                                                 unsigned flags, int *out_tensor);
/* A tensor's shape: *ndim = 0 when it was added without one. */
ZERODEF zero_result zero_engine_tensor_shape(const zero_engine *e, int tensor, int *ndim,
                                             uint64_t dims[ZERO_TENSOR_MAX_DIMS]);
/* A copy of the engine's loss-scaler state (the whole struct). */
ZERODEF zero_result zero_engine_scaler_state(const zero_engine *e, zero_scaler *out);

/* CRC32C (Castagnoli, reflected, as in iSCSI/ext4): pass 0 first, then the previous
   result to continue over more bytes. Uses SSE4.2 where the CPU has it (same result). */
ZERODEF uint32_t zero_crc32c(uint32_t crc, const void *data, size_t bytes);
/* The CRC32C of the concatenation A B from crc_a = zero_crc32c(0, A, |A|), crc_b =
   zero_crc32c(0, B, |B|) and bytes_b = |B|, without the bytes: what lets pieces of a range
   be summed apart (in any order, on any thread) and joined. O(log bytes_b). */
ZERODEF uint32_t zero_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b);

/* COLLECTIVE. Saves the engine's state to directory dir (created if missing; every rank
   passes the same path): each rank writes its own shard file; rank 0 then writes the
   manifest. Call between steps (not between micro-steps). Every rank returns the same
   result: a failure on any rank (I/O, a full disk) fails every rank's call with that
   rank's message, and every rank removes the files it wrote for this save; the engine is
   unchanged either way and the previous checkpoint in dir stays loadable. Rank 0 holds
   dir/zero.lock for the whole save: a save into a directory that another live save holds
   fails at once with IO "another save is in progress in DIR (pid P, host H)". The lock's
   flock alone decides: held = live, whatever pid it names (another PID namespace or host);
   free = stale (its holder died, kill -9 included), even empty or unreadable, and taken
   over (docs/checkpoint.md). The
   generation is a 64-bit integer (after 2^64 - 1 it wraps to the lowest one no file of dir
   names). A manifest in dir that is not a regular file (a FIFO) is IO, never opened.
   Errors: INVALID_ARGUMENT (dir NULL, empty or >= 4000 bytes) and
   INVALID_STATE (before commit, mid-step) return at once without communicating (SPMD
   programs make them on every rank alike); IO, OUT_OF_MEMORY; COMM/DEVICE (engine broken).
   The shard file is written with O_DIRECT where the file system takes it (buffered where
   it refuses O_DIRECT; the same bytes either way: docs/checkpoint.md). Host memory: four
   4 MiB staging buffers and a few 4 KiB blocks (the header's, where sections meet) with
   O_DIRECT, one 4 MiB buffer buffered; from the engine's allocator, freed on return. */
ZERODEF zero_result zero_engine_save(zero_engine *e, const char *dir);

/* COLLECTIVE. zero_engine_save() plus the caller's own state (DeepSpeed's client_state:
   data-loader position, RNG state, epoch, anything a resume needs): rank 0's client_bytes
   bytes at client are saved with the checkpoint, in a file of their own whose size and
   CRC32C the manifest records (docs/checkpoint.md); the other ranks' client arguments are
   ignored (they may pass NULL, 0). client_bytes 0 saves none (zero_engine_save() is that
   case). The bytes are copied as they are: encode them portably if other machines load
   them. Errors: those of zero_engine_save(); INVALID_ARGUMENT on every rank when rank 0
   passes client NULL with client_bytes > 0. */
ZERODEF zero_result zero_engine_save_client(zero_engine *e, const char *dir, const void *client,
                                            size_t client_bytes);

/* COLLECTIVE. Loads a checkpoint saved by zero_engine_save() at any world size and stage
   into this committed engine: master, m, v, params, step, Adam settings and scaler state.
   The engine's tensors must match the checkpoint's by name, size, flags and shape (where
   both recorded one; in any grouping), and the param dtype must be the same. Every rank
   opens the manifest and the ranks agree on its identity (generation and checksum): ranks
   given different directories, or opening it before and after a concurrent save's commit,
   get MISMATCH on every rank. Every rank then reads and verifies everything it needs
   (manifest, file sizes, header and section checksums, the plan) and the ranks agree; only
   then is state changed. A manifest or shard file that is not a regular file (a FIFO, a
   device) is IO, never read; a shard file without read permission is IO "permission
   denied". On error every rank returns the same code
   and message (naming the file, tensor or byte offset) and the engine is unchanged.
   Writing the state can fail too (an offload tier's I/O error: the NVMe tier's EIO, a
   device error): the ranks agree on that as well, before the load's closing all-gathers,
   and every rank returns the failing rank's error with its engine broken (destroy only:
   the state was overwritten in part on that rank and cannot be restored), never OK on some
   ranks and never a wait for the comm's timeout. Call between steps with no group gathered. Host memory: with the saving layout (same
   world, groups, tensors) this rank's shard file is read whole (O_DIRECT where the file
   system takes it) into a buffer of its size and uploaded from; when resharding, this
   rank's new shard is staged; 12 + param bytes per shard element either way, from the
   engine's allocator, freed on return.
   Errors: INVALID_ARGUMENT and INVALID_STATE (mid-step, a group gathered) at once, as for
   save; NOT_FOUND (no checkpoint), IO (corrupt, truncated or missing file), MISMATCH (plan
   or dtype differs), OUT_OF_MEMORY; COMM/DEVICE (engine broken). */
ZERODEF zero_result zero_engine_load(zero_engine *e, const char *dir);

/* COLLECTIVE. zero_engine_load() that also returns the client state saved by
   zero_engine_save_client(): every rank receives rank 0's bytes in client (capacity bytes
   there) and their count in *client_bytes (may be NULL). A checkpoint saved without client
   state, or by a version that had none, gives 0 bytes. The client state is read and its
   checksum checked with everything else before anything changes: a file that is missing,
   of another size or with a bad checksum is IO naming it. A capacity smaller than the
   saved state is INVALID_ARGUMENT on every rank with the engine and client unchanged and
   the needed size in *client_bytes (so client NULL, capacity 0 asks for the size).
   zero_checkpoint_info.client_bytes gives the size without an engine.
   zero_engine_load() is this call with client NULL, capacity 0 and client_bytes NULL; it
   ignores client state. Errors: those of zero_engine_load(). */
ZERODEF zero_result zero_engine_load_client(zero_engine *e, const char *dir, void *client,
                                            size_t capacity, size_t *client_bytes);

/* A checkpoint directory opened for reading without an engine (tools, export). */
typedef struct zero_checkpoint zero_checkpoint;

typedef struct zero_checkpoint_info {
    uint64_t generation;
    int world, stage;
    zero_dtype param_dtype;
    size_t align_numel;
    int num_groups, num_tensors;
    int64_t step;
    uint64_t plan_hash;   /* zero_plan_hash() of the saving run's plan                   */
    zero_adam_desc adam;  /* the saving engine's resolved Adam settings                  */
    zero_scaler scaler;   /* its loss-scaler state                                       */
    uint64_t total_bytes; /* manifest plus shard files (plus the client state file)      */
    uint64_t client_bytes; /* client state saved by zero_engine_save_client() (0: none)   */
    int update_pending;   /* 1: saved by a delayed_update engine with an update pending: the
                             master, m, v hold it, the params do not yet (docs/offload.md)   */
} zero_checkpoint_info;

typedef struct zero_checkpoint_tensor {
    const char *name; /* owned by the checkpoint */
    int group;
    unsigned flags;
    size_t numel;
    int ndim;         /* 0: registered without a shape */
    uint64_t dims[ZERO_TENSOR_MAX_DIMS];
    double lr_mul;       /* zero_engine_set_tensor_hparams (1 in checkpoints before them)  */
    double weight_decay; /* the tensor's own, or ZERO_WEIGHT_DECAY_DEFAULT                   */
} zero_checkpoint_tensor;

/* Opens dir and verifies its manifest (size, checksum, a consistent plan, every byte size
   computed without wrapping). Reads no shard file yet, and of the manifest first its fixed
   header: a file whose size differs from the one its header declares, or exceeds what its
   counts allow, is refused without reading the rest. Errors: NOT_FOUND (no manifest), IO
   (corrupt, or not a regular file), OUT_OF_MEMORY. *out NULL then. */
ZERODEF zero_result zero_checkpoint_open(const char *dir, zero_checkpoint **out);
ZERODEF void zero_checkpoint_close(zero_checkpoint *ck);
ZERODEF zero_result zero_checkpoint_get_info(const zero_checkpoint *ck, zero_checkpoint_info *out);
ZERODEF zero_result zero_checkpoint_get_tensor(const zero_checkpoint *ck, int tensor,
                                               zero_checkpoint_tensor *out);
/* Reads every shard file whole and checks its size, header and every section checksum.
   IO names the first bad file and byte range. */
ZERODEF zero_result zero_checkpoint_verify(zero_checkpoint *ck);
/* The whole of a tensor's saved state of one kind, consolidated from the shard files
   (verifying the checksums of every section it reads): dst holds numel elements, fp32 for
   MASTER/M/V, the param dtype for PARAM. */
ZERODEF zero_result zero_checkpoint_read_tensor(zero_checkpoint *ck, int tensor,
                                                zero_state_kind kind, void *dst);
/* The client state (zero_checkpoint_info.client_bytes bytes into dst; nothing when 0),
   its size and checksum checked: IO names the file otherwise. */
ZERODEF zero_result zero_checkpoint_read_client(zero_checkpoint *ck, void *dst);
/* Writes every tensor to one .safetensors file at path (a new temporary "path.<random>.tmp"
   created with O_EXCL | O_NOFOLLOW, fsync, rename over path): dtype F32 = the fp32 master
   weights; F16 / BF16 = the saved params when the checkpoint's param dtype is that, else
   the master rounded to nearest even. Names and shapes as registered; __metadata__ holds
   format "pt" and the step. INVALID_ARGUMENT for a path inside a checkpoint directory
   (ck's, or any holding a zero.manifest); OVERFLOW for sizes that do not fit. */
ZERODEF zero_result zero_checkpoint_export(zero_checkpoint *ck, const char *path,
                                           zero_dtype dtype);

/* COLLECTIVE (every rank calls it with the same file). Sets every engine tensor from the
   tensor of the same name in a .safetensors file (F32, F16 or BF16, converted to fp32 and
   set as by zero_engine_set_tensor: master and params; moments untouched). Tensors in the
   file but not in the engine are ignored. Every rank checks the whole header and
   allocates its buffers first, then the ranks agree: if any rank fails (NOT_FOUND names a
   missing tensor; MISMATCH a size or shape that differs; UNSUPPORTED another dtype; IO a
   malformed header, a short file, or a path that is not a regular file such as a FIFO,
   refused without blocking; OUT_OF_MEMORY), every rank returns that error (its
   message, "reported by rank k" on the others) and no rank has changed anything. Only a
   read or device error while setting, after the agreement, can leave a rank half set: its
   engine is then unusable (later calls say so). Call when zero_engine_set_tensor() may be
   called, between steps, with every group released. */
ZERODEF zero_result zero_engine_load_safetensors(zero_engine *e, const char *path);
/* COLLECTIVE. zero_engine_load_safetensors for a Hugging Face checkpoint (what
   from_pretrained reads): path is one .safetensors file, a sharded checkpoint's index (a
   JSON file such as model.safetensors.index.json whose "weight_map" maps every tensor to
   its shard, a file in the index's directory), or a directory holding model.safetensors or
   else model.safetensors.index.json. Each engine tensor is looked up by its name in every
   file; when prefix is not NULL and the name starts with it, then also by the rest of the
   name: the layout of a checkpoint saved from the base model (prefix "transformer." finds
   GPT2LMHeadModel's "transformer.h.0.ln_1.weight" in the hub's GPT2Model file as
   "h.0.ln_1.weight"). Every file is opened and its header checked before anything is set;
   errors and guarantees as zero_engine_load_safetensors's, plus IO naming a malformed index
   or a weight_map entry that is not a plain file name, NOT_FOUND for a missing shard. */
ZERODEF zero_result zero_engine_load_pretrained(zero_engine *e, const char *path, const char *prefix);

#ifdef __cplusplus
}
#endif

#endif /* ZERO_H */

/* ======================================================================================
   IMPLEMENTATION
   ====================================================================================== */
#if defined(ZERO_IMPLEMENTATION) && !defined(ZERO_IMPLEMENTATION_DONE)
#define ZERO_IMPLEMENTATION_DONE

/* -ffast-math lets the compiler reassociate sums, use reciprocal approximations and flush
   subnormals to zero: the Adam step, the conversions and the reductions would no longer
   give the bits docs/optimizer.md promises (the same on every path and stage). The user's
   own files may use it; the file that defines ZERO_IMPLEMENTATION may not. */
#if defined(__FAST_MATH__)
#error "zero.h: compile the file that defines ZERO_IMPLEMENTATION without -ffast-math (docs/optimizer.md)"
#endif

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ZERO_STATIC) && defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wunused-function" /* a TU may use only part of the API */
#endif

#if defined(__cplusplus) && __cplusplus >= 201103L
#define ZERO__THREAD_LOCAL thread_local
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_THREADS__)
#define ZERO__THREAD_LOCAL _Thread_local
#elif defined(_MSC_VER)
#define ZERO__THREAD_LOCAL __declspec(thread)
#else
#define ZERO__THREAD_LOCAL __thread
#endif

/* ---- results ---- */

static ZERO__THREAD_LOCAL char zero__error_text[512];

ZERODEF const char *zero_result_string(zero_result result)
{
    switch (result) {
    case ZERO_OK: return "ok";
    case ZERO_ERROR_INVALID_ARGUMENT: return "invalid argument";
    case ZERO_ERROR_OUT_OF_MEMORY: return "out of memory";
    case ZERO_ERROR_INVALID_STATE: return "invalid state";
    case ZERO_ERROR_NOT_FOUND: return "not found";
    case ZERO_ERROR_OVERFLOW: return "size overflow";
    case ZERO_ERROR_MISMATCH: return "mismatch (ranks, or a file and the engine, disagree)";
    case ZERO_ERROR_DEVICE: return "device error";
    case ZERO_ERROR_COMM: return "communication error";
    case ZERO_ERROR_TIMEOUT: return "timeout";
    case ZERO_ERROR_IO: return "i/o error";
    case ZERO_ERROR_UNSUPPORTED: return "unsupported";
    case ZERO_ERROR_LOSS_SCALE: return "overflow at the minimum loss scale";
    }
    return "unknown result";
}

ZERODEF const char *zero_last_error(void) { return zero__error_text; }

ZERODEF void zero_clear_error(void) { zero__error_text[0] = '\0'; }

/* Records the detail of an error for zero_last_error() and returns 'result', so that
   error paths read: return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "world = %d", w); */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static zero_result zero__fail(zero_result result, const char *fmt, ...)
{
    /* formatted aside first: an argument may be zero_last_error() itself */
    char text[sizeof zero__error_text];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    memcpy(zero__error_text, text, sizeof text);
    return result;
}

/* ---- memory ---- */

#ifndef ZERO_MALLOC
#define ZERO_MALLOC(sz) malloc(sz)
#define ZERO_FREE(p) free(p)
#define ZERO__LIBC_MALLOC 1
#endif

/* Allocates through 'a' when it has hooks, else ZERO_MALLOC. NULL on failure or 0 bytes. */
static void *zero__alloc(const zero_allocator *a, size_t bytes)
{
    if (bytes == 0) return NULL;
    if (a && a->alloc) return a->alloc(bytes, a->user);
    return ZERO_MALLOC(bytes);
}

/* zero__alloc's bytes, zeroed: by calloc with the C library's allocator (its large blocks
   are fresh pages the kernel zeroes when first touched, so gigabytes of host tier cost
   nothing until used), else written. */
static void *zero__alloc_zeroed(const zero_allocator *a, size_t bytes)
{
    void *p;
    if (bytes == 0) return NULL;
#ifdef ZERO__LIBC_MALLOC
    if (!(a && a->alloc)) return calloc(1, bytes);
#endif
    p = zero__alloc(a, bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

static void zero__free(const zero_allocator *a, void *ptr)
{
    if (!ptr) return;
    if (a && a->alloc) {
        if (a->free) a->free(ptr, a->user);
        return;
    }
    ZERO_FREE(ptr);
}

/* n * size without overflow: returns 0 and sets *out, or -1 on overflow. */
static int zero__mul_size(size_t n, size_t size, size_t *out)
{
    if (size != 0 && n > (size_t)-1 / size) return -1;
    *out = n * size;
    return 0;
}

static int zero__add_size(size_t a, size_t b, size_t *out)
{
    if (a > (size_t)-1 - b) return -1;
    *out = a + b;
    return 0;
}

ZERODEF size_t zero_dtype_size(zero_dtype dtype)
{
    switch (dtype) {
    case ZERO_F32: return 4;
    case ZERO_F16: return 2;
    case ZERO_BF16: return 2;
    case ZERO_F64: return 8;
    case ZERO_DTYPE_DEFAULT: break;
    }
    return 0;
}

ZERODEF const char *zero_dtype_name(zero_dtype dtype)
{
    switch (dtype) {
    case ZERO_F32: return "f32";
    case ZERO_F16: return "f16";
    case ZERO_BF16: return "bf16";
    case ZERO_F64: return "f64";
    case ZERO_DTYPE_DEFAULT: break;
    }
    return "?";
}

ZERODEF const char *zero_mem_category_name(zero_mem_category category)
{
    static const char *names[ZERO_MEM_COUNT] = {"param", "grad", "master", "moment1",
                                                "moment2", "bucket", "gather", "scratch",
                                                "activation"};
    if ((int)category < 0 || category >= ZERO_MEM_COUNT) return "?";
    return names[category];
}

/* Conversion implementation: SIMD detection, scalar fp32 <-> fp16 /
   bf16 / fp64 in integer arithmetic, and the bulk zero_convert() with its AVX2 / AVX-512
   paths. The x86 helpers below (zero__*x8_*_avx2, zero__*x16_*_avx512) are shared with the
   other host kernels (adam_impl.h), so that every kernel rounds exactly as the scalar
   functions do. */

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(ZERO_NO_SIMD)
#define ZERO__X86_SIMD 1
#ifdef __cplusplus
extern "C++" {
#endif
#include <cpuid.h>
#include <immintrin.h>
#ifdef __cplusplus
}
#endif
#endif

/* ---- bits <-> values (memcpy: no aliasing UB; compilers turn it into a move) ---- */

static inline uint32_t zero__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float zero__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- scalar conversions on bit patterns (ZERO_HOSTDEV: zero_cuda.h's kernels call them) ---- */

/* fp32 -> fp16, round to nearest even. */
static inline ZERO_HOSTDEV uint16_t zero__f32_to_f16_bits(uint32_t x)
{
    uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top 9 payload bits kept (vcvtps2ph) */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 = halfway from 65504 to 2^16 (tie to even: inf) */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* >= 2^-14: a normal fp16; rebias 127 -> 15, round 13 bits */
        uint32_t r = a - 0x38000000u;
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13)); /* a carry moves into the exponent correctly */
    }
    if (a <= 0x33000000u) /* <= 2^-25, half the smallest subnormal: ties to even give 0 */
        return (uint16_t)sign;
    {
        /* subnormal fp16: the value in units of 2^-24 is m * 2^(e - 126) */
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++; /* q = 0x400 is the least normal */
        return (uint16_t)(sign | q);
    }
}

/* fp16 -> fp32, exact; a NaN becomes quiet. */
static inline ZERO_HOSTDEV uint32_t zero__f16_to_f32_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u);
    if (e == 0) {
        if (m == 0) return sign;
        e = 113; /* normalise the subnormal: value m * 2^-24 */
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        return sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    return sign | ((e + 112u) << 23) | (m << 13);
}

/* fp32 -> bf16, round to nearest even (a carry into the exponent is the right answer,
   including the overflow to inf). */
static inline ZERO_HOSTDEV uint16_t zero__f32_to_bf16_bits(uint32_t x)
{
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

/* bf16 -> fp32, exact; a NaN becomes quiet. */
static inline ZERO_HOSTDEV uint32_t zero__bf16_to_f32_bits(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u;
    return x;
}

/* fp32 -> fp64 bits, exact; a NaN becomes quiet. */
static inline ZERO_HOSTDEV uint64_t zero__f32_to_f64_bits(uint32_t x)
{
    uint64_t sign = (uint64_t)(x >> 31) << 63;
    uint32_t e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e == 0xff)
        return sign | 0x7ff0000000000000ull | (m ? 0x8000000000000ull | ((uint64_t)m << 29) : 0u);
    if (e == 0) {
        if (m == 0) return sign;
        e = 1;
        while (!(m & 0x800000u)) {
            m <<= 1;
            e--; /* may wrap below zero: the unsigned sum below still gives the exponent */
        }
        m &= 0x7fffffu;
    }
    return sign | ((uint64_t)(e + 896u) << 52) | ((uint64_t)m << 29);
}

/* fp64 -> a binary format with ebits exponent and mbits mantissa bits (fp32: 8/23,
   fp16: 5/10, bf16: 8/7), rounded once to nearest even. NaN: quiet, top payload kept. */
static inline ZERO_HOSTDEV uint32_t zero__f64_narrow_bits(uint64_t x, unsigned ebits, unsigned mbits)
{
    uint32_t sign = (uint32_t)(x >> 63) << (ebits + mbits);
    uint64_t a = x & 0x7fffffffffffffffull, m;
    uint32_t emax = (1u << ebits) - 1u, inf = sign | (emax << mbits);
    int te;
    unsigned shift;
    if (a > 0x7ff0000000000000ull)
        return inf | (1u << (mbits - 1)) | (uint32_t)((a & 0xfffffffffffffull) >> (52 - mbits));
    if (a == 0x7ff0000000000000ull) return inf;
    if ((a >> 52) == 0) return sign; /* fp64 subnormals are far below half of any target's */
    m = (a & 0xfffffffffffffull) | 0x10000000000000ull; /* value m * 2^(e - 1075) */
    te = (int)(a >> 52) - 1023 + (int)(emax >> 1);      /* the target's biased exponent */
    if (te >= (int)emax) return inf;
    shift = 52u - mbits;
    if (te < 1) {
        shift += (unsigned)(1 - te); /* to units of the target's least subnormal */
        if (shift > 53u) return sign; /* m < 2^53 <= half a unit: rounds to 0 */
        te = 1;
    }
    {
        uint64_t q = m >> shift, rem = m & ((1ull << shift) - 1u), half = 1ull << (shift - 1);
        uint64_t r;
        if (rem > half || (rem == half && (q & 1u))) q++;
        /* normal: q holds the implicit bit, so (te - 1) << mbits + q is the encoding and a
           carry moves into the exponent; subnormal: q itself (te = 1 -> 0 << mbits). */
        if (shift > 52u - mbits) r = q;
        else r = ((uint64_t)(te - 1) << mbits) + q;
        if (r >= ((uint64_t)emax << mbits)) return inf;
        return sign | (uint32_t)r;
    }
}

ZERODEF uint16_t zero_f32_to_f16(float value) { return zero__f32_to_f16_bits(zero__f32_bits(value)); }
ZERODEF float zero_f16_to_f32(uint16_t bits) { return zero__f32_from_bits(zero__f16_to_f32_bits(bits)); }
ZERODEF uint16_t zero_f32_to_bf16(float value) { return zero__f32_to_bf16_bits(zero__f32_bits(value)); }
ZERODEF float zero_bf16_to_f32(uint16_t bits) { return zero__f32_from_bits(zero__bf16_to_f32_bits(bits)); }

/* ---- SIMD detection ---- */

ZERODEF const char *zero_simd_name(zero_simd simd)
{
    switch (simd) {
    case ZERO_SIMD_AUTO: return "auto";
    case ZERO_SIMD_PORTABLE: return "portable";
    case ZERO_SIMD_AVX2: return "avx2";
    case ZERO_SIMD_AVX512: return "avx512";
    }
    return "?";
}

/* The best path the CPU and the build support, ignoring ZERO_SIMD. CPUID once; the cache
   is an int written with the same value by any racing thread (atomic builtins, no UB). */
static zero_simd zero__simd_cpu(void)
{
#ifdef ZERO__X86_SIMD
    static int cached; /* 0 = not yet known */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v == 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        int f16c;
        __builtin_cpu_init();
        /* F16C: CPUID.1:ECX bit 29 (clang's __builtin_cpu_supports lacks "f16c"); it needs
           the OS's AVX state, which the avx2 check below already requires. */
        f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
        v = ZERO_SIMD_PORTABLE;
        if (f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
            v = ZERO_SIMD_AVX2;
            if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
                v = ZERO_SIMD_AVX512;
        }
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return (zero_simd)v;
#else
    return ZERO_SIMD_PORTABLE;
#endif
}

ZERODEF zero_simd zero_simd_detect(void)
{
    zero_simd cpu = zero__simd_cpu(), want = cpu;
    const char *env = getenv("ZERO_SIMD"); /* read each call: a test may change it */
    if (env) {
        if (strcmp(env, "portable") == 0) want = ZERO_SIMD_PORTABLE;
        else if (strcmp(env, "avx2") == 0) want = ZERO_SIMD_AVX2;
        else if (strcmp(env, "avx512") == 0) want = ZERO_SIMD_AVX512;
    }
    return want < cpu ? want : cpu;
}

/* ---- x86 vector helpers: bit-identical to the scalar functions, unaligned-safe ---- */

#ifdef ZERO__X86_SIMD

#define ZERO__AVX2 __attribute__((target("avx2,fma,f16c")))
#define ZERO__AVX512 __attribute__((target("avx512f,avx512bw,avx2,fma,f16c")))

/* The void-pointer forms let bulk loops pass byte-misaligned addresses without forming a
   misaligned uint16_t pointer. */
ZERO__AVX2 static inline __m256 zero__ld_f16x8_avx2(const void *src)
{
    /* vcvtph2ps is exact and quiets NaNs (sign | 0x7fc00000 | m << 13), as the scalar. */
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)src));
}

ZERO__AVX2 static inline __m256 zero__ld_bf16x8_avx2(const void *src)
{
    __m256i x = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)src)), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    x = _mm256_or_si256(x, _mm256_and_si256(nan, _mm256_set1_epi32(0x400000)));
    return _mm256_castsi256_ps(x);
}

ZERO__AVX2 static inline void zero__st_f16x8_avx2(void *dst, __m256 x)
{
    /* imm 0 = round to nearest even, not MXCSR; NaN: sign | 0x7e00 | m >> 13. */
    _mm_storeu_si128((__m128i *)dst, _mm256_cvtps_ph(x, 0));
}

ZERO__AVX2 static inline void zero__st_bf16x8_avx2(void *dst, __m256 x)
{
    /* RNE: add 0x7fff + the kept lsb, keep the high half; NaN (unordered with itself)
       keeps its bits with the quiet bit set. The high halves are gathered with one byte
       shuffle (bytes 2-3 of each element to the low 8 bytes of each lane) and one
       quadword permute: 7 operations and a 16-byte store a vector. */
    const __m256i take_high = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1,
                                               2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    __m256i b = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb);
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 q = _mm256_castsi256_ps(_mm256_or_si256(b, _mm256_set1_epi32(0x400000)));
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r), q, nan));
    r = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(r, take_high), 0x08); /* quadwords 0, 2 */
    _mm_storeu_si128((__m128i *)dst, _mm256_castsi256_si128(r));
}

/* The AVX-512 helpers use the zero-masking forms with a full mask (the same instructions):
   GCC 12's unmasked forms start from _mm512_undefined_*(), which g++ -O1 -Wall reports as
   maybe-uninitialized once inlined (GCC bug 105593). */
#define ZERO__ALL16 ((__mmask16)0xffff)

ZERO__AVX512 static inline __m512 zero__ld_f16x16_avx512(const void *src)
{
    return _mm512_maskz_cvtph_ps(ZERO__ALL16, _mm256_loadu_si256((const __m256i *)src));
}

ZERO__AVX512 static inline __m512 zero__ld_bf16x16_avx512(const void *src)
{
    __m512i x = _mm512_maskz_slli_epi32(
        ZERO__ALL16, _mm512_maskz_cvtepu16_epi32(ZERO__ALL16, _mm256_loadu_si256((const __m256i *)src)), 16);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    x = _mm512_mask_or_epi32(x, nan, x, _mm512_set1_epi32(0x400000));
    return _mm512_castsi512_ps(x);
}

ZERO__AVX512 static inline void zero__st_f16x16_avx512(void *dst, __m512 x)
{
    _mm256_storeu_si256((__m256i *)dst, _mm512_maskz_cvtps_ph(ZERO__ALL16, x, 0));
}

ZERO__AVX512 static inline void zero__st_bf16x16_avx512(void *dst, __m512 x)
{
    __m512i b = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_maskz_srli_epi32(ZERO__ALL16, b, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, b, _mm512_set1_epi32(0x400000));
    _mm256_storeu_si256((__m256i *)dst,
                        _mm512_maskz_cvtepi32_epi16(ZERO__ALL16, _mm512_maskz_srli_epi32(ZERO__ALL16, r, 16)));
}

/* The helpers other kernels use (fixed names and signatures). */
ZERO__AVX2 static inline __m256 zero__f16x8_to_f32_avx2(const uint16_t *src) { return zero__ld_f16x8_avx2(src); }
ZERO__AVX2 static inline __m256 zero__bf16x8_to_f32_avx2(const uint16_t *src) { return zero__ld_bf16x8_avx2(src); }
ZERO__AVX2 static inline void zero__f32_to_f16x8_avx2(uint16_t *dst, __m256 x) { zero__st_f16x8_avx2(dst, x); }
ZERO__AVX2 static inline void zero__f32_to_bf16x8_avx2(uint16_t *dst, __m256 x) { zero__st_bf16x8_avx2(dst, x); }
ZERO__AVX512 static inline __m512 zero__f16x16_to_f32_avx512(const uint16_t *src) { return zero__ld_f16x16_avx512(src); }
ZERO__AVX512 static inline __m512 zero__bf16x16_to_f32_avx512(const uint16_t *src) { return zero__ld_bf16x16_avx512(src); }
ZERO__AVX512 static inline void zero__f32_to_f16x16_avx512(uint16_t *dst, __m512 x) { zero__st_f16x16_avx512(dst, x); }
ZERO__AVX512 static inline void zero__f32_to_bf16x16_avx512(uint16_t *dst, __m512 x) { zero__st_bf16x16_avx512(dst, x); }

#endif /* ZERO__X86_SIMD */

/* ---- bulk kernels ---- */

/* An element of a 16-bit format as fp32 bits, and back (h: 0 = fp16, 1 = bf16). */
static inline uint32_t zero__h_to_f32_bits(uint16_t v, int bf)
{
    return bf ? zero__bf16_to_f32_bits(v) : zero__f16_to_f32_bits(v);
}
static inline uint16_t zero__f32_bits_to_h(uint32_t x, int bf)
{
    return bf ? zero__f32_to_bf16_bits(x) : zero__f32_to_f16_bits(x);
}

/* Reads element i of a byte array (any alignment) and writes element i. */
static inline uint16_t zero__ld16(const unsigned char *p, size_t i)
{
    uint16_t v;
    memcpy(&v, p + 2 * i, 2);
    return v;
}
static inline uint32_t zero__ld32(const unsigned char *p, size_t i)
{
    uint32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}
static inline void zero__st16(unsigned char *p, size_t i, uint16_t v) { memcpy(p + 2 * i, &v, 2); }
static inline void zero__st32(unsigned char *p, size_t i, uint32_t v) { memcpy(p + 4 * i, &v, 4); }

/* Elements [i, n) of the fp32 / fp16 / bf16 pairs, one by one (the portable path and every
   vector path's tail). kind: which pair, see zero__cvt_kind(). */
enum {
    ZERO__CVT_F32_F16, /* dst_src */
    ZERO__CVT_F32_BF16,
    ZERO__CVT_F16_F32,
    ZERO__CVT_BF16_F32,
    ZERO__CVT_F16_BF16,
    ZERO__CVT_BF16_F16
};

static void zero__cvt_scalar(int kind, unsigned char *d, const unsigned char *s, size_t i, size_t n)
{
    switch (kind) {
    case ZERO__CVT_F32_F16:
        for (; i < n; i++) zero__st32(d, i, zero__f16_to_f32_bits(zero__ld16(s, i)));
        break;
    case ZERO__CVT_F32_BF16:
        for (; i < n; i++) zero__st32(d, i, zero__bf16_to_f32_bits(zero__ld16(s, i)));
        break;
    case ZERO__CVT_F16_F32:
        for (; i < n; i++) zero__st16(d, i, zero__f32_to_f16_bits(zero__ld32(s, i)));
        break;
    case ZERO__CVT_BF16_F32:
        for (; i < n; i++) zero__st16(d, i, zero__f32_to_bf16_bits(zero__ld32(s, i)));
        break;
    case ZERO__CVT_F16_BF16:
        for (; i < n; i++) zero__st16(d, i, zero__f32_bits_to_h(zero__h_to_f32_bits(zero__ld16(s, i), 1), 0));
        break;
    case ZERO__CVT_BF16_F16:
        for (; i < n; i++) zero__st16(d, i, zero__f32_bits_to_h(zero__h_to_f32_bits(zero__ld16(s, i), 0), 1));
        break;
    }
}

#ifdef ZERO__X86_SIMD
/* One kernel per path; each body does two vectors per iteration (loads ahead of stores),
   then one, then the scalar tail. */
#define ZERO__CVT_BODY(W, LD_F32, ST_F32, LD_F16, ST_F16, LD_BF16, ST_BF16)                  \
    switch (kind) {                                                                          \
    case ZERO__CVT_F32_F16:                                                                  \
        for (; i + 2 * W <= n; i += 2 * W) {                                                 \
            ZERO__V a = LD_F16(s + 2 * i), b = LD_F16(s + 2 * (i + W));                      \
            ST_F32(d + 4 * i, a);                                                            \
            ST_F32(d + 4 * (i + W), b);                                                      \
        }                                                                                    \
        for (; i + W <= n; i += W) ST_F32(d + 4 * i, LD_F16(s + 2 * i));                     \
        break;                                                                               \
    case ZERO__CVT_F32_BF16:                                                                 \
        for (; i + 2 * W <= n; i += 2 * W) {                                                 \
            ZERO__V a = LD_BF16(s + 2 * i), b = LD_BF16(s + 2 * (i + W));                    \
            ST_F32(d + 4 * i, a);                                                            \
            ST_F32(d + 4 * (i + W), b);                                                      \
        }                                                                                    \
        for (; i + W <= n; i += W) ST_F32(d + 4 * i, LD_BF16(s + 2 * i));                    \
        break;                                                                               \
    case ZERO__CVT_F16_F32:                                                                  \
        for (; i + 2 * W <= n; i += 2 * W) {                                                 \
            ZERO__V a = LD_F32(s + 4 * i), b = LD_F32(s + 4 * (i + W));                      \
            ST_F16(d + 2 * i, a);                                                            \
            ST_F16(d + 2 * (i + W), b);                                                      \
        }                                                                                    \
        for (; i + W <= n; i += W) ST_F16(d + 2 * i, LD_F32(s + 4 * i));                     \
        break;                                                                               \
    case ZERO__CVT_BF16_F32:                                                                 \
        for (; i + 2 * W <= n; i += 2 * W) {                                                 \
            ZERO__V a = LD_F32(s + 4 * i), b = LD_F32(s + 4 * (i + W));                      \
            ST_BF16(d + 2 * i, a);                                                           \
            ST_BF16(d + 2 * (i + W), b);                                                     \
        }                                                                                    \
        for (; i + W <= n; i += W) ST_BF16(d + 2 * i, LD_F32(s + 4 * i));                    \
        break;                                                                               \
    case ZERO__CVT_F16_BF16:                                                                 \
        for (; i + W <= n; i += W) ST_F16(d + 2 * i, LD_BF16(s + 2 * i));                    \
        break;                                                                               \
    case ZERO__CVT_BF16_F16:                                                                 \
        for (; i + W <= n; i += W) ST_BF16(d + 2 * i, LD_F16(s + 2 * i));                    \
        break;                                                                               \
    }

#define ZERO__LD_F32_AVX2(p) _mm256_loadu_ps((const float *)(const void *)(p))
#define ZERO__ST_F32_AVX2(p, v) _mm256_storeu_ps((float *)(void *)(p), v)
#define ZERO__V __m256
ZERO__AVX2 static void zero__cvt_avx2(int kind, unsigned char *d, const unsigned char *s, size_t n)
{
    size_t i = 0;
    ZERO__CVT_BODY(8, ZERO__LD_F32_AVX2, ZERO__ST_F32_AVX2, zero__ld_f16x8_avx2, zero__st_f16x8_avx2,
                   zero__ld_bf16x8_avx2, zero__st_bf16x8_avx2)
    zero__cvt_scalar(kind, d, s, i, n);
}
#undef ZERO__V

#define ZERO__V __m512
ZERO__AVX512 static void zero__cvt_avx512(int kind, unsigned char *d, const unsigned char *s, size_t n)
{
    size_t i = 0;
    ZERO__CVT_BODY(16, _mm512_loadu_ps, _mm512_storeu_ps, zero__ld_f16x16_avx512, zero__st_f16x16_avx512,
                   zero__ld_bf16x16_avx512, zero__st_bf16x16_avx512)
    /* a remaining 8 with the AVX2 body, the rest one by one */
    zero__cvt_avx2(kind, d + (i * (kind <= ZERO__CVT_F32_BF16 ? 4 : 2)),
                   s + (i * (kind == ZERO__CVT_F16_F32 || kind == ZERO__CVT_BF16_F32 ? 4 : 2)), n - i);
}
#undef ZERO__V
#undef ZERO__CVT_BODY
#undef ZERO__LD_F32_AVX2
#undef ZERO__ST_F32_AVX2
#endif

/* fp64 <-> anything, one element at a time through fp64 / fp32 bits. */
static void zero__cvt_f64_pair(unsigned char *d, zero_dtype dt, const unsigned char *s,
                               zero_dtype st, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        if (st == ZERO_F64) {
            uint64_t x;
            memcpy(&x, s + 8 * i, 8);
            if (dt == ZERO_F32) zero__st32(d, i, zero__f64_narrow_bits(x, 8, 23));
            else if (dt == ZERO_F16) zero__st16(d, i, (uint16_t)zero__f64_narrow_bits(x, 5, 10));
            else zero__st16(d, i, (uint16_t)zero__f64_narrow_bits(x, 8, 7));
        } else {
            uint32_t f = st == ZERO_F32 ? zero__ld32(s, i) : zero__h_to_f32_bits(zero__ld16(s, i), st == ZERO_BF16);
            uint64_t x = zero__f32_to_f64_bits(f);
            memcpy(d + 8 * i, &x, 8);
        }
    }
}

ZERODEF zero_result zero_convert(void *dst, zero_dtype dst_dtype, const void *src,
                                 zero_dtype src_dtype, size_t numel, zero_simd simd)
{
    size_t dsize = zero_dtype_size(dst_dtype), ssize = zero_dtype_size(src_dtype), bytes;
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = (const unsigned char *)src;
    zero_simd path;
    int kind;
    if (dsize == 0 || ssize == 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_convert: unknown dtype (dst %d, src %d)",
                          (int)dst_dtype, (int)src_dtype);
    if ((int)simd < ZERO_SIMD_AUTO || (int)simd > ZERO_SIMD_AVX512)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_convert: simd = %d", (int)simd);
    if (numel > 0 && (!dst || !src))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_convert: %s is NULL with numel = %zu",
                          dst ? "src" : "dst", numel);
    if (zero__mul_size(numel, dsize > ssize ? dsize : ssize, &bytes) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_convert: numel = %zu elements overflow", numel);
    if (simd != ZERO_SIMD_AUTO && simd > zero__simd_cpu())
        return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_convert: simd %s unavailable (best: %s)",
                          zero_simd_name(simd), zero_simd_name(zero__simd_cpu()));
    if (numel == 0) return ZERO_OK;
    if (dst_dtype == src_dtype) {
        memmove(dst, src, numel * dsize);
        return ZERO_OK;
    }
    if (dst_dtype == ZERO_F64 || src_dtype == ZERO_F64) {
        zero__cvt_f64_pair(d, dst_dtype, s, src_dtype, numel);
        return ZERO_OK;
    }
    if (dst_dtype == ZERO_F32) kind = src_dtype == ZERO_F16 ? ZERO__CVT_F32_F16 : ZERO__CVT_F32_BF16;
    else if (src_dtype == ZERO_F32) kind = dst_dtype == ZERO_F16 ? ZERO__CVT_F16_F32 : ZERO__CVT_BF16_F32;
    else kind = dst_dtype == ZERO_F16 ? ZERO__CVT_F16_BF16 : ZERO__CVT_BF16_F16;
    path = simd == ZERO_SIMD_AUTO ? zero_simd_detect() : simd;
#ifdef ZERO__X86_SIMD
    if (path == ZERO_SIMD_AVX512) {
        zero__cvt_avx512(kind, d, s, numel);
        return ZERO_OK;
    }
    if (path == ZERO_SIMD_AVX2) {
        zero__cvt_avx2(kind, d, s, numel);
        return ZERO_OK;
    }
#else
    (void)path;
#endif
    zero__cvt_scalar(kind, d, s, 0, numel);
    return ZERO_OK;
}

/* ---- block quantization ----------------------------------------------------------------
   The arithmetic of one block is ZERO_HOSTDEV so that zero_cuda.h's kernels compute the same
   expressions: the scale rounded up with an exact fmaf test, the code by one IEEE division
   and rintf (the default rounding mode), the dequantized sum by explicit fmaf (no product
   meets a sum that a compiler could contract). */

/* The block's scale from its largest magnitude (finite) and whether it holds inf/NaN. */
static inline ZERO_HOSTDEV float zero__quant_scale(float absmax, int nonfinite, int qmax)
{
    float q = (float)qmax, sc;
    if (nonfinite) return NAN;
    if (absmax == 0.0f) return 0.0f;
    sc = absmax / q;
    if (fmaf(sc, q, -absmax) < 0.0f) sc = nextafterf(sc, INFINITY); /* sc * Q >= absmax */
    return sc;
}

/* x's code under scale sc: 0 for a zero block or a NaN scale (the block dequantizes to 0
   or NaN), else nearest even of x / sc (|x / sc| <= Q by the rounded-up scale; clamped
   anyway). */
static inline ZERO_HOSTDEV int zero__quant_code(float x, float sc, int qmax)
{
    float t;
    if (!(sc > 0.0f)) return 0;
    t = rintf(x / sc);
    if (t > (float)qmax) t = (float)qmax;
    if (t < -(float)qmax) t = -(float)qmax;
    return (int)t;
}

/* Code i of a codes region (int8: a signed byte; int4: a nibble, two's complement). */
static inline ZERO_HOSTDEV int zero__quant_get(const unsigned char *codes, int bits, size_t i)
{
    int v;
    if (bits == 8) return (int)(signed char)codes[i];
    v = (codes[i >> 1] >> ((i & 1u) * 4u)) & 0xf;
    return v >= 8 ? v - 16 : v;
}

static zero_result zero__quant_check(const char *fn, zero_dtype dt, int bits, size_t *block)
{
    if (*block == 0) *block = ZERO_QUANT_BLOCK_DEFAULT;
    if (bits != 8 && bits != 4)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: bits = %d (8 or 4)", fn, bits);
    if (*block < 2 || *block > ZERO_QUANT_BLOCK_MAX || (*block & 1u))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: block = %zu (an even number of elements, 2 .. %zu)", fn, *block,
                          ZERO_QUANT_BLOCK_MAX);
    if (dt != ZERO_F32 && dt != ZERO_F16 && dt != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: dtype %d (%s): f32, f16 or bf16 only",
                          fn, (int)dt, zero_dtype_name(dt));
    return ZERO_OK;
}

static zero_result zero__quant_size(const char *fn, size_t numel, int bits, size_t block,
                                    size_t *out)
{
    size_t nb = numel / block + (numel % block != 0), codes, t;
    codes = bits == 8 ? numel : numel / 2 + (numel & 1u);
    if (zero__mul_size(nb, 4, &t) != 0 || zero__add_size(t, codes, &t) != 0 ||
        zero__add_size(t, 3, &t) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "%s: %zu elements overflow size_t bytes", fn, numel);
    *out = t & ~(size_t)3;
    return ZERO_OK;
}

ZERODEF zero_result zero_quant_bytes(size_t numel, int bits, size_t block, size_t *out)
{
    zero_result r = zero__quant_check("zero_quant_bytes", ZERO_F32, bits, &block);
    if (r != ZERO_OK) return r;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_quant_bytes: out is NULL");
    return zero__quant_size("zero_quant_bytes", numel, bits, block, out);
}

/* Element i of src (f32 / f16 / bf16, any alignment) as fp32 bits. */
static uint32_t zero__quant_ld(const unsigned char *src, zero_dtype dt, size_t i)
{
    uint32_t u;
    uint16_t h;
    if (dt == ZERO_F32) {
        memcpy(&u, src + 4 * i, 4);
        return u;
    }
    memcpy(&h, src + 2 * i, 2);
    return dt == ZERO_F16 ? zero__f16_to_f32_bits(h) : zero__bf16_to_f32_bits(h);
}

static void zero__quant_st(unsigned char *dst, zero_dtype dt, size_t i, float v)
{
    uint32_t u = zero__f32_bits(v);
    uint16_t h;
    if (dt == ZERO_F32) {
        memcpy(dst + 4 * i, &u, 4);
        return;
    }
    h = dt == ZERO_F16 ? zero__f32_to_f16_bits(u) : zero__f32_to_bf16_bits(u);
    memcpy(dst + 2 * i, &h, 2);
}

ZERODEF zero_result zero_quantize(void *dst, const void *src, zero_dtype src_dtype, size_t numel,
                                  int bits, size_t block)
{
    const unsigned char *x = (const unsigned char *)src;
    unsigned char *d = (unsigned char *)dst, *codes;
    size_t bytes = 0, nb, k, i;
    int qmax = bits == 8 ? 127 : 7;
    zero_result r = zero__quant_check("zero_quantize", src_dtype, bits, &block);
    if (r == ZERO_OK) r = zero__quant_size("zero_quantize", numel, bits, block, &bytes);
    if (r != ZERO_OK) return r;
    if (numel > 0 && (!dst || !src))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_quantize: %s is NULL with numel = %zu",
                          !dst ? "dst" : "src", numel);
    if (numel == 0) return ZERO_OK;
    nb = numel / block + (numel % block != 0);
    codes = d + 4 * nb;
    memset(codes, 0, bytes - 4 * nb); /* int4 nibbles are or-ed in; the padding is zero */
    for (k = 0; k < nb; k++) {
        size_t i0 = k * block, len = numel - i0 < block ? numel - i0 : block;
        uint32_t amax = 0;
        int bad = 0;
        float sc;
        for (i = 0; i < len; i++) {
            uint32_t a = zero__quant_ld(x, src_dtype, i0 + i) & 0x7fffffffu;
            if (a >= 0x7f800000u) bad = 1;
            else if (a > amax) amax = a; /* non-negative floats order as their bits */
        }
        sc = zero__quant_scale(zero__f32_from_bits(amax), bad, qmax);
        memcpy(d + 4 * k, &sc, 4);
        for (i = i0; i < i0 + len; i++) {
            int q = zero__quant_code(zero__f32_from_bits(zero__quant_ld(x, src_dtype, i)), sc, qmax);
            if (bits == 8) codes[i] = (unsigned char)(q & 0xff);
            else codes[i >> 1] = (unsigned char)(codes[i >> 1] | ((unsigned)(q & 0xf) << ((i & 1u) * 4u)));
        }
    }
    return ZERO_OK;
}

ZERODEF zero_result zero_dequantize_sum(void *dst, zero_dtype dst_dtype, const void *src,
                                        size_t src_stride, int count, size_t numel, int bits,
                                        size_t block)
{
    const unsigned char *x = (const unsigned char *)src;
    unsigned char *d = (unsigned char *)dst;
    size_t bytes = 0, nb, k, i;
    int j;
    zero_result r = zero__quant_check("zero_dequantize", dst_dtype, bits, &block);
    if (r == ZERO_OK) r = zero__quant_size("zero_dequantize", numel, bits, block, &bytes);
    if (r != ZERO_OK) return r;
    if (count < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_dequantize_sum: count = %d", count);
    if (count > 1 && src_stride < bytes)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_dequantize_sum: src_stride = %zu below the %zu bytes of a buffer",
                          src_stride, bytes);
    if (numel > 0 && (!dst || !src))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_dequantize: %s is NULL with numel = %zu",
                          !dst ? "dst" : "src", numel);
    nb = numel / block + (numel % block != 0);
    for (k = 0; k < nb; k++) {
        size_t i0 = k * block, len = numel - i0 < block ? numel - i0 : block;
        for (i = i0; i < i0 + len; i++) {
            float acc = 0.0f;
            for (j = 0; j < count; j++) {
                const unsigned char *b = x + (size_t)j * src_stride;
                float sc;
                memcpy(&sc, b + 4 * k, 4);
                if (j == 0) acc = (float)zero__quant_get(b + 4 * nb, bits, i) * sc;
                else acc = fmaf((float)zero__quant_get(b + 4 * nb, bits, i), sc, acc);
            }
            zero__quant_st(d, dst_dtype, i, acc);
        }
    }
    return ZERO_OK;
}

ZERODEF zero_result zero_dequantize(void *dst, zero_dtype dst_dtype, const void *src,
                                    size_t numel, int bits, size_t block)
{
    return zero_dequantize_sum(dst, dst_dtype, src, 0, 1, numel, bits, block);
}
/* Plan implementation.

   Tensors live in one array in registration order; a hash table of names (open addressing,
   linear probing, at most half full) makes zero_plan_add's duplicate check and
   zero_plan_find O(1). Commit builds every group's layout into fresh arrays and installs
   them only when all of it succeeded, so a failed commit changes nothing. */

#define ZERO__PLAN_MAX_NAME 255
#define ZERO__PLAN_MAX_TENSORS 0x3ffffffe /* ids and id + 1 fit an int with room to spare */

typedef struct zero__plan_tensor {
    char *name;
    size_t name_len;
    uint64_t name_hash;
    size_t numel;
    int group;
    size_t offset; /* set by commit */
    int frozen;    /* zero_plan_freeze */
} zero__plan_tensor;

typedef struct zero__plan_group {
    size_t numel;
    size_t used_numel;
    size_t shard_numel;
    int first;          /* index into group_tensors */
    int num_tensors;
    int persistent;
    size_t frozen_numel; /* the padded frozen region at the end (0: none) */
} zero__plan_group;

struct zero_plan {
    zero_allocator alloc;
    zero__plan_tensor *tensors;
    int num_tensors;
    int cap_tensors;
    int *table;          /* tensor id + 1, 0 = empty; table_cap is a power of two */
    size_t table_cap;
    /* set by a successful commit */
    int committed;
    int world;
    size_t align;
    size_t persist;
    int num_groups;
    zero__plan_group *groups;
    int *group_tensors;  /* tensor ids, group by group, registration order within each */
    size_t total_numel;
    uint64_t hash;
};

#define ZERO__FNV_OFFSET 0xcbf29ce484222325ull
#define ZERO__FNV_PRIME 0x100000001b3ull

/* The offset of the first byte of s[0, n) that is not well-formed UTF-8 (RFC 3629: no
   overlong forms, no surrogates, nothing above U+10FFFF), or n when all of it is. */
static size_t zero__utf8_bad(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i], need, min, cp, k;
        if (c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0xC2 && c <= 0xDF) need = 1, min = 0x80, cp = c & 0x1Fu;
        else if (c >= 0xE0 && c <= 0xEF) need = 2, min = 0x800, cp = c & 0x0Fu;
        else if (c >= 0xF0 && c <= 0xF4) need = 3, min = 0x10000, cp = c & 0x07u;
        else return i;
        if (n - i <= need) return i;
        for (k = 1; k <= need; k++) {
            if ((s[i + k] & 0xC0u) != 0x80u) return i;
            cp = (cp << 6) | (s[i + k] & 0x3Fu);
        }
        if (cp < min || cp > 0x10FFFFu || (cp >= 0xD800u && cp <= 0xDFFFu)) return i;
        i += need + 1;
    }
    return n;
}

static uint64_t zero__fnv1a(uint64_t h, const void *data, size_t bytes)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < bytes; i++) {
        h ^= p[i];
        h *= ZERO__FNV_PRIME;
    }
    return h;
}

/* Hashes v as 8 little-endian bytes, whatever the host's byte order and size_t width. */
static uint64_t zero__fnv1a_u64(uint64_t h, uint64_t v)
{
    unsigned char b[8];
    int i;
    for (i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    return zero__fnv1a(h, b, 8);
}

/* The slot holding 'name' in the table, or the empty slot where it would go. */
static size_t zero__plan_slot(const zero_plan *plan, const char *name, size_t len, uint64_t h)
{
    size_t mask = plan->table_cap - 1, i = (size_t)h & mask;
    for (;;) {
        int id = plan->table[i];
        if (id == 0) return i;
        {
            const zero__plan_tensor *t = &plan->tensors[id - 1];
            if (t->name_hash == h && t->name_len == len && memcmp(t->name, name, len) == 0)
                return i;
        }
        i = (i + 1) & mask;
    }
}

ZERODEF zero_result zero_plan_create(zero_plan **out, const zero_allocator *allocator)
{
    zero_plan *plan;
    zero_allocator a = {NULL, NULL, NULL};
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_create: out is NULL");
    *out = NULL;
    if (allocator) a = *allocator;
    plan = (zero_plan *)zero__alloc(&a, sizeof *plan);
    if (!plan)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_create: %zu bytes",
                          sizeof *plan);
    memset(plan, 0, sizeof *plan);
    plan->alloc = a;
    *out = plan;
    return ZERO_OK;
}

ZERODEF void zero_plan_destroy(zero_plan *plan)
{
    int i;
    zero_allocator a;
    if (!plan) return;
    a = plan->alloc;
    for (i = 0; i < plan->num_tensors; i++) zero__free(&a, plan->tensors[i].name);
    zero__free(&a, plan->tensors);
    zero__free(&a, plan->table);
    zero__free(&a, plan->groups);
    zero__free(&a, plan->group_tensors);
    zero__free(&a, plan);
}

/* Grows the name table to new_cap slots (a power of two), rehashing every tensor. */
static zero_result zero__plan_rehash(zero_plan *plan, size_t new_cap)
{
    size_t bytes, i, mask = new_cap - 1;
    int *table;
    int id;
    if (zero__mul_size(new_cap, sizeof(int), &bytes))
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_add: name table of %zu slots",
                          new_cap);
    table = (int *)zero__alloc(&plan->alloc, bytes);
    if (!table)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_add: name table of %zu bytes",
                          bytes);
    memset(table, 0, bytes);
    for (id = 0; id < plan->num_tensors; id++) {
        i = (size_t)plan->tensors[id].name_hash & mask;
        while (table[i] != 0) i = (i + 1) & mask;
        table[i] = id + 1;
    }
    zero__free(&plan->alloc, plan->table);
    plan->table = table;
    plan->table_cap = new_cap;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_add(zero_plan *plan, const char *name, size_t numel, int group,
                                  int *out_tensor)
{
    size_t len = 0, slot;
    uint64_t h;
    char *copy;
    zero_result r;
    if (!plan) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: plan is NULL");
    if (plan->committed)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_plan_add: the plan is committed; add tensors before commit");
    if (!name) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: name is NULL");
    while (len <= ZERO__PLAN_MAX_NAME && name[len] != '\0') len++;
    if (len == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: name is empty");
    if (len > ZERO__PLAN_MAX_NAME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_add: name \"%.32s...\" is longer than %d bytes", name,
                          ZERO__PLAN_MAX_NAME);
    if (zero__utf8_bad((const unsigned char *)name, len) != len)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_add: tensor name is not UTF-8 (byte %zu of %zu is 0x%02x): "
                          "names must be UTF-8, as safetensors and JSON readers require",
                          zero__utf8_bad((const unsigned char *)name, len) + 1, len,
                          (unsigned)(unsigned char)name[zero__utf8_bad((const unsigned char *)name, len)]);
    if (numel == 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_add: tensor \"%s\": numel = 0",
                          name);
    if (group < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_add: tensor \"%s\": group = %d (must be >= 0)", name, group);
    h = zero__fnv1a(ZERO__FNV_OFFSET, name, len);
    if (plan->table_cap != 0 && plan->table[zero__plan_slot(plan, name, len, h)] != 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_add: tensor name \"%s\" is already registered", name);
    if (plan->num_tensors == ZERO__PLAN_MAX_TENSORS)
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_add: too many tensors (%d)",
                          plan->num_tensors);
    /* Grow the tensor array and the table first: a failure leaves the plan as it was
       (bigger arrays, same contents). */
    if (plan->num_tensors == plan->cap_tensors) {
        int cap = plan->cap_tensors == 0                             ? 16
                  : plan->cap_tensors > ZERO__PLAN_MAX_TENSORS / 2 ? ZERO__PLAN_MAX_TENSORS
                                                                   : plan->cap_tensors * 2;
        zero__plan_tensor *grown;
        size_t bytes;
        if (zero__mul_size((size_t)cap, sizeof *grown, &bytes))
            return zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_add: %d tensors", cap);
        grown = (zero__plan_tensor *)zero__alloc(&plan->alloc, bytes);
        if (!grown)
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_add: %zu bytes", bytes);
        if (plan->num_tensors)
            memcpy(grown, plan->tensors, (size_t)plan->num_tensors * sizeof *grown);
        zero__free(&plan->alloc, plan->tensors);
        plan->tensors = grown;
        plan->cap_tensors = cap;
    }
    if ((size_t)(plan->num_tensors + 1) * 2 > plan->table_cap) {
        r = zero__plan_rehash(plan, plan->table_cap ? plan->table_cap * 2 : 64);
        if (r != ZERO_OK) return r;
    }
    copy = (char *)zero__alloc(&plan->alloc, len + 1);
    if (!copy) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_add: %zu bytes", len + 1);
    memcpy(copy, name, len + 1);
    slot = zero__plan_slot(plan, name, len, h);
    {
        zero__plan_tensor *t = &plan->tensors[plan->num_tensors];
        t->name = copy;
        t->name_len = len;
        t->name_hash = h;
        t->numel = numel;
        t->group = group;
        t->offset = 0;
        t->frozen = 0;
    }
    plan->table[slot] = plan->num_tensors + 1;
    if (out_tensor) *out_tensor = plan->num_tensors;
    plan->num_tensors++;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_freeze(zero_plan *plan, int tensor)
{
    if (!plan) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_freeze: plan is NULL");
    if (plan->committed)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_plan_freeze: the plan is committed");
    if (tensor < 0 || tensor >= plan->num_tensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_freeze: tensor %d (the plan has %d)",
                          tensor, plan->num_tensors);
    plan->tensors[tensor].frozen = 1;
    return ZERO_OK;
}

/* x rounded up to a multiple of a (a > 0); -1 on overflow. */
static int zero__round_up(size_t x, size_t a, size_t *out)
{
    size_t rem = x % a;
    if (rem == 0) {
        *out = x;
        return 0;
    }
    return zero__add_size(x, a - rem, out);
}

ZERODEF zero_result zero_plan_commit(zero_plan *plan, int world, size_t align_numel,
                                     size_t persist_numel)
{
    int ntensors, ngroups, max_group = -1, i, g;
    size_t unit, bytes, total = 0, count_len;
    int *counts = NULL, *ids = NULL;
    size_t *offsets = NULL;
    zero__plan_group *groups = NULL;
    uint64_t h;
    zero_result r = ZERO_OK;

    if (!plan) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_commit: plan is NULL");
    if (plan->committed)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_plan_commit: already committed");
    if (world <= 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_commit: world = %d (must be >= 1)", world);
    if (align_numel == 0) align_numel = ZERO_DEFAULT_ALIGN_NUMEL;
    ntensors = plan->num_tensors;
    if (ntensors == 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_plan_commit: no tensors registered");
    if (zero__mul_size((size_t)world, align_numel, &unit))
        return zero__fail(ZERO_ERROR_OVERFLOW,
                          "zero_plan_commit: world (%d) * align_numel (%zu) overflows size_t",
                          world, align_numel);

    /* Group ids must be exactly 0..G-1. At most ntensors distinct ids exist, so a missing id,
       if any, is below ntensors + 1: counting that far finds the smallest. */
    for (i = 0; i < ntensors; i++)
        if (plan->tensors[i].group > max_group) max_group = plan->tensors[i].group;
    count_len = (size_t)max_group + 1;
    if (count_len > (size_t)ntensors + 1) count_len = (size_t)ntensors + 1;
    counts = (int *)zero__alloc(&plan->alloc, count_len * sizeof(int));
    if (!counts) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_commit: %zu bytes",
                       count_len * sizeof(int));
        goto done;
    }
    memset(counts, 0, count_len * sizeof(int));
    for (i = 0; i < ntensors; i++)
        if ((size_t)plan->tensors[i].group < count_len) counts[plan->tensors[i].group]++;
    for (g = 0; (size_t)g < count_len && g <= max_group; g++)
        if (counts[g] == 0) {
            r = zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                           "zero_plan_commit: group ids must be 0..G-1 each used: group %d has "
                           "no tensor (largest id %d)",
                           g, max_group);
            goto done;
        }
    ngroups = max_group + 1;

    /* Layout, into fresh arrays: tensor offsets, groups, the group -> tensors index. */
    if (zero__mul_size((size_t)ngroups, sizeof *groups, &bytes)) {
        r = zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_commit: %d groups", ngroups);
        goto done;
    }
    groups = (zero__plan_group *)zero__alloc(&plan->alloc, bytes);
    ids = (int *)zero__alloc(&plan->alloc, (size_t)ntensors * sizeof(int));
    offsets = (size_t *)zero__alloc(&plan->alloc, (size_t)ntensors * sizeof(size_t));
    if (!groups || !ids || !offsets) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_plan_commit: layout of %d tensors",
                       ntensors);
        goto done;
    }
    memset(groups, 0, bytes);
    {
        int first = 0;
        for (g = 0; g < ngroups; g++) {
            groups[g].first = first;
            first += counts[g];
        }
    }
    /* trained tensors first; frozen ones (pass 1) after the trained region, padded to unit */
    for (i = 0; i < ntensors; i++)
        if (plan->tensors[i].frozen && groups[plan->tensors[i].group].frozen_numel == 0)
            groups[plan->tensors[i].group].frozen_numel = 1; /* marks "has frozen tensors" */
    for (i = 0; i < 2 * ntensors; i++) {
        const zero__plan_tensor *t = &plan->tensors[i % ntensors];
        zero__plan_group *grp = &groups[t->group];
        size_t off, end;
        if (t->frozen != (i >= ntensors)) continue;
        if (i >= ntensors && grp->frozen_numel == 1) { /* the group's first frozen tensor */
            if (zero__round_up(grp->used_numel, unit, &grp->used_numel)) {
                r = zero__fail(ZERO_ERROR_OVERFLOW, "zero_plan_commit: group %d overflows size_t",
                               t->group);
                goto done;
            }
            grp->frozen_numel = grp->used_numel + 2; /* the region's start + 2 until padded */
        }
        if (zero__round_up(grp->used_numel, align_numel, &off) ||
            zero__add_size(off, t->numel, &end)) {
            r = zero__fail(ZERO_ERROR_OVERFLOW,
                           "zero_plan_commit: group %d overflows size_t at tensor \"%s\" "
                           "(numel %zu)",
                           t->group, t->name, t->numel);
            goto done;
        }
        offsets[i % ntensors] = off;
        grp->used_numel = end;
    }
    for (i = 0; i < ntensors; i++) { /* registration order within each group */
        zero__plan_group *grp = &groups[plan->tensors[i].group];
        ids[grp->first + grp->num_tensors++] = i;
    }
    for (g = 0; g < ngroups; g++) {
        zero__plan_group *grp = &groups[g];
        if (zero__round_up(grp->used_numel, unit, &grp->numel) ||
            zero__add_size(total, grp->numel, &total)) {
            r = zero__fail(ZERO_ERROR_OVERFLOW,
                           "zero_plan_commit: group %d (%zu elements) padded to a multiple of "
                           "%zu overflows size_t",
                           g, grp->used_numel, unit);
            goto done;
        }
        grp->shard_numel = grp->numel / (size_t)world;
        grp->persistent = grp->used_numel < persist_numel;
        if (grp->frozen_numel >= 2) grp->frozen_numel = grp->numel - (grp->frozen_numel - 2);
    }

    /* The hash: FNV-1a 64 over a canonical byte encoding (fixed-width little-endian
       integers, length-prefixed names), never over struct memory. */
    h = zero__fnv1a(ZERO__FNV_OFFSET, "zero-plan-v1", 12);
    h = zero__fnv1a_u64(h, (uint64_t)world);
    h = zero__fnv1a_u64(h, (uint64_t)align_numel);
    h = zero__fnv1a_u64(h, (uint64_t)ntensors);
    for (i = 0; i < ntensors; i++) {
        const zero__plan_tensor *t = &plan->tensors[i];
        h = zero__fnv1a_u64(h, (uint64_t)t->name_len);
        h = zero__fnv1a(h, t->name, t->name_len);
        h = zero__fnv1a_u64(h, (uint64_t)t->numel);
        h = zero__fnv1a_u64(h, (uint64_t)t->group);
        if (t->frozen) h = zero__fnv1a(h, "frozen", 6); /* plans without frozen: as before */
    }
    h = zero__fnv1a_u64(h, (uint64_t)ngroups);
    for (g = 0; g < ngroups; g++) h = zero__fnv1a_u64(h, (uint64_t)groups[g].persistent);
    if (h == 0) h = 1; /* 0 means "not committed" */

    /* Install. Nothing below can fail. */
    for (i = 0; i < ntensors; i++) plan->tensors[i].offset = offsets[i];
    plan->groups = groups;
    plan->group_tensors = ids;
    groups = NULL;
    ids = NULL;
    plan->num_groups = ngroups;
    plan->world = world;
    plan->align = align_numel;
    plan->persist = persist_numel;
    plan->total_numel = total;
    plan->hash = h;
    plan->committed = 1;

done:
    zero__free(&plan->alloc, counts);
    zero__free(&plan->alloc, offsets);
    zero__free(&plan->alloc, groups);
    zero__free(&plan->alloc, ids);
    return r;
}

ZERODEF int zero_plan_is_committed(const zero_plan *plan) { return plan && plan->committed; }
ZERODEF int zero_plan_world(const zero_plan *plan) { return plan ? plan->world : 0; }
ZERODEF int zero_plan_num_groups(const zero_plan *plan) { return plan ? plan->num_groups : 0; }
ZERODEF int zero_plan_num_tensors(const zero_plan *plan) { return plan ? plan->num_tensors : 0; }
ZERODEF size_t zero_plan_total_numel(const zero_plan *plan)
{
    return plan ? plan->total_numel : 0;
}
ZERODEF size_t zero_plan_align(const zero_plan *plan) { return plan ? plan->align : 0; }
ZERODEF uint64_t zero_plan_hash(const zero_plan *plan) { return plan ? plan->hash : 0; }

/* The common checks of the queries. */
static zero_result zero__plan_query(const zero_plan *plan, const void *out, const char *fn)
{
    if (!plan) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: plan is NULL", fn);
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (!plan->committed)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: the plan is not committed", fn);
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_group(const zero_plan *plan, int group, zero_group_info *out)
{
    const zero__plan_group *g;
    zero_result r = zero__plan_query(plan, out, "zero_plan_group");
    if (r != ZERO_OK) return r;
    if (group < 0 || group >= plan->num_groups)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_group: group %d (the plan has %d)",
                          group, plan->num_groups);
    g = &plan->groups[group];
    out->numel = g->numel;
    out->used_numel = g->used_numel;
    out->shard_numel = g->shard_numel;
    out->tensors = plan->group_tensors + g->first;
    out->num_tensors = g->num_tensors;
    out->persistent = g->persistent;
    out->frozen_numel = g->frozen_numel;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_tensor(const zero_plan *plan, int tensor, zero_tensor_info *out)
{
    const zero__plan_tensor *t;
    zero_result r = zero__plan_query(plan, out, "zero_plan_tensor");
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= plan->num_tensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_tensor: tensor %d (the plan has %d)",
                          tensor, plan->num_tensors);
    t = &plan->tensors[tensor];
    out->name = t->name;
    out->group = t->group;
    out->offset = t->offset;
    out->numel = t->numel;
    out->frozen = t->frozen;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_find(const zero_plan *plan, const char *name, int *out_tensor)
{
    size_t len = 0;
    int id;
    zero_result r = zero__plan_query(plan, out_tensor, "zero_plan_find");
    if (r != ZERO_OK) return r;
    if (!name) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_plan_find: name is NULL");
    while (len <= ZERO__PLAN_MAX_NAME && name[len] != '\0') len++;
    id = 0;
    if (len >= 1 && len <= ZERO__PLAN_MAX_NAME)
        id = plan->table[zero__plan_slot(plan, name, len,
                                         zero__fnv1a(ZERO__FNV_OFFSET, name, len))];
    if (id == 0)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_find: no tensor named \"%.64s\"",
                          name);
    *out_tensor = id - 1;
    return ZERO_OK;
}

ZERODEF zero_result zero_plan_shard(const zero_plan *plan, int group, int rank, zero_range *out)
{
    const zero__plan_group *g;
    zero_result r = zero__plan_query(plan, out, "zero_plan_shard");
    if (r != ZERO_OK) return r;
    if (group < 0 || group >= plan->num_groups)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_plan_shard: group %d (the plan has %d)",
                          group, plan->num_groups);
    if (rank < 0 || rank >= plan->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_shard: rank %d outside 0..%d", rank, plan->world - 1);
    g = &plan->groups[group];
    out->numel = (g->numel - g->frozen_numel) / (size_t)plan->world;
    out->offset = (size_t)rank * out->numel;
    return ZERO_OK;
}

/* Where element x of tensor t's region slice of rank 'rank' (x inside that slice) sits in
   the rank's part of the group: its trained slice first, then its frozen slice. */
static size_t zero__plan_shard_pos(const zero_plan *plan, int tensor, int rank, size_t x)
{
    const zero__plan_group *g = &plan->groups[plan->tensors[tensor].group];
    size_t W = (size_t)plan->world, tr = g->numel - g->frozen_numel;
    if (!plan->tensors[tensor].frozen) return x - (size_t)rank * (tr / W);
    return tr / W + (x - tr - (size_t)rank * (g->frozen_numel / W));
}

ZERODEF zero_result zero_plan_intersect(const zero_plan *plan, int tensor, int rank,
                                        zero_range *out)
{
    const zero__plan_tensor *t;
    size_t s0, s1, t0, t1, lo, hi;
    zero_result r = zero__plan_query(plan, out, "zero_plan_intersect");
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= plan->num_tensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND,
                          "zero_plan_intersect: tensor %d (the plan has %d)", tensor,
                          plan->num_tensors);
    if (rank < 0 || rank >= plan->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_plan_intersect: rank %d outside 0..%d", rank, plan->world - 1);
    t = &plan->tensors[tensor];
    {   /* the slice of the tensor's region */
        const zero__plan_group *g = &plan->groups[t->group];
        size_t tr = g->numel - g->frozen_numel;
        size_t len = (t->frozen ? g->frozen_numel : tr) / (size_t)plan->world;
        s0 = (t->frozen ? tr : 0) + (size_t)rank * len;
        s1 = s0 + len;
    }
    t0 = t->offset;
    t1 = t0 + t->numel;
    lo = s0 > t0 ? s0 : t0;
    hi = s1 < t1 ? s1 : t1;
    if (lo < hi) {
        out->offset = lo;
        out->numel = hi - lo;
    } else {
        /* Empty: the offset is the shard start clamped into the tensor, so that
           out->offset - tensor offset stays within 0..numel and grows with the rank. */
        out->offset = s0 < t0 ? t0 : (s0 > t1 ? t1 : s0);
        out->numel = 0;
    }
    return ZERO_OK;
}
/* Estimator implementation: see the estimator declarations and docs/estimator.md. */

/* a * b and a + b in 64 bits; -1 on overflow. */
static int zero__mul_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (b != 0 && a > UINT64_MAX / b) return -1;
    *out = a * b;
    return 0;
}

static int zero__add_u64(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a > UINT64_MAX - b) return -1;
    *out = a + b;
    return 0;
}

/* A non-negative double truncated to an integer as Python's int() does, if it fits. */
static int zero__trunc_u64(double x, uint64_t *out)
{
    if (!(x >= 0.0) || x >= 18446744073709551616.0) return -1;
    *out = (uint64_t)x;
    return 0;
}

/* Validates desc and fills the defaults into *r. check_params: 0 for the inverse. */
static zero_result zero__estimate_resolve(const zero_estimate_desc *desc, zero_estimate_desc *r,
                                          int check_params)
{
    const char *fn = check_params ? "zero_estimate_compute" : "zero_estimate_max_params";
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: desc is NULL", fn);
    *r = *desc;
    if (r->mode == ZERO_ESTIMATE_DEFAULT) r->mode = ZERO_ESTIMATE_PAPER;
    if (r->mode != ZERO_ESTIMATE_PAPER && r->mode != ZERO_ESTIMATE_DEEPSPEED)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: mode = %d", fn, (int)desc->mode);
    if (check_params && (r->params == 0 || r->params > ZERO_ESTIMATE_MAX_PARAMS))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: params = %llu (want 1..2^53)", fn,
                          (unsigned long long)r->params);
    if (r->ranks < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: ranks = %d (want >= 1)", fn, r->ranks);
    if (r->stage < 0 || r->stage > 3)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: stage = %d (want 0..3)", fn, r->stage);
    if (r->param_bytes < 0 || r->param_bytes > 1024 || r->grad_bytes < 0 || r->grad_bytes > 1024 ||
        r->optimizer_bytes < 0 || r->optimizer_bytes > 1024)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: param_bytes = %d, grad_bytes = %d, optimizer_bytes = %d (want 0..1024)",
                          fn, r->param_bytes, r->grad_bytes, r->optimizer_bytes);
    if (r->param_bytes == 0) r->param_bytes = 2;
    if (r->grad_bytes == 0) r->grad_bytes = 2;
    if (r->optimizer_dtype == ZERO_DTYPE_DEFAULT) r->optimizer_dtype = ZERO_F32;
    if (r->optimizer_dtype != ZERO_F32 && r->optimizer_dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: optimizer_dtype = %d (f32 or bf16)",
                          fn, (int)r->optimizer_dtype);
    if (r->optimizer_dtype == ZERO_BF16) {
        if (r->mode == ZERO_ESTIMATE_DEEPSPEED)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: optimizer_dtype = bf16 is a paper-mode setting (DeepSpeed's "
                              "estimators assume fp32 optimizer state)", fn);
        if (r->optimizer_bytes != 0 && r->optimizer_bytes != 6)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: optimizer_bytes = %d with optimizer_dtype = bf16 (K is 6: "
                              "bf16 master, m and v)", fn, r->optimizer_bytes);
        r->optimizer_bytes = 6;
    }
    if (r->optimizer_bytes == 0) r->optimizer_bytes = 12;
    if (r->gpus_per_node < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: gpus_per_node = %d", fn, r->gpus_per_node);
    if (r->gpus_per_node == 0) r->gpus_per_node = 1;
    if (r->ranks % r->gpus_per_node != 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: gpus_per_node = %d does not divide ranks = %d", fn,
                          r->gpus_per_node, r->ranks);
    if (r->additional_buffer_factor != r->additional_buffer_factor || r->additional_buffer_factor < 0.0 ||
        r->additional_buffer_factor > 1e300)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: additional_buffer_factor = %g", fn,
                          r->additional_buffer_factor);
    if (r->additional_buffer_factor == 0.0) r->additional_buffer_factor = 1.5;
    r->offload = r->offload != 0;
    r->offload_params = r->offload_params != 0;
    r->no_zero_init = r->no_zero_init != 0;
    if (r->offload_params && !(r->mode == ZERO_ESTIMATE_DEEPSPEED && r->stage == 3 && r->offload))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_params needs DeepSpeed mode, stage 3 and offload", fn);
    if ((int)r->offload_optimizer < 0 || r->offload_optimizer > ZERO_OFFLOAD_NVME ||
        (int)r->offload_param < 0 || r->offload_param > ZERO_OFFLOAD_NVME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_optimizer = %d, offload_param = %d (none, cpu or nvme)", fn,
                          (int)r->offload_optimizer, (int)r->offload_param);
    if (r->mode == ZERO_ESTIMATE_DEEPSPEED && (r->offload_optimizer || r->offload_param))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_optimizer / offload_param are paper-mode settings (DeepSpeed "
                          "mode: offload, offload_params)", fn);
    if (r->offload && r->offload_optimizer == ZERO_OFFLOAD_NONE) r->offload_optimizer = ZERO_OFFLOAD_CPU;
    if (r->offload_optimizer != ZERO_OFFLOAD_NONE) r->offload = 1;
    if (r->offload_optimizer_ratio != r->offload_optimizer_ratio || r->offload_optimizer_ratio < 0.0 ||
        r->offload_optimizer_ratio > 1.0 ||
        (r->offload_optimizer_ratio != 0.0 && r->offload_optimizer == ZERO_OFFLOAD_NONE))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_optimizer_ratio = %g (in (0, 1], 0 = 1; paper mode, with "
                          "offload_optimizer)", fn, r->offload_optimizer_ratio);
    if (r->mode == ZERO_ESTIMATE_DEEPSPEED && r->offload_optimizer_ratio != 0.0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_optimizer_ratio is a paper-mode setting", fn);
    if (r->offload_optimizer_ratio == 0.0) r->offload_optimizer_ratio = 1.0;
    if (r->delayed_update != 0 && r->delayed_update != 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: delayed_update = %d (0 or 1)", fn,
                          r->delayed_update);
    if (r->delayed_update &&
        (r->mode == ZERO_ESTIMATE_DEEPSPEED || r->offload_optimizer != ZERO_OFFLOAD_CPU ||
         r->offload_optimizer_ratio < 1.0 || r->offload_param == ZERO_OFFLOAD_NVME))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: delayed_update needs paper mode and offload_optimizer = cpu at "
                          "ratio 1 (offload_param none or cpu), as the engine's", fn);
    if (r->offload_param != ZERO_OFFLOAD_NONE && (r->stage != 3 || !r->offload))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_param needs stage 3 and an offloaded optimizer", fn);
    if (r->ranks_per_node < 0 || r->mics_shard_size < 0 || r->accum_steps < 0 ||
        (r->ranks_per_node > 0 && r->ranks % r->ranks_per_node != 0) ||
        (r->mics_shard_size > 0 && r->ranks % r->mics_shard_size != 0))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: ranks_per_node = %d, mics_shard_size = %d (divisors of ranks = %d, "
                          "0 = default), accum_steps = %d", fn, r->ranks_per_node,
                          r->mics_shard_size, r->ranks, r->accum_steps);
    if (r->ranks_per_node == 0) r->ranks_per_node = r->ranks;
    if (r->mics_shard_size == r->ranks) r->mics_shard_size = 0;
    if (r->accum_steps == 0) r->accum_steps = 1;
    if (r->mics_shard_size && (r->stage == 0 || r->mode == ZERO_ESTIMATE_DEEPSPEED))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: mics_shard_size = %d needs paper mode and stage 1-3", fn,
                          r->mics_shard_size);
    if (r->hpz_partition_size < 0 || r->hpz_partition_size > r->ranks)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: hpz_partition_size = %d (0 or 1 = off, else a divisor of "
                          "ranks_per_node = %d)", fn, r->hpz_partition_size, r->ranks_per_node);
    if (r->hpz_partition_size <= 1 || r->hpz_partition_size == r->ranks) r->hpz_partition_size = 0;
    if (r->hpz_partition_size &&
        (r->ranks_per_node % r->hpz_partition_size != 0 || r->stage != 3 ||
         r->mode == ZERO_ESTIMATE_DEEPSPEED || r->mics_shard_size ||
         r->offload_param == ZERO_OFFLOAD_NVME))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: hpz_partition_size = %d needs paper mode, stage 3, no MiCS, no "
                          "NVMe param tier and a divisor of ranks_per_node = %d (the secondary "
                          "group inside a node)",
                          fn, r->hpz_partition_size, r->ranks_per_node);
    if (r->frozen && r->mode == ZERO_ESTIMATE_DEEPSPEED)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: frozen = %llu: a paper-mode setting (DeepSpeed's estimators have "
                          "no frozen parameters)", fn, (unsigned long long)r->frozen);
    if (check_params && r->frozen > r->params)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: frozen = %llu exceeds params = %llu",
                          fn, (unsigned long long)r->frozen, (unsigned long long)r->params);
    if (r->frozen > ZERO_ESTIMATE_MAX_PARAMS)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: frozen = %llu", fn,
                          (unsigned long long)r->frozen);
    if (r->mode == ZERO_ESTIMATE_DEEPSPEED) {
        if (r->stage < 2)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: stage = %d: DeepSpeed's estimators cover stages 2 and 3", fn,
                              r->stage);
        if (r->stage == 3) {
            if (r->largest_layer_params == 0)
                return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                                  "%s: largest_layer_params is required for DeepSpeed stage 3", fn);
            if (check_params && r->largest_layer_params > r->params)
                return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                                  "%s: largest_layer_params = %llu exceeds params = %llu", fn,
                                  (unsigned long long)r->largest_layer_params,
                                  (unsigned long long)r->params);
            if (r->largest_layer_params > ZERO_ESTIMATE_MAX_PARAMS)
                return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: largest_layer_params = %llu",
                                  fn, (unsigned long long)r->largest_layer_params);
        }
    }
    return ZERO_OK;
}

/* Peers of rank 0 on its node (nodes of R) among count ranks first + i stride. */
static int zero__estimate_peers(int R, int stride, int count)
{
    int i, n = 0;
    for (i = 1; i < count; i++) n += (i * stride) / R == 0;
    return n;
}

/* One collective's pairwise bytes (docs/engine.md, "Inside and between nodes"): unit
   elements of es bytes with each of the group's size - 1 peers, same of them on the node. */
static void zero__estimate_coll(zero_estimate *e, double unit, double es, int size, int same)
{
    e->step_bytes += unit * es * (double)(size - 1);
    e->step_intra_bytes += unit * es * (double)same;
    e->step_inter_bytes += unit * es * (double)(size - 1 - same);
}

/* Paper mode: the traffic per step of rank 0 (zero_estimate.step_*). */
static void zero__estimate_traffic(const zero_estimate_desc *r, uint64_t p, zero_estimate *e)
{
    int N = r->ranks, R = r->ranks_per_node, S = r->mics_shard_size ? r->mics_shard_size : N;
    double P = (double)p, T = (double)(p > r->frozen ? p - r->frozen : 0), A = r->accum_steps;
    double g = r->grad_bytes, pb = r->param_bytes;
    int gs = zero__estimate_peers(R, 1, S); /* the group: ranks 0..S-1 */
    if (N == 1) return;
    if (r->stage == 0) {
        zero__estimate_coll(e, A * 2.0 * T / N, g, N, gs);
        return;
    }
    zero__estimate_coll(e, A * T / S, g, S, gs);                            /* reduce-scatter */
    if (r->hpz_partition_size) { /* hpZ: one gather over N, the rest over the node's H */
        int H = r->hpz_partition_size;
        zero__estimate_coll(e, P / N, pb, N, gs);
        zero__estimate_coll(e, (2.0 * A - 1.0) * P / H, pb, H, H - 1);
        return;
    }
    zero__estimate_coll(e, (r->stage == 3 ? 2.0 * A * P : T) / S, pb, S, gs); /* all-gather */
    if (S < N) /* MiCS: the replicas 0, S, 2 S, ... */
        zero__estimate_coll(e, 2.0 * T / N, g, N / S, zero__estimate_peers(R, S, N / S));
}

/* offload_optimizer_ratio: how many of the S elements of a rank's shard the offload tier
   holds, H = floor(r S + 0.5) (r S rounded to nearest, halves up, in double), at least 1 and
   at most S (S = 0: 0). Shared with the estimator. */
static uint64_t zero__ratio_split(uint64_t S, double r)
{
    double h;
    uint64_t H;
    if (S == 0) return 0;
    if (!(r > 0.0) || r >= 1.0) return S;
    h = floor(r * (double)S + 0.5);
    H = h >= (double)S ? S : (uint64_t)h;
    return H < 1 ? 1 : H;
}

/* Paper mode: the device categories and host bytes of Psi = p. -1 on overflow. */
static int zero__estimate_paper(const zero_estimate_desc *r, uint64_t p, zero_estimate *e)
{
    uint64_t n = (uint64_t)(r->mics_shard_size ? r->mics_shard_size : r->ranks);
    uint64_t shard = p / n + (p % n != 0); /* ceil(Psi / N), N = S with MiCS */
    uint64_t tp = p > r->frozen ? p - r->frozen : 0;               /* trained: Psi - F */
    uint64_t tshard = tp / n + (tp % n != 0);                      /* ceil((Psi - F) / N) */
    uint64_t pn = r->stage >= 3 ? shard : p;                       /* params kept   */
    uint64_t gn = r->stage >= 2 ? tshard : tp;                     /* grads kept    */
    uint64_t on = r->stage >= 1 ? tshard : tp;                     /* optimizer kept */
    uint64_t opt, sum;
    if (zero__mul_u64(pn, (uint64_t)r->param_bytes, &e->params_bytes) ||
        zero__mul_u64(gn, (uint64_t)r->grad_bytes, &e->grads_bytes) ||
        zero__mul_u64(on, (uint64_t)r->optimizer_bytes, &opt))
        return -1;
    e->optimizer_bytes = r->offload ? 0 : opt;
    e->host_bytes = r->offload_optimizer == ZERO_OFFLOAD_CPU ? opt : 0;
    e->nvme_bytes = r->offload_optimizer == ZERO_OFFLOAD_NVME ? opt : 0;
    if (r->offload_optimizer != ZERO_OFFLOAD_NONE && r->offload_optimizer_ratio < 1.0) {
        /* partial offload: the tier holds K H of the K S, H as the engine splits */
        uint64_t h = zero__ratio_split(on, r->offload_optimizer_ratio), off;
        if (zero__mul_u64(h, (uint64_t)r->optimizer_bytes, &off)) return -1;
        e->optimizer_bytes = opt - off;
        if (r->offload_optimizer == ZERO_OFFLOAD_CPU) e->host_bytes = off;
        else e->nvme_bytes = off;
    }
    if (r->delayed_update) { /* DPU: a second gradient shard and the pending params */
        uint64_t dpu;
        if (zero__mul_u64(on, (uint64_t)r->grad_bytes + (uint64_t)r->param_bytes, &dpu) ||
            zero__add_u64(e->host_bytes, dpu, &e->host_bytes))
            return -1;
    }
    if (r->offload_param != ZERO_OFFLOAD_NONE) { /* ZeRO-Infinity: 2 S leave the device */
        uint64_t *tier = r->offload_param == ZERO_OFFLOAD_CPU ? &e->host_bytes : &e->nvme_bytes;
        if (zero__add_u64(*tier, e->params_bytes, tier)) return -1;
        e->params_bytes = 0;
    }
    if (r->hpz_partition_size) { /* hpZ: the secondary parts, N / S shards, on the device */
        uint64_t sec, b;
        if (zero__mul_u64(shard, (uint64_t)(r->ranks / r->hpz_partition_size), &sec) ||
            zero__mul_u64(sec, (uint64_t)r->param_bytes, &b) ||
            zero__add_u64(e->params_bytes, b, &e->params_bytes))
            return -1;
    }
    if (zero__add_u64(e->params_bytes, e->grads_bytes, &sum) ||
        zero__add_u64(sum, e->optimizer_bytes, &e->device_bytes))
        return -1;
    e->gather_bytes = 0;
    zero__estimate_traffic(r, p, e);
    return 0;
}

/* DeepSpeed's gpu_mem for Psi = p (integer arithmetic: int(18 * p / N) is the exact floor).
   -1 on overflow. */
static int zero__estimate_ds_gpu(const zero_estimate_desc *r, uint64_t p, uint64_t *gpu,
                                 uint64_t *gather)
{
    uint64_t n = (uint64_t)r->ranks, t, u;
    *gather = 0;
    if (r->stage == 2) {
        if (zero__mul_u64(p, 2, &t)) return -1;
        if (r->offload) { /* 2 = fp16 params; everything else is on the CPU */
            *gpu = t;
            return 0;
        }
        /* 2 fp16 params + 18/N (2 fp16 grads, 4 fp32 grads, 4 fp32 params, 8 Adam m + v) */
        if (zero__mul_u64(p, 18, &u)) return -1;
        return zero__add_u64(t, u / n, gpu);
    }
    /* stage 3: largest_layer_memory = 4 * largest layer (fp16 params gathered + fp16 grads) */
    if (zero__mul_u64(r->largest_layer_params, 4, gather)) return -1;
    if (r->offload && r->offload_params) {
        *gpu = *gather;
        return 0;
    }
    if (zero__mul_u64(p, r->offload ? 2 : 18, &u)) return -1;
    return zero__add_u64(*gather, u / n, gpu);
}

/* DeepSpeed's cpu_mem (per node), evaluated in double in DeepSpeed's own order so that the
   result is the same double Python computes, then truncated. -1 on overflow. */
static int zero__estimate_ds_cpu(const zero_estimate_desc *r, uint64_t p, uint64_t *cpu)
{
    uint64_t gpn = (uint64_t)r->gpus_per_node, nodes = (uint64_t)(r->ranks / r->gpus_per_node);
    uint64_t total_gpus = (uint64_t)r->ranks, prod;
    double abf = r->additional_buffer_factor, gf = 1.0 / (double)nodes, x;
    if (r->stage == 2) {
        if (r->offload) { /* total_params * max(4 * total_gpus, 16) * abf */
            uint64_t m = 4 * total_gpus > 16 ? 4 * total_gpus : 16;
            if (zero__mul_u64(p, m, &prod)) return -1;
        } else { /* total_params * 4 * num_gpus_per_node * abf */
            if (zero__mul_u64(p, 4 * gpn, &prod)) return -1;
        }
        return zero__trunc_u64((double)prod * abf, cpu);
    }
    if (r->offload) {
        double f = (r->offload_params ? 18.0 : 16.0) * gf; /* 18 (or 16) * gpus_factor */
        if (!r->no_zero_init) { /* total_params * 18 * gpus_factor * abf */
            if (zero__mul_u64(p, r->offload_params ? 18 : 16, &prod)) return -1;
            x = (double)prod * gf * abf;
        } else if (f > (double)(4 * gpn)) { /* max() returns its first argument on ties */
            x = (double)p * f * abf;
        } else {
            if (zero__mul_u64(p, 4 * gpn, &prod)) return -1;
            x = (double)prod * abf;
        }
        return zero__trunc_u64(x, cpu);
    }
    /* no offload: the model is first built on the CPU (fp32, 4 bytes), per GPU of the node;
       with zero.Init only the largest layer at a time */
    if (zero__mul_u64(r->no_zero_init ? p : r->largest_layer_params, 4 * gpn, &prod)) return -1;
    return zero__trunc_u64((double)prod * abf, cpu);
}

/* All of the estimate of Psi = p into *e (desc already resolved). -1 on overflow. */
static int zero__estimate_all(const zero_estimate_desc *r, uint64_t p, zero_estimate *e)
{
    memset(e, 0, sizeof *e);
    e->mode = r->mode;
    e->stage = r->stage;
    e->ranks = r->ranks;
    e->params = p;
    if (r->mode == ZERO_ESTIMATE_PAPER) return zero__estimate_paper(r, p, e);
    if (zero__estimate_ds_gpu(r, p, &e->device_bytes, &e->gather_bytes)) return -1;
    return zero__estimate_ds_cpu(r, p, &e->host_bytes);
}

/* The inverse's predicate: Psi = p's device bytes are computable and fit. A device byte
   count past 64 bits is more than any memory, so it does not fit; the host bytes are not
   looked at (their overflow is the forward query's error, checked at the answer).
   Monotone: once false it stays false as p grows (every byte count is non-decreasing). */
static int zero__estimate_fits(const zero_estimate_desc *r, uint64_t p, uint64_t memory)
{
    zero_estimate e;
    uint64_t gather;
    memset(&e, 0, sizeof e);
    if (r->mode == ZERO_ESTIMATE_PAPER) {
        if (zero__estimate_paper(r, p, &e)) return 0;
    } else if (zero__estimate_ds_gpu(r, p, &e.device_bytes, &gather)) {
        return 0;
    }
    return e.device_bytes <= memory;
}

ZERODEF zero_result zero_estimate_compute(const zero_estimate_desc *desc, zero_estimate *out)
{
    zero_estimate_desc r;
    zero_estimate e;
    zero_result res;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_estimate_compute: out is NULL");
    res = zero__estimate_resolve(desc, &r, 1);
    if (res != ZERO_OK) return res;
    if (zero__estimate_all(&r, r.params, &e))
        return zero__fail(ZERO_ERROR_OVERFLOW,
                          "zero_estimate_compute: the bytes of %llu params overflow 64 bits",
                          (unsigned long long)r.params);
    *out = e;
    return ZERO_OK;
}

ZERODEF zero_result zero_estimate_max_params(const zero_estimate_desc *desc,
                                             uint64_t device_memory, uint64_t *out)
{
    zero_estimate_desc r;
    zero_result res;
    uint64_t lo, hi;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_estimate_max_params: out is NULL");
    res = zero__estimate_resolve(desc, &r, 0);
    if (res != ZERO_OK) return res;
    /* the smallest model: one parameter, or (DeepSpeed stage 3) the largest layer alone */
    lo = r.mode == ZERO_ESTIMATE_DEEPSPEED && r.stage == 3 ? r.largest_layer_params : 1;
    if (!zero__estimate_fits(&r, lo, device_memory)) {
        *out = 0;
        return ZERO_OK;
    }
    hi = ZERO_ESTIMATE_MAX_PARAMS;
    if (zero__estimate_fits(&r, hi, device_memory)) {
        lo = hi;
    } else {
        while (hi - lo > 1) { /* fits(lo) and not fits(hi) */
            uint64_t mid = lo + (hi - lo) / 2;
            if (zero__estimate_fits(&r, mid, device_memory)) lo = mid;
            else hi = mid;
        }
    }
    /* the answer must be one the forward query accepts: where its host bytes overflow, so
       does zero_estimate_compute at the answer, and the inverse says so too */
    {
        zero_estimate e;
        if (zero__estimate_all(&r, lo, &e))
            return zero__fail(ZERO_ERROR_OVERFLOW,
                              "zero_estimate_max_params: %llu params fit the device memory but "
                              "their host bytes overflow 64 bits (additional_buffer_factor = %g)",
                              (unsigned long long)lo, r.additional_buffer_factor);
    }
    *out = lo;
    return ZERO_OK;
}
/* Local comm implementation: N ranks as threads, one mutex and one
   condition variable per group.

   A collective is a sequence of sync points (a generation barrier). At the first, every rank
   posts its call (kind, numel, dtype, op, root, buffers) and the last rank to arrive checks
   that all posts agree, so every rank reads the same verdict. Between two sync points the
   ranks read each other's buffers without the lock (a "data phase"; the mutex hand-offs at
   the sync points order those reads after the posts and before the buffers are reused):

       barrier         post
       all_gather      post, copy every block, end
       reduce_scatter  post, reduce block 'rank' of every send, end
       broadcast       post, copy from the root, end
       all_reduce      post, reduce slice 'rank' into recv, mid, copy the other slices
                       from their owners' recv, end

   so every output element is reduced exactly once, and in-place calls are safe (a rank only
   writes what no peer reads in the same phase). Posts are double-buffered by the parity of
   the collective's sequence number: a rank can post call k+1 while a peer still reads the
   posts of call k, and cannot post k+2 before every peer has arrived at k+1.

   Failure: a wait that passes its deadline, zero_local_abort() or a destroyed comm breaks
   the group (broken != ZERO_OK, once, with a message); waiters wake and return that code,
   and later calls fail at once. 'active' counts the ranks inside a data phase; a rank leaves
   with an error only when it is 0, so no peer still reads a buffer its caller may free. */

#include <pthread.h>
#include <time.h>
#include <unistd.h> /* sysconf: cores online, for the rendezvous' spin */

/* The monotonic clock and the condition-variable clock are POSIX.1-2001. When the
   implementation file included a libc header (<stdio.h>, ...) before zero.h under
   -std=c99/c11, the request for POSIX at the top of this file came too late: glibc fixes
   its feature set at the first header and then hides them. Declare what is hidden (the
   signatures are fixed by POSIX; glibc's feature macros say what it declared) instead of
   failing with an implicit declaration. Other C libraries read _POSIX_C_SOURCE per header
   and see the request. */
#include <sys/types.h> /* clockid_t */
#if defined(__GLIBC__) && !defined(__USE_POSIX199309)
extern int clock_gettime(clockid_t clock_id, struct timespec *tp);
#endif
#if defined(__GLIBC__) && !defined(__USE_XOPEN2K)
extern int pthread_condattr_setclock(pthread_condattr_t *attr, clockid_t clock_id);
#endif
#if !defined(CLOCK_MONOTONIC) && defined(__linux__)
#define ZERO__CLOCK_MONOTONIC ((clockid_t)1) /* the same id on every Linux architecture */
#else
#define ZERO__CLOCK_MONOTONIC CLOCK_MONOTONIC
#endif

/* Spinning needs atomics that C99, C11 and C++ compilers share: the GCC/Clang builtins.
   Without them the rendezvous only sleeps (the same semantics, slower). */
#if defined(__GNUC__) || defined(__clang__)
#define ZERO__LOCAL_CAN_SPIN 1
#define ZERO__LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define ZERO__STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#if defined(__x86_64__) || defined(__i386__)
#define ZERO__CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define ZERO__CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define ZERO__CPU_RELAX() ((void)0)
#endif
#else
#define ZERO__LOCAL_CAN_SPIN 0
#define ZERO__LOAD_ACQ(p) (*(p))
#define ZERO__STORE_REL(p, v) (*(p) = (v))
#define ZERO__CPU_RELAX() ((void)0)
#endif
#define ZERO__LOCAL_SPIN_US 50 /* default spin before sleeping */

enum {
    ZERO__LC_BARRIER = 1,
    ZERO__LC_ALL_GATHER,
    ZERO__LC_REDUCE_SCATTER,
    ZERO__LC_ALL_REDUCE,
    ZERO__LC_BROADCAST,
    ZERO__LC_ALL_TO_ALL
};

enum { ZERO__SYNC_POST, ZERO__SYNC_MID, ZERO__SYNC_END };

/* Elements reduced per tile (fp32 / fp64 accumulators on the stack). */
#define ZERO__LOCAL_TILE 512

typedef struct zero__local_post {
    int kind;
    int bad; /* this rank's own arguments were invalid */
    zero_dtype dtype;
    zero_op op;
    int root;
    size_t numel;
    const void *send;
    void *recv;
    zero_comm_tag tag; /* the caller's comm->tag at the call */
} zero__local_post;

struct zero_local_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    zero_allocator allocator;
    zero_simd simd; /* for the fp16/bf16 <-> fp32 tiles, resolved once */
    int world;
    int timeout_ms;
    long spin_ns;             /* spin before sleeping at a sync point; 0 = never         */
    int arrived;              /* ranks waiting at the current sync point                 */
    unsigned long long gen;   /* sync points completed (stored with release: spinners
                                 read it without the lock)                               */
    int stop;                 /* 1 once broken (atomic): ends a spin                     */
    int active;               /* ranks inside a data phase                               */
    zero_result broken;       /* ZERO_OK, or why every call now fails                    */
    char broken_msg[256];
    int live;                 /* comms alive                                             */
    int orphaned;             /* zero_local_group_destroy() was called                   */
    unsigned char *here;      /* [world]: arrived at the current sync point              */
    unsigned char *has_comm;  /* [world]                                                 */
    zero__local_post *posts;  /* [2][world]: by parity of the collective's sequence       */
    int verdict_ok[2];
    char verdict_msg[2][512];
    zero_local_group **split_slot; /* [world]: zero_comm_split's new groups, by leader */
};

typedef struct zero__local_comm {
    zero_comm base;
    zero_local_group *group;
    unsigned long long seq; /* collectives this rank has called */
    const void **srcs;      /* [world]: the inputs of one reduction */
    long spin_ns;           /* this rank's current spin budget (adaptive, <= group's) */
} zero__local_comm;

static void zero__local_destroy(zero_comm *comm);

ZERODEF const char *zero_comm_role_name(int32_t role)
{
    switch (role) {
    case ZERO_ROLE_NONE: return "untagged";
    case ZERO_ROLE_GATHER: return "gather";
    case ZERO_ROLE_GRAD_REDUCE: return "grad_reduce";
    case ZERO_ROLE_PARAM_UPDATE: return "param_update";
    case ZERO_ROLE_FLAG: return "flag";
    case ZERO_ROLE_NORM: return "norm";
    case ZERO_ROLE_COMMIT: return "commit";
    case ZERO_ROLE_CHECKPOINT: return "checkpoint";
    case ZERO_ROLE_OFFLOAD: return "offload";
    case ZERO_ROLE_USER: return "user";
    }
    return "?";
}

static const char *zero__local_kind_name(int kind)
{
    switch (kind) {
    case ZERO__LC_BARRIER: return "barrier";
    case ZERO__LC_ALL_GATHER: return "all_gather";
    case ZERO__LC_ALL_TO_ALL: return "all_to_all";
    case ZERO__LC_REDUCE_SCATTER: return "reduce_scatter";
    case ZERO__LC_ALL_REDUCE: return "all_reduce";
    case ZERO__LC_BROADCAST: return "broadcast";
    }
    return "?";
}

/* " group 0 (gather, seq 12)", " (flag, seq 40)", or "" when untagged. */
static void zero__local_describe_tag(char *buf, size_t size, const zero_comm_tag *t)
{
    char count[40] = "";
    if (t->count) snprintf(count, sizeof count, ", count %llu", (unsigned long long)t->count);
    if (t->role == ZERO_ROLE_NONE)
        buf[0] = '\0';
    else if (t->group >= 0)
        snprintf(buf, size, " group %d (%s, seq %llu%s)", (int)t->group, zero_comm_role_name(t->role),
                 (unsigned long long)t->seq, count);
    else
        snprintf(buf, size, " (%s, seq %llu%s)", zero_comm_role_name(t->role),
                 (unsigned long long)t->seq, count);
}

/* "all_reduce(numel 10, f32, sum)" */
static void zero__local_describe(char *buf, size_t size, const zero__local_post *p)
{
    const char *name = zero__local_kind_name(p->kind);
    if (p->bad)
        snprintf(buf, size, "%s(invalid arguments)", name);
    else if (p->kind == ZERO__LC_BARRIER)
        snprintf(buf, size, "barrier()");
    else if (p->kind == ZERO__LC_BROADCAST)
        snprintf(buf, size, "broadcast(numel %zu, %s, root %d)", p->numel, zero_dtype_name(p->dtype),
                 p->root);
    else if (p->kind == ZERO__LC_ALL_GATHER || p->kind == ZERO__LC_ALL_TO_ALL)
        snprintf(buf, size, "%s(numel %zu, %s)", name, p->numel, zero_dtype_name(p->dtype));
    else
        snprintf(buf, size, "%s(numel %zu, %s, %s)", name, p->numel, zero_dtype_name(p->dtype),
                 p->op == ZERO_OP_MAX ? "max" : "sum");
}

static int zero__local_same(const zero__local_post *a, const zero__local_post *b)
{
    return !a->bad && !b->bad && a->kind == b->kind && a->numel == b->numel &&
           a->dtype == b->dtype && a->op == b->op && a->root == b->root;
}

/* Tags agree when either side is untagged (role 0) or group, role and seq are equal. */
static int zero__local_same_tag(const zero_comm_tag *a, const zero_comm_tag *b)
{
    return a->role == ZERO_ROLE_NONE || b->role == ZERO_ROLE_NONE ||
           (a->group == b->group && a->role == b->role && a->seq == b->seq && a->count == b->count);
}

/* Under the lock, by the last rank to post: do all posts of parity 'par' agree? */
static int zero__local_judge(zero_local_group *g, int par, unsigned long long seq)
{
    const zero__local_post *p = g->posts + (size_t)par * (size_t)g->world;
    char a[96], b[96], ta[112], tb[112];
    int r;
    for (r = 0; r < g->world; r++)
        if (p[r].bad) {
            snprintf(g->verdict_msg[par], sizeof g->verdict_msg[par],
                     "collective #%llu: rank %d passed invalid arguments to %s", seq, r,
                     zero__local_kind_name(p[r].kind));
            return 0;
        }
    for (r = 1; r < g->world; r++)
        if (!zero__local_same(&p[0], &p[r])) {
            zero__local_describe(a, sizeof a, &p[0]);
            zero__local_describe(b, sizeof b, &p[r]);
            zero__local_describe_tag(ta, sizeof ta, &p[0].tag);
            zero__local_describe_tag(tb, sizeof tb, &p[r].tag);
            snprintf(g->verdict_msg[par], sizeof g->verdict_msg[par],
                     "ranks disagree at collective #%llu: rank 0 called %s%s, rank %d called %s%s",
                     seq, a, ta, r, b, tb);
            return 0;
        }
    for (r = 1; r < g->world; r++)
        if (!zero__local_same_tag(&p[0].tag, &p[r].tag)) {
            /* same arguments, different purpose: the ranks' control flow diverged */
            zero__local_describe_tag(ta, sizeof ta, &p[0].tag);
            zero__local_describe_tag(tb, sizeof tb, &p[r].tag);
            snprintf(g->verdict_msg[par], sizeof g->verdict_msg[par],
                     "ranks disagree at collective #%llu: rank 0 %s%s vs rank %d %s%s", seq,
                     zero__local_kind_name(p[0].kind), ta, r, zero__local_kind_name(p[r].kind), tb);
            return 0;
        }
    g->verdict_msg[par][0] = '\0';
    return 1;
}

/* Under the lock: breaks the group once (later causes are ignored) and wakes everyone. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void zero__local_break(zero_local_group *g, zero_result why, const char *fmt, ...)
{
    va_list ap;
    if (g->broken != ZERO_OK) return;
    g->broken = why;
    ZERO__STORE_REL(&g->stop, 1);
    va_start(ap, fmt);
    vsnprintf(g->broken_msg, sizeof g->broken_msg, fmt, ap);
    va_end(ap);
    pthread_cond_broadcast(&g->cv); /* cannot fail on an initialised cond */
}

static void zero__local_deadline(const zero_local_group *g, struct timespec *ts)
{
#if defined(__APPLE__)
    clock_gettime(CLOCK_REALTIME, ts);
#else
    clock_gettime(ZERO__CLOCK_MONOTONIC, ts); /* the cond waits on this clock (condattr) */
#endif
    ts->tv_sec += g->timeout_ms / 1000;
    ts->tv_nsec += (long)(g->timeout_ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Under the lock: the error of a broken group, once no peer is inside a data phase. */
static zero_result zero__local_fail_broken(zero_local_group *g, const char *what, int rank)
{
    zero_result why = g->broken;
    while (g->active > 0)
        if (pthread_cond_wait(&g->cv, &g->mu) != 0) break; /* cannot fail on a held mutex */
    pthread_mutex_unlock(&g->mu);
    return zero__fail(why, "%s (rank %d): group is broken: %s", what, rank, g->broken_msg);
}

/* Called with the lock held by a rank that must wait for generation my_gen to end: drops
   the lock and spins (reading gen with acquire, pausing the core) for up to spin_ns. Returns
   1 (lock NOT held) when the generation ended; 0 (lock held again) when the spin ran out or
   the group broke, and the caller sleeps on the condition variable as before. A spin never
   outlasts the deadline: spin_ns is at most a quarter of the timeout. */
static int zero__local_spin(zero_local_group *g, unsigned long long my_gen, long spin_ns)
{
#if ZERO__LOCAL_CAN_SPIN
    struct timespec t0, t;
    long i;
    pthread_mutex_unlock(&g->mu);
    clock_gettime(ZERO__CLOCK_MONOTONIC, &t0);
    for (i = 1;; i++) {
        if (ZERO__LOAD_ACQ(&g->gen) != my_gen) return 1;
        if (ZERO__LOAD_ACQ(&g->stop)) break;
        ZERO__CPU_RELAX();
        if ((i & 63) == 0) {
            clock_gettime(ZERO__CLOCK_MONOTONIC, &t);
            if ((long)(t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > spin_ns)
                break;
        }
    }
    pthread_mutex_lock(&g->mu); /* cannot fail: the mutex was held by this thread a moment ago */
    return 0;
#else
    (void)g;
    (void)my_gen;
    (void)spin_ns;
    return 0;
#endif
}

/* One sync point for rank c. At ZERO__SYNC_POST the rank publishes *post first; the
   verdict on all posts is then in *ok. MID and END close a data phase; POST (when the
   verdict is good and the call moves data) and MID open one. */
static zero_result zero__local_sync(zero__local_comm *c, int point, const zero__local_post *post,
                                    int *ok)
{
    zero_local_group *g = c->group;
    int rank = c->base.rank, world = g->world, par = (int)(c->seq & 1u), rc, r;
    const char *what = zero__local_kind_name(post->kind);
    unsigned long long my_gen;
    struct timespec deadline;
    zero__local_deadline(g, &deadline);
    rc = pthread_mutex_lock(&g->mu);
    if (rc != 0)
        return zero__fail(ZERO_ERROR_COMM, "%s (rank %d): pthread_mutex_lock failed: %s", what, rank,
                          strerror(rc));
    if (point != ZERO__SYNC_POST && --g->active == 0 && g->broken != ZERO_OK)
        pthread_cond_broadcast(&g->cv); /* a failing peer waits for active == 0 */
    if (g->broken != ZERO_OK) return zero__local_fail_broken(g, what, rank);
    if (point == ZERO__SYNC_POST) g->posts[(size_t)par * (size_t)world + (size_t)rank] = *post;
    g->here[rank] = 1;
    if (++g->arrived == world) {
        g->arrived = 0;
        memset(g->here, 0, (size_t)world);
        if (point == ZERO__SYNC_POST) {
            g->verdict_ok[par] = zero__local_judge(g, par, c->seq);
            g->active = g->verdict_ok[par] && post->kind != ZERO__LC_BARRIER ? world : 0;
        } else if (point == ZERO__SYNC_MID) {
            g->active = world;
        }
        /* release: a spinning peer that sees the new generation also sees the verdict, the
           posts and every write its peers made before they arrived */
        ZERO__STORE_REL(&g->gen, g->gen + 1);
        pthread_cond_broadcast(&g->cv);
    } else {
        my_gen = g->gen;
        if (c->spin_ns > 0) {
            /* Adaptive: a spin that ends in time doubles the next budget (up to the
               group's), one that runs out halves it (down to 1 us, which keeps probing):
               when peers keep arriving late (a busy machine, long compute between
               collectives) spinning costs almost nothing. */
            if (zero__local_spin(g, my_gen, c->spin_ns)) {
                /* the generation moved while this rank spun without the lock (acquire):
                   the same outcome as a wake-up below, without sleeping */
                c->spin_ns = c->spin_ns * 2 < g->spin_ns ? c->spin_ns * 2 : g->spin_ns;
                if (ok) *ok = g->verdict_ok[par];
                return ZERO_OK;
            }
            c->spin_ns = c->spin_ns / 2 > 1000 ? c->spin_ns / 2 : 1000;
        }
        while (g->gen == my_gen) {
            if (g->broken != ZERO_OK) return zero__local_fail_broken(g, what, rank);
            rc = pthread_cond_timedwait(&g->cv, &g->mu, &deadline);
            if (g->gen != my_gen || g->broken != ZERO_OK) continue;
            if (rc == ETIMEDOUT) {
                char missing[128];
                size_t used = 0;
                missing[0] = '\0';
                for (r = 0; r < world && used + 8 < sizeof missing; r++)
                    if (!g->here[r])
                        used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%d",
                                                 used ? ", " : "", r);
                zero__local_break(g, ZERO_ERROR_TIMEOUT,
                                  "rank %d timed out after %d ms in %s #%llu waiting for rank(s) %s",
                                  rank, g->timeout_ms, what, c->seq, missing);
            } else if (rc != 0) {
                zero__local_break(g, ZERO_ERROR_COMM, "rank %d: pthread_cond_timedwait failed: %s",
                                  rank, strerror(rc));
            }
        }
    }
    if (ok) *ok = g->verdict_ok[par];
    pthread_mutex_unlock(&g->mu);
    return ZERO_OK;
}

/* ---- the data phases ---- */

static void zero__local_load(float *out, const void *src, zero_dtype dtype, size_t n,
                             zero_simd simd)
{
    if (dtype == ZERO_F32) memcpy(out, src, n * sizeof(float));
    else zero_convert(out, ZERO_F32, src, dtype, n, simd); /* arguments valid: cannot fail */
}

/* dst[i] = op over s = 0..nsrc-1 of src[s][i], in rank order, accumulated in fp32 (fp64 for
   F64), rounded once. Tile by tile: all inputs of a tile are read before its output is
   written, so dst may be one of the inputs. */
static void zero__local_reduce(void *dst, const void *const *src, int nsrc, size_t numel,
                               zero_dtype dtype, zero_op op, zero_simd simd)
{
    size_t es = zero_dtype_size(dtype), base, n, i;
    int s;
    if (nsrc == 1) {
        if (dst != src[0]) memcpy(dst, src[0], numel * es);
        return;
    }
    for (base = 0; base < numel; base += n) {
        n = numel - base < ZERO__LOCAL_TILE ? numel - base : ZERO__LOCAL_TILE;
        if (dtype == ZERO_F64) {
            double acc[ZERO__LOCAL_TILE], x[ZERO__LOCAL_TILE];
            memcpy(acc, (const double *)src[0] + base, n * sizeof(double));
            for (s = 1; s < nsrc; s++) {
                memcpy(x, (const double *)src[s] + base, n * sizeof(double));
                if (op == ZERO_OP_SUM)
                    for (i = 0; i < n; i++) acc[i] += x[i];
                else
                    for (i = 0; i < n; i++)
                        if (x[i] > acc[i] || x[i] != x[i]) acc[i] = acc[i] != acc[i] ? acc[i] : x[i];
            }
            memcpy((double *)dst + base, acc, n * sizeof(double));
        } else {
            float acc[ZERO__LOCAL_TILE], x[ZERO__LOCAL_TILE];
            const unsigned char *in;
            zero__local_load(acc, (const unsigned char *)src[0] + base * es, dtype, n, simd);
            for (s = 1; s < nsrc; s++) {
                in = (const unsigned char *)src[s] + base * es;
                zero__local_load(x, in, dtype, n, simd);
                if (op == ZERO_OP_SUM)
                    for (i = 0; i < n; i++) acc[i] += x[i];
                else
                    for (i = 0; i < n; i++)
                        if (x[i] > acc[i] || x[i] != x[i]) acc[i] = acc[i] != acc[i] ? acc[i] : x[i];
            }
            if (dtype == ZERO_F32) memcpy((float *)dst + base, acc, n * sizeof(float));
            else zero_convert((unsigned char *)dst + base * es, dtype, acc, ZERO_F32, n, simd);
        }
    }
}

/* All_reduce's slice of rank r: [off, off + len), in whole cache lines where numel allows. */
static void zero__local_slice(size_t numel, size_t es, int world, int r, size_t *off, size_t *len)
{
    size_t line = 64 / es, chunk = (numel + (size_t)world - 1) / (size_t)world;
    chunk = (chunk + line - 1) / line * line;
    *off = chunk * (size_t)r < numel ? chunk * (size_t)r : numel;
    *len = numel - *off < chunk ? numel - *off : chunk;
}

/* ---- the collectives ---- */

static zero__local_comm *zero__local_get(zero_comm *comm)
{
    if (!comm || !comm->ops || comm->ops->destroy != zero__local_destroy || !comm->impl) return NULL;
    return (zero__local_comm *)comm->impl;
}

/* Validates this rank's arguments into post->bad and 'why'. */
static void zero__local_check(zero__local_post *p, const zero_local_group *g, char *why,
                              size_t why_size)
{
    size_t es = zero_dtype_size(p->dtype), total = p->numel, bytes;
    const char *name = zero__local_kind_name(p->kind);
    p->bad = 1;
    if (p->kind == ZERO__LC_BARRIER) {
        p->bad = 0;
        return;
    }
    if (es == 0) {
        snprintf(why, why_size, "%s: unknown dtype %d", name, (int)p->dtype);
        return;
    }
    if (p->op != ZERO_OP_SUM && p->op != ZERO_OP_MAX) {
        snprintf(why, why_size, "%s: unknown op %d", name, (int)p->op);
        return;
    }
    if (p->root < 0 || p->root >= g->world) {
        snprintf(why, why_size, "%s: root = %d with world = %d", name, p->root, g->world);
        return;
    }
    if ((p->kind == ZERO__LC_ALL_GATHER || p->kind == ZERO__LC_REDUCE_SCATTER ||
         p->kind == ZERO__LC_ALL_TO_ALL) &&
        zero__mul_size(p->numel, (size_t)g->world, &total) != 0) {
        snprintf(why, why_size, "%s: numel %zu times world %d overflows", name, p->numel, g->world);
        return;
    }
    if (zero__mul_size(total, es, &bytes) != 0) {
        snprintf(why, why_size, "%s: %zu elements of %s overflow size_t bytes", name, total,
                 zero_dtype_name(p->dtype));
        return;
    }
    if (p->numel > 0 && (!p->send || !p->recv)) {
        snprintf(why, why_size, "%s: %s is NULL with numel = %zu", name,
                 !p->send ? (p->kind == ZERO__LC_BROADCAST ? "buf" : "send") : "recv", p->numel);
        return;
    }
    p->bad = 0;
}

static zero_result zero__local_collective(zero_comm *comm, zero__local_post *p)
{
    zero__local_comm *c = zero__local_get(comm);
    zero_local_group *g;
    char why[160];
    const char *name = zero__local_kind_name(p->kind);
    size_t es, n, off, len;
    int ok = 0, rank, world, s;
    zero_result res;
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: comm is not a local comm", name);
    g = c->group;
    rank = comm->rank;
    world = g->world;
    why[0] = '\0';
    p->tag = comm->tag;
    zero__local_check(p, g, why, sizeof why);
    c->seq++;
    res = zero__local_sync(c, ZERO__SYNC_POST, p, &ok);
    if (res != ZERO_OK) return res;
    if (p->bad) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s", why);
    if (!ok)
        return zero__fail(ZERO_ERROR_MISMATCH, "%s (rank %d): %s", name, rank,
                          g->verdict_msg[c->seq & 1u]);
    if (p->kind == ZERO__LC_BARRIER) return ZERO_OK;

    {
        const zero__local_post *peer = g->posts + (size_t)(c->seq & 1u) * (size_t)world;
        es = zero_dtype_size(p->dtype);
        n = p->numel;
        switch (p->kind) {
        case ZERO__LC_ALL_GATHER:
            for (s = 0; s < world; s++) {
                int from = (rank + s) % world; /* spread the readers over the sources */
                unsigned char *dst = (unsigned char *)p->recv + (size_t)from * n * es;
                if (n && dst != peer[from].send) memcpy(dst, peer[from].send, n * es);
            }
            break;
        case ZERO__LC_ALL_TO_ALL: /* block 'rank' of every peer's send */
            for (s = 0; s < world; s++) {
                int from = (rank + s) % world;
                if (n)
                    memcpy((unsigned char *)p->recv + (size_t)from * n * es,
                           (const unsigned char *)peer[from].send + (size_t)rank * n * es, n * es);
            }
            break;
        case ZERO__LC_REDUCE_SCATTER:
            for (s = 0; s < world; s++)
                c->srcs[s] = (const unsigned char *)peer[s].send + (size_t)rank * n * es;
            if (n) zero__local_reduce(p->recv, c->srcs, world, n, p->dtype, p->op, g->simd);
            break;
        case ZERO__LC_ALL_REDUCE:
            zero__local_slice(n, es, world, rank, &off, &len);
            for (s = 0; s < world; s++) c->srcs[s] = (const unsigned char *)peer[s].send + off * es;
            if (len)
                zero__local_reduce((unsigned char *)p->recv + off * es, c->srcs, world, len, p->dtype,
                                   p->op, g->simd);
            res = zero__local_sync(c, ZERO__SYNC_MID, p, NULL);
            if (res != ZERO_OK) return res;
            for (s = 1; s < world; s++) {
                int from = (rank + s) % world;
                zero__local_slice(n, es, world, from, &off, &len);
                if (len)
                    memcpy((unsigned char *)p->recv + off * es,
                           (const unsigned char *)peer[from].recv + off * es, len * es);
            }
            break;
        case ZERO__LC_BROADCAST:
            if (rank != p->root && n && p->recv != peer[p->root].recv)
                memcpy(p->recv, peer[p->root].recv, n * es);
            break;
        }
    }
    return zero__local_sync(c, ZERO__SYNC_END, p, NULL);
}

static zero_result zero__local_all_gather(zero_comm *comm, const void *send, void *recv,
                                          size_t send_numel, zero_dtype dtype, void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_ALL_GATHER;
    p.send = send;
    p.recv = recv;
    p.numel = send_numel;
    p.dtype = dtype;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_all_to_all(zero_comm *comm, const void *send, void *recv,
                                          size_t numel, zero_dtype dtype, void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_ALL_TO_ALL;
    p.send = send;
    p.recv = recv;
    p.numel = numel;
    p.dtype = dtype;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_reduce_scatter(zero_comm *comm, const void *send, void *recv,
                                              size_t recv_numel, zero_dtype dtype, zero_op op,
                                              void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_REDUCE_SCATTER;
    p.send = send;
    p.recv = recv;
    p.numel = recv_numel;
    p.dtype = dtype;
    p.op = op;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_all_reduce(zero_comm *comm, const void *send, void *recv,
                                          size_t numel, zero_dtype dtype, zero_op op, void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_ALL_REDUCE;
    p.send = send;
    p.recv = recv;
    p.numel = numel;
    p.dtype = dtype;
    p.op = op;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_broadcast(zero_comm *comm, void *buf, size_t numel,
                                         zero_dtype dtype, int root, void *queue)
{
    zero__local_post p;
    (void)queue;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_BROADCAST;
    p.send = buf;
    p.recv = buf;
    p.numel = numel;
    p.dtype = dtype;
    p.root = root;
    return zero__local_collective(comm, &p);
}

static zero_result zero__local_barrier(zero_comm *comm)
{
    zero__local_post p;
    memset(&p, 0, sizeof p);
    p.kind = ZERO__LC_BARRIER;
    return zero__local_collective(comm, &p);
}

/* ---- lifetime ---- */

static void zero__local_group_free(zero_local_group *g)
{
    zero_allocator a = g->allocator;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    zero__free(&a, (void *)g->split_slot);
    zero__free(&a, g->posts);
    zero__free(&a, g->has_comm);
    zero__free(&a, g->here);
    zero__free(&a, g);
}

static void zero__local_destroy(zero_comm *comm)
{
    zero__local_comm *c = zero__local_get(comm);
    zero_local_group *g;
    zero_allocator a;
    int last;
    if (!c) return;
    g = c->group;
    pthread_mutex_lock(&g->mu);
    zero__local_break(g, ZERO_ERROR_COMM, "rank %d left the group (its comm was destroyed)",
                      comm->rank);
    g->has_comm[comm->rank] = 0;
    last = --g->live == 0 && g->orphaned;
    a = g->allocator; /* read under the lock: once unlocked, the last rank out may free g */
    pthread_mutex_unlock(&g->mu);
    c->base.impl = NULL; /* a stale handle is then rejected, not followed */
    zero__free(&a, c->srcs);
    zero__free(&a, c);
    if (last) zero__local_group_free(g);
}

/* zero_comm_split on the local comm: the colors and keys are all-gathered over the parent;
   the new rank 0 of each color (its leader) creates the color's group and publishes it in
   the parent's split_slot; every member then creates its comm in it, and the leader hands
   the group over to its comms (destroyed with the last). Two all-reduces over the parent
   make every rank fail together when any step failed on any rank. */
static zero_result zero__local_split(zero_comm *comm, int color, int key, zero_comm **out)
{
    zero__local_comm *c = zero__local_get(comm);
    zero_local_group *g, *sub = NULL;
    zero_comm *nc = NULL;
    zero_result r, mine_r = ZERO_OK;
    double me[2], fail;
    double *all;
    int world, rank, q, n = 0, newrank = 0, leader = -1;
    char why[300] = "";
    if (!c || !out)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_comm_split: %s",
                          out ? "comm is not a local comm" : "out is NULL");
    *out = NULL;
    g = c->group;
    world = g->world;
    rank = comm->rank;
    all = (double *)zero__alloc(&g->allocator, 2 * (size_t)world * sizeof *all);
    me[0] = (double)color;
    me[1] = (double)key;
    /* every rank joins every round, also one out of memory (it gathers nothing) */
    r = zero__local_all_gather(comm, all ? me : NULL, all ? all : NULL, all ? 2 : 0, ZERO_F64,
                               NULL);
    if (r != ZERO_OK) {
        zero__free(&g->allocator, all);
        return r;
    }
    if (!all) {
        mine_r = ZERO_ERROR_OUT_OF_MEMORY;
        snprintf(why, sizeof why, "rank %d: out of memory", rank);
    } else if (color >= 0) {
        for (q = 0; q < world; q++) {
            if (all[2 * q] != (double)color) continue;
            if (all[2 * q + 1] < (double)key || (all[2 * q + 1] == (double)key && q < rank))
                newrank++;
            if (leader < 0 || all[2 * q + 1] < all[2 * leader + 1]) leader = q;
            n++;
        }
        if (newrank == 0) { /* the leader: creates the color's group */
            zero_local_desc d;
            memset(&d, 0, sizeof d);
            d.world = n;
            d.timeout_ms = g->timeout_ms;
            d.allocator = g->allocator;
            d.spin_us = g->spin_ns > 0 ? (int)(g->spin_ns / 1000) : -1;
            if (d.spin_us == 0) d.spin_us = 1;
            mine_r = zero_local_group_create(&d, &sub);
            if (mine_r != ZERO_OK)
                snprintf(why, sizeof why, "rank %d: creating the group of color %d: %.200s", rank,
                         color, zero_last_error());
            pthread_mutex_lock(&g->mu);
            g->split_slot[rank] = sub;
            pthread_mutex_unlock(&g->mu);
        }
    }
    /* round 1: every leader's group exists (or some rank failed) */
    fail = mine_r != ZERO_OK ? 1.0 : 0.0;
    r = zero__local_all_reduce(comm, &fail, &fail, 1, ZERO_F64, ZERO_OP_MAX, NULL);
    if (r == ZERO_OK && fail == 0.0 && color >= 0) {
        zero_local_group *mygroup;
        pthread_mutex_lock(&g->mu);
        mygroup = g->split_slot[leader];
        pthread_mutex_unlock(&g->mu);
        mine_r = zero_local_comm_create(mygroup, newrank, &nc);
        if (mine_r != ZERO_OK)
            snprintf(why, sizeof why, "rank %d: its comm in the group of color %d: %.200s", rank,
                     color, zero_last_error());
    }
    /* round 2: every member has its comm (or some rank failed) */
    if (r == ZERO_OK && fail == 0.0) {
        fail = mine_r != ZERO_OK ? 1.0 : 0.0;
        r = zero__local_all_reduce(comm, &fail, &fail, 1, ZERO_F64, ZERO_OP_MAX, NULL);
    }
    if (sub) { /* the leader hands the group to its comms (freed with the last one) */
        pthread_mutex_lock(&g->mu);
        g->split_slot[rank] = NULL;
        pthread_mutex_unlock(&g->mu);
        zero_local_group_destroy(sub);
    }
    zero__free(&g->allocator, all);
    if (r != ZERO_OK || fail != 0.0) {
        zero_comm_destroy(nc);
        if (r != ZERO_OK) return r;
        if (mine_r != ZERO_OK) return zero__fail(mine_r, "zero_comm_split: %s", why);
        return zero__fail(ZERO_ERROR_COMM, "zero_comm_split (rank %d): another rank failed to "
                          "split (its error names the cause)", rank);
    }
    *out = nc;
    return ZERO_OK;
}

static const zero_comm_ops zero__local_ops = {
    "local",
    zero__local_destroy,
    zero__local_all_gather,
    zero__local_reduce_scatter,
    zero__local_all_reduce,
    zero__local_broadcast,
    zero__local_barrier,
    NULL,
    NULL,
    zero__local_all_to_all,
    zero__local_split,
};

ZERODEF zero_result zero_comm_split(zero_comm *comm, int color, int key, zero_comm **out)
{
    if (out) *out = NULL;
    if (!comm || !comm->ops || !out)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_comm_split: %s is NULL",
                          out ? "comm" : "out");
    if (!comm->ops->split)
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "zero_comm_split: the '%s' comm has no split (sub-communicators)",
                          comm->ops->name ? comm->ops->name : "?");
    return comm->ops->split(comm, color, key, out);
}

ZERODEF zero_result zero_local_group_create(const zero_local_desc *desc, zero_local_group **out)
{
    zero_local_group *g;
    zero_allocator a;
    pthread_condattr_t attr;
    size_t w;
    int rc;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_group_create: out is NULL");
    *out = NULL;
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_group_create: desc is NULL");
    if (desc->world < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_group_create: world = %d (must be >= 1)",
                          desc->world);
    if (desc->timeout_ms < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_local_group_create: timeout_ms = %d (0 = default, else > 0)",
                          desc->timeout_ms);
    if ((desc->allocator.alloc != NULL) != (desc->allocator.free != NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_local_group_create: allocator needs both alloc and free, or neither");
    a = desc->allocator;
    w = (size_t)desc->world;
    g = (zero_local_group *)zero__alloc(&a, sizeof *g);
    if (!g) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_group_create: out of memory");
    memset(g, 0, sizeof *g);
    g->allocator = a;
    g->world = desc->world;
    g->timeout_ms = desc->timeout_ms ? desc->timeout_ms : 60000;
    {   /* adaptive: spin only when every rank can have a core of its own */
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int us = desc->spin_us == 0 ? ZERO__LOCAL_SPIN_US : desc->spin_us;
        if (us > 1000000) us = 1000000; /* at most 1 s per sync point */
        if ((long long)us > (long long)g->timeout_ms * 250) /* a quarter of the timeout */
            us = (int)((long long)g->timeout_ms * 250);
        g->spin_ns = us > 0 && cores >= (long)desc->world && ZERO__LOCAL_CAN_SPIN ? (long)us * 1000L : 0;
    }
    g->simd = zero_simd_detect();
    g->here = (unsigned char *)zero__alloc(&a, w);
    g->has_comm = (unsigned char *)zero__alloc(&a, w);
    g->posts = (zero__local_post *)zero__alloc(&a, 2 * w * sizeof *g->posts);
    g->split_slot = (zero_local_group **)zero__alloc(&a, w * sizeof *g->split_slot);
    if (!g->here || !g->has_comm || !g->posts || !g->split_slot) {
        zero__free(&a, (void *)g->split_slot);
        zero__free(&a, g->posts);
        zero__free(&a, g->has_comm);
        zero__free(&a, g->here);
        zero__free(&a, g);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_group_create: out of memory (world %d)",
                          desc->world);
    }
    memset(g->here, 0, w);
    memset(g->has_comm, 0, w);
    memset(g->posts, 0, 2 * w * sizeof *g->posts);
    memset((void *)g->split_slot, 0, w * sizeof *g->split_slot);
    rc = pthread_mutex_init(&g->mu, NULL);
    if (rc == 0) {
        rc = pthread_condattr_init(&attr);
        if (rc == 0) {
#if !defined(__APPLE__)
            rc = pthread_condattr_setclock(&attr, ZERO__CLOCK_MONOTONIC);
#endif
            if (rc == 0) rc = pthread_cond_init(&g->cv, &attr);
            pthread_condattr_destroy(&attr);
        }
        if (rc != 0) pthread_mutex_destroy(&g->mu);
    }
    if (rc != 0) {
        zero__free(&a, (void *)g->split_slot);
        zero__free(&a, g->posts);
        zero__free(&a, g->has_comm);
        zero__free(&a, g->here);
        zero__free(&a, g);
        return zero__fail(ZERO_ERROR_COMM, "zero_local_group_create: pthread init failed: %s",
                          strerror(rc));
    }
    *out = g;
    return ZERO_OK;
}

ZERODEF void zero_local_group_destroy(zero_local_group *group)
{
    int now;
    if (!group) return;
    pthread_mutex_lock(&group->mu);
    group->orphaned = 1;
    now = group->live == 0;
    pthread_mutex_unlock(&group->mu);
    if (now) zero__local_group_free(group);
}

ZERODEF zero_result zero_local_comm_create(zero_local_group *group, int rank, zero_comm **out)
{
    zero__local_comm *c;
    zero_result res = ZERO_OK;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_comm_create: out is NULL");
    *out = NULL;
    if (!group) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_comm_create: group is NULL");
    if (rank < 0 || rank >= group->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_comm_create: rank = %d with world = %d",
                          rank, group->world);
    c = (zero__local_comm *)zero__alloc(&group->allocator, sizeof *c);
    if (c) {
        memset(c, 0, sizeof *c);
        c->srcs = (const void **)zero__alloc(&group->allocator, (size_t)group->world * sizeof *c->srcs);
    }
    if (!c || !c->srcs) {
        if (c) zero__free(&group->allocator, c);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_comm_create: out of memory");
    }
    c->base.ops = &zero__local_ops;
    c->base.impl = c;
    c->base.rank = rank;
    c->base.world = group->world;
    c->group = group;
    c->spin_ns = group->spin_ns;
    pthread_mutex_lock(&group->mu);
    if (group->has_comm[rank])
        res = zero__fail(ZERO_ERROR_INVALID_STATE, "zero_local_comm_create: rank %d already has a comm",
                         rank);
    else if (group->orphaned)
        res = zero__fail(ZERO_ERROR_INVALID_STATE, "zero_local_comm_create: the group was destroyed");
    if (res == ZERO_OK) {
        group->has_comm[rank] = 1;
        group->live++;
    }
    pthread_mutex_unlock(&group->mu);
    if (res != ZERO_OK) {
        zero__free(&group->allocator, c->srcs);
        zero__free(&group->allocator, c);
        return res;
    }
    *out = &c->base;
    return ZERO_OK;
}

ZERODEF void zero_comm_destroy(zero_comm *comm)
{
    if (comm && comm->ops && comm->ops->destroy) comm->ops->destroy(comm);
}

ZERODEF zero_result zero_local_abort(zero_comm *comm)
{
    zero__local_comm *c = zero__local_get(comm);
    if (!c) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_abort: comm is not a local comm");
    pthread_mutex_lock(&c->group->mu);
    zero__local_break(c->group, ZERO_ERROR_COMM, "rank %d called zero_local_abort", comm->rank);
    pthread_mutex_unlock(&c->group->mu);
    return ZERO_OK;
}

/* ---- zero_local_run ---- */

typedef struct zero__local_runner {
    zero_result (*fn)(int rank, zero_comm *comm, void *user);
    void *user;
    zero_comm *comm;
    zero_local_group *group;
    int rank;
    int first;     /* failed while the group was still whole: a root cause */
    zero_result result;
    char msg[512];
} zero__local_runner;

static void *zero__local_run_thread(void *arg)
{
    zero__local_runner *t = (zero__local_runner *)arg;
    zero_local_group *g = t->group;
    t->result = t->fn(t->rank, t->comm, t->user);
    if (t->result != ZERO_OK) {
        snprintf(t->msg, sizeof t->msg, "%s", zero_last_error());
        pthread_mutex_lock(&g->mu);
        t->first = g->broken == ZERO_OK;
        zero__local_break(g, ZERO_ERROR_COMM, "rank %d's function failed: %s%s%s", t->rank,
                          zero_result_string(t->result), t->msg[0] ? ": " : "", t->msg);
        pthread_mutex_unlock(&g->mu);
    }
    zero_comm_destroy(t->comm); /* peers still waiting for this rank fail, not hang */
    t->comm = NULL;
    return NULL;
}

ZERODEF zero_result zero_local_run_desc(const zero_local_desc *desc,
                                        zero_result (*fn)(int rank, zero_comm *comm, void *user),
                                        void *user)
{
    zero_local_group *g = NULL;
    zero__local_runner *t;
    pthread_t *th;
    zero_result res;
    int r, started = 0, rc = 0, pick = -1;
    if (!desc || !fn)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_local_run: %s is NULL", desc ? "fn" : "desc");
    res = zero_local_group_create(desc, &g);
    if (res != ZERO_OK) return res;
    t = (zero__local_runner *)zero__alloc(&g->allocator, (size_t)desc->world * sizeof *t);
    th = (pthread_t *)zero__alloc(&g->allocator, (size_t)desc->world * sizeof *th);
    if (!t || !th) {
        zero__free(&g->allocator, th);
        zero__free(&g->allocator, t);
        zero_local_group_destroy(g);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_local_run: out of memory (world %d)", desc->world);
    }
    memset(t, 0, (size_t)desc->world * sizeof *t);
    for (r = 0; r < desc->world && res == ZERO_OK; r++) {
        t[r].fn = fn;
        t[r].user = user;
        t[r].group = g;
        t[r].rank = r;
        res = zero_local_comm_create(g, r, &t[r].comm);
    }
    for (r = 0; r < desc->world && res == ZERO_OK; r++) {
        rc = pthread_create(&th[r], NULL, zero__local_run_thread, &t[r]);
        if (rc != 0) {
            res = zero__fail(ZERO_ERROR_COMM, "zero_local_run: pthread_create for rank %d failed: %s", r,
                             strerror(rc));
            pthread_mutex_lock(&g->mu);
            zero__local_break(g, ZERO_ERROR_COMM, "zero_local_run could not start rank %d", r);
            pthread_mutex_unlock(&g->mu);
            break;
        }
        started++;
    }
    for (r = 0; r < started; r++) pthread_join(th[r], NULL);
    if (res == ZERO_OK) {
        for (r = 0; r < desc->world; r++)
            if (t[r].result != ZERO_OK && (pick < 0 || (t[r].first && !t[pick].first))) pick = r;
        if (pick >= 0)
            res = zero__fail(t[pick].result, "rank %d: %s", pick, t[pick].msg);
    }
    for (r = started; r < desc->world; r++) zero_comm_destroy(t[r].comm); /* never started */
    zero__free(&g->allocator, th);
    zero__free(&g->allocator, t);
    zero_local_group_destroy(g);
    return res;
}

ZERODEF zero_result zero_local_run(int world, zero_result (*fn)(int rank, zero_comm *comm, void *user),
                                   void *user)
{
    zero_local_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.world = world;
    return zero_local_run_desc(&desc, fn, user);
}
/* Host device implementation: zero_device_ops on the CPU, synchronous.

   Memory: each allocation is over-allocated by 63 bytes and rounded up to 64; a small
   open-addressing table (pointer -> original pointer, bytes, category) makes free of a
   foreign pointer an error instead of a crash and gives exact per-category accounting.

   Kernels: element-wise, in blocks of ZERO_HOST_SUMSQ_BLOCK elements. With threads > 1
   and enough elements, the blocks are split over workers (each a contiguous run of
   blocks); a block's work never depends on which thread runs it, and per-block results
   (sums of squares, non-finite flags) are folded in block order on the calling thread, so
   every result is the same for any thread count. fp16 / bf16 go through fp32 tiles
   converted by zero_convert() (H1's SIMD paths, bit-identical to the scalar ones). */

#include <pthread.h>

#define ZERO__HOST_TILE 512                 /* elements per fp32 tile on the stack       */
#define ZERO__HOST_WAVE 256                 /* blocks whose results are held at once     */
#define ZERO__HOST_PER_THREAD (1u << 18)    /* elements below which a worker is not worth it */
#define ZERO__HOST_EVENT_MAGIC 0x7a657645u  /* "zevE" */

typedef struct zero__host_slot {
    void *ptr; /* NULL = empty */
    void *raw;
    size_t bytes;
    zero_mem_category category;
} zero__host_slot;

typedef struct zero__host_device {
    zero_device base;
    zero_allocator allocator;
    zero_simd simd; /* resolved: never AUTO */
    int threads;
    pthread_mutex_t mu; /* guards the table and the counters */
    zero__host_slot *table;
    size_t cap;   /* a power of two, or 0 */
    size_t count; /* live allocations */
    size_t bytes[ZERO_MEM_COUNT];
    size_t capacity; /* the budget, 0 = none */
    size_t live;     /* sum of bytes[] */
} zero__host_device;

struct zero_event {
    uint32_t magic;
    zero_device *dev;
};

static void zero__host_destroy(zero_device *dev);

static zero__host_device *zero__host_get(zero_device *dev)
{
    if (!dev || !dev->ops || dev->ops->destroy != zero__host_destroy || !dev->impl) return NULL;
    return (zero__host_device *)dev->impl;
}

/* The common checks of every op: a host device and a queue in range. */
#define ZERO__HOST_ENTER(what)                                                                 \
    zero__host_device *d = zero__host_get(dev);                                               \
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: dev is not a host device", what); \
    if ((int)q < 0 || (int)q >= ZERO_QUEUE_COUNT)                                             \
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: queue %d out of range", what, (int)q)

/* NULL with numel > 0, unknown dtype, or numel * size overflowing: an error; else OK. */
static zero_result zero__host_check_buf(const char *what, const char *arg, const void *p,
                                        zero_dtype dtype, size_t numel)
{
    size_t es = zero_dtype_size(dtype), bytes;
    if (es == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: unknown dtype %d", what, (int)dtype);
    if (zero__mul_size(numel, es, &bytes) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "host %s: numel %zu of %s overflows", what, numel,
                          zero_dtype_name(dtype));
    if (numel > 0 && !p)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: %s is NULL with numel = %zu", what, arg,
                          numel);
    return ZERO_OK;
}

/* ---- the allocation table ---- */

static size_t zero__host_hash(const void *p, size_t cap)
{
    uint64_t h = (uint64_t)(uintptr_t)p >> 6; /* every pointer is 64-byte aligned */
    h *= 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

static size_t zero__host_find(const zero__host_device *d, const void *p)
{
    size_t i;
    if (d->cap == 0) return (size_t)-1;
    for (i = zero__host_hash(p, d->cap); d->table[i].ptr; i = (i + 1) & (d->cap - 1))
        if (d->table[i].ptr == p) return i;
    return (size_t)-1;
}

static void zero__host_put(zero__host_slot *table, size_t cap, const zero__host_slot *s)
{
    size_t i = zero__host_hash(s->ptr, cap);
    while (table[i].ptr) i = (i + 1) & (cap - 1);
    table[i] = *s;
}

/* Keeps the load at most 1/2. */
static int zero__host_grow(zero__host_device *d)
{
    size_t cap = d->cap ? d->cap * 2 : 64, i, bytes;
    zero__host_slot *t;
    if ((d->count + 1) * 2 <= d->cap) return 0;
    if (zero__mul_size(cap, sizeof *t, &bytes) != 0) return -1;
    t = (zero__host_slot *)zero__alloc(&d->allocator, bytes);
    if (!t) return -1;
    memset(t, 0, bytes);
    for (i = 0; i < d->cap; i++)
        if (d->table[i].ptr) zero__host_put(t, cap, &d->table[i]);
    zero__free(&d->allocator, d->table);
    d->table = t;
    d->cap = cap;
    return 0;
}

/* Removes slot i, shifting later members of its probe run back (no tombstones). */
static void zero__host_remove(zero__host_device *d, size_t i)
{
    size_t mask = d->cap - 1, j = i, home;
    d->table[i].ptr = NULL;
    for (;;) {
        j = (j + 1) & mask;
        if (!d->table[j].ptr) return;
        home = zero__host_hash(d->table[j].ptr, d->cap);
        /* move j into the hole i when its home is not cyclically in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            d->table[i] = d->table[j];
            d->table[j].ptr = NULL;
            i = j;
        }
    }
}

static zero_result zero__host_alloc(zero_device *dev, size_t bytes, zero_mem_category category,
                                    void **out)
{
    zero__host_device *d = zero__host_get(dev);
    zero__host_slot s;
    size_t total;
    int rc;
    if (out) *out = NULL;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: dev is not a host device");
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: out is NULL");
    if (bytes == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: bytes = 0");
    if ((int)category < 0 || category >= ZERO_MEM_COUNT)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host alloc: category %d out of range", (int)category);
    if (zero__add_size(bytes, 63, &total) != 0)
        return zero__fail(ZERO_ERROR_OVERFLOW, "host alloc: bytes = %zu overflows", bytes);
    if (d->capacity && bytes > d->capacity) /* the rest of the budget check is under the lock */
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY,
                          "host alloc: %zu bytes (%s) asked, device memory budget %zu bytes",
                          bytes, zero_mem_category_name(category), d->capacity);
    s.raw = zero__alloc(&d->allocator, total);
    if (!s.raw)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host alloc: %zu bytes (%s) failed", bytes,
                          zero_mem_category_name(category));
    s.ptr = (void *)(((uintptr_t)s.raw + 63u) & ~(uintptr_t)63u);
    s.bytes = bytes;
    s.category = category;
    rc = pthread_mutex_lock(&d->mu);
    if (rc != 0) {
        zero__free(&d->allocator, s.raw);
        return zero__fail(ZERO_ERROR_DEVICE, "host alloc: pthread_mutex_lock failed: %s", strerror(rc));
    }
    if (zero__host_grow(d) != 0) {
        pthread_mutex_unlock(&d->mu);
        zero__free(&d->allocator, s.raw);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host alloc: out of memory for the allocation table");
    }
    if (d->capacity && (bytes > d->capacity || d->live > d->capacity - bytes)) {
        size_t live = d->live;
        pthread_mutex_unlock(&d->mu);
        zero__free(&d->allocator, s.raw);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY,
                          "host alloc: %zu bytes (%s) asked, device memory budget %zu bytes "
                          "(%zu in use)",
                          bytes, zero_mem_category_name(category), d->capacity, live);
    }
    zero__host_put(d->table, d->cap, &s);
    d->count++;
    d->bytes[category] += bytes;
    d->live += bytes;
    pthread_mutex_unlock(&d->mu);
    *out = s.ptr;
    return ZERO_OK;
}

static zero_result zero__host_free(zero_device *dev, void *ptr)
{
    zero__host_device *d = zero__host_get(dev);
    zero__host_slot s;
    size_t i;
    int rc;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host free: dev is not a host device");
    if (!ptr) return ZERO_OK;
    rc = pthread_mutex_lock(&d->mu);
    if (rc != 0)
        return zero__fail(ZERO_ERROR_DEVICE, "host free: pthread_mutex_lock failed: %s", strerror(rc));
    i = zero__host_find(d, ptr);
    if (i == (size_t)-1) {
        pthread_mutex_unlock(&d->mu);
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "host free: %p was not allocated by this device (or was freed already)", ptr);
    }
    s = d->table[i];
    zero__host_remove(d, i);
    d->count--;
    d->bytes[s.category] -= s.bytes;
    d->live -= s.bytes;
    pthread_mutex_unlock(&d->mu);
    zero__free(&d->allocator, s.raw);
    return ZERO_OK;
}

/* ---- queues and events: everything has already happened ---- */

static zero_result zero__host_event_create(zero_device *dev, zero_event **out)
{
    zero__host_device *d = zero__host_get(dev);
    zero_event *ev;
    if (out) *out = NULL;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host event_create: dev is not a host device");
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host event_create: out is NULL");
    ev = (zero_event *)zero__alloc(&d->allocator, sizeof *ev);
    if (!ev) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "host event_create: out of memory");
    ev->magic = ZERO__HOST_EVENT_MAGIC;
    ev->dev = dev;
    *out = ev;
    return ZERO_OK;
}

static void zero__host_event_destroy(zero_device *dev, zero_event *ev)
{
    zero__host_device *d = zero__host_get(dev);
    if (!d || !ev || ev->magic != ZERO__HOST_EVENT_MAGIC || ev->dev != dev) return;
    ev->magic = 0;
    zero__free(&d->allocator, ev);
}

static zero_result zero__host_check_event(const char *what, zero_device *dev, const zero_event *ev)
{
    if (!ev) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: event is NULL", what);
    if (ev->magic != ZERO__HOST_EVENT_MAGIC || ev->dev != dev)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: not an event of this device", what);
    return ZERO_OK;
}

static zero_result zero__host_record(zero_device *dev, zero_queue q, zero_event *ev)
{
    ZERO__HOST_ENTER("record");
    (void)d;
    return zero__host_check_event("record", dev, ev);
}

static zero_result zero__host_wait(zero_device *dev, zero_queue q, zero_event *ev)
{
    ZERO__HOST_ENTER("wait");
    (void)d;
    return zero__host_check_event("wait", dev, ev);
}

static zero_result zero__host_sync(zero_device *dev, zero_queue q)
{
    ZERO__HOST_ENTER("sync");
    (void)d;
    return ZERO_OK;
}

static void *zero__host_native_queue(zero_device *dev, zero_queue q)
{
    (void)dev;
    (void)q;
    return NULL;
}

/* ---- transfers ---- */

static zero_result zero__host_move(zero_device *dev, zero_queue q, void *dst, const void *src,
                                   size_t bytes, const char *what)
{
    ZERO__HOST_ENTER(what);
    (void)d;
    if (bytes > 0 && (!dst || !src))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host %s: %s is NULL with bytes = %zu", what,
                          dst ? "src" : "dst", bytes);
    if (bytes > 0 && dst != src) memmove(dst, src, bytes);
    return ZERO_OK;
}

static zero_result zero__host_copy(zero_device *dev, zero_queue q, void *dst, const void *src,
                                   size_t bytes)
{
    return zero__host_move(dev, q, dst, src, bytes, "copy");
}

static zero_result zero__host_upload(zero_device *dev, zero_queue q, void *dst, const void *host_src,
                                     size_t bytes)
{
    return zero__host_move(dev, q, dst, host_src, bytes, "upload");
}

static zero_result zero__host_download(zero_device *dev, zero_queue q, void *host_dst,
                                       const void *src, size_t bytes)
{
    return zero__host_move(dev, q, host_dst, src, bytes, "download");
}

static zero_result zero__host_fill_zero(zero_device *dev, zero_queue q, void *dst, size_t bytes)
{
    ZERO__HOST_ENTER("fill_zero");
    (void)d;
    if (bytes > 0 && !dst)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host fill_zero: dst is NULL with bytes = %zu", bytes);
    if (bytes > 0) memset(dst, 0, bytes);
    return ZERO_OK;
}

/* ---- blocks over threads ---- */

/* One block [begin, end) of a kernel; returns the block's result (or 0). */
typedef double (*zero__host_body)(void *ctx, size_t begin, size_t end);

typedef struct zero__host_job {
    zero__host_body body;
    void *ctx;
    size_t numel;
    size_t first, last; /* blocks [first, last) */
    double *results;    /* results[b - wave_first] */
    size_t wave_first;
} zero__host_job;

static void zero__host_job_run(const zero__host_job *j)
{
    size_t b, begin, end;
    for (b = j->first; b < j->last; b++) {
        begin = b * (size_t)ZERO_HOST_SUMSQ_BLOCK;
        end = j->numel - begin < (size_t)ZERO_HOST_SUMSQ_BLOCK ? j->numel : begin + ZERO_HOST_SUMSQ_BLOCK;
        j->results[b - j->wave_first] = j->body(j->ctx, begin, end);
    }
}

static void *zero__host_job_thread(void *arg)
{
    zero__host_job_run((const zero__host_job *)arg);
    return NULL;
}

/* Runs body over [0, numel) in blocks and returns the sum of the block results, added in
   block order starting from 0, whatever the number of threads. */
static double zero__host_for(const zero__host_device *d, size_t numel, zero__host_body body,
                             void *ctx)
{
    double results[ZERO__HOST_WAVE], total = 0.0;
    size_t nblocks = numel / ZERO_HOST_SUMSQ_BLOCK + (numel % ZERO_HOST_SUMSQ_BLOCK != 0);
    size_t want = numel / ZERO__HOST_PER_THREAD, wave, k, t, nthreads, first;
    zero__host_job jobs[64];
    pthread_t th[64];
    int started[64];
    nthreads = (size_t)(d->threads > 1 ? d->threads : 1);
    if (nthreads > want) nthreads = want ? want : 1;
    if (nthreads > 64) nthreads = 64;
    for (first = 0; first < nblocks; first += wave) {
        wave = nblocks - first < ZERO__HOST_WAVE ? nblocks - first : ZERO__HOST_WAVE;
        t = nthreads < wave ? nthreads : wave;
        for (k = 0; k < t; k++) {
            jobs[k].body = body;
            jobs[k].ctx = ctx;
            jobs[k].numel = numel;
            jobs[k].first = first + wave * k / t;
            jobs[k].last = first + wave * (k + 1) / t;
            jobs[k].results = results;
            jobs[k].wave_first = first;
        }
        /* worker k > 0 on its own thread; if a thread cannot start, the caller runs its part */
        for (k = 1; k < t; k++) started[k] = pthread_create(&th[k], NULL, zero__host_job_thread, &jobs[k]) == 0;
        zero__host_job_run(&jobs[0]);
        for (k = 1; k < t; k++) {
            if (started[k]) pthread_join(th[k], NULL);
            else zero__host_job_run(&jobs[k]);
        }
        for (k = 0; k < wave; k++) total += results[k];
    }
    return total;
}

/* ---- element kernels ---- */

typedef struct zero__host_ctx {
    const zero__host_device *d;
    void *dst;
    const void *src;
    zero_dtype dtype;
    zero_dtype src_dtype;
    float s;
} zero__host_ctx;

static double zero__host_body_cast(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    zero_convert((unsigned char *)c->dst + begin * zero_dtype_size(c->dtype), c->dtype,
                 (const unsigned char *)c->src + begin * zero_dtype_size(c->src_dtype), c->src_dtype,
                 end - begin, c->d->simd);
    return 0.0;
}

static zero_result zero__host_cast(zero_device *dev, zero_queue q, void *dst, zero_dtype dst_dtype,
                                   const void *src, zero_dtype src_dtype, size_t numel)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("cast");
    if ((r = zero__host_check_buf("cast", "dst", dst, dst_dtype, numel)) != ZERO_OK) return r;
    if ((r = zero__host_check_buf("cast", "src", src, src_dtype, numel)) != ZERO_OK) return r;
    if (dst_dtype == src_dtype || numel < 2 * (size_t)ZERO__HOST_PER_THREAD || d->threads <= 1)
        return zero_convert(dst, dst_dtype, src, src_dtype, numel, d->simd); /* memmove if same */
    c.d = d;
    c.dst = dst;
    c.src = src;
    c.dtype = dst_dtype;
    c.src_dtype = src_dtype;
    c.s = 0.0f;
    zero__host_for(d, numel, zero__host_body_cast, &c);
    return ZERO_OK;
}

/* Portable bodies of the kernels over [begin, end). The SIMD bodies below do whole vectors
   and hand the rest to these, which compute the same expression element by element. */
static void zero__host_add_portable(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t i, n, base;
    if (c->dtype == ZERO_F32) {
        float *x = (float *)c->dst;
        const float *y = (const float *)c->src;
        for (i = begin; i < end; i++) x[i] = x[i] + y[i];
    } else if (c->dtype == ZERO_F64) {
        double *x = (double *)c->dst;
        const double *y = (const double *)c->src;
        for (i = begin; i < end; i++) x[i] = x[i] + y[i];
    } else {
        float a[ZERO__HOST_TILE], b[ZERO__HOST_TILE];
        uint16_t *x = (uint16_t *)c->dst;
        const uint16_t *y = (const uint16_t *)c->src;
        for (base = begin; base < end; base += n) {
            n = end - base < ZERO__HOST_TILE ? end - base : ZERO__HOST_TILE;
            zero_convert(a, ZERO_F32, x + base, c->dtype, n, c->d->simd);
            zero_convert(b, ZERO_F32, y + base, c->dtype, n, c->d->simd);
            for (i = 0; i < n; i++) a[i] = a[i] + b[i];
            zero_convert(x + base, c->dtype, a, ZERO_F32, n, c->d->simd);
        }
    }
}

static void zero__host_scale_portable(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t i, n, base;
    float s = c->s;
    if (c->dtype == ZERO_F32) {
        float *x = (float *)c->dst;
        for (i = begin; i < end; i++) x[i] = x[i] * s;
    } else if (c->dtype == ZERO_F64) {
        double *x = (double *)c->dst, sd = (double)s;
        for (i = begin; i < end; i++) x[i] = x[i] * sd;
    } else {
        float a[ZERO__HOST_TILE];
        uint16_t *x = (uint16_t *)c->dst;
        for (base = begin; base < end; base += n) {
            n = end - base < ZERO__HOST_TILE ? end - base : ZERO__HOST_TILE;
            zero_convert(a, ZERO_F32, x + base, c->dtype, n, c->d->simd);
            for (i = 0; i < n; i++) a[i] = a[i] * s;
            zero_convert(x + base, c->dtype, a, ZERO_F32, n, c->d->simd);
        }
    }
}

/* Non-zero when [begin, end) holds an inf or NaN: exponent bits all ones, as integers. */
static unsigned zero__host_nonfinite_portable(const zero__host_ctx *c, size_t begin, size_t end)
{
    const unsigned char *x = (const unsigned char *)c->src;
    size_t i;
    unsigned bad = 0;
    if (c->dtype == ZERO_F32) {
        for (i = begin; i < end; i++) {
            uint32_t u;
            memcpy(&u, x + 4 * i, 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
    } else if (c->dtype == ZERO_F64) {
        for (i = begin; i < end; i++) {
            uint64_t u;
            memcpy(&u, x + 8 * i, 8);
            bad |= (u & 0x7ff0000000000000ull) == 0x7ff0000000000000ull;
        }
    } else {
        uint16_t mask = c->dtype == ZERO_F16 ? 0x7c00u : 0x7f80u;
        for (i = begin; i < end; i++) {
            uint16_t u;
            memcpy(&u, x + 2 * i, 2);
            bad |= (u & mask) == mask;
        }
    }
    return bad;
}

/* Adds x[i]^2 for i in [begin, end) into lane[i mod 8], in order of i: exact products for
   fp32/fp16/bf16 (so an fma gives the same bits), fma for fp64. */
static void zero__host_sumsq_portable(const zero__host_ctx *c, size_t begin, size_t end, double *lane)
{
    size_t i, n, base;
    if (c->dtype == ZERO_F64) {
        const double *x = (const double *)c->src;
        for (i = begin; i < end; i++) lane[i & 7] = fma(x[i], x[i], lane[i & 7]);
    } else {
        float t[ZERO__HOST_TILE];
        const float *x;
        for (base = begin; base < end; base += n) {
            n = end - base < ZERO__HOST_TILE ? end - base : ZERO__HOST_TILE;
            if (c->dtype == ZERO_F32) {
                x = (const float *)c->src + base;
            } else {
                zero_convert(t, ZERO_F32, (const uint16_t *)c->src + base, c->dtype, n, c->d->simd);
                x = t;
            }
            for (i = 0; i < n; i++) lane[(base + i) & 7] += (double)x[i] * (double)x[i];
        }
    }
}

#ifdef ZERO__X86_SIMD
/* AVX2 and AVX-512 bodies for fp32/fp16/bf16 (fp64 stays portable). Each returns the first
   index it did not do. GCC 12's AVX-512 headers make g++ warn "__Y may be used
   uninitialized" inside _mm512_undefined_*() (GCC PR 105593, fixed in 13): silenced here. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ZERO__HOST_POP_DIAGNOSTIC 1
#endif
ZERO__AVX2 static inline __m256 zero__host_ld8(zero_dtype dt, const unsigned char *p)
{
    if (dt == ZERO_F32) return _mm256_loadu_ps((const float *)(const void *)p);
    if (dt == ZERO_F16) return zero__ld_f16x8_avx2(p);
    return zero__ld_bf16x8_avx2(p);
}

ZERO__AVX2 static inline void zero__host_st8(zero_dtype dt, unsigned char *p, __m256 x)
{
    if (dt == ZERO_F32) _mm256_storeu_ps((float *)(void *)p, x);
    else if (dt == ZERO_F16) zero__st_f16x8_avx2(p, x);
    else zero__st_bf16x8_avx2(p, x);
}

ZERO__AVX2 static size_t zero__host_add_avx2(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    const unsigned char *y = (const unsigned char *)c->src;
    for (i = begin; i + 8 <= end; i += 8)
        zero__host_st8(c->dtype, x + i * es,
                       _mm256_add_ps(zero__host_ld8(c->dtype, x + i * es), zero__host_ld8(c->dtype, y + i * es)));
    return i;
}

ZERO__AVX2 static size_t zero__host_scale_avx2(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    __m256 s = _mm256_set1_ps(c->s);
    for (i = begin; i + 8 <= end; i += 8)
        zero__host_st8(c->dtype, x + i * es, _mm256_mul_ps(zero__host_ld8(c->dtype, x + i * es), s));
    return i;
}

ZERO__AVX2 static size_t zero__host_nonfinite_avx2(const zero__host_ctx *c, size_t begin, size_t end,
                                                   unsigned *bad)
{
    const unsigned char *x = (const unsigned char *)c->src;
    __m256i any = _mm256_setzero_si256(), m, v;
    size_t i;
    if (c->dtype == ZERO_F32) {
        m = _mm256_set1_epi32(0x7f800000);
        for (i = begin; i + 8 <= end; i += 8) {
            v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + 4 * i)), m);
            any = _mm256_or_si256(any, _mm256_cmpeq_epi32(v, m));
        }
    } else {
        m = _mm256_set1_epi16((short)(c->dtype == ZERO_F16 ? 0x7c00 : 0x7f80));
        for (i = begin; i + 16 <= end; i += 16) {
            v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + 2 * i)), m);
            any = _mm256_or_si256(any, _mm256_cmpeq_epi16(v, m));
        }
    }
    *bad |= !_mm256_testz_si256(any, any);
    return i;
}

ZERO__AVX2 static size_t zero__host_sumsq_avx2(const zero__host_ctx *c, size_t begin, size_t end,
                                               double *lane)
{
    size_t es = zero_dtype_size(c->dtype), i;
    const unsigned char *x = (const unsigned char *)c->src;
    __m256d a0 = _mm256_loadu_pd(lane), a1 = _mm256_loadu_pd(lane + 4), lo, hi;
    __m256 v;
    for (i = begin; i + 8 <= end; i += 8) { /* lanes 0-3 in a0, 4-7 in a1 (begin = 0 mod 8) */
        v = zero__host_ld8(c->dtype, x + i * es);
        lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        a0 = _mm256_fmadd_pd(lo, lo, a0);
        a1 = _mm256_fmadd_pd(hi, hi, a1);
    }
    _mm256_storeu_pd(lane, a0);
    _mm256_storeu_pd(lane + 4, a1);
    return i;
}

ZERO__AVX512 static inline __m512 zero__host_ld16(zero_dtype dt, const unsigned char *p)
{
    if (dt == ZERO_F32) return _mm512_loadu_ps(p);
    if (dt == ZERO_F16) return zero__ld_f16x16_avx512(p);
    return zero__ld_bf16x16_avx512(p);
}

ZERO__AVX512 static inline void zero__host_st16(zero_dtype dt, unsigned char *p, __m512 x)
{
    if (dt == ZERO_F32) _mm512_storeu_ps(p, x);
    else if (dt == ZERO_F16) zero__st_f16x16_avx512(p, x);
    else zero__st_bf16x16_avx512(p, x);
}

ZERO__AVX512 static size_t zero__host_add_avx512(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    const unsigned char *y = (const unsigned char *)c->src;
    for (i = begin; i + 16 <= end; i += 16)
        zero__host_st16(c->dtype, x + i * es,
                        _mm512_add_ps(zero__host_ld16(c->dtype, x + i * es), zero__host_ld16(c->dtype, y + i * es)));
    return i;
}

ZERO__AVX512 static size_t zero__host_scale_avx512(const zero__host_ctx *c, size_t begin, size_t end)
{
    size_t es = zero_dtype_size(c->dtype), i;
    unsigned char *x = (unsigned char *)c->dst;
    __m512 s = _mm512_set1_ps(c->s);
    for (i = begin; i + 16 <= end; i += 16)
        zero__host_st16(c->dtype, x + i * es, _mm512_mul_ps(zero__host_ld16(c->dtype, x + i * es), s));
    return i;
}

ZERO__AVX512 static size_t zero__host_nonfinite_avx512(const zero__host_ctx *c, size_t begin, size_t end,
                                                       unsigned *bad)
{
    const unsigned char *x = (const unsigned char *)c->src;
    __m512i m, v;
    size_t i;
    unsigned any = 0;
    if (c->dtype == ZERO_F32) {
        m = _mm512_set1_epi32(0x7f800000);
        for (i = begin; i + 16 <= end; i += 16) {
            v = _mm512_and_si512(_mm512_loadu_si512(x + 4 * i), m);
            any |= (unsigned)_mm512_cmpeq_epi32_mask(v, m);
        }
    } else {
        m = _mm512_set1_epi16((short)(c->dtype == ZERO_F16 ? 0x7c00 : 0x7f80));
        for (i = begin; i + 32 <= end; i += 32) {
            v = _mm512_and_si512(_mm512_loadu_si512(x + 2 * i), m);
            any |= _mm512_cmpeq_epi16_mask(v, m) != 0;
        }
    }
    *bad |= any != 0;
    return i;
}

ZERO__AVX512 static size_t zero__host_sumsq_avx512(const zero__host_ctx *c, size_t begin, size_t end,
                                                   double *lane)
{
    size_t es = zero_dtype_size(c->dtype), i;
    const unsigned char *x = (const unsigned char *)c->src;
    __m512d a = _mm512_loadu_pd(lane), lo, hi;
    __m512 v;
    for (i = begin; i + 16 <= end; i += 16) { /* lane k: element i + k, then i + 8 + k */
        v = zero__host_ld16(c->dtype, x + i * es);
        lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a = _mm512_fmadd_pd(lo, lo, a);
        a = _mm512_fmadd_pd(hi, hi, a);
    }
    _mm512_storeu_pd(lane, a);
    return i;
}

#ifdef ZERO__HOST_POP_DIAGNOSTIC
#pragma GCC diagnostic pop
#undef ZERO__HOST_POP_DIAGNOSTIC
#endif

#define ZERO__HOST_SIMD(c, avx2_call, avx512_call, i)                                          \
    do {                                                                                      \
        if ((c)->dtype != ZERO_F64 && (c)->d->simd == ZERO_SIMD_AVX512) i = avx512_call;     \
        else if ((c)->dtype != ZERO_F64 && (c)->d->simd == ZERO_SIMD_AVX2) i = avx2_call;    \
    } while (0)
#else
#define ZERO__HOST_SIMD(c, avx2_call, avx512_call, i) (void)0
#endif

static double zero__host_body_add(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    size_t i = begin;
    ZERO__HOST_SIMD(c, zero__host_add_avx2(c, begin, end), zero__host_add_avx512(c, begin, end), i);
    zero__host_add_portable(c, i, end);
    return 0.0;
}

static zero_result zero__host_add(zero_device *dev, zero_queue q, void *dst, const void *src,
                                  zero_dtype dtype, size_t numel)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("add");
    if ((r = zero__host_check_buf("add", "dst", dst, dtype, numel)) != ZERO_OK) return r;
    if ((r = zero__host_check_buf("add", "src", src, dtype, numel)) != ZERO_OK) return r;
    memset(&c, 0, sizeof c);
    c.d = d;
    c.dst = dst;
    c.src = src;
    c.dtype = dtype;
    zero__host_for(d, numel, zero__host_body_add, &c);
    return ZERO_OK;
}

static double zero__host_body_scale(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    size_t i = begin;
    ZERO__HOST_SIMD(c, zero__host_scale_avx2(c, begin, end), zero__host_scale_avx512(c, begin, end), i);
    zero__host_scale_portable(c, i, end);
    return 0.0;
}

static zero_result zero__host_scale(zero_device *dev, zero_queue q, void *x, zero_dtype dtype,
                                    size_t numel, float s)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("scale");
    if ((r = zero__host_check_buf("scale", "x", x, dtype, numel)) != ZERO_OK) return r;
    memset(&c, 0, sizeof c);
    c.d = d;
    c.dst = x;
    c.dtype = dtype;
    c.s = s;
    zero__host_for(d, numel, zero__host_body_scale, &c);
    return ZERO_OK;
}

static double zero__host_body_nonfinite(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    size_t i = begin;
    unsigned bad = 0;
    ZERO__HOST_SIMD(c, zero__host_nonfinite_avx2(c, begin, end, &bad),
                    zero__host_nonfinite_avx512(c, begin, end, &bad), i);
    bad |= zero__host_nonfinite_portable(c, i, end);
    return bad ? 1.0 : 0.0;
}

static zero_result zero__host_nonfinite(zero_device *dev, zero_queue q, const void *x,
                                        zero_dtype dtype, size_t numel, float *flag)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("nonfinite");
    if ((r = zero__host_check_buf("nonfinite", "x", x, dtype, numel)) != ZERO_OK) return r;
    if (!flag) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host nonfinite: flag is NULL");
    memset(&c, 0, sizeof c);
    c.d = d;
    c.src = x;
    c.dtype = dtype;
    if (zero__host_for(d, numel, zero__host_body_nonfinite, &c) > 0.0) *flag = 1.0f;
    return ZERO_OK;
}

/* The sum of squares of one block in fp64: lane k adds x[i]^2 for i = k mod 8 in order of
   i, then ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)). Blocks start at multiples of 8 and the
   vector bodies stop at one, so the lanes follow the global index on every path. */
static double zero__host_body_sumsq(void *p, size_t begin, size_t end)
{
    const zero__host_ctx *c = (const zero__host_ctx *)p;
    double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = begin;
    ZERO__HOST_SIMD(c, zero__host_sumsq_avx2(c, begin, end, lane), zero__host_sumsq_avx512(c, begin, end, lane), i);
    zero__host_sumsq_portable(c, i, end, lane);
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

static zero_result zero__host_sumsq(zero_device *dev, zero_queue q, const void *x, zero_dtype dtype,
                                    size_t numel, double *acc)
{
    zero__host_ctx c;
    zero_result r;
    ZERO__HOST_ENTER("sumsq");
    if ((r = zero__host_check_buf("sumsq", "x", x, dtype, numel)) != ZERO_OK) return r;
    if (!acc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host sumsq: acc is NULL");
    memset(&c, 0, sizeof c);
    c.d = d;
    c.src = x;
    c.dtype = dtype;
    *acc += zero__host_for(d, numel, zero__host_body_sumsq, &c);
    return ZERO_OK;
}

static zero_result zero__host_grad_mul(zero_device *dev, zero_queue q, const double *sumsq,
                                       const float *nonfinite, float unscale, float clip_norm,
                                       float *out)
{
    ZERO__HOST_ENTER("grad_mul");
    (void)d;
    if (!sumsq || !nonfinite || !out)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host grad_mul: %s is NULL",
                          !sumsq ? "sumsq" : !nonfinite ? "nonfinite" : "out");
    zero_grad_mul(*sumsq, *nonfinite, unscale, clip_norm, &out[0], &out[1]);
    return ZERO_OK;
}

static zero_result zero__host_adam(zero_device *dev, zero_queue q, const zero_adam_range *range,
                                   const zero_adam_coefs *coefs, const float *grad_mul,
                                   const float *skip)
{
    ZERO__HOST_ENTER("adam");
    if (!range || !coefs || !grad_mul)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host adam: %s is NULL",
                          !range ? "range" : !coefs ? "coefs" : "grad_mul");
    if (skip && *skip != 0.0f) return ZERO_OK;
    return zero_adam_host(range, coefs, *grad_mul, d->simd, d->threads);
}

static zero_result zero__host_quantize(zero_device *dev, zero_queue q, void *dst, const void *src,
                                       zero_dtype src_dtype, size_t numel, int bits, size_t block)
{
    ZERO__HOST_ENTER("quantize");
    (void)d;
    return zero_quantize(dst, src, src_dtype, numel, bits, block);
}

static zero_result zero__host_dequantize(zero_device *dev, zero_queue q, void *dst,
                                         zero_dtype dst_dtype, const void *src, size_t src_stride,
                                         int count, size_t numel, int bits, size_t block)
{
    ZERO__HOST_ENTER("dequantize");
    (void)d;
    return zero_dequantize_sum(dst, dst_dtype, src, src_stride, count, numel, bits, block);
}

/* The budget (0 = none: the capacity reported is SIZE_MAX) and the live bytes. */
static zero_result zero__host_memory_info(zero_device *dev, size_t *capacity, size_t *used)
{
    zero__host_device *d = zero__host_get(dev);
    size_t live;
    int rc;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "host memory_info: dev is not a host device");
    rc = pthread_mutex_lock(&d->mu);
    if (rc != 0)
        return zero__fail(ZERO_ERROR_DEVICE, "host memory_info: pthread_mutex_lock failed: %s", strerror(rc));
    live = d->live;
    pthread_mutex_unlock(&d->mu);
    if (capacity) *capacity = d->capacity ? d->capacity : (size_t)-1;
    if (used) *used = live;
    return ZERO_OK;
}

/* ---- lifetime ---- */

static void zero__host_destroy(zero_device *dev)
{
    zero__host_device *d = zero__host_get(dev);
    zero_allocator a;
    size_t i;
    if (!d) return;
    a = d->allocator;
    for (i = 0; i < d->cap; i++)
        if (d->table[i].ptr) zero__free(&a, d->table[i].raw);
    zero__free(&a, d->table);
    pthread_mutex_destroy(&d->mu);
    d->base.impl = NULL;
    zero__free(&a, d);
}

static const zero_device_ops zero__host_ops = {
    "host",
    zero__host_destroy,
    zero__host_alloc,
    zero__host_free,
    NULL, /* reserve: nothing to gain from one arena on the host */
    zero__host_event_create,
    zero__host_event_destroy,
    zero__host_record,
    zero__host_wait,
    zero__host_sync,
    zero__host_native_queue,
    zero__host_copy,
    zero__host_upload,
    zero__host_download,
    zero__host_fill_zero,
    zero__host_cast,
    zero__host_add,
    zero__host_scale,
    zero__host_nonfinite,
    zero__host_sumsq,
    zero__host_grad_mul,
    zero__host_adam,
    NULL, /* host_alloc: host memory is the engine's own (the host tier) */
    NULL,
    zero__host_memory_info,
    zero__host_quantize,
    zero__host_dequantize,
};

ZERODEF zero_result zero_host_device_create(const zero_host_device_desc *desc, zero_device **out)
{
    zero_host_device_desc def;
    zero__host_device *d;
    int rc;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_create: out is NULL");
    *out = NULL;
    if (!desc) {
        memset(&def, 0, sizeof def);
        desc = &def;
    }
    if (desc->threads < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_create: threads = %d", desc->threads);
    if ((int)desc->simd < ZERO_SIMD_AUTO || (int)desc->simd > ZERO_SIMD_AVX512)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_create: simd = %d", (int)desc->simd);
    if (desc->simd != ZERO_SIMD_AUTO && desc->simd > zero__simd_cpu())
        return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_host_device_create: simd %s unavailable (best: %s)",
                          zero_simd_name(desc->simd), zero_simd_name(zero__simd_cpu()));
    if ((desc->allocator.alloc != NULL) != (desc->allocator.free != NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_host_device_create: allocator needs both alloc and free, or neither");
    d = (zero__host_device *)zero__alloc(&desc->allocator, sizeof *d);
    if (!d) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_host_device_create: out of memory");
    memset(d, 0, sizeof *d);
    rc = pthread_mutex_init(&d->mu, NULL);
    if (rc != 0) {
        zero__free(&desc->allocator, d);
        return zero__fail(ZERO_ERROR_DEVICE, "zero_host_device_create: pthread_mutex_init failed: %s",
                          strerror(rc));
    }
    d->allocator = desc->allocator;
    d->simd = desc->simd == ZERO_SIMD_AUTO ? zero_simd_detect() : desc->simd;
    d->threads = desc->threads > 1 ? desc->threads : 1;
    d->capacity = desc->capacity;
    d->base.ops = &zero__host_ops;
    d->base.impl = d;
    *out = &d->base;
    return ZERO_OK;
}

ZERODEF void zero_device_destroy(zero_device *dev)
{
    if (dev && dev->ops && dev->ops->destroy) dev->ops->destroy(dev);
}

ZERODEF zero_result zero_host_device_stats(zero_device *dev, size_t *bytes, size_t *allocations)
{
    zero__host_device *d = zero__host_get(dev);
    int rc;
    if (!d) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_host_device_stats: dev is not a host device");
    rc = pthread_mutex_lock(&d->mu);
    if (rc != 0)
        return zero__fail(ZERO_ERROR_DEVICE, "zero_host_device_stats: pthread_mutex_lock failed: %s",
                          strerror(rc));
    if (bytes) memcpy(bytes, d->bytes, sizeof d->bytes);
    if (allocations) *allocations = d->count;
    pthread_mutex_unlock(&d->mu);
    return ZERO_OK;
}
/* Optimizer implementation: Adam/AdamW descriptors and per-step
   constants, and the host kernel: one fused pass per element (load the gradient in its
   dtype, multiply by grad_mul, zero_adam_update(), store master/m/v and the rounded
   param), portable / AVX2+FMA / AVX-512, on 1..T threads.

   Every path computes zero_adam_update()'s operations in its order: each multiply-add is
   an fmaf / vfmadd, every other product, quotient and square root is a separate IEEE
   operation, and the vector tails call zero_adam_update() itself. So each element's bits
   depend on its own inputs only: not on the path, the thread count or its position. (A
   -ffast-math build would break this: it lets the compiler use approximate reciprocals.) */

#include <pthread.h>

ZERODEF zero_result zero_adam_desc_resolve(zero_adam_desc *out, const zero_adam_desc *in)
{
    zero_adam_desc d;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_desc_resolve: out is NULL");
    if (in) {
        d = *in;
    } else {
        memset(&d, 0, sizeof d);
    }
    if (d.mode == ZERO_ADAM_DEFAULT) d.mode = ZERO_ADAMW;
    if (d.lr == 0.0) d.lr = 1e-3;
    if (d.beta1 == 0.0) d.beta1 = 0.9;
    if (d.beta2 == 0.0) d.beta2 = 0.999;
    if (d.eps == 0.0) d.eps = 1e-8;
    if (d.mode != ZERO_ADAMW && d.mode != ZERO_ADAM)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_desc_resolve: mode = %d",
                          (int)d.mode);
    /* comparisons written so that NaN fails them */
    if (!(d.lr >= 0.0) || !isfinite(d.lr))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: lr = %g (must be finite and >= 0)", (double)d.lr);
    if (!(d.beta1 >= 0.0 && d.beta1 < 1.0))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: beta1 = %g (must be in [0, 1))", (double)d.beta1);
    if (!(d.beta2 >= 0.0 && d.beta2 < 1.0))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: beta2 = %g (must be in [0, 1))", (double)d.beta2);
    if (!(d.eps > 0.0) || !isfinite(d.eps))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: eps = %g (must be finite and > 0)", (double)d.eps);
    if (!(d.weight_decay >= 0.0) || !isfinite(d.weight_decay))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: weight_decay = %g (must be finite and >= 0)",
                          (double)d.weight_decay);
    *out = d;
    return ZERO_OK;
}

/* The constants from a resolved desc (no defaults filled: lr 0 is 0, beta1 0 is 0) and the
   learning rate lr, taken as given. fn names the caller in messages. */
static zero_result zero__adam_coefs(zero_adam_coefs *out, const zero_adam_desc *d, double lr,
                                    double weight_decay, int64_t step, const char *fn)
{
    zero_adam_coefs c;
    double t, b1, b2, wd, bc1, bc2;
    if (step < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: step = %lld (steps count from 1)", fn,
                          (long long)step);
    if (!(lr >= 0.0) || !isfinite(lr))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: lr = %g (must be finite and >= 0)", fn,
                          lr);
    if (!(weight_decay >= 0.0) || !isfinite(weight_decay))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: weight_decay = %g (must be finite and >= 0)", fn,
                          (double)weight_decay);
    t = (double)step;
    b1 = d->beta1;
    b2 = d->beta2;
    wd = weight_decay;
    bc1 = 1.0 - pow(b1, t);
    bc2 = 1.0 - pow(b2, t);
    c.beta1 = (float)b1;
    c.one_minus_beta1 = (float)(1.0 - b1);
    c.beta2 = (float)b2;
    c.one_minus_beta2 = (float)(1.0 - b2);
    c.step_size = (float)(lr / bc1);
    c.inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    c.eps = (float)d->eps;
    if (d->mode == ZERO_ADAMW) {
        c.neg_lr_wd = (float)(-(lr * wd));
        c.l2 = 0.0f;
    } else {
        c.neg_lr_wd = 0.0f;
        c.l2 = (float)wd;
    }
    if (!(c.beta1 < 1.0f) || !(c.beta2 < 1.0f) || !(c.eps > 0.0f))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: beta1 = %.17g, beta2 = %.17g, eps = %g: a beta that rounds to 1 or "
                          "an eps that rounds to 0 in fp32",
                          fn, d->beta1, d->beta2, d->eps);
    if (!isfinite(c.step_size) || !isfinite(c.inv_sqrt_bc2) || !isfinite(c.neg_lr_wd) ||
        !isfinite(c.l2))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: lr = %g, weight_decay = %g at step %lld give a coefficient that is "
                          "not finite in fp32",
                          fn, lr, weight_decay, (long long)step);
    *out = c;
    return ZERO_OK;
}

ZERODEF zero_result zero_adam_coefs_make(zero_adam_coefs *out, const zero_adam_desc *desc,
                                         double weight_decay, int64_t step)
{
    zero_adam_desc d;
    zero_result r;
    memset(&d, 0, sizeof d); /* resolve writes it on success; this quiets -O3's doubts */
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_coefs_make: out is NULL");
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_coefs_make: desc is NULL");
    r = zero_adam_desc_resolve(&d, desc);
    if (r != ZERO_OK) return r;
    return zero__adam_coefs(out, &d, d.lr, weight_decay, step, "zero_adam_coefs_make");
}

ZERODEF zero_result zero_adam_coefs_make_lr(zero_adam_coefs *out, const zero_adam_desc *desc,
                                            double lr, double weight_decay, int64_t step)
{
    zero_adam_desc d;
    zero_result r;
    memset(&d, 0, sizeof d);
    if (!out)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_coefs_make_lr: out is NULL");
    if (!desc)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_coefs_make_lr: desc is NULL");
    r = zero_adam_desc_resolve(&d, desc);
    if (r != ZERO_OK) return r;
    return zero__adam_coefs(out, &d, lr, weight_decay, step, "zero_adam_coefs_make_lr");
}

/* ---- the kernels: elements [begin, end) of one range ---- */

typedef struct zero__adam_job {
    const zero_adam_range *range;
    const zero_adam_coefs *coefs;
    float grad_mul;
    zero_simd path;
    size_t begin, end;
} zero__adam_job;

/* The element loop every path ends with (and the portable path is). */
static void zero__adam_scalar(const zero_adam_range *r, const zero_adam_coefs *c, float grad_mul,
                              size_t i, size_t end)
{
    for (; i < end; i++) {
        float g;
        switch (r->grad_dtype) {
        case ZERO_F16: g = zero_f16_to_f32(((const uint16_t *)r->grad)[i]); break;
        case ZERO_BF16: g = zero_bf16_to_f32(((const uint16_t *)r->grad)[i]); break;
        default: g = ((const float *)r->grad)[i]; break;
        }
        zero_adam_update(g * grad_mul, &r->master[i], &r->m[i], &r->v[i], c);
        if (r->param) {
            switch (r->param_dtype) {
            case ZERO_F16: ((uint16_t *)r->param)[i] = zero_f32_to_f16(r->master[i]); break;
            case ZERO_BF16: ((uint16_t *)r->param)[i] = zero_f32_to_bf16(r->master[i]); break;
            default: ((float *)r->param)[i] = r->master[i]; break;
            }
        }
    }
}

#ifdef ZERO__X86_SIMD

/* GCC 12's AVX-512 headers make C++ -O2 warn "__Y may be used uninitialized" inside
   _mm512_undefined_*() (GCC PR 105593, fixed in GCC 13): a false positive. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define ZERO__ADAM_POP_DIAGNOSTIC 1
#endif

/* The vector bodies take the dtypes as constants (the callers switch on them), so each
   combination compiles to its own loop with no per-vector branch. pk 0 = no param. */
#define ZERO__ADAM_NO_PARAM ((zero_dtype)0)

/* zero_adam_update on 8 lanes: the constants broadcast once per range, then the same
   operations in the same order as the scalar element (so every path gives the same bits). */
typedef struct zero__adam_k8 {
    __m256 gm, l2, omb1, b2, omb2, ibc2, eps, nlwd, nstep;
} zero__adam_k8;

ZERO__AVX2 static inline __attribute__((always_inline)) zero__adam_k8
zero__adam_k8_make(const zero_adam_coefs *c, float grad_mul)
{
    zero__adam_k8 k;
    k.gm = _mm256_set1_ps(grad_mul);
    k.l2 = _mm256_set1_ps(c->l2);
    k.omb1 = _mm256_set1_ps(c->one_minus_beta1);
    k.b2 = _mm256_set1_ps(c->beta2);
    k.omb2 = _mm256_set1_ps(c->one_minus_beta2);
    k.ibc2 = _mm256_set1_ps(c->inv_sqrt_bc2);
    k.eps = _mm256_set1_ps(c->eps);
    k.nlwd = _mm256_set1_ps(c->neg_lr_wd);
    k.nstep = _mm256_set1_ps(-c->step_size);
    return k;
}

/* g: the raw gradient; p, m, v in; the new master returned, the new m, v in *mo, *vo. */
ZERO__AVX2 static inline __attribute__((always_inline)) __m256
zero__adam_x8_avx2(const zero__adam_k8 *k, __m256 g, __m256 p, __m256 m, __m256 v, __m256 *mo, __m256 *vo)
{
    __m256 mm, vv, denom, pp;
    g = _mm256_mul_ps(g, k->gm);                                       /* g * grad_mul */
    g = _mm256_fmadd_ps(k->l2, p, g);                                  /* fmaf(l2, p, g) */
    mm = _mm256_fmadd_ps(k->omb1, _mm256_sub_ps(g, m), m);              /* lerp */
    vv = _mm256_fmadd_ps(k->b2, v, _mm256_mul_ps(_mm256_mul_ps(k->omb2, g), g));
    denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), k->ibc2, k->eps);
    pp = _mm256_fmadd_ps(k->nlwd, p, p);                               /* fmaf(neg_lr_wd, p, p) */
    *mo = mm;
    *vo = vv;
    return _mm256_fmadd_ps(k->nstep, _mm256_div_ps(mm, denom), pp);
}

ZERO__AVX2 static inline __attribute__((always_inline)) void
zero__adam_avx2_body(const zero_adam_range *r, const zero_adam_coefs *c, float grad_mul,
                     size_t *pi, size_t end, zero_dtype gk, zero_dtype pk)
{
    const zero__adam_k8 k = zero__adam_k8_make(c, grad_mul);
    size_t i = *pi;
    for (; i + 8 <= end; i += 8) {
        __m256 g, p, mm, vv;
        if (gk == ZERO_F16) g = zero__f16x8_to_f32_avx2((const uint16_t *)r->grad + i);
        else if (gk == ZERO_BF16) g = zero__bf16x8_to_f32_avx2((const uint16_t *)r->grad + i);
        else g = _mm256_loadu_ps((const float *)r->grad + i);
        p = zero__adam_x8_avx2(&k, g, _mm256_loadu_ps(r->master + i), _mm256_loadu_ps(r->m + i),
                               _mm256_loadu_ps(r->v + i), &mm, &vv);
        _mm256_storeu_ps(r->master + i, p);
        _mm256_storeu_ps(r->m + i, mm);
        _mm256_storeu_ps(r->v + i, vv);
        if (pk == ZERO_F16) zero__f32_to_f16x8_avx2((uint16_t *)r->param + i, p);
        else if (pk == ZERO_BF16) zero__f32_to_bf16x8_avx2((uint16_t *)r->param + i, p);
        else if (pk == ZERO_F32) _mm256_storeu_ps((float *)r->param + i, p);
    }
    *pi = i;
}

ZERO__AVX512 static inline __attribute__((always_inline)) void
zero__adam_avx512_body(const zero_adam_range *r, const zero_adam_coefs *c, float grad_mul,
                       size_t *pi, size_t end, zero_dtype gk, zero_dtype pk)
{
    const __m512 gm = _mm512_set1_ps(grad_mul), l2 = _mm512_set1_ps(c->l2);
    const __m512 omb1 = _mm512_set1_ps(c->one_minus_beta1);
    const __m512 b2 = _mm512_set1_ps(c->beta2), omb2 = _mm512_set1_ps(c->one_minus_beta2);
    const __m512 ibc2 = _mm512_set1_ps(c->inv_sqrt_bc2), eps = _mm512_set1_ps(c->eps);
    const __m512 nlwd = _mm512_set1_ps(c->neg_lr_wd), nstep = _mm512_set1_ps(-c->step_size);
    size_t i = *pi;
    for (; i + 16 <= end; i += 16) {
        __m512 g, p, m, v, mm, vv, denom, pp;
        if (gk == ZERO_F16) g = zero__f16x16_to_f32_avx512((const uint16_t *)r->grad + i);
        else if (gk == ZERO_BF16) g = zero__bf16x16_to_f32_avx512((const uint16_t *)r->grad + i);
        else g = _mm512_loadu_ps((const float *)r->grad + i);
        p = _mm512_loadu_ps(r->master + i);
        m = _mm512_loadu_ps(r->m + i);
        v = _mm512_loadu_ps(r->v + i);
        g = _mm512_mul_ps(g, gm);
        g = _mm512_fmadd_ps(l2, p, g);
        mm = _mm512_fmadd_ps(omb1, _mm512_sub_ps(g, m), m);
        vv = _mm512_fmadd_ps(b2, v, _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
        denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), ibc2, eps);
        pp = _mm512_fmadd_ps(nlwd, p, p);
        p = _mm512_fmadd_ps(nstep, _mm512_div_ps(mm, denom), pp);
        _mm512_storeu_ps(r->master + i, p);
        _mm512_storeu_ps(r->m + i, mm);
        _mm512_storeu_ps(r->v + i, vv);
        if (pk == ZERO_F16) zero__f32_to_f16x16_avx512((uint16_t *)r->param + i, p);
        else if (pk == ZERO_BF16) zero__f32_to_bf16x16_avx512((uint16_t *)r->param + i, p);
        else if (pk == ZERO_F32) _mm512_storeu_ps((float *)r->param + i, p);
    }
    *pi = i;
}

/* One case per (grad dtype, param dtype) pair, each a constant-folded copy of the body. */
#define ZERO__ADAM_DISPATCH(body)                                                            \
    do {                                                                                     \
        zero_dtype pk_ = r->param ? r->param_dtype : ZERO__ADAM_NO_PARAM;                    \
        switch (r->grad_dtype * 8 + pk_) {                                                   \
        case ZERO_F32 * 8 + 0: body(r, c, grad_mul, &i, end, ZERO_F32, ZERO__ADAM_NO_PARAM); break; \
        case ZERO_F32 * 8 + ZERO_F32: body(r, c, grad_mul, &i, end, ZERO_F32, ZERO_F32); break;    \
        case ZERO_F32 * 8 + ZERO_F16: body(r, c, grad_mul, &i, end, ZERO_F32, ZERO_F16); break;    \
        case ZERO_F32 * 8 + ZERO_BF16: body(r, c, grad_mul, &i, end, ZERO_F32, ZERO_BF16); break;  \
        case ZERO_F16 * 8 + 0: body(r, c, grad_mul, &i, end, ZERO_F16, ZERO__ADAM_NO_PARAM); break; \
        case ZERO_F16 * 8 + ZERO_F32: body(r, c, grad_mul, &i, end, ZERO_F16, ZERO_F32); break;    \
        case ZERO_F16 * 8 + ZERO_F16: body(r, c, grad_mul, &i, end, ZERO_F16, ZERO_F16); break;    \
        case ZERO_F16 * 8 + ZERO_BF16: body(r, c, grad_mul, &i, end, ZERO_F16, ZERO_BF16); break;  \
        case ZERO_BF16 * 8 + 0: body(r, c, grad_mul, &i, end, ZERO_BF16, ZERO__ADAM_NO_PARAM); break; \
        case ZERO_BF16 * 8 + ZERO_F32: body(r, c, grad_mul, &i, end, ZERO_BF16, ZERO_F32); break;  \
        case ZERO_BF16 * 8 + ZERO_F16: body(r, c, grad_mul, &i, end, ZERO_BF16, ZERO_F16); break;  \
        case ZERO_BF16 * 8 + ZERO_BF16: body(r, c, grad_mul, &i, end, ZERO_BF16, ZERO_BF16); break; \
        default: break; /* validated by zero_adam_host: cannot happen */                      \
        }                                                                                    \
    } while (0)

ZERO__AVX2 static void zero__adam_avx2(const zero_adam_range *r, const zero_adam_coefs *c,
                                       float grad_mul, size_t begin, size_t end)
{
    size_t i = begin;
    ZERO__ADAM_DISPATCH(zero__adam_avx2_body);
    zero__adam_scalar(r, c, grad_mul, i, end);
}

ZERO__AVX512 static void zero__adam_avx512(const zero_adam_range *r, const zero_adam_coefs *c,
                                           float grad_mul, size_t begin, size_t end)
{
    size_t i = begin;
    ZERO__ADAM_DISPATCH(zero__adam_avx512_body);
    zero__adam_scalar(r, c, grad_mul, i, end);
}

#ifdef ZERO__ADAM_POP_DIAGNOSTIC
#pragma GCC diagnostic pop
#undef ZERO__ADAM_POP_DIAGNOSTIC
#endif

#endif /* ZERO__X86_SIMD */

/* bf16 states (state_dtype BF16): zero_adam_update_bf16 per element (the RNG and the
   rounding are integer work; fmaf is exact wherever it runs: every path gives the same
   bits). One loop, compiled for each simd target so that fmaf and sqrtf become single
   instructions there instead of libm calls (6x faster on AVX2 than the portable build). */
#define ZERO__ADAM_BF16_LOOP(r, c, grad_mul, i, end)                                         \
    do {                                                                                     \
        uint16_t *ms_ = (uint16_t *)(void *)(r)->master, *m1_ = (uint16_t *)(void *)(r)->m,   \
                 *m2_ = (uint16_t *)(void *)(r)->v;                                          \
        for (; (i) < (end); (i)++) {                                                         \
            float g_, p_;                                                                    \
            switch ((r)->grad_dtype) {                                                       \
            case ZERO_F16: g_ = zero__f32_from_bits(zero__f16_to_f32_bits(((const uint16_t *)(r)->grad)[i])); break; \
            case ZERO_BF16: g_ = zero__f32_from_bits(zero__bf16_to_f32_bits(((const uint16_t *)(r)->grad)[i])); break; \
            default: g_ = ((const float *)(r)->grad)[i]; break;                              \
            }                                                                                \
            p_ = zero_adam_update_bf16(g_ * (grad_mul), &ms_[i], &m1_[i], &m2_[i], (c),      \
                                       zero_sr_bits((r)->sr_key, (r)->sr_index + (i)));      \
            if ((r)->param) {                                                                \
                switch ((r)->param_dtype) {                                                  \
                case ZERO_F16: ((uint16_t *)(r)->param)[i] = zero__f32_to_f16_bits(zero__f32_bits(p_)); break; \
                case ZERO_BF16: ((uint16_t *)(r)->param)[i] = zero__f32_to_bf16_bits(zero__f32_bits(p_)); break; \
                default: ((float *)(r)->param)[i] = p_; break;                               \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
    } while (0)

static void zero__adam_bf16(const zero_adam_range *r, const zero_adam_coefs *c, float grad_mul,
                            size_t i, size_t end)
{
    ZERO__ADAM_BF16_LOOP(r, c, grad_mul, i, end);
}

#ifdef ZERO__X86_SIMD
/* The same on AVX2, 8 elements a vector, bit-identical to the loop: the fp32 math is the
   fp32 body's (the same operations in the same order as zero_adam_update); the RNG is
   splitmix64 on 4 u64 lanes (a 64-bit product from three 32x32 -> 64 products); the
   rounding and the NaN rule are zero_bf16_bits_sr's on 8 u32 lanes. */
ZERO__AVX2 static inline __m256i zero__mul64_avx2(__m256i a, uint64_t b)
{
    const __m256i bl = _mm256_set1_epi64x((long long)(b & 0xffffffffu)),
                  bh = _mm256_set1_epi64x((long long)(b >> 32));
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), bl),
                                     _mm256_mul_epu32(a, bh));
    return _mm256_add_epi64(_mm256_mul_epu32(a, bl), _mm256_slli_epi64(cross, 32));
}

ZERO__AVX2 static inline __m256i zero__sr_mix_avx2(__m256i x)
{
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 30));
    x = zero__mul64_avx2(x, 0xbf58476d1ce4e5b9ull);
    x = _mm256_xor_si256(x, _mm256_srli_epi64(x, 27));
    x = zero__mul64_avx2(x, 0x94d049bb133111ebull);
    return _mm256_xor_si256(x, _mm256_srli_epi64(x, 31));
}

/* fp32 results -> bf16 bits, stochastically with the 16 random bits in each lane of r. */
ZERO__AVX2 static inline __m128i zero__bf16x8_sr_avx2(__m256 f, __m256i r)
{
    __m256i x = _mm256_castps_si256(f);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    __m256i up = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_and_si256(r, _mm256_set1_epi32(0xffff))), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    x = _mm256_blendv_epi8(up, q, nan); /* every lane <= 0xffff: the pack does not saturate */
    x = _mm256_permute4x64_epi64(_mm256_packus_epi32(x, x), 0x08);
    return _mm256_castsi256_si128(x);
}

ZERO__AVX2 static inline __attribute__((always_inline)) void
zero__adam_bf16_avx2_body(const zero_adam_range *r, const zero_adam_coefs *c, float grad_mul,
                          size_t *pi, size_t end, zero_dtype gk, zero_dtype pk)
{
    const zero__adam_k8 k = zero__adam_k8_make(c, grad_mul);
    const uint64_t gold = 0x9e3779b97f4a7c15ull;
    const __m256i lanes = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m256i step8 = _mm256_set1_epi64x((long long)(8 * gold));
    uint16_t *ms = (uint16_t *)(void *)r->master, *m1 = (uint16_t *)(void *)r->m,
             *m2 = (uint16_t *)(void *)r->v;
    size_t i = *pi;
    /* the RNG's counters key + (index + 1) * gold for elements i .. i + 7, advanced by 8 */
    uint64_t k0 = r->sr_key + (r->sr_index + i + 1) * gold;
    __m256i ca = _mm256_setr_epi64x((long long)k0, (long long)(k0 + gold),
                                    (long long)(k0 + 2 * gold), (long long)(k0 + 3 * gold));
    __m256i cb = _mm256_add_epi64(ca, _mm256_set1_epi64x((long long)(4 * gold)));
    for (; i + 8 <= end; i += 8) {
        __m256 g, p, mm, vv;
        __m256i ba, bb, lo, hi;
        if (gk == ZERO_F16) g = zero__f16x8_to_f32_avx2((const uint16_t *)r->grad + i);
        else if (gk == ZERO_BF16) g = zero__bf16x8_to_f32_avx2((const uint16_t *)r->grad + i);
        else g = _mm256_loadu_ps((const float *)r->grad + i);
        p = zero__adam_x8_avx2(&k, g, zero__ld_bf16x8_avx2(ms + i), zero__ld_bf16x8_avx2(m1 + i),
                               zero__ld_bf16x8_avx2(m2 + i), &mm, &vv);
        /* 64 random bits per element; lo = their low halves in element order, hi = high */
        ba = _mm256_permutevar8x32_epi32(zero__sr_mix_avx2(ca), lanes);
        bb = _mm256_permutevar8x32_epi32(zero__sr_mix_avx2(cb), lanes);
        lo = _mm256_permute2x128_si256(ba, bb, 0x20);
        hi = _mm256_permute2x128_si256(ba, bb, 0x31);
        ca = _mm256_add_epi64(ca, step8);
        cb = _mm256_add_epi64(cb, step8);
        _mm_storeu_si128((__m128i *)(void *)(ms + i), zero__bf16x8_sr_avx2(p, lo));
        _mm_storeu_si128((__m128i *)(void *)(m1 + i), zero__bf16x8_sr_avx2(mm, _mm256_srli_epi32(lo, 16)));
        _mm_storeu_si128((__m128i *)(void *)(m2 + i), zero__bf16x8_sr_avx2(vv, hi));
        if (pk != ZERO__ADAM_NO_PARAM) {
            p = zero__ld_bf16x8_avx2(ms + i); /* the param is the stored master */
            if (pk == ZERO_F16) zero__f32_to_f16x8_avx2((uint16_t *)r->param + i, p);
            else if (pk == ZERO_BF16) zero__f32_to_bf16x8_avx2((uint16_t *)r->param + i, p);
            else _mm256_storeu_ps((float *)r->param + i, p);
        }
    }
    *pi = i;
}

ZERO__AVX2 static void zero__adam_bf16_avx2(const zero_adam_range *r, const zero_adam_coefs *c,
                                            float grad_mul, size_t i, size_t end)
{
    ZERO__ADAM_DISPATCH(zero__adam_bf16_avx2_body);
    ZERO__ADAM_BF16_LOOP(r, c, grad_mul, i, end);
}

ZERO__AVX512 static void zero__adam_bf16_avx512(const zero_adam_range *r, const zero_adam_coefs *c,
                                                float grad_mul, size_t i, size_t end)
{
    ZERO__ADAM_BF16_LOOP(r, c, grad_mul, i, end);
}
#endif

static void zero__adam_run(const zero__adam_job *job)
{
    if (job->begin >= job->end) return;
    if (job->range->state_dtype == ZERO_BF16) {
#ifdef ZERO__X86_SIMD
        if (job->path == ZERO_SIMD_AVX512) {
            zero__adam_bf16_avx512(job->range, job->coefs, job->grad_mul, job->begin, job->end);
            return;
        }
        if (job->path == ZERO_SIMD_AVX2) {
            zero__adam_bf16_avx2(job->range, job->coefs, job->grad_mul, job->begin, job->end);
            return;
        }
#endif
        zero__adam_bf16(job->range, job->coefs, job->grad_mul, job->begin, job->end);
        return;
    }
#ifdef ZERO__X86_SIMD
    if (job->path == ZERO_SIMD_AVX512) {
        zero__adam_avx512(job->range, job->coefs, job->grad_mul, job->begin, job->end);
        return;
    }
    if (job->path == ZERO_SIMD_AVX2) {
        zero__adam_avx2(job->range, job->coefs, job->grad_mul, job->begin, job->end);
        return;
    }
#endif
    zero__adam_scalar(job->range, job->coefs, job->grad_mul, job->begin, job->end);
}

static void *zero__adam_thread(void *arg)
{
    zero__adam_run((const zero__adam_job *)arg);
    return NULL;
}

#define ZERO__ADAM_MAX_THREADS 256

ZERODEF zero_result zero_adam_host(const zero_adam_range *range, const zero_adam_coefs *coefs,
                                   float grad_mul, zero_simd simd, int threads)
{
    zero__adam_job jobs[ZERO__ADAM_MAX_THREADS];
    pthread_t tids[ZERO__ADAM_MAX_THREADS];
    int started[ZERO__ADAM_MAX_THREADS];
    zero_simd path;
    size_t n, chunk;
    int t, nthreads, join_failed = 0;
    if (!range) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_host: range is NULL");
    if (!coefs) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_host: coefs is NULL");
    n = range->numel;
    if (range->grad_dtype != ZERO_F32 && range->grad_dtype != ZERO_F16 &&
        range->grad_dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_host: grad_dtype = %d (%s): f32, f16 or bf16 only",
                          (int)range->grad_dtype, zero_dtype_name(range->grad_dtype));
    if (range->param && range->param_dtype != ZERO_F32 && range->param_dtype != ZERO_F16 &&
        range->param_dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_host: param_dtype = %d (%s): f32, f16 or bf16 only",
                          (int)range->param_dtype, zero_dtype_name(range->param_dtype));
    if (range->state_dtype != ZERO_DTYPE_DEFAULT && range->state_dtype != ZERO_F32 &&
        range->state_dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_host: state_dtype = %d (%s): f32 or bf16 only",
                          (int)range->state_dtype, zero_dtype_name(range->state_dtype));
    if (n > 0 && (!range->master || !range->m || !range->v || !range->grad))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_host: %s is NULL with numel = %zu",
                          !range->master ? "master" : !range->m ? "m" : !range->v ? "v" : "grad",
                          n);
    if ((int)simd < ZERO_SIMD_AUTO || (int)simd > ZERO_SIMD_AVX512)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_host: simd = %d", (int)simd);
    if (threads < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_host: threads = %d", threads);
    if (simd == ZERO_SIMD_AUTO) {
        path = zero_simd_detect();
    } else {
        if (simd > zero__simd_cpu())
            return zero__fail(ZERO_ERROR_UNSUPPORTED,
                              "zero_adam_host: simd %s unavailable (best here: %s)",
                              zero_simd_name(simd), zero_simd_name(zero__simd_cpu()));
        path = simd;
    }
    if (n == 0) return ZERO_OK;

    /* Contiguous chunks whose starts are multiples of 64 elements (whole cache lines of
       fp32 state when the range is aligned); no more threads than chunks. */
    nthreads = threads < 1 ? 1 : threads > ZERO__ADAM_MAX_THREADS ? ZERO__ADAM_MAX_THREADS : threads;
    if ((size_t)nthreads > (n + 63) / 64) nthreads = (int)((n + 63) / 64);
    chunk = (n / (size_t)nthreads + (n % (size_t)nthreads != 0) + 63) / 64 * 64;
    for (t = 0; t < nthreads; t++) {
        size_t b = chunk * (size_t)t, e = b + chunk;
        jobs[t].range = range;
        jobs[t].coefs = coefs;
        jobs[t].grad_mul = grad_mul;
        jobs[t].path = path;
        jobs[t].begin = b < n ? b : n;
        jobs[t].end = e < n ? e : n;
        started[t] = 0;
    }
    if (nthreads == 1) {
        zero__adam_run(&jobs[0]);
        return ZERO_OK;
    }
    /* Chunks 1..T-1 on new threads, chunk 0 here; a chunk whose thread could not start
       runs here too, so no work is lost. */
    for (t = 1; t < nthreads; t++)
        started[t] = pthread_create(&tids[t], NULL, zero__adam_thread, &jobs[t]) == 0;
    zero__adam_run(&jobs[0]);
    for (t = 1; t < nthreads; t++)
        if (!started[t]) zero__adam_run(&jobs[t]);
    for (t = 1; t < nthreads; t++)
        if (started[t] && pthread_join(tids[t], NULL) != 0) join_failed = t;
    if (join_failed)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_adam_host: pthread_join of worker %d failed", join_failed);
    return ZERO_OK;
}
/* Scaler implementation: DeepSpeed's DynamicLossScaler rule, as of DeepSpeed 0.17.1 (up
   to 0.17.0 the growth test was (iter - last_overflow_iter) % window == 0, one step
   earlier).

   overflow:    if hysteresis == 1 or cur_hysteresis == 1:
                    if error_at_min and scale == min: error, nothing changes
                    scale = max(scale / factor, min)
                else cur_hysteresis -= 1;  last_overflow_iter = iter
   no overflow: if consecutive_hysteresis: cur_hysteresis = hysteresis
                stable = iter - last_overflow_iter - 1
                if stable > 0 and stable % window == 0:
                    if not consecutive_hysteresis: cur_hysteresis = hysteresis
                    scale *= factor (kept if the product would not be finite)
   then iter += 1. */

/* The numeric defaults of a scaler descriptor (DeepSpeed's), filled in place. */
static void zero__scaler_defaults(zero_scaler_desc *d)
{
    if (d->init_scale == 0.0f) d->init_scale = 65536.0f;
    if (d->window == 0) d->window = 1000;
    if (d->hysteresis == 0) d->hysteresis = 2;
    if (d->min_scale == 0.0f) d->min_scale = 1.0f;
    if (d->factor == 0.0f) d->factor = 2.0f;
}

ZERODEF zero_result zero_scaler_init(zero_scaler *scaler, const zero_scaler_desc *desc,
                                     zero_dtype param_dtype)
{
    zero_scaler s;
    zero_scaler_desc d;
    int mode;
    if (!scaler) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_scaler_init: scaler is NULL");
    if (desc) {
        d = *desc;
    } else {
        memset(&d, 0, sizeof d);
    }
    mode = (int)d.mode;
    if (mode < ZERO_SCALER_DEFAULT || mode > ZERO_SCALER_NONE)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_scaler_init: mode = %d", mode);
    if ((int)d.at_min < ZERO_SCALER_AT_MIN_DEFAULT || (int)d.at_min > ZERO_SCALER_AT_MIN_SKIP)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_scaler_init: at_min = %d",
                          (int)d.at_min);
    if (mode == ZERO_SCALER_DEFAULT) {
        if (param_dtype == ZERO_F16)
            mode = ZERO_SCALER_DYNAMIC;
        else if (param_dtype == ZERO_BF16 || param_dtype == ZERO_F32 || param_dtype == ZERO_F64)
            mode = ZERO_SCALER_NONE;
        else
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_scaler_init: param_dtype = %d: the default mode needs a "
                              "resolved dtype (f16, bf16, f32 or f64)",
                              (int)param_dtype);
    }
    zero__scaler_defaults(&d);
    /* !(x > 0) also refuses NaN */
    if (!(d.init_scale > 0.0f) || !isfinite(d.init_scale))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: init_scale = %g (must be finite and > 0)",
                          (double)d.init_scale);
    if (d.window < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: window = %d (must be >= 1)", d.window);
    if (d.hysteresis < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: hysteresis = %d (must be >= 1)", d.hysteresis);
    if (!(d.min_scale > 0.0f) || !isfinite(d.min_scale))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: min_scale = %g (must be finite and > 0)",
                          (double)d.min_scale);
    if (!(d.factor > 1.0f) || !isfinite(d.factor))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: factor = %g (must be finite and > 1)",
                          (double)d.factor);
    if (mode == ZERO_SCALER_DYNAMIC && d.min_scale > d.init_scale)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: min_scale = %g is above init_scale = %g",
                          (double)d.min_scale, (double)d.init_scale);

    s.scale = mode == ZERO_SCALER_NONE ? 1.0f : d.init_scale;
    s.factor = d.factor;
    s.min_scale = d.min_scale;
    s.window = d.window;
    s.hysteresis = d.hysteresis;
    s.cur_hysteresis = d.hysteresis;
    s.consecutive_hysteresis = d.consecutive_hysteresis != 0;
    s.dynamic = mode == ZERO_SCALER_DYNAMIC;
    s.error_at_min = d.at_min != ZERO_SCALER_AT_MIN_SKIP;
    s.iter = 0;
    s.last_overflow_iter = -1;
    *scaler = s;
    return ZERO_OK;
}

ZERODEF zero_result zero_scaler_update(zero_scaler *scaler, int overflow)
{
    if (!scaler) return ZERO_ERROR_INVALID_ARGUMENT;
    if (scaler->dynamic) {
        if (overflow) {
            if (scaler->hysteresis == 1 || scaler->cur_hysteresis == 1) {
                float cut = scaler->scale / scaler->factor;
                if (scaler->error_at_min && scaler->scale == scaler->min_scale)
                    return ZERO_ERROR_LOSS_SCALE; /* nothing changed */
                scaler->scale = cut > scaler->min_scale ? cut : scaler->min_scale;
            } else {
                scaler->cur_hysteresis -= 1;
            }
            scaler->last_overflow_iter = scaler->iter;
        } else {
            int64_t stable = scaler->iter - scaler->last_overflow_iter - 1; /* good steps before */
            if (scaler->consecutive_hysteresis) scaler->cur_hysteresis = scaler->hysteresis;
            if (stable > 0 && stable % scaler->window == 0) {
                float grown = scaler->scale * scaler->factor;
                if (!scaler->consecutive_hysteresis) scaler->cur_hysteresis = scaler->hysteresis;
                if (isfinite(grown)) scaler->scale = grown; /* an inf scale would never recover */
            }
        }
    } else if (overflow) {
        scaler->last_overflow_iter = scaler->iter;
    }
    scaler->iter += 1;
    return ZERO_OK;
}
/* ---- CRC32C ------------------------------------------------------------------------------- */

/* The algebra (reflected bit order: bit 31 of a word is the coefficient of x^0, bit 0 that of
   x^31; P = the Castagnoli polynomial, 0x82F63B78 reflected). Without the initial and final
   inversions, the CRC register after bytes M from a start value c is
       raw(c, M) = c x^(8|M|) + M x^32   (mod P),
   linear in c and M. So raw(c, A B) = raw(c, A) x^(8|B|) + raw(0, B), and for the public
   value crc(M) = ~raw(~0, M) the inversions cancel in
       crc(A B) = crc(A) x^(8|B|) + crc(B)   (mod P):
   zero_crc32c_combine. The product needs x^(8n) mod P, built from the table of x^(2^k) by
   square and multiply: O(log n) products of 32 steps each. The SSE4.2 path runs three
   independent crc32 chains over three lanes of ZERO__CRC_LANE bytes and joins them with the
   same rule (the instruction's latency is 3 cycles, its throughput one per cycle). */

#define ZERO__CRC_POLY 0x82F63B78u
#define ZERO__CRC_LANE 8192u

static uint32_t zero__crc_tab[8][256];
static uint32_t zero__crc_x2k[64];    /* x^(2^k) mod P                          */
static uint32_t zero__crc_lane1;      /* x^(8 ZERO__CRC_LANE) mod P             */
static uint32_t zero__crc_lane2;      /* x^(16 ZERO__CRC_LANE) mod P            */
static pthread_once_t zero__crc_once = PTHREAD_ONCE_INIT;
static int zero__crc_hw;

/* a b mod P (reflected). */
static uint32_t zero__crc_mul(uint32_t a, uint32_t b)
{
    uint32_t prod = 0, bit;
    for (bit = 0x80000000u; bit != 0; bit >>= 1) { /* a's terms x^0, x^1, ..., x^31 */
        if (a & bit) prod ^= b;
        b = (b & 1u) ? (b >> 1) ^ ZERO__CRC_POLY : b >> 1; /* b = b x mod P */
    }
    return prod;
}

/* x^(8 n) mod P, n in bytes. */
static uint32_t zero__crc_xpow8(uint64_t n)
{
    uint32_t r = 0x80000000u; /* x^0 */
    int k = 3;                /* 8 n = n << 3 */
    for (; n != 0 && k < 64; n >>= 1, k++)
        if (n & 1u) r = zero__crc_mul(r, zero__crc_x2k[k]);
    return r;
}

static void zero__crc_init(void)
{
    uint32_t i, j, c;
    for (i = 0; i < 256; i++) {
        c = i;
        for (j = 0; j < 8; j++) c = (c >> 1) ^ (ZERO__CRC_POLY & (0u - (c & 1u)));
        zero__crc_tab[0][i] = c;
    }
    for (i = 0; i < 256; i++)
        for (j = 1; j < 8; j++)
            zero__crc_tab[j][i] = (zero__crc_tab[j - 1][i] >> 8) ^
                                  zero__crc_tab[0][zero__crc_tab[j - 1][i] & 0xffu];
    zero__crc_x2k[0] = 0x40000000u; /* x^1 */
    for (i = 1; i < 64; i++) zero__crc_x2k[i] = zero__crc_mul(zero__crc_x2k[i - 1], zero__crc_x2k[i - 1]);
    zero__crc_lane1 = zero__crc_xpow8(ZERO__CRC_LANE);
    zero__crc_lane2 = zero__crc_xpow8(2u * ZERO__CRC_LANE);
#ifdef ZERO__X86_SIMD
    {
        unsigned a, b, cc, d;
        if (__get_cpuid(1, &a, &b, &cc, &d)) zero__crc_hw = (cc >> 20) & 1u;
    }
    if (getenv("ZERO_CRC_PORTABLE")) zero__crc_hw = 0;
#endif
}

static uint32_t zero__crc_sw(uint32_t c, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7u)) {
        c = (c >> 8) ^ zero__crc_tab[0][(c ^ *p++) & 0xffu];
        n--;
    }
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        c = zero__crc_tab[7][lo & 0xffu] ^ zero__crc_tab[6][(lo >> 8) & 0xffu] ^
            zero__crc_tab[5][(lo >> 16) & 0xffu] ^ zero__crc_tab[4][lo >> 24] ^
            zero__crc_tab[3][hi & 0xffu] ^ zero__crc_tab[2][(hi >> 8) & 0xffu] ^
            zero__crc_tab[1][(hi >> 16) & 0xffu] ^ zero__crc_tab[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ zero__crc_tab[0][(c ^ *p++) & 0xffu];
    return c;
}

#if defined(ZERO__X86_SIMD) && defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t zero__crc_sse42(uint32_t c,
                                                                   const unsigned char *p,
                                                                   size_t n)
{
    uint64_t c64;
    while (n && ((uintptr_t)p & 7u)) {
        c = _mm_crc32_u8(c, *p++);
        n--;
    }
    c64 = c;
    while (n >= 3u * ZERO__CRC_LANE) { /* three chains: raw(c, A B C) = a x^16L + b x^8L + d */
        uint64_t a = c64, b = 0, d = 0, w0, w1, w2;
        size_t i;
        for (i = 0; i < ZERO__CRC_LANE; i += 8) {
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p + ZERO__CRC_LANE + i, 8);
            memcpy(&w2, p + 2u * ZERO__CRC_LANE + i, 8);
            a = _mm_crc32_u64(a, w0);
            b = _mm_crc32_u64(b, w1);
            d = _mm_crc32_u64(d, w2);
        }
        c64 = zero__crc_mul((uint32_t)a, zero__crc_lane2) ^ zero__crc_mul((uint32_t)b, zero__crc_lane1) ^
              (uint32_t)d;
        p += 3u * ZERO__CRC_LANE;
        n -= 3u * ZERO__CRC_LANE;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = _mm_crc32_u64(c64, w);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--) c = _mm_crc32_u8(c, *p++);
    return c;
}
#endif

ZERODEF uint32_t zero_crc32c(uint32_t crc, const void *data, size_t bytes)
{
    const unsigned char *p = (const unsigned char *)data;
    uint32_t c = ~crc;
    pthread_once(&zero__crc_once, zero__crc_init);
    if (!p || bytes == 0) return crc;
#if defined(ZERO__X86_SIMD) && defined(__x86_64__)
    if (zero__crc_hw) return ~zero__crc_sse42(c, p, bytes);
#endif
    return ~zero__crc_sw(c, p, bytes);
}

ZERODEF uint32_t zero_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t bytes_b)
{
    pthread_once(&zero__crc_once, zero__crc_init);
    return zero__crc_mul(crc_a, zero__crc_xpow8(bytes_b)) ^ crc_b;
}

/* NVMe I/O implementation: see the NVMe I/O declarations and docs/nvme.md.

   One mutex per engine guards everything: the tickets (ops), the issue queue, the slots
   and every file's range table. A ticket's bytes are cut into block_size requests lazily,
   when a slot frees up, so at most queue_depth requests are in flight. Slots hold what a
   request needs until it completes: the target, the iovec, a bounce buffer for unaligned
   pieces in O_DIRECT mode. Completions run under the lock, refill the slots and wake the
   waiters. Each request's bytes are checked outside the lock by the engine's own thread
   that completed it (the reaper, or the worker): the CRC32C of a write's piece or of a
   read's arrived piece, or a read of a declared zero range tested for zeros; the slot is
   free again (and refilled) before that check runs, and the ticket finishes when the last
   check is in. The wait joins the pieces' CRCs into the range's with the CRC-combine
   (zero_crc32c_combine: one product mod P per block), so the caller's thread never reads
   the bytes for their checksum.

   io_uring backend: the ring is set up through raw syscalls (no liburing): the queuing
   thread writes SQEs and submits them under the lock; one reaper thread waits for CQEs
   (io_uring_enter with GETEVENTS, lock released) and handles them under the lock. Threads
   backend: workers take ready slots and run pread / pwrite loops. */

ZERODEF const char *zero_io_backend_name(zero_io_backend backend)
{
    switch (backend) {
    case ZERO_IO_BACKEND_AUTO: return "auto";
    case ZERO_IO_BACKEND_IO_URING: return "io_uring";
    case ZERO_IO_BACKEND_THREADS: return "threads";
    }
    return "?";
}

/* ---- checksum: position-weighted sums (Fletcher's construction) over 8 lanes ---- */

#define ZERO__XX_P1 0x9E3779B185EBCA87ull
#define ZERO__XX_P2 0xC2B2AE3D27D4EB4Full
#define ZERO__XX_P3 0x165667B19E3779F9ull
#define ZERO__XX_P4 0x85EBCA77C2B2AE63ull

static uint64_t zero__io_mix(uint64_t h, uint64_t v)
{
    v *= ZERO__XX_P2;
    v = ((v << 31) | (v >> 33)) * ZERO__XX_P1;
    return (h ^ v) * ZERO__XX_P1 + ZERO__XX_P4;
}

/* Adds whole 32-byte stripes of p into the lanes: a[j] += word, b[j] += a[j]. Plain adds of
   independent lanes, so the compiler vectorizes the loop (SSE2 and up). */
static void zero__io_sum_stripes(const unsigned char *p, size_t stripes, uint64_t *a, uint64_t *b)
{
    uint64_t a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7];
    uint64_t b0 = b[0], b1 = b[1], b2 = b[2], b3 = b[3], b4 = b[4], b5 = b[5], b6 = b[6], b7 = b[7];
    size_t i;
    for (i = 0; i < stripes; i++, p += 32) {
        uint32_t w[8];
        int k;
        memcpy(w, p, 32);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        for (k = 0; k < 8; k++) w[k] = (w[k] >> 24) | ((w[k] >> 8) & 0xff00u) | ((w[k] << 8) & 0xff0000u) | (w[k] << 24);
#else
        (void)k;
#endif
        a0 += w[0]; b0 += a0; a1 += w[1]; b1 += a1; a2 += w[2]; b2 += a2; a3 += w[3]; b3 += a3;
        a4 += w[4]; b4 += a4; a5 += w[5]; b5 += a5; a6 += w[6]; b6 += a6; a7 += w[7]; b7 += a7;
    }
    a[0] = a0; a[1] = a1; a[2] = a2; a[3] = a3; a[4] = a4; a[5] = a5; a[6] = a6; a[7] = a7;
    b[0] = b0; b[1] = b1; b[2] = b2; b[3] = b3; b[4] = b4; b[5] = b5; b[6] = b6; b[7] = b7;
}

ZERODEF uint64_t zero_io_checksum(const void *data, size_t bytes)
{
    const unsigned char *p = (const unsigned char *)data;
    uint64_t a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0}, h;
    size_t whole = bytes / 32, rest = bytes % 32;
    int j;
    if (!data) return 0;
    zero__io_sum_stripes(p, whole, a, b);
    if (rest) { /* the last stripe, zero-padded */
        unsigned char tail[32];
        memset(tail, 0, sizeof tail);
        memcpy(tail, p + whole * 32, rest);
        zero__io_sum_stripes(tail, 1, a, b);
    }
    h = (uint64_t)bytes * ZERO__XX_P3;
    for (j = 0; j < 8; j++) {
        h = zero__io_mix(h, a[j]);
        h = zero__io_mix(h, b[j]);
    }
    h ^= h >> 33;
    h *= ZERO__XX_P2;
    h ^= h >> 29;
    h *= ZERO__XX_P3;
    h ^= h >> 32;
    return h;
}

#if defined(__linux__)

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/file.h> /* flock: a swap file's lock, held while its job lives */
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* O_DIRECT is a GNU name; the implementation may be compiled without _GNU_SOURCE. */
#ifndef O_DIRECT
#if defined(__x86_64__) || defined(__i386__)
#define O_DIRECT 040000
#elif defined(__aarch64__) || defined(__arm__)
#define O_DIRECT 0200000
#endif
#endif

/* As in the comm section: when the implementation file included a libc header before
   zero.h under -std=c99/c11, glibc hides these POSIX.1-2008 names; declare them (their
   signatures are fixed by POSIX) rather than fail. 64-bit only, where off_t has one width. */
#if defined(__GLIBC__) && defined(__LP64__) && !defined(__USE_UNIX98) && !defined(__USE_XOPEN2K8)
extern ssize_t pread(int fd, void *buf, size_t count, off_t offset);
extern ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset);
#endif
#if defined(__GLIBC__) && defined(__LP64__) && !defined(__USE_XOPEN2K)
extern int posix_fallocate(int fd, off_t offset, off_t len);
#endif
#if !defined(O_CLOEXEC) && defined(__O_CLOEXEC)
#define O_CLOEXEC __O_CLOEXEC
#endif

/* Raw system calls for io_uring (syscall() itself is a GNU/BSD declaration). Returns the
   result or -errno. Architectures without a stub here use the thread pool. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ZERO__IO_HAVE_URING 1
#define ZERO__NR_IO_URING_SETUP 425
#define ZERO__NR_IO_URING_ENTER 426
static long zero__syscall6(long n, long a, long b, long c, long d, long e, long f)
{
    long ret;
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    __asm__ __volatile__("syscall"
                         : "=a"(ret)
                         : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                         : "rcx", "r11", "memory");
    return ret;
}
#else
#define ZERO__IO_HAVE_URING 0
#endif

/* The kernel's io_uring ABI (include/uapi/linux/io_uring.h), the fields used here. */
typedef struct zero__uring_sqe {
    uint8_t opcode;
    uint8_t flags;
    uint16_t ioprio;
    int32_t fd;
    uint64_t off;
    uint64_t addr;
    uint32_t len;
    uint32_t rw_flags;
    uint64_t user_data;
    uint16_t buf_index;
    uint16_t personality;
    int32_t splice_fd_in;
    uint64_t addr3;
    uint64_t pad2;
} zero__uring_sqe;

typedef struct zero__uring_cqe {
    uint64_t user_data;
    int32_t res;
    uint32_t flags;
} zero__uring_cqe;

typedef struct zero__uring_params {
    uint32_t sq_entries, cq_entries, flags, sq_thread_cpu, sq_thread_idle, features, wq_fd;
    uint32_t resv[3];
    uint32_t sq_head, sq_tail, sq_ring_mask, sq_ring_entries, sq_flags, sq_dropped, sq_array,
        sq_resv1;
    uint64_t sq_user_addr;
    uint32_t cq_head, cq_tail, cq_ring_mask, cq_ring_entries, cq_overflow, cq_cqes, cq_flags,
        cq_resv1;
    uint64_t cq_user_addr;
} zero__uring_params;

#define ZERO__URING_OP_READV 1
#define ZERO__URING_OP_WRITEV 2
#define ZERO__URING_ENTER_GETEVENTS 1u
#define ZERO__URING_FEAT_SINGLE_MMAP 1u
#define ZERO__URING_OFF_SQ_RING 0ll
#define ZERO__URING_OFF_CQ_RING 0x8000000ll
#define ZERO__URING_OFF_SQES 0x10000000ll

typedef struct zero__iovec { /* struct iovec's layout */
    void *base;
    size_t len;
} zero__iovec;

/* A written range of a file: what a read must match. */
enum { ZERO__RANGE_VALID = 0, ZERO__RANGE_WRITING = 1, ZERO__RANGE_FAILED = 2 };
typedef struct zero__io_range {
    uint64_t offset;
    size_t bytes;
    uint32_t sum; /* CRC32C of the bytes written (known from the write's wait on) */
    int state;
    int readers; /* queued reads not yet finished */
    int zeros;   /* declared by zero_io_declare_zeros: reads check for zeros, not the sum */
} zero__io_range;

struct zero_io_file {
    zero_io *io;
    int fd;
    int lock_fd; /* holds flock(LOCK_EX) on the file while it lives (fd itself, or the
                    buffered descriptor kept open beside an O_DIRECT fd) */
    int direct;
    char *path;
    uint64_t size;
    zero__io_range *ranges; /* sorted by offset, never overlapping */
    size_t nranges, cap;
    zero_io_file *next; /* the engine's list of files */
};

typedef struct zero__io_op {
    zero_io_ticket ticket;
    zero_io_file *file;
    int write;
    uint64_t offset;
    size_t bytes;
    unsigned char *buf;
    uint32_t sum;     /* reads: the CRC32C recorded when the range was written   */
    int zeros;        /* reads of a declared zero range: every byte must be 0    */
    uint32_t *crcs;   /* the CRC32C of each block_size piece (nblocks), set by the
                         engine's threads as the pieces complete                 */
    size_t nblocks;
    int checks;       /* pieces being checked outside the lock                   */
    size_t nonzero;   /* zeros: the first byte found not zero (bytes: none)      */
    size_t issued;    /* bytes cut into requests so far                          */
    int outstanding;  /* requests in flight                                       */
    int done;
    int failed;
    int claimed; /* a thread is waiting for it in zero_io_wait / wait_all */
    char msg[384];
    struct zero__io_op *next;       /* all ops, by ticket */
    struct zero__io_op *next_issue; /* ops with bytes left to issue */
} zero__io_op;

enum { ZERO__SLOT_FREE = 0, ZERO__SLOT_READY = 1, ZERO__SLOT_RUNNING = 2 };
/* A piece of a ticket that completed and still needs its check (outside the lock). */
typedef struct zero__io_piece {
    zero__io_op *op;
    size_t index; /* its block within the ticket */
    const unsigned char *p;
    size_t n;
} zero__io_piece;

typedef struct zero__io_slot {
    int state;
    zero__io_op *op;
    uint64_t offset;       /* file offset of the request                  */
    unsigned char *target; /* where the disk reads into / writes from     */
    unsigned char *user;   /* the caller's bytes for this request         */
    size_t len;            /* bytes of the request on disk (padded if bounced) */
    size_t user_len;       /* bytes of the caller's buffer it covers      */
    size_t done_bytes;     /* transferred so far (short transfers resume) */
    unsigned char *bounce; /* block_size bytes, aligned; allocated on first use */
    int bounced;
    zero__iovec iov;
} zero__io_slot;

struct zero_io {
    zero_allocator alloc;
    zero_io_backend backend;
    zero_io_direct direct;
    size_t block_size;
    int depth;
    zero_io_log_fn log;
    void *log_user;
    pthread_mutex_t mu;
    pthread_cond_t work; /* a slot is ready (threads) / a request was submitted (uring) */
    pthread_cond_t done; /* a ticket finished */
    int stop;
    zero__io_slot *slots;
    zero__io_piece *pieces; /* io_uring: the reaper's pieces to check, one per slot */
    uint32_t crc_shift;     /* x^(8 block_size) mod P: joins a block's CRC */
    int *ready; /* threads: ring of ready slot indices */
    int *pushed; /* io_uring: slots put on the ring since the last submit */
    int npushed;
    int ready_head, ready_count;
    int in_flight;
    zero__io_op *ops, *ops_tail;
    zero__io_op *issue_head, *issue_tail;
    zero_io_ticket next_ticket;
    zero_io_file *files;
    pthread_t *threads;
    int nthreads;
    int logged_fallback;
    zero_io_fault fault;
    uint64_t fault_count;
    zero_io_stats stats;
    /* io_uring */
    int ring_fd;
    void *sq_map, *cq_map;
    size_t sq_map_len, cq_map_len;
    zero__uring_sqe *sqes;
    size_t sqes_len;
    uint32_t *sq_head, *sq_tail, *sq_mask, *sq_array;
    uint32_t *cq_head, *cq_tail, *cq_mask;
    zero__uring_cqe *cqes;
    int uring_fatal; /* an unexpected io_uring_enter error: every later request fails */
};

static unsigned long zero__io_file_seq;        /* files made by this process */
static pthread_mutex_t zero__io_seq_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- aligned buffers: the raw pointer is kept just below the aligned one ---- */

static void *zero__io_aligned_alloc(const zero_allocator *a, size_t bytes)
{
    size_t total;
    unsigned char *raw, *p;
    if (zero__add_size(bytes, 2 * (size_t)ZERO_IO_ALIGN, &total) != 0) return NULL;
    raw = (unsigned char *)zero__alloc(a, total);
    if (!raw) return NULL;
    p = (unsigned char *)(((uintptr_t)raw + sizeof(void *) + ZERO_IO_ALIGN - 1) &
                          ~(uintptr_t)(ZERO_IO_ALIGN - 1));
    memcpy(p - sizeof(void *), &raw, sizeof raw);
    return p;
}

static void zero__io_aligned_free(const zero_allocator *a, void *p)
{
    void *raw;
    if (!p) return;
    memcpy(&raw, (unsigned char *)p - sizeof(void *), sizeof raw);
    zero__free(a, raw);
}

ZERODEF zero_result zero_io_buffer_alloc(zero_io *io, size_t bytes, void **out)
{
    void *p;
    size_t rounded;
    if (out) *out = NULL;
    if (!io || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_buffer_alloc: %s is NULL", io ? "out" : "io");
    if (bytes == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_buffer_alloc: bytes = 0");
    if (bytes > (size_t)-1 - 4 * (size_t)ZERO_IO_ALIGN)
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_io_buffer_alloc: bytes = %zu overflows", bytes);
    rounded = (size_t)zero_io_align_up(bytes);
    p = zero__io_aligned_alloc(&io->alloc, rounded);
    if (!p) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_io_buffer_alloc: %zu bytes", rounded);
    *out = p;
    return ZERO_OK;
}

ZERODEF void zero_io_buffer_free(zero_io *io, void *buf)
{
    if (!io || !buf) return;
    zero__io_aligned_free(&io->alloc, buf);
}

/* ---- requests: cut, complete ---- */

static void zero__io_log(zero_io *io, const char *msg)
{
    if (io->log)
        io->log(msg, io->log_user);
    else
        fprintf(stderr, "zero: %s\n", msg);
}

static void zero__io_op_fail(zero__io_op *op, uint64_t at, const char *cause)
{
    if (op->failed) return;
    op->failed = 1;
    snprintf(op->msg, sizeof op->msg, "zero_io: %s of %s at offset %llu (%zu bytes): %s",
             op->write ? "write" : "read", op->file->path, (unsigned long long)at, op->bytes, cause);
    op->issued = op->bytes; /* issue nothing more of it */
}

/* The file's range that starts at offset, or -1. Caller holds the lock. */
static long zero__io_range_find(const zero_io_file *f, uint64_t offset)
{
    size_t lo = 0, hi = f->nranges;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (f->ranges[mid].offset < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < f->nranges && f->ranges[lo].offset == offset) return (long)lo;
    return -1;
}

/* The ticket is done when every request finished and every piece was checked. Locked. */
static void zero__io_op_settle(zero_io *io, zero__io_op *op)
{
    if (!op->done && op->outstanding == 0 && op->issued == op->bytes && op->checks == 0) {
        op->done = 1;
        pthread_cond_broadcast(&io->done);
    }
}

/* A request finished: err = 0 and got = len on success. Caller holds the lock. On success
   (the ticket not failed) the piece's check is handed to the caller in *piece (which must
   run zero__io_piece_check outside the lock, then zero__io_piece_done): returns 1. The slot
   is free on return either way. */
static int zero__io_slot_finish(zero_io *io, zero__io_slot *s, int err, int eof, zero__io_piece *piece)
{
    zero__io_op *op = s->op;
    char cause[160];
    int got = 0;
    if (err) {
        snprintf(cause, sizeof cause, "%s (errno %d)", strerror(err), err);
        zero__io_op_fail(op, s->offset, cause);
    } else if (eof) {
        snprintf(cause, sizeof cause,
                 "short %s: %zu of %zu bytes at offset %llu (end of file: truncated under the engine?)",
                 op->write ? "write" : "read", s->done_bytes, s->len,
                 (unsigned long long)(s->offset + s->done_bytes));
        zero__io_op_fail(op, s->offset, cause);
    } else {
        if (!op->write && s->bounced) memcpy(s->user, s->target, s->user_len);
        if (op->write)
            io->stats.bytes_written += s->user_len;
        else
            io->stats.bytes_read += s->user_len;
        io->stats.requests++;
        if (piece && !op->failed) {
            piece->op = op;
            piece->index = (size_t)((s->offset - op->offset) / io->block_size);
            piece->p = s->user;
            piece->n = s->user_len;
            op->checks++;
            got = 1;
        }
    }
    s->state = ZERO__SLOT_FREE;
    s->op = NULL;
    io->in_flight--;
    op->outstanding--;
    zero__io_op_settle(io, op);
    return got;
}

/* The check of a completed piece, outside the lock, on the engine's thread: its CRC32C, or
   (a read of a declared zero range) the offset of its first byte that is not zero (n when
   all are). The ticket's buffer is stable: the ticket is not done while checks run. */
static void zero__io_piece_check(const zero__io_piece *pc, uint32_t *crc, size_t *nonzero)
{
    *crc = 0;
    *nonzero = pc->n;
    if (pc->op->zeros) {
        size_t i = 0;
        while (i + 64 <= pc->n) { /* 64 bytes at a time, then find the byte */
            uint64_t w[8], acc = 0;
            int k;
            memcpy(w, pc->p + i, 64);
            for (k = 0; k < 8; k++) acc |= w[k];
            if (acc) break;
            i += 64;
        }
        while (i < pc->n && pc->p[i] == 0) i++;
        *nonzero = i;
    } else {
        *crc = zero_crc32c(0, pc->p, pc->n);
    }
}

/* Records a piece's check (locked) and finishes its ticket when it was the last. */
static void zero__io_piece_done(zero_io *io, const zero__io_piece *pc, uint32_t crc, size_t nonzero)
{
    zero__io_op *op = pc->op;
    if (op->zeros) {
        if (nonzero < pc->n && pc->index * io->block_size + nonzero < op->nonzero)
            op->nonzero = pc->index * io->block_size + nonzero;
    } else {
        op->crcs[pc->index] = crc;
    }
    op->checks--;
    zero__io_op_settle(io, op);
}

/* The CRC32C of a whole ticket from its pieces' (every piece checked). Locked. */
static uint32_t zero__io_op_crc(const zero_io *io, const zero__io_op *op)
{
    uint32_t c = 0;
    size_t i;
    for (i = 0; i < op->nblocks; i++) {
        size_t len = i + 1 < op->nblocks ? io->block_size : op->bytes - i * io->block_size;
        if (i == 0)
            c = op->crcs[0];
        else if (len == io->block_size)
            c = zero__crc_mul(c, io->crc_shift) ^ op->crcs[i];
        else
            c = zero_crc32c_combine(c, op->crcs[i], len);
    }
    return c;
}

#if ZERO__IO_HAVE_URING
/* Puts slot s's request (its remaining part) on the ring. Caller holds the lock. */
static void zero__io_uring_push(zero_io *io, int index)
{
    zero__io_slot *s = &io->slots[index];
    uint32_t tail = *io->sq_tail, idx = tail & *io->sq_mask;
    zero__uring_sqe *e = &io->sqes[idx];
    memset(e, 0, sizeof *e);
    s->iov.base = s->target + s->done_bytes;
    s->iov.len = s->len - s->done_bytes;
    e->opcode = s->op->write ? ZERO__URING_OP_WRITEV : ZERO__URING_OP_READV;
    e->fd = s->op->file->fd;
    e->off = s->offset + s->done_bytes;
    e->addr = (uint64_t)(uintptr_t)&s->iov;
    e->len = 1;
    e->user_data = (uint64_t)index;
    io->sq_array[idx] = idx;
    __atomic_store_n(io->sq_tail, tail + 1, __ATOMIC_RELEASE);
    io->pushed[io->npushed++] = index;
}

/* Submits what was pushed. Caller holds the lock. Returns 0 or an errno: then the requests
   the kernel did not take are taken back off the ring and finished with that error (so no
   one waits for a completion that cannot come), and every later request fails with it. */
static int zero__io_uring_submit(zero_io *io)
{
    unsigned n = (unsigned)io->npushed;
    int err = 0, tries = 0;
    while (n > 0) {
        long r = zero__syscall6(ZERO__NR_IO_URING_ENTER, io->ring_fd, (long)n, 0, 0, 0, 0);
        if ((r == -4 /* EINTR */ || r == -11 /* EAGAIN */ || r == -16 /* EBUSY */) && ++tries < 1000)
            continue;
        if (r <= 0) {
            err = r < 0 ? (int)-r : EIO;
            break;
        }
        n -= (unsigned)r;
    }
    if (err) {
        unsigned k;
        __atomic_store_n(io->sq_tail, *io->sq_tail - n, __ATOMIC_RELEASE);
        io->uring_fatal = err;
        for (k = (unsigned)io->npushed - n; k < (unsigned)io->npushed; k++)
            zero__io_slot_finish(io, &io->slots[io->pushed[k]], err, 0, NULL);
    }
    io->npushed = 0;
    return err;
}
#endif

/* Fills free slots from the issue queue. Caller holds the lock. */
static void zero__io_fill(zero_io *io)
{
    unsigned pushed = 0;
    while (io->in_flight < io->depth && io->issue_head) {
        zero__io_op *op = io->issue_head;
        zero__io_slot *s = NULL;
        int i, fault_err = 0, fault_short = 0;
        size_t piece;
        if (op->issued >= op->bytes) { /* finished cutting (or failed): drop it */
            io->issue_head = op->next_issue;
            if (!io->issue_head) io->issue_tail = NULL;
            op->next_issue = NULL;
            continue;
        }
        for (i = 0; i < io->depth; i++)
            if (io->slots[i].state == ZERO__SLOT_FREE) {
                s = &io->slots[i];
                break;
            }
        if (!s) break;
        piece = op->bytes - op->issued;
        if (piece > io->block_size) piece = io->block_size;
        s->op = op;
        s->offset = op->offset + op->issued;
        s->user = op->buf + op->issued;
        s->user_len = piece;
        s->done_bytes = 0;
        s->bounced = 0;
        s->target = s->user;
        s->len = piece;
        if (op->file->direct && (((uintptr_t)s->user % ZERO_IO_ALIGN) != 0 || piece % ZERO_IO_ALIGN != 0)) {
            if (!s->bounce) s->bounce = (unsigned char *)zero__io_aligned_alloc(&io->alloc, io->block_size);
            if (!s->bounce) fault_err = ENOMEM;
            s->bounced = 1;
            s->target = s->bounce;
            s->len = (size_t)zero_io_align_up(piece);
            if (s->bounce && op->write) {
                memcpy(s->bounce, s->user, piece);
                memset(s->bounce + piece, 0, s->len - piece);
            }
            io->stats.bounced++;
        }
        op->issued += piece;
        op->outstanding++;
        io->in_flight++;
        if (io->in_flight > io->stats.max_in_flight) io->stats.max_in_flight = io->in_flight;
        s->state = ZERO__SLOT_RUNNING;
        io->fault_count++;
        if (io->fault.kind != ZERO_IO_FAULT_NONE && io->fault.kind != ZERO_IO_FAULT_OPEN_DIRECT &&
            io->fault_count == io->fault.request) {
            if (io->fault.kind == ZERO_IO_FAULT_ERRNO)
                fault_err = io->fault.err ? io->fault.err : EIO;
            else
                fault_short = 1;
            io->fault.kind = ZERO_IO_FAULT_NONE;
        }
        if (fault_err || fault_short || io->uring_fatal) {
            zero__io_slot_finish(io, s, fault_err ? fault_err : io->uring_fatal, fault_short, NULL);
            continue;
        }
        if (io->backend == ZERO_IO_BACKEND_THREADS) {
            s->state = ZERO__SLOT_READY;
            io->ready[(io->ready_head + io->ready_count) % io->depth] = (int)(s - io->slots);
            io->ready_count++;
            pthread_cond_signal(&io->work);
        } else {
#if ZERO__IO_HAVE_URING
            zero__io_uring_push(io, (int)(s - io->slots));
            pushed++;
#endif
        }
    }
#if ZERO__IO_HAVE_URING
    if (pushed > 0) {
        zero__io_uring_submit(io);
        pthread_cond_signal(&io->work); /* the reaper has something to wait for */
    }
#else
    (void)pushed;
#endif
}

/* Threads backend: one worker. */
static void *zero__io_worker(void *arg)
{
    zero_io *io = (zero_io *)arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        zero__io_slot *s;
        int err = 0, eof = 0, fd, write;
        while (!io->stop && io->ready_count == 0) pthread_cond_wait(&io->work, &io->mu);
        if (io->ready_count == 0) break; /* stop, nothing left */
        s = &io->slots[io->ready[io->ready_head]];
        io->ready_head = (io->ready_head + 1) % io->depth;
        io->ready_count--;
        s->state = ZERO__SLOT_RUNNING;
        fd = s->op->file->fd;
        write = s->op->write;
        pthread_mutex_unlock(&io->mu);
        while (s->done_bytes < s->len) {
            ssize_t r;
            if (write)
                r = pwrite(fd, s->target + s->done_bytes, s->len - s->done_bytes,
                           (off_t)(s->offset + s->done_bytes));
            else
                r = pread(fd, s->target + s->done_bytes, s->len - s->done_bytes,
                          (off_t)(s->offset + s->done_bytes));
            if (r < 0) {
                if (errno == EINTR) continue;
                err = errno;
                break;
            }
            if (r == 0) {
                eof = 1;
                break;
            }
            s->done_bytes += (size_t)r;
        }
        pthread_mutex_lock(&io->mu);
        {
            zero__io_piece pc;
            if (zero__io_slot_finish(io, s, err, eof, &pc)) {
                uint32_t crc;
                size_t nz;
                zero__io_fill(io); /* the slot is refilled before the check */
                pthread_mutex_unlock(&io->mu);
                zero__io_piece_check(&pc, &crc, &nz);
                pthread_mutex_lock(&io->mu);
                zero__io_piece_done(io, &pc, crc, nz);
            }
        }
        zero__io_fill(io);
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

#if ZERO__IO_HAVE_URING
/* io_uring backend: the reaper. */
static void *zero__io_reaper(void *arg)
{
    zero_io *io = (zero_io *)arg;
    pthread_mutex_lock(&io->mu);
    for (;;) {
        uint32_t head, tail;
        unsigned pushed = 0;
        int npc = 0, k;
        while (!io->stop && io->in_flight == 0) pthread_cond_wait(&io->work, &io->mu);
        if (io->in_flight == 0) break; /* stop, nothing in flight */
        head = *io->cq_head;
        tail = __atomic_load_n(io->cq_tail, __ATOMIC_ACQUIRE);
        if (head == tail) {
            long r;
            pthread_mutex_unlock(&io->mu);
            r = zero__syscall6(ZERO__NR_IO_URING_ENTER, io->ring_fd, 0, 1,
                               (long)ZERO__URING_ENTER_GETEVENTS, 0, 0);
            pthread_mutex_lock(&io->mu);
            if (r < 0 && r != -4 /* EINTR */ && r != -11 /* EAGAIN */ && r != -16 /* EBUSY */) {
                /* the ring is broken (EBADF, EFAULT, ...): no completion will come, so
                   fail what is in flight and everything after it rather than hang */
                int i;
                io->uring_fatal = (int)-r;
                for (i = 0; i < io->depth; i++)
                    if (io->slots[i].state == ZERO__SLOT_RUNNING && io->slots[i].op)
                        zero__io_slot_finish(io, &io->slots[i], (int)-r, 0, NULL);
            }
            continue; /* EINTR and friends: look at the ring again */
        }
        while (head != tail) {
            zero__uring_cqe *c = &io->cqes[head & *io->cq_mask];
            int index = (int)c->user_data, res = c->res;
            zero__io_slot *s;
            head++;
            if (index < 0 || index >= io->depth) continue;
            s = &io->slots[index];
            if (s->state != ZERO__SLOT_RUNNING || !s->op) continue;
            if (res == -4 /* EINTR */ || res == -11 /* EAGAIN */) {
                zero__io_uring_push(io, index); /* again, as it was */
                pushed++;
                continue;
            }
            if (res < 0) {
                zero__io_slot_finish(io, s, -res, 0, NULL);
            } else if (res == 0) {
                zero__io_slot_finish(io, s, 0, 1, NULL);
            } else {
                s->done_bytes += (size_t)res;
                if (s->done_bytes < s->len) { /* a short transfer: the rest, as a new request */
                    zero__io_uring_push(io, index);
                    pushed++;
                } else if (zero__io_slot_finish(io, s, 0, 0, &io->pieces[npc])) {
                    npc++; /* a slot completes once per batch: at most depth pieces */
                }
            }
        }
        __atomic_store_n(io->cq_head, head, __ATOMIC_RELEASE);
        if (pushed > 0) zero__io_uring_submit(io);
        zero__io_fill(io); /* the freed slots go back to the disk before the checks run */
        if (npc > 0) {
            uint32_t crcs[64];
            size_t nzs[64];
            int at = 0;
            while (at < npc) { /* in batches of 64: the results kept on the stack */
                int m = npc - at < 64 ? npc - at : 64;
                pthread_mutex_unlock(&io->mu);
                for (k = 0; k < m; k++) zero__io_piece_check(&io->pieces[at + k], &crcs[k], &nzs[k]);
                pthread_mutex_lock(&io->mu);
                for (k = 0; k < m; k++) zero__io_piece_done(io, &io->pieces[at + k], crcs[k], nzs[k]);
                at += m;
            }
        }
    }
    pthread_mutex_unlock(&io->mu);
    return NULL;
}

static void zero__io_uring_close(zero_io *io)
{
    if (io->sqes) munmap(io->sqes, io->sqes_len);
    if (io->cq_map && io->cq_map != io->sq_map) munmap(io->cq_map, io->cq_map_len);
    if (io->sq_map) munmap(io->sq_map, io->sq_map_len);
    if (io->ring_fd >= 0) close(io->ring_fd);
    io->sqes = NULL;
    io->sq_map = io->cq_map = NULL;
    io->ring_fd = -1;
}

/* Sets up a ring of 'depth' entries. 0 or an errno (ENOSYS, EPERM, ...). */
static int zero__io_uring_open(zero_io *io)
{
    zero__uring_params p;
    unsigned char *sq, *cq;
    long fd;
    memset(&p, 0, sizeof p);
    fd = zero__syscall6(ZERO__NR_IO_URING_SETUP, (long)io->depth, (long)(uintptr_t)&p, 0, 0, 0, 0);
    if (fd < 0) return (int)-fd;
    io->ring_fd = (int)fd;
    io->sq_map_len = p.sq_array + p.sq_entries * sizeof(uint32_t);
    io->cq_map_len = p.cq_cqes + p.cq_entries * sizeof(zero__uring_cqe);
    if (p.features & ZERO__URING_FEAT_SINGLE_MMAP) {
        if (io->cq_map_len > io->sq_map_len) io->sq_map_len = io->cq_map_len;
        io->cq_map_len = io->sq_map_len;
    }
    io->sq_map = mmap(NULL, io->sq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED, io->ring_fd,
                      ZERO__URING_OFF_SQ_RING);
    if (io->sq_map == MAP_FAILED) {
        int err = errno;
        io->sq_map = NULL;
        zero__io_uring_close(io);
        return err;
    }
    if (p.features & ZERO__URING_FEAT_SINGLE_MMAP) {
        io->cq_map = io->sq_map;
    } else {
        io->cq_map = mmap(NULL, io->cq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED, io->ring_fd,
                          ZERO__URING_OFF_CQ_RING);
        if (io->cq_map == MAP_FAILED) {
            int err = errno;
            io->cq_map = NULL;
            zero__io_uring_close(io);
            return err;
        }
    }
    io->sqes_len = p.sq_entries * sizeof(zero__uring_sqe);
    io->sqes = (zero__uring_sqe *)mmap(NULL, io->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED,
                                       io->ring_fd, ZERO__URING_OFF_SQES);
    if ((void *)io->sqes == MAP_FAILED) {
        int err = errno;
        io->sqes = NULL;
        zero__io_uring_close(io);
        return err;
    }
    sq = (unsigned char *)io->sq_map;
    cq = (unsigned char *)io->cq_map;
    io->sq_head = (uint32_t *)(void *)(sq + p.sq_head);
    io->sq_tail = (uint32_t *)(void *)(sq + p.sq_tail);
    io->sq_mask = (uint32_t *)(void *)(sq + p.sq_ring_mask);
    io->sq_array = (uint32_t *)(void *)(sq + p.sq_array);
    io->cq_head = (uint32_t *)(void *)(cq + p.cq_head);
    io->cq_tail = (uint32_t *)(void *)(cq + p.cq_tail);
    io->cq_mask = (uint32_t *)(void *)(cq + p.cq_ring_mask);
    io->cqes = (zero__uring_cqe *)(void *)(cq + p.cq_cqes);
    return 0;
}
#endif /* ZERO__IO_HAVE_URING */

/* ---- lifetime ---- */

static void zero__io_free(zero_io *io)
{
    int i;
    if (io->slots) {
        for (i = 0; i < io->depth; i++) zero__io_aligned_free(&io->alloc, io->slots[i].bounce);
        zero__free(&io->alloc, io->slots);
    }
    zero__free(&io->alloc, io->ready);
    zero__free(&io->alloc, io->pieces);
    zero__free(&io->alloc, io->pushed);
    zero__free(&io->alloc, io->threads);
    zero__free(&io->alloc, io);
}

/* Stops the threads (after everything in flight finished). */
static void zero__io_stop(zero_io *io)
{
    int i;
    pthread_mutex_lock(&io->mu);
    io->stop = 1;
    pthread_cond_broadcast(&io->work);
    pthread_mutex_unlock(&io->mu);
    for (i = 0; i < io->nthreads; i++) pthread_join(io->threads[i], NULL);
    io->nthreads = 0;
}

ZERODEF zero_result zero_io_create(const zero_io_desc *desc, zero_io **out)
{
    zero_io_desc d;
    zero_io *io;
    zero_allocator a;
    int i, want;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_create: out is NULL");
    *out = NULL;
    if (desc)
        d = *desc;
    else
        memset(&d, 0, sizeof d);
    if (d.block_size == 0) d.block_size = ZERO_IO_DEFAULT_BLOCK_SIZE;
    if (d.queue_depth == 0) d.queue_depth = ZERO_IO_DEFAULT_QUEUE_DEPTH;
    if (d.block_size % ZERO_IO_ALIGN != 0 || d.block_size > ((size_t)1 << 30))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_io_create: block_size = %zu (a multiple of %u, at most 1 GiB)",
                          d.block_size, ZERO_IO_ALIGN);
    if (d.queue_depth < 1 || d.queue_depth > 1024)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_create: queue_depth = %d (1..1024)",
                          d.queue_depth);
    if ((int)d.backend < 0 || (int)d.backend > (int)ZERO_IO_BACKEND_THREADS)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_create: backend = %d", (int)d.backend);
    if ((int)d.direct < 0 || (int)d.direct > (int)ZERO_IO_DIRECT_OFF)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_create: direct = %d", (int)d.direct);
#ifndef O_DIRECT
    if (d.direct == ZERO_IO_DIRECT_REQUIRE)
        return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_create: O_DIRECT is unknown on this platform");
#endif
    a = d.allocator;
    io = (zero_io *)zero__alloc(&a, sizeof *io);
    if (!io) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_io_create: %zu bytes", sizeof *io);
    memset(io, 0, sizeof *io);
    io->alloc = a;
    io->direct = d.direct;
    io->block_size = d.block_size;
    io->depth = d.queue_depth;
    io->log = d.log;
    io->log_user = d.log_user;
    io->ring_fd = -1;
    io->next_ticket = 1;
    io->slots = (zero__io_slot *)zero__alloc(&a, (size_t)io->depth * sizeof *io->slots);
    io->ready = (int *)zero__alloc(&a, (size_t)io->depth * sizeof *io->ready);
    io->pushed = (int *)zero__alloc(&a, (size_t)io->depth * sizeof *io->pushed);
    io->pieces = (zero__io_piece *)zero__alloc(&a, (size_t)io->depth * sizeof *io->pieces);
    io->threads = (pthread_t *)zero__alloc(&a, (size_t)io->depth * sizeof *io->threads);
    pthread_once(&zero__crc_once, zero__crc_init);
    io->crc_shift = zero__crc_xpow8(io->block_size);
    if (!io->slots || !io->ready || !io->pushed || !io->pieces || !io->threads) {
        zero__io_free(io);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_io_create: slots for queue_depth %d", d.queue_depth);
    }
    memset(io->slots, 0, (size_t)io->depth * sizeof *io->slots);
    io->backend = ZERO_IO_BACKEND_THREADS;
    if (d.backend != ZERO_IO_BACKEND_THREADS) {
        int err = ENOSYS;
#if ZERO__IO_HAVE_URING
        err = zero__io_uring_open(io);
#endif
        if (err == 0) {
            io->backend = ZERO_IO_BACKEND_IO_URING;
        } else if (d.backend == ZERO_IO_BACKEND_IO_URING) {
            zero__io_free(io);
            return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_create: io_uring_setup failed: %s (errno %d)",
                              strerror(err), err);
        }
    }
    if (pthread_mutex_init(&io->mu, NULL) != 0) {
#if ZERO__IO_HAVE_URING
        zero__io_uring_close(io);
#endif
        zero__io_free(io);
        return zero__fail(ZERO_ERROR_IO, "zero_io_create: pthread_mutex_init failed");
    }
    if (pthread_cond_init(&io->work, NULL) != 0 || pthread_cond_init(&io->done, NULL) != 0) {
        /* a failed init leaves nothing to destroy on Linux; destroying both is harmless */
        pthread_mutex_destroy(&io->mu);
#if ZERO__IO_HAVE_URING
        zero__io_uring_close(io);
#endif
        zero__io_free(io);
        return zero__fail(ZERO_ERROR_IO, "zero_io_create: pthread_cond_init failed");
    }
    want = io->backend == ZERO_IO_BACKEND_THREADS ? (io->depth < 64 ? io->depth : 64) : 1;
    for (i = 0; i < want; i++) {
        int rc = pthread_create(&io->threads[i], NULL,
#if ZERO__IO_HAVE_URING
                                io->backend == ZERO_IO_BACKEND_IO_URING ? zero__io_reaper :
#endif
                                zero__io_worker,
                                io);
        if (rc != 0) {
            zero__io_stop(io);
            pthread_cond_destroy(&io->work);
            pthread_cond_destroy(&io->done);
            pthread_mutex_destroy(&io->mu);
#if ZERO__IO_HAVE_URING
            zero__io_uring_close(io);
#endif
            zero__io_free(io);
            return zero__fail(ZERO_ERROR_IO, "zero_io_create: pthread_create failed: %s", strerror(rc));
        }
        io->nthreads++;
    }
    io->stats.backend = io->backend;
    io->stats.block_size = io->block_size;
    io->stats.queue_depth = io->depth;
    *out = io;
    return ZERO_OK;
}

/* Waits until op is done. Caller holds the lock. */
static void zero__io_wait_op(zero_io *io, zero__io_op *op)
{
    while (!op->done) pthread_cond_wait(&io->done, &io->mu);
}

/* Unlinks op from the engine's list and frees it. Caller holds the lock; op is done. */
static void zero__io_drop_op(zero_io *io, zero__io_op *op)
{
    zero__io_op **pp = &io->ops, *prev = NULL;
    while (*pp && *pp != op) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (*pp) {
        *pp = op->next;
        if (io->ops_tail == op) io->ops_tail = prev;
    }
    zero__free(&io->alloc, op);
}

ZERODEF void zero_io_file_destroy(zero_io_file *file)
{
    zero_io *io;
    zero_io_file **pp;
    zero__io_op *op, *next;
    if (!file) return;
    io = file->io;
    pthread_mutex_lock(&io->mu);
    for (op = io->ops; op; op = next) { /* its tickets: waited for and forgotten */
        next = op->next;
        if (op->file != file) continue;
        zero__io_wait_op(io, op);
        next = op->next;
        zero__io_drop_op(io, op);
    }
    for (pp = &io->files; *pp; pp = &(*pp)->next)
        if (*pp == file) {
            *pp = file->next;
            break;
        }
    pthread_mutex_unlock(&io->mu);
    if (file->path) unlink(file->path); /* while locked: no sweep can take a new file's name */
    if (file->fd >= 0) close(file->fd);
    if (file->lock_fd >= 0 && file->lock_fd != file->fd) close(file->lock_fd);
    zero__free(&io->alloc, file->path);
    zero__free(&io->alloc, file->ranges);
    zero__free(&io->alloc, file);
}

ZERODEF void zero_io_destroy(zero_io *io)
{
    zero__io_op *op;
    if (!io) return;
    while (io->files) zero_io_file_destroy(io->files);
    pthread_mutex_lock(&io->mu);
    while ((op = io->ops) != NULL) {
        zero__io_wait_op(io, op);
        zero__io_drop_op(io, op);
    }
    pthread_mutex_unlock(&io->mu);
    zero__io_stop(io);
    pthread_cond_destroy(&io->work);
    pthread_cond_destroy(&io->done);
    pthread_mutex_destroy(&io->mu);
#if ZERO__IO_HAVE_URING
    zero__io_uring_close(io);
#endif
    zero__io_free(io);
}

ZERODEF zero_result zero_io_get_stats(zero_io *io, zero_io_stats *out)
{
    if (!io || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_get_stats: %s is NULL", io ? "out" : "io");
    pthread_mutex_lock(&io->mu);
    *out = io->stats;
    pthread_mutex_unlock(&io->mu);
    return ZERO_OK;
}

ZERODEF zero_result zero_io_inject_fault(zero_io *io, const zero_io_fault *fault)
{
    if (!io) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_inject_fault: io is NULL");
    if (fault && ((int)fault->kind < 0 || (int)fault->kind > (int)ZERO_IO_FAULT_OPEN_DIRECT))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_inject_fault: kind = %d", (int)fault->kind);
    pthread_mutex_lock(&io->mu);
    if (fault)
        io->fault = *fault;
    else
        memset(&io->fault, 0, sizeof io->fault);
    io->fault_count = 0;
    pthread_mutex_unlock(&io->mu);
    return ZERO_OK;
}

/* ---- files ---- */

/* 64 unpredictable-enough bits for a file name: the kernel's random bytes when it gives
   them, mixed with the time, the pid, a per-process counter and an address. */
static uint64_t zero__io_token(unsigned long seq)
{
    uint64_t h = ZERO__FNV_OFFSET, r = 0;
    struct timespec ts;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &r, sizeof r) != (ssize_t)sizeof r) r = 0;
        close(fd);
    }
    clock_gettime(CLOCK_REALTIME, &ts);
    h = zero__fnv1a_u64(h, r);
    h = zero__fnv1a_u64(h, (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
    h = zero__fnv1a_u64(h, (uint64_t)getpid());
    h = zero__fnv1a_u64(h, (uint64_t)seq);
    h = zero__fnv1a_u64(h, (uint64_t)(uintptr_t)&ts);
    return h ^ r;
}

/* O_NOFOLLOW is POSIX.1-2008, hidden when the program asked for less: then a link to a
   swap file may be opened; unlink() removes the link, never its target. */
#ifdef O_NOFOLLOW
#define ZERO__O_NOFOLLOW O_NOFOLLOW
#else
#define ZERO__O_NOFOLLOW 0
#endif

/* Whether a directory entry is one of the I/O engine's swap files: "zero-*-r*-" then a
   16-hex-digit token and ".bin" (names without a token come from engines that took no
   lock, whose liveness cannot be told: never removed). */
static int zero__io_swap_name(const char *n)
{
    size_t len = strlen(n), i;
    if (len < 5 + 3 + 1 + 16 + 4 || strncmp(n, "zero-", 5) != 0 || strcmp(n + len - 4, ".bin") != 0 ||
        n[len - 21] != '-' || !strstr(n, "-r"))
        return 0;
    for (i = len - 20; i < len - 4; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return 0;
    return 1;
}

/* Removes the swap files in dir that no live job holds: each live file is flock()ed by its
   job (zero_io_file_create), so a file whose lock can be taken belongs to a job that is
   gone (killed, crashed). Only regular files of this user with the engine's name pattern;
   each removal is logged. Returns how many were removed. Best effort: errors skip a file. */
static int zero__io_sweep(zero_io *io, const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int removed = 0;
    if (!d) return 0;
    while ((de = readdir(d)) != NULL) {
        char path[4200], msg[4400];
        struct stat st, again;
        int fd;
        if (!zero__io_swap_name(de->d_name)) continue;
        if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= sizeof path) continue;
        fd = open(path, O_RDONLY | ZERO__O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0) continue;
        /* an empty file may be a live job's between its create and its lock: left alone */
        if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && st.st_size > 0 &&
            flock(fd, LOCK_EX | LOCK_NB) == 0 && stat(path, &again) == 0 &&
            again.st_ino == st.st_ino && again.st_dev == st.st_dev && unlink(path) == 0) {
            snprintf(msg, sizeof msg, "zero_io: removed %s (%lld bytes): a swap file of a job "
                     "that is gone (its lock was free)", path, (long long)st.st_size);
            zero__io_log(io, msg);
            removed++;
        }
        close(fd); /* drops the lock */
    }
    closedir(d);
    return removed;
}

ZERODEF zero_result zero_io_file_create(zero_io *io, const char *dir, const char *name, int rank,
                                        uint64_t bytes, zero_io_file **out)
{
    zero_io_file *f;
    struct stat st;
    size_t len;
    unsigned long seq;
    int fd, err, try_direct, fault_direct = 0, attempt, lk;
    uint64_t size;
    if (out) *out = NULL;
    if (!io || !dir || !name || !out)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_file_create: %s is NULL",
                          !io ? "io" : !dir ? "dir" : !name ? "name" : "out");
    if (name[0] == '\0' || strchr(name, '/'))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_file_create: name \"%s\" (not empty, no '/')", name);
    if (dir[0] == '\0') return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_file_create: dir is empty");
    if (rank < 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_file_create: rank = %d", rank);
    if (bytes == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_file_create: bytes = 0");
    if (bytes > ((uint64_t)1 << 62))
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_io_file_create: bytes = %llu", (unsigned long long)bytes);
    size = zero_io_align_up(bytes);
    if (stat(dir, &st) != 0) {
        err = errno;
        return zero__fail(ZERO_ERROR_IO, "zero_io_file_create: nvme path \"%s\": %s%s", dir, strerror(err),
                          err == ENOENT ? " (the directory must exist)" : "");
    }
    if (!S_ISDIR(st.st_mode))
        return zero__fail(ZERO_ERROR_IO, "zero_io_file_create: nvme path \"%s\" is not a directory", dir);
    f = (zero_io_file *)zero__alloc(&io->alloc, sizeof *f);
    len = strlen(dir) + strlen(name) + 96;
    if (!f) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_io_file_create: %zu bytes", sizeof *f);
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->lock_fd = -1;
    f->io = io;
    f->size = size;
    f->path = (char *)zero__alloc(&io->alloc, len);
    if (!f->path) {
        zero__free(&io->alloc, f);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_io_file_create: %zu bytes", len);
    }
    (void)zero__io_sweep(io, dir); /* the files of dead jobs first: their space is ours */
    /* A random token in the name, created exclusively and locked; a name taken (another
       job's, or a sweep that removed it between our open and our lock) draws another. */
    for (attempt = 0;; attempt++) {
        struct stat fs;
        pthread_mutex_lock(&zero__io_seq_mu);
        seq = zero__io_file_seq++;
        pthread_mutex_unlock(&zero__io_seq_mu);
        snprintf(f->path, len, "%s%s%s-%s-r%d-%ld-%016llx.bin", dir,
                 dir[strlen(dir) - 1] == '/' ? "" : "/", "zero", name, rank, (long)getpid(),
                 (unsigned long long)zero__io_token(seq));
        fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 && errno == EEXIST && attempt < 16) continue;
        if (fd < 0) break;
        lk = flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
        if (lk != 0 && lk != EWOULDBLOCK && lk != EAGAIN)
            break; /* no flock here (ENOLCK: some network file systems): a file without lock */
        if (lk == 0 && fstat(fd, &fs) == 0 && fs.st_nlink > 0) break; /* ours, and still named */
        err = lk ? lk : EEXIST;
        close(fd);
        fd = -1;
        if (attempt >= 16) {
            errno = err ? err : EEXIST;
            break;
        }
    }
    if (fd < 0) {
        err = errno;
        zero__fail(ZERO_ERROR_IO, "zero_io_file_create: cannot create %s: %s%s", f->path, strerror(err),
                   (err == EACCES || err == EROFS || err == EPERM) ? " (nvme path not writable)" : "");
        zero__free(&io->alloc, f->path);
        zero__free(&io->alloc, f);
        return ZERO_ERROR_IO;
    }
    err = posix_fallocate(fd, 0, (off_t)size);
    if (err == EINVAL || err == EOPNOTSUPP) err = ftruncate(fd, (off_t)size) == 0 ? 0 : errno;
    if (err != 0) {
        struct statvfs vfs;
        unsigned long long avail = 0;
        if (fstatvfs(fd, &vfs) == 0) avail = (unsigned long long)vfs.f_bavail * (unsigned long long)vfs.f_frsize;
        zero__fail(ZERO_ERROR_IO, "zero_io_file_create: cannot reserve %llu bytes for %s: %s (%llu bytes free)",
                   (unsigned long long)size, f->path, strerror(err), avail);
        unlink(f->path); /* while locked */
        close(fd);
        zero__free(&io->alloc, f->path);
        zero__free(&io->alloc, f);
        return ZERO_ERROR_IO;
    }
    f->fd = fd;
    f->lock_fd = fd;
    try_direct = io->direct != ZERO_IO_DIRECT_OFF;
#ifdef O_DIRECT
    if (try_direct) {
        int dfd;
        pthread_mutex_lock(&io->mu);
        if (io->fault.kind == ZERO_IO_FAULT_OPEN_DIRECT) {
            fault_direct = 1;
            io->fault.kind = ZERO_IO_FAULT_NONE;
        }
        pthread_mutex_unlock(&io->mu);
        if (fault_direct) {
            dfd = -1;
            err = EINVAL;
        } else {
            dfd = open(f->path, O_RDWR | O_CLOEXEC | O_DIRECT);
            err = dfd < 0 ? errno : 0;
        }
        if (dfd >= 0) { /* fd stays open: it holds the lock */
            f->fd = dfd;
            f->direct = 1;
        } else if (io->direct == ZERO_IO_DIRECT_REQUIRE) {
            zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_file_create: O_DIRECT refused for %s: %s",
                       f->path, strerror(err));
            unlink(f->path);
            close(fd);
            zero__free(&io->alloc, f->path);
            zero__free(&io->alloc, f);
            return ZERO_ERROR_UNSUPPORTED;
        } else {
            int first;
            pthread_mutex_lock(&io->mu);
            first = !io->logged_fallback;
            io->logged_fallback = 1;
            io->stats.buffered_fallbacks++;
            pthread_mutex_unlock(&io->mu);
            if (first) {
                char msg[512];
                snprintf(msg, sizeof msg,
                         "zero_io: O_DIRECT refused on %s (%s); using buffered I/O (the page "
                         "cache) for this engine's files",
                         dir, strerror(err));
                zero__io_log(io, msg);
            }
        }
    }
#else
    (void)fault_direct;
    if (try_direct) {
        pthread_mutex_lock(&io->mu);
        io->stats.buffered_fallbacks++;
        pthread_mutex_unlock(&io->mu);
    }
#endif
    pthread_mutex_lock(&io->mu);
    f->next = io->files;
    io->files = f;
    pthread_mutex_unlock(&io->mu);
    *out = f;
    return ZERO_OK;
}

ZERODEF const char *zero_io_file_path(const zero_io_file *file) { return file ? file->path : NULL; }
ZERODEF uint64_t zero_io_file_size(const zero_io_file *file) { return file ? file->size : 0; }
ZERODEF int zero_io_file_direct(const zero_io_file *file) { return file ? file->direct : 0; }

/* ---- transfers ---- */

static zero_result zero__io_check(const char *what, zero_io_file *file, uint64_t offset, const void *buf,
                                  size_t bytes, zero_io_ticket *ticket)
{
    if (ticket) *ticket = 0;
    if (!file || !buf || !ticket)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: %s is NULL", what,
                          !file ? "file" : !buf ? "buf" : "ticket");
    if (bytes == 0) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: bytes = 0", what);
    if (offset % ZERO_IO_ALIGN != 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: offset %llu is not a multiple of %u", what,
                          (unsigned long long)offset, ZERO_IO_ALIGN);
    if (offset > file->size || (uint64_t)bytes > file->size - offset)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: range [%llu, +%zu) past the end of %s (%llu bytes)",
                          what, (unsigned long long)offset, bytes, file->path,
                          (unsigned long long)file->size);
    return ZERO_OK;
}

/* Room for n records in the file's range table (locked); OUT_OF_MEMORY without a message. */
static zero_result zero__io_ranges_reserve(zero_io_file *file, size_t n)
{
    size_t cap;
    zero__io_range *t;
    if (n <= file->cap) return ZERO_OK;
    cap = file->cap ? 2 * file->cap : 16;
    if (cap < n) cap = n;
    t = (zero__io_range *)zero__alloc(&file->io->alloc, cap * sizeof *t);
    if (!t) return ZERO_ERROR_OUT_OF_MEMORY;
    if (file->nranges) memcpy(t, file->ranges, file->nranges * sizeof *t);
    zero__free(&file->io->alloc, file->ranges);
    file->ranges = t;
    file->cap = cap;
    return ZERO_OK;
}

/* A ticket of bytes at offset of file, with room for its pieces' CRCs; NULL when out of
   memory. */
static zero__io_op *zero__io_op_new(zero_io *io, zero_io_file *file, uint64_t offset, size_t bytes)
{
    size_t nb = bytes / io->block_size + (bytes % io->block_size != 0), total;
    zero__io_op *op;
    if (zero__mul_size(nb, sizeof(uint32_t), &total) || zero__add_size(total, sizeof *op, &total)) return NULL;
    op = (zero__io_op *)zero__alloc(&io->alloc, total);
    if (!op) return NULL;
    memset(op, 0, sizeof *op);
    op->crcs = (uint32_t *)(void *)(op + 1);
    memset(op->crcs, 0, nb * sizeof(uint32_t));
    op->nblocks = nb;
    op->file = file;
    op->offset = offset;
    op->bytes = bytes;
    op->nonzero = bytes;
    return op;
}

/* Queues op (locked). */
static void zero__io_enqueue(zero_io *io, zero__io_op *op)
{
    op->ticket = io->next_ticket++;
    if (io->ops_tail)
        io->ops_tail->next = op;
    else
        io->ops = op;
    io->ops_tail = op;
    if (io->issue_tail)
        io->issue_tail->next_issue = op;
    else
        io->issue_head = op;
    io->issue_tail = op;
    zero__io_fill(io);
}

ZERODEF zero_result zero_io_write(zero_io_file *file, uint64_t offset, const void *buf,
                                  size_t bytes, zero_io_ticket *ticket)
{
    zero_io *io;
    zero__io_op *op;
    size_t lo, hi;
    uint64_t end;
    zero_result r = zero__io_check("zero_io_write", file, offset, buf, bytes, ticket);
    if (r != ZERO_OK) return r;
    io = file->io;
    op = zero__io_op_new(io, file, offset, bytes);
    if (!op) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_io_write: a ticket of %zu bytes", bytes);
    op->write = 1;
    op->buf = (unsigned char *)(uintptr_t)buf; /* only read from; its CRC32C is taken by the
                                                  engine's threads, set at the wait */
    end = offset + bytes;
    pthread_mutex_lock(&io->mu);
    /* the ranges it overlaps: a contiguous run [lo, hi) of the sorted table */
    for (lo = 0; lo < file->nranges && file->ranges[lo].offset + file->ranges[lo].bytes <= offset; lo++) {
    }
    for (hi = lo; hi < file->nranges && file->ranges[hi].offset < end; hi++) {
        if (file->ranges[hi].readers > 0 || file->ranges[hi].state == ZERO__RANGE_WRITING) {
            pthread_mutex_unlock(&io->mu);
            zero__free(&io->alloc, op);
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_io_write: [%llu, +%zu) of %s overlaps a %s of [%llu, +%zu) not yet waited for",
                              (unsigned long long)offset, bytes, file->path,
                              file->ranges[hi].readers > 0 ? "read" : "write",
                              (unsigned long long)file->ranges[hi].offset, file->ranges[hi].bytes);
        }
    }
    if (hi - lo != 1) { /* the table changes size: 1 replaces hi - lo records */
        size_t n = file->nranges - (hi - lo) + 1;
        if (zero__io_ranges_reserve(file, n) != ZERO_OK) {
            pthread_mutex_unlock(&io->mu);
            zero__free(&io->alloc, op);
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_io_write: range table of %zu", n);
        }
        memmove(file->ranges + lo + 1, file->ranges + hi, (file->nranges - hi) * sizeof *file->ranges);
        file->nranges = n;
    }
    file->ranges[lo].offset = offset;
    file->ranges[lo].bytes = bytes;
    file->ranges[lo].sum = 0; /* the write's wait sets it */
    file->ranges[lo].state = ZERO__RANGE_WRITING;
    file->ranges[lo].readers = 0;
    file->ranges[lo].zeros = 0;
    zero__io_enqueue(io, op);
    *ticket = op->ticket;
    pthread_mutex_unlock(&io->mu);
    return ZERO_OK;
}

ZERODEF zero_result zero_io_read(zero_io_file *file, uint64_t offset, void *buf, size_t bytes,
                                 zero_io_ticket *ticket)
{
    zero_io *io;
    zero__io_op *op;
    zero__io_range *rg;
    long ri;
    zero_result r = zero__io_check("zero_io_read", file, offset, buf, bytes, ticket);
    if (r != ZERO_OK) return r;
    io = file->io;
    op = zero__io_op_new(io, file, offset, bytes);
    if (!op) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_io_read: a ticket of %zu bytes", bytes);
    op->buf = (unsigned char *)buf;
    pthread_mutex_lock(&io->mu);
    ri = zero__io_range_find(file, offset);
    rg = ri >= 0 ? &file->ranges[ri] : NULL;
    if (!rg || rg->bytes != bytes) {
        pthread_mutex_unlock(&io->mu);
        zero__free(&io->alloc, op);
        if (!rg)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_io_read: no range written at offset %llu of %s (read back exactly "
                              "the ranges written)",
                              (unsigned long long)offset, file->path);
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_io_read: %zu bytes at offset %llu of %s, but %zu were written there",
                          bytes, (unsigned long long)offset, file->path, rg->bytes);
    }
    if (rg->state != ZERO__RANGE_VALID) {
        int writing = rg->state == ZERO__RANGE_WRITING;
        pthread_mutex_unlock(&io->mu);
        zero__free(&io->alloc, op);
        if (writing)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_io_read: the write of [%llu, +%zu) of %s is not waited for yet",
                              (unsigned long long)offset, bytes, file->path);
        return zero__fail(ZERO_ERROR_IO,
                          "zero_io_read: the last write of [%llu, +%zu) of %s failed; its contents are lost",
                          (unsigned long long)offset, bytes, file->path);
    }
    rg->readers++;
    op->sum = rg->sum;
    op->zeros = rg->zeros;
    zero__io_enqueue(io, op);
    *ticket = op->ticket;
    pthread_mutex_unlock(&io->mu);
    return ZERO_OK;
}

ZERODEF zero_result zero_io_declare_zeros(zero_io_file *file, uint64_t offset, size_t bytes)
{
    zero_io *io;
    size_t lo;
    uint64_t end;
    zero_result r;
    zero_io_ticket unused = 0; /* its address stands in for a buffer: gcc -Og/-O0 sees it read */
    r = zero__io_check("zero_io_declare_zeros", file, offset, &unused, bytes, &unused);
    if (r != ZERO_OK) return r;
    io = file->io;
    end = offset + bytes;
    pthread_mutex_lock(&io->mu);
    for (lo = 0; lo < file->nranges && file->ranges[lo].offset + file->ranges[lo].bytes <= offset; lo++) {
    }
    if (lo < file->nranges && file->ranges[lo].offset < end) {
        pthread_mutex_unlock(&io->mu);
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_io_declare_zeros: [%llu, +%zu) of %s overlaps a range written before",
                          (unsigned long long)offset, bytes, file->path);
    }
    if (zero__io_ranges_reserve(file, file->nranges + 1) != ZERO_OK) {
        pthread_mutex_unlock(&io->mu);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_io_declare_zeros: range table of %zu",
                          file->nranges + 1);
    }
    memmove(file->ranges + lo + 1, file->ranges + lo, (file->nranges - lo) * sizeof *file->ranges);
    file->nranges++;
    memset(&file->ranges[lo], 0, sizeof file->ranges[lo]);
    file->ranges[lo].offset = offset;
    file->ranges[lo].bytes = bytes;
    file->ranges[lo].state = ZERO__RANGE_VALID;
    file->ranges[lo].zeros = 1;
    pthread_mutex_unlock(&io->mu);
    return ZERO_OK;
}

/* Waits for op (found under the lock), updates its range (a write's range becomes readable,
   or failed; a read's range loses a reader), forgets it and returns its result. */
static zero_result zero__io_finish(zero_io *io, zero__io_op *op)
{
    zero_result r = ZERO_OK;
    char msg[sizeof op->msg];
    int verify;
    long ri;
    uint32_t got = 0;
    op->claimed = 1;
    zero__io_wait_op(io, op);
    if (!op->failed && !op->zeros) got = zero__io_op_crc(io, op); /* the pieces' CRCs joined */
    ri = zero__io_range_find(op->file, op->offset); /* the range's state changes at the wait */
    if (ri >= 0) {
        zero__io_range *rg = &op->file->ranges[ri];
        if (op->write && rg->state == ZERO__RANGE_WRITING) {
            rg->state = op->failed ? ZERO__RANGE_FAILED : ZERO__RANGE_VALID;
            rg->sum = got;
        } else if (!op->write && rg->readers > 0) {
            rg->readers--;
        }
    }
    verify = !op->write && !op->failed;
    if (op->failed) memcpy(msg, op->msg, sizeof msg);
    /* unlink now, check the bytes outside the lock: the op is no longer reachable */
    {
        zero__io_op **pp = &io->ops, *prev = NULL;
        while (*pp && *pp != op) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        if (*pp) {
            *pp = op->next;
            if (io->ops_tail == op) io->ops_tail = prev;
        }
    }
    pthread_mutex_unlock(&io->mu);
    if (!verify && op->failed) {
        r = zero__fail(ZERO_ERROR_IO, "%s", msg);
    } else if (verify && op->zeros) {
        if (op->nonzero < op->bytes)
            r = zero__fail(ZERO_ERROR_IO,
                           "zero_io: read of %s at offset %llu (%zu bytes): byte %zu is not zero "
                           "in a range declared zero: the file changed under the engine",
                           op->file->path, (unsigned long long)op->offset, op->bytes, op->nonzero);
    } else if (verify) {
        if (got != op->sum)
            r = zero__fail(ZERO_ERROR_IO,
                           "zero_io: read of %s at offset %llu (%zu bytes): checksum mismatch "
                           "(CRC32C %08x, written %08x): the file changed under the engine",
                           op->file->path, (unsigned long long)op->offset, op->bytes,
                           (unsigned)got, (unsigned)op->sum);
    }
    zero__free(&io->alloc, op);
    pthread_mutex_lock(&io->mu);
    return r;
}

ZERODEF zero_result zero_io_wait(zero_io *io, zero_io_ticket ticket)
{
    zero__io_op *op;
    zero_result r;
    if (!io) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_wait: io is NULL");
    pthread_mutex_lock(&io->mu);
    for (op = io->ops; op && op->ticket != ticket; op = op->next) {
    }
    if (!op || ticket == 0 || op->claimed) {
        pthread_mutex_unlock(&io->mu);
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_io_wait: ticket %llu is unknown (never queued, already waited for, "
                          "or being waited for by another thread)",
                          (unsigned long long)ticket);
    }
    r = zero__io_finish(io, op);
    pthread_mutex_unlock(&io->mu);
    return r;
}

ZERODEF zero_result zero_io_wait_all(zero_io *io)
{
    zero_result first = ZERO_OK;
    char msg[512];
    msg[0] = '\0';
    if (!io) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_io_wait_all: io is NULL");
    pthread_mutex_lock(&io->mu);
    for (;;) {
        zero__io_op *op = io->ops;
        zero_result r;
        while (op && op->claimed) op = op->next; /* another thread's wait owns those */
        if (!op) break;
        r = zero__io_finish(io, op);
        if (r != ZERO_OK && first == ZERO_OK) {
            first = r;
            snprintf(msg, sizeof msg, "%s", zero_last_error());
        }
    }
    pthread_mutex_unlock(&io->mu);
    if (first != ZERO_OK) return zero__fail(first, "%s", msg);
    return ZERO_OK;
}

#else /* not Linux */

struct zero_io {
    int unused;
};

ZERODEF zero_result zero_io_create(const zero_io_desc *desc, zero_io **out)
{
    (void)desc;
    if (out) *out = NULL;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_create: the NVMe I/O engine needs Linux");
}
ZERODEF void zero_io_destroy(zero_io *io) { (void)io; }
ZERODEF zero_result zero_io_get_stats(zero_io *io, zero_io_stats *out)
{
    (void)io; (void)out;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_get_stats: the NVMe I/O engine needs Linux");
}
ZERODEF zero_result zero_io_buffer_alloc(zero_io *io, size_t bytes, void **out)
{
    (void)io; (void)bytes;
    if (out) *out = NULL;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_buffer_alloc: the NVMe I/O engine needs Linux");
}
ZERODEF void zero_io_buffer_free(zero_io *io, void *buf) { (void)io; (void)buf; }
ZERODEF zero_result zero_io_file_create(zero_io *io, const char *dir, const char *name, int rank,
                                        uint64_t bytes, zero_io_file **out)
{
    (void)io; (void)dir; (void)name; (void)rank; (void)bytes;
    if (out) *out = NULL;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_file_create: the NVMe I/O engine needs Linux");
}
ZERODEF void zero_io_file_destroy(zero_io_file *file) { (void)file; }
ZERODEF const char *zero_io_file_path(const zero_io_file *file) { (void)file; return NULL; }
ZERODEF uint64_t zero_io_file_size(const zero_io_file *file) { (void)file; return 0; }
ZERODEF int zero_io_file_direct(const zero_io_file *file) { (void)file; return 0; }
ZERODEF zero_result zero_io_write(zero_io_file *file, uint64_t offset, const void *buf,
                                  size_t bytes, zero_io_ticket *ticket)
{
    (void)file; (void)offset; (void)buf; (void)bytes;
    if (ticket) *ticket = 0;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_write: the NVMe I/O engine needs Linux");
}
ZERODEF zero_result zero_io_read(zero_io_file *file, uint64_t offset, void *buf, size_t bytes,
                                 zero_io_ticket *ticket)
{
    (void)file; (void)offset; (void)buf; (void)bytes;
    if (ticket) *ticket = 0;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_read: the NVMe I/O engine needs Linux");
}
ZERODEF zero_result zero_io_wait(zero_io *io, zero_io_ticket ticket)
{
    (void)io; (void)ticket;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_wait: the NVMe I/O engine needs Linux");
}
ZERODEF zero_result zero_io_wait_all(zero_io *io)
{
    (void)io;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_wait_all: the NVMe I/O engine needs Linux");
}
ZERODEF zero_result zero_io_declare_zeros(zero_io_file *file, uint64_t offset, size_t bytes)
{
    (void)file; (void)offset; (void)bytes;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_declare_zeros: the NVMe I/O engine needs Linux");
}
ZERODEF zero_result zero_io_inject_fault(zero_io *io, const zero_io_fault *fault)
{
    (void)io; (void)fault;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_io_inject_fault: the NVMe I/O engine needs Linux");
}

#endif /* __linux__ */

/* Engine implementation: ZeRO stages 0-3 over zero_device/zero_comm.

   Layout. The plan packs every group into a flat buffer of numel elements (padded to a
   multiple of world * align); shard r is [r * shard, (r + 1) * shard). The engine keeps
   one device allocation per kind of buffer; group g lives at a fixed offset in it:
     whole layout  (params at stages 0-2, user gradients at stages 0-1, stage-0 master,
                    m, v and accumulator): group g at off_whole[g] = sum of earlier numel
     shard layout  (master, m, v and the gradient accumulator at stages 1-3, stage-3
                    params of partitioned groups): group g at off_shard[g] = sum of earlier
                    shard numel
     stage-3 params: partitioned groups keep their shard, persistent groups their whole
                    buffer, at off_param[g].

   Gradient rule (the same at every stage, so an element's final gradient has the same bits
   everywhere): per micro-step k the group's gradients (param dtype) are cast to the comm
   dtype if it differs, reduced across ranks (SUM, rank order, one rounding: all-reduce at
   stage 0, reduce-scatter into the owner's shard at 1-3), and accumulated: k == 0 stores the
   reduced values, k > 0 adds them (device add: one rounding to the comm dtype).

   Queues. Work the user enqueues on COMPUTE is handed to COMM by recording
   sync.compute_to_comm on COMPUTE and making COMM wait on it; COMM work is handed back by
   sync.comm_to_compute. Buffers reused by COMPUTE after COMM touched them (arena extents: a
   gradient buffer reduced, a prefetch never used; stage 0-1 gradient slices) wait on an
   event recorded on COMM after that work (the extent's fence). */

#define ZERO__ENG_MAX_ALLOCS 16
#define ZERO__ENG_SCRATCH_BYTES 64
/* scratch layout (bytes): sumsq f64 at 0, flag f32 at 8, grad_mul out[2] f32 at 12..19;
   at commit, the check f64[5] at 24..63 (hash halves, their negations, a failure code). */

enum { ZERO__ENG_CREATED = 0, ZERO__ENG_COMMITTED = 1, ZERO__ENG_BROKEN = 2 };
enum { ZERO__GRADS_NONE = 0, ZERO__GRADS_HANDED = 1, ZERO__GRADS_READY = 2 };

#define ZERO__ENG_NONE ((size_t)-1) /* no arena extent */

typedef struct zero__eng_group {
    /* numel: the params (trained region + frozen region); gnumel: the trained region (the
       gradient buffer); shard_numel = gnumel / N (gradient and optimizer shard); pshard_numel
       = numel / N (the stage-3 param shard: trained slice, then frozen slice) */
    size_t numel, shard_numel, used_numel, gnumel, pshard_numel;
    size_t off_gwhole; /* in the whole gradient / stage-0 optimizer layout (sum of gnumel) */
    size_t off_pstage; /* in a layout of every group's pshard_numel (checkpoint staging)  */
    size_t off_sec;    /* hpZ: in the secondary buffer (numel / S per partitioned group)    */
    int persistent; /* stage 3 only */
    size_t off_whole, off_shard, off_param;
    int refs;            /* outstanding user gathers                                      */
    size_t poff;         /* stage 3: arena offset of the gathered params, or NONE         */
    size_t goff;         /* stages 2-3: arena offset of the gradient buffer, or NONE      */
    size_t phome, ghome; /* their fixed offsets when the arena holds everything at once   */
    int grads_state;     /* ZERO__GRADS_*                                                 */
    int parts;           /* gradient contributions per micro-step (zero_engine_set_grad_parts) */
    int parts_ready;     /* of which made ready in this micro-step                        */
    zero_event *ev_gathered; /* stage 3: recorded on COMM after the all-gather            */
    zero_event *ev_reduced;  /* recorded on COMM after the reduction that read the buffer */
    uint64_t gathered_seq, reduced_seq; /* their fence numbers (zero__eng_fence)          */
    int reduced_valid;
} zero__eng_group;

/* A free extent of the arena. fence/fence_seq: the latest event recorded on COMM after COMM
   work that touched it (an all-gather never waited for, a reduction that read a gradient
   buffer); compute-queue work reusing the extent waits on it first. Events are recorded on
   one in-order queue, so the latest of two covers both. */
typedef struct zero__eng_extent {
    size_t off, numel;
    zero_event *fence;
    uint64_t fence_seq;
} zero__eng_extent;

typedef struct zero__eng_allocation {
    void *ptr;
    size_t bytes;
    zero_mem_category cat;
} zero__eng_allocation;

/* Offloaded step: a tile is up to tile_numel elements of one group's shard; a piece is one
   tensor's part of a tile (what one host Adam call updates). */
typedef struct zero__eng_tile {
    int group;
    size_t begin, numel; /* within the group's shard */
    int first, count;    /* its pieces */
} zero__eng_tile;

typedef struct zero__eng_piece {
    int tensor;
    size_t off, numel; /* within the tile */
    size_t elem;       /* its first element's index within the tensor */
} zero__eng_piece;

#define ZERO__ENG_MAX_HOST_ALLOCS 16
#define ZERO__ENG_RA_MAX 16 /* param_read_ahead's largest value */

/* A tensor's registered shape (checkpoints, safetensors); ndim 0 = none. */
typedef struct zero__eng_shape {
    int ndim;
    uint64_t dims[ZERO_TENSOR_MAX_DIMS];
} zero__eng_shape;

#ifdef ZERO_DEBUG
#define ZERO__DEBUG_DEFAULT 1 /* zero_engine_desc.debug_guards = 0 means on */
#else
#define ZERO__DEBUG_DEFAULT 0
#endif

/* The engine's state, grouped by concern. Each sub-struct below is one concern; the stage
   logic reads them as e->cfg.world, e->layout.groups[g], e->buf.arena, e->host.tiles, ... */

/* What the engine was created with: the resolved descriptor (zero fields replaced by their
   defaults at create; max_live_numel at commit), the device and comm it runs on, this
   rank's place, the ZeRO stage, and the two dtypes of the gradient rule (the param/gradient
   dtype and the comm/accumulation dtype) with their element sizes. Fixed after create. */
typedef struct zero__eng_config {
    zero_engine_desc desc; /* resolved */
    zero_device *dev;
    zero_comm *comm;
    int rank, world, stage;
    int accum_steps;              /* micro-steps per step (gradient_accumulation_steps)   */
    zero_dtype param_dtype;       /* params and the user's gradients                      */
    zero_dtype comm_dtype;        /* reductions and the gradient accumulator              */
    size_t param_size, comm_size; /* their element sizes in bytes                         */
    zero_dtype opt_dtype;         /* master, m, v: F32 or BF16 (optimizer_dtype)           */
    size_t opt_size;              /* its element size: 4 or 2                              */
    int opt_offloaded;            /* offload_optimizer != NONE: master, m, v off the device */
    int params_offloaded;         /* offload_param != NONE: partitioned param shards off it */
} zero__eng_config;

/* What the plan made of the registered tensors: the tensors (flags, shapes, tiled tensors,
   gradient parts asked for before commit), the group table (each group's sizes, offsets in
   the whole / shard / param layouts, and its gather and gradient state), and the sizes
   that every buffer is derived from. */
typedef struct zero__eng_tensor_layout {
    zero_plan *plan;
    unsigned *tensor_flags; /* per tensor: ZERO_TENSOR_* flags                         */
    int ntensors, cap_tensors;
    /* shapes given by zero_engine_add_tensor_shape() (entries past cap_shapes: none) */
    zero__eng_shape *shapes;
    int cap_shapes;
    int *tiled;           /* tiled tensors: (tile 0's id, k) pairs, zero_engine_tile_view */
    size_t *tiled_dims;   /* their (rows, cols)                                          */
    int ntiled, cap_tiled;
    int *parts_req;       /* before commit: zero_engine_set_grad_parts, by group         */
    int cap_parts_req, total_parts;
    int ngroups;
    zero__eng_group *groups;
    size_t total_numel;           /* the whole layout: every group's numel (P)          */
    size_t gtotal_numel;          /* the trained part of it: every group's gnumel (P - F) */
    size_t pshard_total;          /* every group's pshard_numel (P / N)                 */
    int any_frozen;               /* some tensor is ZERO_TENSOR_FROZEN                   */
    size_t shard_numel;           /* the shard layout: every group's shard numel (S)    */
    size_t max_group_numel;       /* the largest group's numel                          */
    size_t second_group_numel;    /* the second largest (the largest if only one group) */
    size_t max_partitioned_numel; /* the largest non-persistent group's numel           */
    int acc_is_user_grad; /* the accumulator is the user gradient buffer (stages 0-1, accum 1,
                             comm dtype == param dtype) */
} zero__eng_tensor_layout;

/* The engine's device memory: one allocation per kind of buffer (the layouts in the
   comment above), and its accounting by category. bucket = the staging of reductions
   that need one (comm dtype), in pieces of bucket_piece_numel elements per rank; arena =
   stage-3 gathered params and stage 2-3 gradient buffers (param dtype), handed out by the
   pool. The optimizer states are in opt (device, host or NVMe). */
typedef struct zero__eng_buffers {
    unsigned char *param, *grad_user, *grad_acc, *bucket, *arena, *scratch;
    size_t bucket_piece_numel; /* per-rank elements of one staged reduction piece */
    zero__eng_allocation allocs[ZERO__ENG_MAX_ALLOCS];
    int nallocs;
    size_t mem[ZERO_MEM_COUNT], mem_peak[ZERO_MEM_COUNT], mem_total, mem_peak_total;
} zero__eng_buffers;

/* The optimizer: Adam's settings, the loss scaler, the completed step count, and the fp32
   master params and Adam moments m, v of this rank's shard (the whole layout at stage 0).
   master, m, v are device pointers, host pointers with offload_optimizer = cpu, and NULL
   with offload_optimizer = nvme (their tiles are in the NVMe tier then). */
typedef struct zero__eng_optimizer {
    zero_adam_desc adam;
    zero_scaler scaler;
    int64_t step;
    float *master, *m, *v; /* optimizer_dtype BF16: bf16 bits (index with zero__opt_at)   */
    uint64_t *model_off;   /* per tensor: its first element's global index (the numel of
                              the tensors registered before it): the stochastic rounding's
                              counter                                                      */
    uint64_t sr_key;       /* this step's zero_sr_key(optimizer_seed, step)                */
    /* offload_optimizer_ratio < 1: the device part of master, m, v (elements [H, S) of the
       shard, H = host.opt_numel) and its gradients, uploaded from the host tier at the step */
    float *dmaster, *dm, *dv;
    unsigned char *dgrad;
    /* per tensor (zero_engine_set_tensor_hparams): the lr multiplier, the weight decay (< 0:
       the default) and this step's Adam constants made from them */
    double *lr_mul, *wd;
    zero_adam_coefs *coefs;
} zero__eng_optimizer;

/* The arena's free list (stages 2-3): free extents sorted by offset (placement: the
   comment at zero__eng_arena_choose). */
typedef struct zero__eng_pool {
    size_t numel;     /* the arena's size in elements                                     */
    size_t all_numel; /* what can ever be live at once; numel == all_numel: fixed homes   */
    size_t held_numel; /* held by the user now: gathered groups in use (refs > 0) and
                          gradient buffers handed out (neither evictable nor flushable)    */
    int held_count;    /* how many buffers that is                                         */
    size_t need_max;   /* the most any request since commit needed (zero__eng_arena_need)  */
    zero__eng_extent *free_ext;
    int nfree, cap_free;
} zero__eng_pool;

/* Ordering between the queues (the comment above): the hand-off events, and the numbering
   of the fences recorded on COMM. */
typedef struct zero__eng_sync {
    zero_event *compute_to_comm, *comm_to_compute;
    zero_event *compute_to_offload, *comm_to_offload, *offload_to_comm; /* ZERO_QUEUE_OFFLOAD */
    uint64_t fence_seq;   /* fence events recorded on COMM so far                       */
    uint64_t compute_seq; /* the compute queue is ordered after fences up to this one   */
} zero__eng_sync;

/* Stage-3 prefetch: the order of one micro-step's gathers and gradient buffers, as recorded
   (entries 2 g for gather(g), 2 g + 1 for grads(g)); prefetch follows it up to depth
   groups ahead. stats: what zero_engine_gather_stats reports. */
typedef struct zero__eng_prefetch {
    int *trace;
    int trace_len, trace_cap, trace_pos;
    int trace_following; /* 1: trace is complete and this micro-step matches it so far  */
    int depth;           /* prefetch_depth */
    zero_gather_stats stats;
} zero__eng_prefetch;

/* The current step's micro-steps: how many are complete, which groups are ready in the
   current one, and the groups whose reduction is pending (pending_store: per entry, the
   step's first contribution, which stores instead of adding). */
typedef struct zero__eng_micro {
    int done;         /* complete micro-steps in this step                 */
    int ready_groups; /* groups ready in the current micro-step            */
    int *pending;
    unsigned char *pending_store;
    int npending;
    size_t pending_numel;
} zero__eng_micro;

/* The topology: ranks_per_node resolved, and the peers this rank has on its own node in
   the engine's comm (the traffic counters' split). */
typedef struct zero__eng_topo {
    int rpn;       /* ranks per node (R)                               */
    int same_node; /* peers on this rank's node in cfg.comm: R - 1     */
    int world_all, rank_all; /* cfg.comm's (cfg.world, cfg.rank: the shard group's with MiCS) */
    int mics;      /* MiCS shard group size S; 0 = off                 */
    zero_comm *shard, *replica; /* MiCS: the group of S ranks, the N / S replicas (owned) */
    int shard_same, replica_same; /* their peers on this rank's node */
    /* hpZ (hpz_partition_size): the S ranks [k S, (k + 1) S) (owned), this rank's secondary
       parts (device, group g's numel / S at its off_sec), and per group (host) whether they
       hold the current params */
    int hpz;
    zero_comm *hpz_comm;
    int hpz_same;
    unsigned char *hpz_buf;
    unsigned char *hpz_valid;
    /* hierarchical qgZ (quantized_gradient_levels = 2): this rank's node (R ranks, by local
       index) and its peers of the same local index on every node (N / R, by node); owned */
    zero_comm *qgz_node, *qgz_cross;
} zero__eng_topo;

/* Collective traffic: the running total, the current step's, the last completed step's,
   and the count of collectives run (the seq of comm->tag). */
typedef struct zero__eng_traffic {
    zero_traffic total, cur, last;
    uint64_t coll_seq;
} zero__eng_traffic;

/* Offload (ZeRO-Offload): the host tier. With offload_optimizer opt.master, opt.m, opt.v
   are host pointers; with offload_param the partitioned groups' param shards live in params
   (group g at off_param[g]) and buf.param holds the persistent groups only. The optimizer
   step runs over tiles of up to tile_numel elements of one group's shard. */
typedef struct zero__eng_host_tier {
    unsigned char *params; /* host param shards (offload_param)                  */
    size_t params_numel;
    /* the reduced gradients off the device (with offload_optimizer): each group's reduced
       shard is downloaded into grad (shard_numel elements, comm dtype, group g at
       off_shard[g]) as the reduction produces it; micro-steps k > 0 land in grad_in (the
       largest shard) and are added on the host, deferred until the next download or the
       step */
    unsigned char *grad, *grad_in;
    int grad_add_group;         /* the group whose host add is pending, -1 none */
    unsigned char *tile_params; /* staging: 2 param tiles */
    size_t tile_numel;
    zero__eng_tile *tiles;
    zero__eng_piece *pieces;
    int ntiles, npieces;
    /* offload_optimizer_ratio < 1: the host tier holds elements [0, opt_numel) of the
       rank's shard (tiles [0, ntiles)); the device holds [opt_numel, S) (opt.dmaster, dm,
       dv, dgrad; tiles [ntiles, ntiles + ndtiles), updated by the device's Adam) */
    size_t opt_numel;
    int ndtiles;
    zero__eng_allocation allocs[ZERO__ENG_MAX_HOST_ALLOCS];
    int pinned[ZERO__ENG_MAX_HOST_ALLOCS];
    int nallocs;
    size_t mem[ZERO_MEM_COUNT], mem_peak[ZERO_MEM_COUNT], mem_total, mem_peak_total;
} zero__eng_host_tier;

/* NVMe tier (ZeRO-Infinity): with offload_optimizer = nvme the master, m, v of tile k live
   in the rank's file opt_file at tile_off[k] (master, m, v of its numel elements, one range
   with one checksum), swapped through nswap host slots of swap_stride bytes. */
typedef struct zero__eng_nvme_tier {
    zero_io *io;
    zero_io_file *opt_file;
    uint64_t *tile_off;
    unsigned char *swap;
    size_t swap_stride;
    int nswap;
    zero_io_ticket *swap_ticket; /* per slot: the read or write in flight, 0 = none */
    size_t mem[ZERO_MEM_COUNT], mem_total;
    /* offload_param = nvme: partitioned group g's param shard is one range of param_file at
       param_off[g]; param_buf holds param_buf_slots shard buffers ("slots") of
       param_buf_stride bytes (the step alternates slots 0 and 1 by group parity). */
    zero_io_file *param_file;
    uint64_t *param_off;
    unsigned char *param_buf;
    size_t param_buf_stride;
    zero_io_ticket param_buf_ticket[2];
    int param_buf_slots;
    /* between steps (set_tensor, read_tensor, checkpoints, gathers) the NVMe tier is reached
       through two write-back caches: one tile record in swap slot cached_tile_slot and one
       group's param shard in shard slot cached_group_slot. A cache moving to another record
       or shard writes the old one behind (asynchronously, from its slot, which then waits
       for its write before reuse); every write behind is waited for before the step (which
       uses the buffers), at the start of a save and the end of a load, so its error is
       returned by one of those calls or by the call that needed its slot. */
    int cached_tile, cached_tile_dirty; /* tile in swap slot cached_tile_slot (-1 none), changed */
    int cached_tile_mv;                 /* the cached record's m, v may be nonzero             */
    int cached_tile_slot;
    int *swap_tile_behind;              /* per swap slot: tile written behind from it or read
                                           ahead into it (the next ones in shard order), -1    */
    int records_ahead_max;              /* most record reads ahead in flight at once (tests)   */
    unsigned char *swap_mv;             /* per swap slot: 1 when its m and v areas hold the
                                           record's (a master-only or fresh record's are zeroed
                                           on first use, not when it comes into the slot)      */
    int cached_group, cached_group_dirty, cached_group_slot; /* group in its slot (-1 none), changed */
    /* records (per tile) and param shards (per group) never written since commit: they hold
       the preallocated file's zeros, so reading them is replaced by zero-filling the buffer.
       tile_fresh[k] = 2: only the record's master was written (one range of 4 x numel bytes
       at its offset; m and v are zeros, as after set_tensor of every tensor), so 4 of its 12
       bytes per element are written and read. */
    unsigned char *tile_fresh, *group_fresh;
    /* per shard slot: the group being read ahead into it or written behind from it, or
       whose shard it holds clean (-1 none), its ticket, and which; stage-3 gathers read up
       to ahead_depth groups ahead of the shard they upload, in the recorded order */
    int ahead_depth, ahead_prev; /* ahead_prev: the group read ahead from last (-1 none) */
    int ahead_group[ZERO__ENG_RA_MAX + 1];
    zero_io_ticket ahead_ticket[ZERO__ENG_RA_MAX + 1];
    unsigned char ahead_write[ZERO__ENG_RA_MAX + 1];
} zero__eng_nvme_tier;

/* async_step: a step enqueued, its verdict not read yet. */
typedef struct zero__eng_async {
    int pending;
    float scale_used;
    zero_event *after_step; /* recorded on COMPUTE after the enqueued step; OFFLOAD waits on it */
    zero_step_info last_info;
    int at_min_unreported; /* an overflow at the minimum scale not yet returned */
} zero__eng_async;

/* delayed_update (DPU, docs/offload.md "Delayed parameter update"): the host Adam of a
   step's gradients runs on a background thread while the caller's next forward and backward
   run; it reads the gradient shard that was host.grad (host.grad then becomes the spare, so
   the next backward lands elsewhere) and writes master, m, v in place and the new params
   into 'params' (the rank's shard, group g at off_shard[g]), which the next step (or
   zero_engine_finish_update) publishes to the device. */
typedef struct zero__eng_dpu {
    int on, after;              /* delayed_update, delayed_update_after (K)                    */
    unsigned char *spare;       /* the other gradient shard (host, S x comm dtype)             */
    unsigned char *params;      /* the pending params (host, S x param dtype)                  */
    const unsigned char *grad;  /* the gradients the running update reads                      */
    zero_adam_coefs *coefs;     /* per tensor: the constants of the delayed update             */
    float mul;                  /* its gradient multiplier                                     */
    uint64_t sr_key;            /* its stochastic-rounding key (bf16 states)                   */
    int publish;                /* params holds an update not yet published                    */
    int running;                /* the background thread runs (joined before anything reads
                                   master, m, v or params)                                     */
    int threaded;               /* the thread was started (else the update ran inline)         */
    pthread_t thread;
    zero_result result;         /* the update's result                                         */
    char why[400];
} zero__eng_dpu;

/* debug_guards: hand out guarded copies of params and gradients. */
typedef struct zero__eng_debug {
    int guards;   /* debug_guards resolved */
    void **copies; /* per group, its param copy [2g] and grad copy [2g+1] (device memory,
                      allocated on first use), each + guard bytes */
    uint64_t *set_hash; /* per tensor, FNV-1a of the values zero_engine_set_tensor last got */
    int set_pending;    /* set_tensor called since the last cross-rank comparison */
} zero__eng_debug;

/* ZeRO++'s quantized collectives: the settings, the device buffer of the quantized blocks
   (send part, then receive part; used on COMM only, so qwZ and qgZ share it) and, per group,
   whether its forward (quantized) gather ran in this micro-step. */
typedef struct zero__eng_quant {
    int weights;          /* qwZ on                                                        */
    int grad_bits;        /* qgZ: 4 or 8; 0 = off                                          */
    int levels;           /* qgZ: 1 flat, 2 hierarchical (topo.qgz_node, topo.qgz_cross)     */
    size_t block;         /* elements per block                                            */
    unsigned char *buf;   /* device                                                        */
    size_t send_bytes;    /* the send part; the receive part follows                       */
    size_t sum_off;       /* hierarchical qgZ: the fp32 partial sum of one block (the largest
                             shard's elements), at buf + sum_off after the receive part      */
    unsigned char *fwd;   /* per group (host): the forward's quantized gather was issued     */
} zero__eng_quant;

struct zero_engine {
    int lifecycle;         /* ZERO__ENG_CREATED, _COMMITTED or _BROKEN                     */
    char broken_why[480];  /* why the engine is ZERO__ENG_BROKEN, for every later call     */
    zero__eng_config cfg;
    zero__eng_tensor_layout layout;
    zero__eng_buffers buf;
    zero__eng_optimizer opt;
    zero__eng_pool pool;
    zero__eng_sync sync;
    zero__eng_prefetch prefetch;
    zero__eng_micro micro;
    zero__eng_traffic traffic;
    zero__eng_topo topo;
    zero__eng_host_tier host;
    zero__eng_nvme_tier nvme;
    zero__eng_async async;
    zero__eng_dpu dpu;
    zero__eng_debug debug;
    struct zero__act *act; /* the activation tier (zero_engine_stash); NULL without one */
    struct zero__gnv *gnv; /* offload_gradients = nvme: the NVMe tier of the reduced
                              gradients (zero__gnv_*); NULL otherwise */
    zero__eng_quant quant; /* ZeRO++'s qwZ / qgZ */
    struct zero__soff *soff; /* zero_engine_offload_states: what is off the device; NULL
                                when nothing is */
};

/* The activation tier: its subsection at the end of the engine. */
struct zero__act;
static zero_result zero__act_resolve(zero_engine_desc *d);
static zero_result zero__act_alloc(zero_engine *e);
static void zero__act_free(zero_engine *e);
static void zero__act_account(const zero_engine *e, zero_mem_tier tier, zero_engine_memory *out);

/* ---- small helpers ---------------------------------------------------------------------- */

static void zero__eng_free_host(zero_engine *e);
static zero_result zero__dpu_join(zero_engine *e);
static unsigned char *zero__eng_grad_acc_shard(const zero_engine *e, int g);
static zero_result zero__eng_nvme_alloc(zero_engine *e);
static void zero__eng_nvme_free(zero_engine *e);
static zero_result zero__eng_hparam_get(zero_engine *e, int g, unsigned char **out);
static zero_result zero__eng_hparam_put(zero_engine *e, int g);
static void zero__eng_ra_start(zero_engine *e, int g);
static zero_result zero__eng_nvme_agree(zero_engine *e, zero_result io_r, const char *io_err,
                                        const char *what, int group);
/* ---- the NVMe tier of the reduced gradients (offload_gradients = nvme) ----

   With offload_gradients = nvme the rank's reduced gradient shard lives in its gradient file
   (zero-grad-r<rank>-...) instead of host memory: tile k's gradients (tiles[k].numel
   elements of the comm dtype) are one range at off[k], aligned, with one checksum, so the
   step reads them with the tile's master, m, v record. A group's reduced shard is downloaded
   (on OFFLOAD) into one of two staging buffers of the largest shard; when the next group's
   download starts (or the step), the host syncs OFFLOAD and "settles" it:
     - the step's first contribution: the group's tiles are written from the staging buffer;
     - a later one (micro-step k > 0, or a later part): the group's tiles are read back into
       a third buffer, the new values added on the host (the host device's add: the same
       order and rounding as the host tier), and the sum written back;
     - either way the group's inf/NaN flag and fp64 sum of squares are taken there, over the
       whole shard with the host kernels, and kept per group: the step adds them in group
       order, the same values in the same order as the host tier's loop over its buffer, so
       the verdict and the norm are the same bits.
   A staging buffer is reused once the writes that read it are done (two groups later). An
   I/O failure is kept (the first one) and the backward goes on without more gradient I/O, so
   every rank still joins every collective; the step's NVMe agreement then fails every rank
   with the cause. Host memory: 2 (3 with accumulation or gradient parts) x the largest shard
   + buffer_count gradient tiles, none of which grows with Psi. */
struct zero__gnv {
    zero_io *io;                /* the engine's I/O engine (not owned)                     */
    zero_io_file *file;
    uint64_t *off;              /* per tile: its gradient range                            */
    zero_io_ticket *wt;         /* per tile: the transfer in flight on its range, 0 none   */
    int *tile0;                 /* per group (G + 1): its first tile                       */
    double *sumsq;              /* per group: the sum of squares of its current gradients  */
    unsigned char *nonfinite;   /* per group: 1 when they hold an inf or NaN               */
    unsigned char *buf;         /* host staging (pinned where the device can): nbuf x stride */
    size_t stride;
    int nbuf;                   /* 2, or 3 when contributions are added (the read-back)    */
    int buf_group[3];           /* the group whose writes may still read buffer i, -1 none */
    int cur;                    /* the download buffer of the next group (0 or 1)          */
    int pend_group, pend_store, pend_buf; /* the download not settled yet (group -1 none)   */
    unsigned char *slots;       /* the step's gradient tiles: nswap x slot_stride          */
    size_t slot_stride;
    zero_io_ticket *slot_ticket;
    zero_result err;            /* the first I/O failure since the last step, and why      */
    char why[400];
};

static zero_result zero__gnv_alloc(zero_engine *e);
static void zero__gnv_free(zero_engine *e);
static zero_result zero__gnv_out(zero_engine *e, int g, int store, const unsigned char *dev_src,
                                 size_t j, size_t n);
static zero_result zero__gnv_norm(zero_engine *e, double *sumsq, float *flag);

ZERODEF const char *zero_coll_name(zero_coll kind)
{
    switch (kind) {
    case ZERO_COLL_ALL_GATHER: return "all_gather";
    case ZERO_COLL_REDUCE_SCATTER: return "reduce_scatter";
    case ZERO_COLL_ALL_REDUCE: return "all_reduce";
    case ZERO_COLL_BROADCAST: return "broadcast";
    case ZERO_COLL_CONTROL: return "control";
    case ZERO_COLL_USER: return "user";
    case ZERO_COLL_COUNT: break;
    }
    return "?";
}

ZERODEF double zero_traffic_payload_numel(const zero_traffic *t)
{
    double s = 0.0;
    int k;
    if (!t) return 0.0;
    for (k = 0; k < ZERO_COLL_CONTROL; k++) s += t->numel[k];
    return s;
}

/* Copies the calling thread's last error text (bounded), to quote it in a new one. */
static void zero__eng_copy_error(char *dst, size_t n)
{
    const char *src = zero_last_error();
    size_t i;
    for (i = 0; i + 1 < n && src[i]; i++) dst[i] = src[i];
    dst[i] = '\0';
}

/* Keeps the detail of a backend failure, prefixed with what the engine was doing, and
   marks the engine broken (a collective or device op failed half way). */
static zero_result zero__eng_break(zero_engine *e, zero_result r, const char *what)
{
    char prev[400];
    zero__eng_copy_error(prev, sizeof prev);
    if (e && e->lifecycle == ZERO__ENG_COMMITTED) {
        e->lifecycle = ZERO__ENG_BROKEN;
        snprintf(e->broken_why, sizeof e->broken_why, "a device or comm failure in %.60s: %.200s",
                 what, prev);
    }
    return zero__fail(r, "zero_engine: %s failed (engine broken): %.380s", what, prev);
}

/* Marks the engine broken after a failed commit and returns its error (the message kept for
   every later call). */
static zero_result zero__eng_commit_failed(zero_engine *e, zero_result r, const char *msg)
{
    e->lifecycle = ZERO__ENG_BROKEN;
    snprintf(e->broken_why, sizeof e->broken_why, "its commit failed (%s: %.360s)",
             zero_result_string(r), msg);
    return zero__fail(r, "%.480s", msg);
}

#define ZERO__ENG_TRY(e, call, what)                                                          \
    do {                                                                                     \
        zero_result zr_ = (call);                                                            \
        if (zr_ != ZERO_OK) return zero__eng_break((e), zr_, (what));                        \
    } while (0)

static zero_result zero__eng_usable(const zero_engine *e, const char *fn)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: engine is NULL", fn);
    if (e->lifecycle == ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: engine not committed", fn);
    if (e->lifecycle == ZERO__ENG_BROKEN)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "%s: the engine is unusable (destroy it with zero_engine_destroy and "
                          "create a new one): %s",
                          fn, e->broken_why[0] ? e->broken_why : "an earlier failure");
    if (e->soff)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "%s: the model states are offloaded (zero_engine_offload_states); "
                          "call zero_engine_reload_states first", fn);
    return ZERO_OK;
}

static zero_result zero__eng_group_arg(const zero_engine *e, int group, const char *fn)
{
    if (group < 0 || group >= e->layout.ngroups)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "%s: group %d unknown (groups 0..%d)", fn, group,
                          e->layout.ngroups - 1);
    return ZERO_OK;
}

static zero_result zero__eng_record(zero_engine *e, zero_queue q, zero_event *ev)
{
    if (!ev || !e->cfg.dev->ops->record) return ZERO_OK;
    return e->cfg.dev->ops->record(e->cfg.dev, q, ev);
}

static zero_result zero__eng_wait(zero_engine *e, zero_queue q, zero_event *ev)
{
    if (!ev || !e->cfg.dev->ops->wait) return ZERO_OK;
    return e->cfg.dev->ops->wait(e->cfg.dev, q, ev);
}

/* Orders 'to' after everything enqueued on 'from' so far. */
static zero_result zero__eng_handoff(zero_engine *e, zero_queue from, zero_queue to)
{
    zero_event *ev = from == ZERO_QUEUE_COMPUTE ? e->sync.compute_to_comm : e->sync.comm_to_compute;
    zero_result r = zero__eng_record(e, from, ev);
    if (r == ZERO_OK) r = zero__eng_wait(e, to, ev);
    /* compute now follows every fence recorded on COMM so far */
    if (r == ZERO_OK && from == ZERO_QUEUE_COMM && to == ZERO_QUEUE_COMPUTE)
        e->sync.compute_seq = e->sync.fence_seq;
    return r;
}

/* Records ev on COMM as the next fence; its number goes to *seq. */
static zero_result zero__eng_fence(zero_engine *e, zero_event *ev, uint64_t *seq)
{
    zero_result r = zero__eng_record(e, ZERO_QUEUE_COMM, ev);
    if (r == ZERO_OK) *seq = ++e->sync.fence_seq;
    return r;
}

static void *zero__eng_comm_queue(zero_engine *e)
{
    return e->cfg.dev->ops->native_queue
               ? e->cfg.dev->ops->native_queue(e->cfg.dev, ZERO_QUEUE_COMM)
               : NULL;
}

/* ---- counted collectives ------------------------------------------------------------------ */

/* Counts one collective: numel is its bus volume per rank (the zero_traffic formulas); unit
   the elements exchanged with each peer of the comm it ran on (size ranks, 'same' of them
   peers on this rank's node): intra = unit x same, inter = unit x (size - 1 - same)
   (docs/engine.md, "Traffic"). */
static void zero__eng_count(zero_engine *e, zero_coll kind, double numel, zero_dtype dtype,
                            double unit, int size, int same)
{
    double es = (double)zero_dtype_size(dtype), bytes = numel * es;
    double intra = unit * (double)same * es, inter = unit * (double)(size - 1 - same) * es;
    e->traffic.cur.calls[kind]++;
    e->traffic.cur.numel[kind] += numel;
    e->traffic.cur.bytes[kind] += bytes;
    e->traffic.cur.intra_bytes[kind] += intra;
    e->traffic.cur.inter_bytes[kind] += inter;
    e->traffic.total.calls[kind]++;
    e->traffic.total.numel[kind] += numel;
    e->traffic.total.bytes[kind] += bytes;
    e->traffic.total.intra_bytes[kind] += intra;
    e->traffic.total.inter_bytes[kind] += inter;
}

/* Every engine collective carries its identity (group, role, running count) in the comm's
   tag; the tag is cleared after the call so a direct user of the same comm is untagged. */
static void zero__eng_tag_on(zero_engine *e, zero_comm *c, int group, zero_comm_role role)
{
    c->tag.group = (int32_t)group;
    c->tag.role = (int32_t)role;
    c->tag.seq = e->traffic.coll_seq++;
}

static void zero__eng_tag(zero_engine *e, int group, zero_comm_role role)
{
    zero__eng_tag_on(e, e->cfg.comm, group, role);
}

static void zero__eng_untag(zero_engine *e)
{
    memset(&e->cfg.comm->tag, 0, sizeof e->cfg.comm->tag);
}

/* The comm a collective runs on. Flat: cfg.comm. MiCS: the layout's collectives (every
   all-gather and reduce-scatter, the step's flag and norm) on the shard group, whose ranks
   hold the partition; the agreements (commit, checkpoint, offload, the user's values) on
   cfg.comm, so every rank of the world joins them. *same: its peers on this rank's node. */
static zero_comm *zero__eng_route(zero_engine *e, int layout, int *same)
{
    if (e->topo.shard && layout) {
        *same = e->topo.shard_same;
        return e->topo.shard;
    }
    *same = e->topo.same_node;
    return e->cfg.comm;
}

static zero_result zero__eng_all_gather(zero_engine *e, const void *send, void *recv,
                                        size_t send_numel, zero_dtype dtype, int group,
                                        zero_comm_role role)
{
    zero_result r;
    int same;
    zero_comm *c = zero__eng_route(e, 1, &same);
    zero__eng_tag_on(e, c, group, role);
    r = c->ops->all_gather(c, send, recv, send_numel, dtype, zero__eng_comm_queue(e));
    memset(&c->tag, 0, sizeof c->tag);
    if (r == ZERO_OK)
        zero__eng_count(e, ZERO_COLL_ALL_GATHER, (double)send_numel * (double)(c->world - 1),
                        dtype, (double)send_numel, c->world, same);
    return r;
}

/* A collective whose wire bytes are not numel x a dtype's size (the quantized ones, on
   cfg.comm): numel counts the elements it stands for, unit the bytes this rank exchanges with
   each of its N - 1 peers (split by the topology as zero__eng_count does). */
static void zero__eng_count_split(zero_engine *e, zero_coll kind, double numel, double intra,
                                  double inter)
{
    e->traffic.cur.calls[kind]++;
    e->traffic.cur.numel[kind] += numel;
    e->traffic.cur.bytes[kind] += intra + inter;
    e->traffic.cur.intra_bytes[kind] += intra;
    e->traffic.cur.inter_bytes[kind] += inter;
    e->traffic.total.calls[kind]++;
    e->traffic.total.numel[kind] += numel;
    e->traffic.total.bytes[kind] += intra + inter;
    e->traffic.total.intra_bytes[kind] += intra;
    e->traffic.total.inter_bytes[kind] += inter;
}

static void zero__eng_count_bytes(zero_engine *e, zero_coll kind, double numel, double unit)
{
    double N = (double)e->cfg.world, same = (double)e->topo.same_node;
    zero__eng_count_split(e, kind, numel, unit * same, unit * (N - 1.0 - same));
}

/* qwZ: all-gathers n param elements per rank from src into dst (rank r's at dst + r n) as
   int8 blocks: quantize this rank's n, all-gather the packed bytes (as fp32 words, a pure
   copy), dequantize every rank's (this rank's too, so every rank holds the same values).
   Counted as an all-gather of n (N-1) elements and P (N-1) bytes, P the packed size. */
static zero_result zero__eng_all_gather_q(zero_engine *e, const void *src, void *dst, size_t n,
                                          int group)
{
    zero_device *dev = e->cfg.dev;
    unsigned char *send = e->quant.buf, *recv = e->quant.buf + e->quant.send_bytes;
    size_t P = 0, N = (size_t)e->cfg.world, ps = e->cfg.param_size, r;
    zero_result x = zero__quant_size("gather", n, 8, e->quant.block, &P);
    if (x == ZERO_OK)
        x = dev->ops->quantize(dev, ZERO_QUEUE_COMM, send, src, e->cfg.param_dtype, n, 8,
                               e->quant.block);
    if (x == ZERO_OK) {
        zero__eng_tag(e, group, ZERO_ROLE_GATHER);
        x = e->cfg.comm->ops->all_gather(e->cfg.comm, send, recv, P / 4, ZERO_F32,
                                         zero__eng_comm_queue(e));
        zero__eng_untag(e);
    }
    if (x != ZERO_OK) return x;
    zero__eng_count_bytes(e, ZERO_COLL_ALL_GATHER, (double)n * (double)(N - 1), (double)P);
    for (r = 0; r < N && x == ZERO_OK; r++)
        x = dev->ops->dequantize(dev, ZERO_QUEUE_COMM, (unsigned char *)dst + r * n * ps,
                                 e->cfg.param_dtype, recv + r * P, 0, 1, n, 8, e->quant.block);
    return x;
}

/* qgZ: the reduce-scatter of n elements per rank (send: N blocks of n in the param dtype,
   block r for rank r) into recv (n elements of the param dtype): every block quantized, an
   all_to_all of the packed blocks, then the N received dequantized and summed in fp32 in
   rank order, rounded once. Counted as a reduce-scatter of n (N-1) elements, P (N-1) bytes. */
static zero_result zero__eng_reduce_scatter_q(zero_engine *e, const void *send_v, void *recv_v,
                                              size_t n, int group)
{
    zero_device *dev = e->cfg.dev;
    unsigned char *send = e->quant.buf, *recv = e->quant.buf + e->quant.send_bytes;
    size_t P = 0, N = (size_t)e->cfg.world, ps = e->cfg.param_size, r;
    int bits = e->quant.grad_bits;
    zero_result x = zero__quant_size("gradient reduction", n, bits, e->quant.block, &P);
    for (r = 0; r < N && x == ZERO_OK; r++)
        x = dev->ops->quantize(dev, ZERO_QUEUE_COMM, send + r * P,
                               (const unsigned char *)send_v + r * n * ps, e->cfg.param_dtype, n,
                               bits, e->quant.block);
    if (x == ZERO_OK) {
        zero__eng_tag(e, group, ZERO_ROLE_GRAD_REDUCE);
        x = e->cfg.comm->ops->all_to_all(e->cfg.comm, send, recv, P / 4, ZERO_F32,
                                         zero__eng_comm_queue(e));
        zero__eng_untag(e);
    }
    if (x != ZERO_OK) return x;
    zero__eng_count_bytes(e, ZERO_COLL_REDUCE_SCATTER, (double)n * (double)(N - 1), (double)P);
    return dev->ops->dequantize(dev, ZERO_QUEUE_COMM, recv_v, e->cfg.comm_dtype, recv, P,
                                (int)N, n, bits, e->quant.block);
}

/* Hierarchical qgZ (ZeRO++'s): the same reduction in two levels over R ranks per node and
   M = N / R nodes, rank r = k R + j on node k with local index j. (1) Quantize the N blocks
   ordered by destination local index, then node (send part j M + k: rank k R + j's block),
   and all_to_all inside the node (M blocks to each local rank). (2) For each node k,
   dequantize the R blocks received for rank k R + (this j) and sum them in fp32 in local-rank
   order, then re-quantize that fp32 block (send part k). (3) all_to_all among the M ranks of
   local index j, then dequantize the M received blocks and sum them in fp32 in node order,
   rounded once to the param dtype. Counted as two calls: (R - 1) M P bytes inside the node,
   (M - 1) P between nodes (against (N - R) P flat), n (R - 1) M + n (M - 1) = n (N - 1)
   elements. */
static zero_result zero__eng_reduce_scatter_q2(zero_engine *e, const void *send_v, void *recv_v,
                                               size_t n, int group)
{
    zero_device *dev = e->cfg.dev;
    unsigned char *send = e->quant.buf, *recv = e->quant.buf + e->quant.send_bytes;
    float *sum = (float *)(void *)(e->quant.buf + e->quant.sum_off);
    zero_comm *node = e->topo.qgz_node, *cross = e->topo.qgz_cross;
    size_t P = 0, R = (size_t)node->world, M = (size_t)cross->world, ps = e->cfg.param_size;
    size_t j, k;
    int bits = e->quant.grad_bits;
    zero_result x = zero__quant_size("gradient reduction", n, bits, e->quant.block, &P);
    for (j = 0; j < R && x == ZERO_OK; j++)
        for (k = 0; k < M && x == ZERO_OK; k++)
            x = dev->ops->quantize(dev, ZERO_QUEUE_COMM, send + (j * M + k) * P,
                                   (const unsigned char *)send_v + (k * R + j) * n * ps,
                                   e->cfg.param_dtype, n, bits, e->quant.block);
    if (x == ZERO_OK) {
        zero__eng_tag_on(e, node, group, ZERO_ROLE_GRAD_REDUCE);
        x = node->ops->all_to_all(node, send, recv, M * P / 4, ZERO_F32, zero__eng_comm_queue(e));
        memset(&node->tag, 0, sizeof node->tag);
    }
    if (x != ZERO_OK) return x;
    zero__eng_count_split(e, ZERO_COLL_REDUCE_SCATTER, (double)n * (double)((R - 1) * M),
                          (double)P * (double)((R - 1) * M), 0.0);
    for (k = 0; k < M && x == ZERO_OK; k++) {
        x = dev->ops->dequantize(dev, ZERO_QUEUE_COMM, sum, ZERO_F32, recv + k * P, M * P, (int)R,
                                 n, bits, e->quant.block);
        if (x == ZERO_OK)
            x = dev->ops->quantize(dev, ZERO_QUEUE_COMM, send + k * P, sum, ZERO_F32, n, bits,
                                   e->quant.block);
    }
    if (x == ZERO_OK) {
        zero__eng_tag_on(e, cross, group, ZERO_ROLE_GRAD_REDUCE);
        x = cross->ops->all_to_all(cross, send, recv, P / 4, ZERO_F32, zero__eng_comm_queue(e));
        memset(&cross->tag, 0, sizeof cross->tag);
    }
    if (x != ZERO_OK) return x;
    zero__eng_count_split(e, ZERO_COLL_REDUCE_SCATTER, (double)n * (double)(M - 1), 0.0,
                          (double)P * (double)(M - 1));
    return dev->ops->dequantize(dev, ZERO_QUEUE_COMM, recv_v, e->cfg.comm_dtype, recv, P, (int)M,
                                n, bits, e->quant.block);
}

static zero_result zero__eng_reduce_scatter(zero_engine *e, const void *send, void *recv,
                                            size_t recv_numel, zero_dtype dtype, int group)
{
    zero_result r;
    int same;
    zero_comm *c;
    if (e->quant.grad_bits && recv_numel > 0 && e->quant.levels == 2)
        return zero__eng_reduce_scatter_q2(e, send, recv, recv_numel, group);
    if (e->quant.grad_bits && recv_numel > 0) /* only the gradient reduction calls this */
        return zero__eng_reduce_scatter_q(e, send, recv, recv_numel, group);
    c = zero__eng_route(e, 1, &same);
    zero__eng_tag_on(e, c, group, ZERO_ROLE_GRAD_REDUCE);
    r = c->ops->reduce_scatter(c, send, recv, recv_numel, dtype, ZERO_OP_SUM,
                               zero__eng_comm_queue(e));
    memset(&c->tag, 0, sizeof c->tag);
    if (r == ZERO_OK)
        zero__eng_count(e, ZERO_COLL_REDUCE_SCATTER, (double)recv_numel * (double)(c->world - 1),
                        dtype, (double)recv_numel, c->world, same);
    return r;
}

static zero_result zero__eng_all_reduce(zero_engine *e, const void *send, void *recv,
                                        size_t numel, zero_dtype dtype, zero_op op, int control,
                                        int group, zero_comm_role role)
{
    zero_result r;
    int same;
    zero_comm *c = zero__eng_route(e, role == ZERO_ROLE_FLAG || role == ZERO_ROLE_NORM ||
                                          role == ZERO_ROLE_GRAD_REDUCE, &same);
    zero__eng_tag_on(e, c, group, role);
    r = c->ops->all_reduce(c, send, recv, numel, dtype, op, zero__eng_comm_queue(e));
    memset(&c->tag, 0, sizeof c->tag);
    if (r == ZERO_OK)
        zero__eng_count(e, control ? ZERO_COLL_CONTROL : ZERO_COLL_ALL_REDUCE,
                        2.0 * (double)numel * (double)(c->world - 1) / (double)c->world, dtype,
                        2.0 * (double)numel / (double)c->world, c->world, same);
    return r;
}

/* MiCS, at the step: the accumulated gradient shard of group g (n elements of the comm dtype
   at p, device or host tier) summed over the replicas in their order (the documented
   order: inside the group at each reduction, then across groups once per step). */
static zero_result zero__eng_replica_reduce(zero_engine *e, void *p, size_t n, int g)
{
    zero_comm *c = e->topo.replica;
    zero_result r;
    zero__eng_tag_on(e, c, g, ZERO_ROLE_GRAD_REDUCE);
    r = c->ops->all_reduce(c, p, p, n, e->cfg.comm_dtype, ZERO_OP_SUM, zero__eng_comm_queue(e));
    memset(&c->tag, 0, sizeof c->tag);
    if (r == ZERO_OK)
        zero__eng_count(e, ZERO_COLL_ALL_REDUCE,
                        2.0 * (double)n * (double)(c->world - 1) / (double)c->world,
                        e->cfg.comm_dtype, 2.0 * (double)n / (double)c->world, c->world,
                        e->topo.replica_same);
    return r;
}

/* hpZ: group g's gathered params into dst from the secondary parts (numel / S each) of the
   S ranks of this rank's hpZ group, inside the node. */
static zero_result zero__eng_hpz_gather(zero_engine *e, int g, unsigned char *dst)
{
    const zero__eng_group *eg = &e->layout.groups[g];
    zero_comm *c = e->topo.hpz_comm;
    size_t n = eg->numel / (size_t)c->world;
    zero_result r;
    zero__eng_tag_on(e, c, g, ZERO_ROLE_GATHER);
    r = c->ops->all_gather(c, e->topo.hpz_buf + eg->off_sec * e->cfg.param_size, dst, n,
                           e->cfg.param_dtype, zero__eng_comm_queue(e));
    memset(&c->tag, 0, sizeof c->tag);
    if (r == ZERO_OK)
        zero__eng_count(e, ZERO_COLL_ALL_GATHER, (double)n * (double)(c->world - 1),
                        e->cfg.param_dtype, (double)n, c->world, e->topo.hpz_same);
    return r;
}

/* hpZ: the secondary parts of group g (every group: g < 0) no longer hold the params (they
   are about to change): the next gather is a full one and takes them again. */
static void zero__eng_hpz_stale(zero_engine *e, int g)
{
    if (!e->topo.hpz_valid) return;
    if (g >= 0) e->topo.hpz_valid[g] = 0;
    else memset(e->topo.hpz_valid, 0, (size_t)e->layout.ngroups);
}

static zero_result zero__eng_group_start(zero_engine *e)
{
    int same;
    zero_comm *c = zero__eng_route(e, 1, &same);
    return c->ops->group_start ? c->ops->group_start(c) : ZERO_OK;
}

static zero_result zero__eng_group_end(zero_engine *e)
{
    int same;
    zero_comm *c = zero__eng_route(e, 1, &same);
    return c->ops->group_end ? c->ops->group_end(c) : ZERO_OK;
}

/* A failure between group_start and group_end: break the engine, then close the comm's
   group (NCCL's stays open per thread otherwise, and its queued calls would run on buffers
   destroy frees), keeping the first failure's message. */
static zero_result zero__eng_break_in_group(zero_engine *e, zero_result r, const char *what)
{
    char msg[512];
    r = zero__eng_break(e, r, what);
    snprintf(msg, sizeof msg, "%s", zero_last_error());
    (void)zero__eng_group_end(e);
    return zero__fail(r, "%s", msg);
}

#define ZERO__ENG_TRY_IN_GROUP(e, call, what)                                                 \
    do {                                                                                     \
        zero_result zr_ = (call);                                                            \
        if (zr_ != ZERO_OK) return zero__eng_break_in_group((e), zr_, (what));               \
    } while (0)

/* ---- create / destroy / register ---------------------------------------------------------- */

ZERODEF const char *zero_offload_device_name(zero_offload_device d)
{
    switch (d) {
    case ZERO_OFFLOAD_NONE: return "none";
    case ZERO_OFFLOAD_CPU: return "cpu";
    case ZERO_OFFLOAD_NVME: return "nvme";
    }
    return "?";
}

#include <unistd.h>

/* The online CPUs, 1..16: the default host Adam threads. */
static int zero__eng_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1) return 1;
    return n > 16 ? 16 : (int)n;
}

/* Validates and defaults the offload knobs of a descriptor (zero_engine_create). */
static zero_result zero__eng_offload_resolve(zero_engine_desc *d)
{
    const char *fn = "zero_engine_create";
    if ((int)d->offload_optimizer < 0 || d->offload_optimizer > ZERO_OFFLOAD_NVME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: offload_optimizer = %d (none, cpu or nvme)",
                          fn, (int)d->offload_optimizer);
    if ((int)d->offload_param < 0 || d->offload_param > ZERO_OFFLOAD_NVME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: offload_param = %d (none, cpu or nvme)",
                          fn, (int)d->offload_param);
    if (d->offload_optimizer != ZERO_OFFLOAD_NONE && d->stage == 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_optimizer = %s needs stage 1, 2 or 3 (stage 0 keeps the "
                          "whole optimizer state on every rank)",
                          fn, zero_offload_device_name(d->offload_optimizer));
    if (d->offload_param != ZERO_OFFLOAD_NONE && d->stage != 3)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_param = %s needs stage 3 (stage %d keeps whole params on "
                          "every rank); use offload_optimizer at stages 1-2",
                          fn, zero_offload_device_name(d->offload_param), d->stage);
    if (d->offload_param != ZERO_OFFLOAD_NONE && d->offload_optimizer == ZERO_OFFLOAD_NONE)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_param = %s needs offload_optimizer cpu or nvme (the host "
                          "Adam writes the offloaded param shards)",
                          fn, zero_offload_device_name(d->offload_param));
    if ((int)d->offload_gradients < 0 || d->offload_gradients > ZERO_OFFLOAD_NVME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: offload_gradients = %d (none, cpu or nvme)",
                          fn, (int)d->offload_gradients);
    if (d->offload_gradients == ZERO_OFFLOAD_CPU && d->offload_optimizer == ZERO_OFFLOAD_NONE)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_gradients = cpu needs offload_optimizer cpu or nvme (without "
                          "it the reduced gradients stay on the device, where the Adam step runs)",
                          fn);
    if (d->offload_gradients == ZERO_OFFLOAD_NVME && d->offload_optimizer != ZERO_OFFLOAD_NVME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_gradients = nvme needs offload_optimizer = nvme (the step "
                          "reads each tile's gradients with its master, m and v; offload_optimizer "
                          "is %s)",
                          fn, zero_offload_device_name(d->offload_optimizer));
    if (d->offload_gradients == ZERO_OFFLOAD_NONE && d->offload_optimizer != ZERO_OFFLOAD_NONE)
        d->offload_gradients = ZERO_OFFLOAD_CPU; /* today's host tier */
    {
        double q = d->offload_optimizer_ratio;
        if (q != q || q < 0.0 || q > 1.0)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: offload_optimizer_ratio = %g (the fraction of the optimizer "
                              "state offloaded: a number in (0, 1], 0 = 1)",
                              fn, q);
        if (q != 0.0 && d->offload_optimizer == ZERO_OFFLOAD_NONE)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: offload_optimizer_ratio = %g needs offload_optimizer cpu or "
                              "nvme (it is the fraction of the optimizer state offloaded)",
                              fn, q);
        if (q == 0.0 && d->offload_optimizer != ZERO_OFFLOAD_NONE) d->offload_optimizer_ratio = q = 1.0;
        if (q < 1.0 && q > 0.0 && d->offload_param != ZERO_OFFLOAD_NONE)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: offload_optimizer_ratio = %g with offload_param = %s is not "
                              "supported (the device part's Adam writes device params; use "
                              "ratio 1 with offload_param, or offload_param = none)",
                              fn, q, zero_offload_device_name(d->offload_param));
        if (q < 1.0 && q > 0.0 && d->offload_gradients == ZERO_OFFLOAD_NVME)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: offload_optimizer_ratio = %g with offload_gradients = nvme is "
                              "not supported (use offload_gradients = cpu, or ratio 1)",
                              fn, q);
    }
    if ((d->offload_optimizer == ZERO_OFFLOAD_NVME || d->offload_param == ZERO_OFFLOAD_NVME) &&
        (!d->nvme_path || !d->nvme_path[0]))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload to nvme needs nvme_path (a directory for the tier's files)", fn);
    if (d->pin_memory < -1 || d->pin_memory > 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: pin_memory = %d (0 = pinned when the device offers it, 1 = the "
                          "same, -1 = plain memory)",
                          fn, d->pin_memory);
    if (d->buffer_count < 0 || d->buffer_count == 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: buffer_count = %d (0 or >= 2)", fn,
                          d->buffer_count);
    if (d->buffer_count == 0) d->buffer_count = 4;
    if (d->param_read_ahead < 0 || d->param_read_ahead > ZERO__ENG_RA_MAX)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: param_read_ahead = %d (0 or 1..%d)", fn,
                          d->param_read_ahead, ZERO__ENG_RA_MAX);
    if (d->param_read_ahead == 0) d->param_read_ahead = 2;
    if (d->buffer_size == 0) d->buffer_size = 100000000u;
    if (d->sub_group_size == 0) d->sub_group_size = 1000000000u;
    if (d->block_size == 0) d->block_size = (size_t)1 << 20;
    if (d->block_size < 4096 || (d->block_size & (d->block_size - 1)) != 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: block_size = %zu (a power of two, at least 4096)", fn, d->block_size);
    if (d->queue_depth < 0 || d->queue_depth > 1024)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: queue_depth = %d (0 or 1..1024)", fn,
                          d->queue_depth);
    if (d->queue_depth == 0) d->queue_depth = 8;
    return ZERO_OK;
}

static int zero__eng_dtype_ok(zero_dtype d)
{
    return d == ZERO_F16 || d == ZERO_BF16 || d == ZERO_F32;
}

/* The launcher's ranks per node: the first of the variables that is set and a positive
   integer (SLURM_NTASKS_PER_NODE may read "4(x2)": its leading number); 0 when none is. */
static int zero__eng_env_rpn(const char **name)
{
    static const char *const vars[3] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                                        "SLURM_NTASKS_PER_NODE"};
    int i;
    for (i = 0; i < 3; i++) {
        const char *v = getenv(vars[i]);
        long x = 0;
        if (!v || !*v) continue;
        while (*v >= '0' && *v <= '9' && x < 1000000000L) x = x * 10 + (*v++ - '0');
        if (x > 0 && x < 1000000000L) {
            *name = vars[i];
            return (int)x;
        }
    }
    return 0;
}

/* Validates and resolves hpz_partition_size (after ranks_per_node): 0, 1 and the world are
   off; otherwise stage 3, a divisor of ranks_per_node (the secondary group lies inside a
   node), no MiCS, no NVMe param tier, a comm that can split. */
static zero_result zero__eng_hpz_resolve(zero_engine_desc *d)
{
    const char *fn = "zero_engine_create";
    int world = d->comm->world, S = d->hpz_partition_size, R = d->ranks_per_node;
    if (S < 0 || S > world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: hpz_partition_size = %d (0 or 1 = off, else a divisor of "
                          "ranks_per_node = %d)", fn, S, R);
    if (S <= 1 || S == world) { /* one rank, or the primary partition itself: nothing to add */
        d->hpz_partition_size = 0;
        return ZERO_OK;
    }
    if (R % S != 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: hpz_partition_size = %d does not divide ranks_per_node = %d: hpZ's "
                          "secondary partition group must lie inside one node (S = %d ranks "
                          "[k S, (k + 1) S), with nodes of R = %d), or its gathers cross nodes "
                          "again; use a divisor of ranks_per_node (ZeRO++ uses S = R)",
                          fn, S, R, S, R);
    if (d->stage != 3)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: hpz_partition_size = %d at stage %d: hpZ keeps a secondary copy of "
                          "the stage-3 param partition so that later all-gathers stay inside "
                          "the node; stages 0-2 hold whole params and gather none (use stage 3)",
                          fn, S, d->stage);
    if (d->mics_shard_size > 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: hpz_partition_size with mics_shard_size = %d: MiCS already "
                          "partitions the params within its shard group and gathers them there, "
                          "so a secondary partition has nothing to add (choose one)",
                          fn, d->mics_shard_size);
    if (d->offload_param == ZERO_OFFLOAD_NVME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: hpz_partition_size with offload_param = nvme: not supported (the "
                          "NVMe param tier reads each primary shard ahead of every gather of "
                          "the recorded order, and hpZ's gathers from the secondary read none; "
                          "use offload_param = cpu or none)", fn);
    if (!d->comm->ops->split)
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "%s: hpz_partition_size = %d needs sub-communicators, and the '%s' "
                          "comm has no split (zero_comm_ops.split)",
                          fn, S, d->comm->ops->name ? d->comm->ops->name : "?");
    return ZERO_OK;
}

/* Resolves ranks_per_node (zero_engine_desc): explicit values must divide the world; the
   launcher's value is used where it divides it, else the world is one node. */
static zero_result zero__eng_topo_resolve(zero_engine_desc *d)
{
    int world = d->comm->world;
    if (d->mics_shard_size < 0 || d->mics_shard_size > world ||
        (d->mics_shard_size > 0 && world % d->mics_shard_size != 0))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: mics_shard_size = %d does not divide the world of %d "
                          "ranks (0 = off, else a divisor of the world)",
                          d->mics_shard_size, world);
    if (d->mics_shard_size == world) d->mics_shard_size = 0; /* one group: flat */
    if (d->mics_shard_size > 0) {
        if (d->stage == 0)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_create: mics_shard_size = %d at stage 0: MiCS "
                              "partitions model states within groups, and stage 0 partitions "
                              "none (use stage 1, 2 or 3)", d->mics_shard_size);
        if (d->offload_optimizer == ZERO_OFFLOAD_NVME || d->offload_param == ZERO_OFFLOAD_NVME ||
            d->offload_gradients == ZERO_OFFLOAD_NVME)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_create: mics_shard_size with an NVMe tier: the "
                              "replicas' all-reduce needs the whole accumulated gradient shard in "
                              "memory at the step, and the NVMe tiers stream it to files as it is "
                              "reduced (use offload cpu, or no MiCS)");
        if (d->offload_optimizer_ratio > 0.0 && d->offload_optimizer_ratio < 1.0)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_create: mics_shard_size with offload_optimizer_ratio = "
                              "%g: not supported (the replicas' all-reduce runs on one gradient "
                              "tier, and a partial offload splits the shard over two; use ratio 1)",
                              d->offload_optimizer_ratio);
        if (d->quantized_weights || d->quantized_gradients)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_create: mics_shard_size with quantized_%s: not "
                              "supported yet (the quantized collectives run on the whole comm, "
                              "MiCS's on the shard group)",
                              d->quantized_weights ? "weights" : "gradients");
        if (!d->comm->ops->split)
            return zero__fail(ZERO_ERROR_UNSUPPORTED,
                              "zero_engine_create: mics_shard_size = %d needs sub-communicators, "
                              "and the '%s' comm has no split (zero_comm_ops.split)",
                              d->mics_shard_size, d->comm->ops->name ? d->comm->ops->name : "?");
    }
    if (d->ranks_per_node < 0 || d->ranks_per_node > world ||
        (d->ranks_per_node > 0 && world % d->ranks_per_node != 0))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: ranks_per_node = %d does not divide the world of %d "
                          "ranks (0 = from the launcher, else a divisor of the world)",
                          d->ranks_per_node, world);
    if (d->ranks_per_node == 0) {
        const char *name = "";
        int v = zero__eng_env_rpn(&name);
        d->ranks_per_node = v > 0 && v <= world && world % v == 0 ? v : world;
    }
    return zero__eng_hpz_resolve(d);
}

/* Validates and resolves the quantized collectives' settings (ZeRO++'s qwZ / qgZ). */
static zero_result zero__eng_quant_resolve(zero_engine_desc *d)
{
    const char *fn = "zero_engine_create";
    if (d->quantized_weights != 0 && d->quantized_weights != 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: quantized_weights = %d (0 or 1)", fn,
                          d->quantized_weights);
    if (d->quantized_gradients != 0 && d->quantized_gradients != 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: quantized_gradients = %d (0 or 1)", fn,
                          d->quantized_gradients);
    if (d->quantized_gradient_bits == 0) d->quantized_gradient_bits = 4;
    if (d->quantized_gradient_bits != 4 && d->quantized_gradient_bits != 8)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: quantized_gradient_bits = %d (4 or 8)",
                          fn, d->quantized_gradient_bits);
    if (d->quant_block_numel == 0) d->quant_block_numel = ZERO_QUANT_BLOCK_DEFAULT;
    if (d->quant_block_numel < 2 || d->quant_block_numel > ZERO_QUANT_BLOCK_MAX ||
        (d->quant_block_numel & 1u))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: quant_block_numel = %zu (even, 2 .. %zu)", fn, d->quant_block_numel,
                          ZERO_QUANT_BLOCK_MAX);
    if (!d->quantized_weights && !d->quantized_gradients) return ZERO_OK;
    if (d->quantized_weights && d->stage != 3)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: quantized_weights needs stage 3 (stage %d gathers no params: qwZ "
                          "quantizes the stage-3 forward all-gather)", fn, d->stage);
    if (d->quantized_gradients && d->stage == 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: quantized_gradients needs stage 1, 2 or 3 (stage 0 all-reduces the "
                          "whole gradient on every rank; qgZ replaces a reduce-scatter)", fn);
    if (d->quantized_gradients && d->grad_comm_dtype != d->param_dtype)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: quantized_gradients with grad_comm_dtype %s != param_dtype %s: qgZ "
                          "carries int%d blocks and sums them in fp32, so a wider comm dtype buys "
                          "nothing on the wire; leave grad_comm_dtype at its default", fn,
                          zero_dtype_name(d->grad_comm_dtype), zero_dtype_name(d->param_dtype),
                          d->quantized_gradient_bits);
    if (!d->device->ops->quantize || !d->device->ops->dequantize)
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "%s: quantized_%s: device '%s' has no quantize / dequantize ops", fn,
                          d->quantized_weights ? "weights" : "gradients",
                          d->device->ops->name ? d->device->ops->name : "?");
    if (d->quantized_gradients && !d->comm->ops->all_to_all)
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "%s: quantized_gradients: comm '%s' has no all_to_all (the local, MPI "
                          "and NCCL comms have one)", fn, d->comm->ops->name ? d->comm->ops->name : "?");
    return ZERO_OK;
}

/* qgZ's levels (quantized_gradient_levels), against the resolved topology: 2 (ZeRO++'s
   hierarchical scheme) where there are several nodes of several ranks, else the flat one. */
static zero_result zero__eng_qgz_resolve(zero_engine_desc *d)
{
    const char *fn = "zero_engine_create";
    int N = d->comm->world, R = d->ranks_per_node;
    if (d->quantized_gradient_levels < 0 || d->quantized_gradient_levels > 2)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: quantized_gradient_levels = %d (0 = default, 1 = flat, 2 = "
                          "hierarchical)", fn, d->quantized_gradient_levels);
    if (!d->quantized_gradients) {
        d->quantized_gradient_levels = 0;
        return ZERO_OK;
    }
    if (R <= 1 || R >= N) d->quantized_gradient_levels = 1; /* one level is empty: flat */
    else if (d->quantized_gradient_levels == 0) d->quantized_gradient_levels = 2;
    if (d->quantized_gradient_levels == 2 && !d->comm->ops->split)
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "%s: quantized_gradients over %d nodes is hierarchical (ZeRO++'s "
                          "two-level all_to_all), which needs sub-communicators, and the '%s' "
                          "comm has no split; set quantized_gradient_levels = 1 for the flat "
                          "scheme", fn, N / R, d->comm->ops->name ? d->comm->ops->name : "?");
    return ZERO_OK;
}

/* delayed_update (DPU): validated against the resolved offload settings. */
static zero_result zero__eng_dpu_resolve(const zero_engine_desc *d)
{
    const char *fn = "zero_engine_create";
    if (d->delayed_update != 0 && d->delayed_update != 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: delayed_update = %d (0 = off, 1 = on)",
                          fn, d->delayed_update);
    if (d->delayed_update_after < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: delayed_update_after = %d (the warm-up updates applied at once "
                          "before the delayed update starts: >= 0)",
                          fn, d->delayed_update_after);
    if (!d->delayed_update) {
        if (d->delayed_update_after != 0)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: delayed_update_after = %d needs delayed_update = 1 (it is the "
                              "delayed update's warm-up)",
                              fn, d->delayed_update_after);
        return ZERO_OK;
    }
    if (d->offload_optimizer != ZERO_OFFLOAD_CPU)
        return zero__fail(
            ZERO_ERROR_INVALID_ARGUMENT,
            "%s: delayed_update needs offload_optimizer = cpu (offload_optimizer is %s): it "
            "overlaps the host Adam with the device's next forward and backward; %s",
            fn, zero_offload_device_name(d->offload_optimizer),
            d->offload_optimizer == ZERO_OFFLOAD_NONE
                ? "without offload the device's own Adam is already queued behind the backward, "
                  "so there is nothing to hide and the delay would only make the params stale"
                : "the NVMe tier is not supported yet (its step reads and writes the records "
                  "on the caller's thread)");
    if (d->offload_optimizer_ratio < 1.0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: delayed_update with offload_optimizer_ratio = %g is not supported "
                          "yet (the device part's Adam is not delayed; use ratio 1)",
                          fn, d->offload_optimizer_ratio);
    if (d->offload_param == ZERO_OFFLOAD_NVME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: delayed_update with offload_param = nvme is not supported yet "
                          "(use offload_param = cpu or none)", fn);
    if (d->mics_shard_size > 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: delayed_update with mics_shard_size = %d is not supported yet", fn,
                          d->mics_shard_size);
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_create(const zero_engine_desc *desc, zero_engine **out)
{
    zero_engine_desc d;
    zero_engine *e;
    zero_result r;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: out is NULL");
    *out = NULL;
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: desc is NULL");
    d = *desc;
    if (d.stage < 0 || d.stage > 3)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: stage = %d (0..3)",
                          d.stage);
    if (d.param_dtype == ZERO_DTYPE_DEFAULT) d.param_dtype = ZERO_F16;
    if (!zero__eng_dtype_ok(d.param_dtype))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: param_dtype = %d (f16, bf16 or f32)",
                          (int)d.param_dtype);
    if (d.grad_comm_dtype == ZERO_DTYPE_DEFAULT) d.grad_comm_dtype = d.param_dtype;
    if (!zero__eng_dtype_ok(d.grad_comm_dtype))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: grad_comm_dtype = %d (f16, bf16 or f32)",
                          (int)d.grad_comm_dtype);
    if (!(d.clip_norm >= 0.0f) || isinf(d.clip_norm))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: clip_norm = %g (finite, >= 0)", (double)d.clip_norm);
    if (d.accum_steps < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: accum_steps = %d",
                          d.accum_steps);
    if (d.accum_steps == 0) d.accum_steps = 1;
    if (d.prefetch_depth == 0) d.prefetch_depth = 1;
    if (d.prefetch_depth < 0) d.prefetch_depth = -1;
    if (d.host_threads < 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: host_threads = %d",
                          d.host_threads);
    if (d.host_threads == 0) d.host_threads = zero__eng_cpus();
    if ((r = zero__eng_offload_resolve(&d)) != ZERO_OK) return r;
    if (d.optimizer_dtype == ZERO_DTYPE_DEFAULT) d.optimizer_dtype = ZERO_F32;
    if (d.optimizer_dtype != ZERO_F32 && d.optimizer_dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: optimizer_dtype = %d (%s): f32 or bf16",
                          (int)d.optimizer_dtype, zero_dtype_name(d.optimizer_dtype));
    if (d.optimizer_dtype == ZERO_BF16 && d.offload_optimizer == ZERO_OFFLOAD_NVME)
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "zero_engine_create: optimizer_dtype = bf16 with offload_optimizer = "
                          "nvme is not supported yet (use cpu, or f32 states)");
    if (d.optimizer_dtype == ZERO_BF16 && d.offload_optimizer != ZERO_OFFLOAD_NONE &&
        d.offload_optimizer_ratio < 1.0)
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "zero_engine_create: optimizer_dtype = bf16 with offload_optimizer_ratio "
                          "= %g is not supported yet (use ratio 1, or f32 states)",
                          d.offload_optimizer_ratio);
    if ((r = zero__act_resolve(&d)) != ZERO_OK) return r;
    if (d.align_numel == 0) d.align_numel = ZERO_DEFAULT_ALIGN_NUMEL;
    if (!d.device || !d.device->ops)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: device is NULL");
    /* pinned host buffers where the device has them (AUTO and ON alike), else plain */
    d.pin_memory = d.pin_memory != ZERO_PIN_MEMORY_OFF && d.device->ops->host_alloc &&
                           d.device->ops->host_free
                       ? ZERO_PIN_MEMORY_ON
                       : ZERO_PIN_MEMORY_OFF;
    if (!d.comm || !d.comm->ops)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_create: comm is NULL");
    if (d.comm->world < 1 || d.comm->rank < 0 || d.comm->rank >= d.comm->world)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: comm has rank %d of world %d", d.comm->rank,
                          d.comm->world);
    {
        const zero_device_ops *o = d.device->ops;
        if (!o->alloc || !o->free || !o->copy || !o->upload || !o->download || !o->fill_zero ||
            !o->cast || !o->add || !o->nonfinite || !o->sumsq || !o->grad_mul || !o->adam ||
            !o->sync)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_create: device '%s' lacks a required op",
                              o->name ? o->name : "?");
        if (!d.comm->ops->all_gather || !d.comm->ops->reduce_scatter || !d.comm->ops->all_reduce)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_create: comm lacks a required collective");
    }
    if ((d.allocator.alloc == NULL) != (d.allocator.free == NULL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_create: allocator needs both alloc and free");
    if ((r = zero__eng_quant_resolve(&d)) != ZERO_OK) return r;
    if ((r = zero__eng_topo_resolve(&d)) != ZERO_OK) return r;
    if ((r = zero__eng_qgz_resolve(&d)) != ZERO_OK) return r;
    if ((r = zero__eng_dpu_resolve(&d)) != ZERO_OK) return r;
    e = (zero_engine *)zero__alloc(&d.allocator, sizeof *e);
    if (!e) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_create: %zu bytes", sizeof *e);
    memset(e, 0, sizeof *e);
    r = zero_adam_desc_resolve(&e->opt.adam, &d.adam);
    if (r == ZERO_OK) r = zero_scaler_init(&e->opt.scaler, &d.scaler, d.param_dtype);
    if (r == ZERO_OK) r = zero_plan_create(&e->layout.plan, &d.allocator);
    if (r != ZERO_OK) {
        char prev[400];
        zero__eng_copy_error(prev, sizeof prev);
        zero_plan_destroy(e->layout.plan);
        zero__free(&d.allocator, e);
        return zero__fail(r, "zero_engine_create: %.380s", prev);
    }
    d.adam = e->opt.adam;
    /* get_desc reports the scaler as it runs: the mode resolved, every default filled. */
    zero__scaler_defaults(&d.scaler);
    if (d.scaler.mode == ZERO_SCALER_DEFAULT)
        d.scaler.mode = e->opt.scaler.dynamic ? ZERO_SCALER_DYNAMIC : ZERO_SCALER_NONE;
    if (d.scaler.at_min == ZERO_SCALER_AT_MIN_DEFAULT)
        d.scaler.at_min =
            e->opt.scaler.error_at_min ? ZERO_SCALER_AT_MIN_ERROR : ZERO_SCALER_AT_MIN_SKIP;
    e->cfg.desc = d;
    e->cfg.dev = d.device;
    e->cfg.comm = d.comm;
    e->cfg.rank = d.comm->rank;
    e->cfg.world = d.comm->world;
    e->topo.rpn = d.ranks_per_node;
    e->topo.same_node = d.ranks_per_node - 1;
    e->topo.world_all = d.comm->world;
    e->topo.rank_all = d.comm->rank;
    e->topo.mics = d.mics_shard_size;
    e->topo.hpz = d.hpz_partition_size;
    if (e->topo.mics) { /* the layout is the shard group's: N = S, this rank's place in it */
        e->cfg.world = e->topo.mics;
        e->cfg.rank = d.comm->rank % e->topo.mics;
    }
    e->cfg.stage = d.stage;
    e->cfg.accum_steps = d.accum_steps;
    e->prefetch.depth = d.prefetch_depth > 0 ? d.prefetch_depth : 0;
    e->cfg.param_dtype = d.param_dtype;
    e->cfg.comm_dtype = d.grad_comm_dtype;
    e->cfg.param_size = zero_dtype_size(e->cfg.param_dtype);
    e->cfg.comm_size = zero_dtype_size(e->cfg.comm_dtype);
    e->cfg.opt_dtype = d.optimizer_dtype;
    e->cfg.opt_size = zero_dtype_size(d.optimizer_dtype);
    e->cfg.opt_offloaded = d.offload_optimizer != ZERO_OFFLOAD_NONE;
    e->cfg.params_offloaded = d.offload_param != ZERO_OFFLOAD_NONE;
    e->dpu.on = d.delayed_update;
    e->dpu.after = d.delayed_update_after;
    e->quant.weights = d.quantized_weights;
    e->quant.grad_bits = d.quantized_gradients ? d.quantized_gradient_bits : 0;
    e->quant.levels = d.quantized_gradient_levels;
    e->quant.block = d.quant_block_numel;
    e->lifecycle = ZERO__ENG_CREATED;
    *out = e;
    return ZERO_OK;
}

static void zero__soff_free(zero_engine *e);
static void zero__eng_free_device(zero_engine *e)
{
    int i;
    zero__soff_free(e); /* offloaded states: their host copies or file */
    for (i = e->buf.nallocs - 1; i >= 0; i--) {
        if (!e->buf.allocs[i].ptr) continue; /* offloaded (zero_engine_offload_states) */
        e->cfg.dev->ops->free(e->cfg.dev, e->buf.allocs[i].ptr);
        e->buf.mem[e->buf.allocs[i].cat] -= e->buf.allocs[i].bytes;
        e->buf.mem_total -= e->buf.allocs[i].bytes;
    }
    e->buf.nallocs = 0;
}

ZERODEF void zero_engine_destroy(zero_engine *e)
{
    const zero_allocator *a;
    int g;
    if (!e) return;
    zero_comm_destroy(e->topo.replica);
    zero_comm_destroy(e->topo.shard);
    zero_comm_destroy(e->topo.hpz_comm);
    zero_comm_destroy(e->topo.qgz_node);
    zero_comm_destroy(e->topo.qgz_cross);
    e->topo.replica = e->topo.shard = e->topo.hpz_comm = NULL;
    e->topo.qgz_node = e->topo.qgz_cross = NULL;
    a = &e->cfg.desc.allocator;
    if (e->cfg.dev) {
        /* Let queued work finish before freeing what it may touch (errors are moot here). */
        if (e->buf.nallocs > 0 && e->cfg.dev->ops->sync) {
            (void)e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMM);
            (void)e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE);
            if (e->cfg.opt_offloaded || e->async.after_step)
                (void)e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_OFFLOAD);
        }
        (void)zero__dpu_join(e); /* the delayed update's thread writes host-tier memory */
        zero__act_free(e);
        if (e->debug.copies)
            for (g = 0; g < 2 * e->layout.ngroups; g++)
                if (e->debug.copies[g]) (void)e->cfg.dev->ops->free(e->cfg.dev, e->debug.copies[g]);
        zero__eng_free_device(e);
        zero__eng_free_host(e);
        if (e->cfg.dev->ops->event_destroy) {
            if (e->layout.groups)
                for (g = 0; g < e->layout.ngroups; g++) {
                    if (e->layout.groups[g].ev_gathered)
                        e->cfg.dev->ops->event_destroy(e->cfg.dev, e->layout.groups[g].ev_gathered);
                    if (e->layout.groups[g].ev_reduced)
                        e->cfg.dev->ops->event_destroy(e->cfg.dev, e->layout.groups[g].ev_reduced);
                }
            zero_event *evs[6];
            evs[0] = e->sync.compute_to_comm;
            evs[1] = e->sync.comm_to_compute;
            evs[2] = e->sync.compute_to_offload;
            evs[3] = e->sync.comm_to_offload;
            evs[4] = e->sync.offload_to_comm;
            evs[5] = e->async.after_step;
            for (g = 0; g < 6; g++)
                if (evs[g]) e->cfg.dev->ops->event_destroy(e->cfg.dev, evs[g]);
        }
    }
    zero__free(a, e->debug.copies);
    zero__free(a, e->debug.set_hash);
    zero__free(a, e->layout.groups);
    zero__free(a, e->pool.free_ext);
    zero__free(a, e->micro.pending);
    zero__free(a, e->micro.pending_store);
    zero__free(a, e->layout.parts_req);
    zero__free(a, e->prefetch.trace);
    zero__free(a, e->layout.tiled);
    zero__free(a, e->quant.fwd);
    zero__free(a, e->topo.hpz_valid);
    zero__free(a, e->layout.tiled_dims);
    zero__free(a, e->layout.tensor_flags);
    zero__free(a, e->layout.shapes);
    zero__free(a, e->opt.lr_mul);
    zero__free(a, e->opt.wd);
    zero__free(a, e->opt.coefs);
    zero__free(a, e->dpu.coefs);
    zero__free(a, e->opt.model_off);
    zero_plan_destroy(e->layout.plan);
    zero__free(a, e);
}

ZERODEF zero_result zero_engine_get_desc(const zero_engine *e, zero_engine_desc *out)
{
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_get_desc: NULL");
    *out = e->cfg.desc;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_add_tensor(zero_engine *e, const char *name, size_t numel,
                                           int group, unsigned flags, int *out_tensor)
{
    zero_result r;
    int id = -1;
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_add_tensor: engine is NULL");
    if (e->lifecycle != ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_add_tensor: '%.200s' registered after commit",
                          name ? name : "(null)");
    if (flags & ~(unsigned)(ZERO_TENSOR_NO_DECAY | ZERO_TENSOR_FROZEN))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_add_tensor: flags = 0x%x",
                          flags);
    if (e->layout.ntensors == e->layout.cap_tensors) {
        int cap = e->layout.cap_tensors ? 2 * e->layout.cap_tensors : 64;
        unsigned *nf = (unsigned *)zero__alloc(&e->cfg.desc.allocator, (size_t)cap * sizeof *nf);
        if (!nf) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_add_tensor");
        if (e->layout.ntensors)
            memcpy(nf, e->layout.tensor_flags, (size_t)e->layout.ntensors * sizeof *nf);
        zero__free(&e->cfg.desc.allocator, e->layout.tensor_flags);
        e->layout.tensor_flags = nf;
        e->layout.cap_tensors = cap;
    }
    r = zero_plan_add(e->layout.plan, name, numel, group, &id);
    if (r != ZERO_OK) return r;
    if (flags & ZERO_TENSOR_FROZEN) (void)zero_plan_freeze(e->layout.plan, id); /* cannot fail */
    e->layout.tensor_flags[id] = flags;
    e->layout.ntensors = id + 1;
    if (out_tensor) *out_tensor = id;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_set_grad_parts(zero_engine *e, int group, int parts)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_set_grad_parts: engine is NULL");
    if (e->lifecycle != ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine_set_grad_parts: after commit");
    if (group < 0 || parts < 1 || parts > ZERO_MAX_GRAD_PARTS)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_set_grad_parts: group %d, parts %d (group >= 0, 1..%d parts)",
                          group, parts, ZERO_MAX_GRAD_PARTS);
    if (group >= e->layout.cap_parts_req) {
        int cap = e->layout.cap_parts_req ? e->layout.cap_parts_req : 16, i;
        int *np;
        while (cap <= group) cap *= 2;
        np = (int *)zero__alloc(&e->cfg.desc.allocator, (size_t)cap * sizeof *np);
        if (!np) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_set_grad_parts");
        for (i = 0; i < cap; i++) np[i] = i < e->layout.cap_parts_req ? e->layout.parts_req[i] : 1;
        zero__free(&e->cfg.desc.allocator, e->layout.parts_req);
        e->layout.parts_req = np;
        e->layout.cap_parts_req = cap;
    }
    e->layout.parts_req[group] = parts;
    return ZERO_OK;
}

/* Rows of tile k of a rows-row tensor in K tiles: the first rows % K take one more. */
static void zero__eng_tile_rows(size_t rows, int K, int k, size_t *row0, size_t *n)
{
    size_t q = rows / (size_t)K, rm = rows % (size_t)K;
    *n = q + ((size_t)k < rm);
    *row0 = (size_t)k * q + ((size_t)k < rm ? (size_t)k : rm);
}

ZERODEF zero_result zero_engine_add_tiled_tensor(zero_engine *e, const char *name, size_t rows,
                                                 size_t cols, int k_tiles, int first_group,
                                                 unsigned flags, int *out_tensor)
{
    const char *fn = "zero_engine_add_tiled_tensor";
    char tname[320];
    int k, first = -1;
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: engine is NULL", fn);
    if (e->lifecycle != ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: '%.200s' registered after commit", fn,
                          name ? name : "(null)");
    if (!name || !name[0] || strlen(name) > 240)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: name is NULL, empty or over 240 bytes", fn);
    if (rows == 0 || cols == 0 || k_tiles < 1 || (size_t)k_tiles > rows || first_group < 0 ||
        first_group > INT32_MAX - k_tiles)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: '%.200s': rows %zu, cols %zu, k_tiles %d, first_group %d (rows, cols "
                          ">= 1, 1 <= k_tiles <= rows, first_group >= 0)",
                          fn, name, rows, cols, k_tiles, first_group);
    if (flags & ~(unsigned)(ZERO_TENSOR_NO_DECAY | ZERO_TENSOR_FROZEN))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: flags = 0x%x", fn, flags);
    if (rows > SIZE_MAX / cols)
        return zero__fail(ZERO_ERROR_OVERFLOW, "%s: '%.200s': %zu x %zu overflows", fn, name, rows, cols);
    if (e->layout.ntiled == e->layout.cap_tiled) {
        int cap = e->layout.cap_tiled ? 2 * e->layout.cap_tiled : 8;
        int *nt = (int *)zero__alloc(&e->cfg.desc.allocator, (size_t)cap * 3 * sizeof *nt);
        size_t *nd = (size_t *)zero__alloc(&e->cfg.desc.allocator, (size_t)cap * 2 * sizeof *nd);
        if (!nt || !nd) {
            zero__free(&e->cfg.desc.allocator, nt);
            zero__free(&e->cfg.desc.allocator, nd);
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s", fn);
        }
        if (e->layout.ntiled) {
            memcpy(nt, e->layout.tiled, (size_t)e->layout.ntiled * 3 * sizeof *nt);
            memcpy(nd, e->layout.tiled_dims, (size_t)e->layout.ntiled * 2 * sizeof *nd);
        }
        zero__free(&e->cfg.desc.allocator, e->layout.tiled);
        zero__free(&e->cfg.desc.allocator, e->layout.tiled_dims);
        e->layout.tiled = nt;
        e->layout.tiled_dims = nd;
        e->layout.cap_tiled = cap;
    }
    for (k = 0; k < k_tiles; k++) {
        uint64_t dims[2];
        size_t row0, n;
        int id = -1;
        zero_result r;
        zero__eng_tile_rows(rows, k_tiles, k, &row0, &n);
        dims[0] = (uint64_t)n;
        dims[1] = (uint64_t)cols;
        snprintf(tname, sizeof tname, "%s.tile%d", name, k);
        r = zero_engine_add_tensor_shape(e, tname, 2, dims, first_group + k, flags, &id);
        if (r != ZERO_OK) return r;
        if (k == 0) first = id;
    }
    e->layout.tiled[3 * e->layout.ntiled] = first;
    e->layout.tiled[3 * e->layout.ntiled + 1] = k_tiles;
    e->layout.tiled[3 * e->layout.ntiled + 2] = first_group;
    e->layout.tiled_dims[2 * e->layout.ntiled] = rows;
    e->layout.tiled_dims[2 * e->layout.ntiled + 1] = cols;
    e->layout.ntiled++;
    if (out_tensor) *out_tensor = first;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_tile_view(const zero_engine *e, int tensor, int tile,
                                          zero_tile_view *out)
{
    int i;
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_tile_view: NULL");
    for (i = 0; i < e->layout.ntiled; i++) {
        zero_tensor_info ti;
        if (e->layout.tiled[3 * i] != tensor) continue;
        if (tile < 0 || tile >= e->layout.tiled[3 * i + 1])
            return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_engine_tile_view: tile %d of %d", tile,
                              e->layout.tiled[3 * i + 1]);
        memset(out, 0, sizeof *out);
        memset(&ti, 0, sizeof ti);
        out->tensor = tensor + tile;
        out->group = e->layout.tiled[3 * i + 2] + tile;
        out->cols = e->layout.tiled_dims[2 * i + 1];
        zero__eng_tile_rows(e->layout.tiled_dims[2 * i], e->layout.tiled[3 * i + 1], tile,
                            &out->row0, &out->rows);
        if (e->lifecycle != ZERO__ENG_CREATED &&
            zero_plan_tensor(e->layout.plan, out->tensor, &ti) == ZERO_OK)
            out->offset = ti.offset;
        return ZERO_OK;
    }
    return zero__fail(ZERO_ERROR_NOT_FOUND,
                      "zero_engine_tile_view: tensor %d is not tile 0 of a tiled tensor", tensor);
}

ZERODEF const zero_plan *zero_engine_plan(const zero_engine *e)
{
    return (e && e->lifecycle != ZERO__ENG_CREATED) ? e->layout.plan : NULL;
}

/* ---- commit ------------------------------------------------------------------------------ */

/* FNV-1a over 64-bit words. */
static uint64_t zero__eng_mix(uint64_t h, uint64_t v)
{
    int i;
    for (i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xffu;
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t zero__eng_dbits(double f)
{
    uint64_t u;
    memcpy(&u, &f, 8);
    return u;
}

/* Everything the ranks must agree on: the plan, the settings and the tensor flags. */
static uint64_t zero__eng_hash(const zero_engine *e)
{
    uint64_t h = zero_plan_hash(e->layout.plan);
    const zero_engine_desc *d = &e->cfg.desc;
    int t;
    h = zero__eng_mix(h, (uint64_t)d->stage);
    h = zero__eng_mix(h, (uint64_t)d->param_dtype);
    h = zero__eng_mix(h, (uint64_t)d->grad_comm_dtype);
    h = zero__eng_mix(h, (uint64_t)d->accum_steps);
    h = zero__eng_mix(h, (uint64_t)d->reduce_bucket_numel);
    h = zero__eng_mix(h, (uint64_t)d->max_live_numel);
    h = zero__eng_mix(h, (uint64_t)(int64_t)d->prefetch_depth);
    h = zero__eng_mix(h, (uint64_t)d->persist_numel);
    h = zero__eng_mix(h, zero__f32_bits(d->clip_norm));
    h = zero__eng_mix(h, (uint64_t)e->opt.adam.mode);
    h = zero__eng_mix(h, zero__eng_dbits(e->opt.adam.lr));
    h = zero__eng_mix(h, zero__eng_dbits(e->opt.adam.beta1));
    h = zero__eng_mix(h, zero__eng_dbits(e->opt.adam.beta2));
    h = zero__eng_mix(h, zero__eng_dbits(e->opt.adam.eps));
    h = zero__eng_mix(h, zero__eng_dbits(e->opt.adam.weight_decay));
    h = zero__eng_mix(h, zero__f32_bits(e->opt.scaler.scale));
    h = zero__eng_mix(h, (uint64_t)e->opt.scaler.dynamic);
    h = zero__eng_mix(h, zero__f32_bits(e->opt.scaler.factor));
    h = zero__eng_mix(h, zero__f32_bits(e->opt.scaler.min_scale));
    h = zero__eng_mix(h, (uint64_t)(int64_t)e->opt.scaler.window);
    h = zero__eng_mix(h, (uint64_t)(int64_t)e->opt.scaler.hysteresis);
    h = zero__eng_mix(h, (uint64_t)e->opt.scaler.error_at_min);
    h = zero__eng_mix(h, (uint64_t)d->align_numel);
    h = zero__eng_mix(h, (uint64_t)d->offload_optimizer);
    h = zero__eng_mix(h, (uint64_t)d->offload_param);
    h = zero__eng_mix(h, (uint64_t)d->optimizer_dtype);
    h = zero__eng_mix(h, d->optimizer_seed);
    h = zero__eng_mix(h, zero__eng_dbits(d->offload_optimizer_ratio));
    h = zero__eng_mix(h, (uint64_t)d->ranks_per_node);
    h = zero__eng_mix(h, (uint64_t)d->mics_shard_size);
    h = zero__eng_mix(h, (uint64_t)d->hpz_partition_size);
    h = zero__eng_mix(h, (uint64_t)(int64_t)(d->delayed_update ? d->delayed_update_after : -1));
    h = zero__eng_mix(h, (uint64_t)d->quantized_gradient_levels);
    h = zero__eng_mix(h, (uint64_t)e->quant.weights);
    h = zero__eng_mix(h, (uint64_t)e->quant.grad_bits);
    h = zero__eng_mix(h, (uint64_t)(e->quant.weights || e->quant.grad_bits ? e->quant.block : 0));
    for (t = 0; t < e->layout.ntensors; t++)
        h = zero__eng_mix(h, (uint64_t)e->layout.tensor_flags[t]);
    for (t = 0; t < e->layout.ngroups; t++)
        h = zero__eng_mix(h, (uint64_t)e->layout.groups[t].parts);
    return h;
}

static zero_result zero__eng_alloc(zero_engine *e, size_t bytes, zero_mem_category cat, void **out)
{
    zero_result r;
    void *p = NULL;
    *out = NULL;
    if (bytes == 0) return ZERO_OK;
    if (e->buf.nallocs == ZERO__ENG_MAX_ALLOCS)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine: too many allocations");
    r = e->cfg.dev->ops->alloc(e->cfg.dev, bytes, cat, &p);
    if (r != ZERO_OK) return r;
    e->buf.allocs[e->buf.nallocs].ptr = p;
    e->buf.allocs[e->buf.nallocs].bytes = bytes;
    e->buf.allocs[e->buf.nallocs].cat = cat;
    e->buf.nallocs++;
    e->buf.mem[cat] += bytes;
    if (e->buf.mem[cat] > e->buf.mem_peak[cat]) e->buf.mem_peak[cat] = e->buf.mem[cat];
    e->buf.mem_total += bytes;
    if (e->buf.mem_total > e->buf.mem_peak_total) e->buf.mem_peak_total = e->buf.mem_total;
    *out = p;
    return ZERO_OK;
}

/* The byte sizes of every buffer, in allocation order (scratch first). */
typedef struct zero__eng_sizes {
    size_t bytes[12];
    zero_mem_category cat[12];
    int n;
} zero__eng_sizes;

enum {
    ZERO__B_SCRATCH = 0, ZERO__B_PARAM, ZERO__B_GRAD_USER, ZERO__B_GRAD_ACC, ZERO__B_MASTER,
    ZERO__B_M1, ZERO__B_M2, ZERO__B_BUCKET, ZERO__B_ARENA, ZERO__B_QUANT, ZERO__B_HPZ, ZERO__B_N
};

/* The first tensor of group g, for messages. */
static const char *zero__eng_group_name(const zero_engine *e, int g)
{
    zero_group_info gi;
    zero_tensor_info ti;
    memset(&gi, 0, sizeof gi);
    memset(&ti, 0, sizeof ti);
    if (zero_plan_group(e->layout.plan, g, &gi) != ZERO_OK || gi.num_tensors < 1 ||
        zero_plan_tensor(e->layout.plan, gi.tensors[0], &ti) != ZERO_OK || !ti.name)
        return "?";
    return ti.name;
}

/* Tensor t's name, for messages. */
static const char *zero__eng_tensor_name(const zero_engine *e, int t)
{
    zero_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    if (zero_plan_tensor(e->layout.plan, t, &ti) != ZERO_OK || !ti.name) return "?";
    return ti.name;
}

/* The arena (stages 2-3): max_live_numel elements of the param dtype, where each gathered
   group (stage 3) and each gradient buffer takes its own size. Default: the largest group
   beside (2 + prefetch depth) groups of the second-largest size (stage 2: 2), i.e. a
   layer's params, its gradients and its prefetches next to the largest group (a held
   gradient or gathered params); and at least the largest group's params and gradients at
   once plus the prefetches when that is at most ZERO_ARENA_SMALL_NUMEL elements, so small
   models hold any group's params and gradients at once at the defaults (with the placement
   rule at zero__eng_arena_choose: never a failure while at most one other buffer is held).
   Clamped to what can ever be live at once: every group's gradients (P) and, at stage 3,
   every non-persistent group's params; an arena of that size gives each buffer a home. */
static zero_result zero__eng_arena_size(zero_engine *e)
{
    size_t live = e->cfg.desc.max_live_numel, all = e->layout.total_numel, np = 0, dflt, both;
    int g, big = 0;
    for (g = e->layout.ngroups - 1; g >= 0; g--) {
        if (e->cfg.stage == 3 && !e->layout.groups[g].persistent) np += e->layout.groups[g].numel;
        /* the first largest group */
        if (e->layout.groups[g].numel == e->layout.max_group_numel) big = g;
    }
    if (zero__add_size(all, np, &all) != 0) all = (size_t)-1;
    if (live == 0) {
        size_t d = e->cfg.stage == 3 ? (size_t)e->prefetch.depth : 0;
        if (zero__mul_size(e->layout.second_group_numel, 2 + d, &dflt) != 0 ||
            zero__add_size(dflt, e->layout.max_group_numel, &dflt) != 0)
            return zero__fail(ZERO_ERROR_OVERFLOW,
                              "zero_engine_commit: the default max_live_numel, the largest group "
                              "(%zu elements) + %zu x the second largest (%zu), overflows size_t",
                              e->layout.max_group_numel, (size_t)(2 + d),
                              e->layout.second_group_numel);
        if (zero__mul_size(e->layout.second_group_numel, d, &both) == 0 &&
            zero__add_size(both, 2 * e->layout.max_group_numel, &both) == 0 &&
            e->layout.max_group_numel <= (size_t)-1 / 2 && both <= ZERO_ARENA_SMALL_NUMEL &&
            both > dflt)
            dflt = both;
        live = dflt;
        e->cfg.desc.max_live_numel = live;
    }
    if (e->layout.max_group_numel > live)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_commit: group %d ('%.120s', %zu elements) does not fit the "
                          "arena: max_live_numel = %zu; set max_live_numel >= %zu (the group's "
                          "gathered params or its gradient buffer; both at once: %zu), or register "
                          "the tensor in tiles (zero_engine_add_tiled_tensor)",
                          big, zero__eng_group_name(e, big), e->layout.max_group_numel, live,
                          e->layout.max_group_numel,
                          e->layout.max_group_numel <= (size_t)-1 / 2
                              ? 2 * e->layout.max_group_numel
                              : e->layout.max_group_numel);
    e->pool.numel = live < all ? live : all;
    e->pool.all_numel = all;
    if (e->pool.numel == all && all != (size_t)-1) { /* room for everything: fixed homes */
        size_t at = 0;
        for (g = 0; g < e->layout.ngroups; g++) {
            e->layout.groups[g].ghome = at;
            at += e->layout.groups[g].numel;
        }
        for (g = 0; g < e->layout.ngroups; g++)
            if (e->cfg.stage == 3 && !e->layout.groups[g].persistent) {
                e->layout.groups[g].phome = at;
                at += e->layout.groups[g].numel;
            }
    }
    return ZERO_OK;
}

/* Fills the group table and the sizes from the committed plan. */
/* The device buffer of the quantized collectives (ZERO_MEM_BUCKET): qwZ sends one packed
   shard and receives N (int8, the largest param shard); qgZ sends N packed gradient blocks
   and receives N (int4/int8, the largest gradient shard); one buffer of the larger of each
   part serves both (both run on COMM, in order). Hierarchical qgZ adds one fp32 block of the
   largest shard (the node's partial sum, re-quantized from there) after the receive part.
   Also the per-group forward flags. */
static zero_result zero__eng_quant_layout(zero_engine *e, size_t *bytes)
{
    const char *fn = "zero_engine_commit: quantized collectives";
    size_t N = (size_t)e->cfg.world, ms = 0, pw = 0, pg = 0, send = 0, recv = 0, t = 0;
    int g, ovf = 0;
    *bytes = 0;
    e->quant.send_bytes = 0;
    if (!e->quant.weights && !e->quant.grad_bits) return ZERO_OK;
    for (g = 0; g < e->layout.ngroups; g++) {
        const zero__eng_group *eg = &e->layout.groups[g];
        if (eg->pshard_numel > ms) ms = eg->pshard_numel;
        if (eg->shard_numel > ms) ms = eg->shard_numel;
    }
    if (e->quant.weights && zero__quant_size(fn, ms, 8, e->quant.block, &pw) != ZERO_OK)
        return ZERO_ERROR_OVERFLOW;
    if (e->quant.grad_bits &&
        zero__quant_size(fn, ms, e->quant.grad_bits, e->quant.block, &pg) != ZERO_OK)
        return ZERO_ERROR_OVERFLOW;
    ovf |= zero__mul_size(N, pg, &send);
    if (pw > send) send = pw;
    ovf |= zero__mul_size(N, pw > pg ? pw : pg, &recv);
    ovf |= zero__add_size(send, recv, &t);
    e->quant.sum_off = t;
    if (e->quant.grad_bits && e->quant.levels == 2) {
        size_t fb = 0;
        ovf |= zero__mul_size(ms, sizeof(float), &fb);
        ovf |= zero__add_size(t, fb, &t);
    }
    if (ovf) return zero__fail(ZERO_ERROR_OVERFLOW, "%s: sizes overflow size_t", fn);
    e->quant.fwd = (unsigned char *)zero__alloc_zeroed(&e->cfg.desc.allocator,
                                                        (size_t)e->layout.ngroups + 1);
    if (!e->quant.fwd) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: group flags", fn);
    e->quant.send_bytes = send;
    *bytes = t;
    return ZERO_OK;
}

static zero_result zero__eng_layout(zero_engine *e, zero__eng_sizes *sz)
{
    int g, G = zero_plan_num_groups(e->layout.plan);
    size_t ow = 0, os = 0, op = 0, ohp = 0, pparam = 0, Ms, ogw = 0, ops = 0;
    const zero_allocator *a = &e->cfg.desc.allocator;
    int ovf = 0, multi = 0;
    e->layout.ngroups = G;
    e->layout.groups = (zero__eng_group *)zero__alloc(a, (size_t)G * sizeof *e->layout.groups);
    /* cleared at once: destroy reads the event pointers of every group whatever fails next */
    if (e->layout.groups) memset(e->layout.groups, 0, (size_t)G * sizeof *e->layout.groups);
    e->micro.pending = (int *)zero__alloc(a, (size_t)G * sizeof *e->micro.pending);
    e->micro.pending_store = (unsigned char *)zero__alloc(a, (size_t)G);
    e->prefetch.trace_cap = 4 * G + 16; /* grows (host memory) if a micro-step uses groups more */
    e->prefetch.trace =
        (int *)zero__alloc(a, (size_t)e->prefetch.trace_cap * sizeof *e->prefetch.trace);
    e->pool.cap_free = 2 * G + 2; /* live extents <= 2 G, so free ones <= 2 G + 1 */
    e->pool.free_ext =
        (zero__eng_extent *)zero__alloc(a, (size_t)e->pool.cap_free * sizeof *e->pool.free_ext);
    if (!e->layout.groups || !e->micro.pending || !e->micro.pending_store || !e->pool.free_ext ||
        !e->prefetch.trace)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: group tables");
    {   /* the per-tensor hyper-parameters (defaults) and the step's constants */
        int t, T = e->layout.ntensors;
        e->opt.lr_mul = (double *)zero__alloc(a, (size_t)T * sizeof *e->opt.lr_mul);
        e->opt.wd = (double *)zero__alloc(a, (size_t)T * sizeof *e->opt.wd);
        e->opt.coefs = (zero_adam_coefs *)zero__alloc(a, (size_t)T * sizeof *e->opt.coefs);
        e->opt.model_off = (uint64_t *)zero__alloc(a, ((size_t)T + 1) * sizeof *e->opt.model_off);
        if (!e->opt.lr_mul || !e->opt.wd || !e->opt.coefs || !e->opt.model_off)
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: tensor tables");
        e->opt.model_off[0] = 0;
        for (t = 0; t < T; t++) {
            zero_tensor_info ti;
            zero_result rt;
            e->opt.lr_mul[t] = 1.0;
            e->opt.wd[t] = ZERO_WEIGHT_DECAY_DEFAULT;
            memset(&ti, 0, sizeof ti);
            if ((rt = zero_plan_tensor(e->layout.plan, t, &ti)) != ZERO_OK) return rt;
            e->opt.model_off[t + 1] = e->opt.model_off[t] + (uint64_t)ti.numel;
        }
    }
    for (g = e->layout.ngroups; g < e->layout.cap_parts_req; g++)
        if (e->layout.parts_req[g] != 1)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_commit: zero_engine_set_grad_parts on group %d, which "
                              "has no tensor (groups 0..%d)",
                              g, G - 1);
    e->layout.max_group_numel = e->layout.max_partitioned_numel = e->layout.second_group_numel = 0;
    e->layout.total_parts = 0;
    for (g = 0; g < G; g++) {
        zero_group_info gi;
        zero__eng_group *eg = &e->layout.groups[g];
        zero_result r;
        memset(&gi, 0, sizeof gi);
        r = zero_plan_group(e->layout.plan, g, &gi);
        if (r != ZERO_OK) return r;
        eg->numel = gi.numel;
        eg->gnumel = gi.numel - gi.frozen_numel;
        eg->shard_numel = eg->gnumel / (size_t)e->cfg.world;
        eg->pshard_numel = gi.shard_numel;
        eg->used_numel = gi.used_numel;
        eg->off_gwhole = ogw;
        eg->off_pstage = ops;
        ovf |= zero__add_size(ogw, eg->gnumel, &ogw);
        ovf |= zero__add_size(ops, eg->pshard_numel, &ops);
        if (gi.frozen_numel) e->layout.any_frozen = 1;
        eg->persistent = e->cfg.stage == 3 && gi.persistent;
        eg->off_whole = ow;
        eg->off_shard = os;
        eg->off_param = op;
        eg->poff = eg->goff = ZERO__ENG_NONE;
        eg->parts = g < e->layout.cap_parts_req ? e->layout.parts_req[g] : 1;
        if (eg->gnumel == 0) eg->parts = 0; /* only frozen tensors: no gradient */
        multi |= eg->parts > 1;
        e->layout.total_parts += eg->parts;
        ovf |= zero__add_size(ow, gi.numel, &ow);
        ovf |= zero__add_size(os, eg->shard_numel, &os);
        pparam = (e->cfg.stage == 3 && !eg->persistent) ? gi.shard_numel : gi.numel;
        /* the shard lives in the host tier (host.params) */
        if (e->cfg.params_offloaded && !eg->persistent) {
            eg->off_param = ohp;
            ovf |= zero__add_size(ohp, pparam, &ohp);
            pparam = 0;
        }
        ovf |= zero__add_size(op, pparam, &op);
        if (gi.numel > e->layout.max_group_numel) {
            e->layout.second_group_numel = e->layout.max_group_numel;
            e->layout.max_group_numel = gi.numel;
        } else if (gi.numel > e->layout.second_group_numel) {
            e->layout.second_group_numel = gi.numel;
        }
        if (!eg->persistent && gi.numel > e->layout.max_partitioned_numel)
            e->layout.max_partitioned_numel = gi.numel;
    }
    /* one group: its own gradient beside its params */
    if (G == 1) e->layout.second_group_numel = e->layout.max_group_numel;
    e->layout.total_numel = ow;
    e->layout.gtotal_numel = ogw;
    e->layout.pshard_total = ops;
    e->layout.shard_numel = os;
    if (e->layout.any_frozen &&
        (e->cfg.opt_offloaded || e->cfg.params_offloaded ||
         e->cfg.desc.offload_gradients != ZERO_OFFLOAD_NONE)) {
        int t;
        for (t = 0; t < e->layout.ntensors && !(e->layout.tensor_flags[t] & ZERO_TENSOR_FROZEN); t++) {}
        return zero__fail(ZERO_ERROR_UNSUPPORTED,
                          "zero_engine_commit: frozen tensors ('%.200s', ...) with offload "
                          "(offload_optimizer, offload_param, offload_gradients) are not "
                          "supported yet: train without offload, or register the tensor "
                          "without ZERO_TENSOR_FROZEN",
                          zero__eng_tensor_name(e, t));
    }
    Ms = e->layout.max_group_numel / (size_t)e->cfg.world;
    /* the user's gradient buffer holds the reduced values (in place) only when no later
       contribution of the step is zero-filled into it: one micro-step, one part */
    e->layout.acc_is_user_grad = e->cfg.stage <= 1 && e->cfg.accum_steps == 1 &&
                                 e->cfg.comm_dtype == e->cfg.param_dtype && !multi;
    memset(sz, 0, sizeof *sz);
    sz->n = ZERO__B_N;
    sz->cat[ZERO__B_SCRATCH] = ZERO_MEM_SCRATCH;
    sz->bytes[ZERO__B_SCRATCH] = ZERO__ENG_SCRATCH_BYTES;
    sz->cat[ZERO__B_PARAM] = ZERO_MEM_PARAM;
    ovf |= zero__mul_size(op, e->cfg.param_size, &sz->bytes[ZERO__B_PARAM]);
    sz->cat[ZERO__B_GRAD_USER] = ZERO_MEM_GRAD;
    if (e->cfg.stage <= 1)
        ovf |=
            zero__mul_size(e->layout.gtotal_numel, e->cfg.param_size, &sz->bytes[ZERO__B_GRAD_USER]);
    sz->cat[ZERO__B_GRAD_ACC] = ZERO_MEM_GRAD;
    /* offload_optimizer: the accumulator is in the host tier (zero__eng_offload_alloc) */
    if (!e->layout.acc_is_user_grad && !e->cfg.opt_offloaded)
        ovf |= zero__mul_size(e->cfg.stage == 0 ? e->layout.gtotal_numel : e->layout.shard_numel,
                              e->cfg.comm_size, &sz->bytes[ZERO__B_GRAD_ACC]);
    /* offload_optimizer_ratio: the host tier takes H of the S elements, the device the rest
       (its master, m, v and the gradients its Adam reads: opt.dmaster, dm, dv, dgrad) */
    e->host.opt_numel = e->cfg.opt_offloaded
                            ? zero__ratio_split(e->layout.shard_numel,
                                                    e->cfg.desc.offload_optimizer_ratio)
                            : 0;
    if (e->cfg.opt_offloaded)
        ovf |= zero__mul_size(e->layout.shard_numel - e->host.opt_numel, e->cfg.comm_size,
                              &sz->bytes[ZERO__B_GRAD_ACC]);
    sz->cat[ZERO__B_MASTER] = ZERO_MEM_MASTER;
    sz->cat[ZERO__B_M1] = ZERO_MEM_MOMENT1;
    sz->cat[ZERO__B_M2] = ZERO_MEM_MOMENT2;
    ovf |= zero__mul_size(e->cfg.stage == 0 ? e->layout.gtotal_numel : e->layout.shard_numel,
                          e->cfg.opt_size, &sz->bytes[ZERO__B_MASTER]);
    /* in the host tier: zero__eng_offload_alloc */
    if (e->cfg.opt_offloaded) sz->bytes[ZERO__B_MASTER] = (e->layout.shard_numel - e->host.opt_numel) * 4;
    sz->bytes[ZERO__B_M1] = sz->bytes[ZERO__B_M2] = sz->bytes[ZERO__B_MASTER];
    e->host.params_numel = ohp;
    /* The bucket stages the reductions whose comm dtype differs from the param dtype: a
       group goes through it in pieces of N x b elements (b per rank), b from
       reduce_bucket_numel (0: the second-largest group; SIZE_MAX: the largest), at most the
       largest shard. Reductions in the param dtype read the gradient buffer directly. */
    sz->cat[ZERO__B_BUCKET] = ZERO_MEM_BUCKET;
    {
        size_t R = e->cfg.desc.reduce_bucket_numel, b;
        if (R == 0) R = e->layout.second_group_numel;
        else if (R == (size_t)-1) R = e->layout.max_group_numel;
        b = R / (size_t)e->cfg.world;
        if (b > Ms) b = Ms;
        if (b < 1) b = 1;
        e->buf.bucket_piece_numel = b;
        if (e->cfg.comm_dtype != e->cfg.param_dtype) {
            size_t n = 0;
            ovf |= zero__mul_size(b, (size_t)e->cfg.world, &n);
            ovf |= zero__mul_size(n, e->cfg.comm_size, &sz->bytes[ZERO__B_BUCKET]);
        }
    }
    /* counted as GATHER at stage 3; at stage 2 it holds gradient buffers only: BUCKET */
    sz->cat[ZERO__B_ARENA] = e->cfg.stage == 3 ? ZERO_MEM_GATHER : ZERO_MEM_BUCKET;
    if (e->cfg.stage >= 2) {
        zero_result r = zero__eng_arena_size(e);
        if (r != ZERO_OK) return r;
        ovf |= zero__mul_size(e->pool.numel, e->cfg.param_size, &sz->bytes[ZERO__B_ARENA]);
    }
    sz->cat[ZERO__B_QUANT] = ZERO_MEM_BUCKET;
    {
        zero_result qr = zero__eng_quant_layout(e, &sz->bytes[ZERO__B_QUANT]);
        if (qr != ZERO_OK) return qr;
    }
    /* hpZ: the secondary parts, numel / S of each partitioned group (numel is a multiple of
       N, so of S), counted as params: the + p Psi / S of the formula */
    sz->cat[ZERO__B_HPZ] = ZERO_MEM_PARAM;
    if (e->topo.hpz) {
        size_t sec = 0;
        for (g = 0; g < G; g++) {
            zero__eng_group *eg = &e->layout.groups[g];
            if (eg->persistent) continue;
            eg->off_sec = sec;
            ovf |= zero__add_size(sec, eg->numel / (size_t)e->topo.hpz, &sec);
        }
        ovf |= zero__mul_size(sec, e->cfg.param_size, &sz->bytes[ZERO__B_HPZ]);
        e->topo.hpz_valid = (unsigned char *)zero__alloc_zeroed(a, (size_t)G + 1);
        if (!e->topo.hpz_valid)
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: hpZ group flags");
    }
    if (ovf) return zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: sizes overflow size_t");
    if (e->cfg.stage >= 2) {
        e->pool.free_ext[0].off = 0;
        e->pool.free_ext[0].numel = e->pool.numel;
        e->pool.free_ext[0].fence = NULL;
        e->pool.free_ext[0].fence_seq = 0;
        e->pool.nfree = 1;
    }
    return ZERO_OK;
}

static zero_result zero__eng_make_events(zero_engine *e)
{
    zero_device *dev = e->cfg.dev;
    int g;
    zero_result r = ZERO_OK;
    if (!dev->ops->event_create) return ZERO_OK;
    for (g = 0; g < e->layout.ngroups && r == ZERO_OK; g++) {
        if (e->cfg.stage == 3 && !e->layout.groups[g].persistent)
            r = dev->ops->event_create(dev, &e->layout.groups[g].ev_gathered);
        if (r == ZERO_OK) r = dev->ops->event_create(dev, &e->layout.groups[g].ev_reduced);
    }
    return r;
}

/* ---- offload: the host tier (ZeRO-Offload) ------------------------------------------------ */
/* What this part owns: the engine's host-tier buffers (offloaded master/m/v, offloaded
   stage-3 param shards, the staging tiles of the step), their accounting, the tiling of the
   offloaded step, the step itself (grad tiles device -> host on ZERO_QUEUE_OFFLOAD, host
   Adam, param tiles host -> device on ZERO_QUEUE_COMPUTE, overlapped), the upload of an
   offloaded param shard before its all-gather, and the out-of-memory hint of commit. */

/* Host memory of 'bytes' bytes (pinned through the device when it can and pin_memory
   allows), zero-filled, counted in the host tier under cat. */
static zero_result zero__eng_host_alloc(zero_engine *e, size_t bytes, zero_mem_category cat,
                                        void **out)
{
    void *p = NULL;
    int pinned = 0;
    *out = NULL;
    if (bytes == 0) return ZERO_OK;
    if (e->host.nallocs == ZERO__ENG_MAX_HOST_ALLOCS)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine: too many host allocations");
    if (e->cfg.desc.pin_memory > 0 && e->cfg.dev->ops->host_alloc && e->cfg.dev->ops->host_free) {
        zero_result r = e->cfg.dev->ops->host_alloc(e->cfg.dev, bytes, &p);
        if (r != ZERO_OK) return r;
        pinned = 1;
        memset(p, 0, bytes);
    } else {
        p = zero__alloc_zeroed(&e->cfg.desc.allocator, bytes);
        if (!p)
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine: %zu bytes of host memory (%s)",
                              bytes, zero_mem_category_name(cat));
    }
    e->host.allocs[e->host.nallocs].ptr = p;
    e->host.allocs[e->host.nallocs].bytes = bytes;
    e->host.allocs[e->host.nallocs].cat = cat;
    e->host.pinned[e->host.nallocs] = pinned;
    e->host.nallocs++;
    e->host.mem[cat] += bytes;
    if (e->host.mem[cat] > e->host.mem_peak[cat]) e->host.mem_peak[cat] = e->host.mem[cat];
    e->host.mem_total += bytes;
    if (e->host.mem_total > e->host.mem_peak_total) e->host.mem_peak_total = e->host.mem_total;
    *out = p;
    return ZERO_OK;
}

static void zero__eng_free_host(zero_engine *e)
{
    int i;
    zero__gnv_free(e); /* its writes may still read the staging freed below */
    for (i = e->host.nallocs - 1; i >= 0; i--) {
        if (e->host.pinned[i]) (void)e->cfg.dev->ops->host_free(e->cfg.dev, e->host.allocs[i].ptr);
        else zero__free(&e->cfg.desc.allocator, e->host.allocs[i].ptr);
        e->host.mem[e->host.allocs[i].cat] -= e->host.allocs[i].bytes;
        e->host.mem_total -= e->host.allocs[i].bytes;
    }
    e->host.nallocs = 0;
    if (e->nvme.swap) {
        e->host.mem[ZERO_MEM_SCRATCH] -= e->nvme.swap_stride * (size_t)e->nvme.nswap;
        e->host.mem_total -= e->nvme.swap_stride * (size_t)e->nvme.nswap;
    }
    zero__eng_nvme_free(e);
    zero__free(&e->cfg.desc.allocator, e->host.tiles);
    zero__free(&e->cfg.desc.allocator, e->host.pieces);
    e->host.tiles = NULL;
    e->host.pieces = NULL;
    e->host.ntiles = e->host.npieces = e->host.ndtiles = 0;
}

/* The tiles of the offloaded step: each group's shard cut into runs of tile_numel elements,
   and each tile's pieces (its intersections with the tensors this rank owns a part of). */
static zero_result zero__eng_offload_plan(zero_engine *e)
{
    const zero_allocator *a = &e->cfg.desc.allocator;
    size_t T = e->cfg.desc.sub_group_size, maxsh = 0, nt = 0, np = 0, nh = 0, b, n;
    int g, t, pass;
    for (g = 0; g < e->layout.ngroups; g++)
        if (e->layout.groups[g].shard_numel > maxsh) maxsh = e->layout.groups[g].shard_numel;
    if (e->cfg.desc.buffer_size < T) T = e->cfg.desc.buffer_size;
    if (maxsh < T) T = maxsh;
    if (T == 0) T = 1;
    e->host.tile_numel = T;
    for (pass = 0; pass < 2; pass++) { /* count, then fill */
        nt = np = nh = 0;
        for (g = 0; g < e->layout.ngroups; g++) {
            size_t sh = e->layout.groups[g].shard_numel, os = e->layout.groups[g].off_shard;
            /* offload_optimizer_ratio: no tile crosses the split H (host part | device part) */
            size_t cut = e->host.opt_numel > os && e->host.opt_numel < os + sh
                             ? e->host.opt_numel - os
                             : 0;
            for (b = 0; b < sh; b += n) {
                n = sh - b < T ? sh - b : T;
                if (b < cut && b + n > cut) n = cut - b;
                if (os + b < e->host.opt_numel) nh++;
                if (pass) {
                    e->host.tiles[nt].group = g;
                    e->host.tiles[nt].begin = b;
                    e->host.tiles[nt].numel = n;
                    e->host.tiles[nt].first = (int)np;
                }
                for (t = 0; t < e->layout.ntensors; t++) {
                    zero_tensor_info ti;
                    zero_range seg, shr;
                    size_t lo, hi;
                    zero_result r;
                    memset(&ti, 0, sizeof ti);
                    memset(&seg, 0, sizeof seg);
                    memset(&shr, 0, sizeof shr);
                    r = zero_plan_tensor(e->layout.plan, t, &ti);
                    if (r != ZERO_OK) return r;
                    if (ti.group != g) continue;
                    r = zero_plan_intersect(e->layout.plan, t, e->cfg.rank, &seg);
                    if (r == ZERO_OK) r = zero_plan_shard(e->layout.plan, g, e->cfg.rank, &shr);
                    if (r != ZERO_OK) return r;
                    if (seg.numel == 0) continue;
                    lo = seg.offset - shr.offset;
                    hi = lo + seg.numel;
                    if (lo < b) lo = b;
                    if (hi > b + n) hi = b + n;
                    if (lo >= hi) continue;
                    if (pass) {
                        e->host.pieces[np].tensor = t;
                        e->host.pieces[np].off = lo - b;
                        e->host.pieces[np].numel = hi - lo;
                        e->host.pieces[np].elem = lo + shr.offset - ti.offset;
                    }
                    np++;
                }
                if (pass) e->host.tiles[nt].count = (int)np - e->host.tiles[nt].first;
                nt++;
            }
        }
        if (!pass) {
            if (nt > (size_t)INT32_MAX || np > (size_t)INT32_MAX)
                return zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: too many offload tiles");
            e->host.tiles = (zero__eng_tile *)zero__alloc(a, (nt ? nt : 1) * sizeof *e->host.tiles);
            e->host.pieces =
                (zero__eng_piece *)zero__alloc(a, (np ? np : 1) * sizeof *e->host.pieces);
            if (!e->host.tiles || !e->host.pieces)
                return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: offload tiles");
        }
    }
    e->host.ntiles = (int)nh; /* the host part's tiles; the device part's follow them */
    e->host.ndtiles = (int)(nt - nh);
    e->host.npieces = (int)np;
    return ZERO_OK;
}

/* The host tier of commit: master, m, v of this rank's shard (S fp32 each), the offloaded
   param shards, the reduced gradients (S elements of the comm dtype, plus the largest shard
   again to receive micro-steps k > 0 before their add), and 2 x tile_numel param elements
   (param dtype) staging the step's uploads. Plus the OFFLOAD hand-off events. */
static zero_result zero__eng_offload_alloc(zero_engine *e)
{
    size_t sb, gb, gi, pb;
    void *p;
    zero_result r;
    int slot;
    e->host.grad_add_group = -1;
    e->nvme.cached_tile = e->nvme.cached_group = -1;
    for (slot = 0; slot <= ZERO__ENG_RA_MAX; slot++) e->nvme.ahead_group[slot] = -1;
    e->nvme.cached_tile_slot = 0;
    e->nvme.ahead_depth = e->cfg.desc.param_read_ahead;
    e->nvme.ahead_prev = -1;
    if (!e->cfg.opt_offloaded) return ZERO_OK;
    if (e->cfg.dev->ops->event_create) {
        r = e->cfg.dev->ops->event_create(e->cfg.dev, &e->sync.compute_to_offload);
        if (r == ZERO_OK) r = e->cfg.dev->ops->event_create(e->cfg.dev, &e->sync.comm_to_offload);
        if (r == ZERO_OK) r = e->cfg.dev->ops->event_create(e->cfg.dev, &e->sync.offload_to_comm);
        if (r != ZERO_OK) return r;
    }
    if ((r = zero__eng_offload_plan(e)) != ZERO_OK) return r;
    if (zero__mul_size(e->host.opt_numel, e->cfg.opt_size, &sb) ||
        zero__mul_size(e->layout.shard_numel, e->cfg.comm_size, &gb) ||
        zero__mul_size(e->layout.max_group_numel / (size_t)e->cfg.world, e->cfg.comm_size, &gi) ||
        zero__mul_size(e->host.tile_numel, 2 * e->cfg.param_size, &pb))
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: host tier sizes overflow");
    if (e->cfg.desc.offload_optimizer == ZERO_OFFLOAD_NVME ||
        e->cfg.desc.offload_param == ZERO_OFFLOAD_NVME)
        if ((r = zero__eng_nvme_alloc(e)) != ZERO_OK) return r;
    if (e->cfg.desc.offload_optimizer != ZERO_OFFLOAD_NVME) {
        if ((r = zero__eng_host_alloc(e, sb, ZERO_MEM_MASTER, &p)) != ZERO_OK) return r;
        e->opt.master = (float *)p;
        if ((r = zero__eng_host_alloc(e, sb, ZERO_MEM_MOMENT1, &p)) != ZERO_OK) return r;
        e->opt.m = (float *)p;
        if ((r = zero__eng_host_alloc(e, sb, ZERO_MEM_MOMENT2, &p)) != ZERO_OK) return r;
        e->opt.v = (float *)p;
    }
    if (e->cfg.desc.offload_param == ZERO_OFFLOAD_CPU && e->host.params_numel > 0) {
        size_t hb;
        if (zero__mul_size(e->host.params_numel, e->cfg.param_size, &hb))
            return zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: host tier sizes overflow");
        if ((r = zero__eng_host_alloc(e, hb, ZERO_MEM_PARAM, &p)) != ZERO_OK) return r;
        e->host.params = (unsigned char *)p;
    }
    if (e->cfg.desc.offload_gradients == ZERO_OFFLOAD_NVME) { /* staging only: the shard is on NVMe */
        if ((r = zero__gnv_alloc(e)) != ZERO_OK) return r;
    } else {
        if ((r = zero__eng_host_alloc(e, gb, ZERO_MEM_GRAD, &p)) != ZERO_OK) return r;
        e->host.grad = (unsigned char *)p;
    }
    if ((e->cfg.accum_steps > 1 || e->layout.total_parts > e->layout.ngroups) && !e->gnv) { /* later contributions */
        if ((r = zero__eng_host_alloc(e, gi, ZERO_MEM_GRAD, &p)) != ZERO_OK) return r;
        e->host.grad_in = (unsigned char *)p;
    }
    if ((r = zero__eng_host_alloc(e, pb, ZERO_MEM_PARAM, &p)) != ZERO_OK) return r;
    e->host.tile_params = (unsigned char *)p;
    if (e->dpu.on) { /* delayed_update: a second gradient shard and the pending params */
        size_t qb;
        if (zero__mul_size(e->layout.shard_numel, e->cfg.param_size, &qb))
            return zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: host tier sizes overflow");
        if ((r = zero__eng_host_alloc(e, gb, ZERO_MEM_GRAD, &p)) != ZERO_OK) return r;
        e->dpu.spare = (unsigned char *)p;
        if ((r = zero__eng_host_alloc(e, qb, ZERO_MEM_PARAM, &p)) != ZERO_OK) return r;
        e->dpu.params = (unsigned char *)p;
        e->dpu.coefs = (zero_adam_coefs *)zero__alloc(
            &e->cfg.desc.allocator, (size_t)(e->layout.ntensors ? e->layout.ntensors : 1) *
                                        sizeof *e->dpu.coefs);
        if (!e->dpu.coefs)
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: delayed update");
    }
    return ZERO_OK;
}

/* Orders queue 'to' after everything enqueued on 'from' so far, through ev. */
static zero_result zero__eng_handoff_ev(zero_engine *e, zero_queue from, zero_queue to, zero_event *ev)
{
    zero_result r = zero__eng_record(e, from, ev);
    if (r == ZERO_OK) r = zero__eng_wait(e, to, ev);
    return r;
}

/* Stage 3 with offload_param: uploads this rank's offloaded shard of group g into its place
   in its arena extent dst (on OFFLOAD, after the extent's earlier users on COMPUTE and COMM),
   and orders COMM after it; the all-gather then runs in place. */
static zero_result zero__eng_offload_param_in(zero_engine *e, int g, unsigned char *dst)
{
    const zero__eng_group *eg = &e->layout.groups[g];
    unsigned char *mine = dst + (size_t)e->cfg.rank * eg->shard_numel * e->cfg.param_size,
                  *src = NULL;
    zero_result r = zero__eng_hparam_get(e, g, &src); /* nvme: read ahead of the all-gather */
    if (r == ZERO_OK) zero__eng_ra_start(e, g);
    if (e->nvme.param_file) { /* every rank learns of a failed read before the all-gather: no hang */
        char err[400];
        err[0] = '\0';
        if (r != ZERO_OK) zero__eng_copy_error(err, sizeof err);
        r = zero__eng_nvme_agree(e, r, err, "zero_engine_gather", g);
    }
    if (r != ZERO_OK) return r;
    r = zero__eng_handoff_ev(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_OFFLOAD, e->sync.compute_to_offload);
    if (r == ZERO_OK)
        r = zero__eng_handoff_ev(e, ZERO_QUEUE_COMM, ZERO_QUEUE_OFFLOAD, e->sync.comm_to_offload);
    if (r == ZERO_OK)
        r = e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_OFFLOAD, mine, src,
                                    eg->shard_numel * e->cfg.param_size);
    if (r == ZERO_OK)
        r = zero__eng_handoff_ev(e, ZERO_QUEUE_OFFLOAD, ZERO_QUEUE_COMM, e->sync.offload_to_comm);
    return r;
}

/* Where tile k's updated params go: a device pointer (uploaded from the staging tile), or
   NULL when the group's shard is offloaded (the host Adam writes it in place). */
static unsigned char *zero__eng_tile_param_dev(const zero_engine *e, const zero__eng_tile *tl)
{
    const zero__eng_group *eg = &e->layout.groups[tl->group];
    if (e->cfg.params_offloaded && !eg->persistent) return NULL;
    if (e->cfg.stage < 3)
        return e->buf.param + (eg->off_whole + (size_t)e->cfg.rank * eg->shard_numel + tl->begin) *
                                  e->cfg.param_size;
    if (eg->persistent)
        return e->buf.param + (eg->off_param + (size_t)e->cfg.rank * eg->shard_numel + tl->begin) *
                                  e->cfg.param_size;
    return e->buf.param + (eg->off_param + tl->begin) * e->cfg.param_size;
}

/* The host device's kernel bodies over host-tier memory, for the reduced gradients that left
   the device: the same code as its add, nonfinite and sumsq ops (and the device backends are
   defined to give the same bits), so the accumulation, the inf/NaN verdict and the norm do
   not change when the gradients move to the host. Returns the body's block sum. */
static double zero__eng_host_kernel(const zero_engine *e, zero__host_body body, void *dst,
                                    const void *src, size_t numel)
{
    zero__host_device hd;
    zero__host_ctx c;
    memset(&hd, 0, sizeof hd);
    hd.simd = zero_simd_detect();
    hd.threads = e->cfg.desc.host_threads > 1 && numel >= 4 * (size_t)ZERO_HOST_SUMSQ_BLOCK
                     ? e->cfg.desc.host_threads
                     : 1;
    memset(&c, 0, sizeof c);
    c.d = &hd;
    c.dst = dst;
    c.src = src;
    c.dtype = e->cfg.comm_dtype;
    return zero__host_for(&hd, numel, body, &c);
}

/* Finishes the pending host add of a micro-step k > 0 (its download waited for first). */
static zero_result zero__eng_host_grad_settle(zero_engine *e)
{
    int g = e->host.grad_add_group;
    const zero__eng_group *eg;
    if (g < 0) return ZERO_OK;
    e->host.grad_add_group = -1;
    eg = &e->layout.groups[g];
    ZERO__ENG_TRY(e, e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_OFFLOAD),
                  "gradient offload: sync");
    (void)zero__eng_host_kernel(e, zero__host_body_add,
                                e->host.grad + eg->off_shard * e->cfg.comm_size, e->host.grad_in,
                                eg->shard_numel);
    return ZERO_OK;
}

/* Elements [j, j + n) of group g's reduced shard, at dev_src on the device (written on
   COMM), leave the device: the step's first contribution ('store') is downloaded into its
   place in host.grad, a later one into host.grad_in for an add on the host (deferred until
   the next download needs host.grad_in, or the step). COMM then waits for the download, so
   whatever reuses dev_src after an event recorded on COMM (the next piece's cast into the
   bucket, the gradient buffer's return to the arena, a gradient slice) comes after it. */
static zero_result zero__eng_grad_out(zero_engine *e, int g, int store, const unsigned char *dev_src,
                                      size_t j, size_t n)
{
    const zero__eng_group *eg = &e->layout.groups[g];
    unsigned char *dst = e->host.grad + (eg->off_shard + j) * e->cfg.comm_size;
    zero_result r;
    if (e->gnv) return zero__gnv_out(e, g, store, dev_src, j, n); /* offload_gradients = nvme */
    if (!store) {
        if (j == 0 && (r = zero__eng_host_grad_settle(e)) != ZERO_OK) return r;
        dst = e->host.grad_in + j * e->cfg.comm_size;
    }
    r = zero__eng_handoff_ev(e, ZERO_QUEUE_COMM, ZERO_QUEUE_OFFLOAD, e->sync.comm_to_offload);
    if (r == ZERO_OK)
        r = e->cfg.dev->ops->download(e->cfg.dev, ZERO_QUEUE_OFFLOAD, dst, dev_src,
                                      n * e->cfg.comm_size);
    if (r == ZERO_OK)
        r = zero__eng_handoff_ev(e, ZERO_QUEUE_OFFLOAD, ZERO_QUEUE_COMM, e->sync.offload_to_comm);
    if (r == ZERO_OK && !store && j + n == eg->shard_numel) e->host.grad_add_group = g;
    return r;
}

/* The step's inf/NaN flag and sum of squares over the host-tier gradients: every download
   waited for, then the host device's kernels over each group's shard in group order (the
   order the device ops run in without offload), and the pair uploaded to the scratch as
   the device ops would have left it (sumsq f64 at 0, flag f32 at 8). */
static zero_result zero__eng_host_grad_norm(zero_engine *e)
{
    unsigned char v[16];
    double sumsq = 0.0;
    float flag = 0.0f, zero = 0.0f;
    int g;
    zero_result r = zero__eng_host_grad_settle(e);
    if (r != ZERO_OK) return r;
    ZERO__ENG_TRY(e, e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_OFFLOAD),
                  "step: sync of the offload queue");
    if (e->gnv && (r = zero__gnv_norm(e, &sumsq, &flag)) != ZERO_OK) return r; /* nvme */
    for (g = 0; g < e->layout.ngroups && e->topo.replica; g++) /* MiCS: across the replicas */
        if (e->layout.groups[g].shard_numel)
            ZERO__ENG_TRY(e, zero__eng_replica_reduce(e, e->host.grad + e->layout.groups[g].off_shard *
                                                                            e->cfg.comm_size,
                                                      e->layout.groups[g].shard_numel, g),
                          "step: all_reduce of the gradients across the MiCS replicas");
    for (g = 0; g < e->layout.ngroups && !e->gnv; g++) {
        const unsigned char *a = e->host.grad + e->layout.groups[g].off_shard * e->cfg.comm_size;
        size_t n = e->layout.groups[g].shard_numel;
        if (zero__eng_host_kernel(e, zero__host_body_nonfinite, NULL, a, n) > 0.0) flag = 1.0f;
        sumsq += zero__eng_host_kernel(e, zero__host_body_sumsq, NULL, a, n);
    }
    memcpy(v, &sumsq, 8);
    memcpy(v + 8, &flag, 4);
    memcpy(v + 12, &zero, 4);
    ZERO__ENG_TRY(
        e, e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_COMPUTE, e->buf.scratch, v, sizeof v),
        "step: upload of the gradient norm");
    return ZERO_OK;
}

/* The weight decay tensor t trains with: its own (wd >= 0), else the engine's, 0 for a
   ZERO_TENSOR_NO_DECAY tensor. */
static double zero__eng_tensor_wd(const zero_engine *e, int t, double wd)
{
    if (wd >= 0.0) return wd;
    return (e->layout.tensor_flags[t] & ZERO_TENSOR_NO_DECAY) ? 0.0 : e->opt.adam.weight_decay;
}

/* Tensor t's Adam constants at step 'step' (1-based) with lr multiplier lr_mul and weight
   decay wd (< 0: the default): those of a torch parameter group whose lr is the engine's lr
   times lr_mul (one double product; lr_mul 1 gives the engine's constants bit for bit). An
   lr of 0 moves nothing (a zero_adam_desc's 0 would mean the default lr instead). */
static zero_result zero__eng_tensor_coefs(const zero_engine *e, int t, double lr_mul, double wd,
                                          int64_t step, zero_adam_coefs *out)
{
    double lr = e->opt.adam.lr * lr_mul, w = zero__eng_tensor_wd(e, t, wd);
    /* e->opt.adam was resolved once, at create: the current lr is taken as it is (0 = 0:
       zero_engine_set_lr(e, 0) trains at 0, never at the descriptor's default) */
    return zero__adam_coefs(out, &e->opt.adam, lr, w, step, "Adam");
}

/* Element 'off' of an optimizer state buffer (fp32 or bf16: optimizer_dtype); NULL stays
   NULL. */
static float *zero__opt_at(const zero_engine *e, float *base, size_t off)
{
    return base ? (float *)(void *)((unsigned char *)base + off * e->cfg.opt_size) : NULL;
}

/* The state dtype and stochastic-rounding counter of an Adam range over tensor t's
   elements from 'elem' on (its index within the tensor). */
static void zero__eng_range_sr(const zero_engine *e, zero_adam_range *ar, int t, size_t elem)
{
    ar->state_dtype = e->cfg.opt_dtype;
    ar->sr_key = e->opt.sr_key;
    ar->sr_index = e->opt.model_off[t] + (uint64_t)elem;
}

/* Host Adam over tile k's pieces (the same element expression as the device's adam op):
   gradients and master/m/v in the host tier, params into the staging
   tile (zero between pieces: the padding stays zero) or the offloaded shard. */
static zero_result zero__eng_tile_adam(zero_engine *e, int k, float mul,
                                       float *mst, float *mm, float *vv) /* opt_size elements */
{
    const zero__eng_tile *tl = &e->host.tiles[k];
    const zero__eng_group *eg = &e->layout.groups[tl->group];
    const unsigned char *gbuf =
        e->gnv ? e->gnv->slots + (size_t)(k % e->nvme.nswap) * e->gnv->slot_stride
               : e->host.grad + (eg->off_shard + tl->begin) * e->cfg.comm_size;
    unsigned char *pbuf =
        zero__eng_tile_param_dev(e, tl)
            ? e->host.tile_params + (size_t)(k & 1) * e->host.tile_numel * e->cfg.param_size
        : e->nvme.param_file
            ? e->nvme.param_buf + (size_t)(tl->group & 1) * e->nvme.param_buf_stride +
                  tl->begin * e->cfg.param_size
            : e->host.params + (eg->off_param + tl->begin) * e->cfg.param_size;
    int i;
    if (zero__eng_tile_param_dev(e, tl)) memset(pbuf, 0, tl->numel * e->cfg.param_size);
    for (i = tl->first; i < tl->first + tl->count; i++) {
        const zero__eng_piece *pc = &e->host.pieces[i];
        zero_adam_range ar;
        zero_result r;
        ar.numel = pc->numel;
        ar.master = zero__opt_at(e, mst, pc->off);
        ar.m = zero__opt_at(e, mm, pc->off);
        ar.v = zero__opt_at(e, vv, pc->off);
        zero__eng_range_sr(e, &ar, pc->tensor, pc->elem);
        ar.grad = gbuf + pc->off * e->cfg.comm_size;
        ar.grad_dtype = e->cfg.comm_dtype;
        ar.param = pbuf + pc->off * e->cfg.param_size;
        ar.param_dtype = e->cfg.param_dtype;
        r = zero_adam_host(
            &ar, &e->opt.coefs[pc->tensor], mul,
            ZERO_SIMD_AUTO, pc->numel >= 65536 ? e->cfg.desc.host_threads : 1);
        if (r != ZERO_OK) return r;
    }
    return ZERO_OK;
}

/* ---- the NVMe tier of the optimizer state (ZeRO-Infinity) ---- */

/* Waits for the transfer in flight on swap slot i (if any). */
static zero_result zero__eng_swap_wait(zero_engine *e, int i)
{
    zero_io_ticket t = e->nvme.swap_ticket[i];
    zero_result r = ZERO_OK;
    e->nvme.swap_ticket[i] = 0;
    if (e->gnv && e->gnv->slot_ticket[i]) { /* the tile's gradients (offload_gradients = nvme) */
        r = zero_io_wait(e->nvme.io, e->gnv->slot_ticket[i]);
        e->gnv->slot_ticket[i] = 0;
    }
    if (t) {
        zero_result w = zero_io_wait(e->nvme.io, t);
        if (r == ZERO_OK) r = w;
    }
    return r;
}

/* Reads tile k's master, m, v into its slot (after the slot's write behind finished). */
static zero_result zero__eng_swap_in(zero_engine *e, int k)
{
    int i = k % e->nvme.nswap;
    zero_result r = zero__eng_swap_wait(e, i);
    if (r != ZERO_OK) return r;
    if (e->gnv && e->gnv->file) /* the tile's gradients, with its record */
        r = zero_io_read(e->gnv->file, e->gnv->off[k], e->gnv->slots + (size_t)i * e->gnv->slot_stride,
                         e->host.tiles[k].numel * e->cfg.comm_size, &e->gnv->slot_ticket[i]);
    if (r != ZERO_OK) return r;
    if (e->nvme.tile_fresh[k] == 1) { /* still the file's zeros */
        memset(e->nvme.swap + (size_t)i * e->nvme.swap_stride, 0, e->host.tiles[k].numel * 12);
        return ZERO_OK;
    }
    if (e->nvme.tile_fresh[k] == 2) { /* the master only: m and v are zeros */
        memset(e->nvme.swap + (size_t)i * e->nvme.swap_stride + e->host.tiles[k].numel * 4, 0, e->host.tiles[k].numel * 8);
        return zero_io_read(e->nvme.opt_file, e->nvme.tile_off[k], e->nvme.swap + (size_t)i * e->nvme.swap_stride,
                            e->host.tiles[k].numel * 4, &e->nvme.swap_ticket[i]);
    }
    return zero_io_read(e->nvme.opt_file, e->nvme.tile_off[k], e->nvme.swap + (size_t)i * e->nvme.swap_stride,
                        e->host.tiles[k].numel * 12, &e->nvme.swap_ticket[i]);
}

/* Writes tile k back from its slot, behind the next tile's Adam. */
static zero_result zero__eng_swap_out(zero_engine *e, int k)
{
    int i = k % e->nvme.nswap;
    e->nvme.tile_fresh[k] = 0;
    return zero_io_write(e->nvme.opt_file, e->nvme.tile_off[k],
                         e->nvme.swap + (size_t)i * e->nvme.swap_stride,
                         e->host.tiles[k].numel * 12, &e->nvme.swap_ticket[i]);
}

/* Every rank learns whether some rank's NVMe transfers failed in this step (one control
   all-reduce; no rank waits in a later collective for one that gave up): on failure every
   rank's engine breaks with the failing rank's cause (or a pointer to it). */
static zero_result zero__eng_nvme_agree(zero_engine *e, zero_result io_r, const char *io_err,
                                        const char *what, int group)
{
    double v[2];
    zero_device *dev = e->cfg.dev;
    v[0] = io_r != ZERO_OK ? -(double)io_r : 0.0;
    v[1] = io_r != ZERO_OK ? (double)e->cfg.rank : -1.0;
    ZERO__ENG_TRY(e, dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, e->buf.scratch + 24, v, sizeof v),
                  "step: upload");
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM), "step: event");
    ZERO__ENG_TRY(e, zero__eng_all_reduce(e, e->buf.scratch + 24, e->buf.scratch + 24, 2, ZERO_F64,
                                          ZERO_OP_MAX, 1, group, ZERO_ROLE_OFFLOAD),
                  "all_reduce of the NVMe status");
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE), "step: event");
    ZERO__ENG_TRY(e, dev->ops->download(dev, ZERO_QUEUE_COMPUTE, v, e->buf.scratch + 24, sizeof v),
                  "step: download");
    ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_COMPUTE), "step: sync");
    if (v[0] == 0.0) return ZERO_OK;
    if (e->lifecycle == ZERO__ENG_COMMITTED) {
        e->lifecycle = ZERO__ENG_BROKEN;
        snprintf(e->broken_why, sizeof e->broken_why, "the NVMe tier failed in %.60s", what);
    }
    if (io_r != ZERO_OK)
        return zero__fail(io_r, "%s: NVMe tier failed (engine broken): %.400s", what, io_err);
    return zero__fail((zero_result)(int)(-v[0]),
                      "%s: the NVMe tier of rank %d failed (engine broken; its error names the "
                      "file and the cause)",
                      what, (int)v[1]);
}

/* offload_param = nvme: the rank's param file (one range per partitioned group's shard,
   declared zero) and the two host shard buffers. */
static zero_result zero__eng_nvme_param_alloc(zero_engine *e)
{
    uint64_t off = 0;
    size_t maxb = 0, bytes;
    int g;
    zero_result r;
    void *p = NULL;
    e->nvme.param_off = (uint64_t *)zero__alloc(&e->cfg.desc.allocator,
                                                (size_t)e->layout.ngroups * sizeof(uint64_t));
    e->nvme.group_fresh =
        (unsigned char *)zero__alloc(&e->cfg.desc.allocator, (size_t)e->layout.ngroups);
    if (!e->nvme.param_off || !e->nvme.group_fresh)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: NVMe tier tables");
    memset(e->nvme.group_fresh, 1, (size_t)e->layout.ngroups);
    for (g = 0; g < e->layout.ngroups; g++) {
        size_t b = e->layout.groups[g].shard_numel * e->cfg.param_size;
        e->nvme.param_off[g] = off;
        if (e->layout.groups[g].persistent) continue;
        off += zero_io_align_up(b);
        if (b > maxb) maxb = b;
        e->nvme.mem[ZERO_MEM_PARAM] += b;
    }
    if (off == 0) return ZERO_OK;
    e->nvme.param_buf_stride = (size_t)zero_io_align_up(maxb);
    /* the cache + the reads ahead; not cleared: every use fills a slot first */
    e->nvme.param_buf_slots = e->nvme.ahead_depth + 1 < 2 ? 2 : e->nvme.ahead_depth + 1;
    bytes = (size_t)e->nvme.param_buf_slots * e->nvme.param_buf_stride;
    if ((r = zero_io_buffer_alloc(e->nvme.io, bytes, &p)) != ZERO_OK) return r;
    e->nvme.param_buf = (unsigned char *)p;
    /* host tier: the shard buffers */
    e->host.mem[ZERO_MEM_PARAM] += bytes;
    if (e->host.mem[ZERO_MEM_PARAM] > e->host.mem_peak[ZERO_MEM_PARAM])
        e->host.mem_peak[ZERO_MEM_PARAM] = e->host.mem[ZERO_MEM_PARAM];
    e->host.mem_total += bytes;
    if (e->host.mem_total > e->host.mem_peak_total) e->host.mem_peak_total = e->host.mem_total;
    if ((r = zero_io_file_create(e->nvme.io, e->cfg.desc.nvme_path, "param", e->cfg.rank, off,
                                 &e->nvme.param_file)) != ZERO_OK)
        return r;
    e->nvme.mem_total += (size_t)zero_io_file_size(e->nvme.param_file);
    e->nvme.mem[ZERO_MEM_SCRATCH] +=
        (size_t)zero_io_file_size(e->nvme.param_file) - e->nvme.mem[ZERO_MEM_PARAM];
    /* the preallocated file reads as zeros: nothing written */
    for (g = 0; g < e->layout.ngroups; g++) {
        if (e->layout.groups[g].persistent || e->layout.groups[g].shard_numel == 0) continue;
        if ((r = zero_io_declare_zeros(e->nvme.param_file, e->nvme.param_off[g],
                                       e->layout.groups[g].shard_numel * e->cfg.param_size)) !=
            ZERO_OK)
            return r;
    }
    return ZERO_OK;
}

static double zero__eng_secs(void)
{
    struct timespec t;
    clock_gettime(ZERO__CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Shard slot s: empty (ahead_group[s] < 0), reading group ahead_group[s] ahead (ahead_ticket[s],
   !ahead_write[s]), writing it behind (ahead_write[s]), or holding it clean (no ticket: a copy of
   the file's bytes, e.g. a group the cache moved away from, kept for the backward's first
   gathers). Waits for the slot's transfer and empties it; a read ahead dropped this way is
   counted as wasted. */
static zero_result zero__eng_slot_settle(zero_engine *e, int s)
{
    zero_io_ticket t = e->nvme.ahead_ticket[s];
    if (e->nvme.ahead_group[s] >= 0 && t && !e->nvme.ahead_write[s]) e->prefetch.stats.nvme_reads_wasted++;
    e->nvme.ahead_group[s] = -1;
    e->nvme.ahead_ticket[s] = 0;
    e->nvme.ahead_write[s] = 0;
    return t ? zero_io_wait(e->nvme.io, t) : ZERO_OK;
}

/* A slot to read into: an empty one (not the cache's), else a clean copy of a group not in
   keep[0..nkeep) (emptied); -1 when every other slot is reading or writing. */
static int zero__eng_slot_free(zero_engine *e, const int *keep, int nkeep)
{
    int s, i;
    for (s = 0; s < e->nvme.param_buf_slots; s++)
        if (e->nvme.ahead_group[s] < 0 && !(e->nvme.cached_group >= 0 && s == e->nvme.cached_group_slot)) return s;
    for (s = 0; s < e->nvme.param_buf_slots; s++) {
        int kept = 0;
        if (e->nvme.ahead_group[s] < 0 || e->nvme.ahead_ticket[s] || e->nvme.ahead_write[s]) continue;
        for (i = 0; i < nkeep; i++) kept |= keep[i] == e->nvme.ahead_group[s];
        if (!kept) {
            e->nvme.ahead_group[s] = -1;
            return s;
        }
    }
    return -1;
}

/* Waits for every read ahead (dropped: their bytes are the file's, nothing lost) and every
   write behind of the shard slots and forgets the clean copies; the first error. */
static zero_result zero__eng_ra_drop(zero_engine *e)
{
    zero_result r = ZERO_OK, r2;
    int s;
    for (s = 0; s < e->nvme.param_buf_slots; s++) {
        if (e->nvme.ahead_group[s] < 0) continue;
        r2 = zero__eng_slot_settle(e, s);
        if (r == ZERO_OK) r = r2;
    }
    return r;
}

/* Writes the tile record cache behind: its slot now writes it (waited for before reuse). */
static zero_result zero__eng_tile_write_behind(zero_engine *e)
{
    int k = e->nvme.cached_tile, s = e->nvme.cached_tile_slot;
    zero_result r;
    e->nvme.tile_fresh[k] = e->nvme.cached_tile_mv ? 0 : 2; /* m and v never set: the master alone */
    r = zero_io_write(e->nvme.opt_file, e->nvme.tile_off[k], e->nvme.swap + (size_t)s * e->nvme.swap_stride,
                      e->host.tiles[k].numel * (e->nvme.cached_tile_mv ? 12u : 4u), &e->nvme.swap_ticket[s]);
    if (r != ZERO_OK) return r;
    e->nvme.swap_tile_behind[s] = k;
    e->nvme.cached_tile_dirty = 0;
    e->nvme.cached_tile = -1;
    return ZERO_OK;
}

/* Waits for swap slot s's write behind (if any) and frees it. */
static zero_result zero__eng_tile_settle(zero_engine *e, int s)
{
    zero_io_ticket t = e->nvme.swap_ticket[s];
    e->nvme.swap_ticket[s] = 0;
    e->nvme.swap_tile_behind[s] = -1;
    return t ? zero_io_wait(e->nvme.io, t) : ZERO_OK;
}

/* Writes the param shard cache behind from its slot (waited for before the slot's reuse). */
static zero_result zero__eng_shard_write_behind(zero_engine *e)
{
    int g = e->nvme.cached_group, s = e->nvme.cached_group_slot;
    zero_result r;
    e->nvme.group_fresh[g] = 0;
    r = zero_io_write(e->nvme.param_file, e->nvme.param_off[g], e->nvme.param_buf + (size_t)s * e->nvme.param_buf_stride, e->layout.groups[g].shard_numel * e->cfg.param_size,
                      &e->nvme.ahead_ticket[s]);
    if (r != ZERO_OK) return r;
    e->nvme.ahead_group[s] = g;
    e->nvme.ahead_write[s] = 1;
    e->nvme.cached_group_dirty = 0;
    e->nvme.cached_group = -1;
    return ZERO_OK;
}

/* Writes back what the NVMe caches changed: the tile record (which = 1), the param shard
   (2), or both (3), and waits for every write behind of those buffers. The caches stay
   valid. */
static zero_result zero__eng_nvme_flush_some(zero_engine *e, int which)
{
    zero_result r = ZERO_OK, r2;
    int s;
    if ((which & 1) && e->nvme.opt_file) {
        if (e->nvme.cached_tile_dirty && e->nvme.cached_tile >= 0) {
            int k = e->nvme.cached_tile;
            r = zero__eng_tile_write_behind(e);
            if (r == ZERO_OK) r = zero__eng_tile_settle(e, e->nvme.cached_tile_slot);
            if (r == ZERO_OK) e->nvme.cached_tile = k; /* the slot still holds it, clean */
        }
        for (s = 0; s < e->nvme.nswap; s++) {
            r2 = zero__eng_tile_settle(e, s);
            if (r == ZERO_OK) r = r2;
        }
        if (r != ZERO_OK) return r;
    }
    if ((which & 2) && e->nvme.param_file) {
        if (e->nvme.cached_group_dirty && e->nvme.cached_group >= 0) {
            int g = e->nvme.cached_group, s0 = e->nvme.cached_group_slot;
            r = zero__eng_shard_write_behind(e);
            if (r == ZERO_OK) r = zero__eng_slot_settle(e, s0);
            if (r == ZERO_OK) e->nvme.cached_group = g;
        }
        for (s = 0; s < e->nvme.param_buf_slots; s++) {
            if (e->nvme.ahead_group[s] < 0 || !e->nvme.ahead_write[s]) continue;
            r2 = zero__eng_slot_settle(e, s);
            if (r == ZERO_OK) r = r2;
        }
    }
    return r;
}

static zero_result zero__eng_nvme_flush(zero_engine *e)
{
    return zero__eng_nvme_flush_some(e, 3);
}

/* Flushes and empties the NVMe caches (before the step reuses their buffers). */
static zero_result zero__eng_nvme_forget(zero_engine *e)
{
    zero_result r = ZERO_OK, r2;
    if (e->nvme.io && e->nvme.param_file) r = zero__eng_ra_drop(e);
    r2 = e->nvme.io ? zero__eng_nvme_flush(e) : ZERO_OK;
    if (r == ZERO_OK) r = r2;
    e->nvme.cached_tile = e->nvme.cached_group = -1;
    e->nvme.cached_tile_dirty = e->nvme.cached_group_dirty = 0;
    return r;
}

/* The host copy of offloaded group g's param shard: in place (cpu), or in the shard cache
   (nvme): the slot it is read ahead into, written behind from or kept clean in (its
   transfer waited for), else read from the file into a free slot, unless the cache holds it
   already. The group the cache held is written behind if changed, else kept as a clean
   copy. Uploads that read the slots are waited for first. */
static zero_result zero__eng_hparam_get(zero_engine *e, int g, unsigned char **out)
{
    zero_io_ticket t;
    zero_result r;
    size_t bytes;
    int s, found = -1;
    double t0;
    if (!e->nvme.param_file) {
        *out = e->host.params + e->layout.groups[g].off_param * e->cfg.param_size;
        return ZERO_OK;
    }
    if (e->nvme.cached_group == g) {
        *out = e->nvme.param_buf + (size_t)e->nvme.cached_group_slot * e->nvme.param_buf_stride;
        return ZERO_OK;
    }
    if ((r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_OFFLOAD)) != ZERO_OK) return r;
    if (e->nvme.cached_group >= 0 && e->nvme.cached_group_dirty) {
        if ((r = zero__eng_shard_write_behind(e)) != ZERO_OK) return r;
    } else if (e->nvme.cached_group >= 0) {
        e->nvme.ahead_group[e->nvme.cached_group_slot] = e->nvme.cached_group; /* a clean copy */
    }
    e->nvme.cached_group = -1;
    e->nvme.cached_group_dirty = 0;
    bytes = e->layout.groups[g].shard_numel * e->cfg.param_size;
    for (s = 0; s < e->nvme.param_buf_slots; s++)
        if (e->nvme.ahead_group[s] == g) found = s;
    if (found >= 0) { /* its slot becomes the cache */
        int was_read = !e->nvme.ahead_write[found];
        t = e->nvme.ahead_ticket[found];
        t0 = zero__eng_secs();
        e->nvme.ahead_group[found] = -1; /* taken, not wasted */
        e->nvme.ahead_ticket[found] = 0;
        e->nvme.ahead_write[found] = 0;
        r = t ? zero_io_wait(e->nvme.io, t) : ZERO_OK;
        if (t && was_read) e->prefetch.stats.nvme_read_wait_s += zero__eng_secs() - t0;
        if (r != ZERO_OK) return r;
        e->nvme.cached_group_slot = found;
    } else {
        int pick = zero__eng_slot_free(e, NULL, 0);
        for (s = 0; pick < 0 && s < e->nvme.param_buf_slots; s++) /* wait for a write behind */
            if (e->nvme.ahead_write[s]) {
                if ((r = zero__eng_slot_settle(e, s)) != ZERO_OK) return r;
                pick = s;
            }
        if (pick < 0 && (r = zero__eng_slot_settle(e, pick = 0)) != ZERO_OK) return r;
        e->nvme.cached_group_slot = pick;
        if (e->nvme.group_fresh[g]) { /* still the file's zeros */
            memset(e->nvme.param_buf + (size_t)pick * e->nvme.param_buf_stride, 0, bytes);
        } else {
            t0 = zero__eng_secs();
            e->prefetch.stats.nvme_reads_demand++;
            r = zero_io_read(e->nvme.param_file, e->nvme.param_off[g], e->nvme.param_buf + (size_t)pick * e->nvme.param_buf_stride, bytes, &t);
            if (r == ZERO_OK) r = zero_io_wait(e->nvme.io, t);
            e->prefetch.stats.nvme_read_wait_s += zero__eng_secs() - t0;
            if (r != ZERO_OK) return r;
        }
    }
    e->nvme.cached_group = g;
    *out = e->nvme.param_buf + (size_t)e->nvme.cached_group_slot * e->nvme.param_buf_stride;
    return ZERO_OK;
}

/* The first max distinct groups the recorded order gathers after the current position,
   other than g and groups prefetched now (without a trace: g + 1, g + 2, ..., or g - 1,
   g - 2, ... after a gather of a higher group): what the NVMe tier reads ahead (or keeps:
   a clean copy of one is not dropped for another's read). */
static int zero__eng_trace_ahead(const zero_engine *e, int g, int *out, int max);

/* After group g's shard came up for a gather: starts reading the next ahead_depth groups of
   the recorded order (not gathered, not in a slot) into free slots, so their reads run
   while g uploads, is all-gathered and used, and while the caller computes (with the
   prefetcher one group ahead: read i+2, i+3, ... while i+1 uploads and i is gathered). */
static void zero__eng_ra_reads(zero_engine *e, const int *want, int n, int count);

static void zero__eng_ra_start(zero_engine *e, int g)
{
    int want[ZERO__ENG_RA_MAX], n;
    if (!e->nvme.param_file) return;
    n = zero__eng_trace_ahead(e, g, want, e->nvme.ahead_depth);
    e->nvme.ahead_prev = g;
    zero__eng_ra_reads(e, want, n, 1);
}

/* A save walks the groups in order: before group g's records and shard, the shards of
   groups g .. g + param_read_ahead not in a slot yet start reading into free shard slots
   (the slot of the shard cache, group g - 1's, frees at g's first use), so the shard reads
   run under the records' reads and the checkpoint's writes. Not counted in the gathers'
   read-ahead figures. */
static void zero__eng_save_ahead(zero_engine *e, int g)
{
    int want[ZERO__ENG_RA_MAX + 1], n = 0, h;
    if (!e->nvme.param_file) return;
    for (h = g; h < e->layout.ngroups && n <= e->nvme.ahead_depth && n <= ZERO__ENG_RA_MAX; h++) want[n++] = h;
    zero__eng_ra_reads(e, want, n, 0);
}

/* Starts the reads of the groups in want (in that order) that are not gathered or in a
   slot, into free slots; count: the gathers' read-ahead figures count them. */
static void zero__eng_ra_reads(zero_engine *e, const int *want, int n, int count)
{
    int i, s, busy = 0;
    for (i = 0; i < n; i++) {
        int h = want[i], have = h == e->nvme.cached_group, slot;
        if (h < 0 || h >= e->layout.ngroups || e->layout.groups[h].persistent || e->nvme.group_fresh[h] || e->layout.groups[h].shard_numel == 0)
            continue;
        for (s = 0; s < e->nvme.param_buf_slots; s++) have |= e->nvme.ahead_group[s] == h;
        if (have) continue;
        if ((slot = zero__eng_slot_free(e, want, n)) < 0) break;
        if (zero_io_read(e->nvme.param_file, e->nvme.param_off[h], e->nvme.param_buf + (size_t)slot * e->nvme.param_buf_stride,
                         e->layout.groups[h].shard_numel * e->cfg.param_size, &e->nvme.ahead_ticket[slot]) != ZERO_OK)
            break; /* the gather reads it on demand and reports the error */
        e->nvme.ahead_group[slot] = h;
        e->nvme.ahead_write[slot] = 0;
        if (count) e->prefetch.stats.nvme_reads_ahead++;
    }
    if (!count) return;
    for (s = 0; s < e->nvme.param_buf_slots; s++) busy += e->nvme.ahead_group[s] >= 0 && e->nvme.ahead_ticket[s] && !e->nvme.ahead_write[s];
    if (busy > e->prefetch.stats.nvme_reads_in_flight_max) e->prefetch.stats.nvme_reads_in_flight_max = busy;
}

/* Marks the shard cache (group g's shard, from zero__eng_hparam_get) changed: it is
   written behind when the cache moves on, or by the next flush (nvme). */
static zero_result zero__eng_hparam_put(zero_engine *e, int g)
{
    if (e->nvme.param_file && e->nvme.cached_group == g) e->nvme.cached_group_dirty = 1;
    return ZERO_OK;
}

/* Creates the I/O engine and the rank's optimizer file and the swap slots, and declares
   every tile's record as the zeros the preallocated file holds (no byte written: commit
   costs no I/O whatever Psi). */
static zero_result zero__eng_nvme_alloc(zero_engine *e)
{
    zero_io_desc iod;
    uint64_t off = 0;
    size_t rec;
    int k;
    zero_result r;
    void *p = NULL;
    memset(&iod, 0, sizeof iod);
    iod.block_size = e->cfg.desc.block_size;
    iod.queue_depth = e->cfg.desc.queue_depth;
    iod.allocator = e->cfg.desc.allocator;
    if ((r = zero_io_create(&iod, &e->nvme.io)) != ZERO_OK) return r;
    if (e->cfg.desc.offload_param == ZERO_OFFLOAD_NVME &&
        (r = zero__eng_nvme_param_alloc(e)) != ZERO_OK)
        return r;
    if (e->cfg.desc.offload_optimizer != ZERO_OFFLOAD_NVME) return ZERO_OK;
    rec = (size_t)zero_io_align_up((uint64_t)e->host.tile_numel * 12u);
    e->nvme.tile_off = (uint64_t *)zero__alloc(&e->cfg.desc.allocator, (size_t)(e->host.ntiles ? e->host.ntiles : 1) * sizeof(uint64_t));
    e->nvme.nswap = e->cfg.desc.buffer_count < 3 ? 3 : e->cfg.desc.buffer_count;
    e->nvme.swap_ticket = (zero_io_ticket *)zero__alloc(&e->cfg.desc.allocator, (size_t)e->nvme.nswap * sizeof(zero_io_ticket));
    e->nvme.swap_tile_behind = (int *)zero__alloc(&e->cfg.desc.allocator, (size_t)e->nvme.nswap * sizeof(int));
    e->nvme.swap_mv = (unsigned char *)zero__alloc_zeroed(&e->cfg.desc.allocator, (size_t)e->nvme.nswap);
    e->nvme.tile_fresh = (unsigned char *)zero__alloc(&e->cfg.desc.allocator, (size_t)(e->host.ntiles ? e->host.ntiles : 1));
    if (!e->nvme.tile_off || !e->nvme.swap_ticket || !e->nvme.swap_tile_behind || !e->nvme.tile_fresh ||
        !e->nvme.swap_mv)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: NVMe tier tables");
    memset(e->nvme.tile_fresh, 1, (size_t)(e->host.ntiles ? e->host.ntiles : 1));
    memset(e->nvme.swap_ticket, 0, (size_t)e->nvme.nswap * sizeof(zero_io_ticket));
    for (k = 0; k < e->nvme.nswap; k++) e->nvme.swap_tile_behind[k] = -1;
    for (k = 0; k < e->host.ntiles; k++) {
        e->nvme.tile_off[k] = off;
        off += zero_io_align_up((uint64_t)e->host.tiles[k].numel * 12u);
    }
    e->nvme.swap_stride = rec;
    if ((r = zero_io_buffer_alloc(e->nvme.io, rec * (size_t)e->nvme.nswap, &p)) != ZERO_OK) return r;
    e->nvme.swap = (unsigned char *)p; /* not cleared: every use fills a slot first (read or zeros) */
    e->host.mem[ZERO_MEM_SCRATCH] += rec * (size_t)e->nvme.nswap; /* the swap slots: host tier */
    e->host.mem_peak[ZERO_MEM_SCRATCH] = e->host.mem[ZERO_MEM_SCRATCH];
    e->host.mem_total += rec * (size_t)e->nvme.nswap;
    if (e->host.mem_total > e->host.mem_peak_total) e->host.mem_peak_total = e->host.mem_total;
    if (off == 0) return ZERO_OK;
    if ((r = zero_io_file_create(e->nvme.io, e->cfg.desc.nvme_path, "optim", e->cfg.rank, off,
                                 &e->nvme.opt_file)) != ZERO_OK)
        return r;
    e->nvme.mem[ZERO_MEM_MASTER] = e->nvme.mem[ZERO_MEM_MOMENT1] = e->nvme.mem[ZERO_MEM_MOMENT2] =
        e->host.opt_numel * 4; /* the host part: all of S at offload_optimizer_ratio 1 */
    e->nvme.mem_total += (size_t)zero_io_file_size(e->nvme.opt_file);
    /* tile alignment */
    e->nvme.mem[ZERO_MEM_SCRATCH] +=
        (size_t)zero_io_file_size(e->nvme.opt_file) - 12 * e->host.opt_numel;
    for (k = 0; k < e->host.ntiles; k++) /* the preallocated file reads as zeros: nothing written */
        if ((r = zero_io_declare_zeros(e->nvme.opt_file, e->nvme.tile_off[k],
                                       e->host.tiles[k].numel * 12u)) != ZERO_OK)
            return r;
    return ZERO_OK;
}

static void zero__eng_nvme_free(zero_engine *e)
{
    if (!e->nvme.io) return;
    (void)zero_io_wait_all(e->nvme.io);
    zero_io_file_destroy(e->nvme.param_file);
    zero_io_buffer_free(e->nvme.io, e->nvme.param_buf);
    zero__free(&e->cfg.desc.allocator, e->nvme.param_off);
    e->nvme.param_file = NULL;
    e->nvme.param_buf = NULL;
    e->nvme.param_off = NULL;
    zero_io_file_destroy(e->nvme.opt_file);
    zero_io_buffer_free(e->nvme.io, e->nvme.swap);
    zero_io_destroy(e->nvme.io);
    zero__free(&e->cfg.desc.allocator, e->nvme.tile_off);
    zero__free(&e->cfg.desc.allocator, e->nvme.swap_ticket);
    zero__free(&e->cfg.desc.allocator, e->nvme.swap_tile_behind);
    zero__free(&e->cfg.desc.allocator, e->nvme.swap_mv);
    e->nvme.swap_mv = NULL;
    zero__free(&e->cfg.desc.allocator, e->nvme.tile_fresh);
    zero__free(&e->cfg.desc.allocator, e->nvme.group_fresh);
    e->nvme.tile_fresh = e->nvme.group_fresh = NULL;
    e->nvme.io = NULL;
    e->nvme.opt_file = NULL;
    e->nvme.swap = NULL;
    e->nvme.tile_off = NULL;
    e->nvme.swap_ticket = NULL;
    e->nvme.swap_tile_behind = NULL;
}

/* Copies elements [off, off + n) (shard layout) of master (kind 0), m (1) or v (2) from the
   NVMe tier to out, or from in to the tier when in is not NULL, through the tile cache (swap
   slot cached_tile_slot): a tile record is read once when first touched (the next record in
   shard order is then read ahead into the next slot when that one is free) and, if changed,
   written behind from its slot when another is needed (the cache moves to the next slot,
   waiting for that slot's own transfer first) or written at a flush, so a run of calls in
   shard order moves each record once and its reads and writes overlap the caller's work.
   Between steps: set_tensor, read_tensor, checkpoints. */
static zero_result zero__eng_nvme_state(zero_engine *e, size_t off, size_t n, int kind, float *out,
                                        const float *in)
{
    int k, lo = 0, hi = e->host.ntiles;
    zero_result r = ZERO_OK;
    zero_io_ticket t;
    float *sl = (float *)(void *)(e->nvme.swap + (size_t)e->nvme.cached_tile_slot * e->nvme.swap_stride);
    while (lo < hi) { /* the first tile ending after off (tiles are in shard order) */
        int mid = lo + (hi - lo) / 2;
        const zero__eng_tile *tl = &e->host.tiles[mid];
        if (e->layout.groups[tl->group].off_shard + tl->begin + tl->numel <= off) lo = mid + 1;
        else hi = mid;
    }
    for (k = lo; k < e->host.ntiles && r == ZERO_OK; k++) {
        const zero__eng_tile *tl = &e->host.tiles[k];
        size_t tlo = e->layout.groups[tl->group].off_shard + tl->begin, thi = tlo + tl->numel, a, b;
        if (tlo >= off + n) break;
        a = tlo > off ? tlo : off;
        b = thi < off + n ? thi : off + n;
        if (a >= b) continue;
        if (e->nvme.cached_tile != k) {
            int s, behind = -1;
            if (e->nvme.cached_tile_dirty && e->nvme.cached_tile >= 0 && (r = zero__eng_tile_write_behind(e)) != ZERO_OK)
                break;
            e->nvme.cached_tile = -1;
            e->nvme.cached_tile_dirty = 0;
            for (s = 0; s < e->nvme.nswap; s++)
                if (e->nvme.swap_tile_behind[s] == k) behind = s;
            if (behind >= 0) { /* written behind or read ahead: its slot holds the record */
                if ((r = zero__eng_tile_settle(e, behind)) != ZERO_OK) break;
                e->nvme.cached_tile_slot = behind;
                e->nvme.cached_tile_mv = e->nvme.tile_fresh[k] == 0;
            } else {
                if (e->nvme.swap_ticket[e->nvme.cached_tile_slot]) { /* writing behind: the next slot, oldest write */
                    e->nvme.cached_tile_slot = (e->nvme.cached_tile_slot + 1) % e->nvme.nswap;
                    if ((r = zero__eng_tile_settle(e, e->nvme.cached_tile_slot)) != ZERO_OK) break;
                }
                sl = (float *)(void *)(e->nvme.swap + (size_t)e->nvme.cached_tile_slot * e->nvme.swap_stride);
                e->nvme.cached_tile_mv = e->nvme.tile_fresh[k] == 0;
                e->nvme.swap_mv[e->nvme.cached_tile_slot] = e->nvme.tile_fresh[k] == 0;
                if (e->nvme.tile_fresh[k] == 1) {
                    memset(sl, 0, tl->numel * 4u); /* m and v: zeroed when first used */
                } else {
                    size_t rb = tl->numel * (e->nvme.tile_fresh[k] == 2 ? 4u : 12u);
                    r = zero_io_read(e->nvme.opt_file, e->nvme.tile_off[k], sl, rb, &t);
                    if (r == ZERO_OK) r = zero_io_wait(e->nvme.io, t);
                    if (r != ZERO_OK) break;
                }
            }
            sl = (float *)(void *)(e->nvme.swap + (size_t)e->nvme.cached_tile_slot * e->nvme.swap_stride);
            e->nvme.cached_tile = k;
            /* read the next records ahead: k + j into the j-th slot after the cache's, j = 1 ..
               nswap - 1 (buffer_count - 1: a save reads 3 ahead at the default 4), up to the
               first slot still busy (a write behind, a read not yet taken) */
            for (s = 1; s < e->nvme.nswap && k + s < e->host.ntiles; s++) {
                int kk = k + s, nx = (e->nvme.cached_tile_slot + s) % e->nvme.nswap, have = 0, q;
                if (e->nvme.tile_fresh[kk] == 1) continue; /* zeros: nothing to read */
                for (q = 0; q < e->nvme.nswap; q++) have |= e->nvme.swap_tile_behind[q] == kk;
                if (have) continue;
                if (e->nvme.swap_ticket[nx]) break;
                {
                    const zero__eng_tile *t2 = &e->host.tiles[kk];
                    unsigned char *d2 = e->nvme.swap + (size_t)nx * e->nvme.swap_stride;
                    size_t rb = t2->numel * (e->nvme.tile_fresh[kk] == 2 ? 4u : 12u);
                    e->nvme.swap_mv[nx] = e->nvme.tile_fresh[kk] == 0;
                    if (zero_io_read(e->nvme.opt_file, e->nvme.tile_off[kk], d2, rb, &e->nvme.swap_ticket[nx]) !=
                        ZERO_OK)
                        break; /* the record is read (and its error reported) when needed */
                    e->nvme.swap_tile_behind[nx] = kk;
                }
            }
            {
                int ahead = 0, q;
                for (q = 0; q < e->nvme.nswap; q++)
                    ahead += e->nvme.swap_ticket[q] && e->nvme.swap_tile_behind[q] > k &&
                             e->nvme.swap_tile_behind[q] < k + e->nvme.nswap;
                if (ahead > e->nvme.records_ahead_max) e->nvme.records_ahead_max = ahead;
            }
        }
        if (kind != 0 && !e->nvme.swap_mv[e->nvme.cached_tile_slot]) {
            if (!in) { /* m or v of a record whose m and v are the file's zeros */
                memset(out + (a - off), 0, (b - a) * 4);
                continue;
            }
            memset(sl + tl->numel, 0, tl->numel * 8u);
            e->nvme.swap_mv[e->nvme.cached_tile_slot] = 1;
        }
        if (in) {
            memcpy(sl + (size_t)kind * tl->numel + (a - tlo), in + (a - off), (b - a) * 4);
            e->nvme.cached_tile_dirty = 1;
            if (kind != 0) e->nvme.cached_tile_mv = 1;
        } else {
            memcpy(out + (a - off), sl + (size_t)kind * tl->numel + (a - tlo), (b - a) * 4);
        }
    }
    return r;
}

/* Offloaded master (kind 0), m (1) or v (2), elements [off, off + n) of the shard: copied to
   out, or from in when in is not NULL, wherever they live: the host part [0, H) in host
   memory or through the NVMe tier's cache, the device part [H, S) (offload_optimizer_ratio
   < 1) on the device (a transfer on COMPUTE, waited for). */
static zero_result zero__eng_opt_io(zero_engine *e, int kind, size_t off, size_t n, float *out,
                                    const float *in)
{
    size_t H = e->host.opt_numel, nh = off >= H ? 0 : (off + n <= H ? n : H - off);
    zero_result r = ZERO_OK;
    if (nh > 0 && e->cfg.desc.offload_optimizer == ZERO_OFFLOAD_NVME)
        r = zero__eng_nvme_state(e, off, nh, kind, out, in);
    else if (nh > 0) {
        float *base = kind == 0 ? e->opt.master : kind == 1 ? e->opt.m : e->opt.v;
        if (in) memcpy(base + off, in, nh * 4);
        else memcpy(out, base + off, nh * 4);
    }
    if (r == ZERO_OK && n > nh) {
        float *d = (kind == 0 ? e->opt.dmaster : kind == 1 ? e->opt.dm : e->opt.dv) + (off + nh - H);
        r = in ? e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_COMPUTE, d, in + nh, (n - nh) * 4)
               : e->cfg.dev->ops->download(e->cfg.dev, ZERO_QUEUE_COMPUTE, out + nh, d, (n - nh) * 4);
        if (r == ZERO_OK) r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE);
    }
    return r;
}

/* ---- the NVMe tier of the reduced gradients (struct zero__gnv above) ---- */

/* Keeps the first I/O failure (r != OK) for the step's agreement. */
static void zero__gnv_keep(struct zero__gnv *t, zero_result r)
{
    if (r == ZERO_OK || t->err != ZERO_OK) return;
    t->err = r;
    zero__eng_copy_error(t->why, sizeof t->why);
}

/* Commit: the gradient file (one range per tile, preallocated), the staging buffers, the
   step's gradient slots and the per-tile and per-group tables. After zero__eng_nvme_alloc
   (the tiles, the I/O engine and nswap exist). */
static zero_result zero__gnv_alloc(zero_engine *e)
{
    const zero_allocator *a = &e->cfg.desc.allocator;
    struct zero__gnv *t;
    size_t maxsh = 0, nt = (size_t)(e->host.ntiles ? e->host.ntiles : 1), bb;
    uint64_t off = 0;
    int g, k;
    zero_result r;
    void *p = NULL;
    t = (struct zero__gnv *)zero__alloc(a, sizeof *t);
    if (!t) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: gradient tier");
    memset(t, 0, sizeof *t);
    e->gnv = t;
    t->io = e->nvme.io;
    t->pend_group = -1;
    t->buf_group[0] = t->buf_group[1] = t->buf_group[2] = -1;
    t->off = (uint64_t *)zero__alloc(a, nt * sizeof(uint64_t));
    t->wt = (zero_io_ticket *)zero__alloc(a, nt * sizeof(zero_io_ticket));
    t->tile0 = (int *)zero__alloc(a, (size_t)(e->layout.ngroups + 1) * sizeof(int));
    t->sumsq = (double *)zero__alloc(a, (size_t)(e->layout.ngroups ? e->layout.ngroups : 1) * sizeof(double));
    t->nonfinite = (unsigned char *)zero__alloc(a, (size_t)(e->layout.ngroups ? e->layout.ngroups : 1));
    t->slot_ticket = (zero_io_ticket *)zero__alloc(a, (size_t)e->nvme.nswap * sizeof(zero_io_ticket));
    if (!t->off || !t->wt || !t->tile0 || !t->sumsq || !t->nonfinite || !t->slot_ticket)
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_commit: gradient tier tables");
    memset(t->wt, 0, nt * sizeof(zero_io_ticket));
    memset(t->slot_ticket, 0, (size_t)e->nvme.nswap * sizeof(zero_io_ticket));
    memset(t->sumsq, 0, (size_t)(e->layout.ngroups ? e->layout.ngroups : 1) * sizeof(double));
    memset(t->nonfinite, 0, (size_t)(e->layout.ngroups ? e->layout.ngroups : 1));
    for (g = 0, k = 0; g <= e->layout.ngroups; g++) { /* tiles are in group order */
        while (k < e->host.ntiles && e->host.tiles[k].group < g) k++;
        t->tile0[g] = k;
    }
    for (g = 0; g < e->layout.ngroups; g++)
        if (e->layout.groups[g].shard_numel > maxsh) maxsh = e->layout.groups[g].shard_numel;
    for (k = 0; k < e->host.ntiles; k++) {
        t->off[k] = off;
        off += zero_io_align_up((uint64_t)e->host.tiles[k].numel * e->cfg.comm_size);
    }
    /* staging: two download buffers, and the read-back when contributions are added */
    t->nbuf = e->cfg.accum_steps > 1 || e->layout.total_parts > e->layout.ngroups ? 3 : 2;
    t->stride = (size_t)zero_io_align_up((uint64_t)(maxsh ? maxsh : 1) * e->cfg.comm_size);
    if (zero__mul_size(t->stride, (size_t)t->nbuf, &bb) || zero__add_size(bb, ZERO_IO_ALIGN, &bb))
        return zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: gradient staging size overflows");
    if ((r = zero__eng_host_alloc(e, bb, ZERO_MEM_GRAD, &p)) != ZERO_OK) return r;
    /* aligned for O_DIRECT: tile ranges at aligned offsets go to the disk without a copy */
    t->buf = (unsigned char *)p + (ZERO_IO_ALIGN - (uintptr_t)p % ZERO_IO_ALIGN) % ZERO_IO_ALIGN;
    /* the step's gradient slots, beside the optimizer's swap slots */
    t->slot_stride = (size_t)zero_io_align_up((uint64_t)e->host.tile_numel * e->cfg.comm_size);
    if ((r = zero_io_buffer_alloc(e->nvme.io, t->slot_stride * (size_t)e->nvme.nswap, &p)) != ZERO_OK) return r;
    t->slots = (unsigned char *)p;
    memset(t->slots, 0, t->slot_stride * (size_t)e->nvme.nswap);
    e->host.mem[ZERO_MEM_GRAD] += t->slot_stride * (size_t)e->nvme.nswap;
    if (e->host.mem[ZERO_MEM_GRAD] > e->host.mem_peak[ZERO_MEM_GRAD]) e->host.mem_peak[ZERO_MEM_GRAD] = e->host.mem[ZERO_MEM_GRAD];
    e->host.mem_total += t->slot_stride * (size_t)e->nvme.nswap;
    if (e->host.mem_total > e->host.mem_peak_total) e->host.mem_peak_total = e->host.mem_total;
    if (off == 0) return ZERO_OK;
    if ((r = zero_io_file_create(e->nvme.io, e->cfg.desc.nvme_path, "grad", e->cfg.rank, off, &t->file)) != ZERO_OK)
        return r;
    e->nvme.mem[ZERO_MEM_GRAD] = e->layout.shard_numel * e->cfg.comm_size;
    e->nvme.mem_total += (size_t)zero_io_file_size(t->file);
    e->nvme.mem[ZERO_MEM_SCRATCH] += (size_t)zero_io_file_size(t->file) - e->layout.shard_numel * e->cfg.comm_size; /* alignment */
    return ZERO_OK;
}

/* Destroy (and a failed commit): every transfer waited for, the file removed, the buffers
   freed (the staging with the host tier). Before the I/O engine goes. */
static void zero__gnv_free(zero_engine *e)
{
    struct zero__gnv *t = e->gnv;
    const zero_allocator *a = &e->cfg.desc.allocator;
    if (!t) return;
    if (t->io) (void)zero_io_wait_all(t->io);
    zero_io_file_destroy(t->file);
    if (t->slots) {
        zero_io_buffer_free(t->io, t->slots);
        e->host.mem[ZERO_MEM_GRAD] -= t->slot_stride * (size_t)e->nvme.nswap;
        e->host.mem_total -= t->slot_stride * (size_t)e->nvme.nswap;
    }
    zero__free(a, t->off);
    zero__free(a, t->wt);
    zero__free(a, t->tile0);
    zero__free(a, t->sumsq);
    zero__free(a, t->nonfinite);
    zero__free(a, t->slot_ticket);
    zero__free(a, t);
    e->gnv = NULL;
}

/* Waits for the transfers in flight on group g's ranges (g < 0: none). */
static void zero__gnv_wait_group(zero_engine *e, int g)
{
    struct zero__gnv *t = e->gnv;
    int k;
    if (g < 0) return;
    for (k = t->tile0[g]; k < t->tile0[g + 1]; k++) {
        zero_io_ticket w = t->wt[k];
        t->wt[k] = 0;
        if (w) zero__gnv_keep(t, zero_io_wait(t->io, w));
    }
}

/* The pending group's download has landed (after a sync of OFFLOAD): stored, or read back,
   added and stored; its flag and sum of squares taken on the way. */
static zero_result zero__gnv_settle(zero_engine *e)
{
    struct zero__gnv *t = e->gnv;
    int g = t->pend_group, k, sb = t->pend_buf;
    const zero__eng_group *eg;
    unsigned char *src;
    if (g < 0) return ZERO_OK;
    t->pend_group = -1;
    eg = &e->layout.groups[g];
    ZERO__ENG_TRY(e, e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_OFFLOAD), "gradient offload: sync");
    src = t->buf + (size_t)sb * t->stride;
    if (!t->pend_store) { /* acc = what the file holds, then acc += the new contribution */
        unsigned char *acc = t->buf + 2 * t->stride;
        zero__gnv_wait_group(e, t->buf_group[2]); /* writes that still read acc */
        t->buf_group[2] = -1;
        zero__gnv_wait_group(e, g);               /* the group's last write is on the file */
        for (k = t->tile0[g]; k < t->tile0[g + 1] && t->err == ZERO_OK; k++)
            zero__gnv_keep(t, zero_io_read(t->file, t->off[k], acc + e->host.tiles[k].begin * e->cfg.comm_size,
                                           e->host.tiles[k].numel * e->cfg.comm_size, &t->wt[k]));
        zero__gnv_wait_group(e, g);
        (void)zero__eng_host_kernel(e, zero__host_body_add, acc, src, eg->shard_numel);
        src = acc;
        sb = 2;
    }
    t->nonfinite[g] = zero__eng_host_kernel(e, zero__host_body_nonfinite, NULL, src, eg->shard_numel) > 0.0;
    t->sumsq[g] = zero__eng_host_kernel(e, zero__host_body_sumsq, NULL, src, eg->shard_numel);
    zero__gnv_wait_group(e, g); /* (nothing in flight on its ranges by now) */
    for (k = t->tile0[g]; k < t->tile0[g + 1] && t->err == ZERO_OK; k++)
        zero__gnv_keep(t, zero_io_write(t->file, t->off[k], src + e->host.tiles[k].begin * e->cfg.comm_size,
                                        e->host.tiles[k].numel * e->cfg.comm_size, &t->wt[k]));
    t->buf_group[sb] = g;
    return ZERO_OK;
}

/* zero__eng_grad_out for the NVMe tier: elements [j, j + n) of group g's reduced shard go
   into the group's staging buffer (the previous group settled first, and the buffer's last
   writes waited for); the group is pending once its last piece is queued. */
static zero_result zero__gnv_out(zero_engine *e, int g, int store, const unsigned char *dev_src,
                                 size_t j, size_t n)
{
    struct zero__gnv *t = e->gnv;
    const zero__eng_group *eg = &e->layout.groups[g];
    zero_result r;
    if (j == 0) {
        if ((r = zero__gnv_settle(e)) != ZERO_OK) return r;
        zero__gnv_wait_group(e, t->buf_group[t->cur]);
        t->buf_group[t->cur] = -1;
    }
    r = zero__eng_handoff_ev(e, ZERO_QUEUE_COMM, ZERO_QUEUE_OFFLOAD, e->sync.comm_to_offload);
    if (r == ZERO_OK)
        r = e->cfg.dev->ops->download(e->cfg.dev, ZERO_QUEUE_OFFLOAD, t->buf + (size_t)t->cur * t->stride + j * e->cfg.comm_size,
                                  dev_src, n * e->cfg.comm_size);
    if (r == ZERO_OK) r = zero__eng_handoff_ev(e, ZERO_QUEUE_OFFLOAD, ZERO_QUEUE_COMM, e->sync.offload_to_comm);
    if (r == ZERO_OK && j + n == eg->shard_numel) {
        t->pend_group = g;
        t->pend_store = store;
        t->pend_buf = t->cur;
        t->cur ^= 1;
    }
    return r;
}

/* The step: the last download settled, every write on the file, then the groups' flags and
   sums of squares in group order (what the host tier computes over its buffer). */
static zero_result zero__gnv_norm(zero_engine *e, double *sumsq, float *flag)
{
    struct zero__gnv *t = e->gnv;
    int g;
    zero_result r = zero__gnv_settle(e);
    if (r != ZERO_OK) return r;
    for (g = 0; g < e->layout.ngroups; g++) {
        zero__gnv_wait_group(e, g);
        if (t->nonfinite[g]) *flag = 1.0f;
        *sumsq += t->sumsq[g];
    }
    t->buf_group[0] = t->buf_group[1] = t->buf_group[2] = -1;
    return ZERO_OK;
}

/* offload_optimizer_ratio < 1, the step's device part (elements [H, S) of the shard, tiles
   [ntiles, ntiles + ndtiles)): the gradients leave the host tier for opt.dgrad in one upload
   (they all came to the host for the norm, which must see the shard whole, in group order),
   then the device's adam op per piece of each tile, with the piece's tensor constants and
   the device's multiplier and flag: the same element expression as the host Adam, so the
   split changes no bit. Everything on COMPUTE, after the flag and the multiplier. */
static zero_result zero__eng_step_device_part(zero_engine *e, const float *mul, const float *flag)
{
    zero_device *dev = e->cfg.dev;
    size_t H = e->host.opt_numel, S = e->layout.shard_numel;
    int k, i;
    zero_result r = dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, e->opt.dgrad,
                                     e->host.grad + H * e->cfg.comm_size, (S - H) * e->cfg.comm_size);
    for (k = e->host.ntiles; k < e->host.ntiles + e->host.ndtiles && r == ZERO_OK; k++) {
        const zero__eng_tile *tl = &e->host.tiles[k];
        size_t at = e->layout.groups[tl->group].off_shard + tl->begin - H;
        unsigned char *dst = zero__eng_tile_param_dev(e, tl);
        for (i = tl->first; i < tl->first + tl->count && r == ZERO_OK; i++) {
            const zero__eng_piece *pc = &e->host.pieces[i];
            zero_adam_range ar;
            memset(&ar, 0, sizeof ar);
            ar.numel = pc->numel;
            ar.master = e->opt.dmaster + at + pc->off;
            ar.m = e->opt.dm + at + pc->off;
            ar.v = e->opt.dv + at + pc->off;
            ar.grad = e->opt.dgrad + (at + pc->off) * e->cfg.comm_size;
            ar.grad_dtype = e->cfg.comm_dtype;
            ar.param = dst + pc->off * e->cfg.param_size;
            ar.param_dtype = e->cfg.param_dtype;
            r = dev->ops->adam(dev, ZERO_QUEUE_COMPUTE, &ar, &e->opt.coefs[pc->tensor], mul, flag);
        }
    }
    return r;
}

/* The offloaded optimizer step, after the device computed the flag and the multiplier
   (scratch + 8: flag, multiplier, norm) from the host-tier gradients. Over tiles
   k = 0..n-1, the host Adam reads the gradients where the reduction left them (host.grad),
   and the uploads of earlier tiles' params (COMPUTE) run while it works on k. Before Adam k
   writes param half k & 1, a host sync on COMPUTE waits for the last upload from that
   half, whichever earlier tile it was (tiles of offloaded shards upload nothing, so it need
   not be tile k - 2's). A skipped step moves nothing. */
static zero_result zero__dpu_publish(zero_engine *e);
static void zero__dpu_launch(zero_engine *e, float mul);

static zero_result zero__eng_step_offload(zero_engine *e, const float *dev_mul, const float *dev_flag)
{
    zero_device *dev = e->cfg.dev;
    float fm[3];
    int k;
    zero_result io_r = ZERO_OK; /* the first NVMe failure: the step goes on to agree on it */
    int up_busy[2] = {0, 0};    /* an upload from param half i may still be reading it */
    char io_err[400];
    io_err[0] = '\0';
    if (e->nvme.io) { /* the step reuses the caches' buffers: what they changed goes out first */
        io_r = zero__eng_nvme_forget(e);
        if (io_r != ZERO_OK) zero__eng_copy_error(io_err, sizeof io_err);
    }
    if (e->gnv && e->gnv->err != ZERO_OK && io_r == ZERO_OK) { /* a gradient write or read */
        io_r = e->gnv->err;
        snprintf(io_err, sizeof io_err, "gradient tier: %.380s", e->gnv->why);
    }
    if (e->gnv) e->gnv->err = ZERO_OK;
    ZERO__ENG_TRY(e, dev->ops->download(dev, ZERO_QUEUE_COMPUTE, fm, e->buf.scratch + 8, sizeof fm),
                  "step: download of the multiplier");
    ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_COMPUTE), "step: sync");
    if (e->dpu.on) { /* delayed_update: the previous step's update is published now */
        zero_result r = zero__dpu_join(e);
        if (r == ZERO_OK) r = zero__dpu_publish(e);
        if (r != ZERO_OK) return r;
    }
    if (fm[0] != 0.0f || e->host.ntiles + e->host.ndtiles == 0)
        return e->nvme.io ? zero__eng_nvme_agree(e, io_r, io_err, "zero_engine_step", -1) : ZERO_OK;
    /* the gradients are in the host tier (waited for by the norm); the uploads of earlier
       gathers that read the offloaded param shards are done before Adam rewrites them */
    ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_OFFLOAD), "step: sync of the offload queue");
    if (e->dpu.on && e->opt.step >= (int64_t)e->dpu.after) { /* delayed: published next step */
        zero__dpu_launch(e, fm[1]);
        return ZERO_OK;
    }
    /* offload_optimizer_ratio < 1: the device part first, enqueued on COMPUTE (its gradients
       up, then the device's Adam per tile piece), so that on an asynchronous device it runs
       while the host Adam below works on the host part */
    if (e->host.ndtiles > 0) {
        ZERO__ENG_TRY(e, zero__eng_step_device_part(e, dev_mul, dev_flag), "step: device part");
    }
    /* NVMe: reads run nswap - 2 tiles ahead; the slot of tile k + nswap - 2 was last written
       behind tile k - 2, so a read never waits for the write just issued */
    for (k = 0; e->nvme.opt_file && k < e->nvme.nswap - 2 && k < e->host.ntiles && io_r == ZERO_OK;
         k++)
        io_r = zero__eng_swap_in(e, k);
    for (k = 0; k < e->host.ntiles; k++) {
        unsigned char *dst = zero__eng_tile_param_dev(e, &e->host.tiles[k]);
        zero_result r;
        /* a group starts */
        if (e->nvme.param_file && !dst && io_r == ZERO_OK && e->host.tiles[k].begin == 0) {
            int x = e->host.tiles[k].group & 1;
            zero_io_ticket t = e->nvme.param_buf_ticket[x];
            e->nvme.param_buf_ticket[x] = 0;
            if (t) io_r = zero_io_wait(e->nvme.io, t); /* its buffer's last write is done */
            memset(e->nvme.param_buf + (size_t)x * e->nvme.param_buf_stride, 0,
                   e->nvme.param_buf_stride);
        }
        if (dst && up_busy[k & 1]) { /* the Adam below rewrites the half that upload reads */
            ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_COMPUTE), "step: sync");
            up_busy[0] = up_busy[1] = 0;
        }
        if (e->nvme.opt_file) {
            float *sl =
                (float *)(void *)(e->nvme.swap + (size_t)(k % e->nvme.nswap) * e->nvme.swap_stride);
            size_t n = e->host.tiles[k].numel;
            if (io_r == ZERO_OK) io_r = zero__eng_swap_wait(e, k % e->nvme.nswap);
            if (io_r == ZERO_OK && k + e->nvme.nswap - 2 < e->host.ntiles)
                io_r = zero__eng_swap_in(e, k + e->nvme.nswap - 2);
            if (io_r == ZERO_OK) {
                r = zero__eng_tile_adam(e, k, fm[1], sl, sl + n, sl + 2 * n);
                if (r != ZERO_OK) return zero__eng_break(e, r, "step: host adam");
                io_r = zero__eng_swap_out(e, k);
            }
        } else {
            const zero__eng_tile *tl = &e->host.tiles[k];
            size_t mb = e->layout.groups[tl->group].off_shard + tl->begin;
            r = zero__eng_tile_adam(e, k, fm[1], zero__opt_at(e, e->opt.master, mb),
                                    zero__opt_at(e, e->opt.m, mb), zero__opt_at(e, e->opt.v, mb));
            if (r != ZERO_OK) return zero__eng_break(e, r, "step: host adam");
        }
        if (e->nvme.param_file && !dst && io_r == ZERO_OK &&
            e->host.tiles[k].begin + e->host.tiles[k].numel ==
                e->layout.groups[e->host.tiles[k].group].shard_numel) {
            int g = e->host.tiles[k].group; /* the group's shard is complete: write it behind */
            e->nvme.group_fresh[g] = 0;
            io_r = zero_io_write(e->nvme.param_file, e->nvme.param_off[g],
                                 e->nvme.param_buf + (size_t)(g & 1) * e->nvme.param_buf_stride,
                                 e->layout.groups[g].shard_numel * e->cfg.param_size,
                                 &e->nvme.param_buf_ticket[g & 1]);
        }
        if (dst) {
            ZERO__ENG_TRY(
                e,
                dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, dst,
                                 e->host.tile_params +
                                     (size_t)(k & 1) * e->host.tile_numel * e->cfg.param_size,
                                 e->host.tiles[k].numel * e->cfg.param_size),
                "step: param tile upload");
            up_busy[k & 1] = 1;
        }
    }
    if (e->nvme.io) {
        int i;
        /* every write behind is on the file */
        for (i = 0; i < e->nvme.nswap && e->nvme.opt_file; i++)
            if (io_r == ZERO_OK) io_r = zero__eng_swap_wait(e, i);
        for (i = 0; i < 2; i++) {
            zero_io_ticket t = e->nvme.param_buf_ticket[i];
            e->nvme.param_buf_ticket[i] = 0;
            if (t && io_r == ZERO_OK) io_r = zero_io_wait(e->nvme.io, t);
        }
        if (io_r != ZERO_OK && !io_err[0]) zero__eng_copy_error(io_err, sizeof io_err);
        (void)zero_io_wait_all(e->nvme.io);
        for (i = 0; i < e->nvme.nswap && e->nvme.opt_file; i++) e->nvme.swap_ticket[i] = 0;
        for (i = 0; i < e->nvme.nswap && e->gnv; i++) e->gnv->slot_ticket[i] = 0;
        return zero__eng_nvme_agree(e, io_r, io_err, "zero_engine_step", -1);
    }
    return ZERO_OK;
}

/* ---- the delayed parameter update (delayed_update, DPU) ---- */

/* The delayed update: the host Adam over every tile (the same pieces, constants and element
   expression as the immediate step), gradients from dpu.grad, params into dpu.params. Runs
   on the background thread; touches only host-tier memory (master, m, v, dpu.*). */
static zero_result zero__dpu_adam(zero_engine *e)
{
    int k, i;
    for (k = 0; k < e->host.ntiles; k++) {
        const zero__eng_tile *tl = &e->host.tiles[k];
        size_t mb = e->layout.groups[tl->group].off_shard + tl->begin;
        for (i = tl->first; i < tl->first + tl->count; i++) {
            const zero__eng_piece *pc = &e->host.pieces[i];
            zero_adam_range ar;
            zero_result r;
            memset(&ar, 0, sizeof ar);
            ar.numel = pc->numel;
            ar.master = zero__opt_at(e, e->opt.master, mb + pc->off);
            ar.m = zero__opt_at(e, e->opt.m, mb + pc->off);
            ar.v = zero__opt_at(e, e->opt.v, mb + pc->off);
            ar.state_dtype = e->cfg.opt_dtype;
            ar.sr_key = e->dpu.sr_key;
            ar.sr_index = e->opt.model_off[pc->tensor] + (uint64_t)pc->elem;
            ar.grad = e->dpu.grad + (mb + pc->off) * e->cfg.comm_size;
            ar.grad_dtype = e->cfg.comm_dtype;
            ar.param = e->dpu.params + (mb + pc->off) * e->cfg.param_size;
            ar.param_dtype = e->cfg.param_dtype;
            r = zero_adam_host(&ar, &e->dpu.coefs[pc->tensor], e->dpu.mul, ZERO_SIMD_AUTO,
                               pc->numel >= 65536 ? e->cfg.desc.host_threads : 1);
            if (r != ZERO_OK) return r;
        }
    }
    return ZERO_OK;
}

static void *zero__dpu_thread(void *arg)
{
    zero_engine *e = (zero_engine *)arg;
    e->dpu.result = zero__dpu_adam(e);
    if (e->dpu.result != ZERO_OK) zero__eng_copy_error(e->dpu.why, sizeof e->dpu.why);
    return NULL;
}

/* Waits for the running delayed update (if any). Its failure (none is expected: the inputs
   were validated) breaks the engine. */
static zero_result zero__dpu_join(zero_engine *e)
{
    zero_result r;
    if (!e->dpu.running) return ZERO_OK;
    e->dpu.running = 0;
    if (e->dpu.threaded && pthread_join(e->dpu.thread, NULL) != 0) {
        e->dpu.result = ZERO_ERROR_INVALID_STATE;
        snprintf(e->dpu.why, sizeof e->dpu.why, "pthread_join failed");
    }
    e->dpu.threaded = 0;
    r = e->dpu.result;
    if (r == ZERO_OK) return ZERO_OK;
    e->dpu.publish = 0;
    (void)zero__fail(r, "%s", e->dpu.why);
    return zero__eng_break(e, r, "the delayed update's host Adam");
}

/* Publishes the pending params (after the join): each tile's range of dpu.params goes to
   where the immediate step would have put it (uploaded on COMPUTE, or copied into the
   offloaded shard of a stage-3 group), then COMPUTE is synced so the next delayed update
   may rewrite dpu.params. The all-gather of stages 1-2 (stage 3: persistent groups) is the
   caller's (zero__eng_gather_updated). */
static zero_result zero__dpu_publish(zero_engine *e)
{
    zero_device *dev = e->cfg.dev;
    int k;
    if (!e->dpu.publish) return ZERO_OK;
    e->dpu.publish = 0;
    /* the uploads of earlier gathers that read the offloaded param shards are done */
    ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_OFFLOAD), "delayed update: sync");
    for (k = 0; k < e->host.ntiles; k++) {
        const zero__eng_tile *tl = &e->host.tiles[k];
        const zero__eng_group *eg = &e->layout.groups[tl->group];
        unsigned char *dst = zero__eng_tile_param_dev(e, tl);
        const unsigned char *src = e->dpu.params + (eg->off_shard + tl->begin) * e->cfg.param_size;
        if (dst)
            ZERO__ENG_TRY(e, dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, dst, src,
                                              tl->numel * e->cfg.param_size),
                          "delayed update: param upload");
        else
            memcpy(e->host.params + (eg->off_param + tl->begin) * e->cfg.param_size, src,
                   tl->numel * e->cfg.param_size);
    }
    ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_COMPUTE), "delayed update: sync");
    return ZERO_OK;
}

/* Starts the delayed update of this step (its verdict taken, fm[1] the multiplier, the
   constants in opt.coefs): the gradient shard is handed to it and host.grad becomes the
   spare, so the next backward's downloads land beside it. A thread that cannot be started
   runs the update here (the same bits, no overlap). */
static void zero__dpu_launch(zero_engine *e, float mul)
{
    unsigned char *g = e->host.grad;
    memcpy(e->dpu.coefs, e->opt.coefs, (size_t)e->layout.ntensors * sizeof *e->dpu.coefs);
    e->dpu.mul = mul;
    e->dpu.sr_key = e->opt.sr_key;
    e->host.grad = e->dpu.spare;
    e->dpu.spare = g;
    e->dpu.grad = g;
    e->dpu.result = ZERO_OK;
    e->dpu.why[0] = '\0';
    e->dpu.publish = 1;
    e->dpu.running = 1;
    e->dpu.threaded = pthread_create(&e->dpu.thread, NULL, zero__dpu_thread, e) == 0;
    if (!e->dpu.threaded) (void)zero__dpu_thread(e);
}

/* set_tensor while an update is pending: the tensor's elements of this rank's shard in the
   pending params take the new values too (values + m0, mn elements at shard offset off), so
   the publish does not bring the old ones back. */
static zero_result zero__dpu_set(zero_engine *e, size_t off, const float *values, size_t n)
{
    if (!e->dpu.publish || n == 0) return ZERO_OK;
    return zero_convert(e->dpu.params + off * e->cfg.param_size, e->cfg.param_dtype, values,
                        ZERO_F32, n, ZERO_SIMD_AUTO);
}

/* The device's model states of an estimate: with the optimizer offloaded the reduced
   gradients (the estimator's shard at stages 2-3) live in the host tier; at stage 1 the
   device keeps the whole user gradient buffer, which is the estimator's figure. */
static size_t zero__eng_hint_states(const zero_estimate *x, int opt_offloaded)
{
    uint64_t b = x->device_bytes;
    if (opt_offloaded && x->stage >= 2) b -= x->grads_bytes;
    return (size_t)b;
}

/* When no offload setting fits (both offloads on already, or none enough): names the bulk
   (the largest device buffer) and what would fit, each figure exact from this
   configuration's sizes: an arena of twice the largest group (its params and its gradient
   buffer at once, no prefetch), smaller groups (the arena and the cast staging scale with
   the largest group), more ranks (the sharded model states shrink as 1/N). Appended to
   out. */
static void zero__eng_oom_bulk(const zero_engine *e, const zero__eng_sizes *sz, size_t need,
                               size_t avail, char *out, size_t n)
{
    static const char *const names[ZERO__B_N] = {
        "scratch", "params", "user gradients", "gradient accumulator", "master weights", "Adam m",
        "Adam v", "reduce bucket", "arena", "quantized blocks", "hpZ secondary params"};
    size_t bulk = 0, len = strlen(out), per = 0, mdep, sharded = 0, fixed, two;
    int i, ib = 0, any = 0;
    for (i = 0; i < sz->n && i < ZERO__B_N; i++)
        if (sz->bytes[i] > bulk) bulk = sz->bytes[i], ib = i;
    len += (size_t)snprintf(out + len, len < n ? n - len : 0, ": the bulk is the %s (%zu bytes)",
                            names[ib], bulk);
    mdep = sz->bytes[ZERO__B_ARENA] + sz->bytes[ZERO__B_BUCKET];
    if (e->cfg.stage >= 2 && e->pool.numel > 2 * e->layout.max_group_numel && len < n) {
        two = need - sz->bytes[ZERO__B_ARENA] + 2 * e->layout.max_group_numel * e->cfg.param_size;
        len += (size_t)snprintf(
            out + len, n - len, "; max_live_numel=%zu with prefetch_depth=-1 %s (%zu bytes)",
            2 * e->layout.max_group_numel, two <= avail ? "would fit" : "needs", two);
        any |= two <= avail;
    }
    /* smaller groups: per element of the largest group, an arena of two groups and the staging */
    if (e->cfg.stage >= 2) per += 2 * e->cfg.param_size;
    if (sz->bytes[ZERO__B_BUCKET]) per += e->cfg.comm_size;
    fixed = need - mdep;
    if (per > 0 && avail > fixed && len < n) {
        size_t m = (avail - fixed) / per;
        if (m < e->layout.max_group_numel)
            len += (size_t)snprintf(out + len, n - len,
                                    "; groups of at most %zu elements "
                                    "(the largest has %zu) with max_live_numel=%zu would fit",
                                    m, e->layout.max_group_numel, 2 * m);
        any = 1;
    }
    /* more ranks: the sharded states shrink as 1/N, the rest stays */
    if (e->cfg.stage >= 1)
        sharded += sz->bytes[ZERO__B_MASTER] + sz->bytes[ZERO__B_M1] + sz->bytes[ZERO__B_M2];
    if (e->cfg.stage >= 2) sharded += sz->bytes[ZERO__B_GRAD_ACC];
    /* the partitioned groups' shards; persistent ones stay whole */
    if (e->cfg.stage == 3 && !e->cfg.params_offloaded)
        for (i = 0; i < e->layout.ngroups; i++)
            if (!e->layout.groups[i].persistent)
                sharded += e->layout.groups[i].shard_numel * e->cfg.param_size;
    if (sharded > 0 && need - sharded < avail && len < n) {
        double r = (double)sharded * (double)e->cfg.world / (double)(avail - (need - sharded));
        long nr = (long)r + 1;
        if (nr > e->cfg.world)
            len += (size_t)snprintf(out + len, n - len, "; %ld ranks would fit", nr);
        any = 1;
    }
    if (!any && len < n) (void)snprintf(out + len, n - len, "; the buffers alone exceed the budget");
}

/* Replaces an out-of-memory commit message by one that names the bytes, the device budget
   and the offload setting that would fit: each candidate's device bytes are the estimator's
   model states (zero_estimate_compute, paper mode, this engine's dtypes) plus this
   configuration's buffers (what it needs beyond its own estimate). */
static void zero__eng_oom_hint(zero_engine *e, const zero__eng_sizes *sz, char *msg, size_t n)
{
    static const struct { int stage3, opt, par; const char *name; } cand[] = {
        {0, 1, 0, "offload_optimizer=cpu"},
        {1, 1, 1, "stage 3 with offload_optimizer=cpu offload_param=cpu"},
    };
    zero_estimate_desc ed;
    zero_estimate now, alt;
    size_t need = 0, cap = 0, used = 0, avail, buffers, failed = 0, now_dev;
    int i, k, nth = 0;
    char fits[320];
    const char *fail_cat = "?";
    memset(&now, 0, sizeof now);
    memset(&alt, 0, sizeof alt);
    for (i = 0; i < sz->n; i++) (void)zero__add_size(need, sz->bytes[i], &need);
    for (i = 1, k = 1; i < sz->n; i++) /* the failed one: the first not allocated */
        if (sz->bytes[i]) {
            if (k++ == e->buf.nallocs) {
                failed = sz->bytes[i];
                fail_cat = zero_mem_category_name(sz->cat[i]);
                break;
            }
        }
    if (strncmp(msg, "zero_engine_commit: reserve(", 28) == 0) { /* one arena for everything */
        failed = need;
        fail_cat = "all buffers (the device's reserve)";
    }
    if (!e->cfg.dev->ops->memory_info ||
        e->cfg.dev->ops->memory_info(e->cfg.dev, &cap, &used) != ZERO_OK || cap == (size_t)-1)
        return;
    avail = cap - (used - (e->buf.mem_total <= used ? e->buf.mem_total : used));
    memset(&ed, 0, sizeof ed);
    ed.params = e->layout.total_numel;
    ed.frozen = e->layout.total_numel - e->layout.gtotal_numel;
    ed.ranks = e->cfg.world;
    ed.stage = e->cfg.stage;
    ed.param_bytes = (int)e->cfg.param_size;
    ed.grad_bytes = (int)(e->cfg.stage >= 2 ? e->cfg.comm_size : e->cfg.param_size);
    ed.offload_optimizer = e->cfg.desc.offload_optimizer;
    ed.offload_param = e->cfg.desc.offload_param;
    ed.offload_optimizer_ratio = e->cfg.opt_offloaded ? e->cfg.desc.offload_optimizer_ratio : 0.0;
    if (zero_estimate_compute(&ed, &now) != ZERO_OK) return;
    ed.offload_optimizer_ratio = 0.0; /* the candidates offload all of it */
    now_dev = zero__eng_hint_states(&now, e->cfg.opt_offloaded);
    buffers = need > now_dev ? need - now_dev : 0;
    if (!e->cfg.opt_offloaded) { /* offloaded gradients reduce in place, into the host tier */
        size_t stay = e->cfg.stage <= 1 ? sz->bytes[ZERO__B_GRAD_ACC] : 0;
        buffers = buffers > stay ? buffers - stay : 0;
    } else { /* a partial offload's device gradients: gone with the whole state offloaded */
        buffers = buffers > sz->bytes[ZERO__B_GRAD_ACC] ? buffers - sz->bytes[ZERO__B_GRAD_ACC] : 0;
    }
    snprintf(fits, sizeof fits, "no offload setting fits");
    if (e->cfg.opt_offloaded && e->cfg.desc.offload_optimizer_ratio < 1.0) {
        /* partial offload: its device part (master, m, v and gradients of S - H elements) is
           exactly what offload_optimizer_ratio = 1 would leave off the device */
        size_t part = sz->bytes[ZERO__B_MASTER] + sz->bytes[ZERO__B_M1] + sz->bytes[ZERO__B_M2] +
                      sz->bytes[ZERO__B_GRAD_ACC];
        if (need - part <= avail) {
            snprintf(fits, sizeof fits, "offload_optimizer_ratio=1 would fit (%zu device bytes)",
                     need - part);
            nth = -1; /* found: no candidate below */
        }
    }
    for (i = 0; nth >= 0 && i < (int)(sizeof cand / sizeof cand[0]); i++) {
        size_t dev_bytes;
        if (cand[i].opt && e->cfg.opt_offloaded && !cand[i].par) continue;
        if (cand[i].par && e->cfg.params_offloaded) continue;
        ed.stage = cand[i].stage3 ? 3 : e->cfg.stage;
        if (ed.stage == 0) ed.stage = 1;
        ed.grad_bytes = (int)(ed.stage >= 2 ? e->cfg.comm_size : e->cfg.param_size);
        ed.offload_optimizer = ZERO_OFFLOAD_CPU;
        ed.offload_param = cand[i].par ? ZERO_OFFLOAD_CPU : ZERO_OFFLOAD_NONE;
        if (zero_estimate_compute(&ed, &alt) != ZERO_OK) continue;
        dev_bytes = zero__eng_hint_states(&alt, 1) + buffers;
        if (dev_bytes <= avail) {
            snprintf(fits, sizeof fits, "%s would fit (%zu device bytes)",
                     e->cfg.stage == 3 && cand[i].stage3 ? cand[i].name + 13 : cand[i].name,
                     dev_bytes);
            break;
        }
        if (nth++ == 0)
            snprintf(fits, sizeof fits, "no offload setting fits (%s needs %zu device bytes)",
                     cand[i].name, dev_bytes);
    }
    if (strncmp(fits, "no offload", 10) == 0) zero__eng_oom_bulk(e, sz, need, avail, fits, sizeof fits);
    snprintf(msg, n,
             "zero_engine_commit: out of device memory: %zu bytes of %s asked; this configuration "
             "needs %zu device bytes per rank, the device budget is %zu bytes (%zu free); %s",
             failed, fail_cat, need, cap, avail, fits);
}

/* A control all-reduce of n (<= 8) doubles through the engine's scratch (the commit's
   mismatch search, the checkpoint's agreement). */
static zero_result zero__eng_ctl_allreduce(zero_engine *e, double *v, int n, zero_op op,
                                           zero_comm_role role, const char *what)
{
    zero_device *dev = e->cfg.dev;
    char w[96];
    snprintf(w, sizeof w, "%s: control all_reduce", what);
    ZERO__ENG_TRY(e, dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, e->buf.scratch, v, (size_t)n * 8u),
                  w);
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM), w);
    ZERO__ENG_TRY(e,
                  zero__eng_all_reduce(e, e->buf.scratch, e->buf.scratch, (size_t)n, ZERO_F64, op,
                                       1, -1, role),
                  w);
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE), w);
    ZERO__ENG_TRY(e, dev->ops->download(dev, ZERO_QUEUE_COMPUTE, v, e->buf.scratch, (size_t)n * 8u),
                  w);
    ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_COMPUTE), w);
    return ZERO_OK;
}

/* The commit check's items, in order: the settings zero__eng_hash covers, each registered
   tensor (name, size, group, flags, shape), then the tensor count. Item i's digest, its
   value as a number (for the range across ranks) and a description for the message. */
enum { ZERO__ENG_NSETTINGS = 36 };
static uint64_t zero__eng_item(const zero_engine *e, int i, double *value, char *what, size_t n)
{
    const zero_engine_desc *d = &e->cfg.desc;
    if (i < ZERO__ENG_NSETTINGS) {
        static const char *const names[ZERO__ENG_NSETTINGS] = {
            "stage", "param_dtype", "grad_comm_dtype", "accum_steps", "reduce_bucket_numel",
            "max_live_numel", "prefetch_depth", "persist_numel", "clip_norm", "adam.mode",
            "adam.lr", "adam.beta1", "adam.beta2", "adam.eps", "adam.weight_decay",
            "scaler.scale", "scaler.dynamic", "scaler.factor", "scaler.min_scale",
            "scaler.window", "scaler.hysteresis", "scaler.error_at_min", "align_numel",
            "offload_optimizer", "offload_param", "offload_optimizer_ratio", "optimizer_dtype",
            "optimizer_seed", "ranks_per_node", "mics_shard_size", "hpz_partition_size",
            "delayed_update_after" /* -1 = delayed_update off */,
            "quantized_gradient_levels" /* 0 = qgZ off */, "quantized_weights",
            "quantized_gradient_bits" /* 0 = qgZ off */,
            "quant_block_numel" /* 0 = neither qwZ nor qgZ */};
        double v[ZERO__ENG_NSETTINGS];
        v[0] = d->stage; v[1] = d->param_dtype; v[2] = d->grad_comm_dtype;
        v[3] = d->accum_steps; v[4] = (double)d->reduce_bucket_numel;
        v[5] = (double)d->max_live_numel; v[6] = d->prefetch_depth;
        v[7] = (double)d->persist_numel; v[8] = d->clip_norm; v[9] = e->opt.adam.mode;
        v[10] = e->opt.adam.lr;
        v[11] = e->opt.adam.beta1;
        v[12] = e->opt.adam.beta2;
        v[13] = e->opt.adam.eps;
        v[14] = e->opt.adam.weight_decay;
        v[15] = e->opt.scaler.scale;
        v[16] = e->opt.scaler.dynamic;
        v[17] = e->opt.scaler.factor; v[18] = e->opt.scaler.min_scale; v[19] = e->opt.scaler.window;
        v[20] = e->opt.scaler.hysteresis; v[21] = e->opt.scaler.error_at_min;
        v[22] = (double)d->align_numel; v[23] = d->offload_optimizer; v[24] = d->offload_param;
        v[25] = d->offload_optimizer_ratio;
        v[26] = d->optimizer_dtype; v[27] = (double)d->optimizer_seed;
        v[28] = d->ranks_per_node;
        v[29] = d->mics_shard_size;
        v[30] = d->hpz_partition_size;
        v[31] = d->delayed_update ? d->delayed_update_after : -1;
        v[32] = d->quantized_gradient_levels;
        v[33] = e->quant.weights;
        v[34] = e->quant.grad_bits;
        v[35] = e->quant.weights || e->quant.grad_bits ? (double)e->quant.block : 0.0;
        *value = v[i];
        snprintf(what, n, "setting %s = %.17g", names[i], v[i]);
        if (i == 27) return zero__eng_mix((uint64_t)i, d->optimizer_seed); /* every bit */
        return zero__eng_mix((uint64_t)i, zero__eng_dbits(v[i]));
    }
    i -= ZERO__ENG_NSETTINGS;
    if (i < e->layout.ntensors) {
        zero_tensor_info ti;
        uint64_t h = zero__eng_mix(0x7465ull, (uint64_t)i);
        int k, nd = i < e->layout.cap_shapes ? e->layout.shapes[i].ndim : 0;
        size_t len, at;
        memset(&ti, 0, sizeof ti);
        zero_plan_tensor(e->layout.plan, i, &ti);
        len = ti.name ? strlen(ti.name) : 0;
        h = zero__fnv1a(h, ti.name ? ti.name : "", len);
        h = zero__eng_mix(h, (uint64_t)ti.numel);
        h = zero__eng_mix(h, (uint64_t)ti.group);
        h = zero__eng_mix(h, (uint64_t)e->layout.tensor_flags[i]);
        h = zero__eng_mix(h, (uint64_t)nd);
        at = (size_t)snprintf(what, n, "tensor %d '%.64s' (numel %zu, group %d, flags %u%s", i,
                              ti.name ? ti.name : "", ti.numel, ti.group, e->layout.tensor_flags[i],
                              nd ? ", shape [" : "");
        for (k = 0; k < nd; k++) {
            h = zero__eng_mix(h, e->layout.shapes[i].dims[k]);
            if (at < n)
                at += (size_t)snprintf(what + at, n - at, "%s%llu", k ? ", " : "",
                                       (unsigned long long)e->layout.shapes[i].dims[k]);
        }
        if (at < n) snprintf(what + at, n - at, "%s)", nd ? "]" : "");
        *value = (double)ti.numel;
        return h;
    }
    *value = -1.0; /* past this rank's tensors */
    snprintf(what, n, "no tensor %d (it registered %d tensors)", i, e->layout.ntensors);
    return zero__eng_mix(0x6e74ull, (uint64_t)i);
}

/* After the commit's hash check failed on every rank (and no rank's plan failed): finds the
   first item (setting or tensor) whose digest differs between ranks by a binary search over
   prefix digests (log2 of the item count control all-reduces of 4 doubles), then the range
   of its value across ranks, and writes the mismatch message naming it and this rank's
   value into msg. Collective; returns a comm failure, else OK. */
static zero_result zero__eng_find_mismatch(zero_engine *e, char *msg, size_t n)
{
    double v[4], val;
    char what[200];
    int lo = 0, hi, i;
    zero_result r;
    v[0] = ZERO__ENG_NSETTINGS + e->layout.ntensors + 1; /* the items of the longest rank */
    if ((r = zero__eng_ctl_allreduce(e, v, 1, ZERO_OP_MAX, ZERO_ROLE_COMMIT, "zero_engine_commit")) != ZERO_OK)
        return r;
    hi = (int)v[0];
    /* invariant: the digests of items [0, lo) agree on every rank, those of [0, hi) do not */
    for (i = 0; hi - lo > 1 || i == 0; i++) {
        int mid = i == 0 ? hi : lo + (hi - lo) / 2, k, same;
        uint64_t h = 0xcbf29ce484222325ull;
        for (k = 0; k < mid; k++) h = zero__eng_mix(h, zero__eng_item(e, k, &val, what, 0));
        v[0] = (double)(h >> 32);
        v[1] = (double)(h & 0xffffffffu);
        v[2] = -v[0];
        v[3] = -v[1];
        if ((r = zero__eng_ctl_allreduce(e, v, 4, ZERO_OP_MAX, ZERO_ROLE_COMMIT, "zero_engine_commit")) != ZERO_OK)
            return r;
        same = v[0] == -v[2] && v[1] == -v[3];
        if (i == 0 && same) { /* outside the items (the plan's layout): nothing to name */
            snprintf(msg, n, "zero_engine_commit: ranks registered different tensors or settings");
            return ZERO_OK;
        }
        if (i > 0 && same) lo = mid;
        else hi = mid;
    }
    (void)zero__eng_item(e, lo, &val, what, sizeof what);
    if (lo >= ZERO__ENG_NSETTINGS) { /* a tensor: each rank names its own */
        snprintf(msg, n, "zero_engine_commit: ranks registered different tensors: the first "
                 "difference is at tensor %d (registration order): rank %d has %s; every rank "
                 "must add the same tensors in the same order", lo - ZERO__ENG_NSETTINGS,
                 e->cfg.rank, what);
        return ZERO_OK;
    }
    v[0] = val;
    v[1] = -val;
    if ((r = zero__eng_ctl_allreduce(e, v, 2, ZERO_OP_MAX, ZERO_ROLE_COMMIT, "zero_engine_commit")) != ZERO_OK)
        return r;
    snprintf(msg, n, "zero_engine_commit: ranks gave different settings: the first difference "
             "is the %s on rank %d; across ranks it ranges over [%.17g, %.17g]; every rank "
             "must use the same descriptor", what, e->cfg.rank, -v[1], v[0]);
    return ZERO_OK;
}

/* Peers of this rank (rank_all) on its node among the count ranks first + i stride. */
static int zero__eng_same_node(const zero_engine *e, int first, int stride, int count)
{
    int i, n = 0, node = e->topo.rank_all / e->topo.rpn;
    for (i = 0; i < count; i++) {
        int q = first + i * stride;
        if (q != e->topo.rank_all && q / e->topo.rpn == node) n++;
    }
    return n;
}

/* MiCS (commit, after the agreement, so every rank asks for the same groups): the shard
   group (color rank / S, ranked by rank) and the replica group (color rank % S, ranked by
   the group index, so its sum runs over the groups in order). Collective over cfg.comm. */
static zero_result zero__eng_topo_split(zero_engine *e)
{
    int S = e->topo.mics, N = e->topo.world_all, rank = e->topo.rank_all;
    zero_result r;
    zero__eng_tag(e, -1, ZERO_ROLE_COMMIT);
    r = zero_comm_split(e->cfg.comm, rank / S, rank, &e->topo.shard);
    zero__eng_untag(e);
    if (r != ZERO_OK) return zero__fail(r, "zero_engine_commit: the MiCS shard group: %.360s",
                                        zero_last_error());
    zero__eng_tag(e, -1, ZERO_ROLE_COMMIT);
    r = zero_comm_split(e->cfg.comm, rank % S, rank / S, &e->topo.replica);
    zero__eng_untag(e);
    if (r != ZERO_OK) return zero__fail(r, "zero_engine_commit: the MiCS replica group: %.360s",
                                        zero_last_error());
    if (e->topo.shard->world != S || e->topo.shard->rank != e->cfg.rank ||
        e->topo.replica->world != N / S || e->topo.replica->rank != rank / S)
        return zero__fail(ZERO_ERROR_COMM, "zero_engine_commit: the comm's split gave rank %d of "
                          "%d and %d of %d (want %d of %d, %d of %d)", e->topo.shard->rank,
                          e->topo.shard->world, e->topo.replica->rank, e->topo.replica->world,
                          e->cfg.rank, S, rank / S, N / S);
    e->topo.shard_same = zero__eng_same_node(e, rank / S * S, 1, S);
    e->topo.replica_same = zero__eng_same_node(e, rank % S, S, N / S);
    return ZERO_OK;
}

/* hpZ (commit, after the agreement): the secondary partition group, color rank / S ranked by
   rank, so its rank is rank % S (the slice of each gathered group this rank keeps). */
static zero_result zero__eng_hpz_split(zero_engine *e)
{
    int S = e->topo.hpz, rank = e->topo.rank_all;
    zero_result r;
    zero__eng_tag(e, -1, ZERO_ROLE_COMMIT);
    r = zero_comm_split(e->cfg.comm, rank / S, rank, &e->topo.hpz_comm);
    zero__eng_untag(e);
    if (r != ZERO_OK)
        return zero__fail(r, "zero_engine_commit: the hpZ group: %.380s", zero_last_error());
    if (e->topo.hpz_comm->world != S || e->topo.hpz_comm->rank != rank % S)
        return zero__fail(ZERO_ERROR_COMM, "zero_engine_commit: the comm's split gave rank %d of "
                          "%d for the hpZ group (want %d of %d)", e->topo.hpz_comm->rank,
                          e->topo.hpz_comm->world, rank % S, S);
    e->topo.hpz_same = zero__eng_same_node(e, rank / S * S, 1, S);
    return ZERO_OK;
}

/* Hierarchical qgZ (commit, after the agreement): the node (color rank / R, ranked by rank:
   its rank is the local index) and the cross-node group (color rank % R, ranked by node). */
static zero_result zero__eng_qgz_split(zero_engine *e)
{
    int R = e->topo.rpn, N = e->topo.world_all, rank = e->topo.rank_all;
    zero_result r;
    zero__eng_tag(e, -1, ZERO_ROLE_COMMIT);
    r = zero_comm_split(e->cfg.comm, rank / R, rank, &e->topo.qgz_node);
    zero__eng_untag(e);
    if (r == ZERO_OK) {
        zero__eng_tag(e, -1, ZERO_ROLE_COMMIT);
        r = zero_comm_split(e->cfg.comm, rank % R, rank / R, &e->topo.qgz_cross);
        zero__eng_untag(e);
    }
    if (r != ZERO_OK)
        return zero__fail(r, "zero_engine_commit: the hierarchical qgZ groups: %.360s",
                          zero_last_error());
    if (e->topo.qgz_node->world != R || e->topo.qgz_node->rank != rank % R ||
        e->topo.qgz_cross->world != N / R || e->topo.qgz_cross->rank != rank / R)
        return zero__fail(ZERO_ERROR_COMM, "zero_engine_commit: the comm's split gave rank %d of "
                          "%d and %d of %d for qgZ's groups (want %d of %d, %d of %d)",
                          e->topo.qgz_node->rank, e->topo.qgz_node->world,
                          e->topo.qgz_cross->rank, e->topo.qgz_cross->world, rank % R, R,
                          rank / R, N / R);
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_commit(zero_engine *e)
{
    zero__eng_sizes sz;
    zero_result r, plan_r, alloc_r = ZERO_OK;
    void *ptrs[ZERO__B_N];
    size_t total = 0;
    int i, nalloc = 0;
    char plan_err[400], alloc_err[480];
    uint64_t h;
    double hv[5];
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_commit: engine is NULL");
    if (e->lifecycle == ZERO__ENG_BROKEN)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine_commit: a commit cannot be "
                          "retried (destroy the engine and create a new one): %s",
                          e->broken_why[0] ? e->broken_why : "an earlier failure");
    if (e->lifecycle != ZERO__ENG_CREATED)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine_commit: already committed (once, "
                          "after the last add_tensor)");
    /* From here on a failure leaves the engine broken (destroy only). */
    e->lifecycle = ZERO__ENG_COMMITTED;
    e->debug.guards =
        e->cfg.desc.debug_guards > 0 || (e->cfg.desc.debug_guards == 0 && ZERO__DEBUG_DEFAULT);
    memset(ptrs, 0, sizeof ptrs);
    plan_err[0] = alloc_err[0] = '\0';
    plan_r = e->layout.ntensors == 0
                 ? zero__fail(ZERO_ERROR_INVALID_STATE, "zero_engine_commit: no tensor registered")
                 : zero_plan_commit(e->layout.plan, e->cfg.world, e->cfg.desc.align_numel,
                                    e->cfg.stage == 3 ? e->cfg.desc.persist_numel : 0);
    if (plan_r == ZERO_OK) plan_r = zero__eng_layout(e, &sz);
    if (plan_r == ZERO_OK)
        for (i = 0; i < sz.n; i++)
            if (sz.bytes[i]) {
                if (zero__add_size(total, sz.bytes[i], &total)) {
                    plan_r = zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_commit: total size");
                    break;
                }
                nalloc++;
            }
    if (plan_r != ZERO_OK) {
        zero__eng_copy_error(plan_err, sizeof plan_err);
        memset(&sz, 0, sizeof sz);
        sz.n = 1;
        sz.cat[0] = ZERO_MEM_SCRATCH;
        sz.bytes[0] = ZERO__ENG_SCRATCH_BYTES;
        total = ZERO__ENG_SCRATCH_BYTES;
        nalloc = 1;
    }
    /* Every rank allocates first and then joins the check, also one whose plan or whose
       allocations failed: it reports the failure through the check, so every rank fails
       together and none waits in a collective for a rank that already returned. Only a rank
       that cannot get even the 64-byte scratch (which the check runs on) returns at once;
       its peers then wait until the comm fails (timeout, abort, or its comm destroyed). */
    if (e->cfg.dev->ops->reserve) {
        r = e->cfg.dev->ops->reserve(e->cfg.dev, total, (size_t)nalloc);
        if (r != ZERO_OK) {
            char prev[360];
            zero__eng_copy_error(prev, sizeof prev);
            alloc_r = r;
            snprintf(alloc_err, sizeof alloc_err, "zero_engine_commit: reserve(%zu bytes): %s",
                     total, prev);
        }
    }
    r = zero__eng_alloc(e, sz.bytes[0], ZERO_MEM_SCRATCH, &ptrs[0]);
    if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_commit: scratch allocation");
    e->buf.scratch = (unsigned char *)ptrs[0];
    for (i = 1; i < sz.n && alloc_r == ZERO_OK; i++) {
        r = zero__eng_alloc(e, sz.bytes[i], sz.cat[i], &ptrs[i]);
        if (r != ZERO_OK) {
            char prev[300];
            zero__eng_copy_error(prev, sizeof prev);
            alloc_r = r;
            snprintf(alloc_err, sizeof alloc_err,
                     "zero_engine_commit: allocating %zu bytes of %s: %s", sz.bytes[i],
                     zero_mem_category_name(sz.cat[i]), prev);
        }
    }
    if (alloc_r == ZERO_ERROR_OUT_OF_MEMORY && plan_r == ZERO_OK)
        zero__eng_oom_hint(e, &sz, alloc_err, sizeof alloc_err);
    if (alloc_r == ZERO_OK && plan_r == ZERO_OK) {
        r = zero__eng_offload_alloc(e); /* the host tier */
        if (r != ZERO_OK) {
            char prev[340];
            zero__eng_copy_error(prev, sizeof prev);
            alloc_r = r;
            snprintf(alloc_err, sizeof alloc_err, "zero_engine_commit: offload tiers: %s", prev);
        }
    }
    if (alloc_r == ZERO_OK && plan_r == ZERO_OK && (r = zero__act_alloc(e)) != ZERO_OK) {
        char prev[340];
        zero__eng_copy_error(prev, sizeof prev);
        alloc_r = r;
        snprintf(alloc_err, sizeof alloc_err, "zero_engine_commit: activation tier: %s", prev);
    }
    if (e->cfg.dev->ops->event_create && !e->sync.compute_to_comm) {
        r = e->cfg.dev->ops->event_create(e->cfg.dev, &e->sync.compute_to_comm);
        if (r == ZERO_OK) r = e->cfg.dev->ops->event_create(e->cfg.dev, &e->sync.comm_to_compute);
        if (r != ZERO_OK) /* the hand-offs below need them */
            return zero__eng_break(e, r, "zero_engine_commit: event");
    }
    if (plan_r == ZERO_OK && alloc_r == ZERO_OK) {
        r = zero__eng_make_events(e);
        if (r != ZERO_OK) {
            char prev[360];
            zero__eng_copy_error(prev, sizeof prev);
            alloc_r = r;
            snprintf(alloc_err, sizeof alloc_err, "zero_engine_commit: events: %s", prev);
        }
    }
    h = plan_r == ZERO_OK ? zero__eng_hash(e) : 0;
    hv[0] = plan_r == ZERO_OK ? (double)(h >> 32) : -1.0;
    hv[1] = plan_r == ZERO_OK ? (double)(h & 0xffffffffu) : -1.0;
    hv[2] = -hv[0];
    hv[3] = -hv[1];
    hv[4] = alloc_r != ZERO_OK ? -(double)alloc_r : 0.0; /* MAX: some failing rank's code */
    ZERO__ENG_TRY(
        e,
        e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_COMPUTE, e->buf.scratch + 24, hv, sizeof hv),
        "zero_engine_commit: upload");
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM),
                  "zero_engine_commit: event");
    ZERO__ENG_TRY(e, zero__eng_all_reduce(e, e->buf.scratch + 24, e->buf.scratch + 24, 5, ZERO_F64,
                                          ZERO_OP_MAX, 1, -1, ZERO_ROLE_COMMIT),
                  "zero_engine_commit: plan hash all-reduce");
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE),
                  "zero_engine_commit: event");
    ZERO__ENG_TRY(e,
                  e->cfg.dev->ops->download(e->cfg.dev, ZERO_QUEUE_COMPUTE, hv, e->buf.scratch + 24,
                                            sizeof hv),
                  "zero_engine_commit: download");
    ZERO__ENG_TRY(e, e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE),
                  "zero_engine_commit: sync");
    if (plan_r != ZERO_OK) return zero__eng_commit_failed(e, plan_r, plan_err);
    if (hv[0] != -hv[2] || hv[1] != -hv[3]) {
        char mm[600];
        snprintf(mm, sizeof mm,
                 "zero_engine_commit: ranks registered different tensors or settings "
                 "(rank %d plan hash %016llx; a rank's plan failed)",
                 e->cfg.rank, (unsigned long long)h);
        if (hv[2] <= 0.0) { /* every plan committed: name the first difference (collective) */
            r = zero__eng_find_mismatch(e, mm, sizeof mm);
            if (r != ZERO_OK) return r;
        }
        return zero__eng_commit_failed(e, ZERO_ERROR_MISMATCH, mm);
    }
    if (alloc_r != ZERO_OK) return zero__eng_commit_failed(e, alloc_r, alloc_err);
    if (hv[4] != 0.0) {
        zero_result peer = (zero_result)(int)(-hv[4]);
        char pm[200];
        snprintf(pm, sizeof pm, "zero_engine_commit: another rank failed to allocate its "
                                "buffers (%s); every rank's commit fails",
                 zero_result_string(peer));
        return zero__eng_commit_failed(e, peer, pm);
    }
    if (e->topo.hpz && (r = zero__eng_hpz_split(e)) != ZERO_OK) {
        char sm[420];
        zero__eng_copy_error(sm, sizeof sm);
        return zero__eng_commit_failed(e, r, sm);
    }
    if (e->topo.mics && (r = zero__eng_topo_split(e)) != ZERO_OK) {
        char sm[420];
        zero__eng_copy_error(sm, sizeof sm);
        return zero__eng_commit_failed(e, r, sm);
    }
    if (e->quant.levels == 2 && (r = zero__eng_qgz_split(e)) != ZERO_OK) {
        char sm[420];
        zero__eng_copy_error(sm, sizeof sm);
        return zero__eng_commit_failed(e, r, sm);
    }
    e->buf.param = (unsigned char *)ptrs[ZERO__B_PARAM];
    e->buf.grad_user = (unsigned char *)ptrs[ZERO__B_GRAD_USER];
    e->buf.grad_acc = e->layout.acc_is_user_grad ? e->buf.grad_user
                      : e->cfg.opt_offloaded    ? NULL
                                                : (unsigned char *)ptrs[ZERO__B_GRAD_ACC];
    if (!e->cfg.opt_offloaded) { /* offloaded: host-tier pointers, set by zero__eng_offload_alloc */
        e->opt.master = (float *)ptrs[ZERO__B_MASTER];
        e->opt.m = (float *)ptrs[ZERO__B_M1];
        e->opt.v = (float *)ptrs[ZERO__B_M2];
    } else { /* offload_optimizer_ratio < 1: the device part (NULL at ratio 1) */
        e->opt.dmaster = (float *)ptrs[ZERO__B_MASTER];
        e->opt.dm = (float *)ptrs[ZERO__B_M1];
        e->opt.dv = (float *)ptrs[ZERO__B_M2];
        e->opt.dgrad = (unsigned char *)ptrs[ZERO__B_GRAD_ACC];
    }
    e->buf.bucket = (unsigned char *)ptrs[ZERO__B_BUCKET];
    e->buf.arena = (unsigned char *)ptrs[ZERO__B_ARENA];
    e->quant.buf = (unsigned char *)ptrs[ZERO__B_QUANT];
    e->topo.hpz_buf = (unsigned char *)ptrs[ZERO__B_HPZ];
    for (i = 0; i < e->buf.nallocs; i++)
        ZERO__ENG_TRY(e,
                      e->cfg.dev->ops->fill_zero(e->cfg.dev, ZERO_QUEUE_COMPUTE,
                                                 e->buf.allocs[i].ptr, e->buf.allocs[i].bytes),
                      "zero_engine_commit: fill");
    ZERO__ENG_TRY(e, e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE),
                  "zero_engine_commit: sync");
    e->prefetch.stats.limit_numel = e->pool.numel;
    /* The hash check counts in the total only. */
    memset(&e->traffic.cur, 0, sizeof e->traffic.cur);
    return ZERO_OK;
}

/* ---- pointers into the buffers ------------------------------------------------------------ */

/* Group g's params as the user sees them (whole group) when they are resident. */
static unsigned char *zero__eng_param_whole(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->layout.groups[g];
    if (e->cfg.stage < 3) return e->buf.param + eg->off_whole * e->cfg.param_size;
    if (eg->persistent) return e->buf.param + eg->off_param * e->cfg.param_size;
    if (eg->poff == ZERO__ENG_NONE) return NULL;
    return e->buf.arena + eg->poff * e->cfg.param_size;
}

/* Where this rank's updated param shard of group g is written by the step. */
static unsigned char *zero__eng_param_shard(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->layout.groups[g];
    size_t sh = (size_t)e->cfg.rank * eg->shard_numel;
    if (e->cfg.stage < 3) return e->buf.param + (eg->off_whole + sh) * e->cfg.param_size;
    if (eg->persistent) return e->buf.param + (eg->off_param + sh) * e->cfg.param_size;
    return e->buf.param + eg->off_param * e->cfg.param_size;
}

/* The user gradient buffer of group g in this micro-step. */
static unsigned char *zero__eng_grad_user(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->layout.groups[g];
    if (e->cfg.stage <= 1) return e->buf.grad_user + eg->off_gwhole * e->cfg.param_size;
    if (eg->goff == ZERO__ENG_NONE) return NULL;
    return e->buf.arena + eg->goff * e->cfg.param_size;
}

/* The accumulated gradient (comm dtype) of group g: stage 0 the whole group, else the
   rank's shard. */
static unsigned char *zero__eng_grad_acc(const zero_engine *e, int g)
{
    const zero__eng_group *eg = &e->layout.groups[g];
    if (e->cfg.stage == 0) return e->buf.grad_acc + eg->off_gwhole * e->cfg.comm_size;
    if (e->layout.acc_is_user_grad)
        return e->buf.grad_user +
               (eg->off_gwhole + (size_t)e->cfg.rank * eg->shard_numel) * e->cfg.param_size;
    return e->buf.grad_acc + eg->off_shard * e->cfg.comm_size;
}

/* The rank's shard of group g's accumulated gradient (what the norm reads, every stage). */
static unsigned char *zero__eng_grad_acc_shard(const zero_engine *e, int g)
{
    unsigned char *a = zero__eng_grad_acc(e, g);
    if (e->cfg.stage == 0)
        a += (size_t)e->cfg.rank * e->layout.groups[g].shard_numel * e->cfg.comm_size;
    return a;
}

/* ---- the arena ------------------------------------------------------------------------------ */
/* Stage-3 gathered params and stage 2-3 gradient buffers share one device buffer of
   max_live_numel elements, each taking its own size. Decisions follow the call sequence
   alone, so every rank places alike.

   Where a buffer goes (docs/engine.md, "Placement"). The user holds a buffer from
   zero_engine_gather to zero_engine_release (params) or from zero_engine_grads to
   zero_engine_grads_ready (gradients); everything else in the arena can go on demand (a
   prefetch is evicted, a pending reduction flushed). A position x for n elements in an
   arena of L is safe when one of the two sides it leaves holds T = min(M, L - n) elements
   (M: the largest group), i.e. the largest request that fits beside it by size. Every
   buffer takes a safe position if one can be had (evicting and flushing first), params
   the lowest, gradient buffers the highest (each free extent offers both its ends). So
   when at most one other buffer is held, a request that fits beside it by size always
   finds room: with the rest evicted, the held one leaves a side of >= T, and the request
   goes to that side's outer end, itself safe. With more buffers held any position that
   fits is taken, and a request fails only when, with the rest evicted, no gap is large
   enough; zero__eng_arena_need then names a size at which it (and every request before)
   cannot fail. An arena that holds everything at once gives each buffer a fixed home. */

static int zero__eng_pos_safe(size_t L, size_t M, size_t x, size_t n)
{
    size_t t = L - n < M ? L - n : M;
    return x >= t || L - x - n >= t;
}

/* The extent of ext[0..m) and the position *pos where n elements go, or -1: kind 0 (params)
   the lowest position, 1 (gradient buffers) the highest, among both ends of each extent
   whose fence is not after fenced_after; safe: only positions zero__eng_pos_safe allows. */
static int zero__eng_arena_choose(const zero__eng_extent *ext, int m, size_t L, size_t M,
                                  size_t n, int kind, int safe, uint64_t fenced_after, size_t *pos)
{
    int k, end;
    for (k = 0; k < m; k++) {
        int i = kind ? m - 1 - k : k;
        const zero__eng_extent *x = &ext[i];
        if (x->numel < n || x->fence_seq > fenced_after) continue;
        for (end = 0; end < 2; end++) {
            size_t p = (end == 0) == (kind == 0) ? x->off : x->off + x->numel - n;
            if (!safe || zero__eng_pos_safe(L, M, p, n)) {
                *pos = p;
                return i;
            }
        }
    }
    return -1;
}

/* Removes [pos, pos + n) from extent i of ext[0..*m) (it lies inside): the extent shrinks,
   goes, or splits in two (the caller's array has room for one more). */
static void zero__eng_ext_cut(zero__eng_extent *ext, int *m, int i, size_t pos, size_t n)
{
    zero__eng_extent *x = &ext[i];
    size_t left = pos - x->off, right = x->off + x->numel - pos - n;
    if (left > 0 && right > 0) {
        memmove(x + 2, x + 1, (size_t)(*m - i - 1) * sizeof *x);
        (*m)++;
        x[1] = *x;
        x[1].off = pos + n;
        x[1].numel = right;
        x->numel = left;
    } else if (left > 0) {
        x->numel = left;
    } else if (right > 0) {
        x->off = pos + n;
        x->numel = right;
    } else {
        memmove(x, x + 1, (size_t)(*m - i - 1) * sizeof *x);
        (*m)--;
    }
}

/* Where n elements of group g's buffer (kind 0 params, 1 gradients) go in the arena as it
   is now: its home when the arena holds everything, else zero__eng_arena_choose, compute-
   queue users (gradient buffers) first among extents without a pending fence, so a buffer
   still being reduced on COMM is reused last. -1 if none. */
static int zero__eng_arena_find(const zero_engine *e, int g, size_t n, int kind, int safe,
                                size_t *pos)
{
    int i;
    if (e->pool.numel == e->pool.all_numel) {
        size_t home = kind ? e->layout.groups[g].ghome : e->layout.groups[g].phome;
        for (i = 0; i < e->pool.nfree; i++)
            if (e->pool.free_ext[i].off <= home &&
                home + n <= e->pool.free_ext[i].off + e->pool.free_ext[i].numel) {
                *pos = home;
                return i;
            }
        return -1;
    }
    i = -1;
    if (kind)
        i = zero__eng_arena_choose(e->pool.free_ext, e->pool.nfree, e->pool.numel,
                                   e->layout.max_group_numel, n, kind, safe,
                                   e->sync.compute_seq, pos);
    if (i < 0)
        i = zero__eng_arena_choose(e->pool.free_ext, e->pool.nfree, e->pool.numel,
                                   e->layout.max_group_numel, n, kind, safe, UINT64_MAX, pos);
    return i;
}

/* Takes [pos, pos + n) of free extent i. Compute-queue users wait for its fence. */
static zero_result zero__eng_arena_take(zero_engine *e, int i, size_t pos, size_t n,
                                        int for_compute, size_t *off)
{
    zero__eng_extent *x = &e->pool.free_ext[i];
    zero_result r = ZERO_OK;
    *off = pos;
    if (for_compute && x->fence_seq > e->sync.compute_seq) {
        r = zero__eng_wait(e, ZERO_QUEUE_COMPUTE, x->fence);
        if (r != ZERO_OK) return r;
        e->sync.compute_seq = x->fence_seq;
    }
    zero__eng_ext_cut(e->pool.free_ext, &e->pool.nfree, i, pos, n);
    e->prefetch.stats.live_numel += n;
    if (e->prefetch.stats.live_numel > e->prefetch.stats.peak_live_numel)
        e->prefetch.stats.peak_live_numel = e->prefetch.stats.live_numel;
    return r;
}

/* Returns [off, off + n) to the free extents, merging neighbours; fence/seq: the event on
   COMM after the last COMM work on it (the latest of merged fences is kept). */
static void zero__eng_arena_give(zero_engine *e, size_t off, size_t n, zero_event *fence, uint64_t seq)
{
    int i = 0, j;
    zero__eng_extent *x;
    while (i < e->pool.nfree && e->pool.free_ext[i].off < off) i++;
    /* grow the left one */
    if (i > 0 && e->pool.free_ext[i - 1].off + e->pool.free_ext[i - 1].numel == off) {
        x = &e->pool.free_ext[i - 1];
        x->numel += n;
    } else {
        memmove(&e->pool.free_ext[i + 1], &e->pool.free_ext[i],
                (size_t)(e->pool.nfree - i) * sizeof *e->pool.free_ext);
        e->pool.nfree++;
        x = &e->pool.free_ext[i];
        x->off = off;
        x->numel = n;
        x->fence = NULL;
        x->fence_seq = 0;
        i++;
    }
    if (seq > x->fence_seq) {
        x->fence = fence;
        x->fence_seq = seq;
    }
    j = (int)(x - e->pool.free_ext) + 1; /* absorb the right neighbour */
    if (j < e->pool.nfree && x->off + x->numel == e->pool.free_ext[j].off) {
        x->numel += e->pool.free_ext[j].numel;
        if (e->pool.free_ext[j].fence_seq > x->fence_seq) {
            x->fence = e->pool.free_ext[j].fence;
            x->fence_seq = e->pool.free_ext[j].fence_seq;
        }
        memmove(&e->pool.free_ext[j], &e->pool.free_ext[j + 1],
                (size_t)(e->pool.nfree - j - 1) * sizeof *e->pool.free_ext);
        e->pool.nfree--;
    }
    e->prefetch.stats.live_numel -= n;
}

/* Drops gathered group g's params from the arena (a release, an eviction, a stale copy). */
static void zero__eng_drop_params(zero_engine *e, int g)
{
    zero__eng_group *eg = &e->layout.groups[g];
    if (eg->poff == ZERO__ENG_NONE) return;
    zero__eng_arena_give(e, eg->poff, eg->numel, eg->ev_gathered, eg->gathered_seq);
    eg->poff = ZERO__ENG_NONE;
    e->prefetch.stats.live_groups--;
}

/* Drops every prefetched group nobody uses (their values are about to go stale): wasted. */
static void zero__eng_drop_prefetched(zero_engine *e)
{
    int g;
    if (e->cfg.stage != 3) return;
    for (g = 0; g < e->layout.ngroups; g++)
        if (e->layout.groups[g].poff != ZERO__ENG_NONE && e->layout.groups[g].refs == 0) {
            zero__eng_drop_params(e, g);
            if (e->quant.fwd) e->quant.fwd[g] = 0; /* its next gather is a forward's again */
            e->prefetch.stats.evictions++;
            e->prefetch.stats.prefetch_wasted++;
        }
}

static zero_result zero__eng_flush(zero_engine *e);

/* Where group g is gathered next in the recorded order, from the current position (a
   large number when not again in this micro-step); without a trace, its distance from
   'near' in group order. */
static long zero__eng_next_use(const zero_engine *e, int g, int near)
{
    int j;
    if (!e->prefetch.trace_following) return g > near ? (long)(g - near) : (long)(near - g);
    for (j = e->prefetch.trace_pos; j < e->prefetch.trace_len; j++)
        if (e->prefetch.trace[j] == 2 * g) return (long)(j - e->prefetch.trace_pos);
    return (long)e->prefetch.trace_len + 1;
}

/* Evicts the prefetched, unused group used farthest ahead (Belady's choice). 0 if none. */
static int zero__eng_evict_one(zero_engine *e, int near)
{
    int g, best = -1;
    long bestd = -1;
    for (g = 0; g < e->layout.ngroups; g++)
        if (e->layout.groups[g].poff != ZERO__ENG_NONE && e->layout.groups[g].refs == 0) {
            long dd = zero__eng_next_use(e, g, near);
            if (dd > bestd) bestd = dd, best = g;
        }
    if (best < 0) return 0;
    zero__eng_drop_params(e, best);
    e->prefetch.stats.evictions++;
    e->prefetch.stats.prefetch_wasted++;
    return 1;
}

/* An arena size at which a request of n elements cannot fail, whatever the placement
   before it: with h elements held in k buffers and everything else evicted, the k buffers
   leave at most k + 1 gaps, so L >= h + (k + 1)(n - 1) + 1 leaves one of >= n. Kept as the
   most over every call that may need room since commit (every gather of a group not in
   use, prefetched or not: a rerun in another arena may find it not prefetched; every
   grads), as the held buffers at each call depend on the call sequence alone, not on the
   arena; capped at what can ever be live (fixed homes). */
static void zero__eng_arena_need(zero_engine *e, size_t n)
{
    size_t need = e->pool.held_numel, gaps;
    if (zero__mul_size((size_t)e->pool.held_count + 1, n - 1, &gaps) != 0 ||
        zero__add_size(need, gaps, &need) != 0 || zero__add_size(need, 1, &need) != 0)
        need = (size_t)-1;
    if (need > e->pool.all_numel) need = e->pool.all_numel;
    if (need > e->pool.need_max) e->pool.need_max = need;
}

/* Room for n elements of group g's buffer (kind 0 params, 1 gradients; the caller has
   called zero__eng_arena_need): a safe position
   among the free extents, then with pending reductions flushed (their gradient buffers
   return), then with prefetched groups evicted one by one; then any position that fits.
   *out = -1 when nothing helps. */
static zero_result zero__eng_arena_room(zero_engine *e, int g, size_t n, int kind, int *out,
                                        size_t *pos)
{
    int i = zero__eng_arena_find(e, g, n, kind, 1, pos);
    if (i < 0 && e->micro.npending > 0) {
        zero_result r = zero__eng_flush(e);
        if (r != ZERO_OK) return r;
        i = zero__eng_arena_find(e, g, n, kind, 1, pos);
    }
    while (i < 0 && zero__eng_evict_one(e, g)) i = zero__eng_arena_find(e, g, n, kind, 1, pos);
    if (i < 0) i = zero__eng_arena_find(e, g, n, kind, 0, pos);
    *out = i;
    return ZERO_OK;
}

/* The message of a full arena: what holds it and the setting that would fit. */
static zero_result zero__eng_arena_full(const zero_engine *e, const char *fn, int g, size_t n,
                                        const char *what)
{
    size_t held = e->prefetch.stats.live_numel, want, largest = 0;
    int i, np = 0, ng = 0;
    for (i = 0; i < e->pool.nfree; i++)
        if (e->pool.free_ext[i].numel > largest) largest = e->pool.free_ext[i].numel;
    for (i = 0; i < e->layout.ngroups; i++) {
        np += e->layout.groups[i].poff != ZERO__ENG_NONE;
        ng += e->layout.groups[i].goff != ZERO__ENG_NONE;
    }
    want = e->pool.need_max; /* zero__eng_arena_need: > numel, or the request would fit */
    return zero__fail(ZERO_ERROR_INVALID_STATE,
                      "%s: group %d ('%.100s'): no room for its %s (%zu elements) in the arena "
                      "(max_live_numel = %zu): %zu elements held by %d gathered group(s) and %d "
                      "gradient buffer(s), the largest free extent %zu; release groups or make "
                      "them ready first, or set max_live_numel >= %zu",
                      fn, g, zero__eng_group_name(e, g), what, n, e->pool.numel, held, np, ng,
                      largest, want);
}

/* ---- the trace: the order of a micro-step's gathers, recorded and followed ------------------ */
/* The first micro-step records the order of its gathers and gradient buffers (stage 3);
   later ones follow it, prefetching the groups it says come next. A call that departs
   from it (another group, or the micro-step ends early or late) turns the rest of the
   micro-step into a new recording, kept from the point where the order changed; nothing is
   prefetched while recording, and a prefetch that the new order does not use is dropped
   unused (counted as wasted), never served stale. DeepSpeed's module trace, per group. */

static void zero__eng_trace_note(zero_engine *e, int entry)
{
    if (e->cfg.stage != 3) return;
    if (e->prefetch.trace_following) {
        if (e->prefetch.trace_pos < e->prefetch.trace_len &&
            e->prefetch.trace[e->prefetch.trace_pos] == entry) {
            e->prefetch.trace_pos++;
            return;
        }
        e->prefetch.trace_following = 0; /* the order changed: record from here */
        e->prefetch.trace_len = e->prefetch.trace_pos;
    }
    if (e->prefetch.trace_len < 0) return; /* gave up this micro-step (no memory) */
    if (e->prefetch.trace_len == e->prefetch.trace_cap) {
        int cap = e->prefetch.trace_cap * 2, *nt;
        nt = cap <= (1 << 24) ? (int *)zero__alloc(&e->cfg.desc.allocator, (size_t)cap * sizeof *nt)
                              : NULL;
        if (!nt) {
            e->prefetch.trace_len = -1;
            return;
        }
        memcpy(nt, e->prefetch.trace, (size_t)e->prefetch.trace_len * sizeof *nt);
        zero__free(&e->cfg.desc.allocator, e->prefetch.trace);
        e->prefetch.trace = nt;
        e->prefetch.trace_cap = cap;
    }
    e->prefetch.trace[e->prefetch.trace_len++] = entry;
    e->prefetch.trace_pos = e->prefetch.trace_len;
}

static int zero__eng_trace_ahead(const zero_engine *e, int g, int *out, int max)
{
    int j, n = 0, i;
    if (!e->prefetch.trace_following) { /* in the direction of travel */
        int step = e->nvme.ahead_prev > g ? -1 : 1;
        for (j = g + step; j >= 0 && j < e->layout.ngroups && n < max; j += step) out[n++] = j;
        return n;
    }
    for (j = e->prefetch.trace_pos; j < e->prefetch.trace_len && n < max; j++) {
        int h = e->prefetch.trace[j] >> 1, dup = 0;
        /* a group gathered ahead of its use (prefetched, no user holds it) is served from
           the arena there; one a user holds is released before its next use */
        if ((e->prefetch.trace[j] & 1) || h == g || e->layout.groups[h].persistent ||
            (e->layout.groups[h].poff != ZERO__ENG_NONE && e->layout.groups[h].refs == 0))
            continue;
        for (i = 0; i < n; i++) dup |= out[i] == h;
        if (!dup) out[n++] = h;
    }
    return n;
}

/* The micro-step ended: a recording becomes the trace; a trace followed to a different end
   is cut there. */
static void zero__eng_trace_end(zero_engine *e)
{
    if (e->cfg.stage != 3) return;
    if (e->prefetch.trace_following && e->prefetch.trace_pos != e->prefetch.trace_len) {
        /* it ended early: the rest of the old order is gone */
        e->prefetch.trace_len = e->prefetch.trace_pos;
        e->prefetch.stats.trace_records++;
    } else if (!e->prefetch.trace_following && e->prefetch.trace_len > 0) {
        e->prefetch.stats.trace_records++;
    }
    e->prefetch.trace_following = e->prefetch.trace_len > 0;
    if (e->prefetch.trace_len < 0) e->prefetch.trace_len = 0;
    e->prefetch.trace_pos = 0;
    e->prefetch.stats.trace_len = e->prefetch.trace_len > 0 ? e->prefetch.trace_len : 0;
}

/* ---- the state tiers: one interface for the stage logic -------------------------------- */
/* The model states live in one of three tiers: the device, the host (ZeRO-Offload) or NVMe
   (ZeRO-Infinity). The stage logic (the reductions behind zero_engine_grads_ready,
   zero_engine_gather, zero_engine_step) asks these functions and never the offload
   settings, so it reads as the paper's algorithm with each tier move one call:

     zero__tier_where       which tier holds group g's param shard, the reduced gradient
                            shard, master, m or v (the answer for the whole engine when the
                            state does not depend on the group)
     zero__tier_grad_dst    where a reduction of group g writes: the accumulator when it is
                            on the device and the contribution is the step's first, else in
                            place (then zero__tier_grad_keep moves it on)
     zero__tier_grad_keep   the reduced values join the step's gradient in their tier: a
                            device add, or off the device into the host tier or through it
                            to NVMe (zero__eng_grad_out, zero__gnv_out)
     zero__tier_shard_up    stage 3: this rank's param shard of group g on the device, where
                            the all-gather reads it (uploaded from the host or NVMe tier into
                            its place in the gather's arena extent: zero__eng_offload_param_in)
     zero__tier_grad_check  the inf/NaN flag and the sum of squares of the reduced gradient
                            shard, where it lives (device kernels, the host kernels, or the
                            per-group values the NVMe gradient tier took as it wrote them)
     zero__tier_adam        Adam over this rank's shard where master, m, v live: per tensor
                            on the device, or tile by tile from the host or NVMe tier
                            (zero__eng_step_offload)

   Below them, the host and NVMe tiers move data in units of a tile (up to tile_numel
   elements of one group's shard: its master, m, v record) and of a group's param shard:
   zero__eng_swap_in / zero__eng_swap_out bring tile k's record in from NVMe and send it
   back, zero__eng_hparam_get / zero__eng_hparam_put a group's param shard (host memory, or
   NVMe through its write-back cache). Tensor access (set/read_tensor) and checkpoints reach
   the NVMe tier through its caches (zero__eng_nvme_state, zero__eng_hparam_get). */

/* Which tier holds group g's state of category cat (ZERO_MEM_PARAM: the param shard of a
   partitioned stage-3 group; ZERO_MEM_GRAD: the reduced gradient shard; ZERO_MEM_MASTER,
   _MOMENT1, _MOMENT2: master, m, v). g < 0: the engine's answer for every partitioned group. */
static zero_mem_tier zero__tier_where(const zero_engine *e, zero_mem_category cat, int g)
{
    switch (cat) {
    case ZERO_MEM_PARAM:
        if (!e->cfg.params_offloaded || (g >= 0 && e->layout.groups[g].persistent))
            return ZERO_TIER_DEVICE;
        return e->cfg.desc.offload_param == ZERO_OFFLOAD_NVME ? ZERO_TIER_NVME : ZERO_TIER_HOST;
    case ZERO_MEM_GRAD:
        if (!e->cfg.opt_offloaded) return ZERO_TIER_DEVICE;
        return e->cfg.desc.offload_gradients == ZERO_OFFLOAD_NVME ? ZERO_TIER_NVME
                                                                  : ZERO_TIER_HOST;
    case ZERO_MEM_MASTER:
    case ZERO_MEM_MOMENT1:
    case ZERO_MEM_MOMENT2:
        if (!e->cfg.opt_offloaded) return ZERO_TIER_DEVICE;
        return e->cfg.desc.offload_optimizer == ZERO_OFFLOAD_NVME ? ZERO_TIER_NVME
                                                                  : ZERO_TIER_HOST;
    default: return ZERO_TIER_DEVICE;
    }
}

/* Where the reduced values of a contribution that is added (not stored) land before the
   add: the user's buffer itself (an in-place reduction). */
static unsigned char *zero__eng_reduced_in_place(const zero_engine *e, int g)
{
    unsigned char *src = zero__eng_grad_user(e, g);
    if (e->cfg.stage == 0) return src;
    return src + (size_t)e->cfg.rank * e->layout.groups[g].shard_numel * e->cfg.param_size;
}

/* The elements of group g one rank's reduction produces: the whole group at stage 0 (an
   all-reduce), the rank's shard at stages 1-3 (a reduce-scatter). */
static size_t zero__eng_reduced_numel(const zero_engine *e, int g)
{
    return e->cfg.stage == 0 ? e->layout.groups[g].gnumel : e->layout.groups[g].shard_numel;
}

/* Where the reduction of elements [j, ...) of group g's contribution writes: the device
   accumulator for the step's first contribution ('store') when the gradients stay on the
   device, else in_place (the user's buffer or the bucket, then zero__tier_grad_keep). */
static unsigned char *zero__tier_grad_dst(const zero_engine *e, int g, int store, size_t j,
                                          unsigned char *in_place)
{
    if (store && zero__tier_where(e, ZERO_MEM_GRAD, g) == ZERO_TIER_DEVICE)
        return zero__eng_grad_acc(e, g) + j * e->cfg.comm_size;
    return in_place;
}

/* Elements [j, j + n) of group g's reduced contribution, at reduced (where
   zero__tier_grad_dst sent them, written on COMM), join the step's gradient in its tier: on
   the device a later contribution is added to the accumulator (the first is there already);
   off the device every contribution is downloaded into the host tier (with the NVMe
   gradient tier: into a staging buffer, then written to the group's gradient ranges). */
static zero_result zero__tier_grad_keep(zero_engine *e, int g, int store,
                                        const unsigned char *reduced, size_t j, size_t n)
{
    if (zero__tier_where(e, ZERO_MEM_GRAD, g) != ZERO_TIER_DEVICE)
        return zero__eng_grad_out(e, g, store, reduced, j, n);
    if (store) return ZERO_OK;
    return e->cfg.dev->ops->add(e->cfg.dev, ZERO_QUEUE_COMM,
                                zero__eng_grad_acc(e, g) + j * e->cfg.comm_size, reduced,
                                e->cfg.comm_dtype, n);
}

/* Stage 3: this rank's param shard of partitioned group g, on the device for the all-gather
   into the arena extent dst. On the device it is read where it lives; from the host or NVMe
   tier it is uploaded into its own place in dst (the all-gather then runs in place). */
static zero_result zero__tier_shard_up(zero_engine *e, int g, unsigned char *dst,
                                       const unsigned char **src)
{
    const zero__eng_group *eg = &e->layout.groups[g];
    if (zero__tier_where(e, ZERO_MEM_PARAM, g) == ZERO_TIER_DEVICE) {
        *src = e->buf.param + eg->off_param * e->cfg.param_size;
        return ZERO_OK;
    }
    ZERO__ENG_TRY(e, zero__eng_offload_param_in(e, g, dst),
                  "gather: upload of the offloaded shard");
    *src = dst + (size_t)e->cfg.rank * eg->shard_numel * e->cfg.param_size;
    return ZERO_OK;
}

/* The step's check of the reduced gradient shard: the inf/NaN flag and the sum of squares
   (into the scratch's flag and sumsq, on COMPUTE). On the device, device kernels per group;
   off the device, the host kernels over the host tier's shard (or the per-group values the
   NVMe gradient tier kept), the two values uploaded into the same places. */
static zero_result zero__tier_grad_check(zero_engine *e, float *flag, double *sumsq)
{
    zero_device *dev = e->cfg.dev;
    int g;
    if (zero__tier_where(e, ZERO_MEM_GRAD, -1) != ZERO_TIER_DEVICE)
        return zero__eng_host_grad_norm(e);
    for (g = 0; g < e->layout.ngroups; g++) {
        const unsigned char *a = zero__eng_grad_acc_shard(e, g);
        size_t n = e->layout.groups[g].shard_numel;
        ZERO__ENG_TRY(e,
                      dev->ops->nonfinite(dev, ZERO_QUEUE_COMPUTE, a, e->cfg.comm_dtype, n, flag),
                      "step: nonfinite");
        ZERO__ENG_TRY(e, dev->ops->sumsq(dev, ZERO_QUEUE_COMPUTE, a, e->cfg.comm_dtype, n, sumsq),
                      "step: sumsq");
    }
    return ZERO_OK;
}

/* Adam on the device: one call per (tensor x shard) segment; padding is never touched. */
static zero_result zero__eng_adam_device(zero_engine *e, const float *mul,
                                         const float *flag)
{
    zero_device *dev = e->cfg.dev;
    zero_result r;
    int t;
    for (t = 0; t < e->layout.ntensors; t++) {
        zero_tensor_info ti;
        zero_range seg, sh;
        zero_adam_range ar;
        const zero__eng_group *eg;
        size_t mo, go, po; /* element offsets of the segment in master, grad, param buffers */
        memset(&ti, 0, sizeof ti);
        memset(&seg, 0, sizeof seg);
        memset(&sh, 0, sizeof sh);
        r = zero_plan_tensor(e->layout.plan, t, &ti);
        if (r != ZERO_OK) return zero__eng_break(e, r, "step: plan");
        if (ti.frozen) continue;
        eg = &e->layout.groups[ti.group];
        if (e->cfg.stage == 0) {
            seg.offset = ti.offset;
            seg.numel = ti.numel;
            mo = eg->off_gwhole + seg.offset;
            go = seg.offset;
            po = eg->off_whole + seg.offset;
        } else {
            r = zero_plan_intersect(e->layout.plan, t, e->cfg.rank, &seg);
            if (r == ZERO_OK) r = zero_plan_shard(e->layout.plan, ti.group, e->cfg.rank, &sh);
            if (r != ZERO_OK) return zero__eng_break(e, r, "step: plan");
            if (seg.numel == 0) continue;
            mo = eg->off_shard + (seg.offset - sh.offset);
            go = seg.offset - sh.offset;
            if (e->cfg.stage < 3) po = eg->off_whole + seg.offset;
            else if (eg->persistent) po = eg->off_param + seg.offset;
            else po = eg->off_param + (seg.offset - sh.offset);
        }
        ar.numel = seg.numel;
        ar.master = zero__opt_at(e, e->opt.master, mo);
        ar.m = zero__opt_at(e, e->opt.m, mo);
        ar.v = zero__opt_at(e, e->opt.v, mo);
        zero__eng_range_sr(e, &ar, t, seg.offset - ti.offset);
        ar.grad = zero__eng_grad_acc(e, ti.group) + go * e->cfg.comm_size;
        ar.grad_dtype = e->cfg.comm_dtype;
        ar.param = e->buf.param + po * e->cfg.param_size;
        ar.param_dtype = e->cfg.param_dtype;
        ZERO__ENG_TRY(
            e,
            dev->ops->adam(dev, ZERO_QUEUE_COMPUTE, &ar,
                           &e->opt.coefs[t],
                           mul, flag),
            "step: adam");
    }
    return ZERO_OK;
}

/* The step's Adam over this rank's shard, where master, m, v live: on the device per tensor
   (reading the multiplier and flag the device computed); in the host or NVMe tier tile by
   tile (zero__eng_step_offload: the gradients and the updated params cross per tile, NVMe
   records are read ahead and written behind). */
static zero_result zero__tier_adam(zero_engine *e, const float *mul,
                                   const float *flag)
{
    if (zero__tier_where(e, ZERO_MEM_MASTER, -1) != ZERO_TIER_DEVICE)
        return zero__eng_step_offload(e, mul, flag);
    return zero__eng_adam_device(e, mul, flag);
}

/* ---- gradients ----------------------------------------------------------------------------- */

/* Reduces group g's gradients through the bucket, in pieces (the comm dtype differs from
   the param dtype): each piece cast into the bucket, reduced (all-reduce at stage 0,
   reduce-scatter of b elements per rank at stages 1-3) into the accumulator when 'store',
   else in place and added. Every element meets the same sums as in one piece. */
static zero_result zero__eng_reduce_staged(zero_engine *e, int g, int store)
{
    zero__eng_group *eg = &e->layout.groups[g];
    zero_device *dev = e->cfg.dev;
    const unsigned char *src = zero__eng_grad_user(e, g);
    unsigned char *bk = e->buf.bucket, *dst;
    size_t N = (size_t)e->cfg.world, b = e->buf.bucket_piece_numel, j, n, r;
    zero_result x = ZERO_OK;
    if (e->cfg.stage == 0) {
        for (j = 0; j < eg->gnumel && x == ZERO_OK; j += n) {
            n = eg->gnumel - j < N * b ? eg->gnumel - j : N * b;
            x = dev->ops->cast(dev, ZERO_QUEUE_COMM, bk, e->cfg.comm_dtype,
                               src + j * e->cfg.param_size, e->cfg.param_dtype, n);
            dst = zero__tier_grad_dst(e, g, store, j, bk);
            if (x == ZERO_OK)
                x = zero__eng_all_reduce(e, bk, dst, n, e->cfg.comm_dtype, ZERO_OP_SUM, 0, g,
                                         ZERO_ROLE_GRAD_REDUCE);
            if (x == ZERO_OK) x = zero__tier_grad_keep(e, g, store, dst, j, n);
        }
        return x;
    }
    for (j = 0; j < eg->shard_numel && x == ZERO_OK; j += n) {
        n = eg->shard_numel - j < b ? eg->shard_numel - j : b;
        for (r = 0; r < N && x == ZERO_OK; r++)
            x = dev->ops->cast(
                dev, ZERO_QUEUE_COMM, bk + r * n * e->cfg.comm_size, e->cfg.comm_dtype,
                src + (r * eg->shard_numel + j) * e->cfg.param_size, e->cfg.param_dtype, n);
        /* in place: this rank's piece of the bucket */
        dst = zero__tier_grad_dst(e, g, store, j, bk + (size_t)e->cfg.rank * n * e->cfg.comm_size);
        if (x == ZERO_OK) x = zero__eng_reduce_scatter(e, bk, dst, n, e->cfg.comm_dtype, g);
        if (x == ZERO_OK) x = zero__tier_grad_keep(e, g, store, dst, j, n);
    }
    return x;
}

/* Reduces group g's gradients of this contribution (on COMM, after the hand-off). store:
   the step's first contribution of the group (the collective writes the accumulator); else
   the collective runs in place in the user's buffer and the result is added (one rounding).
   collective_only: only the collective (fused in a group call; the caller adds after). */
static zero_result zero__eng_reduce_one(zero_engine *e, int g, int store, int collective_only)
{
    zero__eng_group *eg = &e->layout.groups[g];
    unsigned char *src = zero__eng_grad_user(e, g);
    unsigned char *dst;
    zero_result r;
    if (e->cfg.comm_dtype != e->cfg.param_dtype) return zero__eng_reduce_staged(e, g, store);
    dst = zero__tier_grad_dst(e, g, store, 0, zero__eng_reduced_in_place(e, g));
    if (e->cfg.stage == 0)
        r = zero__eng_all_reduce(e, src, dst, eg->gnumel, e->cfg.comm_dtype, ZERO_OP_SUM, 0, g,
                                 ZERO_ROLE_GRAD_REDUCE);
    else
        r = zero__eng_reduce_scatter(e, src, dst, eg->shard_numel, e->cfg.comm_dtype, g);
    if (r != ZERO_OK || collective_only) return r;
    return zero__tier_grad_keep(e, g, store, dst, 0, zero__eng_reduced_numel(e, g));
}

/* Reduces every pending group, in the order they became ready. Consecutive groups whose
   reduction is one collective on distinct buffers (comm dtype = param dtype) go into one
   group call; the adds of contributions after the first follow it. */
static zero_result zero__eng_flush(zero_engine *e)
{
    int i, fuse;
    if (e->micro.npending == 0) return ZERO_OK;
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM),
                  "gradient reduction: event");
    fuse = e->micro.npending > 1 && e->cfg.comm_dtype == e->cfg.param_dtype &&
           e->cfg.comm->ops->group_start != NULL && !e->quant.grad_bits;
    if (fuse) {
        ZERO__ENG_TRY(e, zero__eng_group_start(e), "gradient reduction: group_start");
        for (i = 0; i < e->micro.npending; i++)
            ZERO__ENG_TRY_IN_GROUP(
                e, zero__eng_reduce_one(e, e->micro.pending[i], e->micro.pending_store[i], 1),
                "gradient reduction");
        ZERO__ENG_TRY(e, zero__eng_group_end(e), "gradient reduction: group_end");
        for (i = 0; i < e->micro.npending; i++) { /* each result joins the step's gradient */
            int g = e->micro.pending[i], store = e->micro.pending_store[i];
            unsigned char *dst = zero__tier_grad_dst(e, g, store, 0,
                                                     zero__eng_reduced_in_place(e, g));
            ZERO__ENG_TRY(e,
                          zero__tier_grad_keep(e, g, store, dst, 0,
                                               zero__eng_reduced_numel(e, g)),
                          zero__tier_where(e, ZERO_MEM_GRAD, g) == ZERO_TIER_DEVICE
                              ? "gradient accumulation"
                              : "gradient offload");
        }
    } else {
        for (i = 0; i < e->micro.npending; i++)
            ZERO__ENG_TRY(
                e, zero__eng_reduce_one(e, e->micro.pending[i], e->micro.pending_store[i], 0),
                "gradient reduction");
    }
    for (i = 0; i < e->micro.npending; i++) {
        zero__eng_group *eg = &e->layout.groups[e->micro.pending[i]];
        ZERO__ENG_TRY(e, zero__eng_fence(e, eg->ev_reduced, &eg->reduced_seq), "gradient reduction: event");
        eg->reduced_valid = 1;
        if (eg->goff != ZERO__ENG_NONE) { /* stages 2-3: the buffer returns to the arena */
            zero__eng_arena_give(e, eg->goff, eg->gnumel, eg->ev_reduced, eg->reduced_seq);
            eg->goff = ZERO__ENG_NONE;
            e->prefetch.stats.grad_live_numel -= eg->gnumel;
        }
    }
    e->micro.npending = 0;
    e->micro.pending_numel = 0;
    return ZERO_OK;
}

/* ---- debug mode: guarded copies of the buffers handed out (debug_guards) ---------------- */

#define ZERO__GUARD_BYTE 0xA5

/* Group g's copy (k = 0 params, 1 gradients): numel elements then the guard bytes, written
   when the copy is made. */
static zero_result zero__eng_dbg_buf(zero_engine *e, int g, int k, unsigned char **out)
{
    size_t bytes = (k ? e->layout.groups[g].gnumel : e->layout.groups[g].numel) * e->cfg.param_size;
    void **slot;
    zero_result r;
    *out = NULL;
    if (!e->debug.copies) {
        e->debug.copies = (void **)zero__alloc(&e->cfg.desc.allocator,
                                               2 * (size_t)e->layout.ngroups * sizeof(void *));
        if (!e->debug.copies)
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "debug guards: %d groups",
                              e->layout.ngroups);
        memset(e->debug.copies, 0, 2 * (size_t)e->layout.ngroups * sizeof(void *));
    }
    slot = &e->debug.copies[2 * g + k];
    if (!*slot) {
        unsigned char pat[ZERO_DEBUG_GUARD_BYTES];
        void *p = NULL;
        r = e->cfg.dev->ops->alloc(e->cfg.dev, bytes + ZERO_DEBUG_GUARD_BYTES, ZERO_MEM_SCRATCH,
                                   &p);
        if (r != ZERO_OK) {
            char prev[300];
            zero__eng_copy_error(prev, sizeof prev);
            return zero__fail(r, "debug guards: group %d's %s copy (%zu bytes): %s", g,
                              k ? "gradient" : "param", bytes + ZERO_DEBUG_GUARD_BYTES, prev);
        }
        memset(pat, ZERO__GUARD_BYTE, sizeof pat);
        r = e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_COMPUTE, (unsigned char *)p + bytes, pat,
                                    sizeof pat);
        if (r == ZERO_OK) r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE);
        if (r != ZERO_OK) {
            (void)e->cfg.dev->ops->free(e->cfg.dev, p);
            return zero__eng_break(e, r, "debug guards: upload");
        }
        *slot = p;
    }
    *out = (unsigned char *)*slot;
    return ZERO_OK;
}

/* Checks the guard bytes after group g's copy k (if made): INVALID_STATE naming the group,
   the buffer and the first changed byte; the guard is written again. */
static zero_result zero__eng_dbg_check(zero_engine *e, int g, int k, const char *fn)
{
    unsigned char got[ZERO_DEBUG_GUARD_BYTES];
    size_t bytes, i;
    unsigned char *p;
    if (!e->debug.guards || !e->debug.copies || !e->debug.copies[2 * g + k]) return ZERO_OK;
    p = (unsigned char *)e->debug.copies[2 * g + k];
    bytes = (k ? e->layout.groups[g].gnumel : e->layout.groups[g].numel) * e->cfg.param_size;
    ZERO__ENG_TRY(
        e, e->cfg.dev->ops->download(e->cfg.dev, ZERO_QUEUE_COMPUTE, got, p + bytes, sizeof got),
        "debug guards: download");
    ZERO__ENG_TRY(e, e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE), "debug guards: sync");
    for (i = 0; i < sizeof got; i++)
        if (got[i] != ZERO__GUARD_BYTE) {
            unsigned char pat[ZERO_DEBUG_GUARD_BYTES];
            memset(pat, ZERO__GUARD_BYTE, sizeof pat);
            ZERO__ENG_TRY(
                e,
                e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_COMPUTE, p + bytes, pat, sizeof pat),
                "debug guards: upload");
            ZERO__ENG_TRY(e, e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE),
                          "debug guards: sync");
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "%s: group %d's %s buffer was written past its end: guard byte %zu "
                              "after its %zu bytes (%zu elements of %s) is 0x%02x (writing another "
                              "dtype, e.g. fp32 values into this %s buffer, or an index past the "
                              "group's %zu elements)",
                              fn, g, k ? "gradient" : "param", i, bytes, bytes / e->cfg.param_size,
                              zero_dtype_name(e->cfg.param_dtype), (unsigned)got[i],
                              zero_dtype_name(e->cfg.param_dtype), bytes / e->cfg.param_size);
        }
    return ZERO_OK;
}

/* What the user gets for group g's buffer real (k = 0 params, 1 gradients): real, or in
   debug mode the guarded copy (params copied in; gradients zeroed). */
static zero_result zero__eng_dbg_hand(zero_engine *e, int g, int k, unsigned char *real, void **out)
{
    unsigned char *c;
    zero_result r;
    *out = real;
    if (!e->debug.guards) return ZERO_OK;
    if ((r = zero__eng_dbg_buf(e, g, k, &c)) != ZERO_OK) return r;
    if (k == 0)
        ZERO__ENG_TRY(e,
                      e->cfg.dev->ops->copy(e->cfg.dev, ZERO_QUEUE_COMPUTE, c, real,
                                            e->layout.groups[g].numel * e->cfg.param_size),
                      "debug guards: copy");
    else
        ZERO__ENG_TRY(e,
                      e->cfg.dev->ops->fill_zero(e->cfg.dev, ZERO_QUEUE_COMPUTE, c,
                                                 e->layout.groups[g].gnumel * e->cfg.param_size),
                      "debug guards: fill");
    *out = c;
    return ZERO_OK;
}

/* A group whose tensors are all frozen has no gradient: INVALID_ARGUMENT naming them. */
static zero_result zero__eng_frozen_group(const zero_engine *e, int g, const char *fn)
{
    zero_group_info gi;
    char names[300];
    size_t at = 0;
    int i;
    memset(&gi, 0, sizeof gi);
    names[0] = '\0';
    (void)zero_plan_group(e->layout.plan, g, &gi);
    for (i = 0; i < gi.num_tensors && at + 4 < sizeof names; i++) {
        int n = snprintf(names + at, sizeof names - at, "%s'%s'", i ? ", " : "",
                         zero__eng_tensor_name(e, gi.tensors[i]));
        if (n < 0) break;
        at += (size_t)n;
    }
    return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                      "%s: group %d holds only frozen tensors (%.280s): they take no gradient "
                      "(ZERO_TENSOR_FROZEN); skip the group's gradients in the backward",
                      fn, g, names);
}

ZERODEF zero_result zero_engine_grads(zero_engine *e, int group, void **out_grads)
{
    zero_result r = zero__eng_usable(e, "zero_engine_grads");
    zero__eng_group *eg;
    unsigned char *ptr;
    int i;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_grads")) != ZERO_OK) return r;
    if (!out_grads)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_grads: out_grads is NULL");
    eg = &e->layout.groups[group];
    if (eg->gnumel == 0) return zero__eng_frozen_group(e, group, "zero_engine_grads");
    if (eg->grads_state == ZERO__GRADS_HANDED) {
        *out_grads = e->debug.guards ? e->debug.copies[2 * group + 1]
                                     : (void *)zero__eng_grad_user(e, group);
        return ZERO_OK;
    }
    if (eg->grads_state == ZERO__GRADS_READY)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_grads: group %d is already ready in this micro-step%s",
                          group, eg->parts > 1 ? " (all its gradient parts)" : "");
    if (e->micro.done >= e->cfg.accum_steps)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_grads: all %d micro-steps of this step are done; call "
                          "zero_engine_step()",
                          e->cfg.accum_steps);
    /* an earlier part of this group still waiting for its reduction reads the buffer */
    for (i = 0; i < e->micro.npending; i++)
        if (e->micro.pending[i] == group && (r = zero__eng_flush(e)) != ZERO_OK) return r;
    if (e->cfg.stage >= 2) {
        size_t off;
        int x;
        zero__eng_trace_note(e, 2 * group + 1);
        zero__eng_arena_need(e, eg->gnumel);
        if ((r = zero__eng_arena_room(e, group, eg->gnumel, 1, &x, &off)) != ZERO_OK) return r;
        if (x < 0)
            return zero__eng_arena_full(e, "zero_engine_grads", group, eg->gnumel,
                                        "gradient buffer");
        ZERO__ENG_TRY(e, zero__eng_arena_take(e, x, off, eg->gnumel, 1, &off),
                      "zero_engine_grads: event");
        eg->goff = off;
        e->prefetch.stats.grad_live_numel += eg->gnumel;
        e->pool.held_numel += eg->gnumel;
        e->pool.held_count++;
    } else if (eg->reduced_valid) {
        ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_COMPUTE, eg->ev_reduced),
                      "zero_engine_grads: event");
    }
    ptr = zero__eng_grad_user(e, group);
    ZERO__ENG_TRY(e,
                  e->cfg.dev->ops->fill_zero(e->cfg.dev, ZERO_QUEUE_COMPUTE, ptr,
                                             eg->gnumel * e->cfg.param_size),
                  "zero_engine_grads: fill");
    if ((r = zero__eng_dbg_hand(e, group, 1, ptr, out_grads)) != ZERO_OK) return r;
    eg->grads_state = ZERO__GRADS_HANDED;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_grads_ready(zero_engine *e, int group)
{
    zero_result r = zero__eng_usable(e, "zero_engine_grads_ready");
    zero__eng_group *eg;
    int g;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_grads_ready")) != ZERO_OK) return r;
    eg = &e->layout.groups[group];
    if (eg->gnumel == 0) return zero__eng_frozen_group(e, group, "zero_engine_grads_ready");
    if (eg->grads_state != ZERO__GRADS_HANDED)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_grads_ready: group %d %s", group,
                          eg->grads_state == ZERO__GRADS_READY
                              ? "is already ready in this micro-step"
                              : "has no gradient buffer (call zero_engine_grads first)");
    if (e->debug.guards) { /* the copies' guards, then the gradients into the engine's buffer */
        if ((r = zero__eng_dbg_check(e, group, 1, "zero_engine_grads_ready")) != ZERO_OK) return r;
        if (eg->refs > 0 && (r = zero__eng_dbg_check(e, group, 0, "zero_engine_grads_ready")) != ZERO_OK)
            return r;
        ZERO__ENG_TRY(
            e,
            e->cfg.dev->ops->copy(e->cfg.dev, ZERO_QUEUE_COMPUTE, zero__eng_grad_user(e, group),
                                  e->debug.copies[2 * group + 1], eg->gnumel * e->cfg.param_size),
            "debug guards: copy");
    }
    e->micro.pending_store[e->micro.npending] =
        (unsigned char)(e->micro.done == 0 && eg->parts_ready == 0);
    e->micro.pending[e->micro.npending++] = group;
    if (eg->goff != ZERO__ENG_NONE) { /* the buffer is the engine's now (a flush returns it) */
        e->pool.held_numel -= eg->gnumel;
        e->pool.held_count--;
    }
    eg->parts_ready++;
    eg->grads_state = eg->parts_ready == eg->parts ? ZERO__GRADS_READY : ZERO__GRADS_NONE;
    e->micro.pending_numel += eg->gnumel;
    e->micro.ready_groups++;
    if (e->micro.ready_groups == e->layout.total_parts ||
        e->micro.pending_numel >= e->cfg.desc.reduce_bucket_numel)
        if ((r = zero__eng_flush(e)) != ZERO_OK) return r;
    if (e->micro.ready_groups == e->layout.total_parts) {
        e->micro.done++;
        e->micro.ready_groups = 0;
        if (e->quant.fwd) /* qwZ: the next gather of each group is the next forward's, unless
                             the group is gathered already (prefetched or held for it) */
            for (g = 0; g < e->layout.ngroups; g++)
                e->quant.fwd[g] = (unsigned char)(e->layout.groups[g].poff != ZERO__ENG_NONE);
        for (g = 0; g < e->layout.ngroups; g++) {
            e->layout.groups[g].grads_state = ZERO__GRADS_NONE;
            e->layout.groups[g].parts_ready = 0;
        }
        zero__eng_trace_end(e);
    }
    return ZERO_OK;
}

/* ---- stage 3 gathering ------------------------------------------------------------------- */

/* All-gathers non-persistent group g into the arena at off (on COMM, after COMPUTE's work so
   far: the step's updates of the shard and every earlier use of the extent). */
static zero_result zero__eng_issue_gather(zero_engine *e, int g, size_t off)
{
    zero__eng_group *eg = &e->layout.groups[g];
    unsigned char *dst = e->buf.arena + off * e->cfg.param_size;
    const unsigned char *src = NULL;
    zero_result r;
    eg->poff = off; /* the extent is the group's from here on, even if the gather fails */
    e->prefetch.stats.live_groups++;
    if (e->topo.hpz && e->topo.hpz_valid[g]) { /* hpZ: from the secondary parts, in the node */
        ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM),
                      "gather: event");
        if (e->quant.fwd) e->quant.fwd[g] = 1;
        ZERO__ENG_TRY(e, zero__eng_hpz_gather(e, g, dst), "gather: hpZ all_gather");
        ZERO__ENG_TRY(e, zero__eng_fence(e, eg->ev_gathered, &eg->gathered_seq), "gather: event");
        e->prefetch.stats.gathers++;
        return ZERO_OK;
    }
    if ((r = zero__tier_shard_up(e, g, dst, &src)) != ZERO_OK) return r;
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM), "gather: event");
    if (e->quant.weights && !e->quant.fwd[g]) { /* qwZ: the forward's gather, int8 blocks */
        e->quant.fwd[g] = 1;
        if (eg->shard_numel > 0)
            ZERO__ENG_TRY(e, zero__eng_all_gather_q(e, src, dst, eg->shard_numel, g),
                          "gather: quantized all_gather");
        if (eg->pshard_numel > eg->shard_numel)
            ZERO__ENG_TRY(e,
                          zero__eng_all_gather_q(e, src + eg->shard_numel * e->cfg.param_size,
                                                 dst + eg->gnumel * e->cfg.param_size,
                                                 eg->pshard_numel - eg->shard_numel, g),
                          "gather: quantized all_gather of the frozen region");
    } else {
        if (eg->shard_numel > 0)
            ZERO__ENG_TRY(e,
                          zero__eng_all_gather(e, src, dst, eg->shard_numel, e->cfg.param_dtype,
                                               g, ZERO_ROLE_GATHER),
                          "gather: all_gather");
        if (eg->pshard_numel > eg->shard_numel) /* the frozen region, after the trained one */
            ZERO__ENG_TRY(e,
                          zero__eng_all_gather(e, src + eg->shard_numel * e->cfg.param_size,
                                               dst + eg->gnumel * e->cfg.param_size,
                                               eg->pshard_numel - eg->shard_numel,
                                               e->cfg.param_dtype, g, ZERO_ROLE_GATHER),
                          "gather: all_gather of the frozen region");
    }
    if (e->topo.hpz) { /* hpZ: keep this rank's secondary part of what was gathered */
        size_t n = eg->numel / (size_t)e->topo.hpz, ps = e->cfg.param_size;
        ZERO__ENG_TRY(e,
                      e->cfg.dev->ops->copy(e->cfg.dev, ZERO_QUEUE_COMM,
                                            e->topo.hpz_buf + eg->off_sec * ps,
                                            dst + (size_t)e->topo.hpz_comm->rank * n * ps, n * ps),
                      "gather: hpZ secondary copy");
        e->topo.hpz_valid[g] = 1;
    }
    ZERO__ENG_TRY(e, zero__eng_fence(e, eg->ev_gathered, &eg->gathered_seq), "gather: event");
    e->prefetch.stats.gathers++;
    return ZERO_OK;
}

/* Gathers group g ahead of use if it is not gathered and fits without evicting anything. */
static zero_result zero__eng_try_prefetch(zero_engine *e, int g, int *issued)
{
    size_t off;
    int x;
    zero_result r;
    *issued = 0;
    if (g < 0 || g >= e->layout.ngroups || e->layout.groups[g].persistent ||
        e->layout.groups[g].poff != ZERO__ENG_NONE)
        return ZERO_OK;
    x = zero__eng_arena_find(e, g, e->layout.groups[g].numel, 0, 1, &off);
    if (x < 0) return ZERO_OK;
    r = zero__eng_arena_take(e, x, off, e->layout.groups[g].numel, 0, &off);
    if (r != ZERO_OK) return r;
    *issued = 1;
    e->prefetch.stats.prefetches++;
    return zero__eng_issue_gather(e, g, off);
}

/* Prefetches the next prefetch_depth gathers of the recorded order (from the current
   position) that are not gathered, in order, while each fits the arena's free room beside
   the gradient buffers the order asks for before it (so a prefetch is never evicted for
   them); stops at the first that does not fit. Nothing while recording. */
#define ZERO__ENG_FIT_MAX 64
/* Whether the free extents, after group g's n elements are taken for a prefetch (placed as
   zero__eng_arena_find places it), still place each of the nres gradient buffers res[] in
   turn at safe positions: total room is not enough, a fragmented arena would evict the
   prefetch again. Conservative: releases and flushed reductions in between are not
   counted. An arena with fixed homes has room for everything. */
static int zero__eng_prefetch_fits(const zero_engine *e, int g, size_t n, const size_t *res,
                                   int nres)
{
    zero__eng_extent ext[2 * ZERO__ENG_FIT_MAX + 2];
    size_t pos;
    int i, k, m = e->pool.nfree;
    if (e->pool.numel == e->pool.all_numel) return 1;
    if (m > ZERO__ENG_FIT_MAX) return 0;
    memcpy(ext, e->pool.free_ext, (size_t)m * sizeof *ext);
    if ((i = zero__eng_arena_find(e, g, n, 0, 1, &pos)) < 0) return 0;
    zero__eng_ext_cut(ext, &m, i, pos, n);
    for (k = 0; k < nres; k++) {
        i = zero__eng_arena_choose(ext, m, e->pool.numel, e->layout.max_group_numel, res[k], 1, 1,
                                   UINT64_MAX, &pos);
        if (i < 0) return 0;
        zero__eng_ext_cut(ext, &m, i, pos, res[k]);
    }
    return 1;
}

static zero_result zero__eng_trace_prefetch(zero_engine *e)
{
    size_t res[ZERO__ENG_FIT_MAX];
    int j, seen = 0, nres = 0;
    if (!e->prefetch.trace_following) return ZERO_OK;
    for (j = e->prefetch.trace_pos; j < e->prefetch.trace_len && seen < e->prefetch.depth; j++) {
        int g = e->prefetch.trace[j] >> 1, issued;
        const zero__eng_group *h = &e->layout.groups[g];
        zero_result r;
        if (e->prefetch.trace[j] & 1) { /* a gradient buffer comes first: keep room for it */
            if (h->goff == ZERO__ENG_NONE) {
                if (nres == ZERO__ENG_FIT_MAX) break;
                res[nres++] = h->gnumel;
            }
            continue;
        }
        seen++;
        if (h->poff != ZERO__ENG_NONE) continue; /* in use or prefetched already */
        if (!zero__eng_prefetch_fits(e, g, h->numel, res, nres)) break;
        if ((r = zero__eng_try_prefetch(e, g, &issued)) != ZERO_OK) return r;
        if (!issued) break;
    }
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_gather(zero_engine *e, int group, void **out_params)
{
    zero_result r = zero__eng_usable(e, "zero_engine_gather");
    zero__eng_group *eg;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_gather")) != ZERO_OK) return r;
    if (!out_params)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_gather: out_params is NULL");
    eg = &e->layout.groups[group];
    if (e->cfg.stage < 3 || eg->persistent) {
        if ((r = zero__eng_dbg_hand(e, group, 0, zero__eng_param_whole(e, group), out_params)) != ZERO_OK)
            return r;
        eg->refs++;
        return ZERO_OK;
    }
    zero__eng_trace_note(e, 2 * group);
    if (eg->refs == 0) zero__eng_arena_need(e, eg->numel);
    if (eg->poff == ZERO__ENG_NONE) {
        size_t off;
        int x;
        if ((r = zero__eng_arena_room(e, group, eg->numel, 0, &x, &off)) != ZERO_OK) return r;
        if (x < 0) return zero__eng_arena_full(e, "zero_engine_gather", group, eg->numel, "params");
        ZERO__ENG_TRY(e, zero__eng_arena_take(e, x, off, eg->numel, 0, &off), "gather: arena");
        if ((r = zero__eng_issue_gather(e, group, off)) != ZERO_OK) return r;
    } else if (eg->refs == 0) {
        e->prefetch.stats.prefetch_hits++;
    }
    ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_COMPUTE, eg->ev_gathered), "gather: event");
    if (eg->gathered_seq > e->sync.compute_seq) e->sync.compute_seq = eg->gathered_seq;
    if ((r = zero__eng_dbg_hand(e, group, 0, zero__eng_param_whole(e, group), out_params)) != ZERO_OK)
        return r;
    if (eg->refs++ == 0) { /* in use: no longer evictable */
        e->pool.held_numel += eg->numel;
        e->pool.held_count++;
    }
    return zero__eng_trace_prefetch(e);
}

ZERODEF zero_result zero_engine_prefetch(zero_engine *e, int group)
{
    zero_result r = zero__eng_usable(e, "zero_engine_prefetch");
    int issued;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_prefetch")) != ZERO_OK) return r;
    if (e->cfg.stage < 3) return ZERO_OK;
    return zero__eng_try_prefetch(e, group, &issued);
}

ZERODEF zero_result zero_engine_release(zero_engine *e, int group)
{
    zero_result r = zero__eng_usable(e, "zero_engine_release");
    zero__eng_group *eg;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_group_arg(e, group, "zero_engine_release")) != ZERO_OK) return r;
    eg = &e->layout.groups[group];
    if (eg->refs <= 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_release: group %d is not gathered (released twice?)",
                          group);
    if ((r = zero__eng_dbg_check(e, group, 0, "zero_engine_release")) != ZERO_OK) return r;
    eg->refs--;
    if (eg->refs == 0 && e->cfg.stage == 3 && !eg->persistent) {
        e->pool.held_numel -= eg->numel;
        e->pool.held_count--;
        zero__eng_drop_params(e, group);
    }
    return ZERO_OK;
}

/* ---- the step ------------------------------------------------------------------------------ */

/* The error of an overflow at the minimum loss scale (scaler.at_min = error). */
static zero_result zero__eng_at_min_error(const zero_engine *e)
{
    return zero__fail(ZERO_ERROR_LOSS_SCALE,
                      "zero_engine_step: inf/NaN gradients at the minimum loss scale %g: the "
                      "step was skipped (nothing updated; the engine stays usable) but the "
                      "scale cannot go lower. fp16 training is diverging, or min_scale is "
                      "too high: lower the learning rate or scaler.min_scale, look for "
                      "inf/NaN in the loss or data, train in bf16, or set scaler.at_min = "
                      "ZERO_SCALER_AT_MIN_SKIP to skip such steps and go on",
                      (double)e->opt.scaler.scale);
}

/* The step's verdict (host[0] flag, host[1] multiplier, host[2] norm) applied on the host:
   the loss scaler, the step count, the step's info. Returns 1 when the overflow came at the
   minimum scale and the scaler is set to call that an error. */
static int zero__eng_step_verdict(zero_engine *e, const float *host, float scale_used)
{
    zero_step_info *info = &e->async.last_info;
    int at_min = zero_scaler_update(&e->opt.scaler, host[0] != 0.0f) == ZERO_ERROR_LOSS_SCALE;
    if (host[0] == 0.0f) e->opt.step++;
    info->step = e->opt.step;
    info->skipped = host[0] != 0.0f;
    info->loss_scale = scale_used;
    info->next_loss_scale = e->opt.scaler.scale;
    info->grad_norm = host[2];
    info->grad_mul = host[1];
    info->clip_coef = 1.0f;
    if (!info->skipped && e->cfg.desc.clip_norm > 0.0f && host[2] > e->cfg.desc.clip_norm)
        info->clip_coef = e->cfg.desc.clip_norm / (host[2] + 1e-6f);
    return at_min;
}

/* async_step: reads the verdict of the step enqueued last (on the offload queue, which
   waited for the step's event, so the wait does not cover later compute work). An
   at-minimum-scale overflow is kept in at_min_unreported until a call that can return it
   (zero__eng_step_settle) does; value queries (loss scale, step count) only read. */
static zero_result zero__eng_step_complete(zero_engine *e)
{
    zero_device *dev = e->cfg.dev;
    float host[3];
    if (!e->async.pending) return ZERO_OK;
    e->async.pending = 0;
    ZERO__ENG_TRY(
        e, dev->ops->download(dev, ZERO_QUEUE_OFFLOAD, host, e->buf.scratch + 8, 3 * sizeof(float)),
        "step: download");
    ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_OFFLOAD), "step: sync");
    if (zero__eng_step_verdict(e, host, e->async.scale_used)) e->async.at_min_unreported = 1;
    return ZERO_OK;
}

/* The pending verdict read, and its at-minimum-scale error returned once (by the next step,
   zero_engine_last_step or a checkpoint call; that call then does nothing else). */
static zero_result zero__eng_step_settle(zero_engine *e)
{
    zero_result r = zero__eng_step_complete(e);
    if (r != ZERO_OK) return r;
    if (!e->async.at_min_unreported) return ZERO_OK;
    e->async.at_min_unreported = 0;
    return zero__eng_at_min_error(e);
}

ZERODEF zero_result zero_engine_last_step(zero_engine *e, zero_step_info *info)
{
    zero_result r;
    if (!e || !info) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_last_step: %s is NULL", e ? "info" : "e");
    r = zero__eng_step_settle(e);
    if (r == ZERO_OK || r == ZERO_ERROR_LOSS_SCALE) *info = e->async.last_info;
    return r;
}

/* "groups 0, 3, 7" of the groups in gradient state st this micro-step (at most what fits);
   returns how many there are. */
static int zero__eng_list_groups(const zero_engine *e, int st, char *out, size_t n)
{
    size_t at = 0;
    int g, k = 0;
    out[0] = '\0';
    for (g = 0; g < e->layout.ngroups; g++) {
        if (e->layout.groups[g].grads_state != st) continue;
        if (at + 24 < n)
            at += (size_t)snprintf(out + at, n - at, "%s%d", k ? ", " : "group ", g);
        else if (at + 5 < n && out[at - 1] != '.')
            at += (size_t)snprintf(out + at, n - at, ", ...");
        k++;
    }
    if (k > 1 && at + 2 < n) { /* "group 1, 2" -> "groups 1, 2" */
        memmove(out + 6, out + 5, at - 5 + 1);
        out[5] = 's';
    }
    return k;
}

/* Whether a step may run: exactly accum_steps complete micro-steps, every group's parts
   ready, and no group still gathered; else the error names what is missing. */
static zero_result zero__eng_step_ready(const zero_engine *e)
{
    int g;
    if (e->micro.done != e->cfg.accum_steps || e->micro.ready_groups != 0) {
        char handed[160], never[160];
        int nh = zero__eng_list_groups(e, ZERO__GRADS_HANDED, handed, sizeof handed);
        int nn = zero__eng_list_groups(e, ZERO__GRADS_NONE, never, sizeof never);
        if (e->micro.done == 0 && e->micro.ready_groups == 0 && nh == 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_engine_step: no gradients since the last step (each "
                              "micro-step: zero_engine_grads, write, zero_engine_grads_ready "
                              "for every group; accum_steps = %d micro-steps)", e->cfg.accum_steps);
        return zero__fail(
            ZERO_ERROR_INVALID_STATE,
            "zero_engine_step: %d of accum_steps = %d micro-steps complete; in "
            "the current one %d of %d %s ready%s%s%s%s%s (a micro-step is "
            "complete when every group is marked ready)",
            e->micro.done, e->cfg.accum_steps, e->micro.ready_groups, e->layout.total_parts,
            e->layout.total_parts == e->layout.ngroups ? "groups are"
                                                       : "gradient parts (of all groups) are",
            nh ? "; never marked ready after zero_engine_grads (call "
                 "zero_engine_grads_ready): "
               : "",
            nh ? handed : "",
            nn && e->micro.ready_groups + nh > 0 ? "; gradients never asked for: " : "",
            nn && e->micro.ready_groups + nh > 0 ? never : "",
            e->micro.done + 1 < e->cfg.accum_steps && nn + nh == 0 ? "; more micro-steps are due"
                                                                   : "");
    }
    for (g = 0; g < e->layout.ngroups; g++)
        if (e->layout.groups[g].refs > 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_engine_step: group %d is still gathered (%d references); "
                              "release every group before the step",
                              g, e->layout.groups[g].refs);
    return ZERO_OK;
}

/* Stages 1-2 (stage 3: persistent groups) all-gather the updated param shards: the end of
   a step, or of zero_engine_finish_update. COLLECTIVE. */
static zero_result zero__eng_gather_updated(zero_engine *e)
{
    int g;
    if (e->cfg.stage >= 1 && e->cfg.world > 1) {
        int any = 0;
        for (g = 0; g < e->layout.ngroups; g++)
            any |= e->cfg.stage < 3 || e->layout.groups[g].persistent;
        if (any) {
            ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM),
                          "step: event");
            ZERO__ENG_TRY(e, zero__eng_group_start(e), "step: group_start");
            for (g = 0; g < e->layout.ngroups; g++) {
                if (e->cfg.stage == 3 && !e->layout.groups[g].persistent) continue;
                if (e->layout.groups[g].shard_numel == 0) continue; /* only frozen tensors */
                ZERO__ENG_TRY_IN_GROUP(e,
                                       zero__eng_all_gather(e, zero__eng_param_shard(e, g),
                                                            zero__eng_param_whole(e, g),
                                                            e->layout.groups[g].shard_numel,
                                                            e->cfg.param_dtype, g,
                                                            ZERO_ROLE_PARAM_UPDATE),
                                       "step: all_gather of updated params");
            }
            ZERO__ENG_TRY(e, zero__eng_group_end(e), "step: group_end");
            ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE),
                          "step: event");
        }
    }
    return ZERO_OK;
}

static zero_result zero__eng_check_set(zero_engine *e); /* debug mode: below set_tensor */

ZERODEF zero_result zero_engine_step(zero_engine *e, zero_step_info *info)
{
    zero_result r = zero__eng_usable(e, "zero_engine_step");
    zero_device *dev;
    float unscale, host[3], scale_used;
    double *sumsq;
    float *flag, *mul;
    int g, t, at_min = 0;
    if (r != ZERO_OK) return r;
    if ((r = zero__eng_step_settle(e)) != ZERO_OK) return r; /* the previous step's verdict */
    dev = e->cfg.dev;
    if ((r = zero__eng_step_ready(e)) != ZERO_OK) return r;
    if (e->debug.guards && e->debug.set_pending && (r = zero__eng_check_set(e)) != ZERO_OK) return r;
    /* Prefetched groups hold the old values, and so will hpZ's secondary parts. */
    zero__eng_drop_prefetched(e);
    zero__eng_hpz_stale(e, -1);
    scale_used = e->opt.scaler.scale;
    unscale = (float)(1.0 / ((double)scale_used * (double)e->topo.world_all *
                             (double)e->cfg.accum_steps));
    sumsq = (double *)(void *)e->buf.scratch;
    flag = (float *)(void *)(e->buf.scratch + 8);
    mul = (float *)(void *)(e->buf.scratch + 12);

    /* 0. MiCS: the accumulated shards summed across the replicas (the host tier does it
       after its last add, in zero__eng_host_grad_norm). */
    if (e->topo.replica && zero__tier_where(e, ZERO_MEM_GRAD, -1) == ZERO_TIER_DEVICE) {
        ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM), "step: event");
        for (g = 0; g < e->layout.ngroups; g++)
            if (e->layout.groups[g].shard_numel)
                ZERO__ENG_TRY(e, zero__eng_replica_reduce(e, zero__eng_grad_acc_shard(e, g),
                                                          e->layout.groups[g].shard_numel, g),
                              "step: all_reduce of the gradients across the MiCS replicas");
    }
    /* 1. non-finite flag and sum of squares over this rank's shard of every group (in the
       gradients' tier). */
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE), "step: event");
    ZERO__ENG_TRY(e, dev->ops->fill_zero(dev, ZERO_QUEUE_COMPUTE, e->buf.scratch, 20),
                  "step: fill");
    if ((r = zero__tier_grad_check(e, flag, sumsq)) != ZERO_OK) return r;
    /* 2. every rank agrees on skipping and on the norm. */
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM), "step: event");
    ZERO__ENG_TRY(e, zero__eng_all_reduce(e, flag, flag, 1, ZERO_F32, ZERO_OP_MAX, 1, -1,
                                          ZERO_ROLE_FLAG),
                  "step: all_reduce of the inf/NaN flag");
    ZERO__ENG_TRY(e, zero__eng_all_reduce(e, sumsq, sumsq, 1, ZERO_F64, ZERO_OP_SUM, 1, -1,
                                          ZERO_ROLE_NORM),
                  "step: all_reduce of the sum of squares");
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE), "step: event");
    ZERO__ENG_TRY(e, dev->ops->grad_mul(dev, ZERO_QUEUE_COMPUTE, sumsq, flag, unscale,
                                        e->cfg.desc.clip_norm, mul),
                  "step: grad_mul");
    /* 3. Adam/AdamW over this rank's shard, where master, m and v live. */
    for (t = 0; t < e->layout.ntensors && r == ZERO_OK; t++)
        r = zero__eng_tensor_coefs(e, t, e->opt.lr_mul[t], e->opt.wd[t], e->opt.step + 1,
                                   &e->opt.coefs[t]);
    e->opt.sr_key = zero_sr_key(e->cfg.desc.optimizer_seed, e->opt.step + 1);
    if (r != ZERO_OK) return zero__eng_break(e, r, "step: Adam constants");
    if ((r = zero__tier_adam(e, mul, flag)) != ZERO_OK) return r;
    /* 4. stages 1-2 (stage 3: persistent groups) all-gather the updated param shards. */
    if ((r = zero__eng_gather_updated(e)) != ZERO_OK) return r;
    /* 5. one download: flag, multiplier, norm (async_step: later, on the offload queue). */
    if (e->cfg.desc.async_step && !info) {
        if (!e->async.after_step)
            ZERO__ENG_TRY(e, dev->ops->event_create(dev, &e->async.after_step), "step: event");
        ZERO__ENG_TRY(e, dev->ops->record(dev, ZERO_QUEUE_COMPUTE, e->async.after_step),
                      "step: event");
        ZERO__ENG_TRY(e, dev->ops->wait(dev, ZERO_QUEUE_OFFLOAD, e->async.after_step),
                      "step: event");
        e->async.pending = 1;
        e->async.scale_used = scale_used;
    } else {
        ZERO__ENG_TRY(e, dev->ops->download(dev, ZERO_QUEUE_COMPUTE, host, e->buf.scratch + 8,
                                            3 * sizeof(float)),
                      "step: download");
        ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_COMPUTE), "step: sync");
        at_min = zero__eng_step_verdict(e, host, scale_used);
    }
    e->micro.done = 0;
    e->micro.ready_groups = 0;
    for (g = 0; g < e->layout.ngroups; g++) e->layout.groups[g].grads_state = ZERO__GRADS_NONE;
    e->traffic.last = e->traffic.cur;
    memset(&e->traffic.cur, 0, sizeof e->traffic.cur);
    if (info) *info = e->async.last_info;
    if (at_min) return zero__eng_at_min_error(e);
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_finish_update(zero_engine *e)
{
    zero_result r = zero__eng_usable(e, "zero_engine_finish_update");
    int g;
    if (r != ZERO_OK) return r;
    if (e->micro.done != 0 || e->micro.ready_groups != 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_finish_update: in the middle of a step (call it between "
                          "zero_engine_step and the next micro-step)");
    for (g = 0; g < e->layout.ngroups; g++)
        if (e->layout.groups[g].refs > 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "zero_engine_finish_update: group %d is still gathered (%d "
                              "references); release every group first",
                              g, e->layout.groups[g].refs);
    if (!e->dpu.on) return ZERO_OK;
    if ((r = zero__dpu_join(e)) != ZERO_OK) return r;
    if (!e->dpu.publish) return ZERO_OK; /* the same on every rank: no collective either */
    zero__eng_drop_prefetched(e);        /* prefetched groups hold the old values, */
    zero__eng_hpz_stale(e, -1);          /* and so do hpZ's secondary parts */
    if ((r = zero__dpu_publish(e)) != ZERO_OK) return r;
    return zero__eng_gather_updated(e);
}

/* ---- tensors in and out ------------------------------------------------------------------ */

/* The parts of tensor t this rank stores: params [p0, p0 + pn) and master [m0, m0 + mn), in
   tensor coordinates, and the device addresses of their first elements. */
typedef struct zero__eng_parts {
    size_t p0, pn, m0, mn;
    unsigned char *param;
    size_t master_off; /* element offset in master / m / v */
    int param_host;    /* param is in the host tier (offload_param); NULL on NVMe */
    size_t param_off;  /* stage 3 partitioned: element offset of param in the group's shard */
} zero__eng_parts;

static zero_result zero__eng_parts_of(const zero_engine *e, int t, zero__eng_parts *out)
{
    zero_tensor_info ti;
    zero_range seg, sh;
    const zero__eng_group *eg;
    zero_result r;
    memset(&ti, 0, sizeof ti);
    memset(&seg, 0, sizeof seg);
    memset(&sh, 0, sizeof sh);
    r = zero_plan_tensor(e->layout.plan, t, &ti);
    if (r != ZERO_OK) return r;
    eg = &e->layout.groups[ti.group];
    r = zero_plan_intersect(e->layout.plan, t, e->cfg.rank, &seg);
    if (r == ZERO_OK) r = zero_plan_shard(e->layout.plan, ti.group, e->cfg.rank, &sh);
    if (r != ZERO_OK) return r;
    out->m0 = seg.numel ? seg.offset - ti.offset : 0;
    out->mn = ti.frozen ? 0 : seg.numel; /* frozen: no master, m, v */
    out->master_off = e->cfg.stage == 0 ? eg->off_gwhole + seg.offset
                                    : eg->off_shard + (seg.offset - sh.offset);
    if (e->cfg.stage < 3 || eg->persistent) {
        out->p0 = 0;
        out->pn = ti.numel;
        out->param =
            e->buf.param +
            ((e->cfg.stage < 3 ? eg->off_whole : eg->off_param) + ti.offset) * e->cfg.param_size;
    } else {
        out->p0 = out->m0;
        out->pn = seg.numel;
        out->param_off = zero__plan_shard_pos(e->layout.plan, t, e->cfg.rank, seg.offset);
        out->param = e->nvme.param_file
                         ? NULL
                         : (e->cfg.params_offloaded ? e->host.params : e->buf.param) +
                               (eg->off_param + out->param_off) * e->cfg.param_size;
    }
    out->param_host = e->cfg.params_offloaded && e->cfg.stage == 3 && !eg->persistent;
    return ZERO_OK;
}

/* zero_engine_set_tensor; conv (NULL: allocated here) holds the params this rank stores,
   converted (numel * param size bytes at most), so that a caller that allocated it first
   meets no allocation failure half way. */
static zero_result zero__eng_set_tensor(zero_engine *e, int tensor, const float *values, void *conv)
{
    zero_result r = zero__eng_usable(e, "zero_engine_set_tensor");
    zero_tensor_info ti;
    zero__eng_parts pt;
    void *tmp = NULL;
    if (r != ZERO_OK) return r;
    if (tensor < 0 || tensor >= e->layout.ntensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_engine_set_tensor: tensor %d unknown",
                          tensor);
    if (!values)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_set_tensor: values is NULL");
    if (e->micro.done != 0 || e->micro.ready_groups != 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_set_tensor: in the middle of a step");
    memset(&ti, 0, sizeof ti);
    if ((r = zero_plan_tensor(e->layout.plan, tensor, &ti)) != ZERO_OK) return r;
    /* The same rule at every stage, so a program that runs at stage 0 runs at stage 3. */
    if (e->layout.groups[ti.group].refs > 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "zero_engine_set_tensor: group %d is gathered (release it first)",
                          ti.group);
    if ((r = zero__eng_parts_of(e, tensor, &pt)) != ZERO_OK) return r;
    if ((r = zero__dpu_join(e)) != ZERO_OK) return r; /* delayed_update: it writes master */
    /* A prefetch's all-gather may still be reading the shard on COMM: order the uploads
       after it; the prefetched copy is stale and dropped. */
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE),
                  "zero_engine_set_tensor: event");
    if (e->cfg.stage == 3 && e->layout.groups[ti.group].poff != ZERO__ENG_NONE) {
        zero__eng_drop_params(e, ti.group); /* a prefetch, never used */
        e->prefetch.stats.evictions++;
        e->prefetch.stats.prefetch_wasted++;
    }
    zero__eng_hpz_stale(e, ti.group);
    if (e->cfg.stage == 0 && !ti.frozen) { /* stage 0 holds the whole master */
        pt.m0 = 0;
        pt.mn = ti.numel;
        pt.master_off = e->layout.groups[ti.group].off_gwhole + ti.offset;
    }
    /* NVMe param shards are converted straight into the shard cache below: no staging */
    if (pt.pn > 0 && e->cfg.param_dtype != ZERO_F32 && !(pt.param_host && e->nvme.param_file)) {
        tmp = conv ? conv : zero__alloc(&e->cfg.desc.allocator, pt.pn * e->cfg.param_size);
        if (!tmp) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_set_tensor");
        r = zero_convert(tmp, e->cfg.param_dtype, values + pt.p0, ZERO_F32, pt.pn, ZERO_SIMD_AUTO);
        if (r != ZERO_OK) {
            if (tmp != conv) zero__free(&e->cfg.desc.allocator, tmp);
            return r;
        }
    }
    /* the host tier: an upload of a prefetch may still read the offloaded shard */
    if (e->cfg.opt_offloaded) r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_OFFLOAD);
    /* read, change, write back */
    if (r == ZERO_OK && pt.pn > 0 && pt.param_host && e->nvme.param_file) {
        unsigned char *hp = NULL;
        r = zero__eng_hparam_get(e, ti.group, &hp);
        if (r == ZERO_OK && e->cfg.param_dtype != ZERO_F32)
            r = zero_convert(hp + pt.param_off * e->cfg.param_size, e->cfg.param_dtype, values + pt.p0,
                             ZERO_F32, pt.pn, ZERO_SIMD_AUTO);
        else if (r == ZERO_OK)
            memcpy(hp + pt.param_off * e->cfg.param_size, values + pt.p0, pt.pn * e->cfg.param_size);
        if (r == ZERO_OK) r = zero__eng_hparam_put(e, ti.group);
    } else if (r == ZERO_OK && pt.pn > 0 && pt.param_host)
        memcpy(pt.param, tmp ? (const void *)tmp : (const void *)(values + pt.p0),
               pt.pn * e->cfg.param_size);
    else if (r == ZERO_OK && pt.pn > 0)
        r = e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_COMPUTE, pt.param,
                                tmp ? (const void *)tmp : (const void *)(values + pt.p0),
                                pt.pn * e->cfg.param_size);
    if (r == ZERO_OK && pt.mn > 0 && e->cfg.opt_dtype == ZERO_BF16) {
        /* bf16 states: the master is the value rounded to nearest even (no randomness) */
        void *mb = zero__alloc(&e->cfg.desc.allocator, pt.mn * 2u);
        if (!mb) r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_set_tensor: %zu bytes",
                                pt.mn * 2u);
        if (r == ZERO_OK)
            r = zero_convert(mb, ZERO_BF16, values + pt.m0, ZERO_F32, pt.mn, ZERO_SIMD_AUTO);
        if (r == ZERO_OK && e->cfg.opt_offloaded)
            memcpy(zero__opt_at(e, e->opt.master, pt.master_off), mb, pt.mn * 2u);
        else if (r == ZERO_OK)
            r = e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_COMPUTE,
                                        zero__opt_at(e, e->opt.master, pt.master_off), mb,
                                        pt.mn * 2u);
        if (r == ZERO_OK) r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE);
        zero__free(&e->cfg.desc.allocator, mb);
    } else if (r == ZERO_OK && pt.mn > 0 && e->cfg.opt_offloaded)
        r = zero__eng_opt_io(e, 0, pt.master_off, pt.mn, NULL, values + pt.m0);
    else if (r == ZERO_OK && pt.mn > 0)
        r = e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_COMPUTE, e->opt.master + pt.master_off,
                                values + pt.m0, pt.mn * sizeof(float));
    if (r == ZERO_OK) r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE);
    if (r == ZERO_OK) r = zero__dpu_set(e, pt.master_off, values + pt.m0, pt.mn);
    if (tmp != conv) zero__free(&e->cfg.desc.allocator, tmp);
    if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_set_tensor: upload");
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_set_tensor(zero_engine *e, int tensor, const float *values)
{
    zero_result r = zero__eng_set_tensor(e, tensor, values, NULL);
    if (r == ZERO_OK && e->debug.guards) { /* debug mode: remember a hash, compared at the next step */
        const zero_plan *plan = e->layout.plan;
        int T = zero_plan_num_tensors(plan);
        zero_tensor_info ti;
        uint64_t h = 0xcbf29ce484222325ull;
        size_t i;
        const unsigned char *b = (const unsigned char *)values;
        if (!e->debug.set_hash &&
            !(e->debug.set_hash = (uint64_t *)zero__alloc_zeroed(&e->cfg.desc.allocator, (size_t)T * 8u)))
            return ZERO_OK; /* the check is best effort: no memory, no check */
        if (zero_plan_tensor(plan, tensor, &ti) != ZERO_OK) return ZERO_OK;
        for (i = 0; i < ti.numel * sizeof(float); i++) h = (h ^ b[i]) * 0x100000001b3ull;
        e->debug.set_hash[tensor] = h | 1u; /* never 0: 0 is "not set" */
        e->debug.set_pending = 1;
    }
    return r;
}

/* Debug mode, at a step after set_tensor calls: every rank must have set the same values
   (ranks as threads share a static buffer by mistake; docs/engine.md). COLLECTIVE (a user-
   tagged all-reduce of each tensor's hash, its max and its min). MISMATCH naming the first
   tensor whose hashes differ. */
static zero_result zero__eng_check_set(zero_engine *e)
{
    const zero_plan *plan = e->layout.plan;
    int T = zero_plan_num_tensors(plan), t;
    double *v;
    zero_result r;
    e->debug.set_pending = 0;
    if (!(v = (double *)zero__alloc(&e->cfg.desc.allocator, (size_t)T * 4u * sizeof(double))))
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_step: debug guards: %d tensors' hashes", T);
    for (t = 0; t < T; t++) {
        uint64_t h = e->debug.set_hash ? e->debug.set_hash[t] : 0;
        v[4 * t] = (double)(h >> 32), v[4 * t + 1] = (double)(h & 0xffffffffu);
        v[4 * t + 2] = -v[4 * t], v[4 * t + 3] = -v[4 * t + 1];
    }
    r = zero_engine_allreduce(e, v, (size_t)T * 4u, ZERO_F64, ZERO_OP_MAX);
    for (t = 0; t < T && r == ZERO_OK; t++)
        if (v[4 * t] != -v[4 * t + 2] || v[4 * t + 1] != -v[4 * t + 3]) {
            zero_tensor_info ti;
            zero_plan_tensor(plan, t, &ti);
            r = zero__fail(ZERO_ERROR_MISMATCH,
                           "zero_engine_step: debug guards: ranks set different values for tensor %d ('%s') "
                           "with zero_engine_set_tensor (every rank must pass the same; ranks of the local "
                           "comm are threads: a static buffer is shared by all of them)", t, ti.name);
        }
    zero__free(&e->cfg.desc.allocator, v);
    return r;
}

ZERODEF zero_result zero_engine_read_tensor(zero_engine *e, int tensor, zero_state_kind kind,
                                            void *host_dst, zero_range *out_range)
{
    zero_result r = zero__eng_usable(e, "zero_engine_read_tensor");
    zero__eng_parts pt;
    const void *src;
    size_t off, n, esz;
    if (r != ZERO_OK) return r;
    if ((r = zero__dpu_join(e)) != ZERO_OK) return r; /* delayed_update: master, m, v complete */
    if (tensor < 0 || tensor >= e->layout.ntensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_engine_read_tensor: tensor %d unknown",
                          tensor);
    if (!host_dst)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_read_tensor: host_dst is NULL");
    if ((r = zero__eng_parts_of(e, tensor, &pt)) != ZERO_OK) return r;
    if (kind != ZERO_STATE_PARAM && (e->layout.tensor_flags[tensor] & ZERO_TENSOR_FROZEN))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_read_tensor: tensor '%.200s' is frozen "
                          "(ZERO_TENSOR_FROZEN): it has no %s (no optimizer state, no gradient); "
                          "read its params (ZERO_STATE_PARAM)",
                          zero__eng_tensor_name(e, tensor),
                          kind == ZERO_STATE_MASTER ? "master weights"
                          : kind == ZERO_STATE_M    ? "first moment"
                                                    : "second moment");
    switch (kind) {
    case ZERO_STATE_PARAM: src = pt.param; off = pt.p0; n = pt.pn; esz = e->cfg.param_size; break;
    case ZERO_STATE_MASTER: src = zero__opt_at(e, e->opt.master, pt.master_off); off = pt.m0; n = pt.mn; esz = e->cfg.opt_size; break;
    case ZERO_STATE_M: src = zero__opt_at(e, e->opt.m, pt.master_off); off = pt.m0; n = pt.mn; esz = e->cfg.opt_size; break;
    case ZERO_STATE_V: src = zero__opt_at(e, e->opt.v, pt.master_off); off = pt.m0; n = pt.mn; esz = e->cfg.opt_size; break;
    default:
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_read_tensor: kind = %d",
                          (int)kind);
    }
    if (n > 0 && kind != ZERO_STATE_PARAM && e->cfg.opt_dtype == ZERO_BF16) {
        /* bf16 states: into the upper half of the caller's range, widened below */
        void *hd = (uint16_t *)(void *)((float *)host_dst + off + n) - n;
        if (e->cfg.opt_offloaded) {
            memcpy(hd, src, n * 2u);
        } else {
            r = e->cfg.dev->ops->download(e->cfg.dev, ZERO_QUEUE_COMPUTE, hd, src, n * 2u);
            if (r == ZERO_OK) r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE);
            if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_read_tensor: download");
        }
    } else if (n > 0 && kind != ZERO_STATE_PARAM && e->cfg.opt_offloaded) {
        r = zero__eng_opt_io(e, (int)kind - 1, pt.master_off, n, (float *)host_dst + off, NULL);
        if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_read_tensor: offload tier read");
    } else if (n > 0 && kind == ZERO_STATE_PARAM && pt.param_host && e->nvme.param_file) {
        unsigned char *hp = NULL;
        zero_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        r = zero_plan_tensor(e->layout.plan, tensor, &ti);
        if (r == ZERO_OK) r = zero__eng_hparam_get(e, ti.group, &hp);
        if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_read_tensor: NVMe read");
        memcpy((unsigned char *)host_dst + off * esz, hp + pt.param_off * e->cfg.param_size,
               n * esz);
    } else if (n > 0 && (kind == ZERO_STATE_PARAM ? pt.param_host : e->cfg.opt_offloaded)) {
        memcpy((unsigned char *)host_dst + off * esz, src, n * esz); /* the host tier */
    } else if (n > 0) {
        r = e->cfg.dev->ops->download(e->cfg.dev, ZERO_QUEUE_COMPUTE,
                                  (unsigned char *)host_dst + off * esz, src, n * esz);
        if (r == ZERO_OK) r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE);
        if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_read_tensor: download");
    }
    if (n > 0 && kind != ZERO_STATE_PARAM && e->cfg.opt_dtype == ZERO_BF16) {
        /* bf16 states arrived in the upper half of the caller's fp32 range (its own
           elements only: other ranks may fill the rest of the buffer): widen, first first
           (f[i] never reaches an h[j], j > i, not yet read) */
        float *f = (float *)host_dst + off;
        const uint16_t *h = (const uint16_t *)(void *)(f + n) - n;
        size_t i;
        for (i = 0; i < n; i++) f[i] = zero_bf16_to_f32(h[i]);
    }
    if (out_range) {
        out_range->offset = off;
        out_range->numel = n;
    }
    return ZERO_OK;
}

/* ---- Engine: offload_states / reload_states ----------------------------------------------
   What this part owns: the device buffers moved off the device between training phases
   (zero_engine_offload_states), their host copies or file, and putting them back. */

enum { ZERO__SOFF_PARAM, ZERO__SOFF_HPZ, ZERO__SOFF_GRAD_USER, ZERO__SOFF_GRAD_ACC, ZERO__SOFF_MASTER, ZERO__SOFF_M,
       ZERO__SOFF_V, ZERO__SOFF_N };

struct zero__soff {
    unsigned what;             /* the bits asked                                          */
    zero_offload_device tier;
    int n;                     /* buffers moved                                           */
    int slot[ZERO__SOFF_N];    /* which engine pointer each is (ZERO__SOFF_*)             */
    int alloc[ZERO__SOFF_N];   /* its entry in e->buf.allocs                              */
    void *host[ZERO__SOFF_N];  /* CPU: the copy                                           */
    uint64_t off[ZERO__SOFF_N]; /* NVMe: its range in file                                */
    zero_io *io;               /* NVMe: the engine's I/O engine, or one made for this     */
    int own_io;
    zero_io_file *file;
    uint64_t file_bytes;
};

/* The engine pointer of slot k (NULL when that buffer does not exist or aliases another). */
static void *zero__soff_get(const zero_engine *e, int k)
{
    switch (k) {
    case ZERO__SOFF_PARAM: return e->buf.param;
    case ZERO__SOFF_HPZ: return e->topo.hpz_buf;
    case ZERO__SOFF_GRAD_USER: return e->buf.grad_user;
    case ZERO__SOFF_GRAD_ACC:
        if (e->cfg.opt_offloaded) return e->opt.dgrad;
        return e->layout.acc_is_user_grad ? NULL : e->buf.grad_acc;
    case ZERO__SOFF_MASTER: return e->cfg.opt_offloaded ? (void *)e->opt.dmaster : (void *)e->opt.master;
    case ZERO__SOFF_M: return e->cfg.opt_offloaded ? (void *)e->opt.dm : (void *)e->opt.m;
    default: return e->cfg.opt_offloaded ? (void *)e->opt.dv : (void *)e->opt.v;
    }
}

static void zero__soff_set(zero_engine *e, int k, void *p)
{
    switch (k) {
    case ZERO__SOFF_PARAM: e->buf.param = (unsigned char *)p; break;
    case ZERO__SOFF_HPZ: e->topo.hpz_buf = (unsigned char *)p; break;
    case ZERO__SOFF_GRAD_USER:
        e->buf.grad_user = (unsigned char *)p;
        if (e->layout.acc_is_user_grad) e->buf.grad_acc = (unsigned char *)p;
        break;
    case ZERO__SOFF_GRAD_ACC:
        if (e->cfg.opt_offloaded) e->opt.dgrad = (unsigned char *)p;
        else e->buf.grad_acc = (unsigned char *)p;
        break;
    case ZERO__SOFF_MASTER:
        if (e->cfg.opt_offloaded) e->opt.dmaster = (float *)p;
        else e->opt.master = (float *)p;
        break;
    case ZERO__SOFF_M:
        if (e->cfg.opt_offloaded) e->opt.dm = (float *)p;
        else e->opt.m = (float *)p;
        break;
    default:
        if (e->cfg.opt_offloaded) e->opt.dv = (float *)p;
        else e->opt.v = (float *)p;
        break;
    }
}

/* The host copies, the file and the I/O engine of x (not the device buffers). */
static void zero__soff_release(zero_engine *e, struct zero__soff *x)
{
    int i;
    if (!x) return;
    for (i = 0; i < x->n; i++) zero__free(&e->cfg.desc.allocator, x->host[i]);
    zero_io_file_destroy(x->file);
    if (x->own_io) zero_io_destroy(x->io);
    zero__free(&e->cfg.desc.allocator, x);
}

/* destroy: what is offloaded is dropped with the engine (its device buffers are gone). */
static void zero__soff_free(zero_engine *e)
{
    int i;
    if (!e->soff) return;
    for (i = 0; i < e->soff->n; i++) {
        const zero__eng_allocation *a = &e->buf.allocs[e->soff->alloc[i]];
        zero__eng_host_tier *h = &e->host;
        if (e->soff->tier == ZERO_OFFLOAD_NVME) {
            e->nvme.mem[a->cat] -= a->bytes;
        } else {
            h->mem[a->cat] -= a->bytes;
            h->mem_total -= a->bytes;
        }
    }
    if (e->soff->file) e->nvme.mem_total -= (size_t)e->soff->file_bytes;
    zero__soff_release(e, e->soff);
    e->soff = NULL;
}

/* Every queue's work is done: a prefetch's all-gather may read the param shards, a step's
   upload the host tier, a held CUDA call a buffer. */
static zero_result zero__soff_quiesce(zero_engine *e)
{
    zero_device *dev = e->cfg.dev;
    zero_result r = dev->ops->sync(dev, ZERO_QUEUE_COMM);
    if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMPUTE);
    if (r == ZERO_OK && (e->cfg.opt_offloaded || e->async.after_step || e->act))
        r = dev->ops->sync(dev, ZERO_QUEUE_OFFLOAD);
    return r;
}

ZERODEF zero_result zero_engine_offload_states(zero_engine *e, unsigned what, zero_offload_device tier)
{
    static const char *fn = "zero_engine_offload_states";
    zero_result r = zero__eng_usable(e, fn);
    struct zero__soff *x;
    zero_device *dev;
    size_t maxb = 0;
    void *stage = NULL;
    int k, i, g;
    if (r != ZERO_OK) {
        if (e && e->soff)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "%s: the states are offloaded already (asked: 0x%x); call "
                              "zero_engine_reload_states first", fn, e->soff->what);
        return r;
    }
    if (what == 0 || (what & ~(unsigned)ZERO_STATES_ALL))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: what = 0x%x (an OR of ZERO_STATES_PARAMS, _GRADS, _MASTER, _M, _V)",
                          fn, what);
    if (tier != ZERO_OFFLOAD_CPU && tier != ZERO_OFFLOAD_NVME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: tier = %d (cpu or nvme)", fn, (int)tier);
    if (tier == ZERO_OFFLOAD_NVME && (!e->cfg.desc.nvme_path || !e->cfg.desc.nvme_path[0]))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: tier nvme needs nvme_path in the engine's descriptor", fn);
    if (e->micro.done != 0 || e->micro.ready_groups != 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "%s: in the middle of a step (%d micro-steps done, %d groups ready): "
                          "call it between zero_engine_step and the next micro-step",
                          fn, e->micro.done, e->micro.ready_groups);
    for (g = 0; g < e->layout.ngroups; g++) {
        if (e->layout.groups[g].refs > 0)
            return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: group %d is gathered (release it first)",
                              fn, g);
        if (e->layout.groups[g].grads_state != ZERO__GRADS_NONE)
            return zero__fail(ZERO_ERROR_INVALID_STATE,
                              "%s: group %d's gradient buffer is handed out (a micro-step is under "
                              "way)", fn, g);
    }
    if ((r = zero__eng_step_complete(e)) != ZERO_OK) return r; /* async_step: its verdict */
    dev = e->cfg.dev;
    if ((r = zero__soff_quiesce(e)) != ZERO_OK) return zero__eng_break(e, r, "zero_engine_offload_states: sync");
    x = (struct zero__soff *)zero__alloc_zeroed(&e->cfg.desc.allocator, sizeof *x);
    if (!x) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: bookkeeping", fn);
    x->what = what;
    x->tier = tier;
    for (k = 0; k < ZERO__SOFF_N; k++) { /* the device buffers of what */
        unsigned bit = k <= ZERO__SOFF_HPZ ? ZERO_STATES_PARAMS
                       : k <= ZERO__SOFF_GRAD_ACC ? ZERO_STATES_GRADS
                       : k == ZERO__SOFF_MASTER ? ZERO_STATES_MASTER
                       : k == ZERO__SOFF_M ? ZERO_STATES_M : ZERO_STATES_V;
        void *p = zero__soff_get(e, k);
        if (!(what & bit) || !p) continue;
        for (i = 0; i < e->buf.nallocs; i++)
            if (e->buf.allocs[i].ptr == p) break;
        if (i == e->buf.nallocs) continue; /* not a device buffer of its own (never: defensive) */
        x->slot[x->n] = k;
        x->alloc[x->n] = i;
        x->off[x->n] = x->file_bytes;
        x->file_bytes += zero_io_align_up((uint64_t)e->buf.allocs[i].bytes);
        if (e->buf.allocs[i].bytes > maxb) maxb = e->buf.allocs[i].bytes;
        x->n++;
    }
    if (tier == ZERO_OFFLOAD_NVME && x->n > 0) {
        if (e->nvme.io) x->io = e->nvme.io;
        else {
            zero_io_desc iod;
            memset(&iod, 0, sizeof iod);
            iod.block_size = e->cfg.desc.block_size;
            iod.queue_depth = e->cfg.desc.queue_depth;
            iod.allocator = e->cfg.desc.allocator;
            r = zero_io_create(&iod, &x->io);
            x->own_io = r == ZERO_OK;
        }
        if (r == ZERO_OK)
            r = zero_io_file_create(x->io, e->cfg.desc.nvme_path, "states", e->cfg.rank, x->file_bytes,
                                    &x->file);
        if (r == ZERO_OK) r = zero_io_buffer_alloc(x->io, (size_t)zero_io_align_up((uint64_t)maxb), &stage);
    }
    /* copy everything out first: a failure changes nothing */
    for (i = 0; i < x->n && r == ZERO_OK; i++) {
        const zero__eng_allocation *a = &e->buf.allocs[x->alloc[i]];
        void *dst = stage;
        if (tier == ZERO_OFFLOAD_CPU) {
            dst = x->host[i] = zero__alloc(&e->cfg.desc.allocator, a->bytes);
            if (!dst) {
                r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: %zu bytes of host memory (%s)", fn,
                               a->bytes, zero_mem_category_name(a->cat));
                break;
            }
        }
        r = dev->ops->download(dev, ZERO_QUEUE_COMPUTE, dst, a->ptr, a->bytes);
        if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMPUTE);
        if (r == ZERO_OK && tier == ZERO_OFFLOAD_NVME) {
            zero_io_ticket t = 0;
            r = zero_io_write(x->file, x->off[i], stage, a->bytes, &t);
            if (r == ZERO_OK) r = zero_io_wait(x->io, t);
        }
    }
    if (stage) zero_io_buffer_free(x->io, stage);
    if (r != ZERO_OK) {
        char prev[400];
        zero__eng_copy_error(prev, sizeof prev);
        zero__soff_release(e, x);
        return zero__fail(r, "%s: nothing moved: %.380s", fn, prev);
    }
    for (i = 0; i < x->n; i++) { /* then free the device buffers */
        zero__eng_allocation *a = &e->buf.allocs[x->alloc[i]];
        r = dev->ops->free(dev, a->ptr);
        if (r != ZERO_OK) return zero__eng_break(e, r, "zero_engine_offload_states: free");
        a->ptr = NULL;
        zero__soff_set(e, x->slot[i], NULL);
        e->buf.mem[a->cat] -= a->bytes;
        e->buf.mem_total -= a->bytes;
        if (tier == ZERO_OFFLOAD_NVME) {
            e->nvme.mem[a->cat] += a->bytes;
        } else {
            e->host.mem[a->cat] += a->bytes;
            if (e->host.mem[a->cat] > e->host.mem_peak[a->cat]) e->host.mem_peak[a->cat] = e->host.mem[a->cat];
            e->host.mem_total += a->bytes;
            if (e->host.mem_total > e->host.mem_peak_total) e->host.mem_peak_total = e->host.mem_total;
        }
    }
    if (x->file) e->nvme.mem_total += (size_t)x->file_bytes;
    e->soff = x;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_reload_states(zero_engine *e)
{
    static const char *fn = "zero_engine_reload_states";
    struct zero__soff *x;
    zero_device *dev;
    void *got[ZERO__SOFF_N], *stage = NULL;
    size_t maxb = 0;
    zero_result r = ZERO_OK;
    int i, n;
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: engine is NULL", fn);
    if (!e->soff) return zero__eng_usable(e, fn); /* nothing offloaded: nothing to do */
    x = e->soff;
    dev = e->cfg.dev;
    for (i = 0; i < x->n; i++)
        if (e->buf.allocs[x->alloc[i]].bytes > maxb) maxb = e->buf.allocs[x->alloc[i]].bytes;
    if (x->tier == ZERO_OFFLOAD_NVME && x->n > 0)
        r = zero_io_buffer_alloc(x->io, (size_t)zero_io_align_up((uint64_t)maxb), &stage);
    for (n = 0; n < x->n && r == ZERO_OK; n++) {
        const zero__eng_allocation *a = &e->buf.allocs[x->alloc[n]];
        const void *src = x->host[n];
        got[n] = NULL;
        r = dev->ops->alloc(dev, a->bytes, a->cat, &got[n]);
        if (r != ZERO_OK) break;
        if (x->tier == ZERO_OFFLOAD_NVME) {
            zero_io_ticket t = 0;
            r = zero_io_read(x->file, x->off[n], stage, a->bytes, &t);
            if (r == ZERO_OK) r = zero_io_wait(x->io, t);
            src = stage;
        }
        if (r == ZERO_OK) r = dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, got[n], src, a->bytes);
        if (r == ZERO_OK) r = dev->ops->sync(dev, ZERO_QUEUE_COMPUTE);
        if (r != ZERO_OK) {
            n++; /* got[n] is freed below */
            break;
        }
    }
    if (stage) zero_io_buffer_free(x->io, stage);
    if (r != ZERO_OK) { /* the states stay offloaded: give back what was taken */
        char prev[400];
        zero__eng_copy_error(prev, sizeof prev);
        for (i = 0; i < n; i++)
            if (got[i]) (void)dev->ops->free(dev, got[i]);
        return zero__fail(r, "%s: the states stay offloaded (retry): %.380s", fn, prev);
    }
    for (i = 0; i < x->n; i++) {
        zero__eng_allocation *a = &e->buf.allocs[x->alloc[i]];
        a->ptr = got[i];
        zero__soff_set(e, x->slot[i], got[i]);
        e->buf.mem[a->cat] += a->bytes;
        if (e->buf.mem[a->cat] > e->buf.mem_peak[a->cat]) e->buf.mem_peak[a->cat] = e->buf.mem[a->cat];
        e->buf.mem_total += a->bytes;
        if (e->buf.mem_total > e->buf.mem_peak_total) e->buf.mem_peak_total = e->buf.mem_total;
    }
    zero__soff_free(e); /* the host copies, the file, their accounting */
    return ZERO_OK;
}

/* ---- queries ----------------------------------------------------------------------------- */

ZERODEF float zero_engine_loss_scale(const zero_engine *e)
{
    /* async_step: the scale depends on the pending step's verdict (the engine is the
       caller's; const only promises the settings do not change). A failure breaks the
       engine and shows at its next call. */
    if (e && e->async.pending) (void)zero__eng_step_complete((zero_engine *)(uintptr_t)e);
    return e ? e->opt.scaler.scale : 1.0f;
}

ZERODEF int64_t zero_engine_step_count(const zero_engine *e)
{
    if (e && e->async.pending) (void)zero__eng_step_complete((zero_engine *)(uintptr_t)e);
    return e ? e->opt.step : 0;
}

ZERODEF zero_result zero_engine_set_lr(zero_engine *e, double lr)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_set_lr: engine is NULL");
    if (!(lr >= 0.0) || isinf(lr))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_set_lr: lr = %g (finite, >= 0)",
                          lr);
    e->opt.adam.lr = lr;
    e->cfg.desc.adam.lr = lr;
    return ZERO_OK;
}

/* The checks of the per-tensor calls: committed, a known tensor. */
static zero_result zero__eng_hparams_check(const zero_engine *e, int tensor, const char *fn)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: engine is NULL", fn);
    if (e->lifecycle == ZERO__ENG_CREATED || !e->opt.lr_mul)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: before zero_engine_commit", fn);
    if (tensor < 0 || tensor >= e->layout.ntensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "%s: tensor %d (the engine has 0..%d)", fn, tensor,
                          e->layout.ntensors - 1);
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_set_tensor_hparams(zero_engine *e, int tensor, double lr_mul,
                                                   double weight_decay)
{
    static const char fn[] = "zero_engine_set_tensor_hparams";
    zero_adam_coefs c;
    zero_result r = zero__eng_hparams_check(e, tensor, fn);
    if (r != ZERO_OK) return r;
    if (!(lr_mul >= 0.0) || isinf(lr_mul))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: tensor '%.200s': lr_mul = %g (finite, >= 0)", fn,
                          zero__eng_tensor_name(e, tensor), lr_mul);
    if (weight_decay != ZERO_WEIGHT_DECAY_DEFAULT && (!(weight_decay >= 0.0) || isinf(weight_decay)))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: tensor '%.200s': weight_decay = %g (finite and >= 0, or "
                          "ZERO_WEIGHT_DECAY_DEFAULT)",
                          fn, zero__eng_tensor_name(e, tensor), weight_decay);
    /* step 1 has the largest step size: constants finite there are finite at every step */
    if (zero__eng_tensor_coefs(e, tensor, lr_mul, weight_decay, 1, &c) != ZERO_OK)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: tensor '%.200s': lr %g x lr_mul %g with weight decay %g gives Adam "
                          "constants that are not finite in fp32",
                          fn, zero__eng_tensor_name(e, tensor), e->opt.adam.lr, lr_mul,
                          zero__eng_tensor_wd(e, tensor, weight_decay));
    e->opt.lr_mul[tensor] = lr_mul;
    e->opt.wd[tensor] = weight_decay;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_tensor_hparams(const zero_engine *e, int tensor, double *lr_mul,
                                               double *weight_decay)
{
    zero_result r = zero__eng_hparams_check(e, tensor, "zero_engine_tensor_hparams");
    if (r != ZERO_OK) return r;
    if (lr_mul) *lr_mul = e->opt.lr_mul[tensor];
    if (weight_decay) *weight_decay = zero__eng_tensor_wd(e, tensor, e->opt.wd[tensor]);
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_allreduce(zero_engine *e, void *buf, size_t count, zero_dtype dtype,
                                          zero_op op)
{
    zero_result r = zero__eng_usable(e, "zero_engine_allreduce");
    zero_device *dev;
    size_t es, per, done, n;
    if (r != ZERO_OK) return r;
    if (!buf && count)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_allreduce: buf is NULL (count %zu)",
                          count);
    if (dtype != ZERO_F32 && dtype != ZERO_F64)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_allreduce: dtype %s (f32 or f64)",
                          zero_dtype_name(dtype));
    if (op != ZERO_OP_SUM && op != ZERO_OP_MAX)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_allreduce: op %d (sum or max)",
                          (int)op);
    /* the scratch holds an enqueued step's verdict until it is read */
    if (e->async.pending && (r = zero__eng_step_complete(e)) != ZERO_OK) return r;
    dev = e->cfg.dev;
    es = zero_dtype_size(dtype);
    per = ZERO__ENG_SCRATCH_BYTES / es;
    /* Every piece's tag carries the whole count, and a count of 0 is still one (empty)
       collective: ranks that pass different counts disagree at their first piece, before any
       byte moves, instead of pairing one rank's extra piece with a peer's next call. */
    done = 0;
    do {
        unsigned char *host = count ? (unsigned char *)buf + done * es : NULL;
        n = count - done < per ? count - done : per;
        if (n)
            ZERO__ENG_TRY(e, dev->ops->upload(dev, ZERO_QUEUE_COMM, e->buf.scratch, host, n * es),
                          "allreduce: upload");
        zero__eng_tag(e, -1, ZERO_ROLE_USER);
        e->cfg.comm->tag.count = (uint64_t)count;
        r = e->cfg.comm->ops->all_reduce(e->cfg.comm, e->buf.scratch, e->buf.scratch, n, dtype, op,
                                     zero__eng_comm_queue(e));
        zero__eng_untag(e);
        if (r != ZERO_OK) return zero__eng_break(e, r, "allreduce: all_reduce of the user's values");
        zero__eng_count(e, ZERO_COLL_USER,
                        2.0 * (double)n * (double)(e->topo.world_all - 1) / (double)e->topo.world_all,
                        dtype, 2.0 * (double)n / (double)e->topo.world_all, e->topo.world_all,
                        e->topo.same_node);
        if (n) {
            ZERO__ENG_TRY(e, dev->ops->download(dev, ZERO_QUEUE_COMM, host, e->buf.scratch, n * es),
                          "allreduce: download");
            ZERO__ENG_TRY(e, dev->ops->sync(dev, ZERO_QUEUE_COMM), "allreduce: sync");
        }
        done += n;
    } while (done < count);
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_memory_usage(const zero_engine *e, zero_engine_memory *out)
{
    int k;
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_memory_usage: NULL");
    for (k = 0; k < ZERO_MEM_COUNT; k++) {
        out->bytes[k] = e->buf.mem[k];
        out->peak_bytes[k] = e->buf.mem_peak[k];
    }
    out->total_bytes = e->buf.mem_total;
    out->peak_total_bytes = e->buf.mem_peak_total;
    out->allocations = (size_t)e->buf.nallocs;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_nvme_stats(const zero_engine *e, zero_io_stats *out)
{
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_nvme_stats: NULL");
    memset(out, 0, sizeof *out);
    return e->nvme.io ? zero_io_get_stats(e->nvme.io, out) : ZERO_OK;
}

ZERODEF zero_result zero_engine_memory_tier(const zero_engine *e, zero_mem_tier tier,
                                            zero_engine_memory *out)
{
    int k;
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_memory_tier: NULL");
    if ((int)tier < 0 || tier >= ZERO_TIER_COUNT)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_memory_tier: tier = %d", (int)tier);
    if (tier == ZERO_TIER_DEVICE) return zero_engine_memory_usage(e, out);
    memset(out, 0, sizeof *out);
    if (tier == ZERO_TIER_NVME) { /* files: constant from commit to destroy */
        for (k = 0; k < ZERO_MEM_COUNT; k++) out->bytes[k] = out->peak_bytes[k] = e->nvme.mem[k];
        out->total_bytes = out->peak_total_bytes = e->nvme.mem_total;
        out->allocations = (e->nvme.opt_file ? 1u : 0u) + (e->nvme.param_file ? 1u : 0u) + (e->gnv && e->gnv->file ? 1u : 0u);
        zero__act_account(e, tier, out);
        return ZERO_OK;
    }
    for (k = 0; k < ZERO_MEM_COUNT; k++) {
        out->bytes[k] = e->host.mem[k];
        out->peak_bytes[k] = e->host.mem_peak[k];
    }
    out->total_bytes = e->host.mem_total;
    out->peak_total_bytes = e->host.mem_peak_total;
    out->allocations = (size_t)e->host.nallocs;
    zero__act_account(e, tier, out);
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_traffic(const zero_engine *e, zero_traffic *last_step,
                                        zero_traffic *total)
{
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_traffic: engine is NULL");
    if (last_step) *last_step = e->traffic.last;
    if (total) *total = e->traffic.total;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_gather_stats(const zero_engine *e, zero_gather_stats *out)
{
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_gather_stats: NULL");
    *out = e->prefetch.stats;
    return ZERO_OK;
}

/* ---- Engine: activation offload ---------------------------------------------------------
   What this part owns: the activation tier of zero_engine_stash / zero_engine_fetch: a host
   arena (CPU) or a file with host staging (NVMe), the key table, the allocator of regions in
   both spaces, the NVMe write-behind and read-ahead, and their accounting. The rest of the
   engine reaches it only through zero__act_resolve (create), zero__act_alloc (commit),
   zero__act_free (destroy) and zero__act_account (memory_tier).

   Ordering. Stash copies (device -> host) and fetch copies (host -> device) all run on
   ZERO_QUEUE_OFFLOAD, in order, so a host region freed by a fetch can take a later stash's
   copy without a host wait. The host itself touches staging only after a sync of OFFLOAD:
   NVMe writes of a stash's staging, and prefetch reads into staging, go to regions no copy
   still uses (a region whose upload is in flight waits in 'quar' until the next sync). */

#define ZERO__ACT_DEFAULT_STAGING ((size_t)64 << 20)

enum { ZERO__ACT_EMPTY = 0, ZERO__ACT_STASHED = 1, ZERO__ACT_FETCHED = 2, ZERO__ACT_FAILED = 3 };
/* NVMe: where a stashed key's bytes are in host staging. */
enum {
    ZERO__ACT_S_NONE = 0,  /* not in staging: in the file only                              */
    ZERO__ACT_S_COPY = 1,  /* the device copy into staging is enqueued, the host not synced  */
    ZERO__ACT_S_WRITE = 2, /* in staging; its file write in flight                           */
    ZERO__ACT_S_CLEAN = 3, /* in staging and in the file                                     */
    ZERO__ACT_S_READ = 4   /* a prefetch read into staging in flight                         */
};

typedef struct zero__act_region {
    size_t off, len;
} zero__act_region;

/* Regions taken in [0, cap), sorted by offset; first fit. */
typedef struct zero__act_space {
    size_t cap, used_bytes;
    zero__act_region *r;
    int n;
} zero__act_space;

typedef struct zero__act_key {
    int key, state;
    size_t bytes, span; /* as stashed; rounded up to ZERO_IO_ALIGN */
    uint64_t seq;       /* stash order */
    size_t off;         /* in the arena (CPU) or the file (NVMe) */
    int sstate;         /* NVMe: ZERO__ACT_S_* */
    size_t soff;        /* its staging region when sstate != NONE */
    zero_io_ticket ticket;
    int prefetched;     /* its staging copy came from a prefetch */
    char err[240];      /* FAILED: why its write failed */
} zero__act_key;

struct zero__act {
    zero_offload_device tier;
    unsigned char *host; /* CPU: the arena; NVMe: the staging */
    size_t host_bytes, file_bytes;
    int host_kind;       /* 0 allocator, 1 dev->ops->host_alloc, 2 zero_io_buffer_alloc */
    zero__act_space hs, fs; /* host arena or staging; the file (NVMe) */
    zero_io *io;
    zero_io_file *file;
    zero_event *ev_c2o, *ev_o2c;
    zero__act_key *keys; /* live keys and the recently fetched or dropped (remembered so a
                            second fetch names the cause), in no order */
    int nkeys, cap;      /* the spaces' region arrays hold 2 * cap + 2 */
    int ntomb;           /* of nkeys: FETCHED or EMPTY entries                          */
    int *index;          /* key -> 1 + its entry, open addressing with linear probing;
                            0 = free; 2 * cap slots (a power of two)                    */
    size_t *quar;        /* staging regions an upload in flight reads (cap + 1 slots) */
    int nquar, ncopy;    /* quarantined regions; keys in S_COPY */
    uint64_t seq;
    zero_activation_stats st;
};

static size_t zero__act_span(size_t bytes) { return (bytes + (ZERO_IO_ALIGN - 1u)) & ~(size_t)(ZERO_IO_ALIGN - 1u); }

static int zero__act_space_alloc(zero__act_space *s, size_t len, size_t *off)
{
    size_t at = 0;
    int i;
    for (i = 0; i <= s->n; i++) {
        size_t end = i < s->n ? s->r[i].off : s->cap;
        if (end - at >= len) {
            memmove(&s->r[i + 1], &s->r[i], (size_t)(s->n - i) * sizeof s->r[0]);
            s->r[i].off = at;
            s->r[i].len = len;
            s->n++;
            s->used_bytes += len;
            *off = at;
            return 1;
        }
        if (i < s->n) at = s->r[i].off + s->r[i].len;
    }
    return 0;
}

static void zero__act_space_free(zero__act_space *s, size_t off)
{
    int i;
    for (i = 0; i < s->n; i++)
        if (s->r[i].off == off) {
            s->used_bytes -= s->r[i].len;
            memmove(&s->r[i], &s->r[i + 1], (size_t)(s->n - i - 1) * sizeof s->r[0]);
            s->n--;
            return;
        }
}

/* create: checks and resolves the descriptor's activation fields. */
static zero_result zero__act_resolve(zero_engine_desc *d)
{
    const char *fn = "zero_engine_create";
    if ((int)d->offload_activations < 0 || d->offload_activations > ZERO_OFFLOAD_NVME)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_activations = %d (none, cpu or nvme)", fn,
                          (int)d->offload_activations);
    if (d->offload_activations == ZERO_OFFLOAD_NONE) return ZERO_OK;
    if (d->offload_activations == ZERO_OFFLOAD_CPU && d->activation_host_bytes == 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: offload_activations = cpu needs activation_host_bytes (the host "
                          "arena: the most bytes stashed at once)", fn);
    if (d->offload_activations == ZERO_OFFLOAD_NVME) {
        if (!d->nvme_path || !d->nvme_path[0])
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: offload_activations = nvme needs nvme_path (a directory for "
                              "the tier's file)", fn);
        if (d->activation_nvme_bytes == 0)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "%s: offload_activations = nvme needs activation_nvme_bytes (the "
                              "file's size: the most bytes stashed at once)", fn);
        if (d->activation_host_bytes == 0) d->activation_host_bytes = ZERO__ACT_DEFAULT_STAGING;
    }
    if (d->activation_host_bytes > SIZE_MAX - ZERO_IO_ALIGN ||
        d->activation_nvme_bytes > SIZE_MAX - ZERO_IO_ALIGN)
        return zero__fail(ZERO_ERROR_OVERFLOW, "%s: activation_host_bytes or activation_nvme_bytes "
                          "too large", fn);
    d->activation_host_bytes = zero__act_span(d->activation_host_bytes);
    d->activation_nvme_bytes = zero__act_span(d->activation_nvme_bytes);
    return ZERO_OK;
}

/* The key table: O(1) average per look-up through the index, and never larger than about
   four times the keys stashed now: fetched and dropped entries are remembered (a second
   fetch of a key says it was fetched) only until they outnumber the live ones (plus 16),
   then dropped in one pass, and the arrays shrink when a quarter of them is in use. */
static unsigned zero__act_slot(int key, int mask)
{
    return ((uint32_t)key * 2654435761u >> 7) & (unsigned)mask;
}

static void zero__act_index_put(struct zero__act *a, int i)
{
    int mask = 2 * a->cap - 1;
    unsigned h = zero__act_slot(a->keys[i].key, mask);
    while (a->index[h]) h = (h + 1) & (unsigned)mask;
    a->index[h] = i + 1;
}

static void zero__act_index_build(struct zero__act *a)
{
    int i;
    memset(a->index, 0, (size_t)(2 * a->cap) * sizeof *a->index);
    for (i = 0; i < a->nkeys; i++) zero__act_index_put(a, i);
}

/* The tables at 'cap' entries (cap >= nkeys, and room for every region in use). */
static zero_result zero__act_resize(zero_engine *e, int cap, const char *fn)
{
    struct zero__act *a = e->act;
    const zero_allocator *al = &e->cfg.desc.allocator;
    zero__act_key *k = (zero__act_key *)zero__alloc(al, (size_t)cap * sizeof *k);
    zero__act_region *hr = (zero__act_region *)zero__alloc(al, (size_t)(2 * cap + 2) * sizeof *hr);
    zero__act_region *fr = (zero__act_region *)zero__alloc(al, (size_t)(2 * cap + 2) * sizeof *fr);
    size_t *q = (size_t *)zero__alloc(al, (size_t)(cap + 1) * sizeof *q);
    int *ix = (int *)zero__alloc(al, (size_t)(2 * cap) * sizeof *ix);
    if (!k || !hr || !fr || !q || !ix) {
        zero__free(al, k);
        zero__free(al, hr);
        zero__free(al, fr);
        zero__free(al, q);
        zero__free(al, ix);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: the key table (%d keys)", fn, cap);
    }
    memset(k, 0, (size_t)cap * sizeof *k);
    if (a->nkeys) memcpy(k, a->keys, (size_t)a->nkeys * sizeof *k);
    if (a->hs.n) memcpy(hr, a->hs.r, (size_t)a->hs.n * sizeof *hr);
    if (a->fs.n) memcpy(fr, a->fs.r, (size_t)a->fs.n * sizeof *fr);
    if (a->nquar) memcpy(q, a->quar, (size_t)a->nquar * sizeof *q);
    zero__free(al, a->keys);
    zero__free(al, a->hs.r);
    zero__free(al, a->fs.r);
    zero__free(al, a->quar);
    zero__free(al, a->index);
    a->keys = k;
    a->hs.r = hr;
    a->fs.r = fr;
    a->quar = q;
    a->index = ix;
    a->cap = cap;
    zero__act_index_build(a);
    return ZERO_OK;
}

/* Forgets the fetched and dropped entries once they outnumber the live ones (plus 16), and
   shrinks the tables to half while a quarter holds entries. Between calls, never inside
   one that holds an entry's index. Best effort: a failed shrink keeps the larger tables. */
static void zero__act_tidy(zero_engine *e)
{
    struct zero__act *a = e->act;
    int i, n = 0, cap;
    if (a->ntomb > a->nkeys - a->ntomb + 16) {
        for (i = 0; i < a->nkeys; i++)
            if (a->keys[i].state == ZERO__ACT_STASHED || a->keys[i].state == ZERO__ACT_FAILED)
                a->keys[n++] = a->keys[i];
        a->nkeys = n;
        a->ntomb = 0;
        zero__act_index_build(a);
    }
    cap = a->cap;
    while (cap > 16 && 4 * (a->nkeys + 1) <= cap / 2 && 2 * (cap / 2) + 2 >= a->hs.n + 2 &&
           2 * (cap / 2) + 2 >= a->fs.n + 2 && cap / 2 >= a->nquar + 1)
        cap /= 2;
    if (cap < a->cap && zero__act_resize(e, cap, "zero_engine_stash") != ZERO_OK) zero_clear_error();
}

/* Room for one more key (and its regions) in the tables. */
static zero_result zero__act_reserve(zero_engine *e, const char *fn)
{
    struct zero__act *a = e->act;
    if (a->nkeys < a->cap) return ZERO_OK;
    zero__act_tidy(e);
    if (a->nkeys < a->cap) return ZERO_OK;
    return zero__act_resize(e, a->cap ? 2 * a->cap : 16, fn);
}

/* commit: the tier's host memory, file and events (nothing when offload_activations is
   NONE). On error what was made stays in e->act for zero__act_free. */
static zero_result zero__act_alloc(zero_engine *e)
{
    struct zero__act *a;
    zero_result r;
    void *p = NULL;
    if (e->cfg.desc.offload_activations == ZERO_OFFLOAD_NONE) return ZERO_OK;
    a = (struct zero__act *)zero__alloc(&e->cfg.desc.allocator, sizeof *a);
    if (!a) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "activation tier: %zu bytes", sizeof *a);
    memset(a, 0, sizeof *a);
    e->act = a;
    a->tier = e->cfg.desc.offload_activations;
    if ((r = zero__act_reserve(e, "activation tier")) != ZERO_OK) return r;
    if (e->cfg.dev->ops->event_create) {
        if ((r = e->cfg.dev->ops->event_create(e->cfg.dev, &a->ev_c2o)) != ZERO_OK) return r;
        if ((r = e->cfg.dev->ops->event_create(e->cfg.dev, &a->ev_o2c)) != ZERO_OK) return r;
    }
    if (a->tier == ZERO_OFFLOAD_NVME) {
        zero_io_desc iod;
        memset(&iod, 0, sizeof iod);
        iod.block_size = e->cfg.desc.block_size;
        iod.queue_depth = e->cfg.desc.queue_depth;
        iod.allocator = e->cfg.desc.allocator;
        if ((r = zero_io_create(&iod, &a->io)) != ZERO_OK) return r;
        if ((r = zero_io_file_create(a->io, e->cfg.desc.nvme_path, "act", e->topo.rank_all,
                                     (uint64_t)e->cfg.desc.activation_nvme_bytes, &a->file)) !=
            ZERO_OK)
            return r;
        a->file_bytes = (size_t)zero_io_file_size(a->file);
        a->fs.cap = a->file_bytes;
    }
    if (e->cfg.desc.pin_memory > 0 && e->cfg.dev->ops->host_alloc && e->cfg.dev->ops->host_free) {
        if ((r = e->cfg.dev->ops->host_alloc(e->cfg.dev, e->cfg.desc.activation_host_bytes, &p)) !=
            ZERO_OK)
            return r;
        a->host_kind = 1;
    } else if (a->io) {
        if ((r = zero_io_buffer_alloc(a->io, e->cfg.desc.activation_host_bytes, &p)) != ZERO_OK)
            return r;
        a->host_kind = 2;
    } else if (!(p = zero__alloc(&e->cfg.desc.allocator, e->cfg.desc.activation_host_bytes))) {
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "activation tier: %zu bytes of host memory "
                          "(activation_host_bytes)", e->cfg.desc.activation_host_bytes);
    }
    a->host = (unsigned char *)p;
    a->host_bytes = a->hs.cap = e->cfg.desc.activation_host_bytes;
    return ZERO_OK;
}

/* destroy: waits for the tier's transfers and frees everything. */
static void zero__act_free(zero_engine *e)
{
    struct zero__act *a = e->act;
    const zero_allocator *al = &e->cfg.desc.allocator;
    if (!a) return;
    if (e->cfg.dev->ops->sync) (void)e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_OFFLOAD);
    if (a->io) (void)zero_io_wait_all(a->io);
    zero_io_file_destroy(a->file);
    if (a->host) {
        if (a->host_kind == 1) (void)e->cfg.dev->ops->host_free(e->cfg.dev, a->host);
        else if (a->host_kind == 2) zero_io_buffer_free(a->io, a->host);
        else zero__free(al, a->host);
    }
    zero_io_destroy(a->io);
    if (e->cfg.dev->ops->event_destroy) {
        if (a->ev_c2o) e->cfg.dev->ops->event_destroy(e->cfg.dev, a->ev_c2o);
        if (a->ev_o2c) e->cfg.dev->ops->event_destroy(e->cfg.dev, a->ev_o2c);
    }
    zero__free(al, a->keys);
    zero__free(al, a->index);
    zero__free(al, a->hs.r);
    zero__free(al, a->fs.r);
    zero__free(al, a->quar);
    zero__free(al, a);
    e->act = NULL;
}

/* memory_tier: the arena or staging (host) and the file (NVMe), under ZERO_MEM_ACTIVATION. */
static void zero__act_account(const zero_engine *e, zero_mem_tier tier, zero_engine_memory *out)
{
    size_t b;
    if (!e->act || tier == ZERO_TIER_DEVICE) return;
    b = tier == ZERO_TIER_HOST ? (e->act->host ? e->act->host_bytes : 0) : e->act->file_bytes;
    if (b == 0) return;
    out->bytes[ZERO_MEM_ACTIVATION] += b;
    out->peak_bytes[ZERO_MEM_ACTIVATION] += b;
    out->total_bytes += b;
    out->peak_total_bytes += b;
    out->allocations++;
}

static zero_result zero__act_usable(const zero_engine *e, const char *fn)
{
    zero_result r = zero__eng_usable(e, fn);
    if (r != ZERO_OK) return r;
    if (!e->act)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "%s: no activation tier (set offload_activations = cpu or nvme in the "
                          "engine's descriptor)", fn);
    return ZERO_OK;
}

/* usable, and a buffer and a size for key. */
static zero_result zero__act_args(const zero_engine *e, const char *fn, int key, const void *buf,
                                  size_t bytes)
{
    zero_result r = zero__act_usable(e, fn);
    if (r != ZERO_OK) return r;
    if (!buf || bytes == 0)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: key %d: buffer %s, bytes %zu", fn, key,
                          buf ? "set" : "NULL", bytes);
    return ZERO_OK;
}

static int zero__act_find(const struct zero__act *a, int key)
{
    int mask = 2 * a->cap - 1;
    unsigned h;
    if (!a->cap) return -1;
    for (h = zero__act_slot(key, mask); a->index[h]; h = (h + 1) & (unsigned)mask)
        if (a->keys[a->index[h] - 1].key == key) return a->index[h] - 1;
    return -1;
}

/* The key's staging region goes back: at once, or (when an upload may still read it)
   after the next sync of OFFLOAD. */
static void zero__act_unstage(struct zero__act *a, zero__act_key *k, int quarantine)
{
    if (k->sstate == ZERO__ACT_S_NONE) return;
    if (k->sstate == ZERO__ACT_S_COPY) a->ncopy--;
    if (quarantine) a->quar[a->nquar++] = k->soff;
    else zero__act_space_free(&a->hs, k->soff);
    k->sstate = ZERO__ACT_S_NONE;
    k->prefetched = 0;
}

/* A key whose write failed: it keeps nothing but the error, for its fetch. */
static void zero__act_fail_key(struct zero__act *a, zero__act_key *k)
{
    zero__eng_copy_error(k->err, sizeof k->err);
    zero__act_unstage(a, k, 0);
    zero__act_space_free(&a->fs, k->off);
    k->state = ZERO__ACT_FAILED;
}

/* Waits for the key's write or read in flight (S_WRITE, S_READ). A failed write fails the
   key (its bytes exist nowhere else once staging is reused); a failed read is returned and
   the key stays stashed, its staging given back. */
static zero_result zero__act_finish(struct zero__act *a, zero__act_key *k)
{
    zero_result r;
    if (k->sstate != ZERO__ACT_S_WRITE && k->sstate != ZERO__ACT_S_READ) return ZERO_OK;
    r = zero_io_wait(a->io, k->ticket);
    k->ticket = 0;
    if (r == ZERO_OK) {
        k->sstate = ZERO__ACT_S_CLEAN;
        return ZERO_OK;
    }
    if (k->sstate == ZERO__ACT_S_WRITE) {
        zero__act_fail_key(a, k);
        return ZERO_OK;
    }
    zero__act_unstage(a, k, 0);
    return r;
}

/* The host syncs OFFLOAD (when a stash copy or a quarantined region waits for it, or
   'force'): the stashes' bytes are then in staging and go to the file (except the key
   'skip', which a fetch takes straight from staging), and quarantined regions are free. */
static zero_result zero__act_settle(zero_engine *e, int force, int skip)
{
    struct zero__act *a = e->act;
    int i;
    if (!force && a->ncopy == 0 && a->nquar == 0) return ZERO_OK;
    ZERO__ENG_TRY(e, e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_OFFLOAD),
                  "activation tier: sync");
    for (i = 0; i < a->nquar; i++) zero__act_space_free(&a->hs, a->quar[i]);
    a->nquar = 0;
    for (i = 0; i < a->nkeys && a->ncopy > 0; i++) {
        zero__act_key *k = &a->keys[i];
        if (k->sstate != ZERO__ACT_S_COPY) continue;
        a->ncopy--;
        if (i == skip) { /* never written: fetched from staging now */
            k->sstate = ZERO__ACT_S_CLEAN;
            continue;
        }
        /* the tail past the caller's bytes is written too (direct I/O wants whole blocks) */
        memset(a->host + k->soff + k->bytes, 0, k->span - k->bytes);
        if (zero_io_write(a->file, (uint64_t)k->off, a->host + k->soff, k->span, &k->ticket) != ZERO_OK) {
            k->sstate = ZERO__ACT_S_CLEAN; /* nothing queued: unstage plainly */
            zero__act_fail_key(a, k);
            continue;
        }
        k->sstate = ZERO__ACT_S_WRITE;
        a->st.nvme_bytes_written += k->span;
    }
    return ZERO_OK;
}

/* A staging region of 'span' bytes. prefetch_seq 0: for a stash or a fetch (anything may
   be waited for or evicted: syncs, finished writes, clean copies, prefetches); otherwise
   for a prefetch of the key stashed at prefetch_seq: only clean copies of keys stashed
   before it are evicted, and nothing is waited for. 0 when nothing fits. */
static int zero__act_stage(zero_engine *e, size_t span, uint64_t prefetch_seq, size_t *soff,
                           zero_result *err)
{
    struct zero__act *a = e->act;
    int pass, i;
    *err = ZERO_OK;
    for (pass = 0; pass < 4; pass++) {
        if (zero__act_space_alloc(&a->hs, span, soff)) return 1;
        if (prefetch_seq && pass > 1) return 0;
        /* pass 0: settle; 1: clean copies, oldest first; 2: writes; 3: prefetches in flight */
        if (pass == 0) {
            if (!prefetch_seq && (*err = zero__act_settle(e, 0, -1)) != ZERO_OK) return 0;
            continue;
        }
        for (;;) {
            int best = -1;
            for (i = 0; i < a->nkeys; i++) {
                zero__act_key *k = &a->keys[i];
                int want = pass == 1 ? k->sstate == ZERO__ACT_S_CLEAN
                                     : pass == 2 ? k->sstate == ZERO__ACT_S_WRITE
                                                 : k->sstate == ZERO__ACT_S_READ;
                if (!want || (prefetch_seq && k->seq >= prefetch_seq)) continue;
                if (best < 0 || k->seq < a->keys[best].seq) best = i;
            }
            if (best < 0) break;
            (void)zero__act_finish(a, &a->keys[best]); /* a failed read only loses the prefetch */
            zero__act_unstage(a, &a->keys[best], 0);
            if (zero__act_space_alloc(&a->hs, span, soff)) return 1;
        }
    }
    return zero__act_space_alloc(&a->hs, span, soff);
}

/* After a fetch: read the live key stashed last into staging, unless it is there already. */
static void zero__act_prefetch(zero_engine *e)
{
    struct zero__act *a = e->act;
    zero__act_key *k = NULL;
    zero_result r;
    size_t soff;
    int i;
    for (i = 0; i < a->nkeys; i++)
        if (a->keys[i].state == ZERO__ACT_STASHED && (!k || a->keys[i].seq > k->seq)) k = &a->keys[i];
    if (!k || k->sstate != ZERO__ACT_S_NONE) return;
    if (!zero__act_stage(e, k->span, k->seq, &soff, &r)) return;
    if (zero_io_read(a->file, (uint64_t)k->off, a->host + soff, k->span, &k->ticket) != ZERO_OK) {
        zero__act_space_free(&a->hs, soff); /* the fetch will read it and report the error */
        zero_clear_error();
        return;
    }
    k->soff = soff;
    k->sstate = ZERO__ACT_S_READ;
    k->prefetched = 1;
    a->st.prefetches++;
    a->st.nvme_bytes_read += k->span;
}

ZERODEF zero_result zero_engine_stash(zero_engine *e, int key, const void *device_src, size_t bytes)
{
    const char *fn = "zero_engine_stash";
    struct zero__act *a;
    zero__act_key *k;
    zero_result r;
    size_t span, off = 0, soff = 0;
    int i;
    if ((r = zero__act_args(e, fn, key, device_src, bytes)) != ZERO_OK) return r;
    a = e->act;
    if (bytes > SIZE_MAX - ZERO_IO_ALIGN)
        return zero__fail(ZERO_ERROR_OVERFLOW, "%s: key %d: bytes = %zu", fn, key, bytes);
    span = zero__act_span(bytes);
    i = zero__act_find(a, key);
    if (i >= 0 && (a->keys[i].state == ZERO__ACT_STASHED || a->keys[i].state == ZERO__ACT_FAILED))
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "%s: key %d is already stashed (%zu bytes); fetch or drop it first", fn,
                          key, a->keys[i].bytes);
    if (a->tier == ZERO_OFFLOAD_NVME && span > a->hs.cap)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: key %d: %zu bytes do not fit the staging (activation_host_bytes = "
                          "%zu); raise it to at least %zu", fn, key, bytes, a->hs.cap, span);
    {
        zero__act_space *s = a->tier == ZERO_OFFLOAD_NVME ? &a->fs : &a->hs;
        const char *setting = a->tier == ZERO_OFFLOAD_NVME ? "activation_nvme_bytes" : "activation_host_bytes";
        if (span > s->cap - s->used_bytes)
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY,
                              "%s: key %d: the activation tier is full: %zu bytes asked (%zu "
                              "with alignment), %zu of %zu in use by %d stashed keys; raise %s "
                              "or fetch / drop keys first", fn, key, bytes, span, s->used_bytes,
                              s->cap, a->st.live_keys, setting);
    }
    if (i < 0 && (r = zero__act_reserve(e, fn)) != ZERO_OK) return r;
    if (a->tier == ZERO_OFFLOAD_NVME) {
        if ((r = zero__act_settle(e, 0, -1)) != ZERO_OK) return r;
        if (!zero__act_space_alloc(&a->fs, span, &off))
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY,
                              "%s: key %d: %zu bytes asked, the activation file (%zu bytes) has "
                              "%zu free but not in one piece; raise activation_nvme_bytes", fn,
                              key, span, a->fs.cap, a->fs.cap - a->fs.used_bytes);
        if (!zero__act_stage(e, span, 0, &soff, &r)) {
            zero__act_space_free(&a->fs, off);
            if (r != ZERO_OK) return r;
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: key %d: no staging for %zu bytes",
                              fn, key, span);
        }
    } else if (!zero__act_space_alloc(&a->hs, span, &off)) {
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY,
                          "%s: key %d: %zu bytes asked, the arena (%zu bytes) has %zu free but "
                          "not in one piece; raise activation_host_bytes", fn, key, span, a->hs.cap,
                          a->hs.cap - a->hs.used_bytes);
    }
    /* the copy reads device_src after the compute work enqueued so far */
    ZERO__ENG_TRY(e, zero__eng_record(e, ZERO_QUEUE_COMPUTE, a->ev_c2o), "zero_engine_stash: event");
    ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_OFFLOAD, a->ev_c2o), "zero_engine_stash: event");
    ZERO__ENG_TRY(e, e->cfg.dev->ops->download(e->cfg.dev, ZERO_QUEUE_OFFLOAD,
                                           a->host + (a->tier == ZERO_OFFLOAD_NVME ? soff : off),
                                           device_src, bytes),
                  "zero_engine_stash: copy to the host");
    if (i < 0) {
        i = a->nkeys++;
        a->keys[i].key = key;
        zero__act_index_put(a, i);
    } else {
        a->ntomb--; /* a fetched or dropped entry, stashed again */
    }
    k = &a->keys[i];
    memset(k, 0, sizeof *k);
    k->key = key;
    k->state = ZERO__ACT_STASHED;
    k->bytes = bytes;
    k->span = span;
    k->seq = ++a->seq;
    k->off = off;
    if (a->tier == ZERO_OFFLOAD_NVME) {
        k->sstate = ZERO__ACT_S_COPY;
        k->soff = soff;
        a->ncopy++;
    }
    a->st.stashes++;
    a->st.bytes_stashed += bytes;
    a->st.live_keys++;
    a->st.live_bytes += bytes;
    if (a->st.live_bytes > a->st.peak_live_bytes) a->st.peak_live_bytes = a->st.live_bytes;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_stash_fence(zero_engine *e)
{
    zero_result r;
    if ((r = zero__act_usable(e, "zero_engine_stash_fence")) != ZERO_OK) return r;
    ZERO__ENG_TRY(e, zero__eng_record(e, ZERO_QUEUE_OFFLOAD, e->act->ev_o2c), "zero_engine_stash_fence: event");
    ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_COMPUTE, e->act->ev_o2c), "zero_engine_stash_fence: event");
    return ZERO_OK;
}

/* A key stashed now (STASHED or FAILED), or an error naming why not. */
static zero_result zero__act_live_key(struct zero__act *a, int key, const char *fn, int *out)
{
    int i = zero__act_find(a, key);
    *out = i;
    if (i < 0)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "%s: key %d is not stashed (never stashed, or "
                          "fetched or dropped long before)", fn, key);
    if (a->keys[i].state == ZERO__ACT_FETCHED)
        return zero__fail(ZERO_ERROR_INVALID_STATE,
                          "%s: key %d was already fetched (each stash is fetched once)", fn, key);
    if (a->keys[i].state == ZERO__ACT_EMPTY)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "%s: key %d is not stashed (dropped, or its "
                          "write failed and was reported)", fn, key);
    return ZERO_OK;
}

/* r with the I/O engine's message, prefixed with the call and the key. */
static zero_result zero__act_io_error(zero_result r, const char *fn, int key)
{
    char prev[300];
    zero__eng_copy_error(prev, sizeof prev);
    return zero__fail(r, "%s: key %d: %s", fn, key, prev);
}

/* The key leaves the tier (fetched, dropped or failed and reported). */
static void zero__act_forget(struct zero__act *a, zero__act_key *k, int state)
{
    if (k->state == ZERO__ACT_STASHED) {
        if (a->tier == ZERO_OFFLOAD_NVME) zero__act_space_free(&a->fs, k->off);
        else zero__act_space_free(&a->hs, k->off);
    }
    a->st.live_keys--;
    a->st.live_bytes -= k->bytes;
    a->ntomb++;
    k->state = state;
}

/* A key whose write failed, reported (once) by its fetch. */
static zero_result zero__act_lost(struct zero__act *a, zero__act_key *k, const char *fn)
{
    char msg[240];
    memcpy(msg, k->err, sizeof msg);
    zero__act_forget(a, k, ZERO__ACT_EMPTY);
    return zero__fail(ZERO_ERROR_IO, "%s: key %d was lost, its write failed: %.200s", fn, k->key, msg);
}

ZERODEF zero_result zero_engine_fetch(zero_engine *e, int key, void *device_dst, size_t bytes)
{
    const char *fn = "zero_engine_fetch";
    struct zero__act *a;
    zero__act_key *k;
    zero_result r;
    const unsigned char *src;
    int i;
    if ((r = zero__act_args(e, fn, key, device_dst, bytes)) != ZERO_OK) return r;
    a = e->act;
    if ((r = zero__act_live_key(a, key, fn, &i)) != ZERO_OK) return r;
    k = &a->keys[i];
    if (k->state == ZERO__ACT_FAILED) return zero__act_lost(a, k, fn);
    if (bytes != k->bytes)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "%s: key %d was stashed with %zu bytes, the fetch asks for %zu", fn, key,
                          k->bytes, bytes);
    if (a->tier == ZERO_OFFLOAD_NVME) {
        int hit = k->sstate == ZERO__ACT_S_COPY || k->sstate == ZERO__ACT_S_WRITE ||
                  (k->sstate == ZERO__ACT_S_CLEAN && !k->prefetched);
        int pre = k->prefetched;
        /* uploads of earlier fetches are done after this: their staging comes back */
        if ((r = zero__act_settle(e, k->sstate == ZERO__ACT_S_COPY, i)) != ZERO_OK) return r;
        if (k->sstate == ZERO__ACT_S_WRITE) { /* the bytes are in staging: its result is moot */
            (void)zero_io_wait(a->io, k->ticket);
            zero_clear_error();
            k->ticket = 0;
            k->sstate = ZERO__ACT_S_CLEAN;
        }
        if (k->sstate == ZERO__ACT_S_READ && (r = zero__act_finish(a, k)) != ZERO_OK)
            return zero__act_io_error(r, fn, key);
        if (k->state == ZERO__ACT_FAILED) return zero__act_lost(a, k, fn); /* failed meanwhile */
        if (k->sstate == ZERO__ACT_S_NONE) { /* read it now */
            zero_io_ticket t;
            size_t soff;
            pre = hit = 0;
            if (!zero__act_stage(e, k->span, 0, &soff, &r)) {
                if (r != ZERO_OK) return r;
                return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: key %d: no staging for %zu bytes",
                                  fn, key, k->span);
            }
            r = zero_io_read(a->file, (uint64_t)k->off, a->host + soff, k->span, &t);
            if (r == ZERO_OK) r = zero_io_wait(a->io, t);
            if (r != ZERO_OK) {
                zero__act_space_free(&a->hs, soff);
                return zero__act_io_error(r, fn, key);
            }
            a->st.nvme_bytes_read += k->span;
            a->st.demand_reads++;
            k->soff = soff;
            k->sstate = ZERO__ACT_S_CLEAN;
        }
        if (hit) a->st.staging_hits++;
        else if (pre) a->st.prefetch_hits++;
        src = a->host + k->soff;
    } else {
        src = a->host + k->off;
    }
    /* device_dst is written after the compute work enqueued so far; compute waits for it */
    ZERO__ENG_TRY(e, zero__eng_record(e, ZERO_QUEUE_COMPUTE, a->ev_c2o), "zero_engine_fetch: event");
    ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_OFFLOAD, a->ev_c2o), "zero_engine_fetch: event");
    ZERO__ENG_TRY(e,
                  e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_OFFLOAD, device_dst, src, bytes),
                  "zero_engine_fetch: copy to the device");
    ZERO__ENG_TRY(e, zero__eng_record(e, ZERO_QUEUE_OFFLOAD, a->ev_o2c), "zero_engine_fetch: event");
    ZERO__ENG_TRY(e, zero__eng_wait(e, ZERO_QUEUE_COMPUTE, a->ev_o2c), "zero_engine_fetch: event");
    zero__act_unstage(a, k, 1); /* the upload may still read it */
    zero__act_forget(a, k, ZERO__ACT_FETCHED);
    a->st.fetches++;
    a->st.bytes_fetched += bytes;
    if (a->tier == ZERO_OFFLOAD_NVME) zero__act_prefetch(e);
    zero__act_tidy(e);
    return ZERO_OK;
}

/* Drops the live entry i (STASHED or FAILED), waiting for its transfers. */
static void zero__act_drop_at(struct zero__act *a, int i)
{
    zero__act_key *k = &a->keys[i];
    if (k->sstate == ZERO__ACT_S_WRITE || k->sstate == ZERO__ACT_S_READ) {
        (void)zero_io_wait(a->io, k->ticket);
        zero_clear_error();
        k->ticket = 0;
    }
    /* a copy into its staging or arena region may still run: on OFFLOAD, before any later
       copy into the same region; staging waits for the next sync */
    zero__act_unstage(a, k, k->sstate == ZERO__ACT_S_COPY);
    zero__act_forget(a, k, ZERO__ACT_EMPTY);
}

ZERODEF zero_result zero_engine_stash_drop(zero_engine *e, int key)
{
    const char *fn = "zero_engine_stash_drop";
    zero_result r;
    int i;
    if ((r = zero__act_usable(e, fn)) != ZERO_OK) return r;
    if ((r = zero__act_live_key(e->act, key, fn, &i)) != ZERO_OK) {
        if (r == ZERO_ERROR_INVALID_STATE)
            return zero__fail(ZERO_ERROR_NOT_FOUND, "%s: key %d is not stashed (fetched)", fn, key);
        return r;
    }
    zero__act_drop_at(e->act, i);
    zero__act_tidy(e);
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_stash_clear(zero_engine *e)
{
    zero_result r;
    int i;
    if ((r = zero__act_usable(e, "zero_engine_stash_clear")) != ZERO_OK) return r;
    for (i = 0; i < e->act->nkeys; i++) {
        int st = e->act->keys[i].state;
        if (st == ZERO__ACT_STASHED || st == ZERO__ACT_FAILED) zero__act_drop_at(e->act, i);
    }
    zero__act_tidy(e);
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_activation_stats(const zero_engine *e, zero_activation_stats *out)
{
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_activation_stats: NULL");
    if (e->act) *out = e->act->st;
    else memset(out, 0, sizeof *out);
    return ZERO_OK;
}

/* ======================================================================================
   Checkpoints: the state accessors (the one place that reads and writes master, m, v and
   params for checkpoints), CRC32C, the manifest and shard files, save, load, the reader,
   safetensors. Format: docs/checkpoint.md.
   ====================================================================================== */

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* As in the NVMe section: names glibc hides when a libc header came before zero.h under
   -std=c99/c11 (the values and signatures are fixed by the kernel and POSIX). */
#if !defined(O_NOFOLLOW) && defined(__O_NOFOLLOW)
#define O_NOFOLLOW __O_NOFOLLOW
#endif
#if !defined(O_DIRECTORY) && defined(__O_DIRECTORY)
#define O_DIRECTORY __O_DIRECTORY
#endif
#ifndef O_DIRECTORY
#define O_DIRECTORY 0
#endif
#if defined(__GLIBC__) && !defined(__USE_MISC) && !defined(__USE_UNIX98)
extern int gethostname(char *name, size_t len);
#endif

/* ---- engine state accessors --------------------------------------------------------------- */

/* Device address of element 'off' of this rank's shard of group g, kind k: fp32 master, m,
   v (stage 0 keeps them whole: the shard is the rank's slice of the whole), or params (the
   slice the step writes). Offload tiers plug in here and in zero__ck_state_io(). */
static unsigned char *zero__ck_state_ptr(const zero_engine *e, zero_state_kind k, int g,
                                         size_t off)
{
    const zero__eng_group *eg = &e->layout.groups[g];
    size_t base = e->cfg.stage == 0 ? eg->off_gwhole + (size_t)e->cfg.rank * eg->shard_numel
                                : eg->off_shard;
    switch (k) {
    case ZERO_STATE_MASTER: return (unsigned char *)zero__opt_at(e, e->opt.master, base + off);
    case ZERO_STATE_M: return (unsigned char *)zero__opt_at(e, e->opt.m, base + off);
    case ZERO_STATE_V: return (unsigned char *)zero__opt_at(e, e->opt.v, base + off);
    case ZERO_STATE_PARAM:
        /* the rank's part: its trained slice, then its frozen slice (kept whole below stage
           3 and for persistent groups: the frozen slice r lies after the trained region) */
        if (off >= eg->shard_numel && (e->cfg.stage < 3 || eg->persistent))
            return zero__eng_param_whole(e, g) +
                   (eg->gnumel + (size_t)e->cfg.rank * (eg->pshard_numel - eg->shard_numel) +
                    (off - eg->shard_numel)) * e->cfg.param_size;
        return zero__eng_param_shard(e, g) + off * e->cfg.param_size;
    }
    return NULL;
}

/* The offload tiers' side of zero__ck_state_io: master, m, v in host memory or NVMe files
   (offload_optimizer) and stage-3 param shards of partitioned groups in host memory or NVMe
   files (offload_param); copied at once (the NVMe tier synchronously). *handled = 0 when
   the state of kind k of group g is on the device. */
static zero_result zero__ck_state_offload(zero_engine *e, zero_state_kind k, int g, size_t off,
                                          size_t n, void *host, int to_device, int *handled)
{
    const zero__eng_group *eg = &e->layout.groups[g];
    zero_result r = ZERO_OK;
    *handled = 0;
    if (k != ZERO_STATE_PARAM && e->cfg.opt_offloaded) {
        size_t at = eg->off_shard + off;
        *handled = 1;
        if (e->cfg.opt_dtype == ZERO_BF16) { /* bf16 states: the host tier only (ratio 1, no nvme) */
            float *base = k == ZERO_STATE_MASTER ? e->opt.master
                          : k == ZERO_STATE_M    ? e->opt.m
                                                 : e->opt.v;
            if (to_device) memcpy(zero__opt_at(e, base, at), host, n * e->cfg.opt_size);
            else memcpy(host, zero__opt_at(e, base, at), n * e->cfg.opt_size);
            return ZERO_OK;
        }
        return zero__eng_opt_io(e, (int)k - 1, at, n, to_device ? NULL : (float *)host,
                                to_device ? (const float *)host : NULL);
    }
    if (k == ZERO_STATE_PARAM && e->cfg.params_offloaded && e->cfg.stage == 3 && !eg->persistent) {
        unsigned char *hp = NULL;
        *handled = 1;
        if (!e->nvme.param_file) { /* cpu: the shard in place */
            /* a prefetch's upload reads it */
            r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_OFFLOAD);
            hp = e->host.params + (eg->off_param + off) * e->cfg.param_size;
            if (r == ZERO_OK && to_device) memcpy(hp, host, n * e->cfg.param_size);
            else if (r == ZERO_OK) memcpy(host, hp, n * e->cfg.param_size);
            return r;
        }
        r = zero__eng_hparam_get(e, g, &hp); /* nvme: read the group's shard, change, write */
        if (r != ZERO_OK) return r;
        if (!to_device) {
            memcpy(host, hp + off * e->cfg.param_size, n * e->cfg.param_size);
            return ZERO_OK;
        }
        memcpy(hp + off * e->cfg.param_size, host, n * e->cfg.param_size);
        return zero__eng_hparam_put(e, g);
    }
    return ZERO_OK;
}

/* Copies n elements from element 'off' of this rank's shard of group g, kind k, to host
   memory (to_device 0) or from it (to_device 1). Enqueued on COMPUTE; the caller syncs.
   Offloaded state (host memory, NVMe) is copied at once. */
static zero_result zero__ck_state_io(zero_engine *e, zero_state_kind k, int g, size_t off,
                                     size_t n, void *host, int to_device)
{
    size_t esz = k == ZERO_STATE_PARAM ? e->cfg.param_size : 4;
    unsigned char *dev;
    int handled = 0;
    zero_result r;
    if (n == 0) return ZERO_OK;
    if (k != ZERO_STATE_PARAM && e->cfg.opt_dtype == ZERO_BF16) {
        /* bf16 states: checkpoints hold fp32 (a bf16 value widens exactly; an fp32 value
           loads rounded to nearest even), through a bf16 copy, synchronously */
        uint16_t *b = (uint16_t *)zero__alloc(&e->cfg.desc.allocator, n * 2u);
        if (!b) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "checkpoint: %zu bytes", n * 2u);
        r = to_device ? zero_convert(b, ZERO_BF16, host, ZERO_F32, n, ZERO_SIMD_AUTO) : ZERO_OK;
        if (r == ZERO_OK) r = zero__ck_state_offload(e, k, g, off, n, b, to_device, &handled);
        if (r == ZERO_OK && !handled) {
            dev = zero__ck_state_ptr(e, k, g, off);
            r = to_device
                    ? e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_COMPUTE, dev, b, n * 2u)
                    : e->cfg.dev->ops->download(e->cfg.dev, ZERO_QUEUE_COMPUTE, b, dev, n * 2u);
            if (r == ZERO_OK) r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE);
        }
        if (r == ZERO_OK && !to_device)
            r = zero_convert(host, ZERO_F32, b, ZERO_BF16, n, ZERO_SIMD_AUTO);
        zero__free(&e->cfg.desc.allocator, b);
        return r;
    }
    r = zero__ck_state_offload(e, k, g, off, n, host, to_device, &handled);
    if (r != ZERO_OK || handled) return r;
    dev = zero__ck_state_ptr(e, k, g, off);
    return to_device
               ? e->cfg.dev->ops->upload(e->cfg.dev, ZERO_QUEUE_COMPUTE, dev, host, n * esz)
               : e->cfg.dev->ops->download(e->cfg.dev, ZERO_QUEUE_COMPUTE, host, dev, n * esz);
}

/* After every rank wrote its shards: rebuild the copies kept whole (stage 0 master, m, v;
   params at stages 0-2 and stage-3 persistent groups) by in-place all-gathers. */
static zero_result zero__ck_state_spread(zero_engine *e)
{
    int g, k;
    if (e->cfg.world == 1) return ZERO_OK;
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMPUTE, ZERO_QUEUE_COMM), "load: event");
    for (g = 0; g < e->layout.ngroups; g++) {
        const zero__eng_group *eg = &e->layout.groups[g];
        if (e->cfg.stage == 0)
            for (k = ZERO_STATE_MASTER; k <= ZERO_STATE_V; k++) {
                float *base = k == ZERO_STATE_MASTER ? e->opt.master
                              : k == ZERO_STATE_M    ? e->opt.m
                                                     : e->opt.v;
                if (eg->shard_numel == 0) break; /* only frozen tensors */
                ZERO__ENG_TRY(e, zero__eng_all_gather(e, zero__ck_state_ptr(e, (zero_state_kind)k, g, 0),
                                                      zero__opt_at(e, base, eg->off_gwhole),
                                                      eg->shard_numel, e->cfg.opt_dtype, g,
                                                      ZERO_ROLE_CHECKPOINT),
                              "load: all_gather of stage-0 optimizer state");
            }
        if ((e->cfg.stage < 3 || eg->persistent) && eg->shard_numel > 0)
            ZERO__ENG_TRY(e, zero__eng_all_gather(e, zero__eng_param_shard(e, g),
                                                  zero__eng_param_whole(e, g), eg->shard_numel,
                                                  e->cfg.param_dtype, g, ZERO_ROLE_CHECKPOINT),
                          "load: all_gather of params");
        if ((e->cfg.stage < 3 || eg->persistent) && eg->pshard_numel > eg->shard_numel)
            ZERO__ENG_TRY(e, zero__eng_all_gather(e, zero__ck_state_ptr(e, ZERO_STATE_PARAM, g,
                                                                        eg->shard_numel),
                                                  zero__eng_param_whole(e, g) +
                                                      eg->gnumel * e->cfg.param_size,
                                                  eg->pshard_numel - eg->shard_numel,
                                                  e->cfg.param_dtype, g, ZERO_ROLE_CHECKPOINT),
                          "load: all_gather of frozen params");
    }
    ZERO__ENG_TRY(e, zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE), "load: event");
    return ZERO_OK;
}

/* ---- little-endian encoding --------------------------------------------------------------- */

typedef struct zero__ck_buf { /* a growable write buffer; err set on allocation failure */
    unsigned char *p;
    size_t n, cap;
    int err;
} zero__ck_buf;

static void zero__ck_put(zero__ck_buf *b, const void *src, size_t n)
{
    if (b->err) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        unsigned char *q;
        while (cap < b->n + n) cap *= 2;
        q = (unsigned char *)ZERO_MALLOC(cap);
        if (!q) {
            b->err = 1;
            return;
        }
        if (b->n) memcpy(q, b->p, b->n);
        ZERO_FREE(b->p);
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void zero__ck_puts(zero__ck_buf *b, const char *s) { zero__ck_put(b, s, strlen(s)); }

static void zero__ck_u32(zero__ck_buf *b, uint32_t v)
{
    unsigned char x[4];
    int i;
    for (i = 0; i < 4; i++) x[i] = (unsigned char)(v >> (8 * i));
    zero__ck_put(b, x, 4);
}

static void zero__ck_u64(zero__ck_buf *b, uint64_t v)
{
    unsigned char x[8];
    int i;
    for (i = 0; i < 8; i++) x[i] = (unsigned char)(v >> (8 * i));
    zero__ck_put(b, x, 8);
}

static void zero__ck_f64(zero__ck_buf *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    zero__ck_u64(b, u);
}

static void zero__ck_f32(zero__ck_buf *b, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    zero__ck_u32(b, u);
}

typedef struct zero__ck_rd { /* a bounds-checked reader; bad set on a read past the end */
    const unsigned char *p;
    size_t n, at;
    int bad;
} zero__ck_rd;

static uint64_t zero__ck_get(zero__ck_rd *r, int bytes)
{
    uint64_t v = 0;
    int i;
    if (r->bad || r->n - r->at < (size_t)bytes) {
        r->bad = 1;
        return 0;
    }
    for (i = 0; i < bytes; i++) v |= (uint64_t)r->p[r->at + (size_t)i] << (8 * i);
    r->at += (size_t)bytes;
    return v;
}

static double zero__ck_get_f64(zero__ck_rd *r)
{
    uint64_t u = zero__ck_get(r, 8);
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static float zero__ck_get_f32(zero__ck_rd *r)
{
    uint32_t u = (uint32_t)zero__ck_get(r, 4);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t zero__ck_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- files -------------------------------------------------------------------------------- */

/* Test hooks (private; tests that define ZERO_IMPLEMENTATION set them). zero__ck_io_fault:
   called before every checkpoint write (op 'w') and every open of an existing checkpoint
   file for reading (op 'o') with the file's path; a non-zero errno it returns fails that
   call as the system would (ENOSPC, EACCES ...); before a shard file is switched to
   O_DIRECT (op 'd', written or read): non-zero = refused, as tmpfs once did (the buffered
   path is taken). zero__ck_stage: called on every rank
   at fixed points of load and save (where: 0 = before the manifest is opened, 1 = after),
   so a test can change the directory between ranks deterministically.
   zero__ck_bytes_read counts the bytes every checkpoint read asked for. */
static int (*zero__ck_io_fault)(const char *path, int op);
static void (*zero__ck_stage)(int rank, int where, const char *dir);
static uint64_t zero__ck_bytes_read;

static zero_result zero__ck_pwrite(int fd, const void *buf, size_t n, uint64_t off,
                                   const char *path)
{
    const unsigned char *p = (const unsigned char *)buf;
    if (zero__ck_io_fault && n > 0) {
        int er = zero__ck_io_fault(path, 'w');
        if (er)
            return zero__fail(ZERO_ERROR_IO, "%s: write at byte %llu: %s", path,
                              (unsigned long long)off, strerror(er));
    }
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR) continue;
            return zero__fail(ZERO_ERROR_IO, "%s: write at byte %llu: %s", path,
                              (unsigned long long)off, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return ZERO_OK;
}

static zero_result zero__ck_pread(int fd, void *buf, size_t n, uint64_t off, const char *path)
{
    unsigned char *p = (unsigned char *)buf;
    __atomic_fetch_add(&zero__ck_bytes_read, (uint64_t)n, __ATOMIC_RELAXED);
    while (n > 0) {
        ssize_t got = pread(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, (off_t)off);
        if (got < 0) {
            if (errno == EINTR) continue;
            return zero__fail(ZERO_ERROR_IO, "%s: read at byte %llu: %s", path,
                              (unsigned long long)off, strerror(errno));
        }
        if (got == 0)
            return zero__fail(ZERO_ERROR_IO, "%s: truncated: no bytes at offset %llu", path,
                              (unsigned long long)off);
        p += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return ZERO_OK;
}

/* Opens an existing checkpoint file for reading without blocking (a FIFO or device named
   like a checkpoint file must not hang the reader) and refuses anything but a regular file.
   what names the file's role in errors ("shard file of rank 3"). NOT_FOUND when it does not
   exist (IO for a missing file when missing_is_io); EACCES says "permission denied". */
static zero_result zero__ck_open_read(const char *path, const char *what, int missing_is_io,
                                      int *fd_out, struct stat *st_out)
{
    struct stat st;
    int fd, fl;
    int er = zero__ck_io_fault ? zero__ck_io_fault(path, 'o') : 0;
    *fd_out = -1;
    fd = er ? -1 : open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        if (!er) er = errno;
        if (er == ENOENT)
            return zero__fail(missing_is_io ? ZERO_ERROR_IO : ZERO_ERROR_NOT_FOUND,
                              "%s: missing %s: %s", path, what, strerror(er));
        if (er == EACCES || er == EPERM)
            return zero__fail(ZERO_ERROR_IO, "%s: %s: permission denied", path, what);
        return zero__fail(ZERO_ERROR_IO, "%s: %s: open: %s", path, what, strerror(er));
    }
    if (fstat(fd, &st) != 0) {
        er = errno;
        close(fd);
        return zero__fail(ZERO_ERROR_IO, "%s: %s: stat: %s", path, what, strerror(er));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return zero__fail(ZERO_ERROR_IO, "%s: %s is not a regular file (%s); refusing to read it",
                          path, what, S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISDIR(st.st_mode)
                          ? "a directory" : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)
                          ? "a device" : "special");
    }
    fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (st_out) *st_out = st;
    return ZERO_OK;
}

static zero_result zero__ck_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return zero__fail(ZERO_ERROR_IO, "%s: open directory: %s", dir, strerror(errno));
    if (fsync(fd) != 0 && errno != EINVAL) {
        int er = errno;
        close(fd);
        return zero__fail(ZERO_ERROR_IO, "%s: fsync directory: %s", dir, strerror(er));
    }
    close(fd);
    return ZERO_OK;
}

/* Creates a new temporary file for final path 'path': "<path>.<16 hex digits>.tmp", with
   O_EXCL | O_NOFOLLOW (a name planted in advance, a symlink included, is never opened: a
   fresh random name is tried instead). tmp receives the name. */
static zero_result zero__ck_create_tmp(const char *path, char *tmp, size_t tmp_size, int *fd_out)
{
    static uint64_t counter;
    int tries;
    *fd_out = -1;
    for (tries = 0; tries < 64; tries++) {
        struct timespec ts;
        uint64_t x = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED), z;
        int fd;
        clock_gettime(CLOCK_REALTIME, &ts);
        z = x * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid() << 40 ^ (uint64_t)ts.tv_nsec ^
            (uint64_t)ts.tv_sec << 20 ^ (uint64_t)(uintptr_t)&ts;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        if ((size_t)snprintf(tmp, tmp_size, "%s.%016llx.tmp", path, (unsigned long long)z) >= tmp_size)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "%s: path too long", path);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0) {
            *fd_out = fd;
            return ZERO_OK;
        }
        if (errno != EEXIST && errno != ELOOP)
            return zero__fail(ZERO_ERROR_IO, "%s: create: %s", tmp, strerror(errno));
    }
    return zero__fail(ZERO_ERROR_IO, "%s: no unused temporary name after 64 tries", path);
}

/* fsync, close, rename over path and fsync the directory; the temporary goes on failure. */
static zero_result zero__ck_commit_tmp(int fd, const char *tmp, const char *path, const char *dir,
                                       zero_result r)
{
    if (r == ZERO_OK && fsync(fd) != 0)
        r = zero__fail(ZERO_ERROR_IO, "%s: fsync: %s", tmp, strerror(errno));
    if (close(fd) != 0 && r == ZERO_OK)
        r = zero__fail(ZERO_ERROR_IO, "%s: close: %s", tmp, strerror(errno));
    if (r == ZERO_OK && rename(tmp, path) != 0)
        r = zero__fail(ZERO_ERROR_IO, "%s: rename to %s: %s", tmp, path, strerror(errno));
    if (r != ZERO_OK) {
        (void)unlink(tmp); /* zero__fail's text survives: unlink does not touch it */
        return r;
    }
    return dir ? zero__ck_fsync_dir(dir) : ZERO_OK;
}

/* Writes a whole file at dir/name crash-safely: a new temporary, fsync, rename, fsync dir. */
static zero_result zero__ck_write_file(const char *dir, const char *name, const void *data,
                                       size_t n)
{
    char path[4200], tmp[4240];
    int fd;
    zero_result r;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    if ((r = zero__ck_create_tmp(path, tmp, sizeof tmp, &fd)) != ZERO_OK) return r;
    return zero__ck_commit_tmp(fd, tmp, path, dir, zero__ck_pwrite(fd, data, n, 0, tmp));
}

/* ---- shapes and scaler state ---------------------------------------------------------------- */

ZERODEF zero_result zero_engine_add_tensor_shape(zero_engine *e, const char *name, int ndim,
                                                 const uint64_t *dims, int group,
                                                 unsigned flags, int *out_tensor)
{
    uint64_t numel = 1;
    int i, id = -1;
    zero_result r;
    if (!e) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_add_tensor_shape: engine is NULL");
    if (ndim < 1 || ndim > ZERO_TENSOR_MAX_DIMS || !dims)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_engine_add_tensor_shape: '%.200s': ndim = %d (1..%d, dims not NULL)",
                          name ? name : "(null)", ndim, ZERO_TENSOR_MAX_DIMS);
    for (i = 0; i < ndim; i++) {
        if (dims[i] == 0)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_engine_add_tensor_shape: '%.200s': dims[%d] = 0",
                              name ? name : "(null)", i);
        if (numel > UINT64_MAX / dims[i] || numel * dims[i] > (uint64_t)SIZE_MAX)
            return zero__fail(ZERO_ERROR_OVERFLOW, "zero_engine_add_tensor_shape: '%.200s': "
                              "the shape's product overflows", name ? name : "(null)");
        numel *= dims[i];
    }
    if (e->lifecycle == ZERO__ENG_CREATED && e->layout.ntensors >= e->layout.cap_shapes) {
        int cap = e->layout.cap_shapes ? 2 * e->layout.cap_shapes : 64;
        zero__eng_shape *ns;
        while (cap <= e->layout.ntensors) cap *= 2;
        ns = (zero__eng_shape *)zero__alloc(&e->cfg.desc.allocator, (size_t)cap * sizeof *ns);
        if (!ns) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_add_tensor_shape");
        memset(ns, 0, (size_t)cap * sizeof *ns);
        if (e->layout.cap_shapes)
            memcpy(ns, e->layout.shapes, (size_t)e->layout.cap_shapes * sizeof *ns);
        zero__free(&e->cfg.desc.allocator, e->layout.shapes);
        e->layout.shapes = ns;
        e->layout.cap_shapes = cap;
    }
    r = zero_engine_add_tensor(e, name, (size_t)numel, group, flags, &id);
    if (r != ZERO_OK) return r;
    e->layout.shapes[id].ndim = ndim;
    for (i = 0; i < ndim; i++) e->layout.shapes[id].dims[i] = dims[i];
    if (out_tensor) *out_tensor = id;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_tensor_shape(const zero_engine *e, int tensor, int *ndim,
                                             uint64_t dims[ZERO_TENSOR_MAX_DIMS])
{
    int i;
    if (!e || !ndim || !dims)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_tensor_shape: NULL");
    if (tensor < 0 || tensor >= e->layout.ntensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_engine_tensor_shape: tensor %d unknown", tensor);
    *ndim = tensor < e->layout.cap_shapes ? e->layout.shapes[tensor].ndim : 0;
    for (i = 0; i < ZERO_TENSOR_MAX_DIMS; i++)
        dims[i] = i < *ndim ? e->layout.shapes[tensor].dims[i] : 0;
    return ZERO_OK;
}

ZERODEF zero_result zero_engine_scaler_state(const zero_engine *e, zero_scaler *out)
{
    if (!e || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_scaler_state: NULL");
    /* as loss_scale */
    if (e->async.pending) (void)zero__eng_step_complete((zero_engine *)(uintptr_t)e);
    *out = e->opt.scaler;
    return ZERO_OK;
}

/* ---- the format ------------------------------------------------------------------------------ */

#define ZERO__CK_VERSION 3u       /* of the manifest; versions 1 (no client state) and 2 (no
                                     per-tensor hyper-parameters) still load */
#define ZERO__CK_SHARD_VERSION 1u /* of the shard files */
#define ZERO__CK_MANIFEST "zero.manifest"
#define ZERO__CK_MAN_FIXED 184u   /* bytes before the group table */
#define ZERO__CK_SHARD_FIXED 64u  /* bytes before the section table */
#define ZERO__CK_SEC_BYTES 32u    /* one section table entry */
#define ZERO__CK_CHUNK ((size_t)16 << 20)

/* Section order within a group: master, m, v, params (the kind code is zero_state_kind). */
static const zero_state_kind zero__ck_kinds[4] = {ZERO_STATE_MASTER, ZERO_STATE_M, ZERO_STATE_V,
                                                  ZERO_STATE_PARAM};
static const char *zero__ck_kind_name(int ki)
{
    static const char *names[4] = {"master", "m", "v", "params"};
    return ki >= 0 && ki < 4 ? names[ki] : "?";
}

typedef struct zero__ck_tensor {
    const char *name;
    uint32_t group, flags;
    uint64_t offset, numel;
    int ndim;
    uint64_t dims[ZERO_TENSOR_MAX_DIMS];
    double lr_mul, wd; /* zero_engine_set_tensor_hparams (wd < 0: the default) */
} zero__ck_tensor;

typedef struct zero__ck_group {
    uint64_t numel, shard_numel, used_numel;
    uint64_t pshard_numel; /* numel / world: the params section (trained + frozen slices) */
    uint64_t sec_off; /* byte offset of the group's master section in every shard file */
    int first_tensor;
} zero__ck_group;

struct zero_checkpoint {
    char dir[4096];
    zero_checkpoint_info info;
    zero__ck_group *groups;
    zero__ck_tensor *tensors;
    uint64_t *file_bytes;
    uint32_t *file_hcrc;
    char *names;
    zero_plan *plan;       /* the saving run's plan, rebuilt from the manifest */
    uint32_t psize;
    uint64_t header_bytes; /* of every shard file */
    uint64_t shard_bytes;  /* of every shard file */
    uint32_t client_crc;   /* CRC32C of the client state (info.client_bytes bytes) */
    uint32_t manifest_crc; /* the manifest's own checksum: with the generation, its identity */
};

static void zero__ck_free(zero_checkpoint *ck)
{
    if (!ck) return;
    ZERO_FREE(ck->groups);
    ZERO_FREE(ck->tensors);
    ZERO_FREE(ck->file_bytes);
    ZERO_FREE(ck->file_hcrc);
    ZERO_FREE(ck->names);
    zero_plan_destroy(ck->plan);
    ZERO_FREE(ck);
}

ZERODEF void zero_checkpoint_close(zero_checkpoint *ck) { zero__ck_free(ck); }

static size_t zero__ck_sec_esz(const zero_checkpoint *ck, int ki) { return ki == 3 ? ck->psize : 4; }

/* Elements of section ki of group g: master, m, v cover the trained slice (shard_numel), the
   params the trained and frozen slices (pshard_numel; equal without frozen tensors). */
static uint64_t zero__ck_sec_numel(const zero_checkpoint *ck, int g, int ki)
{
    return ki == 3 ? ck->groups[g].pshard_numel : ck->groups[g].shard_numel;
}

static uint64_t zero__ck_sec_off(const zero_checkpoint *ck, int g, int ki)
{
    return ck->groups[g].sec_off + (uint64_t)ki * 4u * ck->groups[g].shard_numel;
}

/* Parses and checks a manifest held in memory; 'what' names it in errors. */
static zero_result zero__ck_parse_manifest(const unsigned char *buf, size_t n, const char *what,
                                           zero_checkpoint **out)
{
    zero_checkpoint *ck;
    zero__ck_rd rd;
    zero_result r = ZERO_OK;
    uint32_t version, world, stage, dtype, align, G, T, i, crc;
    uint64_t mbytes, off;
    size_t namepos = 0;
    int k;
    *out = NULL;
    if (n < ZERO__CK_MAN_FIXED + 4 || memcmp(buf, "ZEROMANI", 8) != 0)
        return zero__fail(ZERO_ERROR_IO, "%s: not a zero manifest (%zu bytes, bad magic)", what, n);
    crc = zero__ck_le32(buf + n - 4);
    if (crc != zero_crc32c(0, buf, n - 4))
        return zero__fail(ZERO_ERROR_IO, "%s: checksum mismatch (stored %08x, computed %08x over "
                          "bytes 0..%zu)", what, crc, zero_crc32c(0, buf, n - 4), n - 5);
    memset(&rd, 0, sizeof rd);
    rd.p = buf;
    rd.n = n - 4;
    rd.at = 8;
    version = (uint32_t)zero__ck_get(&rd, 4);
    (void)zero__ck_get(&rd, 4);
    mbytes = zero__ck_get(&rd, 8);
    if (version < 1u || version > ZERO__CK_VERSION)
        return zero__fail(ZERO_ERROR_IO, "%s: format version %u (this library reads 1..%u)",
                          what, version, ZERO__CK_VERSION);
    if (mbytes != n)
        return zero__fail(ZERO_ERROR_IO, "%s: %zu bytes but its header says %llu", what, n,
                          (unsigned long long)mbytes);
    ck = (zero_checkpoint *)ZERO_MALLOC(sizeof *ck);
    if (!ck) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s", what);
    memset(ck, 0, sizeof *ck);
    ck->manifest_crc = crc;
    ck->info.generation = zero__ck_get(&rd, 8);
    world = (uint32_t)zero__ck_get(&rd, 4);
    stage = (uint32_t)zero__ck_get(&rd, 4);
    dtype = (uint32_t)zero__ck_get(&rd, 4);
    align = (uint32_t)zero__ck_get(&rd, 4);
    G = (uint32_t)zero__ck_get(&rd, 4);
    T = (uint32_t)zero__ck_get(&rd, 4);
    ck->info.step = (int64_t)zero__ck_get(&rd, 8);
    ck->info.adam.mode = (zero_adam_mode)(int)zero__ck_get(&rd, 4);
    (void)zero__ck_get(&rd, 4);
    ck->info.adam.lr = zero__ck_get_f64(&rd);
    ck->info.adam.beta1 = zero__ck_get_f64(&rd);
    ck->info.adam.beta2 = zero__ck_get_f64(&rd);
    ck->info.adam.eps = zero__ck_get_f64(&rd);
    ck->info.adam.weight_decay = zero__ck_get_f64(&rd);
    ck->info.scaler.scale = zero__ck_get_f32(&rd);
    ck->info.scaler.factor = zero__ck_get_f32(&rd);
    ck->info.scaler.min_scale = zero__ck_get_f32(&rd);
    ck->info.scaler.window = (int32_t)(uint32_t)zero__ck_get(&rd, 4);
    ck->info.scaler.hysteresis = (int32_t)(uint32_t)zero__ck_get(&rd, 4);
    ck->info.scaler.cur_hysteresis = (int32_t)(uint32_t)zero__ck_get(&rd, 4);
    ck->info.scaler.consecutive_hysteresis = (int32_t)(uint32_t)zero__ck_get(&rd, 4);
    ck->info.scaler.dynamic = (int32_t)(uint32_t)zero__ck_get(&rd, 4);
    ck->info.scaler.iter = (int64_t)zero__ck_get(&rd, 8);
    ck->info.scaler.last_overflow_iter = (int64_t)zero__ck_get(&rd, 8);
    ck->info.scaler.error_at_min = (int32_t)(uint32_t)zero__ck_get(&rd, 4);
    ck->info.update_pending = (int)(zero__ck_get(&rd, 4) & 1u); /* flags (0 before DPU) */
    (void)zero__ck_get(&rd, 8);
    ck->info.plan_hash = zero__ck_get(&rd, 8);
    if (world < 1 || world > 65536 || stage > 3 ||
        (dtype != ZERO_F32 && dtype != ZERO_F16 && dtype != ZERO_BF16) || align < 1 ||
        align > (1u << 20) || G < 1 || T < 1 || T < G ||
        (uint64_t)G * 24u + (uint64_t)T * 33u + (uint64_t)world * 16u > n) {
        r = zero__fail(ZERO_ERROR_IO, "%s: bad fields (world %u, stage %u, dtype %u, align %u, "
                       "%u groups, %u tensors)", what, world, stage, dtype, align, G, T);
        goto fail;
    }
    ck->info.world = (int)world;
    ck->info.stage = (int)stage;
    ck->info.param_dtype = (zero_dtype)dtype;
    ck->info.align_numel = align;
    ck->info.num_groups = (int)G;
    ck->info.num_tensors = (int)T;
    ck->psize = (uint32_t)zero_dtype_size((zero_dtype)dtype);
    {   /* Adam and scaler values must be what an engine could hold */
        zero_adam_desc ad;
        const zero_scaler *s = &ck->info.scaler;
        if (ck->info.adam.mode != ZERO_ADAMW && ck->info.adam.mode != ZERO_ADAM)
            r = ZERO_ERROR_IO;
        else if (zero_adam_desc_resolve(&ad, &ck->info.adam) != ZERO_OK || ck->info.adam.lr < 0 ||
                 ck->info.adam.beta1 == 0 || ck->info.adam.beta2 == 0 || ck->info.adam.eps == 0)
            r = ZERO_ERROR_IO;
        else if (!(s->scale > 0.0f) || isinf(s->scale) || !(s->factor > 0.0f) ||
                 isinf(s->factor) || !(s->min_scale > 0.0f) || isinf(s->min_scale) ||
                 s->window < 1 || s->hysteresis < 1 || s->cur_hysteresis < 0 ||
                 s->iter < 0 || s->last_overflow_iter < -1 || ck->info.step < 0)
            r = ZERO_ERROR_IO;
        if (r != ZERO_OK) {
            r = zero__fail(ZERO_ERROR_IO, "%s: Adam settings, scaler state or step out of range",
                           what);
            goto fail;
        }
    }
    ck->groups = (zero__ck_group *)ZERO_MALLOC((size_t)G * sizeof *ck->groups);
    ck->tensors = (zero__ck_tensor *)ZERO_MALLOC((size_t)T * sizeof *ck->tensors);
    ck->file_bytes = (uint64_t *)ZERO_MALLOC((size_t)world * 8u);
    ck->file_hcrc = (uint32_t *)ZERO_MALLOC((size_t)world * 4u);
    ck->names = (char *)ZERO_MALLOC(n);
    if (!ck->groups || !ck->tensors || !ck->file_bytes || !ck->file_hcrc || !ck->names) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s", what);
        goto fail;
    }
    memset(ck->tensors, 0, (size_t)T * sizeof *ck->tensors);
    for (i = 0; i < G; i++) {
        zero__ck_group *g = &ck->groups[i];
        g->numel = zero__ck_get(&rd, 8);
        g->shard_numel = zero__ck_get(&rd, 8);
        g->used_numel = zero__ck_get(&rd, 8);
        g->first_tensor = -1;
    }
    for (i = 0; i < T && !rd.bad; i++) {
        zero__ck_tensor *t = &ck->tensors[i];
        uint32_t len = (uint32_t)zero__ck_get(&rd, 4), j;
        uint64_t prod = 1;
        if (len < 1 || len > 255 || rd.n - rd.at < len) {
            r = zero__fail(ZERO_ERROR_IO, "%s: tensor %u: name length %u", what, i, len);
            goto fail;
        }
        for (j = 0; j < len; j++)
            if (buf[rd.at + j] == 0) {
                r = zero__fail(ZERO_ERROR_IO, "%s: tensor %u: NUL in its name", what, i);
                goto fail;
            }
        memcpy(ck->names + namepos, buf + rd.at, len);
        ck->names[namepos + len] = '\0';
        t->name = ck->names + namepos;
        namepos += len + 1;
        rd.at += len;
        t->group = (uint32_t)zero__ck_get(&rd, 4);
        t->flags = (uint32_t)zero__ck_get(&rd, 4);
        t->offset = zero__ck_get(&rd, 8);
        t->numel = zero__ck_get(&rd, 8);
        t->ndim = (int)(uint32_t)zero__ck_get(&rd, 4);
        if (rd.bad) break;
        if (t->group >= G || t->ndim < 0 || t->ndim > ZERO_TENSOR_MAX_DIMS || t->numel == 0 ||
            t->numel > (uint64_t)SIZE_MAX ||
            (t->flags & ~(uint32_t)(ZERO_TENSOR_NO_DECAY | ZERO_TENSOR_FROZEN))) {
            r = zero__fail(ZERO_ERROR_IO, "%s: tensor '%s': bad group, flags, size or ndim", what,
                           t->name);
            goto fail;
        }
        for (k = 0; k < t->ndim; k++) {
            t->dims[k] = zero__ck_get(&rd, 8);
            if (t->dims[k] == 0 || prod > UINT64_MAX / t->dims[k]) prod = 0;
            else prod *= t->dims[k];
        }
        if (t->ndim > 0 && prod != t->numel && !rd.bad) {
            r = zero__fail(ZERO_ERROR_IO, "%s: tensor '%s': shape does not multiply to %llu",
                           what, t->name, (unsigned long long)t->numel);
            goto fail;
        }
        if (ck->groups[t->group].first_tensor < 0) ck->groups[t->group].first_tensor = (int)i;
    }
    for (i = 0; i < world; i++) {
        ck->file_bytes[i] = zero__ck_get(&rd, 8);
        ck->file_hcrc[i] = (uint32_t)zero__ck_get(&rd, 4);
        (void)zero__ck_get(&rd, 4);
    }
    if (version >= 2u) { /* the client state entry */
        ck->info.client_bytes = zero__ck_get(&rd, 8);
        ck->client_crc = (uint32_t)zero__ck_get(&rd, 4);
        (void)zero__ck_get(&rd, 4);
        if (ck->info.client_bytes > (uint64_t)SIZE_MAX / 2u) {
            r = zero__fail(ZERO_ERROR_IO, "%s: client state of %llu bytes", what,
                           (unsigned long long)ck->info.client_bytes);
            goto fail;
        }
    }
    for (i = 0; i < T; i++) { /* version 3: the per-tensor hyper-parameters */
        zero__ck_tensor *t = &ck->tensors[i];
        t->lr_mul = version >= 3u ? zero__ck_get_f64(&rd) : 1.0;
        t->wd = version >= 3u ? zero__ck_get_f64(&rd) : ZERO_WEIGHT_DECAY_DEFAULT;
        if (!(t->lr_mul >= 0.0) || isinf(t->lr_mul) ||
            (t->wd != ZERO_WEIGHT_DECAY_DEFAULT && (!(t->wd >= 0.0) || isinf(t->wd)))) {
            r = zero__fail(ZERO_ERROR_IO, "%s: tensor '%s': lr_mul %g, weight decay %g", what,
                           t->name, t->lr_mul, t->wd);
            goto fail;
        }
    }
    if (rd.bad || rd.at != rd.n) {
        r = zero__fail(ZERO_ERROR_IO, "%s: %s at byte %zu", what,
                       rd.bad ? "ends early" : "has extra bytes", rd.at);
        goto fail;
    }
    /* Rebuild the saving run's plan and check that it lays out as recorded. */
    r = zero_plan_create(&ck->plan, NULL);
    for (i = 0; i < T && r == ZERO_OK; i++)
        r = zero_plan_add(ck->plan, ck->tensors[i].name, (size_t)ck->tensors[i].numel,
                          (int)ck->tensors[i].group, NULL);
    for (i = 0; i < T && r == ZERO_OK; i++)
        if (ck->tensors[i].flags & ZERO_TENSOR_FROZEN) r = zero_plan_freeze(ck->plan, (int)i);
    if (r == ZERO_OK) r = zero_plan_commit(ck->plan, (int)world, align, 0);
    if (r != ZERO_OK) {
        char prev[400];
        zero__eng_copy_error(prev, sizeof prev);
        r = zero__fail(ZERO_ERROR_IO, "%s: its plan does not lay out: %.380s", what, prev);
        goto fail;
    }
    if (zero_plan_num_groups(ck->plan) != (int)G) {
        r = zero__fail(ZERO_ERROR_IO, "%s: group count differs from the tensors' groups", what);
        goto fail;
    }
    for (i = 0; i < T; i++) {
        zero_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        zero_plan_tensor(ck->plan, (int)i, &ti);
        if ((uint64_t)ti.offset != ck->tensors[i].offset) {
            r = zero__fail(ZERO_ERROR_IO, "%s: tensor '%s' at offset %llu, the plan puts it at %zu",
                           what, ck->tensors[i].name, (unsigned long long)ck->tensors[i].offset,
                           ti.offset);
            goto fail;
        }
    }
    ck->header_bytes = ZERO__CK_SHARD_FIXED + (uint64_t)ZERO__CK_SEC_BYTES * 4u * G + 4u;
    off = ck->header_bytes;
    for (i = 0; i < G; i++) {
        zero_group_info gi;
        uint64_t b;
        memset(&gi, 0, sizeof gi);
        zero_plan_group(ck->plan, (int)i, &gi);
        ck->groups[i].pshard_numel = gi.shard_numel;
        if (gi.numel != ck->groups[i].numel ||
            (gi.numel - gi.frozen_numel) / world != ck->groups[i].shard_numel ||
            gi.used_numel != ck->groups[i].used_numel) {
            r = zero__fail(ZERO_ERROR_IO, "%s: group %u sizes differ from the plan's", what, i);
            goto fail;
        }
        ck->groups[i].sec_off = off;
        /* bytes, not elements: the plan checked counts, the product can still wrap */
        if (ck->groups[i].pshard_numel > (UINT64_MAX - off) / (12u + ck->psize)) {
            r = zero__fail(ZERO_ERROR_IO, "%s: group %u: %llu elements per shard overflow a "
                           "64-bit byte size", what, i,
                           (unsigned long long)ck->groups[i].shard_numel);
            goto fail;
        }
        b = ck->groups[i].shard_numel * 12u + ck->groups[i].pshard_numel * ck->psize;
        off += b;
    }
    ck->shard_bytes = off;
    ck->info.total_bytes = n;
    for (i = 0; i < world; i++) {
        if (ck->file_bytes[i] != off) {
            r = zero__fail(ZERO_ERROR_IO, "%s: shard file of rank %u recorded as %llu bytes; the "
                           "plan makes it %llu", what, i, (unsigned long long)ck->file_bytes[i],
                           (unsigned long long)off);
            goto fail;
        }
        ck->info.total_bytes += off;
    }
    ck->info.total_bytes += ck->info.client_bytes;
    *out = ck;
    return ZERO_OK;
fail:
    zero__ck_free(ck);
    return r;
}

static void zero__ck_shard_name(char *dst, size_t n, uint64_t gen, int rank)
{
    snprintf(dst, n, "zero-%016llx-%05d.shard", (unsigned long long)gen, rank);
}

static void zero__ck_client_name(char *dst, size_t n, uint64_t gen)
{
    snprintf(dst, n, "zero-%016llx.client", (unsigned long long)gen);
}

/* Reads and checks the client state of ck into dst (info.client_bytes bytes). dst NULL
   (zero_checkpoint_verify): checks it through a buffer of at most 1 MiB, so a manifest that
   claims a huge client state costs nothing before the file's size is compared. */
static zero_result zero__ck_read_client(const zero_checkpoint *ck, void *dst)
{
    char name[64], path[4200];
    struct stat st;
    uint32_t crc = 0;
    zero_result r;
    int fd;
    if (ck->info.client_bytes == 0) return ZERO_OK;
    zero__ck_client_name(name, sizeof name, ck->info.generation);
    snprintf(path, sizeof path, "%s/%s", ck->dir, name);
    if ((r = zero__ck_open_read(path, "client state file", 1, &fd, &st)) != ZERO_OK) return r;
    if ((uint64_t)st.st_size != ck->info.client_bytes) {
        close(fd);
        return zero__fail(ZERO_ERROR_IO, "%s: client state of %lld bytes, the manifest says %llu "
                          "(truncated or replaced)", path, (long long)st.st_size,
                          (unsigned long long)ck->info.client_bytes);
    }
    if (dst) {
        r = zero__ck_pread(fd, dst, (size_t)ck->info.client_bytes, 0, path);
        if (r == ZERO_OK) crc = zero_crc32c(0, dst, (size_t)ck->info.client_bytes);
    } else {
        size_t chunk = ck->info.client_bytes < ((uint64_t)1 << 20) ? (size_t)ck->info.client_bytes
                                                                   : (size_t)1 << 20, n;
        uint64_t off;
        unsigned char *buf = (unsigned char *)ZERO_MALLOC(chunk);
        r = buf ? ZERO_OK : zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: a buffer of %zu bytes", path, chunk);
        for (off = 0; r == ZERO_OK && off < ck->info.client_bytes; off += n) {
            n = ck->info.client_bytes - off < chunk ? (size_t)(ck->info.client_bytes - off) : chunk;
            r = zero__ck_pread(fd, buf, n, off, path);
            if (r == ZERO_OK) crc = zero_crc32c(crc, buf, n);
        }
        ZERO_FREE(buf);
    }
    close(fd);
    if (r != ZERO_OK) return r;
    if (crc != ck->client_crc)
        return zero__fail(ZERO_ERROR_IO, "%s: client state checksum mismatch (bytes 0..%llu: "
                          "stored %08x, computed %08x)", path,
                          (unsigned long long)ck->info.client_bytes - 1, ck->client_crc, crc);
    return ZERO_OK;
}

ZERODEF zero_result zero_checkpoint_read_client(zero_checkpoint *ck, void *dst)
{
    if (!ck || (!dst && ck->info.client_bytes))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_read_client: NULL");
    return zero__ck_read_client(ck, dst);
}

/* Reads a manifest: its fixed header first (magic, version, the size it declares and its
   counts), then exactly the declared size, which must be the file's and no more than the
   counts allow; so a huge or hostile file costs one small read. NOT_FOUND when missing. */
static zero_result zero__ck_read_manifest(const char *path, unsigned char **out, size_t *n)
{
    unsigned char h[ZERO__CK_MAN_FIXED];
    struct stat st;
    uint64_t declared, bound;
    uint32_t version, world, G, T;
    zero_result r;
    int fd, i;
    *out = NULL;
    *n = 0;
    if ((r = zero__ck_open_read(path, "manifest", 0, &fd, &st)) != ZERO_OK) return r;
    if (st.st_size < (off_t)ZERO__CK_MAN_FIXED + 4) {
        close(fd);
        return zero__fail(ZERO_ERROR_IO, "%s: not a zero manifest (%lld bytes)", path,
                          (long long)st.st_size);
    }
    if ((r = zero__ck_pread(fd, h, sizeof h, 0, path)) != ZERO_OK) {
        close(fd);
        return r;
    }
    for (declared = 0, i = 7; i >= 0; i--) declared = declared << 8 | h[16 + i];
    version = zero__ck_le32(h + 8);
    world = zero__ck_le32(h + 32);
    G = zero__ck_le32(h + 48);
    T = zero__ck_le32(h + 52);
    /* the largest manifest these counts allow: every name 255 bytes, every shape 8 dims */
    bound = ZERO__CK_MAN_FIXED + 24u * (uint64_t)G + (4u + 255u + 28u + 64u) * (uint64_t)T +
            16u * (uint64_t)world + 16u + 4u;
    r = ZERO_OK;
    if (memcmp(h, "ZEROMANI", 8) != 0)
        r = zero__fail(ZERO_ERROR_IO, "%s: not a zero manifest (%lld bytes, bad magic)", path,
                       (long long)st.st_size);
    else if (version < 1u || version > ZERO__CK_VERSION)
        r = zero__fail(ZERO_ERROR_IO, "%s: format version %u (this library reads 1..%u)", path,
                       version, ZERO__CK_VERSION);
    else if (declared != (uint64_t)st.st_size)
        r = zero__fail(ZERO_ERROR_IO, "%s: %lld bytes but its header says %llu", path,
                       (long long)st.st_size, (unsigned long long)declared);
    else if (declared > bound || declared > ((uint64_t)1 << 30))
        r = zero__fail(ZERO_ERROR_IO, "%s: %llu bytes, more than its %u groups, %u tensors and %u "
                       "ranks can take (%llu; at most 1 GiB)", path, (unsigned long long)declared,
                       G, T, world, (unsigned long long)bound);
    else if (!(*out = (unsigned char *)ZERO_MALLOC((size_t)declared)))
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: %llu bytes", path,
                       (unsigned long long)declared);
    else if ((r = zero__ck_pread(fd, *out, (size_t)declared, 0, path)) != ZERO_OK) {
        ZERO_FREE(*out);
        *out = NULL;
    }
    close(fd);
    if (r == ZERO_OK) *n = (size_t)declared;
    return r;
}

ZERODEF zero_result zero_checkpoint_open(const char *dir, zero_checkpoint **out)
{
    char path[4200];
    unsigned char *buf;
    size_t n;
    zero_result r;
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_open: out is NULL");
    *out = NULL;
    if (!dir || !dir[0] || strlen(dir) >= 4000)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_open: bad dir");
    snprintf(path, sizeof path, "%s/%s", dir, ZERO__CK_MANIFEST);
    r = zero__ck_read_manifest(path, &buf, &n);
    if (r != ZERO_OK) {
        if (r == ZERO_ERROR_NOT_FOUND)
            return zero__fail(r, "%s: no checkpoint (%s does not exist)", dir, path);
        return r;
    }
    r = zero__ck_parse_manifest(buf, n, path, out);
    ZERO_FREE(buf);
    if (r == ZERO_OK) snprintf((*out)->dir, sizeof (*out)->dir, "%s", dir);
    return r;
}

ZERODEF zero_result zero_checkpoint_get_info(const zero_checkpoint *ck, zero_checkpoint_info *out)
{
    if (!ck || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_get_info: NULL");
    *out = ck->info;
    return ZERO_OK;
}

ZERODEF zero_result zero_checkpoint_get_tensor(const zero_checkpoint *ck, int tensor,
                                               zero_checkpoint_tensor *out)
{
    const zero__ck_tensor *t;
    int k;
    if (!ck || !out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_get_tensor: NULL");
    if (tensor < 0 || tensor >= ck->info.num_tensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_checkpoint_get_tensor: tensor %d unknown", tensor);
    t = &ck->tensors[tensor];
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->group = (int)t->group;
    out->flags = t->flags;
    out->numel = (size_t)t->numel;
    out->ndim = t->ndim;
    for (k = 0; k < t->ndim; k++) out->dims[k] = t->dims[k];
    out->lr_mul = t->lr_mul;
    out->weight_decay = t->wd;
    return ZERO_OK;
}

static zero_result zero__ck_check_shard_header(const zero_checkpoint *ck, const unsigned char *h,
                                               const char *path, int q, uint32_t **sec_crc);

/* Checks a shard file's header against the manifest; *sec_crc receives 4 G section
   checksums (caller frees). fd is the open file. */
static zero_result zero__ck_check_shard(const zero_checkpoint *ck, int fd, const char *path,
                                        int q, uint32_t **sec_crc)
{
    struct stat st;
    unsigned char *h;
    zero_result r;
    *sec_crc = NULL;
    if (fstat(fd, &st) != 0) return zero__fail(ZERO_ERROR_IO, "%s: stat: %s", path, strerror(errno));
    if ((uint64_t)st.st_size != ck->file_bytes[q])
        return zero__fail(ZERO_ERROR_IO, "%s: %lld bytes, the manifest says %llu (truncated or "
                          "replaced)", path, (long long)st.st_size,
                          (unsigned long long)ck->file_bytes[q]);
    h = (unsigned char *)ZERO_MALLOC((size_t)ck->header_bytes);
    if (!h) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: header", path);
    r = zero__ck_pread(fd, h, (size_t)ck->header_bytes, 0, path);
    if (r == ZERO_OK) r = zero__ck_check_shard_header(ck, h, path, q, sec_crc);
    ZERO_FREE(h);
    return r;
}

/* The header part of zero__ck_check_shard(): h holds ck->header_bytes bytes. */
static zero_result zero__ck_check_shard_header(const zero_checkpoint *ck, const unsigned char *h,
                                               const char *path, int q, uint32_t **sec_crc)
{
    zero__ck_rd rd;
    zero_result r;
    uint32_t G = (uint32_t)ck->info.num_groups, i, crc;
    *sec_crc = (uint32_t *)ZERO_MALLOC((size_t)G * 16u);
    if (!*sec_crc) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: header", path);
    crc = zero__ck_le32(h + ck->header_bytes - 4);
    if (crc != ck->file_hcrc[q] || crc != zero_crc32c(0, h, (size_t)ck->header_bytes - 4)) {
        r = zero__fail(ZERO_ERROR_IO, "%s: header checksum mismatch (bytes 0..%llu: stored %08x, "
                       "manifest %08x, computed %08x)", path,
                       (unsigned long long)ck->header_bytes - 1, crc, ck->file_hcrc[q],
                       zero_crc32c(0, h, (size_t)ck->header_bytes - 4));
        goto out;
    }
    memset(&rd, 0, sizeof rd);
    rd.p = h;
    rd.n = (size_t)ck->header_bytes - 4;
    rd.at = 8;
    if (memcmp(h, "ZEROSHRD", 8) != 0 || zero__ck_get(&rd, 4) != ZERO__CK_SHARD_VERSION ||
        zero__ck_get(&rd, 4) != ck->header_bytes || zero__ck_get(&rd, 8) != ck->info.generation ||
        zero__ck_get(&rd, 4) != (uint64_t)q || zero__ck_get(&rd, 4) != (uint64_t)ck->info.world ||
        zero__ck_get(&rd, 4) != 4u * G || zero__ck_get(&rd, 4) != (uint64_t)ck->info.param_dtype ||
        zero__ck_get(&rd, 8) != ck->file_bytes[q]) {
        r = zero__fail(ZERO_ERROR_IO, "%s: header does not match the manifest (generation %llu, "
                       "rank %d of %d)", path, (unsigned long long)ck->info.generation, q,
                       ck->info.world);
        goto out;
    }
    rd.at = ZERO__CK_SHARD_FIXED;
    for (i = 0; i < 4u * G; i++) {
        int g = (int)(i / 4u), ki = (int)(i % 4u);
        uint64_t kind = zero__ck_get(&rd, 4), grp = zero__ck_get(&rd, 4);
        uint64_t off = zero__ck_get(&rd, 8), bytes = zero__ck_get(&rd, 8);
        (*sec_crc)[i] = (uint32_t)zero__ck_get(&rd, 4);
        (void)zero__ck_get(&rd, 4);
        if (kind != (uint64_t)zero__ck_kinds[ki] || grp != (uint64_t)g ||
            off != zero__ck_sec_off(ck, g, ki) ||
            bytes != zero__ck_sec_numel(ck, g, ki) * zero__ck_sec_esz(ck, ki)) {
            r = zero__fail(ZERO_ERROR_IO, "%s: section table entry %u (%s of group %d) does not "
                           "match the plan", path, i, zero__ck_kind_name(ki), g);
            goto out;
        }
    }
    r = ZERO_OK;
out:
    if (r != ZERO_OK) {
        ZERO_FREE(*sec_crc);
        *sec_crc = NULL;
    }
    return r;
}

/* A part of a section wanted by a reader: section elements [src, src + n) go to element
   dst of the destination (dst_base + dst * element size). */
typedef struct zero__ck_piece {
    uint64_t src, n, dst;
} zero__ck_piece;

/* Streams one whole section (so that its checksum can be checked), copying the pieces. */
static zero_result zero__ck_stream(const zero_checkpoint *ck, int fd, const char *path, int g,
                                   int ki, uint32_t want_crc, const zero__ck_piece *pc, int np,
                                   unsigned char *dst_base, unsigned char *chunk, size_t chunk_bytes)
{
    size_t esz = zero__ck_sec_esz(ck, ki);
    uint64_t bytes = zero__ck_sec_numel(ck, g, ki) * esz, off = zero__ck_sec_off(ck, g, ki), pos = 0;
    uint32_t crc = 0;
    size_t per = chunk_bytes / esz * esz;
    zero_result r;
    int i, direct;
    /* One piece covering the whole section (no resharding): read straight into place,
       checksumming each chunk while it is still in cache. */
    direct = np == 1 && pc[0].src == 0 && pc[0].n * esz == bytes && dst_base != NULL;
    if (per > ((size_t)4 << 20)) per = (size_t)4 << 20; /* cache-sized chunks */
    while (pos < bytes) {
        size_t c = (size_t)(bytes - pos < per ? bytes - pos : per);
        uint64_t e0 = pos / esz, e1 = (pos + c) / esz;
        if (direct) {
            unsigned char *dst = dst_base + pc[0].dst * esz + pos;
            r = zero__ck_pread(fd, dst, c, off + pos, path);
            if (r != ZERO_OK) return r;
            crc = zero_crc32c(crc, dst, c);
            pos += c;
            continue;
        }
        r = zero__ck_pread(fd, chunk, c, off + pos, path);
        if (r != ZERO_OK) return r;
        crc = zero_crc32c(crc, chunk, c);
        for (i = 0; i < np; i++) {
            uint64_t lo = pc[i].src > e0 ? pc[i].src : e0;
            uint64_t hi = pc[i].src + pc[i].n < e1 ? pc[i].src + pc[i].n : e1;
            if (lo < hi)
                memcpy(dst_base + (pc[i].dst + (lo - pc[i].src)) * esz, chunk + (lo - e0) * esz,
                       (size_t)(hi - lo) * esz);
        }
        pos += c;
    }
    if (crc != want_crc) {
        int t = ck->groups[g].first_tensor;
        return zero__fail(ZERO_ERROR_IO, "%s: checksum mismatch in the %s section of group %d "
                          "(bytes %llu..%llu; tensors from '%s'): stored %08x, computed %08x",
                          path, zero__ck_kind_name(ki), g, (unsigned long long)off,
                          (unsigned long long)(off + bytes - 1), t >= 0 ? ck->tensors[t].name : "?",
                          want_crc, crc);
    }
    return ZERO_OK;
}

/* A reading plan: for each saved rank q and group g, which pieces some caller wants.
   want(ctx, q, g, pieces, &np) fills the element pieces (dst in the caller's element
   units); base(ctx, ki) gives the destination of kind ki (NULL: not wanted). */
typedef struct zero__ck_reader {
    int (*want)(void *ctx, const zero_checkpoint *ck, int q, int g, zero__ck_piece *pc);
    unsigned char *(*base)(void *ctx, int ki);
    void *ctx;
} zero__ck_reader;

static zero_result zero__ck_read(const zero_checkpoint *ck, const zero__ck_reader *rdr)
{
    int q, g, ki, maxpc = 1;
    zero_result r = ZERO_OK;
    zero__ck_piece *pc;
    unsigned char *chunk;
    size_t chunk_bytes = ZERO__CK_CHUNK;
    for (g = 0; g < ck->info.num_groups; g++) {
        int cnt = 0, t;
        for (t = 0; t < ck->info.num_tensors; t++) cnt += ck->tensors[t].group == (uint32_t)g;
        if (cnt > maxpc) maxpc = cnt;
    }
    pc = (zero__ck_piece *)ZERO_MALLOC((size_t)maxpc * sizeof *pc);
    chunk = (unsigned char *)ZERO_MALLOC(chunk_bytes);
    if (!pc || !chunk) {
        ZERO_FREE(pc);
        ZERO_FREE(chunk);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "checkpoint read: %zu bytes", chunk_bytes);
    }
    for (q = 0; q < ck->info.world && r == ZERO_OK; q++) {
        char name[64], path[4200];
        int fd = -1;
        uint32_t *crcs = NULL;
        zero__ck_shard_name(name, sizeof name, ck->info.generation, q);
        snprintf(path, sizeof path, "%s/%s", ck->dir, name);
        for (g = 0; g < ck->info.num_groups && r == ZERO_OK; g++) {
            int np = rdr->want(rdr->ctx, ck, q, g, pc);
            if (np == 0) continue;
            if (fd < 0) {
                char what[64];
                snprintf(what, sizeof what, "shard file of rank %d", q);
                if ((r = zero__ck_open_read(path, what, 1, &fd, NULL)) != ZERO_OK) break;
                r = zero__ck_check_shard(ck, fd, path, q, &crcs);
                if (r != ZERO_OK) break;
            }
            for (ki = 0; ki < 4 && r == ZERO_OK; ki++) {
                unsigned char *b = rdr->base(rdr->ctx, ki);
                if (b || np < 0)
                    r = zero__ck_stream(ck, fd, path, g, ki, crcs[(size_t)g * 4u + (size_t)ki], pc,
                                        np < 0 ? 0 : np, b, chunk, chunk_bytes);
            }
        }
        if (fd >= 0) close(fd);
        ZERO_FREE(crcs);
    }
    ZERO_FREE(pc);
    ZERO_FREE(chunk);
    return r;
}

/* verify: every section of every file, no pieces (want returns -1: stream everything). */
static int zero__ck_want_all(void *ctx, const zero_checkpoint *ck, int q, int g, zero__ck_piece *pc)
{
    (void)ctx; (void)ck; (void)q; (void)g; (void)pc;
    return -1;
}
static unsigned char *zero__ck_base_none(void *ctx, int ki)
{
    (void)ctx; (void)ki;
    return NULL;
}

ZERODEF zero_result zero_checkpoint_verify(zero_checkpoint *ck)
{
    zero__ck_reader rdr;
    zero_result r;
    if (!ck) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_verify: NULL");
    rdr.want = zero__ck_want_all;
    rdr.base = zero__ck_base_none;
    rdr.ctx = NULL;
    if ((r = zero__ck_read(ck, &rdr)) != ZERO_OK) return r;
    return zero__ck_read_client(ck, NULL);
}

/* read_tensor: one tensor, one kind, whole. */
typedef struct zero__ck_one {
    int tensor, ki;
    unsigned char *dst;
} zero__ck_one;

static int zero__ck_want_one(void *ctx, const zero_checkpoint *ck, int q, int g, zero__ck_piece *pc)
{
    zero__ck_one *o = (zero__ck_one *)ctx;
    const zero__ck_tensor *t = &ck->tensors[o->tensor];
    zero_range seg;
    memset(&seg, 0, sizeof seg);
    if (t->group != (uint32_t)g) return 0;
    if (zero_plan_intersect(ck->plan, o->tensor, q, &seg) != ZERO_OK || seg.numel == 0) return 0;
    pc[0].src = zero__plan_shard_pos(ck->plan, o->tensor, q, seg.offset);
    pc[0].n = seg.numel;
    pc[0].dst = seg.offset - t->offset;
    return 1;
}

static unsigned char *zero__ck_base_one(void *ctx, int ki)
{
    zero__ck_one *o = (zero__ck_one *)ctx;
    return ki == o->ki ? o->dst : NULL;
}

ZERODEF zero_result zero_checkpoint_read_tensor(zero_checkpoint *ck, int tensor,
                                                zero_state_kind kind, void *dst)
{
    zero__ck_one o;
    zero__ck_reader rdr;
    int ki;
    if (!ck || !dst) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_read_tensor: NULL");
    if (tensor < 0 || tensor >= ck->info.num_tensors)
        return zero__fail(ZERO_ERROR_NOT_FOUND, "zero_checkpoint_read_tensor: tensor %d unknown", tensor);
    for (ki = 0; ki < 4 && zero__ck_kinds[ki] != kind; ki++) {}
    if (ki == 4) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_read_tensor: kind %d", (int)kind);
    if (ki < 3 && (ck->tensors[tensor].flags & ZERO_TENSOR_FROZEN))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_read_tensor: tensor '%s' is "
                          "frozen: it has no %s (read its params)", ck->tensors[tensor].name,
                          zero__ck_kind_name(ki));
    o.tensor = tensor;
    o.ki = ki;
    o.dst = (unsigned char *)dst;
    rdr.want = zero__ck_want_one;
    rdr.base = zero__ck_base_one;
    rdr.ctx = &o;
    return zero__ck_read(ck, &rdr);
}

/* ---- collective agreement ------------------------------------------------------------------- */

/* A control all-reduce of n (<= 8) doubles through the engine's scratch. */
static zero_result zero__ck_allreduce(zero_engine *e, double *v, int n, zero_op op)
{
    return zero__eng_ctl_allreduce(e, v, n, op, ZERO_ROLE_CHECKPOINT, "checkpoint");
}

/* Every rank passes its own result r; all return the same: OK, or the code and message of
   the lowest failing rank (shared over 5 control all-reduces of 8 doubles, 6 bytes each).
   *val (may be NULL) is max-reduced along the way, exactly, as two 32-bit halves (rank 0
   proposes a value, the others pass 0). */
static zero_result zero__ck_agree(zero_engine *e, zero_result r, uint64_t *val)
{
    enum { ROUNDS = 5, BYTES = ROUNDS * 8 * 6 };
    char msg[BYTES];
    unsigned char b[BYTES];
    double v[8];
    zero_result rr;
    int f, i, j, k;
    msg[0] = '\0';
    if (r != ZERO_OK) snprintf(msg, sizeof msg, "%.238s", zero_last_error());
    v[0] = r != ZERO_OK ? (double)(e->topo.world_all - e->topo.rank_all) : 0.0;
    v[1] = val ? (double)(*val >> 32) : 0.0;
    v[2] = val ? (double)(*val & 0xffffffffu) : 0.0;
    if ((rr = zero__ck_allreduce(e, v, 3, ZERO_OP_MAX)) != ZERO_OK) return rr;
    if (val) *val = (uint64_t)v[1] << 32 | (uint64_t)v[2];
    if (v[0] == 0.0) return ZERO_OK;
    f = e->topo.world_all - (int)v[0];
    memset(b, 0, sizeof b);
    if (e->topo.rank_all == f) {
        b[0] = (unsigned char)(-(int)r);
        memcpy(b + 1, msg, strlen(msg) < BYTES - 2 ? strlen(msg) : BYTES - 2);
    }
    for (i = 0; i < ROUNDS; i++) {
        for (j = 0; j < 8; j++) {
            double d = 0.0;
            for (k = 5; k >= 0; k--) d = d * 256.0 + (double)b[i * 48 + j * 6 + k];
            v[j] = e->topo.rank_all == f ? d : 0.0;
        }
        if ((rr = zero__ck_allreduce(e, v, 8, ZERO_OP_SUM)) != ZERO_OK) return rr;
        for (j = 0; j < 8; j++) {
            double d = v[j];
            for (k = 0; k < 6; k++) {
                double q = floor(d / 256.0);
                b[i * 48 + j * 6 + k] = (unsigned char)(d - q * 256.0);
                d = q;
            }
        }
    }
    b[BYTES - 1] = 0;
    if (e->cfg.rank == f) return zero__fail(r, "%s", msg);
    return zero__fail((zero_result)(-(int)b[0]), "%s (reported by rank %d)", (const char *)(b + 1), f);
}

/* One control all-reduce: *same = 1 when every rank passed the same n (<= 2) values (each
   sent exactly as two 32-bit halves; max(x) + max(C - x) = C only when all x are equal). */
static zero_result zero__ck_same_u64(zero_engine *e, const uint64_t *vals, int n, int *same)
{
    const double C = 4294967295.0;
    double v[8];
    zero_result r;
    int i;
    for (i = 0; i < 2 * n; i++) {
        double half = (double)(i % 2 ? vals[i / 2] & 0xffffffffu : vals[i / 2] >> 32);
        v[2 * i] = half;
        v[2 * i + 1] = C - half;
    }
    if ((r = zero__ck_allreduce(e, v, 4 * n, ZERO_OP_MAX)) != ZERO_OK) return r;
    *same = 1;
    for (i = 0; i < 2 * n; i++)
        if (v[2 * i] + v[2 * i + 1] != C) *same = 0;
    return ZERO_OK;
}

static zero_result zero__ck_between_steps(zero_engine *e, const char *fn, int need_released)
{
    int g;
    zero_result r = zero__eng_step_settle(e); /* async_step: the pending verdict first */
    if (r != ZERO_OK) return r;
    if (e->micro.done != 0 || e->micro.ready_groups != 0)
        return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: in the middle of a step (%d micro-steps "
                          "done)", fn, e->micro.done);
    if (need_released)
        for (g = 0; g < e->layout.ngroups; g++)
            if (e->layout.groups[g].refs > 0)
                return zero__fail(ZERO_ERROR_INVALID_STATE, "%s: group %d is gathered (release "
                                  "every group first)", fn, g);
    return zero__dpu_join(e); /* delayed_update: master, m, v complete */
}

/* ---- save ------------------------------------------------------------------------------------ */

/* The generation a file name of the format carries ("zero-<16 hex digits>-..." or
   "zero-<16 hex digits>.client..."); 0 when the name is not one. */
static int zero__ck_name_gen(const char *s, uint64_t *gen)
{
    char *end = NULL;
    unsigned long long g;
    if (strncmp(s, "zero-", 5) != 0) return 0;
    g = strtoull(s + 5, &end, 16);
    if (end != s + 5 + 16 || (*end != '-' && *end != '.')) return 0;
    *gen = (uint64_t)g;
    return 1;
}

/* The generation the manifest in dir names (0: none or unreadable). Never blocks. */
static uint64_t zero__ck_manifest_gen(const char *dir)
{
    char path[4200];
    unsigned char h[32];
    uint64_t g = 0;
    int fd, i;
    snprintf(path, sizeof path, "%s/%s", dir, ZERO__CK_MANIFEST);
    if (zero__ck_open_read(path, "manifest", 0, &fd, NULL) != ZERO_OK) return 0;
    if (zero__ck_pread(fd, h, 32, 0, path) == ZERO_OK && memcmp(h, "ZEROMANI", 8) == 0)
        for (i = 7; i >= 0; i--) g = g << 8 | h[24 + i];
    close(fd);
    return g;
}

static int zero__ck_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y ? 1 : 0;
}

/* The generation of the next save: 1 + the highest generation that the manifest or any file
   of dir names, as a 64-bit integer. After 2^64 - 1 it wraps to the lowest generation no
   file names (>= 1), so that a new generation never reuses a present file's. A manifest
   that is not a regular file is refused. */
static zero_result zero__ck_next_gen(const char *dir, uint64_t *out)
{
    char path[4200];
    uint64_t best = 0, *all = NULL, g;
    size_t n = 0, cap = 0, i;
    struct stat st;
    DIR *d;
    zero_result r = ZERO_OK;
    *out = 0;
    snprintf(path, sizeof path, "%s/%s", dir, ZERO__CK_MANIFEST);
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
        return zero__fail(ZERO_ERROR_IO, "%s: the manifest is not a regular file; refusing to "
                          "save over it", path);
    d = opendir(dir);
    if (!d) return zero__fail(ZERO_ERROR_IO, "%s: open directory: %s", dir, strerror(errno));
    for (;;) {
        struct dirent *de = readdir(d);
        if (!de) break;
        if (!zero__ck_name_gen(de->d_name, &g)) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            uint64_t *na = (uint64_t *)ZERO_MALLOC(nc * sizeof *na);
            if (!na) {
                r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_save: directory listing");
                break;
            }
            if (n) memcpy(na, all, n * sizeof *na);
            ZERO_FREE(all);
            all = na;
            cap = nc;
        }
        all[n++] = g;
        if (g > best) best = g;
    }
    closedir(d);
    g = zero__ck_manifest_gen(dir);
    if (g > best) best = g;
    if (r == ZERO_OK && best < UINT64_MAX) {
        *out = best + 1;
    } else if (r == ZERO_OK) { /* wrap-around: the lowest generation no file names */
        uint64_t want = 1;
        if (n) qsort(all, n, sizeof *all, zero__ck_cmp_u64);
        for (i = 0; i < n; i++) {
            if (all[i] == want) want++;
            else if (all[i] > want) break;
        }
        if (want == g) want++; /* the manifest's (kept when its shard files are gone) */
        *out = want;
    }
    ZERO_FREE(all);
    return r;
}

/* 1 for the temporaries of this format: "zero-<16 hex>...tmp" and "zero.manifest...tmp". */
static int zero__ck_is_tmp(const char *s)
{
    size_t L = strlen(s);
    uint64_t g;
    if (L < 4 || strcmp(s + L - 4, ".tmp") != 0) return 0;
    return zero__ck_name_gen(s, &g) || strncmp(s, ZERO__CK_MANIFEST ".", 14) == 0;
}

/* Removes, best effort: keep_only: every file of another generation than keep and every
   temporary; else: the files of generation keep that this rank wrote (its shard file; rank
   0 also the client state file). */
static void zero__ck_cleanup(const char *dir, uint64_t keep, int keep_only, int rank)
{
    DIR *d;
    struct dirent *de;
    char path[4200], name[64];
    if (!keep_only) {
        zero__ck_shard_name(name, sizeof name, keep, rank);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        (void)unlink(path);
        if (rank == 0) {
            zero__ck_client_name(name, sizeof name, keep);
            snprintf(path, sizeof path, "%s/%s", dir, name);
            (void)unlink(path);
        }
        return;
    }
    d = opendir(dir);
    if (!d) return;
    while ((de = readdir(d)) != NULL) {
        const char *s = de->d_name;
        uint64_t g;
        if (zero__ck_is_tmp(s) || (zero__ck_name_gen(s, &g) && g != keep)) {
            snprintf(path, sizeof path, "%s/%s", dir, s);
            (void)unlink(path);
        } else if (strncmp(s, "zero.lock.", 10) == 0) { /* a lock in the making, if flocked */
            int fd;
            snprintf(path, sizeof path, "%s/%s", dir, s);
            fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
            if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) (void)unlink(path);
            if (fd >= 0) close(fd);
        }
    }
    closedir(d);
}

/* The save lock, dir/zero.lock, held by rank 0 for the whole save. Its flock decides:
   a lock whose flock is held is live whatever its text says (the holder's pid may be in
   another PID namespace, container or host), and only a lock whose flock can be taken is
   stale (its holder's process ended: kill -9 included), whatever it holds (empty,
   unreadable). So the lock never appears without its flock: it is made under a private
   name (zero.lock.<pid>.<n>.tmp), flocked and written, then link()ed to zero.lock, which
   fails if one exists. A stale lock is unlinked while its flock is held (and only if the
   name still points at it), then the new one is made. Where link() is refused (file
   systems without hard links), O_EXCL then flock, checking the name still points at it. */
static zero_result zero__ck_lock_make(const char *path, const char *text, int *fd_out, int *exists)
{
    static int serial;
    char tmp[4300];
    size_t n = strlen(text);
    int fd, linked, err = 0;
    struct stat st, st2;
    zero_result r;
    *fd_out = -1;
    *exists = 0;
    snprintf(tmp, sizeof tmp, "%s.%ld.%d.tmp", path, (long)getpid(), __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED));
    fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return zero__fail(ZERO_ERROR_IO, "%s: create the save lock: %s", tmp, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        err = errno;
        (void)unlink(tmp);
        close(fd);
        return zero__fail(ZERO_ERROR_IO, "%s: flock: %s", tmp, strerror(err));
    }
    if ((r = zero__ck_pwrite(fd, text, n, 0, tmp)) != ZERO_OK) {
        (void)unlink(tmp);
        close(fd);
        return r;
    }
    linked = link(tmp, path) == 0;
    if (!linked) err = errno;
    (void)unlink(tmp);
    if (linked) {
        *fd_out = fd;
        return ZERO_OK;
    }
    close(fd);
    if (err == EEXIST || err == ENOENT) { /* ENOENT: a save's cleanup took the private name */
        *exists = 1;
        return ZERO_OK;
    }
    if (err != EPERM && err != ENOTSUP && err != EOPNOTSUPP && err != EXDEV && err != EMLINK)
        return zero__fail(ZERO_ERROR_IO, "%s: create the save lock: %s", path, strerror(err));
    /* no hard links here: O_EXCL, then flock; a peer that found it unlocked in between may
       have removed it, so the name must still point at this file */
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
        if (errno == EEXIST) {
            *exists = 1;
            return ZERO_OK;
        }
        return zero__fail(ZERO_ERROR_IO, "%s: create the save lock: %s", path, strerror(errno));
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &st) != 0 || stat(path, &st2) != 0 ||
        st.st_ino != st2.st_ino || st.st_dev != st2.st_dev) {
        close(fd); /* taken meanwhile, or removed as stale: try again */
        *exists = 1;
        return ZERO_OK;
    }
    if ((r = zero__ck_pwrite(fd, text, n, 0, path)) != ZERO_OK) {
        (void)unlink(path);
        close(fd);
        return r;
    }
    *fd_out = fd;
    return ZERO_OK;
}

static zero_result zero__ck_lock(const char *dir, int *fd_out)
{
    char path[4200], host[256], buf[400];
    int tries;
    *fd_out = -1;
    snprintf(path, sizeof path, "%s/zero.lock", dir);
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    for (tries = 0; tries < 8; tries++) {
        struct stat st, st2;
        long pid = 0;
        char other[256];
        ssize_t got;
        int fd, exists, locked_err;
        zero_result r;
        snprintf(buf, sizeof buf, "pid %ld host %s\n", (long)getpid(), host);
        r = zero__ck_lock_make(path, buf, fd_out, &exists);
        if (r != ZERO_OK || !exists) return r;
        fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) continue; /* released meanwhile */
            return zero__fail(ZERO_ERROR_IO, "%s: the save lock: %s", path, strerror(errno));
        }
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            return zero__fail(ZERO_ERROR_IO, "%s: the save lock is not a regular file", path);
        }
        locked_err = flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : errno;
        if (locked_err == 0) { /* stale: its holder is gone; remove it if the name still is it */
            if (stat(path, &st2) == 0 && st2.st_ino == st.st_ino && st2.st_dev == st.st_dev)
                (void)unlink(path);
            close(fd);
            continue;
        }
        got = pread(fd, buf, sizeof buf - 1, 0);
        buf[got > 0 ? got : 0] = '\0';
        close(fd);
        snprintf(other, sizeof other, "?");
        if (sscanf(buf, "pid %ld host %255s", &pid, other) < 1) pid = 0;
        if (locked_err != EWOULDBLOCK && locked_err != EAGAIN)
            return zero__fail(ZERO_ERROR_IO, "%s: flock: %s (cannot tell whether the save lock of pid "
                              "%ld, host %s is live)", path, strerror(locked_err), pid, other);
        return zero__fail(ZERO_ERROR_IO, "another save is in progress in %s (pid %ld, host %s; "
                          "%s)", dir, pid, other, path);
    }
    return zero__fail(ZERO_ERROR_IO, "%s: could not take the save lock", path);
}

static void zero__ck_unlock(const char *dir, int fd)
{
    char path[4200];
    if (fd < 0) return;
    snprintf(path, sizeof path, "%s/zero.lock", dir);
    (void)unlink(path);
    close(fd);
}

static void zero__ck_sec_entry(zero__ck_buf *b, uint32_t kind, uint32_t g, uint64_t off,
                               uint64_t bytes, uint32_t crc)
{
    zero__ck_u32(b, kind);
    zero__ck_u32(b, g);
    zero__ck_u64(b, off);
    zero__ck_u64(b, bytes);
    zero__ck_u32(b, crc);
    zero__ck_u32(b, 0);
}

/* ---- the shard file's writer ------------------------------------------------------------------
   A save writes its shard file as four streams at once: a group's master, m, v and params
   sections, chunk by chunk (zero__ck_write_shard). Where the file system takes O_DIRECT
   (set with fcntl on the new temporary, then preallocated with posix_fallocate), each chunk is
   staged in one of ZERO__CK_WBUFS aligned buffers at its offset within its 4 KiB block,
   behind the stream's partial block carried over from its previous chunk: the blocks wholly
   inside one section go to the disk from there, on ZERO__CK_WTHREADS writer threads, which
   also take each chunk's CRC32C (joined per section with zero_crc32c_combine, in file
   order, as the buffers are reclaimed); the blocks where sections meet, and the header's,
   are assembled apart (edge blocks) and written as soon as every byte of them has arrived;
   the file's last block is written whole and the file truncated to its size. Where O_DIRECT
   is refused (EINVAL), or with zero__ck_direct_off set, the bytes go at their offsets with
   buffered pwrites from one staging buffer and the CRC is taken on the caller's thread. The
   bytes are the same either way (tests/test_checkpoint.c compares the files). Host memory:
   ZERO__CK_WBUFS x (4 MiB + 4 KiB) of staging (O_DIRECT) or one 4 MiB buffer (buffered),
   four 4 KiB carry blocks and the edge blocks (the header's, ceil(header / 4 KiB) + 1, and
   at most about five more at once). */
#define ZERO__CK_WBUF ((size_t)4 << 20) /* bytes of one chunk of one section */
#define ZERO__CK_WBUFS 4
#define ZERO__CK_WTHREADS 2

/* Test hooks: zero__ck_direct_off forces the buffered path (as a refused O_DIRECT would);
   zero__ck_direct_used is 1 after a shard file was written or read with O_DIRECT, 0 buffered. */
static int zero__ck_direct_off;
static int zero__ck_direct_used;

typedef struct zero__ck_wjob {
    unsigned char *buf;         /* ZERO__CK_WBUF + ZERO_IO_ALIGN bytes, aligned */
    const unsigned char *data;  /* the chunk's bytes: its CRC32C */
    size_t data_n;
    const unsigned char *wp;    /* the whole blocks it writes, at file offset woff */
    size_t wn;
    uint64_t woff;
    uint32_t crc, *acc;         /* joined into *acc when the buffer is reclaimed */
    int done, err;              /* err: errno of a failed write at byte err_at */
    uint64_t err_at;
} zero__ck_wjob;

typedef struct zero__ck_edge {
    uint64_t block;
    size_t filled;
    unsigned char *p;
} zero__ck_edge;

typedef struct zero__ck_writer {
    const zero_allocator *alloc;
    int fd, direct;
    const char *path;   /* the temporary (errors, the fault hook) */
    uint64_t size;      /* the file's bytes */
    unsigned char *chunk; /* buffered: the one staging buffer */
    zero__ck_wjob jobs[ZERO__CK_WBUFS];
    uint64_t next, reclaimed, run; /* jobs filled, reclaimed, taken by a thread (counts) */
    int nth, stop, sync_made;
#if defined(__linux__)
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t th[ZERO__CK_WTHREADS];
#endif
    unsigned char *carry;  /* 4 x ZERO_IO_ALIGN: each stream's partial block */
    uint64_t carry_end[4]; /* where the stream's staged bytes end (file offset) */
    int cur;               /* the chunk being filled: stream, offset, its section */
    uint64_t cur_off, sec_lo, sec_hi;
    zero__ck_edge *edges;
    unsigned char *edge_mem;
    size_t nedges, cap;
} zero__ck_writer;

static zero_result zero__ck_w_write(zero__ck_writer *w, const unsigned char *p, size_t n, uint64_t off)
{
    if (zero__ck_io_fault && n > 0) {
        int er = zero__ck_io_fault(w->path, 'w');
        if (er)
            return zero__fail(ZERO_ERROR_IO, "%s: write at byte %llu: %s", w->path,
                              (unsigned long long)off, strerror(er));
    }
    while (n > 0) {
        ssize_t k = pwrite(w->fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return zero__fail(ZERO_ERROR_IO, "%s: write at byte %llu: %s", w->path,
                              (unsigned long long)off, k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return ZERO_OK;
}

/* A job's work, on a writer thread (or the caller's when none started): the CRC, the write. */
static void zero__ck_w_job(zero__ck_writer *w, zero__ck_wjob *j)
{
    const unsigned char *p = j->wp;
    size_t n = j->wn;
    uint64_t off = j->woff;
    j->crc = zero_crc32c(0, j->data, j->data_n);
    j->err = 0;
    while (n > 0) {
        ssize_t k = pwrite(w->fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            j->err = k < 0 ? errno : EIO;
            j->err_at = off;
            break;
        }
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
}

#if defined(__linux__)
static void *zero__ck_w_thread(void *arg)
{
    zero__ck_writer *w = (zero__ck_writer *)arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        zero__ck_wjob *j;
        while (!w->stop && w->run == w->next) pthread_cond_wait(&w->work, &w->mu);
        if (w->stop) break;
        j = &w->jobs[w->run % ZERO__CK_WBUFS];
        w->run++;
        pthread_mutex_unlock(&w->mu);
        zero__ck_w_job(w, j);
        pthread_mutex_lock(&w->mu);
        j->done = 1;
        pthread_cond_broadcast(&w->done);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}
#endif

/* Waits for the oldest job still out, joins its CRC and takes its error. */
static zero_result zero__ck_w_reclaim(zero__ck_writer *w)
{
    zero__ck_wjob *j = &w->jobs[w->reclaimed % ZERO__CK_WBUFS];
#if defined(__linux__)
    if (w->nth > 0) {
        pthread_mutex_lock(&w->mu);
        while (!j->done) pthread_cond_wait(&w->done, &w->mu);
        pthread_mutex_unlock(&w->mu);
    }
#endif
    w->reclaimed++;
    *j->acc = zero_crc32c_combine(*j->acc, j->crc, j->data_n);
    if (j->err)
        return zero__fail(ZERO_ERROR_IO, "%s: write at byte %llu: %s", w->path,
                          (unsigned long long)j->err_at, strerror(j->err));
    return ZERO_OK;
}

static zero_result zero__ck_w_drain(zero__ck_writer *w)
{
    zero_result r = ZERO_OK;
    while (w->reclaimed < w->next) {
        zero_result r2 = zero__ck_w_reclaim(w);
        if (r == ZERO_OK) r = r2;
    }
    return r;
}

/* Stops the threads (a job being written finishes first) and frees everything; the
   descriptor stays open. */
static void zero__ck_w_close(zero__ck_writer *w)
{
    int i;
#if defined(__linux__)
    if (w->sync_made) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_broadcast(&w->work);
        pthread_mutex_unlock(&w->mu);
        for (i = 0; i < w->nth; i++) pthread_join(w->th[i], NULL);
        pthread_cond_destroy(&w->work);
        pthread_cond_destroy(&w->done);
        pthread_mutex_destroy(&w->mu);
    }
    for (i = 0; i < ZERO__CK_WBUFS; i++) zero__io_aligned_free(w->alloc, w->jobs[i].buf);
    zero__io_aligned_free(w->alloc, w->carry);
    zero__io_aligned_free(w->alloc, w->edge_mem);
#endif
    (void)i;
    zero__free(w->alloc, w->chunk);
    zero__free(w->alloc, w->edges);
    memset(w, 0, sizeof *w);
    w->fd = -1;
}

/* Sets the writer up on the new temporary fd for a file of 'size' bytes whose header is
   hb bytes: O_DIRECT, its buffers and threads; or the buffered path. */
static zero_result zero__ck_w_open(zero__ck_writer *w, const zero_allocator *alloc, int fd,
                                   const char *path, uint64_t size, uint64_t hb)
{
    memset(w, 0, sizeof *w);
    w->alloc = alloc;
    w->fd = fd;
    w->path = path;
    w->size = size;
    w->cur = -1;
#if defined(__linux__) && defined(O_DIRECT)
    if (!zero__ck_direct_off && !(zero__ck_io_fault && zero__ck_io_fault(path, 'd'))) {
        int fl = fcntl(fd, F_GETFL), i, err;
        w->direct = fl >= 0 && fcntl(fd, F_SETFL, fl | O_DIRECT) == 0;
        if (w->direct) {
            /* unwritten extents: aligned O_DIRECT writes into them run concurrently (ext4
               and xfs take the inode's lock shared for them), and a full disk shows here.
               (After O_DIRECT: where the file system has no fallocate, glibc's emulation
               fails at once instead of writing every block.) */
            err = posix_fallocate(fd, 0, (off_t)zero_io_align_up(size));
            if (err == ENOSPC)
                return zero__fail(ZERO_ERROR_IO, "%s: reserving %llu bytes: %s", path,
                                  (unsigned long long)size, strerror(err));
            w->cap = (size_t)(hb / ZERO_IO_ALIGN) + 16u;
            for (i = 0; i < ZERO__CK_WBUFS; i++)
                w->jobs[i].buf = (unsigned char *)zero__io_aligned_alloc(alloc, ZERO__CK_WBUF + ZERO_IO_ALIGN);
            w->carry = (unsigned char *)zero__io_aligned_alloc(alloc, 4u * ZERO_IO_ALIGN);
            w->edge_mem = (unsigned char *)zero__io_aligned_alloc(alloc, w->cap * ZERO_IO_ALIGN);
            w->edges = (zero__ck_edge *)zero__alloc(alloc, w->cap * sizeof *w->edges);
            err = w->carry && w->edge_mem && w->edges;
            for (i = 0; i < ZERO__CK_WBUFS; i++) err = err && w->jobs[i].buf;
            for (i = 0; err && i < (int)w->cap; i++) w->edges[i].p = w->edge_mem + (size_t)i * ZERO_IO_ALIGN;
            if (!err) {
                zero__ck_w_close(w);
                return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_save: staging buffers");
            }
            if (pthread_mutex_init(&w->mu, NULL) == 0) {
                if (pthread_cond_init(&w->work, NULL) == 0) {
                    if (pthread_cond_init(&w->done, NULL) == 0) w->sync_made = 1;
                    else pthread_cond_destroy(&w->work);
                }
                if (!w->sync_made) pthread_mutex_destroy(&w->mu);
            }
            /* without threads the caller writes each chunk itself */
            for (i = 0; w->sync_made && i < ZERO__CK_WTHREADS; i++) {
                if (pthread_create(&w->th[i], NULL, zero__ck_w_thread, w) != 0) break;
                w->nth++;
            }
            __atomic_store_n(&zero__ck_direct_used, 1, __ATOMIC_RELAXED);
            return ZERO_OK;
        }
    }
#else
    (void)hb;
    (void)zero__ck_direct_off;
#endif
    __atomic_store_n(&zero__ck_direct_used, 0, __ATOMIC_RELAXED);
    w->chunk = (unsigned char *)zero__alloc(alloc, ZERO__CK_WBUF);
    if (!w->chunk) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_save: staging buffer");
    return ZERO_OK;
}

/* The bytes [off, off + n) at p, of blocks that hold bytes of more than one section (or of
   the header): copied into their edge blocks; a block that is complete is written. */
static zero_result zero__ck_w_edge(zero__ck_writer *w, uint64_t off, const unsigned char *p, size_t n)
{
#if defined(__linux__)
    while (n > 0) {
        uint64_t blk = off / ZERO_IO_ALIGN, at = blk * ZERO_IO_ALIGN;
        size_t in = (size_t)(off - at), k = ZERO_IO_ALIGN - in, i, want;
        zero__ck_edge *ed = NULL;
        if (k > n) k = n;
        for (i = 0; i < w->nedges && !ed; i++)
            if (w->edges[i].block == blk) ed = &w->edges[i];
        if (!ed) {
            if (w->nedges == w->cap) { /* more blocks open than planned: twice the room */
                size_t cap = w->cap * 2u;
                unsigned char *mem = (unsigned char *)zero__io_aligned_alloc(w->alloc, cap * ZERO_IO_ALIGN);
                zero__ck_edge *eds = (zero__ck_edge *)zero__alloc(w->alloc, cap * sizeof *eds);
                if (!mem || !eds) {
                    zero__io_aligned_free(w->alloc, mem);
                    zero__free(w->alloc, eds);
                    return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_save: edge blocks");
                }
                for (i = 0; i < cap; i++) {
                    eds[i].block = i < w->nedges ? w->edges[i].block : 0;
                    eds[i].filled = i < w->nedges ? w->edges[i].filled : 0;
                    eds[i].p = mem + i * ZERO_IO_ALIGN;
                    if (i < w->nedges) memcpy(eds[i].p, w->edges[i].p, ZERO_IO_ALIGN);
                }
                zero__io_aligned_free(w->alloc, w->edge_mem);
                zero__free(w->alloc, w->edges);
                w->edge_mem = mem;
                w->edges = eds;
                w->cap = cap;
            }
            ed = &w->edges[w->nedges++];
            ed->block = blk;
            ed->filled = 0;
            memset(ed->p, 0, ZERO_IO_ALIGN); /* the last block's tail past the end stays 0 */
        }
        memcpy(ed->p + in, p, k);
        ed->filled += k;
        want = at + ZERO_IO_ALIGN <= w->size ? ZERO_IO_ALIGN : (size_t)(w->size - at);
        if (ed->filled >= want) {
            zero__ck_edge done = *ed;
            zero_result r = zero__ck_w_write(w, done.p, ZERO_IO_ALIGN, at);
            *ed = w->edges[w->nedges - 1]; /* the entries keep their own blocks: swap */
            w->edges[w->nedges - 1] = done;
            w->nedges--;
            if (r != ZERO_OK) return r;
        }
        off += k;
        p += k;
        n -= k;
    }
    return ZERO_OK;
#else
    (void)w;
    (void)off;
    (void)p;
    (void)n;
    return zero__fail(ZERO_ERROR_UNSUPPORTED, "zero_engine_save: O_DIRECT writer");
#endif
}

/* The next chunk of stream s (0..3: master, m, v, params), at file offset off, of the
   section [lo, hi): *dst receives where to put its bytes (then zero__ck_w_put). */
static zero_result zero__ck_w_begin(zero__ck_writer *w, int s, uint64_t off, uint64_t lo,
                                    uint64_t hi, unsigned char **dst)
{
    size_t lead = (size_t)(off % ZERO_IO_ALIGN);
    zero__ck_wjob *j;
    w->cur = s;
    w->cur_off = off;
    w->sec_lo = lo;
    w->sec_hi = hi;
    if (!w->direct) {
        *dst = w->chunk;
        return ZERO_OK;
    }
    if (w->next - w->reclaimed == ZERO__CK_WBUFS) {
        zero_result r = zero__ck_w_reclaim(w);
        if (r != ZERO_OK) return r;
    }
    j = &w->jobs[w->next % ZERO__CK_WBUFS];
    /* the block's bytes before off, if the stream wrote them: its partial block */
    if (lead && w->carry_end[s] == off) memcpy(j->buf, w->carry + (size_t)s * ZERO_IO_ALIGN, lead);
    *dst = j->buf + lead;
    return ZERO_OK;
}

/* The chunk begun last holds n bytes now: its CRC32C joins *acc (in file order) and its
   bytes go to the file. */
static zero_result zero__ck_w_put(zero__ck_writer *w, size_t n, uint32_t *acc)
{
    uint64_t lo = w->cur_off, hi = lo + n, base = lo - lo % ZERO_IO_ALIGN;
    uint64_t a0 = zero_io_align_up(w->sec_lo), a1 = w->sec_hi - w->sec_hi % ZERO_IO_ALIGN;
    uint64_t ia = lo > a0 ? lo : a0, ib = hi < a1 ? hi : a1, wa, wb;
    zero__ck_wjob *j;
    unsigned char *buf;
    zero_result r = ZERO_OK;
    int s = w->cur;
    if (!w->direct) {
        *acc = zero_crc32c(*acc, w->chunk, n);
        return zero__ck_w_write(w, w->chunk, n, lo);
    }
    j = &w->jobs[w->next % ZERO__CK_WBUFS];
    buf = j->buf; /* maps the file from base */
    if (ia >= ib) { /* no byte of the chunk lies in a block of its section alone */
        r = zero__ck_w_edge(w, lo, buf + (lo - base), n);
        wa = wb = ia = ib = hi;
    } else {
        if (lo < ia) r = zero__ck_w_edge(w, lo, buf + (lo - base), (size_t)(ia - lo));
        if (r == ZERO_OK && ib < hi) r = zero__ck_w_edge(w, ib, buf + (ib - base), (size_t)(hi - ib));
        wa = ia - ia % ZERO_IO_ALIGN; /* ia unaligned: the carried bytes lead the block */
        wb = ib - ib % ZERO_IO_ALIGN;
        if (ib == hi && hi % ZERO_IO_ALIGN) /* the partial block waits for the next chunk */
            memcpy(w->carry + (size_t)s * ZERO_IO_ALIGN, buf + (wb - base), (size_t)(hi - wb));
    }
    if (r != ZERO_OK) return r;
    w->carry_end[s] = hi;
    if (zero__ck_io_fault && wb > wa) {
        int er = zero__ck_io_fault(w->path, 'w');
        if (er)
            return zero__fail(ZERO_ERROR_IO, "%s: write at byte %llu: %s", w->path,
                              (unsigned long long)wa, strerror(er));
    }
    j->data = buf + (lo - base);
    j->data_n = n;
    j->wp = buf + (wa - base);
    j->wn = (size_t)(wb - wa);
    j->woff = wa;
    j->acc = acc;
    j->done = 0;
#if defined(__linux__)
    if (w->nth > 0) {
        pthread_mutex_lock(&w->mu);
        w->next++;
        pthread_cond_signal(&w->work);
        pthread_mutex_unlock(&w->mu);
        return ZERO_OK;
    }
#endif
    zero__ck_w_job(w, j);
    j->done = 1;
    w->next++;
    return ZERO_OK;
}

/* After every chunk: the header (hb bytes at offset 0) completes the file. */
static zero_result zero__ck_w_finish(zero__ck_writer *w, const unsigned char *hdr, size_t hb)
{
    zero_result r;
    if (!w->direct) return zero__ck_w_write(w, hdr, hb, 0);
    if ((r = zero__ck_w_drain(w)) != ZERO_OK) return r;
    if ((r = zero__ck_w_edge(w, 0, hdr, hb)) != ZERO_OK) return r;
    if (w->nedges) /* every byte of the file was put: no block can be left */
        return zero__fail(ZERO_ERROR_IO, "%s: %zu blocks not complete (block %llu)", w->path,
                          w->nedges, (unsigned long long)w->edges[0].block);
    if (ftruncate(w->fd, (off_t)w->size) != 0) /* the last block was written whole */
        return zero__fail(ZERO_ERROR_IO, "%s: truncate to %llu bytes: %s", w->path,
                          (unsigned long long)w->size, strerror(errno));
    return ZERO_OK;
}

/* Writes this rank's shard file of generation gen (temporary name, fsync, rename, fsync),
   through zero__ck_writer (O_DIRECT where the file system takes it). */
static zero_result zero__ck_write_shard(zero_engine *e, const char *dir, uint64_t gen)
{
    char name[64], path[4200], tmp[4240];
    uint64_t hb =
        ZERO__CK_SHARD_FIXED + (uint64_t)ZERO__CK_SEC_BYTES * 4u * (uint64_t)e->layout.ngroups + 4u;
    uint64_t off = hb, fbytes = hb;
    zero__ck_buf hdr;
    zero__ck_writer w;
    uint32_t *crcs = NULL;
    zero_result r = ZERO_OK;
    int fd, g, ki;
    memset(&hdr, 0, sizeof hdr);
    memset(&w, 0, sizeof w);
    w.fd = -1;
    zero__ck_shard_name(name, sizeof name, gen, e->cfg.rank);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (g = 0; g < e->layout.ngroups; g++)
        fbytes += (uint64_t)e->layout.groups[g].shard_numel * 12u +
                  (uint64_t)e->layout.groups[g].pshard_numel * e->cfg.param_size;
    crcs = (uint32_t *)zero__alloc(&e->cfg.desc.allocator, (size_t)e->layout.ngroups * 16u + 16u);
    if (!crcs) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_save: staging buffer");
    memset(crcs, 0, (size_t)e->layout.ngroups * 16u);
    if ((r = zero__ck_create_tmp(path, tmp, sizeof tmp, &fd)) != ZERO_OK) goto out;
    r = zero__ck_w_open(&w, &e->cfg.desc.allocator, fd, tmp, fbytes, hb);
    /* Order the downloads after any collective still writing the buffers; the NVMe caches
       written back and emptied, so the save reads each record once, from the file. */
    if (r == ZERO_OK) r = zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE);
    if (r == ZERO_OK) r = zero__eng_nvme_forget(e);
    /* Per group, chunk by chunk, the four sections of each chunk together: an NVMe tile record
       (master, m and v of one tile) is then read once for all three (chunks never cross a
       tile), and an NVMe param shard once per group. */
    for (g = 0; g < e->layout.ngroups && r == ZERO_OK; g++) {
        size_t n = e->layout.groups[g].shard_numel, per = ZERO__CK_WBUF / 4, pos = 0;
        size_t pn = e->layout.groups[g].pshard_numel; /* params: + the frozen slice */
        zero__eng_save_ahead(e, g); /* NVMe param shards: the next groups' start reading */
        while (pos < pn && r == ZERO_OK) {
            size_t c = pn - pos < per ? pn - pos : per;
            if (e->nvme.opt_file && c > e->host.tile_numel - pos % e->host.tile_numel)
                c = e->host.tile_numel - pos % e->host.tile_numel;
            if (pos < n && c > n - pos) c = n - pos; /* chunks end where the trained slice does */
            for (ki = 0; ki < 4 && r == ZERO_OK; ki++) {
                size_t esz = ki == 3 ? e->cfg.param_size : 4;
                uint64_t sec = off + (uint64_t)n * (ki == 3 ? 12u : 4u * (unsigned)ki);
                uint64_t send = sec + (ki == 3 ? (uint64_t)pn * esz : (uint64_t)n * 4u);
                unsigned char *dst = NULL;
                if (ki < 3 && pos >= n) continue;
                r = zero__ck_w_begin(&w, ki, sec + pos * esz, sec, send, &dst);
                if (r != ZERO_OK) break;
                r = zero__ck_state_io(e, zero__ck_kinds[ki], g, pos, c, dst, 0);
                if (r == ZERO_OK) r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE);
                if (r != ZERO_OK) {
                    char prev[400];
                    zero__eng_copy_error(prev, sizeof prev);
                    r = zero__fail(r, "zero_engine_save: reading %s of group %d: %.380s",
                                   zero__ck_kind_name(ki), g, prev);
                    break;
                }
                r = zero__ck_w_put(&w, c * esz, &crcs[g * 4 + ki]);
            }
            pos += c;
        }
        off += (uint64_t)n * 12u + (uint64_t)pn * e->cfg.param_size;
    }
    if (r == ZERO_OK) r = zero__ck_w_drain(&w); /* every chunk's CRC joined */
    if (r == ZERO_OK) {
        zero__ck_put(&hdr, "ZEROSHRD", 8);
        zero__ck_u32(&hdr, ZERO__CK_SHARD_VERSION);
        zero__ck_u32(&hdr, (uint32_t)hb);
        zero__ck_u64(&hdr, gen);
        zero__ck_u32(&hdr, (uint32_t)e->cfg.rank);
        zero__ck_u32(&hdr, (uint32_t)e->cfg.world);
        zero__ck_u32(&hdr, 4u * (uint32_t)e->layout.ngroups);
        zero__ck_u32(&hdr, (uint32_t)e->cfg.param_dtype);
        zero__ck_u64(&hdr, off);
        zero__ck_u64(&hdr, 0);
        zero__ck_u64(&hdr, 0);
        {
            uint64_t so = hb;
            for (g = 0; g < e->layout.ngroups; g++)
                for (ki = 0; ki < 4; ki++) {
                    uint64_t bytes = ki == 3 ? (uint64_t)e->layout.groups[g].pshard_numel *
                                                   e->cfg.param_size
                                             : (uint64_t)e->layout.groups[g].shard_numel * 4u;
                    zero__ck_sec_entry(&hdr, (uint32_t)zero__ck_kinds[ki], (uint32_t)g, so, bytes,
                                       crcs[g * 4 + ki]);
                    so += bytes;
                }
        }
        zero__ck_u32(&hdr, zero_crc32c(0, hdr.p, hdr.n));
        if (hdr.err || hdr.n != hb) r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_save: header");
        else r = zero__ck_w_finish(&w, hdr.p, hdr.n);
    }
    zero__ck_w_close(&w); /* the threads stopped before the descriptor closes */
    r = zero__ck_commit_tmp(fd, tmp, path, dir, r);
out:
    ZERO_FREE(hdr.p);
    zero__free(&e->cfg.desc.allocator, crcs);
    return r;
}

/* Rank 0, after every shard file is in place: the manifest (the commit point). */
static zero_result zero__ck_write_manifest(zero_engine *e, const char *dir, uint64_t gen,
                                           uint64_t client_bytes, uint32_t client_crc)
{
    zero__ck_buf b;
    zero_result r = ZERO_OK;
    uint64_t hb =
        ZERO__CK_SHARD_FIXED + (uint64_t)ZERO__CK_SEC_BYTES * 4u * (uint64_t)e->layout.ngroups + 4u;
    uint64_t fbytes = hb;
    unsigned char *h;
    int g, t, q;
    memset(&b, 0, sizeof b);
    for (g = 0; g < e->layout.ngroups; g++)
        fbytes += (uint64_t)e->layout.groups[g].shard_numel * 12u +
                  (uint64_t)e->layout.groups[g].pshard_numel * e->cfg.param_size;
    h = (unsigned char *)ZERO_MALLOC((size_t)hb);
    if (!h) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_save: manifest");
    zero__ck_put(&b, "ZEROMANI", 8);
    zero__ck_u32(&b, ZERO__CK_VERSION);
    zero__ck_u32(&b, 0);
    zero__ck_u64(&b, 0); /* total size, patched below */
    zero__ck_u64(&b, gen);
    zero__ck_u32(&b, (uint32_t)e->cfg.world);
    zero__ck_u32(&b, (uint32_t)e->cfg.stage);
    zero__ck_u32(&b, (uint32_t)e->cfg.param_dtype);
    zero__ck_u32(&b, (uint32_t)zero_plan_align(e->layout.plan));
    zero__ck_u32(&b, (uint32_t)e->layout.ngroups);
    zero__ck_u32(&b, (uint32_t)e->layout.ntensors);
    zero__ck_u64(&b, (uint64_t)e->opt.step);
    zero__ck_u32(&b, (uint32_t)e->opt.adam.mode);
    zero__ck_u32(&b, 0);
    zero__ck_f64(&b, (double)e->opt.adam.lr);
    zero__ck_f64(&b, (double)e->opt.adam.beta1);
    zero__ck_f64(&b, (double)e->opt.adam.beta2);
    zero__ck_f64(&b, (double)e->opt.adam.eps);
    zero__ck_f64(&b, (double)e->opt.adam.weight_decay);
    zero__ck_f32(&b, e->opt.scaler.scale);
    zero__ck_f32(&b, e->opt.scaler.factor);
    zero__ck_f32(&b, e->opt.scaler.min_scale);
    zero__ck_u32(&b, (uint32_t)(int32_t)e->opt.scaler.window);
    zero__ck_u32(&b, (uint32_t)(int32_t)e->opt.scaler.hysteresis);
    zero__ck_u32(&b, (uint32_t)(int32_t)e->opt.scaler.cur_hysteresis);
    zero__ck_u32(&b, (uint32_t)(int32_t)e->opt.scaler.consecutive_hysteresis);
    zero__ck_u32(&b, (uint32_t)(int32_t)e->opt.scaler.dynamic);
    zero__ck_u64(&b, (uint64_t)e->opt.scaler.iter);
    zero__ck_u64(&b, (uint64_t)e->opt.scaler.last_overflow_iter);
    zero__ck_u32(&b, (uint32_t)e->opt.scaler.error_at_min); /* informative: load keeps its own */
    zero__ck_u32(&b, e->dpu.publish ? 1u : 0u); /* flags: bit 0 = a delayed update pending */
    zero__ck_u64(&b, 0);
    zero__ck_u64(&b, zero_plan_hash(e->layout.plan));
    for (g = 0; g < e->layout.ngroups; g++) {
        zero__ck_u64(&b, e->layout.groups[g].numel);
        zero__ck_u64(&b, e->layout.groups[g].shard_numel);
        zero__ck_u64(&b, e->layout.groups[g].used_numel);
    }
    for (t = 0; t < e->layout.ntensors; t++) {
        zero_tensor_info ti;
        int nd = t < e->layout.cap_shapes ? e->layout.shapes[t].ndim : 0, k;
        memset(&ti, 0, sizeof ti);
        zero_plan_tensor(e->layout.plan, t, &ti);
        zero__ck_u32(&b, (uint32_t)strlen(ti.name));
        zero__ck_put(&b, ti.name, strlen(ti.name));
        zero__ck_u32(&b, (uint32_t)ti.group);
        zero__ck_u32(&b, e->layout.tensor_flags[t]);
        zero__ck_u64(&b, ti.offset);
        zero__ck_u64(&b, ti.numel);
        zero__ck_u32(&b, (uint32_t)nd);
        for (k = 0; k < nd; k++) zero__ck_u64(&b, e->layout.shapes[t].dims[k]);
    }
    for (q = 0; q < e->cfg.world && r == ZERO_OK; q++) {
        char name[64], path[4200];
        int fd;
        zero__ck_shard_name(name, sizeof name, gen, q);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if ((r = zero__ck_open_read(path, "shard file just written", 1, &fd, NULL)) != ZERO_OK)
            break;
        r = zero__ck_pread(fd, h, (size_t)hb, 0, path);
        close(fd);
        if (r != ZERO_OK) break;
        zero__ck_u64(&b, fbytes);
        zero__ck_u32(&b, zero__ck_le32(h + hb - 4));
        zero__ck_u32(&b, 0);
    }
    zero__ck_u64(&b, client_bytes);
    zero__ck_u32(&b, client_crc);
    zero__ck_u32(&b, 0);
    for (t = 0; t < e->layout.ntensors; t++) { /* version 3: the per-tensor hyper-parameters */
        zero__ck_f64(&b, e->opt.lr_mul[t]);
        zero__ck_f64(&b, e->opt.wd[t]);
    }
    if (r == ZERO_OK && !b.err) {
        int i;
        for (i = 0; i < 8; i++) b.p[16 + i] = (unsigned char)((uint64_t)(b.n + 4) >> (8 * i));
        zero__ck_u32(&b, zero_crc32c(0, b.p, b.n));
    }
    if (r == ZERO_OK && b.err) r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_save: manifest");
    if (r == ZERO_OK) r = zero__ck_write_file(dir, ZERO__CK_MANIFEST, b.p, b.n);
    ZERO_FREE(b.p);
    ZERO_FREE(h);
    return r;
}

ZERODEF zero_result zero_engine_save(zero_engine *e, const char *dir)
{
    return zero_engine_save_client(e, dir, NULL, 0);
}

ZERODEF zero_result zero_engine_save_client(zero_engine *e, const char *dir, const void *client,
                                            size_t client_bytes)
{
    zero_result r = zero__eng_usable(e, "zero_engine_save");
    zero_traffic keep;
    uint64_t gen = 0;
    uint32_t client_crc = 0;
    int lock = -1;
    if (r != ZERO_OK) return r;
    if (!dir || !dir[0] || strlen(dir) >= 4000)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_save: dir is NULL, empty or too long");
    if ((r = zero__ck_between_steps(e, "zero_engine_save", 0)) != ZERO_OK) return r;
    keep = e->traffic.cur;
    /* 1. the directory, the save lock and the generation (rank 0 takes and proposes them) */
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        r = zero__fail(ZERO_ERROR_IO, "mkdir %s: %s", dir, strerror(errno)); /* prefixed below */
    if (r == ZERO_OK && e->topo.rank_all == 0 && client_bytes > 0 && !client)
        r = zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "rank 0's client is NULL with client_bytes %zu "
                       "(zero_engine_save_client)", client_bytes);
    if (r == ZERO_OK && e->topo.rank_all == 0) r = zero__ck_lock(dir, &lock);
    if (r == ZERO_OK && e->topo.rank_all == 0) r = zero__ck_next_gen(dir, &gen);
    if (r != ZERO_OK) {
        char prev[400];
        zero__eng_copy_error(prev, sizeof prev);
        r = zero__fail(r, "zero_engine_save: %.400s", prev);
    }
    r = zero__ck_agree(e, r, &gen);
    /* 2. every rank's shard file; rank 0's client state. A failure anywhere removes this
       generation's files on every rank (each its own), so no orphan outlives the save. */
    if (r == ZERO_OK) {
        zero_result sr = ZERO_OK;
        if (e->topo.rank_all == 0 && client_bytes > 0) {
            char name[64];
            zero__ck_client_name(name, sizeof name, gen);
            client_crc = zero_crc32c(0, client, client_bytes);
            sr = zero__ck_write_file(dir, name, client, client_bytes);
        }
        /* MiCS: the first replica's ranks write the shards (a checkpoint of S ranks) */
        if (sr == ZERO_OK && e->topo.rank_all < e->cfg.world) sr = zero__ck_write_shard(e, dir, gen);
        r = zero__ck_agree(e, sr, NULL);
        if (r != ZERO_OK) zero__ck_cleanup(dir, gen, 0, e->topo.rank_all < e->cfg.world ? e->cfg.rank : -1);
        else {
            /* 3. the manifest (the commit point), then the older generations go */
            zero_result mr = ZERO_OK;
            if (e->topo.rank_all == 0) {
                mr = zero__ck_write_manifest(e, dir, gen, client_bytes, client_crc);
                if (mr == ZERO_OK) zero__ck_cleanup(dir, gen, 1, 0);
            }
            r = zero__ck_agree(e, mr, NULL);
            /* not committed (the manifest names another generation): this one goes */
            if (r != ZERO_OK && zero__ck_manifest_gen(dir) != gen)
                zero__ck_cleanup(dir, gen, 0, e->topo.rank_all < e->cfg.world ? e->cfg.rank : -1);
        }
    }
    if (e->topo.rank_all == 0) zero__ck_unlock(dir, lock);
    e->traffic.cur = keep;
    return r;
}

/* ---- load ------------------------------------------------------------------------------------ */

typedef struct zero__ck_load {
    zero_engine *e;
    int same;                 /* the saving layout is the engine's: shard files map 1:1 */
    int *tmap;                /* checkpoint tensor -> engine tensor */
    unsigned char *stage_buf; /* this rank's shard: master, m, v (fp32), params */
    unsigned char *map;       /* same layout: this rank's shard file, read and verified */
    size_t map_bytes;
} zero__ck_load;

/* Same layout: this rank's own shard file is read whole into host memory, with O_DIRECT
   where the file system takes it (else buffered), in ZERO__CK_RCHUNK pieces by
   ZERO__CK_RTHREADS reader threads, ahead of the caller's thread, which checks every
   section's CRC32C as its pieces arrive; the apply step then uploads from it. */
#define ZERO__CK_RCHUNK ((size_t)8 << 20)
#define ZERO__CK_RTHREADS 2

typedef struct zero__ck_fread {
    int fd;
    const char *path;
    unsigned char *buf;   /* the file: aligned, its size rounded up to ZERO_IO_ALIGN */
    uint64_t size;
    size_t nchunks, taken;
    unsigned char *done;  /* per piece: arrived (or failed) */
    int err, stop, nth, sync_made; /* err: errno of the first failure (-1: truncated) */
    uint64_t err_at;
#if defined(__linux__)
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th[ZERO__CK_RTHREADS];
#endif
} zero__ck_fread;

/* Reads piece k of the file into its place (a reader thread, or the caller's). */
static void zero__ck_fread_piece(zero__ck_fread *f, size_t k, int *err, uint64_t *at)
{
    uint64_t cur = (uint64_t)k * ZERO__CK_RCHUNK, end = cur + ZERO__CK_RCHUNK;
    if (end > f->size) end = f->size;
    *err = 0;
    __atomic_fetch_add(&zero__ck_bytes_read, end - cur, __ATOMIC_RELAXED);
    while (cur < end) { /* whole blocks (O_DIRECT): the file's last one comes back short */
        uint64_t want = zero_io_align_up(end) - cur;
        ssize_t got = pread(f->fd, f->buf + cur, (size_t)want, (off_t)cur);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            *err = got < 0 ? errno : -1;
            *at = cur;
            return;
        }
        cur += (uint64_t)got;
    }
}

#if defined(__linux__)
static void *zero__ck_fread_thread(void *arg)
{
    zero__ck_fread *f = (zero__ck_fread *)arg;
    pthread_mutex_lock(&f->mu);
    while (!f->stop && f->taken < f->nchunks) {
        size_t k = f->taken++;
        int err;
        uint64_t at = 0;
        pthread_mutex_unlock(&f->mu);
        zero__ck_fread_piece(f, k, &err, &at);
        pthread_mutex_lock(&f->mu);
        if (err && !f->err) {
            f->err = err;
            f->err_at = at;
        }
        f->done[k] = 1;
        pthread_cond_broadcast(&f->cv);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}
#endif

/* Waits until bytes [0, upto) of the file have arrived; the error of any piece read. */
static zero_result zero__ck_fread_wait(zero__ck_fread *f, uint64_t upto)
{
    size_t last = upto == 0 ? 0 : (size_t)((upto - 1) / ZERO__CK_RCHUNK), k;
    int err = 0;
    uint64_t at = 0;
    if (upto == 0) return ZERO_OK;
#if defined(__linux__)
    if (f->nth > 0) {
        pthread_mutex_lock(&f->mu);
        for (k = 0; k <= last; k++)
            while (!f->done[k] && !f->err) pthread_cond_wait(&f->cv, &f->mu);
        err = f->err;
        at = f->err_at;
        pthread_mutex_unlock(&f->mu);
    } else
#endif
    {
        for (k = 0; k <= last && !err; k++)
            if (!f->done[k]) {
                zero__ck_fread_piece(f, k, &err, &at);
                f->done[k] = 1;
            }
    }
    if (err == -1)
        return zero__fail(ZERO_ERROR_IO, "%s: truncated: no bytes at offset %llu", f->path,
                          (unsigned long long)at);
    if (err)
        return zero__fail(ZERO_ERROR_IO, "%s: read at byte %llu: %s", f->path,
                          (unsigned long long)at, strerror(err));
    return ZERO_OK;
}

static void zero__ck_fread_stop(zero__ck_fread *f, const zero_allocator *a)
{
    int i;
#if defined(__linux__)
    if (f->sync_made) {
        pthread_mutex_lock(&f->mu);
        f->stop = 1;
        pthread_mutex_unlock(&f->mu);
        for (i = 0; i < f->nth; i++) pthread_join(f->th[i], NULL);
        pthread_cond_destroy(&f->cv);
        pthread_mutex_destroy(&f->mu);
        f->sync_made = 0;
    }
#endif
    (void)i;
    zero__free(a, f->done);
    f->done = NULL;
    f->nth = 0;
}

static zero_result zero__ck_map_own(const zero_checkpoint *ck, zero__ck_load *L)
{
    char name[64], path[4200];
    uint32_t *crcs = NULL;
    const zero_allocator *a = &L->e->cfg.desc.allocator;
    zero__ck_fread f;
    zero_result r;
    int g, ki;
    size_t i;
    memset(&f, 0, sizeof f);
    zero__ck_shard_name(name, sizeof name, ck->info.generation, L->e->cfg.rank);
    snprintf(path, sizeof path, "%s/%s", ck->dir, name);
    {
        char what[64];
        snprintf(what, sizeof what, "shard file of rank %d", L->e->cfg.rank);
        if ((r = zero__ck_open_read(path, what, 1, &f.fd, NULL)) != ZERO_OK) return r;
    }
    r = zero__ck_check_shard(ck, f.fd, path, L->e->cfg.rank, &crcs);
    if (r != ZERO_OK) {
        close(f.fd);
        return r;
    }
    f.path = path;
    f.size = ck->shard_bytes;
    f.nchunks = (size_t)((f.size + ZERO__CK_RCHUNK - 1) / ZERO__CK_RCHUNK);
#if defined(__linux__)
    f.buf = (unsigned char *)zero__io_aligned_alloc(a, (size_t)zero_io_align_up(f.size));
#else
    f.buf = (unsigned char *)zero__alloc(a, (size_t)f.size);
#endif
    L->map = f.buf; /* freed by the load, whatever happens here */
    L->map_bytes = (size_t)f.size;
    f.done = (unsigned char *)zero__alloc(a, f.nchunks + 1);
    if (!f.buf || !f.done) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: %llu bytes to read the shard file into", path,
                       (unsigned long long)f.size);
        goto out;
    }
    memset(f.done, 0, f.nchunks + 1);
#if defined(__linux__) && defined(O_DIRECT)
    if (!zero__ck_direct_off && !(zero__ck_io_fault && zero__ck_io_fault(path, 'd'))) {
        int fl = fcntl(f.fd, F_GETFL);
        int direct = fl >= 0 && fcntl(f.fd, F_SETFL, fl | O_DIRECT) == 0;
        __atomic_store_n(&zero__ck_direct_used, direct, __ATOMIC_RELAXED);
    } else {
        __atomic_store_n(&zero__ck_direct_used, 0, __ATOMIC_RELAXED);
    }
    if (pthread_mutex_init(&f.mu, NULL) == 0) {
        if (pthread_cond_init(&f.cv, NULL) == 0) f.sync_made = 1;
        else pthread_mutex_destroy(&f.mu);
    }
    for (i = 0; f.sync_made && i < ZERO__CK_RTHREADS && i < f.nchunks; i++) {
        if (pthread_create(&f.th[i], NULL, zero__ck_fread_thread, &f) != 0) break;
        f.nth++;
    }
#endif
    (void)i;
    /* every section's checksum, in file order, as its pieces arrive */
    for (g = 0; g < ck->info.num_groups && r == ZERO_OK; g++)
        for (ki = 0; ki < 4 && r == ZERO_OK; ki++) {
            uint64_t off = zero__ck_sec_off(ck, g, ki), at = off;
            uint64_t bytes = zero__ck_sec_numel(ck, g, ki) * zero__ck_sec_esz(ck, ki);
            uint32_t c = 0;
            while (at < off + bytes && r == ZERO_OK) {
                uint64_t to = (at / ZERO__CK_RCHUNK + 1) * ZERO__CK_RCHUNK;
                if (to > off + bytes) to = off + bytes;
                r = zero__ck_fread_wait(&f, to);
                if (r == ZERO_OK) c = zero_crc32c(c, f.buf + at, (size_t)(to - at));
                at = to;
            }
            if (r == ZERO_OK && c != crcs[g * 4 + ki]) {
                int t = ck->groups[g].first_tensor;
                r = zero__fail(ZERO_ERROR_IO, "%s: checksum mismatch in the %s section of group "
                               "%d (bytes %llu..%llu; tensors from '%s'): stored %08x, computed "
                               "%08x", path, zero__ck_kind_name(ki), g, (unsigned long long)off,
                               (unsigned long long)(off + bytes - 1),
                               t >= 0 ? ck->tensors[t].name : "?", crcs[g * 4 + ki], c);
            }
        }
out:
    zero__ck_fread_stop(&f, a);
    close(f.fd);
    ZERO_FREE(crcs);
    return r;
}

static int zero__ck_want_load(void *ctx, const zero_checkpoint *ck, int q, int g, zero__ck_piece *pc)
{
    zero__ck_load *L = (zero__ck_load *)ctx;
    zero_engine *e = L->e;
    int t, np = 0;
    for (t = ck->groups[g].first_tensor; t >= 0 && t < ck->info.num_tensors; t++) {
        zero_tensor_info ti;
        zero_range sn, shn, sq;
        uint64_t a, b, lo, hi;
        if (ck->tensors[t].group != (uint32_t)g) continue;
        memset(&ti, 0, sizeof ti);
        memset(&sn, 0, sizeof sn);
        memset(&shn, 0, sizeof shn);
        memset(&sq, 0, sizeof sq);
        if (zero_plan_tensor(e->layout.plan, L->tmap[t], &ti) != ZERO_OK ||
            zero_plan_intersect(e->layout.plan, L->tmap[t], e->cfg.rank, &sn) != ZERO_OK ||
            zero_plan_shard(e->layout.plan, ti.group, e->cfg.rank, &shn) != ZERO_OK ||
            zero_plan_intersect(ck->plan, t, q, &sq) != ZERO_OK)
            continue;
        if (sn.numel == 0 || sq.numel == 0) continue;
        a = sn.offset - ti.offset;
        b = sq.offset - ck->tensors[t].offset;
        lo = a > b ? a : b;
        hi = a + sn.numel < b + sq.numel ? a + sn.numel : b + sq.numel;
        if (lo >= hi) continue;
        pc[np].src = zero__plan_shard_pos(ck->plan, t, q, sq.offset) + (lo - b);
        pc[np].n = hi - lo;
        /* in the staging layout: every group's part (trained and frozen slices) */
        pc[np].dst = e->layout.groups[ti.group].off_pstage +
                     zero__plan_shard_pos(e->layout.plan, L->tmap[t], e->cfg.rank, sn.offset) +
                     (lo - a);
        np++;
    }
    return np;
}

static unsigned char *zero__ck_base_load(void *ctx, int ki)
{
    zero__ck_load *L = (zero__ck_load *)ctx;
    return L->stage_buf + (size_t)ki * L->e->layout.pshard_total * 4u;
}

/* "[d0, d1, ...]" into dst. */
static void zero__ck_shape_str(char *dst, size_t n, int ndim, const uint64_t *dims)
{
    size_t at = 0;
    int k;
    at += (size_t)snprintf(dst, n, "[");
    for (k = 0; k < ndim && at < n; k++)
        at += (size_t)snprintf(dst + at, n - at, "%s%llu", k ? ", " : "", (unsigned long long)dims[k]);
    if (at < n) snprintf(dst + at, n - at, "]");
}

/* The engine's tensors must be the checkpoint's: names, sizes, flags, and shapes where
   both recorded one; the same dtype. */
static zero_result zero__ck_compat(zero_engine *e, const zero_checkpoint *ck, const char *dir,
                                   int *map)
{
    int t;
    if (ck->info.param_dtype != e->cfg.param_dtype)
        return zero__fail(ZERO_ERROR_MISMATCH,
                          "zero_engine_load: dtype mismatch: %s holds %s "
                          "params, the engine uses %s",
                          dir, zero_dtype_name(ck->info.param_dtype),
                          zero_dtype_name(e->cfg.param_dtype));
    for (t = 0; t < ck->info.num_tensors; t++) {
        const zero__ck_tensor *ct = &ck->tensors[t];
        zero_tensor_info ti;
        int id = -1;
        if (zero_plan_find(e->layout.plan, ct->name, &id) != ZERO_OK)
            return zero__fail(ZERO_ERROR_MISMATCH, "zero_engine_load: %s: tensor '%s' of the "
                              "checkpoint is not registered in the engine", dir, ct->name);
        memset(&ti, 0, sizeof ti);
        zero_plan_tensor(e->layout.plan, id, &ti);
        if ((uint64_t)ti.numel != ct->numel)
            return zero__fail(ZERO_ERROR_MISMATCH, "zero_engine_load: %s: tensor '%s' has %llu "
                              "elements in the checkpoint, %zu in the engine", dir, ct->name,
                              (unsigned long long)ct->numel, ti.numel);
        if (e->layout.tensor_flags[id] != ct->flags)
            return zero__fail(ZERO_ERROR_MISMATCH, "zero_engine_load: %s: tensor '%s' has flags "
                              "0x%x in the checkpoint, 0x%x in the engine", dir, ct->name,
                              ct->flags, e->layout.tensor_flags[id]);
        {
            int nd = id < e->layout.cap_shapes ? e->layout.shapes[id].ndim : 0, k,
                same = nd == ct->ndim;
            for (k = 0; same && k < nd; k++) same = e->layout.shapes[id].dims[k] == ct->dims[k];
            if (nd > 0 && ct->ndim > 0 && !same) {
                char a[200], b[200];
                zero__ck_shape_str(a, sizeof a, ct->ndim, ct->dims);
                zero__ck_shape_str(b, sizeof b, nd, e->layout.shapes[id].dims);
                return zero__fail(ZERO_ERROR_MISMATCH, "zero_engine_load: %s: tensor '%s' has "
                                  "shape %s in the checkpoint, %s in the engine", dir, ct->name,
                                  a, b);
            }
        }
        map[t] = id;
    }
    for (t = 0; t < e->layout.ntensors; t++) {
        zero_tensor_info ti;
        memset(&ti, 0, sizeof ti);
        zero_plan_tensor(e->layout.plan, t, &ti);
        int id = -1;
        if (zero_plan_find(ck->plan, ti.name, &id) != ZERO_OK)
            return zero__fail(ZERO_ERROR_MISMATCH, "zero_engine_load: %s: engine tensor '%s' is "
                              "not in the checkpoint", dir, ti.name);
    }
    return ZERO_OK;
}

/* Load's apply step for elements [at, at + n) of this rank's shard of group g: master, m,
   v and params, from the mapped shard file or the resharded staging buffer. */
static zero_result zero__ck_apply(zero_engine *e, const zero_checkpoint *ck, const zero__ck_load *L,
                                  int g, size_t at, size_t n)
{
    zero_result r = ZERO_OK;
    int ki;
    for (ki = 0; ki < 4 && r == ZERO_OK; ki++) {
        size_t esz = ki == 3 ? e->cfg.param_size : 4;
        unsigned char *src = L->map ? L->map + zero__ck_sec_off(ck, g, ki) + at * esz
                                    : L->stage_buf + (size_t)ki * e->layout.pshard_total * 4u +
                                          (e->layout.groups[g].off_pstage + at) * esz;
        if (ki < 3 && at >= e->layout.groups[g].shard_numel) continue; /* frozen: params only */
        r = zero__ck_state_io(e, zero__ck_kinds[ki], g, at, n, src, 1);
    }
    return r;
}

ZERODEF zero_result zero_engine_load(zero_engine *e, const char *dir)
{
    return zero_engine_load_client(e, dir, NULL, 0, NULL);
}

ZERODEF zero_result zero_engine_load_client(zero_engine *e, const char *dir, void *client,
                                            size_t capacity, size_t *client_bytes)
{
    zero_result r = zero__eng_usable(e, "zero_engine_load");
    zero_checkpoint *ck = NULL;
    zero__ck_load L;
    zero__ck_reader rdr;
    zero_traffic keep;
    size_t bytes = 0;
    unsigned char *cl = NULL; /* the client state, staged until every rank agrees */
    int t, want_client = client != NULL || client_bytes != NULL;
    if (r != ZERO_OK) return r;
    if (!dir || !dir[0] || strlen(dir) >= 4000)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_load: dir is NULL, empty or too long");
    if ((r = zero__ck_between_steps(e, "zero_engine_load", 1)) != ZERO_OK) return r;
    keep = e->traffic.cur;
    memset(&L, 0, sizeof L);
    L.e = e;
    /* 1. every rank opens the manifest, and all hold the same one (generation and
       checksum: a save that commits meanwhile, or ranks given different directories, would
       otherwise load different steps), or none goes on */
    if (zero__ck_stage) zero__ck_stage(e->cfg.rank, 0, dir);
    r = zero_checkpoint_open(dir, &ck);
    if (zero__ck_stage) zero__ck_stage(e->cfg.rank, 1, dir);
    if (r != ZERO_OK) {
        char prev[400];
        zero__eng_copy_error(prev, sizeof prev);
        r = zero__fail(r, "zero_engine_load: %.400s", prev);
    }
    r = zero__ck_agree(e, r, NULL);
    if (r == ZERO_OK) {
        uint64_t id[2];
        int same = 0;
        id[0] = ck->info.generation;
        id[1] = ck->manifest_crc;
        if ((r = zero__ck_same_u64(e, id, 2, &same)) != ZERO_OK) goto out;
        if (!same)
            r = zero__ck_agree(e, zero__fail(ZERO_ERROR_MISMATCH, "zero_engine_load: the ranks "
                               "opened different checkpoints (rank %d: %s, generation %llu, "
                               "manifest checksum %08x): a save into the directory committed "
                               "meanwhile, or the ranks were given different directories; "
                               "nothing was loaded", e->cfg.rank, dir,
                               (unsigned long long)id[0], (unsigned)id[1]), NULL);
    }
    if (r != ZERO_OK) goto out;
    /* 2. read and verify everything this rank needs, changing nothing */
    if (r == ZERO_OK) {
        L.tmap =
            (int *)zero__alloc(&e->cfg.desc.allocator, (size_t)ck->info.num_tensors * sizeof(int));
        if (!L.tmap) r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_load");
    }
    if (r == ZERO_OK) r = zero__ck_compat(e, ck, dir, L.tmap);
    if (r == ZERO_OK && want_client && ck->info.client_bytes > 0) {
        if ((ck->info.client_bytes > (uint64_t)capacity || !client) && client_bytes)
            *client_bytes = (size_t)ck->info.client_bytes; /* the size needed */
        if (ck->info.client_bytes > (uint64_t)capacity || !client)
            r = zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_load_client: %s holds %llu "
                           "bytes of client state, the capacity is %zu", dir,
                           (unsigned long long)ck->info.client_bytes, client ? capacity : 0);
        if (r == ZERO_OK && !(cl = (unsigned char *)zero__alloc(&e->cfg.desc.allocator,
                                                                (size_t)ck->info.client_bytes)))
            r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_load: client state of %llu bytes",
                           (unsigned long long)ck->info.client_bytes);
        if (r == ZERO_OK && (r = zero__ck_read_client(ck, cl)) != ZERO_OK) {
            char prev[400];
            zero__eng_copy_error(prev, sizeof prev);
            r = zero__fail(r, "zero_engine_load: %.400s", prev);
        }
    }
    if (r == ZERO_OK) { /* same world, alignment, groups and tensor order: no resharding */
        L.same = ck->info.world == e->cfg.world && ck->info.num_groups == e->layout.ngroups &&
                 ck->info.align_numel == zero_plan_align(e->layout.plan);
        for (t = 0; L.same && t < ck->info.num_tensors; t++) {
            zero_tensor_info ti;
            memset(&ti, 0, sizeof ti);
            zero_plan_tensor(e->layout.plan, t, &ti);
            L.same = L.tmap[t] == t && (uint64_t)ti.offset == ck->tensors[t].offset &&
                     ti.group == (int)ck->tensors[t].group;
        }
        for (t = 0; L.same && t < e->layout.ngroups; t++)
            L.same = ck->groups[t].shard_numel == e->layout.groups[t].shard_numel &&
                     ck->groups[t].pshard_numel == e->layout.groups[t].pshard_numel;
    }
    if (r == ZERO_OK && !L.same) { /* resharding: staging filled from every file needed */
        if (zero__mul_size(e->layout.pshard_total, 12u + e->cfg.param_size, &bytes) || bytes == 0)
            bytes = 0;
        L.stage_buf = bytes ? (unsigned char *)zero__alloc(&e->cfg.desc.allocator, bytes) : NULL;
        if (!L.stage_buf) /* not cleared: only tensor elements are read back */
            r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_load: %zu bytes of staging", bytes);
    }
    if (r == ZERO_OK && L.same) {
        r = zero__ck_map_own(ck, &L);
        if (r != ZERO_OK) {
            char prev[400];
            zero__eng_copy_error(prev, sizeof prev);
            r = zero__fail(r, "zero_engine_load: %.400s", prev);
        }
    } else if (r == ZERO_OK) {
        rdr.want = zero__ck_want_load;
        rdr.base = zero__ck_base_load;
        rdr.ctx = &L;
        r = zero__ck_read(ck, &rdr);
        if (r != ZERO_OK) {
            char prev[400];
            zero__eng_copy_error(prev, sizeof prev);
            r = zero__fail(r, "zero_engine_load: %.400s", prev);
        }
    }
    /* 3. every rank agrees before anything changes */
    r = zero__ck_agree(e, r, NULL);
    if (r != ZERO_OK || e->lifecycle == ZERO__ENG_BROKEN) goto out;
    /* 4. apply: shards, the copies kept whole, then step, Adam settings, scaler */
    if ((r = zero__eng_handoff(e, ZERO_QUEUE_COMM, ZERO_QUEUE_COMPUTE)) != ZERO_OK) {
        r = zero__eng_break(e, r, "zero_engine_load: event");
        goto out;
    }
    zero__eng_drop_prefetched(e);
    zero__eng_hpz_stale(e, -1);
    if (e->nvme.io) r = zero__eng_nvme_forget(e);
    /* Offloaded: tile by tile in shard order, each tile's pieces (its tensors' parts) with
       the four kinds together, so an NVMe tile record and param shard are read and written
       once. The padding between tensors is never written (the engine's stays 0). */
    for (t = 0; e->cfg.opt_offloaded && t < e->host.ntiles + e->host.ndtiles && r == ZERO_OK; t++) {
        const zero__eng_tile *tl = &e->host.tiles[t];
        int pi;
        for (pi = tl->first; pi < tl->first + tl->count && r == ZERO_OK; pi++)
            r = zero__ck_apply(e, ck, &L, tl->group, tl->begin + e->host.pieces[pi].off,
                               e->host.pieces[pi].numel);
    }
    if (r == ZERO_OK && e->nvme.io) r = zero__eng_nvme_flush(e);
    /* else tensor by tensor */
    for (t = 0; !e->cfg.opt_offloaded && t < e->layout.ntensors && r == ZERO_OK; t++) {
        zero_tensor_info ti;
        zero_range sn, shn;
        size_t at;
        memset(&ti, 0, sizeof ti);
        memset(&sn, 0, sizeof sn);
        memset(&shn, 0, sizeof shn);
        r = zero_plan_tensor(e->layout.plan, t, &ti);
        if (r == ZERO_OK) r = zero_plan_intersect(e->layout.plan, t, e->cfg.rank, &sn);
        if (r == ZERO_OK) r = zero_plan_shard(e->layout.plan, ti.group, e->cfg.rank, &shn);
        if (r != ZERO_OK || sn.numel == 0) continue;
        at = zero__plan_shard_pos(e->layout.plan, t, e->cfg.rank, sn.offset);
        r = zero__ck_apply(e, ck, &L, ti.group, at, sn.numel);
    }
    if (r == ZERO_OK) r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE);
    /* 5. the ranks agree on the apply before any collective of the load's end: a rank whose
       apply failed (the NVMe tier's EIO, a device error) holds a half-written state and
       cannot undo it, so every rank returns that rank's error with its engine broken; none
       waits in the all-gathers below for a rank that left, none returns OK with a state the
       failed rank does not share */
    if (r != ZERO_OK) {
        char prev[400];
        zero__eng_copy_error(prev, sizeof prev);
        r = zero__fail(r, "applying the checkpoint on rank %d: %.380s", e->cfg.rank, prev);
    }
    r = zero__ck_agree(e, r, NULL);
    if (r != ZERO_OK) {
        r = zero__eng_break(e, r, "zero_engine_load");
        goto out;
    }
    if ((r = zero__ck_state_spread(e)) != ZERO_OK) goto out;
    if ((r = e->cfg.dev->ops->sync(e->cfg.dev, ZERO_QUEUE_COMPUTE)) != ZERO_OK) {
        r = zero__eng_break(e, r, "zero_engine_load: sync");
        goto out;
    }
    e->opt.step = ck->info.step;
    e->opt.adam.mode = ck->info.adam.mode;
    e->opt.adam.lr = ck->info.adam.lr;
    e->opt.adam.beta1 = ck->info.adam.beta1;
    e->opt.adam.beta2 = ck->info.adam.beta2;
    e->opt.adam.eps = ck->info.adam.eps;
    e->opt.adam.weight_decay = ck->info.adam.weight_decay;
    e->cfg.desc.adam = e->opt.adam;
    for (t = 0; t < ck->info.num_tensors; t++) {
        e->opt.lr_mul[L.tmap[t]] = ck->tensors[t].lr_mul;
        e->opt.wd[L.tmap[t]] = ck->tensors[t].wd;
    }
    e->opt.scaler.scale = ck->info.scaler.scale;
    e->opt.scaler.factor = ck->info.scaler.factor;
    e->opt.scaler.min_scale = ck->info.scaler.min_scale;
    e->opt.scaler.window = ck->info.scaler.window;
    e->opt.scaler.hysteresis = ck->info.scaler.hysteresis;
    e->opt.scaler.cur_hysteresis = ck->info.scaler.cur_hysteresis;
    e->opt.scaler.consecutive_hysteresis = ck->info.scaler.consecutive_hysteresis;
    e->opt.scaler.dynamic = ck->info.scaler.dynamic;
    e->opt.scaler.iter = ck->info.scaler.iter;
    e->opt.scaler.last_overflow_iter = ck->info.scaler.last_overflow_iter;
    /* delayed_update: a checkpoint saved with an update pending holds it in master, m, v but
       not in the params; this engine publishes it at the end of its next step (the params
       pending = the master rounded, as the host Adam writes them). Without delayed_update
       the next step's Adam rewrites every param from the master anyway. */
    e->dpu.publish = 0;
    if (e->dpu.on && ck->info.update_pending && e->layout.shard_numel > 0) {
        r = zero_convert(e->dpu.params, e->cfg.param_dtype, e->opt.master, e->cfg.opt_dtype,
                         e->layout.shard_numel, ZERO_SIMD_AUTO);
        if (r != ZERO_OK) {
            r = zero__eng_break(e, r, "zero_engine_load: the pending params");
            goto out;
        }
        e->dpu.publish = 1;
    }
    if (want_client) {
        if (cl) memcpy(client, cl, (size_t)ck->info.client_bytes);
        if (client_bytes) *client_bytes = (size_t)ck->info.client_bytes;
    }
out:
    e->traffic.cur = keep;
    zero__free(&e->cfg.desc.allocator, cl);
    zero__free(&e->cfg.desc.allocator, L.tmap);
    zero__free(&e->cfg.desc.allocator, L.stage_buf);
#if defined(__linux__)
    zero__io_aligned_free(&e->cfg.desc.allocator, L.map);
#else
    zero__free(&e->cfg.desc.allocator, L.map);
#endif
    zero_checkpoint_close(ck);
    return r;
}

/* ---- safetensors ----------------------------------------------------------------------------- */

/* One tensor of a safetensors header; data_offsets relative to the data after the header. */
typedef struct zero__st_entry {
    char *name;
    char dtype[12];
    int ndim;
    uint64_t dims[ZERO_TENSOR_MAX_DIMS];
    uint64_t begin, end;
} zero__st_entry;

typedef struct zero__st_file {
    zero__st_entry *ent;
    int n, cap;
    int *by_name;       /* entry indices sorted by name (unique names: strictly increasing) */
    uint64_t compares;  /* name comparisons the sort made (n log2 n at most; tests read it) */
} zero__st_file;

static void zero__st_free(zero__st_file *f)
{
    int i;
    for (i = 0; i < f->n; i++) ZERO_FREE(f->ent[i].name);
    ZERO_FREE(f->ent);
    ZERO_FREE(f->by_name);
    f->ent = NULL;
    f->by_name = NULL;
    f->n = f->cap = 0;
}

/* Merge sort of entry indices a[0, n) by name (tmp: n ints): at most n ceil(log2 n) name
   comparisons whatever the names, counted in f->compares. */
static void zero__st_sort_names(zero__st_file *f, int *a, int *tmp, int n)
{
    int h = n / 2, i = 0, j, k = 0;
    if (n < 2) return;
    zero__st_sort_names(f, a, tmp, h);
    zero__st_sort_names(f, a + h, tmp, n - h);
    j = h;
    while (i < h && j < n) {
        f->compares++;
        tmp[k++] = strcmp(f->ent[a[i]].name, f->ent[a[j]].name) <= 0 ? a[i++] : a[j++];
    }
    while (i < h) tmp[k++] = a[i++];
    while (j < n) tmp[k++] = a[j++];
    memcpy(a, tmp, (size_t)n * sizeof *a);
}

/* The entry named name (binary search over by_name), or NULL. */
static zero__st_entry *zero__st_find(const zero__st_file *f, const char *name)
{
    int lo = 0, hi = f->n;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2, c = strcmp(f->ent[f->by_name[mid]].name, name);
        if (c == 0) return &f->ent[f->by_name[mid]];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

typedef struct zero__st_p {
    const unsigned char *s;
    size_t n, at;
    const char *what;
} zero__st_p;

static zero_result zero__st_err(zero__st_p *p, const char *why)
{
    return zero__fail(ZERO_ERROR_IO, "%s: malformed safetensors header at byte %zu: %s", p->what,
                      p->at, why);
}

static void zero__st_ws(zero__st_p *p)
{
    while (p->at < p->n && (p->s[p->at] == ' ' || p->s[p->at] == '\t' || p->s[p->at] == '\n' ||
                            p->s[p->at] == '\r'))
        p->at++;
}

static int zero__st_lit(zero__st_p *p, char c)
{
    zero__st_ws(p);
    if (p->at < p->n && p->s[p->at] == (unsigned char)c) {
        p->at++;
        return 1;
    }
    return 0;
}

static int zero__st_hex(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* 4 hex digits at p->at as a code unit; -1 if they are not there. */
static long zero__st_hex4(zero__st_p *p)
{
    long u = 0;
    int i;
    for (i = 0; i < 4; i++) {
        int h = p->at < p->n ? zero__st_hex(p->s[p->at]) : -1;
        if (h < 0) return -1;
        u = u * 16 + h;
        p->at++;
    }
    return u;
}

/* A JSON string into a new NUL-terminated buffer (*out; NULL: skip it) no larger than the
   string's bytes in the header (escapes only shrink). Raw bytes must be UTF-8 and \u
   escapes well-formed (surrogates in pairs): the result is UTF-8. */
static zero_result zero__st_string(zero__st_p *p, char **out)
{
    char *o = NULL;
    size_t k = 0, end;
    if (out) *out = NULL;
    if (!zero__st_lit(p, '"')) return zero__st_err(p, "expected a string");
    for (end = p->at; end < p->n && p->s[end] != '"'; end++) /* the closing quote */
        if (p->s[end] == '\\') end++;
    if (end >= p->n) {
        p->at = p->n;
        return zero__st_err(p, "unterminated string");
    }
    if (zero__utf8_bad(p->s + p->at, end - p->at) != end - p->at) {
        p->at += zero__utf8_bad(p->s + p->at, end - p->at);
        return zero__st_err(p, "a string is not UTF-8");
    }
    if (out) {
        o = (char *)ZERO_MALLOC(end - p->at + 1);
        if (!o) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: header string", p->what);
    }
    for (;;) {
        unsigned c = p->s[p->at++];
        const char *bad = NULL;
        if (c == '"') break;
        if (c < 0x20) bad = "control character in a string";
        else if (c == '\\') {
            c = p->s[p->at++]; /* before the closing quote: found above */
            switch (c) {
            case '"': case '\\': case '/': break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u': {
                long u = zero__st_hex4(p), lo = -1;
                if (u >= 0xD800 && u <= 0xDBFF && p->at + 1 < p->n && p->s[p->at] == '\\' &&
                    p->s[p->at + 1] == 'u') {
                    p->at += 2;
                    lo = zero__st_hex4(p);
                    if (lo < 0xDC00 || lo > 0xDFFF) u = -2;
                    else u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                } else if (u >= 0xD800 && u <= 0xDFFF) u = -2;
                if (u == -1) bad = "bad \\u escape";
                else if (u == -2) bad = "a \\u escape of an unpaired surrogate";
                else if (u == 0) bad = "\\u0000 in a string";
                else if (o) { /* its UTF-8 (at most as long as the escape) */
                    if (u < 0x80) o[k++] = (char)u;
                    else if (u < 0x800) {
                        o[k++] = (char)(0xC0 | (u >> 6));
                        o[k++] = (char)(0x80 | (u & 0x3F));
                    } else if (u < 0x10000) {
                        o[k++] = (char)(0xE0 | (u >> 12));
                        o[k++] = (char)(0x80 | ((u >> 6) & 0x3F));
                        o[k++] = (char)(0x80 | (u & 0x3F));
                    } else {
                        o[k++] = (char)(0xF0 | (u >> 18));
                        o[k++] = (char)(0x80 | ((u >> 12) & 0x3F));
                        o[k++] = (char)(0x80 | ((u >> 6) & 0x3F));
                        o[k++] = (char)(0x80 | (u & 0x3F));
                    }
                }
                if (!bad) continue;
                break;
            }
            default: bad = "unknown escape";
            }
        }
        if (bad) {
            ZERO_FREE(o);
            return zero__st_err(p, bad);
        }
        if (o) o[k++] = (char)c;
    }
    if (o) {
        o[k] = '\0';
        *out = o;
    }
    return ZERO_OK;
}

static zero_result zero__st_uint(zero__st_p *p, uint64_t *out)
{
    uint64_t v = 0;
    size_t start;
    zero__st_ws(p);
    start = p->at;
    while (p->at < p->n && p->s[p->at] >= '0' && p->s[p->at] <= '9') {
        unsigned d = (unsigned)(p->s[p->at] - '0');
        if (v > (UINT64_MAX - d) / 10u) return zero__st_err(p, "integer too large");
        v = v * 10u + d;
        p->at++;
    }
    if (p->at == start) return zero__st_err(p, "expected a non-negative integer");
    if (p->at - start > 1 && p->s[start] == '0') return zero__st_err(p, "leading zero");
    *out = v;
    return ZERO_OK;
}

/* __metadata__'s value: an object whose values are strings (safetensors' str -> str map),
   read and dropped. */
static zero_result zero__st_metadata(zero__st_p *p)
{
    zero_result r;
    if (!zero__st_lit(p, '{')) return zero__st_err(p, "__metadata__ must be an object of strings");
    if (zero__st_lit(p, '}')) return ZERO_OK;
    do {
        if ((r = zero__st_string(p, NULL)) != ZERO_OK) return r;
        if (!zero__st_lit(p, ':')) return zero__st_err(p, "expected ':'");
        zero__st_ws(p);
        if (p->at >= p->n || p->s[p->at] != '"')
            return zero__st_err(p, "a __metadata__ value is not a string");
        if ((r = zero__st_string(p, NULL)) != ZERO_OK) return r;
    } while (zero__st_lit(p, ','));
    return zero__st_lit(p, '}') ? ZERO_OK : zero__st_err(p, "expected '}'");
}

static size_t zero__st_dtype_size(const char *d)
{
    static const struct { const char *name; size_t size; } tab[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
        {"I8", 1}, {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1},
        {"F8_E4M3", 1}, {"F8_E5M2", 1}};
    size_t i;
    for (i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (strcmp(d, tab[i].name) == 0) return tab[i].size;
    return 0;
}

static int zero__st_cmp_begin(const void *a, const void *b)
{
    const zero__st_entry *x = *(const zero__st_entry *const *)a, *y = *(const zero__st_entry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

/* Parses a safetensors JSON header of hn bytes whose data part holds data_bytes bytes, and
   checks it: known dtypes, shapes whose size matches the offsets, offsets that tile the
   data exactly, unique names. */
static zero_result zero__st_parse(const unsigned char *h, size_t hn, uint64_t data_bytes,
                                  const char *what, zero__st_file *out)
{
    zero__st_p p;
    zero_result r = ZERO_OK;
    zero__st_entry **order = NULL;
    int i, have_meta = 0, *tmp = NULL;
    memset(out, 0, sizeof *out);
    p.s = h;
    p.n = hn;
    p.at = 0;
    p.what = what;
    if (!zero__st_lit(&p, '{')) return zero__st_err(&p, "expected '{'");
    if (zero__st_lit(&p, '}')) goto closed;
    do {
            char *key = NULL;
            zero__st_entry ent;
            int have_d = 0, have_s = 0, have_o = 0;
            if ((r = zero__st_string(&p, &key)) != ZERO_OK) goto fail;
            if (!zero__st_lit(&p, ':')) {
                ZERO_FREE(key);
                r = zero__st_err(&p, "expected ':'");
                goto fail;
            }
            if (strcmp(key, "__metadata__") == 0) {
                ZERO_FREE(key);
                if (have_meta++) {
                    r = zero__st_err(&p, "__metadata__ appears twice");
                    goto fail;
                }
                if ((r = zero__st_metadata(&p)) != ZERO_OK) goto fail;
                continue;
            }
            memset(&ent, 0, sizeof ent);
            ent.name = key;
            if (!key[0] || strlen(key) > 255) {
                ZERO_FREE(key);
                r = zero__st_err(&p, "tensor name empty or longer than 255 bytes");
                goto fail;
            }
            if (out->n == out->cap) {
                int cap = out->cap ? (out->cap > 0x3fffffff ? 0x7fffffff : out->cap * 2) : 16;
                if (out->n == 0x7fffffff) {
                    ZERO_FREE(key);
                    r = zero__st_err(&p, "too many tensors");
                    goto fail;
                }
                zero__st_entry *ne = (zero__st_entry *)ZERO_MALLOC((size_t)cap * sizeof *ne);
                if (!ne) {
                    ZERO_FREE(key);
                    r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: header", what);
                    goto fail;
                }
                if (out->n) memcpy(ne, out->ent, (size_t)out->n * sizeof *ne);
                ZERO_FREE(out->ent);
                out->ent = ne;
                out->cap = cap;
            }
            out->ent[out->n++] = ent;
            if (!zero__st_lit(&p, '{')) {
                r = zero__st_err(&p, "expected a tensor object");
                goto fail;
            }
            do {
                char *f = NULL;
                zero__st_entry *E = &out->ent[out->n - 1];
                if ((r = zero__st_string(&p, &f)) != ZERO_OK) goto fail;
                if (!zero__st_lit(&p, ':')) {
                    ZERO_FREE(f);
                    r = zero__st_err(&p, "expected ':'");
                    goto fail;
                }
                if (strcmp(f, "dtype") == 0 && !have_d) {
                    char *d = NULL;
                    have_d = 1;
                    ZERO_FREE(f);
                    if ((r = zero__st_string(&p, &d)) != ZERO_OK) goto fail;
                    if (strlen(d) >= sizeof E->dtype || !zero__st_dtype_size(d)) {
                        ZERO_FREE(d);
                        r = zero__st_err(&p, "unknown dtype");
                        goto fail;
                    }
                    strcpy(E->dtype, d);
                    ZERO_FREE(d);
                } else if (strcmp(f, "shape") == 0 && !have_s) {
                    have_s = 1;
                    ZERO_FREE(f);
                    if (!zero__st_lit(&p, '[')) {
                        r = zero__st_err(&p, "expected a shape array");
                        goto fail;
                    }
                    if (!zero__st_lit(&p, ']')) {
                        do {
                            uint64_t v;
                            if ((r = zero__st_uint(&p, &v)) != ZERO_OK) goto fail;
                            if (E->ndim == ZERO_TENSOR_MAX_DIMS) {
                                r = zero__st_err(&p, "more than 8 dimensions");
                                goto fail;
                            }
                            E->dims[E->ndim++] = v;
                        } while (zero__st_lit(&p, ','));
                        if (!zero__st_lit(&p, ']')) {
                            r = zero__st_err(&p, "expected ']'");
                            goto fail;
                        }
                    }
                } else if (strcmp(f, "data_offsets") == 0 && !have_o) {
                    have_o = 1;
                    ZERO_FREE(f);
                    if (!zero__st_lit(&p, '[') || zero__st_uint(&p, &E->begin) != ZERO_OK ||
                        !zero__st_lit(&p, ',') || zero__st_uint(&p, &E->end) != ZERO_OK ||
                        !zero__st_lit(&p, ']')) {
                        r = zero__st_err(&p, "data_offsets must be [begin, end]");
                        goto fail;
                    }
                } else {
                    ZERO_FREE(f);
                    r = zero__st_err(&p, "unknown or repeated field in a tensor");
                    goto fail;
                }
            } while (zero__st_lit(&p, ','));
            if (!zero__st_lit(&p, '}')) {
                r = zero__st_err(&p, "expected '}'");
                goto fail;
            }
            if (!have_d || !have_s || !have_o) {
                r = zero__st_err(&p, "a tensor lacks dtype, shape or data_offsets");
                goto fail;
            }
        } while (zero__st_lit(&p, ','));
    if (!zero__st_lit(&p, '}')) {
        r = zero__st_err(&p, "expected '}'");
        goto fail;
    }
closed:
    zero__st_ws(&p);
    if (p.at != p.n) {
        r = zero__st_err(&p, "bytes after the header object");
        goto fail;
    }
    /* sizes, names, tiling */
    for (i = 0; i < out->n; i++) {
        zero__st_entry *E = &out->ent[i];
        uint64_t numel = 1, bytes;
        int k;
        for (k = 0; k < E->ndim; k++) {
            if (E->dims[k] != 0 && numel > UINT64_MAX / E->dims[k]) {
                r = zero__fail(ZERO_ERROR_IO, "%s: tensor '%s': shape overflows", what, E->name);
                goto fail;
            }
            numel *= E->dims[k];
        }
        bytes = numel * zero__st_dtype_size(E->dtype);
        if (numel > UINT64_MAX / 8u || E->end < E->begin || E->end - E->begin != bytes) {
            r = zero__fail(ZERO_ERROR_IO, "%s: tensor '%s': data_offsets [%llu, %llu] do not hold "
                           "its shape of %s", what, E->name, (unsigned long long)E->begin,
                           (unsigned long long)E->end, E->dtype);
            goto fail;
        }
    }
    /* unique names: sorted, then neighbours compared (O(n log n), whatever the names) */
    if (out->n > 0) {
        out->by_name = (int *)ZERO_MALLOC((size_t)out->n * sizeof(int));
        tmp = (int *)ZERO_MALLOC((size_t)out->n * sizeof(int));
        if (!out->by_name || !tmp) {
            r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: %d tensor names", what, out->n);
            goto fail;
        }
        for (i = 0; i < out->n; i++) out->by_name[i] = i;
        zero__st_sort_names(out, out->by_name, tmp, out->n);
        ZERO_FREE(tmp);
        tmp = NULL;
        for (i = 1; i < out->n; i++)
            if (strcmp(out->ent[out->by_name[i - 1]].name, out->ent[out->by_name[i]].name) == 0) {
                r = zero__fail(ZERO_ERROR_IO, "%s: tensor '%s' appears twice", what,
                               out->ent[out->by_name[i]].name);
                goto fail;
            }
    }
    if (out->n > 0) {
        uint64_t at = 0;
        order = (zero__st_entry **)ZERO_MALLOC((size_t)out->n * sizeof *order);
        if (!order) {
            r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s", what);
            goto fail;
        }
        for (i = 0; i < out->n; i++) order[i] = &out->ent[i];
        qsort(order, (size_t)out->n, sizeof *order, zero__st_cmp_begin);
        for (i = 0; i < out->n; i++) {
            if (order[i]->begin != at) {
                r = zero__fail(ZERO_ERROR_IO, "%s: tensor '%s' starts at data byte %llu, expected "
                               "%llu (holes or overlaps)", what, order[i]->name,
                               (unsigned long long)order[i]->begin, (unsigned long long)at);
                goto fail;
            }
            at = order[i]->end;
        }
        if (at != data_bytes) {
            r = zero__fail(ZERO_ERROR_IO, "%s: tensors end at data byte %llu, the file holds %llu",
                           what, (unsigned long long)at, (unsigned long long)data_bytes);
            goto fail;
        }
    } else if (data_bytes != 0) {
        r = zero__fail(ZERO_ERROR_IO, "%s: no tensors but %llu data bytes", what,
                       (unsigned long long)data_bytes);
        goto fail;
    }
    ZERO_FREE(order);
    return ZERO_OK;
fail:
    ZERO_FREE(order);
    ZERO_FREE(tmp);
    zero__st_free(out);
    return r;
}

/* Opens a safetensors file and parses its header; *data_off = where the data starts. */
static zero_result zero__st_open(const char *path, int *fd_out, zero__st_file *f, uint64_t *data_off)
{
    int fd;
    struct stat st;
    unsigned char lenb[8], *h;
    uint64_t hn = 0;
    zero_result r;
    int i;
    *fd_out = -1;
    memset(f, 0, sizeof *f);
    /* non-blocking, regular files only: a FIFO named like the file must not hang the load */
    r = zero__ck_open_read(path, "safetensors file", 0, &fd, &st);
    if (r != ZERO_OK) return r;
    if (st.st_size < 8) {
        close(fd);
        return zero__fail(ZERO_ERROR_IO, "%s: not a safetensors file (shorter than 8 bytes)", path);
    }
    r = zero__ck_pread(fd, lenb, 8, 0, path);
    for (i = 0; i < 8; i++) hn |= (uint64_t)lenb[i] << (8 * i);
    if (r == ZERO_OK && (hn < 2 || hn > ((uint64_t)100 << 20) || hn > (uint64_t)st.st_size - 8))
        r = lenb[0] == '{'
                ? zero__fail(ZERO_ERROR_IO, "%s: a JSON file, not a safetensors file (a sharded "
                             "checkpoint's model.safetensors.index.json? zero_engine_load_pretrained "
                             "reads those)", path)
                : zero__fail(ZERO_ERROR_IO, "%s: header size %llu does not fit the file of %lld bytes "
                             "(or exceeds 100 MB)", path, (unsigned long long)hn, (long long)st.st_size);
    if (r != ZERO_OK) {
        close(fd);
        return r;
    }
    h = (unsigned char *)ZERO_MALLOC((size_t)hn);
    if (!h) {
        close(fd);
        return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: header", path);
    }
    r = zero__ck_pread(fd, h, (size_t)hn, 8, path);
    if (r == ZERO_OK) r = zero__st_parse(h, (size_t)hn, (uint64_t)st.st_size - 8 - hn, path, f);
    ZERO_FREE(h);
    if (r != ZERO_OK) {
        close(fd);
        return r;
    }
    *fd_out = fd;
    *data_off = 8 + hn;
    return ZERO_OK;
}

/* The shard files of a load: one safetensors file, or those a sharded checkpoint's index names. */
typedef struct zero__st_set {
    int n, cap;
    char **paths;          /* each file's path (owned)                 */
    int *fds;              /* open for reading, -1 before              */
    uint64_t *data_off;    /* where each file's data starts            */
    zero__st_file *f;      /* each file's parsed header                */
} zero__st_set;

static void zero__st_set_free(zero__st_set *s)
{
    int i;
    for (i = 0; i < s->n; i++) {
        ZERO_FREE(s->paths[i]);
        if (s->fds[i] >= 0) close(s->fds[i]);
        zero__st_free(&s->f[i]);
    }
    ZERO_FREE(s->paths);
    ZERO_FREE(s->fds);
    ZERO_FREE(s->data_off);
    ZERO_FREE(s->f);
    memset(s, 0, sizeof *s);
}

/* Adds file dir/name (dir NULL: name) to the set unless it is there; not opened yet. */
static zero_result zero__st_set_add(zero__st_set *s, const char *dir, const char *name)
{
    size_t dl = dir ? strlen(dir) : 0, nl = strlen(name);
    char *path;
    int i;
    path = (char *)ZERO_MALLOC(dl + nl + 2);
    if (!path) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "safetensors shard list");
    if (dir) {
        memcpy(path, dir, dl);
        path[dl] = '/';
        memcpy(path + dl + 1, name, nl + 1);
    } else {
        memcpy(path, name, nl + 1);
    }
    for (i = 0; i < s->n; i++)
        if (strcmp(s->paths[i], path) == 0) {
            ZERO_FREE(path);
            return ZERO_OK;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 4, k;
        char **np = (char **)ZERO_MALLOC((size_t)cap * sizeof *np);
        int *nf = (int *)ZERO_MALLOC((size_t)cap * sizeof *nf);
        uint64_t *no = (uint64_t *)ZERO_MALLOC((size_t)cap * sizeof *no);
        zero__st_file *nfi = (zero__st_file *)ZERO_MALLOC((size_t)cap * sizeof *nfi);
        if (s->cap > (1 << 20) || !np || !nf || !no || !nfi) {
            ZERO_FREE(np);
            ZERO_FREE(nf);
            ZERO_FREE(no);
            ZERO_FREE(nfi);
            ZERO_FREE(path);
            return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "safetensors shard list of %d files", s->n);
        }
        for (k = 0; k < s->n; k++) np[k] = s->paths[k], nf[k] = s->fds[k], no[k] = s->data_off[k], nfi[k] = s->f[k];
        ZERO_FREE(s->paths);
        ZERO_FREE(s->fds);
        ZERO_FREE(s->data_off);
        ZERO_FREE(s->f);
        s->paths = np, s->fds = nf, s->data_off = no, s->f = nfi, s->cap = cap;
    }
    s->paths[s->n] = path;
    s->fds[s->n] = -1;
    s->data_off[s->n] = 0;
    memset(&s->f[s->n], 0, sizeof s->f[s->n]);
    s->n++;
    return ZERO_OK;
}

/* Skips one JSON value (a sharded index's "metadata" and other keys), nested at most 64 deep. */
static zero_result zero__st_skip_value(zero__st_p *p, int depth)
{
    zero_result r;
    unsigned char c;
    zero__st_ws(p);
    if (depth > 64) return zero__st_err(p, "nested more than 64 deep");
    if (p->at >= p->n) return zero__st_err(p, "expected a value");
    c = p->s[p->at];
    if (c == '"') return zero__st_string(p, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        p->at++;
        if (zero__st_lit(p, close)) return ZERO_OK;
        do {
            if (c == '{') {
                if ((r = zero__st_string(p, NULL)) != ZERO_OK) return r;
                if (!zero__st_lit(p, ':')) return zero__st_err(p, "expected ':'");
            }
            if ((r = zero__st_skip_value(p, depth + 1)) != ZERO_OK) return r;
        } while (zero__st_lit(p, ','));
        return zero__st_lit(p, close) ? ZERO_OK : zero__st_err(p, c == '{' ? "expected '}'" : "expected ']'");
    }
    {
        size_t start = p->at; /* a number, true, false or null */
        while (p->at < p->n && ((p->s[p->at] >= '0' && p->s[p->at] <= '9') || (p->s[p->at] >= 'a' &&
                                p->s[p->at] <= 'z') || p->s[p->at] == '-' || p->s[p->at] == '+' ||
                                p->s[p->at] == '.' || p->s[p->at] == 'E'))
            p->at++;
        return p->at > start ? ZERO_OK : zero__st_err(p, "expected a value");
    }
}

/* A sharded checkpoint's index (JSON text h of hn bytes, read from path): every distinct
   file its "weight_map" object names, in the directory of path, into s. The names must be
   plain file names (no '/', not "." or ".."). */
static zero_result zero__st_index(const unsigned char *h, size_t hn, const char *path, zero__st_set *s)
{
    zero__st_p p;
    zero_result r = ZERO_OK;
    char *dir = NULL;
    const char *slash = strrchr(path, '/');
    int have_map = 0, entries = 0;
    p.s = h;
    p.n = hn;
    p.at = 0;
    p.what = path;
    if (slash) {
        size_t dl = (size_t)(slash - path);
        dir = (char *)ZERO_MALLOC(dl + 2);
        if (!dir) return zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: index", path);
        memcpy(dir, path, dl ? dl : 1); /* "/x.json": the root */
        dir[dl ? dl : 1] = '\0';
    }
    if (!zero__st_lit(&p, '{')) {
        r = zero__st_err(&p, "a sharded index must be a JSON object");
        goto out;
    }
    if (zero__st_lit(&p, '}')) goto closed;
    do {
        char *key = NULL;
        if ((r = zero__st_string(&p, &key)) != ZERO_OK) goto out;
        if (!zero__st_lit(&p, ':')) {
            ZERO_FREE(key);
            r = zero__st_err(&p, "expected ':'");
            goto out;
        }
        if (strcmp(key, "weight_map") != 0 || have_map) {
            r = strcmp(key, "weight_map") == 0 ? zero__st_err(&p, "weight_map appears twice")
                                                : zero__st_skip_value(&p, 0);
            ZERO_FREE(key);
            if (r != ZERO_OK) goto out;
            continue;
        }
        ZERO_FREE(key);
        have_map = 1;
        if (!zero__st_lit(&p, '{')) {
            r = zero__st_err(&p, "weight_map must be an object of tensor name -> file name");
            goto out;
        }
        if (zero__st_lit(&p, '}')) continue;
        do {
            char *file = NULL;
            if ((r = zero__st_string(&p, NULL)) != ZERO_OK) goto out;
            if (!zero__st_lit(&p, ':')) {
                r = zero__st_err(&p, "expected ':'");
                goto out;
            }
            zero__st_ws(&p);
            if (p.at >= p.n || p.s[p.at] != '"') {
                r = zero__st_err(&p, "a weight_map value is not a file name");
                goto out;
            }
            if ((r = zero__st_string(&p, &file)) != ZERO_OK) goto out;
            if (!file[0] || strchr(file, '/') || strcmp(file, ".") == 0 || strcmp(file, "..") == 0 ||
                strlen(file) > 255) {
                r = zero__fail(ZERO_ERROR_IO, "%s: weight_map names '%.100s', not a plain file name in the "
                               "index's directory", path, file);
                ZERO_FREE(file);
                goto out;
            }
            r = zero__st_set_add(s, dir, file);
            ZERO_FREE(file);
            if (r != ZERO_OK) goto out;
            entries++;
        } while (zero__st_lit(&p, ','));
        if (!zero__st_lit(&p, '}')) {
            r = zero__st_err(&p, "expected '}'");
            goto out;
        }
    } while (zero__st_lit(&p, ','));
    if (!zero__st_lit(&p, '}')) {
        r = zero__st_err(&p, "expected '}'");
        goto out;
    }
closed:
    zero__st_ws(&p);
    if (p.at != p.n) r = zero__st_err(&p, "text after the index's object");
    else if (!have_map || entries == 0)
        r = zero__fail(ZERO_ERROR_IO, "%s: a sharded index without a weight_map (or an empty one)", path);
out:
    ZERO_FREE(dir);
    return r;
}

/* The files of a Hugging Face checkpoint at path into s: a directory (its model.safetensors,
   else its model.safetensors.index.json), a sharded index (a regular file whose text is a
   JSON object: its weight_map's files) or one safetensors file. Every file is opened and
   its header checked. */
static zero_result zero__st_set_open(const char *path, zero__st_set *s)
{
    struct stat st;
    zero_result r;
    int i, fd = -1;
    memset(s, 0, sizeof *s);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        r = zero__st_set_add(s, path, "model.safetensors");
        if (r == ZERO_OK && stat(s->paths[0], &st) != 0) {
            zero__st_set_free(s);
            r = zero__st_set_add(s, path, "model.safetensors.index.json");
            if (r == ZERO_OK && stat(s->paths[0], &st) != 0)
                r = zero__fail(ZERO_ERROR_NOT_FOUND, "%s: a directory without model.safetensors or "
                               "model.safetensors.index.json", path);
        }
    } else {
        r = zero__st_set_add(s, NULL, path);
    }
    if (r == ZERO_OK) { /* a JSON index rather than a safetensors file? */
        unsigned char b[9];
        uint64_t hn = 0;
        int k;
        r = zero__ck_open_read(s->paths[0], "safetensors file or sharded index", 0, &fd, &st);
        if (r == ZERO_OK && st.st_size >= 1 && st.st_size <= ((off_t)100 << 20)) {
            size_t got = st.st_size >= 9 ? 9 : 1;
            r = zero__ck_pread(fd, b, got, 0, s->paths[0]);
            for (k = 0; k < 8 && got == 9; k++) hn |= (uint64_t)b[k] << (8 * k);
            if (r == ZERO_OK && b[0] == '{' && !(got == 9 && hn <= (uint64_t)st.st_size - 9 && b[8] == '{')) {
                unsigned char *text = (unsigned char *)ZERO_MALLOC((size_t)st.st_size);
                zero__st_set idx;
                memset(&idx, 0, sizeof idx);
                if (!text) r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "%s: index", s->paths[0]);
                if (r == ZERO_OK) r = zero__ck_pread(fd, text, (size_t)st.st_size, 0, s->paths[0]);
                if (r == ZERO_OK) r = zero__st_index(text, (size_t)st.st_size, s->paths[0], &idx);
                ZERO_FREE(text);
                close(fd);
                fd = -1;
                zero__st_set_free(s);
                *s = idx;
                if (r != ZERO_OK) zero__st_set_free(s);
            }
        }
        if (fd >= 0) close(fd);
    }
    for (i = 0; i < s->n && r == ZERO_OK; i++) r = zero__st_open(s->paths[i], &s->fds[i], &s->f[i], &s->data_off[i]);
    if (r != ZERO_OK) zero__st_set_free(s);
    return r;
}

/* The loads' common part: every engine tensor from the set's files (by its name, or the
   name less prefix), checked and agreed on before anything is set. */
static zero_result zero__eng_load_set(zero_engine *e, zero__st_set *s, const char *prefix, const char *what,
                                      zero_result r)
{
    int t, *which = NULL, *file = NULL;
    size_t maxn = 0, pl = prefix ? strlen(prefix) : 0;
    unsigned char *raw = NULL, *conv = NULL;
    float *vals = NULL;
    if (r != ZERO_OK) return zero__ck_agree(e, r, NULL);
    which = (int *)ZERO_MALLOC((size_t)e->layout.ntensors * sizeof(int));
    file = (int *)ZERO_MALLOC((size_t)e->layout.ntensors * sizeof(int));
    if (!which || !file) r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_load_safetensors");
    /* every check first: nothing is set unless all tensors are there and fit */
    for (t = 0; t < e->layout.ntensors && r == ZERO_OK; t++) {
        zero_tensor_info ti;
        zero__st_entry *E = NULL;
        uint64_t numel = 1;
        int k, i, nd = t < e->layout.cap_shapes ? e->layout.shapes[t].ndim : 0;
        const char *path;
        memset(&ti, 0, sizeof ti);
        zero_plan_tensor(e->layout.plan, t, &ti);
        for (i = 0; i < s->n && !E; i++) E = zero__st_find(&s->f[i], ti.name);
        if (!E && pl > 0 && strncmp(ti.name, prefix, pl) == 0 && ti.name[pl])
            for (i = 0; i < s->n && !E; i++) E = zero__st_find(&s->f[i], ti.name + pl);
        if (!E) {
            if (pl > 0 && strncmp(ti.name, prefix, pl) == 0 && ti.name[pl])
                r = zero__fail(ZERO_ERROR_NOT_FOUND, "%s: no tensor named '%s' (nor '%s')", what, ti.name,
                               ti.name + pl);
            else
                r = zero__fail(ZERO_ERROR_NOT_FOUND, "%s: no tensor named '%s'", what, ti.name);
            break;
        }
        file[t] = i - 1;
        path = s->paths[i - 1];
        for (k = 0; k < E->ndim; k++) numel *= E->dims[k];
        if (numel != ti.numel) {
            r = zero__fail(ZERO_ERROR_MISMATCH, "%s: tensor '%s' has %llu elements, the engine's "
                           "%zu", path, E->name, (unsigned long long)numel, ti.numel);
            break;
        }
        if (nd > 0) {
            int same = nd == E->ndim;
            for (k = 0; same && k < nd; k++) same = e->layout.shapes[t].dims[k] == E->dims[k];
            if (!same) {
                r = zero__fail(ZERO_ERROR_MISMATCH, "%s: tensor '%s' has another shape than the "
                               "engine's (same size)", path, E->name);
                break;
            }
        }
        if (strcmp(E->dtype, "F32") != 0 && strcmp(E->dtype, "F16") != 0 &&
            strcmp(E->dtype, "BF16") != 0) {
            r = zero__fail(ZERO_ERROR_UNSUPPORTED, "%s: tensor '%s' is %s (F32, F16 or BF16 can "
                           "be loaded)", path, E->name, E->dtype);
            break;
        }
        which[t] = (int)(E - s->f[i - 1].ent);
        if (ti.numel > maxn) maxn = ti.numel;
    }
    if (r == ZERO_OK) {
        raw = (unsigned char *)ZERO_MALLOC(maxn * 4u);
        vals = (float *)ZERO_MALLOC(maxn * 4u);
        conv = e->cfg.param_dtype != ZERO_F32
                   ? (unsigned char *)zero__alloc(&e->cfg.desc.allocator, maxn * e->cfg.param_size)
                   : NULL;
        if (!raw || !vals || (e->cfg.param_dtype != ZERO_F32 && !conv))
            r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_engine_load_safetensors: buffers "
                           "for %zu elements", maxn);
    }
    r = zero__ck_agree(e, r, NULL); /* from here on every rank sets every tensor */
    for (t = 0; t < e->layout.ntensors && r == ZERO_OK; t++) {
        zero__st_entry *E = &s->f[file[t]].ent[which[t]];
        zero_dtype dt = strcmp(E->dtype, "F32") == 0 ? ZERO_F32
                        : strcmp(E->dtype, "F16") == 0 ? ZERO_F16 : ZERO_BF16;
        size_t n = (size_t)((E->end - E->begin) / zero_dtype_size(dt));
        r = zero__ck_pread(s->fds[file[t]], raw, (size_t)(E->end - E->begin), s->data_off[file[t]] + E->begin,
                           s->paths[file[t]]);
        if (r == ZERO_OK) r = zero_convert(vals, ZERO_F32, raw, dt, n, ZERO_SIMD_AUTO);
        if (r == ZERO_OK) r = zero__eng_set_tensor(e, t, vals, conv);
        if (r != ZERO_OK && t > 0 && e->lifecycle == ZERO__ENG_COMMITTED) { /* half set: unusable */
            char why[300];
            zero__eng_copy_error(why, sizeof why);
            e->lifecycle = ZERO__ENG_BROKEN;
            snprintf(e->broken_why, sizeof e->broken_why,
                     "zero_engine_load_safetensors failed after "
                     "setting %d of %d tensors: %.200s",
                     t, e->layout.ntensors, why);
        }
    }
    ZERO_FREE(raw);
    ZERO_FREE(vals);
    if (conv) zero__free(&e->cfg.desc.allocator, conv);
    ZERO_FREE(which);
    ZERO_FREE(file);
    return r;
}

ZERODEF zero_result zero_engine_load_safetensors(zero_engine *e, const char *path)
{
    zero_result r = zero__eng_usable(e, "zero_engine_load_safetensors");
    zero__st_set s;
    memset(&s, 0, sizeof s);
    if (r != ZERO_OK) return r;
    /* Every check and allocation of every rank first, then one agreement: a rank that
       fails (argument, header, allocation) fails every rank's call before anything is set. */
    if (!path) r = zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_load_safetensors: path is NULL");
    if (r == ZERO_OK) r = zero__ck_between_steps(e, "zero_engine_load_safetensors", 1);
    if (r == ZERO_OK) r = zero__st_set_add(&s, NULL, path);
    if (r == ZERO_OK) r = zero__st_open(path, &s.fds[0], &s.f[0], &s.data_off[0]);
    r = zero__eng_load_set(e, &s, NULL, path, r);
    zero__st_set_free(&s);
    return r;
}

ZERODEF zero_result zero_engine_load_pretrained(zero_engine *e, const char *path, const char *prefix)
{
    zero_result r = zero__eng_usable(e, "zero_engine_load_pretrained");
    zero__st_set s;
    memset(&s, 0, sizeof s);
    if (r != ZERO_OK) return r;
    if (!path) r = zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_engine_load_pretrained: path is NULL");
    if (r == ZERO_OK) r = zero__ck_between_steps(e, "zero_engine_load_pretrained", 1);
    if (r == ZERO_OK) r = zero__st_set_open(path, &s);
    r = zero__eng_load_set(e, &s, prefix, path, r);
    zero__st_set_free(&s);
    return r;
}

/* JSON string body with the escapes a name needs. */
static void zero__st_put_name(zero__ck_buf *b, const char *s)
{
    zero__ck_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            zero__ck_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            zero__ck_put(b, esc, 6);
        } else {
            zero__ck_put(b, s, 1);
        }
    }
    zero__ck_put(b, "\"", 1);
}

ZERODEF zero_result zero_checkpoint_export(zero_checkpoint *ck, const char *path, zero_dtype dtype)
{
    zero__ck_buf h;
    char tmp[4240], num[64];
    uint64_t at = 0, maxn = 0;
    size_t esz, bytes = 0;
    int t, k, fd = -1;
    unsigned char *buf = NULL, *out = NULL;
    zero_result r = ZERO_OK;
    uint64_t woff;
    if (!ck || !path) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_export: NULL");
    if (dtype != ZERO_F32 && dtype != ZERO_F16 && dtype != ZERO_BF16)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_export: dtype %d (f32, f16, bf16)",
                          (int)dtype);
    if (!path[0] || strlen(path) > 4000)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_export: path empty or too long");
    {   /* never inside a checkpoint directory: the output could replace one of its files */
        char parent[4200], man[4300];
        struct stat a, b;
        const char *slash = strrchr(path, '/');
        if (!slash) snprintf(parent, sizeof parent, ".");
        else if (slash == path) snprintf(parent, sizeof parent, "/");
        else snprintf(parent, sizeof parent, "%.*s", (int)(slash - path), path);
        snprintf(man, sizeof man, "%s/%s", parent, ZERO__CK_MANIFEST);
        if ((stat(parent, &a) == 0 && stat(ck->dir, &b) == 0 && a.st_dev == b.st_dev &&
             a.st_ino == b.st_ino) || stat(man, &b) == 0)
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_export: refusing to "
                              "write %s inside a checkpoint directory (%s)", path, parent);
    }
    esz = zero_dtype_size(dtype);
    memset(&h, 0, sizeof h);
    zero__ck_puts(&h, "{\"__metadata__\":{\"format\":\"pt\",\"zero_step\":\"");
    snprintf(num, sizeof num, "%lld\"}", (long long)ck->info.step);
    zero__ck_put(&h, num, strlen(num));
    for (t = 0; t < ck->info.num_tensors; t++) { /* JSON text is UTF-8: refuse other bytes */
        size_t len = strlen(ck->tensors[t].name);
        if (zero__utf8_bad((const unsigned char *)ck->tensors[t].name, len) != len) {
            ZERO_FREE(h.p);
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_checkpoint_export: tensor %d's "
                              "name is not UTF-8 (byte %zu): a safetensors header cannot hold it",
                              t, zero__utf8_bad((const unsigned char *)ck->tensors[t].name, len) + 1);
        }
    }
    for (t = 0; t < ck->info.num_tensors; t++) {
        const zero__ck_tensor *T = &ck->tensors[t];
        const char *dn = dtype == ZERO_F32 ? "F32" : dtype == ZERO_F16 ? "F16" : "BF16";
        zero__ck_put(&h, ",", 1);
        zero__st_put_name(&h, T->name);
        zero__ck_puts(&h, ":{\"dtype\":\"");
        zero__ck_put(&h, dn, strlen(dn));
        zero__ck_puts(&h, "\",\"shape\":[");
        if (T->ndim == 0) {
            snprintf(num, sizeof num, "%llu", (unsigned long long)T->numel);
            zero__ck_put(&h, num, strlen(num));
        }
        for (k = 0; k < T->ndim; k++) {
            snprintf(num, sizeof num, "%s%llu", k ? "," : "", (unsigned long long)T->dims[k]);
            zero__ck_put(&h, num, strlen(num));
        }
        if (T->numel > (UINT64_MAX - at) / esz) { /* bytes, not elements: no wrap */
            r = zero__fail(ZERO_ERROR_OVERFLOW, "zero_checkpoint_export: tensor '%s': %llu "
                           "elements overflow a 64-bit byte size", T->name,
                           (unsigned long long)T->numel);
            goto done;
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
                 (unsigned long long)(at + T->numel * esz));
        zero__ck_put(&h, num, strlen(num));
        at += T->numel * esz;
        if (T->numel > maxn) maxn = T->numel;
    }
    zero__ck_put(&h, "}", 1);
    while (h.n % 8u) zero__ck_put(&h, " ", 1);
    if (h.err) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_checkpoint_export: header");
        goto done;
    }
    if (maxn > (uint64_t)SIZE_MAX || zero__mul_size((size_t)maxn, 4u, &bytes) || bytes > SIZE_MAX - 8u) {
        r = zero__fail(ZERO_ERROR_OVERFLOW, "zero_checkpoint_export: %llu elements",
                       (unsigned long long)maxn);
        goto done;
    }
    buf = (unsigned char *)ZERO_MALLOC(bytes);
    out = (unsigned char *)ZERO_MALLOC(bytes + 8u);
    if (!buf || !out) {
        r = zero__fail(ZERO_ERROR_OUT_OF_MEMORY, "zero_checkpoint_export: %llu elements",
                       (unsigned long long)maxn);
        goto done;
    }
    if ((r = zero__ck_create_tmp(path, tmp, sizeof tmp, &fd)) != ZERO_OK) goto done;
    for (k = 0; k < 8; k++) out[k] = (unsigned char)((uint64_t)h.n >> (8 * k));
    r = zero__ck_pwrite(fd, out, 8, 0, tmp);
    if (r == ZERO_OK) r = zero__ck_pwrite(fd, h.p, h.n, 8, tmp);
    woff = 8 + h.n;
    for (t = 0; t < ck->info.num_tensors && r == ZERO_OK; t++) {
        size_t n = (size_t)ck->tensors[t].numel;
        if (dtype != ZERO_F32 && dtype == ck->info.param_dtype) {
            r = zero_checkpoint_read_tensor(ck, t, ZERO_STATE_PARAM, out);
        } else if (ck->tensors[t].flags & ZERO_TENSOR_FROZEN) { /* no master: its params */
            r = zero_checkpoint_read_tensor(ck, t, ZERO_STATE_PARAM, buf);
            if (r == ZERO_OK) r = zero_convert(out, dtype, buf, ck->info.param_dtype, n, ZERO_SIMD_AUTO);
        } else {
            r = zero_checkpoint_read_tensor(ck, t, ZERO_STATE_MASTER, buf);
            if (r == ZERO_OK) r = zero_convert(out, dtype, buf, ZERO_F32, n, ZERO_SIMD_AUTO);
        }
        if (r == ZERO_OK) r = zero__ck_pwrite(fd, out, n * esz, woff, tmp);
        woff += (uint64_t)n * esz;
    }
    r = zero__ck_commit_tmp(fd, tmp, path, NULL, r);
    fd = -1;
done:
    if (fd >= 0) close(fd);
    ZERO_FREE(h.p);
    ZERO_FREE(buf);
    ZERO_FREE(out);
    return r;
}

#ifdef __cplusplus
}
#endif

#endif /* ZERO_IMPLEMENTATION */

/*
MIT License

Copyright (c) 2026 the zero authors

Permission is hereby granted, free of charge, to any person obtaining a copy of this
software and associated documentation files (the "Software"), to deal in the Software
without restriction, including without limitation the rights to use, copy, modify, merge,
publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons
to whom the Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or
substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED,
INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR
PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE
FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER
DEALINGS IN THE SOFTWARE.
*/
