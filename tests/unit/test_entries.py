"""Bundle entries: one record from the writer to ``entry()``, one JSON form, every schema readable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tunectl.core.keys import make_key
from tunectl.runtime import Entry, WaveRule, load_bundle
from tunectl.runtime.entries import STATISTICS, stat_columns
from tunectl.store.bundle import TaskTable, build_files, publish_local

STATIC = make_key({"dtype": "bfloat16", "window": (-1, -1), "causal": True})
RULE = WaveRule("num_splits", "batch", "kv_len", 66.0, 64, 1, 64, (4.0, 0.004, 1.5, 0.01))


def tuned(batch: int, **stats: Any) -> Entry:
    shape, config = make_key({"batch": batch, "kv_len": 1024}), make_key({"num_splits": batch})
    return Entry(STATIC, shape, config, **stats)


FULL = tuned(
    4,
    rule=RULE,
    is_default=False,
    median_us=12.5,
    p20_us=12.0,
    p80_us=13.0,
    rel_noise=0.02,
    num_samples=40,
    default_median_us=20.0,
    speedup=1.6,
    speedup_lo=1.5,
    speedup_hi=1.7,
    basis="rule",
    rounds=3,
    reason="rule: num_splits by waves",
    run_id="r1",
    served_by=make_key({"batch": 1, "kv_len": 1024}),
)


def test_a_published_entry_reads_back_as_the_same_record(tmp_path: Path) -> None:
    entries = (tuned(1, median_us=3.0, reason="measured here"), FULL)
    shapes = {"batch": {"policy": "pow2", "points": [1, 4]}, "kv_len": {"policy": "exact", "points": [1024]}}
    table = TaskTable("decode", ("causal", "dtype", "window"), shapes, entries)
    bundle = load_bundle(
        publish_local(tmp_path, "b", "1", build_files("b", "1", [table], [], {})), env_policy="off"
    )
    assert tuple(bundle.entries("decode")) == entries
    assert bundle.entry("decode", dtype="torch.bfloat16", window=None, causal=1, batch=3, kv_len=1024) == FULL


def test_the_json_form_keeps_every_field_and_lists_for_tuples() -> None:
    doc = FULL.to_json()
    assert doc["static"] == {"causal": True, "dtype": "bfloat16", "window": [-1, -1]}
    assert doc["rule"] == RULE.to_json() and doc["served_by"] == {"batch": 1, "kv_len": 1024}
    assert set(doc) == {"static", "shape", "config", "rule", *STATISTICS}
    assert Entry.from_json(json.loads(json.dumps(doc))) == FULL


def test_a_statistic_this_version_does_not_name_is_kept_as_read() -> None:
    entry = Entry.from_json({"static": {}, "shape": {}, "config": {}, "median_us": 1.0, "p50_us": [1, 2]})
    assert entry.median_us == 1.0 and entry.extra == (("p50_us", (1, 2)),)
    assert entry.to_json()["p50_us"] == [1, 2]
    assert stat_columns([entry, tuned(1)])["p50_us"] == [[1, 2], None]


def test_statistics_an_older_bundle_did_not_record_read_as_their_defaults() -> None:
    entry = Entry.from_json({"static": {}, "shape": {"batch": 1}, "config": {"s": 1}, "is_default": None})
    assert (entry.is_default, entry.reason, entry.median_us, entry.served_by, entry.rule) == (
        False,
        "",
        None,
        None,
        None,
    )


values = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5))


@given(
    static=st.dictionaries(st.text("abc", min_size=1, max_size=5), values, max_size=4),
    median_us=st.one_of(st.none(), st.floats(0.1, 1e6)),
    reason=st.text(max_size=20),
)
def test_json_round_trips(static: dict[str, object], median_us: float | None, reason: str) -> None:
    entry = Entry(make_key(static), (("batch", 2),), (("s", 1),), median_us=median_us, reason=reason)
    assert Entry.from_json(json.loads(json.dumps(entry.to_json()))) == entry
