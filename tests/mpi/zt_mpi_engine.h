/* The MPI engine tests' runner (test_mpi_engine.c, test_mpi_hier.c): tests/engine_common.h's
   rank function on this process's rank. Include after zt_mpi.h and engine_common.h. */
#ifndef ZT_MPI_ENGINE_H
#define ZT_MPI_ENGINE_H

/* This process's rank of cfg over MPI; state arrays start as 0xff bytes (never a value the
   run writes: NaN with every bit set), so what the rank holds is what is not 0xff. */
static inline ec_result *run_mpi_rank(const ec_cfg *c, ec_ctx *ctx, zero_comm *comm,
                                      zero_result (*fn)(int, zero_comm *, void *))
{
    ec_result *res = (ec_result *)calloc(1, sizeof *res);
    int t;
    memset(ctx, 0, sizeof *ctx);
    ctx->cfg = c;
    ctx->res = res;
    pthread_mutex_init(&ctx->mu, NULL);
    res->params_agree = 1;
    for (t = 0; t < c->ntensors; t++) {
        size_t n = c->sizes[t];
        res->master[t] = (float *)malloc(n * 4);
        res->m[t] = (float *)malloc(n * 4);
        res->v[t] = (float *)malloc(n * 4);
        res->param[t] = (unsigned char *)malloc(n * 4);
        memset(res->master[t], 0xff, n * 4);
        memset(res->m[t], 0xff, n * 4);
        memset(res->v[t], 0xff, n * 4);
        memset(res->param[t], 0xff, n * 4);
        ctx->param_rank[zm_rank][t] = (unsigned char *)calloc(n, 4);
    }
    res->rc = fn(zm_rank, comm, ctx);
    if (res->rc != ZERO_OK && !res->err[0]) snprintf(res->err, sizeof res->err, "%s", zero_last_error());
    for (t = 0; t < c->ntensors; t++) free(ctx->param_rank[zm_rank][t]);
    pthread_mutex_destroy(&ctx->mu);
    return res;
}

#endif
