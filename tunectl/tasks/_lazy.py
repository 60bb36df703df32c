"""Kernels built on first use, so that ``prepare`` does host work only.

A worker may prepare the next config in a background thread while the current one is timed; a
``prepare`` that touched the device (trial calls, block masks, re-paged caches) would then share the
device, and the interpreter, with the timed region. ``lazily`` moves that work into the first call,
which the runner makes before any timing, and turns the errors a kernel uses to reject a point on
that first call into ``InvalidConfig``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tunectl.tasks.base import InvalidConfig


def lazily(
    build: Callable[[], Callable[[], Any]], reject: Callable[[Exception], str | None] = lambda exc: None
) -> Callable[[], Any]:
    """A call that runs ``build()`` once, then the call it returns; see module doc."""
    built: list[Callable[[], Any]] = []

    def call() -> Any:
        if built:
            return built[0]()
        try:
            fn = build()
            out = fn()
        except InvalidConfig:
            raise
        except Exception as exc:
            why = reject(exc)
            if why is not None:
                raise InvalidConfig(why) from None
            raise
        built.append(fn)
        return out

    return call
