/* The GPT-2 example with --offload-activations host|nvme (each block's input checkpointed in
   the engine's activation tier after the forward, fetched back and the block recomputed in
   the backward) against the same run without it: every step's loss, gradient norm and
   validation loss (the --log CSV, printed with 17 digits) and the final params checksum are
   identical, at stage 3 with gradient accumulation (keys reused every micro-step) and at
   stage 1 in bf16. The NVMe run's backward is served by staging and read-ahead, never by a
   read on demand. Runs build/train_gpt2 from the repository root; skips without it. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, popen */
#include "zero.h"
#include "tests/zt.h"

#include <sys/stat.h>
#include <unistd.h>

#define PROG "build/train_gpt2"

static char dir[64];

/* Runs the example with args and --offload-activations act; its stdout into out, its log
   CSV into csv. 0 on exit status 0. */
static int run(const char *args, const char *act, char *out, size_t out_cap, char *csv, size_t csv_cap)
{
    char cmd[1024], log[128];
    FILE *p;
    size_t n;
    snprintf(log, sizeof log, "%s/%s.csv", dir, act);
    snprintf(cmd, sizeof cmd, "%s %s --sample 0 --offload-activations %s --nvme-path %s --log %s 2>&1", PROG,
             args, act, dir, log);
    p = popen(cmd, "r");
    if (!p) return -1;
    n = fread(out, 1, out_cap - 1, p);
    out[n] = '\0';
    if (pclose(p) != 0) return -1;
    p = fopen(log, "r");
    if (!p) return -1;
    n = fread(csv, 1, csv_cap - 1, p);
    csv[n] = '\0';
    fclose(p);
    remove(log);
    return 0;
}

static const char *line_of(const char *out, const char *prefix)
{
    const char *l = strstr(out, prefix);
    return l ? l : "";
}

ZT_TEST(checkpointed_blocks_give_the_same_losses)
{
    static const char *const configs[] = {
        "--stage 3 --ranks 2 --steps 4 --accum 2 --layers 4 --channels 32 --seq 32 --batch 4 --val-every 2",
        "--stage 1 --ranks 2 --steps 3 --dtype bf16 --layers 3 --heads 2 --channels 16 --seq 24 --batch 2 --val-every 3",
    };
    static const char *const tiers[] = {"none", "host", "nvme"};
    static char out[3][16384], csv[3][8192];
    int cfg, t;
    if (access(PROG, X_OK) != 0) ZT_SKIP(PROG " not built (make " PROG ")");
    snprintf(dir, sizeof dir, "/tmp/zero-test-gpt2-act-XXXXXX");
    ZT_CHECK(mkdtemp(dir) != NULL);
    for (cfg = 0; cfg < 2; cfg++) {
        for (t = 0; t < 3; t++)
            ZT_CHECKF(run(configs[cfg], tiers[t], out[t], sizeof out[t], csv[t], sizeof csv[t]) == 0,
                      "%s --offload-activations %s failed:\n%s", configs[cfg], tiers[t], out[t]);
        ZT_CHECK(strlen(csv[0]) > 0);
        for (t = 1; t < 3; t++) {
            const char *sum0 = line_of(out[0], "params checksum:"), *sum = line_of(out[t], "params checksum:");
            ZT_CHECKF(strcmp(csv[t], csv[0]) == 0, "%s, %s: the losses differ:\n%s\nvs\n%s", configs[cfg], tiers[t],
                      csv[t], csv[0]);
            ZT_CHECKF(*sum && strncmp(sum, sum0, 33) == 0, "%s, %s: %.40s vs %.40s", configs[cfg], tiers[t], sum,
                      sum0);
            ZT_CHECKF(strstr(out[t], "inputs stashed") != NULL, "%s", out[t]);
        }
        /* the NVMe backward: the last inputs from staging, the rest read ahead */
        ZT_CHECKF(strstr(out[2], " 0 read on demand") && !strstr(out[2], " 0 read ahead"), "%s",
                  line_of(out[2], "activations"));
    }
    ZT_CHECK(rmdir(dir) == 0); /* the tier's files are gone */
}

int main(void)
{
    ZT_RUN(checkpointed_blocks_give_the_same_losses);
    return zt_summary();
}
