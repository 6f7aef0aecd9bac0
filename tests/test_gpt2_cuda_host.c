/* The host-side arithmetic of examples/train_gpt2.cu, checked without a GPU
   (examples/gpt2_cuda_host.h):
   - every matrix product the CUDA example asks cuBLAS for, run through a naive
     column-major GEMM with cuBLAS's meaning of op, m/n/k, leading dimensions, batch strides,
     alpha and beta, equals the row-major formula of the model it stands for (computed
     here directly in double), on sizes where every dimension differs, so a swapped
     operand, transpose, leading dimension or stride cannot pass;
   - wte's token lists give every position exactly once, under its own token, in
     increasing order, the tokens ascending;
   - the column-sum chunks cover every row exactly once within their limits. */
#include "zero.h" /* first, as in every test: its feature macros (clock_gettime for zt.h) */
#include "examples/gpt2_cuda_host.h"
#include "tests/zt.h"

#include <math.h>
#include <stdint.h>

static uint64_t rng_state = 88172645463325252ull;
static float frand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static float *rand_buf(size_t n)
{
    float *p = (float *)malloc(n * sizeof(float));
    size_t i;
    for (i = 0; p && i < n; i++) p[i] = frand();
    return p;
}

/* cuBLAS's column-major GEMM, naively, in double: C = alpha op(A) op(B) + beta C. */
static void ref_gemm(const gg_gemm *g)
{
    int b, i, j, p;
    for (b = 0; b < g->batch; b++) {
        const float *A = g->A + (size_t)b * g->sa, *B = g->B + (size_t)b * g->sb;
        float *C = g->C + (size_t)b * g->sc;
        for (j = 0; j < g->n; j++)
            for (i = 0; i < g->m; i++) {
                double s = 0;
                for (p = 0; p < g->k; p++) {
                    double a = g->ta ? A[p + (size_t)i * g->lda] : A[i + (size_t)p * g->lda];
                    double x = g->tb ? B[j + (size_t)p * g->ldb] : B[p + (size_t)j * g->ldb];
                    s += a * x;
                }
                C[i + (size_t)j * g->ldc] = (float)(g->alpha * s + g->beta * C[i + (size_t)j * g->ldc]);
            }
    }
}

/* max |got - want| / (1 + |want|) */
static double max_err(const float *got, const double *want, size_t n)
{
    double e = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]) / (1.0 + fabs(want[i]));
        if (d > e || d != d) e = d != d ? INFINITY : d;
    }
    return e;
}

#define TOL 1e-5

/* Row-major matrices: x[N][in], W[in][out], y[N][out]. */
ZT_TEST(test_linear)
{
    const int N = 6, in = 5, out = 7;
    float *x = rand_buf((size_t)N * in), *W = rand_buf((size_t)in * out), *dy = rand_buf((size_t)N * out);
    float *y = rand_buf((size_t)N * out), *dx = rand_buf((size_t)N * in), *dW = rand_buf((size_t)in * out);
    double *want = (double *)malloc(sizeof(double) * 64);
    float *dW0 = (float *)malloc(sizeof(float) * (size_t)in * out), *dx0 = (float *)malloc(sizeof(float) * (size_t)N * in);
    gg_gemm g;
    int n, i, o;
    memcpy(dW0, dW, sizeof(float) * (size_t)in * out);
    memcpy(dx0, dx, sizeof(float) * (size_t)N * in);
    /* y = x W (y's old contents are overwritten: beta 0) */
    g = gg_linear_fwd(y, x, W, N, in, out);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (n = 0; n < N; n++)
        for (o = 0; o < out; o++) {
            double s = 0;
            for (i = 0; i < in; i++) s += (double)x[n * in + i] * W[i * out + o];
            want[n * out + o] = s;
        }
    ZT_CHECKF(max_err(y, want, (size_t)N * out) < TOL, "y = x W: error %g", max_err(y, want, (size_t)N * out));
    /* dx = dy W^T, beta 0 and beta 1 */
    g = gg_linear_bwd_x(dx, dy, W, N, in, out, 0.0f);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (n = 0; n < N; n++)
        for (i = 0; i < in; i++) {
            double s = 0;
            for (o = 0; o < out; o++) s += (double)dy[n * out + o] * W[i * out + o];
            want[n * in + i] = s;
        }
    ZT_CHECKF(max_err(dx, want, (size_t)N * in) < TOL, "dx = dy W^T: error %g", max_err(dx, want, (size_t)N * in));
    memcpy(dx, dx0, sizeof(float) * (size_t)N * in);
    g = gg_linear_bwd_x(dx, dy, W, N, in, out, 1.0f);
    ref_gemm(&g);
    for (n = 0; n < N * in; n++) want[n] += dx0[n];
    ZT_CHECKF(max_err(dx, want, (size_t)N * in) < TOL, "dx += dy W^T: error %g", max_err(dx, want, (size_t)N * in));
    /* dW += x^T dy (accumulates into what is there) */
    g = gg_linear_bwd_w(dW, x, dy, N, in, out);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (i = 0; i < in; i++)
        for (o = 0; o < out; o++) {
            double s = dW0[i * out + o];
            for (n = 0; n < N; n++) s += (double)x[n * in + i] * dy[n * out + o];
            want[i * out + o] = s;
        }
    ZT_CHECKF(max_err(dW, want, (size_t)in * out) < TOL, "dW += x^T dy: error %g", max_err(dW, want, (size_t)in * out));
    free(x), free(W), free(dy), free(y), free(dx), free(dW), free(want), free(dW0), free(dx0);
}

