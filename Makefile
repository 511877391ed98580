# lamina - plain Makefile.
#   make            build build/lamina
#   make test       build and run every test (ends with "N passed, N failed")
#   make demo       run the bundled model on "Once upon a time"
#   make asan       the test suite under AddressSanitizer + UBSan (build/asan/)
#   make fuzz       libFuzzer targets for the parsers, run for FUZZ_SECONDS each
#   make check-layers  fail on an include that points down the layer map (src/README.md)
#   make bench      build the micro-benchmarks in bench/ (lamina bench measures the model)
#   make install    copy lamina to $(PREFIX)/bin

CC      ?= cc
PREFIX  ?= /usr/local
BUILD   ?= build
OPT     ?= -O2
CFLAGS_BASE = -std=c11 -g -Wall -Wextra -Werror -Wshadow -Wmissing-prototypes \
              -Wno-unused-parameter -D_GNU_SOURCE -Isrc -Iinclude -MMD -MP
CFLAGS  += $(OPT) $(CFLAGS_BASE)
LDLIBS  += -lpcre2-8 -lmicrohttpd -lcjson -lpthread -lm
SIMD_FLAGS = -mavx2 -mfma -mf16c

# Sources live one folder per layer (src/README.md has the map).
SRC      := $(wildcard src/*/*.c)
OBJ      := $(SRC:src/%.c=$(BUILD)/obj/%.o)
LIB      := $(BUILD)/liblamina.a
TESTSRC  := $(wildcard tests/test_*.c)
TESTBIN  := $(TESTSRC:tests/%.c=$(BUILD)/tests/%)

.PHONY: all test demo asan fuzz install clean bench check-layers

all: $(BUILD)/lamina $(TESTBIN)

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# Per-architecture kernels: only these files are compiled with SIMD flags,
# and they are reached only through the kernel table (kernels/dispatch.c).
$(BUILD)/obj/kernels/avx2_%.o: src/kernels/avx2_%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(SIMD_FLAGS) -c $< -o $@

$(LIB): $(OBJ)
	@rm -f $@
	ar rcs $@ $^

TOOLSRC  := $(wildcard tools/*.c)
TOOLOBJ  := $(TOOLSRC:tools/%.c=$(BUILD)/obj/tools/%.o)

$(BUILD)/obj/tools/%.o: tools/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itools -c $< -o $@

$(BUILD)/lamina: $(TOOLOBJ) $(LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) $(TOOLOBJ) $(LIB) $(LDLIBS) -o $@

$(BUILD)/tests/%: tests/%.c tests/test.h $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@

test: all
	BUILD=$(BUILD) bash tests/run.sh

# The include rules of src/README.md: no include points down the layer map.
check-layers:
	python3 scripts/check_layers.py

demo: $(BUILD)/lamina
	./$(BUILD)/lamina run -m models/stories260K.gguf -p "Once upon a time" -n 100 --temp 0

asan:
	$(MAKE) BUILD=build/asan CC=clang OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all" \
	    LDFLAGS="-fsanitize=address,undefined" all
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 LAMINA_ASAN=1 BUILD=build/asan bash tests/run.sh

FUZZ_SECONDS ?= 60
FUZZ_TARGETS := $(patsubst fuzz/%.c,%,$(wildcard fuzz/fuzz_*.c))
fuzz:
	$(MAKE) BUILD=build/fuzz CC=clang OPT="-O1 -fno-omit-frame-pointer -fsanitize=address,undefined,fuzzer-no-link" \
	    build/fuzz/liblamina.a
	@mkdir -p build/fuzz/bin
	@for t in $(FUZZ_TARGETS); do \
	    clang $(CFLAGS_BASE) -O1 -fsanitize=address,undefined,fuzzer fuzz/$$t.c build/fuzz/liblamina.a $(LDLIBS) -o build/fuzz/bin/$$t || exit 1; \
	    mkdir -p build/fuzz/corpus/$$t; \
	    echo "fuzzing $$t for $(FUZZ_SECONDS)s"; \
	    ./build/fuzz/bin/$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 build/fuzz/corpus/$$t fuzz/seeds/$$t || exit 1; \
	done

# Micro-benchmarks (not part of the test suite): build/bench_attn, build/bench_kernels.
BENCHSRC := $(wildcard bench/bench_*.c)
BENCHBIN := $(BENCHSRC:bench/%.c=$(BUILD)/%)
$(BUILD)/bench_%: bench/bench_%.c $(LIB)
	$(CC) $(CFLAGS) $(LDFLAGS) $< $(LIB) $(LDLIBS) -o $@
bench: $(BENCHBIN)

install: $(BUILD)/lamina
	install -D -m 755 $(BUILD)/lamina $(DESTDIR)$(PREFIX)/bin/lamina

clean:
	rm -rf build

-include $(OBJ:.o=.d) $(TOOLOBJ:.o=.d) $(TESTBIN:=.d)
