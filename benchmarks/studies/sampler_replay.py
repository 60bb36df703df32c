"""Could a maintained library's sampler replace successive halving? Optuna's TPE and GP samplers, replayed.

Each point of an exhaustive (grid) run is searched on its own by an Optuna study over one categorical
parameter, the point's candidate configs (the default and the configs that may win there), with the
recorded medians as the device's answers: the default first, then what the sampler asks, until
``budget`` of the point's configs are measured. The pick is the fastest config measured, which is an
upper bound on what finals over those configs could choose. A point is *found* when the pick is within
1 % of the grid's best there, as in ``search_cost.py``, whose replay gives successive halving's numbers
on the same runs.

    pip install optuna scipy   # not tunectl's dependencies: this script only
    python benchmarks/studies/sampler_replay.py --results RESULTS --run GRID_RUN [--budget 0.2 --budget 0.3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tunectl.core.keys import key_from_text
from tunectl.core.record import Record
from tunectl.store.results import read_results
from tunectl.store.runs import load_run, run_facts

Configs = Mapping[str, Record]  # config key text -> its grid row


def candidates(results: str, run_id: str) -> dict[tuple[str, str], dict[str, Record]]:
    """Per (static, shape) point of the run: the default's and the selectable configs' rows."""
    facts = run_facts(load_run(results, run_id))
    points: dict[tuple[str, str], dict[str, Record]] = {}
    for r in read_results(results, run_ids=[run_id]):
        static = key_from_text(r.static_key)
        if r.phase == "measure" and (
            r.is_default or facts is None or facts.selectable(static, key_from_text(r.config_key))
        ):
            points.setdefault((r.static_key, r.shape_key), {})[r.config_key] = r
    return points


def _time(row: Record) -> float:
    return float(row.median_us) if row.status == "ok" and row.median_us is not None else math.inf


def search_point(configs: Configs, sampler: Any, budget: float) -> tuple[str, int]:
    """The fastest config the sampler measured at one point, and how many it measured."""
    import optuna

    names = sorted(configs)
    default = next(c for c in names if configs[c].is_default)
    space: dict[str, optuna.distributions.BaseDistribution] = {
        "config": optuna.distributions.CategoricalDistribution(names)
    }
    wanted = min(len(names), max(1, math.ceil(budget * len(names))))
    study = optuna.create_study(sampler=sampler)
    study.enqueue_trial({"config": default})
    seen: dict[str, float] = {}
    while len(seen) < wanted and len(study.trials) < 20 * len(names):  # a sampler may repeat itself
        trial = study.ask(space)
        config = trial.params["config"]
        if config not in seen:
            t = _time(configs[config])
            seen[config] = math.log(t / _time(configs[default])) if math.isfinite(t) else 1.0
        study.tell(trial, seen[config])
    return min(seen, key=lambda c: _time(configs[c])), len(seen)


def replay(
    points: Mapping[tuple[str, str], Configs], name: str, budget: float, seed: int
) -> tuple[int, int, float]:
    """Points found, configs measured and the geometric-mean quality (grid best / pick) of one replay."""
    import optuna

    found, measured, logs = 0, 0, []
    for _, configs in sorted(points.items()):
        sampler = (
            optuna.samplers.TPESampler(seed=seed, n_startup_trials=1)
            if name == "TPE"
            else optuna.samplers.GPSampler(seed=seed, n_startup_trials=1)
        )
        pick, n = search_point(configs, sampler, budget)
        quality = min(map(_time, configs.values())) / _time(configs[pick])
        found += quality >= 0.99
        measured += n
        logs.append(math.log(quality))
    return found, measured, math.exp(statistics.fmean(logs))


def main() -> None:
    import optuna

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", required=True)
    ap.add_argument("--run", required=True, help="the exhaustive (grid) run")
    ap.add_argument("--budget", type=float, action="append", default=[], help="share of each point's configs")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)  # GPSampler
    points = candidates(args.results, args.run)
    total = sum(len(c) for c in points.values())
    print(f"{args.run}: {len(points)} points, {total} candidate configs (optuna {optuna.__version__})\n")
    print(
        "| sampler | budget | configs measured vs candidates "
        "| points within 1 % of the grid's best, per seed | geomean quality, per seed |\n"
        "|---|---|---|---|---|"
    )
    for name in ("TPE", "GP"):
        for budget in args.budget or [0.2, 0.3]:
            runs = [replay(points, name, budget, seed) for seed in range(args.seeds)]
            found = ", ".join(f"{f} / {len(points)}" for f, _, _ in runs)
            quality = ", ".join(f"{q:.4f}" for _, _, q in runs)
            cost = f"{runs[0][1]} / {total} = {runs[0][1] / total:.0%}"
            print(f"| {name} | {budget} | {cost} | {found} | {quality} |")


if __name__ == "__main__":
    main()
