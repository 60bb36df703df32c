"""Selection: only ok configs compete; the default keeps its place within the noise."""

from __future__ import annotations

from typing import Any

from tests.data.v1.make import SPEC as V1_SPEC
from tunectl.core.plan import plan, selectable_in
from tunectl.core.record import Record
from tunectl.core.spec import parse_spec
from tunectl.decide.select import select_winners as select_records


def select_winners(rows: list[dict[str, Any]], **options: Any) -> Any:
    """Selection over the records these stored rows read as."""
    return select_records([Record.from_row(r) for r in rows], **options)


def _row(
    config: str,
    median: float | None,
    noise: float = 0.01,
    default: bool = False,
    status: str = "ok",
    shape: str = '{"batch":1}',
    finished: float = 1.0,
) -> dict[str, Any]:
    return {
        "run_id": "r",
        "item_id": f"{config}@{shape}",
        "task": "t",
        "device_name": "gpu",
        "static_key": '{"d":1}',
        "shape_key": shape,
        "config_key": config,
        "is_default": default,
        "status": status,
        "median_us": median,
        "p20_us": median,
        "p80_us": median,
        "rel_noise": noise,
        "num_samples": 10,
        "finished_at": finished,
    }


def test_faster_beyond_noise_wins() -> None:
    [w] = select_winners([_row('{"c":0}', 100.0, default=True), _row('{"c":1}', 80.0)])
    assert dict(w.config) == {"c": 1} and w.speedup == 100.0 / 80.0 and not w.is_default


def test_default_wins_a_tie_within_the_noise() -> None:
    [w] = select_winners([_row('{"c":0}', 100.0, 0.05, default=True), _row('{"c":1}', 97.0, 0.05)])
    assert w.is_default and w.speedup == 1.0


def test_wrong_or_failed_configs_never_win() -> None:
    rows = [
        _row('{"c":0}', 100.0, default=True),
        _row('{"c":1}', 1.0, status="wrong_result"),
        _row('{"c":2}', None, status="error"),
        _row('{"c":3}', 90.0),
    ]
    [w] = select_winners(rows)
    assert dict(w.config) == {"c": 3} and w.num_failed == 2


def test_ties_break_the_same_way_whatever_the_row_order() -> None:
    rows = [_row('{"c":0}', 100.0, default=True), _row('{"c":2}', 50.0), _row('{"c":1}', 50.0)]
    assert select_winners(rows)[0].config == select_winners(rows[::-1])[0].config == (("c", 1),)


def test_the_latest_measurement_of_a_config_counts() -> None:
    rows = [
        _row('{"c":0}', 100.0, default=True),
        _row('{"c":1}', 50.0, finished=1.0),
        _row('{"c":1}', 150.0, finished=2.0),
    ]
    assert select_winners(rows)[0].is_default


def test_points_are_ordered_by_value_not_text() -> None:
    rows = [_row('{"c":0}', 1.0, default=True, shape=f'{{"batch":{b}}}') for b in (16, 4, 1)]
    assert [dict(w.shape)["batch"] for w in select_winners(rows)] == [1, 4, 16]


def test_a_config_the_task_marks_reference_only_never_wins() -> None:
    rows = [_row('{"c":0}', 100.0, default=True), _row('{"c":1}', 10.0), _row('{"c":2}', 50.0)]
    [w] = select_winners(rows, selectable=lambda task, static, config: dict(config)["c"] != 1)
    assert dict(w.config) == {"c": 2} and w.num_failed == 0


def test_flash_decode_never_picks_a_kernel_that_needs_the_cache_re_paged() -> None:
    static = (
        '{"causal":true,"dtype":"bfloat16","head_dim":128,"num_kv_heads":8,"num_q_heads":32,'
        '"page_size":16,"sinks":false,"softcap":0.0,"window":[-1,-1]}'
    )
    rows = [
        {**_row('{"backend":"fa4"}', 100.0, default=True), "task": "flash_decode", "static_key": static},
        {**_row('{"backend":"fa2","kv_page_size":256}', 50.0), "task": "flash_decode", "static_key": static},
        {**_row('{"backend":"flex"}', 80.0), "task": "flash_decode", "static_key": static},
    ]
    spec = parse_spec(V1_SPEC)  # fa2 on a re-paged cache among its configs
    [w] = select_winners(rows, selectable=selectable_in([plan(spec).facts]))
    assert dict(w.config) == {"backend": "flex"}
    assert dict(select_winners(rows)[0].config) == {"backend": "fa2", "kv_page_size": 256}  # no facts: any


