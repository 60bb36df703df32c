"""Does a choice made at one KV length carry to another at the same batch size? Read from records.

Confirming at start-up by cell (``tunectl.measure.confirm``) times a cell's candidates at its edges
and serves, in each part of the cell at that batch size, the one fastest on the line between its two
edges' times at the part's middle (``tunectl.measure.parts``; before, the one with the least
geometric mean of the two over the whole cell). What either is worth is read here from a tuning
run's own comparisons (finals and probes: a shape's configs timed in interleaved rounds):

- at every pair of shapes of one static key and one batch size whose KV lengths are at most
  ``--within`` apart: the config fastest at one, among the configs both compared, timed at the other
  over the fastest of them there (each pair counted both ways);
- ``--ends F``: at every shape with a compared shape of the same batch on either side along the KV
  length, at most F apart, the config chosen on those two ends (the least geometric mean of its two
  times), the one least on the lines between its two ends (at the middle of the part holding the
  shape), and the one chosen at the nearer end (what a cell's middle is), each timed at the shape
  between over the fastest there;
- ``--holdout PAGE:SEED=BUNDLE_DIR:RUN`` (as ``holdout_json.py`` takes them): at each held-out shape
  whose batch size the tuning run compared on either side of its KV length, what confirming on those
  two ends would install among the bundle's candidates (with the 2 % margin) by either rule, scored
  with the held-out run's times beside the bundle's pick and the list's best at the shape itself.

No GPU::

    bash benchmarks/gpu/holdout_h200.sh restore   # the holdout archives into /tmp/holdout-results
    PYTHONPATH=. python benchmarks/studies/cell_transfer.py --results /tmp/holdout-results \
        --run 16=r20261204-031233-40eb19 --run 128=r20261204-030703-b25d80 --ends 4 \
        $(while read p s b r; do echo --holdout $p:$s=/tmp/holdout-results/bundles/h200-rules-p$p/2:$r; \
          done < <(cat /tmp/holdout-results/holdout-runs.txt /tmp/holdout-results/confirm-runs.txt))

``--show-losses`` adds, on stderr, each held-out shape where the lines' choice loses more than 3 %.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.studies.holdout_json import holdout_of, size_of
from tunectl import api
from tunectl.core.keys import key_text, make_key
from tunectl.core.record import Phase, Record, Status
from tunectl.core.spec import DEFAULT_MARGIN
from tunectl.decide.holdout import HeldOut
from tunectl.measure.confirm import served_at
from tunectl.measure.parts import Along
from tunectl.store.results import read_results

Place = tuple[str, int, int]  # static key, batch, KV length


def comparisons(records: Iterable[Record]) -> dict[Place, dict[str, float]]:
    """Per shape, each config's median in its comparisons (the least where it was compared twice)."""
    at: dict[Place, dict[str, float]] = defaultdict(dict)
    for r in records:
        if r.status is Status.OK and r.phase in (Phase.FINAL, Phase.PROBE) and r.median_us:
            shape = json.loads(r.shape_key)
            times = at[(r.static_key, int(shape["batch"]), int(shape["kv_len"]))]
            times[r.config_key] = min(r.median_us, times.get(r.config_key, math.inf))
    return at


def losses(at: dict[Place, dict[str, float]], within: float) -> list[float]:
    """For each ordered pair of shapes of one static key and batch at most ``within`` apart along the
    KV length: the time at the second of the config fastest at the first, over the fastest there,
    among the configs both compared (two at least)."""
    out = []
    for (static, batch, kv), here in at.items():
        for (static2, batch2, kv2), there in at.items():
            if (static2, batch2) != (static, batch) or kv2 == kv or max(kv, kv2) > within * min(kv, kv2):
                continue
            common = set(here) & set(there)
            if len(common) >= 2:
                pick = min(common, key=here.__getitem__)
                out.append(there[pick] / min(there[c] for c in common))
    return out


