"""FlexAttention plumbing shared by the decode and prefill tasks: kernel options, compiled kernels.

FlexAttention is compiled per static shape (``dynamic=False``): a dynamic-shape compile was seen to
run 4.7x slower than the best kernel on an H200 and to collapse at large shapes. Dynamo keeps one
compiled entry per (shape, kernel options); the entries of one point are kept while a worker stays
on that point and dropped when it moves on, so guard checks stay short and the recompile limit is
never what decides which kernel runs.

Ahead-of-time packages (``tunectl.tasks._flex_packages``): a compile process can build a point's
FlexAttention call into a package under the compile cache, which a worker loads instead of tracing and
compiling. ``build_packaged`` and ``packaged`` are the tasks' way in; on by default, ``TUNECTL_FLEX_AOT=0``
turns it off.
"""

from __future__ import annotations

import logging
import os
import typing
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tunectl.core.params import Rule
from tunectl.tasks import _flex_packages
from tunectl.tasks._flex_packages import (
    Unusable,
    aot_package,
    build_package,
    check_new_package,
    intact,
    load_package,
    mark_unusable,
    usable,
    why,
)
from tunectl.tasks.base import InvalidConfig
from tunectl.tasks.compile import raise_recompile_limits

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

_state: dict[str, Any] = {"point": None, "packages": {}}

#: the switch of ahead-of-time packages (see module doc)
AOT_ENV = "TUNECTL_FLEX_AOT"
_OFF = ("0", "false", "no", "off")
#: how prepares got their kernel in this process: ``loaded`` (a package), ``absent`` (none built),
#: ``failed`` (one that did not load or run), ``unusable`` (packages are off here: ``usable``); all
#: but the first went the torch.compile way
aot_loads: Counter[str] = Counter()
log = logging.getLogger("tunectl.flex")


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


def compiled_module(module: Any, point: object) -> Any:
    """``module`` (what a package is built from: ``packageable``) compiled with torch.compile for
    ``point``, where no package is loaded: the graph Inductor compiles is the package's, so a process
    without packages (a confirming or serving one) runs the kernels a run's workers timed. Compiling
    only ``flex_attention``, with the pool's views and the block mask outside the graph, left the same
    attention kernel but another one beside it: on an H200 at batch 1-2, one of 8-32 times the
    programs (4.4-6.4 µs against 1.6-1.9), the call 4-25 % slower than the package's
    (``benchmarks/gpu/flex_paths.py``). Compiled as packages are, no setting timed on the device
    (``pinned_options``)."""
    import torch

    _enter(point)
    raise_recompile_limits()
    return torch.compile(module, dynamic=False, fullgraph=True, options=_flex_packages.pinned_options())


def _enter(point: object) -> None:
    """Move to ``point``: drop the compiled entries and loaded packages of the last one."""
    if _state["point"] != point:
        import torch

        torch._dynamo.reset()
        _state["packages"] = {}
        _state["point"] = point


def aot_wanted(option: bool | None = None) -> bool:
    """Whether to build and load ahead-of-time packages: ``option`` (the task's) when given, else
    ``$TUNECTL_FLEX_AOT``; on unless that says 0 (or false, no, off)."""
    if option is not None:
        return option
    return os.environ.get(AOT_ENV, "").strip().lower() not in _OFF


def packageable(
    mask_mod_for: Callable[[Any], Any],
    block_size: int | tuple[int, int],
    *,
    enable_gqa: bool,
    options: Mapping[str, Any],
    score_mod: Any = None,
) -> Any:
    """A module whose ``forward(q, k, v, mask_data, blocks)`` is ``flex_attention`` under the block
    mask with ``blocks`` (its kv_num_blocks, kv_indices[, full_kv_num_blocks, full_kv_indices]) of
    ``block_size`` and the mask function ``mask_mod_for(mask_data)``, with ``score_mod`` and kernel
    ``options``: what a package is built from."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    kernel_options: Any = dict(options) or None

    class FlexCall(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any, mask_data: Any, blocks: tuple[Any, ...]) -> Any:
            full = blocks[2:] or (None, None)
            block_mask = BlockMask.from_kv_blocks(
                blocks[0],
                blocks[1],
                full[0],
                full[1],
                BLOCK_SIZE=block_size,
                mask_mod=mask_mod_for(mask_data),
                seq_lengths=(q.shape[2], k.shape[2]),
                compute_q_blocks=False,  # what the backward pass needs, not the forward
            )
            return flex_attention(
                q,
                k,
                v,
                block_mask=block_mask,
                score_mod=score_mod,
                enable_gqa=enable_gqa,
                kernel_options=kernel_options,
            )

    return FlexCall()


def block_tensors(block_mask: Any) -> tuple[Any, ...]:
    """The tensors of ``block_mask`` a package's call takes (``packageable``)."""
    full = (block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    kv = (block_mask.kv_num_blocks, block_mask.kv_indices)
    return kv if full[0] is None else kv + full


def build_packaged(
    task: str,
    static: Mapping[str, Any],
    shape: Mapping[str, Any],
    config: Mapping[str, Any],
    key: str | None,
    device: str,
    made: Callable[[], tuple[Any, tuple[Any, ...]]],
    wanted: bool = True,
) -> bool:
    """Build the package of ``task``'s kernel at (static, shape, config), compile key ``key``, where
    packages are ``wanted``, usable on ``device``'s target and a compile cache is set, unless a whole
    one is there already (none without a key); True where a whole package is there after. ``made()``:
    the module to capture and its call's arguments (built only when a package is to be made). A package that
    cannot be made or fails its check is logged and left out (the caller builds for torch.compile);
    a check that crashed or hung turns packages off for the target (``mark_unusable``)."""
    if not wanted or key is None or not usable(task, device):
        return False
    path = aot_package(task, key, device)
    if path is None:
        return False
    if path.is_file() and intact(path):
        return True
    path.unlink(missing_ok=True)  # damaged: built again
    try:
        module, args = made()
        request = {
            "task": task,
            "static": dict(static),
            "shape": dict(shape),
            "config": dict(config),
            "key": key,
            "device": device,
        }

        def check(tmp: Path, output: Any) -> None:
            check_new_package(request, tmp, args, output)

        build_package(module, args, path, key, check)
    except Unusable as exc:
        mark_unusable(task, device, str(exc))
    except Exception as exc:
        log.warning("no package for %s (%s); building for torch.compile", key, why(exc))
    return path.is_file()


def packaged(
    task: str, key: str, device: str, point: object, args: tuple[Any, ...]
) -> Callable[[], Any] | None:
    """The call of ``task``'s kernel ``key`` from its package, run once here; None where there is no
    package or it does not load or run (the caller compiles instead). Packages stay loaded while the
    worker stays on ``point``."""
    path = aot_package(task, key, device)
    if path is None or not path.is_file():
        aot_loads["absent"] += 1
        return None
    if not usable(task, device):
        aot_loads["unusable"] += 1
        return None
    _enter(point)
    try:
        bind = _state["packages"].get(path) or load_package(path, key, device)
        call = bind(*args)
        call()
    except Exception as exc:
        aot_loads["failed"] += 1
        log.warning("package %s did not load (%s); compiling instead", path, why(exc))
        return None
    _state["packages"][path] = bind
    aot_loads["loaded"] += 1
    return call
