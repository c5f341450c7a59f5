"""The README's commands work as written in a fresh clone after ``make install``.

A new user copies the README's commands into a shell that has no virtual
environment activated; a bare ``torchft-pg-lighthouse`` then fails with
``command not found``. So:

- every command of the quickstart (the section "Two commands" and the
  one-machine block that opens "Running it") starts with ``make`` and targets
  the Makefile defines, or with a program
  under ``.venv/bin/`` that ``make install`` put there, and the repository
  files it names exist;
- no command anywhere in the README calls a program of ``.venv/bin`` by its
  bare name;
- the one-machine commands of "Running it" are examples/train_ddp.py's
  docstring's, line for line.

tests/integration/test_readme_quickstart.py runs those commands.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
VENV_BIN = ROOT / ".venv" / "bin"
QUICKSTART = (
    "Two commands",
    "Running it",
)  # every bash block of the first, the first of the second
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SEPARATORS = {"&&", "||", ";", "&", "|", "(", ")"}


@dataclass(frozen=True, kw_only=True)
class Command:
    """One simple command of a README code block: its program and arguments,
    without the variable assignments in front."""

    section: str
    line: str  # the logical line it came from (continuations joined)
    program: str
    args: tuple[str, ...]


def sections(text: str) -> dict[str, str]:
    """The README's ``## `` sections (``### `` subsections stay in theirs), by title."""
    found: dict[str, str] = {}
    title = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            title = line[3:].strip()
            found[title] = ""
        elif title:
            found[title] += line
    return found


def bash_blocks(section: str) -> list[str]:
    """The bodies of the section's fenced ``bash`` blocks."""
    return re.findall(r"^```bash\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)


def logical_lines(block: str) -> list[str]:
    """The block's lines with backslash continuations joined, blank lines dropped."""
    return [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def commands(title: str, block: str) -> list[Command]:
    """Every simple command in ``block``: split at ``&&``, ``;``, ``&``, ``|`` and
    parentheses, comments dropped, leading ``VAR=value`` assignments skipped."""
    found = []
    for line in logical_lines(block):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token not in _SEPARATORS:
                words.append(token)
                continue
            while words and _ASSIGNMENT.match(words[0]):
                words.pop(0)
            if words:
                found.append(
                    Command(section=title, line=line, program=words[0], args=tuple(words[1:]))
                )
            words = []
    return found


def readme_commands() -> list[Command]:
    """Every command of every bash block of the README."""
    return [
        command
        for title, body in sections(README.read_text()).items()
        for block in bash_blocks(body)
        for command in commands(title, block)
    ]


def quickstart_commands() -> list[Command]:
    """The commands a new user runs first: "Two commands", then "Running it" on one machine."""
    found = sections(README.read_text())
    blocks = [*bash_blocks(found[QUICKSTART[0]]), bash_blocks(found[QUICKSTART[1]])[0]]
    titles = [QUICKSTART[0]] * (len(blocks) - 1) + [QUICKSTART[1]]
    return [c for title, block in zip(titles, blocks, strict=True) for c in commands(title, block)]


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))


def test_the_parser_sees_what_a_shell_runs() -> None:
    block = (
        "make install && make demo   # a comment && not a command\n"
        'umask 077; echo "$(openssl rand -hex 24)" > f\n'
        "A=1 B=2 .venv/bin/torchrun --nproc_per_node=2 \\\n  examples/train_ddp.py &\n"
    )
    assert [(c.program, c.args) for c in commands("t", block)] == [
        ("make", ("install",)),
        ("make", ("demo",)),
        ("umask", ("077",)),
        ("echo", ("$(openssl rand -hex 24)", ">", "f")),
        (".venv/bin/torchrun", ("--nproc_per_node=2", "examples/train_ddp.py")),
    ]


def test_the_quickstart_has_commands_in_each_of_its_sections() -> None:
    found = {c.section for c in quickstart_commands()}
    assert found == set(QUICKSTART), f"no bash block under {set(QUICKSTART) - found}"


def test_every_quickstart_command_exists_after_make_install() -> None:
    if not (VENV_BIN / "python").exists():
        pytest.skip(f"{VENV_BIN} is missing: run `make install` first")
    targets = make_targets()
    for c in quickstart_commands():
        where = f"README ({c.section}): {c.line}"
        if c.program == "make":
            named = [a for a in c.args if not _ASSIGNMENT.match(a)]
            assert named and set(named) <= targets, f"{where}: no such make target"
        else:
            assert c.program.startswith(".venv/bin/"), (
                f"{where}: {c.program!r} is found only in an activated venv; "
                f"write .venv/bin/{c.program} or a make target"
            )
            assert (ROOT / c.program).exists(), f"{where}: make install makes no {c.program}"
        for arg in c.args:
            if re.fullmatch(r"(examples|bench|tests)/[\w/.-]+\.py", arg):
                assert (ROOT / arg).is_file(), f"{where}: no file {arg}"


def test_no_readme_command_calls_a_venv_program_by_its_bare_name() -> None:
    if not (VENV_BIN / "python").exists():
        pytest.skip(f"{VENV_BIN} is missing: run `make install` first")
    venv_programs = {p.name for p in VENV_BIN.iterdir()} - {"activate"}
    bare = [f"{c.section}: {c.line}" for c in readme_commands() if c.program in venv_programs]
    assert not bare, "write these as .venv/bin/<program>:\n" + "\n".join(bare)


def test_running_it_shows_train_ddp_docstring_commands() -> None:
    (block, *_) = bash_blocks(sections(README.read_text())["Running it"])
    docstring = (ROOT / "examples" / "train_ddp.py").read_text().split('"""')[1]
    in_docstring = [line.strip() for line in docstring.splitlines() if line.startswith("    ")]
    assert logical_lines(block) == in_docstring
