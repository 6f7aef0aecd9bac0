/* zero-estimate: model-state bytes per rank for ZeRO stages 0-3, and the largest model that
   fits, from the command line. Uses only zero.h's public estimator API.

     zero-estimate --params 7.5e9 --ranks 64
     zero-estimate --params 7.5B --ranks 64 --stage 2 --offload --json
     zero-estimate --deepspeed --params 2851M --largest-layer 32M --ranks 8 --gpus-per-node 8
     zero-estimate --max-params --memory 32GB --ranks 1024 --stage 3
     zero-estimate --params 7.5B --ranks 8 --stage 3 --offload-optimizer nvme --offload-param cpu
     zero-estimate --params 124M --ranks 8 --ranks-per-node 4 --hpz-partition-size 4

   docs/estimator.md documents the formulas, every option and every JSON key. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define USAGE                                                                                \
    "usage: zero-estimate --params N --ranks N [--stage S] [--offload] [--deepspeed] "      \
    "[--max-params --memory BYTES] [--ranks-per-node R [--mics-shard-size S | "             \
    "--hpz-partition-size S] [--accum-steps A] [--quantized-weights] "                \
    "[--quantized-gradients 4|8 [--quantized-gradient-levels L]] [--quant-block B]] "     \
    "[--json] [--help]"

static const char *help_text =
    USAGE "\n"
    "\n"
    "Model-state memory (parameters, gradients, optimizer state) per data-parallel rank for\n"
    "ZeRO stages 0-3, or the largest model whose model states fit a given memory.\n"
    "\n"
    "  --params N           model parameters (Psi)\n"
    "  --frozen N           of which N are frozen (fine-tuning, ZERO_TENSOR_FROZEN): params\n"
    "                       only, no gradients or optimizer state (paper mode)\n"
    "  --ranks N            data-parallel ranks (GPUs), N >= 1\n"
    "  --stage S            one stage only (0-3; DeepSpeed mode: 2 or 3); default: all\n"
    "  --offload            optimizer state and step on the host (ZeRO-Offload)\n"
    "  --offload-optimizer cpu|nvme\n"
    "                       where the optimizer state lives: host memory (= --offload) or\n"
    "                       NVMe (ZeRO-Infinity); adds host and nvme columns\n"
    "  --offload-param cpu|nvme\n"
    "                       stage 3, with --offload-optimizer: the param shards off the device\n"
    "  --offload-ratio R    with --offload(-optimizer): the fraction R in (0, 1] of the\n"
    "                       optimizer state offloaded (offload_optimizer_ratio); the rest\n"
    "                       stays on the device (default 1)\n"
    "  --delayed-update     with --offload-optimizer cpu: the engine's delayed_update (DPU)\n"
    "                       adds (grad + param bytes) x ceil(Psi / N) to the host column\n"
    "  --param-bytes B      bytes per parameter (default 2: fp16/bf16)\n"
    "  --grad-bytes B       bytes per gradient (default 2)\n"
    "  --optimizer-bytes K  bytes of optimizer state per parameter (default 12: Adam's fp32\n"
    "                       master, m and v)\n"
    "  --optimizer-dtype f32|bf16\n"
    "                       the engine's optimizer_dtype: bf16 master, m and v = K 6\n"
    "  --deepspeed          DeepSpeed's estimate_zero2/zero3_model_states_mem_needs formulas\n"
    "                       (per GPU and per node CPU; all offload combinations unless\n"
    "                       filtered by --stage, --offload, --offload-params)\n"
    "  --gpus-per-node G    DeepSpeed mode: GPUs per node (default 1); must divide --ranks\n"
    "  --largest-layer N    DeepSpeed mode: parameters of the largest layer (stage 3)\n"
    "  --offload-params     DeepSpeed mode: only rows with parameters offloaded too\n"
    "  --buffer-factor F    DeepSpeed mode: additional_buffer_factor (default 1.5)\n"
    ;
/* the second half (ISO C caps a string literal at 4095 characters) */
static const char *help_text2 =
    "  --ranks-per-node R   ranks [k R, (k+1) R) share a node (default: one node); adds the\n"
    "                       bytes per rank per step, total, inside and between nodes, as the\n"
    "                       engine's zero_traffic counts them (payload: no control values)\n"
    "  --mics-shard-size S  MiCS (stages 1-3): states partitioned in groups of S ranks,\n"
    "                       replicated across the N / S groups (memory: N replaced by S)\n"
    "  --hpz-partition-size S\n"
    "                       ZeRO++ hpZ (stage 3): a secondary param partition over the S ranks\n"
    "                       of a node (S divides R): + params / S bytes per rank, and all but\n"
    "                       one all-gather per step inside the node\n"
    "  --accum-steps A      micro-steps per step for the traffic (default 1)\n"
    "  --quantized-weights  ZeRO++ qwZ (stage 3): the forward all-gather as int8 blocks\n"
    "  --quantized-gradients 4|8\n"
    "                       ZeRO++ qgZ (stages 1-3): the reduce-scatter as int4 / int8 blocks\n"
    "  --quantized-gradient-levels 0|1|2\n"
    "                       qgZ's scheme: 2 = two-level (inside the node, then across), 1 =\n"
    "                       flat; 0 (default) = 2 when 1 < R < N\n"
    "  --quant-block B      elements per quantization block (even; default 256). The\n"
    "                       quantized bytes are those of one group of ceil(Psi / N) per rank\n"
    "                       (docs/estimator.md: a model of G groups moves up to 8 (G - 1) bytes\n"
    "                       more per quantized transfer to each peer)\n"
    "  --max-params         answer the inverse: the largest Psi that fits --memory\n"
    "  --memory BYTES       device memory per rank for --max-params\n"
    "  --json               the same data as JSON (keys: docs/estimator.md)\n"
    "  --gib                print sizes in binary units (GiB = 2^30) instead of GB = 10^9\n"
    "                       (--deepspeed prints 2^30 bytes as GB, as DeepSpeed does)\n"
    "  --help               this text\n"
    "\n"
    "Numbers are exact: 7500000000, 7.5e9, 7.5B, 350M, 32K, 1.5T (K M B/G T P: powers of\n"
    "1000). Memory: 32GB, 32G (10^9), 32GiB (2^30), KB MB TB PB EB, KiB MiB TiB PiB EiB, or bytes.\n";

