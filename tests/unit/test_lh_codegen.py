"""The committed stubs equal a fresh `make proto`; the package never imports torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lighthouse._codegen import generate

GEN = Path(__file__).resolve().parents[2] / "lighthouse" / "_gen"


def test_committed_stubs_match_regenerated(tmp_path: Path) -> None:
    fresh = generate(tmp_path / "_gen")
    names = sorted(p.name for p in fresh)
    assert names == sorted(p.name for p in GEN.iterdir() if p.suffix in (".py", ".pyi"))
    for p in fresh:
        assert p.read_bytes() == (GEN / p.name).read_bytes(), f"{p.name} is stale: run `make proto`"


def test_lighthouse_imports_without_torch() -> None:
    code = (
        "import sys, lighthouse, lighthouse.coordinator.server, lighthouse.replica.server,"
        " lighthouse.replica.local, lighthouse.testing, lighthouse.__main__;"
        "assert 'torch' not in sys.modules, 'lighthouse imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
