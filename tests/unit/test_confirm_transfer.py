"""Reading a confirming run's candidate times back (benchmarks/studies/confirm_transfer.py)."""

from __future__ import annotations

from benchmarks.studies import confirm_transfer


def test_each_timed_candidate_is_read_from_its_shape_line_and_summarised_by_batch_range() -> None:
    lines = [
        "seed 107: timed as graph, cold L2, difference timing",
        "seed 107: batch=1, kv_len=1920, q_len=1: chose {'backend': 'flex', 'num_stages': 3} in 8.18 s "
        "({'BLOCK_N': 128, 'backend': 'triton'} 10.6 µs; {'backend': 'flex', 'num_stages': 3} 11.3 µs)",
        "seed 108: batch=9, kv_len=1024, q_len=1: one candidate, the bundle's pick {'backend': 'fa4'}",
    ]
    found = confirm_transfer.confirmed_times(lines)
    assert found == [
        (107, 1, 1920, {"BLOCK_N": 128, "backend": "triton"}, 10.6),
        (107, 1, 1920, {"backend": "flex", "num_stages": 3}, 11.3),
    ]
    rows = [
        {"backend": "flex", "batch": 1, "ratio": 1.10},
        {"backend": "flex", "batch": 2, "ratio": 1.02},
        {"backend": "flex", "batch": 64, "ratio": 1.0},
    ]
    summary = confirm_transfer.summary(rows)
    assert summary["flex, batch 1-2"] == {
        "n": 2, "median_ratio": 1.06, "median_off": 0.06, "over_3pct": 1, "range": [1.02, 1.1]
    }  # fmt: skip
    assert summary["flex, batch 17-256"]["over_3pct"] == 0
