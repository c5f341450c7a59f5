"""The opt-in torchft-pg-compat distribution: ``import torchft`` is torchft_pg.

Each check runs in a fresh interpreter, as a framework importing torchft would.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(code: str, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter of this venv (`extra_path` first on sys.path)."""
    prefix = f"import sys; sys.path.insert(0, {str(extra_path)!r})\n" if extra_path else ""
    return subprocess.run(
        [sys.executable, "-c", prefix + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_torchfts_names_and_modules_are_torchft_pgs_own_objects() -> None:
    out = run(
        """
        import json, importlib
        from unittest import mock
        import torchft
        from torchft import (
            DistributedDataParallel, DistributedSampler, Manager, Optimizer,
            ProcessGroupGloo, ProcessGroupNCCL,
        )
        import torchft_pg, torchft_pg.manager, torchft_pg.data, torchft_pg.optim
        same = {
            "Manager": Manager is torchft_pg.Manager,
            "Optimizer": Optimizer is torchft_pg.optim.OptimizerWrapper,
            "DistributedSampler": DistributedSampler is torchft_pg.data.DistributedSampler,
            "ProcessGroupGloo": ProcessGroupGloo is torchft_pg.ProcessGroupGloo,
            "DistributedDataParallel": DistributedDataParallel is torchft_pg.DistributedDataParallel,
        }
        for name in ["manager", "process_group", "ddp", "optim", "data", "futures",
                     "local_sgd", "coordination", "checkpointing",
                     "checkpointing.http_transport", "checkpointing.pg_transport", "work"]:
            same[name] = importlib.import_module("torchft." + name) is importlib.import_module(
                "torchft_pg." + name)
        # after a bare `import torchft`, as torchtitan uses it
        same["attr"] = torchft.process_group.ManagedProcessGroup is (
            torchft_pg.process_group.ManagedProcessGroup)
        from torchft.local_sgd import DiLoCo, LocalSGD
        from torchft.coordination import LighthouseServer
        same["DiLoCo"] = DiLoCo is torchft_pg.local_sgd.DiLoCo
        with mock.patch("torchft.manager.Manager") as patched:
            same["patch"] = torchft_pg.manager.Manager is patched
        same["unpatched"] = torchft_pg.manager.Manager is Manager
        print(json.dumps(same))
        """
    )
    assert out.returncode == 0, out.stderr
    same = json.loads(out.stdout.splitlines()[-1])
    assert same == {k: True for k in same}, {k for k, v in same.items() if not v}


def test_a_torchft_module_torchft_pg_lacks_fails_naming_it() -> None:
    out = run("import torchft.otel")
    assert out.returncode == 1
    assert "ModuleNotFoundError: torchft.otel is torchft's, and torchft_pg has no counterpart" in (
        out.stderr
    )
    assert "docs/torchft.md" in out.stderr


def test_beside_a_real_torchft_the_import_refuses_and_says_what_to_do(tmp_path: Path) -> None:
    # A real torchft's installed metadata, as pip leaves it.
    meta = tmp_path / "torchft_nightly-2026.10.26.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchft-nightly\nVersion: 2026.10.26\n"
    )
    out = run("import torchft", extra_path=tmp_path)
    assert out.returncode == 1
    assert "both torchft-nightly 2026.10.26 and torchft-pg-compat are installed" in out.stderr
    assert "pip uninstall torchft-pg-compat" in out.stderr


def test_without_the_compat_distribution_nothing_of_ours_claims_torchft() -> None:
    out = run(
        """
        import importlib.metadata, sys
        import torchft_pg, torchft_pg.manager, torchft_pg.local_sgd, lighthouse, lighthouse.coordinator.cli
        print("torchft" in sys.modules, sorted(
            e.name for e in importlib.metadata.distribution("torchft_pg").entry_points))
        print(sorted(importlib.metadata.distribution("torchft_pg").read_text("top_level.txt").split()))
        """
    )
    assert out.returncode == 0, out.stderr
    loaded, scripts = out.stdout.splitlines()[-2].split(" ", 1)
    assert loaded == "False"
    assert "torchft" not in scripts.replace("torchft-pg", "")
    assert "torchft" not in out.stdout.splitlines()[-1].replace("torchft_pg", "")


@pytest.mark.parametrize("flag", ["--min_replicas", "--min-replicas"])
def test_torchft_lighthouse_is_installed_and_takes_both_spellings(flag: str) -> None:
    command = Path(sys.executable).parent / "torchft_lighthouse"
    out = subprocess.run([str(command), flag, "x"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "invalid int value: 'x'" in out.stderr


def test_ray_trains_lighthouse_actor_pattern() -> None:
    # Ray Train's TorchftConfig starts the lighthouse this way and hands its
    # address() to the workers as TORCHFT_LIGHTHOUSE. It listens on every
    # interface, so it needs the job secret in its environment (closed unless opened).
    out = run(
        """
        import os
        for var in ("TORCHFT_JOB_SECRET", "TORCHFT_JOB_SECRET_FILE", "TORCHFT_INSECURE"):
            os.environ.pop(var, None)
        from torchft.coordination import LighthouseServer
        try:
            LighthouseServer(**({"bind": "[::]:0"} | {"min_replicas": 1}))
        except ValueError as exc:
            print("refused:", "TORCHFT_JOB_SECRET" in str(exc))
        os.environ["TORCHFT_JOB_SECRET"] = "a-secret-for-this-job"
        lighthouse = LighthouseServer(**({"bind": "[::]:0"} | {"min_replicas": 1}))
        print(lighthouse.address())
        lighthouse.shutdown()
        """
    )
    assert out.returncode == 0, out.stderr
    refused, address = out.stdout.strip().splitlines()[-2:]
    assert refused == "refused: True"
    assert address.startswith("http://")
