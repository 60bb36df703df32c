"""What a run's console says in few lines: the skipped points, and the messages kept in the run's log."""

from __future__ import annotations

from rich.console import Console

from tunectl.cli.submit import _print_skipped
from tunectl.orchestrator.notes import Note, summary_lines

STATIC = (("dtype", "bfloat16"), ("page_size", 16))


def _printed(skipped: list[tuple[object, object, str]]) -> list[str]:
    console = Console(record=True, width=80)
    _print_skipped(console, skipped)
    return console.export_text().splitlines()


def test_skipped_points_of_one_static_key_are_a_short_line_each() -> None:
    skipped = [
        (STATIC, (("batch", 128), ("kv_len", 32768)), "the KV cache would take 16.0 GiB (limit 8)"),
        (STATIC, (("batch", 256), ("kv_len", 32768)), "the KV cache would take 32.0 GiB (limit 8)"),
    ]
    assert _printed(skipped) == [
        "skipped batch=128 kv_len=32768: the KV cache would take 16.0 GiB (limit 8)",
        "skipped batch=256 kv_len=32768: the KV cache would take 32.0 GiB (limit 8)",
    ]


def test_skipped_points_name_the_static_key_where_there_are_several_and_stop_at_five() -> None:
    other = (("dtype", "bfloat16"), ("page_size", 128))
    skipped = [(STATIC if i % 2 else other, (("batch", i),), "too big") for i in range(7)]
    lines = _printed(skipped)
    assert lines[0] == "skipped dtype=bfloat16 page_size=128 batch=0: too big"
    assert lines[1] == "skipped dtype=bfloat16 page_size=16 batch=1: too big"
    assert lines[5:] == ["skipped 2 more point(s) the task cannot run"] and len(lines) == 6


def test_the_messages_of_all_kinds_are_counted_in_one_line_commonest_first() -> None:
    notes = [
        Note("printed", "x", 3636, "worker"),
        Note("tunectl.flex", "y", 6, "c1"),
        Note("UserWarning", "z", 2, "c2"),
    ]
    assert summary_lines(notes, "tunectl logs r1") == [
        "3,644 message(s) from worker and compile processes (3,636 printed, 6 tunectl.flex, 2 UserWarning);"
        " `tunectl logs r1` shows them"
    ]
    many = [Note(f"kind{i}", "t", 1, "w") for i in range(7)]
    assert "(1 kind0, 1 kind1, 1 kind2, 1 kind3, 1 kind4, 2 more kind(s))" in summary_lines(many, "w")[0]
    assert summary_lines([], "w") == []
