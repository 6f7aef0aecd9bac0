/* cudasim: the cuBLAS subset the project uses, as reference GEMMs on the simulated streams.

   cublasCreate / cublasDestroy / cublasSetStream / cublasGetStatusString, cublasGemmEx and
   cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F and A/B/C of CUDA_R_32F, CUDA_R_16F or
   CUDA_R_16BF (the types examples/train_gpu.cu and examples/train_gpt2.cu pass), column-major
   as cuBLAS: C = alpha op(A) op(B) + beta C, op(A) m x k, op(B) k x n, C m x n.

   What it checks at the call, as cuBLAS does (and the handle's stream on the handle's
   device, cudasim::stream_device): m, n, k, batch >= 0, lda >= rows of A as stored
   (m for CUBLAS_OP_N, k for CUBLAS_OP_T), ldb likewise, ldc >= m, a supported type and
   compute type (CUBLAS_STATUS_INVALID_VALUE / CUBLAS_STATUS_NOT_SUPPORTED). What a GPU would
   not report but corrupts memory: each operand's extent, (cols - 1) ld + rows elements for
   each of the batch's matrices at its stride, must lie inside one allocation of the handle's
   device (cudasim::check_access: pageable host memory, another device's memory, an overrun,
   a freed block): CUBLAS_STATUS_INVALID_VALUE with the harness's message naming the call
   and the operand.

   Arithmetic (documented, fixed): each element of C is the fp32 sum over p = 0..k-1 in
   increasing p of the fp32 products a_ip b_pj (16-bit operands widened exactly), no FMA
   (the harness compiles with -ffp-contract=off), then alpha sum, plus beta c in fp32 (C is
   not read when beta == 0, as cuBLAS), rounded once to C's type. cuBLAS on a GPU blocks the
   k loop, uses FMAs and picks its algorithm by shape and alignment: the last bits differ
   (docs/cuda.md). Runs on the handle's stream (cudasim::enqueue) in the order of the
   calls; alpha and beta are read at the call (CUBLAS_POINTER_MODE_HOST, the default). */
#ifndef CUDASIM_CUBLAS_V2_H
#define CUDASIM_CUBLAS_V2_H
#include <cuda_runtime.h>

#include "cudasim.h"
#include "library_types.h"
#include "sim_numeric.h"

