"""The FlashInfer decode backend: its arguments, config rules, compile key and cache, on CPU (the kernel
against the reference on a GPU: tests/gpu/test_gpu_flashinfer.py).

FlashInfer is not installed in CI, so the mapping is bound to the signatures FlashInfer 0.7.2.post1
declares (flashinfer/decode.py, ``BatchDecodeWithPagedKVCacheWrapper.__init__`` and the keyword
options of ``plan``), copied below with bodies elided; where FlashInfer is installed, the real ones too.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

from tests.decode_keys import flash_static
from tunectl.tasks import _adapters_flashinfer as fi
from tunectl.tasks.base import InvalidConfig
from tunectl.tasks.compile import cache_env
from tunectl.tasks.flash_decode import BACKEND_DEFAULTS, FlashDecode

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[2]


def wrapper_init(float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, use_tensor_cores=False,
                 paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None, backend="auto", jit_args=None):  # fmt: skip
    ...


def wrapper_plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *,
                 pos_encoding_mode="NONE", window_left=-1, window_right=0, logits_soft_cap=None,
                 q_data_type="float16", kv_data_type=None, o_data_type=None, data_type=None,
                 sm_scale=None, rope_scale=None, rope_theta=None, non_blocking=True, block_tables=None,
                 seq_lens=None, fixed_split_size=None, disable_split_kv=False, q_len_per_req=1,
                 is_causal=None):  # fmt: skip
    ...


STATIC = flash_static(head_dim=16, num_kv_heads=2, num_q_heads=8)
SHAPE = {"batch": 3, "kv_len": 37, "q_len": 1}


def _inputs(static: dict[str, Any] = STATIC, shape: dict[str, Any] = SHAPE) -> dict[str, Any]:
    return FlashDecode().build_inputs(static, shape, "cpu")


def _arrays(inputs: dict[str, Any], page_size: int = 16) -> dict[str, Any]:
    meta = fi.page_metadata(inputs["page_table"], inputs["kv_len"], page_size)
    return dict(zip(("indptr", "indices", "last_page_len"), meta, strict=True))


def _bind(fn: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    bound = inspect.signature(fn).bind(**kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


# -- page metadata -------------------------------------------------------------------------------------


def test_page_metadata_lists_each_sequences_pages_in_order_and_the_fill_of_the_last() -> None:
    table = torch.tensor([[5, 2, 7], [0, 3, 1]], dtype=torch.int32)
    indptr, indices, last = fi.page_metadata(table, kv_len=37, page_size=16)  # 16 + 16 + 5 tokens
    assert indptr.tolist() == [0, 3, 6]
    assert indices.tolist() == [5, 2, 7, 0, 3, 1]
    assert last.tolist() == [5, 5]
    assert {t.dtype for t in (indptr, indices, last)} == {torch.int32}


def test_a_full_last_page_counts_page_size_tokens_not_zero() -> None:
    table = torch.tensor([[4, 9], [8, 6]], dtype=torch.int32)
    indptr, indices, last = fi.page_metadata(table, kv_len=32, page_size=16)
    assert indptr.tolist() == [0, 2, 4] and indices.tolist() == [4, 9, 8, 6] and last.tolist() == [16, 16]


def test_the_metadata_walks_exactly_the_tokens_the_reference_attends_to() -> None:
    inputs = _inputs(STATIC, {"batch": 3, "kv_len": 45, "q_len": 1})
    indptr, indices, last = fi.page_metadata(inputs["page_table"], 45, 16)
    cache = inputs["k_cache"]
    for b in range(3):
        pages = indices[indptr[b] : indptr[b + 1]].long()
        walked = torch.cat([cache[pages[:-1]].flatten(0, 1), cache[pages[-1], : int(last[b])]])
        expected = cache[inputs["page_table"][b].long()].flatten(0, 1)[:45]
        assert torch.equal(walked, expected)


# -- arguments -----------------------------------------------------------------------------------------


def test_the_wrapper_is_made_for_cuda_graphs_with_buffers_sized_for_the_batch() -> None:
    inputs = _inputs()
    arrays = _arrays(inputs)
    ws = torch.zeros(8, dtype=torch.uint8)
    args = _bind(wrapper_init, fi.wrapper_kwargs({"use_tensor_cores": True}, workspace=ws, **arrays))
    assert args["use_cuda_graph"] is True and args["use_tensor_cores"] is True
    assert args["kv_layout"] == "NHD" and args["backend"] == "auto" and args["float_workspace_buffer"] is ws
    assert args["paged_kv_indptr_buffer"].shape == (4,)  # batch + 1
    assert args["paged_kv_indices_buffer"].shape == (9,)  # 3 sequences x 3 pages
    assert args["paged_kv_last_page_len_buffer"].shape == (3,)
    assert args["paged_kv_indptr_buffer"] is not arrays["indptr"], "plan() copies into buffers of its own"
    defaults = _bind(wrapper_init, fi.wrapper_kwargs({}, workspace=ws, **arrays))
    assert defaults["use_tensor_cores"] is False  # the library's default: the CUDA-core decode kernel


def test_plan_gets_the_static_key_and_only_the_split_options_the_config_sets() -> None:
    inputs = _inputs()
    arrays = _arrays(inputs)
    args = _bind(wrapper_plan, fi.plan_kwargs(STATIC, {"backend": "flashinfer"}, **arrays))
    assert (args["num_qo_heads"], args["num_kv_heads"], args["head_dim"], args["page_size"]) == (8, 2, 16, 16)
    assert args["q_data_type"] == args["kv_data_type"] == torch.bfloat16
    assert args["window_left"] == -1 and args["logits_soft_cap"] == 0.0
    assert args["fixed_split_size"] is None and args["disable_split_kv"] is False  # FlashInfer's own plan
    assert args["indices"] is arrays["indices"] and args["q_len_per_req"] == 1
    static = {**STATIC, "window": (64, 0), "softcap": 30.0, "dtype": "float16"}
    config = {"use_tensor_cores": True, "fixed_split_size": 8}
    args = _bind(wrapper_plan, fi.plan_kwargs(static, config, **arrays))
    assert args["window_left"] == 64 and args["logits_soft_cap"] == 30.0 and args["fixed_split_size"] == 8
    assert args["q_data_type"] == torch.float16
    args = _bind(wrapper_plan, fi.plan_kwargs(STATIC, {"use_tensor_cores": True, "disable_split_kv": True},
                                              **arrays))  # fmt: skip
    assert args["disable_split_kv"] is True


def test_the_hnd_layout_is_a_relaid_copy_made_once_per_point() -> None:
    inputs = _inputs(STATIC)
    assert fi.kv_cache(inputs, "NHD") == (inputs["k_cache"], inputs["v_cache"])
    k, v = fi.kv_cache(inputs, "HND")
    assert k.shape == (inputs["k_cache"].shape[0], 2, 16, 16)  # [pages, kv heads, page size, dim]
    assert torch.equal(k.transpose(1, 2), inputs["k_cache"])
    assert torch.equal(v.transpose(1, 2), inputs["v_cache"])
    assert k.is_contiguous() and fi.kv_cache(inputs, "HND")[0] is k


def test_the_installed_flashinfer_takes_the_same_arguments() -> None:
    try:
        wrapper = importlib.import_module("flashinfer").BatchDecodeWithPagedKVCacheWrapper
    except Exception as exc:  # not installed in CI
        pytest.skip(f"flashinfer not importable: {type(exc).__name__}")
    inputs = _inputs()
    arrays = _arrays(inputs)
    config = {"use_tensor_cores": True, "fixed_split_size": 4}
    inspect.signature(wrapper.__init__).bind(None, **fi.wrapper_kwargs(config, workspace=None, **arrays))
    inspect.signature(wrapper._plan_impl).bind(None, **fi.plan_kwargs(STATIC, config, **arrays))


# -- config rules --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("static", "shape", "config", "why"),
    [
        ({}, {}, {"fixed_split_size": 8}, "tensor-core path only"),
        ({}, {}, {"use_tensor_cores": False, "disable_split_kv": True}, "tensor-core path only"),
        ({}, {}, {"use_tensor_cores": True, "fixed_split_size": 8, "disable_split_kv": True}, "exclude"),
        ({}, {}, {"use_tensor_cores": True, "fixed_split_size": 0}, "pages >= 1"),
        ({}, {}, {"use_tensor_cores": "yes"}, "true or false"),
        ({}, {}, {"kv_layout": "NDH"}, "one of NHD, HND"),
        ({"dtype": "float32"}, {}, {}, "float16 or bfloat16"),
        ({"sinks": True}, {}, {}, "sinks"),
        ({}, {"q_len": 2, "kv_len": 40}, {"use_tensor_cores": True}, "one query token"),
    ],
)
def test_configs_flashinfer_cannot_run_as_asked_are_invalid_in_one_line(
    static: dict[str, Any], shape: dict[str, Any], config: dict[str, Any], why: str
) -> None:
    static, shape = {**STATIC, **static}, {**SHAPE, **shape}
    task = FlashDecode()
    with pytest.raises(InvalidConfig, match=why) as err:
        inputs = task.build_inputs(static, shape, "cpu")
        task.prepare(static, shape, {"backend": "flashinfer", **config}, inputs)
    assert "\n" not in str(err.value)


def test_a_split_the_cuda_graph_plan_refuses_is_invalid_and_other_failures_stay_errors() -> None:
    from tunectl.tasks._lazy import lazily

    refused = RuntimeError(
        "Error in function 'PrefillSplitQOKVIndptr' at include/flashinfer/attention/scheduler.cuh:674: "
        "new batch size 128 exceeds the maximum 96\nstack"
    )
    call = lazily(lambda: (_ for _ in ()).throw(refused), fi.rejection)
    with pytest.raises(InvalidConfig, match=r"fixed_split_size pages .*PrefillSplitQOKVIndptr.*96$"):
        call()
    assert fi.rejection(NotImplementedError("head_dim 96")) == "flashinfer rejects this point: head_dim 96"
    assert fi.rejection(RuntimeError("CUDA error: out of memory")) is None, "an error, not a verdict"


def test_a_valid_config_on_a_cpu_is_invalid_there_before_flashinfer_is_imported() -> None:
    task = FlashDecode()
    with pytest.raises(InvalidConfig, match="CUDA devices only"):
        task.prepare(STATIC, SHAPE, {"backend": "flashinfer", "use_tensor_cores": True}, _inputs())


def test_options_of_other_backends_do_not_apply_to_flashinfer() -> None:
    task = FlashDecode()
    with pytest.raises(InvalidConfig, match="num_splits"):
        task.prepare(STATIC, SHAPE, {"backend": "flashinfer", "num_splits": 4}, _inputs())


def test_a_spec_with_a_bad_flashinfer_option_is_refused_in_one_line_naming_the_field(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tunectl.cli import app

    text = (ROOT / "configs" / "h200" / "flash_decode.toml").read_text()
    bad = tmp_path / "bad.toml"
    extra = '[[configs]]\nbackend = "flashinfer"\nuse_tensor_cores = true\nfixed_split_size = "auto"\n'
    bad.write_text(f"{text}\n{extra}")
    out = CliRunner().invoke(app, ["submit", str(bad), "--dry-run", "--results", str(tmp_path / "r")])
    assert out.exit_code == 2, out.output
    assert re.fullmatch(r"error: \S+bad.toml: configs\[\d+\]\.fixed_split_size: must be an integer >= 1 "
                        r"and <= \d+, not 'auto'\n", out.output), out.output  # fmt: skip
    assert not (tmp_path / "r").exists(), "nothing written"


# -- selection, compile key, cache ---------------------------------------------------------------------


def test_a_config_on_the_relaid_hnd_cache_is_a_reference_never_a_choice() -> None:
    task = FlashDecode()
    assert task.selectable(STATIC, {"backend": "flashinfer"})
    assert task.selectable(STATIC, {"backend": "flashinfer", "kv_layout": "NHD", "use_tensor_cores": True})
    assert not task.selectable(STATIC, {"backend": "flashinfer", "kv_layout": "HND"})
    assert not task.selectable(STATIC, {"backend": "fa2", "kv_page_size": 256})  # unchanged


def test_one_module_is_built_per_static_key_and_path_at_the_smallest_point() -> None:
    task = FlashDecode()
    small, large = {"batch": 1, "kv_len": 1024, "q_len": 1}, {"batch": 64, "kv_len": 32768, "q_len": 1}
    base = {"backend": "flashinfer", "use_tensor_cores": True}
    keys = {
        task.compile_key(STATIC, shape, {**base, **extra})
        for shape in (small, large)
        for extra in ({}, {"fixed_split_size": 16}, {"disable_split_kv": True}, {"kv_layout": "HND"})
    }
    assert len(keys) == 1 and None not in keys, "batch, length and plan options share one module"
    cuda_core = task.compile_key(STATIC, small, BACKEND_DEFAULTS["flashinfer"])
    assert cuda_core == task.compile_key(STATIC, small, {"backend": "flashinfer", "use_tensor_cores": False})
    assert cuda_core not in keys
    assert task.compile_key({**STATIC, "head_dim": 128}, small, base) not in keys
    assert task.build_shape(STATIC, large, base) == {"batch": 1, "kv_len": 16, "q_len": 1}


def test_flashinfers_jit_workspace_is_under_the_runs_compile_cache(tmp_path: Path) -> None:
    env = cache_env(tmp_path)
    assert env["FLASHINFER_WORKSPACE_BASE"] == str(tmp_path / "flashinfer")
    folders = [value for value in env.values() if value != "1"]
    assert len(folders) == len(set(folders)), "each library caches in a folder of its own"


def test_the_runner_records_flashinfer_on_a_cpu_as_invalid_not_as_an_error() -> None:
    from tunectl.core.keys import make_key
    from tunectl.core.plan import WorkItem, item_id
    from tunectl.core.spec import MeasureSpec
    from tunectl.measure.runner import ItemRunner

    keys = make_key(STATIC), make_key(SHAPE), make_key({"backend": "flashinfer"})
    item = WorkItem(item_id("flash_decode", *keys), "flash_decode", *keys, False)
    settings = MeasureSpec(warmup=1, min_samples=3, max_samples=3, noise_target=0.5, max_seconds=0.1)
    [rec] = ItemRunner("cpu").run("r", item, settings)
    assert rec.status == "invalid" and "CUDA" in rec.message


def test_serving_gets_the_plan_options_and_what_to_make_the_wrapper_with() -> None:
    from tunectl.runtime import adapters

    assert adapters.flash_decode({"backend": "flashinfer"}) == adapters.Call(
        "flashinfer", {}, True, {"use_tensor_cores": False, "kv_layout": "NHD"}
    )
    tuned = adapters.flash_decode({"backend": "flashinfer", "use_tensor_cores": True, "fixed_split_size": 16})
    assert tuned.kwargs == {"fixed_split_size": 16} and tuned.requires["use_tensor_cores"] is True
    arrays = _arrays(_inputs())
    _bind(wrapper_plan, {**fi.plan_kwargs(STATIC, {}, **arrays), **tuned.kwargs})  # plan() takes them
