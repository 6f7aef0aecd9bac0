/* gpt2_cuda_host.h - the host-side arithmetic of examples/train_gpt2.cu, in plain C so
   that tests/test_gpt2_cuda_host.c checks it on a machine without a GPU:
     - every matrix product as a column-major GEMM description (what cuBLAS is asked to
       compute), built from the model's row-major definitions. train_gpt2.cu hands each
       to cublasGemmEx / cublasGemmStridedBatchedEx; the test runs the same descriptions
       through a naive column-major GEMM and compares them with the row-major formulas
       below, so the transposes, leading dimensions, strides and operand roles are right;
     - the token lists of wte's deterministic backward (gg_token_lists);
     - the row chunks of the deterministic column sums (gg_chunks);
     - how the demo (no --stage) compares the stages: bit for bit where the comm promises
       it, else within a bound (gg_stages_promise_identity, gg_losses_differ).

   cuBLAS is column-major: a row-major [rows, cols] array with row stride cols is, read
   column-major, its transpose [cols, rows] with leading dimension cols. So a row-major
   product Y = X W is computed as Y^T = W^T X^T, the operands swapped.

   Row-major shapes (N = B * T rows, one matrix per (batch, head) in attention):
     linear (Conv1D, weight [in, out]):  y[N,out] = x[N,in] W[in,out]       (+ bias apart)
                                         dx[N,in] = dy W^T,  dW[in,out] = x^T dy
     LM head, tied to wte [V, C]:        logits[N,V] = x[N,C] wte^T
                                         dx = dlogits wte,   dwte = dlogits^T x
     attention, per head (T x hs):       s[T,T] = alpha q k^T,  y[T,hs] = a v
                                         da = dy v^T,  dv = a^T dy,
                                         dq = alpha ds k,  dk = alpha ds^T q */
#ifndef GPT2_CUDA_HOST_H
#define GPT2_CUDA_HOST_H

#include <stddef.h>
#include <string.h>

/* C = alpha op(A) op(B) + beta C, column-major, op = transpose when ta/tb; batch matrices
   at strides sa, sb, sc (elements) apart. m x n result, k the inner dimension. */
typedef struct gg_gemm {
    int ta, tb;
    int m, n, k;
    const float *A, *B;
    float *C;
    int lda, ldb, ldc;
    long long sa, sb, sc;
    int batch;
    float alpha, beta;
} gg_gemm;

static inline gg_gemm gg_make(int ta, int tb, int m, int n, int k, const float *A, int lda, const float *B, int ldb, float *C,
                       int ldc, float alpha, float beta)
{
    gg_gemm g;
    g.ta = ta;
    g.tb = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.A = A;
    g.lda = lda;
    g.B = B;
    g.ldb = ldb;
    g.C = C;
    g.ldc = ldc;
    g.sa = g.sb = g.sc = 0;
    g.batch = 1;
    g.alpha = alpha;
    g.beta = beta;
    return g;
}

static inline gg_gemm gg_batched(gg_gemm g, int batch, long long sa, long long sb, long long sc)
{
    g.batch = batch;
    g.sa = sa;
    g.sb = sb;
    g.sc = sc;
    return g;
}

