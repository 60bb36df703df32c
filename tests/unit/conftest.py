"""The unit tier starts no Ray: a test that leaves a Ray instance connected fails, pointing to its tier."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_ray() -> Iterator[None]:
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
        pytest.fail("this test started Ray: it belongs in tests/integration (tests/README.md)")
