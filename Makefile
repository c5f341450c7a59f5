# torchft_pg developer commands. Everything runs inside .venv (made by `make install`).
PY ?= .venv/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: install install-torchft-compat install-test-extras install-browser demo test test-slow test-browser lint bench proto clean

install:  ## create .venv with pinned CPU torch and the project (editable, dev extras)
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --disable-pip-version-check torch==$(TORCH_VERSION)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'

install-torchft-compat:  ## opt-in: the import name `torchft` and `torchft_lighthouse`, served by torchft_pg
	@if $(PY) -m pip show -q torchft >/dev/null 2>&1 || $(PY) -m pip show -q torchft-nightly >/dev/null 2>&1; then \
		echo "a real torchft is installed in .venv; torchft-pg-compat would replace its import name." >&2; \
		echo "uninstall it first (.venv/bin/pip uninstall torchft torchft-nightly), or keep torchft and skip this." >&2; \
		exit 1; fi
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e compat/torchft

# Test-only packages: torchtitan's fault-tolerance modules and the three modules they
# import, and parameterized for torchft's own tests. --no-deps: they must never change
# torch (tests/torchtitan refuses to run if it did). torchft's wheels are only downloaded,
# never installed: tests/torchft_suites runs test files from them against torchft_pg.
TEST_EXTRAS = torchtitan==0.3.0 tyro==1.0.17 spmd_types==0.2.3 torchdata==0.11.0 parameterized==0.9.0
TORCHFT_WHEELS = .whl/torchft
install-test-extras: install-torchft-compat  ## test-only packages (torchtitan), never touching torch
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(TEST_EXTRAS)
	$(PY) -m pip download -q --disable-pip-version-check --no-deps -d $(TORCHFT_WHEELS) torchft==0.1.1
	$(PY) -m pip download -q --disable-pip-version-check --no-deps -d $(TORCHFT_WHEELS) torchft==0.2.0
	$(PY) -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '$(TORCH_VERSION)' else 'torch changed to ' + v)"

demo:  ## the fault-tolerance demo (see README)
	PYTHONUNBUFFERED=1 $(PY) examples/demo.py

test: install-test-extras  ## the full CI suite: unit, integration, torchtitan and the short chaos plan (no browser)
	$(PY) -m pytest -q -rs -m "not slow and not browser" tests

install-browser:  ## headless Chromium for `make test-browser` (Debian package; needs root)
	command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends chromium; }

test-browser:  ## the dashboard rendered by headless Chromium (tests/browser; skips without chromium)
	$(PY) -m pytest -q -rs -m browser tests/browser

test-slow: install-test-extras  ## long soak runs (100 kills)
	$(PY) -m pytest -q -m slow tests

LINTED = ft_errors torchft_pg lighthouse tests bench examples compat

lint:  ## ruff check, ruff format --check and mypy (code and tests), as CI runs them
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m mypy

bench:  ## every benchmark: tables plus one JSON line each (~7 min on 2 cores)
	PYTHONUNBUFFERED=1 $(PY) bench/collectives.py
	PYTHONUNBUFFERED=1 $(PY) bench/quorum.py
	PYTHONUNBUFFERED=1 $(PY) bench/manager_quorum.py
	PYTHONUNBUFFERED=1 $(PY) bench/heal.py
	PYTHONUNBUFFERED=1 $(PY) bench/recovery.py
	PYTHONUNBUFFERED=1 $(PY) bench/semisync.py
	PYTHONUNBUFFERED=1 $(PY) bench/quantize.py
	PYTHONUNBUFFERED=1 $(PY) bench/security.py

proto:  ## regenerate lighthouse/_gen from proto/ (never edit _gen by hand)
	$(PY) -m lighthouse._codegen lighthouse/_gen

clean:
	rm -rf .venv build *.egg-info .pytest_cache .mypy_cache .ruff_cache
