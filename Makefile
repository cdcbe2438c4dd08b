# The README's commands. CMake does the building; this file only names the steps.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: deps configure build test run bench clean sanitize

deps:
	@bash scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

run: build
	@$(BUILD_DIR)/kiln info
	@$(BUILD_DIR)/kiln bench gemm --quick

bench: build
	@$(BUILD_DIR)/kiln bench gemm

sanitize:
	@$(MAKE) test BUILD_DIR=build-asan CMAKE_FLAGS="-DKILN_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo"

clean:
	@rm -rf $(BUILD_DIR)