/* The tied LM head: wte[V][C], x[N][C], logits[N][V]. */
ZT_TEST(test_lm_head)
{
    const int N = 5, C = 4, V = 9;
    float *x = rand_buf((size_t)N * C), *wte = rand_buf((size_t)V * C), *lg = rand_buf((size_t)N * V);
    float *dlg = rand_buf((size_t)N * V), *dx = rand_buf((size_t)N * C), *dwte = rand_buf((size_t)V * C);
    float *dwte0 = (float *)malloc(sizeof(float) * (size_t)V * C);
    double *want = (double *)malloc(sizeof(double) * 64);
    gg_gemm g;
    int n, c, v;
    memcpy(dwte0, dwte, sizeof(float) * (size_t)V * C);
    g = gg_lmhead_fwd(lg, x, wte, N, C, V);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (n = 0; n < N; n++)
        for (v = 0; v < V; v++) {
            double s = 0;
            for (c = 0; c < C; c++) s += (double)x[n * C + c] * wte[v * C + c];
            want[n * V + v] = s;
        }
    ZT_CHECKF(max_err(lg, want, (size_t)N * V) < TOL, "logits = x wte^T: error %g", max_err(lg, want, (size_t)N * V));
    g = gg_lmhead_bwd_x(dx, dlg, wte, N, C, V);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (n = 0; n < N; n++)
        for (c = 0; c < C; c++) {
            double s = 0;
            for (v = 0; v < V; v++) s += (double)dlg[n * V + v] * wte[v * C + c];
            want[n * C + c] = s;
        }
    ZT_CHECKF(max_err(dx, want, (size_t)N * C) < TOL, "dx = dlogits wte: error %g", max_err(dx, want, (size_t)N * C));
    g = gg_lmhead_bwd_w(dwte, x, dlg, N, C, V);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (v = 0; v < V; v++)
        for (c = 0; c < C; c++) {
            double s = dwte0[v * C + c];
            for (n = 0; n < N; n++) s += (double)dlg[n * V + v] * x[n * C + c];
            want[v * C + c] = s;
        }
    ZT_CHECKF(max_err(dwte, want, (size_t)V * C) < TOL, "dwte += dlogits^T x: error %g",
              max_err(dwte, want, (size_t)V * C));
    free(x), free(wte), free(lg), free(dlg), free(dx), free(dwte), free(dwte0), free(want);
}

