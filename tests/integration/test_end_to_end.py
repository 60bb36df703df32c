"""The whole path on a local Ray instance with 2 logical GPUs: submit -> Parquet -> export -> lookup."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunectl.cli import app
from tunectl.runtime import load_bundle
from tunectl.store.results import read_results

pytestmark = pytest.mark.slow
STATIC = {"dtype": "float32", "num_q_heads": 4, "num_kv_heads": 2, "head_dim": 16, "page_size": 8}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_submit_export_lookup(ray_two_gpus: None, tiny_spec: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    results, store = tmp_path / "results", tmp_path / "bundles"
    tiny_spec.write_text(tiny_spec.read_text() + "[resources]\nbatch = 3\n")  # a point's 4 looks: 2 calls
    out = runner.invoke(app, ["submit", str(tiny_spec), "--results", str(results)])
    assert out.exit_code == 0, out.output
    assert "on 2 gpu worker(s)" in out.output
    assert "winners of" in out.output and "speedup" in out.output

    rows = read_results(results)
    # where the time of each worker that measured went, with the start-up it reported when it came up
    # (on a small grid one of the two can be left without an item)
    flat, workers = " ".join(out.output.split()), {r.worker for r in rows if r.worker}  # lines wrap
    assert flat.count(": started in ") == flat.count(" s from first item to last, ") == len(workers), flat
    assert all(f"{worker}: started in " in flat for worker in workers), flat
    [run] = json.loads(runner.invoke(app, ["runs", "--results", str(results), "--json"]).output)
    assert run["state"] == "finished" and run["num_planned"] == run["num_done"] == len(rows)
    measured = [r for r in rows if r.phase == "measure"]
    assert len(measured) == 24 and {r.status for r in rows} == {"ok"}
    assert all(r.median_us > 0 for r in rows)
    # min_samples (3) unless the time cap (max_seconds = 0.05) came first, as on a busy machine
    assert all(r.num_samples >= 3 or r.measure_ms >= 50.0 for r in rows), [
        (r.phase, r.num_samples, r.measure_ms) for r in rows if r.num_samples < 3
    ]
    assert sum(r.is_default for r in measured) == 6  # the default measured at every point
    calls = Counter((r.worker, r.started_at) for r in measured)  # a call's rows share its start
    assert max(calls.values()) == 3, calls  # [resources] batch: at most 3 looks a call
    finals: dict[str, list[dict]] = {}
    for r in rows:
        if r.phase == "final":
            finals.setdefault(r.group_id, []).append(r)
    assert finals, "points where a config came near the default get finals"
    for group in finals.values():
        assert sum(r.is_default for r in group) == 1 and 2 <= len(group) <= 4
        assert len({(r.static_key, r.shape_key) for r in group}) == 1
        for r in group:
            assert r.rounds == 3 and r.speedup_lo <= r.speedup <= r.speedup_hi

    export = ["export", "bundle", "--results", str(results), "--name", "tiny", "--version", "1"]
    export += ["--out", str(store)]
    out = runner.invoke(app, export)
    assert out.exit_code == 0, out.output
    bundle_dir = store / "tiny" / "1"
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    assert manifest["tasks"]["decode_attention"]["shape_params"]["batch"] == {
        "policy": "pow2",
        "points": [1, 2, 4],
    }
    assert set(manifest["files"]) == {"tables/decode_attention.json", "stats/decode_attention.json"}
    assert manifest["environment"]["device_name"]

    before = _tree(store)
    again = runner.invoke(app, export)
    assert again.exit_code == 2 and "already exists" in again.output
    assert "Traceback" not in again.output
    assert _tree(store) == before, "a refused export changes nothing"

    entries = load_bundle(bundle_dir, env_policy="off").entries("decode_attention")
    winners = {json.dumps(e.to_json()["shape"], sort_keys=True): e.to_json()["config"] for e in entries}
    script = textwrap.dedent(f"""
        import json, sys
        from tunectl.runtime import load_bundle
        b = load_bundle({str(bundle_dir)!r})
        s = {STATIC!r}
        print(json.dumps({{
            "b3_kv100": b.lookup("decode_attention", **s, batch=3, kv_len=100),
            "b1_kv64": b.lookup("decode_attention", **s, batch=1, kv_len=64),
            "too_long": b.lookup("decode_attention", **s, batch=1, kv_len=129),
            "batch_8": b.lookup("decode_attention", **s, batch=8, kv_len=64),
            "other_static": b.lookup("decode_attention", **{{**s, "head_dim": 32}}, batch=1, kv_len=64),
            "other_task": b.lookup("flash_decode", **s, batch=1, kv_len=64),
            "heavy": sorted(m for m in sys.modules
                            if m.split(".")[0] in ("ray", "torch", "pyarrow", "typer")),
        }}))
    """)
    got = json.loads(
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    )
    assert got["b3_kv100"] == winners['{"batch": 4, "kv_len": 128}']  # pow2 batch, ceil kv_len
    assert got["b1_kv64"] == winners['{"batch": 1, "kv_len": 64}']
    assert got["too_long"] is None and got["batch_8"] is None
    assert got["other_static"] is None and got["other_task"] is None
    assert got["heavy"] == []
