"""Specs: valid ones load into frozen dataclasses; invalid ones name the file and field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.conftest import TINY_SPEC
from tunectl.core.errors import SpecError
from tunectl.core.spec import load_spec, parse_spec


def test_quickstart_spec_loads_as_frozen_dataclasses() -> None:
    spec = load_spec(Path(__file__).parents[2] / "configs" / "quickstart.toml")
    assert spec.task == "decode_attention" and spec.name == "quickstart"
    assert [d.name for d in spec.shapes] == ["batch", "kv_len"]
    assert len(spec.shape_grid()) >= 3 and len(spec.configs) >= 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


def _error(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "bad.toml")
    return info.value


@pytest.mark.parametrize(
    ("edit", "field", "words"),
    [
        (lambda s: "surprise = 1\n" + s, "surprise", "unknown key"),
        (lambda s: s.replace('task = "decode_attention"', 'task = "nope"'), "task", "unknown task"),
        (lambda s: s.replace("num_q_heads = 4", "num_q_heads = []"), "static.num_q_heads", "empty"),
        (lambda s: s.replace("num_q_heads = 4\n", ""), "static.num_q_heads", "missing"),
        (lambda s: s.replace("values = [1, 2, 4]", "values = [1, 3]"), "shapes.batch.values", "power of two"),
        (lambda s: s.replace("values = [1, 2, 4]", 'values = ["a"]'), "shapes.batch.values", "positive"),
        (lambda s: s.replace('bucket = "ceil"', 'bucket = "round"'), "shapes.kv_len.bucket", "not one of"),
        (
            lambda s: s.replace("num_splits = [1, 2]", "num_splits = [1, 2]\nbogus = [1]"),
            "configs.bogus",
            "unknown parameter",
        ),
        (lambda s: s.replace("max_seconds = 0.05", 'max_seconds = "fast"'), "measure.max_seconds", "float"),
        (lambda s: s.replace("warmup = 1", "warmup = -1"), "measure.warmup", "integer >= 0"),
        (
            lambda s: s.replace("[measure]", "[resources]\nnum_gpus = true\n[measure]"),
            "resources.num_gpus",
            "int",
        ),
        (
            lambda s: s.replace("[measure]", "[resources]\nbatch = 0\n[measure]"),
            "resources.batch",
            "integer >= 1 and <= 64, not 0",
        ),
        (
            lambda s: s.replace("[measure]", "[resources]\ncpu_threads = 0\n[measure]"),
            "resources.cpu_threads",
            "integer >= 1 and <= 1024, not 0",
        ),
        (lambda s: s + "\n[[oops\n", "toml", ""),
    ],
)
def test_invalid_spec_names_file_and_field(edit, field: str, words: str) -> None:  # type: ignore[no-untyped-def]
    err = _error(edit(TINY_SPEC))
    assert err.path == "bad.toml" and err.field == field
    assert str(err).startswith(f"bad.toml: {field}: ") and words in str(err)


def test_missing_file_is_a_spec_error(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_spec(tmp_path / "absent.toml")


def test_config_union_of_grids_expands_each_grid() -> None:
    text = TINY_SPEC.replace(
        '[configs]\nnum_splits = [1, 2]\ngqa = ["expand", "grouped"]',
        '[[configs]]\nnum_splits = [1, 2]\n[[configs]]\ngqa = "grouped"\ngather = ["index", "per_seq"]',
    )
    spec = parse_spec(text)
    assert [dict(c) for c in spec.configs] == [
        {"num_splits": 1},
        {"num_splits": 2},
        {"gather": "index", "gqa": "grouped"},
        {"gather": "per_seq", "gqa": "grouped"},
    ]


def test_a_spec_default_is_the_baseline_every_config_is_planned_against() -> None:
    from tunectl.core.plan import plan

    spec = parse_spec(TINY_SPEC + '[default]\nnum_splits = 2\ngqa = "grouped"\n', "tiny.toml")
    items = list(plan(spec).work_items())
    defaults = {dict(i.config)["num_splits"] for i in items if i.is_default}
    assert defaults == {2} and all(dict(i.config)["gqa"] == "grouped" for i in items if i.is_default)
    per_point = len(items) // len(spec.shape_grid())
    assert per_point == 4, "the default is one of the grid's configs here: planned once"
    without = plan(parse_spec(TINY_SPEC, "tiny.toml")).work_items()
    assert {dict(i.config)["num_splits"] for i in without if i.is_default} == {1}, "else the task's own"


@pytest.mark.parametrize(
    ("default", "field", "words"),
    [
        ("num_splits = [1, 2]", "default.num_splits", "one value"),
        ("bogus = 1", "default.bogus", "unknown parameter"),
        ('gqa = "sideways"', "default.gqa", "must be one of"),
    ],
)
def test_a_bad_spec_default_names_its_field(default: str, field: str, words: str) -> None:
    error = _error(TINY_SPEC + f"[default]\n{default}\n")
    assert field in str(error) and words in str(error), str(error)
