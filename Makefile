# gpumem — the two commands a newcomer needs:
#   make run    build, then replay the bundled real traces on the simulated GPU and print the report
#   make test   build, then run every test (ctest)
# Both install what they need with apt-get when it is missing: `make run` only a C compiler,
# cmake and zlib; `make test` also python3 with pip and setuptools (the HTML report's browser
# test installs chromium itself, or skips). Other targets: make build, make sanitize, make debug3,
# make fuzz, make bench, make clean.

BUILD     ?= build
BUILDTYPE ?= RelWithDebInfo
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
FUZZ_SECONDS ?= 60
PREFIX    ?=

.PHONY: all build run test sanitize tsan debug3 fuzz bench deps clean install

all: build

deps:
	@./tools/install_deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILDTYPE) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# Quiet: the build's output goes to $(BUILD)/build.log and is shown only when the build fails, so
# the report is what `make run` prints. Only the tool is built (what the report needs).
run: | deps
	@mkdir -p $(BUILD)
	@if { [ -f $(BUILD)/CMakeCache.txt ] || \
	      cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILDTYPE) $(CMAKE_FLAGS); } \
	      >$(BUILD)/build.log 2>&1 && \
	    cmake --build $(BUILD) -j $(JOBS) --target gpumem -- --no-print-directory \
	      >>$(BUILD)/build.log 2>&1; then \
	    echo "built $(BUILD)/tools/gpumem/gpumem (build output: $(BUILD)/build.log)"; \
	else cat $(BUILD)/build.log; \
	    echo "make run: the build failed; its output is above and in $(BUILD)/build.log" >&2; \
	    exit 1; fi
	@./tools/make_run.sh $(BUILD)

test: build
	@./tools/install_deps.sh test
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer, and ThreadSanitizer.
sanitize: deps
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DGM_SANITIZE=address,undefined -DGM_DEBUG=2
	cmake --build $(BUILD)-asan -j $(JOBS)
	cd $(BUILD)-asan && ctest --output-on-failure -j $(JOBS)

tsan: deps
	cmake -S . -B $(BUILD)-tsan -DCMAKE_BUILD_TYPE=Debug -DGM_SANITIZE=thread
	cmake --build $(BUILD)-tsan -j $(JOBS)
	cd $(BUILD)-tsan && ctest --output-on-failure -R 'test_threads|test_sim|test_cache|test_defrag|test_multi|test_trace$$'

# The suite with GM_DEBUG=3: gm_pool_check after every public call (docs/testing.md).
debug3: deps
	cmake -S . -B $(BUILD)-debug3 -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGM_DEBUG=3
	cmake --build $(BUILD)-debug3 -j $(JOBS)
	@./tools/install_deps.sh test
	cd $(BUILD)-debug3 && ctest --output-on-failure -j $(JOBS)

# The libFuzzer harnesses of tests/fuzz (clang), each run for FUZZ_SECONDS from the committed
# seeds; clang's fuzzer runtime (libclang-rt-14-dev) is installed when it is missing.
fuzz: deps
	@./tests/fuzz/deps.sh
	cmake -S . -B $(BUILD)-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	      -DGM_FUZZ=ON -DGM_DEBUG=2 -DBUILD_TESTING=OFF
	cmake --build $(BUILD)-fuzz -j $(JOBS) --target fuzz_trace fuzz_api
	./tests/fuzz/run.sh $(BUILD)-fuzz $(FUZZ_SECONDS)

bench: build
	./bench/run_all.sh $(BUILD)

# make install: into /usr/local (CMake's default; ldconfig is run when root), or into
# PREFIX=DIR: the library, header, gpumem tool, CMake package and gpumem.pc (docs: README.md).
install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX))

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan $(BUILD)-debug3 $(BUILD)-fuzz
