"""Every command's ``--help`` ends with an example that parses, ``--version`` answers, and the
exit-code table in ``docs/operations.md`` is the one ``streaming/commands/exit_codes.py``
defines."""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from streaming.commands import exit_codes
from streaming.commands.cli import _parser, main

ROOT = Path(__file__).resolve().parent.parent


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(_parser()))


def test_every_command_is_listed() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"replay", "run", "simulate", "quota set", "enforcement shadow", "lookup"} <= names


@pytest.mark.parametrize(
    ("path", "parser"), COMMANDS, ids=[" ".join(path) or "quotastream" for path, _ in COMMANDS]
)
def test_every_help_ends_with_examples_that_parse(
    path: tuple[str, ...], parser: argparse.ArgumentParser
) -> None:
    text = parser.format_help()
    assert "\nexamples:\n" in text, f"quotastream {' '.join(path)} --help has no example"
    lines = text.split("\nexamples:\n", 1)[1].strip().splitlines()
    assert lines
    for line in lines:
        words = shlex.split(line, comments=True)
        assert words[0] == "quotastream"
        if words[1:] == ["COMMAND", "--help"]:
            continue
        assert words[1 : 1 + len(path)] == list(path), line
        _parser().parse_args(words[1:])  # exits 2 (SystemExit) on an example that does not parse


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"quotastream {version('quotastream')}"


def test_the_documented_exit_codes_are_the_defined_ones() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\d)` \| `(EXIT_\w+)` \|", section, flags=re.MULTILINE)
    defined = {name: value for name, value in vars(exit_codes).items() if name.startswith("EXIT_")}
    assert {name: int(code) for code, name in rows} == defined
    assert len(rows) == len(defined)
