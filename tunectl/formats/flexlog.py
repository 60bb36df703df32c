"""Import the FlexAttention autotuning log PyTorch Inductor writes, as rows of the results dataset.

With ``TORCHINDUCTOR_FLEX_ATTENTION_LOGGING_FILE=PATH`` set, Inductor's max-autotune appends each
FlexAttention kernel it tunes to ``PATH.json`` (``AlgorithmSelectorCache.maybe_log_flex_attention_results``
in ``torch/_inductor/select_algorithm.py``): a JSON list, one entry per tuned kernel, with every choice
it timed, fastest first: its ``type`` (``triton``, or ``extern`` for a fallback), its ``time`` in ms
(``Infinity`` where it failed) and the Triton options it was built with (``num_warps``, ``num_stages``,
``BLOCK_M``/``BLOCK_N`` or the backward kernel's ``BLOCK_M1`` .. ``BLOCK_N2``, ``USE_TMA``, and ROCm's
``kpack``, ``matrix_instr_nonkdim`` and ``waves_per_eu``, logged at their defaults on every platform).
Two layouts exist:

- torch 2.10 and 2.11: ``{"('forward', 2, 32, 8, 2048, 2048, 128, 128)": [choices]}``, the key the
  Python text of ``(kernel, batch, q_heads, kv_heads, q_len, kv_len, qk_head_dim, v_head_dim)``, where
  a dynamic size is its symbol (``s37``), kept here as that string;
- torch 2.12 and 2.13: ``{"kernel_type": ..., "query_shape": "[2, 32, 2048, 128]", "key_shape": ...,
  "value_shape": ..., "choices": [...]}`` with integer sizes and a ``decode`` kernel besides ``forward``
  and ``backward``. A decode kernel's query is the 5-D view ``[batch, kv_heads, group, q_len, head_dim]``,
  so sizes are read from the shape texts: the sizes each choice repeats take the group for the q length.

Key and shape texts are parsed by Python's parser and read through a whitelist of nodes, never evaluated
(``tunectl.formats.literal``). The whole file is validated before anything is written.

Each choice becomes a row of task ``inductor_flex``, phase ``import``: static key the kernel, heads and
head dims; shape key batch, q_len and kv_len; config key the choice's type and options; its one time as
median, p20 and p80, with no noise. Item ids are digests of the keys, so importing a file again into
its run replaces its rows, and a config logged again later at the same point (a recompilation)
replaces the earlier one, as a re-measurement does in a run. Rows carry the log's modification time.

Each point's winners can be written as FlexAttention ``kernel_options``, as ``tunectl.formats.engines`` names
them: the forward (or decode) winner's options prefixed ``fwd_``, the backward winner's ``bwd_``, one
file per point. The ROCm options are left out: Inductor sets them from its own configs on ROCm,
whatever the call asks, and the log holds their defaults elsewhere.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Union

from tunectl.core.errors import UserError
from tunectl.core.files import atomic_write
from tunectl.core.keys import InvalidKeyError, Key, key_text, make_key
from tunectl.core.plan import item_id
from tunectl.core.record import Phase, Record, Status
from tunectl.decide.select import select_winners
from tunectl.formats.engines import FormatExport, _dump, _point_file
from tunectl.formats.literal import LiteralError, Parsed, Symbol, parse_literal
from tunectl.runtime.adapters import FLEX_BACKWARD_TUNABLES, FLEX_KERNEL_TUNABLES, flex_kernel_options
from tunectl.store.results import ResultsWriter, done_item_ids
from tunectl.store.runs import RunInfo, load_run, new_run_id, save_run

TASK = "inductor_flex"
KERNELS = ("forward", "backward", "decode")
#: the sizes of an entry, in the order of the tuple key
SIZES = ("batch", "num_q_heads", "num_kv_heads", "q_len", "kv_len", "qk_head_dim", "v_head_dim")
STATIC_SIZES = ("num_q_heads", "num_kv_heads", "qk_head_dim", "v_head_dim")
SHAPE_SIZES = ("batch", "q_len", "kv_len")
#: the sizes the named layout repeats in every choice: not options
_CHOICE_SIZES = frozenset(
    ("kernel_type", "B", "Hq", "Hkv", "seq_len_q", "seq_len_kv", "qk_head_dim", "v_head_dim")
)
_ROCM_OPTIONS = frozenset(("kpack", "matrix_instr_nonkdim", "waves_per_eu"))

Size = Union[int, str]  # noqa: UP007 (a runtime alias)


class _Invalid(ValueError):
    """An entry that is not what Inductor writes."""


@dataclass(frozen=True)
class FlexChoice:
    type: str  # triton, or extern for a fallback kernel
    time_ms: float  # inf or nan where it failed
    config: Key  # the type and the options


@dataclass(frozen=True)
class FlexLogEntry:
    number: int  # its place in the log, from 1
    kernel: str  # one of KERNELS
    sizes: Mapping[str, Size]  # SIZES -> an integer, or a symbol's name
    choices: tuple[FlexChoice, ...]

    @property
    def static(self) -> Key:
        return make_key({"kernel": self.kernel, **{n: self.sizes[n] for n in STATIC_SIZES}})

    @property
    def shape(self) -> Key:
        return make_key({n: self.sizes[n] for n in SHAPE_SIZES})


def _kernel(value: object) -> str:
    if not isinstance(value, str) or value not in KERNELS:
        raise _Invalid(f"the kernel must be one of {', '.join(KERNELS)}, not {value!r}")
    return value


def _size(name: str, value: Parsed) -> Size:
    if isinstance(value, Symbol):
        return value.name
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise _Invalid(f"{name} must be a size (an integer or a symbol such as s37), not {value!r}")


def _tuple_key(text: str) -> tuple[str, dict[str, Size]]:
    try:
        parsed = parse_literal(text)
    except LiteralError as exc:
        raise _Invalid(f"key {text!r}: {exc}") from None
    if not isinstance(parsed, tuple) or len(parsed) != 1 + len(SIZES):
        raise _Invalid(f"key {text!r} is not a tuple (kernel, {', '.join(SIZES)})")
    try:
        return _kernel(parsed[0]), {n: _size(n, v) for n, v in zip(SIZES, parsed[1:], strict=True)}
    except _Invalid as exc:
        raise _Invalid(f"key {text!r}: {exc}") from None


def _dims(entry: Mapping[str, Any], name: str) -> tuple[int, ...]:
    text = entry.get(name)
    if not isinstance(text, str):
        raise _Invalid(f"{name} must be the text of a list of sizes, not {text!r}")
    try:
        dims = parse_literal(text)
    except LiteralError as exc:
        raise _Invalid(f"{name} {text!r}: {exc}") from None
    if not isinstance(dims, tuple):
        raise _Invalid(f"{name} {text!r} is not a list of sizes")
    sizes = [d for d in dims if isinstance(d, int) and not isinstance(d, bool) and d >= 0]
    if len(sizes) != len(dims) or len(sizes) not in (4, 5):
        raise _Invalid(f"{name} {text!r} is not a list of 4 integer sizes (5 for a decode query)")
    return tuple(sizes)


def _named_sizes(entry: Mapping[str, Any]) -> dict[str, Size]:
    query, key, value = (_dims(entry, f"{n}_shape") for n in ("query", "key", "value"))
    if len(query) == 5:
        batch, kv_heads, group, q_len, qk_head_dim = query
        q_heads = kv_heads * group
    else:
        batch, q_heads, q_len, qk_head_dim = query
    return {
        "batch": batch,
        "num_q_heads": q_heads,
        "num_kv_heads": key[1],
        "q_len": q_len,
        "kv_len": key[2],
        "qk_head_dim": qk_head_dim,
        "v_head_dim": value[-1],
    }


def _choice(raw: object, number: int) -> FlexChoice:
    if not isinstance(raw, dict):
        raise _Invalid(f"choice {number} is a {type(raw).__name__}, not an object")
    kind, time_ms = raw.get("type"), raw.get("time")
    if not isinstance(kind, str) or not kind:
        raise _Invalid(f"choice {number}: 'type' must be a string such as triton, not {kind!r}")
    if isinstance(time_ms, bool) or not isinstance(time_ms, (int, float)):
        raise _Invalid(f"choice {number}: 'time' must be a number of ms, not {time_ms!r}")
    options = {k: v for k, v in raw.items() if k not in ("type", "time") and k not in _CHOICE_SIZES}
    try:
        config = make_key({"type": kind, **options})
    except InvalidKeyError as exc:
        raise _Invalid(f"choice {number}: {exc}") from None
    return FlexChoice(kind, float(time_ms), config)


def _entry(raw: object, number: int) -> FlexLogEntry:
    if isinstance(raw, dict) and "choices" in raw:
        kernel, sizes, choices = _kernel(raw.get("kernel_type")), _named_sizes(raw), raw["choices"]
    elif isinstance(raw, dict) and len(raw) == 1:
        ((text, choices),) = raw.items()
        kernel, sizes = _tuple_key(text)
    else:
        raise _Invalid(
            "expected {\"('kernel', sizes...)\": [choices]} or an object with kernel_type, "
            "query_shape, key_shape, value_shape and choices"
        )
    if not isinstance(choices, list):
        raise _Invalid(f"the choices must be a list, not a {type(choices).__name__}")
    return FlexLogEntry(number, kernel, sizes, tuple(_choice(c, i) for i, c in enumerate(choices, 1)))


def parse_flex_log(text: str, source: str) -> list[FlexLogEntry]:
    """Every entry of a FlexAttention autotuning log; UserError naming ``source`` and a bad entry."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{source}: not JSON: {exc}") from None
    if not isinstance(raw, list):
        raise UserError(
            f"{source}: a FlexAttention log is a JSON list of entries, not a {type(raw).__name__}"
        )
    if not raw:
        raise UserError(f"{source}: the log has no entries")
    entries = []
    for number, item in enumerate(raw, 1):
        try:
            entries.append(_entry(item, number))
        except _Invalid as exc:
            raise UserError(f"{source}: entry {number}: {exc}") from None
    return entries


