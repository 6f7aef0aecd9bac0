/* examples/gpt2_common.h, the GPT-2 example's non-compute half: the parameter table gives
   GPT-2 small's 124,439,808 parameters under Hugging Face's names and shapes; N ranks of B/N
   sequences read exactly what one rank of B reads, and a pass visits every window once; the
   text loader concatenates a directory's regular files in strcmp order and the .bin loader
   reads llm.c's format (and refuses a bad one); the schedule is llm.c's; the flags parse and
   bad values are refused. (tests/gpt2_reference.py checks the model against PyTorch.) */
#define _XOPEN_SOURCE 700 /* POSIX names (mkdtemp, pwrite): zero.h is linked (build/zero_impl.o) */
#include "zero.h"
#include "examples/gpt2_common.h"
#include "tests/zt.h"

#include <unistd.h>

ZT_TEST(the_table_is_gpt2_small_under_hf_names)
{
    gpt2_opts o;
    char a0[] = "t", a1[] = "--preset", a2[] = "124M";
    char *argv[] = {a0, a1, a2};
    gpt2_tensor *t;
    size_t total = 0;
    int i, n;
    gpt2_opts_default(&o);
    ZT_CHECK(gpt2_parse_args(3, argv, &o) == 0);
    n = gpt2_num_tensors(&o.cfg);
    ZT_CHECK(n == 4 + 12 * 12);
    t = (gpt2_tensor *)malloc(sizeof *t * (size_t)n);
    gpt2_param_table(&o.cfg, t);
    for (i = 0; i < n; i++) total += t[i].numel;
    ZT_CHECKF(total == 124439808u, "%zu", total); /* GPT2LMHeadModel's count (lm_head tied) */
    ZT_CHECK(!strcmp(t[GPT2_WTE].name, "transformer.wte.weight") && t[GPT2_WTE].dims[0] == 50257 &&
             t[GPT2_WTE].dims[1] == 768 && t[GPT2_WTE].group == 0 && t[GPT2_WTE].flags == 0);
    ZT_CHECK(t[GPT2_WPE].dims[0] == 1024 && t[GPT2_LNF_B].flags == ZERO_TENSOR_NO_DECAY);
    i = gpt2_block_tensor(11, GPT2_QKV_W);
    ZT_CHECK(!strcmp(t[i].name, "transformer.h.11.attn.c_attn.weight") && t[i].dims[0] == 768 &&
             t[i].dims[1] == 2304 && t[i].group == 12 && t[i].ndim == 2);
    i = gpt2_block_tensor(0, GPT2_FCPROJ_W);
    ZT_CHECK(!strcmp(t[i].name, "transformer.h.0.mlp.c_proj.weight") && t[i].dims[0] == 3072 && t[i].dims[1] == 768);
    i = gpt2_block_tensor(3, GPT2_LN2_B);
    ZT_CHECK(!strcmp(t[i].name, "transformer.h.3.ln_2.bias") && t[i].ndim == 1 && t[i].flags == ZERO_TENSOR_NO_DECAY);
    free(t);
}

/* a corpus directory: files "b", "a", "c.txt" and a subdirectory that is skipped */
static int write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    if (fwrite(data, 1, n, f) != n) n = 0;
    fclose(f);
    return n ? 0 : -1;
}