/* Attention over BH heads: q, k, v, y [BH][T][hs], scores [BH][T][T]. */
ZT_TEST(test_attention)
{
    const int BH = 3, T = 5, hs = 4;
    const float alpha = 0.5f;
    const size_t nx = (size_t)BH * T * hs, ns = (size_t)BH * T * T;
    float *q = rand_buf(nx), *k = rand_buf(nx), *v = rand_buf(nx), *a = rand_buf(ns), *dy = rand_buf(nx);
    float *s = rand_buf(ns), *y = rand_buf(nx), *da = rand_buf(ns), *dv = rand_buf(nx), *dq = rand_buf(nx),
          *dk = rand_buf(nx), *ds = rand_buf(ns);
    double *want = (double *)malloc(sizeof(double) * (ns > nx ? ns : nx));
    gg_gemm g;
    int b, i, j, d;
#define AT(p, i, j) (p)[(size_t)b * T * T + (size_t)(i) * T + (j)]
#define X(p, t, d) (p)[(size_t)b * T * hs + (size_t)(t) * hs + (d)]
#define WX(t, d) want[(size_t)b * T * hs + (size_t)(t) * hs + (d)]
#define WS(i, j) want[(size_t)b * T * T + (size_t)(i) * T + (j)]
    /* s = alpha q k^T */
    g = gg_att_scores(s, q, k, BH, T, hs, alpha);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (b = 0; b < BH; b++)
        for (i = 0; i < T; i++)
            for (j = 0; j < T; j++) {
                double acc = 0;
                for (d = 0; d < hs; d++) acc += (double)X(q, i, d) * X(k, j, d);
                WS(i, j) = alpha * acc;
            }
    ZT_CHECKF(max_err(s, want, ns) < TOL, "s = alpha q k^T: error %g", max_err(s, want, ns));
    /* y = a v */
    g = gg_att_values(y, a, v, BH, T, hs);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (b = 0; b < BH; b++)
        for (i = 0; i < T; i++)
            for (d = 0; d < hs; d++) {
                double acc = 0;
                for (j = 0; j < T; j++) acc += (double)AT(a, i, j) * X(v, j, d);
                WX(i, d) = acc;
            }
    ZT_CHECKF(max_err(y, want, nx) < TOL, "y = a v: error %g", max_err(y, want, nx));
    /* da = dy v^T */
    g = gg_att_bwd_a(da, dy, v, BH, T, hs);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (b = 0; b < BH; b++)
        for (i = 0; i < T; i++)
            for (j = 0; j < T; j++) {
                double acc = 0;
                for (d = 0; d < hs; d++) acc += (double)X(dy, i, d) * X(v, j, d);
                WS(i, j) = acc;
            }
    ZT_CHECKF(max_err(da, want, ns) < TOL, "da = dy v^T: error %g", max_err(da, want, ns));
    /* dv = a^T dy */
    g = gg_att_bwd_v(dv, a, dy, BH, T, hs);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (b = 0; b < BH; b++)
        for (j = 0; j < T; j++)
            for (d = 0; d < hs; d++) {
                double acc = 0;
                for (i = 0; i < T; i++) acc += (double)AT(a, i, j) * X(dy, i, d);
                WX(j, d) = acc;
            }
    ZT_CHECKF(max_err(dv, want, nx) < TOL, "dv = a^T dy: error %g", max_err(dv, want, nx));
    /* dq = alpha ds k */
    g = gg_att_bwd_q(dq, ds, k, BH, T, hs, alpha);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (b = 0; b < BH; b++)
        for (i = 0; i < T; i++)
            for (d = 0; d < hs; d++) {
                double acc = 0;
                for (j = 0; j < T; j++) acc += (double)AT(ds, i, j) * X(k, j, d);
                WX(i, d) = alpha * acc;
            }
    ZT_CHECKF(max_err(dq, want, nx) < TOL, "dq = alpha ds k: error %g", max_err(dq, want, nx));
    /* dk = alpha ds^T q */
    g = gg_att_bwd_k(dk, ds, q, BH, T, hs, alpha);
    ZT_CHECK(gg_valid(&g));
    ref_gemm(&g);
    for (b = 0; b < BH; b++)
        for (j = 0; j < T; j++)
            for (d = 0; d < hs; d++) {
                double acc = 0;
                for (i = 0; i < T; i++) acc += (double)AT(ds, i, j) * X(q, i, d);
                WX(j, d) = alpha * acc;
            }
    ZT_CHECKF(max_err(dk, want, nx) < TOL, "dk = alpha ds^T q: error %g", max_err(dk, want, nx));
#undef AT
#undef X
#undef WX
#undef WS
    free(q), free(k), free(v), free(a), free(dy), free(s), free(y), free(da), free(dv), free(dq), free(dk), free(ds);
    free(want);
}

/* gg_valid refuses what cuBLAS would refuse: a leading dimension below the stored rows. */
ZT_TEST(test_valid_rejects)
{
    float buf[64];
    gg_gemm g = gg_linear_fwd(buf, buf, buf, 4, 3, 5);
    ZT_CHECK(gg_valid(&g));
    g.lda = 4; /* W is read as [out=5 x in], ld 5 needed */
    ZT_CHECK(!gg_valid(&g));
    g = gg_linear_bwd_w(buf, buf, buf, 4, 3, 5);
    g.ldb = 2; /* x^T read from [in=3 x N] */
    ZT_CHECK(!gg_valid(&g));
    g = gg_lmhead_fwd(buf, buf, buf, 4, 3, 5);
    g.ldc = 4;
    ZT_CHECK(!gg_valid(&g));
}

