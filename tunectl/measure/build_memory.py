"""Builds that a compiler rejected, remembered, so that no later run builds them again.

A kernel whose compiler rejects it (Triton's ``CompilationError``, or Inductor's error around one:
the shipped decode spec's three FlexAttention configs at batch 64 x 32768, on every run) fails the
same way each time it is built with the same libraries for the same device, and each try costs
seconds of a compiler's time (13-16 s of a measuring worker's span in all, where it builds its own
kernels: benchmarks/results/throughput.md, nineteenth session). Such a failure is written under the
run's compile cache (``<root>/tunectl/failed/``), named by the task's compile key and what compiled
it (Python, the packages' versions, the device and its CUDA and driver, the build switches passed on
to every process): a later build of that kernel, in any process using that cache, fails at once
with the remembered message. Failures of memory, of time or of a process are never remembered, nor
anything where no compile cache is set (a serving process). Remove the folder to build them again.

A process also keeps in mind the kernels it built without an error, and those the kernel's own checks
refused at their point (``InvalidConfig``: flash-attn-4's split-KV on SM90, the same every time with the
same libraries and device). Those and the rejections remembered for it (a file names its kernel on its
first line) are what the cache settles for it (``settled_here``): a resident worker asked by the next
run (``TuneWorker.settled``) names the kernels that need no compile process, so the run neither waits
for one to build them nor, where they are all its first items need, starts one
(``tunectl.orchestrator.compiling``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tunectl.core.files import atomic_write, canonical_json
from tunectl.measure.failures import failure_message
from tunectl.tasks.base import InvalidConfig, TuningTask
from tunectl.tasks.compile import PASSED_ON, cache_dir, compile_key
from tunectl.tasks.env import environment

#: the compilers' own errors, by type name (an exception's, or one in its chain)
COMPILER_ERRORS = frozenset({"CompilationError", "InductorError", "BackendCompilerFailed"})
FOLDER = "failed"
#: what a kernel's build depends on besides its compile key (``tunectl.tasks.env.environment``)
_BUILT_WITH = ("python", "packages", "device_name", "compute_capability", "cuda", "driver")
#: the compile keys this process built (or loaded) without an error, or found invalid (``settled_here``)
_SETTLED: set[str] = set()
#: how a remembered rejection's first line names its kernel
_KEY_LINE = "kernel: "


class RememberedFailure(RuntimeError):
    """A kernel the compiler rejected before, with these libraries on this device: not built again."""


def compiler_rejected(exc: BaseException) -> bool:
    """Whether ``exc`` is a compiler's own error (``COMPILER_ERRORS``), not one of memory."""
    chain = list(_chain(exc))
    if any(type(e).__name__ == "OutOfMemoryError" or "out of memory" in str(e).lower() for e in chain):
        return False
    return any(type(e).__name__ in COMPILER_ERRORS for e in chain)


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def failure_path(
    task: TuningTask,
    static: Mapping[str, Any],
    shape: Mapping[str, Any],
    config: Mapping[str, Any],
    device: str,
) -> Path | None:
    """Where a rejected build of this item's kernel is remembered; None where nothing is (no compile
    cache set, or no kernel to build)."""
    return _path_of(_key_of(task, static, shape, config), device)


def settled_here(device: str) -> list[str]:
    """The compile keys whose build the compile cache settles for this process (module doc): built
    (or loaded) here without an error or found invalid, or rejected and remembered for this process's
    libraries and ``device`` (a remembered file counts where its name is the one its key gives here)."""
    found = set(_SETTLED)
    root = cache_dir()
    for path in (root / FOLDER).glob("*.txt") if root is not None else ():
        with contextlib.suppress(OSError):
            first = path.read_text(errors="replace").split("\n", 1)[0]
            key = first.removeprefix(_KEY_LINE)
            if key != first and _path_of(key, device) == path:
                found.add(key)
    return sorted(found)


def _key_of(
    task: TuningTask, static: Mapping[str, Any], shape: Mapping[str, Any], config: Mapping[str, Any]
) -> str | None:
    return None if cache_dir() is None else compile_key(task, static, shape, config)


def _path_of(key: str | None, device: str) -> Path | None:
    root = cache_dir()
    if root is None or key is None:
        return None
    env = environment(device)
    switches = {name: os.environ.get(name) for name in PASSED_ON}
    built_with = canonical_json({"key": key, "switches": switches, **{k: env.get(k) for k in _BUILT_WITH}})
    return root / FOLDER / f"{hashlib.sha256(built_with.encode()).hexdigest()[:32]}.txt"


@contextlib.contextmanager
def remembered(
    task: TuningTask,
    static: Mapping[str, Any],
    shape: Mapping[str, Any],
    config: Mapping[str, Any],
    device: str,
    remember: bool = True,
) -> Iterator[None]:
    """Around building (and first running) an item's kernel: ``RememberedFailure`` at once where a
    build of it was rejected before; a rejection inside remembered (where ``remember``), then raised."""
    key = _key_of(task, static, shape, config)
    path = _path_of(key, device)
    if path is not None and path.is_file():
        said = path.read_text(errors="replace").removeprefix(f"{_KEY_LINE}{key}\n")
        raise RememberedFailure(
            f"rejected by its compiler in an earlier build (remove {path} to build it again): {said}"
        )
    try:
        yield
    except InvalidConfig:
        if key is not None:
            _SETTLED.add(key)  # refused by the kernel's own checks: nothing here to build again
        raise
    except Exception as exc:
        if remember and path is not None and compiler_rejected(exc):
            with contextlib.suppress(OSError):  # unremembered, it is only built again next time
                atomic_write(path, f"{_KEY_LINE}{key}\n{failure_message(exc)}".encode(), make_parents=True)
        raise
    if key is not None:
        _SETTLED.add(key)