def flex_records(entries: Sequence[FlexLogEntry], run_id: str, source: str, stamp: float) -> list[Record]:
    """One row per (kernel, point, config), the one logged last where the log repeats one."""
    rows: dict[str, Record] = {}
    for entry in entries:
        static, shape = entry.static, entry.shape
        for number, choice in enumerate(entry.choices, 1):
            iid = item_id(TASK, static, shape, choice.config)
            rows.pop(iid, None)
            ok = math.isfinite(choice.time_ms)
            us = choice.time_ms * 1000.0 if ok else None
            where = f"{source}: entry {entry.number}, choice {number}"
            rows[iid] = Record(
                run_id=run_id,
                item_id=iid,
                task=TASK,
                static_key=key_text(static),
                shape_key=key_text(shape),
                config_key=key_text(choice.config),
                is_default=False,
                status=Status.OK if ok else Status.ERROR,
                message=where if ok else f"Inductor logged its time as {choice.time_ms} ms ({where})",
                median_us=us,
                p20_us=us,
                p80_us=us,
                rel_noise=0.0 if ok else None,
                phase=Phase.IMPORT,
                started_at=stamp,
                finished_at=stamp,
            )
    return list(rows.values())


def _kernel_options(kernel: str, config: Mapping[str, Any]) -> dict[str, Any]:
    prefix = "bwd_" if kernel == "backward" else "fwd_"
    tunables = set(FLEX_KERNEL_TUNABLES + FLEX_BACKWARD_TUNABLES) - _ROCM_OPTIONS
    return flex_kernel_options({f"{prefix}{k}": v for k, v in config.items() if k in tunables})


