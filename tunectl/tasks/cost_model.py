"""A task whose cost is a known function of its shape: refinement, coverage and holdout tests use it.

The kernel is an identity on a short float32 vector; each call sleeps what its config says it costs
at the point, so which config wins where is known in advance. A config is a cost model:

    call ms = fixed_ms + per_batch_ms * batch + per_kv_ms * kv_len / 1024
              + unaligned_ms, where batch is not a multiple of align_batch

(each term 0 unless given). The default config is ``fixed_ms = 1``: a kernel of constant cost. A
config with ``per_batch_ms = 0.05`` and nothing else beats it below batch 20 and loses above, so the
winner changes between tuned points. One with ``fixed_ms = 0.5, unaligned_ms = 1, align_batch = 8``
wins at every tuned batch that is a multiple of 8 and loses at the batches between: a kernel whose
tiles or waves fit exactly at round sizes only. ``capacity`` (static) is the largest ``batch * kv_len`` a
point may have; a point above it is refused, as a KV cache that does not fit is.

With ``TUNECTL_SIMULATED_COSTS=1`` in the environment of the processes that measure (the tests set it),
a call does not sleep: it reports its cost as ``simulated_us``, and the CPU sampler takes that for its
time (``tunectl.measure.harness.cpu_sampler``). A fake clock for the timing only: the records, the
statistics and every decision made from them are computed as for a sleeping call, without the noise a
busy machine adds to a sleep.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from tunectl.core.params import Rule
from tunectl.tasks.base import Params, Task

_TERMS = ("fixed_ms", "per_batch_ms", "per_kv_ms", "unaligned_ms")
SIMULATED_ENV = "TUNECTL_SIMULATED_COSTS"


class CostModel(Task):
    name = "cost_model"
    static_params = ("capacity",)
    shape_params = ("batch", "kv_len")
    config_params = (*_TERMS, "align_batch")
    param_rules: ClassVar[Mapping[str, Rule]] = {
        "capacity": Rule.integer(1),
        **{term: Rule.number(0) for term in _TERMS},
        "align_batch": Rule.integer(1),
    }

    def default_config(self, static: Params) -> dict[str, Any]:
        return self.complete_config({"fixed_ms": 1.0})

    def complete_config(self, config: Params) -> dict[str, Any]:
        out: dict[str, Any] = {term: float(config.get(term, 0.0)) for term in _TERMS}
        if out["unaligned_ms"]:  # the alignment only matters with a cost for missing it
            out["align_batch"] = int(config.get("align_batch", 1))
        else:
            del out["unaligned_ms"]
        return out

    def check_point(self, static: Params, shape: Params) -> str | None:
        cells = shape["batch"] * shape["kv_len"]
        if cells > static["capacity"]:
            return f"batch x kv_len = {cells} is over the capacity {static['capacity']}"
        return None

    def build_inputs(self, static: Params, shape: Params, device: str) -> dict[str, Any]:
        import torch

        return {"x": torch.arange(16, dtype=torch.float32, device=device)}

    def reference(self, static: Params, shape: Params, inputs: dict[str, Any]) -> Any:
        return inputs["x"].clone()

    def prepare(
        self, static: Params, shape: Params, config: Params, inputs: dict[str, Any]
    ) -> Callable[[], Any]:
        seconds = cost_ms(config, shape) / 1e3
        x = inputs["x"]
        if os.environ.get(SIMULATED_ENV) == "1":

            def reported() -> Any:
                return x

            reported.simulated_us = seconds * 1e6  # type: ignore[attr-defined]
            return reported

        def call() -> Any:
            time.sleep(seconds)
            return x

        return call

    def tolerance(self, static: Params) -> tuple[float, float]:
        return (0.0, 0.0)


def cost_ms(config: Params, shape: Params) -> float:
    """What one call of ``config`` costs at ``shape``, in milliseconds."""
    terms = {term: float(config.get(term, 0.0)) for term in _TERMS}
    unaligned = shape["batch"] % int(config.get("align_batch", 1)) != 0
    return (
        terms["fixed_ms"]
        + terms["per_batch_ms"] * shape["batch"]
        + terms["per_kv_ms"] * shape["kv_len"] / 1024
        + terms["unaligned_ms"] * unaligned
    )
