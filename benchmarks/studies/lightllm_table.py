"""What each level of decode tuning is worth: LightLLM's choice, FA3's full search, every backend.

    PYTHONPATH=. python benchmarks/studies/lightllm_table.py --results RESULTS --grid RUN [--grid RUN ...] \
        [--holdout RUN ...] [--out benchmarks/results/lightllm.md]

Three choices per shape, all timed in the same runs on the same GPU:

(a) LightLLM's: flash-attn 3 with the fastest of ``num_splits`` {0, 16, 32} (``pack_gqa`` left to
    the library) at each tuned point, as LightLLM's autotuner picks it; at an untuned shape, the
    choice of the tuned point whose packed run key (batch * 10**13 + q_len * 10**7 + pages) is
    nearest, as LightLLM's loader falls back.
(b) flash-attn 3 with tunectl's search over every fa3 config of the spec (num_splits x pack_gqa):
    the fastest at each tuned point; at an untuned shape, the spec's bucket rule picks the point.
(c) tunectl over every backend: the winner ``tunectl export bundle`` publishes (finals, noise
    rule); at an untuned shape, the same bucket rule.

Grid runs give the tuned points; holdout runs (``tunectl validate --holdout``, or any run measuring
configs at shapes that were not tuned) give each choice's time where it was not tuned, and the
oracle there (the fastest config measured at that shape). Ratios are times over (c)'s.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.studies.h200_archive import require
from benchmarks.studies.holdout_json import size_of
from tunectl.core.buckets import make_bucketer
from tunectl.core.keys import key_dict, key_from_text, key_text
from tunectl.core.record import Record
from tunectl.formats.export import facts_of, winners_in
from tunectl.store.results import read_results

LIGHTLLM_SPLITS = (0, 16, 32)
Config = str  # a config key's text
Times = dict[Config, float]  # median µs of every ok config measured at one shape


@dataclass(frozen=True)
class Shape:
    static: str
    batch: int
    kv_len: int
    q_len: int


def is_lightllm(config: Mapping[str, Any]) -> bool:
    """A config LightLLM's tuner would try: fa3, library-chosen pack_gqa, a split in its set."""
    return (
        config.get("backend") == "fa3"
        and "pack_gqa" not in config
        and int(config.get("num_splits", 0)) in LIGHTLLM_SPLITS
    )


def is_fa3(config: Mapping[str, Any]) -> bool:
    return config.get("backend") == "fa3"


