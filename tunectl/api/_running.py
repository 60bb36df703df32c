"""How the front door's options become a run's (``tunectl.orchestrator.submit.RunOptions``)."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any

from tunectl.api.options import Cluster, CompileOptions

if TYPE_CHECKING:
    from tunectl.orchestrator.submit import RunOptions


def run_options(
    cluster: Cluster, *, compile_ahead: bool | None = None, compile: CompileOptions | None = None
) -> RunOptions:
    from tunectl.orchestrator.cluster import connect
    from tunectl.orchestrator.submit import RunOptions

    return RunOptions(
        address=cluster.address,
        num_gpus=cluster.num_gpus,
        num_cpus=cluster.num_cpus,
        connect_fn=_connect_cancelling if cluster.cancel_on_sigterm else connect,
        compile_ahead=compile_ahead,
        compile_options=compile,
    )


def cancel_on_sigterm(signum: int, frame: Any) -> None:
    """A SIGTERM handler: the run in this process stops as cancelled (``RunCancelled``)."""
    from tunectl.orchestrator.control import request_cancel

    request_cancel()


def _connect_cancelling(
    address: str | None, num_gpus: int | None = None, num_cpus: int | None = None
) -> bool:
    """Join or start Ray, then take SIGTERM back (``ray.init`` installs a handler that just exits)."""
    from tunectl.orchestrator.cluster import connect

    owns_ray = connect(address, num_gpus=num_gpus, num_cpus=num_cpus)
    signal.signal(signal.SIGTERM, cancel_on_sigterm)
    return owns_ray
