"""Bundle entries that are rules: a split count computed from the shape. Standard library only.

A split-KV kernel launches ``across x splits`` units of work (a batch's sequences, each cut into
``splits`` pieces along ``along``, its KV length); the device runs ``per_wave`` of them at once, and
the rest queue behind them in further waves. A call's time is modelled as its makespan::

    chunk  = ceil(ceil(along / splits) / block) * block       tokens per split, whole blocks
    active = ceil(along / chunk)                              splits with tokens to read
    waves  = ceil(across * active / per_wave)
    time   = fixed + per_work * across * along + per_token * waves * chunk
             + (per_split + per_partial * across * active if splits > 1)

``per_wave`` and ``block`` describe the launch geometry, the costs (µs) the kernel on this device;
``tunectl export bundle`` fits all seven to the measured rows of one kernel family (a config with its
split count left open) at one static key (``tunectl.decide.rules``). ``per_work`` is the cost of the
reads themselves, the same for every count at a shape (the KV a call reads does not depend on how it
is cut): it changes no choice, but without it the fit blamed the reads' time on the waves and took a
wave for half its size. On the H200 page-16 and page-128 tuning rows, each shape left out of the fit
in turn, the Triton kernel's counts chosen with it lost 0.8-1.7 % (geometric mean) to the best count
timed there, against 7.0-7.9 % without it; flash-attn 3's 0.7-1.1 % either way
(``benchmarks/studies/rule_models.py``). A bundle stores it beside the four others (``per_work``; a
loader that does not know it still chooses the same counts). The count a rule chooses is the one
whose modelled time is least among ``lo`` and, for one to ``MAX_WAVES`` waves, the
most splits (at most ``hi``) that fill that many: beyond a few waves the same work only adds
merging, and several cover a batch that overflows a wave by a part (the tail that flash-attn 3's
wave efficiency guards against). Where two counts model alike, the fewer splits. So its choice
changes exactly where a launch spills into another wave, not at the sizes that were tuned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RULE_KINDS = ("waves",)
MAX_WAVES = 8
_NO_END = 1 << 62  # no candidate's launch has changed yet


def launch(across: int, along: int, splits: int, per_wave: float, block: int) -> tuple[int, int, int]:
    """(waves, tokens per split, splits with tokens) of a launch cutting ``along`` into ``splits``."""
    tokens = -(-along // splits)
    chunk = -(-tokens // block) * block
    active = -(-along // chunk)
    return math.ceil(across * active / per_wave), chunk, active


@dataclass(frozen=True)
class WaveRule:
    """A split count chosen by a fitted wave (makespan) model; see the module doc."""

    param: str  # the config parameter the rule sets
    across: str  # the shape dimension whose units run side by side (the batch)
    along: str  # the shape dimension cut into splits (the KV length)
    per_wave: float
    block: int
    lo: int
    hi: int
    cost: tuple[float, float, float, float]  # fixed, per_token, per_split, per_partial (µs)
    per_work: float = 0.0  # µs per unit of across x along: the reads (module doc)

    def __post_init__(self) -> None:
        if not (self.per_wave > 0 and self.block >= 1 and 1 <= self.lo <= self.hi):
            raise ValueError(f"a wave rule needs per_wave > 0, block >= 1 and 1 <= lo <= hi: {self}")
        if len(self.cost) != 4 or min(*self.cost, self.per_work) < 0:
            raise ValueError(f"a wave rule's costs are non-negative numbers: {self.cost}, {self.per_work}")

    def predict_us(self, across: int, along: int, splits: int) -> float:
        """The modelled time of one call with ``splits`` splits."""
        waves, chunk, active = launch(across, along, splits, self.per_wave, self.block)
        fixed, per_token, per_split, per_partial = self.cost
        merge = per_split + per_partial * across * active if splits > 1 else 0.0
        return fixed + self.per_work * across * along + per_token * waves * chunk + merge

    def count(self, across: int, along: int) -> int:
        """The split count for this shape (module doc); ``lo`` for a size below 1."""
        return self.span(across, along)[0]

    def span(self, across: int, along: int) -> tuple[int, int, int]:
        """The split count for this shape, and the least and greatest ``along`` at this ``across``
        over which it stays the count: every candidate's launch (its chunk and its splits with tokens)
        is the same there, so is every modelled time. A serving process asks with a KV length that
        grows by one each step: it evaluates the model once a span (``tunectl.runtime.finders``).
        Inlined: it runs on every shape not seen before."""
        if across < 1 or along < 1:
            return self.lo, along, along
        per_wave, block, lo, hi = self.per_wave, self.block, self.lo, self.hi
        _, per_token, per_split, per_partial = self.cost  # the fixed and work costs change no choice
        best, best_us, last, first, final = lo, math.inf, 0, 1, _NO_END
        for waves in range(MAX_WAVES + 2):  # lo; the most splits filling 1..MAX_WAVES waves; hi
            s = (
                lo
                if waves == 0
                else hi
                if waves > MAX_WAVES
                else min(hi, max(lo, int(waves * per_wave // across)))
            )
            if s == last:  # the counts never decrease: a repeat is the one just modelled
                continue
            last = s
            tokens = -(-along // s)
            chunk = -(-tokens // block) * block
            active = -(-along // chunk)
            # this count's chunk holds over ((chunk - block) * s, chunk * s], its active over
            # ((active - 1) * chunk, active * chunk]; active <= s, so the second ends first
            first = max(first, (chunk - block) * s + 1, (active - 1) * chunk + 1)
            final = min(final, active * chunk)
            us = per_token * math.ceil(across * active / per_wave) * chunk
            if s > 1:
                us += per_split + per_partial * across * active
            if us < best_us:
                best, best_us = s, us
            if s == hi:
                break
        return best, first, final

    def config(self, base: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` with the count for the shape in ``params``; a KeyError where a dimension is missing."""
        return {**base, self.param: self.count(params[self.across], params[self.along])}

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "waves",
            "param": self.param,
            "across": self.across,
            "along": self.along,
            "per_wave": self.per_wave,
            "block": self.block,
            "lo": self.lo,
            "hi": self.hi,
            "cost": list(self.cost),
            "per_work": self.per_work,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> WaveRule:
        """The rule ``raw`` describes; ValueError (or KeyError, TypeError) for anything else."""
        if raw.get("kind") not in RULE_KINDS:
            raise ValueError(f"rule kind {raw.get('kind')!r} is not one of {', '.join(RULE_KINDS)}")
        fixed, per_token, per_split, per_partial = (float(c) for c in raw["cost"])
        return cls(
            param=str(raw["param"]),
            across=str(raw["across"]),
            along=str(raw["along"]),
            per_wave=float(raw["per_wave"]),
            block=int(raw["block"]),
            lo=int(raw["lo"]),
            hi=int(raw["hi"]),
            cost=(fixed, per_token, per_split, per_partial),
            per_work=float(raw.get("per_work", 0.0)),
        )
