"""Browser tests need a Chromium binary; without one they skip, saying so."""

from __future__ import annotations

import pytest

from tests.browser.chromium import find_chromium


@pytest.fixture(scope="session")
def chromium_path() -> str:
    """The Chromium binary, or a visible skip naming how to install one."""
    path = find_chromium()
    if path is None:
        pytest.skip(
            "chromium not found on PATH (nor $CHROMIUM): run `make install-browser` "
            "(apt-get install chromium) to run the dashboard's browser tests"
        )
    return path
