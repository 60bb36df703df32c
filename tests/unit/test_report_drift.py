"""The report's drift section: each worker's drift-guard reference over its life, from the rows' fields."""

from __future__ import annotations

import re
from pathlib import Path

from tunectl.core.record import Phase, Record, Status
from tunectl.decide.quality import looks_apart
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


def test_configs_read_far_apart_between_their_looks_at_a_point_are_counted_per_worker() -> None:
    def look(n: int, worker: str, config: str, median: float, phase: Phase, band: float = 0.01) -> Record:
        row = _row(n, worker, None, phase=phase, rung=n % 2 if phase is Phase.SCREEN else None)
        fields = {"config_key": config, "shape_key": '{"batch":99}', "median_us": median}
        return Record(
            **{**row.__dict__, **fields, "p20_us": median * (1 - band), "p80_us": median * (1 + band)}
        )

    rows = [
        look(0, "node-a:11", '{"c":1}', 100.0, Phase.SCREEN),  # a slowdown met at rung 1: 12 % apart
        look(1, "node-a:11", '{"c":1}', 112.0, Phase.SCREEN),
        look(2, "node-a:11", '{"c":1}', 100.5, Phase.FINAL),
        look(3, "node-a:11", '{"c":2}', 100.0, Phase.SCREEN),  # steady: 1 % apart
        look(4, "node-a:11", '{"c":2}', 101.0, Phase.FINAL),
        look(5, "node-a:11", '{"c":3}', 100.0, Phase.SCREEN, band=0.1),  # 12 % apart inside its own noise
        look(6, "node-a:11", '{"c":3}', 112.0, Phase.FINAL, band=0.1),
        look(7, "node-a:11", '{"c":4}', 130.0, Phase.SCREEN),  # looked at once
        look(8, "node-b:12", '{"c":1}', 90.0, Phase.SCREEN),  # another device: never set against node-a's
        look(9, "node-b:12", '{"c":1}', 90.5, Phase.SCREEN),
    ]
    assert looks_apart(rows) == {"node-a:11": (1, 3), "node-b:12": (0, 1)}
    # a look the guard flagged is counted as flagged, not again here
    flagged = [Record(**{**r.__dict__, "drift": True}) if r.item_id == "i001" else r for r in rows]
    assert looks_apart(flagged) == {"node-a:11": (0, 3), "node-b:12": (0, 1)}
    panel = drift_panel([*rows, *_records()])
    assert panel is not None
    assert {w.worker: w.looks for w in panel.workers} == {"node-a:11": (1, 3), "node-b:12": (0, 1)}
