"""Bundle stores on a real S3-compatible server on loopback (the whole path through one, tuning on a
local Ray instance: tests/integration/test_stores_on_ray.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.s3server import S3, s3_server
from tunectl.core.errors import BundleExistsError, UserError
from tunectl.runtime import BundleCorruptError, BundleNotFoundError, Entry, load_bundle
from tunectl.store.bundle import TaskTable, build_files, list_bundles, promote, publish, read_channel
from tunectl.store.stores import ArrowStore, LocalStore, fetch, open_store

ROOT = Path(__file__).resolve().parents[2]
STATIC = {"dtype": "float32", "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16, "page_size": 8}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_server() as server:
        yield server


def table(splits: int) -> TaskTable:
    entries = tuple(
        Entry.from_json({"static": STATIC, "shape": {"batch": b}, "config": {"num_splits": splits * b}})
        for b in (1, 4)
    )
    return TaskTable(
        "decode_attention", tuple(STATIC), {"batch": {"policy": "pow2", "points": [1, 4]}}, entries
    )


def test_publish_promote_and_load_by_channel_on_s3(s3: S3) -> None:
    store = open_store(s3.uri("pp"))
    assert isinstance(store, ArrowStore)
    for version, splits in (("1", 1), ("2", 2)):
        assert publish(store, "b", version, build_files("b", version, [table(splits)], [], {})) == s3.uri(
            "pp", "b", version
        )
    promote(store, "b", "1", "stable")
    assert promote(store, "b", "2", "stable").previous == "1"
    versions, channels = list_bundles(store)
    assert [v.version for v in versions] == ["1", "2"] and [(c.channel, c.version) for c in channels] == [
        ("stable", "2")
    ]
    bundle = load_bundle(s3.uri("pp", "b@stable"), fetcher=fetch, env_policy="off")
    assert (bundle.version, bundle.channel) == ("2", "stable")
    assert bundle.lookup("decode_attention", **STATIC, batch=3) == {"num_splits": 8}
    assert load_bundle(s3.uri("pp"), name="b", version="1", fetcher=fetch).lookup(
        "decode_attention", **STATIC, batch=1
    ) == {"num_splits": 1}


def test_an_existing_version_on_s3_is_never_overwritten(s3: S3) -> None:
    store = open_store(s3.uri("immutable"))
    publish(store, "b", "1", build_files("b", "1", [table(1)], [], {}))
    before = {p: store.read(f"b/1/{p}") for p in ("manifest.json", "tables/decode_attention.json")}
    with pytest.raises(BundleExistsError):
        publish(store, "b", "1", build_files("b", "1", [table(5)], [], {}))
    assert {p: store.read(f"b/1/{p}") for p in before} == before


def test_a_tampered_object_is_refused_and_a_missing_one_is_not_found(s3: S3) -> None:
    store = open_store(s3.uri("tamper"))
    publish(store, "b", "1", build_files("b", "1", [table(1)], [], {}))
    store.replace("b/1/tables/decode_attention.json", b'{"rows": []}')
    with pytest.raises(BundleCorruptError, match="checksum"):
        load_bundle(s3.uri("tamper", "b", "1"), fetcher=fetch)
    with pytest.raises(BundleNotFoundError):
        load_bundle(s3.uri("tamper", "b", "9"), fetcher=fetch)
    assert read_channel(store, "b", "stable") is None


def test_the_endpoint_can_ride_in_the_uri(s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    host = s3.endpoint.removeprefix("http://")
    uri = f"s3://{s3.bucket}/query?endpoint_override={host}&scheme=http"
    store = open_store(uri)
    location = publish(store, "b", "1", build_files("b", "1", [table(3)], [], {}))
    assert location.endswith("/b/1?endpoint_override=" + host + "&scheme=http")
    assert len(load_bundle(location, fetcher=fetch)) == 2


def test_a_filesystem_store_publishes_by_renaming_a_staged_version(tmp_path: Path) -> None:
    store = ArrowStore(tmp_path.as_uri())  # pyarrow's local filesystem: the path HDFS takes
    assert store.fs.type_name == "local"
    publish(store, "b", "1", build_files("b", "1", [table(1)], [], {}))
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    with pytest.raises(BundleExistsError):
        publish(store, "b", "1", build_files("b", "1", [table(2)], [], {}))
    assert (
        sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == before
    )  # no staging left
    promote(store, "b", "1", "stable")
    promote(store, "b", "1", "canary")
    assert [c.channel for c in list_bundles(store)[1]] == ["canary", "stable"]
    assert load_bundle(f"{tmp_path}/b@stable").lookup("decode_attention", **STATIC, batch=4) == {
        "num_splits": 4
    }


def test_stores_are_local_paths_or_known_schemes(tmp_path: Path) -> None:
    assert isinstance(open_store(tmp_path), LocalStore)
    assert isinstance(open_store(tmp_path.as_uri()), LocalStore)
    with pytest.raises(UserError, match="s3://"):
        open_store("ftp://host/bundles")


def test_reading_s3_without_pyarrow_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['pyarrow'] = sys.modules['pyarrow.fs'] = None\n"
        "from tunectl.runtime import load_bundle, BundleReadError\nfrom tunectl.store.stores import fetch\n"
        "try:\n    load_bundle('s3://b/x/1', fetcher=fetch)\nexcept BundleReadError as e:\n    print(e)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert "needs pyarrow" in out.stdout