def between(at: dict[Place, dict[str, float]], ends_within: float) -> dict[str, list[float]]:
    """At each shape with compared shapes of its static key and batch on either side (the nearest,
    at most ``ends_within`` apart), among the configs all three compared (two at least): the time of
    the config chosen on both ends (least geometric mean), of the one least on the lines between the
    ends (``_where``), and of the one chosen at the nearer end, over the fastest at the shape."""
    lengths: dict[tuple[str, int], list[int]] = defaultdict(list)
    for static, batch, kv in at:
        lengths[(static, batch)].append(kv)
    out: dict[str, list[float]] = {"both ends": [], "on the lines": [], "the nearer end": []}
    for (static, batch), kvs in lengths.items():
        kvs.sort()
        for low, kv, high in zip(kvs, kvs[1:], kvs[2:], strict=False):
            ends, here = (at[(static, batch, k)] for k in (low, high)), at[(static, batch, kv)]
            lo, hi = ends
            common = set(lo) & set(hi) & set(here)
            if high > ends_within * low or len(common) < 2:
                continue
            fastest = min(here[c] for c in common)
            nearer = lo if kv * kv <= low * high else hi
            f = _where(low, high, kv)
            out["both ends"].append(here[min(common, key=lambda c: lo[c] * hi[c])] / fastest)
            out["on the lines"].append(here[min(common, key=lambda c: lo[c] + (hi[c] - lo[c]) * f)] / fastest)
            out["the nearer end"].append(here[min(common, key=nearer.__getitem__)] / fastest)
    return out


def at_held_out(
    at: dict[Place, dict[str, float]],
    held: Iterable[HeldOut],
    bundle: api.Bundle,
    task: str,
    ends_within: float,
    told: list[str] | None = None,
) -> dict[str, list[float]]:
    """At each held-out shape whose batch the tuning run compared at KV lengths on either side (the
    nearest, at most ``ends_within`` apart), where the entry's own config was compared at both ends:
    the held-out time over the fastest of the bundle's pick, of what confirming on those two ends
    installs (the candidate with the least geometric mean there, where it beats the entry's own by
    the margin), of what it installs judging each candidate by its time on the line between its two
    ends, at the middle of the part of the cell that holds the shape's length (as confirming does
    now: ``tunectl.measure.parts``; the same margin), and of the list's best at the shape
    itself (confirming at the exact shape, an upper bound). ``told``: where given, a line for each
    shape where the lines' choice loses more than 3 %, with each candidate's times at the ends."""
    out: dict[str, list[float]] = {
        "the bundle's pick": [],
        "confirmed on the ends": [],
        "on the lines between the ends": [],
        "the list's best": [],
    }
    for h in held:
        static, shape = dict(h.static), dict(h.shape)
        listed = bundle.candidates(task, **static, **shape)
        entry = bundle.entry(task, **static, **shape)
        batch, kv_len = size_of(shape["batch"]), size_of(shape["kv_len"])
        kvs = sorted(k for s, b, k in at if s == key_text(h.static) and b == batch)
        low = max((k for k in kvs if k <= kv_len), default=None)
        high = min((k for k in kvs if k >= kv_len), default=None)
        if entry is None or len(listed) < 2 or low is None or high is None or high > ends_within * low:
            continue
        ends = [at[(key_text(h.static), batch, k)] for k in (low, high)]
        own = [
            end.get(key_text(make_key(served_at(entry, listed[0], {**shape, "kv_len": k}))))
            for end, k in zip(ends, (low, high), strict=True)
        ]
        scores = {key_text(make_key(c)): [end.get(key_text(make_key(c))) for end in ends] for c in listed[1:]}
        ratio = {key_text(k): v for k, v in h.losses.items()}
        if None in own or key_text(h.pick) not in ratio:
            continue
        f = _where(low, high, kv_len)
        chosen = {
            "confirmed on the ends": _installed(
                scores, own, key_text(h.pick), lambda t: math.sqrt(t[0] * t[1])
            ),
            "on the lines between the ends": _installed(scores, own, key_text(h.pick), _on_the_line(f)),
        }
        listed_ratios = [ratio[t] for t in (key_text(make_key(c)) for c in listed) if t in ratio]
        if all(c in ratio for c in chosen.values()) and listed_ratios:
            out["the bundle's pick"].append(ratio[key_text(h.pick)])
            for way, c in chosen.items():
                out[way].append(ratio[c])
            out["the list's best"].append(min(listed_ratios))
            lined = ratio[chosen["on the lines between the ends"]]
            if told is not None and lined > 1.03:
                told.append(_told(h, (low, high), own, scores, ratio, (lined, min(listed_ratios))))
    return out


