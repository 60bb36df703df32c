"""The whole path through an S3-compatible store on loopback: tune on a local Ray instance, export to
S3, promote, and serve from the channel."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.s3server import S3, s3_server
from tests.unit.test_stores import ROOT, STATIC
from tunectl.cli import app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_server() as server:
        yield server


def test_submit_export_publish_promote_and_load_by_channel(
    ray_two_gpus: None, tiny_spec: Path, tmp_path: Path, s3: S3
) -> None:
    """The whole path: tune on Ray, export to S3, promote, and serve from the channel."""
    from tunectl.orchestrator.submit import submit

    results, store = tmp_path / "results", s3.uri("fleet")
    done = submit(str(tiny_spec), results)
    assert sum(done.statuses.values()) == done.statuses["ok"] >= 24  # 24 measured, then the finals
    runner = CliRunner()
    out = runner.invoke(
        app,
        ["export", "bundle", "--results", str(results), "--name", "tiny", "--version", "1", "--out", store],
    )
    assert out.exit_code == 0 and f"at {store}/tiny/1" in out.output, out.output
    out = runner.invoke(app, ["bundle", "promote", "tiny", "1", "--channel", "stable", "--store", store])
    assert out.exit_code == 0, out.output
    out = runner.invoke(app, ["bundle", "list", store, "--json"])
    assert json.loads(out.output)["channels"][0]["version"] == "1"

    script = (
        "import json\nfrom tunectl.store.stores import register_fetchers\n"
        "from tunectl.runtime import load_bundle\n"
        "register_fetchers()\n"
        f"b = load_bundle({store + '/tiny@stable'!r}, env_policy='strict')\n"
        f"s = {STATIC!r}\n"
        "print(json.dumps([b.channel, b.lookup('decode_attention', **s, batch=3, kv_len=100),\n"
        "                  b.entry('decode_attention', **s, batch=4, kv_len=128).to_json()]))"
    )
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert got.returncode == 0, got.stderr
    channel, hit, entry = json.loads(got.stdout)
    assert channel == "stable" and hit == entry["config"]  # batch 3 -> pow2 4, kv_len 100 -> ceil 128
    assert entry["median_us"] > 0 and entry["run_id"] == done.run_id
