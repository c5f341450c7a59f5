"""The private parts of torch that `torchft_pg._torch_internals` reads still answer, on
a torch release it was checked on, and its one change to torch's state is made on
first use, not at import.

A torch upgrade fails `test_torch_is_a_checked_release_and_every_private_name_resolves`
with one message: the new version, the checked ones, and each private name that is
gone with what it was used for. When it passes on a new release (and the process
group tests do), add that release to ``CHECKED_TORCH_VERSIONS`` in
``torchft_pg/_torch_internals/__init__.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.torch_private_reads import names_defined_in, private_reads, torch_private_names
from torchft_pg._torch_internals import (
    CHECKED_TORCH_VERSIONS,
    PRIVATE_NAMES,
    PrivateName,
    c10d_groups,
    checked_versions_note,
    default_group_timeout,
    torch_release,
    unchecked_torch,
)
from torchft_pg._torch_internals.names import resolve

ROOT = Path(__file__).resolve().parents[2]
INTERNALS = ROOT / "torchft_pg" / "_torch_internals"
SUBPROCESS_TIMEOUT_S = 180  # a cold `import torch` and every torchft_pg module


def internals_report(version: str, names: Sequence[PrivateName]) -> str | None:
    """None when `version` is a checked release and every one of `names` resolves;
    else what is wrong, in one message that names the versions and each missing name."""
    missing = []
    for name in names:
        try:
            resolve(name.path)
        except LookupError as exc:
            missing.append(f"  {name.path} ({exc}), used for: {name.use}")
    if unchecked_torch(version) is None and not missing:
        return None
    lines = [f"{checked_versions_note(version)}."]
    if missing:
        lines.append(f"{len(missing)} of the {len(names)} private torch names it reads are gone:")
        lines += missing
    else:
        lines.append(f"All {len(names)} private torch names it reads resolve on this torch.")
    if missing:
        lines.append("Fix each use named above in torchft_pg/_torch_internals/.")
    lines.append(
        "Run the process-group tests on this torch, then add its release to "
        "CHECKED_TORCH_VERSIONS in torchft_pg/_torch_internals/__init__.py."
    )
    return "\n".join(lines)


def test_torch_is_a_checked_release_and_every_private_name_resolves() -> None:
    report = internals_report(torch.__version__, PRIVATE_NAMES)
    if report is not None:
        pytest.fail(report, pytrace=False)


def test_the_report_names_the_versions_and_each_missing_name() -> None:
    gone = PrivateName(owner="torch.distributed", name="_no_such_table", use="a made-up table")
    report = internals_report("9.9.9+cpu", [PRIVATE_NAMES[0], gone])
    assert report is not None
    assert "this is torch 9.9.9+cpu" in report
    assert all(version in report for version in CHECKED_TORCH_VERSIONS)
    assert "1 of the 2 private torch names" in report
    assert "torch.distributed._no_such_table" in report and "a made-up table" in report
    assert PRIVATE_NAMES[0].path not in report
    only_version = internals_report("9.9.9", [PRIVATE_NAMES[0]])
    assert only_version is not None and "All 1 private torch names" in only_version
    assert internals_report(f"{CHECKED_TORCH_VERSIONS[0]}+cu128", [PRIVATE_NAMES[0]]) is None


def test_a_release_is_read_without_its_build_tag() -> None:
    assert torch_release("2.13.0+cpu") == "2.13.0"
    assert torch_release("2.13.0") == "2.13.0"
    assert unchecked_torch(f"{CHECKED_TORCH_VERSIONS[0]}+cpu") is None
    assert unchecked_torch("2.0.0") == checked_versions_note("2.0.0")


def test_the_table_lists_every_private_name_the_package_reads_and_no_other() -> None:
    defined = names_defined_in(sorted((ROOT / "torchft_pg").rglob("*.py")))
    private = torch_private_names()
    reads = {
        read.name: f"{path.name} {read}"
        for path in sorted(INTERNALS.glob("*.py"))
        for read in private_reads(path.read_text(), private, defined)
    }
    listed = {name.name for name in PRIVATE_NAMES}
    assert {n: where for n, where in reads.items() if n not in listed} == {}, (
        "read by torchft_pg._torch_internals but not in its PRIVATE_NAMES"
    )
    assert sorted(listed - set(reads)) == [], "in PRIVATE_NAMES but read nowhere"


def test_each_name_is_listed_once_and_says_what_it_is_for() -> None:
    paths = [name.path for name in PRIVATE_NAMES]
    assert len(paths) == len(set(paths))
    assert all(name.name.startswith("_") or "._" in name.owner for name in PRIVATE_NAMES)
    assert all(name.use.strip() for name in PRIVATE_NAMES)


# Run in a fresh interpreter: importing every torchft_pg module (but the chaos
# harness, which trains a model at import) must leave c10d's module globals and
# backend registry as they were; the first groups, built on several threads at
# once, then replace exactly the group tables, once.
_FIRST_USE = r"""
import json, sys, threading
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

