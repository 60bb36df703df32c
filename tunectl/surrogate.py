"""The model behind the ``model`` search: a Gaussian process over (config, static key, shape).

It predicts y = log(config time / default time at that point) — 0 for "as fast as the default" —
from every point measured so far, so a shape learns from its neighbours and a static key from the
others. The kernel is a product of three: over configs, mostly the config itself (configs one option
apart barely correlate: in kernels one option can change everything) plus a small additive share
(each option's own effect); over static keys, the share of parameters they have alike (with a
floor: a config good for one mask tends to be good for another); over shapes, a squared exponential
on log2 of the sizes. A config that failed counts as ``FAILED_Y`` (e^1: clearly slower), so the
model learns which regions fail. The prior's variance follows the spread of the data.

The first ``explore`` picks at a point go by a lower confidence bound (the lowest plausible time:
optimistic about what is not known), later ones by expected improvement over the point's best so
far, stopping when none is expected to gain ``min_gain``. Ties go to the config with the lowest
digest, an order that favours no option value (canonical order would try every "a..." first): the
sampler is deterministic.

The hyperparameters are fixed, not fitted: with a few dozen observations a marginal-likelihood fit
is itself noisy. They were chosen by replaying the exhaustive H200 grids in ``benchmarks/results``
(``benchmarks/search_cost.py replay``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tunectl.keys import Key, key_digest

FAILED_Y = 1.0
_MIN_SIGNAL_VAR = 0.05  # prior variance of y at least this (configs within ~e^±0.2 of the default)
_NOISE_VAR = 1e-3
_ADDITIVE = 0.2  # the config kernel's additive share
_CONFIG_SCALE = 0.1  # options differing per e-fold of the interaction part's correlation
_SHAPE_SCALE = 1.5  # octaves
_STATIC_FLOOR = 0.3  # correlation kept between static keys that share no parameter

Data = Sequence[tuple[Key, Key, Key, Mapping[str, Any]]]  # (config, static, shape, its row)
Observation = tuple[Key, Key, Key, float]  # (config, static, shape, y)


def propose(
    candidates: Sequence[Key],
    static: Key,
    shape: Key,
    data: Data,
    min_gain: float,
    explore: int = 2,
) -> Key | None:
    """The candidate with the largest expected improvement at ``shape``, or None when no candidate is
    expected to improve by ``min_gain`` (or there is nothing to learn from). While the shape has
    fewer than ``1 + explore`` measurements, the candidate the model knows least about instead."""
    if not candidates:
        return None
    observed = _observations(data)
    here = [y for c, st, s, y in observed if st == static and s == shape]
    if not here:
        return None
    best = min(here)
    mean, std = predict(observed, [(c, static, shape) for c in candidates])
    if len(here) <= explore:  # optimistic: the lowest plausible time (a lower confidence bound)
        gains = [best - (m - 2.0 * s) for m, s in zip(mean, std, strict=True)]
    else:
        gains = [_expected_improvement(best, m, s) for m, s in zip(mean, std, strict=True)]
    top = max(gains)
    if top < min_gain and len(here) > explore:
        return None
    return min((c for c, g in zip(candidates, gains, strict=True) if g == top), key=key_digest)


def _observations(data: Data) -> list[Observation]:
    baseline = {(st, s): r["median_us"] for _, st, s, r in data if r["is_default"] and r["status"] == "ok"}
    out = []
    for config, static, shape, row in data:
        base = baseline.get((static, shape))
        if base is None:
            continue
        ok = row["status"] == "ok" and row["median_us"]
        out.append((config, static, shape, math.log(row["median_us"] / base) if ok else FAILED_Y))
    return out


def predict(
    observed: Sequence[Observation], queries: Sequence[tuple[Key, Key, Key]]
) -> tuple[list[float], list[float]]:
    """Posterior mean and standard deviation of y at each (config, static, shape) query."""
    import numpy as np

    n = len(observed)
    both = _features([(c, st, s) for c, st, s, _ in observed] + list(queries))  # one set of columns
    a, b = tuple(f[:n] for f in both), tuple(f[n:] for f in both)
    y = np.array([v for *_, v in observed])
    # The prior's spread follows the data's: kernels differ from a default by 10 % or by 10x.
    signal = max(_MIN_SIGNAL_VAR, float(np.var(y))) if len(y) > 1 else _MIN_SIGNAL_VAR
    k = signal * _kernel(a, a) + _NOISE_VAR * np.eye(len(y))
    chol = np.linalg.cholesky(k)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    kq = signal * _kernel(b, a)
    mean = kq @ alpha
    v = np.linalg.solve(chol, kq.T)
    var = np.maximum(signal - (v * v).sum(axis=0), 1e-12)
    return mean.tolist(), np.sqrt(var).tolist()


def _features(points: Sequence[tuple[Key, Key, Key]]) -> tuple[Any, Any, Any]:
    """Configs and static keys as categorical arrays (one column per name), shapes as log2 sizes."""
    import numpy as np

    def categorical(keys: Sequence[Key]) -> Any:
        names = sorted({n for k in keys for n, _ in k})
        rows = [[repr(dict(k).get(n, "<absent>")) for n in names] for k in keys]
        return np.array(rows, dtype=object).reshape(len(keys), len(names))

    shapes = [[_octaves(v) for _, v in s] for _, _, s in points]
    width = max(map(len, shapes), default=0)
    shapes = [row + [0.0] * (width - len(row)) for row in shapes]
    return (
        categorical([c for c, _, _ in points]),
        categorical([st for _, st, _ in points]),
        np.array(shapes, dtype=float).reshape(len(points), width),
    )


def _octaves(value: object) -> float:
    return math.log2(value) if isinstance(value, (int, float)) and value > 0 else 0.0


def _kernel(a: tuple[Any, ...], b: tuple[Any, ...]) -> Any:
    import numpy as np

    (xa, ta, sa), (xb, tb, sb) = a, b
    shapes = np.exp(-((sa[:, None, :] - sb[None, :, :]) ** 2).sum(axis=2) / (2 * _SHAPE_SCALE**2))
    return _config_kernel(xa, xb) * _static_kernel(ta, tb) * shapes


def _mismatches(xa: Any, xb: Any) -> tuple[Any, int]:
    return (xa[:, None, :] != xb[None, :, :]).sum(axis=2).astype(float), max(xa.shape[1], 1)


def _config_kernel(xa: Any, xb: Any) -> Any:
    """Mostly the config itself (an exponential of how many options differ, so steep that configs
    apart in one option barely correlate), plus a small additive share (each option's own effect,
    shared by the configs that set it alike)."""
    import numpy as np

    differ, width = _mismatches(xa, xb)
    return _ADDITIVE * (1.0 - differ / width) + (1.0 - _ADDITIVE) * np.exp(-differ / _CONFIG_SCALE)


def _static_kernel(ta: Any, tb: Any) -> Any:
    """Static keys that share more parameters share more of what a config does to the time."""
    differ, width = _mismatches(ta, tb)
    return _STATIC_FLOOR + (1.0 - _STATIC_FLOOR) * (1.0 - differ / width)


def _expected_improvement(best: float, mean: float, std: float) -> float:
    """Expected amount by which y falls below ``best`` (lower time is better)."""
    if std <= 0:
        return max(best - mean, 0.0)
    z = (best - mean) / std
    cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return (best - mean) * cdf + std * pdf
