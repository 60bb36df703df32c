"""Import rules: the serving runtime is standard library only; heavy libraries load lazily."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _modules_after(statement: str) -> list[str]:
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "module",
    [
        "tunectl.runtime",
        "tunectl.store.bundle",
        "tunectl.store.bundle_diff",
        "tunectl.core.keys",
        "tunectl.runtime.adapters",
    ],
)
def test_serving_modules_import_only_the_standard_library(module: str) -> None:
    at_start = set(_modules_after(""))  # site hooks (.pth files) load before any import of ours
    loaded = set(_modules_after(f"import {module}")) - at_start
    foreign = [
        m
        for m in sorted(loaded)
        if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] not in ("tunectl", "__main__")
    ]
    assert foreign == []


def test_the_cli_and_spec_validation_do_not_import_heavy_libraries() -> None:
    loaded = _modules_after(
        "import tunectl.cli, tunectl.api, tunectl.core.spec, tunectl.core.plan, tunectl.tasks.registry\n"
        "from tunectl.core.spec import load_spec; load_spec('configs/quickstart.toml')"
    )
    assert [m for m in loaded if m.split(".")[0] in ("ray", "torch", "pyarrow")] == []


@pytest.mark.skipif(shutil.which("lint-imports") is None, reason="import-linter not installed")
def test_import_contracts_hold() -> None:
    done = subprocess.run(["lint-imports"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
