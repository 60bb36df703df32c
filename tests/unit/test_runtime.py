"""The serving runtime: lookup semantics, thread safety, and every kind of bad bundle it must refuse."""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import logging
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tunectl.core.errors import UserError
from tunectl.core.keys import make_key
from tunectl.runtime import (
    BundleCorruptError,
    BundleEnvironmentError,
    BundleError,
    BundleNotFoundError,
    BundleReadError,
    BundleSchemaError,
    Entry,
    empty_bundle,
    load_bundle,
    load_bundle_or_none,
    register_fetcher,
)
from tunectl.runtime.environment import capability_key, device_name_key, environment_problems
from tunectl.store.bundle import LocalStore, TaskTable, build_files, pack, promote, publish_local

ROOT = Path(__file__).resolve().parents[2]
STATIC = {"dtype": "bfloat16", "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "window": [-1, -1]}
H200 = {
    "device_kind": "cuda",
    "device_name": "NVIDIA H200",
    "compute_capability": "9.0",
    "packages": {"torch": "2.11.0+cu130", "triton": "3.6.0", "tunectl": "0.1.0"},
}
HERE = {
    "device_kind": "cuda",
    "device_name": "NVIDIA H200",
    "compute_capability": "9.0",
    "packages": {"torch": "2.11.0+cu130", "triton": "3.6.0"},
}


def decode_table(batches: tuple[int, ...] = (1, 4, 16), kv_lens: tuple[int, ...] = (1024, 4096)) -> TaskTable:
    entries = tuple(
        Entry(
            make_key(STATIC),
            make_key({"batch": b, "kv_len": kv}),
            make_key({"num_splits": b * 10 + i}),
            median_us=10.0 * b + i,
            default_median_us=20.0 * b,
            run_id="r1",
        )
        for b in batches
        for i, kv in enumerate(kv_lens)
    )
    shapes = {
        "batch": {"policy": "pow2", "points": list(batches)},
        "kv_len": {"policy": "ceil", "points": list(kv_lens)},
    }
    return TaskTable("decode", tuple(STATIC), shapes, entries)


def publish(root: Path, version: str = "1", tables: list[TaskTable] | None = None, env: Any = None) -> Path:
    files = build_files("b", version, tables or [decode_table()], ["r1"], H200 if env is None else env)
    return publish_local(root, "b", version, files)


@pytest.fixture
def bundle_dir(tmp_path: Path) -> Path:
    return publish(tmp_path / "store")


def rewrite_manifest(path: Path, change: Any) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))


# -- lookup ------------------------------------------------------------------------------------------


def test_lookup_buckets_each_dimension_as_tuned(bundle_dir: Path) -> None:
    b = load_bundle(bundle_dir, environment=HERE)
    assert b.lookup("decode", **STATIC, batch=3, kv_len=1500) == {"num_splits": 41}  # pow2 -> 4, ceil -> 4096
    assert b.lookup("decode", **STATIC, batch=1, kv_len=1) == {"num_splits": 10}
    assert b.lookup("decode", **STATIC, batch=16, kv_len=4096, unrelated="ignored") == {"num_splits": 161}


@pytest.mark.parametrize(
    "change",
    [
        {"batch": 8},  # pow2 bucket 8 was not tuned
        {"batch": 17},  # pow2 bucket 32 was not tuned
        {"kv_len": 4097},  # past the largest ceil point
        {"batch": 0},
        {"batch": 2.5},
        {"batch": "4"},
        {"head_dim": 64},  # another static key
        {"dtype": "float16"},
    ],
)
def test_a_miss_returns_none(bundle_dir: Path, change: dict[str, Any]) -> None:
    b = load_bundle(bundle_dir, environment=HERE)
    assert b.lookup("decode", **{**STATIC, "batch": 4, "kv_len": 1024, **change}) is None


def test_a_missing_parameter_or_task_is_a_miss(bundle_dir: Path) -> None:
    b = load_bundle(bundle_dir, environment=HERE)
    assert b.lookup("decode", **STATIC, batch=4) is None
    params = {k: v for k, v in STATIC.items() if k != "dtype"}
    assert b.lookup("decode", **params, batch=4, kv_len=1024) is None
    assert b.lookup("prefill", **STATIC, batch=4, kv_len=1024) is None
    assert b.entry("decode", **STATIC, batch=64, kv_len=1) is None