/* ---- strict, exact number parsing ---- */

typedef struct unit {
    const char *name;
    int pow10; /* value = x * 10^pow10 * 2^pow2 */
    int pow2;
} unit;

static const unit count_units[] = {{"", 0, 0},  {"K", 3, 0},  {"k", 3, 0},  {"M", 6, 0},
                                   {"B", 9, 0}, {"G", 9, 0},  {"T", 12, 0}, {"P", 15, 0},
                                   {NULL, 0, 0}};
static const unit byte_units[] = {{"", 0, 0},    {"K", 3, 0},   {"k", 3, 0},    {"M", 6, 0},
                                  {"G", 9, 0},   {"T", 12, 0},  {"P", 15, 0},   {"KB", 3, 0},
                                  {"kB", 3, 0},  {"MB", 6, 0},  {"GB", 9, 0},   {"TB", 12, 0},
                                  {"PB", 15, 0}, {"EB", 18, 0},  {"KiB", 0, 10}, {"MiB", 0, 20},
                                  {"GiB", 0, 30}, {"TiB", 0, 40}, {"PiB", 0, 50}, {"EiB", 0, 60},
                                  {NULL, 0, 0}};

/* Parses digits[.digits][e[+-]digits] followed by one of the units, exactly: the value must
   be a whole number that fits 64 bits. 0 on success, else a reason in *why. */
static int parse_scaled(const char *s, const unit *units, uint64_t *out, const char **why)
{
    uint64_t d = 0;  /* significant digits, trailing zeros held back in 'zeros' */
    long e10 = 0;    /* value = d * 10^e10 (before the unit)  */
    long zeros = 0;  /* zero digits seen after the last nonzero digit */
    int digits = 0, frac = 0, pow2;
    const unit *u;
    const char *p = s;
    if (!s || !*s) return *why = "empty", -1;
    for (; *p; p++) {
        if (*p == '.' && !frac) {
            frac = 1;
            continue;
        }
        if (*p < '0' || *p > '9') break;
        digits++;
        if (frac) e10--;
        if (*p == '0') {
            zeros++;
            continue;
        }
        while (zeros > 0) { /* the zeros held back were significant after all */
            if (d > UINT64_MAX / 10) return *why = "too large or too many digits", -1;
            d *= 10;
            zeros--;
        }
        if (d > (UINT64_MAX - (uint64_t)(*p - '0')) / 10) return *why = "too large or too many digits", -1;
        d = d * 10 + (uint64_t)(*p - '0');
    }
    if (digits == 0) return *why = "not a number", -1;
    e10 += zeros;
    for (u = units; u->name; u++) /* a unit that starts with E (EB, EiB) is not an exponent */
        if (strcmp(p, u->name) == 0) break;
    if ((*p == 'e' || *p == 'E') && !u->name) {
        int neg = 0;
        long x = 0;
        p++;
        if (*p == '+' || *p == '-') neg = *p++ == '-';
        if (*p < '0' || *p > '9') return *why = "bad exponent", -1;
        for (; *p >= '0' && *p <= '9'; p++)
            if ((x = x * 10 + (*p - '0')) > 100000) return *why = "exponent out of range", -1;
        e10 += neg ? -x : x;
    }
    for (u = units; u->name; u++)
        if (strcmp(p, u->name) == 0) break;
    if (!u->name) return *why = "unknown suffix", -1;
    e10 += u->pow10;
    pow2 = u->pow2;
    if (d == 0) return *out = 0, 0;
    /* a negative power of ten must be paid by factors of d: 5s from d, 2s from d or 2^pow2 */
    while (e10 < 0) {
        if (d % 5 != 0) return *why = "not a whole number", -1;
        d /= 5;
        if (pow2 > 0) pow2--;
        else if (d % 2 == 0) d /= 2;
        else return *why = "not a whole number", -1;
        e10++;
    }
    for (; e10 > 0; e10--) {
        if (d > UINT64_MAX / 10) return *why = "too large", -1;
        d *= 10;
    }
    for (; pow2 > 0; pow2--) {
        if (d > UINT64_MAX / 2) return *why = "too large", -1;
        d *= 2;
    }
    *out = d;
    return 0;
}

/* ---- output helpers ---- */

static void commas(uint64_t v, char *buf, size_t size)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v), i, j = 0;
    for (i = 0; i < n && (size_t)j + 2 < size; i++) {
        if (i > 0 && (n - i) % 3 == 0) buf[j++] = ',';
        buf[j++] = tmp[i];
    }
    buf[j] = '\0';
}

