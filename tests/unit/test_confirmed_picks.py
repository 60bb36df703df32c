"""Confirmed picks kept beside a bundle: saved once, applied at start-up without timing, refused
where they do not belong (``tunectl.runtime.confirmed``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tunectl.core.keys import make_key
from tunectl.measure.confirm import cell_grid, confirm, pick_grid, picks_of
from tunectl.runtime import BundleEnvironmentError, Entry, apply_confirmed, load_bundle
from tunectl.runtime.confirmed import save_confirmed
from tunectl.runtime.format import ConfirmedPicksError
from tunectl.store.bundle import TaskTable, build_files, publish_local

STATIC = {"dtype": "float32", "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "page_size": 16}
PICK = {"gather": "index", "gqa": "grouped", "num_splits": 1}
OTHERS = [
    {"gather": "index", "gqa": "grouped", "num_splits": 4},
    {"gather": "index", "gqa": "expand", "num_splits": 2},
]
TASK = "decode_attention"
HERE = {"device_kind": "cpu", "device_name": "cpu: test", "packages": {}}
#: per KV length, the fixed times of the entry's config and the two others (a fake clock for the kernels)
TIMES = {1024: [10.0, 9.9, 20.0], 2048: [10.0, 5.0, 20.0], 4096: [10.0, 5.0, 1.0]}


def _published(tmp_path: Path, version: str = "1") -> Path:
    listed = tuple(make_key(c) for c in [PICK, *OTHERS])
    entries = tuple(
        Entry(make_key(STATIC), make_key({"batch": b, "kv_len": k}), make_key(PICK), candidates=listed)
        for b in (4, 16)
        for k in (1024, 4096)
    )
    shapes = {
        "batch": {"policy": "pow2", "points": [4, 16]},
        "kv_len": {"policy": "ceil", "points": [1024, 4096]},
    }
    table = TaskTable(TASK, tuple(sorted(STATIC)), shapes, entries)
    environment = {"device_kind": "cpu", "device_name": "cpu: test"}
    return publish_local(
        tmp_path, "kept", version, build_files("kept", version, [table], ["r1"], environment)
    )


def _timed_by_the_fake_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Confirming reads ``TIMES`` instead of timing kernels, on a machine named as ``HERE``."""
    import tunectl.measure.confirm as confirming

    def fixed(task: Any, static: Any, shape: dict[str, Any], configs: Any, **how: Any) -> list[float]:
        return TIMES[shape["kv_len"]]

    monkeypatch.setattr(confirming, "time_configs", fixed)
    monkeypatch.setenv("TUNECTL_DEVICE_NAME", HERE["device_name"])


def _confirmed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Any, Path]:
    """A bundle, what confirming it at batch 3 (every KV cell) installs, and the file it was saved to."""
    _timed_by_the_fake_clock(monkeypatch)
    path = _published(tmp_path)
    bundle = load_bundle(path, env_policy="off")
    shapes = [{"batch": 3}]
    confirmed, reports = confirm(bundle, TASK, STATIC, shapes, budget_s=60)
    picks = picks_of(STATIC, reports)
    assert picks, "the fixed times make confirming install another config somewhere"
    parts = pick_grid(bundle, TASK, cell_grid(bundle, TASK, shapes))  # the cells' parts: what picks serve
    saved = save_confirmed(tmp_path / "picks" / "confirmed.json", bundle, TASK, picks, parts)
    return path, confirmed, saved


def test_saved_picks_answer_in_another_process_as_confirming_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, confirmed, saved = _confirmed(tmp_path, monkeypatch)
    fresh = load_bundle(path, env_policy="off")  # as a serving process started later loads it
    applied = apply_confirmed(fresh, saved, env_policy="strict", environment=HERE)
    answers = {
        (b, kv): (
            confirmed.lookup(TASK, **STATIC, batch=b, kv_len=kv),
            fresh.lookup(TASK, **STATIC, batch=b, kv_len=kv),
        )
        for b in (3, 4, 16)
        for kv in (900, 1024, 1500, 2048, 3000, 4096)
    }
    for (b, kv), (want, _) in answers.items():
        assert applied.lookup(TASK, **STATIC, batch=b, kv_len=kv) == want, (b, kv)
    assert any(want != plain for want, plain in answers.values())  # something was confirmed
    doc = json.loads(saved.read_text())
    assert doc["bundle"] == {"name": "kept", "version": "1", "manifest_sha256": fresh.manifest_sha256}
    assert doc["by_cell"] == {"kv_len": [1024, 1218, 1448, 1722, 2048, 2435, 2896, 3444, 4096]}
    assert doc["task"] == TASK
    assert doc["not_reached"] == 0


def test_picks_saved_for_another_bundle_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, saved = _confirmed(tmp_path, monkeypatch)
    other = load_bundle(_published(tmp_path, version="2"), env_policy="off")
    with pytest.raises(ConfirmedPicksError, match=r"confirmed for bundle kept/1, not for kept/2"):
        apply_confirmed(other, saved, env_policy="off")


