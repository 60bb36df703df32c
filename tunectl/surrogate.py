"""The model behind the ``model`` search: a Gaussian process over (config, shape).

It predicts y = log(config time / default time at that shape) — 0 for "as fast as the default" — from
every point of one static key measured so far, so a shape learns from its neighbours. The kernel is a
product of a kernel over configs and a squared-exponential kernel on log2 of the shape dimensions.
The config kernel is half additive (the share of options two configs agree on: each option's own
effect carries over to every config that has it) and half an exponential of the Hamming distance
(how many options differ: what only whole configs share). Configs from different grids of a union
simply differ in more options. A config that failed counts as ``FAILED_Y`` (e^1: clearly
slower), so the model learns which regions fail. The next config is the one with the largest expected
improvement over the point's best so far; ties go to the first in canonical order. Deterministic.

The hyperparameters are fixed rather than fitted: with a few dozen observations per static key a
marginal-likelihood fit is itself noisy, and these scales (one differing option decorrelates by e^-1,
shapes an octave apart stay close) fit kernel configs well.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tunectl.keys import Key, key_text

FAILED_Y = 1.0
_SIGNAL_VAR = 0.25  # prior variance of y: configs within ~e^±1 of the default
_NOISE_VAR = 1e-3
_CONFIG_SCALE = 1.0  # options differing per e-fold of correlation
_SHAPE_SCALE = 1.5  # octaves

Data = Sequence[tuple[Key, Key, Mapping[str, Any]]]  # (config, shape, its row)


def propose(
    default: Key,
    candidates: Sequence[Key],
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
    observed = _observations(default, data)
    here = [y for c, s, y in observed if s == shape]
    if not here:
        return None
    best = min(here)
    mean, std = predict(observed, [(c, shape) for c in candidates])
    if len(here) <= explore:
        gains = std
    else:
        gains = [_expected_improvement(best, m, s) for m, s in zip(mean, std, strict=True)]
    top = max(gains)
    if top < min_gain and len(here) > explore:
        return None
    return min((c for c, g in zip(candidates, gains, strict=True) if g == top), key=key_text)


def _observations(
    default: Key, data: Sequence[tuple[Key, Key, Mapping[str, Any]]]
) -> list[tuple[Key, Key, float]]:
    baseline = {s: r["median_us"] for c, s, r in data if c == default and r["status"] == "ok"}
    out = []
    for config, shape, row in data:
        if shape not in baseline:
            continue
        ok = row["status"] == "ok" and row["median_us"]
        out.append((config, shape, math.log(row["median_us"] / baseline[shape]) if ok else FAILED_Y))
    return out


def predict(
    observed: Sequence[tuple[Key, Key, float]], queries: Sequence[tuple[Key, Key]]
) -> tuple[list[float], list[float]]:
    """Posterior mean and standard deviation of y at each (config, shape) query."""
    import numpy as np

    names = sorted({n for c, _, _ in observed for n, _ in c} | {n for c, _ in queries for n, _ in c})
    xo, so = _features([(c, s) for c, s, _ in observed], names)
    xq, sq = _features(queries, names)
    y = np.array([v for _, _, v in observed])
    k = _kernel(xo, so, xo, so) + _NOISE_VAR * np.eye(len(y))
    chol = np.linalg.cholesky(k)
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    kq = _kernel(xq, sq, xo, so)
    mean = kq @ alpha
    v = np.linalg.solve(chol, kq.T)
    var = np.maximum(_SIGNAL_VAR - (v * v).sum(axis=0), 1e-12)
    return mean.tolist(), np.sqrt(var).tolist()


def _features(points: Sequence[tuple[Key, Key]], names: Sequence[str]) -> tuple[Any, Any]:
    import numpy as np

    configs = [[repr(dict(c).get(n, "<absent>")) for n in names] for c, _ in points]
    shapes = [
        [math.log2(v) if isinstance(v, (int, float)) and v > 0 else 0.0 for _, v in s] for _, s in points
    ]
    width = max(map(len, shapes), default=0)
    shapes = [row + [0.0] * (width - len(row)) for row in shapes]
    return (
        np.array(configs, dtype=object).reshape(len(points), len(names)),
        np.array(shapes, dtype=float).reshape(len(points), width),
    )


def _octaves(value: object) -> float:
    return math.log2(value) if isinstance(value, (int, float)) and value > 0 else 0.0


def _kernel(xa: Any, sa: Any, xb: Any, sb: Any) -> Any:
    import numpy as np

    differ = (xa[:, None, :] != xb[None, :, :]).sum(axis=2).astype(float)
    width = max(xa.shape[1], 1)
    # Half additive (each option's own effect: what matches, shared), half interactions (the whole config).
    configs = 0.5 * (1.0 - differ / width) + 0.5 * np.exp(-differ / _CONFIG_SCALE)
    dist2 = ((sa[:, None, :] - sb[None, :, :]) ** 2).sum(axis=2)
    return _SIGNAL_VAR * configs * np.exp(-dist2 / (2 * _SHAPE_SCALE**2))


def _expected_improvement(best: float, mean: float, std: float) -> float:
    """Expected amount by which y falls below ``best`` (lower time is better)."""
    if std <= 0:
        return max(best - mean, 0.0)
    z = (best - mean) / std
    cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return (best - mean) * cdf + std * pdf
