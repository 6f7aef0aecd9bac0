/* The GPT-2 example's --dropout P (issue 27): Hugging Face's three dropouts with masks from a
   counter-based hash (examples/gpt2_common.h, gpt2_dropout_keep; docs/gpt2.md, "Dropout").

   What must hold, and why:
   - --dropout 0 is the run without the flag, bit for bit (every step's loss, the validation
     losses, the params checksum): P = 0 leaves every code path as it was.
   - With P = 0.1 the demo's four stages end bit-identical at N = 1, 2 and 4 (the example
     compares them itself and exits 1 otherwise): each rank draws its slice of the global
     batch's masks, whatever the stage.
   - The masks do not depend on the rank count: a sequence's logits are a per-row
     computation (examples/gpt2_gemm.h: each output one chain of multiply-adds whatever the
     rows), so rank 0's logits at step 0 (--dump-logits: its first B / N sequences) at N = 2
     and 4 equal the first rows of N = 1's bit for bit, and differ from the run without
     dropout (the masks are there).
   - The backward draws the forward's masks: with --offload-activations cpu each block's
     forward is recomputed in the backward from the stashed input; the run equals the one
     that keeps every activation, bit for bit.
   - The hash drops a fraction P: over 2^20 draws the count is within 6 sigma of P n.
   - --dropout 1, -0.1 and "x" are refused (exit 2).
   The PyTorch check (the same masks in a hooked HF forward, losses within 1e-4) is in
   tests/gpt2_finetune.py (make test-gpt2). Runs build/train_gpt2 from the repository root;
   skips without it. */
#define _DEFAULT_SOURCE /* mkdtemp, popen */
#include "zero.h"
#include "examples/gpt2_common.h"
#include "tests/zt.h"

#include <math.h>
#include <unistd.h>

#define PROG "build/train_gpt2"
#define SHAPE "--layers 2 --heads 2 --channels 16 --seq 16 --batch 4 --vocab 256 --sample 0"

static char dir[64];

typedef struct result {
    char out[8192];
    int rc;
} result;

static void run(const char *args, result *R)
{
    char cmd[1024];
    FILE *f;
    size_t n;
    memset(R, 0, sizeof *R);
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", PROG, args);
    R->rc = -1;
    if (!(f = popen(cmd, "r"))) return;
    n = fread(R->out, 1, sizeof R->out - 1, f);
    R->out[n] = '\0';
    R->rc = pclose(f);
}

/* The run's per-step lines ("step ..." without the timings), val and checksum lines, in
   order: what a bit-identical run repeats. */
static void numbers(const char *out, char *dst, size_t cap)
{
    const char *p = out;
    size_t used = 0;
    dst[0] = '\0';
    while (*p) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        const char *cut = NULL;
        if (!strncmp(p, "step ", 5) && (cut = strstr(p, "| norm ")) != NULL) cut = strstr(cut + 7, " | ");
        if ((!strncmp(p, "step ", 5) || !strncmp(p, "val loss:", 9) || !strncmp(p, "params checksum:", 16)) &&
            used + len + 2 < cap) {
            size_t take = cut && cut < p + len ? (size_t)(cut - p) : len; /* a step's line up to its norm */
            memcpy(dst + used, p, take);
            used += take;
            dst[used++] = '\n';
            dst[used] = '\0';
        }
        p += len + (e != NULL);
    }
}

ZT_TEST(dropout_zero_is_the_run_without_it)
{
    static result a, b;
    static char na[4096], nb[4096];
    if (access(PROG, X_OK) != 0) ZT_SKIP(PROG " not built");
    run(SHAPE " --ranks 2 --stage 1 --steps 4 --accum 2 --val-every 2", &a);
    run(SHAPE " --ranks 2 --stage 1 --steps 4 --accum 2 --val-every 2 --dropout 0", &b);
    ZT_CHECKF(a.rc == 0 && b.rc == 0, "exit %d, %d: %s", a.rc, b.rc, b.out);
    numbers(a.out, na, sizeof na);
    numbers(b.out, nb, sizeof nb);
    ZT_CHECKF(strstr(na, "params checksum:") && strstr(na, "step     3"), "%s", a.out);
    ZT_CHECKF(!strcmp(na, nb), "without the flag:\n%s--dropout 0:\n%s", na, nb);
}

