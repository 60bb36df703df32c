"""One measurement, as a worker returns it and the results dataset stores it. Standard library only.

A ``Record`` is the one currency from the worker onwards: selection, validation and export take
``Sequence[Record]``. Its keys travel as canonical text (what Parquet stores) and read as typed keys
(``record.static``, ``.shape``, ``.config``); its choices are ``StrEnum`` members, checked when the
record is made, so an unknown status never reaches a file. Text exists only at the file edges
(``Record.from_row`` and ``Record.to_row``).
"""

from __future__ import annotations

import datetime as dt
import functools
import typing
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from functools import cached_property
from typing import Any, TypeVar

from tunectl.core.keys import Key, key_from_text


class Status(StrEnum):
    """How a measurement ended.

    ok: measured and correct. wrong_result: output differs from the reference (never timed, never
    wins). error: the config raised. invalid: the kernel rejects the config at this point. crash: the
    worker process died running it (after one retry). timeout: it ran past the per-item deadline.
    compile_error: building its kernel failed in a compile process (the compiler raised, or died
    twice). compile_timeout: the build ran past the compile timeout. Neither reached a GPU worker.
    dominated: a first look not taken, the config being far behind at every point near this one
    (``tunectl.decide.dominated``; the message gives the evidence). It never reached a GPU either.
    """

    OK = "ok"
    WRONG_RESULT = "wrong_result"
    ERROR = "error"
    INVALID = "invalid"
    CRASH = "crash"
    TIMEOUT = "timeout"
    COMPILE_ERROR = "compile_error"
    COMPILE_TIMEOUT = "compile_timeout"
    DOMINATED = "dominated"


class Phase(StrEnum):
    """What a record measured.

    measure: one config, timed on its own to the spec's noise target. screen: a cheaper look at one
    config (a successive-halving rung below the top). final: finalists of one point timed in
    interleaved rounds against the default on one device (``speedup*`` is the paired ratio with its
    95 % interval). validate: a bundle's config against the default, each run as an L-layer stack
    (``layers``) with a cache-thrashing kernel between layers. holdout: at a shape that was not
    tuned, the default, a bundle's pick and the other configs in interleaved rounds (single calls).
    probe: inside the region a tuned cell serves, the default and the cell's short list in
    interleaved rounds (single calls; ``tunectl.decide.probes``).
    import: taken from another tuner's log, not measured by tunectl.
    """

    MEASURE = "measure"
    SCREEN = "screen"
    FINAL = "final"
    VALIDATE = "validate"
    IMPORT = "import"
    HOLDOUT = "holdout"
    PROBE = "probe"


class TimingMethod(StrEnum):
    """How a sample was timed: eager calls, or CUDA-graph replay. Empty where nothing was timed."""

    NONE = ""
    EAGER = "eager"
    GRAPH = "graph"


class Timing(StrEnum):
    """How a sample was turned into a time per call (``tunectl.measure.timing``; the spec's
    ``measure.timing``).

    replay: a sample times one launch on its own between events (a graph replay, an eager call, or
    on a CPU one call by the clock), the cache flushed before it outside the timed region; with a
    cold L2 on a GPU the launch holds one call and the sample carries the launch's fixed cost
    (a few microseconds). Rows written before rows said how they were timed read as replay.
    difference: a launch of K x (flush, call) minus a launch of the K flushes alone, over K, the two
    interleaved; no fixed cost per sample. Only rows of one method are compared (``tunectl.decide.select``).
    """

    REPLAY = "replay"
    DIFFERENCE = "difference"


#: statuses that are no failure: a measurement, or a look settled without one (``dominated``)
NOT_FAILED = (Status.OK, Status.DOMINATED)
#: Records that measured configs one call at a time (``validate`` records time whole stacks).
SELECTED_PHASES = (Phase.MEASURE, Phase.SCREEN, Phase.FINAL, Phase.IMPORT)
_ENUMS: dict[str, type[StrEnum]] = {
    "status": Status,
    "phase": Phase,
    "measure_mode": TimingMethod,
    "timing": Timing,
}


