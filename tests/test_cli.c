/* zero-estimate, run as a program from the repository root: its table, JSON and inverse
   give the right numbers (parsed back), sizes parse exactly, bad arguments exit 2 with a
   one-line message and the usage line on stderr. Skips when build/zero-estimate is absent.
   Every program a user runs (zero-estimate, zero-ckpt, train_mlp): --help prints the usage
   on stdout and exits 0, an unknown option is named on stderr (exit 2), and train_mlp's
   sizes that do not fit end with a message that says which allocation failed. */
#define _POSIX_C_SOURCE 200809L /* mkstemp, fdopen */
#include "zero.h"
#include "examples/gpt2_common.h"
#include "tests/zt.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define TOOL "build/zero-estimate"

typedef struct run_result {
    int status; /* exit status, -1 if it did not exit normally */
    char out[65536];
    char err[4096];
} run_result;

static run_result R; /* one at a time */

/* Runs a shell command line (stdout and stderr kept apart); fills R. */
static void run_cmd(const char *line)
{
    char cmd[1024], errpath[] = "/tmp/zt_cli_XXXXXX";
    FILE *p, *e;
    size_t n;
    int fd = mkstemp(errpath), st;
    memset(&R, 0, sizeof R);
    R.status = -1;
    if (fd < 0) return;
    close(fd);
    snprintf(cmd, sizeof cmd, "%s 2>%s", line, errpath);
    p = popen(cmd, "r");
    if (!p) return;
    n = fread(R.out, 1, sizeof R.out - 1, p);
    R.out[n] = '\0';
    st = pclose(p);
    if (st != -1 && WIFEXITED(st)) R.status = WEXITSTATUS(st);
    e = fopen(errpath, "r");
    if (e) {
        n = fread(R.err, 1, sizeof R.err - 1, e);
        R.err[n] = '\0';
        fclose(e);
    }
    remove(errpath);
}

/* Runs TOOL with args (already shell-quoted); fills R. */
static void run(const char *args)
{
    char line[900];
    snprintf(line, sizeof line, "%s %s", TOOL, args);
    run_cmd(line);
}

/* The k-th (0-based) unsigned integer value of "key": in s; -1 (all ones) if absent. */
static uint64_t json_u64(const char *s, const char *key, int k)
{
    char pat[64];
    const char *p = s;
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    while ((p = strstr(p, pat)) != NULL) {
        p += strlen(pat);
        if (k-- == 0) {
            uint64_t v = 0;
            if (*p < '0' || *p > '9') return (uint64_t)-1;
            for (; *p >= '0' && *p <= '9'; p++) v = v * 10 + (uint64_t)(*p - '0');
            return v;
        }
    }
    return (uint64_t)-1;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

static int have_tool(void) { return access(TOOL, X_OK) == 0; }

ZT_TEST(table_paper_example)
{
    if (!have_tool()) ZT_SKIP(TOOL " not built (make " TOOL ")");
    run("--params 7.5e9 --ranks 64");
    ZT_CHECKF(R.status == 0, "exit %d: %s", R.status, R.err);
    ZT_CHECK(R.err[0] == '\0');
    /* the paper's Figure 1, per rank: 120, 31.4, 16.6, 1.9 GB */
    ZT_CHECK(strstr(R.out, "120.00 GB") != NULL);
    ZT_CHECK(strstr(R.out, "31.41 GB") != NULL);
    ZT_CHECK(strstr(R.out, "16.64 GB") != NULL);
    ZT_CHECK(strstr(R.out, "1.88 GB") != NULL);
    ZT_CHECK(strstr(R.out, "3.82x") != NULL && strstr(R.out, "64.00x") != NULL);
    ZT_CHECK(strstr(R.out, "7,500,000,000") != NULL);
}

ZT_TEST(json_matches_library)
{
    static const char *argsets[] = {"--params 7.5e9 --ranks 64 --json",
                                    "--params 1000003 --ranks 7 --json --offload",
                                    "--params 350M --ranks 3 --json --grad-bytes 4 --optimizer-bytes 16",
                                    "--params 7.5B --ranks 64 --stage 2 --json",
                                    "--params 350M --ranks 3 --frozen 100000001 --json"};
    int a, s;
    if (!have_tool()) ZT_SKIP(TOOL " not built");
    for (a = 0; a < 5; a++) {
        zero_estimate_desc d;
        int first = a == 3 ? 2 : 0, last = a == 3 ? 2 : 3;
        run(argsets[a]);
        ZT_CHECKF(R.status == 0, "%s: exit %d", argsets[a], R.status);
        memset(&d, 0, sizeof d);
        d.params = json_u64(R.out, "params", 0);
        d.ranks = (int)json_u64(R.out, "ranks", 0);
        d.offload = strstr(R.out, "\"offload\": true") != NULL;
        d.grad_bytes = (int)json_u64(R.out, "grad_bytes", 0);
        d.optimizer_bytes = (int)json_u64(R.out, "optimizer_bytes", 0);
        d.frozen = json_u64(R.out, "frozen", 0);
        ZT_CHECK(d.frozen == (a == 4 ? 100000001u : 0u));
        ZT_CHECK(json_u64(R.out, "param_bytes", 0) == 2);
        for (s = first; s <= last; s++) {
            zero_estimate e;
            int k = s - first;
            d.stage = s;
            ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_OK);
            ZT_CHECK(json_u64(R.out, "stage", k) == (uint64_t)s);
            ZT_CHECKF(json_u64(R.out, "device_bytes", k) == e.device_bytes, "%s stage %d", argsets[a], s);
            ZT_CHECK(json_u64(R.out, "params_bytes", k) == e.params_bytes);
            ZT_CHECK(json_u64(R.out, "grads_bytes", k) == e.grads_bytes);
            /* the header's optimizer_bytes is K; the rows' come after it */
            ZT_CHECK(json_u64(R.out, "optimizer_bytes", k + 1) == e.optimizer_bytes);
            ZT_CHECK(json_u64(R.out, "host_bytes", k) == e.host_bytes);
        }
        ZT_CHECK(json_u64(R.out, "device_bytes", last - first + 1) == (uint64_t)-1); /* no extra rows */
    }
    /* the paper's numbers, literally */
    run("--params 7.5e9 --ranks 64 --json");
    ZT_CHECK(json_u64(R.out, "device_bytes", 0) == 120000000000ull);
    ZT_CHECK(json_u64(R.out, "device_bytes", 1) == 31406250000ull);
    ZT_CHECK(json_u64(R.out, "device_bytes", 2) == 16640625000ull);
    ZT_CHECK(json_u64(R.out, "device_bytes", 3) == 1875000000ull);
    ZT_CHECK(strstr(R.out, "\"saving\": 64.000000") != NULL);
}