ZT_TEST(stages_agree_at_every_rank_count)
{
    static result r, plain;
    static char na[4096], nb[4096];
    char args[256];
    int n;
    if (access(PROG, X_OK) != 0) ZT_SKIP(PROG " not built");
    for (n = 1; n <= 4; n *= 2) {
        snprintf(args, sizeof args, SHAPE " --ranks %d --steps 3 --accum 2 --dropout 0.1", n);
        run(args, &r);
        ZT_CHECKF(r.rc == 0 && strstr(r.out, "stages 0-3: identical losses and bit-identical parameters"),
                  "N = %d: exit %d\n%s", n, r.rc, r.out);
    }
    /* the same run without dropout differs: the masks were applied */
    run(SHAPE " --ranks 4 --steps 3 --accum 2", &plain);
    numbers(r.out, na, sizeof na);
    numbers(plain.out, nb, sizeof nb);
    ZT_CHECKF(plain.rc == 0 && strcmp(na, nb) != 0, "dropout 0.1 and none gave the same run:\n%s", na);
}

/* rank 0's step-0 logits at N ranks into buf (B / N sequences) and the step's loss over
   every rank (the --log CSV's, %.17g); the floats read, or -1. */
static long logits_at(int n, const char *drop, float *buf, size_t cap, double *loss)
{
    char args[512], path[128], log[128], line[256];
    result r;
    FILE *f;
    size_t got;
    snprintf(path, sizeof path, "%s/logits-%d", dir, n);
    snprintf(log, sizeof log, "%s/log-%d.csv", dir, n);
    snprintf(args, sizeof args, SHAPE " --ranks %d --stage 0 --steps 1 %s --dump-logits %s --log %s", n, drop, path,
             log);
    run(args, &r);
    *loss = -1.0;
    if (r.rc == 0 && (f = fopen(log, "r")) != NULL) {
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "0,", 2)) *loss = strtod(line + 2, NULL);
        fclose(f);
    }
    remove(log);
    if (r.rc != 0 || !(f = fopen(path, "rb"))) return -1;
    got = fread(buf, sizeof(float), cap, f);
    fclose(f);
    remove(path);
    return (long)got;
}

ZT_TEST(masks_do_not_depend_on_the_rank_count)
{
    enum { CAP = 4 * 16 * 256 };
    static float one[CAP], part[CAP], none[CAP];
    long n1, nn, n0;
    double l1, ln, l0;
    int n;
    if (access(PROG, X_OK) != 0) ZT_SKIP(PROG " not built");
    n1 = logits_at(1, "--dropout 0.1", one, CAP, &l1);
    ZT_CHECKF(n1 == CAP && l1 > 0, "N = 1: %ld floats of logits, %d expected; loss %g", n1, (int)CAP, l1);
    for (n = 2; n <= 4 && n1 == CAP; n *= 2) {
        nn = logits_at(n, "--dropout 0.1", part, CAP, &ln);
        ZT_CHECKF(nn == CAP / n, "N = %d: %ld floats", n, nn);
        ZT_CHECKF(nn == CAP / n && !memcmp(part, one, sizeof(float) * (size_t)nn),
                  "N = %d: rank 0's logits differ from N = 1's first %ld", n, nn);
        /* the other ranks' rows: the loss over every rank is the same per-row values summed
           in another order (double), so equal to N = 1's within 1e-12; another mask moves it
           by far more (the run without dropout below: more than 1e-6) */
        ZT_CHECKF(fabs(ln - l1) <= 1e-12 * l1, "N = %d: step 0 loss %.17g, N = 1's %.17g", n, ln, l1);
    }
    n0 = logits_at(1, "", none, CAP, &l0);
    ZT_CHECKF(n0 == CAP && memcmp(none, one, sizeof one) != 0, "the logits without dropout equal those with it");
    ZT_CHECKF(fabs(l0 - l1) > 1e-6 * l1, "step 0 loss %.17g without dropout, %.17g with it", l0, l1);
}

