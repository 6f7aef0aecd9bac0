/* gpt2_common.h - everything of the GPT-2 example that is not compute, shared by
   examples/train_gpt2.c (CPU) and a CUDA twin: the configuration and its flags, the
   parameter table (Hugging Face GPT2LMHeadModel's names and shapes, one group per block
   and one for the embeddings), the deterministic initial values, the data (byte-level text
   or llm.c .bin token files, a train/val split, each rank's slice of every global batch),
   the learning-rate schedule, the client state a checkpoint carries, and the paper's
   formulas the demo prints beside the engine's measurements.

   Plain C that also compiles as C++ (nvcc); include it after zero.h (with
   ZERO_IMPLEMENTATION where the program defines it). Every function is static inline, so
   a program uses what it needs. docs/gpt2.md describes the model and its flags. */
#ifndef GPT2_COMMON_H
#define GPT2_COMMON_H
#include "zero.h"
#include "size_arg.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define GPT2_MAX_RANKS 64
#define GPT2_LN_EPS 1e-5f /* GPT2Config.layer_norm_epsilon */
/* AdamW as GPT-2 / llm.c train it: betas 0.9 / 0.95, eps 1e-8, decay 0.1 on 2-D weights. */
#define GPT2_BETA1 0.9
#define GPT2_BETA2 0.95
#define GPT2_EPS 1e-8
#define GPT2_WEIGHT_DECAY 0.1
#define GPT2_BIN_MAGIC 20240520 /* llm.c's token file header */
#define GPT2_DEFAULT_DATA "/usr/share/common-licenses"
#define GPT2_MAX_LAYERS 1000000 /* 4 + 12 L tensors and 1 + L groups stay far inside an int */

/* ---- configuration ------------------------------------------------------------------------ */

typedef struct gpt2_config {
    int layers;   /* n_layer                                    */
    int heads;    /* n_head                                     */
    int channels; /* n_embd (C)                                 */
    int seq;      /* the training sequence length T (<= max_seq) */
    int max_seq;  /* n_positions: rows of wpe (0 = seq)          */
    int vocab;    /* vocab_size (V): 256 for bytes               */
} gpt2_config;

typedef struct gpt2_opts {
    gpt2_config cfg;
    int batch;            /* sequences per micro-step over all ranks; each rank takes batch/ranks */
    int stage;            /* 0..3, -1 = the demo: every stage in turn           */
    int ranks;            /* threads (or mpirun's processes)                    */
    int launcher;         /* set by the caller before gpt2_parse_args: without --ranks the
                             ranks are a launcher's processes, known only later, so --batch
                             is not checked against the default --ranks (the caller checks
                             it against the launcher's world)                    */
    int ranks_given;      /* set by gpt2_parse_args: --ranks was on the command line */
    int steps;            /* optimizer steps (total, also when resuming)        */
    int accum;            /* micro-steps per step                               */
    zero_dtype dtype;     /* params and gradients: F32, BF16 or F16             */
    zero_dtype odtype;    /* --optimizer-dtype: master, m, v (0 = F32; BF16 = stochastic
                             rounding, seeded by --seed)                         */
    double lr;            /* peak learning rate                                 */
    double lr_min_frac;   /* the cosine ends at lr * lr_min_frac                */
    int warmup;           /* linear warmup steps                                */
    float clip;           /* global gradient-norm clip, 0 = none                */
    int val_every;        /* validation loss every K steps (and after the last); 0 = only at the end */
    int val_batches;      /* batches of the validation loss                     */
    int sample;           /* bytes/tokens generated at the end, 0 = none        */
    int log_every;        /* a line every K steps (the first and last always); 0 = every step
                             (the demo: none)                                     */
    int stop_at;          /* stop after this many steps (0 = --steps); the schedule still
                             runs over --steps, so a later --resume continues it   */
    /* offload (docs/offload.md), as in train_mlp */
    size_t device_memory; /* per-rank device budget, 0 = none                   */
    zero_offload_device oopt, oparam;
    zero_offload_device ograd; /* --offload-gradients: where the reduced gradient shard waits
                                  for the step (none = the host tier when oopt is set) */
    const char *nvme_path;
    double offload_ratio;     /* --offload-ratio R: offload_optimizer_ratio (0 = 1)      */
    int dpu, dpu_after;       /* --delayed-update-after K: delayed_update = 1 with K warm-up
                                 updates (needs --offload-optimizer cpu)                  */
    zero_offload_device oact; /* --offload-activations: checkpoint each block's input in this
                                 tier, recompute the block in the backward (none = keep all) */
    int tile_embedding;       /* --tile-embedding K: wte (embedding and LM head) as K tile
                                 groups, gathered one at a time (0 = one tensor in group 0) */
    /* files */
    const char *save_dir, *resume_dir; /* checkpoints                           */
    int save_every;                    /* save every K steps and after the last */
    const char *init_path;             /* start from a .safetensors file, a sharded
                                          index or a directory (zero_engine_load_pretrained) */
    char init_file[4096];              /* --init DIR: DIR/model.safetensors or its index */
    const char *init_dir;              /* --init DIR: DIR (its config.json goes on to --export and --save) */
    const char *data_path;             /* a directory of text files, a text file or a .bin */
    const char *val_path;              /* --val-data: the validation tokens (else --data's last tenth) */
    const char *log_path;              /* per-step CSV: step,loss,lr,grad_norm,val_loss */
    const char *export_dir;            /* --export DIR: config.json + model.safetensors at the end */
    const char *logits_path;           /* step 0: rank 0's logits (fp32) of its first micro-batch */
    uint64_t seed;                     /* initial values and sampling           */
    /* fine-tuning (docs/gpt2.md): AdamW's settings, the embeddings' lr multiplier, frozen tensors */
    double beta1, beta2, eps, weight_decay;
    double lr_embed;     /* --lr-embed: wte and wpe train at lr * lr_embed (per-tensor lr) */
    const char *freeze;  /* --freeze LIST: wte, wpe, ln_f, h.N, h.A-B, comma-separated   */
    /* ZeRO++ (docs/engine.md, "Quantized collectives"): lossy by design */
    int quant_w;         /* --quantized-weights 0|1: qwZ (stage 3, int8 forward all-gather) */
    int quant_g;         /* --quantized-gradients 0|1|4|8: qgZ (1 = int4, the default; 8 = int8) */
    int quant_levels;    /* --quantized-gradient-levels 0|1|2: qgZ's scheme (0 = two-level across
                            nodes when 1 < R < N, else flat; 1 = flat; 2 = two-level)      */
    /* beyond one node (docs/engine.md, "MiCS"): the engine's topology and MiCS groups */
    int ranks_per_node;  /* --ranks-per-node R (0 = the launcher's, else one node)       */
    int mics_shard_size; /* --mics-shard-size S (stages 1-3; 0 = flat)                  */
    int hpz;             /* --hpz-partition-size S (stage 3, ZeRO++ hpZ; 0 = off)        */
    double dropout;      /* --dropout P: HF's embd_pdrop, attn_pdrop and resid_pdrop (0 = none) */
    const char *tokenizer_path;     /* --tokenizer: a tokenizer.json (or a directory holding one) */
    const char *decode_path;        /* --decode FILE.bin: print its tokens as text and exit */
    const struct gpt2_vocab *vocab; /* the caller's gpt2_vocab_load of tokenizer_path (NULL: none) */
} gpt2_opts;

/* The small default model: learns visibly within a few minutes on 2 cores. */
static inline void gpt2_opts_default(gpt2_opts *o)
{
    memset(o, 0, sizeof *o);
    o->cfg.layers = 4;
    o->cfg.heads = 4;
    o->cfg.channels = 64;
    o->cfg.seq = 64;
    o->cfg.vocab = 256;
    o->batch = 8;
    o->stage = -1;
    o->ranks = 4;
    o->steps = 100;
    o->accum = 1;
    o->dtype = ZERO_F32;
    o->lr = 3e-3;
    o->lr_min_frac = 0.1;
    o->warmup = 10;
    o->clip = 1.0f;
    o->val_every = 50;
    o->val_batches = 4;
    o->sample = 200;
    o->log_every = 0;
    o->seed = 1337;
    o->beta1 = GPT2_BETA1;
    o->beta2 = GPT2_BETA2;
    o->eps = GPT2_EPS;
    o->weight_decay = GPT2_WEIGHT_DECAY;
    o->lr_embed = 1.0;
}

static inline void gpt2_usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [options]\n"
            "model:  --layers L --heads H --channels C --seq T --vocab V (default 4 4 64 64 256)\n"
            "        --preset 124M|1558M   GPT-2 small / XL shapes (T 1024, V 50257)\n"
            "        --init FILE.safetensors|DIR   start from a Hugging Face GPT-2 file, or a save_pretrained\n"
            "                                      directory (config.json gives the shape; model.safetensors)\n"
            "data:   --data DIR|FILE|FILE.bin (default %s; text = bytes, .bin = llm.c tokens)\n"
            "        --val-data DIR|FILE|FILE.bin   validate on it (default: --data's last tenth)\n"
            "        --batch B   sequences per micro-step over all ranks (default 8)\n"
            "train:  --stage 0..3 (default: the demo, every stage)  --ranks N (default 4)\n"
            "        --steps S (default 100) --accum A (default 1) --dtype f32|bf16|f16 (default f32)\n"
            "        --lr LR (default 3e-3) --lr-min-frac F (default 0.1) --warmup W (default 10)\n"
            "        --clip X (default 1; 0 = none) --seed S (default 1337)\n"
            "        --optimizer-dtype f32|bf16 (default f32) master, m, v; bf16 rounds stochastically\n"
            "        --val-every K --val-batches K --sample N --log-every K\n"
            "AdamW:  --beta1 B (default %g; torch and HF 0.9) --beta2 B (%g; torch and HF 0.999)\n"
            "        --eps E (%g; torch and HF 1e-8) --weight-decay W (%g on 2-D weights; torch 0.01, HF 0)\n"
            "tune:   --freeze LIST   frozen tensors (no gradients, no optimizer state): wte, wpe, ln_f,\n"
            "                        h.N, h.A-B, comma-separated (e.g. wte,wpe,h.0-5); train_gpt2.c\n"
            "        --lr-embed M    wte and wpe train at lr x M (per-tensor lr; default 1)\n"
            "        --dropout P     HF GPT-2's embd, attn and resid dropout, P in [0, 1) (default 0: none;\n"
            "                        GPT2Config's is 0.1); masks from a counter-based hash of (--seed, step,\n"
            "                        micro-step, layer, site, element), docs/gpt2.md; train_gpt2.c\n"
            "offload: --device-memory SIZE --offload-optimizer none|cpu|nvme\n"
            "         --offload-param none|cpu|nvme --offload-gradients none|cpu|nvme --nvme-path DIR\n"
            "         --offload-ratio R   the fraction R in (0, 1] of the optimizer state offloaded,\n"
            "                             the rest updated on the device (default 1)\n"
            "         --delayed-update-after K   DPU: after K updates the host Adam overlaps the next\n"
            "                             forward and backward (one-step-stale params; needs cpu)\n"
            "         --offload-activations none|cpu|nvme   (train_gpt2.c) checkpoint each block's input there\n"
            "         --tile-embedding K   (train_gpt2.c) wte in K tiles, gathered one at a time\n"
            "ZeRO++: --quantized-weights 0|1   stage 3: the forward all-gather as int8 blocks (qwZ)\n"
            "        --quantized-gradients 0|1|4|8   stages 1-3: the gradient reduce-scatter as int4\n"
            "                                        (1 or 4) or int8 blocks (qgZ); both lossy\n"
            "        --quantized-gradient-levels 0|1|2   qgZ's scheme: 2 = ZeRO++'s two levels (inside\n"
            "                             the node, then across nodes), 1 = flat; 0 = 2 on several nodes\n"
            "nodes:  --ranks-per-node R   ranks [k R, (k+1) R) share a node: traffic split intra/inter\n"
            "        --mics-shard-size S  MiCS (stages 1-3): states partitioned in groups of S ranks,\n"
            "                             replicated across the N / S groups\n"
            "        --hpz-partition-size S   hpZ (stage 3): a secondary param partition over the\n"
            "                             S ranks of a node, so later gathers stay inside it\n"
            "                             (S divides --ranks-per-node; exact)\n"
            "files:  --save DIR --save-every K --resume DIR --stop-at S --log FILE.csv --dump-logits FILE\n"
            "        --tokenizer FILE|DIR   a Hugging Face tokenizer.json: the sample prints text, not ids\n"
            "        --decode FILE.bin   with --tokenizer: print the file's tokens as text, and exit\n"
            "        --export DIR   (train_gpt2.c) the final weights as a Hugging Face directory:\n"
            "                       config.json + model.safetensors for GPT2LMHeadModel.from_pretrained\n",
            prog, GPT2_DEFAULT_DATA, GPT2_BETA1, GPT2_BETA2, GPT2_EPS, GPT2_WEIGHT_DECAY);
}

/* "4MB", "64MiB", "300KiB", "1GB" or plain bytes; 0 on a malformed size. */
static inline size_t gpt2_parse_size(const char *v) { return example_parse_size(v); }

