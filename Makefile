# fusion-compare: `make report` writes this machine's comparison report (to out/report, not tracked by git),
# `make test` runs the checks. Both set up a virtual environment first (CPU build of torch, pinned; GPU users see
# README.md). The committed reports change only through their own targets: report-cpu, report-tp, gpu-build.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
REPORT_DIR ?= out/report
# The second, torch-free environment with the GPU machine's Triton (test-triton36 below).
T36 := .venv-t36

.PHONY: moe-report bench-layer bench-checkpoint setup env data compilers check check-tests test test-main test-slow test-every test-isa test-quiet ci other-torch lint report report-cpu report-tp golden clean gpu-build test-triton36 wheel-check gpu-wheels

# Both environments, the default report's data, and Inductor's one-time set-up: what `make report` needs before it
# measures. Side by side where they can be: the two environments' installs, then the data and Inductor's set-up.
setup:
	$(MAKE) --no-print-directory -j3 $(VENV)/.installed $(T36)/.installed
	$(MAKE) --no-print-directory -j2 data compilers

# What a report needs before it measures (the project's environment, then its data beside Inductor's set-up), each
# once per environment.
PREPARED = $(MAKE) --no-print-directory -j2 $(DATA_STAMP) compilers

# Both environments: the project's, and the bare Triton 3.6.0 one the sm_90 compile tests also run in. The test
# targets need only these.
env: $(VENV)/.installed $(T36)/.installed

# The golden reference, plain computation and gate resolution of the default report's cases, computed once into the
# disk cache of data that is a pure function of the case (python -m compare prepare; deterministic; about 40 s on
# 2 cores the first time, a second when cached), and the verdicts of the backends this machine runs interpreted
# (parity only), kept in the interpreted-parity cache that make report reuses (about 30 s the first time).
# `make setup` and `make data` always run it (a check of a second or two plus the imports when all is cached:
# about 8 s on 2 cores); `make report` runs it once per environment (its stamp), since a run computes whatever of
# its data the cache lacks anyway (only slower: the interpreted parity then runs inside the report).
DATA_STAMP := $(VENV)/.data-prepared
data: $(VENV)/.installed
	$(PY) -m compare prepare --preset cpu-mlp --dtype float32 bfloat16 --parity
	touch $(DATA_STAMP)

$(DATA_STAMP): $(VENV)/.installed
	$(MAKE) --no-print-directory data

# Inductor's first compile on a machine also builds what every later one reuses (its vector-ISA probes, its kernel
# prelude; 16 s on a 2-core AVX2 EPYC, cached on disk): paid once here, on a graph none of the backends compiles,
# so that the report's first compile is its model's (torch_impl/inductor_warmup.py). Once per environment.
compilers: $(VENV)/.inductor-warm

$(VENV)/.inductor-warm: $(VENV)/.installed
	$(PY) -m torch_impl.inductor_warmup
	touch $@

# constraints/cpu.txt pins every package CI tested, torch (the CPU build) too (refresh it with `pip freeze` after an
# upgrade); scripts/wheel_check.sh installs the same way.
$(VENV)/.installed: pyproject.toml constraints/cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints/cpu.txt torch -e '.[triton,test,cluster]'
	touch $@

lint: env
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# pytest-xdist: two worker processes, each test module on one of them (its shared fixtures, such as a TP worker
# group, start once; the long parity and seed sweeps are split into modules by framework and preset), handed out in
# collection order (the longest modules first: tests/conftest.py, LONG_FIRST), each worker
# with one thread per pool (tests/conftest.py: ONE_THREAD_ENV; N workers of N threads on N cores starve each other).
# PYTEST_WORKERS=0 runs in this process, with the default thread counts.
PYTEST_WORKERS ?= 2
PYTEST_PAR := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The quick loop for every edit: lint, format, types and the quick tier of the tests (every test has a tier marker,
# tests/conftest.py refuses one without; no compile at a new shape, no worker process). Under a minute on 2 cores
# (42 s with bf16 matmul emulated): the lint beside the tests' two workers.
CHECK_TESTS := quick and not standard and not slow and not compile and not gpu and not quiet
check: env
	$(MAKE) --no-print-directory -j2 lint check-tests

check-tests: env
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_PAR) -m "$(CHECK_TESTS)"

# The test loop for a change: lint, the sm_90 compile tests under triton 3.6.0 and the quick and standard tiers of
# pytest (every test but the `slow` tier), in under 6 minutes on 2 cores.
# The lint, the triton 3.6.0 tests and pytest run side by side (make -j3; their few lines among pytest's dots): the
# lint and the small triton run fill the gaps the two pytest workers leave.
test: env
	$(MAKE) --no-print-directory -j3 lint test-triton36 test-main

test-main: env
	$(PY) -m pytest -q $(PYTEST_PAR) -m "not slow and not quiet"

