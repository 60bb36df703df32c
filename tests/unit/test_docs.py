"""The documents say what the code does: every command in the README's table, every spec key in
docs/specs.md with its default, every relative link pointing at a file that exists."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tunectl.core import shapes, spec
from tunectl.core.spec import Spec, parse_spec

from .test_cli import LEAVES

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SPECS = ROOT / "docs" / "specs.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
PAGES += sorted((ROOT / "benchmarks" / "results").glob("*.md"))


def _prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _table_rows(text: str) -> list[list[str]]:
    """Every markdown table row outside code blocks, as its cells, backticks kept."""
    rows = [line.strip().strip("|").split("|") for line in _prose(text).splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row] for row in rows if not set("".join(row)) <= set("-: ")]


def _section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section of ``text``."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_stays_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_command_has_a_row_in_the_readme_command_table(path: tuple[str, ...]) -> None:
    table = _section(README.read_text(encoding="utf-8"), "Commands")
    commands = [row[0].strip("`") for row in _table_rows(table)]
    command = " ".join(("tunectl", *path))
    assert any(re.match(rf"{re.escape(command)}(\s|$)", c) for c in commands), f"{command}: not in the table"


def _toml(value: object) -> str:
    """A default as the TOML that sets it."""
    if isinstance(value, bool):
        return str(value).lower()
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _spec_keys() -> dict[str, object]:
    """Every key a spec accepts, dotted as error messages name it, with its default (None: none)."""
    keys: dict[str, object] = {name: None for name in spec._TOP_LEVEL}
    keys.update({f"shapes.<dim>.{name}": None for name in shapes._KEYS})
    for table in dataclasses.fields(Spec):
        factory = table.default_factory
        if factory is not dataclasses.MISSING and dataclasses.is_dataclass(factory):
            assert table.name in spec._TOP_LEVEL, f"[{table.name}] is a table the spec does not accept"
            keys.update({f"{table.name}.{key.name}": key.default for key in dataclasses.fields(factory)})
    return keys


def _documented_keys() -> dict[str, list[str]]:
    text = _section(SPECS.read_text(encoding="utf-8"), "Every key")
    return {row[0].strip("`"): row for row in _table_rows(text) if row[0].startswith("`")}


@pytest.mark.parametrize("key", sorted(_spec_keys()))
def test_every_spec_key_is_documented_with_its_default(key: str) -> None:
    documented = _documented_keys()
    assert key in documented, f"{key}: no row in docs/specs.md's 'Every key'"
    default = _spec_keys()[key]
    if default is not None:
        assert f"`{_toml(default)}`" in documented[key][2], f"{key}: the default is {_toml(default)}"


def test_docs_document_no_spec_key_the_code_does_not_accept() -> None:
    assert sorted(set(_documented_keys()) - set(_spec_keys())) == []


def test_every_whole_spec_in_the_docs_is_a_valid_spec() -> None:
    for page in (README, *sorted((ROOT / "docs").glob("*.md"))):
        for block in re.findall(r"^```toml\n(.*?)^```", page.read_text(encoding="utf-8"), flags=re.M | re.S):
            if re.search(r"^task = ", block, flags=re.M):
                parse_spec(block, str(page.relative_to(ROOT)))


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors for the headings of ``page``."""
    headings = re.findall(r"^#+ (.*)$", _prose(page.read_text(encoding="utf-8")), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_that_exists(page: Path) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.relative_to(ROOT)}: {target} points at nothing"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{page.relative_to(ROOT)}: {target}: no such heading"


def test_the_readme_test_command_is_the_line_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]
    assert f"```bash\n{ci}\n```" in _section(README.read_text(encoding="utf-8"), "Tests")
