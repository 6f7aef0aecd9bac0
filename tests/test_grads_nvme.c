/* The NVMe tier of the reduced gradients (offload_gradients = nvme): the same bits as the
   plain run and as the host tier of the gradients, host memory that does not grow with Psi,
   the gradient file in the NVMe accounting, and an I/O failure in the backward that fails
   the step on every rank (no hang, no leak). Checkpoints of such runs: tests/test_offload.c
   (checkpoint_of_offloaded_state). */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "tests/zt.h"
#include "tests/engine_common.h"
#include "tests/nvme_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static char nvme_dir[256];

static const char *make_dir(void) { return nd_make_dir(nvme_dir, sizeof nvme_dir, "gnv"); }

static int same_info(const ec_cfg *c, const ec_result *a, const ec_result *b, char *why, size_t n)
{
    int s, rk;
    for (s = 0; s < c->steps; s++)
        for (rk = 0; rk < c->world; rk++)
            if (memcmp(&a->info[rk][s], &b->info[rk][s], sizeof a->info[rk][s]) != 0) {
                snprintf(why, n, "step %d rank %d: info differs (norm %.9g vs %.9g, skipped %d vs %d)",
                         s, rk, (double)a->info[rk][s].grad_norm, (double)b->info[rk][s].grad_norm,
                         a->info[rk][s].skipped, b->info[rk][s].skipped);
                return 0;
            }
    return 1;
}

/* c three ways: plain (no offload), the optimizer on NVMe with the gradients in host memory
   (the host tier), and with the gradients on NVMe too; master, m, v, params and every step's
   info (the clip norm's bits, the skip verdict) must agree bit for bit. */
static void check_three_ways(ec_cfg *c, const char *label)
{
    ec_result *ref, *host, *nv;
    char why[200];
    zero_offload_device op = c->offload_param;
    c->offload_opt = c->offload_param = c->offload_grad = ZERO_OFFLOAD_NONE;
    ref = ec_run(c);
    c->offload_opt = ZERO_OFFLOAD_NVME;
    c->offload_param = op;
    host = ec_run(c);
    c->offload_grad = ZERO_OFFLOAD_NVME;
    nv = ec_run(c);
    ZT_CHECKF(ref->rc == ZERO_OK, "%s (plain): %s", label, ref->err);
    ZT_CHECKF(host->rc == ZERO_OK, "%s (host gradients): %s", label, host->err);
    ZT_CHECKF(nv->rc == ZERO_OK, "%s (nvme gradients): %s", label, nv->err);
    if (ref->rc == ZERO_OK && host->rc == ZERO_OK && nv->rc == ZERO_OK) {
        ZT_CHECKF(nv->params_agree, "%s: ranks hold different params", label);
        ZT_CHECKF(ec_same_state(c, ref, nv, why, sizeof why), "%s: vs plain: %s", label, why);
        ZT_CHECKF(ec_same_state(c, host, nv, why, sizeof why), "%s: vs host tier: %s", label, why);
        ZT_CHECKF(same_info(c, ref, nv, why, sizeof why), "%s: vs plain: %s", label, why);
        ZT_CHECKF(same_info(c, host, nv, why, sizeof why), "%s: vs host tier: %s", label, why);
        /* the gradients really were on NVMe: the shard (S c) is in the NVMe tier, none in host
           memory beyond the staging */
        size_t c_bytes = zero_dtype_size(c->comm_dtype ? c->comm_dtype : c->dtype);
        int rk;
        for (rk = 0; rk < c->world; rk++) {
            ZT_CHECKF(nv->nvme_mem[rk].bytes[ZERO_MEM_GRAD] == ref->plan_shard_total * c_bytes &&
                          host->nvme_mem[rk].bytes[ZERO_MEM_GRAD] == 0,
                      "%s: rank %d: NVMe GRAD %zu (host tier run: %zu), S c = %zu", label, rk,
                      nv->nvme_mem[rk].bytes[ZERO_MEM_GRAD], host->nvme_mem[rk].bytes[ZERO_MEM_GRAD],
                      ref->plan_shard_total * c_bytes);
        }
    }
    ec_result_free(ref);
    ec_result_free(host);
    ec_result_free(nv);
}