# The slow tier: the tests that take more than about 10 s each here (seed sweeps, multi-host groups, the Inductor
# cache under two ISAs, the GPU check's dry run), the compiled backends' parity on the heavy-tailed `odd` cases (a
# compile each) and the sm_90 build under this environment's Triton (make test builds it under the GPU machine's).
test-slow: env other-torch
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_PAR) -m "slow and not quiet"

# The tests that judge the timer's accuracy (tests/test_timer_agreement.py, the known-cost busy loops of
# tests/test_timing.py) and ab's one-thread and sleeping sides found slower (tests/test_ab.py): in one process, with
# nothing else running (beside one busy core the JAX comparison swung to 1.17x, beside the other tests a 2 ms loop
# read 3.2 ms; alone they hold within 3% and 10%).
test-quiet: env
	$(PY) -m pytest -q -p no:cacheprovider -m quiet

# What CI runs (.ci/run): everything. `make test` and the slow tier in one pytest session (its two workers balance
# both tiers' modules; the wheel check, mostly installs, beside them), then the `isa` pass under capped instruction
# sets, then the timer's accuracy alone. The two environments install side by side, as the first targets' needs.
ci:
	@df -h . | tail -n 1 | awk '{print "make ci: " $$4 " free on the disk of the checkout"}'
	$(MAKE) --no-print-directory -j4 lint test-triton36 test-every wheel-check other-torch
	$(MAKE) --no-print-directory test-isa
	$(MAKE) --no-print-directory test-quiet

test-every: env
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_PAR) -m "not quiet"

# The previous torch minor release's environment for tests/test_ab.py's A/B across two torch versions (tests/
# other_torch.py: 4.7 GB, into .venv-torch-prev, once), built in make ci after the project's environment, beside the
# tests (a test that needs it waits for it); the test builds it itself where it is missing. Never fails: where pip
# cannot install it, or the disk has not the room for it, the test says why it skips.
other-torch: $(VENV)/.installed
	$(PYTHON) tests/other_torch.py

# The package as a user gets it: the wheel built from the working tree, installed with the pinned stack into a fresh
# virtual environment (removed afterwards), `python -m compare list`, a `tiny` run and a one-kernel gpu-build from a
# folder outside the checkout. Needs no `make env`. 1 min 35 s on 2 cores with pip's cache warm (2 min 25 s beside a
# test run, a minute of it then removing the environment).
wheel-check:
	PYTHON=$(PYTHON) scripts/wheel_check.sh

# Another CPU computes other bits: OpenBLAS and XLA pick their kernels (and with them the summation order) by the
# instruction sets present, and ATen its vectorised loops. A parity verdict on a committed case must not depend on
# that, so the `isa` tests run again with OpenBLAS's Sandybridge kernels, XLA capped at AVX and ATen at AVX2, and
# a disk cache of generated data of their own, empty at the start and removed at the end: every reference and plain
# computation is made afresh under those kernels, once per case (with the cache off, once per test: 117 s against
# 79 s here).
# Inductor's cache: the tool's own folder per vector ISA (torch_impl/device.py), so on an AVX2 machine this pass
# reuses the kernels the main pass compiled and on an AVX-512 one compiles its own; a TORCHINDUCTOR_CACHE_DIR set by
# the caller is not keyed, so this pass then gets a folder of its own beside it (sharing one, a native run's
# AVX-512 kernels were read under the AVX2 cap: 48 wrong torch-compile results).
# On two workers, as the main pass (on clean clones with fresh caches: 1 min 46 s under the AVX2 caps, reusing the
# main pass's kernels; 2 min 38 s at AVX-512, compiling its own).
ISA_INDUCTOR := $(if $(TORCHINDUCTOR_CACHE_DIR),TORCHINDUCTOR_CACHE_DIR=$(TORCHINDUCTOR_CACHE_DIR)-capped-isa)
test-isa: env
	d=$$(mktemp -d) && OPENBLAS_CORETYPE=Sandybridge XLA_FLAGS=--xla_cpu_max_isa=AVX ATEN_CPU_CAPABILITY=avx2 \
		FUSION_COMPARE_CACHE=$$d $(ISA_INDUCTOR) $(PY) -m pytest -q -m isa -p no:cacheprovider $(PYTEST_PAR); \
		rc=$$?; rm -rf $$d; exit $$rc

# Compile every Triton kernel, autotune config and dtype for sm_90 and sm_80 without a GPU: registers, spills,
# shared memory, tensor-core instructions, occupancy. Writes the committed table (cached: a rerun is quick).
gpu-build: env
	$(PY) -m compare gpu-build --arch sm_90 sm_80 --out reports/gpu-build

# What the GPU machine's image lacks for the GPU check (constraints/gpu-extra.txt: jax-triton), downloaded here as
# Python 3.12 manylinux x86_64 wheels into gpu-wheels/ (ignored by git); scripts/gpu_check.sh installs them from
# there offline. Copy the folder along with the checkout. Needs no `make env`.
gpu-wheels:
	$(PYTHON) -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --no-deps -d gpu-wheels -r constraints/gpu-extra.txt

