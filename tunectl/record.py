"""One measurement, as a worker returns it and the results dataset stores it. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass, fields

#: ok: measured and correct. wrong_result: output differs from the reference (never timed, never wins).
#: error: the config raised. invalid: the kernel rejects the config at this point. crash: the worker
#: process died running it (after one retry). timeout: it ran past the per-item deadline.
#: compile_error: building its kernel failed in a compile process (the compiler raised, or died
#: twice); compile_timeout: the build ran past the compile timeout. Neither reached a GPU worker.
STATUSES = ("ok", "wrong_result", "error", "invalid", "crash", "timeout", "compile_error", "compile_timeout")
FAILED = tuple(s for s in STATUSES if s != "ok")

#: What a row measured. measure: one config, timed on its own to the spec's noise target. screen: a
#: cheaper look at one config (a successive-halving rung below the top). final: finalists of one
#: point timed in interleaved rounds against the default on one device (``speedup*`` is the paired
#: ratio with its 95 % interval). validate: a bundle's config against the default, each run as an
#: L-layer stack (``layers``) with a cache-thrashing kernel between layers. import: taken from
#: another tuner's log, not measured by tunectl.
PHASES = ("measure", "screen", "final", "validate", "import")


@dataclass(frozen=True)
class Record:
    run_id: str
    item_id: str
    task: str
    static_key: str
    shape_key: str
    config_key: str
    is_default: bool
    status: str
    message: str = ""
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    mean_us: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    num_samples: int | None = None
    rel_noise: float | None = None
    max_abs_err: float | None = None
    compile_ms: float | None = None
    bytes_moved: int | None = None
    measure_mode: str = ""
    phase: str = "measure"
    group_id: str = ""  # the comparison (final, validate) the row is one arm of
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
    device_name: str = ""
    device_kind: str = ""
    host: str = ""
    worker: str = ""
    env_json: str = "{}"
    started_at: float = 0.0
    finished_at: float = 0.0


RECORD_FIELDS = tuple(f.name for f in fields(Record))
