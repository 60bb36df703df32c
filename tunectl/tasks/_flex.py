"""FlexAttention plumbing shared by the decode and prefill tasks: kernel options, compiled kernels.

FlexAttention is compiled per static shape (``dynamic=False``): a dynamic-shape compile was seen to
run 4.7x slower than the best kernel on an H200 and to collapse at large shapes. Dynamo keeps one
compiled entry per (shape, kernel options); the entries of one point are kept while a worker stays
on that point and dropped when it moves on, so guard checks stay short and the recompile limit is
never what decides which kernel runs.

Ahead-of-time packages. A compile process can build a point's FlexAttention call for one kernel-option
set into a package under the compile cache (``TUNECTL_COMPILE_CACHE``), named by the task's compile
key and the target (torch version, device kind and architecture): Dynamo captures the call (block mask
as inputs) once, and Inductor compiles the captured graph into a standalone artifact
(``torch._inductor.standalone_compile``), saved beside a small JSON that names the kernel, the order in
which the graph takes the call's tensors, and the artifact's SHA-256. A worker that finds both loads
the artifact (``CompiledArtifact.load``): no Dynamo tracing, no FX-graph cache lookup, which per config
cost a worker 190-290 ms on an H200 even with Inductor's caches warm. A package is written to temp files
beside its place, checked, and only then renamed into place, its JSON last, so concurrent builders
never leave a half-written or untried one. The first package of a target is checked in a process of
its own (``tunectl.tasks._aot_check``: loaded, run against the reference); where that process dies of
a signal or hangs, loading packages is broken on this target: a marker in the cache turns packages off
for the target, and builds go the torch.compile way. Once one passed there, each later package is
loaded and run by its builder, and must give, bit for bit, what its kernel gave when it was built.
(AOTInductor's packages, the first format, died of a segmentation fault in ``aoti_load_package`` on
an H200 with torch 2.11.0+cu130, for any package.) A package that is missing, damaged, fails to load
or was built for another kernel leaves the worker on the torch.compile path, whose output the
harness checks as ever. On by default; ``TUNECTL_FLEX_AOT=0`` turns it off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import typing
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tunectl.core.files import atomic_write, canonical_json, move
from tunectl.core.params import Rule
from tunectl.tasks.base import InvalidConfig
from tunectl.tasks.compile import cache_dir, raise_recompile_limits

#: config names passed through to ``flex_attention(kernel_options=...)``, with their types.
KERNEL_OPTIONS: dict[str, type] = {
    "BLOCK_M": int,
    "BLOCK_N": int,
    "num_warps": int,
    "num_stages": int,
    "SPLIT_KV": int,
    "USE_TMA": bool,
    "BACKEND": str,
}
_POW2_OPTIONS = ("BLOCK_M", "BLOCK_N", "num_warps")
#: what a spec may give each option (whether a value suits a point is decided when it is prepared)
KERNEL_OPTION_RULES: dict[str, Rule] = {
    name: Rule.one_of(True, False) if kind is bool else Rule("str") if kind is str else Rule.integer(1)
    for name, kind in KERNEL_OPTIONS.items()
}

_state: dict[str, Any] = {"compiled": None, "point": None, "packages": {}}

#: the switch of ahead-of-time packages (see module doc)
AOT_ENV = "TUNECTL_FLEX_AOT"
_OFF = ("0", "false", "no", "off")
#: how prepares got their kernel in this process: ``loaded`` (a package), ``absent`` (none built),
#: ``failed`` (one that did not load or run), ``unusable`` (packages are off here: ``usable``); all
#: but the first went the torch.compile way
aot_loads: Counter[str] = Counter()
log = logging.getLogger("tunectl.flex")


def available_backends() -> tuple[str, ...]:
    """The values the installed torch accepts for ``kernel_options["BACKEND"]`` (empty if none)."""
    from torch.nn.attention import flex_attention as fa

    alias = getattr(fa, "_Backend", None)
    return tuple(typing.get_args(alias)) if alias is not None else ()


def kernel_options(config: Mapping[str, Any], allowed: tuple[str, ...]) -> dict[str, Any]:
    """The kernel_options a config asks for; InvalidConfig for a name or value flex cannot take."""
    options: dict[str, Any] = {}
    for name, value in config.items():
        if name not in KERNEL_OPTIONS:
            continue
        if name not in allowed:
            raise InvalidConfig(f"kernel option {name} does not apply here")
        kind = KERNEL_OPTIONS[name]
        if type(value) is not kind:
            raise InvalidConfig(f"kernel option {name} must be {kind.__name__}, not {value!r}")
        if isinstance(value, int) and kind is int and value < 1:
            raise InvalidConfig(f"kernel option {name}={value} must be positive")
        if isinstance(value, int) and name in _POW2_OPTIONS and value & (value - 1):
            raise InvalidConfig(f"kernel option {name}={value} must be a power of two")
        options[name] = value
    backend = options.get("BACKEND")
    if backend is not None and backend not in available_backends():
        offered = ", ".join(available_backends()) or "none"
        raise InvalidConfig(f"BACKEND={backend!r} is not offered by the installed torch (offers: {offered})")
    return options


def check_block_sizes(options: Mapping[str, Any], sparse_q: int, sparse_kv: int) -> None:
    """Flex tiles a block mask's blocks: BLOCK_M must divide its Q block and BLOCK_N its KV block."""
    for name, sparse in (("BLOCK_M", sparse_q), ("BLOCK_N", sparse_kv)):
        if name in options and sparse % options[name]:
            raise InvalidConfig(
                f"{name}={options[name]} does not divide the block mask's {sparse}-token blocks"
            )


