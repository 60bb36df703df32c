"""What the kernel tests share: a watch on the modules the torch.compile way of FlexAttention compiles."""

from __future__ import annotations

from typing import Any

import pytest

from tunectl.tasks import _flex


@pytest.fixture
def compiled_modules(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each module ``_flex.compiled_module`` compiles from now on, in order (it still compiles them)."""
    compiled: list[Any] = []
    real = _flex.compiled_module

    def watched(module: Any, point: object) -> Any:
        compiled.append(module)
        return real(module, point)

    monkeypatch.setattr(_flex, "compiled_module", watched)
    return compiled
