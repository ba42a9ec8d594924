# The two commands of the README: `make demo` and `make test`. Everything else is CMake.
BUILD      ?= build
ASAN_BUILD ?= build-asan
VENV       ?= .venv
PY         := $(VENV)/bin/python
JOBS       ?= 2
CMAKE_ARGS ?=

.PHONY: all build python demo test sanitize fuzz bench clean format venv

all: build

# The test dependencies, installed into .venv by `make test` (torch from PyPI is large; an
# existing .venv that already satisfies every requirement is reused without touching pip).
# torchtitan is pinned: lowp's converter and patch_torchtitan() are tested on 0.3.0 only.
PY_DEPS := numpy ml_dtypes>=0.7 pytest torch>=2.6 torchao>=0.17 torchtitan==0.3.0 tokenizers

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
# Every compile must peak under 2 GB (tools/compile_mem.py; the peaks: build-asan/compile_mem.log),
# so that two at -j2 fit a small machine.
sanitize: venv
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DLOWP_SANITIZE=ON -DLOWP_COMPILE_MEM_LIMIT_MB=2048 \
		-DLOWP_PYTHON=$(abspath $(PY)) \
		-DLOWP_PYTHON_EXT=ON -DPython_EXECUTABLE=$(abspath $(PY)) $(CMAKE_ARGS) >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && LOWP_TEST_QUICK=1 ctest --output-on-failure -j $(JOBS)

# ---- fuzz: the five libFuzzer targets of tests/fuzz, ASan + UBSan,
# FUZZ_SECONDS each (default 40), seeded from files `lowp` writes. Needs clang with libFuzzer
# (Debian: clang-14 and libclang-rt-14-dev; .ci/run installs them) and `make build`.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 40
FUZZ_CC      ?= clang-14
fuzz: build $(PY)
	CC=$(FUZZ_CC) cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DLOWP_SANITIZE=ON -DLOWP_FUZZ=ON $(CMAKE_ARGS) >/dev/null
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_targets
	FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh $(FUZZ_BUILD) $(BUILD)/bin/lowp $(PY)

# ---- bench: install the peers `lowp bench gemm` compares with
# (Debian's libdnnl-dev and libopenblas-dev, via apt-get, as root, only when missing),
# reconfigure so the CLI links them, then run every benchmark. A oneDNN with a CPU runtime of
# its own under LOWP_ONEDNN_ROOT (default .venv) is linked instead of Debian's (CMakeLists.txt).
# With torch in .venv, `python -m lowp.bench gemm` then times the training GEMMs against
# torch.mm (the oneDNN torch bundles). BENCH_QUICK=1: short shapes and few repetitions (a smoke
# run); the figures in docs/benchmarks.md come from the full run.
BENCH_PEERS ?= libdnnl-dev libopenblas-dev
ifeq ($(BENCH_QUICK),1)
BENCH_CAST_ARGS  ?= --size 1M --reps 3
BENCH_QUANT_ARGS ?= --rows 256 --cols 1024 --reps 3
BENCH_GEMM_ARGS  ?= --quick --reps 2
BENCH_TRAIN_ARGS ?= --configs tiny --recipes bf16,all_mxfp8 --steps 1
BENCH_PYGEMM_ARGS ?= --shape 1024x1024x512 --reps 2
endif
BENCH_HAS_TORCH = $(shell test -x $(PY) && $(PY) -c "import torch" 2>/dev/null && echo 1)
bench:
	@missing=""; for p in $(BENCH_PEERS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "make bench: installing$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "make bench: peer packages missing ($$missing) and not root: the benchmarks run without them"; fi; \
	fi
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -ULOWP_DNNL_INCLUDE_DIR -ULOWP_DNNL_LIBRARY \
		-ULOWP_OPENBLAS_LIBRARY $(if $(BENCH_HAS_TORCH),$(PY_EXT_ARGS)) $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target lowp_cli $(if $(BENCH_HAS_TORCH),lowp_pyext)
	./$(BUILD)/bin/lowp bench cast $(BENCH_CAST_ARGS)
	./$(BUILD)/bin/lowp bench quant $(BENCH_QUANT_ARGS)
	./$(BUILD)/bin/lowp bench gemm $(BENCH_GEMM_ARGS)
	$(if $(BENCH_HAS_TORCH),PYTHONPATH=python $(PY) -m lowp.bench gemm $(BENCH_PYGEMM_ARGS),\
		@echo "make bench: no torch in $(VENV): the torch.mm peer (python -m lowp.bench gemm) is skipped")
	./$(BUILD)/bin/lowp bench train $(BENCH_TRAIN_ARGS)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