ZT_TEST(the_loader_and_the_batches)
{
    char dir[] = "/tmp/zt-gpt2-XXXXXX", path[256], err[256] = "";
    unsigned char big[3000];
    gpt2_data d;
    size_t i, nseq;
    int B = 8, T = 16, j, k, ok = 1;
    int x1[8 * 16], y1[8 * 16], x4[8 * 16], y4[8 * 16];
    unsigned char *seen;
    if (!mkdtemp(dir)) ZT_SKIP("no temporary directory");
    for (i = 0; i < sizeof big; i++) big[i] = (unsigned char)(i * 7 + 3);
    snprintf(path, sizeof path, "%s/b", dir);
    ZT_CHECK(write_file(path, big, 1000) == 0);
    snprintf(path, sizeof path, "%s/a", dir);
    ZT_CHECK(write_file(path, "AAAA", 4) == 0);
    snprintf(path, sizeof path, "%s/c.txt", dir);
    ZT_CHECK(write_file(path, big + 1000, 2000) == 0);
    snprintf(path, sizeof path, "%s/sub", dir);
    ZT_CHECK(mkdir(path, 0700) == 0);
    ZT_CHECKF(gpt2_data_load(dir, 256, T, &d, err, sizeof err) == 0, "%s", err);
    ZT_CHECK(d.ntrain + d.nval == 3004 && d.nval == 300);
    ZT_CHECK(d.tokens[0] == 'A' && d.tokens[3] == 'A' && d.tokens[4] == big[0] && d.tokens[1004] == big[1000]);
    /* N ranks of B/N read what 1 rank of B reads, at any batch */
    for (k = 0; k < 50; k++) {
        gpt2_batch(&d, 0, (uint64_t)k, B, T, 0, B, x1, y1);
        for (j = 0; j < 4; j++) gpt2_batch(&d, 0, (uint64_t)k, B, T, j * 2, 2, x4 + j * 2 * T, y4 + j * 2 * T);
        ok = ok && !memcmp(x1, x4, sizeof x1) && !memcmp(y1, y4, sizeof y1);
        for (j = 0; j < B * T; j++) ok = ok && (j % T == T - 1 || y1[j] == x1[j + 1]); /* targets shifted by one */
    }
    ZT_CHECK(ok);
    /* one pass visits every window once: sequence i of a pass is window (i stride) mod W,
       stride coprime with W, for every W */
    nseq = gpt2_num_seqs(&d, 0, T);
    for (i = 0; i < nseq; i++) {
        int one[16], yy[16];
        size_t w = i * gpt2_stride(nseq) % nseq;
        gpt2_batch(&d, 0, i, 1, T, 0, 1, one, yy);
        for (j = 0; j < T; j++) ok = ok && one[j] == d.tokens[w * T + (size_t)j];
    }
    ZT_CHECK(ok);
    for (i = 1; i < 600; i++) {
        size_t st = gpt2_stride(i), w;
        seen = (unsigned char *)calloc(i, 1);
        for (w = 0; w < i; w++) seen[w * st % i] = 1;
        for (w = 0; w < i; w++) ok = ok && seen[w];
        ok = ok && (i <= 2 || st >= (size_t)(0.618 * (double)i));
        free(seen);
    }
    ZT_CHECKF(ok, "a pass misses a window");
    gpt2_data_free(&d);
    /* too few tokens, a vocab too small for bytes */
    ZT_CHECK(gpt2_data_load(dir, 256, 1000, &d, err, sizeof err) != 0 && strstr(err, "too few"));
    ZT_CHECK(gpt2_data_load(dir, 100, T, &d, err, sizeof err) != 0 && strstr(err, "--vocab"));
    /* llm.c's .bin */
    {
        int32_t hdr[256];
        uint16_t tok[400];
        unsigned char buf[sizeof hdr + sizeof tok];
        memset(hdr, 0, sizeof hdr);
        hdr[0] = GPT2_BIN_MAGIC, hdr[1] = 1, hdr[2] = 400;
        for (j = 0; j < 400; j++) tok[j] = (uint16_t)(50000 + j % 257);
        memcpy(buf, hdr, sizeof hdr);
        memcpy(buf + sizeof hdr, tok, sizeof tok);
        snprintf(path, sizeof path, "%s/toks.bin", dir);
        ZT_CHECK(write_file(path, buf, sizeof buf) == 0);
        ZT_CHECKF(gpt2_data_load(path, 50257, T, &d, err, sizeof err) == 0, "%s", err);
        ZT_CHECK(d.ntrain == 360 && d.nval == 40 && d.tokens[0] == 50000 && d.tokens[399] == 50000 + 399 % 257);
        gpt2_data_free(&d);
        ZT_CHECK(gpt2_data_load(path, 50000, T, &d, err, sizeof err) != 0 && strstr(err, "outside --vocab"));
        { /* --val-data: every token of --data trains, every token of the other file validates */
            char vpath[600];
            hdr[2] = 300;
            for (j = 0; j < 300; j++) tok[j] = (uint16_t)(7 + j);
            memcpy(buf, hdr, sizeof hdr);
            memcpy(buf + sizeof hdr, tok, 600);
            snprintf(vpath, sizeof vpath, "%s/val.bin", dir);
            ZT_CHECK(write_file(vpath, buf, sizeof hdr + 600) == 0);
            ZT_CHECKF(gpt2_data_load_val(path, vpath, 50257, T, &d, err, sizeof err) == 0, "%s", err);
            ZT_CHECK(d.ntrain == 400 && d.nval == 300 && d.tokens[399] == 50000 + 399 % 257 && d.tokens[400] == 7 &&
                     d.tokens[699] == 7 + 299);
            gpt2_data_free(&d);
            ZT_CHECK(gpt2_data_load_val(path, vpath, 300, T, &d, err, sizeof err) != 0 && strstr(err, "--data"));
            ZT_CHECK(gpt2_data_load_val(path, vpath, 50257, 350, &d, err, sizeof err) != 0 &&
                     strstr(err, "--val-data") && strstr(err, "too few"));
            unlink(vpath);
            hdr[2] = 400;
            for (j = 0; j < 400; j++) tok[j] = (uint16_t)(50000 + j % 257);
            memcpy(buf + sizeof hdr, tok, sizeof tok);
        }
        hdr[0] = 12345;
        memcpy(buf, hdr, sizeof hdr);
        ZT_CHECK(write_file(path, buf, sizeof buf) == 0);
        ZT_CHECK(gpt2_data_load(path, 50257, T, &d, err, sizeof err) != 0 && strstr(err, "not an llm.c token file"));
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/a", dir), unlink(path);
    snprintf(path, sizeof path, "%s/b", dir), unlink(path);
    snprintf(path, sizeof path, "%s/c.txt", dir), unlink(path);
    snprintf(path, sizeof path, "%s/sub", dir), rmdir(path);
    rmdir(dir);
}

ZT_TEST(the_schedule_and_the_flags)
{
    gpt2_opts o;
    char a0[] = "t", a1[] = "--batch", a2[] = "6", a3[] = "--ranks", a4[] = "4";
    char *bad[] = {a0, a1, a2, a3, a4};
    char b1[] = "--dtype", b2[] = "f64";
    char *bad2[] = {a0, b1, b2};
    char c1[] = "--stage", c2[] = "2", c3[] = "--steps", c4[] = "101", c5[] = "--warmup", c6[] = "10";
    char *good[] = {a0, c1, c2, c3, c4, c5, c6};
    gpt2_opts_default(&o);
    ZT_CHECK(gpt2_parse_args(7, good, &o) == 0 && o.stage == 2 && o.steps == 101);
    ZT_CHECK(fabs(gpt2_lr(&o, 0) - o.lr / 10) < 1e-15 && gpt2_lr(&o, 9) == o.lr && gpt2_lr(&o, 10) == o.lr);
    ZT_CHECK(fabs(gpt2_lr(&o, 100) - o.lr * o.lr_min_frac) < 1e-15);
    ZT_CHECK(fabs(gpt2_lr(&o, 55) - (o.lr * o.lr_min_frac + 0.5 * (o.lr - o.lr * o.lr_min_frac))) < 1e-12);
    gpt2_opts_default(&o);
    fprintf(stderr, "(two refusals expected)\n");
    ZT_CHECK(gpt2_parse_args(5, bad, &o) == 2);
    gpt2_opts_default(&o);
    ZT_CHECK(gpt2_parse_args(3, bad2, &o) == 2);
    { /* --batch 6 under a launcher (2 processes, the ranks known later) is valid: not checked
         against the default --ranks 4; without a launcher, or with --ranks 4 given, refused */
        char d1[] = "--batch", d2[] = "6", d3[] = "--ranks", d4[] = "4", d5[] = "2";
        char *b6[] = {a0, d1, d2}, *b6r4[] = {a0, d1, d2, d3, d4}, *b6r2[] = {a0, d1, d2, d3, d5};
        gpt2_opts_default(&o);
        o.launcher = 1;
        ZT_CHECKF(gpt2_parse_args(3, b6, &o) == 0 && o.batch == 6 && !o.ranks_given, "launcher: --batch 6 refused");
        gpt2_opts_default(&o);
        o.launcher = 1;
        ZT_CHECK(gpt2_parse_args(5, b6r2, &o) == 0 && o.ranks_given && o.ranks == 2);
        fprintf(stderr, "(two refusals expected)\n");
        gpt2_opts_default(&o);
        o.launcher = 1;
        ZT_CHECK(gpt2_parse_args(5, b6r4, &o) == 2);
        gpt2_opts_default(&o);
        ZT_CHECK(gpt2_parse_args(3, b6, &o) == 2); /* threads: the default --ranks 4 */
    }
    /* the formulas at N = 4, Psi = 1000, fp32 params and gradients: 20 Psi at stage 0 */
    ZT_CHECK(gpt2_formula_states(0, 1000, 4, 1, 4) == 20000 && gpt2_formula_states(3, 1000, 4, 1, 4) == 5000);
    ZT_CHECK(gpt2_formula_traffic(3, 1000, 4, 1, 4) == 3 * 1000 * 0.75 * 4);
}

/* Fine-tuning flags: AdamW's settings reach the engine descriptor; --freeze marks exactly
   the named tensors; the frozen-aware formulas (F = 0: the paper's) against numbers worked
   out by hand. */
ZT_TEST(the_fine_tuning_flags)
{
    gpt2_opts o;
    gpt2_tensor *t;
    zero_engine_desc d;
    char why[200];
    char a0[] = "t", a1[] = "--beta1", a2[] = "0.8", a3[] = "--beta2", a4[] = "0.99", a5[] = "--eps",
         a6[] = "1e-6", a7[] = "--weight-decay", a8[] = "0.01", a9[] = "--lr-embed", a10[] = "0.5",
         a11[] = "--freeze", a12[] = "wte,ln_f,h.1-2";
    char *good[] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12};
    char b2[] = "0", b4[] = "1";
    char *bad1[] = {a0, a1, b2}, *bad2[] = {a0, a3, b4};
    int i, k, frozen;
    gpt2_opts_default(&o);
    ZT_CHECK(o.beta1 == 0.9 && o.beta2 == 0.95 && o.eps == 1e-8 && o.weight_decay == 0.1 && o.lr_embed == 1.0);
    ZT_CHECK(gpt2_parse_args(13, good, &o) == 0);
    gpt2_engine_desc(&o, 1, 2, &d);
    ZT_CHECK(d.adam.beta1 == 0.8 && d.adam.beta2 == 0.99 && d.adam.eps == 1e-6 && d.adam.weight_decay == 0.01);
    ZT_CHECK(o.lr_embed == 0.5 && o.freeze && !strcmp(o.freeze, "wte,ln_f,h.1-2"));
    gpt2_opts_default(&o);
    fprintf(stderr, "(two refusals expected)\n");
    ZT_CHECK(gpt2_parse_args(3, bad1, &o) == 2); /* beta1 0 would mean the default 0.9 */
    ZT_CHECK(gpt2_parse_args(3, bad2, &o) == 2);
    o.cfg.layers = 4;
    t = (gpt2_tensor *)malloc(sizeof *t * (size_t)gpt2_num_tensors(&o.cfg));
    ZT_CHECK(t != NULL);
    if (!t) return;
    gpt2_param_table(&o.cfg, t);
    ZT_CHECK(gpt2_mark_frozen(&o.cfg, t, "wte,ln_f,h.1-2", why, sizeof why) == 0);
    for (i = 0; i < gpt2_num_tensors(&o.cfg); i++) {
        int want = i == GPT2_WTE || i == GPT2_LNF_W || i == GPT2_LNF_B ||
                   (i >= gpt2_block_tensor(1, 0) && i < gpt2_block_tensor(3, 0));
        ZT_CHECKF(!!(t[i].flags & ZERO_TENSOR_FROZEN) == want, "%s", t[i].name);
    }
    gpt2_param_table(&o.cfg, t);
    ZT_CHECK(gpt2_mark_frozen(&o.cfg, t, "h.3", why, sizeof why) == 0);
    for (frozen = 0, k = 0; k < gpt2_num_tensors(&o.cfg); k++) frozen += !!(t[k].flags & ZERO_TENSOR_FROZEN);
    ZT_CHECK(frozen == GPT2_BLOCK_TENSORS);
    ZT_CHECK(gpt2_mark_frozen(&o.cfg, t, "h.4", why, sizeof why) == -1 && strstr(why, "'h.4'"));
    ZT_CHECK(gpt2_mark_frozen(&o.cfg, t, "h.2-1", why, sizeof why) == -1);
    ZT_CHECK(gpt2_mark_frozen(&o.cfg, t, "wte,,wpe", why, sizeof why) == -1);
    ZT_CHECK(gpt2_mark_frozen(&o.cfg, t, "lm_head", why, sizeof why) == -1 && strstr(why, "'lm_head'"));
    ZT_CHECK(gpt2_mark_frozen(&o.cfg, t, "h.1x", why, sizeof why) == -1);
    free(t);
    /* N = 4, Psi = 1000 of which F = 200 frozen (T = 800), fp32 (4 bytes), accumulation 1:
       stage 0: 4 Psi + 16 T = 16800; stage 1: 4 Psi + 4 T + 12 T / 4 = 9600; stage 2: 4 Psi +
       16 T / 4 = 7200; stage 3: 4 Psi / 4 + 16 T / 4 = 4200. Traffic x 4 bytes x 3/4: stage 0
       2 T, stages 1-2 2 T, stage 3 2 Psi + T. */
    ZT_CHECK(gpt2_formula_states_frozen(0, 1000, 200, 4, 1, 4) == 16800);
    /* bf16 optimizer states (K = 6), 16-bit params: stage 0 = 10 Psi, stage 1 = 4 Psi + 6 Psi / N */
    ZT_CHECK(gpt2_formula_states_k(0, 1000, 0, 4, 1, 2, 6) == 10000);
    ZT_CHECK(gpt2_formula_states_k(1, 1000, 0, 4, 1, 2, 6) == 5500);
    ZT_CHECK(gpt2_formula_states_frozen(1, 1000, 200, 4, 1, 4) == 9600);
    ZT_CHECK(gpt2_formula_states_frozen(2, 1000, 200, 4, 1, 4) == 7200);
    ZT_CHECK(gpt2_formula_states_frozen(3, 1000, 200, 4, 1, 4) == 4200);
    ZT_CHECK(gpt2_formula_traffic_frozen(0, 1000, 200, 4, 1, 4) == 1600 * 3);
    ZT_CHECK(gpt2_formula_traffic_frozen(2, 1000, 200, 4, 1, 4) == 1600 * 3);
    ZT_CHECK(gpt2_formula_traffic_frozen(3, 1000, 200, 4, 1, 4) == 2800 * 3);
    for (k = 0; k <= 3; k++)
        ZT_CHECK(gpt2_formula_states_frozen(k, 1000, 0, 4, 2, 2) == gpt2_formula_states(k, 1000, 4, 2, 2));
}

