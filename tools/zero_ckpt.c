/* zero-ckpt - inspect, verify and export zero checkpoints. Tensor names are printed with
   control characters, backslashes and bytes that are not UTF-8 as \xNN.

     zero-ckpt info DIR                    manifest, ranks, tensors, sizes; verifies every
                                           checksum (exit 1 naming the first bad file)
     zero-ckpt export DIR OUT.safetensors [--dtype f32|f16|bf16] [--force]
                                           consolidated weights (default f32: the master);
                                           refuses an existing OUT without --force, and any
                                           OUT inside a checkpoint directory
     zero-ckpt export DIR --hf OUTDIR [--heads H] [--dtype ...] [--force]
                                           a GPT-2 checkpoint (the example's Hugging Face
                                           names) as a directory GPT2LMHeadModel.from_pretrained
                                           loads: OUTDIR/model.safetensors + config.json; the
                                           shape from the tensors, the heads from --heads or
                                           train_gpt2's client state

   Exit status: 0 ok, 1 a bad or missing checkpoint (message on stderr), 2 bad arguments. */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#include "examples/gpt2_common.h" /* --hf: config.json, train_gpt2's client state */

#include <sys/stat.h>

static const char *usage_text =
    "usage: zero-ckpt info DIR | zero-ckpt export DIR OUT.safetensors [--dtype f32|f16|bf16] [--force]\n"
    "       zero-ckpt export DIR --hf OUTDIR [--heads H] [--dtype f32|f16|bf16] [--force]\n"
    "       zero-ckpt --help\n";

static int usage(void)
{
    fputs(usage_text, stderr);
    return 2;
}

/* An argument this tool does not take, named, then the usage. */
static int bad_arg(const char *arg, const char *why)
{
    fprintf(stderr, "zero-ckpt: %s: %s\n", arg, why);
    return usage();
}

/* A tensor name as text a terminal shows as it is: control characters, DEL, backslash and
   bytes that are not UTF-8 (a manifest written by another program) as \xNN escapes. */
static void print_name(const char *name, int width)
{
    char out[1100];
    size_t at = 0, i, n = strlen(name);
    int shown = 0;
    for (i = 0; i < n && at + 8 < sizeof out; i++) {
        unsigned char c = (unsigned char)name[i];
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2; /* of a character starting at c */
        if (c >= 0x80 && len <= n - i &&
            zero__utf8_bad((const unsigned char *)name + i, len) == len) { /* (zero.h's check) */
            memcpy(out + at, name + i, len);
            at += len;
            i += len - 1;
            shown++;
        } else if (c < 0x20 || c == 0x7f || c == '\\' || c >= 0x80) {
            at += (size_t)snprintf(out + at, sizeof out - at, "\\x%02x", c);
            shown += 4;
        } else {
            out[at++] = (char)c;
            shown++;
        }
    }
    out[at] = '\0';
    printf("%s%*s", out, shown < width ? width - shown : 0, "");
}

static int fail(const char *what)
{
    fprintf(stderr, "zero-ckpt: %s: %s\n", what, zero_last_error());
    return 1;
}

