/* train_gpt2.cu - GPT-2 (Hugging Face's GPT2LMHeadModel) trained with ZeRO stages 0-3 on
   GPUs: the model of examples/train_gpt2.c, on the CUDA device (zero_cuda.h), with the
   matrix products in cuBLAS and the rest in the kernels of examples/gpt2_kernels.cuh.

   Everything that is not compute is examples/gpt2_common.h, shared with the CPU example:
   the flags, the parameter table (Hugging Face's names and shapes; group 0 holds wte, wpe
   and ln_f, group 1 + l holds block l), the initial values, the data and each rank's
   slice of every global batch, the learning-rate schedule. So the same flags on the same
   data, from the same initial values (or the same --init file), give the CPU example's
   run, and the two loss curves can be compared (docs/gpt2.md says within what).

   Precision. Parameters and gradients live in the engine in the param dtype (--dtype f32,
   bf16 or f16; f16 with the engine's dynamic loss scale). The model computes in fp32:
   each gathered group is widened once into an fp32 copy, every product is an fp32 cuBLAS
   GEMM (CUBLAS_COMPUTE_32F, no TF32), every kernel runs in fp32, and a group's gradients
   are summed in an fp32 buffer and rounded once into the engine's gradient buffer. That
   is the CPU example's arithmetic (16-bit params widened, fp32 sums), so bf16 and f16
   runs differ from it only by summation order.

   Ranks:
     - one process per GPU over NCCL (zero_nccl.h), the ranks from the launcher:
           torchrun --standalone --nproc-per-node=8 --no-python build/cuda/train_gpt2 --stage 3
           mpirun -np 8 build/cuda/train_gpt2 --stage 3
       (one process without a launcher is rank 0 of 1);
     - --ranks N: N ranks as threads of this process on GPU 0, over the single-process
       device comm of zero_cuda.h (zero_cuda_local_comm_create): for tests.
   Without --stage (as the CPU demo) it trains stage 0, 1, 2 and 3 in turn and says
   whether their losses and final parameters agree bit for bit (they must where the comm
   sums all-reduce and reduce-scatter in the same order: the engine hands every stage the
   same parameter bits and every kernel here is deterministic); over NCCL at 3 or more
   ranks, whose two collectives sum in different orders, every loss within a bound
   (gg_stage_loss_bound).

   --save DIR / --resume DIR write and read the engine's checkpoints with the data position
   as client state (gpt2_client), so a resumed run continues the straight run's batches,
   at any stage and world size; --stop-at S stops after step S with the schedule of
   --steps, so that a resume continues it.

   --sample N ends with N tokens generated as the CPU example does (--tokenizer: as text).
   Not supported here, refused with a message: --device-memory (a budget of the CPU
   example's host device), --tile-embedding, --export, --freeze, --offload-activations and
   --dropout P > 0 (train_gpt2.c has them). --lr-embed, the AdamW flags, --offload-ratio,
   --delayed-update-after, --optimizer-dtype, --ranks-per-node, --mics-shard-size,
   --hpz-partition-size and the ZeRO++ flags work as there (one engine descriptor for both,
   gpt2_engine_desc).

   Status: compiled and linked with nvcc, warnings as errors; never run on a GPU; runs on
   the CPU under the harness of tests/cudasim (make test-cuda-sim, tests/cudasim/examples.sh).
   docs/gpt2_cuda.md has the whole story and the GPU check (tools/gpt2_gpu_check.sh). */
#define ZERO_IMPLEMENTATION
#define ZERO_CUDA_IMPLEMENTATION
#define ZERO_NCCL_IMPLEMENTATION
#include "zero.h"
#include "zero_cuda.h"
#include "zero_nccl.h"
#include "examples/gpt2_common.h" /* flags, tensors, init, data, schedule: as train_gpt2.c */
#include "examples/gpt2_cuda_host.h" /* the products as GEMMs, token lists, chunks: tested on the CPU */
#include "examples/gpt2_kernels.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROG "train_gpt2.cu"

/* ---- errors: every CUDA, cuBLAS and engine call is checked (examples/cuda_check.h) ---------- */

#include "cuda_check.h"

/* a kernel launch on the run's stream, then its launch error */
#define LAUNCH(kernel, blocks, ...)                                                                  \
    do {                                                                                             \
        ZERO_CUDA_LAUNCH(kernel, (blocks), GK_THREADS, 0, R->st, __VA_ARGS__);                         \
        CUDA(cudaGetLastError());                                                                    \
    } while (0)

/* ---- one rank's run --------------------------------------------------------------------------- */

/* Device buffers of the model: what the backward needs from the forward (per layer, l-th
   slice of each), and scratch. All fp32 except the token lists. */
typedef struct acts {
    float *encoded;                        /* [N, C] wte + wpe                         */
    float *ln1, *ln1_mean, *ln1_rstd;      /* [L][N, C], [L][N], [L][N]                */
    float *qkv;                            /* [L][N, 3C]                               */
    float *att;                            /* [L][B NH, T, T] softmax                  */
    float *atty;                           /* [L][N, C] heads merged                   */
    float *res2;                           /* [L][N, C] x + attn                       */
    float *ln2, *ln2_mean, *ln2_rstd;      /* [L][N, C], [L][N], [L][N]                */
    float *fch, *fch_gelu;                 /* [L][N, 4C]                               */
    float *res3;                           /* [L][N, C] the block's output             */
    float *lnf, *lnf_mean, *lnf_rstd;      /* [N, C], [N], [N]                         */
    float *logits;                         /* [N, V], the gradient after the loss      */
    float *losses;                         /* [N]                                      */
    /* scratch */
    float *q, *k, *v, *dq, *dk, *dv;       /* [B NH, T, hs] each                       */
    float *ybuf;                           /* [N, C] attention output per head / grad  */
    float *scores;                         /* [B NH, T, T] attention scores' gradient  */
    float *tmp;                            /* [N, C] a projection before its residual  */
    float *dres;                           /* [N, C] gradient along the residual stream */
    float *dbig;                           /* [N, 4C]                                  */
    float *dsmall;                         /* [N, C]                                   */
    float *dqkv;                           /* [N, 3C]                                  */
    float *part_b, *part_w;                /* [chunks, 4C] column-sum partials         */
    double *loss_sum;                      /* [2]: train, val; summed over micro-steps */
    int *tok, *tgt;                        /* [N]                                      */
    int *uniq, *start, *pos;               /* [V], [V + 1], [N]: wte's backward lists  */
} acts;

/* What one stage's run gave (rank 0's view). */
typedef struct stage_result {
    double *loss;        /* [steps] mean train loss of each step            */
    int first, end;      /* the steps run: [first, end) (first > 0 resumed) */
    double val;          /* the validation loss after the last step         */
    double ms_per_step;
    int skipped;         /* steps skipped for inf/NaN                       */
    float final_scale;   /* the loss scale after the last step              */
    uint64_t checksum;   /* FNV-1a 64 of the final fp32 master weights      */
    char sample[4096];   /* --sample's text                                  */
    int ok;
} stage_result;

/* What every rank shares (the --ranks threads) or has alone (an NCCL process). */
typedef struct shared {
    const gpt2_opts *o;
    const gpt2_data *data;
    int device;
    const zero_bootstrap_desc *boot; /* NCCL: the launcher's view; NULL for --ranks    */
    float *final;                    /* every tensor's fp32 master, each rank writing
                                        the part it owns (all of it with --ranks or one
                                        process; this process's part over NCCL)        */
    size_t total;                    /* elements of final                              */
    stage_result res[4];             /* rank 0's results per stage                     */
} shared;