ZT_TEST(test_token_lists)
{
    const int V = 37;
    const size_t sizes[] = {1, 2, 7, 64, 1000};
    size_t si;
    for (si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        size_t n = sizes[si], i;
        int *tok = (int *)malloc(sizeof(int) * n), *pos = (int *)malloc(sizeof(int) * n);
        int *count = (int *)malloc(sizeof(int) * V), *uniq = (int *)malloc(sizeof(int) * V);
        int *start = (int *)malloc(sizeof(int) * (V + 1)), *seen = (int *)calloc(n, sizeof(int));
        int u, U, p;
        /* n = 2: one token; n = 7: three of them; else all V */
        for (i = 0; i < n; i++) tok[i] = si == 1 ? 5 : (int)((rng_state = rng_state * 6364136223846793005ull + 1) >> 33) % (si == 2 ? 3 : V);
        U = gg_token_lists(tok, n, V, count, uniq, start, pos);
        ZT_CHECKF(U >= 1 && U <= V, "n %zu: U = %d", n, U);
        ZT_CHECKF(start[0] == 0 && start[U] == (int)n, "n %zu: start[0] %d start[U] %d", n, start[0], start[U]);
        for (u = 0; u < U; u++) {
            if (u) ZT_CHECKF(uniq[u] > uniq[u - 1], "n %zu: tokens not ascending at %d", n, u);
            ZT_CHECKF(start[u + 1] > start[u], "n %zu: token %d has no position", n, uniq[u]);
            for (p = start[u]; p < start[u + 1]; p++) {
                ZT_CHECKF(pos[p] >= 0 && (size_t)pos[p] < n, "n %zu: position %d out of range", n, pos[p]);
                if (pos[p] < 0 || (size_t)pos[p] >= n) continue;
                ZT_CHECKF(tok[pos[p]] == uniq[u], "n %zu: position %d listed under %d holds %d", n, pos[p], uniq[u],
                          tok[pos[p]]);
                if (p > start[u]) ZT_CHECKF(pos[p] > pos[p - 1], "n %zu: positions of %d not increasing", n, uniq[u]);
                seen[pos[p]]++;
            }
        }
        for (i = 0; i < n; i++) ZT_CHECKF(seen[i] == 1, "n %zu: position %zu listed %d times", n, i, seen[i]);
        free(tok), free(pos), free(count), free(uniq), free(start), free(seen);
    }
}

ZT_TEST(test_chunks)
{
    const size_t Ns[] = {1, 31, 32, 33, 4096, 32768, 32769, 1000003};
    size_t i;
    for (i = 0; i < sizeof Ns / sizeof Ns[0]; i++) {
        size_t rpc, chunks, N = Ns[i];
        gg_chunks(N, &rpc, &chunks);
        ZT_CHECKF(chunks >= 1 && chunks <= GG_MAX_CHUNKS, "N %zu: %zu chunks", N, chunks);
        ZT_CHECKF(rpc >= GG_MIN_CHUNK_ROWS, "N %zu: %zu rows per chunk", N, rpc);
        ZT_CHECKF(chunks * rpc >= N && (chunks - 1) * rpc < N, "N %zu: %zu chunks of %zu rows miss rows or add an empty one",
                  N, chunks, rpc);
    }
}

/* The demo's comparison of the stages: NCCL at N >= 3 sums stage 0's all-reduce and the
   other stages' reduce-scatter in different orders, so a healthy run's losses differ in the
   last bits there; identity is demanded only where the comm promises it. */
ZT_TEST(test_stage_agreement)
{
    double ref[4] = {5.5, 5.25, 5.0, 4.75}, x[4];
    int s;
    ZT_CHECK(gg_stages_promise_identity(0, 4) && gg_stages_promise_identity(0, 8)); /* --ranks */
    ZT_CHECK(gg_stages_promise_identity(1, 1) && gg_stages_promise_identity(1, 2));
    ZT_CHECK(!gg_stages_promise_identity(1, 3) && !gg_stages_promise_identity(1, 8));
    for (s = 0; s < 4; s++) x[s] = ref[s] * (1 + 3e-16 * (s + 1)); /* a few ulps: reduction order */
    ZT_CHECK(gg_losses_differ(ref, ref, 0, 4, 1, 0) == -1);
    ZT_CHECK(gg_losses_differ(x, ref, 0, 4, 1, 0) == 0);
    ZT_CHECK(gg_losses_differ(x, ref, 0, 4, gg_stages_promise_identity(1, 3), gg_stage_loss_bound(0)) == -1);
    ZT_CHECK(gg_losses_differ(x, ref, 1, 4, 1, 0) == 1); /* resumed: from 'first' */
    x[2] = ref[2] * (1 + 2e-4); /* beyond fp32's bound, within bf16's */
    ZT_CHECK(gg_losses_differ(x, ref, 0, 4, 0, gg_stage_loss_bound(0)) == 2);
    ZT_CHECK(gg_losses_differ(x, ref, 0, 4, 0, gg_stage_loss_bound(2)) == -1);
    x[3] = (double)NAN;
    ZT_CHECK(gg_losses_differ(x, ref, 3, 4, 0, 1.0) == 3);
    ZT_CHECK(gg_stage_loss_bound(0) < gg_stage_loss_bound(1) && gg_stage_loss_bound(1) < gg_stage_loss_bound(2));
}

int main(void)
{
    ZT_RUN(test_stage_agreement);
    ZT_RUN(test_linear);
    ZT_RUN(test_lm_head);
    ZT_RUN(test_attention);
    ZT_RUN(test_valid_rejects);
    ZT_RUN(test_token_lists);
    ZT_RUN(test_chunks);
    return zt_summary();
}
