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


def test_a_workers_waits_for_device_memory_are_summed_in_a_line_of_their_own() -> None:
    """A worker's waits for memory fall under "other" in its line; the console says how long they took.
    (An H100 run spent 154 s of its span so, waiting for memory other processes' contexts held.)"""
    torch_says = "CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of 79.18 GiB"
    waited = "out of device memory on cuda:0, waited {} s of up to {} s: " + torch_says
    refused = "out of device memory on cuda:0, not waiting: it asks 16.00 GiB where"
    notes = [
        Note("tunectl.worker", waited.format("4.00", "4.00"), 15, "w"),
        Note("tunectl.worker", waited.format("0.35", "4.00"), 1, "w"),
        Note("tunectl.worker", waited.format("0.00", "0.50"), 2, "w"),  # the others let go at once
        Note("tunectl.worker", refused, 1, "w"),
        Note("tunectl.flex", "waited 4.00 s of up to 4.00 s", 3, "c1"),
    ]
    assert summary_lines(notes, "tunectl logs r1")[1:] == [
        "out of device memory: 18 wait(s) for memory other processes held, 60.4 s in all; "
        "1 request(s) failed at once, as no process could make room"
    ]
    assert len(summary_lines(notes[4:], "w")) == 1, "no line of its own without a worker's request"


def test_a_workers_ready_line_says_where_its_start_up_went() -> None:
    from tunectl.orchestrator.slots import startup_text

    startup = {
        "process_s": 2.0,
        "imports_s": 3.0,
        "device_s": 1.25,
        "libraries": {"flashinfer": 5.0, "flash_attn.cute": 8.0, "flash_attn": 0.5},
        "total_s": 19.75,
    }
    assert startup_text(startup) == (
        "; start-up 19.8 s: process 2.0, imports 3.0, device 1.2, libraries 13.5"
        " (flash_attn.cute 8.0, flashinfer 5.0, flash_attn 0.5)"
    )
    assert startup_text({**startup, "libraries": {}}).endswith("libraries 0.0")
    assert startup_text(None) == ""


def test_warming_up_libraries_times_each_import_that_succeeds() -> None:
    from tunectl.tasks.compile import warm_up_libraries

    took = warm_up_libraries(("json", "tunectl_no_such_module", "email.mime.text"))
    assert set(took) == {"json", "email.mime.text"} and all(s >= 0.0 for s in took.values())
