"""What a parameter may take: a number in a range, one of some choices, or a pair. Standard library only.

Tasks declare one ``Rule`` per parameter (``TuningTask.param_rules``) and the spec's own tables
(``[measure]``, ``[search]``, ``[resources]``) have theirs; spec validation checks every value
before anything is planned, and a value that fails is reported with what is allowed::

    Rule.integer(low=1).problem("eight")      # "must be an integer >= 1, not 'eight'"
    Rule.one_of("index", "per_seq").problem("bogus")  # "must be one of index, per_seq, not 'bogus'"
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("int", "float", "str", "bool", "pair")


@dataclass(frozen=True)
class Rule:
    """A parameter's type and what values of it are allowed (``low``/``high`` inclusive unless open)."""

    kind: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is not allowed (a time must be > 0)
    choices: tuple[str | int | bool, ...] = ()

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind

    @classmethod
    def integer(cls, low: float | None = None, high: float | None = None) -> Rule:
        return cls("int", low, high)

    @classmethod
    def number(cls, low: float | None = None, high: float | None = None, *, low_open: bool = False) -> Rule:
        return cls("float", low, high, low_open)

    @classmethod
    def one_of(cls, *choices: str | int | bool) -> Rule:
        kind = "bool" if all(isinstance(c, bool) for c in choices) else "str"
        return cls(kind, choices=tuple(choices))

    @classmethod
    def pair(cls, low: float | None = None) -> Rule:
        """Two integers, each at least ``low`` (a window: ``(left, right)``, -1 unbounded)."""
        return cls("pair", low)

    def allowed(self) -> str:
        """What the rule allows, as the end of "must be ..."."""
        if self.choices:
            return "one of " + ", ".join(_show(c) if isinstance(c, bool) else str(c) for c in self.choices)
        noun = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}
        if self.kind == "pair":
            noun["pair"] = "a pair of integers" + (
                f" each >= {_num(self.low)}" if self.low is not None else ""
            )
            return noun["pair"]
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.low_open else '>='} {_num(self.low)}")
        if self.high is not None:
            bounds.append(f"<= {_num(self.high)}")
        return noun[self.kind] + (" " + " and ".join(bounds) if bounds else "")

    def problem(self, value: object) -> str | None:
        """None if ``value`` is allowed; else "must be <what is allowed>, not <value>"."""
        return None if self._ok(value) else f"must be {self.allowed()}, not {_show(value)}"

    def _ok(self, value: object) -> bool:
        if self.choices:
            return any(type(value) is type(c) and value == c for c in self.choices)
        if self.kind == "pair":
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                return False
            return all(self._number(v, integer=True) for v in value)
        if self.kind in ("str", "bool"):
            return isinstance(value, str if self.kind == "str" else bool)
        return self._number(value, integer=self.kind == "int")

    def _number(self, value: object, *, integer: bool) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if integer and not isinstance(value, int):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        return self.high is None or value <= self.high


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _show(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)
