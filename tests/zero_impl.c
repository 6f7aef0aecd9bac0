/* The implementation of zero.h, compiled once (build/zero_impl.o) and linked into every test
   program that does not define ZERO_IMPLEMENTATION itself (see the Makefile). */
#define ZERO_IMPLEMENTATION
#include "zero.h"
