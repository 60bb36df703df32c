"""Keys: canonical, collision-free, and stable through Parquet and the bundle."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tunectl.core.keys import InvalidKeyError, key_digest, key_from_text, key_text, make_key
from tunectl.core.record import Record
from tunectl.runtime import Entry, load_bundle
from tunectl.store.bundle import TaskTable, build_files, publish_local
from tunectl.store.results import ResultsWriter, read_results

names = st.sampled_from(["batch", "kv_len", "q_len", "head_dim", "causal", "softcap", "scale"])
relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**62), 2**62),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
values = st.one_of(scalars, st.tuples(st.integers(-1, 4096), st.integers(-1, 4096)))
windows = st.one_of(st.none(), st.integers(-1, 1 << 20), st.tuples(st.integers(-1, 99), st.integers(-1, 99)))


def params_strategy() -> st.SearchStrategy[dict[str, object]]:
    return st.dictionaries(names, values, max_size=6)


def _typed(value: object) -> object:
    """Equality that keeps types apart (Python's own says False == 0 and 1 == 1.0)."""
    if isinstance(value, tuple):
        return ("tuple", tuple(_typed(v) for v in value))
    return (type(value).__name__, value)


@relaxed
@given(params_strategy(), params_strategy())
def test_distinct_parameter_sets_never_share_a_key(a: dict[str, object], b: dict[str, object]) -> None:
    ka, kb = make_key(a), make_key(b)
    if _typed(ka) != _typed(kb):
        assert key_text(ka) != key_text(kb)
        assert key_digest(ka) != key_digest(kb)
    else:
        assert key_text(ka) == key_text(kb)


@relaxed
@given(params_strategy())
def test_equal_parameter_sets_always_share_a_key(p: dict[str, object]) -> None:
    reordered = dict(reversed(list(p.items())))
    assert key_text(make_key(p)) == key_text(make_key(reordered))
    assert key_from_text(key_text(make_key(p))) == make_key(p)


def test_types_are_kept_apart() -> None:
    texts = {key_text(make_key({"x": v})) for v in (1, True, 1.0, "1", None, (1,))}
    assert len(texts) == 6


def test_no_packing_collision_at_large_lengths() -> None:
    # batch*10**12 + q*10**6 + kv collides once kv passes 10**6; keys never pack.
    a = make_key({"batch": 1, "q_len": 0, "kv_len": 1_000_000})
    b = make_key({"batch": 1, "q_len": 1, "kv_len": 0})
    assert key_text(a) != key_text(b)


@relaxed
@given(windows)
def test_window_forms_normalise_to_one_key(w: object) -> None:
    k = make_key({"window": w})
    if w is None or w == -1 or (isinstance(w, int) and w < 0):
        assert k == make_key({"window": (-1, -1)}) == make_key({"window": None})
    elif isinstance(w, int):
        assert k == make_key({"window": (w, 0)})
    assert key_from_text(key_text(k)) == k


def test_dtype_forms_normalise_to_one_key() -> None:
    assert make_key({"dtype": "torch.bfloat16"}) == make_key({"dtype": "bfloat16"})


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), object(), {"a": 1}])
def test_values_without_a_canonical_form_are_refused(bad: object) -> None:
    with pytest.raises(InvalidKeyError):
        make_key({"x": bad})


static_params = st.fixed_dictionaries(
    {
        "dtype": st.sampled_from(["float16", "bfloat16"]),
        "head_dim": st.sampled_from([64, 128]),
        "window": windows,
        "causal": st.booleans(),
    }
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(static_params, min_size=1, max_size=5, unique_by=lambda p: key_text(make_key(p))))
def test_keys_survive_parquet_and_bundle_round_trips(
    tmp_path: Path, statics: list[dict[str, object]]
) -> None:
    root = Path(tempfile.mkdtemp(dir=tmp_path))  # one per example: bundle versions are immutable
    writer = ResultsWriter(root / "results")
    keys = [make_key(p) for p in statics]
    for i, key in enumerate(keys):
        writer.append(
            Record(
                run_id="r1",
                item_id=f"i{i}",
                task="t",
                static_key=key_text(key),
                shape_key=key_text(make_key({"batch": 1})),
                config_key="{}",
                is_default=True,
                status="ok",
                finished_at=1.0,
            )
        )
    writer.close()
    back = {key_from_text(r.static_key) for r in read_results(root / "results")}
    assert back == set(keys)
    entries = tuple(Entry(key, (("batch", 1),), (("i", i),)) for i, key in enumerate(keys))
    table = TaskTable(
        "t", tuple(n for n, _ in keys[0]), {"batch": {"policy": "exact", "points": [1]}}, entries
    )
    path = publish_local(root / "bundles", "b", "1", build_files("b", "1", [table], ["r1"], {}))
    bundle = load_bundle(path, env_policy="off")
    for i, p in enumerate(statics):
        assert bundle.lookup("t", **p, batch=1) == {"i": i}
