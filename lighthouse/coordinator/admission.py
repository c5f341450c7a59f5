"""Pure: whether the lighthouse admits a call under a replica id, before it changes anything.

Every call under a replica id (a quorum request, a heartbeat, a liveness
stream with its leaving ping) passes three checks, in this order:

- capacity: once ``max_tracked`` ids are remembered, a call under an id the
  lighthouse does not know is refused (RESOURCE_EXHAUSTED), so a flood of
  made-up ids cannot grow the lighthouse's memory;
- incarnation: a call whose token is not the one of the incarnation that owns
  the id is refused (PERMISSION_DENIED; INVALID_ARGUMENT for a malformed
  token), see ``lighthouse.coordinator.incarnations``;
- streams (liveness streams only): at most ``MAX_STREAMS_PER_REPLICA`` open
  under one id (RESOURCE_EXHAUSTED).

A refusal says what to log, at most once per episode: capacity until there is
room again, a refused id while the lighthouse remembers it. So a flood costs a
line, not a line per call. Also here: the one log line (per replica id) for a
member asking far above the job's committed step.

No sockets, no clock, no gRPC: the server passes in what the core knows
(``knows``, ``tracked``) and turns a ``Refusal`` into a status code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from lighthouse.coordinator.incarnations import Incarnations

__all__ = [
    "DEFAULT_MAX_TRACKED_REPLICAS",
    "MAX_STREAMS_PER_REPLICA",
    "Admission",
    "Refusal",
    "step_jump",
]

DEFAULT_MAX_TRACKED_REPLICAS = 4096  # replica ids remembered at once
# Liveness streams open under one id at once: a manager server keeps one (two
# briefly, while a reconnect replaces a stream the lighthouse has not yet seen close).
MAX_STREAMS_PER_REPLICA = 4


@dataclass(frozen=True, kw_only=True)
class Refusal:
    """Why a call is refused.

    ``kind``: "capacity" or "streams" (the server answers RESOURCE_EXHAUSTED),
    "incarnation" (PERMISSION_DENIED) or "malformed" (INVALID_ARGUMENT).
    ``reason``: for the caller, prefixed with the RPC's name. ``log``: the line
    to log (it names the caller's peer address), or None if this episode was
    logged already.
    """

    kind: Literal["capacity", "streams", "incarnation", "malformed"]
    reason: str
    log: str | None


class Admission:
    """The lighthouse's admission checks (one event loop only, like the core).

    ``knows(replica_id)``: whether the core remembers the id (seen and not
    forgotten, or with a liveness stream open); ``tracked()``: how many ids it
    remembers. ``max_tracked``: the capacity, an int >= 1.
    """

    def __init__(
        self,
        *,
        max_tracked: int,
        knows: Callable[[str], bool],
        tracked: Callable[[], int],
    ) -> None:
        self.max_tracked = max_tracked
        self._knows = knows
        self._tracked = tracked
        self.incarnations = Incarnations()
        self._logged_ids: set[str] = set()  # refused ids already logged, while remembered
        self._jumps_logged: set[str] = set()  # ids whose step jump was logged, while remembered
        self._full_logged = False  # capacity refusals logged, until there is room again

    def admit(self, rpc: str, replica_id: str, token: str | None, peer: str) -> Refusal | None:
        """A call ``rpc`` under ``replica_id`` carrying incarnation ``token`` (None:
        none) from ``peer``: None to let it in (binding an unbound id to the token),
        else why not."""
        known = self._knows(replica_id)
        if not known and self._tracked() >= self.max_tracked:
            log = None
            if not self._full_logged:
                self._full_logged = True
                log = (
                    f"refusing new replica ids: {self._tracked()} are tracked "
                    f"(max_tracked_replicas); first refused: {replica_id} from {peer}"
                )
            return Refusal(
                kind="capacity",
                reason=f"{rpc}: the lighthouse tracks at most {self.max_tracked} replica ids "
                f"and has no room for {replica_id!r}",
                log=log,
            )
        try:
            reason = self.incarnations.admit(replica_id, token, known)
        except ValueError as exc:
            return Refusal(kind="malformed", reason=f"{rpc}: {exc}", log=None)
        if reason is None:
            return None
        return Refusal(
            kind="incarnation",
            reason=f"{rpc}: {reason}",
            log=self._once(replica_id, f"refused a {rpc} call from {peer}: {reason}"),
        )

    def admit_stream(self, replica_id: str, open_streams: int, peer: str) -> Refusal | None:
        """A new liveness stream under ``replica_id`` (admitted by ``admit``), with
        ``open_streams`` already open under it: None, or the refusal past the limit."""
        if open_streams < MAX_STREAMS_PER_REPLICA:
            return None
        return Refusal(
            kind="streams",
            reason=f"Liveness: {MAX_STREAMS_PER_REPLICA} streams are already open under "
            f"{replica_id!r}",
            log=self._once(
                replica_id,
                f"refused a liveness stream for {replica_id} from {peer}: "
                f"{MAX_STREAMS_PER_REPLICA} are open under that id",
            ),
        )

    def tick(self) -> str | None:
        """Forget what concerns ids the core forgot (their token bindings, their
        logged refusals: they may be logged again). Returns the line to log when
        capacity refusals end, else None. O(bound ids + logged ids)."""
        self.incarnations.retain(self._knows)
        if self._logged_ids:
            self._logged_ids = {r for r in self._logged_ids if self._knows(r)}
        if self._jumps_logged:
            self._jumps_logged = {r for r in self._jumps_logged if self._knows(r)}
        if self._full_logged and self._tracked() < self.max_tracked:
            self._full_logged = False
            return f"room for new replica ids again ({self._tracked()} tracked)"
        return None

    def step_jump_once(self, replica_id: str, step: int, committed: int, known: bool) -> str | None:
        """``step_jump``'s line, once per replica id while the lighthouse remembers it:
        a claim does not raise the committed step, so its retries would jump again."""
        line = step_jump(replica_id, step, committed, known)
        if line is None or replica_id in self._jumps_logged:
            return None
        self._jumps_logged.add(replica_id)
        return line

    def _once(self, replica_id: str, line: str) -> str | None:
        if replica_id in self._logged_ids:
            return None
        self._logged_ids.add(replica_id)
        return line


def step_jump(replica_id: str, step: int, committed: int, known: bool) -> str | None:
    """The line to log when ``replica_id`` asks at ``step``, more than one step above
    the job's ``committed`` step, once that step is ``known`` (a step a quorum reached
    together, or one recorded in the state file); else None. The claim itself commits
    nothing (``lighthouse.coordinator.committed``): the quorum's members must
    reach it together, healing from the claimer if it is ahead."""
    if not known or step <= committed + 1:
        return None
    return (
        f"replica {replica_id} asks for a quorum at step {step}, far above the job's "
        f"committed step {committed} ({step - committed} steps ahead: restored from a "
        "newer checkpoint, or not what it claims to be; the step counts once its quorum "
        "reaches it together)"
    )