/* --init DIR: config.json gives the shape (n_positions apart from --seq); a shape flag that
   disagrees is refused naming both values; an untied head, another epsilon and a sharded
   checkpoint are refused by name. */
static void hf_write(const char *dir, const char *name, const char *text)
{
    char path[600];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

ZT_TEST(init_from_a_hf_directory)
{
    char dir[] = "/tmp/zero_hfdir_XXXXXX", want[700];
    char a0[] = "t", a1[] = "--init", a3[] = "--layers", a4[] = "3", a5[] = "--seq", a6[] = "16";
    char *args[] = {a0, a1, dir, a5, a6}, *bad[] = {a0, a1, dir, a3, a4};
    gpt2_opts o;
    const char *cfg = "{\n  \"n_layer\": 2, \"n_head\": 2,\n  \"n_embd\": 32, \"n_positions\": 40,\n"
                      "  \"vocab_size\": 300, \"layer_norm_epsilon\": 1e-05, \"tie_word_embeddings\": true\n}\n";
    if (!mkdtemp(dir)) ZT_SKIP("mkdtemp failed");
    hf_write(dir, "config.json", cfg);
    gpt2_opts_default(&o);
    fprintf(stderr, "(nine refusals expected)\n");
    ZT_CHECK(gpt2_parse_args(5, args, &o) == 2); /* no model.safetensors yet */
    hf_write(dir, "model.safetensors", "");
    gpt2_opts_default(&o);
    ZT_CHECK(gpt2_parse_args(5, args, &o) == 0);
    snprintf(want, sizeof want, "%s/model.safetensors", dir);
    ZT_CHECK(o.cfg.layers == 2 && o.cfg.heads == 2 && o.cfg.channels == 32 && o.cfg.vocab == 300 &&
             o.cfg.max_seq == 40 && o.cfg.seq == 16 && o.init_path && !strcmp(o.init_path, want));
    gpt2_opts_default(&o);
    ZT_CHECK(gpt2_parse_args(3, args, &o) == 0 && o.cfg.seq == 40); /* --seq defaults to n_positions' bound */
    gpt2_opts_default(&o);
    ZT_CHECK(gpt2_parse_args(5, bad, &o) == 2);
    hf_write(dir, "config.json", "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"vocab_size\": 300, "
                                 "\"tie_word_embeddings\": false}");
    gpt2_opts_default(&o);
    ZT_CHECK(gpt2_parse_args(3, args, &o) == 2);
    hf_write(dir, "config.json", "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"vocab_size\": 300, "
                                 "\"layer_norm_epsilon\": 1e-6}");
    gpt2_opts_default(&o);
    ZT_CHECK(gpt2_parse_args(3, args, &o) == 2);
    hf_write(dir, "config.json", "{\"n_layer\": 2.5, \"n_head\": 2, \"n_embd\": 32, \"vocab_size\": 300}");
    gpt2_opts_default(&o);
    ZT_CHECK(gpt2_parse_args(3, args, &o) == 2);
    {
        /* keys that change what Hugging Face's model computes: refused; their defaults (and
           gelu_pytorch_tanh, the same GELU, n_inner null or 4 n_embd) accepted */
        static const char *const refused[] = {
            "\"activation_function\": \"relu\"", "\"scale_attn_by_inverse_layer_idx\": true",
            "\"scale_attn_weights\": false", "\"n_inner\": 100"};
        static const char *const accepted[] = {
            "\"activation_function\": \"gelu_new\"", "\"activation_function\": \"gelu_pytorch_tanh\"",
            "\"scale_attn_by_inverse_layer_idx\": false", "\"scale_attn_weights\": true",
            "\"n_inner\": null", "\"n_inner\": 128"};
        char text[300];
        size_t k;
        for (k = 0; k < sizeof refused / sizeof refused[0]; k++) {
            snprintf(text, sizeof text, "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"n_positions\": 40, \"vocab_size\": 300, %s}",
                     refused[k]);
            hf_write(dir, "config.json", text);
            gpt2_opts_default(&o);
            ZT_CHECKF(gpt2_parse_args(3, args, &o) == 2, "%s accepted", refused[k]);
        }
        for (k = 0; k < sizeof accepted / sizeof accepted[0]; k++) {
            snprintf(text, sizeof text, "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 32, \"n_positions\": 40, \"vocab_size\": 300, %s}",
                     accepted[k]);
            hf_write(dir, "config.json", text);
            gpt2_opts_default(&o);
            ZT_CHECKF(gpt2_parse_args(3, args, &o) == 0, "%s refused", accepted[k]);
        }
    }
    {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        ZT_CHECK(system(cmd) == 0);
    }
}

/* --tokenizer: a tokenizer.json written here. Byte-level (decoder ByteLevel inside a
   Sequence): GPT-2's bytes_to_unicode gives byte 32 (the 33rd byte outside the printable
   ranges) U+0120, byte 10 U+010A, byte 0xAD (the 68th) U+0143, and the bytes of UTF-8's
   e-acute (C3 A9) are their own code points U+00C3 U+00A9; an added token is its content;
   JSON escapes (\", \\, \/, \uXXXX, a surrogate pair) decode to UTF-8. Without a ByteLevel
   decoder the strings stay as they are. */
ZT_TEST(a_tokenizer_json_decodes)
{
    char dir[] = "/tmp/zero_tok_XXXXXX", path[64], out[256], err[512];
    const char *json =
        "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 7, \"content\": \"<|endoftext|>\", \"special\": true},\n"
        " {\"content\": \"<x\\\"y>\", \"id\": 8}],\n"
        " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteLevel\", \"add_prefix_space\": true}]},\n"
        " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"vocab\": {\"\\u0120the\": 0, \"\\u010a\": 1, \"caf\\u00c3\\u00a9\": 2,\n"
        "   \"\\\"q\\\\\\/\": 3, \"\\u0143\": 4, \"\\ud83d\\ude00\": 5, \"{[\": 6}, \"merges\": [\"\\u0120 t\"]}}";
    static const char want_bl[] = " the\ncaf\xc3\xa9\"q\\/\xad\xf0\x9f\x98\x80{[<|endoftext|><x\"y>";
    static const char want_raw[] = "\xc4\xa0the\xc4\x8a" "caf\xc3\x83\xc2\xa9";
    int ids[] = {0, 1, 2, 3, 4, 5, 6, 7, 8}, none[] = {9};
    gpt2_vocab v;
    size_t n;
    FILE *f;
    if (!mkdtemp(dir)) ZT_SKIP("mkdtemp failed");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    ZT_CHECK((f = fopen(path, "w")) != NULL && fputs(json, f) >= 0 && fclose(f) == 0);
    ZT_CHECKF(gpt2_vocab_load(dir, &v, err, sizeof err) == 0, "%s", err);
    ZT_CHECK(v.n == 9 && v.byte_level);
    n = gpt2_vocab_format(&v, ids, 9, out, sizeof out, 0);
    out[n] = '\0';
    ZT_CHECKF(n == sizeof want_bl - 1 && !memcmp(out, want_bl, n), "got '%s'", out);
    n = gpt2_vocab_format(&v, none, 1, out, sizeof out, 0);
    out[n] = '\0';
    ZT_CHECKF(!strcmp(out, "[9]"), "an id the vocabulary lacks: '%s'", out);
    gpt2_vocab_free(&v);
    /* the same vocabulary under another decoder: the strings as they are */
    ZT_CHECK((f = fopen(path, "w")) != NULL &&
             fputs("{\"decoder\": null, \"model\": {\"vocab\": {\"\\u0120the\": 0, \"\\u010a\": 1, "
                   "\"caf\\u00c3\\u00a9\": 2}}}", f) >= 0 && fclose(f) == 0);
    ZT_CHECKF(gpt2_vocab_load(path, &v, err, sizeof err) == 0, "%s", err);
    n = gpt2_vocab_format(&v, ids, 3, out, sizeof out, 0);
    out[n] = '\0';
    ZT_CHECKF(!v.byte_level && !strcmp(out, want_raw), "got '%s'", out);
    gpt2_vocab_free(&v);
    /* refusals: no model.vocab, a malformed one, a repeated id, no file */
    ZT_CHECK((f = fopen(path, "w")) != NULL && fputs("{\"model\": {\"merges\": []}}", f) >= 0 && fclose(f) == 0);
    ZT_CHECK(gpt2_vocab_load(path, &v, err, sizeof err) == -1 && strstr(err, "model.vocab") && !v.str);
    ZT_CHECK((f = fopen(path, "w")) != NULL && fputs("{\"model\": {\"vocab\": {\"a\": 0, \"b\" 1}}}", f) >= 0 &&
             fclose(f) == 0);
    ZT_CHECK(gpt2_vocab_load(path, &v, err, sizeof err) == -1 && strstr(err, "malformed"));
    ZT_CHECK((f = fopen(path, "w")) != NULL && fputs("{\"model\": {\"vocab\": {\"a\": 0, \"b\": 0}}}", f) >= 0 &&
             fclose(f) == 0);
    ZT_CHECK(gpt2_vocab_load(path, &v, err, sizeof err) == -1);
    remove(path);
    ZT_CHECK(gpt2_vocab_load(dir, &v, err, sizeof err) == -1 && strstr(err, "cannot open"));
    rmdir(dir);
}

int main(void)
{
    ZT_RUN(a_tokenizer_json_decodes);
    ZT_RUN(the_table_is_gpt2_small_under_hf_names);
    ZT_RUN(the_fine_tuning_flags);
    ZT_RUN(init_from_a_hf_directory);
    ZT_RUN(the_loader_and_the_batches);
    ZT_RUN(the_schedule_and_the_flags);
    return zt_summary();
}