/* Stages 1-3, N = 1, 2, 3, accumulation 1 and 3, fp16 with a skipped (inf) step and
   clipping active, several groups per reduction (fused calls), tiles much smaller than a
   shard (a group's gradients span several ranges of the file); stage 3 with the params on
   NVMe too. Then fp32 communication through the reduce bucket (a group downloaded in
   pieces) with prefetch, and bf16. */
ZT_TEST(nvme_gradients_are_exact)
{
    const char *dir = make_dir();
    int st, w, acc;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    for (st = 1; st <= 3; st++)
        for (w = 1; w <= 3; w++)
            for (acc = 1; acc <= 3; acc += 2) {
                ec_cfg c;
                char label[128];
                ec_cfg_init(&c, st, w, ZERO_F16, acc, 4);
                c.clip = 0.05f;
                c.bucket = 300;
                c.fault_steps[0] = 1;
                c.nfault = 1;
                c.fault_rank = w - 1;
                c.fault_inf = 1;
                c.offload_param = st == 3 && w != 2 ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_NONE;
                c.nvme_path = dir;
                c.sub_group = 57;
                snprintf(label, sizeof label, "stage %d N %d accum %d fp16", st, w, acc);
                check_three_ways(&c, label);
            }
    for (st = 1; st <= 3; st++) {
        ec_cfg c;
        char label[128];
        ec_cfg_init(&c, st, 3, ZERO_F16, 2, 4);
        c.comm_dtype = ZERO_F32;
        c.bucket = 300;
        c.prefetch = 2;
        c.clip = 0.05f;
        c.nvme_path = dir;
        c.sub_group = 23;
        snprintf(label, sizeof label, "stage %d N 3 fp32 comm (pieces through the bucket)", st);
        check_three_ways(&c, label);
        /* fp32: squares of 24-bit gradients fill fp64's mantissa, so a sum of squares grouped
           otherwise (per tile instead of per group) would differ in the last bits */
        ec_cfg_init(&c, st, 2, ZERO_F32, 3, 3);
        c.clip = 0.01f;
        c.nvme_path = dir;
        c.sub_group = 19;
        snprintf(label, sizeof label, "stage %d N 2 fp32 accum 3", st);
        check_three_ways(&c, label);
        ec_cfg_init(&c, st, 2, ZERO_BF16, 3, 3);
        c.nvme_path = dir;
        c.sub_group = 1000; /* one tile per group */
        snprintf(label, sizeof label, "stage %d N 2 bf16 accum 3", st);
        check_three_ways(&c, label);
    }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* A model of ng groups of one 300-element tensor each, stage 3 on 2 ranks, accumulation 2,
   everything on NVMe. */
static void ladder(ec_cfg *c, int ng, const char *dir)
{
    int t;
    ec_cfg_init(c, 3, 2, ZERO_F16, 2, 2);
    c->ntensors = ng;
    for (t = 0; t < ng; t++) {
        c->sizes[t] = 300;
        c->groups[t] = t;
        c->flags[t] = 0;
    }
    c->offload_opt = c->offload_param = c->offload_grad = ZERO_OFFLOAD_NVME;
    c->nvme_path = dir;
    c->sub_group = 64;
}

static size_t align4k(size_t b) { return (b + ZERO_IO_ALIGN - 1) / ZERO_IO_ALIGN * ZERO_IO_ALIGN; }

/* Host bytes with the gradients on NVMe do not grow with Psi: the same at 4 and 16 groups,
   exactly the formula (GRAD: 3 staging buffers of the largest shard + 4096 to align them +
   buffer_count gradient tiles, each rounded up to 4096), while the host tier's GRAD grows as S c; the NVMe tier
   holds the gradient shard (S c) and its file's alignment in SCRATCH. */
ZT_TEST(nvme_gradients_host_bytes_do_not_grow_with_psi)
{
    const char *dir = make_dir();
    static const int ngs[2] = {4, 16};
    size_t host_total[2] = {0, 0}, host_grad_tier[2] = {0, 0};
    int i, rk;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    for (i = 0; i < 2; i++) {
        ec_cfg c;
        ec_result *r, *h;
        ladder(&c, ngs[i], dir);
        r = ec_run(&c);
        ZT_CHECKF(r->rc == ZERO_OK, "%s", r->err);
        for (rk = 0; rk < 2 && r->rc == ZERO_OK; rk++) {
            const zero_engine_memory *hm = &r->host_mem[rk], *nm = &r->nvme_mem[rk], *dm = &r->mem[rk];
            size_t shard = r->max_group / 2, T = shard < 64 ? shard : 64;
            size_t want = 3 * align4k(shard * 2) + 4096 + 4 * align4k(T * 2);
            size_t S = r->plan_shard_total / 1; /* per rank: every group's shard */
            size_t k;
            ZT_CHECKF(hm->bytes[ZERO_MEM_GRAD] == want, "ng %d rank %d: host GRAD %zu, formula %zu",
                      ngs[i], rk, hm->bytes[ZERO_MEM_GRAD], want);
            ZT_CHECKF(nm->bytes[ZERO_MEM_GRAD] == S * 2, "ng %d rank %d: NVMe GRAD %zu, S c = %zu", ngs[i],
                      rk, nm->bytes[ZERO_MEM_GRAD], S * 2);
            {
                size_t sum = 0;
                for (k = 0; k < ZERO_MEM_COUNT; k++) sum += nm->bytes[k];
                ZT_CHECK(sum == nm->total_bytes && nm->total_bytes % ZERO_IO_ALIGN == 0);
            }
            ZT_CHECK(dm->bytes[ZERO_MEM_GRAD] == 0);
            if (rk == 0) host_total[i] = hm->total_bytes;
            else ZT_CHECK(hm->total_bytes == host_total[i]);
        }
        ec_result_free(r);
        c.offload_grad = ZERO_OFFLOAD_NONE; /* the host tier of the gradients */
        h = ec_run(&c);
        ZT_CHECKF(h->rc == ZERO_OK, "%s", h->err);
        host_grad_tier[i] = h->host_mem[0].bytes[ZERO_MEM_GRAD];
        if (h->rc == ZERO_OK)
            ZT_CHECK(host_grad_tier[i] == (h->plan_shard_total + h->max_group / 2) * 2);
        ec_result_free(h);
    }
    ZT_CHECKF(host_total[0] == host_total[1] && host_total[0] > 0, "host bytes %zu at 4 groups, %zu at 16",
              host_total[0], host_total[1]);
    ZT_CHECK(host_grad_tier[1] > host_grad_tier[0]);
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

/* ---- failures ---- */

typedef struct fault_ctx {
    const char *dir;
    int mode;   /* 1: EIO on the first gradient write of step 1 (rank 0); 2: rank 0's gradient
                   file changed between micro-steps of step 1 (the read-back's checksum) */
    int accum;
    zero_result rc[2];
    char err[2][512];
} fault_ctx;

static zero_result fault_rank(int rank, zero_comm *comm, void *user)
{
    fault_ctx *F = (fault_ctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    float vals[300];
    int ids[4], t, s, k, g, i;
    memset(&d, 0, sizeof d);
    d.stage = 2;
    d.accum_steps = F->accum;
    d.offload_optimizer = ZERO_OFFLOAD_NVME;
    d.offload_gradients = ZERO_OFFLOAD_NVME;
    d.nvme_path = F->dir;
    d.sub_group_size = 64;
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    d.device = dev;
    d.comm = comm;
    for (i = 0; i < 300; i++) vals[i] = 0.01f * (float)i;
    r = zero_engine_create(&d, &e);
    for (t = 0; t < 4 && r == ZERO_OK; t++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", t);
        r = zero_engine_add_tensor(e, name, 300, t, 0, &ids[t]);
    }
    if (!r) r = zero_engine_commit(e);
    for (t = 0; t < 4 && r == ZERO_OK; t++) r = zero_engine_set_tensor(e, ids[t], vals);
    for (s = 0; s < 2 && r == ZERO_OK; s++) {
        for (k = 0; k < F->accum && r == ZERO_OK; k++) {
            if (s == 1 && rank == 0 && F->mode == 1 && k == 0) { /* the next request: a write */
                zero_io_fault f;
                memset(&f, 0, sizeof f);
                f.kind = ZERO_IO_FAULT_ERRNO;
                f.request = 1;
                f.err = EIO;
                ZT_CHECK(zero_io_inject_fault(e->gnv->io, &f) == ZERO_OK);
            }
            if (s == 1 && rank == 0 && F->mode == 2 && k == 1) { /* group 3's range, read back next */
                struct zero__gnv *gt = e->gnv;
                int fd = open(zero_io_file_path(gt->file), O_WRONLY);
                char junk[64];
                zero__gnv_wait_group(e, 3); /* its write is on the file */
                memset(junk, 0x5a, sizeof junk);
                ZT_CHECK(fd >= 0);
                if (fd >= 0) {
                    ZT_CHECK(pwrite(fd, junk, sizeof junk, (off_t)gt->off[gt->tile0[3]]) == (ssize_t)sizeof junk);
                    close(fd);
                }
            }
            for (g = 3; g >= 0 && r == ZERO_OK; g--) { /* the backward: groups in reverse */
                void *gp;
                r = zero_engine_grads(e, g, &gp);
                for (i = 0; i < 300 && r == ZERO_OK; i++)
                    ((uint16_t *)gp)[i] = zero_f32_to_f16(0.5f + 0.001f * (float)(i + g + rank));
                if (r == ZERO_OK) r = zero_engine_grads_ready(e, g);
            }
        }
        if (r == ZERO_OK) r = zero_engine_step(e, NULL);
    }
    F->rc[rank] = r;
    snprintf(F->err[rank], sizeof F->err[rank], "%s", r ? zero_last_error() : "");
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

/* A gradient write that fails (EIO) in the backward, and a gradient range changed on disk
   before its read-back: the backward goes on (every rank joins every collective), the step
   fails with IO on every rank, rank 0's message names the gradient file and the cause, the
   other's names rank 0; the engines are broken, destroy removes every file (ASan: no leak). */
ZT_TEST(nvme_gradient_faults_fail_every_rank)
{
    int mode;
    for (mode = 1; mode <= 2; mode++) {
        fault_ctx F;
        const char *dir = make_dir();
        zero_result rr;
        ZT_CHECK(dir != NULL);
        if (!dir) return;
        memset(&F, 0, sizeof F);
        F.dir = dir;
        F.mode = mode;
        F.accum = mode == 2 ? 2 : 1;
        rr = zero_local_run(2, fault_rank, &F);
        ZT_CHECKF(rr == ZERO_OK, "mode %d: %s", mode, zero_last_error());
        ZT_CHECKF(F.rc[0] == ZERO_ERROR_IO && F.rc[1] == ZERO_ERROR_IO, "mode %d: rc %d %d (%s | %s)", mode,
                  (int)F.rc[0], (int)F.rc[1], F.err[0], F.err[1]);
        ZT_CHECKF(strstr(F.err[0], "gradient tier") && strstr(F.err[0], "zero-grad-r0-"), "mode %d: %s",
                  mode, F.err[0]);
        ZT_CHECKF(strstr(F.err[0], mode == 1 ? "Input/output error" : "checksum"), "mode %d: %s", mode,
                  F.err[0]);
        ZT_CHECKF(strstr(F.err[1], "rank 0"), "mode %d: %s", mode, F.err[1]);
        ZT_CHECK(nd_dir_is_empty(dir));
        rmdir(dir);
    }
}

/* offload_gradients is checked at create: nvme needs offload_optimizer = nvme, cpu needs an
   offloaded optimizer, values out of range are refused; 0 resolves to the host tier when the
   optimizer is offloaded. */
/* ---- gradient parts (a tied weight) ---- */

typedef struct parts_ctx {
    int stage, accum;
    zero_offload_device opt, grads;
    const char *dir;
    float master[2][3][300]; /* per rank, tensor: the final master weights */
    uint16_t param[2][3][300];
    zero_result rc[2];
    char err[2][512];
} parts_ctx;

/* Three groups of one 300-element tensor, group 0 handing in its gradient in two parts per
   micro-step (first and last in the backward, as a tied embedding does), 2 ranks, fp16. */
static zero_result parts_rank(int rank, zero_comm *comm, void *user)
{
    parts_ctx *P = (parts_ctx *)user;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    float vals[300];
    int ids[3], t, s, k, i, j;
    static const int order[4] = {0, 2, 1, 0}; /* the backward's gradient calls */
    memset(&d, 0, sizeof d);
    d.stage = P->stage;
    d.accum_steps = P->accum;
    d.offload_optimizer = P->opt;
    d.offload_gradients = P->grads;
    d.nvme_path = P->dir;
    d.sub_group_size = 70;
    d.clip_norm = 0.5f;
    if ((r = zero_host_device_create(NULL, &dev)) != ZERO_OK) return r;
    d.device = dev;
    d.comm = comm;
    for (i = 0; i < 300; i++) vals[i] = 0.01f * (float)(i % 37) - 0.1f;
    r = zero_engine_create(&d, &e);
    for (t = 0; t < 3 && r == ZERO_OK; t++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", t);
        r = zero_engine_add_tensor(e, name, 300, t, 0, &ids[t]);
    }
    if (!r) r = zero_engine_set_grad_parts(e, 0, 2);
    if (!r) r = zero_engine_commit(e);
    for (t = 0; t < 3 && r == ZERO_OK; t++) r = zero_engine_set_tensor(e, ids[t], vals);
    for (s = 0; s < 3 && r == ZERO_OK; s++) {
        float scale = zero_engine_loss_scale(e);
        for (k = 0; k < P->accum && r == ZERO_OK; k++)
            for (j = 0; j < 4 && r == ZERO_OK; j++) {
                int g = order[j];
                void *gp, *pp;
                if ((r = zero_engine_gather(e, g, &pp)) != ZERO_OK) break;
                if ((r = zero_engine_grads(e, g, &gp)) != ZERO_OK) break;
                for (i = 0; i < 300; i++)
                    ((uint16_t *)gp)[i] = zero_f32_to_f16(scale * 1e-3f * (float)((i * 7 + j * 13 + k * 5 + s + rank) % 29 - 14));
                if ((r = zero_engine_release(e, g)) != ZERO_OK) break;
                r = zero_engine_grads_ready(e, g);
            }
        if (r == ZERO_OK) r = zero_engine_step(e, NULL);
    }
    for (t = 0; t < 3 && r == ZERO_OK; t++) {
        zero_range rg;
        float tmp[300];
        uint16_t pt[300];
        memset(tmp, 0, sizeof tmp);
        r = zero_engine_read_tensor(e, ids[t], ZERO_STATE_MASTER, tmp, &rg);
        if (r == ZERO_OK) memcpy(&P->master[rank][t][rg.offset], tmp + rg.offset, rg.numel * 4);
        if (r == ZERO_OK) r = zero_engine_read_tensor(e, ids[t], ZERO_STATE_PARAM, pt, &rg);
        if (r == ZERO_OK) memcpy(&P->param[rank][t][rg.offset], pt + rg.offset, rg.numel * 2);
    }
    P->rc[rank] = r;
    snprintf(P->err[rank], sizeof P->err[rank], "%s", r ? zero_last_error() : "");
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

/* A group with two gradient parts (its second part is added like a later micro-step, even
   with accumulation 1): the host tier of the gradients (optimizer on the CPU and on NVMe)
   and the NVMe tier give the plain run's master weights and params, stages 1-3,
   accumulation 1 and 2. */
ZT_TEST(gradient_parts_with_offload)
{
    static const zero_offload_device cfgs[4][2] = {
        {ZERO_OFFLOAD_NONE, ZERO_OFFLOAD_NONE}, {ZERO_OFFLOAD_CPU, ZERO_OFFLOAD_NONE},
        {ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NONE}, {ZERO_OFFLOAD_NVME, ZERO_OFFLOAD_NVME}};
    static parts_ctx ref, got; /* large: not on the stack */
    const char *dir = make_dir();
    int st, acc, ci;
    ZT_CHECK(dir != NULL);
    if (!dir) return;
    for (st = 1; st <= 3; st++)
        for (acc = 1; acc <= 2; acc++)
            for (ci = 0; ci < 4; ci++) {
                parts_ctx *P = ci ? &got : &ref;
                memset(P, 0, sizeof *P);
                P->stage = st;
                P->accum = acc;
                P->opt = cfgs[ci][0];
                P->grads = cfgs[ci][1];
                P->dir = dir;
                ZT_CHECK(zero_local_run(2, parts_rank, P) == ZERO_OK);
                ZT_CHECKF(P->rc[0] == ZERO_OK && P->rc[1] == ZERO_OK, "stage %d accum %d cfg %d: %s %s", st,
                          acc, ci, P->err[0], P->err[1]);
                if (ci == 0) continue;
                ZT_CHECKF(memcmp(ref.master, got.master, sizeof ref.master) == 0 &&
                              memcmp(ref.param, got.param, sizeof ref.param) == 0,
                          "stage %d accum %d cfg %d: state differs from the plain run", st, acc, ci);
            }
    ZT_CHECK(nd_dir_is_empty(dir));
    rmdir(dir);
}

static zero_result validate_rank(int rank, zero_comm *comm, void *user)
{
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d, got;
    (void)rank;
    (void)user;
    memset(&got, 0, sizeof got);
    ZT_CHECK(zero_host_device_create(NULL, &dev) == ZERO_OK);
    memset(&d, 0, sizeof d);
    d.device = dev;
    d.comm = comm;
    d.stage = 2;
    d.nvme_path = "/tmp";
    d.offload_gradients = ZERO_OFFLOAD_NVME;
    d.offload_optimizer = ZERO_OFFLOAD_CPU;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT && e == NULL);
    ZT_CHECKF(strstr(zero_last_error(), "offload_gradients = nvme needs offload_optimizer = nvme"), "%s",
              zero_last_error());
    d.offload_optimizer = ZERO_OFFLOAD_NONE;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    d.offload_gradients = ZERO_OFFLOAD_CPU;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    ZT_CHECK(strstr(zero_last_error(), "offload_gradients = cpu needs offload_optimizer") != NULL);
    d.offload_gradients = (zero_offload_device)7;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_ERROR_INVALID_ARGUMENT);
    d.offload_gradients = ZERO_OFFLOAD_NONE;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    ZT_CHECK(zero_engine_get_desc(e, &got) == ZERO_OK && got.offload_gradients == ZERO_OFFLOAD_NONE);
    zero_engine_destroy(e);
    e = NULL;
    d.offload_optimizer = ZERO_OFFLOAD_NVME;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    ZT_CHECK(zero_engine_get_desc(e, &got) == ZERO_OK && got.offload_gradients == ZERO_OFFLOAD_CPU);
    zero_engine_destroy(e);
    e = NULL;
    d.offload_gradients = ZERO_OFFLOAD_NVME;
    ZT_CHECK(zero_engine_create(&d, &e) == ZERO_OK);
    ZT_CHECK(zero_engine_get_desc(e, &got) == ZERO_OK && got.offload_gradients == ZERO_OFFLOAD_NVME);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return ZERO_OK;
}

/* offload_gradients is checked at create: nvme needs offload_optimizer = nvme, cpu needs an
   offloaded optimizer, values out of range are refused; 0 resolves to the host tier when the
   optimizer is offloaded. */
ZT_TEST(offload_gradients_validated)
{
    ZT_CHECK(zero_local_run(1, validate_rank, NULL) == ZERO_OK);
}

int main(void)
{
    ZT_RUN(offload_gradients_validated);
    ZT_RUN(nvme_gradients_are_exact);
    ZT_RUN(nvme_gradients_host_bytes_do_not_grow_with_psi);
    ZT_RUN(nvme_gradient_faults_fail_every_rank);
    ZT_RUN(gradient_parts_with_offload);
    return zt_summary();
}
