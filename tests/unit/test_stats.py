"""Paired speedups and their intervals."""

from __future__ import annotations

import math
import random

import pytest

from tunectl.core.stats import Speedup, geomean_speedup, paired_speedup, t975


def test_a_constant_ratio_has_a_point_interval() -> None:
    s = paired_speedup([200.0, 210.0, 190.0], [100.0, 105.0, 95.0])
    assert s.estimate == pytest.approx(2.0) and s.lo == pytest.approx(2.0) and s.hi == pytest.approx(2.0)
    assert s.beats() and not s.loses()


def test_the_interval_is_students_t_on_log_ratios() -> None:
    base, other = [100.0, 100.0, 100.0, 100.0], [80.0, 90.0, 100.0, 110.0]
    logs = [math.log(b / o) for b, o in zip(base, other, strict=True)]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    s = paired_speedup(base, other)
    assert s.estimate == pytest.approx(math.exp(mean))
    assert s.lo == pytest.approx(math.exp(mean - 3.182 * sd / 2))
    assert s.hi == pytest.approx(math.exp(mean + 3.182 * sd / 2))
    assert not s.beats() and not s.loses(), "a 4 % mean gain inside +/-10 % noise is a tie"


def test_pairing_cancels_drift_that_unpaired_medians_do_not() -> None:
    # The device slows down 30 % over the rounds; the config is 5 % faster in every round.
    base = [100.0 * (1 + 0.03 * r) for r in range(10)]
    other = [b / 1.05 for b in base]
    s = paired_speedup(base, other)
    assert s.lo == pytest.approx(1.05) and s.beats(margin=0.04)


def test_coverage_is_near_95_percent() -> None:
    rng = random.Random(7)
    trials, covered = 2000, 0
    for _ in range(trials):
        base = [100.0 * math.exp(rng.gauss(0, 0.03)) for _ in range(8)]
        other = [b / 1.1 * math.exp(rng.gauss(0, 0.03)) for b in base]
        s = paired_speedup(base, other)
        covered += s.lo <= 1.1 <= s.hi
    assert 0.93 <= covered / trials <= 0.97


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        paired_speedup([1.0], [1.0])
    with pytest.raises(ValueError):
        paired_speedup([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_speedup([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        t975(0)


def test_geomean_combines_the_shapes_errors() -> None:
    a = Speedup(2.0, 1.9, 2.1, 8)
    b = Speedup(0.5, 0.45, 0.55, 8)
    g = geomean_speedup([a, b])
    assert g.estimate == pytest.approx(1.0)
    assert g.lo < 1.0 < g.hi
    narrower = geomean_speedup([a, a, a, a])
    assert narrower.hi / narrower.estimate < a.hi / a.estimate, "more shapes, a tighter mean"
