# torchft_pg developer commands. Everything runs inside .venv (made by `make install`).
PY ?= .venv/bin/python
TORCH_VERSION ?= 2.13.0
# Where pip looks for torch. Empty: pip's own configuration, where on Linux x86_64 PyPI's
# torch==$(TORCH_VERSION) is the CUDA build (several GB with its NVIDIA libraries) unless pip
# finds a CPU wheel first. https://download.pytorch.org/whl/cpu: the CPU build, about 190 MB.
TORCH_INDEX_URL ?=
PIP_INSTALL = $(PY) -m pip install --disable-pip-version-check
# Which torch .venv holds; fails unless it is $(TORCH_VERSION), whatever a step installed.
TORCH_CHECK = import sys, torch; v = torch.__version__; \
	build = f'CUDA {torch.version.cuda}' if torch.version.cuda else 'CPU'; \
	sys.exit(f'torch changed to {v}, not $(TORCH_VERSION)') if v.split('+')[0] != '$(TORCH_VERSION)' \
	else print(f'==> .venv has torch {v} ({build} build)')

.PHONY: install install-torchft-compat install-test-extras install-browser demo test test-slow test-browser lint docs bench proto clean

# One line per step before it starts, so a first install (40-100 s on 2 cores) is never
# silent for long; pip's own lines show where torch comes from and what else it fetches.
install:  ## create .venv with pinned torch and the project (editable, dev extras)
	@test -x $(PY) || { echo "==> [1/3] .venv: python3 -m venv .venv"; python3 -m venv .venv; }
	@echo "==> [2/3] torch $(TORCH_VERSION)$(if $(TORCH_INDEX_URL), from $(TORCH_INDEX_URL)): the CPU build, a 190 MB wheel, 750 MB installed (20 s on 2 cores, plus the download)"
	$(PIP_INSTALL) $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL)) torch==$(TORCH_VERSION)
	@echo "==> [3/3] torchft_pg (editable) and its tools: grpcio, pytest, ruff, mypy, torchx, ... (20 s the first time); torch stays $(TORCH_VERSION)"
	$(PIP_INSTALL) -q -e '.[dev]' torch==$(TORCH_VERSION)
	@$(PY) -c "$(TORCH_CHECK)"
	@echo "==> done: from this folder run .venv/bin/<program> (or 'source .venv/bin/activate' first), e.g. make demo"

install-torchft-compat:  ## opt-in: the import name `torchft` and `torchft_lighthouse`, served by torchft_pg
	@if $(PY) -m pip show -q torchft >/dev/null 2>&1 || $(PY) -m pip show -q torchft-nightly >/dev/null 2>&1; then \
		echo "a real torchft is installed in .venv; torchft-pg-compat would replace its import name." >&2; \
		echo "uninstall it first (.venv/bin/pip uninstall torchft torchft-nightly), or keep torchft and skip this." >&2; \
		exit 1; fi
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e compat/torchft

# Test-only packages: torchtitan's fault-tolerance modules and the three modules they
# import (torchdata's StatefulDataLoader is also tests/unit/test_data_stateful_loader.py's),
# and parameterized for torchft's own tests. --no-deps: they must never change
# torch (tests/torchtitan refuses to run if it did). torchft's wheels are only downloaded,
# never installed: tests/torchft_suites runs test files from them against torchft_pg.
TEST_EXTRAS = torchtitan==0.3.0 tyro==1.0.17 spmd_types==0.2.3 torchdata==0.11.0 parameterized==0.9.0
TORCHFT_WHEELS = .whl/torchft
install-test-extras: install-torchft-compat  ## test-only packages (torchtitan), never touching torch
	@echo "==> test-only packages ($(TEST_EXTRAS), without their dependencies) and torchft's wheels"
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(TEST_EXTRAS)
	$(PY) -m pip download -q --disable-pip-version-check --no-deps -d $(TORCHFT_WHEELS) torchft==0.1.1
	$(PY) -m pip download -q --disable-pip-version-check --no-deps -d $(TORCHFT_WHEELS) torchft==0.2.0
	$(PY) -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '$(TORCH_VERSION)' else 'torch changed to ' + v)"

demo:  ## the fault-tolerance demo (see README)
	PYTHONUNBUFFERED=1 $(PY) examples/demo.py

# Two runs, each announced with its duration on 2 cores, so the log never stands still for
# long: first the many short tests, one line per file; then the long multi-process runs (the
# chaos plans, torchtitan's training), one line per test (each 10-60 s). --durations lists
# the slowest tests of each run.
PYTEST = $(PY) -m pytest -rs -m "not slow and not browser"
LONG_TESTS = tests/chaos tests/torchtitan
test: install-test-extras  ## the full CI suite: unit, integration, torchtitan and the short chaos plan (no browser)
	@echo "==> [1/2] unit, integration, interop, security and torchft's own tests: a line per file (~7 min on 2 cores)"
	$(PYTEST) --durations=10 $(addprefix --ignore=,$(LONG_TESTS)) tests
	@echo "==> [2/2] the chaos plans and torchtitan's training runs: a line per test (~4 min on 2 cores)"
	$(PYTEST) -v --durations=10 $(LONG_TESTS)

install-browser:  ## headless Chromium for `make test-browser` (Debian package; needs root)
	command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends chromium; }

test-browser:  ## the dashboard rendered by headless Chromium (tests/browser; skips without chromium)
	$(PY) -m pytest -q -rs -m browser tests/browser

test-slow: install-test-extras  ## long soak runs (100 kills)
	$(PY) -m pytest -q -m slow tests

LINTED = torchft_pg lighthouse tests bench examples compat

lint:  ## ruff check, ruff format --check, mypy (code and tests) and mypy --strict (the shipped packages), as CI runs them
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m mypy
	$(PY) -m mypy --strict torchft_pg lighthouse

docs:  ## the reference site (docs/ and the API from the docstrings) in docs/_build/html; warnings are errors
	$(PY) -m sphinx -b html -W --keep-going -q docs docs/_build/html
	@echo "==> docs/_build/html/index.html"

bench:  ## every benchmark: tables plus one JSON line each (~12 min on 2 cores)
	PYTHONUNBUFFERED=1 $(PY) bench/collectives.py
	PYTHONUNBUFFERED=1 $(PY) bench/quorum.py
	PYTHONUNBUFFERED=1 $(PY) bench/manager_quorum.py
	PYTHONUNBUFFERED=1 $(PY) bench/heal.py
	PYTHONUNBUFFERED=1 $(PY) bench/recovery.py
	PYTHONUNBUFFERED=1 $(PY) bench/step_overhead.py --model tiny large --rounds 16
	PYTHONUNBUFFERED=1 $(PY) bench/lighthouse_outage.py
	PYTHONUNBUFFERED=1 $(PY) bench/stragglers.py
	PYTHONUNBUFFERED=1 $(PY) bench/semisync.py
	PYTHONUNBUFFERED=1 $(PY) bench/quantize.py
	PYTHONUNBUFFERED=1 $(PY) bench/security.py
	PYTHONUNBUFFERED=1 $(PY) bench/integrity.py

proto:  ## regenerate lighthouse/_gen from proto/ (never edit _gen by hand)
	$(PY) -m lighthouse._codegen lighthouse/_gen

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache docs/_build
