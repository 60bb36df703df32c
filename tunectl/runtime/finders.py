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


def _lacks(get_all: Callable[[Mapping[str, Any]], Any], params: Mapping[str, Any]) -> bool:
    """Whether ``params`` lack a parameter ``get_all`` takes."""
    try:
        get_all(params)
    except KeyError:
        return True
    return False


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
    values (a serving step looks the same shape up once per layer). A new key resolves through
    smaller memos (static values as given, then normalised, to the static key's index; each
    dimension's value to its bucket) to one hit in the rows by (static index, buckets...); a row
    whose entry is a rule then computes its config from the shape itself (``WaveRule.config``).
    Remembering by value is sound because equal values always resolve alike: the table holds
    normalised values and normalising is idempotent, the window's normaliser is given the int a 5.0
    or a True equals (tuning's own refuses them), buckets take equal values alike
    (``tunectl.core.buckets``), and a rule takes the int a value equals. Every memo is a dict,
    bounded, and safe to share between threads. ``confirmed`` (``_confirmed_finder``) is consulted
    before the buckets: picks a serving process confirmed at its own shapes.
    """
    names = tuple(name for name, _ in dims)
    get_all = getter((*static_params, *names))
    resolve = _resolver(static_id := static_finder(static_params, static_ids), dims, rows)
    exact = _confirmed_finder(static_id, names, confirmed) if confirmed else None
    configs, rules = answers
    memo: dict[Any, Any] = {}

    def find(params: Mapping[str, Any]) -> Any:
        return None if _lacks(get_all, params) else resolve(params)

    def answer(params: Mapping[str, Any]) -> Any:
        if exact is not None and (hit := exact(params)) is not None:
            return hit
        row = resolve(params)
        if row is None:
            return None
        rule = rules[row]
        if rule is None:
            return configs[row]
        return {**configs[row], rule.param: rule.count(int(params[rule.across]), int(params[rule.along]))}

    def lookup(params: Mapping[str, Any]) -> Any:  # the hot path
        try:
            key = get_all(params)
        except KeyError:
            return None
        try:
            found = memo.get(key, _MISSING)
        except TypeError:  # an unhashable value: resolve it, remember nothing
            found = answer(params)
        else:
            if found is _MISSING:
                found = answer(params)
                _remember(memo, key, found)
        return None if found is None else found.copy()

    return find, lookup


#: how a layer of confirmed picks matches a dimension: by exact value (None), or by the cell it falls
#: in among these points, under the dimension's own policy
Layer = tuple[tuple[int, ...] | None, ...]
Keyer = Callable[[Sequence[Any]], tuple[Any, ...]]


def layer_keyer(policies: Sequence[str], layer: Layer) -> Keyer:
    """Shape values (in the table's dimension order) as a layer of confirmed picks keys them: a
    dimension matched by cell as its bucket among the layer's points (None outside every cell), any
    other as the int it equals."""
    buckets = [
        None if points is None else make_bucketer(policy, points)
        for policy, points in zip(policies, layer, strict=True)
    ]

    def key(values: Sequence[Any]) -> tuple[Any, ...]:
        return tuple(_integral(v) if b is None else b(v) for b, v in zip(buckets, values, strict=True))

    return key


def _confirmed_finder(
    static_id: _Finder, names: tuple[str, ...], layers: Sequence[tuple[Keyer, Mapping[Any, dict[str, Any]]]]
) -> _Finder:
    """``confirmed_at(params)``: the config confirmed at ``params``' static key and shape, or None;
    ``layers`` (each: how it keys a shape, its picks by static index and key) asked in order."""
    get_shape = getter(names)

    def confirmed_at(params: Mapping[str, Any]) -> Any:
        static, values = static_id(params), get_shape(params)
        try:
            for key, table in layers:
                if (hit := table.get((static, *key(values)))) is not None:
                    return hit
        except TypeError:  # an unhashable value: confirmed nowhere
            pass
        return None

    return confirmed_at


def static_finder(static_params: tuple[str, ...], static_ids: dict[Any, int]) -> _Finder:
    """``static_id(params)``: the index of the static key ``params`` hold, or None. Values as given
    are remembered with the index they normalise to: a new value is normalised once."""
    get_static = getter(static_params)
    lenient = [(n, _lenient_window if normaliser_for(n) is _WINDOW else None) for n in static_params]
    normalised: dict[Any, Any] = {}

    def static_id(params: Mapping[str, Any]) -> Any:
        raw: Any = get_static(params)
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

    return static_id


def _resolver(static_id: _Finder, dims: list[tuple[str, Any]], rows: dict[tuple[Any, ...], int]) -> _Finder:
    """``resolve(params)``: the row of (static index, each dimension's bucket), or None; each
    dimension's buckets remembered by value."""
    steps: list[tuple[str, dict[Any, Any], Any]] = [(name, {}, bucket) for name, bucket in dims]

    def resolve(params: Mapping[str, Any]) -> Any:
        found = static_id(params)
        if found is None:
            return None
        key = [found]
        for name, points, bucket in steps:
            value = params[name]
            try:
                point = points.get(value, _MISSING)
                if point is _MISSING:
                    point = bucket(value)
                    _remember(points, value, point)
            except TypeError:  # unhashable: not an integer, a miss
                return None
            if point is None:
                return None
            key.append(point)
        return rows.get(tuple(key))

    return resolve
