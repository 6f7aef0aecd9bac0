/* Compile test: zero.h with its implementation, and zero_nccl.h's launcher bootstrap (the
   part that needs neither CUDA nor NCCL), in whatever language mode the Makefile asks for. */
#define ZERO_IMPLEMENTATION
#define ZERO_NCCL_IMPLEMENTATION
#define ZERO_NCCL_BOOTSTRAP_ONLY
#include "zero.h"
#include "zero_nccl.h"
#include <stdio.h>

#ifndef ZERO_STATIC
int zero_compile_other(void); /* compile_other.c: a second TU that only includes */
#endif

int main(void)
{
    zero_plan *plan = NULL;
    int bad = 0;
    if (zero_plan_create(&plan, NULL) != ZERO_OK) bad++;
    zero_plan_destroy(plan);
    if (zero_dtype_size(ZERO_BF16) != 2) bad++;
    if (zero_result_string(ZERO_ERROR_TIMEOUT)[0] == '\0') bad++;
    if (zero_launcher_name(ZERO_LAUNCHER_NONE)[0] == '\0') bad++;
#ifndef ZERO_STATIC
    bad += zero_compile_other();
#endif
    if (bad) printf("compile test: %d checks failed\n", bad);
    return bad ? 1 : 0;
}