typedef struct scale {
    double div;
    const char *name;
} scale;

/* The unit for a table whose largest value is 'max': powers of 1000, or of 1024 ('binary'),
   named KiB, MiB, GiB or, as DeepSpeed names them ('binary' 2), KB, MB, GB. */
static scale pick_scale(uint64_t max, int binary)
{
    static const char *dec[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
    static const char *bin[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    double base = binary ? 1024.0 : 1000.0, div = 1.0;
    int i = 0;
    scale s;
    while (i < 6 && (double)max >= div * base) {
        div *= base;
        i++;
    }
    s.div = div;
    s.name = binary == 1 ? bin[i] : dec[i];
    return s;
}

static void human(uint64_t v, scale s, char *buf, size_t size)
{
    if (s.div == 1.0) snprintf(buf, size, "%llu %s", (unsigned long long)v, s.name);
    else snprintf(buf, size, "%.2f %s", (double)v / s.div, s.name);
}

/* A count as 7.50 B, 350.00 M, ... */
static void human_count(uint64_t v, char *buf, size_t size)
{
    static const char *names[] = {"", "K", "M", "B", "T", "P"};
    double div = 1.0;
    int i = 0;
    while (i < 5 && (double)v >= div * 1000.0) {
        div *= 1000.0;
        i++;
    }
    if (i == 0) snprintf(buf, size, "%llu", (unsigned long long)v);
    else snprintf(buf, size, "%.2f %s", (double)v / div, names[i]);
}

static const char *partitions[4] = {"none", "P_os", "P_os+g", "P_os+g+p"};

/* ---- the rows to print ---- */

typedef struct row {
    zero_estimate_desc desc;
    zero_estimate est;   /* forward */
    uint64_t max_params; /* inverse */
} row;

typedef struct options {
    zero_estimate_desc base;
    int have_params, have_ranks, stage, json, gib, max_params, have_memory, deepspeed;
    int offload, offload_params, topo; /* topo: a traffic flag was given */
    uint64_t memory;
    zero_offload_device oopt, oparam; /* paper mode tiers (--offload-optimizer, --offload-param) */
} options;

static int bad(const char *fmt, const char *a, const char *b)
{
    fprintf(stderr, "zero-estimate: ");
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n%s\n", USAGE);
    return 2;
}

/* Builds the rows: the stages (paper) or the offload combinations (DeepSpeed). */
static int make_rows(const options *o, row *rows, int *count)
{
    int n = 0, s;
    for (s = 0; s < 4; s++) {
        if (o->stage >= 0 && s != o->stage) continue;
        if (o->stage < 0 && o->base.mics_shard_size > 0 && s == 0) continue; /* MiCS: 1-3 */
        if (o->stage < 0 && o->base.quantized_gradients && s == 0) continue;  /* qgZ: 1-3  */
        if (!o->deepspeed) {
            row *r = &rows[n++];
            memset(r, 0, sizeof *r);
            r->desc = o->base;
            r->desc.stage = s;
            r->desc.offload = o->offload;
            r->desc.offload_optimizer = o->oopt;
            r->desc.offload_param = s == 3 ? o->oparam : ZERO_OFFLOAD_NONE;
        } else if (s == 2) {
            int off;
            for (off = 1; off >= 0; off--) {
                row *r;
                if (o->offload && !off) continue;
                if (o->offload_params) continue;
                r = &rows[n++];
                memset(r, 0, sizeof *r);
                r->desc = o->base;
                r->desc.stage = 2;
                r->desc.offload = off;
            }
        } else if (s == 3 && o->base.largest_layer_params > 0) {
            /* DeepSpeed's order: (cpu, cpu), (cpu, none), (none, none), zero.Init on, off */
            static const int combos[3][2] = {{1, 1}, {1, 0}, {0, 0}};
            int c, z;
            for (c = 0; c < 3; c++)
                for (z = 0; z < 2; z++) {
                    row *r;
                    if (o->offload && !combos[c][0]) continue;
                    if (o->offload_params && !combos[c][1]) continue;
                    r = &rows[n++];
                    memset(r, 0, sizeof *r);
                    r->desc = o->base;
                    r->desc.stage = 3;
                    r->desc.offload = combos[c][0];
                    r->desc.offload_params = combos[c][1];
                    r->desc.no_zero_init = z;
                }
        }
    }
    *count = n;
    return 0;
}

static void print_json_header(const options *o, const zero_estimate_desc *d)
{
    printf("{\n  \"tool\": \"zero-estimate\",\n  \"mode\": \"%s\",\n  \"query\": \"%s\",\n",
           o->deepspeed ? "deepspeed" : "paper", o->max_params ? "max_params" : "bytes");
    if (o->max_params) printf("  \"memory_bytes\": %llu,\n", (unsigned long long)o->memory);
    else printf("  \"params\": %llu,\n", (unsigned long long)d->params);
    printf("  \"ranks\": %d,\n", d->ranks);
    if (!o->deepspeed) {
        printf("  \"param_bytes\": %d,\n  \"grad_bytes\": %d,\n  \"optimizer_bytes\": %d,\n",
               d->param_bytes ? d->param_bytes : 2, d->grad_bytes ? d->grad_bytes : 2,
               d->optimizer_bytes                       ? d->optimizer_bytes
               : d->optimizer_dtype == ZERO_BF16 ? 6
                                                 : 12);
        printf("  \"offload\": %s,\n", o->offload ? "true" : "false");
        printf("  \"frozen\": %llu,\n", (unsigned long long)d->frozen);
    } else {
        int gpn = d->gpus_per_node ? d->gpus_per_node : 1;
        printf("  \"gpus_per_node\": %d,\n  \"nodes\": %d,\n", gpn, d->ranks / gpn);
        printf("  \"largest_layer_params\": %llu,\n", (unsigned long long)d->largest_layer_params);
        printf("  \"additional_buffer_factor\": %.17g,\n",
               d->additional_buffer_factor > 0 ? d->additional_buffer_factor : 1.5);
    }
}

/* The bytes per rank per step (zero_estimate.step_*), inside and between nodes. */
static void print_traffic(const options *o, const row *rows, int nrows)
{
    const zero_estimate_desc *b = &o->base;
    int i, R = b->ranks_per_node ? b->ranks_per_node : b->ranks;
    printf("\ntraffic per rank per step (bytes, exact; N = %d, %d per node, %d micro-step%s; as the "
           "engine's zero_traffic counts the payload):\n",
           b->ranks, R, b->accum_steps ? b->accum_steps : 1, b->accum_steps > 1 ? "s" : "");
    printf("stage  %-14s  %20s  %20s  %20s\n", "mode", "total", "inside nodes", "between nodes");
    for (i = 0; i < nrows; i++) {
        const row *r = &rows[i];
        char m[32] = "flat";
        if (r->desc.mics_shard_size > 1 && r->desc.mics_shard_size < b->ranks)
            snprintf(m, sizeof m, "MiCS S=%d", r->desc.mics_shard_size);
        else if (r->desc.hpz_partition_size > 1 && r->desc.hpz_partition_size < b->ranks)
            snprintf(m, sizeof m, "hpZ S=%d", r->desc.hpz_partition_size);
        if (b->quantized_weights || b->quantized_gradients) {
            size_t l = strlen(m);
            if (!strcmp(m, "flat")) l = 0;
            snprintf(m + l, sizeof m - l, "%s%s%s", l ? "+" : "", b->quantized_weights ? "qwZ" : "",
                     !b->quantized_gradients ? ""
                     : b->quantized_gradient_bits == 8 ? (b->quantized_weights ? "+qgZ8" : "qgZ8")
                                                       : (b->quantized_weights ? "+qgZ4" : "qgZ4"));
        }
        printf("%5d  %-14s  %20.0f  %20.0f  %20.0f\n", r->desc.stage, m, r->est.step_bytes,
               r->est.step_intra_bytes, r->est.step_inter_bytes);
    }
}

int main(int argc, char **argv)
{
    options o;
    row rows[16];
    int nrows = 0, i;
    uint64_t baseline = 0;
    memset(&o, 0, sizeof o);
    o.stage = -1;

    for (i = 1; i < argc; i++) {
        const char *arg = argv[i], *val = NULL, *why = NULL;
        char name[64];
        const char *eq = strchr(arg, '=');
        uint64_t u;
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        if (len >= sizeof name) return bad("unknown option '%s'%s", arg, "");
        memcpy(name, arg, len);
        name[len] = '\0';
        if (eq) val = eq + 1;
#define FLAG(n) (strcmp(name, n) == 0 && !eq)
#define TAKES(n) (strcmp(name, n) == 0 && (val || (i + 1 < argc && (val = argv[++i]) != NULL)))
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            fputs(help_text, stdout);
            fputs(help_text2, stdout);
            return 0;
        } else if (FLAG("--offload")) {
            o.offload = 1;
        } else if (FLAG("--delayed-update")) {
            o.base.delayed_update = 1;
        } else if (FLAG("--quantized-weights")) {
            o.base.quantized_weights = 1;
            o.topo = 1;
        } else if (FLAG("--offload-params")) {
            o.offload_params = 1;
        } else if (FLAG("--deepspeed")) {
            o.deepspeed = 1;
        } else if (FLAG("--json")) {
            o.json = 1;
        } else if (FLAG("--gib")) {
            o.gib = 1;
        } else if (FLAG("--max-params")) {
            o.max_params = 1;
        } else if (TAKES("--offload-optimizer") || TAKES("--offload-param")) {
            zero_offload_device t = !strcmp(val, "cpu") ? ZERO_OFFLOAD_CPU
                                    : !strcmp(val, "nvme") ? ZERO_OFFLOAD_NVME : ZERO_OFFLOAD_NONE;
            if (t == ZERO_OFFLOAD_NONE) return bad("%s '%s': want cpu or nvme", name, val);
            if (name[10] == 'o') o.oopt = t;
            else o.oparam = t;
        } else if (TAKES("--optimizer-dtype")) {
            if (!strcmp(val, "bf16")) o.base.optimizer_dtype = ZERO_BF16;
            else if (!strcmp(val, "f32") || !strcmp(val, "fp32")) o.base.optimizer_dtype = ZERO_F32;
            else return bad("--optimizer-dtype '%s': want f32 or bf16%s", val, "");
        } else if (TAKES("--params")) {
            if (parse_scaled(val, count_units, &u, &why) || u == 0)
                return bad("--params '%s': %s", val, why ? why : "must be at least 1");
            o.base.params = u;
            o.have_params = 1;
        } else if (TAKES("--frozen")) {
            if (parse_scaled(val, count_units, &u, &why))
                return bad("--frozen '%s': %s", val, why);
            o.base.frozen = u;
        } else if (TAKES("--largest-layer")) {
            if (parse_scaled(val, count_units, &u, &why) || u == 0)
                return bad("--largest-layer '%s': %s", val, why ? why : "must be at least 1");
            o.base.largest_layer_params = u;
        } else if (TAKES("--memory")) {
            if (parse_scaled(val, byte_units, &u, &why)) return bad("--memory '%s': %s", val, why);
            o.memory = u;
            o.have_memory = 1;
        } else if (TAKES("--ranks") || TAKES("--stage") || TAKES("--gpus-per-node") ||
                   TAKES("--param-bytes") || TAKES("--grad-bytes") || TAKES("--optimizer-bytes") ||
                   TAKES("--ranks-per-node") || TAKES("--mics-shard-size") ||
                   TAKES("--hpz-partition-size") || TAKES("--accum-steps")) {
            if (parse_scaled(val, count_units, &u, &why) || u > INT_MAX)
                return bad("%s: '%s' is not a valid count", name, val);
            if (strcmp(name, "--ranks-per-node") == 0 || strcmp(name, "--mics-shard-size") == 0 ||
                strcmp(name, "--hpz-partition-size") == 0 || strcmp(name, "--accum-steps") == 0) {
                if (u == 0) return bad("%s '%s': must be at least 1", name, val);
                o.topo = 1;
                if (name[2] == 'r') o.base.ranks_per_node = (int)u;
                else if (name[2] == 'm') o.base.mics_shard_size = (int)u;
                else if (name[2] == 'h') o.base.hpz_partition_size = (int)u;
                else o.base.accum_steps = (int)u;
            } else if (strcmp(name, "--ranks") == 0) {
                if (u == 0) return bad("--ranks '%s': must be at least 1%s", val, "");
                o.base.ranks = (int)u;
                o.have_ranks = 1;
            } else if (strcmp(name, "--stage") == 0) {
                if (u > 3) return bad("--stage '%s': must be 0, 1, 2 or 3%s", val, "");
                o.stage = (int)u;
            } else if (strcmp(name, "--gpus-per-node") == 0) {
                if (u == 0) return bad("--gpus-per-node '%s': must be at least 1%s", val, "");
                o.base.gpus_per_node = (int)u;
            } else {
                if (u == 0 || u > 1024) return bad("%s '%s': must be 1..1024", name, val);
                if (strcmp(name, "--param-bytes") == 0) o.base.param_bytes = (int)u;
                else if (strcmp(name, "--grad-bytes") == 0) o.base.grad_bytes = (int)u;
                else o.base.optimizer_bytes = (int)u;
            }
        } else if (TAKES("--quantized-gradients") || TAKES("--quantized-gradient-levels") ||
                   TAKES("--quant-block")) {
            if (parse_scaled(val, count_units, &u, &why) || u > ZERO_QUANT_BLOCK_MAX)
                return bad("%s: '%s' is not a valid count", name, val);
            o.topo = 1;
            if (strcmp(name, "--quantized-gradients") == 0) {
                if (u != 4 && u != 8) return bad("--quantized-gradients '%s': want 4 or 8%s", val, "");
                o.base.quantized_gradients = 1;
                o.base.quantized_gradient_bits = (int)u;
            } else if (strcmp(name, "--quantized-gradient-levels") == 0) {
                if (u > 2) return bad("--quantized-gradient-levels '%s': want 0, 1 or 2%s", val, "");
                o.base.quantized_gradient_levels = (int)u;
            } else {
                if (u < 2 || (u & 1u)) return bad("--quant-block '%s': want an even count >= 2%s", val, "");
                o.base.quant_block_numel = u;
            }
        } else if (TAKES("--offload-ratio")) {
            char *end = NULL;
            double f = strtod(val, &end);
            if (!*val || *end || !(f > 0.0) || f > 1.0)
                return bad("--offload-ratio '%s': %s", val, "want a number in (0, 1]");
            o.base.offload_optimizer_ratio = f;
        } else if (TAKES("--buffer-factor")) {
            char *end = NULL;
            double f = strtod(val, &end);
            if (!*val || *end || !(f > 0.0) || f > 1e300)
                return bad("--buffer-factor '%s': %s", val, "want a finite number > 0");
            o.base.additional_buffer_factor = f;
        } else if (strncmp(arg, "--", 2) == 0 &&
                   (strcmp(name, "--params") == 0 || strcmp(name, "--ranks") == 0 ||
                    strcmp(name, "--frozen") == 0 ||
                    strcmp(name, "--stage") == 0 || strcmp(name, "--memory") == 0 ||
                    strcmp(name, "--gpus-per-node") == 0 || strcmp(name, "--largest-layer") == 0 ||
                    strcmp(name, "--buffer-factor") == 0 || strcmp(name, "--offload-ratio") == 0 || strcmp(name, "--param-bytes") == 0 ||
                    strcmp(name, "--grad-bytes") == 0 || strcmp(name, "--optimizer-bytes") == 0 ||
                    strcmp(name, "--optimizer-dtype") == 0 || strcmp(name, "--ranks-per-node") == 0 ||
                    strcmp(name, "--mics-shard-size") == 0 ||
                    strcmp(name, "--hpz-partition-size") == 0 || strcmp(name, "--accum-steps") == 0 ||
                    strcmp(name, "--quantized-gradients") == 0 ||
                    strcmp(name, "--quantized-gradient-levels") == 0 || strcmp(name, "--quant-block") == 0)) {
            return bad("%s needs a value%s", name, "");
        } else if (eq && (strcmp(name, "--offload") == 0 || strcmp(name, "--json") == 0 ||
                          strcmp(name, "--deepspeed") == 0 || strcmp(name, "--max-params") == 0 ||
                          strcmp(name, "--gib") == 0 || strcmp(name, "--offload-params") == 0 ||
                          strcmp(name, "--delayed-update") == 0 ||
                          strcmp(name, "--quantized-weights") == 0)) {
            return bad("%s takes no value%s", name, "");
        } else {
            return bad("unknown argument '%s'%s", arg, "");
        }
#undef FLAG
#undef TAKES
    }

    if (!o.have_ranks) return bad("--ranks is required%s%s", "", "");
    if (o.max_params) {
        if (!o.have_memory) return bad("--max-params needs --memory%s%s", "", "");
        if (o.have_params) return bad("--params and --max-params exclude each other%s%s", "", "");
    } else {
        if (o.have_memory) return bad("--memory is only for --max-params%s%s", "", "");
        if (!o.have_params) return bad("--params is required%s%s", "", "");
    }
    if (o.deepspeed && o.base.frozen)
        return bad("--frozen is paper mode only (DeepSpeed's estimators have none)%s%s", "", "");
    if (!o.max_params && o.base.frozen > o.base.params)
        return bad("--frozen exceeds --params%s%s", "", "");
    if (o.deepspeed) {
        o.base.mode = ZERO_ESTIMATE_DEEPSPEED;
        if (o.stage >= 0 && o.stage < 2)
            return bad("--deepspeed covers stages 2 and 3 (DeepSpeed's estimators)%s%s", "", "");
        if (o.stage == 3 && !o.base.largest_layer_params)
            return bad("--deepspeed --stage 3 needs --largest-layer%s%s", "", "");
        if (o.offload_params && !o.base.largest_layer_params)
            return bad("--offload-params needs --largest-layer (stage 3)%s%s", "", "");
        if (o.offload_params && o.stage == 2)
            return bad("--offload-params is stage 3 only%s%s", "", "");
    } else {
        if (o.base.gpus_per_node || o.base.largest_layer_params || o.offload_params ||
            o.base.additional_buffer_factor > 0)
            return bad("--gpus-per-node, --largest-layer, --offload-params and --buffer-factor "
                       "need --deepspeed%s%s", "", "");
    }
    if (o.deepspeed && (o.oopt || o.oparam))
        return bad("--offload-optimizer and --offload-param are paper mode only (DeepSpeed mode: "
                   "--offload, --offload-params)%s%s", "", "");
    if (o.oparam && !o.oopt && !o.offload)
        return bad("--offload-param needs --offload-optimizer (or --offload)%s%s", "", "");
    if (o.oparam && o.stage >= 0 && o.stage != 3)
        return bad("--offload-param is stage 3 only%s%s", "", "");
    if (o.oparam && o.stage < 0) o.stage = 3; /* the only stage it applies to */
    if (o.oopt) o.offload = 1;
    if (o.base.offload_optimizer_ratio > 0.0 && (o.deepspeed || !o.offload))
        return bad("--offload-ratio needs --offload or --offload-optimizer (paper mode)%s%s", "", "");
    if (o.deepspeed && (o.base.param_bytes || o.base.grad_bytes || o.base.optimizer_bytes))
        return bad("--param-bytes, --grad-bytes and --optimizer-bytes are paper mode only%s%s", "", "");
    if (o.topo && (o.deepspeed || o.max_params))
        return bad("--ranks-per-node, --mics-shard-size, --hpz-partition-size, --accum-steps and "
                   "the quantized options are for the paper mode's bytes (not --deepspeed, not "
                   "--max-params)%s%s", "", "");
    if ((o.base.quantized_gradient_levels || o.base.quant_block_numel) &&
        !o.base.quantized_gradients && !o.base.quantized_weights)
        return bad("--quantized-gradient-levels and --quant-block need --quantized-weights or "
                   "--quantized-gradients%s%s", "", "");
    if (o.base.quantized_weights && o.stage < 0) o.stage = 3; /* qwZ: stage 3 only */
    if (o.base.hpz_partition_size > 1 && o.base.hpz_partition_size < o.base.ranks && o.stage < 0)
        o.stage = 3; /* the only stage hpZ applies to */

    make_rows(&o, rows, &nrows);
    for (i = 0; i < nrows; i++) {
        zero_result res = o.max_params
                              ? zero_estimate_max_params(&rows[i].desc, o.memory, &rows[i].max_params)
                              : zero_estimate_compute(&rows[i].desc, &rows[i].est);
        if (res == ZERO_OK && o.max_params && rows[i].max_params > 0) {
            zero_estimate_desc d = rows[i].desc; /* the bytes at the answer, to show it fits */
            d.params = rows[i].max_params;
            res = zero_estimate_compute(&d, &rows[i].est);
        }
        if (res != ZERO_OK) return bad("%s%s", zero_last_error(), "");
    }
    if (!o.deepspeed && !o.max_params) { /* the saving is against plain data parallelism */
        zero_estimate_desc d = o.base;
        zero_estimate e;
        d.stage = 0;
        d.offload = 0;
        d.offload_optimizer_ratio = 0.0;
        d.mics_shard_size = d.hpz_partition_size = 0; /* plain data parallelism */
        d.delayed_update = 0;
        d.quantized_weights = d.quantized_gradients = 0; /* and exact collectives */
        if (zero_estimate_compute(&d, &e) != ZERO_OK) return bad("%s%s", zero_last_error(), "");
        baseline = e.device_bytes;
    }

    if (o.json) {
        print_json_header(&o, &o.base);
        printf("  \"rows\": [");
        for (i = 0; i < nrows; i++) {
            const row *r = &rows[i];
            const zero_estimate *e = &r->est;
            printf("%s\n    {\"stage\": %d", i ? "," : "", r->desc.stage);
            if (o.deepspeed)
                printf(", \"offload_optimizer\": %s, \"offload_params\": %s, \"zero_init\": %s",
                       r->desc.offload ? "true" : "false", r->desc.offload_params ? "true" : "false",
                       r->desc.stage == 3 ? (r->desc.no_zero_init ? "false" : "true") : "null");
            else
                printf(", \"partitions\": \"%s\", \"offload\": %s", partitions[r->desc.stage],
                       r->desc.offload ? "true" : "false");
            if (!o.deepspeed && (o.oopt || o.oparam))
                printf(", \"offload_optimizer\": \"%s\", \"offload_param\": \"%s\", \"nvme_bytes\": %llu",
                       zero_offload_device_name(r->desc.offload_optimizer ? r->desc.offload_optimizer
                                                                          : ZERO_OFFLOAD_CPU),
                       zero_offload_device_name(r->desc.offload_param), (unsigned long long)e->nvme_bytes);
            if (o.max_params) printf(", \"max_params\": %llu", (unsigned long long)r->max_params);
            if (!o.deepspeed)
                printf(", \"params_bytes\": %llu, \"grads_bytes\": %llu, \"optimizer_bytes\": %llu",
                       (unsigned long long)e->params_bytes, (unsigned long long)e->grads_bytes,
                       (unsigned long long)e->optimizer_bytes);
            printf(", \"device_bytes\": %llu, \"host_bytes\": %llu",
                   (unsigned long long)e->device_bytes, (unsigned long long)e->host_bytes);
            if (o.deepspeed) printf(", \"gather_bytes\": %llu", (unsigned long long)e->gather_bytes);
            if (!o.deepspeed && !o.max_params)
                printf(", \"saving\": %.6f", e->device_bytes ? (double)baseline / (double)e->device_bytes : 0.0);
            if (o.topo)
                printf(", \"step_bytes\": %.17g, \"step_intra_bytes\": %.17g, \"step_inter_bytes\": %.17g",
                       e->step_bytes, e->step_intra_bytes, e->step_inter_bytes);
            printf("}");
        }
        printf("\n  ]\n}\n");
        return 0;
    }

    /* ---- the table ---- */
    {
        char a[48], b[48], c[48], d[48], f[64];
        int gpn = o.base.gpus_per_node ? o.base.gpus_per_node : 1;
        /* the forward paper table shares one unit (picked by the stage-0 total) so that its
           columns compare at a glance; the others scale each cell */
        scale sc = pick_scale(baseline, o.gib);
        if (o.deepspeed)
            printf("DeepSpeed's estimators (estimate_zero2/zero3_model_states_mem_needs, as after "
                   "DeepSpeed PR #5099)\n");
        else
            printf("ZeRO model states per rank (Rajbhandari et al., arXiv 1910.02054)%s%s%s\n",
                   o.offload ? (o.oopt == ZERO_OFFLOAD_NVME
                                    ? ", optimizer state on NVMe (ZeRO-Infinity)"
                                    : ", optimizer offloaded to the host (ZeRO-Offload)")
                             : "",
                   o.oparam ? ", stage-3 params on " : "",
                   o.oparam ? (o.oparam == ZERO_OFFLOAD_NVME ? "NVMe" : "the host") : "");
        if (!o.deepspeed && o.base.offload_optimizer_ratio > 0.0)
            printf("offload_optimizer_ratio = %g: that fraction of each rank's optimizer state "
                   "offloaded, the rest on the device\n", o.base.offload_optimizer_ratio);
        if (o.max_params) {
            commas(o.memory, a, sizeof a);
            human(o.memory, pick_scale(o.memory, o.gib), b, sizeof b);
            printf("largest model whose model states fit %s (%s bytes) per rank, N = %d ranks\n", b, a,
                   o.base.ranks);
        } else {
            commas(o.base.params, a, sizeof a);
            human_count(o.base.params, b, sizeof b);
            printf("Psi = %s parameters (%s), N = %d ranks\n", a, b, o.base.ranks);
        }
        if (o.deepspeed) {
            char l[48] = "-";
            if (o.base.largest_layer_params) commas(o.base.largest_layer_params, l, sizeof l);
            printf("%d node%s x %d GPU%s, largest layer %s params, additional_buffer_factor %g\n",
                   o.base.ranks / gpn, o.base.ranks / gpn > 1 ? "s" : "", gpn, gpn > 1 ? "s" : "", l,
                   o.base.additional_buffer_factor > 0 ? o.base.additional_buffer_factor : 1.5);
        } else {
            printf("bytes per parameter: %d (params) + %d (grads) + K = %d (optimizer state)\n",
                   o.base.param_bytes ? o.base.param_bytes : 2, o.base.grad_bytes ? o.base.grad_bytes : 2,
                   o.base.optimizer_bytes ? o.base.optimizer_bytes : 12);
            if (o.base.frozen) {
                commas(o.base.frozen, a, sizeof a);
                printf("frozen: %s of them (params only: no gradients, no optimizer state)\n", a);
            }
        }
        printf("\n");
        if (o.deepspeed) {
            printf("stage  offload_optimizer  offload_param  zero_init  %s%12s  %15s\n",
                   o.max_params ? "        max params" : "", "per GPU", "per CPU (node)");
            for (i = 0; i < nrows; i++) {
                const row *r = &rows[i];
                /* DeepSpeed's units: 2^30 bytes called GB (--gib: called GiB) */
                human(r->est.device_bytes, pick_scale(r->est.device_bytes, o.gib ? 1 : 2), a, sizeof a);
                human(r->est.host_bytes, pick_scale(r->est.host_bytes, o.gib ? 1 : 2), b, sizeof b);
                human_count(r->max_params, c + 3, sizeof c - 3);
                memcpy(c, ">= ", 3); /* 2^53 is the estimator's cap: every size fits */
                printf("%5d  %-17s  %-13s  %-9s  ", r->desc.stage, r->desc.offload ? "cpu" : "none",
                       r->desc.stage == 3 ? (r->desc.offload_params ? "cpu" : "none") : "-",
                       r->desc.stage == 3 ? (r->desc.no_zero_init ? "0" : "1") : "-");
                if (o.max_params)
                    printf("%18s", r->max_params == ZERO_ESTIMATE_MAX_PARAMS ? c : c + 3);
                printf("%12s  %15s\n", a, b);
            }
            if (o.stage < 0 && !o.base.largest_layer_params)
                printf("(stage 3 rows need --largest-layer)\n");
        } else if (o.max_params) {
            printf("stage  partitions  %21s  %-10s  %12s  %12s\n", "max params", "", "device",
                   o.offload ? "host" : "");
            for (i = 0; i < nrows; i++) {
                const row *r = &rows[i];
                commas(r->max_params, a, sizeof a);
                human_count(r->max_params, b, sizeof b);
                snprintf(f, sizeof f, "(%s%s)", r->max_params == ZERO_ESTIMATE_MAX_PARAMS ? ">= " : "", b);
                human(r->est.device_bytes, pick_scale(r->est.device_bytes, o.gib), c, sizeof c);
                if (o.offload) human(r->est.host_bytes, pick_scale(r->est.host_bytes, o.gib), d, sizeof d);
                else d[0] = '\0';
                printf("%5d  %-10s  %21s  %-10s  %12s  %12s", r->desc.stage,
                       partitions[r->desc.stage], a, f, c, d);
                if (o.oopt == ZERO_OFFLOAD_NVME || o.oparam == ZERO_OFFLOAD_NVME) {
                    human(r->est.nvme_bytes, pick_scale(r->est.nvme_bytes, o.gib), d, sizeof d);
                    printf("  %12s nvme", d);
                }
                printf("\n");
            }
        } else {
            printf("stage  partitions  %12s  %12s  %12s  %12s", "params", "grads", "optimizer",
                   o.offload ? "device" : "total");
            if (o.offload) printf("  %12s", "host");
            if (o.oopt == ZERO_OFFLOAD_NVME || o.oparam == ZERO_OFFLOAD_NVME) printf("  %12s", "nvme");
            printf("  %8s\n", "saving");
            for (i = 0; i < nrows; i++) {
                const row *r = &rows[i];
                human(r->est.params_bytes, sc, a, sizeof a);
                human(r->est.grads_bytes, sc, b, sizeof b);
                human(r->est.optimizer_bytes, sc, c, sizeof c);
                human(r->est.device_bytes, sc, d, sizeof d);
                printf("%5d  %-10s  %12s  %12s  %12s  %12s", r->desc.stage, partitions[r->desc.stage],
                       a, b, c, d);
                if (o.offload) {
                    human(r->est.host_bytes, sc, f, sizeof f);
                    printf("  %12s", f);
                }
                if (o.oopt == ZERO_OFFLOAD_NVME || o.oparam == ZERO_OFFLOAD_NVME) {
                    human(r->est.nvme_bytes, sc, f, sizeof f);
                    printf("  %12s", f);
                }
                printf("  %7.2fx\n", (double)baseline / (double)r->est.device_bytes);
            }
        }
        if (o.topo) print_traffic(&o, rows, nrows);
        printf("\n%s; %s. Exact bytes: --json.\n",
               o.gib ? "KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes"
               : o.deepspeed ? "KB, MB, GB = 2^10, 2^20, 2^30 bytes, as DeepSpeed prints them"
                             : "KB, MB, GB = 10^3, 10^6, 10^9 bytes",
               o.deepspeed ? "per GPU = DeepSpeed's gpu_mem, per CPU = its cpu_mem (one node)"
               : o.max_params ? "bytes per rank at the answer; buffers and activations not included"
               : o.offload ? "per rank; saving = stage-0 data-parallel total / device"
                           : "per rank; saving = stage-0 total / this total");
    }
    return 0;
}