ZT_TEST(json_deepspeed)
{
    if (!have_tool()) ZT_SKIP(TOOL " not built");
    /* DeepSpeed's documented t5-3b example, stage 3: gpu 0.12/0.78/6.09 GiB */
    run("--deepspeed --params 2851M --largest-layer 32M --ranks 8 --gpus-per-node 8 --stage 3 --json");
    ZT_CHECKF(R.status == 0, "exit %d: %s", R.status, R.err);
    ZT_CHECK(json_u64(R.out, "nodes", 0) == 1 && json_u64(R.out, "gpus_per_node", 0) == 8);
    ZT_CHECK(json_u64(R.out, "device_bytes", 0) == 128000000ull);
    ZT_CHECK(json_u64(R.out, "host_bytes", 0) == 76977000000ull);
    ZT_CHECK(json_u64(R.out, "device_bytes", 2) == 840750000ull);
    ZT_CHECK(json_u64(R.out, "host_bytes", 2) == 68424000000ull);
    ZT_CHECK(json_u64(R.out, "device_bytes", 4) == 6542750000ull);
    ZT_CHECK(json_u64(R.out, "host_bytes", 4) == 1536000000ull);
    ZT_CHECK(json_u64(R.out, "host_bytes", 5) == 136848000000ull);
    ZT_CHECK(json_u64(R.out, "device_bytes", 6) == (uint64_t)-1);
    ZT_CHECK(json_u64(R.out, "gather_bytes", 0) == 128000000ull);
    /* the table prints DeepSpeed's GiB figures with --gib */
    run("--deepspeed --params 2851M --largest-layer 32M --ranks 8 --gpus-per-node 8 --gib");
    ZT_CHECK(R.status == 0);
    ZT_CHECK(strstr(R.out, "71.69 GiB") && strstr(R.out, "63.72 GiB") && strstr(R.out, "6.09 GiB") &&
             strstr(R.out, "5.31 GiB") && strstr(R.out, "127.45 GiB"));
    /* without --gib, DeepSpeed's own units: the same 2^30-byte figures, labelled GB as it prints them */
    run("--deepspeed --params 2851M --largest-layer 32M --ranks 8 --gpus-per-node 8");
    ZT_CHECK(R.status == 0);
    ZT_CHECKF(strstr(R.out, "71.69 GB") && strstr(R.out, "6.09 GB") && strstr(R.out, "127.45 GB") &&
                  !strstr(R.out, "76.98 GB") && !strstr(R.out, "GiB"), "%s", R.out);
    /* --offload keeps only the offloaded rows */
    run("--deepspeed --params 2851M --largest-layer 32M --ranks 8 --offload --json");
    ZT_CHECK(R.status == 0 && strstr(R.out, "\"offload_optimizer\": false") == NULL);
    /* stage 2 cpu; stage 3 (cpu, cpu) and (cpu, none), zero.Init on and off: 5 rows */
    ZT_CHECK(json_u64(R.out, "device_bytes", 5) == (uint64_t)-1 && json_u64(R.out, "device_bytes", 4) != (uint64_t)-1);
}

ZT_TEST(inverse)
{
    char args[256];
    uint64_t psi;
    zero_estimate_desc d;
    int s;
    if (!have_tool()) ZT_SKIP(TOOL " not built");
    run("--max-params --memory 32GB --ranks 1024 --stage 3 --json");
    ZT_CHECKF(R.status == 0, "exit %d: %s", R.status, R.err);
    ZT_CHECK(json_u64(R.out, "memory_bytes", 0) == 32000000000ull);
    ZT_CHECK(json_u64(R.out, "max_params", 0) == 2048000000000ull); /* 16 * ceil(Psi/1024) <= 32e9 */
    ZT_CHECK(json_u64(R.out, "device_bytes", 0) == 32000000000ull);
    /* every stage, against the library and against the forward CLI at Psi and Psi + 1 */
    run("--max-params --memory 80GiB --ranks 96 --json");
    ZT_CHECK(R.status == 0 && json_u64(R.out, "memory_bytes", 0) == 85899345920ull);
    memset(&d, 0, sizeof d);
    d.ranks = 96;
    for (s = 0; s < 4; s++) {
        uint64_t got = json_u64(R.out, "max_params", s);
        d.stage = s;
        ZT_CHECK(zero_estimate_max_params(&d, 85899345920ull, &psi) == ZERO_OK && psi == got);
    }
    for (s = 0; s < 4; s++) {
        uint64_t got;
        run("--max-params --memory 80GiB --ranks 96 --json");
        got = json_u64(R.out, "max_params", s);
        snprintf(args, sizeof args, "--params %llu --ranks 96 --stage %d --json", (unsigned long long)got, s);
        run(args);
        ZT_CHECK(R.status == 0 && json_u64(R.out, "device_bytes", 0) <= 85899345920ull);
        snprintf(args, sizeof args, "--params %llu --ranks 96 --stage %d --json", (unsigned long long)got + 1, s);
        run(args);
        ZT_CHECK(R.status == 0 && json_u64(R.out, "device_bytes", 0) > 85899345920ull);
    }
    run("--max-params --memory 32GB --ranks 1024");
    ZT_CHECK(R.status == 0 && strstr(R.out, "2,048,000,000,000") != NULL);
}

ZT_TEST(sizes_parse_exactly)
{
    static const struct {
        const char *arg;
        uint64_t value;
    } params[] = {{"7500000000", 7500000000ull}, {"7.5e9", 7500000000ull}, {"7.5B", 7500000000ull},
                  {"7500M", 7500000000ull},      {"0.0075T", 7500000000ull}, {"75e8", 7500000000ull},
                  {"350M", 350000000ull},        {"32K", 32000ull},          {"1.5T", 1500000000000ull},
                  {"7.5G", 7500000000ull},       {"1e0", 1ull},              {"000012", 12ull},
                  {"12.000", 12ull},             {"1.25e2", 125ull},         {"2P", 2000000000000000ull}};
    static const struct {
        const char *arg;
        uint64_t value;
    } mem[] = {{"32GB", 32000000000ull}, {"32G", 32000000000ull},     {"32GiB", 34359738368ull},
               {"1.5GiB", 1610612736ull}, {"0.5KiB", 512ull},          {"80e9", 80000000000ull},
               {"1TiB", 1099511627776ull}, {"16384", 16384ull},        {"0.25MB", 250000ull},
               {"2.5e-1KiB", 256ull},     {"0", 0ull},               {"1EB", 1000000000000000000ull},
               {"1EiB", 1152921504606846976ull}, {"15EiB", 17293822569102704640ull},
               {"0.5EB", 500000000000000000ull}, {"2e0EiB", 2305843009213693952ull},
               {"1.5EiB", 1729382256910270464ull}};
    char args[256];
    size_t i;
    if (!have_tool()) ZT_SKIP(TOOL " not built");
    for (i = 0; i < sizeof params / sizeof params[0]; i++) {
        snprintf(args, sizeof args, "--params %s --ranks 8 --stage 0 --json", params[i].arg);
        run(args);
        ZT_CHECKF(R.status == 0 && json_u64(R.out, "params", 0) == params[i].value, "%s -> %llu (exit %d)",
                  params[i].arg, (unsigned long long)json_u64(R.out, "params", 0), R.status);
    }
    for (i = 0; i < sizeof mem / sizeof mem[0]; i++) {
        snprintf(args, sizeof args, "--max-params --memory %s --ranks 8 --stage 0 --json", mem[i].arg);
        run(args);
        ZT_CHECKF(R.status == 0 && json_u64(R.out, "memory_bytes", 0) == mem[i].value, "%s -> %llu (exit %d)",
                  mem[i].arg, (unsigned long long)json_u64(R.out, "memory_bytes", 0), R.status);
    }
    /* --opt=value works as well as --opt value */
    run("--params=350M --ranks=3 --stage=1 --json");
    ZT_CHECK(R.status == 0 && json_u64(R.out, "params", 0) == 350000000ull && json_u64(R.out, "stage", 0) == 1);
}

