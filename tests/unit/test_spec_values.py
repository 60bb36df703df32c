"""Every spec value is checked before any work, by the task's declared rules and the tables' own:
a bad one is one line naming the field and what is allowed, never a traceback, a wasted run or a
silently empty plan."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.conftest import TINY_SPEC
from tunectl.cli import app
from tunectl.core.errors import SpecError, UserError
from tunectl.core.params import Rule
from tunectl.core.plan import count_plan, plan
from tunectl.core.spec import TABLE_RULES, parse_spec
from tunectl.tasks.registry import get_task, task_names


def _error(text: str) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(text, "bad.toml")
    return str(info.value)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "num_q_heads = 4",
            'num_q_heads = "eight"',
            "static.num_q_heads: must be an integer >= 1 and <= 1024, not 'eight'",
        ),
        (
            "num_kv_heads = 2",
            "num_kv_heads = 0",
            "static.num_kv_heads: must be an integer >= 1 and <= 1024, not 0",
        ),
        ("head_dim = 16", "head_dim = -64", "static.head_dim: must be an integer >= 1 and <= 1024, not -64"),
        (
            'gqa = ["expand", "grouped"]',
            'gqa = "bogus"',
            "configs.gqa: must be one of expand, grouped, not 'bogus'",
        ),
        (
            "num_splits = [1, 2]",
            "num_splits = [0, -1]",
            "configs.num_splits: must be an integer >= 1 and <= 1024, not 0",
        ),
        ("max_seconds = 0.05", "max_seconds = 0", "measure.max_seconds: must be a number > 0, not 0"),
        (
            "head_dim = 16",
            "head_dim = 16.0",
            "static.head_dim: must be an integer >= 1 and <= 1024, not 16.0",
        ),
        (
            "page_size = 8",
            "page_size = true",
            "static.page_size: must be an integer >= 1 and <= 65536, not true",
        ),
        (
            'dtype = "float32"',
            'dtype = "int8"',
            "static.dtype: must be one of float64, float32, float16, bfloat16",
        ),
        ("max_seconds = 0.05", "max_seconds = nan", "measure.max_seconds: must be a number > 0, not nan"),
        ("rounds = 3", "rounds = 3\ntie = 2.0", "search.tie: must be a number >= 0 and <= 1, not 2.0"),
        (
            "rounds = 3",
            "rounds = 3\nskip_dominated = 0.5",
            "search.skip_dominated: a factor over the fastest: 0 (off) or more than 1",
        ),
        (
            "rounds = 3",
            "rounds = 3\nskip_dominated = -1",
            "search.skip_dominated: must be a number >= 0, not -1",
        ),
    ],
)
def test_a_bad_value_names_its_field_and_what_is_allowed(old: str, new: str, message: str) -> None:
    assert old in TINY_SPEC
    assert _error(TINY_SPEC.replace(old, new, 1)).startswith(f"bad.toml: {message}")


def test_a_point_every_static_skips_says_why_there_is_no_work() -> None:
    text = TINY_SPEC.replace("num_q_heads = 4", "num_q_heads = 3")  # not a multiple of 2 KV heads
    with pytest.raises(
        UserError, match=r"plans no work; 6 point.*num_q_heads must be a multiple of num_kv_heads"
    ):
        plan(parse_spec(text, "bad.toml"))


def test_a_bad_spec_on_the_command_line_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(TINY_SPEC.replace("num_kv_heads = 2", "num_kv_heads = 0"))
    results = tmp_path / "results"
    out = CliRunner().invoke(app, ["submit", str(spec), "--results", str(results)])
    assert out.exit_code == 2, out.output
    assert out.output.strip().splitlines() == [
        f"error: {spec}: static.num_kv_heads: must be an integer >= 1 and <= 1024, not 0"
    ]
    assert not results.exists()


def test_every_shipped_task_declares_a_rule_for_every_parameter() -> None:
    for name in task_names():
        task = get_task(name)
        rules = task.param_rules  # tunectl.tasks.base.Task's default: none
        assert set(rules) == {*task.static_params, *task.config_params}, name


# -- property tests: random bad values, never a traceback ------------------------------------------

_TOML_VALUES = st.one_of(
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(alphabet="abcXYZ_-09 ", max_size=8),
    st.lists(st.integers(-5, 5), max_size=3),
)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return (
            "nan"
            if math.isnan(value)
            else ("inf" if value > 0 else "-inf")
            if math.isinf(value)
            else repr(value)
        )
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, list):
        return "[" + ", ".join(map(_toml, value)) + "]"
    return str(value)


_FIELDS = [
    *(f"static.{n}" for n in ("dtype", "num_q_heads", "num_kv_heads", "head_dim", "page_size")),
    *(f"configs.{n}" for n in ("num_splits", "gqa", "gather")),
    *TABLE_RULES,
]


def _with(field: str, value: object) -> str:
    table, name = field.split(".")
    line = f"{name} = {_toml(value)}"
    lines = [ln for ln in TINY_SPEC.splitlines() if not ln.startswith(f"{name} =")]
    at = lines.index(f"[{table}]") if f"[{table}]" in lines else None
    if at is None:
        lines += [f"[{table}]"]
        at = len(lines) - 1
    lines.insert(at + 1, line)
    return "\n".join(lines) + "\n"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(_FIELDS), value=_TOML_VALUES)
def test_any_value_of_any_field_validates_or_is_refused_with_the_field_named(
    field: str, value: object
) -> None:
    text = _with(field, value)
    try:
        spec = parse_spec(text, "p.toml")
    except SpecError as exc:
        assert exc.field.startswith(field.split(".")[0]), str(exc)
        assert re.match(r"p\.toml: [\w.\[\]]+: ", str(exc)) and "\n" not in str(exc)
        return
    try:
        counted = count_plan(spec)
        made = plan(spec)
        assert made.num_items == counted.num_items == sum(1 for _ in made.work_items()) > 0
    except UserError as exc:  # a spec that validates may still plan no work: it says why
        assert "plans no work" in str(exc)


@given(
    value=_TOML_VALUES,
    rule=st.sampled_from(
        [Rule.integer(1), Rule.number(0, 1, low_open=True), Rule.one_of("a", "b"), Rule.pair(-1), Rule("str")]
    ),
)
def test_a_rule_allows_a_value_or_says_what_it_allows(value: object, rule: Rule) -> None:
    problem = rule.problem(tuple(value) if isinstance(value, list) else value)
    assert problem is None or problem.startswith(f"must be {rule.allowed()}, not ")


def test_a_point_too_large_to_build_is_skipped_with_its_size() -> None:
    spec = parse_spec(TINY_SPEC.replace("values = [64, 128]", "values = [64, 1000000000]"), "big.toml")
    work = plan(spec)
    assert {dict(shape)["kv_len"] for _, shape, _ in work.skipped_points} == {1000000000}
    assert all("GiB (limit 8)" in why for _, _, why in work.skipped_points)
    assert {dict(i.shape)["kv_len"] for i in work.work_items()} == {64}


def test_a_description_must_be_text() -> None:
    assert _error("description = 5\n" + TINY_SPEC) == "bad.toml: description: must be a string"