typedef struct gpu_run {
    shared *sh;
    const gpt2_opts *o;
    const gpt2_data *data;
    int rank, world, stage;
    int B, T, C, NH, hs, V, L; /* B = this rank's sequences per micro-step */
    size_t N;                  /* B * T                                     */
    size_t rows_per_chunk, chunks;
    zero_device *dev;
    zero_comm *comm;
    zero_engine *e;
    cublasHandle_t blas;
    cudaStream_t st;
    gpt2_tensor *t;
    acts a;
    void *block; /* the one cudaMalloc behind acts */
    /* fp32 copies of the groups: slot 0 = group 0 (embeddings), slot 1 = the block in use.
       16-bit params are widened into them; f32 params are copied too, so that every GEMM
       operand sits at the same offset from a 256-byte aligned base (cudaMalloc) at every
       stage and rank: cuBLAS picks its kernel by the operands' alignment, and the engine's
       buffers (gathered, sharded, pooled) are only 64-byte aligned, at addresses that
       differ between stages. */
    float *pf32[2], *gf32[2];
    void *gdev[2];      /* the engine's gradient buffer of the group in each slot   */
    int grad_group[2];  /* the group whose gradients the slot sums now, or -1      */
    float *p0;          /* group 0's fp32 params, from the forward's LM head on     */
    /* host: the token lists uploaded each micro-step live in pinned memory, two sets used
       in turn (hset[cur]); a set is refilled only after its last upload has completed
       (hev[cur]), so the copies run asynchronously while the other set is filled */
    int *hset[2];
    cudaEvent_t hev[2];
    int cur;
    int *hx, *hy, *huniq, *hstart, *hpos, *hcount;
    float *hlogits;
    int U; /* distinct tokens of the micro-batch */
} gpu_run;

static int slot_of(int group) { return group == 0 ? 0 : 1; }

static size_t group_numel(const gpu_run *R, int g)
{
    zero_group_info gi;
    memset(&gi, 0, sizeof gi);
    if (zero_plan_group(zero_engine_plan(R->e), g, &gi) != ZERO_OK) return 0;
    return gi.numel;
}

/* Group g's parameters in fp32 for this micro-step's work on the stream: gathered by the
   engine (an all-gather at stage 3), widened into the slot's copy for 16-bit params.
   Needs a zero_engine_release(g) like the gather it makes. */
static zero_result params_f32(gpu_run *R, int g, float **out)
{
    zero_result r;
    void *p;
    int s = slot_of(g);
    r = zero_engine_gather(R->e, g, &p);
    if (r != ZERO_OK) return r;
    if (!R->pf32[s]) {
        *out = (float *)p;
        return ZERO_OK;
    }
    *out = R->pf32[s];
    return R->dev->ops->cast(R->dev, ZERO_QUEUE_COMPUTE, R->pf32[s], ZERO_F32, p, R->o->dtype, group_numel(R, g));
}

/* Group g's gradient buffer in fp32, zero when first handed out in a micro-step; a later
   call before grads_done returns the same buffer with what was added to it (the tied wte
   gets the LM head's gradient first and the embedding's last). */
static zero_result grads_f32(gpu_run *R, int g, float **out)
{
    zero_result r;
    void *p;
    int s = slot_of(g);
    r = zero_engine_grads(R->e, g, &p);
    if (r != ZERO_OK) return r;
    R->gdev[s] = p;
    if (!R->gf32[s]) {
        *out = (float *)p; /* f32: the engine's buffer, zero-filled by the engine */
        return ZERO_OK;
    }
    *out = R->gf32[s];
    if (R->grad_group[s] == g) return ZERO_OK;
    R->grad_group[s] = g;
    return R->dev->ops->fill_zero(R->dev, ZERO_QUEUE_COMPUTE, R->gf32[s], group_numel(R, g) * sizeof(float));
}

/* Group g's gradients are complete: rounded once into the engine's buffer (16-bit), then
   handed to the engine (its reduction starts). */
static zero_result grads_done(gpu_run *R, int g)
{
    zero_result r;
    int s = slot_of(g);
    if (R->gf32[s]) {
        r = R->dev->ops->cast(R->dev, ZERO_QUEUE_COMPUTE, R->gdev[s], R->o->dtype, R->gf32[s], ZERO_F32,
                              group_numel(R, g));
        if (r != ZERO_OK) return r;
        R->grad_group[s] = -1;
    }
    return zero_engine_grads_ready(R->e, g);
}

