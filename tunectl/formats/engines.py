"""Bundles exported in layouts serving engines already read.

**FlexAttention kernel_options** (``export_flex_options``): one JSON object per tuned point, exactly
what ``flex_attention(..., kernel_options=json.load(f))`` takes, written as attention-gym's replay
writes the options it extracts: the forward kernel's tunables prefixed ``fwd_`` (``fwd_BLOCK_M``,
``fwd_num_warps``, ...), the call options Flex reads before choosing a kernel (``BACKEND``) bare (see
``tunectl.runtime.adapters``). ``index.json`` lists every point with its static and shape keys, the bucket
policies, the options themselves and the medians, so one file answers a lookup too::

    <out>/index.json
    <out>/<task>/<static k=v,...>__<shape k=v,...>.json        {"fwd_BLOCK_M": 64, ...}

Entries of ``flash_decode`` go there only where the winner is the ``flex`` backend.

**LightLLM autotune configs** (``export_lightllm``) for the ``flash_attn_with_kvcache`` decode
kernel that LightLLM tunes as ``sgl_fa3_kvcache_ns:v1`` (sgl-kernel's FA3 build; ``num_splits``)::

    <out>/triton_<triton version>/<device, spaces as _>/<kernel name>/{<static key>}_<device>.json
        {"<run key>": {"num_splits": 16}, ...}

The static key is LightLLM's (``qd``/``kd``/``vd`` dtypes as ``torch.<dtype>``, ``qh``/``kh`` heads,
``hd``/``vh`` head dims, ``pb`` page size, ``c`` causal, ``wl``/``wr`` window, ``sc`` softcap on, ``sk``
sinks on, the descale flags, ``sgl`` the sgl-kernel version), written into the file name as LightLLM
does: sorted JSON without spaces or quotes, ``:`` as ``=``. The run key packs one integer,
``batch * 10**13 + max_q_len * 10**7 + pages per sequence``; LightLLM takes the exact run key, or
else the stored one nearest by absolute difference. tunectl's keys never pack (packing collides), so
the export refuses a point whose fields overflow their digits. Only points whose winner is a backend
that call can run (``sgl`` by default) can be written; the rest are counted and left out, and
LightLLM falls back to its nearest run key there: tune with that backend alone for a full table.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunectl.core.errors import UserError
from tunectl.core.files import atomic_write, canonical_json, json_bytes
from tunectl.core.keys import key_json
from tunectl.runtime import Bundle
from tunectl.runtime.adapters import flex_kernel_options

FLEX_FORMAT = "tunectl.flex_kernel_options"
FLEX_FORMAT_VERSION = 1
FLEX_TASKS = ("flex_prefill", "flash_decode")
LIGHTLLM_KERNEL = "sgl_fa3_kvcache_ns:v1"
_RUN_KEY_BATCH, _RUN_KEY_Q = 10**13, 10**7  # LightLLM's packing: batch | max_q_len | max_kv_len


@dataclass
class FormatExport:
    """What an export wrote, and what it left out and why."""

    out: Path
    files: list[Path] = field(default_factory=list)
    num_entries: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count


def _text(value: Any) -> str:
    if isinstance(value, list):
        return "_".join(map(_text, value))
    return canonical_json(value) if isinstance(value, bool) or value is None else str(value)


def _point_file(static: Mapping[str, Any], shape: Mapping[str, Any]) -> str:
    """A readable, filesystem-safe name for one point (a digest where it would be too long)."""
    desc = "__".join(",".join(f"{k}={_text(v)}" for k, v in sorted(part.items())) for part in (static, shape))
    desc = re.sub(r"[^A-Za-z0-9=,._-]", "-", desc)
    return f"{desc}.json" if len(desc) <= 200 else f"{hashlib.sha256(desc.encode()).hexdigest()[:24]}.json"


def _dump(obj: Any) -> bytes:
    return json_bytes(obj, indent=2)


def export_flex_options(bundle: Bundle, out: str | Path, tasks: Sequence[str] | None = None) -> FormatExport:
    """Write the bundle's FlexAttention winners as kernel_options files and an index."""
    out = Path(out)
    chosen = [t for t in (tasks or FLEX_TASKS) if t in bundle.tasks]
    if tasks and len(chosen) != len(tasks):
        raise UserError(
            f"bundle {bundle.name}/{bundle.version} has no task {sorted(set(tasks) - set(chosen))}"
        )
    result = FormatExport(out)
    index: dict[str, Any] = {}
    for task in chosen:
        listed = _write_flex_task(bundle, task, result)
        index[task] = {**bundle.task_info(task), "entries": listed}
        result.num_entries += len(listed)
    env = bundle.manifest.get("environment", {})
    doc = {
        "format": FLEX_FORMAT,
        "format_version": FLEX_FORMAT_VERSION,
        "bundle": {"name": bundle.name, "version": bundle.version},
        "device_name": env.get("device_name"),
        "packages": {k: v for k, v in (env.get("packages") or {}).items() if k in ("torch", "triton")},
        "tasks": index,
    }
    # last: the index names only files already written
    atomic_write(out / "index.json", _dump(doc), make_parents=True)
    result.files.append(out / "index.json")
    return result


