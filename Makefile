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

# The main job: train llama-tiny on the bundled KJV Bible for about 5 minutes, then sample.
RUN_MINUTES ?= 5
run: build
	@$(BUILD_DIR)/kiln info
	@$(BUILD_DIR)/kiln train --preset llama-tiny --minutes $(RUN_MINUTES) --out runs/llama-tiny
	@$(BUILD_DIR)/kiln generate --model runs/llama-tiny --prompt "And God said" --max-tokens 60 \
		--temperature 0.8 --top-k 40 --samples 3

bench: build
	@$(BUILD_DIR)/kiln bench gemm

sanitize:
	@$(MAKE) test BUILD_DIR=build-asan CMAKE_FLAGS="-DKILN_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo"

clean:
	@rm -rf $(BUILD_DIR)
