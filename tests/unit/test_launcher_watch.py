"""When a Manager's process leaves the job with its launcher (see test_launcher_exit)."""

from __future__ import annotations

import pytest

from torchft_pg.manager.launcher_watch import should_watch


@pytest.mark.parametrize(
    ("env", "watch"),
    [
        ({}, False),  # started by hand or by a plain script: never
        ({"TORCHELASTIC_RUN_ID": "x"}, True),  # started by torchrun
        ({"TORCHELASTIC_RUN_ID": "x", "TORCHFT_EXIT_WITH_LAUNCHER": "0"}, False),
        ({"TORCHFT_EXIT_WITH_LAUNCHER": "1"}, True),  # any other launcher, on request
        ({"TORCHFT_EXIT_WITH_LAUNCHER": "false"}, False),
    ],
)
def test_who_watches_its_launcher(env: dict[str, str], watch: bool) -> None:
    assert should_watch(env) is watch
