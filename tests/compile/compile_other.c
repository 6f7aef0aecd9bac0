/* Compile test: a second translation unit that includes zero.h without the
   implementation, to catch definitions that would be duplicated at link time, and the
   declarations of zero_cuda.h and zero_nccl.h, which are plain C. */
#include "zero.h"
#include "zero_cuda.h"
#include "zero_nccl.h"

int zero_compile_other(void);
int zero_compile_other(void)
{
    return zero_dtype_size(ZERO_F16) == 2 ? 0 : 1;
}
