/* The engine's device memory at real shapes: buffers bounded by settings, not by the largest
   group. GPT-2 124M's tensors (Hugging Face's list: one group per block, the embeddings wte
   and wpe in their own group, ln_f in its own), fp32, N = 4: the accounting of a commit at
   stages 2 and 3 with the default settings against the model states, untiled and with the
   embedding in 8 tiles. A commit of the real shapes on 4 thread-ranks would take ~3.5 GB, so
   the device here hands out untouched anonymous mappings for large buffers (the kernel gives
   zero pages, so commit's zero-fill is skipped): the engine's own byte counts are exact
   either way. The same program then runs, at a scaled-down GPT with the same proportions, the
   call pattern of a GPT training step (embedding gathered at the start and at the end, the
   tied LM head's gradient and the lookup's as two parts): it fits the default arena and the
   stages stay bit-identical. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"
#include "tests/lazy_device.h"

/* ---- a GPT-2 model as Hugging Face lists its tensors ------------------------------------- */

typedef struct gpt_shape {
    size_t V, T, C;
    int L, tiles; /* tiles 0: wte whole in the embedding group with wpe */
} gpt_shape;

enum { GT_WTE = 0, GT_WPE = 1 }; /* logical tensor ids of the embeddings; blocks follow */

/* The groups: untiled E = {wte, wpe} is group 0; tiled, wte's tiles are groups 0..K-1 and
   wpe group K. Then one group per block, then ln_f. */
static int gpt_group_embed_end(const gpt_shape *s) { return s->tiles ? s->tiles + 1 : 1; }
static int gpt_group_block(const gpt_shape *s, int l) { return gpt_group_embed_end(s) + l; }
static int gpt_group_lnf(const gpt_shape *s) { return gpt_group_embed_end(s) + s->L; }

/* Rows of wte in tile k of K: the first V % K tiles take one row more. */
static void gpt_tile_rows(size_t V, int K, int k, size_t *row0, size_t *rows)
{
    size_t q = V / (size_t)K, rm = V % (size_t)K;
    *rows = q + ((size_t)k < rm);
    *row0 = (size_t)k * q + ((size_t)k < rm ? (size_t)k : rm);
}

typedef struct gpt_tensor { /* one registered tensor */
    int id, group, logical;
    size_t numel, logical_off; /* its first element in the logical tensor */
    unsigned flags;
} gpt_tensor;

#define GPT_MAX_T 200
typedef struct gpt_model {
    gpt_tensor t[GPT_MAX_T];
    int n, nlogical;
    size_t logical_numel[GPT_MAX_T];
} gpt_model;

static zero_result gpt_add(zero_engine *e, gpt_model *m, const char *name, size_t numel, int group,
                           int logical, size_t loff, unsigned flags)
{
    gpt_tensor *x = &m->t[m->n];
    zero_result r = zero_engine_add_tensor(e, name, numel, group, flags, &x->id);
    if (r != ZERO_OK) return r;
    x->group = group;
    x->logical = logical;
    x->numel = numel;
    x->logical_off = loff;
    x->flags = flags;
    m->n++;
    if (logical + 1 > m->nlogical) m->nlogical = logical + 1;
    if (loff + numel > m->logical_numel[logical]) m->logical_numel[logical] = loff + numel;
    return ZERO_OK;
}

static zero_result gpt_register(zero_engine *e, const gpt_shape *s, gpt_model *m)
{
    static const char *bn[] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                               "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                               "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
    size_t C = s->C, bs[12];
    char name[96];
    zero_result r = ZERO_OK;
    int l, k, lg = 2;
    bs[0] = bs[1] = bs[6] = bs[7] = C;
    bs[2] = C * 3 * C;
    bs[3] = 3 * C;
    bs[4] = C * C;
    bs[5] = bs[11] = C;
    bs[8] = bs[10] = C * 4 * C;
    bs[9] = 4 * C;
    memset(m, 0, sizeof *m);
    if (!s->tiles) {
        r = gpt_add(e, m, "transformer.wte.weight", s->V * C, 0, GT_WTE, 0, 0);
    } else { /* the helper: tile k in group k, its rows' view */
        int first = -1;
        r = zero_engine_add_tiled_tensor(e, "transformer.wte.weight", s->V, C, s->tiles, 0, 0, &first);
        for (k = 0; k < s->tiles && r == ZERO_OK; k++) {
            zero_tile_view v;
            size_t row0, rows;
            gpt_tile_rows(s->V, s->tiles, k, &row0, &rows);
            r = zero_engine_tile_view(e, first, k, &v);
            if (r == ZERO_OK && (v.tensor != first + k || v.group != k || v.row0 != row0 ||
                                 v.rows != rows || v.cols != C))
                r = ZERO_ERROR_INVALID_STATE; /* the view disagrees with the split rule */
            if (r == ZERO_OK) {
                gpt_tensor *x = &m->t[m->n++];
                x->id = v.tensor;
                x->group = v.group;
                x->logical = GT_WTE;
                x->numel = v.rows * C;
                x->logical_off = v.row0 * C;
                m->logical_numel[GT_WTE] = s->V * C;
            }
        }
    }
    if (r == ZERO_OK) r = gpt_add(e, m, "transformer.wpe.weight", s->T * C, s->tiles ? s->tiles : 0, GT_WPE, 0, 0);
    for (l = 0; l < s->L && r == ZERO_OK; l++)
        for (k = 0; k < 12 && r == ZERO_OK; k++) {
            snprintf(name, sizeof name, "transformer.h.%d.%s", l, bn[k]);
            r = gpt_add(e, m, name, bs[k], gpt_group_block(s, l), lg++, 0,
                        (k % 2 == 1 || k == 0 || k == 6) ? ZERO_TENSOR_NO_DECAY : 0);
        }
    if (r == ZERO_OK) r = gpt_add(e, m, "transformer.ln_f.weight", C, gpt_group_lnf(s), lg++, 0, ZERO_TENSOR_NO_DECAY);
    if (r == ZERO_OK) r = gpt_add(e, m, "transformer.ln_f.bias", C, gpt_group_lnf(s), lg++, 0, ZERO_TENSOR_NO_DECAY);
    return r;
}

