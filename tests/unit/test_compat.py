"""Results, run metadata and bundles written by tunectl 0.1.0 (tests/data/v1, see make.py) still read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tunectl.core.record import Phase, Status, Timing, TimingMethod
from tunectl.formats.export import prepare_bundle, winners_in
from tunectl.runtime import load_bundle
from tunectl.store.results import read_results
from tunectl.store.runs import load_run, run_facts, summarise_runs
from tunectl.store.stores import read_bundle

V1 = Path(__file__).parents[1] / "data" / "v1"
RUN = "r20261130-120000-aaaaaa"


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A copy of the v1 results (exporting writes nothing there, but a test must not risk the fixture)."""
    return Path(shutil.copytree(V1 / "results", tmp_path / "results"))


def test_v1_rows_read_as_typed_records(results: Path) -> None:
    records = read_results(results)
    assert len(records) == 10 and {r.run_id for r in records} == {RUN}
    assert {r.phase for r in records} == {Phase.MEASURE}
    assert {r.status for r in records} == {Status.OK, Status.WRONG_RESULT}
    ok = [r for r in records if r.ok]
    assert {r.measure_mode for r in ok} == {TimingMethod.GRAPH}
    assert {r.timing for r in records} == {Timing.REPLAY}  # the one method before rows named theirs
    assert all(r.reference_us is None and r.drift is None and r.remeasured is None for r in records)
    assert all(dict(r.shape)["kv_len"] == 1024 and dict(r.static)["window"] == (-1, -1) for r in ok)
    assert all(isinstance(r.finished_at, float) and r.finished_at > 1.7e9 for r in records)


def test_a_v1_run_without_facts_gets_them_from_its_spec(results: Path) -> None:
    info = load_run(results, RUN)
    assert info.facts is None
    facts = run_facts(info)
    assert facts is not None and facts.buckets == (("batch", "pow2"), ("kv_len", "exact"), ("q_len", "exact"))
    assert any('"kv_page_size":256' in config for _, config in facts.unselectable)
    [summary] = summarise_runs(results)
    assert summary.counts == {"ok": 8, "wrong_result": 2}


def test_v1_results_select_what_v1_published(results: Path) -> None:
    winners = winners_in(results)
    published = read_bundle(str(V1 / "bundles" / "v1" / "1"))
    assert [(dict(w.shape)["batch"], dict(w.config)) for w in winners] == [
        (1, {"backend": "fa2"}),  # the re-paged fa2 is faster still, but measured for reference only
        (8, {"backend": "fa4"}),
    ]
    for w in winners:
        assert published.lookup("flash_decode", **dict(w.static), **dict(w.shape)) == dict(w.config)
    prepared = prepare_bundle(results, "v1", "2")
    now = json.loads(prepared.files["tables/flash_decode.json"])
    then = json.loads((V1 / "bundles" / "v1" / "1" / "tables" / "flash_decode.json").read_bytes())
    width = len(then["shape_params"]) + 3  # schema 3 adds a rule column to each row: -1, no rule
    rows = [v for i, v in enumerate(now["rows"]) if i % width != width - 1]
    assert now["rules"] == [] and set(now["rows"][width - 1 :: width]) == {-1}
    assert (now["statics"], now["configs"], rows) == (then["statics"], then["configs"], then["rows"])


def test_a_v1_bundle_loads_and_looks_up_in_serving() -> None:
    bundle = load_bundle(str(V1 / "bundles" / "v1" / "1"), env_policy="off")
    static = dict(causal=True, dtype="bfloat16", head_dim=128, num_kv_heads=8, num_q_heads=32, page_size=16,
                  sinks=False, softcap=0.0, window=None)  # fmt: skip
    assert bundle.lookup("flash_decode", **static, batch=1, kv_len=1024, q_len=1) == {"backend": "fa2"}
    assert bundle.lookup("flash_decode", **static, batch=5, kv_len=1024, q_len=1) == {"backend": "fa4"}
