"""What the repository holds: no file over 5 MB, and every data archive listed with its checksum."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_BYTES = 5 * 1000 * 1000
DATA = ROOT / "benchmarks" / "results" / "DATA.md"


def _tracked() -> list[Path]:
    """The files git tracks in this checkout that are present; skips where this is not a git checkout."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    paths = [ROOT / name for name in done.stdout.decode().split("\0") if name]
    return [p for p in paths if p.is_file()]


def test_no_tracked_file_is_over_5_mb() -> None:
    big = {str(p.relative_to(ROOT)): p.stat().st_size for p in _tracked() if p.stat().st_size > MAX_BYTES}
    assert not big, f"over 5 MB (benchmarks/results/DATA.md says where such data goes): {big}"


def test_every_data_archive_is_listed_with_its_sha256() -> None:
    listed = DATA.read_text(encoding="utf-8")
    archives = [p for p in _tracked() if p.parent == DATA.parent and p.name.endswith(".tar.gz")]
    for archive in archives:
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        row = f"`{archive.name}` | `{digest}`"
        assert row in listed, f"{archive.name}: no row in DATA.md with this sha256"
