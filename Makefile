# The README's commands. CMake does the building; this file only names the steps.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

# The sanitizer builds (clang: libFuzzer and the sanitizer runtimes come with it). One ASan +
# UBSan build runs the whole CTest suite and also links the fuzz targets (-fsanitize=fuzzer-no-link
# everywhere, -fsanitize=fuzzer on fuzz/); a TSan build compiles only the thread pool and server
# tests. -gline-tables-only: file:line in every report at a fraction of -g's compile time.
# Both leave the CUDA backend out (-DKILN_CUDA=OFF: nvcc beside clang's sanitizers is not worth
# it); the Release build gets KILN_CUDA=AUTO (on where nvcc is found).
ASAN_DIR ?= build-asan
TSAN_DIR ?= build-tsan
SAN_CC ?= clang
SAN_CXX ?= clang++
SAN_CMAKE_FLAGS = -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=OFF -DCMAKE_C_COMPILER=$(SAN_CC) -DCMAKE_CXX_COMPILER=$(SAN_CXX) \
	-DCMAKE_C_FLAGS=-gline-tables-only -DCMAKE_CXX_FLAGS=-gline-tables-only
# A UBSan finding aborts its test (-fno-sanitize-recover); the stack says where.
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp
# `make fuzz`: minutes per target; `make test` (CI): a short bounded run of each.
FUZZ_SECONDS ?= 300
FUZZ_CI_SECONDS ?= 20
# The TSan tests: the thread pool (tests/core) and every serving test.
TSAN_CORE_FILTER ?= ThreadPool*:ThreadPlacement*

.PHONY: deps configure build test test-release run bench clean sanitize tsan fuzz fuzz-build fuzz-ci

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Release suite, then the whole suite under ASan + UBSan, the fuzz targets briefly, and the thread
# pool and server tests under TSan. Each stage prints its wall time.
test: test-release sanitize fuzz-ci tsan

test-release: build
	@start=$$(date +%s); cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) && \
	echo "make test: release suite $$(( $$(date +%s) - start )) s"

sanitize: deps
	@start=$$(date +%s); \
	cmake -S . -B $(ASAN_DIR) $(SAN_CMAKE_FLAGS) -DKILN_SANITIZE=ON -DKILN_FUZZ=ON > /dev/null && \
	cmake --build $(ASAN_DIR) -j $(JOBS) && \
	echo "make test: ASan+UBSan build $$(( $$(date +%s) - start )) s" && start=$$(date +%s) && \
	cd $(ASAN_DIR) && ctest --output-on-failure -j $(JOBS) && \
	echo "make test: ASan+UBSan suite $$(( $$(date +%s) - start )) s"

tsan: deps
	@start=$$(date +%s); \
	cmake -S . -B $(TSAN_DIR) $(SAN_CMAKE_FLAGS) -DKILN_TSAN=ON > /dev/null && \
	cmake --build $(TSAN_DIR) -j $(JOBS) --target test_core test_serve && \
	echo "make test: TSan build $$(( $$(date +%s) - start )) s" && start=$$(date +%s) && \
	$(TSAN_DIR)/tests/test_core --gtest_filter='$(TSAN_CORE_FILTER)' && \
	$(TSAN_DIR)/tests/test_serve && \
	echo "make test: TSan tests $$(( $$(date +%s) - start )) s"

fuzz-build: deps
	@cmake -S . -B $(ASAN_DIR) $(SAN_CMAKE_FLAGS) -DKILN_SANITIZE=ON -DKILN_FUZZ=ON > /dev/null
	@cmake --build $(ASAN_DIR) -j $(JOBS) --target fuzz_all

# Each fuzz target for FUZZ_SECONDS over fuzz/corpus/<parser>; a crash's input lands in fuzz/crashes/.
fuzz: fuzz-build
	@FUZZ_SECONDS=$(FUZZ_SECONDS) bash scripts/fuzz.sh $(ASAN_DIR)

fuzz-ci: fuzz-build
	@start=$$(date +%s); FUZZ_SECONDS=$(FUZZ_CI_SECONDS) bash scripts/fuzz.sh $(ASAN_DIR) && \
	echo "make test: fuzzing $$(( $$(date +%s) - start )) s"

# The main job: train llama-tiny on the bundled KJV Bible for about 5 minutes, then sample.
RUN_MINUTES ?= 5
run: build
	@$(BUILD_DIR)/kiln info
	@$(BUILD_DIR)/kiln train --preset llama-tiny --minutes $(RUN_MINUTES) --out runs/llama-tiny
	@$(BUILD_DIR)/kiln generate --model runs/llama-tiny --prompt "And God said" --max-tokens 60 \
		--temperature 0.8 --top-k 40 --samples 3

bench: build
	@$(BUILD_DIR)/kiln bench gemm

clean:
	@rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR)
