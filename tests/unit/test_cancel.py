"""A cancel is told from a plain interrupt, whichever way it reaches the driver."""

from __future__ import annotations

import pytest


def test_a_cancel_is_recorded_cancelled_even_when_it_arrives_as_a_plain_interrupt() -> None:
    from tunectl.orchestrator import submit as orchestration

    orchestration._cancel_requested.clear()
    assert orchestration._stopped_state(KeyboardInterrupt()) == "interrupted"
    with pytest.raises(orchestration.RunCancelled):
        orchestration.request_cancel()
    try:  # a library (Ray inside ray.wait) may re-raise the cancel as a plain KeyboardInterrupt
        assert orchestration._stopped_state(KeyboardInterrupt()) == "cancelled"
    finally:
        orchestration._cancel_requested.clear()