static inline int gpt2_parse_tier(const char *v, zero_offload_device *out)
{
    if (!strcmp(v, "none")) *out = ZERO_OFFLOAD_NONE;
    else if (!strcmp(v, "cpu") || !strcmp(v, "host")) *out = ZERO_OFFLOAD_CPU;
    else if (!strcmp(v, "nvme")) *out = ZERO_OFFLOAD_NVME;
    else return -1;
    return 0;
}

/* A whole decimal number in [lo, hi] into *out; -1 otherwise (atoi would wrap or take "4x"). */
static inline int gpt2_parse_int(const char *v, long lo, long hi, int *out)
{
    char *end;
    long x;
    errno = 0;
    x = strtol(v, &end, 10);
    if (end == v || *end != '\0' || errno != 0 || x < lo || x > hi) return -1;
    *out = (int)x;
    return 0;
}

/* Parses argv into o (defaults first: gpt2_opts_default). Returns 0, 1 for --help (usage
   printed to stdout) or 2 on an error (message and usage on stderr). */
/* The value of "key" in a flat JSON object held in text (Hugging Face's config.json): a
   number, or true/false as 1/0. Returns 0, or -1 when the key is absent or not a number. */
static inline int gpt2_json_number(const char *text, const char *key, double *out)
{
    char pat[80];
    const char *p;
    snprintf(pat, sizeof pat, "\"%s\"", key);
    for (p = strstr(text, pat); p; p = strstr(p + 1, pat)) {
        const char *q = p + strlen(pat);
        char *end = NULL;
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
        if (*q != ':') continue; /* the name as a value, not a key */
        q++;
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
        if (!strncmp(q, "true", 4)) return *out = 1, 0;
        if (!strncmp(q, "false", 5)) return *out = 0, 0;
        *out = strtod(q, &end);
        return end != q ? 0 : -1;
    }
    return -1;
}

/* The string value of "key" in a flat JSON text, copied into out (at most n - 1 bytes, no
   escapes decoded: the config values read with it have none). 0, or -1 when the key is absent
   or its value is not a string (null, a number). */
static inline int gpt2_json_string(const char *text, const char *key, char *out, size_t n)
{
    char pat[80];
    const char *p;
    snprintf(pat, sizeof pat, "\"%s\"", key);
    for (p = strstr(text, pat); p; p = strstr(p + 1, pat)) {
        const char *q = p + strlen(pat);
        size_t k = 0;
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
        if (*q != ':') continue;
        q++;
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
        if (*q != '"') return -1;
        for (q++; *q && *q != '"' && k + 1 < n; q++) out[k++] = *q;
        out[k] = '\0';
        return 0;
    }
    return -1;
}

/* --init DIR: reads DIR/config.json (n_layer, n_head, n_embd, n_positions, vocab_size,
   layer_norm_epsilon, tie_word_embeddings) into o->cfg, refuses the keys that would make
   Hugging Face's model compute something else than this one (activation_function other than
   gelu_new / gelu_pytorch_tanh, the same tanh GELU; scale_attn_by_inverse_layer_idx true;
   scale_attn_weights false; n_inner other than 4 n_embd), refusing a shape flag given on the
   command line (given: bit 0 --layers, 1 --heads, 2 --channels, 3 --vocab) that disagrees,
   naming both values, and points o->init_path at DIR/model.safetensors. 0, or -1 with a
   message in why. */
static inline int gpt2_read_hf_dir(gpt2_opts *o, const char *dir, unsigned given, char *why, size_t n)
{
    static const char *const keys[4] = {"n_layer", "n_head", "n_embd", "vocab_size"};
    static const char *const flags[4] = {"--layers", "--heads", "--channels", "--vocab"};
    int *dst[4];
    char path[4200], *text = NULL;
    FILE *f;
    long len;
    double v;
    int k, rc = -1;
    struct stat st;
    dst[0] = &o->cfg.layers, dst[1] = &o->cfg.heads, dst[2] = &o->cfg.channels, dst[3] = &o->cfg.vocab;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (!(f = fopen(path, "rb"))) {
        snprintf(why, n, "--init %.300s: a directory without config.json", dir);
        return -1;
    }
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 && len < (1L << 20) && fseek(f, 0, SEEK_SET) == 0 &&
        (text = (char *)malloc((size_t)len + 1)) != NULL && fread(text, 1, (size_t)len, f) == (size_t)len) {
        text[len] = '\0';
        rc = 0;
    } else {
        snprintf(why, n, "%.300s: unreadable (or over 1 MB)", path);
    }
    fclose(f);
    for (k = 0; k < 4 && rc == 0; k++) {
        if (gpt2_json_number(text, keys[k], &v) != 0 || !(v >= 1 && v <= 1e7) || v != (double)(int)v) {
            snprintf(why, n, "%.300s: no integer %s", path, keys[k]);
            rc = -1;
        } else if ((given >> k & 1) && *dst[k] != (int)v) {
            snprintf(why, n, "%.300s says %s = %d, %s says %d: drop the flag or use another checkpoint", path, keys[k],
                     (int)v, flags[k], *dst[k]);
            rc = -1;
        } else {
            *dst[k] = (int)v;
        }
    }
    if (rc == 0 && gpt2_json_number(text, "n_positions", &v) == 0) {
        if (!(v >= 1 && v <= 1e7) || v != (double)(int)v) snprintf(why, n, "%.300s: bad n_positions", path), rc = -1;
        else o->cfg.max_seq = (int)v; /* wpe's rows, whatever --seq trains with */
    }
    if (rc == 0 && gpt2_json_number(text, "layer_norm_epsilon", &v) == 0 && v != 1e-5)
        snprintf(why, n, "%.300s: layer_norm_epsilon = %g; this model uses 1e-5", path, v), rc = -1;
    if (rc == 0 && gpt2_json_number(text, "tie_word_embeddings", &v) == 0 && v != 1)
        snprintf(why, n, "%.300s: tie_word_embeddings = false; this model ties the LM head to wte", path), rc = -1;
    if (rc == 0) {
        char act[64];
        if (gpt2_json_string(text, "activation_function", act, sizeof act) == 0 && strcmp(act, "gelu_new") != 0 &&
            strcmp(act, "gelu_pytorch_tanh") != 0)
            snprintf(why, n, "%.300s: activation_function = \"%.60s\"; this model computes gelu_new (GELU's tanh form)",
                     path, act), rc = -1;
        else if (gpt2_json_number(text, "scale_attn_by_inverse_layer_idx", &v) == 0 && v != 0)
            snprintf(why, n, "%.300s: scale_attn_by_inverse_layer_idx = true; this model scales every layer's "
                     "attention by 1/sqrt(head size) only", path), rc = -1;
        else if (gpt2_json_number(text, "scale_attn_weights", &v) == 0 && v != 1)
            snprintf(why, n, "%.300s: scale_attn_weights = false; this model scales the attention by "
                     "1/sqrt(head size)", path), rc = -1;
        else if (gpt2_json_number(text, "n_inner", &v) == 0 && v != 4.0 * o->cfg.channels)
            snprintf(why, n, "%.300s: n_inner = %g; this model's MLP is 4 n_embd = %d wide", path, v,
                     4 * o->cfg.channels), rc = -1;
    }
    free(text);
    if (rc != 0) return rc;
    snprintf(o->init_file, sizeof o->init_file, "%s/model.safetensors", dir);
    if (stat(o->init_file, &st) != 0) { /* a sharded checkpoint: its index names the files */
        snprintf(o->init_file, sizeof o->init_file, "%s/model.safetensors.index.json", dir);
        if (stat(o->init_file, &st) != 0) {
            snprintf(why, n, "--init %.300s: no model.safetensors or model.safetensors.index.json", dir);
            return -1;
        }
    }
    o->init_path = o->init_file;
    return 0;
}

static inline int gpt2_parse_args(int argc, char **argv, gpt2_opts *o)
{
    int a;
    unsigned given = 0; /* shape flags on the command line (gpt2_read_hf_dir) */
    for (a = 1; a < argc; a += 2) {
        const char *k = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        int bad = 0;
        if (!strcmp(k, "--help") || !strcmp(k, "-h")) {
            gpt2_usage(stdout, argv[0]);
            return 1;
        }
        if (!v) {
            fprintf(stderr, "%s: %s needs a value\n", argv[0], k);
            gpt2_usage(stderr, argv[0]);
            return 2;
        }
        if (!strcmp(k, "--layers")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->cfg.layers), given |= 1u;
        else if (!strcmp(k, "--heads")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->cfg.heads), given |= 2u;
        else if (!strcmp(k, "--channels")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->cfg.channels), given |= 4u;
        else if (!strcmp(k, "--seq")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->cfg.seq);
        else if (!strcmp(k, "--vocab")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->cfg.vocab), given |= 8u;
        else if (!strcmp(k, "--preset")) {
            if (!strcmp(v, "124M")) {
                o->cfg.layers = 12, o->cfg.heads = 12, o->cfg.channels = 768;
            } else if (!strcmp(v, "1558M")) {
                o->cfg.layers = 48, o->cfg.heads = 25, o->cfg.channels = 1600;
            } else bad = 1;
            o->cfg.seq = o->cfg.max_seq = 1024;
            o->cfg.vocab = 50257;
            given |= 15u;
        } else if (!strcmp(k, "--batch")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->batch);
        else if (!strcmp(k, "--stage")) bad = gpt2_parse_int(v, 0, 3, &o->stage);
        else if (!strcmp(k, "--ranks")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->ranks), o->ranks_given = 1;
        else if (!strcmp(k, "--steps")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->steps);
        else if (!strcmp(k, "--accum")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->accum);
        else if (!strcmp(k, "--dtype")) {
            if (!strcmp(v, "f32") || !strcmp(v, "fp32")) o->dtype = ZERO_F32;
            else if (!strcmp(v, "bf16")) o->dtype = ZERO_BF16;
            else if (!strcmp(v, "f16") || !strcmp(v, "fp16")) o->dtype = ZERO_F16;
            else bad = 1;
        } else if (!strcmp(k, "--optimizer-dtype")) {
            if (!strcmp(v, "f32") || !strcmp(v, "fp32")) o->odtype = ZERO_F32;
            else if (!strcmp(v, "bf16")) o->odtype = ZERO_BF16;
            else bad = 1;
        } else if (!strcmp(k, "--lr")) o->lr = atof(v);
        else if (!strcmp(k, "--lr-min-frac")) o->lr_min_frac = atof(v);
        else if (!strcmp(k, "--warmup")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->warmup);
        else if (!strcmp(k, "--clip")) o->clip = (float)atof(v);
        else if (!strcmp(k, "--val-every")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->val_every);
        else if (!strcmp(k, "--val-batches")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->val_batches);
        else if (!strcmp(k, "--sample")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->sample);
        else if (!strcmp(k, "--log-every")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->log_every);
        else if (!strcmp(k, "--stop-at")) bad = gpt2_parse_int(v, 0, INT_MAX, &o->stop_at);
        else if (!strcmp(k, "--seed")) o->seed = (uint64_t)strtoull(v, NULL, 10);
        else if (!strcmp(k, "--device-memory")) bad = (o->device_memory = gpt2_parse_size(v)) == 0;
        else if (!strcmp(k, "--offload-optimizer")) bad = gpt2_parse_tier(v, &o->oopt) != 0;
        else if (!strcmp(k, "--offload-param")) bad = gpt2_parse_tier(v, &o->oparam) != 0;
        else if (!strcmp(k, "--offload-gradients")) bad = gpt2_parse_tier(v, &o->ograd) != 0;
        else if (!strcmp(k, "--nvme-path")) o->nvme_path = v;
        else if (!strcmp(k, "--ranks-per-node")) bad = gpt2_parse_int(v, 0, INT_MAX, &o->ranks_per_node);
        else if (!strcmp(k, "--mics-shard-size")) bad = gpt2_parse_int(v, 0, INT_MAX, &o->mics_shard_size);
        else if (!strcmp(k, "--hpz-partition-size")) bad = gpt2_parse_int(v, 0, INT_MAX, &o->hpz);
        else if (!strcmp(k, "--offload-ratio"))
            o->offload_ratio = atof(v), bad = !(o->offload_ratio > 0 && o->offload_ratio <= 1);
        else if (!strcmp(k, "--delayed-update-after"))
            o->dpu = 1, bad = gpt2_parse_int(v, 0, INT_MAX, &o->dpu_after);
        else if (!strcmp(k, "--offload-activations")) bad = gpt2_parse_tier(v, &o->oact) != 0;
        else if (!strcmp(k, "--tile-embedding")) bad = gpt2_parse_int(v, 1, INT_MAX, &o->tile_embedding);
        else if (!strcmp(k, "--save")) o->save_dir = v;
        else if (!strcmp(k, "--save-every")) bad = gpt2_parse_int(v, INT_MIN, INT_MAX, &o->save_every);
        else if (!strcmp(k, "--resume")) o->resume_dir = v;
        else if (!strcmp(k, "--init")) o->init_path = v;
        else if (!strcmp(k, "--data")) o->data_path = v;
        else if (!strcmp(k, "--val-data")) o->val_path = v;
        else if (!strcmp(k, "--log")) o->log_path = v;
        else if (!strcmp(k, "--tokenizer")) o->tokenizer_path = v;
        else if (!strcmp(k, "--decode")) o->decode_path = v;
        else if (!strcmp(k, "--export")) o->export_dir = v;
        else if (!strcmp(k, "--dump-logits")) o->logits_path = v;
        else if (!strcmp(k, "--beta1")) o->beta1 = atof(v), bad = !(o->beta1 > 0 && o->beta1 < 1);
        else if (!strcmp(k, "--beta2")) o->beta2 = atof(v), bad = !(o->beta2 > 0 && o->beta2 < 1);
        else if (!strcmp(k, "--eps")) o->eps = atof(v), bad = !(o->eps > 0 && o->eps < 1);
        else if (!strcmp(k, "--weight-decay")) o->weight_decay = atof(v), bad = !(o->weight_decay >= 0 && o->weight_decay < 1e6);
        else if (!strcmp(k, "--lr-embed")) o->lr_embed = atof(v), bad = !(o->lr_embed >= 0 && o->lr_embed < 1e6);
        else if (!strcmp(k, "--freeze")) o->freeze = v;
        else if (!strcmp(k, "--dropout")) {
            char *end;
            o->dropout = strtod(v, &end);
            bad = end == v || *end != '\0' || !(o->dropout >= 0 && o->dropout < 1);
        }
        else if (!strcmp(k, "--quantized-weights")) bad = gpt2_parse_int(v, 0, 1, &o->quant_w);
        else if (!strcmp(k, "--quantized-gradients"))
            bad = gpt2_parse_int(v, 0, 8, &o->quant_g) || (o->quant_g > 1 && o->quant_g != 4 && o->quant_g != 8);
        else if (!strcmp(k, "--quantized-gradient-levels")) bad = gpt2_parse_int(v, 0, 2, &o->quant_levels);
        else {
            fprintf(stderr, "%s: unknown option %s\n", argv[0], k);
            gpt2_usage(stderr, argv[0]);
            return 2;
        }
        if (bad) {
            fprintf(stderr, "%s: bad value for %s: %s\n", argv[0], k, v);
            return 2;
        }
    }
    if (o->init_path) {
        struct stat st;
        char why[800];
        if (stat(o->init_path, &st) == 0 && S_ISDIR(st.st_mode)) {
            int seq_given = 0;
            for (a = 1; a + 1 < argc; a += 2) seq_given |= !strcmp(argv[a], "--seq");
            o->cfg.max_seq = 0;
            o->init_dir = o->init_path;
            if (gpt2_read_hf_dir(o, o->init_path, given, why, sizeof why) != 0) {
                fprintf(stderr, "%s: %s\n", argv[0], why);
                return 2;
            }
            if (!seq_given && o->cfg.seq > o->cfg.max_seq) o->cfg.seq = o->cfg.max_seq;
            if (o->cfg.seq > o->cfg.max_seq) {
                fprintf(stderr, "%s: --seq %d exceeds config.json's n_positions = %d\n", argv[0], o->cfg.seq,
                        o->cfg.max_seq);
                return 2;
            }
        }
    }
    if (o->cfg.max_seq == 0 || o->cfg.max_seq < o->cfg.seq) o->cfg.max_seq = o->cfg.seq;
    {
        const gpt2_config *c = &o->cfg;
        const char *why = NULL;
        if (c->layers < 1 || c->heads < 1 || c->channels < 1 || c->seq < 2 || c->vocab < 2)
            why = "--layers, --heads, --channels, --vocab must be >= 1 and --seq >= 2";
        else if (c->layers > GPT2_MAX_LAYERS) why = "--layers must be at most 1000000";
        else if (o->ranks >= 1 && (double)(o->batch / o->ranks) * c->seq * 4 * c->channels > INT_MAX)
            why = "--batch / --ranks x --seq x 4 --channels (a rank's largest activation) must stay below 2^31 elements";
        else if (c->channels % c->heads) why = "--channels must be a multiple of --heads";
        else if (o->ranks < 1 || o->ranks > GPT2_MAX_RANKS) why = "--ranks must be 1..64";
        else if (o->batch < 1 || ((o->ranks_given || !o->launcher) && o->batch % o->ranks))
            why = "--batch must be a multiple of --ranks";
        else if (o->steps < 1 || o->accum < 1) why = "--steps and --accum must be >= 1";
        else if (!(o->lr >= 0) || !(o->lr_min_frac >= 0) || o->warmup < 0 || !(o->clip >= 0))
            why = "--lr, --lr-min-frac, --warmup, --clip must be >= 0";
        else if (o->tile_embedding > c->vocab) why = "--tile-embedding K needs 1 <= K <= --vocab";
        else if (o->val_every < 0 || o->val_batches < 1 || o->sample < 0 || o->log_every < 0 ||
                 o->save_every < 0)
            why = "--val-every, --sample, --save-every, --log-every >= 0; --val-batches >= 1";
        if (why) {
            fprintf(stderr, "%s: %s\n", argv[0], why);
            return 2;
        }
    }
    return 0;
}

