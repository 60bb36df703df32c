"""A comparison item (finals, validation, holdout) where some arms are invalid at the point or fail:
each such arm carries its own status, and the other arms are still compared."""

from __future__ import annotations

from tests.decode_keys import flash_static
from tunectl.core.keys import make_key
from tunectl.core.plan import comparison
from tunectl.core.record import Phase, Status
from tunectl.core.spec import MeasureSpec
from tunectl.measure.runner import ItemRunner

SETTINGS = MeasureSpec(warmup=1, min_samples=3, max_samples=5, max_seconds=0.2)
GOOD = make_key({"fault": "none"})
FAST = make_key({"fault": "none", "variant": 1})


def _run(*arms: dict[str, object]) -> dict[str, tuple[Status, str]]:
    keys = tuple(make_key(a) for a in arms)
    item = comparison("fault_injection", make_key({}), make_key({"n": 64}), keys, Phase.HOLDOUT, rounds=3)
    records = ItemRunner("cpu").run("r", item, SETTINGS)
    assert isinstance(records, list) and len(records) == len(arms)
    return {r.config_key: (r.status, r.message or "") for r in records}


def test_an_invalid_or_failing_arm_leaves_the_other_arms_compared() -> None:
    out = _run(
        dict(GOOD),
        {"fault": "invalid", "where": "prepare"},
        {"fault": "invalid"},
        {"fault": "raise"},
        {"fault": "wrong"},
        dict(FAST),
    )
    statuses = {k: s for k, (s, _) in out.items()}
    assert statuses == {
        '{"fault":"none"}': Status.OK,
        '{"fault":"invalid","where":"prepare"}': Status.INVALID,
        '{"fault":"invalid"}': Status.INVALID,
        '{"fault":"raise"}': Status.ERROR,
        '{"fault":"wrong"}': Status.WRONG_RESULT,
        '{"fault":"none","variant":1}': Status.OK,
    }
    assert "RuntimeError" in out['{"fault":"raise"}'][1]


def test_without_a_baseline_failing_arms_keep_their_status_and_the_rest_are_not_compared() -> None:
    out = _run({"fault": "invalid"}, {"fault": "raise"}, dict(FAST))
    assert out['{"fault":"invalid"}'][0] is Status.INVALID
    assert out['{"fault":"raise"}'][0] is Status.ERROR
    not_compared = (Status.ERROR, "not compared: the default failed at this point")
    assert out['{"fault":"none","variant":1}'] == not_compared


def test_a_comparison_at_an_untuned_point_leaves_the_inputs_as_built_and_checks_every_arm() -> None:
    """Held-out shapes are not whole pages (1452 tokens in pages of 128) and their batches are odd: the
    arms of one comparison share the point's inputs, and none of them may change what the next reads."""
    import torch

    from tunectl.tasks.registry import get_task

    static = flash_static(page_size=128, num_q_heads=4, num_kv_heads=2, head_dim=16)  # small: a CPU's sdpa
    shape = {"batch": 14, "kv_len": 1452, "q_len": 1}
    arms = [
        {"backend": "sdpa"},
        {"backend": "sdpa", "sdpa_gqa": "expand"},
        {"backend": "sdpa", "sdpa_backend": "math"},
        {"backend": "sdpa", "sdpa_backend": "math", "sdpa_gqa": "expand"},
    ]
    item = comparison(
        "flash_decode", make_key(static), make_key(shape), tuple(map(make_key, arms)), Phase.HOLDOUT, rounds=2
    )
    runner = ItemRunner("cpu")
    records = runner.run("r", item, SETTINGS)
    assert isinstance(records, list)
    assert [r.status for r in records] == [Status.OK] * len(arms)
    built = get_task("flash_decode").build_inputs(static, shape, "cpu")
    shared = runner._here.inputs
    for name in ("q", "k_cache", "v_cache", "page_table", "seqused_k"):
        assert shared[name].dtype == built[name].dtype and torch.equal(shared[name], built[name]), name
    assert (shared["kv_len"], shared["q_len"]) == (1452, 1)