def flex_options(records: Sequence[Record]) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """Each point's kernel_options by file name, from its winner per kernel; and what was left out, why."""
    winners = sorted(select_winners(records), key=lambda w: KERNELS.index(dict(w.static)["kernel"]))
    files: dict[str, dict[str, Any]] = {}
    skipped: dict[str, int] = {}
    for winner in winners:
        static, config = dict(winner.static), dict(winner.config)
        kernel = static.pop("kernel")
        options = _kernel_options(str(kernel), config)
        merged = files.setdefault(_point_file(static, dict(winner.shape)), {})
        if not options:
            why = f"the {kernel} winner is an {config['type']} choice, which kernel_options cannot ask for"
        elif merged.keys() & options.keys():
            why = f"a {kernel} winner where a forward winner has the same fwd_ options"
        else:
            merged.update(options)
            continue
        skipped[why] = skipped.get(why, 0) + 1
    return {name: dict(sorted(o.items())) for name, o in files.items() if o}, skipped


def write_flex_options(
    files: Mapping[str, Mapping[str, Any]], skipped: Mapping[str, int], out: str | Path
) -> FormatExport:
    """Write ``files`` (from ``flex_options``) as ``<out>/inductor_flex/<point>.json``."""
    result = FormatExport(Path(out), skipped=dict(skipped), num_entries=len(files))
    for name, options in sorted(files.items()):
        path = result.out / TASK / name
        atomic_write(path, _dump(options), make_parents=True)
        result.files.append(path)
    return result


