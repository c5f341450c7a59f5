"""The README and the docs only name files that exist, link pages that exist, and
call make targets that exist (docs go stale quietly; this test does not)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "lighthouse" / "README.md",
        *list((ROOT / "docs").glob("*.md")),
    ]
)
# A repository path in backticks: a top-level folder of ours, then a file or folder name.
PATH = re.compile(
    r"`((?:torchft_pg|lighthouse|tests|examples|bench|docs|proto|compat)/[\w./-]*[\w/])`"
)
LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")
MAKE = re.compile(r"\bmake ((?:[a-z][\w-]*)(?: [a-z][\w-]*)*)")


def rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_named_path_exists(page: Path) -> None:
    text = page.read_text()
    missing = [p for p in PATH.findall(text) if not (ROOT / p.rstrip("/")).exists()]
    assert not missing, f"{rel(page)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_linked_page_exists(page: Path) -> None:
    links = [link for link in LINK.findall(page.read_text()) if "://" not in link]
    missing = [link for link in links if not (page.parent / link).exists()]
    assert not missing, f"{rel(page)} links pages that do not exist: {missing}"


def test_every_make_target_named_exists() -> None:
    targets = set(
        re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE)
    )
    named = {
        word
        for page in PAGES
        for group in MAKE.findall(page.read_text())
        for word in group.split()
        if word in targets
        or "-" in word
        or word in ("install", "test", "lint", "docs", "bench", "demo")
    }
    assert named, "no make target named anywhere"
    assert named <= targets, f"make targets named but missing: {sorted(named - targets)}"


def test_every_page_is_in_the_sites_table_of_contents() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")} - {"index"}
    listed = set(re.findall(r"^([\w-]+)$", index, flags=re.MULTILINE))
    assert pages <= listed, f"docs pages no reader can reach: {sorted(pages - listed)}"


def test_the_readme_is_a_page_read_in_five_minutes() -> None:
    assert len((ROOT / "README.md").read_bytes()) <= 12 * 1024


def test_the_make_targets_the_readme_gives_run_dry() -> None:
    for target in ("install", "test", "lint", "docs", "demo"):
        out = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert out.returncode == 0, (target, out.stderr)