ZT_TEST(bad_arguments_exit_2_with_usage)
{
    static const char *bad[] = {
        "--params 7.5X --ranks 8", "--params -1 --ranks 8", "--params nan --ranks 8",
        "--params inf --ranks 8", "--params '' --ranks 8", "--params 7.5e9junk --ranks 8",
        "--params 1.5 --ranks 8", "--params 0 --ranks 8", "--params 32GB --ranks 8",
        "--params 1e30 --ranks 8", "--params 99999999999999999999 --ranks 8", "--params 1e --ranks 8",
        "--params . --ranks 8", "--params 1..5 --ranks 8", "--params ' 5' --ranks 8",
        "--params 5 --ranks 0", "--params 5 --ranks 8 --stage 4", "--params 5 --ranks 8 --stage -1",
        "--params 5", "--ranks 8", "--params 5 --ranks 8 --bogus", "--params 5 --ranks 8 extra",
        "--params 5 --ranks 8 --memory 32GB", "--max-params --ranks 8", "--max-params --memory 32X --ranks 8",
        "--max-params --memory 32B --ranks 8", "--max-params --memory -5 --ranks 8",
        "--max-params --memory 32GB --ranks 8 --params 5", "--params 5 --ranks 8 --offload=1",
        "--params 5 --ranks 8 --stage", "--deepspeed --params 5 --ranks 8 --stage 1",
        "--deepspeed --params 5 --ranks 8 --stage 3", "--params 5 --ranks 8 --gpus-per-node 2",
        "--deepspeed --params 5 --ranks 8 --gpus-per-node 3",
        "--deepspeed --params 5 --ranks 8 --largest-layer 6 --stage 3",
        "--deepspeed --params 5 --ranks 8 --buffer-factor nan",
        "--deepspeed --params 5 --ranks 8 --buffer-factor -1",
        "--params 5 --ranks 8 --optimizer-bytes 0", "--params 5 --ranks 8 --param-bytes 2000",
        "--params 5 --ranks 8 --frozen 6", "--params 5 --ranks 8 --frozen -1", "--params 5 --ranks 8 --frozen",
        "--deepspeed --params 5 --ranks 8 --stage 2 --frozen 1",
        "--params 9007199254740993 --ranks 8", "--ranks 99999999999 --params 5",
        "--max-params --memory 16EiB --ranks 8", "--max-params --memory 19EB --ranks 8",
        "--max-params --memory 1E --ranks 8", "--max-params --memory 1eB --ranks 8",
        /* the inverse agrees with the forward query: host bytes past 64 bits are OVERFLOW */
        "--deepspeed --max-params --memory 80GB --ranks 8 --stage 2 --offload --buffer-factor 1e12",
        "--deepspeed --max-params --memory 80GB --ranks 8 --stage 2 --offload --buffer-factor 1e300",
        "--deepspeed --params 40000000000 --ranks 8 --stage 2 --offload --buffer-factor 1e12"};
    size_t i;
    if (!have_tool()) ZT_SKIP(TOOL " not built");
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *nl;
        run(bad[i]);
        nl = strchr(R.err, '\n');
        ZT_CHECKF(R.status == 2, "'%s': exit %d", bad[i], R.status);
        ZT_CHECKF(count_lines(R.err) == 2 && strncmp(R.err, "zero-estimate: ", 15) == 0 && nl &&
                      strncmp(nl + 1, "usage: zero-estimate", 20) == 0,
                  "'%s': stderr '%s'", bad[i], R.err);
        ZT_CHECKF(R.out[0] == '\0', "'%s' printed to stdout", bad[i]);
        if (strstr(bad[i], "--buffer-factor 1e"))
            ZT_CHECKF(strstr(R.err, "overflow") != NULL, "'%s': %s", bad[i], R.err);
    }
    /* EB is a unit, not an exponent: the message says what is wrong with a bad size */
    run("--max-params --memory 16EiB --ranks 8");
    ZT_CHECKF(strstr(R.err, "too large") != NULL, "%s", R.err);
}

ZT_TEST(help_goes_to_stdout)
{
    if (!have_tool()) ZT_SKIP(TOOL " not built");
    run("--help");
    ZT_CHECK(R.status == 0 && R.err[0] == '\0');
    ZT_CHECK(strncmp(R.out, "usage: zero-estimate", 20) == 0 && strstr(R.out, "--max-params") != NULL);
    run("-h");
    ZT_CHECK(R.status == 0 && strncmp(R.out, "usage: zero-estimate", 20) == 0);
}

/* --offload-optimizer / --offload-param: the rows equal the library's estimate (tiers), the
   inverse fits, and misuse exits 2. */
ZT_TEST(offload_tiers)
{
    zero_estimate_desc d;
    zero_estimate e;
    uint64_t mx;
    if (!have_tool()) ZT_SKIP(TOOL " not built");
    run("--params 1000003 --ranks 7 --offload-optimizer nvme --offload-param cpu --json");
    ZT_CHECK(R.status == 0);
    memset(&d, 0, sizeof d);
    d.params = 1000003;
    d.ranks = 7;
    d.stage = 3;
    d.offload_optimizer = ZERO_OFFLOAD_NVME;
    d.offload_param = ZERO_OFFLOAD_CPU;
    ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_OK);
    ZT_CHECK(json_u64(R.out, "nvme_bytes", 0) == e.nvme_bytes && e.nvme_bytes > 0);
    ZT_CHECK(json_u64(R.out, "host_bytes", 0) == e.host_bytes && json_u64(R.out, "device_bytes", 0) == e.device_bytes);
    ZT_CHECK(json_u64(R.out, "device_bytes", 1) == (uint64_t)-1); /* stage 3 only */
    run("--max-params --memory 1GB --ranks 4 --stage 2 --offload-optimizer cpu --json");
    ZT_CHECK(R.status == 0);
    memset(&d, 0, sizeof d);
    d.ranks = 4;
    d.stage = 2;
    d.offload_optimizer = ZERO_OFFLOAD_CPU;
    ZT_CHECK(zero_estimate_max_params(&d, 1000000000ull, &mx) == ZERO_OK);
    ZT_CHECK(json_u64(R.out, "max_params", 0) == mx);
    run("--params 5 --ranks 2 --stage 2 --offload-optimizer cpu --offload-param cpu");
    ZT_CHECK(R.status == 2);
    run("--params 5 --ranks 2 --offload-optimizer disk");
    ZT_CHECK(R.status == 2);
    run("--params 5 --ranks 2 --offload-param nvme");
    ZT_CHECK(R.status == 2);
}

/* --help: the usage on stdout, exit 0; an unknown option: named on stderr, exit 2. In
   every program a user runs. */
ZT_TEST(help_and_unknown_options_everywhere)
{
    static const char *const prog[] = {"build/zero-estimate", "build/zero-ckpt", "build/train_mlp",
                                       "build/train_gpt2"};
    size_t i, ran = 0;
    for (i = 0; i < sizeof prog / sizeof prog[0]; i++) {
        char line[256];
        if (access(prog[i], X_OK) != 0) {
            printf("  %s not built: not checked\n", prog[i]);
            continue;
        }
        ran++;
        snprintf(line, sizeof line, "%s --help", prog[i]);
        run_cmd(line);
        ZT_CHECKF(R.status == 0, "%s: exit %d", line, R.status);
        ZT_CHECKF(strncmp(R.out, "usage: ", 7) == 0 && R.err[0] == '\0', "%s: stdout '%s' stderr '%s'",
                  line, R.out, R.err);
        snprintf(line, sizeof line, "%s --no-such-option", prog[i]);
        run_cmd(line);
        ZT_CHECKF(R.status == 2 && strstr(R.err, "--no-such-option") != NULL && R.out[0] == '\0',
                  "%s: exit %d, stderr '%s'", line, R.status, R.err);
    }
    if (ran == 0) ZT_SKIP("no program built (make test builds them)");
    if (access("build/zero-ckpt", X_OK) != 0) return;
    run_cmd("build/zero-ckpt info");  /* a missing argument is a usage error, not help */
    ZT_CHECK(R.status == 2 && strstr(R.err, "usage: zero-ckpt") != NULL);
}

