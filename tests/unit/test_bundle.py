"""Bundles as a product: build, publish (immutable), promote channels, list, diff, pack, and their CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.core.errors import BundleExistsError, UserError
from tunectl.core.keys import make_key
from tunectl.runtime import BundleCorruptError, Entry, load_bundle
from tunectl.store import bundle as bundle_mod
from tunectl.store.bundle import (
    LocalStore,
    TaskTable,
    build_files,
    list_bundles,
    promote,
    publish,
    publish_local,
    read_channel,
)
from tunectl.store.bundle_diff import diff_bundles

STATIC = {"dtype": "float32", "head_dim": 64}
ENV = {"device_name": "cpu: test"}


def table(configs: dict[int, int], medians: dict[int, float] | None = None) -> TaskTable:
    """One task keyed by batch (exact): batch -> num_splits, with medians."""
    medians = medians or {b: float(b) for b in configs}
    entries = tuple(
        Entry(make_key(STATIC), (("batch", b),), (("num_splits", s),), median_us=medians[b])
        for b, s in configs.items()
    )
    return TaskTable(
        "decode", tuple(STATIC), {"batch": {"policy": "exact", "points": sorted(configs)}}, entries
    )


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_published_bundle_has_its_tables_stats_and_manifest(tmp_path: Path) -> None:
    path = publish(LocalStore(tmp_path), "b", "1", build_files("b", "1", [table({1: 2, 4: 8})], ["r1"], ENV))
    assert set(tree(Path(path))) == {"manifest.json", "tables/decode.json", "stats/decode.json"}
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    assert (
        manifest["schema_version"] == 3
        and manifest["environment"] == ENV
        and manifest["source_runs"] == ["r1"]
    )
    assert manifest["tasks"]["decode"]["shape_params"] == {"batch": {"policy": "exact", "points": [1, 4]}}
    b = load_bundle(path, env_policy="off")
    assert b.lookup("decode", **STATIC, batch=4) == {"num_splits": 8}
    assert b.entry("decode", **STATIC, batch=1) == Entry(
        make_key(STATIC), (("batch", 1),), (("num_splits", 2),), median_us=1.0
    )
    assert json.loads((Path(path) / "stats/decode.json").read_text())["columns"]["median_us"] == [1.0, 4.0]


def test_publishing_an_existing_version_fails_and_changes_nothing(tmp_path: Path) -> None:
    publish_local(tmp_path, "b", "1", build_files("b", "1", [table({1: 2})], [], ENV))
    before = tree(tmp_path)
    with pytest.raises(BundleExistsError, match="immutable"):
        publish_local(tmp_path, "b", "1", build_files("b", "1", [table({1: 3})], [], ENV))
    assert tree(tmp_path) == before


def test_a_publish_that_fails_midway_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = bundle_mod.write_synced

    def fail_on_manifest(path: Path, data: bytes) -> None:
        if path.name == "manifest.json":
            raise OSError("disk full")
        real(path, data)

    monkeypatch.setattr(bundle_mod, "write_synced", fail_on_manifest)
    with pytest.raises(OSError, match="disk full"):
        publish_local(tmp_path, "b", "1", build_files("b", "1", [table({1: 2})], [], ENV))
    assert list((tmp_path / "b").iterdir()) == []  # no version, no staging directory


def test_entries_that_are_one_lookup_key_are_refused_at_build() -> None:
    entries = (Entry((("causal", True),), (), ()), Entry((("causal", 1),), (), ()))
    with pytest.raises(UserError, match="share the key"):
        build_files("b", "1", [TaskTable("t", ("causal",), {}, entries)], [], {})
    bad_point = (Entry((("causal", True),), (("batch", 3),), ()),)
    with pytest.raises(UserError, match="not a declared point"):
        build_files(
            "b",
            "1",
            [TaskTable("t", ("causal",), {"batch": {"policy": "exact", "points": [4]}}, bad_point)],
            [],
            {},
        )


def test_a_channel_moves_atomically_and_remembers_the_previous_version(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    for version, splits in (("1", 2), ("2", 4)):
        publish(store, "b", version, build_files("b", version, [table({1: splits})], [], ENV))
    assert promote(store, "b", "1", "stable").previous is None
    pointer = promote(store, "b", "2", "stable")
    assert (pointer.version, pointer.previous) == ("2", "1")
    assert promote(store, "b", "2", "stable").previous == "1"  # promoting again keeps the history
    assert load_bundle(f"{tmp_path}/b@stable", env_policy="off").lookup("decode", **STATIC, batch=1) == {
        "num_splits": 4
    }
    assert [p.name for p in (tmp_path / "b" / "_channels").iterdir()] == ["stable.json"]


def test_a_channel_write_that_fails_keeps_the_old_pointer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path)
    for version in ("1", "2"):
        publish(store, "b", version, build_files("b", version, [table({1: 2})], [], ENV))
    promote(store, "b", "1", "stable")
    before = tree(tmp_path / "b" / "_channels")

    def crash(src: Any, dst: Any) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        promote(store, "b", "2", "stable")
    assert tree(tmp_path / "b" / "_channels") == before  # the old pointer, and no temp file beside it


def test_promote_verifies_the_version_first(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    path = Path(publish(store, "b", "1", build_files("b", "1", [table({1: 2})], [], ENV)))
    (path / "stats/decode.json").write_text("{}")
    with pytest.raises(BundleCorruptError):
        promote(store, "b", "1", "stable")
    assert read_channel(store, "b", "stable") is None


def test_list_shows_published_versions_and_channels_only(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    publish(store, "b", "1", build_files("b", "1", [table({1: 2, 2: 2})], [], ENV))
    promote(store, "b", "1", "canary")
    (tmp_path / "b" / "2" / "tables").mkdir(parents=True)  # an unfinished publish: no manifest
    (tmp_path / "b" / ".3.abcd.staging").mkdir()
    versions, channels = list_bundles(store)
    assert [(v.name, v.version, v.num_entries, v.device_name) for v in versions] == [
        ("b", "1", 2, "cpu: test")
    ]
    assert [(c.name, c.channel, c.version) for c in channels] == [("b", "canary", "1")]


def test_diff_shows_what_changed_per_point_and_by_how_much(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    publish(
        store,
        "b",
        "1",
        build_files("b", "1", [table({1: 1, 2: 2, 4: 4}, {1: 10.0, 2: 20.0, 4: 40.0})], [], ENV),
    )
    publish(
        store,
        "b",
        "2",
        build_files("b", "2", [table({2: 2, 4: 8, 8: 8}, {2: 19.0, 4: 30.0, 8: 80.0})], [], ENV),
    )
    diff = diff_bundles(*(load_bundle(f"{tmp_path}/b/{v}", env_policy="off") for v in ("1", "2")))
    kinds = {dict(c.shape)["batch"]: c.kind for c in diff.changes}
    assert kinds == {1: "removed", 2: "same", 4: "changed", 8: "added"}
    changed = next(c for c in diff.changes if c.kind == "changed")
    assert (changed.old_config, changed.new_config) == ((("num_splits", 4),), (("num_splits", 8),))
    assert changed.median_change == pytest.approx(-0.25)
    assert [dict(c.shape)["batch"] for c in diff.changes] == [1, 2, 4, 8]


def run(*args: str) -> Any:
    result = CliRunner().invoke(app, list(args))
    return result


def test_the_bundle_commands_work_together(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    publish(store, "b", "1", build_files("b", "1", [table({1: 1, 2: 2})], ["r1"], ENV))
    publish(store, "b", "2", build_files("b", "2", [table({1: 1, 2: 4})], ["r2"], ENV))
    s = str(tmp_path / "store")

    out = run("bundle", "promote", "b", "2", "--channel", "stable", "--store", s)
    assert out.exit_code == 0 and "b@stable -> 2" in out.output
    out = run("bundle", "list", s, "--json")
    listed = json.loads(out.output)
    assert [v["version"] for v in listed["versions"]] == ["1", "2"] and listed["channels"][0][
        "version"
    ] == "2"
    out = run("bundle", "verify", f"{s}/b@stable")
    assert out.exit_code == 0 and "ok: b/2 (channel stable), 2 entries" in out.output
    out = run("bundle", "show", f"{s}/b/1", "--entries")
    assert out.exit_code == 0 and "task decode: 2 entries" in out.output and "num_splits=2" in out.output
    out = run("bundle", "diff", f"{s}/b/1", f"{s}/b@stable", "--json")
    changes = json.loads(out.output)["changes"]
    assert [(c["kind"], c["shape"], c["new_config"]) for c in changes] == [
        ("changed", {"batch": 2}, {"num_splits": 4})
    ]
    out = run("bundle", "diff", f"{s}/b/1", f"{s}/b/2")
    assert "0 added, 0 removed, 1 changed, 1 same" in out.output
    out = run("bundle", "pack", f"{s}/b@stable", str(tmp_path / "b.tgz"))
    assert out.exit_code == 0 and run("bundle", "verify", str(tmp_path / "b.tgz")).exit_code == 0


def test_bundle_commands_fail_with_one_line(tmp_path: Path) -> None:
    path = publish_local(tmp_path, "b", "1", build_files("b", "1", [table({1: 2})], [], ENV))
    (path / "tables/decode.json").write_text("[]")
    for args, code in (
        (["bundle", "verify", str(path)], 1),
        (["bundle", "verify", str(tmp_path / "nothing")], 2),
        (["bundle", "promote", "b", "1", "--store", str(tmp_path)], 1),
        (["bundle", "promote", "b", "../x", "--store", str(tmp_path)], 2),
        (["bundle", "show", f"{tmp_path}/b@stable"], 2),
    ):
        out = run(*args)
        assert out.exit_code == code, (args, out.output)
        assert out.output.startswith("error: ") and len(out.output.strip().splitlines()) == 1, out.output


def test_every_bundle_and_export_command_has_help() -> None:
    from tunectl.cli import bundle as bundle_cli
    from tunectl.cli import export as export_cli

    for group, module in (("bundle", bundle_cli), ("export", export_cli)):
        for command in module.app.registered_commands:
            assert command.callback is not None and command.callback.__doc__, command.name
            out = run(group, command.name or "", "--help")
            assert out.exit_code == 0 and command.callback.__doc__.split()[0] in out.output
