"""A cancel is told from a plain interrupt, whichever way it reaches the driver."""

from __future__ import annotations

import pytest


def test_a_cancel_is_recorded_cancelled_even_when_it_arrives_as_a_plain_interrupt() -> None:
    from tunectl.orchestrator import control, lifecycle

    control.cancel_requested.clear()
    assert lifecycle.stopped_state(KeyboardInterrupt()) == "interrupted"
    with pytest.raises(control.RunCancelled):
        control.request_cancel()
    try:  # a library (Ray inside ray.wait) may re-raise the cancel as a plain KeyboardInterrupt
        assert lifecycle.stopped_state(KeyboardInterrupt()) == "cancelled"
    finally:
        control.cancel_requested.clear()
