/* mlp_common.h - what examples/train_mlp.c (CPU) and examples/train_gpu.cu (GPU) share: the
   model's shape, the deterministic random streams, the fixed teacher network and each
   rank's batches, the engine descriptor, the tensors (one group per layer, biases excluded
   from weight decay) and their initial values. Plain C, also compiled as C++ by nvcc;
   include it after zero.h (with ZERO_IMPLEMENTATION where the program defines it). */
#ifndef MLP_COMMON_H
#define MLP_COMMON_H
#include "zero.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define IN 32         /* input width                                  */
#define HID 128       /* hidden width (train_gpu: the --hidden default) */
#define OUT 8         /* output width                                 */
#define NL 3          /* layers: IN -> HID -> HID -> OUT, tanh between */
#define TEACHER_H 64  /* the teacher's hidden width                   */

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

/* ---- the teacher: IN -> TEACHER_H (tanh) -> OUT, fixed weights ---------------------------- */

static float teacher_w1[TEACHER_H][IN], teacher_w2[OUT][TEACHER_H];

static void teacher_init(void)
{
    uint64_t s = 12345;
    int i, j;
    for (i = 0; i < TEACHER_H; i++)
        for (j = 0; j < IN; j++) teacher_w1[i][j] = urand(&s) * 0.6f;
    for (i = 0; i < OUT; i++)
        for (j = 0; j < TEACHER_H; j++) teacher_w2[i][j] = urand(&s) * 0.4f;
}

static void teacher(const float *x, float *y)
{
    float h[TEACHER_H];
    int i, j;
    for (i = 0; i < TEACHER_H; i++) {
        float a = 0;
        for (j = 0; j < IN; j++) a += teacher_w1[i][j] * x[j];
        h[i] = tanhf(a);
    }
    for (i = 0; i < OUT; i++) {
        float a = 0;
        for (j = 0; j < TEACHER_H; j++) a += teacher_w2[i][j] * h[j];
        y[i] = a;
    }
}

/* Rank 'rank''s batch of micro-step 'micro' of step 'step': B fresh inputs x (B x IN) and
   the teacher's outputs t (B x OUT). teacher_init() first. */
static void mlp_batch(int rank, int step, int micro, int B, float *x, float *t)
{
    uint64_t sd = mix64(((uint64_t)step * 1000003u + (uint64_t)micro) * 4099u + (uint64_t)rank);
    int i, b;
    for (i = 0; i < B * IN; i++) x[i] = urand(&sd) * 1.7f;
    for (b = 0; b < B; b++) teacher(x + b * IN, t + b * OUT);
}

/* ---- the model in the engine ------------------------------------------------------------- */

/* AdamW with weight decay 0.01, gradient clipping at 1; device and comm left to the caller. */
static void mlp_engine_desc(zero_engine_desc *d, int stage, zero_dtype dtype, int accum, double lr)
{
    memset(d, 0, sizeof *d);
    d->stage = stage;
    d->param_dtype = dtype;
    d->accum_steps = accum;
    d->adam.lr = lr;
    d->adam.weight_decay = 0.01;
    d->clip_norm = 1.0f;
}

/* Layer l (dims[l] -> dims[l + 1]) is group l: "layerL.weight" (dims[l+1] x dims[l], row
   major) and "layerL.bias" (no weight decay). Their offsets in the group buffer go to
   woff/boff after commit (mlp_offsets). */
static zero_result mlp_add_tensors(zero_engine *e, const int *dims, int *wid, int *bid)
{
    int l;
    for (l = 0; l < NL; l++) {
        char name[32];
        zero_result r;
        uint64_t shape[2];
        snprintf(name, sizeof name, "layer%d.weight", l);
        shape[0] = (uint64_t)dims[l + 1]; /* [out, in], row-major: PyTorch's nn.Linear layout */
        shape[1] = (uint64_t)dims[l];
        r = zero_engine_add_tensor_shape(e, name, 2, shape, l, 0, &wid[l]);
        if (r != ZERO_OK) return r;
        snprintf(name, sizeof name, "layer%d.bias", l);
        r = zero_engine_add_tensor(e, name, (size_t)dims[l + 1], l, ZERO_TENSOR_NO_DECAY, &bid[l]);
        if (r != ZERO_OK) return r;
    }
    return ZERO_OK;
}

static zero_result mlp_offsets(const zero_plan *plan, const int *wid, const int *bid, size_t *woff, size_t *boff)
{
    int l;
    for (l = 0; l < NL; l++) {
        zero_tensor_info ti;
        zero_result r = zero_plan_tensor(plan, wid[l], &ti);
        if (r != ZERO_OK) return r;
        woff[l] = ti.offset;
        r = zero_plan_tensor(plan, bid[l], &ti);
        if (r != ZERO_OK) return r;
        boff[l] = ti.offset;
    }
    return ZERO_OK;
}

/* Initial values, the same on every rank (seeded): weights uniform in +-1/sqrt(fan-in),
   biases zero. init holds at least the largest weight (dims[l+1] x dims[l]). */
static zero_result mlp_set_init(zero_engine *e, const int *dims, const int *wid, const int *bid, float *init)
{
    int l, i;
    for (l = 0; l < NL; l++) {
        uint64_t sd = 777 + (uint64_t)l;
        float a = 1.0f / sqrtf((float)dims[l]);
        zero_result r;
        for (i = 0; i < dims[l + 1] * dims[l]; i++) init[i] = urand(&sd) * a;
        r = zero_engine_set_tensor(e, wid[l], init);
        if (r != ZERO_OK) return r;
        for (i = 0; i < dims[l + 1]; i++) init[i] = 0.0f;
        r = zero_engine_set_tensor(e, bid[l], init);
        if (r != ZERO_OK) return r;
    }
    return ZERO_OK;
}
#endif
