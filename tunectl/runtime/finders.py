"""How a loaded table answers: the lookup's finders, built once per task at load, and the picks a
serving process confirmed at start-up. Standard library only."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import itemgetter
from typing import Any

from tunectl.core.buckets import make_bucketer
from tunectl.core.keys import InvalidKeyError, normalise_value, normaliser_for
from tunectl.runtime.rules import WaveRule

_MISSING = object()
_Finder = Callable[[Mapping[str, Any]], Any]  # parameters -> what they find (None: a miss)
_StaticOf = Callable[[Any, Mapping[str, Any]], Any]  # static values as given, parameters -> index
_Resolver = Callable[[int, Sequence[Any]], Any]  # static index, shape values -> row
_Confirmed = Callable[[int, Sequence[Any]], Any]  # static index, shape values -> confirmed config
_MEMO_LIMIT = 1 << 14  # entries a memo holds before it starts afresh (keys drift: kv_len grows each step)
_WINDOW = normaliser_for("window")


def getter(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    if len(names) > 1:
        return itemgetter(*names)
    if names:
        only = names[0]
        return lambda params: (params[only],)
    return lambda params: ()


def _remember(memo: dict[Any, Any], key: Any, value: Any) -> None:
    if len(memo) >= _MEMO_LIMIT:
        memo.clear()
    memo[key] = value


def _integral(value: Any) -> Any:
    """The int an integral bool or float equals; anything else unchanged."""
    if isinstance(value, bool) or (isinstance(value, float) and value.is_integer()):
        return int(value)
    return value


def _lenient_window(value: Any) -> Any:
    """A window as tuning normalises it, but with 5.0 or True taken for the ints they equal."""
    return tuple(map(_integral, value)) if isinstance(value, (tuple, list)) else _integral(value)


def finders(
    static_params: tuple[str, ...],
    dims: list[tuple[str, Any]],
    static_ids: dict[Any, int],
    rows: dict[tuple[Any, ...], int],
    answers: tuple[list[Any], list[WaveRule | None]],
    confirmed: Sequence[tuple[Keyer, Mapping[Any, dict[str, Any]]]] = (),
) -> tuple[_Finder, _Finder]:
    """``find(params) -> row | None`` and ``lookup(params) -> config copy | None``, as closures.

    The hot path is one tuple of the raw parameter values and one hit in a memo of results by those
    values (a serving step looks the same shape up once per layer). A new key (a serving step's KV
    length is new each step) takes the static key's index (a memo of static values as given, then
    normalised), each dimension's bucket (a few integer operations) and one hit in the rows by
    (static index, buckets...); a row whose entry is a rule then takes its count from the span of
    lengths it last held over at that batch (``WaveRule.span``), evaluating the model only outside
    it. Remembering by value is sound because equal values always resolve alike: the table holds
    normalised values and normalising is idempotent, the window's normaliser is given the int a 5.0
    or a True equals (tuning's own refuses them), buckets take equal values alike
    (``tunectl.core.buckets``), and a rule takes the int a value equals. Every memo is a dict,
    bounded, and safe to share between threads. ``confirmed`` (``_confirmed_finder``) is consulted
    before the buckets: picks a serving process confirmed at its own shapes.
    """
    names = tuple(name for name, _ in dims)
    get_all, n = getter((*static_params, *names)), len(static_params)
    static_of, resolve = _static_index(static_params, static_ids), _resolver(dims, rows)
    answer = _answerer(static_of, n, resolve, _confirmed_finder(confirmed) if confirmed else None, answers)
    memo: dict[Any, Any] = {}

    def find(params: Mapping[str, Any]) -> Any:
        try:
            key = get_all(params)
        except KeyError:
            return None
        static = static_of(key[:n], params)
        return None if static is None else resolve(static, key[n:])

    def lookup(params: Mapping[str, Any]) -> Any:  # the hot path
        try:
            key = get_all(params)
        except KeyError:
            return None
        try:
            found = memo.get(key, _MISSING)
        except TypeError:  # an unhashable value: resolve it, remember nothing
            found = answer(key, params)
        else:
            if found is _MISSING:
                found = answer(key, params)
                _remember(memo, key, found)
        return None if found is None else found.copy()

    return find, lookup


def _answerer(
    static_of: _StaticOf,
    n: int,
    resolve: _Resolver,
    exact: _Confirmed | None,
    answers: tuple[list[Any], list[WaveRule | None]],
) -> Callable[[tuple[Any, ...], Mapping[str, Any]], Any]:
    """``answer(key, params)``: what a key not yet remembered finds (``finders``): a confirmed pick,
    else its row's config, a rule row's with the count for the shape."""
    configs, rules = answers
    spans: dict[tuple[int, int], tuple[int, int, int]] = {}  # a rule's last span by (row, across)

    def answer(key: tuple[Any, ...], params: Mapping[str, Any]) -> Any:
        static, values = static_of(key[:n], params), key[n:]
        if static is None:
            return None
        if exact is not None and (hit := exact(static, values)) is not None:
            return hit
        row = resolve(static, values)
        if row is None:
            return None
        rule = rules[row]
        if rule is None:
            return configs[row]
        across, along = int(params[rule.across]), int(params[rule.along])
        span = spans.get((row, across))
        if span is None or not span[1] <= along <= span[2]:  # kv_len grows a step at a time
            span = rule.span(across, along)
            _remember(spans, (row, across), span)
        return {**configs[row], rule.param: span[0]}

    return answer


#: how a layer of confirmed picks matches a dimension: by exact value (None), or by the cell it falls
#: in among these points, under the dimension's own policy
Layer = tuple[tuple[int, ...] | None, ...]
Keyer = Callable[[int, Sequence[Any]], tuple[Any, ...]]  # static index, shape values -> a table's key


def layer_keyer(policies: Sequence[str], layer: Layer) -> Keyer:
    """``key(static, values)``: a static key's index and shape values (in the table's dimension
    order) as a layer of confirmed picks keys them: a dimension matched by cell as its bucket among
    the layer's points (None outside every cell), any other as the int it equals."""
    return _keyer(
        [
            _integral if points is None else make_bucketer(policy, points)
            for policy, points in zip(policies, layer, strict=True)
        ]
    )