/* ---- the learning-rate schedule ---------------------------------------------------------- */

/* llm.c's: linear warmup over the first 'warmup' steps (lr * (s + 1) / warmup), then a
   cosine from lr down to lr * lr_min_frac at the last step. In double; the reference
   (tests/gpt2_reference.py) computes the same expression. */
static inline double gpt2_lr(const gpt2_opts *o, int step)
{
    double lo = o->lr * o->lr_min_frac, ratio;
    if (step < o->warmup) return o->lr * (double)(step + 1) / (double)o->warmup;
    if (o->steps - 1 <= o->warmup) return o->lr;
    ratio = (double)(step - o->warmup) / (double)(o->steps - 1 - o->warmup);
    return lo + 0.5 * (1.0 + cos(3.14159265358979323846 * ratio)) * (o->lr - lo);
}

/* ---- the engine's settings -------------------------------------------------------------- */

/* The CPU example's engine descriptor for a run at 'stage' with B sequences per rank (device
   and comm left NULL for the caller): AdamW as GPT-2, the clip, the offload tiers, and with
   --offload-activations room for every block's input. */
static inline void gpt2_engine_desc(const gpt2_opts *o, int stage, int B, zero_engine_desc *d)
{
    const gpt2_config *c = &o->cfg;
    memset(d, 0, sizeof *d);
    d->stage = stage;
    d->param_dtype = o->dtype;
    d->optimizer_dtype = o->odtype;
    d->optimizer_seed = o->seed;
    d->accum_steps = o->accum;
    d->adam.mode = ZERO_ADAMW;
    d->adam.lr = o->lr;
    d->adam.beta1 = o->beta1;
    d->adam.beta2 = o->beta2;
    d->adam.eps = o->eps;
    d->adam.weight_decay = o->weight_decay;
    d->clip_norm = o->clip;
    /* No stage-3 prefetch: the host device's collectives are synchronous (nothing to
       overlap), and a prefetch of group 0 at the end of the backward would go unused (its
       gradients need no params), so the traffic is the paper's 3 Psi exactly. */
    d->prefetch_depth = -1;
    d->quantized_weights = o->quant_w;
    d->quantized_gradients = o->quant_g != 0;
    d->quantized_gradient_bits = o->quant_g > 1 ? o->quant_g : 0;
    d->quantized_gradient_levels = o->quant_g ? o->quant_levels : 0;
    d->offload_optimizer = o->oopt;
    d->offload_param = o->oparam;
    d->offload_gradients = o->ograd;
    d->offload_optimizer_ratio = o->offload_ratio;
    d->delayed_update = o->dpu;
    d->delayed_update_after = o->dpu_after;
    d->nvme_path = o->nvme_path;
    d->ranks_per_node = o->ranks_per_node;
    d->mics_shard_size = stage >= 1 ? o->mics_shard_size : 0; /* the demo's stage 0 runs flat */
    d->hpz_partition_size = stage == 3 ? o->hpz : 0;          /* and stages 0-2 without hpZ */
    if (o->oact != ZERO_OFFLOAD_NONE) { /* room for every block's input at once */
        size_t span = (size_t)zero_io_align_up(sizeof(float) * (size_t)B * c->seq * c->channels);
        d->offload_activations = o->oact;
        if (o->oact == ZERO_OFFLOAD_NVME) {
            d->activation_nvme_bytes = span * (size_t)c->layers;
            d->activation_host_bytes = 2 * span; /* staging: a stash being written, a read-ahead */
        } else {
            d->activation_host_bytes = span * (size_t)c->layers;
        }
    }
}

/* ---- what a run needs, before it allocates ---------------------------------------------- */

/* The bytes this process may use: the machine's memory, or an address-space limit (ulimit -v)
   when that is lower. 0 when neither is known. */
static inline double gpt2_memory_limit(void)
{
    double lim = 0.0;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    struct rlimit rl;
    if (pages > 0 && psz > 0) lim = (double)pages * (double)psz;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (lim == 0.0 || (double)rl.rlim_cur < lim))
        lim = (double)rl.rlim_cur;
    return lim;
}

/* One rank's activations and scratch for B sequences, in bytes: what train_gpt2.c's
   model_init allocates (fp32), every block's (one block's with checkpointing, ckpt = 1),
   the head's and the backward's. */
static inline double gpt2_activation_bytes(const gpt2_config *c, int B, int ckpt, int tiles, zero_dtype dt)
{
    double T = c->seq, C = c->channels, V = c->vocab, BT = (double)B * T;
    double rows = tiles > 0 ? ceil(V / tiles) : V; /* wte's rows of one tile */
    double emb = (tiles > 0 ? 0.0 : V * C) + (double)(c->max_seq > c->seq ? c->max_seq : c->seq) * C + 2 * C;
    double blk = 12 * C * C + 13 * C;
    double block = 20 * BT * C + 4 * BT + (double)B * c->heads * T * T;
    double f = emb + (dt != ZERO_F32 ? emb + 2 * blk : 0.0) + BT * C * (ckpt ? 2 : 1);
    f += block * (ckpt ? 1 : c->layers);
    f += BT * C + 2 * BT + BT * V + (tiles > 0 && dt != ZERO_F32 ? 2 * rows * C : 0.0);
    f += 13 * BT * C + T * T; /* the backward's dres, d4a, d4b, dqkv, dc, datt */
    return 4.0 * f;
}

/* ---- --init: what the engine's loader does not refuse ------------------------------------ */

/* Element i of a safetensors tensor of dtype dt ("F32", "F16", "BF16", "F64") at p is a NaN
   (2), an infinity (1) or finite (0): an all-ones exponent, by the bits. */
static inline int gpt2__nonfinite(const unsigned char *p, const char *dt, size_t i)
{
    uint64_t u = 0;
    int k, w = !strcmp(dt, "F64") ? 8 : !strcmp(dt, "F32") ? 4 : 2;
    for (k = w - 1; k >= 0; k--) u = u << 8 | p[i * (size_t)w + (size_t)k]; /* little-endian */
    if (w == 8) return (u >> 52 & 0x7ff) != 0x7ff ? 0 : (u & 0xfffffffffffffull) ? 2 : 1;
    if (w == 4) return (u >> 23 & 0xff) != 0xff ? 0 : (u & 0x7fffffu) ? 2 : 1;
    if (!strcmp(dt, "F16")) return (u >> 10 & 0x1f) != 0x1f ? 0 : (u & 0x3ffu) ? 2 : 1;
    return (u >> 7 & 0xff) != 0xff ? 0 : (u & 0x7fu) ? 2 : 1; /* BF16 */
}

/* Checks a --init safetensors file for what train_gpt2 cannot train from and the engine's
   loader would accept: a non-finite weight (every step would be skipped), and an untied LM
   head (an lm_head.weight whose values are not transformer.wte.weight's: this model's head
   is wte, so the file's head would be dropped). 0, or -1 with a sentence naming the tensor
   in err. The engine's loader checks the rest (names, shapes, dtypes, sizes). */
