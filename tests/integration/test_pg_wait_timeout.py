"""An explicit ``work.wait(timeout)`` on ProcessGroupGloo, and what torchft's PGTransport
test expects of it ("gloo" case of ``run_multi_recovery_test``).

Two members are threads of this process; member 0 never posts the op member 1
waits on, so only the timeout can end member 1's wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch

from tests.integration.gloo_pair import gloo_pair
from torchft_pg import ProcessGroupGloo, ProcessGroupTimeoutError
from torchft_pg.checkpointing import PGTransport
from torchft_pg.errors import RecoveryError

GROUP_TIMEOUT = timedelta(
    seconds=30
)  # far longer than any wait below: it must not be what ends one
SLACK_S = 1.5  # scheduling delay a loaded CI machine may add past a deadline
TORCHFT_TIMEOUT_REGEX = r".*(Timed out|timed out|timeout|time out).*"  # torchft's transport_test


@pytest.fixture
def pair() -> Iterator[list[ProcessGroupGloo]]:
    """Two configured members of one Gloo group; aborted (in-flight ops fail) afterwards."""
    with gloo_pair("wait-timeout", GROUP_TIMEOUT) as pgs:
        yield pgs


def test_explicit_wait_timeout_bounds_a_recv_and_reaches_gloo(pair: list[ProcessGroupGloo]) -> None:
    _, member = pair
    work = member.recv([torch.zeros(4)], 0, 7)  # member 0 never sends
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?i)timed out") as err:
        work.wait(timedelta(milliseconds=200))
    elapsed = time.monotonic() - start
    assert 0.19 <= elapsed < 0.2 + SLACK_S, f"wait(200 ms) took {elapsed:.3f} s"
    assert "0.200 s passed to wait()" in str(err.value) or "200ms" in str(err.value)
    # The timeout reached Gloo's own wait: Gloo failed the op and closed the
    # connection to member 0, so an op with member 0 now fails at once instead
    # of waiting out its own 20 s.
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?i)timeout"):
        member.send([torch.ones(4)], 0, 8).wait(timedelta(seconds=20))
    assert time.monotonic() - start < SLACK_S


def test_explicit_wait_timeout_bounds_a_collective_with_a_future(
    pair: list[ProcessGroupGloo],
) -> None:
    _, member = pair
    work = member.allreduce([torch.ones(4)])  # member 0 never joins
    start = time.monotonic()
    with pytest.raises(ProcessGroupTimeoutError, match=r"timed out.*0\.300 s passed to wait"):
        work.wait(timedelta(milliseconds=300))
    elapsed = time.monotonic() - start
    assert 0.29 <= elapsed < 0.3 + SLACK_S, f"wait(300 ms) took {elapsed:.3f} s"


def test_pg_transport_send_after_a_timed_out_recv_fails_fast(pair: list[ProcessGroupGloo]) -> None:
    """torchft's run_multi_recovery_test, "timeout test" step, on our ProcessGroupGloo:
    a 10 ms recv_checkpoint from a sender that sends nothing times out, then a
    send_checkpoint back to that sender, which never receives, must finish
    quickly (torchft's harness gives the whole run 10 s), with a timeout error
    if it raises."""
    _, member = pair
    transport = PGTransport[dict[str, object]](
        member, timeout=timedelta(seconds=10), device=torch.device("cpu")
    )
    start = time.monotonic()
    with pytest.raises(RecoveryError, match=TORCHFT_TIMEOUT_REGEX):
        transport.recv_checkpoint(
            src_rank=0, metadata="<n/a>", step=3, timeout=timedelta(milliseconds=10)
        )
    assert time.monotonic() - start < SLACK_S

    start = time.monotonic()
    with pytest.raises(RecoveryError, match=TORCHFT_TIMEOUT_REGEX) as err:
        transport.send_checkpoint(
            dst_ranks=[0], step=4, state_dict={"w": torch.ones(3)}, timeout=timedelta(seconds=10)
        )
    assert time.monotonic() - start < SLACK_S, "send_checkpoint waited out its 10 s timeout"
    assert "sending step 4 to rank 0" in str(err.value)
