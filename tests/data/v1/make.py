"""Writes the v1 fixture: a results dataset, its run metadata and a bundle, as tunectl 0.1.0 wrote them
before records carried typed fields and runs carried plan-time facts.

Run with that version's sources first on the path (``PYTHONPATH=<0.1.0 sources> python make.py OUT``);
the files it writes are checked in beside it, and tests/unit/test_compat.py reads them with this version.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tunectl.core.keys import key_text, make_key
from tunectl.core.plan import item_id
from tunectl.core.record import Record
from tunectl.core.spec import parse_spec
from tunectl.formats.export import export_bundle
from tunectl.store.results import ResultsWriter
from tunectl.store.runs import RunInfo, save_run

SPEC = """\
name = "v1"
task = "flash_decode"
[static]
causal = true
dtype = "bfloat16"
head_dim = 128
num_kv_heads = 8
num_q_heads = 32
page_size = 16
sinks = false
softcap = 0.0
window = [[-1, -1]]
[shapes.batch]
values = [1, 8]
bucket = "pow2"
[shapes.kv_len]
values = [1024]
[shapes.q_len]
values = [1]
[[configs]]
backend = "fa2"
[[configs]]
backend = "fa2"
kv_page_size = 256
[[configs]]
backend = "sdpa"
"""
CONFIGS = {  # config -> median µs at batch 1 and 8: the re-paged fa2 is fastest, and may never win
    (("backend", "fa4"),): (20.0, 40.0),
    (("backend", "fa2"),): (18.0, 41.0),
    (("backend", "fa2"), ("kv_page_size", 256)): (10.0, 20.0),
    (("backend", "sdpa"),): (30.0, 60.0),
}


def main(out: Path) -> None:
    results, run_id, t0 = out / "results", "r20261130-120000-aaaaaa", 1764504000.0
    [static] = parse_spec(SPEC).static_grid()
    writer = ResultsWriter(results)
    for n, batch in enumerate((1, 8)):
        shape = make_key({"batch": batch, "kv_len": 1024, "q_len": 1})
        for i, (config, medians) in enumerate(CONFIGS.items()):
            us = medians[n]
            writer.append(Record(
                run_id=run_id, item_id=item_id("flash_decode", static, shape, config), task="flash_decode",
                static_key=key_text(static), shape_key=key_text(shape), config_key=key_text(config),
                is_default=i == 0, status="ok", median_us=us, p20_us=us * 0.99, p80_us=us * 1.01,
                num_samples=50, rel_noise=0.01, measure_mode="graph", phase="measure", l2="warm",
                device_name="NVIDIA H200", device_kind="cuda", env_json='{"device_name":"NVIDIA H200"}',
                started_at=t0 + i, finished_at=t0 + i + 0.5,
            ))  # fmt: skip
        writer.append(Record(
            run_id=run_id, item_id=f"broken-{batch}", task="flash_decode", static_key=key_text(static),
            shape_key=key_text(shape), config_key=key_text((("backend", "flex"),)), is_default=False,
            status="wrong_result", message="max abs error 3.1", phase="measure", device_name="NVIDIA H200",
            started_at=t0 + 9, finished_at=t0 + 9.5,
        ))  # fmt: skip
    writer.close()
    save_run(
        results, RunInfo(run_id, "v1", "flash_decode", "configs/v1.toml", SPEC, "finished", 10, t0, t0 + 60)
    )
    export_bundle(results, "v1", "1", out / "bundles")
    print("wrote", out, time.strftime("%Y-%m-%d"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
