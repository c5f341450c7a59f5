"""``python -m lighthouse``: run a lighthouse (see ``lighthouse.coordinator.cli``)."""

from __future__ import annotations

import sys

from lighthouse.coordinator.cli import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