/* y[N,out] = x[N,in] W[in,out]  (y^T = W^T x^T: W read as [out x in] col-major) */
static inline gg_gemm gg_linear_fwd(float *y, const float *x, const float *W, int N, int in, int out)
{
    return gg_make(0, 0, out, N, in, W, out, x, in, y, out, 1.0f, 0.0f);
}
/* dx[N,in] = dy[N,out] W^T  (dx^T = W dy^T); beta 1 adds into dx */
static inline gg_gemm gg_linear_bwd_x(float *dx, const float *dy, const float *W, int N, int in, int out, float beta)
{
    return gg_make(1, 0, in, N, out, W, out, dy, out, dx, in, 1.0f, beta);
}
/* dW[in,out] += x^T dy  (dW^T += dy^T x) */
static inline gg_gemm gg_linear_bwd_w(float *dW, const float *x, const float *dy, int N, int in, int out)
{
    return gg_make(0, 1, out, in, N, dy, out, x, in, dW, out, 1.0f, 1.0f);
}
/* logits[N,V] = x[N,C] wte^T  (logits^T = wte x^T) */
static inline gg_gemm gg_lmhead_fwd(float *logits, const float *x, const float *wte, int N, int C, int V)
{
    return gg_make(1, 0, V, N, C, wte, C, x, C, logits, V, 1.0f, 0.0f);
}
/* dx[N,C] = dlogits[N,V] wte[V,C]  (dx^T = wte^T dlogits^T) */
static inline gg_gemm gg_lmhead_bwd_x(float *dx, const float *dlogits, const float *wte, int N, int C, int V)
{
    return gg_make(0, 0, C, N, V, wte, C, dlogits, V, dx, C, 1.0f, 0.0f);
}
/* dwte[V,C] += dlogits^T x  (dwte^T += x^T dlogits) */
static inline gg_gemm gg_lmhead_bwd_w(float *dwte, const float *x, const float *dlogits, int N, int C, int V)
{
    return gg_make(0, 1, C, V, N, x, C, dlogits, V, dwte, C, 1.0f, 1.0f);
}

/* Attention over BH = B * NH heads, q/k/v/y [BH, T, hs], scores [BH, T, T]. */
/* s = alpha q k^T  (s^T = alpha k q^T) */
static inline gg_gemm gg_att_scores(float *s, const float *q, const float *k, int BH, int T, int hs, float alpha)
{
    gg_gemm g = gg_make(1, 0, T, T, hs, k, hs, q, hs, s, T, alpha, 0.0f);
    return gg_batched(g, BH, (long long)T * hs, (long long)T * hs, (long long)T * T);
}
/* y = a v  (y^T = v^T a^T) */
static inline gg_gemm gg_att_values(float *y, const float *a, const float *v, int BH, int T, int hs)
{
    gg_gemm g = gg_make(0, 0, hs, T, T, v, hs, a, T, y, hs, 1.0f, 0.0f);
    return gg_batched(g, BH, (long long)T * hs, (long long)T * T, (long long)T * hs);
}
/* da = dy v^T  (da^T = v dy^T) */
static inline gg_gemm gg_att_bwd_a(float *da, const float *dy, const float *v, int BH, int T, int hs)
{
    gg_gemm g = gg_make(1, 0, T, T, hs, v, hs, dy, hs, da, T, 1.0f, 0.0f);
    return gg_batched(g, BH, (long long)T * hs, (long long)T * hs, (long long)T * T);
}
/* dv = a^T dy  (dv^T = dy^T a) */
static inline gg_gemm gg_att_bwd_v(float *dv, const float *a, const float *dy, int BH, int T, int hs)
{
    gg_gemm g = gg_make(0, 1, hs, T, T, dy, hs, a, T, dv, hs, 1.0f, 0.0f);
    return gg_batched(g, BH, (long long)T * hs, (long long)T * T, (long long)T * hs);
}
/* dq = alpha ds k  (dq^T = alpha k^T ds^T) */
static inline gg_gemm gg_att_bwd_q(float *dq, const float *ds, const float *k, int BH, int T, int hs, float alpha)
{
    gg_gemm g = gg_make(0, 0, hs, T, T, k, hs, ds, T, dq, hs, alpha, 0.0f);
    return gg_batched(g, BH, (long long)T * hs, (long long)T * T, (long long)T * hs);
}
/* dk = alpha ds^T q  (dk^T = alpha q^T ds) */
static inline gg_gemm gg_att_bwd_k(float *dk, const float *ds, const float *q, int BH, int T, int hs, float alpha)
{
    gg_gemm g = gg_make(0, 1, hs, T, T, q, hs, ds, T, dk, hs, alpha, 0.0f);
    return gg_batched(g, BH, (long long)T * hs, (long long)T * T, (long long)T * hs);
}

/* The shape rules cuBLAS checks (and a few it assumes): positive sizes, leading
   dimensions at least the stored rows. 1 when g is well formed. */
