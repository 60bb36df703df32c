"""Properties of selection that hold for any records: order does not matter, failures never win."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tunectl.core.keys import key_text
from tunectl.core.record import Phase, Record, Status
from tunectl.decide.select import select_winners

CONFIGS = [key_text((("c", i),)) for i in range(4)]  # c=0 is the default
SHAPES = [key_text((("batch", b),)) for b in (1, 16)]


@st.composite
def measurement(draw: st.DrawFn, n: int) -> Record:
    config = draw(st.integers(0, len(CONFIGS) - 1))
    status = draw(st.sampled_from([Status.OK, Status.OK, Status.OK, Status.WRONG_RESULT, Status.ERROR]))
    phase = draw(st.sampled_from([Phase.MEASURE, Phase.SCREEN, Phase.FINAL, Phase.VALIDATE]))
    median = draw(st.floats(1.0, 100.0)) if status is Status.OK else None
    speedup = draw(st.floats(0.5, 2.0)) if phase in (Phase.FINAL, Phase.VALIDATE) else None
    return Record(
        run_id="r",
        item_id=f"i{n}",
        task="t",
        static_key='{"d":1}',
        shape_key=draw(st.sampled_from(SHAPES)),
        config_key=CONFIGS[config],
        is_default=config == 0,
        status=status,
        median_us=median,
        p20_us=None if median is None else median * 0.95,
        p80_us=None if median is None else median * 1.05,
        rel_noise=draw(st.floats(0.0, 0.2)),
        num_samples=10,
        phase=phase,
        group_id=draw(st.sampled_from(["", "g1", "g2"])) if speedup else "",
        rounds=8 if speedup else None,
        speedup=speedup,
        speedup_lo=None if speedup is None else speedup * 0.97,
        speedup_hi=None if speedup is None else speedup * 1.03,
        finished_at=float(draw(st.integers(0, 5))),
    )


@st.composite
def records(draw: st.DrawFn) -> list[Record]:
    n = draw(st.integers(1, 14))
    return [draw(measurement(i)) for i in range(n)]


@settings(max_examples=200, deadline=None)
@given(records(), st.randoms(use_true_random=False))
def test_the_order_records_come_in_changes_nothing(rs: list[Record], rnd: object) -> None:
    shuffled = list(rs)
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    assert select_winners(shuffled) == select_winners(rs)


@settings(max_examples=200, deadline=None)
@given(records())
def test_selection_is_deterministic(rs: list[Record]) -> None:
    assert select_winners(rs) == select_winners(list(rs))


@settings(max_examples=200, deadline=None)
@given(records())
def test_a_config_never_measured_ok_never_wins(rs: list[Record]) -> None:
    ok = {(r.shape_key, r.config_key) for r in rs if r.ok and r.phase is not Phase.VALIDATE}
    for w in select_winners(rs):
        assert (key_text(w.shape), key_text(w.config)) in ok


@settings(max_examples=200, deadline=None)
@given(records(), st.integers(1, len(CONFIGS) - 1))
def test_a_config_made_wrong_everywhere_never_wins(rs: list[Record], bad: int) -> None:
    wronged = [
        Record(**{**r.__dict__, "status": Status.WRONG_RESULT}) if r.config_key == CONFIGS[bad] else r
        for r in rs
    ]
    assert all(dict(w.config)["c"] != bad for w in select_winners(wronged))


@settings(max_examples=200, deadline=None)
@given(records(), st.integers(1, len(CONFIGS) - 1))
def test_a_config_the_rule_bars_never_wins(rs: list[Record], barred: int) -> None:
    winners = select_winners(rs, selectable=lambda task, static, config: dict(config)["c"] != barred)
    assert all(dict(w.config)["c"] != barred for w in winners)
