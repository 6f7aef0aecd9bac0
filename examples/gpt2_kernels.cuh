/* gpt2_kernels.cuh - the CUDA kernels of examples/train_gpt2.cu: GPT-2's element, row and
   column operations in fp32 (the matrix products are cuBLAS calls in train_gpt2.cu).

   Every kernel here computes in fp32 and is deterministic: each output element is written
   by one thread, and every sum runs in an order fixed by the shapes alone (a warp's or a
   block's fixed shuffle tree, or a serial loop in index order), never by atomics. So a run
   repeats bit for bit, and stages 0-3 of the engine (which hand the same parameter bits to
   the model) give the same losses.

   Shapes: N = B * T rows (batch x sequence), C channels, NH heads of hs = C / NH, V the
   vocabulary. Activations are row-major [N, width]. Indices are size_t; grids are
   grid-stride, so any size that fits the buffers is covered. */
#ifndef GPT2_KERNELS_CUH
#define GPT2_KERNELS_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>

#define GK_THREADS 256 /* threads per block of the element and row kernels */
#define GK_WARPS (GK_THREADS / 32)

/* Blocks of GK_THREADS for n work items (one per thread), capped: the kernels loop. */
static inline unsigned gk_blocks(size_t n)
{
    size_t b = (n + GK_THREADS - 1) / GK_THREADS;
    return (unsigned)(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}
/* Blocks for n rows handled one warp each. */
static inline unsigned gk_row_blocks(size_t rows) { return gk_blocks(rows * 32); }

#define GK_FOR(i, n) for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
/* one warp per row: warp w of the grid takes rows w, w + warps, ... */
#define GK_FOR_ROWS(row, rows)                                                                               \
    for (size_t row = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; row < (rows);                    \
         row += ((size_t)gridDim.x * blockDim.x) / 32)

/* Sum and max over a warp, the same tree every time (xor butterfly: every lane ends with
   the same value). */
__device__ __forceinline__ float gk_warp_sum(float v)
{
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float gk_warp_max(float v)
{
    for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over a block of GK_THREADS threads; every thread gets the result. 'sh' holds
   GK_WARPS floats; the block must not reuse it before a __syncthreads. */
__device__ __forceinline__ float gk_block_sum(float v, float *sh)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = gk_warp_sum(v);
    __syncthreads(); /* earlier readers of sh are done */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < GK_WARPS ? sh[lane] : 0.0f;
    return gk_warp_sum(v);
}
__device__ __forceinline__ float gk_block_max(float v, float *sh)
{
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = gk_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < GK_WARPS ? sh[lane] : -INFINITY;
    return gk_warp_max(v);
}

/* ---- embeddings ------------------------------------------------------------------------- */

/* out[n, c] = wte[tok[n], c] + wpe[n % T, c] */
__global__ void gk_encoder_fwd(float *out, const int *tok, const float *wte, const float *wpe, size_t N, int T, int C)
{
    GK_FOR(i, N * C)
    {
        size_t n = i / C, c = i % C;
        out[i] = wte[(size_t)tok[n] * C + c] + wpe[(n % T) * C + c];
    }
}

/* dwte[v, c] += dout[p, c] over the positions p with tok[p] = v, in increasing p: the host
   lists the distinct tokens (uniq[u]) and, for each, its positions pos[start[u] ..
   start[u+1]-1] in order. One thread per (distinct token, channel): no atomics. */
__global__ void gk_wte_bwd(float *dwte, const float *dout, const int *uniq, const int *start, const int *pos, int U, int C)
{
    GK_FOR(i, (size_t)U * C)
    {
        size_t u = i / C, c = i % C;
        float *d = dwte + (size_t)uniq[u] * C + c;
        float acc = *d;
        for (int p = start[u]; p < start[u + 1]; p++) acc += dout[(size_t)pos[p] * C + c];
        *d = acc;
    }
}

/* dwpe[t, c] += dout[b * T + t, c] for b = 0 .. B-1 in order */
__global__ void gk_wpe_bwd(float *dwpe, const float *dout, int B, int T, int C)
{
    GK_FOR(i, (size_t)T * C)
    {
        size_t t = i / C, c = i % C;
        float acc = dwpe[i];
        for (int b = 0; b < B; b++) acc += dout[((size_t)b * T + t) * C + c];
        dwpe[i] = acc;
    }
}

/* ---- LayerNorm (eps 1e-5, as Hugging Face's GPT-2) -------------------------------------- */

#define GK_LN_EPS 1e-5f

/* One warp per row: mean, then the variance about it (two passes), out = (x - mean) *
   rstd * w + b; saves mean and rstd for the backward. */
__global__ void gk_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                                 size_t N, int C)
{
    int lane = threadIdx.x % 32;
    GK_FOR_ROWS(row, N)
    {
        const float *xr = x + row * C;
        float s = 0.0f, v = 0.0f, m, rs;
        for (int c = lane; c < C; c += 32) s += xr[c];
        m = gk_warp_sum(s) / (float)C;
        for (int c = lane; c < C; c += 32) {
            float d = xr[c] - m;
            v += d * d;
        }
        rs = 1.0f / sqrtf(gk_warp_sum(v) / (float)C + GK_LN_EPS);
        for (int c = lane; c < C; c += 32) out[row * C + c] = (xr[c] - m) * rs * w[c] + b[c];
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = rs;
        }
    }
}