/* ---- accounting at GPT-2 124M's shapes ----------------------------------------------------- */

typedef struct acct {
    gpt_shape shape;
    int stage;
    zero_engine_memory mem[4];
    zero_engine_desc desc;
    size_t P, S;
    char err[512];
} acct;

static zero_result acct_rank(int rank, zero_comm *comm, void *user)
{
    acct *A = (acct *)user;
    zero_device *dev = NULL, *host = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    gpt_model *m = (gpt_model *)malloc(sizeof *m);
    zero_result r = m ? lz_device_create(&dev, &host) : ZERO_ERROR_OUT_OF_MEMORY;
    memset(&d, 0, sizeof d);
    d.stage = A->stage;
    d.param_dtype = ZERO_F32;
    d.device = dev;
    d.comm = comm;
    if (r == ZERO_OK) r = zero_engine_create(&d, &e);
    if (r == ZERO_OK) r = gpt_register(e, &A->shape, m);
    if (r == ZERO_OK) r = zero_engine_commit(e);
    if (r == ZERO_OK) r = zero_engine_memory_usage(e, &A->mem[rank]);
    if (r == ZERO_OK && rank == 0) {
        const zero_plan *p = zero_engine_plan(e);
        int g;
        zero_engine_get_desc(e, &A->desc);
        A->P = zero_plan_total_numel(p);
        A->S = 0;
        for (g = 0; g < zero_plan_num_groups(p); g++) {
            zero_group_info gi;
            zero_plan_group(p, g, &gi);
            A->S += gi.shard_numel;
        }
    }
    if (r != ZERO_OK && rank == 0) snprintf(A->err, sizeof A->err, "%s", zero_last_error());
    zero_engine_destroy(e);
    free(dev);
    zero_device_destroy(host);
    free(m);
    return r;
}

static size_t states_of(const zero_engine_memory *m)
{
    return m->bytes[ZERO_MEM_PARAM] + m->bytes[ZERO_MEM_GRAD] + m->bytes[ZERO_MEM_MASTER] +
           m->bytes[ZERO_MEM_MOMENT1] + m->bytes[ZERO_MEM_MOMENT2];
}

static const gpt_shape gpt2_124m = {50257, 1024, 768, 12, 0};

ZT_TEST(gpt2_124m_device_bytes)
{
    acct *a2 = (acct *)calloc(1, sizeof *a2), *a3 = (acct *)calloc(1, sizeof *a3);
    acct *t3 = (acct *)calloc(1, sizeof *t3);
    size_t st3, tot2, tot3, tt3, tst3;
    int rk;
    zero_result r;
    a2->shape = a3->shape = t3->shape = gpt2_124m;
    t3->shape.tiles = 8;
    a2->stage = 2;
    a3->stage = t3->stage = 3;
    r = zero_local_run(4, acct_rank, a2);
    ZT_CHECKF(r == ZERO_OK, "stage 2: %s", a2->err);
    r = zero_local_run(4, acct_rank, a3);
    ZT_CHECKF(r == ZERO_OK, "stage 3: %s", a3->err);
    r = zero_local_run(4, acct_rank, t3);
    ZT_CHECKF(r == ZERO_OK, "stage 3 tiled: %s", t3->err);
    if (r == ZERO_OK) {
        /* 124,439,808 parameters (Hugging Face's count), padded per group */
        ZT_CHECKF(a3->P >= 124439808 && a3->P < 124439808 + 64 * 16, "P = %zu", a3->P);
        st3 = states_of(&a3->mem[0]);
        tot2 = a2->mem[0].total_bytes;
        tot3 = a3->mem[0].total_bytes;
        tst3 = states_of(&t3->mem[0]);
        tt3 = t3->mem[0].total_bytes;
        /* model states at stage 3, fp32: params, grads, master, m, v = 20 bytes x S */
        ZT_CHECK(st3 == 20 * a3->S);
        for (rk = 0; rk < 4; rk++) {
            ZT_CHECK(a3->mem[rk].total_bytes == tot3 && a2->mem[rk].total_bytes == tot2);
            /* device bytes = model states + arena + bucket + scratch, exactly */
            ZT_CHECK(a3->mem[rk].total_bytes == states_of(&a3->mem[rk]) +
                                                    a3->desc.max_live_numel * 4 +
                                                    a3->mem[rk].bytes[ZERO_MEM_BUCKET] + 64);
        }
        ZT_CHECK(a3->mem[0].bytes[ZERO_MEM_BUCKET] == 0); /* fp32 reduces in the param dtype */
        printf("  GPT-2 124M fp32 N=4, default settings, device bytes per rank:\n"
               "    stage 2: %.1f MB; stage 3: %.1f MB = model states %.1f MB + arena %.1f MB "
               "(%zu elements) + %zu B = %.3fx the states\n"
               "    stage 3, wte in 8 tiles: %.1f MB = states %.1f MB + arena %.1f MB = %.3fx\n",
               tot2 / 1e6, tot3 / 1e6, st3 / 1e6, a3->mem[0].bytes[ZERO_MEM_GATHER] / 1e6,
               a3->desc.max_live_numel, a3->mem[0].bytes[ZERO_MEM_SCRATCH], (double)tot3 / (double)st3,
               tt3 / 1e6, tst3 / 1e6, t3->mem[0].bytes[ZERO_MEM_GATHER] / 1e6,
               (double)tt3 / (double)tst3);
        ZT_CHECKF(tot3 < tot2, "stage 3 %zu >= stage 2 %zu", tot3, tot2);
        ZT_CHECKF((double)tot3 <= 1.45 * (double)st3, "stage 3: %.3fx", (double)tot3 / (double)st3);
        ZT_CHECKF((double)tt3 <= 1.25 * (double)tst3, "tiled: %.3fx", (double)tt3 / (double)tst3);
    }
    free(a2);
    free(a3);
    free(t3);
}