static zero_result gemm(gpu_run *R, gg_gemm g)
{
    zero_result r = ZERO_OK;
    const cublasOperation_t ta = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (!gg_valid(&g)) return fail(ZERO_ERROR_INVALID_ARGUMENT, "gemm", "malformed product (a bug)");
    if (g.batch == 1)
        BLAS(cublasGemmEx(R->blas, ta, tb, g.m, g.n, g.k, &g.alpha, g.A, CUDA_R_32F, g.lda, g.B, CUDA_R_32F, g.ldb,
                          &g.beta, g.C, CUDA_R_32F, g.ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        BLAS(cublasGemmStridedBatchedEx(R->blas, ta, tb, g.m, g.n, g.k, &g.alpha, g.A, CUDA_R_32F, g.lda, g.sa, g.B,
                                        CUDA_R_32F, g.ldb, g.sb, &g.beta, g.C, CUDA_R_32F, g.ldc, g.sc, g.batch,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
done:
    return r;
}

/* pointer to tensor k of block l (or of group 0 when l < 0) inside a group's buffer */
static float *tp(const gpu_run *R, float *base, int l, int k)
{
    int i = l < 0 ? k : gpt2_block_tensor(l, k);
    return base + R->t[i].offset;
}

/* dst[c] += column sums of dout [rows, width] (a bias gradient); with x/mean/rstd also
   dst_w[c] += column sums of dout * norm(x) (LayerNorm's weight gradient). */
static zero_result colsums(gpu_run *R, float *dst_b, float *dst_w, const float *dout, const float *x,
                           const float *mean, const float *rstd, int width)
{
    zero_result r = ZERO_OK;
    LAUNCH(gk_colsum_part, gk_blocks(R->chunks * width), R->a.part_b, R->a.part_w, dout, x, mean, rstd, R->N, width,
           R->rows_per_chunk);
    LAUNCH(gk_colsum_finish, gk_blocks((size_t)width), dst_b, R->a.part_b, R->chunks, width);
    if (x) LAUNCH(gk_colsum_finish, gk_blocks((size_t)width), dst_w, R->a.part_w, R->chunks, width);
done:
    return r;
}

/* LayerNorm backward: dx += input gradient, dw/db += parameter gradients. */
static zero_result layernorm_bwd(gpu_run *R, float *dx, float *dw, float *db, const float *dout, const float *x,
                                 const float *w, const float *mean, const float *rstd)
{
    zero_result r = ZERO_OK;
    LAUNCH(gk_layernorm_bwd_x, gk_row_blocks(R->N), dx, dout, x, w, mean, rstd, R->N, R->C);
    r = colsums(R, db, dw, dout, x, mean, rstd, R->C);
done:
    return r;
}

/* y = x W + b (Conv1D) */
static zero_result linear_fwd(gpu_run *R, float *y, const float *x, const float *W, const float *b, int in, int out)
{
    zero_result r = ZERO_OK;
    TRY(gemm(R, gg_linear_fwd(y, x, W, (int)R->N, in, out)));
    LAUNCH(gk_add_bias, gk_blocks(R->N * out), y, b, R->N, out);
done:
    return r;
}

/* dW += x^T dy, db += colsum(dy), dx = dy W^T */
static zero_result linear_bwd(gpu_run *R, float *dx, float *dW, float *db, const float *dy, const float *x,
                              const float *W, int in, int out)
{
    zero_result r = ZERO_OK;
    TRY(gemm(R, gg_linear_bwd_w(dW, x, dy, (int)R->N, in, out)));
    TRY(colsums(R, db, NULL, dy, NULL, NULL, NULL, out));
    TRY(gemm(R, gg_linear_bwd_x(dx, dy, W, (int)R->N, in, out, 0.0f)));
done:
    return r;
}

static size_t att_numel(const gpu_run *R) { return (size_t)R->B * R->NH * R->T * R->T; }

/* Causal self-attention of layer l: qkv [N, 3C] -> atty [N, C], saving the softmax. */
static zero_result attention_fwd(gpu_run *R, int l)
{
    acts *a = &R->a;
    zero_result r = ZERO_OK;
    const int BH = R->B * R->NH;
    const float alpha = 1.0f / sqrtf((float)R->hs);
    float *qkv = a->qkv + (size_t)l * R->N * 3 * R->C, *att = a->att + (size_t)l * att_numel(R);
    LAUNCH(gk_qkv_split, gk_blocks(R->N * R->C), qkv, a->q, a->k, a->v, R->B, R->T, R->NH, R->hs, 0);
    TRY(gemm(R, gg_att_scores(att, a->q, a->k, BH, R->T, R->hs, alpha)));
    LAUNCH(gk_softmax_causal_fwd, gk_row_blocks((size_t)BH * R->T), att, (size_t)BH * R->T, R->T);
    TRY(gemm(R, gg_att_values(a->ybuf, att, a->v, BH, R->T, R->hs)));
    LAUNCH(gk_heads_merge, gk_blocks(R->N * R->C), a->atty + (size_t)l * R->N * R->C, a->ybuf, R->B, R->T, R->NH,
           R->hs, 0);
done:
    return r;
}

/* Its backward: datty [N, C] -> dqkv [N, 3C]. */
static zero_result attention_bwd(gpu_run *R, int l, float *datty)
{
    acts *a = &R->a;
    zero_result r = ZERO_OK;
    const int BH = R->B * R->NH;
    const float alpha = 1.0f / sqrtf((float)R->hs);
    float *qkv = a->qkv + (size_t)l * R->N * 3 * R->C, *att = a->att + (size_t)l * att_numel(R);
    LAUNCH(gk_qkv_split, gk_blocks(R->N * R->C), qkv, a->q, a->k, a->v, R->B, R->T, R->NH, R->hs, 0);
    LAUNCH(gk_heads_merge, gk_blocks(R->N * R->C), datty, a->ybuf, R->B, R->T, R->NH, R->hs, 1);
    TRY(gemm(R, gg_att_bwd_a(a->scores, a->ybuf, a->v, BH, R->T, R->hs)));
    TRY(gemm(R, gg_att_bwd_v(a->dv, att, a->ybuf, BH, R->T, R->hs)));
    LAUNCH(gk_softmax_causal_bwd, gk_row_blocks((size_t)BH * R->T), a->scores, att, (size_t)BH * R->T, R->T);
    TRY(gemm(R, gg_att_bwd_q(a->dq, a->scores, a->k, BH, R->T, R->hs, alpha)));
    TRY(gemm(R, gg_att_bwd_k(a->dk, a->scores, a->q, BH, R->T, R->hs, alpha)));
    LAUNCH(gk_qkv_split, gk_blocks(R->N * R->C), a->dqkv, a->dq, a->dk, a->dv, R->B, R->T, R->NH, R->hs, 1);
done:
    return r;
}

/* The micro-batch's tokens to the device, and for wte's backward the distinct tokens with
   the positions of each in increasing order (a counting sort on the host). */
static zero_result upload_batch(gpu_run *R)
{
    zero_device *dev = R->dev;
    zero_result r = ZERO_OK;
    int u = gg_token_lists(R->hx, R->N, R->V, R->hcount, R->huniq, R->hstart, R->hpos);
    R->U = u;
    TRY(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, R->a.tok, R->hx, sizeof(int) * R->N));
    TRY(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, R->a.tgt, R->hy, sizeof(int) * R->N));
    TRY(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, R->a.uniq, R->huniq, sizeof(int) * (size_t)u));
    TRY(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, R->a.start, R->hstart, sizeof(int) * (size_t)(u + 1)));
    TRY(dev->ops->upload(dev, ZERO_QUEUE_COMPUTE, R->a.pos, R->hpos, sizeof(int) * R->N));
    CUDA(cudaEventRecord(R->hev[R->cur], R->st)); /* this set is free again after it */
done:
    return r;
}

/* Points hx, hy and the token lists at the other pinned set, once its last upload has
   completed: call before filling hx and hy for upload_batch. */
static zero_result host_next(gpu_run *R)
{
    zero_result r = ZERO_OK;
    int *p;
    R->cur ^= 1;
    CUDA(cudaEventSynchronize(R->hev[R->cur]));
    p = R->hset[R->cur];
    R->hx = p, p += R->N;
    R->hy = p, p += R->N;
    R->hpos = p, p += R->N;
    R->huniq = p, p += R->V;
    R->hstart = p;
done:
    return r;
}

/* The forward of the uploaded micro-batch: the loss of each position, its mean added to
   a.loss_sum[which], and the logits replaced by the gradient of dscale * the positions'
   summed loss; which < 0: the logits only (no loss). Group 0 stays gathered (R->p0) for
   the backward: the caller releases it. dump: rank 0's logits of the first micro-batch go
   to --dump-logits. */
