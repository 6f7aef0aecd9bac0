/* train_gpt2.c - GPT-2 trained with ZeRO stages 0-3 in plain C, on N ranks.

   The model is Hugging Face's GPT2LMHeadModel, layer for layer: token and learned position
   embeddings, L pre-LayerNorm blocks (LayerNorm eps 1e-5; causal self-attention with a fused
   qkv projection c_attn; an MLP of 4C with GELU's tanh approximation, gelu_new), a final
   LayerNorm and an LM head tied to the token embedding wte; dropout off by default (--dropout
   P: Hugging Face's three, with masks from a counter-based hash, below). Weights are
   registered under Hugging Face's names and shapes (Conv1D layout [in, out]), so a
   checkpoint exported with `zero-ckpt export` loads into GPT2LMHeadModel as it is, and
   --init FILE.safetensors starts from a Hugging Face file.

   Each rank is a thread with its own host device and a local comm (zero_local_run); built
   with -DZERO_GPT2_MPI by mpicc (make mpi: build/train_gpt2_mpi) the ranks are mpirun's
   processes. Groups: 0 = the embeddings (wte, wpe) and the final norm, 1 + l = block l.
   Forward and backward are plain fp32 C loops that read the params the engine gathers
   (fp32, or bf16/fp16 converted) and write the gradients of the rank's mean loss (times the
   loss scale) into the buffers the engine hands out. The tied wte: see docs/gpt2.md.

   With no --stage it is the demo: stages 0, 1, 2 and 3 in turn, one table (loss, model
   states and traffic per rank measured and by formula, ms per step), then a text sample.
   With --stage S one run, one line per step. build/train_gpt2 --help lists the flags;
   docs/gpt2.md explains them. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "examples/gpt2_common.h"
#include "examples/gpt2_gemm.h"

#include <errno.h> /* --log */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef ZERO_GPT2_MPI
#define ZERO_MPI_IMPLEMENTATION
#include "zero_mpi.h"
#endif

/* ======================================================================================
   The model's compute: fp32, row-major, BT = B * T rows of activations.
   ====================================================================================== */

/* Dropout in one training micro-step (--dropout P; docs/gpt2.md, "Dropout"): where Hugging
   Face's GPT-2 has it, on the sum of the embeddings, on the attention probabilities and on
   each residual branch (attn.c_proj's and mlp.c_proj's outputs) before the residual add.
   Each mask element is gpt2_dropout_keep of its stream (seed, step, micro-step, layer, site)
   and its index in the global batch, so ranks and stages draw the same masks whatever slice
   they hold. The backward regenerates the masks from the same counters (nothing is stored):
   the hash costs a few integer operations per element, less than keeping a second copy of
   every block's attention probabilities. on = 0 (P = 0, and every forward without a backward:
   validation, sampling) leaves every code path as it is without dropout. */
typedef struct drop_ctx {
    int on;
    uint32_t thr;              /* gpt2_dropout_threshold(P)                         */
    float scale;               /* float(1 / (1 - P)), torch's inverted dropout       */
    uint64_t seed, step, micro;
    uint64_t seq0;             /* the global batch's index of this rank's first sequence */
} drop_ctx;

static uint64_t drop_key(const drop_ctx *d, int layer, int site)
{
    return gpt2_dropout_key(d->seed, d->step, d->micro, (uint64_t)layer, (uint64_t)site);
}

/* The products are gemm_acc's (examples/gpt2_gemm.h): each output one chain of fused
   multiply-adds in k order, whatever the kernel; a transposed operand is read in place. */

/* out[i][o] = bias[o] + sum_c x[i][c] w[c][o]  (Conv1D: w is [IC, OC]). */
static void matmul_forward(float *out, const float *x, const float *w, const float *bias, int rows, int IC,
                           int OC)
{
    int i, o;
    for (i = 0; i < rows; i++)
        for (o = 0; o < OC; o++) out[(size_t)i * OC + o] = bias ? bias[o] : 0.0f;
    gemm_acc(out, OC, x, IC, 1, w, OC, 1, rows, OC, IC);
}

/* Backward of matmul_forward: dx += dout w^T (w read transposed in place), dw += x^T dout,
   dbias += column sums of dout. */
static void matmul_backward(float *dx, float *dw, float *dbias, const float *dout, const float *x,
                            const float *w, int rows, int IC, int OC)
{
    int i, o;
    if (dx) gemm_acc(dx, IC, dout, OC, 1, w, 1, OC, rows, IC, OC);
    gemm_acc(dw, OC, x, 1, IC, dout, OC, 1, IC, OC, rows);
    if (dbias)
        for (i = 0; i < rows; i++)
            for (o = 0; o < OC; o++) dbias[o] += dout[(size_t)i * OC + o];
}

/* LayerNorm over C with biased variance, eps 1e-5; mean and 1/std kept for the backward. */
static void layernorm_forward(float *out, float *mean, float *rstd, const float *x, const float *w,
                              const float *b, int rows, int C)
{
    int i, c;
    for (i = 0; i < rows; i++) {
        const float *xi = x + (size_t)i * C;
        float m = 0.0f, v = 0.0f, s;
        for (c = 0; c < C; c++) m += xi[c];
        m /= (float)C;
        for (c = 0; c < C; c++) v += (xi[c] - m) * (xi[c] - m);
        v /= (float)C;
        s = 1.0f / sqrtf(v + GPT2_LN_EPS);
        for (c = 0; c < C; c++) out[(size_t)i * C + c] = (xi[c] - m) * s * w[c] + b[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

/* dx += the LayerNorm's input gradient; dw, db += its parameter gradients. */
static void layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                               const float *w, const float *mean, const float *rstd, int rows, int C)
{
    int i, c;
    for (i = 0; i < rows; i++) {
        const float *g = dout + (size_t)i * C, *xi = x + (size_t)i * C;
        float m = mean[i], s = rstd[i], dmean = 0.0f, dnx = 0.0f;
        for (c = 0; c < C; c++) {
            float nx = (xi[c] - m) * s, dn = g[c] * w[c];
            dmean += dn;
            dnx += dn * nx;
        }
        dmean /= (float)C;
        dnx /= (float)C;
        for (c = 0; c < C; c++) {
            float nx = (xi[c] - m) * s, dn = g[c] * w[c];
            db[c] += g[c];
            dw[c] += nx * g[c];
            dx[(size_t)i * C + c] += (dn - dmean - nx * dnx) * s;
        }
    }
}

/* Causal self-attention of H heads over qkv [BT, 3C] (q | k | v, head h on channels
   h*hs .. h*hs+hs-1 of each): att [B, H, T, T] keeps the softmax (zero above the
   diagonal), out [BT, C] the heads side by side. Per sequence and head, three products of
   gemm_acc: the scores q k^T (all T x T of them, the upper triangle is then masked), the
   softmax by rows, y = att v (the zeros above the diagonal add exact zeros). */
static void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H,
                              const drop_ctx *d, int layer, float *scratch)
{
    int hs = C / H, b, h, t, t2;
    float scale = 1.0f / sqrtf((float)hs);
    uint64_t key = d->on ? drop_key(d, layer, GPT2_DROP_ATTN) : 0;
    for (b = 0; b < B; b++)
        for (h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * T * 3 * C + h * hs, *k = q + C, *v = q + 2 * C;
            float *ah = att + ((size_t)b * H + h) * T * T, *y = out + (size_t)b * T * C + h * hs;
            memset(ah, 0, sizeof(float) * (size_t)T * T);
            gemm_acc(ah, T, q, 3 * C, 1, k, 1, 3 * C, T, T, hs); /* q k^T: k read transposed */
            for (t = 0; t < T; t++) {
                float *a = ah + (size_t)t * T, mx = -INFINITY, sum = 0.0f;
                for (t2 = 0; t2 <= t; t2++) {
                    a[t2] *= scale;
                    mx = a[t2] > mx ? a[t2] : mx;
                }
                for (t2 = 0; t2 <= t; t2++) a[t2] -= mx;
                gemm_expf(a, a, (size_t)t + 1);
                for (t2 = 0; t2 <= t; t2++) sum += a[t2];
                for (t2 = 0; t2 <= t; t2++) a[t2] /= sum;
                for (t2 = t + 1; t2 < T; t2++) a[t2] = 0.0f;
                memset(y + (size_t)t * C, 0, sizeof(float) * (size_t)hs);
            }
            if (d->on) { /* y = dropout(att) v; att keeps the softmax for the backward */
                gpt2_dropout_copy(scratch, ah, (size_t)T * T, key, (((d->seq0 + (uint64_t)b) * H + h) * T) * T,
                                  d->thr, d->scale);
                gemm_acc(y, C, scratch, T, 1, v, 3 * C, 1, T, hs, T);
            } else {
                gemm_acc(y, C, ah, T, 1, v, 3 * C, 1, T, hs, T);
            }
        }
}

/* dqkv += the attention's gradient (datt: T x T floats of scratch). With dropout the mask of
   the forward is drawn again: dv takes the dropped probabilities, and the probabilities'
   gradient is masked before the softmax's backward. */
static void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                               int B, int T, int C, int H, const drop_ctx *d, int layer)
{
    int hs = C / H, b, h, t, t2;
    float scale = 1.0f / sqrtf((float)hs);
    uint64_t key = d->on ? drop_key(d, layer, GPT2_DROP_ATTN) : 0;
    for (b = 0; b < B; b++)
        for (h = 0; h < H; h++) {
            const float *q = qkv + (size_t)b * T * 3 * C + h * hs, *k = q + C, *v = q + 2 * C;
            const float *ah = att + ((size_t)b * H + h) * T * T, *g = dout + (size_t)b * T * C + h * hs;
            float *dq = dqkv + (size_t)b * T * 3 * C + h * hs, *dk = dq + C, *dv = dq + 2 * C;
            uint64_t i0 = (((d->seq0 + (uint64_t)b) * H + h) * T) * T;
            if (d->on) { /* dv += dropout(att)^T dy */
                gpt2_dropout_copy(datt, ah, (size_t)T * T, key, i0, d->thr, d->scale);
                gemm_acc(dv, 3 * C, datt, 1, T, g, C, 1, T, hs, T);
            } else {
                gemm_acc(dv, 3 * C, ah, 1, T, g, C, 1, T, hs, T); /* dv += att^T dy */
            }
            memset(datt, 0, sizeof(float) * (size_t)T * T);
            gemm_acc(datt, T, g, C, 1, v, 1, 3 * C, T, T, hs); /* datt = dy v^T */
            if (d->on) gpt2_dropout_copy(datt, datt, (size_t)T * T, key, i0, d->thr, d->scale);
            for (t = 0; t < T; t++) {                         /* through the softmax */
                const float *a = ah + (size_t)t * T;
                float *d = datt + (size_t)t * T, dot = 0.0f;
                for (t2 = 0; t2 <= t; t2++) dot += a[t2] * d[t2];
                for (t2 = 0; t2 <= t; t2++) d[t2] = a[t2] * (d[t2] - dot) * scale;
                for (t2 = t + 1; t2 < T; t2++) d[t2] = 0.0f;
            }
            gemm_acc(dq, 3 * C, datt, T, 1, k, 3 * C, 1, T, hs, T); /* dq += dpre k   */
            gemm_acc(dk, 3 * C, datt, 1, T, q, 3 * C, 1, T, hs, T); /* dk += dpre^T q */
        }
}

/* gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
static void gelu_forward(float *out, float *tanh_out, const float *x, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        float v = x[i];
        tanh_out[i] = GELU_K * (v + 0.044715f * v * v * v);
    }
    gemm_tanhf(tanh_out, tanh_out, n); /* kept for the backward: tanh is the costliest part */
    for (i = 0; i < n; i++) out[i] = 0.5f * x[i] * (1.0f + tanh_out[i]);
}

static void gelu_backward(float *dx, const float *x, const float *tanh_x, const float *dout, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++) {
        float v = x[i], th = tanh_x[i];
        float d = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * 0.044715f * v * v);
        dx[i] = d * dout[i];
    }
}

/* ---- one block --------------------------------------------------------------------------- */

/* What a block keeps from its forward for its backward. */
typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2;
    float *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fch_tanh, *res3; /* res3: the block's output */
} block_acts;

/* w[k]: the block's tensor k (GPT2_LN1_W ...) in fp32; block 'layer', dropout d (scratch:
   T x T floats for the attention's dropped probabilities). */
static void block_forward(const gpt2_config *c, int B, int T, float *const *w, block_acts *a, const float *in,
                          const drop_ctx *d, int layer, float *scratch)
{
    int C = c->channels, BT = B * T, i;
    uint64_t i0 = d->seq0 * (uint64_t)T * (uint64_t)C; /* [B, T, C]'s first element in the global batch */
    layernorm_forward(a->ln1, a->ln1_mean, a->ln1_rstd, in, w[GPT2_LN1_W], w[GPT2_LN1_B], BT, C);
    matmul_forward(a->qkv, a->ln1, w[GPT2_QKV_W], w[GPT2_QKV_B], BT, C, 3 * C);
    attention_forward(a->atty, a->att, a->qkv, B, T, C, c->heads, d, layer, scratch);
    matmul_forward(a->res2, a->atty, w[GPT2_ATTPROJ_W], w[GPT2_ATTPROJ_B], BT, C, C);
    if (d->on)
        gpt2_dropout_copy(a->res2, a->res2, (size_t)BT * C, drop_key(d, layer, GPT2_DROP_ATTN_RESID), i0, d->thr, d->scale);
    for (i = 0; i < BT * C; i++) a->res2[i] += in[i];
    layernorm_forward(a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w[GPT2_LN2_W], w[GPT2_LN2_B], BT, C);
    matmul_forward(a->fch, a->ln2, w[GPT2_FC_W], w[GPT2_FC_B], BT, C, 4 * C);
    gelu_forward(a->fch_gelu, a->fch_tanh, a->fch, (size_t)BT * 4 * C);
    matmul_forward(a->res3, a->fch_gelu, w[GPT2_FCPROJ_W], w[GPT2_FCPROJ_B], BT, 4 * C, C);
    if (d->on)
        gpt2_dropout_copy(a->res3, a->res3, (size_t)BT * C, drop_key(d, layer, GPT2_DROP_MLP_RESID), i0, d->thr, d->scale);
    for (i = 0; i < BT * C; i++) a->res3[i] += a->res2[i];
}

/* Scratch of the backward, per rank. */
typedef struct bwd_scratch {
    float *d4a, *d4b; /* [BT, 4C] */
    float *dqkv;      /* [BT, 3C] */
    float *dc;        /* [BT, C]  */
    float *datt;      /* [T, T]   */
} bwd_scratch;

/* dres: in, the gradient of the block's output; out, of its input. dw[k] += the gradient of
   tensor k. Dropout d as in the forward of block 'layer': a residual branch's gradient is
   dres times the branch's mask (in s->dc for the MLP's, in s->dqkv for the attention's,
   both free at that point). */
static void block_backward(const gpt2_config *c, int B, int T, float *const *w, float *const *dw,
                           const block_acts *a, const float *in, float *dres, bwd_scratch *s, const drop_ctx *d,
                           int layer)
{
    int C = c->channels, BT = B * T;
    size_t n4 = (size_t)BT * 4 * C;
    uint64_t i0 = d->seq0 * (uint64_t)T * (uint64_t)C;
    const float *dbranch = dres;
    /* MLP: res3 = res2 + dropout(c_proj(gelu(c_fc(ln_2(res2))))) */
    if (d->on) {
        gpt2_dropout_copy(s->dc, dres, (size_t)BT * C, drop_key(d, layer, GPT2_DROP_MLP_RESID), i0, d->thr, d->scale);
        dbranch = s->dc;
    }
    memset(s->d4a, 0, sizeof(float) * n4);
    matmul_backward(s->d4a, dw[GPT2_FCPROJ_W], dw[GPT2_FCPROJ_B], dbranch, a->fch_gelu, w[GPT2_FCPROJ_W], BT,
                    4 * C, C);
    gelu_backward(s->d4b, a->fch, a->fch_tanh, s->d4a, n4);
    memset(s->dc, 0, sizeof(float) * (size_t)BT * C);
    matmul_backward(s->dc, dw[GPT2_FC_W], dw[GPT2_FC_B], s->d4b, a->ln2, w[GPT2_FC_W], BT, C, 4 * C);
    layernorm_backward(dres, dw[GPT2_LN2_W], dw[GPT2_LN2_B], s->dc, a->res2, w[GPT2_LN2_W], a->ln2_mean,
                       a->ln2_rstd, BT, C); /* dres is now d res2 */
    /* attention: res2 = in + dropout(c_proj(attn(c_attn(ln_1(in))))) */
    dbranch = dres;
    if (d->on) {
        gpt2_dropout_copy(s->dqkv, dres, (size_t)BT * C, drop_key(d, layer, GPT2_DROP_ATTN_RESID), i0, d->thr,
                          d->scale);
        dbranch = s->dqkv;
    }
    memset(s->dc, 0, sizeof(float) * (size_t)BT * C);
    matmul_backward(s->dc, dw[GPT2_ATTPROJ_W], dw[GPT2_ATTPROJ_B], dbranch, a->atty, w[GPT2_ATTPROJ_W], BT, C,
                    C);
    memset(s->dqkv, 0, sizeof(float) * (size_t)BT * 3 * C);
    attention_backward(s->dqkv, s->datt, s->dc, a->qkv, a->att, B, T, C, c->heads, d, layer);
    memset(s->dc, 0, sizeof(float) * (size_t)BT * C);
    matmul_backward(s->dc, dw[GPT2_QKV_W], dw[GPT2_QKV_B], s->dqkv, a->ln1, w[GPT2_QKV_W], BT, C, 3 * C);
    layernorm_backward(dres, dw[GPT2_LN1_W], dw[GPT2_LN1_B], s->dc, in, w[GPT2_LN1_W], a->ln1_mean, a->ln1_rstd, BT,
                       C); /* dres is now d in */
}

/* ======================================================================================
   One rank's model: activations, scratch, and the engine's params viewed as fp32.
   ====================================================================================== */

typedef struct model {
    gpt2_config c;
    int B, T;           /* this rank's sequences per micro-step, positions        */
    zero_engine *e;
    zero_dtype dt;
    gpt2_tensor *tab;   /* the parameter table, ids and offsets                    */
    size_t emb_numel;   /* group 0's buffer                                       */
    size_t blk_numel;   /* a block group's buffer                                 */
    size_t emb_gnumel;  /* group 0's gradient buffer: its trained tensors (--freeze) */
    unsigned char *blk_frozen; /* [L]: block l is frozen (--freeze h.N): no gradients */
    float *emb_f32, *blk_f32;   /* params converted to fp32 (bf16/fp16 runs)      */
    float *emb_grad, *blk_grad; /* fp32 gradients before they go to the engine    */
    float *encoded;             /* [BT, C]: the input of block 0                  */
    block_acts *acts;           /* [L]; [1] with checkpointing (one block's, reused) */
    int ckpt;                   /* --offload-activations: each block's input is stashed
                                   in the engine's activation tier after its forward and
                                   fetched back to recompute the block in the backward */
    int training;               /* this forward has a backward (stash the inputs, dropout) */
    drop_ctx drop;              /* --dropout: the training micro-step's (step, micro set per step) */
    drop_ctx nodrop;            /* on = 0: forwards without a backward                */
    float *x;                   /* ckpt: [BT, C], the current block's input        */
    size_t floats;              /* allocated by model_alloc                       */
    size_t block_bytes;         /* one block's activations                        */
    float *lnf, *lnf_mean, *lnf_rstd, *logits; /* logits [BT, V]: probs after the loss */
    int tiles;                  /* --tile-embedding K: wte in K tile groups (0: whole) */
    zero_tile_view *tv;         /* [tiles]: each tile's group, rows and offset     */
    size_t tile_rows;           /* the largest tile's rows                        */
    float *tile_f32, *tile_grad; /* bf16/fp16: one tile's params, its fp32 gradient */
    float *dres;                /* [BT, C]: the residual stream's gradient        */
    bwd_scratch s;
    float **bufs;               /* every buffer above, for freeing                */
    int nbufs;
    double t_gather, t_reduce;  /* seconds in gathers and gradient hand-overs      */
    char why[192];              /* model_init's failed allocation, for the message  */
} model;

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