static inline int gpt2_init_check_file(const char *path, char *err, size_t n)
{
    FILE *f = fopen(path, "rb");
    unsigned char b8[8], *data = NULL;
    uint64_t hl = 0, lm[2] = {0, 0}, wte[2] = {0, 0};
    char *h = NULL, *p;
    int k, rc = -1, have_lm = 0, have_wte = 0;
    if (!f) return 0; /* the engine's loader names what is wrong */
    if (fread(b8, 1, 8, f) != 8) goto ok;
    for (k = 7; k >= 0; k--) hl = hl << 8 | b8[k];
    if (hl == 0 || hl > ((uint64_t)100 << 20) || !(h = (char *)malloc((size_t)hl + 1))) goto ok;
    if (fread(h, 1, (size_t)hl, f) != (size_t)hl) goto ok;
    h[hl] = '\0';
    /* each entry: "NAME":{"dtype":"F32","shape":[...],"data_offsets":[A,B]} */
    for (p = h; (p = strstr(p, "\"data_offsets\"")) != NULL; p++) {
        char name[256] = "", dt[8] = "";
        const char *q = p, *open, *d;
        unsigned long long a = 0, bnd = 0;
        size_t i, cnt, w;
        while (q > h && *q != '{') q--;                   /* the entry's object */
        open = q;
        while (q > h && *--q != '"') {}                  /* its name's closing quote */
        for (d = q; d > h && *(d - 1) != '"'; d--) {}    /* its opening quote */
        if ((size_t)(q - d) < sizeof name) memcpy(name, d, (size_t)(q - d)), name[q - d] = '\0';
        d = strstr(open, "\"dtype\"");
        if (!d || d > p || sscanf(d, "\"dtype\" : \"%7[A-Z0-9]\"", dt) != 1) continue;
        if (sscanf(strchr(p, '['), "[ %llu , %llu ]", &a, &bnd) != 2 || bnd < a || bnd - a > ((uint64_t)1 << 40))
            continue;
        if (!strcmp(name, "lm_head.weight")) have_lm = 1, lm[0] = a, lm[1] = bnd;
        if (!strcmp(name, "transformer.wte.weight") || !strcmp(name, "wte.weight")) have_wte = 1, wte[0] = a, wte[1] = bnd;
        w = !strcmp(dt, "F64") ? 8 : !strcmp(dt, "F32") ? 4 : (!strcmp(dt, "F16") || !strcmp(dt, "BF16")) ? 2 : 0;
        if (w == 0 || (bnd - a) % w) continue;
        free(data);
        if (!(data = (unsigned char *)malloc((size_t)(bnd - a) + 1)) ||
            fseek(f, (long)(8 + hl + a), SEEK_SET) != 0 || fread(data, 1, (size_t)(bnd - a), f) != (size_t)(bnd - a))
            goto ok; /* too short or unreadable: the engine's loader says so */
        for (i = 0, cnt = (size_t)(bnd - a) / w; i < cnt; i++) {
            int bad = gpt2__nonfinite(data, dt, i);
            if (bad) {
                snprintf(err, n, "--init %s: %s holds %s at element %zu of %zu: train_gpt2 refuses non-finite "
                         "weights", path, name, bad == 2 ? "NaN" : "an infinity", i, cnt);
                goto out;
            }
        }
    }
    if (have_lm && have_wte && lm[1] - lm[0] != wte[1] - wte[0]) {
        snprintf(err, n, "--init %s: lm_head.weight is not transformer.wte.weight (an untied head, "
                 "tie_word_embeddings = false): train_gpt2's head is wte, untied heads are not supported", path);
        goto out;
    }
    if (have_lm && lm[0] != wte[0]) { /* the two byte ranges must hold the same values */
        unsigned char x[65536], y[65536];
        uint64_t at;
        for (at = 0; at < lm[1] - lm[0]; at += sizeof x) {
            size_t m = lm[1] - lm[0] - at < sizeof x ? (size_t)(lm[1] - lm[0] - at) : sizeof x;
            if (fseek(f, (long)(8 + hl + lm[0] + at), SEEK_SET) != 0 || fread(x, 1, m, f) != m ||
                fseek(f, (long)(8 + hl + wte[0] + at), SEEK_SET) != 0 || fread(y, 1, m, f) != m)
                goto ok;
            if (memcmp(x, y, m) != 0) {
                snprintf(err, n, "--init %s: lm_head.weight differs from transformer.wte.weight (an untied head, "
                         "tie_word_embeddings = false): train_gpt2's head is wte, untied heads are not supported",
                         path);
                goto out;
            }
        }
    }
ok:
    rc = 0;
out:
    free(data);
    free(h);
    fclose(f);
    return rc;
}

/* gpt2_init_check_file on the --init path: one .safetensors file, or each file a sharded
   index names (its "weight_map" values; the engine's loader checks the index's form). An
   lm_head.weight in another shard than wte's is not compared. */
static inline int gpt2_init_check(const char *path, char *err, size_t n)
{
    FILE *f = fopen(path, "rb");
    char *text = NULL, *p, *q, file[4400];
    const char *slash = strrchr(path, '/');
    long len = 0;
    int rc = 0, dl = slash ? (int)(slash - path) : 0;
    if (!f) return 0; /* the engine's loader names what is wrong */
    if (fgetc(f) != '{' || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) <= 0 || len > (100L << 20) ||
        fseek(f, 0, SEEK_SET) != 0 || !(text = (char *)malloc((size_t)len + 1)) ||
        fread(text, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        free(text);
        return gpt2_init_check_file(path, err, n);
    }
    fclose(f);
    text[len] = '\0';
    p = strstr(text, "\"weight_map\"");
    while (p && rc == 0 && (p = strstr(p, ".safetensors\"")) != NULL) { /* each tensor's file name */
        char *seen;
        for (q = p; q > text && q[-1] != '"'; q--) {}
        p += 13; /* past the name's closing quote */
        if (p - q > 256 || memchr(q, '/', (size_t)(p - q))) continue; /* the loader refuses it */
        {
            char name[300];
            snprintf(name, sizeof name, "\"%.*s", (int)(p - q), q); /* "NAME.safetensors" */
            seen = strstr(text, name); /* its first mention: checked there */
            if (seen && seen != q - 1) continue;
        }
        snprintf(file, sizeof file, "%.*s%s%.*s", dl, path, slash ? "/" : "", (int)(p - q - 1), q);
        rc = gpt2_init_check_file(file, err, n);
    }
    free(text);
    return rc;
}

/* ---- the parameter table ----------------------------------------------------------------- */

/* The tensors of one block, in Hugging Face's order (Conv1D weights are [in, out]). */
enum {
    GPT2_LN1_W, GPT2_LN1_B, GPT2_QKV_W, GPT2_QKV_B, GPT2_ATTPROJ_W, GPT2_ATTPROJ_B,
    GPT2_LN2_W, GPT2_LN2_B, GPT2_FC_W, GPT2_FC_B, GPT2_FCPROJ_W, GPT2_FCPROJ_B,
    GPT2_BLOCK_TENSORS
};
/* The embeddings group (group 0): wte (also the LM head: tied), wpe and the final norm. */
enum { GPT2_WTE, GPT2_WPE, GPT2_LNF_W, GPT2_LNF_B, GPT2_EMB_TENSORS };

typedef struct gpt2_tensor {
    char name[64];
    int ndim;
    uint64_t dims[2];
    size_t numel;
    int group;      /* 0 = embeddings, 1 + l = block l */
    unsigned flags; /* ZERO_TENSOR_NO_DECAY on everything that is not 2-D */
    int id;         /* the engine's tensor id (gpt2_add_tensors)          */
    size_t offset;  /* in the group's buffer (gpt2_offsets)               */
} gpt2_tensor;

/* Tensors: GPT2_EMB_TENSORS, then GPT2_BLOCK_TENSORS per block. */
static inline int gpt2_num_tensors(const gpt2_config *c)
{
    return GPT2_EMB_TENSORS + GPT2_BLOCK_TENSORS * c->layers;
}
/* Index in the table of tensor k (GPT2_LN1_W ...) of block l. */
static inline int gpt2_block_tensor(int l, int k) { return GPT2_EMB_TENSORS + GPT2_BLOCK_TENSORS * l + k; }