@dataclass(frozen=True)
class Record:
    run_id: str
    item_id: str
    task: str
    static_key: str
    shape_key: str
    config_key: str
    is_default: bool
    status: Status
    message: str = ""
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    mean_us: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    num_samples: int | None = None
    # kernel calls one sample timed: K of the difference method, a warm-L2 replay's calls, else 1 (a
    # validation's sample: one stack of ``layers`` calls)
    calls_per_sample: int | None = None
    rel_noise: float | None = None
    max_abs_err: float | None = None
    compile_ms: float | None = None
    # Where the worker's time on the item went, besides compile_ms (preparing the kernel and its first,
    # checked call): building the point's inputs and reference output (0 where the worker already held
    # them), the measurement's wall time (warm-up, samples, re-measures; for a comparison, all its
    # rounds, the same on every arm), and of that the drift guard's own (timing its reference, waiting).
    setup_ms: float | None = None
    measure_ms: float | None = None
    guard_ms: float | None = None
    bytes_moved: int | None = None
    measure_mode: TimingMethod = TimingMethod.NONE
    timing: Timing = Timing.REPLAY
    phase: Phase = Phase.MEASURE
    group_id: str = ""  # the comparison (final, validate) the record is one arm of
    rung: int | None = None
    rounds: int | None = None
    layers: int | None = None
    speedup: float | None = None  # default time over this config's, paired (final, validate)
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    l2: str = ""
    sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    throttled: bool | None = None
    throttle_reasons: int | None = None  # NVML's clock event reasons seen around the measurement
    # The drift guard (tunectl.measure.drift): the median of its reference kernel that judged this
    # measurement (the reading around it that strayed furthest), its ratio to the reference's level at
    # the start of the point on this worker, whether that moved beyond noise (after ``remeasured`` more
    # measurements of this config), None where no reference was timed. Parts written by older versions
    # name it ``probe_us`` (read as this one: tunectl.store.results).
    reference_us: float | None = None
    reference_ratio: float | None = None
    drift: bool | None = None
    remeasured: int | None = None
    device_name: str = ""
    device_kind: str = ""
    host: str = ""
    worker: str = ""
    env_json: str = "{}"
    started_at: float = 0.0
    finished_at: float = 0.0

    def __post_init__(self) -> None:
        for name, enum in _ENUMS.items():
            value = getattr(self, name)
            if type(value) is not enum:
                try:
                    object.__setattr__(self, name, enum(value))
                except ValueError:
                    choices = ", ".join(repr(str(m)) for m in enum)
                    raise ValueError(f"record {name} {value!r} is not one of {choices}") from None

    @cached_property
    def static(self) -> Key:
        return key_from_text(self.static_key)

    @cached_property
    def shape(self) -> Key:
        return key_from_text(self.shape_key)

    @cached_property
    def config(self) -> Key:
        return key_from_text(self.config_key)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def failed(self) -> bool:
        """Neither ok nor a look settled without measuring it (``NOT_FAILED``)."""
        return self.status not in NOT_FAILED

    @property
    def point(self) -> Point:
        """Where the record measured: (task, device name, static key text, shape key text)."""
        return (self.task, self.device_name, self.static_key, self.shape_key)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Record:
        """A record from a stored row (a Parquet row as a dict); rows written by older versions read too.

        Missing or null text fields read as empty, a missing phase as ``measure`` (rows from before
        phases were full measurements), a missing timing as ``replay`` (the one method before rows
        named theirs), timestamps as seconds since the epoch.
        """
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in row:
                continue
            value = row[f.name]
            if f.name in _TIMESTAMPS:
                value = value.timestamp() if isinstance(value, dt.datetime) else float(value or 0.0)
            elif value is None and f.type in ("str", "Phase", "TimingMethod", "Timing"):
                value = _NULL_READS_AS.get(f.name, "")
            values[f.name] = value
        if not values.get("phase"):
            values["phase"] = Phase.MEASURE
        return cls(**values)

    def to_row(self) -> dict[str, Any]:
        """The record as a plain dict of text and numbers (what a file or a data frame holds)."""
        return {name: str(v) if isinstance(v, StrEnum) else v for name, v in asdict(self).items()}


Point = tuple[str, str, str, str]  # (task, device name, static key text, shape key text)
_NULL_READS_AS = {"phase": str(Phase.MEASURE), "timing": str(Timing.REPLAY)}
RECORD_FIELDS = tuple(f.name for f in fields(Record))


@functools.cache
def record_types() -> dict[str, type]:
    """Each field of ``Record`` and the plain type it holds: ``bool``, ``int``, ``float`` or ``str``
    (an enum's values are text; an optional field's type is the one it holds when set)."""
    out: dict[str, type] = {}
    for name, hint in typing.get_type_hints(Record).items():
        kinds = [k for k in typing.get_args(hint) or (hint,) if k is not type(None)]
        (kind,) = kinds
        out[name] = str if issubclass(kind, str) else kind
    return out


_TIMESTAMPS = ("started_at", "finished_at")

K = TypeVar("K", bound=Hashable)


def latest(
    records: Iterable[Record], key: Callable[[Record], K], rank: Callable[[Record], Any] | None = None
) -> dict[K, Record]:
    """Per ``key``, the record with the highest ``rank`` (default: the last finished); on a tie the later one.

    The one rule for "which of several records counts": a retry's record over the one it replaced,
    a full measurement over a screening look (``rank``).
    """
    order = rank or (lambda r: r.finished_at)
    out: dict[K, Record] = {}
    for record in records:
        k = key(record)
        old = out.get(k)
        if old is None or order(record) >= order(old):
            out[k] = record
    return out
