"""configs/lightllm/flash_decode.toml, LightLLM's FA3 decode tuner as a spec: it plans LightLLM's
candidate set on LightLLM's keys, and its winners export to files LightLLM's loader finds by its rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tests.decode_keys import decode_run_key, lightllm_lookup, lightllm_static_key
from tests.unit.test_formats import ENV
from tunectl.cli import app
from tunectl.core.plan import plan
from tunectl.core.spec import load_spec
from tunectl.runtime import Entry, load_bundle
from tunectl.store.bundle import TaskTable, build_files, publish_local

SPEC = Path(__file__).resolve().parents[2] / "configs" / "lightllm" / "flash_decode.toml"
LIGHTLLM_STATIC_KEY = lightllm_static_key(page_size=128)  # bf16, 32/8 heads, d128, page 128, causal


def run_key(batch: int, kv_len: int) -> int:
    return decode_run_key(batch, kv_len, page_size=128)


def synthetic_winner(batch: int, kv_len: int) -> dict[str, Any]:
    """A made-up winner per point (fewer splits as the batch grows), flash-attn-4 at the largest batch."""
    if batch >= 256:
        return {"backend": "fa4"}
    num_splits = 32 if batch * kv_len <= 32768 else 16 if batch * kv_len <= 262144 else 0
    return {"backend": "fa3", "num_splits": num_splits}


def test_the_spec_plans_lightllms_candidates_on_its_kv_steps() -> None:
    spec = load_spec(SPEC)
    items = list(plan(spec).work_items())
    configs = {tuple(sorted(dict(i.config).items())) for i in items}
    assert configs == {  # LightLLM's set alone: its own default (FA3's heuristic) is the baseline
        (("backend", "fa3"),),
        (("backend", "fa3"), ("num_splits", 16)),
        (("backend", "fa3"), ("num_splits", 32)),
    }
    assert all(dict(i.shape)["kv_len"] % 512 == 0 and dict(i.shape)["q_len"] == 1 for i in items)
    buckets = {d.name: d.bucket for d in spec.shapes}
    assert buckets == {"batch": "nearest", "kv_len": "nearest", "q_len": "exact"}
    assert dict(items[0].static)["page_size"] == 128
    assert {dict(i.config).get("num_splits", 0) for i in items if i.is_default} == {0}


def test_its_winners_export_to_files_lightllms_loader_reads(tmp_path: Path) -> None:
    spec = load_spec(SPEC)
    items = list(plan(spec).work_items())
    points = sorted({(dict(i.shape)["batch"], dict(i.shape)["kv_len"]) for i in items})
    static = dict(items[0].static)
    stats = {"median_us": 50.0, "default_median_us": 60.0, "speedup": 1.2}
    shapes = [{"batch": b, "kv_len": kv, "q_len": 1} for b, kv in points]
    entries = tuple(
        Entry.from_json({"static": static, "shape": shape, "config": synthetic_winner(b, kv), **stats})
        for shape, (b, kv) in zip(shapes, points, strict=True)
    )
    table = TaskTable(
        "flash_decode",
        tuple(static),
        {d.name: {"policy": d.bucket, "points": list(d.values)} for d in spec.shapes},
        entries,
    )
    files = build_files("lightllm-fa3", "1", [table], ["r1"], ENV)
    store = publish_local(tmp_path / "store", "lightllm-fa3", "1", files)
    out = tmp_path / "autotune_kernel_configs"
    res = CliRunner().invoke(app, ["export", "lightllm", str(store), "--backend", "fa3", "--out", str(out)])
    num_fa3 = sum(1 for b, _ in points if b < 256)
    assert res.exit_code == 0 and f"wrote {num_fa3} run keys in 1 file(s)" in res.output, res.output
    assert "winner is backend fa4" in res.output, "points another backend won are left out, and said so"
    for b, kv in points:
        if b < 256:
            got = lightllm_lookup(out, "NVIDIA H200", "3.6.0", LIGHTLLM_STATIC_KEY, run_key(b, kv))
            assert got == {"num_splits": synthetic_winner(b, kv)["num_splits"]}, (b, kv)
    # Off the grid, LightLLM's nearest run key and tunectl's nearest buckets pick the same entry.
    bundle = load_bundle(store, env_policy="off")
    for b, kv in [(4, 1800), (16, 7000), (2, 30000)]:
        config = bundle.lookup("flash_decode", **static, batch=b, kv_len=kv, q_len=1)
        assert config is not None and config["backend"] == "fa3"
        got = lightllm_lookup(out, "NVIDIA H200", "3.6.0", LIGHTLLM_STATIC_KEY, run_key(b, kv))
        assert got == {"num_splits": config["num_splits"]}, (b, kv)