/* The input gradient, one warp per row, added into dx (the residual stream's gradient):
   with n = (x - mean) * rstd and g = w * dout,
   dx += rstd * (g - mean(g) - n * mean(g * n)). */
__global__ void gk_layernorm_bwd_x(float *dx, const float *dout, const float *x, const float *w, const float *mean,
                                   const float *rstd, size_t N, int C)
{
    int lane = threadIdx.x % 32;
    GK_FOR_ROWS(row, N)
    {
        const float *xr = x + row * C, *dr = dout + row * C;
        float m = mean[row], rs = rstd[row], sg = 0.0f, sgn = 0.0f, mg, mgn;
        for (int c = lane; c < C; c += 32) {
            float g = w[c] * dr[c];
            sg += g;
            sgn += g * ((xr[c] - m) * rs);
        }
        mg = gk_warp_sum(sg) / (float)C;
        mgn = gk_warp_sum(sgn) / (float)C;
        for (int c = lane; c < C; c += 32) {
            float g = w[c] * dr[c], n = (xr[c] - m) * rs;
            dx[row * C + c] += rs * (g - mg - n * mgn);
        }
    }
}

/* Column sums in two passes, so that they are parallel yet in a fixed order: pass 1 sums
   rows [k * rows_per_chunk, (k+1) * rows_per_chunk) of each column into part[k, c]; pass 2
   adds part[0..chunks-1, c] in order into dst[c]. With x/mean/rstd (LayerNorm's weight
   gradient) pass 1 sums dout * (x - mean) * rstd into part_w as well as dout into part_b. */
__global__ void gk_colsum_part(float *part_b, float *part_w, const float *dout, const float *x, const float *mean,
                               const float *rstd, size_t N, int C, size_t rows_per_chunk)
{
    size_t chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
    GK_FOR(i, chunks * C)
    {
        size_t k = i / C, c = i % C, r0 = k * rows_per_chunk, r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
        float sb = 0.0f, sw = 0.0f;
        for (size_t r = r0; r < r1; r++) {
            float d = dout[r * C + c];
            sb += d;
            if (x) sw += d * ((x[r * C + c] - mean[r]) * rstd[r]);
        }
        part_b[i] = sb;
        if (x) part_w[i] = sw;
    }
}
__global__ void gk_colsum_finish(float *dst, const float *part, size_t chunks, int C)
{
    GK_FOR(c, (size_t)C)
    {
        float acc = dst[c];
        for (size_t k = 0; k < chunks; k++) acc += part[k * C + c];
        dst[c] = acc;
    }
}

/* ---- element-wise ----------------------------------------------------------------------- */

/* y[n, c] += b[c] */
__global__ void gk_add_bias(float *y, const float *b, size_t N, int C)
{
    GK_FOR(i, N * C) y[i] += b[i % C];
}

/* out = x + (y + b[c]): a projection's bias and the residual connection */
__global__ void gk_bias_residual(float *out, const float *x, const float *y, const float *b, size_t N, int C)
{
    GK_FOR(i, N * C) out[i] = x[i] + (y[i] + b[i % C]);
}

/* gelu_new: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) */
#define GK_GELU_S 0.7978845608028654f /* sqrt(2 / pi) */
__global__ void gk_gelu_fwd(float *out, const float *x, size_t n)
{
    GK_FOR(i, n)
    {
        float v = x[i];
        out[i] = 0.5f * v * (1.0f + tanhf(GK_GELU_S * (v + 0.044715f * v * v * v)));
    }
}
/* d[i] *= gelu_new'(x[i]) */
__global__ void gk_gelu_bwd(float *d, const float *x, size_t n)
{
    GK_FOR(i, n)
    {
        float v = x[i], t = tanhf(GK_GELU_S * (v + 0.044715f * v * v * v));
        float du = GK_GELU_S * (1.0f + 3.0f * 0.044715f * v * v);
        d[i] *= 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
    }
}

/* ---- attention -------------------------------------------------------------------------- */

/* qkv [B, T, 3, NH, hs] (c_attn's output) <-> q, k, v [B, NH, T, hs] (one matrix per head
   for the batched products). dir 0: split qkv into q, k, v; dir 1: the gradient back. */
