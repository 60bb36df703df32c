"""The ``triton`` backend of ``flash_decode``: its options, what each may take, and the call it makes.

The kernel is ``tunectl.tasks._triton_decode`` (split-KV paged decode written in Triton). Its options, and
what it does without them (``DEFAULTS``, the backend's untuned call):

- ``num_kv_splits``: how many chunks each sequence's visible KV range is cut into (>= 1; 1 runs one
  pass with no merge), or 0 for a heuristic (``heuristic_splits``): enough splits for about
  ``PROGRAMS_PER_SM`` programs per SM over the batch's (sequence, KV head, row block) programs, no
  split shorter than ``MIN_SPLIT_TOKENS`` tokens, at most ``HEURISTIC_MAX_SPLITS``. The heuristic is
  a starting point, not a measured optimum: it is one config among the ones a spec tunes.
- ``split_rule``: how the heuristic (``num_kv_splits = 0`` only) rounds: ``"occupancy"`` (the default)
  takes the count above as it is; ``"one_wave"`` takes fewer splits where that count's programs with
  tokens to read overflow one wave of ``PROGRAMS_PER_SM`` per SM and fewer fit it. The occupancy
  count rounds up, and its extra programs run as a second wave behind the first: on the H200's
  decode runs the default config at such points (their last split half full or more) was a median
  16-19 % slower than the fastest config there, against 0-2 % where its programs fit one wave. Where
  the runs timed ``one_wave``'s count as a fixed config (the same launch), it was faster than the
  occupancy count at 101 of 102 points, a median 0.91x (page 128) and 0.96x (page 16) its time
  (``benchmarks/studies/holdout_offline.py waves``).
- ``BLOCK_N``: tokens per inner step, gathered one by one through the page table (any page size);
  a power of two from 16 to 256.
- ``BLOCK_H``: query rows per program. A KV head has ``group x q_len`` rows (its query heads times the
  query tokens); 16 or more rows use tensor-core dots, fewer use CUDA-core sums. A power of two, at
  most what the point's rows round up to (and at least 16 allowed).
- ``num_warps``, ``num_stages``: Triton's launch options (stages pipeline the KV loads).

The checks here are pure and raise ``InvalidConfig`` with one line; the device work (workspace,
split count from the SM count, compile) happens on the first call (tunectl.tasks._lazy). On a CPU the
kernel runs only under Triton's interpreter (``TRITON_INTERPRET=1`` before triton is imported),
which computes bfloat16 dots wrongly, so bfloat16 is CUDA-only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tunectl.tasks._lazy import lazily
from tunectl.tasks.base import InvalidConfig, Params

OPTIONS = ("num_kv_splits", "BLOCK_N", "BLOCK_H", "num_warps", "num_stages", "split_rule")
DEFAULTS: dict[str, int] = {"num_kv_splits": 0, "BLOCK_N": 64, "BLOCK_H": 16, "num_warps": 4, "num_stages": 2}
SPLIT_RULES = ("occupancy", "one_wave")  # the first is the default
MAX_SPLITS = 256
MAX_HEAD_DIM = 256
HEURISTIC_MAX_SPLITS = 64
MIN_SPLIT_TOKENS = 256
PROGRAMS_PER_SM = 4
_TENSOR_CORE_ROWS = 16


@dataclass(frozen=True)
class TritonOptions:
    """A checked ``triton`` config: every option present, each within what the kernel takes."""

    num_kv_splits: int
    block_n: int
    block_h: int
    num_warps: int
    num_stages: int
    split_rule: str = SPLIT_RULES[0]


def options(config: Mapping[str, Any]) -> TritonOptions:
    """The config's options with the defaults filled in; InvalidConfig for a value the kernel cannot take."""
    values = {name: config.get(name, default) for name, default in DEFAULTS.items()}
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidConfig(f"{name} must be an integer, not {value!r}")
    splits, block_n, block_h = values["num_kv_splits"], values["BLOCK_N"], values["BLOCK_H"]
    warps, stages = values["num_warps"], values["num_stages"]
    if not 0 <= splits <= MAX_SPLITS:
        raise InvalidConfig(f"num_kv_splits={splits} must be between 0 (the heuristic) and {MAX_SPLITS}")
    if not (_pow2(block_n) and 16 <= block_n <= 256):
        raise InvalidConfig(f"BLOCK_N={block_n} must be a power of two from 16 to 256")
    if not (_pow2(block_h) and block_h <= 64):
        raise InvalidConfig(f"BLOCK_H={block_h} must be a power of two from 1 to 64")
    if not (_pow2(warps) and warps <= 32):
        raise InvalidConfig(f"num_warps={warps} must be a power of two from 1 to 32")
    if not 1 <= stages <= 8:
        raise InvalidConfig(f"num_stages={stages} must be between 1 and 8")
    rule = config.get("split_rule", SPLIT_RULES[0])
    if rule not in SPLIT_RULES:
        raise InvalidConfig(f"split_rule={rule!r} must be one of {', '.join(SPLIT_RULES)}")
    if splits and "split_rule" in config:
        raise InvalidConfig(f"split_rule applies to num_kv_splits = 0 (the heuristic), not to {splits}")
    return TritonOptions(splits, block_n, block_h, warps, stages, rule)