def flex_for(device: str, point: object, compiled: bool = True) -> Any:
    """``flex_attention``, compiled for ``device`` (or eager where ``compiled`` is False).

    ``point`` names the (task, static, shape) being measured: moving to a new one drops the compiled
    entries of the last one (see module doc).
    """
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    _enter(point)
    if _state["compiled"] is None:
        raise_recompile_limits()
        _state["compiled"] = torch.compile(flex_attention, dynamic=False, fullgraph=True)
    return _state["compiled"]


def _enter(point: object) -> None:
    """Move to ``point``: drop the compiled entries and loaded packages of the last one."""
    if _state["point"] != point:
        import torch

        torch._dynamo.reset()
        _state["packages"] = {}
        _state["point"] = point


def aot_wanted(option: bool | None = None) -> bool:
    """Whether to build and load ahead-of-time packages: ``option`` (the task's) when given, else
    ``$TUNECTL_FLEX_AOT``; on unless that says 0 (or false, no, off)."""
    if option is not None:
        return option
    return os.environ.get(AOT_ENV, "").strip().lower() not in _OFF


def aot_target(device: str) -> str:
    """What a package is built for besides its kernel: torch's version, the device kind and, for a
    GPU, its architecture (a package runs on the GPUs of the architecture it was built for)."""
    import torch

    if device.startswith("cuda"):
        major, minor = torch.cuda.get_device_capability(device)
        return f"torch {torch.__version__} cuda {torch.version.cuda} sm_{major}{minor}"
    return f"torch {torch.__version__} {torch.device(device).type}"


def aot_package(task: str, key: str, device: str) -> Path | None:
    """Where the package of ``task``'s kernel ``key`` (its compile key) for ``device`` lives; None
    outside a run with a compile cache."""
    root = cache_dir()
    if root is None:
        return None
    digest = hashlib.sha256(f"{key}\n{aot_target(device)}".encode()).hexdigest()[:32]
    return root / task / "aot" / f"{digest}.inductor"


def packageable(
    mask_mod_for: Callable[[Any], Any],
    block_size: int | tuple[int, int],
    *,
    enable_gqa: bool,
    options: Mapping[str, Any],
    score_mod: Any = None,
) -> Any:
    """A module whose ``forward(q, k, v, mask_data, blocks)`` is ``flex_attention`` under the block
    mask with ``blocks`` (its kv_num_blocks, kv_indices[, full_kv_num_blocks, full_kv_indices]) of
    ``block_size`` and the mask function ``mask_mod_for(mask_data)``, with ``score_mod`` and kernel
    ``options``: what a package is built from."""
    import torch
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    kernel_options: Any = dict(options) or None

    class FlexCall(torch.nn.Module):
        def forward(self, q: Any, k: Any, v: Any, mask_data: Any, blocks: tuple[Any, ...]) -> Any:
            full = blocks[2:] or (None, None)
            block_mask = BlockMask.from_kv_blocks(
                blocks[0],
                blocks[1],
                full[0],
                full[1],
                BLOCK_SIZE=block_size,
                mask_mod=mask_mod_for(mask_data),
                seq_lengths=(q.shape[2], k.shape[2]),
                compute_q_blocks=False,  # what the backward pass needs, not the forward
            )
            return flex_attention(
                q,
                k,
                v,
                block_mask=block_mask,
                score_mod=score_mod,
                enable_gqa=enable_gqa,
                kernel_options=kernel_options,
            )

    return FlexCall()


def block_tensors(block_mask: Any) -> tuple[Any, ...]:
    """The tensors of ``block_mask`` a package's call takes (``packageable``)."""
    full = (block_mask.full_kv_num_blocks, block_mask.full_kv_indices)
    kv = (block_mask.kv_num_blocks, block_mask.kv_indices)
    return kv if full[0] is None else kv + full


class Unusable(Exception):
    """Loading a package crashed or hung the process that tried: packages are off for this target."""


