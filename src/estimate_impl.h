/* Estimator implementation (section of zero.h): see src/estimate.h and docs/estimator.md. */

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

/* Paper mode: the device categories and host bytes of Psi = p. -1 on overflow. */
static int zero__estimate_paper(const zero_estimate_desc *r, uint64_t p, zero_estimate *e)
{
    uint64_t n = (uint64_t)r->ranks, shard = p / n + (p % n != 0); /* ceil(Psi / N) */
    uint64_t pn = r->stage >= 3 ? shard : p;                       /* params kept   */
    uint64_t gn = r->stage >= 2 ? shard : p;                       /* grads kept    */
    uint64_t on = r->stage >= 1 ? shard : p;                       /* optimizer kept */
    uint64_t opt, sum;
    if (zero__mul_u64(pn, (uint64_t)r->param_bytes, &e->params_bytes) ||
        zero__mul_u64(gn, (uint64_t)r->grad_bytes, &e->grads_bytes) ||
        zero__mul_u64(on, (uint64_t)r->optimizer_bytes, &opt))
        return -1;
    e->optimizer_bytes = r->offload ? 0 : opt;
    e->host_bytes = r->offload ? opt : 0;
    if (zero__add_u64(e->params_bytes, e->grads_bytes, &sum) ||
        zero__add_u64(sum, e->optimizer_bytes, &e->device_bytes))
        return -1;
    e->gather_bytes = 0;
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

/* The inverse's predicate: Psi = p is computable and its device bytes fit. Monotone: once
   false it stays false as p grows (every byte count is non-decreasing in p). */
static int zero__estimate_fits(const zero_estimate_desc *r, uint64_t p, uint64_t memory)
{
    zero_estimate e;
    return zero__estimate_all(r, p, &e) == 0 && e.device_bytes <= memory;
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
        *out = hi;
        return ZERO_OK;
    }
    while (hi - lo > 1) { /* fits(lo) and not fits(hi) */
        uint64_t mid = lo + (hi - lo) / 2;
        if (zero__estimate_fits(&r, mid, device_memory)) lo = mid;
        else hi = mid;
    }
    *out = lo;
    return ZERO_OK;
}