/* Fills t[gpt2_num_tensors(c)] with every parameter's HF name, shape, group and flags. */
static inline void gpt2_param_table(const gpt2_config *c, gpt2_tensor *t)
{
    static const char *const suffix[GPT2_BLOCK_TENSORS] = {
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
        "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
    uint64_t C = (uint64_t)c->channels;
    /* [in, out] of each block weight, [n] of each vector */
    uint64_t d0[GPT2_BLOCK_TENSORS] = {C, C, C, 3 * C, C, C, C, C, C, 4 * C, 4 * C, C};
    uint64_t d1[GPT2_BLOCK_TENSORS] = {0, 0, 3 * C, 0, C, 0, 0, 0, 4 * C, 0, C, 0};
    int i, l, k;
    memset(t, 0, sizeof *t * (size_t)gpt2_num_tensors(c));
    snprintf(t[GPT2_WTE].name, sizeof t->name, "transformer.wte.weight");
    t[GPT2_WTE].ndim = 2, t[GPT2_WTE].dims[0] = (uint64_t)c->vocab, t[GPT2_WTE].dims[1] = C;
    snprintf(t[GPT2_WPE].name, sizeof t->name, "transformer.wpe.weight");
    t[GPT2_WPE].ndim = 2, t[GPT2_WPE].dims[0] = (uint64_t)c->max_seq, t[GPT2_WPE].dims[1] = C;
    snprintf(t[GPT2_LNF_W].name, sizeof t->name, "transformer.ln_f.weight");
    snprintf(t[GPT2_LNF_B].name, sizeof t->name, "transformer.ln_f.bias");
    t[GPT2_LNF_W].ndim = t[GPT2_LNF_B].ndim = 1;
    t[GPT2_LNF_W].dims[0] = t[GPT2_LNF_B].dims[0] = C;
    for (l = 0; l < c->layers; l++)
        for (k = 0; k < GPT2_BLOCK_TENSORS; k++) {
            gpt2_tensor *x = &t[gpt2_block_tensor(l, k)];
            snprintf(x->name, sizeof x->name, "transformer.h.%d.%s", l, suffix[k]);
            x->group = 1 + l;
            x->dims[0] = d0[k];
            x->dims[1] = d1[k];
            x->ndim = d1[k] ? 2 : 1;
        }
    for (i = 0; i < gpt2_num_tensors(c); i++) {
        t[i].numel = (size_t)t[i].dims[0] * (size_t)(t[i].ndim == 2 ? t[i].dims[1] : 1);
        t[i].flags = t[i].ndim == 2 ? 0u : ZERO_TENSOR_NO_DECAY; /* decay 2-D weights only */
    }
}

/* Marks the tensors --freeze names ZERO_TENSOR_FROZEN: "wte", "wpe", "ln_f" (its weight and
   bias), "h.N" (every tensor of block N) and "h.A-B" (blocks A..B), comma-separated.
   Returns 0, or -1 with a message in why naming the item that is not one of them. */
static inline int gpt2_mark_frozen(const gpt2_config *c, gpt2_tensor *t, const char *list, char *why, size_t n)
{
    const char *p = list;
    while (p && *p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char item[64];
        int a = -1, b = -1, k, used = 0;
        if (len == 0 || len >= sizeof item) {
            snprintf(why, n, "--freeze: empty or overlong item in '%s'", list);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (!strcmp(item, "wte")) t[GPT2_WTE].flags |= ZERO_TENSOR_FROZEN;
        else if (!strcmp(item, "wpe")) t[GPT2_WPE].flags |= ZERO_TENSOR_FROZEN;
        else if (!strcmp(item, "ln_f")) t[GPT2_LNF_W].flags |= ZERO_TENSOR_FROZEN, t[GPT2_LNF_B].flags |= ZERO_TENSOR_FROZEN;
        else if ((sscanf(item, "h.%d-%d%n", &a, &b, &used) == 2 || (sscanf(item, "h.%d%n", &a, &used) == 1 && (b = a) >= 0)) &&
                 used == (int)len && a >= 0 && a <= b && b < c->layers) {
            for (; a <= b; a++)
                for (k = 0; k < GPT2_BLOCK_TENSORS; k++) t[gpt2_block_tensor(a, k)].flags |= ZERO_TENSOR_FROZEN;
        } else {
            snprintf(why, n, "--freeze: '%s' is not wte, wpe, ln_f, h.N or h.A-B with blocks 0..%d", item,
                     c->layers - 1);
            return -1;
        }
        p = end ? end + 1 : NULL;
    }
    return 0;
}

/* Group of tile k when wte is registered in tiles (--tile-embedding K): after the blocks,
   so block l stays group 1 + l and group 0 keeps wpe and ln_f. */
static inline int gpt2_tile_group(const gpt2_config *c, int k) { return 1 + c->layers + k; }

/* Registers the table's tensors (with shapes) and records their ids. tiles > 0: wte as that
   many tile groups (zero_engine_add_tiled_tensor, groups gpt2_tile_group(c, 0..tiles-1)),
   its table entry's id set to -1 and tile 0's id in *wte_tile0 (tile k: zero_engine_tile_view). */
static inline zero_result gpt2_add_tensors_tiled(zero_engine *e, const gpt2_config *c, gpt2_tensor *t, int tiles,
                                                 int *wte_tile0)
{
    int i;
    for (i = 0; i < gpt2_num_tensors(c); i++) {
        zero_result r;
        if (i == GPT2_WTE && tiles > 0) continue;
        r = zero_engine_add_tensor_shape(e, t[i].name, t[i].ndim, t[i].dims, t[i].group, t[i].flags, &t[i].id);
        if (r != ZERO_OK) return r;
    }
    if (tiles <= 0) return ZERO_OK;
    t[GPT2_WTE].id = -1;
    return zero_engine_add_tiled_tensor(e, t[GPT2_WTE].name, (size_t)t[GPT2_WTE].dims[0], (size_t)t[GPT2_WTE].dims[1],
                                        tiles, gpt2_tile_group(c, 0), t[GPT2_WTE].flags, wte_tile0);
}

/* Registers the table's tensors (with shapes) and records their ids. */
static inline zero_result gpt2_add_tensors(zero_engine *e, const gpt2_config *c, gpt2_tensor *t)
{
    return gpt2_add_tensors_tiled(e, c, t, 0, NULL);
}

/* After commit: each tensor's offset in its group's buffer (a tiled wte: zero_engine_tile_view). */
static inline zero_result gpt2_offsets(const zero_plan *plan, const gpt2_config *c, gpt2_tensor *t)
{
    int i;
    for (i = 0; i < gpt2_num_tensors(c); i++) {
        zero_tensor_info ti;
        zero_result r;
        if (t[i].id < 0) continue;
        memset(&ti, 0, sizeof ti);
        r = zero_plan_tensor(plan, t[i].id, &ti);
        if (r != ZERO_OK) return r;
        t[i].offset = ti.offset;
    }
    return ZERO_OK;
}

/* ---- deterministic initial values -------------------------------------------------------- */

/* splitmix64: one 64-bit state, one step per draw. */
static inline uint64_t gpt2_rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform in [0, 1) with 53 bits */
static inline double gpt2_rng_uniform(uint64_t *s) { return (double)(gpt2_rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }
/* standard normal (Box-Muller, one value per two draws) */
static inline double gpt2_rng_normal(uint64_t *s)
{
    double u1 = gpt2_rng_uniform(s), u2 = gpt2_rng_uniform(s);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.28318530717958647692 * u2);
}

/* ---- dropout masks (docs/gpt2.md, "Dropout") ---------------------------------------------- */

/* A mask element is a pure function of where it is, so any rank, stage or recomputation
   draws the same one: for the stream key K(seed, step, micro, layer, site) and the index i of
   the element in the global batch's tensor (row-major: [B, T, C] for the embeddings and the
   residual branches, [B, H, T, T] for the attention probabilities), with mix the splitmix64
   finalizer and G = 0x9e3779b97f4a7c15, all arithmetic mod 2^64:
     K = mix(mix(mix(mix(mix(seed) ^ step) ^ micro) ^ layer) ^ site)
     u(i) = mix(K + (i + 1) G) >> 40                      (24 bits)
     keep(i) = u(i) >= round(P 2^24), and a kept element is multiplied by float(1 / (1 - P)).
   Sites: GPT2_DROP_EMBD (layer 0: wte + wpe), GPT2_DROP_ATTN (the softmax), GPT2_DROP_ATTN_RESID
   (attn.c_proj's output), GPT2_DROP_MLP_RESID (mlp.c_proj's output). tests/gpt2_finetune.py
   computes the same in numpy. */
enum { GPT2_DROP_EMBD = 0, GPT2_DROP_ATTN = 1, GPT2_DROP_ATTN_RESID = 2, GPT2_DROP_MLP_RESID = 3 };
#define GPT2_DROP_G 0x9e3779b97f4a7c15ull

static inline uint64_t gpt2_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t gpt2_dropout_key(uint64_t seed, uint64_t step, uint64_t micro, uint64_t layer, uint64_t site)
{
    return gpt2_mix64(gpt2_mix64(gpt2_mix64(gpt2_mix64(gpt2_mix64(seed) ^ step) ^ micro) ^ layer) ^ site);
}

/* round(P 2^24): u(i) below it is dropped */
static inline uint32_t gpt2_dropout_threshold(double p) { return (uint32_t)(p * 16777216.0 + 0.5); }

static inline int gpt2_dropout_keep(uint64_t key, uint64_t i, uint32_t thr)
{
    return (uint32_t)(gpt2_mix64(key + (i + 1) * GPT2_DROP_G) >> 40) >= thr;
}

/* x[j] for j in [0, n), element i0 + j of its global tensor, times its mask: 0 or scale. */
static inline void gpt2_dropout_apply(float *x, size_t n, uint64_t key, uint64_t i0, uint32_t thr, float scale)
{
    size_t j;
    for (j = 0; j < n; j++) x[j] = gpt2_dropout_keep(key, i0 + j, thr) ? x[j] * scale : 0.0f;
}

/* out[j] = x[j] times its mask (out may be x). */
static inline void gpt2_dropout_copy(float *out, const float *x, size_t n, uint64_t key, uint64_t i0, uint32_t thr,
                                     float scale)
{
    size_t j;
    for (j = 0; j < n; j++) out[j] = gpt2_dropout_keep(key, i0 + j, thr) ? x[j] * scale : 0.0f;
}

/* ---- sampling (both examples' generate) -------------------------------------------------- */

/* One token drawn with rng from the softmax of the logits z[0..V): the maximum subtracted, a
   float sum of the exponentials, the draw walked in double. */
static inline int gpt2_sample_token(const float *z, int V, uint64_t *rng)
{
    double u, acc = 0.0;
    float mx = -INFINITY, sum = 0.0f;
    int v;
    for (v = 0; v < V; v++)
        if (z[v] > mx) mx = z[v];
    for (v = 0; v < V; v++) sum += expf(z[v] - mx);
    u = gpt2_rng_uniform(rng) * sum;
    for (v = 0; v < V - 1; v++)
        if ((acc += expf(z[v] - mx)) > u) break;
    return v;
}

/* Whether the data is text (bytes as tokens): no path (the default corpus) or a path that
   does not end in .bin (llm.c's token files). */
static inline int gpt2_data_is_text(const char *path)
{
    size_t n = path ? strlen(path) : 0;
    return path == NULL || n < 4 || strcmp(path + n - 4, ".bin");
}

/* Writes tokens tok[0..len) into out from out[used] (cap bytes in all): text data as the
   bytes, unprintable ones as '?'; token files as the ids. Stops 8 bytes short of cap;
   returns the new used (out not terminated). */
static inline size_t gpt2_sample_format(const int *tok, int len, int text, char *out, size_t cap, size_t used)
{
    int i;
    for (i = 0; i < len && used + 8 < cap; i++) {
        if (text) {
            int ch = tok[i];
            out[used++] = (char)((ch >= 32 && ch < 127) || ch == '\n' || ch == '\t' ? ch : '?');
        } else
            used += (size_t)snprintf(out + used, cap - used, "%d ", tok[i]);
    }
    return used;
}

/* ---- a vocabulary to print tokens as text (--tokenizer) --------------------------------- */

/* Token id -> its bytes, from a Hugging Face tokenizer.json: model.vocab ({"string": id}) and
   added_tokens ([{"id": N, "content": "..."}], printed as their content). With a ByteLevel
   decoder (GPT-2's byte-level BPE) each character of a vocab string stands for one byte by
   GPT-2's bytes_to_unicode (bytes 33-126, 161-172 and 174-255 are their own code points;
   the other 68, in order, are 256-323): decoding undoes that map. Other decoders: the
   strings as they are. */
typedef struct gpt2_vocab {
    char **str;   /* [n]: id's bytes (NULL: no such id in the file) */
    size_t *len;  /* [n]                                           */
    int n;        /* ids 0 .. n - 1                                */
    int byte_level;
} gpt2_vocab;

static inline void gpt2_vocab_free(gpt2_vocab *v)
{
    int i;
    for (i = 0; v->str && i < v->n; i++) free(v->str[i]);
    free(v->str);
    free(v->len);
    memset(v, 0, sizeof *v);
}

static inline const char *gpt2__json_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

static inline size_t gpt2__utf8_put(char *out, uint32_t cp)
{
    if (cp < 0x80) return out[0] = (char)cp, 1;
    if (cp < 0x800) return out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return out[0] = (char)(0xe0 | cp >> 12), out[1] = (char)(0x80 | (cp >> 6 & 63)), out[2] = (char)(0x80 | (cp & 63)), 3;
    out[0] = (char)(0xf0 | cp >> 18), out[1] = (char)(0x80 | (cp >> 12 & 63)), out[2] = (char)(0x80 | (cp >> 6 & 63));
    out[3] = (char)(0x80 | (cp & 63));
    return 4;
}

static inline int gpt2__hex4(const char *p, uint32_t *out)
{
    int k;
    *out = 0;
    for (k = 0; k < 4; k++) {
        char c = p[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *out = *out << 4 | (uint32_t)d;
    }
    return 0;
}

/* The JSON string at *p (its opening quote) as UTF-8 into out (cap >= its escaped length +
   1, which bounds the decoded one); *p moves past the closing quote. Its length, or -1. */
static inline long gpt2__json_string(const char **p, char *out, size_t cap)
{
    const char *q = *p;
    size_t n = 0;
    if (*q++ != '"') return -1;
    while (*q && *q != '"') {
        uint32_t cp, lo;
        if (n + 5 > cap) return -1;
        if (*q != '\\') {
            out[n++] = *q++;
            continue;
        }
        q++;
        switch (*q) {
        case '"': case '\\': case '/': out[n++] = *q; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u':
            if (gpt2__hex4(q + 1, &cp) != 0) return -1;
            q += 4;
            if (cp >= 0xd800 && cp < 0xdc00) { /* a surrogate pair */
                if (q[1] != '\\' || q[2] != 'u' || gpt2__hex4(q + 3, &lo) != 0 || lo < 0xdc00 || lo >= 0xe000) return -1;
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                q += 6;
            }
            n += gpt2__utf8_put(out + n, cp);
            break;
        default: return -1;
        }
        q++;
    }
    if (*q != '"') return -1;
    *p = q + 1;
    out[n] = '\0';
    return (long)n;
}

/* Past the JSON value at p (strings, numbers, literals, nested objects and arrays); NULL if
   it is malformed. */
static inline const char *gpt2__json_skip(const char *p)
{
    int depth = 0;
    p = gpt2__json_ws(p);
    do {
        if (*p == '"') {
            for (p++; *p && *p != '"'; p++)
                if (*p == '\\' && p[1]) p++;
            if (!*p) return NULL;
            p++;
        } else if (*p == '{' || *p == '[') {
            depth++, p++;
        } else if (*p == '}' || *p == ']') {
            if (--depth < 0) return NULL;
            p++;
        } else if (*p) {
            p++;
            if (depth == 0) /* a number or literal: to its end */
                while (*p && !strchr(",}] \t\r\n", *p)) p++;
        } else {
            return NULL;
        }
        if (depth > 0) p = gpt2__json_ws(p);
    } while (depth > 0);
    return p;
}

/* The value of the top-level key of the JSON object text (past its colon), or NULL. */
static inline const char *gpt2__json_member(const char *text, const char *key)
{
    const char *p = gpt2__json_ws(text);
    size_t kl = strlen(key);
    if (*p++ != '{') return NULL;
    for (;;) {
        const char *k;
        size_t klen;
        p = gpt2__json_ws(p);
        if (*p != '"') return NULL;
        k = p + 1;
        if (!(p = gpt2__json_skip(p))) return NULL;
        klen = (size_t)(p - 1 - k); /* the key as written (no key we look for has escapes) */
        p = gpt2__json_ws(p);
        if (*p++ != ':') return NULL;
        if (klen == kl && !strncmp(k, key, kl)) return gpt2__json_ws(p);
        if (!(p = gpt2__json_skip(p))) return NULL;
        p = gpt2__json_ws(p);
        if (*p++ != ',') return NULL;
    }
}

/* Sets id's bytes (from a string of n bytes, byte-level mapped when bl). 0, or -1. */
static inline int gpt2__vocab_set(gpt2_vocab *v, long id, const char *s, size_t n, int bl)
{
    char *out;
    size_t i = 0, k = 0;
    if (id < 0 || id >= v->n || v->str[id]) return -1;
    if (!(out = (char *)malloc(n + 1))) return -1;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        uint32_t cp = c;
        size_t len = 1;
        if (bl && c >= 0x80) { /* the byte-level alphabet lies below U+0800: 1 or 2 bytes */
            len = c >= 0xc0 ? (c >= 0xe0 ? (c >= 0xf0 ? 4 : 3) : 2) : 1;
            cp = 0x110000; /* none of the alphabet unless a whole 2-byte character */
            if (len == 2 && i + 1 < n) cp = (uint32_t)(c & 31) << 6 | ((unsigned char)s[i + 1] & 63);
        }
        if (bl && ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))) {
            out[k++] = (char)cp;
        } else if (bl && cp >= 256 && cp < 256 + 68) { /* the n-th byte outside those ranges */
            int b, m = -1;
            for (b = 0; b < 256; b++)
                if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) && ++m == (int)(cp - 256)) break;
            out[k++] = (char)b;
        } else { /* not a byte-level character: its UTF-8 as it is */
            memcpy(out + k, s + i, len <= n - i ? len : n - i);
            k += len <= n - i ? len : n - i;
        }
        i += len;
    }
    out[k] = '\0';
    v->str[id] = out;
    v->len[id] = k;
    return 0;
}

/* Loads path (a tokenizer.json, or a directory holding one) into v. 0, or -1 with a
   sentence in err. */