/* ---- the call pattern of a GPT training step, at scaled-down shapes --------------------- */

typedef struct grun {
    gpt_shape shape;
    int stage, accum, steps, parts; /* parts: 2 = the tied LM head's and the lookup's gradients
                                       as two parts of the embedding groups (1: held together) */
    size_t max_live;                /* 0 = default */
    int world, depth;               /* depth: prefetch_depth (0 = default) */
    int change_at;                  /* > 0: from this step on the forward runs the blocks in
                                       reverse, and one micro-step gathers the embedding once
                                       more at its end (the order changes twice) */
    /* results */
    float *master[GPT_MAX_T], *mm[GPT_MAX_T], *vv[GPT_MAX_T], *param[GPT_MAX_T];
    int nlogical;
    zero_gather_stats gs[EC_MAX_RANKS];
    zero_traffic traffic[EC_MAX_RANKS];
    zero_engine_memory mem[EC_MAX_RANKS];
    zero_engine_desc desc;
    size_t P, W; /* plan total, the embedding groups' (wte and wpe) total */
    char err[512];
    pthread_mutex_t mu;
} grun;

static int gpt_touched_row(size_t row, int micro, int step) { return (row * 7 + (size_t)(micro + step)) % 5 == 0; }

/* Group g's synthetic gradient (this rank, micro-step k, step s) into gp: part 1 of an
   embedding group = the LM head's (every wte row, from the params pp), part 2 = the lookup's
   (touched wte rows and all of wpe, independent of the params); other groups from pp. With
   one part the embedding's two contributions are summed in one buffer. */
static void gpt_fill(const grun *G, const gpt_model *m, const zero_plan *plan, int g, int part,
                     int rank, int k, int s, const float *pp, float *gp)
{
    int i;
    for (i = 0; i < m->n; i++) {
        const gpt_tensor *x = &m->t[i];
        zero_tensor_info ti;
        size_t j;
        if (x->group != g) continue;
        zero_plan_tensor(plan, x->id, &ti);
        for (j = 0; j < x->numel; j++) {
            size_t lj = x->logical_off + j;
            double v = 0.0;
            int lm = G->parts == 1 || part == 0, lk = G->parts == 1 || part == 1;
            if (x->logical == GT_WTE) {
                if (lm) v += ec_synth_grad(pp[ti.offset + j], rank, k, s, lj, GT_WTE);
                if (lk && gpt_touched_row(lj / G->shape.C, k, s))
                    v += ec_synth_grad(0.0f, rank, k + 17, s, lj, GT_WTE);
            } else if (x->logical == GT_WPE) {
                if (lk) v = ec_synth_grad(0.0f, rank, k, s, lj, GT_WPE);
            } else {
                v = ec_synth_grad(pp[ti.offset + j], rank, k, s, lj, x->logical);
            }
            gp[ti.offset + j] = (float)v;
        }
    }
}

static int gpt_is_wte_group(const gpt_shape *s, int g) { return s->tiles ? g < s->tiles : g == 0; }

