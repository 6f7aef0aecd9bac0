/* examples/cuda_check.h: the CUDA examples' checked calls. Every engine, CUDA and cuBLAS
   call of an example goes through one of these; a failure prints what failed (the call's
   text and the reason) and jumps to the function's `done:` label with `r` set, where the
   function frees what it holds.

   Before including: define PROG (the program's name, a string literal, for the messages);
   each function using the macros declares `zero_result r` and a `done:` label. */
#ifndef EXAMPLES_CUDA_CHECK_H
#define EXAMPLES_CUDA_CHECK_H

#include <stdio.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

/* The example's own failures (CUDA, cuBLAS, host memory) say what failed here; the
   library's come with zero_last_error(). */
static zero_result fail(zero_result code, const char *what, const char *detail)
{
    fprintf(stderr, PROG ": %s: %s\n", what, detail);
    return code;
}

#define TRY(call)                                                                                    \
    do {                                                                                             \
        r = (call);                                                                                  \
        if (r != ZERO_OK) {                                                                          \
            fprintf(stderr, PROG ": %s: %s: %s\n", #call, zero_result_string(r), zero_last_error()); \
            goto done;                                                                               \
        }                                                                                            \
    } while (0)
#define CUDA(call)                                                                                   \
    do {                                                                                             \
        cudaError_t e_ = (call);                                                                     \
        if (e_ != cudaSuccess) {                                                                     \
            r = fail(ZERO_ERROR_DEVICE, #call, cudaGetErrorString(e_));                              \
            goto done;                                                                               \
        }                                                                                            \
    } while (0)
#define BLAS(call)                                                                                   \
    do {                                                                                             \
        cublasStatus_t s_ = (call);                                                                  \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                           \
            r = fail(ZERO_ERROR_DEVICE, #call, cublasGetStatusString(s_));                           \
            goto done;                                                                               \
        }                                                                                            \
    } while (0)

#endif