#include <cstdint>
#include <cstdio>
#include <new>

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 } cublasOperation_t;
typedef enum { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

struct cublasContext {
    int device;
    cudaStream_t stream;
};
typedef struct cublasContext *cublasHandle_t;

inline const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

inline cublasStatus_t cublasCreate(cublasHandle_t *handle)
{
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new (std::nothrow) cublasContext;
    if (!*handle) return CUBLAS_STATUS_ALLOC_FAILED;
    (*handle)->device = cudasim::current_device();
    (*handle)->stream = 0; /* the legacy default stream, as cuBLAS */
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasDestroy(cublasHandle_t handle)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

namespace cudasim_blas {

struct operand {
    const void *p;
    cudasim_num::kind k;
    long long rows, cols, ld, stride; /* as stored: rows x cols, column-major */
};

inline bool kind_of(cudaDataType_t t, cudasim_num::kind *k)
{
    switch (t) {
    case CUDA_R_32F: *k = cudasim_num::F32; return true;
    case CUDA_R_16F: *k = cudasim_num::F16; return true;
    case CUDA_R_16BF: *k = cudasim_num::BF16; return true;
    default: return false;
    }
}

/* Elements spanned by one stored matrix, and by the batch. */
inline unsigned long long extent(const operand &o, int batch)
{
    unsigned long long one, all;
    if (o.rows == 0 || o.cols == 0 || batch == 0) return 0;
    one = (unsigned long long)(o.cols - 1) * (unsigned long long)o.ld + (unsigned long long)o.rows;
    all = one + (unsigned long long)(batch - 1) * (unsigned long long)(o.stride < 0 ? -o.stride : o.stride);
    return all;
}

inline cublasStatus_t gemm(const char *who, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                           long long sa, const void *B, cudaDataType_t bt, int ldb, long long sb, const void *beta,
                           void *C, cudaDataType_t ct, int ldc, long long sc, int batch,
                           cublasComputeType_t compute)
{
    operand oa, ob, oc;
    float al, be;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (compute != CUBLAS_COMPUTE_32F) {
        std::fprintf(stderr, "cudasim: %s: compute type %d is not simulated (CUBLAS_COMPUTE_32F only)\n", who,
                     (int)compute);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!kind_of(at, &oa.k) || !kind_of(bt, &ob.k) || !kind_of(ct, &oc.k)) {
        std::fprintf(stderr, "cudasim: %s: data types %d/%d/%d are not simulated (32F, 16F, 16BF)\n", who, (int)at,
                     (int)bt, (int)ct);
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) || m < 0 || n < 0 ||
        k < 0 || batch < 0 || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    oa.rows = ta == CUBLAS_OP_N ? m : k, oa.cols = ta == CUBLAS_OP_N ? k : m;
    ob.rows = tb == CUBLAS_OP_N ? k : n, ob.cols = tb == CUBLAS_OP_N ? n : k;
    oc.rows = m, oc.cols = n;
    oa.ld = lda, ob.ld = ldb, oc.ld = ldc;
    oa.stride = sa, ob.stride = sb, oc.stride = sc;
    oa.p = A, ob.p = B, oc.p = C;
    if (lda < (oa.rows > 1 ? oa.rows : 1) || ldb < (ob.rows > 1 ? ob.rows : 1) || ldc < (m > 1 ? m : 1)) {
        std::fprintf(stderr, "cudasim: %s: lda %d, ldb %d, ldc %d below the stored rows %lld, %lld, %d\n", who, lda,
                     ldb, ldc, oa.rows, ob.rows, m);
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    {
        int sd = cudasim::stream_device(h->stream);
        if (sd >= 0 && sd != h->device) {
            cudasim::fail(cudaErrorInvalidResourceHandle, "%s: the handle's stream is on device %d, the handle on %d",
                          who, sd, h->device);
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    al = *(const float *)alpha;
    be = *(const float *)beta;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    {
        const operand *ops[3] = {&oa, &ob, &oc};
        const char *names[3] = {"A", "B", "C"};
        for (int i = 0; i < 3; i++) {
            unsigned long long e = extent(*ops[i], batch);
            if (i < 2 && (k == 0 || al == 0.0f)) continue; /* A and B are not read */
            if (i == 2 && e == 0) continue;
            if (!ops[i]->p) {
                std::fprintf(stderr, "cudasim: %s: operand %s is NULL\n", who, names[i]);
                return CUBLAS_STATUS_INVALID_VALUE;
            }
            if (!cudasim::check_access(h->device, ops[i]->p, (size_t)(e * cudasim_num::kind_size(ops[i]->k)), who,
                                       names[i]))
                return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    cudaError_t e = cudasim::enqueue(h->stream, who, [=]() -> cudaError_t {
        for (int b = 0; b < batch; b++) {
            const char *pa = (const char *)oa.p + (long long)b * oa.stride * (long long)cudasim_num::kind_size(oa.k);
            const char *pb = (const char *)ob.p + (long long)b * ob.stride * (long long)cudasim_num::kind_size(ob.k);
            char *pc = (char *)oc.p + (long long)b * oc.stride * (long long)cudasim_num::kind_size(oc.k);
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    float sum = 0.0f, out;
                    for (int p = 0; p < (al == 0.0f ? 0 : k); p++) { /* alpha 0: A, B unread */
                        size_t ia = ta == CUBLAS_OP_N ? (size_t)i + (size_t)p * (size_t)lda
                                                      : (size_t)p + (size_t)i * (size_t)lda;
                        size_t ib = tb == CUBLAS_OP_N ? (size_t)p + (size_t)j * (size_t)ldb
                                                      : (size_t)j + (size_t)p * (size_t)ldb;
                        float x = (float)cudasim_num::load(pa, ia, oa.k), y = (float)cudasim_num::load(pb, ib, ob.k);
                        float prod = x * y;
                        sum = sum + prod;
                    }
                    out = al * sum;
                    if (be != 0.0f) {
                        float cb = be * (float)cudasim_num::load(pc, (size_t)i + (size_t)j * (size_t)ldc, oc.k);
                        out = out + cb;
                    }
                    cudasim_num::store(pc, (size_t)i + (size_t)j * (size_t)ldc, oc.k, out);
                }
        }
        return cudaSuccess;
    });
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

} /* namespace cudasim_blas */

inline cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                   int n, int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda,
                                   const void *B, cudaDataType_t Btype, int ldb, const void *beta, void *C,
                                   cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                                   cublasGemmAlgo_t algo)
{
    (void)algo;
    return cudasim_blas::gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype,
                              ldb, 0, beta, C, Ctype, ldc, 0, 1, computeType);
}

inline cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                                 cublasOperation_t transb, int m, int n, int k, const void *alpha,
                                                 const void *A, cudaDataType_t Atype, int lda, long long strideA,
                                                 const void *B, cudaDataType_t Btype, int ldb, long long strideB,
                                                 const void *beta, void *C, cudaDataType_t Ctype, int ldc,
                                                 long long strideC, int batchCount, cublasComputeType_t computeType,
                                                 cublasGemmAlgo_t algo)
{
    (void)algo;
    return cudasim_blas::gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda,
                              strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount,
                              computeType);
}

#endif
