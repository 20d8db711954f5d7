"""The README documents every CLI command, and every command it shows exists (sqlite-utils' habit)."""

from __future__ import annotations

import os
import re

import pytest
import typer

from conftest import ROOT, SHARED_DATA
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
    for target in re.findall(r"`make ([\w-]+)", README) + re.findall(r"^make ([\w-]+)", README, flags=re.M):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target


# --- the README's shell and Python blocks, run as written --------------------------------------------

BLOCK = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
RUNNABLE = ("sh", "python")
SCORE = re.compile(r"\d+\.\d{3,}")  # scores may differ in the last digits between CPUs; ids and names may not


def readme_blocks() -> list[tuple[str, str, str | None]]:
    """(language, code, expected output) for every sh/python block; the output is the ```text block that
    follows it before the next runnable block, if any."""
    blocks = BLOCK.findall(README)
    out = []
    for i, (lang, code) in enumerate(blocks):
        if lang not in RUNNABLE:
            continue
        expected = None
        for later_lang, later_code in blocks[i + 1:]:
            if later_lang in RUNNABLE:
                break
            if later_lang == "text":
                expected = later_code
                break
        out.append((lang, code, expected))
    return out


def test_readme_blocks_are_tagged():
    untagged = [code.splitlines()[0] for lang, code in BLOCK.findall(README) if not lang]
    assert untagged == []  # sh and python run in test_readme_block; text is output
    assert readme_blocks()[0][1].startswith("make demo")  # the set-up block comes first


def _makefile_demo_commands() -> list[str]:
    """The Makefile's recipes that `make demo` runs after the install, with make's variables expanded."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    commands = []
    for target in ("indexes/default.parquet", "indexes/default", "demo"):
        match = re.search(rf"^{re.escape(target)}:(.*)\n\t(.+)$", makefile, flags=re.M)
        assert match, target
        prerequisite = match.group(1).split("|")[0].split()
        command = match.group(2).replace("$(LINKER)", "linker").replace("$@", target)
        commands.append(command.replace("$<", prerequisite[0]) if prerequisite else command)
    return commands


def _matches(expected: str, actual: str) -> bool:
    """Every line of `expected` appears in `actual`, in order; `...` stands for anything."""
    actual = SCORE.sub("0.0", actual)
    position = 0
    for line in expected.strip().splitlines():
        for fragment in SCORE.sub("0.0", line).split("..."):
            found = actual.find(fragment.strip(), position)
            if found < 0:
                return False
            position = found + len(fragment.strip())
    return True


@pytest.fixture(scope="module")
def readme_workdir(tmp_path_factory):
    """A scratch repository root: `linker` on PATH (this checkout's code), examples/, ../shared/data."""
    import os
    import sys

    work = tmp_path_factory.mktemp("readme") / "repo"
    (work / "bin").mkdir(parents=True)
    (work / "examples").symlink_to(ROOT / "examples")
    if SHARED_DATA.is_dir():
        (work.parent / "shared").mkdir()
        (work.parent / "shared" / "data").symlink_to(SHARED_DATA)
    wrapper = work / "bin" / "linker"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m linker "$@"\n')
    wrapper.chmod(0o755)
    env = {**os.environ, "PATH": f"{work / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return work, env


def _run(code: str, lang: str, work, env) -> str:
    import subprocess
    import sys

    command = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
    done = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"exit {done.returncode}\n{code}\n--- stderr ---\n{done.stderr[-3000:]}"
    return done.stdout


def _skip_without_spark() -> None:
    """The Spark example needs pyspark and a Java runtime; neither is part of the project's install."""
    import importlib.util
    import shutil

    if importlib.util.find_spec("pyspark") is None:
        pytest.skip("pyspark is not installed (the Spark mapInArrow example needs it and Java)")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime (java on PATH or JAVA_HOME): the Spark mapInArrow example needs one")


@pytest.mark.slow
@pytest.mark.parametrize("number", range(len(readme_blocks())))
def test_readme_block(number, readme_workdir):
    """Each block runs as written after the set-up (the set-up block itself: the Makefile's demo recipes,
    without the install) and prints what the README shows after it."""
    lang, code, expected = readme_blocks()[number]
    work, env = readme_workdir
    if "../shared/data" in code and not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent")
    if "pyspark" in code:
        _skip_without_spark()
    if number == 0:
        assert "make demo" in code and "source .venv/bin/activate" in code
        code = "\n".join(_makefile_demo_commands())
    stdout = _run(code, lang, work, env)
    if expected is not None:
        assert _matches(expected, stdout), f"README shows\n{expected}\nthe command printed\n{stdout}"
