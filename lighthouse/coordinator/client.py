"""``LighthouseClient``: the blocking client of a lighthouse (quorum and heartbeat).

Every call has a deadline (a ``timedelta``). An unreachable lighthouse is
retried with backoff for up to ``connect_timeout``, then
``LighthouseUnavailableError`` names the address (``lighthouse._calls``). Bad
arguments raise ``ValueError`` / ``TypeError`` before anything is sent.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from lighthouse import auth, services, validate, wire
from lighthouse._calls import call_with_retries
from lighthouse._net import CHANNEL_OPTIONS, normalize_address, stub
from lighthouse.errors import FaultToleranceError, LighthouseUnavailableError
from lighthouse.tls import TlsConfig, resolve_tls
from lighthouse.types import Quorum, QuorumMember

__all__ = ["LighthouseClient"]


class LighthouseClient:
    """Talks to a lighthouse at ``addr`` (``host:port``); thread-safe.

    ``connect_timeout``: how long an unreachable lighthouse is retried per call.
    ``job_secret``, ``job_id``: the job's secret and id (default: from the
    environment, see ``lighthouse.auth``), sent with every call.
    ``tls``: verify the lighthouse's TLS certificate against this CA (default:
    from the environment, see ``lighthouse.tls``; none set: plaintext).
    ``incarnation``: a token of this client's incarnation
    (``lighthouse.auth.new_incarnation()``), sent with every call so the
    lighthouse refuses the replica ids this client asks under to any other
    incarnation while it remembers them (``lighthouse.coordinator.incarnations``).
    None (the default, and what torchft's client does): no token; the ids are
    then unprotected, and a second client may ask under the same id.
    """

    def __init__(
        self,
        addr: str,
        connect_timeout: timedelta = timedelta(seconds=10),
        *,
        job_secret: str | None = None,
        job_id: str | None = None,
        tls: TlsConfig | None = None,
        incarnation: str | None = None,
    ) -> None:
        self._addr = normalize_address(addr)
        self._connect_s = validate.timeout_seconds("connect_timeout", connect_timeout)
        self._channel = auth.sync_channel(
            self._addr,
            CHANNEL_OPTIONS,
            auth.resolve_job_secret(job_secret),
            auth.resolve_job_id(job_id),
            tls if tls is not None else resolve_tls(),
            None if incarnation is None else auth.check_incarnation(incarnation),
        )
        self._quorum = stub(self._channel, services.LIGHTHOUSE_QUORUM)
        self._heartbeat = stub(self._channel, services.LIGHTHOUSE_HEARTBEAT)

    def quorum(
        self,
        replica_id: str,
        timeout: timedelta,
        address: str = "",
        store_address: str = "",
        step: int = 0,
        world_size: int = 0,
        shrink_only: bool = False,
        data: Any = None,
        commit_failures: int = 0,
        step_time_ms: float = 0.0,
    ) -> Quorum:
        """Ask for a quorum and wait (up to ``timeout``) until one containing us forms.

        ``data``: any JSON-serializable value (torchft passes a dict), or None.
        It travels as JSON text, and every participant of the returned quorum
        carries its sender's value decoded again (``json.loads``: tuples come
        back as lists, non-str dict keys as str), or None if it sent none. A
        ``str`` is sent as a JSON string, not parsed. Raises ``TypeError`` /
        ``ValueError`` before sending for a value JSON cannot hold (NaN and
        infinity included) or one over 64 KiB encoded, and ``FaultToleranceError``
        if the reply carries data that is not JSON text.
        """
        text = validate.encode_data(data)
        member = QuorumMember(
            replica_id=replica_id,
            address=address,
            store_address=store_address,
            step=step,
            world_size=world_size,
            shrink_only=shrink_only,
            data=data,
            commit_failures=commit_failures,
            step_time_ms=step_time_ms,
        )
        validate.check_member(validate.with_data_json(member, text))
        reply = call_with_retries(
            self._quorum,
            wire.encode_lighthouse_quorum_request(member),
            what=f"quorum request of {replica_id!r}",
            addr=self._addr,
            timeout_s=validate.timeout_seconds("timeout", timeout),
            connect_timeout_s=self._connect_s,
            unavailable=LighthouseUnavailableError,
        )
        try:
            return wire.decode_lighthouse_quorum_response(reply)
        except ValueError as exc:
            raise FaultToleranceError(
                f"quorum request of {replica_id!r}: malformed reply from {self._addr}: {exc}"
            ) from exc

    def heartbeat(self, replica_id: str, timeout: timedelta = timedelta(seconds=5)) -> str:
        """Tell the lighthouse ``replica_id`` is alive; returns the lighthouse epoch."""
        validate.check_replica_id(replica_id)
        reply = call_with_retries(
            self._heartbeat,
            wire.encode_heartbeat_request(replica_id),
            what=f"heartbeat of {replica_id!r}",
            addr=self._addr,
            timeout_s=validate.timeout_seconds("timeout", timeout),
            connect_timeout_s=self._connect_s,
            unavailable=LighthouseUnavailableError,
        )
        return wire.decode_heartbeat_response(reply)

    def close(self) -> None:
        """Close the channel; later calls fail."""
        self._channel.close()
