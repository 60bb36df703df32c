"""Held-out validation: shapes drawn inside the ranges, pick / oracle per shape, the 5 % rule (the whole
path on a local Ray instance: tests/integration/test_holdout_on_ray.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.unit.test_refine import SPEC, _spec
from tunectl.cli import app
from tunectl.core.keys import key_text, make_key
from tunectl.core.record import Record
from tunectl.decide.holdout import HeldOut, Holdout, draw_shapes, read_holdout

ROOT = Path(__file__).resolve().parents[2]
RANGED_KV = '[shapes.kv_len]\nrange = [1024, 8192]\nvalues = [1024]\nstep = 512\nbucket = "ceil"'


def _ranged() -> object:
    return _spec("", SPEC.replace('[shapes.kv_len]\nvalues = [1024]\nbucket = "ceil"', RANGED_KV))


def test_held_out_shapes_lie_inside_the_ranges_on_the_step_and_were_not_tuned() -> None:
    spec = _ranged()
    tuned = [make_key({"batch": b, "kv_len": 1024}) for b in (1, 8, 64)]
    shapes = draw_shapes(spec, 30, seed=7, tuned=tuned)
    assert len(shapes) == len(set(shapes)) == 30 and not set(shapes) & set(tuned)
    for shape in map(dict, shapes):
        assert 1 <= shape["batch"] <= 64 and 1024 <= shape["kv_len"] <= 8192 and shape["kv_len"] % 512 == 0
    assert draw_shapes(spec, 30, seed=7, tuned=tuned) == shapes
    assert draw_shapes(spec, 30, seed=8, tuned=tuned) != shapes


def _arms(shape: dict[str, int], speedups: dict[str, float]) -> list[Record]:
    """A holdout comparison's records; ``speedups`` by config name, the first the default."""
    out = []
    for i, (name, s) in enumerate(speedups.items()):
        out.append(Record("h", f"{shape}{name}", "cost_model", '{"capacity":1}', key_text(make_key(shape)),
                          json.dumps({"c": name}), i == 0, "ok", median_us=100 / s, phase="holdout",
                          group_id=str(shape), rounds=8, speedup=s, speedup_lo=s * 0.99,
                          speedup_hi=s * 1.01))  # fmt: skip
    return out


def test_pick_over_oracle_per_shape_and_the_five_percent_rule() -> None:
    records, picks = [], {}
    for batch in range(1, 21):  # the pick is the best at 19 shapes, 10 % slower than the best at one
        shape = {"batch": batch, "kv_len": 1024}
        records += _arms(shape, {"d": 1.0, "a": 1.5, "b": 1.65 if batch == 20 else 1.2})
        picks[('{"capacity":1}', key_text(make_key(shape)))] = make_key({"c": "a"})
    held = read_holdout(records, picks, margin=0.02)
    assert len(held.shapes) == 20 and held.quantile(0.5) == 1.0
    assert held.ratios[-1] == pytest.approx(1.1) and [h.shape for h in held.losers] == [
        make_key({"batch": 20, "kv_len": 1024})
    ]
    assert not held.failed  # 1 of 20 is 5 %, not more
    assert Holdout(held.shapes[-2:], 0.02).failed  # 1 of 2 is
    assert held.geomean == pytest.approx(1.1 ** (1 / 20))


def test_a_failed_comparison_is_reported_not_counted() -> None:
    held = HeldOut(
        make_key({"capacity": 1}), make_key({"batch": 3}), make_key({"c": "a"}), None, None, "error"
    )
    assert not Holdout((held,)).failed and Holdout((held,)).ratios == []


def test_holdout_on_a_spec_without_ranges_is_one_line_and_exit_2(tmp_path: Path) -> None:
    spec = ROOT / "configs" / "quickstart.toml"
    args = ["validate", str(tmp_path / "none"), "--spec", str(spec), "--holdout", "3"]
    out = CliRunner().invoke(app, [*args, "--results", str(tmp_path / "res")])
    assert out.exit_code == 2 and "declare range = [lo, hi]" in out.output and "Traceback" not in out.output
    assert not (tmp_path / "res").exists()


