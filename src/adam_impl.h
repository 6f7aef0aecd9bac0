/* Optimizer implementation (section of zero.h): Adam/AdamW descriptors and per-step
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
    if (d.lr == 0.0f) d.lr = 1e-3f;
    if (d.beta1 == 0.0f) d.beta1 = 0.9f;
    if (d.beta2 == 0.0f) d.beta2 = 0.999f;
    if (d.eps == 0.0f) d.eps = 1e-8f;
    if (d.mode != ZERO_ADAMW && d.mode != ZERO_ADAM)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_desc_resolve: mode = %d",
                          (int)d.mode);
    /* comparisons written so that NaN fails them */
    if (!(d.lr >= 0.0f) || !isfinite(d.lr))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: lr = %g (must be finite and >= 0)", (double)d.lr);
    if (!(d.beta1 >= 0.0f && d.beta1 < 1.0f))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: beta1 = %g (must be in [0, 1))", (double)d.beta1);
    if (!(d.beta2 >= 0.0f && d.beta2 < 1.0f))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: beta2 = %g (must be in [0, 1))", (double)d.beta2);
    if (!(d.eps > 0.0f) || !isfinite(d.eps))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: eps = %g (must be finite and > 0)", (double)d.eps);
    if (!(d.weight_decay >= 0.0f) || !isfinite(d.weight_decay))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_desc_resolve: weight_decay = %g (must be finite and >= 0)",
                          (double)d.weight_decay);
    *out = d;
    return ZERO_OK;
}

ZERODEF zero_result zero_adam_coefs_make(zero_adam_coefs *out, const zero_adam_desc *desc,
                                         float weight_decay, int64_t step)
{
    zero_adam_desc d;
    zero_adam_coefs c;
    double t, lr, b1, b2, wd, bc1, bc2;
    zero_result r;
    memset(&d, 0, sizeof d); /* resolve writes it on success; this quiets -O3's doubts */
    if (!out) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_coefs_make: out is NULL");
    if (!desc) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_adam_coefs_make: desc is NULL");
    r = zero_adam_desc_resolve(&d, desc);
    if (r != ZERO_OK) return r;
    if (step < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_coefs_make: step = %lld (steps count from 1)", (long long)step);
    if (!(weight_decay >= 0.0f) || !isfinite(weight_decay))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_coefs_make: weight_decay = %g (must be finite and >= 0)",
                          (double)weight_decay);
    t = (double)step;
    lr = (double)d.lr;
    b1 = (double)d.beta1;
    b2 = (double)d.beta2;
    wd = (double)weight_decay;
    bc1 = 1.0 - pow(b1, t);
    bc2 = 1.0 - pow(b2, t);
    c.beta1 = d.beta1;
    c.one_minus_beta1 = (float)(1.0 - b1);
    c.beta2 = d.beta2;
    c.one_minus_beta2 = (float)(1.0 - b2);
    c.step_size = (float)(lr / bc1);
    c.inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2));
    c.eps = d.eps;
    if (d.mode == ZERO_ADAMW) {
        c.decay = (float)(1.0 - lr * wd);
        c.l2 = 0.0f;
    } else {
        c.decay = 1.0f;
        c.l2 = weight_decay;
    }
    if (!isfinite(c.step_size) || !isfinite(c.inv_sqrt_bc2) || !isfinite(c.decay))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_adam_coefs_make: lr = %g, weight_decay = %g at step %lld give a "
                          "coefficient that is not finite in fp32",
                          (double)d.lr, (double)weight_decay, (long long)step);
    *out = c;
    return ZERO_OK;
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

ZERO__AVX2 static inline __attribute__((always_inline)) void
zero__adam_avx2_body(const zero_adam_range *r, const zero_adam_coefs *c, float grad_mul,
                     size_t *pi, size_t end, zero_dtype gk, zero_dtype pk)
{
    const __m256 gm = _mm256_set1_ps(grad_mul), l2 = _mm256_set1_ps(c->l2);
    const __m256 b1 = _mm256_set1_ps(c->beta1), omb1 = _mm256_set1_ps(c->one_minus_beta1);
    const __m256 b2 = _mm256_set1_ps(c->beta2), omb2 = _mm256_set1_ps(c->one_minus_beta2);
    const __m256 ibc2 = _mm256_set1_ps(c->inv_sqrt_bc2), eps = _mm256_set1_ps(c->eps);
    const __m256 decay = _mm256_set1_ps(c->decay), nstep = _mm256_set1_ps(-c->step_size);
    size_t i = *pi;
    for (; i + 8 <= end; i += 8) {
        __m256 g, p, m, v, mm, vv, denom, pp;
        if (gk == ZERO_F16) g = zero__f16x8_to_f32_avx2((const uint16_t *)r->grad + i);
        else if (gk == ZERO_BF16) g = zero__bf16x8_to_f32_avx2((const uint16_t *)r->grad + i);
        else g = _mm256_loadu_ps((const float *)r->grad + i);
        p = _mm256_loadu_ps(r->master + i);
        m = _mm256_loadu_ps(r->m + i);
        v = _mm256_loadu_ps(r->v + i);
        g = _mm256_mul_ps(g, gm);                                          /* g * grad_mul */
        g = _mm256_fmadd_ps(l2, p, g);                                     /* fmaf(l2, p, g) */
        mm = _mm256_fmadd_ps(b1, m, _mm256_mul_ps(omb1, g));
        vv = _mm256_fmadd_ps(b2, v, _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
        denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vv), ibc2, eps);
        pp = _mm256_mul_ps(p, decay);
        p = _mm256_fmadd_ps(nstep, _mm256_div_ps(mm, denom), pp);
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
    const __m512 b1 = _mm512_set1_ps(c->beta1), omb1 = _mm512_set1_ps(c->one_minus_beta1);
    const __m512 b2 = _mm512_set1_ps(c->beta2), omb2 = _mm512_set1_ps(c->one_minus_beta2);
    const __m512 ibc2 = _mm512_set1_ps(c->inv_sqrt_bc2), eps = _mm512_set1_ps(c->eps);
    const __m512 decay = _mm512_set1_ps(c->decay), nstep = _mm512_set1_ps(-c->step_size);
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
        mm = _mm512_fmadd_ps(b1, m, _mm512_mul_ps(omb1, g));
        vv = _mm512_fmadd_ps(b2, v, _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
        denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), ibc2, eps);
        pp = _mm512_mul_ps(p, decay);
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

static void zero__adam_run(const zero__adam_job *job)
{
    if (job->begin >= job->end) return;
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
