"""Split rules as bundle entries: the runtime evaluates them, export fits them and chooses them by evidence.

The device is simulated (``tests.finished_run``): a split-KV kernel whose time is its makespan over
waves of 16 (sequence, split) units, with a cost per split and per merged partial. Everything else
(the search, the probes, selection, the fit, the choice, the bundle, the lookup) is the real code.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tests.conftest import TINY_STATIC
from tests.finished_run import finished_run
from tunectl.cli import app
from tunectl.core.plan import WorkItem
from tunectl.decide.rules import fit_rule
from tunectl.formats.export import Choices, export_bundle
from tunectl.runtime import BundleSchemaError, Entry, WaveRule, load_bundle
from tunectl.runtime.rules import MAX_WAVES, launch
from tunectl.store.bundle import TaskTable, build_files, publish_local

PER_WAVE = 16
STATIC = {"dtype": "float32", "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16, "page_size": 8}


def wave_time(item: WorkItem) -> float:
    """µs of one call: a wave cliff wherever batch x splits passes a multiple of 16."""
    splits, shape = dict(item.config).get("num_splits", 1), dict(item.shape)
    return _time(shape["batch"], shape["kv_len"], int(splits))


def _time(batch: int, kv_len: int, splits: int) -> float:
    chunk = math.ceil(math.ceil(kv_len / splits) / 64) * 64
    active = math.ceil(kv_len / chunk)
    waves = math.ceil(batch * active / PER_WAVE)
    return 2.0 + 0.01 * waves * chunk + (0.5 + 0.02 * batch * active if splits > 1 else 0.0)


def _spec(probes: int) -> str:
    return f"""