/* train_gpt2 --help names every option its parser (examples/gpt2_common.h, shared with the
   CUDA example) accepts: each `!strcmp(k, "--X")` of the source but --help appears in the
   usage. */
ZT_TEST(gpt2_help_names_every_option)
{
    static char src[65536];
    FILE *f;
    size_t n;
    const char *p;
    int options = 0;
    if (access("build/train_gpt2", X_OK) != 0) ZT_SKIP("build/train_gpt2 not built");
    f = fopen("examples/gpt2_common.h", "r");
    ZT_CHECK(f != NULL);
    if (!f) return;
    n = fread(src, 1, sizeof src - 1, f);
    src[n] = '\0';
    fclose(f);
    run_cmd("build/train_gpt2 --help");
    ZT_CHECK(R.status == 0);
    for (p = src; (p = strstr(p, "!strcmp(k, \"--")) != NULL; p++) {
        char opt[64];
        const char *q = p + 12, *end = strchr(q, '"');
        if (!end || end - q >= (long)sizeof opt) continue;
        memcpy(opt, q, (size_t)(end - q));
        opt[end - q] = '\0';
        if (!strcmp(opt, "--help")) continue; /* what prints it */
        options++;
        ZT_CHECKF(strstr(R.out, opt) != NULL, "build/train_gpt2 --help does not name %s", opt);
    }
    ZT_CHECKF(options >= 30, "only %d options found in examples/gpt2_common.h", options);
}

/* train_mlp's sizes: a batch that cannot be indexed is refused by name; a run whose buffers
   do not fit (an address-space limit makes it certain) says which allocation failed and how
   large it was, exit 1, instead of crashing or printing an empty detail. */
ZT_TEST(train_mlp_sizes_that_do_not_fit)
{
    if (access("build/train_mlp", X_OK) != 0) ZT_SKIP("build/train_mlp not built");
    run_cmd("build/train_mlp --batch 2147483647");
    ZT_CHECKF(R.status == 2 && strstr(R.err, "--batch 2147483647") != NULL, "exit %d: %s", R.status, R.err);
    run_cmd("build/train_mlp --steps 99999999999");
    ZT_CHECKF(R.status == 2 && strstr(R.err, "--steps 99999999999") != NULL, "exit %d: %s", R.status, R.err);
    /* 8 x 10^9 losses of 8 bytes: 64 GB, more than a 2 GB address space */
    run_cmd("ulimit -v 2000000 && build/train_mlp --steps 1000000000 --ranks 8");
    ZT_CHECKF(R.status == 1, "exit %d (a crash is not 1): %s", R.status, R.err);
    ZT_CHECKF(strstr(R.err, "out of memory") && strstr(R.err, "64000000000 bytes") &&
                  strstr(R.err, "losses"), "%s", R.err);
    /* activations of 10^6 samples: 128 floats each, 512 MB per layer buffer */
    run_cmd("ulimit -v 1500000 && build/train_mlp --batch 1000000 --steps 1 --stage 0 --ranks 2");
    ZT_CHECKF(R.status == 1, "exit %d: %s", R.status, R.err);
    ZT_CHECKF(strstr(R.err, "stage 0 failed: out of memory: cannot allocate ") &&
                  strstr(R.err, "activations") && strstr(R.err, "--batch 1000000"), "%s", R.err);
}

/* A checkpoint whose tensor names hold control characters (a terminal escape, a tab, a
   newline), a backslash and UTF-8: zero-ckpt info prints them escaped (no raw control byte
   reaches the terminal), UTF-8 as it is. */
static const char *const odd_names[] = {"red\x1b[31mtext", "tab\tnew\nline", "back\\slash",
                                        "caf\xc3\xa9"};
