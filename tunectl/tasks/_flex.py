"""FlexAttention plumbing shared by the decode and prefill tasks: kernel options, compiled kernels.

FlexAttention is compiled per static shape (``dynamic=False``): a dynamic-shape compile was seen to
run 4.7x slower than the best kernel on an H200 and to collapse at large shapes. Dynamo keeps one
compiled entry per (shape, kernel options); the entries of one point are kept while a worker stays
on that point and dropped when it moves on, so guard checks stay short and the recompile limit is
never what decides which kernel runs.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from tunectl.core.params import Rule
from tunectl.tasks.base import InvalidConfig

#: config names passed through to ``flex_attention(kernel_options=...)``, with their types.
KERNEL_OPTIONS: dict[str, type] = {
    "BLOCK_M": int,
    "BLOCK_N": int,
    "num_warps": int,
    "num_stages": int,
    "SPLIT_KV": int,
    "USE_TMA": bool,
    "BACKEND": str,
}
_POW2_OPTIONS = ("BLOCK_M", "BLOCK_N", "num_warps")
#: what a spec may give each option (whether a value suits a point is decided when it is prepared)
KERNEL_OPTION_RULES: dict[str, Rule] = {
    name: Rule.one_of(True, False) if kind is bool else Rule("str") if kind is str else Rule.integer(1)
    for name, kind in KERNEL_OPTIONS.items()
}
_RECOMPILE_LIMIT = 256

_state: dict[str, Any] = {"compiled": None, "point": None}


def available_backends() -> tuple[str, ...]:
    """The values the installed torch accepts for ``kernel_options["BACKEND"]`` (empty if none)."""
    from torch.nn.attention import flex_attention as fa

    alias = getattr(fa, "_Backend", None)
    return tuple(typing.get_args(alias)) if alias is not None else ()


def kernel_options(config: Mapping[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    """The kernel_options a config asks for; InvalidConfig for a name or value flex cannot take."""
    options: dict[str, Any] = {}
    for name, value in config.items():
        if name not in KERNEL_OPTIONS:
            continue
        if name not in allowed:
            raise InvalidConfig(f"kernel option {name} does not apply here")
        kind = KERNEL_OPTIONS[name]
        if type(value) is not kind:
            raise InvalidConfig(f"kernel option {name} must be {kind.__name__}, not {value!r}")
        if isinstance(value, int) and kind is int and value < 1:
            raise InvalidConfig(f"kernel option {name}={value} must be positive")
        if isinstance(value, int) and name in _POW2_OPTIONS and value & (value - 1):
            raise InvalidConfig(f"kernel option {name}={value} must be a power of two")
        options[name] = value
    backend = options.get("BACKEND")
    if backend is not None and backend not in available_backends():
        offered = ", ".join(available_backends()) or "none"
        raise InvalidConfig(f"BACKEND={backend!r} is not offered by the installed torch (offers: {offered})")
    return options


def check_block_sizes(options: Mapping[str, Any], sparse_q: int, sparse_kv: int) -> None:
    """Flex tiles a block mask's blocks: BLOCK_M must divide its Q block and BLOCK_N its KV block."""
    for name, sparse in (("BLOCK_M", sparse_q), ("BLOCK_N", sparse_kv)):
        if name in options and sparse % options[name]:
            raise InvalidConfig(
                f"{name}={options[name]} does not divide the block mask's {sparse}-token blocks"
            )


def flex_for(device: str, point: object, compiled: bool = True) -> Any:
    """``flex_attention``, compiled for ``device`` (or eager where ``compiled`` is False).

    ``point`` names the (task, static, shape) being measured: moving to a new one drops the compiled
    entries of the last one (see module doc).
    """
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if _state["point"] != point:
        torch._dynamo.reset()
        _state["point"] = point
    if _state["compiled"] is None:
        _raise_recompile_limits()
        _state["compiled"] = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    return _state["compiled"]


def _raise_recompile_limits() -> None:
    """One point compiles one entry per kernel-option set; never fall back to eager for want of room."""
    import torch._dynamo.config as dynamo_config

    for name in (
        "recompile_limit",
        "cache_size_limit",
        "accumulated_recompile_limit",
        "accumulated_cache_size_limit",
    ):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), _RECOMPILE_LIMIT))
