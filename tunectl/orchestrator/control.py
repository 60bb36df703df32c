"""How a caller steers a run without importing Ray: how it builds kernels ahead, and how it stops (a
cancel requested; ``RunStopped``, naming the run to resume) or falls short (``OrchestrationError``,
``IncompleteRun``, each naming the run). Standard library only."""

from __future__ import annotations

import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from tunectl.core.errors import Fielded


@dataclass(frozen=True)
class CompileOptions:
    """How a run builds kernels ahead. ``workers_per_node``: compile processes per node (None: chosen
    from the node's spare cores, on GPU nodes only; 0: none, workers compile for themselves).
    ``cache``: the root of every kernel library's on-disk cache (default: a folder in each node's temp
    dir, kept between runs); ``shared``: every node sees ``cache`` (a kernel is then built once per
    cluster). ``timeout_s``: a build running longer is a ``compile_timeout``."""

    workers_per_node: int | None = None
    cache: str | None = None
    shared: bool = False
    timeout_s: float = 600.0

    def cache_root(self) -> str:
        return self.cache or str(Path(tempfile.gettempdir()) / "tunectl-compile-cache")


class RunCancelled(KeyboardInterrupt):
    """The run was asked to stop (SIGTERM: ``tunectl cancel``, or a Ray job being stopped)."""


#: set once this process is asked to stop (``cancel``): the run is recorded cancelled even where the
#: exception that stopped it lost its type on the way (Ray turns one raised inside ``ray.wait`` into
#: a plain KeyboardInterrupt)
cancel_requested = threading.Event()


def request_cancel() -> None:
    """Ask this process's run to stop as cancelled (a SIGTERM handler calls this): raises RunCancelled."""
    cancel_requested.set()
    raise RunCancelled()


class RunStopped(KeyboardInterrupt):
    """A run stopped by Ctrl-C or a cancel once it existed: says which run, to resume it by id."""

    def __init__(self, run_id: str, state: str) -> None:
        self.run_id, self.state = run_id, state
        super().__init__(f"run {run_id} {state}")


@dataclass(eq=False)
class OrchestrationError(Fielded):
    """Run ``run_id`` cannot go on: its ``lane`` has work left and no worker to run it, every one lost
    (``failure``: the first one's) or none back for ``waited_s``. What was measured is kept."""

    run_id: str
    lane: str
    failure: str | None = None
    waited_s: float = 0.0

    def problem(self) -> str:
        if self.failure is not None:
            return f"run {self.run_id}: every {self.lane} worker is lost ({self.failure}) with work left"
        return f"run {self.run_id}: no {self.lane} worker came back for {self.waited_s:.0f} s with work left"

    def advice(self) -> str:
        return "what was measured is kept: resume the run once the cluster is healthy"


@dataclass(eq=False)
class IncompleteRun(Fielded):
    """Run ``run_id`` (of ``kind``, in ``results``) ended with ``missing`` items of its work still
    without a row: it is not finished, and a resume measures them."""

    run_id: str
    kind: str
    missing: int
    results: Path

    def problem(self) -> str:
        return (
            f"run {self.run_id} ended with {self.missing} item(s) still without a row, so it is not "
            "marked finished"
        )

    def advice(self) -> str:
        return "resume it to measure them"
