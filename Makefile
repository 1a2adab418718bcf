# fusion-compare: `make report` writes this machine's comparison report, `make test` runs the checks.
# Both set up a virtual environment first (CPU build of torch, pinned; GPU users see README.md).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
TORCH_CPU := torch==2.13.0
REPORT_DIR ?= reports/cpu

.PHONY: setup test lint report golden clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_CPU)
	$(PY) -m pip install -q -e '.[triton,test]'
	touch $@

lint: setup
	$(VENV)/bin/ruff check .

test: setup lint
	$(PY) -m pytest -q

# geglu cpu-mlp in float32 and bfloat16, every backend (interpreted ones parity-only, jax-triton reported
# unavailable off GPU), kernel counts, ceilings and roofline, and a compile-cost sweep over token counts.
# Exit status 1 is a finding (a parity failure, written into the report), not a failure to write the report:
# the target succeeds on 0 and 1 and fails on bad input (2), an internal error (3) or an interrupt (130).
report: setup
	$(PY) -m compare run --preset cpu-mlp --dtype float32 bfloat16 --profile \
		--shape-sweep 1 64 256 1024 --out $(REPORT_DIR); rc=$$?; [ $$rc -le 1 ] || exit $$rc

golden: setup
	$(PY) scripts/make_golden.py

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
