# fusion-compare: `make report` writes this machine's comparison report, `make test` runs the checks.
# Both set up a virtual environment first (CPU build of torch, pinned; GPU users see README.md).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TORCH_CPU := torch==2.13.0
REPORT_DIR ?= reports/cpu

.PHONY: setup test lint report report-tp golden clean gpu-build test-triton36

setup: $(VENV)/.installed

# constraints/cpu.txt pins every package CI tested (refresh it with `pip freeze` after an upgrade).
$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints/cpu.txt $(TORCH_CPU)
	$(PY) -m pip install -q -c constraints/cpu.txt -e '.[triton,test]'
	touch $@

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# pytest-xdist: two worker processes, each test module on one of them (its shared fixtures, such as a TP worker
# group, start once); about 1.6x faster on 2 cores. PYTEST_WORKERS=0 runs in this process.
PYTEST_WORKERS ?= 2
test: setup lint test-triton36
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

# Compile every Triton kernel, autotune config and dtype for sm_90 and sm_80 without a GPU: registers, spills,
# shared memory, tensor-core instructions, occupancy. Writes the committed table (cached: a rerun is quick).
gpu-build: setup
	$(PY) -m compare gpu-build --arch sm_90 sm_80 --out reports/gpu-build

# The GPU machine's Triton (3.6.0) compiles the kernels for sm_90 too: the compile tests in a second, torch-free
# environment (tests/conftest.py imports torch, hence --noconftest), with the layer tests, which import every module
# of the framework-neutral triton_impl there (only triton, numpy and pytest installed).
T36 := .venv-t36
$(T36)/.installed:
	$(PYTHON) -m venv $(T36)
	$(T36)/bin/python -m pip install -q --upgrade pip
	$(T36)/bin/python -m pip install -q triton==3.6.0 numpy==2.4.6 pytest==9.2.0
	touch $@

test-triton36: $(T36)/.installed
	$(T36)/bin/python -m pytest -q --noconftest -p no:cacheprovider tests/test_gpu_build.py tests/test_layers.py

# geglu cpu-mlp in float32 and bfloat16, every backend (interpreted ones parity-only, jax-triton reported
# unavailable off GPU), kernel counts, ceilings and roofline, and a compile-cost sweep over token counts.
# Exit status 1 is a finding (a parity failure, written into the report), not a failure to write the report:
# the target succeeds on 0 and 1 and fails on bad input (2), an internal error (3) or an interrupt (130).
report: setup
	$(PY) -m compare run --preset cpu-mlp --dtype float32 bfloat16 --profile \
		--shape-sweep 1 64 256 1024 --out $(REPORT_DIR); rc=$$?; [ $$rc -le 1 ] || exit $$rc

# Tensor parallel, geglu cpu-mlp float32: every TP backend at world size 1 (2 threads) and 2 (1 thread per rank),
# the only fair scaling pair on a 2-core machine; collectives in the kernel table (--profile).
report-tp: setup
	$(PY) -m compare run --preset cpu-mlp --world-size 1 2 --backend torch-tp torch-tp-compile torch-tp-manual \
		jax-tp jax-tp-shardmap --dtype float32 --mode fwd fwd+bwd --profile --out reports/cpu-tp; \
		rc=$$?; [ $$rc -le 1 ] || exit $$rc

golden: setup
	$(PY) scripts/make_golden.py

clean:
	rm -rf $(VENV) $(T36) out .pytest_cache .ruff_cache
