"""benchmarks/studies/finals_variance.py counts coverage and non-overlap as it says, on made-up finals."""

from __future__ import annotations

import importlib.util
import math
import random
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "studies" / "finals_variance.py"


@pytest.fixture(scope="module")
def study() -> ModuleType:
    spec = importlib.util.spec_from_file_location("finals_variance", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["finals_variance"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_intervals_that_hold_the_truth_cover_it_and_overlap(study: ModuleType) -> None:
    rng = random.Random(3)
    finals = []
    for run in range(40):
        x = math.log(2.0) + rng.gauss(0, 0.05)  # each run's estimate, its error 0.05 in logs
        finals.append(study.Final(run, "s", "c", math.exp(x), math.exp(x - 0.098), math.exp(x + 0.098)))
    summary = study.analyse(finals)
    assert summary["num_intervals"] == 40 and summary["num_pairs"] == 40 * 39 // 2
    assert 0.85 <= summary["coverage"] <= 1.0 and summary["non_overlap"] < 0.03
    assert summary["median_dispersion"] == pytest.approx(1.0, abs=0.3)


def test_runs_that_disagree_beyond_their_intervals_are_counted(study: ModuleType) -> None:
    finals = [study.Final(run, "s", "c", s, s * 0.99, s * 1.01) for run, s in enumerate([2.0, 3.0, 4.0, 5.0])]
    finals.append(study.Final(0, "s", "rare", 2.0, 1.9, 2.1))  # in one run only: not pooled
    summary = study.analyse(finals)
    assert summary["num_intervals"] == 4 and summary["coverage"] == 0.0
    assert summary["non_overlap"] == 1.0 and summary["median_dispersion"] > 10
    assert "coverage 0 % of 4 intervals" in study.table(summary)