static zero_result forward(gpu_run *R, int which, float dscale, int dump)
{
    acts *a = &R->a;
    zero_result r = ZERO_OK;
    const int C = R->C, L = R->L;
    const size_t N = R->N, NC = R->N * R->C;
    float *P, *x = a->encoded;
    int l;
    TRY(params_f32(R, 0, &P));
    LAUNCH(gk_encoder_fwd, gk_blocks(NC), a->encoded, a->tok, tp(R, P, -1, GPT2_WTE), tp(R, P, -1, GPT2_WPE), N, R->T,
           C);
    TRY(zero_engine_release(R->e, 0));
    for (l = 0; l < L; l++) {
        float *ln1 = a->ln1 + l * NC, *qkv = a->qkv + l * NC * 3, *atty = a->atty + l * NC, *res2 = a->res2 + l * NC;
        float *ln2 = a->ln2 + l * NC, *fch = a->fch + l * NC * 4, *gel = a->fch_gelu + l * NC * 4;
        float *res3 = a->res3 + l * NC;
        TRY(params_f32(R, 1 + l, &P));
        LAUNCH(gk_layernorm_fwd, gk_row_blocks(N), ln1, a->ln1_mean + l * N, a->ln1_rstd + l * N, x,
               tp(R, P, l, GPT2_LN1_W), tp(R, P, l, GPT2_LN1_B), N, C);
        TRY(linear_fwd(R, qkv, ln1, tp(R, P, l, GPT2_QKV_W), tp(R, P, l, GPT2_QKV_B), C, 3 * C));
        TRY(attention_fwd(R, l));
        TRY(gemm(R, gg_linear_fwd(a->tmp, atty, tp(R, P, l, GPT2_ATTPROJ_W), (int)N, C, C)));
        LAUNCH(gk_bias_residual, gk_blocks(NC), res2, x, a->tmp, tp(R, P, l, GPT2_ATTPROJ_B), N, C);
        LAUNCH(gk_layernorm_fwd, gk_row_blocks(N), ln2, a->ln2_mean + l * N, a->ln2_rstd + l * N, res2,
               tp(R, P, l, GPT2_LN2_W), tp(R, P, l, GPT2_LN2_B), N, C);
        TRY(linear_fwd(R, fch, ln2, tp(R, P, l, GPT2_FC_W), tp(R, P, l, GPT2_FC_B), C, 4 * C));
        LAUNCH(gk_gelu_fwd, gk_blocks(NC * 4), gel, fch, NC * 4);
        TRY(gemm(R, gg_linear_fwd(a->tmp, gel, tp(R, P, l, GPT2_FCPROJ_W), (int)N, 4 * C, C)));
        LAUNCH(gk_bias_residual, gk_blocks(NC), res3, res2, a->tmp, tp(R, P, l, GPT2_FCPROJ_B), N, C);
        TRY(zero_engine_release(R->e, 1 + l));
        x = res3;
    }
    /* ln_f and the LM head: group 0 again (wte is tied) */
    TRY(params_f32(R, 0, &P));
    R->p0 = P;
    LAUNCH(gk_layernorm_fwd, gk_row_blocks(N), a->lnf, a->lnf_mean, a->lnf_rstd, x, tp(R, P, -1, GPT2_LNF_W),
           tp(R, P, -1, GPT2_LNF_B), N, C);
    TRY(gemm(R, gg_lmhead_fwd(a->logits, a->lnf, tp(R, P, -1, GPT2_WTE), (int)N, C, R->V)));
    if (dump) {
        FILE *f;
        TRY(R->dev->ops->download(R->dev, ZERO_QUEUE_COMPUTE, R->hlogits, a->logits, sizeof(float) * N * R->V));
        TRY(R->dev->ops->sync(R->dev, ZERO_QUEUE_COMPUTE));
        f = fopen(R->o->logits_path, "wb");
        if (!f || fwrite(R->hlogits, sizeof(float), N * R->V, f) != N * R->V) {
            if (f) fclose(f);
            r = fail(ZERO_ERROR_IO, R->o->logits_path, "cannot write the logits");
            goto done;
        }
        if (fclose(f) != 0) {
            r = fail(ZERO_ERROR_IO, R->o->logits_path, "cannot write the logits");
            goto done;
        }
    }
    if (which < 0) goto done;
    {
        unsigned rows = (unsigned)(N < 65536 ? N : 65536);
        ZERO_CUDA_LAUNCH(gk_crossentropy, rows, GK_THREADS, 0, R->st, a->logits, a->losses, a->tgt, N, R->V, dscale);
        CUDA(cudaGetLastError());
    }
    ZERO_CUDA_LAUNCH(gk_loss_mean, 1, GK_THREADS, 0, R->st, a->loss_sum + which, a->losses, N);
    CUDA(cudaGetLastError());
done:
    return r;
}

/* The backward after forward(): block by block in reverse, each group's gradients handed
   to the engine as soon as they are complete; group 0 (wte: LM head and embedding; wpe;
   ln_f) last. */
static zero_result backward(gpu_run *R)
{
    acts *a = &R->a;
    zero_result r = ZERO_OK;
    const int C = R->C, L = R->L;
    const size_t N = R->N, NC = R->N * R->C;
    float *P, *G, *P0 = R->p0, *G0;
    int l;
    TRY(grads_f32(R, 0, &G0));
    TRY(gemm(R, gg_lmhead_bwd_w(tp(R, G0, -1, GPT2_WTE), a->lnf, a->logits, (int)N, C, R->V)));
    TRY(gemm(R, gg_lmhead_bwd_x(a->dsmall, a->logits, tp(R, P0, -1, GPT2_WTE), (int)N, C, R->V)));
    CUDA(cudaMemsetAsync(a->dres, 0, sizeof(float) * NC, R->st));
    TRY(layernorm_bwd(R, a->dres, tp(R, G0, -1, GPT2_LNF_W), tp(R, G0, -1, GPT2_LNF_B), a->dsmall,
                      a->res3 + (size_t)(L - 1) * NC, tp(R, P0, -1, GPT2_LNF_W), a->lnf_mean, a->lnf_rstd));
    TRY(zero_engine_release(R->e, 0));
    for (l = L - 1; l >= 0; l--) {
        float *ln1 = a->ln1 + l * NC, *atty = a->atty + l * NC, *res2 = a->res2 + l * NC;
        float *ln2 = a->ln2 + l * NC, *fch = a->fch + l * NC * 4, *gel = a->fch_gelu + l * NC * 4;
        float *xin = l ? a->res3 + (size_t)(l - 1) * NC : a->encoded;
        TRY(params_f32(R, 1 + l, &P));
        TRY(grads_f32(R, 1 + l, &G));
        /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))) */
        TRY(linear_bwd(R, a->dbig, tp(R, G, l, GPT2_FCPROJ_W), tp(R, G, l, GPT2_FCPROJ_B), a->dres, gel,
                       tp(R, P, l, GPT2_FCPROJ_W), 4 * C, C));
        LAUNCH(gk_gelu_bwd, gk_blocks(NC * 4), a->dbig, fch, NC * 4);
        TRY(linear_bwd(R, a->dsmall, tp(R, G, l, GPT2_FC_W), tp(R, G, l, GPT2_FC_B), a->dbig, ln2,
                       tp(R, P, l, GPT2_FC_W), C, 4 * C));
        TRY(layernorm_bwd(R, a->dres, tp(R, G, l, GPT2_LN2_W), tp(R, G, l, GPT2_LN2_B), a->dsmall, res2,
                          tp(R, P, l, GPT2_LN2_W), a->ln2_mean + l * N, a->ln2_rstd + l * N));
        /* attention: res2 = x + c_proj(attn(c_attn(ln_1(x)))) */
        TRY(linear_bwd(R, a->dsmall, tp(R, G, l, GPT2_ATTPROJ_W), tp(R, G, l, GPT2_ATTPROJ_B), a->dres, atty,
                       tp(R, P, l, GPT2_ATTPROJ_W), C, C));
        TRY(attention_bwd(R, l, a->dsmall));
        TRY(linear_bwd(R, a->dsmall, tp(R, G, l, GPT2_QKV_W), tp(R, G, l, GPT2_QKV_B), a->dqkv, ln1,
                       tp(R, P, l, GPT2_QKV_W), C, 3 * C));
        TRY(layernorm_bwd(R, a->dres, tp(R, G, l, GPT2_LN1_W), tp(R, G, l, GPT2_LN1_B), a->dsmall, xin,
                          tp(R, P, l, GPT2_LN1_W), a->ln1_mean + l * N, a->ln1_rstd + l * N));
        TRY(zero_engine_release(R->e, 1 + l));
        TRY(grads_done(R, 1 + l));
    }
    /* the embeddings: wte's rows of this batch's tokens (after the LM head's part), wpe */
    TRY(grads_f32(R, 0, &G0));
    if (R->U > 0)
        LAUNCH(gk_wte_bwd, gk_blocks((size_t)R->U * C), tp(R, G0, -1, GPT2_WTE), a->dres, a->uniq, a->start, a->pos,
               R->U, C);
    LAUNCH(gk_wpe_bwd, gk_blocks((size_t)R->T * C), tp(R, G0, -1, GPT2_WPE), a->dres, R->B, R->T, C);
    TRY(grads_done(R, 0));
