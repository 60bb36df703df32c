"""The flex_prefill task on CPU: masks mean what they say, option sets match the reference."""

from __future__ import annotations

import pytest

from tunectl.tasks.base import InvalidConfig
from tunectl.tasks.flex_prefill import FlexPrefill, attended_pairs, document_ids, make_mask_mod
from tunectl.tasks.registry import get_task

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

BASE = {
    "dtype": "float32",
    "head_dim": 16,
    "num_kv_heads": 2,
    "num_q_heads": 4,
    "num_docs": 1,
    "window": (-1, -1),
    "mask": "causal",
}
MASKS = {
    "causal": {},
    "document_causal": {"mask": "document_causal", "num_docs": 3},
    "sliding_window": {"mask": "sliding_window", "window": (37, 0)},
}
SHAPE = {"batch": 2, "seq_len": 200}


def _dense(static: dict, doc_id: object, seq_len: int, b: int) -> object:
    idx = torch.arange(seq_len)
    return make_mask_mod(static, doc_id)(torch.tensor(b), 0, idx[:, None], idx[None, :])


@pytest.mark.parametrize("mask", sorted(MASKS))
def test_each_mask_keeps_exactly_the_pairs_its_definition_names(mask: str) -> None:
    static, s = {**BASE, **MASKS[mask]}, 50
    doc = document_ids(2, s, static["num_docs"], "cpu")
    for b in range(2):
        dense = _dense(static, doc, s, b)
        for q in range(s):
            for k in range(s):
                want = k <= q
                if mask == "sliding_window":
                    want = want and q - k <= 37
                if mask == "document_causal":
                    want = want and bool(doc[b, q] == doc[b, k])
                assert bool(dense[q, k]) == want


def test_documents_are_non_empty_and_numbered_in_order() -> None:
    doc = document_ids(4, 100, 7, "cpu")
    for row in doc:
        assert row[0] == 0 and row[-1] == 6
        assert bool((row.diff() >= 0).all()) and len(set(row.tolist())) == 7


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("config", [{}, {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}])
def test_flex_option_sets_match_the_reference(mask: str, config: dict) -> None:
    task, static = FlexPrefill(compile_on_cpu=False), {**BASE, **MASKS[mask]}
    assert task.check_point(static, SHAPE) is None
    inputs = task.build_inputs(static, SHAPE, "cpu")
    out = task.prepare(static, SHAPE, config, inputs)()
    torch.testing.assert_close(out, task.reference(static, SHAPE, inputs), atol=1e-5, rtol=1e-5)
    assert "block_mask" in inputs["derived"]  # built once, shared by every option set


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"BLOCK_M": 256}, "does not divide"),
        ({"BLOCK_N": 48}, "power of two"),
        ({"num_stages": 0}, "positive"),
        ({"USE_TMA": 1}, "bool"),
        ({"BACKEND": "NOT_A_BACKEND"}, "BACKEND"),
        ({"SPLIT_KV": 4}, "not a FlexAttention kernel option"),
    ],
)
def test_option_sets_flex_cannot_take_are_invalid(config: dict, why: str) -> None:
    task = FlexPrefill(compile_on_cpu=False)
    with pytest.raises(InvalidConfig, match=why):
        task.prepare(BASE, SHAPE, config, task.build_inputs(BASE, SHAPE, "cpu"))


def test_static_parameters_that_contradict_the_mask_are_refused() -> None:
    task = get_task("flex_prefill")
    assert "sliding_window" in task.check_point({**BASE, "mask": "sliding_window"}, SHAPE)
    assert "window" in task.check_point({**BASE, "window": (8, 0)}, SHAPE)
    assert "num_docs" in task.check_point({**BASE, "num_docs": 2}, SHAPE)
    assert "mask" in task.check_point({**BASE, "mask": "prefix_lm"}, SHAPE)
    assert task.default_config(BASE) == {} and task.serving_mode == "eager"


def test_attended_pairs_count_the_mask() -> None:
    for mask in MASKS:
        static = {**BASE, **MASKS[mask]}
        doc = document_ids(SHAPE["batch"], SHAPE["seq_len"], static["num_docs"], "cpu")
        dense = sum(int(_dense(static, doc, SHAPE["seq_len"], b).sum()) for b in range(SHAPE["batch"]))
        assert attended_pairs(static, SHAPE) == pytest.approx(dense)
