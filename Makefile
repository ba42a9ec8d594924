# The two commands of the README: `make demo` and `make test`. Everything else is CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
VENV       ?= .venv
PY         := $(VENV)/bin/python
JOBS       ?= 2
CMAKE_ARGS ?=

.PHONY: all build demo test sanitize clean format venv

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

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
