"""The front door: options checked when they are made, errors that carry their fields and read as one
line at the command line, and a plan counted without Ray."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import TINY_SPEC
from tunectl import api
from tunectl.cli import app
from tunectl.core.errors import OptionError, SpecError, UserError
from tunectl.core.spec import L2, DriftAction, MeasureSpec, Strategy, parse_spec


@pytest.mark.parametrize(
    ("make", "option", "value"),
    [
        (lambda: api.ValidateOptions(layers=0), "layers", 0),
        (lambda: api.ValidateOptions(rounds=1), "rounds", 1),
        (lambda: api.HoldoutOptions(num_shapes=0), "num_shapes", 0),
        (lambda: api.HoldoutOptions(margin=1.5), "margin", 1.5),
        (lambda: api.ProbeOptions(per_cell=0), "per_cell", 0),
        (lambda: api.Cluster(num_gpus=-1), "num_gpus", -1),
    ],
)
def test_an_option_out_of_bounds_is_refused_naming_the_option_and_what_it_takes(
    make: object, option: str, value: object
) -> None:
    with pytest.raises(OptionError) as refused:
        make()  # type: ignore[operator]
    assert (refused.value.option, refused.value.value) == (option, value)
    assert refused.value.reason.startswith("must be ") and "\n" not in str(refused.value)


def test_options_are_frozen() -> None:
    options = api.SubmitOptions()
    with pytest.raises(AttributeError):
        options.run_id = "r1"  # type: ignore[misc]


def test_the_cli_words_an_option_error_with_the_flag_it_came_from(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["probe", "r1", "--rounds", "1", "--results", str(tmp_path)])
    assert out.exit_code == 2 and out.output == "error: --rounds: must be an integer >= 2, not 1\n"
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY_SPEC)
    args = ["validate", "b", "--spec", str(spec), "--holdout", "0", "--results", str(tmp_path)]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2 and out.output.startswith("error: --holdout: must be an integer >= 1")


def test_a_spec_error_carries_the_file_the_field_and_the_reason() -> None:
    with pytest.raises(SpecError) as refused:
        parse_spec(TINY_SPEC.replace("[measure]", '[measure]\nl2 = "lukewarm"'), "tiny.toml")
    error = refused.value
    assert (error.path, error.field, error.reason) == (
        "tiny.toml",
        "measure.l2",
        "'lukewarm' is not one of warm, cold",
    )


def test_closed_choices_are_enums_on_their_fields_made_from_their_text() -> None:
    spec = parse_spec(TINY_SPEC.replace("[measure]", '[measure]\nl2 = "cold"\ndrift = "flag"'), "tiny.toml")
    assert spec.measure.l2 is L2.COLD and spec.measure.drift is DriftAction.FLAG
    assert spec.search.strategy is Strategy.GRID
    assert MeasureSpec(drift="off").drift is DriftAction.OFF  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        MeasureSpec(l2="lukewarm")  # type: ignore[arg-type]


def test_a_plan_is_counted_from_a_spec_without_ray(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY_SPEC)
    planned = api.plan(api.load_spec(spec))
    assert planned.count.num_items > 0 and planned.seconds is None  # no earlier runs to estimate from


def test_records_of_a_dataset_that_does_not_exist_are_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no results dataset at"):
        api.records(tmp_path / "none")
