# zero - build, test and bench. Everything lands in build/.
#   make               the CPU library tests, examples, tools and benches
#   make test          the CPU suite (ends with "N passed, N failed, N skipped")
#   make demo          the main job
#   make test-sanitize the CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make compile-tests zero.h as C99 -pedantic, C11, C++17 and ZERO_STATIC, gcc and clang
#   make cuda          compile and link the CUDA/NCCL parts with nvcc (skips without it)
#   make test-cuda     run the GPU tests (one skip line without a GPU)
#   make bench / bench-cuda
CC      ?= cc
CXX     ?= c++
ifeq ($(origin CC),default)
CC := gcc
endif
ifeq ($(origin CXX),default)
CXX := g++
endif
WARN    := -Wall -Wextra -Wpedantic -Werror
CFLAGS  ?= -O2 -g
ALL_CFLAGS := -std=c11 $(WARN) $(CFLAGS) -pthread -I.
LDLIBS  := -lm -pthread
SAN_FLAGS := -std=c11 $(WARN) -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined \
             -fno-sanitize-recover=all -pthread -I.

HEADERS  := zero.h $(wildcard src/*.h)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TESTS    := $(patsubst tests/%.c,build/%,$(TEST_SRC))
SAN_TESTS := $(patsubst tests/%.c,build/san/%,$(TEST_SRC))
EXAMPLES := $(patsubst examples/%.c,build/%,$(sort $(wildcard examples/*.c)))
BENCHES  := $(patsubst bench/%.c,build/%,$(sort $(wildcard bench/*.c)))
TOOLS    := build/zero-estimate

.PHONY: all test demo test-sanitize compile-tests cuda test-cuda bench bench-cuda clean
all: $(TESTS) $(EXAMPLES) $(BENCHES) $(TOOLS)

build build/san build/compile build/cuda:
	@mkdir -p $@

build/test_%: tests/test_%.c $(HEADERS) tests/zt.h | build
	$(CC) $(ALL_CFLAGS) $< -o $@ $(LDLIBS)

build/san/test_%: tests/test_%.c $(HEADERS) tests/zt.h | build/san
	$(CC) $(SAN_FLAGS) $< -o $@ $(LDLIBS)

build/zero-estimate: tools/zero_estimate.c $(HEADERS) | build
	$(CC) $(ALL_CFLAGS) $< -o $@ $(LDLIBS)

build/%: examples/%.c $(HEADERS) | build
	$(CC) $(ALL_CFLAGS) $< -o $@ $(LDLIBS)

build/bench_%: bench/bench_%.c $(HEADERS) | build
	$(CC) $(ALL_CFLAGS) -O3 -march=native $< -o $@ $(LDLIBS)

test: $(TESTS)
	@bash tests/run.sh $(TESTS)

test-sanitize: $(SAN_TESTS)
	@ZT_QUICK=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 bash tests/run.sh $(SAN_TESTS)

DEMO ?= build/zero-estimate --params 7.5e9 --ranks 64
demo: all
	$(DEMO)

bench: $(BENCHES)
	@for b in $(BENCHES); do echo "== $$b"; $$b || exit 1; done

# ---- compile tests: the header in every language mode we promise ------------------------
COMPILE_SRC := tests/compile/compile_main.c tests/compile/compile_other.c
compile-tests: | build/compile
	@set -e; for cc in gcc clang; do \
	  command -v $$cc >/dev/null || { echo "compile-tests: $$cc not found"; exit 1; }; \
	  for std in c99 c11; do \
	    $$cc -std=$$std $(WARN) -O1 -I. $(COMPILE_SRC) -o build/compile/$$cc-$$std -lm -pthread; \
	    ./build/compile/$$cc-$$std; \
	  done; \
	  $$cc -std=c11 $(WARN) -O1 -I. -DZERO_STATIC tests/compile/compile_main.c -o build/compile/$$cc-static -lm -pthread; \
	  ./build/compile/$$cc-static; \
	done; \
	for cxx in g++ clang++; do \
	  $$cxx -std=c++17 $(WARN) -O1 -I. -x c++ $(COMPILE_SRC) -o build/compile/$$cxx-cxx17 -lm -pthread; \
	  ./build/compile/$$cxx-cxx17; \
	done; echo "compile-tests: C99, C11, C++17 and ZERO_STATIC with gcc and clang: ok"

# ---- CUDA and NCCL ------------------------------------------------------------------------
NVCC ?= $(shell command -v nvcc 2>/dev/null)
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)),/usr/local/cuda)
# NCCL: NCCL_HOME if given, else next to CUDA, the system, or PyTorch's nvidia-nccl wheel.
NCCL_HOME ?= $(firstword $(foreach d,$(CUDA_HOME) /usr /usr/local \
    $(shell python3 -c 'import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null), \
    $(if $(wildcard $(d)/include/nccl.h),$(d))))
NCCL_LIBDIR := $(firstword $(foreach d,$(NCCL_HOME)/lib $(NCCL_HOME)/lib64 $(NCCL_HOME)/lib/x86_64-linux-gnu,$(if $(wildcard $(d)/libnccl.so*),$(d))))
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80
NVCC_FLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings -I.
NCCL_FLAGS := $(if $(NCCL_HOME),-I$(NCCL_HOME)/include) $(if $(NCCL_LIBDIR),-L$(NCCL_LIBDIR) -Xlinker -rpath=$(NCCL_LIBDIR))
CUDA_HEADERS := $(HEADERS) $(wildcard zero_cuda.h zero_nccl.h)
CUDA_SRC := $(sort $(wildcard tests/cuda/*.cu bench/*.cu examples/*.cu))
CUDA_BINS := $(patsubst %.cu,build/cuda/%,$(notdir $(CUDA_SRC)))
vpath %.cu tests/cuda bench examples

build/cuda/%: %.cu $(CUDA_HEADERS) | build/cuda
	$(NVCC) $(NVCC_FLAGS) $(NCCL_FLAGS) $< -o $@ -lcublas -lnccl -lpthread

cuda:
	@if [ -z "$(NVCC)" ]; then echo "cuda: skipped: nvcc not found (set NVCC or CUDA_HOME)"; \
	 elif [ -z "$(CUDA_SRC)" ]; then echo "cuda: nothing to build yet"; \
	 else $(MAKE) --no-print-directory $(CUDA_BINS) && echo "cuda: built $(words $(CUDA_BINS)) programs with $(NVCC)"; fi

CUDA_TESTS := $(filter build/cuda/test_%,$(CUDA_BINS))
test-cuda: cuda
	@if [ -z "$(NVCC)" ]; then echo "test-cuda: skipped: nvcc not found"; \
	 elif ! nvidia-smi -L >/dev/null 2>&1; then echo "test-cuda: skipped: no GPU visible"; echo "0 passed, 0 failed, $(words $(CUDA_TESTS)) skipped"; \
	 else bash tests/run.sh $(CUDA_TESTS); fi

CUDA_BENCHES := $(filter build/cuda/bench_%,$(CUDA_BINS))
bench-cuda: cuda
	@if ! nvidia-smi -L >/dev/null 2>&1; then echo "bench-cuda: skipped: no GPU visible"; \
	 else for b in $(CUDA_BENCHES); do echo "== $$b"; $$b || exit 1; done; fi

clean:
	rm -rf build
