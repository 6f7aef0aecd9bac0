/* size_arg.h - the examples' command-line helpers, shared by train_mlp.c and gpt2_common.h:
   the one parser of a byte size ("4MB", "64MiB", "300KiB", "1GB" or plain bytes), engine
   messages in the flags' names, and --nvme-path's directory. */
#ifndef ZERO_EXAMPLES_SIZE_ARG_H
#define ZERO_EXAMPLES_SIZE_ARG_H
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The size in bytes; 0 on a malformed, non-positive or too large size. */
static inline size_t example_parse_size(const char *v)
{
    static const struct {
        const char *suffix;
        double mul;
    } units[] = {
        {"", 1.0}, {"B", 1.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
    };
    char *end;
    double x = strtod(v, &end);
    size_t u;
    if (end == v || !(x > 0)) return 0;
    for (u = 0; u < sizeof units / sizeof units[0]; u++)
        if (!strcmp(end, units[u].suffix)) {
            x *= units[u].mul;
            return x < 1.8e19 ? (size_t)x : 0;
        }
    return 0;
}

/* An engine message with the descriptor's field names (offload_optimizer, nvme_path, ...)
   replaced by the flags that set them ("offload_param = cpu": "--offload-param cpu"), into
   buf (n bytes); returns buf. */
static inline const char *example_flags_named(const char *msg, char *buf, size_t n)
{
    static const char *const map[][2] = {
        {"offload_optimizer", "--offload-optimizer"}, {"offload_param", "--offload-param"},
        {"offload_gradients", "--offload-gradients"}, {"offload_activations", "--offload-activations"},
        {"nvme_path", "--nvme-path"}, {"accum_steps", "--accum"}, {"clip_norm", "--clip"},
        {"param_dtype", "--dtype"}, {"device_memory", "--device-memory"}};
    size_t used = 0, k;
    if (n == 0) return buf;
    while (*msg && used + 1 < n) {
        for (k = 0; k < sizeof map / sizeof map[0]; k++)
            if (!strncmp(msg, map[k][0], strlen(map[k][0]))) break;
        if (k < sizeof map / sizeof map[0] && used + strlen(map[k][1]) + 1 < n) {
            memcpy(buf + used, map[k][1], strlen(map[k][1]));
            used += strlen(map[k][1]);
            msg += strlen(map[k][0]);
            if (!strncmp(msg, " = ", 3) || *msg == '=') { /* "field=cpu" as typed: "--flag cpu" */
                msg += *msg == '=' ? 1 : 3;
                buf[used++] = ' ';
            }
        } else {
            buf[used++] = *msg++;
        }
    }
    buf[used] = '\0';
    return buf;
}

/* Creates --nvme-path's directory when it is missing (as --save creates its own; one level,
   like zero_engine_save). 0, or -1 with a sentence in err. */
static inline int example_nvme_dir(const char *path, char *err, size_t n)
{
    if (!path || mkdir(path, 0777) == 0 || errno == EEXIST) return 0;
    snprintf(err, n, "--nvme-path %s: cannot create it: %s", path, strerror(errno));
    return -1;
}

#endif