def _write_flex_task(bundle: Bundle, task: str, result: FormatExport) -> list[dict[str, Any]]:
    """Write one task's kernel_options files under ``result.out``; its index entries."""
    listed = []
    for entry in bundle.entries(task):
        config = key_json(entry.config)
        if task == "flash_decode" and config.get("backend") != "flex":
            key = f"winner is backend {config.get('backend')}, not flex"
            result.skipped[key] = result.skipped.get(key, 0) + 1
            continue
        options = flex_kernel_options(config)
        static, shape = key_json(entry.static), key_json(entry.shape)
        rel = f"{task}/{_point_file(static, shape)}"
        atomic_write(result.out / rel, _dump(options), make_parents=True)
        result.files.append(result.out / rel)
        stats = {
            "median_us": entry.median_us,
            "default_median_us": entry.default_median_us,
            "speedup": entry.speedup,
            "is_default": entry.is_default,
        }
        listed.append({"static": static, "shape": shape, "file": rel, "kernel_options": options, **stats})
    return listed


def lightllm_device_name(device_name: str) -> str:
    """The device directory and file suffix LightLLM derives from torch's device name."""
    if "4090" in device_name and "4090 D" not in device_name:  # LightLLM files a 4090 as a 4090 D
        device_name = device_name.replace("4090", "4090 D")
    return device_name.replace(" ", "_")


def lightllm_file_name(static_key: Mapping[str, Any], device: str) -> str:
    """LightLLM's file name for a static key: sorted JSON, no spaces or quotes, ':' as '='."""
    text = canonical_json(dict(static_key))
    text = text.replace(" ", "").replace("\n", "").replace('"', "").replace(":", "=")
    return f"{text}_{device}.json"


def lightllm_static_key(static: Mapping[str, Any], sgl_version: str) -> dict[str, Any]:
    """LightLLM's ``flash_attn_with_kvcache`` static key for a ``flash_decode`` static key."""
    dtype = f"torch.{static['dtype']}"
    left, right = static.get("window") or (-1, -1)
    return {
        "qd": dtype,
        "kd": dtype,
        "vd": dtype,
        "qh": int(static["num_q_heads"]),
        "kh": int(static["num_kv_heads"]),
        "hd": int(static["head_dim"]),
        "vh": int(static["head_dim"]),
        "pb": int(static["page_size"]),
        "c": int(bool(static.get("causal", True))),
        "wl": int(left),
        "wr": int(right),
        "sc": int(float(static.get("softcap") or 0.0) > 0.0),
        "sk": int(bool(static.get("sinks"))),
        "has_k_descale": False,
        "has_v_descale": False,
        "sgl": sgl_version,
    }


def lightllm_run_key(batch: int, q_len: int, kv_len: int, page_size: int) -> int:
    """LightLLM's packed run key; UserError where a field would spill into the next one."""
    pages = math.ceil(kv_len / page_size)
    if not (0 < q_len < _RUN_KEY_BATCH // _RUN_KEY_Q and 0 < pages < _RUN_KEY_Q and batch > 0):
        raise UserError(
            f"batch={batch}, q_len={q_len}, pages={pages} overflow LightLLM's packed run key (would collide)"
        )
    return batch * _RUN_KEY_BATCH + q_len * _RUN_KEY_Q + pages


def _version(bundle: Bundle, package: str, given: str | None, what: str) -> str:
    found = given or (bundle.manifest.get("environment", {}).get("packages") or {}).get(package)
    if not found:
        raise UserError(f"bundle {bundle.name}/{bundle.version} records no {package} version: pass {what}")
    return str(found)


def export_lightllm(
    bundle: Bundle,
    out: str | Path,
    task: str = "flash_decode",
    *,
    kernel_name: str = LIGHTLLM_KERNEL,
    backends: Iterable[str] = ("sgl",),
    triton_version: str | None = None,
    sgl_version: str | None = None,
) -> FormatExport:
    """Write ``task``'s winners on ``backends`` as LightLLM autotune config files under ``out``."""
    if task not in bundle.tasks:
        raise UserError(f"bundle {bundle.name}/{bundle.version} has no task {task!r}")
    device_name = bundle.manifest.get("environment", {}).get("device_name")
    if not device_name:
        raise UserError(f"bundle {bundle.name}/{bundle.version} records no device name")
    device = lightllm_device_name(device_name)
    triton = _version(bundle, "triton", triton_version, "--triton-version")
    sgl = (
        sgl_version
        or (bundle.manifest.get("environment", {}).get("packages") or {}).get("sgl-kernel")
        or "unknown"
    )
    root = Path(out) / f"triton_{triton}" / device / kernel_name
    result = FormatExport(Path(out))
    tables: dict[str, dict[str, dict[str, int]]] = {}
    wanted = set(backends)
    for entry in bundle.entries(task):
        static, shape, config = key_json(entry.static), key_json(entry.shape), key_json(entry.config)
        if config.get("backend", "sgl") not in wanted:
            key = f"winner is backend {config.get('backend')}, not {'/'.join(sorted(wanted))}"
            result.skipped[key] = result.skipped.get(key, 0) + 1
            continue
        name = lightllm_file_name(lightllm_static_key(static, sgl), device)
        run_key = lightllm_run_key(
            shape["batch"], shape.get("q_len", 1), shape["kv_len"], static["page_size"]
        )
        tables.setdefault(name, {})[str(run_key)] = {"num_splits": int(config.get("num_splits", 0))}
        result.num_entries += 1
    for name, table in sorted(tables.items()):
        atomic_write(root / name, _dump(table), make_parents=True)
        result.files.append(root / name)
    return result