static zero_result odd_rank(int rank, zero_comm *comm, void *user)
{
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    size_t i;
    zero_result r = zero_host_device_create(NULL, &dev);
    (void)rank;
    memset(&d, 0, sizeof d);
    d.device = dev;
    d.comm = comm;
    if (!r) r = zero_engine_create(&d, &e);
    for (i = 0; i < sizeof odd_names / sizeof odd_names[0] && !r; i++)
        r = zero_engine_add_tensor(e, odd_names[i], 8, 0, 0, NULL);
    if (!r) r = zero_engine_commit(e);
    if (!r) r = zero_engine_save(e, (const char *)user);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(ckpt_info_escapes_names)
{
    char dir[64], line[160];
    const char *p;
    if (access("build/zero-ckpt", X_OK) != 0) ZT_SKIP("build/zero-ckpt not built");
    snprintf(dir, sizeof dir, "/tmp/zt_cli_names_%d", (int)getpid());
    ZT_CHECKF(zero_local_run(1, odd_rank, dir) == ZERO_OK, "%s", zero_last_error());
    snprintf(line, sizeof line, "build/zero-ckpt info %s", dir);
    run_cmd(line);
    ZT_CHECKF(R.status == 0, "exit %d: %s", R.status, R.err);
    for (p = R.out; *p; p++)
        ZT_CHECKF((unsigned char)*p >= 0x20 || *p == '\n', "raw control byte 0x%02x in: %s", *p, R.out);
    ZT_CHECKF(strstr(R.out, "red\\x1b[31mtext") && strstr(R.out, "tab\\x09new\\x0aline") &&
                  strstr(R.out, "back\\x5cslash") && strstr(R.out, "caf\xc3\xa9"), "%s", R.out);
    snprintf(line, sizeof line, "rm -rf '%s'", dir);
    ZT_CHECK(system(line) == 0);
}

/* ---- train_gpt2's inputs (issue 25): every refusal names the flag and the figure ------------ */

#define GPT2 "build/train_gpt2"
#define GPT2_SMALL GPT2 " --ranks 1 --stage 0 --sample 0 --val-batches 1 --layers 2"

/* A --init file of the small model (tied: no lm_head.weight unless 'head' is 1 (wte's
   values) or 2 (other values)), element 'nan_at' of tensor 'nan_tensor' a NaN (-1: none). */
static int write_init(const char *path, int head, int nan_tensor, size_t nan_at)
{
    gpt2_opts o;
    gpt2_tensor *t;
    char *hdr, *a0 = (char *)"t", *a1 = (char *)"--layers", *a2 = (char *)"2";
    char *argv[] = {a0, a1, a2};
    size_t off = 0, used = 0, cap = 65536, hl;
    int i, n, k, rc = -1;
    FILE *f;
    gpt2_opts_default(&o);
    if (gpt2_parse_args(3, argv, &o) != 0) return -1;
    n = gpt2_num_tensors(&o.cfg);
    t = (gpt2_tensor *)calloc((size_t)n, sizeof *t);
    hdr = (char *)malloc(cap);
    if (!t || !hdr || !(f = fopen(path, "wb"))) goto out;
    gpt2_param_table(&o.cfg, t);
    used += (size_t)snprintf(hdr + used, cap - used, "{");
    for (i = 0; i <= n; i++) { /* i == n: the head */
        int src = i == n ? GPT2_WTE : i;
        if (i == n && !head) break;
        used += (size_t)snprintf(hdr + used, cap - used, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[", i ? "," : "",
                                 i == n ? "lm_head.weight" : t[src].name);
        for (k = 0; k < t[src].ndim; k++)
            used += (size_t)snprintf(hdr + used, cap - used, "%s%llu", k ? "," : "", (unsigned long long)t[src].dims[k]);
        used += (size_t)snprintf(hdr + used, cap - used, "],\"data_offsets\":[%zu,%zu]}", off, off + 4 * t[src].numel);
        off += 4 * t[src].numel;
    }
    used += (size_t)snprintf(hdr + used, cap - used, "}");
    hl = used;
    for (k = 0; k < 8; k++) fputc((int)((unsigned long long)hl >> (8 * k) & 255), f);
    fwrite(hdr, 1, hl, f);
    for (i = 0; i <= n; i++) {
        int src = i == n ? GPT2_WTE : i;
        float *v;
        if (i == n && !head) break;
        v = (float *)malloc(4 * t[src].numel);
        if (!v) break;
        gpt2_init_values(&o.cfg, t, src, o.seed, v);
        if (i == nan_tensor) v[nan_at] = NAN;
        if (i == n && head == 2) v[7] += 1.0f;
        fwrite(v, 4, t[src].numel, f);
        free(v);
    }
    rc = fclose(f) == 0 && i == n + 1 - (head ? 0 : 1) ? 0 : -1;
out:
    free(t);
    free(hdr);
    return rc;
}

ZT_TEST(gpt2_init_refuses_nan_and_untied_head)
{
    char path[64], line[256];
    if (access(GPT2, X_OK) != 0) ZT_SKIP(GPT2 " not built");
    snprintf(path, sizeof path, "/tmp/zt_cli_init_%d.safetensors", (int)getpid());
    ZT_CHECK(write_init(path, 0, -1, 0) == 0); /* a good file trains */
    snprintf(line, sizeof line, GPT2_SMALL " --steps 2 --init %s", path);
    run_cmd(line);
    ZT_CHECKF(R.status == 0 && strstr(R.out, "val loss: ") != NULL, "exit %d: %s", R.status, R.err);
    ZT_CHECK(write_init(path, 1, -1, 0) == 0); /* a head equal to wte is tied: accepted */
    run_cmd(line);
    ZT_CHECKF(R.status == 0, "tied lm_head.weight: exit %d: %s", R.status, R.err);
    ZT_CHECK(write_init(path, 2, -1, 0) == 0); /* an untied head: refused, named */
    run_cmd(line);
    ZT_CHECKF(R.status == 2 && strstr(R.err, "lm_head.weight") && strstr(R.err, "untied"), "exit %d: %s", R.status,
              R.err);
    ZT_CHECK(write_init(path, 0, gpt2_block_tensor(1, GPT2_FC_W), 77) == 0); /* a NaN: refused, named */
    run_cmd(line);
    ZT_CHECKF(R.status == 2 && strstr(R.err, "transformer.h.1.mlp.c_fc.weight holds NaN at element 77"),
              "exit %d: out %s err %s", R.status, R.out, R.err);
    ZT_CHECK(strstr(R.out, "val loss: 0") == NULL);
    remove(path);
}

/* Crafts a checkpoint of the small model whose client state is 'cl' (checksums valid: the
   engine writes it). */
static zero_result craft_rank(int rank, zero_comm *comm, void *user)
{
    const gpt2_client *cl = (const gpt2_client *)user;
    static const char dir_fmt[] = "/tmp/zt_cli_craft_%d";
    char dir[64], *a0 = (char *)"t", *a1 = (char *)"--layers", *a2 = (char *)"2";
    char *argv[] = {a0, a1, a2};
    gpt2_opts o;
    gpt2_tensor *t = NULL;
    zero_device *dev = NULL;
    zero_engine *e = NULL;
    zero_engine_desc d;
    zero_result r;
    (void)rank;
    gpt2_opts_default(&o);
    gpt2_parse_args(3, argv, &o);
    snprintf(dir, sizeof dir, dir_fmt, (int)getpid());
    gpt2_engine_desc(&o, 0, o.batch, &d);
    r = zero_host_device_create(NULL, &dev);
    d.device = dev, d.comm = comm;
    if (!r) r = zero_engine_create(&d, &e);
    t = (gpt2_tensor *)calloc((size_t)gpt2_num_tensors(&o.cfg), sizeof *t);
    if (!t) r = ZERO_ERROR_OUT_OF_MEMORY;
    else gpt2_param_table(&o.cfg, t);
    if (!r) r = gpt2_add_tensors(e, &o.cfg, t);
    if (!r) r = zero_engine_commit(e);
    if (!r) r = gpt2_set_init(e, &o.cfg, t, o.seed);
    if (!r) r = zero_engine_save_client(e, dir, cl, sizeof *cl);
    free(t);
    zero_engine_destroy(e);
    zero_device_destroy(dev);
    return r;
}

ZT_TEST(gpt2_resume_validates_the_client_state)
{
    static const int64_t steps[] = {-1, INT64_MAX, 11};
    char dir[64], line[320], *a0 = (char *)"t", *a1 = (char *)"--layers", *a2 = (char *)"2";
    char *argv[] = {a0, a1, a2};
    gpt2_opts o;
    gpt2_client cl;
    size_t k;
    if (access(GPT2, X_OK) != 0) ZT_SKIP(GPT2 " not built");
    snprintf(dir, sizeof dir, "/tmp/zt_cli_craft_%d", (int)getpid());
    gpt2_opts_default(&o);
    ZT_CHECK(gpt2_parse_args(3, argv, &o) == 0);
    for (k = 0; k < sizeof steps / sizeof steps[0]; k++) { /* next_step outside 0..--steps: refused */
        gpt2_client_init(&cl, &o);
        cl.next_step = steps[k];
        cl.next_batch = steps[k] > 0 ? (uint64_t)steps[k] : 0;
        ZT_CHECKF(zero_local_run(1, craft_rank, &cl) == ZERO_OK, "%s", zero_last_error());
        snprintf(line, sizeof line, GPT2_SMALL " --steps 10 --resume %s", dir);
        run_cmd(line);
        ZT_CHECKF(R.status == 1 && strstr(R.err, "damaged") && strstr(R.err, "--steps 10"), "next_step %lld: exit %d: %s",
                  (long long)steps[k], R.status, R.err);
    }
    gpt2_client_init(&cl, &o); /* a next_batch that no run reaches: refused */
    cl.next_step = 3, cl.next_batch = 2;
    ZT_CHECK(zero_local_run(1, craft_rank, &cl) == ZERO_OK);
    run_cmd(line);
    ZT_CHECKF(R.status == 1 && strstr(R.err, "next batch 2"), "exit %d: %s", R.status, R.err);
    gpt2_client_init(&cl, &o); /* a good one resumes, and says so */
    cl.next_step = 3, cl.next_batch = 3;
    ZT_CHECK(zero_local_run(1, craft_rank, &cl) == ZERO_OK);
    run_cmd(line);
    ZT_CHECKF(R.status == 0, "exit %d: %s", R.status, R.err);
    snprintf(line, sizeof line, "resumed from %s at step 3\n", dir);
    ZT_CHECKF(strstr(R.out, line) != NULL, "%s", R.out);
    /* another shape (--heads): refused, both named */
    snprintf(line, sizeof line, GPT2_SMALL " --steps 10 --heads 8 --resume %s", dir);
    run_cmd(line);
    ZT_CHECKF(R.status == 1 && strstr(R.err, "checkpoint's model is --layers 2 --heads 4") &&
                  strstr(R.err, "this run's is --layers 2 --heads 8"), "exit %d: %s", R.status, R.err);
    ZT_CHECKF(count_lines(R.err) == 1, "printed once: %s", R.err);
    snprintf(line, sizeof line, "rm -rf '%s'", dir);
    ZT_CHECK(system(line) == 0);
}

/* --save and --resume say what they did; a resumed run continues the straight one. */
ZT_TEST(gpt2_save_and_resume_print_what_they_did)
{
    char dir[64], line[320];
    if (access(GPT2, X_OK) != 0) ZT_SKIP(GPT2 " not built");
    snprintf(dir, sizeof dir, "/tmp/zt_cli_save_%d", (int)getpid());
    snprintf(line, sizeof line, GPT2_SMALL " --steps 4 --stop-at 2 --save %s", dir);
    run_cmd(line);
    ZT_CHECKF(R.status == 0, "exit %d: %s", R.status, R.err);
    snprintf(line, sizeof line, "saved step 2 to %s\n", dir);
    ZT_CHECKF(strstr(R.out, line) != NULL, "%s", R.out);
    snprintf(line, sizeof line, GPT2_SMALL " --steps 4 --resume %s", dir);
    run_cmd(line);
    snprintf(line, sizeof line, "resumed from %s at step 2\n", dir);
    ZT_CHECKF(R.status == 0 && strstr(R.out, line) != NULL, "exit %d: %s %s", R.status, R.out, R.err);
    snprintf(line, sizeof line, "rm -rf '%s'", dir);
    ZT_CHECK(system(line) == 0);
}

/* Errors name the flags typed, not the engine's fields, and are printed once; --nvme-path is
   created like --save's directory; --help gives the defaults. */
ZT_TEST(cli_errors_name_flags_once)
{
    char dir[64], line[256];
    if (access(GPT2, X_OK) != 0 || access("build/train_mlp", X_OK) != 0) ZT_SKIP("examples not built");
    run_cmd("build/train_mlp --offload-optimizer nvme --steps 1");
    ZT_CHECKF(R.status != 0 && strstr(R.err, "needs --nvme-path") && !strstr(R.err, "nvme_path") &&
                  count_lines(R.err) == 1, "exit %d: %s", R.status, R.err);
    run_cmd(GPT2 " --offload-param cpu --stage 1 --steps 1");
    ZT_CHECKF(R.status != 0 && strstr(R.err, "--offload-param cpu needs stage 3") && !strstr(R.err, "offload_param") &&
                  count_lines(R.err) == 1, "exit %d: %s", R.status, R.err);
    snprintf(dir, sizeof dir, "/tmp/zt_cli_nvme_%d", (int)getpid());
    snprintf(line, sizeof line, "build/train_mlp --offload-optimizer nvme --nvme-path %s --steps 2", dir);
    run_cmd(line);
    ZT_CHECKF(R.status == 0 && access(dir, F_OK) == 0 && strstr(R.out, "--offload-optimizer nvme"), "exit %d: %s",
              R.status, R.err);
    snprintf(line, sizeof line, "rm -rf '%s'", dir);
    ZT_CHECK(system(line) == 0);
    snprintf(line, sizeof line, GPT2_SMALL " --steps 1 --offload-optimizer nvme --nvme-path %s/a/b", dir);
    run_cmd(line); /* one level is created, as zero_engine_save does; the error says which */
    ZT_CHECKF(R.status == 2 && strstr(R.err, "--nvme-path ") && strstr(R.err, "cannot create it") &&
                  !strstr(R.err, "host tier"), "exit %d: %s", R.status, R.err);
    run_cmd(GPT2 " --help");
    ZT_CHECK(strstr(R.out, "--steps S (default 100)") && strstr(R.out, "--lr LR (default 3e-3)") &&
             strstr(R.out, "--offload-activations none|cpu|nvme"));
    snprintf(line, sizeof line, GPT2_SMALL " --steps 2 --offload-activations cpu");
    run_cmd(line);
    ZT_CHECKF(R.status == 0 && strstr(R.out, "inputs stashed (cpu)"), "exit %d: %s %s", R.status, R.out, R.err);
}

/* What the single-stage summary and the step lines say: with offload the measured model
   states are the device's (the other tiers named), an fp16 skipped step says why. */
ZT_TEST(gpt2_labels_say_what_they_count)
{
    char line[256];
    if (access(GPT2, X_OK) != 0) ZT_SKIP(GPT2 " not built");
    snprintf(line, sizeof line, GPT2 " --stage 3 --ranks 2 --steps 2 --sample 0 --val-batches 1 --layers 2 "
             "--offload-optimizer nvme --offload-param nvme --nvme-path /tmp/zt_cli_nvl_%d", (int)getpid());
    run_cmd(line);
    ZT_CHECKF(R.status == 0 && strstr(R.out, "model states per rank: 0 B measured on the device (+ ") &&
                  strstr(R.out, "B by formula (every tier)"), "exit %d: %s %s", R.status, R.out, R.err);
    snprintf(line, sizeof line, "rm -rf /tmp/zt_cli_nvl_%d", (int)getpid());
    ZT_CHECK(system(line) == 0);
    run_cmd(GPT2_SMALL " --dtype f16 --steps 3 --lr 300 --warmup 0 --clip 0");
    ZT_CHECKF(R.status == 0 && strstr(R.out, "norm  -1.0000") &&
                  strstr(R.out, "| skipped (norm -1): inf/NaN gradients, an fp16 overflow: the loss scale halves"),
              "exit %d: %s", R.status, R.out);
}

/* The memory check's activation bytes (gpt2_activation_bytes) are what the run allocates. */
ZT_TEST(gpt2_activation_estimate_is_what_it_allocates)
{
    static const char *const flags[] = {"", "--offload-activations cpu", "--dtype bf16", "--tile-embedding 3",
                                        "--tile-embedding 5 --dtype f16 --batch 4 --heads 2"};
    size_t k;
    if (access(GPT2, X_OK) != 0) ZT_SKIP(GPT2 " not built");
    for (k = 0; k < sizeof flags / sizeof flags[0]; k++) {
        char line[256], *a[16], buf[256], *tok, *save = NULL;
        int argc = 0;
        gpt2_opts o;
        const char *p;
        double est;
        unsigned long long got = 0;
        snprintf(line, sizeof line, GPT2_SMALL " --steps 1 --val-batches 1 %s", flags[k]);
        run_cmd(line);
        ZT_CHECKF(R.status == 0, "%s: exit %d: %s", line, R.status, R.err);
        p = strstr(R.out, "rank 0 activations ");
        ZT_CHECKF(p && sscanf(p, "rank 0 activations %llu B", &got) == 1, "%s", R.out);
        snprintf(buf, sizeof buf, "t --ranks 1 --layers 2 %s", flags[k]);
        for (tok = strtok_r(buf, " ", &save); tok && argc < 16; tok = strtok_r(NULL, " ", &save)) a[argc++] = tok;
        gpt2_opts_default(&o);
        ZT_CHECK(gpt2_parse_args(argc, a, &o) == 0);
        est = gpt2_activation_bytes(&o.cfg, o.batch / o.ranks, o.oact != ZERO_OFFLOAD_NONE, o.tile_embedding, o.dtype);
        ZT_CHECKF(fabs(est - (double)got) <= 1e-3 * (double)got, "%s: allocated %llu, estimated %.0f (argc %d tiles %d B %d L %d)", flags[k], got,
                  est, argc, o.tile_embedding, o.batch, o.cfg.layers);
    }
}

/* Sizes that cannot fit are refused before anything is allocated, with the figure; what
   runs out anyway says which allocation; devices and FIFOs are not read as data. */
ZT_TEST(gpt2_sizes_and_data_that_do_not_fit)
{
    char fifo[64], line[160];
    run_cmd("ulimit -v 4000000 && " GPT2 " --batch 16384 --steps 1 --stage 0");
    ZT_CHECKF(R.status == 1 && strstr(R.err, "this run needs about ") && strstr(R.err, "GB per rank x 4") &&
                  strstr(R.err, "--batch 16384") && R.out[0] == '\0', "exit %d: out %s err %s", R.status, R.out, R.err);
    run_cmd("ulimit -v 4000000 && " GPT2 " --batch 2048 --steps 1 --stage 0 --sample 0");
    ZT_CHECKF(R.status == 1 && strstr(R.err, "out of memory: cannot allocate ") && strstr(R.err, "bytes of activations"),
              "exit %d: %s", R.status, R.err);
    ZT_CHECKF(count_lines(R.err) == 1, "printed once: %s", R.err);
    run_cmd(GPT2 " --layers 100000000");
    ZT_CHECKF(R.status == 2 && strstr(R.err, "--layers must be at most"), "exit %d: %s", R.status, R.err);
    run_cmd(GPT2 " --layers 4x");
    ZT_CHECKF(R.status == 2 && strstr(R.err, "bad value for --layers: 4x"), "exit %d: %s", R.status, R.err);
    run_cmd(GPT2 " --data /dev/zero");
    ZT_CHECKF(R.status == 2 && strstr(R.err, "not a regular file"), "exit %d: %s", R.status, R.err);
    snprintf(fifo, sizeof fifo, "/tmp/zt_cli_fifo_%d", (int)getpid());
    ZT_CHECK(mkfifo(fifo, 0600) == 0);
    snprintf(line, sizeof line, "timeout 20 " GPT2 " --data %s", fifo);
    run_cmd(line);
    ZT_CHECKF(R.status == 2 && strstr(R.err, "not a regular file"), "exit %d: %s", R.status, R.err);
    remove(fifo);
}

/* The k-th number value of "key": in s as a double; NAN if absent. */
static double json_f64(const char *s, const char *key, int k)
{
    char pat[64];
    const char *p = s;
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    while ((p = strstr(p, pat)) != NULL) {
        p += strlen(pat);
        if (k-- == 0) return strtod(p, NULL);
    }
    return NAN;
}

/* Beyond one node (issue 26): --ranks-per-node, --mics-shard-size, --hpz-partition-size and
   --accum-steps give each row's bytes per step, total, inside and between nodes: the JSON
   equals zero_estimate_compute for the same settings to the last bit, the table prints the
   same integers, and the hpZ figures equal the formula of docs/engine.md computed here. */
ZT_TEST(topology_traffic)
{
    static const struct {
        const char *args;
        int R, S_mics, S_hpz, A, first, last;
    } cases[] = {
        {"--params 124M --ranks 8 --ranks-per-node 4", 4, 0, 0, 1, 0, 3},
        {"--params 124M --ranks 8 --ranks-per-node 4 --hpz-partition-size 4", 4, 0, 4, 1, 3, 3},
        {"--params 1000003 --ranks 8 --ranks-per-node 4 --hpz-partition-size 2 --accum-steps 3", 4, 0, 2, 3, 3, 3},
        {"--params 124M --ranks 8 --ranks-per-node 2 --mics-shard-size 4 --accum-steps 2", 2, 4, 0, 2, 1, 3},
    };
    int c, s;
    if (!have_tool()) ZT_SKIP(TOOL " not built");
    for (c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        char line[400];
        snprintf(line, sizeof line, "%s --json", cases[c].args);
        run(line);
        ZT_CHECKF(R.status == 0, "%s: exit %d: %s", line, R.status, R.err);
        for (s = cases[c].first; s <= cases[c].last; s++) {
            zero_estimate_desc d;
            zero_estimate e;
            int k = s - cases[c].first;
            memset(&d, 0, sizeof d);
            d.params = json_u64(R.out, "params", 0);
            d.ranks = 8;
            d.stage = s;
            d.ranks_per_node = cases[c].R;
            d.mics_shard_size = cases[c].S_mics;
            d.hpz_partition_size = cases[c].S_hpz;
            d.accum_steps = cases[c].A;
            ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_OK);
            ZT_CHECKF(json_f64(R.out, "step_bytes", k) == e.step_bytes &&
                          json_f64(R.out, "step_intra_bytes", k) == e.step_intra_bytes &&
                          json_f64(R.out, "step_inter_bytes", k) == e.step_inter_bytes &&
                          json_u64(R.out, "device_bytes", k) == e.device_bytes,
                      "%s stage %d", line, s);
            if (cases[c].S_hpz && d.params % 8 == 0) { /* docs/engine.md's hpZ row (Psi = P) */
                double P = (double)d.params, N = 8, Rn = cases[c].R, H = cases[c].S_hpz, A = cases[c].A;
                ZT_CHECK(e.step_inter_bytes == (A * 2 + 2) * P * (N - Rn) / N);
                ZT_CHECK(fabs(e.step_intra_bytes - ((A * 2 + 2) * P * (Rn - 1) / N +
                                                    (2 * A - 1) * 2 * P * (H - 1) / H)) <= 1e-9 * P);
                ZT_CHECK(e.params_bytes == (uint64_t)(2 * P / N + 2 * P / H));
            }
        }
        ZT_CHECK(json_u64(R.out, "device_bytes", cases[c].last - cases[c].first + 1) == (uint64_t)-1);
        run(cases[c].args); /* the table: the same integers */
        ZT_CHECKF(R.status == 0, "%s: exit %d", cases[c].args, R.status);
        for (s = cases[c].first; s <= cases[c].last; s++) {
            zero_estimate_desc d;
            zero_estimate e;
            char want[64];
            memset(&d, 0, sizeof d);
            d.params = c == 2 ? 1000003 : 124000000;
            d.ranks = 8;
            d.stage = s;
            d.ranks_per_node = cases[c].R;
            d.mics_shard_size = cases[c].S_mics;
            d.hpz_partition_size = cases[c].S_hpz;
            d.accum_steps = cases[c].A;
            ZT_CHECK(zero_estimate_compute(&d, &e) == ZERO_OK);
            snprintf(want, sizeof want, "%20.0f  %20.0f", e.step_intra_bytes, e.step_inter_bytes);
            ZT_CHECKF(strstr(R.out, want) != NULL, "%s: no '%s' in\n%s", cases[c].args, want, R.out);
        }
    }
    /* refused, exit 2 with the reason */
    run("--params 124M --ranks 8 --ranks-per-node 2 --hpz-partition-size 4");
    ZT_CHECKF(R.status == 2 && strstr(R.err, "hpz_partition_size"), "%d %s", R.status, R.err);
    run("--params 124M --ranks 8 --ranks-per-node 4 --hpz-partition-size 4 --stage 2");
    ZT_CHECK(R.status == 2);
    run("--params 124M --ranks 8 --ranks-per-node 4 --hpz-partition-size 4 --mics-shard-size 4");
    ZT_CHECK(R.status == 2);
    run("--deepspeed --params 124M --ranks 8 --ranks-per-node 4 --stage 2");
    ZT_CHECK(R.status == 2 && strstr(R.err, "--ranks-per-node"));
    run("--params 124M --ranks 8 --ranks-per-node 3");
    ZT_CHECK(R.status == 2);
    run("--params 124M --ranks 8 --ranks-per-node 0");
    ZT_CHECK(R.status == 2);
}

/* train_gpt2 --hpz-partition-size: the same losses and params as plain stage 3, and its
   bytes inside and between nodes measured equal the formula's. */
ZT_TEST(gpt2_hpz)
{
    static char plain[65536];
    const char *a, *b;
    char meas[64], form[64];
    if (access("build/train_gpt2", X_OK) != 0) ZT_SKIP("build/train_gpt2 not built");
    run_cmd(GPT2 " --stage 3 --ranks 4 --ranks-per-node 2 --steps 3 --accum 2 --layers 2 --sample 0 "
                 "--val-batches 1 --dtype bf16");
    ZT_CHECKF(R.status == 0, "%s", R.err);
    snprintf(plain, sizeof plain, "%s", R.out);
    run_cmd(GPT2 " --stage 3 --ranks 4 --ranks-per-node 2 --hpz-partition-size 2 --steps 3 --accum 2 "
                 "--layers 2 --sample 0 --val-batches 1 --dtype bf16");
    ZT_CHECKF(R.status == 0, "%s", R.err);
    a = strstr(plain, "params checksum: ");
    b = strstr(R.out, "params checksum: ");
    ZT_CHECKF(a && b && strncmp(a, b, 33) == 0, "plain:\n%s\nhpZ:\n%s", plain, R.out);
    a = strstr(R.out, "inside nodes: ");
    ZT_CHECKF(a && sscanf(a, "inside nodes: %63s B measured, %63s", meas, form) == 2 && !strcmp(meas, form),
              "%s", R.out);
    a = strstr(R.out, "between nodes: ");
    ZT_CHECKF(a && sscanf(a, "between nodes: %63s B measured, %63s", meas, form) == 2 && !strcmp(meas, form),
              "%s", R.out);
    a = strstr(R.out, "model states per rank: ");
    ZT_CHECKF(a && sscanf(a, "model states per rank: %63s B measured on the device, %63s", meas, form) == 2 &&
                  !strcmp(meas, form), "%s", R.out);
}

/* Packed bytes of n elements at bits with blocks of B, by docs/engine.md's layout (4-byte
   scale per block, the codes, rounded up to 4 bytes). */
static double cli_packed(uint64_t n, int bits, uint64_t B)
{
    uint64_t b = 4 * ((n + B - 1) / B) + (bits == 8 ? n : (n + 1) / 2);
    return (double)((b + 3) / 4 * 4);
}

/* --quantized-weights / --quantized-gradients / --quantized-gradient-levels / --quant-block:
   the JSON equals zero_estimate_compute with the same fields to the last bit, the table
   prints the same integers under the mode's name, and full ZeRO++ at GPT-2 124M's size on
   2 nodes x 4 crosses nodes with docs/engine.md's P8(n) (N - R) + P4(n) (N/R - 1). */
ZT_TEST(quantized_traffic)
{
    static const struct {
        const char *args, *mode;
        int hpz, qw, bits, levels, block, first, last;
    } cases[] = {
        {"--params 124M --ranks 8 --ranks-per-node 4 --hpz-partition-size 4 --quantized-weights "
         "--quantized-gradients 4", "hpZ S=4+qwZ+qgZ4", 4, 1, 4, 0, 0, 3, 3},
        {"--params 124M --ranks 8 --ranks-per-node 4 --quantized-gradients 8 --quantized-gradient-levels 1 "
         "--quant-block 64", "qgZ8", 0, 0, 8, 1, 64, 1, 3},
        {"--params 1000003 --ranks 8 --ranks-per-node 2 --quantized-weights", "qwZ", 0, 1, 0, 0, 0, 3, 3},
    };
    int c, s;
    if (!have_tool()) ZT_SKIP(TOOL " not built");
    for (c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        char line[400];
        for (s = cases[c].first; s <= cases[c].last; s++) {
            zero_estimate_desc d;
            zero_estimate e;
            char want[128];
            int k = s - cases[c].first;
            memset(&d, 0, sizeof d);
            d.params = c == 2 ? 1000003 : 124000000;
            d.ranks = 8;
            d.stage = s;
            d.ranks_per_node = c == 2 ? 2 : 4;
            d.hpz_partition_size = cases[c].hpz;
            d.quantized_weights = cases[c].qw;
            d.quantized_gradients = cases[c].bits != 0;
            d.quantized_gradient_bits = cases[c].bits;
            d.quantized_gradient_levels = cases[c].levels;
            d.quant_block_numel = (uint64_t)cases[c].block;
            ZT_CHECKF(zero_estimate_compute(&d, &e) == ZERO_OK, "%s", zero_last_error());
            snprintf(line, sizeof line, "%s --json", cases[c].args);
            run(line);
            ZT_CHECKF(R.status == 0, "%s: exit %d: %s", line, R.status, R.err);
            ZT_CHECKF(json_f64(R.out, "step_bytes", k) == e.step_bytes &&
                          json_f64(R.out, "step_intra_bytes", k) == e.step_intra_bytes &&
                          json_f64(R.out, "step_inter_bytes", k) == e.step_inter_bytes,
                      "%s stage %d", line, s);
            run(cases[c].args);
            ZT_CHECKF(R.status == 0, "%s: exit %d", cases[c].args, R.status);
            snprintf(want, sizeof want, "%5d  %-14s  %20.0f  %20.0f  %20.0f", s, cases[c].mode,
                     e.step_bytes, e.step_intra_bytes, e.step_inter_bytes);
            ZT_CHECKF(strstr(R.out, want) != NULL, "%s: no '%s' in\n%s", cases[c].args, want, R.out);
            if (c == 0) { /* full ZeRO++: 0.572 M between nodes, M = the 16-bit model */
                uint64_t n = 124000000 / 8;
                double want_inter = cli_packed(n, 8, 256) * 4 + cli_packed(n, 4, 256) * 1;
                ZT_CHECKF(e.step_inter_bytes == want_inter, "%.17g against %.17g", e.step_inter_bytes,
                          want_inter);
                ZT_CHECK(fabs(e.step_inter_bytes / (2.0 * 124e6 * 4 / 8) - 0.572) < 0.001);
            }
        }
    }
    run("--params 124M --ranks 8 --quantized-gradients 5");
    ZT_CHECK(R.status == 2 && strstr(R.err, "4 or 8"));
    run("--params 124M --ranks 8 --quantized-gradients 4 --quant-block 3");
    ZT_CHECK(R.status == 2 && strstr(R.err, "--quant-block"));
    run("--params 124M --ranks 8 --quantized-gradient-levels 1");
    ZT_CHECK(R.status == 2 && strstr(R.err, "need --quantized"));
    run("--params 124M --ranks 8 --quantized-weights --stage 2");
    ZT_CHECKF(R.status == 2 && strstr(R.err, "quantized_weights"), "%d %s", R.status, R.err);
    run("--params 124M --ranks 8 --quantized-weights=1");
    ZT_CHECK(R.status == 2 && strstr(R.err, "takes no value"));
    run("--params 124M --ranks 8 --quantized-gradients 4 --mics-shard-size 4");
    ZT_CHECK(R.status == 2);
    run("--deepspeed --params 124M --ranks 8 --quantized-weights --stage 3 --largest-layer 1M");
    ZT_CHECK(R.status == 2);
}

int main(void)
{
    ZT_RUN(table_paper_example);
    ZT_RUN(json_matches_library);
    ZT_RUN(json_deepspeed);
    ZT_RUN(inverse);
    ZT_RUN(sizes_parse_exactly);
    ZT_RUN(bad_arguments_exit_2_with_usage);
    ZT_RUN(help_goes_to_stdout);
    ZT_RUN(offload_tiers);
    ZT_RUN(help_and_unknown_options_everywhere);
    ZT_RUN(gpt2_help_names_every_option);
    ZT_RUN(train_mlp_sizes_that_do_not_fit);
    ZT_RUN(ckpt_info_escapes_names);
    ZT_RUN(gpt2_init_refuses_nan_and_untied_head);
    ZT_RUN(gpt2_resume_validates_the_client_state);
    ZT_RUN(gpt2_save_and_resume_print_what_they_did);
    ZT_RUN(cli_errors_name_flags_once);
    ZT_RUN(gpt2_labels_say_what_they_count);
    ZT_RUN(gpt2_activation_estimate_is_what_it_allocates);
    ZT_RUN(gpt2_sizes_and_data_that_do_not_fit);
    ZT_RUN(topology_traffic);
    ZT_RUN(quantized_traffic);
    ZT_RUN(gpt2_hpz);
    return zt_summary();
}
