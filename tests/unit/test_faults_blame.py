"""Who killed the worker: the verdict from a dead process's last words (no Ray needed)."""

from __future__ import annotations

from tunectl.core.keys import make_key
from tunectl.core.plan import WorkItem
from tunectl.orchestrator.blame import Blame
from tunectl.orchestrator.workqueue import WorkQueue


def item(name: str, point: int = 1) -> WorkItem:
    return WorkItem(name, "fault_injection", (), make_key({"n": point}), make_key({"variant": name}), False)


A, B, C = item("a"), item("b"), item("c")


def test_the_item_a_process_was_running_when_it_died_is_retried_once_then_is_a_crash() -> None:
    blame = Blame()
    first = blame.judge([(A, B), (B, None)], {"running": "a", "preparing": None})
    assert (first.retry, first.innocent, first.crashed) == ([A], [B], [])
    second = blame.judge([(A, None)], {"running": "a", "preparing": None})
    assert (second.retry, second.crashed) == ([], [A])


def test_a_finished_item_whose_answer_died_with_the_process_is_not_blamed() -> None:
    verdict = Blame().judge([(A, None), (B, None)], {"running": "b", "preparing": None})
    assert verdict.retry == [B] and verdict.innocent == [A]


def test_the_item_compiling_beside_it_is_a_suspect_too_and_both_run_again_alone() -> None:
    blame = Blame()
    verdict = blame.judge([(A, B), (B, None)], {"running": "a", "preparing": "b"})
    assert verdict.retry == [A, B] and blame.is_suspect(B) and not blame.is_suspect(C)


def test_without_last_words_nobody_is_charged() -> None:
    blame = Blame()
    verdict = blame.judge([(A, B), (B, None)], None)
    assert verdict.innocent == [A, B] and not verdict.known and not blame.deaths


def test_a_process_that_died_between_items_charges_nobody() -> None:
    verdict = Blame().judge([(A, None)], {"running": None, "preparing": None})
    assert verdict.innocent == [A] and verdict.known


def test_suspects_go_out_first_and_are_never_anyones_lookahead() -> None:
    queue = WorkQueue([A, B])
    queue.push_retry(C)
    assert queue.pop(point=None, busy=set()) == C
    assert queue.pop_same_point(A.point) == A and len(queue) == 1


def test_a_death_while_an_arm_is_checked_is_charged_to_that_arm_until_too_many_have_died() -> None:
    from tunectl.core.keys import key_text
    from tunectl.core.plan import comparison
    from tunectl.core.record import Phase
    from tunectl.orchestrator.blame import MAX_CRASHED_ARMS

    arms = tuple(make_key({"variant": v}) for v in range(MAX_CRASHED_ARMS + 3))
    group = comparison("fault_injection", (), make_key({"n": 1}), arms, Phase.HOLDOUT, rounds=2)
    blame = Blame()
    for k in range(1, MAX_CRASHED_ARMS + 1):
        verdict = blame.judge([(group, None)], {"running": group.item_id, "arm": key_text(arms[k])})
        [group] = verdict.retry
        assert group.crashed_arms == arms[1 : k + 1] and verdict.crashed_arm == {group.item_id: arms[k]}
    assert not blame.deaths, "no death is charged to the comparison while its arms take the blame"
    over = blame.judge([(group, None)], {"running": group.item_id, "arm": key_text(arms[-1])})
    assert over.retry == [group] and not over.crashed_arm and blame.deaths[group.item_id] == 1
    baseline = Blame().judge([(group, None)], {"running": group.item_id, "arm": key_text(arms[0])})
    assert baseline.retry == [group] and not baseline.crashed_arm, "the baseline's death is the comparison's"
