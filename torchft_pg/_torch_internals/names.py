"""The record of one private torch name this package relies on, and how it is found.

Each module of the package lists the private names it reads in a `RELIED_ON`
tuple of `PrivateName`; the package gathers them in ``PRIVATE_NAMES``, and
`resolve` finds each by its dotted path, so one test can check them all
against the installed torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["PrivateName", "resolve"]


@dataclass(frozen=True, kw_only=True)
class PrivateName:
    """A private torch name: `name` on the object at the dotted path `owner` (a
    module, then attributes), and what this package uses it for (`use`).

    A name that torch itself calls on our objects (a method our groups or
    works override) is one too: if torch renames it, our override is dead.
    """

    owner: str
    name: str
    use: str

    @property
    def path(self) -> str:
        """The name's full dotted path, e.g. ``torch.distributed.distributed_c10d._pg_map``."""
        return f"{self.owner}.{self.name}"


def resolve(dotted: str) -> object:
    """The object at `dotted`: the longest importable module prefix, then attributes.

    Raises LookupError naming the first part that is missing.
    """
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        module_name = ".".join(parts[:end])
        try:
            found: object = importlib.import_module(module_name)
        except ImportError:
            continue
        for i in range(end, len(parts)):
            if not hasattr(found, parts[i]):
                raise LookupError(f"{'.'.join(parts[:i])} has no attribute {parts[i]!r}")
            found = getattr(found, parts[i])
        return found
    raise LookupError(f"no module of {dotted!r} can be imported")