/* CPU seconds of the whole process (every rank's thread): bench/gpt2.sh's load-proof measure */
static double cpu_s(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

/* The engine calls of the forward and backward, timed for the per-step breakdown: gathers
   (stage 3: all-gathers) and gradient hand-overs (their reductions). */
static zero_result gather_timed(model *m, int g, void **p)
{
    double t = now_s();
    zero_result r = zero_engine_gather(m->e, g, p);
    m->t_gather += now_s() - t;
    return r;
}

static zero_result grads_timed(model *m, int g, void **p)
{
    double t = now_s();
    zero_result r = zero_engine_grads(m->e, g, p);
    m->t_reduce += now_s() - t;
    return r;
}

static zero_result grads_ready_timed(model *m, int g)
{
    double t = now_s();
    zero_result r = zero_engine_grads_ready(m->e, g);
    m->t_reduce += now_s() - t;
    return r;
}

static float *model_alloc(model *m, size_t n, const char *what)
{
    float *p = (float *)calloc(n ? n : 1, sizeof(float));
    if (!p) {
        if (!m->why[0])
            snprintf(m->why, sizeof m->why, "cannot allocate %zu bytes of activations (%s; %zu bytes "
                     "allocated before it)", n * sizeof(float), what, m->floats * sizeof(float));
        return NULL;
    }
    m->bufs[m->nbufs++] = p;
    m->floats += n;
    return p;
}

static void model_free(model *m)
{
    int i;
    for (i = 0; i < m->nbufs; i++) free(m->bufs[i]);
    free(m->bufs);
    free(m->acts);
    free(m->tab);
    free(m->tv);
    free(m->blk_frozen);
    memset(m, 0, sizeof *m);
}

/* After commit: offsets, group sizes and every buffer for B sequences of T (ckpt: one
   block's activations and the block input buffer instead of every block's; tiles > 0: wte's
   tiles from tile 0's id wte_tile0, and buffers of one tile instead of the whole wte). */
static zero_result model_init(model *m, zero_engine *e, const gpt2_config *c, gpt2_tensor *tab, int B, zero_dtype dt,
                              int ckpt, int tiles, int wte_tile0)
{
    const zero_plan *plan = zero_engine_plan(e);
    zero_group_info gi;
    int l, T = c->seq, C = c->channels, H = c->heads, ok = 1, any_frozen = 0;
    size_t BT = (size_t)B * T;
    zero_result r;
    memset(m, 0, sizeof *m);
    m->c = *c, m->B = B, m->T = T, m->e = e, m->dt = dt, m->tab = tab, m->ckpt = ckpt, m->tiles = tiles;
    if ((r = gpt2_offsets(plan, c, tab)) != ZERO_OK) return r;
    if (tiles > 0) {
        if (!(m->tv = (zero_tile_view *)calloc((size_t)tiles, sizeof *m->tv))) return ZERO_ERROR_OUT_OF_MEMORY;
        for (l = 0; l < tiles; l++) {
            if ((r = zero_engine_tile_view(e, wte_tile0, l, &m->tv[l])) != ZERO_OK) return r;
            if (m->tv[l].rows > m->tile_rows) m->tile_rows = m->tv[l].rows;
        }
    }
    if ((r = zero_plan_group(plan, 0, &gi)) != ZERO_OK) return r;
    m->emb_numel = gi.used_numel;
    m->emb_gnumel = gi.frozen_numel ? gi.numel - gi.frozen_numel : gi.used_numel;
    if ((r = zero_plan_group(plan, 1, &gi)) != ZERO_OK) return r;
    m->blk_numel = gi.used_numel;
    if (!(m->blk_frozen = (unsigned char *)calloc((size_t)c->layers + 1, 1))) return ZERO_ERROR_OUT_OF_MEMORY;
    for (l = 0; l < c->layers; l++) {
        if ((r = zero_plan_group(plan, 1 + l, &gi)) != ZERO_OK) return r;
        m->blk_frozen[l] = gi.frozen_numel == gi.numel;
        any_frozen |= m->blk_frozen[l];
    }
    m->bufs = (float **)calloc(32 + 14 * (size_t)c->layers, sizeof(float *));
    m->acts = (block_acts *)calloc((size_t)c->layers, sizeof(block_acts));
    if (!m->bufs || !m->acts) {
        snprintf(m->why, sizeof m->why, "cannot allocate the tables of %d layers", c->layers);
        return ZERO_ERROR_OUT_OF_MEMORY;
    }
#define M_ALLOC(p, n) ok = ok && ((p) = model_alloc(m, (n), #p)) != NULL
    if (dt != ZERO_F32) {
        M_ALLOC(m->emb_f32, m->emb_numel);
        M_ALLOC(m->blk_f32, m->blk_numel);
    }
    if (dt != ZERO_F32 || any_frozen) M_ALLOC(m->blk_grad, m->blk_numel); /* frozen blocks' dw go here */
    M_ALLOC(m->emb_grad, m->emb_numel);
    M_ALLOC(m->encoded, BT * C);
    if (ckpt) M_ALLOC(m->x, BT * C);
    m->block_bytes = m->floats;
    for (l = 0; l < (ckpt ? 1 : c->layers); l++) {
        block_acts *a = &m->acts[l];
        M_ALLOC(a->ln1, BT * C);
        M_ALLOC(a->ln1_mean, BT);
        M_ALLOC(a->ln1_rstd, BT);
        M_ALLOC(a->qkv, BT * 3 * C);
        M_ALLOC(a->att, (size_t)B * H * T * T);
        M_ALLOC(a->atty, BT * C);
        M_ALLOC(a->res2, BT * C);
        M_ALLOC(a->ln2, BT * C);
        M_ALLOC(a->ln2_mean, BT);
        M_ALLOC(a->ln2_rstd, BT);
        M_ALLOC(a->fch, BT * 4 * C);
        M_ALLOC(a->fch_gelu, BT * 4 * C);
        M_ALLOC(a->fch_tanh, BT * 4 * C);
        M_ALLOC(a->res3, BT * C);
    }
    m->block_bytes = sizeof(float) * (m->floats - m->block_bytes) / (size_t)(ckpt ? 1 : c->layers);
    M_ALLOC(m->lnf, BT * C);
    M_ALLOC(m->lnf_mean, BT);
    M_ALLOC(m->lnf_rstd, BT);
    M_ALLOC(m->logits, BT * c->vocab);
    if (tiles > 0 && dt != ZERO_F32) {
        M_ALLOC(m->tile_f32, m->tile_rows * C);
        M_ALLOC(m->tile_grad, m->tile_rows * C);
    }
    M_ALLOC(m->dres, BT * C);
    M_ALLOC(m->s.d4a, BT * 4 * C);
    M_ALLOC(m->s.d4b, BT * 4 * C);
    M_ALLOC(m->s.dqkv, BT * 3 * C);
    M_ALLOC(m->s.dc, BT * C);
    M_ALLOC(m->s.datt, (size_t)T * T);
#undef M_ALLOC
    return ok ? ZERO_OK : ZERO_ERROR_OUT_OF_MEMORY;
}

/* Points w[k] at tensor k of group g (0: GPT2_EMB_TENSORS, else GPT2_BLOCK_TENSORS), in the
   engine's buffer p when it is fp32, else in a converted fp32 copy. */
static zero_result view_group(model *m, int g, void *p, float **w)
{
    int first = g == 0 ? 0 : gpt2_block_tensor(g - 1, 0), n = g == 0 ? GPT2_EMB_TENSORS : GPT2_BLOCK_TENSORS, k;
    float *base = (float *)p;
    if (m->dt != ZERO_F32) {
        size_t numel = g == 0 ? m->emb_numel : m->blk_numel;
        zero_result r;
        base = g == 0 ? m->emb_f32 : m->blk_f32;
        if ((r = zero_convert(base, ZERO_F32, p, m->dt, numel, ZERO_SIMD_AUTO)) != ZERO_OK) return r;
    }
    for (k = 0; k < n; k++) w[k] = base + m->tab[first + k].offset;
    if (g == 0 && m->tiles > 0) w[GPT2_WTE] = NULL; /* in its tiles' groups */
    return ZERO_OK;
}

/* Gathers tile k of the tiled wte (counted like any gather: release its group) and points *w
   at its rows [tv[k].row0, + tv[k].rows) x C in fp32. */
static zero_result gather_tile(model *m, int k, float **w)
{
    const zero_tile_view *v = &m->tv[k];
    void *p;
    zero_result r = gather_timed(m, v->group, &p);
    if (r != ZERO_OK) return r;
    p = (char *)p + v->offset * zero_dtype_size(m->dt);
    *w = (float *)p;
    if (m->dt != ZERO_F32) {
        *w = m->tile_f32;
        r = zero_convert(m->tile_f32, ZERO_F32, p, m->dt, v->rows * v->cols, ZERO_SIMD_AUTO);
        if (r != ZERO_OK) zero_engine_release(m->e, v->group);
    }
    return r;
}

/* The forward of B sequences of T positions (B <= m->B, T <= m->T) of tokens x: the logits
   of every position in m->logits ([B*T, V]). Gathers (stage 3) and releases every group. */
static zero_result model_forward(model *m, const int *x, int B, int T)
{
    const gpt2_config *c = &m->c;
    int C = c->channels, V = c->vocab, BT = B * T, l, i, k;
    float *w[GPT2_BLOCK_TENSORS], *emb[GPT2_EMB_TENSORS];
    const float *in;
    const drop_ctx *d = m->training ? &m->drop : &m->nodrop;
    void *p;
    zero_result r;
    /* group 0 stays gathered through the forward: the head uses wte again (tiled: wpe and
       ln_f; each tile is gathered for the lookup and again for the head) */
    if ((r = gather_timed(m, 0, &p)) != ZERO_OK) return r;
    if ((r = view_group(m, 0, p, emb)) != ZERO_OK) goto out;
    for (l = 0; l < (m->tiles > 0 ? m->tiles : 1); l++) { /* wte[token] + wpe[position] */
        size_t row0 = 0, rows = (size_t)V;
        float *wte = emb[GPT2_WTE];
        if (m->tiles > 0) { /* the positions whose token is a row of tile l */
            if ((r = gather_tile(m, l, &wte)) != ZERO_OK) goto out;
            row0 = m->tv[l].row0, rows = m->tv[l].rows;
        }
        for (i = 0; i < BT; i++) {
            size_t row = (size_t)x[i] - row0; /* wraps past rows when below row0 */
            const float *te, *pe;
            if (row >= rows) continue;
            te = wte + row * C, pe = emb[GPT2_WPE] + (size_t)(i % T) * C;
            for (k = 0; k < C; k++) m->encoded[(size_t)i * C + k] = te[k] + pe[k];
        }
        if (m->tiles > 0) zero_engine_release(m->e, m->tv[l].group);
    }
    if (d->on) /* dropout(wte + wpe): block 0's input, also in the backward */
        gpt2_dropout_copy(m->encoded, m->encoded, (size_t)BT * C, drop_key(d, 0, GPT2_DROP_EMBD),
                          d->seq0 * (uint64_t)T * (uint64_t)C, d->thr, d->scale);
    in = m->encoded;
    if (m->ckpt) in = memcpy(m->x, m->encoded, sizeof(float) * (size_t)BT * C);
    for (l = 0; l < c->layers; l++) {
        void *pb;
        block_acts *a = &m->acts[m->ckpt ? 0 : l];
        if ((r = gather_timed(m, 1 + l, &pb)) != ZERO_OK) goto out;
        r = view_group(m, 1 + l, pb, w);
        if (r == ZERO_OK) block_forward(c, B, T, w, a, in, d, l, m->s.datt);
        zero_engine_release(m->e, 1 + l);
        if (r != ZERO_OK) goto out;
        if (!m->ckpt) {
            in = a->res3;
            continue;
        }
        /* checkpoint: the block's input leaves for the activation tier (the fence lets the
           next line overwrite it), the output becomes the next input */
        if (m->training && ((r = zero_engine_stash(m->e, l, m->x, sizeof(float) * (size_t)BT * C)) != ZERO_OK ||
                            (r = zero_engine_stash_fence(m->e)) != ZERO_OK))
            goto out;
        memcpy(m->x, a->res3, sizeof(float) * (size_t)BT * C);
    }
    layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, in, emb[GPT2_LNF_W], emb[GPT2_LNF_B], BT, C);
    if (m->tiles == 0) {
        memset(m->logits, 0, sizeof(float) * (size_t)BT * V); /* the head is wte: logits = lnf wte^T */
        gemm_acc(m->logits, V, m->lnf, C, 1, emb[GPT2_WTE], 1, C, BT, V, C);
        goto out;
    }
    /* tiled: the logits of tile l's rows (columns row0 .. row0 + rows - 1) from that tile alone;
       each logit is the same sum over C in the same order as the whole product's */
    memset(m->logits, 0, sizeof(float) * (size_t)BT * V);
    for (l = 0; l < m->tiles; l++) {
        int rows = (int)m->tv[l].rows;
        float *wt;
        if ((r = gather_tile(m, l, &wt)) != ZERO_OK) goto out;
        gemm_acc(m->logits + m->tv[l].row0, V, m->lnf, C, 1, wt, 1, C, BT, rows, C);
        zero_engine_release(m->e, m->tv[l].group);
    }
out:
    zero_engine_release(m->e, 0);
    return r;
}

