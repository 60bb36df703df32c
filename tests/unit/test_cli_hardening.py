"""What a user gets on the edges: a dry run and a size guard before any work, JSON for scripts,
clear errors for a wrong address, a resumed run's spec, an existing archive, a corrupt channel, a
bundle member linking outside, symbolic sizes in an import, and tables that keep ids whole at 80
columns."""

from __future__ import annotations

import json
import os
import tracemalloc
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import TINY_SPEC
from tests.unit.test_bundle import ENV, table
from tests.unit.test_results import _record
from tunectl.cli import app
from tunectl.core.errors import UserError
from tunectl.core.plan import CONFIRM_ABOVE_ITEMS, count_plan
from tunectl.core.record import Phase
from tunectl.core.spec import parse_spec
from tunectl.runtime import BundleCorruptError, load_bundle
from tunectl.store.bundle import LocalStore, build_files, list_bundles, promote, publish
from tunectl.store.results import ResultsWriter
from tunectl.store.runs import RunInfo, save_run

#: 300 batches x 300 kv lengths x 10 configs (5 splits x 2 gqa): 900,000 items, 18 times the most a
#: submit runs without --yes, far more than 16 MiB were they made
_THREE_HUNDRED = "values = [" + ", ".join(map(str, range(1, 301))) + "]"
HUGE = (
    TINY_SPEC.replace('values = [1, 2, 4]\nbucket = "pow2"', _THREE_HUNDRED + '\nbucket = "exact"')
    .replace("values = [64, 128]", _THREE_HUNDRED)
    .replace("num_splits = [1, 2]", "num_splits = [1, 2, 3, 4, 5]")
)


def run(*args: str) -> object:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})


def _results_with_a_run(tmp_path: Path, status: str = "ok") -> Path:
    root = tmp_path / "results"
    writer = ResultsWriter(root)
    for i, s in enumerate(("ok", status)):
        stats = {"p20_us": 9.0, "p80_us": 11.0, "rel_noise": 0.01, "num_samples": 10}
        rec = replace(_record("r20261201-000000-abcdef", f"i{i}", median=10.0 - i), **stats)
        message = "" if s == "ok" else "RuntimeError: injected\nsecond line"
        writer.append(replace(rec, config_key=f'{{"c":{i}}}', is_default=i == 0, status=s, message=message))
    writer.close()
    save_run(root, RunInfo("r20261201-000000-abcdef", "n", "t", "s.toml", TINY_SPEC, "finished", 2, 0.0, 0.0))
    return root


