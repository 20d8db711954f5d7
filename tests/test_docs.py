"""The README documents every CLI command, and every command it shows exists (sqlite-utils' habit)."""

from __future__ import annotations

import re

import typer

from conftest import ROOT
from linker.cli.main import app, main

README = (ROOT / "README.md").read_text(encoding="utf-8")


def command_paths() -> list[str]:
    def walk(command, prefix: str) -> list[str]:
        if hasattr(command, "commands"):  # a group (typer vendors its own click classes)
            return [p for name, sub in sorted(command.commands.items()) for p in walk(sub, f"{prefix} {name}".strip())]
        return [prefix]

    return walk(typer.main.get_command(app), "")


def test_every_command_is_in_the_readme():
    missing = [path for path in command_paths() if f"`linker {path}" not in README]
    assert missing == []


def test_every_command_in_the_readme_exists(capsys):
    known = set(command_paths())
    groups = {path.split()[0] for path in known if " " in path}
    shown = set()
    for first, second in re.findall(r"`linker ([a-z]+)(?: ([a-z]+))?", README):
        shown.add(f"{first} {second}" if first in groups and second else first)
    assert shown - known - groups == set()
    for path in sorted(shown):
        try:
            main([*path.split(), "--help"])
        except SystemExit as exc:
            assert exc.code in (0, None), path
        assert "Usage" in capsys.readouterr().out, path


def test_readme_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    for target in re.findall(r"^make (\w+)", README, flags=re.M):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target