/* Cross-entropy of the logits against targets y: returns the sum over the B*T positions (in
   double) and leaves the softmax in m->logits. */
static double model_loss(model *m, const int *y, int BT)
{
    int V = m->c.vocab, i, v;
    double total = 0.0;
    for (i = 0; i < BT; i++) {
        float *z = m->logits + (size_t)i * V, mx = -INFINITY, sum = 0.0f, zy, lane[16];
        for (v = 0; v < 16; v++) lane[v] = -INFINITY;
        for (v = 0; v < V; v++) lane[v % 16] = z[v] > lane[v % 16] ? z[v] : lane[v % 16];
        for (v = 0; v < 16; v++) mx = lane[v] > mx ? lane[v] : mx;
        zy = z[y[i]] - mx;
        for (v = 0; v < V; v++) z[v] -= mx;
        gemm_expf(z, z, (size_t)V);
        for (v = 0; v < 16; v++) lane[v] = 0.0f; /* the sum in 16 lanes, added in lane order */
        for (v = 0; v < V; v++) lane[v % 16] += z[v];
        for (v = 0; v < 16; v++) sum += lane[v];
        total += (double)(logf(sum) - zy);
        for (v = 0; v < V; v++) z[v] /= sum;
    }
    return total;
}

/* The backward of the last model_forward + model_loss over this rank's B x T batch: writes
   the gradients of (mean loss * scale) of every group into the engine (grads, grads_ready),
   blocks from the last to the first, then the embeddings group. */
static zero_result model_backward(model *m, const int *x, const int *y, float scale)
{
    const gpt2_config *c = &m->c;
    int B = m->B, T = m->T, C = c->channels, V = c->vocab, BT = B * T, l, i, k;
    float *w[GPT2_BLOCK_TENSORS], *dw[GPT2_BLOCK_TENSORS], *emb[GPT2_EMB_TENSORS], *demb[GPT2_EMB_TENSORS];
    float gs = scale / (float)BT;
    void *p, *g;
    zero_result r;
    for (i = 0; i < BT; i++) { /* d(mean loss * scale) / d logits = scale (softmax - onehot) / BT */
        float *d = m->logits + (size_t)i * V, py = d[y[i]];
        for (k = 0; k < V; k++) d[k] *= gs;
        d[y[i]] = (py - 1.0f) * gs;
    }
    memset(m->emb_grad, 0, sizeof(float) * m->emb_numel);
    for (k = 0; k < GPT2_EMB_TENSORS; k++) demb[k] = m->emb_grad + m->tab[k].offset;
    /* the head and the final norm: group 0 again */
    if ((r = gather_timed(m, 0, &p)) != ZERO_OK) return r;
    r = view_group(m, 0, p, emb);
    if (r == ZERO_OK) {
        float *dlnf = m->s.dc;
        memset(dlnf, 0, sizeof(float) * (size_t)BT * C);
        if (m->tiles == 0) {
            gemm_acc(dlnf, C, m->logits, V, 1, emb[GPT2_WTE], C, 1, BT, C, V); /* dlnf = dlogits wte */
            if (!(m->tab[GPT2_WTE].flags & ZERO_TENSOR_FROZEN))                  /* dwte += dlogits^T lnf */
                gemm_acc(demb[GPT2_WTE], C, m->logits, 1, V, m->lnf, C, 1, V, C, BT);
        }
        /* tiled: dlnf tile by tile, adding the products in the same order over V; the
           tiles' dwte waits for the end of the backward (it needs dlogits and lnf only) */
        for (l = 0; l < m->tiles && r == ZERO_OK; l++) {
            float *wt;
            if ((r = gather_tile(m, l, &wt)) != ZERO_OK) break;
            gemm_acc(dlnf, C, m->logits + m->tv[l].row0, V, 1, wt, C, 1, BT, C, (int)m->tv[l].rows);
            zero_engine_release(m->e, m->tv[l].group);
        }
        memset(m->dres, 0, sizeof(float) * (size_t)BT * C);
        if (r == ZERO_OK)
            layernorm_backward(m->dres, demb[GPT2_LNF_W], demb[GPT2_LNF_B], dlnf,
                               m->ckpt ? m->x : c->layers ? m->acts[c->layers - 1].res3 : m->encoded,
                               emb[GPT2_LNF_W], m->lnf_mean, m->lnf_rstd, BT, C);
    }
    zero_engine_release(m->e, 0);
    if (r != ZERO_OK) return r;
    for (l = c->layers - 1; l >= 0; l--) {
        int grp = 1 + l, first = gpt2_block_tensor(l, 0);
        float *gbase;
        if ((r = gather_timed(m, grp, &p)) != ZERO_OK) return r;
        g = NULL; /* a frozen block takes no gradient: its dw go to scratch */
        if ((r = view_group(m, grp, p, w)) == ZERO_OK && !m->blk_frozen[l]) r = grads_timed(m, grp, &g);
        if (r != ZERO_OK) {
            zero_engine_release(m->e, grp);
            return r;
        }
        gbase = m->dt == ZERO_F32 && g ? (float *)g : m->blk_grad;
        if (gbase == m->blk_grad) memset(gbase, 0, sizeof(float) * m->blk_numel);
        for (k = 0; k < GPT2_BLOCK_TENSORS; k++) dw[k] = gbase + m->tab[first + k].offset;
        if (m->ckpt) { /* the block's input comes back; the same forward recomputes its activations */
            r = zero_engine_fetch(m->e, l, m->x, sizeof(float) * (size_t)BT * C);
            if (r != ZERO_OK) {
                zero_engine_release(m->e, grp);
                return r;
            }
            block_forward(c, B, T, w, &m->acts[0], m->x, &m->drop, l, m->s.datt);
            block_backward(c, B, T, w, dw, &m->acts[0], m->x, m->dres, &m->s, &m->drop, l);
        } else {
            block_backward(c, B, T, w, dw, &m->acts[l], l ? m->acts[l - 1].res3 : m->encoded, m->dres, &m->s,
                           &m->drop, l);
        }
        if (g && m->dt != ZERO_F32) r = zero_convert(g, m->dt, gbase, ZERO_F32, m->blk_numel, ZERO_SIMD_AUTO);
        zero_engine_release(m->e, grp);
        if (r != ZERO_OK || (g && (r = grads_ready_timed(m, grp)) != ZERO_OK)) return r;
    }
    if (m->drop.on) /* through the embeddings' dropout: its mask of the forward */
        gpt2_dropout_copy(m->dres, m->dres, (size_t)BT * C, drop_key(&m->drop, 0, GPT2_DROP_EMBD),
                          m->drop.seq0 * (uint64_t)T * (uint64_t)C, m->drop.thr, m->drop.scale);
    for (i = 0; i < BT; i++) { /* the embeddings: wte[token] and wpe[position] += dres */
        float *dpe = demb[GPT2_WPE] + (size_t)(i % T) * C;
        const float *d = m->dres + (size_t)i * C;
        if (m->tiles == 0 && !(m->tab[GPT2_WTE].flags & ZERO_TENSOR_FROZEN)) {
            float *dte = demb[GPT2_WTE] + (size_t)x[i] * C;
            for (k = 0; k < C; k++) dte[k] += d[k];
        }
        if (!(m->tab[GPT2_WPE].flags & ZERO_TENSOR_FROZEN))
            for (k = 0; k < C; k++) dpe[k] += d[k];
    }
    /* tiled: each tile's gradient, the head's part (dlogits^T lnf over the tile's rows) and
       then the lookup's rows, in the untiled order per element, handed over once */
    for (l = 0; l < m->tiles; l++) {
        const zero_tile_view *v = &m->tv[l];
        size_t rows = v->rows;
        float *gt;
        if ((r = grads_timed(m, v->group, &g)) != ZERO_OK) return r;
        g = (char *)g + v->offset * zero_dtype_size(m->dt);
        gt = m->dt == ZERO_F32 ? (float *)g : m->tile_grad;
        if (m->dt != ZERO_F32) memset(gt, 0, sizeof(float) * rows * C);
        gemm_acc(gt, C, m->logits + v->row0, 1, V, m->lnf, C, 1, (int)rows, C, BT);
        for (i = 0; i < BT; i++) {
            size_t row = (size_t)x[i] - v->row0; /* wraps past rows when below row0 */
            const float *d = m->dres + (size_t)i * C;
            if (row < rows)
                for (k = 0; k < C; k++) gt[row * C + k] += d[k];
        }
        if (m->dt != ZERO_F32 && (r = zero_convert(g, m->dt, gt, ZERO_F32, rows * C, ZERO_SIMD_AUTO)) != ZERO_OK)
            return r;
        if ((r = grads_ready_timed(m, v->group)) != ZERO_OK) return r;
    }
    if (m->emb_gnumel == 0) return ZERO_OK; /* wte, wpe and ln_f all frozen */
    if ((r = grads_timed(m, 0, &g)) != ZERO_OK) return r;
    /* the trained tensors come first in the group (frozen ones after: --freeze) */
    r = zero_convert(g, m->dt, m->emb_grad, ZERO_F32, m->emb_gnumel, ZERO_SIMD_AUTO);
    if (r == ZERO_OK) r = grads_ready_timed(m, 0);
    return r;
}