@dataclass(frozen=True)
class ImportResult:
    run_id: str
    num_entries: int
    num_choices: int
    rows_written: int
    num_failed: int  # rows with status error: Inductor logged no finite time
    num_replaced: int  # choices logged again later at the same point and config
    options: FormatExport | None = None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        hint = f"; Inductor writes {path.with_suffix('.json')}" if path.with_suffix(".json").is_file() else ""
        raise UserError(f"{path}: no such file{hint}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read: {exc}") from None


def _run(results: Path, run_id: str | None, path: Path) -> RunInfo:
    if run_id is not None:
        info = load_run(results, run_id)
        if info.task != TASK:
            raise UserError(f"run {run_id} is a {info.task} run; import into an {TASK} run, or a new one")
        return info
    now = time.time()
    return RunInfo(new_run_id(), path.stem, TASK, str(path), "", "finished", 0, now, now)


def import_flex_log(
    path: str | Path, results: str | Path, run_id: str | None = None, options_out: str | Path | None = None
) -> ImportResult:
    """Add every choice of the log at ``path`` to ``results`` as rows of an import run.

    ``run_id``: an earlier import run to add to (default: a new run). ``options_out``: also write the
    winners as kernel_options there. Nothing is written unless the whole log is valid.
    """
    path, results = Path(path), Path(results)
    entries = parse_flex_log(_read(path), str(path))
    info = _run(results, run_id, path)
    records = flex_records(entries, info.run_id, str(path), path.stat().st_mtime)
    files, skipped = flex_options(records) if options_out is not None else ({}, {})
    writer = ResultsWriter(results, max_rows=len(records) + 1, max_age_s=math.inf)
    for record in records:
        writer.append(record)
    writer.close()
    num_choices = sum(len(e.choices) for e in entries)
    message = f"imported {num_choices} choices of {len(entries)} entries from {path}"
    done = done_item_ids(results, info.run_id)
    save_run(results, replace(info.with_state("finished", message), num_planned=len(done)))
    return ImportResult(
        run_id=info.run_id,
        num_entries=len(entries),
        num_choices=num_choices,
        rows_written=writer.rows_written,
        num_failed=sum(r.status != "ok" for r in records),
        num_replaced=num_choices - len(records),
        options=write_flex_options(files, skipped, options_out) if options_out is not None else None,
    )
