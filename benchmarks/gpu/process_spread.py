"""Does a config's time depend on the process that times it? The same configs at the same shapes, timed
in several fresh processes and, inside each, on several fresh sets of inputs.

Two runs of one spec on one H200 read the ratio of two configs at a point differently: in the recorded
finals, median 0.8 % apart at batch 1-8 (p90 4.8 %) against 95 % intervals about 0.9 % wide
(``benchmarks/results/throughput.md``); confirming at start-up and a held-out run disagreed by 5-9 %
on flex and fa4 at batch 1-7 (``holdout.md``). This tells the kinds of variation apart: each child
process times every config at every shape ``--inputs`` times, each on inputs of its own (the ones
before kept alive, so the new ones take other memory), in interleaved rounds as start-up confirming
does (``tunectl.measure.side_by_side.time_configs``), timed as the spec measures (L2, timing method, mode).
The parent sets, per shape and config, the spread across inputs inside a process against the spread
across processes:

- both small: the variation is in the timing, and a longer measurement would shrink it;
- across processes only: something each process fixes once (a JIT's or an autotuner's choice, the
  library's plan, clocks at start-up); a serving process's own start-up timing is then the one that
  tells what it will get, and a held-out run in another process cannot judge it;
- across inputs too: where the inputs land in memory; more input sets per measurement would average it.

    python benchmarks/gpu/process_spread.py --spec configs/h200/flash_decode.toml --static page_size=128 \\
        --shape batch=2,kv_len=1664,q_len=1 --shape batch=1,kv_len=16768,q_len=1 --processes 4 --inputs 3 \\
        --out /tmp/spread.json
    python benchmarks/gpu/process_spread.py --spec configs/quickstart.toml --device cpu ...   (a CPU check)

``--config`` (repeatable, JSON) names the configs; default: each backend's first config in the spec.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One process: every config at every shape, ``--inputs`` times on fresh inputs (module doc)."""
    import dataclasses

    from tunectl.core.keys import key_dict
    from tunectl.core.plan import plan
    from tunectl.core.registry import get_task
    from tunectl.core.spec import load_spec
    from tunectl.measure.side_by_side import DEFAULT_SETTINGS, time_configs

    spec = load_spec(args.spec)
    task = get_task(spec.task)
    wanted = dict(_pairs(args.static))
    static, configs = next(
        (key_dict(s), [key_dict(c) for c in cs])
        for s, cs in plan(spec).configs
        if all(str(key_dict(s).get(k)) == v for k, v in wanted.items())
    )
    chosen = [json.loads(c) for c in args.config] or _first_per_backend(configs)
    settings = dataclasses.replace(DEFAULT_SETTINGS, l2=spec.measure.l2, timing=spec.measure.timing)
    mode = str(spec.measure.mode) if args.device.startswith("cuda") else "eager"
    kept: list[Any] = []  # earlier inputs stay alive: each set of inputs takes memory of its own
    out: dict[str, Any] = {"configs": chosen, "shapes": {}}
    for text in args.shape:
        shape = {k: int(v) for k, v in _pairs(text)}
        runs = []
        for _ in range(args.inputs):
            kept.append(task.build_inputs(static, shape, args.device))
            runs.append(
                time_configs(task, static, shape, chosen, device=args.device, mode=mode, settings=settings)
            )
        out["shapes"][text] = runs
    return out


def _pairs(text: str) -> list[tuple[str, str]]:
    return [tuple(p.split("=", 1)) for p in text.split(",") if p]  # type: ignore[misc]


def _first_per_backend(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: dict[Any, dict[str, Any]] = {}
    for c in configs:
        seen.setdefault(c.get("backend"), c)
    return list(seen.values())


def spread(children: list[dict[str, Any]]) -> dict[str, Any]:
    """Per shape and config: the largest over the smallest time inside each process (across inputs),
    their median over processes, and the largest over the smallest of the processes' medians."""
    configs = children[0]["configs"]
    table: dict[str, Any] = {}
    for shape in children[0]["shapes"]:
        rows: dict[str, dict[str, Any] | None] = {}
        for j, config in enumerate(configs):
            per_process = [[run[j] for run in c["shapes"][shape] if run[j] is not None] for c in children]
            per_process = [times for times in per_process if times]
            if not per_process:
                rows[json.dumps(config, sort_keys=True)] = None
                continue
            inside = [max(t) / min(t) for t in per_process]
            medians = [statistics.median(t) for t in per_process]
            rows[json.dumps(config, sort_keys=True)] = {
                "median_us": round(statistics.median(medians), 2),
                "across_inputs": round(statistics.median(inside), 4),
                "across_processes": round(max(medians) / min(medians), 4),
                "processes": [[round(x, 2) for x in t] for t in per_process],
            }
        table[shape] = rows
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", required=True)
    parser.add_argument("--static", default="", help="k=v,...: which of the spec's static keys")
    parser.add_argument("--shape", action="append", required=True, help="k=v,...: a shape (repeatable)")
    parser.add_argument("--config", action="append", default=[], help="a config as JSON (repeatable)")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--inputs", type=int, default=3, help="fresh input sets per process")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # one process's part, written here
    args = parser.parse_args()
    if args.child:
        args.child.write_text(json.dumps(child(args)))
        return
    children = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.processes):
            part = Path(tmp) / f"{n}.json"
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", str(part)], check=True)
            children.append(json.loads(part.read_text()))
    table = spread(children)
    figures = {"argv": sys.argv[1:], "spread": table}
    for shape, rows in table.items():
        for config, row in rows.items():
            if row is not None:
                print(
                    f"{shape} {config}: {row['median_us']} µs; inside a process x{row['across_inputs']}, "
                    f"across processes x{row['across_processes']}"
                )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    worst = max(
        (r["across_processes"] for rows in table.values() for r in rows.values() if r),
        default=math.nan,
    )
    print(f"largest spread across processes: x{worst}")


if __name__ == "__main__":
    main()
