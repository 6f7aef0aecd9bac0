# zero - build, test and bench. Everything lands in build/.
#   make               the CPU library tests, examples, tools and benches
#   make test          the CPU suite (ends with "N passed, N failed, N skipped")
#   make test-long     the suite's stress cases at their long sizes (CI runs it)
#   make demo          the GPT-2 example at stages 0-3 on 4 ranks (make demo-mlp: the MLP)
#   make test-gpt2     the GPT-2 example against PyTorch / Hugging Face (PYTHON: a venv with torch)
#   make test-sanitize the CPU suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-tsan     the threaded tests under ThreadSanitizer
#   make compile-tests zero.h as C99 -pedantic, C11, C++17 and ZERO_STATIC, gcc and clang (-O0, -O1, -O2)
#   make cuda          compile and link the CUDA/NCCL parts with nvcc (skips without it)
#   make test-cuda     run the GPU tests (a skip line in a second without a GPU: probes, then builds)
#   make sanitize-cuda the GPU tests under compute-sanitizer (memcheck, racecheck, synccheck)
#   make test-cuda-sim the CUDA code (tests/cuda, ...) on the CPU under tests/cudasim, no GPU or
#                      toolkit (CUDASIM_SAN=asan|tsan; make cudasim-run SRC=my.cu: your own)
#   make bench / bench-cuda (LLMC=DIR: a checkout of llm.c adds its train_gpt2.c to the GPT-2 table)
#   make mpi           zero_mpi.h: build/train_mlp_mpi, the MPI tests and bench (skips without mpicc)
#   make test-mpi      the MPI tests under mpirun with 2, 3 and 4 processes (one skip line without MPI)
#   make test-mpi-asan the MPI tests built with ASan + UBSan, 2 and 4 processes
#   make bench-mpi     zero_mpi.h's collectives vs the MPI library's, 4 processes (docs/BENCHMARKS.md)
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
BENCHES  := $(patsubst bench/%.c,build/%,$(filter-out bench/bench_mpi.c,$(sort $(wildcard bench/*.c))))
TOOLS    := build/zero-estimate build/zero-ckpt

.PHONY: test-cuda-sim cudasim-run print-cudasim-tsan
.PHONY: all test test-long demo demo-mlp test-gpt2 test-sanitize test-tsan compile-tests cuda test-cuda sanitize-cuda bench bench-cuda clean \
        print-nccl mpi test-mpi test-mpi-asan bench-mpi test-ckpt-kill fuzz test-safetensors-py
all: $(TESTS) $(EXAMPLES) $(BENCHES) $(TOOLS)

build build/san build/compile build/cuda:
	@mkdir -p $@

# The implementation (zero.h's, and zero_nccl.h's TCP bootstrap) is compiled once
# (build/zero_impl.o, and build/san/zero_impl.o for the sanitizer run) and linked into every
# test program, except a test whose source defines ZERO_IMPLEMENTATION itself (it reaches
# private types, sets ZERO_MALLOC hooks or compiles the NCCL comm against mocks): that one is
# compiled alone, as ZERO_STATIC (only what it calls is compiled) at SELF_OPT (-Og). Private
# helpers a test only calls are exported by tests/zero_impl.c (tests/zt_private.h) instead.
# A whole compile of zero.h costs ~5 s of CPU; make test compiles it 3 times whole (zero_impl.o,
# the two examples) and 11 times in part (ZERO_STATIC: 9 tests, 2 tools).
# The test of ZERO_STATIC and single-file use is compile-tests.
SELF_IMPL_SRC := $(shell grep -l '^[[:space:]]*\#[[:space:]]*define[[:space:]][[:space:]]*ZERO_IMPLEMENTATION' $(TEST_SRC) /dev/null 2>/dev/null)
SELF_TESTS    := $(patsubst tests/%.c,build/%,$(filter $(TEST_SRC),$(SELF_IMPL_SRC)))
LINKED_TESTS  := $(filter-out $(SELF_TESTS),$(TESTS))
TEST_DEPS     := $(HEADERS) $(wildcard tests/*.h)

# tests that run a bench's code at a small size (bench_infinity's model, in bench/bench_common.h)
build/test_infinity build/san/test_infinity: bench/bench_common.h

SELF_OPT ?= -Og
build/zero_impl.o: tests/zero_impl.c tests/zt_private.h $(HEADERS) | build
	$(CC) $(ALL_CFLAGS) -c $< -o $@

build/san/zero_impl.o: tests/zero_impl.c tests/zt_private.h $(HEADERS) | build/san
	$(CC) $(SAN_FLAGS) -c $< -o $@

$(SELF_TESTS): build/%: tests/%.c $(TEST_DEPS) | build
	$(CC) $(ALL_CFLAGS) $(SELF_OPT) -DZERO_STATIC $< -o $@ $(LDLIBS)

$(LINKED_TESTS): build/%: tests/%.c build/zero_impl.o $(TEST_DEPS) | build
	$(CC) $(ALL_CFLAGS) $< build/zero_impl.o -o $@ $(LDLIBS)

$(addprefix build/san/,$(notdir $(SELF_TESTS))): build/san/%: tests/%.c $(TEST_DEPS) | build/san
	$(CC) $(SAN_FLAGS) $< -o $@ $(LDLIBS)

$(addprefix build/san/,$(notdir $(LINKED_TESTS))): build/san/%: tests/%.c build/san/zero_impl.o $(TEST_DEPS) | build/san
	$(CC) $(SAN_FLAGS) $< build/san/zero_impl.o -o $@ $(LDLIBS)

# The NCCL comm against mocks of CUDA's and NCCL's entry points (CPU only): tests/mock
# comes first on the include path, so zero_nccl.h's <cuda_runtime.h> and <nccl.h> are the mocks.
build/test_nccl_mock: ALL_CFLAGS += -Itests/mock
build/san/test_nccl_mock: SAN_FLAGS += -Itests/mock
build/test_nccl_mock build/san/test_nccl_mock: $(wildcard tests/mock/*.h)

# test_cli runs the examples and tools, and crafts the GPT example's inputs with gpt2_common.h.
build/test_cli build/san/test_cli: $(wildcard examples/*.h)
build/test_gpt2_common build/san/test_gpt2_common: $(wildcard examples/*.h)

# The GPT example's activation-offload and tiling tests run the example: make test builds it first.
build/test_gpt2_activations build/san/test_gpt2_activations: build/train_gpt2
build/test_gpt2_tiling build/san/test_gpt2_tiling: build/train_gpt2 $(wildcard examples/*.h)
build/test_gpt2_dropout build/san/test_gpt2_dropout: build/train_gpt2 $(wildcard examples/*.h)
# test_lr_zero runs the example's schedule to lr 0
build/test_lr_zero build/san/test_lr_zero: build/train_gpt2

# The tools call a small part of the API: as ZERO_STATIC only that part is compiled.
build/zero-estimate: tools/zero_estimate.c $(HEADERS) | build
	$(CC) $(ALL_CFLAGS) -DZERO_STATIC $< -o $@ $(LDLIBS)

build/zero-ckpt: tools/zero_ckpt.c $(HEADERS) examples/gpt2_common.h examples/size_arg.h | build
	$(CC) $(ALL_CFLAGS) -DZERO_STATIC $< -o $@ $(LDLIBS)

build/%: examples/%.c $(HEADERS) $(wildcard examples/*.h) | build
	$(CC) $(ALL_CFLAGS) $< -o $@ $(LDLIBS)

# The GPT-2 example's loops want the vectoriser: -O3 -march=native changes no result bit
# (no FMA contraction, also with clang, whose default contracts; no reassociation without
# -ffast-math).
# FAST_OPT: the examples' and benches' optimisation (CI's clang build, which only checks
# warnings, passes -O0 -march=native: clang's warnings do not depend on the level).
FAST_OPT ?= -O3 -march=native
GPT2_OPT := $(FAST_OPT) -ffp-contract=off
build/train_gpt2: examples/train_gpt2.c $(HEADERS) $(wildcard examples/*.h) build/blas.stamp | build
	$(CC) $(ALL_CFLAGS) $(GPT2_OPT) $(BLAS_CFLAGS) $< -o $@ $(LDLIBS) $(BLAS_LIBS)

# BLAS=openblas: the GPT-2 example's products through OpenBLAS's cblas_sgemm instead of its
# own kernels (Debian's libopenblas-dev; opt-in, for comparison, never required:
# examples/gpt2_gemm.h says what changes). It applies to build/train_gpt2, train_gpt2_mpi,
# bench_gemm and test_gpt2_gemm; build/blas.stamp holds the last choice, so that switching
# rebuilds them (the stamp's time changes only when its content does).
BLAS ?=
ifeq ($(BLAS),openblas)
BLAS_CFLAGS := -DGPT2_BLAS $(shell pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu/openblas-pthread)
BLAS_LIBS := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
else ifneq ($(BLAS),)
$(error BLAS=$(BLAS): the one supported value is BLAS=openblas)
endif
.PHONY: FORCE
build/blas.stamp: FORCE | build
	@echo '$(BLAS)' | cmp -s - $@ || echo '$(BLAS)' > $@
build/bench_gemm: build/blas.stamp
build/bench_gemm: ALL_CFLAGS += $(BLAS_CFLAGS)
build/bench_gemm: LDLIBS += $(BLAS_LIBS)
build/test_gpt2_gemm: build/blas.stamp
build/test_gpt2_gemm: ALL_CFLAGS += $(BLAS_CFLAGS)
build/test_gpt2_gemm: LDLIBS += $(BLAS_LIBS)

build/bench_%: bench/bench_%.c $(HEADERS) bench/bench_common.h | build
	$(CC) $(ALL_CFLAGS) $(FAST_OPT) $< -o $@ $(LDLIBS)

# make test and test-sanitize build their programs in parallel (one job per core, unless
# make was given -j) and tests/run.sh runs them in parallel (ZT_JOBS, default: the cores).
NPROC := $(shell nproc 2>/dev/null || echo 2)
PAR = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(NPROC))
# With nvcc present, make test also builds and runs build/cuda/test_cuda_host (zero_cuda.h's
# host-side logic; it needs no GPU). test_cli runs build/train_mlp and the tools as programs;
# tests/make_targets.sh checks what the GPU and MPI targets compile (by stand-in compilers);
# tests/readme_outputs.sh runs the command of each output README.md quotes and compares;
# tests/gpu_check_test.sh runs tools/gpu_check.sh without a GPU (fake tools).
CUDA_HOST_TEST = $(if $(NVCC),build/cuda/test_cuda_host)
# test_cuda_host runs no kernel: PTX for one architecture is enough (ptxas never runs; a
# third of the CPU of the three targets' build).
build/cuda/test_cuda_host: CUDA_ARCH = -gencode arch=compute_80,code=compute_80
SCRIPT_TESTS := tests/make_targets.sh tests/readme_outputs.sh tests/gpt2_doc_outputs.sh tests/gpu_check_test.sh
README_PROGS := build/train_mlp $(filter build/train_gpt2,$(EXAMPLES)) # what README quotes
test:
	@$(MAKE) --no-print-directory $(PAR) $(TESTS) $(TOOLS) $(README_PROGS) $(CUDA_HOST_TEST)
	@bash tests/run.sh $(TESTS) $(CUDA_HOST_TEST) $(SCRIPT_TESTS)

# make test-long: the stress cases at their long sizes (ZT_LONG=1; make test runs them short).
# CI runs it.
LONG_TESTS := build/test_local build/test_local_spin
test-long:
	@$(MAKE) --no-print-directory $(PAR) $(LONG_TESTS)
	@ZT_LONG=1 bash tests/run.sh $(LONG_TESTS)

test-sanitize:
	@$(MAKE) --no-print-directory $(PAR) $(SAN_TESTS) $(TOOLS) build/train_mlp
	@ZT_QUICK=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 bash tests/run.sh $(SAN_TESTS)

# make test-tsan: the threaded tests under ThreadSanitizer (ranks as threads of the local
# comm, the I/O engine's workers, the asynchronous step, the activation tier), ZT_QUICK.
# A report fails the program (exit status 66).
TSAN_FLAGS := -std=c11 $(WARN) -O1 -g -fsanitize=thread -pthread -I.
TSAN_NAMES := test_local test_engine_allreduce test_engine_async test_engine_step_async test_activations test_nvme test_nvme_tier test_dpu
TSAN_TESTS := $(addprefix build/tsan/,$(TSAN_NAMES))
build/tsan:
	@mkdir -p $@
build/tsan/zero_impl.o: tests/zero_impl.c $(HEADERS) | build/tsan
	$(CC) $(TSAN_FLAGS) -c $< -o $@
$(filter $(addprefix build/tsan/,$(notdir $(SELF_TESTS))),$(TSAN_TESTS)): build/tsan/%: tests/%.c $(TEST_DEPS) | build/tsan
	$(CC) $(TSAN_FLAGS) $< -o $@ $(LDLIBS)
$(filter $(addprefix build/tsan/,$(notdir $(LINKED_TESTS))),$(TSAN_TESTS)): build/tsan/%: tests/%.c build/tsan/zero_impl.o $(TEST_DEPS) | build/tsan
	$(CC) $(TSAN_FLAGS) $< build/tsan/zero_impl.o -o $@ $(LDLIBS)
test-tsan:
	@$(MAKE) --no-print-directory $(PAR) $(TSAN_TESTS)
	@ZT_QUICK=1 TSAN_OPTIONS="exitcode=66 second_deadlock_stack=1" bash tests/run.sh $(TSAN_TESTS)

# ---- checkpoints: the full kill test, libFuzzer harnesses, the Python safetensors check ----
test-ckpt-kill: build/test_checkpoint
	ZERO_CKPT_KILLS=$${ZERO_CKPT_KILLS:-200} build/test_checkpoint

# make fuzz: each harness replays the committed corpus of malformed files, then the harnesses
# fuzz at once for FUZZ_TIME seconds (FUZZ_RUNS=10000000 for a long run); a harness that
# exits non-zero (a crash, a leak, a sanitizer report) fails the target. Needs clang's
# libFuzzer runtime.
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
	  echo "== fuzz_$$f: corpus replay"; \
	  build/fuzz/fuzz_$$f -runs=0 fuzz/corpus/$$f > build/fuzz/replay-$$f.log 2>&1 || \
	    { tail -n 40 build/fuzz/replay-$$f.log; echo "fuzz_$$f: the corpus replay failed"; exit 1; }; \
	  tail -n 1 build/fuzz/replay-$$f.log; \
	  rm -rf build/fuzz/work-$$f; cp -r fuzz/corpus/$$f build/fuzz/work-$$f; \
	done; \
	pids=""; for f in ckpt safetensors; do \
	  build/fuzz/fuzz_$$f -max_total_time=$(FUZZ_TIME) -runs=$(FUZZ_RUNS) -print_final_stats=1 \
	    build/fuzz/work-$$f > build/fuzz/run-$$f.log 2>&1 & pids="$$pids $$!"; \
	done; \
	rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	for f in ckpt safetensors; do echo "== fuzz_$$f: $(FUZZ_TIME) s (the harnesses run at once)"; \
	  grep -E "^(stat::number_of_executed_units|Done|==.*ERROR)" build/fuzz/run-$$f.log || true; done; \
	[ $$rc -eq 0 ] || { for f in ckpt safetensors; do tail -n 40 build/fuzz/run-$$f.log; done; \
	  echo "fuzz: a harness failed (its exit status; above)"; exit 1; }

# The exports checked by the reference safetensors package (a venv with safetensors + numpy),
# and the checkpoint read by tests/read_checkpoint.py, written from docs/checkpoint.md alone.
PYTHON ?= python3
test-safetensors-py: build/test_checkpoint
	@rm -rf build/st-py && mkdir -p build/st-py
	ZERO_ST_EXPORT_DIR=build/st-py build/test_checkpoint >/dev/null
	$(PYTHON) tests/check_safetensors.py build/st-py
	$(PYTHON) tests/read_checkpoint.py build/st-py/st build/st-py/expect.json build/st-py/expect-f32.bin \
	  build/st-py/expect-client.bin

# make demo: the GPT-2 example at stages 0-3 on 4 ranks (threads); make demo-mlp: the MLP.
# make test-gpt2: tests/gpt2_reference.py, then tests/gpt2_finetune.py (a Hugging Face
# checkpoint fine-tuned with frozen tensors and parameter groups, exported back; ~12 s plus
# torch's import) with PYTHON = a venv holding torch, transformers, safetensors, numpy
# (tools/torch_venv.sh DIR makes one); GPT2_REF_FLAGS=--quick for the CI subset of the
# first. One skip line without torch.
GPT2_REF_FLAGS ?=
test-gpt2: build/train_gpt2 build/zero-ckpt
	@if ! $(PYTHON) -c 'import torch, transformers, safetensors, numpy' >/dev/null 2>&1; then \
	   echo "test-gpt2: skipped: $(PYTHON) has no torch/transformers (tools/torch_venv.sh DIR; make test-gpt2 PYTHON=DIR/bin/python)"; \
	   echo "0 passed, 0 failed, 1 skipped"; \
	 else if $(HAVE_MPI); then $(MAKE) --no-print-directory build/train_gpt2_mpi; fi; \
	   rc=0; $(PYTHON) tests/gpt2_reference.py $(GPT2_REF_FLAGS) || rc=1; \
	   $(PYTHON) tests/gpt2_finetune.py || rc=1; exit $$rc; fi

DEMO ?= build/train_gpt2
demo: build/train_gpt2
	$(DEMO)

demo-mlp: build/train_mlp
	build/train_mlp

# bench_infinity is run by hand (Psi = 4B: ~64 GB of files, many minutes; docs/BENCHMARKS.md)
bench: $(BENCHES) build/train_gpt2
	@for b in $(filter-out build/bench_infinity,$(BENCHES)); do echo "== $$b"; $$b || exit 1; done
	@echo "== bench/gpt2.sh"; PYTHON="$(PYTHON)" LLMC="$(LLMC)" sh bench/gpt2.sh

# ---- compile tests: the header in every language mode we promise ------------------------
COMPILE_SRC := tests/compile/compile_main.c tests/compile/compile_other.c
# The gcc, clang and C++ rounds run at once (each one's output is printed after all end).
compile-tests: | build/compile
	@set -e; pids=""; for cc in gcc clang; do ( set -e; \
	  command -v $$cc >/dev/null || { echo "compile-tests: $$cc not found"; exit 1; }; \
	  for std in c99 c11; do \
	    $$cc -std=$$std $(WARN) -O1 -I. $(COMPILE_SRC) -o build/compile/$$cc-$$std -lm -pthread; \
	    ./build/compile/$$cc-$$std; \
	    $$cc -std=$$std $(WARN) -Werror=implicit-function-declaration -O1 -I. tests/compile/compile_first.c -o build/compile/$$cc-first-$$std -lm -pthread; \
	    ./build/compile/$$cc-first-$$std; \
	    awk '/---- quick start: end ----/{f=0} f; /---- quick start: begin ----/{f=1}' zero.h > build/compile/quickstart-$$cc.c; \
	    $$cc -std=$$std $(WARN) -O1 -I. build/compile/quickstart-$$cc.c -o build/compile/$$cc-quickstart-$$std -lm -pthread; \
	    ./build/compile/$$cc-quickstart-$$std >/dev/null; \
	  done; \
	  for opt in -O0 -O2; do \
	    $$cc -std=c11 $(WARN) -Werror=implicit-function-declaration $$opt -I. tests/compile/compile_first.c -o build/compile/$$cc-first$$opt -lm -pthread; \
	    ./build/compile/$$cc-first$$opt; \
	  done; \
	  for std in c99 c11 gnu11; do \
	    $$cc -std=$$std $(WARN) -Werror=implicit-function-declaration -O1 -I. tests/compile/compile_xsi.c -o build/compile/$$cc-xsi-$$std -lm -pthread; \
	    ./build/compile/$$cc-xsi-$$std; \
	  done; \
	  if $$cc -std=c11 -ffast-math -I. -c tests/compile/compile_main.c -o build/compile/fastmath-$$cc.o 2> build/compile/fastmath-$$cc.log; then \
	    echo "compile-tests: $$cc compiled the implementation under -ffast-math (it must refuse)"; exit 1; fi; \
	  grep -q "without -ffast-math" build/compile/fastmath-$$cc.log; \
	  $$cc -std=c11 $(WARN) -ffast-math -I. -c tests/compile/compile_other.c -o build/compile/fastmath-user-$$cc.o; \
	  $$cc -std=c11 $(WARN) -O1 -I. -DZERO_NO_SIMD -c tests/compile/compile_main.c -o build/compile/$$cc-nosimd.o; \
	  $$cc -std=c11 $(WARN) -O1 -I. -DZERO_STATIC tests/compile/compile_main.c -o build/compile/$$cc-static -lm -pthread; \
	  ./build/compile/$$cc-static ) > build/compile/round-$$cc.log 2>&1 & pids="$$pids $$!"; \
	done; \
	( set -e; for cxx in g++ clang++; do \
	  $$cxx -std=c++17 $(WARN) -O1 -I. -x c++ $(COMPILE_SRC) -o build/compile/$$cxx-cxx17 -lm -pthread; \
	  ./build/compile/$$cxx-cxx17; \
	done ) > build/compile/round-cxx.log 2>&1 & pids="$$pids $$!"; \
	rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	for r in gcc clang cxx; do cat build/compile/round-$$r.log; done; \
	[ $$rc -eq 0 ] || { echo "compile-tests: FAILED (above)"; exit 1; }; echo "compile-tests: zero.h (+ zero_nccl.h bootstrap, zero_cuda.h/zero_nccl.h declarations) as C99, C11, C++17, ZERO_STATIC and ZERO_NO_SIMD with gcc and clang, and after <stdio.h>/<stdlib.h>/<string.h> (at -O0, -O1 and -O2: warnings differ by level); M_PI and XSI/BSD names after zero.h first (c99, c11, gnu11); the implementation refuses -ffast-math; the manual's quick start compiles and runs: ok"

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
# NCCL: NCCL_HOME if given, else next to CUDA, the system (NCCL_SEARCH), or a PyPI wheel
# found by tools/find_nccl.py: site-packages/nvidia/nccl (nvidia-nccl-cu12) or
# site-packages/nvidia/cu13 (CUDA 13 wheels), each with include/ and lib/libnccl.so.2.
NCCL_SEARCH ?= /usr /usr/local
PYTHON ?= python3
ifeq ($(origin NCCL_HOME),undefined)
NCCL_HOME := $(firstword $(foreach d,$(CUDA_HOME) $(NCCL_SEARCH) \
    $(shell $(PYTHON) tools/find_nccl.py 2>/dev/null), \
    $(if $(wildcard $(d)/include/nccl.h),$(d))))
endif
NCCL_LIBDIR := $(firstword $(foreach d,$(NCCL_HOME)/lib $(NCCL_HOME)/lib64 $(NCCL_HOME)/lib/x86_64-linux-gnu,$(if $(wildcard $(d)/libnccl.so*),$(d))))
# A wheel ships only libnccl.so.2 (no libnccl.so for -lnccl): name the file then.
NCCL_LIB := $(if $(NCCL_LIBDIR),$(if $(wildcard $(NCCL_LIBDIR)/libnccl.so),-lnccl,-l:$(notdir $(firstword $(wildcard $(NCCL_LIBDIR)/libnccl.so.*)))),-lnccl)
# sm_90 and sm_80 machine code, plus compute_90 PTX that the driver compiles for newer GPUs.
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_80,code=sm_80 \
             -gencode arch=compute_90,code=compute_90
# nvcc's defaults are exact (-fmad=true cannot change zero_adam_update, whose multiply-adds
# are explicit fmaf; IEEE division and square root): never add --use_fast_math.
# NVCC_OPT: the host code's level (nvcc's -O; the device code is ptxas's -O3 either way).
NVCC_OPT ?= -O3
NVCC_FLAGS ?= $(NVCC_OPT) -std=c++17 $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings -I.
NCCL_FLAGS := $(filter-out -I/usr/include,$(if $(NCCL_HOME),-I$(NCCL_HOME)/include)) \
              $(if $(NCCL_LIBDIR),-L$(NCCL_LIBDIR) -Xlinker -rpath=$(NCCL_LIBDIR))
CUDA_HEADERS := $(HEADERS) $(wildcard zero_cuda.h zero_nccl.h)
CUDA_SRC := $(sort $(wildcard tests/cuda/*.cu bench/*.cu examples/*.cu))
CUDA_BINS := $(patsubst %.cu,build/cuda/%,$(notdir $(CUDA_SRC)))
vpath %.cu tests/cuda bench examples

build/cuda/%: %.cu $(CUDA_HEADERS) $(wildcard tests/*.h tests/cuda/*.h examples/*.h examples/*.cuh) | build/cuda
	$(NVCC) $(NVCC_FLAGS) $(NCCL_FLAGS) $< -o $@ -lcublas $(NCCL_LIB) -lpthread

# make cuda builds every CUDA program, and (with mpicc) tests/mpi/nccl_mpi_build.cu, the NCCL
# comm with its id over MPI, compiled and linked only: nothing else compiles CUDA unasked.
cuda:
	@if [ -z "$(NVCC)" ]; then echo "cuda: skipped: nvcc not found (set NVCC or CUDA_HOME)"; \
	 elif [ -z "$(CUDA_SRC)" ]; then echo "cuda: nothing to build yet"; \
	 else mpi=""; if $(HAVE_MPI); then mpi=build/mpi/nccl_mpi_build; fi; \
	   $(MAKE) --no-print-directory $(PAR) $(CUDA_BINS) $$mpi && \
	   echo "cuda: built $(words $(CUDA_BINS)) programs$${mpi:+ and $$mpi} with $(NVCC)"; fi

# A GPU is visible when nvidia-smi lists one or, without nvidia-smi, a /dev/nvidiaN exists.
# Each test program also checks cudaGetDeviceCount() and skips itself without a device. The
# GPU targets probe first and build only when there is a GPU to run on (a skip line in a
# second otherwise, not after minutes of nvcc).
GPU_VISIBLE = { nvidia-smi -L >/dev/null 2>&1 || { ! command -v nvidia-smi >/dev/null 2>&1 && ls /dev/nvidia[0-9]* >/dev/null 2>&1; }; }
CUDA_TESTS := $(filter build/cuda/test_%,$(CUDA_BINS))
test-cuda:
	@if [ -z "$(NVCC)" ]; then echo "test-cuda: skipped: nvcc not found"; \
	   echo "0 passed, 0 failed, $(words $(CUDA_TESTS)) skipped"; \
	 elif ! $(GPU_VISIBLE); then echo "test-cuda: skipped: no GPU visible (nothing built)"; \
	   echo "0 passed, 0 failed, $(words $(CUDA_TESTS)) skipped"; \
	 else $(MAKE) --no-print-directory cuda && bash tests/run.sh $(CUDA_TESTS); fi

# compute-sanitizer memcheck, racecheck and synccheck over the GPU tests at ZT_QUICK sizes.
COMPUTE_SANITIZER ?= $(or $(shell command -v compute-sanitizer 2>/dev/null),$(wildcard $(CUDA_HOME)/bin/compute-sanitizer))
sanitize-cuda:
	@if [ -z "$(NVCC)" ]; then echo "sanitize-cuda: skipped: nvcc not found"; \
	 elif ! $(GPU_VISIBLE); then echo "sanitize-cuda: skipped: no GPU visible (nothing built)"; \
	 elif [ -z "$(COMPUTE_SANITIZER)" ]; then echo "sanitize-cuda: skipped: compute-sanitizer not found (set COMPUTE_SANITIZER)"; \
	 else set -e; $(MAKE) --no-print-directory cuda; for tool in memcheck racecheck synccheck; do for t in $(CUDA_TESTS); do \
	   echo "== $$tool $$t"; ZT_QUICK=1 $(COMPUTE_SANITIZER) --tool $$tool --error-exitcode 99 $$t; done; done; \
	   echo "sanitize-cuda: memcheck, racecheck, synccheck clean"; fi

CUDA_BENCHES := $(filter build/cuda/bench_%,$(CUDA_BINS))
bench-cuda:
	@if [ -z "$(NVCC)" ]; then echo "bench-cuda: skipped: nvcc not found"; \
	 elif ! $(GPU_VISIBLE); then echo "bench-cuda: skipped: no GPU visible (nothing built)"; \
	 else $(MAKE) --no-print-directory cuda || exit 1; for b in $(CUDA_BENCHES); do echo "== $$b"; $$b || exit 1; done; fi

# Where the NCCL search landed (tests/nccl_find.sh checks it on fake wheel layouts).
print-nccl:
	@echo "NCCL_HOME=$(NCCL_HOME)"; echo "NCCL_LIBDIR=$(NCCL_LIBDIR)"; echo "NCCL_LIB=$(NCCL_LIB)"
# ---- cudasim: the CUDA code on the CPU (tests/cudasim, docs/cuda.md) -------------------------
# The .cu files compile as C++17 with g++ (or CUDASIM_CXX) against tests/cudasim's
# cuda_runtime.h (and the other simulated headers there); no CUDA toolkit is used.
# CUDASIM_SAN: "" (default), asan (AddressSanitizer + UBSan) or tsan (ThreadSanitizer);
# each has its own build directory. CUDASIM_PROGS: the programs make test-cuda-sim runs
# (names of .cu files, without .cu, from tests/cuda, examples, bench or tests/cudasim).
CUDASIM_CXX ?= g++
CUDASIM_SAN ?=
CUDASIM_DIR := build/cudasim$(if $(CUDASIM_SAN),-$(CUDASIM_SAN))
CUDASIM_ASAN := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
CUDASIM_SANFLAGS := $(if $(filter asan,$(CUDASIM_SAN)),$(CUDASIM_ASAN)) $(if $(filter tsan,$(CUDASIM_SAN)),-fsanitize=thread)
# Under a sanitizer -O0: each program compiles all of zero.h and zero_cuda.h (single-file
# use), and ASan+UBSan at -O1 doubles that compile for runs that ZT_QUICK keeps short.
CUDASIM_OPT ?= $(if $(CUDASIM_SAN),-O0,-O2)
CUDASIM_FLAGS := -std=c++17 $(WARN) -Wno-unknown-pragmas $(CUDASIM_OPT) -g -ffp-contract=off -pthread -I. -Itests/cudasim $(CUDASIM_SANFLAGS)
CUDASIM_LIB_SRC := $(sort $(wildcard tests/cudasim/*.cpp))
CUDASIM_LIB_OBJ := $(patsubst tests/cudasim/%.cpp,$(CUDASIM_DIR)/lib/%.o,$(CUDASIM_LIB_SRC))
CUDASIM_HDRS := $(wildcard tests/cudasim/*.h)
CUDASIM_PROGS ?= test_cudasim test_cuda_host test_cuda_kernels test_cuda_comm test_cuda_engine test_cuda_quant test_sim_nccl test_nccl
CUDASIM_BINS = $(addprefix $(CUDASIM_DIR)/,$(CUDASIM_PROGS))
# the examples under the harness (tests/cudasim/examples.sh, with build/train_gpt2 to compare);
# CUDASIM_EXAMPLES= leaves them out (the default under TSan, which runs the stream and comm tests)
CUDASIM_EXAMPLES ?= $(if $(filter tsan,$(CUDASIM_SAN)),,examples)
CUDASIM_EX_BINS = $(if $(CUDASIM_EXAMPLES),$(CUDASIM_DIR)/train_gpt2 $(CUDASIM_DIR)/train_gpu build/train_gpt2)
# the programs CI runs under ThreadSanitizer: streams, events and the comms
CUDASIM_TSAN_PROGS ?= test_cudasim test_cuda_comm test_cuda_kernels test_sim_nccl
vpath %.cu tests/cudasim

$(CUDASIM_DIR)/lib:
	@mkdir -p $@
$(CUDASIM_DIR)/lib/%.o: tests/cudasim/%.cpp $(CUDASIM_HDRS) | $(CUDASIM_DIR)/lib
	$(CUDASIM_CXX) $(CUDASIM_FLAGS) -c $< -o $@
$(CUDASIM_DIR)/%: %.cu $(CUDASIM_LIB_OBJ) $(CUDA_HEADERS) $(CUDASIM_HDRS) $(wildcard tests/*.h tests/cuda/*.h examples/*.h examples/*.cuh) | $(CUDASIM_DIR)/lib
	$(CUDASIM_CXX) $(CUDASIM_FLAGS) -x c++ $< -x none $(CUDASIM_LIB_OBJ) -o $@ -lm

# make test-cuda-sim: every CUDASIM_PROGS program under the harness (tests/run.sh adds up).
# make cudasim-run SRC=my.cu [ARGS=...]: one .cu file of yours, built and run under it.
test-cuda-sim:
	@$(MAKE) --no-print-directory $(PAR) $(CUDASIM_BINS) $(filter-out $(CUDASIM_DIR)/train_gpu,$(CUDASIM_EX_BINS))
	@$(if $(CUDASIM_EXAMPLES),$(MAKE) --no-print-directory $(CUDASIM_DIR)/train_gpu || echo "test-cuda-sim: train_gpu.cu does not build under the harness (tests/cudasim/README.md)";) true
	@$(if $(CUDASIM_EXAMPLES),printf '#!/bin/sh\nexec bash tests/cudasim/examples.sh %s\n' $(CUDASIM_DIR) > $(CUDASIM_DIR)/examples && chmod +x $(CUDASIM_DIR)/examples;) true
	@bash tests/run.sh $(CUDASIM_BINS) $(if $(CUDASIM_EXAMPLES),$(CUDASIM_DIR)/examples)

print-cudasim-tsan:
	@echo $(CUDASIM_TSAN_PROGS)

cudasim-run: $(CUDASIM_LIB_OBJ)
	@test -n "$(SRC)" || { echo "cudasim-run: give SRC=file.cu"; exit 1; }
	$(CUDASIM_CXX) $(CUDASIM_FLAGS) -x c++ $(SRC) -x none $(CUDASIM_LIB_OBJ) -o $(CUDASIM_DIR)/$(basename $(notdir $(SRC))) -lm
	$(CUDASIM_DIR)/$(basename $(notdir $(SRC))) $(ARGS)

# ---- MPI (zero_mpi.h) ------------------------------------------------------------------------
# Open MPI: apt-get install openmpi-bin libopenmpi-dev. Tests run as wrapper scripts
# build/mpi/<test>.np<N> (mpirun -np N <test>), so tests/run.sh counts them like any test.
MPICC  ?= mpicc
MPIRUN ?= mpirun
MPI_NP ?= 2 3 4
MPIRUN_FLAGS ?= --oversubscribe --bind-to none
# mpirun refuses root without these (CI containers run as root); harmless otherwise.
MPI_ENV := OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
HAVE_MPI = { command -v $(MPICC) >/dev/null 2>&1 && command -v $(MPIRUN) >/dev/null 2>&1; }
MPI_TEST_SRC := $(sort $(wildcard tests/mpi/test_mpi_*.c))
MPI_TESTS := $(patsubst tests/mpi/%.c,build/mpi/%,$(MPI_TEST_SRC))
MPI_RUNS := $(foreach t,$(MPI_TESTS),$(foreach n,$(MPI_NP),$(t).np$(n)))
MPI_SCRIPTS := tests/mpi/abort.sh tests/mpi/checksum.sh tests/mpi/resume.sh tests/mpi/gpt2.sh
MPI_BINS := build/train_mlp_mpi build/train_gpt2_mpi build/mpi/bench_mpi $(MPI_TESTS)
# make cuda (not make mpi) compiles zero_mpi.h with zero_cuda.h and zero_nccl.h (the NCCL id
# over MPI, the device-memory path) when mpicc is present. Open MPI's wrapper flags; override
# for another MPI.
MPI_CFLAGS ?= $(shell $(MPICC) --showme:compile 2>/dev/null)
MPI_LIBS   ?= $(shell $(MPICC) --showme:link 2>/dev/null)

build/mpi:
	@mkdir -p $@

build/mpi/test_mpi_%: tests/mpi/test_mpi_%.c $(HEADERS) zero_mpi.h $(wildcard tests/*.h tests/mpi/*.h) | build/mpi
	$(MPICC) $(ALL_CFLAGS) $< -o $@ $(LDLIBS)

build/mpi/test_mpi_pieces: tests/mpi/test_mpi_comm.c

build/mpi/bench_mpi: bench/bench_mpi.c $(HEADERS) zero_mpi.h bench/bench_common.h | build/mpi
	$(MPICC) $(ALL_CFLAGS) -O3 -march=native $< -o $@ $(LDLIBS)

build/mpi/nccl_mpi_build: tests/mpi/nccl_mpi_build.cu $(CUDA_HEADERS) zero_mpi.h | build/mpi
	$(NVCC) $(NVCC_FLAGS) $(NCCL_FLAGS) $(MPI_CFLAGS) $< -o $@ $(NCCL_LIB) $(MPI_LIBS) -lpthread

# The same program and flags as build/train_mlp, its ranks from mpirun.
build/train_mlp_mpi: examples/train_mlp.c $(HEADERS) zero_mpi.h $(wildcard examples/*.h) | build
	$(MPICC) $(ALL_CFLAGS) -DZERO_MLP_MPI $< -o $@ $(LDLIBS)

build/train_gpt2_mpi: examples/train_gpt2.c $(HEADERS) zero_mpi.h $(wildcard examples/*.h) build/blas.stamp | build
	$(MPICC) $(ALL_CFLAGS) $(GPT2_OPT) $(BLAS_CFLAGS) -DZERO_GPT2_MPI $< -o $@ $(LDLIBS) $(BLAS_LIBS)

define MPI_WRAPPER
$(1).np$(2): $(1) | build/mpi
	@printf '#!/bin/sh\nexec env $(MPI_ENV) $(MPIRUN) $(MPIRUN_FLAGS) -np $(2) $(1) "$$$$@"\n' > $$@; chmod +x $$@
endef
$(foreach t,$(MPI_TESTS),$(foreach n,$(MPI_NP),$(eval $(call MPI_WRAPPER,$(t),$(n)))))

mpi:
	@if ! $(HAVE_MPI); then echo "mpi: skipped: $(MPICC)/$(MPIRUN) not found (apt-get install openmpi-bin libopenmpi-dev)"; \
	 else $(MAKE) --no-print-directory $(PAR) $(MPI_BINS) build/train_mlp && \
	   echo "mpi: built $(words $(MPI_BINS)) programs with $(MPICC) (make cuda compiles the CUDA one)"; fi

test-mpi:
	@if ! $(HAVE_MPI); then echo "test-mpi: skipped: $(MPICC)/$(MPIRUN) not found (apt-get install openmpi-bin libopenmpi-dev)"; \
	   echo "0 passed, 0 failed, $(words $(MPI_RUNS) $(MPI_SCRIPTS)) skipped"; \
	 else $(MAKE) --no-print-directory $(MPI_RUNS) build/train_mlp build/train_mlp_mpi build/train_gpt2 build/train_gpt2_mpi && \
	   MPIRUN="$(MPIRUN)" MPIRUN_FLAGS="$(MPIRUN_FLAGS)" MPI_NP="$(MPI_NP)" bash tests/run.sh $(MPI_RUNS) $(MPI_SCRIPTS); fi

# make test-mpi-asan: the MPI tests built with ASan + UBSan, at 2 and 4 processes (ZT_QUICK
# sizes). Open MPI keeps its allocations to the end by design, so leak checks are off.
MPI_ASAN_NP ?= 2 4
MPI_ASAN_TESTS := $(patsubst tests/mpi/%.c,build/mpi-asan/%,$(MPI_TEST_SRC))
MPI_ASAN_RUNS := $(foreach t,$(MPI_ASAN_TESTS),$(foreach n,$(MPI_ASAN_NP),$(t).np$(n)))
build/mpi-asan:
	@mkdir -p $@
build/mpi-asan/test_mpi_%: tests/mpi/test_mpi_%.c $(HEADERS) zero_mpi.h $(wildcard tests/*.h tests/mpi/*.h) | build/mpi-asan
	$(MPICC) $(SAN_FLAGS) $< -o $@ $(LDLIBS)
build/mpi-asan/test_mpi_pieces: tests/mpi/test_mpi_comm.c
$(foreach t,$(MPI_ASAN_TESTS),$(foreach n,$(MPI_ASAN_NP),$(eval $(call MPI_WRAPPER,$(t),$(n)))))

test-mpi-asan:
	@if ! $(HAVE_MPI); then echo "test-mpi-asan: skipped: $(MPICC)/$(MPIRUN) not found"; \
	   echo "0 passed, 0 failed, $(words $(MPI_ASAN_RUNS)) skipped"; \
	 else $(MAKE) --no-print-directory $(PAR) $(MPI_ASAN_RUNS) && \
	   ZT_QUICK=1 ASAN_OPTIONS=detect_leaks=0 bash tests/run.sh $(MPI_ASAN_RUNS); fi

bench-mpi: mpi
	@if $(HAVE_MPI); then env $(MPI_ENV) $(MPIRUN) $(MPIRUN_FLAGS) -np 4 build/mpi/bench_mpi; fi

clean:
	rm -rf build
