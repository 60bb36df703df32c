"""The unit tier runs without Ray: a test that leaves a Ray instance connected fails, pointing to its tier.

Where the tiers run in one process (``pytest tests``), the instance an integration test left connected
is shut down before the next unit test, which then sees no Ray, as in a run of the unit tier alone.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


def _ray_connected() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


@pytest.fixture(autouse=True)
def _no_ray() -> Iterator[None]:
    if _ray_connected():
        sys.modules["ray"].shutdown()
    yield
    if _ray_connected():
        sys.modules["ray"].shutdown()
        pytest.fail("this test started Ray: it belongs in tests/integration (tests/README.md)")
