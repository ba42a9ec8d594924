# The two commands of the README: `make demo` and `make test`. Everything else is CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
VENV       ?= .venv
PY         := $(VENV)/bin/python
JOBS       ?= 2
CMAKE_ARGS ?=

.PHONY: all build demo test sanitize fuzz bench clean format venv

all: build

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check numpy ml_dtypes

venv: $(PY)

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# The demo trains the tiny MoE model with BF16 and with MXFP8 on the built-in corpus (about 20
# seconds on two cores) and writes out/demo/report.md and out/demo/val_loss.svg. One thread:
# the tiny model's matrices are too small to share out.
demo: build
	./$(BUILD)/bin/lowp info
	./$(BUILD)/bin/lowp demo
	./$(BUILD)/bin/lowp compare --recipes bf16,all_mxfp8 --config tiny --steps 400 --threads 1 \
		--out out/demo

test: $(PY)
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DLOWP_PYTHON=$(abspath $(PY)) $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer (run by .ci/run).
sanitize: $(PY)
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DLOWP_SANITIZE=ON -DLOWP_PYTHON=$(abspath $(PY)) $(CMAKE_ARGS) >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && LOWP_TEST_QUICK=1 ctest --output-on-failure -j $(JOBS)

# ---- fuzz (issue 10 item 15; owner h10): the five libFuzzer targets of tests/fuzz, ASan + UBSan,
# FUZZ_SECONDS each (default 40), seeded from files `lowp` writes. Needs clang with libFuzzer
# (Debian: clang-14 and libclang-rt-14-dev; .ci/run installs them) and `make build`.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 40
FUZZ_CC      ?= clang-14
fuzz: build $(PY)
	CC=$(FUZZ_CC) cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DLOWP_SANITIZE=ON -DLOWP_FUZZ=ON $(CMAKE_ARGS) >/dev/null
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_targets
	FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh $(FUZZ_BUILD) $(BUILD)/bin/lowp $(PY)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
