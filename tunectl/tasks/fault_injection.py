"""A task whose configs misbehave on purpose: the fault tests and the orchestration benchmarks use it.

The kernel is an identity on a float32 vector of length ``n`` (the one shape dimension), so its cost
is what the config says it is. Config parameters (all optional; the default config is ``fault="none"``):

- ``fault``: what goes wrong
    ``none``      the call returns the right output
    ``raise``     raises ``RuntimeError`` (recorded as ``error``)
    ``invalid``   raises ``InvalidConfig`` (recorded as ``invalid``)
    ``wrong``     returns a wrong output (``wrong_result``)
    ``nan``       returns NaNs (``wrong_result``)
    ``hang``      never returns (``timeout``, once the per-item deadline passes)
    ``exit``      ends the worker process with ``os._exit`` (``crash``), as a poisoned CUDA context does
    ``exit_once`` ends the worker process the first time this config runs at this shape, then
                  behaves (needs ``token``; a marker file in the temp dir remembers the first time)
    ``warn``      returns the right output, having raised a ``UserWarning`` while it was prepared
                  (as a kernel library does on a first call)
    ``print``     returns the right output, having written lines to the process's standard error
                  below Python while it was prepared (as a compiler's own log or a C++ library does)
- ``where``: ``call`` (default) or ``prepare``: whether the fault fires when the kernel runs or
  while it is prepared (compiled); ``wrong`` and ``nan`` always show in the output of the call
- ``compile_ms``: milliseconds ``prepare`` sleeps (a compiler stand-in; sleeping releases the GIL,
  as compilers running in subprocesses do). In a run with a compile cache (``TUNECTL_COMPILE_CACHE``)
  it behaves as a JIT with an on-disk cache: the first compile of a kernel writes an artifact there,
  and a later ``prepare`` of the same kernel (the same compile key: ``compile_ms``, ``variant``,
  ``compile_fault``, whatever the shape) only loads it, in ``LOAD_MS``
- ``compile_fault``: ``raise``, ``reject``, ``exit`` or ``hang``: the compiler fails, rejects the
  kernel (a ``CompilationError``, which a run remembers: ``tunectl.measure.build_memory``), dies or
  hangs whenever it really compiles (not when it loads a cached artifact)
- ``run_ms``: milliseconds each call sleeps (a kernel of fixed cost)
- ``variant``: any integer, to make many distinct configs of equal cost
- ``token``: a string naming one test's markers for ``exit_once``
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from tunectl.core.files import atomic_write
from tunectl.core.params import Rule
from tunectl.tasks.base import InvalidConfig, Params, Task
from tunectl.tasks.compile import cache_dir, key_of

FAULTS = ("none", "raise", "invalid", "wrong", "nan", "hang", "exit", "exit_once", "warn", "print")
COMPILE_FAULTS = ("raise", "reject", "exit", "hang")
LOAD_MS = 1.0  # loading a cached artifact
WARNING = "injected: a kernel library's warning on a first call"  # what fault "warn" says
PRINTED = "injected: a compiler's own log line"  # what fault "print" writes, three times
EXIT_CODE = 71
_OUTPUT_FAULTS = ("wrong", "nan")  # faults of the output: they show when the kernel runs


class FaultInjection(Task):
    name = "fault_injection"
    static_params: tuple[str, ...] = ()
    shape_params = ("n",)
    config_params = ("compile_fault", "compile_ms", "fault", "run_ms", "token", "variant", "where")
    param_rules: ClassVar[Mapping[str, Rule]] = {
        "compile_fault": Rule.one_of(*COMPILE_FAULTS),
        "compile_ms": Rule.number(0),
        "fault": Rule.one_of(*FAULTS),
        "run_ms": Rule.number(0),
        "token": Rule("str"),
        "variant": Rule.integer(),
        "where": Rule.one_of("call", "prepare"),
    }

    def default_config(self, static: Params) -> dict[str, Any]:
        return {"fault": "none"}

    def check_point(self, static: Params, shape: Params) -> str | None:
        return None

    def compile_key(self, static: Params, shape: Params, config: Params) -> str | None:
        if not config.get("compile_ms"):
            return None
        return key_of({k: config.get(k) for k in _COMPILE_PARAMS})

    def build_ahead(self, static: Params, shape: Params, config: Params, device: str, inputs: Any) -> bool:
        """The stand-in compiler alone, as a compile process runs it (the kernel is not run)."""
        _compile(config)
        return True

    def build_inputs(self, static: Params, shape: Params, device: str) -> dict[str, Any]:
        import torch

        return {"x": torch.arange(shape["n"], dtype=torch.float32, device=device)}

    def reference(self, static: Params, shape: Params, inputs: dict[str, Any]) -> Any:
        return inputs["x"].clone()

    def prepare(
        self, static: Params, shape: Params, config: Params, inputs: dict[str, Any]
    ) -> Callable[[], Any]:
        fault = config.get("fault", "none")
        where = config.get("where", "call")
        if fault not in FAULTS:
            raise InvalidConfig(f"unknown fault {fault!r}; expected one of {', '.join(FAULTS)}")
        if where not in ("call", "prepare"):
            raise InvalidConfig(f"where must be 'call' or 'prepare', not {where!r}")
        _compile(config)
        if fault == "warn":
            warnings.warn(WARNING, UserWarning, stacklevel=1)
            fault = "none"
        if fault == "print":
            os.write(2, f"{PRINTED}\n".encode() * 3)
            fault = "none"
        if where == "prepare" and fault not in _OUTPUT_FAULTS:
            _misbehave(fault, config, shape)
            fault = "none"
        run_s = _ms(config.get("run_ms", 0)) / 1e3
        x = inputs["x"]
        if fault != "none":
            return lambda: _faulty_call(fault, config, shape, x, run_s)
        if run_s > 0:
            return lambda: _timed_identity(x, run_s)
        return lambda: x

    def tolerance(self, static: Params) -> tuple[float, float]:
        return (0.0, 0.0)

    def bytes_moved(self, static: Params, shape: Params) -> int:
        return 0


_COMPILE_PARAMS = ("compile_ms", "variant", "compile_fault")


def _compile(config: Params) -> None:
    """Sleep ``compile_ms`` (and fail as ``compile_fault`` says), unless the compile cache has the
    kernel already; then only load it."""
    fault = config.get("compile_fault")
    if fault is not None and fault not in COMPILE_FAULTS:
        raise InvalidConfig(f"unknown compile_fault {fault!r}; expected one of {', '.join(COMPILE_FAULTS)}")
    root = cache_dir()
    artifact = None
    if root is not None and config.get("compile_ms"):
        digest = hashlib.sha256(key_of({k: config.get(k) for k in _COMPILE_PARAMS}).encode()).hexdigest()
        artifact = root / "fault_injection" / f"{digest[:24]}.bin"
        if artifact.exists():
            _sleep_ms(LOAD_MS)
            return
    _sleep_ms(config.get("compile_ms", 0))
    if fault is not None:
        _misbehave(fault, config, {})
    if artifact is not None:
        atomic_write(artifact, b"built", make_parents=True)
        with open(artifact.parent / "compiles.log", "a") as log:  # what was really compiled, and how often
            log.write(f"{artifact.stem}\n")


def _ms(ms: object) -> float:
    if isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms < 0:
        raise InvalidConfig(f"times must be non-negative numbers of milliseconds, not {ms!r}")
    return float(ms)


def _sleep_ms(ms: object) -> None:
    seconds = _ms(ms) / 1e3
    if seconds:
        time.sleep(seconds)


def _timed_identity(x: Any, run_s: float) -> Any:
    time.sleep(run_s)
    return x


def _faulty_call(fault: str, config: Params, shape: Params, x: Any, run_s: float) -> Any:
    if run_s:
        time.sleep(run_s)
    out = _misbehave(fault, config, shape)
    if fault == "wrong":
        return x + 1
    if fault == "nan":
        return x * float("nan")
    return x if out is None else out


class CompilationError(Exception):
    """The stand-in compiler rejecting a kernel, named as Triton's own error is."""


def _misbehave(fault: str, config: Params, shape: Params) -> Any:
    """Raise, hang or exit as ``fault`` says; return None for faults that only change the output."""
    if fault == "raise":
        raise RuntimeError("injected failure: this config raises")
    if fault == "reject":
        raise CompilationError("injected: the compiler rejects this kernel")
    if fault == "invalid":
        raise InvalidConfig("injected: this config is not supported here")
    if fault == "hang":
        while True:
            time.sleep(3600)
    if fault == "exit" or (fault == "exit_once" and _first_time(config, shape)):
        os._exit(EXIT_CODE)
    return None


def _first_time(config: Params, shape: Params) -> bool:
    """True the first time (across processes) this config runs at this shape under ``token``."""
    token = config.get("token")
    if not isinstance(token, str) or not token:
        raise InvalidConfig("fault 'exit_once' needs a non-empty string 'token'")
    digest = hashlib.sha256(repr((sorted(config.items()), sorted(shape.items()))).encode()).hexdigest()[:16]
    marker = Path(tempfile.gettempdir()) / f"tunectl-fault-{token}-{digest}"
    try:
        marker.touch(exist_ok=False)
    except FileExistsError:
        return False
    return True
