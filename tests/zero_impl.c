/* The implementation of zero.h, and of zero_nccl.h's TCP bootstrap (the part that needs
   neither CUDA nor NCCL), compiled once (build/zero_impl.o) and linked into every test
   program that does not define ZERO_IMPLEMENTATION itself (see the Makefile). */
#define ZERO_IMPLEMENTATION
#include "zero.h"
#define ZERO_NCCL_BOOTSTRAP_ONLY
#define ZERO_NCCL_IMPLEMENTATION
#include "zero_nccl.h"
