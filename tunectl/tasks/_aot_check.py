"""Check a FlexAttention package in a process of its own before it is published: it loads, runs on the
point's inputs and matches the task's reference.

A compile process runs this rather than loading the package itself: loading a compiled artifact can
kill the process that does it (on an H200 with torch 2.11+cu130, AOTInductor's ``aoti_load_package``
died of a segmentation fault for every package, a one-line model's too), and a compile process that
dies takes its kernel down with it (``tunectl.orchestrator.compile_schedule``). Here a death is only this
process's.

    python -m tunectl.tasks._aot_check '{"task": ..., "static": ..., "shape": ..., "config": ...,
                                         "path": ..., "key": ..., "device": ...}'

Exit 0: the package is good; 1: it is not (the last line on stderr says why); 2: bad request.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

_FIELDS = ("task", "static", "shape", "config", "path", "key", "device")


def main(argv: list[str]) -> int:
    try:
        request: dict[str, Any] = json.loads(argv[0]) if len(argv) == 1 else {}
    except json.JSONDecodeError as exc:
        print(f"the request is not JSON: {exc}", file=sys.stderr)
        return 2
    missing = [f for f in _FIELDS if f not in request]
    if missing:
        print(
            f"usage: python -m tunectl.tasks._aot_check REQUEST_JSON (missing: {', '.join(missing)})",
            file=sys.stderr,
        )
        return 2
    from tunectl.tasks._flex_packages import why

    try:
        check(request)
    except Exception as exc:
        print(why(exc), file=sys.stderr)
        return 1
    return 0


def check(request: dict[str, Any]) -> None:
    """Raises where the package does not load, run, or match the reference."""
    from tunectl.tasks._flex_packages import load_package
    from tunectl.tasks.base import compare_outputs
    from tunectl.tasks.compile import synchronize
    from tunectl.tasks.registry import get_task

    task: Any = get_task(request["task"])
    static, shape, device = request["static"], request["shape"], request["device"]
    inputs = task.build_inputs(static, shape, device)
    bind = load_package(Path(request["path"]), request["key"], device)
    out = bind(*task.aot_args(static, inputs))()
    synchronize(device)
    atol, rtol = task.tolerance(static)
    err, ok = compare_outputs(out, task.reference(static, shape, inputs), atol, rtol)
    if not ok:
        raise ValueError(f"its output differs from the reference (max abs error {err:.3g})")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