def build_package(
    module: Any, args: tuple[Any, ...], path: Path, key: str, check: Callable[[Path, Any], None]
) -> None:
    """Capture ``module(*args)`` with Dynamo and compile the graph into the package ``path`` (its
    artifact, and its JSON at ``_meta(path)``), published (renamed into place, the JSON last) only once
    ``check(temp_path, output)`` passed, ``output`` being what the captured call returned. Raises what
    capture, compile or the check raise."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    # Positions by identity, not the tensors: torch keeps the backend below (and what it refers to)
    # for the life of the process, and the call's tensors are the point's inputs (gigabytes).
    positions = {id(x): i for i, x in enumerate(_tensors(args))}
    order: list[int] = []

    def compile_graph(graph: Any, example_inputs: list[Any]) -> Any:
        order[:] = [_position(positions, x) for x in example_inputs]
        artifact = torch._inductor.standalone_compile(
            graph, example_inputs, dynamic_shapes="from_example_inputs"
        )
        artifact.save(path=str(tmp), format="binary")
        return artifact

    try:
        output = torch.compile(module, backend=compile_graph, fullgraph=True, dynamic=False)(*args)
        if not tmp.is_file():
            raise RuntimeError("Dynamo captured no graph to compile")
        meta = {"key": key, "inputs": order, "sha256": _sha256(tmp)}
        atomic_write(_meta(tmp), canonical_json(meta).encode())
        check(tmp, output)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        move(tmp, path)
        move(_meta(tmp), _meta(path))
    finally:
        tmp.unlink(missing_ok=True)
        _meta(tmp).unlink(missing_ok=True)


def build_packaged(
    task: str,
    static: Mapping[str, Any],
    shape: Mapping[str, Any],
    config: Mapping[str, Any],
    key: str | None,
    device: str,
    made: Callable[[], tuple[Any, tuple[Any, ...]]],
    wanted: bool = True,
) -> bool:
    """Build the package of ``task``'s kernel at (static, shape, config), compile key ``key``, where
    packages are ``wanted``, usable on ``device``'s target and a compile cache is set, unless a whole
    one is there already (none without a key); True where a whole package is there after. ``made()``:
    the module to capture and its call's arguments (built only when a package is to be made). A package that
    cannot be made or fails its check is logged and left out (the caller builds for torch.compile);
    a check that crashed or hung turns packages off for the target (``mark_unusable``)."""
    if not wanted or key is None or not usable(task, device):
        return False
    path = aot_package(task, key, device)
    if path is None:
        return False
    if path.is_file() and intact(path):
        return True
    path.unlink(missing_ok=True)  # damaged: built again
    try:
        module, args = made()
        request = {
            "task": task,
            "static": dict(static),
            "shape": dict(shape),
            "config": dict(config),
            "key": key,
            "device": device,
        }

        def check(tmp: Path, output: Any) -> None:
            check_new_package(request, tmp, args, output)

        build_package(module, args, path, key, check)
    except Unusable as exc:
        mark_unusable(task, device, str(exc))
    except Exception as exc:
        log.warning("no package for %s (%s); building for torch.compile", key, why(exc))
    return path.is_file()


def _tensors(args: tuple[Any, ...]) -> list[Any]:
    """The tensors of a call's arguments (tuples opened), in order: what a package's graph takes."""
    return [x for a in args for x in (_tensors(a) if isinstance(a, tuple) else [a])]


def _position(positions: Mapping[int, int], tensor: Any) -> int:
    """Where ``tensor`` is among the call's tensors (``positions``: index by ``id``, taken while the
    call's arguments are alive)."""
    if id(tensor) in positions:
        return positions[id(tensor)]
    raise ValueError("the captured graph takes a tensor that is not among the call's arguments")


def _meta(path: Path) -> Path:
    """A package's JSON: the kernel it was built for, its graph's input order, its artifact's SHA-256."""
    return path.with_name(path.name + ".json")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


#: what checks a package in a process of its own (``tunectl.tasks._aot_check``), and for how long
CHECK_COMMAND = [sys.executable, "-m", "tunectl.tasks._aot_check"]
CHECK_TIMEOUT_S = 300.0