ZT_TEST(the_backward_draws_the_forwards_masks)
{
    static result a, b;
    static char na[4096], nb[4096];
    char args[512];
    if (access(PROG, X_OK) != 0) ZT_SKIP(PROG " not built");
    run(SHAPE " --ranks 2 --stage 2 --steps 3 --dropout 0.2", &a);
    snprintf(args, sizeof args, SHAPE " --ranks 2 --stage 2 --steps 3 --dropout 0.2 --offload-activations cpu "
             "--nvme-path %s", dir);
    run(args, &b);
    ZT_CHECKF(a.rc == 0 && b.rc == 0, "exit %d, %d: %s", a.rc, b.rc, b.out);
    numbers(a.out, na, sizeof na);
    numbers(b.out, nb, sizeof nb);
    ZT_CHECKF(strstr(na, "params checksum:") && !strcmp(na, nb), "kept:\n%srecomputed:\n%s", na, nb);
}

ZT_TEST(the_hash_drops_a_fraction_p)
{
    const double p = 0.1;
    const uint32_t thr = gpt2_dropout_threshold(p);
    uint64_t key = gpt2_dropout_key(1337, 5, 1, 3, GPT2_DROP_ATTN), i, n = 1u << 20, dropped = 0;
    double sigma = sqrt((double)n * p * (1 - p));
    for (i = 0; i < n; i++) dropped += !gpt2_dropout_keep(key, i, thr);
    ZT_CHECKF(fabs((double)dropped - p * (double)n) <= 6 * sigma, "%llu of %llu dropped, P n = %.0f",
              (unsigned long long)dropped, (unsigned long long)n, p * (double)n);
    ZT_CHECK(gpt2_dropout_threshold(0.0) == 0 && gpt2_dropout_threshold(0.5) == 1u << 23);
    /* another stream (site, layer, micro-step or step) is another mask */
    ZT_CHECK(gpt2_dropout_key(1337, 5, 1, 3, GPT2_DROP_ATTN_RESID) != key &&
             gpt2_dropout_key(1337, 5, 1, 2, GPT2_DROP_ATTN) != key &&
             gpt2_dropout_key(1337, 5, 0, 3, GPT2_DROP_ATTN) != key &&
             gpt2_dropout_key(1337, 4, 1, 3, GPT2_DROP_ATTN) != key);
}

ZT_TEST(bad_values_are_refused)
{
    static const char *const bad[] = {"1", "-0.1", "x", "0.5x", "nan"};
    result r;
    char args[256];
    size_t k;
    if (access(PROG, X_OK) != 0) ZT_SKIP(PROG " not built");
    for (k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(args, sizeof args, SHAPE " --steps 1 --dropout %s", bad[k]);
        run(args, &r);
        ZT_CHECKF(WIFEXITED(r.rc) && WEXITSTATUS(r.rc) == 2 && strstr(r.out, "--dropout"), "--dropout %s: %s", bad[k],
                  r.out);
    }
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/zt_dropout_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    ZT_RUN(dropout_zero_is_the_run_without_it);
    ZT_RUN(stages_agree_at_every_rank_count);
    ZT_RUN(masks_do_not_depend_on_the_rank_count);
    ZT_RUN(the_backward_draws_the_forwards_masks);
    ZT_RUN(the_hash_drops_a_fraction_p);
    ZT_RUN(bad_values_are_refused);
    rmdir(dir);
    return zt_summary();
}
