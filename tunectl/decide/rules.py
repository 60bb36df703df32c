"""Rules: a split count fitted as a wave model, chosen over a plain config where the measurements say so.

A table entry is chosen at one point and serves a region. Split-KV kernels fall off cliffs inside
that region where their launch spills into another wave of work over the SMs, and the cliffs move with
the split count: the right count is a function of the shape, not a constant of the cell. Kernel
libraries pick it by a rule with tuned constants (flash-attn 3: the fewest splits whose wave
efficiency is within 0.85 of the best; FlashInfer's planner: the most splits that still fit one wave
of CTAs). Here the rule's constants are fitted to the measured rows, per kernel family (a config with
its split count left open) and static key, and an entry holds the rule only where the probes of its
region measured it doing better than the cell's plain config.

**Fitting** (``fit_rules``): the samples of a family are the single-timing medians of its members
(every config of the family with a positive split count) at every tuned point. The model is
``tunectl.runtime.rules.WaveRule``: its costs are linear given the launch geometry (``per_wave``,
``block``), so the geometry is searched on a grid (``per_wave`` in quarter powers of two from 1 to
4096, refined to sixteenths around the best; ``block`` among ``BLOCKS``) and the five costs (the
work term with them: ``tunectl.runtime.rules`` says why) solved by non-negative least squares in
relative error at each. A family needs ``MIN_COUNTS`` split counts and ``MIN_SAMPLES`` samples at
two shapes or more; the rule chooses counts between the smallest and largest measured. Probe
planning (``tunectl.decide.probes``) fits the same rules from the same rows and measures each rule's
count at each probe of a cell whose short list holds a member of its family.

**Choosing** (``with_rules``): per cell, each rule of its static key is compared with the cell's
config at the sites where both were measured (the cell's tuned point, its probes; at least
``MIN_SITES``, one of them a probe): the rule is chosen when its geometric-mean loss to the fastest
config there is lower by more than ``EDGE`` and its worst loss is no worse. Otherwise, and wherever
nothing measured a rule, the plain config stays: a rule never wins without evidence. The entry says
which, with both figures.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tunectl.core.keys import Key, key_text, make_key, value_order
from tunectl.core.plan import RunFacts
from tunectl.core.record import Phase, Record
from tunectl.decide.select import Winner, latest_comparisons
from tunectl.runtime.rules import WaveRule, launch

BLOCKS = (16, 32, 64, 128, 256)
PER_WAVE = tuple(2 ** (i / 4) for i in range(49))
MIN_COUNTS = 3
MIN_SAMPLES = 8
MIN_SITES = 2
EDGE = 0.005
#: the model's terms, each with a cost the fit solves for: fixed, waves x chunk, split, partials, work
FEATURES = 5

Timings = Mapping[tuple[str, Key, Key], Mapping[Key, float]]  # (task, static, shape) -> config -> median
Sample = tuple[int, int, int, float]  # across, along, split count, median µs


@dataclass(frozen=True)
class RuleSite:
    """One place a cell was measured: each config's time over the fastest config's there."""

    shape: Key
    losses: Mapping[Key, float]
    probed: bool  # a probe inside the region (else the tuned point itself)


@dataclass(frozen=True)
class Fitted:
    """A rule fitted to one kernel family at one static key."""

    task: str
    static: Key
    base: Key  # the family's config without its split count
    rule: WaveRule

    def pick(self, shape: Key) -> Key:
        """The config the rule runs at ``shape``."""
        return make_key(self.rule.config(dict(self.base), dict(shape)))

    def holds(self, config: Key) -> bool:
        """``config`` is a member of this rule's family."""
        values = dict(config)
        return (
            self.rule.param in values
            and make_key({k: v for k, v in values.items() if k != self.rule.param}) == self.base
        )


def fit_rules(timings: Timings, facts: Iterable[RunFacts]) -> list[Fitted]:
    """The rule of every family the timings can fit, in a fixed order (module doc)."""
    out = []
    for f in facts:
        if len(f.wave_dims) != 2 or not f.split_params:
            continue
        for (task, static, base, param), samples in sorted(
            _samples(timings, f).items(), key=lambda kv: (value_order(kv[0][1]), key_text(kv[0][2]), kv[0][3])
        ):
            rule = fit_rule(samples, param, f.wave_dims[0], f.wave_dims[1])
            if rule is not None:
                out.append(Fitted(task, static, base, rule))
    return out


