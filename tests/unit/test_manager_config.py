"""ManagerConfig: environment and arguments, and where the manager server listens."""

from __future__ import annotations

import pytest

from torchft_pg.manager.config import ManagerConfig
from torchft_pg.manager.group_server import manager_bind

ENV = {"MASTER_PORT": "29500", "TORCHFT_LIGHTHOUSE": "lh:29510"}


def test_loopback_without_a_secret_every_interface_with_one_unless_a_bind_host_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("TORCHFT_JOB_SECRET", "TORCHFT_JOB_SECRET_FILE", "TORCHFT_INSECURE"):
        monkeypatch.delenv(var, raising=False)
    assert manager_bind(ManagerConfig.from_env(ENV)) == "127.0.0.1:0"
    assert manager_bind(ManagerConfig.from_env(ENV), job_secret="s" * 16) == "[::]:0"
    monkeypatch.setenv("TORCHFT_INSECURE", "1")  # the explicit opt-out: as before
    assert manager_bind(ManagerConfig.from_env(ENV)) == "[::]:0"
    local = ManagerConfig.from_env({**ENV, "TORCHFT_BIND_HOST": "127.0.0.1"}, port=7)
    assert local.bind_host == "127.0.0.1" and manager_bind(local) == "127.0.0.1:7"
    v6 = ManagerConfig.from_env({**ENV, "TORCHFT_BIND_HOST": "127.0.0.1"}, bind_host="fd00::2")
    assert manager_bind(v6) == "[fd00::2]:0"  # the argument wins over the environment


@pytest.mark.parametrize("bad", ["[::1]", " 10.0.0.1", ""])
def test_a_bind_host_with_brackets_or_spaces_is_refused_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match=r"bind_host must be a host or address .* got"):
        ManagerConfig.from_env(ENV, bind_host=bad)
