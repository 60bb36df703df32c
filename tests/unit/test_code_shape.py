"""benchmarks/costs/code_shape.py counts what it says it counts, on a small tree made here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "costs" / "code_shape.py"

PYPROJECT = """
[[tool.importlinter.contracts]]
name = "pkg layers"
type = "layers"
layers = ["tunectl.top", "tunectl.mid_a | tunectl.mid_b", "tunectl.low"]
"""

RECORD = """
from dataclasses import dataclass

@dataclass(frozen=True)
class Record:
    status: str
    median_us: float | None = None
    host: str = ""
"""

LOW = """
def fine():
    from tunectl.low import reads


def reads(row, settings, entry):
    from tunectl import top
    from .. import mid_a
    a = row["status"], row.get("median_us")
    b = settings["host"], settings["port"]
    c = entry["host"]
    return a, b, c
"""


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("code_shape", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["code_shape"] = module
    spec.loader.exec_module(module)
    return module


code_shape = _load()


def _tree(root: Path, *, long_function_lines: int, module_lines: int) -> None:
    (root / "pyproject.toml").write_text(PYPROJECT)
    pkg = root / "tunectl"
    (pkg / "low").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "record.py").write_text(RECORD)
    (pkg / "low" / "__init__.py").write_text(LOW)
    (pkg / "mid_a.py").write_text("from tunectl.low import fine\n")
    (pkg / "top.py").write_text("\n" * module_lines)
    body = "".join(f"    x = {i}\n" for i in range(long_function_lines))
    (pkg / "mid_b.py").write_text(f'def long():\n    """Doc.\n\n    More doc.\n    """\n{body}')


def test_each_count_on_a_made_tree(tmp_path: Path) -> None:
    _tree(tmp_path, long_function_lines=41, module_lines=401)
    shape = code_shape.measure(tmp_path, "tunectl", label="made")
    assert shape.contract == "pkg layers"
    assert shape.long_modules == ["tunectl/top.py: 401"]
    assert shape.long_functions == ["tunectl/mid_b.py:1 long: 41"]
    # settings shares "host" with records but is read by "port" too; entry is read by one name only
    assert shape.row_subscripts == [
        "tunectl/low/__init__.py:9 row.get('median_us')",
        "tunectl/low/__init__.py:9 row['status']",
    ]
    # inside a function, absolute and relative; the import within its own layer and the one down are fine
    assert shape.upward_imports == [
        "tunectl/low/__init__.py:7 tunectl.low -> tunectl.top",
        "tunectl/low/__init__.py:8 tunectl.low -> tunectl.mid_a",
    ]


def test_limits_are_exclusive(tmp_path: Path) -> None:
    _tree(tmp_path, long_function_lines=40, module_lines=400)
    shape = code_shape.measure(tmp_path, "tunectl", label="made")
    assert (shape.long_modules, shape.long_functions) == ([], [])


KERNEL = """
import triton


@triton.jit
def _kernel(x):
    pass


CONFIGS = [1, 2]  # fmt: skip
"""


def test_format_skips_count_outside_kernel_files_only(tmp_path: Path) -> None:
    _tree(tmp_path, long_function_lines=1, module_lines=1)
    (tmp_path / "tunectl" / "kernel.py").write_text(KERNEL)
    (tmp_path / "tunectl" / "plain.py").write_text('X = [1, 2]  # fmt: skip\nY = "# fmt: skip"\n')
    shape = code_shape.measure(tmp_path, "tunectl", label="made")
    assert shape.format_skips == ["tunectl/plain.py:1"]  # a comment, not a string; not in the kernel file
    assert shape.over_limits()
    (tmp_path / "tunectl" / "plain.py").write_text("X = [1, 2]\n")
    assert not code_shape.measure(tmp_path, "tunectl", label="made").over_limits()


def test_check_exits_1_on_a_tree_over_its_limits(tmp_path: Path) -> None:
    script = SCRIPT
    tree = ROOT / "benchmarks"  # inside the repository, measured against its pyproject.toml
    done = subprocess.run([sys.executable, str(script), str(tree), "--check"], capture_output=True, text=True)
    over = code_shape.measure(ROOT, "benchmarks", label="now").over_limits()
    assert done.returncode == (1 if over else 0), done.stderr
    assert "| `# fmt: skip` outside kernel files |" in done.stdout


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_a_ref_is_measured_from_its_own_commit(tmp_path: Path) -> None:
    _tree(tmp_path, long_function_lines=41, module_lines=401)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    (tmp_path / "tunectl" / "top.py").write_text("")
    before = code_shape.measure_ref(tmp_path, "HEAD", "tunectl")
    after = code_shape.measure(tmp_path, "tunectl", label="now")
    assert (len(before.long_modules), len(after.long_modules)) == (1, 0)
    table = code_shape.report([before, after]).splitlines()
    assert "| modules over 400 lines | 1 | 0 |" in table


def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    for args in (["no-such-folder"], ["--ref", "no-such-ref"]):
        done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 2
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


@pytest.mark.parametrize("bad", ["", "[[tool.importlinter.contracts]]\ntype = 'forbidden'\n"])
def test_a_tree_without_one_layers_contract_is_refused(tmp_path: Path, bad: str) -> None:
    _tree(tmp_path, long_function_lines=1, module_lines=1)
    (tmp_path / "pyproject.toml").write_text(bad)
    with pytest.raises(code_shape.ShapeError, match="layers contracts"):
        code_shape.measure(tmp_path, "tunectl", label="made")
