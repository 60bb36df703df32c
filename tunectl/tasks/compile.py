"""Building kernels ahead, in processes of their own: what a task's build is, and where it lands.

A task says which part of an item decides the kernel it compiles (its *compile key*): flash-attn-4's
JIT depends on the static parameters and the config but not on batch or length; a FlexAttention
kernel compiled per static shape depends on the shape too; libraries shipped precompiled (flash-attn
2 and 3, SDPA) build nothing (no key). Items with one key share one built kernel.

A *build* compiles an item's kernel into the kernel libraries' on-disk caches, so that a measuring
worker on the same node (or, with a shared cache location, anywhere) only loads it. Every library
is pointed at one cache root per run (``cache_env``): Inductor's FX-graph and autograd caches and
the Triton cache under it, flash-attn-4's persistent CuTe DSL cache, FlashInfer's JIT workspace
(``FLASHINFER_WORKSPACE_BASE``: its built modules land in ``<root>/flashinfer/.cache/flashinfer``),
and a folder for tasks of our own (``TUNECTL_COMPILE_CACHE``).

What a task declares for this (``tunectl.tasks.base.Task`` gives the defaults: nothing to build ahead):

- ``compile_key(static, shape, config) -> str | None``
- ``build_shape(static, shape, config) -> shape``: the point its kernel is built at (default: the
  item's own; a kernel that does not depend on the shape builds at the smallest point of its key)
- ``warm_up(device) -> None``: the per-process start-up of its libraries (imports), done once when a
  worker starts rather than inside the first item that needs it
- optionally ``build_ahead(static, shape, config, device, inputs) -> bool``, found with ``getattr``:
  its own way to build the kernel at the build shape (a package, a stand-in compiler), True where it
  did; otherwise ``build`` below prepares the item and calls it once, which is what a task whose
  kernels compile on their first call wants
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tunectl.core.files import canonical_json
from tunectl.tasks.base import TuningTask

#: where a task of our own keeps what it builds (the fault-injection task's stand-in compiler, the
#: FlexAttention tasks' packages)
CACHE_ENV = "TUNECTL_COMPILE_CACHE"
#: switches of how tasks build and load kernels, passed from a run's driver to its workers and compile
#: processes where the driver has them set (``TUNECTL_FLEX_AOT``: see ``tunectl.tasks._flex``)
PASSED_ON = ("TUNECTL_FLEX_AOT",)


def cache_env(root: str | Path) -> dict[str, str]:
    """Environment variables that point every kernel library's on-disk cache under ``root``, and the
    build switches (``PASSED_ON``) this process has set."""
    root = Path(root)
    return {
        **{name: os.environ[name] for name in PASSED_ON if name in os.environ},
        CACHE_ENV: str(root / "tunectl"),
        "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        "TRITON_CACHE_DIR": str(root / "triton"),
        "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1",
        "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR": str(root / "flash_attn_cute"),
        # read once, when flashinfer is imported: a process must have it before that import
        "FLASHINFER_WORKSPACE_BASE": str(root / "flashinfer"),
    }


def compile_key(
    task: TuningTask, static: Mapping[str, Any], shape: Mapping[str, Any], config: Mapping[str, Any]
) -> str | None:
    """The task's compile key for one item, with the task's name in it; None: nothing to build."""
    key = task.compile_key(dict(static), dict(shape), dict(config))
    return None if key is None else f"{task.name}:{key}"


def key_of(*parts: Mapping[str, Any]) -> str:
    """A canonical text for the parts of an item a compile depends on (a helper for tasks)."""
    return canonical_json(parts, default=str)


InputsFor = Callable[[Mapping[str, Any], Mapping[str, Any]], Any]
#: Dynamo's limits on the compiled entries of one function, raised to at least this: a measuring worker
#: compiles one entry per kernel-option set of a point (it drops them when it moves on)
RECOMPILE_LIMIT = 256
#: and in a compile process, which keeps every entry of its life: one per shape and option set it built
BUILDER_RECOMPILE_LIMIT = 1 << 16


def raise_recompile_limits(limit: int = RECOMPILE_LIMIT) -> None:
    """Raise Dynamo's limits on compiled entries per function (``recompile_limit``, called
    ``cache_size_limit`` before torch 2.6, and their totals) to at least ``limit``, so that no
    compile falls back to eager (or fails, under ``fullgraph``) for want of room. Nothing without torch."""
    try:
        import torch._dynamo.config as dynamo_config
    except ImportError:
        return
    names = getattr(dynamo_config, "_config", {})
    for current, older in (
        ("recompile_limit", "cache_size_limit"),
        ("accumulated_recompile_limit", "accumulated_cache_size_limit"),
    ):  # the current name where this torch has it; setting its old alias as well broke it (torch 2.13)
        name = current if current in names else older
        if name in names:
            setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))


def build(
    task: TuningTask,
    static: Mapping[str, Any],
    shape: Mapping[str, Any],
    config: Mapping[str, Any],
    device: str,
    inputs_for: InputsFor | None = None,
) -> float:
    """Compile one item's kernel into the caches; the seconds it took. Raises what the compile raises.

    ``inputs_for(static, shape)``: the point's inputs, from a caller that keeps them across builds.
    A compile process builds many shapes of one kernel (one Dynamo entry each): Dynamo's limits are
    raised first (``BUILDER_RECOMPILE_LIMIT``).
    """
    raise_recompile_limits(BUILDER_RECOMPILE_LIMIT)
    started = time.perf_counter()
    shape = task.build_shape(dict(static), dict(shape), dict(config))
    inputs = (
        task.build_inputs(dict(static), shape, device) if inputs_for is None else inputs_for(static, shape)
    )
    ahead = getattr(task, "build_ahead", None)
    if ahead is None or not ahead(dict(static), shape, dict(config), device, inputs):
        task.prepare(dict(static), shape, dict(config), inputs)()
        synchronize(device)
    return time.perf_counter() - started


def warm_up_libraries(modules: tuple[str, ...]) -> dict[str, float]:
    """Import what is installed of ``modules`` (their import is the costly part of a first call); the
    seconds each import took, of those that succeeded (one already imported takes ~0)."""
    import importlib

    took: dict[str, float] = {}
    for name in modules:
        started = time.perf_counter()
        try:
            importlib.import_module(name)
        except Exception:  # not installed, or unusable here: the items that need it will say why
            continue
        took[name] = time.perf_counter() - started
    return took


def build_device(index: int) -> str:
    """The device a compile process builds on: a CUDA device of its node chosen by ``index``, or the CPU."""
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:  # no usable CUDA here: builds for the CPU
        return "cpu"
    return f"cuda:{index % count}" if count else "cpu"


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is a device allocation failure (torch's ``OutOfMemoryError``, told by name so
    that nothing here imports torch)."""
    return type(exc).__name__ == "OutOfMemoryError"


def release(device: str) -> None:
    """Give the device memory a build cached back (the measuring workers share the device)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def device_healthy(device: str) -> bool:
    """False once a kernel has left the CUDA context unusable (every later call would fail)."""
    try:
        synchronize(device)
    except Exception:
        return False
    return True


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def cache_dir() -> Path | None:
    """This process's folder for tasks of our own (None outside a run that set one)."""
    path = os.environ.get(CACHE_ENV)
    return Path(path) if path else None