def check_point(opts: TritonOptions, static: Params, q_len: int) -> None:
    """InvalidConfig where the options do not suit this point (the rows a program can fill, head dim)."""
    if static["head_dim"] > MAX_HEAD_DIM:
        raise InvalidConfig(
            f"the triton backend takes head_dim up to {MAX_HEAD_DIM}, not {static['head_dim']}"
        )
    group = static["num_q_heads"] // static["num_kv_heads"]
    rows = group * q_len
    most = max(_TENSOR_CORE_ROWS, _next_pow2(rows))
    if opts.block_h > most:
        raise InvalidConfig(
            f"BLOCK_H={opts.block_h} is more than this point can fill: a KV head has {rows} query row(s) "
            f"(group {group} x q_len {q_len}); use at most {most}"
        )


def heuristic_splits(
    *,
    batch: int,
    num_kv_heads: int,
    head_blocks: int,
    kv_len: int,
    num_sms: int,
    rule: str = SPLIT_RULES[0],
    block_n: int = DEFAULTS["BLOCK_N"],
) -> int:
    """The split count ``num_kv_splits = 0`` runs with under ``rule`` (see module doc); at least 1.
    ``block_n``: the kernel cuts a sequence into splits of whole ``block_n`` steps, so a count can
    leave its last splits without tokens (``active_splits``)."""
    programs = batch * num_kv_heads * head_blocks
    slots = PROGRAMS_PER_SM * num_sms
    for_occupancy = _cdiv(slots, programs)
    longest = _cdiv(kv_len, MIN_SPLIT_TOKENS)
    splits = max(1, min(for_occupancy, longest, HEURISTIC_MAX_SPLITS))
    if rule == "one_wave" and programs <= slots:
        while splits > 1 and programs * active_splits(kv_len, splits, block_n) > slots:
            splits -= 1
    return splits


def split_tokens(kv_len: int, splits: int, block_n: int) -> int:
    """Tokens per split when ``kv_len`` tokens are cut into ``splits`` of whole blocks, as the kernel cuts."""
    return _cdiv(_cdiv(kv_len, splits), block_n) * block_n


def active_splits(kv_len: int, splits: int, block_n: int) -> int:
    """Splits with tokens to read when ``kv_len`` tokens are cut into ``splits`` of whole blocks."""
    return _cdiv(kv_len, split_tokens(kv_len, splits, block_n))


def head_blocks(static: Params, q_len: int, block_h: int) -> int:
    """Programs per (sequence, KV head) along the query rows."""
    rows = static["num_q_heads"] // static["num_kv_heads"] * q_len
    return -(-rows // block_h)


def prepare(static: Params, config: Params, inputs: dict[str, Any]) -> Callable[[], Any]:
    """Check the config here; return the call, which builds the kernel and its workspace when first run."""
    opts = options(config)
    check_point(opts, static, inputs["q_len"])
    q = inputs["q"]
    on_cpu = q.device.type != "cuda"
    if on_cpu and os.environ.get("TRITON_INTERPRET") != "1":
        raise InvalidConfig("the triton backend runs on CUDA devices, or on the CPU under TRITON_INTERPRET=1")
    if on_cpu and static["dtype"] == "bfloat16":
        raise InvalidConfig("Triton's interpreter computes bfloat16 dots wrongly: run bfloat16 on CUDA")
    from tunectl.tasks import _triton_decode

    if on_cpu and not _triton_decode.interpreted():
        raise InvalidConfig("TRITON_INTERPRET=1 must be set before triton is first imported")

    def build() -> Callable[[], Any]:
        splits = opts.num_kv_splits or _heuristic_at(static, opts, inputs)
        paged = (inputs["k_cache"], inputs["v_cache"], inputs["page_table"], inputs["seqused_k"])
        kernel = _call_options(static, opts, splits)
        return _triton_decode.decode_call(q, *paged, sinks=inputs["sinks"], **kernel)

    return lazily(build, _reject)


def _heuristic_at(static: Params, opts: TritonOptions, inputs: dict[str, Any]) -> int:
    """The split count ``num_kv_splits = 0`` runs with at the inputs' point (``heuristic_splits``)."""
    q = inputs["q"]
    return heuristic_splits(
        batch=q.shape[0],
        num_kv_heads=static["num_kv_heads"],
        head_blocks=head_blocks(static, inputs["q_len"], opts.block_h),
        kv_len=inputs["kv_len"],
        num_sms=_num_sms(q.device),
        rule=opts.split_rule,
        block_n=opts.block_n,
    )


def _call_options(static: Params, opts: TritonOptions, splits: int) -> dict[str, Any]:
    """``decode_call``'s options: the point's masking and soft-cap, and the config's kernel parameters."""
    return {
        "causal": bool(static["causal"]),
        "window": tuple(static["window"]),
        "softcap": float(static["softcap"]),
        "num_kv_splits": splits,
        "block_n": opts.block_n,
        "block_h": opts.block_h,
        "num_warps": opts.num_warps,
        "num_stages": opts.num_stages,
    }


def _reject(exc: Exception) -> str | None:
    """A config Triton cannot fit on this device (shared memory, registers) is invalid, not an error."""
    if type(exc).__name__ == "OutOfResources":
        return f"Triton cannot fit this config here: {exc}"
    return None


def _num_sms(device: Any) -> int:
    """SMs of a CUDA device; 1 on the CPU, where the interpreter runs one program at a time."""
    if device.type != "cuda":
        return 1
    import torch

    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> bool:
    return n >= 1 and not n & (n - 1)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