/* ======================================================================================
   Training on one rank.
   ====================================================================================== */

typedef struct run {
    const gpt2_opts *o;
    const gpt2_data *data;
    int stage;
    int quiet;              /* the demo: no per-step lines                           */
    double *loss;           /* [steps]: the mean training loss of every rank          */
    double first_loss, final_loss, val_loss;
    int first_step;         /* 0, or the step a --resume checkpoint holds            */
    int end_step;           /* --stop-at, or --steps                                 */
    double seconds;         /* rank 0's training steps (validation and saving excluded) */
    double warm_seconds, warm_cpu; /* the same from the second step on; the process's CPU seconds */
    double t_gather, t_reduce, t_step; /* rank 0: seconds in gathers, gradient hand-overs, step() */
    zero_engine_memory mem; /* rank 0, device tier                                   */
    zero_engine_memory off[2]; /* rank 0, the host and NVMe tiers (offload)              */
    zero_traffic traffic;   /* rank 0, last step                                     */
    size_t psi;             /* the plan's padded total                               */
    size_t frozen;          /* of which frozen (--freeze): the plan's frozen regions    */
    int skipped;
    float final_scale;
    float *final_params;    /* every tensor's fp32 master, table order (each rank its shard);
                               NULL with one rank: keep_params hashes into params_sum */
    uint64_t params_sum;
    size_t total_numel;
    char sample[4096];      /* rank 0's generated text                                 */
    FILE *log;              /* --log CSV, rank 0                                     */
    char err[GPT2_MAX_RANKS][640]; /* each rank's failure, printed once by main          */
} run;

#define CHECK(call)                                                                          \
    do {                                                                                     \
        r = (call);                                                                          \
        if (r != ZERO_OK) goto done;                                                         \
    } while (0)

/* The mean loss over every rank of val_batches validation batches. COLLECTIVE. */
static zero_result val_loss(model *m, const run *R, int rank, int world, int *x, int *y, double *out)
{
    const gpt2_opts *o = R->o;
    double sum = 0.0;
    int v;
    zero_result r;
    for (v = 0; v < o->val_batches; v++) {
        gpt2_batch(R->data, 1, (uint64_t)v, o->batch, m->T, rank * m->B, m->B, x, y);
        if ((r = model_forward(m, x, m->B, m->T)) != ZERO_OK) return r;
        sum += model_loss(m, y, m->B * m->T) / (double)(m->B * m->T);
    }
    if ((r = zero_engine_allreduce(m->e, &sum, 1, ZERO_F64, ZERO_OP_SUM)) != ZERO_OK) return r;
    *out = sum / ((double)world * o->val_batches);
    return ZERO_OK;
}

/* n tokens after a prompt of the first 16 validation tokens, sampled from the softmax with
   the generator rng; every rank computes the same (stage 3 gathers need them all). Text
   data: the bytes, unprintable ones as '?'; token files: the ids, or with --tokenizer their
   text (gpt2_sample_text). */
static zero_result generate(model *m, const run *R, uint64_t *rng, char *out, size_t cap)
{
    int n = R->o->sample, T = m->T, V = m->c.vocab, plen = 16, len, i;
    int *tok = (int *)malloc(sizeof(int) * (size_t)(plen + n));
    size_t used = 0;
    zero_result r = ZERO_OK;
    if (!tok) return ZERO_ERROR_OUT_OF_MEMORY;
    if (plen > T) plen = T;
    for (i = 0; i < plen; i++) tok[i] = R->data->tokens[R->data->ntrain + (size_t)i];
    for (len = plen; len < plen + n && r == ZERO_OK; len++) {
        int start = len > T ? len - T : 0, w = len - start;
        r = model_forward(m, tok + start, 1, w);
        tok[len] = gpt2_sample_token(m->logits + (size_t)(w - 1) * V, V, rng);
    }
    used = gpt2_sample_text(R->o, tok, len, out, cap, used);
    out[used] = '\0';
    free(tok);
    return r;
}

