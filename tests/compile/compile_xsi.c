/* Compile test: zero.h with its implementation included FIRST must hide nothing the C
   library offers the user's code. Before, the implementation defined _POSIX_C_SOURCE, which
   under glibc turns off the default feature set: M_PI vanished (llm.c's train_gpt2.c stopped
   at GELU_SCALING_FACTOR) and so did XSI and BSD names. The Makefile builds this with gcc
   and clang under -std=c99, c11 (strict: zero.h asks for X/Open 7, whose M_PI and XSI names
   are checked) and gnu11 (the default mode: the BSD/misc names are checked too), and runs
   it. */
#define ZERO_IMPLEMENTATION
#include "zero.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define GELU_SCALING_FACTOR sqrtf(2.0f / M_PI) /* as llm.c writes it */

int main(void)
{
    char *copy = strdup("zero");                     /* XSI / POSIX 2008 */
    double e = M_E, pi = M_PI, r2 = M_SQRT2;         /* XSI <math.h>     */
    long r;
    int ok;
    srandom(7);                                      /* XSI <stdlib.h>   */
    r = random();
    ok = copy && strcasecmp(copy, "ZERO") == 0 && fabs(pi - 3.14159265358979) < 1e-12 && e > 2.7 && r2 > 1.41 &&
         r >= 0 && GELU_SCALING_FACTOR > 0.79f && GELU_SCALING_FACTOR < 0.80f;
#ifndef __STRICT_ANSI__
    {   /* the default mode's BSD/misc names */
        char buf[16] = "a,b", *p = buf, *tok = strsep(&p, ",");
        ok = ok && tok && strcmp(tok, "a") == 0;
    }
#endif
    free(copy);
    if (!ok) {
        printf("compile_xsi: wrong values\n");
        return 1;
    }
    return zero_dtype_size(ZERO_F32) == 4 ? 0 : 1;
}