def test_picks_saved_on_another_device_follow_the_environment_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path, confirmed, saved = _confirmed(tmp_path, monkeypatch)
    elsewhere = {**HERE, "device_name": "cpu: another"}
    bundle = load_bundle(path, env_policy="off")
    with pytest.raises(BundleEnvironmentError, match="cpu: another"):
        apply_confirmed(bundle, saved, env_policy="strict", environment=elsewhere)
    with caplog.at_level(logging.WARNING, logger="tunectl.runtime"):
        applied = apply_confirmed(bundle, saved, env_policy="warn", environment=elsewhere)
    assert "confirmed picks" in caplog.text and "cpu: another" in caplog.text
    at = {"batch": 3, "kv_len": 3000}
    assert applied.lookup(TASK, **STATIC, **at) == confirmed.lookup(TASK, **STATIC, **at)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda doc: "{", "not JSON"),
        (lambda doc: json.dumps({**doc, "format": "other"}), 'not such a file (no "format"'),
        (lambda doc: json.dumps({**doc, "version": 2}), "written as version 2; this tunectl reads version 1"),
        (lambda doc: json.dumps({**doc, "task": "flash_decode"}), "task 'flash_decode' is not a task"),
        (lambda doc: json.dumps({k: v for k, v in doc.items() if k != "picks"}), '"picks", "by_cell"'),
        (lambda doc: json.dumps({**doc, "picks": [{"params": {}}]}), 'each pick needs "params" and "config"'),
        (
            lambda doc: json.dumps({**doc, "picks": [{"params": {**STATIC, "batch": 3}, "config": PICK}]}),
            "they do not fit the bundle",
        ),
    ],
)
def test_a_damaged_picks_file_is_refused_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: Any, message: str
) -> None:
    path, _, saved = _confirmed(tmp_path, monkeypatch)
    saved.write_text(damage(json.loads(saved.read_text())))
    with pytest.raises(ConfirmedPicksError, match=message.replace("(", r"\(")) as raised:
        apply_confirmed(load_bundle(path, env_policy="off"), saved, env_policy="off")
    assert str(saved) in str(raised.value) and "\n" not in str(raised.value)


def test_the_command_saves_what_it_chose(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from tunectl.cli import app

    _timed_by_the_fake_clock(monkeypatch)
    path = _published(tmp_path)
    out = tmp_path / "saved" / "picks.json"
    args = ["bundle", "confirm", str(path), "--task", TASK, "--shape", "batch=4,16", "--device", "cpu"]
    done = CliRunner().invoke(app, [*args, "--save", str(out)])
    assert done.exit_code == 0, done.output
    doc = json.loads(out.read_text())
    # the four parts of each of the two cells above 1024, at both batch sizes: the fake clock's times
    assert len(doc["picks"]) == 16
    assert f"saved 16 confirmed pick(s) to {out}" in " ".join(done.output.split())
    bundle = load_bundle(path, env_policy="off")
    applied = apply_confirmed(bundle, out, env_policy="strict", environment=HERE)
    for pick in doc["picks"]:  # each pick the file holds is what the bundle now answers there
        assert applied.lookup(TASK, **pick["params"]) == pick["config"]
    cut = tmp_path / "cut.json"  # a budget spent before the first point: every cell keeps its pick
    assert CliRunner().invoke(app, [*args, "--budget-s", "0", "--save", str(cut)]).exit_code == 0
    kept = json.loads(cut.read_text())
    assert kept["not_reached"] == 6 and kept["picks"] == []  # 2 batch sizes x 3 KV cells
    blocked = tmp_path / "file"
    blocked.write_text("")
    refused = CliRunner().invoke(app, [*args, "--save", str(blocked / "picks.json")])
    assert refused.exit_code != 0 and "--save:" in refused.output and "cannot be written" in refused.output


def test_a_confirmation_cut_short_by_its_budget_goes_on_where_it_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three KV cells at batch 3, timed at three points: a budget that reaches two points confirms two
    cells and saves them as reached; the same call again times only what the third needs, keeps the
    first run's picks, and ends where confirming it whole in one run ends."""
    import time

    import tunectl.measure.confirm as confirming
    from tunectl import api
    from tunectl.core.errors import OptionError

    timed: list[int] = []

    def slow(task: Any, static: Any, shape: dict[str, Any], configs: Any, **how: Any) -> list[float]:
        time.sleep(0.1)
        timed.append(shape["kv_len"])
        return TIMES[shape["kv_len"]]

    monkeypatch.setattr(confirming, "time_configs", slow)
    monkeypatch.setenv("TUNECTL_DEVICE_NAME", HERE["device_name"])
    bundle = load_bundle(_published(tmp_path), env_policy="off")
    shapes, saved = [{"batch": 3}], tmp_path / "confirmed.json"
    short = api.ConfirmOptions(device="cpu", budget_s=0.15)
    first = api.confirm_candidates(bundle, TASK, shapes, short, resume=saved)
    api.save_confirmed(first, bundle, saved)
    assert timed == [1024, 2048] and sum(r.skipped for r in first.reports) == 1
    assert json.loads(saved.read_text())["not_reached"] == 1

    timed.clear()
    again = api.confirm_candidates(bundle, TASK, shapes, api.ConfirmOptions(device="cpu"), resume=saved)
    assert timed == [2048, 4096], "only the points the cell left needs"
    assert len(again.reports) == 1 and not again.reports[0].skipped and again.resumed == 2
    whole = api.confirm_candidates(bundle, TASK, shapes, api.ConfirmOptions(device="cpu"))
    key = lambda picks: sorted(json.dumps([p, c], sort_keys=True) for p, c in picks)  # noqa: E731
    assert key(again.picks) == key(whole.picks) and len(again.reached) == len(whole.reached) == 3
    for kv in (1024, 1500, 3000, 4096):
        shape = {**STATIC, "batch": 3, "kv_len": kv}
        assert again.bundle.lookup(TASK, **shape) == whole.bundle.lookup(TASK, **shape)

    with pytest.raises(OptionError, match="other cells"):
        api.confirm_candidates(bundle, TASK, shapes, api.ConfirmOptions(device="cpu", cell_span=4.0), saved)