def _samples(timings: Timings, facts: RunFacts) -> dict[tuple[str, Key, Key, str], list[Sample]]:
    across, along = facts.wave_dims
    out: dict[tuple[str, Key, Key, str], list[Sample]] = {}
    for (task, static, shape), times in sorted(timings.items(), key=lambda kv: key_text(kv[0][2])):
        size = {k: v for k, v in shape if isinstance(v, int)}
        if task != facts.task or across not in size or along not in size:
            continue
        for config, median in sorted(times.items(), key=lambda kv: key_text(kv[0])):
            values = dict(config)
            for param in facts.split_params:
                count = split_count(config, param)
                if count is not None and median > 0:
                    base = make_key({k: v for k, v in values.items() if k != param})
                    sample = (size[across], size[along], count, float(median))
                    out.setdefault((task, static, base, param), []).append(sample)
    return out


def fit_rule(samples: Sequence[Sample], param: str, across: str, along: str) -> WaveRule | None:
    """The wave rule that fits ``samples`` best (module doc), or None where they are too few."""
    counts = sorted({s for _, _, s, _ in samples})
    if len(counts) < MIN_COUNTS or len(samples) < MIN_SAMPLES or len({(a, n) for a, n, _, _ in samples}) < 2:
        return None
    best: tuple[float, float, int, tuple[float, ...]] | None = None
    for block in BLOCKS:
        for per_wave in PER_WAVE:
            best = _better(best, samples, per_wave, block)
    assert best is not None  # the constant-cost fit is always possible
    _, per_wave, block, _ = best
    for step in range(-4, 5):
        best = _better(best, samples, per_wave * 2 ** (step / 16), block)
    assert best is not None
    _, per_wave, block, cost = best
    fixed, per_token, per_split, per_partial, per_work = cost
    return WaveRule(
        param,
        across,
        along,
        per_wave,
        block,
        counts[0],
        counts[-1],
        (fixed, per_token, per_split, per_partial),
        per_work,
    )


def _features(across: int, along: int, splits: int, per_wave: float, block: int) -> tuple[float, ...]:
    waves, chunk, active = launch(across, along, splits, per_wave, block)
    split = 1.0 if splits > 1 else 0.0
    return (1.0, float(waves * chunk), split, split * across * active, float(across * along))


def _better(
    best: tuple[float, float, int, tuple[float, ...]] | None,
    samples: Sequence[Sample],
    per_wave: float,
    block: int,
) -> tuple[float, float, int, tuple[float, ...]] | None:
    """``best``, or the fit at this geometry where its relative squared error is smaller."""
    gram = [[0.0] * FEATURES for _ in range(FEATURES)]
    rhs = [0.0] * FEATURES
    for a, n, s, t in samples:
        row = [x / t for x in _features(a, n, s, per_wave, block)]
        for i in range(FEATURES):
            rhs[i] += row[i]
            for j in range(i, FEATURES):
                gram[i][j] += row[i] * row[j]
    for i in range(FEATURES):
        for j in range(i):
            gram[i][j] = gram[j][i]
    error, cost = _nonnegative(gram, rhs, float(len(samples)))
    if best is None or error < best[0] - 1e-12:
        return (error, per_wave, block, cost)
    return best