def state():
    return {
        "c10d": {k: [type(v).__qualname__, id(v)] for k, v in vars(c10d).items()
                 if not k.startswith("__")},
        "plugins": sorted(dist.Backend._plugins),
        "backends": list(dist.Backend.backend_list),
    }

before = state()
for module in sys.argv[1:]:
    __import__(module)
imported = state()

from torchft_pg import _torch_internals
from torchft_pg.process_group import ProcessGroupDummy, ProcessGroupGloo

answering_before = _torch_internals.tables_answer_for_ours()
start = threading.Barrier(8)
groups = []

def build():
    start.wait()
    groups.append(ProcessGroupGloo() if len(groups) % 2 else ProcessGroupDummy(0, 1))

threads = [threading.Thread(target=build) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
used = state()
again = ProcessGroupDummy(0, 1)
try:
    _torch_internals.answer_for(int)
    other_class = "accepted"
except RuntimeError as exc:
    other_class = str(exc)
print(json.dumps({
    "changed_by_import": sorted(
        k for k in set(before["c10d"]) | set(imported["c10d"])
        if before["c10d"].get(k) != imported["c10d"].get(k)
    ),
    "registry_changed_by_import": [before["plugins"], before["backends"]]
        != [imported["plugins"], imported["backends"]],
    "answering_before": answering_before,
    "changed_by_use": sorted(
        k for k in set(used["c10d"]) | set(imported["c10d"])
        if used["c10d"].get(k) != imported["c10d"].get(k)
    ),
    "table_types": sorted({used["c10d"][k][0] for k in ("_pg_map", "_pg_names",
        "_pg_group_ranks", "_pg_backend_config", "_pg_to_tag")}),
    "groups": len(groups),
    "known": all(g in c10d._pg_map and c10d._pg_names[g].startswith("torchft_pg-unregistered-")
        for g in [*groups, again]),
    "ranks": c10d._pg_group_ranks[again],
    "other_class": other_class,
}))
"""


def _torchft_pg_modules() -> list[str]:
    names = []
    for path in sorted((ROOT / "torchft_pg").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[:2] != ["torchft_pg", "chaos"]:
            names.append(".".join(parts))
    return names


def test_importing_changes_nothing_in_torch_and_the_first_group_answers_c10d() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    modules = _torchft_pg_modules()
    assert "torchft_pg.process_group.base" in modules and "torchft_pg.manager" in modules
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_USE, "torchft_pg", "torchft_pg.process_group", *modules],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["changed_by_import"] == []
    assert got["registry_changed_by_import"] is False
    assert got["answering_before"] is False
    assert got["changed_by_use"] == sorted(
        ["_pg_map", "_pg_names", "_pg_group_ranks", "_pg_backend_config", "_pg_to_tag"]
    )
    assert got["table_types"] == ["LiveGroupTable"]
    assert got["groups"] == 8 and got["known"] is True
    assert got["ranks"] == {"0": 0}
    assert "already answer for ProcessGroup" in got["other_class"]


@pytest.fixture
def world() -> Iterator[None]:
    if dist.is_initialized():
        pytest.fail("a default process group is already initialized in this test process")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=30))
    dist.init_process_group(
        "gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=77)
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_without_a_default_group_there_is_no_timeout_and_no_group() -> None:
    assert default_group_timeout() is None
    assert c10d_groups() == []


def test_the_default_groups_timeout_and_every_group_are_read(world: None) -> None:
    assert default_group_timeout() == timedelta(seconds=77)
    sub = dist.new_group([0])
    groups = c10d_groups()
    assert groups[0] is dist.group.WORLD and sub in groups
