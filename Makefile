# zero - build, test and bench. Everything lands in build/.
#   make               the CPU library tests, examples, tools and benches
#   make test          the CPU suite (ends with "N passed, N failed, N skipped")
#   make demo          the main job
#   make test-sanitize the CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make compile-tests zero.h as C99 -pedantic, C11, C++17 and ZERO_STATIC, gcc and clang
#   make cuda          compile and link the CUDA/NCCL parts with nvcc (skips without it)
#   make test-cuda     run the GPU tests (one skip line without a GPU)
#   make sanitize-cuda the GPU tests under compute-sanitizer (memcheck, racecheck, synccheck)
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

HEADERS  := zero.h $(wildcard zero_nccl.h)
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TESTS    := $(patsubst tests/%.c,build/%,$(TEST_SRC))
SAN_TESTS := $(patsubst tests/%.c,build/san/%,$(TEST_SRC))
EXAMPLES := $(patsubst examples/%.c,build/%,$(sort $(wildcard examples/*.c)))
BENCHES  := $(patsubst bench/%.c,build/%,$(sort $(wildcard bench/*.c)))
TOOLS    := build/zero-estimate build/zero-ckpt

.PHONY: all test demo test-sanitize compile-tests cuda test-cuda sanitize-cuda bench bench-cuda clean \
        test-ckpt-kill fuzz test-safetensors-py
all: $(TESTS) $(EXAMPLES) $(BENCHES) $(TOOLS)

build build/san build/compile build/cuda:
	@mkdir -p $@

build/test_%: tests/test_%.c $(HEADERS) $(wildcard tests/*.h) | build
	$(CC) $(ALL_CFLAGS) $< -o $@ $(LDLIBS)

build/san/test_%: tests/test_%.c $(HEADERS) $(wildcard tests/*.h) | build/san
	$(CC) $(SAN_FLAGS) $< -o $@ $(LDLIBS)

build/zero-estimate: tools/zero_estimate.c $(HEADERS) | build
	$(CC) $(ALL_CFLAGS) $< -o $@ $(LDLIBS)

build/zero-ckpt: tools/zero_ckpt.c $(HEADERS) | build
	$(CC) $(ALL_CFLAGS) $< -o $@ $(LDLIBS)

build/%: examples/%.c $(HEADERS) $(wildcard examples/*.h) | build
	$(CC) $(ALL_CFLAGS) $< -o $@ $(LDLIBS)

build/bench_%: bench/bench_%.c $(HEADERS) | build
	$(CC) $(ALL_CFLAGS) -O3 -march=native $< -o $@ $(LDLIBS)

test: $(TESTS) $(TOOLS)
	@bash tests/run.sh $(TESTS)

test-sanitize: $(SAN_TESTS) $(TOOLS)
	@ZT_QUICK=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 bash tests/run.sh $(SAN_TESTS)

# ---- checkpoints: the full kill test, libFuzzer harnesses, the Python safetensors check ----
test-ckpt-kill: build/test_checkpoint
	ZERO_CKPT_KILLS=$${ZERO_CKPT_KILLS:-200} build/test_checkpoint

# make fuzz: each harness replays the committed corpus of malformed files, then fuzzes for
# FUZZ_TIME seconds (FUZZ_RUNS=10000000 for a long run). Needs clang's libFuzzer runtime.
FUZZ_CC ?= clang
FUZZ_TIME ?= 20
FUZZ_RUNS ?= -1
FUZZERS := build/fuzz/fuzz_ckpt build/fuzz/fuzz_safetensors
build/fuzz:
	@mkdir -p $@
build/fuzz/fuzz_%: fuzz/fuzz_%.c $(HEADERS) | build/fuzz
	$(FUZZ_CC) -std=c11 $(WARN) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -I. $< -o $@ -lm -pthread
fuzz: $(FUZZERS)
	@set -e; for f in ckpt safetensors; do \
	  echo "== fuzz_$$f: corpus replay"; build/fuzz/fuzz_$$f -runs=0 fuzz/corpus/$$f 2>&1 | tail -n 1; \
	  rm -rf build/fuzz/work-$$f; cp -r fuzz/corpus/$$f build/fuzz/work-$$f; \
	  echo "== fuzz_$$f: $(FUZZ_TIME) s"; build/fuzz/fuzz_$$f -max_total_time=$(FUZZ_TIME) -runs=$(FUZZ_RUNS) \
	    -print_final_stats=1 build/fuzz/work-$$f 2>&1 | grep -E "^(stat::number_of_executed_units|Done|==.*ERROR)"; \
	done

# The exports checked by the reference safetensors package (a venv with safetensors + numpy),
# and the checkpoint read by tests/read_checkpoint.py, written from docs/checkpoint.md alone.
PYTHON ?= python3
test-safetensors-py: build/test_checkpoint
	@rm -rf build/st-py && mkdir -p build/st-py
	ZERO_ST_EXPORT_DIR=build/st-py build/test_checkpoint >/dev/null
	$(PYTHON) tests/check_safetensors.py build/st-py
	$(PYTHON) tests/read_checkpoint.py build/st-py/st build/st-py/expect.json build/st-py/expect-f32.bin

DEMO ?= build/train_mlp
demo: build/train_mlp
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
	done; echo "compile-tests: zero.h (+ zero_nccl.h bootstrap, zero_cuda.h/zero_nccl.h declarations) as C99, C11, C++17 and ZERO_STATIC with gcc and clang: ok"

# ---- CUDA and NCCL ------------------------------------------------------------------------
# nvcc: NVCC if given; else CUDA_HOME/bin/nvcc if CUDA_HOME is given; else nvcc on PATH;
# else /usr/local/cuda/bin/nvcc. CUDA_HOME then defaults to where that nvcc lives.
ifeq ($(origin NVCC),undefined)
ifneq ($(CUDA_HOME),)
NVCC := $(wildcard $(CUDA_HOME)/bin/nvcc)
else
NVCC := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
endif
endif
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(realpath $(NVCC))),/usr/local/cuda)
# NCCL: NCCL_HOME if given, else next to CUDA, the system, or PyTorch's nvidia-nccl wheel
# (site-packages/nvidia/nccl, a namespace package with include/ and lib/libnccl.so.2).
ifeq ($(origin NCCL_HOME),undefined)
NCCL_HOME := $(firstword $(foreach d,$(CUDA_HOME) /usr /usr/local \
    $(shell python3 -c 'import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null), \
    $(if $(wildcard $(d)/include/nccl.h),$(d))))
endif
NCCL_LIBDIR := $(firstword $(foreach d,$(NCCL_HOME)/lib $(NCCL_HOME)/lib64 $(NCCL_HOME)/lib/x86_64-linux-gnu,$(if $(wildcard $(d)/libnccl.so*),$(d))))
# A wheel ships only libnccl.so.2 (no libnccl.so for -lnccl): name the file then.
NCCL_LIB := $(if $(NCCL_LIBDIR),$(if $(wildcard $(NCCL_LIBDIR)/libnccl.so),-lnccl,-l:$(notdir $(firstword $(wildcard $(NCCL_LIBDIR)/libnccl.so.*)))),-lnccl)
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80
# nvcc's defaults are exact (-fmad=true cannot change zero_adam_update, whose multiply-adds
# are explicit fmaf; IEEE division and square root): never add --use_fast_math.
NVCC_FLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings -I.
NCCL_FLAGS := $(filter-out -I/usr/include,$(if $(NCCL_HOME),-I$(NCCL_HOME)/include)) \
              $(if $(NCCL_LIBDIR),-L$(NCCL_LIBDIR) -Xlinker -rpath=$(NCCL_LIBDIR))
CUDA_HEADERS := $(HEADERS) $(wildcard zero_cuda.h zero_nccl.h)
CUDA_SRC := $(sort $(wildcard tests/cuda/*.cu bench/*.cu examples/*.cu))
CUDA_BINS := $(patsubst %.cu,build/cuda/%,$(notdir $(CUDA_SRC)))
vpath %.cu tests/cuda bench examples

build/cuda/%: %.cu $(CUDA_HEADERS) $(wildcard tests/*.h examples/*.h) | build/cuda
	$(NVCC) $(NVCC_FLAGS) $(NCCL_FLAGS) $< -o $@ -lcublas $(NCCL_LIB) -lpthread

cuda:
	@if [ -z "$(NVCC)" ]; then echo "cuda: skipped: nvcc not found (set NVCC or CUDA_HOME)"; \
	 elif [ -z "$(CUDA_SRC)" ]; then echo "cuda: nothing to build yet"; \
	 else $(MAKE) --no-print-directory $(CUDA_BINS) && echo "cuda: built $(words $(CUDA_BINS)) programs with $(NVCC)"; fi

# A GPU is visible when nvidia-smi lists one or, without nvidia-smi, a /dev/nvidiaN exists.
# Each test program also checks cudaGetDeviceCount() and skips itself without a device.
GPU_VISIBLE = { nvidia-smi -L >/dev/null 2>&1 || { ! command -v nvidia-smi >/dev/null 2>&1 && ls /dev/nvidia[0-9]* >/dev/null 2>&1; }; }
CUDA_TESTS := $(filter build/cuda/test_%,$(CUDA_BINS))
test-cuda: cuda
	@if [ -z "$(NVCC)" ]; then echo "test-cuda: skipped: nvcc not found"; \
	 elif ! $(GPU_VISIBLE); then echo "test-cuda: skipped: no GPU visible"; echo "0 passed, 0 failed, $(words $(CUDA_TESTS)) skipped"; \
	 else bash tests/run.sh $(CUDA_TESTS); fi

# compute-sanitizer memcheck, racecheck and synccheck over the GPU tests at ZT_QUICK sizes.
COMPUTE_SANITIZER ?= $(or $(shell command -v compute-sanitizer 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/compute-sanitizer))
sanitize-cuda: cuda
	@if [ -z "$(NVCC)" ]; then echo "sanitize-cuda: skipped: nvcc not found"; \
	 elif ! $(GPU_VISIBLE); then echo "sanitize-cuda: skipped: no GPU visible"; \
	 elif [ -z "$(COMPUTE_SANITIZER)" ]; then echo "sanitize-cuda: skipped: compute-sanitizer not found (set COMPUTE_SANITIZER)"; \
	 else set -e; for tool in memcheck racecheck synccheck; do for t in $(CUDA_TESTS); do \
	   echo "== $$tool $$t"; ZT_QUICK=1 $(COMPUTE_SANITIZER) --tool $$tool --error-exitcode 99 $$t; done; done; \
	   echo "sanitize-cuda: memcheck, racecheck, synccheck clean"; fi

CUDA_BENCHES := $(filter build/cuda/bench_%,$(CUDA_BINS))
bench-cuda: cuda
	@if ! $(GPU_VISIBLE); then echo "bench-cuda: skipped: no GPU visible"; \
	 else for b in $(CUDA_BENCHES); do echo "== $$b"; $$b || exit 1; done; fi

clean:
	rm -rf build
