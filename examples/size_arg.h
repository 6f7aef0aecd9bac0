/* size_arg.h - the examples' one parser of a byte size on the command line ("4MB", "64MiB",
   "300KiB", "1GB" or plain bytes), shared by train_mlp.c and gpt2_common.h. */
#ifndef ZERO_EXAMPLES_SIZE_ARG_H
#define ZERO_EXAMPLES_SIZE_ARG_H
#include <stdlib.h>
#include <string.h>

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

#endif
