"""Exports other engines read, each read back by that engine's own rules; and the per-task adapters."""

from __future__ import annotations

import json
import logging
import typing
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.decode_keys import decode_run_key, flash_static, lightllm_lookup, lightllm_static_key
from tunectl.cli import app
from tunectl.core.errors import UserError
from tunectl.formats.engines import export_flex_options, export_lightllm, lightllm_run_key
from tunectl.runtime import Bundle, Entry, adapters, load_bundle
from tunectl.store.bundle import TaskTable, build_files, publish_local

DECODE_STATIC = flash_static(window=[-1, -1])  # as a bundle entry holds it (JSON)
PREFILL_STATIC = {
    "dtype": "bfloat16",
    "head_dim": 128,
    "mask": "document_causal",
    "num_docs": 4,
    "num_kv_heads": 8,
    "num_q_heads": 32,
    "window": [-1, -1],
}
ENV = {
    "device_kind": "cuda",
    "device_name": "NVIDIA H200",
    "compute_capability": "9.0",
    "packages": {"torch": "2.11.0+cu130", "triton": "3.6.0", "sgl-kernel": "0.3.21"},
}
DECODE_WINNERS = {  # (batch, kv_len) -> winner config
    (1, 32768): {"backend": "sgl", "num_splits": 32},
    (4, 8192): {"backend": "sgl", "num_splits": 8},
    (64, 2048): {"backend": "fa4", "num_splits": 1, "pack_gqa": True},
    (128, 4096): {
        "backend": "flex",
        "BLOCK_M": 64,
        "BLOCK_N": 128,
        "num_warps": 4,
        "num_stages": 2,
        "SPLIT_KV": 4,
    },
    (2, 32768): {"backend": "sgl", "num_splits": 16},
}
PREFILL_WINNERS = {
    (2, 4096): {
        "BLOCK_M": 128,
        "BLOCK_N": 64,
        "num_warps": 8,
        "num_stages": 3,
        "USE_TMA": True,
        "BACKEND": "TRITON",
    },
    (1, 8192): {},  # Inductor's own choice won
}


def _table(task: str, static: dict[str, Any], dims: tuple[str, ...], winners: dict[Any, Any]) -> TaskTable:
    q_len = {"q_len": 1} if task == "flash_decode" else {}
    stats = {"median_us": 100.0, "default_median_us": 150.0, "speedup": 1.5}
    shape_of = {p: dict(zip(dims, p, strict=True)) | q_len for p in winners}
    entries = tuple(
        Entry.from_json({"static": static, "shape": shape_of[p], "config": c, **stats})
        for p, c in winners.items()
    )
    names = (*dims, "q_len") if task == "flash_decode" else dims
    shapes = {d: {"policy": "exact", "points": sorted({dict(e.shape)[d] for e in entries})} for d in names}
    return TaskTable(task, tuple(static), shapes, entries)


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    tables = [
        _table("flash_decode", DECODE_STATIC, ("batch", "kv_len"), DECODE_WINNERS),
        _table("flex_prefill", PREFILL_STATIC, ("batch", "seq_len"), PREFILL_WINNERS),
    ]
    path = publish_local(tmp_path / "store", "h200", "1", build_files("h200", "1", tables, ["r1"], ENV))
    return load_bundle(path, env_policy="off")


# -- FlexAttention kernel_options, as attention-gym's replay writes them --------------------------------


def test_flex_options_read_back_as_torch_kernel_options(bundle: Bundle, tmp_path: Path) -> None:
    from torch.nn.attention import flex_attention as fa

    res = export_flex_options(bundle, tmp_path / "flex")
    index = json.loads((tmp_path / "flex/index.json").read_text())
    assert index["format"] == "tunectl.flex_kernel_options" and index["device_name"] == "NVIDIA H200"
    assert res.num_entries == 3 and sum(res.skipped.values()) == 4  # decode points won by other backends
    known = set(fa.FlexKernelOptions.__annotations__)
    backends = set(typing.get_args(getattr(fa, "_Backend", str)))
    for info in index["tasks"].values():
        for item in info["entries"]:
            options = json.loads((tmp_path / "flex" / item["file"]).read_text())
            assert options == item["kernel_options"]
            for key, value in options.items():
                prefix, _, bare = key.partition("_") if key.startswith(("fwd_", "bwd_")) else ("", "", key)
                # the replay keeps FlexKernelOptions names; SPLIT_KV is read by Flex's decode kernel
                assert bare in known | {"SPLIT_KV"}, key
                assert prefix in ("fwd", "") and (prefix == "fwd") == (bare not in adapters.FLEX_CALL_OPTIONS)
                if bare == "BACKEND":
                    assert value in backends
    prefill = {
        tuple(e["shape"].values()): e["kernel_options"] for e in index["tasks"]["flex_prefill"]["entries"]
    }
    assert prefill[(2, 4096)] == {
        "BACKEND": "TRITON",
        "fwd_BLOCK_M": 128,
        "fwd_BLOCK_N": 64,
        "fwd_USE_TMA": True,
        "fwd_num_stages": 3,
        "fwd_num_warps": 8,
    }
    assert prefill[(1, 8192)] == {}  # the default: flex_attention chooses
    decode = index["tasks"]["flash_decode"]["entries"]
    assert [e["kernel_options"]["fwd_SPLIT_KV"] for e in decode] == [4]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_torch_accepts_the_exported_options(bundle: Bundle, tmp_path: Path) -> None:
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    export_flex_options(bundle, tmp_path / "flex", ["flex_prefill"])
    entry = json.loads((tmp_path / "flex/index.json").read_text())["tasks"]["flex_prefill"]["entries"][0]
    options = json.loads((tmp_path / "flex" / entry["file"]).read_text())
    q = torch.randn(1, 2, 32, 16)
    out = flex_attention(q, q, q, kernel_options=options)  # validates BACKEND and the option names it knows
    assert out.shape == q.shape


