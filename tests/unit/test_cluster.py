"""Joining a cluster: what is refused before anything connects."""

from __future__ import annotations

import pytest

from tunectl.core.errors import UserError
from tunectl.orchestrator.cluster import connect


def test_num_gpus_applies_to_a_local_instance_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    if ray.is_initialized():
        pytest.skip("a Ray instance from another test is connected")
    with pytest.raises(UserError, match="--num-gpus applies to a local instance only"):
        connect("ray://head:10001", num_gpus=2)
    monkeypatch.setenv("RAY_ADDRESS", "head:6379")  # a job's driver: joining, never a new instance
    with pytest.raises(UserError, match="--num-gpus applies to a local instance only"):
        connect(None, num_gpus=2)
