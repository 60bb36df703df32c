"""Library errors carry their facts as fields: each is raised through the code that raises it, its
fields checked, and the one line the command line words from them (its own advice, one line, the
exit code, no traceback)."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from tests.conftest import TINY_SPEC
from tests.finished_run import RUN, damage, finished_run, part_of
from tunectl import api
from tunectl.api.checks import ValidationRun
from tunectl.api.errors import (
    BadPart,
    BundleCorruptError,
    BundleEnvironmentError,
    BundleExistsError,
    BundleNotFoundError,
    BundleReadError,
    BundleSchemaError,
    DamagedResultsError,
    Fielded,
    IncompleteRun,
    NoResultsError,
    OptionError,
    OrchestrationError,
    SpecError,
    StoreWriteError,
    UserError,
    ValidationFailed,
)
from tunectl.cli import app
from tunectl.cli._common import error_line, submit_again
from tunectl.core.keys import make_key
from tunectl.core.record import Phase
from tunectl.core.stats import Speedup
from tunectl.decide.stacked import PointVerdict, Validation
from tunectl.orchestrator.watch import StallWatch
from tunectl.store.bundle import LocalStore, publish, read_channel
from tunectl.store.results import read_part, require_dataset, require_task
from tunectl.store.runs import load_run, require_runs


def run(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})


def one_line(out: Result, code: int) -> str:
    """The command's one line on stderr, once it exited ``code`` cleanly."""
    assert out.exit_code == code and isinstance(out.exception, SystemExit), out.output
    [line] = out.output.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in out.output
    return line.removeprefix("error: ")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tuning run (run ``RUN``), read but never changed by the tests that share it."""
    return finished_run(tmp_path_factory.mktemp("run") / "results", TINY_SPEC)


def _verdict(speedup: float) -> PointVerdict:
    shape = make_key({"batch": 1, "kv_len": 64})
    ratio = Speedup(speedup, speedup * 0.99, speedup * 1.01, 5)
    return PointVerdict(make_key({"h": 1}), shape, make_key({"s": 2}), "ok", 1.0, 1.0 / speedup, ratio)


def _validation_run(*speedups: float) -> ValidationRun:
    return ValidationRun("rv", "tiny.toml", Validation(tuple(map(_verdict, speedups)), 2, 5), ())


FIELDED = [
    SpecError("tiny.toml", "shapes.batch", "must be a list"),
    OptionError("rounds", 0, "must be at least 2"),
    NoResultsError(Path("res"), True, task="t", held=("a", "b")),
    BadPart(Path("res/p.parquet"), "empty file (0 bytes)"),
    BundleExistsError("b", "1", "/s/b/1"),
    BundleCorruptError("/s/b/1", "listed but missing", "tables/t.json", "t"),
    BundleSchemaError("/s/b/1", 9),
    BundleEnvironmentError("b/1", ("torch: bundle tuned with 2.4, this process has 2.5",)),
    BundleNotFoundError("/s", name="b", channel="stable"),
    BundleReadError("s3://b/x", "denied"),
    StoreWriteError("s3://b/x", "full"),
    OrchestrationError("r1", "H200", failure="node died"),
    IncompleteRun("r1", "tune", 3, Path("res")),
    ValidationFailed("b", "1", (_validation_run(0.5),)),
]


@pytest.mark.parametrize("error", FIELDED, ids=lambda e: type(e).__name__)
def test_a_fielded_error_words_its_fields_and_pickles_whole(error: Fielded) -> None:
    advice = error.advice()
    assert str(error) == (f"{error.problem()}; {advice}" if advice else error.problem())
    assert "\n" not in str(error)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and repr(again) == repr(error) and str(again) == str(error)
    assert again.args == error.args and len(error.args) >= 2


# -- results -----------------------------------------------------------------------------------------


def test_no_results_name_the_directory_the_run_or_the_task(results: Path, tmp_path: Path) -> None:
    with pytest.raises(NoResultsError) as missing:
        require_dataset(tmp_path / "none")
    assert (missing.value.results, missing.value.is_dir, missing.value.run) == (
        tmp_path / "none",
        False,
        None,
    )
    with pytest.raises(NoResultsError) as empty:
        require_dataset(tmp_path)
    assert (empty.value.results, empty.value.is_dir) == (tmp_path, True)
    with pytest.raises(NoResultsError) as no_task:
        require_task(results, "nope")
    assert (no_task.value.task, no_task.value.held) == ("nope", ("decode_attention",))
    for check in (lambda: load_run(results, "r-none"), lambda: require_runs(results, [RUN, "r-none"])):
        with pytest.raises(NoResultsError) as no_run:
            check()
        assert (no_run.value.results, no_run.value.is_dir, no_run.value.run) == (results, True, "r-none")
        assert isinstance(no_run.value, UserError)


def test_the_cli_words_no_results_with_its_flags_and_commands(results: Path, tmp_path: Path) -> None:
    nowhere = tmp_path / "nowhere"
    line = one_line(run("winners", "--results", str(nowhere)), 2)
    assert line == f"no results dataset at {nowhere} (no such directory); give --results DIR"
    line = one_line(run("submit", "--resume", "r-none", "--results", str(results)), 2)
    assert line == f"no run 'r-none' in {results}; `tunectl runs --results {results}` lists them"
    line = one_line(run("submit", "--resume", "r-none", "--results", str(nowhere)), 2)
    assert line == f"no run 'r-none' in {nowhere} (no such directory); give --results DIR"


def test_a_bad_part_names_its_file_and_why(tmp_path: Path) -> None:
    part = tmp_path / "task=t" / "run_id=r1" / "p.parquet"
    part.parent.mkdir(parents=True)
    part.touch()
    with pytest.raises(BadPart) as bad:
        read_part(part)
    assert (bad.value.path, bad.value.why) == (part, "empty file (0 bytes)")
    assert (bad.value.part.run_id, bad.value.part.task) == ("r1", "t")


def test_export_of_a_damaged_part_names_the_part_and_the_run(results: Path, tmp_path: Path) -> None:
    root = finished_run(tmp_path / "results", TINY_SPEC)
    part = part_of(root, lambda row: row.phase is Phase.FINAL)
    damage(part)
    with pytest.raises(DamagedResultsError) as err:
        api.export_bundle(root, "b", "1", str(tmp_path / "bundles"))
    damaged = err.value
    assert (damaged.results, damaged.path, damaged.run_ids) == (root, part, (RUN,))
    assert [p.path for p in damaged.parts] == [part] and "Parquet" in damaged.reason
    assert "skip_damaged" in str(damaged) and "tunectl" not in damaged.advice()
    line = one_line(run("export", "bundle", "--results", str(root), "--name", "b", "--version", "1"), 1)
    assert line == (
        f"{damaged.problem()}; `tunectl doctor --results {root}` lists such files, "
        "--skip-damaged publishes without them"
    )


# -- bundles -----------------------------------------------------------------------------------------


def test_publishing_a_version_twice_names_it_and_where_it_is(results: Path, tmp_path: Path) -> None:
    store = tmp_path / "bundles"
    args = (
        "export",
        "bundle",
        "--results",
        str(results),
        "--name",
        "b",
        "--version",
        "1",
        "--out",
        str(store),
    )
    assert run(*args).exit_code == 0
    files = {
        p.relative_to(store / "b" / "1").as_posix(): p.read_bytes()
        for p in (store / "b" / "1").rglob("*.json")
    }
    with pytest.raises(BundleExistsError) as err:
        publish(LocalStore(store), "b", "1", files)
    assert (err.value.name, err.value.version, err.value.location) == ("b", "1", str(store / "b" / "1"))
    assert "immutable" in str(err.value) and isinstance(err.value, UserError)
    line = one_line(run(*args), 2)
    assert line == f"{err.value.problem()}; versions are immutable: publish another --version"


def test_a_bundle_that_is_not_there_names_where_and_what(tmp_path: Path) -> None:
    with pytest.raises(BundleNotFoundError) as none:
        api.read_bundle(str(tmp_path / "nothing"))
    assert (none.value.where, none.value.reason) == (str(tmp_path / "nothing"), "it has no manifest.json")
    with pytest.raises(BundleNotFoundError) as channel:
        api.read_bundle(f"{tmp_path}/b@stable")
    assert (channel.value.where, channel.value.name, channel.value.channel) == (str(tmp_path), "b", "stable")


def _published(results: Path, store: Path) -> Path:
    api.export_bundle(results, "b", "1", str(store))
    return store / "b" / "1"


def test_a_changed_or_foreign_bundle_names_the_file_and_the_schema(results: Path, tmp_path: Path) -> None:
    bundle = _published(results, tmp_path / "bundles")
    table = next((bundle / "tables").iterdir())
    table.write_bytes(table.read_bytes() + b" ")
    with pytest.raises(BundleCorruptError) as corrupt:
        api.read_bundle(str(bundle))
    assert (corrupt.value.where, corrupt.value.member) == (str(bundle), f"tables/{table.name}")
    assert corrupt.value.reason.startswith("does not match its checksum")
    (bundle / "manifest.json").write_text('{"schema_version": 99}')
    with pytest.raises(BundleSchemaError) as schema:
        api.read_bundle(str(bundle))
    assert (schema.value.where, schema.value.version, schema.value.readable) == (str(bundle), 99, (1, 2, 3))
    (tmp_path / "bundles" / "b" / "_channels").mkdir()
    (tmp_path / "bundles" / "b" / "_channels" / "stable.json").write_text("{")
    with pytest.raises(BundleCorruptError) as pointer:
        read_channel(LocalStore(tmp_path / "bundles"), "b", "stable")
    assert (pointer.value.where, pointer.value.member) == (
        str(tmp_path / "bundles"),
        "b/_channels/stable.json",
    )


def test_a_bundle_for_another_environment_lists_what_differs(results: Path, tmp_path: Path) -> None:
    from tunectl.runtime import load_bundle

    bundle = _published(results, tmp_path / "bundles")
    elsewhere: dict[str, Any] = {"device_kind": "cuda", "device_name": "NVIDIA H200", "packages": {}}
    with pytest.raises(BundleEnvironmentError) as err:
        load_bundle(bundle, env_policy="strict", environment=elsewhere)
    assert err.value.where == "b/1" and err.value.problems and all(err.value.problems)
    assert str(err.value).endswith("; ".join(err.value.problems))


def test_a_read_that_fails_names_the_uri_and_why(results: Path, tmp_path: Path) -> None:
    from tunectl.runtime import load_bundle

    def broken(uri: str) -> bytes:
        raise ConnectionResetError("peer went away")

    with pytest.raises(BundleReadError) as err:
        load_bundle("mem://bucket/b/1", fetcher=broken)
    assert (err.value.where, err.value.reason) == (
        "mem://bucket/b/1/manifest.json",
        "ConnectionResetError: peer went away",
    )


# -- runs --------------------------------------------------------------------------------------------


def test_a_lane_given_up_names_the_run_the_lane_and_why() -> None:
    lost = [SimpleNamespace(state="lost", calls=[], failure="the node died")]
    with pytest.raises(OrchestrationError) as gone:
        StallWatch("r1", 30.0).check("H200", 2, lost, now=0.0)
    assert (gone.value.run_id, gone.value.lane, gone.value.failure) == ("r1", "H200", "the node died")
    idle = [SimpleNamespace(state="starting", calls=[], failure="")]
    watch = StallWatch("r1", 30.0)
    watch.check("H200", 2, idle, now=0.0)
    with pytest.raises(OrchestrationError) as stalled:
        watch.check("H200", 2, idle, now=31.0)
    assert (stalled.value.failure, stalled.value.waited_s) == (None, 30.0)
    assert "30 s" in str(stalled.value) and "resume" in str(stalled.value)
    line = error_line(gone.value, submit_again(Path("res")))
    assert line == (
        "run r1: every H200 worker is lost (the node died) with work left; "
        "finish it with `tunectl submit --resume r1 --results res` once the cluster is healthy"
    )


def test_a_run_that_ended_short_says_how_each_command_finishes_it() -> None:
    short = IncompleteRun("r1", "tune", 3, Path("res"))
    assert str(short).startswith(
        "run r1 ended with 3 item(s) still without a row, so it is not marked finished"
    )
    assert error_line(short, submit_again(Path("res"))) == (
        f"{short.problem()}; finish it with `tunectl submit --resume r1 --results res`"
    )
    assert error_line(short) == str(short), "with no command to name, the library's words"


def test_a_refused_validation_names_the_bundle_and_its_losers() -> None:
    runs = (_validation_run(1.0, 0.5), _validation_run(2.0))
    failed = ValidationFailed("b", "7", runs)
    assert [p.speedup.estimate for p in failed.losers if p.speedup] == [0.5]
    assert str(failed).startswith(
        "not published: bundle b/7 is slower than the defaults beyond noise at 1 point(s)"
    )