static int info(const char *dir)
{
    zero_checkpoint *ck = NULL;
    zero_checkpoint_info in;
    int t, k;
    if (zero_checkpoint_open(dir, &ck) != ZERO_OK) return fail("open");
    memset(&in, 0, sizeof in); /* gcc -O2 -DZERO_STATIC (make) cannot see every field written */
    if (zero_checkpoint_get_info(ck, &in) != ZERO_OK) {
        int rc = fail("info");
        zero_checkpoint_close(ck);
        return rc;
    }
    printf("checkpoint %s\n", dir);
    printf("  generation %llu, step %lld, world %d, stage %d, params %s, align %zu\n",
           (unsigned long long)in.generation, (long long)in.step, in.world, in.stage,
           zero_dtype_name(in.param_dtype), in.align_numel);
    printf("  adam: %s lr %.9g beta1 %.9g beta2 %.9g eps %.9g weight_decay %.9g\n",
           in.adam.mode == ZERO_ADAM ? "adam" : "adamw", (double)in.adam.lr,
           (double)in.adam.beta1, (double)in.adam.beta2, (double)in.adam.eps,
           (double)in.adam.weight_decay);
    printf("  scaler: %s scale %.9g factor %g min %g window %d hysteresis %d/%d%s iter %lld "
           "last overflow %lld\n",
           in.scaler.dynamic ? "dynamic" : "fixed", (double)in.scaler.scale,
           (double)in.scaler.factor, (double)in.scaler.min_scale, in.scaler.window,
           in.scaler.cur_hysteresis, in.scaler.hysteresis,
           in.scaler.consecutive_hysteresis ? " (consecutive)" : "", (long long)in.scaler.iter,
           (long long)in.scaler.last_overflow_iter);
    printf("  plan hash %016llx, %d groups, %d tensors, %llu bytes in %d shard files + manifest\n",
           (unsigned long long)in.plan_hash, in.num_groups, in.num_tensors,
           (unsigned long long)in.total_bytes, in.world);
    if (in.client_bytes)
        printf("  client state %llu bytes (zero-%016llx.client)\n",
               (unsigned long long)in.client_bytes, (unsigned long long)in.generation);
    for (t = 0; t < in.world; t++) { /* the shard files, by the names docs/checkpoint.md gives */
        char path[4200];
        struct stat st;
        snprintf(path, sizeof path, "%s/zero-%016llx-%05d.shard", dir,
                 (unsigned long long)in.generation, t);
        if (stat(path, &st) == 0)
            printf("  rank %5d  %s  %lld bytes\n", t, path, (long long)st.st_size);
        else
            printf("  rank %5d  %s  MISSING\n", t, path);
    }
    for (t = 0; t < in.num_tensors; t++) {
        zero_checkpoint_tensor ti;
        memset(&ti, 0, sizeof ti);
        if (zero_checkpoint_get_tensor(ck, t, &ti) != ZERO_OK) break;
        printf("  tensor ");
        print_name(ti.name, 32);
        printf(" group %3d  numel %12zu  shape [", ti.group, ti.numel);
        if (ti.ndim == 0) printf("%zu", ti.numel);
        for (k = 0; k < ti.ndim; k++) printf("%s%llu", k ? ", " : "", (unsigned long long)ti.dims[k]);
        printf("]%s\n", (ti.flags & ZERO_TENSOR_NO_DECAY) ? "  no-decay" : "");
    }
    if (zero_checkpoint_verify(ck) != ZERO_OK) {
        int rc = fail("verify");
        zero_checkpoint_close(ck);
        return rc;
    }
    printf("  verified: sizes, header and section checksums of %d shard files ok\n", in.world);
    zero_checkpoint_close(ck);
    return 0;
}

/* export --hf: the checkpoint of train_gpt2 (tensors under GPT2LMHeadModel's names) as
   OUTDIR/model.safetensors (zero_checkpoint_export) and OUTDIR/config.json. n_layer,
   n_embd, vocab_size, n_positions come from the tensors; n_head, which no shape shows, from
   heads (> 0) or the checkpoint's client state when it is train_gpt2's; the other keys from
   DIR/config.json when the checkpoint has one (train_gpt2 --save keeps --init DIR's there),
   its keys zero does not know included (gpt2_hf_config_write_from). */