# The GPU machine's Triton (3.6.0) compiles the kernels for sm_90 too: the compile tests in a second, torch-free
# environment (tests/conftest.py imports torch, hence --noconftest), with the layer tests, which import every module
# of the framework-neutral triton_impl there (only triton, numpy, ml_dtypes (the core's bfloat16) and pytest installed).
$(T36)/.installed:
	$(PYTHON) -m venv $(T36)
	$(T36)/bin/python -m pip install -q --upgrade pip
	$(T36)/bin/python -m pip install -q triton==3.6.0 numpy==2.4.6 ml_dtypes==0.6.0 pytest==9.2.0
	touch $@

test-triton36: $(T36)/.installed
	$(T36)/bin/python -m pytest -q --noconftest -p no:cacheprovider tests/test_gpu_build.py tests/test_layers.py

# geglu cpu-mlp in float32 and bfloat16, every backend (interpreted ones parity-only, jax-triton reported
# unavailable off GPU), kernel counts, ceilings and roofline, and a compile-cost sweep over token counts.
# Exit status 1 is a finding (a parity failure, written into the report), not a failure to write the report:
# the targets succeed on 0 and 1 and fail on bad input (2), an internal error (3) or an interrupt (130).
# A time budget the whole run keeps (compare.run.budget): the ceilings, the timed samples (warm and cold), the
# profiles and the compile-cost sweep share it, parity never is cut, and the report states every cut. Interpreted (parity-only)
# backends reuse their verdicts from the on-disk cache on a rerun of the same code (compare.run.parity_cache).
REPORT_BUDGET ?= 45
CPU_REPORT := $(PY) -m compare run --preset cpu-mlp --dtype float32 bfloat16 --profile --shape-sweep 1 64 256 1024 \
	--cache both --time-budget $(REPORT_BUDGET)

# This machine's report, into a folder git ignores (REPORT_DIR=... writes it elsewhere): the tests read the
# committed reports, so running it never changes what they see.
report: $(VENV)/.installed
	$(PREPARED)
	$(CPU_REPORT) --out $(REPORT_DIR); rc=$$?; [ $$rc -le 1 ] || exit $$rc

# The mixture-of-experts blocks (docs/moe.md): each MoE backend on the three CPU-sized presets (the published blocks'
# expert count and top-k, 24 tokens), float32 and bfloat16, fwd+bwd, with kernels per step, each preset's report in
# its own folder under $(REPORT_DIR)/moe (one run per preset: a run takes one preset), each within the default
# report's time budget.
MOE_PRESETS := qwen3-moe-cpu mixtral-cpu gpt-oss-20b-cpu
moe-report: $(VENV)/.installed
	for p in $(MOE_PRESETS); do \
		$(PY) -m compare run --preset $$p --dtype float32 bfloat16 --mode fwd+bwd --profile \
			--time-budget $(REPORT_BUDGET) --out $(REPORT_DIR)/moe/$$p; rc=$$?; [ $$rc -le 1 ] || exit $$rc; \
	done

# What judging a real layer costs (scripts/real_layer.py): the README's module command on Llama 3 8B's, Llama 3.2
# 1B's and Qwen2.5 0.5B's MLP shapes (random bfloat16 weights), from nothing and with the golden cached: wall time,
# peak memory and the share spent judging, into out/real-layer/real-layer.json. Minutes; a figure of this machine.
bench-layer: $(VENV)/.installed
	$(PY) scripts/real_layer.py --out out/real-layer

# every layer of a 24-layer checkpoint of Qwen2.5 0.5B's shape, in one run
bench-checkpoint: $(VENV)/.installed
	$(PY) scripts/real_layer.py --layer qwen2.5-0.5b --checkpoint 24 --out out/real-layer

# The committed reports/cpu, and the README's excerpt of it (tests/test_readme.py holds the two together).
report-cpu: $(VENV)/.installed
	$(PREPARED)
	$(CPU_REPORT) --out reports/cpu; rc=$$?; [ $$rc -le 1 ] || exit $$rc
	$(PY) scripts/readme_excerpt.py --write

# The committed reports/cpu-tp. Tensor parallel, geglu cpu-mlp float32: every TP backend at world size 1 (2 threads)
# and 2 (1 thread per rank), the only fair scaling pair on a 2-core machine; collectives in the kernel table
# (--profile).
report-tp: $(VENV)/.installed
	$(PREPARED)
	$(PY) -m compare run --preset cpu-mlp --world-size 1 2 --backend torch-tp torch-tp-compile torch-tp-manual \
		jax-tp jax-tp-shardmap --dtype float32 --mode fwd fwd+bwd --profile --out reports/cpu-tp; \
		rc=$$?; [ $$rc -le 1 ] || exit $$rc

golden: env
	$(PY) scripts/make_golden.py

clean:
	rm -rf $(VENV) $(T36) .venv-torch-prev out .pytest_cache .ruff_cache