static inline int gpt2_vocab_load(const char *path, gpt2_vocab *v, char *err, size_t n)
{
    char file[4200], *text = NULL, *buf = NULL;
    const char *p, *dec;
    struct stat st;
    FILE *f;
    long len = -1, maxid = -1, id;
    int pass, rc = -1;
    memset(v, 0, sizeof *v);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(file, sizeof file, "%s/tokenizer.json", path);
    else snprintf(file, sizeof file, "%s", path);
    if (!(f = fopen(file, "rb"))) {
        snprintf(err, n, "--tokenizer %.300s: cannot open it: %s", file, strerror(errno));
        return -1;
    }
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 && len < (1L << 28) && fseek(f, 0, SEEK_SET) == 0 &&
        (text = (char *)malloc((size_t)len + 1)) != NULL && (buf = (char *)malloc((size_t)len + 1)) != NULL &&
        fread(text, 1, (size_t)len, f) == (size_t)len)
        text[len] = '\0', rc = 0;
    fclose(f);
    if (rc != 0) {
        snprintf(err, n, "--tokenizer %.300s: unreadable (or not 1 B to 256 MB)", file);
        goto out;
    }
    rc = -1;
    dec = gpt2__json_member(text, "decoder");
    if (dec && *dec == '{') { /* ByteLevel, alone or in a Sequence's decoders */
        const char *end = gpt2__json_skip(dec);
        const char *hit = strstr(dec, "\"ByteLevel\"");
        v->byte_level = hit && end && hit < end;
    }
    p = gpt2__json_member(text, "model");
    if (!p || *p != '{' || !(p = gpt2__json_member(p, "vocab")) || *p != '{') {
        snprintf(err, n, "--tokenizer %.300s: no model.vocab object (a Hugging Face tokenizer.json has one)", file);
        goto out;
    }
    for (pass = 0; pass < 2; pass++) { /* the largest id, then the strings */
        const char *q = gpt2__json_ws(p + 1), *a;
        while (*q == '"') {
            long sl = gpt2__json_string(&q, buf, (size_t)len + 1);
            char *e;
            q = gpt2__json_ws(q);
            if (sl < 0 || *q != ':') break;
            q = gpt2__json_ws(q + 1);
            id = strtol(q, &e, 10);
            if (e == q || id < 0 || id >= (1L << 24)) break;
            if (pass == 0 && id > maxid) maxid = id;
            if (pass == 1 && gpt2__vocab_set(v, id, buf, (size_t)sl, v->byte_level) != 0) break;
            q = gpt2__json_ws(e);
            if (*q == ',') q = gpt2__json_ws(q + 1);
        }
        if (*q != '}') {
            snprintf(err, n, "--tokenizer %.300s: model.vocab is malformed near byte %ld (or an id repeats)", file,
                     (long)(q - text));
            goto out;
        }
        a = gpt2__json_member(text, "added_tokens");
        for (a = a && *a == '[' ? gpt2__json_ws(a + 1) : NULL; a && *a == '{';) { /* {"id": N, "content": "..."} */
            const char *c = gpt2__json_member(a, "content"), *i = gpt2__json_member(a, "id");
            long sl = c && *c == '"' ? gpt2__json_string(&c, buf, (size_t)len + 1) : -1;
            id = i ? strtol(i, NULL, 10) : -1;
            if (sl < 0 || id < 0 || id >= (1L << 24)) {
                snprintf(err, n, "--tokenizer %.300s: an added token without an id or content", file);
                goto out;
            }
            if (pass == 0 && id > maxid) maxid = id;
            if (pass == 1 && v->str[id] == NULL && gpt2__vocab_set(v, id, buf, (size_t)sl, 0) != 0) {
                snprintf(err, n, "--tokenizer %.300s: out of memory", file);
                goto out;
            }
            if (!(a = gpt2__json_skip(a))) break;
            a = gpt2__json_ws(a);
            if (*a == ',') a = gpt2__json_ws(a + 1);
        }
        if (pass == 0) {
            v->n = (int)maxid + 1;
            v->str = (char **)calloc((size_t)v->n + 1, sizeof(char *));
            v->len = (size_t *)calloc((size_t)v->n + 1, sizeof(size_t));
            if (!v->str || !v->len) {
                snprintf(err, n, "--tokenizer %.300s: out of memory for %d tokens", file, v->n);
                goto out;
            }
        }
    }
    rc = 0;
out:
    free(text);
    free(buf);
    if (rc != 0) gpt2_vocab_free(v);
    return rc;
}

/* Writes tokens tok[0..len) as text into out from out[used] (cap bytes in all): each id's
   bytes, control bytes other than newline and tab as '?', an id the vocabulary lacks as
   [id]. Stops 8 bytes short of cap; returns the new used (out not terminated). */
static inline size_t gpt2_vocab_format(const gpt2_vocab *v, const int *tok, int len, char *out, size_t cap, size_t used)
{
    int i;
    size_t k;
    for (i = 0; i < len && used + 8 < cap; i++) {
        if (tok[i] < 0 || tok[i] >= v->n || !v->str[tok[i]]) {
            used += (size_t)snprintf(out + used, cap - used, "[%d]", tok[i]);
            continue;
        }
        for (k = 0; k < v->len[tok[i]] && used + 8 < cap; k++) {
            unsigned char c = (unsigned char)v->str[tok[i]][k];
            out[used++] = (char)(c < 32 && c != '\n' && c != '\t' ? '?' : c == 127 ? '?' : c);
        }
    }
    return used;
}

/* --decode: the tokens of an llm.c .bin file (256 int32 header: magic 20240520, version 1,
   count; uint16 tokens) written to out as v's bytes, exactly (an id v lacks as [id]). 0, or
   -1 with a sentence in err. */
static inline int gpt2_decode_bin(const gpt2_vocab *v, const char *path, FILE *out, char *err, size_t n)
{
    int32_t hdr[256];
    uint16_t buf[4096];
    long long left;
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, n, "--decode %.300s: cannot open it: %s", path, strerror(errno));
        return -1;
    }
    if (fread(hdr, sizeof hdr, 1, f) != 1 || hdr[0] != GPT2_BIN_MAGIC || hdr[1] != 1 || hdr[2] < 0) {
        snprintf(err, n, "--decode %.300s: not an llm.c token file (magic %d, version 1)", path, GPT2_BIN_MAGIC);
        fclose(f);
        return -1;
    }
    for (left = hdr[2]; left > 0;) {
        size_t want = left < 4096 ? (size_t)left : 4096, got = fread(buf, sizeof(uint16_t), want, f), i;
        for (i = 0; i < got; i++) {
            if (buf[i] < v->n && v->str[buf[i]]) fwrite(v->str[buf[i]], 1, v->len[buf[i]], out);
            else fprintf(out, "[%d]", (int)buf[i]);
        }
        if (got != want) {
            snprintf(err, n, "--decode %.300s: %lld tokens short of its header's %d", path, left - (long long)got,
                     (int)hdr[2]);
            fclose(f);
            return -1;
        }
        left -= (long long)got;
    }
    fclose(f);
    return 0;
}

/* The sample's text: through o->vocab when there is one, else gpt2_sample_format. */
static inline size_t gpt2_sample_text(const gpt2_opts *o, const int *tok, int len, char *out, size_t cap, size_t used)
{
    if (o->vocab) return gpt2_vocab_format(o->vocab, tok, len, out, cap, used);
    return gpt2_sample_format(tok, len, gpt2_data_is_text(o->data_path), out, cap, used);
}

/* GPT-2's initialisation: weights N(0, 0.02), the two residual projections (attn.c_proj,
   mlp.c_proj) N(0, 0.02 / sqrt(2 L)), biases 0, LayerNorm weights 1. Tensor i draws from
   its own stream (seed, i), so values do not depend on ranks or stages. vals holds the
   tensor's numel floats. */
static inline void gpt2_init_values(const gpt2_config *c, const gpt2_tensor *t, int i, uint64_t seed, float *vals)
{
    size_t n = t[i].numel, j;
    int k = i >= GPT2_EMB_TENSORS ? (i - GPT2_EMB_TENSORS) % GPT2_BLOCK_TENSORS : -1;
    int is_ln_w = i == GPT2_LNF_W || k == GPT2_LN1_W || k == GPT2_LN2_W;
    uint64_t s = seed * 0x100000001b3ull + (uint64_t)i * 0x9e3779b97f4a7c15ull;
    double std = 0.02;
    if (k == GPT2_ATTPROJ_W || k == GPT2_FCPROJ_W) std = 0.02 / sqrt(2.0 * c->layers);
    for (j = 0; j < n; j++)
        vals[j] = t[i].ndim == 2 ? (float)(std * gpt2_rng_normal(&s)) : (is_ln_w ? 1.0f : 0.0f);
}

/* Sets every tensor to its initial value (the same on every rank); a wte registered in
   'tiles' tiles (gpt2_add_tensors_tiled, tile 0 = wte_tile0) gets each tile's rows of the
   same values. */
static inline zero_result gpt2_set_init_tiled(zero_engine *e, const gpt2_config *c, const gpt2_tensor *t,
                                              uint64_t seed, int tiles, int wte_tile0)
{
    size_t most = 0;
    int i, k;
    float *vals;
    zero_result r = ZERO_OK;
    for (i = 0; i < gpt2_num_tensors(c); i++)
        if (t[i].numel > most) most = t[i].numel;
    vals = (float *)malloc(most * sizeof(float));
    if (!vals) return ZERO_ERROR_OUT_OF_MEMORY;
    for (i = 0; i < gpt2_num_tensors(c) && r == ZERO_OK; i++) {
        gpt2_init_values(c, t, i, seed, vals);
        if (t[i].id >= 0) {
            r = zero_engine_set_tensor(e, t[i].id, vals);
            continue;
        }
        for (k = 0; k < tiles && r == ZERO_OK; k++) {
            zero_tile_view v;
            memset(&v, 0, sizeof v); /* gcc -O3 cannot see tile_view fill it */
            r = zero_engine_tile_view(e, wte_tile0, k, &v);
            if (r == ZERO_OK) r = zero_engine_set_tensor(e, v.tensor, vals + v.row0 * v.cols);
        }
    }
    free(vals);
    return r;
}

static inline zero_result gpt2_set_init(zero_engine *e, const gpt2_config *c, const gpt2_tensor *t, uint64_t seed)
{
    return gpt2_set_init_tiled(e, c, t, seed, 0, -1);
}

/* ---- data -------------------------------------------------------------------------------- */

/* Tokens of one corpus: the train split first, then the validation split (the last tenth).
   Text (a directory of files, or one file) is bytes, one token each; files in a directory
   are the regular files directly in it (links followed), in strcmp order of their names,
   concatenated. A file ending in .bin is llm.c's format: 256 int32 header (magic 20240520,
   version 1, token count) and uint16 tokens. */
typedef struct gpt2_data {
    int32_t *tokens;
    size_t ntrain, nval; /* tokens[0, ntrain) train, tokens[ntrain, ntrain + nval) val */
} gpt2_data;

static inline void gpt2_data_free(gpt2_data *d)
{
    free(d->tokens);
    memset(d, 0, sizeof *d);
}

static inline int gpt2__cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends the bytes of file path, at most 'most' of them (its size when it was listed), to
   *buf (capacity *cap, length *len). 0 or -1. */
static inline int gpt2__append_file(const char *path, size_t most, unsigned char **buf, size_t *len, size_t *cap)
{
    FILE *f = fopen(path, "rb");
    size_t got, end = *len + most;
    if (!f) return -1;
    for (;;) {
        if (*len >= end) break;
        if (*cap - *len < 65536) {
            size_t nc = *cap * 2 + 65536;
            unsigned char *nb = (unsigned char *)realloc(*buf, nc);
            if (!nb) {
                fclose(f);
                return -1;
            }
            *buf = nb, *cap = nc;
        }
        got = fread(*buf + *len, 1, *cap - *len < end - *len ? *cap - *len : end - *len, f);
        *len += got;
        if (got == 0) break;
    }
    got = (size_t)ferror(f);
    fclose(f);
    return got ? -1 : 0;
}

/* Refuses (-1, a sentence in err) a corpus of 'bytes' that cannot be loaded in the memory
   this process may use: text takes 5 bytes per byte (the bytes, then an int32 token each),
   an llm.c file 3 (its uint16 tokens become int32). */
static inline int gpt2__data_fits(const char *path, double bytes, int text, char *err, size_t errlen)
{
    double need = bytes * (text ? 5.0 : 3.0), lim = gpt2_memory_limit();
    if (lim > 0 && need > lim) {
        snprintf(err, errlen, "--data %s: %.0f bytes of files need about %.2f GB of memory to load; the limit "
                 "here is %.2f GB (physical memory, or ulimit -v)", path, bytes, need / 1e9, lim / 1e9);
        return -1;
    }
    return 0;
}

/* Loads path (NULL = GPT2_DEFAULT_DATA) for a model of vocab V and sequence length T: a
   directory or a regular file (never a device or a FIFO, which could block or never end),
   each file read up to the size it had when listed. On failure returns -1 with a sentence
   in err. */