static int export_hf(const char *ckdir, const char *out, zero_dtype dt, int heads, int force)
{
    zero_checkpoint *ck = NULL;
    zero_checkpoint_info in;
    char err[600], path[4200], base[4200];
    int t, layers = 0, channels = 0, vocab = 0, positions = 0, rc = 1;
    if (zero_checkpoint_open(ckdir, &ck) != ZERO_OK) return fail("open");
    memset(&in, 0, sizeof in);
    if (zero_checkpoint_get_info(ck, &in) != ZERO_OK) {
        rc = fail("info");
        goto out;
    }
    for (t = 0; t < in.num_tensors; t++) {
        zero_checkpoint_tensor ti;
        int l = -1, used = 0;
        memset(&ti, 0, sizeof ti);
        if (zero_checkpoint_get_tensor(ck, t, &ti) != ZERO_OK) {
            rc = fail("info");
            goto out;
        }
        if (!strcmp(ti.name, "transformer.wte.weight") && ti.ndim == 2)
            vocab = (int)ti.dims[0], channels = (int)ti.dims[1];
        else if (!strcmp(ti.name, "transformer.wpe.weight") && ti.ndim == 2) positions = (int)ti.dims[0];
        else if (sscanf(ti.name, "transformer.h.%d.ln_1.weight%n", &l, &used) == 1 && used == (int)strlen(ti.name) &&
                 l + 1 > layers)
            layers = l + 1;
    }
    if (!vocab || !positions || !layers) {
        fprintf(stderr, "zero-ckpt: export --hf: %s is not a GPT-2 checkpoint under Hugging Face's names (no "
                "transformer.wte.weight, transformer.wpe.weight or transformer.h.N; a --tile-embedding "
                "checkpoint holds wte in tiles)\n", ckdir);
        goto out;
    }
    if (heads <= 0) { /* train_gpt2's client state records the shape */
        gpt2_client cl;
        memset(&cl, 0, sizeof cl);
        if (in.client_bytes == sizeof cl && zero_checkpoint_read_client(ck, &cl) == ZERO_OK &&
            cl.magic == GPT2_CLIENT_MAGIC && cl.shape[2] == channels && cl.shape[1] > 0)
            heads = cl.shape[1];
        if (heads <= 0) {
            fprintf(stderr, "zero-ckpt: export --hf: %s does not record the number of heads (its client state "
                    "is not train_gpt2's): give --heads H\n", ckdir);
            goto out;
        }
    }
    if (channels % heads) {
        fprintf(stderr, "zero-ckpt: export --hf: n_embd %d is not a multiple of --heads %d\n", channels, heads);
        goto out;
    }
    if (gpt2_hf_dir_prepare(out, force, err, sizeof err) != 0) {
        fprintf(stderr, "zero-ckpt: export --hf: %s\n", err);
        goto out;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    if (zero_checkpoint_export(ck, path, dt) != ZERO_OK) {
        rc = fail("export");
        goto out;
    }
    snprintf(base, sizeof base, "%s/config.json", ckdir); /* train_gpt2 --save keeps --init's */
    if (gpt2_hf_config_write_from(out, layers, heads, channels, positions, vocab,
                                  dt == ZERO_F32 ? "float32" : dt == ZERO_BF16 ? "bfloat16" : "float16",
                                  access(base, R_OK) == 0 ? base : NULL, err, sizeof err) != 0) {
        fprintf(stderr, "zero-ckpt: export --hf: %s\n", err);
        goto out;
    }
    printf("wrote %s/config.json and %s (%s): GPT2LMHeadModel, n_layer %d, n_head %d, n_embd %d, n_positions %d, "
           "vocab_size %d\n", out, path, zero_dtype_name(dt), layers, heads, channels, positions, vocab);
    rc = 0;
out:
    zero_checkpoint_close(ck);
    return rc;
}

int main(int argc, char **argv)
{
    int a;
    for (a = 1; a < argc; a++)
        if (strcmp(argv[a], "--help") == 0 || strcmp(argv[a], "-h") == 0) {
            fputs(usage_text, stdout);
            return 0;
        }
    for (a = 1; a < argc; a++) { /* an option other than export's --dtype, --hf, --heads VALUE */
        if (strcmp(argv[a], "--dtype") == 0 || strcmp(argv[a], "--hf") == 0 || strcmp(argv[a], "--heads") == 0) a++;
        else if (strncmp(argv[a], "--", 2) == 0 && strcmp(argv[a], "--force") != 0)
            return bad_arg(argv[a], "unknown option");
    }
    if (argc >= 2 && strcmp(argv[1], "info") != 0 && strcmp(argv[1], "export") != 0)
        return bad_arg(argv[1], "unknown command (info or export)");
    if (argc == 3 && strcmp(argv[1], "info") == 0) return info(argv[2]);
    if (argc >= 4 && argc <= 10 && strcmp(argv[1], "export") == 0) {
        zero_dtype dt = ZERO_F32;
        zero_checkpoint *ck = NULL;
        struct stat st;
        const char *hf = NULL;
        int rc = 0, i, force = 0, heads = 0;
        for (i = strcmp(argv[3], "--hf") == 0 ? 3 : 4; i < argc; i++) {
            if (strcmp(argv[i], "--force") == 0) {
                force = 1;
            } else if (strcmp(argv[i], "--hf") == 0 && i + 1 < argc && !hf) {
                hf = argv[++i];
            } else if (strcmp(argv[i], "--heads") == 0 && i + 1 < argc) {
                char *end = NULL;
                long h = strtol(argv[++i], &end, 10);
                if (!end || *end || h < 1 || h > 1000000) return bad_arg(argv[i], "not a number of heads");
                heads = (int)h;
            } else if (strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
                i++;
                if (strcmp(argv[i], "f32") == 0) dt = ZERO_F32;
                else if (strcmp(argv[i], "f16") == 0) dt = ZERO_F16;
                else if (strcmp(argv[i], "bf16") == 0) dt = ZERO_BF16;
                else return bad_arg(argv[i], "not a dtype (f32, f16 or bf16)");
            } else {
                return bad_arg(argv[i], "unexpected argument");
            }
        }
        if (hf && strcmp(argv[3], "--hf") != 0) return bad_arg(argv[3], "--hf takes the place of OUT.safetensors");
        if (heads && !hf) return bad_arg("--heads", "only with --hf");
        if (hf) return export_hf(argv[2], hf, dt, heads, force);
        if (!force && lstat(argv[3], &st) == 0) {
            fprintf(stderr, "zero-ckpt: export: %s exists (add --force to replace it)\n", argv[3]);
            return 1;
        }
        if (zero_checkpoint_open(argv[2], &ck) != ZERO_OK) return fail("open");
        if (zero_checkpoint_export(ck, argv[3], dt) != ZERO_OK) rc = fail("export");
        else printf("wrote %s (%s)\n", argv[3], zero_dtype_name(dt));
        zero_checkpoint_close(ck);
        return rc;
    }
    return usage();
}