static zero_result grun_rank(int rank, zero_comm *comm, void *user)
{
    grun *G = (grun *)user;
    const gpt_shape *sh = &G->shape;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    gpt_model *m = (gpt_model *)malloc(sizeof *m);
    const zero_plan *plan = NULL;
    zero_result r = m ? zero_host_device_create(NULL, &dev) : ZERO_ERROR_OUT_OF_MEMORY;
    float *tmp = NULL, *keep = NULL;
    int g, s, k, i, NG = 0, E = gpt_group_embed_end(sh);
    void *pp, *gp;
    memset(&d, 0, sizeof d);
    d.stage = G->stage;
    d.param_dtype = ZERO_F32;
    d.accum_steps = G->accum;
    d.max_live_numel = G->max_live;
    d.prefetch_depth = G->depth;
    d.device = dev;
    d.comm = comm;
    if (r == ZERO_OK) r = zero_engine_create(&d, &e);
    if (r == ZERO_OK) r = gpt_register(e, sh, m);
    for (g = 0; g < E && r == ZERO_OK && G->parts > 1; g++)
        if (gpt_is_wte_group(sh, g)) r = zero_engine_set_grad_parts(e, g, 2);
    if (r == ZERO_OK) r = zero_engine_commit(e);
    if (r == ZERO_OK) {
        size_t mx = 0;
        plan = zero_engine_plan(e);
        NG = zero_plan_num_groups(plan);
        for (g = 0; g < NG; g++) {
            zero_group_info gi;
            zero_plan_group(plan, g, &gi);
            if (gi.numel > mx) mx = gi.numel;
        }
        tmp = (float *)malloc(mx * sizeof *tmp);
        keep = (float *)malloc(mx * sizeof *keep);
        if (!tmp || !keep) r = ZERO_ERROR_OUT_OF_MEMORY;
    }
    if (r == ZERO_OK && rank == 0) {
        G->P = zero_plan_total_numel(plan);
        G->W = 0;
        for (g = 0; g < E; g++) {
            zero_group_info gi;
            zero_plan_group(plan, g, &gi);
            G->W += gi.numel;
        }
        G->nlogical = m->nlogical;
    }
    for (i = 0; i < m->n && r == ZERO_OK; i++) {
        size_t j;
        for (j = 0; j < m->t[i].numel; j++) tmp[j] = ec_init_value(m->t[i].logical, m->t[i].logical_off + j);
        r = zero_engine_set_tensor(e, m->t[i].id, tmp);
    }
    for (s = 0; s < G->steps && r == ZERO_OK; s++) {
        zero_step_info info;
        for (k = 0; k < G->accum && r == ZERO_OK; k++) {
#define GT(call) do { if (r == ZERO_OK) r = (call); } while (0)
            /* forward: the lookup, the blocks, ln_f, the tied LM head */
            for (g = 0; g < E; g++) { GT(zero_engine_gather(e, g, &pp)); GT(zero_engine_release(e, g)); }
            for (i = E; i < NG; i++) {
                g = G->change_at > 0 && s >= G->change_at && i < NG - 1 ? NG - 2 - (i - E) : i;
                GT(zero_engine_gather(e, g, &pp));
                GT(zero_engine_release(e, g));
            }
            for (g = 0; g < E; g++)
                if (gpt_is_wte_group(sh, g)) { GT(zero_engine_gather(e, g, &pp)); GT(zero_engine_release(e, g)); }
            /* backward: the LM head (its input gradient needs the params, its weight gradient
               does not: release first), ln_f and the blocks in reverse, then the lookup */
            for (g = 0; g < E && r == ZERO_OK; g++) {
                zero_group_info gi;
                if (!gpt_is_wte_group(sh, g)) continue;
                zero_plan_group(plan, g, &gi);
                GT(zero_engine_gather(e, g, &pp));
                if (r == ZERO_OK) memcpy(keep, pp, gi.numel * sizeof(float));
                GT(zero_engine_release(e, g));
                if (G->parts == 1) continue; /* held: its buffer comes with the lookup's */
                GT(zero_engine_grads(e, g, &gp));
                if (r == ZERO_OK) gpt_fill(G, m, plan, g, 0, rank, k, s, keep, (float *)gp);
                GT(zero_engine_grads_ready(e, g));
            }
            for (g = NG - 1; g >= E && r == ZERO_OK; g--) {
                GT(zero_engine_gather(e, g, &pp));
                GT(zero_engine_grads(e, g, &gp));
                if (r == ZERO_OK) gpt_fill(G, m, plan, g, 0, rank, k, s, (const float *)pp, (float *)gp);
                GT(zero_engine_release(e, g));
                GT(zero_engine_grads_ready(e, g));
            }
            for (g = 0; g < E && r == ZERO_OK; g++) {
                GT(zero_engine_grads(e, g, &gp));
                if (r == ZERO_OK && G->parts == 1 && gpt_is_wte_group(sh, g)) {
                    /* both contributions in one buffer: the LM head's needs the params */
                    GT(zero_engine_gather(e, g, &pp));
                    if (r == ZERO_OK) gpt_fill(G, m, plan, g, 0, rank, k, s, (const float *)pp, (float *)gp);
                    GT(zero_engine_release(e, g));
                } else if (r == ZERO_OK) {
                    gpt_fill(G, m, plan, g, 1, rank, k, s, NULL, (float *)gp);
                }
                if (G->change_at > 0 && s == G->change_at && k == 0 && g == E - 1) {
                    GT(zero_engine_gather(e, 0, &pp)); /* one more use before the last part */
                    GT(zero_engine_release(e, 0));
                }
                GT(zero_engine_grads_ready(e, g));
            }
#undef GT
        }
        if (r == ZERO_OK) r = zero_engine_step(e, &info);
    }
    if (r == ZERO_OK) {
        zero_engine_gather_stats(e, &G->gs[rank]);
        zero_engine_traffic(e, &G->traffic[rank], NULL);
        zero_engine_memory_usage(e, &G->mem[rank]);
        if (rank == 0) zero_engine_get_desc(e, &G->desc);
    }
    for (i = 0; i < m->n && r == ZERO_OK; i++) {
        const gpt_tensor *x = &m->t[i];
        zero_range rg;
        int kind;
        for (kind = 0; kind < 4 && r == ZERO_OK; kind++) {
            float **dst = kind == 0 ? G->param : kind == 1 ? G->master : kind == 2 ? G->mm : G->vv;
            r = zero_engine_read_tensor(e, x->id, (zero_state_kind)kind, tmp, &rg);
            if (r == ZERO_OK) {
                pthread_mutex_lock(&G->mu);
                memcpy(dst[x->logical] + x->logical_off + rg.offset, tmp + rg.offset, rg.numel * sizeof(float));
                pthread_mutex_unlock(&G->mu);
            }
        }
    }
    if (r != ZERO_OK && G->err[0] == '\0') snprintf(G->err, sizeof G->err, "rank %d: %s", rank, zero_last_error());
    free(tmp);
    free(keep);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    free(m);
    return r;
}