done:
    return r;
}

/* Carves the activation buffers out of one allocation (base NULL: only counts). */
static size_t carve_all(gpu_run *R, char *base)
{
    acts *a = &R->a;
    const size_t N = R->N, C = (size_t)R->C, L = (size_t)R->L, V = (size_t)R->V, att = att_numel(R);
    size_t off = 0;
#define CARVE(ptr, type, count)                                                     \
    do {                                                                            \
        ptr = base ? (type *)(base + off) : NULL;                                   \
        off += ((sizeof(type) * (size_t)(count) + 255) / 256) * 256;                \
    } while (0)
    CARVE(a->encoded, float, N * C);
    CARVE(a->ln1, float, L * N * C);
    CARVE(a->ln1_mean, float, L * N);
    CARVE(a->ln1_rstd, float, L * N);
    CARVE(a->qkv, float, L * N * 3 * C);
    CARVE(a->att, float, L * att);
    CARVE(a->atty, float, L * N * C);
    CARVE(a->res2, float, L * N * C);
    CARVE(a->ln2, float, L * N * C);
    CARVE(a->ln2_mean, float, L * N);
    CARVE(a->ln2_rstd, float, L * N);
    CARVE(a->fch, float, L * N * 4 * C);
    CARVE(a->fch_gelu, float, L * N * 4 * C);
    CARVE(a->res3, float, L * N * C);
    CARVE(a->lnf, float, N * C);
    CARVE(a->lnf_mean, float, N);
    CARVE(a->lnf_rstd, float, N);
    CARVE(a->logits, float, N * V);
    CARVE(a->losses, float, N);
    CARVE(a->q, float, N * C);
    CARVE(a->k, float, N * C);
    CARVE(a->v, float, N * C);
    CARVE(a->dq, float, N * C);
    CARVE(a->dk, float, N * C);
    CARVE(a->dv, float, N * C);
    CARVE(a->ybuf, float, N * C);
    CARVE(a->scores, float, att);
    CARVE(a->tmp, float, N * C);
    CARVE(a->dres, float, N * C);
    CARVE(a->dbig, float, N * 4 * C);
    CARVE(a->dsmall, float, N * C);
    CARVE(a->dqkv, float, N * 3 * C);
    CARVE(a->part_b, float, R->chunks * 4 * C);
    CARVE(a->part_w, float, R->chunks * 4 * C);
    CARVE(a->loss_sum, double, 2);
    CARVE(a->tok, int, N);
    CARVE(a->tgt, int, N);
    CARVE(a->uniq, int, V);
    CARVE(a->start, int, V + 1);
    CARVE(a->pos, int, N);
#undef CARVE
    return off;
}

static double seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The loss summed in a.loss_sum[which] (then zeroed), summed over ranks by the engine's
   tagged user all-reduce, divided by div. */
static zero_result mean_loss(gpu_run *R, int which, double div, double *out)
{
    zero_result r = ZERO_OK;
    double v = 0;
    TRY(R->dev->ops->download(R->dev, ZERO_QUEUE_COMPUTE, &v, R->a.loss_sum + which, sizeof v));
    TRY(R->dev->ops->sync(R->dev, ZERO_QUEUE_COMPUTE));
    CUDA(cudaMemsetAsync(R->a.loss_sum + which, 0, sizeof(double), R->st));
    TRY(zero_engine_allreduce(R->e, &v, 1, ZERO_F64, ZERO_OP_SUM));
    *out = v / div;
done:
    return r;
}

/* Validation loss over --val-batches batches of the val split (forward only). */
static zero_result val_loss(gpu_run *R, double *out)
{
    const gpt2_opts *o = R->o;
    zero_result r = ZERO_OK;
    int b;
    for (b = 0; b < o->val_batches; b++) {
        TRY(host_next(R));
        gpt2_batch(R->data, 1, (uint64_t)b, o->batch, R->T, R->rank * R->B, R->B, R->hx, R->hy);
        TRY(upload_batch(R));
        TRY(forward(R, 1, 0.0f, 0));
        TRY(zero_engine_release(R->e, 0));
    }
    TRY(mean_loss(R, 1, (double)R->world * o->val_batches, out));
done:
    return r;
}


