# The two commands of the README: `make demo` and `make test`. Everything else is CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
VENV       ?= .venv
PY         := $(VENV)/bin/python
JOBS       ?= 2
CMAKE_ARGS ?=

.PHONY: all build python demo test sanitize clean format venv

all: build

# The test dependencies, installed into .venv by `make test` (torch from PyPI is large; an
# existing .venv that already satisfies every requirement is reused without touching pip).
PY_DEPS := numpy ml_dtypes pytest torch>=2.6 torchao>=0.17

venv:
	@test -x $(PY) || python3 -m venv $(VENV)
	@$(PY) python/check_deps.py $(foreach d,$(PY_DEPS),"$(d)") || \
		$(PY) -m pip install --quiet --disable-pip-version-check $(foreach d,$(PY_DEPS),"$(d)")

# The library and CLI; with a .venv, also the Python extension, copied into python/lowp/ so
# that `PYTHONPATH=python .venv/bin/python -c "import lowp"` works in-tree.
PY_EXT_ARGS = $(if $(wildcard $(PY)),-DLOWP_PYTHON_EXT=ON -DPython_EXECUTABLE=$(abspath $(PY)))

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(PY_EXT_ARGS) $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# Only the extension module (python/lowp/_lowp*.so), for the Python of .venv (or python3).
python:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DLOWP_PYTHON_EXT=ON \
		-DPython_EXECUTABLE=$(abspath $(if $(wildcard $(PY)),$(PY),$(shell command -v python3))) \
		$(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target lowp_pyext

# The demo trains the tiny MoE model with BF16 and with MXFP8 on the built-in corpus (about 20
# seconds on two cores) and writes out/demo/report.md and out/demo/val_loss.svg. One thread:
# the tiny model's matrices are too small to share out.
demo: build
	./$(BUILD)/bin/lowp info
	./$(BUILD)/bin/lowp demo
	./$(BUILD)/bin/lowp compare --recipes bf16,all_mxfp8 --config tiny --steps 400 --threads 1 \
		--out out/demo

test: venv
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DLOWP_PYTHON=$(abspath $(PY)) \
		-DLOWP_PYTHON_EXT=ON -DPython_EXECUTABLE=$(abspath $(PY)) $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer (run by .ci/run),
# including the numpy-API tests of the Python package against an instrumented extension.
sanitize: venv
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DLOWP_SANITIZE=ON -DLOWP_PYTHON=$(abspath $(PY)) \
		-DLOWP_PYTHON_EXT=ON -DPython_EXECUTABLE=$(abspath $(PY)) $(CMAKE_ARGS) >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && LOWP_TEST_QUICK=1 ctest --output-on-failure -j $(JOBS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