def _told(
    h: HeldOut,
    ends: tuple[int, int],
    own: list[float | None],
    scores: dict[str, list[float | None]],
    ratio: dict[str, float],
    lost: tuple[float, float],
) -> str:
    """A held-out shape the lines' choice lost at: the ends, each candidate's times there (µs; ``-``:
    not compared there) and its time at the shape over the fastest."""

    def times(t: list[float | None]) -> str:
        return " / ".join("-" if x is None else f"{x:.1f}" for x in t)

    shape, pick = dict(h.shape), key_text(h.pick)
    lines = [
        f"batch {shape['batch']} x kv_len {shape['kv_len']} (page {dict(h.static)['page_size']}, ends "
        f"{ends[0]} and {ends[1]}): the lines' choice {lost[0]:.3f}, the list's best {lost[1]:.3f}",
        f"  the entry's own {pick}: {times(own)} -> {ratio.get(pick, math.nan):.3f}",
    ]
    lines += [f"  {c}: {times(t)} -> {ratio.get(c, math.nan):.3f}" for c, t in scores.items()]
    return "\n".join(lines)


def _where(low: int, high: int, kv_len: int) -> float:
    """Where confirming reads the lines between ``low`` and ``high`` for ``kv_len``: at the middle of
    the cell's part that holds it (``tunectl.measure.parts``), 0 at ``low``, 1 at ``high``."""
    if high <= low:
        return 0.0
    return next(where for _, where, lo, hi in Along.of("ceil", [low, high], high).parts if lo <= kv_len <= hi)


def _on_the_line(f: float) -> Callable[[list[float]], float]:
    """A candidate's time on the line between its times at the two ends, at ``f`` (0: the low end)."""
    return lambda t: t[0] + (t[1] - t[0]) * f


def _all_known(times: list[float | None]) -> list[float] | None:
    """``times`` where none is missing (None where one is)."""
    known = [float(x) for x in times if x is not None]
    return known if len(known) == len(times) else None


def _installed(
    scores: dict[str, list[float | None]],
    own: list[float | None],
    pick: str,
    judge: Callable[[list[float]], float],
) -> str:
    """The candidate confirming installs where ``judge`` reads each one's times at the two ends (the
    entry's own there: ``own``): the least, where it beats the entry's own by the margin; else
    ``pick``."""
    known = {c: judge(times) for c, t in scores.items() if (times := _all_known(t)) is not None}
    best = min(known, key=known.__getitem__, default=None)
    own_times = _all_known(own)
    assert own_times is not None  # the caller skips shapes where the entry's own was not compared
    mine = judge(own_times)
    return best if best is not None and known[best] * (1 + DEFAULT_MARGIN) < mine else pick


def figures(ratios: Sequence[float], counted: str = "pairs") -> dict[str, Any]:
    if not ratios:
        return {counted: 0}
    return {
        counted: len(ratios),
        "geomean": round(math.exp(math.fsum(map(math.log, ratios)) / len(ratios)), 4),
        "within_3pct": round(sum(r <= 1.03 for r in ratios) / len(ratios), 3),
        "worst": round(max(ratios), 3),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument("--run", action="append", required=True, help="PAGE=RUN_ID: a tuning run")
    parser.add_argument("--within", type=float, nargs="+", default=[math.sqrt(2), 2.0])
    parser.add_argument("--ends", type=float, default=0.0, help="ends at most this factor apart (0: none)")
    parser.add_argument(
        "--holdout",
        action="append",
        default=[],
        help="PAGE:SEED=BUNDLE_DIR:RUN, scored with --ends (4 if unset)",
    )
    parser.add_argument(
        "--show-losses", action="store_true", help="on stderr: each held-out shape the lines' choice loses"
    )
    args = parser.parse_args(argv)
    doc: dict[str, Any] = {}
    for spec in args.run:
        page, _, run_id = spec.partition("=")
        at = comparisons(read_results(args.results, [run_id]))
        doc[page] = {"run": run_id, **{f"within {w:.2f}x": figures(losses(at, w)) for w in args.within}}
        if args.ends:
            chosen_on = {k: figures(v, "shapes") for k, v in between(at, args.ends).items()}
            doc[page][f"ends at most {args.ends:g}x apart"] = chosen_on
        mine = [h.split("=", 1)[1].rsplit(":", 1) for h in args.holdout if h.split(":", 1)[0] == page]
        if mine:
            ratios: dict[str, list[float]] = {}
            for bundle_dir, held_run in mine:
                held = holdout_of(args.results, bundle_dir, held_run, DEFAULT_MARGIN).shapes
                told: list[str] = []
                bundle = api.read_bundle(bundle_dir)
                found = at_held_out(at, held, bundle, "flash_decode", args.ends or 4.0, told)
                for line in told if args.show_losses else []:
                    print(line, file=sys.stderr)
                for way, got in found.items():
                    ratios.setdefault(way, []).extend(got)
            doc[page]["held-out shapes"] = {k: figures(v, "shapes") for k, v in ratios.items()}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
