"""Importing Inductor's FlexAttention autotuning logs: both layouts, rows, winners, kernel_options, the CLI.

The torch 2.11 logs under data/flex_logs/ are real (an H200); the torch 2.13 one is written by hand
after torch 2.13's writer (data/flex_logs/README.md says how each was made).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.core.errors import UserError
from tunectl.core.keys import key_dict, key_from_text
from tunectl.decide.select import select_winners
from tunectl.formats.flexlog import TASK, import_flex_log, parse_flex_log
from tunectl.store.results import read_results
from tunectl.store.runs import list_runs

DATA = Path(__file__).parents[1] / "data" / "flex_logs"
STATIC_LOG = DATA / "torch211-h200-forward-backward.json"
DYNAMIC_LOG = DATA / "torch211-h200-dynamic.json"
NAMED_LOG = DATA / "torch213-named.json"


def _tuple_log(*entries: tuple[str, list[dict[str, object]]]) -> str:
    return json.dumps([{key: choices} for key, choices in entries], indent=4)


def _triton(time_ms: float, block_m: int, **more: object) -> dict[str, object]:
    return {
        "type": "triton",
        "time": time_ms,
        "num_warps": 4,
        "num_stages": 3,
        "BLOCK_M": block_m,
        "BLOCK_N": 64,
        "USE_TMA": False,
        **more,
    }


FWD_KEY = "('forward', 1, 16, 4, 4096, 4096, 128, 128)"


# -- parsing whole logs --------------------------------------------------------------------------------


def test_a_real_torch_211_log_parses_with_sizes_in_the_writers_order() -> None:
    forward, backward = parse_flex_log(STATIC_LOG.read_text(), "log.json")
    sizes = {
        "batch": 2,
        "num_q_heads": 8,
        "num_kv_heads": 2,
        "q_len": 1024,
        "kv_len": 1024,
        "qk_head_dim": 64,
        "v_head_dim": 64,
    }
    assert (forward.kernel, dict(forward.sizes)) == ("forward", sizes)
    assert (backward.kernel, dict(backward.sizes)) == ("backward", sizes)
    assert (len(forward.choices), len(backward.choices)) == (6, 13)
    first = forward.choices[0]
    assert first.type == "triton" and first.time_ms == pytest.approx(0.034752000123262405)
    assert key_dict(first.config) == {
        "type": "triton",
        "num_warps": 4,
        "num_stages": 3,
        "BLOCK_M": 64,
        "BLOCK_N": 128,
        "USE_TMA": False,
        "kpack": 2,
        "matrix_instr_nonkdim": 0,
        "waves_per_eu": 0,
    }
    assert {"BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2"} <= set(key_dict(backward.choices[0].config))
    assert key_dict(forward.static) == {
        "kernel": "forward",
        "num_q_heads": 8,
        "num_kv_heads": 2,
        "qk_head_dim": 64,
        "v_head_dim": 64,
    }
    assert key_dict(forward.shape) == {"batch": 2, "q_len": 1024, "kv_len": 1024}


def test_symbolic_sizes_stay_their_symbols() -> None:
    first, second = parse_flex_log(DYNAMIC_LOG.read_text(), "log.json")
    assert key_dict(first.shape) == {"batch": "s5", "q_len": "s37", "kv_len": "s37"}
    assert key_dict(second.shape) == {"batch": "s5", "q_len": "s37", "kv_len": "s0"}
    assert key_dict(first.static)["num_q_heads"] == 4


def test_the_named_layout_reads_sizes_from_the_shapes_and_a_decode_query_as_5d() -> None:
    forward, backward, decode = parse_flex_log(NAMED_LOG.read_text(), "log.json")
    assert (
        dict(forward.sizes)
        == dict(backward.sizes)
        == {
            "batch": 2,
            "num_q_heads": 32,
            "num_kv_heads": 8,
            "q_len": 2048,
            "kv_len": 2048,
            "qk_head_dim": 128,
            "v_head_dim": 128,
        }
    )
    # the choices repeat Hq=8 and seq_len_q=4 (the 5-D view's heads and group): the shapes say 32 and 1
    assert dict(decode.sizes) == {
        "batch": 4,
        "num_q_heads": 32,
        "num_kv_heads": 8,
        "q_len": 1,
        "kv_len": 4096,
        "qk_head_dim": 128,
        "v_head_dim": 128,
    }
    extern, failed = forward.choices[3], forward.choices[4]
    assert key_dict(extern.config) == {"type": "extern"}
    assert math.isinf(failed.time_ms)
    assert "Hq" not in key_dict(forward.choices[0].config) and "kernel_type" not in key_dict(
        decode.choices[0].config
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "log.json: not JSON"),
        ('{"a": 1}', "log.json: a FlexAttention log is a JSON list of entries, not a dict"),
        ("[]", "log.json: the log has no entries"),
        (
            _tuple_log((FWD_KEY, []), ("__import__('os')", [])),
            "log.json: entry 2: key \"__import__('os')\": unexpected \"__import__('os')\" at column 1",
        ),
        (_tuple_log(("(1, 2) + (3,)", [])), "entry 1: key '(1, 2) + (3,)': unexpected '(1, 2) + (3,)'"),
        (
            _tuple_log(("('forward', 1, 16, 4, 4096, 4096, 128)", [])),
            """entry 1: key "('forward', 1, 16, 4, 4096, 4096, 128)" is not a tuple (kernel, batch""",
        ),
        (
            _tuple_log(("(forward, 1, 16, 4, 4096, 4096, 128, 128)", [])),
            "kernel must be one of forward, backward, decode",
        ),
        (_tuple_log(("('forward', 1, 16, 4, '4096', 4096, 128, 128)", [])), "q_len must be a size"),
        (
            _tuple_log((FWD_KEY, [{"type": "triton"}])),
            "entry 1: choice 1: 'time' must be a number of ms, not None",
        ),
        (
            _tuple_log((FWD_KEY, [_triton(0.1, 64), _triton(0.2, {"x": 1})])),
            "entry 1: choice 2: BLOCK_M: dict",
        ),
        (
            _tuple_log((FWD_KEY, [{"type": "triton", "time": True}])),
            "'time' must be a number of ms, not True",
        ),
        (json.dumps([{FWD_KEY: {"type": "triton"}}]), "entry 1: the choices must be a list, not a dict"),
        (json.dumps([{"(1, 2, 3)": [], "kernel_type": "mm"}]), "entry 1: expected"),
        (json.dumps([["forward"]]), "entry 1: expected"),
        (
            json.dumps(
                [
                    {
                        "kernel_type": "forward",
                        "query_shape": "[2, 8, 64]",
                        "key_shape": "[2, 8, 64, 64]",
                        "value_shape": "[2, 8, 64, 64]",
                        "choices": [],
                    }
                ]
            ),
            "entry 1: query_shape '[2, 8, 64]' is not a list of 4 integer sizes",
        ),
        (json.dumps([{"kernel_type": "prefill", "choices": []}]), "entry 1: the kernel must be one of"),
    ],
)
def test_a_bad_log_names_the_file_and_the_entry(text: str, words: str) -> None:
    with pytest.raises(UserError) as err:
        parse_flex_log(text, "log.json")
    assert words in str(err.value)
    assert str(err.value).startswith("log.json: ") and "\n" not in str(err.value)


# -- importing -----------------------------------------------------------------------------------------


def test_every_choice_becomes_a_row_with_its_keys_and_median(tmp_path: Path) -> None:
    res = import_flex_log(NAMED_LOG, tmp_path / "res")
    assert (res.num_entries, res.num_choices, res.rows_written, res.num_failed, res.num_replaced) == (
        3,
        9,
        9,
        1,
        0,
    )
    rows = read_results(tmp_path / "res", run_ids=[res.run_id])
    assert len(rows) == 9 and {r.task for r in rows} == {TASK} and {r.phase for r in rows} == {"import"}
    by_config = {(key_dict(key_from_text(r.static_key))["kernel"], r.config_key): r for r in rows}
    extern = by_config[("forward", '{"type":"extern"}')]
    assert extern.status == "ok" and extern.median_us == pytest.approx(331.2)
    assert extern.p20_us == extern.p80_us == extern.median_us
    assert extern.is_default is False and extern.num_samples is None
    assert key_dict(key_from_text(extern.shape_key)) == {"batch": 2, "q_len": 2048, "kv_len": 2048}
    assert key_dict(key_from_text(extern.static_key)) == {
        "kernel": "forward",
        "num_q_heads": 32,
        "num_kv_heads": 8,
        "qk_head_dim": 128,
        "v_head_dim": 128,
    }
    (failed,) = [r for r in rows if r.status != "ok"]
    assert failed.status == "error" and failed.median_us is None and "inf ms" in failed.message
    assert key_dict(key_from_text(failed.config_key))["BLOCK_N"] == 128
    (run,) = list_runs(tmp_path / "res")
    assert (run.run_id, run.task, run.state, run.num_planned, run.spec_text) == (
        res.run_id,
        TASK,
        "finished",
        9,
        "",
    )


def test_importing_a_file_again_into_its_run_replaces_its_rows(tmp_path: Path) -> None:
    first = import_flex_log(STATIC_LOG, tmp_path)
    again = import_flex_log(STATIC_LOG, tmp_path, run_id=first.run_id)
    assert again.run_id == first.run_id and again.rows_written == 19
    assert len(read_results(tmp_path)) == 19
    assert [r.num_planned for r in list_runs(tmp_path)] == [19]
    other = import_flex_log(STATIC_LOG, tmp_path)
    assert other.run_id != first.run_id and len(read_results(tmp_path)) == 38


def test_a_config_logged_again_later_at_a_point_replaces_the_earlier(tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    log.write_text(
        _tuple_log((FWD_KEY, [_triton(0.2, 64), _triton(0.3, 128)]), (FWD_KEY, [_triton(0.25, 64)]))
    )
    res = import_flex_log(log, tmp_path / "res")
    assert (res.num_choices, res.rows_written, res.num_replaced) == (3, 2, 1)
    medians = sorted(r.median_us for r in read_results(tmp_path / "res"))
    assert medians == pytest.approx([250.0, 300.0])


def test_winners_are_the_fastest_choice_of_each_kernel_and_point(tmp_path: Path) -> None:
    res = import_flex_log(DYNAMIC_LOG, tmp_path)
    winners = {w.shape: w for w in select_winners(read_results(tmp_path, run_ids=[res.run_id]))}
    entries = parse_flex_log(DYNAMIC_LOG.read_text(), "log.json")
    assert len(winners) == len(entries) == 2
    for entry, logged in zip(entries, json.loads(DYNAMIC_LOG.read_text()), strict=True):
        ((_, choices),) = logged.items()
        best = min(choices, key=lambda c: c["time"])
        winner = winners[entry.shape]
        assert winner.task == TASK and winner.median_us == pytest.approx(best["time"] * 1000)
        assert dict(winner.config) == {k: v for k, v in best.items() if k != "time"}


def test_winners_command_shows_an_imported_run(tmp_path: Path) -> None:
    res = import_flex_log(STATIC_LOG, tmp_path)
    out = CliRunner().invoke(app, ["winners", "--results", str(tmp_path), "--run", res.run_id])
    assert out.exit_code == 0 and "winners: inductor_flex" in out.output, out.output


def test_kernel_options_hold_each_points_winners_prefixed_by_kernel(tmp_path: Path) -> None:
    res = import_flex_log(NAMED_LOG, tmp_path / "res", options_out=tmp_path / "opts")
    assert res.options is not None and res.options.num_entries == 2 and res.options.skipped == {}
    base = tmp_path / "opts" / TASK
    static = "num_kv_heads=8,num_q_heads=32,qk_head_dim=128,v_head_dim=128"
    prefill = json.loads((base / f"{static}__batch=2,kv_len=2048,q_len=2048.json").read_text())
    assert prefill == {
        "fwd_BLOCK_M": 128,
        "fwd_BLOCK_N": 64,
        "fwd_USE_TMA": True,
        "fwd_num_stages": 3,
        "fwd_num_warps": 8,
        "bwd_BLOCK_M1": 64,
        "bwd_BLOCK_N1": 128,
        "bwd_BLOCK_M2": 128,
        "bwd_BLOCK_N2": 64,
        "bwd_USE_TMA": False,
        "bwd_num_stages": 2,
        "bwd_num_warps": 8,
    }
    decode = json.loads((base / f"{static}__batch=4,kv_len=4096,q_len=1.json").read_text())
    assert decode == {"fwd_BLOCK_M": 16, "fwd_BLOCK_N": 64, "fwd_num_stages": 1, "fwd_num_warps": 4}
    assert sorted(p.name for p in base.iterdir()) == sorted(p.name for p in res.options.files)


def test_an_extern_winner_writes_no_kernel_options(tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    log.write_text(_tuple_log((FWD_KEY, [{"type": "extern", "time": 0.1}, _triton(0.2, 64)])))
    res = import_flex_log(log, tmp_path / "res", options_out=tmp_path / "opts")
    assert res.options is not None and res.options.files == []
    assert res.options.skipped == {
        "the forward winner is an extern choice, which kernel_options cannot ask for": 1
    }


# -- the command ---------------------------------------------------------------------------------------


def test_the_command_imports_and_writes_options(tmp_path: Path) -> None:
    args = ["import", "flex-log", str(STATIC_LOG), "--results", str(tmp_path / "res")]
    out = CliRunner().invoke(app, [*args, "--options-out", str(tmp_path / "opts")])
    assert out.exit_code == 0, out.output
    (run,) = list_runs(tmp_path / "res")
    assert f"imported 19 choices of 2 entries from {STATIC_LOG} into run {run.run_id}: 19 rows" in out.output
    assert "wrote 1 kernel_options in 1 file(s)" in out.output
    again = CliRunner().invoke(app, [*args, "--run", run.run_id])
    assert again.exit_code == 0 and len(read_results(tmp_path / "res")) == 19


def _bad(tmp_path: Path, name: str, text: str | None) -> Path:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("missing.json", None, "missing.json: no such file"),
        ("log.json", "[{", "log.json: not JSON"),
        ("log.json", json.dumps({"entries": []}), "log.json: a FlexAttention log is a JSON list"),
        (
            "log.json",
            _tuple_log((FWD_KEY, [_triton(0.1, 64)]), ("__import__('os')", [])),
            "log.json: entry 2: key",
        ),
        (
            "log.json",
            _tuple_log((FWD_KEY, [_triton(0.1, 64), {"time": 1}])),
            "log.json: entry 1: choice 2: 'type'",
        ),
    ],
    ids=["missing", "not-json", "not-a-list", "code-as-key", "choice-without-type"],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(
    tmp_path: Path, name: str, text: str | None, words: str
) -> None:
    path = _bad(tmp_path, name, text)
    args = [
        "import",
        "flex-log",
        str(path),
        "--results",
        str(tmp_path / "res"),
        "--options-out",
        str(tmp_path / "o"),
    ]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2, out.output
    assert out.output.startswith("error: ") and words in out.output and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1
    assert not (tmp_path / "res").exists() and not (tmp_path / "o").exists()


def test_a_missing_file_points_at_the_json_inductor_wrote(tmp_path: Path) -> None:
    (tmp_path / "flex.json").write_text(STATIC_LOG.read_text())
    out = CliRunner().invoke(
        app, ["import", "flex-log", str(tmp_path / "flex"), "--results", str(tmp_path / "r")]
    )
    assert out.exit_code == 2 and f"Inductor writes {tmp_path / 'flex.json'}" in out.output


def test_importing_into_a_tuning_run_or_an_unknown_run_is_refused(tmp_path: Path) -> None:
    from tunectl.store.runs import RunInfo, save_run

    save_run(tmp_path, RunInfo("r-tuned", "tiny", "flash_decode", "tiny.toml", "", "finished", 1, 0.0, 0.0))
    for run, words in (("r-tuned", "run r-tuned is a flash_decode run"), ("r-none", "no run 'r-none'")):
        out = CliRunner().invoke(
            app, ["import", "flex-log", str(STATIC_LOG), "--results", str(tmp_path), "--run", run]
        )
        assert out.exit_code == 2 and words in out.output, out.output
    assert not list(tmp_path.glob("task=*"))
