"""FlexAttention's ahead-of-time packages on disk: where one lives, how it is built, checked and
published, and how it is loaded (``tunectl.tasks._flex`` builds and loads them for the tasks).

A compile process can build a point's FlexAttention call for one kernel-option set into a package under
the compile cache (``TUNECTL_COMPILE_CACHE``), named by the task's compile key and the target (torch
version, device kind and architecture): Dynamo captures the call (block mask as inputs) once, and
Inductor compiles the captured graph into a standalone artifact
(``torch._inductor.standalone_compile``), saved beside a small JSON that names the kernel, the order in
which the graph takes the call's tensors, and the artifact's SHA-256. A worker that finds both loads the
artifact (``CompiledArtifact.load``): no Dynamo tracing, no FX-graph cache lookup, which per config cost
a worker 190-290 ms on an H200 even with Inductor's caches warm. A package is written to temp files
beside its place, checked, and only then renamed into place, its JSON last, so concurrent builders never
leave a half-written or untried one. The first package of a target is checked in a process of its own
(``tunectl.tasks._aot_check``: loaded, run against the reference); where that process dies of a signal
or hangs, loading packages is broken on this target: a marker in the cache turns packages off for the
target, and builds go the torch.compile way. Once one passed there, each later package is loaded and run
by its builder, and must give, bit for bit, what its kernel gave when it was built. (AOTInductor's
packages, the first format, died of a segmentation fault in ``aoti_load_package`` on an H200 with torch
2.11.0+cu130, for any package.) A package that is missing, damaged, fails to load or was built for
another kernel leaves the worker on the torch.compile path, whose output the harness checks as ever.

Both ways compile under ``pinned_options``: Inductor picks no kernel's launch settings by timing it on
the device. By default the first call of a compiled FlexAttention decode call times each candidate
block size of the reductions around the attention kernel and keeps the fastest in the Inductor
cache, a pick made beside whatever else runs on the GPU: on one H100, two fresh caches ran those
reductions with other grids and blocks for each of 9 decode (point, config) pairs, and the same two
pinned ran the same kernels (``benchmarks/gpu/flex_caches.py``; benchmarks/results/throughput.md,
twentieth session). Pinned, a config names one set of kernels in every process and cache: the one a
run measured is the one a confirming or serving process compiles.
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tunectl.core.files import atomic_write, canonical_json, move
from tunectl.tasks.compile import cache_dir

log = logging.getLogger("tunectl.flex")


def pinned_options() -> dict[str, Any]:
    """The Inductor settings a FlexAttention call is compiled under (module doc): its reductions'
    settings chosen by Inductor's deterministic rule where the installed torch has it, its pointwise
    kernels' by their heuristic, none timed on the device."""
    from torch._inductor import config

    options: dict[str, Any] = {"triton.autotune_pointwise": False}
    if hasattr(config, "deterministic"):
        options["deterministic"] = True
    return options


def aot_target(device: str) -> str:
    """What a package is built for besides its kernel: torch's version, the device kind and, for a
    GPU, its architecture (a package runs on the GPUs of the architecture it was built for), and the
    settings it is compiled under (``pinned_options``; packages built before them are not loaded)."""
    import torch

    pinned = ",".join(f"{k}={v}" for k, v in sorted(pinned_options().items()))
    if device.startswith("cuda"):
        major, minor = torch.cuda.get_device_capability(device)
        return f"torch {torch.__version__} cuda {torch.version.cuda} sm_{major}{minor} {pinned}"
    return f"torch {torch.__version__} {torch.device(device).type} {pinned}"


def aot_package(task: str, key: str, device: str) -> Path | None:
    """Where the package of ``task``'s kernel ``key`` (its compile key) for ``device`` lives; None
    outside a run with a compile cache."""
    root = cache_dir()
    if root is None:
        return None
    digest = hashlib.sha256(f"{key}\n{aot_target(device)}".encode()).hexdigest()[:32]
    return root / task / "aot" / f"{digest}.inductor"


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
        with torch._inductor.config.patch(pinned_options()):
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


def why(exc: BaseException) -> str:
    """One short line naming what ``exc`` says."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__
