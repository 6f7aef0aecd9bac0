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
                       [--batch B] [--lr LR] */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define IN 32
#define HID 128
#define OUT 8
#define NL 3
#define MAX_RANKS 64

static const int dims[NL + 1] = {IN, HID, HID, OUT};

typedef struct opts {
    int stage, ranks, steps, accum, batch;
    zero_dtype dtype;
    float lr;
} opts;

typedef struct run {
    const opts *o;
    int stage;
    double *loss;           /* [steps][ranks]: each rank's mean loss of its batches */
    int skipped;            /* steps skipped for inf/NaN (rank 0's count)            */
    double seconds;         /* training loop, rank 0                                 */
    zero_engine_memory mem; /* rank 0                                                */
    zero_traffic traffic;   /* rank 0, last step                                     */
    size_t psi;             /* the plan's padded total                               */
    float final_scale;
} run;

/* ---- deterministic randomness ------------------------------------------------------------ */

static uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) from a counter */
static float urand(uint64_t *s)
{
    *s = mix64(*s);
    return (float)((double)(*s >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/* The teacher: IN -> 64 (tanh) -> OUT, fixed weights. */
static float teacher_w1[64][IN], teacher_w2[OUT][64];

static void teacher_init(void)
{
    uint64_t s = 12345;
    int i, j;
    for (i = 0; i < 64; i++)
        for (j = 0; j < IN; j++) teacher_w1[i][j] = urand(&s) * 0.6f;
    for (i = 0; i < OUT; i++)
        for (j = 0; j < 64; j++) teacher_w2[i][j] = urand(&s) * 0.4f;
}

static void teacher(const float *x, float *y)
{
    float h[64];
    int i, j;
    for (i = 0; i < 64; i++) {
        float a = 0;
        for (j = 0; j < IN; j++) a += teacher_w1[i][j] * x[j];
        h[i] = tanhf(a);
    }
    for (i = 0; i < OUT; i++) {
        float a = 0;
        for (j = 0; j < 64; j++) a += teacher_w2[i][j] * h[j];
        y[i] = a;
    }
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

    CHECK(zero_host_device_create(NULL, &dev));
    memset(&d, 0, sizeof d);
    d.stage = R->stage;
    d.param_dtype = o->dtype;
    d.accum_steps = o->accum;
    d.adam.lr = o->lr;
    d.adam.weight_decay = 0.01f;
    d.clip_norm = 1.0f;
    d.device = dev;
    d.comm = comm;
    CHECK(zero_engine_create(&d, &e));
    for (l = 0; l < NL; l++) {
        char name[32];
        snprintf(name, sizeof name, "layer%d.weight", l);
        CHECK(zero_engine_add_tensor(e, name, (size_t)dims[l + 1] * dims[l], l, 0, &wid[l]));
        snprintf(name, sizeof name, "layer%d.bias", l);
        CHECK(zero_engine_add_tensor(e, name, (size_t)dims[l + 1], l, ZERO_TENSOR_NO_DECAY, &bid[l]));
    }
    CHECK(zero_engine_commit(e));
    plan = zero_engine_plan(e);
    for (l = 0; l < NL; l++) {
        zero_tensor_info ti;
        zero_plan_tensor(plan, wid[l], &ti);
        woff[l] = ti.offset;
        zero_plan_tensor(plan, bid[l], &ti);
        boff[l] = ti.offset;
    }
    /* buffers */
    for (l = 0; l <= NL; l++) {
        act[l] = (float *)malloc(sizeof(float) * (size_t)B * dims[l]);
        dact[l] = (float *)malloc(sizeof(float) * (size_t)B * dims[l]);
        if (!act[l] || !dact[l]) {
            r = ZERO_ERROR_OUT_OF_MEMORY;
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
        r = ZERO_ERROR_OUT_OF_MEMORY;
        goto done;
    }
    /* Initial values: the same on every rank (seeded), set through the engine. */
    for (l = 0; l < NL; l++) {
        uint64_t sd = 777 + (uint64_t)l;
        float a = 1.0f / sqrtf((float)dims[l]);
        for (i = 0; i < dims[l + 1] * dims[l]; i++) init[i] = urand(&sd) * a;
        CHECK(zero_engine_set_tensor(e, wid[l], init));
        for (i = 0; i < dims[l + 1]; i++) init[i] = 0.0f;
        CHECK(zero_engine_set_tensor(e, bid[l], init));
    }

    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (s = 0; s < o->steps; s++) {
        zero_step_info info;
        float scale = zero_engine_loss_scale(e);
        double loss_sum = 0.0;
        for (k = 0; k < o->accum; k++) {
            uint64_t sd = mix64(((uint64_t)s * 1000003u + (uint64_t)k) * 4099u + (uint64_t)rank);
            double loss = 0.0;
            float gscale;
            for (i = 0; i < B * IN; i++) act[0][i] = urand(&sd) * 1.7f;
            for (b = 0; b < B; b++) teacher(act[0] + b * IN, tgt + b * OUT);
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
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rank == 0) {
        R->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        zero_engine_memory_usage(e, &R->mem);
        zero_engine_traffic(e, &R->traffic, NULL);
        R->psi = zero_plan_total_numel(plan);
        R->final_scale = zero_engine_loss_scale(e);
    }
done:
    if (r != ZERO_OK) fprintf(stderr, "rank %d: %s: %s\n", rank, zero_result_string(r), zero_last_error());
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

static void usage(void)
{
    fprintf(stderr, "usage: train_mlp [--stage 0..3] [--ranks N] [--steps T] [--dtype f16|bf16] "
                    "[--accum A] [--batch B] [--lr LR]\n");
}

int main(int argc, char **argv)
{
    opts o;
    int a, st, first = 0, last = 3, ok = 1;
    double ref_loss = -1.0;
    memset(&o, 0, sizeof o);
    o.ranks = 4;
    o.steps = 300;
    o.accum = 1;
    o.batch = 16;
    o.dtype = ZERO_F16;
    o.lr = 3e-3f;
    o.stage = -1;
    for (a = 1; a < argc; a++) {
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!v) {
            usage();
            return 2;
        }
        if (!strcmp(argv[a], "--stage")) o.stage = atoi(v);
        else if (!strcmp(argv[a], "--ranks")) o.ranks = atoi(v);
        else if (!strcmp(argv[a], "--steps")) o.steps = atoi(v);
        else if (!strcmp(argv[a], "--accum")) o.accum = atoi(v);
        else if (!strcmp(argv[a], "--batch")) o.batch = atoi(v);
        else if (!strcmp(argv[a], "--lr")) o.lr = (float)atof(v);
        else if (!strcmp(argv[a], "--dtype")) {
            if (!strcmp(v, "f16")) o.dtype = ZERO_F16;
            else if (!strcmp(v, "bf16")) o.dtype = ZERO_BF16;
            else {
                usage();
                return 2;
            }
        } else {
            usage();
            return 2;
        }
        a++;
    }
    if (o.stage > 3 || o.ranks < 1 || o.ranks > MAX_RANKS || o.steps < 1 || o.accum < 1 ||
        o.batch < 1) {
        usage();
        return 2;
    }
    if (o.stage >= 0) first = last = o.stage;
    teacher_init();
    printf("ZeRO on %d simulated ranks (threads, local comm, host device): MLP %d-%d-%d-%d, "
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
        R.loss = (double *)calloc((size_t)o.steps * o.ranks, sizeof(double));
        r = zero_local_run(o.ranks, rank_main, &R);
        if (r != ZERO_OK) {
            fprintf(stderr, "stage %d failed: %s: %s\n", st, zero_result_string(r), zero_last_error());
            free(R.loss);
            return 1;
        }
        for (rk = 0; rk < o.ranks; rk++) {
            l0 += R.loss[rk];
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
        else if (l1 != ref_loss) ok = 0;
        if (!(l1 < 0.5 * l0)) ok = 0;
        free(R.loss);
        if (st == last)
            printf("Psi = %zu parameters (plan, padded); per rank also: buckets %zu B, gather "
                   "buffers %zu B, scratch %zu B (last stage); %d step(s) skipped for inf/NaN, "
                   "final loss scale %g\n",
                   R.psi, R.mem.bytes[ZERO_MEM_BUCKET], R.mem.bytes[ZERO_MEM_GATHER],
                   R.mem.bytes[ZERO_MEM_SCRATCH], R.skipped, (double)R.final_scale);
    }
    if (first != last)
        printf("%s\n", ok ? "stages 0-3: identical losses (bit-identical parameters); the loss fell"
                          : "WARNING: losses differ between stages or did not fall");
    return ok ? 0 : 1;
}