def _nonnegative(gram: list[list[float]], rhs: list[float], total: float) -> tuple[float, tuple[float, ...]]:
    """Least squares with every coefficient >= 0, over every subset of the features (there are 5)."""
    best: tuple[float, tuple[float, ...]] = (total, (0.0,) * FEATURES)
    for mask in range(1, 1 << FEATURES):
        used = [i for i in range(FEATURES) if mask >> i & 1]
        solved = _solve([[gram[i][j] for j in used] for i in used], [rhs[i] for i in used])
        if solved is None or min(solved) < 0:
            continue
        coef = [0.0] * FEATURES
        for i, c in zip(used, solved, strict=True):
            coef[i] = c
        error = total - 2 * sum(c * b for c, b in zip(coef, rhs, strict=True))
        error += sum(coef[i] * gram[i][j] * coef[j] for i in range(FEATURES) for j in range(FEATURES))
        if error < best[0] - 1e-12:
            best = (error, tuple(coef))
    return best


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """``a x = b`` by Gaussian elimination with partial pivoting; None where ``a`` is singular."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12 * max(1.0, abs(m[col][col])):
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                factor = m[r][col] / m[col][col]
                m[r] = [x - factor * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def split_count(config: Key, param: str) -> int | None:
    """The split count ``config`` sets for ``param``: a positive integer, else None (not set, or 0: the
    kernel's own choice). A config that sets one is a member of a split family."""
    count = dict(config).get(param)
    return count if type(count) is int and count > 0 else None


def probe_losses(arms: Sequence[Record]) -> dict[Key, float] | None:
    """Each config's loss at a probe (its time over the fastest's), from the comparison's paired
    speedups over the default (its first arm); None where the default failed."""
    ok = [r for r in arms if r.ok and (r.is_default or r.speedup)]
    if not any(r.is_default for r in ok):
        return None
    speedups = {r.config: 1.0 if r.is_default else float(r.speedup or 0.0) for r in ok}
    best = max(speedups.values())
    return {c: best / s for c, s in speedups.items()}


def rule_sites(
    winners: Sequence[Winner],
    probes: Iterable[Record],
    timings: Timings,
    cell_of: Callable[[str, Key], Key | None],
) -> dict[tuple[str, Key, Key], list[RuleSite]]:
    """Per cell of ``winners``: its tuned point (where it has a result of its own) and each probe
    whose shape buckets to it (``cell_of(task, shape)``), as sites."""
    out: dict[tuple[str, Key, Key], list[RuleSite]] = {}
    for w in winners:
        times = timings.get((w.task, w.static, w.shape)) if w.served_by is None else None
        if times:
            fastest = min(times.values())
            site = RuleSite(w.shape, {c: t / fastest for c, t in times.items()}, probed=False)
            out.setdefault((w.task, w.static, w.shape), []).append(site)
    for arms in latest_comparisons(probes, Phase.PROBE).values():
        first = arms[0]
        cell, losses = cell_of(first.task, first.shape), probe_losses(arms)
        if cell is not None and losses is not None:
            out.setdefault((first.task, first.static, cell), []).append(RuleSite(first.shape, losses, True))
    return out


def with_rules(
    winners: Sequence[Winner],
    sites: Mapping[tuple[str, Key, Key], Sequence[RuleSite]],
    fitted: Sequence[Fitted],
) -> list[Winner]:
    """``winners`` with each cell whose measurements favour a rule served that rule (module doc)."""
    by_static: dict[tuple[str, Key], list[Fitted]] = {}
    for f in fitted:
        by_static.setdefault((f.task, f.static), []).append(f)
    return [
        _ruled(w, sites.get((w.task, w.static, w.shape), ()), by_static.get((w.task, w.static), []))
        for w in winners
    ]


def _ruled(w: Winner, sites: Sequence[RuleSite], rules: Sequence[Fitted]) -> Winner:
    best: tuple[float, float, int, Fitted, float, float] | None = None
    for f in rules:
        pairs = [
            (s.losses[pick], s.losses[w.config], s.probed)
            for s in sites
            if (pick := f.pick(s.shape)) in s.losses and w.config in s.losses
        ]
        if len(pairs) < MIN_SITES or not any(probed for _, _, probed in pairs):
            continue
        mine, plain = _geomean([p[0] for p in pairs]), _geomean([p[1] for p in pairs])
        worst, plain_worst = max(p[0] for p in pairs), max(p[1] for p in pairs)
        if mine * (1 + EDGE) < plain and worst <= plain_worst and (best is None or (mine, worst) < best[:2]):
            best = (mine, worst, len(pairs), f, plain, plain_worst)
    if best is None:
        return w
    mine, worst, num_sites, f, plain, plain_worst = best
    note = (
        f"rule: {f.rule.param} by waves of {f.rule.per_wave:.1f} over {key_text(f.base)}: within "
        f"{mine - 1:.1%} of the best at {num_sites} site(s) (worst {worst - 1:.1%}); the plain config "
        f"{key_text(w.config)} {plain - 1:.1%} (worst {plain_worst - 1:.1%})"
    )
    pick = f.pick(w.shape)
    return dataclasses.replace(
        w, config=pick, is_default=w.is_default and pick == w.config, basis="rule", rule=f.rule, region=note
    )


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))