def _confirmed_finder(layers: Sequence[tuple[Keyer, Mapping[Any, dict[str, Any]]]]) -> _Confirmed:
    """``confirmed_at(static, values)``: the config confirmed at a static key's index and a shape's
    values (in the table's dimension order), or None; ``layers`` (each: how it keys a shape, its picks
    by static index and key) asked in order."""

    def confirmed_at(static: int, values: Sequence[Any]) -> Any:
        try:
            for key, table in layers:
                if (hit := table.get(key(static, values))) is not None:
                    return hit
        except TypeError:  # an unhashable value: confirmed nowhere
            pass
        return None

    return confirmed_at


def static_finder(static_params: tuple[str, ...], static_ids: dict[Any, int]) -> _Finder:
    """``static_id(params)``: the index of the static key ``params`` hold, or None."""
    get_static, static_of = getter(static_params), _static_index(static_params, static_ids)
    return lambda params: static_of(get_static(params), params)


def _static_index(static_params: tuple[str, ...], static_ids: dict[Any, int]) -> _StaticOf:
    """``static_of(raw, params)``: the index of the static key whose values as given are ``raw``
    (taken from ``params``), or None. Values as given are remembered with the index they normalise
    to: a new value is normalised once."""
    lenient = [(n, _lenient_window if normaliser_for(n) is _WINDOW else None) for n in static_params]
    normalised: dict[Any, Any] = {}

    def static_of(raw: Any, params: Mapping[str, Any]) -> Any:
        try:
            found = static_ids.get(raw)
            if found is None:
                found = normalised.get(raw, _MISSING)
            if found is not _MISSING:
                return found
        except TypeError:  # an unhashable value (a list): normalise it, remember nothing
            raw = None
        try:
            key = tuple(normalise_value(n, ease(params[n]) if ease else params[n]) for n, ease in lenient)
            found = static_ids.get(key)
        except (TypeError, InvalidKeyError):
            found = None
        if raw is not None:
            _remember(normalised, raw, found)
        return found

    return static_of


def _resolver(dims: list[tuple[str, Any]], rows: dict[tuple[Any, ...], int]) -> _Resolver:
    """``resolve(static, values)``: the row of a static key's index and each dimension's bucket of
    its value (in the table's order), or None (no row has a None bucket). A bucket is a few integer
    operations (a bisection at most, ``tunectl.core.buckets``), cheaper than remembering it: a
    serving step's KV length is new."""
    key = _keyer([bucket for _, bucket in dims])
    return lambda static, values: rows.get(key(static, values))


def _keyer(each: Sequence[Callable[[Any], Any]]) -> Keyer:
    """``key(head, values)``: ``(head, each[0](values[0]), each[1](values[1]), ...)``, spelled out
    for up to three dimensions (a decode table's): a serving step pays it for every new length."""
    if len(each) == 2:
        first, second = each
        return lambda head, values: (head, first(values[0]), second(values[1]))
    if len(each) == 3:
        first, second, third = each
        return lambda head, values: (head, first(values[0]), second(values[1]), third(values[2]))
    return lambda head, values: (head, *[f(v) for f, v in zip(each, values, strict=True)])