def run_key(shape: Shape, page_size: int) -> int:
    return shape.batch * 10**13 + shape.q_len * 10**7 + -(-shape.kv_len // page_size)


def times_by_shape(records: Iterable[Record]) -> dict[Shape, tuple[Times, dict[Config, Mapping[str, Any]]]]:
    """Each config's time at each shape: its fullest single measurement (a successive-halving screen
    only where the config was not measured in full; a final's arm only where nothing else was)."""
    out: dict[Shape, tuple[Times, dict[Config, Mapping[str, Any]]]] = defaultdict(lambda: ({}, {}))
    rank: dict[tuple[Shape, Config], tuple[int, int]] = {}
    for r in records:
        if not r.ok or r.median_us is None or r.phase.value not in _FIDELITY:
            continue
        s = key_dict(r.shape)
        shape = Shape(r.static_key, size_of(s["batch"]), size_of(s["kv_len"]), size_of(s.get("q_len", 1)))
        times, configs = out[shape]
        fidelity = (_FIDELITY[r.phase.value], r.num_samples or 0)
        if fidelity > rank.get((shape, r.config_key), (-1, -1)):
            rank[(shape, r.config_key)] = fidelity
            times[r.config_key] = r.median_us
            configs[r.config_key] = key_dict(r.config)
    return dict(out)


_FIDELITY = {"final": 0, "screen": 1, "holdout": 2, "measure": 2}


def fastest(
    times: Times, configs: Mapping[Config, Mapping[str, Any]], keep: Callable[..., bool]
) -> Config | None:
    kept = [c for c in times if keep(configs[c])]
    return min(kept, key=lambda c: (times[c], c)) if kept else None


def choices_at_grid(
    grid: Mapping[Shape, tuple[Times, dict[Config, Mapping[str, Any]]]], published: Mapping[Shape, Config]
) -> dict[Shape, dict[str, Config | None]]:
    return {
        shape: {
            "a": fastest(times, configs, is_lightllm),
            "b": fastest(times, configs, is_fa3),
            "c": published.get(shape),
            "oracle": fastest(times, configs, lambda c: True),
        }
        for shape, (times, configs) in grid.items()
    }


def nearest_run_key(shape: Shape, tuned: Sequence[Shape], page_size: int) -> Shape:
    same = [t for t in tuned if t.static == shape.static]
    key = run_key(shape, page_size)
    return min(same, key=lambda t: (abs(run_key(t, page_size) - key), run_key(t, page_size)))


def bucketed(shape: Shape, tuned: Sequence[Shape], policies: Mapping[str, str]) -> Shape | None:
    same = [t for t in tuned if t.static == shape.static and t.q_len == shape.q_len]
    batch = make_bucketer(policies.get("batch", "ceil"), sorted({t.batch for t in same}))(shape.batch)
    kv = make_bucketer(policies.get("kv_len", "ceil"), sorted({t.kv_len for t in same if t.batch == batch}))(
        shape.kv_len
    )
    hit = [t for t in same if t.batch == batch and t.kv_len == kv]
    return hit[0] if hit else None


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def table(rows: list[tuple[Shape, dict[str, float | None]]], title: str) -> list[str]:
    lines = [
        f"### {title}",
        "",
        "| page | batch x kv_len | (a) LightLLM µs | (b) FA3 searched µs | (c) tunectl µs | oracle µs | "
        "(a)/(c) | (b)/(c) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = defaultdict(list)
    for shape, t in sorted(rows, key=lambda x: (x[0].static, x[0].batch, x[0].kv_len)):
        c = t["c"]
        cells = []
        for name in ("a", "b"):
            if t[name] is not None and c:
                ratios[name].append(t[name] / c)  # type: ignore[operator]
                cells.append(f"{t[name] / c:.2f}x")  # type: ignore[operator]
            else:
                cells.append("—")
        if t["oracle"] and c:
            ratios["oracle"].append(c / t["oracle"])
        page = key_dict_from(shape.static)["page_size"]
        lines.append(
            f"| {page} | {shape.batch} x {shape.kv_len} | {_us(t['a'])} | {_us(t['b'])} | {_us(c)} | "
            f"{_us(t['oracle'])} | {cells[0]} | {cells[1]} |"
        )
    lines += [
        "",
        f"Geometric means over the {len(ratios['a'])} of {len(rows)} shapes with all three times: "
        f"(a)/(c) **{geomean(ratios['a']):.2f}x**, "
        f"(b)/(c) **{geomean(ratios['b']):.2f}x**; (c) over the oracle {geomean(ratios['oracle']):.3f}x.",
        "",
    ]
    return lines


def key_dict_from(static_text: str) -> dict[str, Any]:
    return key_dict(key_from_text(static_text))


def _us(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def render(results: Path, grid_runs: list[str], holdout_runs: list[str]) -> str:
    grid_records = read_results(results, grid_runs, task="flash_decode")
    grid = times_by_shape(grid_records)
    published: dict[Shape, Config] = {}
    for w in winners_in(results, grid_runs, task="flash_decode"):
        s = key_dict(w.shape)
        published[
            Shape(key_text(w.static), size_of(s["batch"]), size_of(s["kv_len"]), size_of(s.get("q_len", 1)))
        ] = key_text(w.config)
    at_grid = choices_at_grid(grid, published)

    def timed(times: Times, choice: Config | None) -> float | None:
        return times.get(choice) if choice is not None else None

    rows = [(s, {k: timed(grid[s][0], v) for k, v in ch.items()}) for s, ch in at_grid.items()]
    out = ["## At the tuned points", "", *table(rows, f"grid runs {', '.join(grid_runs)}")]
    if holdout_runs:
        facts = facts_of(results, grid_runs)
        policies = {dim: policy for f in facts.values() for dim, policy in f.buckets}
        tuned = list(grid)
        held = times_by_shape(read_results(results, holdout_runs, task="flash_decode"))
        hrows = []
        for shape, (times, configs) in held.items():
            page = key_dict_from(shape.static)["page_size"]
            near = at_grid.get(nearest_run_key(shape, tuned, page), {})
            bucket = bucketed(shape, tuned, policies)
            pick = at_grid.get(bucket, {}) if bucket else {}
            hrows.append(
                (
                    shape,
                    {
                        "a": timed(times, near.get("a")),
                        "b": timed(times, pick.get("b")),
                        "c": timed(times, pick.get("c")),
                        "oracle": times[fastest(times, configs, lambda c: True)] if times else None,  # type: ignore[index]
                    },
                )
            )
        out += ["## At held-out shapes", "", *table(hrows, f"holdout runs {', '.join(holdout_runs)}")]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--grid", action="append", required=True, help="run id of a tuning grid run")
    parser.add_argument("--holdout", action="append", default=[], help="run id measuring untuned shapes")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    require(args.results)
    intro = __doc__.split("\n\n", 2)[2]
    text = f"# LightLLM's choice, FA3 searched, and every backend, on one H200\n\n{intro}"
    text += "\n" + render(args.results, args.grid, args.holdout)
    if args.out is None:
        print(text)
    else:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