class IndexInt:
    """An integer scalar as numpy and torch give them: not an int, but with __index__."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_lookup_normalises_parameters_in_every_form_tuning_accepts(bundle_dir: Path) -> None:
    b = load_bundle(bundle_dir, environment=HERE)
    want = {"num_splits": 40}
    forms = [
        {"dtype": "torch.bfloat16"},
        {"window": None},
        {"window": -1},
        {"window": (-1, -1)},
        {"head_dim": IndexInt(128)},
    ]
    for form in forms:
        assert b.lookup("decode", **{**STATIC, **form}, batch=4, kv_len=1024) == want, form
    assert b.lookup("decode", **STATIC, batch=IndexInt(3), kv_len=IndexInt(1000)) == want


def test_lookup_returns_a_fresh_dict_each_time(bundle_dir: Path) -> None:
    b = load_bundle(bundle_dir, environment=HERE)
    first = b.lookup("decode", **STATIC, batch=4, kv_len=1024)
    assert first is not None
    first["num_splits"] = -1
    assert b.lookup("decode", **STATIC, batch=4, kv_len=1024) == {"num_splits": 40}


def test_entry_carries_the_statistics_and_entries_lists_them_all(bundle_dir: Path) -> None:
    b = load_bundle(bundle_dir, environment=HERE)
    entry = b.entry("decode", **STATIC, batch=3, kv_len=2000)
    assert entry == Entry(
        make_key(STATIC),
        (("batch", 4), ("kv_len", 4096)),
        (("num_splits", 41),),
        median_us=41.0,
        default_median_us=80.0,
        run_id="r1",
    )
    assert entry is not None and entry.to_json()["static"] == STATIC
    assert len(list(b.entries("decode"))) == len(b) == 6


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    batch=st.integers(-2, 40),
    kv_len=st.integers(-2, 5000),
    window=st.sampled_from([None, -1, (-1, -1), [-1, -1], 5, (5, 0)]),
    dtype=st.sampled_from(["bfloat16", "torch.bfloat16", "float16"]),
)
def test_lookup_agrees_with_an_independent_reading_of_the_table(
    bundle_dir: Path, batch: int, kv_len: int, window: Any, dtype: str
) -> None:
    b = load_bundle(bundle_dir, environment=HERE)
    bucket_b = next((p for p in (1, 4, 16) if batch > 0 and p == 1 << (batch - 1).bit_length()), None)
    bucket_kv = next((p for p in (1024, 4096) if kv_len <= p), None)
    static_ok = dtype.removeprefix("torch.") == "bfloat16" and window in (None, -1, (-1, -1), [-1, -1])
    want = None
    if static_ok and bucket_b is not None and bucket_kv is not None:
        want = {"num_splits": bucket_b * 10 + (bucket_kv == 4096)}
    assert (
        b.lookup("decode", **{**STATIC, "dtype": dtype, "window": window}, batch=batch, kv_len=kv_len) == want
    )


WINDOWED = TaskTable(
    "w",
    ("window", "dtype"),
    {"batch": {"policy": "pow2", "points": [1, 4]}},
    tuple(
        Entry.from_json(
            {
                "static": {"window": list(w), "dtype": "bfloat16"},
                "shape": {"batch": b},
                "config": {"w": list(w), "b": b},
            }
        )
        for w in ((5, 0), (1, 0), (-1, -1))
        for b in (1, 4)
    ),
)
variants = st.fixed_dictionaries(
    {
        "window": st.sampled_from(
            [5, 5.0, (5, 0), (5.0, 0), [5, 0], 1, True, (1, 0), (True, 0), None, -1, "5"]
        ),
        "dtype": st.sampled_from(["bfloat16", "torch.bfloat16", "float16"]),
        "batch": st.sampled_from([1, 1.0, True, 3, 3.0, 4, 4.5, 0, None]),
    }
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=st.lists(variants, min_size=1, max_size=30))
def test_a_lookup_does_not_depend_on_the_lookups_before_it(tmp_path_factory: Any, calls: list[Any]) -> None:
    """Results are remembered by value; equal values that resolve differently must never share one."""
    path = tmp_path_factory.mktemp("w") / "store"
    if not path.exists():
        publish(path, tables=[WINDOWED], env={})
    warm = load_bundle(path / "b" / "1")
    for params in calls:
        fresh = load_bundle(path / "b" / "1")
        assert warm.lookup("w", **params) == fresh.lookup("w", **params), params


@pytest.mark.parametrize(
    ("policy", "cases"),
    [
        ("exact", {4: 4, 5: None, 16: 16}),
        ("floor", {3: None, 4: 4, 15: 4, 16: 16, 10**9: 16}),
        ("ceil", {1: 4, 4: 4, 5: 16, 17: None}),
        ("nearest", {1: 4, 9: 4, 10: 16, 11: 16, 99: 16}),
        ("pow2", {3: 4, 4: 4, 5: None, 9: 16, 16: 16, 17: None, 0: None, -4: None}),
    ],
)
def test_each_bucket_policy(policy: str, cases: dict[int, int | None]) -> None:
    from tunectl.core.buckets import make_bucketer

    bucket = make_bucketer(policy, [4, 16])
    assert {v: bucket(v) for v in cases} == cases
    assert (
        bucket(4.0) == bucket(4) and bucket(IndexInt(4)) == bucket(4) and bucket(True) == bucket(1)
    )  # equal values
    assert bucket(4.5) is None and bucket("4") is None and bucket(None) is None and bucket([4]) is None


@settings(max_examples=200, deadline=None)
@given(
    policy=st.sampled_from(["exact", "floor", "ceil", "nearest", "pow2"]),
    points=st.sets(st.integers(1, 1 << 16), min_size=1, max_size=8),
)
def test_a_cells_middle_buckets_to_its_own_point(policy: str, points: set[int]) -> None:
    """Confirming times a cell at its middle (``cell_middle``): a value of that cell, whatever the
    policy and points."""
    from tunectl.core.buckets import cell_middle, make_bucketer

    if policy == "pow2":
        points = {1 << (p.bit_length() - 1) for p in points}
    bucket = make_bucketer(policy, sorted(points))
    assert all(bucket(cell_middle(policy, sorted(points), p)) == p for p in points)


@settings(max_examples=200, deadline=None)
@given(
    policy=st.sampled_from(["exact", "floor", "ceil", "nearest", "pow2"]),
    points=st.sets(st.integers(1, 1 << 16), min_size=1, max_size=8),
    parts=st.integers(1, 6),
)
def test_a_cells_parts_lie_in_it_in_order_and_cover_it(policy: str, points: set[int], parts: int) -> None:
    """Confirming by cell installs a pick per part of a cell (``split_cells``, ``parts_of``): every part
    lies in one cell, inside its range, the parts of a cell in order along it, their middles' places
    between its edges rising from 0 to 1; the old points stay points."""
    from tunectl.core.buckets import cell_range, parts_of, split_cells

    if policy == "pow2":
        points = {1 << (p.bit_length() - 1) for p in points}
    coarse = sorted(points)
    finer = split_cells(policy, coarse, parts)
    assert set(coarse) <= set(finer) and finer == sorted(set(finer))
    found = {point: parts_of(policy, coarse, finer, point) for point in coarse}
    assert sorted(part for got in found.values() for part, _ in got) == finer  # each part in one cell
    for point, got in found.items():
        low, high = cell_range(policy, coarse, point)
        wheres = [where for _, where in got]
        assert wheres == sorted(wheres) and all(0.0 <= w <= 1.0 for w in wheres)
        for part, _ in got:
            part_low, part_high = cell_range(policy, finer, part)
            assert low <= part_low <= part_high <= high or (low, high) == (point, point), (point, part)


def test_a_cells_middle_is_geometric_between_tuned_points() -> None:
    from tunectl.core.buckets import cell_edges, cell_middle, cell_range, refined, split_cells

    assert refined("ceil", [1024, 4096, 16384, 32768]) == [1024, 2048, 4096, 8192, 16384, 32768]
    cut = refined("floor", [4, 5, 6, 100])
    assert {4, 5, 6, 100} <= set(cut) and all(b <= 2 * a for a, b in itertools.pairwise(cut))
    assert refined("pow2", [1, 8]) == [1, 8] and refined("nearest", [1, 8]) == [1, 8]

    kv = [1024, 2048, 4096, 32768]
    assert [cell_middle("ceil", kv, p) for p in kv] == [1024, 1448, 2896, 11585]  # first: open below
    assert [cell_middle("floor", kv, p) for p in kv] == [1448, 2896, 11585, 32768]  # last: open above
    assert [cell_middle("pow2", [1, 8], p) for p in (1, 8)] == [1, 6]
    assert cell_middle("nearest", kv, 2048) == 2048 and cell_middle("exact", kv, 4096) == 4096
    assert [cell_edges("ceil", kv, p) for p in kv] == [(1024,), (1024, 2048), (2048, 4096), (4096, 32768)]
    assert [cell_edges("floor", kv, p) for p in kv] == [(1024, 2048), (2048, 4096), (4096, 32768), (32768,)]
    assert cell_edges("pow2", [1, 8], 8) == (4, 8) and cell_edges("nearest", kv, 2048) == (2048,)
    assert split_cells("ceil", [1024, 4096], 4) == [1024, 1448, 2048, 2896, 4096]
    assert split_cells("pow2", [1, 8], 4) == [1, 8] and split_cells("ceil", [2, 3], 4) == [2, 3]
    assert [cell_range("ceil", kv, p) for p in kv] == [
        (1024, 1024),
        (1025, 2048),
        (2049, 4096),
        (4097, 32768),
    ]
    assert cell_range("floor", kv, 1024) == (1024, 2047) and cell_range("pow2", [1, 8], 8) == (5, 8)


def test_lookups_from_many_threads_agree_and_need_no_files(bundle_dir: Path) -> None:
    b = load_bundle(bundle_dir, environment=HERE)
    shutil.rmtree(bundle_dir)  # no I/O after load: nothing on disk is needed any more
    cases = [
        ({**STATIC, "batch": bb, "kv_len": kv}, {"num_splits": bb * 10 + i})
        for bb in (1, 4, 16)
        for i, kv in enumerate((1024, 4096))
    ]
    failures: list[Any] = []

    def hammer() -> None:
        for _ in range(300):
            for params, want in cases:
                if b.lookup("decode", **params) != want:
                    failures.append(params)
        entry = b.entry("decode", **STATIC, batch=1, kv_len=1)
        if entry is None or entry.median_us != 10.0:
            failures.append("entry")

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


# -- bad bundles -------------------------------------------------------------------------------------


def test_a_flipped_byte_in_a_table_is_refused(bundle_dir: Path) -> None:
    table = bundle_dir / "tables/decode.json"
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 0x01
    table.write_bytes(bytes(data))
    with pytest.raises(BundleCorruptError, match="does not match its checksum"):
        load_bundle(bundle_dir)


def test_a_truncated_manifest_is_refused(bundle_dir: Path) -> None:
    manifest = bundle_dir / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:-40])
    with pytest.raises(BundleCorruptError, match="truncated"):
        load_bundle(bundle_dir)


@pytest.mark.parametrize("version", [4, 0, "2", None])
def test_an_unknown_schema_version_is_refused(bundle_dir: Path, version: Any) -> None:
    rewrite_manifest(bundle_dir, lambda m: m.update(schema_version=version))
    with pytest.raises(BundleSchemaError, match="upgrade tunectl"):
        load_bundle(bundle_dir)


@pytest.mark.parametrize("member", ["../../outside.json", "/etc/hostname", "tables/../../x.json", "a\\..\\b"])
def test_a_table_name_escaping_the_bundle_is_refused(bundle_dir: Path, member: str) -> None:
    (bundle_dir.parent.parent / "outside.json").write_text("{}")
    digest = hashlib.sha256(b"{}").hexdigest()

    def escape(m: dict[str, Any]) -> None:
        m["tasks"]["decode"]["table"] = member
        m["files"][member] = digest

    rewrite_manifest(bundle_dir, escape)
    with pytest.raises(BundleCorruptError, match="escapes the bundle"):
        load_bundle(bundle_dir)


def test_a_table_the_manifest_does_not_checksum_is_refused(bundle_dir: Path) -> None:
    rewrite_manifest(bundle_dir, lambda m: m["files"].pop("tables/decode.json"))
    with pytest.raises(BundleCorruptError, match="not checksummed"):
        load_bundle(bundle_dir)


def test_a_listed_file_that_is_missing_is_refused(bundle_dir: Path) -> None:
    (bundle_dir / "stats/decode.json").unlink()
    with pytest.raises(BundleCorruptError, match="listed but missing"):
        load_bundle(bundle_dir)


def _tar(members: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def test_an_archive_loads_like_the_directory_it_was_packed_from(bundle_dir: Path, tmp_path: Path) -> None:
    archive = pack(str(bundle_dir), tmp_path / "b-1.tar.gz")
    assert (
        pack(str(bundle_dir), tmp_path / "again.tar.gz").read_bytes() == archive.read_bytes()
    )  # deterministic
    b = load_bundle(archive, environment=HERE)
    assert b.lookup("decode", **STATIC, batch=3, kv_len=1500) == {"num_splits": 41}


@pytest.mark.parametrize("member", ["../evil.json", "/tmp/evil.json", "tables/../../evil.json"])
def test_an_archive_member_escaping_the_bundle_is_refused(
    bundle_dir: Path, tmp_path: Path, member: str
) -> None:
    files = {
        p.relative_to(bundle_dir).as_posix(): p.read_bytes() for p in bundle_dir.rglob("*") if p.is_file()
    }
    archive = tmp_path / "evil.tar.gz"
    archive.write_bytes(_tar({**files, member: b"{}"}))
    with pytest.raises(BundleCorruptError, match="escapes the bundle"):
        load_bundle(archive)
    assert not (tmp_path / "evil.json").exists() and not Path("/tmp/evil.json").exists()


def test_an_archive_with_a_link_is_refused(bundle_dir: Path, tmp_path: Path) -> None:
    files = {
        p.relative_to(bundle_dir).as_posix(): p.read_bytes() for p in bundle_dir.rglob("*") if p.is_file()
    }
    files.pop("tables/decode.json")
    archive = tmp_path / "link.tar.gz"
    archive.write_bytes(_tar(files, {"tables/decode.json": "/etc/passwd"}))
    with pytest.raises(BundleCorruptError, match="not a regular file"):
        load_bundle(archive)


def test_a_table_with_two_entries_for_one_key_is_refused(bundle_dir: Path) -> None:
    table = json.loads((bundle_dir / "tables/decode.json").read_text())
    table["rows"][5:10] = table["rows"][0:5]  # the second row repeats the first row's key (and rule)
    data = json.dumps(table).encode()
    (bundle_dir / "tables/decode.json").write_bytes(data)
    rewrite_manifest(
        bundle_dir, lambda m: m["files"].update({"tables/decode.json": hashlib.sha256(data).hexdigest()})
    )
    with pytest.raises(BundleCorruptError, match="share one key"):
        load_bundle(bundle_dir)


def test_no_bundle_at_the_path_is_a_clear_user_error(tmp_path: Path) -> None:
    with pytest.raises(BundleNotFoundError, match="no bundle at") as err:
        load_bundle(tmp_path / "nothing")
    assert isinstance(err.value, UserError)


# -- the environment ---------------------------------------------------------------------------------


def test_a_bundle_made_on_another_gpu_is_refused_under_strict(bundle_dir: Path) -> None:
    h100 = {**HERE, "device_name": "NVIDIA H100 80GB HBM3"}
    with pytest.raises(BundleEnvironmentError, match="tuned on 'NVIDIA H200', this process has 'NVIDIA H100"):
        load_bundle(bundle_dir, env_policy="strict", environment=h100)


def test_a_bundle_made_on_another_gpu_warns_or_passes_per_policy(
    bundle_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = {**HERE, "device_name": "NVIDIA H200 NVL", "packages": {"triton": "3.5.1", "torch": "2.11.0"}}
    with caplog.at_level(logging.WARNING, logger="tunectl.runtime"):
        b = load_bundle(bundle_dir, env_policy="warn", environment=other)
    assert b.lookup("decode", **STATIC, batch=1, kv_len=1) == {"num_splits": 10}
    assert len(b.environment_problems) == 2 and "H200 NVL" in caplog.text and "triton" in caplog.text
    assert load_bundle(bundle_dir, env_policy="off", environment=other).environment_problems == ()


def test_the_or_none_loader_logs_and_returns_none_even_under_strict(
    bundle_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="tunectl.runtime"):
        got = load_bundle_or_none(bundle_dir, env_policy="strict", environment={"device_name": "cpu: x86"})
    assert got is None and "fall back to defaults" in caplog.text
    (bundle_dir / "manifest.json").write_text("{")
    assert load_bundle_or_none(bundle_dir) is None
    assert (load_bundle_or_none(bundle_dir) or empty_bundle()).lookup(
        "decode", **STATIC, batch=1, kv_len=1
    ) is None
    with pytest.raises(ValueError, match="env_policy"):  # a wrong argument is the caller's bug: it raises
        load_bundle_or_none(bundle_dir.parent / "elsewhere", env_policy="lenient")


@pytest.mark.parametrize(
    ("bundle", "here", "same"),
    [
        ("NVIDIA H200", "NVIDIA H200", True),
        ("NVIDIA H200", "H200", True),
        ("NVIDIA_H200", "nvidia  h200", True),
        ("NVIDIA H200", "NVIDIA H200 NVL", False),
        ("H100", "NVIDIA H100 80GB HBM3", False),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", False),
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090 D", False),
    ],
)
def test_device_names_match_whole_after_normalising(bundle: str, here: str, same: bool) -> None:
    assert (device_name_key(bundle) == device_name_key(here)) is same
    assert (environment_problems({"device_name": bundle}, {"device_name": here}) == []) is same


def test_compatible_devices_are_an_explicit_opt_in() -> None:
    wanted = {"device_name": "NVIDIA H200", "compatible_devices": ["NVIDIA H200 NVL"]}
    assert environment_problems(wanted, {"device_name": "H200 NVL"}) == []
    assert environment_problems(wanted, {"device_name": "H100"}) != []


@pytest.mark.parametrize("form", ["9.0", "90", "sm_90", "sm90", (9, 0), 9.0])
def test_compute_capability_forms(form: Any) -> None:
    assert capability_key(form) == "9.0"
    assert capability_key("100") == capability_key("sm_100") == "10.0" and capability_key("90a") == "9.0a"
    assert environment_problems({"compute_capability": "9.0"}, {"compute_capability": "10.0"}) != []


@pytest.mark.parametrize(
    ("want", "have", "same"),
    [
        ("3.6.0", "3.6.0", True),
        ("2.11.0+cu130", "2.11.0", True),
        ("2.11.0+cu130", "2.11.0+cu128", False),
        ("3.6.0", "3.5.1", False),
    ],
)
def test_library_versions(want: str, have: str, same: bool) -> None:
    problems = environment_problems({"packages": {"triton": want}}, {"packages": {"triton": have}})
    assert (problems == []) is same


def test_an_unconfirmable_device_is_a_problem_and_an_uninstalled_library_is_not() -> None:
    problems = environment_problems(H200, {"packages": {}})
    assert problems == [p for p in problems if "cannot confirm" in p] and len(problems) == 1
    assert environment_problems({"packages": {"not-a-real-package-xyz": "1.0"}}, {}) == []


def test_policy_and_device_come_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu_only = {"device_kind": "cuda", "device_name": "NVIDIA H200", "compute_capability": "9.0"}
    bundle_dir = publish(tmp_path, env=gpu_only)
    monkeypatch.setenv("TUNECTL_DEVICE_NAME", "NVIDIA H100")
    monkeypatch.setenv("TUNECTL_ENV_POLICY", "strict")
    with pytest.raises(BundleEnvironmentError):
        load_bundle(bundle_dir)
    monkeypatch.setenv("TUNECTL_DEVICE_NAME", "H200")
    monkeypatch.setenv("TUNECTL_COMPUTE_CAPABILITY", "sm_90")
    assert len(load_bundle(bundle_dir)) == 6


# -- sources: TUNECTL_BUNDLE, channels, fetchers, old schemas ------------------------------------------


def test_tunectl_bundle_names_a_channel(bundle_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = bundle_dir.parent.parent
    promote(LocalStore(store), "b", "1", "stable")
    monkeypatch.setenv("TUNECTL_BUNDLE", f"{store}/b@stable")
    b = load_bundle(environment=HERE)
    assert (b.name, b.version, b.channel) == ("b", "1", "stable")
    assert load_bundle(store, name="b", channel="stable", environment=HERE).version == "1"
    assert load_bundle(store, name="b", version="1", environment=HERE).channel is None
    monkeypatch.delenv("TUNECTL_BUNDLE")
    with pytest.raises(BundleNotFoundError, match="TUNECTL_BUNDLE"):
        load_bundle()
    with pytest.raises(BundleNotFoundError, match="no channel 'canary'"):
        load_bundle(f"{store}/b@canary")


def test_a_version_replaced_after_promotion_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    publish(store)
    promote(LocalStore(store), "b", "1", "stable")
    shutil.rmtree(store / "b" / "1")
    publish(store, tables=[decode_table(batches=(1, 2))])  # the same name and version, other contents
    with pytest.raises(BundleCorruptError, match="changed after it was promoted"):
        load_bundle(f"{store}/b@stable")


def test_uris_are_read_through_fetchers(bundle_dir: Path) -> None:
    objects = {
        f"mem://bucket/b/1/{p.relative_to(bundle_dir).as_posix()}": p.read_bytes()
        for p in bundle_dir.rglob("*")
        if p.is_file()
    }

    def fetch(uri: str) -> bytes:
        if uri not in objects:
            raise FileNotFoundError(uri)
        return objects[uri]

    assert len(load_bundle("mem://bucket/b/1", fetcher=fetch, environment=HERE)) == 6
    with pytest.raises(BundleReadError, match="no fetcher for mem://"):
        load_bundle("mem://bucket/b/1")
    register_fetcher("mem", fetch)
    try:
        assert len(load_bundle("mem://bucket/b/1", environment=HERE)) == 6
        with pytest.raises(BundleNotFoundError):
            load_bundle("mem://bucket/b/2")
    finally:
        register_fetcher("mem", None)

    def broken(uri: str) -> bytes:
        raise ConnectionResetError("peer went away")

    with pytest.raises(BundleReadError, match="peer went away"):
        load_bundle("mem://bucket/b/1", fetcher=broken)
    assert len(load_bundle(bundle_dir.as_uri(), environment=HERE)) == 6  # file:// is read locally


def test_a_fetcher_can_come_from_an_installed_package(bundle_dir: Path, tmp_path: Path) -> None:
    plugin = tmp_path / "plugin"
    (plugin / "memfetch-1.0.dist-info").mkdir(parents=True)
    (plugin / "memfetch-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: memfetch\nVersion: 1.0\n"
    )
    (plugin / "memfetch-1.0.dist-info" / "entry_points.txt").write_text(
        "[tunectl.fetchers]\nmem = memfetch:fetch\n"
    )
    (plugin / "memfetch.py").write_text(
        "from pathlib import Path\n"
        f"def fetch(uri):\n    return (Path({str(bundle_dir)!r}) / uri.split('/b/1/', 1)[1]).read_bytes()\n"
    )
    code = "from tunectl.runtime import load_bundle\nprint(len(load_bundle('mem://x/b/1', env_policy='off')))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": f"{plugin}:{ROOT}", "PATH": ""},
    )
    assert out.stdout.strip() == "6", out.stderr


def test_a_schema_1_bundle_still_loads(tmp_path: Path) -> None:
    entries = [
        {"static": {"dtype": "float32"}, "shape": {"batch": b}, "config": {"s": b}, "median_us": 1.0}
        for b in (1, 4)
    ]
    table = json.dumps({"schema_version": 1, "task": "t", "entries": entries}).encode()
    manifest = {
        "schema_version": 1,
        "name": "old",
        "version": "1",
        "environment": {},
        "source_runs": [],
        "tasks": {
            "t": {
                "table": "tables/t.json",
                "static_params": ["dtype"],
                "num_entries": 2,
                "shape_params": {"batch": {"policy": "pow2", "points": [1, 4]}},
            }
        },
        "files": {"tables/t.json": hashlib.sha256(table).hexdigest()},
    }
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables/t.json").write_bytes(table)
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    b = load_bundle(tmp_path)
    assert b.lookup("t", dtype="float32", batch=3) == {"s": 4}
    entry = b.entry("t", dtype="float32", batch=1)
    assert entry is not None and entry.median_us == 1.0 and entry.config == (("s", 1),)


def test_the_runtime_works_with_nothing_but_the_standard_library(bundle_dir: Path) -> None:
    """No site-packages at all (python -S): the runtime and the adapters still load, verify and look up."""
    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
from tunectl.runtime import load_bundle
from tunectl.runtime import adapters
here = {{"device_name": "H200", "packages": {{}}}}
b = load_bundle({str(bundle_dir)!r}, env_policy="strict", environment=here)
call = adapters.call(b, "decode_attention", batch=1)
hit = b.lookup("decode", **{STATIC!r}, batch=3, kv_len=100)
foreign = sorted(m for m in sys.modules if m.split(".")[0] not in sys.stdlib_module_names
                 and m.split(".")[0] not in ("tunectl", "__main__"))
print(json.dumps({{"hit": hit, "tuned": call.tuned, "foreign": foreign}}))
"""
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == {"hit": {"num_splits": 40}, "tuned": False, "foreign": []}


def test_an_empty_bundle_misses_everything() -> None:
    b = empty_bundle("none configured")
    assert len(b) == 0 and b.tasks == () and b.lookup("decode", batch=1) is None
    assert isinstance(BundleNotFoundError("x"), BundleError)
