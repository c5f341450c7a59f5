"""The README's "Running it" commands, run as written: the lighthouse and two replica
groups of two ranks, each a ``.venv/bin/torchrun`` of examples/train_ddp.py.

The commands are read from the README (tests/unit/test_readme_commands.py checks
that they are train_ddp.py's docstring's and start with ``.venv/bin/``). Three
things change, none of them the commands' words: their ports are free ones, the
lighthouse's status page gets a free port too (the README leaves it at its
default, 29511, which another test may hold), they run in a fresh folder
holding links to ``.venv`` and ``examples``, and ``$XDG_STATE_HOME`` is the
test's, so the lighthouse's state file is the test's own. STEPS and
STEP_TIME_S keep the run short.

Both groups must finish; every rank prints ``step N committed`` lines, draws
its own batches (the two ranks of a group, holding one model, report different
losses for the same step) and ends with the same parameters as every other.
Then the groups' commands run again, as a user does the second time, with the
same lighthouse: the first run ended cleanly, so the second trains from step 0
too. Every process is stopped by its own session's id, also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shlex
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.unit.test_readme_commands import README, bash_blocks, logical_lines, sections

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6
RUN_TIMEOUT_S = 240.0  # 4 ranks and 2 torchrun agents start torch: ~30 s on a loaded 2-core machine
STOP_GRACE_S = 10.0
README_PORTS = ("29510", "29600", "29601")  # the lighthouse's, each group's store
STEP_LINE = re.compile(
    r"^replica (\d) rank (\d) step (\d+) (committed|discarded \(.*\)) quorum \S+ "
    r"participants \d loss ([\d.]+)$"
)
DONE_LINE = re.compile(r"^replica (\d) rank (\d) done at step (\d+) crc32 ([0-9a-f]{8})$")


def free_ports(count: int) -> list[str]:
    """``count`` ports nobody listens on, below the kernel's ephemeral range, so a
    port-0 bind elsewhere cannot take one before the commands bind it."""
    rng, found = random.Random(), list[str]()
    for _ in range(500):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        if str(port) not in found:
            found.append(str(port))
        if len(found) == count:
            return found
    raise RuntimeError(f"not {count} free ports in [20000, 32000) after 500 tries")


def readme_commands(ports: dict[str, str]) -> list[tuple[dict[str, str], list[str]]]:
    """The one-machine commands of "Running it": (their variables, their argv), with
    the README's ports replaced by ``ports``."""
    (block, *_) = bash_blocks(sections(README.read_text())["Running it"])
    commands = []
    for line in logical_lines(block):
        for readme_port, port in ports.items():
            line = re.sub(rf"\b{readme_port}\b", port, line)
        words = shlex.split(line, comments=True)
        env = {}
        while "=" in words[0] and not words[0].startswith((".", "/")):
            name, _, value = words.pop(0).partition("=")
            env[name] = value
        commands.append((env, words))
    return commands


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's session, then SIGKILL to whatever of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=STOP_GRACE_S)


def check_run(logs: list[Path]) -> None:
    """Both groups' logs: every rank committed steps, drew its own batches and
    ended at step STEPS with the same parameters as every other rank."""
    steps: dict[tuple[int, int], dict[int, float]] = {}  # (group, rank) -> step -> loss
    crcs: dict[tuple[int, int], str] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            if m := STEP_LINE.match(line):
                if m[4] == "committed":
                    steps.setdefault((int(m[1]), int(m[2])), {})[int(m[3])] = float(m[5])
            elif m := DONE_LINE.match(line):
                assert int(m[3]) == STEPS, line
                crcs[(int(m[1]), int(m[2]))] = m[4]
            else:
                assert not re.match(r"^replica \d rank \d (step|done)", line), f"malformed: {line}"
    everyone = {(g, r) for g in (0, 1) for r in (0, 1)}
    assert set(crcs) == everyone and set(steps) == everyone, (crcs, steps)
    assert len(set(crcs.values())) == 1, f"the ranks ended with different parameters: {crcs}"
    for group in (0, 1):
        both = sorted(steps[(group, 0)].keys() & steps[(group, 1)].keys())
        assert both, f"group {group}'s ranks committed no step together: {steps}"
        for step in both:  # one model, two ranks' own batches: two losses
            assert steps[(group, 0)][step] != steps[(group, 1)][step], (group, step, steps)


def test_the_readme_commands_train_two_replica_groups_and_run_again(tmp_path: Path) -> None:
    if not (ROOT / ".venv" / "bin" / "torchrun").exists():
        pytest.skip("no .venv/bin/torchrun: run `make install` first")
    for name in (".venv", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    lh_port, store0, store1, http_port = free_ports(4)
    (lighthouse, *groups) = readme_commands(
        dict(zip(README_PORTS, (lh_port, store0, store1), strict=True))
    )
    assert lighthouse[1][0] == ".venv/bin/torchft-pg-lighthouse", lighthouse
    lighthouse[1].extend(["--http-bind", f"127.0.0.1:{http_port}"])
    # The README's --min-replicas 1 lets the first group train alone, as a user wants;
    # here a group's whole run (STEPS short steps) is shorter than the other's start-up,
    # so one could finish before the other exists. Both groups in every quorum keeps the
    # check (same parameters everywhere) about the commands, not about start-up order.
    at = lighthouse[1].index("--min-replicas")
    assert lighthouse[1][at + 1] == "1", lighthouse
    lighthouse[1][at + 1] = "2"
    base = {k: v for k, v in os.environ.items() if not k.startswith("TORCHFT_")}
    base |= {"STEPS": str(STEPS), "STEP_TIME_S": "0.05", "PYTHONUNBUFFERED": "1"}
    base["XDG_STATE_HOME"] = str(tmp_path / "state")
    procs: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str], argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                cwd=tmp_path,
                env={**base, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        procs.append(proc)
        return proc

    lighthouse_log = tmp_path / "lighthouse.log"
    try:
        start(*lighthouse, lighthouse_log)
        for run in (1, 2):
            logs = [tmp_path / f"group{g}-run{run}.log" for g in (0, 1)]
            running = [start(*command, log) for command, log in zip(groups, logs, strict=True)]
            for proc, log in zip(running, logs, strict=True):
                try:
                    code = proc.wait(timeout=RUN_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(
                        f"{log.name}: not done in {RUN_TIMEOUT_S:g} s\n{log.read_text()[-3000:]}"
                        f"\nlighthouse:\n{lighthouse_log.read_text()[-3000:]}"
                    )
                assert code == 0, f"{log.name} exited {code}:\n{log.read_text()[-3000:]}"
            check_run(logs)
    finally:
        for proc in procs:
            stop(proc)
    said = lighthouse_log.read_text()
    state_file = tmp_path / "state" / "torchft-pg" / f"lighthouse-{lh_port}.state.json"
    assert f"kept in {state_file}" in said, said[-3000:]
    # (the last step's commit is each group's own word as it leaves: not counted)
    assert len(re.findall(r"lighthouse: run ended cleanly at committed step [1-9]", said)) == 2, (
        said[-3000:]
    )
    assert "new run from step 0" in said, said[-3000:]
    assert not list(tmp_path.glob("*.state.json")), "nothing written in the working directory"
