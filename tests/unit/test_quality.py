"""Measurement quality in words: `winners`, `submit` and `validate` end with a line counting
drift-flagged rows, full measurements under min_samples and points noisier than the target; a table's
! column marks the points whose decision rests on such rows, and a one-sample row's noise reads as
unknown, never 0.0 %."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from tests.conftest import TINY_SPEC
from tests.finished_run import RUN, finished_run
from tunectl.api import ValidationRun
from tunectl.cli import app
from tunectl.cli.submit import _print_summary
from tunectl.cli.validate import print_validation
from tunectl.core.plan import plan
from tunectl.core.record import Phase, Record
from tunectl.core.spec import parse_spec
from tunectl.decide.stacked import read_validation
from tunectl.orchestrator.submit import SubmitResult
from tunectl.store.results import ResultsWriter, read_results
from tunectl.store.runs import RunInfo, save_run

SHAPE = '{{"batch":{},"kv_len":64}}'


def _device(row: Record) -> Record:
    """At batch 1 the finals drifted; at batch 2 they took 2 samples (min_samples is 3); at batch 4
    they were noisier (20 %) than the target (1 %)."""
    if row.phase is not Phase.FINAL:
        return row
    if row.shape_key == SHAPE.format(1):
        return dataclasses.replace(row, drift=True)
    if row.shape_key == SHAPE.format(2):
        return dataclasses.replace(row, num_samples=2)
    if row.shape_key == SHAPE.format(4):
        return dataclasses.replace(row, rel_noise=0.2)
    return row


def run(*args: str) -> object:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "160"})


def _flat(text: str) -> str:
    """``text`` with every run of whitespace (a wrapped line's break) as one space."""
    return " ".join(text.split())


def _marks(output: str) -> dict[str, str]:
    """Per table row of the winners (by its batch and kv_len), the ! column's letters."""
    out = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 2 and cells[1].startswith("batch="):
            out[cells[1]] = cells[-2]
    return out


def test_winners_mark_the_points_resting_on_flagged_rows_and_end_with_the_count(tmp_path: Path) -> None:
    results = finished_run(tmp_path / "results", TINY_SPEC, _device)
    rows = read_results(results)
    out = run("winners", "--results", str(results))
    assert out.exit_code == 0, out.output
    assert _marks(out.output) == {
        "batch=1 kv_len=64": "d",
        "batch=2 kv_len=64": "s",
        "batch=4 kv_len=64": "n",
        "batch=1 kv_len=128": "",
        "batch=2 kv_len=128": "",
        "batch=4 kv_len=128": "",
    }
    assert (
        "!: d a compared row was drift-flagged; s fewer samples than min_samples; n noise over" in out.output
    )
    finals_at = {
        n: sum(r.phase is Phase.FINAL and r.shape_key == SHAPE.format(n) for r in rows) for n in (1, 2)
    }
    full = sum(r.phase is not Phase.SCREEN for r in rows)
    assert _flat(out.output).endswith(
        f"measurement quality: {finals_at[1]} of {len(rows)} ok rows drift-flagged; {finals_at[2]} of {full} "
        "full measurements and comparison arms under min_samples (screening looks not counted); "
        "1 of 6 points noisier than noise_target"
    )
    advice = "3 of 6 winners rest on flagged rows (column !): measure them again on an idle device (d)"
    assert advice in _flat(out.output)


def test_screening_looks_are_not_counted_against_min_samples(tmp_path: Path) -> None:
    halving = TINY_SPEC + "strategy = 'halving'\nmin_budget = 0.25\neta = 2\n"

    def short_looks(row: Record) -> Record:
        return dataclasses.replace(row, num_samples=1) if row.phase is Phase.SCREEN else row

    results = finished_run(tmp_path / "results", halving, short_looks)
    rows = read_results(results)
    assert any(r.phase is Phase.SCREEN for r in rows)
    out = run("winners", "--results", str(results))
    full = sum(r.phase is not Phase.SCREEN for r in rows)
    assert f"0 of {full} full measurements and comparison arms under min_samples" in out.output
    assert "rest on flagged rows" not in out.output


def test_a_one_sample_winner_shows_its_noise_as_unknown(tmp_path: Path) -> None:
    no_finals = TINY_SPEC.replace("rounds = 3", "finalists = 0")

    def one_sample(row: Record) -> Record:
        return dataclasses.replace(row, num_samples=1, rel_noise=0.0)

    results = finished_run(tmp_path / "results", no_finals, one_sample)
    out = run("winners", "--results", str(results))
    assert out.exit_code == 0, out.output
    assert "±?" in out.output and "±0.0%" not in out.output
    assert "±?: one sample, its noise unknown" in out.output


def test_submit_ends_with_the_count_line(tmp_path: Path) -> None:
    results = finished_run(tmp_path / "results", TINY_SPEC, _device)
    console = Console(record=True, width=200)
    done = SubmitResult(RUN, None, 0, plan=plan(parse_spec(TINY_SPEC, "tiny.toml")))
    _print_summary(console, done, results)
    text = _flat(console.export_text())
    ending = text[text.index("results: ") :]
    assert "3 of 6 winners rest on flagged rows (column !)" in ending
    assert ending.endswith("; 1 of 6 points noisier than noise_target")
    assert ending.rindex("measurement quality: ") > ending.index("rest on flagged rows"), (
        "the count comes last"
    )


def _arm(batch: int, arm: int, *, drift: bool) -> Record:
    """One arm of a validation at batch ``batch``: the default (arm 0) or the bundle's config."""
    speedup = {"speedup": 1.1, "speedup_lo": 1.05, "speedup_hi": 1.15} if arm else {"speedup": 1.0}
    return Record(
        run_id="rv",
        item_id=f"v{batch}-{arm}",
        task="decode_attention",
        static_key='{"d":1}',
        shape_key=SHAPE.format(batch),
        config_key=f'{{"num_splits":{arm + 1}}}',
        is_default=arm == 0,
        status="ok",
        phase="validate",
        group_id=f"g{batch}",
        median_us=10.0,
        rel_noise=0.005,
        num_samples=20,
        layers=4,
        rounds=5,
        drift=drift,
        finished_at=1.0,
        **speedup,
    )


def test_validate_marks_flagged_comparisons_and_ends_with_the_count_line(tmp_path: Path) -> None:
    results = tmp_path / "results"
    rows = [_arm(batch, arm, drift=batch == 1) for batch in (1, 2) for arm in (0, 1)]
    writer = ResultsWriter(results)
    writer.append_item(rows)
    writer.close()
    info = RunInfo(
        "rv", "tiny", "decode_attention", "t.toml", TINY_SPEC, "finished", 4, 0.0, 1.0, kind="validate"
    )
    save_run(results, info)
    console = Console(record=True, width=200)
    print_validation(console, [ValidationRun("rv", "tiny.toml", read_validation(rows), ())], results)
    printed = console.export_text()
    text = _flat(printed)
    assert text.endswith(
        "measurement quality: 2 of 4 ok rows drift-flagged; 0 of 4 full measurements and comparison arms "
        "under min_samples (screening looks not counted); 0 of 2 points noisier than noise_target"
    )
    assert (
        "1 of 2 points rest on flagged rows (column !)" in text and "then validate those points again" in text
    )
    [marked] = [ln for ln in printed.splitlines() if "batch=1" in ln]
    assert marked.rstrip(" │").endswith("d")


def test_the_count_says_how_many_configs_read_far_apart_between_their_looks(tmp_path: Path) -> None:
    """At batch 1 every rung-1 look met a slowdown (12 % slow, bands tight) that nothing flagged."""
    halving = TINY_SPEC + "strategy = 'halving'\nmin_budget = 0.25\neta = 2\n"

    def slowed(row: Record) -> Record:
        row = dataclasses.replace(row, worker="node:1")
        if row.phase is Phase.SCREEN and row.rung == 1 and row.shape_key == SHAPE.format(1):
            t = (row.median_us or 0.0) * 1.12
            return dataclasses.replace(row, median_us=t, p20_us=t * 0.99, p80_us=t * 1.01)
        return row

    results = finished_run(tmp_path / "results", halving, slowed)
    rows = read_results(results)
    slowed_looks = {r.config_key for r in rows if r.rung == 1 and r.shape_key == SHAPE.format(1)}
    looked = {(r.shape_key, r.config_key) for r in rows if r.rung == 1}
    out = run("winners", "--results", str(results))
    assert out.exit_code == 0, out.output
    assert slowed_looks and (
        f"{len(slowed_looks)} of {len(looked)} configs looked at twice at a point read more than 5 % apart "
        "beyond their own noise, unflagged"
    ) in _flat(out.output)


OOM = (
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has a total capacity of"
    " 79.18 GiB of which 3.57 GiB is free. Including non-PyTorch memory, this process has 73.18 GiB"
)


def _failing(row: Record) -> Record:
    """Every non-final look of num_splits=2 with expand ran out of memory at batch 4; one timed out."""
    if row.phase is Phase.FINAL or '"num_splits":2' not in row.config_key:
        return row
    if row.shape_key == SHAPE.format(4) and '"gqa":"expand"' in row.config_key:
        return dataclasses.replace(row, status="error", message=OOM, median_us=None)
    if row.shape_key == SHAPE.format(1) and '"gqa":"grouped"' in row.config_key:
        return dataclasses.replace(row, status="timeout", message="ran past its deadline of 5.0 s")
    return row


def test_submit_names_the_measurements_that_failed_as_they_ran_by_kind(tmp_path: Path) -> None:
    results = finished_run(tmp_path / "results", TINY_SPEC, _failing)
    rows = read_results(results)
    failed = [r for r in rows if r.status in ("error", "timeout")]
    oom = sum(r.status == "error" for r in rows)
    assert oom >= 1 and len(failed) > oom, "the simulated device failed both ways"
    console = Console(record=True, width=400)
    done = SubmitResult(RUN, None, 0, plan=plan(parse_spec(TINY_SPEC, "tiny.toml")))
    _print_summary(console, done, results)
    lines = [line.strip() for line in console.export_text().splitlines()]
    lists = f"`tunectl failures --run {RUN} --results {results}`"
    head = f"{len(failed)} measurement(s) failed as they ran; {lists}"
    at = lines.index(next(line for line in lines if line.startswith(head)))
    kinds = lines[at + 1 : at + 3]
    by_count = sorted([(oom, "error"), (len(failed) - oom, "timeout")], key=lambda kind: (-kind[0], kind[1]))
    assert [k.split(":")[0] for k in kinds] == [f"{n} {s}" for n, s in by_count], "commonest first"
    error = next(k for k in kinds if " error: " in k)
    assert "Tried to allocate 16.00 GiB" in error and error.endswith("batch=4 kv_len=64)")
    assert "gqa=expand num_splits=2" in error and "…" in error, "a long message is cut"


def test_submit_says_nothing_of_failures_where_none_ran(tmp_path: Path) -> None:
    results = finished_run(tmp_path / "results", TINY_SPEC, _device)
    console = Console(record=True, width=400)
    done = SubmitResult(RUN, None, 0, plan=plan(parse_spec(TINY_SPEC, "tiny.toml")))
    _print_summary(console, done, results)
    assert "failed as they ran" not in console.export_text()