# -- LightLLM's autotune layout for flash_attn_with_kvcache decode ---------------------------------------


def test_lightllm_configs_are_found_by_lightllms_rules(bundle: Bundle, tmp_path: Path) -> None:
    res = export_lightllm(bundle, tmp_path / "autotune_kernel_configs")
    assert res.num_entries == 3 and res.skipped == {
        "winner is backend fa4, not sgl": 1,
        "winner is backend flex, not sgl": 1,
    }
    static_key = lightllm_static_key(page_size=16)

    def run_key(batch: int, kv_len: int) -> int:
        return decode_run_key(batch, kv_len, page_size=16)

    root = tmp_path / "autotune_kernel_configs"
    for (batch, kv_len), config in DECODE_WINNERS.items():
        if config["backend"] == "sgl":
            got = lightllm_lookup(root, "NVIDIA H200", "3.6.0", static_key, run_key(batch, kv_len))
            assert got == {"num_splits": config["num_splits"]}
    # an untuned run key takes the nearest stored one, as LightLLM does: batch 5 lands on batch 4's
    assert lightllm_lookup(root, "NVIDIA H200", "3.6.0", static_key, run_key(5, 8000)) == {"num_splits": 8}


def test_lightllm_export_refuses_run_keys_that_would_collide() -> None:
    assert lightllm_run_key(1, 1, 1024, 16) == 10**13 + 10**7 + 64
    with pytest.raises(UserError, match="collide"):
        lightllm_run_key(1, 1, 10**7 * 16, 16)
    with pytest.raises(UserError, match="collide"):
        lightllm_run_key(1, 10**6, 1024, 16)


def test_export_commands_write_the_formats(bundle: Bundle, tmp_path: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(app, ["export", "flex-options", bundle.location, "--out", str(tmp_path / "f")])
    assert out.exit_code == 0 and "wrote 3 kernel_options" in out.output and "left out" in out.output, (
        out.output
    )
    out = runner.invoke(app, ["export", "lightllm", bundle.location, "--out", str(tmp_path / "l")])
    assert out.exit_code == 0 and "wrote 3 run keys in 1 file(s)" in out.output, out.output
    out = runner.invoke(
        app, ["export", "lightllm", bundle.location, "--out", str(tmp_path / "l"), "--task", "x"]
    )
    assert out.exit_code == 2 and out.output.startswith("error: ")


# -- adapters ----------------------------------------------------------------------------------------


def test_every_decode_backend_option_reaches_the_call() -> None:
    from tunectl.tasks.flash_decode import BACKEND_DEFAULTS, BACKEND_OPTIONS

    assert set(BACKEND_OPTIONS) == set(adapters.DECODE_BACKENDS)
    samples = {
        "pack_gqa": True,
        "num_splits": 7,
        "kv_page_size": 256,
        "sdpa_backend": "cudnn",
        "sdpa_gqa": "expand",
        "BLOCK_M": 64,
        "BLOCK_N": 32,
        "num_warps": 4,
        "num_stages": 2,
        "SPLIT_KV": 8,
        "USE_TMA": True,
        "BACKEND": "TRITON",
        "num_kv_splits": 16,
        "split_rule": "one_wave",
        "BLOCK_H": 16,
        "use_tensor_cores": True,
        "fixed_split_size": 16,
        "disable_split_kv": True,
        "kv_layout": "HND",
    }
    for backend, options in BACKEND_OPTIONS.items():
        call = adapters.flash_decode({"backend": backend, **{o: samples[o] for o in options}})
        assert call.backend == backend and call.tuned
        carried = json.dumps([call.kwargs, call.requires])
        for option in options:
            assert option in carried or (option == "sdpa_gqa" and call.requires["expand_kv"]), (
                backend,
                option,
            )
        assert adapters.flash_decode(BACKEND_DEFAULTS[backend]).backend == backend
    assert adapters.flash_decode({"backend": "fa2", "num_splits": 8, "kv_page_size": 256}) == adapters.Call(
        "fa2", {"num_splits": 8}, True, {"kv_page_size": 256}
    )


def test_a_miss_or_an_unknown_backend_gives_the_untuned_call(caplog: pytest.LogCaptureFixture) -> None:
    from tunectl.tasks.decode_attention import DecodeAttention

    assert adapters.flash_decode(None) == adapters.Call("fa4", {"num_splits": 1, "pack_gqa": None}, False)
    with caplog.at_level(logging.WARNING):
        assert not adapters.flash_decode({"backend": "fa9"}).tuned
    assert "unknown backend" in caplog.text
    assert adapters.flex_prefill(None).kwargs == {} and adapters.flex_prefill({}).kwargs == {}
    assert adapters.decode_attention(None).kwargs == DecodeAttention().default_config({})
    assert adapters.decode_attention({"num_splits": 4}).kwargs == {
        "num_splits": 4,
        "gather": "index",
        "gqa": "expand",
    }


def test_call_looks_up_and_adapts(bundle: Bundle) -> None:
    call = adapters.call(bundle, "flash_decode", **DECODE_STATIC, batch=4, kv_len=8192, q_len=1)
    assert call == adapters.Call("sgl", {"num_splits": 8, "pack_gqa": None}, True)
    flex = adapters.call(bundle, "flex_prefill", **PREFILL_STATIC, batch=2, seq_len=4096)
    assert (
        flex.kwargs["kernel_options"]["fwd_BLOCK_M"] == 128
        and flex.kwargs["kernel_options"]["BACKEND"] == "TRITON"
    )
