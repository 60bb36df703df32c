"""The seam between tunectl and a kernel: the ``TuningTask`` protocol.

A task knows how to build inputs for one (static, shape) point, how to compute the reference
output, and how to turn a config into a callable that runs the kernel. It knows nothing of Ray,
scheduling or the results store. Task modules import torch and kernel libraries inside methods,
so that reading a task's declarations (spec validation, planning) stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from tunectl.core.params import Rule

Params = Mapping[str, Any]


class InvalidConfig(Exception):
    """The kernel rejects this config for this point (recorded as ``invalid``, never a winner)."""


@runtime_checkable
class TuningTask(Protocol):
    name: str

    # the parameter names are read-only: a task's own tuples (``("batch", "kv_len")``) are narrower
    # types, which a protocol's settable attribute would refuse
    @property
    def static_params(self) -> tuple[str, ...]:
        """Names of the parameters that select a kernel variant or a table (dtype, heads, ...)."""

    @property
    def shape_params(self) -> tuple[str, ...]:
        """Names of the dynamic dimensions (batch, kv_len, ...)."""

    @property
    def config_params(self) -> tuple[str, ...]:
        """Names a config may set; a config may set a subset (e.g. only its backend's options)."""

    #: how serving runs the kernel, what ``measure.mode = "auto"`` times: ``eager`` or ``graph``
    serving_mode: str
    #: what each static and config parameter may take (type, range or choices); a spec is checked
    #: against it before anything is planned. A parameter without a rule takes any value a key can hold.
    param_rules: ClassVar[Mapping[str, Rule]]

    def default_config(self, static: Params) -> dict[str, Any]:
        """The config equal to what the library does untuned."""

    def complete_config(self, config: Params) -> dict[str, Any]:
        """``config`` with the options it leaves implicit filled in, so {"num_splits": 1} and
        {"num_splits": 1, "gather": "index"} plan as one config."""

    def selectable(self, static: Params, config: Params) -> bool:
        """False for a config measured for reference only, one a server with this static key cannot
        use as it is (e.g. it needs the KV cache re-paged): kept in the results, never a winner."""

    def check_point(self, static: Params, shape: Params) -> str | None:
        """None if the point can be built (capacity, divisibility); else why not."""

    def build_inputs(self, static: Params, shape: Params, device: str) -> Any:
        """Inputs for one point, built once and reused by every config measured there."""

    def reference(self, static: Params, shape: Params, inputs: Any) -> Any:
        """The output every config must reproduce (a tensor)."""

    def prepare(self, static: Params, shape: Params, config: Params, inputs: Any) -> Callable[[], Any]:
        """Compile/select the kernel for ``config``; return a call that runs it and returns its output.

        Raise ``InvalidConfig`` for a config the kernel does not support at this point.
        """

    def compile_key(self, static: Params, shape: Params, config: Params) -> str | None:
        """What decides the kernel this config builds (``tunectl.tasks.compile``); None: nothing to build."""

    def build_shape(self, static: Params, shape: Params, config: Params) -> dict[str, Any]:
        """The point this config's kernel is built at."""

    def warm_up(self, device: str, configs: Sequence[Mapping[str, Any]] = ()) -> Mapping[str, float]:
        """Per-process start-up of the libraries ``configs`` use (the run's configs; none given: all of
        the task's): the seconds each library's import took."""

    def tolerance(self, static: Params) -> tuple[float, float]:
        """(atol, rtol) for comparing an output with the reference."""

    def bytes_moved(self, static: Params, shape: Params) -> int:
        """Bytes a kernel must read and write at this point (for achieved bandwidth); 0 if unknown."""


class Task:
    """A base for tasks: the optional members of ``TuningTask`` with their defaults.

    Subclasses set the names and implement the required methods; they override an optional member
    only where the default is wrong for them.
    """

    name: str
    static_params: tuple[str, ...] = ()
    shape_params: tuple[str, ...] = ()
    config_params: tuple[str, ...] = ()
    serving_mode: str = "eager"
    #: config parameters that are split counts (positive; export may fit a rule that computes one from
    #: the shape: tunectl.decide.rules), and the shape dimensions of that rule: the one whose units
    #: run side by side (the batch), the one cut into splits (the KV length)
    split_params: tuple[str, ...] = ()
    wave_dims: tuple[str, ...] = ()
    #: none: every parameter takes any value a key can hold
    param_rules: ClassVar[Mapping[str, Rule]] = {}

    def complete_config(self, config: Params) -> dict[str, Any]:
        return dict(config)

    def selectable(self, static: Params, config: Params) -> bool:
        return True

    def bytes_moved(self, static: Params, shape: Params) -> int:
        return 0

    def compile_key(self, static: Params, shape: Params, config: Params) -> str | None:
        """None: nothing to build ahead (``tunectl.tasks.compile``)."""
        return None

    def build_shape(self, static: Params, shape: Params, config: Params) -> dict[str, Any]:
        """The point a compile process builds this config's kernel at (``tunectl.tasks.compile.build``)."""
        return dict(shape)

    def warm_up(self, device: str, configs: Sequence[Mapping[str, Any]] = ()) -> Mapping[str, float]:
        """No per-process start-up beyond importing the task."""
        return {}


DTYPE_TOLERANCE: dict[str, tuple[float, float]] = {
    "float64": (1e-9, 1e-9),
    "float32": (1e-4, 1e-4),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
}


def compare_outputs(out: Any, ref: Any, atol: float, rtol: float) -> tuple[float, bool]:
    """The largest absolute error of ``out`` against the reference ``ref``, and whether every element is
    within ``atol + rtol * |ref|`` (a non-tensor, a shape mismatch or a non-finite value never is)."""
    import torch

    if not isinstance(out, torch.Tensor) or out.shape != ref.shape:
        return float("inf"), False
    diff = (out.double() - ref.double().to(out.device)).abs()
    err = float(diff.max()) if diff.numel() else 0.0
    if not torch.isfinite(out).all():
        return float("inf"), False
    ok = bool((diff <= atol + rtol * ref.double().to(out.device).abs()).all())
    return err, ok
