"""The types the front door's results are made of, for callers that annotate or inspect them."""

from __future__ import annotations

from tunectl.core.record import Phase, Record, Status
from tunectl.decide.quality import Flag, Quality, noise_known
from tunectl.decide.select import Winner
from tunectl.report.worker_time import WorkerTime
from tunectl.runtime.entries import Entry
from tunectl.store.bundle_diff import EntryChange
from tunectl.store.results import Dataset
from tunectl.store.runs import RunInfo, RunSummary

__all__ = [
    "Dataset",
    "Entry",
    "EntryChange",
    "Flag",
    "Phase",
    "Quality",
    "Record",
    "RunInfo",
    "RunSummary",
    "Status",
    "Winner",
    "WorkerTime",
    "noise_known",
]