static inline int gg_valid(const gg_gemm *g)
{
    int ar = g->ta ? g->k : g->m, br = g->tb ? g->n : g->k;
    return g->m > 0 && g->n > 0 && g->k > 0 && g->batch > 0 && g->lda >= ar && g->ldb >= br && g->ldc >= g->m &&
           g->A && g->B && g->C;
}

/* wte's backward adds, for each token v of the micro-batch, the gradients of the positions
   holding v, in increasing position order, without atomics: one GPU thread per (distinct
   token, channel). The lists, by a counting sort of tok[0..n-1] (tokens in [0, V)):
   uniq[0..U-1] the distinct tokens ascending, start[0..U] where each one's positions
   begin in pos[0..n-1]. count is V ints of scratch. Returns U. */
static inline int gg_token_lists(const int *tok, size_t n, int V, int *count, int *uniq, int *start, int *pos)
{
    size_t i;
    int v, u = 0;
    for (v = 0; v < V; v++) count[v] = 0;
    for (i = 0; i < n; i++) count[tok[i]]++;
    start[0] = 0;
    for (v = 0; v < V; v++)
        if (count[v]) {
            uniq[u] = v;
            start[u + 1] = start[u] + count[v];
            count[v] = start[u]; /* from here: the next free slot of token v */
            u++;
        }
    for (i = 0; i < n; i++) pos[count[tok[i]]++] = (int)i;
    return u;
}

/* Column sums over N rows run as 'chunks' partial sums of rows_per_chunk rows each (the
   last may be shorter), then the partials in order: at most GG_MAX_CHUNKS chunks of at
   least GG_MIN_CHUNK_ROWS rows. */
#define GG_MAX_CHUNKS 1024
#define GG_MIN_CHUNK_ROWS 32
static inline void gg_chunks(size_t N, size_t *rows_per_chunk, size_t *chunks)
{
    size_t r = (N + GG_MAX_CHUNKS - 1) / GG_MAX_CHUNKS;
    if (r < GG_MIN_CHUNK_ROWS) r = GG_MIN_CHUNK_ROWS;
    *rows_per_chunk = r;
    *chunks = (N + r - 1) / r;
}

/* Whether the comm promises the same bits at every stage. Stage 0 sums gradients with an
   all-reduce, stages 1-3 with a reduce-scatter. The device comm (--ranks) sums both in rank
   order 0..N-1; one rank sums nothing; NCCL at N = 2 adds two values (commutative). NCCL
   at N >= 3 sums the two collectives in different orders (its ring and tree algorithms,
   chunked differently), so the stages' gradients, and from there their losses and
   parameters, differ in the last bits: a healthy run. */
static inline int gg_stages_promise_identity(int nccl, int world) { return !nccl || world <= 2; }

/* The relative bound on every step's loss of a stage against the first stage's where
   identity is not promised (param dtype: 0 f32, 1 f16, 2 bf16): the bounds the GPU check
   (tools/gpt2_gpu_check.sh) allows between the GPU and the CPU example, whose summation
   orders differ everywhere, not only in one collective: 1e-4 for fp32 (what both examples
   keep against PyTorch), TOL_F16 5e-3 and TOL_BF16 2e-2 (a master-weight difference of a
   few fp32 ulps moves a 16-bit param across a rounding boundary: up to u |w|, u = 2^-11 or
   2^-8, times the loss's condition number; docs/gpt2.md). */
static inline double gg_stage_loss_bound(int dtype)
{
    return dtype == 0 ? 1e-4 : dtype == 1 ? 5e-3 : 2e-2;
}

/* The first step s in [first, end) where loss x[s] disagrees with the reference y[s]:
   any bit when 'identical', else |x - y| > rel |y| (NaN disagrees); -1 when none. */
static inline int gg_losses_differ(const double *x, const double *y, int first, int end, int identical, double rel)
{
    int s;
    for (s = first; s < end; s++) {
        double d = x[s] - y[s];
        if (identical ? memcmp(&x[s], &y[s], sizeof(double)) != 0 : !((d < 0 ? -d : d) <= rel * (y[s] < 0 ? -y[s] : y[s])))
            return s;
    }
    return -1;
}

#endif /* GPT2_CUDA_HOST_H */
