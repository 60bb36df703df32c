"""The command line: help everywhere, and bad input gets one line and exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer
from typer.testing import CliRunner

from tests.conftest import TINY_SPEC
from tunectl.cli import app


def _commands(
    group: click.Command, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, group)]
    for name, cmd in getattr(group, "commands", {}).items():  # typer's groups are not click.Group
        found += _commands(cmd, (*path, name))
    return found


@pytest.mark.parametrize("path", [p for p, _ in _commands(typer.main.get_command(app))], ids=" ".join)
def test_every_command_says_what_it_does(path: tuple[str, ...]) -> None:
    commands = dict(_commands(typer.main.get_command(app)))
    assert (commands[path].help or "").strip(), f"{' '.join(path) or 'tunectl'} has no help text"
    out = CliRunner().invoke(app, [*path, "--help"])
    assert out.exit_code == 0 and "Usage" in out.output


LEAVES = [p for p, c in _commands(typer.main.get_command(app)) if not hasattr(c, "commands")]


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_command_ends_its_help_with_an_example_of_itself(path: tuple[str, ...]) -> None:
    text = dict(_commands(typer.main.get_command(app)))[path].help or ""
    before, example = text.rsplit("Example:", 1) if "Example:" in text else (text, "")
    lines = [line.strip() for line in example.splitlines() if line.strip() not in ("", "\b")]
    assert before.strip() and lines, f"tunectl {' '.join(path)}: the help ends without an Example: block"
    assert all(line.startswith(f"tunectl {' '.join(path)}") for line in lines), lines


@pytest.mark.parametrize("path", [p for p, _ in _commands(typer.main.get_command(app))], ids=" ".join)
def test_every_help_page_shows_an_example(path: tuple[str, ...]) -> None:
    """What ``--help`` prints, groups and the top level included: an Example: block of this command."""
    out = CliRunner().invoke(app, [*path, "--help"])
    assert out.exit_code == 0, out.output
    assert "Example:" in out.output, f"tunectl {' '.join(path)} --help shows no Example: block"
    shown = out.output.split("Example:", 1)[1].split("╭", 1)[0]
    command = " ".join(("tunectl", *path))
    examples = [line.strip() for line in shown.splitlines() if line.strip().startswith("tunectl ")]
    assert examples and all(line.startswith(command) for line in examples), shown


def _tunectl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tunectl", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("spec_text", "words"),
    [
        (
            TINY_SPEC.replace('task = "decode_attention"', 'task = "no_such_task"'),
            "tiny.toml: task: unknown task",
        ),
        (TINY_SPEC.replace("values = [1, 2, 4]", "values = []"), "tiny.toml: shapes.batch.values"),
        (TINY_SPEC.replace("head_dim = 16", "head_dim = 16\nhead_size = 3"), "tiny.toml: static.head_size"),
        (None, "tiny.toml: file: no such file"),
    ],
    ids=["unknown-task", "empty-grid", "unknown-key", "missing-file"],
)
def test_a_bad_spec_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path, spec_text: str | None, words: str
) -> None:
    if spec_text is not None:
        (tmp_path / "tiny.toml").write_text(spec_text)
    done = _tunectl("submit", "tiny.toml", "--results", "out", cwd=tmp_path)
    assert done.returncode == 2
    assert words in done.stderr and "Traceback" not in done.stderr + done.stdout
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_bad_arguments_exit_2_without_traceback(tmp_path: Path) -> None:
    for args in (
        ["submit", "--resume", "r-none", "--results", "nowhere"],
        ["export", "bundle", "--name", "x", "--version", "1", "--results", "nowhere"],
        ["export", "bundle", "--name", "../x", "--version", "1"],
        ["bundle", "verify", "nowhere"],
    ):
        done = _tunectl(*args, cwd=tmp_path)
        assert done.returncode in (1, 2), args
        assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr, (args, done.stderr)
    assert list(tmp_path.iterdir()) == []


def test_the_console_script_reports_missing_tuning_extras() -> None:
    code = "import sys; sys.modules['typer'] = None\nfrom tunectl._entry import main\nmain()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2 and "pip install 'tunectl[tune]'" in done.stderr