static void grun_free(grun *G)
{
    int i;
    for (i = 0; i < GPT_MAX_T; i++) {
        free(G->master[i]);
        free(G->mm[i]);
        free(G->vv[i]);
        free(G->param[i]);
    }
    pthread_mutex_destroy(&G->mu);
    free(G);
}

/* The logical tensors' sizes of a shape (without an engine). */
static void gpt_logical_sizes(const gpt_shape *s, size_t *out, int *n)
{
    size_t C = s->C;
    static const size_t mul[12] = {1, 1, 3, 3, 1, 1, 1, 1, 4, 4, 4, 1};
    int l, k, i = 0;
    out[i++] = s->V * C;
    out[i++] = s->T * C;
    for (l = 0; l < s->L; l++)
        for (k = 0; k < 12; k++) out[i++] = (k == 2 || k == 4 || k == 8 || k == 10) ? C * mul[k] * C : mul[k] * C;
    out[i++] = C;
    out[i++] = C;
    *n = i;
}

static grun *grun_run(const grun *cfg)
{
    grun *G = (grun *)calloc(1, sizeof *G);
    size_t sizes[GPT_MAX_T];
    int i, n;
    zero_result r;
    *G = *cfg;
    pthread_mutex_init(&G->mu, NULL);
    gpt_logical_sizes(&G->shape, sizes, &n);
    for (i = 0; i < n; i++) {
        G->master[i] = (float *)calloc(sizes[i], sizeof(float));
        G->mm[i] = (float *)calloc(sizes[i], sizeof(float));
        G->vv[i] = (float *)calloc(sizes[i], sizeof(float));
        G->param[i] = (float *)calloc(sizes[i], sizeof(float));
    }
    r = zero_local_run(G->world, grun_rank, G);
    if (r != ZERO_OK && G->err[0] == '\0') snprintf(G->err, sizeof G->err, "%s", zero_last_error());
    G->nlogical = n;
    return G;
}

/* Bit-equality of every logical tensor's params, master, m and v. */
static int grun_same(const grun *a, const grun *b, char *why, size_t n)
{
    size_t sizes[GPT_MAX_T];
    int i, cnt, kind;
    gpt_logical_sizes(&a->shape, sizes, &cnt);
    for (i = 0; i < cnt; i++)
        for (kind = 0; kind < 4; kind++) {
            float *const *x = kind == 0 ? a->param : kind == 1 ? a->master : kind == 2 ? a->mm : a->vv;
            float *const *y = kind == 0 ? b->param : kind == 1 ? b->master : kind == 2 ? b->mm : b->vv;
            if (memcmp(x[i], y[i], sizes[i] * sizeof(float)) != 0) {
                snprintf(why, n, "logical tensor %d, %s differs", i,
                         kind == 0 ? "params" : kind == 1 ? "master" : kind == 2 ? "m" : "v");
                return 0;
            }
        }
    return 1;
}

/* A GPT with GPT-2 124M's proportions (the embedding ~5.6 blocks, 12 blocks), scaled down. */
static const gpt_shape gpt_small = {3139, 64, 48, 12, 0};

/* The arena GPT-2 124M gets by default (the largest group beside 3 blocks), at these shapes. */
static size_t big_model_arena(const grun *G)
{
    gpt_shape s = G->shape;
    size_t C = s.C, B = 12 * C * C + 13 * C, W = s.tiles ? 0 : (s.V + s.T) * C, M;
    size_t tile = s.tiles ? ((s.V + (size_t)s.tiles - 1) / (size_t)s.tiles) * C : 0;
    M = W > B ? W : B;
    if (tile > M) M = tile;
    return M + 3 * B; /* M + (2 + depth 1) x the second largest (a block) */
}