static uint64_t fnv1a64(const void *p, size_t bytes)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 0xcbf29ce484222325ull;
    size_t i;
    for (i = 0; i < bytes; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* train_gpt2.c's text sample: n = --sample tokens after a prompt of the first 16 validation
   tokens, each drawn from the softmax of the last position's logits with the generator rng
   (the same draw as the CPU example; its text may still differ, from the logits' last
   bits). Every rank computes the same (stage 3's gathers need them all). Each token is one
   forward of a single sequence (B = 1: the activations sized for the batch hold it) whose
   first positions are the window of at most T tokens (causal attention: what follows it
   does not change its logits). Text data: the bytes, unprintable ones as '?'; token
   files: the ids, or their text through --tokenizer's vocabulary (gpt2_sample_text). */
static zero_result generate(gpu_run *R, uint64_t *rng, char *out, size_t cap)
{
    const gpt2_opts *o = R->o;
    int n = o->sample, T = R->T, V = R->V, plen = 16, len = 0, i, t, B = R->B;
    size_t N = R->N;
    int *tok = (int *)malloc(sizeof(int) * (size_t)(plen + n));
    float *z = (float *)malloc(sizeof(float) * (size_t)V);
    size_t used = 0;
    zero_result r = ZERO_OK;
    if (!tok || !z) {
        r = fail(ZERO_ERROR_OUT_OF_MEMORY, "malloc", "sample");
        goto done;
    }
    if (plen > T) plen = T;
    for (i = 0; i < plen; i++) tok[i] = R->data->tokens[R->data->ntrain + (size_t)i];
    R->B = 1, R->N = (size_t)T; /* one sequence; restored below */
    for (len = plen; len < plen + n; len++) {
        int start = len > T ? len - T : 0, w = len - start;
        TRY(host_next(R));
        for (t = 0; t < T; t++) {
            R->hx[t] = t < w ? tok[start + t] : 0;
            R->hy[t] = 0;
        }
        TRY(upload_batch(R));
        TRY(forward(R, -1, 0.0f, 0));
        TRY(zero_engine_release(R->e, 0));
        TRY(R->dev->ops->download(R->dev, ZERO_QUEUE_COMPUTE, z, R->a.logits + (size_t)(w - 1) * V,
                                  sizeof(float) * (size_t)V));
        TRY(R->dev->ops->sync(R->dev, ZERO_QUEUE_COMPUTE));
        tok[len] = gpt2_sample_token(z, V, rng);
    }
    used = gpt2_sample_text(o, tok, len, out, cap, used);
done:
    R->B = B, R->N = N;
    if (cap) out[used < cap ? used : cap - 1] = '\0';
    free(tok);
    free(z);
    return r;
}

/* This rank's part of every tensor's fp32 master weights into sh->final (tensors in table
   order, each whole: a rank writes only the range it owns). */
static zero_result keep_params(gpu_run *R)
{
    const gpt2_config *c = &R->o->cfg;
    size_t most = 0, at = 0;
    int i;
    float *buf;
    zero_result r = ZERO_OK;
    for (i = 0; i < gpt2_num_tensors(c); i++)
        if (R->t[i].numel > most) most = R->t[i].numel;
    if (!(buf = (float *)malloc(most * sizeof(float)))) return fail(ZERO_ERROR_OUT_OF_MEMORY, "malloc", "params");
    for (i = 0; i < gpt2_num_tensors(c) && r == ZERO_OK; i++) {
        zero_range own;
        memset(&own, 0, sizeof own);
        r = zero_engine_read_tensor(R->e, R->t[i].id, ZERO_STATE_MASTER, buf, &own);
        if (r == ZERO_OK) memcpy(R->sh->final + at + own.offset, buf + own.offset, own.numel * sizeof(float));
        at += R->t[i].numel;
    }
    free(buf);
    return r;
}

/* The CPU example's engine settings (gpt2_engine_desc: every flag that reaches the engine,
   so the two programs cannot drift apart), with this program's device, comm, pinned staging,
   the engine's default prefetch (the GPU's queues overlap it) and its arena. */
static zero_result engine_desc(const gpu_run *R, zero_engine_desc *d)
{
    const gpt2_opts *o = R->o;
    gpt2_engine_desc(o, R->stage, R->B, d);
    d->prefetch_depth = 0;
    d->pin_memory = 1;
    d->device = R->dev;
    d->comm = R->comm;
    { /* the arena (stages 2-3): this program holds group 0's params and gradients (the tied
         wte) through the backward, beside a block's params, gradients and prefetch; the
         default arena counts the largest group once (docs/engine.md) */
        size_t C = (size_t)o->cfg.channels, pad = 16 * (16 + (size_t)R->comm->world);
        size_t rows = (size_t)(o->cfg.max_seq > o->cfg.seq ? o->cfg.max_seq : o->cfg.seq);
        size_t g0 = ((size_t)o->cfg.vocab + rows) * C + 2 * C + pad;
        size_t blk = 12 * C * C + 13 * C + pad;
        d->max_live_numel = 2 * g0 + 3 * blk;
    }
    return ZERO_OK;
}

/* One stage's training run on this rank's device and comm. */
static zero_result train_stage(gpu_run *R, stage_result *res)
{
    const gpt2_opts *o = R->o;
    zero_engine_desc d;
    zero_result r = ZERO_OK;
    FILE *csv = NULL;
    double t_step, t_run, tokens = (double)o->batch * R->T * o->accum, val = -1;
    int s, k, i, end = o->stop_at > 0 && o->stop_at < o->steps ? o->stop_at : o->steps; /* --stop-at */
    size_t most[2] = {0, 0}, got = 0;
    gpt2_client cl; /* what a checkpoint carries besides the engine: the data position, the shape */
    char why[640];
    gpt2_client_init(&cl, o);
    R->e = NULL;
    R->pf32[0] = R->pf32[1] = R->gf32[0] = R->gf32[1] = NULL;
    R->grad_group[0] = R->grad_group[1] = -1;
    engine_desc(R, &d);
    TRY(zero_engine_create(&d, &R->e));
    TRY(gpt2_add_tensors(R->e, &o->cfg, R->t));
    TRY(zero_engine_commit(R->e));
    TRY(gpt2_offsets(zero_engine_plan(R->e), &o->cfg, R->t));
    if (o->lr_embed != 1.0) { /* --lr-embed: the embeddings' parameter group, as train_gpt2.c */
        TRY(zero_engine_set_tensor_hparams(R->e, R->t[GPT2_WTE].id, o->lr_embed, ZERO_WEIGHT_DECAY_DEFAULT));
        TRY(zero_engine_set_tensor_hparams(R->e, R->t[GPT2_WPE].id, o->lr_embed, ZERO_WEIGHT_DECAY_DEFAULT));
    }
    if (o->init_path) TRY(zero_engine_load_pretrained(R->e, o->init_path, "transformer."));
    else TRY(gpt2_set_init(R->e, &o->cfg, R->t, o->seed));
    if (o->resume_dir) { /* any stage and world size; the data stream continues from the client state */
        TRY(zero_engine_load_client(R->e, o->resume_dir, &cl, sizeof cl, &got));
        if (gpt2_client_check(&cl, got, o, o->resume_dir, why, sizeof why) != 0) { /* every field, and the shape */
            r = fail(ZERO_ERROR_MISMATCH, o->resume_dir, why);
            goto done;
        }
        if (cl.next_step >= end) {
            r = fail(ZERO_ERROR_INVALID_ARGUMENT, o->resume_dir, "the checkpoint is at or past the last step: nothing to do");
            goto done;
        }
    }
    res->first = (int)cl.next_step;
    res->end = end;
    { /* the fp32 copies of the groups (256-aligned, also for f32: see gpu_run) */
        for (i = 0; i < zero_plan_num_groups(zero_engine_plan(R->e)); i++) {
            size_t n = group_numel(R, i);
            if (n > most[slot_of(i)]) most[slot_of(i)] = n;
        }
        for (i = 0; i < 2; i++) {
            CUDA(cudaMalloc((void **)&R->pf32[i], most[i] * sizeof(float)));
            CUDA(cudaMalloc((void **)&R->gf32[i], most[i] * sizeof(float)));
        }
    }
    CUDA(cudaMemsetAsync(R->a.loss_sum, 0, 2 * sizeof(double), R->st));
    if (R->rank == 0) {
        printf("stage %d, %d rank(s), %s params: %d layers, %d heads, %d channels, seq %d, vocab %d; "
               "Psi = %zu; batch %d x accum %d\n",
               R->stage, R->world, zero_dtype_name(o->dtype), R->L, R->NH, R->C, R->T, R->V,
               zero_plan_total_numel(zero_engine_plan(R->e)), o->batch, o->accum);
        gpt2_print_memory(stdout, R->e, R->rank);
        fflush(stdout);
        if (o->log_path) {
            csv = fopen(o->log_path, "w");
            if (!csv) {
                r = fail(ZERO_ERROR_IO, o->log_path, "cannot create the log");
                goto done;
            }
            fprintf(csv, "step,loss,lr,grad_norm,val_loss\n");
        }
    }
    t_run = seconds();
    for (s = (int)cl.next_step; s < end; s++) {
        zero_step_info info;
        double lr = gpt2_lr(o, s), loss, t0 = seconds();
        float scale = zero_engine_loss_scale(R->e);
        TRY(zero_engine_set_lr(R->e, lr));
        for (k = 0; k < o->accum; k++) {
            TRY(host_next(R));
            gpt2_batch(R->data, 0, cl.next_batch++, o->batch, R->T, R->rank * R->B, R->B, R->hx, R->hy);
            TRY(upload_batch(R));
            TRY(forward(R, 0, scale / (float)R->N, s == 0 && k == 0 && R->rank == 0 && o->logits_path != NULL));
            TRY(backward(R));
        }
        TRY(zero_engine_step(R->e, &info));
        if (s + 1 == o->steps) TRY(zero_engine_finish_update(R->e)); /* --delayed-update-after */
        /* a step that waited through a watchdog abort reads undefined values and still
           returns OK: the NCCL comm says whether its collectives really finished */
        if (zero_nccl_is(R->comm)) TRY(zero_nccl_status(R->comm));
        TRY(mean_loss(R, 0, (double)R->world * o->accum, &loss));
        t_step = seconds() - t0;
        val = -1;
        cl.next_step = s + 1;
        if ((o->val_every > 0 && (s + 1) % o->val_every == 0) || s + 1 == end) TRY(val_loss(R, &val));
        res->loss[s] = loss;
        res->skipped += info.skipped != 0;
        if (R->rank == 0) {
            int every = o->log_every > 0 ? o->log_every : 1;
            if (s % every == 0 || s + 1 == end || val >= 0) { /* train_gpt2.c's line */
                printf("step %5d | loss %.6f | lr %.3e | norm %8.4f | %8.2f ms | %8.0f tok/s", s, loss, lr,
                       (double)info.grad_norm, 1e3 * t_step, tokens / t_step);
                if (val >= 0) printf(" | val %.6f", val);
                printf("%s\n", info.skipped ? " | skipped (inf/NaN)" : "");
                fflush(stdout);
            }
            if (csv) { /* train_gpt2.c's --log: step,loss,lr,grad_norm,val_loss */
                fprintf(csv, "%d,%.17g,%.17g,%.9g,", s, loss, lr, (double)info.grad_norm);
                if (val >= 0) fprintf(csv, "%.17g", val);
                fprintf(csv, "\n");
            }
        }
        if (o->save_dir && ((o->save_every > 0 && (s + 1) % o->save_every == 0) || s + 1 == end))
            TRY(zero_engine_save_client(R->e, o->save_dir, &cl, sizeof cl));
    }
    res->val = val;
    res->ms_per_step = 1e3 * (seconds() - t_run) / (end - res->first);
    res->final_scale = zero_engine_loss_scale(R->e);
    /* the final master weights: every rank writes its part, then rank 0 hashes them all */
    TRY(keep_params(R));
    TRY(R->comm->ops->barrier(R->comm));
    if (R->rank == 0) res->checksum = fnv1a64(R->sh->final, R->sh->total * sizeof(float));
    if (o->sample > 0) TRY(generate(R, &cl.rng, res->sample, sizeof res->sample));
    res->ok = 1;
done:
    if (csv && fclose(csv) != 0 && r == ZERO_OK) r = fail(ZERO_ERROR_IO, o->log_path, "cannot write the log");
    zero_engine_destroy(R->e);
    R->e = NULL;
    for (i = 0; i < 2; i++) {
        cudaFree(R->pf32[i]);
        cudaFree(R->gf32[i]);
        R->pf32[i] = R->gf32[i] = NULL;
    }
    return r;
}


/* Everything of one rank: the device and comm (the device comm over host_comm for
   --ranks, else NCCL), cuBLAS, the activations, then each stage asked for in turn. */
static zero_result rank_main(int rank, zero_comm *host_comm, void *user)
{
    shared *sh = (shared *)user;
    const gpt2_opts *o = sh->o;
    gpu_run run, *R = &run;
    zero_cuda_desc cd;
    zero_nccl_desc nd;
    zero_result r = ZERO_OK;
    stage_result mine[4];
    int st, first = o->stage < 0 ? 0 : o->stage, last = o->stage < 0 ? 3 : o->stage;
    size_t bytes;
    memset(&run, 0, sizeof run);
    memset(mine, 0, sizeof mine);
    R->sh = sh;
    memset(&cd, 0, sizeof cd);
    memset(&nd, 0, sizeof nd);
    R->o = o;
    R->data = sh->data;
    R->rank = rank;
    R->L = o->cfg.layers;
    R->NH = o->cfg.heads;
    R->C = o->cfg.channels;
    R->T = o->cfg.seq;
    R->V = o->cfg.vocab;
    R->hs = R->C / R->NH;
    cd.device = sh->device;
    TRY(zero_cuda_device_create(&cd, &R->dev));
    if (host_comm) {
        TRY(zero_cuda_local_comm_create(host_comm, R->dev, &R->comm));
    } else {
        nd.bootstrap = sh->boot;
        nd.name = "train_gpt2";
        TRY(zero_nccl_create(&nd, &R->comm));
    }
    R->world = R->comm->world;
    R->B = o->batch / R->world;
    R->N = (size_t)R->B * R->T;
    gg_chunks(R->N, &R->rows_per_chunk, &R->chunks);
    R->st = (cudaStream_t)R->dev->ops->native_queue(R->dev, ZERO_QUEUE_COMPUTE);
    CUDA(cudaSetDevice(sh->device));
    BLAS(cublasCreate(&R->blas));
    BLAS(cublasSetStream(R->blas, R->st));
    /* activations and the host buffers, allocated before the first collective (several
       ranks on one GPU: no cudaMalloc while a peer's collective waits) */
    bytes = carve_all(R, NULL);
    CUDA(cudaMalloc(&R->block, bytes));
    carve_all(R, (char *)R->block);
    R->t = (gpt2_tensor *)calloc((size_t)gpt2_num_tensors(&o->cfg), sizeof(gpt2_tensor));
    for (st = 0; st < 2; st++) { /* the pinned sets of host_next */
        CUDA(cudaMallocHost((void **)&R->hset[st], sizeof(int) * (3 * R->N + 2 * (size_t)R->V + 1)));
        CUDA(cudaEventCreateWithFlags(&R->hev[st], cudaEventDisableTiming));
    }
    R->hcount = (int *)malloc(sizeof(int) * (size_t)R->V);
    R->hlogits = o->logits_path && rank == 0 ? (float *)malloc(sizeof(float) * R->N * R->V) : NULL;
    if (!R->t || !R->hcount || (o->logits_path && rank == 0 && !R->hlogits)) {
        r = fail(ZERO_ERROR_OUT_OF_MEMORY, "malloc", "host buffers");
        goto done;
    }
    gpt2_param_table(&o->cfg, R->t);
    if (rank == 0)
        printf(PROG ": device %d, %s comm, %zu MiB of activations per rank\n", sh->device,
               host_comm ? "single-process device" : "NCCL", bytes >> 20);
    for (st = first; st <= last; st++) {
        mine[st].loss = (double *)calloc((size_t)o->steps, sizeof(double));
        if (!mine[st].loss) {
            r = fail(ZERO_ERROR_OUT_OF_MEMORY, "malloc", "loss history");
            goto done;
        }
        R->stage = st;
        TRY(train_stage(R, &mine[st]));
    }
done:
    if (r != ZERO_OK) fprintf(stderr, PROG ": rank %d of %d failed\n", rank, R->world);
    if (rank == 0)
        for (st = 0; st < 4; st++) sh->res[st] = mine[st];
    else
        for (st = 0; st < 4; st++) free(mine[st].loss);
    if (R->blas) cublasDestroy(R->blas);
    cudaFree(R->block);
    free(R->t);
    for (st = 0; st < 2; st++) {
        if (R->hev[st]) cudaEventSynchronize(R->hev[st]); /* its last upload read the set */
        if (R->hset[st]) cudaFreeHost(R->hset[st]);
        if (R->hev[st]) cudaEventDestroy(R->hev[st]);
    }
    free(R->hcount);
    free(R->hlogits);
    zero_comm_destroy(R->comm); /* before the device (its streams) */
    zero_device_destroy(R->dev);
    return r;
}

/* Rank 0's summary: a line per stage; with several stages whether they agree: bit for bit
   (losses and final parameters) where the comm promises it ('identical':
   gg_stages_promise_identity), else every loss within gg_stage_loss_bound relative of the
   first stage's (NCCL at N >= 3 sums stage 0's all-reduce and the reduce-scatter of stages
   1-3 in different orders; the parameters then differ in their last bits and are not
   compared); the lines train_gpt2.c ends with. 'whole': sh->final holds every rank's part
   (--ranks, or one process), so its checksum is the model's. Returns 0, or 1 when the
   stages differ. */
static int report(const shared *sh, int first, int last, int whole, int identical)
{
    const zero_dtype dt = sh->o->dtype;
    const double bound = gg_stage_loss_bound(dt == ZERO_F32 ? 0 : dt == ZERO_F16 ? 1 : 2);
    int st, same = 1;
    for (st = first; st <= last; st++) {
        const stage_result *x = &sh->res[st], *y = &sh->res[first];
        printf("stage %d: first loss %.6f, final loss %.6f, val loss %.9g, %.2f ms/step, %d step(s) skipped, "
               "final loss scale %g, params checksum %016llx%s\n",
               st, x->loss[x->first], x->loss[x->end - 1], x->val, x->ms_per_step, x->skipped, (double)x->final_scale,
               (unsigned long long)x->checksum, whole ? "" : " (this process's part)");
        if (st > first && same) {
            int s = gg_losses_differ(x->loss, y->loss, x->first, x->end, identical, bound);
            if (s >= 0) {
                printf("stage %d differs from stage %d at step %d: %.17g vs %.17g%s\n", st, first, s, x->loss[s],
                       y->loss[s], identical ? "" : " (beyond the bound)");
                same = 0;
            }
            if (identical && x->checksum != y->checksum) same = 0;
        }
    }
    if (first != last) {
        if (!same) printf("WARNING: the stages differ\n");
        else if (identical) printf("stages %d-%d: identical losses and bit-identical parameters\n", first, last);
        else
            printf("stages %d-%d: every loss within %g relative (NCCL at %d ranks sums all-reduce and reduce-scatter "
                   "in different orders: no bit identity promised, parameters not compared)\n",
                   first, last, bound, sh->boot ? sh->boot->world : 0);
    }
    printf("val loss: %.9g\n", sh->res[last].val);
    if (whole) printf("params checksum: %016llx\n", (unsigned long long)sh->res[last].checksum);
    if (sh->o->sample > 0) printf("sample:\n%s\n", sh->res[last].sample);
    fflush(stdout);
    return same ? 0 : 1;
}

static gpt2_vocab vocab; /* --tokenizer */
static void vocab_free(void) { gpt2_vocab_free(&vocab); }

int main(int argc, char **argv)
{
    gpt2_opts o;
    gpt2_data data;
    shared sh;
    zero_bootstrap_desc boot;
    memset(&boot, 0, sizeof boot);
    zero_result r;
    char err[8192] = ""; /* gpt2_data_load names paths of up to 4 KiB */
    int a, ranks_given = 0, count = 0, st, rc;
    gpt2_opts_default(&o);
    o.launcher = 1; /* without --ranks: the launcher's world, checked against --batch below */
    rc = gpt2_parse_args(argc, argv, &o);
    if (rc) return rc == 1 ? 0 : 2;
    ranks_given = o.ranks_given;
    if (o.decode_path && !o.tokenizer_path) {
        fprintf(stderr, PROG ": --decode FILE.bin needs --tokenizer (the vocabulary to print it with)\n");
        return 2;
    }
    if (o.tokenizer_path) { /* as train_gpt2.c: the sample as text, or --decode and exit */
        atexit(vocab_free);
        if (gpt2_vocab_load(o.tokenizer_path, &vocab, err, sizeof err) != 0) {
            fprintf(stderr, PROG ": %s\n", err);
            return 2;
        }
        o.vocab = &vocab;
        if (o.decode_path) {
            rc = gpt2_decode_bin(&vocab, o.decode_path, stdout, err, sizeof err);
            if (rc != 0) fprintf(stderr, PROG ": %s\n", err);
            return rc ? 1 : 0;
        }
    }
    if (o.device_memory) {
        fprintf(stderr, PROG ": --device-memory is a budget of the CPU example's host device (train_gpt2); "
                        "not supported here\n");
        return 2;
    }
    if (o.tile_embedding) {
        fprintf(stderr, PROG ": --tile-embedding is implemented by the CPU example (train_gpt2); "
                        "not supported here\n");
        return 2;
    }
    if (o.export_dir) {
        fprintf(stderr, PROG ": --export is implemented by the CPU example (train_gpt2); save with --save and "
                "run zero-ckpt export DIR --hf OUTDIR\n");
        return 2;
    }
    if (o.freeze) {
        fprintf(stderr, PROG ": --freeze is implemented by the CPU example (train_gpt2); not supported here yet\n");
        return 2;
    }
    if (o.oact != ZERO_OFFLOAD_NONE) {
        fprintf(stderr, PROG ": --offload-activations is implemented by the CPU example (train_gpt2), whose "
                        "blocks keep their inputs in the engine's stash; not supported here yet\n");
        return 2;
    }
    if (o.dropout > 0) {
        fprintf(stderr, PROG ": --dropout %g is implemented by the CPU example (train_gpt2) only; its kernels "
                        "have no dropout masks yet (--dropout 0 trains without dropout here)\n", o.dropout);
        return 2;
    }
    /* cuBLAS takes the rows (batch x seq per rank) as int, the token lists hold positions */
    if ((long long)o.batch * o.cfg.seq > INT_MAX) {
        fprintf(stderr, PROG ": --batch x --seq must stay below 2^31\n");
        return 2;
    }
    r = zero_cuda_device_probe(&count);
    if (r != ZERO_OK) {
        fprintf(stderr, PROG ": the GPU cannot be used: %s\n", zero_last_error());
        return 1;
    }
    if (count == 0) {
        fprintf(stderr, PROG ": no GPU visible (examples/train_gpt2.c trains the same model on the CPU)\n");
        return 1;
    }
    if (gpt2_data_load_val(o.data_path, o.val_path, o.cfg.vocab, o.cfg.seq, &data, err, sizeof err) != 0) {
        fprintf(stderr, PROG ": %s\n", err);
        return 1;
    }
    memset(&sh, 0, sizeof sh);
    sh.o = &o;
    sh.data = &data;
    {
        gpt2_tensor *t = (gpt2_tensor *)calloc((size_t)gpt2_num_tensors(&o.cfg), sizeof(gpt2_tensor));
        if (t) {
            gpt2_param_table(&o.cfg, t);
            for (a = 0; a < gpt2_num_tensors(&o.cfg); a++) sh.total += t[a].numel;
            free(t);
        }
        sh.final = t ? (float *)calloc(sh.total, sizeof(float)) : NULL;
        if (!sh.final) {
            fprintf(stderr, PROG ": out of memory\n");
            gpt2_data_free(&data);
            return 1;
        }
    }
    if (ranks_given) { /* N ranks as threads on GPU 0 */
        sh.device = 0;
        r = zero_local_run(o.ranks, rank_main, &sh);
    } else { /* one rank per process (and GPU): the launcher's */
        r = zero_bootstrap_env(&boot);
        if (r == ZERO_OK && o.batch % boot.world) {
            fprintf(stderr, PROG ": --batch %d is not a multiple of the %d ranks\n", o.batch, boot.world);
            gpt2_data_free(&data);
            return 2;
        }
        if (r == ZERO_OK) r = zero_nccl_select_device(&boot, &sh.device);
        sh.boot = &boot;
        if (r == ZERO_OK) r = rank_main(boot.rank, NULL, &sh);
        else fprintf(stderr, PROG ": %s\n", zero_last_error());
    }
    rc = r == ZERO_OK ? 0 : 1;
    if (r == ZERO_OK && sh.res[o.stage < 0 ? 3 : o.stage].ok) /* rank 0's process */
        rc = report(&sh, o.stage < 0 ? 0 : o.stage, o.stage < 0 ? 3 : o.stage, ranks_given || boot.world == 1,
                    gg_stages_promise_identity(!ranks_given, ranks_given ? o.ranks : boot.world));
    for (st = 0; st < 4; st++) free(sh.res[st].loss);
    free(sh.final);
    gpt2_data_free(&data);
    return rc;
}
