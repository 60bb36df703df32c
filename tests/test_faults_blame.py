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