__global__ void gk_qkv_split(float *qkv, float *q, float *k, float *v, int B, int T, int NH, int hs, int dir)
{
    size_t C = (size_t)NH * hs;
    GK_FOR(i, (size_t)B * T * C)
    {
        size_t d = i % hs, t = (i / hs) % T, h = (i / ((size_t)hs * T)) % NH, b = i / ((size_t)hs * T * NH);
        size_t src = (b * T + t) * 3 * C + h * hs + d;
        if (dir == 0) {
            q[i] = qkv[src];
            k[i] = qkv[src + C];
            v[i] = qkv[src + 2 * C];
        } else {
            qkv[src] = q[i];
            qkv[src + C] = k[i];
            qkv[src + 2 * C] = v[i];
        }
    }
}

/* y [B, NH, T, hs] <-> out [B, T, NH, hs]: dir 0 out = y (heads side by side), dir 1 the
   gradient back (y = out). */
__global__ void gk_heads_merge(float *out, float *y, int B, int T, int NH, int hs, int dir)
{
    size_t C = (size_t)NH * hs;
    GK_FOR(i, (size_t)B * T * C)
    {
        size_t d = i % hs, t = (i / hs) % T, h = (i / ((size_t)hs * T)) % NH, b = i / ((size_t)hs * T * NH);
        size_t o = (b * T + t) * C + h * hs + d;
        if (dir == 0) out[o] = y[i];
        else y[i] = out[o];
    }
}

/* Causal softmax in place over rows of length T (rows = B * NH * T; row r is query
   position i = r % T, keys j <= i): att[j] = exp(x[j] - max) / sum for j <= i, 0 after.
   The 1/sqrt(hs) scale is already in x (the product's alpha). One warp per row. */
__global__ void gk_softmax_causal_fwd(float *att, size_t rows, int T)
{
    int lane = threadIdx.x % 32;
    GK_FOR_ROWS(row, rows)
    {
        float *a = att + row * T, mx = -INFINITY, s = 0.0f, inv;
        int i = (int)(row % T);
        for (int j = lane; j <= i; j += 32) mx = fmaxf(mx, a[j]);
        mx = gk_warp_max(mx);
        for (int j = lane; j <= i; j += 32) s += expf(a[j] - mx);
        inv = 1.0f / gk_warp_sum(s);
        for (int j = lane; j < T; j += 32) a[j] = j <= i ? expf(a[j] - mx) * inv : 0.0f;
    }
}

/* Its backward in place: d[j] = att[j] (d[j] - sum_k att[k] d[k]) for j <= i, 0 after. */
__global__ void gk_softmax_causal_bwd(float *d, const float *att, size_t rows, int T)
{
    int lane = threadIdx.x % 32;
    GK_FOR_ROWS(row, rows)
    {
        float *dr = d + row * T, s = 0.0f;
        const float *a = att + row * T;
        int i = (int)(row % T);
        for (int j = lane; j <= i; j += 32) s += a[j] * dr[j];
        s = gk_warp_sum(s);
        for (int j = lane; j < T; j += 32) dr[j] = j <= i ? a[j] * (dr[j] - s) : 0.0f;
    }
}

/* ---- the loss ----------------------------------------------------------------------------- */

/* Cross-entropy of each row of logits [N, V] against its target, in place: losses[n] =
   logsumexp(logits[n]) - logits[n, target]; then logits[n] becomes the gradient of
   dscale * loss[n], (softmax - onehot(target)) * dscale. One block of GK_THREADS per row. */
__global__ void gk_crossentropy(float *logits, float *losses, const int *targets, size_t N, int V, float dscale)
{
    __shared__ float sh[GK_WARPS];
    for (size_t row = blockIdx.x; row < N; row += gridDim.x) {
        float *x = logits + row * V, mx = -INFINITY, s = 0.0f, inv, lse;
        int tgt = targets[row];
        for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
        mx = gk_block_max(mx, sh);
        for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(x[j] - mx);
        s = gk_block_sum(s, sh);
        inv = 1.0f / s;
        lse = logf(s) + mx;
        __syncthreads(); /* everyone has read x[tgt] below before it is overwritten */
        if (threadIdx.x == 0) losses[row] = lse - x[tgt];
        __syncthreads();
        for (int j = threadIdx.x; j < V; j += blockDim.x)
            x[j] = (expf(x[j] - mx) * inv - (j == tgt ? 1.0f : 0.0f)) * dscale;
        __syncthreads();
    }
}

/* *acc += sum(losses[0 .. N-1]) / N, in fp64, one block of GK_THREADS, a fixed order. */
__global__ void gk_loss_mean(double *acc, const float *losses, size_t N)
{
    __shared__ double sh[GK_THREADS];
    double s = 0.0;
    for (size_t i = threadIdx.x; i < N; i += blockDim.x) s += (double)losses[i];
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = GK_THREADS / 2; o > 0; o /= 2) {
        if ((int)threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) *acc += sh[0] / (double)N;
}

#endif /* GPT2_KERNELS_CUH */