ZT_TEST(gpt_step_fits_the_default_arena)
{
    grun cfg;
    grun *ref = NULL;
    int st, rk;
    memset(&cfg, 0, sizeof cfg);
    cfg.shape = gpt_small;
    cfg.world = 4;
    cfg.accum = 2;
    cfg.steps = 2;
    cfg.parts = 2;
    for (st = 0; st <= 3; st++) {
        grun *G;
        char why[160];
        cfg.stage = st;
        /* the proportions of the large-model default (the scaled model is small enough for
           the small-model default, which holds any pattern): padding aside, the arena of the
           real GPT-2 124M; the run must fit it */
        cfg.max_live = st >= 2 ? big_model_arena(&cfg) + 64 * 16 : 0;
        G = grun_run(&cfg);
        ZT_CHECKF(G->err[0] == '\0', "stage %d: %s", st, G->err);
        if (st == 3 && G->err[0] == '\0') {
            double f = 3.0 / 4.0, P = (double)G->P, W = (double)G->W, A = cfg.accum;
            for (rk = 0; rk < 4; rk++) {
                const zero_gather_stats *g = &G->gs[rk];
                const zero_traffic *t = &G->traffic[rk];
                ZT_CHECKF(g->peak_live_numel <= g->limit_numel, "peak %zu limit %zu", g->peak_live_numel,
                          g->limit_numel);
                /* reduce-scatter: Psi, plus the embedding's second part */
                ZT_CHECKF(t->numel[ZERO_COLL_REDUCE_SCATTER] == A * (P + W) * f, "rs %.0f vs %.0f",
                          t->numel[ZERO_COLL_REDUCE_SCATTER], A * (P + W) * f);
                /* all-gather: the paper's 2 Psi (forward, backward) plus the embedding's
                   second use in the forward (the tied LM head); nothing wasted */
                ZT_CHECKF(t->numel[ZERO_COLL_ALL_GATHER] == A * (2 * P + W) * f, "ag %.0f vs %.0f",
                          t->numel[ZERO_COLL_ALL_GATHER], A * (2 * P + W) * f);
                ZT_CHECKF(g->prefetch_wasted == 0 && g->evictions == 0, "wasted %llu",
                          (unsigned long long)g->prefetch_wasted);
                ZT_CHECKF(g->prefetches > 0 && g->prefetch_hits == g->prefetches, "prefetched %llu used %llu",
                          (unsigned long long)g->prefetches, (unsigned long long)g->prefetch_hits);
                /* recorded once: 29 gathers (E, 12 blocks, ln_f, E; E, ln_f, 12 blocks) and 15
                   gradient buffers (E's two parts, ln_f, 12 blocks) per micro-step */
                ZT_CHECKF(g->trace_records == 1 && g->trace_len == 44, "records %llu len %d",
                          (unsigned long long)g->trace_records, g->trace_len);
            }
            if (!zt_quick())
                printf("  scaled GPT (P = %zu, embedding %zu), stage 3: arena %zu, peak %zu; gathers %llu, "
                       "prefetched %llu, used %llu, wasted %llu\n",
                       G->P, G->W, G->gs[0].limit_numel, G->gs[0].peak_live_numel,
                       (unsigned long long)G->gs[0].gathers, (unsigned long long)G->gs[0].prefetches,
                       (unsigned long long)G->gs[0].prefetch_hits, (unsigned long long)G->gs[0].prefetch_wasted);
        }
        if (!ref) {
            ref = G;
            continue;
        }
        if (G->err[0] == '\0' && ref->err[0] == '\0')
            ZT_CHECKF(grun_same(ref, G, why, sizeof why), "stage %d vs 0: %s", st, why);
        grun_free(G);
    }
    grun_free(ref);
}

/* The order changes (the forward runs the blocks in reverse from step 1 on, and one
   micro-step gathers the embedding once more at its end): no hang, no wrong data (stages
   0-3 bit-identical), the order re-recorded, and afterwards prefetches are used again. */
ZT_TEST(trace_follows_a_changed_order)
{
    grun cfg;
    grun *ref = NULL;
    int st, depth, rk;
    for (depth = 1; depth <= 3; depth += 2) {
        memset(&cfg, 0, sizeof cfg);
        cfg.shape = gpt_small;
        cfg.shape.L = 4;
        cfg.world = 3;
        cfg.accum = 2;
        cfg.steps = 4;
        cfg.parts = 2;
        cfg.change_at = 1;
        cfg.depth = depth;
        ref = NULL;
        for (st = 0; st <= 3; st++) {
            grun *G;
            char why[160];
            cfg.stage = st;
            G = grun_run(&cfg);
            ZT_CHECKF(G->err[0] == '\0', "depth %d stage %d: %s", depth, st, G->err);
            if (st == 3 && G->err[0] == '\0')
                for (rk = 0; rk < 3; rk++) {
                    const zero_gather_stats *g = &G->gs[rk];
                    /* recorded in step 0's first micro-step; step 1's first micro-step
                       departs (blocks reversed, then the extra gather: one new recording);
                       its second departs where it skips the extra gather (a third) */
                    ZT_CHECKF(g->trace_records == 3, "depth %d: records %llu", depth,
                              (unsigned long long)g->trace_records);
                    ZT_CHECK(g->prefetches == g->prefetch_hits + g->prefetch_wasted);
                    ZT_CHECK(g->live_numel == 0);
                }
            if (!ref) {
                ref = G;
                continue;
            }
            if (G->err[0] == '\0' && ref->err[0] == '\0')
                ZT_CHECKF(grun_same(ref, G, why, sizeof why), "depth %d stage %d vs 0: %s", depth, st, why);
            grun_free(G);
        }
        grun_free(ref);
    }
}