/* FNV-1a, continued from h over n more bytes (h = FNV1A64_START to begin). */
#define FNV1A64_START 0xcbf29ce484222325ull
static uint64_t fnv1a64(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Writes this rank's shard of every tensor's fp32 master into R->final_params (a tiled wte:
   each tile's rows in their place), table order. One rank and no R->final_params: hashes
   the values in that order into R->params_sum instead (a large model's checksum without a
   second copy of its params). */
static zero_result keep_params(const model *m, run *R)
{
    const gpt2_config *c = &m->c;
    const gpt2_tensor *tab = m->tab;
    size_t most = 0, at = 0;
    int i, k;
    float *buf, *pbuf;
    zero_result r = ZERO_OK;
    R->params_sum = FNV1A64_START;
    for (i = 0; i < gpt2_num_tensors(c); i++)
        if (tab[i].numel > most) most = tab[i].numel;
    if (!(buf = (float *)malloc(2 * most * sizeof(float)))) return ZERO_ERROR_OUT_OF_MEMORY;
    pbuf = buf + most; /* frozen tensors' params */
    for (i = 0; i < gpt2_num_tensors(c) && r == ZERO_OK; i++) {
        int parts = tab[i].id < 0 ? m->tiles : 1;
        for (k = 0; k < parts && r == ZERO_OK; k++) {
            zero_range own;
            size_t first = tab[i].id < 0 ? m->tv[k].row0 * m->tv[k].cols : 0;
            memset(&own, 0, sizeof own);
            if (tab[i].flags & ZERO_TENSOR_FROZEN) { /* no master: its params, this rank's slice */
                zero_range seg;
                zero_tensor_info ti;
                zero_engine_desc dd;
                memset(&dd, 0, sizeof dd);
                memset(&seg, 0, sizeof seg);
                memset(&ti, 0, sizeof ti);
                r = zero_engine_read_tensor(m->e, tab[i].id, ZERO_STATE_PARAM, pbuf, &own);
                if (r == ZERO_OK && (r = zero_engine_get_desc(m->e, &dd)) == ZERO_OK && !dd.comm) r = ZERO_ERROR_INVALID_STATE;
                if (r == ZERO_OK) r = zero_plan_tensor(zero_engine_plan(m->e), tab[i].id, &ti);
                if (r == ZERO_OK) r = zero_plan_intersect(zero_engine_plan(m->e), tab[i].id, dd.comm->rank, &seg);
                if (r != ZERO_OK) break;
                own.offset = seg.offset - ti.offset;
                own.numel = seg.numel;
                r = zero_convert(buf + own.offset, ZERO_F32, (const char *)pbuf + own.offset * zero_dtype_size(m->dt),
                                 m->dt, own.numel, ZERO_SIMD_AUTO);
            } else {
                r = zero_engine_read_tensor(m->e, tab[i].id < 0 ? m->tv[k].tensor : tab[i].id, ZERO_STATE_MASTER,
                                            buf, &own);
            }
            if (r != ZERO_OK) break;
            if (R->final_params)
                memcpy(R->final_params + at + first + own.offset, buf + own.offset, own.numel * sizeof(float));
            else R->params_sum = fnv1a64(R->params_sum, buf + own.offset, own.numel * sizeof(float));
        }
        at += tab[i].numel;
    }
    free(buf);
    return r;
}

static zero_result rank_main(int rank, zero_comm *comm, void *user)
{
    run *R = (run *)user;
    const gpt2_opts *o = R->o;
    const gpt2_config *c = &o->cfg;
    int world = comm->world, B = o->batch / world, T = c->seq, s, k;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    model m;
    gpt2_tensor *tab = NULL;
    int *x = NULL, *y = NULL, wte_tile0 = -1;
    gpt2_client cl;
    zero_result r = ZERO_OK;
    double tstep;
    memset(&m, 0, sizeof m);
    gpt2_client_init(&cl, o);
    {
        zero_host_device_desc hd;
        memset(&hd, 0, sizeof hd);
        hd.capacity = o->device_memory;
        CHECK(zero_host_device_create(&hd, &dev));
    }
    gpt2_engine_desc(o, R->stage, B, &d);
    d.device = dev;
    d.comm = comm;
    CHECK(zero_engine_create(&d, &e));
    tab = (gpt2_tensor *)malloc(sizeof(gpt2_tensor) * (size_t)gpt2_num_tensors(c));
    if (!tab) CHECK(ZERO_ERROR_OUT_OF_MEMORY);
    gpt2_param_table(c, tab);
    if (o->freeze && gpt2_mark_frozen(c, tab, o->freeze, NULL, 0) != 0) CHECK(ZERO_ERROR_INVALID_ARGUMENT); /* main checked it */
    CHECK(gpt2_add_tensors_tiled(e, c, tab, o->tile_embedding, &wte_tile0));
    CHECK(zero_engine_commit(e));
    if (o->lr_embed != 1.0) { /* the embeddings' parameter group */
        CHECK(zero_engine_set_tensor_hparams(e, tab[GPT2_WTE].id, o->lr_embed, ZERO_WEIGHT_DECAY_DEFAULT));
        CHECK(zero_engine_set_tensor_hparams(e, tab[GPT2_WPE].id, o->lr_embed, ZERO_WEIGHT_DECAY_DEFAULT));
    }
    r = model_init(&m, e, c, tab, B, o->dtype, o->oact != ZERO_OFFLOAD_NONE, o->tile_embedding, wte_tile0);
    tab = NULL; /* the model owns it */
    if (r != ZERO_OK) goto done;
    if (o->dropout > 0) {
        m.drop.on = 1;
        m.drop.thr = gpt2_dropout_threshold(o->dropout);
        m.drop.scale = (float)(1.0 / (1.0 - o->dropout));
        m.drop.seed = o->seed;
        m.drop.seq0 = (uint64_t)rank * (uint64_t)B;
    }
    if (o->init_path) CHECK(zero_engine_load_pretrained(e, o->init_path, "transformer."));
    else CHECK(gpt2_set_init_tiled(e, c, m.tab, o->seed, o->tile_embedding, wte_tile0));
    if (o->resume_dir) { /* the engine's state, and ours: the data position and the generator */
        size_t got = 0;
        char why[640];
        CHECK(zero_engine_load_client(e, o->resume_dir, &cl, sizeof cl, &got));
        if (gpt2_client_check(&cl, got, o, o->resume_dir, why, sizeof why) != 0) {
            r = ZERO_ERROR_MISMATCH; /* every rank read the same state: rank 0 says why, once */
            snprintf(R->err[rank], sizeof R->err[rank], "%s", why);
            goto done;
        }
        if (rank == 0) printf("resumed from %s at step %lld\n", o->resume_dir, (long long)cl.next_step);
    }
    R->first_step = (int)cl.next_step;
    x = (int *)malloc(sizeof(int) * (size_t)B * T);
    y = (int *)malloc(sizeof(int) * (size_t)B * T);
    if (!x || !y) CHECK(ZERO_ERROR_OUT_OF_MEMORY);
    if (rank == 0 && !R->quiet) {
        printf("per-rank memory (rank 0, stage %d):\n", R->stage);
        gpt2_print_memory(stdout, e, 0);
        printf("rank 0 activations %zu B (the forward's and the backward's buffers)\n", m.floats * sizeof(float));
    }
    for (s = R->first_step; s < R->end_step; s++) {
        zero_step_info info;
        double loss = 0.0, lr = gpt2_lr(o, s), vl = 0.0, t_opt, cstep = rank == 0 ? cpu_s() : 0.0;
        int have_vl = 0;
        float scale;
        tstep = now_s();
        CHECK(zero_engine_set_lr(e, lr));
        scale = zero_engine_loss_scale(e);
        for (k = 0; k < o->accum; k++) {
            gpt2_batch(R->data, 0, cl.next_batch++, o->batch, T, rank * B, B, x, y);
            m.drop.step = (uint64_t)s, m.drop.micro = (uint64_t)k;
            m.training = 1;
            r = model_forward(&m, x, B, T);
            m.training = 0;
            CHECK(r);
            if (rank == 0 && s == 0 && k == 0 && o->logits_path) {
                FILE *f = fopen(o->logits_path, "wb");
                if (!f || fwrite(m.logits, sizeof(float), (size_t)B * T * c->vocab, f) != (size_t)B * T * c->vocab)
                    fprintf(stderr, "cannot write %s\n", o->logits_path);
                if (f) fclose(f);
            }
            loss += model_loss(&m, y, B * T) / (double)(B * T);
            CHECK(model_backward(&m, x, y, scale));
        }
        t_opt = now_s();
        CHECK(zero_engine_step(e, &info));
        /* --delayed-update-after: the last update reaches the params before the final
           validation, export and checksum (a --stop-at run leaves it pending in its checkpoint,
           so its resume is the uninterrupted run) */
        if (s + 1 == o->steps) CHECK(zero_engine_finish_update(e));
        if (rank == 0) R->t_step += now_s() - t_opt;
        cl.next_step = s + 1;
        /* the log's loss: every rank's mean, through a tagged user all-reduce */
        CHECK(zero_engine_allreduce(e, &loss, 1, ZERO_F64, ZERO_OP_SUM));
        loss /= (double)world * o->accum;
        R->loss[s] = loss;
        if (info.skipped && rank == 0) R->skipped++;
        tstep = now_s() - tstep;
        if (rank == 0) R->seconds += tstep;
        if (rank == 0 && s > R->first_step) R->warm_seconds += tstep, R->warm_cpu += cpu_s() - cstep;
        if ((o->val_every > 0 && (s + 1) % o->val_every == 0) || s + 1 == R->end_step) {
            double g0 = m.t_gather;
            CHECK(val_loss(&m, R, rank, world, x, y, &vl));
            have_vl = 1; /* also a NaN: printed as such, never dropped */
            m.t_gather = g0; /* the breakdown is of training steps */
        }
        if (rank == 0) {
            int every = o->log_every ? o->log_every : 1;
            if (!R->quiet && (s % every == 0 || s + 1 == R->end_step || have_vl)) {
                printf("step %5d | loss %.6f | lr %.3e | norm %8.4f | %8.2f ms | %8.0f tok/s", s, loss, lr,
                       (double)info.grad_norm, 1e3 * tstep, (double)o->batch * o->accum * T / tstep);
                if (have_vl) printf(" | val %.6f", vl);
                printf("%s\n", !info.skipped ? ""
                                : o->dtype == ZERO_F16 ? " | skipped (norm -1): inf/NaN gradients, an fp16 overflow: the loss scale halves"
                                                       : " | skipped (norm -1): inf/NaN gradients");
                fflush(stdout);
            }
            if (R->log) {
                fprintf(R->log, "%d,%.17g,%.17g,%.9g,", s, loss, lr, (double)info.grad_norm);
                if (have_vl) fprintf(R->log, "%.17g", vl);
                fprintf(R->log, "\n");
            }
        }
        if (have_vl) R->val_loss = vl;
        if (o->save_dir && ((o->save_every > 0 && (s + 1) % o->save_every == 0) || s + 1 == R->end_step)) {
            CHECK(zero_engine_save_client(e, o->save_dir, &cl, sizeof cl));
            if (rank == 0 && !R->quiet) printf("saved step %d to %s\n", s + 1, o->save_dir);
        }
    }
    if (rank == 0) {
        R->t_gather = m.t_gather;
        R->t_reduce = m.t_reduce;
        zero_engine_memory_usage(e, &R->mem);
        zero_engine_memory_tier(e, ZERO_TIER_HOST, &R->off[0]);
        zero_engine_memory_tier(e, ZERO_TIER_NVME, &R->off[1]);
        zero_engine_traffic(e, &R->traffic, NULL);
        R->psi = zero_plan_total_numel(zero_engine_plan(e));
        R->frozen = 0;
        for (int g = 0; g < zero_plan_num_groups(zero_engine_plan(e)); g++) {
            zero_group_info gi;
            if (zero_plan_group(zero_engine_plan(e), g, &gi) == ZERO_OK) R->frozen += gi.frozen_numel;
        }
        R->final_scale = zero_engine_loss_scale(e);
    }
    if (rank == 0 && !R->quiet && o->oact != ZERO_OFFLOAD_NONE) {
        zero_activation_stats as;
        size_t blk = m.block_bytes;
        zero_engine_activation_stats(e, &as);
        printf("activations (rank 0): %zu bytes of one block's kept instead of %zu of %d blocks; "
               "%llu inputs stashed (%s), fetches: %llu from staging, %llu read ahead, %llu read on demand\n",
               blk, blk * (size_t)c->layers, c->layers, (unsigned long long)as.stashes,
               o->oact == ZERO_OFFLOAD_NVME ? "nvme" : "cpu", (unsigned long long)as.staging_hits,
               (unsigned long long)as.prefetch_hits, (unsigned long long)as.demand_reads);
    }
    CHECK(keep_params(&m, R));
    if (o->sample > 0) {
        char text[sizeof R->sample];
        CHECK(generate(&m, R, &cl.rng, text, sizeof text));
        if (rank == 0) memcpy(R->sample, text, sizeof text);
    }
done:
    if (r != ZERO_OK && !R->err[rank][0]) /* main prints one rank's, once */
        snprintf(R->err[rank], sizeof R->err[rank], "%s: %s", zero_result_string(r),
                 m.why[0] ? m.why : zero_last_error());
    free(x);
    free(y);
    free(tab);
    model_free(&m);
    gemm_release();
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

/* ======================================================================================
   Launch: threads, or this process's rank of mpirun's.
   ====================================================================================== */

static zero_result launch(run *R)
{
#ifdef ZERO_GPT2_MPI
    zero_mpi_desc md;
    zero_comm *comm = NULL;
    zero_result r;
    int rk = 0;
    memset(&md, 0, sizeof md);
    MPI_Comm_rank(MPI_COMM_WORLD, &rk);
    if (rk != 0 && R->log) R->log = NULL; /* rank 0 writes the log */
    r = zero_mpi_create(&md, &comm);
    if (r != ZERO_OK) return r;
    r = rank_main(comm->rank, comm, R);
    zero_comm_destroy(comm);
    if (r != ZERO_OK) return r;
    /* every rank wrote its shard of the params, zeros elsewhere: OR the bits together */
    MPI_Allreduce(MPI_IN_PLACE, R->final_params, (int)R->total_numel, MPI_UINT32_T, MPI_BOR, MPI_COMM_WORLD);
    return ZERO_OK;
#else
    return zero_local_run(R->o->ranks, rank_main, R);
#endif
}

/* The failure to report: the first rank's whose error is its own (not the comm's abort
   after a peer failed), else the first rank's. */
static const char *first_error(const run *R)
{
    int k;
    for (k = 0; k < GPT2_MAX_RANKS; k++)
        if (R->err[k][0] && !strstr(R->err[k], "aborted") && strncmp(R->err[k], "communication", 13) != 0)
            return R->err[k];
    for (k = 0; k < GPT2_MAX_RANKS; k++)
        if (R->err[k][0]) return R->err[k];
    return "no detail";
}

static double states_of(const zero_engine_memory *m)
{
    return (double)(m->bytes[ZERO_MEM_PARAM] + m->bytes[ZERO_MEM_GRAD] + m->bytes[ZERO_MEM_MASTER] +
                    m->bytes[ZERO_MEM_MOMENT1] + m->bytes[ZERO_MEM_MOMENT2]);
}

/* Refuses (-1, the figures in err) a run whose memory cannot fit in what this process may use,
   before anything is allocated: every rank's activations (threads share the process),
   every rank's model states by the paper's formula at the largest stage run (the host
   device is this machine's memory; an NVMe tier takes them off it, so they are not counted
   then), the tokens, and the final params main keeps. */
static int memory_check(const gpt2_opts *o, const gpt2_data *d, size_t total, int keep_all, char *err, size_t n)
{
    double lim = gpt2_memory_limit(), ranks = o->ranks;
    int B = o->batch / o->ranks, ckpt = o->oact != ZERO_OFFLOAD_NONE, nvme;
    double act = gpt2_activation_bytes(&o->cfg, B, ckpt, o->tile_embedding, o->dtype);
    double states, data = 4.0 * (double)(d->ntrain + d->nval), params = keep_all ? 4.0 * (double)total : 0.0;
    double es = (double)zero_dtype_size(o->dtype), need;
#ifdef ZERO_GPT2_MPI
    ranks = 1; /* one rank per process */
#endif
    nvme = o->oopt == ZERO_OFFLOAD_NVME || o->oparam == ZERO_OFFLOAD_NVME;
    states = nvme ? 0.0 : ranks * gpt2_formula_states_k(o->stage < 0 ? 0 : o->stage, (double)total, 0, o->ranks, o->accum, es,
                                                  o->odtype == ZERO_BF16 ? 6 : 12);
    need = ranks * act + states + data + params;
    if (lim <= 0 || need <= lim) return 0;
    snprintf(err, n, "this run needs about %.2f GB of memory, more than the %.2f GB this process may use (physical "
             "memory, or ulimit -v): activations %.2f GB per rank x %.0f (--batch %d / --ranks %d, --seq %d, "
             "--channels %d, --layers %d), model states %.2f GB, data %.2f GB, final params %.2f GB",
             need / 1e9, lim / 1e9, act / 1e9, ranks, o->batch, o->ranks, o->cfg.seq, o->cfg.channels,
             o->cfg.layers, states / 1e9, data / 1e9, params / 1e9);
    return -1;
}

static gpt2_vocab vocab; /* --tokenizer */
static void vocab_free(void) { gpt2_vocab_free(&vocab); }

static int finish(int rc)
{
#ifdef ZERO_GPT2_MPI
    if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc); /* the peers may be waiting */
    MPI_Finalize();
#endif
    return rc;
}

int main(int argc, char **argv)
{
    gpt2_opts o;
    gpt2_data data;
    char err[512], base[4200] = "";
    int rc, first = 0, last = 3, st, same = 1, keep_all, writer = 1;
    double ref_final = 0.0;
    uint64_t ref_sum = 0;
    size_t total = 0;
    gpt2_tensor *tab;
    gpt2_opts_default(&o);
#ifdef ZERO_GPT2_MPI
    o.launcher = 1; /* --batch is checked against mpirun's world below */
#endif
    rc = gpt2_parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : rc;
    if (o.decode_path && !o.tokenizer_path) {
        fprintf(stderr, "%s: --decode FILE.bin needs --tokenizer (the vocabulary to print it with)\n", argv[0]);
        return 2;
    }
    if (o.tokenizer_path) {
        atexit(vocab_free);
        if (gpt2_vocab_load(o.tokenizer_path, &vocab, err, sizeof err) != 0) {
            fprintf(stderr, "%s: %s\n", argv[0], err);
            return 2;
        }
        o.vocab = &vocab;
        if (o.decode_path) {
            rc = gpt2_decode_bin(&vocab, o.decode_path, stdout, err, sizeof err);
            if (rc != 0) fprintf(stderr, "%s: %s\n", argv[0], err);
            return rc ? 1 : 0;
        }
    }
    if (o.freeze || o.lr_embed != 1.0) {
        gpt2_tensor *ft = (gpt2_tensor *)malloc(sizeof(gpt2_tensor) * (size_t)gpt2_num_tensors(&o.cfg));
        char why[200];
        int bad = !ft;
        if (ft) {
            gpt2_param_table(&o.cfg, ft);
            if (o.freeze && gpt2_mark_frozen(&o.cfg, ft, o.freeze, why, sizeof why) != 0) {
                fprintf(stderr, "%s: %s\n", argv[0], why);
                bad = 1;
            }
            free(ft);
        }
        if (!bad && o.tile_embedding > 0) {
            fprintf(stderr, "%s: --freeze and --lr-embed work on a whole wte (not with --tile-embedding)\n", argv[0]);
            bad = 1;
        }
        if (!bad && (o.oopt || o.oparam || o.ograd) && o.freeze) {
            fprintf(stderr, "%s: --freeze with offload is not supported yet (the engine refuses frozen tensors "
                    "with offload)\n", argv[0]);
            bad = 1;
        }
        if (bad) return 2;
    }
    if (o.tile_embedding > 0 && o.init_path) {
        fprintf(stderr, "%s: --init reads a whole transformer.wte.weight; it cannot fill --tile-embedding's tiles\n",
                argv[0]);
        return 2;
    }
#ifdef ZERO_GPT2_MPI
    keep_all = 1;
#else
    keep_all = o.ranks > 1 || o.export_dir; /* one rank hashes its params as it reads them (keep_params) */
#endif
#ifdef ZERO_GPT2_MPI
    {
        int world = 0, me = 0, given = o.ranks_given;
        MPI_Init(&argc, &argv);
        MPI_Comm_size(MPI_COMM_WORLD, &world);
        MPI_Comm_rank(MPI_COMM_WORLD, &me);
        if ((given && o.ranks != world) || world > GPT2_MAX_RANKS || o.batch % world) {
            if (me == 0)
                fprintf(stderr, "train_gpt2_mpi: mpirun started %d processes (--ranks %d, --batch %d must be a multiple)\n",
                        world, o.ranks, o.batch);
            MPI_Finalize();
            return 2;
        }
        o.ranks = world;
        if (me != 0 && !freopen("/dev/null", "w", stdout)) return 1; /* rank 0 prints */
        writer = me == 0;
    }
#endif
    if (o.export_dir && writer && gpt2_hf_dir_prepare(o.export_dir, 1, err, sizeof err) != 0) {
        fprintf(stderr, "--export: %s\n", err); /* before the run, not after it */
        return finish(2);
    }
    err[0] = '\0';
    if (o.init_path && gpt2_init_check(o.init_path, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return finish(2);
    }
    if (example_nvme_dir(o.nvme_path, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return finish(2);
    }
    if (gpt2_data_load_val(o.data_path, o.val_path, o.cfg.vocab, o.cfg.seq, &data, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return finish(2);
    }
    if (o.stage >= 0) first = last = o.stage;
    tab = (gpt2_tensor *)malloc(sizeof(gpt2_tensor) * (size_t)gpt2_num_tensors(&o.cfg));
    if (!tab) {
        fprintf(stderr, "out of memory: cannot allocate the parameter table (%d tensors of %zu bytes)\n",
                gpt2_num_tensors(&o.cfg), sizeof(gpt2_tensor));
        gpt2_data_free(&data);
        return finish(1);
    }
    gpt2_param_table(&o.cfg, tab);
    for (st = 0; st < gpt2_num_tensors(&o.cfg); st++) total += tab[st].numel;
    free(tab);
    if (memory_check(&o, &data, total, keep_all, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        gpt2_data_free(&data);
        return finish(1);
    }
    printf("GPT-2 on %d %s: L %d, H %d, C %d, T %d, V %d (%zu parameters), %s params; %d steps of %d x %d "
           "sequences; data %s (%zu train / %zu val tokens)\n",
           o.ranks,
#ifdef ZERO_GPT2_MPI
           "MPI processes (mpirun, zero_mpi.h comm)",
#else
           "ranks (threads, local comm)",
#endif
           o.cfg.layers, o.cfg.heads, o.cfg.channels, o.cfg.seq, o.cfg.vocab, total, zero_dtype_name(o.dtype), o.steps,
           o.accum, o.batch, o.data_path ? o.data_path : GPT2_DEFAULT_DATA, data.ntrain, data.nval);
    if (first != last) {
        printf("%-5s | %-9s %-9s | %-23s | %-23s | %-8s\n", "", "loss", "", "device states B/rank",
               "comm B/rank/step", "time");
        printf("%-5s | %-9s %-9s | %-11s %-11s | %-11s %-11s | %-8s\n", "stage", "first", "final", "measured",
               "formula", "measured", "formula", "ms/step");
    }
    for (st = first; st <= last; st++) {
        run R;
        zero_result r;
        double es = (double)zero_dtype_size(o.dtype), meas_t, ft[3] = {0, 0, 0}, mi = 0, mo = 0;
        int nstates, k, hier = o.ranks_per_node > 0 || o.mics_shard_size > 0 || o.hpz > 1;
        /* hpZ (stage 3): the secondary partition, p Psi / H more params per rank */
        int H = st == 3 && o.hpz > 1 && o.hpz < o.ranks ? o.hpz : 0;
        double fstates;
        uint64_t sum;
        memset(&R, 0, sizeof R);
        R.o = &o;
        R.data = &data;
        R.stage = st;
        R.quiet = first != last;
        R.total_numel = total;
        R.end_step = o.stop_at > 0 && o.stop_at < o.steps ? o.stop_at : o.steps;
        R.loss = (double *)calloc((size_t)o.steps, sizeof(double));
        if (keep_all) R.final_params = (float *)calloc(total, sizeof(float));
        if (o.log_path && st == last) R.log = fopen(o.log_path, "w");
        if (!R.loss || (keep_all && !R.final_params) || (o.log_path && st == last && !R.log)) {
            if (!R.loss || (keep_all && !R.final_params))
                fprintf(stderr, "out of memory: cannot allocate %zu bytes of losses (--steps %d) and %zu bytes of final "
                        "params\n", (size_t)o.steps * sizeof(double), o.steps, keep_all ? total * sizeof(float) : 0);
            else fprintf(stderr, "--log %s: cannot write it: %s\n", o.log_path, strerror(errno));
            if (R.log) fclose(R.log);
            free(R.loss);
            free(R.final_params);
            gpt2_data_free(&data);
            return finish(1);
        }
        if (R.log) fprintf(R.log, "step,loss,lr,grad_norm,val_loss\n");
        r = launch(&R);
        if (R.log) fclose(R.log);
        if (r != ZERO_OK || R.first_step >= R.end_step) {
            if (r != ZERO_OK) fprintf(stderr, "stage %d failed: %s\n", st, example_flags_named(first_error(&R), err, sizeof err));
            else fprintf(stderr, "the checkpoint is at step %d: nothing to do up to step %d\n", R.first_step, R.end_step);
            free(R.loss);
            free(R.final_params);
            gpt2_data_free(&data);
            return finish(1);
        }
        sum = R.final_params ? fnv1a64(FNV1A64_START, R.final_params, total * sizeof(float)) : R.params_sum;
        meas_t = R.traffic.bytes[ZERO_COLL_ALL_GATHER] + R.traffic.bytes[ZERO_COLL_REDUCE_SCATTER] +
                 R.traffic.bytes[ZERO_COLL_ALL_REDUCE] + R.traffic.bytes[ZERO_COLL_BROADCAST];
        /* MiCS: memory is the flat engine's at N = S (stage 0 runs flat) */
        nstates = o.mics_shard_size > 0 && st >= 1 ? o.mics_shard_size : o.ranks;
        gpt2_formula_traffic_nodes(st, (double)R.psi, (double)R.frozen, o.ranks, o.accum, es, o.ranks_per_node,
                                   o.mics_shard_size, H, ft);
        fstates = gpt2_formula_states_k(st, (double)R.psi, (double)R.frozen, nstates, o.accum, es,
                                        o.odtype == ZERO_BF16 ? 6 : 12) +
                  (H ? es * (double)R.psi / H : 0.0);
        for (k = 0; k < ZERO_COLL_CONTROL; k++) {
            mi += R.traffic.intra_bytes[k];
            mo += R.traffic.inter_bytes[k];
        }
        if (first != last) {
            printf("%-5d | %-9.5f %-9.5f | %-11.0f %-11.0f | %-11.0f %-11.0f | %-8.2f\n", st,
                   R.loss[R.first_step], R.loss[R.end_step - 1], states_of(&R.mem), fstates, meas_t,
                   (hier ? ft[0] : gpt2_formula_traffic_frozen(st, (double)R.psi, (double)R.frozen, o.ranks, o.accum, es)),
                   1e3 * R.seconds / (R.end_step - R.first_step));
            if (hier)
                printf("      | inside nodes %.0f B measured, %.0f B by formula; between nodes %.0f B measured, %.0f B "
                       "by formula\n", mi, ft[1], mo, ft[2]);
            fflush(stdout);
            /* MiCS sums in its own order: stages 1-3 agree with each other, stage 0 runs flat */
            if (st != first && !(o.mics_shard_size > 0 && st == 1) &&
                (sum != ref_sum || R.loss[R.end_step - 1] != ref_final))
                same = 0;
        } else {
            char tiers[128] = "";
            if (states_of(&R.off[0]) + states_of(&R.off[1]) > 0) /* offload: the rest is off the device */
                snprintf(tiers, sizeof tiers, " (+ %.0f B host, %.0f B nvme)", states_of(&R.off[0]),
                         states_of(&R.off[1]));
            printf("model states per rank: %.0f B measured on the device%s, %.0f B by formula (every tier); "
                   "traffic per step: %.0f B measured, %.0f B by formula; Psi = %zu%s\n",
                   states_of(&R.mem), tiers, fstates, meas_t,
                   (hier ? ft[0] : gpt2_formula_traffic_frozen(st, (double)R.psi, (double)R.frozen, o.ranks, o.accum, es)), R.psi,
                   R.frozen ? " (frozen F as below)" : "");
            if (R.frozen) printf("frozen: F = %zu of them (--freeze %s): no gradients, no optimizer state\n", R.frozen, o.freeze);
            if (o.quant_w || o.quant_g) /* ZeRO++: the bytes that crossed, the formula is the exact run's */
                printf("quantized collectives (%s%s%s%s): traffic measured is the quantized bytes, the formula the "
                       "exact run's (docs/engine.md, \"Quantized collectives\")\n",
                       o.quant_w ? "qwZ int8" : "", o.quant_w && o.quant_g ? ", " : "",
                       o.quant_g ? (o.quant_g == 8 ? "qgZ int8" : "qgZ int4") : "",
                       !o.quant_g ? ""
                       : o.quant_levels != 1 && o.ranks_per_node > 1 && o.ranks_per_node < o.ranks
                           ? " two-level"
                           : " flat");
            if (hier)
                printf("traffic per step inside nodes: %.0f B measured, %.0f B by formula; between nodes: %.0f B "
                       "measured, %.0f B by formula (--ranks-per-node %d, --mics-shard-size %d, "
                       "--hpz-partition-size %d)\n", mi, ft[1], mo, ft[2], o.ranks_per_node,
                       o.mics_shard_size, o.hpz);
            printf("final loss %.6f, val loss %.9g, %.2f ms/step, %d step(s) skipped, final loss scale %g\n",
                   R.loss[R.end_step - 1], R.val_loss, 1e3 * R.seconds / (R.end_step - R.first_step), R.skipped,
                   (double)R.final_scale);
            {
                double n = R.end_step - R.first_step, other = R.seconds - R.t_gather - R.t_reduce - R.t_step;
                printf("per step (rank 0): %.2f ms model compute, %.2f ms gathers, %.2f ms gradient reductions, "
                       "%.2f ms optimizer step; %.0f tokens/s\n",
                       1e3 * other / n, 1e3 * R.t_gather / n, 1e3 * R.t_reduce / n, 1e3 * R.t_step / n,
                       n * o.batch * o.accum * o.cfg.seq / R.seconds);
                if (n > 1) /* the first step allocates and faults in: bench/gpt2.sh skips it, as PyTorch's */
                    printf("from the second step on: %.0f tokens/s, %.0f tokens per CPU second (every rank's "
                           "thread)\n", (n - 1) * o.batch * o.accum * o.cfg.seq / R.warm_seconds,
                           (n - 1) * o.batch * o.accum * o.cfg.seq / R.warm_cpu);
            }
        }
        ref_sum = sum;
        ref_final = R.loss[R.end_step - 1];
        if (st == last) {
            if (first != last)
                printf("%s\n", same ? (o.mics_shard_size > 0 ? "stages 1-3 (MiCS): identical losses and "
                                                                 "bit-identical parameters (stage 0 flat)"
                                                               : "stages 0-3: identical losses and bit-identical parameters")
                                    : "WARNING: the stages differ");
            printf("val loss: %.9g\n", R.val_loss);
            printf("params checksum: %016llx\n", (unsigned long long)sum);
            /* config.json's keys the weights do not fix come from --init DIR's (or a resumed
               checkpoint's copy): --export writes them, and --save keeps a copy beside the
               checkpoint for zero-ckpt export --hf */
            if (o.init_dir) snprintf(base, sizeof base, "%s/config.json", o.init_dir);
            else if (o.resume_dir) snprintf(base, sizeof base, "%s/config.json", o.resume_dir);
            if (base[0] && access(base, R_OK) != 0) base[0] = '\0';
            if (o.save_dir && base[0] && writer &&
                gpt2_hf_config_write_from(o.save_dir, o.cfg.layers, o.cfg.heads, o.cfg.channels, o.cfg.max_seq,
                                          o.cfg.vocab, "float32", base, err, sizeof err) != 0) {
                fprintf(stderr, "--save: %s\n", err);
                free(R.loss);
                free(R.final_params);
                gpt2_data_free(&data);
                return finish(1);
            }
            if (o.export_dir && writer) {
                if (gpt2_hf_weights_write(o.export_dir, &o.cfg, R.final_params, err, sizeof err) != 0 ||
                    gpt2_hf_config_write_from(o.export_dir, o.cfg.layers, o.cfg.heads, o.cfg.channels, o.cfg.max_seq,
                                              o.cfg.vocab, "float32", base[0] ? base : NULL, err, sizeof err) != 0) {
                    fprintf(stderr, "--export: %s\n", err);
                    free(R.loss);
                    free(R.final_params);
                    gpt2_data_free(&data);
                    return finish(1);
                }
                printf("exported %s/config.json and model.safetensors (fp32): GPT2LMHeadModel.from_pretrained loads "
                       "them\n", o.export_dir);
            }
            if (o.sample > 0) printf("sample:\n%s\n", R.sample);
        }
        free(R.loss);
        free(R.final_params);
    }
    gpt2_data_free(&data);
    return finish(same ? 0 : 1);
}
