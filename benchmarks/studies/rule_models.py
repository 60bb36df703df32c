"""Split rules' wave model with and without a term for the reads, scored on the tuning rows themselves.

For each kernel family of a tuning run (a config with its split count left open, at one static key)
and each shape where two split counts or more were timed, the family's rule is fitted to every other
shape's rows (``tunectl.decide.rules.fit_rule``: leave one shape out), and the count it would run
there among the counts timed there is scored against the fastest of them. "without" holds the work
term (``per_work``, the cost of the KV a call reads, the same at every split count) at zero, as the
fit did before it had one. No GPU: the rows are the recorded runs'.

    tar xzf benchmarks/results/holdout_h200_2026-12-04.tar.gz -C /tmp   # and the b, c archives
    PYTHONPATH=. python benchmarks/studies/rule_models.py --results /tmp/holdout-results \
        --run r20261204-031233-40eb19 --run r20261204-030703-b25d80
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from unittest import mock

import tunectl.decide.rules as rules
from tunectl.core.plan import RunFacts
from tunectl.decide.probes import point_timings
from tunectl.decide.rules import Sample, fit_rule
from tunectl.store.results import read_results

MIN_ROWS = 80  # families fitted from fewer rows are left out (a handful of counts at a few shapes)


_WITH_WORK = rules._features  # the fit's features; the last is the work term


def _without_work(across: int, along: int, splits: int, per_wave: float, block: int) -> tuple[float, ...]:
    """The fit's features with the work term held at zero (the fit as it was before it had one)."""
    return (*_WITH_WORK(across, along, splits, per_wave, block)[:-1], 0.0)


def regrets(samples: Sequence[Sample], param: str, dims: tuple[str, str]) -> list[float]:
    """Per shape with two timed counts or more: the time of the count the rule fitted without that
    shape runs there, over the fastest count timed there."""
    by_shape: dict[tuple[int, int], dict[int, float]] = {}
    for a, n, s, t in samples:
        by_shape.setdefault((a, n), {})[s] = t
    out = []
    for (a, n), times in sorted(by_shape.items()):
        if len(times) < 2:
            continue
        rule = fit_rule([x for x in samples if (x[0], x[1]) != (a, n)], param, *dims)
        if rule is None:
            continue
        pick = min(times, key=lambda s: (rule.predict_us(a, n, s), s))
        out.append(times[pick] / min(times.values()))
    return out


def summary(values: Sequence[float]) -> str:
    geomean = math.exp(statistics.fmean(math.log(v) for v in values))
    worse = sum(v > 1.03 for v in values)
    return f"{geomean:.4f} | {max(values):.3f} | {worse} of {len(values)}"


def study(results: Path, run: str, out: Callable[[str], None]) -> None:
    facts = RunFacts.from_json(json.loads((results / "_runs" / f"{run}.json").read_text())["facts"])
    timings = point_timings(read_results(results, [run]), lambda *_: True)
    for (_, key, base, param), samples in rules._samples(timings, facts).items():
        if len(samples) < MIN_ROWS:
            continue
        dims = (facts.wave_dims[0], facts.wave_dims[1])
        with_work = regrets(samples, param, dims)
        with mock.patch.object(rules, "_features", _without_work):
            without = regrets(samples, param, dims)
        if not with_work or not without:
            continue
        family = json.dumps(dict(base), sort_keys=True)
        page = dict(key).get("page_size")
        out(f"| {run} page {page} | `{family}` | {summary(without)} | {summary(with_work)} |")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--run", action="append", required=True, help="a tuning run (repeatable)")
    args = parser.parse_args(argv)
    print(
        "| run | family | without: geomean | worst | over 3 % | with the work term: geomean | worst"
        " | over 3 % |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for run in args.run:
        study(args.results, run, lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
