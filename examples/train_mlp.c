/* train_mlp.c - ZeRO stages 0-3 training a small MLP in plain C on N simulated ranks.

   Each rank is a thread with its own host device and a local comm (zero_local_run). The
   student MLP (32 -> 128 -> 128 -> 8, tanh) learns a fixed random teacher network from
   fresh random inputs: every rank draws its own batch each micro-step (data parallelism).
   Its parameters live in the engine, one group per layer; forward and backward are plain C
   loops that read the fp16/bf16 params (gathered at stage 3) and write fp16/bf16 gradients
   of the loss times the loss scale into the buffers the engine hands out.

   With no arguments it runs stages 0, 1, 2 and 3 with 4 ranks and prints one table: the
   loss, the model-state bytes per rank (measured by the engine and by the paper's formula),
   the bytes each rank communicates per step (measured and by formula) and the time per
   step. The four stages print the same losses: their parameters are bit-identical.

       build/train_mlp [--stage S] [--ranks N] [--steps T] [--dtype f16|bf16] [--accum A]
                       [--batch B] [--lr LR] [--save DIR] [--save-every K] [--resume DIR]

   --save DIR writes a checkpoint (zero_engine_save) every K steps and after the last one;
   --resume DIR loads one (zero_engine_load, at any --ranks and --stage) and continues from
   the step it holds: --steps stays the total, so a run resumed at step T with --steps 2T
   ends where a straight run of 2T steps ends, bit for bit.

   ZeRO-Offload (docs/offload.md): --device-memory SIZE gives each rank's host device a
   budget (4MB, 64MiB, 300KiB or plain bytes); --offload-optimizer none|cpu|nvme,
   --offload-param none|cpu|nvme and --nvme-path DIR set the engine's offload knobs. With
   any of them it runs one stage (--stage, default 3) under the budget and the same run with
   neither budget nor offload, and prints the bytes per tier, the step times and whether
   the final losses are the same: over the budget without offload it stops at commit with
   the engine's out-of-memory message.

   Built with -DZERO_MLP_MPI by mpicc (make mpi: build/train_mlp_mpi), the ranks are the
   processes of mpirun over zero_mpi.h's comm instead of threads; the rest is the same
   program: mpirun -np 4 build/train_mlp_mpi --stage 3 prints the same table. Both end with
   "params checksum: <16 hex digits>", FNV-1a 64 of every rank's share of the final
   parameters (the params of its shard, ranks in order), equal for the same N, dtype and
   steps at every stage and under either launcher. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "examples/size_arg.h"
#include "examples/mlp_common.h" /* shape, teacher, batches, tensors, initial values */

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef ZERO_MLP_MPI
#define ZERO_MPI_IMPLEMENTATION
#include "zero_mpi.h"
#endif

#define MAX_RANKS 64
#define MAX_BATCH (1 << 20) /* samples per rank per micro-step: B x 128 floats stay int-indexable */

static const int dims[NL + 1] = {IN, HID, HID, OUT};

typedef struct opts {
    int stage, ranks, steps, accum, batch;
    zero_dtype dtype;
    double lr;
    /* offload demo */
    int offload_demo;
    size_t device_memory; /* 0 = no budget */
    zero_offload_device oopt, oparam;
    const char *nvme_path;
    const char *save_dir, *resume_dir; /* checkpoints */
    int save_every;
} opts;

typedef struct run {
    const opts *o;
    int stage;
    double *loss;           /* [steps][ranks]: each rank's mean loss of its batches */
    int skipped;            /* steps skipped for inf/NaN (rank 0's count)            */
    double seconds;         /* training loop, rank 0                                 */
    zero_engine_memory mem; /* rank 0                                                */
    zero_engine_memory host_mem; /* rank 0, host tier (offload)                      */
    zero_engine_memory nvme_mem; /* rank 0, NVMe tier (offload)                      */
    int plain;              /* offload demo: the reference run (no budget, no offload)  */
    zero_traffic traffic;   /* rank 0, last step                                     */
    size_t psi;             /* the plan's padded total                               */
    float final_scale;
    unsigned char *share[MAX_RANKS]; /* each rank's share of the final params (checksum) */
    size_t share_bytes[MAX_RANKS];
    int first_step;         /* 0, or the step a --resume checkpoint holds         */
    char why[MAX_RANKS][520]; /* each failed rank's message: this program's, or the library's */
    zero_result res[MAX_RANKS]; /* each rank's result                                       */
} run;

/* A failed allocation of this program: what and how many bytes, kept for the messages. */
static zero_result no_memory(run *R, int rank, const char *what, size_t bytes)
{
    snprintf(R->why[rank], sizeof R->why[rank], "cannot allocate %zu bytes for %s", bytes, what);
    return ZERO_ERROR_OUT_OF_MEMORY;
}

