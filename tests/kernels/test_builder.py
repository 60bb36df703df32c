"""A compile process's builder, run in this process: FlexAttention built ahead by Inductor on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunectl.core.keys import make_key
from tunectl.core.plan import WorkItem
from tunectl.tasks.flex_prefill import FlexPrefill

PREFILL_STATIC = dict(dtype="float32", num_q_heads=2, num_kv_heads=1, head_dim=16, mask="causal", num_docs=1,
                      window=(-1, -1))  # fmt: skip


def test_a_compile_process_builds_a_default_that_sets_no_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty config (FlexAttention's default: no kernel options) builds like any other."""
    from tunectl.orchestrator.compile_process import Builder

    monkeypatch.setenv("TUNECTL_COMPILE_CACHE", str(tmp_path))
    init = FlexPrefill.__init__
    monkeypatch.setattr(FlexPrefill, "__init__", lambda self: init(self, compile_on_cpu=False))  # CPU: eager
    builder = Builder.__ray_metadata__.modified_class(0)  # the actor's class, run in this process
    default = WorkItem("d", "flex_prefill", make_key(PREFILL_STATIC), make_key({"batch": 1, "seq_len": 256}),
                       make_key({}), True)  # fmt: skip
    result = builder.build("flex_prefill:default", default, default.config)
    assert (result.status, result.message) == ("ok", "")
    assert result.seconds > 0
    assert builder._inputs is not None, "kept while the next build may share the point"
    builder.idle()
    assert builder._inputs is None and builder._point is None, "let go once nothing is pending"
    again = builder.build("flex_prefill:default", default, default.config)
    assert again.status == "ok" and builder._inputs is not None, "a later build makes them again"