name = "waves"
task = "decode_attention"
{TINY_STATIC}[shapes.batch]
range = [1, 32]
values = [1, 4, 16, 32]
bucket = "ceil"
[shapes.kv_len]
range = [256, 4096]
values = [256, 1024, 4096]
step = 64
bucket = "ceil"
[configs]
num_splits = [1, 2, 4, 8, 16]
gqa = "grouped"
gather = "index"
[search]
strategy = "grid"
probes = {probes}
"""


def _bundle(tmp_path: Path, probes: int, *, rules: bool = True, version: str = "1") -> Path:
    results = tmp_path / "results"
    if not results.exists():
        finished_run(results, _spec(probes), oracle=wave_time, rows_per_part=256)
    res = export_bundle(results, "waves", version, tmp_path / "bundles", choices=Choices(rules=rules))
    return Path(res.location)


def _held_out(seed: int, n: int = 40) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [
        (
            round(math.exp(rng.uniform(0, math.log(32)))),
            round(math.exp(rng.uniform(math.log(256), math.log(4096)))),
        )
        for _ in range(n)
    ]


def _loss(bundle: Path, shapes: list[tuple[int, int]]) -> list[float]:
    """Per shape: the time of the pick over the best of every split count 1-16."""
    loaded = load_bundle(bundle, env_policy="off")
    out = []
    for batch, kv_len in shapes:
        config = loaded.lookup("decode_attention", **STATIC, batch=batch, kv_len=kv_len)
        assert config is not None
        best = min(_time(batch, kv_len, s) for s in range(1, 17))
        out.append(_time(batch, kv_len, config["num_splits"]) / best)
    return out


def test_a_rule_counts_the_most_splits_that_fill_one_wave_where_splitting_pays() -> None:
    rule = WaveRule("num_splits", "batch", "kv_len", 16.0, 64, 1, 16, (2.0, 0.01, 0.5, 0.02))
    assert rule.count(5, 1024) == 3  # 15 of 16 units: one wave; 4 splits would spill into a second
    assert rule.count(1, 4096) == 16
    assert rule.count(32, 4096) == 1  # two full waves without splitting
    assert WaveRule.from_json(json.loads(json.dumps(rule.to_json()))) == rule
    older = {k: v for k, v in rule.to_json().items() if k != "per_work"}  # a bundle written before it
    assert WaveRule.from_json(older) == rule


def _candidates(rule: WaveRule, across: int) -> list[int]:
    fills = [min(rule.hi, max(rule.lo, int(w * rule.per_wave // across))) for w in range(1, MAX_WAVES + 1)]
    return sorted({rule.lo, *fills, rule.hi})


def _modelled_best(rule: WaveRule, across: int, along: int) -> int:
    """The count the module doc describes, found by modelling every candidate in full."""
    counts = _candidates(rule, across)
    least = min(rule.predict_us(across, along, s) for s in counts)
    return min(s for s in counts if rule.predict_us(across, along, s) <= least + 1e-9)


@settings(max_examples=60, deadline=None)
@given(
    per_wave=st.sampled_from([16.0, 66.0, 78.0, 132.0]),
    block=st.sampled_from([1, 16, 64, 128]),
    bounds=st.sampled_from([(1, 16), (1, 64), (2, 32), (4, 4)]),
    costs=st.tuples(*[st.sampled_from([0.0, 0.25, 1.5, 4.0]) for _ in range(2)]),
    across=st.integers(1, 300),
    along=st.integers(1, 40_000),
)
def test_a_rules_count_holds_over_the_span_it_gives(
    per_wave: float, block: int, bounds: tuple[int, int], costs: tuple[float, float], across: int, along: int
) -> None:
    """``span``: the count, and the lengths around ``along`` over which it stays the count, each
    checked against every candidate modelled in full (a serving process reuses it over the span):
    every candidate launches alike over it, so it holds whatever the costs."""
    rule = WaveRule("s", "batch", "kv_len", per_wave, block, *bounds, (2.0, 0.0078125, *costs))
    count, first, last = rule.span(across, along)
    assert first <= along <= last and count == rule.count(across, along)
    launches = [launch(across, along, s, per_wave, block)[1:] for s in _candidates(rule, across)]
    for x in {first, along, last, (first + last) // 2, *range(first, min(last, first + 64) + 1)}:
        assert _modelled_best(rule, across, x) == count, x
        assert [launch(across, x, s, per_wave, block)[1:] for s in _candidates(rule, across)] == launches


def test_a_growing_length_is_answered_from_its_span_as_from_the_rule() -> None:
    """A serving step's KV length grows (here by 7 a step) and batches come and go: every answer is the rule's
    own count at that shape, whatever was asked before."""
    rule = WaveRule("num_splits", "batch", "kv_len", 16.0, 64, 1, 16, (2.0, 0.01, 0.5, 0.02))
    entries = [
        Entry.from_json(
            {
                "static": STATIC,
                "shape": {"batch": b, "kv_len": 4096},
                "config": {"x": b},
                "rule": rule.to_json(),
            }
        )
        for b in (4, 32)
    ]
    table = TaskTable(
        "decode_attention",
        tuple(STATIC),
        {"batch": {"policy": "ceil", "points": [4, 32]}, "kv_len": {"policy": "ceil", "points": [4096]}},
        tuple(entries),
    )
    with tempfile.TemporaryDirectory() as tmp:
        files = build_files("waves", "1", [table], [], {})
        loaded = load_bundle(publish_local(Path(tmp), "waves", "1", files), env_policy="off")
    rng = random.Random(5)
    batches = [rng.choice([1, 3, 5, 17, 30]) for _ in range(40)]
    for step in range(1, 4000, 7):
        for batch in batches[step % 40 : step % 40 + 3]:
            got = loaded.lookup("decode_attention", **STATIC, batch=batch, kv_len=step)
            want = {"x": 4 if batch <= 4 else 32, "num_splits": rule.count(batch, step)}
            assert got == want, (batch, step)


def test_a_fit_finds_the_wave_size_and_costs_of_a_wave_cliff_surface() -> None:
    samples = [
        (b, n, s, _time(b, n, s))
        for b in (1, 3, 4, 16, 32)
        for n in (256, 1024, 4096)
        for s in (1, 2, 4, 8, 16)
    ]
    rule = fit_rule(samples, "num_splits", "batch", "kv_len")
    assert rule is not None and rule.block == 64 and 15 < rule.per_wave < 17
    assert all(abs(rule.predict_us(b, n, s) / t - 1) < 0.01 for b, n, s, t in samples)


def test_a_fit_tells_the_reads_from_the_waves() -> None:
    """Where most of a call's time is its reads (the same at every split count), a fit without a term
    for them took the waves for smaller than they are and counted too few splits at mid-sized batches
    (on the H200: one split at 33 x 11504, 32 % slower than eight)."""
    samples = [
        (b, n, s, _time(b, n, s) + 0.002 * b * n)
        for b in (1, 3, 4, 8, 16, 32)
        for n in (256, 1024, 4096)
        for s in (1, 2, 4, 8, 16)
    ]
    rule = fit_rule(samples, "num_splits", "batch", "kv_len")
    assert rule is not None and 15 < rule.per_wave < 17 and rule.per_work == pytest.approx(0.002, rel=0.05)
    for b, n in ((5, 4096), (10, 2048), (12, 3000)):
        best = min(_time(b, n, s) for s in range(1, 17))
        assert _time(b, n, rule.count(b, n)) / best < 1.01


def test_too_few_split_counts_fit_no_rule() -> None:
    samples = [(b, n, s, _time(b, n, s)) for b in (1, 4, 16) for n in (256, 4096) for s in (1, 8)]
    assert fit_rule(samples, "num_splits", "batch", "kv_len") is None


def test_a_rule_fitted_on_a_wave_cliff_beats_the_point_table_between_points(tmp_path: Path) -> None:
    ruled, plain = _bundle(tmp_path, probes=2), _bundle(tmp_path, probes=2, rules=False, version="2")
    entries = list(load_bundle(ruled, env_policy="off").entries("decode_attention"))
    with_rule = [e for e in entries if e.rule is not None]
    assert with_rule and all(e.reason.startswith("rule: num_splits by waves") for e in with_rule)
    assert all(e.rule is None for e in load_bundle(plain, env_policy="off").entries("decode_attention"))
    shapes = _held_out(seed=7)
    mine, table = _loss(ruled, shapes), _loss(plain, shapes)
    assert statistics.geometric_mean(mine) < statistics.geometric_mean(table) - 0.02
    assert max(mine) < max(table)


def test_without_probes_nothing_measured_a_rule_between_points_and_configs_stay(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, probes=0)
    assert all(e.rule is None for e in load_bundle(bundle, env_policy="off").entries("decode_attention"))


def test_export_with_rules_is_deterministic(tmp_path: Path) -> None:
    first, second = _bundle(tmp_path, probes=2), _bundle(tmp_path, probes=2, version="2")
    for rel in ("tables/decode_attention.json", "stats/decode_attention.json"):
        assert (first / rel).read_bytes() == (second / rel).read_bytes()


@pytest.mark.parametrize("command", [["bundle", "verify"], ["bundle", "show"]])
def test_a_bundle_of_a_newer_schema_is_refused_in_one_line(tmp_path: Path, command: list[str]) -> None:
    bundle = _bundle(tmp_path, probes=0)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["schema_version"] = 4
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleSchemaError, match="schema version 4; this tunectl reads versions 1, 2, 3"):
        load_bundle(bundle)
    result = CliRunner().invoke(app, [*command, str(bundle)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "schema version 4" in result.output and "upgrade tunectl" in result.output
