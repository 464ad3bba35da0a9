# Fuzzing (docs/fuzzing.md): libFuzzer targets for the C core's parsers, built with the
# Swift toolchain's clang under ASan+UBSan against the core's sources, and one for
# JSON-RPC framing and decoding, built with swiftc from Sources/HeraldJSON (a module of
# its own, as in the package) and Sources/JSONRPC directly (never through `swift build`).
# Everything goes into build/fuzz/.

FUZZ_DIR := $(BUILD_DIR)/fuzz
FUZZ_CC ?= /opt/swift/usr/bin/clang
FUZZ_SWIFTC ?= /opt/swift/usr/bin/swiftc
## FUZZ_TIME: seconds per target for `make fuzz`; FUZZ_SMOKE_TIME: for `make fuzz-smoke`
FUZZ_TIME ?= 60
FUZZ_SMOKE_TIME ?= 5
## FUZZ_TIMEOUT: seconds one input may take before it counts as a hang
FUZZ_TIMEOUT ?= 25
## FUZZ_JOBS, FUZZ_SMOKE_JOBS: targets run side by side (each fuzzer uses one core)
FUZZ_JOBS ?= 1
FUZZ_SMOKE_JOBS ?= 2

FUZZ_C_TARGETS := $(sort $(basename $(notdir $(wildcard Tests/fuzz/c/*.c))))
FUZZ_SWIFT_TARGETS := jsonrpc
FUZZ_ALL_TARGETS := $(FUZZ_SWIFT_TARGETS) $(FUZZ_C_TARGETS)
## FUZZ_TARGETS: the targets to run (default all), e.g. `make fuzz FUZZ_TARGETS=pem`
FUZZ_TARGETS ?= $(FUZZ_ALL_TARGETS)
FUZZ_BINS := $(addprefix $(FUZZ_DIR)/bin/,$(FUZZ_ALL_TARGETS))

# The C core as the C tests build it (CORE_FLAGS, SANITIZE), with coverage
# instrumentation; the tests' independent OpenSSL helpers without it.
FUZZ_CFLAGS := $(CORE_FLAGS) -ITests/CCore $(SANITIZE)
FUZZ_CORE_HEADERS := $(wildcard CSources/CHeraldCrypto/*.h CSources/CHeraldCrypto/include/*.h)
FUZZ_CORE_OBJS := $(patsubst CSources/CHeraldCrypto/%.c,$(FUZZ_DIR)/obj/core/%.o,$(CORE_SOURCES))
FUZZ_SUPPORT_OBJS := $(FUZZ_DIR)/obj/support/test_ossl.o $(FUZZ_DIR)/obj/support/test_util.o
FUZZ_JSON_SOURCES := $(wildcard Sources/HeraldJSON/*.swift)
FUZZ_SWIFT_SOURCES := $(wildcard Sources/JSONRPC/*.swift) $(wildcard Tests/fuzz/swift/*.swift)
FUZZ_SWIFT_MODULES := $(FUZZ_DIR)/swift-modules
FUZZ_SWIFTFLAGS := -sanitize=fuzzer,address -parse-as-library -O -g -swift-version 6 \
	-enable-upcoming-feature InternalImportsByDefault -enable-upcoming-feature ExistentialAny \
	-module-cache-path $(FUZZ_DIR)/swift-module-cache
FUZZ_RUN := $(PYTHON) Tests/fuzz/run.py --work $(FUZZ_DIR) --timeout $(FUZZ_TIMEOUT)

.PHONY: fuzz-build fuzz fuzz-smoke fuzz-merge
# Objects made by pattern rules are kept, so a second build links nothing anew.
.SECONDARY: $(FUZZ_CORE_OBJS) $(FUZZ_SUPPORT_OBJS)

## fuzz-build: every fuzz target into build/fuzz/bin/
fuzz-build: $(FUZZ_BINS)

$(FUZZ_DIR)/obj/core/%.o: CSources/CHeraldCrypto/%.c $(FUZZ_CORE_HEADERS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_DIR)/obj/support/%.o: Tests/CCore/%.c Tests/CCore/test.h $(FUZZ_CORE_HEADERS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -c $< -o $@

$(FUZZ_DIR)/bin/%: Tests/fuzz/c/%.c Tests/fuzz/c/fuzz.h $(FUZZ_CORE_OBJS) $(FUZZ_SUPPORT_OBJS)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -fuse-ld=lld $< $(FUZZ_CORE_OBJS) $(FUZZ_SUPPORT_OBJS) \
		$(CORE_LIBS) -o $@

# HeraldJSON first, as a module and one object; then JSONRPC and the harness as one
# module (so the harness sees JSONRPC's internals) linked against it.
$(FUZZ_SWIFT_MODULES)/HeraldJSON.o: $(FUZZ_JSON_SOURCES)
	@mkdir -p $(@D) $(FUZZ_DIR)/swift-module-cache
	$(FUZZ_SWIFTC) $(FUZZ_SWIFTFLAGS) -module-name HeraldJSON -whole-module-optimization -c \
		-emit-module -emit-module-path $(FUZZ_SWIFT_MODULES)/HeraldJSON.swiftmodule $(FUZZ_JSON_SOURCES) -o $@

$(FUZZ_DIR)/bin/jsonrpc: $(FUZZ_SWIFT_SOURCES) $(FUZZ_SWIFT_MODULES)/HeraldJSON.o
	@mkdir -p $(@D) $(FUZZ_DIR)/swift-module-cache
	$(FUZZ_SWIFTC) $(FUZZ_SWIFTFLAGS) -module-name JSONRPC -use-ld=lld -I $(FUZZ_SWIFT_MODULES) \
		$(FUZZ_SWIFT_SOURCES) $(FUZZ_SWIFT_MODULES)/HeraldJSON.o -o $@

## fuzz: each target for FUZZ_TIME seconds (default 60) on a working copy of its corpus
## (build/fuzz/corpus/); per-target figures, build/fuzz/summary.json; fails on any crash,
## leak or hang and prints the reproducer's path
fuzz: debian-deps
	@$(MAKE) --no-print-directory -j2 fuzz-build
	$(FUZZ_RUN) fuzz --jobs $(FUZZ_JOBS) --time $(FUZZ_TIME) $(FUZZ_TARGETS)

## fuzz-smoke: every committed corpus file once, then FUZZ_SMOKE_TIME seconds per target
## (for `make test`); build/fuzz/smoke-summary.json
fuzz-smoke: debian-deps
	@$(MAKE) --no-print-directory -j2 fuzz-build
	$(FUZZ_RUN) smoke --jobs $(FUZZ_SMOKE_JOBS) --time $(FUZZ_SMOKE_TIME) $(FUZZ_TARGETS)

## fuzz-merge: add to Tests/fuzz/corpus/ the units of the working corpus that bring new coverage
fuzz-merge: fuzz-build
	$(FUZZ_RUN) merge $(FUZZ_TARGETS)
