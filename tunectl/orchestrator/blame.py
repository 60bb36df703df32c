"""Deciding which item killed a worker process, from what the process wrote down before it died.

A worker notes in a small journal on its node what it is running and what it is preparing in the
background, before and after each item. When its process dies, Ray starts a new one for the same
actor, which reads the journal and reports it (its predecessor's *last words*). That is exact where
Ray is not: a process that dies right after finishing an item can take that item's result with it,
so "the oldest unanswered call" is not always the one that was running.

The items named in the last words are charged one death each and run again alone (nothing prepared
beside them); an item charged more than ``MAX_CRASH_RETRIES`` deaths is recorded as ``crash``. The
process's other unanswered items go back to the queue uncharged. Without last words (the node died,
or the worker never came back) nobody is charged: a config that kills workers will kill the next
one, which does come back and say so.

Inside a comparison (finals, validation, holdout) the worker also notes which arm it is checking.
A death there is charged to that arm alone: the comparison runs again with the arm recorded as
``crash`` and the others compared as before, up to ``MAX_CRASHED_ARMS`` arms; a death of the
baseline, or while the arms are timed together, is charged to the comparison as a whole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tunectl.core.keys import Key, key_text
from tunectl.core.plan import WorkItem

MAX_CRASH_RETRIES = 1
#: arms of one comparison that may kill a worker before the comparison as a whole is charged
MAX_CRASHED_ARMS = 4


@dataclass
class Verdict:
    innocent: list[WorkItem] = field(default_factory=list)  # back to the queue, uncharged
    retry: list[WorkItem] = field(default_factory=list)  # charged once more; run again alone
    crashed: list[WorkItem] = field(default_factory=list)  # charged too often: record ``crash``
    known: bool = True  # the verdict rests on the process's last words
    #: comparisons in ``retry`` because one arm killed the process: item id -> that arm
    crashed_arm: dict[str, Key] = field(default_factory=dict)


@dataclass
class Blame:
    deaths: Counter[str] = field(default_factory=Counter)
    suspects: set[str] = field(default_factory=set)

    def judge(
        self, unanswered: Sequence[tuple[WorkItem, WorkItem | None]], last_words: dict[str, Any] | None
    ) -> Verdict:
        """``unanswered``: (item, its announced lookahead) per call without an answer, oldest first,
        plus any item held back for the worker as (item, None)."""
        items = [item for item, _ in unanswered]
        if last_words is None:
            return Verdict(innocent=items, known=False)
        named = {last_words.get("running"), last_words.get("preparing")} - {None}
        culprits = [i for i in items if i.item_id in named]
        verdict = Verdict()
        for item in items:
            if item not in culprits:
                verdict.innocent.append(item)
                continue
            without = _without_arm(item, last_words.get("arm"))
            if without is not None:  # the comparison goes on; only the arm is charged
                verdict.retry.append(without)
                verdict.crashed_arm[item.item_id] = without.crashed_arms[-1]
                continue
            self.deaths[item.item_id] += 1
            self.suspects.add(item.item_id)
            if self.deaths[item.item_id] > MAX_CRASH_RETRIES:
                verdict.crashed.append(item)
            else:
                verdict.retry.append(item)
        return verdict

    def is_suspect(self, item: WorkItem) -> bool:
        return item.item_id in self.suspects


def _without_arm(item: WorkItem, arm: str | None) -> WorkItem | None:
    """``item`` with the arm named ``arm`` recorded as crashed, where that leaves a comparison to
    make: the arm is not the baseline, and fewer than ``MAX_CRASHED_ARMS`` arms have crashed."""
    texts = [key_text(a) for a in item.arms]
    if arm is None or arm not in texts[1:] or len(item.crashed_arms) >= MAX_CRASHED_ARMS:
        return None
    crashed = item.arms[texts.index(arm)]
    return replace(item, crashed_arms=(*item.crashed_arms, crashed))


def first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def death_detail(exc: BaseException) -> str:
    """The most telling line of Ray's actor-death message (it names the exit), else the first."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for line in lines:
        if any(word in line.lower() for word in ("exit", "killed", "memory")):
            return line[:300]
    return (lines[0] if lines else type(exc).__name__)[:300]