/* Memory-centric tiling: GPT's wte as 8 tile groups trains to the same bits as the whole
   tensor (the same synthetic arithmetic per element, tile by tile), in an arena too small
   for the whole embedding, where the untiled model fails commit naming the group and the
   value that fits. */
ZT_TEST(tiled_embedding_same_bits)
{
    grun cfg;
    int st, rk;
    for (st = 0; st <= 3; st += 1) {
        grun *whole, *tiled;
        char why[160];
        size_t C, B;
        memset(&cfg, 0, sizeof cfg);
        cfg.shape = gpt_small;
        cfg.world = 4;
        cfg.accum = 2;
        cfg.steps = 2;
        cfg.parts = 2;
        cfg.stage = st;
        whole = grun_run(&cfg);
        cfg.shape.tiles = 8;
        C = cfg.shape.C;
        B = 12 * C * C + 13 * C;
        /* the large-model default of the tiled model: the largest group (a block) + 3 */
        cfg.max_live = st >= 2 ? 4 * B + 64 * 16 : 0;
        tiled = grun_run(&cfg);
        ZT_CHECKF(whole->err[0] == '\0' && tiled->err[0] == '\0', "stage %d: %s %s", st, whole->err, tiled->err);
        if (whole->err[0] == '\0' && tiled->err[0] == '\0')
            ZT_CHECKF(grun_same(whole, tiled, why, sizeof why), "stage %d tiled vs whole: %s", st, why);
        if (st == 3 && tiled->err[0] == '\0')
            for (rk = 0; rk < 4; rk++) {
                const zero_gather_stats *g = &tiled->gs[rk];
                ZT_CHECK(g->limit_numel == cfg.max_live && g->peak_live_numel <= g->limit_numel);
                ZT_CHECK(g->prefetch_wasted == 0);
            }
        if (st == 3) { /* the whole embedding does not fit that arena */
            grun *bad;
            cfg.shape.tiles = 0;
            bad = grun_run(&cfg);
            ZT_CHECKF(strstr(bad->err, "transformer.wte.weight") && strstr(bad->err, "max_live_numel >= 153792"),
                      "%s", bad->err);
            grun_free(bad);
        }
        grun_free(whole);
        grun_free(tiled);
    }
}

