"""What ``make install`` and ``make test`` run, read from ``make -n`` (nothing is run).

- ``make install`` never lets pip pick a torch: the torch step asks for
  ``torch==$(TORCH_VERSION)``, from ``TORCH_INDEX_URL`` when given (the CPU
  index), and every later ``pip install`` either pins that same torch or
  installs without dependencies; then it checks which torch ``.venv`` holds.
- Neither is silent for long: a line says what each install step and each
  pytest run does before it starts, and pytest reports a line per test file
  (not ``-q``'s dots) and its slowest tests.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def dry_run(*args: str) -> list[str]:
    """The commands ``make -n args`` would run, one per line."""
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def torch_version() -> str:
    (version,) = re.findall(r"^TORCH_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    return version


def pip_installs(lines: list[str]) -> list[list[str]]:
    return [shlex.split(line) for line in lines if re.search(r"-m pip install\b", line)]


def test_make_install_pins_torch_in_every_pip_install() -> None:
    pinned = f"torch=={torch_version()}"
    installs = pip_installs(dry_run("install"))
    assert len(installs) == 2, installs
    torch_step, project_step = installs
    assert pinned in torch_step and "--index-url" not in torch_step, torch_step
    # the project with its dependencies, and torch held where the first step put it
    assert "-e" in project_step and pinned in project_step, project_step


def test_make_install_takes_torch_from_the_cpu_index_when_asked() -> None:
    installs = pip_installs(dry_run("install", f"TORCH_INDEX_URL={CPU_INDEX}"))
    torch_step = installs[0]
    assert f"torch=={torch_version()}" in torch_step
    assert torch_step[torch_step.index("--index-url") + 1] == CPU_INDEX
    assert "--index-url" not in installs[1]  # only torch comes from there


def test_test_extras_never_bring_their_dependencies() -> None:
    for step in pip_installs(dry_run("install-test-extras")):
        assert "--no-deps" in step, step


def test_make_install_checks_the_torch_it_leaves() -> None:
    lines = dry_run("install")
    last_pip = max(i for i, line in enumerate(lines) if "-m pip install" in line)
    assert any(
        "torch.__version__" in line and torch_version() in line for line in lines[last_pip:]
    ), lines


def test_a_line_announces_each_install_step_and_each_test_run() -> None:
    for target, step in (("install", "-m pip install"), ("test", "-m pytest")):
        lines = dry_run(target)
        steps = [i for i, line in enumerate(lines) if step in line]
        assert steps, (target, lines)
        for i in steps:
            assert lines[i - 1].startswith("echo "), (
                f"make {target}: nothing said before {lines[i]}"
            )


def test_make_test_reports_progress_per_file_and_the_slowest_tests() -> None:
    runs = [shlex.split(line) for line in dry_run("test") if "-m pytest" in line]
    assert runs
    for run in runs:
        assert "-q" not in run and "--quiet" not in run, run
        assert any(arg.startswith("--durations=") for arg in run), run
