"""What a failed config's record says: the exception, where it was raised, clipped to a size a row keeps."""

from __future__ import annotations

import traceback

_MESSAGE_CHARS = 2000


def failure_message(exc: BaseException) -> str:
    """What a failed config's record says: the exception and where it was raised, clipped."""
    return clip(f"{type(exc).__name__}: {exc}\n{_tail(exc)}")


def clip(text: str) -> str:
    """Keep the head (what failed) and the tail (compilers put the root cause last) of a long message."""
    if len(text) <= _MESSAGE_CHARS:
        return text
    half = (_MESSAGE_CHARS - 5) // 2
    return f"{text[:half]}\n...\n{text[-half:]}"


def _tail(exc: BaseException) -> str:
    return "".join(traceback.format_tb(exc.__traceback__)[-2:])
