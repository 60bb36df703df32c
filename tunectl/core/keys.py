"""Canonical, typed, collision-free keys for static parameters, shapes and configs.

A key is a mapping of parameter names to normalised scalar values, stored as a tuple of
``(name, value)`` pairs sorted by name. Its text form is canonical JSON, which is what the
results dataset and the bundle store; ``key_from_text(key_text(k)) == k`` for every key.

Values are ``None``, ``bool``, ``int``, finite ``float``, ``str`` or tuples of those. JSON keeps
``True``, ``1``, ``1.0`` and ``"1"`` apart, so distinct normalised parameter sets never share a text.
Parameters that callers pass in several forms are normalised here and nowhere else:

- a sliding ``window`` given as ``None``, ``-1``, an int ``w`` or a pair ``(left, right)`` becomes the
  pair ``(left, right)`` with ``-1`` meaning unbounded;
- a ``dtype`` (or any ``*_dtype``) given as ``torch.bfloat16`` or ``"torch.bfloat16"`` becomes ``"bfloat16"``.

Standard library only: the serving runtime imports this module.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Union

from tunectl.core.files import canonical_json

Scalar = Union[None, bool, int, float, str]  # noqa: UP007 (a runtime alias)
Value = Union[Scalar, tuple["Value", ...]]  # noqa: UP007 (recursive)
Key = tuple[tuple[str, Value], ...]


class InvalidKeyError(ValueError):
    """A parameter value that cannot be part of a key."""


def _normalise_window(value: object) -> Value:
    if value is None:
        return (-1, -1)
    if isinstance(value, bool):
        raise InvalidKeyError(f"window must be None, an int or a pair of ints, not {value!r}")
    if isinstance(value, int):
        return (-1, -1) if value < 0 else (value, 0)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        left, right = value
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right)):
            return (max(int(left), -1), max(int(right), -1))
    raise InvalidKeyError(f"window must be None, an int or a pair of ints, not {value!r}")


def _normalise_dtype(value: object) -> Value:
    text = value if isinstance(value, str) else str(value)
    return text.removeprefix("torch.")


def normaliser_for(name: str) -> Callable[[object], Value] | None:
    """The normaliser for parameter ``name``, or None where the generic rules suffice."""
    if name == "window" or name.endswith("_window"):
        return _normalise_window
    if name == "dtype" or name.endswith("_dtype"):
        return _normalise_dtype
    return None


def normalise_value(name: str, value: object) -> Value:
    """Return the canonical form of one parameter value; raise InvalidKeyError if it has none."""
    special = normaliser_for(name)
    if special is not None:
        value = special(value)
    return _canonical(name, value)


def _canonical(name: str, value: object) -> Value:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidKeyError(f"{name}: non-finite float {value!r} cannot be part of a key")
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_canonical(name, v) for v in value)
    # numpy and torch integer scalars expose __index__; floats expose __float__.
    if hasattr(value, "__index__"):
        return int(value.__index__())  # type: ignore[attr-defined]
    raise InvalidKeyError(f"{name}: {type(value).__name__} value {value!r} cannot be part of a key")


def make_key(params: Mapping[str, object]) -> Key:
    """Normalise ``params`` into a key: sorted ``(name, value)`` pairs."""
    for name in params:
        if not isinstance(name, str) or not name:
            raise InvalidKeyError(f"parameter names must be non-empty strings, not {name!r}")
    return tuple(sorted((name, normalise_value(name, v)) for name, v in params.items()))


def to_json(value: Any) -> Any:
    """A value as JSON holds it: tuples (at any depth) become lists. The inverse of ``from_json``."""
    if isinstance(value, tuple):
        return [to_json(v) for v in value]
    return value


def from_json(value: Any) -> Any:
    """A value read from JSON as a key holds it: lists (at any depth) become tuples, so it hashes."""
    if isinstance(value, list):
        return tuple(from_json(v) for v in value)
    return value


def key_json(key: Key) -> dict[str, Any]:
    """A key as a JSON object (what a bundle entry stores)."""
    return {name: to_json(v) for name, v in key}


def key_text(key: Key) -> str:
    """Canonical JSON text of a key (an object with sorted names, no whitespace)."""
    return canonical_json(key_json(key))


@functools.lru_cache(maxsize=1 << 14)
def key_from_text(text: str) -> Key:
    """Parse a key's canonical text back into the key. Kept for the texts parsed last: a run's records
    repeat a few static keys, shapes and configs many times over."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise InvalidKeyError(f"a key's text must be a JSON object, not {text!r}")
    return tuple(sorted((name, from_json(v)) for name, v in raw.items()))


def key_dict(key: Key) -> dict[str, Value]:
    return dict(key)


def value_order(key: Key | Mapping[str, Any]) -> tuple[Any, ...]:
    """A sort key that orders keys by value (batch 4 before 16), values of different types apart.

    The one ordering of keys: tables, reports, diffs and near-tie breaks all sort with it. A mapping
    (a bundle entry's key, lists and all) sorts as the key it holds.
    """
    items = sorted((n, from_json(v)) for n, v in key.items()) if isinstance(key, Mapping) else key
    return tuple((name, type(v).__name__, v if not isinstance(v, tuple) else repr(v)) for name, v in items)


def key_digest(*keys: Key) -> str:
    """A stable 16-hex-digit digest of one or more keys (in order)."""
    return text_digest(*map(key_text, keys))


def text_digest(*texts: str) -> str:
    """``key_digest`` of the keys whose texts (``key_text``) are ``texts``: for a caller that keeps the
    texts of keys it digests often."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


def product(grid: Mapping[str, Iterable[object]]) -> list[dict[str, object]]:
    """Cartesian product of a grid of named value lists, in name order then value order."""
    combos: list[dict[str, object]] = [{}]
    for name in sorted(grid):
        combos = [{**c, name: v} for c in combos for v in grid[name]]
    return combos
