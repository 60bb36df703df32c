"""Selection: only ok configs compete; the default keeps its place within the noise."""

from __future__ import annotations

from typing import Any

from tunectl.select import select_winners


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
        "run_id": "r",
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
    [w] = select_winners(rows)
    assert dict(w.config) == {"backend": "flex"}
