"""Task names to task objects. Importing a task module must not import torch."""

from __future__ import annotations

import importlib

from tasks.base import TuningTask

_TASKS: dict[str, str] = {
    "decode_attention": "tasks.decode_attention:DecodeAttention",
    "fault_injection": "tasks.fault_injection:FaultInjection",
    "flash_decode": "tasks.flash_decode:FlashDecode",
    "flex_prefill": "tasks.flex_prefill:FlexPrefill",
}


def task_names() -> list[str]:
    return sorted(_TASKS)


def get_task(name: str) -> TuningTask:
    """The task registered as ``name``; KeyError if there is none."""
    module_name, _, attr = _TASKS[name].partition(":")
    return getattr(importlib.import_module(module_name), attr)()  # type: ignore[no-any-return]
