# torchft_pg developer commands. Everything runs inside .venv (made by `make install`).
PY ?= .venv/bin/python
TORCH_VERSION ?= 2.13.0

.PHONY: install install-browser demo test test-slow test-browser lint bench proto clean

install:  ## create .venv with pinned CPU torch and the project (editable, dev extras)
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --disable-pip-version-check torch==$(TORCH_VERSION)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'

demo:  ## the fault-tolerance demo (see README)
	PYTHONUNBUFFERED=1 $(PY) examples/demo.py

test:  ## the full CI suite: unit, integration and the short chaos plan (no browser)
	$(PY) -m pytest -q -rs -m "not slow and not browser" tests

install-browser:  ## headless Chromium for `make test-browser` (Debian package; needs root)
	command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends chromium; }

test-browser:  ## the dashboard rendered by headless Chromium (tests/browser; skips without chromium)
	$(PY) -m pytest -q -rs -m browser tests/browser

test-slow:  ## long soak runs (100 kills)
	$(PY) -m pytest -q -m slow tests

LINTED = ft_errors torchft_pg lighthouse tests bench examples

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