def _final(
    config: str, speedup: float, half: float, default: bool = False, group: str = "g1", finished: float = 2.0
) -> dict[str, Any]:
    """One arm of a finals comparison: its paired speedup over the default, +/- ``half``."""
    return {
        **_row(config, 100.0 / speedup, default=default, finished=finished),
        "phase": "final",
        "group_id": group,
        "rounds": 8,
        "speedup": 1.0 if default else speedup,
        "speedup_lo": 1.0 if default else speedup - half,
        "speedup_hi": 1.0 if default else speedup + half,
    }


def test_finals_decide_over_single_measurements() -> None:
    # Single timings say c=2 is far ahead; the interleaved finals say c=3 beats the default and c=2 does not.
    singles = [_row('{"c":1}', 100.0, default=True), _row('{"c":2}', 50.0), _row('{"c":3}', 95.0)]
    finals = [
        _final('{"c":1}', 1.0, 0.0, default=True),
        _final('{"c":2}', 1.02, 0.05),
        _final('{"c":3}', 1.10, 0.02),
    ]
    [w] = select_winners(singles + finals)
    assert dict(w.config) == {"c": 3} and w.basis == "final" and w.rounds == 8
    assert (w.speedup, w.speedup_lo, w.speedup_hi) == (1.10, 1.10 - 0.02, 1.10 + 0.02)
    assert "interval" in w.reason and "8 interleaved rounds" in w.reason


def test_the_default_stays_when_no_finalist_clears_its_interval() -> None:
    rows = [_final('{"c":1}', 1.0, 0.0, default=True), _final('{"c":2}', 1.04, 0.05)]
    [w] = select_winners(rows)
    assert w.is_default and w.speedup == 1.0 and w.basis == "final"
    assert w.speedup_lo == 1.04 - 0.05  # the best challenger's interval, for the record
    assert w.reason.startswith("default")


def test_a_margin_raises_the_bar() -> None:
    rows = [_final('{"c":1}', 1.0, 0.0, default=True), _final('{"c":2}', 1.05, 0.01)]
    assert not select_winners(rows)[0].is_default
    assert select_winners(rows, margin=0.05)[0].is_default


def test_near_ties_in_the_finals_go_to_the_first_config_in_canonical_order() -> None:
    # Two runs of the same finals in which noise swapped the order of two configs 1 % apart.
    run1 = [
        _final('{"c":1}', 1.0, 0.0, default=True),
        _final('{"c":2}', 1.30, 0.02),
        _final('{"c":3}', 1.31, 0.02),
    ]
    run2 = [
        _final('{"c":1}', 1.0, 0.0, default=True),
        _final('{"c":2}', 1.31, 0.02),
        _final('{"c":3}', 1.30, 0.02),
    ]
    assert dict(select_winners(run1)[0].config) == dict(select_winners(run2)[0].config) == {"c": 2}
    # Outside the tie tolerance the faster one wins.
    run3 = [
        _final('{"c":1}', 1.0, 0.0, default=True),
        _final('{"c":2}', 1.30, 0.02),
        _final('{"c":3}', 1.40, 0.02),
    ]
    assert dict(select_winners(run3)[0].config) == {"c": 3}
    assert dict(select_winners(run1, tie=0.0)[0].config) == {"c": 3}


def test_the_latest_finals_count() -> None:
    old = [_final('{"c":1}', 1.0, 0.0, default=True, group="a"), _final('{"c":2}', 1.5, 0.1, group="a")]
    new = [
        _final('{"c":1}', 1.0, 0.0, default=True, group="b", finished=3.0),
        _final('{"c":2}', 1.01, 0.05, group="b", finished=3.0),
    ]
    assert select_winners(old + new)[0].is_default


