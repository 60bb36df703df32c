"""The report's drift section: each worker's drift-guard reference over its life, from the rows' fields."""

from __future__ import annotations

import re
from pathlib import Path

from tunectl.core.record import Record, Status
from tunectl.report import write_report
from tunectl.report.drift import drift_panel
from tunectl.store.results import ResultsWriter

START = 1_700_000_000.0


def _row(n: int, worker: str, reference_us: float | None, **fields: object) -> Record:
    return Record(
        run_id="r-drift", item_id=f"i{n:03d}", task="t", static_key='{"d":1}', shape_key=f'{{"batch":{n}}}',
        config_key='{"c":1}', is_default=True, status=Status.OK, median_us=10.0, p20_us=10.0, p80_us=10.0,
        rel_noise=0.01, num_samples=10, device_name="H200", worker=worker, reference_us=reference_us,
        finished_at=START + 60.0 * n, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def _records() -> list[Record]:
    steady = [_row(n, "node-a:11", 200.0, sm_clock_mhz=1980.0, drift=False, remeasured=0) for n in range(4)]
    # node-b's device slows by a fifth from the third row on: the guard measured that row again, and
    # flagged the next, where the shift had lasted.
    slowing = [
        _row(10, "node-b:12", 200.0, sm_clock_mhz=1980.0, drift=False, remeasured=0),
        _row(11, "node-b:12", 201.0, sm_clock_mhz=1980.0, drift=False, remeasured=0),
        _row(12, "node-b:12", 240.0, sm_clock_mhz=1515.0, drift=True, remeasured=2, throttled=True),
        _row(13, "node-b:12", 240.0, sm_clock_mhz=1515.0, drift=True, remeasured=0, throttled=True),
    ]
    return [*steady, *slowing, _row(20, "node-c:13", None)]  # a row without a reference shows nowhere


def test_each_worker_reads_as_its_reference_in_time_order() -> None:
    panel = drift_panel(list(reversed(_records())))
    assert panel is not None
    a, b = panel.workers
    assert (a.worker, b.worker) == ("node-a:11", "node-b:12")
    assert [r.reference_us for r in b.readings] == [200.0, 201.0, 240.0, 240.0]
    assert b.readings[-1].at_s == 13 * 60.0  # since the first reading of the report
    assert (a.largest_shift, b.largest_shift) == (1.0, 1.2)
    assert (b.num_drift, b.num_remeasured, b.num_throttled, b.clock_range) == (2, 2, 2, (1515.0, 1980.0))
    assert drift_panel([_row(0, "node-c:13", None)]) is None


def test_the_report_draws_and_tabulates_drift_per_worker(tmp_path: Path) -> None:
    writer = ResultsWriter(tmp_path / "results")
    for record in _records():
        writer.append(record)
    writer.close()
    done = write_report(tmp_path / "results", tmp_path / "report")
    text = done.index.read_text(encoding="utf-8")
    section = text[text.index('<section id="drift">') :]
    section = section[: section.index("</section>")]
    assert '<img src="drift-001.png"' in section
    assert (tmp_path / "report" / "drift-001.png").read_bytes().startswith(b"\x89PNG")
    rows = re.findall(r"<tr><td>(node-[ab]:\d+)</td>.*?data-value=\"([0-9.]+)\"", section, re.S)
    assert rows == [("node-a:11", "1.0"), ("node-b:12", "1.2")]
    assert "1515–1980" in section and "node-c" not in section
