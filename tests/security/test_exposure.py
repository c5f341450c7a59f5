"""A server that any machine may reach, with no job secret, says so once at start."""

from __future__ import annotations

import logging

import pytest

from lighthouse import auth

SECRET = "s3cret-for-this-job-only"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "[::1]", "::1", "localhost"])
def test_loopback_binds_are_not_exposed(host: str) -> None:
    assert auth.exposure_warning("the lighthouse", host, None) is None


@pytest.mark.parametrize("host", ["[::]", "::", "0.0.0.0", "", "198.18.0.4", "trainer-7"])
def test_other_binds_without_a_secret_are_named_with_the_fix(host: str) -> None:
    warning = auth.exposure_warning("the lighthouse", host, None)
    assert warning is not None
    assert "the lighthouse listens on" in warning and "no job secret" in warning
    assert auth.SECRET_ENV in warning and "127.0.0.1" in warning
    assert auth.exposure_warning("the lighthouse", host, SECRET) is None


def test_the_warning_is_logged_once_per_kind_of_server(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("test-exposure")
    with caplog.at_level(logging.WARNING, logger="test-exposure"):
        for _ in range(3):
            auth.warn_if_exposed(log, "a test server", "[::]", None)
        auth.warn_if_exposed(log, "another test server", "127.0.0.1", None)
        auth.warn_if_exposed(log, "a third test server", "0.0.0.0", SECRET)
    assert [r.getMessage()[:30] for r in caplog.records] == ["a test server listens on [::] "]