def test_dry_run_counts_per_static_key_and_estimates_from_earlier_runs(tmp_path: Path) -> None:
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY_SPEC.replace('dtype = "float32"', 'dtype = ["float32", "float64"]'))
    out = CliRunner().invoke(app, ["submit", str(spec), "--dry-run", "--results", str(tmp_path / "none")],
                             env={"COLUMNS": "300"})  # fmt: skip
    assert out.exit_code == 0, out.output
    assert (
        out.output.count("│      6 │    24 │") == 2 and "48 item(s) to measure, then 12 finals" in out.output
    )
    assert "no time estimate" in out.output and not (tmp_path / "none").exists()

    results = tmp_path / "results"
    writer = ResultsWriter(results)
    earlier = replace(_record("r1", "", task="decode_attention"), worker="w")

    def look(item: str, config: int, at: float, took: float, **more: object) -> None:
        writer.append(replace(earlier, item_id=item, config_key=f'{{"c":{config}}}', **more,  # type: ignore[arg-type]
                              started_at=at, finished_at=at + took))  # fmt: skip

    for i in range(4):  # earlier measurements of the same task (one config each), 0.5 s each, a call each
        look(f"i{i}", i, 100.0 + i, 0.5)
    for i in range(8):  # one call measuring a batch of 8 looks in 4 s: 0.5 s each, not 4
        look(f"b{i}", 10 + i, 200.0, 0.5 * (i + 1))
    for i in range(4):  # two items looked at twice each (a halving search's rungs): 0.5 s an item
        look(f"s{i}", 20 + i // 2, 300.0 + i, 0.25, phase=Phase.SCREEN, rung=i % 2)
    writer.close()
    out = CliRunner().invoke(app, ["submit", str(spec), "--dry-run", "--results", str(results)],
                             env={"COLUMNS": "300"})  # fmt: skip
    assert "estimate: 24 s of measurement on one worker" in out.output, out.output  # 48 x 0.5 s
    assert "from 16 earlier measurement(s)" in " ".join(out.output.split())


def test_a_huge_grid_is_counted_lazily_and_needs_yes(tmp_path: Path) -> None:
    spec = parse_spec(HUGE, "huge.toml")
    tracemalloc.start()
    counted = count_plan(spec)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert counted.num_items == 300 * 300 * 10 and counted.num_items > CONFIRM_ABOVE_ITEMS
    assert peak < 16 << 20, f"counting took {peak >> 20} MiB"  # points one at a time, items never made

    path, results = tmp_path / "huge.toml", tmp_path / "results"
    path.write_text(HUGE)
    out = run("submit", str(path), "--results", str(results))
    assert out.exit_code == 2 and "plans 900,000 items" in out.output and "--yes" in out.output
    assert not results.exists()
    as_job = run("submit", str(path), "--job", "--address", "http://127.0.0.1:9", "--results", "/abs/results")
    assert as_job.exit_code == 2 and "plans 900,000 items" in as_job.output, "refused before it is sent"


def test_runs_winners_and_failures_speak_json(tmp_path: Path) -> None:
    root = _results_with_a_run(tmp_path, status="error")
    runs = json.loads(run("runs", "--results", str(root), "--json").output)
    assert runs[0]["run_id"] == "r20261201-000000-abcdef" and runs[0]["counts"] == {"ok": 1, "error": 1}
    winners = json.loads(run("winners", "--results", str(root), "--json").output)
    assert winners[0]["config"] == {"c": 0} and winners[0]["is_default"] and "reason" in winners[0]
    failures = json.loads(run("failures", "--results", str(root), "--json").output)
    assert [(f["status"], f["message"]) for f in failures] == [
        ("error", "RuntimeError: injected\nsecond line")
    ]
    listed = run("failures", "--results", str(root))
    assert "RuntimeError: injected" in listed.output and "second line" not in listed.output
    assert "1 failed of 2 measurement(s)" in listed.output


def test_failures_with_none_failed_print_the_count_without_an_empty_table(tmp_path: Path) -> None:
    root = _results_with_a_run(tmp_path)  # both rows ok
    listed = run("failures", "--results", str(root))
    assert listed.exit_code == 0, listed.output
    assert " ".join(listed.output.split()) == f"0 failed of 2 measurement(s) in {root}", listed.output


def test_run_ids_stay_whole_at_80_columns(tmp_path: Path) -> None:
    root = _results_with_a_run(tmp_path, status="error")
    for command in ("runs", "failures"):
        out = run(command, "--results", str(root))
        assert "r20261201-000000-abcdef" in out.output, out.output


def test_a_validation_verdict_is_not_cropped_at_80_columns() -> None:
    from rich.console import Console

    from tunectl.cli.render import validation_table
    from tunectl.core.keys import make_key
    from tunectl.core.stats import Speedup

    class Point:
        shape = make_key({"batch": 16384, "kv_len": 131072})
        config = make_key({"backend": "flex", "BLOCK_N": 64, "num_warps": 4, "num_stages": 3})
        default_us, bundle_us, verdict = 123456.7, 100000.1, "slower"
        speedup = Speedup(0.834, 0.823, 0.845, 8)

    class Validation:
        points, layers, rounds, geomean = [Point()], 36, 8, None

    console = Console(width=80, record=True)
    console.print(validation_table(Validation(), "stacked validation"))
    assert "slower" in console.export_text()


def test_resume_with_a_different_spec_is_refused(tmp_path: Path) -> None:
    root = _results_with_a_run(tmp_path)
    save_run(root, RunInfo("r2", "n", "decode_attention", "a.toml", TINY_SPEC, "interrupted", 24, 0.0, 0.0))
    other = tmp_path / "other.toml"
    other.write_text(TINY_SPEC.replace("rounds = 3", "rounds = 4"))
    out = run("submit", str(other), "--resume", "r2", "--results", str(root))
    assert out.exit_code == 2 and "was started with another spec (a.toml)" in out.output


def test_an_unreachable_address_fails_fast_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from tunectl.orchestrator import cluster, reach

    def no_answer(address: tuple[str, int], timeout: float) -> socket.socket:
        raise TimeoutError  # what a host that drops packets gives once the timeout passes

    with monkeypatch.context() as patched:
        patched.setattr(reach.socket, "create_connection", no_answer)
        with pytest.raises(UserError, match=r"no answer from head:6379 within 0.5 s"):
            cluster.check_reachable("ray://head:6379", timeout_s=0.5)
    spec = tmp_path / "tiny.toml"
    spec.write_text(TINY_SPEC)
    out = CliRunner().invoke(
        app, ["submit", str(spec), "--address", "127.0.0.1:9", "--results", str(tmp_path / "r")]
    )
    assert out.exit_code == 2 and out.output.startswith("error: cannot connect to 127.0.0.1:9")
    assert len(out.output.strip().splitlines()) == 1


def test_bundle_pack_does_not_overwrite_without_force(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    publish(store, "b", "1", build_files("b", "1", [table({1: 2})], [], ENV))
    archive = tmp_path / "b.tgz"
    archive.write_bytes(b"someone else's file")
    out = run("bundle", "pack", str(tmp_path / "store" / "b" / "1"), str(archive))
    assert out.exit_code == 2 and "already exists" in out.output
    assert archive.read_bytes() == b"someone else's file"
    out = run("bundle", "pack", str(tmp_path / "store" / "b" / "1"), str(archive), "--force")
    assert out.exit_code == 0 and load_bundle(str(archive)).name == "b"


def test_bundle_list_goes_on_past_a_corrupt_channel(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    publish(store, "b", "1", build_files("b", "1", [table({1: 2})], [], ENV))
    promote(store, "b", "1", "stable")
    (tmp_path / "b" / "_channels" / "canary.json").write_text("{truncated")
    versions, channels = list_bundles(store)
    assert [v.version for v in versions] == ["1"] and [c.channel for c in channels] == ["stable"]
    out = CliRunner().invoke(app, ["bundle", "list", str(tmp_path)])
    assert out.exit_code == 0 and "canary" in out.output and "warning: skipped" in out.output


def test_a_bundle_member_linking_outside_the_bundle_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    publish(store, "b", "1", build_files("b", "1", [table({1: 2})], [], ENV))
    version = tmp_path / "store" / "b" / "1"
    table_file = next((version / "tables").iterdir())
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes(table_file.read_bytes())  # the same bytes: the checksum alone would pass
    table_file.unlink()
    os.symlink(outside, table_file)
    with pytest.raises(BundleCorruptError, match="outside the bundle"):
        load_bundle(str(version))
    out = run("bundle", "verify", str(version))
    assert out.exit_code != 0 and "outside the bundle" in out.output


def test_a_plain_export_leaves_out_a_dynamic_shape_import(tmp_path: Path) -> None:
    results = tmp_path / "results"
    log = Path(__file__).parents[1] / "data" / "flex_logs" / "torch211-h200-dynamic.json"
    assert run("import", "flex-log", str(log), "--results", str(results)).exit_code == 0
    writer = ResultsWriter(results)  # a tuned run of the same device beside it
    stats = {
        "p20_us": 9.0,
        "p80_us": 11.0,
        "rel_noise": 0.01,
        "num_samples": 10,
        "device_name": "NVIDIA H200",
    }
    writer.append(replace(_record("r1", "i1", task="decode_attention"), is_default=True, **stats))
    writer.close()
    save_run(results, RunInfo("r1", "n", "decode_attention", "s.toml", "", "finished", 1, 0.0, 0.0))
    out = run(
        "export",
        "bundle",
        "--results",
        str(results),
        "--name",
        "b",
        "--version",
        "1",
        "--out",
        str(tmp_path / "b"),
    )
    assert out.exit_code == 0, out.output
    assert "warning: left out 12 row(s) with symbolic sizes" in out.output
    assert load_bundle(str(tmp_path / "b" / "b" / "1")).lookup("decode_attention", d=1, b=1) is not None


@pytest.mark.parametrize("command", ["winners", "failures"])
def test_an_unknown_task_exits_2_with_one_line_naming_the_tasks_there(tmp_path: Path, command: str) -> None:
    root = _results_with_a_run(tmp_path)
    out = run(command, "--results", str(root), "--task", "nope")
    assert out.exit_code == 2, out.output
    assert out.output.strip() == f"error: no results of task 'nope' in {root} (it holds t)"


def test_runs_at_80_columns_split_no_word(tmp_path: Path) -> None:
    root = _results_with_a_run(tmp_path, status="error")
    save_run(
        root,
        RunInfo(
            "r20261201-000000-abcdef",
            "quickstart",
            "decode_attention",
            "s.toml",
            TINY_SPEC,
            "interrupted",
            36,
            0.0,
            0.0,
        ),
    )
    out = run("runs", "--results", str(root))
    body = out.output.split("┡")[1].splitlines()[1:-1]
    assert len(body) == 1, "one line per run: nothing wrapped onto a second line"
    cells = [c.strip() for c in body[0].split("│")[1:-1]]
    assert cells[0] == "r20261201-000000-abcdef" and "interrupted" in cells
    assert all(
        c.rstrip("…") in full for c, full in zip(cells[1:3], ("quickstart", "decode_attention"), strict=True)
    )
    assert cells[-3:] == ["36", "2", "1 error"]


def test_a_resume_of_a_running_run_says_how_to_stop_it_with_its_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for root, option in (
        (tmp_path / "elsewhere", f" --results {tmp_path / 'elsewhere'}"),
        (Path("tunectl-results"), ""),
    ):
        info = RunInfo("r1", "tiny", "decode_attention", "tiny.toml", TINY_SPEC, "running", 24, 0.0, 0.0)
        save_run(root, info.with_driver())  # driven by this very process: alive
        out = run("submit", "--resume", "r1", *(["--results", str(root)] if option else []))
        assert out.exit_code == 2, out.output
        assert out.output.strip().endswith(f"stop it first: `tunectl cancel r1{option}`"), out.output


@pytest.mark.parametrize("name", ["tiny-2.b", "café", "-x", "a b", "x" * 129, "x" * 128, "_x", "1"])
def test_spec_names_and_bundle_names_follow_one_rule_in_one_wording(name: str) -> None:
    from tunectl.core.errors import SpecError
    from tunectl.core.files import NAME_RULE
    from tunectl.store.bundle import check_name

    def refusal(check: object) -> str | None:
        try:
            check()  # type: ignore[operator]
        except (SpecError, UserError) as exc:
            return str(exc)
        return None

    as_spec = refusal(
        lambda: parse_spec(TINY_SPEC.replace('name = "tiny"', f"name = {json.dumps(name)}"), "t.toml")
    )
    as_bundle = refusal(lambda: check_name("name", name))
    assert (as_spec is None) == (as_bundle is None)
    assert as_spec is None or (NAME_RULE in as_spec and NAME_RULE in (as_bundle or ""))


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["submit", "--bogus", "x"], "error: No such option: --bogus (see tunectl submit --help)"),
        (
            ["submit", "--compile-workers", "abc", "spec.toml"],
            "error: Invalid value for '--compile-workers': ",
        ),
        (["validate"], "error: Missing argument 'bundle'. (see tunectl validate --help)"),
        (["bundle", "nope"], "error: No such command 'nope'. (see tunectl bundle --help)"),
    ],
)
def test_a_mistyped_command_line_is_one_line_and_exit_2(
    argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console script says a command line the parser refuses as the commands say bad input."""
    from tunectl.cli import main

    monkeypatch.setattr("sys.argv", ["tunectl", *argv])
    with pytest.raises(SystemExit) as stopped:
        main()
    out = capsys.readouterr()
    assert stopped.value.code == 2 and out.out == ""
    assert out.err.count("\n") == 1 and out.err.startswith(said), out.err


def test_the_console_script_passes_a_commands_exit_code_and_shows_a_groups_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tunectl.cli import main

    monkeypatch.setattr("sys.argv", ["tunectl", "bundle", "show", str(tmp_path / "none")])
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 2 and capsys.readouterr().err.startswith("error: no bundle at ")
    monkeypatch.setattr("sys.argv", ["tunectl", "bundle"])
    with pytest.raises(SystemExit) as stopped:
        main()
    assert stopped.value.code == 2 and "tunectl bundle [OPTIONS] COMMAND" in capsys.readouterr().out
    monkeypatch.setattr("sys.argv", ["tunectl", "--help"])
    main()  # help: exit 0, nothing raised
    assert "Usage: tunectl" in capsys.readouterr().out
