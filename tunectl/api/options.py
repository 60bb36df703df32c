"""The options the front door takes: small frozen objects, each value checked when it is made.

A value out of bounds is an ``OptionError`` naming the option (``.option``, ``.value``, ``.reason``);
the command line words it with the flag's name. Defaults are the command line's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from tunectl.core.errors import OptionError
from tunectl.core.params import Rule
from tunectl.core.spec import DEFAULT_MARGIN, Spec
from tunectl.decide.probes import DEFAULT_PER_CELL, DEFAULT_SHORTLIST
from tunectl.decide.stacked import DEFAULT_LAYERS, DEFAULT_ROUNDS
from tunectl.formats.export import Choices, Scope
from tunectl.orchestrator.control import CompileOptions


def _bounded(default: Any, rule: Rule) -> Any:
    """An option whose values ``rule`` bounds (checked when the options are made)."""
    return field(default=default, metadata={"rule": rule})


class _Checked:
    """Checks each bounded field of a frozen options dataclass when it is made."""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            rule = f.metadata.get("rule")
            value = getattr(self, f.name)
            problem = None if rule is None or value is None else rule.problem(value)
            if problem is not None:
                raise OptionError(f.name, value, problem)


@dataclass(frozen=True)
class Cluster(_Checked):
    """Where a run measures: the Ray cluster to join (``auto``, ``HOST:6379``, ``ray://HEAD:10001``;
    None: a local instance), and what a local instance offers. ``cancel_on_sigterm``: SIGTERM (``tunectl
    cancel``, a stopped Ray job) stops the run as cancelled, also once Ray has taken the signal over."""

    address: str | None = None
    num_gpus: int | None = _bounded(None, Rule.integer(0))
    num_cpus: int | None = _bounded(None, Rule.integer(1))
    cancel_on_sigterm: bool = False


@dataclass(frozen=True)
class SubmitOptions(_Checked):
    """How a tuning run goes; nothing here changes what it measures.

    ``compile_ahead``: prepare the next config of a point while timing the current one (default off).
    ``run_id``: the id of a new run (default a fresh one). ``confirm_above``: refuse a new run that
    plans more items than this (None: no limit).
    """

    cluster: Cluster = field(default_factory=Cluster)
    compile: CompileOptions = field(default_factory=CompileOptions)
    compile_ahead: bool | None = None
    run_id: str | None = None
    confirm_above: int | None = _bounded(None, Rule.integer(1))


@dataclass(frozen=True)
class ValidateOptions(_Checked):
    """Stacked validation: ``layers`` calls in a row per stack, ``rounds`` interleaved rounds of the
    bundle against the default. ``resume``: a stopped validation run of the same bundle, spec and
    options to finish."""

    layers: int = _bounded(DEFAULT_LAYERS, Rule.integer(1))
    rounds: int = _bounded(DEFAULT_ROUNDS, Rule.integer(2))
    resume: str | None = None
    cluster: Cluster = field(default_factory=Cluster)


@dataclass(frozen=True)
class HoldoutOptions(_Checked):
    """A holdout: ``num_shapes`` shapes drawn (by ``seed``) inside the spec's ranges; the pick loses
    where it is slower than the best by more than ``margin``."""

    num_shapes: int = _bounded(24, Rule.integer(1))
    seed: int = 0
    rounds: int = _bounded(DEFAULT_ROUNDS, Rule.integer(2))
    margin: float = _bounded(DEFAULT_MARGIN, Rule.number(0, 1))
    resume: str | None = None
    cluster: Cluster = field(default_factory=Cluster)


@dataclass(frozen=True)
class ProbeOptions(_Checked):
    """Region probes: ``per_cell`` shapes per cell, the default against the cell's ``shortlist``
    fastest configs and its corners' winners, in ``rounds`` interleaved rounds."""

    per_cell: int = _bounded(DEFAULT_PER_CELL, Rule.integer(1))
    shortlist: int = _bounded(DEFAULT_SHORTLIST, Rule.integer(1))
    rounds: int = _bounded(DEFAULT_ROUNDS, Rule.integer(2))
    resume: str | None = None
    cluster: Cluster = field(default_factory=Cluster)


@dataclass(frozen=True)
class ExportOptions:
    """Which results a bundle is chosen from (``scope``) and how winners become entries
    (``choices``). ``validate_on``: validate the bundle before publishing it, on these specs' points
    (empty: the source runs' own specs), with ``validation``; None: publish without validating."""

    scope: Scope = field(default_factory=Scope)
    choices: Choices = field(default_factory=Choices)
    validate_on: Sequence[Spec] | None = None
    validation: ValidateOptions = field(default_factory=ValidateOptions)