/* ---- one rank ---------------------------------------------------------------------------- */

static float to_f32(const void *p, zero_dtype dt, size_t i)
{
    return dt == ZERO_F16 ? zero_f16_to_f32(((const uint16_t *)p)[i])
                          : zero_bf16_to_f32(((const uint16_t *)p)[i]);
}

#define CHECK(call)                                                                          \
    do {                                                                                     \
        r = (call);                                                                          \
        if (r != ZERO_OK) goto done;                                                         \
    } while (0)

/* ---- the params checksum --------------------------------------------------------------- */

/* Keeps this rank's share of the final params in R->share[rank]: for each tensor (layer by
   layer, W then b), the param bytes of the range whose master weights this rank owns (its
   shard), so the shares of ranks 0..N-1 hold every parameter once, at every stage. */
static zero_result keep_share(zero_engine *e, const int *wid, const int *bid, int rank, run *R)
{
    const zero_plan *plan = zero_engine_plan(e);
    size_t es = zero_dtype_size(R->o->dtype), used = 0, cap = 0;
    float *master = NULL;
    unsigned char *param = NULL, *out = NULL;
    zero_result r = ZERO_OK;
    int l, k;
    for (l = 0; l < NL; l++) cap += (size_t)dims[l] * dims[l + 1] + dims[l + 1];
    master = (float *)malloc(HID * HID * sizeof(float));
    param = (unsigned char *)malloc(HID * HID * es);
    out = (unsigned char *)malloc(cap * es);
    if (!master || !param || !out)
        r = no_memory(R, rank, "the final params", HID * HID * (sizeof(float) + es) + cap * es);
    for (l = 0; l < NL && r == ZERO_OK; l++)
        for (k = 0; k < 2 && r == ZERO_OK; k++) {
            int id = k == 0 ? wid[l] : bid[l];
            zero_range own, got;
            zero_tensor_info ti;
            r = zero_plan_tensor(plan, id, &ti);
            if (r == ZERO_OK) r = zero_engine_read_tensor(e, id, ZERO_STATE_MASTER, master, &own);
            if (r == ZERO_OK) r = zero_engine_read_tensor(e, id, ZERO_STATE_PARAM, param, &got);
            if (r == ZERO_OK && (own.offset < got.offset || own.offset + own.numel > got.offset + got.numel))
                r = ZERO_ERROR_INVALID_STATE; /* a rank always holds the params of its shard */
            if (r == ZERO_OK) {
                memcpy(out + used, param + own.offset * es, own.numel * es);
                used += own.numel * es;
            }
        }
    free(master);
    free(param);
    if (r != ZERO_OK) {
        free(out);
        return r;
    }
    R->share[rank] = out;
    R->share_bytes[rank] = used;
    return ZERO_OK;
}

