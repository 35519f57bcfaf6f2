# gpumem — the two commands a newcomer needs:
#   make run    build, then replay the bundled real traces on the simulated GPU and print the report
#   make test   build, then run every test (ctest)
# Both install what they need with apt-get when it is missing: `make run` only a C compiler,
# cmake and zlib; `make test` also python3 with pip and setuptools (the HTML report's browser
# test installs chromium itself, or skips). Other targets: make build, make sanitize, make bench,
# make clean.

BUILD     ?= build
BUILDTYPE ?= RelWithDebInfo
JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=

.PHONY: all build run test sanitize tsan bench deps clean install

all: build

deps:
	@./tools/install_deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILDTYPE) $(CMAKE_FLAGS)

build: $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./tools/make_run.sh $(BUILD)

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
	cd $(BUILD)-tsan && ctest --output-on-failure -R 'test_threads|test_sim|test_cache|test_defrag|test_multi'

bench: build
	./bench/run_all.sh $(BUILD)

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan
