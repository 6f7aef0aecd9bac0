/* cudasim: CUDA's library_types.h, the subset the project uses (cudaDataType_t for cuBLAS).
   Values are CUDA's. Part of the NCCL/cuBLAS half of the harness (tests/cudasim/README.md). */
#ifndef CUDASIM_LIBRARY_TYPES_H
#define CUDASIM_LIBRARY_TYPES_H
typedef enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14
} cudaDataType_t;
typedef cudaDataType_t cudaDataType;
#endif