static inline int gpt2__data_read(const char *path, const char *flag, int split, int V, int T, gpt2_data *d, char *err,
                                  size_t errlen)
{
    struct stat st;
    size_t n = 0, i, len = 0, cap = 0;
    unsigned char *buf = NULL;
    memset(d, 0, sizeof *d);
    if (!path) path = GPT2_DEFAULT_DATA;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s %s: no such file or directory", flag, path);
        return -1;
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s %s: not a regular file or a directory (a device or a FIFO is not read)", flag, path);
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *dir = opendir(path);
        struct dirent *de;
        char **names = NULL;
        size_t count = 0, ncap = 0, nread;
        double total = 0.0;
        if (!dir) {
            snprintf(err, errlen, "%s %s: cannot open the directory", flag, path);
            return -1;
        }
        while ((de = readdir(dir)) != NULL) {
            char full[4096];
            struct stat fs;
            if (de->d_name[0] == '.') continue;
            snprintf(full, sizeof full, "%s/%s", path, de->d_name);
            if (stat(full, &fs) != 0 || !S_ISREG(fs.st_mode)) continue;
            if (count == ncap) {
                char **nn = (char **)realloc(names, sizeof(char *) * (ncap = ncap * 2 + 16));
                if (!nn) break;
                names = nn;
            }
            names[count] = (char *)malloc(strlen(de->d_name) + 1);
            if (!names[count]) break;
            strcpy(names[count++], de->d_name);
            total += (double)fs.st_size;
        }
        closedir(dir);
        if (count) qsort(names, count, sizeof(char *), gpt2__cmp_names);
        nread = gpt2__data_fits(path, total, 1, err, errlen) != 0 ? 0 : count;
        for (i = 0; i < nread; i++) {
            char full[4096];
            struct stat fs;
            snprintf(full, sizeof full, "%s/%s", path, names[i]);
            if (stat(full, &fs) != 0 || !S_ISREG(fs.st_mode) ||
                gpt2__append_file(full, (size_t)fs.st_size, &buf, &len, &cap) != 0) {
                snprintf(err, errlen, "%s: cannot read %.200s", flag, full);
                len = 0;
                break;
            }
        }
        for (i = 0; i < count; i++) free(names[i]);
        free(names);
        if (!buf || len == 0) {
            if (err[0] == '\0') snprintf(err, errlen, "%s %s: no text in its files", flag, path);
            free(buf);
            return -1;
        }
    } else if (gpt2__data_fits(path, (double)st.st_size, gpt2_data_is_text(path), err, errlen) != 0) {
        return -1;
    } else if (gpt2__append_file(path, (size_t)st.st_size, &buf, &len, &cap) != 0) {
        snprintf(err, errlen, "%s %s: cannot read it", flag, path);
        free(buf);
        return -1;
    }
    if (!gpt2_data_is_text(path)) { /* llm.c tokens */
        int32_t hdr[256];
        if (len < sizeof hdr) {
            snprintf(err, errlen, "%s %s: shorter than llm.c's 1024-byte header", flag, path);
            free(buf);
            return -1;
        }
        memcpy(hdr, buf, sizeof hdr);
        if (hdr[0] != GPT2_BIN_MAGIC || hdr[1] != 1 || hdr[2] < 0 ||
            (size_t)hdr[2] * 2 > len - sizeof hdr) {
            snprintf(err, errlen, "%s %s: not an llm.c token file (magic %d, version %d, %d tokens)",
                     flag, path, (int)hdr[0], (int)hdr[1], (int)hdr[2]);
            free(buf);
            return -1;
        }
        n = (size_t)hdr[2];
        d->tokens = (int32_t *)malloc(sizeof(int32_t) * (n ? n : 1));
        for (i = 0; d->tokens && i < n; i++) {
            uint16_t tk;
            memcpy(&tk, buf + sizeof hdr + 2 * i, 2);
            d->tokens[i] = tk;
            if ((int)tk >= V) {
                snprintf(err, errlen, "%s %s: token %u at %zu is outside --vocab %d", flag, path, (unsigned)tk, i, V);
                free(buf);
                gpt2_data_free(d);
                return -1;
            }
        }
    } else {
        if (V < 256) {
            snprintf(err, errlen, "%s %s: text is bytes and needs --vocab >= 256 (it is %d)", flag, path, V);
            free(buf);
            return -1;
        }
        n = len;
        d->tokens = (int32_t *)malloc(sizeof(int32_t) * (n ? n : 1));
        for (i = 0; d->tokens && i < n; i++) d->tokens[i] = buf[i];
    }
    free(buf);
    if (!d->tokens) {
        snprintf(err, errlen, "%s %s: out of memory", flag, path);
        return -1;
    }
    d->nval = split ? n / 10 : 0;
    d->ntrain = n - d->nval;
    if (d->ntrain < (size_t)T + 1 || (split && d->nval < (size_t)T + 1)) {
        snprintf(err, errlen, "%s %s: %zu tokens are too few for sequences of %d (each split needs %d)",
                 flag, path, n, T, T + 1);
        gpt2_data_free(d);
        return -1;
    }
    return 0;
}

/* Loads path for a model of vocab V and sequence length T, its last tenth the validation
   split. -1 with a sentence in err on failure. */
static inline int gpt2_data_load(const char *path, int V, int T, gpt2_data *d, char *err, size_t errlen)
{
    return gpt2__data_read(path, "--data", 1, V, T, d, err, errlen);
}

/* --data path --val-data val_path: every token of path trains, every token of val_path
   (the same formats) validates; val_path NULL: gpt2_data_load. */
static inline int gpt2_data_load_val(const char *path, const char *val_path, int V, int T, gpt2_data *d, char *err,
                                     size_t errlen)
{
    gpt2_data v;
    int32_t *both;
    if (!val_path) return gpt2_data_load(path, V, T, d, err, errlen);
    if (gpt2__data_read(path, "--data", 0, V, T, d, err, errlen) != 0) return -1;
    if (gpt2__data_read(val_path, "--val-data", 0, V, T, &v, err, errlen) != 0) {
        gpt2_data_free(d);
        return -1;
    }
    both = (int32_t *)realloc(d->tokens, sizeof(int32_t) * (d->ntrain + v.ntrain));
    if (!both) {
        snprintf(err, errlen, "--val-data %s: out of memory", val_path);
        gpt2_data_free(&v);
        gpt2_data_free(d);
        return -1;
    }
    memcpy(both + d->ntrain, v.tokens, sizeof(int32_t) * v.ntrain);
    d->tokens = both;
    d->nval = v.ntrain;
    gpt2_data_free(&v);
    return 0;
}

/* Sequences of the split: non-overlapping windows of T + 1 tokens starting every T. */
static inline size_t gpt2_num_seqs(const gpt2_data *d, int val, int T)
{
    return ((val ? d->nval : d->ntrain) - 1) / (size_t)T;
}

/* The stride that walks a split's n windows in a scattered order visiting each once per
   pass: the first integer from floor(0.618 n) up that is coprime with n (1 for n <= 2). */
static inline uint64_t gpt2_stride(uint64_t n)
{
    uint64_t s = (uint64_t)(0.6180339887498949 * (double)n), a, b, t;
    if (n <= 2) return 1;
    for (;; s++) {
        for (a = s, b = n; b; t = a % b, a = b, b = t) {
        }
        if (a == 1) return s;
    }
}

/* Inputs x and targets y (count x T each) of sequences [first, first + count) of global
   batch 'batch' (B sequences each): sequence j of batch b is window ((b B + j) stride) mod
   the split's windows (gpt2_stride: every window once per pass, neighbours far apart).
   Rank r of N takes first = r B / N, count = B / N, so N ranks of B / N read what one rank
   of B reads. Training batch b is micro-step (step * accum + k). */
static inline void gpt2_batch(const gpt2_data *d, int val, uint64_t batch, int B, int T, int first, int count,
                              int *x, int *y)
{
    const int32_t *tok = d->tokens + (val ? d->ntrain : 0);
    uint64_t nseq = gpt2_num_seqs(d, val, T), stride = gpt2_stride(nseq);
    int j, t;
    for (j = 0; j < count; j++) {
        uint64_t w = (batch * (uint64_t)B + (uint64_t)(first + j)) % nseq * stride % nseq;
        const int32_t *src = tok + w * (uint64_t)T;
        for (t = 0; t < T; t++) {
            x[j * T + t] = src[t];
            y[j * T + t] = src[t + 1];
        }
    }
}

/* ---- checkpoint client state ------------------------------------------------------------- */

/* What a checkpoint carries besides the engine's state, so a resumed run continues the
   straight run's data stream and schedule exactly. */
typedef struct gpt2_client {
    uint64_t magic;      /* GPT2_CLIENT_MAGIC                               */
    int64_t next_step;   /* the step the resumed run starts at              */
    uint64_t next_batch; /* the training batch it reads first               */
    uint64_t rng;        /* the sampling generator's state                  */
    int32_t shape[8];    /* the model: GPT2_CLIENT_SHAPE's fields, in order  */
} gpt2_client;
#define GPT2_CLIENT_MAGIC 0x3374706730726f7aull /* v2: with the shape ("zor0gpt3") */
#define GPT2_CLIENT_SHAPE 8

/* The shape a run records and a --resume must match: what the tensor table cannot tell
   (the heads split the same tensors differently; the tiling and dtype change the groups). */
static inline void gpt2_client_shape(const gpt2_opts *o, int32_t *shape)
{
    shape[0] = o->cfg.layers, shape[1] = o->cfg.heads, shape[2] = o->cfg.channels, shape[3] = o->cfg.seq;
    shape[4] = o->cfg.max_seq, shape[5] = o->cfg.vocab, shape[6] = o->tile_embedding, shape[7] = (int32_t)o->dtype;
}

static inline void gpt2_client_init(gpt2_client *cl, const gpt2_opts *o)
{
    memset(cl, 0, sizeof *cl);
    cl->magic = GPT2_CLIENT_MAGIC;
    cl->rng = o->seed ^ 0x5a5a5a5a5a5a5a5aull;
    gpt2_client_shape(o, cl->shape);
}

static inline int gpt2__shape_text(const int32_t *s, char *out, size_t n)
{
    const char *dt = s[7] >= ZERO_F32 && s[7] <= ZERO_F64 ? zero_dtype_name((zero_dtype)s[7]) : "?";
    return snprintf(out, n, "--layers %d --heads %d --channels %d --seq %d (positions %d) --vocab %d "
                    "--tile-embedding %d --dtype %s", (int)s[0], (int)s[1], (int)s[2], (int)s[3], (int)s[4],
                    (int)s[5], (int)s[6], dt);
}

/* Checks a client state read back from dir (got bytes) against this run's options: its
   size and magic, the model's shape (both named when they differ), and every field's range
   (next_step in 0..--steps, next_batch at least one batch per step). 0, or -1 with a
   sentence in err. */
static inline int gpt2_client_check(const gpt2_client *cl, size_t got, const gpt2_opts *o, const char *dir,
                                    char *err, size_t n)
{
    int32_t want[GPT2_CLIENT_SHAPE];
    char a[256], b[256];
    if (got != sizeof *cl || cl->magic != GPT2_CLIENT_MAGIC) {
        snprintf(err, n, "--resume %s: its client state (%zu bytes) is not this train_gpt2's (%zu bytes with "
                 "the model's shape; an older example's checkpoint holds 32)", dir, got, sizeof *cl);
        return -1;
    }
    gpt2_client_shape(o, want);
    if (memcmp(want, cl->shape, sizeof want) != 0) {
        gpt2__shape_text(cl->shape, a, sizeof a);
        gpt2__shape_text(want, b, sizeof b);
        snprintf(err, n, "--resume %s: the checkpoint's model is %s; this run's is %s", dir, a, b);
        return -1;
    }
    if (cl->next_step < 0 || cl->next_step > o->steps || cl->next_batch < (uint64_t)cl->next_step ||
        cl->next_batch / ((uint64_t)INT_MAX + 1) > (uint64_t)cl->next_step) {
        snprintf(err, n, "--resume %s: its client state is damaged or not of this run (next step %lld, next "
                 "batch %llu; --steps %d)", dir, (long long)cl->next_step, (unsigned long long)cl->next_batch,
                 o->steps);
        return -1;
    }
    return 0;
}

/* ---- the paper's formulas ---------------------------------------------------------------- */

/* Model states per rank (DESIGN.md's table, K = 12) for params and gradients of 'es' bytes
   each: (2 es + 12) Psi split as the stage says; with accumulation (A > 1) stages 0 and 1
   also keep an accumulator of the reduced gradients (whole at stage 0, a shard at 1). */
/* Model-state bytes per rank with F of the Psi elements frozen (T = Psi - F trained): params
   of every element, gradients and K = 12 bytes of optimizer state of the trained ones. */
/* The same with K bytes of optimizer state per trained element (12: fp32 master, m, v;
   6: --optimizer-dtype bf16). */
static inline double gpt2_formula_states_k(int stage, double psi, double frozen, double n, int accum, double es,
                                           double K)
{
    double t = psi - frozen;
    switch (stage) {
    case 0: return es * psi + (es + K) * t + (accum > 1 ? es * t : 0);
    case 1: return es * psi + es * t + K * t / n + (accum > 1 ? es * t / n : 0);
    case 2: return es * psi + (es + K) * t / n;
    default: return es * psi / n + (es + K) * t / n;
    }
}

static inline double gpt2_formula_states_frozen(int stage, double psi, double frozen, double n, int accum, double es)
{
    return gpt2_formula_states_k(stage, psi, frozen, n, accum, es, 12);
}

static inline double gpt2_formula_states(int stage, double psi, double n, int accum, double es)
{
    return gpt2_formula_states_frozen(stage, psi, 0, n, accum, es);
}

/* The same with F of the Psi elements frozen (no gradient, no optimizer state: T = Psi - F
   trained; docs/engine.md "Frozen tensors"). */
static inline double gpt2_formula_traffic_frozen(int stage, double psi, double frozen, double n, double a, double es)
{
    double f = (n - 1) / n * es, t = psi - frozen;
    switch (stage) {
    case 0: return 2 * a * t * f;
    case 1:
    case 2: return (a + 1) * t * f;
    default: return (2 * a * psi + a * t) * f;
    }
}

/* Payload bytes per rank per step by the estimator (zero_estimate.step_*): total, inside
   and between nodes, at ranks_per_node R (0 = one node), MiCS shard size S (0 = flat;
   stage 0 runs flat) and hpZ partition size H (stage 3; 0 = off); -1 in out[0] when the
   estimator refuses the settings. */
