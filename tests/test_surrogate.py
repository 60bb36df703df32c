"""The model behind the model-based search: what it predicts, and what it proposes."""

from __future__ import annotations

from typing import Any

from tunectl.keys import Key, make_key
from tunectl.surrogate import predict, propose

STATIC = make_key({"dtype": "bf16"})


def _cfg(**kw: Any) -> Key:
    return make_key(kw)


def _shape(batch: int) -> Key:
    return make_key({"batch": batch})


def _row(median: float, default: bool = False, status: str = "ok") -> dict[str, Any]:
    return {"median_us": median, "is_default": default, "status": status}


def test_predictions_follow_the_data_where_there_is_data_and_doubt_where_there_is_not() -> None:
    a, b = _cfg(split=1), _cfg(split=8)
    observed = [(a, STATIC, _shape(1), 0.0), (b, STATIC, _shape(1), -1.0), (a, STATIC, _shape(64), 0.0)]
    mean, std = predict(observed, [(b, STATIC, _shape(1)), (b, STATIC, _shape(2)), (b, STATIC, _shape(4096))])
    assert abs(mean[0] + 1.0) < 0.05 and std[0] < 0.1, "an observed point is reproduced"
    assert mean[0] < mean[1] < 0.0 and mean[2] > -0.1, "an octave away it carries over; far away it fades"
    assert std[0] < std[1] < std[2]


def test_it_proposes_what_a_neighbouring_shape_found_over_what_failed_or_tied_there() -> None:
    default, good, broken, other = _cfg(split=1), _cfg(split=8), _cfg(split=16), _cfg(split=2)
    data = [
        (default, STATIC, _shape(1), _row(100.0, default=True)),
        (good, STATIC, _shape(1), _row(40.0)),
        (broken, STATIC, _shape(1), _row(0.0, status="invalid")),
        (other, STATIC, _shape(1), _row(100.0)),
        (default, STATIC, _shape(2), _row(200.0, default=True)),
    ]
    pick = propose([good, broken, other], STATIC, _shape(2), data, min_gain=0.005, explore=0)
    assert pick == good


def test_it_stops_when_nothing_is_expected_to_gain() -> None:
    default, worse = _cfg(split=1), _cfg(split=2)
    data = [
        (
            config,
            STATIC,
            _shape(batch),
            _row(100.0 if config == default else 300.0, default=config == default),
        )
        for batch in (1, 2)
        for config in (default, worse)
    ]
    data.append((default, STATIC, _shape(4), _row(100.0, default=True)))
    assert propose([worse], STATIC, _shape(4), data, min_gain=0.005, explore=0) is None