/* FNV-1a 64 over bytes, continuing from h (start: 0xcbf29ce484222325). */
static uint64_t fnv1a64(uint64_t h, const unsigned char *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static zero_result rank_main(int rank, zero_comm *comm, void *user)
{
    run *R = (run *)user;
    const opts *o = R->o;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r = ZERO_OK;
    int wid[NL], bid[NL], l, s, k, b, i, j;
    size_t woff[NL], boff[NL];
    int B = o->batch;
    /* activations act[l] = input of layer l, B x dims[l]; grads of layer outputs */
    float *act[NL + 1], *dact[NL + 1], *wf = NULL, *bf = NULL, *dw = NULL, *db = NULL;
    float *tgt = NULL, *init = NULL;
    struct timespec t0, t1;
    const zero_plan *plan;
    memset(act, 0, sizeof act);
    memset(dact, 0, sizeof dact);

    {
        zero_host_device_desc hd;
        memset(&hd, 0, sizeof hd);
        if (!R->plain) hd.capacity = o->device_memory;
        CHECK(zero_host_device_create(&hd, &dev));
    }
    mlp_engine_desc(&d, R->stage, o->dtype, o->accum, o->lr);
    if (o->offload_demo) /* both runs: no prefetch (the default arena: a layer's params and
                            gradients, small next to the states) */
        d.prefetch_depth = -1;
    if (o->offload_demo && !R->plain) {
        d.offload_optimizer = o->oopt;
        d.offload_param = o->oparam;
        d.nvme_path = o->nvme_path;
    }
    d.device = dev;
    d.comm = comm;
    CHECK(zero_engine_create(&d, &e));
    CHECK(mlp_add_tensors(e, dims, wid, bid));
    CHECK(zero_engine_commit(e));
    plan = zero_engine_plan(e);
    CHECK(mlp_offsets(plan, wid, bid, woff, boff));
    /* buffers */
    for (l = 0; l <= NL; l++) {
        act[l] = (float *)malloc(sizeof(float) * (size_t)B * dims[l]);
        dact[l] = (float *)malloc(sizeof(float) * (size_t)B * dims[l]);
        if (!act[l] || !dact[l]) {
            char what[96];
            snprintf(what, sizeof what, "the activations of layer %d at --batch %d", l, B);
            r = no_memory(R, rank, what, 2 * sizeof(float) * (size_t)B * dims[l]);
            goto done;
        }
    }
    wf = (float *)malloc(sizeof(float) * HID * HID);
    bf = (float *)malloc(sizeof(float) * HID);
    dw = (float *)malloc(sizeof(float) * HID * HID);
    db = (float *)malloc(sizeof(float) * HID);
    tgt = (float *)malloc(sizeof(float) * (size_t)B * OUT);
    init = (float *)malloc(sizeof(float) * HID * HID);
    if (!wf || !bf || !dw || !db || !tgt || !init) {
        r = no_memory(R, rank, "the weights, gradients and targets",
                      sizeof(float) * (3 * HID * HID + 2 * HID + (size_t)B * OUT));
        goto done;
    }
    /* Initial values: the same on every rank (seeded), set through the engine. */
    CHECK(mlp_set_init(e, dims, wid, bid, init));
    if (o->resume_dir) { /* the loop index is the scaler's update count (skipped steps too) */
        zero_scaler sc;
        memset(&sc, 0, sizeof sc);
        CHECK(zero_engine_load(e, o->resume_dir));
        CHECK(zero_engine_scaler_state(e, &sc));
        R->first_step = (int)sc.iter;
    }

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (s = R->first_step; s < o->steps; s++) {
        zero_step_info info;
        float scale = zero_engine_loss_scale(e);
        double loss_sum = 0.0;
        for (k = 0; k < o->accum; k++) {
            double loss = 0.0;
            float gscale;
            mlp_batch(rank, s, k, B, act[0], tgt);
            /* forward, layer by layer: gather, convert, compute, release */
            for (l = 0; l < NL; l++) {
                void *p;
                int ni = dims[l], no = dims[l + 1];
                CHECK(zero_engine_gather(e, l, &p));
                for (i = 0; i < no * ni; i++) wf[i] = to_f32(p, o->dtype, woff[l] + i);
                for (i = 0; i < no; i++) bf[i] = to_f32(p, o->dtype, boff[l] + i);
                CHECK(zero_engine_release(e, l));
                for (b = 0; b < B; b++)
                    for (i = 0; i < no; i++) {
                        float a = bf[i];
                        const float *x = act[l] + b * ni, *w = wf + i * ni;
                        for (j = 0; j < ni; j++) a += w[j] * x[j];
                        act[l + 1][b * no + i] = l < NL - 1 ? tanhf(a) : a;
                    }
            }
            /* loss = mean over the batch and outputs of (y - t)^2; backward of loss * scale */
            gscale = scale * 2.0f / (float)(B * OUT);
            for (i = 0; i < B * OUT; i++) {
                float diff = act[NL][i] - tgt[i];
                loss += (double)diff * diff;
                dact[NL][i] = diff * gscale;
            }
            loss_sum += loss / (B * OUT);
            for (l = NL - 1; l >= 0; l--) {
                void *p, *g;
                int ni = dims[l], no = dims[l + 1];
                CHECK(zero_engine_gather(e, l, &p));
                for (i = 0; i < no * ni; i++) wf[i] = to_f32(p, o->dtype, woff[l] + i);
                CHECK(zero_engine_grads(e, l, &g));
                /* through tanh: the output of a hidden layer is act[l+1] = tanh(z) */
                if (l < NL - 1)
                    for (i = 0; i < B * no; i++)
                        dact[l + 1][i] *= 1.0f - act[l + 1][i] * act[l + 1][i];
                memset(dw, 0, sizeof(float) * no * ni);
                memset(db, 0, sizeof(float) * no);
                for (b = 0; b < B; b++)
                    for (i = 0; i < no; i++) {
                        float gy = dact[l + 1][b * no + i];
                        const float *x = act[l] + b * ni;
                        float *dwr = dw + i * ni;
                        db[i] += gy;
                        for (j = 0; j < ni; j++) dwr[j] += gy * x[j];
                    }
                if (l > 0)
                    for (b = 0; b < B; b++)
                        for (j = 0; j < ni; j++) {
                            float a = 0;
                            for (i = 0; i < no; i++) a += wf[i * ni + j] * dact[l + 1][b * no + i];
                            dact[l][b * ni + j] = a;
                        }
                CHECK(zero_convert((uint16_t *)g + woff[l], o->dtype, dw, ZERO_F32,
                                   (size_t)no * ni, ZERO_SIMD_AUTO));
                CHECK(zero_convert((uint16_t *)g + boff[l], o->dtype, db, ZERO_F32, (size_t)no,
                                   ZERO_SIMD_AUTO));
                CHECK(zero_engine_release(e, l));
                CHECK(zero_engine_grads_ready(e, l));
            }
        }
        CHECK(zero_engine_step(e, &info));
        R->loss[(size_t)s * o->ranks + rank] = loss_sum / o->accum;
        if (rank == 0 && info.skipped) R->skipped++;
        if (o->save_dir && ((o->save_every > 0 && (s + 1) % o->save_every == 0) || s + 1 == o->steps))
            CHECK(zero_engine_save(e, o->save_dir));
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rank == 0) {
        R->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        zero_engine_memory_usage(e, &R->mem);
        zero_engine_memory_tier(e, ZERO_TIER_HOST, &R->host_mem);
        zero_engine_memory_tier(e, ZERO_TIER_NVME, &R->nvme_mem);
        zero_engine_traffic(e, &R->traffic, NULL);
        R->psi = zero_plan_total_numel(plan);
        R->final_scale = zero_engine_loss_scale(e);
    }
    CHECK(keep_share(e, wid, bid, rank, R));
done:
    if (r != ZERO_OK) { /* main prints it, once */
        if (!R->why[rank][0]) snprintf(R->why[rank], sizeof R->why[rank], "%s", zero_last_error());
    }
    R->res[rank] = r;
    for (l = 0; l <= NL; l++) {
        free(act[l]);
        free(dact[l]);
    }
    free(wf);
    free(bf);
    free(dw);
    free(db);
    free(tgt);
    free(init);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

/* ---- formulas ---------------------------------------------------------------------------- */

/* Model states per rank, DESIGN.md's table with K = 12 and 2-byte params and gradients;
   with accumulation (A > 1) stages 0 and 1 also keep a 2-byte accumulator of the reduced
   gradients (whole at stage 0, a shard at stage 1: docs/engine.md). */
static double formula_states(int stage, double psi, double n, int accum)
{
    switch (stage) {
    case 0: return 16 * psi + (accum > 1 ? 2 * psi : 0);
    case 1: return 4 * psi + 12 * psi / n + (accum > 1 ? 2 * psi / n : 0);
    case 2: return 2 * psi + 14 * psi / n;
    default: return 16 * psi / n;
    }
}

/* Payload bytes per rank per step: the paper's 2 Psi (3 Psi at stage 3) times (N-1)/N, with
   gradients reduced once per micro-step (A of them). */
static double formula_traffic(int stage, double psi, double n, double a)
{
    double f = (n - 1) / n * 2.0; /* 2 bytes per element */
    switch (stage) {
    case 0: return 2 * a * psi * f;
    case 1:
    case 2: return (a + 1) * psi * f;
    default: return 3 * a * psi * f;
    }
}

static double states_of(const zero_engine_memory *m)
{
    return (double)(m->bytes[ZERO_MEM_PARAM] + m->bytes[ZERO_MEM_GRAD] + m->bytes[ZERO_MEM_MASTER] +
                    m->bytes[ZERO_MEM_MOMENT1] + m->bytes[ZERO_MEM_MOMENT2]);
}

/* Runs rank_main on every rank: threads of this process, or (ZERO_MLP_MPI) this process's
   rank of mpirun's, whose losses and param shares then meet on rank 0. */
static zero_result launch(run *R)
{
#ifdef ZERO_MLP_MPI
    zero_mpi_desc md;
    zero_comm *comm = NULL;
    zero_result r;
    int rk, n = R->o->ranks, lens[MAX_RANKS], offs[MAX_RANKS], len, total = 0;
    unsigned char *all = NULL;
    memset(&md, 0, sizeof md);
    r = zero_mpi_create(&md, &comm);
    if (r != ZERO_OK) return r;
    r = rank_main(comm->rank, comm, R);
    zero_comm_destroy(comm);
    if (r != ZERO_OK) return r;
    /* losses: each rank wrote its own column, the others are zero */
    MPI_Allreduce(MPI_IN_PLACE, R->loss, R->o->steps * n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    MPI_Comm_rank(MPI_COMM_WORLD, &rk);
    len = (int)R->share_bytes[rk];
    MPI_Gather(&len, 1, MPI_INT, lens, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (rk == 0) {
        int i;
        for (i = 0; i < n; i++) offs[i] = total, total += lens[i];
        all = (unsigned char *)malloc((size_t)total + 1);
        if (!all) {
            fprintf(stderr, "train_mlp: out of memory: cannot allocate %d bytes for the final "
                            "params\n", total + 1);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Gatherv(R->share[rk], len, MPI_BYTE, all, lens, offs, MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rk == 0) {
        int i;
        free(R->share[0]);
        R->share[0] = all;
        R->share_bytes[0] = (size_t)total;
        for (i = 1; i < n; i++) R->share[i] = NULL, R->share_bytes[i] = 0;
    } else {
        free(R->share[rk]);
        R->share[rk] = NULL;
        R->share_bytes[rk] = 0;
    }
    return ZERO_OK;
#else
    return zero_local_run(R->o->ranks, rank_main, R);
#endif
}

/* The detail of a failed launch, the same whichever rank failed first: the lowest rank
   whose failure is its own (not a comm error caused by a peer that left), else the lowest
   failed rank, else the library's message. */
static const char *run_error(const run *R)
{
    int rk;
    for (rk = 0; rk < MAX_RANKS; rk++)
        if (R->why[rk][0] && R->res[rk] != ZERO_ERROR_COMM) return R->why[rk];
    for (rk = 0; rk < MAX_RANKS; rk++)
        if (R->why[rk][0]) return R->why[rk];
    return zero_last_error();
}

/* The loss of every step on every rank (zeroed), or NULL after saying why. */
static double *alloc_losses(const opts *o)
{
    size_t n = (size_t)o->steps * (size_t)o->ranks;
    double *p;
#ifdef ZERO_MLP_MPI
    if (n > INT_MAX) { /* one MPI_Allreduce of the losses */
        fprintf(stderr, "train_mlp_mpi: --steps %d x %d ranks: more than %d losses\n", o->steps,
                o->ranks, INT_MAX);
        return NULL;
    }
#endif
    p = (double *)calloc(n, sizeof(double));
    if (!p)
        fprintf(stderr, "train_mlp: out of memory: cannot allocate %zu bytes for the losses of "
                        "--steps %d on %d ranks (fewer steps)\n", n * sizeof(double), o->steps, o->ranks);
    return p;
}

static const char *usage_text =
    "usage: train_mlp [--stage 0..3] [--ranks N] [--steps T] [--dtype f16|bf16] [--accum A]\n"
    "                 [--batch B] [--lr LR] [--save DIR] [--save-every K] [--resume DIR]\n"
    "                 [--device-memory SIZE] [--offload-optimizer none|cpu|nvme]\n"
    "                 [--offload-param none|cpu|nvme] [--nvme-path DIR] [--help]\n";

/* A bad argument: what was wrong (naming the option), then the usage line; exit status 2. */
static int bad_arg(const char *opt, const char *val, const char *why)
{
    if (val) fprintf(stderr, "train_mlp: %s %s: %s\n", opt, val, why);
    else fprintf(stderr, "train_mlp: %s: %s\n", opt, why);
    fputs(usage_text, stderr);
    return 2;
}

static int known_option(const char *opt)
{
    static const char *const names[] = {
        "--stage", "--ranks", "--steps", "--dtype", "--accum", "--batch", "--lr", "--save",
        "--save-every", "--resume", "--device-memory", "--offload-optimizer", "--offload-param",
        "--nvme-path"};
    size_t i;
    for (i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(opt, names[i])) return 1;
    return 0;
}

/* A whole decimal number in [lo, hi] (no sign games, no trailing bytes); -1 otherwise. */
static int parse_int(const char *v, long lo, long hi, int *out)
{
    char *end;
    long x;
    errno = 0;
    x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi) return -1;
    *out = (int)x;
    return 0;
}


static int parse_tier(const char *v, zero_offload_device *out)
{
    if (!strcmp(v, "none")) *out = ZERO_OFFLOAD_NONE;
    else if (!strcmp(v, "cpu")) *out = ZERO_OFFLOAD_CPU;
    else if (!strcmp(v, "nvme")) *out = ZERO_OFFLOAD_NVME;
    else return -1;
    return 0;
}

static double final_loss(const run *R, const opts *o)
{
    int rk, s, tail = o->steps >= 10 ? 10 : o->steps;
    double l = 0;
    for (rk = 0; rk < o->ranks; rk++)
        for (s = o->steps - tail; s < o->steps; s++) l += R->loss[(size_t)s * o->ranks + rk];
    return l / ((double)o->ranks * tail);
}

/* The offload demo: one stage under the device budget with the offload settings, and the
   same stage with neither; per-tier bytes, step times and the final losses. */
static int offload_demo(opts *o)
{
    char msg[1024];
    run R[2];
    int i;
    uint64_t sums[2];
    const zero_engine_memory *dm, *hm;
    if (o->stage < 0) o->stage = 3;
    printf("ZeRO-Offload demo: stage %d, %d rank(s), MLP %d-%d-%d-%d (%s), %d steps; device budget "
           "%zu B per rank, --offload-optimizer %s, --offload-param %s\n",
           o->stage, o->ranks, IN, HID, HID, OUT, zero_dtype_name(o->dtype), o->steps,
           o->device_memory, zero_offload_device_name(o->oopt), zero_offload_device_name(o->oparam));
    for (i = 0; i < 2; i++) {
        zero_result r;
        memset(&R[i], 0, sizeof R[i]);
        R[i].o = o;
        R[i].stage = o->stage;
        R[i].plain = i;
        R[i].loss = alloc_losses(o);
        r = R[i].loss ? launch(&R[i]) : ZERO_ERROR_OUT_OF_MEMORY;
        if (r != ZERO_OK) {
            if (R[i].loss)
                fprintf(stderr, "%s run failed: %s: %s\n", i ? "plain" : "budgeted",
                        zero_result_string(r), example_flags_named(run_error(&R[i]), msg, sizeof msg));
            free(R[0].loss);
            if (i) free(R[1].loss);
#ifdef ZERO_MLP_MPI
            MPI_Abort(MPI_COMM_WORLD, 1); /* the peers may be waiting for this rank */
#endif
            return 1;
        }
        { /* the final params, every rank's share in rank order */
            int rk;
            sums[i] = 0xcbf29ce484222325ull;
            for (rk = 0; rk < o->ranks; rk++) {
                sums[i] = fnv1a64(sums[i], R[i].share[rk], R[i].share_bytes[rk]);
                free(R[i].share[rk]);
            }
        }
    }
    for (i = 0; i < 2; i++) {
        dm = &R[i].mem;
        hm = &R[i].host_mem;
        printf("%-9s device %8zu B (params %zu, grads %zu, master+m+v %zu, buffers %zu) peak %zu | "
               "host %8zu B (master+m+v %zu, params %zu, grads %zu, swap %zu) | nvme %zu B "
               "(master+m+v %zu, params %zu) | %.3f ms/step | final loss %.6f\n",
               i ? "plain:" : "offload:", dm->total_bytes, dm->bytes[ZERO_MEM_PARAM], dm->bytes[ZERO_MEM_GRAD],
               dm->bytes[ZERO_MEM_MASTER] + dm->bytes[ZERO_MEM_MOMENT1] + dm->bytes[ZERO_MEM_MOMENT2],
               dm->bytes[ZERO_MEM_BUCKET] + dm->bytes[ZERO_MEM_GATHER] + dm->bytes[ZERO_MEM_SCRATCH],
               dm->peak_total_bytes, hm->total_bytes,
               hm->bytes[ZERO_MEM_MASTER] + hm->bytes[ZERO_MEM_MOMENT1] + hm->bytes[ZERO_MEM_MOMENT2],
               hm->bytes[ZERO_MEM_PARAM], hm->bytes[ZERO_MEM_GRAD], hm->bytes[ZERO_MEM_SCRATCH],
               R[i].nvme_mem.total_bytes,
               R[i].nvme_mem.bytes[ZERO_MEM_MASTER] + R[i].nvme_mem.bytes[ZERO_MEM_MOMENT1] +
                   R[i].nvme_mem.bytes[ZERO_MEM_MOMENT2],
               R[i].nvme_mem.bytes[ZERO_MEM_PARAM], 1e3 * R[i].seconds / o->steps,
               final_loss(&R[i], o));
    }
    i = memcmp(R[0].loss, R[1].loss, sizeof(double) * (size_t)o->steps * o->ranks) == 0 &&
        sums[0] == sums[1];
    printf("%s (params checksum %016llx / %016llx)\n",
           i ? "same losses at every step and the same final params as the plain run"
             : "WARNING: the losses or params differ from the plain run",
           (unsigned long long)sums[0], (unsigned long long)sums[1]);
    free(R[0].loss);
    free(R[1].loss);
#ifdef ZERO_MLP_MPI
    MPI_Finalize();
#endif
    return i ? 0 : 1;
}

int main(int argc, char **argv)
{
    opts o;
    char msg[1024];
    int a, st, first = 0, last = 3, ok = 1, same = 1, fell = 1;
    double ref_loss = -1.0;
    uint64_t checksum = 0;
    memset(&o, 0, sizeof o);
    o.ranks = 4;
    o.steps = 300;
    o.accum = 1;
    o.batch = 16;
    o.dtype = ZERO_F16;
    o.lr = 3e-3;
    o.stage = -1;
    for (a = 1; a < argc; a++) /* --help anywhere: the usage on stdout, exit 0 */
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
    for (a = 1; a < argc; a += 2) { /* every other option takes a value */
        const char *opt = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        int bad = 0;
        if (!known_option(opt)) return bad_arg(opt, NULL, "unknown option");
        if (!v) return bad_arg(opt, NULL, "needs a value");
        if (!strcmp(opt, "--stage")) bad = parse_int(v, 0, 3, &o.stage);
        else if (!strcmp(opt, "--ranks")) bad = parse_int(v, 1, MAX_RANKS, &o.ranks);
        else if (!strcmp(opt, "--steps")) bad = parse_int(v, 1, INT_MAX, &o.steps);
        else if (!strcmp(opt, "--accum")) bad = parse_int(v, 1, INT_MAX, &o.accum);
        else if (!strcmp(opt, "--batch")) bad = parse_int(v, 1, MAX_BATCH, &o.batch);
        else if (!strcmp(opt, "--save-every")) bad = parse_int(v, 0, INT_MAX, &o.save_every);
        else if (!strcmp(opt, "--lr")) {
            char *end;
            o.lr = strtod(v, &end);
            bad = end == v || *end || !(o.lr >= 0 && o.lr < 1e30) ? -1 : 0;
        } else if (!strcmp(opt, "--device-memory")) {
            o.offload_demo = 1;
            bad = (o.device_memory = example_parse_size(v)) == 0 ? -1 : 0;
        } else if (!strcmp(opt, "--offload-optimizer") || !strcmp(opt, "--offload-param")) {
            o.offload_demo = 1;
            bad = parse_tier(v, opt[10] == 'o' ? &o.oopt : &o.oparam);
        } else if (!strcmp(opt, "--nvme-path")) {
            o.offload_demo = 1;
            o.nvme_path = v;
        } else if (!strcmp(opt, "--save")) o.save_dir = v;
        else if (!strcmp(opt, "--resume")) o.resume_dir = v;
        else if (!strcmp(opt, "--dtype")) {
            if (!strcmp(v, "f16")) o.dtype = ZERO_F16;
            else if (!strcmp(v, "bf16")) o.dtype = ZERO_BF16;
            else bad = -1;
        }
        if (bad) {
            char why[96];
            if (!strcmp(opt, "--ranks")) snprintf(why, sizeof why, "not a number in 1..%d", MAX_RANKS);
            else if (!strcmp(opt, "--batch")) snprintf(why, sizeof why, "not a number in 1..%d", MAX_BATCH);
            else if (!strcmp(opt, "--stage")) snprintf(why, sizeof why, "not a stage in 0..3");
            else if (!strcmp(opt, "--save-every")) snprintf(why, sizeof why, "not a number >= 0");
            else if (!strcmp(opt, "--lr")) snprintf(why, sizeof why, "not a learning rate >= 0");
            else if (!strcmp(opt, "--device-memory")) snprintf(why, sizeof why, "not a size (4MB, 64MiB, 300KiB or bytes)");
            else if (!strcmp(opt, "--dtype")) snprintf(why, sizeof why, "not f16 or bf16");
            else if (opt[2] == 'o') snprintf(why, sizeof why, "not none, cpu or nvme");
            else snprintf(why, sizeof why, "not a number >= 1");
            return bad_arg(opt, v, why);
        }
    }
    {
        char why[512];
        if (example_nvme_dir(o.nvme_path, why, sizeof why) != 0) {
            fprintf(stderr, "train_mlp: %s\n", why);
            return 2;
        }
    }
    if (o.stage >= 0) first = last = o.stage;
#ifdef ZERO_MLP_MPI
    {
        int world = 0, me = 0, given = 0;
        for (a = 1; a + 1 < argc; a += 2) given |= !strcmp(argv[a], "--ranks");
        MPI_Init(&argc, &argv);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        MPI_Comm_rank(MPI_COMM_WORLD, &me);
        if ((given && o.ranks != world) || world > MAX_RANKS) {
            if (me == 0) fprintf(stderr, "train_mlp_mpi: --ranks %d but mpirun started %d (max %d)\n", o.ranks, world, MAX_RANKS);
            MPI_Finalize();
            return 2;
        }
        o.ranks = world;
        if (me != 0 && !freopen("/dev/null", "w", stdout)) return 1; /* rank 0 prints */
    }
#endif
    teacher_init();
    if (o.offload_demo) return offload_demo(&o);
#ifdef ZERO_MLP_MPI
    printf("ZeRO on %d MPI processes (mpirun, zero_mpi.h comm, host device): MLP %d-%d-%d-%d, "
#else
    printf("ZeRO on %d simulated ranks (threads, local comm, host device): MLP %d-%d-%d-%d, "
#endif
           "%s params, %d steps of %d micro-step(s) x %d samples per rank\n",
           o.ranks, IN, HID, HID, OUT, zero_dtype_name(o.dtype), o.steps, o.accum, o.batch);
    printf("%-5s | %-9s %-9s | %-23s | %-23s | %-8s\n", "", "loss", "", "model states B/rank",
           "comm B/rank/step", "time");
    printf("%-5s | %-9s %-9s | %-11s %-11s | %-11s %-11s | %-8s\n", "stage", "first", "final",
           "measured", "formula", "measured", "formula", "ms/step");
    for (st = first; st <= last; st++) {
        run R;
        zero_result r;
        double l0 = 0, l1 = 0, states, ft, meas_t;
        int rk, s, tail = o.steps >= 10 ? 10 : o.steps;
        memset(&R, 0, sizeof R);
        R.o = &o;
        R.stage = st;
        R.loss = alloc_losses(&o);
        r = R.loss ? launch(&R) : ZERO_ERROR_OUT_OF_MEMORY;
        if (r != ZERO_OK) {
            if (R.loss)
                fprintf(stderr, "stage %d failed: %s: %s\n", st, zero_result_string(r),
                        example_flags_named(run_error(&R), msg, sizeof msg));
            free(R.loss);
#ifdef ZERO_MLP_MPI
            MPI_Abort(MPI_COMM_WORLD, 1); /* the peers may be waiting for this rank */
#endif
            return 1;
        }
        if (R.first_step >= o.steps) {
            fprintf(stderr, "stage %d: the checkpoint is at step %d, --steps is %d\n", st,
                    R.first_step, o.steps);
            free(R.loss);
            return 1;
        }
        if (o.steps - tail < R.first_step) tail = o.steps - R.first_step;
        { /* the checksum of the shares in rank order; every stage must give the same */
            uint64_t h = 0xcbf29ce484222325ull;
            for (rk = 0; rk < o.ranks; rk++) {
                h = fnv1a64(h, R.share[rk], R.share_bytes[rk]);
                free(R.share[rk]);
            }
            if (st != first && h != checksum) ok = 0;
            checksum = h;
        }
        for (rk = 0; rk < o.ranks; rk++) {
            l0 += R.loss[(size_t)R.first_step * o.ranks + rk];
            for (s = o.steps - tail; s < o.steps; s++) l1 += R.loss[(size_t)s * o.ranks + rk];
        }
        l0 /= o.ranks;
        l1 /= (double)o.ranks * tail;
        states = states_of(&R.mem);
        ft = formula_states(st, (double)R.psi, o.ranks, o.accum);
        meas_t = zero_traffic_payload_numel(&R.traffic) > 0
                     ? R.traffic.bytes[ZERO_COLL_ALL_GATHER] +
                           R.traffic.bytes[ZERO_COLL_REDUCE_SCATTER] +
                           R.traffic.bytes[ZERO_COLL_ALL_REDUCE] + R.traffic.bytes[ZERO_COLL_BROADCAST]
                     : 0.0;
        printf("%-5d | %-9.5f %-9.5f | %-11.0f %-11.0f | %-11.0f %-11.0f | %-8.3f\n", st, l0, l1,
               states, ft, meas_t, formula_traffic(st, (double)R.psi, o.ranks, o.accum),
               1e3 * R.seconds / o.steps);
        if (ref_loss < 0) ref_loss = l1;
        else if (l1 != ref_loss) ok = same = 0;
        if (!(l1 < 0.5 * l0) && R.first_step == 0) ok = fell = 0;
        free(R.loss);
        if (st == last)
            printf("Psi = %zu parameters (plan, padded); per rank also: buckets %zu B, gather "
                   "buffers %zu B, scratch %zu B (last stage); %d step(s) skipped for inf/NaN, "
                   "final loss scale %g\n",
                   R.psi, R.mem.bytes[ZERO_MEM_BUCKET], R.mem.bytes[ZERO_MEM_GATHER],
                   R.mem.bytes[ZERO_MEM_SCRATCH], R.skipped, (double)R.final_scale);
    }
    /* say which check failed: the stages disagree, or the loss did not fall (too few steps) */
    if (first != last)
        printf("%s\n", ok     ? "stages 0-3: identical losses (bit-identical parameters); the loss fell"
                        : same ? "stages 0-3: identical losses (bit-identical parameters)"
                               : "WARNING: the final losses differ between stages");
    if (!fell)
        printf("WARNING: the loss did not fall to half its first value in %d step(s) (more "
               "steps, e.g. the default 300, let it fall)\n", o.steps);
    printf("params checksum: %016llx\n", (unsigned long long)checksum);
#ifdef ZERO_MLP_MPI
    MPI_Finalize();
#endif
    return ok ? 0 : 1;
}