def test_a_holdout_where_no_comparison_succeeded_says_so_and_where_to_look() -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from tunectl.cli.validate import print_holdout

    static, pick = make_key({"capacity": 1}), make_key({"c": "a"})
    shapes = tuple(
        HeldOut(static, make_key({"batch": b}), pick, None, None, status)
        for b, status in ((1, "crash"), (2, "crash"), (3, "error"))
    )
    console = Console(record=True, width=200)
    run = SimpleNamespace(holdout=Holdout(shapes), run_id="r1", spec="s.toml", skipped=[])
    print_holdout(console, run, Path("res"))
    text = console.export_text()
    assert "not compared: 2 crash, 1 error; `tunectl failures --run r1 --results res` lists why" in text
    assert "no held-out shape was measured" in text


def test_the_table_says_a_shared_static_key_and_shape_parameter_once() -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from tunectl.cli.validate import print_holdout

    def shown(*statics: dict[str, object]) -> list[str]:
        pick, oracle = make_key({"c": "a"}), make_key({"c": "b"})
        shapes = tuple(
            HeldOut(make_key(statics[i % len(statics)]), make_key({"batch": b, "q_len": 1}), pick, oracle, r)
            for i, (b, r) in enumerate(((3, 1.01), (9, 1.2), (21, 1.0)))
        )
        console = Console(record=True, width=120)
        run = SimpleNamespace(holdout=Holdout(shapes), run_id="r1", spec="s.toml", skipped=[])
        print_holdout(console, run, Path("res"))
        return console.export_text().splitlines()

    lines = shown({"page_size": 128, "dtype": "bfloat16"})
    rows = [line for line in lines if "batch=" in line]
    assert len(rows) == 3 and not any("page_size" in r or "q_len" in r for r in rows)
    assert sum("dtype=bfloat16 page_size=128" in line for line in lines) == 1
    assert any("every shape: q_len=1" in line for line in lines)
    two = shown({"page_size": 128}, {"page_size": 16})
    assert sum("page_size=" in line for line in two) == 3  # a static column, one per row


def test_held_out_tables_carry_the_default_the_named_baselines_and_the_best_single_config() -> None:
    records, picks = [], {}
    for batch in range(1, 11):  # "a" is best below batch 6, "b" from there; the pick follows them
        shape = {"batch": batch, "kv_len": 1024}
        records += _arms(shape, {"d": 1.0, "a": 2.0 if batch < 6 else 1.0, "b": 1.0 if batch < 6 else 2.0})
        picks[('{"capacity":1}', key_text(make_key(shape)))] = make_key({"c": "a" if batch < 6 else "b"})
    held = read_holdout(records, picks, margin=0.02, baselines=(("plain b", make_key({"c": "b"})),))
    standing = {st.label: st for st in held.standings()}
    assert standing["the bundle's pick"].geomean == 1.0 and standing["the bundle's pick"].within_3pct == 1.0
    assert standing["the default"].worst == pytest.approx(2.0)
    assert standing["plain b"].geomean == pytest.approx(2**0.5) and standing["plain b"].within_3pct == 0.5
    (best,) = [label for label in standing if label.startswith("best single config")]
    assert best == 'best single config {"c":"a"}' and standing[best].geomean == pytest.approx(2**0.5)


def test_a_baseline_in_the_spec_is_one_config_with_a_label() -> None:
    spec = _spec("", SPEC + '\n[baselines]\n"slow" = { fixed_ms = 2.0 }\n')
    assert spec.baselines == (("slow", make_key({"fixed_ms": 2.0})),)
    with pytest.raises(Exception, match=r"baselines\.slow\.fixed_ms"):
        _spec("", SPEC + '\n[baselines]\n"slow" = { fixed_ms = [1.0, 2.0] }\n')
