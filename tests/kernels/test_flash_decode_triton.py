"""The flash_decode task's triton backend: its options and their checks (pure), its compile key, its
serving adapter, and the kernel itself in Triton's CPU interpreter against the reference."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.decode_keys import flash_static
from tunectl.runtime import adapters
from tunectl.tasks import _adapters_triton as at
from tunectl.tasks.base import InvalidConfig
from tunectl.tasks.compile import compile_key
from tunectl.tasks.flash_decode import BACKEND_DEFAULTS, BACKEND_OPTIONS, FlashDecode

STATIC = flash_static()
ROOT = Path(__file__).resolve().parents[2]


def test_the_backend_declares_its_options_and_untuned_call() -> None:
    assert BACKEND_OPTIONS["triton"] == at.OPTIONS == adapters.TRITON_DECODE_OPTIONS
    assert BACKEND_DEFAULTS["triton"] == {"backend": "triton"}
    assert at.options({}) == at.TritonOptions(0, 64, 16, 4, 2)
    assert at.options({"num_kv_splits": 8, "BLOCK_N": 32, "BLOCK_H": 4, "num_warps": 8, "num_stages": 3}) == (
        at.TritonOptions(8, 32, 4, 8, 3)
    )
    assert at.options({"split_rule": "one_wave"}) == at.TritonOptions(0, 64, 16, 4, 2, "one_wave")
    for name in ("num_kv_splits", "BLOCK_H", "BLOCK_N", "num_warps", "num_stages", "split_rule"):
        assert name in FlashDecode.param_rules and name in FlashDecode.config_params


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"num_kv_splits": -1}, "num_kv_splits=-1 must be between 0"),
        ({"num_kv_splits": 257}, "num_kv_splits=257"),
        ({"num_kv_splits": 2.5}, "num_kv_splits must be an integer"),
        ({"BLOCK_N": True}, "BLOCK_N must be an integer"),
        ({"BLOCK_N": 8}, "BLOCK_N=8 must be a power of two from 16"),
        ({"BLOCK_N": 48}, "BLOCK_N=48 must be a power of two"),
        ({"BLOCK_N": 512}, "BLOCK_N=512"),
        ({"BLOCK_H": 3}, "BLOCK_H=3 must be a power of two"),
        ({"BLOCK_H": 0}, "BLOCK_H=0"),
        ({"num_warps": 6}, "num_warps=6 must be a power of two"),
        ({"num_stages": 0}, "num_stages=0 must be between 1 and 8"),
        ({"split_rule": "fast"}, "split_rule='fast' must be one of occupancy, one_wave"),
        ({"num_kv_splits": 8, "split_rule": "one_wave"}, "split_rule applies to num_kv_splits = 0"),
    ],
)
def test_options_the_kernel_cannot_take_are_invalid_with_one_line(config: dict, why: str) -> None:
    with pytest.raises(InvalidConfig, match=why) as caught:
        at.options(config)
    assert "\n" not in str(caught.value)


def test_a_row_block_larger_than_the_point_can_fill_is_invalid() -> None:
    # GQA 4, one query token: 4 rows per KV head; 16 (a tensor-core tile) is always allowed
    at.check_point(at.options({"BLOCK_H": 16}), STATIC, q_len=1)
    with pytest.raises(InvalidConfig, match="BLOCK_H=32 is more than this point can fill: a KV head has 4"):
        at.check_point(at.options({"BLOCK_H": 32}), STATIC, q_len=1)
    at.check_point(at.options({"BLOCK_H": 32}), STATIC, q_len=8)  # 32 rows with 8 speculative tokens
    with pytest.raises(InvalidConfig, match="head_dim up to 256"):
        at.check_point(at.options({}), {**STATIC, "head_dim": 512}, q_len=1)


def test_the_split_heuristic_fills_the_sms_without_short_splits() -> None:
    def splits(batch: int, kv_len: int, num_sms: int = 132) -> int:
        return at.heuristic_splits(batch=batch, num_kv_heads=8, head_blocks=1, kv_len=kv_len, num_sms=num_sms)

    assert splits(1, 32768) == at.HEURISTIC_MAX_SPLITS  # 8 programs per split: as many as allowed
    assert splits(4, 32768) == 17  # ceil(4 x 132 / 32)
    assert splits(64, 32768) == 2
    assert splits(256, 32768) == 1
    assert splits(1, 1024) == 4  # no split shorter than 256 tokens
    assert splits(1, 1) == 1
    for batch in (1, 2, 4, 16, 64, 256):
        for kv_len in (1, 300, 1024, 8192, 32768):
            n = splits(batch, kv_len)
            assert 1 <= n <= at.HEURISTIC_MAX_SPLITS
            assert n == 1 or kv_len / n > at.MIN_SPLIT_TOKENS - 256 / n
            assert splits(batch, kv_len, num_sms=264) >= n  # more SMs, never fewer splits


def test_one_wave_takes_fewer_splits_where_the_occupancy_count_overflows_a_wave() -> None:
    slots = at.PROGRAMS_PER_SM * 132

    def splits(batch: int, kv_len: int, rule: str) -> int:
        return at.heuristic_splits(
            batch=batch, num_kv_heads=8, head_blocks=1, kv_len=kv_len, num_sms=132, rule=rule, block_n=64
        )

    # batch 5: 40 programs a split; 14 splits of 576 tokens cover 7847 with 14 active: 560 programs
    assert splits(5, 7847, "occupancy") == 14 and at.active_splits(7847, 14, 64) == 14
    assert splits(5, 7847, "one_wave") == 13 and 40 * at.active_splits(7847, 13, 64) <= slots
    # at 8192 the 14 splits are of 640 tokens: 13 active, 520 programs, one wave already
    assert splits(5, 8192, "one_wave") == splits(5, 8192, "occupancy") == 14
    assert splits(4, 32768, "occupancy") == 17 and splits(4, 32768, "one_wave") == 16  # 544 -> 512
    assert splits(80, 32768, "one_wave") == splits(80, 32768, "occupancy") == 1  # 640 programs: 1 split
    for batch in (1, 2, 3, 5, 7, 11, 16, 33, 40, 66):
        for kv_len in (300, 1024, 3000, 7847, 12000, 32768):
            wave, occupancy = splits(batch, kv_len, "one_wave"), splits(batch, kv_len, "occupancy")
            assert 1 <= wave <= occupancy
            assert batch * 8 * at.active_splits(kv_len, wave, 64) <= slots  # every program in one wave
            if wave < occupancy:  # fewer only where the occupancy count overflowed
                assert batch * 8 * at.active_splits(kv_len, occupancy, 64) > slots


def test_a_fixed_split_count_builds_one_kernel_for_every_batch_and_length() -> None:
    task = FlashDecode()
    config = {"backend": "triton", "num_kv_splits": 8, "BLOCK_N": 64}
    shapes = [{"batch": b, "kv_len": n, "q_len": 1} for b in (1, 4, 64) for n in (1024, 32768)]
    keys = {compile_key(task, STATIC, shape, config) for shape in shapes}
    assert len(keys) == 1 and None not in keys
    assert compile_key(task, STATIC, {**shapes[0], "q_len": 2}, config) not in keys
    assert compile_key(task, {**STATIC, "page_size": 128}, shapes[0], config) not in keys
    assert compile_key(task, STATIC, shapes[0], {**config, "BLOCK_N": 32}) not in keys
    assert task.build_shape(STATIC, shapes[-1], config) == {"batch": 1, "kv_len": 16, "q_len": 1}


def test_the_split_heuristic_is_built_per_shape() -> None:
    task = FlashDecode()
    a, b = {"batch": 1, "kv_len": 1024, "q_len": 1}, {"batch": 64, "kv_len": 1024, "q_len": 1}
    for config in ({"backend": "triton"}, {"backend": "triton", "num_kv_splits": 0}):
        assert compile_key(task, STATIC, a, config) != compile_key(task, STATIC, b, config)
        assert task.build_shape(STATIC, b, config) == b


def test_serving_gets_the_options_as_the_config_names_them() -> None:
    config = {"backend": "triton", "num_kv_splits": 16, "BLOCK_N": 32, "BLOCK_H": 16, "num_warps": 4}
    call = adapters.flash_decode(config)
    assert call == adapters.Call("triton", {k: v for k, v in config.items() if k != "backend"}, True)
    assert adapters.flash_decode({"backend": "triton"}) == adapters.Call("triton", {}, True)
    rule = {"backend": "triton", "split_rule": "one_wave"}
    assert adapters.flash_decode(rule) == adapters.Call("triton", {"split_rule": "one_wave"}, True)


def test_on_a_cpu_without_the_interpreter_the_backend_is_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    task = FlashDecode()
    static, shape = {**STATIC, "dtype": "float32", "head_dim": 16}, {"batch": 2, "kv_len": 37, "q_len": 1}
    inputs = task.build_inputs(static, shape, "cpu")
    with pytest.raises(InvalidConfig, match="CUDA devices, or on the CPU under TRITON_INTERPRET=1"):
        task.prepare(static, shape, {"backend": "triton"}, inputs)
    with pytest.raises(InvalidConfig, match="BLOCK_N=24"):  # options are checked before the device
        task.prepare(static, shape, {"backend": "triton", "BLOCK_N": 24}, inputs)
    with pytest.raises(InvalidConfig, match=r"pack_gqa do\(es\) not apply to backend triton"):
        task.prepare(static, shape, {"backend": "triton", "pack_gqa": True}, inputs)


def test_the_kernel_matches_the_reference_in_the_triton_interpreter() -> None:
    pytest.importorskip("triton")
    from tests.triton_interpret_cases import CASES

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.triton_interpret_cases"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(CASES) + 1
    for case in results[:-1]:
        assert case["status"] == "ok", case
        assert case["close"] and case["out_shape"] == case["ref_shape"], case
        assert case["same_output_tensor"], "the output is allocated once and written by every call"
    # f32 rounding differs from the reference by ~1e-7; a wrong mask or merge is off by ~1e-1
    assert max(c["max_abs_err"] for c in results[:-1] if c["static"].get("dtype") is None) < 1e-5
    assert results[-1]["status"] == "invalid" and "bfloat16" in results[-1]["message"]


def _compile_for_sm90(kernel: object, types: dict[str, str], consts: dict, options: dict) -> object:
    """Compile a kernel to an sm_90 cubin without a GPU, its arguments specialised as a launch would
    (pointers and strides divisible by 16; the split count and table stride not specialised)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(kernel.arg_names)  # type: ignore[attr-defined]
    signature = {n: types.get(n, "i32") for n in names} | {n: "constexpr" for n in consts}
    aligned = [n for n in names if signature[n].startswith("*") or n.startswith("stride_o")]
    aligned += [n for n in names if n.startswith(("stride_q", "stride_k", "stride_v"))]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    source = ASTSource(kernel, signature, consts, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def _spilled_bytes(compiled: object, folder: Path) -> int:
    """Bytes of stack (registers spilled to local memory) the cubin's kernel uses, by cuobjdump."""
    import re

    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    cubin = folder / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])  # type: ignore[attr-defined]
    usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True, text=True).stdout
    return int(re.search(r"STACK:(\d+)", usage).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "variant",
    [
        {"BLOCK_N": 64, "SINGLE": False, "PAGE_SIZE": 16},
        {"BLOCK_N": 32, "SINGLE": True, "PAGE_SIZE": 128},
        {"BLOCK_N": 128, "SINGLE": False, "PAGE_SIZE": 1, "num_warps": 8},
        {"BLOCK_N": 64, "SINGLE": False, "PAGE_SIZE": 16, "num_stages": 3},
        {"BLOCK_N": 64, "SINGLE": True, "HAS_SINKS": True, "SOFTCAP": True, "WINDOW_LEFT": 1023, "Q_LEN": 2},
    ],
)
def test_the_kernels_compile_for_hopper_without_spilling(
    variant: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interpreter does not compile; this does, for the H200 grid's static key (bf16, GQA 4, head
    dim 128), through ptxas, and checks that the KV loads are pipelined and nothing spills."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("the kernels are interpreted in this process")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    from tunectl.tasks import _triton_decode as td

    variant = dict(variant)
    options = {"num_warps": variant.pop("num_warps", 4), "num_stages": variant.pop("num_stages", 2)}
    q_len = variant.get("Q_LEN", 1)
    consts = dict(Q_LEN=q_len, GROUP=4, NUM_Q_HEADS=32, HEAD_BLOCKS=-(-4 * q_len // 16), HEAD_DIM=128,
                  BLOCK_D=128, BLOCK_H=16, CAUSAL=True, WINDOW_LEFT=-1, WINDOW_RIGHT=-1, SOFTCAP=False,
                  HAS_SINKS=False, PRECISION="tf32") | variant  # fmt: skip
    types = dict(Q="*bf16", K="*bf16", V="*bf16", Out="*bf16", Table="*i32", SeqUsed="*i32",
                 MidO="*fp32", MidLse="*fp32", sm_scale="fp32", softcap="fp32")  # fmt: skip
    if consts["HAS_SINKS"]:
        types["Sinks"] = "*fp32"
    else:
        consts["Sinks"] = None
    split = _compile_for_sm90(td._split_stage, types, consts, options)
    merge = _compile_for_sm90(
        td._merge_stage,
        dict(MidO="*fp32", MidLse="*fp32", Sinks="*fp32", Out="*bf16"),
        dict(Q_LEN=q_len, NUM_Q_HEADS=32, HEAD_DIM=128, BLOCK_D=128, HAS_SINKS=True),
        {"num_warps": 4},
    )
    assert "async_copy" in split.asm["ttgir"], "the KV loads are not pipelined"  # type: ignore[attr-defined]
    assert _spilled_bytes(split, tmp_path) == 0
    assert _spilled_bytes(merge, tmp_path) == 0