def check_package(request: Mapping[str, Any], timeout_s: float | None = None) -> None:
    """Load and run a package in a new process against the reference (``tunectl.tasks._aot_check``
    says what ``request`` holds). Raises ``Unusable`` where that process died of a signal or hung
    (loading packages is broken here, whichever the kernel), RuntimeError where the package failed."""
    import tunectl

    timeout_s = CHECK_TIMEOUT_S if timeout_s is None else timeout_s
    env = dict(os.environ)
    here = str(Path(tunectl.__file__).resolve().parents[1])  # importable there as it is here
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run(
            [*CHECK_COMMAND, canonical_json(request)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
        )
    except subprocess.TimeoutExpired:
        raise Unusable(f"loading a package did not finish in {timeout_s:g} s") from None
    if done.returncode < 0:
        raise Unusable(f"loading a package killed its process ({signal.Signals(-done.returncode).name})")
    if done.returncode:
        lines = done.stderr.strip().splitlines()
        raise RuntimeError(
            f"the package failed its check: {lines[-1] if lines else f'exit {done.returncode}'}"
        )


def check_new_package(request: Mapping[str, Any], tmp: Path, args: tuple[Any, ...], output: Any) -> None:
    """The check of a new package (at ``tmp``) before it is published. The first on a target, per
    compile cache, is loaded and run in a process of its own against the reference (``check_package``):
    loading may kill the process that does it. Once one passed there, loading is known to work on the
    target, and each later package is loaded and run here, on the build's ``args``; it must give
    ``output``, what the captured call gave when it was built (the same kernel: equal, bit for bit).
    That keeps the slow part (a new interpreter, the reference) off all builds but the first."""
    task, device = request["task"], request["device"]
    if not _marker(task, device, "proven").exists():
        check_package({**request, "path": str(tmp)})
        atomic_write(_marker(task, device, "proven"), f"{aot_target(device)}\n".encode(), make_parents=True)
        return
    import torch

    out = load_package(tmp, request["key"], device)(*args)()
    if not torch.equal(out, output):
        raise RuntimeError("the package's output differs from the kernel it was built from")


def usable(task: str, device: str) -> bool:
    """False once loading a package has crashed or hung here (``mark_unusable``), for this target."""
    return cache_dir() is None or not _marker(task, device, "unusable").exists()


def mark_unusable(task: str, device: str, reason: str) -> None:
    """Packages are off for ``task`` on this target, in this compile cache, from now on: every later
    build compiles for torch.compile only, and workers load none."""
    if cache_dir() is not None:
        atomic_write(
            _marker(task, device, "unusable"), f"{aot_target(device)}: {reason}\n".encode(), make_parents=True
        )
    log.warning("FlexAttention packages are off for %s on %s: %s", task, aot_target(device), reason)


def _marker(task: str, device: str, kind: str) -> Path:
    """What the compile cache knows of packages on this target: ``unusable`` or ``proven``."""
    root = cache_dir()
    assert root is not None, "packages live in a compile cache"
    digest = hashlib.sha256(aot_target(device).encode()).hexdigest()[:16]
    return root / task / "aot" / f"{kind}-{digest}.txt"


def intact(path: Path) -> bool:
    """Whether ``path`` is a whole package: its JSON is there and names the artifact's checksum."""
    try:
        meta = json.loads(_meta(path).read_text())
        return bool(meta.get("sha256") == _sha256(path))
    except (OSError, ValueError, AttributeError):
        return False


def load_package(path: Path, key: str, device: str) -> Callable[..., Callable[[], Any]]:
    """The compiled call in the package ``path``: given the call's arguments (as the module built took
    them), the call on them. Raises if it cannot be loaded, is damaged, or was built for another kernel
    than ``key``."""
    import torch

    meta = json.loads(_meta(path).read_text())
    if meta.get("key") != key:
        raise ValueError(f"{path.name} was built for another kernel ({str(meta.get('key'))[:80]!r})")
    if meta.get("sha256") != _sha256(path):
        raise ValueError(f"{path.name} is damaged (its checksum differs from its JSON's)")
    artifact = torch._inductor.CompiledArtifact.load(path=str(path), format="binary")
    order = [int(i) for i in meta["inputs"]]

    def bind(*args: Any) -> Callable[[], Any]:
        flat = _tensors(args)
        inputs = [flat[i] for i in order]

        def call() -> Any:
            [out] = artifact(*inputs)
            return out

        return call

    return bind


def packaged(
    task: str, key: str, device: str, point: object, args: tuple[Any, ...]
) -> Callable[[], Any] | None:
    """The call of ``task``'s kernel ``key`` from its package, run once here; None where there is no
    package or it does not load or run (the caller compiles instead). Packages stay loaded while the
    worker stays on ``point``."""
    path = aot_package(task, key, device)
    if path is None or not path.is_file():
        aot_loads["absent"] += 1
        return None
    if not usable(task, device):
        aot_loads["unusable"] += 1
        return None
    _enter(point)
    try:
        bind = _state["packages"].get(path) or load_package(path, key, device)
        call = bind(*args)
        call()
    except Exception as exc:
        aot_loads["failed"] += 1
        log.warning("package %s did not load (%s); compiling instead", path, why(exc))
        return None
    _state["packages"][path] = bind
    aot_loads["loaded"] += 1
    return call


def why(exc: BaseException) -> str:
    """One short line naming what ``exc`` says."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