/* The helper's errors and views. */
static zero_result tile_api_rank(int rank, zero_comm *comm, void *user)
{
    int *bad = (int *)user, first = -1, first2 = -1;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_tile_view v;
    (void)rank;
    memset(&d, 0, sizeof d);
    d.stage = 3;
    zero_host_device_create(NULL, &dev);
    d.device = dev;
    d.comm = comm;
    zero_engine_create(&d, &e);
    *bad |= zero_engine_add_tiled_tensor(e, "w", 10, 3, 0, 0, 0, &first) != ZERO_ERROR_INVALID_ARGUMENT;
    *bad |= zero_engine_add_tiled_tensor(e, "w", 10, 3, 11, 0, 0, &first) != ZERO_ERROR_INVALID_ARGUMENT;
    *bad |= zero_engine_add_tiled_tensor(e, "w", 0, 3, 1, 0, 0, &first) != ZERO_ERROR_INVALID_ARGUMENT;
    *bad |= zero_engine_add_tiled_tensor(e, NULL, 10, 3, 1, 0, 0, &first) != ZERO_ERROR_INVALID_ARGUMENT;
    *bad |= zero_engine_add_tiled_tensor(e, "w", 10, 3, 2, -1, 0, &first) != ZERO_ERROR_INVALID_ARGUMENT;
    *bad |= zero_engine_add_tensor(e, "b", 5, 0, 0, NULL) != ZERO_OK;
    /* 10 rows in 4 tiles: 3, 3, 2, 2 rows, groups 1..4 */
    *bad |= zero_engine_add_tiled_tensor(e, "w", 10, 3, 4, 1, ZERO_TENSOR_NO_DECAY, &first) != ZERO_OK;
    *bad |= first != 1;
    *bad |= zero_engine_add_tiled_tensor(e, "u", 7, 2, 7, 5, 0, &first2) != ZERO_OK;
    *bad |= zero_engine_tile_view(e, first, 4, &v) != ZERO_ERROR_NOT_FOUND;
    *bad |= zero_engine_tile_view(e, 0, 0, &v) != ZERO_ERROR_NOT_FOUND;
    *bad |= zero_engine_tile_view(e, first, 2, &v) != ZERO_OK || v.tensor != 3 || v.group != 3 ||
            v.row0 != 6 || v.rows != 2 || v.cols != 3;
    *bad |= zero_engine_commit(e) != ZERO_OK;
    *bad |= zero_engine_add_tiled_tensor(e, "z", 4, 4, 2, 20, 0, NULL) != ZERO_ERROR_INVALID_STATE;
    *bad |= zero_engine_tile_view(e, first2, 6, &v) != ZERO_OK || v.tensor != first2 + 6 ||
            v.group != 11 || v.row0 != 6 || v.rows != 1 || v.offset != 0;
    {
        int nd;
        uint64_t dims[ZERO_TENSOR_MAX_DIMS];
        *bad |= zero_engine_tensor_shape(e, first + 1, &nd, dims) != ZERO_OK || nd != 2 || dims[0] != 3 ||
                dims[1] != 3;
    }
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

ZT_TEST(tiled_tensor_api)
{
    int bad = 0;
    ZT_CHECK(zero_local_run(1, tile_api_rank, &bad) == ZERO_OK);
    ZT_CHECK(bad == 0);
}

/* zero_engine_set_grad_parts: errors, the micro-step's end, and at stages 0-1 the
   accumulator it makes separate (alias off). One rank. */
static zero_result parts_rank(int rank, zero_comm *comm, void *user)
{
    int *fails = (int *)user, st;
    (void)rank;
    for (st = 0; st <= 3; st++) {
        zero_device *dev = NULL;
        zero_engine *e = NULL;
        zero_engine_desc d;
        zero_engine_memory mem;
        void *p;
        int k, bad = 0;
        memset(&d, 0, sizeof d);
        d.stage = st;
        d.param_dtype = ZERO_F32;
        d.device = NULL;
        d.comm = comm;
        if (zero_host_device_create(NULL, &dev) != ZERO_OK) return ZERO_ERROR_OUT_OF_MEMORY;
        d.device = dev;
        if (zero_engine_create(&d, &e) != ZERO_OK) return ZERO_ERROR_OUT_OF_MEMORY;
        bad |= zero_engine_add_tensor(e, "a", 100, 0, 0, NULL) != ZERO_OK;
        bad |= zero_engine_add_tensor(e, "b", 30, 1, 0, NULL) != ZERO_OK;
        bad |= zero_engine_set_grad_parts(e, -1, 2) != ZERO_ERROR_INVALID_ARGUMENT;
        bad |= zero_engine_set_grad_parts(e, 0, 0) != ZERO_ERROR_INVALID_ARGUMENT;
        bad |= zero_engine_set_grad_parts(e, 0, ZERO_MAX_GRAD_PARTS + 1) != ZERO_ERROR_INVALID_ARGUMENT;
        bad |= zero_engine_set_grad_parts(e, 0, 3) != ZERO_OK;
        bad |= zero_engine_commit(e) != ZERO_OK;
        bad |= zero_engine_set_grad_parts(e, 0, 2) != ZERO_ERROR_INVALID_STATE;
        zero_engine_memory_usage(e, &mem);
        /* stages 0-1 with accum 1: the accumulator exists although the dtypes agree */
        if (st == 0) bad |= mem.bytes[ZERO_MEM_GRAD] != (112 + 32) * 4 * 2;
        if (st == 1) bad |= mem.bytes[ZERO_MEM_GRAD] != (112 + 32) * 4 + (112 + 32) * 4;
        /* group 0 three times, group 1 once; the micro-step ends with the fourth part */
        for (k = 0; k < 3 && !bad; k++) {
            bad |= zero_engine_grads(e, 0, &p) != ZERO_OK;
            bad |= zero_engine_grads_ready(e, 0) != ZERO_OK;
            bad |= zero_engine_step(e, NULL) != ZERO_ERROR_INVALID_STATE;
        }
        bad |= zero_engine_grads(e, 0, &p) != ZERO_ERROR_INVALID_STATE; /* all 3 parts done */
        bad |= zero_engine_grads(e, 1, &p) != ZERO_OK;
        bad |= zero_engine_grads_ready(e, 1) != ZERO_OK;
        bad |= zero_engine_step(e, NULL) != ZERO_OK;
        zero_engine_destroy(e);
        zero_device_destroy(dev);
        if (bad) fails[st] = 1;
    }
    /* a group with no tensor */
    {
        zero_device *dev = NULL;
        zero_engine *e = NULL;
        zero_engine_desc d;
        memset(&d, 0, sizeof d);
        zero_host_device_create(NULL, &dev);
        d.device = dev;
        d.comm = comm;
        zero_engine_create(&d, &e);
        zero_engine_add_tensor(e, "a", 10, 0, 0, NULL);
        zero_engine_set_grad_parts(e, 5, 2);
        if (zero_engine_commit(e) != ZERO_ERROR_INVALID_ARGUMENT || !strstr(zero_last_error(), "group 5"))
            fails[4] = 1;
        zero_engine_destroy(e);
        zero_device_destroy(dev);
    }
    return ZERO_OK;
}

ZT_TEST(grad_parts_api)
{
    int fails[5] = {0, 0, 0, 0, 0}, i;
    ZT_CHECK(zero_local_run(1, parts_rank, fails) == ZERO_OK);
    for (i = 0; i < 5; i++) ZT_CHECKF(fails[i] == 0, "case %d", i);
}

int main(void)
{
    (void)ec_cfg_init; /* the harness is included for its synthetic gradients */
    ZT_RUN(gpt2_124m_device_bytes);
    ZT_RUN(gpt_step_fits_the_default_arena);
    ZT_RUN(trace_follows_a_changed_order);
    ZT_RUN(grad_parts_api);
    ZT_RUN(tiled_embedding_same_bits);
    ZT_RUN(tiled_tensor_api);
    return zt_summary();
}