static inline void gpt2_formula_traffic_nodes(int stage, double psi, double frozen, int n, int a,
                                              double es, int R, int S, int H, double out[3])
{
    zero_estimate_desc d;
    zero_estimate e;
    memset(&d, 0, sizeof d);
    memset(&e, 0, sizeof e);
    d.params = (uint64_t)psi;
    d.frozen = (uint64_t)frozen;
    d.ranks = n;
    d.stage = stage;
    d.param_bytes = d.grad_bytes = (int)es;
    d.ranks_per_node = R > 0 && R <= n && n % R == 0 ? R : n;
    d.mics_shard_size = stage >= 1 ? S : 0;
    d.hpz_partition_size = stage == 3 ? H : 0;
    d.accum_steps = a;
    out[0] = out[1] = out[2] = -1.0;
    if (zero_estimate_compute(&d, &e) != ZERO_OK) return;
    out[0] = e.step_bytes;
    out[1] = e.step_intra_bytes;
    out[2] = e.step_inter_bytes;
}

/* Payload bytes per rank per step: the paper's 2 Psi (3 Psi at stage 3) elements times
   (N-1)/N, gradients reduced once per micro-step (A of them), 'es' bytes each. */
static inline double gpt2_formula_traffic(int stage, double psi, double n, double a, double es)
{
    return gpt2_formula_traffic_frozen(stage, psi, 0, n, a, es);
}

/* ---- memory report ----------------------------------------------------------------------- */

/* One line per tier with bytes: this rank's engine memory by category. */
static inline void gpt2_print_memory(FILE *f, zero_engine *e, int rank)
{
    static const char *const tier_name[ZERO_TIER_COUNT] = {"device", "host", "nvme"};
    int t, k;
    for (t = 0; t < ZERO_TIER_COUNT; t++) {
        zero_engine_memory m;
        memset(&m, 0, sizeof m);
        if (zero_engine_memory_tier(e, (zero_mem_tier)t, &m) != ZERO_OK || (m.total_bytes == 0 && t > 0)) continue;
        fprintf(f, "rank %d %-6s %10zu B:", rank, tier_name[t], m.total_bytes);
        for (k = 0; k < ZERO_MEM_COUNT; k++)
            if (m.bytes[k]) fprintf(f, " %s %zu", zero_mem_category_name((zero_mem_category)k), m.bytes[k]);
        fprintf(f, "\n");
    }
}
/* ---- a Hugging Face directory out: config.json + model.safetensors ----------------------- */

/* Writes text to path through "path.tmp" and a rename. 0, or -1 with a sentence in err. */
static inline int gpt2__write_file(const char *path, const void *data, size_t len, char *err, size_t n)
{
    char tmp[4300];
    FILE *f;
    int ok;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "wb"))) {
        snprintf(err, n, "%.300s: cannot write it: %s", tmp, strerror(errno));
        return -1;
    }
    ok = fwrite(data, 1, len, f) == len;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, n, "%.300s: cannot write it: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

/* The next member of a JSON object at *p (after its '{' or a member): key and value spans
   as written. 1, 0 at the object's end, -1 if malformed. */
static inline int gpt2__json_next(const char **p, const char **k, size_t *klen, const char **v, size_t *vlen)
{
    const char *q = gpt2__json_ws(*p);
    if (*q == ',') q = gpt2__json_ws(q + 1);
    if (*q == '}') return 0;
    if (*q != '"') return -1;
    *k = q + 1;
    if (!(q = gpt2__json_skip(q))) return -1;
    *klen = (size_t)(q - 1 - *k);
    q = gpt2__json_ws(q);
    if (*q++ != ':') return -1;
    *v = gpt2__json_ws(q);
    if (!(q = gpt2__json_skip(*v))) return -1;
    *vlen = (size_t)(q - *v);
    *p = q;
    return 1;
}

/* DIR/config.json for GPT2LMHeadModel. What the weights fix is written from the arguments
   (architectures GPT2LMHeadModel, also after a GPT2Model --init; n_layer, n_head, n_embd,
   n_positions, n_ctx, vocab_size, layer_norm_epsilon 1e-5,
   tie_word_embeddings, torch_dtype, and dtype when base has it). Every other key comes from base (the --init directory's
   config.json, or a copy a checkpoint keeps; NULL: none) as it is written there, its unknown
   keys included (task_specific_params, summary_*, a tokenizer's ids ...), else from the
   defaults below (model_type gpt2, activation_function gelu_new, the dropouts 0, ...). 0, or
   -1 with a sentence in err (base unreadable or not a JSON object). */
static inline int gpt2_hf_config_write_from(const char *dir, int layers, int heads, int channels, int positions,
                                            int vocab, const char *dtype, const char *base, char *err, size_t n)
{
    static const char *const keys[] = {"architectures", "model_type", "n_layer", "n_head", "n_embd", "n_positions",
                                       "n_ctx", "vocab_size", "n_inner", "activation_function", "layer_norm_epsilon",
                                       "resid_pdrop", "embd_pdrop", "attn_pdrop", "scale_attn_weights",
                                       "tie_word_embeddings", "bos_token_id", "eos_token_id", "torch_dtype"};
    enum { NK = sizeof keys / sizeof keys[0] };
    char vals[NK][64], path[4200], *btext = NULL, *text;
    const char *obj = NULL, *k, *v, *q;
    size_t klen, vlen, cap, used = 0;
    int i, rc, owned[NK];
    FILE *f;
    long len;
    memset(owned, 0, sizeof owned);
    snprintf(vals[0], 64, "[\"GPT2LMHeadModel\"]"), owned[0] = 1; /* what the weights are, whatever --init was */
    snprintf(vals[1], 64, "\"gpt2\"");
    snprintf(vals[2], 64, "%d", layers), owned[2] = 1;
    snprintf(vals[3], 64, "%d", heads), owned[3] = 1;
    snprintf(vals[4], 64, "%d", channels), owned[4] = 1;
    snprintf(vals[5], 64, "%d", positions), owned[5] = 1;
    snprintf(vals[6], 64, "%d", positions), owned[6] = 1;
    snprintf(vals[7], 64, "%d", vocab), owned[7] = 1;
    snprintf(vals[8], 64, "null");
    snprintf(vals[9], 64, "\"gelu_new\"");
    snprintf(vals[10], 64, "1e-05"), owned[10] = 1;
    snprintf(vals[11], 64, "0.0");
    snprintf(vals[12], 64, "0.0");
    snprintf(vals[13], 64, "0.0");
    snprintf(vals[14], 64, "true");
    snprintf(vals[15], 64, "true"), owned[15] = 1;
    snprintf(vals[16], 64, "%s", vocab == 50257 ? "50256" : "null"); /* GPT-2's <|endoftext|> */
    snprintf(vals[17], 64, "%s", vocab == 50257 ? "50256" : "null");
    snprintf(vals[18], 64, "\"%s\"", dtype), owned[18] = 1;
    if (base && (f = fopen(base, "rb")) != NULL) {
        if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) > 0 && len < (1L << 20) && fseek(f, 0, SEEK_SET) == 0 &&
            (btext = (char *)malloc((size_t)len + 1)) != NULL && fread(btext, 1, (size_t)len, f) == (size_t)len) {
            btext[len] = '\0';
            obj = gpt2__json_ws(btext);
            if (*obj != '{') obj = NULL;
        }
        fclose(f);
        if (!obj) {
            snprintf(err, n, "%.300s: not a JSON object under 1 MB", base);
            free(btext);
            return -1;
        }
    }
    cap = 4096 + (btext ? strlen(btext) : 0);
    if (!(text = (char *)malloc(cap))) {
        free(btext);
        snprintf(err, n, "out of memory for config.json");
        return -1;
    }
    used += (size_t)snprintf(text + used, cap - used, "{");
    for (i = 0; i < NK; i++) { /* ours, or the base's value of a key the weights do not fix */
        const char *val = vals[i];
        int vl = (int)strlen(vals[i]);
        for (q = obj ? obj + 1 : NULL; q && !owned[i] && gpt2__json_next(&q, &k, &klen, &v, &vlen) == 1;)
            if (klen == strlen(keys[i]) && !strncmp(k, keys[i], klen)) val = v, vl = (int)vlen;
        used += (size_t)snprintf(text + used, cap - used, "%s\n  \"%s\": %.*s", i ? "," : "", keys[i], vl, val);
    }
    rc = 0;
    for (q = obj ? obj + 1 : NULL; q && (rc = gpt2__json_next(&q, &k, &klen, &v, &vlen)) == 1;) { /* the rest */
        for (i = 0; i < NK; i++)
            if (klen == strlen(keys[i]) && !strncmp(k, keys[i], klen)) break;
        if (i < NK || used + klen + vlen + 64 >= cap) continue;
        if (klen == 5 && !strncmp(k, "dtype", 5)) /* transformers 5's name of torch_dtype: the weights' too */
            used += (size_t)snprintf(text + used, cap - used, ",\n  \"dtype\": \"%s\"", dtype);
        else used += (size_t)snprintf(text + used, cap - used, ",\n  \"%.*s\": %.*s", (int)klen, k, (int)vlen, v);
    }
    free(btext);
    if (rc < 0) {
        free(text);
        snprintf(err, n, "%.300s: malformed JSON", base);
        return -1;
    }
    used += (size_t)snprintf(text + used, cap - used, "\n}\n");
    snprintf(path, sizeof path, "%s/config.json", dir);
    rc = gpt2__write_file(path, text, used, err, n);
    free(text);
    return rc;
}

/* DIR/config.json for GPT2LMHeadModel of this shape: what from_pretrained needs to build the
   model the weights belong to (this model: LayerNorm eps 1e-5, gelu_new, no dropout, the
   head tied to wte, so model.safetensors holds no lm_head.weight, as save_pretrained writes
   it). dtype: the weights' ("float32", "bfloat16", "float16"). 0, or -1 with err. With
   no base: gpt2_hf_config_write_from's defaults. */
static inline int gpt2_hf_config_write(const char *dir, int layers, int heads, int channels, int positions, int vocab,
                                       const char *dtype, char *err, size_t n)
{
    return gpt2_hf_config_write_from(dir, layers, heads, channels, positions, vocab, dtype, NULL, err, n);
}

/* Creates directory dir (its parent must exist) unless it is one; refuses to replace
   dir/config.json or dir/model.safetensors unless force. 0, or -1 with err. */
static inline int gpt2_hf_dir_prepare(const char *dir, int force, char *err, size_t n)
{
    static const char *const names[2] = {"config.json", "model.safetensors"};
    struct stat st;
    char path[4200];
    int k;
    if (stat(dir, &st) != 0 && mkdir(dir, 0755) != 0) {
        snprintf(err, n, "%.300s: cannot create the directory: %s", dir, strerror(errno));
        return -1;
    }
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, n, "%.300s: not a directory", dir);
        return -1;
    }
    for (k = 0; k < 2 && !force; k++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[k]);
        if (lstat(path, &st) == 0) {
            snprintf(err, n, "%.300s exists (add --force to replace it)", path);
            return -1;
        }
    }
    return 0;
}

/* DIR/model.safetensors from fp32 values in table order (the example's final params): the
   table's names and shapes, F32, data in table order after a header padded with spaces to
   a multiple of 8 bytes. 0, or -1 with err. */
static inline int gpt2_hf_weights_write(const char *dir, const gpt2_config *c, const float *params, char *err,
                                        size_t n)
{
    int nt = gpt2_num_tensors(c), i, k, rc = -1;
    gpt2_tensor *t = (gpt2_tensor *)malloc(sizeof *t * (size_t)nt);
    size_t cap = 256 + (size_t)nt * 160, hl, at = 0, total = 0;
    char *h = (char *)malloc(cap), path[4200], tmp[4300];
    FILE *f = NULL;
    unsigned char len8[8];
    if (!t || !h) {
        snprintf(err, n, "--export: out of memory for the header of %d tensors", nt);
        goto out;
    }
    gpt2_param_table(c, t);
    hl = (size_t)snprintf(h, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (i = 0; i < nt; i++) {
        hl += (size_t)snprintf(h + hl, cap - hl, ",\"%s\":{\"dtype\":\"F32\",\"shape\":[%llu", t[i].name,
                               (unsigned long long)t[i].dims[0]);
        if (t[i].ndim == 2) hl += (size_t)snprintf(h + hl, cap - hl, ",%llu", (unsigned long long)t[i].dims[1]);
        hl += (size_t)snprintf(h + hl, cap - hl, "],\"data_offsets\":[%zu,%zu]}", at, at + 4 * t[i].numel);
        at += 4 * t[i].numel;
        total += t[i].numel;
    }
    hl += (size_t)snprintf(h + hl, cap - hl, "}");
    while (hl % 8) h[hl++] = ' ';
    for (k = 0; k < 8; k++) len8[k] = (unsigned char)((uint64_t)hl >> (8 * k));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(f = fopen(tmp, "wb")) || fwrite(len8, 1, 8, f) != 8 || fwrite(h, 1, hl, f) != hl ||
        fwrite(params, sizeof(float), total, f) != total) {
        snprintf(err, n, "%.300s: cannot write it: %s", tmp, strerror(errno));
        goto out;
    }
    k = fclose(f);
    f = NULL;
    if (k != 0 || rename(tmp, path) != 0) {
        snprintf(err, n, "%.300s: cannot write it: %s", path, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (f) fclose(f);
    if (rc != 0) remove(tmp);
    free(t);
    free(h);
    return rc;
}

#endif
