"""The side-by-side held-out table (benchmarks/studies/holdout_table.py): pooling over the shapes every
bundle's pick was timed at."""

from __future__ import annotations

import math

from benchmarks.studies import holdout_table
from tunectl.core.keys import make_key
from tunectl.decide.holdout import HeldOut, Holdout

STATIC = make_key({"page_size": 16})
PICK = make_key({"num_splits": 4})


def _held(ratios: dict[int, float | None]) -> Holdout:
    """A holdout of shapes batch=b with pick / oracle ``ratios[b]`` (None: the pick was not timed)."""
    shapes = tuple(
        HeldOut(STATIC, make_key({"batch": b}), PICK, PICK if r else None, r, "ok" if r else "missing")
        for b, r in ratios.items()
    )
    return Holdout(shapes, 0.02)


def test_common_pools_only_the_shapes_every_bundle_timed_and_gives_the_difference() -> None:
    holdouts = {
        "old@s1": _held({1: 1.0, 2: 1.10, 3: 1.04}),
        "new@s1": _held({1: 1.02, 2: None, 3: 1.0}),
        "old@s2": _held({1: 1.01}),
        "new@s2": _held({1: 1.01}),
    }
    every = holdout_table.pooled(holdouts)
    common = holdout_table.pooled(holdouts, common=True)

    assert len(every["old"].ratios) == 4 and len(every["new"].ratios) == 3
    # batch 2 at seed 1 is left out of both pools: the new bundle's pick there was not timed
    assert sorted(common["old"].ratios) == [1.0, 1.01, 1.04]
    assert sorted(common["new"].ratios) == [1.0, 1.01, 1.02]
    rows = holdout_table.common_rows(holdouts)
    old_mean, new_mean = common["old"].geomean, common["new"].geomean
    assert old_mean is not None and new_mean is not None
    assert rows[-1] == f"geomean against old ({old_mean:.4f}): new {new_mean - old_mean:+.4f}"
    assert math.isclose(new_mean / old_mean, (1.02 / 1.04) ** (1 / 3))