def test_finals_without_a_working_default_fall_back_to_single_measurements() -> None:
    finals = [{**_final('{"c":1}', 1.0, 0.0, default=True), "status": "error"}, _final('{"c":2}', 1.5, 0.1)]
    singles = [_row('{"c":1}', 100.0, default=True), _row('{"c":2}', 60.0)]
    [w] = select_winners(singles + finals)
    assert w.basis == "measure" and dict(w.config) == {"c": 2}


def test_validation_rows_never_select_and_screening_yields_to_full_measurements() -> None:
    rows = [
        _row('{"c":1}', 100.0, default=True),
        {**_row('{"c":2}', 10.0), "phase": "validate"},
        {**_row('{"c":3}', 20.0, finished=1.0), "phase": "screen"},
        {**_row('{"c":3}', 150.0, finished=0.5), "phase": "measure"},  # older, but a full measurement
    ]
    [w] = select_winners(rows)
    assert w.is_default


def test_near_ties_order_configs_by_value_not_text() -> None:
    rows = [
        _final('{"BLOCK_M":128}', 1.0, 0.0, default=True),
        _final('{"BLOCK_M":128,"num_warps":8}', 1.20, 0.01),
        _final('{"BLOCK_M":64,"num_warps":4}', 1.21, 0.01),
    ]
    assert dict(select_winners(rows)[0].config) == {"BLOCK_M": 64, "num_warps": 4}


def _at(row: dict[str, Any], batch: int) -> dict[str, Any]:
    shape = f'{{"batch":{batch}}}'
    return {**row, "shape_key": shape, "item_id": f"{row['item_id']}@{shape}", "group_id": f"g@{batch}"}


def test_a_near_tie_goes_to_the_config_that_holds_up_at_the_neighbouring_points() -> None:
    # At batch 8, c=2 and c=3 tie within 2 % (c=2 first in canonical order). At batch 4 and 16, c=2
    # is 30 % slower than the fastest and c=3 is the fastest: the shapes between them want c=3.
    finals = [_at(_final('{"c":1}', 1.0, 0.0, default=True), 8),
              _at(_final('{"c":2}', 1.31, 0.02), 8), _at(_final('{"c":3}', 1.30, 0.02), 8)]  # fmt: skip
    times = (('{"c":1}', 100.0), ('{"c":2}', 65.0), ('{"c":3}', 50.0))
    beside = [_at(_row(c, t, default=c == '{"c":1}'), b) for b in (4, 16) for c, t in times]
    winners = {w.shape: w for w in select_winners(finals + beside)}
    assert dict(winners[(("batch", 8),)].config) == {"c": 3}
    assert winners[(("batch", 8),)].reason.endswith("of 2 near-ties, chosen by neighbours")
    # Without neighbours, or where they cannot tell the near-ties apart, canonical order decides.
    assert dict(select_winners(finals)[0].config) == {"c": 2}
    assert select_winners(finals)[0].reason.endswith("of 2 near-ties, chosen by canonical order")
    even = [{**r, "median_us": 50.0} if r["config_key"] != '{"c":1}' else r for r in beside]
    assert dict({w.shape: w.config for w in select_winners(finals + even)}[(("batch", 8),)]) == {"c": 2}
    # Neighbours only break near-ties: outside the tie tolerance the faster config at the point wins.
    apart = [finals[0], _at(_final('{"c":2}', 1.40, 0.02), 8), finals[2]]
    assert dict({w.shape: w.config for w in select_winners(apart + beside)}[(("batch", 8),)]) == {"c": 2}


def test_neighbours_are_of_the_same_static_key_and_differ_in_one_dimension() -> None:
    finals = [_at(_final('{"c":1}', 1.0, 0.0, default=True), 8),
              _at(_final('{"c":2}', 1.31, 0.02), 8), _at(_final('{"c":3}', 1.30, 0.02), 8)]  # fmt: skip
    elsewhere = [{**_at(_row(c, t, default=c == '{"c":1}'), 4), "static_key": '{"d":2}'}
                 for c, t in (('{"c":1}', 100.0), ('{"c":2}', 65.0), ('{"c":3}', 50.0))]  # fmt: skip
    winners = {(w.static, w.shape): w.config for w in select_winners(finals + elsewhere)}
    assert dict(winners[((("d", 1),), (("batch", 8),))]) == {"c": 2}
