"""The process's open-file limit, and whether a server's connection cap fits in it.

Every connection a server holds is one file descriptor. A process that runs
out of them (``EMFILE``) can no longer write its state file, accept its own
replicas or open anything else, so each server caps its connections below the
limit and keeps a reserve free for the rest of its process.

At a server's start, ``raise_nofile_limit`` raises the soft ``RLIMIT_NOFILE``
to the hard limit, once per process, and logs the figure: the usual soft limit
is 1024 while the hard limit is often far higher. ``resolve_max_connections``
then checks a server's cap against it: an explicit cap the limit cannot carry
is refused with a ``ValueError`` naming both figures; the default cap shrinks
to what the limit carries, with a warning, down to a floor below which the
server refuses to start.
"""

from __future__ import annotations

import logging
import threading

try:
    import resource
except ImportError:  # pragma: no cover - not a POSIX system
    resource = None  # type: ignore[assignment]

__all__ = [
    "UNLIMITED_SOFT_LIMIT",
    "connections_that_fit",
    "raise_nofile_limit",
    "resolve_max_connections",
]

log = logging.getLogger("lighthouse")

#: The soft limit asked for when the hard limit is unlimited (RLIM_INFINITY).
UNLIMITED_SOFT_LIMIT = 1 << 20

_lock = threading.Lock()
_limits: tuple[int, int] | None = None  # (soft, hard) once raised


def raise_nofile_limit() -> tuple[int, int]:
    """(soft, hard) ``RLIMIT_NOFILE`` of this process, the soft limit raised to the
    hard one first (once per process; logged at INFO, or WARNING if it cannot be
    raised above 1024). Without the ``resource`` module: (2**31 - 1, same)."""
    global _limits
    with _lock:
        if _limits is not None:
            return _limits
        if resource is None:  # pragma: no cover - not a POSIX system
            _limits = (2**31 - 1, 2**31 - 1)
            return _limits
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        ceiling = UNLIMITED_SOFT_LIMIT if hard == resource.RLIM_INFINITY else hard
        before = soft
        if soft == resource.RLIM_INFINITY:
            soft = ceiling
        elif soft < ceiling:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
                soft = ceiling
            except (ValueError, OSError) as exc:  # e.g. a sandbox that forbids it
                log.warning("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, ceiling, exc)
        hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
        level = logging.WARNING if soft <= 1024 else logging.INFO
        log.log(
            level,
            "open-file limit (RLIMIT_NOFILE): %d%s (hard %s)",
            soft,
            f", raised from {before}" if soft != before else "",
            hard_text,
        )
        _limits = (soft, ceiling)
        return _limits


def connections_that_fit(limit: int, reserve: int) -> int:
    """Connections a server may hold under an open-file ``limit`` while ``reserve``
    descriptors stay free for the rest of its process (0 if none)."""
    return max(0, limit - reserve)


def resolve_max_connections(
    requested: int | None,
    *,
    default: int,
    floor: int,
    reserve: int,
    limit: int,
    what: str,
) -> int:
    """The connection cap of server ``what``.

    ``requested`` None means ``default``, shrunk to what ``limit`` carries after
    ``reserve`` (logged as a warning when it shrinks); ``ValueError`` if that is
    below ``floor``. An explicit ``requested`` must be an int in
    ``[floor, limit - reserve]``: ``TypeError``/``ValueError`` naming the value,
    the limit and the reserve otherwise.
    """
    fit = connections_that_fit(limit, reserve)
    advice = (
        f"RLIMIT_NOFILE is {limit} and {reserve} descriptors stay in reserve for the rest of "
        f"the process, so at most {fit} connections fit: raise the limit (ulimit -n, "
        "systemd LimitNOFILE=) or lower the cap"
    )
    if requested is None:
        if fit >= default:
            return default
        if fit < floor:
            raise ValueError(
                f"{what}: needs at least {floor} connections, but {advice} "
                f"(max_connections must be >= {floor})"
            )
        log.warning(
            "%s: max_connections %d (the limit carries no more than that; the default is %d)",
            what,
            fit,
            default,
        )
        return fit
    if isinstance(requested, bool) or not isinstance(requested, int):
        raise TypeError(f"{what}: max_connections must be an int or None, got {requested!r}")
    if requested < floor:
        raise ValueError(f"{what}: max_connections must be >= {floor}, got {requested}")
    if requested > fit:
        raise ValueError(f"{what}: max_connections={requested} does not fit: {advice}")
    return requested
